// The SIMD decoder layer (MultiheadAttention with an AttentionConfig: grouped-query heads, a head dim of
// its own with H·d ≠ E, kdim / vdim, separate or packed projections, optional biases, RoPE, causal
// alignments, positions) against the scalar backend (the reference), on every ISA this CPU has and with
// every impl (automatic, materialized, fused); attention weights with GQA; bitwise identity across thread
// counts; and the grouped path's promise that K and V are read once per group (detail::kv_rows_read).
//
// Tolerances are derived, per output element, from a double evaluation of the layer that carries a
// bound on the error of a float evaluation of the same formula: c·u·(growth with the sum's length)·
// (magnitude of the terms), u = 2^-24, stage by stage (attention_test_util.hpp, core_double and below):
//   projections  y = x·Wᵀ + b (length K = E, kdim or vdim):  |Δy| ≤ g(K + 1)·u·(Σ|x||w| + |b|)
//   RoPE         (x1, x2) → (x1·c − x2·s, x2·c + x1·s), c and s rounded to float once (the SIMD backend
//                rotates in float, the reference in double):  |Δ| ≤ |c||Δx1| + |s||Δx2| + 4u·(|x1||c| + |x2||s|)
//                (the double angle p·θ_k is off by about p·2^-53 ≤ 2^-32 rad at p = 2^20: far below u)
//   core         scores g(d + 3)·u·scale·Σ|q||k| plus the q and k errors carried through the dot; masks
//                2u; softmax and P·V with g(Lk) and T = ⌈Lk / 256⌉ online-softmax tiles; score errors
//                reach the context as Σ_j p_j·|Δz_j|·|v_j − c| (first order, exact)
//   out proj     o = C·Woᵀ + bo (length H·d):  |Δo| ≤ Σ|ΔC||w| + g(H·d + 1)·u·(Σ|C||w| + |bo|)
//   averaged weights Σ_h p_h / H:  Σ_h |Δp_h| / H + (H + 1)·u·avg
// g(n) = min(n, λ·√n) and errors of distinct elements carried through a sum add as min(Σ|a||e|,
// λ·√(Σ a²e²)), λ = 6: the worst case, or the probabilistic rounding-error model of Higham and Mary
// (rounding errors independent and mean-zero; the bound fails with probability below 2n·e^(−λ²/2) ≈ 3e-8·n)
// when that is smaller. Pure worst-case bounds through four stages of sums (length K, d, Lk, H·d) came out
// 1 to 6 % of the outputs here, loose enough to hide a wrong key; these are 0.06 to 0.9 %, against measured
// differences near 1e-6 of the outputs.
// Each backend is within kDecoderSafety (2, for the second-order terms) times the bound of the exact value,
// so |simd − scalar| ≤ 2·2·bound per element; the scalar backend is also checked against the double value
// (2·bound), so both agreeing on a wrong reading of the config (a wrong KV head, RoPE style or causal
// offset) fails too. The bounds are checked to stay below kMaxRelativeBound of the outputs, and
// ToleranceCatchesWrongConfigurations checks that they refuse each kind of mistake the sweep looks for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <mha/mha.hpp>

#include "attention/attention_core.hpp"
#include "attention_test_util.hpp"
#include "compare_util.hpp"

namespace {

using mha_test::HeadsD;
using mha_test::kU;

// The largest |simd − scalar| output bound relative to the largest output (0.06 to 0.9 % here; see above).
constexpr double kMaxRelativeBound = 1e-2;

// Wq is drawn kQueryGain times larger than nn.Linear's init, so that scores spread over several units and
// softmax rows are peaked, as in trained decoders: outputs then follow a few keys, so a wrong key, mask
// or position changes them clearly, and the averaging that makes random attention outputs small (and
// worst-case bounds relatively large) is avoided.
constexpr float kQueryGain = 2.0f, kKeyGain = 2.0f;

enum class Bias { packed, separate };  // in_proj_bias, or q/k/v_proj_bias each present or not

struct LayerCase {
    const char* name;
    std::size_t E, H, Hkv, d, kdim = 0, vdim = 0;  // kdim / vdim 0: E
    std::size_t B = 1, Lq = 1, Lk = 1;
    bool self = false;          // key = value = query (Lk = Lq, key.data = nullptr)
    bool packed = false;        // in_proj_weight rather than q/k/v_proj_weight
    Bias bias = Bias::separate;
    bool bq = true, bk = true, bv = true, bo = true;  // which biases are given (packed: bq is all three)
    std::optional<mha::RopeConfig> rope{};
    std::size_t position_offset = 0;
    std::vector<std::size_t> positions{};  // [B] or empty
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    int key_padding = 0;  // 0 none, 1 bool, 2 float
    int attn_mask = 0;    // 0 none, 1 2-D bool, 2 2-D additive, 3 3-D bool, 4 3-D additive
};

constexpr float kPadding = 777.0f;  // memory next to an output that no call may write

std::vector<float> uniform(std::size_t n, float bound, std::uint32_t seed) { return mha_test::random_floats(n, -bound, bound, seed); }

// A layer (weights like nn.Linear's init: ±1/√fan_in) and its inputs in [-1, 1].
struct Layer {
    LayerCase c;
    std::size_t kdim, vdim, qw, kvw;
    std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;  // b*: empty = not given (zeros)
    std::vector<float> in_w, in_b;                      // the packed forms, when used
    std::vector<float> query, key, value;               // key, value empty: self-attention
    mha_test::Mask key_padding_mask, attn_mask;

