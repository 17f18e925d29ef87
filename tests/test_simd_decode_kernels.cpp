// The decode-step kernels mha::simd::decode_scores (s = scale·q·kᵀ) and mha::simd::decode_accumulate
// (o += p·v), run once per ISA this CPU has (mha::set_isa_cap), against a double-precision loop and the
// scalar reference mha::reference::gemm.
// Covered: every combination of M ∈ {1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 128} (query tiles of 4 and 2, their
// tails, several query blocks), n ∈ {1, 2, 3, 4, 5, 15, 16, 17, 255, 256} (key blocks of 4 and their
// tails, V chunks) and d ∈ {1, 3, 8, 15, 16, 17, 31, 32, 64, 80, 96, 128, 129, 256} (vectors of 4, 8, 16
// lanes, partial vectors, column tiles), with odd row strides and start addresses at every float offset
// mod 64 bytes; NaN sentinels in every padding float of the inputs, in the rows past n of K and V and
// around every buffer (none may be read: one that is makes a result NaN), and around and inside the
// outputs (none may be written); o accumulated onto existing values; several scales; d = 0, n = 0, M = 0.
// Tiles that end at a PROT_NONE page (a read past the last row or column faults). Determinism: repeated
// calls, and calls on single query rows, on key ranges (scores) and on consecutive row ranges of V
// (accumulate), and at other addresses and strides, give bitwise the same elements.
//
// Error bounds (u = 2^-24, γ_k = k·u / (1 − k·u); Higham, Accuracy and Stability, §3.1 and §3.5: a sum
// evaluated by any tree in which each term passes through at most k roundings is within γ_k·Σ|terms|).
// scores: the kernel sums lane l of a vector over the columns c ≡ l (mod W), one FMA per vector (W = 16,
//   8, 4 on AVX-512, AVX2, SSE2; SSE2 rounds the product too), then adds the W lanes by a tree of depth
//   log2 W, then multiplies by scale. Each product passes through at most
//   k = ceil(d / W) + log2 W + 2 roundings (chain, tree, product, scale), so
//     |s − scale·q·k| ≤ γ_k·|scale|·Σ_c |q_c·k_c|   (≤ γ_k·|scale|·d·max|q|·max|k|).
//   The reference sums sequentially with a rounded product and scales once: k_ref = d + 2. The two
//   backends differ by at most the sum of the bounds.
// accumulate: o + Σ_j p_j·v_j summed in order onto o, each step one FMA (two roundings on SSE2), so
//   every term passes through at most 2n roundings:
//     |o_new − (o + Σ p·v)| ≤ γ_{2n}·(|o| + Σ_j |p_j·v_j|).
//   The reference sums Σ p·v (2n roundings), then adds o (one more): γ_{2n+1}.
// The double oracle's own error (< 2^-40 relative to Σ|terms| here) is negligible. A lost, doubled or
// misplaced term of magnitude ~Σ|terms|/d or a read padding NaN exceeds these bounds.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "reference/reference.hpp"
#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

using mha::ConstMatrix;
using mha::Isa;
using mha::Matrix;
using mha::Trans;

constexpr double kU = 0x1p-24;
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;  // a quiet NaN with a payload
const float kSentinel = std::bit_cast<float>(kSentinelBits);
constexpr std::size_t kGuard = 19;  // sentinel floats before and after each buffer

constexpr std::size_t kMs[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 128};
constexpr std::size_t kNs[] = {1, 2, 3, 4, 5, 15, 16, 17, 255, 256};
constexpr std::size_t kDs[] = {1, 3, 8, 15, 16, 17, 31, 32, 64, 80, 96, 128, 129, 256, 544};

double gamma_k(double k) { return k * kU / (1.0 - k * kU); }

std::size_t lanes(Isa isa) {
    switch (isa) {
        case Isa::avx512_bf16:
        case Isa::avx512: return 16;
        case Isa::avx2: return 8;
        case Isa::sse2:
        case Isa::neon:
        case Isa::neon_bf16: break;
    }
    return 4;
}

