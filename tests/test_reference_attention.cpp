// The scalar reference attention (MultiheadAttention::forward with Backend::scalar) against
// hand-computed cases, a seed-003-style per-head loop, and the independent double-precision
// implementation in attention_test_util.hpp, whose tolerances are derived there (first-order
// float error bound, times 2). Every mask kind, cross-attention, both weight layouts, fully masked
// rows, the post-norm block, and strided inputs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <mha/mha.hpp>
#include "attention_test_util.hpp"

namespace {

using mha::Backend;
using mha::NeedWeights;
using mha_test::attention_double;
using mha_test::expect_within;
using mha_test::Problem;

// The identity [E, E] (row-major), stacked `copies` times.
std::vector<float> identity(std::size_t E, std::size_t copies = 1) {
    std::vector<float> w(copies * E * E, 0.0f);
    for (std::size_t c = 0; c < copies; ++c)
        for (std::size_t i = 0; i < E; ++i) w[c * E * E + i * E + i] = 1.0f;
    return w;
}

// Runs `p` with every weights layout and checks output and weights against attention_double.
void check_against_double(const Problem& p) {
    const auto ex = attention_double(p);
    // The bound must stay far below the values, or the comparison would prove nothing. It is a
    // worst-case bound (measured errors are about 1/300 of it), around 1e-4 of the largest output here.
    EXPECT_LT(mha_test::relative_tolerance(ex.output, ex.output_tol), 1e-3);
    const mha::MultiheadAttention m(p.weights(), p.E, p.H);
    const auto none = mha_test::run(m, p, Backend::scalar, NeedWeights::none);
    expect_within(none.output, ex.output, ex.output_tol, "output");
    const auto avg = mha_test::run(m, p, Backend::scalar, NeedWeights::averaged);
    expect_within(avg.output, ex.output, ex.output_tol, "output (averaged weights requested)");
    expect_within(avg.weights, ex.averaged, ex.averaged_tol, "averaged weights");
    const auto per_head = mha_test::run(m, p, Backend::scalar, NeedWeights::per_head);
    expect_within(per_head.output, ex.output, ex.output_tol, "output (per-head weights requested)");
    expect_within(per_head.weights, ex.probs, ex.probs_tol, "per-head weights");
    // Asking for weights does not change the output.
    EXPECT_EQ(none.output, avg.output);
    EXPECT_EQ(none.output, per_head.output);
}

// ---------------------------------------------------------------------------------------------
// Hand-checkable cases

TEST(ReferenceAttention, TinyIdentityIsSoftmaxOfQKtTimesV) {
    // E = 2, H = 1, identity weights, zero biases: Q = K = V = x, output = softmax(x·xᵀ/√2)·x.
    // x = [[1, 0], [0, 1], [1, 1]]; with a = e^(1/√2), b = e^(√2):
    //   row 0 scores [1, 0, 1]/√2 → weights [a, 1, a]/(2a + 1) → output [2a, 1 + a]/(2a + 1)
    //   row 1 scores [0, 1, 1]/√2 → weights [1, a, a]/(2a + 1) → output [1 + a, 2a]/(2a + 1)
    //   row 2 scores [1, 1, 2]/√2 → weights [a, a, b]/(2a + b) → output [a + b, a + b]/(2a + b)
    Problem p;
    p.E = 2, p.H = 1, p.B = 1, p.Lq = p.Lk = 3;
    p.in_w = identity(2, 3), p.in_b.assign(6, 0.0f), p.out_w = identity(2), p.out_b.assign(2, 0.0f);
    p.query = {1, 0, 0, 1, 1, 1};
    const double a = std::exp(1.0 / std::sqrt(2.0)), b = std::exp(std::sqrt(2.0));
    const std::vector<double> out = {2 * a / (2 * a + 1), (1 + a) / (2 * a + 1), (1 + a) / (2 * a + 1),
                                     2 * a / (2 * a + 1), (a + b) / (2 * a + b), (a + b) / (2 * a + b)};
    const std::vector<double> w = {a / (2 * a + 1), 1 / (2 * a + 1), a / (2 * a + 1), 1 / (2 * a + 1), a / (2 * a + 1),
                                   a / (2 * a + 1), a / (2 * a + b), a / (2 * a + b), b / (2 * a + b)};
    const auto ex = attention_double(p);  // only its tolerances are used here
    const auto got = mha_test::run(p, Backend::scalar, NeedWeights::per_head);
    expect_within(got.output, out, ex.output_tol, "output");
    expect_within(got.weights, w, ex.probs_tol, "weights");
}

// Seed 003's example: batch 1, length 6, E = 8, 2 heads (d = 4). Identity projections, zero in-proj
// bias, output bias 1..8. Tokens are one-hot ×2: head 0 (features 0..3) sees two groups
// {0, 1, 2} (feature 0) and {3, 4, 5} (feature 1); head 1 (features 4..7) sees three pairs
// {0, 1} (feature 4), {2, 3} (feature 5), {4, 5} (feature 6). A same-group score is 2·2/√4 = 2,
// any other 0, so with a = e²:
//   head 0: weight a/(3a + 3) within the group, 1/(3a + 3) outside; context 2·(3·weight) per feature
//   head 1: weight a/(2a + 4) within the pair, 1/(2a + 4) outside; context 2·(2·weight) per feature
// If the heads were mixed up (wrong column slices), the groups would not match these numbers.
TEST(ReferenceAttention, Seed003HandCheckable) {
    Problem p;
    p.E = 8, p.H = 2, p.B = 1, p.Lq = p.Lk = 6;
    p.in_w = identity(8, 3), p.in_b.assign(24, 0.0f), p.out_w = identity(8);
    p.out_b = {1, 2, 3, 4, 5, 6, 7, 8};
    p.query.assign(6 * 8, 0.0f);
    for (std::size_t t = 0; t < 6; ++t) {
        p.query[t * 8 + (t < 3 ? 0 : 1)] = 2.0f;  // head 0 group
        p.query[t * 8 + 4 + t / 2] = 2.0f;         // head 1 pair
    }
    const double a = std::exp(2.0);
    const double g_in = a / (3 * a + 3), g_out = 1 / (3 * a + 3);  // head 0
    const double p_in = a / (2 * a + 4), p_out = 1 / (2 * a + 4);  // head 1
    std::vector<double> out(6 * 8), weights(2 * 6 * 6);
    for (std::size_t t = 0; t < 6; ++t) {
        const std::size_t group = t < 3 ? 0 : 1, pair = t / 2;
        for (std::size_t f = 0; f < 2; ++f) out[t * 8 + f] = 2 * 3 * (f == group ? g_in : g_out);
        for (std::size_t f = 0; f < 3; ++f) out[t * 8 + 4 + f] = 2 * 2 * (f == pair ? p_in : p_out);
        for (std::size_t f = 0; f < 8; ++f) out[t * 8 + f] += p.out_b[f];
        for (std::size_t j = 0; j < 6; ++j) {
            weights[t * 6 + j] = (j < 3) == (t < 3) ? g_in : g_out;
            weights[36 + t * 6 + j] = j / 2 == pair ? p_in : p_out;
        }
    }
    // With a ≈ 7.389 (weights 0.2936 / 0.0397 and 0.3935 / 0.0533), token 0's output is
    // ≈ [6·0.2936 + 1, 6·0.0397 + 2, 3, 4, 4·0.3935 + 5, 4·0.0533 + 6, 4·0.0533 + 7, 8]
    //  = [2.7616, 2.2384, 3, 4, 6.5740, 6.2130, 7.2130, 8].
    const double token0[] = {2.7616, 2.2384, 3, 4, 6.5740, 6.2130, 7.2130, 8};
    for (std::size_t f = 0; f < 8; ++f) EXPECT_NEAR(out[f], token0[f], 1e-4);
    const auto ex = attention_double(p);
    const auto got = mha_test::run(p, Backend::scalar, NeedWeights::per_head);
    expect_within(got.output, out, ex.output_tol, "output");
    expect_within(got.weights, weights, ex.probs_tol, "weights");
}

// Seed 003's MyMutilHeadSelfAttention in double: per sequence Q = wq(x), K = wk(x), V = wv(x); for
// h in range(0, E, step): softmax(Q[:, h:h+step]·K[:, h:h+step]ᵀ / sqrt(step))·V[:, h:h+step];
// concat along features; wz(z).
std::vector<double> seed003_multihead(const Problem& p) {
    const std::size_t E = p.E, L = p.Lq, step = E / p.H;
    std::vector<double> out;
    for (std::size_t b = 0; b < p.B; ++b) {
        const float* x = p.query.data() + b * L * E;
        auto linear = [&](const float* w, const float* bias, const std::vector<double>& in) {
            std::vector<double> y(L * E);
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t o = 0; o < E; ++o) {
                    double s = bias[o];
                    for (std::size_t k = 0; k < E; ++k) s += in[i * E + k] * w[o * E + k];
                    y[i * E + o] = s;
                }
            return y;
        };
        const std::vector<double> xd(x, x + L * E);
        const auto Q = linear(p.in_w.data(), p.in_b.data(), xd);
        const auto K = linear(p.in_w.data() + E * E, p.in_b.data() + E, xd);
        const auto V = linear(p.in_w.data() + 2 * E * E, p.in_b.data() + 2 * E, xd);
        std::vector<std::vector<double>> z_per_head;
        for (std::size_t h = 0; h < E; h += step) {
            std::vector<double> scores(L * L), z(L * step, 0.0);
            for (std::size_t i = 0; i < L; ++i) {
                double mx = -INFINITY, sum = 0.0;
                for (std::size_t j = 0; j < L; ++j) {
                    double s = 0.0;
                    for (std::size_t t = 0; t < step; ++t) s += Q[i * E + h + t] * K[j * E + h + t];
                    scores[i * L + j] = s / std::sqrt(double(step));
                    mx = std::max(mx, scores[i * L + j]);
                }
                for (std::size_t j = 0; j < L; ++j) sum += (scores[i * L + j] = std::exp(scores[i * L + j] - mx));
                for (std::size_t j = 0; j < L; ++j)
                    for (std::size_t t = 0; t < step; ++t) z[i * step + t] += scores[i * L + j] / sum * V[j * E + h + t];
            }
            z_per_head.push_back(z);
        }
        std::vector<double> concat(L * E);
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t hh = 0; hh < p.H; ++hh)
                for (std::size_t t = 0; t < step; ++t) concat[i * E + hh * step + t] = z_per_head[hh][i * step + t];
        const auto re = linear(p.out_w.data(), p.out_b.data(), concat);
        out.insert(out.end(), re.begin(), re.end());
    }
    return out;
}

