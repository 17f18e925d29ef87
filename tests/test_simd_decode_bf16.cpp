// The decode kernels on vdpbf16ps (mha::simd::decode_scores_bf16 / decode_accumulate_bf16, lib/simd/decode_bf16.hpp):
// bf16 queries and probabilities against K / V rows of bf16, or of fp32 holding bf16 values. They run only on
// AVX512_BF16 (the tests say so and skip elsewhere: no other ISA has these kernels).
// Covered: M ∈ {1, 2, 3, 4, 5, 8, 9, 33} × n ∈ {1, 2, 3, 4, 5, 15, 16, 17, 255} × d ∈ {1, 2, 3, 15, 16, 17, 31, 32,
// 33, 63, 64, 65, 100, 128, 129, 256} (query and key tiles and their tails, 32-column steps and their masked
// tails, odd n: the last V row without a partner, one and two 32-column groups per accumulate tile), odd row
// strides; NaN bits in every padding element, in the rows past n and around each buffer (a read one makes a
// result NaN), a sentinel around and inside s / o that must stay; K / V that end at a PROT_NONE page.
//
// Error bounds (u = 2^-24, γ_k = k·u / (1 − k·u)). Every product of two bf16 values is exact in fp32.
// scores: lane l of an accumulator adds, per 32 columns, the two products of its pair (at most two roundings:
//   vdpbf16ps may add them to the accumulator one at a time); then a tree of depth 4 over 16 lanes and the
//   product by scale: each product passes through at most k = 2·ceil(d/32) + 5 roundings, so
//     |s − scale·Σ q·k| ≤ γ_k·|scale|·Σ_c |q_c·k_c|.
// accumulate: per pair of V rows at most two roundings, added in order onto o: every term passes through at
//   most n + 1 roundings: |o_new − (o + Σ p·v)| ≤ γ_{n+1}·(|o| + Σ_j |p_j·v_j|).
// The double oracle is exact here up to 2^-50 relative. A lost, doubled or misplaced term of magnitude
// ~Σ|terms|/d or a read NaN exceeds these bounds (MisplacedTermBreaksTheBound shows the bound can fail).
// Bitwise: per query row calls, keys split anywhere (scores), columns split anywhere and V rows split at even
// counts (accumulate), and fp32 rows holding the same values as the bf16 rows give the same bits.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "simd/decode_bf16.hpp"
#include "simd/gemm_bf16.hpp"

