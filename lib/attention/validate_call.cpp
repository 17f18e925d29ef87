// The validation module (validate_call.hpp): every check of the public entry points of lib/attention, and the
// resolved description of a call. Checks run in a fixed order (the first failing one names the error).
#include "validate_call.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "attention_core.hpp"
#include "paged_kv_cache_access.hpp"
#include "state.hpp"
#include "step_forward.hpp"

namespace mha::detail {
namespace {

// --- masks and options (MultiheadAttention and SDPA) ------------------------------------------------------

std::string dims(const MaskView& m) {
    std::string s = "[";
    for (int i = 0; i < m.rank; ++i) s += (i ? ", " : "") + std::to_string(m.shape[i]);
    return s + "]";
}

void check_mask_data(const char* name, const MaskView& m) {
    if (m.type != MaskType::boolean && m.type != MaskType::additive)
        fail(std::string(name) + " has an unknown mask type " + std::to_string(static_cast<int>(m.type)));
    // Checked before dims() prints the shape: MaskView::shape has 3 entries.
    if (m.rank != 2 && m.rank != 3) fail(std::string(name) + " has rank " + std::to_string(m.rank) + " but must be 2 or 3");
    bool empty = false;  // a zero dimension: no elements, so the pointer may be null
    for (int i = 0; i < m.rank; ++i) empty = empty || m.shape[i] == 0;
    if (m.type == MaskType::boolean && m.bools == nullptr && !empty) fail(std::string(name) + " is boolean with a null pointer");
    if (m.type == MaskType::additive && m.values == nullptr && !empty) fail(std::string(name) + " is additive with a null pointer");
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
    for (int i = 0; i < m.rank; ++i) n = checked_madd(n, m.shape[i], 0, name, "size");
    if (m.type == MaskType::boolean)
        checked_extent(name, m.bools, n);
    else
        checked_extent(name, m.values, n);
}

void check_threads(int threads) {
    if (threads < 0) fail("threads " + std::to_string(threads) + " is negative");
}

// The options both entry points take.
void check_common_options(Algorithm impl, Backend backend, int threads) {
    if (static_cast<unsigned>(impl) > static_cast<unsigned>(Algorithm::fused))
        fail("impl " + std::to_string(static_cast<int>(impl)) + " is not automatic, materialized or fused");
    check_backend(backend);
    check_threads(threads);
}

// The checks the packed entry points share: a self-attention layer, the cache's heads, x and y [T, E].
void check_self_attention(const LayerState& st, const char* what) {
    if (st.kdim != st.E || st.vdim != st.E)
        fail(std::string(what) + " needs a self-attention layer (kdim = vdim = embed_dim " + std::to_string(st.E) + "), not kdim " +
             std::to_string(st.kdim) + " and vdim " + std::to_string(st.vdim));
}

void check_cache_heads(const PagedKVCache& cache, const LayerState& st) {
    if (cache.kv_heads() != st.Hkv || cache.head_dim() != st.d)
        fail("the paged cache holds " + std::to_string(cache.kv_heads()) + " KV heads of dim " + std::to_string(cache.head_dim()) +
             " but this layer has " + std::to_string(st.Hkv) + " of dim " + std::to_string(st.d));
}

// x and y [T, E], y not overlapping x; T = 0 takes any (even null) views.
void check_packed_rows(const ConstMatrix& x, const Matrix& y, std::size_t T, std::size_t E, const char* what_T) {
    if (x.rows != T || x.cols != E)
        fail("x is " + shape_str(x.rows, x.cols) + " but must be [T, E] = " + shape_str(T, E) + " (" + what_T + ")");
    if (y.rows != T || y.cols != E) fail("y is " + shape_str(y.rows, y.cols) + " but must be [T, E] = " + shape_str(T, E));
    if (T == 0) return;
    check_matrix("x", x);
    check_matrix("y", y);
    if (overlaps(x, y)) fail("y overlaps x");
}

void check_causal_alignment(CausalAlignment a) {
    if (static_cast<unsigned>(a) > static_cast<unsigned>(CausalAlignment::bottom_right))
        fail("causal_alignment " + std::to_string(static_cast<int>(a)) + " is not top_left or bottom_right");
}

// A present mask's data shares memory with elements [p, p + n).
template <class T>
bool mask_overlaps(const MaskView& m, const T* p, std::size_t n) {
    if (!m.present()) return false;
    return m.type == MaskType::boolean ? overlaps(p, n, m.bools, mask_elements(m))
                                       : overlaps(p, n, m.values, mask_elements(m));
}

// key_padding_mask [B, Lk] and attn_mask [Lq, Lk] or [B·H, Lq, Lk] (H query heads), when present.
void check_masks(const MaskView& key_padding_mask, const MaskView& attn_mask, std::size_t B, std::size_t H,
                        std::size_t Lq, std::size_t Lk) {
    if (const MaskView& m = key_padding_mask; m.present()) {
        check_mask_data("key_padding_mask", m);
        if (m.rank != 2 || m.shape[0] != B || m.shape[1] != Lk)
            fail("key_padding_mask has shape " + dims(m) + " but must be [B, Lk] = [" + std::to_string(B) + ", " +
                 std::to_string(Lk) + "]");
        check_mask_extent("key_padding_mask", m);
    }
    if (const MaskView& m = attn_mask; m.present()) {
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

// The output must not overwrite a mask it is computed from (the reference reads batch b + 1's mask rows after
// writing batch b's output). Messages are built only on failure: a valid call allocates nothing.
void check_output_apart_from_masks(const float* output, std::size_t n, const MaskView& key_padding_mask, const MaskView& attn_mask) {
    if (mask_overlaps(key_padding_mask, output, n)) fail("output overlaps key_padding_mask");
    if (mask_overlaps(attn_mask, output, n)) fail("output overlaps attn_mask");
}

// Bytes [data, data + bytes) a call reads or writes.
struct Span {
    const void* data;
    std::size_t bytes;
};
template <class T>
Span span(const T* p, std::size_t elements) noexcept {
    return {p, elements * sizeof(T)};
}

// A borrowed workspace shares memory with one of the spans or a mask (it must not: the call writes it).
bool workspace_overlaps(const Workspace* workspace, std::initializer_list<Span> spans, const MaskView& key_padding_mask,
                        const MaskView& attn_mask) {
    if (workspace == nullptr || workspace->data() == nullptr) return false;
    const auto* w = static_cast<const unsigned char*>(workspace->data());
    const std::size_t wb = workspace->bytes();
    for (const Span& s : spans)
        if (overlaps(w, wb, static_cast<const unsigned char*>(s.data), s.bytes)) return true;
    return mask_overlaps(key_padding_mask, w, wb) || mask_overlaps(attn_mask, w, wb);
}

AttentionPath public_path(CorePath p) noexcept {
    return p == CorePath::decode ? AttentionPath::decode : p == CorePath::grouped ? AttentionPath::grouped : AttentionPath::materialized;
}

// --- MultiheadAttention --------------------------------------------------------------------------------------

// The enum values and scalar options of a forward.
void check_forward_options(const ForwardOptions& opt) {
    if (static_cast<unsigned>(opt.need_weights) > static_cast<unsigned>(NeedWeights::per_head))
        fail("need_weights " + std::to_string(static_cast<int>(opt.need_weights)) + " is not none, averaged or per_head");
    check_common_options(opt.impl, opt.backend, opt.threads);
    check_causal_alignment(opt.causal_alignment);
    check_norm_eps(opt.norm_eps);
}

// The views of a forward (fp32 or 16-bit): valid pointers (any when empty), extents that fit; output rows disjoint.
template <class Inputs, class Output>
void check_views(const Inputs& in, const Output& output) {
    check_batch("query", in.query);
    check_batch("key", in.key);
    check_batch("value", in.value);
    check_batch("output", output);
    check_rows_disjoint("output", output);
}

template <class Inputs, class Output>
void check_output_apart(const Inputs& in, const Output& output) {
    if (overlaps(output, in.query) || overlaps(output, in.key) || overlaps(output, in.value))
        fail("output overlaps query, key or value");
}

// workspace_bytes and path read only the sizes: the layer's features (B and L may be 0).
void check_sizes(const char* name, const ConstBatch& v, std::size_t features) {
    if (v.cols != features)
        fail(std::string(name) + " is [" + std::to_string(v.batch) + ", " + std::to_string(v.rows) + ", " +
             std::to_string(v.cols) + "] but must have " + std::to_string(features) + " features");
}

// A forward with a cache: the cache fits the layer and the call, and the options it replaces are unset.
// Runs before the general checks (which then see self-attention over the new tokens).
void check_cache_call(const LayerState& st, const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt,
                      const KVCache& cache) {
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
    if (in.query.data != nullptr && in.query.batch != 0 && in.query.rows != 0 && in.query.cols != 0 && overlaps(storage, in.query))
        fail("query overlaps the KV cache");
    if (out.output.data != nullptr && out.output.batch != 0 && out.output.rows != 0 && out.output.cols != 0 &&
        overlaps(storage, ConstBatch(out.output)))
        fail("output overlaps the KV cache");
}

// Rotary positions must stay exact in double (the angle p·θ_k): start + L <= 2^53. Bottom-right alignment
// puts query row i at start + Lk − Lq + i, which must not be negative.
void check_positions(const LayerCall& c) {
    constexpr std::size_t kMaxPosition = std::size_t{1} << 53;
    const std::size_t L = std::max(c.Lq, c.Lk);
    const bool bottom_right = c.opt.causal_alignment == CausalAlignment::bottom_right;
    auto check_start = [&](std::size_t start, const std::string& name) {
        if (start > kMaxPosition - L) fail(name + " " + std::to_string(start) + " + length " + std::to_string(L) + " exceeds 2^53");
        if (bottom_right && c.Lq > c.Lk && start < c.Lq - c.Lk)
            fail(name + " " + std::to_string(start) + " is smaller than Lq − Lk = " + std::to_string(c.Lq - c.Lk) +
                 ": with bottom-right alignment the first query would be at a negative position");
    };
    if (c.opt.positions != nullptr) {
        checked_extent("positions", c.opt.positions, c.B);
        for (std::size_t b = 0; b < c.B; ++b) check_start(c.opt.positions[b], "positions[" + std::to_string(b) + "]");
    } else {
        check_start(c.opt.position_offset, "position_offset");
    }
}

// need_weights: the attn_weights buffer, its extent and overlaps. Returns its floats (0 without need_weights;
// with a zero B, Lq or Lk there are none and the pointer may be null).
std::size_t check_attn_weights(const LayerCall& c, std::size_t H) {
    if (c.opt.need_weights == NeedWeights::none || c.B == 0 || c.Lq == 0 || c.Lk == 0) return 0;
    float* const weights = c.out.attn_weights;
    if (weights == nullptr) fail("need_weights is set but attn_weights is a null pointer");
    const std::size_t heads = c.opt.need_weights == NeedWeights::per_head ? H : 1;
    const std::size_t count = checked_extent(
        "attn_weights", weights,
        checked_madd(checked_madd(c.B, heads, 0, "attn_weights", "[B, H]"), checked_madd(c.Lq, c.Lk, 0, "attn_weights", "[Lq, Lk]"),
                     0, "attn_weights", "size"));
    const Batch view(weights, 1, 1, count);
    auto what = [count] { return "attn_weights [" + std::to_string(count) + " floats] overlaps "; };  // on failure only
    if (overlaps(view, c.out.output) || overlaps(view, c.in.query) || overlaps(view, c.in.key) || overlaps(view, c.in.value))
        fail(what() + "output, query, key or value");
    if (mask_overlaps(c.in.key_padding_mask, weights, count)) fail(what() + "key_padding_mask");
    if (mask_overlaps(c.in.attn_mask, weights, count)) fail(what() + "attn_mask");
    return count;
}

// The options as the backends read them: with a cache causal bottom-right per sequence (by the cache's
// lengths, whatever the caller set); the post-norm's eps the call's (deprecated) or the layer's.
ForwardOptions effective_options(const LayerState& st, const ForwardOptions& opt, const KVCache* cache) {
    ForwardOptions o = opt;
    if (cache != nullptr) {
        o.causal = true;
        o.causal_alignment = CausalAlignment::bottom_right;
    }
    if (!o.norm_eps) o.norm_eps = st.norm_eps;
    return o;
}

// The resolved fields every layer call has, from inputs resolved and options effective and checked.
LayerCall resolved(const LayerState& st, const AttentionInputs& in, const ForwardOptions& opt, const KVCache* cache) {
    LayerCall c;
    c.in = in;
    c.opt = opt;
    c.cache = cache;
    c.B = in.query.batch, c.Lq = in.query.rows, c.Lk = in.key.rows;
    c.core_keys = c.Lk;
    if (cache != nullptr) c.core_keys = *std::max_element(cache->lengths().begin(), cache->lengths().end()) + c.Lq;
    c.self_attention = same_view(in.query, in.key) && same_view(in.key, in.value);
    c.compute = st.compute;
    c.core_path = core_path(st.H, st.Hkv, c.Lq, c.core_keys, opt.need_weights, opt.impl);
    c.path = opt.backend == Backend::scalar ? AttentionPath::scalar : public_path(c.core_path);
    // Nothing for the SIMD core: no rows (forward returns), or no keys (forward writes the bias rows).
    if (c.B == 0 || c.Lq == 0 || c.Lk == 0) c.path = AttentionPath::scalar;
    return c;
}

// --- scaled_dot_product_attention ----------------------------------------------------------------------------

std::string heads_shape(const ConstHeads& v) {
    // Appends rather than "[" + ...: g++ 12 gives a false -Wrestrict on that form (GCC bug 105651).
    std::string s("[");
    s.append(std::to_string(v.batch)).append(", ").append(std::to_string(v.heads)).append(", ");
    s.append(std::to_string(v.rows)).append(", ").append(std::to_string(v.dim)).append("]");
    return s;
}

// Elements from the view's first to one past its last element, checked to fit the address space (0 if empty).
std::size_t heads_extent(const char* name, const ConstHeads& v) {
    if (v.batch == 0 || v.heads == 0 || v.rows == 0 || v.dim == 0) return 0;
    std::size_t n = checked_madd(v.rows - 1, v.row_stride, v.dim, name, "extent");
    n = checked_madd(v.heads - 1, v.head_stride, n, name, "extent");
    n = checked_madd(v.batch - 1, v.batch_stride, n, name, "extent");
    return checked_extent(name, v.data, n);
}

// B and L may be 0 (nothing to attend); heads and the head dim may not.
void check_heads_size(const char* name, const ConstHeads& v) {
    if (v.heads == 0 || v.dim == 0) fail(std::string(name) + " has zero heads or head dim " + heads_shape(v));
}

void check_heads(const char* name, const ConstHeads& v) {
    check_heads_size(name, v);
    if (v.batch == 0 || v.rows == 0) return;  // no elements: any pointer
    if (v.data == nullptr) fail(std::string(name) + " is a null pointer");
    heads_extent(name, v);
}

// The output's rows (b, h, i) do not overlap each other: with the dimensions that have more than one entry
// sorted by stride, each stride is at least the extent of everything below it.
void check_output_rows_disjoint(const ConstHeads& v) {
    if (v.batch == 0 || v.rows == 0) return;  // no rows
    struct Dim {
        std::size_t stride, count;
    } dims[3];
    int n = 0;
    if (v.rows > 1) dims[n++] = {v.row_stride, v.rows};
    if (v.heads > 1) dims[n++] = {v.head_stride, v.heads};
    if (v.batch > 1) dims[n++] = {v.batch_stride, v.batch};
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j) std::swap(dims[j], dims[j - 1]);
    std::size_t extent = v.dim;  // elements one step of the next dimension must clear
    for (int i = 0; i < n; ++i) {
        if (dims[i].stride < extent)
            fail("output rows overlap each other (batch stride " + std::to_string(v.batch_stride) + ", head stride " +
                 std::to_string(v.head_stride) + ", row stride " + std::to_string(v.row_stride) + ", dim " +
                 std::to_string(v.dim) + ")");
        extent = (dims[i].count - 1) * dims[i].stride + extent;
    }
}

void check_group(std::size_t H, std::size_t Hkv) {
    if (H % Hkv != 0) fail("query heads " + std::to_string(H) + " are not a multiple of key/value heads " + std::to_string(Hkv));
}

SdpaCall resolved(const SdpaInputs& in, const SdpaOptions& opt) {
    SdpaCall c;
    c.B = in.query.batch, c.H = in.query.heads, c.Lq = in.query.rows, c.d = in.query.dim;
    c.Hkv = in.key.heads, c.Lk = in.key.rows;
    c.core_path = core_path(c.H, c.Hkv, c.Lq, c.Lk, NeedWeights::none, opt.impl);
    c.path = opt.backend == Backend::scalar ? AttentionPath::scalar : public_path(c.core_path);
    if (c.B == 0 || c.Lq == 0 || c.Lk == 0) c.path = AttentionPath::scalar;  // nothing for the SIMD core
    return c;
}

}  // namespace

void check_norm_eps(const std::optional<float>& eps) {
    if (eps && (!std::isfinite(*eps) || *eps < 0.0f)) fail("norm_eps " + std::to_string(*eps) + " is not a finite value >= 0");
}

LayerCall describe_layer_call(const LayerState& st, const AttentionInputs& in_arg, const ForwardOptions& opt,
                              const KVCache* cache) {
    if (cache != nullptr) check_cache_call(st, in_arg, {}, opt, *cache);
    const AttentionInputs in = resolve_key_value(in_arg);
    check_sizes("query", in.query, st.E);
    if (cache == nullptr) {
        check_sizes("key", in.key, st.kdim);
        check_sizes("value", in.value, st.vdim);
    }
    const ForwardOptions o = effective_options(st, opt, cache);
    check_forward_options(o);
    return resolved(st, in, o, cache);
}

LayerCall validate_layer_call(const LayerState& st, const AttentionInputs& in_arg, const AttentionOutputs& out,
                              const ForwardOptions& opt_arg, const Workspace* workspace, const KVCache* cache) {
    if (cache != nullptr) check_cache_call(st, in_arg, out, opt_arg, *cache);
    const AttentionInputs in = resolve_key_value(in_arg);
    const ForwardOptions opt = effective_options(st, opt_arg, cache);
    check_forward_options(opt);  // first: later checks use need_weights
    check_views(in, out.output);
    const std::size_t B = in.query.batch, Lq = in.query.rows, Lk = in.key.rows, E = st.E;
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
    check_output_apart(in, out.output);
    check_masks(in.key_padding_mask, in.attn_mask, B, st.H, Lq, Lk);
    LayerCall c = resolved(st, in, opt, cache);
    c.out = out;
    if (st.rope && cache == nullptr) check_positions(c);  // with a cache: positions are lengths below the capacity
    const std::size_t output_elements = batch_elements(out.output);
    check_output_apart_from_masks(out.output.data, output_elements, in.key_padding_mask, in.attn_mask);
    c.weight_count = check_attn_weights(c, st.H);
    if (workspace_overlaps(workspace,
                           {span(in.query.data, batch_elements(in.query)), span(in.key.data, batch_elements(in.key)),
                            span(in.value.data, batch_elements(in.value)), span(out.output.data, output_elements),
                            span(out.attn_weights, c.weight_count)},
                           in.key_padding_mask, in.attn_mask))
        fail("workspace overlaps an input, an output or a mask");
    if (cache != nullptr && workspace_overlaps(workspace, {span(static_cast<const unsigned char*>(cache->key_storage()), cache->bytes())}, {}, {}))
        fail("workspace overlaps the KV cache");
    if (opt.backend == Backend::scalar) {
        // The reference's buffers: [Lq|Lk, E] projections and [Lq, Lk] scores (inputs may repeat rows
        // with stride 0, so Lq and Lk are not bounded by real memory).
        checked_extent("the scalar backend's projections", static_cast<const float*>(nullptr),
                       checked_madd(Lq, st.q_width(), checked_madd(Lk, 2 * st.kv_width(), 0, "the scalar backend's", "projections"),
                                    "the scalar backend's", "projections"));
        checked_extent("the scalar backend's scores", static_cast<const float*>(nullptr),
                       checked_madd(Lq, Lk, 0, "the scalar backend's", "scores"));
    }
    return c;
}

HalfAttentionInputs validate_half_call(const HalfAttentionInputs& in_arg, const HalfAttentionOutputs& out) {
    if (in_arg.type != DataType::bf16 && in_arg.type != DataType::f16)
        fail("HalfAttentionInputs::type must be bf16 or f16, not " + std::string(data_type_name(in_arg.type)));
    const HalfAttentionInputs in = resolve_key_value(in_arg);
    check_views(in, out.output);
    check_output_apart(in, out.output);
    return in;
}

SdpaCall describe_sdpa_call(const SdpaInputs& in, const SdpaOptions& opt) {
    check_common_options(opt.impl, opt.backend, opt.threads);
    check_heads_size("query", in.query);
    check_heads_size("key", in.key);
    check_heads_size("value", in.value);
    check_group(in.query.heads, in.key.heads);
    return resolved(in, opt);
}

void check_modifiers(const ScoreModifiers& m, std::size_t H, const char* owner) {
    const std::string o(owner);
    if (m.window_left < -1) fail(o + ".window_left " + std::to_string(m.window_left) + " is below -1 (-1: unbounded)");
    if (m.window_right < -1) fail(o + ".window_right " + std::to_string(m.window_right) + " is below -1 (-1: unbounded)");
    if (!std::isfinite(m.softcap) || m.softcap < 0.0f)
        fail(o + ".softcap " + float_str(m.softcap) + " is not a finite value > 0 (0: off)");
    if (m.softcap > 0.0f && m.softcap < std::numeric_limits<float>::min())  // the kernels multiply by 1 / c
        fail(o + ".softcap " + float_str(m.softcap) + " is below the smallest normal float 1.17549e-38 (the kernels multiply by 1 / softcap)");
    auto check_heads_values = [&](const float* v, const char* name) {
        if (v == nullptr) return;
        checked_extent(name, v, H);
        for (std::size_t h = 0; h < H; ++h)
            if (!std::isfinite(v[h]))
                fail(o + "." + name + "[" + std::to_string(h) + "] = " + std::to_string(v[h]) + " is not finite");
    };
    check_heads_values(m.sinks, "sinks");
    check_heads_values(m.alibi_slopes, "alibi_slopes");
}

SdpaCall validate_sdpa_call(const SdpaInputs& in, const Heads& out, const SdpaOptions& opt, const Workspace* workspace) {
    check_common_options(opt.impl, opt.backend, opt.threads);
    check_causal_alignment(opt.causal_alignment);
    check_modifiers(opt.modifiers, in.query.heads, "options.modifiers");
    check_heads("query", in.query);
    check_heads("key", in.key);
    check_heads("value", in.value);
    check_heads("output", out);
    check_output_rows_disjoint(out);
    SdpaCall c = resolved(in, opt);
    if (in.key.batch != c.B || in.value.batch != c.B)
        fail("key " + heads_shape(in.key) + " and value " + heads_shape(in.value) + " must have query's batch " + std::to_string(c.B));
    if (in.key.dim != c.d || in.value.dim != c.d)
        fail("key " + heads_shape(in.key) + " and value " + heads_shape(in.value) + " must have query's head dim " + std::to_string(c.d));
    if (in.value.heads != c.Hkv || in.value.rows != c.Lk)
        fail("value " + heads_shape(in.value) + " must have key's heads and length " + heads_shape(in.key));
    check_group(c.H, c.Hkv);
    if (out.batch != c.B || out.heads != c.H || out.rows != c.Lq || out.dim != c.d)
        fail("output is " + heads_shape(out) + " but must be [B, H, Lq, d] = " + heads_shape(in.query));
    check_masks(in.key_padding_mask, in.attn_mask, c.B, c.H, c.Lq, c.Lk);
    const std::size_t out_elements = heads_extent("output", out);
    for (const auto& [name, v] : {std::pair<const char*, const ConstHeads*>{"query", &in.query}, {"key", &in.key}, {"value", &in.value}})
        if (overlaps(out.data, out_elements, v->data, heads_extent(name, *v))) fail(std::string("output overlaps ") + name);
    check_output_apart_from_masks(out.data, out_elements, in.key_padding_mask, in.attn_mask);
    c.scale = opt.scale ? *opt.scale : 1.0f / std::sqrt(static_cast<float>(c.d));
    if (!std::isfinite(c.scale)) fail("scale " + float_str(c.scale) + " is not finite");
    if (workspace_overlaps(workspace,
                           {span(in.query.data, heads_extent("query", in.query)), span(in.key.data, heads_extent("key", in.key)),
                            span(in.value.data, heads_extent("value", in.value)), span(out.data, out_elements)},
                           in.key_padding_mask, in.attn_mask))
        fail("workspace overlaps an input, the output or a mask");
    if (opt.backend == Backend::scalar)
        // The reference's scores [Lq, Lk] (inputs may repeat rows with stride 0, so Lq and Lk are not bounded
        // by real memory).
        checked_extent("the scalar backend's scores", static_cast<const float*>(nullptr),
                       checked_madd(c.Lq, c.Lk, 0, "the scalar backend's", "scores"));
    return c;
}

void validate_step_plan(const LayerState& st, const PagedKVCache& cache, int threads) {
    check_self_attention(st, "forward_step");
    check_cache_heads(cache, st);
    check_threads(threads);
}

StepReservation validate_step_call(const LayerState& st, const StepPlanData& p, const ConstMatrix& x, const Matrix& y,
                                   const PagedKVCache& cache, Backend backend) {
    check_backend(backend);
    if (!(StepLayerShape::of(st) == p.layer))
        fail("the step plan was made for a layer of embed_dim " + std::to_string(p.layer.E) + ", " + std::to_string(p.layer.H) +
             " heads, " + std::to_string(p.layer.Hkv) + " KV heads of dim " + std::to_string(p.layer.d) + " (RoPE dims " +
             std::to_string(p.layer.rope_dims) + ", compute " + std::string(data_type_name(p.layer.compute)) +
             "): this layer differs");
    check_cache_heads(cache, st);  // the layer's shape is the plan's
    check_packed_rows(x, y, p.step.query_starts[p.step.sequences], st.E, "T = sum of q_lens");
    if (y.rows != 0) {  // the cache's pool is writable memory a caller can reach (pool()): x and y must be apart from it
        const PagedKVPool& pool = cache.pool();
        const std::size_t pool_bytes = check_caller_pool(pool);
        if (overlaps_pool(pool, pool_bytes, y.data, matrix_elements(y))) fail("y overlaps the paged KV cache's pool");
        if (overlaps_pool(pool, pool_bytes, x.data, matrix_elements(x))) fail("x overlaps the paged KV cache's pool");
    }
    // First the reservation (allocates, changes nothing): its checks that the cache holds each sequence at
    // its past length are what the window check below relies on.
    StepReservation r = PagedKVCacheAccess::reserve_step(cache, p.step);
    // Released blocks (PagedKVCache::release_before) must lie before every new query's window.
    const ScoreModifiers mods = st.modifiers();
    for (std::size_t i = 0; i < p.step.sequences; ++i) {
        const std::size_t id = p.step.ids[i], released = cache.released_tokens(id);
        const std::size_t past = p.step.key_lengths[i] - (p.step.query_starts[i + 1] - p.step.query_starts[i]);
        if (released == 0) continue;
        if (mods.window_left < 0 || static_cast<unsigned long long>(mods.window_left) > past - released)
            fail("sequence " + std::to_string(id) + " released the blocks of its first " + std::to_string(released) +
                 " tokens, but this layer's window " +
                 (mods.window_left < 0 ? std::string("is unbounded on the left")
                                       : "reaches back to position " + std::to_string(static_cast<long long>(past) - mods.window_left)));
    }
    return r;
}

std::size_t validate_varlen_call(const LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* seq_starts,
                                 std::size_t sequences, int threads, Backend backend) {
    check_self_attention(st, "forward_varlen");
    check_threads(threads);
    check_backend(backend);
    if (seq_starts == nullptr) fail("seq_starts must not be null");
    if (seq_starts[0] != 0) fail("seq_starts[0] is " + std::to_string(seq_starts[0]) + " but must be 0");
    for (std::size_t i = 0; i < sequences; ++i)
        if (seq_starts[i + 1] < seq_starts[i])
            fail("seq_starts[" + std::to_string(i + 1) + "] = " + std::to_string(seq_starts[i + 1]) + " is below seq_starts[" +
                 std::to_string(i) + "] = " + std::to_string(seq_starts[i]) + ": starts must not decrease");
    const std::size_t T = seq_starts[sequences];
    check_packed_rows(x, y, T, st.E, "T = seq_starts[sequences]");
    return T;
}

}  // namespace mha::detail
