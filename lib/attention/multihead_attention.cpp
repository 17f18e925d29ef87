// MultiheadAttention: owns the weights, validates every forward argument at the public API, then
// runs the scalar reference or the SIMD backend. Nothing is written before validation passes.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "../core/validate.hpp"
#include "checks.hpp"
#include "../reference/reference.hpp"
#include "../simd/round_bf16.hpp"
#include "mha/attention.hpp"
#include "mha/kv_cache.hpp"
#include "rope.hpp"
#include "state.hpp"

namespace mha {

using detail::checked_extent;
using detail::checked_madd;
using detail::check_masks;
using detail::fail;
using detail::mask_overlaps;

namespace {

// The enum values and scalar options of a call.
void check_options(const ForwardOptions& opt) {
    if (static_cast<unsigned>(opt.need_weights) > static_cast<unsigned>(NeedWeights::per_head))
        fail("need_weights " + std::to_string(static_cast<int>(opt.need_weights)) + " is not none, averaged or per_head");
    detail::check_common_options(opt.impl, opt.backend, opt.threads);
    detail::check_causal_alignment(opt.causal_alignment);
    if (opt.norm_eps && (!std::isfinite(*opt.norm_eps) || *opt.norm_eps < 0.0f))
        fail("norm_eps " + std::to_string(*opt.norm_eps) + " is not a finite value >= 0");
}

}  // namespace

MultiheadAttention::MultiheadAttention(const AttentionWeights& w, std::size_t E, std::size_t H)
    : MultiheadAttention(w, [&] {
          if (E != 0 && H != 0 && E % H != 0)
              fail("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H));
          if (w.in_proj_weight == nullptr) fail("in_proj_weight is a null pointer");
          AttentionConfig c;
          c.embed_dim = E;
          c.num_heads = H;
          return c;
      }()) {}

MultiheadAttention::MultiheadAttention(const AttentionWeights& w, const AttentionConfig& cfg) {
    const std::size_t E = cfg.embed_dim, H = cfg.num_heads;
    if (E == 0) fail("embed_dim is 0");
    if (H == 0) fail("num_heads is 0");
    const std::size_t Hkv = cfg.num_kv_heads != 0 ? cfg.num_kv_heads : H;
    if (H % Hkv != 0)
        fail("num_heads " + std::to_string(H) + " is not a multiple of num_kv_heads " + std::to_string(Hkv));
    if (cfg.head_dim == 0 && E % H != 0)
        fail("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H) +
             " (set head_dim to choose the head dim)");
    if (cfg.compute == DataType::f16)
        fail("compute type f16 is not supported (f32 or bf16; f16 is a KV cache element type)");
    const std::size_t d = cfg.head_dim != 0 ? cfg.head_dim : E / H;
    const std::size_t kdim = cfg.kdim != 0 ? cfg.kdim : E, vdim = cfg.vdim != 0 ? cfg.vdim : E;
    const std::size_t qw = checked_madd(H, d, 0, "num_heads × head_dim", "size");
    const std::size_t kvw = checked_madd(Hkv, d, 0, "num_kv_heads × head_dim", "size");
    const std::size_t in_rows = checked_madd(2, kvw, qw, "the input projections'", "rows");
    for (const auto& [name, rows, cols] : {std::tuple<const char*, std::size_t, std::size_t>{"q_proj_weight", qw, E},
                                           {"k_proj_weight", kvw, kdim}, {"v_proj_weight", kvw, vdim},
                                           {"out_proj_weight", E, qw}, {"in_proj_weight", in_rows, E}})
        checked_extent(name, static_cast<const float*>(nullptr), checked_madd(rows, cols, 0, name, "size"));

    std::optional<RopeConfig> rope = cfg.rope;
    if (rope) {
        if (!std::isfinite(rope->theta) || rope->theta <= 0.0f)
            fail("rope theta " + std::to_string(rope->theta) + " is not a finite value > 0");
        if (rope->dims == 0) rope->dims = d;
        if (rope->dims % 2 != 0 || rope->dims > d)
            fail("rope dims " + std::to_string(rope->dims) + " must be even and at most head_dim " + std::to_string(d));
        if (static_cast<unsigned>(rope->style) > static_cast<unsigned>(RopeStyle::interleaved))
            fail("rope style " + std::to_string(static_cast<int>(rope->style)) + " is not half or interleaved");
    }

    const bool packed = w.in_proj_weight != nullptr;
    const bool separate = w.q_proj_weight != nullptr || w.k_proj_weight != nullptr || w.v_proj_weight != nullptr;
    if (packed && separate) fail("both in_proj_weight and q/k/v_proj_weight are given; give one kind");
    if (!packed && !separate) fail("in_proj_weight is a null pointer and no q/k/v_proj_weight is given");
    if (separate) {
        if (w.q_proj_weight == nullptr) fail("q_proj_weight is a null pointer (k/v_proj_weight are given)");
        if (w.k_proj_weight == nullptr) fail("k_proj_weight is a null pointer (q_proj_weight is given)");
        if (w.v_proj_weight == nullptr) fail("v_proj_weight is a null pointer (q_proj_weight is given)");
    }
    if (packed && (kdim != E || vdim != E))
        fail("in_proj_weight needs kdim == vdim == embed_dim (" + std::to_string(E) + "), but kdim is " +
             std::to_string(kdim) + " and vdim " + std::to_string(vdim) + "; give q/k/v_proj_weight");
    if (w.in_proj_bias != nullptr && (w.q_proj_bias != nullptr || w.k_proj_bias != nullptr || w.v_proj_bias != nullptr))
        fail("both in_proj_bias and q/k/v_proj_bias are given; give one kind");
    if (w.out_proj_weight == nullptr) fail("out_proj_weight is a null pointer");

    auto s = std::make_unique<State>();
    s->E = E, s->H = H, s->Hkv = Hkv, s->d = d, s->kdim = kdim, s->vdim = vdim, s->rope = rope;
    s->compute = cfg.compute;
    if (rope) s->rope_freq = detail::rope_frequencies(rope->theta, rope->dims);
    s->in_b.assign(in_rows, 0.0f);
    if (w.in_proj_bias) std::copy(w.in_proj_bias, w.in_proj_bias + in_rows, s->in_b.begin());
    if (w.q_proj_bias) std::copy(w.q_proj_bias, w.q_proj_bias + qw, s->in_b.begin());
    if (w.k_proj_bias) std::copy(w.k_proj_bias, w.k_proj_bias + kvw, s->in_b.begin() + qw);
    if (w.v_proj_bias) std::copy(w.v_proj_bias, w.v_proj_bias + kvw, s->in_b.begin() + qw + kvw);
    s->out_b = w.out_proj_bias ? std::vector<float>(w.out_proj_bias, w.out_proj_bias + E) : std::vector<float>(E, 0.0f);
    if (w.norm_weight) s->norm_w.assign(w.norm_weight, w.norm_weight + E);
    if (w.norm_bias) s->norm_b.assign(w.norm_bias, w.norm_bias + E);
    // One packed copy of each weight, straight from the caller's memory (bf16 compute: of the rounded weights,
    // plus the bf16 panels when the CPU has AVX512_BF16; the fp32 copy serves a lower ISA cap and the scalar
    // backend).
    const float* wq = packed ? w.in_proj_weight : w.q_proj_weight;
    const float* wk = packed ? w.in_proj_weight + qw * E : w.k_proj_weight;
    const float* wv = packed ? w.in_proj_weight + (qw + kvw) * E : w.v_proj_weight;
    const float* wo = w.out_proj_weight;
    s->qkv_packed = kdim == E && vdim == E;
    std::vector<float> rounded[4];
    if (cfg.compute == DataType::bf16) {
        const float* src[4] = {wq, wk, wv, wo};
        const std::size_t size[4] = {qw * E, kvw * kdim, kvw * vdim, E * qw};
        for (int i = 0; i < 4; ++i) {
            rounded[i].assign(src[i], src[i] + size[i]);
            simd::round_to_bf16_inplace(rounded[i].data(), size[i]);
        }
        if (simd::bf16_kernels_available()) {
            if (s->qkv_packed) {
                s->in_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wq, qw, E), ConstMatrix(wk, kvw, E), ConstMatrix(wv, kvw, E)}, Trans::yes);
            } else {
                s->q_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wq, qw, E)}, Trans::yes);
                s->k_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wk, kvw, kdim)}, Trans::yes);
                s->v_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wv, kvw, vdim)}, Trans::yes);
            }
            s->out_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wo, E, qw)}, Trans::yes);
        }
        wq = rounded[0].data(), wk = rounded[1].data(), wv = rounded[2].data(), wo = rounded[3].data();
    }
    if (s->qkv_packed) {  // Wq, Wk, Wv as segments of one matrix: self-attention runs one GEMM
        s->in_proj = simd::PackedMatrix({ConstMatrix(wq, qw, E), ConstMatrix(wk, kvw, E), ConstMatrix(wv, kvw, E)}, Trans::yes);
    } else {
        s->q_proj = simd::PackedMatrix(ConstMatrix(wq, qw, E), Trans::yes);
        s->k_proj = simd::PackedMatrix(ConstMatrix(wk, kvw, kdim), Trans::yes);
        s->v_proj = simd::PackedMatrix(ConstMatrix(wv, kvw, vdim), Trans::yes);
    }
    s->out_proj = simd::PackedMatrix(ConstMatrix(wo, E, qw), Trans::yes);
    state_ = std::move(s);
}

