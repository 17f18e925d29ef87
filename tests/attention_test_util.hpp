// Helpers for the attention tests: random problems, and an independent double-precision multi-head
// attention written as straightforward loops (no library code) that also propagates a first-order
// bound on the error of a float computation of the same formula (u = 2^-24, γ_n ≈ n·u):
//   projections   y = x·Wᵀ + b:     |Δy| ≤ γ_{E+1}·(Σ|x||w| + |b|)
//   scores        s = Σ q·k / √d:   |Δs| ≤ (Σ|Δq||k| + |q||Δk|)/√d + (d + 3)·u·Σ|q||k|/√d
//                                   (d-long dot, the scale multiply, 2u in the float 1/sqrt(d))
//   masks         z = s + m1 + m2:  + 2u·(|s| + |m1| + |m2|), and u·|z − max| in the softmax
//   softmax       p_j:              |Δp_j| ≤ p_j·(2·max_k |Δz_k| + (Lk + 4)·u)
//   context       c = Σ_j p_j v_j:  |Δc| ≤ Σ (|Δp||v| + p|Δv|) + Lk·u·Σ p|v|
//   out proj      o = C·Woᵀ + bo:   |Δo| ≤ Σ|Δc||w| + γ_{E+1}·(Σ|c||w| + |bo|)
//   post-norm     y = γ·ŷ + β, ŷ = (z − mean)·r, z = o + query, r = 1/sqrt(var + eps):
//                 ∂ŷ_j/∂z_k = r·(δ_jk − 1/n − ŷ_j ŷ_k / n), so |Δy_j| ≤ |γ_j|·r·(e_j + mean e + |ŷ_j|·mean(|ŷ| e))
//                 + u·|y_j| (the reference normalizes in double and rounds once).
//   averaged weights Σ_h p_h / H:   Σ Δp_h / H + (H + 1)·u·avg
// The tolerance returned is c = 2 times that bound (the factor covers the second-order terms).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "isa_test_util.hpp"

namespace mha_test {

constexpr double kU = 0x1p-24;  // float unit roundoff

inline std::vector<float> random_floats(std::size_t n, float lo, float hi, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// A mask that owns its data.
struct Mask {
    mha::MaskType type = mha::MaskType::none;
    int rank = 0;
    std::array<std::size_t, 3> shape{};
    std::vector<std::uint8_t> bools;
    std::vector<float> values;

    mha::MaskView view() const {
        mha::MaskView v;
        v.type = type;
        v.rank = rank;
        v.bools = bools.empty() ? nullptr : bools.data();
        v.values = values.empty() ? nullptr : values.data();
        for (int i = 0; i < 3; ++i) v.shape[i] = shape[i];
        return v;
    }
    bool present() const { return type != mha::MaskType::none; }
    // The additive value of element `flat` (row-major index): -inf where a boolean mask is set.
    double at(std::size_t flat) const {
        if (type == mha::MaskType::boolean) return bools[flat] ? -INFINITY : 0.0;
        return values[flat];
    }
};

// A boolean mask of the given shape, each element set with probability `density`.
inline Mask random_bool_mask(std::vector<std::size_t> dims, double density, std::uint32_t seed) {
    Mask m;
    m.type = mha::MaskType::boolean;
    m.rank = int(dims.size());
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) m.shape[i] = dims[i], n *= dims[i];
    std::mt19937 gen(seed);
    std::bernoulli_distribution set(density);
    m.bools.resize(n);
    for (auto& b : m.bools) b = set(gen) ? 1 : 0;
    return m;
}

// An additive mask: values in [-2, 2], and -inf with probability `inf_density`.
inline Mask random_float_mask(std::vector<std::size_t> dims, double inf_density, std::uint32_t seed) {
    Mask m = random_bool_mask(dims, inf_density, seed);
    m.type = mha::MaskType::additive;
    m.values = random_floats(m.bools.size(), -2.0f, 2.0f, seed + 7777);
    for (std::size_t i = 0; i < m.values.size(); ++i)
        if (m.bools[i]) m.values[i] = -INFINITY;
    m.bools.clear();
    return m;
}

// The masks of a test case by kind: key_padding 0 none, 1 bool, 2 float ([B, Lk], density 0.25); attn_mask 0
// none, 1 bool / 2 float [Lq, Lk], 3 bool / 4 float [B·H, Lq, Lk] (densities bool_density / float_density).
inline void random_case_masks(int key_padding, int attn_mask, std::size_t B, std::size_t H, std::size_t Lq, std::size_t Lk,
                              double bool_density, double float_density, std::uint32_t seed, Mask& kpm, Mask& am) {
    if (key_padding == 1) kpm = random_bool_mask({B, Lk}, 0.25, seed);
    if (key_padding == 2) kpm = random_float_mask({B, Lk}, 0.25, seed);
    const std::vector<std::size_t> am2{Lq, Lk}, am3{B * H, Lq, Lk};
    if (attn_mask == 1) am = random_bool_mask(am2, bool_density, seed + 1);
    if (attn_mask == 2) am = random_float_mask(am2, float_density, seed + 1);
    if (attn_mask == 3) am = random_bool_mask(am3, bool_density, seed + 1);
    if (attn_mask == 4) am = random_float_mask(am3, float_density, seed + 1);
}

struct Problem {
    std::size_t E = 0, H = 1, B = 1, Lq = 1, Lk = 1;
    std::vector<float> in_w, in_b, out_w, out_b, norm_w, norm_b;  // norm_*: empty = not given
    std::vector<float> query, key, value;                         // key / value empty: = query / key
    Mask key_padding_mask, attn_mask;
    bool causal = false;
    std::optional<float> norm_eps;

