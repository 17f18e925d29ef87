// The SIMD row kernels mha::simd::softmax_row and mha::simd::layernorm_row, run once per ISA this CPU
// has (mha::set_isa_cap), against a double-precision computation and the scalar reference.
// Lengths cover every tail of W = 4, 8, 16 lanes (1, 3, 7, W−1, W, W+1, 2W+1), odd sizes, 768, 1024 and
// the longest row (8192), each from a 64-byte aligned start and from start + 1 float; sentinels on
// both sides of every output must survive.
//
// Error bounds (u = 2^-24, float unit roundoff; first order in u, then a factor c for second-order terms).
// softmax, p_j = exp(z_j − M) / Σ_k exp(z_k − M), z_j = scale·x_j + m0_j + m1_j:
//   z_j is rounded up to 3 times: |δz_j| ≤ 3u·a_j, a_j = |scale·x_j| + |m0_j| + |m1_j|; z_j − M adds
//   u·|d_j|, d_j = z_j − M. The error of M cancels (softmax is shift-invariant), so
//   Δlog p_j = Δd_j − Σ_k p_k Δd_k + (exp: 2 ulp ≤ 4u, own and weighted) + (n − 1)u (sum) + 2u (1/Σ, ·)
//   (exp: glibc < 1 ulp, xsimd::exp 1.52 ulp, the AVX-512 kernel's own 1.07 ulp, measured on [-104, 0]):
//   |Δp_j| ≤ c·p_j·u·(3a_j + 3·max_k a_k + |d_j| + Σ_k p_k|d_k| + n + 9) + 2^-126, c = 1.5.
//   The 2^-126 absolute term: exp results below the smallest normal float may be flushed to 0.
//   Entries whose z is -inf are exactly 0. The row sum is then within Σ_j tol_j of 1.
// layernorm (SIMD: float, two passes with the mean's rounding carried as a correction; see
// lib/simd/layernorm_impl.hpp), z_j = x_j + r_j exact, mean μ, biased σ², s = sqrt(σ² + eps),
// t_j = (z_j − μ)/s, y_j = g_j·t_j + b_j:
//   δz_j = u·|z_j| if there is a residual (z rounded to float), else 0; Z̄ = mean |z|.
//   pass 1 mean0: |mean0 − μ| ≤ Δ = (n + 2)·u·Z̄ (n − 1 adds, a divide, mean δz);
//   pass 2 d_j = z_j − mean0 with |d_j| ≤ a_j = |z_j − μ| + Δ + δz_j, rounding u·a_j;
//          c = Σd/n off by (n + 2)·u·ā (ā = mean a);
//   pass 3 (z_j − mean0) − c is off from z_j − μ by E_j = δz_j + mean δz + 2u·a_j + (n + 2)·u·ā;
//   variance Σd²/n − c² is off by Evar = (n + 4)·u·mean(a²) + 2·mean(a·δz) + 4Δ·(n + 2)·u·ā,
//   so 1/sqrt(var + eps) has relative error ρ = Evar / (2(σ² + eps)) + 3u (add eps, sqrt, divide);
//   |Δy_j| ≤ c·(|g_j|·(E_j/s + |t_j|·(ρ + 2u)) + u·|y_j|), c = 2 (t = d·inv − c·inv, t·g and + b round
//   once each; fused where the ISA has FMA).
//   Unlike a plain float two-pass (whose error has a Δ/s term: 0.6 for mean 1e4, n = 1024), this stays
//   ~1e-4 on rows with mean 1e4 and unit variance.
// The reference layernorm accumulates in double and rounds once (reference.hpp); its bound, as in
// test_reference_kernels.cpp: u·|y_j| + 2·(n + 8)·2^-53·(|g_j|/s·(max|z| + |z_j − μ|) + |y_j| + |b_j|).
// SIMD and reference results are compared with the sum of their bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "reference/reference.hpp"
#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

constexpr double kU = 0x1p-24;
constexpr double kUd = 0x1p-53;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;  // a NaN with a payload
constexpr std::size_t kGuard = 16;                    // sentinel floats on each side of a buffer

