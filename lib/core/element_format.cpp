// ElementFormat (element_format.hpp): plain loops over mha/half.hpp's conversions.
#include "element_format.hpp"

#include <algorithm>
#include <type_traits>

namespace mha::detail {
namespace {

template <class E>
void narrow_to(const float* src, void* dst, std::size_t n) noexcept {
    auto* d = static_cast<E*>(dst);
    if constexpr (std::is_same_v<E, float>) {
        std::copy(src, src + n, d);
    } else {
        for (std::size_t i = 0; i < n; ++i) d[i] = E::from_float(src[i]);
    }
}

template <class E>
void widen_from(const void* src, float* dst, std::size_t n) noexcept {
    const auto* s = static_cast<const E*>(src);
    if constexpr (std::is_same_v<E, float>) {
        std::copy(s, s + n, dst);
    } else {
        for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float();
    }
}

// All exponent bits of the type's encoding set: NaN or ±inf.
template <class E>
constexpr std::uint32_t nonfinite_bits() noexcept {
    if constexpr (std::is_same_v<E, float>) return 0x7f800000u;
    if constexpr (std::is_same_v<E, bfloat16>) return 0x7f80u;
    if constexpr (std::is_same_v<E, float16>) return 0x7c00u;
    return 0;
}

#define MHA_FORMAT_(name, E) constexpr ElementFormat k_##name{DataType::name, sizeof(E), ScaleKind::none, nonfinite_bits<E>()};
MHA_KV_ELEMENT_TYPES(MHA_FORMAT_)
#undef MHA_FORMAT_

template <class U>
bool any_bits_set(const void* x, std::size_t n, U mask) noexcept {
    const auto* e = static_cast<const U*>(x);
    bool bad = false;
    for (std::size_t j = 0; j < n; ++j) bad |= (e[j] & mask) == mask;
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

void ElementFormat::narrow(const float* src, void* dst, std::size_t n) const noexcept {
    visit_element_type(type, [&](auto e) { narrow_to<decltype(e)>(src, dst, n); });
}

void ElementFormat::widen(const void* src, float* dst, std::size_t n) const noexcept {
    visit_element_type(type, [&](auto e) { widen_from<decltype(e)>(src, dst, n); });
}

bool any_nonfinite_elements(const ElementFormat& format, const void* x, std::size_t n) noexcept {
    if (format.nonfinite_bits == 0) return false;
    switch (format.bytes) {
        case 1: return any_bits_set<std::uint8_t>(x, n, static_cast<std::uint8_t>(format.nonfinite_bits));
        case 2: return any_bits_set<std::uint16_t>(x, n, static_cast<std::uint16_t>(format.nonfinite_bits));
        default: break;
    }
    return any_bits_set<std::uint32_t>(x, n, format.nonfinite_bits);
}

}  // namespace mha::detail
