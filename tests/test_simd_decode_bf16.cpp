// The bf16 decode kernels on vdpbf16ps (mha::simd::decode_scores_bf16 / decode_accumulate_bf16,
// lib/simd/decode_bf16_dot_impl.hpp), where simd::bf16_decode_on_dot_products holds (AVX512_BF16; skipped elsewhere:
// there these calls are decode_scores / decode_accumulate, tested in test_simd_decode_kernels.cpp).
// Covered: M ∈ {1, 2, 3, 4, 5, 8, 9, 33} × n ∈ {1, 2, 3, 4, 5, 15, 16, 17, 100} × d ∈ {32, 64, 96, 128, 512}
// (query and key tiles and their tails, one and two 32-column groups per P·V tile), odd row strides, odd and
// even origins; a sentinel around and between s / o's rows that must stay.
//
// Error bounds (u = 2^-24, γ_k = k·u / (1 − k·u)). Every product of two bf16 values is exact in fp32.
// scores: lane l of an accumulator adds, per 32 columns, the two products of its pair (at most two roundings), then
//   a tree of depth 4 over the 16 lanes and the product by scale: each product passes through at most
//   k = 2·d/32 + 5 roundings, so |s − scale·Σ q·k| <= γ_k·|scale|·Σ_c |q_c·k_c|.
// accumulate: per pair of rows at most two roundings, the pairs added in order onto o: every term passes through at
//   most n + 2 roundings: |o_new − (o + Σ p·v)| <= γ_{n+2}·(|o| + Σ_j |p_j·v_j|).
// The double oracle is exact here (products of bf16 values, sums of at most a few hundred terms). A lost, doubled
// or misplaced term of magnitude ~Σ|terms| / d exceeds these bounds (MisplacedTermBreaksTheBound).
// Bitwise: per query row calls; keys split anywhere (scores) and rows split at even positions (accumulate); rows in
// blocks of a paged pool; fp32 rows holding the same values; q and p rounded by the kernel or beforehand.
// fp8 rows (e4m3, e5m2; with AVX512_VBMI, skipped without): every code read as its value (fp8_*::to_float, itself checked against the OCP definition
// in test_quantized_types.cpp), NaN and ±inf included; the bounds above with the tensor scale: scores one rounding
// more (the product by k_scale); accumulate sums each chunk of keys between multiples of 64 from zero and adds
// v_scale times it to o by one FMA, so a term passes through at most 2 + n/2 (its chunk's pairs) + 1 + (n/64 + 1)
// (the FMAs) <= n + 4 roundings for n >= 2.
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
#include <utility>
#include <vector>

#include <mha/mha.hpp>

#include "simd/decode.hpp"
#include "simd/simd.hpp"

