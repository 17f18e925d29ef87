// The decode kernels mha::simd::decode_scores / decode_accumulate on 8-bit K and V (a KV cache's int8, fp8_e4m3
// and fp8_e5m2 rows, mha/quantized.hpp), once per ISA this CPU has (mha::set_isa_cap).
// Contract (simd.hpp): the rows are widened as they are loaded to exactly ElementFormat::widen's values (int8:
// q·s_b with the row's float16 scale of block b; fp8: to_float·scale), and the arithmetic and its order are those
// of float K / V holding them; except int8 V, whose block scales are folded into P (o += Σ_j fl(p_j·s_j,b)·q_j,c).
// So the oracle is the float kernel itself on the widened rows (int8 V: per block, on P·s_b and the integers), and
// the check is bitwise equality, a NaN equal to any NaN (the float kernel has its own error bounds in
// test_simd_decode_kernels.cpp). A lane read from the wrong column, a wrong block's scale, a lost tail element,
// a wrong conversion (every fp8 code is used, NaN and the subnormals included) or a read of padding changes the
// bits. (At the avx512_bf16 level on CPUs with AVX512_VNNI, int8 scores with d a multiple of 64 are integer dot
// products instead: Int8DotProducts checks them against their own scalar model.)
// Covered: M ∈ {1, 2, 3, 4, 5, 8, 9, 17} × n ∈ {1, 2, 3, 4, 5, 16, 17, 255} × d ∈ {1, 3, 7, 8, 9, 15, 16, 17, 31,
// 32, 33, 63, 64, 80, 128, 129, 300, 544} (vectors of 4, 8 and 16 lanes, full and partial, int8 blocks of 32 and
// their short last one, more blocks than a vector has lanes), odd row strides and element offsets, fp8 scales 1,
// 0.37, 3 and 2e36; the padding of every row (after an int8 row's scales too), the rows past n and guards around
// the buffer hold NaN codes (0x7f / 0xff for fp8, a NaN scale for int8: a read one makes a result NaN); K / V
// that end at a PROT_NONE page.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
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
#include "core/element_format.hpp"
#include "simd/decode.hpp"
#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

using mha_test::same_bits_or_nan;  // a NaN's sign and payload are not part of the contract

using mha::ConstMatrix;
using mha::DataType;
using mha::Isa;
using mha::Matrix;

constexpr std::size_t kMs[] = {1, 2, 3, 4, 5, 8, 9, 17};
constexpr std::size_t kNs[] = {1, 2, 3, 4, 5, 16, 17, 255};
constexpr std::size_t kDs[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 80, 128, 129, 300, 544};
constexpr std::size_t kGuard = 67;
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;

// rows of d values of type t in a byte buffer: stride (elements = bytes) = the stored row + pad, `extra` rows
// after the view, every byte outside the rows 0xff (an fp8 NaN; for int8 it lands in the scales: NaN).
// wide() is the same rows widened by ElementFormat (its outside: the float sentinel NaN).
struct ByteMat {
    DataType type;
    float scale;
    std::size_t rows, d, stride, begin, extra;
    std::vector<unsigned char> buf;
    std::vector<float> wide_buf;
    ByteMat(DataType t, float s, std::size_t r, std::size_t cols, std::size_t pad, std::size_t offset, std::size_t ex)
        : type(t), scale(s), rows(r), d(cols), stride(mha::detail::element_format(t).row_elements(cols) + pad), begin(kGuard + offset),
          extra(ex) {
        buf.assign(begin + (r + ex) * stride + kGuard, 0xff);
        wide_buf.assign(kGuard + (r + ex) * d + kGuard, std::bit_cast<float>(kSentinelBits));
    }
    unsigned char* row(std::size_t i) { return buf.data() + begin + i * stride; }
    // Values spanning several binades (and, for fp8 with small scales, the subnormals), quantized.
    void fill(std::mt19937& gen) {
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::uniform_int_distribution<int> e(-8, 6);
        std::vector<float> x(d);
        for (std::size_t i = 0; i < rows; ++i) {
            for (float& v : x) v = std::ldexp(dist(gen), e(gen));
            set_row(i, x.data());
        }
    }
    void set_row(std::size_t i, const float* x) {
        const auto& f = mha::detail::element_format(type);
        f.narrow(x, row(i), d, scale);
        f.widen(row(i), wide_buf.data() + kGuard + i * d, d, scale);
    }
    // Every fp8 code, cycled over the elements (NaN and ±0 and the subnormals included).
    void fill_codes(std::size_t first) {
        for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t j = 0; j < d; ++j) row(i)[j] = static_cast<unsigned char>((first + i * d + j) % 256);
            mha::detail::element_format(type).widen(row(i), wide_buf.data() + kGuard + i * d, d, scale);
        }
    }
    // wide() again from the bytes (after they were written directly).
    void rewiden() {
        for (std::size_t i = 0; i < rows; ++i) mha::detail::element_format(type).widen(row(i), wide_buf.data() + kGuard + i * d, d, scale);
    }
    template <class E>
    mha::MatrixView<const E> view() const {
        return {reinterpret_cast<const E*>(buf.data() + begin), rows, d, stride};
    }
    ConstMatrix wide() const { return {wide_buf.data() + kGuard, rows, d, d}; }
};

