// Score modifiers (mha/attention.hpp's ScoreModifiers): sliding windows, logit softcap, attention sinks and
// ALiBi, on every path (scalar reference; SIMD materialized, grouped, decode; the KV cache; the paged step),
// fp32 and bf16 compute, every ISA of this CPU.
//   - the semantics from each model's own formula, in double: Mistral's sliding-window mask (Hugging Face
//     `sliding_window` w: key j visible from query i when i − w < j <= i), Gemma 2's softcap (scores / c, tanh,
//     · c), gpt-oss's sinks (a logit column concatenated to the scores, softmax, column dropped), BLOOM's
//     ALiBi (a per-key bias slope·j, and BLOOM's slope recipe), against the library's probabilities;
//   - every backend and path against core_double (attention_test_util.hpp, extended with the modifiers and
//     their rounding bounds) within kDecoderSafety times its first-order bound; bf16 layers against
//     mha_bf16::evaluate;
//   - window edges (left = 0, shorter than a key tile, longer than the sequence, bottom-right, a cache
//     across block boundaries), sinks with fully masked rows (zeros), softcap on ±1e4 scores and NaN, all
//     four combined; keys outside the window are not read (kv_rows_read) and may be NaN;
//   - thread and batch invariance (bitwise), paged = contiguous (bitwise), validation (nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <mha/mha.hpp>
#include <nlohmann/json.hpp>

#include "attention/attention_core.hpp"
#include "bf16_test_util.hpp"
#include "compare_util.hpp"
#include "decode_test_util.hpp"
#include "isa_test_util.hpp"
#include "npy.hpp"
#include "simd/simd.hpp"

