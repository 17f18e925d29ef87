// The row softmax kernel as a functor templated on the xsimd Arch (recipe: dispatch.hpp).
// Contract: reference::softmax_row. Definition in softmax_impl.hpp, instantiated once per ISA by
// the generated softmax_<isa>.cpp (dispatch.hpp); everyone else sees only the extern declarations below.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mask_row.hpp"

namespace mha::simd {

struct softmax_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                    MaskRow mask1, ScoreRowModifiers mods) const noexcept;
};

// The instantiation of one Arch (PREFIX: extern, or empty in the generated TU of that Arch).
#define MHA_SOFTMAX_INSTANTIATE(PREFIX, ARCH)                                                                     \
    PREFIX template void softmax_kernel::operator()<ARCH>(ARCH, float*, std::size_t, std::size_t, float, MaskRow, \
                                                          MaskRow, ScoreRowModifiers) const noexcept;
#define MHA_SOFTMAX_EXTERN_(isa, arch, suffix) MHA_SOFTMAX_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_SOFTMAX_EXTERN_)
#undef MHA_SOFTMAX_EXTERN_

}  // namespace mha::simd
