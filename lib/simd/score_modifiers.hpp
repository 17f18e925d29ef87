// The score modifiers' kernel (mha/attention.hpp's ScoreModifiers) on one row of scaled scores, as a functor
// templated on the xsimd Arch (recipe: dispatch.hpp). Definition in score_modifiers_impl.hpp, instantiated
// once per ISA by the generated score_modifiers_<isa>.cpp; everyone else sees the extern declarations below.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd {

struct score_modifiers_kernel {
    template <class Arch>
    void operator()(Arch, float* x, std::size_t n, float softcap, float slope, float distance0) const noexcept;
};

#define MHA_SCORE_MODIFIERS_INSTANTIATE(PREFIX, ARCH)                                                             \
    PREFIX template void score_modifiers_kernel::operator()<ARCH>(ARCH, float*, std::size_t, float, float, \
                                                                  float) const noexcept;
#define MHA_SCORE_MODIFIERS_EXTERN_(isa, arch, suffix) MHA_SCORE_MODIFIERS_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_SCORE_MODIFIERS_EXTERN_)
#undef MHA_SCORE_MODIFIERS_EXTERN_

}  // namespace mha::simd
