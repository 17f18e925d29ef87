// Multi-head attention with torch.nn.MultiheadAttention semantics (batch_first=True, eval mode:
// no dropout), built once from weights in PyTorch's layout, extended to decoder models (grouped-query
// heads, a head dim of its own, rotary positions). See README.md for an example.
//
//   E = embed_dim, H = num_heads, Hkv = num_kv_heads (H % Hkv == 0, G = H / Hkv), d = head_dim
//   (default E / H; H·d may differ from E), kdim / vdim = key / value features (default E),
//   B = batch, Lq = query length, Lk = key/value length.
//   Q = query·Wqᵀ + bq [Lq, H·d], K = key·Wkᵀ + bk [Lk, Hkv·d], V = value·Wvᵀ + bv [Lk, Hkv·d]
//   (nn.MultiheadAttention's in_proj_weight = [Wq; Wk; Wv] is the case Hkv = H, d = E / H, kdim = vdim = E)
//   With rotary embeddings (AttentionConfig::rope) Q and K rows are rotated at their positions (below).
//   Query head h uses columns [h·d, h·d + d) of Q and KV head h / G of K and V (strided views, no copies):
//     P_h = softmax(Q_h·K_{h/G}ᵀ / sqrt(d) + masks),  C_h = P_h·V_{h/G}  → columns [h·d, h·d + d) of C
//   out = C·Woᵀ + bo (Wo [E, H·d]);  with AttentionConfig::norm_eps set: out = LayerNorm(out + query).
//   A query row whose keys are all masked gets zero probabilities, so its output row is bo
//   (PyTorch gives NaN there).
//   A key masked for a query (a boolean mask entry set, an additive -inf in either mask, or causal
//   j > i) never contributes to that query: its score is -inf whatever Q·K gave (NaN included) and C_h
//   sums p·v over the unmasked keys only, so NaN or ±inf in its key or value row does not matter (as in
//   flash-attention kernels, which skip masked keys; PyTorch gives NaN there). Every backend and path
//   follows this rule, including the fused path's skipped tiles. A NaN score of an unmasked key (NaN in
//   Q or K, or NaN / +inf in an additive mask) makes that query's probabilities NaN on every path.
//   Boolean masks are read in place as bytes (never copied into floats).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "mha/half.hpp"
#include "mha/kernels.hpp"
#include "mha/view.hpp"
#include "mha/workspace.hpp"

