// The bf16 GEMM (simd::gemm_bf16 on vdpbf16ps or BFDOT, pack_panels_bf16, Bf16PackedMatrix) against a double
// loop over the bf16-rounded operands (mha::round_to_bf16). Runs only where the CPU has AVX512_BF16 or
// FEAT_BF16 (elsewhere the layer rounds and runs the fp32 GEMM, tested in test_bf16_attention.cpp).
// Covered: row tails m = 1..MR+1 and more, column tails n = 1..33 and N above NC, k odd and even, below and
// above KC (one to three k-blocks), strided operands with NaN sentinels in the padding (never read or
// written), beta = 0 over NaN, alpha and beta, bias, both layouts of op(B) packing to the same panels,
// row splits bitwise equal to one call, one and two rows (several B panels per tile) bitwise equal to the same rows
// in a longer call, Bf16PackedMatrix segments and unpack.
//
// Error bound. The products of two bf16 values are exact in fp32; vdpbf16ps adds a pair of them to the
// fp32 accumulator with at most two roundings, so the K-term sum carries at most K roundings of a partial
// sum, as the fp32 GEMM's FMA chain does: with signed independent inputs in [-1, 1] the test uses the fp32
// GEMM's bound (test_simd_gemm.cpp), |Δ| ≤ 2·eps·(K·|alpha|·max|a|·max|b| + |beta|·max|c0| + max|bias|).
// Rounding the operands to bf16 changes a K = 768 dot product by ~√K·2^-9·E|ab| ≈ 0.01, far above that
// bound: BoundSeesTheRounding checks that the unrounded product fails it, so the test tells bf16 operands
// from fp32 ones and from a wrong rounding. BFDOT (AArch64) rounds to odd: below eps per rounding instead
// of eps/2, so the errors' standard deviation doubles (K·eps/7.5 in test_simd_gemm.cpp's model) and the
// bound is still 15 of them.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <mha/mha.hpp>

#include "isa_test_util.hpp"
#include "simd/gemm_bf16.hpp"