TEST(ReferenceAttention, StridedHeadSlicesEqualSeed003PerHeadLoop) {
    for (const auto& [E, H, B] : {std::tuple{8u, 2u, 1u}, std::tuple{12u, 3u, 2u}, std::tuple{16u, 4u, 2u}}) {
        SCOPED_TRACE(testing::Message() << "E=" << E << " H=" << H << " B=" << B);
        const Problem p = mha_test::random_problem(E, H, B, 6, 6, false, 31 + E);
        const auto expected = seed003_multihead(p);
        const auto ex = attention_double(p);
        for (std::size_t i = 0; i < expected.size(); ++i)
            ASSERT_NEAR(expected[i], ex.output[i], 1e-12) << "the two double implementations disagree at " << i;
        const auto got = mha_test::run(p, Backend::scalar, NeedWeights::none);
        expect_within(got.output, expected, ex.output_tol, "output");
    }
}

// ---------------------------------------------------------------------------------------------
// Masks, cross-attention, weights, post-norm: against the double implementation

TEST(ReferenceAttention, NoMask) { check_against_double(mha_test::random_problem(16, 4, 2, 7, 7, false, 100)); }

TEST(ReferenceAttention, KeyPaddingMaskBool) {
    Problem p = mha_test::random_problem(16, 4, 3, 9, 9, false, 110);
    p.key_padding_mask = mha_test::random_bool_mask({3, 9}, 0.3, 111);
    check_against_double(p);
}

