// 8-bit element types of a KV cache (DataType::int8, fp8_e4m3, fp8_e5m2): their encodings and conversions.
// Header-only, C++17.
//
// int8 (scaled rows, llama.cpp's q8_0 layout within a row): a row of d values is stored as d int8 values q
// followed by ceil(d / 32) float16 scales s_b, one per block of 32 consecutive values (the last block may be
// shorter): int8_row_bytes(d) bytes, d + 2·ceil(d / 32) (1.0625 bytes per value when 32 divides d). A value
// is q·s_b, exact in fp32. Quantizing a block (quantize_row_int8): s = float16(amax / 127) (amax the block's
// largest magnitude; round to nearest even, at most 65504), then q = clamp(round(x / s), −127, 127) with
// x / s evaluated in double and rounded to nearest, ties to even; s = 0 (an all-zero block, or amax below
// about 4e-6, whose scale rounds to 0) gives q = 0. A block holding NaN or ±inf gets the scale NaN: all its
// values read back as NaN (int8 has no non-finite values).
// Why blocks of 32 with a float16 scale: the same bytes per value and rounding as q8_0 (llama.cpp's 8-bit
// cache), so the attention error is at most q8_0's; a per-row scale (1.03 bytes per value at d = 128) lets one
// large channel of a key row (real models have channels 10–50× the rest) set the step of all 128 values.
//
// fp8 (OCP 8-bit floating point, with a per-tensor scale given by the caller, vLLM's k_scale / v_scale):
//   fp8_e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; NaN = S.1111.111; largest 448.
//   fp8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits (the upper byte of a float16); ±inf; NaN; largest 57344.
// A stored value is e = fp8(x / scale) (x / scale in fp32, then rounded to nearest even, saturating: finite
// values and ±inf beyond the largest finite value become it, NaN stays NaN) and reads back as
// to_float(e)·scale (one fp32 rounding; exact when scale is a power of two).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mha/half.hpp"

namespace mha {

struct fp8_e4m3 {
    std::uint8_t bits = 0;

    static fp8_e4m3 from_bits(std::uint8_t b) noexcept {
        fp8_e4m3 h;
        h.bits = b;
        return h;
    }
    // Round to nearest even, saturating at ±448 (±inf too); NaN -> NaN.
    static fp8_e4m3 from_float(float x) noexcept {
        const std::uint32_t u = detail::float_bits(x), a = u & 0x7fffffffu;
        const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
        if (a > 0x7f800000u) return from_bits(static_cast<std::uint8_t>(sign | 0x7fu));
        if (a >= 0x3c800000u) {  // |x| >= 2^-6: normal; round the 23 mantissa bits to 3, then rebias (127 -> 7)
            const std::uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
            const std::uint32_t code = r - (120u << 3);
            return from_bits(static_cast<std::uint8_t>(sign | (code > 0x7eu ? 0x7eu : code)));
        }
        // Subnormal: m·2^-9, m = round(|x|·2^9) in [0, 8] (8 is the smallest normal, code 8).
        const auto m = static_cast<std::uint8_t>(std::nearbyint(detail::bits_float(a) * 512.0f));
        return from_bits(static_cast<std::uint8_t>(sign | m));
    }
    float to_float() const noexcept {
        const std::uint32_t sign = std::uint32_t{bits & 0x80u} << 24, e = (bits >> 3) & 0xfu, m = bits & 7u;
        if (e == 0xf && m == 7) return detail::bits_float(sign | 0x7fc00000u);
        if (e != 0) return detail::bits_float(sign | ((e + 120u) << 23) | (m << 20));
        const float v = static_cast<float>(m) * 0.001953125f;  // m·2^-9
        return sign != 0 ? -v : v;
    }
};

struct fp8_e5m2 {
    std::uint8_t bits = 0;

