// P·V of an int8 cache on integer dot products (vpdpwssd, AVX512_VNNI): included by decode_impl.hpp; defined in the
// AVX-512 TU only, and run where simd::int8_values_on_dot_products(d) holds (decode.hpp).
//   o[m, c] += Σ_j p[m, j]·s_j,b·v[j, c]   (b = c / 32; v the rows' int8 values, s_j,b their float16 block scales)
// Keys in groups that end at the multiples of kPvGroup of their absolute position (v.origin + j) and at n, so a
// group never spans a block of a paged cache (blocks are multiples of kPvGroup rows) and the groups of a key range
// are the same whatever its rows' placement or the calls around it. Per group, query row m and block b:
//   P'_j = fl(p[m, j]·s_j,b); a = max(max_j |P'_j|, 2^-64); r = fl(32767 / a); t = fl(a / 32767);
//   u_j = nearest even of fl(P'_j·r) (|u_j| <= 32767, an int16);
//   o[m, c] = fma(float(Σ_j u_j·v[j, c]), t, o[m, c])   (the integer sum exact: |Σ| < 2^31), groups in order;
//   a non-finite P'_j makes its group's t NaN (o NaN in the block's columns).
// Each P' is rounded to 15 bits of its group's largest: |u_j·t − P'_j| <= (1/2 + 2^-7)·t (the product P'·r and
// the rounding of r add about 0.0061·t to the rounding's half: docs/kv-quantization.md).
// Preconditions: d a multiple of 32, at most kPvMaxCols.
#pragma once
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>

namespace mha::simd::decode_detail {

inline constexpr std::size_t kPvGroup = 64;
// The group's block scales: [block][kPvScaleStride] floats (chunk_block_scales writes the lanes past a run up to
// a multiple of 16).
inline constexpr std::size_t kPvScaleStride = kPvGroup + 16;

// The int8 P·V on dot products: declared in every ISA TU, defined (and called) in the AVX-512 TU only.
template <class Arch>
void accumulate_int8_dot(ConstMatrix p, const BlockedRows<qint8>& v, Matrix o, const RowStream<Arch>& stream) noexcept;

#if defined(__AVX512F__)
#define MHA_INT8_PV_TARGET __attribute__((target("avx512vnni")))

// A group's P quantized for up to 4 query rows: u [block][row][kPvGroup] int16 in the order of vpackssdw (per 32
// keys and 128-bit lane l: keys 4l .. 4l + 3, then 16 + 4l .. 16 + 4l + 3; zero past the group's last key, for the
// odd pair), t [block][row].
struct PvGroupP {
    alignas(64) std::int16_t u[kPvMaxCols / 32][4][kPvGroup];
    alignas(64) float t[kPvMaxCols / 32][4];
};

// Where keys k, k + 1 (k even) sit in a row of PvGroupP::u. (Helpers here are templates on Arch, as in
// decode_impl.hpp: no weak symbol compiled with AVX-512 flags for another ISA's path to link to.)
template <class Arch>
inline std::size_t pair_at(std::size_t k) noexcept {
    const std::size_t w = k % 32;
    return k - w + (w % 16) / 4 * 8 + (w >= 16 ? 4 : 0) + w % 4;
}

// Lane k of the result: the largest of x[k]'s 16 lanes (signed 32-bit), for 16 vectors.
template <class Arch>
MHA_INT8_PV_TARGET inline __m512i lane_maxima(__m512i* x) noexcept {
    __m512i y[8], z[4];
    for (std::size_t i = 0; i < 8; ++i)  // per 128-bit lane: x[2i]'s and x[2i + 1]'s pairs interleaved
        y[i] = _mm512_max_epi32(_mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]), _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]));
    for (std::size_t i = 0; i < 4; ++i)  // per 128-bit lane: x[4i] .. x[4i + 3], each over that lane
        z[i] = _mm512_max_epi32(_mm512_unpacklo_epi64(y[2 * i], y[2 * i + 1]), _mm512_unpackhi_epi64(y[2 * i], y[2 * i + 1]));
    const __m512i e = _mm512_max_epi32(_mm512_shuffle_i32x4(z[0], z[1], 0x88), _mm512_shuffle_i32x4(z[0], z[1], 0xdd));
    const __m512i f = _mm512_max_epi32(_mm512_shuffle_i32x4(z[2], z[3], 0x88), _mm512_shuffle_i32x4(z[2], z[3], 0xdd));
    return _mm512_max_epi32(_mm512_shuffle_i32x4(e, f, 0x88), _mm512_shuffle_i32x4(e, f, 0xdd));
}