struct FloatMat {
    std::size_t rows, cols, stride;
    std::vector<float> buf;
    FloatMat(std::size_t r, std::size_t c, std::size_t pad) : rows(r), cols(c), stride(c + pad) {
        buf.assign(2 * kGuard + r * stride, std::bit_cast<float>(kSentinelBits));
    }
    void fill(std::mt19937& gen, float lo, float hi) {
        std::uniform_real_distribution<float> dist(lo, hi);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) buf[kGuard + i * stride + j] = dist(gen);
    }
    Matrix view() { return {buf.data() + kGuard, rows, cols, stride}; }
    ConstMatrix cview() const { return {buf.data() + kGuard, rows, cols, stride}; }
};


template <class F>
void with_type(DataType t, F&& f) {
    if (t == DataType::int8) return f(mha::qint8{});
    if (t == DataType::fp8_e4m3) return f(mha::fp8_e4m3{});
    f(mha::fp8_e5m2{});
}

void scores(float scale, ConstMatrix q, const ByteMat& k, Matrix s) {
    with_type(k.type, [&](auto e) { mha::simd::decode_scores(scale, q, k.view<decltype(e)>(), s, {}, k.scale); });
}
void accumulate(ConstMatrix p, const ByteMat& v, Matrix o) {
    with_type(v.type, [&](auto e) { mha::simd::decode_accumulate(p, v.view<decltype(e)>(), o, {}, v.scale); });
}

// What decode_accumulate must give (simd.hpp): fp8, the float kernel on the widened rows; int8, whose block scales
// fold into P, per block b of 32 columns the float kernel on P·s_b (one float product per element) and the
// integers as floats.
void accumulate_model(ConstMatrix p, ByteMat& v, Matrix o) {
    if (v.type != DataType::int8) return mha::simd::decode_accumulate(p, v.wide(), o);
    const std::size_t M = p.rows, n = v.rows;
    for (std::size_t c0 = 0; c0 < v.d; c0 += mha::kInt8Block) {
        const std::size_t w = std::min(mha::kInt8Block, v.d - c0);
        std::vector<float> pb(M * n), vb(n * w);
        for (std::size_t j = 0; j < n; ++j) {
            const float s = mha::int8_row_scale(v.row(j), v.d, c0 / mha::kInt8Block);
            for (std::size_t m = 0; m < M; ++m) pb[m * n + j] = p.data[m * p.stride + j] * s;
            for (std::size_t c = 0; c < w; ++c) vb[j * w + c] = static_cast<float>(static_cast<std::int8_t>(v.row(j)[c0 + c]));
        }
        mha::simd::decode_accumulate(ConstMatrix{pb.data(), M, n, n}, ConstMatrix{vb.data(), n, w, w}, Matrix{o.data + c0, M, w, o.stride});
    }
}

struct Param {
    Isa isa;
    DataType type;
};

class Decode8Bit : public ::testing::TestWithParam<Param> {
protected:
    void SetUp() override {
        if (GetParam().isa > mha::detected_isa()) GTEST_SKIP() << "this CPU has no " << mha::isa_name(GetParam().isa);
        saved_ = mha::active_isa();
        mha::set_isa_cap(GetParam().isa);
        ASSERT_EQ(mha::active_isa(), GetParam().isa);
    }
    void TearDown() override { mha::set_isa_cap(saved_); }
    Isa saved_ = Isa::avx512_bf16;
};

float scale_for(DataType t, std::size_t c) {
    if (t == DataType::int8) return 1.0f;
    const float s[] = {1.0f, 0.37f, 3.0f, 2e36f};  // 2e36: 256·scale overflows (e4m3 then scales in two products)
    return s[c % 4];
}

TEST_P(Decode8Bit, ScoresEqualTheFloatKernelOnWidenedKeys) {
    const DataType t = GetParam().type;
    std::mt19937 gen(21);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5;
                FloatMat q(M, d, c % 2), s8(M, n, c % 3), s32(M, n, c % 3);
                q.fill(gen, -2.0f, 2.0f);
                ByteMat k(t, scale_for(t, c), n, d, pad, offset, 2);
                k.fill(gen);
                scores(0.37f, q.cview(), k, s8.view());
                mha::simd::decode_scores(0.37f, q.cview(), k.wide(), s32.view());
                ASSERT_TRUE(same_bits_or_nan(s8.buf, s32.buf)) << "M " << M << " n " << n << " d " << d << " pad " << pad << " offset " << offset;
            }
}

TEST_P(Decode8Bit, AccumulateEqualsTheFloatKernelOnWidenedValues) {
    const DataType t = GetParam().type;
    std::mt19937 gen(22);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5;
                FloatMat p(M, n, c % 2), o8(M, d, c % 3);
                p.fill(gen, 0.0f, 1.0f);
                o8.fill(gen, -1.0f, 1.0f);
                FloatMat o32 = o8;
                ByteMat v(t, scale_for(t, c), n, d, pad, offset, 2);
                v.fill(gen);
                accumulate(p.cview(), v, o8.view());
                accumulate_model(p.cview(), v, o32.view());
                ASSERT_TRUE(same_bits_or_nan(o8.buf, o32.buf)) << "M " << M << " n " << n << " d " << d << " pad " << pad << " offset " << offset;
            }
}

