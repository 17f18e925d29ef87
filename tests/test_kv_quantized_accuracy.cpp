// Attention over an 8-bit KV cache (int8, fp8_e4m3, fp8_e5m2; mha/quantized.hpp) against a float64 evaluation
// over the unquantized keys and values, with the error bounds of docs/kv-quantization.md. Through
// mha::paged_attention over a caller's pool (level 2: the library's decode path for q = 1, the widened prefill
// path for q = 20), on every ISA of this CPU, with normal keys and with keys whose channels 3, 50, 77 and 101 are
// 30x the rest (as real models' keys have).
//   1. Every stored value within its format's error bound e of the true value (int8: half the block's step, the
//      clamp aside; fp8: half an ulp of the scaled value, the subnormal spacing below the normals).
//   2. The worst-case bound (rigorous; loose by about sqrt(d)):
//        |o^ - o| <= sum_j p^_j e_v,j + sum_j p_j (exp(|dz_j| + Z) - 1) |v_j - o|,   |dz_j| <= scale sum_c |q_c| e_k,jc,
//      Z = max_j |dz_j|; plus the fp32 evaluation's own error over the stored values (the same formula with
//      dz_j = gamma_{d+3} scale sum_c |q_c k^_jc| + 8u(|z^_j| + 1) and the values' gamma_{n+9} |v^_j|: int8 V's
//      block scale folded into P is one rounding more; then 4u |o^|),
//      times 2.
//   3. The model bound (independent roundings, each uniform within its bound: standard deviation e / sqrt(3);
//      first order): var_o = sum_j p_j^2 ((v_j - o)^2 var_z,j + var_v,j), var_z,j = scale^2 sum_c q_c^2 var_k,jc,
//      and |o^ - o| <= 6 sqrt(var_o) plus twice the fp32 term. It is what tells a right result from a wrong one
//      (a misapplied scale fails it: ScaleErrorBreaksTheModelBound), and it stays small against the values. Checked
//      on normal keys only: with the outlier channels the score errors reach order 1 and first order fails (the
//      worst-case bound still holds there).
//   4. llama.cpp's q8_0 reproduced here (the same blocks, scale and bytes per value): the int8 cache's stored
//      values are never farther from the truth than q8_0's (the nearest step of the stored scale, where q8_0 rounds
//      x / d with the unrounded d), and its attention output error (RMS over every output, both evaluated by the
//      library) is q8_0's within 1 % (the two differ only in the few values q8_0 rounds to the farther step, whose
//      effect on an output can have either sign). Where the decode path quantizes the queries (int8 scores on integer
//      dot products, AVX512_VNNI at the avx512_bf16 level), q8_0's queries are quantized to q8_0 too, as ggml's flash
//      attention does for q8_0 keys, and the bounds of 2 and 3 take the queries' rounding (half a step of their
//      block's scale) against the stored keys.
// fp8 scales 1, and as vLLM calibrates them (amax / largest finite value).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "isa_test_util.hpp"
#include "simd/decode.hpp"

