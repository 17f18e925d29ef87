// The decode scores of an int8 cache on integer dot products (vpdpbusd, AVX512_VNNI): included by decode_impl.hpp;
// defined in the AVX-512 TU only, and run where simd::int8_scores_on_dot_products(M, d) holds (decode.hpp).
//   Q: each row quantized per block of 32 with an fp32 scale s = amax / 127 (not a cache row's float16 scale,
//      whose subnormal steps would lose most of a small block's precision): q = nearest even of x / s (fp32), within
//      ±127; a block holding NaN or ±inf: s NaN and values 0; amax 0: values 0.
//   K: the cache's bytes read as unsigned (xor 0x80: k + 128), so that vpdpbusd multiplies them by Q's signed
//      bytes; each 32-bit lane starts at −128·(its 4 query bytes summed) and so ends at the exact Σ q·k of its 4
//      columns (|Σ| < 2^17).
//   Lane l of 64-column chunk c (columns 64c + 4l .. + 3, in block b): acc_l = fma(float(dot), s_k,b·s_q,b, acc_l)
//      (s_k,b·s_q,b one fp32 product), chunks in order; then s = scale·(the lane tree of reduce_store).
// Preconditions: d a multiple of 64, M·d <= kDotMaxQueryValues (int8_scores_on_dot_products).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mha::simd::decode_detail {

// The int8 dot-product scores: declared in every ISA TU, defined (and called) in the AVX-512 TU only.
template <class Arch>
void scores_int8_dot(float scale, ConstMatrix q, const BlockedRows<qint8>& k, Matrix s, const RowStream<Arch>& stream) noexcept;

#if defined(__AVX512F__)
#define MHA_INT8_DOT_TARGET __attribute__((target("avx512vnni")))

// Q quantized for the dot products: per row and 64-column chunk, the bytes, each lane's start and each lane's s_q.
struct DotQueries {
    alignas(64) std::int8_t bytes[kDotMaxQueryValues];
    alignas(64) std::int32_t start[kDotMaxQueryValues / 4];
    alignas(64) float scale[kDotMaxQueryValues / 4];
};

// Columns [c0, c0 + 64) of query row x into z at offset o (bytes at o, lanes at o / 4).
template <class Arch>
MHA_INT8_DOT_TARGET inline void quantize_query_chunk(const float* x, DotQueries& z, std::size_t o) noexcept {
    alignas(64) std::int8_t bytes[64];
    float block_scale[2];
    for (std::size_t b = 0; b < 2; ++b) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        // Not finite: NaN or ±inf in either vector (fpclass: QNaN, +inf, -inf, SNaN).
        const bool finite = (_mm512_fpclass_ps_mask(v0, 0x99) | _mm512_fpclass_ps_mask(v1, 0x99)) == 0;
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float step = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        block_scale[b] = step;
        __m128i packed[2] = {_mm_setzero_si128(), _mm_setzero_si128()};
        if (finite && step > 0.0f) {
            const __m512 lim = _mm512_set1_ps(127.0f), s = _mm512_set1_ps(step);
            const __m512 v[2] = {v0, v1};
            for (std::size_t h = 0; h < 2; ++h) {
                const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(v[h], s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                packed[h] = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(r, lim), -lim)));
            }
        }
        _mm_store_si128(reinterpret_cast<__m128i*>(bytes + 32 * b), packed[0]);
        _mm_store_si128(reinterpret_cast<__m128i*>(bytes + 32 * b + 16), packed[1]);
    }
    const __m512i qv = _mm512_load_si512(bytes);
    _mm512_store_si512(z.bytes + o, qv);
    // −128·Σ of each lane's 4 bytes: vpdpbusd of the bytes against 128 (unsigned), negated.
    const __m512i sum128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), qv);
    _mm512_store_si512(z.start + o / 4, _mm512_sub_epi32(_mm512_setzero_si512(), sum128));
    _mm256_store_ps(z.scale + o / 4, _mm256_set1_ps(block_scale[0]));
    _mm256_store_ps(z.scale + o / 4 + 8, _mm256_set1_ps(block_scale[1]));
}

