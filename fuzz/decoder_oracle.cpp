// See decoder_oracle.hpp.
#include "decoder_oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace fuzz_oracle {
namespace {

using mha_test::kU;
constexpr double kC = 2.0;  // tolerance = kC · first-order bound
constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// The additive value of a mask element (row-major index): -inf where a boolean mask is set.
double mask_at(const mha::MaskView& m, std::size_t flat) {
    if (m.type == mha::MaskType::boolean) return m.bools[flat] ? kMinusInf : 0.0;
    return double(m.values[flat]);
}

// y = x·Wᵀ + b for x [L, K] (contiguous), W [n, K], b [n] or empty; ey its float bound γ_{K+1}·(Σ|x||w| + |b|).
void project(const float* x, std::size_t L, std::size_t K, const std::vector<float>& w, const std::vector<float>& bias,
             std::size_t n, std::vector<double>& y, std::vector<double>& ey) {
    y.assign(L * n, 0.0), ey.assign(L * n, 0.0);
    for (std::size_t i = 0; i < L; ++i)
        for (std::size_t o = 0; o < n; ++o) {
            double sum = bias.empty() ? 0.0 : double(bias[o]), mag = std::abs(sum);
            for (std::size_t t = 0; t < K; ++t) {
                const double prod = double(x[i * K + t]) * double(w[o * K + t]);
                sum += prod, mag += std::abs(prod);
            }
            y[i * n + o] = sum, ey[i * n + o] = double(K + 1) * kU * mag;
        }
}

// RoPE on one head row x[0, d) with its bounds e, at token position `position` (mha/attention.hpp): the
// documented angle p·θ_k in double (θ_k = theta^(−2k/r) by std::pow, as both backends compute it), then the
// rotation exactly; the bound as in decoder_oracle.hpp.
void rotate(double* x, double* e, const mha::RopeConfig& rope, std::size_t position) {
    const std::size_t r = rope.dims, half = r / 2;
    for (std::size_t k = 0; k < half; ++k) {
        const double theta_k = std::pow(double(rope.theta), -2.0 * double(k) / double(r));
        const double a = double(position) * theta_k;
        const double c = std::cos(a), s = std::sin(a);
        const std::size_t i1 = rope.style == mha::RopeStyle::half ? k : 2 * k;
        const std::size_t i2 = rope.style == mha::RopeStyle::half ? k + half : 2 * k + 1;
        const double x1 = x[i1], x2 = x[i2], e1 = e[i1], e2 = e[i2];
        x[i1] = x1 * c - x2 * s;
        x[i2] = x2 * c + x1 * s;
        e[i1] = std::abs(c) * e1 + std::abs(s) * e2 + 3 * kU * (std::abs(x1 * c) + std::abs(x2 * s));
        e[i2] = std::abs(c) * e2 + std::abs(s) * e1 + 3 * kU * (std::abs(x2 * c) + std::abs(x1 * s));
    }
}

}  // namespace

