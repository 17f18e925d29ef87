// narrow_row / widen_row (kv_elements.hpp): plain loops over mha/half.hpp's conversions.
#include "kv_elements.hpp"

#include <algorithm>

namespace mha::detail {

void narrow_row(DataType type, const float* src, void* dst, std::size_t n) noexcept {
    switch (type) {
        case DataType::bf16: {
            auto* d = static_cast<bfloat16*>(dst);
            for (std::size_t i = 0; i < n; ++i) d[i] = bfloat16::from_float(src[i]);
            return;
        }
        case DataType::f16: {
            auto* d = static_cast<float16*>(dst);
            for (std::size_t i = 0; i < n; ++i) d[i] = float16::from_float(src[i]);
            return;
        }
        case DataType::f32: break;
    }
    std::copy(src, src + n, static_cast<float*>(dst));
}

void widen_row(DataType type, const void* src, float* dst, std::size_t n) noexcept {
    switch (type) {
        case DataType::bf16: {
            const auto* s = static_cast<const bfloat16*>(src);
            for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float();
            return;
        }
        case DataType::f16: {
            const auto* s = static_cast<const float16*>(src);
            for (std::size_t i = 0; i < n; ++i) dst[i] = s[i].to_float();
            return;
        }
        case DataType::f32: break;
    }
    const auto* s = static_cast<const float*>(src);
    std::copy(s, s + n, dst);
}

}  // namespace mha::detail
