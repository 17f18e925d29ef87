// The decode scores of an int8 cache on integer dot products (vpdpbusd, AVX512_VNNI): included by decode_impl.hpp;
// defined in the AVX-512 TU only, and run where simd::int8_scores_on_dot_products(M, d) holds (decode.hpp).
//   Q: each row quantized per block of 32 with an fp32 scale s = amax / 127 (not a cache row's float16 scale,
//      whose subnormal steps would lose most of a small block's precision): q = nearest even of x / s (fp32), within
//      ±127; a block holding NaN or ±inf: s NaN and values 0; amax 0: values 0.
//   Per key j and block b the exact integer I_b = Σ_{c in b} q_c·k_c (|I_b| < 2^19), then
//      acc = fma(float(I_b), fl(s_k,b·s_q,b), acc) over b in order from acc = 0, and s = fl(scale·acc).
//   Lanes over keys: 16 keys' rows are loaded, their bytes read as unsigned (xor 0x80: k + 128), and transposed as
//   32-bit words, so that lane l of word i holds key l's columns 4i .. 4i + 3; vpdpbusd against Q's word i
//   broadcast, from −128·(Q's block summed), sums each block of each key exactly, with no reduction across lanes.
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

// Q quantized for the dot products: per row, its bytes, and per block of 32 columns its start and s_q.
struct DotQueries {
    alignas(64) std::int8_t bytes[kDotMaxQueryValues];
    std::int32_t block_start[kDotMaxQueryValues / 32];  // per row and block of 32: −128·Σ of its bytes
    float block_scale[kDotMaxQueryValues / 32];         // per row and block: s_q
};

// Columns [c0, c0 + 64) of query row x into z at offset o (bytes at o, blocks at o / 32).
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
    // 128·Σ of each lane's 4 bytes (vpdpbusd of the bytes against 128, unsigned), then per block of 8 lanes, negated.
    const __m512i sum128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), qv);
    z.block_start[o / 32] = -_mm512_mask_reduce_add_epi32(0x00ff, sum128);
    z.block_start[o / 32 + 1] = -_mm512_mask_reduce_add_epi32(0xff00, sum128);
    z.block_scale[o / 32] = block_scale[0];
    z.block_scale[o / 32 + 1] = block_scale[1];
}

