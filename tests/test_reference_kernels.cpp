// The scalar reference kernels (mha::reference::gemm / softmax_row / layernorm_row, and the public
// wrappers with Backend::scalar) against plain double-precision loops written here.
//
// Tolerances (u = 2^-24, the float unit roundoff; γ_n = n·u / (1 − n·u)):
//   gemm:      |Δc| ≤ γ_{K+2} · (|α|·Σ_p |a_ip||b_pj| + |β|·|c_ij|)  — K products summed (γ_K), then the
//              α multiply, the β·c multiply and the final add: the classical rigorous dot-product bound.
//   softmax:   the inputs z_j = scale·x_j + m0_j + m1_j carry δ_j ≤ 3u·(|scale·x_j| + |m0_j| + |m1_j|)
//              from three roundings, and z_j − max adds u·|z_j − max|. First order,
//              |Δp_j| ≤ p_j · (2·max_k δ_k + (n + 4)·u)   (Δ log p_j = Δz_j − Σ p_k Δz_k; exp ≤ 2u,
//              n − 1 adds in the sum, one divide); we allow c = 2 times that for second-order terms.
//   layernorm: the reference accumulates in double (u_d = 2^-53) and rounds once, so
//              |Δy_j| ≤ u·|y_j| + c·(n + 8)·u_d·(|γ_j|·r·(max|z| + |z_j − mean|) + |y_j| + |β_j|),
//              r = 1/sqrt(var + eps), c = 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <mha/mha.hpp>
#include "reference/reference.hpp"

namespace {

using mha::Backend;
using mha::ConstMatrix;
using mha::Matrix;
using mha::Trans;

constexpr double kU = 0x1p-24;   // float unit roundoff
constexpr double kUd = 0x1p-53;  // double unit roundoff
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kSentinel = std::bit_cast<float>(std::uint32_t{0x7fc0dead});  // a NaN with a payload

double gamma_n(double n) { return n * kU / (1.0 - n * kU); }
bool is_sentinel(float v) { return std::bit_cast<std::uint32_t>(v) == 0x7fc0deadu; }

std::vector<float> random_floats(std::size_t n, float lo, float hi, std::uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// A rows × cols matrix stored with a given stride; the padding holds the NaN sentinel.
struct Stored {
    std::vector<float> mem;
    std::size_t rows, cols, stride;
    Stored(std::size_t r, std::size_t c, std::size_t s, float lo, float hi, std::uint32_t seed)
        : mem(r * s, kSentinel), rows(r), cols(c), stride(s) {
        const auto v = random_floats(r * c, lo, hi, seed);
        for (std::size_t i = 0; i < r; ++i)
            for (std::size_t j = 0; j < c; ++j) mem[i * s + j] = v[i * c + j];
    }
    float at(std::size_t i, std::size_t j) const { return mem[i * stride + j]; }
    Matrix view() { return {mem.data(), rows, cols, stride}; }
    ConstMatrix cview() const { return {mem.data(), rows, cols, stride}; }
    // Every padding element still holds the sentinel.
    bool padding_untouched() const {
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = cols; j < stride; ++j)
                if (!is_sentinel(mem[i * stride + j])) return false;
        return true;
    }
};

enum class Entry { reference, scalar_api };
const char* entry_name(Entry e) { return e == Entry::reference ? "reference" : "public API, Backend::scalar"; }

// ---------------------------------------------------------------------------------------------
// gemm

void run_gemm(Entry e, float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) {
    if (e == Entry::reference)
        mha::reference::gemm(alpha, a, ta, b, tb, beta, c);
    else
        mha::gemm(alpha, a, ta, b, tb, beta, c, Backend::scalar);
}

// Checks C (after) against alpha·op(A)·op(B) + beta·C0 computed in double, with the γ_{K+2} bound.
void expect_gemm(const Stored& a, Trans ta, const Stored& b, Trans tb, float alpha, float beta, const Stored& c0,
                 const Stored& c, std::size_t K) {
    for (std::size_t i = 0; i < c.rows; ++i)
        for (std::size_t j = 0; j < c.cols; ++j) {
            double exact = 0.0, magnitude = 0.0;
            for (std::size_t p = 0; p < K; ++p) {
                const double av = ta == Trans::no ? a.at(i, p) : a.at(p, i);
                const double bv = tb == Trans::no ? b.at(p, j) : b.at(j, p);
                exact += av * bv;
                magnitude += std::abs(av * bv);
            }
            exact *= alpha;
            magnitude *= std::abs(alpha);
            if (beta != 0.0f) {
                exact += double(beta) * c0.at(i, j);
                magnitude += std::abs(double(beta) * c0.at(i, j));
            }
            const double tol = gamma_n(double(K) + 2) * magnitude;
            ASSERT_LE(std::abs(double(c.at(i, j)) - exact), tol) << "C(" << i << ", " << j << ")";
        }
}

TEST(ReferenceGemm, AllTransposesOddStridesAlphaBeta) {
    const std::size_t ms[] = {1, 5, 17}, ns[] = {1, 4, 19}, ks[] = {1, 8, 31};
    std::uint32_t seed = 1;
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes})
                for (std::size_t m : ms)
                    for (std::size_t n : ns)
                        for (std::size_t k : ks) {
                            SCOPED_TRACE(testing::Message() << entry_name(e) << " ta=" << (ta == Trans::yes) << " tb="
                                                            << (tb == Trans::yes) << " m=" << m << " n=" << n << " k=" << k);
                            const std::size_t ar = ta == Trans::no ? m : k, ac = ta == Trans::no ? k : m;
                            const std::size_t br = tb == Trans::no ? k : n, bc = tb == Trans::no ? n : k;
                            // Odd strides; the padding holds NaN, so reading it would poison the result.
                            const Stored a(ar, ac, ac + 3, -1.0f, 1.0f, seed++);
                            const Stored b(br, bc, bc + 5, -2.0f, 2.0f, seed++);
                            const Stored c0(m, n, n + 7, -1.0f, 1.0f, seed++);
                            Stored c = c0;
                            run_gemm(e, 1.5f, a.cview(), ta, b.cview(), tb, -0.75f, c.view());
                            expect_gemm(a, ta, b, tb, 1.5f, -0.75f, c0, c, k);
                            EXPECT_TRUE(c.padding_untouched());
                            EXPECT_TRUE(a.padding_untouched() && b.padding_untouched());
                        }
}