    const float* key_data() const { return key.empty() ? query.data() : key.data(); }
    const float* value_data() const { return value.empty() ? key_data() : value.data(); }
    mha::AttentionWeights weights() const {
        return {in_w.data(), in_b.data(), out_w.data(), out_b.data(), norm_w.empty() ? nullptr : norm_w.data(),
                norm_b.empty() ? nullptr : norm_b.data()};
    }
};

// Random weights (±1/√E, like nn.Linear's init) and inputs in [-1, 1]. cross: distinct key and value.
inline Problem random_problem(std::size_t E, std::size_t H, std::size_t B, std::size_t Lq, std::size_t Lk, bool cross,
                              std::uint32_t seed) {
    Problem p;
    p.E = E, p.H = H, p.B = B, p.Lq = Lq, p.Lk = cross ? Lk : Lq;
    const float w = 1.0f / std::sqrt(float(E));
    p.in_w = random_floats(3 * E * E, -w, w, seed);
    p.in_b = random_floats(3 * E, -w, w, seed + 1);
    p.out_w = random_floats(E * E, -w, w, seed + 2);
    p.out_b = random_floats(E, -w, w, seed + 3);
    p.query = random_floats(B * Lq * E, -1.0f, 1.0f, seed + 4);
    if (cross) {
        p.key = random_floats(B * Lk * E, -1.0f, 1.0f, seed + 5);
        p.value = random_floats(B * Lk * E, -1.0f, 1.0f, seed + 6);
    }
    return p;
}

struct Expected {
    std::vector<double> output, output_tol;      // [B, Lq, E]
    std::vector<double> probs, probs_tol;        // per head [B, H, Lq, Lk]
    std::vector<double> averaged, averaged_tol;  // [B, Lq, Lk]
};

// The attention of `p` in double, with tolerances (see the top of this file).
inline Expected attention_double(const Problem& p) {
    const std::size_t E = p.E, H = p.H, d = E / H, B = p.B, Lq = p.Lq, Lk = p.Lk;
    const double c = 2.0, inv_sqrt_d = 1.0 / std::sqrt(double(d));
    Expected ex;
    ex.output.assign(B * Lq * E, 0.0), ex.output_tol.assign(B * Lq * E, 0.0);
    ex.probs.assign(B * H * Lq * Lk, 0.0), ex.probs_tol.assign(B * H * Lq * Lk, 0.0);
    ex.averaged.assign(B * Lq * Lk, 0.0), ex.averaged_tol.assign(B * Lq * Lk, 0.0);

    // y = x·W[row0 .., :]ᵀ + b for x [L, E]; also the error bound of a float computation.
    auto project = [&](const float* x, std::size_t L, std::size_t row0, std::vector<double>& y, std::vector<double>& ey) {
        y.assign(L * E, 0.0), ey.assign(L * E, 0.0);
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t o = 0; o < E; ++o) {
                double sum = p.in_b[row0 + o], mag = std::abs(sum);
                for (std::size_t k = 0; k < E; ++k) {
                    sum += double(x[i * E + k]) * p.in_w[(row0 + o) * E + k];
                    mag += std::abs(double(x[i * E + k]) * p.in_w[(row0 + o) * E + k]);
                }
                y[i * E + o] = sum, ey[i * E + o] = double(E + 1) * kU * mag;
            }
    };