// u and t of query rows [m0, m0 + mr) for keys [j0, j0 + g) (g <= kPvGroup), from the group's block scales
// s [block][kPvScaleStride] (float; past g not read). First every (block, row)'s largest |P'| (as bits, where
// NaN and ±inf lie above every finite value), 16 at a time; then u.
template <class Arch>
MHA_INT8_PV_TARGET inline void quantize_group_p(ConstMatrix p, std::size_t m0, std::size_t mr, std::size_t j0, std::size_t g,
                                                std::size_t nb, const float* s, PvGroupP& z) noexcept {
    constexpr std::size_t V = kPvGroup / 16;
    __mmask16 mask[V];
    for (std::size_t v = 0; v < V; ++v) {
        const std::size_t lo = 16 * v;
        mask[v] = g >= lo + 16 ? __mmask16(0xffff) : g > lo ? static_cast<__mmask16>((1u << (g - lo)) - 1u) : __mmask16(0);
    }
    const float* pm = p.data + m0 * p.stride + j0;
    auto products = [&](std::size_t i, std::size_t b, __m512* x) MHA_GEMM_INLINE {
        for (std::size_t v = 0; v < V; ++v)
            x[v] = _mm512_maskz_mul_ps(mask[v], _mm512_maskz_loadu_ps(mask[v], pm + i * p.stride + 16 * v),
                                       _mm512_load_ps(s + b * kPvScaleStride + 16 * v));
    };
    const std::size_t pairs = nb * mr;  // (b, i) at b·mr + i
    alignas(64) float r[kPvMaxCols / 32 * 4];
    alignas(64) float t[kPvMaxCols / 32 * 4];
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    for (std::size_t q0 = 0; q0 < pairs; q0 += 16) {
        __m512i lanes[16];
        for (std::size_t q = 0; q < 16; ++q) {
            lanes[q] = _mm512_setzero_si512();
            if (q0 + q >= pairs) continue;
            __m512 x[V];
            products((q0 + q) % mr, (q0 + q) / mr, x);
            for (std::size_t v = 0; v < V; ++v) lanes[q] = _mm512_max_epi32(lanes[q], _mm512_and_si512(_mm512_castps_si512(x[v]), magnitude));
        }
        const __m512i top = lane_maxima<Arch>(lanes);
        const __mmask16 bad = _mm512_cmpge_epi32_mask(top, _mm512_set1_epi32(0x7f800000));
        const __m512 a = _mm512_max_ps(_mm512_castsi512_ps(top), _mm512_set1_ps(0x1p-64f));
        _mm512_store_ps(r + q0, _mm512_div_ps(_mm512_set1_ps(32767.0f), a));
        _mm512_store_ps(t + q0, _mm512_mask_mov_ps(_mm512_div_ps(a, _mm512_set1_ps(32767.0f)), bad,
                                                   _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN())));
    }
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t i = 0; i < mr; ++i) {
            __m512 x[V];
            products(i, b, x);
            const __m512 rq = _mm512_set1_ps(r[b * mr + i]);
            z.t[b][i] = t[b * mr + i];
            // cvtps2dq rounds to nearest even (MXCSR default); a non-finite P' gives garbage the NaN t discards.
            for (std::size_t v = 0; v < V; v += 2)
                _mm512_store_si512(&z.u[b][i][16 * v], _mm512_packs_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x[v], rq)),
                                                                         _mm512_cvtps_epi32(_mm512_mul_ps(x[v + 1], rq))));
        }
}

// acc + the dot products of a's and b's 16-bit pairs (vpdpwssd), in place: with the intrinsic, GCC 12 copied each of
// the 16 accumulators out and back around every instruction of the pairs' loop.
template <class Arch>
MHA_INT8_PV_TARGET inline __attribute__((always_inline)) void dot_pairs_into(__m512i& acc, __m512i a, __m512i b) noexcept {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// o[m0 + i, c0 + c] for i < MR, c < 32·NB (NB blocks of 32 columns) += the group's rows through u, t.
// rows[k]: row k of the group (k < g, and rows[g] = rows[g − 1] when g is odd, its u zero).
template <class Arch, std::size_t MR, std::size_t NB>
MHA_INT8_PV_TARGET __attribute__((noinline, aligned(64))) void pv_group_tile(const unsigned char* const* rows, std::size_t g,
                                                                           const PvGroupP& z, std::size_t c0, float* o,
                                                                           std::size_t ldo, const RowStream<Arch>* stream,
                                                                           std::size_t ahead_first, std::size_t ahead_rows) noexcept {
    constexpr std::size_t NA = 2 * NB;  // accumulators per row: two per block (the unpack's low and high halves)
    __m512i acc[MR][NA];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (std::size_t a = 0; a < NA; ++a) acc[i][a] = _mm512_setzero_si512();
    const std::size_t b0 = c0 / 32;
    for (std::size_t k0 = 0; k0 < g; k0 += 16) {
        const std::size_t k1 = min_size(k0 + 16, g);
        // This tile's share of the group's read-ahead, spread over its keys 16 at a time (not in the pairs' loop:
        // there its branch and divisions made GCC copy the accumulators each pair and spill two of them).
        if (stream != nullptr)
            read_ahead<Arch>(*stream, ahead_first + k0 * ahead_rows / g, ahead_first + k1 * ahead_rows / g);
        for (std::size_t k = k0; k < k1; k += 2) {
            const std::size_t at = pair_at<Arch>(k);
            const unsigned char* ra = rows[k] + c0;
            const unsigned char* rb = rows[k + 1] + c0;
            __m512i x[NA];
#pragma GCC unroll 2
            for (std::size_t b = 0; b < NB; ++b) {
                const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + 32 * b));
                const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 32 * b));
                // Per 128-bit lane, the two keys' bytes interleaved: columns 0..7 and 16..23 (lo), 8..15 and
                // 24..31 (hi).
                x[2 * b] = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(va, vb));
                x[2 * b + 1] = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(va, vb));
            }
