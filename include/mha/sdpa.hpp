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
// Layouts: every tensor is a HeadsView with its own batch, head and row strides (elements), so
// [B, H, L, d] and [B, L, H, d] (and the output as [B, Lq, H·d]) work without copies.
// Zero sizes: B = 0 or Lq = 0 computes nothing; Lk = 0 gives zero rows (every key masked); a view with no
// elements may be null; H, Hkv and d must be > 0. Such calls take AttentionPath::scalar and need no workspace.
#pragma once
#include <cstddef>
#include <optional>
#include <type_traits>

#include "mha/attention.hpp"
#include "mha/view.hpp"
#include "mha/workspace.hpp"

namespace mha {

// A 4-D strided view [batch, heads, rows, dim]: element (b, h, i, c) at
// data[b·batch_stride + h·head_stride + i·row_stride + c]. Rows are contiguous (dim elements).
template <class T>
struct HeadsView {
    T* data = nullptr;
    std::size_t batch = 0, heads = 0, rows = 0, dim = 0;
    std::size_t batch_stride = 0, head_stride = 0, row_stride = 0;

    constexpr HeadsView() = default;
    constexpr HeadsView(T* p, std::size_t b, std::size_t h, std::size_t l, std::size_t d, std::size_t bs, std::size_t hs,
                        std::size_t rs)
        : data(p), batch(b), heads(h), rows(l), dim(d), batch_stride(bs), head_stride(hs), row_stride(rs) {}
    template <class U, std::enable_if_t<detail::adds_const_v<T, U>, int> = 0>
    constexpr HeadsView(const HeadsView<U>& o)  // NOLINT(google-explicit-constructor)
        : data(o.data), batch(o.batch), heads(o.heads), rows(o.rows), dim(o.dim), batch_stride(o.batch_stride),
          head_stride(o.head_stride), row_stride(o.row_stride) {}

    // Contiguous [B, H, L, d] (PyTorch's SDPA layout).
    static constexpr HeadsView bhld(T* p, std::size_t b, std::size_t h, std::size_t l, std::size_t d) {
        return {p, b, h, l, d, h * l * d, l * d, d};
    }
    // Contiguous [B, L, H, d], i.e. [B, L, H·d] with head h in columns [h·d, h·d + d).
    static constexpr HeadsView blhd(T* p, std::size_t b, std::size_t l, std::size_t h, std::size_t d) {
        return {p, b, h, l, d, l * h * d, d, h * d};
    }
    // Head h of batch b as a [rows, dim] matrix.
    constexpr MatrixView<T> head(std::size_t b, std::size_t h) const {
        return {data + b * batch_stride + h * head_stride, rows, dim, row_stride};
    }
};

using Heads = HeadsView<float>;
using ConstHeads = HeadsView<const float>;

struct SdpaInputs {
    ConstHeads query;            // [B, H, Lq, d]
    ConstHeads key;              // [B, Hkv, Lk, d]
    ConstHeads value;            // [B, Hkv, Lk, d]
    MaskView key_padding_mask;   // optional, [B, Lk]
    MaskView attn_mask;          // optional, [Lq, Lk] or [B·H, Lq, Lk]
};

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
