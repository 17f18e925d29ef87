// bf16 compute (AttentionConfig::compute = DataType::bf16) for the tests: a layer model evaluated twice in
// double, with the per-element bounds of docs/bf16-accuracy.md in their probabilistic form:
//   oracle  the float64 computation on the fp32 inputs with no rounding at all (o), and e, the scale of
//           |a bf16 forward − o| (u = 2^-8 per rounded operand, v = 2^-24 per fp32 operation);
//   center  the same computation rounded to bfloat16 exactly where the bf16 compute rounds (t: inputs,
//           weights, Q, K, V after bias and RoPE, normalized P, C), sums in double, and d, the scale of
//           |a bf16 forward with fp32 accumulation − t|: the fp32 rounding of the sums, P normalized before or
//           after its rounding, and the bfloat16 values that round the other way because the fp32 value
//           before them differs (round_track).
// e and d are root-sum-squares of the elementary rounding bounds carried through the linearized layer
// (each rounding error of one operand counted once, errors of distinct operations independent: the
// probabilistic model of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019); a forward is within λ·e of
// o, λ = kLambda (the elementary bounds stand for their standard deviations, which they exceed by √3).
// Tests: |forward − o| <= λ·e; |simd − reference| <= √2·λ·d (each forward within λ·d of t).
// Preconditions: the shapes of a valid layer; masks as mha/attention.hpp.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"