namespace mha {

class KVCache;       // mha/kv_cache.hpp
class PagedKVCache;  // mha/paged_kv_cache.hpp
class StepPlan;      // mha/step_plan.hpp
namespace detail {
struct LayerState;  // what a MultiheadAttention owns (weights, packed weights); defined in lib/attention
}  // namespace detail

// Weights in PyTorch's layout, all row-major and contiguous. They are packed (one copy) when the
// attention object is built; the caller's memory may be freed afterwards.
// The input projections come either packed (in_proj_weight, kdim == vdim == E) or separate
// (q/k/v_proj_weight, Hugging Face's q_proj / k_proj / v_proj), never both. Biases: in_proj_bias (q; k; v
// stacked) or any of q/k/v_proj_bias, never both kinds; an absent bias is zeros.
struct AttentionWeights {
    const float* in_proj_weight = nullptr;   // [H·d + 2·Hkv·d, E], rows: Wq (H·d rows), Wk, Wv
    const float* in_proj_bias = nullptr;     // [H·d + 2·Hkv·d] or nullptr
    const float* out_proj_weight = nullptr;  // [E, H·d]. Required.
    const float* out_proj_bias = nullptr;    // [E] or nullptr (zeros)
    const float* norm_weight = nullptr;      // [E] gamma of the post-norm block, nullptr = ones
    const float* norm_bias = nullptr;        // [E] beta of the post-norm block, nullptr = zeros
    const float* q_proj_weight = nullptr;    // [H·d, E]
    const float* k_proj_weight = nullptr;    // [Hkv·d, kdim]
    const float* v_proj_weight = nullptr;    // [Hkv·d, vdim]
    const float* q_proj_bias = nullptr;      // [H·d] or nullptr
    const float* k_proj_bias = nullptr;      // [Hkv·d] or nullptr
    const float* v_proj_bias = nullptr;      // [Hkv·d] or nullptr
};

// Rotary position embedding, applied to Q and K after the bias and before the scores. A token at absolute
// position p: with r rotary dims and θ_k = theta^(−2k/r), k = 0 .. r/2 − 1, each pair (x1, x2) becomes
// (x1·cos(p·θ_k) − x2·sin(p·θ_k), x2·cos(p·θ_k) + x1·sin(p·θ_k)); dims r..d−1 are left as they are.
// half pairs (x_k, x_{k+r/2}) (GPT-NeoX, Hugging Face Llama); interleaved pairs (x_{2k}, x_{2k+1}) (GPT-J,
// Meta's Llama). Angles p·θ_k are computed in double and their cos and sin rounded once to float (the
// scalar reference rounds only the rotated values), so positions up to 2^20 and beyond keep float accuracy.
enum class RopeStyle { half, interleaved };
struct RopeConfig {
    float theta = 10000.0f;       // > 0, finite
    std::size_t dims = 0;         // r: even, <= head_dim; 0 means head_dim
    RopeStyle style = RopeStyle::half;
};

// Score modifiers of today's model families. Query i sits at position p_i (i, or i + Lk − Lq with
// bottom-right alignment; with a KV cache or a paged step: the cached length + i) and key j at j. For query
// head h, on the scaled score s = scale·q_i·k_j, in this order:
//   softcap c > 0: s ← c·tanh(s / c) (Gemma 2's attn_logit_softcapping), before ALiBi and the masks. The
//     SIMD kernels compute c·tanh(s·(1/c)) with xsimd's tanh, within 2 ulp (measured 1.83 on a dense sweep: tests/test_score_modifiers.cpp);
//   ALiBi slope m_h (alibi_slopes [H]): s ← s − m_h·(p_i − j) (BLOOM, MPT; alibi_standard_slopes(H) gives
//     BLOOM's slopes; BLOOM's per-key bias m_h·j gives the same softmax except beside a sink, where this relative form holds);
//   sliding window (window_left, window_right): key j is visible only when p_i − left <= j <= p_i + right
//     (−1: unbounded on that side; with causal, right = 0 is implied). Hugging Face's `sliding_window` = w
//     (Mistral: a query sees itself and w − 1 keys before) is left = w − 1, right = 0 with causal;
//     FlashAttention's window_size (wl, wr) is left = wl, right = wr. Keys outside the window are masked like
//     causal ones (never contribute, even NaN) and the SIMD paths never read whole key tiles outside it;
//   the masks and causal rule (a masked key's score is -inf);
//   sink σ_h (sinks [H]): joins each row's softmax denominator and adds no value (gpt-oss):
//     P_ij = exp(s_ij − m) / (Σ_k exp(s_ik − m) + exp(σ_h − m)), m = max(max_k s_ik, σ_h);
//     a row whose keys are all masked gives zeros; returned attention weights sum to less than 1.
// All values must be finite (softcap > 0 and normal, >= 2^-126: the kernels multiply by 1 / c); window sides
// >= −1. The pointers are read during the call (SdpaOptions) or copied at construction (AttentionConfig), like the weights.
struct ScoreModifiers {
    long long window_left = -1, window_right = -1;
    float softcap = 0.0f;                  // 0: off
    const float* sinks = nullptr;          // [H] or nullptr
    const float* alibi_slopes = nullptr;   // [H] or nullptr
    bool any() const noexcept {
        return window_left >= 0 || window_right >= 0 || softcap != 0.0f || sinks != nullptr || alibi_slopes != nullptr;
    }
    bool window() const noexcept { return window_left >= 0 || window_right >= 0; }
};
// BLOOM's ALiBi slopes for H heads: with n = the largest power of two <= H, slopes 2^(−8k/n) for k = 1..n,
// then (H > n) 2^(−4(2k − 1)/n) for k = 1..H − n.
std::vector<float> alibi_standard_slopes(std::size_t heads);

// The shape of a layer. Zeros take the defaults.
struct AttentionConfig {
    std::size_t embed_dim = 0;     // E. Required.
    std::size_t num_heads = 0;     // H. Required.
    std::size_t num_kv_heads = 0;  // Hkv; 0: H. H % Hkv == 0.
    std::size_t head_dim = 0;      // d; 0: E / H (then E % H == 0)
    std::size_t kdim = 0;          // key features; 0: E
    std::size_t vdim = 0;          // value features; 0: E
    std::optional<RopeConfig> rope;
    // Element type of the GEMM operands (the SIMD backend). f32: as given. bf16: the inputs, weights, Q, K, V,
    // the softmax probabilities P (only as the input of P·V) and the attention output (the input of the
    // output projection) are rounded to bfloat16 (nearest even) and multiplied with fp32 accumulation;
    // biases, softmax, its running state, RoPE and layernorm stay fp32. With AVX512_BF16 (Isa::avx512_bf16)
    // the products run on vdpbf16ps; otherwise the rounded values go through the fp32 kernels (same
    // roundings; the weights are held and read as bf16 either way, half the bytes of fp32). The scalar
    // backend rounds at the same points and accumulates in double.
    // f16 is not a compute type (it is a KV cache element type).
    DataType compute = DataType::f32;
    // The post-norm block of a BERT layer (seed 000), with the weights' norm_weight / norm_bias: when set,
    // out = LayerNorm(out + query; gamma, beta, eps), eps inside the square root (TF style). Finite and >= 0
    // (checked at construction). The residual is the query row. ForwardOptions::norm_eps (deprecated) overrides it.
    std::optional<float> norm_eps;
    // Sliding window, softcap, sinks and ALiBi of every forward of this layer (ScoreModifiers; sinks and
    // slopes [num_heads], copied at construction).
    ScoreModifiers modifiers;
};

// Causal alignment: top_left masks key j for query i when j > i; bottom_right when j > i + Lk − Lq
// (new tokens at the end of a sequence whose earlier tokens are the first keys).
enum class CausalAlignment { top_left, bottom_right };

enum class MaskType { none, boolean, additive };

// A mask, contiguous and row-major. boolean: a nonzero byte means "not allowed" (-inf);
// additive: the float is added to the score. Shapes (rank 2 or 3):
//   key_padding_mask: [B, Lk];  attn_mask: [Lq, Lk] (all batches and heads) or [B·H, Lq, Lk]
//   (index b·H + h over the H query heads, as in PyTorch).
struct MaskView {
    MaskType type = MaskType::none;
    const std::uint8_t* bools = nullptr;  // type == boolean
    const float* values = nullptr;        // type == additive
    int rank = 0;
    std::size_t shape[3] = {0, 0, 0};