// Row lengths: every tail for W = 4, 8, 16, odd sizes, the shapes attention uses, the longest row.
std::vector<std::size_t> row_lengths() {
    std::set<std::size_t> s = {5, 13, 29, 33, 47, 63, 65, 77, 97, 127, 129, 255, 257, 333, 511, 513, 1001, 768, 1024, 8192};
    for (std::size_t w : {4, 8, 16})
        for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{7}, w - 1, w, w + 1, 2 * w + 1}) s.insert(n);
    return {s.begin(), s.end()};
}

// n floats starting `offset` floats past a 64-byte boundary, with sentinels before and after.
class Buffer {
public:
    Buffer(std::size_t n, std::size_t offset) : n_(n), mem_(n + offset + 2 * kGuard + 16) {
        const auto addr = reinterpret_cast<std::uintptr_t>(mem_.data());
        const std::size_t pad = ((64 - addr % 64) % 64) / sizeof(float);
        begin_ = pad + kGuard + offset;
        const float sentinel = std::bit_cast<float>(kSentinelBits);
        std::fill(mem_.begin(), mem_.end(), sentinel);
    }
    Buffer(const std::vector<float>& v, std::size_t offset) : Buffer(v.size(), offset) {
        std::copy(v.begin(), v.end(), data());
    }
    float* data() { return mem_.data() + begin_; }
    const float* data() const { return mem_.data() + begin_; }
    float operator[](std::size_t j) const { return data()[j]; }
    std::vector<float> values() const { return {data(), data() + n_}; }
    bool guards_intact() const {
        for (std::size_t i = begin_ - kGuard; i < begin_; ++i)
            if (std::bit_cast<std::uint32_t>(mem_[i]) != kSentinelBits) return false;
        for (std::size_t i = begin_ + n_; i < begin_ + n_ + kGuard; ++i)
            if (std::bit_cast<std::uint32_t>(mem_[i]) != kSentinelBits) return false;
        return true;
    }

private:
    std::size_t n_, begin_ = 0;
    std::vector<float> mem_;
};

std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

std::vector<float> normal(std::size_t n, float mean, float stddev, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// Reports the first few entries out of bound (a row has up to 8192), then a count.
class BoundChecker {
public:
    explicit BoundChecker(std::string what) : what_(std::move(what)) {}
    ~BoundChecker() {
        if (failures_ > kShown) ADD_FAILURE() << what_ << ": " << failures_ << " entries out of bound in all";
    }
    void near(std::size_t j, double got, double want, double tol) {
        if (std::abs(got - want) <= tol) return;
        if (++failures_ <= kShown)
            ADD_FAILURE() << what_ << "[" << j << "] = " << got << ", want " << want << " ± " << tol
                          << " (off by " << std::abs(got - want) << ")";
    }
    void equal(std::size_t j, float got, float want) {
        if (got == want) return;
        if (++failures_ <= kShown) ADD_FAILURE() << what_ << "[" << j << "] = " << got << ", want exactly " << want;
    }

private:
    static constexpr int kShown = 5;
    std::string what_;
    int failures_ = 0;
};

// Every ISA; those the CPU lacks are skipped (and say so).
class SimdRows : public ::testing::TestWithParam<mha::Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa())
            GTEST_SKIP() << "this CPU has no " << mha::isa_name(GetParam());
        mha::set_isa_cap(GetParam());
        ASSERT_EQ(mha::active_isa(), GetParam());
    }
    void TearDown() override { mha::set_isa_cap(mha::Isa::avx512_bf16); }
};

std::string isa_param_name(const ::testing::TestParamInfo<mha::Isa>& info) {
    return std::string(mha::isa_name(info.param));
}

// ---------------------------------------------------------------------------------------------
// softmax

struct SoftmaxExact {
    std::vector<double> p, tol;  // over [0, n); entries past n_valid are p = 0, tol = 0
    double sum_tol = 0;
};