namespace {

using mha::ConstMatrix;
using mha::Matrix;
using mha::Trans;
using mha::simd::Bf16Panels;

constexpr double kEps = std::numeric_limits<float>::epsilon();
const float kSentinel = std::bit_cast<float>(0x7fc0beefu);

class SimdGemmBf16 : public ::testing::Test {
protected:
    void SetUp() override {
        if (!mha::simd::bf16_kernels_available()) GTEST_SKIP() << "this CPU has no AVX512_BF16 / FEAT_BF16";
    }
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

// 64-byte aligned uint16 storage.
struct Aligned16 {
    std::vector<std::uint16_t> buf;
    std::uint16_t* p;
    explicit Aligned16(std::size_t n) : buf(n + 32, 0xdead) {
        p = reinterpret_cast<std::uint16_t*>((reinterpret_cast<std::uintptr_t>(buf.data()) + 63) / 64 * 64);
    }
};

struct Case {
    std::size_t m, n, k;
    float alpha = 1.0f, beta = 0.0f;
    bool bias = false;
    Trans tb = Trans::yes;
};

// Runs one case with strided A, B and C (padding = sentinels) and checks every element against the bound,
// and that no padding float of C changed. `rounded` = false compares with the unrounded product instead
// (returns the number of elements outside the bound).
std::size_t run_case(const Case& t, bool rounded = true, bool expect_pass = true) {
    const std::size_t lda = t.k + 3, ldc = t.n + 5;
    const std::size_t brows = t.tb == Trans::yes ? t.n : t.k, bcols = t.tb == Trans::yes ? t.k : t.n, ldb = bcols + 7;
    auto a = random_floats(t.m * lda, 11), b = random_floats(brows * ldb, 12), c0 = random_floats(t.m * ldc, 13),
         bias = random_floats(t.n, 14);
    for (std::size_t i = 0; i < t.m; ++i)
        for (std::size_t j = t.k; j < lda; ++j) a[i * lda + j] = kSentinel;
    for (std::size_t i = 0; i < brows; ++i)
        for (std::size_t j = bcols; j < ldb; ++j) b[i * ldb + j] = kSentinel;
    for (std::size_t i = 0; i < t.m; ++i)
        for (std::size_t j = t.n; j < ldc; ++j) c0[i * ldc + j] = kSentinel;
    std::vector<float> c = c0;
    if (t.beta == 0.0f)
        for (std::size_t i = 0; i < t.m; ++i)
            for (std::size_t j = 0; j < t.n; ++j) c[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();

    const std::size_t stride = Bf16Panels::min_panel_stride(t.k) + 32;  // a padded stride works too
    Aligned16 panels(Bf16Panels::elements(t.n, stride));
    mha::simd::pack_panels_bf16(ConstMatrix(b.data(), brows, bcols, ldb), t.tb, panels.p, stride);
    mha::simd::gemm_bf16(t.alpha, ConstMatrix(a.data(), t.m, t.k, lda), Bf16Panels{panels.p, t.k, t.n, stride}, t.beta,
                         t.bias ? bias.data() : nullptr, Matrix(c.data(), t.m, t.n, ldc));

    const auto r = [&](float x) { return rounded ? double(mha::round_to_bf16(x)) : double(x); };
    const double bound = 2.0 * kEps * (double(t.k) * std::fabs(t.alpha) + std::fabs(t.beta) + (t.bias ? 1.0 : 0.0));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < t.m; ++i) {
        for (std::size_t j = 0; j < t.n; ++j) {
            double s = 0.0;
            for (std::size_t p = 0; p < t.k; ++p)
                s += r(a[i * lda + p]) * r(t.tb == Trans::yes ? b[j * ldb + p] : b[p * ldb + j]);
            double want = double(t.alpha) * s + (t.beta != 0.0f ? double(t.beta) * c0[i * ldc + j] : 0.0);
            if (t.bias) want += bias[j];
            const double got = c[i * ldc + j];
            if (!(std::fabs(got - want) <= bound)) {
                ++bad;
                if (expect_pass && bad <= 3)
                    ADD_FAILURE() << "m " << t.m << " n " << t.n << " k " << t.k << " at (" << i << ", " << j
                                  << "): " << got << " vs " << want << " bound " << bound;
            }
        }
        for (std::size_t j = t.n; j < ldc; ++j)
            if (std::bit_cast<std::uint32_t>(c[i * ldc + j]) != 0x7fc0beefu) {
                ADD_FAILURE() << "padding of C written at (" << i << ", " << j << ")";
                return bad + 1;
            }
    }
    return bad;
}

TEST_F(SimdGemmBf16, RowAndColumnTails) {
    for (std::size_t m : {1, 2, 7, 8, 9, 17})
        for (std::size_t n : {1, 15, 16, 17, 31, 32, 33, 65}) run_case({m, n, 37});
}

// One and two rows take four / two full B panels per tile where n has them (AVX512_BF16), then single panels.
TEST_F(SimdGemmBf16, FewRowsWideNAgainstTheBound) {
    for (std::size_t m : {1, 2})
        for (std::size_t n : {127, 128, 129, 200, 257}) run_case({m, n, 37});
    run_case({1, 300, 1100, 0.75f, 0.5f, true});
    run_case({2, 160, 2049, -1.5f, 0.0f, true, Trans::no});
}

TEST_F(SimdGemmBf16, KOddEvenAndBlocks) {
    for (std::size_t k : {1, 2, 3, 31, 32, 33, 768, 1023, 1024, 1025, 2049, 3001}) run_case({9, 40, k});
}

TEST_F(SimdGemmBf16, WideNAlphaBetaBias) {
    run_case({20, 600, 70, 0.5f, 0.0f, true});
    run_case({13, 70, 90, -1.5f, 0.75f, true});
    run_case({5, 33, 129, 1.0f, -2.0f, false});
}

TEST_F(SimdGemmBf16, BNotTransposed) {
    for (std::size_t k : {1, 2, 5, 64, 1025})
        for (std::size_t n : {1, 16, 17, 40}) run_case({9, n, k, 1.0f, 0.0f, false, Trans::no});
}

TEST_F(SimdGemmBf16, BoundSeesTheRounding) {
    // The same product without rounding the operands misses the bound almost everywhere.
    EXPECT_GT(run_case({8, 32, 768}, /*rounded=*/false, /*expect_pass=*/false), 200u);
}

TEST_F(SimdGemmBf16, BothLayoutsPackTheSamePanels) {
    for (std::size_t k : {1, 6, 33}) {
        const std::size_t n = 45;
        const auto bt = random_floats(n * k, 3);  // [n, k]: op(B) = btᵀ
        std::vector<float> b(k * n);              // the same op(B) stored [k, n]
        for (std::size_t j = 0; j < n; ++j)
            for (std::size_t p = 0; p < k; ++p) b[p * n + j] = bt[j * k + p];
        const std::size_t stride = Bf16Panels::min_panel_stride(k), elems = Bf16Panels::elements(n, stride);
        Aligned16 x(elems), y(elems);
        mha::simd::pack_panels_bf16(ConstMatrix(bt.data(), n, k), Trans::yes, x.p, stride);
        mha::simd::pack_panels_bf16(ConstMatrix(b.data(), k, n), Trans::no, y.p, stride);
        EXPECT_EQ(std::memcmp(x.p, y.p, elems * 2), 0) << "k " << k;
        // Element (p, j) where the layout says, rounded to nearest even; padding zero.
        for (std::size_t j = 0; j < 64; ++j)
            for (std::size_t p = 0; p < (k + 1) / 2 * 2; ++p) {
                const std::uint16_t got = x.p[j / 32 * stride + p / 2 * 64 + 2 * (j % 32) + p % 2];
                const std::uint16_t want = j < n && p < k ? mha::bfloat16::from_float(bt[j * k + p]).bits : 0;
                ASSERT_EQ(got, want) << "(" << p << ", " << j << ")";
            }
    }
}

TEST_F(SimdGemmBf16, RowSplitsAreBitwiseEqual) {
    const std::size_t m = 50, n = 70, k = 1100;
    const auto a = random_floats(m * k, 5), w = random_floats(n * k, 6);
    const mha::simd::Bf16PackedMatrix packed({ConstMatrix(w.data(), n, k)}, Trans::yes);
    std::vector<float> whole(m * n), split(m * n);
    mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data(), m, k), packed.all(), 0.0f, nullptr, Matrix(whole.data(), m, n));
    for (std::size_t r0 = 0, h = 1; r0 < m; r0 += h, h = h % 11 + 3) {
        const std::size_t rows = std::min(h, m - r0);
        mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data() + r0 * k, rows, k), packed.all(), 0.0f, nullptr,
                             Matrix(split.data() + r0 * n, rows, n));
    }
    EXPECT_EQ(std::memcmp(whole.data(), split.data(), whole.size() * 4), 0);
}