    std::vector<double> q, eq, k, ek, v, ev;
    for (std::size_t b = 0; b < B; ++b) {
        project(p.query.data() + b * Lq * E, Lq, 0, q, eq);
        project(p.key_data() + b * Lk * E, Lk, E, k, ek);
        project(p.value_data() + b * Lk * E, Lk, 2 * E, v, ev);
        std::vector<double> ctx(Lq * E, 0.0), ectx(Lq * E, 0.0);
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < Lq; ++i) {
                std::vector<double> z(Lk), ez(Lk);
                double zmax = -INFINITY;
                for (std::size_t j = 0; j < Lk; ++j) {
                    double s = 0.0, mag = 0.0, prop = 0.0;
                    for (std::size_t t = h * d; t < h * d + d; ++t) {
                        s += q[i * E + t] * k[j * E + t];
                        mag += std::abs(q[i * E + t] * k[j * E + t]);
                        prop += eq[i * E + t] * std::abs(k[j * E + t]) + std::abs(q[i * E + t]) * ek[j * E + t];
                    }
                    s *= inv_sqrt_d;
                    const double m1 = p.key_padding_mask.present() ? p.key_padding_mask.at(b * Lk + j) : 0.0;
                    const double m2 = !p.attn_mask.present()  ? 0.0
                                      : p.attn_mask.rank == 2 ? p.attn_mask.at(i * Lk + j)
                                                              : p.attn_mask.at(((b * H + h) * Lq + i) * Lk + j);
                    z[j] = (p.causal && j > i) ? -INFINITY : s + m1 + m2;
                    ez[j] = std::isinf(z[j]) ? 0.0
                                             : prop * inv_sqrt_d + double(d + 3) * kU * mag * inv_sqrt_d +
                                                   2 * kU * (std::abs(s) + std::abs(m1) + std::abs(m2));
                    zmax = std::max(zmax, z[j]);
                }
                if (zmax == -INFINITY) continue;  // fully masked row: zero probabilities, zero context
                double sum = 0.0, dz = 0.0;
                for (std::size_t j = 0; j < Lk; ++j) {
                    if (z[j] == -INFINITY) continue;
                    sum += std::exp(z[j] - zmax);
                    dz = std::max(dz, ez[j] + kU * std::abs(z[j] - zmax));
                }
                std::vector<double> pr(Lk), epr(Lk);
                for (std::size_t j = 0; j < Lk; ++j) {
                    pr[j] = z[j] == -INFINITY ? 0.0 : std::exp(z[j] - zmax) / sum;
                    epr[j] = pr[j] * (2 * dz + double(Lk + 4) * kU);
                    const std::size_t at = ((b * H + h) * Lq + i) * Lk + j;
                    ex.probs[at] = pr[j], ex.probs_tol[at] = c * epr[j];
                    ex.averaged[(b * Lq + i) * Lk + j] += pr[j] / double(H);
                    ex.averaged_tol[(b * Lq + i) * Lk + j] += c * epr[j] / double(H);
                }
                for (std::size_t t = h * d; t < h * d + d; ++t) {
                    double cv = 0.0, mag = 0.0, prop = 0.0;
                    for (std::size_t j = 0; j < Lk; ++j) {
                        cv += pr[j] * v[j * E + t];
                        mag += pr[j] * std::abs(v[j * E + t]);
                        prop += epr[j] * std::abs(v[j * E + t]) + pr[j] * ev[j * E + t];
                    }
                    ctx[i * E + t] = cv, ectx[i * E + t] = prop + double(Lk) * kU * mag;
                }
            }
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t j = 0; j < Lk; ++j) {
                const std::size_t at = (b * Lq + i) * Lk + j;
                ex.averaged_tol[at] += c * double(H + 1) * kU * ex.averaged[at];
            }
        // Output projection, then the optional post-norm block.
        for (std::size_t i = 0; i < Lq; ++i) {
            std::vector<double> o(E), eo(E);
            for (std::size_t r = 0; r < E; ++r) {
                double sum = p.out_b[r], mag = std::abs(sum), prop = 0.0;
                for (std::size_t t = 0; t < E; ++t) {
                    sum += ctx[i * E + t] * p.out_w[r * E + t];
                    mag += std::abs(ctx[i * E + t] * p.out_w[r * E + t]);
                    prop += ectx[i * E + t] * std::abs(p.out_w[r * E + t]);
                }
                o[r] = sum, eo[r] = prop + double(E + 1) * kU * mag;
            }
            if (p.norm_eps) {
                const float* x = p.query.data() + (b * Lq + i) * E;
                double mean = 0.0, var = 0.0, mean_e = 0.0, mean_ye = 0.0;
                for (std::size_t r = 0; r < E; ++r) o[r] += x[r], mean += o[r] / double(E);
                for (std::size_t r = 0; r < E; ++r) var += (o[r] - mean) * (o[r] - mean) / double(E);
                const double rs = 1.0 / std::sqrt(var + double(*p.norm_eps));
                for (std::size_t r = 0; r < E; ++r) {
                    mean_e += eo[r] / double(E);
                    mean_ye += std::abs((o[r] - mean) * rs) * eo[r] / double(E);
                }
                for (std::size_t r = 0; r < E; ++r) {
                    const double g = p.norm_w.empty() ? 1.0 : p.norm_w[r], be = p.norm_b.empty() ? 0.0 : p.norm_b[r];
                    const double yhat = (o[r] - mean) * rs, y = g * yhat + be;
                    eo[r] = std::abs(g) * rs * (eo[r] + mean_e + std::abs(yhat) * mean_ye) + kU * std::abs(y);
                    o[r] = y;
                }
            }
            for (std::size_t r = 0; r < E; ++r)
                ex.output[(b * Lq + i) * E + r] = o[r], ex.output_tol[(b * Lq + i) * E + r] = c * eo[r];
        }
    }
    return ex;
}

