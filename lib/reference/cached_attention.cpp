// Scalar reference of one incremental-decoding step (MultiheadAttention::forward with a KVCache), from the
// reference kernels. For each sequence b with n_b = cache.length(b) cached tokens and Lq new tokens x_b:
//   Q = x_b·Wqᵀ + bq [Lq, H·d],  K = x_b·Wkᵀ + bk,  V = x_b·Wvᵀ + bv [Lq, Hkv·d]
//   with RoPE: every head row of Q and K of new token i rotated at position n_b + i
//   K and V appended to the cache (rows n_b .. n_b + Lq − 1 of each KV head), rounded to its element type
//   C = attention_core over Q and the cache's n_b + Lq rows as stored (bf16 / f16 widened to float, exactly),
//       scale 1/sqrt(d), causal bottom-right
//   out_b = C·Woᵀ + bo, then optionally LayerNorm(out_b + x_b)
// layer.compute bf16: rounded as reference::multihead_attention rounds (the cache receives K and V rounded to
// bfloat16, exact in its floats).
// Preconditions (checked by the public API): layer resolved, self-attention weights (kdim = vdim = E), the
// cache's Hkv and d the layer's, n_b + Lq <= capacity, output not overlapping query or cache.
#include <cmath>
#include <vector>

#include "mha/kv_cache.hpp"
#include "reference.hpp"

namespace mha::reference {
void cached_attention(const Layer& layer, ConstBatch query, Batch output, const ForwardOptions& opt, KVCache& cache) {
    const std::size_t H = layer.H, Hkv = layer.Hkv, d = layer.d;
    const std::size_t B = query.batch, Lq = query.rows;
    std::vector<float> q(Lq * H * d), k(Lq * Hkv * d), v(Lq * Hkv * d), ctx(Lq * H * d);
    const Matrix Q(q.data(), Lq, H * d), K(k.data(), Lq, Hkv * d), V(v.data(), Lq, Hkv * d), C(ctx.data(), Lq, H * d);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t n = cache.length(b);
        const ConstMatrix x = query[b];
        const DataType ct = layer.compute;
        project_inputs(layer, x, x, x, Q, K, V, n, n);
        std::vector<float> kc(Hkv * (n + Lq) * d), vc(kc.size());  // the cached rows as floats [Hkv, n + Lq, d]
        // Append through the cache's own API (head h of token i is columns [h·d, h·d + d) of row i), which
        // rounds to its element type; then read every row back as stored.
        cache.append(b, ConstHeads(k.data(), 1, Hkv, Lq, d, 0, d, Hkv * d), ConstHeads(v.data(), 1, Hkv, Lq, d, 0, d, Hkv * d));
        for (std::size_t h = 0; h < Hkv; ++h) {
            cache.copy_keys(b, h, Matrix(kc.data() + h * (n + Lq) * d, n + Lq, d));
            cache.copy_values(b, h, Matrix(vc.data() + h * (n + Lq) * d, n + Lq, d));
        }
        SdpaInputs in;
        in.query = ConstHeads(q.data(), 1, H, Lq, d, 0, d, H * d);
        in.key = ConstHeads::bhld(kc.data(), 1, Hkv, n + Lq, d);
        in.value = ConstHeads::bhld(vc.data(), 1, Hkv, n + Lq, d);
        attention_core(in, Heads(ctx.data(), 1, H, Lq, d, 0, d, H * d), 1.0f / std::sqrt(static_cast<float>(d)), true,
                       CausalAlignment::bottom_right, nullptr, ct);
        project_output(layer, C, x, output[b], opt.norm_eps);
    }
}

}  // namespace mha::reference