namespace {

using mha::bfloat16;
using mha::ConstMatrix;
using mha::Matrix;

constexpr std::size_t kMs[] = {1, 2, 3, 4, 5, 8, 9, 33};
constexpr std::size_t kNs[] = {1, 2, 3, 4, 5, 15, 16, 17, 100};
constexpr std::size_t kDs[] = {32, 64, 96, 128, 512};
constexpr std::size_t kGuard = 19;
constexpr std::uint32_t kSentinel = 0x7fc0beefu;
constexpr double kU = 0x1p-24;

double gamma(std::size_t k) { return double(k) * kU / (1.0 - double(k) * kU); }

class Bf16DecodeDot : public ::testing::Test {
protected:
    void SetUp() override {
        if (!mha::simd::bf16_decode_on_dot_products(1, 32)) GTEST_SKIP() << "no AVX512_BF16 at the active ISA: these kernels do not run here";
    }
};

// rows × cols floats, row stride cols + pad, kGuard sentinels before and after; the pad holds sentinels too.
struct FloatMat {
    std::size_t rows, cols, stride;
    std::vector<float> buf;
    FloatMat(std::size_t r, std::size_t c, std::size_t pad) : rows(r), cols(c), stride(c + pad) {
        buf.assign(2 * kGuard + r * stride, std::bit_cast<float>(kSentinel));
    }
    float& at(std::size_t i, std::size_t j) { return buf[kGuard + i * stride + j]; }
    float at(std::size_t i, std::size_t j) const { return buf[kGuard + i * stride + j]; }
    Matrix view() { return {buf.data() + kGuard, rows, cols, stride}; }
    ConstMatrix cview() const { return {buf.data() + kGuard, rows, cols, stride}; }
    // Uniform in [lo, hi], rounded to bf16 unless raw.
    void fill(std::mt19937& gen, float lo, float hi, bool raw = false) {
        std::uniform_real_distribution<float> dist(lo, hi);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) at(i, j) = raw ? dist(gen) : mha::round_to_bf16(dist(gen));
    }
    bool sentinels_intact() const {
        for (std::size_t x = 0; x < buf.size(); ++x) {
            const bool inside = x >= kGuard && x - kGuard < rows * stride && (x - kGuard) % stride < cols;
            if (!inside && std::bit_cast<std::uint32_t>(buf[x]) != kSentinel) return false;
        }
        return true;
    }
};

// n bf16 rows of d values, row stride d + pad.
struct Rows {
    std::size_t n, d, stride;
    std::vector<bfloat16> buf;
    Rows(std::size_t rows, std::size_t cols, std::size_t pad) : n(rows), d(cols), stride(cols + pad), buf(rows * stride + 1) {}
    void fill(std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
        std::uniform_real_distribution<float> dist(lo, hi);
        for (bfloat16& x : buf) x = bfloat16::from_float(dist(gen));
    }
    float at(std::size_t j, std::size_t c) const { return buf[j * stride + c].to_float(); }
    mha::simd::BlockedRows<bfloat16> view(std::size_t origin = 0) const {
        mha::simd::BlockedRows<bfloat16> r = mha::MatrixView<const bfloat16>(buf.data(), n, d, stride);
        r.origin = origin;
        return r;
    }
    // The same values as fp32 rows.
    std::vector<float> as_float() const {
        std::vector<float> f(buf.size());
        for (std::size_t i = 0; i < buf.size(); ++i) f[i] = buf[i].to_float();
        return f;
    }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string shape(std::size_t M, std::size_t n, std::size_t d) {
    return "M " + std::to_string(M) + " n " + std::to_string(n) + " d " + std::to_string(d);
}

// Elements of s out of the bound of scale·q·kᵀ in double.
std::size_t scores_out_of_bound(float scale, const FloatMat& q, const Rows& k, const FloatMat& s) {
    const std::size_t d = q.cols, rounds = 2 * d / 32 + 5;
    std::size_t bad = 0;
    for (std::size_t m = 0; m < q.rows; ++m)
        for (std::size_t j = 0; j < k.n; ++j) {
            double want = 0, mag = 0;
            for (std::size_t c = 0; c < d; ++c) {
                const double t = double(mha::round_to_bf16(q.at(m, c))) * double(k.at(j, c));
                want += t, mag += std::fabs(t);
            }
            if (!(std::fabs(double(s.at(m, j)) - double(scale) * want) <= gamma(rounds) * std::fabs(double(scale)) * mag)) ++bad;
        }
    return bad;
}

// Elements of o out of the bound of o0 + p·v in double.
std::size_t accumulate_out_of_bound(const FloatMat& p, const Rows& v, const FloatMat& o0, const FloatMat& o) {
    std::size_t bad = 0;
    for (std::size_t m = 0; m < p.rows; ++m)
        for (std::size_t c = 0; c < v.d; ++c) {
            double want = o0.at(m, c), mag = std::fabs(want);
            for (std::size_t j = 0; j < v.n; ++j) {
                const double t = double(mha::round_to_bf16(p.at(m, j))) * double(v.at(j, c));
                want += t, mag += std::fabs(t);
            }
            if (!(std::fabs(double(o.at(m, c)) - want) <= gamma(v.n + 2) * mag)) ++bad;
        }
    return bad;
}

TEST_F(Bf16DecodeDot, ScoresWithinTheBoundAndTheSameBitsEverywhere) {
    std::mt19937 gen(41);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                if (M * d > mha::simd::kDotMaxQueryValues) continue;  // the widened kernels there (WhereTheKernelsRun)
                SCOPED_TRACE(shape(M, n, d));
                ASSERT_TRUE(mha::simd::bf16_decode_on_dot_products(M, d));
                const float scale = 0.125f;
                FloatMat q(M, d, c % 3), s(M, n, c % 2);
                q.fill(gen, -1.0f, 1.0f);
                Rows k(n, d, c % 5);
                k.fill(gen);
                mha::simd::decode_scores_bf16(scale, q.cview(), k.view(), s.view());
                ASSERT_EQ(scores_out_of_bound(scale, q, k, s), 0u);
                EXPECT_TRUE(s.sentinels_intact());
                // Each query row alone, and the keys in two calls split at n / 3.
                FloatMat rows(M, n, c % 2);
                for (std::size_t m = 0; m < M; ++m) {
                    const std::size_t cut = n / 3;
                    mha::simd::BlockedRows<bfloat16> lo = k.view(), hi = k.view();
                    lo.rows = cut, hi.data += cut * k.stride, hi.rows = n - cut;
                    const ConstMatrix qm{q.cview().data + m * q.stride, 1, d, q.stride};
                    if (cut != 0) mha::simd::decode_scores_bf16(scale, qm, lo, Matrix{&rows.at(m, 0), 1, cut, rows.stride});
                    mha::simd::decode_scores_bf16(scale, qm, hi, Matrix{&rows.at(m, cut), 1, n - cut, rows.stride});
                }
                EXPECT_TRUE(same_bits(rows.buf, s.buf)) << "per row, keys split";
                // fp32 rows holding the same values.
                const std::vector<float> kf = k.as_float();
                FloatMat sf(M, n, c % 2);
                mha::simd::decode_scores_bf16(scale, q.cview(), mha::MatrixView<const float>(kf.data(), n, d, k.stride), sf.view());
                EXPECT_TRUE(same_bits(sf.buf, s.buf)) << "fp32 rows";
            }
}

