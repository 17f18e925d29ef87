// Boolean masks are read as bytes by the softmax kernels (no float copy of the mask): on every ISA, the
// row softmax and the online tile softmax with a byte mask give bitwise what they give with the same
// mask as additive 0 / -inf floats — over all tail lengths, both mask slots, byte values other than 1,
// and NaN scores (a NaN under a masked byte stays NaN, as PyTorch's -inf fill added to NaN does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

using mha_test::same_bits;

class BoolMasks : public testing::TestWithParam<mha::Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa()) GTEST_SKIP() << "CPU lacks " << mha::isa_name(GetParam());
        mha::set_isa_cap(GetParam());
    }
    void TearDown() override { mha::set_isa_cap(mha::Isa::avx512_bf16); }
};

TEST_P(BoolMasks, BytesEqualAdditive) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::size_t n = 1; n <= 70; ++n) {
        for (int nan_case = 0; nan_case < 2; ++nan_case) {
            std::vector<float> x(n);
            for (float& v : x) v = dist(gen);
            if (nan_case) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
            std::vector<std::uint8_t> b0(n), b1(n);
            std::vector<float> a0(n), a1(n);
            for (std::size_t j = 0; j < n; ++j) {
                b0[j] = (j % 3 == 0) ? static_cast<std::uint8_t>(1 + j % 255) : 0;  // any nonzero byte masks
                b1[j] = (j % 5 == 1) ? 0xff : 0;
                a0[j] = b0[j] ? -inf : 0.0f;
                a1[j] = b1[j] ? -inf : 0.0f;
            }
            for (std::size_t n_valid : {n, n - n / 3}) {
                SCOPED_TRACE("n " + std::to_string(n) + " n_valid " + std::to_string(n_valid) + (nan_case ? " NaN" : ""));
                std::vector<float> by_bytes = x, by_floats = x;
                mha::simd::softmax_row(by_bytes.data(), n, n_valid, 0.5f, b0.data(), b1.data());
                mha::simd::softmax_row(by_floats.data(), n, n_valid, 0.5f, a0.data(), a1.data());
                EXPECT_TRUE(same_bits(by_bytes, by_floats));
                // Mixed: one slot bytes, the other floats.
                by_bytes = x, by_floats = x;
                mha::simd::softmax_row(by_bytes.data(), n, n_valid, 1.0f, a0.data(), b1.data());
                mha::simd::softmax_row(by_floats.data(), n, n_valid, 1.0f, a0.data(), a1.data());
                EXPECT_TRUE(same_bits(by_bytes, by_floats));
                // The online tile kernel.
                by_bytes = x, by_floats = x;
                float max_b = -inf, max_f = -inf;
                const float sum_b = mha::simd::softmax_tile_online(by_bytes.data(), n, n_valid, 1.0f, b0.data(), nullptr, max_b);
                const float sum_f = mha::simd::softmax_tile_online(by_floats.data(), n, n_valid, 1.0f, a0.data(), nullptr, max_f);
                EXPECT_TRUE(same_bits(by_bytes, by_floats));
                EXPECT_TRUE(std::memcmp(&sum_b, &sum_f, sizeof(float)) == 0) << sum_b << " vs " << sum_f;
                EXPECT_TRUE(std::memcmp(&max_b, &max_f, sizeof(float)) == 0);
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, BoolMasks, testing::ValuesIn(mha::simd::kSimdIsas),
                         [](const testing::TestParamInfo<mha::Isa>& i) { return std::string(mha::isa_name(i.param)); });

}  // namespace
