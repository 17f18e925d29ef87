// Rows of a KV cache's element type (DataType) to and from float, scalar and exact:
//   narrow_row: dst[i] = src[i] rounded to the element type (round to nearest, ties to even; mha/half.hpp)
//   widen_row:  dst[i] = the float value of src[i] (exact for every element type)
// src / dst hold n elements of that type (a copy for f32). Any n >= 0; the ranges must not overlap.
#pragma once
#include <cstddef>

#include "mha/half.hpp"

namespace mha::detail {

void narrow_row(DataType type, const float* src, void* dst, std::size_t n) noexcept;
void widen_row(DataType type, const void* src, float* dst, std::size_t n) noexcept;

}  // namespace mha::detail
