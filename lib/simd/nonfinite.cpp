// simd::any_nonfinite (nonfinite.hpp). Baseline code: SSE2 is the x86-64 baseline; other targets scan
// with a plain loop.
#include "nonfinite.hpp"

#include <cmath>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mha::simd {

bool any_nonfinite(const float* x, std::size_t n) noexcept {
    std::size_t j = 0;
    bool bad = false;
#if defined(__SSE2__)
    // Four at a time: ((bits & exponent) + 2^23) has its top bit set exactly when the exponent field is all ones.
    const __m128i exponent = _mm_set1_epi32(0x7f800000), one = _mm_set1_epi32(0x00800000);
    __m128i acc = _mm_setzero_si128();
    for (; j + 4 <= n; j += 4) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j));
        acc = _mm_or_si128(acc, _mm_add_epi32(_mm_and_si128(bits, exponent), one));
    }
    bad = (_mm_movemask_ps(_mm_castsi128_ps(acc)) != 0);
#endif
    for (; j < n; ++j) bad |= !std::isfinite(x[j]);
    return bad;
}

}  // namespace mha::simd
