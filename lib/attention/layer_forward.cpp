// LayerForward: the SIMD MultiheadAttention forward: projections (bias fused, RoPE in the same task), the
// attention core on head views of the projections, the output projection and the optional post-norm.
#include "layer_forward.hpp"

#include <algorithm>
#include <cmath>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "../core/validate.hpp"
#include "kv_cache_access.hpp"
#include "../simd/round_bf16.hpp"
#include "rope.hpp"

namespace mha::detail {
namespace {

// Rows of a projection task: large enough for the GEMM's row blocking, small enough to give every
// core work at B·L = 128 tokens.
constexpr std::size_t kRowBlock = 64;

// Columns per task of the few-token projections (a multiple of every ISA's panel width).
constexpr std::size_t kColumnBlock = 256;

}  // namespace

std::size_t arena_threads(int threads) {
    if (threads <= 0) return static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
    // More threads than TBB may run at once (global_control, by default the core count) would only
    // leave arena slots empty.
    const auto allowed = tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
    return std::min(static_cast<std::size_t>(threads), allowed);
}

SlotLayout place_slots(Carver& call, const Carver& slot, int threads) {
    SlotLayout l;
    l.slot_floats = slot.total;
    l.threads = arena_threads(threads);
    l.slots = call.take(scratch_mul(l.threads, l.slot_floats));
    l.total_floats = call.total;
    return l;
}

bool few_tokens(const LayerCall& call) noexcept { return call.self_attention && call.B * call.Lq <= kFewTokens; }

LayerCall packed_call(const LayerState& st, std::size_t T, int threads) {
    LayerCall c;
    c.in.query = ConstBatch(nullptr, 1, T, st.E, st.E + 1, T * (st.E + 1));
    c.in.key = c.in.value = c.in.query;
    c.out.output = Batch(nullptr, 1, T, st.E, st.E, T * st.E);
    c.opt.norm_eps = st.norm_eps;
    c.opt.threads = threads;
    c.B = 1, c.Lq = T, c.Lk = T, c.core_keys = T;
    c.self_attention = true;
    c.compute = st.compute;
    c.path = AttentionPath::decode;  // a SIMD path; the core is the caller's
    c.core_path = CorePath::decode;
    return c;
}

void bind_packed(LayerCall& c, const ConstMatrix& x, const Matrix& y) {
    c.in.query = ConstBatch(x.data, 1, x.rows, x.cols, x.stride, x.rows * x.stride);
    c.in.key = c.in.value = c.in.query;
    c.out.output = Batch(y.data, 1, y.rows, y.cols, y.stride, y.rows * y.stride);
}

ScratchLayout scratch_layout(const detail::LayerState& st, const LayerCall& call, CoreCarving core_regions, void* context) {
    ScratchLayout l;
    Carver c, slot;
    const AttentionInputs& in = call.in;
    const KVCache* cache = call.cache;
    const std::size_t B = call.B, Lq = call.Lq, Lk = call.Lk;
    const bool contiguous = in.query.row_stride == in.query.cols && in.query.batch_stride == Lq * in.query.cols;
    if (few_tokens(call) && !contiguous) l.tokens = c.take(scratch_mul(scratch_mul(B, Lq), st.E));
    const std::size_t qw = st.q_width(), kvw = st.kv_width();
    if (few_tokens(call) && st.compute == DataType::bf16 && has_bf16_kernels(detected_isa()))
        l.tokens16 = c.take(simd::gemm_bf16_packed_a_elements(scratch_mul(B, Lq), std::max(st.E, qw)) / 2 + 1);
    if (call.self_attention) {
        l.projections = c.take(scratch_mul(scratch_mul(B, Lq), qw + 2 * kvw));
    } else {
        l.projections = c.take(scratch_mul(scratch_mul(B, Lq), qw));
        l.key_values = c.take(scratch_mul(scratch_mul(B, Lk), 2 * kvw));
    }
    l.context = c.take(scratch_mul(scratch_mul(B, Lq), qw));
    l.cache_keys = call.core_keys;
    if (cache != nullptr) l.key_lengths = c.take(scratch_mul(B, sizeof(std::size_t) / sizeof(float)));
    const CorePath path = call.core_path;
    // A cache whose rows are not fp32 heads: decode reads them in place, grouped widens them as it packs, the
    // materialized path reads a widened copy.
    const bool cache_rows = cache != nullptr && !KVCacheAccess::keys(*cache).is_f32_heads();
    const DataType kv = cache != nullptr ? KVCacheAccess::keys(*cache).format->type : DataType::f32;
    const CoreShape shape{B, st.H, st.Hkv, st.d, Lq, l.cache_keys, st.compute, kv, cache_rows && path == CorePath::grouped};
    if (cache_rows && path == CorePath::materialized) {
        const std::size_t floats = scratch_mul(scratch_mul(scratch_mul(B, st.Hkv), l.cache_keys), st.d);
        l.widen_cache = true;
        l.widened_keys = c.take(floats);
        l.widened_values = c.take(floats);
    }
    if (core_regions != nullptr)
        core_regions(context, c, slot);
    else
        l.core = core_layout(shape, path, call.opt.need_weights, c, slot);
    l.rope_table = slot.take(st.rope ? scratch_mul(kRowBlock, st.rope->dims) : 0);
    if (st.compute == DataType::bf16) {
        const std::size_t k = std::max({st.E, st.kdim, st.vdim, qw});
        l.linear16 = slot.take(std::max(scratch_mul(kRowBlock, k), simd::gemm_bf16_scratch(kRowBlock, k) / 2 + 1));
    }
    static_cast<SlotLayout&>(l) = place_slots(c, slot, call.opt.threads);
    return l;
}

LayerForward::LayerForward(const detail::LayerState& st, const LayerCall& call, const ScratchLayout& layout, float* scratch,
                           KVCache* cache, const std::size_t* row_positions)
    : st_(st), call_(call), in_(call.in), out_(call.out), opt_(call.opt), layout_(layout), B_(call.B), Lq_(call.Lq), Lk_(call.Lk),
      self_attention_(call.self_attention),
      query_shift_(cache == nullptr && opt_.causal_alignment == CausalAlignment::bottom_right ? Lk_ - Lq_ : 0),
      scratch_(scratch), cache_(cache), few_tokens_(few_tokens(call)),
      operands_(gemm_operands(st.compute, st.has_bf16_weights() && simd::bf16_kernels_available())),
      row_positions_(row_positions) {
    if (cache != nullptr) cache_keys_ = KVCacheAccess::keys(*cache), cache_values_ = KVCacheAccess::values(*cache);
    const std::size_t qw = st.q_width(), kvw = st.kv_width();
    if (self_attention_) {
        const std::size_t w = qw + 2 * kvw;
        float* qkv = scratch + layout.projections;
        Q_ = Batch(qkv, B_, Lq_, qw, w, Lq_ * w);
        K_ = Batch(qkv + qw, B_, Lq_, kvw, w, Lq_ * w);
        V_ = Batch(qkv + qw + kvw, B_, Lq_, kvw, w, Lq_ * w);
    } else {
        Q_ = Batch(scratch + layout.projections, B_, Lq_, qw);
        float* kv = scratch + layout.key_values;
        K_ = Batch(kv, B_, Lk_, kvw, 2 * kvw, Lk_ * 2 * kvw);
        V_ = Batch(kv + kvw, B_, Lk_, kvw, 2 * kvw, Lk_ * 2 * kvw);
    }
    C_ = Batch(scratch + layout.context, B_, Lq_, qw);
}

bool LayerForward::qkv_contiguous() const noexcept {
    if (!on_bf16_kernels(operands_)) return st_.in_proj.segments_contiguous();
    return st_.q_width() % simd::kBf16PanelWidth == 0 && st_.kv_width() % simd::kBf16PanelWidth == 0;
}

void LayerForward::round_projection(Matrix x) const noexcept {
    if (rounds_to_bf16(operands_)) simd::round_to_bf16_inplace(x);
}

void LayerForward::linear(ConstMatrix x, Weight w, std::size_t c0, std::size_t nc, const float* bias, Matrix y) const {
    float* slot = thread_slot(scratch_ + layout_.slots, layout_.slot_floats, layout_.threads) + layout_.linear16;
    if (on_bf16_kernels(operands_)) {
        const simd::Bf16Panels all = w == kQkv ? st_.in_proj16.all() : w == kOut ? st_.out_proj16.all() : st_.projection16(w);
        simd::gemm_bf16(1.0f, x, all.columns(c0, nc), 0.0f, bias, y, reinterpret_cast<std::uint16_t*>(slot));
        return;
    }
    if (rounds_to_bf16(operands_)) {  // the weights are rounded already; round this block of A into the slot
        const Matrix copy(slot, x.rows, x.cols, x.cols);
        for (std::size_t r = 0; r < x.rows; ++r) std::copy(x.row(r), x.row(r) + x.cols, copy.row(r));
        simd::round_to_bf16_inplace(copy);
        x = copy;
    }
    const simd::PackedMatrix::View all = w == kQkv ? st_.in_proj.all() : w == kOut ? st_.out_proj.all() : st_.projection(w);
    simd::gemm_packed(1.0f, x, Trans::no, simd::PackedMatrix::columns(all, c0, nc), 0.0f, bias, y);
}

bool LayerForward::pack_tokens(ConstMatrix x) const {
    if (layout_.tokens16 == 0 || !on_bf16_kernels(operands_)) return false;
    simd::pack_a_bf16(x, reinterpret_cast<std::uint16_t*>(scratch_ + layout_.tokens16));
    return true;
}

void LayerForward::linear_packed(std::size_t rows, std::size_t k, Weight w, std::size_t c0, std::size_t nc, const float* bias,
                                 Matrix y) const {
    const simd::Bf16Panels all = w == kQkv ? st_.in_proj16.all() : w == kOut ? st_.out_proj16.all() : st_.projection16(w);
    simd::gemm_bf16_packed_a(1.0f, reinterpret_cast<const std::uint16_t*>(scratch_ + layout_.tokens16), rows, k,
                             all.columns(c0, nc), 0.0f, bias, y);
}

void LayerForward::rotate(Matrix x, std::size_t heads, std::size_t p0, float* table) const {
    const std::size_t r = st_.rope->dims, half = r / 2, d = st_.d;
    float* cos_t = table;
    float* sin_t = table + kRowBlock * half;
    rope_table(st_.rope_freq.data(), half, p0, x.rows, cos_t, sin_t);
    for (std::size_t h = 0; h < heads; ++h) rope_rows(x.columns(h * d, d), r, st_.rope->style, cos_t, sin_t);
}

void LayerForward::rotate_query_rows(Matrix x, std::size_t heads, std::size_t b, std::size_t r0, float* table) const {
    if (row_positions_ == nullptr) return rotate(x, heads, start_position(b) + r0, table);
    for (std::size_t i = 0; i < x.rows;) {
        std::size_t n = 1;
        while (i + n < x.rows && row_positions_[r0 + i + n] == row_positions_[r0 + i] + n) ++n;
        rotate(x.row_block(i, n), heads, row_positions_[r0 + i], table);
        i += n;
    }
}

void LayerForward::project_few_tokens() const {
    const std::size_t qw = st_.q_width(), kvw = st_.kv_width(), w = qw + 2 * kvw, E = st_.E, n = B_ * Lq_;
    ConstMatrix x(in_.query.data, n, E, E);  // [B·Lq, E]: the query itself when contiguous, else gathered
    if (layout_.tokens != 0 || in_.query.row_stride != E || in_.query.batch_stride != Lq_ * E) {
        float* tokens = scratch_ + layout_.tokens;
        for (std::size_t b = 0; b < B_; ++b)
            for (std::size_t i = 0; i < Lq_; ++i) std::copy(in_.query[b].row(i), in_.query[b].row(i) + E, tokens + (b * Lq_ + i) * E);
        x = ConstMatrix(tokens, n, E, E);
    }
    const Matrix qkv(Q_.data, n, w, w);  // the projections [B, Lq, W] are contiguous
    // Column blocks of each segment (Wq, Wk, Wv), so blocks never straddle segment padding.
    const std::size_t widths[3] = {qw, kvw, kvw}, offsets[3] = {0, qw, qw + kvw};
    std::size_t blocks[3], total = 0;
    for (int part = 0; part < 3; ++part) total += blocks[part] = (widths[part] + kColumnBlock - 1) / kColumnBlock;
    const bool packed = pack_tokens(x);  // A packed once for every column task (the same bits)
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, total), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            std::size_t part = 0, blk = t;
            while (blk >= blocks[part]) blk -= blocks[part++];
            const std::size_t c0 = blk * kColumnBlock, nc = std::min(kColumnBlock, widths[part] - c0);
            if (packed)
                linear_packed(n, E, static_cast<Weight>(part), c0, nc, st_.bias(part) + c0, qkv.columns(offsets[part] + c0, nc));
            else
                linear(x, static_cast<Weight>(part), c0, nc, st_.bias(part) + c0, qkv.columns(offsets[part] + c0, nc));
        }
    });
    if (!st_.rope) return round_projection(qkv);
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t b = r.begin(); b != r.end(); ++b) {
            float* tab = thread_slot(scratch_ + layout_.slots, layout_.slot_floats, layout_.threads) + layout_.rope_table;
            const Matrix rows = qkv.row_block(b * Lq_, Lq_);
            // The Q heads and then the K heads: H + Hkv consecutive d-wide heads at the same positions.
            rotate_query_rows(rows.columns(0, qw + kvw), st_.H + st_.Hkv, b, 0, tab);  // Lq <= kFewTokens = kRowBlock
            round_projection(rows);
        }
    });
}