    explicit Layer(const LayerCase& lc, std::uint32_t seed = 1) : c(lc) {
        kdim = c.kdim ? c.kdim : c.E, vdim = c.vdim ? c.vdim : c.E, qw = c.H * c.d, kvw = c.Hkv * c.d;
        if (c.self) c.Lk = c.Lq;
        const float sE = 1.0f / std::sqrt(float(c.E)), sK = 1.0f / std::sqrt(float(kdim)), sV = 1.0f / std::sqrt(float(vdim)),
                    sO = 1.0f / std::sqrt(float(qw));
        wq = uniform(qw * c.E, kQueryGain * sE, seed), wk = uniform(kvw * kdim, kKeyGain * sK, seed + 1), wv = uniform(kvw * vdim, sV, seed + 2);
        wo = uniform(c.E * qw, sO, seed + 3);
        if (c.bq) bq = uniform(qw, sE, seed + 4);
        if (c.bias == Bias::packed && c.bq) bk = uniform(kvw, sK, seed + 5), bv = uniform(kvw, sV, seed + 6);
        if (c.bias == Bias::separate && c.bk) bk = uniform(kvw, sK, seed + 5);
        if (c.bias == Bias::separate && c.bv) bv = uniform(kvw, sV, seed + 6);
        if (c.bo) bo = uniform(c.E, sO, seed + 7);
        if (c.packed) {
            in_w = wq, in_w.insert(in_w.end(), wk.begin(), wk.end()), in_w.insert(in_w.end(), wv.begin(), wv.end());
        }
        if (c.bias == Bias::packed && c.bq) {
            in_b = bq, in_b.insert(in_b.end(), bk.begin(), bk.end()), in_b.insert(in_b.end(), bv.begin(), bv.end());
        }
        query = uniform(c.B * c.Lq * c.E, 1.0f, seed + 8);
        if (!c.self) key = uniform(c.B * c.Lk * kdim, 1.0f, seed + 9), value = uniform(c.B * c.Lk * vdim, 1.0f, seed + 10);
        mha_test::random_case_masks(c.key_padding, c.attn_mask, c.B, c.H, c.Lq, c.Lk, 0.25, 0.2, seed + 11, key_padding_mask, attn_mask);
    }

    const float* key_data() const { return c.self ? query.data() : key.data(); }
    const float* value_data() const { return c.self ? query.data() : value.data(); }
    static const float* ptr(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

    mha::AttentionConfig config() const {
        mha::AttentionConfig cfg;
        cfg.embed_dim = c.E, cfg.num_heads = c.H, cfg.num_kv_heads = c.Hkv, cfg.head_dim = c.d;
        cfg.kdim = c.kdim, cfg.vdim = c.vdim, cfg.rope = c.rope;
        return cfg;
    }
    mha::AttentionWeights weights() const {
        mha::AttentionWeights w;
        if (c.packed) w.in_proj_weight = in_w.data();
        else w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data();
        if (c.bias == Bias::packed) w.in_proj_bias = ptr(in_b);
        else w.q_proj_bias = ptr(bq), w.k_proj_bias = ptr(bk), w.v_proj_bias = ptr(bv);
        w.out_proj_weight = wo.data();
        w.out_proj_bias = ptr(bo);
        return w;
    }
    mha::MultiheadAttention make() const { return mha::MultiheadAttention(weights(), config()); }

    mha::AttentionInputs inputs() const {
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), c.B, c.Lq, c.E);
        if (!c.self) {
            in.key = mha::ConstBatch(key.data(), c.B, c.Lk, kdim);
            in.value = mha::ConstBatch(value.data(), c.B, c.Lk, vdim);
        }
        in.key_padding_mask = key_padding_mask.view();
        in.attn_mask = attn_mask.view();
        return in;
    }
    mha::ForwardOptions options(mha::Backend backend, mha::Impl impl, mha::NeedWeights need, int threads) const {
        mha::ForwardOptions o;
        o.backend = backend, o.impl = impl, o.need_weights = need, o.threads = threads;
        o.causal = c.causal, o.causal_alignment = c.alignment;
        o.position_offset = c.position_offset;
        o.positions = c.positions.empty() ? nullptr : c.positions.data();
        return o;
    }

    struct Result {
        std::vector<float> output, weights;
        bool operator==(const Result& o) const { return output == o.output && weights == o.weights; }
    };
    Result run(const mha::MultiheadAttention& m, mha::Backend backend, mha::Impl impl,
               mha::NeedWeights need = mha::NeedWeights::none, int threads = 0) const {
        Result r;
        r.output.assign(c.B * c.Lq * c.E, std::numeric_limits<float>::quiet_NaN());
        if (need == mha::NeedWeights::averaged) r.weights.assign(c.B * c.Lq * c.Lk, std::numeric_limits<float>::quiet_NaN());
        if (need == mha::NeedWeights::per_head) r.weights.assign(c.B * c.H * c.Lq * c.Lk, std::numeric_limits<float>::quiet_NaN());
        m.forward(inputs(), {mha::Batch(r.output.data(), c.B, c.Lq, c.E), r.weights.empty() ? nullptr : r.weights.data()},
                  options(backend, impl, need, threads));
        return r;
    }
};

