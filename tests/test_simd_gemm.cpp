// The SIMD GEMM (mha::simd::gemm, PackedMatrix, gemm_packed), run once per ISA this CPU has
// (mha::set_isa_cap; the cap is restored to avx512 after each test), against a double-precision loop.
// Covered: every row tail m = 1..MR+1 and column tail n = 1..NR+1 of the ISA's register tile; k below,
// at and above the k-loop and KC (one, two and three k-blocks); N above NC; all four transposes; odd
// row strides with NaN sentinels in every padding float (A and B padding must not be read, C padding
// must not be written); beta = 0 with NaN in C; alpha != 1, beta != 0; K = 0; prepacked B with and
// without the fused bias, row-split calls bitwise equal to one call; B packed by the caller into
// panels (gemm_panels, bitwise equal to gemm); the attention shapes; concurrent
// calls from several threads.
//
// Error bound. Inputs are independent, uniform in [-1, 1] (signed). Each C element is a K-term dot
// product accumulated by a chain of K fused multiply-adds (one rounding each, at most u·|partial sum|,
// u = eps/2), then alpha·s, + beta·c, + bias, one rounding each. Worst case the chain's error is
// K·u·Σ|a·b| (K² growth), but with signed independent inputs the partial sums s_p stay O(√p) and the
// rounding errors have random signs: their sum has standard deviation u·√(Σ E[s_p²]/3) ≈ K·eps/15 for
// [-1, 1] data, so O(K)·eps·max|a|·max|b|. The test asserts
//   |Δ| ≤ c·eps·(K·|alpha|·max|a|·max|b| + |beta|·max|c0| + max|bias|),  c = 2,
// about 30 standard deviations; the largest error over all cases below (checked once when choosing c)
// was 0.64·K·eps·max|a|·max|b|. A lost or doubled product (|a·b| ~ 0.1..1) or a wrong row or column
// exceeds the bound by orders of magnitude.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "simd/gemm_blocking.hpp"
#include "simd/isa_table.hpp"
#include "simd/round_bf16.hpp"
#include "simd/simd.hpp"

namespace {

using mha::ConstMatrix;
using mha_test::same_bits_or_nan;
using mha::Isa;
using mha::Matrix;
using mha::Trans;

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr double kC = 2.0;  // the constant of the error bound above
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;  // a quiet NaN with a payload, in every padding float
const float kSentinel = std::bit_cast<float>(kSentinelBits);
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInfinity = std::numeric_limits<float>::infinity();

// The ISA's register tile and k-block, for the tail sweeps.
struct Tile {
    std::size_t mr, nr, kc, nc;
};
template <class Arch>
Tile tile_of() {
    using B = mha::simd::GemmBlocking<Arch>;
    return {B::MR, B::NR, B::KC, B::NC};
}
// The tile of the kernels isa runs (the library's own dispatch picks the Arch).
Tile tile_for(Isa isa) {
    return mha::simd::dispatch(isa, [](auto arch) { return tile_of<decltype(arch)>(); });
}

// A row-major matrix with an odd row stride whose padding floats hold the sentinel NaN, plus
// `guard` sentinel floats after the last row.
struct Stored {
    std::size_t rows = 0, cols = 0, stride = 0;
    std::vector<float> buf;

    Stored(std::size_t r, std::size_t c, std::size_t pad, std::mt19937& gen, bool fill_nan = false) : rows(r), cols(c) {
        stride = c + pad;
        if (stride % 2 == 0) ++stride;  // odd, so rows are never all 64-byte aligned
        buf.assign(std::max<std::size_t>(rows * stride, 1) + 17, kSentinel);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) buf[i * stride + j] = fill_nan ? kNaN : dist(gen);
    }
    float& at(std::size_t i, std::size_t j) { return buf[i * stride + j]; }
    float at(std::size_t i, std::size_t j) const { return buf[i * stride + j]; }
    ConstMatrix view() const { return {buf.data(), rows, cols, stride}; }
    Matrix mview() { return {buf.data(), rows, cols, stride}; }
    // Every float outside the [rows, cols] elements still holds the sentinel bits.
    bool padding_intact() const {
        for (std::size_t idx = 0; idx < buf.size(); ++idx) {
            const bool element = idx < rows * stride && idx % stride < cols;
            if (!element && std::bit_cast<std::uint32_t>(buf[idx]) != kSentinelBits) return false;
        }
        return true;
    }
};

// Bitwise equality (the padding holds NaN, which == never matches).
using mha_test::same_bits;

