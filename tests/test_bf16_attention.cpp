// bf16 compute (AttentionConfig::compute = DataType::bf16), checked with the bounds of docs/bf16-accuracy.md
// (derived per element by tests/bf16_test_util.hpp):
//   the scalar reference's bf16 mode against the float64 oracle (λ·e) and against the bf16 center
//   evaluation (λ·d); the fp32 reference must break the tight bound √2·λ·d on every case
//   (the tight bound tells bf16 from fp32, so a SIMD path that ignored compute would fail);
//   the SIMD backend with compute bf16 against the bf16 reference (√2·λ·d) and the oracle, on every
//   ISA of this CPU (sse2, avx2, avx512, neon widen bf16 to the fp32 kernels; avx512_bf16 runs vdpbf16ps,
//   neon_bf16 BFDOT) and every
//   impl: BERT-like self-attention with post-norm, GQA + RoPE causal, cross-attention with kdim / vdim,
//   masks, need_weights, KV cache decode steps, odd sizes and tails (E, d not multiples of 16, odd K, Lk 257),
//   narrow heads (d 8: bf16 panels wider than the fp32 ones) on the grouped path.
// Inputs and weights: uniform, like nn.Linear's init (±gain/√fan_in) and inputs in [-1, 1]; fixed seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention/attention_core.hpp"
#include "attention_test_util.hpp"
#include "bf16_test_util.hpp"
#include "compare_util.hpp"
#include "simd/gemm_bf16.hpp"

namespace {

using mha_bf16::kLambda;
using mha_bf16::kOracleFactor;
using mha_bf16::kTightFactor;
using mha_bf16::scaled;

// The bounds must stay meaningful: the oracle bound (λ·e) below kMaxOracleBound of the largest output, the
// tight bound (√2·λ·d) below kMaxTightBound.
constexpr double kMaxOracleBound = 0.05, kMaxTightBound = 0.05;

struct Case {
    const char* name;
    std::size_t E, H, Hkv, d, kdim = 0, vdim = 0;  // kdim / vdim 0: E
    std::size_t B = 1, Lq = 1, Lk = 1;
    bool self = false;    // key = value = query (Lk = Lq)
    bool packed = false;  // nn.MultiheadAttention's constructor (in_proj_weight [3E, E]); needs H·d = E, Hkv = H
    std::optional<mha::RopeConfig> rope{};
    std::size_t position_offset = 0;
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    int key_padding = 0;  // 0 none, 1 bool, 2 float
    int attn_mask = 0;    // 0 none, 1 2-D bool, 2 2-D additive, 3 3-D bool, 4 3-D additive
    std::optional<float> norm_eps{};
    float gain = 1.0f;  // Wq and Wk drawn gain times nn.Linear's init (peaked softmax rows)
    // Rows with one visible key (P = 1: no rounding of P, so the forwards differ only by fp32 sums and
    // rare flips) where the tight bound refuses an fp32 result (TightBoundRefusesFp32).
    bool tells_fp32 = false;
};

std::vector<float> uniform(std::size_t n, float bound, std::uint32_t seed) { return mha_test::random_floats(n, -bound, bound, seed); }

struct Data {
    Case c;
    std::size_t kdim, vdim, qw, kvw;
    mha_bf16::Weights w;
    std::vector<float> in_w, in_b;  // packed forms (c.packed)
    std::vector<float> query, key, value;
    mha_test::Mask kpm, am;

    explicit Data(const Case& cs, std::uint32_t seed = 11) : c(cs) {
        kdim = c.kdim ? c.kdim : c.E, vdim = c.vdim ? c.vdim : c.E, qw = c.H * c.d, kvw = c.Hkv * c.d;
        if (c.self) c.Lk = c.Lq;
        const float sE = 1.0f / std::sqrt(float(c.E)), sK = 1.0f / std::sqrt(float(kdim)), sV = 1.0f / std::sqrt(float(vdim)),
                    sO = 1.0f / std::sqrt(float(qw));
        w.wq = uniform(qw * c.E, c.gain * sE, seed), w.wk = uniform(kvw * kdim, c.gain * sK, seed + 1);
        w.wv = uniform(kvw * vdim, sV, seed + 2), w.wo = uniform(c.E * qw, sO, seed + 3);
        w.bq = uniform(qw, sE, seed + 4), w.bk = uniform(kvw, sK, seed + 5), w.bv = uniform(kvw, sV, seed + 6);
        w.bo = uniform(c.E, sO, seed + 7);
        if (c.norm_eps) w.norm_w = mha_test::random_floats(c.E, 0.5f, 1.5f, seed + 8), w.norm_b = uniform(c.E, 0.5f, seed + 9);
        if (c.packed) {
            in_w = w.wq, in_w.insert(in_w.end(), w.wk.begin(), w.wk.end()), in_w.insert(in_w.end(), w.wv.begin(), w.wv.end());
            in_b = w.bq, in_b.insert(in_b.end(), w.bk.begin(), w.bk.end()), in_b.insert(in_b.end(), w.bv.begin(), w.bv.end());
        }
        query = uniform(c.B * c.Lq * c.E, 1.0f, seed + 10);
        if (!c.self) key = uniform(c.B * c.Lk * kdim, 1.0f, seed + 11), value = uniform(c.B * c.Lk * vdim, 1.0f, seed + 12);
        mha_test::random_case_masks(c.key_padding, c.attn_mask, c.B, c.H, c.Lq, c.Lk, 0.2, 0.2, seed + 13, kpm, am);
    }
    const float* key_data() const { return c.self ? query.data() : key.data(); }
    const float* value_data() const { return c.self ? query.data() : value.data(); }

