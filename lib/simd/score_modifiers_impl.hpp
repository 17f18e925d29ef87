// Score modifiers on one row, one ISA: the definition of score_modifiers_kernel::operator(), included only
// by the generated score_modifiers_<isa>.cpp TUs. In place on x[0, n), key j of the row at distance
// distance0 − j from its query (p_i − p_j):
//   softcap > 0: x_j ← softcap·tanh(x_j / softcap)   (xsimd::tanh; NaN stays NaN, ±inf gives ±softcap)
//   slope != 0:  x_j ← x_j + slope·(j − distance0)    (= x_j − slope·(p_i − p_j); j − distance0 exact below 2^24)
// Every element goes through the same vector code (the tail through a padded buffer): an element's result
// does not depend on where in a tile it sits, so every path and tiling gives the same bits.
#pragma once
#include <cstddef>

#include "score_modifiers.hpp"

namespace mha::simd {

template <class Arch>
void score_modifiers_kernel::operator()(Arch, float* x, std::size_t n, float softcap, float slope,
                                        float distance0) const noexcept {
    using B = xsimd::batch<float, Arch>;
    constexpr std::size_t W = B::size;
    const bool cap = softcap > 0.0f, alibi = slope != 0.0f;
    alignas(64) float lane[W];
    for (std::size_t l = 0; l < W; ++l) lane[l] = static_cast<float>(l);
    const B iota = B::load_aligned(lane), c(softcap), m(slope);
    auto apply = [&](B v, std::size_t j) {
        if (cap) v = c * xsimd::tanh(v / c);
        if (alibi) v = v + m * ((B(static_cast<float>(j)) + iota) - B(distance0));
        return v;
    };
    if (!cap && !alibi) return;
    {
        std::size_t j = 0;
        for (; j + W <= n; j += W) apply(B::load_unaligned(x + j), j).store_unaligned(x + j);
        if (j < n) {
            alignas(64) float buf[W] = {};
            for (std::size_t l = 0; l < n - j; ++l) buf[l] = x[j + l];
            apply(B::load_aligned(buf), j).store_aligned(buf);
            for (std::size_t l = 0; l < n - j; ++l) x[j + l] = buf[l];
        }
    }
}

}  // namespace mha::simd