float max_abs(const Stored& m) {
    float r = 0.0f;
    for (std::size_t i = 0; i < m.rows; ++i)
        for (std::size_t j = 0; j < m.cols; ++j) r = std::max(r, std::abs(m.at(i, j)));
    return r;
}

struct Case {
    std::size_t m, n, k;
    Trans ta = Trans::no, tb = Trans::no;
    float alpha = 1.0f, beta = 0.0f;
    std::size_t pad = 3;  // extra floats per row (made odd)
    bool bias = false;
    bool prepacked = false;
    bool nan_c = false;  // C starts as NaN (only with beta == 0)

    std::string str() const {
        return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
               " ta=" + (ta == Trans::yes ? "T" : "N") + " tb=" + (tb == Trans::yes ? "T" : "N") +
               " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) + (bias ? " bias" : "") +
               (prepacked ? " prepacked" : "") + " pad=" + std::to_string(pad);
    }
};

// Runs one case through the SIMD GEMM and checks every element against a double loop, the padding of
// A, B and C, and that A and B are unchanged. Returns the number of failures (stops reporting at 5).
int check_case(const Case& t, unsigned seed) {
    std::mt19937 gen(seed);
    const Stored a(t.ta == Trans::no ? t.m : t.k, t.ta == Trans::no ? t.k : t.m, t.pad, gen);
    const Stored b(t.tb == Trans::no ? t.k : t.n, t.tb == Trans::no ? t.n : t.k, t.pad + 2, gen);
    Stored c(t.m, t.n, t.pad + 4, gen, t.nan_c);
    std::vector<float> bias(t.n);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : bias) x = dist(gen);
    const Stored c0 = c, a0 = a, b0 = b;

    if (t.prepacked) {
        const mha::simd::PackedMatrix packed(b.view(), t.tb);
        EXPECT_EQ(packed.k(), t.k);
        EXPECT_EQ(packed.n(), t.n);
        EXPECT_EQ(packed.isa(), mha::active_isa());
        mha::simd::gemm_packed(t.alpha, a.view(), t.ta, packed, t.beta, t.bias ? bias.data() : nullptr, c.mview());
    } else {
        mha::simd::gemm(t.alpha, a.view(), t.ta, b.view(), t.tb, t.beta, c.mview());
    }

    const double bound = kC * kEps *
                         (double(t.k) * std::abs(t.alpha) * max_abs(a) * max_abs(b) +
                          (t.beta != 0.0f ? std::abs(t.beta) * max_abs(c0) : 0.0) + (t.bias ? 1.0 : 0.0));
    int failures = 0;
    for (std::size_t i = 0; i < t.m; ++i)
        for (std::size_t j = 0; j < t.n; ++j) {
            double s = 0.0;
            for (std::size_t p = 0; p < t.k; ++p)
                s += double(t.ta == Trans::no ? a.at(i, p) : a.at(p, i)) * double(t.tb == Trans::no ? b.at(p, j) : b.at(j, p));
            double want = double(t.alpha) * s;
            if (t.beta != 0.0f) want += double(t.beta) * double(c0.at(i, j));
            if (t.bias) want += double(bias[j]);
            const double got = c.at(i, j);
            if (!(std::abs(got - want) <= bound) && ++failures <= 5)
                ADD_FAILURE() << t.str() << ": C(" << i << ", " << j << ") = " << got << ", want " << want
                              << " (bound " << bound << ")";
        }
    if (!c.padding_intact()) {
        ++failures;
        ADD_FAILURE() << t.str() << ": C's padding was written";
    }
    if (!same_bits(a.buf, a0.buf) || !same_bits(b.buf, b0.buf) || !a.padding_intact() || !b.padding_intact()) {
        ++failures;
        ADD_FAILURE() << t.str() << ": A or B changed";
    }
    return failures;
}

class SimdGemm : public ::testing::TestWithParam<Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa()) GTEST_SKIP() << "this CPU has no " << mha::isa_name(GetParam());
        mha::set_isa_cap(GetParam());
        ASSERT_EQ(mha::active_isa(), GetParam());
        tile = tile_for(GetParam());
    }
    void TearDown() override { mha::set_isa_cap(Isa::avx512_bf16); }
    Tile tile{};
};

constexpr Trans kTrans[] = {Trans::no, Trans::yes};

// Every row and column tail of the register tile, short k (below and above the k loop's unroll and the
// transpose block of 4/8/16) and k past one k-block, all transposes.
TEST_P(SimdGemm, RowAndColumnTails) {
    unsigned seed = 1;
    for (Trans ta : kTrans)
        for (Trans tb : kTrans)
            for (std::size_t m = 1; m <= tile.mr + 1; ++m)
                for (std::size_t n = 1; n <= tile.nr + 1; ++n)
                    for (std::size_t k : {std::size_t(1), std::size_t(5), std::size_t(17)}) {
                        Case t{m, n, k, ta, tb};
                        ASSERT_EQ(check_case(t, seed++), 0) << t.str();
                    }
}

