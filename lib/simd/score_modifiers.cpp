// simd::modify_scores: dispatches to the best allowed ISA.
#include "score_modifiers.hpp"
#include "simd.hpp"

namespace mha::simd {

void modify_scores(float* x, std::size_t n, ScoreRowModifiers mods) noexcept {
    dispatch(active_isa(), score_modifiers_kernel{}, x, n, mods);
}

}  // namespace mha::simd
