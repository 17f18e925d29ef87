// AttentionPlan: buffers, masks and the two projection steps of the SIMD attention backend.
#include "attention_plan.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>

#include <emmintrin.h>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "../core/validate.hpp"
#include "fused_attention.hpp"

namespace mha::detail {
namespace {

// Rows of a projection task: large enough for the GEMM's row blocking, small enough to give every
// core work at B·L = 128 tokens.
constexpr std::size_t kRowBlock = 64;
// Keys per packing task of the fused path (a multiple of every ISA's panel width and of 16).
constexpr std::size_t kPackBlock = 256;

bool same_view(const ConstBatch& a, const ConstBatch& b) {
    return a.data == b.data && a.batch == b.batch && a.rows == b.rows && a.cols == b.cols &&
           a.row_stride == b.row_stride && a.batch_stride == b.batch_stride;
}

// A mask's data as a row reader (the row offset is added per use).
simd::MaskRow mask_row(const MaskView& m) {
    if (!m.present()) return {};
    return m.type == MaskType::boolean ? simd::MaskRow(m.bools) : simd::MaskRow(m.values);
}

// Any of x[0, n) is NaN or ±inf: its exponent bits are all set. SSE2 (the x86-64 baseline), four at a time:
// ((bits & exponent) + 2^23) has its top bit set exactly when the exponent field is all ones.
bool any_nonfinite(const float* x, std::size_t n) {
    const __m128i exponent = _mm_set1_epi32(0x7f800000), one = _mm_set1_epi32(0x00800000);
    __m128i acc = _mm_setzero_si128();
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j));
        acc = _mm_or_si128(acc, _mm_add_epi32(_mm_and_si128(bits, exponent), one));
    }
    bool bad = (_mm_movemask_ps(_mm_castsi128_ps(acc)) != 0);
    for (; j < n; ++j) bad |= !std::isfinite(x[j]);
    return bad;
}

// Overflow-checked size arithmetic for the scratch layout.
std::size_t mul(std::size_t a, std::size_t b) {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail("the scratch of this call overflows the address space");
    return r;
}

// Carves 64-byte aligned regions (16 floats) out of a running total.
struct Carver {
    std::size_t total = 0;
    std::size_t take(std::size_t floats) {
        const std::size_t at = total;
        std::size_t end = 0;
        if (__builtin_add_overflow(total, floats, &end) || end > SIZE_MAX / sizeof(float) - 16)
            fail("the scratch of this call overflows the address space");
        total = (end + 15) / 16 * 16;
        return at;
    }
};

// Sizes are the largest over the ISAs this CPU has (the cap may change between a workspace_bytes query
// and the call; it can only select one of these). Never asks an ISA the CPU lacks: its functions are
// compiled for it.
constexpr Isa kIsas[] = {Isa::sse2, Isa::avx2, Isa::avx512};

// Floats of one head's packed panels: ceil(n / NR) panels of round16(k·NR) floats (PanelMatrix), checked.
std::size_t panel_floats(Isa isa, std::size_t k, std::size_t n) {
    const std::size_t nr = simd::PanelMatrix::panel_width(isa);
    return mul((n + nr - 1) / nr, (mul(k, nr) + 15) / 16 * 16);
}

}  // namespace

bool use_fused(const AttentionInputs& in, const ForwardOptions& opt) noexcept {
    return opt.need_weights == NeedWeights::none &&
           (opt.impl == Impl::fused || (opt.impl == Impl::automatic && in.key.rows >= kFusedMinKeys));
}

bool is_self_attention(const AttentionInputs& in) noexcept {
    return same_view(in.query, in.key) && same_view(in.key, in.value);
}

std::size_t arena_threads(const ForwardOptions& opt) {
    if (opt.threads <= 0) return static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
    // More threads than TBB may run at once (global_control, by default the core count) would only
    // leave arena slots empty.
    const auto allowed = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
    return std::min(static_cast<std::size_t>(opt.threads), allowed);
}