// k around the unroll (1..5, 8), the transpose blocks (15, 16, 17, 33) and KC (one, two, three k-blocks),
// with m and n covering a full tile, two tiles and a tail.
TEST_P(SimdGemm, KSweep) {
    const std::size_t kc = tile.kc;
    unsigned seed = 100;
    for (std::size_t k : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(4), std::size_t(5), std::size_t(8),
                          std::size_t(15), std::size_t(16), std::size_t(17), std::size_t(33), kc - 1, kc, kc + 1,
                          2 * kc + 5})
        for (Trans ta : kTrans)
            for (Trans tb : kTrans) {
                Case t{2 * tile.mr + 3, 2 * tile.nr + 5, k, ta, tb};
                ASSERT_EQ(check_case(t, seed++), 0) << t.str();
            }
}

// N larger than NC (several B blocks), with K over two k-blocks; alpha and beta not 0/1.
TEST_P(SimdGemm, LargeNAndK) {
    unsigned seed = 200;
    for (Trans ta : kTrans)
        for (Trans tb : kTrans) {
            Case t{19, tile.nc * 2 + 37, tile.kc + 300, ta, tb, -0.75f, 0.5f};
            ASSERT_EQ(check_case(t, seed++), 0) << t.str();
        }
}

// beta = 0 must overwrite C without reading it (C full of NaN); alpha != 1; beta != 0 mixes C in.
TEST_P(SimdGemm, AlphaBeta) {
    unsigned seed = 300;
    for (Trans ta : kTrans)
        for (Trans tb : kTrans) {
            Case zero{13, 45, 70, ta, tb, 1.5f, 0.0f};
            zero.nan_c = true;
            ASSERT_EQ(check_case(zero, seed++), 0) << zero.str();
            Case both{13, 45, 70, ta, tb, -2.0f, 0.25f};
            ASSERT_EQ(check_case(both, seed++), 0) << both.str();
            Case one{13, 45, 70, ta, tb, 1.0f, 1.0f};
            ASSERT_EQ(check_case(one, seed++), 0) << one.str();
        }
}

// Different paddings (odd strides from 1 up), including none-extra-but-odd and a long one.
TEST_P(SimdGemm, OddStrides) {
    unsigned seed = 400;
    for (std::size_t pad : {std::size_t(0), std::size_t(1), std::size_t(6), std::size_t(40)})
        for (Trans ta : kTrans)
            for (Trans tb : kTrans) {
                Case t{tile.mr + 1, tile.nr + 3, 37, ta, tb, 1.0f, 0.5f};
                t.pad = pad;
                ASSERT_EQ(check_case(t, seed++), 0) << t.str();
            }
}

// K = 0: C = beta·C (+ bias); M = 0 or N = 0: nothing is touched.
TEST_P(SimdGemm, EmptyDimensions) {
    std::mt19937 gen(500);
    Stored c(5, 7, 3, gen);
    const Stored c0 = c;
    const Stored a(5, 0, 3, gen), b(0, 7, 3, gen);
    mha::simd::gemm(1.0f, a.view(), Trans::no, b.view(), Trans::no, 0.5f, c.mview());
    for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t j = 0; j < 7; ++j) EXPECT_EQ(c.at(i, j), 0.5f * c0.at(i, j));
    Stored nan_c(5, 7, 3, gen, true);
    mha::simd::gemm(1.0f, a.view(), Trans::no, b.view(), Trans::no, 0.0f, nan_c.mview());
    for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t j = 0; j < 7; ++j) EXPECT_EQ(nan_c.at(i, j), 0.0f);

    std::vector<float> bias{1, 2, 3, 4, 5, 6, 7};
    const mha::simd::PackedMatrix empty_k(b.view(), Trans::no);
    Stored cb(5, 7, 3, gen, true);
    mha::simd::gemm_packed(1.0f, a.view(), Trans::no, empty_k, 0.0f, bias.data(), cb.mview());
    for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t j = 0; j < 7; ++j) EXPECT_EQ(cb.at(i, j), bias[j]);

    Stored none(0, 7, 3, gen), none2(5, 0, 3, gen);
    const Stored a0(0, 4, 3, gen), b4(4, 7, 3, gen), a4(5, 4, 3, gen), b0(4, 0, 3, gen);
    mha::simd::gemm(1.0f, a0.view(), Trans::no, b4.view(), Trans::no, 0.0f, none.mview());
    mha::simd::gemm(1.0f, a4.view(), Trans::no, b0.view(), Trans::no, 0.0f, none2.mview());
    EXPECT_TRUE(none.padding_intact());
    EXPECT_TRUE(none2.padding_intact());
}