// ---------------------------------------------------------------------------------------------------
// The double evaluation of a layer with its bounds (see the top of this file).

// x [B, L, K] (row-major) times W [heads·d, K]ᵀ plus b as heads [B, heads, L, d], with the projection bound.
HeadsD project(const float* x, std::size_t B, std::size_t L, std::size_t K, const std::vector<float>& w, const std::vector<float>& b,
               std::size_t heads, std::size_t d) {
    HeadsD y(B, heads, L, d);
    for (std::size_t bb = 0; bb < B; ++bb)
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t n = 0; n < heads * d; ++n) {
                double sum = b.empty() ? 0.0 : double(b[n]), mag = std::abs(sum);
                for (std::size_t k = 0; k < K; ++k) {
                    const double t = double(x[(bb * L + i) * K + k]) * double(w[n * K + k]);
                    sum += t, mag += std::abs(t);
                }
                const std::size_t at = y.at(bb, n / d, i, n % d);
                y.val[at] = sum, y.err[at] = mha_test::rounding_growth(K + 1) * kU * mag;
            }
    return y;
}

// Rotates every head row of x: row i of batch b at position start[b] + i.
void rope(HeadsD& x, const mha::RopeConfig& rc, const std::vector<std::size_t>& start) {
    const std::size_t r = rc.dims ? rc.dims : x.d, half = r / 2;
    for (std::size_t b = 0; b < x.B; ++b)
        for (std::size_t h = 0; h < x.H; ++h)
            for (std::size_t i = 0; i < x.L; ++i)
                for (std::size_t k = 0; k < half; ++k) {
                    const double theta_k = std::pow(double(rc.theta), -2.0 * double(k) / double(r));
                    const double angle = double(start[b] + i) * theta_k, co = std::cos(angle), si = std::sin(angle);
                    const std::size_t i1 = x.at(b, h, i, rc.style == mha::RopeStyle::half ? k : 2 * k);
                    const std::size_t i2 = x.at(b, h, i, rc.style == mha::RopeStyle::half ? k + half : 2 * k + 1);
                    const double x1 = x.val[i1], x2 = x.val[i2], e1 = x.err[i1], e2 = x.err[i2];
                    const double mag = std::abs(x1) * std::abs(co) + std::abs(x2) * std::abs(si);
                    const double mag2 = std::abs(x2) * std::abs(co) + std::abs(x1) * std::abs(si);
                    x.val[i1] = x1 * co - x2 * si, x.val[i2] = x2 * co + x1 * si;
                    x.err[i1] = std::abs(co) * e1 + std::abs(si) * e2 + 4 * kU * mag;
                    x.err[i2] = std::abs(co) * e2 + std::abs(si) * e1 + 4 * kU * mag2;
                }
}

struct LayerExpected {
    std::vector<double> out, out_err;          // [B, Lq, E]
    std::vector<double> probs, probs_err;      // [B, H, Lq, Lk]
    std::vector<double> averaged, averaged_err;  // [B, Lq, Lk]
};

// k_shift: a deliberate mistake for ToleranceCatchesWrongConfigurations (K rotated that many positions
// past Q); 0 otherwise.
LayerExpected layer_double(const Layer& L, std::size_t k_shift = 0) {
    const LayerCase& c = L.c;
    const std::size_t B = c.B, Lq = c.Lq, Lk = c.Lk, E = c.E, H = c.H, d = c.d;
    HeadsD q = project(L.query.data(), B, Lq, E, L.wq, L.bq, H, d);
    HeadsD k = project(L.key_data(), B, Lk, L.kdim, L.wk, L.bk, c.Hkv, d);
    HeadsD v = project(L.value_data(), B, Lk, L.vdim, L.wv, L.bv, c.Hkv, d);
    if (c.rope) {
        // Key row j at start_b + j; query row i at start_b + i, or at start_b + Lk − Lq + i with bottom-right
        // alignment (the queries are the last Lq tokens; causal or not). start_b >= Lq − Lk in every case.
        std::vector<std::size_t> start(B, c.position_offset);
        if (!c.positions.empty()) start = c.positions;
        std::vector<std::size_t> query_start = start;
        if (c.alignment == mha::CausalAlignment::bottom_right)
            for (std::size_t& x : query_start) x = x + Lk - Lq;  // unsigned wrap-around cancels: x >= Lq − Lk
        rope(q, *c.rope, query_start);
        for (std::size_t& x : start) x += k_shift;
        rope(k, *c.rope, start);
    }
    mha_test::CoreSpec spec;
    spec.scale = double(1.0f / std::sqrt(static_cast<float>(d)));  // the float the library uses
    spec.causal = c.causal, spec.alignment = c.alignment;
    spec.key_padding_mask = L.key_padding_mask.view(), spec.attn_mask = L.attn_mask.view();
    const mha_test::CoreExpected core = mha_test::core_double(q, k, v, spec);

    LayerExpected ex;
    ex.out.assign(B * Lq * E, 0.0), ex.out_err.assign(B * Lq * E, 0.0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t e = 0; e < E; ++e) {
                double sum = L.bo.empty() ? 0.0 : double(L.bo[e]), mag = std::abs(sum), prop = 0.0, prop2 = 0.0;
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t t = 0; t < d; ++t) {
                        const double w = L.wo[e * H * d + h * d + t];
                        const std::size_t at = core.ctx.at(b, h, i, t);
                        const double te = core.ctx.err[at] * std::abs(w);
                        sum += core.ctx.val[at] * w, mag += std::abs(core.ctx.val[at] * w), prop += te, prop2 += te * te;
                    }
                ex.out[(b * Lq + i) * E + e] = sum;
                ex.out_err[(b * Lq + i) * E + e] = mha_test::independent_sum(prop, prop2) + mha_test::rounding_growth(H * d + 1) * kU * mag;
            }
    ex.probs = core.probs, ex.probs_err = core.probs_err;
    ex.averaged.assign(B * Lq * Lk, 0.0), ex.averaged_err.assign(B * Lq * Lk, 0.0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t ij = 0; ij < Lq * Lk; ++ij) {
                ex.averaged[b * Lq * Lk + ij] += core.probs[(b * H + h) * Lq * Lk + ij] / double(H);
                ex.averaged_err[b * Lq * Lk + ij] += core.probs_err[(b * H + h) * Lq * Lk + ij] / double(H);
            }
    for (std::size_t n = 0; n < ex.averaged.size(); ++n) ex.averaged_err[n] += double(H + 1) * kU * ex.averaged[n];
    return ex;
}