namespace {

using mha::bfloat16;
using mha::ConstMatrix;
using mha::Matrix;
using mha::MatrixView;

constexpr std::size_t kMs[] = {1, 2, 3, 4, 5, 8, 9, 33};
constexpr std::size_t kNs[] = {1, 2, 3, 4, 5, 15, 16, 17, 255};
constexpr std::size_t kDs[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 129, 256};
constexpr std::size_t kGuard = 37;
constexpr double kU = 0x1p-24;
constexpr std::uint16_t kNanBf16 = 0x7fd5;
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;

double gamma(std::size_t k) { return double(k) * kU / (1.0 - double(k) * kU); }

#define SKIP_WITHOUT_BF16_KERNELS()                                                                  \
    if (!mha::simd::bf16_kernels_available()) GTEST_SKIP() << "no AVX512_BF16: these kernels do not run here"

// rows × cols of T in a buffer with row stride cols + pad and `extra` rows after the view, everything outside
// the view NaN (bf16 NaN bits, or the float sentinel).
template <class T>
struct Mat {
    std::size_t rows, cols, stride, begin, extra;
    std::vector<T> buf;
    Mat(std::size_t r, std::size_t c, std::size_t pad = 0, std::size_t extra_rows = 0)
        : rows(r), cols(c), stride(c + pad), begin(kGuard), extra(extra_rows) {
        T nan;
        if constexpr (std::is_same_v<T, float>)
            nan = std::bit_cast<float>(kSentinelBits);
        else
            nan = bfloat16::from_bits(kNanBf16);
        buf.assign(begin + (r + extra) * stride + kGuard, nan);
    }
    T& at(std::size_t i, std::size_t j) { return buf[begin + i * stride + j]; }
    const T& at(std::size_t i, std::size_t j) const { return buf[begin + i * stride + j]; }
    MatrixView<T> view() { return {buf.data() + begin, rows, cols, stride}; }
    MatrixView<const T> cview() const { return {buf.data() + begin, rows, cols, stride}; }
    bool outside_intact() const {
        for (std::size_t x = 0; x < buf.size(); ++x) {
            const bool inside = x >= begin && (x - begin) / stride < rows && (x - begin) % stride < cols;
            if (inside) continue;
            if constexpr (std::is_same_v<T, float>) {
                if (std::bit_cast<std::uint32_t>(buf[x]) != kSentinelBits) return false;
            } else if (buf[x].bits != kNanBf16) {
                return false;
            }
        }
        return true;
    }
};

inline float value(float x) { return x; }
inline float value(bfloat16 x) { return x.to_float(); }

// Uniform in [lo, hi], rounded to bf16.
template <class T>
void fill(Mat<T>& m, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (std::size_t i = 0; i < m.rows; ++i)
        for (std::size_t j = 0; j < m.cols; ++j) {
            const bfloat16 h = bfloat16::from_float(dist(gen));
            if constexpr (std::is_same_v<T, float>)
                m.at(i, j) = h.to_float();
            else
                m.at(i, j) = h;
        }
}

// The same values as fp32 rows (pad and extra rows as given, outside NaN).
Mat<float> as_float(const Mat<bfloat16>& m, std::size_t pad, std::size_t extra = 0) {
    Mat<float> f(m.rows, m.cols, pad, extra);
    for (std::size_t i = 0; i < m.rows; ++i)
        for (std::size_t j = 0; j < m.cols; ++j) f.at(i, j) = m.at(i, j).to_float();
    return f;
}

std::vector<std::uint32_t> bits_of(const Mat<float>& m) {
    std::vector<std::uint32_t> v;
    for (std::size_t i = 0; i < m.rows; ++i)
        for (std::size_t j = 0; j < m.cols; ++j) v.push_back(std::bit_cast<std::uint32_t>(m.at(i, j)));
    return v;
}

std::string shape(std::size_t M, std::size_t n, std::size_t d) {
    return "M = " + std::to_string(M) + ", n = " + std::to_string(n) + ", d = " + std::to_string(d);
}

// s against the double oracle; returns the number of elements out of bound.
template <class E>
std::size_t check_scores(float scale, const Mat<bfloat16>& q, const Mat<E>& k, const Mat<float>& s, bool report = true) {
    const std::size_t d = q.cols, rounds = 2 * ((d + 31) / 32) + 5;
    std::size_t bad = 0;
    for (std::size_t m = 0; m < q.rows; ++m)
        for (std::size_t j = 0; j < k.rows; ++j) {
            double want = 0, mag = 0;
            for (std::size_t c = 0; c < d; ++c) {
                const double t = double(q.at(m, c).to_float()) * double(value(k.at(j, c)));
                want += t, mag += std::abs(t);
            }
            want *= scale;
            const double tol = gamma(rounds) * std::abs(scale) * mag;
            if (!(std::abs(double(s.at(m, j)) - want) <= tol) && bad++ < 5 && report)
                ADD_FAILURE() << "s[" << m << ", " << j << "] = " << s.at(m, j) << ", want " << want << " ± " << tol;
        }
    return bad;
}

// o (after) against o0 + p·v in double.
template <class E>
std::size_t check_accumulate(const Mat<bfloat16>& p, const Mat<E>& v, const Mat<float>& o0, const Mat<float>& o, bool report = true) {
    const std::size_t n = v.rows;
    std::size_t bad = 0;
    for (std::size_t m = 0; m < o.rows; ++m)
        for (std::size_t c = 0; c < o.cols; ++c) {
            double want = o0.at(m, c), mag = std::abs(double(o0.at(m, c)));
            for (std::size_t j = 0; j < n; ++j) {
                const double t = double(p.at(m, j).to_float()) * double(value(v.at(j, c)));
                want += t, mag += std::abs(t);
            }
            const double tol = gamma(n + 1) * mag;
            if (!(std::abs(double(o.at(m, c)) - want) <= tol) && bad++ < 5 && report)
                ADD_FAILURE() << "o[" << m << ", " << c << "] = " << o.at(m, c) << ", want " << want << " ± " << tol;
        }
    return bad;
}

TEST(DecodeBf16Kernels, ScoresWithinTheBoundAndEqualForBf16AndF32Rows) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(7);
    std::size_t seed = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                SCOPED_TRACE(shape(M, n, d));
                ++seed;
                Mat<bfloat16> q(M, d, seed % 3), k(n, d, seed % 5, 2);
                fill(q, gen);
                fill(k, gen);
                const float scale = seed % 2 ? 0.37f : -1.5f;
                Mat<float> s(M, n, seed % 4);
                mha::simd::decode_scores_bf16(scale, q.cview(), k.cview(), s.view());
                ASSERT_EQ(check_scores(scale, q, k, s), 0u);
                EXPECT_TRUE(s.outside_intact());
                const Mat<float> kf = as_float(k, (seed + 1) % 7, 2);
                Mat<float> sf(M, n, 1);
                mha::simd::decode_scores_bf16(scale, q.cview(), kf.cview(), sf.view());
                ASSERT_EQ(bits_of(sf), bits_of(s)) << "fp32 rows holding the same values";
            }
}