ScratchLayout scratch_layout(std::size_t E, std::size_t H, std::size_t B, std::size_t Lq, std::size_t Lk, bool self_attention,
                             bool fused, NeedWeights need_weights, std::size_t threads) {
    ScratchLayout l;
    Carver c;
    const std::size_t d = E / H;
    if (self_attention) {
        l.projections = c.take(mul(mul(B, Lq), mul(3, E)));
    } else {
        l.projections = c.take(mul(mul(B, Lq), E));
        l.key_values = c.take(mul(mul(B, Lk), mul(2, E)));
    }
    l.context = c.take(mul(mul(B, Lq), E));
    l.value_flags = c.take(mul(B, H) / sizeof(float) + 1);
    std::size_t scores = 0, accumulator = 0, row_stats = 0;
    if (fused) {
        std::size_t key_floats = 0, value_floats = 0;
        for (Isa isa : kIsas) {
            if (isa > detected_isa()) continue;
            key_floats = std::max(key_floats, panel_floats(isa, d, Lk));    // K_hᵀ: [d, Lk]
            value_floats = std::max(value_floats, panel_floats(isa, Lk, d));  // V_h: [Lk, d]
        }
        l.key_panels = c.take(mul(mul(B, H), key_floats));
        l.value_panels = c.take(mul(mul(B, H), value_floats));
        scores = kFusedQueryBlock * kFusedKeyTile;
        accumulator = kFusedQueryBlock * d;
        row_stats = 2 * kFusedQueryBlock;
    } else {
        // per_head writes the probabilities straight into attn_weights.
        scores = need_weights == NeedWeights::per_head ? 0 : mul(kQueryBlock, Lk);
        for (Isa isa : kIsas) {
            if (isa > detected_isa()) continue;
            // S = Q_h·K_hᵀ: [rows, keys] over d; then P·V_h: [rows, d] over keys.
            const simd::GemmScratchSize qk = simd::gemm_scratch_bound(isa, kQueryBlock, Lk, d, Trans::no, Trans::yes);
            const simd::GemmScratchSize pv = simd::gemm_scratch_bound(isa, kQueryBlock, d, Lk, Trans::no, Trans::no);
            l.gemm.a_floats = std::max({l.gemm.a_floats, qk.a_floats, pv.a_floats});
            l.gemm.b_floats = std::max({l.gemm.b_floats, qk.b_floats, pv.b_floats});
        }
    }
    Carver slot;
    l.scores = slot.take(scores);
    l.accumulator = slot.take(accumulator);
    l.row_stats = slot.take(row_stats);
    l.gemm_a = slot.take(l.gemm.a_floats);
    l.gemm_b = slot.take(l.gemm.b_floats);
    l.slot_floats = slot.total;
    l.threads = threads;
    l.slots = c.take(mul(threads, l.slot_floats));
    l.total_floats = c.total;
    return l;
}

AttentionPlan::AttentionPlan(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs&,
                             const ForwardOptions& opt, bool fused, const ScratchLayout& layout, float* scratch)
    : E(st.E), H(st.H), head_dim(st.E / st.H), B(in.query.batch), Lq(in.query.rows), Lk(in.key.rows),
      scale(1.0f / std::sqrt(static_cast<float>(st.E / st.H))), causal(opt.causal), need_weights(opt.need_weights),
      query_block(fused ? kFusedQueryBlock : kQueryBlock), row_block(kRowBlock), self_attention(is_self_attention(in)),
      norm_eps_(opt.norm_eps), slots_(scratch + layout.slots), layout_(layout) {
    if (self_attention) {
        float* qkv = scratch + layout.projections;
        Q = Batch(qkv, B, Lq, E, 3 * E, Lq * 3 * E);
        K = Batch(qkv + E, B, Lq, E, 3 * E, Lq * 3 * E);
        V = Batch(qkv + 2 * E, B, Lq, E, 3 * E, Lq * 3 * E);
    } else {
        Q = Batch(scratch + layout.projections, B, Lq, E);
        float* kv = scratch + layout.key_values;
        K = Batch(kv, B, Lk, E, 2 * E, Lk * 2 * E);
        V = Batch(kv + E, B, Lk, E, 2 * E, Lk * 2 * E);
    }
    C = Batch(scratch + layout.context, B, Lq, E);
    if (fused) {
        panel_isa_ = active_isa();
        key_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, head_dim);
        value_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, Lk);
        key_head_floats_ = simd::PanelMatrix::floats(panel_isa_, Lk, key_panel_stride_);
        value_head_floats_ = simd::PanelMatrix::floats(panel_isa_, head_dim, value_panel_stride_);
        key_panels_ = scratch + layout.key_panels;
        value_panels_ = scratch + layout.value_panels;
    }
    key_padding_ = mask_row(in.key_padding_mask);
    attn_mask_ = mask_row(in.attn_mask);
    attn_mask_rank_ = in.attn_mask.rank;
    if (has_masks()) value_flags_ = reinterpret_cast<std::uint8_t*>(scratch + layout.value_flags);
}

bool AttentionPlan::key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept {
    return (causal && j > i) || key_padding_row(b).masked(j) || attn_mask_row(b, h, i).masked(j);
}

void AttentionPlan::accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                                        Matrix o) const noexcept {
    const std::size_t d = head_dim;
    const ConstMatrix v = V[b].columns(h * d, d);
    for (std::size_t r = 0; r < probs.rows; ++r)
        for (std::size_t j = 0; j < probs.cols; ++j) {
            if (key_masked(b, h, i0 + r, j0 + j)) continue;
            const float pj = probs(r, j);
            for (std::size_t col = 0; col < d; ++col) o(r, col) += pj * v(j0 + j, col);
        }
}

void AttentionPlan::check_values() const {
    if (value_flags_ == nullptr) return;
    const std::size_t d = head_dim;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * H), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t bh = r.begin(); bh != r.end(); ++bh) {
            const ConstMatrix v = V[bh / H].columns(bh % H * d, d);
            bool bad = false;
            for (std::size_t j = 0; j < Lk && !bad; ++j) bad = any_nonfinite(v.row(j), d);
            value_flags_[bh] = bad ? 1 : 0;
        }
    });
}

