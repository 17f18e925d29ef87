// Helpers for the incremental-decoding tests (test_decode.cpp, test_kv_cache_more.cpp,
// test_pytorch_kv_fixtures.cpp): a decoder layer with random weights, and an independent double evaluation
// of one MultiheadAttention::forward with a KV cache that carries, per output element, a first-order bound on
// the error of a float computation of the same formula (u = 2^-24, g(n) = min(n, 6·√n), the rounding growth
// of attention_test_util.hpp; the first-order bounds there are not multiplied by a safety factor, callers
// multiply by kDecoderSafety = 2 for the second-order terms):
//   For sequence b with n_b cached tokens and Lq new tokens x_b:
//   projections  q, k, v = x·Wᵀ + b (length E):     |Δ| ≤ g(E + 1)·u·(Σ|x||w| + |b|)
//   RoPE         new row i at position n_b + i:     |Δy1| ≤ |c||Δx1| + |s||Δx2| + 4u·(|x1||c| + |x2||s|)
//                (cos and sin of a double angle rounded to float once; the rotation in float)
//   keys         the cache's n_b rows as they are (exact floats, bound 0), then the new rotated rows
//   core         core_double (attention_test_util.hpp) over n_b + Lq keys, causal bottom-right, scale the
//                float 1/√d: score, softmax (T = ⌈keys / 256⌉ online-softmax rescales: the decode path's
//                per-split rescales and the merge's one per split are at most two per key, within 3T),
//                P·V with g(keys)
//   out proj     o = C·Woᵀ + bo (length H·d):        Σ|ΔC||w| (in quadrature, independent_sum) + g(H·d + 1)·u·(Σ|C||w| + |bo|)
//   post-norm    z = o + x (+ u|z|), ŷ = (z − mean)·r, r = 1/sqrt(var + eps), y = γ·ŷ + β:
//                propagated: ∂ŷ_j/∂z_k = r·(δ_jk − 1/n − ŷ_j·ŷ_k/n), so |Δŷ_j| ≤ r·(e_j + mean e + |ŷ_j|·mean(|ŷ|·e));
//                the norm's own float rounding (lib/simd/layernorm_impl.hpp: mean0, the shift c = Σ(z − mean0)/n,
//                var = Σd²/n − c², 1/sqrt, one fma per element): the mean left after the shift is off by
//                (g(E) + 1)·u·mean|z − mean| (≤ (g(E) + 1)·u/r), var by (g(E) + 2)·u relative, r by
//                ((g(E) + 3)/2 + 2)·u relative, the fmas by 2u:  |γ_j|·((g(E)/2 + 6)·u·|ŷ_j| + (g(E) + 2)·u) + u·|y_j|
//                (the scalar reference normalizes in double and rounds once: within this).
// The new tokens' K and V rows (what the call appends to the cache) come back with their bounds too.
// A bf16 / f16 cache (KVRounding): the cached rows are read widened (exact, bound 0); each new K and V element
// is rounded to the element type when appended, which adds u_h·|x| + a to its bound (u_h = 2^-8 bf16, 2^-11
// f16, the unit roundoff of round to nearest; a = 2^-25 for f16's subnormal range, 0 for bf16). With
// cached_rows set, the cached rows get that term too: the bound of a half cache's result against an f32
// cache holding the unrounded rows. With `appended` (the cache after the call), the new rows are instead the
// ones that call stored, exact (bound 0): the check that attention used the rounded rows it stored, old and
// new, without charging the new rows' rounding.
// A one-shot causal self-attention over L tokens is the same evaluation with an empty cache and Lq = L
// (bottom-right equals top-left when Lq = Lk), and its bound also bounds an incremental computation of
// the same tokens: each cached row there is the same float projection and rotation of its token.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "attention/kv_cache_access.hpp"

