// The attention core's materialized path: per (batch, query head, 64 query rows) the scores [rows, keys] =
// scale·Q·Kᵀ (one GEMM), a plain row softmax with the masks, then C = P·V. The only path that can return the
// probabilities (need_weights: per_head writes them straight into attn_weights; averaged runs a block's heads
// in one task, so the sum over heads has a fixed order). Keys outside the block's visible range (causal, a
// sliding window) are not multiplied. Reads K and V once per (query head, query block).
#include <algorithm>
#include <limits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "../simd/nonfinite.hpp"
#include "../simd/round_bf16.hpp"
#include "core_context.hpp"

namespace mha::detail {
namespace {

// Sets the value flags of every KV head (the GEMM P·V cannot skip masked keys).
void check_values(const CoreContext& c) {
    std::uint8_t* flags = c.value_flags();
    if (flags == nullptr) return;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, c.B * c.Hkv), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t bh = r.begin(); bh != r.end(); ++bh) {
            const ConstMatrix v = c.p.v.head(bh / c.Hkv, bh % c.Hkv);
            bool bad = false;
            for (std::size_t j = 0; j < c.keys_of(bh / c.Hkv) && !bad; ++j) bad = simd::any_nonfinite(v.row(j), c.d);
            flags[bh] = bad ? 1 : 0;
        }
    });
}

// Probabilities of rows [i0, i0 + rows) of head h into `scores` (Lk columns with need_weights), their
// P·V into the head's output rows.
void attend_block(const CoreContext& c, std::size_t b, std::size_t h, std::size_t i0, std::size_t rows, Matrix scores,
                  const CoreSlot& slot) {
    const CoreProblem& p = c.p;
    const std::size_t d = c.d, kvh = h / c.G;
    const KeyRange block = c.visible_block(b, i0, rows);
    const std::size_t lo = block.lo, keys = block.hi, n = keys - lo;  // keys [lo, keys) are multiplied
    const std::size_t cols = p.need_weights == NeedWeights::none ? keys : c.Lk;
    const Matrix s(scores.data, rows, cols, scores.stride);
    const Matrix out = p.out.head(b, h).row_block(i0, rows);
    if (n == 0) {  // bottom-right causal with Lq > Lk: these queries see no key
        for (std::size_t r = 0; r < rows; ++r) {
            if (cols > 0) simd::softmax_row(s.row(r), cols, 0, 1.0f, {}, {});
            std::fill(out.row(r), out.row(r) + d, 0.0f);
        }
        return;
    }
    const ConstMatrix q = p.q.head(b, h).row_block(i0, rows);
    const ConstMatrix k = p.k.head(b, kvh).row_block(lo, n);
    // bf16 kernels: K_hᵀ and V_h packed into the slot's bf16 panels for this block.
    const bool use16 = on_bf16_kernels(c.operands);
    std::uint16_t* k16 = slot.gemm16;
    const std::size_t k16_stride = simd::Bf16Panels::min_panel_stride(d), v16_stride = simd::Bf16Panels::min_panel_stride(n);
    std::uint16_t* v16 = k16 + (simd::Bf16Panels::elements(n, k16_stride) + 31) / 32 * 32;
    std::uint16_t* a16 = v16 + (simd::Bf16Panels::elements(d, v16_stride) + 31) / 32 * 32;
    if (use16) {
        simd::pack_panels_bf16(k, Trans::yes, k16, k16_stride);
        simd::gemm_bf16(p.scale, q, simd::Bf16Panels{k16, d, n, k16_stride}, 0.0f, nullptr, s.columns(lo, n), a16);
    } else {
        simd::gemm(p.scale, q, Trans::no, k, Trans::yes, 0.0f, s.columns(lo, n), slot.gemm);
    }
    for (std::size_t r = 0; r < rows; ++r) {
        // The row's keys before its window (pre >= lo) get probability 0 and never meet the masks.
        const std::size_t i = i0 + r;
        const KeyRange range = c.visible(b, i);
        const std::size_t valid = c.tile_valid(range, 0, cols), pre = CoreContext::hidden_prefix(range, 0, valid);
        float* x = s.row(r) + pre;
        const simd::MaskRow padding = c.key_padding_row(b).from(pre), am = c.attn_mask_row(b, h, i).from(pre);
        const simd::ScoreRowModifiers mods = c.row_modifiers(b, h, i, pre);
        if (p.mods.sinks != nullptr) {  // the online kernel leaves the max and sum the sink's denominator needs
            float m = -std::numeric_limits<float>::infinity();
            const float l = simd::softmax_tile_online(x, cols - pre, valid - pre, 1.0f, padding, am, m, mods);
            const float inv = c.row_normalizer(h, m, l);
            for (std::size_t j = 0; j < valid - pre; ++j) x[j] *= inv;
        } else {
            simd::softmax_row(x, cols - pre, valid - pre, 1.0f, padding, am, mods);
        }
        std::fill(s.row(r), x, 0.0f);
    }
    count_kv_rows(2 * n);
    if (rounds_to_bf16(c.operands)) simd::round_to_bf16_inplace(s);  // P as the input of P·V (and as the weights returned)
    if (c.value_nonfinite(b, kvh)) {  // a masked key must not contribute 0·NaN
        for (std::size_t r = 0; r < rows; ++r) std::fill(out.row(r), out.row(r) + d, 0.0f);
        c.accumulate_unmasked(b, h, i0, lo, ConstMatrix(s.columns(lo, n)), out);
        return;
    }
    const ConstMatrix v = p.v.head(b, kvh).row_block(lo, n);
    if (use16) {
        simd::pack_panels_bf16(v, Trans::no, v16, v16_stride);
        simd::gemm_bf16(1.0f, ConstMatrix(s.columns(lo, n)), simd::Bf16Panels{v16, n, d, v16_stride}, 0.0f, nullptr, out, a16);
        return;
    }
    simd::gemm(1.0f, ConstMatrix(s.columns(lo, n)), Trans::no, v, Trans::no, 0.0f, out, slot.gemm);
}

}  // namespace

void run_materialized(const CoreContext& c) {
    const CoreProblem& p = c.p;
    const std::size_t B = c.B, H = c.H, Lq = c.Lq, Lk = c.Lk;
    check_values(c);
    const std::size_t qb = kQueryBlock, nqb = (Lq + qb - 1) / qb;
    if (p.need_weights == NeedWeights::averaged) {
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t b = t / nqb, i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
                const CoreSlot s = c.slot();
                const Matrix sc(s.scores, rows, Lk);
                const Matrix w(p.attn_weights + (b * Lq + i0) * Lk, rows, Lk);
                const float inv_h = 1.0f / static_cast<float>(H);
                for (std::size_t h = 0; h < H; ++h) {
                    attend_block(c, b, h, i0, rows, sc, s);
                    for (std::size_t i = 0; i < rows; ++i)
                        for (std::size_t j = 0; j < Lk; ++j) w(i, j) = (h == 0 ? 0.0f : w(i, j)) + sc(i, j) * inv_h;
                }
            }
        });
        return;
    }
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * H * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t bh = t / nqb, b = bh / H, h = bh % H;
            const std::size_t i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
            const CoreSlot s = c.slot();
            const Matrix sc = p.need_weights == NeedWeights::per_head ? Matrix(p.attn_weights + (bh * Lq + i0) * Lk, rows, Lk)
                                                                      : Matrix(s.scores, rows, Lk);
            attend_block(c, b, h, i0, rows, sc, s);
        }
    });
}

}  // namespace mha::detail
