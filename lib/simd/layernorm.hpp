// The row layernorm kernel as a functor templated on the xsimd Arch (recipe: dispatch.hpp).
// Contract: reference::layernorm_row. Definition in layernorm_impl.hpp, instantiated once per ISA by
// layernorm_<isa>.cpp; everyone else sees only the extern declarations below.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd {

struct layernorm_kernel {
    template <class Arch>
    void operator()(Arch, float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                    const float* beta, float eps) const noexcept;
};

extern template void layernorm_kernel::operator()<arch_avx512>(arch_avx512, float*, const float*, const float*,
                                                               std::size_t, const float*, const float*,
                                                               float) const noexcept;
extern template void layernorm_kernel::operator()<arch_avx2>(arch_avx2, float*, const float*, const float*,
                                                             std::size_t, const float*, const float*,
                                                             float) const noexcept;
extern template void layernorm_kernel::operator()<arch_sse2>(arch_sse2, float*, const float*, const float*,
                                                             std::size_t, const float*, const float*,
                                                             float) const noexcept;

}  // namespace mha::simd