namespace mha_decode_test {

using mha_test::HeadsD;
using mha_test::kU;

inline std::vector<float> uniform(std::size_t n, float bound, std::uint32_t seed) {
    return mha_test::random_floats(n, -bound, bound, seed);
}

// A layer's weights, not owned. b*, gamma, beta: nullptr = absent (zeros / ones / zeros). rope->dims resolved.
struct LayerRef {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0;
    std::optional<mha::RopeConfig> rope;
    const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr, *gamma = nullptr, *beta = nullptr;
    std::optional<float> norm_eps;
    mha::ScoreModifiers mods;  // AttentionConfig::modifiers (pointers not owned)
};

// Wq and Wk are drawn kGain times larger than nn.Linear's init (±1/√fan_in), so that scores spread over
// several units and softmax rows are peaked, as in trained decoders (a wrong key or position shows).
constexpr float kGain = 2.0f;

// A decoder layer with random weights: separate q/k/v/o projections (Hugging Face's layout), optional
// biases (q/k/v_proj_bias and out_proj_bias) and post-norm parameters.
struct DecoderLayer {
    std::size_t E, H, Hkv, d;
    std::optional<mha::RopeConfig> rope;
    std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo, gamma, beta;  // biases, gamma, beta: empty = absent

    DecoderLayer(std::size_t e, std::size_t h, std::size_t hkv, std::size_t dd, std::optional<mha::RopeConfig> r, bool biases,
                 bool norm_params, std::uint32_t seed)
        : E(e), H(h), Hkv(hkv), d(dd), rope(r) {
        if (rope && rope->dims == 0) rope->dims = d;
        const float sE = 1.0f / std::sqrt(float(E)), sO = 1.0f / std::sqrt(float(H * d));
        wq = uniform(H * d * E, kGain * sE, seed), wk = uniform(Hkv * d * E, kGain * sE, seed + 1);
        wv = uniform(Hkv * d * E, sE, seed + 2), wo = uniform(E * H * d, sO, seed + 3);
        if (biases) {
            bq = uniform(H * d, sE, seed + 4), bk = uniform(Hkv * d, sE, seed + 5), bv = uniform(Hkv * d, sE, seed + 6);
            bo = uniform(E, sO, seed + 7);
        }
        if (norm_params) {
            gamma = mha_test::random_floats(E, 0.5f, 1.5f, seed + 8);
            beta = uniform(E, 0.5f, seed + 9);
        }
    }
    static const float* ptr(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
    LayerRef ref(std::optional<float> norm_eps = std::nullopt) const {
        LayerRef r;
        r.E = E, r.H = H, r.Hkv = Hkv, r.d = d, r.rope = rope;
        r.wq = wq.data(), r.wk = wk.data(), r.wv = wv.data(), r.wo = wo.data();
        r.bq = ptr(bq), r.bk = ptr(bk), r.bv = ptr(bv), r.bo = ptr(bo), r.gamma = ptr(gamma), r.beta = ptr(beta);
        r.norm_eps = norm_eps;
        return r;
    }
    mha::MultiheadAttention make() const {
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = Hkv, c.head_dim = d, c.rope = rope;
        mha::AttentionWeights w;
        w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
        w.q_proj_bias = ptr(bq), w.k_proj_bias = ptr(bk), w.v_proj_bias = ptr(bv), w.out_proj_bias = ptr(bo);
        w.norm_weight = ptr(gamma), w.norm_bias = ptr(beta);
        return mha::MultiheadAttention(w, c);
    }
};

// x [Lq, E] (row stride E) times W [heads·d, E]ᵀ plus b, as heads [1, heads, Lq, d], with the projection bound.
inline HeadsD project_rows(const float* x, std::size_t Lq, std::size_t E, const float* w, const float* bias, std::size_t heads,
                           std::size_t d) {
    HeadsD y(1, heads, Lq, d);
    for (std::size_t i = 0; i < Lq; ++i)
        for (std::size_t n = 0; n < heads * d; ++n) {
            double sum = bias ? double(bias[n]) : 0.0, mag = std::abs(sum);
            for (std::size_t k = 0; k < E; ++k) {
                const double t = double(x[i * E + k]) * double(w[n * E + k]);
                sum += t, mag += std::abs(t);
            }
            const std::size_t at = y.at(0, n / d, i, n % d);
            y.val[at] = sum, y.err[at] = mha_test::rounding_growth(E + 1) * kU * mag;
        }
    return y;
}

// Rotates every head row of x [1, heads, L, d]: row i at position start + i.
inline void rope_rows(HeadsD& x, const mha::RopeConfig& rc, std::size_t start) {
    const std::size_t r = rc.dims ? rc.dims : x.d, half = r / 2;
    for (std::size_t h = 0; h < x.H; ++h)
        for (std::size_t i = 0; i < x.L; ++i)
            for (std::size_t k = 0; k < half; ++k) {
                const double theta_k = std::pow(double(rc.theta), -2.0 * double(k) / double(r));
                const double angle = double(start + i) * theta_k, co = std::cos(angle), si = std::sin(angle);
                const std::size_t i1 = x.at(0, h, i, rc.style == mha::RopeStyle::half ? k : 2 * k);
                const std::size_t i2 = x.at(0, h, i, rc.style == mha::RopeStyle::half ? k + half : 2 * k + 1);
                const double x1 = x.val[i1], x2 = x.val[i2], e1 = x.err[i1], e2 = x.err[i2];
                const double mag = std::abs(x1) * std::abs(co) + std::abs(x2) * std::abs(si);
                const double mag2 = std::abs(x2) * std::abs(co) + std::abs(x1) * std::abs(si);
                x.val[i1] = x1 * co - x2 * si, x.val[i2] = x2 * co + x1 * si;
                x.err[i1] = std::abs(co) * e1 + std::abs(si) * e2 + 4 * kU * mag;
                x.err[i2] = std::abs(co) * e2 + std::abs(si) * e1 + 4 * kU * mag2;
            }
}

struct KVRounding {
    double rel = 0.0, abs = 0.0;
    bool cached_rows = false;
    static KVRounding of(mha::DataType t, bool cached = false) {
        if (t == mha::DataType::bf16) return {0x1p-8, 0.0, cached};
        if (t == mha::DataType::f16) return {0x1p-11, 0x1p-25, cached};
        return {0.0, 0.0, cached};
    }
};

struct StepExpected {
    std::size_t B = 0, Lq = 0, E = 0;
    std::vector<double> out, out_err;  // [B, Lq, E]
    HeadsD k, v;                       // the new tokens' rows as the cache stores them (K rotated), [B, Hkv, Lq, d]
};

// One forward with a cache in double (see the top of this file): x [B, Lq, E] contiguous, the cache as it
// is before the call (nullptr: empty, every length 0).
inline StepExpected step_double(const LayerRef& L, const float* x, std::size_t B, std::size_t Lq, const mha::KVCache* cache,
                                KVRounding rounding = {}, const mha::KVCache* appended = nullptr) {
    const std::size_t E = L.E, H = L.H, Hkv = L.Hkv, d = L.d, Hd = H * d;
    StepExpected ex;
    ex.B = B, ex.Lq = Lq, ex.E = E;
    ex.out.assign(B * Lq * E, 0.0), ex.out_err.assign(B * Lq * E, 0.0);
    ex.k = HeadsD(B, Hkv, Lq, d), ex.v = HeadsD(B, Hkv, Lq, d);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t n = cache ? cache->length(b) : 0;
        const float* xb = x + b * Lq * E;
        HeadsD q = project_rows(xb, Lq, E, L.wq, L.bq, H, d);
        HeadsD k = project_rows(xb, Lq, E, L.wk, L.bk, Hkv, d);
        const HeadsD v = project_rows(xb, Lq, E, L.wv, L.bv, Hkv, d);
        if (L.rope) {
            rope_rows(q, *L.rope, n);
            rope_rows(k, *L.rope, n);
        }
        HeadsD K(1, Hkv, n + Lq, d), V(1, Hkv, n + Lq, d);
        for (std::size_t h = 0; h < Hkv; ++h) {
            if (n > 0) {
                std::vector<float> ck(n * d), cv(n * d);  // any element type, widened exactly
                cache->copy_keys(b, h, mha::Matrix(ck.data(), n, d));
                cache->copy_values(b, h, mha::Matrix(cv.data(), n, d));
                for (std::size_t j = 0; j < n; ++j)
                    for (std::size_t c = 0; c < d; ++c) {
                        const std::size_t at = K.at(0, h, j, c);
                        K.val[at] = ck[j * d + c], V.val[at] = cv[j * d + c];
                        if (rounding.cached_rows)
                            K.err[at] = rounding.rel * std::abs(K.val[at]) + rounding.abs,
                            V.err[at] = rounding.rel * std::abs(V.val[at]) + rounding.abs;
                    }
            }
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t c = 0; c < d; ++c) {
                    const std::size_t to = K.at(0, h, n + i, c), from = k.at(0, h, i, c), mine = ex.k.at(b, h, i, c);
                    K.val[to] = k.val[from], K.err[to] = k.err[from] + rounding.rel * std::abs(k.val[from]) + rounding.abs;
                    V.val[to] = v.val[from], V.err[to] = v.err[from] + rounding.rel * std::abs(v.val[from]) + rounding.abs;
                    ex.k.val[mine] = k.val[from], ex.k.err[mine] = K.err[to];
                    ex.v.val[mine] = v.val[from], ex.v.err[mine] = V.err[to];
                }
            if (appended != nullptr) {
                std::vector<float> ak((n + Lq) * d), av(ak.size());
                appended->copy_keys(b, h, mha::Matrix(ak.data(), n + Lq, d));
                appended->copy_values(b, h, mha::Matrix(av.data(), n + Lq, d));
                for (std::size_t i = 0; i < Lq; ++i)
                    for (std::size_t c = 0; c < d; ++c) {
                        const std::size_t to = K.at(0, h, n + i, c);
                        K.val[to] = ak[(n + i) * d + c], V.val[to] = av[(n + i) * d + c], K.err[to] = V.err[to] = 0.0;
                    }
            }
        }
        mha_test::CoreSpec spec;
        spec.scale = double(1.0f / std::sqrt(static_cast<float>(d)));  // the float the library uses
        spec.causal = true, spec.alignment = mha::CausalAlignment::bottom_right, spec.mods = L.mods;
        const mha_test::CoreExpected core = mha_test::core_double(q, K, V, spec);
        for (std::size_t i = 0; i < Lq; ++i) {
            std::vector<double> o(E), eo(E);
            for (std::size_t e = 0; e < E; ++e) {
                double sum = L.bo ? double(L.bo[e]) : 0.0, mag = std::abs(sum), prop = 0.0, prop2 = 0.0;
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t t = 0; t < d; ++t) {
                        const double w = L.wo[e * Hd + h * d + t];
                        const std::size_t at = core.ctx.at(0, h, i, t);
                        const double te = core.ctx.err[at] * std::abs(w);
                        sum += core.ctx.val[at] * w, mag += std::abs(core.ctx.val[at] * w), prop += te, prop2 += te * te;
                    }
                o[e] = sum, eo[e] = mha_test::independent_sum(prop, prop2) + mha_test::rounding_growth(Hd + 1) * kU * mag;
            }
            if (L.norm_eps) {
                const float* xr = xb + i * E;
                double mean = 0.0, var = 0.0;
                for (std::size_t e = 0; e < E; ++e) {
                    o[e] += xr[e];
                    eo[e] += kU * std::abs(o[e]);  // the float residual add
                    mean += o[e] / double(E);
                }
                for (std::size_t e = 0; e < E; ++e) var += (o[e] - mean) * (o[e] - mean) / double(E);
                const double r = 1.0 / std::sqrt(var + double(*L.norm_eps)), gE = mha_test::rounding_growth(E);
                double mean_e = 0.0, mean_ye = 0.0;
                for (std::size_t e = 0; e < E; ++e) {
                    mean_e += eo[e] / double(E);
                    mean_ye += std::abs((o[e] - mean) * r) * eo[e] / double(E);
                }
                for (std::size_t e = 0; e < E; ++e) {
                    const double g = L.gamma ? double(L.gamma[e]) : 1.0, be = L.beta ? double(L.beta[e]) : 0.0;
                    const double yhat = (o[e] - mean) * r, y = g * yhat + be;
                    const double own = std::abs(g) * ((gE / 2 + 6) * kU * std::abs(yhat) + (gE + 2) * kU) + kU * std::abs(y);
                    eo[e] = std::abs(g) * r * (eo[e] + mean_e + std::abs(yhat) * mean_ye) + own;
                    o[e] = y;
                }
            }
            for (std::size_t e = 0; e < E; ++e) ex.out[(b * Lq + i) * E + e] = o[e], ex.out_err[(b * Lq + i) * E + e] = eo[e];
        }
    }
    return ex;
}