namespace mha_bf16 {

constexpr double kUb = 0x1p-8;   // bfloat16 unit roundoff
constexpr double kV = 0x1p-24;   // float unit roundoff
constexpr double kLambda = 6.0;
constexpr double kOracleFactor = kLambda, kTightFactor = 1.4142135623730951 * kLambda;

// Root-sum-square accumulation.
inline void rss(double& acc2, double x) { acc2 += x * x; }
// The rounding of a float sum of n terms of total magnitude mag, as a scale: √n·v·mag.
inline double sum_rounding(std::size_t n, double mag) { return std::sqrt(double(n)) * kV * mag; }

// x rounded as a bf16 forward rounds a value it holds in float: to float, then to bfloat16.
inline double bf(double x) { return double(mha::round_to_bf16(static_cast<float>(x))); }

// One quantity in both evaluations: oracle value and bound, center value and bound.
struct Track {
    std::vector<double> o, e, t, d;
    explicit Track(std::size_t n = 0) : o(n, 0.0), e(n, 0.0), t(n, 0.0), d(n, 0.0) {}
};

// The spacing of bfloat16 values at x (8 significant bits).
inline double bf16_ulp(double x) {
    int e = 0;
    std::frexp(x == 0.0 ? 0x1p-126 : x, &e);
    return std::ldexp(1.0, e - 8);
}

// Rounds every element of x to bfloat16. The oracle gains u·|o|. The center rounds t. A forward's value
// before the rounding lies within t ± λ·d: if that interval holds no rounding point, every such value rounds
// to bf(t) and the difference after the rounding is exactly 0. Otherwise two values that differ by δ round to
// values that differ by a whole spacing s with probability |δ|/s, else not at all: the difference keeps its
// mean and gains variance |δ|·s, so d becomes √(d² + min(d, s)·s).
inline void round_track(Track& x) {
    for (std::size_t n = 0; n < x.o.size(); ++n) {
        x.e[n] = std::hypot(x.e[n], kUb * std::abs(x.o[n]));
        const double s = bf16_ulp(x.t[n]), tr = bf(x.t[n]), span = kLambda * x.d[n];
        const bool may_flip = bf(x.t[n] + span) != tr || bf(x.t[n] - span) != tr;
        x.d[n] = may_flip ? std::sqrt(x.d[n] * x.d[n] + std::min(x.d[n], s) * s) : 0.0;
        x.t[n] = tr;
    }
}

// The shape and options of a layer forward (a KV-cache step is a cross-attention of the new tokens over
// all tokens, bottom-right causal).
struct Spec {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0, kdim = 0, vdim = 0;
    std::size_t B = 1, Lq = 1, Lk = 1;
    std::optional<mha::RopeConfig> rope;  // dims resolved
    std::size_t key_start = 0, query_start = 0;  // RoPE positions of key row 0 and query row 0
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    mha::MaskView key_padding_mask, attn_mask;
    std::optional<float> norm_eps;
    mha::ScoreModifiers mods;  // query i at position i (+ Lk − Lq bottom-right), key j at j
};

// Plain row-major weights; every bias present (zeros where a layer has none).
struct Weights {
    std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo, norm_w, norm_b;  // norm_*: empty = ones / zeros
};

struct Expected {
    Track out;                        // [B, Lq, E]
    Track probs;                      // [B, H, Lq, Lk]: P rounded to bfloat16 (the returned attention weights)
    std::vector<double> averaged_o, averaged_e, averaged_t, averaged_d;  // [B, Lq, Lk]
};

namespace detail {

// x [L, K] (row stride K) times W [N, K]ᵀ plus b into y [L, N].
inline Track project(const float* x, std::size_t L, std::size_t K, const std::vector<float>& w, const std::vector<float>& b,
                     std::size_t N) {
    Track y(L * N);
    std::vector<double> wr(w.size());
    for (std::size_t n = 0; n < w.size(); ++n) wr[n] = bf(w[n]);
    for (std::size_t i = 0; i < L; ++i) {
        std::vector<double> xr(K);
        for (std::size_t k = 0; k < K; ++k) xr[k] = bf(x[i * K + k]);
        for (std::size_t n = 0; n < N; ++n) {
            double so = b[n], mag = std::abs(so), st = 0.0, magt = std::abs(double(b[n])), sq = 0.0;
            for (std::size_t k = 0; k < K; ++k) {
                const double p = double(x[i * K + k]) * double(w[n * K + k]), pt = xr[k] * wr[n * K + k];
                so += p, mag += std::abs(p), st += pt, magt += std::abs(pt);
                sq += 2 * (kUb * p) * (kUb * p);  // x and w each rounded: u·|xw| twice
            }
            const std::size_t at = i * N + n;
            y.o[at] = so;
            y.e[at] = std::hypot(std::sqrt(sq), sum_rounding(K + 1, mag));
            y.t[at] = double(static_cast<float>(st + double(b[n])));
            y.d[at] = sum_rounding(K + 1, magt);
        }
    }
    return y;
}

// RoPE on every d-wide head row of y [L, heads·d], row i at position start + i (fp32 rotation: 4v per value).
inline void rope(Track& y, std::size_t L, std::size_t heads, std::size_t d, const mha::RopeConfig& rc, std::size_t start) {
    const std::size_t r = rc.dims, half = r / 2;
    for (std::size_t i = 0; i < L; ++i)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t k = 0; k < half; ++k) {
                const double theta_k = std::pow(double(rc.theta), -2.0 * double(k) / double(r));
                const double angle = double(start + i) * theta_k, c = std::cos(angle), s = std::sin(angle);
                const std::size_t base = (i * heads + h) * d;
                const std::size_t i1 = base + (rc.style == mha::RopeStyle::half ? k : 2 * k);
                const std::size_t i2 = base + (rc.style == mha::RopeStyle::half ? k + half : 2 * k + 1);
                auto rot = [&](std::vector<double>& val, std::vector<double>& err, bool to_float) {
                    const double x1 = val[i1], x2 = val[i2], e1 = err[i1], e2 = err[i2];
                    const double m1 = std::abs(x1 * c) + std::abs(x2 * s), m2 = std::abs(x2 * c) + std::abs(x1 * s);
                    val[i1] = x1 * c - x2 * s, val[i2] = x2 * c + x1 * s;
                    if (to_float) val[i1] = double(static_cast<float>(val[i1])), val[i2] = double(static_cast<float>(val[i2]));
                    err[i1] = std::sqrt(c * c * e1 * e1 + s * s * e2 * e2) + 4 * kV * m1;
                    err[i2] = std::sqrt(c * c * e2 * e2 + s * s * e1 * e1) + 4 * kV * m2;
                };
                rot(y.o, y.e, false);
                rot(y.t, y.d, true);
            }
}

inline double mask_value(const mha::MaskView& m, std::size_t flat) {
    if (m.type == mha::MaskType::boolean) return m.bools[flat] ? -INFINITY : 0.0;
    return double(m.values[flat]);
}

// One softmax row and its P·V contribution in one evaluation (oracle or center). z, ez: scores and their
// bounds (-inf where masked); vals / errs: V [Lk, Hkv·d] of KV head kh; writes probabilities, their bounds,
// and the context of one query row and head into ctx / ectx (d values at `at`). center: P rounded in t.
struct RowOut {
    std::vector<double> p, ep;
};
inline RowOut softmax_pv(const std::vector<double>& z, const std::vector<double>& ez, const std::vector<double>& vals,
                         const std::vector<double>& errs, std::size_t kvw, std::size_t col0, std::size_t d, bool center,
                         double* ctx, double* ectx, const float* sink = nullptr) {
    const std::size_t Lk = z.size();
    const double T = double((Lk + 255) / 256), gL = std::sqrt(double(Lk));
    RowOut r{std::vector<double>(Lk, 0.0), std::vector<double>(Lk, 0.0)};
    double zmax = -INFINITY;
    for (double x : z) zmax = std::max(zmax, x);
    if (zmax == -INFINITY) {  // every key masked: zero probabilities and context
        for (std::size_t c = 0; c < d; ++c) ctx[c] = 0.0, ectx[c] = 0.0;
        return r;
    }
    if (sink != nullptr) zmax = std::max(zmax, double(*sink));
    double sum = sink != nullptr ? std::exp(double(*sink) - zmax) : 0.0, dz2 = 0.0;
    std::size_t visible = sink != nullptr ? 1 : 0;  // a sink takes weight: p < 1 even with one key
    for (std::size_t j = 0; j < Lk; ++j) {
        if (z[j] == -INFINITY) continue;
        ++visible;
        sum += std::exp(z[j] - zmax);
    }
    for (std::size_t j = 0; j < Lk; ++j) {
        r.p[j] = z[j] == -INFINITY ? 0.0 : std::exp(z[j] - zmax) / sum;
        rss(dz2, r.p[j] * ez[j]);
    }
    // p_j moves by p_j·(δ_j − Σ_k p_k δ_k) for score errors δ: scale p_j·(e_j + √Σ(p_k e_k)²), plus fp32 exp,
    // subtraction and division.
    for (std::size_t j = 0; j < Lk; ++j)
        if (r.p[j] > 0.0)
            r.ep[j] = r.p[j] * (ez[j] + std::sqrt(dz2) + (gL + 6 + 3 * T + (sink ? 6 : 0)) * kV + kV * std::abs(z[j] - zmax));
    for (std::size_t c = 0; c < d; ++c) {
        // The value: oracle Σ p·v; center Σ bf(p)·v (v already rounded), to float.
        double cv = 0.0;
        for (std::size_t j = 0; j < Lk; ++j)
            if (r.p[j] > 0.0) cv += (center ? bf(r.p[j]) : r.p[j]) * vals[j * kvw + col0 + c];
        if (center) cv = double(static_cast<float>(cv));
        double e2 = 0.0, mag = 0.0;
        for (std::size_t j = 0; j < Lk; ++j) {
            const double p = r.p[j];
            if (p == 0.0) continue;
            const double x = vals[j * kvw + col0 + c], ax = std::abs(x);
            rss(e2, p * ez[j] * std::abs(x - cv));                                // score errors through the softmax
            rss(e2, p * ((4 + 3 * T) * kV + 2 * kV * std::abs(z[j] - zmax)) * ax);  // fp32 exp and subtraction
            rss(e2, p * errs[j * kvw + col0 + c]);                               // V's own error
            // P rounded to bfloat16: a forward's weight within u·p of p, the center's own rounding is known
            // (with one visible key p = 1 exactly: no rounding).
            if (visible > 1) rss(e2, (kUb * p + (center ? std::abs(bf(p) - p) : 0.0)) * ax);
            mag += p * ax;
        }
        // Normalization: P rounded before (reference) or after (online softmax) the division, with a sum
        // of rounded or unrounded terms: a common factor within u of 1 (exact with one visible key, p = 1).
        if (visible > 1) rss(e2, kUb * std::abs(cv));
        rss(e2, sum_rounding(Lk + 2 * std::size_t(T), mag) + (gL + 2 + 3 * T + (sink ? 6 : 0)) * kV * std::abs(cv));  // fp32 sums
        ctx[c] = cv;
        ectx[c] = std::sqrt(e2);
    }
    return r;
}

}  // namespace detail

