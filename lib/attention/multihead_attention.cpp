// MultiheadAttention: owns the weights, validates every forward argument at the public API (validate_call.hpp), then
// runs the scalar reference or the SIMD backend. Nothing is written before validation passes. B = 0 or Lq = 0
// writes nothing; Lk = 0 writes the fully masked rows (write_unattended_rows).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/validate.hpp"
#include "../reference/reference.hpp"
#include "mha/attention.hpp"
#include "mha/kv_cache.hpp"
#include "mha/paged_kv_cache.hpp"
#include "mha/step_plan.hpp"
#include "paged_kv_cache_access.hpp"
#include "rope.hpp"
#include "simd_attention.hpp"
#include "state.hpp"
#include "step_forward.hpp"
#include "validate_call.hpp"

namespace mha {

using detail::checked_extent;
using detail::checked_madd;
using detail::fail;

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
    if (cfg.compute != DataType::f32 && cfg.compute != DataType::bf16)
        fail("compute type " + std::string(data_type_name(cfg.compute).empty() ? std::to_string(static_cast<int>(cfg.compute))
                                                                              : data_type_name(cfg.compute)) +
             " is not supported (f32 or bf16; f16, int8 and fp8 are KV cache element types)");
    detail::check_norm_eps(cfg.norm_eps);
    detail::check_modifiers(cfg.modifiers, H, "modifiers");
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

    auto s = std::make_unique<detail::LayerState>();
    s->E = E, s->H = H, s->Hkv = Hkv, s->d = d, s->kdim = kdim, s->vdim = vdim, s->rope = rope;
    s->compute = cfg.compute;
    s->norm_eps = cfg.norm_eps;
    s->window_left = cfg.modifiers.window_left, s->window_right = cfg.modifiers.window_right;
    s->softcap = cfg.modifiers.softcap;
    if (cfg.modifiers.sinks != nullptr) s->sinks.assign(cfg.modifiers.sinks, cfg.modifiers.sinks + H);
    if (cfg.modifiers.alibi_slopes != nullptr) s->alibi_slopes.assign(cfg.modifiers.alibi_slopes, cfg.modifiers.alibi_slopes + H);
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
    // plus the bf16 kernels' panels when the CPU has AVX512_BF16; the packed copy serves the CPUs without them, a
    // lower ISA cap and the scalar backend).
    const float* wq = packed ? w.in_proj_weight : w.q_proj_weight;
    const float* wk = packed ? w.in_proj_weight + qw * E : w.k_proj_weight;
    const float* wv = packed ? w.in_proj_weight + (qw + kvw) * E : w.v_proj_weight;
    const float* wo = w.out_proj_weight;
    s->qkv_packed = kdim == E && vdim == E;
    if (cfg.compute == DataType::bf16 && simd::bf16_kernels_available()) {  // both packings round as they pack
        if (s->qkv_packed) {
            s->in_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wq, qw, E), ConstMatrix(wk, kvw, E), ConstMatrix(wv, kvw, E)}, Trans::yes);
        } else {
            s->q_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wq, qw, E)}, Trans::yes);
            s->k_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wk, kvw, kdim)}, Trans::yes);
            s->v_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wv, kvw, vdim)}, Trans::yes);
        }
        s->out_proj16 = simd::Bf16PackedMatrix({ConstMatrix(wo, E, qw)}, Trans::yes);
    }
    // bf16 compute: the rounded weights in bf16 panels that the fp32 GEMM widens exactly (the bits of fp32
    // panels, half the bytes streamed and held).
    const simd::PanelElement element = cfg.compute == DataType::bf16 ? simd::PanelElement::bf16 : simd::PanelElement::f32;
    if (s->qkv_packed) {  // Wq, Wk, Wv as segments of one matrix: self-attention runs one GEMM
        s->in_proj = simd::PackedMatrix({ConstMatrix(wq, qw, E), ConstMatrix(wk, kvw, E), ConstMatrix(wv, kvw, E)}, Trans::yes, element);
    } else {
        s->q_proj = simd::PackedMatrix(ConstMatrix(wq, qw, E), Trans::yes, 1, element);
        s->k_proj = simd::PackedMatrix(ConstMatrix(wk, kvw, kdim), Trans::yes, 1, element);
        s->v_proj = simd::PackedMatrix(ConstMatrix(wv, kvw, vdim), Trans::yes, 1, element);
    }
    s->out_proj = simd::PackedMatrix(ConstMatrix(wo, E, qw), Trans::yes, 1, element);
    state_ = std::move(s);
}