namespace {

using mha::ConstHeads;
using mha::Heads;
using mha_test::HeadsD;
using mha_test::kDecoderSafety;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The modifiers of a case with the arrays they point to.
struct Mods {
    long long left = -1, right = -1;
    float softcap = 0.0f;
    std::vector<float> sinks, slopes;
    mha::ScoreModifiers view() const {
        mha::ScoreModifiers m;
        m.window_left = left, m.window_right = right, m.softcap = softcap;
        m.sinks = sinks.empty() ? nullptr : sinks.data();
        m.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
        return m;
    }
};

struct SdpaCase {
    const char* name;
    std::size_t B, H, Hkv, Lq, Lk, d;
    bool causal;
    mha::CausalAlignment align;
    Mods mods;
    float q_gain = 2.0f;   // q in ±q_gain: peaked rows; large gains give ±1e4 scores
    bool pad_batch1 = false;  // batch 1's keys all masked by key_padding_mask
};

std::vector<float> sinks_for(std::size_t H, std::uint32_t seed) { return mha_test::random_floats(H, -2.0f, 3.0f, seed); }

using TL = mha::CausalAlignment;
std::vector<SdpaCase> sdpa_cases() {
    std::vector<SdpaCase> c;
    c.push_back({"mistral window 64, causal, L 300", 1, 4, 2, 300, 300, 32, true, TL::top_left, {63, -1, 0, {}, {}}});
    c.push_back({"window left 0: only itself", 1, 2, 1, 70, 70, 16, true, TL::top_left, {0, -1, 0, {}, {}}});
    c.push_back({"flash window (5, 7) shorter than a tile, not causal, Lk 600", 1, 2, 2, 40, 600, 16, false, TL::top_left,
                 {5, 7, 0, {}, {}}});
    c.push_back({"window (-1, 3) right only, not causal", 1, 2, 1, 33, 90, 8, false, TL::top_left, {-1, 3, 0, {}, {}}});
    c.push_back({"window longer than the sequence", 1, 4, 4, 100, 100, 16, true, TL::top_left, {1000, -1, 0, {}, {}}});
    c.push_back({"bottom-right window 100, Lq 40 Lk 700", 2, 4, 2, 40, 700, 24, true, TL::bottom_right, {100, -1, 0, {}, {}}});
    c.push_back({"decode: window 128 over 1000 keys, G 4", 2, 8, 2, 3, 1000, 32, true, TL::bottom_right, {127, -1, 0, {}, {}}});
    c.push_back({"gemma2 softcap 50", 1, 4, 2, 80, 300, 32, true, TL::top_left, {-1, -1, 50.0f, {}, {}}});
    c.push_back({"softcap 30 on scores near ±1e4", 1, 2, 1, 20, 64, 16, false, TL::top_left, {-1, -1, 30.0f, {}, {}}, 5000.0f});
    c.push_back({"gpt-oss sinks, batch 1 fully masked", 2, 4, 1, 30, 280, 16, true, TL::bottom_right,
                 {-1, -1, 0, sinks_for(4, 7), {}}, 2.0f, true});
    c.push_back({"sinks in decode", 1, 8, 2, 1, 513, 32, true, TL::bottom_right, {-1, -1, 0, sinks_for(8, 8), {}}});
    c.push_back({"bloom alibi, 12 heads", 1, 12, 12, 64, 64, 16, true, TL::top_left, {-1, -1, 0, {}, mha::alibi_standard_slopes(12)}});
    c.push_back({"alibi, not causal, bottom-right positions", 1, 4, 2, 50, 600, 16, false, TL::bottom_right,
                 {-1, -1, 0, {}, mha::alibi_standard_slopes(4)}});
    c.push_back({"all four, GQA, bottom-right", 2, 8, 2, 37, 650, 32, true, TL::bottom_right,
                 {200, -1, 20.0f, sinks_for(8, 9), mha::alibi_standard_slopes(8)}});
    c.push_back({"all four, decode", 1, 8, 2, 2, 900, 64, true, TL::bottom_right,
                 {300, -1, 20.0f, sinks_for(8, 10), mha::alibi_standard_slopes(8)}});
    return c;
}

struct SdpaData {
    SdpaCase c;
    std::vector<float> q, k, v;
    std::vector<std::uint8_t> kpm;  // [B, Lk] or empty
    explicit SdpaData(const SdpaCase& cs) : c(cs) {
        q = mha_test::random_floats(c.B * c.H * c.Lq * c.d, -c.q_gain, c.q_gain, 1);
        k = mha_test::random_floats(c.B * c.Hkv * c.Lk * c.d, -1.0f, 1.0f, 2);
        v = mha_test::random_floats(c.B * c.Hkv * c.Lk * c.d, -1.0f, 1.0f, 3);
        if (c.pad_batch1) {
            kpm.assign(c.B * c.Lk, 0);
            std::fill(kpm.begin() + c.Lk, kpm.begin() + 2 * c.Lk, 1);
        }
    }
    mha::MaskView kpm_view() const {
        if (kpm.empty()) return {};
        mha::MaskView m;
        m.type = mha::MaskType::boolean, m.bools = kpm.data(), m.rank = 2, m.shape[0] = c.B, m.shape[1] = c.Lk;
        return m;
    }
    mha::SdpaInputs inputs() const {
        mha::SdpaInputs in;
        in.query = ConstHeads::bhld(q.data(), c.B, c.H, c.Lq, c.d);
        in.key = ConstHeads::bhld(k.data(), c.B, c.Hkv, c.Lk, c.d);
        in.value = ConstHeads::bhld(v.data(), c.B, c.Hkv, c.Lk, c.d);
        in.key_padding_mask = kpm_view();
        return in;
    }
    mha::SdpaOptions options(mha::Backend backend, mha::Algorithm impl, int threads = 0) const {
        mha::SdpaOptions o;
        o.causal = c.causal, o.causal_alignment = c.align, o.backend = backend, o.impl = impl, o.threads = threads;
        o.modifiers = c.mods.view();
        return o;
    }
    std::vector<float> run(mha::Backend backend, mha::Algorithm impl, int threads = 0) const {
        std::vector<float> out(c.B * c.H * c.Lq * c.d, kNaN);
        mha::scaled_dot_product_attention(inputs(), Heads::bhld(out.data(), c.B, c.H, c.Lq, c.d), options(backend, impl, threads));
        return out;
    }
    mha_test::CoreExpected expected() const {
        const mha::SdpaInputs in = inputs();
        mha_test::CoreSpec s;
        s.scale = double(1.0f / std::sqrt(static_cast<float>(c.d)));
        s.causal = c.causal, s.alignment = c.align, s.key_padding_mask = in.key_padding_mask, s.mods = c.mods.view();
        return mha_test::core_double(HeadsD::from(in.query), HeadsD::from(in.key), HeadsD::from(in.value), s);
    }
};

std::vector<double> times(const std::vector<double>& x, double f) {
    std::vector<double> y(x);
    for (double& t : y) t *= f;
    return y;
}

// ---------------------------------------------------------------------------------------------------
// The model formulas, in double, for one (b, h, i) row: probabilities over the Lk keys.

std::vector<double> raw_scores(const SdpaData& D, std::size_t b, std::size_t h, std::size_t i) {
    const auto& c = D.c;
    const std::size_t kh = h / (c.H / c.Hkv);
    const double scale = double(1.0f / std::sqrt(static_cast<float>(c.d)));
    std::vector<double> s(c.Lk);
    for (std::size_t j = 0; j < c.Lk; ++j) {
        double dot = 0.0;
        for (std::size_t t = 0; t < c.d; ++t)
            dot += double(D.q[((b * c.H + h) * c.Lq + i) * c.d + t]) * double(D.k[((b * c.Hkv + kh) * c.Lk + j) * c.d + t]);
        s[j] = scale * dot;
    }
    return s;
}

std::vector<double> softmax(std::vector<double> s) {
    double m = -INFINITY, sum = 0.0;
    for (double x : s) m = std::max(m, x);
    for (double& x : s) x = std::exp(x - m), sum += x;
    for (double& x : s) x /= sum;
    return s;
}

// The library's probabilities of row (b, h, i): the scalar backend's attention weights ([B, H, Lq, Lk]) read
// back through the materialized SIMD path with need_weights (per head), as a layer would return them, are
// not exposed by SDPA; core_double (checked against the library below) stands for them here, and these
// model formulas check core_double's semantics.
TEST(ScoreModifiersSemantics, MistralSlidingWindowMask) {
    // Hugging Face Mistral: sliding_window w; causal mask plus j <= i − w masked. AttentionConfig: left = w − 1.
    for (std::size_t w : {1u, 5u, 64u}) {
        SdpaCase cs{"mistral", 1, 2, 1, 90, 90, 16, true, TL::top_left, {(long long)w - 1, -1, 0, {}, {}}};
        const SdpaData D(cs);
        const mha_test::CoreExpected ex = D.expected();
        for (std::size_t h = 0; h < 2; ++h)
            for (std::size_t i = 0; i < 90; i += 7) {
                std::vector<double> s = raw_scores(D, 0, h, i);
                for (std::size_t j = 0; j < 90; ++j)
                    if (j > i || (long long)j <= (long long)i - (long long)w) s[j] = -INFINITY;
                const std::vector<double> p = softmax(s);
                for (std::size_t j = 0; j < 90; ++j) ASSERT_NEAR(ex.probs[(h * 90 + i) * 90 + j], p[j], 1e-12) << w << " " << i << " " << j;
            }
    }
}

TEST(ScoreModifiersSemantics, Gemma2SoftcapWithGptOssSinks) {
    // Gemma 2: scores = scores / c; tanh; · c (then the causal mask). gpt-oss: cat([scores, sink]), softmax,
    // drop the sink column.
    SdpaCase cs{"softcap + sinks", 1, 4, 2, 40, 40, 16, true, TL::top_left, {-1, -1, 7.5f, sinks_for(4, 3), {}}};
    const SdpaData D(cs);
    const mha_test::CoreExpected ex = D.expected();
    for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t i = 0; i < 40; ++i) {
            std::vector<double> s = raw_scores(D, 0, h, i);
            for (double& x : s) x = std::tanh(x / 7.5) * 7.5;
            for (std::size_t j = 0; j < 40; ++j)
                if (j > i) s[j] = -INFINITY;
            s.push_back(double(cs.mods.sinks[h]));
            const std::vector<double> p = softmax(s);
            for (std::size_t j = 0; j < 40; ++j) ASSERT_NEAR(ex.probs[(h * 40 + i) * 40 + j], p[j], 1e-12) << h << " " << i << " " << j;
        }
}

TEST(ScoreModifiersSemantics, BloomAlibiWithSoftcap) {
    // BLOOM: a bias slope_h·j per key, added to the scores (softmax-equivalent to −slope_h·(i − j) without a
    // sink; with a sink the relative form of mha/attention.hpp is the one that matters).
    SdpaCase cs{"alibi + softcap", 1, 12, 12, 40, 40, 16, true, TL::top_left, {-1, -1, 9.0f, {}, mha::alibi_standard_slopes(12)}};
    const SdpaData D(cs);
    const mha_test::CoreExpected ex = D.expected();
    for (std::size_t h = 0; h < 12; ++h)
        for (std::size_t i = 0; i < 40; ++i) {
            std::vector<double> s = raw_scores(D, 0, h, i);
            for (double& x : s) x = std::tanh(x / 9.0) * 9.0;
            for (std::size_t j = 0; j < 40; ++j) s[j] += double(cs.mods.slopes[h]) * double(j);
            for (std::size_t j = 0; j < 40; ++j)
                if (j > i) s[j] = -INFINITY;
            const std::vector<double> p = softmax(s);
            for (std::size_t j = 0; j < 40; ++j) ASSERT_NEAR(ex.probs[(h * 40 + i) * 40 + j], p[j], 1e-12) << h << " " << i << " " << j;
        }
}