    static MaskView boolean(const std::uint8_t* p, std::size_t d0, std::size_t d1) { return {MaskType::boolean, p, nullptr, 2, {d0, d1, 0}}; }
    static MaskView boolean(const std::uint8_t* p, std::size_t d0, std::size_t d1, std::size_t d2) { return {MaskType::boolean, p, nullptr, 3, {d0, d1, d2}}; }
    static MaskView additive(const float* p, std::size_t d0, std::size_t d1) { return {MaskType::additive, nullptr, p, 2, {d0, d1, 0}}; }
    static MaskView additive(const float* p, std::size_t d0, std::size_t d1, std::size_t d2) { return {MaskType::additive, nullptr, p, 3, {d0, d1, d2}}; }
    bool present() const { return type != MaskType::none; }
};

enum class NeedWeights { none, averaged, per_head };
// The attention algorithm the SIMD backend may use (ForwardOptions::impl, SdpaOptions::impl):
//   materialized: scores Lq×Lk per (query head, 64 query rows) task and a plain softmax;
//   fused: the G = H / Hkv query heads of a KV head stacked against one pass over its keys, tiled online
//     softmax, O(Lq·d) memory (needs no weights);
//   automatic: fused when heads share KV heads (G > 1) or the scores would be large (Lk >= 1024), else
//     materialized.
// Few queries: with fused or automatic, a call with Lq <= 16 and G·Lq <= 128 (a decode step, a short chunk)
// takes the decode path instead (the G·Lq stacked query rows against splits of keys read in place: 512 fp32
// keys, 2048 of 16 or 8 bits, merged exactly: flash-decoding) — AttentionPath::decode; ask
// MultiheadAttention::path / sdpa_path.
// need_weights always materializes. The scalar backend always materializes (AttentionPath::scalar).
enum class Algorithm { automatic, materialized, fused };
// Deprecated: the old name of Algorithm, kept for one release (Impl::fused is Algorithm::fused).
using Impl = Algorithm;

// The path a call takes, as decided before it runs (MultiheadAttention::path, sdpa_path):
//   scalar: the scalar backend (Backend::scalar: the plain-loop reference);
//   materialized / grouped / decode: the SIMD attention core's paths: materialized scores per (query head,
//   64 query rows); grouped: the fused algorithm (G query heads against one pass over their keys, tiled
//   online softmax); decode: few queries against key splits read in place (see Algorithm).
enum class AttentionPath { scalar, materialized, grouped, decode };
// "scalar", "materialized", "grouped", "decode" (the `mha bench` JSON field "path"); "?" for other values.
std::string_view attention_path_name(AttentionPath path) noexcept;

struct ForwardOptions {
    bool causal = false;                      // key j masked for query i when j > i (top-left aligned)
    CausalAlignment causal_alignment = CausalAlignment::top_left;
    // Rotary positions (layers built with a RopeConfig): key row j of sequence b is at start_b + j and query
    // row i at start_b + i, or at start_b + Lk − Lq + i with bottom_right alignment (the queries are the last
    // Lq tokens of the key sequence, as with the causal rule; start_b >= Lq − Lk then). start_b = positions[b]
    // when positions is set ([B]), else position_offset; start_b + max(Lq, Lk) <= 2^53. The alignment applies
    // to the positions whether or not causal is set.
    std::size_t position_offset = 0;
    const std::size_t* positions = nullptr;
    NeedWeights need_weights = NeedWeights::none;
    // Deprecated (kept for one release): the post-norm's eps belongs to the layer, AttentionConfig::norm_eps.
    // When set it overrides the layer's for this call (and turns the post-norm on for a layer built without one).
    std::optional<float> norm_eps;
    Backend backend = Backend::simd;
    int threads = 0;                          // 0: all cores; otherwise the number of threads to use
    Algorithm impl = Algorithm::automatic;    // the SIMD backend's algorithm (see Algorithm)
};

// Layouts: every tensor is a BatchView with its own row and batch strides, so both PyTorch layouts
// work without copies: batch_first [B, L, E] is BatchView(p, B, L, E) (row stride E, batch stride L·E);
// sequence-first [L, B, E] (batch_first=False, PyTorch's default) is BatchView(p, B, L, E, B·E, E).
// Inputs may use any strides (rows may overlap or repeat). The output's rows must not overlap each
// other (with the smaller stride s over n entries: s >= E and the larger stride >= (n − 1)·s + E).
// Self-attention is key = value = query (the same views): say so with AttentionInputs::self_attention(query).
// Legacy shorthand, still accepted: key.data == nullptr means key = query, value.data == nullptr value = key.
// Zero sizes (as PyTorch): B = 0 or Lq = 0 is validated, then computes and writes nothing; Lk = 0 makes every
// query row fully masked (output bo, then the post-norm). A view, mask or attn_weights with no elements may be
// null, except key and value (null means absent, above). Feature counts are never 0. Such calls take
// AttentionPath::scalar and need no workspace.
// With a KV cache, key and value must be absent (the cache holds the keys; the new tokens are the query).
struct AttentionInputs {
    ConstBatch query;            // [B, Lq, E]
    ConstBatch key;              // [B, Lk, kdim]; data == nullptr (legacy): key = query
    ConstBatch value;            // [B, Lk, vdim]; data == nullptr (legacy): value = key
    MaskView key_padding_mask;   // optional, [B, Lk]
    MaskView attn_mask;          // optional, [Lq, Lk] or [B·H, Lq, Lk]