TEST(ReferenceGemm, BetaZeroOverwritesNaN) {
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes}) {
                SCOPED_TRACE(entry_name(e));
                const std::size_t m = 6, n = 9, k = 13;
                const Stored a(ta == Trans::no ? m : k, ta == Trans::no ? k : m, 20, -1.0f, 1.0f, 11);
                const Stored b(tb == Trans::no ? k : n, tb == Trans::no ? n : k, 21, -1.0f, 1.0f, 12);
                Stored c(m, n, n + 2, 0.0f, 0.0f, 13);
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t j = 0; j < n; ++j) c.mem[i * c.stride + j] = std::numeric_limits<float>::quiet_NaN();
                const Stored c0 = c;  // unused by the check when beta == 0
                run_gemm(e, 0.5f, a.cview(), ta, b.cview(), tb, 0.0f, c.view());
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t j = 0; j < n; ++j) ASSERT_TRUE(std::isfinite(c.at(i, j))) << i << ", " << j;
                expect_gemm(a, ta, b, tb, 0.5f, 0.0f, c0, c, k);
                EXPECT_TRUE(c.padding_untouched());
            }
}

TEST(ReferenceGemm, AlphaZeroBetaOneKeepsC) {
    // 0·sum = 0 and 0 + 1·c = c exactly.
    for (Entry e : {Entry::reference, Entry::scalar_api}) {
        const Stored a(4, 3, 3, -1.0f, 1.0f, 21), b(3, 5, 5, -1.0f, 1.0f, 22), c0(4, 5, 6, -3.0f, 3.0f, 23);
        Stored c = c0;
        run_gemm(e, 0.0f, a.cview(), Trans::no, b.cview(), Trans::no, 1.0f, c.view());
        EXPECT_EQ(c.mem.size(), c0.mem.size());
        for (std::size_t i = 0; i < 4; ++i)
            for (std::size_t j = 0; j < 5; ++j) EXPECT_EQ(c.at(i, j), c0.at(i, j)) << entry_name(e);
    }
}

