// The comparison helpers themselves (tests/compare_util.hpp, and expect_within / relative_tolerance of
// tests/attention_test_util.hpp): a NaN or ±inf where a finite value is expected, a NaN expected value
// and a size mismatch must each fail, whatever the tolerance; equal finite values within tolerance pass.
// (The tool tests' max_abs_diff took std::max(m, |a − b|), which drops NaN: an all-NaN output passed.)
#include <gtest/gtest.h>
#include <gtest/gtest-spi.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_test_util.hpp"
#include "compare_util.hpp"

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// How the tests use the scalar helpers: EXPECT_LE(max_abs_diff(got, want), tol). True = that passes.
bool passes(const std::vector<float>& got, const std::vector<double>& want, double tol) {
    return mha_test::max_abs_diff(got, want) <= tol;
}

// The number of fatal and non-fatal failures `f` reports, intercepted (not failing this test).
template <class F>
int failures_of(F f) {
    ::testing::TestPartResultArray results;
    {
        ::testing::ScopedFakeTestPartResultReporter reporter(
            ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
        f();
    }
    return results.size();
}

TEST(CompareHelpers, FiniteValuesWithinTolerancePass) {
    EXPECT_TRUE(passes({1.0f, -2.0f}, {1.0, -2.0}, 0.0));
    EXPECT_TRUE(passes({1.0f, -2.0f}, {1.0 + 1e-6, -2.0}, 2e-6));
    EXPECT_FALSE(passes({1.0f, -2.0f}, {1.0 + 1e-6, -2.0}, 1e-7));
    EXPECT_EQ(mha_test::max_abs(std::vector<float>{1.0f, -3.0f}), 3.0);
    EXPECT_EQ(mha_test::max_relative_error(std::vector<float>{1.0f, -3.0f}, std::vector<float>{1.0f, -2.0f}), 0.5);
    EXPECT_TRUE(mha_test::all_within(std::vector<float>{1.0f}, std::vector<double>{1.5}, 0.5));
}

// NaN got where a finite value is expected fails, for any tolerance (infinite included), whether one
// element or all of them.
TEST(CompareHelpers, NaNGotFails) {
    const std::vector<double> want{0.5, -0.25, 1.0};
    for (double tol : {0.0, 1e-5, 1e30, double(kInf)}) {
        SCOPED_TRACE(tol);
        EXPECT_FALSE(passes({kNaN, kNaN, kNaN}, want, tol));
        EXPECT_FALSE(passes({0.5f, kNaN, 1.0f}, want, tol));
        EXPECT_FALSE(passes({0.5f, -0.25f, kNaN}, want, tol));  // the last element too
        EXPECT_FALSE(mha_test::all_within(std::vector<float>{0.5f, kNaN, 1.0f}, want, tol));
    }
    EXPECT_FALSE(mha_test::max_relative_error(std::vector<float>{kNaN, kNaN}, std::vector<float>{1.0f, 2.0f}) <= 1e-5);
    // A tolerance scaled by max_abs(got-like data with NaN) is NaN, so nothing passes against it.
    EXPECT_TRUE(std::isnan(mha_test::max_abs(std::vector<float>{1.0f, kNaN})));
}

// ±inf against a finite value fails; so does inf against inf (no output here is legitimately infinite).
TEST(CompareHelpers, InfinityFails) {
    for (float inf : {kInf, -kInf}) {
        EXPECT_FALSE(passes({inf, 1.0f}, {0.0, 1.0}, double(kInf)));
        EXPECT_FALSE(passes({0.0f, 1.0f}, {double(inf), 1.0}, double(kInf)));
        EXPECT_FALSE(passes({inf, 1.0f}, {double(inf), 1.0}, double(kInf)));
        EXPECT_FALSE(mha_test::all_within(std::vector<float>{inf}, std::vector<double>{0.0}, double(kInf)));
        EXPECT_FALSE(mha_test::max_relative_error(std::vector<float>{inf}, std::vector<float>{1.0f}) <= 1e30);
        EXPECT_TRUE(std::isnan(mha_test::max_abs(std::vector<float>{inf})));
    }
}

// Decision: no helper compares NaN positions. NaN expected with NaN got fails too; tests that expect
// NaN (NaN confinement in test_adversarial.cpp) check std::isnan themselves.
TEST(CompareHelpers, NaNExpectedFailsEvenWithNaNGot) {
    EXPECT_FALSE(passes({kNaN, 1.0f}, {double(kNaN), 1.0}, double(kInf)));
    EXPECT_FALSE(passes({0.0f, 1.0f}, {double(kNaN), 1.0}, double(kInf)));
    EXPECT_FALSE(mha_test::all_within(std::vector<float>{kNaN}, std::vector<double>{double(kNaN)}, double(kInf)));
    EXPECT_FALSE(mha_test::max_relative_error(std::vector<float>{kNaN}, std::vector<float>{kNaN}) <= 1e30);
}

TEST(CompareHelpers, SizeMismatchFails) {
    EXPECT_FALSE(passes({1.0f}, {1.0, 2.0}, double(kInf)));
    EXPECT_FALSE(passes({1.0f, 2.0f}, {1.0}, double(kInf)));
    EXPECT_FALSE(passes({}, {1.0}, double(kInf)));
    EXPECT_FALSE(mha_test::all_within(std::vector<float>{1.0f}, std::vector<double>{1.0, 2.0}, double(kInf)));
    EXPECT_FALSE(mha_test::all_within(std::vector<float>{1.0f}, std::vector<double>{1.0}, std::vector<double>{}));
    EXPECT_FALSE(mha_test::max_relative_error(std::vector<float>{1.0f}, std::vector<float>{1.0f, 2.0f}) <= 1e30);
}

// A NaN or infinite tolerance is a broken bound, not a licence.
TEST(CompareHelpers, NonFiniteToleranceFails) {
    EXPECT_FALSE(mha_test::all_within(std::vector<float>{1.0f}, std::vector<double>{1.0}, double(kNaN)));
    EXPECT_FALSE(mha_test::all_within(std::vector<float>{1.0f}, std::vector<double>{1.0}, double(kInf)));
    EXPECT_FALSE(mha_test::relative_tolerance({1.0}, {double(kNaN)}) < 1.0);
    EXPECT_FALSE(mha_test::relative_tolerance({double(kNaN)}, {1e-9}) < 1.0);
    EXPECT_FALSE(mha_test::relative_tolerance({1.0, 2.0}, {1e-9}) < 1.0);
    EXPECT_LT(mha_test::relative_tolerance({1.0, -2.0}, {1e-9, 2e-9}), 1.1e-9);
}

// attention_test_util.hpp's expect_within reports a failure (fatal, ending the helper) for each of the
// cases above and none for values within tolerance.
TEST(CompareHelpers, ExpectWithinFails) {
    const std::vector<double> want{0.5, 1.0}, tol{1e-6, 1e-6};
    auto failures = [&](std::vector<float> got, std::vector<double> w, std::vector<double> t) {
        return failures_of([&] { mha_test::expect_within(got, w, t, "test"); });
    };
    EXPECT_EQ(failures({0.5f, 1.0f}, want, tol), 0);
    EXPECT_EQ(failures({kNaN, kNaN}, want, tol), 1);
    EXPECT_EQ(failures({0.5f, kInf}, want, tol), 1);
    EXPECT_EQ(failures({0.5f, 1.0f}, {0.5, double(kNaN)}, tol), 1);
    EXPECT_EQ(failures({kNaN, 1.0f}, {double(kNaN), 1.0}, {double(kInf), 1e-6}), 1);
    EXPECT_EQ(failures({0.5f}, want, tol), 1);
    EXPECT_EQ(failures({0.5f, 1.01f}, want, tol), 1);
}

// same_bits: every bit, NaN payloads and signed zeros included, and the sizes; same_bits_or_nan: the same, except
// that any two NaNs match.
TEST(CompareHelpers, SameBitsSeesEveryBit) {
    const float nan_a = std::bit_cast<float>(0x7fc00001u), nan_b = std::bit_cast<float>(0xffc00002u);
    EXPECT_TRUE(mha_test::same_bits(std::vector<float>{1.0f, nan_a}, std::vector<float>{1.0f, nan_a}));
    EXPECT_TRUE(mha_test::same_bits(std::vector<float>{}, std::vector<float>{}));
    EXPECT_FALSE(mha_test::same_bits(std::vector<float>{1.0f, nan_a}, std::vector<float>{1.0f, nan_b}));
    EXPECT_FALSE(mha_test::same_bits(std::vector<float>{0.0f}, std::vector<float>{-0.0f}));
    EXPECT_FALSE(mha_test::same_bits(std::vector<float>{1.0f}, std::vector<float>{std::nextafter(1.0f, 2.0f)}));
    EXPECT_FALSE(mha_test::same_bits(std::vector<float>{1.0f}, std::vector<float>{1.0f, 1.0f}));
    const float x[2] = {1.0f, 2.0f}, y[2] = {1.0f, 3.0f};
    EXPECT_TRUE(mha_test::same_bits(x, y, 1));
    EXPECT_FALSE(mha_test::same_bits(x, y, 2));
    EXPECT_TRUE(mha_test::same_bits(nullptr, nullptr, 0));
    EXPECT_TRUE(mha_test::same_bits_or_nan(std::vector<float>{1.0f, nan_a}, std::vector<float>{1.0f, nan_b}));
    EXPECT_FALSE(mha_test::same_bits_or_nan(std::vector<float>{0.0f}, std::vector<float>{-0.0f}));
    EXPECT_FALSE(mha_test::same_bits_or_nan(std::vector<float>{nan_a}, std::vector<float>{1.0f}));
    EXPECT_FALSE(mha_test::same_bits_or_nan(std::vector<float>{1.0f}, std::vector<float>{}));
}

}  // namespace
