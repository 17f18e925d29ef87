// x[i] = round_to_bf16(x[i]) for i < n, in place (mha/half.hpp: nearest even, NaN made quiet): the rounding
// points of bf16 compute applied to the layer's own buffers (Q, K, V, P, the context). SSE2 (the x86-64
// baseline) where the target has it, else the scalar conversion.
#pragma once
#include <cstddef>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "mha/half.hpp"
#include "mha/view.hpp"

namespace mha::simd {

inline void round_to_bf16_inplace(float* x, std::size_t n) noexcept {
    std::size_t i = 0;
#if defined(__SSE2__)
    const __m128i lsb = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff), high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000), quiet = _mm_set1_epi32(0x00400000);
    for (; i + 4 <= n; i += 4) {
        const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
        const __m128i rounded = _mm_and_si128(_mm_add_epi32(u, _mm_add_epi32(bias, _mm_and_si128(_mm_srli_epi32(u, 16), lsb))), high);
        const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, magnitude), inf);
        const __m128i quieted = _mm_and_si128(_mm_or_si128(u, quiet), high);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i),
                         _mm_or_si128(_mm_andnot_si128(nan, rounded), _mm_and_si128(nan, quieted)));
    }
#endif
    for (; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

// Every element of a row-major view.
inline void round_to_bf16_inplace(Matrix x) noexcept {
    if (x.stride == x.cols) return round_to_bf16_inplace(x.data, x.rows * x.cols);
    for (std::size_t r = 0; r < x.rows; ++r) round_to_bf16_inplace(x.row(r), x.cols);
}

}  // namespace mha::simd
