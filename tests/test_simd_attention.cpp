// The SIMD attention backend against the scalar reference over many shapes, every mask kind,
// causal, need_weights and the post-norm block; bitwise identity across thread counts; concurrent
// calls on one object.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include <mha/mha.hpp>

namespace {

struct Case {
    std::size_t B, Lq, Lk, E, H;
    bool cross = false;
    bool causal = false;
    bool kp_bool = false, kp_float = false;
    int am_rank = 0;  // 0: none, 2 or 3
    bool am_bool = false;
    mha::NeedWeights need = mha::NeedWeights::none;
    bool norm = false;
    mha::Impl impl = mha::Impl::automatic;
};

std::vector<float> random_vector(std::size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

struct Problem {
    Case c;
    std::vector<float> w_in, b_in, w_out, b_out, gamma, beta, q, k, v, kp_f, am_f;
    std::vector<std::uint8_t> kp_b, am_b;
    mha::AttentionInputs in;

    explicit Problem(const Case& cs, unsigned seed = 1) : c(cs) {
        std::mt19937 rng(seed);
        const float w = 1.0f / std::sqrt(static_cast<float>(c.E));
        w_in = random_vector(3 * c.E * c.E, -w, w, rng);
        b_in = random_vector(3 * c.E, -0.1f, 0.1f, rng);
        w_out = random_vector(c.E * c.E, -w, w, rng);
        b_out = random_vector(c.E, -0.1f, 0.1f, rng);
        gamma = random_vector(c.E, 0.5f, 1.5f, rng);
        beta = random_vector(c.E, -0.5f, 0.5f, rng);
        q = random_vector(c.B * c.Lq * c.E, -1, 1, rng);
        in.query = mha::ConstBatch(q.data(), c.B, c.Lq, c.E);
        if (c.cross) {
            k = random_vector(c.B * c.Lk * c.E, -1, 1, rng);
            v = random_vector(c.B * c.Lk * c.E, -1, 1, rng);
            in.key = mha::ConstBatch(k.data(), c.B, c.Lk, c.E);
            in.value = mha::ConstBatch(v.data(), c.B, c.Lk, c.E);
        }
        std::bernoulli_distribution coin(0.3);
        if (c.kp_bool) {
            kp_b.resize(c.B * c.Lk);
            for (auto& x : kp_b) x = coin(rng);
            in.key_padding_mask = mha::MaskView::boolean(kp_b.data(), c.B, c.Lk);
        } else if (c.kp_float) {
            kp_f = random_vector(c.B * c.Lk, -2, 2, rng);
            for (auto& x : kp_f) if (coin(rng)) x = -std::numeric_limits<float>::infinity();
            in.key_padding_mask = mha::MaskView::additive(kp_f.data(), c.B, c.Lk);
        }
        if (c.am_rank) {
            const std::size_t n = (c.am_rank == 3 ? c.B * c.H : 1) * c.Lq * c.Lk;
            if (c.am_bool) {
                am_b.resize(n);
                for (auto& x : am_b) x = coin(rng);
                in.attn_mask = c.am_rank == 3 ? mha::MaskView::boolean(am_b.data(), c.B * c.H, c.Lq, c.Lk)
                                              : mha::MaskView::boolean(am_b.data(), c.Lq, c.Lk);
            } else {
                am_f = random_vector(n, -3, 3, rng);
                in.attn_mask = c.am_rank == 3 ? mha::MaskView::additive(am_f.data(), c.B * c.H, c.Lq, c.Lk)
                                              : mha::MaskView::additive(am_f.data(), c.Lq, c.Lk);
            }
        }
    }

    mha::MultiheadAttention make() const {
        mha::AttentionWeights wt{w_in.data(), b_in.data(), w_out.data(), b_out.data(),
                                 c.norm ? gamma.data() : nullptr, c.norm ? beta.data() : nullptr};
        return mha::MultiheadAttention(wt, c.E, c.H);
    }

    std::size_t weights_size() const {
        if (c.need == mha::NeedWeights::averaged) return c.B * c.Lq * c.Lk;
        if (c.need == mha::NeedWeights::per_head) return c.B * c.H * c.Lq * c.Lk;
        return 0;
    }

    // Runs one backend; returns output followed by the weights.
    std::vector<float> run(const mha::MultiheadAttention& m, mha::Backend backend, int threads = 0) const {
        std::vector<float> out(c.B * c.Lq * c.E, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> wts(weights_size(), std::numeric_limits<float>::quiet_NaN());
        mha::ForwardOptions o;
        o.backend = backend;
        o.causal = c.causal;
        o.need_weights = c.need;
        o.threads = threads;
        o.impl = c.impl;
        if (c.norm) o.norm_eps = 1e-5f;
        m.forward(in, {mha::Batch(out.data(), c.B, c.Lq, c.E), wts.empty() ? nullptr : wts.data()}, o);
        out.insert(out.end(), wts.begin(), wts.end());
        return out;
    }
};

// Both backends compute in float with different summation orders. Each output passes through two
// projections (length-E dot products) and one P·V sum (length Lk, weights summing to 1): the float
// error is bounded by about (2E + Lk)·eps times the magnitudes involved (inputs, weights ≤ 1, so
// values stay O(1)); c = 4 covers the softmax's exp error and the layernorm rescale.
void expect_close(const Case& c, const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    float max_ref = 1.0f;
    for (float x : want) max_ref = std::max(max_ref, std::abs(x));
    const float tol = 4.0f * static_cast<float>(2 * c.E + c.Lk) * std::numeric_limits<float>::epsilon() * max_ref *
                      (c.norm ? 8.0f : 1.0f);
    for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "at " << i;
        ASSERT_NEAR(got[i], want[i], tol) << "at " << i << " of " << got.size();
    }
}

void check(const Case& c) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " Lq=" << c.Lq << " Lk=" << c.Lk << " E=" << c.E << " H=" << c.H
                                      << " cross=" << c.cross << " causal=" << c.causal << " am=" << c.am_rank);
    Problem p(c);
    auto m = p.make();
    expect_close(c, p.run(m, mha::Backend::simd), p.run(m, mha::Backend::scalar));
}