    // Self-attention over query [B, L, E] (needs kdim == vdim == E): key and value are the query's own views,
    // which the layer detects (Q, K and V are projected together from one read of the query). Masks as above
    // with Lq = Lk = L.
    static AttentionInputs self_attention(ConstBatch query, MaskView key_padding_mask = {}, MaskView attn_mask = {}) {
        return {query, query, query, key_padding_mask, attn_mask};
    }
};

struct AttentionOutputs {
    Batch output;                   // [B, Lq, E]; must not overlap the inputs
    float* attn_weights = nullptr;  // contiguous; averaged: [B, Lq, Lk]; per_head: [B, H, Lq, Lk];
                                    // must not overlap the inputs or the output
};

// The attention core's operands (mha/sdpa.hpp): projected heads and the masks over them.
struct SdpaInputs {
    ConstHeads query;            // [B, H, Lq, d]
    ConstHeads key;              // [B, Hkv, Lk, d]
    ConstHeads value;            // [B, Hkv, Lk, d]
    MaskView key_padding_mask;   // optional, [B, Lk]
    MaskView attn_mask;          // optional, [Lq, Lk] or [B·H, Lq, Lk]
};

// Activations held in 16-bit floats (mha/half.hpp) where the caller keeps them: query/key/value and the
// output as uint16 views of bfloat16 or float16 bits (`type`), strided as AttentionInputs. The forward
// widens the inputs exactly into fp32 copies (leased from the scratch cache, like the workspace), runs as
// the layer is configured (AttentionConfig::compute f32 or bf16), and rounds the output to `type` (nearest
// even). Attention weights, when asked for, are fp32.
struct HalfAttentionInputs {
    DataType type = DataType::bf16;           // bf16 or f16
    BatchView<const std::uint16_t> query;     // [B, Lq, E]
    BatchView<const std::uint16_t> key;       // [B, Lk, kdim]; data == nullptr: key = query
    BatchView<const std::uint16_t> value;     // [B, Lk, vdim]; data == nullptr: value = key
    MaskView key_padding_mask, attn_mask;
};
struct HalfAttentionOutputs {
    BatchView<std::uint16_t> output;  // [B, Lq, E], the inputs' type; must not overlap them
    float* attn_weights = nullptr;
};

class MultiheadAttention {
public:
    // nn.MultiheadAttention: in_proj_weight [3E, E], d = E / H. Throws mha::invalid_argument if embed_dim
    // or num_heads is 0, embed_dim % num_heads != 0, or a required weight pointer is null.
    MultiheadAttention(const AttentionWeights& weights, std::size_t embed_dim, std::size_t num_heads);
    // Any configuration; throws mha::invalid_argument naming the field for an inconsistent one (H % Hkv,
    // odd or too many rotary dims, both packed and separate weights, a missing weight, ...).
    MultiheadAttention(const AttentionWeights& weights, const AttentionConfig& config);
    ~MultiheadAttention();
    MultiheadAttention(MultiheadAttention&&) noexcept;
    MultiheadAttention& operator=(MultiheadAttention&&) noexcept;

