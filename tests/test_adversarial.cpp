// Adversarial numbers and shapes at the public API (MultiheadAttention::forward), each run with
// Backend::simd and Backend::scalar and with Impl::materialized and Impl::fused (the scalar backend
// always materializes, so Impl only changes the SIMD path):
//   |x| up to 1e4 in query and key (softmax must subtract the row max), NaN confinement, -inf additive
//   masks, Lk = 1, d = 1 (E = H), H = E = 256, and B·H far above the thread count.
// Unless a test derives its own bound, expected values and tolerances come from
// tests/attention_test_util.hpp: a double-precision attention that propagates a first-order error
// bound of the float computation (its header gives the formulas; tolerance = 2 × bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <mha/mha.hpp>

#include "../fuzz/attention_oracle.hpp"  // attention_test_util.hpp and the float-layernorm bound
#include "attention_test_util.hpp"

namespace {

using mha::Backend;
using mha::Impl;
using mha::NeedWeights;
using mha_test::kU;
using mha_test::Problem;
using mha_test::Result;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Config {
    Backend backend;
    Impl impl;
};
constexpr Config kConfigs[] = {{Backend::simd, Impl::materialized},
                               {Backend::simd, Impl::fused},
                               {Backend::scalar, Impl::materialized},
                               {Backend::scalar, Impl::fused}};

std::string describe(Config c) {
    return std::string(c.backend == Backend::simd ? "simd" : "scalar") + "/" +
           (c.impl == Impl::fused ? "fused" : "materialized");
}

// forward on contiguous buffers; key/value passed only when the problem has its own.
Result run(const mha::MultiheadAttention& attention, const Problem& p, Config c, NeedWeights need = NeedWeights::none,
           int threads = 0) {
    Result r;
    r.output.assign(p.B * p.Lq * p.E, NAN);
    const std::size_t heads = need == NeedWeights::per_head ? p.H : 1;
    if (need != NeedWeights::none) r.weights.assign(p.B * heads * p.Lq * p.Lk, NAN);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(p.query.data(), p.B, p.Lq, p.E);
    if (!p.key.empty()) in.key = mha::ConstBatch(p.key.data(), p.B, p.Lk, p.E);
    if (!p.value.empty()) in.value = mha::ConstBatch(p.value.data(), p.B, p.Lk, p.E);
    in.key_padding_mask = p.key_padding_mask.view();
    in.attn_mask = p.attn_mask.view();
    mha::ForwardOptions opt;
    opt.backend = c.backend;
    opt.impl = c.impl;
    opt.causal = p.causal;
    opt.need_weights = need;
    opt.norm_eps = p.norm_eps;
    opt.threads = threads;
    attention.forward(in, {mha::Batch(r.output.data(), p.B, p.Lq, p.E), r.weights.empty() ? nullptr : r.weights.data()},
                      opt);
    return r;
}

// Runs every config (with per-head weights on the materialized ones, which is where weights exist)
// against the double oracle; the bound must stay below `max_relative` of the largest output.
void expect_all_configs_match_double(const Problem& p, double max_relative = 1e-3) {
    const mha_test::Expected ex = mha_test::attention_double(p);
    ASSERT_LT(mha_test::relative_tolerance(ex.output, ex.output_tol), max_relative) << "bound too loose to mean anything";
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const Config c : kConfigs) {
        SCOPED_TRACE(describe(c));
        const NeedWeights need = c.impl == Impl::materialized ? NeedWeights::per_head : NeedWeights::none;
        const Result r = run(attention, p, c, need);
        mha_test::expect_within(r.output, ex.output, ex.output_tol, "output");
        if (need == NeedWeights::per_head) mha_test::expect_within(r.weights, ex.probs, ex.probs_tol, "per-head weights");
        const Result avg = run(attention, p, c, NeedWeights::averaged);
        mha_test::expect_within(avg.weights, ex.averaged, ex.averaged_tol, "averaged weights");
    }
}

using mha_test::same_bits;

// ---------------------------------------------------------------------------------------------
// |x| up to 1e4 in query and key.