TEST(SimdAttention, ShapesAndHeadDims) {
    for (std::size_t d : {1, 8, 16, 64, 80})
        for (std::size_t H : {1, 2, 3})
            for (std::size_t L : {1, 7, 65, 130}) check({L % 3 + 1, L, L, d * H, H});
}

TEST(SimdAttention, HeadsFromOneToE) {
    for (std::size_t H : {1, 2, 4, 8, 16, 32}) check({2, 33, 33, 32, H});
}

TEST(SimdAttention, CrossAttention) {
    for (auto [lq, lk] : {std::pair<std::size_t, std::size_t>{1, 9}, {17, 5}, {70, 130}, {130, 64}}) {
        Case c{2, lq, lk, 48, 3};
        c.cross = true;
        check(c);
    }
}

TEST(SimdAttention, EveryMaskKind) {
    for (int kp = 0; kp < 3; ++kp)
        for (int am = 0; am < 5; ++am)
            for (bool causal : {false, true}) {
                Case c{3, 67, 67, 32, 4};
                c.kp_bool = kp == 1;
                c.kp_float = kp == 2;
                c.am_rank = am == 0 ? 0 : (am <= 2 ? 2 : 3);
                c.am_bool = am % 2 == 1;
                c.causal = causal;
                check(c);
                c.cross = true;
                c.Lk = 41;
                check(c);
            }
}

TEST(SimdAttention, NeedWeightsAndPostNorm) {
    for (auto need : {mha::NeedWeights::averaged, mha::NeedWeights::per_head})
        for (bool causal : {false, true})
            for (bool norm : {false, true}) {
                Case c{2, 70, 70, 64, 4};
                c.need = need;
                c.causal = causal;
                c.norm = norm;
                c.kp_bool = true;
                check(c);
            }
}

TEST(SimdAttention, FullyMaskedRowGivesBias) {
    Case c{1, 5, 5, 16, 2};
    Problem p(c);
    std::vector<std::uint8_t> mask(5, 1);
    p.in.key_padding_mask = mha::MaskView::boolean(mask.data(), 1, 5);
    auto m = p.make();
    const auto out = p.run(m, mha::Backend::simd);
    for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t j = 0; j < 16; ++j) EXPECT_EQ(out[i * 16 + j], p.b_out[j]);
}

TEST(SimdAttention, BitwiseIdenticalAcrossThreadCounts) {
    for (auto need : {mha::NeedWeights::none, mha::NeedWeights::averaged}) {
        Case c{3, 130, 130, 64, 8};
        c.need = need;
        c.kp_bool = true;
        c.causal = true;
        Problem p(c);
        auto m = p.make();
        const auto one = p.run(m, mha::Backend::simd, 1);
        for (int t : {2, 3, 8}) EXPECT_EQ(one, p.run(m, mha::Backend::simd, t)) << t << " threads";
    }
}