// One or two rows alone (several B panels per tile) give the bits of the same rows inside a call of more rows
// (one panel per tile): n with one to five full panels plus tails, one to three k-blocks, alpha, beta and bias,
// A given as fp32 and packed (pack_a_bf16); C's padding and the rows not asked for are not written.
TEST_F(SimdGemmBf16, FewRowsTakeWidePanelsWithTheSameBits) {
    for (std::size_t m : {std::size_t(1), std::size_t(2)})
        for (std::size_t n : {std::size_t(64), std::size_t(128), std::size_t(150), std::size_t(260)})
            for (std::size_t k : {std::size_t(5), std::size_t(1100), std::size_t(2049)})
                for (float beta : {0.5f, 0.0f}) {  // beta 0: C holds NaN, never read
                    SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k << " beta " << beta);
                    const std::size_t big = m + 9, ldc = n + 3;
                    const auto a = random_floats(big * k, 21), w = random_floats(n * k, 22), bias = random_floats(n, 23);
                    auto c0 = random_floats(big * ldc, 24);
                    for (std::size_t i = 0; i < big; ++i)
                        for (std::size_t j = 0; j < ldc; ++j)
                            if (j >= n)
                                c0[i * ldc + j] = kSentinel;
                            else if (beta == 0.0f)
                                c0[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
                    const mha::simd::Bf16PackedMatrix packed({ConstMatrix(w.data(), n, k)}, Trans::yes);
                    std::vector<float> all = c0, few = c0, few_packed = c0;
                    mha::simd::gemm_bf16(0.75f, ConstMatrix(a.data(), big, k), packed.all(), beta, bias.data(),
                                         Matrix(all.data(), big, n, ldc));
                    const std::size_t r0 = 4;  // rows [4, 4 + m) alone
                    mha::simd::gemm_bf16(0.75f, ConstMatrix(a.data() + r0 * k, m, k), packed.all(), beta, bias.data(),
                                         Matrix(few.data() + r0 * ldc, m, n, ldc));
                    Aligned16 pa(mha::simd::gemm_bf16_packed_a_elements(m, k));
                    mha::simd::pack_a_bf16(ConstMatrix(a.data() + r0 * k, m, k), pa.p);
                    mha::simd::gemm_bf16_packed_a(0.75f, pa.p, m, k, packed.all(), beta, bias.data(),
                                                  Matrix(few_packed.data() + r0 * ldc, m, n, ldc));
                    for (std::size_t i = r0; i < r0 + m; ++i)
                        for (std::size_t j = 0; j < n; ++j) ASSERT_FALSE(std::isnan(all[i * ldc + j])) << "(" << i << ", " << j << ")";
                    for (std::size_t i = 0; i < big; ++i) {
                        const auto& want = i >= r0 && i < r0 + m ? all : c0;
                        EXPECT_EQ(std::memcmp(few.data() + i * ldc, want.data() + i * ldc, ldc * 4), 0) << "row " << i;
                        EXPECT_EQ(std::memcmp(few_packed.data() + i * ldc, want.data() + i * ldc, ldc * 4), 0) << "packed A, row " << i;
                    }
                }
}