TEST(ReferenceGemm, SmallExactProduct) {
    // Integers: every product and partial sum is exact in float, so the result must be exact.
    const float a[] = {1, 2, 3, 4, 5, 6};           // [2, 3]
    const float b[] = {7, 8, 9, 10, 11, 12};        // [3, 2]
    const float expect[] = {58, 64, 139, 154};      // a·b
    const float expect_t[] = {39, 49, 59, 54, 68, 82, 69, 87, 105};  // aᵀ·bᵀ: [3, 3], aᵀ [3,2] · bᵀ [2,3]
    for (Entry e : {Entry::reference, Entry::scalar_api}) {
        float c[4];
        run_gemm(e, 1.0f, ConstMatrix(a, 2, 3), Trans::no, ConstMatrix(b, 3, 2), Trans::no, 0.0f, Matrix(c, 2, 2));
        for (int i = 0; i < 4; ++i) EXPECT_EQ(c[i], expect[i]) << entry_name(e);
        float ct[9];
        run_gemm(e, 1.0f, ConstMatrix(a, 2, 3), Trans::yes, ConstMatrix(b, 3, 2), Trans::yes, 0.0f, Matrix(ct, 3, 3));
        for (int i = 0; i < 9; ++i) EXPECT_EQ(ct[i], expect_t[i]) << entry_name(e);
    }
}

// ---------------------------------------------------------------------------------------------
// softmax