std::vector<double> times(const std::vector<double>& x, double c) {
    std::vector<double> y(x);
    for (double& t : y) t *= c;
    return y;
}
std::vector<double> as_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

constexpr mha::Impl kImpls[] = {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused};
const char* impl_name(mha::Impl i) {
    return i == mha::Impl::automatic ? "automatic" : i == mha::Impl::materialized ? "materialized" : "fused";
}

// The scalar backend against the double value; then the SIMD backend, on every ISA and impl, against
// the scalar backend, per element.
void check_layer(const LayerCase& lc) {
    SCOPED_TRACE(lc.name);
    const Layer L(lc);
    const mha::MultiheadAttention m = L.make();
    const LayerExpected ex = layer_double(L);
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.out_err);
    ASSERT_LT(mha_test::relative_tolerance(ex.out, tol), kMaxRelativeBound) << "bound too loose to catch anything";
    const Layer::Result scalar = L.run(m, mha::Backend::scalar, mha::Impl::automatic);
    ASSERT_TRUE(mha_test::all_within(scalar.output, ex.out, times(ex.out_err, mha_test::kDecoderSafety)))
        << "scalar backend against the double evaluation";
    const std::vector<double> ref = as_double(scalar.output);
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls) {
            SCOPED_TRACE(impl_name(impl));
            ASSERT_TRUE(mha_test::all_within(L.run(m, mha::Backend::simd, impl).output, ref, tol)) << "SIMD against scalar";
        }
    });
}

mha::RopeConfig rope(mha::RopeStyle style, std::size_t dims = 0, float theta = 10000.0f) { return {theta, dims, style}; }

constexpr std::size_t kFar = (std::size_t{1} << 20) - 5;  // 2^20 − 5