TEST(ReferenceAttention, KeyPaddingMaskFloat) {
    Problem p = mha_test::random_problem(16, 2, 2, 8, 8, false, 120);
    p.key_padding_mask = mha_test::random_float_mask({2, 8}, 0.2, 121);
    check_against_double(p);
}

TEST(ReferenceAttention, AttnMaskBool2D) {
    Problem p = mha_test::random_problem(12, 3, 2, 8, 8, false, 130);
    p.attn_mask = mha_test::random_bool_mask({8, 8}, 0.3, 131);
    check_against_double(p);
}

TEST(ReferenceAttention, AttnMaskFloat2D) {
    Problem p = mha_test::random_problem(12, 3, 2, 8, 8, false, 140);
    p.attn_mask = mha_test::random_float_mask({8, 8}, 0.2, 141);
    check_against_double(p);
}

TEST(ReferenceAttention, AttnMaskBool3D) {
    Problem p = mha_test::random_problem(16, 4, 2, 7, 7, false, 150);
    p.attn_mask = mha_test::random_bool_mask({8, 7, 7}, 0.3, 151);
    check_against_double(p);
}

TEST(ReferenceAttention, AttnMaskFloat3D) {
    Problem p = mha_test::random_problem(16, 4, 2, 7, 7, false, 160);
    p.attn_mask = mha_test::random_float_mask({8, 7, 7}, 0.2, 161);
    check_against_double(p);
}