// Cached prefixes for a decode step: per sequence b, K [1, Hkv, prefix[b], d] uniform in ±2 (the magnitude the
// projections give) and V uniform in ±0.5 plus a mean per (KV head, column), as trained values have, so that
// outputs over hundreds of keys do not average out to near zero (which would leave the Σ p·|v| bounds large).
inline void random_prefixes(std::size_t Hkv, std::size_t d, const std::vector<std::size_t>& prefix, std::uint32_t seed,
                            std::vector<std::vector<float>>& pk, std::vector<std::vector<float>>& pv) {
    const std::vector<float> mean = uniform(Hkv * d, 1.0f, seed + 500);
    for (std::size_t b = 0; b < prefix.size(); ++b) {
        pk.push_back(uniform(Hkv * prefix[b] * d, 2.0f, seed + 10 * std::uint32_t(b)));
        pv.push_back(uniform(Hkv * prefix[b] * d, 0.5f, seed + 10 * std::uint32_t(b) + 1));
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < prefix[b]; ++j)
                for (std::size_t c = 0; c < d; ++c) pv[b][(h * prefix[b] + j) * d + c] += mean[h * d + c];
    }
}

inline std::vector<double> times(const std::vector<double>& x, double c) {
    std::vector<double> y(x);
    for (double& t : y) t *= c;
    return y;
}
inline std::vector<double> as_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

