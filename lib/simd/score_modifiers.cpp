// simd::modify_scores: dispatches to the best allowed ISA.
#include "score_modifiers.hpp"
#include "simd.hpp"

namespace mha::simd {

void modify_scores(float* x, std::size_t n, float softcap, float slope, float distance0) noexcept {
    dispatch(active_isa(), score_modifiers_kernel{}, x, n, softcap, slope, distance0);
}

}  // namespace mha::simd
