// Comparison helpers shared by the tests (tests/*.cpp and tests/tool/*.cpp), written so that a bad
// result cannot slip through: std::max(m, NaN) returns m and |NaN − x| <= tol is false only if the
// comparison is written that way round, so each helper checks finiteness explicitly.
// The rule, for every helper here and in attention_test_util.hpp: where a finite value is expected,
// the got value must be finite; NaN or ±inf on either side, and a size mismatch, are failures.
// No helper compares NaN positions (NaN expected with NaN got also fails): no test here expects NaN
// through a tolerance comparison. Tests that expect NaN (tests/test_adversarial.cpp's confinement
// tests) say so with std::isnan, and bitwise identity is checked with same_bits / same_bits_or_nan below.
// tests/test_compare_helpers.cpp tests these helpers themselves.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

namespace mha_test {

// max|v|; NaN if any element is NaN or ±inf (so a tolerance scaled by it fails every comparison).
template <class T>
double max_abs(const std::vector<T>& v) {
    double m = 0.0;
    for (T x : v) {
        if (!std::isfinite(double(x))) return std::numeric_limits<double>::quiet_NaN();
        m = std::max(m, std::abs(double(x)));
    }
    return m;
}

// max|got − want|; NaN if the sizes differ or any element of either is NaN or ±inf. NaN compares false
// with every bound, so EXPECT_LE(max_abs_diff(..), tol) fails even when tol is itself infinite.
template <class T, class U>
double max_abs_diff(const std::vector<T>& got, const std::vector<U>& want) {
    if (got.size() != want.size()) return std::numeric_limits<double>::quiet_NaN();
    double m = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(double(got[i])) || !std::isfinite(double(want[i]))) return std::numeric_limits<double>::quiet_NaN();
        m = std::max(m, std::abs(double(got[i]) - double(want[i])));
    }
    return m;
}

// max|got − want| / max|want| (0 when both are all zeros, +inf when only want is); NaN as max_abs_diff.
template <class T, class U>
double max_relative_error(const std::vector<T>& got, const std::vector<U>& want) {
    const double err = max_abs_diff(got, want), scale = max_abs(want);
    if (std::isnan(err) || std::isnan(scale)) return std::numeric_limits<double>::quiet_NaN();
    if (scale == 0.0) return err == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
    return err / scale;
}

// Every |got[i] − want[i]| ≤ tol[i], all three finite and of one size; names the first failure.
template <class T, class U>
::testing::AssertionResult all_within(const std::vector<T>& got, const std::vector<U>& want,
                                      const std::vector<double>& tol) {
    if (got.size() != want.size() || tol.size() != want.size())
        return ::testing::AssertionFailure() << "sizes differ: got " << got.size() << ", expected " << want.size()
                                             << ", tolerances " << tol.size();
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = double(got[i]), w = double(want[i]);
        if (!std::isfinite(g) || !std::isfinite(w) || !std::isfinite(tol[i]) || !(std::abs(g - w) <= tol[i]))
            return ::testing::AssertionFailure() << "[" << i << "]: got " << g << ", expected " << w << " ± " << tol[i]
                                                 << " (off by " << std::abs(g - w) << ")";
    }
    return ::testing::AssertionSuccess();
}

// The same with one tolerance for every element.
template <class T, class U>
::testing::AssertionResult all_within(const std::vector<T>& got, const std::vector<U>& want, double tol) {
    return all_within(got, want, std::vector<double>(want.size(), tol));
}

// Bitwise equality (NaN signs and payloads included): results a contract says are the same bits.
inline bool same_bits(const float* a, const float* b, std::size_t n) {
    return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

// Bitwise equality, except that any two NaNs match: a NaN's sign and payload are not part of the contract (which
// NaN operand an add or FMA passes on depends on the operand order each kernel's compiler chose; fp8 NaN codes
// widen to quiet NaNs whose payloads the conversion instructions choose).
inline bool same_bits_or_nan(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
    return true;
}

}  // namespace mha_test