TEST(DecodeBf16Kernels, AccumulateWithinTheBoundAndEqualForBf16AndF32Rows) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(8);
    std::size_t seed = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                SCOPED_TRACE(shape(M, n, d));
                ++seed;
                Mat<bfloat16> p(M, n, seed % 3), v(n, d, seed % 5, 2);
                fill(p, gen, 0.0f, 1.0f);
                fill(v, gen);
                Mat<float> o0(M, d, seed % 4);
                fill(o0, gen);
                Mat<float> o = o0;
                mha::simd::decode_accumulate_bf16(p.cview(), v.cview(), o.view());
                ASSERT_EQ(check_accumulate(p, v, o0, o), 0u);
                EXPECT_TRUE(o.outside_intact());
                const Mat<float> vf = as_float(v, (seed + 2) % 7, 2);
                Mat<float> of = o0;
                mha::simd::decode_accumulate_bf16(p.cview(), vf.cview(), of.view());
                ASSERT_EQ(bits_of(of), bits_of(o)) << "fp32 rows holding the same values";
            }
}

// The bounds are tight enough to catch a misplaced term: one product moved to the neighbouring key (scores) or
// row (accumulate) of the oracle fails them.
TEST(DecodeBf16Kernels, MisplacedTermBreaksTheBound) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(9);
    const std::size_t M = 4, n = 6, d = 64;
    Mat<bfloat16> q(M, d), k(n, d), p(M, n), v(n, d);
    fill(q, gen), fill(k, gen), fill(p, gen, 0.25f, 1.0f), fill(v, gen, 0.25f, 1.0f);
    Mat<float> s(M, n);
    mha::simd::decode_scores_bf16(1.0f, q.cview(), k.cview(), s.view());
    Mat<bfloat16> k_moved = k;  // column 5 of key 2 taken from key 3
    k_moved.at(2, 5) = k.at(3, 5);
    const std::size_t bad = check_scores(1.0f, q, k_moved, s, false);
    EXPECT_GT(bad, 0u) << "a moved key element within the scores bound";
    Mat<float> o0(M, d), o(M, d);
    for (std::size_t i = 0; i < M; ++i)
        for (std::size_t c = 0; c < d; ++c) o0.at(i, c) = o.at(i, c) = 0.0f;
    mha::simd::decode_accumulate_bf16(p.cview(), v.cview(), o.view());
    Mat<bfloat16> p_moved = p;  // probability of row 3 used for row 4 too
    p_moved.at(0, 4) = p.at(0, 3);
    const std::size_t bad_o = check_accumulate(p_moved, v, o0, o, false);
    EXPECT_GT(bad_o, 0u) << "a moved probability within the accumulate bound";
}