detail::LayerState::Unpacked detail::LayerState::unpacked() const {
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

namespace {

const detail::LayerState& state_of(const std::unique_ptr<detail::LayerState>& state) {
    if (!state) fail("the attention object was moved from");
    return *state;
}

// Lk = 0 (no cache): every query row attends to no key, a fully masked row (zero probabilities, context 0),
// so its output is bo, then the post-norm over query + bo (the reference's layernorm_row). Written directly:
// the reference's loops would offset null pointers of the empty key projections.
void write_unattended_rows(const detail::LayerState& st, const detail::LayerCall& c) {
    const float* gamma = st.norm_w.empty() ? nullptr : st.norm_w.data();
    const float* beta = st.norm_b.empty() ? nullptr : st.norm_b.data();
    for (std::size_t b = 0; b < c.B; ++b)
        for (std::size_t i = 0; i < c.Lq; ++i) {
            float* y = c.out.output[b].row(i);
            std::copy(st.out_b.begin(), st.out_b.end(), y);
            if (c.opt.norm_eps) reference::layernorm_row(y, y, c.in.query[b].row(i), st.E, gamma, beta, *c.opt.norm_eps);
        }
}

}  // namespace

std::size_t MultiheadAttention::workspace_bytes(const AttentionInputs& in, const ForwardOptions& opt) const {
    const detail::LayerState& st = state_of(state_);
    const detail::LayerCall call = detail::describe_layer_call(st, in, opt, nullptr);
    return call.path == AttentionPath::scalar ? 0 : simd_workspace_bytes(st, call);
}

std::size_t MultiheadAttention::workspace_bytes(const AttentionInputs& in, const ForwardOptions& opt, const KVCache& cache) const {
    const detail::LayerState& st = state_of(state_);
    const detail::LayerCall call = detail::describe_layer_call(st, in, opt, &cache);
    return call.path == AttentionPath::scalar ? 0 : simd_workspace_bytes(st, call);
}

AttentionPath MultiheadAttention::path(const AttentionInputs& in, const ForwardOptions& opt) const {
    return detail::describe_layer_call(state_of(state_), in, opt, nullptr).path;
}

AttentionPath MultiheadAttention::path(const AttentionInputs& in, const ForwardOptions& opt, const KVCache& cache) const {
    return detail::describe_layer_call(state_of(state_), in, opt, &cache).path;
}

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                                 KVCache& cache) const {
    run(in, out, opt, nullptr, &cache);
}

void MultiheadAttention::forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                                 KVCache& cache, Workspace& workspace) const {
    run(in, out, opt, &workspace, &cache);
}

void MultiheadAttention::run(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                             Workspace* workspace, KVCache* cache) const {
    const detail::LayerState& st = state_of(state_);
    const detail::LayerCall call = detail::validate_layer_call(st, in, out, opt, workspace, cache);
    if (call.B == 0 || call.Lq == 0) return;  // validated; nothing to compute (with a cache: nothing appended)
    if (call.Lk == 0) return write_unattended_rows(st, call);
    if (call.path != AttentionPath::scalar) return simd_multihead_attention(st, call, workspace, cache);
    const detail::LayerState::Unpacked weights = st.unpacked();  // before anything is written (may throw bad_alloc)
    reference::Layer layer = weights.layer(st);
    layer.compute = st.compute;  // bf16: the reference rounds where the SIMD path does
    if (cache == nullptr) return reference::multihead_attention(layer, call.in, out, call.opt);
    // The cache's rows widened for the reference, which returns the new K / V rows as the cache will hold them;
    // they are appended after the whole step (nothing changes if an allocation fails first).
    const std::size_t B = call.B, Lq = call.Lq, Hkv = st.Hkv, d = st.d;
    std::vector<std::vector<float>> rows(2 * B);
    std::vector<reference::CachedRows> past(B);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t n = cache->length(b);
        rows[2 * b].resize(Hkv * n * d);
        rows[2 * b + 1].resize(Hkv * n * d);
        for (std::size_t h = 0; h < Hkv; ++h) {
            cache->copy_keys(b, h, Matrix(rows[2 * b].data() + h * n * d, n, d));
            cache->copy_values(b, h, Matrix(rows[2 * b + 1].data() + h * n * d, n, d));
        }
        past[b] = {rows[2 * b].data(), rows[2 * b + 1].data(), n};
    }
    std::vector<float> new_keys(B * Lq * Hkv * d), new_values(new_keys.size());
    const Batch k(new_keys.data(), B, Lq, Hkv * d), v(new_values.data(), B, Lq, Hkv * d);
    reference::cached_attention(layer, call.in.query, out.output, call.opt, detail::element_format(cache->element_type()),
                                cache->k_scale(), cache->v_scale(), past.data(), k, v);
    for (std::size_t b = 0; b < B; ++b)
        cache->append(b, ConstHeads(k[b].data, 1, Hkv, Lq, d, 0, d, Hkv * d), ConstHeads(v[b].data, 1, Hkv, Lq, d, 0, d, Hkv * d));
}

