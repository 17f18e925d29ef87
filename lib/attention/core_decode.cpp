// The attention core's decode path (few queries: Lq <= 16 and G·Lq <= 128): per (batch, KV head, split of
// decode_split keys: 512 fp32, 2048 of 16 or 8 bits) the G·Lq stacked query rows against the split's keys, read
// in place by the decode kernels from CoreContext::keys / values (kv_rows.hpp: any element format, run by run,
// never copied):
//   S = scale·Q·Kᵀ (simd::decode_scores), the split's softmax (running max m, sum l), O = P·V
//   (simd::decode_accumulate) — one stream at a time: all the split's scores, then all its values;
// then the splits' (m, l, O) are merged exactly by rescaling (flash-decoding), in a fixed order. Splits
// depend on the shape and the element type only: the same bits for any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "../simd/round_bf16.hpp"
#include "core_context.hpp"

namespace mha::detail {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

class DecodePath {
public:
    explicit DecodePath(const CoreContext& c)
        : c_(c), partials_(c.base + c.layout.partials), splits_(c.layout.splits), split_(c.layout.split) {}

    void run() const {
        const std::size_t Hkv = c_.Hkv, splits = splits_;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c_.B * Hkv * splits), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                // After this task's values, the next task's first keys (when this thread runs it).
                const simd::RowsAhead next = t + 1 != r.end() ? first_keys(t + 1) : simd::RowsAhead{};
                task(t / splits / Hkv, t / splits % Hkv, t % splits, next);
            }
        });
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c_.B * Hkv), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) merge(t / Hkv, t % Hkv);
        });
    }