// Weights are identities (Wq = Wk = Wv = Wo = I, zero biases) and query/key entries are multiples of
// 256 with |x| ≤ 39·256 = 9984, so everything before the softmax is exact in float:
//   projections x·I + 0 are exact; a score is Σ over d = 16 products k1·k2·2^16 (|k1·k2| ≤ 1521), i.e.
//   an integer multiple of 2^16 below 2^31 whose 2^-16-scaled value fits in 24 bits, times 1/√16 = 1/4.
// Scores are then ~1e9; without subtracting the max, exp overflows to inf and the output is NaN.
// Distinct scores differ by at least 2^16/4 = 16384, so exp(z − max) is exactly 0 (float underflow)
// except for the keys tied at the max, where it is exp(0) (xsimd exp: ≤ 2 ulp from 1).
// Expected: p_j = 1/t for the t tied keys, output = context = mean of their value rows.
// Bound: e_j ∈ 1 ± 2u, the sum of t such terms 1 ± (t + 2)u relative, p_j = e_j/sum one or two more
// roundings: |p_j − 1/t| ≤ (t + 6)u/t; the context's Lk-term sum of p·v adds ≤ Lk·u·max|v| (the zero
// terms are exact), the identity output projection is exact. Tolerance: 2 × (t + 6 + Lk)·u·max|v|.
TEST(Adversarial, ScoresNear1e9SaturateToTheExactArgmax) {
    constexpr std::size_t H = 2, d = 16, E = H * d, B = 2, Lq = 6;
    for (const std::size_t Lk : {std::size_t{7}, std::size_t{300}}) {  // 300: two key tiles on the fused path
        for (const bool causal : {false, true}) {
            SCOPED_TRACE("Lk " + std::to_string(Lk) + (causal ? " causal" : ""));
            Problem p;
            p.E = E, p.H = H, p.B = B, p.Lq = Lq, p.Lk = Lk, p.causal = causal;
            p.in_w.assign(3 * E * E, 0.0f);
            for (std::size_t r = 0; r < 3 * E; ++r) p.in_w[r * E + r % E] = 1.0f;
            p.in_b.assign(3 * E, 0.0f);
            p.out_w.assign(E * E, 0.0f);
            for (std::size_t r = 0; r < E; ++r) p.out_w[r * E + r] = 1.0f;
            p.out_b.assign(E, 0.0f);
            std::mt19937 gen(unsigned(Lk * 2 + causal));
            std::uniform_int_distribution<int> k(-39, 39);
            p.query.resize(B * Lq * E);
            p.key.resize(B * Lk * E);
            for (float& x : p.query) x = 256.0f * float(k(gen));
            for (float& x : p.key) x = 256.0f * float(k(gen));
            p.value = mha_test::random_floats(B * Lk * E, -1.0f, 1.0f, 99);

            std::vector<double> expected(B * Lq * E), tol(B * Lq * E), probs(B * H * Lq * Lk, 0.0), probs_tol(B * H * Lq * Lk);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t i = 0; i < Lq; ++i) {
                        std::vector<double> s(Lk, -INFINITY);
                        for (std::size_t j = 0; j < Lk && !(causal && j > i); ++j) {
                            s[j] = 0.0;
                            for (std::size_t t = h * d; t < h * d + d; ++t)
                                s[j] += double(p.query[(b * Lq + i) * E + t]) * p.key[(b * Lk + j) * E + t];
                            s[j] /= 4.0;
                        }
                        const double top = *std::max_element(s.begin(), s.end());
                        ASSERT_GT(top, -1e300);
                        std::vector<std::size_t> ties;
                        for (std::size_t j = 0; j < Lk; ++j)
                            if (s[j] == top) ties.push_back(j);
                        const double t = double(ties.size());
                        for (std::size_t j : ties) probs[((b * H + h) * Lq + i) * Lk + j] = 1.0 / t;
                        for (std::size_t j = 0; j < Lk; ++j) probs_tol[((b * H + h) * Lq + i) * Lk + j] = 2 * (t + 6) * kU / t;
                        for (std::size_t c = h * d; c < h * d + d; ++c) {
                            double sum = 0.0, vmax = 0.0;
                            for (std::size_t j : ties) {
                                sum += p.value[(b * Lk + j) * E + c];
                                vmax = std::max(vmax, std::abs(double(p.value[(b * Lk + j) * E + c])));
                            }
                            expected[(b * Lq + i) * E + c] = sum / t;
                            tol[(b * Lq + i) * E + c] = 2 * (t + 6 + double(Lk)) * kU * vmax;
                        }
                    }

            const mha::MultiheadAttention attention(p.weights(), E, H);
            for (const Config c : kConfigs) {
                SCOPED_TRACE(describe(c));
                const NeedWeights need = c.impl == Impl::materialized ? NeedWeights::per_head : NeedWeights::none;
                const Result r = run(attention, p, c, need);
                mha_test::expect_within(r.output, expected, tol, "output");
                if (need == NeedWeights::per_head) mha_test::expect_within(r.weights, probs, probs_tol, "weights");
            }
        }
    }
}