// Scores of query rows [m0, m0 + MR) against all of k's rows, in tiles of 4 keys (a tile lies within one run; a
// short tile repeats its first row, whose scores are not stored), reading ahead through `stream` when `read`.
template <class Arch, std::size_t MR>
MHA_INT8_DOT_TARGET __attribute__((noinline, aligned(64))) void int8_dot_rows(const DotQueries& z, std::size_t m0,
                                                                             const BlockedRows<qint8>& k, float scale, Matrix s,
                                                                             const RowStream<Arch>& stream, bool read) noexcept {
    // Plain loops, unrolled by pragma: a lambda would not carry the function's target (GCC).
    using B = batch<Arch>;
    const std::size_t n = k.rows, d = k.cols;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m256i pick = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (std::size_t j = 0, kr = 0; j < n; j += kr) {
        kr = min_size(4, run_end<Arch>(k.blocks, n, j) - j);
        const unsigned char* first = reinterpret_cast<const unsigned char*>(row_of<Arch>(k, j));
        const std::size_t ld = kr > 1 ? k.stride : 0;
        if (read) read_ahead<Arch>(stream, j + stream.distance, j + stream.distance + kr);
        B acc[DecodeTiles<Arch>::QB][4];
#pragma GCC unroll 4
        for (std::size_t m = 0; m < DecodeTiles<Arch>::QB; ++m)
#pragma GCC unroll 4
            for (std::size_t t = 0; t < 4; ++t) acc[m][t] = B(0.0f);
        for (std::size_t c = 0; c < d; c += 64) {
            __m512i kv[4];
            __m512 ks[4];
#pragma GCC unroll 4
            for (std::size_t t = 0; t < 4; ++t) {
                const unsigned char* row = first + (t < kr ? t : 0) * ld;
                kv[t] = _mm512_xor_si512(_mm512_loadu_si512(row + c), flip);
                std::uint32_t two;  // the float16 scales of the chunk's two blocks
                std::memcpy(&two, row + d + c / 16, 4);
                ks[t] = _mm512_cvtph_ps(_mm256_permutexvar_epi16(pick, _mm256_set1_epi32(static_cast<int>(two))));
            }
#pragma GCC unroll 4
            for (std::size_t m = 0; m < MR; ++m) {
                const std::size_t o = (m0 + m) * d + c;
                const __m512i qv = _mm512_load_si512(z.bytes + o);
                const __m512i start = _mm512_load_si512(z.start + o / 4);
                const __m512 qs = _mm512_load_ps(z.scale + o / 4);
#pragma GCC unroll 4
                for (std::size_t t = 0; t < 4; ++t) {
                    const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, kv[t], qv));
                    acc[m][t] = B(_mm512_fmadd_ps(dot, _mm512_mul_ps(ks[t], qs), acc[m][t]));
                }
            }
        }
        float* sj = s.data + m0 * s.stride + j;
        switch (kr) {
            case 1: reduce_store<Arch, MR, 1>(acc, scale, sj, s.stride); break;
            case 2: reduce_store<Arch, MR, 2>(acc, scale, sj, s.stride); break;
            case 3: reduce_store<Arch, MR, 3>(acc, scale, sj, s.stride); break;
            default: reduce_store<Arch, MR, 4>(acc, scale, sj, s.stride); break;
        }
    }
}

// Q quantized, then its tiles of 4 rows over all the keys (the first reads them from memory, the others from cache).
template <class Arch>
MHA_INT8_DOT_TARGET __attribute__((noinline)) void scores_int8_dot_impl(float scale, ConstMatrix q, const BlockedRows<qint8>& k,
                                                                         Matrix s, const RowStream<Arch>& stream) noexcept {
    const std::size_t M = q.rows, d = q.cols;
    DotQueries z;
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t c = 0; c < d; c += 64) quantize_query_chunk<Arch>(q.data + m * q.stride + c, z, m * d + c);
    for (std::size_t m0 = 0; m0 < M; m0 += 4) {
        switch (min_size(4, M - m0)) {
            case 1: int8_dot_rows<Arch, 1>(z, m0, k, scale, s, stream, m0 == 0); break;
            case 2: int8_dot_rows<Arch, 2>(z, m0, k, scale, s, stream, m0 == 0); break;
            case 3: int8_dot_rows<Arch, 3>(z, m0, k, scale, s, stream, m0 == 0); break;
            default: int8_dot_rows<Arch, 4>(z, m0, k, scale, s, stream, m0 == 0); break;
        }
    }
}

template <class Arch>
void scores_int8_dot(float scale, ConstMatrix q, const BlockedRows<qint8>& k, Matrix s, const RowStream<Arch>& stream) noexcept {
    scores_int8_dot_impl<Arch>(scale, q, k, s, stream);
}
#undef MHA_INT8_DOT_TARGET
#endif

}  // namespace mha::simd::decode_detail