void LayerForward::append_to_cache() const {
    const std::size_t d = st_.d, Hkv = st_.Hkv;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * Hkv), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / Hkv, h = t % Hkv, n = cache_->lengths()[b];
            const ConstMatrix k = K_[b].columns(h * d, d), v = V_[b].columns(h * d, d);
            for (std::size_t i = 0; i < Lq_; ++i) {
                cache_keys_.write_row(b, h, n + i, k.row(i));
                cache_values_.write_row(b, h, n + i, v.row(i));
            }
        }
    });
}

void LayerForward::widen_cache(const std::size_t* key_lengths) const {
    const std::size_t d = st_.d, Hkv = st_.Hkv, L = layout_.cache_keys;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * Hkv), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / Hkv, h = t % Hkv, n = key_lengths[b];
            cache_keys_.widen(b, h, 0, n, Matrix(scratch_ + layout_.widened_keys + t * L * d, n, d));
            cache_values_.widen(b, h, 0, n, Matrix(scratch_ + layout_.widened_values + t * L * d, n, d));
        }
    });
}

void LayerForward::project_inputs() const {
    if (few_tokens_) {
        project_few_tokens();
        return;
    }
    const std::size_t nq = (Lq_ + kRowBlock - 1) / kRowBlock, nk = (Lk_ + kRowBlock - 1) / kRowBlock;
    const std::size_t qw = st_.q_width(), kvw = st_.kv_width(), H = st_.H, Hkv = st_.Hkv;
    const bool rope = st_.rope.has_value();
    auto table = [&] { return thread_slot(scratch_ + layout_.slots, layout_.slot_floats, layout_.threads) + layout_.rope_table; };
    if (self_attention_) {
        const std::size_t w = qw + 2 * kvw;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * nq), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t b = t / nq, r0 = (t % nq) * kRowBlock, n = std::min(kRowBlock, Lq_ - r0);
                const Matrix qkv(Q_[b].data + r0 * w, n, w, w);
                const ConstMatrix x = in_.query[b].row_block(r0, n);
                if (qkv_contiguous()) {
                    linear(x, kQkv, 0, w, st_.bias(0), qkv);
                } else {  // a segment is not a multiple of the panel width: Wq, Wk, Wv are padded apart
                    linear(x, kQ, 0, qw, st_.bias(0), qkv.columns(0, qw));
                    linear(x, kK, 0, kvw, st_.bias(1), qkv.columns(qw, kvw));
                    linear(x, kV, 0, kvw, st_.bias(2), qkv.columns(qw + kvw, kvw));
                }
                // Q and K heads are H + Hkv consecutive d-wide heads at the same positions (Lq == Lk): one table.
                if (rope) rotate_query_rows(qkv.columns(0, qw + kvw), H + Hkv, b, r0, table());
                round_projection(qkv);
            }
        });
        return;
    }
    // Cross-attention: Q from query, K and V from key and value, all tasks in one loop.
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * (nq + 2 * nk)), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / (nq + 2 * nk), u = t % (nq + 2 * nk);
            if (u < nq) {
                const std::size_t r0 = u * kRowBlock, n = std::min(kRowBlock, Lq_ - r0);
                const Matrix q = Q_[b].row_block(r0, n);
                linear(in_.query[b].row_block(r0, n), kQ, 0, qw, st_.bias(0), q);
                if (rope) rotate(q, H, query_start(b) + r0, table());
                round_projection(q);
                continue;
            }
            const bool is_key = u < nq + nk;
            const std::size_t r0 = (is_key ? u - nq : u - nq - nk) * kRowBlock, n = std::min(kRowBlock, Lk_ - r0);
            if (is_key) {
                const Matrix k = K_[b].row_block(r0, n);
                linear(in_.key[b].row_block(r0, n), kK, 0, kvw, st_.bias(1), k);
                if (rope) rotate(k, Hkv, start_position(b) + r0, table());
                round_projection(k);
            } else {
                const Matrix v = V_[b].row_block(r0, n);
                linear(in_.value[b].row_block(r0, n), kV, 0, kvw, st_.bias(2), v);
                round_projection(v);
            }
        }
    });
}