TEST(ScoreModifiersSemantics, AlibiStandardSlopesAreBlooms) {
    // BLOOM's build_alibi_tensor: closest power of two n <= H, base = 2^(−2^−(log2 n − 3)), slopes base^k for
    // k = 1..n; then extra_base = 2^(−2^−(log2 2n − 3)) to the odd powers 1, 3, .. for the H − n others.
    for (std::size_t H : {1u, 2u, 3u, 8u, 12u, 16u, 20u, 32u, 40u, 64u, 71u}) {
        const std::vector<float> got = mha::alibi_standard_slopes(H);
        ASSERT_EQ(got.size(), H);
        const double n = std::pow(2.0, std::floor(std::log2(double(H))));
        const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(n) - 3)));
        std::vector<double> want;
        for (int k = 1; k <= int(n); ++k) want.push_back(std::pow(base, k));
        const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(2 * n) - 3)));
        for (int k = 1; want.size() < H; k += 2) want.push_back(std::pow(extra, k));
        for (std::size_t h = 0; h < H; ++h) EXPECT_EQ(got[h], static_cast<float>(want[h])) << H << " " << h;
    }
    EXPECT_TRUE(mha::alibi_standard_slopes(0).empty());
}

// xsimd's tanh in the SIMD softcap, against tanh in double: within kTanhUlp ulp of the float result, on
// every ISA, over [−40, 40] densely, tiny values, and the specials (±inf → ±c, NaN stays NaN).
TEST(ScoreModifiersKernel, SoftcapTanhWithinBound) {
    std::vector<float> xs;
    for (double x = -40.0; x <= 40.0; x += 0.00137) xs.push_back(float(x));
    for (float t : {1e-30f, 1e-10f, 1e-5f, 0.3f, 0.6249f, 0.625f, 0.6251f, 8.9f, 9.0f, 9.1f}) xs.push_back(t), xs.push_back(-t);
    const float caps[] = {1.0f, 30.0f, 50.0f};
    mha_test::for_each_cpu_isa([&] {
        double worst = 0.0;
        for (float c : caps) {
            std::vector<float> x(xs.size());
            for (std::size_t n = 0; n < xs.size(); ++n) x[n] = xs[n] * c;
            std::vector<float> y = x;
            mha::simd::modify_scores(y.data(), y.size(), {c, 0.0f, 0.0f});
            for (std::size_t n = 0; n < x.size(); ++n) {
                const double want = double(c) * std::tanh(double(x[n] * (1.0f / c)));  // the kernel's argument
                const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::abs(want), 1e-38)) - 23);
                worst = std::max(worst, std::abs(double(y[n]) - want) / ulp);
            }
        }
        EXPECT_LE(worst, mha_test::kTanhUlp);
        RecordProperty("max_ulp_" + std::string(mha::isa_name(mha::active_isa())), std::to_string(worst));
        float sp[5] = {INFINITY, -INFINITY, kNaN, 0.0f, -0.0f};
        mha::simd::modify_scores(sp, 5, {30.0f, 0.0f, 0.0f});
        EXPECT_EQ(sp[0], 30.0f);
        EXPECT_EQ(sp[1], -30.0f);
        EXPECT_TRUE(std::isnan(sp[2]));
        EXPECT_EQ(sp[3], 0.0f);
        // ALiBi alone: x + slope·(t0 + j), exact here (a power-of-two slope, small integers).
        float a[19];
        for (int j = 0; j < 19; ++j) a[j] = 1.0f;
        mha::simd::modify_scores(a, 19, {0.0f, 0.25f, -20.0f});
        for (int j = 0; j < 19; ++j) EXPECT_EQ(a[j], 1.0f + 0.25f * float(j - 20)) << j;
    });
}

// ---------------------------------------------------------------------------------------------------
// tests/data/modifiers/<case>/ (tools/make_fixtures.py): each model family's formula in float64 torch. core_double
// (the library's documented order) must give the same values (it is the semantics), and every backend, path
// and ISA must be within kDecoderSafety times its bound of them, plus u·|expected| (read as float).

struct ModifierFixture {
    std::string name;
    std::vector<float> q, k, v, sinks, slopes;
    std::vector<std::size_t> qs, ks;
    std::vector<float> expected;
    bool causal = false, bottom_right = false;
    Mods mods;
};

std::vector<ModifierFixture> modifier_fixtures() {
    namespace fs = std::filesystem;
    std::vector<ModifierFixture> out;
    const fs::path root = fs::path(MHA_TEST_DATA_DIR) / "modifiers";
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(root))
        if (fs::exists(e.path() / "args.json")) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    for (const fs::path& d : dirs) {
        ModifierFixture f;
        f.name = d.filename().string();
        std::ifstream in(d / "args.json");
        const nlohmann::json a = nlohmann::json::parse(in);
        const mha::npy::Array q = mha::npy::load((d / "q.npy").string()), k = mha::npy::load((d / "k.npy").string());
        f.q = q.values, f.qs = q.shape, f.k = k.values, f.ks = k.shape, f.v = mha::npy::load((d / "v.npy").string()).values;
        f.expected = mha::npy::load((d / "expected_output.npy").string()).values;
        f.causal = a["causal"].get<bool>() || a["causal_bottom_right"].get<bool>();
        f.bottom_right = a["causal_bottom_right"].get<bool>();
        f.mods.left = a["window_left"].get<long long>(), f.mods.right = a["window_right"].get<long long>();
        f.mods.softcap = a["softcap"].is_null() ? 0.0f : a["softcap"].get<float>();
        if (fs::exists(d / "sinks.npy")) f.mods.sinks = mha::npy::load((d / "sinks.npy").string()).values;
        if (fs::exists(d / "alibi_slopes.npy")) f.mods.slopes = mha::npy::load((d / "alibi_slopes.npy").string()).values;
        if (a["alibi"].get<bool>()) f.mods.slopes = mha::alibi_standard_slopes(f.qs[1]);
        out.push_back(std::move(f));
    }
    return out;
}