// Rows [i0, i0 + n) of every batch of x [B, L, E] as a contiguous [B, n, E] vector.
template <class T>
std::vector<T> rows_of(const std::vector<T>& x, std::size_t B, std::size_t L, std::size_t E, std::size_t i0, std::size_t n) {
    std::vector<T> y(B * n * E);
    for (std::size_t b = 0; b < B; ++b)
        std::copy_n(x.begin() + std::ptrdiff_t((b * L + i0) * E), n * E, y.begin() + std::ptrdiff_t(b * n * E));
    return y;
}

// The first length(b) rows of every (b, KV head) of a cache's keys or values, in order, and the same rows
// of a HeadsD [B, Hkv, L, d] (its first n_b rows of batch b).
inline std::vector<float> cached_rows(const mha::KVCache& c, bool values) {
    std::vector<float> r;
    for (std::size_t b = 0; b < c.batch(); ++b)
        for (std::size_t h = 0; h < c.kv_heads(); ++h) {
            const mha::ConstMatrix m = values ? c.values(b, h) : c.keys(b, h);
            for (std::size_t j = 0; j < m.rows; ++j) r.insert(r.end(), m.row(j), m.row(j) + m.cols);
        }
    return r;
}

// Everything a cache holds: lengths, and the whole key and value storage (stale rows included).
struct CacheSnapshot {
    std::vector<std::size_t> lengths;
    std::vector<float> keys, values;
    explicit CacheSnapshot(const mha::KVCache& c) : lengths(c.lengths()) {
        const std::size_t n = c.batch() * c.kv_heads() * c.capacity() * c.head_dim();
        keys.assign(c.keys().data, c.keys().data + n);
        values.assign(c.values().data, c.values().data + n);
    }
    // Bitwise (NaN-safe).
    bool operator==(const CacheSnapshot& o) const;
};