// A packed once (pack_a_bf16) and used by calls on column blocks of B gives the bits of gemm_bf16 on the whole:
// row counts below, at and above one and four row panels (the few-row loop order and the other), k within one
// k-block and across three, an odd k, strided A with NaN padding (never read), bias and beta.
TEST_F(SimdGemmBf16, PackedAEqualsGemmOnColumnBlocks) {
    for (std::size_t m : {std::size_t(1), std::size_t(7), std::size_t(8), std::size_t(32), std::size_t(33), std::size_t(50)})
        for (std::size_t k : {std::size_t(5), std::size_t(64), std::size_t(2049)}) {
            SCOPED_TRACE(::testing::Message() << "m " << m << " k " << k);
            const std::size_t n = 100, lda = k + 3;
            auto a = random_floats(m * lda, 7);
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = k; j < lda; ++j) a[i * lda + j] = kSentinel;
            const auto w = random_floats(n * k, 8), bias = random_floats(n, 9), c0 = random_floats(m * n, 10);
            const mha::simd::Bf16PackedMatrix packed({ConstMatrix(w.data(), n, k)}, Trans::yes);
            std::vector<float> whole = c0, blocks = c0;
            mha::simd::gemm_bf16(0.5f, ConstMatrix(a.data(), m, k, lda), packed.all(), 0.25f, bias.data(), Matrix(whole.data(), m, n));
            Aligned16 pa(mha::simd::gemm_bf16_packed_a_elements(m, k));
            mha::simd::pack_a_bf16(ConstMatrix(a.data(), m, k, lda), pa.p);
            for (std::size_t c0j = 0; c0j < n; c0j += 32) {
                const std::size_t nc = std::min<std::size_t>(32, n - c0j);
                mha::simd::gemm_bf16_packed_a(0.5f, pa.p, m, k, packed.all().columns(c0j, nc), 0.25f, bias.data() + c0j,
                                              Matrix(blocks.data() + c0j, m, nc, n));
            }
            EXPECT_EQ(std::memcmp(whole.data(), blocks.data(), whole.size() * 4), 0);
        }
}