// Expected probabilities in double for z = scale·x + m0 + m1 over [0, n_valid), and the tolerance.
struct SoftmaxExpect {
    std::vector<double> p, tol;
};
SoftmaxExpect softmax_expect(const std::vector<float>& x, std::size_t n, std::size_t n_valid, float scale,
                             const float* m0, const float* m1) {
    SoftmaxExpect r{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    std::vector<double> z(n_valid), delta(n_valid);
    double zmax = -INFINITY;
    for (std::size_t j = 0; j < n_valid; ++j) {
        const double sx = double(scale) * x[j], a0 = m0 ? m0[j] : 0.0, a1 = m1 ? m1[j] : 0.0;
        z[j] = sx + a0 + a1;
        delta[j] = 3 * kU * (std::abs(sx) + std::abs(a0) + std::abs(a1));
        zmax = std::max(zmax, z[j]);
    }
    if (zmax == -INFINITY) return r;  // every entry masked: all zeros
    double sum = 0.0, dmax = 0.0;
    for (std::size_t j = 0; j < n_valid; ++j) {
        if (z[j] == -INFINITY) continue;
        sum += std::exp(z[j] - zmax);
        dmax = std::max(dmax, delta[j] + kU * std::abs(z[j] - zmax));
    }
    for (std::size_t j = 0; j < n_valid; ++j) {
        r.p[j] = z[j] == -INFINITY ? 0.0 : std::exp(z[j] - zmax) / sum;
        r.tol[j] = 2.0 * r.p[j] * (2.0 * dmax + (double(n_valid) + 4) * kU);
    }
    return r;
}

void run_softmax_row(Entry e, float* x, std::size_t n, std::size_t n_valid, float scale, const float* m0,
                     const float* m1) {
    if (e == Entry::reference) {
        mha::reference::softmax_row(x, n, n_valid, scale, m0, m1);
    } else {
        // The public wrapper has one mask and no n_valid; callers below only use it that way.
        ASSERT_TRUE(m1 == nullptr && n_valid == n);
        mha::softmax_rows(Matrix(x, 1, n), scale, ConstMatrix(m0, m0 ? 1 : 0, n), Backend::scalar);
    }
}

void expect_softmax(const std::vector<float>& got, const SoftmaxExpect& ex) {
    double total = 0.0;
    for (std::size_t j = 0; j < got.size(); ++j) {
        ASSERT_LE(std::abs(got[j] - ex.p[j]), ex.tol[j]) << "j=" << j << " got " << got[j] << " expected " << ex.p[j];
        total += got[j];
    }
    // Σ fl(e_j / S) with S = fl(Σ e): within (n + 2)·u of 1 (summed here in double).
    EXPECT_LE(std::abs(total - 1.0), (double(got.size()) + 2) * kU);
}

TEST(ReferenceSoftmax, ScaleAndMasks) {
    const std::size_t ns[] = {1, 2, 7, 16, 33, 100};
    std::uint32_t seed = 100;
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (std::size_t n : ns)
            for (int masks = 0; masks <= 2; ++masks) {
                if (e == Entry::scalar_api && masks == 2) continue;  // the public wrapper takes one mask
                SCOPED_TRACE(testing::Message() << entry_name(e) << " n=" << n << " masks=" << masks);
                const auto x0 = random_floats(n, -4.0f, 4.0f, seed++);
                auto m0 = random_floats(n, -2.0f, 2.0f, seed++), m1 = random_floats(n, -1.0f, 1.0f, seed++);
                if (n > 2) m0[1] = -kInf;  // a masked column
                if (n > 5) m1[4] = -kInf;
                const float scale = 0.37f;
                const float* p0 = masks >= 1 ? m0.data() : nullptr;
                const float* p1 = masks >= 2 ? m1.data() : nullptr;
                std::vector<float> x = x0;
                run_softmax_row(e, x.data(), n, n, scale, p0, p1);
                const auto ex = softmax_expect(x0, n, n, scale, p0, p1);
                expect_softmax(x, ex);
                if (n > 2 && masks >= 1) {
                    EXPECT_EQ(x[1], 0.0f);
                }
                if (n > 5 && masks >= 2) {
                    EXPECT_EQ(x[4], 0.0f);
                }
            }
}

TEST(ReferenceSoftmax, NValidBelowNIgnoresTheTail) {
    // Entries at or past n_valid are neither read (NaN there) nor kept: they become exactly 0.
    const std::size_t n = 13, n_valid = 9;
    auto x0 = random_floats(n, -3.0f, 3.0f, 200);
    auto m0 = random_floats(n, -1.0f, 1.0f, 201), m1 = random_floats(n, -1.0f, 1.0f, 202);
    for (std::size_t j = n_valid; j < n; ++j) x0[j] = m0[j] = m1[j] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x = x0;
    mha::reference::softmax_row(x.data(), n, n_valid, 2.0f, m0.data(), m1.data());
    const auto ex = softmax_expect(x0, n, n_valid, 2.0f, m0.data(), m1.data());
    expect_softmax(x, ex);
    for (std::size_t j = n_valid; j < n; ++j) EXPECT_EQ(std::bit_cast<std::uint32_t>(x[j]), 0u) << j;  // +0
}

TEST(ReferenceSoftmax, AllMinusInfRowBecomesZeros) {
    const std::size_t n = 7;
    const std::vector<float> inf_mask(n, -kInf);
    for (Entry e : {Entry::reference, Entry::scalar_api}) {
        // Through the mask.
        std::vector<float> x = random_floats(n, -1.0f, 1.0f, 300);
        run_softmax_row(e, x.data(), n, n, 1.0f, inf_mask.data(), nullptr);
        for (float v : x) EXPECT_EQ(std::bit_cast<std::uint32_t>(v), 0u) << entry_name(e);
        // In the input itself.
        std::vector<float> y(n, -kInf);
        run_softmax_row(e, y.data(), n, n, 1.0f, nullptr, nullptr);
        for (float v : y) EXPECT_EQ(std::bit_cast<std::uint32_t>(v), 0u) << entry_name(e);
    }
    // n_valid == 0: nothing valid, the whole row is 0.
    std::vector<float> z = random_floats(n, -1.0f, 1.0f, 301);
    mha::reference::softmax_row(z.data(), n, 0, 1.0f, nullptr, nullptr);
    for (float v : z) EXPECT_EQ(v, 0.0f);
}

TEST(ReferenceSoftmax, LargeInputsDoNotOverflow) {
    // exp(100) overflows float; only a max-subtracted softmax stays finite.
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (std::size_t n : {3u, 17u, 64u}) {
            const auto x0 = random_floats(n, 90.0f, 100.0f, 400 + std::uint32_t(n));
            std::vector<float> x = x0;
            run_softmax_row(e, x.data(), n, n, 1.0f, nullptr, nullptr);
            for (float v : x) ASSERT_TRUE(std::isfinite(v));
            expect_softmax(x, softmax_expect(x0, n, n, 1.0f, nullptr, nullptr));
        }
}

TEST(ReferenceSoftmax, PublicWrapperStridedRows) {
    // 5 rows of 11 in stride 16 (NaN padding), a mask with stride 13: padding untouched, rows right.
    const std::size_t rows = 5, cols = 11;
    Stored x(rows, cols, 16, -5.0f, 5.0f, 500);
    Stored mask(rows, cols, 13, -1.0f, 1.0f, 501);
    mask.mem[2 * 13 + 3] = -kInf;
    for (std::size_t j = 0; j < cols; ++j) mask.mem[4 * 13 + j] = -kInf;  // row 4 fully masked
    const Stored x0 = x;
    mha::softmax_rows(x.view(), 0.5f, mask.cview(), Backend::scalar);
    EXPECT_TRUE(x.padding_untouched());
    for (std::size_t i = 0; i < rows; ++i) {
        SCOPED_TRACE(testing::Message() << "row " << i);
        std::vector<float> in(cols), got(cols);
        for (std::size_t j = 0; j < cols; ++j) in[j] = x0.at(i, j), got[j] = x.at(i, j);
        if (i == 4) {
            for (float v : got) EXPECT_EQ(v, 0.0f);
            continue;
        }
        expect_softmax(got, softmax_expect(in, cols, cols, 0.5f, mask.mem.data() + i * 13, nullptr));
    }
    EXPECT_EQ(x.at(2, 3), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// layernorm

// Checks y against the double-precision layernorm of z = x (+ residual), with the bound above.
void expect_layernorm(const float* y, const float* x, const float* res, std::size_t n, const float* gamma,
                      const float* beta, float eps) {
    std::vector<double> z(n);
    double mean = 0.0, zmax = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
        z[j] = double(x[j]) + (res ? double(res[j]) : 0.0);
        mean += z[j];
        zmax = std::max(zmax, std::abs(z[j]));
    }
    mean /= double(n);
    double var = 0.0;
    for (std::size_t j = 0; j < n; ++j) var += (z[j] - mean) * (z[j] - mean);
    var /= double(n);
    const double r = 1.0 / std::sqrt(var + double(eps));
    for (std::size_t j = 0; j < n; ++j) {
        const double g = gamma ? gamma[j] : 1.0, b = beta ? beta[j] : 0.0;
        const double expect = g * (z[j] - mean) * r + b;
        const double tol = kU * std::abs(expect) +
                           2.0 * (double(n) + 8) * kUd *
                               (std::abs(g) * r * (zmax + std::abs(z[j] - mean)) + std::abs(expect) + std::abs(b));
        ASSERT_LE(std::abs(double(y[j]) - expect), tol) << "j=" << j << " got " << y[j] << " expected " << expect;
    }
}

void run_layernorm_row(Entry e, float* y, const float* x, const float* res, std::size_t n, const float* gamma,
                       const float* beta, float eps) {
    if (e == Entry::reference)
        mha::reference::layernorm_row(y, x, res, n, gamma, beta, eps);
    else
        mha::layernorm_rows(ConstMatrix(x, 1, n), Matrix(y, 1, n), gamma, beta, eps,
                            ConstMatrix(res, res ? 1 : 0, n), Backend::scalar);
}

TEST(ReferenceLayernorm, ResidualGammaBeta) {
    std::uint32_t seed = 600;
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (std::size_t n : {1u, 3u, 8u, 33u, 100u})
            for (int variant = 0; variant < 8; ++variant) {
                const bool use_res = variant & 1, use_gamma = variant & 2, use_beta = variant & 4;
                SCOPED_TRACE(testing::Message() << entry_name(e) << " n=" << n << " residual=" << use_res
                                                << " gamma=" << use_gamma << " beta=" << use_beta);
                const auto x = random_floats(n, -3.0f, 5.0f, seed++), res = random_floats(n, -1.0f, 1.0f, seed++);
                const auto g = random_floats(n, 0.5f, 2.0f, seed++), b = random_floats(n, -1.0f, 1.0f, seed++);
                std::vector<float> y(n, kSentinel);
                const float* rp = use_res ? res.data() : nullptr;
                const float* gp = use_gamma ? g.data() : nullptr;
                const float* bp = use_beta ? b.data() : nullptr;
                run_layernorm_row(e, y.data(), x.data(), rp, n, gp, bp, 1e-5f);
                expect_layernorm(y.data(), x.data(), rp, n, gp, bp, 1e-5f);
            }
}

TEST(ReferenceLayernorm, LargeMeanUnitVariance) {
    // Mean 1e4, unit variance: a one-pass E[z²] − E[z]² loses everything here (ulp(1e8) = 8).
    std::mt19937 gen(700);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (std::size_t n : {16u, 64u, 768u}) {
            std::vector<float> x(n), y(n);
            for (float& v : x) v = 1e4f + dist(gen);
            run_layernorm_row(e, y.data(), x.data(), nullptr, n, nullptr, nullptr, 1e-12f);
            expect_layernorm(y.data(), x.data(), nullptr, n, nullptr, nullptr, 1e-12f);
            // Same through the residual: z = (1e4 + noise) + (−5e3).
            std::vector<float> res(n, -5e3f);
            run_layernorm_row(e, y.data(), x.data(), res.data(), n, nullptr, nullptr, 1e-12f);
            expect_layernorm(y.data(), x.data(), res.data(), n, nullptr, nullptr, 1e-12f);
        }
}

TEST(ReferenceLayernorm, ConstantRowGivesBeta) {
    // z − mean is exactly 0 for a constant row, so y is beta exactly, even with eps = 1e-12 (seed 000).
    for (Entry e : {Entry::reference, Entry::scalar_api})
        for (std::size_t n : {1u, 7u, 64u, 100u})
            for (float c : {0.1f, 1.3f, -7.25f, 10000.3f})
                for (float eps : {1e-12f, 1e-5f}) {
                    SCOPED_TRACE(testing::Message() << entry_name(e) << " n=" << n << " c=" << c << " eps=" << eps);
                    const std::vector<float> x(n, c);
                    const auto g = random_floats(n, 0.5f, 2.0f, 800), b = random_floats(n, -1.0f, 1.0f, 801);
                    std::vector<float> y(n);
                    run_layernorm_row(e, y.data(), x.data(), nullptr, n, g.data(), b.data(), eps);
                    for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(y[j], b[j]) << j;
                    run_layernorm_row(e, y.data(), x.data(), nullptr, n, g.data(), nullptr, eps);
                    for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(y[j], 0.0f) << j;
                    // Constant through the residual: x + residual = c everywhere.
                    std::vector<float> xs(n), rs(n);
                    for (std::size_t j = 0; j < n; ++j) xs[j] = float(j), rs[j] = c - float(j);
                    bool representable = true;  // c − j must be exact in float for z to be constant
                    for (std::size_t j = 0; j < n; ++j) representable &= double(rs[j]) + double(xs[j]) == double(c);
                    if (!representable) continue;
                    run_layernorm_row(e, y.data(), xs.data(), rs.data(), n, g.data(), b.data(), eps);
                    for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(y[j], b[j]) << j;
                }
}

TEST(ReferenceLayernorm, InPlaceOnInputAndOnResidual) {
    const std::size_t n = 37;
    const auto x = random_floats(n, -2.0f, 2.0f, 900), res = random_floats(n, -2.0f, 2.0f, 901);
    const auto g = random_floats(n, 0.5f, 2.0f, 902), b = random_floats(n, -1.0f, 1.0f, 903);
    for (Entry e : {Entry::reference, Entry::scalar_api}) {
        SCOPED_TRACE(entry_name(e));
        std::vector<float> separate(n);
        run_layernorm_row(e, separate.data(), x.data(), res.data(), n, g.data(), b.data(), 1e-5f);
        expect_layernorm(separate.data(), x.data(), res.data(), n, g.data(), b.data(), 1e-5f);
        std::vector<float> on_x = x;  // y == x
        run_layernorm_row(e, on_x.data(), on_x.data(), res.data(), n, g.data(), b.data(), 1e-5f);
        EXPECT_EQ(on_x, separate);
        std::vector<float> on_res = res;  // y == residual
        run_layernorm_row(e, on_res.data(), x.data(), on_res.data(), n, g.data(), b.data(), 1e-5f);
        EXPECT_EQ(on_res, separate);
    }
}

TEST(ReferenceLayernorm, PublicWrapperStridedRows) {
    const std::size_t rows = 4, cols = 19;
    const Stored x(rows, cols, 23, -3.0f, 3.0f, 1000), res(rows, cols, 20, -1.0f, 1.0f, 1001);
    Stored y(rows, cols, 25, 0.0f, 0.0f, 1002);
    const auto g = random_floats(cols, 0.5f, 2.0f, 1003), b = random_floats(cols, -1.0f, 1.0f, 1004);
    mha::layernorm_rows(x.cview(), y.view(), g.data(), b.data(), 1e-6f, res.cview(), Backend::scalar);
    EXPECT_TRUE(y.padding_untouched());
    for (std::size_t i = 0; i < rows; ++i)
        expect_layernorm(y.mem.data() + i * 25, x.mem.data() + i * 23, res.mem.data() + i * 20, cols, g.data(),
                         b.data(), 1e-6f);
}

}  // namespace
