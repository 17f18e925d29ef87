// The row layernorm kernel as a functor templated on the xsimd Arch (recipe: dispatch.hpp).
// Contract: reference::layernorm_row. Definition in layernorm_impl.hpp, instantiated once per ISA by
// the generated layernorm_<isa>.cpp (dispatch.hpp); everyone else sees only the extern declarations below.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd {

struct layernorm_kernel {
    template <class Arch>
    void operator()(Arch, float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                    const float* beta, float eps) const noexcept;
};

// The instantiation of one Arch (PREFIX: extern, or empty in the generated TU of that Arch).
#define MHA_LAYERNORM_INSTANTIATE(PREFIX, ARCH)                                                                    \
    PREFIX template void layernorm_kernel::operator()<ARCH>(ARCH, float*, const float*, const float*, std::size_t, \
                                                            const float*, const float*, float) const noexcept;
#define MHA_LAYERNORM_EXTERN_(isa, arch, suffix) MHA_LAYERNORM_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_LAYERNORM_EXTERN_)
#undef MHA_LAYERNORM_EXTERN_

}  // namespace mha::simd