// Prepacked B with the fused bias (y = x·Wᵀ + b in one call), and without; both op(B) layouts, both op(A).
TEST_P(SimdGemm, PrepackedAndBias) {
    unsigned seed = 600;
    for (Trans ta : kTrans)
        for (Trans tb : kTrans)
            for (bool bias : {false, true})
                for (float beta : {0.0f, 0.5f})
                    for (std::size_t k : {std::size_t(1), std::size_t(17), tile.kc + 1}) {
                        Case t{tile.mr + 2, tile.nr + 7, k, ta, tb, 0.5f, beta};
                        t.bias = bias;
                        t.prepacked = true;
                        t.nan_c = beta == 0.0f;
                        ASSERT_EQ(check_case(t, seed++), 0) << t.str();
                    }
    // Tails of the packed panel layout and several NC blocks.
    for (std::size_t n : {std::size_t(1), tile.nr - 1, tile.nr, tile.nr + 1, tile.nc + tile.nr + 3}) {
        Case t{tile.mr * 3 + 1, n, 50, Trans::no, Trans::yes};
        t.bias = true;
        t.prepacked = true;
        ASSERT_EQ(check_case(t, seed++), 0) << t.str();
    }
}

// Callers split M across threads without repacking: row blocks of any size must give bitwise the rows
// of one whole call (same k order per element).
TEST_P(SimdGemm, PackedRowSplitIsBitwiseEqual) {
    std::mt19937 gen(700);
    const std::size_t m = 61, n = 100, k = tile.kc + 9;
    const Stored x(m, k, 1, gen), w(n, k, 2, gen);
    std::vector<float> bias(n, 0.25f);
    const mha::simd::PackedMatrix packed(w.view(), Trans::yes);
    Stored whole(m, n, 3, gen), split(m, n, 3, gen);
    mha::simd::gemm_packed(1.0f, x.view(), Trans::no, packed, 0.0f, bias.data(), whole.mview());
    for (std::size_t r0 = 0, step = 1; r0 < m; r0 += step, step = step % 13 + 2) {
        const std::size_t rows = std::min(step, m - r0);
        mha::simd::gemm_packed(1.0f, x.view().row_block(r0, rows), Trans::no, packed, 0.0f, bias.data(),
                               split.mview().row_block(r0, rows));
    }
    EXPECT_TRUE(same_bits(whole.buf, split.buf));  // includes the padding
    // The same rows from simd::gemm on the unpacked W (another path to the same per-element sums).
    Stored plain(m, n, 3, gen);
    mha::simd::gemm(1.0f, x.view(), Trans::no, w.view(), Trans::yes, 0.0f, plain.mview());
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(plain.at(i, j) + bias[j], whole.at(i, j)) << i << ", " << j;
}

// One or two rows of A run several B panels per register tile (gemm_impl.hpp, kWidePanels): the same sum per
// element as the one-panel tiles of a longer call, so rows 0..m of a call of m + 5 rows give their bits, for B
// in place, packed, and packed in bf16, over n from one panel to past an NC block with every kind of tail, one
// and two k-blocks, beta and bias; the padding of C is never written (B in panels: PanelOperand).
TEST_P(SimdGemm, FewRowsTakeWidePanelsWithTheSameBits) {
    using mha::simd::PackedMatrix;
    using mha::simd::PanelElement;
    std::mt19937 gen(710);
    for (std::size_t k : {std::size_t(5), tile.kc + 3})
        for (std::size_t n : {tile.nr, 2 * tile.nr + 1, 4 * tile.nr, 5 * tile.nr - 1, 9 * tile.nr + 7, tile.nc + 4 * tile.nr + 3})
            for (std::size_t m : {std::size_t(1), std::size_t(2)}) {
                const Stored a(m + 5, k, 1, gen), b(k, n, 2, gen);
                std::vector<float> bias(n);
                for (auto& x : bias) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
                const PackedMatrix p32(b.view(), Trans::no), p16(b.view(), Trans::no, 1, PanelElement::bf16);
                for (float beta : {0.0f, 0.5f}) {
                    const float* bias_or_null = beta == 0.0f ? bias.data() : nullptr;
                    const Stored c0(m + 5, n, 3, gen);
                    auto both = [&](auto call) {  // the m rows alone, and within the longer call
                        Stored few = c0, many = c0;
                        call(a.view().row_block(0, m), few.mview().row_block(0, m));
                        call(a.view(), many.mview());
                        for (std::size_t i = 0; i < m; ++i)
                            for (std::size_t j = 0; j < n; ++j)
                                ASSERT_EQ(std::bit_cast<std::uint32_t>(few.at(i, j)), std::bit_cast<std::uint32_t>(many.at(i, j)))
                                    << "m " << m << " n " << n << " k " << k << " beta " << beta << " at " << i << ", " << j;
                        for (std::size_t i = m; i < m + 5; ++i)  // the rows not asked for are untouched
                            for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(few.at(i, j), c0.at(i, j));
                        ASSERT_TRUE(few.padding_intact());
                    };
                    both([&](ConstMatrix x, Matrix y) { mha::simd::gemm(0.75f, x, Trans::no, b.view(), Trans::no, beta, y); });
                    both([&](ConstMatrix x, Matrix y) { mha::simd::gemm_packed(0.75f, x, Trans::no, p32, beta, bias_or_null, y); });
                    both([&](ConstMatrix x, Matrix y) { mha::simd::gemm_packed(0.75f, x, Trans::no, p16, beta, bias_or_null, y); });
                }
            }
}