// Every fp8 code (NaN, ±0, subnormals, the largest finite, e5m2's ±inf) widens exactly; for int8, blocks whose
// scale is NaN (a block that held NaN or ±inf), zero, subnormal or the largest float16.
TEST_P(Decode8Bit, SpecialValuesWidenExactly) {
    const DataType t = GetParam().type;
    std::mt19937 gen(23);
    for (std::size_t d : {std::size_t(5), std::size_t(16), std::size_t(37), std::size_t(64)}) {
        const std::size_t n = 23, M = 3;
        ByteMat k(t, t == DataType::int8 ? 1.0f : 0.5f, n, d, 1, 0, 0);
        if (t == DataType::int8) {
            std::vector<float> x(d);
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f, 1e-6f,
                                      1e10f, 1.0f};
            for (std::size_t i = 0; i < n; ++i) {
                for (std::size_t j = 0; j < d; ++j) x[j] = dist(gen) * specials[(i + j / 32) % 6];
                if ((i + 1) % 6 == 0) x[d / 2] = -std::numeric_limits<float>::infinity();
                k.set_row(i, x.data());
            }
        } else {
            k.fill_codes(7);
        }
        FloatMat q(M, d, 0), s8(M, n, 0), s32(M, n, 0), p(M, n, 0), o8(M, d, 0);
        q.fill(gen, -1.0f, 1.0f);
        p.fill(gen, 0.0f, 1.0f);
        o8.fill(gen, -1.0f, 1.0f);
        FloatMat o32 = o8;
        scores(1.0f, q.cview(), k, s8.view());
        mha::simd::decode_scores(1.0f, q.cview(), k.wide(), s32.view());
        EXPECT_TRUE(same_bits_or_nan(s8.buf, s32.buf)) << "scores, d " << d;
        accumulate(p.cview(), k, o8.view());
        accumulate_model(p.cview(), k, o32.view());
        EXPECT_TRUE(same_bits_or_nan(o8.buf, o32.buf)) << "accumulate, d " << d;
        // One row at a time, so that a block whose scale is NaN leaves the other columns finite and checked.
        for (std::size_t i = 0; i < n; ++i) {
            ByteMat one(t, k.scale, 1, d, 1, 0, 0);
            std::memcpy(one.row(0), k.row(i), mha::detail::element_format(t).row_elements(d));
            one.rewiden();
            FloatMat a(M, d, 0);
            a.fill(gen, -1.0f, 1.0f);
            FloatMat b = a;
            const ConstMatrix pi{p.buf.data() + kGuard + i, M, 1, p.stride};
            accumulate(pi, one, a.view());
            accumulate_model(pi, one, b.view());
            EXPECT_TRUE(same_bits_or_nan(a.buf, b.buf)) << "accumulate row " << i << ", d " << d;
        }
    }
}

// Rows of k copied to end exactly at a PROT_NONE page: n rows of `row` bytes, `ld` bytes apart. Unmapped on
// destruction; data() is null if mmap failed.
class AtPageEnd {
public:
    AtPageEnd(const ByteMat& k, std::size_t row, std::size_t ld) {
        const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), bytes = (k.rows - 1) * ld + row;
        size_ = (bytes + page - 1) / page * page + page;
        map_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map_ == MAP_FAILED || mprotect(static_cast<char*>(map_) + size_ - page, page, PROT_NONE) != 0) return;
        data_ = static_cast<unsigned char*>(map_) + size_ - page - bytes;
        for (std::size_t i = 0; i < k.rows; ++i) std::memcpy(data_ + i * ld, const_cast<ByteMat&>(k).row(i), row);
    }
    ~AtPageEnd() {
        if (map_ != MAP_FAILED) munmap(map_, size_);
    }
    AtPageEnd(const AtPageEnd&) = delete;
    AtPageEnd& operator=(const AtPageEnd&) = delete;
    const unsigned char* data() const { return data_; }

private:
    void* map_ = MAP_FAILED;
    std::size_t size_ = 0;
    unsigned char* data_ = nullptr;
};

