// Math shared by the softmax kernels (row softmax and the fused path's online tile softmax): the largest
// lane, and exp(d) for the d = z − max <= 0 of a softmax. Included only by per-ISA kernel TUs; every
// helper is a template on Arch or exists only in the AVX-512 TU (no weak symbol shared across ISAs).
#pragma once
#include <cstddef>

#include "row_tail.hpp"

namespace mha::simd::softmax_detail {

using row_detail::batch;

// Lane numbers, to build the "lane < k" mask of a tail.
alignas(64) inline constexpr float lane_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Largest lane (lanes are never NaN here).
template <class Arch>
float reduce_max(Arch, const batch<Arch>& v) noexcept {
    alignas(64) float buf[batch<Arch>::size];
    v.store_aligned(buf);
    float m = buf[0];
    for (std::size_t i = 1; i < batch<Arch>::size; ++i) m = buf[i] > m ? buf[i] : m;
    return m;
}

// exp(d) for the d = z − max of a softmax: d <= 0, -inf or NaN.
template <class Arch>
batch<Arch> exp_nonpositive(Arch, const batch<Arch>& d) noexcept {
    return xsimd::exp(d);
}

#if defined(__AVX512F__)
// Only the AVX-512 TU sees these; overload resolution prefers them to the templates above.

// exp(d) for d <= 0 (or -inf, NaN) in 12 instructions, vs about 22 for xsimd::exp (whose ldexp and
// overflow/underflow selects this domain does not need): d = n·ln2 + r with |r| <= ln2/2 (Cody-Waite,
// two constants), a degree-6 polynomial for exp(r) (Chebyshev fit, 0.35 ulp), then vscalefps
// multiplies by 2^n, rounding into the subnormals correctly. Checked against exp in double on every
// float in [-104, 0]: at most 1.07 ulp where the result is normal (xsimd::exp: 1.52), within one
// subnormal step below. d < -104 is clamped to -104 (exp < 2^-149: rounds to 0); the clamp keeps NaN
// (maxps returns its second operand when one is NaN).
inline batch<arch_avx512> exp_nonpositive(arch_avx512, const batch<arch_avx512>& d) noexcept {
    const __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), d);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // n·ln2_hi is exact for |n| <= 150
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);     // ln2 − ln2_hi
    __m512 p = _mm512_set1_ps(0x1.6dafbp-10f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.1276bcp-7f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.55545ap-5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.5553f6p-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

inline float reduce_max(arch_avx512, const batch<arch_avx512>& v) noexcept { return _mm512_reduce_max_ps(v); }
#endif

}  // namespace mha::simd::softmax_detail
