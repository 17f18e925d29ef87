// One key tile of the online softmax: z = modifiers(scale·x) + masks over n_valid entries, raise the running
// max, overwrite x with exp(z − max) (zeros past n_valid) and return the sum. The same two passes as
// the row softmax (softmax_math.hpp): z and its max (z stored over x unless scale is 1 and there are no
// masks); exp and its sum. Preconditions: x holds n floats, masks n_valid entries or none, no overlap.
// NaN: the max skips NaN, the exp and the sum do not, as in softmax.
// scale_row: x[0, n) *= alpha, one product per entry (the bits of the plain loop), for the online softmax's
// rescale of an accumulator row when the max grows.
#pragma once
#include <cstddef>
#include <limits>

#include "online_softmax.hpp"
#include "row_tail.hpp"
#include "softmax_math.hpp"

namespace mha::simd {

template <class Arch>
float softmax_tile_online_kernel::operator()(Arch arch, float* x, std::size_t n, std::size_t n_valid, float scale,
                                             MaskRow mask0, MaskRow mask1, float& running_max,
                                             ScoreRowModifiers mods) const noexcept {
    const float tile_max = softmax_detail::scale_mask_max(arch, x, n_valid, scale, mask0, mask1, mods);
    const float m = tile_max > running_max ? tile_max : running_max;
    running_max = m;
    if (m == softmax_detail::kNegInf) {
        // Nothing finite yet: a masked tile contributes 0, but a NaN score must not vanish as if masked.
        const bool has_nan = softmax_detail::any_nan(arch, x, n_valid);
        softmax_detail::fill(arch, x, n, 0.0f);
        return has_nan ? softmax_detail::kNaN : 0.0f;
    }
    const float sum = softmax_detail::exp_sum(arch, x, n_valid, m);
    softmax_detail::fill(arch, x + n_valid, n - n_valid, 0.0f);
    return sum;
}

template <class Arch>
void scale_row_kernel::operator()(Arch arch, float* x, std::size_t n, float alpha) const noexcept {
    using B = softmax_detail::batch<Arch>;
    constexpr std::size_t W = B::size;
    const B a(alpha);
    std::size_t j = 0;
    for (; j + W <= n; j += W) (B::load_unaligned(x + j) * a).store_unaligned(x + j);
    if (j < n) row_detail::store_head(arch, row_detail::load_head(arch, x + j, n - j, 0.0f) * a, x + j, n - j);
}

}  // namespace mha::simd