// K / V whose last byte is the last of a page followed by a PROT_NONE page: no read past the tile (for int8 the
// row ends with its scales).
TEST_P(Decode8Bit, ReadsEndAtTheTile) {
    const DataType t = GetParam().type;
    std::mt19937 gen(24);
    for (const auto& [M, n, d, pad] : std::vector<std::array<std::size_t, 4>>{
             {1, 1, 1, 0}, {4, 4, 16, 0}, {5, 17, 129, 3}, {3, 255, 3, 1}, {9, 16, 17, 0}, {4, 255, 128, 0}, {2, 5, 15, 2},
             {4, 70, 600, 0}, {1, 65, 545, 1}, {9, 130, 1030, 0}}) {  // int8 P·V: column slices of 512, chunks of 64 keys
        ByteMat k(t, 0.75f, n, d, pad, 0, 0);
        k.fill(gen);
        const std::size_t row = mha::detail::element_format(t).row_elements(d), ld = k.stride;
        const AtPageEnd guarded(k, row, ld);
        ASSERT_NE(guarded.data(), nullptr) << "mmap failed";
        const unsigned char* h = guarded.data();
        FloatMat q(M, d, 0), p(M, n, 0), s_want(M, n, 0), s(M, n, 0), o_want(M, d, 0);
        q.fill(gen, -1.0f, 1.0f);
        p.fill(gen, 0.0f, 1.0f);
        o_want.fill(gen, -1.0f, 1.0f);
        FloatMat o = o_want;
        mha::simd::decode_scores(0.5f, q.cview(), k.wide(), s_want.view());
        accumulate_model(p.cview(), k, o_want.view());
        const std::size_t rows = n, cols = d;  // structured bindings are not captured by lambdas before C++20 (clang 14)
        with_type(t, [&](auto e) {
            using E = decltype(e);
            const mha::MatrixView<const E> view(reinterpret_cast<const E*>(h), rows, cols, ld);
            mha::simd::decode_scores(0.5f, q.cview(), view, s.view(), {}, 0.75f);
            mha::simd::decode_accumulate(p.cview(), view, o.view(), {}, 0.75f);
        });
        EXPECT_TRUE(same_bits_or_nan(s.buf, s_want.buf)) << "M " << M << " n " << n << " d " << d;
        EXPECT_TRUE(same_bits_or_nan(o.buf, o_want.buf)) << "M " << M << " n " << n << " d " << d;
    }
}

// ---- int8 scores on integer dot products (AVX512_VNNI at the avx512_bf16 level: decode_int8_dot_impl.hpp) ----

// One score as the dot-product kernel defines it, in plain scalar code: the query row quantized per block of 32
// (s = amax / 127 in fp32, q = nearest even of x / s, clamped to ±127; NaN or ±inf in the block: s NaN and q 0;
// s 0: q 0), per block b the exact Σ q·k, acc = fma(float(Σ), s_k,b·s_q,b, acc) over the blocks in order from 0,
// then scale·acc.
float dot_model_score(float scale, const float* x, const unsigned char* krow, std::size_t d) {
    std::vector<int> qi(d);
    std::vector<float> qs(d / 32);
    for (std::size_t b = 0; b < d / 32; ++b) {
        float amax = 0.0f;
        bool finite = true;
        for (std::size_t i = 32 * b; i < 32 * b + 32; ++i) {
            finite = finite && std::isfinite(x[i]);
            amax = std::max(amax, std::fabs(x[i]));
        }
        const float step = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        qs[b] = step;
        for (std::size_t i = 32 * b; i < 32 * b + 32; ++i)
            qi[i] = finite && step > 0.0f ? int(std::clamp(std::nearbyint(x[i] / step), -127.0f, 127.0f)) : 0;
    }
    float acc = 0.0f;
    for (std::size_t b = 0; b < d / 32; ++b) {
        int dot = 0;
        for (std::size_t i = 32 * b; i < 32 * b + 32; ++i) dot += int(static_cast<std::int8_t>(krow[i])) * qi[i];
        acc = std::fma(float(dot), mha::int8_row_scale(krow, d, b) * qs[b], acc);
    }
    return scale * acc;
}

class Int8DotProducts : public ::testing::Test {
protected:
    void SetUp() override {
        saved_ = mha::active_isa();
        mha::set_isa_cap(mha::Isa::avx512_bf16);
        if (!mha::simd::int8_scores_on_dot_products(1, 64)) GTEST_SKIP() << "no AVX512_VNNI at the avx512_bf16 level here";
    }
    void TearDown() override { mha::set_isa_cap(saved_); }
    Isa saved_ = Isa::avx512_bf16;
};

// Every score bitwise the model's, for any M (tails of the 4-row tiles), n (tails of the 4-key tiles), d (one to
// eight chunks), row stride and offset; padding, the rows past n and the guards hold 0xff (a NaN scale).
TEST_F(Int8DotProducts, ScoresEqualTheModel) {
    std::mt19937 gen(25);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : {std::size_t(64), std::size_t(128), std::size_t(192), std::size_t(512)}) {
                if (M * d > mha::simd::kDotMaxQueryValues) continue;
                ++c;
                ASSERT_TRUE(mha::simd::int8_scores_on_dot_products(M, d));
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5;
                FloatMat q(M, d, c % 2), s(M, n, c % 3);
                q.fill(gen, -2.0f, 2.0f);
                if (c % 4 == 1) q.buf[kGuard + (M - 1) * q.stride + d / 3] = 40.0f;  // an outlier channel
                ByteMat k(DataType::int8, 1.0f, n, d, pad, offset, 2);
                k.fill(gen);
                scores(0.37f, q.cview(), k, s.view());
                FloatMat want = s;
                for (std::size_t m = 0; m < M; ++m)
                    for (std::size_t j = 0; j < n; ++j)
                        want.buf[kGuard + m * want.stride + j] = dot_model_score(0.37f, q.cview().row(m), k.row(j), d);
                ASSERT_TRUE(same_bits_or_nan(s.buf, want.buf)) << "M " << M << " n " << n << " d " << d << " pad " << pad;
            }
    // Elsewhere the widened kernel: d not a multiple of 64, or too many query values.
    EXPECT_FALSE(mha::simd::int8_scores_on_dot_products(4, 96));
    EXPECT_FALSE(mha::simd::int8_scores_on_dot_products(mha::simd::kDotMaxQueryValues / 64 + 1, 64));
    mha::set_isa_cap(mha::Isa::avx512);
    EXPECT_FALSE(mha::simd::int8_scores_on_dot_products(4, 128));
}

