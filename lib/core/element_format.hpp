// The element format of stored K / V rows (a KV cache's DataType), as one descriptor every reader and
// writer of cached rows asks: bytes per element, and how a row is narrowed to it and widened from it.
//   narrow: dst[i] = src[i] rounded to the format (round to nearest, ties to even; mha/half.hpp)
//   widen:  dst[i] = the float value of src[i] (exact for every format)
// src / dst hold n elements (a copy for f32). Any n >= 0; the ranges must not overlap.
// Room for the quantized formats: a row may carry a scale (`scale`), read by widen and written by narrow.
#pragma once
#include <cstddef>

#include "mha/half.hpp"

namespace mha::detail {

// Where a format keeps its scales. none: the elements are the values (f32, bf16, f16).
enum class ScaleKind { none };

struct ElementFormat {
    DataType type = DataType::f32;
    std::size_t bytes = 4;              // per element
    ScaleKind scale = ScaleKind::none;  // per-row / per-block scales of the 8-bit formats (none yet)
    // Bytes of one row of d elements (with its scale, once formats have one).
    std::size_t row_bytes(std::size_t d) const noexcept { return d * bytes; }
    void narrow(const float* src, void* dst, std::size_t n) const noexcept;
    void widen(const void* src, float* dst, std::size_t n) const noexcept;
};

// The descriptor of `type` (f32, bf16, f16). is_element_type: `type` names one of them.
const ElementFormat& element_format(DataType type) noexcept;
bool is_element_type(DataType type) noexcept;

// Calls f(E{}) with the C++ element type of `type` (float, bfloat16, float16): the one switch where a kernel
// templated on the element type is chosen for a format.
template <class F>
decltype(auto) visit_element_type(DataType type, F&& f) {
    switch (type) {
        case DataType::bf16: return f(bfloat16{});
        case DataType::f16: return f(float16{});
        case DataType::f32: break;
    }
    return f(float{});
}

}  // namespace mha::detail