// Roundings per product in the SIMD scores (see the header).
double scores_depth(Isa isa, std::size_t d) {
    const std::size_t w = lanes(isa);
    return double((d + w - 1) / w) + std::log2(double(w)) + 2.0;
}

// A rows × cols matrix at `offset` floats into its buffer (any alignment), row stride cols + pad;
// `extra_rows` more rows follow the view (a KV cache past the tile). Every float that is not an element
// of the view (padding, extra rows, kGuard floats on each side) holds the sentinel NaN.
struct Mat {
    std::size_t rows = 0, cols = 0, stride = 0, extra_rows = 0, begin = 0;
    std::vector<float> buf;

    Mat(std::size_t r, std::size_t c, std::size_t pad = 0, std::size_t offset = 0, std::size_t extra = 0)
        : rows(r), cols(c), stride(c + pad), extra_rows(extra), begin(kGuard + offset) {
        buf.assign(begin + (r + extra) * stride + kGuard, kSentinel);
    }
    float& at(std::size_t i, std::size_t j) { return buf[begin + i * stride + j]; }
    float at(std::size_t i, std::size_t j) const { return buf[begin + i * stride + j]; }
    Matrix view() { return {buf.data() + begin, rows, cols, stride}; }
    ConstMatrix cview() const { return {buf.data() + begin, rows, cols, stride}; }
    // Every float outside the view still holds the sentinel.
    bool outside_intact() const {
        for (std::size_t x = 0; x < buf.size(); ++x) {
            const bool inside = x >= begin && (x - begin) / stride < rows && (x - begin) % stride < cols;
            if (!inside && std::bit_cast<std::uint32_t>(buf[x]) != kSentinelBits) return false;
        }
        return true;
    }
    // The view's elements, row by row.
    std::vector<float> values() const {
        std::vector<float> v;
        v.reserve(rows * cols);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) v.push_back(at(i, j));
        return v;
    }
};

// Values uniform in [lo, hi], or with `spread` those times 2^e, e uniform in [-8, 8] (magnitudes 2^16
// apart: sums with cancellation, whose bound Σ|terms| is far above |Σ terms|).
void fill(Mat& m, std::mt19937& gen, bool spread = false, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::uniform_int_distribution<int> exp(-8, 8);
    for (std::size_t i = 0; i < m.rows; ++i)
        for (std::size_t j = 0; j < m.cols; ++j) m.at(i, j) = spread ? std::ldexp(dist(gen), exp(gen)) : dist(gen);
}

using mha_test::same_bits;

std::string shape(std::size_t M, std::size_t n, std::size_t d) {
    return "M = " + std::to_string(M) + ", n = " + std::to_string(n) + ", d = " + std::to_string(d) +
           ", isa = " + std::string(mha::isa_name(mha::active_isa()));
}

// Counts entries out of bound and reports the first few.
class Checker {
public:
    explicit Checker(std::string what) : what_(std::move(what)) {}
    void near(std::size_t i, std::size_t j, double got, double want, double tol, const char* against) {
        if (std::abs(got - want) <= tol) return;  // false for NaN
        if (++failures_ <= 5)
            ADD_FAILURE() << what_ << ": (" << i << ", " << j << ") = " << got << ", want " << want << " ± " << tol
                          << " (" << against << ")";
    }
    void fail(const std::string& why) {
        ++failures_;
        ADD_FAILURE() << what_ << ": " << why;
    }
    int failures() const { return failures_; }

private:
    std::string what_;
    int failures_ = 0;
};

// ---- scores ----------------------------------------------------------------------------------------

struct ScoresCase {
    std::size_t M, n, d;
    float scale = 1.0f;
    std::size_t pad_q = 0, pad_k = 0, pad_s = 0, off_q = 0, off_k = 0, off_s = 0;
    bool spread = false;
};

