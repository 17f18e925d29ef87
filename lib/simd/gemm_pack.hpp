// GEMM packing: copies a block of op(A) or op(B) into the layout the microkernel reads, so that
// transposes and strides are handled here: the microkernel always sees B as rows of NR floats and
// A either as packed MR-float columns or in place as rows.
//   pack_a_panel: rows [0, m) × k-range [0, kc) of op(A) = Aᵀ → dst[p·MR + i] (m <= MR)
//   pack_b_panel: k-range [0, kc) × columns [0, n) of op(B) → dst[p·NR + j] (n <= NR), columns
//                 n..NR-1 zero so the microkernel can load whole vectors.
// src points at element (0, 0) of the block of op(X); ld is the stored matrix's row stride; trans says
// whether X is stored transposed (op(X)(r, c) = src[c·ld + r]). dst is 64-byte aligned (pack_b_panel)
// and does not overlap src.
#pragma once
#include <cstddef>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "isa_table.hpp"
#if MHA_SIMD_X86
#include <immintrin.h>
#endif

#include "dispatch.hpp"

namespace mha::simd {

// op(A) = Aᵀ with A stored [K, M]: each k is m contiguous floats, dst[p·MR + i] = src[p·ld + i].
// (op(A) = A is read in place by the microkernel and never packed.)
template <class Arch, std::size_t MR>
void pack_a_panel(std::size_t m, std::size_t kc, const float* src, std::size_t ld, float* dst) noexcept {
    for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t i = 0; i < m; ++i) dst[p * MR + i] = src[p * ld + i];
}

// dst[r·ldd + c] = src[c·lds + r] for r, c < W (W = the Arch's float lanes): one W×W block
// transposed in registers (W loads, W stores, about W·log2(W) shuffles).
template <class Arch>
inline void transpose_block(const float* src, std::size_t lds, float* dst, std::size_t ldd) noexcept {
#if MHA_SIMD_X86
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
        // Within 128-bit lanes: after these two steps r[4g + q] lane L holds column 4L + q of rows 4g..4g+3.
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int g = 0; g < 16; g += 4) {
            r[g] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        // Across lanes: gather lane L of the four row groups into column 4L + q.
        for (int q = 0; q < 4; ++q) {
            t[q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);       // lanes 0, 2 of rows 0-7
            t[4 + q] = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);   // lanes 1, 3 of rows 0-7
            t[8 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
            t[12 + q] = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
        }
        for (int q = 0; q < 4; ++q) {
            _mm512_storeu_ps(dst + q * ldd, _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88));              // lane 0
            _mm512_storeu_ps(dst + (4 + q) * ldd, _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0x88));   // lane 1
            _mm512_storeu_ps(dst + (8 + q) * ldd, _mm512_shuffle_f32x4(t[q], t[8 + q], 0xdd));        // lane 2
            _mm512_storeu_ps(dst + (12 + q) * ldd, _mm512_shuffle_f32x4(t[4 + q], t[12 + q], 0xdd));  // lane 3
        }
    } else if constexpr (std::is_same_v<Arch, arch_avx2>) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int g = 0; g < 8; g += 4) {
            r[g] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int q = 0; q < 4; ++q) {
            _mm256_storeu_ps(dst + q * ldd, _mm256_permute2f128_ps(r[q], r[4 + q], 0x20));
            _mm256_storeu_ps(dst + (4 + q) * ldd, _mm256_permute2f128_ps(r[q], r[4 + q], 0x31));
        }
    } else {
        __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds), r2 = _mm_loadu_ps(src + 2 * lds),
               r3 = _mm_loadu_ps(src + 3 * lds);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        _mm_storeu_ps(dst, r0);
        _mm_storeu_ps(dst + ldd, r1);
        _mm_storeu_ps(dst + 2 * ldd, r2);
        _mm_storeu_ps(dst + 3 * ldd, r3);
    }
#else
    // A generic arch (not x86): element by element.
    constexpr std::size_t W = xsimd::batch<float, Arch>::size;
    for (std::size_t r = 0; r < W; ++r)
        for (std::size_t c = 0; c < W; ++c) dst[r * ldd + c] = src[c * lds + r];
#endif
}

template <class Arch, std::size_t NR>
void pack_b_panel(std::size_t n, std::size_t kc, const float* src, std::size_t ld, bool trans,
                  float* dst) noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t W = batch::size;
    if (!trans) {  // rows of op(B) are contiguous: copy n floats per k, zero the rest
        for (std::size_t p = 0; p < kc; ++p) {
            const float* row = src + p * ld;
            float* out = dst + p * NR;
            std::size_t j = 0;
            if (n == NR)
                for (; j < NR; j += W) batch::load_unaligned(row + j).store_aligned(out + j);
            for (; j < n; ++j) out[j] = row[j];
            for (; j < NR; ++j) out[j] = 0.0f;
        }
        return;
    }
    // op(B)(p, j) = src[j·ld + p]: W×W blocks transposed in registers, then the ragged edges.
    const std::size_t n_full = n / W * W, k_full = kc / W * W;
    for (std::size_t j = 0; j < n_full; j += W)
        for (std::size_t p = 0; p < k_full; p += W) transpose_block<Arch>(src + j * ld + p, ld, dst + p * NR + j, NR);
    for (std::size_t j = 0; j < n_full; ++j)
        for (std::size_t p = k_full; p < kc; ++p) dst[p * NR + j] = src[j * ld + p];
    for (std::size_t j = n_full; j < n; ++j)
        for (std::size_t p = 0; p < kc; ++p) dst[p * NR + j] = src[j * ld + p];
    for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t j = n; j < NR; ++j) dst[p * NR + j] = 0.0f;
}

}  // namespace mha::simd