TEST(ModifierFixtures, EveryPathAgainstTheModelFormulas) {
    const std::vector<ModifierFixture> fixtures = modifier_fixtures();
    ASSERT_EQ(fixtures.size(), 6u);
    for (const ModifierFixture& f : fixtures) {
        SCOPED_TRACE(f.name);
        const std::size_t B = f.qs[0], H = f.qs[1], Lq = f.qs[2], d = f.qs[3], Hkv = f.ks[1], Lk = f.ks[2];
        mha::SdpaInputs in;
        in.query = ConstHeads::bhld(f.q.data(), B, H, Lq, d);
        in.key = ConstHeads::bhld(f.k.data(), B, Hkv, Lk, d);
        in.value = ConstHeads::bhld(f.v.data(), B, Hkv, Lk, d);
        // The model's scale 1/√d exactly (the semantics), and the float the library uses (the bound; the two
        // evaluations' difference is added to it).
        mha_test::CoreSpec spec;
        spec.scale = 1.0 / std::sqrt(double(d));
        spec.causal = f.causal, spec.alignment = f.bottom_right ? TL::bottom_right : TL::top_left, spec.mods = f.mods.view();
        const HeadsD hq = HeadsD::from(in.query), hk = HeadsD::from(in.key), hv = HeadsD::from(in.value);
        const mha_test::CoreExpected exact = mha_test::core_double(hq, hk, hv, spec);
        spec.scale = double(1.0f / std::sqrt(static_cast<float>(d)));
        const mha_test::CoreExpected ex = mha_test::core_double(hq, hk, hv, spec);
        std::vector<double> tol(f.expected.size()), semantic(f.expected.size());
        for (std::size_t n = 0; n < tol.size(); ++n) {
            tol[n] = kDecoderSafety * ex.ctx.err[n] + std::abs(ex.ctx.val[n] - exact.ctx.val[n]) + mha_test::kU * std::abs(double(f.expected[n]));
            semantic[n] = mha_test::kU * std::abs(double(f.expected[n])) + 1e-12;
        }
        ASSERT_TRUE(mha_test::all_within(f.expected, exact.ctx.val, semantic)) << "core_double is not the model's formula";
        ASSERT_LT(mha_test::relative_tolerance(std::vector<double>(f.expected.begin(), f.expected.end()), tol), 1e-3);
        mha::SdpaOptions o;
        o.causal = f.causal, o.causal_alignment = spec.alignment, o.modifiers = f.mods.view();
        auto run = [&](mha::Backend b, mha::Algorithm impl) {
            std::vector<float> y(B * H * Lq * d, kNaN);
            o.backend = b, o.impl = impl;
            mha::scaled_dot_product_attention(in, Heads::bhld(y.data(), B, H, Lq, d), o);
            return y;
        };
        EXPECT_TRUE(mha_test::all_within(run(mha::Backend::scalar, mha::Algorithm::automatic), f.expected, tol)) << "scalar";
        mha_test::for_each_cpu_isa([&] {
            for (mha::Algorithm impl : {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused})
                EXPECT_TRUE(mha_test::all_within(run(mha::Backend::simd, impl), f.expected, tol));
        });
    }
}

// ---------------------------------------------------------------------------------------------------
// SDPA: every backend, algorithm and ISA against core_double.

class SdpaModifiers : public ::testing::TestWithParam<std::size_t> {};

TEST_P(SdpaModifiers, EveryPathWithinTheBound) {
    const SdpaCase cs = sdpa_cases()[GetParam()];
    SCOPED_TRACE(cs.name);
    const SdpaData D(cs);
    const mha_test::CoreExpected ex = D.expected();
    const std::vector<double> tol = times(ex.ctx.err, kDecoderSafety);
    ASSERT_LT(mha_test::relative_tolerance(ex.ctx.val, tol), 2e-3) << "a bound as large as the values checks nothing";
    EXPECT_TRUE(mha_test::all_within(D.run(mha::Backend::scalar, mha::Algorithm::automatic), ex.ctx.val, tol)) << "scalar";
    mha_test::for_each_cpu_isa([&] {
        for (mha::Algorithm impl : {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused}) {
            SCOPED_TRACE(impl == mha::Algorithm::automatic ? "automatic" : impl == mha::Algorithm::materialized ? "materialized" : "fused");
            const std::vector<float> got = D.run(mha::Backend::simd, impl);
            EXPECT_TRUE(mha_test::all_within(got, ex.ctx.val, tol));
            if (cs.pad_batch1) {  // every key of batch 1 masked: zeros, sinks or not
                const std::size_t half = got.size() / 2;
                for (std::size_t n = half; n < got.size(); ++n) ASSERT_EQ(got[n], 0.0f) << n;
            }
        }
    });
}

INSTANTIATE_TEST_SUITE_P(Cases, SdpaModifiers, ::testing::Range<std::size_t>(0, 15));

TEST(SdpaModifiersPaths, CasesTakeEveryPath) {
    // The cases above exercise the decode, grouped and materialized paths (automatic picks).
    bool seen[4] = {};
    for (const SdpaCase& cs : sdpa_cases()) {
        const SdpaData D(cs);
        seen[int(mha::sdpa_path(D.inputs(), D.options(mha::Backend::simd, mha::Algorithm::automatic)))] = true;
    }
    EXPECT_TRUE(seen[int(mha::AttentionPath::decode)]);
    EXPECT_TRUE(seen[int(mha::AttentionPath::grouped)]);
    EXPECT_TRUE(seen[int(mha::AttentionPath::materialized)]);
    EXPECT_EQ(sdpa_cases().size(), 15u);  // the Range above
}

// A window longer than the sequence changes nothing: bitwise the unmodified call, on every path.
TEST(SdpaModifiersEdges, WindowLongerThanSequenceIsNoWindow) {
    SdpaCase cs{"long window", 1, 4, 2, 300, 300, 16, true, TL::top_left, {300, -1, 0, {}, {}}};
    SdpaData D(cs);
    mha_test::for_each_cpu_isa([&] {
        for (mha::Algorithm impl : {mha::Algorithm::materialized, mha::Algorithm::fused}) {
            D.c.mods.left = 300;
            const std::vector<float> a = D.run(mha::Backend::simd, impl);
            D.c.mods.left = -1;
            EXPECT_TRUE(mha_decode_test::same_bits(a, D.run(mha::Backend::simd, impl)));
        }
    });
}

// Window sides up to LLONG_MAX (a caller's "no limit") keep every key: position ± side must not overflow.
// Not causal, bottom-right with Lq > Lk (negative positions), on every path and both backends.
TEST(SdpaModifiersEdges, WindowSidesOfAnyLengthAreNoWindow) {
    constexpr long long kMax = std::numeric_limits<long long>::max();
    for (std::size_t Lq : {3u, 90u}) {  // decode / grouped and materialized
        SdpaCase cs{"huge window", 1, 4, 2, Lq, 60, 16, false, TL::bottom_right, {}};
        SdpaData D(cs);
        mha_test::for_each_cpu_isa([&] {
            for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar})
                for (mha::Algorithm impl : {mha::Algorithm::materialized, mha::Algorithm::fused}) {
                    D.c.mods.left = D.c.mods.right = -1;
                    const std::vector<float> none = D.run(backend, impl);
                    for (long long side : {kMax, kMax - 5, kMax / 2}) {
                        D.c.mods.left = side, D.c.mods.right = -1;
                        EXPECT_TRUE(mha_decode_test::same_bits(none, D.run(backend, impl))) << "left " << side << " Lq " << Lq;
                        D.c.mods.left = -1, D.c.mods.right = side;
                        EXPECT_TRUE(mha_decode_test::same_bits(none, D.run(backend, impl))) << "right " << side << " Lq " << Lq;
                        D.c.mods.left = D.c.mods.right = side;
                        EXPECT_TRUE(mha_decode_test::same_bits(none, D.run(backend, impl))) << "both " << side << " Lq " << Lq;
                    }
                }
        });
    }
}