MultiheadAttention::State::Unpacked MultiheadAttention::State::unpacked() const {
    Unpacked u{std::vector<float>(q_width() * E), std::vector<float>(kv_width() * kdim), std::vector<float>(kv_width() * vdim),
               std::vector<float>(E * q_width())};
    if (qkv_packed) {
        std::vector<float> all((q_width() + 2 * kv_width()) * E);
        in_proj.unpack(Matrix(all.data(), q_width() + 2 * kv_width(), E), Trans::yes);
        const auto wk = all.begin() + static_cast<std::ptrdiff_t>(q_width() * E);
        const auto wv = wk + static_cast<std::ptrdiff_t>(kv_width() * E);
        std::copy(all.begin(), wk, u.wq.begin());
        std::copy(wk, wv, u.wk.begin());
        std::copy(wv, all.end(), u.wv.begin());
    } else {
        q_proj.unpack(Matrix(u.wq.data(), q_width(), E), Trans::yes);
        k_proj.unpack(Matrix(u.wk.data(), kv_width(), kdim), Trans::yes);
        v_proj.unpack(Matrix(u.wv.data(), kv_width(), vdim), Trans::yes);
    }
    out_proj.unpack(Matrix(u.wo.data(), E, q_width()), Trans::yes);
    return u;
}