TEST_F(Bf16DecodeDot, AccumulateWithinTheBoundAndTheSameBitsEverywhere) {
    std::mt19937 gen(42);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                if (M * d > mha::simd::kDotMaxQueryValues) continue;
                SCOPED_TRACE(shape(M, n, d));
                ASSERT_TRUE(mha::simd::bf16_decode_on_dot_products(M, d));
                const std::size_t origin = c * 7 % 150;
                FloatMat p(M, n, c % 3), o(M, d, c % 2);
                p.fill(gen, 0.0f, 1.0f);
                o.fill(gen, -2.0f, 2.0f, /*raw=*/true);
                Rows v(n, d, c % 5);
                v.fill(gen);
                const FloatMat o0 = o;
                mha::simd::decode_accumulate_bf16(p.cview(), v.view(origin), o.view());
                ASSERT_EQ(accumulate_out_of_bound(p, v, o0, o), 0u) << "origin " << origin;
                EXPECT_TRUE(o.sentinels_intact());
                // Each query row alone, and the rows in two calls split at an even position.
                FloatMat rows = o0;
                const std::size_t cut = std::min(n, n / 2 + (origin + n / 2) % 2);  // origin + cut even
                for (std::size_t m = 0; m < M; ++m) {
                    mha::simd::BlockedRows<bfloat16> lo = v.view(origin), hi = v.view(origin + cut);
                    lo.rows = cut, hi.data += cut * v.stride, hi.rows = n - cut;
                    const Matrix om{&rows.at(m, 0), 1, d, rows.stride};
                    if (cut != 0) mha::simd::decode_accumulate_bf16(ConstMatrix{&p.at(m, 0), 1, cut, p.stride}, lo, om);
                    if (cut != n) mha::simd::decode_accumulate_bf16(ConstMatrix{&p.at(m, cut), 1, n - cut, p.stride}, hi, om);
                }
                EXPECT_TRUE(same_bits(rows.buf, o.buf)) << "per row, split at " << cut << " (origin " << origin << ")";
                const std::vector<float> vf = v.as_float();
                FloatMat of = o0;
                mha::simd::BlockedRows<float> fr = mha::MatrixView<const float>(vf.data(), n, d, v.stride);
                fr.origin = origin;
                mha::simd::decode_accumulate_bf16(p.cview(), fr, of.view());
                EXPECT_TRUE(same_bits(of.buf, o.buf)) << "fp32 rows";
            }
}

