// simd::softmax_tile_online on every ISA the machine has, against a double computation: lengths
// around the vector width, masks, n_valid < n, a running max that grows, stays, or is -inf. simd::scale_row
// (the accumulator's rescale) against the plain loop, bitwise, over every tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

class OnlineSoftmax : public ::testing::TestWithParam<mha::Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa()) GTEST_SKIP() << "CPU lacks " << mha::isa_name(GetParam());
        mha::set_isa_cap(GetParam());
    }
    void TearDown() override { mha::set_isa_cap(mha::Isa::avx512_bf16); }
};

TEST_P(OnlineSoftmax, MatchesDouble) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-5.0f, 5.0f);
    for (std::size_t n : {1, 3, 4, 7, 8, 15, 16, 17, 33, 256}) {
        for (std::size_t n_valid : {n, n / 2}) {
            for (float start_max : {-kInf, 0.0f, 50.0f}) {
                std::vector<float> x(n + 1), m0(n), m1(n);
                for (auto& v : x) v = u(rng);
                for (auto& v : m0) v = u(rng);
                for (std::size_t j = 0; j < n; ++j) m1[j] = j % 5 == 2 ? -kInf : 0.0f;
                float* row = x.data() + 1;  // misaligned start
                const std::vector<float> in(row, row + n);
                const float scale = 0.3f;
                double want_max = start_max;
                for (std::size_t j = 0; j < n_valid; ++j)
                    want_max = std::max(want_max, double(scale) * in[j] + m0[j] + m1[j]);
                float running = start_max;
                const float sum = mha::simd::softmax_tile_online(row, n, n_valid, scale, m0.data(), m1.data(), running);
                // z is rounded once or twice depending on FMA contraction: within 2 ulp of the double value.
                if (want_max == -kInf)
                    ASSERT_EQ(running, -kInf);
                else
                    ASSERT_NEAR(running, want_max, 2.0 * std::numeric_limits<float>::epsilon() * std::abs(want_max));
                double want_sum = 0.0;
                for (std::size_t j = 0; j < n; ++j) {
                    double want = 0.0;
                    if (j < n_valid && want_max != -kInf) want = std::exp(double(scale) * in[j] + m0[j] + m1[j] - want_max);
                    want_sum += want;
                    // exp is ~1.5 ulp; z itself is rounded twice (scale·x + m0 + m1), each |z| ≤ 60 → 4 ulp of 60.
                    ASSERT_NEAR(row[j], want, 1e-6 * (1.0 + 60.0 * std::abs(want))) << "n=" << n << " j=" << j;
                }
                ASSERT_NEAR(sum, want_sum, 1e-5 * (1.0 + want_sum) * (1.0 + 60.0)) << "n=" << n;
            }
        }
    }
}

TEST_P(OnlineSoftmax, AllMaskedTileGivesZerosAndKeepsMax) {
    std::vector<float> x(19, 1.0f), mask(19, -kInf);
    float running = -kInf;
    EXPECT_EQ(mha::simd::softmax_tile_online(x.data(), 19, 19, 1.0f, mask.data(), nullptr, running), 0.0f);
    EXPECT_EQ(running, -kInf);
    for (float v : x) EXPECT_EQ(v, 0.0f);
    running = 3.0f;
    std::fill(x.begin(), x.end(), 1.0f);
    EXPECT_EQ(mha::simd::softmax_tile_online(x.data(), 19, 0, 1.0f, nullptr, nullptr, running), 0.0f);
    EXPECT_EQ(running, 3.0f);
    for (float v : x) EXPECT_EQ(v, 0.0f);
}

// scale = 1 and no masks (the fused path's call: the GEMM already scaled): z = x is not stored back, so
// the tail and the entries past n_valid must still come out right.
TEST_P(OnlineSoftmax, UnscaledUnmasked) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-20.0f, 20.0f);
    for (std::size_t n : {1, 5, 16, 31, 32, 33, 100, 256}) {
        for (std::size_t n_valid : {n, n - n / 3}) {
            std::vector<float> x(n);
            for (auto& v : x) v = u(rng);
            x[n_valid / 2] = 0.5f * x[n_valid / 2] + 30.0f;  // a clear max (the running max of 25 is below it)
            const std::vector<float> in = x;
            float running = 25.0f;
            const float sum = mha::simd::softmax_tile_online(x.data(), n, n_valid, 1.0f, nullptr, nullptr, running);
            double want_max = 25.0;
            for (std::size_t j = 0; j < n_valid; ++j) want_max = std::max(want_max, double(in[j]));
            ASSERT_EQ(running, float(want_max)) << "n=" << n;
            double want_sum = 0.0;
            for (std::size_t j = 0; j < n; ++j) {
                const double want = j < n_valid ? std::exp(double(in[j]) - want_max) : 0.0;
                want_sum += want;
                // d = z − max is rounded once (relative u = eps/2, so exp(d) is off by |d|·eps/2 relative),
                // then exp adds at most ~1.5 ulp.
                const double d = std::abs(double(in[j]) - want_max);
                ASSERT_NEAR(x[j], want, (2.0 + 0.5 * d) * std::numeric_limits<float>::epsilon() * want + 1e-38)
                    << "n=" << n << " j=" << j;
            }
            ASSERT_NEAR(sum, want_sum, 1e-6 * want_sum) << "n=" << n;
        }
    }
}

// One product per entry: the plain loop's bits (NaN payloads too), ±inf and subnormals included; nothing past n written.
TEST_P(OnlineSoftmax, ScaleRowIsThePlainLoop) {
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (float alpha : {0.0f, 0.3712f, 1.0f, 1e-30f, -2.5f}) {
        for (std::size_t n = 0; n <= 70; ++n) {
            std::vector<float> x(n + 3);
            for (auto& v : x) v = u(rng);
            if (n > 2) x[1] = kInf, x[2] = std::numeric_limits<float>::quiet_NaN(), x[n - 1] = 1e-40f;
            std::vector<float> want = x;
            for (std::size_t j = 0; j < n; ++j) want[j] *= alpha;
            mha::simd::scale_row(x.data(), n, alpha);
            for (std::size_t j = 0; j < n + 3; ++j)
                ASSERT_EQ(std::memcmp(&x[j], &want[j], 4), 0) << "alpha=" << alpha << " n=" << n << " j=" << j << ": " << x[j]
                                                              << " vs " << want[j];
        }
    }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, OnlineSoftmax, ::testing::ValuesIn(mha::simd::kSimdIsas),
                         [](const auto& info) { return std::string(mha::isa_name(info.param)); });

}  // namespace
