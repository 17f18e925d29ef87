// The row softmax kernel as a functor templated on the xsimd Arch (recipe: dispatch.hpp).
// Contract: reference::softmax_row. Definition in softmax_impl.hpp, instantiated once per ISA by
// softmax_<isa>.cpp; everyone else sees only the extern declarations below.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mask_row.hpp"

namespace mha::simd {

struct softmax_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                    MaskRow mask1) const noexcept;
};

extern template void softmax_kernel::operator()<arch_avx512>(arch_avx512, float*, std::size_t, std::size_t, float,
                                                             MaskRow, MaskRow) const noexcept;
extern template void softmax_kernel::operator()<arch_avx2>(arch_avx2, float*, std::size_t, std::size_t, float,
                                                           MaskRow, MaskRow) const noexcept;
extern template void softmax_kernel::operator()<arch_sse2>(arch_sse2, float*, std::size_t, std::size_t, float,
                                                           MaskRow, MaskRow) const noexcept;

}  // namespace mha::simd