// q and p that are not bf16 values are rounded to nearest even by the kernels: the bits of the same call on
// q and p rounded beforehand.
TEST_F(Bf16DecodeDot, RoundsQueriesAndProbabilities) {
    std::mt19937 gen(43);
    const std::size_t M = 4, n = 37, d = 128;
    FloatMat q(M, d, 1), p(M, n, 0), s(M, n, 0), s_rounded(M, n, 0);
    q.fill(gen, -1.0f, 1.0f, /*raw=*/true);
    p.fill(gen, 0.0f, 1.0f, /*raw=*/true);
    FloatMat qr = q, pr = p;
    for (float& x : qr.buf)
        if (std::bit_cast<std::uint32_t>(x) != kSentinel) x = mha::round_to_bf16(x);
    for (float& x : pr.buf)
        if (std::bit_cast<std::uint32_t>(x) != kSentinel) x = mha::round_to_bf16(x);
    Rows k(n, d, 0);
    k.fill(gen);
    mha::simd::decode_scores_bf16(0.5f, q.cview(), k.view(), s.view());
    mha::simd::decode_scores_bf16(0.5f, qr.cview(), k.view(), s_rounded.view());
    EXPECT_TRUE(same_bits(s.buf, s_rounded.buf));
    FloatMat o(M, d, 0), o_rounded(M, d, 0);
    o.fill(gen, -1.0f, 1.0f);
    o_rounded = o;
    mha::simd::decode_accumulate_bf16(p.cview(), k.view(), o.view());
    mha::simd::decode_accumulate_bf16(pr.cview(), k.view(), o_rounded.view());
    EXPECT_TRUE(same_bits(o.buf, o_rounded.buf));
}

