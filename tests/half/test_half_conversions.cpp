// mha/half.hpp's conversions against independent oracles:
//   float16 against the F16C instructions (vcvtps2ph with round-to-nearest-even, vcvtph2ps), reached through
//     functions with __attribute__((target("f16c"))) and run only where the CPU has F16C: every one of the
//     65536 half bit patterns widened and narrowed back; every float of the exponents around the
//     subnormal-to-zero boundary (2^-26 .. 2^-23), the subnormal/normal boundary (2^-16 .. 2^-13) and the
//     top (2^15, 2^16: 65504, the tie at 65520, overflow), both signs; every exponent with the dropped 13 bits
//     just below, at and just above the tie; 2^24 random floats; NaN, ±inf, ±0; the vector form (8 at once).
//   bfloat16 against an exact rounding in double (the two neighbouring bfloat16 values of x, the nearer one,
//     ties to the even one; this needs no instruction): every bit pattern widened and narrowed back; every
//     upper half with the low 16 bits 0, 1, 0x7fff, 0x8000, 0x8001, 0xffff (every tie); 2^24 random floats;
//     NaN (stays NaN, quiet, sign kept), ±inf, overflow to inf.
// Its own executable: the F16C functions would trip the ISA leak check of mha_tests (isa_leak_tests.cmake).
#include <gtest/gtest.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include <mha/half.hpp>
#include <mha/isa.hpp>

namespace {

using mha::bfloat16;
using mha::float16;

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) std::uint16_t f16c_narrow(float x) {
    return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float f16c_widen(std::uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) void f16c_narrow8(const float* x, std::uint16_t* h) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(_mm256_loadu_ps(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Isa::avx2 requires F16C (and the OS's AVX state), detected from cpuid by the library.
bool has_f16c() { return mha::detected_isa() == mha::Isa::avx2 || mha::detected_isa() == mha::Isa::avx512 ||
                         mha::detected_isa() == mha::Isa::avx512_bf16; }
#elif defined(__aarch64__)
// AArch64: the same oracle from the FP unit's conversions (fcvt h, s / fcvtn v.4h, v.4s; FPCR's default
// round to nearest even, NaN payload kept with the quiet bit set), baseline in Armv8. The names stay.
std::uint16_t f16c_narrow(float x) { return std::bit_cast<std::uint16_t>(static_cast<__fp16>(x)); }
float f16c_widen(std::uint16_t h) { return static_cast<float>(std::bit_cast<__fp16>(h)); }
void f16c_narrow8(const float* x, std::uint16_t* h) {
    vst1q_u16(h, vcombine_u16(vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x))),
                              vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + 4)))));
}
bool has_f16c() { return true; }
#else
std::uint16_t f16c_narrow(float) { return 0; }
float f16c_widen(std::uint16_t) { return 0; }
void f16c_narrow8(const float*, std::uint16_t*) {}
bool has_f16c() { return false; }
#endif

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// float16 of x must equal F16C's, bit for bit (NaN: both NaN with the same sign; our payload keeps the top
// mantissa bits and sets the quiet bit, as vcvtps2ph does).
::testing::AssertionResult f16_matches(float x) {
    const std::uint16_t want = f16c_narrow(x), got = float16::from_float(x).bits;
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << "x bits 0x" << bits(x) << ": got 0x" << got << ", F16C 0x" << want;
}

// Every float whose biased exponent is e, both signs.
template <class F>
bool for_exponent(int e, F check) {
    for (std::uint32_t sign : {0u, 0x80000000u})
        for (std::uint32_t m = 0; m < (1u << 23); ++m)
            if (!check(from_bits(sign | (std::uint32_t(e) << 23) | m))) return false;
    return true;
}

class F16 : public ::testing::Test {
protected:
    void SetUp() override {
        if (!has_f16c()) GTEST_SKIP() << "this CPU has no F16C";
    }
};