// bf16 panels (PanelElement::bf16) widen each value exactly in the microkernel: a GEMM on them gives bitwise
// what f32 panels of the same values rounded to bf16 give (same products, same k order), for every row and
// column tail, one to three k-blocks, both transposes, beta and bias, and rows split across calls; the panels
// take half the bytes and unpack to the rounded values. Specials (±inf, NaN, a value that rounds to inf, a
// tie) sit in B.
TEST_P(SimdGemm, Bf16PanelsGiveTheBitsOfRoundedF32Panels) {
    using mha::simd::PackedMatrix;
    using mha::simd::PanelElement;
    std::mt19937 gen(650);
    unsigned cases = 0;
    for (Trans ta : kTrans)
        for (Trans tb : kTrans)
            for (std::size_t k : {std::size_t(1), std::size_t(17), tile.kc + 1, 2 * tile.kc + 5})
                for (std::size_t n : {std::size_t(1), tile.nr - 1, tile.nr + 1, tile.nc + tile.nr + 3})
                    for (std::size_t m : {std::size_t(1), tile.mr, tile.mr + 1, 3 * tile.mr + 2}) {
                        if (k > tile.kc && n > tile.nc && m > 1) continue;  // the long shapes once per k and n
                        const Stored a(ta == Trans::no ? m : k, ta == Trans::no ? k : m, 1, gen);
                        Stored b(tb == Trans::no ? k : n, tb == Trans::no ? n : k, 2, gen);
                        const float specials[] = {kInfinity, -kInfinity, kNaN, 3.3961e38f, 1.00390625f, -0.0f};
                        for (std::size_t s = 0; s < 6 && s < b.rows * b.cols; ++s)
                            b.at(s % b.rows, (s * 7) % b.cols) = specials[s];
                        Stored rounded = b;
                        for (std::size_t i = 0; i < b.rows; ++i) mha::simd::round_to_bf16_inplace(&rounded.at(i, 0), b.cols);
                        const PackedMatrix p32(rounded.view(), tb), p16(b.view(), tb, 1, PanelElement::bf16);
                        ASSERT_EQ(p16.element(), PanelElement::bf16);
                        EXPECT_EQ(p16.bytes() * 2, p32.bytes());
                        std::vector<float> bias(n);
                        for (auto& x : bias) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
                        for (float beta : {0.0f, 0.5f}) {
                            const bool with_bias = beta == 0.0f;
                            Stored c32(m, n, 3, gen), c16 = c32, split = c32;
                            const float* bp = with_bias ? bias.data() : nullptr;
                            mha::simd::gemm_packed(0.75f, a.view(), ta, p32, beta, bp, c32.mview());
                            mha::simd::gemm_packed(0.75f, a.view(), ta, p16, beta, bp, c16.mview());
                            ASSERT_TRUE(same_bits_or_nan(c32.buf, c16.buf)) << "m=" << m << " n=" << n << " k=" << k;
                            ASSERT_TRUE(c16.padding_intact());
                            if (ta == Trans::no && m > 1) {  // row blocks of one call
                                const std::size_t half = m / 2;
                                mha::simd::gemm_packed(0.75f, a.view().row_block(0, half), ta, p16, beta, bp,
                                                       split.mview().row_block(0, half));
                                mha::simd::gemm_packed(0.75f, a.view().row_block(half, m - half), ta, p16, beta, bp,
                                                       split.mview().row_block(half, m - half));
                                ASSERT_TRUE(same_bits_or_nan(c32.buf, split.buf)) << "split m=" << m << " n=" << n << " k=" << k;
                                ASSERT_TRUE(split.padding_intact());
                            }
                            ++cases;
                        }
                        const std::size_t kk = tb == Trans::no ? k : n, nn = tb == Trans::no ? n : k;
                        std::vector<float> back(kk * nn), want(kk * nn);
                        p16.unpack(Matrix(back.data(), b.rows, b.cols, b.cols), tb);
                        for (std::size_t i = 0; i < b.rows; ++i)
                            for (std::size_t j = 0; j < b.cols; ++j) want[i * b.cols + j] = rounded.at(i, j);
                        ASSERT_EQ(std::memcmp(back.data(), want.data(), back.size() * sizeof(float)), 0) << "unpack";
                    }
    EXPECT_GT(cases, 200u);
    // Segments from parts (the layer's Wq, Wk, Wv) and a column block of a segment: the views of f32 panels.
    const std::size_t k = tile.kc + 3, m = tile.mr + 1;
    const Stored x(m, k, 1, gen), wq(2 * tile.nr + 3, k, 1, gen), wk(tile.nr + 5, k, 1, gen);
    Stored rq = wq, rk = wk;
    for (std::size_t i = 0; i < wq.rows; ++i) mha::simd::round_to_bf16_inplace(&rq.at(i, 0), wq.cols);
    for (std::size_t i = 0; i < wk.rows; ++i) mha::simd::round_to_bf16_inplace(&rk.at(i, 0), wk.cols);
    const PackedMatrix s32({rq.view(), rk.view()}, Trans::yes), s16({wq.view(), wk.view()}, Trans::yes, PanelElement::bf16);
    for (std::size_t first = 0; first < 2; ++first) {
        const PackedMatrix::View v32 = s32.segments(first, 2 - first), v16 = s16.segments(first, 2 - first);
        ASSERT_NE(v16.data16, nullptr);
        ASSERT_EQ(v16.data, nullptr);
        Stored c32(m, v32.n, 2, gen), c16 = c32;
        mha::simd::gemm_packed(1.0f, x.view(), Trans::no, v32, 0.0f, nullptr, c32.mview());
        mha::simd::gemm_packed(1.0f, x.view(), Trans::no, v16, 0.0f, nullptr, c16.mview());
        EXPECT_TRUE(same_bits(c32.buf, c16.buf)) << "segments from " << first;
        const std::size_t c0 = tile.nr, nc = v32.n - tile.nr;  // the columns past the first panel
        Stored b32(m, nc, 2, gen), b16 = b32;
        mha::simd::gemm_packed(1.0f, x.view(), Trans::no, PackedMatrix::columns(v32, c0, nc), 0.0f, nullptr, b32.mview());
        mha::simd::gemm_packed(1.0f, x.view(), Trans::no, PackedMatrix::columns(v16, c0, nc), 0.0f, nullptr, b16.mview());
        EXPECT_TRUE(same_bits(b32.buf, b16.buf)) << "columns of segments from " << first;
    }
}