// Each listed value of every axis appears at least once with G > 1 (where automatic takes the grouped
// path) or runs the grouped path through Impl::fused; G = 1 and the materialized path run too.
//   G: 1, 2, 4, 8 (= H), 6 (= H)      d: 32, 64, 80, 128      Lk tails: 1, 7, 63, 65, 257, 300
//   H·d ≠ E: 96 vs 8·64, 4·32, 6·32; 200 vs 4·80, 8·128 vs 96
//   kdim / vdim ≠ E: 48 / 72, 200 / 33 (cross)       weights packed (with H·d ≠ E) and separate
//   biases: in_proj_bias, none, q only, k and v only, no k, no out
//   causal: top-left Lq < Lk and Lq > Lk; bottom-right Lq < Lk, Lq = Lk and Lq > Lk (rows with no key)
//   RoPE: half / interleaved, dims < d, offsets 0, 1000, 2^20 − 5, positions[B]; queries at start + Lk − Lq + i
//         with bottom-right alignment, with and without causal
//   masks: key_padding bool / float, attn_mask 2-D / 3-D bool / additive
const LayerCase kCases[] = {
    {.name = "G=1 self packed in_proj_bias, RoPE half at 0, causal top-left, padding bool", .E = 256, .H = 8, .Hkv = 8,
     .d = 32, .B = 2, .Lq = 65, .self = true, .packed = true, .bias = Bias::packed, .rope = rope(mha::RopeStyle::half),
     .causal = true, .key_padding = 1},
    {.name = "G=2 cross d=64 H·d≠E, q bias only, RoPE interleaved dims 32 at 1000, bottom-right Lq<Lk, 3-D bool",
     .E = 96, .H = 8, .Hkv = 4, .d = 64, .B = 2, .Lq = 7, .Lk = 300, .bk = false, .bv = false,
     .rope = rope(mha::RopeStyle::interleaved, 32), .position_offset = 1000, .causal = true,
     .alignment = mha::CausalAlignment::bottom_right, .attn_mask = 3},
    {.name = "G=4 self d=80 E=200, k/v biases only, RoPE half dims 40 at 2^20-5, bottom-right Lq=Lk, padding float + 2-D additive",
     .E = 200, .H = 8, .Hkv = 2, .d = 80, .B = 2, .Lq = 63, .self = true, .bq = false, .bo = false,
     .rope = rope(mha::RopeStyle::half, 40), .position_offset = kFar, .causal = true,
     .alignment = mha::CausalAlignment::bottom_right, .key_padding = 2, .attn_mask = 2},
    {.name = "G=8=H cross d=128 kdim 48 vdim 72, no k bias, RoPE interleaved, positions[B], top-left Lq>Lk=1", .E = 96,
     .H = 8, .Hkv = 1, .d = 128, .kdim = 48, .vdim = 72, .B = 2, .Lq = 65, .Lk = 1, .bk = false,
     .rope = rope(mha::RopeStyle::interleaved, 0, 500000.0f), .positions = {3, kFar}, .causal = true, .key_padding = 0},
    {.name = "G=6=H cross packed H·d≠E with in_proj_bias, top-left Lq<Lk=257, padding bool + 3-D additive", .E = 96, .H = 6,
     .Hkv = 1, .d = 32, .B = 2, .Lq = 70, .Lk = 257, .packed = true, .bias = Bias::packed, .causal = true,
     .key_padding = 1, .attn_mask = 4},
    {.name = "G=2 self E=96 H=4 d=32 packed no biases, RoPE half at 1000, top-left, 2-D bool, Lk=7", .E = 96, .H = 4,
     .Hkv = 2, .d = 32, .B = 2, .Lq = 7, .self = true, .packed = true, .bias = Bias::packed, .bq = false, .bo = false,
     .rope = rope(mha::RopeStyle::half), .position_offset = 1000, .causal = true, .attn_mask = 1},
    {.name = "G=2 cross E=200 d=80 vdim 33, RoPE half, positions[B] (235 = Lq − Lk: query 0 at 0), bottom-right Lq=300>Lk=65 (blind rows)", .E = 200,
     .H = 4, .Hkv = 2, .d = 80, .vdim = 33, .B = 2, .Lq = 300, .Lk = 65, .rope = rope(mha::RopeStyle::half),
     .positions = {kFar, 235}, .causal = true, .alignment = mha::CausalAlignment::bottom_right, .key_padding = 1},
    {.name = "G=4 decode step Lq=1 Lk=300, RoPE interleaved dims 16 at 2^20-5, bottom-right, padding float", .E = 64,
     .H = 8, .Hkv = 2, .d = 32, .B = 2, .Lq = 1, .Lk = 300, .rope = rope(mha::RopeStyle::interleaved, 16),
     .position_offset = kFar, .causal = true, .alignment = mha::CausalAlignment::bottom_right, .key_padding = 2},
    {.name = "G=4 cross no causal, no RoPE, 3-D bool + padding bool, Lk=63", .E = 64, .H = 8, .Hkv = 2, .d = 64, .B = 2,
     .Lq = 33, .Lk = 63, .key_padding = 1, .attn_mask = 3},
    {.name = "G=2 cross, bottom-right alignment without causal: RoPE query positions shifted by Lk - Lq only", .E = 64,
     .H = 8, .Hkv = 4, .d = 32, .B = 2, .Lq = 5, .Lk = 40, .rope = rope(mha::RopeStyle::half), .position_offset = 1000,
     .alignment = mha::CausalAlignment::bottom_right},
};

TEST(SimdDecoder, GroupedLayerMatchesScalar) {
    for (const LayerCase& c : kCases) check_layer(c);
}

// Every mask kind on the grouped path (G = 4) and on G = 1, self and cross.
TEST(SimdDecoder, EveryMaskKind) {
    for (std::size_t Hkv : {2, 8})
        for (int kp = 0; kp < 3; ++kp)
            for (int am = 0; am < 5; ++am) {
                if ((kp + am) % 2 == 1 && Hkv == 8) continue;  // G = 1 gets half of them
                LayerCase c{.name = "masks", .E = 64, .H = 8, .Hkv = Hkv, .d = 32, .B = 2, .Lq = 37, .Lk = 65};
                c.self = am % 2 == 0;
                c.key_padding = kp, c.attn_mask = am;
                c.causal = kp == 2;
                SCOPED_TRACE(::testing::Message() << "Hkv " << Hkv << " key_padding " << kp << " attn_mask " << am);
                check_layer(c);
            }
}

// need_weights (averaged and per_head) with GQA: the materialized path, whatever impl asks (fused falls back).
// Outputs against the scalar backend; the weights of both backends against the double probabilities and
// each other, per element (the probability bound of core_double, relative to p: tight).
TEST(SimdDecoder, NeedWeightsWithGqa) {
    const LayerCase lc{.name = "weights", .E = 64, .H = 8, .Hkv = 2, .d = 32, .B = 2, .Lq = 33, .Lk = 65,
                       .rope = rope(mha::RopeStyle::half), .position_offset = 7, .causal = true,
                       .alignment = mha::CausalAlignment::bottom_right, .key_padding = 1, .attn_mask = 4};
    const Layer L(lc);
    const mha::MultiheadAttention m = L.make();
    const LayerExpected ex = layer_double(L);
    for (auto need : {mha::NeedWeights::averaged, mha::NeedWeights::per_head}) {
        SCOPED_TRACE(need == mha::NeedWeights::averaged ? "averaged" : "per_head");
        const std::vector<double>& want = need == mha::NeedWeights::averaged ? ex.averaged : ex.probs;
        const std::vector<double>& err = need == mha::NeedWeights::averaged ? ex.averaged_err : ex.probs_err;
        double worst = 0.0;
        for (std::size_t n = 0; n < want.size(); ++n)
            if (want[n] > 0.0) worst = std::max(worst, 2 * mha_test::kDecoderSafety * err[n] / want[n]);
        ASSERT_LT(worst, 2e-3) << "probability bound too loose to catch a 2e-3 relative error";
        const Layer::Result scalar = L.run(m, mha::Backend::scalar, mha::Impl::automatic, need);
        ASSERT_TRUE(mha_test::all_within(scalar.weights, want, times(err, mha_test::kDecoderSafety))) << "scalar weights";
        ASSERT_TRUE(mha_test::all_within(scalar.output, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "scalar output";
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls) {
                SCOPED_TRACE(impl_name(impl));
                const Layer::Result simd = L.run(m, mha::Backend::simd, impl, need);
                ASSERT_TRUE(mha_test::all_within(simd.weights, as_double(scalar.weights), mha_test::backend_difference_bound(err)))
                    << "SIMD weights against scalar";
                ASSERT_TRUE(mha_test::all_within(simd.output, as_double(scalar.output), mha_test::backend_difference_bound(ex.out_err)))
                    << "SIMD output against scalar";
            }
        });
    }
}