private:
    // Per (b, kvh, split): M row maxima, M sums, M×d outputs (M = G·Lq).
    float* partial(std::size_t b, std::size_t kvh, std::size_t split) const noexcept {
        const std::size_t m = c_.G * c_.Lq;
        return partials_ + ((b * c_.Hkv + kvh) * splits_ + split) * m * (c_.d + 2);
    }

    // The keys a task reads first (its split's visible keys; a padding mask may skip some of them).
    simd::RowsAhead first_keys(std::size_t t) const noexcept {
        const std::size_t b = t / splits_ / c_.Hkv, kvh = t / splits_ % c_.Hkv, split = t % splits_;
        const KeyRange keys = c_.visible_block(b, 0, c_.Lq);
        const std::size_t lo = std::max(keys.lo, split * split_), hi = std::min(keys.hi, split * split_ + split_);
        return c_.keys.rows_ahead(b, kvh, lo, hi);
    }

    void task(std::size_t b, std::size_t kvh, std::size_t split, const simd::RowsAhead& next) const {
        const std::size_t d = c_.d, m = c_.G * c_.Lq;
        const CoreSlot s = c_.slot();
        const Matrix q(s.q_stack, m, d, d);
        const Matrix o(s.accumulator, m, d, d);
        float* row_max = s.row_stats;
        float* row_sum = row_max + m;
        reset_online_softmax(row_max, row_sum, o);

        const KeyRange keys = c_.visible_block(b, 0, c_.Lq);
        std::size_t j0 = std::max(keys.lo, split * split_), j_end = std::min(keys.hi, split * split_ + split_);
        const simd::MaskRow padding = c_.key_padding_row(b);
        if (padding.present()) {  // wholly padded tiles at either end of the split are not read
            while (j0 < j_end && all_masked(padding.from(j0), std::min(kKeyTile, j_end - j0))) j0 += kKeyTile;
            while (j0 < j_end) {
                const std::size_t last = j0 + (j_end - j0 - 1) / kKeyTile * kKeyTile;
                if (!all_masked(padding.from(last), j_end - last)) break;
                j_end = last;
            }
        }
        if (j0 < j_end) {
            const std::size_t n = j_end - j0;
            c_.stack_queries(b, kvh, 0, c_.Lq, q);
            const Matrix st(s.scores, m, n, split_);
            visit_element_type(c_.keys.format->type, [&](auto element) {
                split_keys<decltype(element)>(b, kvh, j0, n, ConstMatrix(q), st, o, row_max, row_sum, next);
            });
            count_kv_rows(2 * n);
        }
        // The split's partial result: row maxima, sums and unnormalized outputs.
        float* part = partial(b, kvh, split);
        std::copy(row_max, row_max + m, part);
        std::copy(row_sum, row_sum + m, part + m);
        for (std::size_t r = 0; r < m; ++r) std::copy(o.row(r), o.row(r) + d, part + 2 * m + r * d);
    }

    // The split's scores, softmax and P·V on keys [j0, j0 + n) of element type E, one kernel call per stream (the
    // kernels walk a paged cache's blocks). Each reads ahead into the stream read after it: the keys into the
    // values, the values into `next`.
    template <class E>
    void split_keys(std::size_t b, std::size_t kvh, std::size_t j0, std::size_t n, ConstMatrix q, Matrix st, Matrix o,
                    float* row_max, float* row_sum, const simd::RowsAhead& next) const {
        const std::size_t m = c_.G * c_.Lq, Lq = c_.Lq, j_end = j0 + n;
        // All the split's scores first, then all its values: one stream at a time (switching between the K
        // and V streams every 256 rows measured 10-20 % slower at M = 4..8).
        // bf16 compute over a bf16 cache (or an f32 one, which holds the rounded rows, or an fp8 one, whose codes are
        // bf16 values): the products on vdpbf16ps where the CPU has it (simd.hpp).
        constexpr bool kBf16Values = std::is_same_v<E, bfloat16> || std::is_same_v<E, float> ||
                                     std::is_same_v<E, fp8_e4m3> || std::is_same_v<E, fp8_e5m2>;
        const bool dot16 = kBf16Values && rounds_to_bf16(c_.operands);
        if constexpr (kBf16Values) {
            if (dot16)
                simd::decode_scores_bf16(c_.p.scale, q, c_.keys.blocked_rows<E>(b, kvh, j0, j_end), st,
                                         c_.values.rows_ahead(b, kvh, j0, j_end), c_.keys.scale);
        }
        if (!dot16)
            simd::decode_scores(c_.p.scale, q, c_.keys.blocked_rows<E>(b, kvh, j0, j_end), st,
                                c_.values.rows_ahead(b, kvh, j0, j_end), c_.keys.scale);
        for (std::size_t row = 0; row < m; ++row)
            row_sum[row] = c_.softmax_tile(b, kvh * c_.G + row / Lq, row % Lq, j0, st.row(row), n, row_max[row]);
        // A key of this split is masked for some row (the causal edge of the first query, a window's edge, or a
        // mask): a NaN or ±inf value row must then not reach the output through 0·v.
        const bool masked_here = c_.any_mask() || j_end > c_.visible(b, 0).hi || j0 < c_.visible(b, Lq - 1).lo;
        bool careful = false;
        if (masked_here)
            c_.values.runs(j0, j_end, [&](std::size_t j, std::size_t len) {
                const MatrixView<const E> v = c_.values.run_view<E>(b, kvh, j, len);
                for (std::size_t r = 0; r < len && !careful; ++r) careful = any_nonfinite(*c_.values.format, v.row(r), c_.d);
            });
        if (rounds_to_bf16(c_.operands)) simd::round_to_bf16_inplace(st);  // P as the input of P·V
        if (careful) {
            for (std::size_t t = 0; t < c_.G; ++t)
                c_.accumulate_unmasked(b, kvh * c_.G + t, 0, j0, ConstMatrix(st.row_block(t * Lq, Lq)), o.row_block(t * Lq, Lq));
            return;
        }
        if constexpr (kBf16Values) {
            if (dot16)
                return simd::decode_accumulate_bf16(ConstMatrix(st), c_.values.blocked_rows<E>(b, kvh, j0, j_end), o, next,
                                                    c_.values.scale);
        }
        simd::decode_accumulate(ConstMatrix(st), c_.values.blocked_rows<E>(b, kvh, j0, j_end), o, next,
                                c_.values.scale);
    }

    void merge(std::size_t b, std::size_t kvh) const {
        const std::size_t d = c_.d, m = c_.G * c_.Lq, splits = splits_;
        const float* parts = partial(b, kvh, 0);
        for (std::size_t row = 0; row < m; ++row) {
            float best = kMinusInf;
            for (std::size_t sp = 0; sp < splits; ++sp) {
                const float mx = parts[sp * m * (d + 2) + row];
                best = (std::isnan(mx) || mx > best) ? mx : best;
                if (std::isnan(best)) break;
            }
            float* dst = c_.p.out.head(b, kvh * c_.G + row / c_.Lq).row(row % c_.Lq);
            std::fill(dst, dst + d, 0.0f);
            float sum = 0.0f;
            for (std::size_t sp = 0; sp < splits; ++sp) {  // fixed order: the same bits for any thread count
                const float* part = parts + sp * m * (d + 2);
                if (part[row] == kMinusInf) {  // no visible key in this split (a NaN sum still makes the row NaN)
                    if (std::isnan(part[m + row])) sum = part[m + row];
                    continue;
                }
                const float scale = std::isnan(best) ? best : std::exp(part[row] - best);
                sum += part[m + row] * scale;
                const float* po = part + 2 * m + row * d;
                for (std::size_t col = 0; col < d; ++col) dst[col] += po[col] * scale;
            }
            // sum = 0: every key masked, the row is 0. A NaN sum (NaN scores) stays NaN. A sink joins the sum here.
            const float inv = c_.row_normalizer(kvh * c_.G + row / c_.Lq, best, sum);
            for (std::size_t col = 0; col < d; ++col) dst[col] *= inv;
        }
    }

    const CoreContext& c_;
    float* partials_;
    std::size_t splits_, split_;
};

}  // namespace

void run_decode(const CoreContext& c) { DecodePath(c).run(); }

}  // namespace mha::detail