// A B operand packed once into panels (fused attention's K_hᵀ and V_h): gemm_panels gives bitwise what
// gemm gives on the unpacked B (same k order per element), for whole matrices, row blocks of op(B)
// (packed piecewise at an offset, as the attention packs key blocks) and column blocks starting at a
// panel; columns past n in the last panel are zero and never reach C. One and two rows of A too (several panels
// per register tile).
TEST_P(SimdGemm, PanelOperand) {
    std::mt19937 gen(900);
    const Isa isa = GetParam();
    const std::size_t nr = mha::simd::PanelMatrix::panel_width(isa);
    ASSERT_EQ(nr, tile.nr);
    for (Trans ta : kTrans)
        for (Trans tb : kTrans)
            for (std::size_t k : {std::size_t(1), std::size_t(17), std::size_t(64), tile.kc + 9})
                for (std::size_t n : {std::size_t(1), nr - 1, nr, 3 * nr + 5, 5 * nr + 3})
                for (std::size_t m : {std::size_t(1), std::size_t(2), tile.mr * 2 + 3}) {
                    SCOPED_TRACE(::testing::Message() << "k=" << k << " n=" << n << " m=" << m << " ta=" << (ta == Trans::yes)
                                                      << " tb=" << (tb == Trans::yes));
                    const Stored a(ta == Trans::no ? m : k, ta == Trans::no ? k : m, 3, gen);
                    const Stored b(tb == Trans::no ? k : n, tb == Trans::no ? n : k, 5, gen);
                    const std::size_t stride = mha::simd::PanelMatrix::min_panel_stride(isa, k);
                    std::vector<float, xsimd::aligned_allocator<float, 64>> panels(
                        mha::simd::PanelMatrix::floats(isa, n, stride), kSentinel);
                    // Pack in row blocks of 16 (every block start keeps the 64-byte alignment).
                    for (std::size_t r0 = 0; r0 < k; r0 += 16) {
                        const std::size_t rows = std::min<std::size_t>(16, k - r0);
                        const ConstMatrix part = tb == Trans::no ? b.view().row_block(r0, rows) : b.view().columns(r0, rows);
                        mha::simd::pack_panels(isa, part, tb, panels.data() + r0 * nr, stride);
                    }
                    for (std::size_t p = 0; p < (n + nr - 1) / nr; ++p)
                        for (std::size_t r = 0; r < k; ++r)
                            for (std::size_t j = 0; j < nr; ++j) {
                                const float v = panels[p * stride + r * nr + j];
                                if (p * nr + j < n) ASSERT_EQ(v, tb == Trans::no ? b.at(r, p * nr + j) : b.at(p * nr + j, r));
                                else ASSERT_EQ(v, 0.0f) << "padding column " << p * nr + j;
                            }
                    const mha::simd::PanelMatrix pm{panels.data(), k, n, stride, isa};
                    Stored want(m, n, 2, gen, true), got(m, n, 2, gen, true);
                    mha::simd::gemm(0.5f, a.view(), ta, b.view(), tb, 0.0f, want.mview());
                    mha::simd::gemm_panels(0.5f, a.view(), ta, pm, 0.0f, got.mview());
                    ASSERT_TRUE(same_bits(want.buf, got.buf));
                    // Rows [r0, k) of op(B) with op(A)'s matching columns, accumulated onto C (beta = 1).
                    const std::size_t r0 = k > 16 ? 16 : 0, kk = k - r0;
                    const ConstMatrix a_part = ta == Trans::no ? a.view().columns(r0, kk) : a.view().row_block(r0, kk);
                    const ConstMatrix b_part = tb == Trans::no ? b.view().row_block(r0, kk) : b.view().columns(r0, kk);
                    mha::simd::gemm(1.0f, a_part, ta, b_part, tb, 1.0f, want.mview());
                    mha::simd::gemm_panels(1.0f, a_part, ta, pm.rows(r0, kk), 1.0f, got.mview());
                    ASSERT_TRUE(same_bits(want.buf, got.buf));
                    // Columns from the second panel on.
                    if (n > nr) {
                        const std::size_t nn = n - nr;
                        const ConstMatrix b_cols = tb == Trans::no ? b.view().columns(nr, nn) : b.view().row_block(nr, nn);
                        mha::simd::gemm(1.0f, a.view(), ta, b_cols, tb, 0.0f, want.mview().columns(0, nn));
                        mha::simd::gemm_panels(1.0f, a.view(), ta, pm.columns(nr, nn), 0.0f, got.mview().columns(0, nn));
                        ASSERT_TRUE(same_bits(want.buf, got.buf));
                    }
                }
}