    mha::MultiheadAttention make(mha::DataType compute) const {
        mha::AttentionWeights aw;
        if (c.packed) {
            aw.in_proj_weight = in_w.data(), aw.in_proj_bias = in_b.data();
        } else {
            aw.q_proj_weight = w.wq.data(), aw.k_proj_weight = w.wk.data(), aw.v_proj_weight = w.wv.data();
            aw.q_proj_bias = w.bq.data(), aw.k_proj_bias = w.bk.data(), aw.v_proj_bias = w.bv.data();
        }
        aw.out_proj_weight = w.wo.data(), aw.out_proj_bias = w.bo.data();
        aw.norm_weight = w.norm_w.empty() ? nullptr : w.norm_w.data();
        aw.norm_bias = w.norm_b.empty() ? nullptr : w.norm_b.data();
        mha::AttentionConfig cfg;
        cfg.embed_dim = c.E, cfg.num_heads = c.H, cfg.num_kv_heads = c.Hkv, cfg.head_dim = c.d;
        cfg.kdim = c.kdim, cfg.vdim = c.vdim, cfg.rope = c.rope, cfg.compute = compute;
        return mha::MultiheadAttention(aw, cfg);
    }
    mha_bf16::Spec spec() const {
        mha_bf16::Spec s;
        s.E = c.E, s.H = c.H, s.Hkv = c.Hkv, s.d = c.d, s.kdim = kdim, s.vdim = vdim, s.B = c.B, s.Lq = c.Lq, s.Lk = c.Lk;
        s.rope = c.rope;
        if (s.rope && s.rope->dims == 0) s.rope->dims = c.d;
        s.key_start = c.position_offset;
        s.query_start = c.alignment == mha::CausalAlignment::bottom_right ? c.position_offset + c.Lk - c.Lq : c.position_offset;
        s.causal = c.causal, s.alignment = c.alignment;
        s.key_padding_mask = kpm.view(), s.attn_mask = am.view();
        s.norm_eps = c.norm_eps;
        return s;
    }
    mha_bf16::Expected expected() const { return mha_bf16::evaluate(spec(), w, query.data(), key_data(), value_data()); }

    struct Result {
        std::vector<float> output, weights;
    };
    Result run(const mha::MultiheadAttention& m, mha::Backend backend, mha::Impl impl = mha::Impl::automatic,
               mha::NeedWeights need = mha::NeedWeights::none) const {
        Result r;
        r.output.assign(c.B * c.Lq * c.E, NAN);
        if (need == mha::NeedWeights::averaged) r.weights.assign(c.B * c.Lq * c.Lk, NAN);
        if (need == mha::NeedWeights::per_head) r.weights.assign(c.B * c.H * c.Lq * c.Lk, NAN);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), c.B, c.Lq, c.E);
        if (!c.self) in.key = mha::ConstBatch(key.data(), c.B, c.Lk, kdim), in.value = mha::ConstBatch(value.data(), c.B, c.Lk, vdim);
        in.key_padding_mask = kpm.view(), in.attn_mask = am.view();
        mha::ForwardOptions o;
        o.backend = backend, o.impl = impl, o.need_weights = need, o.causal = c.causal, o.causal_alignment = c.alignment;
        o.position_offset = c.position_offset, o.norm_eps = c.norm_eps;
        m.forward(in, {mha::Batch(r.output.data(), c.B, c.Lq, c.E), r.weights.empty() ? nullptr : r.weights.data()}, o);
        return r;
    }
};

