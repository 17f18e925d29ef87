// Rotary position embedding for the SIMD layer (mha/attention.hpp's RopeConfig), applied in the projection
// tasks right after the GEMM wrote a block of Q or K rows (while they are in cache):
//   rope_table: cos and sin of p·θ_k for positions p0 .. p0 + n − 1 and k < r/2, in double, rounded once
//     (θ_k = theta^(−2k/r) precomputed in double: exact to float accuracy at positions up to 2^20 and far beyond);
//   rope_rows: rotates the first r columns of each row of one head's [n, d] block with that table.
#pragma once
#include <cstddef>
#include <vector>

#include "mha/attention.hpp"

namespace mha::detail {

// θ_k = theta^(−2k/r), k < r/2.
std::vector<double> rope_frequencies(float theta, std::size_t r);
// cos_t / sin_t: [n, r/2] each.
void rope_table(const double* freq, std::size_t half, std::size_t p0, std::size_t n, float* cos_t, float* sin_t) noexcept;
void rope_rows(Matrix x, std::size_t r, RopeStyle style, const float* cos_t, const float* sin_t) noexcept;

}  // namespace mha::detail