namespace {

using mha::DataType;

constexpr double kU = 0x1p-24;
double gamma(std::size_t k) { return double(k) * kU / (1.0 - double(k) * kU); }

struct Problem {
    std::size_t H = 8, Hkv = 2, d = 128, L = 300, q = 1;
    std::vector<float> Q, K, V;  // Q [q, H·d]; K, V [L, Hkv·d] token-major
};

Problem make_problem(std::size_t q, std::size_t L, bool outliers, std::uint32_t seed) {
    Problem p;
    p.q = q, p.L = L;
    std::mt19937 gen(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    p.Q.resize(q * p.H * p.d);
    p.K.resize(L * p.Hkv * p.d);
    p.V.resize(p.K.size());
    for (float& x : p.Q) x = n(gen);
    for (float& x : p.K) x = n(gen);
    for (float& x : p.V) x = n(gen);
    if (outliers)  // channels 30× the rest in every key row (and in the queries' view of them: large scores)
        for (std::size_t j = 0; j < L * p.Hkv; ++j)
            for (std::size_t c : {3u, 50u, 77u, 101u}) p.K[j * p.d + c] *= 30.0f;
    return p;
}

// The stored rows read back (as the cache dequantizes them): [L, Hkv·d].
struct Stored {
    std::vector<float> K, V;
};

// Runs paged_attention over a pool of type t (blocks of 16 in a scrambled order); returns out [q, H·d] and the
// stored rows read back through a PagedKVCache-free dequantization of the pool's bytes.
std::vector<float> run_library(const Problem& p, DataType t, float k_scale, float v_scale, Stored& stored) {
    const std::size_t bs = 16, nb = (p.L + bs - 1) / bs + 3, row = mha::kv_row_bytes(t, p.d);
    std::vector<unsigned char> kbuf(nb * p.Hkv * bs * row, 0xff), vbuf(kbuf.size(), 0xff);
    const mha::PagedKVPool pool{kbuf.data(), vbuf.data(), t, nb, bs, p.Hkv, p.d, k_scale, v_scale};
    std::vector<std::uint32_t> table((p.L + bs - 1) / bs);
    std::size_t step = 7;
    while (std::gcd(step, nb) != 1) step += 2;  // a permutation of the blocks: ids out of order
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::uint32_t>((i * step + 2) % nb);
    std::vector<std::int64_t> slots(p.L);
    for (std::size_t j = 0; j < p.L; ++j) slots[j] = std::int64_t(table[j / bs] * bs + j % bs);
    mha::paged_write_kv(pool, mha::ConstMatrix(p.K.data(), p.L, p.Hkv * p.d), mha::ConstMatrix(p.V.data(), p.L, p.Hkv * p.d),
                        slots.data());
    const std::vector<std::size_t> lengths = {p.L}, starts = {0, p.q};
    std::vector<float> out(p.q * p.H * p.d, std::numeric_limits<float>::quiet_NaN());
    mha::paged_attention(mha::ConstMatrix(p.Q.data(), p.q, p.H * p.d), pool, {1, table.data(), table.size(), lengths.data(), starts.data()},
                         mha::Matrix(out.data(), p.q, p.H * p.d));
    // Read the stored rows back: row j of head h at block table[j / bs], row j % bs.
    stored.K.resize(p.K.size());
    stored.V.resize(p.V.size());
    for (std::size_t j = 0; j < p.L; ++j)
        for (std::size_t h = 0; h < p.Hkv; ++h) {
            const std::size_t at = ((std::size_t(table[j / bs]) * p.Hkv + h) * bs + j % bs) * row;
            for (int which = 0; which < 2; ++which) {
                const unsigned char* src = (which == 0 ? kbuf : vbuf).data() + at;
                float* dst = (which == 0 ? stored.K : stored.V).data() + (j * p.Hkv + h) * p.d;
                const float s = which == 0 ? k_scale : v_scale;
                for (std::size_t c = 0; c < p.d; ++c) {
                    if (t == DataType::f32)
                        std::memcpy(dst + c, src + 4 * c, 4);
                    else if (t == DataType::int8)
                        dst[c] = float(reinterpret_cast<const std::int8_t*>(src)[c]) * mha::int8_row_scale(src, p.d, c / 32);
                    else if (t == DataType::fp8_e4m3)
                        dst[c] = mha::fp8_e4m3::from_bits(src[c]).to_float() * s;
                    else
                        dst[c] = mha::fp8_e5m2::from_bits(src[c]).to_float() * s;
                }
            }
        }
    return out;
}

// Exact attention (double) of query row i, head h over keys [0, L − q + i] of (K, V): probabilities and output.
struct Exact {
    std::vector<double> p, o;
    std::vector<double> z;
};
Exact attend(const Problem& p, const std::vector<float>& K, const std::vector<float>& V, std::size_t i, std::size_t h) {
    const std::size_t G = p.H / p.Hkv, kvh = h / G, n = p.L - p.q + i + 1, d = p.d;
    const double scale = 1.0 / std::sqrt(double(d));
    Exact e;
    e.z.resize(n);
    e.p.resize(n);
    e.o.assign(d, 0.0);
    double mx = -1e300;
    for (std::size_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::size_t c = 0; c < d; ++c) s += double(p.Q[(i * p.H + h) * d + c]) * K[(j * p.Hkv + kvh) * d + c];
        e.z[j] = s * scale;
        mx = std::max(mx, e.z[j]);
    }
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) sum += e.p[j] = std::exp(e.z[j] - mx);
    for (std::size_t j = 0; j < n; ++j) {
        e.p[j] /= sum;
        for (std::size_t c = 0; c < d; ++c) e.o[c] += e.p[j] * V[(j * p.Hkv + kvh) * d + c];
    }
    return e;
}

