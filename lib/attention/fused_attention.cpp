// Fused attention for one (batch, head, query block), the online softmax of FlashAttention:
//   for each key tile [j0, j0 + kt):
//     S = Q_h·K_tileᵀ/√d (SIMD GEMM on K_hᵀ packed once per forward), masks added row by row;
//     m_new = max(m, max S_row); P_row = exp(S_row − m_new); l = l·e^(m − m_new) + Σ P_row;
//     O_row = O_row·e^(m − m_new); then O += P·V_tile (GEMM with beta = 1)
//   C_h rows = O / l (rows with l = 0, every key masked, become 0: zero probabilities).
// Causal: tiles entirely above the diagonal are never visited; a tile whose keys are all padded
// (key_padding_mask -inf) is skipped. Memory: rows·key_tile + rows·d floats per task.
#include "fused_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "../simd/simd.hpp"

namespace mha::detail {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Every key of a padding row is masked (nonzero byte or additive -inf).
bool all_masked(const simd::MaskRow& m, std::size_t n) {
    for (std::size_t j = 0; j < n; ++j)
        if (!m.masked(j)) return false;
    return true;
}

}  // namespace

void fused_attend_block(const AttentionPlan& p, std::size_t b, std::size_t h, std::size_t i0, std::size_t rows) {
    const std::size_t d = p.head_dim, tile = kFusedKeyTile;
    const AttentionPlan::ThreadScratch scratch = p.thread_scratch();
    const Matrix s(scratch.scores, rows, tile, tile);
    const Matrix o(scratch.accumulator, rows, d, d);
    float* row_max = scratch.row_stats;
    float* row_sum = row_max + rows;
    std::fill(row_max, row_max + rows, kMinusInf);
    std::fill(row_sum, row_sum + rows, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) std::fill(o.row(r), o.row(r) + d, 0.0f);

    const ConstMatrix q = p.Q[b].columns(h * d, d).row_block(i0, rows);
    // K_hᵀ and V_h packed once per forward (AttentionPlan::pack_keys_values): tiles are read in place.
    const simd::PanelMatrix k_t = p.key_panels(b, h), v = p.value_panels(b, h);
    const simd::MaskRow padding = p.key_padding_row(b);
    const bool careful = p.value_nonfinite(b, h);  // a value is NaN or ±inf: masked keys must be skipped
    const std::size_t key_end = p.causal ? std::min(p.Lk, i0 + rows) : p.Lk;

    for (std::size_t j0 = 0; j0 < key_end; j0 += tile) {
        const std::size_t kt = std::min(tile, key_end - j0);
        if (padding.present() && all_masked(padding.from(j0), kt)) continue;
        const Matrix st = s.columns(0, kt);
        simd::gemm_panels(p.scale, q, Trans::no, k_t.columns(j0, kt), 0.0f, st);
        for (std::size_t r = 0; r < rows; ++r) {
            const std::size_t i = i0 + r;
            const std::size_t valid = !p.causal ? kt : (i + 1 > j0 ? std::min(kt, i + 1 - j0) : 0);
            const simd::MaskRow am = p.attn_mask_row(b, h, i);
            const float old_max = row_max[r];
            const float tile_sum = simd::softmax_tile_online(st.row(r), kt, valid, 1.0f, padding.from(j0), am.from(j0),
                                                             row_max[r]);
            if (row_max[r] != old_max) {
                // The max grew: rescale what was accumulated under the old max (nothing if it was -inf).
                const float alpha = old_max == kMinusInf ? 0.0f : std::exp(old_max - row_max[r]);
                row_sum[r] *= alpha;
                float* orow = o.row(r);
                for (std::size_t c = 0; c < d; ++c) orow[c] *= alpha;
            }
            row_sum[r] += tile_sum;
        }
        if (careful)
            p.accumulate_unmasked(b, h, i0, j0, ConstMatrix(st), o);  // unpacked V_h, masked keys left out
        else
            simd::gemm_panels(1.0f, ConstMatrix(st), Trans::no, v.rows(j0, kt), 1.0f, o);
    }

    const Matrix c = p.C[b].columns(h * d, d).row_block(i0, rows);
    for (std::size_t r = 0; r < rows; ++r) {
        // l = 0: every key masked, the row is 0. A NaN l (NaN scores) stays NaN.
        const float inv = row_sum[r] == 0.0f ? 0.0f : 1.0f / row_sum[r];
        for (std::size_t col = 0; col < d; ++col) c(r, col) = o(r, col) * inv;
    }
}

}  // namespace mha::detail
