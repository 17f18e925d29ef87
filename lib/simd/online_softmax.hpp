// Kernel functor of simd::softmax_tile_online (see simd.hpp), one instantiation per ISA.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd {

struct softmax_tile_online_kernel {
    template <class Arch>
    float operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                     const float* mask1, float& running_max) const noexcept;
};

extern template float softmax_tile_online_kernel::operator()<arch_avx512>(arch_avx512, float*, std::size_t, std::size_t, float,
                                                                          const float*, const float*, float&) const noexcept;
extern template float softmax_tile_online_kernel::operator()<arch_avx2>(arch_avx2, float*, std::size_t, std::size_t, float,
                                                                        const float*, const float*, float&) const noexcept;
extern template float softmax_tile_online_kernel::operator()<arch_sse2>(arch_sse2, float*, std::size_t, std::size_t, float,
                                                                        const float*, const float*, float&) const noexcept;

}  // namespace mha::simd
