// Scalar reference multi-head attention (torch.nn.MultiheadAttention, batch_first, eval), built
// from the reference kernels exactly as mha/attention.hpp writes it. For each batch b:
//   Q = query_b·Wqᵀ + bq, K = key_b·Wkᵀ + bk, V = value_b·Wvᵀ + bv   ([L, E] each)
//   for each head h, Qh/Kh/Vh = columns [h·d, h·d + d) viewed with stride E (seed 003's slices):
//     S = Qh·Khᵀ / sqrt(d) + additive masks; masked entries (boolean, -inf, causal) are -inf whatever
//     the score (a NaN score of a masked key does not poison the row); P = softmax rows of S
//     C[:, h·d ..] = P·Vh over the keys not masked for that query (masked: boolean, -inf or causal)
//   out_b = C·Woᵀ + bo, then optionally LayerNorm(out_b + query_b).
#include <cmath>
#include <limits>
#include <vector>

#include "reference.hpp"

namespace mha::reference {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// y = x·Wᵀ + bias for y [rows, n], x [rows, k], W [n, k].
void linear(ConstMatrix x, ConstMatrix w, const float* bias, Matrix y) {
    reference::gemm(1.0f, x, Trans::no, w, Trans::yes, 0.0f, y);
    for (std::size_t i = 0; i < y.rows; ++i)
        for (std::size_t j = 0; j < y.cols; ++j) y(i, j) += bias[j];
}

// The additive value a mask contributes at [index, i, j] (index selects the batch or batch·head).
float mask_value(const MaskView& m, std::size_t index, std::size_t i, std::size_t j) {
    const std::size_t rows = m.rank == 3 ? m.shape[1] : m.shape[0];
    const std::size_t cols = m.rank == 3 ? m.shape[2] : m.shape[1];
    const std::size_t at = (m.rank == 3 ? index * rows * cols : 0) + i * cols + j;
    if (m.type == MaskType::boolean) return m.bools[at] ? kMinusInf : 0.0f;
    return m.values[at];
}

}  // namespace

void multihead_attention(const Layer& layer, const AttentionInputs& in, const AttentionOutputs& out,
                         const ForwardOptions& opt) {
    const std::size_t E = layer.E, H = layer.H, d = E / H;
    const std::size_t B = in.query.batch, Lq = in.query.rows, Lk = in.key.rows;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));

    const ConstMatrix wq(layer.wq, E, E), wk(layer.wk, E, E), wv(layer.wv, E, E), wo(layer.wo, E, E);
    const float *bq = layer.bq, *bk = layer.bk, *bv = layer.bv;

    std::vector<float> q(Lq * E), k(Lk * E), v(Lk * E), ctx(Lq * E), scores(Lq * Lk);
    std::vector<unsigned char> masked(Lq * Lk);  // key j masked for query i (boolean, -inf or causal)
    const Matrix Q(q.data(), Lq, E), K(k.data(), Lk, E), V(v.data(), Lk, E), C(ctx.data(), Lq, E);
    const Matrix S(scores.data(), Lq, Lk);

    for (std::size_t b = 0; b < B; ++b) {
        linear(in.query[b], wq, bq, Q);
        linear(in.key[b], wk, bk, K);
        linear(in.value[b], wv, bv, V);
        for (std::size_t h = 0; h < H; ++h) {
            reference::gemm(scale, Q.columns(h * d, d), Trans::no, K.columns(h * d, d), Trans::yes, 0.0f, S);
            for (std::size_t i = 0; i < Lq; ++i) {
                for (std::size_t j = 0; j < Lk; ++j) {
                    const float kp = in.key_padding_mask.present() ? mask_value(in.key_padding_mask, 0, b, j) : 0.0f;
                    const float am = in.attn_mask.present() ? mask_value(in.attn_mask, b * H + h, i, j) : 0.0f;
                    masked[i * Lk + j] = kp == kMinusInf || am == kMinusInf || (opt.causal && j > i);
                    S(i, j) += kp;
                    S(i, j) += am;
                    if (masked[i * Lk + j]) S(i, j) = kMinusInf;  // whatever the score was, NaN included
                }
                softmax_row(S.row(i), Lk, Lk, 1.0f, nullptr, nullptr);
            }
            // C_h = P·V_h, summed over the keys each query may see: a masked key never contributes, even
            // when its value row is NaN or ±inf (0·NaN would make the row NaN).
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t c = 0; c < d; ++c) {
                    float sum = 0.0f;
                    for (std::size_t j = 0; j < Lk; ++j)
                        if (!masked[i * Lk + j]) sum += S(i, j) * V(j, h * d + c);
                    C(i, h * d + c) = sum;
                }

            if (opt.need_weights == NeedWeights::per_head) {
                float* dst = out.attn_weights + (b * H + h) * Lq * Lk;
                for (std::size_t i = 0; i < Lq * Lk; ++i) dst[i] = scores[i];
            } else if (opt.need_weights == NeedWeights::averaged) {
                float* dst = out.attn_weights + b * Lq * Lk;
                for (std::size_t i = 0; i < Lq * Lk; ++i) dst[i] = (h == 0 ? 0.0f : dst[i]) + scores[i] / static_cast<float>(H);
            }
        }
        const Matrix y = out.output[b];
        linear(C, wo, layer.bo, y);
        if (opt.norm_eps) {
            const ConstMatrix x = in.query[b];
            for (std::size_t i = 0; i < Lq; ++i)
                layernorm_row(y.row(i), y.row(i), x.row(i), E, layer.norm_w, layer.norm_b, *opt.norm_eps);
        }
    }
}

}  // namespace mha::reference