mha::RopeConfig rope(mha::RopeStyle style, std::size_t dims = 0) { return {10000.0f, dims, style}; }

const Case kCases[] = {
    {.name = "BERT-like self-attention E=768 H=12, packed, padding bool, post-norm", .E = 768, .H = 12, .Hkv = 12, .d = 64,
     .B = 2, .Lq = 48, .self = true, .packed = true, .key_padding = 1, .norm_eps = 1e-5f},
    {.name = "GQA G=4 + RoPE half, causal top-left, 2-D additive mask", .E = 256, .H = 8, .Hkv = 2, .d = 32, .B = 2, .Lq = 40,
     .self = true, .rope = rope(mha::RopeStyle::half), .causal = true, .attn_mask = 2, .gain = 2.0f, .tells_fp32 = true},
    {.name = "cross-attention kdim 40 vdim 56, d=24, padding float, 3-D bool", .E = 96, .H = 4, .Hkv = 4, .d = 24, .kdim = 40,
     .vdim = 56, .B = 2, .Lq = 17, .Lk = 33, .key_padding = 2, .attn_mask = 3},
    {.name = "odd: E=70 d=14 MQA, kdim 33 vdim 21, Lk=257, RoPE interleaved at 1000, causal bottom-right", .E = 70, .H = 5,
     .Hkv = 1, .d = 14, .kdim = 33, .vdim = 21, .B = 1, .Lq = 9, .Lk = 257, .rope = rope(mha::RopeStyle::interleaved),
     .position_offset = 1000, .causal = true, .alignment = mha::CausalAlignment::bottom_right, .gain = 2.0f},
    {.name = "long self-attention L=300 (online-softmax tiles), G=2, RoPE dims 8, causal, 3-D additive", .E = 48, .H = 4,
     .Hkv = 2, .d = 12, .B = 1, .Lq = 300, .self = true, .rope = rope(mha::RopeStyle::half, 8), .causal = true, .attn_mask = 4,
     .tells_fp32 = true},
    {.name = "cross-attention over one memory token (Lk = 1), G=2, E=128 d=40", .E = 128, .H = 4, .Hkv = 2, .d = 40, .B = 2,
     .Lq = 13, .Lk = 1, .tells_fp32 = true},
    {.name = "narrow heads d=8 (bf16 V panels wider than NEON's fp32 ones), G=4, B=2, Lq=37, causal", .E = 32, .H = 4,
     .Hkv = 1, .d = 8, .B = 2, .Lq = 37, .self = true, .causal = true},
};

constexpr mha::Impl kImpls[] = {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused};
const char* impl_name(mha::Impl i) { return i == mha::Impl::automatic ? "automatic" : i == mha::Impl::materialized ? "materialized" : "fused"; }

// The bf16 reference against the oracle and the center evaluation; the bounds stay meaningful.
TEST(Bf16Reference, WithinTheDerivedBounds) {
    for (const Case& cs : kCases) {
        SCOPED_TRACE(cs.name);
        const Data D(cs);
        const mha_bf16::Expected ex = D.expected();
        const std::vector<double> oracle_tol = scaled(ex.out.e, kOracleFactor), tight = scaled(ex.out.d, kTightFactor);
        EXPECT_LT(mha_test::relative_tolerance(ex.out.o, oracle_tol), kMaxOracleBound) << "oracle bound too loose";
        EXPECT_LT(mha_test::relative_tolerance(ex.out.o, tight), kMaxTightBound) << "tight bound too loose";
        const auto ref = D.run(D.make(mha::DataType::bf16), mha::Backend::scalar);
        EXPECT_TRUE(mha_test::all_within(ref.output, ex.out.o, oracle_tol)) << "bf16 reference against the float64 oracle";
        EXPECT_TRUE(mha_test::all_within(ref.output, ex.out.t, scaled(ex.out.d, kLambda))) << "bf16 reference against the center";
    }
}