// General weights with query and key uniform in [-1e4, 1e4]: scores reach ~1e6 and their float error
// (~u·Σ|q||k|) is of order 1, so the softmax is ill-conditioned and the oracle's bound on those rows
// is loose (it may exceed the value); what this test pins down is that nothing overflows: every output
// is finite and within the bound, and every probability row is a distribution: entries in [0, 1]
// summing to 1 within 2·(Lk + 2)·u (Lk − 1 roundings in the float sum, one or two in each division,
// times c = 2). The post-norm variant feeds the 1e4 residual into the layernorm.
TEST(Adversarial, InputsUpTo1e4StayFinite) {
    for (const bool norm : {false, true}) {
        SCOPED_TRACE(norm ? "post-norm" : "no norm");
        Problem p = mha_test::random_problem(64, 4, 2, 20, 300, true, 11);
        for (float& x : p.query) x *= 1e4f;
        for (float& x : p.key) x *= 1e4f;
        if (norm) p.norm_eps = 1e-5f;
        mha_test::Expected ex = mha_test::attention_double(p);
        if (norm) add_float_layernorm_bound(p, ex);  // the SIMD layernorm rounds in float
        const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c));
            const NeedWeights need = c.impl == Impl::materialized ? NeedWeights::per_head : NeedWeights::none;
            const Result r = run(attention, p, c, need);
            for (std::size_t i = 0; i < r.output.size(); ++i) ASSERT_TRUE(std::isfinite(r.output[i])) << "output[" << i << "]";
            mha_test::expect_within(r.output, ex.output, ex.output_tol, "output");
            for (std::size_t row = 0; row < r.weights.size() / p.Lk; ++row) {
                double sum = 0.0;
                for (std::size_t j = 0; j < p.Lk; ++j) {
                    const float w = r.weights[row * p.Lk + j];
                    ASSERT_TRUE(w >= 0.0f && w <= 1.0f) << "weight row " << row << " key " << j << " = " << w;
                    sum += w;
                }
                ASSERT_NEAR(sum, 1.0, 2 * double(p.Lk + 2) * kU) << "weight row " << row;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NaN confinement. (A masked key never contributes, even with a NaN key or value row: that rule has its
// own test, tests/test_nan_values.cpp. These tests use no masks.) What is provable is what a row does
// not read at all:
//   - query row (b, i) feeds only Q row i → scores row i → output row i (cross-attention: K and V do
//     not come from the query), so every other output row must be bitwise what it is without the NaN;
//   - a key or value row of batch b feeds only batch b, so the other batches must be bitwise unchanged;
//   - in self-attention a query row is also a key and value row, so again only its batch.
// Bitwise, because each unaffected row is computed from bitwise identical operands by the same
// operations in the same order (blocking depends on the shape only, never on values or threads).

void expect_rows_unchanged(const Result& clean, const Result& dirty, const Problem& p, std::size_t skip_b,
                           std::size_t skip_i /* Lq: the whole batch */) {
    for (std::size_t b = 0; b < p.B; ++b)
        for (std::size_t i = 0; i < p.Lq; ++i) {
            if (b == skip_b && (skip_i == p.Lq || i == skip_i)) continue;
            const std::size_t at = (b * p.Lq + i) * p.E;
            ASSERT_TRUE(same_bits(&clean.output[at], &dirty.output[at], p.E)) << "row b=" << b << " i=" << i << " changed";
        }
}

TEST(Adversarial, NaNInAQueryRowStaysInItsOutputRow) {
    Problem p = mha_test::random_problem(16, 2, 2, 70, 9, true, 21);  // Lq = 70 spans two 64-row query blocks
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const bool causal : {false, true}) {
        p.causal = causal;
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c) + (causal ? " causal" : ""));
            const Result clean = run(attention, p, c);
            Problem dirty = p;
            const std::size_t b = 1, i = 5;
            dirty.query[(b * p.Lq + i) * p.E + 3] = NAN;
            const Result r = run(attention, dirty, c);
            expect_rows_unchanged(clean, r, p, b, i);
        }
    }
}

