// The scalar reference: plain loops that read like the math. It defines every result the library
// computes; the SIMD backend is tested against it. Compiled without auto-vectorization.
// Preconditions (checked by the public API, not here): shapes agree, pointers valid, no overlap
// unless stated.
#pragma once
#include <cstddef>

#include "mha/attention.hpp"
#include "mha/view.hpp"
#include "../core/element_format.hpp"

namespace mha::reference {

// C = alpha·op(A)·op(B) + beta·C; beta == 0 does not read C.
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept;

// y = x·Wᵀ + bias for y [rows, n], x [rows, k], W [n, k], bias [n]. f32: reference::gemm, then the bias
// added in float. bf16: x and W rounded to bfloat16 (round_to_bf16), each Σ x·w + bias summed in double and
// rounded once to float. y must not overlap x or W.
void linear(ConstMatrix x, ConstMatrix w, const float* bias, Matrix y, DataType compute);

// Every element of x replaced by round_to_bf16 of itself.
void round_to_bf16(Matrix x) noexcept;

// In place on x[0, n): z_j = scale·x_j + mask0_j + mask1_j for j < n_valid (masks may be null), and
// z_j = -inf where a mask entry is -inf (a masked entry's x does not matter, even NaN);
// x_j = exp(z_j − max z) / Σ exp(z − max z) for j < n_valid, 0 for j >= n_valid.
// If every z_j is -inf (or n_valid == 0) the whole row becomes 0; if every z_j is -inf or NaN and
// at least one is NaN, entries below n_valid become NaN (a NaN is never mistaken for a masked row).
void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                 const float* mask1) noexcept;

// y = gamma·(z − mean)/sqrt(var + eps) + beta with z = x (+ residual), biased var, two passes,
// accumulated in double with one rounding at the end (a constant row gives exactly beta).
// gamma/beta/residual may be null (ones/zeros/none). y may alias x or residual.
void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept;

// A layer's resolved shape (no zero defaults left: Hkv, d, kdim, vdim and rope->dims set) and its plain
// row-major weights, every bias non-null. compute (AttentionConfig::compute, f32 or bf16): with bf16 the
// inputs, the weights Wq/Wk/Wv/Wo, Q, K and V (after bias and RoPE), the normalized probabilities P (as the
// input of P·V only) and the attention output C are rounded with round_to_bf16, and every product of
// rounded values is accumulated in double and rounded once to float; biases, softmax, RoPE, layernorm fp32.
struct Layer {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0, kdim = 0, vdim = 0;
    std::optional<RopeConfig> rope;
    DataType compute = DataType::f32;
    const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;  // [H·d, E] [Hkv·d, kdim] [Hkv·d, vdim] [E, H·d]
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;  // [H·d] [Hkv·d] [Hkv·d] [E]
    const float *norm_w = nullptr, *norm_b = nullptr;                         // [E] or nullptr (ones / zeros)
    ScoreModifiers mods;                                                      // AttentionConfig::modifiers
};

// Rotates one head row x[0, d) in place as token position `position` (mha/attention.hpp's RopeConfig;
// rope.dims resolved, even, <= d): angles p·θ_k, cos and sin in double.
void rope_row(float* x, const RopeConfig& rope, std::size_t position) noexcept;

// The attention core of mha/sdpa.hpp on projected heads, plain loops: scores, masks (a masked key's score
// is -inf whatever Q·K gave), softmax rows, P·V over the unmasked keys. probs: nullptr or [B, H, Lq, Lk]
// contiguous, receives the probabilities. Inputs validated by the caller. Allocates its own scratch.
// compute bf16: q, k and v are read rounded to bfloat16 (round_to_bf16), the scores q·k and P·V are
// accumulated in double, and P enters P·V normalized and rounded to bfloat16 (probs receives the rounded P).
// mods: the score modifiers of mha/attention.hpp, query i at position i (+ Lk − Lq with bottom_right).
void attention_core(const SdpaInputs& in, const Heads& out, float scale, bool causal, CausalAlignment alignment,
                    float* probs, DataType compute = DataType::f32, const ScoreModifiers& mods = {});

// The layer's steps around attention_core, shared by multihead_attention and cached_attention:
//   project_inputs: Q = xq·Wqᵀ + bq, K = xk·Wkᵀ + bk, V = xv·Wvᵀ + bv (bf16: linear's rounding), with RoPE
//     every head row of Q rotated at q_start + i and of K at k_start + j; bf16: Q, K, V rounded.
//   project_output: bf16: C rounded; y = C·Woᵀ + bo; with norm_eps: y = LayerNorm(y + x).
void project_inputs(const Layer& layer, ConstMatrix xq, ConstMatrix xk, ConstMatrix xv, Matrix Q, Matrix K, Matrix V,
                    std::size_t q_start, std::size_t k_start);
void project_output(const Layer& layer, Matrix C, ConstMatrix x, Matrix y, const std::optional<float>& norm_eps);

// Multi-head attention as documented in mha/attention.hpp. Inputs validated by the caller; key/value
// already resolved (non-null). Allocates its own scratch. Writes out.output (and out.attn_weights if
// requested).
void multihead_attention(const Layer& layer, const AttentionInputs& in, const AttentionOutputs& out,
                         const ForwardOptions& opt);

// One step of incremental decoding (MultiheadAttention::forward with a KVCache), on the cache's rows as
// plain floats: for each sequence b with past[b] holding its n_b cached K and V rows ([Hkv, n_b, d] each,
// contiguous, as the cache stores them widened), the Lq new tokens query[b] are projected, their Q and K rows
// rotated at positions n_b + i, K and V written to new_keys / new_values [B, Lq, Hkv·d] as projected; then
// attention over the n_b + Lq keys (bottom-right causal; the new rows rounded to the cache's element format
// and widened back, fp8 with k_scale / v_scale: what the cache will hold) projected out, and the optional
// post-norm (opt.norm_eps; the other options do not apply). The caller appends new_keys / new_values to its
// cache, which rounds them the same way. Validated by the caller.
// Allocates its own scratch.
struct CachedRows {
    const float* keys = nullptr;    // [Hkv, length, d]
    const float* values = nullptr;  // [Hkv, length, d]
    std::size_t length = 0;
};
void cached_attention(const Layer& layer, ConstBatch query, Batch output, const ForwardOptions& opt,
                      const detail::ElementFormat& format, float k_scale, float v_scale, const CachedRows* past, Batch new_keys,
                      Batch new_values);

}  // namespace mha::reference