// Runs one case against the double oracle and the reference; returns the number of failures.
int check_scores(const ScoresCase& t, unsigned seed) {
    std::mt19937 gen(seed);
    Mat q(t.M, t.d, t.pad_q, t.off_q), k(t.n, t.d, t.pad_k, t.off_k, 3), s(t.M, t.n, t.pad_s, t.off_s);
    fill(q, gen, t.spread);
    fill(k, gen, t.spread);
    const Mat q0 = q, k0 = k;
    mha::simd::decode_scores(t.scale, q.cview(), k.cview(), s.view());

    Mat ref(t.M, t.n);
    mha::reference::gemm(t.scale, q.cview(), Trans::no, k.cview(), Trans::yes, 0.0f, ref.view());

    Checker check(shape(t.M, t.n, t.d) + ", scale = " + std::to_string(t.scale));
    const double g_simd = gamma_k(scores_depth(mha::active_isa(), t.d)), g_ref = gamma_k(double(t.d) + 2.0);
    for (std::size_t i = 0; i < t.M; ++i)
        for (std::size_t j = 0; j < t.n; ++j) {
            double dot = 0.0, mag = 0.0;
            for (std::size_t c = 0; c < t.d; ++c) {
                const double x = double(q.at(i, c)) * double(k.at(j, c));  // exact in double
                dot += x;
                mag += std::abs(x);
            }
            const double want = double(t.scale) * dot, scaled = std::abs(double(t.scale)) * mag;
            check.near(i, j, s.at(i, j), want, g_simd * scaled, "double");
            check.near(i, j, s.at(i, j), ref.at(i, j), (g_simd + g_ref) * scaled, "reference::gemm");
        }
    if (!s.outside_intact()) check.fail("wrote outside s");
    if (!same_bits(q.buf, q0.buf) || !same_bits(k.buf, k0.buf)) check.fail("changed q or k");
    return check.failures();
}

// ---- accumulate ------------------------------------------------------------------------------------

struct AccumulateCase {
    std::size_t M, n, d;
    std::size_t pad_p = 0, pad_v = 0, pad_o = 0, off_p = 0, off_v = 0, off_o = 0;
    bool spread = false;
    bool zero_o = false;  // o starts at 0 rather than random values
};

int check_accumulate(const AccumulateCase& t, unsigned seed) {
    std::mt19937 gen(seed);
    Mat p(t.M, t.n, t.pad_p, t.off_p), v(t.n, t.d, t.pad_v, t.off_v, 3), o(t.M, t.d, t.pad_o, t.off_o);
    fill(p, gen, t.spread, t.spread ? -1.0f : 0.0f, 1.0f);  // probabilities, or signed with spread
    fill(v, gen, t.spread);
    if (t.zero_o)
        fill(o, gen, false, 0.0f, 0.0f);
    else
        fill(o, gen, t.spread);
    const Mat p0 = p, v0 = v, o0 = o;
    mha::simd::decode_accumulate(p.cview(), v.cview(), o.view());

    Mat ref = o0;
    mha::reference::gemm(1.0f, p.cview(), Trans::no, v.cview(), Trans::no, 1.0f, ref.view());

    Checker check(shape(t.M, t.n, t.d));
    const double g_simd = gamma_k(2.0 * double(t.n)), g_ref = gamma_k(2.0 * double(t.n) + 1.0);
    for (std::size_t i = 0; i < t.M; ++i)
        for (std::size_t c = 0; c < t.d; ++c) {
            double sum = o0.at(i, c), mag = std::abs(double(o0.at(i, c)));
            for (std::size_t j = 0; j < t.n; ++j) {
                const double x = double(p.at(i, j)) * double(v.at(j, c));
                sum += x;
                mag += std::abs(x);
            }
            check.near(i, c, o.at(i, c), sum, g_simd * mag, "double");
            check.near(i, c, o.at(i, c), ref.at(i, c), (g_simd + g_ref) * mag, "reference::gemm");
        }
    if (!o.outside_intact()) check.fail("wrote outside o");
    if (!same_bits(p.buf, p0.buf) || !same_bits(v.buf, v0.buf)) check.fail("changed p or v");
    return check.failures();
}

// ---- fixtures --------------------------------------------------------------------------------------