TEST_F(F16, EveryHalfWidensLikeF16cAndNarrowsBack) {
    for (std::uint32_t h = 0; h < 65536; ++h) {
        const float ours = float16::from_bits(static_cast<std::uint16_t>(h)).to_float(), hw = f16c_widen(static_cast<std::uint16_t>(h));
        const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
        if (nan) {
            ASSERT_TRUE(std::isnan(ours)) << std::hex << h;
            ASSERT_EQ(std::signbit(ours), (h & 0x8000) != 0) << std::hex << h;
            ASSERT_TRUE(std::isnan(float16::from_float(ours).to_float())) << std::hex << h;
        } else {
            ASSERT_EQ(bits(ours), bits(hw)) << std::hex << h;
            ASSERT_EQ(float16::from_float(ours).bits, h) << std::hex << "round trip of 0x" << h;
        }
    }
}

TEST_F(F16, EveryFloatAtTheBoundariesRoundsLikeF16c) {
    // 2^-26 .. 2^-23: below half the smallest subnormal (2^-25, the tie to 0), the smallest subnormals.
    // 2^-16 .. 2^-13: subnormals up to the smallest normal 2^-14 and above. 2^15, 2^16: 65504, 65520, inf.
    for (int e : {101, 102, 103, 104, 111, 112, 113, 114, 142, 143}) ASSERT_TRUE(for_exponent(e, [](float x) { return bool(f16_matches(x)); })) << "exponent " << e;
}

TEST_F(F16, TiesAndRandomFloatsRoundLikeF16c) {
    for (std::uint32_t e = 0; e < 256; ++e)
        for (std::uint32_t sign : {0u, 0x80000000u})
            for (std::uint32_t hi = 0; hi < 1024; ++hi)
                for (std::uint32_t lo : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu})
                    ASSERT_TRUE(f16_matches(from_bits(sign | (e << 23) | (hi << 13) | lo)));
    std::mt19937 gen(7);
    for (int i = 0; i < (1 << 24); ++i) ASSERT_TRUE(f16_matches(from_bits(static_cast<std::uint32_t>(gen()))));
    // The vector instruction agrees with the scalar one (and with us) on 8 at once.
    alignas(32) float x[8];
    alignas(16) std::uint16_t h[8];
    for (int i = 0; i < 4096; ++i) {
        for (float& v : x) v = from_bits(static_cast<std::uint32_t>(gen()) & 0xc7ffffffu);  // exponents up to 2^16
        f16c_narrow8(x, h);
        for (int j = 0; j < 8; ++j) ASSERT_EQ(h[j], float16::from_float(x[j]).bits) << std::hex << bits(x[j]);
    }
}

TEST_F(F16, SpecialValues) {
    EXPECT_EQ(float16::from_float(65504.0f).bits, 0x7bffu);
    EXPECT_EQ(float16::from_float(65519.996f).bits, 0x7bffu);
    EXPECT_EQ(float16::from_float(65520.0f).bits, 0x7c00u);  // the tie between 65504 and 2^16 goes to inf
    EXPECT_EQ(float16::from_float(-1e9f).bits, 0xfc00u);
    EXPECT_EQ(float16::from_float(0x1p-25f).bits, 0x0000u);         // tie between 0 and 2^-24: to even 0
    EXPECT_EQ(float16::from_float(0x1.000002p-25f).bits, 0x0001u);  // just above the tie
    EXPECT_EQ(float16::from_float(0x3p-25f).bits, 0x0002u);         // 1.5·2^-24: to even 2
    EXPECT_EQ(float16::from_float(-0.0f).bits, 0x8000u);
    EXPECT_EQ(float16::from_float(INFINITY).bits, 0x7c00u);
    EXPECT_TRUE(std::isnan(float16::from_float(NAN).to_float()));
    EXPECT_EQ(float16::from_float(1.0f + 0x1p-11f).bits, 0x3c00u);  // tie: to even
    EXPECT_EQ(float16::from_float(1.0f + 0x3p-11f).bits, 0x3c02u);  // tie: to even (up)
}