#pragma GCC unroll 4
            for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 2
                for (std::size_t b = 0; b < NB; ++b) {
                    std::int32_t two;
                    std::memcpy(&two, &z.u[b0 + b][i][at], 4);
                    const __m512i pair = _mm512_set1_epi32(two);
                    dot_pairs_into<Arch>(acc[i][2 * b], x[2 * b], pair);
                    dot_pairs_into<Arch>(acc[i][2 * b + 1], x[2 * b + 1], pair);
                }
        }
    }
    // Back to column order: lo holds columns 0..7 and 16..23, hi 8..15 and 24..31.
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (std::size_t b = 0; b < NB; ++b) {
            const __m512 t = _mm512_set1_ps(z.t[b0 + b][i]);
            float* oi = o + i * ldo + c0 + 32 * b;
            const __m512i lo = _mm512_permutex2var_epi32(acc[i][2 * b], first, acc[i][2 * b + 1]);
            const __m512i hi = _mm512_permutex2var_epi32(acc[i][2 * b], second, acc[i][2 * b + 1]);
            _mm512_storeu_ps(oi, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), t, _mm512_loadu_ps(oi)));
            _mm512_storeu_ps(oi + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), t, _mm512_loadu_ps(oi + 16)));
        }
}

template <class Arch>
MHA_INT8_PV_TARGET __attribute__((noinline)) void accumulate_int8_dot_impl(ConstMatrix p, const BlockedRows<qint8>& v, Matrix o,
                                                                            const RowStream<Arch>& stream) noexcept {
    const std::size_t M = o.rows, n = v.rows, d = o.cols, nb = d / 32;
    PvGroupP z;
    alignas(64) float s[kPvMaxCols / 32 * kPvScaleStride];
    const unsigned char* rows[kPvGroup + 1];
    for (std::size_t j0 = 0, g = 0; j0 < n; j0 += g) {
        g = min_size(n - j0, kPvGroup - (v.origin + j0) % kPvGroup);
        // The group's rows and block scales (block-major), run by run (a group of 64 keys spans blocks of 16 or 32).
        rows_by_run<Arch>(v, j0, g, rows, [&](std::size_t k, std::size_t e, const qint8* first) {
            chunk_block_scales(Arch{}, first, v.stride, e - k, d, 0, nb, s + k, kPvScaleStride);
        });
        rows[g] = rows[g - 1];
        pv_tiles<Arch>(
            M, d, j0, g, stream, [&](std::size_t m0, std::size_t mr) { quantize_group_p<Arch>(p, m0, mr, j0, g, nb, s, z); },
            [&](auto MR, std::size_t blocks, std::size_t m0, std::size_t c, const RowStream<Arch>* rs, std::size_t af,
                std::size_t ahead_rows) {
                float* om = o.data + m0 * o.stride;
                if (blocks == 2)
                    pv_group_tile<Arch, decltype(MR)::value, 2>(rows, g, z, c, om, o.stride, rs, af, ahead_rows);
                else
                    pv_group_tile<Arch, decltype(MR)::value, 1>(rows, g, z, c, om, o.stride, rs, af, ahead_rows);
            });
    }
}

template <class Arch>
void accumulate_int8_dot(ConstMatrix p, const BlockedRows<qint8>& v, Matrix o, const RowStream<Arch>& stream) noexcept {
    accumulate_int8_dot_impl<Arch>(p, v, o, stream);
}
#undef MHA_INT8_PV_TARGET
#endif

}  // namespace mha::simd::decode_detail