SoftmaxExact softmax_exact(const std::vector<float>& x, std::size_t n, std::size_t n_valid, float scale,
                           const float* m0, const float* m1) {
    SoftmaxExact e{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    std::vector<double> z(n_valid), a(n_valid);
    double max = -std::numeric_limits<double>::infinity(), max_a = 0;
    for (std::size_t j = 0; j < n_valid; ++j) {
        z[j] = double(scale) * x[j] + (m0 ? m0[j] : 0.0) + (m1 ? m1[j] : 0.0);
        a[j] = std::abs(double(scale) * x[j]) + (m0 ? std::abs(m0[j]) : 0.0) + (m1 ? std::abs(m1[j]) : 0.0);
        max = std::max(max, z[j]);
        if (z[j] != -std::numeric_limits<double>::infinity()) max_a = std::max(max_a, a[j]);
    }
    if (max == -std::numeric_limits<double>::infinity()) return e;  // all zeros, exactly
    double sum = 0, weighted_d = 0;
    for (std::size_t j = 0; j < n_valid; ++j) sum += std::exp(z[j] - max);
    for (std::size_t j = 0; j < n_valid; ++j) {
        e.p[j] = std::exp(z[j] - max) / sum;
        if (e.p[j] > 0) weighted_d += e.p[j] * (max - z[j]);
    }
    for (std::size_t j = 0; j < n_valid; ++j) {
        if (z[j] == -std::numeric_limits<double>::infinity()) continue;  // exactly 0
        const double rel = kU * (3 * a[j] + 3 * max_a + (max - z[j]) + weighted_d + double(n_valid) + 9);
        e.tol[j] = 1.5 * e.p[j] * rel + 0x1p-126;
        e.sum_tol += e.tol[j];
    }
    return e;
}

// Runs the SIMD and reference softmax on copies of one row and checks both against softmax_exact.
void check_softmax(const std::string& what, const std::vector<float>& x, std::size_t n_valid, float scale,
                   const std::vector<float>* mask0, const std::vector<float>* mask1, std::size_t offset) {
    const std::size_t n = x.size();
    SCOPED_TRACE(what + ": n = " + std::to_string(n) + ", n_valid = " + std::to_string(n_valid) +
                 ", offset = " + std::to_string(offset) + ", isa = " + std::string(mha::isa_name(mha::active_isa())));
    // Masks hold exactly n_valid floats, so a read past n_valid would touch the sentinels (NaN).
    Buffer m0(n_valid, offset), m1(n_valid, offset);
    if (mask0) std::copy_n(mask0->begin(), n_valid, m0.data());
    if (mask1) std::copy_n(mask1->begin(), n_valid, m1.data());
    const float* p0 = mask0 ? m0.data() : nullptr;
    const float* p1 = mask1 ? m1.data() : nullptr;
    Buffer simd(x, offset), ref(x, offset);
    mha::simd::softmax_row(simd.data(), n, n_valid, scale, p0, p1);
    mha::reference::softmax_row(ref.data(), n, n_valid, scale, p0, p1);
    const SoftmaxExact e = softmax_exact(x, n, n_valid, scale, p0, p1);

    EXPECT_TRUE(simd.guards_intact()) << "softmax wrote outside x[0, n)";
    BoundChecker vs_exact("simd vs double"), vs_ref("simd vs reference"), ref_exact("reference vs double");
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
        if (e.tol[j] == 0) {  // past n_valid, a -inf entry, or an all -inf row: exactly 0
            vs_exact.equal(j, simd[j], 0.0f);
        } else {
            vs_exact.near(j, simd[j], e.p[j], e.tol[j]);
            vs_ref.near(j, simd[j], ref[j], 2 * e.tol[j]);
            ref_exact.near(j, ref[j], e.p[j], e.tol[j]);
        }
        sum += simd[j];
    }
    if (e.sum_tol > 0) {
        EXPECT_NEAR(sum, 1.0, e.sum_tol) << "row sum";
    }
}

TEST_P(SimdRows, SoftmaxInputs90To100) {
    // exp(100) overflows float: only a max-subtracted softmax stays finite.
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) check_softmax("x in [90, 100]", uniform(n, 90, 100, 7 + n), n, 1.0f, nullptr, nullptr, offset);
}

