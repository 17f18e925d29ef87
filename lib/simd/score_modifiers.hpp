// simd::modify_scores as a functor templated on the xsimd Arch (recipe: dispatch.hpp): the score modifiers of
// one row (ScoreRowModifiers) alone, through the same softmax_detail::ScoreModifierVectors the softmax kernels apply.
// Definition in score_modifiers_impl.hpp, instantiated once per ISA by the generated score_modifiers_<isa>.cpp.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mask_row.hpp"

namespace mha::simd {

struct score_modifiers_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n, ScoreRowModifiers mods) const noexcept;
};

#define MHA_SCORE_MODIFIERS_INSTANTIATE(PREFIX, ARCH) \
    PREFIX template void score_modifiers_kernel::operator()<ARCH>(ARCH, float*, std::size_t, ScoreRowModifiers) const noexcept;
#define MHA_SCORE_MODIFIERS_EXTERN_(isa, arch, suffix) MHA_SCORE_MODIFIERS_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_SCORE_MODIFIERS_EXTERN_)
#undef MHA_SCORE_MODIFIERS_EXTERN_

}  // namespace mha::simd
