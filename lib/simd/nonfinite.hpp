// Scans for values that are not finite (NaN or ±inf), on any target: SSE2 where the baseline has it, a
// plain loop elsewhere (nonfinite.cpp). A baseline TU, no ISA flags.
#pragma once
#include <cstddef>

namespace mha::simd {

// True when any of x[0, n) is NaN or ±inf (its exponent bits all set). n == 0: false.
bool any_nonfinite(const float* x, std::size_t n) noexcept;

}  // namespace mha::simd