MultiheadAttention::~MultiheadAttention() = default;
MultiheadAttention::MultiheadAttention(MultiheadAttention&&) noexcept = default;
MultiheadAttention& MultiheadAttention::operator=(MultiheadAttention&&) noexcept = default;

std::size_t MultiheadAttention::embed_dim() const noexcept { return state_ ? state_->E : 0; }
std::size_t MultiheadAttention::num_heads() const noexcept { return state_ ? state_->H : 0; }
std::size_t MultiheadAttention::head_dim() const noexcept { return state_ ? state_->d : 0; }
std::size_t MultiheadAttention::num_kv_heads() const noexcept { return state_ ? state_->Hkv : 0; }
std::size_t MultiheadAttention::kdim() const noexcept { return state_ ? state_->kdim : 0; }
std::size_t MultiheadAttention::vdim() const noexcept { return state_ ? state_->vdim : 0; }

std::size_t MultiheadAttention::weight_bytes() const noexcept { return state_ ? state_->bytes() : 0; }
std::size_t MultiheadAttention::weight_bytes_read() const noexcept { return state_ ? state_->bytes_read() : 0; }

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt) const {
    run(in, out, opt, nullptr);
}

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                                 Workspace& workspace) const {
    run(in, out, opt, &workspace);
}

std::size_t MultiheadAttention::workspace_bytes(const AttentionInputs& in_arg, const ForwardOptions& opt) const {
    if (!state_) fail("the attention object was moved from");
    AttentionInputs in = in_arg;
    if (in.key.data == nullptr) in.key = in.query;
    if (in.value.data == nullptr) in.value = in.key;
    for (const auto& [name, v, features] :
         {std::tuple<const char*, const ConstBatch*, std::size_t>{"query", &in.query, state_->E}, {"key", &in.key, state_->kdim},
          {"value", &in.value, state_->vdim}})
        if (v->batch == 0 || v->rows == 0 || v->cols != features)
            fail(std::string(name) + " is [" + std::to_string(v->batch) + ", " + std::to_string(v->rows) + ", " +
                 std::to_string(v->cols) + "] but must be non-empty with " + std::to_string(features) + " features");
    check_options(opt);
    if (opt.backend == Backend::scalar) return 0;
    return simd_workspace_bytes(*state_, in, opt);
}