// Prefill (grouped path): each K and V row is read once per call (packed once; every key is in some query's
// window), and the key tiles outside a query block's windows are skipped by bounds, so NaN there does not
// reach the queries whose windows lie past them.
TEST(SdpaModifiersEdges, KeysOutsideTheWindowAreNotUsed) {
    SdpaCase cs{"window 64 over 1024", 1, 4, 1, 1024, 1024, 32, true, TL::top_left, {63, -1, 0, {}, {}}};
    SdpaData D(cs);
    const mha_test::CoreExpected ex = D.expected();
    const std::uint64_t before = mha::detail::kv_rows_read();
    (void)D.run(mha::Backend::simd, mha::Algorithm::fused);
    EXPECT_EQ(mha::detail::kv_rows_read() - before, 2u * 1024u);
    // K and V rows 0..499 are behind every window of queries >= 563: NaN there leaves those rows finite and
    // within the bound (not bitwise: a non-finite value row switches that head's P·V to its careful form).
    for (std::size_t j = 0; j < 500; ++j)
        for (std::size_t t = 0; t < 32; ++t) D.k[j * 32 + t] = kNaN, D.v[j * 32 + t] = kNaN;
    mha_test::for_each_cpu_isa([&] {
        for (mha::Algorithm impl : {mha::Algorithm::materialized, mha::Algorithm::fused}) {
            const std::vector<float> y = D.run(mha::Backend::simd, impl);
            std::vector<float> got;
            std::vector<double> want, tol;
            for (std::size_t h = 0; h < 4; ++h)
                for (std::size_t n = (h * 1024 + 563) * 32; n < (h + 1) * 1024 * 32; ++n)
                    got.push_back(y[n]), want.push_back(ex.ctx.val[n]), tol.push_back(kDecoderSafety * ex.ctx.err[n]);
            EXPECT_TRUE(mha_test::all_within(got, want, tol));
        }
    });
}

TEST(SdpaModifiersEdges, DecodeReadsOnlyTheWindow) {
    SdpaCase cs{"decode window", 2, 8, 2, 1, 5000, 32, true, TL::bottom_right, {999, -1, 0, {}, {}}};
    const SdpaData D(cs);
    ASSERT_EQ(mha::sdpa_path(D.inputs(), D.options(mha::Backend::simd, mha::Algorithm::automatic)), mha::AttentionPath::decode);
    const std::uint64_t before = mha::detail::kv_rows_read();
    (void)D.run(mha::Backend::simd, mha::Algorithm::automatic);
    EXPECT_EQ(mha::detail::kv_rows_read() - before, 2u * 2u * 2u * 1000u);  // K and V, B, Hkv, window keys
}

// Softcap keeps NaN: a NaN score of a visible key makes its row NaN (as without modifiers); ±1e4 scores are
// covered by the "softcap 30" case above.
TEST(SdpaModifiersEdges, SoftcapNaNScoreMakesTheRowNaN) {
    SdpaCase cs{"nan", 1, 2, 1, 20, 300, 16, false, TL::top_left, {-1, -1, 30.0f, {}, {}}};
    SdpaData D(cs);
    D.q[(0 * 20 + 5) * 16 + 3] = kNaN;  // head 0, query 5
    mha_test::for_each_cpu_isa([&] {
        for (mha::Algorithm impl : {mha::Algorithm::materialized, mha::Algorithm::fused}) {
            const std::vector<float> y = D.run(mha::Backend::simd, impl);
            for (std::size_t i = 0; i < 20; ++i)
                for (std::size_t t = 0; t < 16; ++t) ASSERT_EQ(std::isnan(y[i * 16 + t]), i == 5) << i;
            for (std::size_t n = 20 * 16; n < y.size(); ++n) ASSERT_FALSE(std::isnan(y[n]));
        }
        const std::vector<float> r = D.run(mha::Backend::scalar, mha::Algorithm::automatic);
        EXPECT_TRUE(std::isnan(r[5 * 16]));
    });
}

TEST(SdpaModifiersEdges, ThreadCountsGiveTheSameBits) {
    for (std::size_t n : {13u, 14u}) {  // grouped / decode
        const SdpaCase cs = sdpa_cases()[n];
        const SdpaData D(cs);
        mha_test::for_each_cpu_isa([&] {
            const std::vector<float> one = D.run(mha::Backend::simd, mha::Algorithm::automatic, 1);
            for (int t : {2, 3, 0}) EXPECT_TRUE(mha_decode_test::same_bits(one, D.run(mha::Backend::simd, mha::Algorithm::automatic, t))) << t;
        });
    }
}

TEST(SdpaModifiersValidation, RefusedWithNothingWritten) {
    SdpaCase cs{"v", 1, 4, 2, 8, 20, 16, true, TL::top_left, {}};
    const SdpaData D(cs);
    const std::vector<float> bad_sinks = {0.0f, kNaN, 0.0f, 0.0f}, bad_slopes = {0.0f, 0.0f, INFINITY, 0.0f};
    auto expect_refused = [&](mha::ScoreModifiers m, const char* what) {
        std::vector<float> out(4 * 8 * 16, 7.0f);
        mha::SdpaOptions o = D.options(mha::Backend::simd, mha::Algorithm::automatic);
        o.modifiers = m;
        for (mha::Backend b : {mha::Backend::simd, mha::Backend::scalar}) {
            o.backend = b;
            try {
                mha::scaled_dot_product_attention(D.inputs(), Heads::bhld(out.data(), 1, 4, 8, 16), o);
                ADD_FAILURE() << what << " accepted";
            } catch (const mha::invalid_argument& e) {
                EXPECT_NE(std::string(e.what()).find("modifiers"), std::string::npos) << e.what();
            }
            for (float x : out) ASSERT_EQ(x, 7.0f) << what;
        }
    };
    mha::ScoreModifiers m;
    m.window_left = -2, expect_refused(m, "window_left -2");
    m = {}, m.window_right = -5, expect_refused(m, "window_right -5");
    m = {}, m.softcap = -1.0f, expect_refused(m, "softcap -1");
    m = {}, m.softcap = kNaN, expect_refused(m, "softcap NaN");
    m = {}, m.softcap = INFINITY, expect_refused(m, "softcap inf");
    m = {}, m.softcap = 1e-40f, expect_refused(m, "softcap 1e-40 (subnormal: 1 / c is inf)");
    m = {}, m.sinks = bad_sinks.data(), expect_refused(m, "NaN sink");
    m = {}, m.alibi_slopes = bad_slopes.data(), expect_refused(m, "inf slope");
}