// Key blocks whose scale is NaN, ±inf-holding, zero, subnormal or the largest float16, and query blocks with NaN,
// ±inf, zeros, tiny values and the largest floats: the model's bits (a NaN as any NaN).
TEST_F(Int8DotProducts, SpecialValues) {
    std::mt19937 gen(26);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f, 1e-6f, 1e10f,
                              1.0f, 3e38f, 1e-30f};
    const std::size_t n = 19, M = 5, d = 128;
    ByteMat k(DataType::int8, 1.0f, n, d, 1, 0, 0);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(d);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < d; ++j) x[j] = dist(gen) * specials[(i + j / 32) % 6];
        if ((i + 1) % 6 == 0) x[d / 2] = -std::numeric_limits<float>::infinity();
        k.set_row(i, x.data());
    }
    FloatMat q(M, d, 0), s(M, n, 0);
    q.fill(gen, -1.0f, 1.0f);
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t j = 0; j < d; ++j) q.buf[kGuard + m * d + j] *= specials[(m + j / 32 + 2) % 8];
    scores(1.0f, q.cview(), k, s.view());
    FloatMat want = s;
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t j = 0; j < n; ++j) want.buf[kGuard + m * n + j] = dot_model_score(1.0f, q.cview().row(m), k.row(j), d);
    EXPECT_TRUE(same_bits_or_nan(s.buf, want.buf));
}

// Query blocks far below 1 (down to fp32's subnormals) keep their relative precision: each score within
// scale·Σ_c (s_b / 2)·|k_c| of the exact one over the stored keys, plus fp32 rounding (the query's scale is fp32).
TEST_F(Int8DotProducts, TinyQueryBlocksKeepTheirPrecision) {
    std::mt19937 gen(28);
    const std::size_t n = 9, d = 64;
    ByteMat k(DataType::int8, 1.0f, n, d, 0, 0, 0);
    k.fill(gen);
    for (float tiny : {1e-3f, 1e-5f, 3e-6f, 1e-20f, 1e-38f}) {
        FloatMat q(1, d, 0), s(1, n, 0);
        q.fill(gen, -1.0f, 1.0f);
        for (std::size_t c = 0; c < 32; ++c) q.buf[kGuard + c] *= tiny;  // block 0 tiny, block 1 of order 1
        scores(1.0f, q.cview(), k, s.view());
        for (std::size_t j = 0; j < n; ++j) {
            const float* x = q.cview().row(0);
            const float* kw = k.wide().row(j);
            double exact = 0, bound = 0, mag = 0;
            for (std::size_t b = 0; b < 2; ++b) {
                float amax = 0;
                for (std::size_t c = 32 * b; c < 32 * b + 32; ++c) amax = std::max(amax, std::fabs(x[c]));
                for (std::size_t c = 32 * b; c < 32 * b + 32; ++c) {
                    exact += double(x[c]) * kw[c];
                    bound += double(amax / 127.0f) / 2 * std::fabs(kw[c]);
                    mag += std::fabs(double(x[c]) * kw[c]);
                }
            }
            EXPECT_LE(std::fabs(s.buf[kGuard + j] - exact), bound * (1 + 1e-3) + 1e-5 * mag) << "block amax scale " << tiny << ", key " << j;
        }
        // The tiny block alone (block 1 zeroed): the same relative precision at its own scale.
        for (std::size_t c = 32; c < 64; ++c) q.buf[kGuard + c] = 0.0f;
        scores(1.0f, q.cview(), k, s.view());
        for (std::size_t j = 0; j < n; ++j) {
            const float* x = q.cview().row(0);
            const float* kw = k.wide().row(j);
            double exact = 0, bound = 0, mag = 0;
            float amax = 0;
            for (std::size_t c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(x[c]));
            for (std::size_t c = 0; c < 32; ++c) {
                exact += double(x[c]) * kw[c];
                bound += double(amax / 127.0f) / 2 * std::fabs(kw[c]);
                mag += std::fabs(double(x[c]) * kw[c]);
            }
            EXPECT_LE(std::fabs(s.buf[kGuard + j] - exact), bound * (1 + 1e-3) + 1e-5 * mag + 1e-44) << "alone, amax scale " << tiny;
        }
    }
}

// x's rows (int8, unpadded) copied into a pool of `blocks` blocks of bs rows, 0xff elsewhere: row j at row
// first + j of the blocks table[0], table[1], ...
std::vector<unsigned char> paged_copy(ByteMat& x, const std::uint32_t* table, std::size_t blocks, std::size_t bs, std::size_t first) {
    const std::size_t row = mha::int8_row_bytes(x.d);
    std::vector<unsigned char> pool(blocks * bs * row, 0xff);
    for (std::size_t j = 0; j < x.rows; ++j) {
        const std::size_t r = first + j;
        std::memcpy(pool.data() + (table[r / bs] * bs + r % bs) * row, x.row(j), row);
    }
    return pool;
}