// The tight bound tells bf16 from fp32 where it can: on rows with one visible key (causal first rows, a single
// memory token) the bf16 forwards round the same values and differ only by fp32 sums and rare flips, so the
// fp32 reference (and an fp32 SIMD path) is refused there; it stays well within the oracle bound (fp32 is more
// accurate, not wrong). On rows that spread their weight, the freedom to round P before or after normalizing
// makes the tight bound about as wide as the bf16 error itself (docs/bf16-accuracy.md).
TEST(Bf16Reference, TightBoundRefusesFp32) {
    for (const Case& cs : kCases) {
        SCOPED_TRACE(cs.name);
        const Data D(cs);
        const mha_bf16::Expected ex = D.expected();
        const auto f32 = D.run(D.make(mha::DataType::f32), mha::Backend::scalar);
        const auto ref = D.run(D.make(mha::DataType::bf16), mha::Backend::scalar);
        EXPECT_TRUE(mha_test::all_within(f32.output, ex.out.o, scaled(ex.out.e, kOracleFactor)));
        // Measured, relative to max|o|: the errors and the bounds (recorded as test properties).
        const double scale = mha_test::max_abs(ex.out.o);
        std::size_t refused = 0;
        for (std::size_t n = 0; n < ref.output.size(); ++n)
            refused += std::abs(double(f32.output[n]) - double(ref.output[n])) > kTightFactor * ex.out.d[n];
        RecordProperty(std::string("case ") + cs.name,
                       "bf16 ref err " + std::to_string(mha_test::max_abs_diff(ref.output, ex.out.o) / scale) + ", oracle bound " +
                           std::to_string(mha_test::max_abs(scaled(ex.out.e, kOracleFactor)) / scale) + ", |fp32 - bf16| " +
                           std::to_string(mha_test::max_abs_diff(f32.output, ref.output) / scale) + ", tight bound " +
                           std::to_string(mha_test::max_abs(scaled(ex.out.d, kTightFactor)) / scale) + ", refused " +
                           std::to_string(refused) + " of " + std::to_string(ref.output.size()));
        if (cs.tells_fp32) {
            EXPECT_GT(refused, 0u) << "the fp32 reference passes for bf16: the tight bound cannot tell them apart";
            // So would a SIMD path that ignored compute (its fp32 forward).
            const auto f32_simd = D.run(D.make(mha::DataType::f32), mha::Backend::simd);
            EXPECT_FALSE(mha_test::all_within(f32_simd.output, std::vector<double>(ref.output.begin(), ref.output.end()),
                                              scaled(ex.out.d, kTightFactor)));
        }
    }
}

// The bf16 mode rounds what it documents: a layer whose weights and inputs are already bfloat16 values and
// whose Q, K, V, P, C roundings are exact (all zeros but one key: P = 1; V = bias only) equals the fp32
// reference; otherwise bf16 and fp32 differ.
TEST(Bf16Reference, RoundsOnlyWhereDocumented) {
    Case cs{.name = "exact", .E = 16, .H = 2, .Hkv = 2, .d = 8, .B = 1, .Lq = 3, .Lk = 1};
    Data D(cs);
    for (auto* v : {&D.w.wq, &D.w.wk, &D.w.wo, &D.query, &D.key, &D.value, &D.w.bo})
        for (float& x : *v) x = mha::round_to_bf16(x);
    std::fill(D.w.wv.begin(), D.w.wv.end(), 0.0f);
    for (float& x : D.w.bv) x = mha::round_to_bf16(x);  // V = bv exactly, C = V (one key, P = 1): bf16 values
    const auto f32 = D.run(D.make(mha::DataType::f32), mha::Backend::scalar);
    const auto bf = D.run(D.make(mha::DataType::bf16), mha::Backend::scalar);
    // The output projection of bf16 C and Wo, summed in double vs float: equal to a few float ulps.
    EXPECT_TRUE(mha_test::all_within(bf.output, std::vector<double>(f32.output.begin(), f32.output.end()), 1e-6));
    D.w.bv[0] = 1.0f / 3.0f;  // not a bfloat16 value: C differs now
    const auto f32b = D.run(D.make(mha::DataType::f32), mha::Backend::scalar);
    const auto bfb = D.run(D.make(mha::DataType::bf16), mha::Backend::scalar);
    EXPECT_GT(mha_test::max_abs_diff(f32b.output, bfb.output), 2e-5);
}

