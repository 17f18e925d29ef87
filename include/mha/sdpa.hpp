// The attention core on already-projected heads: PyTorch's F.scaled_dot_product_attention (eval, no
// dropout) with grouped-query heads, for runtimes that bring their own projections.
//
//   q [B, H, Lq, d], k and v [B, Hkv, Lk, d], H % Hkv == 0, G = H / Hkv: query head h uses KV head h / G
//   (repeat_interleave / enable_gqa=True; MQA is Hkv = 1). For each (b, h):
//     S = scale · q_h·k_{h/G}ᵀ + masks,  P = softmax rows of S,  out_h = P·v_{h/G}      ([Lq, d])
//   scale defaults to 1/√d. Masks as in mha/attention.hpp: key_padding_mask [B, Lk], attn_mask [Lq, Lk]
//   or [B·H, Lq, Lk] (index b·H + h), boolean (nonzero = masked) or additive. Causal top-left masks key
//   j for query i when j > i; bottom-right when j > i + Lk − Lq (the new tokens at the end of a sequence
//   whose first keys came earlier: PyTorch's causal_lower_right). The masked-key and NaN rules of
//   mha/attention.hpp hold: a masked key never contributes; a query with every key masked gets a zero row.
//   The G query heads of a group are computed together against one pass over the group's keys: K and V
//   are read once per group, never copied per query head.
//
// Inputs: SdpaInputs (mha/attention.hpp, beside the layer's inputs).
// Layouts: every tensor is a HeadsView (mha/view.hpp) with its own batch, head and row strides (elements), so
// [B, H, L, d] and [B, L, H, d] (and the output as [B, Lq, H·d]) work without copies.
// Zero sizes: B = 0 or Lq = 0 computes nothing; Lk = 0 gives zero rows (every key masked); a view with no
// elements may be null; H, Hkv and d must be > 0. Such calls take AttentionPath::scalar and need no workspace.
#pragma once
#include <cstddef>
#include <optional>

#include "mha/attention.hpp"
#include "mha/view.hpp"
#include "mha/workspace.hpp"

namespace mha {

struct SdpaOptions {
    bool causal = false;
    CausalAlignment causal_alignment = CausalAlignment::top_left;
    std::optional<float> scale;  // default 1/√d; must be finite
    Backend backend = Backend::simd;
    int threads = 0;             // 0: all cores of the caller's arena
    // materialized: per-head scores [Lq, Lk]; fused / automatic: grouped heads, tiled (see Algorithm in
    // mha/attention.hpp: automatic picks fused for G > 1 or Lk >= 1024; both take the decode path for Lq <= 16
    // with G·Lq <= 128).
    Algorithm impl = Algorithm::automatic;
    // Sliding window, softcap, sinks [H] and ALiBi slopes [H] (mha/attention.hpp's ScoreModifiers).
    ScoreModifiers modifiers;
};

// output [B, H, Lq, d]: any strides whose rows do not overlap each other; must not overlap the inputs or
// the masks. Validates everything first and throws mha::invalid_argument without writing anything.
// Memory as MultiheadAttention::forward (mha/workspace.hpp): a lease from the scratch cache, or none with a
// Workspace of sdpa_workspace_bytes(in, options) bytes.
void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options = {});
void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options,
                                  Workspace& workspace);
// Bytes of workspace a call with these shapes and options needs (0 for the scalar backend).
std::size_t sdpa_workspace_bytes(const SdpaInputs& in, const SdpaOptions& options = {});
// The path a call with these shapes and options takes (AttentionPath: scalar for the scalar backend, else
// the SIMD core's materialized, grouped or decode path). Validates as sdpa_workspace_bytes does.
AttentionPath sdpa_path(const SdpaInputs& in, const SdpaOptions& options = {});

}  // namespace mha