CoreExpected core_double(const CoreInput& in) {
    const std::size_t B = in.B, H = in.H, G = in.H / in.Hkv, Lq = in.Lq, Lk = in.Lk, d = in.d;
    const double sigma = std::abs(in.scale);
    CoreExpected ex;
    ex.out.assign(B * H * Lq * d, 0.0), ex.out_bound.assign(B * H * Lq * d, 0.0);
    ex.probs.assign(B * H * Lq * Lk, 0.0), ex.probs_bound.assign(B * H * Lq * Lk, 0.0);
    double max_v = 0.0;
    for (double x : in.v)
        if (std::isfinite(x)) max_v = std::max(max_v, std::abs(x));
    ex.underflow = 4.0 * double(Lk) * double(std::numeric_limits<float>::min()) * max_v;
    const long long shift = in.alignment == mha::CausalAlignment::bottom_right ? static_cast<long long>(Lk) - static_cast<long long>(Lq) : 0;

    std::vector<double> z(Lk), ez(Lk), pr(Lk), epr(Lk);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h) {
            const std::size_t g = h / G;
            const double* kb = in.k.data() + (b * in.Hkv + g) * Lk * d;
            const double* ekb = in.ek.data() + (b * in.Hkv + g) * Lk * d;
            const double* vb = in.v.data() + (b * in.Hkv + g) * Lk * d;
            const double* evb = in.ev.data() + (b * in.Hkv + g) * Lk * d;
            for (std::size_t i = 0; i < Lq; ++i) {
                const double* q = in.q.data() + ((b * H + h) * Lq + i) * d;
                const double* eq = in.eq.data() + ((b * H + h) * Lq + i) * d;
                double zmax = kMinusInf;
                for (std::size_t j = 0; j < Lk; ++j) {
                    const double m1 = in.key_padding_mask.present() ? mask_at(in.key_padding_mask, b * Lk + j) : 0.0;
                    const double m2 = !in.attn_mask.present()  ? 0.0
                                      : in.attn_mask.rank == 2 ? mask_at(in.attn_mask, i * Lk + j)
                                                               : mask_at(in.attn_mask, ((b * H + h) * Lq + i) * Lk + j);
                    const bool masked = m1 == kMinusInf || m2 == kMinusInf ||
                                        (in.causal && static_cast<long long>(j) > static_cast<long long>(i) + shift);
                    if (masked) {
                        z[j] = kMinusInf, ez[j] = 0.0;
                        continue;
                    }
                    double s = 0.0, mag = 0.0, prop = 0.0;
                    for (std::size_t c = 0; c < d; ++c) {
                        const double kv = kb[j * d + c];
                        s += q[c] * kv;
                        mag += std::abs(q[c] * kv);
                        prop += eq[c] * std::abs(kv) + std::abs(q[c]) * ekb[j * d + c];
                    }
                    s *= in.scale;
                    z[j] = s + m1 + m2;
                    ez[j] = sigma * prop + double(d + 3) * kU * sigma * mag + 2 * kU * (std::abs(s) + std::abs(m1) + std::abs(m2));
                    zmax = std::max(zmax, z[j]);
                }
                if (zmax == kMinusInf) continue;  // every key masked: zero probabilities, zero output row
                double sum = 0.0, dz = 0.0;
                for (std::size_t j = 0; j < Lk; ++j) {
                    if (z[j] == kMinusInf) continue;
                    sum += std::exp(z[j] - zmax);
                    dz = std::max(dz, ez[j] + kU * std::abs(z[j] - zmax));
                }
                for (std::size_t j = 0; j < Lk; ++j) {
                    pr[j] = z[j] == kMinusInf ? 0.0 : std::exp(z[j] - zmax) / sum;
                    epr[j] = pr[j] * (2 * dz + double(Lk + 4) * kU);
                    const std::size_t at = ((b * H + h) * Lq + i) * Lk + j;
                    ex.probs[at] = pr[j], ex.probs_bound[at] = epr[j];
                }
                for (std::size_t c = 0; c < d; ++c) {
                    double cv = 0.0, mag = 0.0, prop = 0.0;
                    for (std::size_t j = 0; j < Lk; ++j) {
                        if (z[j] == kMinusInf) continue;  // a masked key never contributes (its v may be NaN)
                        const double v = vb[j * d + c];
                        cv += pr[j] * v;
                        mag += pr[j] * std::abs(v);
                        prop += epr[j] * std::abs(v) + pr[j] * evb[j * d + c];
                    }
                    const std::size_t at = ((b * H + h) * Lq + i) * d + c;
                    ex.out[at] = cv, ex.out_bound[at] = prop + double(Lk) * kU * mag;
                }
            }
        }
    return ex;
}