// A cache whose whole storage holds `fill` (so that snapshots compare defined values), every length 0.
inline mha::KVCache filled_cache(std::size_t B, std::size_t Hkv, std::size_t d, std::size_t capacity, float fill = 0.0f,
                                 mha::DataType type = mha::DataType::f32) {
    mha::KVCache c(B, Hkv, d, capacity, type);
    const std::size_t n = B * Hkv * capacity * d;
    if (type == mha::DataType::f32) {
        std::fill(mha::detail::KVCacheAccess::key_data(c), mha::detail::KVCacheAccess::key_data(c) + n, fill);
        std::fill(mha::detail::KVCacheAccess::value_data(c), mha::detail::KVCacheAccess::value_data(c) + n, fill);
    } else {
        const std::uint16_t h = type == mha::DataType::bf16 ? mha::bfloat16::from_float(fill).bits : mha::float16::from_float(fill).bits;
        std::fill_n(static_cast<std::uint16_t*>(mha::detail::KVCacheAccess::key_storage(c)), n, h);
        std::fill_n(static_cast<std::uint16_t*>(mha::detail::KVCacheAccess::value_storage(c)), n, h);
    }
    return c;
}

// Bitwise equality of float vectors (compare_util.hpp).
using mha_test::same_bits;

inline bool CacheSnapshot::operator==(const CacheSnapshot& o) const {
    return lengths == o.lengths && same_bits(keys, o.keys) && same_bits(values, o.values);
}

}  // namespace mha_decode_test
