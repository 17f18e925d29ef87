// Kernel functors of simd::softmax_tile_online and simd::scale_row (see simd.hpp), one instantiation per ISA.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mask_row.hpp"

namespace mha::simd {

struct softmax_tile_online_kernel {
    template <class Arch>
    float operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                     MaskRow mask1, float& running_max, ScoreRowModifiers mods) const noexcept;
};

struct scale_row_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n, float alpha) const noexcept;
};

// The instantiations of one Arch (PREFIX: extern, or empty in the generated TU of that Arch).
#define MHA_ONLINE_SOFTMAX_INSTANTIATE(PREFIX, ARCH)                                                           \
    PREFIX template float softmax_tile_online_kernel::operator()<ARCH>(ARCH, float*, std::size_t, std::size_t, \
                                                                       float, MaskRow, MaskRow, float&,             \
                                                                       ScoreRowModifiers) const noexcept;           \
    PREFIX template void scale_row_kernel::operator()<ARCH>(ARCH, float*, std::size_t, float) const noexcept;
#define MHA_ONLINE_SOFTMAX_EXTERN_(isa, arch, suffix) MHA_ONLINE_SOFTMAX_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_ONLINE_SOFTMAX_EXTERN_)
#undef MHA_ONLINE_SOFTMAX_EXTERN_

}  // namespace mha::simd