// Results do not depend on the thread count: every task's size depends on the shape only (the grouped
// path's tasks are (batch, KV head, block of 128 / G query rows), the materialized path's (batch, head, 64
// rows) or (batch, 64 rows) with averaged weights). threads 1, 2 and 3 (TBB's limit lifted to 3 so the
// arena really has 3 slots on a 2-core machine) give bitwise equal outputs and weights, on every ISA.
TEST(SimdDecoder, BitwiseEqualAcrossThreadCounts) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 3);
    const LayerCase grouped{.name = "grouped", .E = 64, .H = 8, .Hkv = 2, .d = 32, .B = 2, .Lq = 200, .Lk = 300,
                            .rope = rope(mha::RopeStyle::half), .causal = true, .key_padding = 1};
    const LayerCase self{.name = "self", .E = 96, .H = 4, .Hkv = 1, .d = 80, .B = 1, .Lq = 257, .self = true,
                         .causal = true, .alignment = mha::CausalAlignment::bottom_right, .attn_mask = 3};
    for (const LayerCase* lc : {&grouped, &self}) {
        SCOPED_TRACE(lc->name);
        const Layer L(*lc);
        const mha::MultiheadAttention m = L.make();
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls)
                for (auto need : {mha::NeedWeights::none, mha::NeedWeights::averaged}) {
                    if (need != mha::NeedWeights::none && impl != mha::Impl::materialized) continue;
                    SCOPED_TRACE(::testing::Message() << impl_name(impl) << (need == mha::NeedWeights::none ? "" : " averaged"));
                    const Layer::Result one = L.run(m, mha::Backend::simd, impl, need, 1);
                    for (int threads : {2, 3}) EXPECT_TRUE(L.run(m, mha::Backend::simd, impl, need, threads) == one) << threads << " threads";
                }
        });
    }
}

// The decoder layer in a caller's Workspace of exactly workspace_bytes() (the grouped path's packed K/V
// panels, the RoPE tables, the separate projections of kdim / vdim): the same bits as without one; one
// byte less is refused before anything is written. And an output whose rows are padded: the padding stays
// untouched and the values are the contiguous output's.
TEST(SimdDecoder, WorkspaceAndPaddedOutput) {
    const LayerCase cases[] = {kCases[2], kCases[3], kCases[6]};
    for (const LayerCase& lc : cases) {
        SCOPED_TRACE(lc.name);
        const Layer L(lc);
        const mha::MultiheadAttention m = L.make();
        const std::size_t n = L.c.B * L.c.Lq * L.c.E;
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls)
                for (auto need : {mha::NeedWeights::none, mha::NeedWeights::averaged}) {
                    SCOPED_TRACE(::testing::Message() << impl_name(impl) << (need == mha::NeedWeights::none ? "" : " averaged"));
                    const Layer::Result want = L.run(m, mha::Backend::simd, impl, need);
                    const mha::ForwardOptions o = L.options(mha::Backend::simd, impl, need, 0);
                    const std::size_t bytes = m.workspace_bytes(L.inputs(), o);
                    Layer::Result got{std::vector<float>(n, kPadding), std::vector<float>(want.weights.size(), kPadding)};
                    const mha::AttentionOutputs out{mha::Batch(got.output.data(), L.c.B, L.c.Lq, L.c.E),
                                                    got.weights.empty() ? nullptr : got.weights.data()};
                    {
                        mha::Workspace ws(bytes);
                        m.forward(L.inputs(), out, o, ws);
                        EXPECT_TRUE(got == want) << "exactly workspace_bytes() = " << bytes;
                    }
                    std::fill(got.output.begin(), got.output.end(), kPadding);
                    std::fill(got.weights.begin(), got.weights.end(), kPadding);
                    {
                        mha::Workspace ws(bytes - 1);
                        try {
                            m.forward(L.inputs(), out, o, ws);
                            ADD_FAILURE() << "a workspace one byte short was taken";
                        } catch (const mha::invalid_argument& e) {
                            EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
                        }
                        for (float x : got.output) ASSERT_EQ(x, kPadding) << "output written before the error";
                        for (float x : got.weights) ASSERT_EQ(x, kPadding) << "weights written before the error";
                    }
                    // Rows of E + 5 floats, batches 3 floats apart more: only the E values of each row are written.
                    const std::size_t rs = L.c.E + 5, bs = L.c.Lq * rs + 3;
                    std::vector<float> padded(L.c.B * bs, kPadding);
                    m.forward(L.inputs(),
                              {mha::Batch(padded.data(), L.c.B, L.c.Lq, L.c.E, rs, bs), got.weights.empty() ? nullptr : got.weights.data()}, o);
                    for (std::size_t b = 0; b < L.c.B; ++b)
                        for (std::size_t i = 0; i < L.c.Lq; ++i)
                            for (std::size_t e = 0; e < rs; ++e) {
                                const float x = padded[b * bs + i * rs + e];
                                if (e < L.c.E) ASSERT_EQ(x, want.output[(b * L.c.Lq + i) * L.c.E + e]) << b << " " << i << " " << e;
                                else ASSERT_EQ(x, kPadding) << "padding written at " << b << " " << i << " " << e;
                            }
                    for (std::size_t b = 0; b < L.c.B; ++b)
                        for (std::size_t t = L.c.Lq * rs; t < bs; ++t) ASSERT_EQ(padded[b * bs + t], kPadding);
                }
        });
    }
}

