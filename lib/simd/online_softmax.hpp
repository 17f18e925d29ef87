// Kernel functor of simd::softmax_tile_online (see simd.hpp), one instantiation per ISA.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mask_row.hpp"

namespace mha::simd {

struct softmax_tile_online_kernel {
    template <class Arch>
    float operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                     MaskRow mask1, float& running_max) const noexcept;
};

extern template float softmax_tile_online_kernel::operator()<arch_avx512>(arch_avx512, float*, std::size_t, std::size_t, float,
                                                                          MaskRow, MaskRow, float&) const noexcept;
extern template float softmax_tile_online_kernel::operator()<arch_avx2>(arch_avx2, float*, std::size_t, std::size_t, float,
                                                                        MaskRow, MaskRow, float&) const noexcept;
extern template float softmax_tile_online_kernel::operator()<arch_sse2>(arch_sse2, float*, std::size_t, std::size_t, float,
                                                                        MaskRow, MaskRow, float&) const noexcept;

}  // namespace mha::simd
