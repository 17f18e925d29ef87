// The element format of stored K / V rows (a KV cache's DataType), as one descriptor every reader and
// writer of cached rows asks: bytes per element, a row's storage, and how a row is narrowed to it and
// widened from it (mha/half.hpp, mha/quantized.hpp):
//   narrow: dst = src rounded to the format (round to nearest, ties to even; fp8: src / scale, saturating;
//           int8: the row quantized in blocks of 32 with their float16 scales stored after the values)
//   widen:  dst[i] = the float value of element i (exact; fp8: to_float·scale, one fp32 rounding)
// src / dst hold one row of n elements: n floats, and row_elements(n) elements of the format (a copy for
// f32). Any n >= 0; the ranges must not overlap. `scale`: the per-tensor scale of fp8 (k_scale / v_scale),
// ignored by the other formats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mha/half.hpp"
#include "mha/quantized.hpp"

namespace mha::detail {

// The element types of stored K / V rows: X(DataType enumerator, C++ element type). Every list of them in
// the library (descriptors, the decode kernels' instantiations and overloads, the typed cache views) is
// generated from this one.
// MHA_KV_ELEMENT_TYPES_WITH(X, A, B) calls X(A, B, name, E) for each, passing two arguments through.
#define MHA_KV_ELEMENT_TYPES_WITH(X, A, B) \
    X(A, B, f32, float)                    \
    X(A, B, bf16, bfloat16)                \
    X(A, B, f16, float16)                  \
    X(A, B, int8, qint8)                   \
    X(A, B, fp8_e4m3, fp8_e4m3)            \
    X(A, B, fp8_e5m2, fp8_e5m2)
#define MHA_KV_ELEMENT_TYPE_CALL_(X, unused, name, E) X(name, E)
#define MHA_KV_ELEMENT_TYPES(X) MHA_KV_ELEMENT_TYPES_WITH(MHA_KV_ELEMENT_TYPE_CALL_, X, ~)

// Where a format keeps its scales. none: the elements are the values (f32, bf16, f16); block32: a float16 scale
// per block of 32 values, stored after the row's values (int8); tensor: one scale per cache tensor, given by
// the caller (fp8).
enum class ScaleKind { none, block32, tensor };

struct ElementFormat {
    DataType type = DataType::f32;
    std::size_t bytes = 4;              // per element
    ScaleKind scale = ScaleKind::none;
    // The element's bits with its exponent field all ones (NaN or ±inf; fp8_e4m3: NaN only); 0: the format's
    // elements have no such values (int8: a block's NaN scale marks it, any_nonfinite_elements reads it).
    std::uint32_t nonfinite_bits = 0x7f800000u;
    // Storage elements of one row of d values (int8: the values and their scales, one byte each).
    std::size_t row_elements(std::size_t d) const noexcept { return scale == ScaleKind::block32 ? int8_row_bytes(d) : d; }
    std::size_t row_bytes(std::size_t d) const noexcept { return row_elements(d) * bytes; }
    void narrow(const float* src, void* dst, std::size_t n, float scale = 1.0f) const noexcept;
    void widen(const void* src, float* dst, std::size_t n, float scale = 1.0f) const noexcept;
    // Value c of a row of d values at `row`: widen's dst[c].
    float value(const void* row, std::size_t d, std::size_t c, float scale = 1.0f) const noexcept;
};

// The descriptor of `type` (any KV element type). is_element_type: `type` names one of them.
const ElementFormat& element_format(DataType type) noexcept;
bool is_element_type(DataType type) noexcept;

// Calls f(E{}) with the C++ element type of `type` (float, bfloat16, float16, qint8, fp8_e4m3, fp8_e5m2): the one switch where a kernel
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

// Any of the n values of the row at x (of `format`) is NaN or ±inf, read as bits (int8: a block's scale;
// plain loop; fp32 rows have a SIMD scan, simd::any_nonfinite).
bool any_nonfinite_elements(const ElementFormat& format, const void* x, std::size_t n) noexcept;

}  // namespace mha::detail