// ---------------------------------------------------------------------------------------------------
// Layers: fp32 and bf16, every path, with need_weights; the KV cache across blocks; the paged step.

struct LayerCase {
    const char* name;
    std::size_t E, H, Hkv, d, Lq;
    Mods mods;
};

mha::MultiheadAttention make_layer(const mha_decode_test::DecoderLayer& l, mha::DataType compute, const Mods& mods) {
    mha::AttentionConfig c;
    c.embed_dim = l.E, c.num_heads = l.H, c.num_kv_heads = l.Hkv, c.head_dim = l.d, c.rope = l.rope, c.compute = compute;
    c.modifiers = mods.view();
    mha::AttentionWeights w;
    w.q_proj_weight = l.wq.data(), w.k_proj_weight = l.wk.data(), w.v_proj_weight = l.wv.data(), w.out_proj_weight = l.wo.data();
    w.q_proj_bias = mha_decode_test::DecoderLayer::ptr(l.bq), w.k_proj_bias = mha_decode_test::DecoderLayer::ptr(l.bk);
    w.v_proj_bias = mha_decode_test::DecoderLayer::ptr(l.bv), w.out_proj_bias = mha_decode_test::DecoderLayer::ptr(l.bo);
    return mha::MultiheadAttention(w, c);
}

mha_decode_test::LayerRef ref_of(const mha_decode_test::DecoderLayer& l, const Mods& mods) {
    mha_decode_test::LayerRef r = l.ref();
    r.mods = mods.view();
    return r;
}

TEST(LayerModifiers, Bf16AndFp32EveryPathAgainstTheEvaluations) {
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    const std::vector<LayerCase> cases = {
        {"window 50 + alibi, L 300", 128, 4, 2, 32, 300, {49, -1, 0, {}, mha::alibi_standard_slopes(4)}},
        {"softcap 30 + sinks, L 90", 128, 4, 1, 32, 90, {-1, -1, 30.0f, sinks_for(4, 21), {}}},
        {"all four, L 5 (decode)", 128, 8, 2, 16, 5, {3, -1, 20.0f, sinks_for(8, 22), mha::alibi_standard_slopes(8)}},
    };
    for (const LayerCase& lc : cases) {
        SCOPED_TRACE(lc.name);
        const mha_decode_test::DecoderLayer dl(lc.E, lc.H, lc.Hkv, lc.d, rope, true, false, 31);
        const std::vector<float> x = mha_decode_test::uniform(lc.Lq * lc.E, 1.0f, 32);
        auto run = [&](const mha::MultiheadAttention& m, mha::Backend backend, mha::Algorithm impl, mha::NeedWeights need) {
            std::vector<float> y(lc.Lq * lc.E, kNaN), w(need == mha::NeedWeights::per_head ? lc.H * lc.Lq * lc.Lq : 0, kNaN);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data(), 1, lc.Lq, lc.E);
            mha::ForwardOptions o;
            o.causal = true, o.backend = backend, o.impl = impl, o.need_weights = need;
            m.forward(in, {mha::Batch(y.data(), 1, lc.Lq, lc.E), w.empty() ? nullptr : w.data()}, o);
            return std::make_pair(y, w);
        };
        // fp32: against the decoder evaluation (a one-shot causal forward is a step over an empty cache).
        {
            const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, lc.mods);
            const mha_decode_test::StepExpected ex = mha_decode_test::step_double(ref_of(dl, lc.mods), x.data(), 1, lc.Lq, nullptr);
            const std::vector<double> tol = times(ex.out_err, kDecoderSafety);
            EXPECT_TRUE(mha_test::all_within(run(m, mha::Backend::scalar, mha::Algorithm::automatic, mha::NeedWeights::none).first, ex.out, tol));
            mha_test::for_each_cpu_isa([&] {
                for (mha::Algorithm impl : {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused})
                    EXPECT_TRUE(mha_test::all_within(run(m, mha::Backend::simd, impl, mha::NeedWeights::none).first, ex.out, tol));
                // need_weights: the materialized path's weights sum to 1 less the sink's share, zeros outside the window.
                const auto r = run(m, mha::Backend::simd, mha::Algorithm::automatic, mha::NeedWeights::per_head);
                EXPECT_TRUE(mha_test::all_within(r.first, ex.out, tol));
                for (std::size_t h = 0; h < lc.H; ++h)
                    for (std::size_t i = 0; i < lc.Lq; ++i)
                        for (std::size_t j = 0; j < lc.Lq; ++j) {
                            const float p = r.second[(h * lc.Lq + i) * lc.Lq + j];
                            const bool hidden = j > i || (lc.mods.left >= 0 && (long long)j < (long long)i - lc.mods.left);
                            ASSERT_TRUE(hidden ? p == 0.0f : p > 0.0f) << h << " " << i << " " << j << " " << p;
                        }
            });
        }
        // bf16 compute: against mha_bf16::evaluate (oracle and the rounded center).
        {
            const mha::MultiheadAttention m = make_layer(dl, mha::DataType::bf16, lc.mods);
            mha_bf16::Spec s;
            s.E = lc.E, s.H = lc.H, s.Hkv = lc.Hkv, s.d = lc.d, s.kdim = s.vdim = lc.E, s.B = 1, s.Lq = s.Lk = lc.Lq;
            s.rope = rope, s.rope->dims = lc.d, s.causal = true, s.mods = lc.mods.view();
            mha_bf16::Weights w;
            w.wq = dl.wq, w.wk = dl.wk, w.wv = dl.wv, w.wo = dl.wo, w.bq = dl.bq, w.bk = dl.bk, w.bv = dl.bv, w.bo = dl.bo;
            const mha_bf16::Expected ex = mha_bf16::evaluate(s, w, x.data(), x.data(), x.data());
            const std::vector<double> oracle = mha_bf16::scaled(ex.out.e, mha_bf16::kOracleFactor);
            const std::vector<double> tight = mha_bf16::scaled(ex.out.d, mha_bf16::kTightFactor);
            EXPECT_TRUE(mha_test::all_within(run(m, mha::Backend::scalar, mha::Algorithm::automatic, mha::NeedWeights::none).first, ex.out.o, oracle));
            mha_test::for_each_cpu_isa(
                [&] {
                    for (mha::Algorithm impl : {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused}) {
                        const std::vector<float> y = run(m, mha::Backend::simd, impl, mha::NeedWeights::none).first;
                        EXPECT_TRUE(mha_test::all_within(y, ex.out.o, oracle)) << "against the oracle";
                        EXPECT_TRUE(mha_test::all_within(y, ex.out.t, tight)) << "against the bf16 center";
                    }
                },
                true);
        }
    }
}