// key.data == nullptr means key = query, value.data == nullptr means value = key: omitting them gives the
// bits of passing them (a GQA layer, on every impl).
TEST(SimdDecoder, OmittedKeyOrValue) {
    LayerCase lc{.name = "omitted", .E = 64, .H = 8, .Hkv = 2, .d = 32, .kdim = 48, .vdim = 48, .B = 2, .Lq = 9, .Lk = 70,
                 .rope = rope(mha::RopeStyle::interleaved), .causal = true, .alignment = mha::CausalAlignment::bottom_right};
    const Layer L(lc);  // kdim = vdim = 48: value = key is possible
    const mha::MultiheadAttention m = L.make();
    lc.kdim = lc.vdim = 0;
    const Layer Lself(lc);  // kdim = vdim = E: key = query is possible
    const mha::MultiheadAttention mself = Lself.make();
    for (mha::Impl impl : kImpls) {
        SCOPED_TRACE(impl_name(impl));
        const mha::ForwardOptions o = L.options(mha::Backend::simd, impl, mha::NeedWeights::none, 0);
        std::vector<float> a(L.c.B * L.c.Lq * L.c.E), b(a.size());
        mha::AttentionInputs in = L.inputs();
        in.value = in.key;
        m.forward(in, {mha::Batch(a.data(), L.c.B, L.c.Lq, L.c.E)}, o);
        in.value = {};
        m.forward(in, {mha::Batch(b.data(), L.c.B, L.c.Lq, L.c.E)}, o);
        EXPECT_EQ(a, b) << "value omitted";
        // key omitted (= query, Lk = Lq), value given.
        mha::AttentionInputs s = Lself.inputs();
        const std::vector<float> v = uniform(Lself.c.B * Lself.c.Lq * Lself.c.E, 1.0f, 99);
        s.key = s.query;
        s.value = mha::ConstBatch(v.data(), Lself.c.B, Lself.c.Lq, Lself.c.E);
        mself.forward(s, {mha::Batch(a.data(), L.c.B, L.c.Lq, L.c.E)}, o);
        s.key = {};
        mself.forward(s, {mha::Batch(b.data(), L.c.B, L.c.Lq, L.c.E)}, o);
        EXPECT_EQ(a, b) << "key omitted";
    }
}

// ---------------------------------------------------------------------------------------------------
// K and V rows read (mha::detail::kv_rows_read, counted by the core as it packs or multiplies them).

struct SdpaCall {
    std::size_t B, H, Hkv, Lq, Lk, d;
    std::vector<float> q, k, v, out;
    SdpaCall(std::size_t b, std::size_t h, std::size_t hkv, std::size_t lq, std::size_t lk, std::size_t dd)
        : B(b), H(h), Hkv(hkv), Lq(lq), Lk(lk), d(dd), q(uniform(b * h * lq * dd, 1.0f, 1)), k(uniform(b * hkv * lk * dd, 1.0f, 2)),
          v(uniform(b * hkv * lk * dd, 1.0f, 3)), out(b * h * lq * dd) {}
    // The rows the call read.
    std::uint64_t rows_read(mha::Impl impl) {
        mha::SdpaInputs in;
        in.query = mha::ConstHeads::bhld(q.data(), B, H, Lq, d);
        in.key = mha::ConstHeads::bhld(k.data(), B, Hkv, Lk, d);
        in.value = mha::ConstHeads::bhld(v.data(), B, Hkv, Lk, d);
        mha::SdpaOptions o;
        o.impl = impl;
        const std::uint64_t before = mha::detail::kv_rows_read();
        mha::scaled_dot_product_attention(in, mha::Heads::bhld(out.data(), B, H, Lq, d), o);
        return mha::detail::kv_rows_read() - before;
    }
};

