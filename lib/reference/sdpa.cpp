// Scalar reference attention core (mha/sdpa.hpp) on projected heads: q [B, H, Lq, d], k [B, Hkv, Lk, d],
// v [B, Hkv, Lk, dv] as strided views, G = H / Hkv. For each batch b and query head h (KV head h / G):
//   S = scale·q_h·k_{h/G}ᵀ + key_padding_mask[b] + attn_mask ([Lq, Lk], or [B·H, Lq, Lk] at b·H + h)
//   a masked key (boolean mask set, additive -inf, causal) scores -inf whatever q·k gave (NaN included);
//   causal top-left masks j > i, bottom-right masks j > i + Lk − Lq (signed: with Lq > Lk the first
//   Lq − Lk queries see no key at all)
//   P = softmax rows of S (reference::softmax_row: a row whose keys are all masked becomes zeros)
//   out_h = Σ over the unmasked keys j of P(i, j)·v_{h/G}(j, :)  (a masked key never contributes, even
//   when its value row is NaN or ±inf)
// probs (nullable) receives P as [B, H, Lq, Lk] contiguous.
// Score modifiers (mha/attention.hpp), query i at position p_i = i (+ Lk − Lq bottom-right), key j at j:
//   S ← softcap·tanh(S / softcap); S ← S − slope_h·(p_i − j); keys outside [p_i − left, p_i + right] masked;
//   with a sink σ_h: P_ij = exp(S_ij − m) / (Σ_k exp(S_ik − m) + exp(σ_h − m)), m = max(max_k S_ik, σ_h).
// compute bf16 (AttentionConfig::compute): q, k, v read as round_to_bf16 of their values, S = float(scale·
// Σ q·k) with the sum in double, P (fp32 softmax) rounded to bfloat16 after normalization as the input of
// P·V, whose sum runs in double; probs receives that rounded P (the attention weights of a bf16 layer).
// Preconditions (checked by the public API): H % Hkv == 0, shapes agree (q.dim == k.dim, out [B, H, Lq, dv]),
// masks of the documented shapes, out does not overlap the inputs. Allocates its own scratch.
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "reference.hpp"

namespace mha::reference {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// The additive value a mask contributes at [index, i, j] (index selects the batch·head of a rank-3 mask;
// a rank-2 mask is [rows, cols] and ignores it).
float mask_value(const MaskView& m, std::size_t index, std::size_t i, std::size_t j) {
    const std::size_t rows = m.rank == 3 ? m.shape[1] : m.shape[0];
    const std::size_t cols = m.rank == 3 ? m.shape[2] : m.shape[1];
    const std::size_t at = (m.rank == 3 ? index * rows * cols : 0) + i * cols + j;
    if (m.type == MaskType::boolean) return m.bools[at] ? kMinusInf : 0.0f;
    return m.values[at];
}

// Whether causal masking hides key j from query i.
bool causal_masked(CausalAlignment alignment, std::size_t i, std::size_t j, std::size_t Lq, std::size_t Lk) {
    if (alignment == CausalAlignment::top_left) return j > i;
    // bottom-right: j > i + Lk − Lq, in signed arithmetic (Lq may exceed Lk).
    const long long last_visible = static_cast<long long>(i) + static_cast<long long>(Lk) - static_cast<long long>(Lq);
    return static_cast<long long>(j) > last_visible;
}

// Row softmax with a sink in the denominator (masked keys hold -inf: probability 0; a NaN score makes the row NaN).
void softmax_row_with_sink(float* x, std::size_t n, float sink) {
    float m = sink;
    for (std::size_t j = 0; j < n; ++j)
        if (x[j] > m) m = x[j];
    float l = std::exp(sink - m);
    for (std::size_t j = 0; j < n; ++j) {
        x[j] = std::exp(x[j] - m);
        l += x[j];
    }
    for (std::size_t j = 0; j < n; ++j) x[j] /= l;
}

}  // namespace