// 16 words of 16 lanes transposed in place: lane l of x[i] becomes lane i of x[l]. (Helpers here are templates on
// Arch, as in decode_impl.hpp: no weak symbol compiled with AVX-512 flags for another ISA's path to link to.)
template <class Arch>
MHA_INT8_DOT_TARGET inline void transpose_words(__m512i* x) noexcept {
    __m512i y[16];
    for (std::size_t i = 0; i < 16; i += 2) {
        y[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
        y[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    for (std::size_t i = 0; i < 16; i += 4) {
        x[i] = _mm512_unpacklo_epi64(y[i], y[i + 2]);
        x[i + 1] = _mm512_unpackhi_epi64(y[i], y[i + 2]);
        x[i + 2] = _mm512_unpacklo_epi64(y[i + 1], y[i + 3]);
        x[i + 3] = _mm512_unpackhi_epi64(y[i + 1], y[i + 3]);
    }
    // x[4a + r] now holds, in 128-bit lane L, word 4L + r of rows 4a .. 4a + 3.
    for (std::size_t i = 0; i < 4; ++i) {
        y[i] = _mm512_shuffle_i32x4(x[i], x[4 + i], 0x88);
        y[4 + i] = _mm512_shuffle_i32x4(x[i], x[4 + i], 0xdd);
        y[8 + i] = _mm512_shuffle_i32x4(x[8 + i], x[12 + i], 0x88);
        y[12 + i] = _mm512_shuffle_i32x4(x[8 + i], x[12 + i], 0xdd);
    }
    for (std::size_t i = 0; i < 4; ++i) {
        x[i] = _mm512_shuffle_i32x4(y[i], y[8 + i], 0x88);
        x[8 + i] = _mm512_shuffle_i32x4(y[i], y[8 + i], 0xdd);
        x[4 + i] = _mm512_shuffle_i32x4(y[4 + i], y[12 + i], 0x88);
        x[12 + i] = _mm512_shuffle_i32x4(y[4 + i], y[12 + i], 0xdd);
    }
}

// The keys' block scales: [block][kDotScaleStride] floats, lane l key l (chunk_block_scales writes the lanes past a
// run up to a multiple of 16).
inline constexpr std::size_t kDotScaleStride = 32;

// Scores of all M query rows against keys [j, j + kr) (kr <= 16; rows[l] for l < 16, repeating the last key past
// kr; ks their block scales), into s's columns j .. (only the kr stored). acc: M·16 floats of workspace.
template <class Arch>
MHA_INT8_DOT_TARGET __attribute__((noinline, aligned(64))) void int8_dot_keys(const DotQueries& z, std::size_t M, std::size_t d,
                                                                             const unsigned char* const* rows, const float* ks,
                                                                             std::size_t kr, float scale, float* sj,
                                                                             std::size_t lds, float* acc) noexcept {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (std::size_t c = 0; c < d; c += 64) {
        __m512i w[16];
#pragma GCC unroll 16
        for (std::size_t l = 0; l < 16; ++l) w[l] = _mm512_xor_si512(_mm512_loadu_si512(rows[l] + c), flip);
        transpose_words<Arch>(w);
        const std::size_t b = c / 32;
        const __m512 k0 = _mm512_load_ps(ks + kDotScaleStride * b), k1 = _mm512_load_ps(ks + kDotScaleStride * (b + 1));
        for (std::size_t m = 0; m < M; ++m) {
            const std::int8_t* qm = z.bytes + m * d + c;
            auto word = [qm](std::size_t i) MHA_GEMM_INLINE {  // Q's bytes 4i .. 4i + 3 of the chunk, broadcast
                std::int32_t x;
                std::memcpy(&x, qm + 4 * i, 4);
                return _mm512_set1_epi32(x);
            };
            __m512i a0 = _mm512_set1_epi32(z.block_start[m * (d / 32) + b]);
            __m512i a1 = _mm512_set1_epi32(z.block_start[m * (d / 32) + b + 1]);
#pragma GCC unroll 8
            for (std::size_t i = 0; i < 8; ++i) {
                a0 = _mm512_dpbusd_epi32(a0, w[i], word(i));
                a1 = _mm512_dpbusd_epi32(a1, w[8 + i], word(8 + i));
            }
            const float* qs = z.block_scale + m * (d / 32) + b;
            float* am = acc + 16 * m;
            __m512 f = c == 0 ? _mm512_setzero_ps() : _mm512_load_ps(am);
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(k0, _mm512_set1_ps(qs[0])), f);
            f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(k1, _mm512_set1_ps(qs[1])), f);
            _mm512_store_ps(am, f);
        }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << kr) - 1u);
    const __m512 sc = _mm512_set1_ps(scale);
    for (std::size_t m = 0; m < M; ++m) _mm512_mask_storeu_ps(sj + m * lds, keep, _mm512_mul_ps(sc, _mm512_load_ps(acc + 16 * m)));
}

// Q quantized, then the keys 16 at a time (rows through the block table), read ahead through `stream`.
template <class Arch>
MHA_INT8_DOT_TARGET __attribute__((noinline)) void scores_int8_dot_impl(float scale, ConstMatrix q, const BlockedRows<qint8>& k,
                                                                         Matrix s, const RowStream<Arch>& stream) noexcept {
    const std::size_t M = q.rows, d = q.cols, n = k.rows, nb = d / 32;
    DotQueries z;
    for (std::size_t m = 0; m < M; ++m)
        for (std::size_t c = 0; c < d; c += 64) quantize_query_chunk<Arch>(q.data + m * q.stride + c, z, m * d + c);
    alignas(64) float acc[kDotMaxQueryValues / 64 * 16];
    alignas(64) float ks[kDotMaxQueryValues / 32 * kDotScaleStride];
    const unsigned char* rows[16];
    for (std::size_t j = 0, kr = 0; j < n; j += kr) {
        kr = min_size(16, n - j);
        rows_by_run<Arch>(k, j, kr, rows, [&](std::size_t l, std::size_t e, const qint8* first) {
            chunk_block_scales(Arch{}, first, k.stride, e - l, d, 0, nb, ks + l, kDotScaleStride);
        });
        // The lanes past the last key repeat it (stored, never read; chunk_block_scales repeats its scales there).
        for (std::size_t l = kr; l < 16; ++l) rows[l] = rows[kr - 1];
        read_ahead<Arch>(stream, j + stream.distance, j + stream.distance + kr);
        int8_dot_keys<Arch>(z, M, d, rows, ks, kr, scale, s.data + j, s.stride, acc);
    }
}

template <class Arch>
void scores_int8_dot(float scale, ConstMatrix q, const BlockedRows<qint8>& k, Matrix s, const RowStream<Arch>& stream) noexcept {
    scores_int8_dot_impl<Arch>(scale, q, k, s, stream);
}
#undef MHA_INT8_DOT_TARGET
#endif

}  // namespace mha::simd::decode_detail