// The propagation bound of the header for output column c: probabilities p and output o of the exact attention,
// values v (row j, column c via v(j)), score errors dz, value errors dv(j).
template <class VF, class DVF>
double propagate(const Exact& e, std::size_t c, const std::vector<double>& dz, VF v, DVF dv) {
    const double E = *std::max_element(dz.begin(), dz.end());
    double b = 0;
    for (std::size_t j = 0; j < e.p.size(); ++j) {
        const double grow = std::exp(dz[j] + E);
        b += e.p[j] * grow * dv(j) + e.p[j] * (grow - 1.0) * std::abs(v(j) - e.o[c]);
    }
    return b;
}

// Each stored element within its format's error of the true value; the errors' bounds returned in e.K / e.V.
void check_stored(const Problem& p, const Stored& s, DataType t, float k_scale, float v_scale, Stored& e) {
    e.K.assign(p.K.size(), 0.0f);
    e.V.assign(p.V.size(), 0.0f);
    for (int which = 0; which < 2; ++which) {
        const std::vector<float>& x = which == 0 ? p.K : p.V;
        const std::vector<float>& y = which == 0 ? s.K : s.V;
        const double scale = which == 0 ? k_scale : v_scale;
        for (std::size_t r = 0; r < x.size() / p.d; ++r)
            for (std::size_t b0 = 0; b0 < p.d; b0 += 32) {
                double amax = 0;
                for (std::size_t c = b0; c < b0 + 32; ++c) amax = std::max(amax, std::abs(double(x[r * p.d + c])));
                const double step = mha::float16::from_float(float(amax / 127.0)).to_float();
                for (std::size_t c = b0; c < b0 + 32; ++c) {
                    const double xv = x[r * p.d + c], err = std::abs(xv - y[r * p.d + c]);
                    double allowed = 0;
                    if (t == DataType::int8) {
                        allowed = std::max(step / 2, std::abs(xv) - 127 * step) * (1 + 1e-12);
                    } else {
                        const int mant = t == DataType::fp8_e4m3 ? 3 : 2, emin = t == DataType::fp8_e4m3 ? -6 : -14;
                        const double a = std::abs(xv) / scale;
                        const int e = std::max(emin, int(std::floor(std::log2(std::max(a, 1e-300)))));
                        allowed = (std::ldexp(1.0, e - mant) / 2) * scale * (1 + 1e-6) + 1e-7 * std::abs(xv);
                    }
                    ASSERT_LE(err, allowed) << (which ? "V" : "K") << " row " << r << " col " << c << ": " << xv << " stored as "
                                            << y[r * p.d + c];
                    (which == 0 ? e.K : e.V)[r * p.d + c] = float(allowed);
                }
            }
    }
}

