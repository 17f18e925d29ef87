// One key tile of the online softmax: z = scale·x + masks over n_valid entries, raise the running
// max, overwrite x with exp(z − max) (zeros past n_valid) and return the sum. Two passes over the tile:
// (1) z and its max, stored back into x; (2) exp, sum. Full batches vectorized, the tail in scalar
// code with the same formulas. Preconditions: x holds n floats, masks n_valid floats or null.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>

#include "online_softmax.hpp"

namespace mha::simd {

template <class Arch>
float softmax_tile_online_kernel::operator()(Arch, float* x, std::size_t n, std::size_t n_valid, float scale,
                                             const float* mask0, const float* mask1, float& running_max) const noexcept {
    using B = xsimd::batch<float, Arch>;
    constexpr std::size_t W = B::size;
    const std::size_t full = n_valid - n_valid % W;

    B vmax(-std::numeric_limits<float>::infinity());
    const B vscale(scale);
    for (std::size_t j = 0; j < full; j += W) {
        B z = B::load_unaligned(x + j) * vscale;
        if (mask0) z += B::load_unaligned(mask0 + j);
        if (mask1) z += B::load_unaligned(mask1 + j);
        z.store_unaligned(x + j);
        vmax = xsimd::max(vmax, z);
    }
    alignas(64) float lanes[W];
    vmax.store_aligned(lanes);
    float m = running_max;
    for (std::size_t l = 0; l < W; ++l) m = std::max(m, lanes[l]);
    for (std::size_t j = full; j < n_valid; ++j) {
        float z = x[j] * scale;
        if (mask0) z += mask0[j];
        if (mask1) z += mask1[j];
        x[j] = z;
        m = std::max(m, z);
    }
    running_max = m;
    if (m == -std::numeric_limits<float>::infinity()) {
        // Nothing finite yet: a masked tile contributes 0, but a NaN score must not vanish as if masked.
        const bool has_nan = std::any_of(x, x + n_valid, [](float z) { return z != z; });
        std::fill(x, x + n, 0.0f);
        return has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    }

    const B vm(m);
    B vsum(0.0f);
    for (std::size_t j = 0; j < full; j += W) {
        const B e = xsimd::exp(B::load_unaligned(x + j) - vm);
        e.store_unaligned(x + j);
        vsum += e;
    }
    float sum = xsimd::hadd(vsum);
    for (std::size_t j = full; j < n_valid; ++j) {
        x[j] = std::exp(x[j] - m);
        sum += x[j];
    }
    std::fill(x + n_valid, x + n, 0.0f);
    return sum;
}

}  // namespace mha::simd