AttentionPlan::ThreadScratch AttentionPlan::thread_scratch() const noexcept {
    const int index = tbb::this_task_arena::current_thread_index();
    assert(index >= 0 && static_cast<std::size_t>(index) < layout_.threads);
    float* slot = slots_ + static_cast<std::size_t>(index) * layout_.slot_floats;
    return {slot + layout_.scores, slot + layout_.accumulator, slot + layout_.row_stats,
            simd::GemmScratch{slot + layout_.gemm_a, layout_.gemm.a_floats, slot + layout_.gemm_b, layout_.gemm.b_floats}};
}

void AttentionPlan::project_inputs(const MultiheadAttention::State& st, const AttentionInputs& in) const {
    const std::size_t nq = (Lq + row_block - 1) / row_block, nk = (Lk + row_block - 1) / row_block;
    const float* bias = st.in_b.data();
    if (self_attention) {
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nq), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t b = t / nq, r0 = (t % nq) * row_block, n = std::min(row_block, Lq - r0);
                const Matrix qkv(Q[b].data + r0 * 3 * E, n, 3 * E, 3 * E);
                const ConstMatrix x = in.query[b].row_block(r0, n);
                if (st.in_proj.segments_contiguous()) {
                    simd::gemm_packed(1.0f, x, Trans::no, st.in_proj.all(), 0.0f, bias, qkv);
                } else {  // E is not a multiple of the panel width: Wq, Wk, Wv are padded apart
                    for (std::size_t part = 0; part < 3; ++part)
                        simd::gemm_packed(1.0f, x, Trans::no, st.in_proj.segments(part, 1), 0.0f, bias + part * E,
                                          qkv.columns(part * E, E));
                }
            }
        });
        return;
    }
    // Cross-attention: Q from query, K and V from key and value, all tasks in one loop.
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * (nq + 2 * nk)), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / (nq + 2 * nk), u = t % (nq + 2 * nk);
            if (u < nq) {
                const std::size_t r0 = u * row_block, n = std::min(row_block, Lq - r0);
                simd::gemm_packed(1.0f, in.query[b].row_block(r0, n), Trans::no, st.in_proj.segments(0, 1), 0.0f, bias, Q[b].row_block(r0, n));
            } else {
                const bool is_key = u < nq + nk;
                const std::size_t r0 = (is_key ? u - nq : u - nq - nk) * row_block, n = std::min(row_block, Lk - r0);
                if (is_key)
                    simd::gemm_packed(1.0f, in.key[b].row_block(r0, n), Trans::no, st.in_proj.segments(1, 1), 0.0f, bias + E, K[b].row_block(r0, n));
                else
                    simd::gemm_packed(1.0f, in.value[b].row_block(r0, n), Trans::no, st.in_proj.segments(2, 1), 0.0f, bias + 2 * E,
                                      V[b].row_block(r0, n));
            }
        }
    });
}

void AttentionPlan::pack_keys_values() const {
    const std::size_t d = head_dim, nj = (Lk + kPackBlock - 1) / kPackBlock, nr = simd::PanelMatrix::panel_width(panel_isa_);
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * H * nj), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t bh = t / nj, b = bh / H, h = bh % H;
            const std::size_t j0 = (t % nj) * kPackBlock, n = std::min(kPackBlock, Lk - j0);
            // Keys j0.. are columns of K_hᵀ (panels j0 / NR..) and rows of V_h (j0 rows into every panel).
            simd::pack_panels(panel_isa_, K[b].columns(h * d, d).row_block(j0, n), Trans::yes,
                              key_panels_ + bh * key_head_floats_ + j0 / nr * key_panel_stride_, key_panel_stride_);
            simd::pack_panels(panel_isa_, V[b].columns(h * d, d).row_block(j0, n), Trans::no,
                              value_panels_ + bh * value_head_floats_ + j0 * nr, value_panel_stride_);
        }
    });
}

void AttentionPlan::project_output(const MultiheadAttention::State& st, const AttentionInputs& in,
                                   const AttentionOutputs& out) const {
    const std::size_t nq = (Lq + row_block - 1) / row_block;
    const float* gamma = st.norm_w.empty() ? nullptr : st.norm_w.data();
    const float* beta = st.norm_b.empty() ? nullptr : st.norm_b.data();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nq), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / nq, r0 = (t % nq) * row_block, n = std::min(row_block, Lq - r0);
            const Matrix y = out.output[b].row_block(r0, n);
            simd::gemm_packed(1.0f, C[b].row_block(r0, n), Trans::no, st.out_proj, 0.0f, st.out_b.data(), y);
            if (!norm_eps_) continue;
            const ConstMatrix x = in.query[b].row_block(r0, n);
            for (std::size_t i = 0; i < n; ++i) simd::layernorm_row(y.row(i), y.row(i), x.row(i), E, gamma, beta, *norm_eps_);
        }
    });
}

}  // namespace mha::detail