// The int8 P·V on dot products as decode.hpp states it (int8_values_on_dot_products), one value at a time: keys
// in groups ending at the multiples of 64 of origin + j (and at n); per group, row m and block b:
// P'_j = fl(p·s_j,b), a = max(max |P'_j|, 2^-64), r = fl(32767 / a), t = fl(a / 32767), u_j = nearest even of
// fl(P'_j·r), o = fma(float(Σ u_j·v_j,c), t, o); a non-finite P' in the group: NaN.
void dot_model_accumulate(ConstMatrix p, ByteMat& v, Matrix o, std::size_t origin = 0) {
    const std::size_t M = p.rows, n = v.rows, d = v.d;
    for (std::size_t j0 = 0, j1 = 0; j0 < n; j0 = j1) {
        j1 = std::min(n, j0 + 64 - (origin + j0) % 64);
        for (std::size_t m = 0; m < M; ++m)
            for (std::size_t b = 0; b < d / 32; ++b) {
                std::vector<float> x(j1 - j0);
                bool bad = false;
                float amax = 0.0f;
                for (std::size_t j = j0; j < j1; ++j) {
                    x[j - j0] = p.data[m * p.stride + j] * mha::int8_row_scale(v.row(j), d, b);
                    bad = bad || !std::isfinite(x[j - j0]);
                    amax = std::max(amax, std::fabs(x[j - j0]));
                }
                const float a = std::max(amax, 0x1p-64f), r = 32767.0f / a, t = a / 32767.0f;
                for (std::size_t c = 32 * b; c < 32 * b + 32; ++c) {
                    float& out = o.data[m * o.stride + c];
                    if (bad) {
                        out = std::numeric_limits<float>::quiet_NaN();
                        continue;
                    }
                    std::int32_t sum = 0;
                    for (std::size_t j = j0; j < j1; ++j)
                        sum += static_cast<std::int32_t>(std::nearbyint(x[j - j0] * r)) * static_cast<std::int8_t>(v.row(j)[c]);
                    out = std::fma(static_cast<float>(sum), t, out);
                }
            }
    }
}

// P·V bitwise the model's for any M (tails of the 4-row tiles), n (groups of 64 and their tails, odd pairs), d (one
// to sixteen blocks: tiles of 64 and 32 columns), origin (the groups' phase), row stride and offset; P of both
// signs with exact zeros, and groups whose P is far below the rest.
TEST_F(Int8DotProducts, AccumulateEqualsTheModel) {
    std::mt19937 gen(29);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(17), std::size_t(64), std::size_t(65),
                              std::size_t(130), std::size_t(255)})
            for (std::size_t d : {std::size_t(32), std::size_t(64), std::size_t(96), std::size_t(128), std::size_t(512)}) {
                ++c;
                ASSERT_TRUE(mha::simd::int8_values_on_dot_products(d));
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5, origin = c * 13 % 150;
                FloatMat p(M, n, c % 2), o(M, d, c % 3);
                p.fill(gen, -1.0f, 1.0f);
                o.fill(gen, -4.0f, 4.0f);
                for (std::size_t m = 0; m < M; ++m)
                    for (std::size_t j = 0; j < n; ++j) {
                        float& x = p.buf[kGuard + m * p.stride + j];
                        if ((origin + j) / 64 % 3 == 1) x *= 1e-7f;  // a group far below the others
                        if ((m + j) % 11 == 0) x = 0.0f;
                    }
                ByteMat v(DataType::int8, 1.0f, n, d, pad, offset, 2);
                v.fill(gen);
                FloatMat want = o;
                mha::simd::BlockedRows<mha::qint8> rows = v.view<mha::qint8>();
                rows.origin = origin;
                mha::simd::decode_accumulate(p.cview(), rows, o.view());
                dot_model_accumulate(p.cview(), v, want.view(), origin);
                ASSERT_TRUE(same_bits_or_nan(o.buf, want.buf)) << "M " << M << " n " << n << " d " << d << " origin " << origin;
            }
    // Elsewhere the widened kernel: d not a multiple of 32, or above kPvMaxCols.
    EXPECT_FALSE(mha::simd::int8_values_on_dot_products(80));
    EXPECT_FALSE(mha::simd::int8_values_on_dot_products(mha::simd::kPvMaxCols + 32));
    EXPECT_FALSE(mha::simd::int8_values_on_dot_products(0));
    mha::set_isa_cap(mha::Isa::avx512);
    EXPECT_FALSE(mha::simd::int8_values_on_dot_products(128));
}

