// The element format of stored K / V rows (a KV cache's DataType), as one descriptor every reader and
// writer of cached rows asks: bytes per element, and how a row is narrowed to it and widened from it.
//   narrow: dst[i] = src[i] rounded to the format (round to nearest, ties to even; mha/half.hpp)
//   widen:  dst[i] = the float value of src[i] (exact for every format)
// src / dst hold n elements (a copy for f32). Any n >= 0; the ranges must not overlap.
// Room for the quantized formats: a row may carry a scale (`scale`), read by widen and written by narrow.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mha/half.hpp"

namespace mha::detail {

// The element types of stored K / V rows: X(DataType enumerator, C++ element type). Every list of them in
// the library (descriptors, the decode kernels' instantiations and overloads, the typed cache views) is
// generated from this one.
// MHA_KV_ELEMENT_TYPES_WITH(X, A, B) calls X(A, B, name, E) for each, passing two arguments through.
#define MHA_KV_ELEMENT_TYPES_WITH(X, A, B) \
    X(A, B, f32, float)                    \
    X(A, B, bf16, bfloat16)                \
    X(A, B, f16, float16)
#define MHA_KV_ELEMENT_TYPE_CALL_(X, unused, name, E) X(name, E)
#define MHA_KV_ELEMENT_TYPES(X) MHA_KV_ELEMENT_TYPES_WITH(MHA_KV_ELEMENT_TYPE_CALL_, X, ~)

// Where a format keeps its scales. none: the elements are the values (f32, bf16, f16).
enum class ScaleKind { none };

struct ElementFormat {
    DataType type = DataType::f32;
    std::size_t bytes = 4;              // per element
    ScaleKind scale = ScaleKind::none;  // per-row / per-block scales of the 8-bit formats (none yet)
    // The element's bits with its exponent field all ones (NaN or ±inf); 0: the format has no such values.
    std::uint32_t nonfinite_bits = 0x7f800000u;
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
#define MHA_VISIT_CASE_(name, E) \
    if (type == DataType::name) return f(E{});
    MHA_KV_ELEMENT_TYPES(MHA_VISIT_CASE_)
#undef MHA_VISIT_CASE_
    return f(float{});
}
// The DataType of the C++ element type E.
template <class E>
constexpr DataType element_type_of() noexcept {
#define MHA_TYPE_OF_(name, T) \
    if constexpr (std::is_same_v<E, T>) return DataType::name;
    MHA_KV_ELEMENT_TYPES(MHA_TYPE_OF_)
#undef MHA_TYPE_OF_
    return DataType::f32;
}

// Any of the n elements at x (of `format`) is NaN or ±inf, read as bits (plain loop; fp32 rows have a SIMD
// scan, simd::any_nonfinite).
bool any_nonfinite_elements(const ElementFormat& format, const void* x, std::size_t n) noexcept;

}  // namespace mha::detail