    // 0 on a moved-from object (whose forward throws mha::invalid_argument).
    std::size_t embed_dim() const noexcept;
    std::size_t num_heads() const noexcept;
    std::size_t head_dim() const noexcept;
    std::size_t num_kv_heads() const noexcept;
    std::size_t kdim() const noexcept;
    std::size_t vdim() const noexcept;

    // Computes the outputs. Validates every argument first and throws mha::invalid_argument without
    // writing anything. Safe to call concurrently on one object (it is not modified).
    // Memory: the scratch of mha/workspace.hpp, leased from the process-wide scratch cache before any
    // work starts (std::bad_alloc, if it comes, comes before any output is written).
    void forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& options = {}) const;
    // The same in the caller's workspace, which must hold workspace_bytes(in, options) bytes (else
    // mha::invalid_argument): the SIMD backend then allocates nothing. One call at a time per workspace.
    void forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& options,
                 Workspace& workspace) const;
    // Incremental decoding with a KV cache (mha/kv_cache.hpp; its batch, kv_heads and head_dim must be this
    // layer's): in.query [B, Lq, E] holds the next Lq tokens of each of the cache's B sequences (in.key and
    // in.value must be absent). They are projected, rotated at positions cache.length(b) + i, appended to
    // the cache, and attend over cache.length(b) + Lq keys with causal bottom-right alignment: options.causal
    // and causal_alignment do not apply, and options must not set position_offset, positions, masks or
    // need_weights (mha::invalid_argument). Past the capacity: mha::invalid_argument naming the sequence, its
    // length and the capacity, nothing written (cache included). Lengths advance only when the call succeeds;
    // Lq = 0 appends nothing (the query's batch must still be the cache's).
    // Chunking is invisible up to float rounding: a prompt fed in one call, in chunks, or token by token gives
    // the same outputs within the bound of tests/test_kv_cache.cpp with fp32 compute (not bitwise: the
    // projection and attention paths block the work differently for different Lq). With bf16 compute the paths
    // also round P at different points (docs/bf16-accuracy.md), so they agree only within bf16's error bound.
    void forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& options, KVCache& cache) const;
    void forward(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& options, KVCache& cache,
                 Workspace& workspace) const;
    std::size_t workspace_bytes(const AttentionInputs& in, const ForwardOptions& options, const KVCache& cache) const;
    // One serving step over a paged cache (mha/paged_kv_cache.hpp; its kv_heads and head_dim must be this
    // layer's, the layer self-attention: kdim = vdim = E): x [T, E] holds the next q_lens[i] tokens of sequence
    // seq_ids[i] for i < sequences, packed in that order (T = Σ q_lens); y [T, E] (not overlapping x) gets
    // their outputs. Each token is projected (one pass over the weights for all T), rotated at its position in
    // its sequence, its K / V written into the cache, and attends causally over its sequence's keys. Decode
    // tokens (q = 1) and prefill chunks mix freely. Errors (mha::invalid_argument, nothing changed: no row,
    // length or output written): an id not in the cache or given twice, q_lens[i] = 0, T != Σ q_lens, shapes,
    // and a pool short of blocks (the message names the blocks needed and free). Lengths advance only when
    // the step succeeds. Results are batch invariant (see mha/paged_kv_cache.hpp). threads: 0 = all cores.
    // backend: Backend::scalar runs each sequence alone through the scalar reference of cached decoding (what
    // forward(..., KVCache&) with Backend::scalar computes for the same rows), after the same validation and
    // block reservation; every output and row is computed before anything is written (threads then unused).
    void forward_step(const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const std::size_t* seq_ids,
                      const std::size_t* q_lens, std::size_t sequences, int threads = 0, Backend backend = Backend::simd) const;
    // A batch of independent sequences of different lengths without padding or a cache (flash-attention's
    // varlen call; mha.torch runs nested tensors here): x [T, E] holds sequence i's tokens at rows
    // [seq_starts[i], seq_starts[i + 1]) for i < sequences (seq_starts [sequences + 1]: 0 = seq_starts[0] <=
    // seq_starts[1] <= ... = T; empty sequences allowed); y [T, E] (not overlapping x) gets the outputs. The
    // layer must be self-attention (kdim = vdim = E). Each sequence attends over its own tokens only: all of
    // them, or with causal those at or before each query; RoPE positions restart at 0 in each sequence. All T
    // tokens are projected in one pass over the weights. Batch invariant: a sequence's rows are bitwise those
    // of forward on that sequence alone ([1, L, E], the same causal flag), whatever sequences are beside it,
    // in any order, with any thread count. mha::invalid_argument (nothing written) for bad shapes or starts.
    // backend: Backend::scalar runs each sequence alone through the scalar reference (forward with
    // Backend::scalar on [1, L, E]), one after the other, after the same validation, into a buffer copied to y
    // at the end (a failure, std::bad_alloc included, writes nothing).
    void forward_varlen(const ConstMatrix& x, const Matrix& y, const std::size_t* seq_starts, std::size_t sequences,
                        bool causal = false, int threads = 0, Backend backend = Backend::simd) const;
    // The same step given its plan (mha/step_plan.hpp), made once for all layers of a model: the sequences
    // are the plan's, x and y [plan.tokens(), E]. Also refused (nothing changed): a plan made for a layer of
    // another configuration, or for a cache state this cache is not in (another block size, element type, KV
    // heads or head dim, a sequence missing or at another length: e.g. this cache already took the step).
    // backend as above.
    void forward_step(const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const StepPlan& plan,
                      Backend backend = Backend::simd) const;
    // The same computations on 16-bit activations (HalfAttentionInputs above); the cache overload appends the
    // new tokens as the fp32 one does.
    void forward(const HalfAttentionInputs& in, const HalfAttentionOutputs& out, const ForwardOptions& options = {}) const;
    void forward(const HalfAttentionInputs& in, const HalfAttentionOutputs& out, const ForwardOptions& options,
                 KVCache& cache) const;
    // Bytes of workspace a forward with these inputs' shapes (only their sizes and whether key/value are the
    // query are read) and options needs; 0 for the scalar backend. With options.threads == 0 it depends on
    // the arena the caller is in (all cores outside any): ask from where forward will run.
    std::size_t workspace_bytes(const AttentionInputs& in, const ForwardOptions& options = {}) const;
    // Bytes of weights this object holds: the packed projections (one copy each, panel padding included, 2 bytes
    // per weight with bf16 compute; on AVX512_BF16 also the bf16 kernels' panels), the biases, the norm
    // parameters and RoPE's frequency table. 0 on a moved-from object.
    std::size_t weight_bytes() const noexcept;
    // Bytes of packed weights and biases one SIMD forward reads at the current ISA cap (what a decode step
    // streams from memory): one packing of the projections, 2 bytes per weight with bf16 compute, 4 with fp32.
    std::size_t weight_bytes_read() const noexcept;

    // The path forward(in, out, options) takes (AttentionPath): scalar for the scalar backend, else the SIMD
    // core's path for these shapes (only the sizes of in and whether key/value are the query are read) and
    // options. Validates as workspace_bytes does (mha::invalid_argument).
    AttentionPath path(const AttentionInputs& in, const ForwardOptions& options = {}) const;
    // The same for forward(in, out, options, cache): the core attends over the longest sequence's keys after
    // the append (its cached length + Lq).
    AttentionPath path(const AttentionInputs& in, const ForwardOptions& options, const KVCache& cache) const;

private:
    void run(const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& options, Workspace* workspace,
             KVCache* cache = nullptr) const;
    friend class StepPlan;  // plans from the layer's configuration
    std::unique_ptr<detail::LayerState> state_;
};

}  // namespace mha