    static fp8_e5m2 from_bits(std::uint8_t b) noexcept {
        fp8_e5m2 h;
        h.bits = b;
        return h;
    }
    // Round to nearest even, saturating at ±57344 (±inf too); NaN -> NaN (quiet).
    static fp8_e5m2 from_float(float x) noexcept {
        const std::uint32_t u = detail::float_bits(x), a = u & 0x7fffffffu;
        const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
        if (a > 0x7f800000u) return from_bits(static_cast<std::uint8_t>(sign | 0x7eu));
        if (a >= 0x38800000u) {  // |x| >= 2^-14: normal; round the 23 mantissa bits to 2, then rebias (127 -> 15)
            const std::uint32_t r = (a + 0xfffffu + ((a >> 21) & 1u)) >> 21;
            const std::uint32_t code = r - (112u << 2);
            return from_bits(static_cast<std::uint8_t>(sign | (code > 0x7bu ? 0x7bu : code)));
        }
        // Subnormal: m·2^-16, m = round(|x|·2^16) in [0, 4] (4 is the smallest normal).
        const auto m = static_cast<std::uint8_t>(std::nearbyint(detail::bits_float(a) * 65536.0f));
        return from_bits(static_cast<std::uint8_t>(sign | m));
    }
    float to_float() const noexcept { return float16::from_bits(static_cast<std::uint16_t>(bits << 8)).to_float(); }
};

// One int8 value of a scaled row (the scales are stored after the row's values; see above).
struct qint8 {
    std::int8_t bits = 0;
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(fp8_e5m2) == 1 && sizeof(qint8) == 1, "8-bit element types");

// Values per int8 scale block.
inline constexpr std::size_t kInt8Block = 32;

// Bytes of an int8 row of d values: d int8 values, then ceil(d / 32) float16 scales.
constexpr std::size_t int8_row_bytes(std::size_t d) noexcept { return d + 2 * ((d + kInt8Block - 1) / kInt8Block); }

// Bytes of one stored K / V row of d elements of type t (an int8 row with its scales); 0 for no DataType.
constexpr std::size_t kv_row_bytes(DataType t, std::size_t d) noexcept {
    return t == DataType::int8 ? int8_row_bytes(d) : d * data_type_bytes(t);
}
// fp8 element types take a per-tensor scale (k_scale, v_scale).
constexpr bool has_tensor_scale(DataType t) noexcept { return t == DataType::fp8_e4m3 || t == DataType::fp8_e5m2; }

// The float16 scale of block b of an int8 row of d values.
inline float int8_row_scale(const void* row, std::size_t d, std::size_t b) noexcept {
    std::uint16_t s;
    std::memcpy(&s, static_cast<const unsigned char*>(row) + d + 2 * b, 2);
    return float16::from_bits(s).to_float();
}

// x [d] -> row (int8_row_bytes(d) bytes), as described above.
inline void quantize_row_int8(const float* x, std::size_t d, void* row) noexcept {
    auto* q = static_cast<std::int8_t*>(row);
    auto* bytes = static_cast<unsigned char*>(row);
    for (std::size_t b0 = 0; b0 < d; b0 += kInt8Block) {
        const std::size_t n = d - b0 < kInt8Block ? d - b0 : kInt8Block;
        float amax = 0.0f;
        bool finite = true;
        for (std::size_t i = 0; i < n; ++i) {
            const float v = x[b0 + i];
            finite = finite && std::isfinite(v);
            amax = std::fabs(v) > amax ? std::fabs(v) : amax;
        }
        float16 s = float16::from_bits(0x7e00);  // NaN: the block held NaN or ±inf
        if (finite) {
            s = float16::from_float(amax / 127.0f);
            if ((s.bits & 0x7c00u) == 0x7c00u) s = float16::from_bits(0x7bff);  // past 65504: the largest float16
        }
        const double step = s.to_float();
        for (std::size_t i = 0; i < n; ++i) {
            double r = finite && step > 0.0 ? std::nearbyint(double(x[b0 + i]) / step) : 0.0;
            r = r > 127.0 ? 127.0 : r < -127.0 ? -127.0 : r;
            q[b0 + i] = static_cast<std::int8_t>(r);
        }
        std::memcpy(bytes + d + 2 * (b0 / kInt8Block), &s.bits, 2);
    }
}

// row (int8_row_bytes(d) bytes) -> y [d]: q·s, exact.
inline void dequantize_row_int8(const void* row, std::size_t d, float* y) noexcept {
    const auto* q = static_cast<const std::int8_t*>(row);
    for (std::size_t b0 = 0; b0 < d; b0 += kInt8Block) {
        const float s = int8_row_scale(row, d, b0 / kInt8Block);
        const std::size_t end = d - b0 < kInt8Block ? d : b0 + kInt8Block;
        for (std::size_t i = b0; i < end; ++i) y[i] = static_cast<float>(q[i]) * s;
    }
}

}  // namespace mha
