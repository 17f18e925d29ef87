// The 8-bit element types (mha/quantized.hpp): every fp8 code against a decoding written from the OCP 8-bit
// floating point definition (sign, biased exponent, mantissa; subnormals at the smallest exponent; e4m3: no
// infinities, NaN = S.1111.111; e5m2: ±inf at S.11111.00, NaN above), narrowing by round to nearest even at
// every midpoint between neighbouring codes (and just off it), saturation (finite overflow and ±inf to the
// largest finite), NaN kept, signed zeros and the subnormal range; the int8 row format (blocks of 32 with a
// float16 scale after the values): the scale, the levels, the error bound, short last blocks, non-finite
// blocks, all-zero and tiny blocks, the largest scale; and ElementFormat's narrow / widen with a tensor scale.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "core/element_format.hpp"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The OCP value of a code: e4m3 (E = 4, M = 3, bias 7) or e5m2 (E = 5, M = 2, bias 15).
double ocp_value(std::uint8_t b, int E, int M) {
    const int bias = (1 << (E - 1)) - 1, e = (b >> M) & ((1 << E) - 1), m = b & ((1 << M) - 1);
    const double sign = (b & 0x80) ? -1.0 : 1.0;
    if (E == 4 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
    if (E == 5 && e == 31) return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    if (e == 0) return sign * std::ldexp(double(m), 1 - bias - M);
    return sign * std::ldexp(1.0 + double(m) / (1 << M), e - bias);
}

template <class T>
struct Fp8Case {
    static constexpr int E = sizeof(T) == 1 && std::is_same_v<T, mha::fp8_e4m3> ? 4 : 5;
    static constexpr int M = E == 4 ? 3 : 2;
    static constexpr std::uint8_t kMax = E == 4 ? 0x7e : 0x7b;  // the largest finite code
};

template <class T>
void check_every_code() {
    constexpr int E = Fp8Case<T>::E, M = Fp8Case<T>::M;
    for (int c = 0; c < 256; ++c) {
        const auto b = static_cast<std::uint8_t>(c);
        const double want = ocp_value(b, E, M);
        const float got = T::from_bits(b).to_float();
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << "code " << c;
            EXPECT_TRUE(std::isnan(T::from_float(got).to_float())) << "NaN kept, code " << c;
            continue;
        }
        EXPECT_EQ(double(got), want) << "code " << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
        if (std::isinf(want)) continue;
        EXPECT_EQ(T::from_float(got).bits, b) << "round trip of code " << c;
    }
}

// Between neighbouring positive finite codes a < b: the midpoint goes to the even code, just above it to b,
// just below to a.
template <class T>
void check_rounding() {
    for (std::uint8_t a = 0; a < Fp8Case<T>::kMax; ++a) {
        const std::uint8_t b = a + 1;
        const float lo = T::from_bits(a).to_float(), hi = T::from_bits(b).to_float();
        const float mid = static_cast<float>((double(lo) + double(hi)) / 2);  // exact: fp8 values have few bits
        ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
        const std::uint8_t even = (a % 2 == 0) ? a : b;
        EXPECT_EQ(T::from_float(mid).bits, even) << "midpoint of codes " << int(a) << ", " << int(b);
        EXPECT_EQ(T::from_float(std::nextafter(mid, kInf)).bits, b) << "above the midpoint of " << int(a);
        EXPECT_EQ(T::from_float(std::nextafter(mid, 0.0f)).bits, a) << "below the midpoint of " << int(a);
        EXPECT_EQ(T::from_float(-mid).bits, even | 0x80) << "negative midpoint of " << int(a);
    }
}

TEST(Fp8, E4m3EveryCodeAndRounding) {
    check_every_code<mha::fp8_e4m3>();
    check_rounding<mha::fp8_e4m3>();
}

TEST(Fp8, E5m2EveryCodeAndRounding) {
    check_every_code<mha::fp8_e5m2>();
    check_rounding<mha::fp8_e5m2>();
}