TEST_P(SimdRows, SoftmaxNegativeScaleFarBelowZero) {
    // z in [-200, -180]: if lanes past the tail (scale·0 = 0) counted in the max, every exp would underflow.
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) check_softmax("scale -2", uniform(n, 90, 100, 11 + n), n, -2.0f, nullptr, nullptr, offset);
}

TEST_P(SimdRows, SoftmaxWholeExpRange) {
    // z − max spans [-110, 0]: exp results from 1 down through the subnormals to 0.
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) {
            auto x = uniform(n, -110, 0, 97 + n);
            x[n / 3] = 0.0f;
            check_softmax("z - max in [-110, 0]", x, n, 1.0f, nullptr, nullptr, offset);
        }
}

TEST_P(SimdRows, SoftmaxScaleAndBothMasksWithMinusInf) {
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) {
            const auto x = uniform(n, -4, 4, 13 + n);
            auto m0 = uniform(n, -3, 3, 17 + n), m1 = uniform(n, -3, 3, 19 + n);
            for (std::size_t j = 2; j < n; j += 5) m0[j] = -kInf;  // key padding
            for (std::size_t j = 0; j < n; ++j)
                if (j % 7 == 3) m1[j] = -kInf;  // e.g. a causal or attn mask
            check_softmax("masks", x, n, 0.125f, &m0, &m1, offset);
            check_softmax("mask0 only", x, n, 0.125f, &m0, nullptr, offset);
            check_softmax("mask1 only", x, n, 0.125f, nullptr, &m1, offset);
        }
}

TEST_P(SimdRows, SoftmaxNValidBelowN) {
    for (std::size_t n : row_lengths())
        for (std::size_t n_valid : {std::size_t{0}, std::size_t{1}, n / 2, n - 1, n}) {
            if (n_valid > n) continue;
            auto x = uniform(n, -5, 5, 23 + n);
            // Entries past n_valid are not read: NaN there must not reach the row.
            for (std::size_t j = n_valid; j < n; ++j) x[j] = std::numeric_limits<float>::quiet_NaN();
            const auto m0 = uniform(n, -1, 1, 29 + n), m1 = uniform(n, -1, 1, 31 + n);
            for (std::size_t offset : {0, 1}) check_softmax("n_valid < n", x, n_valid, 0.5f, &m0, &m1, offset);
        }
}

TEST_P(SimdRows, SoftmaxAllMinusInfRowIsZeros) {
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) {
            const auto x = uniform(n, -5, 5, 37 + n);
            const std::vector<float> all_masked(n, -kInf);
            check_softmax("mask all -inf", x, n, 1.0f, &all_masked, nullptr, offset);
            check_softmax("x all -inf", all_masked, n, 1.0f, nullptr, nullptr, offset);
            check_softmax("n_valid = 0", x, 0, 1.0f, nullptr, nullptr, offset);
        }
}

TEST_P(SimdRows, SoftmaxNaNStaysInItsRow) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t n : row_lengths()) {
        for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
            SCOPED_TRACE("n = " + std::to_string(n) + ", NaN at " + std::to_string(at));
            // With a finite entry beside it, a NaN z makes the sum NaN, so every valid entry is NaN (as in
            // the reference); entries past n_valid stay 0.
            if (n >= 2) {
                auto x = uniform(n + 3, -5, 5, 41 + n);
                x[at] = nan;
                Buffer row(x, 1);
                mha::simd::softmax_row(row.data(), n + 3, n, 1.0f, nullptr, nullptr);
                for (std::size_t j = 0; j < n; ++j) ASSERT_TRUE(std::isnan(row[j])) << j;
                for (std::size_t j = n; j < n + 3; ++j) ASSERT_EQ(row[j], 0.0f) << j;
            }
            // NaN and -inf only: no finite max, but the NaN must not pass for a fully masked row: every
            // valid entry becomes NaN (reference too).
            std::vector<float> y(n, -kInf);
            y[at] = nan;
            Buffer simd(y, 0), ref(y, 0);
            mha::simd::softmax_row(simd.data(), n, n, 1.0f, nullptr, nullptr);
            mha::reference::softmax_row(ref.data(), n, n, 1.0f, nullptr, nullptr);
            for (std::size_t j = 0; j < n; ++j) {
                ASSERT_TRUE(std::isnan(simd[j])) << j;
                ASSERT_TRUE(std::isnan(ref[j])) << j;
            }
        }
    }
    // Through the public API: the other rows of the matrix are untouched by the NaN row.
    const std::size_t rows = 3, cols = 77;
    auto x = uniform(rows * cols, 90, 100, 43);
    x[cols + 5] = nan;
    std::vector<float> got = x;
    mha::softmax_rows(mha::Matrix(got.data(), rows, cols), 1.0f, {}, mha::Backend::simd);
    for (std::size_t i : {std::size_t{0}, std::size_t{2}}) {
        std::vector<float> row(x.begin() + i * cols, x.begin() + (i + 1) * cols);
        const auto e = softmax_exact(row, cols, cols, 1.0f, nullptr, nullptr);
        for (std::size_t j = 0; j < cols; ++j) EXPECT_NEAR(got[i * cols + j], e.p[j], e.tol[j]) << i << ", " << j;
    }
    for (std::size_t j = 0; j < cols; ++j) EXPECT_TRUE(std::isnan(got[cols + j])) << j;
}

