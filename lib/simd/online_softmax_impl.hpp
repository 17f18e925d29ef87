// One key tile of the online softmax: z = scale·x + masks over n_valid entries, raise the running
// max, overwrite x with exp(z − max) (zeros past n_valid) and return the sum. Two passes over the tile:
// (1) z and its max (z stored back into x unless scale is 1 and there are no masks: then z = x);
// (2) exp, sum. Two accumulator chains per pass; the tail with masked loads/stores (AVX-512) or a
// padded buffer. Preconditions: x holds n floats, masks n_valid floats or null, no overlap with x.
// NaN: the max skips NaN (maxps keeps its second operand), the exp and the sum do not, as in softmax.
#pragma once
#include <algorithm>
#include <cstddef>
#include <limits>

#include "online_softmax.hpp"
#include "row_tail.hpp"
#include "softmax_math.hpp"

namespace mha::simd {

template <class Arch>
float softmax_tile_online_kernel::operator()(Arch arch, float* x, std::size_t n, std::size_t n_valid, float scale,
                                             const float* mask0, const float* mask1, float& running_max) const noexcept {
    using B = row_detail::batch<Arch>;
    using row_detail::load_head;
    using row_detail::store_head;
    constexpr std::size_t W = B::size;
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const std::size_t body = n_valid - n_valid % W, tail = n_valid - body;
    const bool z_is_x = scale == 1.0f && mask0 == nullptr && mask1 == nullptr;

    const B vscale(scale);
    auto z_at = [&](std::size_t j) noexcept {
        B z = B::load_unaligned(x + j);
        if (z_is_x) return z;
        z *= vscale;
        if (mask0) z += B::load_unaligned(mask0 + j);
        if (mask1) z += B::load_unaligned(mask1 + j);
        z.store_unaligned(x + j);
        return z;
    };
    B max_a(neg_inf), max_b(neg_inf);
    std::size_t j = 0;
    for (; j + 2 * W <= body; j += 2 * W) {
        max_a = xsimd::max(z_at(j), max_a);
        max_b = xsimd::max(z_at(j + W), max_b);
    }
    for (; j < body; j += W) max_a = xsimd::max(z_at(j), max_a);
    if (tail != 0) {
        B z = vscale * load_head(arch, x + body, tail, 0.0f);
        if (mask0) z += load_head(arch, mask0 + body, tail, 0.0f);
        if (mask1) z += load_head(arch, mask1 + body, tail, 0.0f);
        if (!z_is_x) store_head(arch, z, x + body, tail);
        const auto in_tail = B::load_aligned(softmax_detail::lane_index) < B(static_cast<float>(tail));
        max_b = xsimd::max(xsimd::select(in_tail, z, B(neg_inf)), max_b);
    }
    const float m = std::max(running_max, softmax_detail::reduce_max(arch, xsimd::max(max_a, max_b)));
    running_max = m;
    if (m == neg_inf) {
        // Nothing finite yet: a masked tile contributes 0, but a NaN score must not vanish as if masked.
        const bool has_nan = std::any_of(x, x + n_valid, [](float z) { return z != z; });
        std::fill(x, x + n, 0.0f);
        return has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    }

    const B vm(m);
    B sum_a(0.0f), sum_b(0.0f);
    for (j = 0; j + 2 * W <= body; j += 2 * W) {
        const B ea = softmax_detail::exp_nonpositive(arch, B::load_unaligned(x + j) - vm);
        const B eb = softmax_detail::exp_nonpositive(arch, B::load_unaligned(x + j + W) - vm);
        ea.store_unaligned(x + j);
        eb.store_unaligned(x + j + W);
        sum_a += ea;
        sum_b += eb;
    }
    for (; j < body; j += W) {
        const B e = softmax_detail::exp_nonpositive(arch, B::load_unaligned(x + j) - vm);
        e.store_unaligned(x + j);
        sum_a += e;
    }
    if (tail != 0) {  // lanes past the tail load -inf and add exp(-inf) = 0
        const B e = softmax_detail::exp_nonpositive(arch, load_head(arch, x + body, tail, neg_inf) - vm);
        store_head(arch, e, x + body, tail);
        sum_b += e;
    }
    std::fill(x + n_valid, x + n, 0.0f);
    return row_detail::reduce_add(arch, sum_a + sum_b);
}

}  // namespace mha::simd