void MultiheadAttention::forward_step(const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const std::size_t* seq_ids,
                                      const std::size_t* q_lens, std::size_t sequences, int threads, Backend backend) const {
    const StepPlan plan(*this, cache, seq_ids, q_lens, sequences, threads);
    forward_step(x, y, cache, plan, backend);
}

void MultiheadAttention::forward_step(const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const StepPlan& plan,
                                      Backend backend) const {
    const detail::LayerState& st = state_of(state_);
    if (!plan.data_) fail("the step plan was moved from");
    const detail::StepPlanData& p = *plan.data_;
    const detail::StepReservation r = detail::validate_step_call(st, p, x, y, cache, backend);
    if (backend == Backend::scalar) return detail::reference_step(st, x, y, cache, r);
    simd_forward_step(st, p.layout, x, y, cache, r);
}

void MultiheadAttention::forward_varlen(const ConstMatrix& x, const Matrix& y, const std::size_t* seq_starts, std::size_t sequences,
                                        bool causal, int threads, Backend backend) const {
    const detail::LayerState& st = state_of(state_);
    const std::size_t T = detail::validate_varlen_call(st, x, y, seq_starts, sequences, threads, backend);
    if (T == 0) return;  // no token (no sequence, or only empty ones): nothing to read or write
    if (backend != Backend::scalar) return simd_forward_varlen(st, x, y, seq_starts, sequences, causal, threads);
    ForwardOptions one;  // each sequence alone through the reference: what the SIMD path must equal bitwise
    one.causal = causal;
    one.backend = Backend::scalar;
    one.threads = threads;
    // Into a buffer first: an allocation failing in a later sequence leaves y as it was.
    const std::size_t E = st.E;
    std::vector<float> out(T * E);
    for (std::size_t i = 0; i < sequences; ++i) {
        const std::size_t r0 = seq_starts[i], q = seq_starts[i + 1] - r0;
        if (q == 0) continue;
        const ConstBatch xs(x.row(r0), 1, q, E, x.stride, q * x.stride);
        forward(AttentionInputs::self_attention(xs), AttentionOutputs{Batch(out.data() + r0 * E, 1, q, E, E, q * E)}, one);
    }
    for (std::size_t t = 0; t < T; ++t) std::copy_n(out.data() + t * E, E, y.row(t));
}

StepPlan::StepPlan(const MultiheadAttention& layer, const PagedKVCache& cache, const std::size_t* seq_ids, const std::size_t* q_lens,
                   std::size_t sequences, int threads) {
    const detail::LayerState& st = state_of(layer.state_);
    detail::validate_step_plan(st, cache, threads);
    auto data = std::make_unique<detail::StepPlanData>();
    data->layer = detail::StepLayerShape::of(st);
    data->step = detail::PagedKVCacheAccess::compose_step(cache, seq_ids, q_lens, sequences);
    data->layout = detail::step_layout(st, data->step, threads);
    data_ = std::move(data);
}

StepPlan::~StepPlan() = default;
StepPlan::StepPlan(StepPlan&& other) noexcept = default;
StepPlan& StepPlan::operator=(StepPlan&& other) noexcept = default;
std::size_t StepPlan::sequences() const noexcept { return data_ ? data_->step.sequences : 0; }
std::size_t StepPlan::tokens() const noexcept { return data_ ? data_->step.query_starts[data_->step.sequences] : 0; }

std::string_view attention_path_name(AttentionPath path) noexcept {
    switch (path) {
        case AttentionPath::scalar: return "scalar";
        case AttentionPath::materialized: return "materialized";
        case AttentionPath::grouped: return "grouped";
        case AttentionPath::decode: return "decode";
    }
    return "?";
}

}  // namespace mha