// Every ISA; those the CPU lacks are skipped (and say so). The cap is restored afterwards.
class DecodeKernels : public ::testing::TestWithParam<Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa()) GTEST_SKIP() << "this CPU has no " << mha::isa_name(GetParam());
        saved_ = mha::active_isa();
        mha::set_isa_cap(GetParam());
        ASSERT_EQ(mha::active_isa(), GetParam());
    }
    void TearDown() override { mha::set_isa_cap(saved_); }
    Isa saved_ = Isa::avx512_bf16;
};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) { return std::string(mha::isa_name(info.param)); }

constexpr float kScales[] = {1.0f, 0.125f, -0.7f, 0.0883883476f};

// Every (M, n, d) of the lists, with strides, offsets and scales varying from case to case.
TEST_P(DecodeKernels, ScoresAllShapes) {
    unsigned seed = 1;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ScoresCase t{M, n, d};
                t.scale = kScales[seed % 4];
                t.pad_q = seed % 3 == 0 ? 0 : seed % 7;
                t.pad_k = seed % 5 == 0 ? 0 : 1 + seed % 11;
                t.pad_s = seed % 4;
                t.off_q = seed % 16;
                t.off_k = (seed * 7) % 16;
                t.off_s = (seed * 3) % 16;
                t.spread = seed % 6 == 5;
                ASSERT_EQ(check_scores(t, seed++), 0);
            }
}

TEST_P(DecodeKernels, AccumulateAllShapes) {
    unsigned seed = 1000;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                AccumulateCase t{M, n, d};
                t.pad_p = seed % 3 == 0 ? 0 : seed % 7;
                t.pad_v = seed % 5 == 0 ? 0 : 1 + seed % 11;
                t.pad_o = seed % 4;
                t.off_p = seed % 16;
                t.off_v = (seed * 7) % 16;
                t.off_o = (seed * 3) % 16;
                t.spread = seed % 6 == 5;
                t.zero_o = seed % 9 == 0;
                ASSERT_EQ(check_accumulate(t, seed++), 0);
            }
}

// d = 0: s = 0 (an empty sum), written over the NaN s held; n = 0: o untouched; M = 0: nothing touched.
TEST_P(DecodeKernels, EmptyDimensions) {
    {
        Mat q(3, 0, 2), k(5, 0, 1), s(3, 5, 1);
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = 0; j < 5; ++j) s.at(i, j) = std::numeric_limits<float>::quiet_NaN();
        mha::simd::decode_scores(0.5f, q.cview(), k.cview(), s.view());
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t j = 0; j < 5; ++j) EXPECT_EQ(std::bit_cast<std::uint32_t>(s.at(i, j)), 0u) << i << ", " << j;
        EXPECT_TRUE(s.outside_intact());
    }
    {
        Mat p(4, 0, 1), v(0, 7, 1), o(4, 7, 2);
        std::mt19937 gen(5);
        fill(o, gen);
        const Mat o0 = o;
        mha::simd::decode_accumulate(p.cview(), v.cview(), o.view());
        EXPECT_TRUE(same_bits(o.buf, o0.buf));
    }
    {
        Mat q(0, 16), k(4, 16), s(0, 4), p(0, 4), v(4, 16), o(0, 16);
        std::mt19937 gen(6);
        fill(k, gen);
        fill(v, gen);
        mha::simd::decode_scores(1.0f, q.cview(), k.cview(), s.view());
        mha::simd::decode_accumulate(p.cview(), v.cview(), o.view());
        EXPECT_TRUE(s.outside_intact());
        EXPECT_TRUE(o.outside_intact());
    }
    {
        Mat q(3, 16), k(0, 16), s(3, 0, 2);
        mha::simd::decode_scores(1.0f, q.cview(), k.cview(), s.view());
        EXPECT_TRUE(s.outside_intact());
    }
}

// ---- determinism -----------------------------------------------------------------------------------