// Value blocks whose scale is NaN, zero, subnormal or the largest float16; P with NaN, ±inf, zeros, values below
// 2^-64 and near FLT_MAX (P·s overflows): the model's bits (a NaN as any NaN).
TEST_F(Int8DotProducts, AccumulateSpecialValues) {
    std::mt19937 gen(30);
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(), inf, 0.0f, 1e-6f, 1e4f, 1.0f, 1e-25f, 3e38f, -inf};
    const std::size_t n = 150, M = 5, d = 128;
    ByteMat v(DataType::int8, 1.0f, n, d, 1, 0, 0);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(d);
    // Row 13's blocks: NaN-holding (scale NaN), all 0, scale a float16 subnormal, the largest float16 scale; row 77:
    // block 2 holds -inf; row 140: values near 1e4. Each of the three groups keeps blocks free of them.
    const float row13[] = {std::numeric_limits<float>::quiet_NaN(), 0.0f, 1e-6f, 65504.0f * 127.0f};
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < d; ++j) x[j] = dist(gen) * (i == 13 ? row13[j / 32] : i == 140 ? 1e4f : 1.0f);
        if (i == 13) x[5] = row13[0];
        if (i == 77) x[d / 2] = -inf;
        v.set_row(i, x.data());
    }
    for (std::size_t round = 0; round < 9; ++round) {
        FloatMat p(M, n, 0), o(M, d, 0);
        p.fill(gen, 0.0f, 1.0f);
        o.fill(gen, -1.0f, 1.0f);
        for (std::size_t m = 0; m < M; ++m) {
            // one special P per row in a group of its own choosing; row 4 all tiny (P·s mostly below 2^-64, u not 0)
            p.buf[kGuard + m * n + (37 * m + 11 * round) % n] = specials[(m + round) % 9];
            if (m == 4) {  // o starts at 0 so that the tiny terms show
                for (std::size_t j = 0; j < n; ++j) p.buf[kGuard + m * n + j] *= 1e-22f;
                for (std::size_t c = 0; c < d; ++c) o.buf[kGuard + m * d + c] = 0.0f;
            }
        }
        FloatMat want = o;
        accumulate(p.cview(), v, o.view());
        dot_model_accumulate(p.cview(), v, want.view());
        EXPECT_TRUE(same_bits_or_nan(o.buf, want.buf)) << "round " << round;
    }
}

// Each group's P keeps 15 bits of its own largest value: |o − (o0 + Σ_j p_j·s_j,b·v_j,c)| (exact, in double) within
// Σ_g (1/2 + 2^-7)·t_g·Σ_{j in g} |v_j,c| (P's rounding, t_g = a_g / 32767) + (groups + 3)·2^-24·Σ_j |p_j·s_j,b·v_j,c|
// + 2^-24·|o0|·(groups + 1) (P·s, the integer sum's conversion and the fma per group, each relative 2^-24).
// P spans 1 down to 1e-30 from group to group (softmax rows whose mass sits in a few groups).
TEST_F(Int8DotProducts, AccumulateWithinTheBound) {
    std::mt19937 gen(31);
    const std::size_t M = 4, d = 128;
    for (std::size_t n : {std::size_t(64), std::size_t(300), std::size_t(2048)}) {
        ByteMat v(DataType::int8, 1.0f, n, d, 0, 0, 0);
        v.fill(gen);
        FloatMat p(M, n, 0), o(M, d, 0);
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        std::uniform_int_distribution<int> e(-100, 0);
        for (std::size_t m = 0; m < M; ++m) {
            std::vector<int> group_exp(n / 64 + 1);
            for (int& g : group_exp) g = e(gen);
            for (std::size_t j = 0; j < n; ++j) p.buf[kGuard + m * n + j] = std::ldexp(u(gen), group_exp[j / 64]);
        }
        o.fill(gen, -1.0f, 1.0f);
        const FloatMat o0 = o;
        accumulate(p.cview(), v, o.view());
        const std::size_t groups = (n + 63) / 64;
        for (std::size_t m = 0; m < M; ++m)
            for (std::size_t c = 0; c < d; ++c) {
                const std::size_t b = c / 32;
                double exact = o0.buf[kGuard + m * d + c], rounding = 0, mag = 0;
                for (std::size_t g = 0; g < groups; ++g) {
                    float a = 0.0f;
                    double vabs = 0;
                    for (std::size_t j = 64 * g; j < std::min(n, 64 * g + 64); ++j) {
                        const double s = mha::int8_row_scale(v.row(j), d, b), q = static_cast<std::int8_t>(v.row(j)[c]);
                        const float pj = p.buf[kGuard + m * n + j];
                        a = std::max(a, std::fabs(pj * static_cast<float>(s)));
                        exact += double(pj) * s * q;
                        mag += std::fabs(double(pj) * s * q);
                        vabs += std::fabs(q);
                    }
                    rounding += (0.5 + 0x1p-7) * (std::max(a, 0x1p-64f) / 32767.0) * vabs;
                }
                const double bound = rounding + (groups + 3) * 0x1p-24 * mag + (groups + 1) * 0x1p-24 * std::fabs(o0.buf[kGuard + m * d + c]);
                ASSERT_LE(std::fabs(o.buf[kGuard + m * d + c] - exact), bound) << "n " << n << " row " << m << " column " << c;
            }
    }
}