namespace {

// A forward with a cache: the cache fits the layer and the call, and the options it replaces are unset.
// Runs before the general checks (which then see self-attention over the new tokens).
void check_cache_call(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs& out,
                      const ForwardOptions& opt, const KVCache& cache) {
    if (cache.batch() == 0) fail("the KV cache is empty (moved from or default-constructed)");
    if (cache.kv_heads() != st.Hkv || cache.head_dim() != st.d)
        fail("the KV cache has " + std::to_string(cache.kv_heads()) + " KV heads of dim " + std::to_string(cache.head_dim()) +
             " but the layer has " + std::to_string(st.Hkv) + " of dim " + std::to_string(st.d));
    if (in.key.data != nullptr || in.value.data != nullptr)
        fail("key and value must be absent with a KV cache (the new tokens are the query)");
    if (in.key_padding_mask.present() || in.attn_mask.present())
        fail("masks are not taken with a KV cache (each sequence's length is its padding)");
    if (opt.need_weights != NeedWeights::none) fail("need_weights is not available with a KV cache");
    if (opt.positions != nullptr || opt.position_offset != 0)
        fail("positions and position_offset must be unset with a KV cache (positions are the cache's lengths)");
    if (in.query.batch != cache.batch())
        fail("query batch " + std::to_string(in.query.batch) + " differs from the KV cache's batch " + std::to_string(cache.batch()));
    for (std::size_t b = 0; b < cache.batch(); ++b)
        if (in.query.rows > cache.capacity() - cache.lengths()[b])
            fail("sequence " + std::to_string(b) + " holds " + std::to_string(cache.lengths()[b]) + " tokens; " +
                 std::to_string(in.query.rows) + " more exceed the KV cache's capacity " + std::to_string(cache.capacity()));
    const ConstBatch storage(static_cast<const float*>(cache.key_storage()), 1, 1, cache.bytes() / sizeof(float));
    if (in.query.data != nullptr && in.query.batch != 0 && in.query.rows != 0 && in.query.cols != 0 &&
        detail::overlaps(storage, in.query))
        fail("query overlaps the KV cache");
    if (out.output.data != nullptr && out.output.batch != 0 && out.output.rows != 0 && out.output.cols != 0 &&
        detail::overlaps(storage, ConstBatch(out.output)))
        fail("output overlaps the KV cache");
}

}  // namespace

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                                 KVCache& cache) const {
    run(in, out, opt, nullptr, &cache);
}

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                                 KVCache& cache, Workspace& workspace) const {
    run(in, out, opt, &workspace, &cache);
}

std::size_t MultiheadAttention::workspace_bytes(const AttentionInputs& in, const ForwardOptions& opt, const KVCache& cache) const {
    if (!state_) fail("the attention object was moved from");
    check_cache_call(*state_, in, {}, opt, cache);
    if (in.query.batch == 0 || in.query.rows == 0 || in.query.cols != state_->E)
        fail("query is [" + std::to_string(in.query.batch) + ", " + std::to_string(in.query.rows) + ", " +
             std::to_string(in.query.cols) + "] but must be non-empty with " + std::to_string(state_->E) + " features");
    check_options(opt);
    if (opt.backend == Backend::scalar) return 0;
    AttentionInputs self = in;
    self.key = self.value = in.query;
    return simd_workspace_bytes(*state_, self, opt, &cache);
}