struct Result {
    std::vector<float> output, weights;
};

// Runs the library on contiguous buffers. Self-attention problems pass key/value as null views.
inline Result run(const mha::MultiheadAttention& mha_obj, const Problem& p, mha::Backend backend,
                  mha::NeedWeights need_weights) {
    Result r;
    r.output.assign(p.B * p.Lq * p.E, NAN);
    if (need_weights == mha::NeedWeights::averaged) r.weights.assign(p.B * p.Lq * p.Lk, NAN);
    if (need_weights == mha::NeedWeights::per_head) r.weights.assign(p.B * p.H * p.Lq * p.Lk, NAN);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(p.query.data(), p.B, p.Lq, p.E);
    if (!p.key.empty()) in.key = mha::ConstBatch(p.key.data(), p.B, p.Lk, p.E);
    if (!p.value.empty()) in.value = mha::ConstBatch(p.value.data(), p.B, p.Lk, p.E);
    in.key_padding_mask = p.key_padding_mask.view();
    in.attn_mask = p.attn_mask.view();
    mha::ForwardOptions opt;
    opt.backend = backend;
    opt.causal = p.causal;
    opt.need_weights = need_weights;
    opt.norm_eps = p.norm_eps;
    mha_obj.forward(in, {mha::Batch(r.output.data(), p.B, p.Lq, p.E), r.weights.empty() ? nullptr : r.weights.data()},
                    opt);
    return r;
}