TEST(ReferenceAttention, Causal) {
    Problem p = mha_test::random_problem(16, 2, 2, 10, 10, false, 170);
    p.causal = true;
    check_against_double(p);
    // Causal means zero weight above the diagonal, exactly.
    const auto got = mha_test::run(p, Backend::scalar, NeedWeights::per_head);
    for (std::size_t bh = 0; bh < 4; ++bh)
        for (std::size_t i = 0; i < 10; ++i)
            for (std::size_t j = i + 1; j < 10; ++j) ASSERT_EQ(got.weights[(bh * 10 + i) * 10 + j], 0.0f);
}

TEST(ReferenceAttention, CombinedMasksAndCausal) {
    Problem p = mha_test::random_problem(16, 4, 2, 9, 9, false, 180);
    p.key_padding_mask = mha_test::random_bool_mask({2, 9}, 0.2, 181);
    p.attn_mask = mha_test::random_float_mask({8, 9, 9}, 0.1, 182);
    p.causal = true;
    check_against_double(p);
    p.key_padding_mask = mha_test::random_float_mask({2, 9}, 0.2, 183);
    p.attn_mask = mha_test::random_bool_mask({9, 9}, 0.2, 184);
    check_against_double(p);
}

TEST(ReferenceAttention, CrossAttention) {
    // Lq != Lk, distinct key and value, with and without masks (Lq > Lk and Lq < Lk).
    for (const auto& [Lq, Lk] : {std::pair{5u, 11u}, std::pair{12u, 4u}}) {
        SCOPED_TRACE(testing::Message() << "Lq=" << Lq << " Lk=" << Lk);
        Problem p = mha_test::random_problem(24, 3, 2, Lq, Lk, true, 190 + Lq);
        check_against_double(p);
        p.key_padding_mask = mha_test::random_bool_mask({2, Lk}, 0.2, 191);
        p.attn_mask = mha_test::random_float_mask({Lq, Lk}, 0.1, 192);
        p.causal = true;
        check_against_double(p);
        p.attn_mask = mha_test::random_bool_mask({6, Lq, Lk}, 0.2, 193);
        p.causal = false;
        check_against_double(p);
    }
}

TEST(ReferenceAttention, AveragedWeightsAreTheMeanOfPerHead) {
    const Problem p = mha_test::random_problem(16, 4, 2, 6, 6, false, 200);
    const auto avg = mha_test::run(p, Backend::scalar, NeedWeights::averaged);
    const auto per_head = mha_test::run(p, Backend::scalar, NeedWeights::per_head);
    ASSERT_EQ(avg.weights.size(), 2u * 6 * 6);
    ASSERT_EQ(per_head.weights.size(), 2u * 4 * 6 * 6);
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t ij = 0; ij < 36; ++ij) {
            double mean = 0.0;
            for (std::size_t h = 0; h < 4; ++h) mean += per_head.weights[(b * 4 + h) * 36 + ij] / 4.0;
            // 4 divisions by 4 are exact; 3 float additions: ≤ 3u·mean.
            EXPECT_LE(std::abs(avg.weights[b * 36 + ij] - mean), 3 * mha_test::kU * mean);
        }
    // Each row of weights sums to 1 (Lk rounded probabilities: within (Lk + 6)·u, here generously 2×).
    for (std::size_t r = 0; r < 2 * 4 * 6; ++r) {
        double sum = 0.0;
        for (std::size_t j = 0; j < 6; ++j) sum += per_head.weights[r * 6 + j];
        EXPECT_NEAR(sum, 1.0, 2 * 12 * mha_test::kU);
    }
}

