// Double-precision oracles for the decoder surface of issue 12, with propagated first-order error bounds in
// the style of tests/attention_test_util.hpp (which covers nn.MultiheadAttention only: Hkv = H, d = E / H,
// packed weights, top-left causal, no RoPE):
//   core_double   the attention core (mha::scaled_dot_product_attention): grouped-query heads (query head h
//                 uses KV head h / (H / Hkv)), any scale, key padding / attn masks, causal top-left or
//                 bottom-right, on dense double tensors that carry their own error bounds (0 for the SDPA
//                 target, whose inputs are exact floats; the projection errors for the layer).
//   layer_double  MultiheadAttention built from an AttentionConfig: Hkv, head_dim with H·d != E, kdim / vdim,
//                 RoPE (half / interleaved, r <= d rotary dims) at start_b + i (bottom-right: start_b + Lk − Lq
//                 + i), output projection [E, H·d], post-norm (with the float-layernorm term of
//                 attention_oracle.hpp's add_float_layernorm_bound).
// Bounds (u = 2^-24; on top of attention_test_util.hpp's list):
//   RoPE         y1 = x1·c − x2·s, y2 = x2·c + x1·s with c = cos(a), s = sin(a) of the angle a = p·θ_k that
//                mha/attention.hpp documents (computed in double, as both backends do, so the oracle uses the
//                very same double angle): |Δy1| <= |c||Δx1| + |s||Δx2| + 3u·(|x1 c| + |x2 s|) (c and s rounded
//                to float, two products, one sum; the scalar backend rounds once), likewise y2. |c|, |s| <= 1,
//                so the magnitudes the score bound uses are the rotated values'.
//   scores       s = σ·Σ q·k: (d + 3)·u·|σ|·Σ|q||k| + |σ|·Σ(|Δq||k| + |q||Δk|) (σ the float scale; 1/sqrt(d)
//                rounded in float by the library for the default costs the 2u of the "+ 3").
//   exp underflow  the SIMD exp flushes below e^-87.9 (FLT_MIN absolute per probability, the softmax sum is
//                >= 1): + 4·Lk·FLT_MIN·max|v| per context element (and its image through the output
//                projection for the layer).
// Tolerances returned are c = 2 times the bound (the factor covers the second-order terms), as in
// attention_test_util.hpp. Compiled in its own TU without libFuzzer's coverage instrumentation.
#pragma once
#include <cstddef>
#include <optional>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"

namespace fuzz_oracle {

// Dense double tensors with their error bounds: q [B, H, Lq, d], k and v [B, Hkv, Lk, d] (row-major).
// Masks are read through the views (mha/attention.hpp's shapes). A key masked by a boolean entry, an
// additive -inf or the causal rule never contributes; its k and v values are not read (may be NaN).
struct CoreInput {
    std::size_t B = 0, H = 0, Hkv = 0, Lq = 0, Lk = 0, d = 0;
    std::vector<double> q, eq, k, ek, v, ev;
    double scale = 1.0;
    mha::MaskView key_padding_mask, attn_mask;
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
};

struct CoreExpected {
    std::vector<double> out, out_bound;      // [B, H, Lq, d]; first-order bounds (not yet times c)
    std::vector<double> probs, probs_bound;  // [B, H, Lq, Lk]
    double underflow = 0.0;                  // 4·Lk·FLT_MIN·max|v| (absolute, per output element)
};

CoreExpected core_double(const CoreInput& in);

// The SDPA target's expectation from the library's own views (exact float inputs; scale: the float given, or
// 1/√d exactly for the default, whose float rounding the bound covers): out [B, H, Lq, d] and
// out_tol (c·bound + the underflow term) contiguous.
struct SdpaExpected {
    std::vector<double> out, out_tol;
};
SdpaExpected sdpa_double(const mha::SdpaInputs& in, double scale, bool causal, mha::CausalAlignment alignment);

// A decoder layer with contiguous weights and inputs.
struct LayerProblem {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0, kdim = 0, vdim = 0, B = 0, Lq = 0, Lk = 0;
    std::vector<float> wq, wk, wv, wo;           // [H·d, E] [Hkv·d, kdim] [Hkv·d, vdim] [E, H·d]
    std::vector<float> bq, bk, bv, bo;           // empty: zeros
    std::vector<float> norm_w, norm_b;           // empty: not given
    std::vector<float> query, key, value;        // [B, Lq, E] [B, Lk, kdim] [B, Lk, vdim]; empty: query / key
    mha_test::Mask key_padding_mask, attn_mask;
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    std::optional<mha::RopeConfig> rope;         // dims resolved (> 0)
    std::size_t position_offset = 0;
    std::vector<std::size_t> positions;          // [B] or empty (position_offset)
    std::optional<float> norm_eps;

    const float* key_data() const { return key.empty() ? query.data() : key.data(); }
    const float* value_data() const { return value.empty() ? key_data() : value.data(); }
    std::size_t start(std::size_t b) const { return positions.empty() ? position_offset : positions[b]; }
};

// output [B, Lq, E], probs [B, H, Lq, Lk], averaged [B, Lq, Lk] with tolerances (c·bound, the float
// layernorm's extra term with norm_eps, and the underflow term). Not included: the FLT_MIN of a probability
// (the caller adds it, as fuzz_attention does for the classic oracle).
mha_test::Expected layer_double(const LayerProblem& p);

}  // namespace fuzz_oracle