// Rows in blocks of 16 of a paged pool (scattered, reused ids; a start inside a block): the bits of the same rows
// read contiguously; and no read past the last row (a PROT_NONE page right after it).
TEST_F(Bf16DecodeDot, BlockedRowsAndTheEndOfTheRows) {
    std::mt19937 gen(44);
    const std::size_t d = 96, bs = 16, M = 5, n = 150, first = 5, origin = 3 * bs + first;
    const std::uint32_t table[] = {9, 3, 0, 6, 2, 5, 1, 8, 7, 4, 3};
    Rows x(n, d, 0);
    x.fill(gen);
    std::vector<bfloat16> pool(10 * bs * d);
    for (std::size_t j = 0; j < n; ++j) {
        const std::size_t r = first + j;
        std::memcpy(&pool[(table[r / bs] * bs + r % bs) * d], &x.buf[j * d], d * sizeof(bfloat16));
    }
    mha::simd::BlockMap map;
    map.table = table, map.shift = 4, map.block_bytes = bs * d * sizeof(bfloat16), map.first = first;
    const mha::simd::BlockedRows<bfloat16> blocked(pool.data(), n, d, d, map, origin);

    FloatMat q(M, d, 0), s(M, n, 0), sb(M, n, 0), p(M, n, 0), o(M, d, 0);
    q.fill(gen, -1.0f, 1.0f);
    p.fill(gen, 0.0f, 1.0f);
    o.fill(gen, -1.0f, 1.0f);
    FloatMat ob = o, oe = o;
    mha::simd::decode_scores_bf16(0.25f, q.cview(), x.view(origin), s.view());
    mha::simd::decode_scores_bf16(0.25f, q.cview(), blocked, sb.view());
    EXPECT_TRUE(same_bits(s.buf, sb.buf)) << "scores";
    mha::simd::decode_accumulate_bf16(p.cview(), x.view(origin), o.view());
    mha::simd::decode_accumulate_bf16(p.cview(), blocked, ob.view());
    EXPECT_TRUE(same_bits(o.buf, ob.buf)) << "accumulate";

    // The rows end at a page that may not be read.
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), bytes = n * d * sizeof(bfloat16);
    const std::size_t span = (bytes + page - 1) / page * page;
    void* map_at = mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map_at, MAP_FAILED);
    unsigned char* base = static_cast<unsigned char*>(map_at);
    ASSERT_EQ(mprotect(base + span, page, PROT_NONE), 0);
    std::memcpy(base + span - bytes, x.buf.data(), bytes);
    mha::simd::BlockedRows<bfloat16> at_end = mha::MatrixView<const bfloat16>(reinterpret_cast<const bfloat16*>(base + span - bytes), n, d, d);
    at_end.origin = origin;
    FloatMat se(M, n, 0);
    mha::simd::decode_scores_bf16(0.25f, q.cview(), at_end, se.view());
    mha::simd::decode_accumulate_bf16(p.cview(), at_end, oe.view());
    munmap(map_at, span + page);
    EXPECT_TRUE(same_bits(s.buf, se.buf)) << "scores at the end of a mapping";
    EXPECT_TRUE(same_bits(o.buf, oe.buf)) << "accumulate at the end of a mapping";
}

// A NaN in a key row makes that key's scores NaN and no other; a NaN probability makes its row of o NaN and no other.
TEST_F(Bf16DecodeDot, NanStaysWhereItIs) {
    std::mt19937 gen(45);
    const std::size_t M = 4, n = 20, d = 64;
    FloatMat q(M, d, 0), s(M, n, 0), p(M, n, 0), o(M, d, 0);
    q.fill(gen, -1.0f, 1.0f);
    p.fill(gen, 0.0f, 1.0f);
    o.fill(gen, -1.0f, 1.0f);
    Rows k(n, d, 0);
    k.fill(gen);
    k.buf[7 * d + 33] = bfloat16::from_bits(0x7fc1);
    mha::simd::decode_scores_bf16(1.0f, q.cview(), k.view(), s.view());
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t j = 0; j < n; ++j) EXPECT_EQ(std::isnan(s.at(m, j)), j == 7) << m << ", " << j;
    k.buf[7 * d + 33] = bfloat16::from_float(0.5f);
    p.at(2, 11) = std::numeric_limits<float>::quiet_NaN();
    mha::simd::decode_accumulate_bf16(p.cview(), k.view(), o.view());
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t c = 0; c < d; ++c) EXPECT_EQ(std::isnan(o.at(m, c)), m == 2) << m << ", " << c;
}