// ---------------------------------------------------------------------------------------------
// layernorm

struct LayernormExact {
    std::vector<double> y, tol_simd, tol_ref;
};

LayernormExact layernorm_exact(const float* x, const float* r, std::size_t n, const float* g, const float* b,
                               float eps) {
    const double nd = double(n);
    std::vector<double> z(n);
    double mean = 0, mean_abs = 0, max_abs = 0;
    for (std::size_t j = 0; j < n; ++j) {
        z[j] = double(x[j]) + (r ? double(r[j]) : 0.0);  // exact: two floats
        mean += z[j];
        mean_abs += std::abs(z[j]);
        max_abs = std::max(max_abs, std::abs(z[j]));
    }
    mean /= nd;
    mean_abs /= nd;
    double var = 0;
    for (double v : z) var += (v - mean) * (v - mean);
    var /= nd;
    const double s = std::sqrt(var + double(eps));

    // The SIMD bound (header comment).
    const double delta = (nd + 2) * kU * mean_abs;
    std::vector<double> dz(n), a(n);
    double mean_dz = 0, mean_a = 0, mean_a2 = 0, mean_a_dz = 0;
    for (std::size_t j = 0; j < n; ++j) {
        dz[j] = r ? kU * std::abs(z[j]) : 0.0;
        a[j] = std::abs(z[j] - mean) + delta + dz[j];
        mean_dz += dz[j] / nd;
        mean_a += a[j] / nd;
        mean_a2 += a[j] * a[j] / nd;
        mean_a_dz += a[j] * dz[j] / nd;
    }
    const double evar = (nd + 4) * kU * mean_a2 + 2 * mean_a_dz + 4 * delta * (nd + 2) * kU * mean_a;
    const double rho = evar / (2 * (var + double(eps))) + 3 * kU;

    LayernormExact e{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
    for (std::size_t j = 0; j < n; ++j) {
        const double gj = g ? g[j] : 1.0, bj = b ? b[j] : 0.0, t = (z[j] - mean) / s;
        e.y[j] = gj * t + bj;
        const double ej = dz[j] + mean_dz + 2 * kU * a[j] + (nd + 2) * kU * mean_a;
        e.tol_simd[j] = 2 * (std::abs(gj) * (ej / s + std::abs(t) * (rho + 2 * kU)) + kU * std::abs(e.y[j]));
        e.tol_ref[j] = kU * std::abs(e.y[j]) +
                       2 * (nd + 8) * kUd *
                           (std::abs(gj) / s * (max_abs + std::abs(z[j] - mean)) + std::abs(e.y[j]) + std::abs(bj));
    }
    return e;
}

enum class Alias { none, y_is_x, y_is_residual };

struct LayernormInput {
    std::vector<float> x, residual, gamma, beta;  // empty: not passed (nullptr)
    float eps = 1e-5f;
};

// Runs the SIMD and reference layernorm on one row (optionally in place) and checks both.
void check_layernorm(const std::string& what, const LayernormInput& in, std::size_t offset, Alias alias) {
    const std::size_t n = in.x.size();
    SCOPED_TRACE(what + ": n = " + std::to_string(n) + ", offset = " + std::to_string(offset) + ", alias = " +
                 std::to_string(static_cast<int>(alias)) + ", isa = " + std::string(mha::isa_name(mha::active_isa())));
    const bool has_r = !in.residual.empty(), has_g = !in.gamma.empty(), has_b = !in.beta.empty();
    Buffer x(in.x, offset), r(has_r ? in.residual : std::vector<float>(n), offset);
    const Buffer g(has_g ? in.gamma : std::vector<float>(n), offset), b(has_b ? in.beta : std::vector<float>(n), offset);
    Buffer y(n, offset), y_ref(n, offset);
    const float* gp = has_g ? g.data() : nullptr;
    const float* bp = has_b ? b.data() : nullptr;
    const LayernormExact e = layernorm_exact(in.x.data(), has_r ? in.residual.data() : nullptr, n, gp, bp, in.eps);

    // Out of place first; x and the residual must come back unchanged.
    mha::simd::layernorm_row(y.data(), x.data(), has_r ? r.data() : nullptr, n, gp, bp, in.eps);
    mha::reference::layernorm_row(y_ref.data(), x.data(), has_r ? r.data() : nullptr, n, gp, bp, in.eps);
    EXPECT_TRUE(y.guards_intact()) << "layernorm wrote outside y[0, n)";
    EXPECT_EQ(x.values(), in.x) << "x changed";
    if (has_r) {
        EXPECT_EQ(r.values(), in.residual) << "residual changed";
    }
    BoundChecker vs_exact("simd vs double"), vs_ref("simd vs reference"), ref_exact("reference vs double");
    for (std::size_t j = 0; j < n; ++j) {
        vs_exact.near(j, y[j], e.y[j], e.tol_simd[j]);
        vs_ref.near(j, y[j], y_ref[j], e.tol_simd[j] + e.tol_ref[j]);
        ref_exact.near(j, y_ref[j], e.y[j], e.tol_ref[j]);
    }

    // In place: the same operations on the same values, so bitwise the same result.
    if (alias == Alias::y_is_x) {
        mha::simd::layernorm_row(x.data(), x.data(), has_r ? r.data() : nullptr, n, gp, bp, in.eps);
        EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * sizeof(float))) << "y = x in place differs";
        EXPECT_TRUE(x.guards_intact());
    } else if (alias == Alias::y_is_residual && has_r) {
        mha::simd::layernorm_row(r.data(), x.data(), r.data(), n, gp, bp, in.eps);
        EXPECT_EQ(0, std::memcmp(r.data(), y.data(), n * sizeof(float))) << "y = residual in place differs";
        EXPECT_TRUE(r.guards_intact());
    }
}