TEST(DecodeBf16Kernels, TilingInvariance) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(10);
    for (std::size_t d : {std::size_t(17), std::size_t(64), std::size_t(129)})
        for (std::size_t M : {std::size_t(9), std::size_t(33)}) {
            const std::size_t n = 37;
            SCOPED_TRACE(shape(M, n, d));
            Mat<bfloat16> q(M, d, 3), k(n, d, 5), p(M, n, 1), v(n, d, 2);
            fill(q, gen), fill(k, gen), fill(p, gen, 0.0f, 1.0f), fill(v, gen);
            Mat<float> s(M, n), o0(M, d);
            fill(o0, gen);
            mha::simd::decode_scores_bf16(0.3f, q.cview(), k.cview(), s.view());
            Mat<float> o = o0;
            mha::simd::decode_accumulate_bf16(p.cview(), v.cview(), o.view());

            Mat<float> rows(M, n), orows = o0;
            for (std::size_t i = 0; i < M; ++i) {
                mha::simd::decode_scores_bf16(0.3f, q.cview().row_block(i, 1), k.cview(), rows.view().row_block(i, 1));
                mha::simd::decode_accumulate_bf16(p.cview().row_block(i, 1), v.cview(), orows.view().row_block(i, 1));
            }
            EXPECT_EQ(bits_of(rows), bits_of(s)) << "one query row per call (scores)";
            EXPECT_EQ(bits_of(orows), bits_of(o)) << "one query row per call (accumulate)";

            for (std::size_t step : {std::size_t(1), std::size_t(3), std::size_t(5)}) {
                Mat<float> split(M, n);
                for (std::size_t j = 0; j < n; j += step) {
                    const std::size_t len = std::min(step, n - j);
                    mha::simd::decode_scores_bf16(0.3f, q.cview(), k.cview().row_block(j, len), split.view().columns(j, len));
                }
                EXPECT_EQ(bits_of(split), bits_of(s)) << "keys split every " << step;
            }
            for (std::size_t step : {std::size_t(2), std::size_t(4), std::size_t(16)}) {
                Mat<float> split = o0;
                for (std::size_t j = 0; j < n; j += step) {
                    const std::size_t len = std::min(step, n - j);
                    mha::simd::decode_accumulate_bf16(p.cview().columns(j, len), v.cview().row_block(j, len), split.view());
                }
                EXPECT_EQ(bits_of(split), bits_of(o)) << "V rows split every " << step;
            }
            for (std::size_t cstep : {std::size_t(1), std::size_t(7), std::size_t(32), std::size_t(40)}) {
                Mat<float> cols = o0;
                for (std::size_t c = 0; c < d; c += cstep) {
                    const std::size_t len = std::min(cstep, d - c);
                    mha::simd::decode_accumulate_bf16(p.cview(), v.cview().columns(c, len), cols.view().columns(c, len));
                }
                EXPECT_EQ(bits_of(cols), bits_of(o)) << "columns split every " << cstep;
            }
        }
}

