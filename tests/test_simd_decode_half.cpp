// The decode kernels mha::simd::decode_scores / decode_accumulate with bf16 and f16 K and V (a KV cache's
// 16-bit element types), once per ISA this CPU has (mha::set_isa_cap).
// Contract (simd.hpp): 16-bit elements are widened to float exactly as they are loaded, and the arithmetic
// and its order are those of float K / V holding the widened values. So the oracle is the float kernel itself
// on the widened values, and the check is bitwise equality (the float kernel has its own error bounds in
// test_simd_decode_kernels.cpp). A wrongly widened lane, a lane read from the wrong column, a lost tail
// element or a read of padding changes the bits.
// Covered: M ∈ {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17} × n ∈ {1, 2, 3, 4, 5, 15, 16, 17, 255, 256} ×
// d ∈ {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 80, 128, 129} (every vector width's full and partial vectors,
// both query and key tiles and their tails) with odd row strides and element offsets; the 16-bit padding of
// every row, the rows past n and guards around the buffer hold NaN bits (a read one makes a result NaN: no
// longer equal); s / o padding holds a sentinel that must stay; K / V that end at a PROT_NONE page (a read
// past the tile faults).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "simd/isa_table.hpp"
#include "simd/simd.hpp"

namespace {

using mha::ConstMatrix;
using mha::DataType;
using mha::Isa;
using mha::Matrix;

constexpr std::size_t kMs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17};
constexpr std::size_t kNs[] = {1, 2, 3, 4, 5, 15, 16, 17, 255, 256};
constexpr std::size_t kDs[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 80, 128, 129};
constexpr std::size_t kGuard = 21;
constexpr std::uint32_t kSentinelBits = 0x7fc0beefu;

// NaN bits of each 16-bit type (bf16: quiet NaN with a payload; f16 likewise).
std::uint16_t nan_bits(DataType t) { return t == DataType::bf16 ? 0x7fd5 : 0x7e55; }

float widen(DataType t, std::uint16_t h) {
    return t == DataType::bf16 ? mha::bfloat16::from_bits(h).to_float() : mha::float16::from_bits(h).to_float();
}
std::uint16_t narrow(DataType t, float x) {
    return t == DataType::bf16 ? mha::bfloat16::from_float(x).bits : mha::float16::from_float(x).bits;
}

// rows × cols 16-bit elements at `offset` elements into a guarded buffer, row stride cols + pad, `extra` rows
// after the view; every element outside the view holds NaN bits. wide() is the same matrix as floats (its
// outside: the float sentinel NaN).
struct HalfMat {
    DataType type;
    std::size_t rows, cols, stride, begin, extra;
    std::vector<std::uint16_t> buf;
    std::vector<float> wide_buf;
    HalfMat(DataType t, std::size_t r, std::size_t c, std::size_t pad, std::size_t offset, std::size_t ex)
        : type(t), rows(r), cols(c), stride(c + pad), begin(kGuard + offset), extra(ex) {
        buf.assign(begin + (r + ex) * stride + kGuard, nan_bits(t));
        wide_buf.assign(buf.size(), std::bit_cast<float>(kSentinelBits));
    }
    void fill(std::mt19937& gen) {
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::uniform_int_distribution<int> e(-6, 6);
        for (std::size_t i = 0; i < rows; ++i)
            for (std::size_t j = 0; j < cols; ++j) {
                const std::size_t at = begin + i * stride + j;
                buf[at] = narrow(type, std::ldexp(dist(gen), e(gen)));
                wide_buf[at] = widen(type, buf[at]);
            }
    }
    template <class E>
    mha::MatrixView<const E> view() const {
        return {reinterpret_cast<const E*>(buf.data() + begin), rows, cols, stride};
    }
    ConstMatrix wide() const { return {wide_buf.data() + begin, rows, cols, stride}; }
};

// A float matrix in a buffer of sentinels (row stride cols + pad).
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

using mha_test::same_bits;

// The kernels on 16-bit K / V of type t.
void scores(DataType t, float scale, ConstMatrix q, const HalfMat& k, Matrix s) {
    if (t == DataType::bf16)
        mha::simd::decode_scores(scale, q, k.view<mha::bfloat16>(), s);
    else
        mha::simd::decode_scores(scale, q, k.view<mha::float16>(), s);
}
void accumulate(DataType t, ConstMatrix p, const HalfMat& v, Matrix o) {
    if (t == DataType::bf16)
        mha::simd::decode_accumulate(p, v.view<mha::bfloat16>(), o);
    else
        mha::simd::decode_accumulate(p, v.view<mha::float16>(), o);
}

struct Param {
    Isa isa;
    DataType type;
};

class DecodeHalf : public ::testing::TestWithParam<Param> {
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

TEST_P(DecodeHalf, ScoresEqualTheFloatKernelOnWidenedKeys) {
    const DataType t = GetParam().type;
    std::mt19937 gen(11);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5;
                FloatMat q(M, d, c % 2), s_half(M, n, c % 3), s_float(M, n, c % 3);
                q.fill(gen, -2.0f, 2.0f);
                HalfMat k(t, n, d, pad, offset, 2);
                k.fill(gen);
                scores(t, 0.37f, q.cview(), k, s_half.view());
                mha::simd::decode_scores(0.37f, q.cview(), k.wide(), s_float.view());
                ASSERT_TRUE(same_bits(s_half.buf, s_float.buf))
                    << "M " << M << " n " << n << " d " << d << " pad " << pad << " offset " << offset;
            }
}

