// Half-precision element types: bfloat16 and IEEE binary16 (float16), stored as their 16 bits, with exact
// widening to float and round-to-nearest-even narrowing. Header-only, C++17.
//
//   bfloat16: the top 16 bits of a float (8 exponent bits, 7 mantissa bits; unit roundoff 2^-8). Narrowing
//             rounds to nearest, ties to even; NaN stays NaN (made quiet), ±inf and ±0 stay, floats past the
//             largest bfloat16 round to ±inf as IEEE rounding does.
//   float16:  IEEE binary16 (5 exponent bits, 10 mantissa bits; unit roundoff 2^-11; largest 65504). Narrowing
//             rounds to nearest even, including into the subnormal range; |x| >= 65520 becomes ±inf; NaN stays
//             NaN (quiet). The same bits as the F16C instruction vcvtps2ph with round-to-nearest-even.
// DataType names the element type of an array or of a computation (see AttentionConfig::compute and
// KVCache's element type).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mha {

// f32, bf16, f16: element types of arrays, computations (f32, bf16) and KV caches; int8, fp8_e4m3, fp8_e5m2:
// 8-bit KV cache element types only (mha/quantized.hpp).
enum class DataType { f32, bf16, f16, int8, fp8_e4m3, fp8_e5m2 };

// "f32", "bf16", "f16", "int8", "fp8_e4m3", "fp8_e5m2" ("" for a value that names no DataType).
constexpr std::string_view data_type_name(DataType t) noexcept {
    switch (t) {
        case DataType::f32: return "f32";
        case DataType::bf16: return "bf16";
        case DataType::f16: return "f16";
        case DataType::int8: return "int8";
        case DataType::fp8_e4m3: return "fp8_e4m3";
        case DataType::fp8_e5m2: return "fp8_e5m2";
    }
    return "";
}
// Bytes of one element (0 for a value that names no DataType). An int8 row also holds its scales:
// kv_row_bytes (mha/quantized.hpp) gives a stored row's bytes.
constexpr std::size_t data_type_bytes(DataType t) noexcept {
    switch (t) {
        case DataType::f32: return 4;
        case DataType::bf16:
        case DataType::f16: return 2;
        case DataType::int8:
        case DataType::fp8_e4m3:
        case DataType::fp8_e5m2: return 1;
    }
    return 0;
}

namespace detail {
inline std::uint32_t float_bits(float x) noexcept {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float bits_float(std::uint32_t u) noexcept {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
}  // namespace detail

struct bfloat16 {
    std::uint16_t bits = 0;

    static bfloat16 from_bits(std::uint16_t b) noexcept {
        bfloat16 h;
        h.bits = b;
        return h;
    }
    static bfloat16 from_float(float x) noexcept {
        const std::uint32_t u = detail::float_bits(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
        return from_bits(static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
    }
    float to_float() const noexcept { return detail::bits_float(std::uint32_t{bits} << 16); }
};

struct float16 {
    std::uint16_t bits = 0;

    static float16 from_bits(std::uint16_t b) noexcept {
        float16 h;
        h.bits = b;
        return h;
    }
    static float16 from_float(float x) noexcept {
        const std::uint32_t u = detail::float_bits(x);
        const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
        const std::uint32_t a = u & 0x7fffffffu;
        if (a > 0x7f800000u) return from_bits(static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu)));
        if (a >= 0x477ff000u) return from_bits(static_cast<std::uint16_t>(sign | 0x7c00u));  // >= 65520: inf
        if (a >= 0x38800000u) {  // normal half: rebias the exponent, round the 13 dropped bits to even
            const std::uint32_t r = a - 0x38000000u;
            return from_bits(static_cast<std::uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13)));
        }
        if (a < 0x33000000u) return from_bits(sign);  // below half the smallest subnormal (2^-25): ±0
        // Subnormal half: value = m·2^-24 with m = round(|x|·2^24), ties to even.
        const std::uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126u - e;  // |x| = mant·2^(e-150); m = mant >> (126 - e) rounded
        const std::uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        const std::uint32_t m = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
        return from_bits(static_cast<std::uint16_t>(sign | m));
    }
    float to_float() const noexcept {
        const std::uint32_t sign = std::uint32_t{bits & 0x8000u} << 16, e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
        if (e == 0x1f) return detail::bits_float(sign | 0x7f800000u | (m << 13));
        if (e != 0) return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
        // Subnormal or zero: m·2^-24, exact in float.
        const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
        return sign != 0 ? -v : v;
    }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit element types");

// x rounded to the nearest bfloat16 / float16 and widened back: the value a half-precision operand holds.
inline float round_to_bf16(float x) noexcept { return bfloat16::from_float(x).to_float(); }
inline float round_to_f16(float x) noexcept { return float16::from_float(x).to_float(); }

}  // namespace mha