// bfloat16 of x by an exact rounding: lo = x with the low 16 bits cleared (toward zero), hi = the next
// bfloat16 away from zero (for the largest finite one: 2^128, which stands for inf), the nearer, ties even.
std::uint16_t bf16_oracle(float x) {
    const std::uint32_t u = bits(x);
    const auto lo = static_cast<std::uint16_t>(u >> 16), hi = static_cast<std::uint16_t>(lo + 1);
    const double ax = std::fabs(double(x)), alo = std::fabs(double(from_bits(std::uint32_t(lo) << 16)));
    const double ahi = ((hi & 0x7fffu) == 0x7f80u) ? std::ldexp(1.0, 128) : std::fabs(double(from_bits(std::uint32_t(hi) << 16)));
    const double dlo = ax - alo, dhi = ahi - ax;
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi;
    return (lo & 1u) == 0 ? lo : hi;
}

::testing::AssertionResult bf16_matches(float x) {
    const std::uint16_t got = bfloat16::from_float(x).bits;
    if (std::isnan(x)) {
        const float back = bfloat16::from_bits(got).to_float();
        if (std::isnan(back) && (got & 0x0040u) != 0 && std::signbit(back) == std::signbit(x)) return ::testing::AssertionSuccess();
        return ::testing::AssertionFailure() << std::hex << "NaN 0x" << bits(x) << " became 0x" << got;
    }
    const std::uint16_t want = bf16_oracle(x);
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << "x bits 0x" << bits(x) << ": got 0x" << got << ", exact 0x" << want;
}

TEST(BF16, EveryBitPatternWidensExactlyAndNarrowsBack) {
    for (std::uint32_t h = 0; h < 65536; ++h) {
        const float x = bfloat16::from_bits(static_cast<std::uint16_t>(h)).to_float();
        ASSERT_EQ(bits(x), h << 16);
        if (!std::isnan(x)) {
            ASSERT_EQ(bfloat16::from_float(x).bits, h) << std::hex << h;
        }
    }
}

TEST(BF16, EveryTieAndRandomFloatsRoundToNearestEven) {
    for (std::uint32_t hi = 0; hi < 65536; ++hi)
        for (std::uint32_t lo : {0x0u, 0x1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) ASSERT_TRUE(bf16_matches(from_bits((hi << 16) | lo)));
    std::mt19937 gen(8);
    for (int i = 0; i < (1 << 24); ++i) ASSERT_TRUE(bf16_matches(from_bits(static_cast<std::uint32_t>(gen()))));
}

TEST(BF16, SpecialValues) {
    EXPECT_EQ(bfloat16::from_float(1.0f + 0x1p-8f).bits, 0x3f80u);   // tie: to even (down)
    EXPECT_EQ(bfloat16::from_float(1.0f + 0x3p-8f).bits, 0x3f82u);   // tie: to even (up)
    EXPECT_EQ(bfloat16::from_float(1.0f + 0x1.02p-8f).bits, 0x3f81u);  // just above the tie
    EXPECT_EQ(bfloat16::from_float(3.4028235e38f).bits, 0x7f80u);    // the largest float rounds to inf
    EXPECT_EQ(bfloat16::from_float(-INFINITY).bits, 0xff80u);
    EXPECT_EQ(bfloat16::from_float(-0.0f).bits, 0x8000u);
    EXPECT_EQ(bfloat16::from_float(from_bits(0x7f800001u)).bits, 0x7fc0u);  // a signalling NaN becomes quiet, not inf
    EXPECT_EQ(bfloat16::from_float(from_bits(0xff810000u)).bits, 0xffc1u);  // sign and payload kept
    EXPECT_EQ(mha::round_to_bf16(1.0f + 0x1.02p-8f), 1.0f + 0x1p-7f);
    EXPECT_EQ(mha::round_to_f16(1.0f + 0x1.02p-11f), 1.0f + 0x1p-10f);
}

}  // namespace