// Pages [guard][data][guard], PROT_NONE guards; at_end places a matrix so its last element is the last one
// before the trailing guard.
class GuardedPages {
public:
    explicit GuardedPages(std::size_t bytes) {
        page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        data_ = (bytes + page_ - 1) / page_ * page_;
        void* m = mmap(nullptr, data_ + 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return;
        base_ = static_cast<char*>(m);
        if (mprotect(base_, page_, PROT_NONE) != 0 || mprotect(base_ + page_ + data_, page_, PROT_NONE) != 0) {
            munmap(base_, data_ + 2 * page_);
            base_ = nullptr;
        }
    }
    ~GuardedPages() {
        if (base_ != nullptr) munmap(base_, data_ + 2 * page_);
    }
    GuardedPages(const GuardedPages&) = delete;
    GuardedPages& operator=(const GuardedPages&) = delete;
    bool ok() const { return base_ != nullptr; }
    template <class T>
    MatrixView<const T> at_end(const Mat<T>& m, std::size_t ld) {
        T* end = reinterpret_cast<T*>(base_ + page_ + data_);
        T* first = end - ((m.rows - 1) * ld + m.cols);
        for (std::size_t i = 0; i < m.rows; ++i)
            for (std::size_t j = 0; j < m.cols; ++j) first[i * ld + j] = m.at(i, j);
        return {first, m.rows, m.cols, ld};
    }

private:
    std::size_t page_ = 0, data_ = 0;
    char* base_ = nullptr;
};

TEST(DecodeBf16Kernels, ReadsEndAtTheTile) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(11);
    struct Shape {
        std::size_t M, n, d, pad;
    };
    for (const Shape& g : {Shape{1, 1, 1, 0}, Shape{4, 4, 32, 0}, Shape{5, 17, 129, 3}, Shape{3, 255, 3, 1}, Shape{9, 16, 17, 0},
                           Shape{8, 255, 128, 0}, Shape{33, 3, 31, 0}, Shape{2, 5, 65, 2}}) {
        SCOPED_TRACE(shape(g.M, g.n, g.d));
        Mat<bfloat16> q(g.M, g.d), k(g.n, g.d), p(g.M, g.n), v(g.n, g.d);
        fill(q, gen), fill(k, gen), fill(p, gen, 0.0f, 1.0f), fill(v, gen);
        Mat<float> s_want(g.M, g.n), o_want(g.M, g.d);
        fill(o_want, gen);
        const Mat<float> o0 = o_want;
        mha::simd::decode_scores_bf16(0.25f, q.cview(), k.cview(), s_want.view());
        mha::simd::decode_accumulate_bf16(p.cview(), v.cview(), o_want.view());
        const std::size_t ld = g.d + g.pad;
        const Mat<float> kf = as_float(k, 0), vf = as_float(v, 0);
        GuardedPages gq(g.M * ld * 2), gk(g.n * ld * 2), gp(g.M * (g.n + g.pad) * 2), gv(g.n * ld * 2), gkf(g.n * ld * 4), gvf(g.n * ld * 4);
        ASSERT_TRUE(gq.ok() && gk.ok() && gp.ok() && gv.ok() && gkf.ok() && gvf.ok()) << "mmap failed";
        Mat<float> s(g.M, g.n), o = o0, sf(g.M, g.n), of = o0;
        mha::simd::decode_scores_bf16(0.25f, gq.at_end(q, ld), gk.at_end(k, ld), s.view());
        mha::simd::decode_accumulate_bf16(gp.at_end(p, g.n + g.pad), gv.at_end(v, ld), o.view());
        mha::simd::decode_scores_bf16(0.25f, gq.at_end(q, ld), gkf.at_end(kf, ld), sf.view());
        mha::simd::decode_accumulate_bf16(gp.at_end(p, g.n + g.pad), gvf.at_end(vf, ld), of.view());
        EXPECT_EQ(bits_of(s), bits_of(s_want));
        EXPECT_EQ(bits_of(o), bits_of(o_want));
        EXPECT_EQ(bits_of(sf), bits_of(s_want));
        EXPECT_EQ(bits_of(of), bits_of(o_want));
    }
}

// narrow_rows_bf16 rounds to nearest even like mha::bfloat16::from_float on normal values and NaN; values below
// 2^-126 in magnitude become zero of the same sign (as vdpbf16ps reads them).
TEST(DecodeBf16Kernels, NarrowRoundsToNearestEven) {
    SKIP_WITHOUT_BF16_KERNELS();
    std::mt19937 gen(12);
    for (std::size_t cols : {std::size_t(1), std::size_t(16), std::size_t(17), std::size_t(33), std::size_t(100)}) {
        Mat<float> x(3, cols, 2);
        std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t c = 0; c < cols; ++c) x.at(i, c) = dist(gen);
        x.at(0, 0) = std::bit_cast<float>(0x3f808000u);  // a tie: rounds to even (down)
        if (cols > 1) x.at(0, 1) = std::bit_cast<float>(0x3f818000u);  // a tie: rounds to even (up)
        if (cols > 2) x.at(1, 2) = std::numeric_limits<float>::quiet_NaN();
        if (cols > 3) x.at(2, 3) = -1e-39f;  // below 2^-126
        Mat<bfloat16> y(3, cols, 1);
        mha::simd::narrow_rows_bf16(x.cview(), y.view());
        EXPECT_TRUE(y.outside_intact());
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t c = 0; c < cols; ++c) {
                const float xv = x.at(i, c);
                if (std::isnan(xv)) {
                    EXPECT_TRUE(std::isnan(y.at(i, c).to_float()));
                } else if (std::abs(xv) < 0x1p-126f) {
                    EXPECT_EQ(y.at(i, c).bits, std::signbit(xv) ? 0x8000u : 0u);
                } else {
                    EXPECT_EQ(y.at(i, c).bits, bfloat16::from_float(xv).bits) << i << ", " << c;
                }
            }
    }
}

}  // namespace
