// The SIMD attention backend: multi-head attention from the xsimd kernels, parallel with oneTBB.
//   1. Projections: rows of query (and key, value) in fixed blocks, each one gemm_packed call with the
//      bias fused (self-attention: one GEMM against the packed [3E, E] weight into a [tokens, 3E] buffer).
//   2. Per (batch, head, block of query rows): S = Q_h·K_hᵀ/√d (heads are column views with stride
//      3E or E, no copies), masks and softmax row by row, then S·V_h written straight into the head's
//      columns of the context C.
//      With the fused path (long sequences, see fused_attention.cpp) the scores are never materialized.
//   3. Output projection per row block with the bias fused, then the optional post-norm on those rows.
// Work is cut into blocks whose sizes depend on the shape only, never on the thread count, and each
// output element is computed by one task, so results are bitwise identical for any thread count.
// Preconditions: inputs validated by MultiheadAttention::forward, key/value resolved.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "attention_plan.hpp"
#include "fused_attention.hpp"
#include "state.hpp"

namespace mha {
namespace {

using detail::AttentionPlan;

// One (batch, query block) task's heads: the scores of the block, softmax, context. With averaged
// weights the heads of a block run in one task so the sum over heads has a fixed order.
void attend_block(const AttentionPlan& p, std::size_t b, std::size_t h, std::size_t i0, std::size_t rows,
                  Matrix scores, const simd::GemmScratch& gemm_scratch) {
    const std::size_t d = p.head_dim;
    // Causal: keys past the block's last query are masked for every row of the block; skip them.
    const std::size_t keys = p.causal ? std::min(p.Lk, i0 + rows) : p.Lk;
    const std::size_t cols = p.need_weights == NeedWeights::none ? keys : p.Lk;
    const Matrix s = Matrix(scores.data, rows, cols, scores.stride);
    const ConstMatrix q = p.Q[b].columns(h * d, d).row_block(i0, rows);
    const ConstMatrix k = p.K[b].columns(h * d, d).row_block(0, keys);
    simd::gemm(p.scale, q, Trans::no, k, Trans::yes, 0.0f, s.columns(0, keys), gemm_scratch);
    for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t i = i0 + r;
        const std::size_t valid = p.causal ? std::min(p.Lk, i + 1) : p.Lk;
        simd::softmax_row(s.row(r), cols, valid, 1.0f, p.key_padding_row(b), p.attn_mask_row(b, h, i));
    }
    const ConstMatrix v = p.V[b].columns(h * d, d).row_block(0, keys);
    const Matrix c = p.C[b].columns(h * d, d).row_block(i0, rows);
    if (p.value_nonfinite(b, h)) {  // a masked key must not contribute 0·NaN
        for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t col = 0; col < d; ++col) c(r, col) = 0.0f;
        p.accumulate_unmasked(b, h, i0, 0, ConstMatrix(s.columns(0, keys)), c);
        return;
    }
    simd::gemm(1.0f, ConstMatrix(s.columns(0, keys)), Trans::no, v, Trans::no, 0.0f, c, gemm_scratch);
}

}  // namespace

namespace {

// The scratch of this call (simd_workspace_bytes and the call itself must agree).
detail::ScratchLayout layout_for(const MultiheadAttention::State& st, const AttentionInputs& in, const ForwardOptions& opt) {
    return detail::scratch_layout(st.E, st.H, in.query.batch, in.query.rows, in.key.rows, detail::is_self_attention(in),
                                  detail::use_fused(in, opt), opt.need_weights, detail::arena_threads(opt));
}

// A caller's workspace also needs room to align its start.
std::size_t workspace_bytes_for(const detail::ScratchLayout& layout) { return layout.bytes() + detail::kScratchAlign; }

}  // namespace

std::size_t simd_workspace_bytes(const MultiheadAttention::State& st, const AttentionInputs& in, const ForwardOptions& opt) {
    return workspace_bytes_for(layout_for(st, in, opt));
}

void simd_multihead_attention(const MultiheadAttention::State& st, const AttentionInputs& in,
                              const AttentionOutputs& out, const ForwardOptions& opt, Workspace* workspace) {
    const bool fused = detail::use_fused(in, opt);
    const detail::ScratchLayout layout = layout_for(st, in, opt);
    const std::size_t threads = layout.threads;
    // All memory is claimed here, before anything is computed: a failure leaves the outputs untouched.
    std::optional<detail::ScratchLease> lease;
    float* scratch = nullptr;
    if (workspace != nullptr) {
        const std::size_t need = workspace_bytes_for(layout);
        if (workspace->bytes() < need)
            detail::fail("workspace has " + std::to_string(workspace->bytes()) + " bytes but this call needs " +
                         std::to_string(need) + " (MultiheadAttention::workspace_bytes)");
        if (!workspace->try_acquire()) detail::fail("workspace is in use by another forward call");
        scratch = static_cast<float*>(detail::align_up(workspace->data()));
    } else {
        lease.emplace(layout.bytes());
        scratch = static_cast<float*>(lease->data());
    }
    struct Release {
        Workspace* w;
        ~Release() {
            if (w) w->release();
        }
    } release{workspace};
    AttentionPlan p(st, in, out, opt, fused, layout, scratch);
    const std::size_t B = p.B, H = p.H, Lq = p.Lq, Lk = p.Lk;

    auto run = [&] {
        p.project_inputs(st, in);
        p.check_values();
        if (fused) p.pack_keys_values();

        const std::size_t qb = p.query_block;
        const std::size_t nqb = (Lq + qb - 1) / qb;
        if (p.need_weights == NeedWeights::averaged) {
            tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
                for (std::size_t t = r.begin(); t != r.end(); ++t) {
                    const std::size_t b = t / nqb, i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
                    const AttentionPlan::ThreadScratch scratch = p.thread_scratch();
                    const Matrix s(scratch.scores, rows, Lk);
                    const Matrix w(out.attn_weights + (b * Lq + i0) * Lk, rows, Lk);
                    const float inv_h = 1.0f / static_cast<float>(H);
                    for (std::size_t h = 0; h < H; ++h) {
                        attend_block(p, b, h, i0, rows, s, scratch.gemm);
                        for (std::size_t i = 0; i < rows; ++i)
                            for (std::size_t j = 0; j < Lk; ++j) w(i, j) = (h == 0 ? 0.0f : w(i, j)) + s(i, j) * inv_h;
                    }
                }
            });
        } else {
            tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * H * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
                for (std::size_t t = r.begin(); t != r.end(); ++t) {
                    const std::size_t bh = t / nqb, b = bh / H, h = bh % H;
                    const std::size_t i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
                    if (fused) {
                        detail::fused_attend_block(p, b, h, i0, rows);
                    } else {
                        const AttentionPlan::ThreadScratch scratch = p.thread_scratch();
                        const Matrix s = p.need_weights == NeedWeights::per_head
                                             ? Matrix(out.attn_weights + (bh * Lq + i0) * Lk, rows, Lk)
                                             : Matrix(scratch.scores, rows, Lk);
                        attend_block(p, b, h, i0, rows, s, scratch.gemm);
                    }
                }
            });
        }

        p.project_output(st, in, out);
    };

    // isolate: while this thread waits for its tasks it runs only this call's tasks, not another
    // forward's (a caller running forward inside its own TBB loop), which would delay this one.
    auto isolated = [&] { tbb::this_task_arena::isolate(run); };
    if (threads != static_cast<std::size_t>(tbb::this_task_arena::max_concurrency())) {
        tbb::task_arena arena(static_cast<int>(threads));
        arena.execute(isolated);
    } else {
        isolated();
    }
}

}  // namespace mha
