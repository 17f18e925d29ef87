// The score modifiers alone on one row, one ISA: the definition of score_modifiers_kernel::operator(), included
// only by the generated score_modifiers_<isa>.cpp TUs. In place on x[0, n): softmax_detail::ScoreModifierVectors, the
// softmax kernels' own (softcap, then ALiBi), a whole vector at a time; the tail through a padded buffer.
#pragma once
#include <cstddef>

#include "score_modifiers.hpp"
#include "softmax_math.hpp"

namespace mha::simd {

template <class Arch>
void score_modifiers_kernel::operator()(Arch, float* x, std::size_t n, ScoreRowModifiers mods) const noexcept {
    using B = softmax_detail::batch<Arch>;
    constexpr std::size_t W = B::size;
    if (!mods.any()) return;
    const softmax_detail::ScoreModifierVectors<Arch> modify(mods);
    std::size_t j = 0;
    for (; j + W <= n; j += W) modify(B::load_unaligned(x + j), modify.distances(j)).store_unaligned(x + j);
    if (j < n) {
        alignas(64) float buf[W] = {};
        for (std::size_t l = 0; l < n - j; ++l) buf[l] = x[j + l];
        modify(B::load_aligned(buf), modify.distances(j)).store_aligned(buf);
        for (std::size_t l = 0; l < n - j; ++l) x[j + l] = buf[l];
    }
}

}  // namespace mha::simd