// The same elements, bitwise: twice in a row; one query row at a time; key ranges split at every
// multiple of 1..5 (tile boundaries and off them); at another address and stride.
TEST_P(DecodeKernels, ScoresDeterministicAndTilingInvariant) {
    std::mt19937 gen(77);
    for (std::size_t d : {std::size_t(17), std::size_t(64), std::size_t(129)})
        for (std::size_t M : {std::size_t(9), std::size_t(33)}) {
            const std::size_t n = 23;
            SCOPED_TRACE(shape(M, n, d));
            Mat q(M, d, 3, 1), k(n, d, 5, 2, 2), s(M, n, 1, 3);
            fill(q, gen);
            fill(k, gen);
            mha::simd::decode_scores(0.3f, q.cview(), k.cview(), s.view());
            const auto want = s.values();

            Mat again(M, n);
            mha::simd::decode_scores(0.3f, q.cview(), k.cview(), again.view());
            EXPECT_TRUE(same_bits(again.values(), want)) << "second call";

            Mat rows(M, n);
            for (std::size_t i = 0; i < M; ++i)
                mha::simd::decode_scores(0.3f, q.cview().row_block(i, 1), k.cview(), rows.view().row_block(i, 1));
            EXPECT_TRUE(same_bits(rows.values(), want)) << "one query row per call";

            for (std::size_t step = 1; step <= 5; ++step) {
                Mat split(M, n);
                for (std::size_t j = 0; j < n; j += step) {
                    const std::size_t len = std::min(step, n - j);
                    mha::simd::decode_scores(0.3f, q.cview(), k.cview().row_block(j, len),
                                             split.view().columns(j, len));
                }
                EXPECT_TRUE(same_bits(split.values(), want)) << "keys split every " << step;
            }

            Mat q2(M, d, 0, 7), k2(n, d, 1, 5), s2(M, n, 6, 9);
            for (std::size_t i = 0; i < M; ++i)
                for (std::size_t c = 0; c < d; ++c) q2.at(i, c) = q.at(i, c);
            for (std::size_t j = 0; j < n; ++j)
                for (std::size_t c = 0; c < d; ++c) k2.at(j, c) = k.at(j, c);
            mha::simd::decode_scores(0.3f, q2.cview(), k2.cview(), s2.view());
            EXPECT_TRUE(same_bits(s2.values(), want)) << "other addresses and strides";
        }
}

// Twice in a row; one query row per call; columns split into ranges; V's rows split into consecutive
// calls (o carries the running sum, so the order of the additions is unchanged); another address.
TEST_P(DecodeKernels, AccumulateDeterministicAndTilingInvariant) {
    std::mt19937 gen(78);
    for (std::size_t d : {std::size_t(17), std::size_t(64), std::size_t(129)})
        for (std::size_t M : {std::size_t(9), std::size_t(33)}) {
            const std::size_t n = 300;  // more than one V chunk for every d here
            SCOPED_TRACE(shape(M, n, d));
            Mat p(M, n, 3, 1), v(n, d, 5, 2, 2), o0(M, d, 1, 3);
            fill(p, gen, false, 0.0f, 1.0f);
            fill(v, gen);
            fill(o0, gen);
            Mat o = o0;
            mha::simd::decode_accumulate(p.cview(), v.cview(), o.view());
            const auto want = o.values();

            Mat again = o0;
            mha::simd::decode_accumulate(p.cview(), v.cview(), again.view());
            EXPECT_TRUE(same_bits(again.values(), want)) << "second call";

            Mat rows = o0;
            for (std::size_t i = 0; i < M; ++i)
                mha::simd::decode_accumulate(p.cview().row_block(i, 1), v.cview(), rows.view().row_block(i, 1));
            EXPECT_TRUE(same_bits(rows.values(), want)) << "one query row per call";

            for (std::size_t cstep : {std::size_t(1), std::size_t(5), std::size_t(16), std::size_t(40)}) {
                Mat cols = o0;
                for (std::size_t c = 0; c < d; c += cstep) {
                    const std::size_t len = std::min(cstep, d - c);
                    mha::simd::decode_accumulate(p.cview(), v.cview().columns(c, len), cols.view().columns(c, len));
                }
                EXPECT_TRUE(same_bits(cols.values(), want)) << "columns split every " << cstep;
            }

            for (std::size_t step : {std::size_t(1), std::size_t(3), std::size_t(64), std::size_t(257)}) {
                Mat split = o0;
                for (std::size_t j = 0; j < n; j += step) {
                    const std::size_t len = std::min(step, n - j);
                    mha::simd::decode_accumulate(p.cview().columns(j, len), v.cview().row_block(j, len), split.view());
                }
                EXPECT_TRUE(same_bits(split.values(), want)) << "V rows split every " << step;
            }

            Mat p2(M, n, 0, 7), v2(n, d, 1, 5), o2(M, d, 6, 9);
            for (std::size_t i = 0; i < M; ++i)
                for (std::size_t j = 0; j < n; ++j) p2.at(i, j) = p.at(i, j);
            for (std::size_t j = 0; j < n; ++j)
                for (std::size_t c = 0; c < d; ++c) v2.at(j, c) = v.at(j, c);
            for (std::size_t i = 0; i < M; ++i)
                for (std::size_t c = 0; c < d; ++c) o2.at(i, c) = o0.at(i, c);
            mha::simd::decode_accumulate(p2.cview(), v2.cview(), o2.view());
            EXPECT_TRUE(same_bits(o2.values(), want)) << "other addresses and strides";
        }
}