// The bounds on |out - exact over the true K, V| for every output element (e: the stored values' error bounds),
// and the RMS of the errors.
struct Check {
    std::size_t outside_worst = 0, outside_model = 0;
    double worst_ratio = 0, model_ratio = 0, rms = 0, model_over_v = 0;
};
// e_q: where the library quantizes the queries (int8 scores on dot products), each query value's error bound
// [q, H·d] (half its block's step), else empty.
Check check_output(const Problem& p, const std::vector<float>& out, const Stored& s, const Stored& e,
                   const std::vector<double>& e_q = {}) {
    Check r;
    const double scale = 1.0 / std::sqrt(double(p.d)), lambda = 6.0;
    double sq = 0, vmax = 0;
    for (float v : p.V) vmax = std::max(vmax, double(std::abs(v)));
    std::size_t count = 0;
    for (std::size_t i = 0; i < p.q; ++i)
        for (std::size_t h = 0; h < p.H; ++h) {
            const std::size_t kvh = h / (p.H / p.Hkv), d = p.d;
            const Exact truth = attend(p, p.K, p.V, i, h), stored = attend(p, s.K, s.V, i, h);
            const std::size_t n = truth.p.size();
            std::vector<double> dz_q(n), var_z(n), dz_f(n);
            for (std::size_t j = 0; j < n; ++j) {
                double a = 0, b = 0, v2 = 0;
                for (std::size_t c = 0; c < d; ++c) {
                    const double qc = double(p.Q[(i * p.H + h) * d + c]), ek = e.K[(j * p.Hkv + kvh) * d + c];
                    a += std::abs(qc) * ek;
                    v2 += qc * qc * ek * ek / 3.0;
                    if (!e_q.empty()) {  // (q^ − q)·k^: the query's rounding against the stored key
                        const double eq = e_q[(i * p.H + h) * d + c], kc = double(s.K[(j * p.Hkv + kvh) * d + c]);
                        a += eq * std::abs(kc);
                        v2 += eq * eq * kc * kc / 3.0;
                    }
                    b += std::abs(qc * double(s.K[(j * p.Hkv + kvh) * d + c]));
                }
                dz_q[j] = scale * a;
                var_z[j] = scale * scale * v2;
                dz_f[j] = gamma(d + 3) * scale * b + 8 * kU * (std::abs(stored.z[j]) + 1);
            }
            for (std::size_t c = 0; c < d; ++c) {
                auto v_true = [&](std::size_t j) { return double(p.V[(j * p.Hkv + kvh) * d + c]); };
                auto v_stored = [&](std::size_t j) { return double(s.V[(j * p.Hkv + kvh) * d + c]); };
                auto e_v = [&](std::size_t j) { return double(e.V[(j * p.Hkv + kvh) * d + c]); };
                const double fp32 = propagate(stored, c, dz_f, v_stored, [&](std::size_t j) { return gamma(n + 9) * std::abs(v_stored(j)); }) +
                                    4 * kU * std::abs(stored.o[c]);
                const double worst = 2 * (propagate(truth, c, dz_q, v_true, e_v) + fp32);
                double var = 0;
                for (std::size_t j = 0; j < n; ++j) {
                    const double dv = v_true(j) - truth.o[c];
                    var += truth.p[j] * truth.p[j] * (dv * dv * var_z[j] + e_v(j) * e_v(j) / 3.0);
                }
                const double model = lambda * std::sqrt(var) + 2 * fp32;
                const double err = std::abs(out[(i * p.H + h) * d + c] - truth.o[c]);
                if (!(err <= worst)) ++r.outside_worst;
                if (!(err <= model)) ++r.outside_model;
                r.worst_ratio = std::max(r.worst_ratio, err / worst);
                r.model_ratio = std::max(r.model_ratio, err / model);
                r.model_over_v = std::max(r.model_over_v, model / vmax);
                sq += err * err;
                ++count;
            }
        }
    r.rms = std::sqrt(sq / double(count));
    return r;
}

// Whether the library's decode path quantizes this problem's queries (int8 K on dot products at the current ISA),
// and then each query value's error bound: half the step of its block of 32 (s = amax / 127 in fp32; amax / s
// rounds to 127, so the clamp at ±127 costs nothing).
bool queries_quantized(const Problem& p, DataType t) {
    return t == DataType::int8 && p.q <= 16 && mha::simd::int8_scores_on_dot_products(p.H / p.Hkv * p.q, p.d);
}
std::vector<double> query_errors(const Problem& p) {
    std::vector<double> e(p.Q.size());
    for (std::size_t b0 = 0; b0 < p.Q.size(); b0 += 32) {
        float amax = 0;
        for (std::size_t c = b0; c < b0 + 32; ++c) amax = std::max(amax, std::abs(p.Q[c]));
        const double step = amax / 127.0f;
        for (std::size_t c = b0; c < b0 + 32; ++c) e[c] = step / 2 * (1 + 1e-6);
    }
    return e;
}