TEST_P(SimdRows, LayernormMean1e4UnitVariance) {
    // A float mean of 1e4 is off by up to n·u·1e4; the deviations must not inherit that.
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) {
            LayernormInput in{normal(n, 1e4f, 1.0f, 47 + n), {}, {}, {}};
            check_layernorm("mean 1e4", in, offset, Alias::y_is_x);
            in.eps = 0.0f;  // with n >= 2 the variance is far from 0
            if (n >= 2) check_layernorm("mean 1e4, eps 0", in, offset, Alias::none);
        }
}

TEST_P(SimdRows, LayernormGammaBetaResidual) {
    for (std::size_t n : row_lengths())
        for (std::size_t offset : {0, 1}) {
            LayernormInput in{normal(n, 0.5f, 3.0f, 53 + n), normal(n, -1.0f, 2.0f, 59 + n),
                              uniform(n, 0.5f, 1.5f, 61 + n), uniform(n, -1.0f, 1.0f, 67 + n)};
            check_layernorm("residual, gamma, beta", in, offset, Alias::y_is_residual);
            check_layernorm("residual, gamma, beta, y = x", in, offset, Alias::y_is_x);
            LayernormInput no_beta = in, no_gamma = in, no_residual = in;
            no_beta.beta.clear();
            no_gamma.gamma.clear();
            no_residual.residual.clear();
            check_layernorm("gamma only", no_beta, offset, Alias::none);
            check_layernorm("beta only", no_gamma, offset, Alias::none);
            check_layernorm("no residual", no_residual, offset, Alias::y_is_x);
            // The residual stream of a post-norm block: both large, mean 1e4.
            LayernormInput big{normal(n, 5e3f, 1.0f, 71 + n), normal(n, 5e3f, 1.0f, 73 + n), in.gamma, in.beta};
            check_layernorm("mean 1e4 with residual", big, offset, Alias::y_is_residual);
        }
}