TEST(SimdAttention, ConcurrentCallsOnOneObject) {
    Case c{2, 40, 40, 32, 4};
    c.causal = true;
    Problem p(c);
    const auto m = p.make();
    const auto want = p.run(m, mha::Backend::simd, 1);
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int rep = 0; rep < 5; ++rep) got[t] = p.run(m, mha::Backend::simd, 1 + t % 2);
        });
    for (auto& t : threads) t.join();
    for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(SimdAttention, StridedInputsMatchContiguous) {
    Case c{2, 9, 9, 16, 2};
    Problem p(c);
    auto m = p.make();
    const auto want = p.run(m, mha::Backend::simd);
    // The same query with row stride 21 and batch stride 9·21 + 5, padding full of NaN.
    std::vector<float> padded(2 * (9 * 21 + 5), std::numeric_limits<float>::quiet_NaN());
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 9; ++i)
            for (std::size_t j = 0; j < 16; ++j) padded[b * (9 * 21 + 5) + i * 21 + j] = p.q[(b * 9 + i) * 16 + j];
    p.in.query = mha::ConstBatch(padded.data(), 2, 9, 16, 21, 9 * 21 + 5);
    EXPECT_EQ(p.run(m, mha::Backend::simd), want);
}

}  // namespace

namespace {

// Runs f once per ISA this CPU has (mha::set_isa_cap), restoring the cap afterwards: the fused path packs
// K and V into the ISA's GEMM panels (32, 16 or 8 columns wide), so each ISA has its own layout.
template <class F>
void for_each_isa(F f) {
    for (mha::Isa isa : {mha::Isa::sse2, mha::Isa::avx2, mha::Isa::avx512}) {
        if (isa > mha::detected_isa()) continue;
        mha::set_isa_cap(isa);
        SCOPED_TRACE(mha::isa_name(isa));
        f();
    }
    mha::set_isa_cap(mha::Isa::avx512);
}

// The fused path (online softmax over key tiles of 256) against the reference on every ISA: lengths
// around the tile, every mask kind, causal, cross-attention.
TEST(FusedAttention, LengthsAroundTheTile) {
    for_each_isa([] {
        for (std::size_t L : {1, 2, 255, 256, 257, 513}) {
            Case c{1, L, L, 32, 2};
            c.impl = mha::Impl::fused;
            c.causal = L % 2 == 1;
            check(c);
        }
    });
}

// Head dims that are not a multiple of any panel width (d = 24, 40) and one wider than two AVX-512
// panels (d = 80).
TEST(FusedAttention, HeadDimsAcrossPanels) {
    for_each_isa([] {
        for (std::size_t E : {48, 80, 160}) {
            Case c{2, 300, 300, E, 2};
            c.impl = mha::Impl::fused;
            check(c);
        }
    });
}

TEST(FusedAttention, EveryMaskKindAndCross) {
    for_each_isa([] {
        for (int kp = 0; kp < 3; ++kp)
            for (int am = 0; am < 5; ++am)
                for (bool causal : {false, true}) {
                    Case c{2, 70, 300, 32, 4};
                    c.impl = mha::Impl::fused;
                    c.cross = true;
                    c.kp_bool = kp == 1;
                    c.kp_float = kp == 2;
                    c.am_rank = am == 0 ? 0 : (am <= 2 ? 2 : 3);
                    c.am_bool = am % 2 == 1;
                    c.causal = causal;
                    check(c);
                }
    });
}

TEST(FusedAttention, FullyPaddedTilesAndRows) {
    Case c{2, 300, 600, 16, 2};
    c.impl = mha::Impl::fused;
    c.cross = true;
    Problem p(c);
    // Batch 0: keys 0..299 padded (whole first tile skipped); batch 1: every key padded.
    std::vector<std::uint8_t> mask(2 * 600, 0);
    for (std::size_t j = 0; j < 300; ++j) mask[j] = 1;
    for (std::size_t j = 600; j < 1200; ++j) mask[j] = 1;
    p.in.key_padding_mask = mha::MaskView::boolean(mask.data(), 2, 600);
    auto m = p.make();
    const auto got = p.run(m, mha::Backend::simd);
    expect_close(c, got, p.run(m, mha::Backend::scalar));
    for (std::size_t i = 0; i < 300; ++i)
        for (std::size_t j = 0; j < 16; ++j) ASSERT_EQ(got[(300 + i) * 16 + j], p.b_out[j]);
}

TEST(FusedAttention, NeedWeightsFallsBackToMaterialized) {
    Case c{1, 40, 40, 16, 2};
    c.impl = mha::Impl::fused;
    c.need = mha::NeedWeights::per_head;
    check(c);
}

TEST(FusedAttention, BitwiseIdenticalAcrossThreadCounts) {
    Case c{1, 600, 600, 64, 4};
    c.impl = mha::Impl::fused;
    c.causal = true;
    Problem p(c);
    auto m = p.make();
    for_each_isa([&] {
        const auto one = p.run(m, mha::Backend::simd, 1);
        for (int t : {2, 3, 8}) EXPECT_EQ(one, p.run(m, mha::Backend::simd, t)) << t << " threads";
    });
}

}  // namespace
