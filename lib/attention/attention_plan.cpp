// AttentionPlan: buffers, masks and the two projection steps of the SIMD attention backend.
#include "attention_plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace mha::detail {
namespace {

constexpr std::size_t kAlign = 64;

// Rows of a projection task: large enough for the GEMM's row blocking, small enough to give every
// core work at B·L = 128 tokens.
constexpr std::size_t kRowBlock = 64;
// Query rows of an attention task. Materialized: 64 rows × Lk scores stay in L2. Fused: 128 rows
// halve how often each packed key/value tile is streamed from L2 per query row.
constexpr std::size_t kQueryBlock = 64;
constexpr std::size_t kFusedQueryBlock = 128;
// Keys per packing task of the fused path (a multiple of every ISA's panel width and of 16).
constexpr std::size_t kPackBlock = 256;

bool same_view(const ConstBatch& a, const ConstBatch& b) {
    return a.data == b.data && a.batch == b.batch && a.rows == b.rows && a.cols == b.cols &&
           a.row_stride == b.row_stride && a.batch_stride == b.batch_stride;
}

// A mask as additive floats: additive masks are used in place, boolean ones converted to 0 / -inf.
const float* additive(const MaskView& m, std::vector<float>& store) {
    if (m.type == MaskType::additive) return m.values;
    std::size_t n = 1;
    for (int i = 0; i < m.rank; ++i) n *= m.shape[i];
    store.resize(n);
    for (std::size_t i = 0; i < n; ++i) store[i] = m.bools[i] ? -std::numeric_limits<float>::infinity() : 0.0f;
    return store.data();
}

struct ScratchSlots {
    AlignedArray slot[Scratch::count];
};

}  // namespace

AlignedArray::AlignedArray(std::size_t n)
    : data_(static_cast<float*>(::operator new[](std::max<std::size_t>(n, 1) * sizeof(float), std::align_val_t(kAlign)))),
      size_(n) {}

void AlignedArray::Free::operator()(float* p) const noexcept { ::operator delete[](p, std::align_val_t(kAlign)); }

float* Scratch::get(std::size_t n, Slot slot) {
    thread_local ScratchSlots slots;
    AlignedArray& a = slots.slot[slot];
    if (a.size() < n) a = AlignedArray(n + n / 4);
    return a.data();
}

AttentionPlan::AttentionPlan(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs&,
                             const ForwardOptions& opt, bool fused)
    : E(st.E), H(st.H), head_dim(st.E / st.H), B(in.query.batch), Lq(in.query.rows), Lk(in.key.rows),
      scale(1.0f / std::sqrt(static_cast<float>(st.E / st.H))), causal(opt.causal), need_weights(opt.need_weights),
      query_block(fused ? kFusedQueryBlock : kQueryBlock), row_block(kRowBlock),
      self_attention(same_view(in.query, in.key) && same_view(in.key, in.value)), norm_eps_(opt.norm_eps) {
    if (self_attention) {
        float* qkv = Scratch::get(B * Lq * 3 * E, Scratch::projections);
        Q = Batch(qkv, B, Lq, E, 3 * E, Lq * 3 * E);
        K = Batch(qkv + E, B, Lq, E, 3 * E, Lq * 3 * E);
        V = Batch(qkv + 2 * E, B, Lq, E, 3 * E, Lq * 3 * E);
    } else {
        Q = Batch(Scratch::get(B * Lq * E, Scratch::projections), B, Lq, E);
        float* kv = Scratch::get(B * Lk * 2 * E, Scratch::key_values);
        K = Batch(kv, B, Lk, E, 2 * E, Lk * 2 * E);
        V = Batch(kv + E, B, Lk, E, 2 * E, Lk * 2 * E);
    }
    C = Batch(Scratch::get(B * Lq * E, Scratch::context), B, Lq, E);
    if (fused) {
        panel_isa_ = active_isa();
        key_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, head_dim);
        value_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, Lk);
        key_head_floats_ = simd::PanelMatrix::floats(panel_isa_, Lk, key_panel_stride_);
        value_head_floats_ = simd::PanelMatrix::floats(panel_isa_, head_dim, value_panel_stride_);
        key_panels_ = Scratch::get(B * H * key_head_floats_, Scratch::key_panels);
        value_panels_ = Scratch::get(B * H * value_head_floats_, Scratch::value_panels);
    }
    if (in.key_padding_mask.present()) key_padding_ = additive(in.key_padding_mask, key_padding_store_);
    if (in.attn_mask.present()) {
        attn_mask_ = additive(in.attn_mask, attn_mask_store_);
        attn_mask_rank_ = in.attn_mask.rank;
    }
}

void AttentionPlan::project_inputs(const MultiheadAttention::State& st, const AttentionInputs& in) const {
    const std::size_t nq = (Lq + row_block - 1) / row_block, nk = (Lk + row_block - 1) / row_block;
    const float* bias = st.in_b.data();
    if (self_attention) {
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nq), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t b = t / nq, r0 = (t % nq) * row_block, n = std::min(row_block, Lq - r0);
                const Matrix qkv(Q[b].data + r0 * 3 * E, n, 3 * E, 3 * E);
                simd::gemm_packed(1.0f, in.query[b].row_block(r0, n), Trans::no, st.wqkv, 0.0f, bias, qkv);
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
                simd::gemm_packed(1.0f, in.query[b].row_block(r0, n), Trans::no, st.wq, 0.0f, bias, Q[b].row_block(r0, n));
            } else {
                const bool is_key = u < nq + nk;
                const std::size_t r0 = (is_key ? u - nq : u - nq - nk) * row_block, n = std::min(row_block, Lk - r0);
                if (is_key)
                    simd::gemm_packed(1.0f, in.key[b].row_block(r0, n), Trans::no, st.wk, 0.0f, bias + E, K[b].row_block(r0, n));
                else
                    simd::gemm_packed(1.0f, in.value[b].row_block(r0, n), Trans::no, st.wv, 0.0f, bias + 2 * E,
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
            simd::gemm_packed(1.0f, C[b].row_block(r0, n), Trans::no, st.wo, 0.0f, st.out_b.data(), y);
            if (!norm_eps_) continue;
            const ConstMatrix x = in.query[b].row_block(r0, n);
            for (std::size_t i = 0; i < n; ++i) simd::layernorm_row(y.row(i), y.row(i), x.row(i), E, gamma, beta, *norm_eps_);
        }
    });
}

}  // namespace mha::detail