// A model of the fast path, written here in plain float code: the documented roundings, every sum in float
// in its own order (projections and scores left to right, P·V over key tiles), and the online softmax's
// normalization after the rounding: per tile of kTile keys the running max m, e_j = exp(z_j − m) rounded to
// bfloat16 for P·V, the accumulator and the sum of the unrounded e_j rescaled by exp(m_old − m_new) when m
// grows, C = acc / sum at the end. It stands for the SIMD path the tight bound must accept (before that path
// exists, and as a check that the bound is not tighter than such a path can be).
std::vector<float> emulate_fast_path(const Data& D, std::size_t tile) {
    const Case& c = D.c;
    const std::size_t E = c.E, H = c.H, G = c.H / c.Hkv, d = c.d, qw = D.qw, kvw = D.kvw, Lq = c.Lq, Lk = c.Lk;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const mha_bf16::Spec sp = D.spec();
    auto rounded = [](const float* p, std::size_t n) {
        std::vector<float> r(p, p + n);
        for (float& x : r) x = mha::round_to_bf16(x);
        return r;
    };
    auto linear = [](const std::vector<float>& x, std::size_t L, std::size_t K, const std::vector<float>& w, const std::vector<float>& b,
                     std::size_t N) {
        std::vector<float> y(L * N);
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t n = 0; n < N; ++n) {
                float acc = 0.0f;
                for (std::size_t k = 0; k < K; ++k) acc += x[i * K + k] * w[n * K + k];
                y[i * N + n] = acc + b[n];
            }
        return y;
    };
    auto rope = [&](std::vector<float>& y, std::size_t L, std::size_t heads, std::size_t start) {
        if (!sp.rope) return;
        const std::size_t r = sp.rope->dims, half = r / 2;
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t h = 0; h < heads; ++h)
                for (std::size_t k = 0; k < half; ++k) {
                    const double angle = double(start + i) * std::pow(double(sp.rope->theta), -2.0 * double(k) / double(r));
                    const float co = float(std::cos(angle)), si = float(std::sin(angle));
                    const bool hs = sp.rope->style == mha::RopeStyle::half;
                    float& x1 = y[(i * heads + h) * d + (hs ? k : 2 * k)];
                    float& x2 = y[(i * heads + h) * d + (hs ? k + half : 2 * k + 1)];
                    const float a = x1, b = x2;
                    x1 = a * co - b * si, x2 = b * co + a * si;
                }
    };
    const std::vector<float> wq = rounded(D.w.wq.data(), D.w.wq.size()), wk = rounded(D.w.wk.data(), D.w.wk.size());
    const std::vector<float> wv = rounded(D.w.wv.data(), D.w.wv.size()), wo = rounded(D.w.wo.data(), D.w.wo.size());
    std::vector<float> out(c.B * Lq * E);
    for (std::size_t b = 0; b < c.B; ++b) {
        std::vector<float> q = linear(rounded(D.query.data() + b * Lq * E, Lq * E), Lq, E, wq, D.w.bq, qw);
        std::vector<float> k = linear(rounded(D.key_data() + b * Lk * D.kdim, Lk * D.kdim), Lk, D.kdim, wk, D.w.bk, kvw);
        std::vector<float> v = linear(rounded(D.value_data() + b * Lk * D.vdim, Lk * D.vdim), Lk, D.vdim, wv, D.w.bv, kvw);
        rope(q, Lq, H, sp.query_start), rope(k, Lk, c.Hkv, sp.key_start);
        for (auto* t : {&q, &k, &v})
            for (float& x : *t) x = mha::round_to_bf16(x);
        std::vector<float> ctx(Lq * qw, 0.0f);
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < Lq; ++i) {
                float m = -INFINITY, l = 0.0f;
                std::vector<float> acc(d, 0.0f);
                for (std::size_t j0 = 0; j0 < Lk; j0 += tile) {
                    const std::size_t j1 = std::min(Lk, j0 + tile);
                    std::vector<float> z(j1 - j0, -INFINITY);
                    float tmax = -INFINITY;
                    for (std::size_t j = j0; j < j1; ++j) {
                        const double m1 = D.kpm.present() ? D.kpm.at(b * Lk + j) : 0.0;
                        const double m2 = !D.am.present() ? 0.0 : D.am.rank == 2 ? D.am.at(i * Lk + j) : D.am.at(((b * H + h) * Lq + i) * Lk + j);
                        const long long last = c.alignment == mha::CausalAlignment::top_left ? (long long)i : (long long)i + (long long)Lk - (long long)Lq;
                        if ((c.causal && (long long)j > last) || m1 == -INFINITY || m2 == -INFINITY) continue;
                        float dot = 0.0f;
                        for (std::size_t t = 0; t < d; ++t) dot += q[i * qw + h * d + t] * k[j * kvw + (h / G) * d + t];
                        z[j - j0] = scale * dot + float(m1) + float(m2);
                        tmax = std::max(tmax, z[j - j0]);
                    }
                    if (tmax == -INFINITY) continue;
                    const float mnew = std::max(m, tmax), r = m == -INFINITY ? 0.0f : std::exp(m - mnew);
                    l *= r;
                    for (float& a : acc) a *= r;
                    m = mnew;
                    for (std::size_t j = j0; j < j1; ++j) {
                        if (z[j - j0] == -INFINITY) continue;
                        const float e = std::exp(z[j - j0] - m), eb = mha::round_to_bf16(e);
                        l += e;
                        for (std::size_t t = 0; t < d; ++t) acc[t] += eb * v[j * kvw + (h / G) * d + t];
                    }
                }
                for (std::size_t t = 0; t < d; ++t) ctx[i * qw + h * d + t] = l > 0.0f ? mha::round_to_bf16(acc[t] / l) : 0.0f;
            }
        const std::vector<float> o = linear(ctx, Lq, qw, wo, D.w.bo, E);
        for (std::size_t i = 0; i < Lq; ++i) {
            float* y = out.data() + (b * Lq + i) * E;
            std::copy_n(o.begin() + std::ptrdiff_t(i * E), E, y);
            if (!c.norm_eps) continue;
            const float* x = D.query.data() + (b * Lq + i) * E;
            float mean = 0.0f, var = 0.0f;
            for (std::size_t r = 0; r < E; ++r) y[r] += x[r], mean += y[r];
            mean /= float(E);
            for (std::size_t r = 0; r < E; ++r) var += (y[r] - mean) * (y[r] - mean);
            const float rs = 1.0f / std::sqrt(var / float(E) + *c.norm_eps);
            for (std::size_t r = 0; r < E; ++r) y[r] = D.w.norm_w[r] * ((y[r] - mean) * rs) + D.w.norm_b[r];
        }
    }
    return out;
}