TEST(Adversarial, NaNInAKeyOrValueRowStaysInItsBatch) {
    Problem p = mha_test::random_problem(16, 2, 3, 6, 300, true, 31);  // Lk = 300: two fused key tiles
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const bool in_value : {false, true}) {
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c) + (in_value ? " NaN in value" : " NaN in key"));
            const Result clean = run(attention, p, c);
            Problem dirty = p;
            (in_value ? dirty.value : dirty.key)[(1 * p.Lk + 260) * p.E + 7] = NAN;  // batch 1, key 260
            const Result r = run(attention, dirty, c);
            expect_rows_unchanged(clean, r, p, 1, p.Lq);
            // Batch 1 itself: the projection spreads the NaN over the whole K/V row 260; every query
            // attends key 260 (no mask) alongside finite scores, so every row's sum (or context) is NaN.
            for (std::size_t i = 0; i < p.Lq * p.E; ++i) ASSERT_TRUE(std::isnan(r.output[1 * p.Lq * p.E + i])) << i;
        }
    }
}

TEST(Adversarial, NaNInSelfAttentionStaysInItsBatch) {
    Problem p = mha_test::random_problem(16, 4, 3, 12, 12, false, 41);
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const bool causal : {false, true}) {
        p.causal = causal;
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c) + (causal ? " causal" : ""));
            const Result clean = run(attention, p, c);
            Problem dirty = p;
            dirty.query[(2 * p.Lq + 4) * p.E + 0] = NAN;  // batch 2, token 4
            const Result r = run(attention, dirty, c);
            expect_rows_unchanged(clean, r, p, 2, p.Lq);
        }
    }
}

// When every score of a query row is NaN (a NaN or an inf anywhere in that query row makes its whole
// Q row NaN), the row must not pass for a fully masked one (zero probabilities, output = bias): like
// PyTorch, every element of that output row is NaN, and only there.
TEST(Adversarial, NaNOrInfQueryRowGivesNaNOutputRow) {
    Problem p = mha_test::random_problem(16, 2, 2, 8, 9, true, 22);
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const float bad : {NAN, kInf}) {
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c) + (std::isnan(bad) ? " NaN" : " inf"));
            Problem dirty = p;
            dirty.query[(1 * p.Lq + 3) * p.E + 5] = bad;
            const Result r = run(attention, dirty, c);
            for (std::size_t e = 0; e < p.E; ++e) ASSERT_TRUE(std::isnan(r.output[(1 * p.Lq + 3) * p.E + e])) << "column " << e;
        }
    }
}