// The bounds catch a misplaced term: a result with one product moved to another key / column is refused.
TEST_F(Bf16DecodeDot, MisplacedTermBreaksTheBound) {
    std::mt19937 gen(46);
    const std::size_t M = 4, n = 40, d = 128;
    FloatMat q(M, d, 0), s(M, n, 0), p(M, n, 0), o(M, d, 0);
    q.fill(gen, -1.0f, 1.0f);
    p.fill(gen, 0.0f, 1.0f);
    o.fill(gen, -1.0f, 1.0f);
    Rows k(n, d, 0);
    k.fill(gen);
    const FloatMat o0 = o;
    mha::simd::decode_scores_bf16(1.0f, q.cview(), k.view(), s.view());
    mha::simd::decode_accumulate_bf16(p.cview(), k.view(), o.view());
    ASSERT_EQ(scores_out_of_bound(1.0f, q, k, s), 0u);
    ASSERT_EQ(accumulate_out_of_bound(p, k, o0, o), 0u);
    std::size_t cq = 0, jp = 0;  // the largest product of s[1, 5], and of o[2, 17]'s terms
    for (std::size_t x = 0; x < d; ++x)
        if (std::fabs(q.at(1, x) * k.at(5, x)) > std::fabs(q.at(1, cq) * k.at(5, cq))) cq = x;
    for (std::size_t j = 0; j < n; ++j)
        if (std::fabs(p.at(2, j) * k.at(j, 17)) > std::fabs(p.at(2, jp) * k.at(jp, 17))) jp = j;
    s.at(1, 5) += q.at(1, cq) * k.at(5, cq);  // a doubled product
    EXPECT_EQ(scores_out_of_bound(1.0f, q, k, s), 1u);
    o.at(2, 17) -= p.at(2, jp) * k.at(jp, 17);  // a lost term
    EXPECT_EQ(accumulate_out_of_bound(p, k, o0, o), 1u);
}

// fp8 rows of E, n × d codes, row stride d + pad.
template <class E>
struct Fp8Rows {
    std::size_t n, d, stride;
    std::vector<E> buf;
    Fp8Rows(std::size_t rows, std::size_t cols, std::size_t pad) : n(rows), d(cols), stride(cols + pad), buf(rows * stride + 1) {}
    // Random finite codes of every exponent.
    void fill(std::mt19937& gen) {
        std::uniform_int_distribution<int> code(0, 255);
        for (E& x : buf) {
            do x = E::from_bits(static_cast<std::uint8_t>(code(gen)));
            while (!std::isfinite(x.to_float()));
        }
    }
    double at(std::size_t j, std::size_t c) const { return double(buf[j * stride + c].to_float()); }
    mha::simd::BlockedRows<E> view(std::size_t origin = 0) const {
        mha::simd::BlockedRows<E> r = mha::MatrixView<const E>(buf.data(), n, d, stride);
        r.origin = origin;
        return r;
    }
};

// Every code of E read as its value: scores of a query of ones against rows holding one code each (the rest +0),
// and P·V of one row of 32 codes with p = 1.
template <class E>
void every_code_is_its_value() {
    SCOPED_TRACE((std::is_same_v<E, mha::fp8_e4m3> ? "e4m3" : "e5m2"));
    const std::size_t d = 32, n = 256;
    Fp8Rows<E> k(n, d, 0);
    for (std::size_t j = 0; j < n; ++j) {
        for (std::size_t c = 0; c < d; ++c) k.buf[j * d + c] = E::from_bits(0);
        k.buf[j * d + j % d] = E::from_bits(static_cast<std::uint8_t>(j));
    }
    FloatMat q(1, d, 0), s(1, n, 0);
    for (std::size_t c = 0; c < d; ++c) q.at(0, c) = 1.0f;
    mha::simd::decode_scores_bf16(1.0f, q.cview(), k.view(), s.view());
    for (std::size_t j = 0; j < n; ++j) {
        const float want = E::from_bits(static_cast<std::uint8_t>(j)).to_float();
        if (std::isnan(want))
            EXPECT_TRUE(std::isnan(s.at(0, j))) << "code " << j;
        else
            EXPECT_EQ(s.at(0, j), want) << "code " << j;
    }
    // Rows of 32 (the 32-column tile) and of 64 codes (the 64-column tile), at odd and even positions.
    for (std::size_t dv : {32, 64})
        for (std::size_t r = 0; r < n / dv; ++r) {
            Fp8Rows<E> v(1, dv, 0);
            for (std::size_t c = 0; c < dv; ++c) v.buf[c] = E::from_bits(static_cast<std::uint8_t>(r * dv + c));
            FloatMat p(1, 1, 0), o(1, dv, 0);
            p.at(0, 0) = 1.0f;
            for (std::size_t c = 0; c < dv; ++c) o.at(0, c) = 0.0f;
            mha::simd::decode_accumulate_bf16(p.cview(), v.view(r), o.view());
            for (std::size_t c = 0; c < dv; ++c) {
                const float want = v.buf[c].to_float();
                if (std::isnan(want))
                    EXPECT_TRUE(std::isnan(o.at(0, c))) << "code " << r * dv + c;
                else
                    EXPECT_EQ(o.at(0, c), want) << "code " << r * dv + c;
            }
        }
}

