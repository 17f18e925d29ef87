// x[i] = round_to_bf16(x[i]) for i < n, in place (mha/half.hpp: nearest even, NaN made quiet): the rounding
// points of bf16 compute applied to the layer's own buffers (Q, K, V, P, the context). simd::round_to_bf16_inplace
// dispatches to round_bf16_kernel (recipe: dispatch.hpp), defined in round_bf16_impl.hpp and instantiated once
// per ISA by the generated round_bf16_<isa>.cpp. The bits are those of the scalar conversion on every ISA.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mha/view.hpp"

namespace mha::simd {

struct round_bf16_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n) const noexcept;
};

#define MHA_ROUND_BF16_INSTANTIATE(PREFIX, ARCH) \
    PREFIX template void round_bf16_kernel::operator()<ARCH>(ARCH, float*, std::size_t) const noexcept;
#define MHA_ROUND_BF16_EXTERN_(isa, arch, suffix) MHA_ROUND_BF16_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_ROUND_BF16_EXTERN_)
#undef MHA_ROUND_BF16_EXTERN_

void round_to_bf16_inplace(float* x, std::size_t n) noexcept;
// Every element of a row-major view. (Out of line: an inline function here would be compiled into every ISA TU.)
void round_to_bf16_inplace(Matrix x) noexcept;

}  // namespace mha::simd