TEST_F(SimdGemmBf16, PackedMatrixSegmentsAndUnpack) {
    const std::size_t k = 77;
    const auto w0 = random_floats(64 * k, 7), w1 = random_floats(40 * k, 8), w2 = random_floats(40 * k, 9);
    const mha::simd::Bf16PackedMatrix packed(
        {ConstMatrix(w0.data(), 64, k), ConstMatrix(w1.data(), 40, k), ConstMatrix(w2.data(), 40, k)}, Trans::yes);
    EXPECT_EQ(packed.n(), 144u);
    EXPECT_EQ(packed.k(), k);
    std::vector<float> back(k * 144);
    packed.unpack(Matrix(back.data(), k, 144));
    for (std::size_t p = 0; p < k; ++p)
        for (std::size_t j = 0; j < 144; ++j) {
            const float src = j < 64 ? w0[j * k + p] : j < 104 ? w1[(j - 64) * k + p] : w2[(j - 104) * k + p];
            ASSERT_EQ(back[p * 144 + j], mha::round_to_bf16(src)) << p << ", " << j;
        }
    // Segment 2 alone, and segments 0-1 together (segment 0 is whole panels), give the matching columns.
    const auto a = random_floats(3 * k, 10);
    std::vector<float> all(3 * 144), seg2(3 * 40), seg01(3 * 104);
    mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data(), 3, k), Bf16Panels{packed.segments(0, 1).data, k, 64, packed.segments(0, 1).panel_stride}, 0.0f, nullptr, Matrix(all.data(), 3, 64, 144));
    mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data(), 3, k), packed.segments(0, 2), 0.0f, nullptr, Matrix(seg01.data(), 3, 104));
    mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data(), 3, k), packed.segments(2, 1), 0.0f, nullptr, Matrix(seg2.data(), 3, 40));
    for (std::size_t i = 0; i < 3; ++i) {
        for (std::size_t j = 0; j < 64; ++j) EXPECT_EQ(all[i * 144 + j], seg01[i * 104 + j]);
        for (std::size_t j = 0; j < 40; ++j) {
            double s = 0.0;
            for (std::size_t p = 0; p < k; ++p) s += double(mha::round_to_bf16(a[i * k + p])) * mha::round_to_bf16(w2[j * k + p]);
            EXPECT_NEAR(seg2[i * 40 + j], s, 2.0 * kEps * double(k)) << i << ", " << j;
            s = 0.0;
            for (std::size_t p = 0; p < k; ++p) s += double(mha::round_to_bf16(a[i * k + p])) * mha::round_to_bf16(w1[j * k + p]);
            EXPECT_NEAR(seg01[i * 104 + 64 + j], s, 2.0 * kEps * double(k)) << i << ", " << j;
        }
    }
}

// The public mha::gemm_bf16: every transpose, on every ISA this CPU has (the fallback below the bf16 level runs the
// fp32 GEMM on the rounded operands) and on the scalar backend, against the double product of the rounded values.
TEST(PublicGemmBf16, EveryTransposeIsaAndBackend) {
    const std::size_t m = 19, n = 45, k = 70;
    const auto a = random_floats(m * k, 21), b = random_floats(n * k, 22), c0 = random_floats(m * n, 23);
    const mha::Isa saved = mha::active_isa();
    for (mha::Isa isa : mha_test::cpu_isas(/*with_bf16=*/true)) {
        mha::set_isa_cap(isa);
        for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar})
            for (Trans ta : {Trans::no, Trans::yes})
                for (Trans tb : {Trans::no, Trans::yes}) {
                    SCOPED_TRACE(std::string(mha::isa_name(isa)) + (backend == mha::Backend::scalar ? " scalar" : " simd") +
                                 (ta == Trans::yes ? " Aᵀ" : " A") + (tb == Trans::yes ? " Bᵀ" : " B"));
                    // a and b hold op(A) [m, k] and op(B) [k, n] stored as the transposes say.
                    auto at = [&](std::size_t i, std::size_t p) { return ta == Trans::no ? a[i * k + p] : a[p * m + i]; };
                    auto bt = [&](std::size_t p, std::size_t j) { return tb == Trans::no ? b[p * n + j] : b[j * k + p]; };
                    const ConstMatrix av = ta == Trans::no ? ConstMatrix(a.data(), m, k) : ConstMatrix(a.data(), k, m);
                    const ConstMatrix bv = tb == Trans::no ? ConstMatrix(b.data(), k, n) : ConstMatrix(b.data(), n, k);
                    std::vector<float> c = c0;
                    mha::gemm_bf16(0.5f, av, ta, bv, tb, 2.0f, Matrix(c.data(), m, n), backend);
                    for (std::size_t i = 0; i < m; ++i)
                        for (std::size_t j = 0; j < n; ++j) {
                            double s = 0.0;
                            for (std::size_t p = 0; p < k; ++p) s += double(mha::round_to_bf16(at(i, p))) * mha::round_to_bf16(bt(p, j));
                            const double want = 0.5 * s + 2.0 * c0[i * n + j];
                            ASSERT_NEAR(c[i * n + j], want, 2.0 * kEps * (0.5 * double(k) + 2.0)) << i << ", " << j;
                        }
                }
    }
    mha::set_isa_cap(saved);
    std::vector<float> c(m * n);
    EXPECT_THROW(mha::gemm_bf16(1.0f, ConstMatrix(a.data(), m, k), Trans::no, ConstMatrix(b.data(), n, k + 1), Trans::yes, 0.0f,
                                Matrix(c.data(), m, n)),
                 mha::invalid_argument);
}

}  // namespace