TEST(ReferenceAttention, WeightsBufferWrittenExactlyInItsShape) {
    // A sentinel past the end stays; need_weights none leaves the buffer alone.
    const Problem p = mha_test::random_problem(8, 2, 2, 3, 3, false, 210);
    const mha::MultiheadAttention m(p.weights(), 8, 2);
    for (NeedWeights nw : {NeedWeights::none, NeedWeights::averaged, NeedWeights::per_head}) {
        const std::size_t n = nw == NeedWeights::per_head ? 2 * 2 * 9 : nw == NeedWeights::averaged ? 2 * 9 : 0;
        std::vector<float> weights(2 * 2 * 9 + 4, -7.0f), out(2 * 3 * 8);
        mha::ForwardOptions opt;
        opt.backend = Backend::scalar;
        opt.need_weights = nw;
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(p.query.data(), 2, 3, 8);
        m.forward(in, {mha::Batch(out.data(), 2, 3, 8), weights.data()}, opt);
        for (std::size_t i = 0; i < weights.size(); ++i) {
            if (i < n)
                ASSERT_TRUE(weights[i] >= 0.0f && weights[i] <= 1.0f) << i;
            else
                ASSERT_EQ(weights[i], -7.0f) << i;
        }
    }
}

TEST(ReferenceAttention, FullyMaskedRowsGiveZeroWeightsAndTheOutputBias) {
    // Batch 1: every key padded. Batch 0: query row 2 masked everywhere by attn_mask.
    Problem p = mha_test::random_problem(12, 3, 2, 5, 5, false, 220);
    p.key_padding_mask = mha_test::random_bool_mask({2, 5}, 0.0, 221);
    for (std::size_t j = 0; j < 5; ++j) p.key_padding_mask.bools[5 + j] = 1;
    p.attn_mask = mha_test::random_bool_mask({5, 5}, 0.0, 222);
    for (std::size_t j = 0; j < 5; ++j) p.attn_mask.bools[2 * 5 + j] = 1;
    check_against_double(p);
    for (NeedWeights nw : {NeedWeights::averaged, NeedWeights::per_head}) {
        const auto got = mha_test::run(p, Backend::scalar, nw);
        for (float v : got.output) ASSERT_FALSE(std::isnan(v));
        // Fully masked rows: (b = 1, every i) and (b = 0 and 1, i = 2). Output row == out_proj bias, bitwise.
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t i = 0; i < 5; ++i) {
                if (b == 0 && i != 2) continue;
                for (std::size_t e = 0; e < 12; ++e)
                    ASSERT_EQ(std::bit_cast<std::uint32_t>(got.output[(b * 5 + i) * 12 + e]),
                              std::bit_cast<std::uint32_t>(p.out_b[e]))
                        << "b=" << b << " i=" << i << " e=" << e;
                const std::size_t heads = nw == NeedWeights::per_head ? 3 : 1;
                for (std::size_t h = 0; h < heads; ++h)
                    for (std::size_t j = 0; j < 5; ++j) ASSERT_EQ(got.weights[((b * heads + h) * 5 + i) * 5 + j], 0.0f);
            }
    }
}

TEST(ReferenceAttention, PostNormBlock) {
    // LayerNorm(out + query) with eps inside the sqrt, with gamma/beta and without (ones/zeros).
    for (float eps : {1e-12f, 1e-5f})
        for (bool with_weights : {false, true}) {
            SCOPED_TRACE(testing::Message() << "eps=" << eps << " norm weights=" << with_weights);
            Problem p = mha_test::random_problem(16, 4, 2, 6, 6, false, 230);
            p.norm_eps = eps;
            if (with_weights) {
                p.norm_w = mha_test::random_floats(16, 0.5f, 1.5f, 231);
                p.norm_b = mha_test::random_floats(16, -0.5f, 0.5f, 232);
            }
            check_against_double(p);
            // Without norm weights each row has mean 0 and variance var/(var + eps): 1 within 1e-5 for eps = 1e-12.
            if (!with_weights && eps < 1e-6f) {
                const auto got = mha_test::run(p, Backend::scalar, NeedWeights::none);
                for (std::size_t r = 0; r < 12; ++r) {
                    double mean = 0.0, var = 0.0;
                    for (std::size_t e = 0; e < 16; ++e) mean += got.output[r * 16 + e] / 16.0;
                    for (std::size_t e = 0; e < 16; ++e) var += std::pow(got.output[r * 16 + e] - mean, 2) / 16.0;
                    EXPECT_NEAR(mean, 0.0, 1e-6);
                    EXPECT_NEAR(var, 1.0, 1e-5);
                }
            }
        }
    // Cross-attention with the post-norm block and masks.
    Problem p = mha_test::random_problem(16, 2, 2, 4, 7, true, 240);
    p.norm_eps = 1e-6f;
    p.norm_w = mha_test::random_floats(16, 0.5f, 1.5f, 241);
    p.key_padding_mask = mha_test::random_bool_mask({2, 7}, 0.3, 242);
    check_against_double(p);
}