SdpaExpected sdpa_double(const mha::SdpaInputs& in, double scale, bool causal, mha::CausalAlignment alignment) {
    CoreInput c;
    c.B = in.query.batch, c.H = in.query.heads, c.Hkv = in.key.heads, c.Lq = in.query.rows, c.Lk = in.key.rows;
    c.d = in.query.dim;
    auto dense = [](const mha::ConstHeads& v, std::vector<double>& x, std::vector<double>& e) {
        x.resize(v.batch * v.heads * v.rows * v.dim);
        e.assign(x.size(), 0.0);
        std::size_t at = 0;
        for (std::size_t b = 0; b < v.batch; ++b)
            for (std::size_t h = 0; h < v.heads; ++h)
                for (std::size_t i = 0; i < v.rows; ++i)
                    for (std::size_t t = 0; t < v.dim; ++t)
                        x[at++] = double(v.data[b * v.batch_stride + h * v.head_stride + i * v.row_stride + t]);
    };
    dense(in.query, c.q, c.eq);
    dense(in.key, c.k, c.ek);
    dense(in.value, c.v, c.ev);
    c.scale = scale;
    c.key_padding_mask = in.key_padding_mask, c.attn_mask = in.attn_mask;
    c.causal = causal, c.alignment = alignment;
    const CoreExpected core = core_double(c);
    SdpaExpected ex;
    ex.out = core.out;
    ex.out_tol.resize(core.out.size());
    for (std::size_t i = 0; i < core.out.size(); ++i) ex.out_tol[i] = kC * core.out_bound[i] + core.underflow;
    return ex;
}

