// Scalar reference of one incremental-decoding step (MultiheadAttention::forward with a KVCache), from the
// reference kernels. For each sequence b with n_b cached tokens (past[b]) and Lq new tokens x_b:
//   Q = x_b·Wqᵀ + bq [Lq, H·d],  K = x_b·Wkᵀ + bk,  V = x_b·Wvᵀ + bv [Lq, Hkv·d]
//   with RoPE: every head row of Q and K of new token i rotated at position n_b + i
//   K and V returned in new_keys / new_values as projected (appending them stores them rounded); attention
//   uses them rounded to the cache's element format and widened back (fp8 with k_scale / v_scale), as stored
//   C = attention_core over Q and the n_b + Lq rows (past, then the new ones), scale 1/sqrt(d), causal
//       bottom-right
//   out_b = C·Woᵀ + bo, then optionally LayerNorm(out_b + x_b)
// layer.compute bf16: rounded as reference::multihead_attention rounds.
// Preconditions (checked by the public API): layer resolved, self-attention weights (kdim = vdim = E), the
// cache's Hkv and d the layer's, output not overlapping query.
#include <algorithm>
#include <cmath>
#include <vector>

#include "reference.hpp"

namespace mha::reference {
void cached_attention(const Layer& layer, ConstBatch query, Batch output, const ForwardOptions& opt,
                      const detail::ElementFormat& format, float k_scale, float v_scale, const CachedRows* past, Batch new_keys,
                      Batch new_values) {
    const std::size_t H = layer.H, Hkv = layer.Hkv, d = layer.d;
    const std::size_t B = query.batch, Lq = query.rows;
    std::vector<float> q(Lq * H * d), ctx(Lq * H * d);
    std::vector<unsigned char> stored(format.row_bytes(d));
    const Matrix Q(q.data(), Lq, H * d), C(ctx.data(), Lq, H * d);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t n = past[b].length, L = n + Lq;
        const ConstMatrix x = query[b];
        const Matrix K = new_keys[b], V = new_values[b];
        project_inputs(layer, x, x, x, Q, K, V, n, n);
        std::vector<float> kc(Hkv * L * d), vc(kc.size());  // [Hkv, n + Lq, d]: the past rows, then the new ones
        for (std::size_t h = 0; h < Hkv; ++h) {
            std::copy(past[b].keys + h * n * d, past[b].keys + (h + 1) * n * d, kc.begin() + h * L * d);
            std::copy(past[b].values + h * n * d, past[b].values + (h + 1) * n * d, vc.begin() + h * L * d);
            // Each new head row as the cache will hold it: rounded to the element format, widened back.
            for (std::size_t i = 0; i < Lq; ++i) {
                format.narrow(K.row(i) + h * d, stored.data(), d, k_scale);
                format.widen(stored.data(), kc.data() + (h * L + n + i) * d, d, k_scale);
                format.narrow(V.row(i) + h * d, stored.data(), d, v_scale);
                format.widen(stored.data(), vc.data() + (h * L + n + i) * d, d, v_scale);
            }
        }
        SdpaInputs in;
        in.query = ConstHeads(q.data(), 1, H, Lq, d, 0, d, H * d);
        in.key = ConstHeads::bhld(kc.data(), 1, Hkv, L, d);
        in.value = ConstHeads::bhld(vc.data(), 1, Hkv, L, d);
        attention_core(in, Heads(ctx.data(), 1, H, Lq, d, 0, d, H * d), 1.0f / std::sqrt(static_cast<float>(d)), true,
                       CausalAlignment::bottom_right, nullptr, layer.compute, layer.mods);
        project_output(layer, C, x, output[b], opt.norm_eps);
    }
}

}  // namespace mha::reference