// A PackedMatrix keeps the ISA it was packed for; gemm_packed runs that ISA's kernel even when the cap
// changes later.
TEST_P(SimdGemm, PackedKeepsItsIsa) {
    std::mt19937 gen(800);
    const Stored w(40, 30, 1, gen), x(9, 30, 1, gen);
    mha::simd::PackedMatrix packed(w.view(), Trans::yes);
    EXPECT_EQ(packed.isa(), GetParam());
    Stored c1(9, 40, 1, gen), c2(9, 40, 1, gen);
    mha::simd::gemm_packed(1.0f, x.view(), Trans::no, packed, 0.0f, nullptr, c1.mview());
    mha::set_isa_cap(Isa::sse2);
    mha::simd::gemm_packed(1.0f, x.view(), Trans::no, packed, 0.0f, nullptr, c2.mview());
    EXPECT_TRUE(same_bits(c1.buf, c2.buf));
    mha::set_isa_cap(GetParam());
    // Moved-from and moved-to objects.
    mha::simd::PackedMatrix moved = std::move(packed);
    EXPECT_EQ(moved.isa(), GetParam());
    EXPECT_EQ(moved.n(), 40u);
    Stored c3(9, 40, 1, gen);
    mha::simd::gemm_packed(1.0f, x.view(), Trans::no, moved, 0.0f, nullptr, c3.mview());
    EXPECT_TRUE(same_bits(c1.buf, c3.buf));
}