// The tight bound accepts the fast path's model (tiles of 16 and 256 keys) against the bf16 reference, and the
// oracle bound accepts it against the oracle.
TEST(Bf16Reference, TightBoundAcceptsTheFastPathModel) {
    for (const Case& cs : kCases) {
        SCOPED_TRACE(cs.name);
        const Data D(cs);
        const mha_bf16::Expected ex = D.expected();
        const auto ref = D.run(D.make(mha::DataType::bf16), mha::Backend::scalar);
        const std::vector<double> refd(ref.output.begin(), ref.output.end());
        for (std::size_t tile : {16, 256}) {
            SCOPED_TRACE(::testing::Message() << "tile " << tile);
            const std::vector<float> fast = emulate_fast_path(D, tile);
            EXPECT_TRUE(mha_test::all_within(fast, refd, scaled(ex.out.d, kTightFactor))) << "model of the fast path against the reference";
            double worst = 0.0;  // the largest |fast − ref| / bound (recorded)
            for (std::size_t n = 0; n < fast.size(); ++n)
                worst = std::max(worst, std::abs(double(fast[n]) - refd[n]) / (kTightFactor * ex.out.d[n]));
            RecordProperty(std::string(cs.name) + " tile " + std::to_string(tile), "max |fast - ref| / tight bound " + std::to_string(worst));
            EXPECT_TRUE(mha_test::all_within(fast, ex.out.o, scaled(ex.out.e, kOracleFactor))) << "model of the fast path against the oracle";
        }
    }
}

// The SIMD backend with compute bf16 against the bf16 reference (tight) and the oracle, every ISA and impl.
TEST(Bf16Simd, MatchesReferenceOnEveryIsa) {
    for (const Case& cs : kCases) {
        SCOPED_TRACE(cs.name);
        const Data D(cs);
        const mha_bf16::Expected ex = D.expected();
        const mha::MultiheadAttention m = D.make(mha::DataType::bf16);
        const auto ref = D.run(m, mha::Backend::scalar);
        const std::vector<double> refd(ref.output.begin(), ref.output.end());
        const std::vector<double> tight = scaled(ex.out.d, kTightFactor), oracle_tol = scaled(ex.out.e, kOracleFactor);
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls) {
                SCOPED_TRACE(impl_name(impl));
                const auto simd = D.run(m, mha::Backend::simd, impl);
                EXPECT_TRUE(mha_test::all_within(simd.output, refd, tight)) << "SIMD bf16 against the bf16 reference";
                double worst = 0.0;  // the largest |simd − ref| / tight bound (recorded)
                for (std::size_t n = 0; n < refd.size(); ++n) worst = std::max(worst, std::abs(double(simd.output[n]) - refd[n]) / tight[n]);
                RecordProperty(std::string(cs.name) + " " + std::string(mha::isa_name(mha::active_isa())) + " " + impl_name(impl),
                               "max |simd - ref| / tight bound " + std::to_string(worst));
                EXPECT_TRUE(mha_test::all_within(simd.output, ex.out.o, oracle_tol)) << "SIMD bf16 against the float64 oracle";
            }
        }, /*with_bf16=*/true);
    }
}

