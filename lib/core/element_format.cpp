// ElementFormat (element_format.hpp): plain loops over mha/half.hpp's conversions.
#include "element_format.hpp"

#include <algorithm>

namespace mha::detail {
namespace {

template <class E>
void narrow_to(const float* src, void* dst, std::size_t n) noexcept {
    auto* d = static_cast<E*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = E::from_float(src[i]);
}

template <class E>
void widen_from(const void* src, float* dst, std::size_t n) noexcept {
    const auto* s = static_cast<const E*>(src);
    for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float();
}

constexpr ElementFormat kF32{DataType::f32, 4, ScaleKind::none};
constexpr ElementFormat kBf16{DataType::bf16, 2, ScaleKind::none};
constexpr ElementFormat kF16{DataType::f16, 2, ScaleKind::none};

}  // namespace

const ElementFormat& element_format(DataType type) noexcept {
    switch (type) {
        case DataType::bf16: return kBf16;
        case DataType::f16: return kF16;
        case DataType::f32: break;
    }
    return kF32;
}

bool is_element_type(DataType type) noexcept {
    return type == DataType::f32 || type == DataType::bf16 || type == DataType::f16;
}

void ElementFormat::narrow(const float* src, void* dst, std::size_t n) const noexcept {
    switch (type) {
        case DataType::bf16: return narrow_to<bfloat16>(src, dst, n);
        case DataType::f16: return narrow_to<float16>(src, dst, n);
        case DataType::f32: break;
    }
    std::copy(src, src + n, static_cast<float*>(dst));
}

void ElementFormat::widen(const void* src, float* dst, std::size_t n) const noexcept {
    switch (type) {
        case DataType::bf16: return widen_from<bfloat16>(src, dst, n);
        case DataType::f16: return widen_from<float16>(src, dst, n);
        case DataType::f32: break;
    }
    const auto* s = static_cast<const float*>(src);
    std::copy(s, s + n, dst);
}

}  // namespace mha::detail
