// Rounding to bf16 in place on one ISA: the definition of round_bf16_kernel::operator(), included only by the
// generated round_bf16_<isa>.cpp TUs. On the float bits u: u + 0x7FFF + ((u >> 16) & 1), high half kept (nearest
// even; a carry into the exponent gives the next binade, or inf past the largest bf16); NaN (|u| > inf's bits)
// keeps its sign and payload's high half, quieted (bit 22 set). Integer operations on 4, 8 or 16 lanes (SSE2, AVX2,
// AVX-512; NEON 4), then the same formula one element at a time for the tail (not mha::round_to_bf16, an inline
// function that this TU would compile with its ISA's flags and share with baseline code): the bits of round_to_bf16.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "round_bf16.hpp"

namespace mha::simd {

template <class Arch>
void round_bf16_kernel::operator()(Arch, float* x, std::size_t n) const noexcept {
    std::size_t i = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
        const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u)), magnitude = _mm512_set1_epi32(0x7fffffff);
        const __m512i inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x00400000);
        for (; i + 16 <= n; i += 16) {
            const __m512i u = _mm512_loadu_si512(x + i);
            const __m512i rounded =
                _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb))), high);
            const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, magnitude), inf);
            _mm512_storeu_si512(x + i, _mm512_mask_mov_epi32(rounded, nan, _mm512_and_si512(_mm512_or_si512(u, quiet), high)));
        }
    }
#endif
#if defined(__AVX2__)
    if constexpr (std::is_same_v<Arch, arch_avx2>) {
        const __m256i lsb = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
        const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u)), magnitude = _mm256_set1_epi32(0x7fffffff);
        const __m256i inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x00400000);
        for (; i + 8 <= n; i += 8) {
            const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
            const __m256i rounded =
                _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), lsb))), high);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, magnitude), inf);
            const __m256i quieted = _mm256_and_si256(_mm256_or_si256(u, quiet), high);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i), _mm256_blendv_epi8(rounded, quieted, nan));
        }
    }
#endif
#if defined(__SSE2__)
    if constexpr (std::is_same_v<Arch, arch_sse2>) {
        const __m128i lsb = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff), high = _mm_set1_epi32(static_cast<int>(0xffff0000u));
        const __m128i magnitude = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000), quiet = _mm_set1_epi32(0x00400000);
        for (; i + 4 <= n; i += 4) {
            const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i));
            const __m128i rounded = _mm_and_si128(_mm_add_epi32(u, _mm_add_epi32(bias, _mm_and_si128(_mm_srli_epi32(u, 16), lsb))), high);
            const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, magnitude), inf);
            const __m128i quieted = _mm_and_si128(_mm_or_si128(u, quiet), high);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(x + i), _mm_or_si128(_mm_andnot_si128(nan, rounded), _mm_and_si128(nan, quieted)));
        }
    }
#endif
#if MHA_SIMD_ARM
    if constexpr (std::is_same_v<Arch, arch_neon>) {
        const uint32x4_t lsb = vdupq_n_u32(1), bias = vdupq_n_u32(0x7fff), high = vdupq_n_u32(0xffff0000u);
        const uint32x4_t magnitude = vdupq_n_u32(0x7fffffff), inf = vdupq_n_u32(0x7f800000), quiet = vdupq_n_u32(0x00400000);
        for (; i + 4 <= n; i += 4) {
            const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
            const uint32x4_t rounded = vandq_u32(vaddq_u32(u, vaddq_u32(bias, vandq_u32(vshrq_n_u32(u, 16), lsb))), high);
            const uint32x4_t nan = vcgtq_u32(vandq_u32(u, magnitude), inf);
            vst1q_f32(x + i, vreinterpretq_f32_u32(vbslq_u32(nan, vandq_u32(vorrq_u32(u, quiet), high), rounded)));
        }
    }
#endif
    for (; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, x + i, 4);
        u = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        std::memcpy(x + i, &u, 4);
    }
}

}  // namespace mha::simd