TEST_F(Bf16DecodeDot, Fp8EveryCodeIsItsValue) {
    if (!mha::simd::fp8_decode_on_dot_products(1, 32)) GTEST_SKIP() << "no AVX512_VBMI: fp8 rows take the widened kernels";
    every_code_is_its_value<mha::fp8_e4m3>();
    every_code_is_its_value<mha::fp8_e5m2>();
}

// Random fp8 rows with tensor scales: within the bounds (header) against float64, and the same bits per query row,
// with the keys split anywhere (scores) and the rows split at a multiple of 64 of the absolute position (accumulate).
template <class E>
void fp8_within_the_bound(std::mt19937& gen) {
    SCOPED_TRACE((std::is_same_v<E, mha::fp8_e4m3> ? "e4m3" : "e5m2"));
    const float scale = 0.125f, k_scale = 0.37f, v_scale = 1.9f;
    std::size_t c = 0;
    for (std::size_t M : {1, 3, 4, 5, 8})
        for (std::size_t n : {1, 2, 5, 17, 100, 130})
            for (std::size_t d : {32, 128}) {
                ++c;
                SCOPED_TRACE(shape(M, n, d));
                FloatMat q(M, d, c % 3), s(M, n, c % 2), p(M, n, c % 3), o(M, d, c % 2);
                q.fill(gen, -1.0f, 1.0f);
                p.fill(gen, 0.0f, 1.0f);
                o.fill(gen, -2.0f, 2.0f, /*raw=*/true);
                Fp8Rows<E> k(n, d, c % 5);
                k.fill(gen);
                const std::size_t origin = c * 23 % 150;
                const FloatMat o0 = o;
                mha::simd::decode_scores_bf16(scale, q.cview(), k.view(), s.view(), {}, k_scale);
                mha::simd::decode_accumulate_bf16(p.cview(), k.view(origin), o.view(), {}, v_scale);
                const std::size_t rounds = 2 * d / 32 + 6;
                std::size_t bad = 0;
                for (std::size_t m = 0; m < M; ++m)
                    for (std::size_t j = 0; j < n; ++j) {
                        double want = 0, mag = 0;
                        for (std::size_t x = 0; x < d; ++x) {
                            const double t = double(q.at(m, x)) * k.at(j, x);
                            want += t, mag += std::fabs(t);
                        }
                        const double f = double(scale) * double(k_scale);
                        if (!(std::fabs(double(s.at(m, j)) - f * want) <= gamma(rounds) * f * mag)) ++bad;
                    }
                EXPECT_EQ(bad, 0u) << "scores";
                for (std::size_t m = 0; m < M; ++m)
                    for (std::size_t x = 0; x < d; ++x) {
                        double sum = 0, mag = 0;
                        for (std::size_t j = 0; j < n; ++j) {
                            const double t = double(p.at(m, j)) * k.at(j, x);
                            sum += t, mag += std::fabs(t);
                        }
                        const double want = double(o0.at(m, x)) + double(v_scale) * sum;
                        const double bound = gamma(std::max<std::size_t>(n, 2) + 4) * (std::fabs(double(o0.at(m, x))) + double(v_scale) * mag);
                        if (!(std::fabs(double(o.at(m, x)) - want) <= bound)) ++bad;
                    }
                EXPECT_EQ(bad, 0u) << "accumulate";
                EXPECT_TRUE(s.sentinels_intact() && o.sentinels_intact());
                // Per query row; keys split at n / 3 (scores), rows at the first multiple of 64 of origin + j.
                FloatMat sr(M, n, c % 2), orow = o0;
                const std::size_t cut = std::min(n, (64 - origin % 64) % 64);
                for (std::size_t m = 0; m < M; ++m) {
                    const ConstMatrix qm{&q.at(m, 0), 1, d, q.stride};
                    const std::size_t kc = n / 3;
                    mha::simd::BlockedRows<E> lo = k.view(), hi = k.view();
                    lo.rows = kc, hi.data += kc * k.stride, hi.rows = n - kc;
                    if (kc != 0) mha::simd::decode_scores_bf16(scale, qm, lo, Matrix{&sr.at(m, 0), 1, kc, sr.stride}, {}, k_scale);
                    mha::simd::decode_scores_bf16(scale, qm, hi, Matrix{&sr.at(m, kc), 1, n - kc, sr.stride}, {}, k_scale);
                    mha::simd::BlockedRows<E> vlo = k.view(origin), vhi = k.view(origin + cut);
                    vlo.rows = cut, vhi.data += cut * k.stride, vhi.rows = n - cut;
                    const Matrix om{&orow.at(m, 0), 1, d, orow.stride};
                    if (cut != 0) mha::simd::decode_accumulate_bf16(ConstMatrix{&p.at(m, 0), 1, cut, p.stride}, vlo, om, {}, v_scale);
                    if (cut != n) mha::simd::decode_accumulate_bf16(ConstMatrix{&p.at(m, cut), 1, n - cut, p.stride}, vhi, om, {}, v_scale);
                }
                EXPECT_TRUE(same_bits(sr.buf, s.buf)) << "scores per row, keys split";
                EXPECT_TRUE(same_bits(orow.buf, o.buf)) << "accumulate per row, split at " << cut << " (origin " << origin << ")";
            }
}