// The grouped path (fused, or automatic with G > 1) reads every K and V row once per group: 2·B·Hkv·Lk,
// whatever G and however many query tasks the group has (Lq = 100 with G = 4: four tasks of 32 stacked
// query rows each, all on one packed copy). K repeated per query head would read 2·B·H·Lk and fail.
// The materialized path is the per-head path: each (batch, query head, block of up to 64 query rows)
// multiplies its KV head's rows, so with Lq <= 64 it reads 2·B·H·Lk.
TEST(SimdDecoder, GroupedPathReadsKeysAndValuesOncePerGroup) {
    mha_test::for_each_cpu_isa([](mha::Isa) {
        SdpaCall call(2, 8, 2, 100, 300, 64);
        const std::uint64_t per_group = 2 * call.B * call.Hkv * call.Lk;  // 2400
        EXPECT_EQ(call.rows_read(mha::Impl::fused), per_group);
        EXPECT_EQ(call.rows_read(mha::Impl::automatic), per_group);
        SdpaCall mqa(2, 8, 1, 1, 300, 32);  // a decode step with one KV head
        EXPECT_EQ(mqa.rows_read(mha::Impl::automatic), 2u * 2 * 1 * 300);
        SdpaCall short_q(2, 8, 2, 33, 300, 64);
        EXPECT_EQ(short_q.rows_read(mha::Impl::fused), per_group);
        EXPECT_EQ(short_q.rows_read(mha::Impl::materialized), 2u * short_q.B * short_q.H * short_q.Lk);  // 9600: per head
    });
}

// The same through the layer: a GQA layer's forward (automatic: grouped) reads its projected K and V once
// per group.
TEST(SimdDecoder, GroupedLayerReadsKeysAndValuesOncePerGroup) {
    const Layer L(LayerCase{.name = "count", .E = 64, .H = 8, .Hkv = 2, .d = 32, .B = 2, .Lq = 40, .Lk = 300});
    const mha::MultiheadAttention m = L.make();
    const std::uint64_t before = mha::detail::kv_rows_read();
    (void)L.run(m, mha::Backend::simd, mha::Impl::automatic);
    EXPECT_EQ(mha::detail::kv_rows_read() - before, 2u * 2 * 2 * 300);
}

}  // namespace

namespace {

// The tolerance is not vacuous: for each kind of mistake this sweep is meant to catch, the SIMD output of
// the right configuration is compared (with check_layer's |simd − scalar| tolerance) against the double
// evaluation of a wrong one, and must be refused. (Shifting every position by one is no mistake: RoPE
// scores depend on the query's position minus the key's only, so offsets and positions[B] show only in the
// rounding of large angles.)
TEST(SimdDecoder, ToleranceCatchesWrongConfigurations) {
    const LayerCase base{.name = "base", .E = 200, .H = 8, .Hkv = 2, .d = 80, .B = 2, .Lq = 16, .Lk = 257,
                         .rope = rope(mha::RopeStyle::half, 40), .position_offset = kFar, .causal = true,
                         .alignment = mha::CausalAlignment::bottom_right, .key_padding = 1};
    const Layer L(base);
    const LayerExpected right = layer_double(L);
    const std::vector<double> tol = mha_test::backend_difference_bound(right.out_err);
    const Layer::Result simd = L.run(L.make(), mha::Backend::simd, mha::Impl::automatic);
    ASSERT_TRUE(mha_test::all_within(simd.output, right.out, tol));
    auto expect_caught = [&](const char* what, const Layer& wrong, std::size_t k_shift = 0) {
        EXPECT_FALSE(mha_test::all_within(simd.output, layer_double(wrong, k_shift).out, tol)) << what << " went unnoticed";
    };
    expect_caught("K rotated one position past Q", L, 1);
    // Bottom-right: queries at start + Lk − Lq + i. Rotating them at start + i instead is K Lk − Lq past Q.
    expect_caught("query positions not following the bottom-right alignment", L, base.Lk - base.Lq);
    {
        Layer w = L;
        w.c.rope->style = mha::RopeStyle::interleaved;
        expect_caught("RoPE style", w);
    }
    {
        Layer w = L;
        w.c.rope->dims = 80;
        expect_caught("RoPE dims", w);
    }
    {
        Layer w = L;
        w.c.rope->theta = 500000.0f;
        expect_caught("RoPE theta 500000 instead of 10000", w);
    }
    {
        Layer w = L;  // query heads of group 0 reading KV head 1 and the other way round: K and V rows swapped
        const auto swap_heads = [&](std::vector<float>& x, std::size_t n) {
            std::swap_ranges(x.begin(), x.begin() + std::ptrdiff_t(n), x.begin() + std::ptrdiff_t(n));
        };
        swap_heads(w.wk, w.c.d * w.kdim), swap_heads(w.bk, w.c.d), swap_heads(w.wv, w.c.d * w.vdim), swap_heads(w.bv, w.c.d);
        expect_caught("KV heads swapped", w);
    }
    {
        Layer w = L;
        w.c.alignment = mha::CausalAlignment::top_left;
        expect_caught("causal alignment", w);
    }
    {
        Layer w = L;
        w.bq.clear();
        expect_caught("q bias dropped", w);
    }
    {
        Layer w = L;
        w.bv.clear();
        expect_caught("v bias dropped", w);
    }
    {
        Layer w = L;
        w.bo.clear();
        expect_caught("out bias dropped", w);
    }
    {
        Layer w = L;  // the last key (a tail: 257 = 256 + 1) of batch 0 flipped
        w.key_padding_mask.bools[256] = !w.key_padding_mask.bools[256];
        expect_caught("last key of the tail", w);
    }
    {
        Layer w = L;  // one key in the middle of the first tile of batch 1
        w.key_padding_mask.bools[257 + 100] = !w.key_padding_mask.bools[257 + 100];
        expect_caught("one key", w);
    }
}

}  // namespace
