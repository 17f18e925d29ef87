// MultiheadAttention: owns the weights, validates every forward argument at the public API, then
// runs the scalar reference or the SIMD backend. Nothing is written before validation passes.
#include <cmath>
#include <string>
#include <utility>

#include "../core/validate.hpp"
#include "../reference/reference.hpp"
#include "mha/attention.hpp"
#include "state.hpp"

namespace mha {

using detail::fail;

namespace {

std::string dims(const MaskView& m) {
    std::string s = "[";
    for (int i = 0; i < m.rank; ++i) s += (i ? ", " : "") + std::to_string(m.shape[i]);
    return s + "]";
}

void check_mask_data(const char* name, const MaskView& m) {
    if (m.type != MaskType::boolean && m.type != MaskType::additive)
        fail(std::string(name) + " has an unknown mask type " + std::to_string(static_cast<int>(m.type)));
    if (m.type == MaskType::boolean && m.bools == nullptr) fail(std::string(name) + " is boolean with a null pointer");
    if (m.type == MaskType::additive && m.values == nullptr) fail(std::string(name) + " is additive with a null pointer");
    // Checked before dims() prints the shape: MaskView::shape has 3 entries.
    if (m.rank != 2 && m.rank != 3) fail(std::string(name) + " has rank " + std::to_string(m.rank) + " but must be 2 or 3");
}

// Elements of a validated mask (shape checked against B, H, Lq, Lk, so the product fits).
std::size_t mask_elements(const MaskView& m) {
    std::size_t n = 1;
    for (int i = 0; i < m.rank; ++i) n *= m.shape[i];
    return n;
}

// The mask's bytes fit in the address space after its pointer (its shape matched the inputs).
void check_mask_extent(const char* name, const MaskView& m) {
    std::size_t n = 1;
    for (int i = 0; i < m.rank; ++i) n = detail::checked_madd(n, m.shape[i], 0, name, "size");
    if (m.type == MaskType::boolean)
        detail::checked_extent(name, m.bools, n);
    else
        detail::checked_extent(name, m.values, n);
}

// The enum values and scalar options of a call.
void check_options(const ForwardOptions& opt) {
    if (static_cast<unsigned>(opt.need_weights) > static_cast<unsigned>(NeedWeights::per_head))
        fail("need_weights " + std::to_string(static_cast<int>(opt.need_weights)) + " is not none, averaged or per_head");
    if (static_cast<unsigned>(opt.impl) > static_cast<unsigned>(Impl::fused))
        fail("impl " + std::to_string(static_cast<int>(opt.impl)) + " is not automatic, materialized or fused");
    if (static_cast<unsigned>(opt.backend) > static_cast<unsigned>(Backend::simd))
        fail("backend " + std::to_string(static_cast<int>(opt.backend)) + " is not scalar or simd");
    if (opt.threads < 0) fail("threads " + std::to_string(opt.threads) + " is negative");
    if (opt.norm_eps && (!std::isfinite(*opt.norm_eps) || *opt.norm_eps < 0.0f))
        fail("norm_eps " + std::to_string(*opt.norm_eps) + " is not a finite value >= 0");
}

// A present mask's data shares memory with elements [p, p + n).
template <class T>
bool mask_overlaps(const MaskView& m, const T* p, std::size_t n) {
    if (!m.present()) return false;
    return m.type == MaskType::boolean ? detail::overlaps(p, n, m.bools, mask_elements(m))
                                       : detail::overlaps(p, n, m.values, mask_elements(m));
}

void check_masks(const AttentionInputs& in, std::size_t B, std::size_t H, std::size_t Lq, std::size_t Lk) {
    if (const MaskView& m = in.key_padding_mask; m.present()) {
        check_mask_data("key_padding_mask", m);
        if (m.rank != 2 || m.shape[0] != B || m.shape[1] != Lk)
            fail("key_padding_mask has shape " + dims(m) + " but must be [B, Lk] = [" + std::to_string(B) + ", " +
                 std::to_string(Lk) + "]");
        check_mask_extent("key_padding_mask", m);
    }
    if (const MaskView& m = in.attn_mask; m.present()) {
        check_mask_data("attn_mask", m);
        const bool ok2 = m.rank == 2 && m.shape[0] == Lq && m.shape[1] == Lk;
        const bool ok3 = m.rank == 3 && m.shape[0] % H == 0 && m.shape[0] / H == B &&  // B·H may not fit
                          m.shape[1] == Lq && m.shape[2] == Lk;
        if (!ok2 && !ok3)
            fail("attn_mask has shape " + dims(m) + " but must be [Lq, Lk] = [" + std::to_string(Lq) + ", " +
                 std::to_string(Lk) + "] or [B·H, Lq, Lk] = [" + std::to_string(B * H) + ", " + std::to_string(Lq) +
                 ", " + std::to_string(Lk) + "]");
        check_mask_extent("attn_mask", m);
    }
}

}  // namespace

MultiheadAttention::MultiheadAttention(const AttentionWeights& w, std::size_t E, std::size_t H) {
    if (E == 0) fail("embed_dim is 0");
    if (H == 0) fail("num_heads is 0");
    if (E % H != 0) fail("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H));
    if (w.in_proj_weight == nullptr) fail("in_proj_weight is a null pointer");
    if (w.out_proj_weight == nullptr) fail("out_proj_weight is a null pointer");

    auto s = std::make_unique<State>();
    s->E = E;
    s->H = H;
    s->in_b = w.in_proj_bias ? std::vector<float>(w.in_proj_bias, w.in_proj_bias + 3 * E) : std::vector<float>(3 * E, 0.0f);
    s->out_b = w.out_proj_bias ? std::vector<float>(w.out_proj_bias, w.out_proj_bias + E) : std::vector<float>(E, 0.0f);
    if (w.norm_weight) s->norm_w.assign(w.norm_weight, w.norm_weight + E);
    if (w.norm_bias) s->norm_b.assign(w.norm_bias, w.norm_bias + E);
    // One packed copy of each weight, straight from the caller's memory (Wq, Wk, Wv as three segments).
    s->in_proj = simd::PackedMatrix(ConstMatrix(w.in_proj_weight, 3 * E, E), Trans::yes, 3);
    s->out_proj = simd::PackedMatrix(ConstMatrix(w.out_proj_weight, E, E), Trans::yes);
    state_ = std::move(s);
}

MultiheadAttention::~MultiheadAttention() = default;
MultiheadAttention::MultiheadAttention(MultiheadAttention&&) noexcept = default;
MultiheadAttention& MultiheadAttention::operator=(MultiheadAttention&&) noexcept = default;

std::size_t MultiheadAttention::embed_dim() const noexcept { return state_ ? state_->E : 0; }
std::size_t MultiheadAttention::num_heads() const noexcept { return state_ ? state_->H : 0; }
std::size_t MultiheadAttention::head_dim() const noexcept { return state_ ? state_->E / state_->H : 0; }

std::size_t MultiheadAttention::weight_bytes() const noexcept { return state_ ? state_->bytes() : 0; }

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
    for (const auto& [name, v] : {std::pair<const char*, const ConstBatch*>{"query", &in.query}, {"key", &in.key}, {"value", &in.value}})
        if (v->batch == 0 || v->rows == 0 || v->cols != state_->E)
            fail(std::string(name) + " is [" + std::to_string(v->batch) + ", " + std::to_string(v->rows) + ", " +
                 std::to_string(v->cols) + "] but must be non-empty with embed_dim " + std::to_string(state_->E) + " features");
    check_options(opt);
    if (opt.backend == Backend::scalar) return 0;
    return simd_workspace_bytes(*state_, in, opt);
}

void MultiheadAttention::run(const AttentionInputs& in_arg, const AttentionOutputs& out, const ForwardOptions& opt,
                             Workspace* workspace) const {
    if (!state_) fail("the attention object was moved from");
    const std::size_t E = state_->E, H = state_->H;
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
    if (in.key.cols != E) fail("key has " + std::to_string(in.key.cols) + " features but embed_dim is " + std::to_string(E));
    if (in.value.cols != E) fail("value has " + std::to_string(in.value.cols) + " features but embed_dim is " + std::to_string(E));
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
    check_masks(in, B, H, Lq, Lk);
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
    }

    if (opt.backend == Backend::scalar) {
        // The reference's buffers: [Lq|Lk, E] projections and [Lq, Lk] scores (inputs may repeat rows
        // with stride 0, so Lq and Lk are not bounded by real memory).
        detail::checked_extent("the scalar backend's projections", static_cast<const float*>(nullptr),
                               detail::checked_madd(Lq, E, detail::checked_madd(Lk, E, 0, "the scalar backend's", "projections"),
                                                    "the scalar backend's", "projections"));
        detail::checked_extent("the scalar backend's scores", static_cast<const float*>(nullptr),
                               detail::checked_madd(Lq, Lk, 0, "the scalar backend's", "scores"));
        const State::Unpacked weights = state_->unpacked();  // before anything is written (may throw bad_alloc)
        reference::multihead_attention(weights.layer(*state_), in, out, opt);
    } else {
        simd_multihead_attention(*state_, in, out, opt, workspace);
    }
}

}  // namespace mha