// ---------------------------------------------------------------------------------------------
// Strided inputs

TEST(ReferenceAttention, StridedInputsEqualContiguousBitwise) {
    const std::size_t E = 12, H = 3, B = 2, Lq = 5, Lk = 7;
    for (bool cross : {false, true}) {
        SCOPED_TRACE(cross ? "cross" : "self");
        Problem p = mha_test::random_problem(E, H, B, Lq, Lk, cross, 250);
        p.key_padding_mask = mha_test::random_bool_mask({B, p.Lk}, 0.2, 251);
        p.norm_eps = 1e-5f;
        const mha::MultiheadAttention m(p.weights(), E, H);
        const auto contiguous = mha_test::run(m, p, Backend::scalar, NeedWeights::per_head);

        // Copy each input into rows of stride E + 3 and batches of stride rows·(E + 3) + 5; NaN padding.
        const std::size_t rs = E + 3;
        auto spread = [&](const std::vector<float>& src, std::size_t rows) {
            std::vector<float> dst(B * (rows * rs + 5), NAN);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < rows; ++i)
                    for (std::size_t e = 0; e < E; ++e) dst[b * (rows * rs + 5) + i * rs + e] = src[(b * rows + i) * E + e];
            return dst;
        };
        const auto q = spread(p.query, Lq);
        const auto k = cross ? spread(p.key, p.Lk) : std::vector<float>();
        const auto v = cross ? spread(p.value, p.Lk) : std::vector<float>();
        const float kSentinel = std::bit_cast<float>(std::uint32_t{0x7fc0dead});
        std::vector<float> out(B * (Lq * rs + 5), kSentinel), weights(contiguous.weights.size());
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(q.data(), B, Lq, E, rs, Lq * rs + 5);
        if (cross) {
            in.key = mha::ConstBatch(k.data(), B, p.Lk, E, rs, p.Lk * rs + 5);
            in.value = mha::ConstBatch(v.data(), B, p.Lk, E, rs, p.Lk * rs + 5);
        }
        in.key_padding_mask = p.key_padding_mask.view();
        mha::ForwardOptions opt;
        opt.backend = Backend::scalar;
        opt.need_weights = NeedWeights::per_head;
        opt.norm_eps = p.norm_eps;
        m.forward(in, {mha::Batch(out.data(), B, Lq, E, rs, Lq * rs + 5), weights.data()}, opt);

        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t e = 0; e < rs; ++e) {
                    const float got = out[b * (Lq * rs + 5) + i * rs + e];
                    if (e < E)
                        ASSERT_EQ(std::bit_cast<std::uint32_t>(got),
                                  std::bit_cast<std::uint32_t>(contiguous.output[(b * Lq + i) * E + e]));
                    else
                        ASSERT_EQ(std::bit_cast<std::uint32_t>(got), 0x7fc0deadu) << "padding written";
                }
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t e = 0; e < 5; ++e) ASSERT_EQ(std::bit_cast<std::uint32_t>(out[b * (Lq * rs + 5) + Lq * rs + e]), 0x7fc0deadu);
        EXPECT_EQ(weights, contiguous.weights);
    }
}

TEST(ReferenceAttention, ExplicitKeyValueEqualSelfAttention) {
    // key = value = query passed explicitly gives the same bits as null key/value.
    const Problem p = mha_test::random_problem(8, 2, 2, 4, 4, false, 260);
    const auto self = mha_test::run(p, Backend::scalar, NeedWeights::none);
    Problem explicit_kv = p;
    explicit_kv.key = p.query, explicit_kv.value = p.query;
    const auto got = mha_test::run(explicit_kv, Backend::scalar, NeedWeights::none);
    EXPECT_EQ(self.output, got.output);
}

}  // namespace