TEST_P(SimdRows, LayernormHugeDeviations) {
    // Deviations past ~1.8e19 overflow their fp32 squares: the row is rescaled by a power of 2, not normalized
    // by inv_std = 0 (which gave beta everywhere). Also with a residual and a large mean.
    for (std::size_t n : row_lengths())
        for (float sigma : {1e19f, 1e20f, 1e30f, 1e34f})
            for (std::size_t offset : {0, 1}) {
                if (n < 2) continue;  // one value: no deviation
                LayernormInput in{normal(n, 0.0f, sigma, 89 + n), {}, uniform(n, 0.5f, 1.5f, 97 + n), uniform(n, -1, 1, 101 + n)};
                check_layernorm("huge deviations", in, offset, Alias::y_is_x);
                LayernormInput shifted{normal(n, 3.0f * sigma, sigma, 103 + n), normal(n, 0.0f, 1.0f, 107 + n), in.gamma, in.beta};
                check_layernorm("huge deviations, mean 3 sigma, residual", shifted, offset, Alias::none);
            }
}

TEST_P(SimdRows, LayernormConstantRowIsBeta) {
    for (std::size_t n : row_lengths())
        for (float c : {0.0f, -3.0f, 1234.567f, 1e4f})
            for (std::size_t offset : {0, 1}) {
                LayernormInput in{std::vector<float>(n, c), {}, uniform(n, 0.5f, 1.5f, 79 + n), uniform(n, -1, 1, 83 + n)};
                check_layernorm("constant row", in, offset, Alias::y_is_x);
                // A constant z = x + residual.
                LayernormInput split{std::vector<float>(n, c), std::vector<float>(n, 0.5f), in.gamma, in.beta};
                check_layernorm("constant z with residual", split, offset, Alias::y_is_residual);
            }
}

TEST_P(SimdRows, PublicWrappersMatchPerRowCalls) {
    // mha::softmax_rows / layernorm_rows with Backend::simd on strided rows give the per-row results.
    const std::size_t rows = 5, cols = 77, stride = 83;
    auto x = uniform(rows * stride, -3, 3, 89);
    const auto mask = uniform(rows * stride, -1, 1, 97);
    auto by_row = x;
    mha::softmax_rows(mha::Matrix(x.data(), rows, cols, stride), 0.25f,
                      mha::ConstMatrix(mask.data(), rows, cols, stride), mha::Backend::simd);
    for (std::size_t i = 0; i < rows; ++i)
        mha::simd::softmax_row(by_row.data() + i * stride, cols, cols, 0.25f, mask.data() + i * stride, nullptr);
    EXPECT_EQ(x, by_row);

    const auto src = normal(rows * stride, 2, 3, 101);
    const auto gamma = uniform(cols, 0.5f, 1.5f, 103), beta = uniform(cols, -1, 1, 107);
    std::vector<float> y(rows * stride, 0.0f), y_by_row(rows * stride, 0.0f);
    mha::layernorm_rows(mha::ConstMatrix(src.data(), rows, cols, stride), mha::Matrix(y.data(), rows, cols, stride),
                        gamma.data(), beta.data(), 1e-5f, {}, mha::Backend::simd);
    for (std::size_t i = 0; i < rows; ++i)
        mha::simd::layernorm_row(y_by_row.data() + i * stride, src.data() + i * stride, nullptr, cols, gamma.data(),
                                 beta.data(), 1e-5f);
    EXPECT_EQ(y, y_by_row);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, SimdRows, ::testing::ValuesIn(mha::simd::kSimdIsas),
                         isa_param_name);

}  // namespace
