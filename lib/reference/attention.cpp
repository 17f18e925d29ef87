// Scalar reference multi-head attention (torch.nn.MultiheadAttention, batch_first, eval, extended to
// decoder models as mha/attention.hpp writes it), built from the reference kernels. For each batch b:
//   Q = query_b·Wqᵀ + bq [Lq, H·d],  K = key_b·Wkᵀ + bk [Lk, Hkv·d],  V = value_b·Wvᵀ + bv [Lk, Hkv·d]
//   with RoPE: every d-wide head row of K rotated (reference::rope_row) at position start_b + j and of Q at
//   start_b + i, or start_b + Lk − Lq + i with bottom-right alignment (the queries are the last Lq tokens)
//   (start_b = opt.positions[b] if given, else opt.position_offset)
//   C = attention_core over the heads of Q, K, V (query head h: columns [h·d, h·d + d) viewed with stride
//       H·d, seed 003's slices; KV head h / (H / Hkv)), scale 1/sqrt(d), masks, causal as opt says
//   out_b = C·Woᵀ + bo (Wo [E, H·d]), then optionally LayerNorm(out_b + query_b).
//   need_weights: per_head is attention_core's [H, Lq, Lk] probabilities; averaged their mean over H.
// layer.compute bf16: query/key/value and the weights enter the projections rounded to bfloat16 (reference::
// linear, sums in double); Q, K, V are rounded after bias and RoPE; attention_core rounds P; C is rounded
// before the output projection (Wo rounded too); the post-norm block stays fp32.
// Preconditions (checked by the public API): the Layer resolved (every size set, every bias non-null,
// rope->dims set), key/value non-null, shapes and masks as documented, outputs not overlapping inputs.
// Allocates its own scratch, one batch at a time.
#include <cmath>
#include <vector>

#include "reference.hpp"

namespace mha::reference {
namespace {

// Rotates each of the `heads` d-wide head rows of every row of x (a projection [L, heads·d]), row i at
// position start + i.
void rope_rows(Matrix x, std::size_t heads, std::size_t d, const RopeConfig& rope, std::size_t start) {
    for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t h = 0; h < heads; ++h) rope_row(x.row(i) + h * d, rope, start + i);
}

// The rows of a mask that batch b sees, from `offset` elements in, as a mask of first dimension `rows`.
MaskView mask_rows(const MaskView& m, std::size_t offset, std::size_t rows) {
    MaskView s = m;
    if (m.type == MaskType::boolean) s.bools += offset;
    else s.values += offset;
    s.shape[0] = rows;
    return s;
}

// key_padding_mask [B, Lk] → row b as [1, Lk].
MaskView key_padding_of_batch(const MaskView& m, std::size_t b) {
    return m.present() ? mask_rows(m, b * m.shape[1], 1) : m;
}

// attn_mask [B·H, Lq, Lk] → batch b's H matrices as [H, Lq, Lk]; [Lq, Lk] is every batch's.
MaskView attn_mask_of_batch(const MaskView& m, std::size_t b, std::size_t H) {
    return m.present() && m.rank == 3 ? mask_rows(m, b * H * m.shape[1] * m.shape[2], H) : m;
}

}  // namespace

void project_inputs(const Layer& layer, ConstMatrix xq, ConstMatrix xk, ConstMatrix xv, Matrix Q, Matrix K, Matrix V,
                    std::size_t q_start, std::size_t k_start) {
    const std::size_t E = layer.E, H = layer.H, Hkv = layer.Hkv, d = layer.d;
    const DataType ct = layer.compute;
    linear(xq, ConstMatrix(layer.wq, H * d, E), layer.bq, Q, ct);
    linear(xk, ConstMatrix(layer.wk, Hkv * d, layer.kdim), layer.bk, K, ct);
    linear(xv, ConstMatrix(layer.wv, Hkv * d, layer.vdim), layer.bv, V, ct);
    if (layer.rope) {
        rope_rows(Q, H, d, *layer.rope, q_start);
        rope_rows(K, Hkv, d, *layer.rope, k_start);
    }
    if (ct == DataType::bf16) round_to_bf16(Q), round_to_bf16(K), round_to_bf16(V);
}

void project_output(const Layer& layer, Matrix C, ConstMatrix x, Matrix y, const std::optional<float>& norm_eps) {
    if (layer.compute == DataType::bf16) round_to_bf16(C);
    linear(C, ConstMatrix(layer.wo, layer.E, layer.H * layer.d), layer.bo, y, layer.compute);
    if (norm_eps)
        for (std::size_t i = 0; i < x.rows; ++i) layernorm_row(y.row(i), y.row(i), x.row(i), layer.E, layer.norm_w, layer.norm_b, *norm_eps);
}

void multihead_attention(const Layer& layer, const AttentionInputs& in, const AttentionOutputs& out,
                         const ForwardOptions& opt) {
    const std::size_t H = layer.H, Hkv = layer.Hkv, d = layer.d;
    const std::size_t B = in.query.batch, Lq = in.query.rows, Lk = in.key.rows;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));

    std::vector<float> q(Lq * H * d), k(Lk * Hkv * d), v(Lk * Hkv * d), ctx(Lq * H * d);
    std::vector<float> probs(opt.need_weights == NeedWeights::averaged ? H * Lq * Lk : 0);
    const Matrix Q(q.data(), Lq, H * d), K(k.data(), Lk, Hkv * d), V(v.data(), Lk, Hkv * d), C(ctx.data(), Lq, H * d);

    for (std::size_t b = 0; b < B; ++b) {
        const DataType ct = layer.compute;
        const std::size_t start = opt.positions ? opt.positions[b] : opt.position_offset;
        const std::size_t query_start = opt.causal_alignment == CausalAlignment::bottom_right ? start + Lk - Lq : start;
        project_inputs(layer, in.query[b], in.key[b], in.value[b], Q, K, V, query_start, start);

        // Batch b's heads: [1, heads, L, d] views of the projections (row stride heads·d, head stride d).
        SdpaInputs core;
        core.query = ConstHeads(q.data(), 1, H, Lq, d, Lq * H * d, d, H * d);
        core.key = ConstHeads(k.data(), 1, Hkv, Lk, d, Lk * Hkv * d, d, Hkv * d);
        core.value = ConstHeads(v.data(), 1, Hkv, Lk, d, Lk * Hkv * d, d, Hkv * d);
        core.key_padding_mask = key_padding_of_batch(in.key_padding_mask, b);
        core.attn_mask = attn_mask_of_batch(in.attn_mask, b, H);
        float* p = opt.need_weights == NeedWeights::per_head ? out.attn_weights + b * H * Lq * Lk
                   : opt.need_weights == NeedWeights::averaged ? probs.data()
                                                               : nullptr;
        attention_core(core, Heads(ctx.data(), 1, H, Lq, d, Lq * H * d, d, H * d), scale, opt.causal,
                       opt.causal_alignment, p, ct, layer.mods);

        if (opt.need_weights == NeedWeights::averaged) {
            float* dst = out.attn_weights + b * Lq * Lk;
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Lq * Lk; ++i)
                    dst[i] = (h == 0 ? 0.0f : dst[i]) + probs[h * Lq * Lk + i] / static_cast<float>(H);
        }

        project_output(layer, C, in.query[b], out.output[b], opt.norm_eps);
    }
}

}  // namespace mha::reference