// need_weights with bf16 compute: the probabilities P rounded to bfloat16 (as P·V reads them; averaged and per
// head), and the outputs, against the reference and the oracle.
TEST(Bf16Simd, NeedWeights) {
    const Case cs{.name = "weights", .E = 64, .H = 8, .Hkv = 2, .d = 8, .B = 2, .Lq = 21, .Lk = 37, .rope = rope(mha::RopeStyle::half),
                  .position_offset = 5, .causal = true, .alignment = mha::CausalAlignment::bottom_right, .key_padding = 1,
                  .attn_mask = 4, .gain = 2.0f};
    const Data D(cs);
    const mha_bf16::Expected ex = D.expected();
    const mha::MultiheadAttention m = D.make(mha::DataType::bf16);
    for (auto need : {mha::NeedWeights::averaged, mha::NeedWeights::per_head}) {
        SCOPED_TRACE(need == mha::NeedWeights::averaged ? "averaged" : "per_head");
        const bool avg = need == mha::NeedWeights::averaged;
        const std::vector<double>& po = avg ? ex.averaged_o : ex.probs.o;
        const std::vector<double>& pe = avg ? ex.averaged_e : ex.probs.e;
        const std::vector<double>& pd = avg ? ex.averaged_d : ex.probs.d;
        const auto ref = D.run(m, mha::Backend::scalar, mha::Impl::automatic, need);
        EXPECT_TRUE(mha_test::all_within(ref.weights, po, scaled(pe, kOracleFactor))) << "reference weights against the oracle";
        EXPECT_TRUE(mha_test::all_within(ref.output, ex.out.o, scaled(ex.out.e, kOracleFactor)));
        const std::vector<double> refw(ref.weights.begin(), ref.weights.end()), refo(ref.output.begin(), ref.output.end());
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls) {
                SCOPED_TRACE(impl_name(impl));
                const auto simd = D.run(m, mha::Backend::simd, impl, need);
                EXPECT_TRUE(mha_test::all_within(simd.weights, refw, scaled(pd, kTightFactor))) << "weights against the reference";
                EXPECT_TRUE(mha_test::all_within(simd.output, refo, scaled(ex.out.d, kTightFactor))) << "output against the reference";
                EXPECT_TRUE(mha_test::all_within(simd.output, ex.out.o, scaled(ex.out.e, kOracleFactor))) << "output against the oracle";
            }
        }, /*with_bf16=*/true);
    }
}