TEST_P(DecodeHalf, AccumulateEqualsTheFloatKernelOnWidenedValues) {
    const DataType t = GetParam().type;
    std::mt19937 gen(12);
    std::size_t c = 0;
    for (std::size_t M : kMs)
        for (std::size_t n : kNs)
            for (std::size_t d : kDs) {
                ++c;
                const std::size_t pad = c % 3 == 0 ? 0 : c % 7, offset = c % 5;
                FloatMat p(M, n, c % 2), o_half(M, d, c % 3);
                p.fill(gen, 0.0f, 1.0f);
                o_half.fill(gen, -1.0f, 1.0f);
                FloatMat o_float = o_half;
                HalfMat v(t, n, d, pad, offset, 2);
                v.fill(gen);
                accumulate(t, p.cview(), v, o_half.view());
                mha::simd::decode_accumulate(p.cview(), v.wide(), o_float.view());
                ASSERT_TRUE(same_bits(o_half.buf, o_float.buf))
                    << "M " << M << " n " << n << " d " << d << " pad " << pad << " offset " << offset;
            }
}

// Special values widen exactly too: ±0, subnormals, the largest finite, ±inf (scores of a finite q with an
// inf key are ±inf or NaN alike in both kernels).
TEST_P(DecodeHalf, SpecialValuesWidenExactly) {
    const DataType t = GetParam().type;
    const std::vector<std::uint16_t> specials =
        t == DataType::bf16 ? std::vector<std::uint16_t>{0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x3f80}
                            : std::vector<std::uint16_t>{0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x3c00};
    std::mt19937 gen(13);
    for (std::size_t d : {5u, 16u, 37u}) {
        const std::size_t n = 23, M = 3;
        HalfMat k(t, n, d, 1, 0, 0);
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < d; ++j) {
                const std::size_t at = k.begin + i * k.stride + j;
                k.buf[at] = specials[(i * d + j) % specials.size()];
                k.wide_buf[at] = widen(t, k.buf[at]);
            }
        FloatMat q(M, d, 0), s_half(M, n, 0), s_float(M, n, 0), p(M, n, 0), o_half(M, d, 0);
        q.fill(gen, -1.0f, 1.0f);
        p.fill(gen, 0.0f, 1.0f);
        FloatMat o_float = o_half;
        scores(t, 1.0f, q.cview(), k, s_half.view());
        mha::simd::decode_scores(1.0f, q.cview(), k.wide(), s_float.view());
        EXPECT_TRUE(same_bits(s_half.buf, s_float.buf)) << "scores, d " << d;
        accumulate(t, p.cview(), k, o_half.view());
        mha::simd::decode_accumulate(p.cview(), k.wide(), o_float.view());
        EXPECT_TRUE(same_bits(o_half.buf, o_float.buf)) << "accumulate, d " << d;
    }
}

// K / V whose last element is the last of a page followed by a PROT_NONE page: no read past the tile.
TEST_P(DecodeHalf, ReadsEndAtTheTile) {
    const DataType t = GetParam().type;
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    std::mt19937 gen(14);
    for (const auto& [M, n, d, pad] : std::vector<std::array<std::size_t, 4>>{
             {1, 1, 1, 0}, {4, 4, 16, 0}, {5, 17, 129, 3}, {3, 255, 3, 1}, {9, 16, 17, 0}, {4, 256, 128, 0}, {2, 5, 15, 2}}) {
        const std::size_t ld = d + pad, elems = (n - 1) * ld + d, bytes = elems * 2;
        const std::size_t span = (bytes + page - 1) / page * page;
        void* map = mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ASSERT_NE(map, MAP_FAILED);
        ASSERT_EQ(mprotect(static_cast<char*>(map) + span, page, PROT_NONE), 0);
        auto* h = reinterpret_cast<std::uint16_t*>(static_cast<char*>(map) + span - bytes);
        HalfMat k(t, n, d, pad, 0, 0);
        k.fill(gen);
        for (std::size_t i = 0; i < n; ++i) std::memcpy(h + i * ld, k.buf.data() + k.begin + i * k.stride, d * 2);
        FloatMat q(M, d, 0), p(M, n, 0), s_want(M, n, 0), s(M, n, 0), o_want(M, d, 0);
        q.fill(gen, -1.0f, 1.0f);
        p.fill(gen, 0.0f, 1.0f);
        o_want.fill(gen, -1.0f, 1.0f);
        FloatMat o = o_want;
        mha::simd::decode_scores(0.5f, q.cview(), k.wide(), s_want.view());
        mha::simd::decode_accumulate(p.cview(), k.wide(), o_want.view());
        if (t == DataType::bf16) {
            const mha::MatrixView<const mha::bfloat16> view(reinterpret_cast<const mha::bfloat16*>(h), n, d, ld);
            mha::simd::decode_scores(0.5f, q.cview(), view, s.view());
            mha::simd::decode_accumulate(p.cview(), view, o.view());
        } else {
            const mha::MatrixView<const mha::float16> view(reinterpret_cast<const mha::float16*>(h), n, d, ld);
            mha::simd::decode_scores(0.5f, q.cview(), view, s.view());
            mha::simd::decode_accumulate(p.cview(), view, o.view());
        }
        EXPECT_TRUE(same_bits(s.buf, s_want.buf)) << "M " << M << " n " << n << " d " << d;
        EXPECT_TRUE(same_bits(o.buf, o_want.buf)) << "M " << M << " n " << n << " d " << d;
        munmap(map, span + page);
    }
}

std::vector<Param> params() {
    std::vector<Param> v;
    for (Isa isa : mha::simd::kSimdIsas)
        for (DataType t : {DataType::bf16, DataType::f16}) v.push_back({isa, t});
    return v;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    return std::string(mha::isa_name(info.param.isa)) + "_" + std::string(mha::data_type_name(info.param.type));
}

INSTANTIATE_TEST_SUITE_P(EveryIsaAndType, DecodeHalf, ::testing::ValuesIn(params()), param_name);

}  // namespace