TEST(Fp8, SaturatesAndKeepsNaNAndZeros) {
    using mha::fp8_e4m3;
    using mha::fp8_e5m2;
    for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1e9f, kInf, std::numeric_limits<float>::max()}) {
        EXPECT_EQ(fp8_e4m3::from_float(x).bits, 0x7e) << x;
        EXPECT_EQ(fp8_e4m3::from_float(-x).bits, 0xfe) << x;
    }
    for (float x : {57344.0f, 61439.0f, 61440.0f, 1e9f, kInf}) {
        EXPECT_EQ(fp8_e5m2::from_float(x).bits, 0x7b) << x;
        EXPECT_EQ(fp8_e5m2::from_float(-x).bits, 0xfb) << x;
    }
    EXPECT_TRUE(std::isnan(fp8_e4m3::from_float(std::nanf("")).to_float()));
    EXPECT_TRUE(std::isnan(fp8_e5m2::from_float(-std::nanf("")).to_float()));
    EXPECT_EQ(fp8_e4m3::from_float(-0.0f).bits, 0x80);
    EXPECT_EQ(fp8_e5m2::from_float(-0.0f).bits, 0x80);
    // Below half the smallest subnormal: ±0; at half: 0 (even); just above: the smallest subnormal.
    EXPECT_EQ(fp8_e4m3::from_float(0x1p-10f).bits, 0x00);
    EXPECT_EQ(fp8_e4m3::from_float(std::nextafter(0x1p-10f, 1.0f)).bits, 0x01);
    EXPECT_EQ(fp8_e4m3::from_float(-1e-30f).bits, 0x80);
    EXPECT_EQ(fp8_e5m2::from_float(0x1p-17f).bits, 0x00);
    EXPECT_EQ(fp8_e5m2::from_float(std::nextafter(0x1p-17f, 1.0f)).bits, 0x01);
}

// An int8 row read back: q·s per block; s = float16(amax / 127); every value within half a step of x (the
// clamp aside), q within ±127; the scales after the values.
TEST(Int8Rows, QuantizeAndDequantize) {
    std::mt19937 gen(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::size_t d : {std::size_t(1), std::size_t(31), std::size_t(32), std::size_t(33), std::size_t(128), std::size_t(130)}) {
        std::vector<float> x(d), y(d);
        for (float& v : x) v = n(gen) * 3.0f;
        std::vector<unsigned char> row(mha::int8_row_bytes(d) + 8, 0xab);
        mha::quantize_row_int8(x.data(), d, row.data());
        EXPECT_EQ(mha::int8_row_bytes(d), d + 2 * ((d + 31) / 32));
        for (std::size_t i = mha::int8_row_bytes(d); i < row.size(); ++i) ASSERT_EQ(row[i], 0xab) << "written past the row";
        mha::dequantize_row_int8(row.data(), d, y.data());
        for (std::size_t b0 = 0; b0 < d; b0 += 32) {
            const std::size_t nb = std::min<std::size_t>(32, d - b0);
            float amax = 0;
            for (std::size_t i = b0; i < b0 + nb; ++i) amax = std::max(amax, std::abs(x[i]));
            const float s = mha::int8_row_scale(row.data(), d, b0 / 32);
            EXPECT_EQ(s, mha::float16::from_float(amax / 127.0f).to_float());
            for (std::size_t i = b0; i < b0 + nb; ++i) {
                const auto q = static_cast<std::int8_t>(row[i]);
                EXPECT_GE(q, -127);
                EXPECT_EQ(y[i], float(q) * s);
                EXPECT_LE(std::abs(double(x[i]) - y[i]), std::max(double(s) / 2, std::abs(double(x[i])) - 127.0 * s) * (1 + 1e-12)) << i;
                // The nearest step (ties to even) unless clamped.
                const double r = std::nearbyint(double(x[i]) / s);
                if (std::abs(r) <= 127) {
                    EXPECT_EQ(double(q), r) << i;
                }
            }
        }
    }
}

