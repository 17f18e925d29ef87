// Row softmax on one ISA: the definition of softmax_kernel::operator(), included only by the
// generated softmax_<isa>.cpp TUs. In place on x[0, n):
//   z_j = modifiers(scale·x_j) (+ mask0_j) (+ mask1_j) for j < n_valid (modifiers: ScoreRowModifiers),
//   x_j = exp(z_j − max z) / Σ exp(z − max z) for j < n_valid, x_j = 0 for n_valid <= j < n;
//   a row whose z are all -inf (or n_valid == 0) becomes 0 (if the others are NaN: NaN). NaN in z makes the row's valid entries NaN,
//   as in the reference (the max skips NaN, the sum does not).
// Preconditions: n_valid <= n; the masks (if present) hold n_valid entries and do not overlap x.
// Three passes over the row, which stays in L1/L2 (n <= 8192):
//   1. z = scale·x + masks, stored over x (unless z = x), running max;  2. e = exp(z − max), stored, running sum;
//   3. x *= 1/sum.  Tails use masked loads/stores on AVX-512 and a padded stack buffer elsewhere.
// exp: exp_nonpositive (softmax_math.hpp).
// Every helper is a template on Arch (or exists only in the AVX-512 TU), so none becomes a weak symbol
// shared by two ISA TUs, whose copy compiled with one ISA's flags the linker could pick for another's
// path. (At -O0, xsimd::exp's own scalar-constant helpers still are, in the AVX2 and SSE2 TUs.)
#pragma once
#include <cstddef>
#include <limits>

#include "row_tail.hpp"
#include "softmax_math.hpp"
#include "softmax.hpp"

namespace mha::simd {

template <class Arch>
void softmax_kernel::operator()(Arch arch, float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                                MaskRow mask1, ScoreRowModifiers mods) const noexcept {
    using B = softmax_detail::batch<Arch>;
    using row_detail::load_head;
    using row_detail::store_head;
    constexpr std::size_t W = B::size;
    const std::size_t body = n_valid - n_valid % W;  // whole batches; the rest is the tail
    const std::size_t tail = n_valid - body;

    // Pass 1: z (stored over x unless z = x) and its max.
    const float max = softmax_detail::scale_mask_max(arch, x, n_valid, scale, mask0, mask1, mods);

    if (max == softmax_detail::kNegInf) {
        // Every z is -inf or NaN (or n_valid == 0). Fully masked: the row is 0. But a NaN must not
        // vanish into a "masked" row: if any z is NaN the valid entries become NaN (a rare branch).
        const bool has_nan = softmax_detail::any_nan(arch, x, n_valid);
        const B fill(has_nan ? softmax_detail::kNaN : 0.0f);
        std::size_t j = 0;
        for (; j + W <= n_valid; j += W) fill.store_unaligned(x + j);
        if (j < n_valid) store_head(arch, fill, x + j, n_valid - j);
        softmax_detail::fill(arch, x + n_valid, n - n_valid, 0.0f);
        return;
    }

    // Pass 2: e = exp(z − max) and Σ e.
    const float sum = softmax_detail::exp_sum(arch, x, n_valid, max);

    // Pass 3: scale by 1/Σ (one division per row; the sum is >= 1 because the max term is exp(0)).
    const B inv_sum = B(1.0f) / B(sum);
    std::size_t j = 0;
    for (; j < body; j += W) (B::load_unaligned(x + j) * inv_sum).store_unaligned(x + j);
    if (tail != 0) store_head(arch, load_head(arch, x + body, tail, 0.0f) * inv_sum, x + body, tail);

    // Entries past n_valid get probability 0.
    const B zero(0.0f);
    for (j = n_valid; j + W <= n; j += W) zero.store_unaligned(x + j);
    if (j < n) store_head(arch, zero, x + j, n - j);
}

}  // namespace mha::simd