void LayerForward::project_output() const {
    const std::size_t nq = (Lq_ + kRowBlock - 1) / kRowBlock, E = st_.E;
    const float* gamma = st_.norm_w.empty() ? nullptr : st_.norm_w.data();
    const float* beta = st_.norm_b.empty() ? nullptr : st_.norm_b.data();
    if (few_tokens_) {  // columns of Wo across tasks (each weight read once), then the norm per row
        const std::size_t nblocks = (E + kColumnBlock - 1) / kColumnBlock, n = B_ * Lq_;
        // The B·Lq rows as one GEMM when the output's batches are evenly spaced rows (the context's are): a
        // decode batch (Lq = 1) then runs the many-row microkernel, not B one-row calls. Same bits either way:
        // a row's result does not depend on the rows beside it.
        const Batch& o = out_.output;
        const bool one_matrix = o.batch_stride == Lq_ * o.row_stride && C_.batch_stride == Lq_ * C_.row_stride;
        const bool packed = one_matrix && pack_tokens(ConstMatrix(C_.data, n, C_.cols, C_.row_stride));
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nblocks), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t c0 = t * kColumnBlock, nc = std::min(kColumnBlock, E - c0);
                if (packed) {
                    linear_packed(n, C_.cols, kOut, c0, nc, st_.out_b.data() + c0, Matrix(o.data, n, E, o.row_stride).columns(c0, nc));
                    continue;
                }
                if (one_matrix) {
                    linear(ConstMatrix(C_.data, n, C_.cols, C_.row_stride), kOut, c0, nc, st_.out_b.data() + c0,
                           Matrix(o.data, n, E, o.row_stride).columns(c0, nc));
                    continue;
                }
                for (std::size_t b = 0; b < B_; ++b)
                    linear(C_[b], kOut, c0, nc, st_.out_b.data() + c0, o[b].columns(c0, nc));
            }
        });
        if (!opt_.norm_eps) return;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t b = r.begin(); b != r.end(); ++b)
                for (std::size_t i = 0; i < Lq_; ++i) {
                    float* y = out_.output[b].row(i);
                    simd::layernorm_row(y, y, in_.query[b].row(i), E, gamma, beta, *opt_.norm_eps);
                }
        });
        return;
    }
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * nq), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t b = t / nq, r0 = (t % nq) * kRowBlock, n = std::min(kRowBlock, Lq_ - r0);
            const Matrix y = out_.output[b].row_block(r0, n);
            linear(C_[b].row_block(r0, n), kOut, 0, E, st_.out_b.data(), y);
            if (!opt_.norm_eps) continue;
            const ConstMatrix x = in_.query[b].row_block(r0, n);
            for (std::size_t i = 0; i < n; ++i) simd::layernorm_row(y.row(i), y.row(i), x.row(i), E, gamma, beta, *opt_.norm_eps);
        }
    });
}