// ---- reads end at the tile ---------------------------------------------------------------------------

// Pages [guard][data...][guard] with both guards PROT_NONE. at_end(rows, cols, ld) places a matrix so
// that its last element is the last float before the trailing guard page: any read past it faults.
class GuardedPages {
public:
    explicit GuardedPages(std::size_t floats) {
        page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        data_bytes_ = (floats * sizeof(float) + page_ - 1) / page_ * page_;
        void* m = mmap(nullptr, data_bytes_ + 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return;
        base_ = static_cast<char*>(m);
        if (mprotect(base_, page_, PROT_NONE) != 0 || mprotect(base_ + page_ + data_bytes_, page_, PROT_NONE) != 0) {
            munmap(base_, data_bytes_ + 2 * page_);
            base_ = nullptr;
        }
    }
    ~GuardedPages() {
        if (base_ != nullptr) munmap(base_, data_bytes_ + 2 * page_);
    }
    GuardedPages(const GuardedPages&) = delete;
    GuardedPages& operator=(const GuardedPages&) = delete;
    bool ok() const { return base_ != nullptr; }
    // The matrix's elements copied from m, its padding NaN; the last element ends at the guard page.
    Matrix at_end(const Mat& m, std::size_t ld) {
        float* end = reinterpret_cast<float*>(base_ + page_ + data_bytes_);
        float* first = base_ == nullptr || m.rows == 0 ? end : end - ((m.rows - 1) * ld + m.cols);
        std::fill(reinterpret_cast<float*>(base_ + page_), end, kSentinel);
        for (std::size_t i = 0; i < m.rows; ++i)
            for (std::size_t j = 0; j < m.cols; ++j) first[i * ld + j] = m.at(i, j);
        return {first, m.rows, m.cols, ld};
    }

private:
    std::size_t page_ = 0, data_bytes_ = 0;
    char* base_ = nullptr;
};

struct GuardShape {
    std::size_t M, n, d, pad;
};
constexpr GuardShape kGuardShapes[] = {{1, 1, 1, 0},   {4, 4, 16, 0},   {5, 17, 129, 3}, {3, 255, 3, 1},
                                       {9, 16, 17, 0}, {8, 256, 128, 0}, {2, 5, 15, 2},  {33, 3, 31, 0},
                                       {7, 2, 8, 5},   {1, 15, 80, 0},   {33, 256, 129, 1}, {17, 255, 64, 0},
                                       {128, 37, 256, 3}};

// q and k (scores), p and v (accumulate) each end at a PROT_NONE page; results equal those from
// ordinary buffers bitwise.
TEST_P(DecodeKernels, ReadsEndAtTheTile) {
    std::mt19937 gen(99);
    for (const GuardShape& g : kGuardShapes) {
        SCOPED_TRACE(shape(g.M, g.n, g.d) + ", pad = " + std::to_string(g.pad));
        Mat q(g.M, g.d), k(g.n, g.d), p(g.M, g.n), v(g.n, g.d), o0(g.M, g.d);
        fill(q, gen);
        fill(k, gen);
        fill(p, gen, false, 0.0f, 1.0f);
        fill(v, gen);
        fill(o0, gen);
        Mat s_want(g.M, g.n), o_want = o0;
        mha::simd::decode_scores(0.25f, q.cview(), k.cview(), s_want.view());
        mha::simd::decode_accumulate(p.cview(), v.cview(), o_want.view());

        const std::size_t ld = g.d + g.pad, ldp = g.n + g.pad;
        GuardedPages gq(g.M * ld), gk(g.n * ld), gp(g.M * ldp), gv(g.n * ld);
        ASSERT_TRUE(gq.ok() && gk.ok() && gp.ok() && gv.ok()) << "mmap failed";
        Mat s(g.M, g.n), o = o0;
        mha::simd::decode_scores(0.25f, gq.at_end(q, ld), gk.at_end(k, ld), s.view());
        mha::simd::decode_accumulate(gp.at_end(p, ldp), gv.at_end(v, ld), o.view());
        EXPECT_TRUE(same_bits(s.values(), s_want.values()));
        EXPECT_TRUE(same_bits(o.values(), o_want.values()));
    }
}

// The rows the caller reads next (RowsAhead) are only prefetched: with K / V ending at a guard page and the
// rows ahead either NaN (a value read from them would reach a result) or on a PROT_NONE page (a load would
// fault), of fewer, as many or more rows than the read-ahead distance, every result is bitwise the same.
TEST_P(DecodeKernels, RowsAheadAreNeverRead) {
    std::mt19937 gen(101);
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* none = mmap(nullptr, 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(none, MAP_FAILED);
    for (const GuardShape& g : kGuardShapes) {
        SCOPED_TRACE(shape(g.M, g.n, g.d) + ", pad = " + std::to_string(g.pad));
        Mat q(g.M, g.d), k(g.n, g.d), p(g.M, g.n), v(g.n, g.d), o0(g.M, g.d), nan_rows(40, g.d);
        fill(q, gen);
        fill(k, gen);
        fill(p, gen, false, 0.0f, 1.0f);
        fill(v, gen);
        fill(o0, gen);
        for (std::size_t i = 0; i < nan_rows.rows; ++i)
            for (std::size_t c = 0; c < g.d; ++c) nan_rows.at(i, c) = kSentinel;
        Mat s_want(g.M, g.n), o_want = o0;
        mha::simd::decode_scores(0.25f, q.cview(), k.cview(), s_want.view());
        mha::simd::decode_accumulate(p.cview(), v.cview(), o_want.view());

        const std::size_t ld = g.d + g.pad, row_bytes = g.d * sizeof(float);
        GuardedPages gk(g.n * ld), gv(g.n * ld);
        ASSERT_TRUE(gk.ok() && gv.ok()) << "mmap failed";
        const ConstMatrix kk = gk.at_end(k, ld), vv = gv.at_end(v, ld);
        for (std::size_t rows : {std::size_t(1), std::size_t(3), std::size_t(16), std::size_t(40)})
            for (bool unmapped : {false, true}) {
                SCOPED_TRACE(std::to_string(rows) + (unmapped ? " unmapped rows ahead" : " NaN rows ahead"));
                const mha::simd::RowsAhead ahead{unmapped ? none : static_cast<const void*>(nan_rows.cview().data), rows,
                                                 unmapped ? std::size_t(0) : nan_rows.stride * sizeof(float), row_bytes, {}};
                Mat s(g.M, g.n), o = o0;
                mha::simd::decode_scores(0.25f, q.cview(), kk, s.view(), ahead);
                mha::simd::decode_accumulate(p.cview(), vv, o.view(), ahead);
                EXPECT_TRUE(same_bits(s.values(), s_want.values()));
                EXPECT_TRUE(same_bits(o.values(), o_want.values()));
            }
    }
    munmap(none, 2 * page);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, DecodeKernels, ::testing::ValuesIn(mha::simd::kSimdIsas), isa_param_name);

}  // namespace
