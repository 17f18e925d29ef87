// simd::round_to_bf16_inplace on every ISA the machine has, bitwise against the scalar round_to_bf16
// (mha/half.hpp): ties to even both ways, carries into the exponent and past the largest bf16 (to inf),
// subnormals, ±0, ±inf, signalling and quiet NaN with payloads and both signs, random bit patterns; every
// length 0 .. 70 (each vector width's tail), at odd offsets; nothing past n written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "mha/half.hpp"
#include "simd/isa_table.hpp"
#include "simd/round_bf16.hpp"
#include "simd/simd.hpp"

namespace {

float from_bits(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
std::uint32_t bits_of(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

class RoundBf16 : public ::testing::TestWithParam<mha::Isa> {
protected:
    void SetUp() override {
        if (GetParam() > mha::detected_isa()) GTEST_SKIP() << "CPU lacks " << mha::isa_name(GetParam());
        mha::set_isa_cap(GetParam());
    }
    void TearDown() override { mha::set_isa_cap(mha::Isa::avx512_bf16); }
};

TEST_P(RoundBf16, BitwiseTheScalarConversion) {
    const std::uint32_t specials[] = {
        0x3f808000u,  // 1 + half an ulp, even below: down
        0x3f818000u,  // odd below: up
        0x3f808001u, 0x3f807fffu,                         // just above / below the tie
        0x3fffffffu, 0x7f7fffffu, 0xff7fffffu,            // carry into the exponent; past the largest bf16: ±inf
        0x7f7f7fffu, 0x7f7f8000u,                         // the largest bf16 (tie to even, up to inf)
        0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu,  // subnormals, ties among them
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // ±0, ±inf
        0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu,  // signalling NaN, payloads (low half only or high)
        0x7fc00000u, 0xffc00001u, 0x7fffffffu, 0xffff8000u,  // quiet NaN, payloads
    };
    std::mt19937 rng(17);
    std::uniform_int_distribution<std::uint32_t> any;
    std::size_t cases = 0;
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
        for (std::size_t n = 0; n <= 70; ++n) {
            std::vector<float> x(offset + n + 5);
            for (std::size_t i = 0; i < x.size(); ++i) {
                const std::size_t s = (i + n) % (2 * std::size(specials));
                x[i] = from_bits(s < std::size(specials) ? specials[s] : any(rng));
            }
            std::vector<std::uint32_t> want(x.size());
            for (std::size_t i = 0; i < x.size(); ++i)
                want[i] = bits_of(i >= offset && i < offset + n ? mha::round_to_bf16(x[i]) : x[i]);
            mha::simd::round_to_bf16_inplace(x.data() + offset, n);
            for (std::size_t i = 0; i < x.size(); ++i)
                ASSERT_EQ(bits_of(x[i]), want[i]) << "n=" << n << " offset=" << offset << " i=" << i << std::hex
                                                  << " got " << bits_of(x[i]) << " want " << want[i];
            ++cases;
        }
    }
    EXPECT_EQ(cases, 3u * 71u);
    // A view with padding between rows: only the view's elements change.
    std::vector<float> buf(5 * 21);
    for (auto& v : buf) v = from_bits(any(rng) & 0x3fffffffu);
    std::vector<float> want = buf;
    for (std::size_t r = 0; r < 5; ++r)
        for (std::size_t c = 0; c < 19; ++c) want[r * 21 + c] = mha::round_to_bf16(want[r * 21 + c]);
    mha::simd::round_to_bf16_inplace(mha::Matrix(buf.data(), 5, 19, 21));
    EXPECT_EQ(std::memcmp(buf.data(), want.data(), buf.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, RoundBf16, ::testing::ValuesIn(mha::simd::kSimdIsas),
                         [](const auto& info) { return std::string(mha::isa_name(info.param)); });

}  // namespace