void MultiheadAttention::run(const AttentionInputs& in_arg, const AttentionOutputs& out, const ForwardOptions& opt_arg,
                             Workspace* workspace, KVCache* cache) const {
    if (!state_) fail("the attention object was moved from");
    const State& st = *state_;
    const std::size_t E = st.E, H = st.H;
    ForwardOptions opt = opt_arg;
    if (cache != nullptr) {
        check_cache_call(st, in_arg, out, opt, *cache);
        opt.causal = true;  // bottom-right per sequence, by the cache's lengths
        opt.causal_alignment = CausalAlignment::bottom_right;
    }
    AttentionInputs in = in_arg;
    if (in.key.data == nullptr) in.key = in.query;
    if (in.value.data == nullptr) in.value = in.key;

    check_options(opt);  // first: later checks use need_weights

    detail::check_batch("query", in.query);
    detail::check_batch("key", in.key);
    detail::check_batch("value", in.value);
    detail::check_batch("output", out.output);
    detail::check_rows_disjoint("output", out.output);
    const std::size_t B = in.query.batch, Lq = in.query.rows, Lk = in.key.rows;
    if (in.query.cols != E) fail("query has " + std::to_string(in.query.cols) + " features but embed_dim is " + std::to_string(E));
    if (in.key.cols != st.kdim) fail("key has " + std::to_string(in.key.cols) + " features but kdim is " + std::to_string(st.kdim));
    if (in.value.cols != st.vdim) fail("value has " + std::to_string(in.value.cols) + " features but vdim is " + std::to_string(st.vdim));
    if (in.key.batch != B) fail("key batch " + std::to_string(in.key.batch) + " differs from query batch " + std::to_string(B));
    if (in.value.batch != B) fail("value batch " + std::to_string(in.value.batch) + " differs from query batch " + std::to_string(B));
    if (in.value.rows != Lk) fail("value length " + std::to_string(in.value.rows) + " differs from key length " + std::to_string(Lk));
    if (out.output.batch != B || out.output.rows != Lq || out.output.cols != E)
        fail("output is [" + std::to_string(out.output.batch) + ", " + std::to_string(out.output.rows) + ", " +
             std::to_string(out.output.cols) + "] but must be [B, Lq, E] = [" + std::to_string(B) + ", " +
             std::to_string(Lq) + ", " + std::to_string(E) + "]");
    if (detail::overlaps(out.output, in.query) || detail::overlaps(out.output, in.key) ||
        detail::overlaps(out.output, in.value))
        fail("output overlaps query, key or value");
    check_masks(in.key_padding_mask, in.attn_mask, B, H, Lq, Lk);
    if (st.rope && cache == nullptr) {  // with a cache: positions are lengths below the capacity
        // Positions must stay exact in double (the angle p·θ_k): start + L <= 2^53.
        // Bottom-right alignment puts query row i at start + Lk − Lq + i, which must not be negative.
        constexpr std::size_t kMaxPosition = std::size_t{1} << 53;
        const std::size_t L = std::max(Lq, Lk);
        const bool bottom_right = opt.causal_alignment == CausalAlignment::bottom_right;
        auto check_start = [&](std::size_t start, const std::string& name) {
            if (start > kMaxPosition - L)
                fail(name + " " + std::to_string(start) + " + length " + std::to_string(L) + " exceeds 2^53");
            if (bottom_right && Lq > Lk && start < Lq - Lk)
                fail(name + " " + std::to_string(start) + " is smaller than Lq − Lk = " + std::to_string(Lq - Lk) +
                     ": with bottom-right alignment the first query would be at a negative position");
        };
        if (opt.positions != nullptr) {
            checked_extent("positions", opt.positions, B);
            for (std::size_t b = 0; b < B; ++b) check_start(opt.positions[b], "positions[" + std::to_string(b) + "]");
        } else {
            check_start(opt.position_offset, "position_offset");
        }
    }
    // The output must not overwrite a mask it is computed from (the reference reads batch b + 1's mask
    // rows after writing batch b's output).
    const std::size_t output_elements = detail::batch_elements(out.output);
    if (mask_overlaps(in.key_padding_mask, out.output.data, output_elements)) fail("output overlaps key_padding_mask");
    if (mask_overlaps(in.attn_mask, out.output.data, output_elements)) fail("output overlaps attn_mask");
    std::size_t weight_count = 0;  // floats of attn_weights
    if (opt.need_weights != NeedWeights::none) {
        if (out.attn_weights == nullptr) fail("need_weights is set but attn_weights is a null pointer");
        const std::size_t heads = opt.need_weights == NeedWeights::per_head ? H : 1;
        weight_count = detail::checked_extent(
            "attn_weights", out.attn_weights,
            detail::checked_madd(detail::checked_madd(B, heads, 0, "attn_weights", "[B, H]"),
                                 detail::checked_madd(Lq, Lk, 0, "attn_weights", "[Lq, Lk]"), 0, "attn_weights", "size"));
        const Batch weights(out.attn_weights, 1, 1, weight_count);
        const std::string what = "attn_weights [" + std::to_string(weight_count) + " floats] overlaps ";
        if (detail::overlaps(weights, out.output) || detail::overlaps(weights, in.query) ||
            detail::overlaps(weights, in.key) || detail::overlaps(weights, in.value))
            fail(what + "output, query, key or value");
        if (mask_overlaps(in.key_padding_mask, out.attn_weights, weight_count)) fail(what + "key_padding_mask");
        if (mask_overlaps(in.attn_mask, out.attn_weights, weight_count)) fail(what + "attn_mask");
    }

    if (workspace != nullptr && workspace->data() != nullptr) {
        // A borrowed workspace must not share memory with anything the call reads or writes.
        const auto* w = static_cast<const unsigned char*>(workspace->data());
        const std::size_t wb = workspace->bytes();
        auto hits = [&](const auto& v) { return detail::overlaps(w, wb, v.data, detail::batch_elements(v)); };
        if (hits(in.query) || hits(in.key) || hits(in.value) || hits(out.output) ||
            detail::overlaps(w, wb, out.attn_weights, weight_count) || mask_overlaps(in.key_padding_mask, w, wb) ||
            mask_overlaps(in.attn_mask, w, wb))
            fail("workspace overlaps an input, an output or a mask");
        if (cache != nullptr && detail::overlaps(w, wb, static_cast<const float*>(cache->key_storage()), cache->bytes() / sizeof(float)))
            fail("workspace overlaps the KV cache");
    }

    if (opt.backend == Backend::scalar) {
        // The reference's buffers: [Lq|Lk, E] projections and [Lq, Lk] scores (inputs may repeat rows
        // with stride 0, so Lq and Lk are not bounded by real memory).
        detail::checked_extent("the scalar backend's projections", static_cast<const float*>(nullptr),
                               detail::checked_madd(Lq, st.q_width(), detail::checked_madd(Lk, 2 * st.kv_width(), 0, "the scalar backend's", "projections"),
                                                    "the scalar backend's", "projections"));
        detail::checked_extent("the scalar backend's scores", static_cast<const float*>(nullptr),
                               detail::checked_madd(Lq, Lk, 0, "the scalar backend's", "scores"));
        const State::Unpacked weights = st.unpacked();  // before anything is written (may throw bad_alloc)
        reference::Layer layer = weights.layer(st);
        layer.compute = st.compute;  // bf16: the reference rounds where the SIMD path does
        if (cache != nullptr)
            reference::cached_attention(layer, in.query, out.output, opt, *cache);
        else
            reference::multihead_attention(layer, in, out, opt);
    } else {
        simd_multihead_attention(st, in, out, opt, workspace, cache);
    }
}

}  // namespace mha