// +inf or NaN in an additive mask is not rejected (checking would cost a pass over the mask): the rows
// it is added to become NaN (z = +inf makes exp(z − max) = exp(inf − inf) = NaN; a NaN z makes the sum
// NaN), and no other row changes. A 2-D attn_mask element (i, j) feeds row i of every batch and head; a
// key_padding_mask element (b, j) feeds every row of batch b whose attn_mask does not mask key j.
TEST(Adversarial, PlusInfOrNaNInAdditiveMaskPoisonsOnlyItsRows) {
    Problem p = mha_test::random_problem(16, 2, 2, 5, 300, true, 23);  // Lk = 300: two fused key tiles
    p.attn_mask = mha_test::random_float_mask({5, 300}, 0.1, 24);
    p.key_padding_mask = mha_test::random_float_mask({2, 300}, 0.0, 25);
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const float bad : {kInf, NAN}) {
        for (const Config c : kConfigs) {
            SCOPED_TRACE(describe(c) + (std::isnan(bad) ? " NaN" : " +inf"));
            const Result clean = run(attention, p, c);
            Problem dirty = p;
            dirty.attn_mask.values[2 * 300 + 270] = bad;  // query row 2, key 270
            Result r = run(attention, dirty, c);
            for (std::size_t b = 0; b < p.B; ++b)
                for (std::size_t i = 0; i < p.Lq; ++i) {
                    const std::size_t at = (b * p.Lq + i) * p.E;
                    if (i != 2) {
                        ASSERT_TRUE(same_bits(&clean.output[at], &r.output[at], p.E)) << "b=" << b << " i=" << i;
                        continue;
                    }
                    for (std::size_t e = 0; e < p.E; ++e) ASSERT_TRUE(std::isnan(r.output[at + e])) << "b=" << b << " e=" << e;
                }
            dirty = p;
            dirty.key_padding_mask.values[1 * 300 + 5] = bad;  // batch 1, key 5
            r = run(attention, dirty, c);
            expect_rows_unchanged(clean, r, p, 1, p.Lq);
            // Batch 1: NaN in every row, except rows whose attn_mask already masks key 5 (-inf): a masked
            // key never contributes, so those rows are bitwise what they were.
            for (std::size_t i = 0; i < p.Lq; ++i) {
                const std::size_t at = (1 * p.Lq + i) * p.E;
                if (p.attn_mask.values[i * 300 + 5] == -kInf) {
                    ASSERT_TRUE(same_bits(&clean.output[at], &r.output[at], p.E)) << "masked row " << i;
                    continue;
                }
                for (std::size_t e = 0; e < p.E; ++e) ASSERT_TRUE(std::isnan(r.output[at + e])) << "row " << i << " e " << e;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// -inf in additive masks: partly masked rows, rows masked entirely by the key padding (every query
// of batch 1) or by the attention mask, and whole fused key tiles of padding. A fully masked row has
// zero probabilities, so its context is exactly 0 and its output exactly the output bias (0·w sums
// are exact zeros, then + bias): checked bitwise, and its weights exactly 0.
TEST(Adversarial, MinusInfAdditiveMasks) {
    for (const std::size_t Lk : {std::size_t{9}, std::size_t{600}}) {
        for (const bool causal : {false, true}) {
            SCOPED_TRACE("Lk " + std::to_string(Lk) + (causal ? " causal" : ""));
            constexpr std::size_t E = 16, H = 2, B = 2, Lq = 5;
            Problem p = mha_test::random_problem(E, H, B, Lq, Lk, true, 51);
            p.causal = causal;
            p.key_padding_mask = mha_test::random_float_mask({B, Lk}, 0.3, 52);
            for (std::size_t j = 0; j < Lk; ++j) p.key_padding_mask.values[1 * Lk + j] = -kInf;  // batch 1: all keys
            p.key_padding_mask.values[Lk - 1] = 0.0f;  // batch 0 keeps its last key
            if (Lk > 512) {
                // Keys [0, 512) of batch 0: two whole fused tiles of padding, which the fused path skips
                // (with causal, every row of batch 0 is then fully masked too).
                for (std::size_t j = 0; j < 512; ++j) p.key_padding_mask.values[j] = -kInf;
            } else {
                p.key_padding_mask.values[0] = 0.0f;  // and its first, so causal rows keep a key
            }
            p.attn_mask = mha_test::random_float_mask({B * H, Lq, Lk}, 0.4, 53);
            for (std::size_t j = 0; j < Lk; ++j) p.attn_mask.values[((0 * H + 1) * Lq + 2) * Lk + j] = -kInf;  // (b0, h1, i2)
            expect_all_configs_match_double(p);

            const mha::MultiheadAttention attention(p.weights(), E, H);
            for (const Config c : kConfigs) {
                SCOPED_TRACE(describe(c));
                const Result r = run(attention, p, c, NeedWeights::averaged);
                for (std::size_t i = 0; i < Lq; ++i) {
                    ASSERT_TRUE(same_bits(&r.output[(1 * Lq + i) * E], p.out_b.data(), E)) << "batch 1 row " << i;
                    for (std::size_t j = 0; j < Lk; ++j) ASSERT_EQ(r.weights[(1 * Lq + i) * Lk + j], 0.0f);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Degenerate and extreme shapes.

// One key: every unmasked probability is exactly 1 (exp(0)/exp(0)), and masking it leaves the bias.
TEST(Adversarial, SingleKey) {
    Problem cross = mha_test::random_problem(8, 2, 3, 5, 1, true, 61);
    expect_all_configs_match_double(cross);
    Problem self = mha_test::random_problem(8, 2, 3, 1, 1, false, 62);
    self.causal = true;
    expect_all_configs_match_double(self);
    cross.key_padding_mask = mha_test::random_bool_mask({3, 1}, 0.0, 63);
    cross.key_padding_mask.bools[1] = 1;  // batch 1's only key
    expect_all_configs_match_double(cross);
}

// d = 1 (E = H): the scale is 1, each score one product.
TEST(Adversarial, HeadDimOne) {
    expect_all_configs_match_double(mha_test::random_problem(6, 6, 2, 9, 9, false, 71));
    Problem p = mha_test::random_problem(5, 5, 2, 4, 70, true, 72);
    p.causal = true;
    p.attn_mask = mha_test::random_bool_mask({2 * 5, 4, 70}, 0.3, 73);
    expect_all_configs_match_double(p);
}

// H = E = 256: many heads, each one column wide. The bound of an output (a 256-term projection)
// grows like E·u·Σ|c||w| while the outputs, sums of E terms of random sign, grow like √E: the
// bound/value ratio is about 6e-3 here, still far below the O(1) error of a wrong head.
TEST(Adversarial, TwoHundredFiftySixHeads) {
    Problem p = mha_test::random_problem(256, 256, 2, 10, 10, false, 81);
    p.key_padding_mask = mha_test::random_bool_mask({2, 10}, 0.3, 82);
    expect_all_configs_match_double(p, 1e-2);
}

// B·H = 512 tasks per step on 1, 2 or all threads: the results match the oracle, and the SIMD
// backend's are bitwise the same for every thread count (work is cut by shape, not by threads).
TEST(Adversarial, ManyMoreTasksThanThreads) {
    Problem p = mha_test::random_problem(128, 64, 8, 12, 12, false, 91);
    p.causal = true;
    expect_all_configs_match_double(p);
    const mha::MultiheadAttention attention(p.weights(), p.E, p.H);
    for (const Config c : kConfigs) {
        if (c.backend != Backend::simd) continue;
        SCOPED_TRACE(describe(c));
        const Result one = run(attention, p, c, NeedWeights::none, 1);
        for (const int threads : {2, 3, 64, 0}) {  // 64: more than TBB can run here (clamped)
            const Result r = run(attention, p, c, NeedWeights::none, threads);
            EXPECT_TRUE(same_bits(one.output.data(), r.output.data(), one.output.size())) << threads << " threads";
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels on buffers sized exactly for the call.

// C = op(A)·B with op(A) = Aᵀ (A is packed) and K just past one k-block (768), so the k-blocks are of
// unequal length (769 = 384 + 385). Each call runs in a new thread: the GEMM's per-thread pack buffers
// then start empty and are sized for this call alone, so under ASan a write past them is reported
// (it was: lib/simd/gemm_impl.hpp sized the A buffer for the first, shorter k-block). Expected values
// from double; |Δ| ≤ 2·K·u·Σ|a||b| (a K-long dot product, c = 2).
TEST(Adversarial, GemmTransposedAWithUnequalKBlocksInAFreshThread) {
    for (const std::size_t K : {std::size_t{769}, std::size_t{801}, std::size_t{1537}}) {
        for (const std::size_t M : {std::size_t{1}, std::size_t{7}}) {
            constexpr std::size_t N = 16;
            const std::vector<float> a = mha_test::random_floats(K * M, -1.0f, 1.0f, unsigned(K + M));  // stored [K, M]
            const std::vector<float> b = mha_test::random_floats(K * N, -1.0f, 1.0f, unsigned(K + M + 1));
            for (const Backend backend : {Backend::simd, Backend::scalar}) {
                SCOPED_TRACE("K " + std::to_string(K) + " M " + std::to_string(M) + (backend == Backend::simd ? " simd" : " scalar"));
                std::vector<float> c(M * N, NAN);
                std::thread([&] {
                    mha::gemm(1.0f, mha::ConstMatrix(a.data(), K, M), mha::Trans::yes, mha::ConstMatrix(b.data(), K, N),
                              mha::Trans::no, 0.0f, mha::Matrix(c.data(), M, N), backend);
                }).join();
                for (std::size_t i = 0; i < M; ++i)
                    for (std::size_t j = 0; j < N; ++j) {
                        double exact = 0.0, mag = 0.0;
                        for (std::size_t k = 0; k < K; ++k) {
                            exact += double(a[k * M + i]) * b[k * N + j];
                            mag += std::abs(double(a[k * M + i]) * b[k * N + j]);
                        }
                        ASSERT_LE(std::abs(c[i * N + j] - exact), 2 * double(K) * kU * mag) << "C(" << i << ", " << j << ")";
                    }
            }
        }
    }
}

}  // namespace