mha_test::Expected layer_double(const LayerProblem& p) {
    const std::size_t E = p.E, H = p.H, Hkv = p.Hkv, d = p.d, B = p.B, Lq = p.Lq, Lk = p.Lk;
    const std::size_t qw = H * d, kvw = Hkv * d;
    CoreInput c;
    c.B = B, c.H = H, c.Hkv = Hkv, c.Lq = Lq, c.Lk = Lk, c.d = d;
    c.q.assign(B * H * Lq * d, 0.0), c.eq = c.q, c.k.assign(B * Hkv * Lk * d, 0.0), c.ek = c.k, c.v = c.k, c.ev = c.k;
    c.scale = 1.0 / std::sqrt(double(d));
    c.key_padding_mask = p.key_padding_mask.view(), c.attn_mask = p.attn_mask.view();
    c.causal = p.causal, c.alignment = p.alignment;

    std::vector<double> q, eq, k, ek, v, ev;
    for (std::size_t b = 0; b < B; ++b) {
        project(p.query.data() + b * Lq * E, Lq, E, p.wq, p.bq, qw, q, eq);
        project(p.key_data() + b * Lk * p.kdim, Lk, p.kdim, p.wk, p.bk, kvw, k, ek);
        project(p.value_data() + b * Lk * p.vdim, Lk, p.vdim, p.wv, p.bv, kvw, v, ev);
        if (p.rope) {
            // Query row i at start + i, or start + Lk − Lq + i with bottom-right alignment (start >= Lq − Lk).
            const std::size_t kstart = p.start(b);
            const std::size_t qstart = p.alignment == mha::CausalAlignment::bottom_right ? kstart + Lk - Lq : kstart;
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t h = 0; h < H; ++h) rotate(&q[i * qw + h * d], &eq[i * qw + h * d], *p.rope, qstart + i);
            for (std::size_t j = 0; j < Lk; ++j)
                for (std::size_t h = 0; h < Hkv; ++h) rotate(&k[j * kvw + h * d], &ek[j * kvw + h * d], *p.rope, kstart + j);
        }
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t t = 0; t < d; ++t) {
                    const std::size_t at = ((b * H + h) * Lq + i) * d + t;
                    c.q[at] = q[i * qw + h * d + t], c.eq[at] = eq[i * qw + h * d + t];
                }
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < Lk; ++j)
                for (std::size_t t = 0; t < d; ++t) {
                    const std::size_t at = ((b * Hkv + h) * Lk + j) * d + t;
                    c.k[at] = k[j * kvw + h * d + t], c.ek[at] = ek[j * kvw + h * d + t];
                    c.v[at] = v[j * kvw + h * d + t], c.ev[at] = ev[j * kvw + h * d + t];
                }
    }
    const CoreExpected core = core_double(c);

    mha_test::Expected ex;
    ex.output.assign(B * Lq * E, 0.0), ex.output_tol.assign(B * Lq * E, 0.0);
    ex.probs = core.probs, ex.probs_tol.resize(core.probs.size());
    for (std::size_t i = 0; i < core.probs.size(); ++i) ex.probs_tol[i] = kC * core.probs_bound[i];
    ex.averaged.assign(B * Lq * Lk, 0.0), ex.averaged_tol.assign(B * Lq * Lk, 0.0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t ij = 0; ij < Lq * Lk; ++ij) {
                const std::size_t at = (b * H + h) * Lq * Lk + ij;
                ex.averaged[b * Lq * Lk + ij] += core.probs[at] / double(H);
                ex.averaged_tol[b * Lq * Lk + ij] += kC * core.probs_bound[at] / double(H);
            }
    for (std::size_t i = 0; i < ex.averaged.size(); ++i) ex.averaged_tol[i] += kC * double(H + 1) * kU * ex.averaged[i];

    // Output projection (Wo [E, H·d]), then the optional post-norm block.
    std::vector<double> ctx(qw), ectx(qw), o(E), eo(E), under(E);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Lq; ++i) {
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t t = 0; t < d; ++t) {
                    const std::size_t at = ((b * H + h) * Lq + i) * d + t;
                    ctx[h * d + t] = core.out[at], ectx[h * d + t] = core.out_bound[at];
                }
            for (std::size_t r = 0; r < E; ++r) {
                double sum = p.bo.empty() ? 0.0 : double(p.bo[r]), mag = std::abs(sum), prop = 0.0, wsum = 0.0;
                for (std::size_t t = 0; t < qw; ++t) {
                    const double w = p.wo[r * qw + t];
                    sum += ctx[t] * w;
                    mag += std::abs(ctx[t] * w);
                    prop += ectx[t] * std::abs(w);
                    wsum += std::abs(w);
                }
                o[r] = sum, eo[r] = prop + double(qw + 1) * kU * mag, under[r] = core.underflow * wsum;
            }
            const std::size_t row = b * Lq + i;
            if (p.norm_eps) {
                const float* x = p.query.data() + row * E;
                const double n = double(E);
                std::vector<double> zf(E);  // z = o + query (pre-norm) for the float-layernorm term
                double mean = 0.0, var = 0.0, mean_e = 0.0, mean_ye = 0.0, mean_dev = 0.0, max_under = 0.0;
                for (std::size_t r = 0; r < E; ++r) zf[r] = o[r] + double(x[r]), mean += zf[r] / n;
                for (std::size_t r = 0; r < E; ++r) var += (zf[r] - mean) * (zf[r] - mean) / n, mean_dev += std::abs(zf[r] - mean) / n;
                const double rs = 1.0 / std::sqrt(var + double(*p.norm_eps));
                for (std::size_t r = 0; r < E; ++r) {
                    mean_e += eo[r] / n;
                    mean_ye += std::abs((zf[r] - mean) * rs) * eo[r] / n;
                    max_under = std::max(max_under, under[r]);
                }
                for (std::size_t r = 0; r < E; ++r) {
                    const double g = p.norm_w.empty() ? 1.0 : double(p.norm_w[r]), be = p.norm_b.empty() ? 0.0 : double(p.norm_b[r]);
                    const double yhat = (zf[r] - mean) * rs, y = g * yhat + be;
                    // attention_test_util.hpp's propagation through the (double) layernorm ...
                    double tol = kC * (std::abs(g) * rs * (eo[r] + mean_e + std::abs(yhat) * mean_ye) + kU * std::abs(y));
                    // ... attention_oracle.hpp's extra term of the float layernorm ...
                    const double ga = std::abs(g), ba = std::abs(be), u = kU;
                    const double dev = std::abs(zf[r] - mean) + u * std::abs(zf[r]), yh = std::abs(yhat);
                    tol += kC * (ga * rs * u * (std::abs(zf[r]) + dev) + ga * rs * (n + 1) * u * (mean_dev + u * std::abs(mean)) +
                                 ga * yh * ((n + 2) / 2 + 3) * u + 3 * u * (ga * yh + ba));
                    // ... and the underflow term through the normalization (each z_k moves the row by <= 3·r·max).
                    tol += 3 * ga * rs * (1 + yh) * max_under;
                    ex.output[row * E + r] = y, ex.output_tol[row * E + r] = tol;
                }
            } else {
                for (std::size_t r = 0; r < E; ++r) ex.output[row * E + r] = o[r], ex.output_tol[row * E + r] = kC * eo[r] + under[r];
            }
        }
    return ex;
}

}  // namespace fuzz_oracle