TEST_F(Bf16DecodeDot, Fp8WithinTheBoundAndTheSameBitsEverywhere) {
    if (!mha::simd::fp8_decode_on_dot_products(1, 32)) GTEST_SKIP() << "no AVX512_VBMI: fp8 rows take the widened kernels";
    std::mt19937 gen(47);
    fp8_within_the_bound<mha::fp8_e4m3>(gen);
    fp8_within_the_bound<mha::fp8_e5m2>(gen);
}

TEST_F(Bf16DecodeDot, WhereTheKernelsRun) {
    EXPECT_TRUE(mha::simd::bf16_decode_on_dot_products(mha::simd::kBf16DotMaxRows, 64));
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(mha::simd::kBf16DotMaxRows + 1, 32));
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(4, 80));
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(4, mha::simd::kBf16DotMaxCols + 32));
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(32, 512));  // M·d above kDotMaxQueryValues
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(0, 64));
#if defined(__x86_64__)
    EXPECT_EQ(mha::simd::fp8_decode_on_dot_products(4, 128), __builtin_cpu_supports("avx512vbmi") != 0);  // an independent check
#endif
    EXPECT_FALSE(mha::simd::fp8_decode_on_dot_products(4, 80));
    mha::set_isa_cap(mha::Isa::avx512);
    EXPECT_FALSE(mha::simd::bf16_decode_on_dot_products(4, 128));
    EXPECT_FALSE(mha::simd::fp8_decode_on_dot_products(4, 128));
    mha::set_isa_cap(mha::detected_isa());
}

}  // namespace