void attention_core(const SdpaInputs& in, const Heads& out, float scale, bool causal, CausalAlignment alignment,
                    float* probs, DataType compute, const ScoreModifiers& mods) {
    const bool bf16 = compute == DataType::bf16;
    const std::size_t B = in.query.batch, H = in.query.heads, G = H / in.key.heads;
    const std::size_t Lq = in.query.rows, Lk = in.key.rows, dv = in.value.dim;

    std::vector<float> scores(Lq * Lk);
    std::vector<unsigned char> masked(Lq * Lk);  // key j masked for query i (boolean, -inf or causal)
    const Matrix S(scores.data(), Lq, Lk);

    for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t h = 0; h < H; ++h) {
            const ConstMatrix q = in.query.head(b, h), k = in.key.head(b, h / G), v = in.value.head(b, h / G);
            const Matrix o = out.head(b, h);
            if (bf16) {
                for (std::size_t i = 0; i < Lq; ++i)
                    for (std::size_t j = 0; j < Lk; ++j) {
                        double dot = 0.0;
                        for (std::size_t c = 0; c < q.cols; ++c)
                            dot += double(mha::round_to_bf16(q(i, c))) * double(mha::round_to_bf16(k(j, c)));
                        S(i, j) = static_cast<float>(double(scale) * dot);
                    }
            } else {
                reference::gemm(scale, q, Trans::no, k, Trans::yes, 0.0f, S);
            }
            const long long shift = alignment == CausalAlignment::bottom_right ? static_cast<long long>(Lk) - static_cast<long long>(Lq) : 0;
            for (std::size_t i = 0; i < Lq; ++i) {
                const long long pos = static_cast<long long>(i) + shift;
                for (std::size_t j = 0; j < Lk; ++j) {
                    const long long jj = static_cast<long long>(j);
                    if (mods.softcap > 0.0f) S(i, j) = mods.softcap * std::tanh(S(i, j) / mods.softcap);
                    if (mods.alibi_slopes != nullptr) S(i, j) += mods.alibi_slopes[h] * static_cast<float>(jj - pos);
                    const bool outside = (mods.window_left >= 0 && pos - jj > mods.window_left) ||  // (no overflow)
                                         (mods.window_right >= 0 && jj - pos > mods.window_right);
                    const float kp = in.key_padding_mask.present() ? mask_value(in.key_padding_mask, 0, b, j) : 0.0f;
                    const float am = in.attn_mask.present() ? mask_value(in.attn_mask, b * H + h, i, j) : 0.0f;
                    masked[i * Lk + j] =
                        outside || kp == kMinusInf || am == kMinusInf || (causal && causal_masked(alignment, i, j, Lq, Lk));
                    S(i, j) += kp;
                    S(i, j) += am;
                    if (masked[i * Lk + j]) S(i, j) = kMinusInf;  // whatever the score was, NaN included
                }
                if (mods.sinks != nullptr)
                    softmax_row_with_sink(S.row(i), Lk, mods.sinks[h]);
                else
                    softmax_row(S.row(i), Lk, Lk, 1.0f, nullptr, nullptr);
            }
            // out_h = P·v over the keys each query may see: a masked key never contributes, even when its
            // value row is NaN or ±inf (0·NaN would make the row NaN).
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t c = 0; c < dv; ++c) {
                    if (bf16) {
                        double sum = 0.0;
                        for (std::size_t j = 0; j < Lk; ++j)
                            if (!masked[i * Lk + j]) sum += double(mha::round_to_bf16(S(i, j))) * double(mha::round_to_bf16(v(j, c)));
                        o(i, c) = static_cast<float>(sum);
                        continue;
                    }
                    float sum = 0.0f;
                    for (std::size_t j = 0; j < Lk; ++j)
                        if (!masked[i * Lk + j]) sum += S(i, j) * v(j, c);
                    o(i, c) = sum;
                }
            if (probs != nullptr) {
                float* dst = probs + (b * H + h) * Lq * Lk;
                for (std::size_t i = 0; i < Lq * Lk; ++i) dst[i] = bf16 ? mha::round_to_bf16(scores[i]) : scores[i];
            }
        }
    }
}

}  // namespace mha::reference