// The layer on query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim] (contiguous).
inline Expected evaluate(const Spec& s, const Weights& w, const float* query, const float* key, const float* value) {
    const std::size_t B = s.B, Lq = s.Lq, Lk = s.Lk, E = s.E, H = s.H, Hkv = s.Hkv, d = s.d, G = H / Hkv;
    const std::size_t qw = H * d, kvw = Hkv * d;
    const double scale = double(1.0f / std::sqrt(static_cast<float>(d)));  // the float the library uses
    Expected ex;
    ex.out = Track(B * Lq * E), ex.probs = Track(B * H * Lq * Lk);
    ex.averaged_o.assign(B * Lq * Lk, 0.0), ex.averaged_e = ex.averaged_t = ex.averaged_d = ex.averaged_o;
    for (std::size_t b = 0; b < B; ++b) {
        Track q = detail::project(query + b * Lq * E, Lq, E, w.wq, w.bq, qw);
        Track k = detail::project(key + b * Lk * s.kdim, Lk, s.kdim, w.wk, w.bk, kvw);
        Track v = detail::project(value + b * Lk * s.vdim, Lk, s.vdim, w.wv, w.bv, kvw);
        if (s.rope) {
            detail::rope(q, Lq, H, d, *s.rope, s.query_start);
            detail::rope(k, Lk, Hkv, d, *s.rope, s.key_start);
        }
        round_track(q), round_track(k), round_track(v);
        Track ctx(Lq * qw);
        for (std::size_t h = 0; h < H; ++h) {
            const std::size_t kh = h / G;
            for (std::size_t i = 0; i < Lq; ++i) {
                std::vector<double> zo(Lk), eo(Lk), zt(Lk), et(Lk);
                for (std::size_t j = 0; j < Lk; ++j) {
                    const double m1 = s.key_padding_mask.present() ? detail::mask_value(s.key_padding_mask, b * Lk + j) : 0.0;
                    const double m2 = !s.attn_mask.present()       ? 0.0
                                      : s.attn_mask.rank == 2 ? detail::mask_value(s.attn_mask, i * Lk + j)
                                                              : detail::mask_value(s.attn_mask, ((b * H + h) * Lq + i) * Lk + j);
                    const long long last = s.alignment == mha::CausalAlignment::top_left ? (long long)i : (long long)i + (long long)Lk - (long long)Lq;
                    const long long pos = last;  // p_i, causal or not
                    if ((s.causal && (long long)j > last) || m1 == -INFINITY || m2 == -INFINITY ||
                        mha_test::window_hides(s.mods, pos, j)) {
                        zo[j] = zt[j] = -INFINITY, eo[j] = et[j] = 0.0;
                        continue;
                    }
                    double dot_o = 0.0, mag_o = 0.0, so = 0.0, dot_t = 0.0, mag_t = 0.0, st = 0.0;
                    for (std::size_t c = 0; c < d; ++c) {
                        const std::size_t qi = i * qw + h * d + c, ki = j * kvw + kh * d + c;
                        dot_o += q.o[qi] * k.o[ki], mag_o += std::abs(q.o[qi] * k.o[ki]);
                        const double a1 = q.e[qi] * std::abs(k.o[ki]), a2 = std::abs(q.o[qi]) * k.e[ki];
                        so += a1 * a1 + a2 * a2;
                        dot_t += q.t[qi] * k.t[ki], mag_t += std::abs(q.t[qi] * k.t[ki]);
                        const double b1 = q.d[qi] * std::abs(k.t[ki]), b2 = std::abs(q.t[qi]) * k.d[ki];
                        st += b1 * b1 + b2 * b2;
                    }
                    double sco = scale * dot_o, sct = double(static_cast<float>(scale * dot_t));
                    double eso = std::hypot(scale * std::sqrt(so), sum_rounding(d + 3, scale * mag_o));
                    double est = std::hypot(scale * std::sqrt(st), sum_rounding(d + 3, scale * mag_t));
                    if (s.mods.softcap > 0.0f) {  // c·tanh(s / c): slope sech² <= 1; the division, tanh, product
                        const double c = s.mods.softcap;
                        auto cap = [&](double& x, double& e) {
                            const double t = std::tanh(x / c), sech2 = 1.0 - t * t;
                            e = (e + 2 * kV * std::abs(x)) * sech2 + (mha_test::kTanhUlp + 1) * kV * std::abs(c * t);
                            x = c * t;
                        };
                        cap(sco, eso), cap(sct, est);
                    }
                    if (s.mods.alibi_slopes != nullptr) {  // − m_h·(p_i − j)
                        const double a = double(s.mods.alibi_slopes[h]) * double((long long)j - pos);
                        sco += a, sct += a;
                        eso += 2 * kV * (std::abs(a) + std::abs(sco)), est += 2 * kV * (std::abs(a) + std::abs(sct));
                    }
                    zo[j] = sco + m1 + m2, zt[j] = sct + m1 + m2;
                    eo[j] = eso + 2 * kV * (std::abs(sco) + std::abs(m1) + std::abs(m2));
                    et[j] = est + 2 * kV * (std::abs(sct) + std::abs(m1) + std::abs(m2));
                }
                const std::size_t at = i * qw + h * d;
                const float* sink = s.mods.sinks != nullptr ? s.mods.sinks + h : nullptr;
                const detail::RowOut ro = detail::softmax_pv(zo, eo, v.o, v.e, kvw, kh * d, d, false, &ctx.o[at], &ctx.e[at], sink);
                const detail::RowOut rt = detail::softmax_pv(zt, et, v.t, v.d, kvw, kh * d, d, true, &ctx.t[at], &ctx.d[at], sink);
                // The returned weights are P rounded to bfloat16 (as P·V reads it, normalized).
                Track pr(Lk);
                for (std::size_t j = 0; j < Lk; ++j) pr.o[j] = ro.p[j], pr.e[j] = ro.ep[j], pr.t[j] = rt.p[j], pr.d[j] = rt.ep[j];
                round_track(pr);
                for (std::size_t j = 0; j < Lk; ++j) {
                    const std::size_t pi = ((b * H + h) * Lq + i) * Lk + j, ai = (b * Lq + i) * Lk + j;
                    ex.probs.o[pi] = pr.o[j], ex.probs.e[pi] = pr.e[j], ex.probs.t[pi] = pr.t[j], ex.probs.d[pi] = pr.d[j];
                    ex.averaged_o[ai] += pr.o[j] / double(H), ex.averaged_e[ai] += pr.e[j] / double(H);
                    ex.averaged_t[ai] += pr.t[j] / double(H), ex.averaged_d[ai] += pr.d[j] / double(H);
                }
            }
        }
        round_track(ctx);
        // Output projection (Wo rounded), then the optional post-norm block (fp32, residual = the query as given).
        std::vector<double> wor(w.wo.size());
        for (std::size_t n = 0; n < w.wo.size(); ++n) wor[n] = bf(w.wo[n]);
        for (std::size_t i = 0; i < Lq; ++i) {
            std::vector<double> oo(E), oe(E), ot(E), od(E);
            for (std::size_t r = 0; r < E; ++r) {
                double so = w.bo[r], mo = std::abs(so), st = 0.0, mt = std::abs(double(w.bo[r]));
                double s1 = 0.0, s3 = 0.0;
                for (std::size_t c = 0; c < qw; ++c) {
                    const double wv = w.wo[r * qw + c], co = ctx.o[i * qw + c], ct = ctx.t[i * qw + c];
                    so += co * wv, mo += std::abs(co * wv);
                    st += ct * wor[r * qw + c], mt += std::abs(ct * wor[r * qw + c]);
                    rss(s1, ctx.e[i * qw + c] * std::abs(wv));  // C's error
                    rss(s1, kUb * std::abs(co * wv));            // Wo rounded
                    rss(s3, ctx.d[i * qw + c] * std::abs(wor[r * qw + c]));
                }
                oo[r] = so, oe[r] = std::hypot(std::sqrt(s1), sum_rounding(qw + 1, mo));
                ot[r] = double(static_cast<float>(st + double(w.bo[r]))), od[r] = std::hypot(std::sqrt(s3), sum_rounding(qw + 1, mt));
            }
            if (s.norm_eps) {
                const float* x = query + (b * Lq + i) * E;
                auto norm = [&](std::vector<double>& o, std::vector<double>& e) {
                    double mean = 0.0, var = 0.0, mean_e2 = 0.0, mean_ye2 = 0.0;
                    for (std::size_t r = 0; r < E; ++r) o[r] += x[r], mean += o[r] / double(E);
                    for (std::size_t r = 0; r < E; ++r) var += (o[r] - mean) * (o[r] - mean) / double(E);
                    const double rs = 1.0 / std::sqrt(var + double(*s.norm_eps));
                    for (std::size_t r = 0; r < E; ++r) {  // Σ e² / E², Σ (ŷ e)² / E²: independent errors
                        mean_e2 += e[r] * e[r] / double(E * E);
                        mean_ye2 += ((o[r] - mean) * rs * e[r]) * ((o[r] - mean) * rs * e[r]) / double(E * E);
                    }
                    for (std::size_t r = 0; r < E; ++r) {
                        const double gm = w.norm_w.empty() ? 1.0 : w.norm_w[r], be = w.norm_b.empty() ? 0.0 : w.norm_b[r];
                        const double yhat = (o[r] - mean) * rs, y = gm * yhat + be;
                        // ∂ŷ_j/∂z_k = r·(δ_jk − 1/n − ŷ_j ŷ_k / n), then the fp32 normalization's own rounding
                        e[r] = std::abs(gm) * rs * std::sqrt(e[r] * e[r] + mean_e2 + yhat * yhat * mean_ye2) +
                               sum_rounding(2 * E, std::abs(gm * yhat)) + kV * std::abs(y);
                        o[r] = y;
                    }
                };
                norm(oo, oe), norm(ot, od);
            }
            for (std::size_t r = 0; r < E; ++r) {
                const std::size_t at = (b * Lq + i) * E + r;
                ex.out.o[at] = oo[r], ex.out.e[at] = oe[r], ex.out.t[at] = ot[r], ex.out.d[at] = od[r];
            }
        }
    }
    for (std::size_t n = 0; n < ex.averaged_o.size(); ++n) {
        ex.averaged_e[n] += double(H + 1) * kV * ex.averaged_o[n];  // (linear sums over heads: worst case)
        ex.averaged_d[n] += double(H + 1) * kV * ex.averaged_t[n];
    }
    return ex;
}

inline std::vector<double> scaled(const std::vector<double>& x, double c) {
    std::vector<double> y(x);
    for (double& t : y) t *= c;
    return y;
}

}  // namespace mha_bf16