inline Result run(const Problem& p, mha::Backend backend, mha::NeedWeights need_weights) {
    const mha::MultiheadAttention m(p.weights(), p.E, p.H);
    return run(m, p, backend, need_weights);
}

// Every |got − expected| within its tolerance; reports the first failure. NaN or ±inf on either side
// (or in a tolerance) and a size mismatch fail (compare_util.hpp's rule).
inline void expect_within(const std::vector<float>& got, const std::vector<double>& expected,
                          const std::vector<double>& tol, const char* what) {
    ASSERT_TRUE(all_within(got, expected, tol)) << what;
}

// The largest tolerance relative to the largest expected magnitude: a check that the bound stays
// meaningful (a bound as large as the values themselves would let anything pass). NaN if anything is
// not finite, so that ASSERT_LT(relative_tolerance(..), limit) fails then.
inline double relative_tolerance(const std::vector<double>& expected, const std::vector<double>& tol) {
    const double e = max_abs(expected), t = max_abs(tol);
    if (expected.size() != tol.size() || std::isnan(e) || std::isnan(t)) return NAN;
    return e > 0.0 ? t / e : t;
}

}  // namespace mha_test

// ---------------------------------------------------------------------------------------------------
// Decoder attention (mha/sdpa.hpp, grouped-query heads): a double-precision attention core over heads
// [B, H, L, d] that, like attention_double above, propagates a first-order bound on the error of a float
// computation of the same formula (u = 2^-24). Extended to what the decoder layer and SDPA add:
//   inputs carry their own bound (err): exact floats (SDPA) have 0, projections γ_{K+1}·(Σ|x||w| + |b|)
//   query head h uses KV head h / G (G = H / Hkv); causal top-left (j > i) or bottom-right
//   (j > i + Lk − Lq, signed: with Lq > Lk the first Lq − Lk queries see nothing and get zeros)
//   scores  s = scale·Σ q·k  (scale: the float the library uses, taken as exact):
//           |Δs| ≤ scale·Σ(|Δq||k| + |q||Δk|) + (d + 3)·u·scale·Σ|q||k|, where the first sum, over the d
//           independently rounded q and k elements, is taken in quadrature (independent_sum, below)
//   masks   z = s + m1 + m2:  + 2u·(|s| + |m1| + |m2|)
//   softmax |Δp_j| ≤ p_j·(2·max_k(|Δz_k| + u·|z_k − max z|) + (Lk + 6 + 3T)·u), T = ⌈Lk / 256⌉: the
//           fused path's online softmax rescales the running sum and accumulator once per 256-key tile,
//           and its exp is within 2 ulp (lib/simd/softmax_math.hpp: 1.07 or 1.52 ulp)
//   context c = Σ_j p_j·v_j, to first order (p_j = e^{z_j} / Σ_k e^{z_k}):
//     score errors δ_j move p_j by p_j·(δ_j − Σ_k p_k δ_k), so c by Σ_j p_j·δ_j·(v_j − c):
//           ≤ Σ_j p_j·|Δz_j|·|v_j − c|   (0 when one key takes all the weight)
//     each e_j's own rounding (exp 2u, z − max rounded: u·|z_j − max|, the divide or multiply by 1/Σ,
//     and on the fused path the rescales e^{m − m'} applied after e_j's tile: 3u each, their
//     subtractions summing to at most u·|z_j − max z|):  Σ_j p_j·((4 + 3T)·u + 2u·|z_j − max z|)·|v_j|
//     the rounding of the sum Σ_k e_k (Lk − 1 additions of positive terms, T rescales) and the final
//     division scale every p_j alike:  (Lk + 2 + 3T)·u·|c|
//     the P·V sum (Lk terms in any order, beta = 1 across tiles, the accumulator's T rescales):
//           (Lk + 2T)·u·Σ_j p_j|v_j|,  plus Σ_j p_j·|Δv_j| from the inputs
// Bounds returned here are first order and NOT multiplied by a safety factor; callers multiply (see
// kDecoderSafety). A masked key has p = 0 with bound 0: both backends give exact zeros there.
namespace mha_test {

struct HeadsD {
    std::size_t B = 0, H = 0, L = 0, d = 0;
    std::vector<double> val, err;  // [B, H, L, d]: the exact value and the float error bound