void LayerForward::run() const {
    project_inputs();
    const std::size_t d = st_.d, H = st_.H, Hkv = st_.Hkv;
    std::size_t* key_lengths = nullptr;
    if (cache_ != nullptr) {
        append_to_cache();
        key_lengths = reinterpret_cast<std::size_t*>(scratch_ + layout_.key_lengths);
        for (std::size_t b = 0; b < B_; ++b) key_lengths[b] = cache_->lengths()[b] + Lq_;
    }
    // Heads as views of the projections: head h of batch b is columns [h·d, h·d + d) of its rows.
    auto heads = [d](const Batch& x, std::size_t count) {
        return Heads(x.data, x.batch, count, x.rows, d, x.batch_stride, d, x.row_stride);
    };
    CoreProblem p;
    p.q = heads(Q_, H);
    if (cache_ != nullptr && layout_.widen_cache) {  // fp32 copies [B, Hkv, cache_keys, d] of the rows (materialized)
        widen_cache(key_lengths);
        const std::size_t L = layout_.cache_keys;
        p.k = Heads(scratch_ + layout_.widened_keys, B_, Hkv, L, d, Hkv * L * d, L * d, d);
        p.v = Heads(scratch_ + layout_.widened_values, B_, Hkv, L, d, Hkv * L * d, L * d, d);
        p.key_lengths = key_lengths;
    } else if (cache_ != nullptr) {  // the cache's rows in place (decode: any element type; else f32 heads)
        const std::size_t L = layout_.cache_keys;
        p.key_rows = cache_keys_;
        p.value_rows = cache_values_;
        // Decode and grouped read key_rows / value_rows (k / v give the geometry only); f32 heads are also read as such.
        p.k = cache_keys_.is_f32_heads() ? cache_keys_.f32_heads(B_, Hkv, L) : ConstHeads(nullptr, B_, Hkv, L, d, 0, 0, d);
        p.v = cache_values_.is_f32_heads() ? cache_values_.f32_heads(B_, Hkv, L) : ConstHeads(nullptr, B_, Hkv, L, d, 0, 0, d);
        p.key_lengths = key_lengths;
    } else {
        p.k = heads(K_, Hkv);
        p.v = heads(V_, Hkv);
    }
    p.out = heads(C_, H);
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.causal = opt_.causal;
    p.query_shift = opt_.causal_alignment == CausalAlignment::bottom_right
                         ? static_cast<std::ptrdiff_t>(Lk_) - static_cast<std::ptrdiff_t>(Lq_)
                         : 0;
    p.key_padding_mask = in_.key_padding_mask;
    p.attn_mask = in_.attn_mask;
    p.need_weights = opt_.need_weights;
    p.attn_weights = out_.attn_weights;
    p.compute = st_.compute;
    p.mods = st_.modifiers();
    const AttentionCore core(p, call_.core_path, layout_.core, scratch_, scratch_ + layout_.slots,
                             layout_.slot_floats, layout_.threads);
    core.run();
    project_output();
    if (cache_ != nullptr)
        for (std::size_t b = 0; b < B_; ++b) KVCacheAccess::set_length(*cache_, b, key_lengths[b]);
}

}  // namespace mha::detail
