// ElementFormat (element_format.hpp): plain loops over mha/half.hpp's conversions.
#include "element_format.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace mha::detail {
namespace {

template <class E>
constexpr bool kTensorScaled = std::is_same_v<E, fp8_e4m3> || std::is_same_v<E, fp8_e5m2>;

template <class E>
void narrow_to(const float* src, void* dst, std::size_t n, float scale) noexcept {
    auto* d = static_cast<E*>(dst);
    if constexpr (std::is_same_v<E, float>) {
        std::copy(src, src + n, d);
    } else if constexpr (std::is_same_v<E, qint8>) {
        quantize_row_int8(src, n, dst);
    } else if constexpr (kTensorScaled<E>) {
        for (std::size_t i = 0; i < n; ++i) d[i] = E::from_float(src[i] / scale);
    } else {
        for (std::size_t i = 0; i < n; ++i) d[i] = E::from_float(src[i]);
    }
}

template <class E>
void widen_from(const void* src, float* dst, std::size_t n, float scale) noexcept {
    const auto* s = static_cast<const E*>(src);
    if constexpr (std::is_same_v<E, float>) {
        std::copy(s, s + n, dst);
    } else if constexpr (std::is_same_v<E, qint8>) {
        dequantize_row_int8(src, n, dst);
    } else if constexpr (kTensorScaled<E>) {
        for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float() * scale;
    } else {
        for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float();
    }
}

// The bits that, all set, make an element NaN or ±inf (fp8_e4m3: NaN, S.1111.111); 0: none (int8's values).
template <class E>
constexpr std::uint32_t nonfinite_bits() noexcept {
    if constexpr (std::is_same_v<E, float>) return 0x7f800000u;
    if constexpr (std::is_same_v<E, bfloat16>) return 0x7f80u;
    if constexpr (std::is_same_v<E, float16>) return 0x7c00u;
    if constexpr (std::is_same_v<E, fp8_e4m3>) return 0x7fu;
    if constexpr (std::is_same_v<E, fp8_e5m2>) return 0x7cu;
    return 0;
}

template <class E>
constexpr ScaleKind scale_kind() noexcept {
    if constexpr (std::is_same_v<E, qint8>) return ScaleKind::block32;
    if constexpr (kTensorScaled<E>) return ScaleKind::tensor;
    return ScaleKind::none;
}

#define MHA_FORMAT_(name, E) constexpr ElementFormat k_##name{DataType::name, sizeof(E), scale_kind<E>(), nonfinite_bits<E>()};
MHA_KV_ELEMENT_TYPES(MHA_FORMAT_)
#undef MHA_FORMAT_

// Any of n elements of U at x (any alignment: an int8 row's scales may start at an odd byte) has all of mask.
template <class U>
bool any_bits_set(const void* x, std::size_t n, U mask) noexcept {
    const auto* bytes = static_cast<const unsigned char*>(x);
    bool bad = false;
    for (std::size_t j = 0; j < n; ++j) {
        U e;
        std::memcpy(&e, bytes + j * sizeof(U), sizeof(U));
        bad |= (e & mask) == mask;
    }
    return bad;
}

}  // namespace

const ElementFormat& element_format(DataType type) noexcept {
#define MHA_FORMAT_CASE_(name, E) \
    if (type == DataType::name) return k_##name;
    MHA_KV_ELEMENT_TYPES(MHA_FORMAT_CASE_)
#undef MHA_FORMAT_CASE_
    return k_f32;
}

bool is_element_type(DataType type) noexcept {
#define MHA_FORMAT_IS_(name, E) \
    if (type == DataType::name) return true;
    MHA_KV_ELEMENT_TYPES(MHA_FORMAT_IS_)
#undef MHA_FORMAT_IS_
    return false;
}

void ElementFormat::narrow(const float* src, void* dst, std::size_t n, float scale) const noexcept {
    visit_element_type(type, [&](auto e) { narrow_to<decltype(e)>(src, dst, n, scale); });
}

void ElementFormat::widen(const void* src, float* dst, std::size_t n, float scale) const noexcept {
    visit_element_type(type, [&](auto e) { widen_from<decltype(e)>(src, dst, n, scale); });
}

float ElementFormat::value(const void* row, std::size_t d, std::size_t c, float scale) const noexcept {
    if (this->scale == ScaleKind::block32)
        return static_cast<float>(static_cast<const std::int8_t*>(row)[c]) * int8_row_scale(row, d, c / kInt8Block);
    float x = 0.0f;
    widen(static_cast<const unsigned char*>(row) + c * bytes, &x, 1, scale);
    return x;
}

bool any_nonfinite_elements(const ElementFormat& format, const void* x, std::size_t n) noexcept {
    if (format.scale == ScaleKind::block32) {  // a block's scale is NaN when it held NaN or ±inf
        const std::size_t blocks = (n + kInt8Block - 1) / kInt8Block;
        return any_bits_set<std::uint16_t>(static_cast<const unsigned char*>(x) + n, blocks, std::uint16_t{0x7c00u});
    }
    if (format.nonfinite_bits == 0) return false;
    switch (format.bytes) {
        case 1: return any_bits_set<std::uint8_t>(x, n, static_cast<std::uint8_t>(format.nonfinite_bits));
        case 2: return any_bits_set<std::uint16_t>(x, n, static_cast<std::uint16_t>(format.nonfinite_bits));
        default: break;
    }
    return any_bits_set<std::uint32_t>(x, n, format.nonfinite_bits);
}

}  // namespace mha::detail