// fp8 scales as vLLM calibrates them: the tensor's largest magnitude over the format's largest finite value.
float calibrated(const std::vector<float>& x, DataType t) {
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::abs(v));
    return amax / (t == DataType::fp8_e4m3 ? 448.0f : 57344.0f);
}

struct TypeCase {
    DataType t;
    bool calibrate;  // fp8: scales from the data (else 1)
};
std::string name(const TypeCase& c) { return std::string(mha::data_type_name(c.t)) + (c.calibrate ? " calibrated scales" : ""); }

const TypeCase kTypes[] = {{DataType::int8, false}, {DataType::fp8_e4m3, false}, {DataType::fp8_e4m3, true},
                           {DataType::fp8_e5m2, false}, {DataType::fp8_e5m2, true}};

TEST(KVQuantizedAccuracy, WithinTheDerivedBoundsOnEveryPathAndIsa) {
    for (const TypeCase& tc : kTypes)
        for (std::size_t q : {std::size_t(1), std::size_t(20)})
            for (bool outliers : {false, true}) {
                SCOPED_TRACE(name(tc) + ", q " + std::to_string(q) + (outliers ? ", outlier channels" : ""));
                const Problem p = make_problem(q, 300, outliers, 31 + std::uint32_t(q));
                const float ks = tc.calibrate ? calibrated(p.K, tc.t) : 1.0f, vs = tc.calibrate ? calibrated(p.V, tc.t) : 1.0f;
                mha_test::for_each_cpu_isa([&] {
                    Stored s, e;
                    const std::vector<float> out = run_library(p, tc.t, ks, vs, s);
                    check_stored(p, s, tc.t, ks, vs, e);
                    const Check r = check_output(p, out, s, e, queries_quantized(p, tc.t) ? query_errors(p) : std::vector<double>{});
                    EXPECT_EQ(r.outside_worst, 0u) << "worst error / worst-case bound " << r.worst_ratio;
                    if (outliers) return;  // score errors of order 1 (a block's step set by a 30x channel): not first order
                    EXPECT_EQ(r.outside_model, 0u) << "worst error / model bound " << r.model_ratio;
                    // Not vacuous: the model bound stays a small part of the values' range, near the errors.
                    EXPECT_LT(r.model_over_v, tc.t == DataType::fp8_e5m2 ? 0.2 : tc.t == DataType::fp8_e4m3 ? 0.1 : 0.02);
                    EXPECT_GT(r.model_ratio, 0.02) << "the model bound is far above every error";
                }, true);
            }
}

// A misapplied scale fails the model bound: int8 value blocks read in their neighbours' places, or fp8 values read
// with the scale doubled (done here on the stored rows: the library's own path is what the other tests check).
TEST(KVQuantizedAccuracy, ScaleErrorBreaksTheModelBound) {
    const Problem p = make_problem(1, 300, false, 41);
    for (const TypeCase& tc : {kTypes[0], kTypes[2]}) {
        SCOPED_TRACE(name(tc));
        const float ks = tc.calibrate ? calibrated(p.K, tc.t) : 1.0f, vs = tc.calibrate ? calibrated(p.V, tc.t) : 1.0f;
        Stored s, e;
        (void)run_library(p, tc.t, ks, vs, s);
        check_stored(p, s, tc.t, ks, vs, e);
        Stored wrong = s;
        if (tc.t == DataType::int8) {
            for (std::size_t r = 0; r < p.L * p.Hkv; ++r)
                for (std::size_t c = 0; c < 32; ++c) std::swap(wrong.V[r * p.d + c], wrong.V[r * p.d + 32 + c]);
        } else {
            for (float& x : wrong.V) x *= 2.0f;
        }
        std::vector<float> out(p.q * p.H * p.d);
        for (std::size_t h = 0; h < p.H; ++h) {
            const Exact ex = attend(p, wrong.K, wrong.V, 0, h);
            for (std::size_t c = 0; c < p.d; ++c) out[h * p.d + c] = float(ex.o[c]);
        }
        EXPECT_GT(check_output(p, out, s, e).outside_model, 0u);
    }
}