// KV cache with bf16 compute: a first token, a prompt, two single-token steps and a 3-token chunk. Each call's output is the
// last rows of causal (bottom-right) attention of the new tokens over all tokens so far, so the model
// evaluates it as cross-attention (queries at positions n + i, keys at j). SIMD and reference each keep
// their own cache; both against the oracle, SIMD against the reference.
// d = 10: not a multiple of the vector width; d = 64: the decode steps on vdpbf16ps where the CPU has AVX512_BF16
// (simd::bf16_decode_on_dot_products).
TEST(Bf16Simd, KvCacheDecodeSteps) {
    for (const std::size_t d : {std::size_t(10), std::size_t(64)}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const std::size_t H = 8, Hkv = 2, E = H * d, B = 3;
    // A first token alone (one visible key: where the tight bound tells bf16 from fp32), a prompt, two steps, a chunk.
    const std::size_t steps[] = {1, 18, 1, 1, 3};
    std::size_t total = 0;
    for (std::size_t s : steps) total += s;
    Case cs{.name = "cache", .E = E, .H = H, .Hkv = Hkv, .d = d, .B = B, .Lq = total, .self = true,
            .rope = rope(mha::RopeStyle::interleaved), .gain = 2.0f};
    const Data all(cs);  // weights, and the tokens [B, total, E]
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        const mha::MultiheadAttention m = all.make(mha::DataType::bf16);
        mha::KVCache simd_cache(B, Hkv, d, total), ref_cache(B, Hkv, d, total);
        // bf16 compute stores K and V already rounded to bf16: a bf16 cache holds them exactly, so a forward on it
        // must give the f32 cache's output bit for bit (the decode kernels widen exactly; prefill widens first).
        mha::KVCache half_cache(B, Hkv, d, total, mha::DataType::bf16);
        std::size_t n = 0;
        for (std::size_t lq : steps) {
            SCOPED_TRACE(::testing::Message() << lq << " tokens after " << n);
            // The new tokens [B, lq, E] and all tokens so far [B, n + lq, E], contiguous.
            std::vector<float> q(B * lq * E), kv(B * (n + lq) * E);
            for (std::size_t b = 0; b < B; ++b) {
                std::copy_n(all.query.begin() + std::ptrdiff_t((b * total + n) * E), lq * E, q.begin() + std::ptrdiff_t(b * lq * E));
                std::copy_n(all.query.begin() + std::ptrdiff_t(b * total * E), (n + lq) * E, kv.begin() + std::ptrdiff_t(b * (n + lq) * E));
            }
            mha_bf16::Spec s = all.spec();
            s.Lq = lq, s.Lk = n + lq, s.key_start = 0, s.query_start = n;
            s.causal = true, s.alignment = mha::CausalAlignment::bottom_right;
            const mha_bf16::Expected ex = mha_bf16::evaluate(s, all.w, q.data(), kv.data(), kv.data());
            std::vector<float> out_simd(B * lq * E, NAN), out_ref(B * lq * E, NAN);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(q.data(), B, lq, E);
            mha::ForwardOptions o;
            m.forward(in, {mha::Batch(out_simd.data(), B, lq, E)}, o, simd_cache);
            std::vector<float> out_half(B * lq * E, NAN);
            m.forward(in, {mha::Batch(out_half.data(), B, lq, E)}, o, half_cache);
            EXPECT_EQ(std::memcmp(out_half.data(), out_simd.data(), out_simd.size() * sizeof(float)), 0) << "bf16 cache vs f32 cache";
            o.backend = mha::Backend::scalar;
            m.forward(in, {mha::Batch(out_ref.data(), B, lq, E)}, o, ref_cache);
            EXPECT_TRUE(mha_test::all_within(out_ref, ex.out.o, scaled(ex.out.e, kOracleFactor))) << "reference against the oracle";
            EXPECT_TRUE(mha_test::all_within(out_ref, ex.out.t, scaled(ex.out.d, kLambda))) << "reference against the center";
            EXPECT_TRUE(mha_test::all_within(out_simd, std::vector<double>(out_ref.begin(), out_ref.end()),
                                             scaled(ex.out.d, kTightFactor)))
                << "SIMD against the reference";
            EXPECT_TRUE(mha_test::all_within(out_simd, ex.out.o, scaled(ex.out.e, kOracleFactor))) << "SIMD against the oracle";
            n += lq;
        }
    }, /*with_bf16=*/true);
    }
}

// The grouped path's per-call regions for K_hᵀ and V_h hold every (batch, KV head)'s bf16 panels where the
// bf16 kernels run (core_grouped.cpp packs them there, a head every Bf16Panels::elements apart), not only
// the fp32 panels of this CPU's ISAs: bf16 panels are 32 columns wide, so V_h [Lk, d] with d < 16 takes more
// than NEON's fp32 panels of 8 columns (16·Lk floats against 8·Lk at d 8), and a region sized for those
// let the last heads' values run into the per-thread slots, which the tasks then overwrite (wrong outputs
// that depended on the scratch layout: a sequence alone differed from the same one in a varlen batch).
TEST(Bf16Simd, GroupedScratchHoldsTheBf16Panels) {
    using mha::detail::CoreLayout;
    using mha::simd::Bf16Panels;
    if (!mha::has_bf16_kernels(mha::detected_isa())) GTEST_SKIP() << "no bf16 kernels on this CPU";
    for (std::size_t d : {1, 2, 4, 7, 8, 10, 16, 40})
        for (std::size_t Lk : {1, 8, 17, 37, 130, 1030})
            for (std::size_t B : {1, 2}) {
                SCOPED_TRACE(::testing::Message() << "d " << d << ", Lk " << Lk << ", B " << B);
                const mha::detail::CoreShape shape{B, 8, 2, d, std::min<std::size_t>(Lk, 40), Lk, mha::DataType::bf16};
                mha::detail::Carver call, slot;
                const CoreLayout l = mha::detail::core_layout(shape, mha::detail::CorePath::grouped, mha::NeedWeights::none, call, slot);
                const std::size_t heads = B * 2;
                const std::size_t key16 = Bf16Panels::elements(Lk, Bf16Panels::min_panel_stride(d));  // uint16 per head
                const std::size_t value16 = Bf16Panels::elements(d, Bf16Panels::min_panel_stride(Lk));
                EXPECT_GE(l.value_panels - l.key_panels, (heads * key16 + 1) / 2) << "K_hᵀ panels";
                EXPECT_GE(call.total - l.value_panels, (heads * value16 + 1) / 2) << "V_h panels";
            }
}

}  // namespace