// Values in blocks of a paged pool (blocks of 16: a group of 64 spans four; scattered, reused ids; a start inside a
// block): the bits of the same rows read contiguously at the same origin, and of the rows cut into calls at the
// multiples of 64 of their positions; no read past V's last row (a PROT_NONE page after it).
TEST_F(Int8DotProducts, AccumulateBlockedRowsSplitCallsAndTheEnd) {
    std::mt19937 gen(32);
    const std::size_t d = 128, row = mha::int8_row_bytes(d), bs = 16, M = 4, n = 150, first = 5, origin = 16 * 3 + first;
    const std::uint32_t table[] = {9, 3, 0, 6, 2, 5, 1, 8, 7, 4, 3};
    ByteMat v(DataType::int8, 1.0f, n, d, 0, 0, 0);
    v.fill(gen);
    const std::vector<unsigned char> pool = paged_copy(v, table, 10, bs, first);
    FloatMat p(M, n, 0), o(M, d, 0);
    p.fill(gen, 0.0f, 1.0f);
    o.fill(gen, -1.0f, 1.0f);
    FloatMat blocked = o, split = o, want = o;
    mha::simd::BlockedRows<mha::qint8> contiguous = v.view<mha::qint8>();
    contiguous.origin = origin;
    mha::simd::decode_accumulate(p.cview(), contiguous, o.view());
    dot_model_accumulate(p.cview(), v, want.view(), origin);
    EXPECT_TRUE(same_bits_or_nan(o.buf, want.buf));
    mha::simd::BlockMap map;
    map.table = table, map.shift = 4, map.block_bytes = bs * row, map.first = first;
    const mha::simd::BlockedRows<mha::qint8> rows(reinterpret_cast<const mha::qint8*>(pool.data()), n, d, row, map, origin);
    mha::simd::decode_accumulate(p.cview(), rows, blocked.view());
    EXPECT_TRUE(same_bits_or_nan(o.buf, blocked.buf));
    // Calls of rows [0, 11), [11, 139), [139, 150): positions 53 .. 64, 64 .. 192, 192 .. 203.
    for (const auto& [lo, hi] : std::vector<std::pair<std::size_t, std::size_t>>{{0, 11}, {11, 139}, {139, 150}}) {
        mha::simd::BlockedRows<mha::qint8> part = mha::MatrixView<const mha::qint8>(
            reinterpret_cast<const mha::qint8*>(v.row(lo)), hi - lo, d, v.stride);
        part.origin = origin + lo;
        mha::simd::decode_accumulate(ConstMatrix{p.cview().data + lo, M, hi - lo, p.stride}, part, split.view());
    }
    EXPECT_TRUE(same_bits_or_nan(o.buf, split.buf));

    const AtPageEnd guarded(v, row, row);
    ASSERT_NE(guarded.data(), nullptr) << "mmap failed";
    FloatMat at_end(M, d, 0);
    at_end.fill(gen, -1.0f, 1.0f);
    FloatMat at_end_want = at_end;
    mha::simd::decode_accumulate(p.cview(),
                                 mha::MatrixView<const mha::qint8>(reinterpret_cast<const mha::qint8*>(guarded.data()), n, d, row),
                                 at_end.view());
    dot_model_accumulate(p.cview(), v, at_end_want.view());
    EXPECT_TRUE(same_bits_or_nan(at_end.buf, at_end_want.buf));
}

// Keys in blocks of a paged pool read through a block table (scattered, reused ids; a start inside a block): the
// bits of the same rows read contiguously; and no read past K's last row (a PROT_NONE page after it).
TEST_F(Int8DotProducts, BlockedRowsAndTheEndOfTheRows) {
    std::mt19937 gen(27);
    const std::size_t d = 128, row = mha::int8_row_bytes(d), bs = 16, M = 4, n = 70, first = 5;
    const std::uint32_t table[] = {3, 0, 6, 2, 5, 1};
    ByteMat k(DataType::int8, 1.0f, n, d, 0, 0, 0);
    k.fill(gen);
    const std::vector<unsigned char> pool = paged_copy(k, table, 7, bs, first);
    FloatMat q(M, d, 0), s(M, n, 0), blocked(M, n, 0);
    q.fill(gen, -1.0f, 1.0f);
    scores(0.5f, q.cview(), k, s.view());
    mha::simd::BlockMap map;
    map.table = table, map.shift = 4, map.block_bytes = bs * row, map.first = first;
    const mha::simd::BlockedRows<mha::qint8> rows(reinterpret_cast<const mha::qint8*>(pool.data()), n, d, row, map);
    mha::simd::decode_scores(0.5f, q.cview(), rows, blocked.view());
    EXPECT_TRUE(same_bits_or_nan(s.buf, blocked.buf));

    const AtPageEnd guarded(k, row, row);
    ASSERT_NE(guarded.data(), nullptr) << "mmap failed";
    FloatMat at_end(M, n, 0);
    mha::simd::decode_scores(0.5f, q.cview(),
                             mha::MatrixView<const mha::qint8>(reinterpret_cast<const mha::qint8*>(guarded.data()), n, d, row),
                             at_end.view());
    EXPECT_TRUE(same_bits_or_nan(s.buf, at_end.buf));
}

std::vector<Param> params() {
    std::vector<Param> v;
    for (Isa isa : mha::simd::kSimdIsas)
        for (DataType t : {DataType::int8, DataType::fp8_e4m3, DataType::fp8_e5m2}) v.push_back({isa, t});
    return v;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    return std::string(mha::isa_name(info.param.isa)) + "_" + std::string(mha::data_type_name(info.param.type));
}

INSTANTIATE_TEST_SUITE_P(EveryIsaAndType, Decode8Bit, ::testing::ValuesIn(params()), param_name);

}  // namespace