// llama.cpp's q8_0 (ggml quantize_row_q8_0_ref): d = amax / 127, q = round(x / d) half away from zero, d stored as
// float16; the value is q·float16(d).
void q8_0_round_trip(const float* x, std::size_t n, float* y) {
    for (std::size_t b0 = 0; b0 < n; b0 += 32) {
        float amax = 0;
        for (std::size_t c = b0; c < b0 + 32; ++c) amax = std::max(amax, std::abs(x[c]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f, d16 = mha::float16::from_float(d).to_float();
        for (std::size_t c = b0; c < b0 + 32; ++c) y[c] = std::round(x[c] * id) * d16;
    }
}

TEST(KVQuantizedAccuracy, Int8AsAccurateAsQ8_0) {
    for (bool outliers : {false, true})
        for (std::size_t q : {std::size_t(1), std::size_t(20)}) {
            SCOPED_TRACE(std::string(outliers ? "outlier channels" : "normal keys") + ", q " + std::to_string(q));
            const Problem p = make_problem(q, 500, outliers, 51 + std::uint32_t(q));
            Stored ours;
            const std::vector<float> out = run_library(p, DataType::int8, 1, 1, ours);
            Stored q8;
            q8.K.resize(p.K.size());
            q8.V.resize(p.V.size());
            for (std::size_t r = 0; r < p.K.size() / p.d; ++r) {
                q8_0_round_trip(p.K.data() + r * p.d, p.d, q8.K.data() + r * p.d);
                q8_0_round_trip(p.V.data() + r * p.d, p.d, q8.V.data() + r * p.d);
            }
            // Every stored value at least as close to the truth as q8_0's.
            for (std::size_t i = 0; i < p.K.size(); ++i) {
                ASSERT_LE(std::abs(ours.K[i] - p.K[i]), std::abs(q8.K[i] - p.K[i])) << "K element " << i;
                ASSERT_LE(std::abs(ours.V[i] - p.V[i]), std::abs(q8.V[i] - p.V[i])) << "V element " << i;
            }
            // The attention output error of both through the library: ours from the int8 pool, q8_0's values from an
            // f32 pool (the same fp32 evaluation). Where our decode quantizes the queries (dot products), q8_0's
            // queries are quantized as ggml's flash attention does for q8_0 keys (to q8_0 itself).
            Problem p8 = p;
            p8.K = q8.K, p8.V = q8.V;
            if (queries_quantized(p, DataType::int8))
                for (std::size_t r = 0; r < p.Q.size() / p.d; ++r) q8_0_round_trip(p.Q.data() + r * p.d, p.d, p8.Q.data() + r * p.d);
            Stored unused;
            const std::vector<float> out8 = run_library(p8, DataType::f32, 1, 1, unused);
            double ours_sq = 0, q8_sq = 0;
            for (std::size_t i = 0; i < p.q; ++i)
                for (std::size_t h = 0; h < p.H; ++h) {
                    const Exact truth = attend(p, p.K, p.V, i, h);
                    for (std::size_t c = 0; c < p.d; ++c) {
                        const std::size_t at = (i * p.H + h) * p.d + c;
                        const double a = out[at] - truth.o[c], b = out8[at] - truth.o[c];
                        ours_sq += a * a, q8_sq += b * b;
                    }
                }
            EXPECT_LE(ours_sq, q8_sq * 1.01 * 1.01) << "RMS output error " << std::sqrt(ours_sq) << " vs q8_0 " << std::sqrt(q8_sq);
        }
}

}  // namespace