// A KV cache fed in chunks that cross 256-row blocks (and token by token), with a window shorter than a block:
// every step against the decoder evaluation; every ISA.
TEST(LayerModifiers, KVCacheChunksAcrossBlocks) {
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    const Mods mods{40, -1, 25.0f, sinks_for(4, 41), mha::alibi_standard_slopes(4)};
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, rope, true, false, 42);
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::size_t chunks[] = {200, 1, 70, 3, 1, 300, 1};
    mha_test::for_each_cpu_isa([&] {
        mha::KVCache cache(1, 2, 16, 600);
        std::uint32_t seed = 50;
        for (std::size_t n : chunks) {
            const std::vector<float> x = mha_decode_test::uniform(n * 64, 1.0f, seed++);
            const mha_decode_test::StepExpected ex = mha_decode_test::step_double(ref_of(dl, mods), x.data(), 1, n, &cache);
            std::vector<float> y(n * 64, kNaN);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data(), 1, n, 64);
            m.forward(in, {mha::Batch(y.data(), 1, n, 64)}, {}, cache);
            ASSERT_TRUE(mha_test::all_within(y, ex.out, times(ex.out_err, kDecoderSafety))) << "chunk of " << n << " at " << cache.length(0);
        }
    });
}

// The paged step with modifiers: each sequence's rows bitwise those of the contiguous cache fed the same
// tokens, for block sizes 16 and 256, alone or beside others (batch invariance).
TEST(LayerModifiers, PagedStepEqualsContiguousCacheBitwise) {
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    const Mods mods{33, -1, 25.0f, sinks_for(4, 61), mha::alibi_standard_slopes(4)};
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, rope, true, false, 62);
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::size_t E = 64, steps = 3;
    const std::size_t q_a[steps] = {90, 1, 40}, q_b[steps] = {5, 30, 1};
    std::vector<std::vector<float>> xa, xb;
    for (std::size_t s = 0; s < steps; ++s)
        xa.push_back(mha_decode_test::uniform(q_a[s] * E, 1.0f, 70 + s)), xb.push_back(mha_decode_test::uniform(q_b[s] * E, 1.0f, 80 + s));
    // Contiguous cache, sequence a alone.
    std::vector<std::vector<float>> ya;
    {
        mha::KVCache cache(1, 2, 16, 256);
        for (std::size_t s = 0; s < steps; ++s) {
            std::vector<float> y(q_a[s] * E, kNaN);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(xa[s].data(), 1, q_a[s], E);
            m.forward(in, {mha::Batch(y.data(), 1, q_a[s], E)}, {}, cache);
            ya.push_back(y);
        }
    }
    for (std::size_t bs : {16u, 256u}) {
        mha::PagedKVCache cache(64, bs, 2, 16);
        const std::size_t a = cache.add_sequence(), b = cache.add_sequence();
        for (std::size_t s = 0; s < steps; ++s) {
            std::vector<float> x(xb[s]);
            x.insert(x.end(), xa[s].begin(), xa[s].end());  // b first, then a
            const std::size_t T = q_a[s] + q_b[s];
            std::vector<float> y(T * E, kNaN);
            const std::size_t ids[2] = {b, a}, ql[2] = {q_b[s], q_a[s]};
            m.forward_step(mha::ConstMatrix(x.data(), T, E, E), mha::Matrix(y.data(), T, E, E), cache, ids, ql, 2);
            EXPECT_EQ(std::memcmp(y.data() + q_b[s] * E, ya[s].data(), q_a[s] * E * sizeof(float)), 0) << "block " << bs << " step " << s;
        }
    }
}

TEST(LayerModifiers, ConfigValidationAndCopy) {
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, std::nullopt, false, false, 90);
    Mods bad;
    bad.sinks = {0.0f, 0.0f, kNaN, 0.0f};
    EXPECT_THROW(make_layer(dl, mha::DataType::f32, bad), mha::invalid_argument);
    bad = {}, bad.left = -3;
    EXPECT_THROW(make_layer(dl, mha::DataType::f32, bad), mha::invalid_argument);
    // Arrays are copied at construction: changing them afterwards changes nothing.
    Mods mods{-1, -1, 0, sinks_for(4, 91), {}};
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::vector<float> x = mha_decode_test::uniform(10 * 64, 1.0f, 92);
    auto run = [&] {
        std::vector<float> y(x.size(), kNaN);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), 1, 10, 64);
        m.forward(in, {mha::Batch(y.data(), 1, 10, 64)});
        return y;
    };
    const std::vector<float> before = run();
    std::fill(mods.sinks.begin(), mods.sinks.end(), kNaN);
    EXPECT_TRUE(mha_decode_test::same_bits(before, run()));
}

}  // namespace

namespace {

// Opt-in block release for sliding-window layers (PagedKVCache::release_before): a generation that releases
// after every step gives bitwise the outputs of one that does not, with O(window) blocks in use; the refusals.
TEST(PagedWindowRelease, GenerationKeepsWindowMemoryAndTheSameBits) {
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    const long long left = 39;
    const Mods mods{left, -1, 0.0f, sinks_for(4, 71), {}};
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, rope, true, false, 72);
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::size_t E = 64, bs = 16, prompt = 50, steps = 150;
    const std::vector<float> x = mha_decode_test::uniform((prompt + steps) * E, 1.0f, 73);
    mha_test::for_each_cpu_isa([&] {
        mha::PagedKVCache kept(64, bs, 2, 16), freed(64, bs, 2, 16);
        const std::size_t a = kept.add_sequence(), b = freed.add_sequence();
        std::size_t most = 0;
        for (std::size_t t = 0; t < prompt + steps;) {
            const std::size_t q = t == 0 ? prompt : 1;
            std::vector<float> ya(q * E, kNaN), yb(q * E, kNaN);
            m.forward_step(mha::ConstMatrix(x.data() + t * E, q, E, E), mha::Matrix(ya.data(), q, E, E), kept, &a, &q, 1);
            m.forward_step(mha::ConstMatrix(x.data() + t * E, q, E, E), mha::Matrix(yb.data(), q, E, E), freed, &b, &q, 1);
            ASSERT_TRUE(mha_decode_test::same_bits(ya, yb)) << "token " << t;
            t += q;
            const std::size_t released = freed.release_before(b, t - std::size_t(left));
            ASSERT_EQ(released, (t - std::size_t(left)) / bs * bs);
            most = std::max(most, freed.used_blocks());
        }
        EXPECT_EQ(kept.used_blocks(), (prompt + steps + bs - 1) / bs);  // 13 blocks
        EXPECT_LE(most, (std::size_t(left) + 1 + bs - 1) / bs + 2);      // the window's blocks and the one being filled
        // copy_keys: NaN where released, the kept cache's rows after.
        std::vector<float> ka((prompt + steps) * 16), kb(ka.size());
        kept.copy_keys(a, 1, mha::Matrix(ka.data(), prompt + steps, 16));
        freed.copy_keys(b, 1, mha::Matrix(kb.data(), prompt + steps, 16));
        const std::size_t rel = freed.released_tokens(b);
        for (std::size_t n = 0; n < rel * 16; ++n) ASSERT_TRUE(std::isnan(kb[n]));
        EXPECT_EQ(std::memcmp(ka.data() + rel * 16, kb.data() + rel * 16, (ka.size() - rel * 16) * sizeof(float)), 0);
    });
}