TEST(Int8Rows, SpecialBlocks) {
    const std::size_t d = 96;
    std::vector<float> x(d, 0.5f), y(d);
    x[3] = std::nanf("");                        // block 0: NaN
    x[40] = -kInf;                               // block 1: -inf
    for (std::size_t i = 64; i < 96; ++i) x[i] = 0.0f;  // block 2: zeros
    std::vector<unsigned char> row(mha::int8_row_bytes(d));
    mha::quantize_row_int8(x.data(), d, row.data());
    mha::dequantize_row_int8(row.data(), d, y.data());
    for (std::size_t i = 0; i < 64; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
    for (std::size_t i = 64; i < 96; ++i) EXPECT_EQ(y[i], 0.0f) << i;
    // A tiny block (scale rounds to 0) reads back zeros; a huge one takes the largest float16 scale and clamps.
    std::vector<float> tiny(32, 1e-7f), huge(32, 1e12f), t(32);
    std::vector<unsigned char> r2(mha::int8_row_bytes(32));
    mha::quantize_row_int8(tiny.data(), 32, r2.data());
    mha::dequantize_row_int8(r2.data(), 32, t.data());
    for (float v : t) EXPECT_EQ(v, 0.0f);
    mha::quantize_row_int8(huge.data(), 32, r2.data());
    EXPECT_EQ(mha::int8_row_scale(r2.data(), 32, 0), 65504.0f);
    mha::dequantize_row_int8(r2.data(), 32, t.data());
    for (float v : t) EXPECT_EQ(v, 127.0f * 65504.0f);
    // The format's non-finite check reads the scales.
    const auto& f = mha::detail::element_format(mha::DataType::int8);
    EXPECT_TRUE(mha::detail::any_nonfinite_elements(f, row.data(), d));
    mha::quantize_row_int8(huge.data(), 32, r2.data());
    EXPECT_FALSE(mha::detail::any_nonfinite_elements(f, r2.data(), 32));
}

// ElementFormat: fp8 narrows x / scale and widens to value·scale; row bytes and sizes; names and bytes.
TEST(Int8Rows, ElementFormatsWithScales) {
    const std::vector<float> x = {0.1f, -3.0f, 250.0f, 1e-4f, 7.0f};
    for (mha::DataType t : {mha::DataType::fp8_e4m3, mha::DataType::fp8_e5m2}) {
        const auto& f = mha::detail::element_format(t);
        EXPECT_EQ(f.row_bytes(5), 5u);
        std::vector<std::uint8_t> s(5);
        std::vector<float> y(5);
        f.narrow(x.data(), s.data(), 5, 0.5f);
        f.widen(s.data(), y.data(), 5, 0.5f);
        for (std::size_t i = 0; i < 5; ++i) {
            const float e = t == mha::DataType::fp8_e4m3 ? mha::fp8_e4m3::from_float(x[i] / 0.5f).to_float()
                                                          : mha::fp8_e5m2::from_float(x[i] / 0.5f).to_float();
            EXPECT_EQ(y[i], e * 0.5f) << i;
            EXPECT_EQ(f.value(s.data(), 5, i, 0.5f), y[i]) << i;
        }
    }
    const auto& i8 = mha::detail::element_format(mha::DataType::int8);
    EXPECT_EQ(i8.row_bytes(128), 136u);
    EXPECT_EQ(mha::kv_row_bytes(mha::DataType::int8, 128), 136u);
    EXPECT_EQ(mha::kv_row_bytes(mha::DataType::fp8_e4m3, 128), 128u);
    EXPECT_EQ(mha::kv_row_bytes(mha::DataType::bf16, 128), 256u);
    EXPECT_EQ(mha::data_type_name(mha::DataType::fp8_e5m2), "fp8_e5m2");
    EXPECT_EQ(mha::data_type_name(mha::DataType::int8), "int8");
    // Caches: sizes with the scales, scales refused where they do not apply.
    const mha::KVCache c(2, 3, 64, 10, mha::DataType::int8);
    EXPECT_EQ(c.bytes(), 2u * 2 * 3 * 10 * 68);
    EXPECT_THROW(mha::KVCache(1, 1, 8, 4, mha::DataType::int8, 0.5f, 1.0f), mha::invalid_argument);
    EXPECT_THROW(mha::KVCache(1, 1, 8, 4, mha::DataType::fp8_e4m3, 0.0f, 1.0f), mha::invalid_argument);
    EXPECT_THROW(mha::KVCache(1, 1, 8, 4, mha::DataType::fp8_e4m3, 1.0f, std::nanf("")), mha::invalid_argument);
    EXPECT_THROW(mha::PagedKVCache(4, 16, 1, 8, mha::DataType::f16, 2.0f, 1.0f), mha::invalid_argument);
    // A scale whose largest code read back overflows float: refused, naming the limit; the printed values
    // keep the digits that tell them apart (1.0000001, not 1.000000).
    auto message = [](auto&& make) {
        try {
            make();
        } catch (const mha::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const float e4m3_max_scale = std::numeric_limits<float>::max() / 448.0f;
    EXPECT_NO_THROW(mha::KVCache(1, 1, 8, 4, mha::DataType::fp8_e4m3, e4m3_max_scale, 1.0f));
    const std::string big = message([] { mha::KVCache(1, 1, 8, 4, mha::DataType::fp8_e4m3, 1e36f, 1.0f); });
    EXPECT_NE(big.find("k_scale is 1e+36 but must be at most 7.59"), std::string::npos) << big;
    EXPECT_NE(big.find("overflows float"), std::string::npos) << big;
    EXPECT_THROW(mha::PagedKVCache(4, 16, 1, 8, mha::DataType::fp8_e5m2, 1.0f, 6e33f), mha::invalid_argument);
    EXPECT_NO_THROW(mha::PagedKVCache(4, 16, 1, 8, mha::DataType::fp8_e5m2, 1.0f, 5e33f));
    const std::string near_one = message([] { mha::KVCache(1, 1, 8, 4, mha::DataType::int8, std::nextafter(1.0f, 2.0f), 1.0f); });
    EXPECT_NE(near_one.find("k_scale is 1.0000001 but must be 1 for a int8 cache"), std::string::npos) << near_one;
    const mha::KVCache e(1, 1, 8, 4, mha::DataType::fp8_e5m2, 0.25f, 4.0f);
    EXPECT_EQ(e.k_scale(), 0.25f);
    EXPECT_EQ(e.v_scale(), 4.0f);
}

}  // namespace