// The shapes attention uses: the Linear projections (y = x·Wᵀ + b, E = 768, fused QKV [3E, E]), and per
// head Q_h·K_hᵀ and P·V_h where Q_h, K_h, V_h are column slices of a [L, 3E] buffer (stride 2304) and the
// context C_h a column slice of [L, E].
TEST_P(SimdGemm, TransformerShapes) {
    const std::size_t E = 768, L = 128, d = 64;
    std::mt19937 gen(900);
    // Projections, prepacked with bias, on fewer rows to keep the double loop quick.
    for (std::size_t n : {3 * E, E}) {
        Case t{37, n, E, Trans::no, Trans::yes};
        t.bias = true;
        t.prepacked = true;
        ASSERT_EQ(check_case(t, 901 + unsigned(n)), 0) << t.str();
    }
    const Stored qkv(L, 3 * E, 0, gen);  // stride 2305 (made odd); heads are column slices
    for (std::size_t h : {std::size_t(0), std::size_t(5), std::size_t(11)}) {
        const ConstMatrix q = qkv.view().columns(h * d, d), k = qkv.view().columns(E + h * d, d),
                          v = qkv.view().columns(2 * E + h * d, d);
        Stored s(L, L, 1, gen, true), ctx(L, E, 0, gen);
        const float scale = 0.125f;
        mha::simd::gemm(scale, q, Trans::no, k, Trans::yes, 0.0f, s.mview());
        const double bound_s = kC * kEps * double(d) * scale * max_abs(qkv) * max_abs(qkv);
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t j = 0; j < L; ++j) {
                double want = 0.0;
                for (std::size_t p = 0; p < d; ++p) want += double(q(i, p)) * double(k(j, p));
                ASSERT_LE(std::abs(double(s.at(i, j)) - scale * want), bound_s) << "S " << i << ", " << j;
            }
        const Stored ctx0 = ctx;
        mha::simd::gemm(1.0f, s.view(), Trans::no, v, Trans::no, 0.0f, ctx.mview().columns(h * d, d));
        const double bound_c = kC * kEps * double(L) * max_abs(s) * max_abs(qkv);
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t j = 0; j < E; ++j) {
                if (j < h * d || j >= h * d + d) {  // other heads' columns untouched
                    ASSERT_EQ(std::bit_cast<std::uint32_t>(ctx.at(i, j)), std::bit_cast<std::uint32_t>(ctx0.at(i, j)));
                    continue;
                }
                double want = 0.0;
                for (std::size_t p = 0; p < L; ++p) want += double(s.at(i, p)) * double(v(p, j - h * d));
                ASSERT_LE(std::abs(double(ctx.at(i, j)) - want), bound_c) << "C " << i << ", " << j;
            }
        EXPECT_TRUE(ctx.padding_intact());
    }
}

// simd::gemm is called from many threads at once (per-thread pack buffers): concurrent calls of
// different shapes give bitwise the results of the same calls made one at a time.
TEST_P(SimdGemm, ConcurrentCallsMatchSerial) {
    constexpr int kThreads = 4;
    std::mt19937 gen(1000);
    struct Job {
        Stored a, b, c;
        Trans tb;
    };
    std::vector<Job> jobs;
    for (int t = 0; t < kThreads; ++t) {
        const std::size_t m = 20 + 7 * t, n = 30 + 50 * t, k = 40 + 300 * t;
        const Trans tb = t % 2 ? Trans::yes : Trans::no;
        jobs.push_back({Stored(m, k, 1, gen), tb == Trans::no ? Stored(k, n, 1, gen) : Stored(n, k, 1, gen),
                        Stored(m, n, 1, gen), tb});
    }
    std::vector<std::vector<float>> serial;
    for (auto& j : jobs) {
        Stored c = j.c;
        mha::simd::gemm(1.0f, j.a.view(), Trans::no, j.b.view(), j.tb, 0.0f, c.mview());
        serial.push_back(c.buf);
    }
    const Isa isa = GetParam();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            (void)isa;  // the cap is process-wide and already set
            for (int rep = 0; rep < 20; ++rep) {
                auto& j = jobs[(t + rep) % kThreads];
                Stored c = j.c;
                mha::simd::gemm(1.0f, j.a.view(), Trans::no, j.b.view(), j.tb, 0.0f, c.mview());
                if (!same_bits(c.buf, serial[(t + rep) % kThreads])) ADD_FAILURE() << "thread " << t << " rep " << rep;
            }
        });
    for (auto& th : threads) th.join();
}

INSTANTIATE_TEST_SUITE_P(AllIsas, SimdGemm, ::testing::ValuesIn(mha::simd::kSimdIsas),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(mha::isa_name(info.param)); });

}  // namespace