// Chunked prefill after releases, in blocks of 32 and 64 rows (the grouped path packs fp32 blocks that start a
// panel in place, and a released block's rows as zeros): bitwise the outputs of a cache in blocks of 16 that keeps
// its blocks (on AVX-512 its rows are widened into workspace before packing: the other packing path).
TEST(PagedWindowRelease, ChunkedPrefillOverReleasedBlocksKeepsTheBits) {
    const long long left = 39;
    const Mods mods{left, -1, 0.0f, sinks_for(4, 77), {}};
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, mha::RopeConfig{}, true, false, 78);
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::size_t E = 64, chunk = 40, total = 240;
    const std::vector<float> x = mha_decode_test::uniform(total * E, 1.0f, 79);
    for (std::size_t bs : {std::size_t(32), std::size_t(64)}) {
        SCOPED_TRACE("block_size " + std::to_string(bs));
        mha_test::for_each_cpu_isa([&] {
            mha::PagedKVCache kept(32, 16, 2, 16), freed(16, bs, 2, 16);
            const std::size_t a = kept.add_sequence(), b = freed.add_sequence();
            for (std::size_t t = 0; t < total; t += chunk) {
                std::vector<float> ya(chunk * E, kNaN), yb(chunk * E, kNaN);
                m.forward_step(mha::ConstMatrix(x.data() + t * E, chunk, E, E), mha::Matrix(ya.data(), chunk, E, E), kept, &a, &chunk, 1);
                m.forward_step(mha::ConstMatrix(x.data() + t * E, chunk, E, E), mha::Matrix(yb.data(), chunk, E, E), freed, &b, &chunk, 1);
                ASSERT_TRUE(mha_decode_test::same_bits(ya, yb)) << "chunk at " << t;
                ASSERT_FALSE(std::isnan(yb[0])) << "chunk at " << t;
                freed.release_before(b, t + chunk - std::size_t(left));
            }
            EXPECT_GE(freed.released_tokens(b), 2 * bs);
        });
    }
}

// The scalar backend over released blocks: their rows (NaN in copy_keys) stay out of the reference's sums.
TEST(PagedWindowRelease, ScalarBackendGivesTheSameBitsAfterRelease) {
    const long long left = 39;
    const Mods mods{left, -1, 0.0f, sinks_for(4, 74), {}};
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, mha::RopeConfig{}, true, false, 75);
    const mha::MultiheadAttention m = make_layer(dl, mha::DataType::f32, mods);
    const std::size_t E = 64, bs = 16, prompt = 50, steps = 40;
    const std::vector<float> x = mha_decode_test::uniform((prompt + steps) * E, 1.0f, 76);
    mha::PagedKVCache kept(16, bs, 2, 16), freed(16, bs, 2, 16);
    const std::size_t a = kept.add_sequence(), b = freed.add_sequence();
    for (std::size_t t = 0; t < prompt + steps;) {
        const std::size_t q = t == 0 ? prompt : 1;
        std::vector<float> ya(q * E, kNaN), yb(q * E, kNaN);
        m.forward_step(mha::ConstMatrix(x.data() + t * E, q, E, E), mha::Matrix(ya.data(), q, E, E), kept, &a, &q, 1, 0, mha::Backend::scalar);
        m.forward_step(mha::ConstMatrix(x.data() + t * E, q, E, E), mha::Matrix(yb.data(), q, E, E), freed, &b, &q, 1, 0, mha::Backend::scalar);
        ASSERT_TRUE(mha_decode_test::same_bits(ya, yb)) << "token " << t;
        ASSERT_FALSE(std::isnan(yb[0])) << "token " << t;
        t += q;
        freed.release_before(b, t - std::size_t(left));
    }
    EXPECT_GT(freed.released_tokens(b), 0u);
}

TEST(PagedWindowRelease, RefusalsChangeNothing) {
    const mha_decode_test::DecoderLayer dl(64, 4, 2, 16, std::nullopt, false, false, 81);
    const mha::MultiheadAttention windowed = make_layer(dl, mha::DataType::f32, Mods{31, -1, 0.0f, {}, {}});
    const mha::MultiheadAttention wider = make_layer(dl, mha::DataType::f32, Mods{70, -1, 0.0f, {}, {}});
    const mha::MultiheadAttention full = make_layer(dl, mha::DataType::f32, Mods{});
    mha::PagedKVCache cache(32, 16, 2, 16);
    const std::size_t s = cache.add_sequence();
    const std::size_t q = 100;
    const std::vector<float> x = mha_decode_test::uniform(q * 64, 1.0f, 82);
    std::vector<float> y(q * 64);
    windowed.forward_step(mha::ConstMatrix(x.data(), q, 64, 64), mha::Matrix(y.data(), q, 64, 64), cache, &s, &q, 1);
    EXPECT_THROW(cache.release_before(s, 101), mha::invalid_argument);
    EXPECT_EQ(cache.release_before(s, 100 - 31), 64u);  // blocks 0-3 (tokens 0..63)
    EXPECT_EQ(cache.used_blocks(), 3u);
    const std::size_t t = cache.fork(s);  // shares the kept blocks, none of the released
    EXPECT_EQ(cache.released_tokens(t), 64u);
    EXPECT_EQ(cache.used_blocks(), 3u);
    const std::size_t one = 1;
    std::vector<float> y1(64, 7.0f);
    for (const mha::MultiheadAttention* layer : {&wider, &full}) {  // would see released keys: refused
        try {
            layer->forward_step(mha::ConstMatrix(x.data(), 1, 64, 64), mha::Matrix(y1.data(), 1, 64, 64), cache, &s, &one, 1);
            ADD_FAILURE() << "accepted";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("released"), std::string::npos) << e.what();
        }
        EXPECT_EQ(cache.length(s), 100u);
        for (float v : y1) ASSERT_EQ(v, 7.0f);
    }
    windowed.forward_step(mha::ConstMatrix(x.data(), 1, 64, 64), mha::Matrix(y1.data(), 1, 64, 64), cache, &s, &one, 1);
    EXPECT_EQ(cache.length(s), 101u);
    EXPECT_THROW(cache.truncate(s, 63), mha::invalid_argument);
    cache.truncate(s, 64);
    cache.free_sequence(s);
    cache.free_sequence(t);
    EXPECT_EQ(cache.free_blocks(), 32u);
}

}  // namespace