    HeadsD() = default;
    HeadsD(std::size_t b, std::size_t h, std::size_t l, std::size_t dd)
        : B(b), H(h), L(l), d(dd), val(b * h * l * dd, 0.0), err(b * h * l * dd, 0.0) {}
    std::size_t at(std::size_t b, std::size_t h, std::size_t i, std::size_t c) const { return ((b * H + h) * L + i) * d + c; }
    // Exact inputs (err 0) from a strided float view.
    static HeadsD from(const mha::ConstHeads& v) {
        HeadsD x(v.batch, v.heads, v.rows, v.dim);
        for (std::size_t b = 0; b < v.batch; ++b)
            for (std::size_t h = 0; h < v.heads; ++h)
                for (std::size_t i = 0; i < v.rows; ++i)
                    for (std::size_t c = 0; c < v.dim; ++c) x.val[x.at(b, h, i, c)] = v.head(b, h)(i, c);
        return x;
    }
};

// The additive value of element `flat` of a mask view (boolean set → -inf).
inline double mask_view_value(const mha::MaskView& m, std::size_t flat) {
    if (m.type == mha::MaskType::boolean) return m.bools[flat] ? -INFINITY : 0.0;
    return double(m.values[flat]);
}

struct CoreSpec {
    double scale = 1.0;  // the float scale the library uses, as a double
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    mha::MaskView key_padding_mask, attn_mask;  // as the library takes them ([B, Lk]; [Lq, Lk] or [B·H, Lq, Lk])
    mha::ScoreModifiers mods;                   // mha/attention.hpp; query i at p_i = i (+ Lk − Lq bottom-right)
};

struct CoreExpected {
    HeadsD ctx;                              // [B, H, Lq, d]
    std::vector<double> probs, probs_err;    // [B, H, Lq, Lk]
};

// Whether causal masking hides key j from query i (signed arithmetic for bottom-right).
inline bool causal_hides(const CoreSpec& s, std::size_t i, std::size_t j, std::size_t Lq, std::size_t Lk) {
    if (!s.causal) return false;
    const long long last = s.alignment == mha::CausalAlignment::top_left ? (long long)i : (long long)i + (long long)Lk - (long long)Lq;
    return (long long)j > last;
}

// Errors of distinct computed elements (different dot products: each q, k, v or context element) are
// treated as independent, as in the probabilistic model of rounding errors (Higham and Mary, SIAM J. Sci.
// Comput. 41(5), 2019): a combination Σ a_i·e_i of independent mean-zero errors with |e_i| ≤ b_i exceeds
// λ·√(Σ a_i² b_i²) with probability at most 2·exp(−λ²/2) (Hoeffding), 3e-8 for λ = 6. The b_i are
// themselves worst-case bounds (typical errors are far smaller). Never more than the worst case Σ|a_i| b_i.
constexpr double kIndependentLambda = 6.0;
inline double independent_sum(double linear, double sum_of_squares) {
    return std::min(linear, kIndependentLambda * std::sqrt(sum_of_squares));
}
// The growth of rounding errors in a sum of n terms, in units of u times the sum of the terms' magnitudes:
// n in the worst case; λ·√n in the same model (Higham and Mary, Theorem 3.1: |ŝ − s| ≤ γ̃_n(λ)·Σ|x_i|,
// γ̃_n(λ) ≈ λ·√n·u, with probability at least 1 − 2n·exp(−λ²(1 − u)²/2)).
inline double rounding_growth(std::size_t n) { return std::min(double(n), kIndependentLambda * std::sqrt(double(n))); }

// The sliding window of ScoreModifiers hides key j from the query at position pos.
inline bool window_hides(const mha::ScoreModifiers& m, long long pos, std::size_t j) {
    const long long jj = (long long)j;
    return (m.window_left >= 0 && jj < pos - m.window_left) || (m.window_right >= 0 && jj > pos + m.window_right);
}
// The SIMD softcap's tanh (xsimd's) against the exact tanh, in ulp of the result (tests/test_score_modifiers.cpp
// measures it on every ISA).
#if defined(__aarch64__)
constexpr double kTanhUlp = 2.5;  // measured 2.13 (NEON, under qemu)
#else
constexpr double kTanhUlp = 2.0;  // measured 1.83 (SSE2, AVX2, AVX-512)
#endif

inline CoreExpected core_double(const HeadsD& q, const HeadsD& k, const HeadsD& v, const CoreSpec& s) {
    const std::size_t B = q.B, H = q.H, Hkv = k.H, G = H / Hkv, Lq = q.L, Lk = k.L, d = q.d;
    const double T = double((Lk + 255) / 256), abs_scale = std::abs(s.scale);
    CoreExpected ex;
    ex.ctx = HeadsD(B, H, Lq, d);
    ex.probs.assign(B * H * Lq * Lk, 0.0), ex.probs_err.assign(B * H * Lq * Lk, 0.0);
    std::vector<double> z(Lk), ez(Lk);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h) {
            const std::size_t kh = h / G;
            for (std::size_t i = 0; i < Lq; ++i) {
                double zmax = -INFINITY;
                const long long pos = (long long)i + (s.alignment == mha::CausalAlignment::bottom_right ? (long long)Lk - (long long)Lq : 0);
                for (std::size_t j = 0; j < Lk; ++j) {
                    const double m1 = s.key_padding_mask.present() ? mask_view_value(s.key_padding_mask, b * Lk + j) : 0.0;
                    const double m2 = !s.attn_mask.present()     ? 0.0
                                      : s.attn_mask.rank == 2 ? mask_view_value(s.attn_mask, i * Lk + j)
                                                              : mask_view_value(s.attn_mask, ((b * H + h) * Lq + i) * Lk + j);
                    if (causal_hides(s, i, j, Lq, Lk) || m1 == -INFINITY || m2 == -INFINITY || window_hides(s.mods, pos, j)) {
                        z[j] = -INFINITY, ez[j] = 0.0;
                        continue;
                    }
                    double dot = 0.0, mag = 0.0, prop = 0.0, prop2 = 0.0;
                    for (std::size_t c = 0; c < d; ++c) {
                        const double a = q.val[q.at(b, h, i, c)], e = k.val[k.at(b, kh, j, c)];
                        const double tq = q.err[q.at(b, h, i, c)] * std::abs(e), tk = std::abs(a) * k.err[k.at(b, kh, j, c)];
                        dot += a * e, mag += std::abs(a * e);
                        prop += tq + tk, prop2 += tq * tq + tk * tk;
                    }
                    double sc = s.scale * dot;
                    double esc = abs_scale * independent_sum(prop, prop2) + rounding_growth(d + 3) * kU * abs_scale * mag;
                    if (s.mods.softcap > 0.0f) {  // c·tanh(s·(1/c)): slope sech² <= 1; 1/c and the product, tanh, ·c
                        const double c = s.mods.softcap, t = std::tanh(sc / c), sech2 = 1.0 - t * t;
                        esc = (esc + 2 * kU * std::abs(sc)) * sech2 + (kTanhUlp + 1) * kU * std::abs(c * t);
                        sc = c * t;
                    }
                    if (s.mods.alibi_slopes != nullptr) {  // − m_h·(p_i − j): the product and the sum rounded
                        const double a = double(s.mods.alibi_slopes[h]) * double((long long)j - pos);
                        sc += a;
                        esc += 2 * kU * (std::abs(a) + std::abs(sc));
                    }
                    z[j] = sc + m1 + m2;
                    ez[j] = esc + 2 * kU * (std::abs(sc) + std::abs(m1) + std::abs(m2));
                    zmax = std::max(zmax, z[j]);
                }
                if (zmax == -INFINITY) continue;  // every key masked: zero probabilities and context (sink or not)
                const bool sink = s.mods.sinks != nullptr;
                if (sink) zmax = std::max(zmax, double(s.mods.sinks[h]));
                double sum = sink ? std::exp(double(s.mods.sinks[h]) - zmax) : 0.0, dz = 0.0;
                for (std::size_t j = 0; j < Lk; ++j) {
                    if (z[j] == -INFINITY) continue;
                    sum += std::exp(z[j] - zmax);
                    dz = std::max(dz, ez[j] + kU * std::abs(z[j] - zmax));
                }
                const std::size_t row = ((b * H + h) * Lq + i) * Lk;
                for (std::size_t j = 0; j < Lk; ++j) {
                    const double p = z[j] == -INFINITY ? 0.0 : std::exp(z[j] - zmax) / sum;
                    ex.probs[row + j] = p;
                    ex.probs_err[row + j] = p * (2 * dz + (rounding_growth(Lk) + 6 + 3 * T + (sink ? 6 : 0)) * kU);
                }
                for (std::size_t c = 0; c < d; ++c) {
                    double cv = 0.0;
                    for (std::size_t j = 0; j < Lk; ++j)
                        if (ex.probs[row + j] > 0.0) cv += ex.probs[row + j] * v.val[v.at(b, kh, j, c)];
                    double mag = 0.0, score = 0.0, own = 0.0, prop = 0.0;
                    for (std::size_t j = 0; j < Lk; ++j) {
                        const double p = ex.probs[row + j];
                        if (p == 0.0) continue;
                        const double x = v.val[v.at(b, kh, j, c)];
                        mag += p * std::abs(x);
                        score += p * ez[j] * std::abs(x - cv);
                        own += p * ((4 + 3 * T) * kU + 2 * kU * std::abs(z[j] - zmax)) * std::abs(x);
                        prop += p * v.err[v.at(b, kh, j, c)];
                    }
                    ex.ctx.val[ex.ctx.at(b, h, i, c)] = cv;
                    // (a sink's exp and the merged normalizer exp(m − m')/(l·exp(m − m') + exp(σ − m')): 6u more)
                    ex.ctx.err[ex.ctx.at(b, h, i, c)] = score + own + prop + (rounding_growth(Lk) + 2 * T) * kU * mag +
                                                        (rounding_growth(Lk) + 2 + 3 * T + (sink ? 6 : 0)) * kU * std::abs(cv);
                }
            }
        }
    return ex;
}

// The safety factor on the first-order bounds above (covers the second-order terms), and the bound on
// |simd − scalar|: both backends are float computations of one formula, each within c·bound of the
// exact value, so they differ by at most 2·c·bound.
constexpr double kDecoderSafety = 2.0;
inline std::vector<double> backend_difference_bound(const std::vector<double>& bound) {
    std::vector<double> t(bound.size());
    for (std::size_t i = 0; i < bound.size(); ++i) t[i] = 2 * kDecoderSafety * bound[i];
    return t;
}

}  // namespace mha_test
