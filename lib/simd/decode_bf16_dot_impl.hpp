// The decode kernels of bf16 compute on vdpbf16ps (AVX512_BF16): included by decode_impl.hpp; defined in the
// AVX-512 TU only, and run where simd::bf16_decode_on_dot_products(M, d) holds (decode.hpp).
// q and p are float rows, rounded to bf16 here (nearest even; bf16 compute hands them over rounded already, so
// this is exact there); the K / V rows are read in place: bf16; fp32, rounded to bf16 as they are loaded (exact
// for the rows bf16 compute stores); fp8 (e4m3, e5m2), whose every code is a bf16 value (NaN a NaN, ±inf ±inf),
// converted by a lookup in registers. Each product of two bf16 values is exact in fp32, and vdpbf16ps adds a
// lane's two products to its accumulator (inputs and results below 2^-126 read as zero; fp8's smallest values,
// 2^-9 and 2^-16, are far above).
//   scores: s[m, j] = scale·Σ_c q[m, c]·k[j, c] (fp8: times k_scale after). A register tile of up to 4 query rows
//     × 4 keys (16 accumulators) runs along d, 32 columns per vdpbf16ps: lane l of an accumulator takes the pairs
//     (c, c + 1), c ≡ 2l (mod 32), in order of c. Then the 16 lanes are added by the widened kernels' tree: per
//     128-bit block (l0 + l2) + (l1 + l3), then across blocks (b0 + b2) + (b1 + b3); times scale.
//   accumulate: o[m, c] += Σ_j p[m, j]·v[j, c], the rows in pairs at even absolute positions (v.origin + j; a row
//     whose partner lies outside [0, n) is paired with zeros): the pairs added to o in order of position, a pair's
//     two products by one vdpbf16ps. Lanes hold the columns permuted within each 32 (vpunpck{l,h}wd of two rows);
//     o is permuted into that order as a tile loads it and back as it stores. fp8: the pairs of a chunk (the
//     keys between multiples of 64 of the absolute position) are added from zero, and o += v_scale·that sum.
// Every result is bitwise the same for any M, any placement of the rows (blocks of a paged cache), any thread count,
// and (accumulate) any split of the rows into calls at even absolute positions (fp8: at multiples of 64).
// Preconditions: d a multiple of 32, d <= kBf16DotMaxCols, M <= kBf16DotMaxRows, M·d <= kDotMaxQueryValues.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mha::simd::decode_detail {

// The bf16 decode kernels on vdpbf16ps: declared in every ISA TU, defined (and called) in the AVX-512 TU only.
// kv_scale: fp8's tensor scale (k_scale, v_scale), 1 for the other element types.
template <class Arch, class E>
void scores_bf16_dot(float scale, ConstMatrix q, const BlockedRows<E>& k, Matrix s, const RowStream<Arch>& stream,
                     float kv_scale) noexcept;
template <class Arch, class E>
void accumulate_bf16_dot(ConstMatrix p, const BlockedRows<E>& v, Matrix o, const RowStream<Arch>& stream,
                         float kv_scale) noexcept;

template <class E>
inline constexpr bool kFp8Rows = std::is_same_v<E, fp8_e4m3> || std::is_same_v<E, fp8_e5m2>;

// Whether M query rows of d columns over rows of E run on these kernels (fp8 rows also need VBMI: decode.hpp).
template <class E>
inline bool runs_on_bf16_dot_products(std::size_t M, std::size_t d) noexcept {
    return kFp8Rows<E> ? fp8_decode_on_dot_products(M, d) : bf16_decode_on_dot_products(M, d);
}

// The bf16 bits of the fp8 code `magnitude` (0..127, the sign bit clear) of E: every finite code is a bf16
// value (3 or 2 mantissa bits; subnormals normalized), NaN codes give 0x7FC0 and e5m2's infinity 0x7F80.
template <class E>
constexpr std::uint16_t fp8_magnitude_bf16(unsigned magnitude) noexcept {
    constexpr unsigned mbits = std::is_same_v<E, fp8_e4m3> ? 3 : 2;
    constexpr int bias = std::is_same_v<E, fp8_e4m3> ? 7 : 15;
    constexpr unsigned emax = std::is_same_v<E, fp8_e4m3> ? 15 : 31;
    const unsigned e = magnitude >> mbits, m = magnitude & ((1u << mbits) - 1u);
    if constexpr (std::is_same_v<E, fp8_e4m3>) {
        if (e == emax && m == 7) return 0x7FC0;
    } else {
        if (e == emax) return m == 0 ? 0x7F80 : 0x7FC0;
    }
    if (e == 0) {  // m·2^(1 - bias - mbits), normalized
        if (m == 0) return 0;
        unsigned top = 0;
        while ((m >> (top + 1)) != 0) ++top;
        const int field = static_cast<int>(top) + 1 - bias - static_cast<int>(mbits) + 127;
        return static_cast<std::uint16_t>((static_cast<unsigned>(field) << 7) | ((m - (1u << top)) << (7 - top)));
    }
    const int field = static_cast<int>(e) - bias + 127;
    return static_cast<std::uint16_t>((static_cast<unsigned>(field) << 7) | (m << (7 - mbits)));
}

// fp8_magnitude_bf16 of the codes 0..127 as bytes: low[c] and high[c] its low and high byte (the operands of
// vpermi2b).
template <class E>
struct Fp8Bf16Bytes {
    alignas(64) std::uint8_t low[128];
    alignas(64) std::uint8_t high[128];
    constexpr Fp8Bf16Bytes() noexcept : low{}, high{} {
        for (unsigned c = 0; c < 128; ++c) {
            low[c] = static_cast<std::uint8_t>(fp8_magnitude_bf16<E>(c) & 0xFF);
            high[c] = static_cast<std::uint8_t>(fp8_magnitude_bf16<E>(c) >> 8);
        }
    }
};
template <class E>
inline constexpr Fp8Bf16Bytes<E> kFp8Bf16Bytes{};

#if defined(__AVX512F__)
#define MHA_BF16_DOT_TARGET __attribute__((target("avx512bf16")))

// x[0, n) rounded to bf16 (nearest even) into y[0, n); nothing past x[n) read or y[n) written.
template <class Arch>
MHA_BF16_DOT_TARGET inline void narrow_to_bf16(const float* x, std::size_t n, std::uint16_t* y) noexcept {
    for (std::size_t c = 0; c < n; c += 32) {
        const std::size_t r = n - c < 32 ? n - c : 32;
        const __mmask16 lo = r >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << r) - 1u);
        const __mmask16 hi = r >= 32 ? __mmask16(0xffff) : r > 16 ? static_cast<__mmask16>((1u << (r - 16)) - 1u) : __mmask16(0);
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + c + 16), _mm512_maskz_loadu_ps(lo, x + c));
        const __mmask32 keep = r >= 32 ? ~__mmask32(0) : (__mmask32(1) << r) - 1u;
        _mm512_mask_storeu_epi16(y + c, keep, (__m512i)h);
    }
}

template <class Arch>
MHA_BF16_DOT_TARGET inline __attribute__((always_inline)) __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) noexcept {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// 32 elements of a bf16 or fp32 K / V row at column c as bf16: bf16 rows loaded, fp32 rows rounded
// (vcvtne2ps2bf16; exact for the bf16 values that bf16 compute stores in an f32 cache, so both caches give the same
// bits). fp8 rows are converted by fp8_words.
template <class Arch, class E>
MHA_BF16_DOT_TARGET inline __attribute__((always_inline)) __m512i row32(const unsigned char* row, std::size_t c) noexcept {
    static_assert(std::is_same_v<E, bfloat16> || std::is_same_v<E, float>);
    if constexpr (std::is_same_v<E, bfloat16>) {
        return _mm512_loadu_si512(row + 2 * c);
    } else {
        const float* f = reinterpret_cast<const float*>(row) + c;
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(f + 16), _mm512_loadu_ps(f));
    }
}

// fp8 codes on AVX512_VBMI, 64 at a time (the fp8 kernels run only with it: decode_impl.hpp): each code's bf16 low
// and high byte by vpermi2b from 128-entry tables (the sign or'ed into the high byte), interleaved into words:
// `first` holds the words of bytes 0..7 of each 128-bit block of x, `second` those of bytes 8..15. 5 instructions
// per 64 codes.
#define MHA_FP8_DOT_TARGET __attribute__((target("avx512bf16,avx512vbmi")))
template <class E>
MHA_FP8_DOT_TARGET inline __attribute__((always_inline)) void fp8_words(__m512i x, __m512i& first, __m512i& second) noexcept {
    const Fp8Bf16Bytes<E>& t = kFp8Bf16Bytes<E>;
    const __m512i low = _mm512_permutex2var_epi8(_mm512_load_si512(t.low), x, _mm512_load_si512(t.low + 64));
    const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(_mm512_load_si512(t.high), x, _mm512_load_si512(t.high + 64)),
                                                   x, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // a | (b & c)
    first = _mm512_unpacklo_epi8(low, high);
    second = _mm512_unpackhi_epi8(low, high);
}

// Lane 4b + i of the result: (v_i[4b] + v_i[4b + 2]) + (v_i[4b + 1] + v_i[4b + 3]).
template <class Arch>
inline __attribute__((always_inline)) __m512 block_sums(__m512 v0, __m512 v1, __m512 v2, __m512 v3) noexcept {
    const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    return _mm512_add_ps(_mm512_shuffle_ps(t01, t23, 0x44), _mm512_shuffle_ps(t01, t23, 0xEE));
}

// The 16 sums of a 4 × 4 tile's accumulators (rows past QR: zeros), lane 4m + j holding row m and key j.
template <class Arch, std::size_t QR>
inline __attribute__((always_inline)) __m512 tile_sums(const __m512 (&acc)[QR][4]) noexcept {
    __m512 u[4];
#pragma GCC unroll 4
    for (std::size_t m = 0; m < 4; ++m) u[m] = m < QR ? block_sums<Arch>(acc[m][0], acc[m][1], acc[m][2], acc[m][3]) : _mm512_setzero_ps();
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

// s[m, j] = lane 4m + j of sums for m < QR, j < kr. Each row's 128-bit lane stored from the register (through a
// stack copy, the narrower reloads at other offsets missed store forwarding: a third of the tile's time).
template <class Arch, std::size_t QR>
inline __attribute__((always_inline)) void store_tile(__m512 sums, std::size_t kr, float* s, std::size_t lds) noexcept {
    const __mmask8 keep = static_cast<__mmask8>((1u << kr) - 1u);
    _mm_mask_storeu_ps(s, keep, _mm512_castps512_ps128(sums));
    if constexpr (QR > 1) _mm_mask_storeu_ps(s + lds, keep, _mm512_extractf32x4_ps(sums, 1));
    if constexpr (QR > 2) _mm_mask_storeu_ps(s + 2 * lds, keep, _mm512_extractf32x4_ps(sums, 2));
    if constexpr (QR > 3) _mm_mask_storeu_ps(s + 3 * lds, keep, _mm512_extractf32x4_ps(sums, 3));
}

// s[m, j] for m < QR, j < kr (<= 4) of query rows q (bf16, d apart) against keys rows[0..3] (past kr: repeats).
template <class Arch, class E, std::size_t QR>
MHA_BF16_DOT_TARGET __attribute__((noinline, aligned(64))) void bf16_dot_tile(const std::uint16_t* q, std::size_t d,
                                                                             const unsigned char* const* rows, std::size_t kr,
                                                                             float scale, float* s, std::size_t lds) noexcept {
    __m512 acc[QR][4];
#pragma GCC unroll 4
    for (std::size_t m = 0; m < QR; ++m)
#pragma GCC unroll 4
        for (std::size_t j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
    for (std::size_t c = 0; c < d; c += 32) {
        __m512i k[4];
#pragma GCC unroll 4
        for (std::size_t j = 0; j < 4; ++j) k[j] = row32<Arch, E>(rows[j], c);
#pragma GCC unroll 4
        for (std::size_t m = 0; m < QR; ++m) {
            const __m512i qv = _mm512_loadu_si512(q + m * d + c);
#pragma GCC unroll 4
            for (std::size_t j = 0; j < 4; ++j) acc[m][j] = dot_pairs<Arch>(acc[m][j], qv, k[j]);
        }
    }
    store_tile<Arch, QR>(_mm512_mul_ps(_mm512_set1_ps(scale), tile_sums<Arch, QR>(acc)), kr, s, lds);
}

// The fp8 scores tile: as bf16_dot_tile, along d in groups of 64 codes (a group of 32 at the end of d reads as 64
// with zeros), q in the order fp8_words gives the codes: per group, 32 values of `first` then 32 of `second`
// (fp8_query_order), dp apart.
template <class Arch, class E, std::size_t QR>
MHA_FP8_DOT_TARGET __attribute__((noinline, aligned(64))) void fp8_dot_tile(const std::uint16_t* q, std::size_t d, std::size_t dp,
                                                                           const unsigned char* const* rows, std::size_t kr,
                                                                           float scale, float kv_scale, float* s,
                                                                           std::size_t lds) noexcept {
    __m512 acc[QR][4];
#pragma GCC unroll 4
    for (std::size_t m = 0; m < QR; ++m)
#pragma GCC unroll 4
        for (std::size_t j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
    for (std::size_t c = 0; c < d; c += 64) {
        const __mmask64 keep = d - c >= 64 ? ~__mmask64(0) : (__mmask64(1) << (d - c)) - 1u;
        __m512i k0[4], k1[4];
#pragma GCC unroll 4
        for (std::size_t j = 0; j < 4; ++j) fp8_words<E>(_mm512_maskz_loadu_epi8(keep, rows[j] + c), k0[j], k1[j]);
#pragma GCC unroll 4
        for (std::size_t m = 0; m < QR; ++m) {
            const __m512i q0 = _mm512_load_si512(q + m * dp + c), q1 = _mm512_load_si512(q + m * dp + c + 32);
#pragma GCC unroll 4
            for (std::size_t j = 0; j < 4; ++j) acc[m][j] = dot_pairs<Arch>(dot_pairs<Arch>(acc[m][j], q0, k0[j]), q1, k1[j]);
        }
    }
    const __m512 sums = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(scale), tile_sums<Arch, QR>(acc)), _mm512_set1_ps(kv_scale));
    store_tile<Arch, QR>(sums, kr, s, lds);
}

// q's bf16 row of d values (a multiple of 32) into dp = d rounded up to 64, in fp8_words' order of the codes: per
// group of 64 columns, first columns 16k + i, then 16k + 8 + i (k < 4, i < 8); columns past d zero.
template <class Arch>
MHA_FP8_DOT_TARGET inline void fp8_query_order(const std::uint16_t* q, std::size_t d, std::uint16_t* y) noexcept {
    alignas(64) static constexpr std::uint16_t kFirst[32] = {0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
                                                             32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
    const __m512i first = _mm512_load_si512(kFirst), second = _mm512_add_epi16(first, _mm512_set1_epi16(8));
    for (std::size_t c = 0; c < d; c += 64) {
        const __m512i a = _mm512_loadu_si512(q + c), b = d - c >= 64 ? _mm512_loadu_si512(q + c + 32) : _mm512_setzero_si512();
        _mm512_store_si512(y + c, _mm512_permutex2var_epi16(a, first, b));
        _mm512_store_si512(y + c + 32, _mm512_permutex2var_epi16(a, second, b));
    }
}

// Q rounded to bf16, then the keys 16 at a time (rows through the block table, read ahead through `stream`), in
// tiles of 4 keys × up to 4 query rows.
template <class Arch, class E>
MHA_BF16_DOT_TARGET __attribute__((noinline)) void scores_bf16_dot_impl(float scale, ConstMatrix q, const BlockedRows<E>& k,
                                                                         Matrix s, const RowStream<Arch>& stream,
                                                                         float kv_scale) noexcept {
    const std::size_t M = q.rows, d = q.cols, n = k.rows;
    // fp8: rows of dp = d rounded up to 64 values in fp8_words' order (at most twice kDotMaxQueryValues, d >= 32).
    constexpr bool kFp8 = kFp8Rows<E>;
    alignas(64) std::uint16_t qb[kFp8 ? 2 * kDotMaxQueryValues : kDotMaxQueryValues];
    const std::size_t dp = kFp8 ? (d + 63) / 64 * 64 : d;
    for (std::size_t m = 0; m < M; ++m) {
        narrow_to_bf16<Arch>(q.data + m * q.stride, d, qb + m * dp);
        if constexpr (kFp8) fp8_query_order<Arch>(qb + m * dp, d, qb + m * dp);
    }
    const unsigned char* rows[16 + 3];
    for (std::size_t j = 0, kr = 0; j < n; j += kr) {
        kr = min_size(16, n - j);
        rows_by_run<Arch>(k, j, kr, rows, [](std::size_t, std::size_t, const E*) {});
        for (std::size_t l = kr; l < 16 + 3; ++l) rows[l] = rows[kr - 1];  // read, never stored
        read_ahead<Arch>(stream, j + stream.distance, j + stream.distance + kr);
        for (std::size_t t = 0; t < kr; t += 4) {
            const std::size_t tk = min_size(4, kr - t);
            for (std::size_t m = 0; m < M; m += 4) {
                float* st = s.data + m * s.stride + j + t;
                if constexpr (kFp8) {
                    switch (min_size(4, M - m)) {
                        case 1: fp8_dot_tile<Arch, E, 1>(qb + m * dp, d, dp, rows + t, tk, scale, kv_scale, st, s.stride); break;
                        case 2: fp8_dot_tile<Arch, E, 2>(qb + m * dp, d, dp, rows + t, tk, scale, kv_scale, st, s.stride); break;
                        case 3: fp8_dot_tile<Arch, E, 3>(qb + m * dp, d, dp, rows + t, tk, scale, kv_scale, st, s.stride); break;
                        default: fp8_dot_tile<Arch, E, 4>(qb + m * dp, d, dp, rows + t, tk, scale, kv_scale, st, s.stride); break;
                    }
                } else {
                    switch (min_size(4, M - m)) {
                        case 1: bf16_dot_tile<Arch, E, 1>(qb + m * d, d, rows + t, tk, scale, st, s.stride); break;
                        case 2: bf16_dot_tile<Arch, E, 2>(qb + m * d, d, rows + t, tk, scale, st, s.stride); break;
                        case 3: bf16_dot_tile<Arch, E, 3>(qb + m * d, d, rows + t, tk, scale, st, s.stride); break;
                        default: bf16_dot_tile<Arch, E, 4>(qb + m * d, d, rows + t, tk, scale, st, s.stride); break;
                    }
                }
            }
        }
    }
}

template <class Arch, class E>
void scores_bf16_dot(float scale, ConstMatrix q, const BlockedRows<E>& k, Matrix s, const RowStream<Arch>& stream,
                     float kv_scale) noexcept {
    scores_bf16_dot_impl<Arch, E>(scale, q, k, s, stream, kv_scale);
}

// Keys per accumulate chunk: chunks end at the multiples of kBf16Chunk of the absolute position (its P narrowed
// once, its rows stay in L1 for the query and column tiles).
inline constexpr std::size_t kBf16Chunk = 64;
// Entries of a chunk's P row: the chunk's keys, a leading zero where its first key has an odd position, a trailing
// zero where the count is odd.
inline constexpr std::size_t kBf16ChunkSlots = kBf16Chunk + 2;

// The 32 columns of a P·V tile's accumulator pair back in order: lane 4k + i of lo holds column 8k + i, of hi
// column 8k + 4 + i (k: the 128-bit block); first gets columns 0..15, second 16..31.
template <class Arch>
MHA_BF16_DOT_TARGET inline __attribute__((always_inline)) void columns_in_order(__m512 lo, __m512 hi, __m512& first,
                                                                               __m512& second) noexcept {
    first = _mm512_permutex2var_ps(lo, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), hi);
    second = _mm512_permutex2var_ps(lo, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), hi);
}

// o[m, c0 + c] for m < MR, c < 32·NB += the chunk's pairs: rows[0, e) (e even; zero rows where the chunk has none),
// pb[m·kBf16ChunkSlots + i]: P of entry i as bf16. Reads ahead rows [ahead_first, ahead_first + ahead_rows) of the
// stream, spread over the entries. bf16 and fp32 rows.
template <class Arch, class E, std::size_t MR, std::size_t NB>
MHA_BF16_DOT_TARGET __attribute__((noinline, aligned(64))) void bf16_pv_tile(const unsigned char* const* rows, std::size_t e,
                                                                            const std::uint16_t* pb, std::size_t c0, float* o,
                                                                            std::size_t ldo, const RowStream<Arch>* stream,
                                                                            std::size_t ahead_first, std::size_t ahead_rows) noexcept {
    // Lane 4k + i of `lo` holds column 8k + i of the 32, of `hi` column 8k + 4 + i (k: the 128-bit block).
    const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i to_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    __m512 lo[MR][NB], hi[MR][NB];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (std::size_t b = 0; b < NB; ++b) {
            const float* oi = o + i * ldo + c0 + 32 * b;
            const __m512 n0 = _mm512_loadu_ps(oi), n1 = _mm512_loadu_ps(oi + 16);
            lo[i][b] = _mm512_permutex2var_ps(n0, to_lo, n1);
            hi[i][b] = _mm512_permutex2var_ps(n0, to_hi, n1);
        }
    for (std::size_t k0 = 0; k0 < e; k0 += 16) {
        const std::size_t k1 = min_size(k0 + 16, e);
        if (stream != nullptr) read_ahead<Arch>(*stream, ahead_first + k0 * ahead_rows / e, ahead_first + k1 * ahead_rows / e);
        for (std::size_t k = k0; k < k1; k += 2) {
            __m512i vl[NB], vh[NB];
#pragma GCC unroll 2
            for (std::size_t b = 0; b < NB; ++b) {
                const __m512i a = row32<Arch, E>(rows[k], c0 + 32 * b), z = row32<Arch, E>(rows[k + 1], c0 + 32 * b);
                vl[b] = _mm512_unpacklo_epi16(a, z);
                vh[b] = _mm512_unpackhi_epi16(a, z);
            }
#pragma GCC unroll 4
            for (std::size_t i = 0; i < MR; ++i) {
                std::int32_t two;  // P of the pair's two rows (the first in the low half)
                std::memcpy(&two, pb + i * kBf16ChunkSlots + k, 4);
                const __m512i pair = _mm512_set1_epi32(two);
#pragma GCC unroll 2
                for (std::size_t b = 0; b < NB; ++b) {
                    lo[i][b] = dot_pairs<Arch>(lo[i][b], pair, vl[b]);
                    hi[i][b] = dot_pairs<Arch>(hi[i][b], pair, vh[b]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 2
        for (std::size_t b = 0; b < NB; ++b) {
            float* oi = o + i * ldo + c0 + 32 * b;
            __m512 r0, r1;
            columns_in_order<Arch>(lo[i][b], hi[i][b], r0, r1);
            _mm512_storeu_ps(oi, r0);
            _mm512_storeu_ps(oi + 16, r1);
        }
}

// The fp8 P·V tile of 32·NB columns (NB 1 or 2), codes converted by fp8_words, the two rows of a pair interleaved
// by bytes first so that fp8_words gives the pairs directly. NB 2: accumulator a holds column 16k + 4a + i in lane
// 4k + i; NB 1: the 128-bit blocks ordered so that accumulator 0 holds column 8k + i, 1 column 8k + 4 + i, as
// bf16_pv_tile's lo and hi. Each column's lane takes the same pairs in the same order in both (the same bits).
// o += kv_scale·sum.
template <class Arch, class E, std::size_t MR, std::size_t NB>
MHA_FP8_DOT_TARGET __attribute__((noinline, aligned(64))) void fp8_pv_tile(const unsigned char* const* rows, std::size_t e,
                                                                          const std::uint16_t* pb, std::size_t c0, float* o,
                                                                          std::size_t ldo, float kv_scale,
                                                                          const RowStream<Arch>* stream, std::size_t ahead_first,
                                                                          std::size_t ahead_rows) noexcept {
    static_assert(NB == 1 || NB == 2);
    constexpr std::size_t NA = 2 * NB;  // accumulators per query row
    __m512 acc[MR][NA];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (std::size_t a = 0; a < NA; ++a) acc[i][a] = _mm512_setzero_ps();
    for (std::size_t k0 = 0; k0 < e; k0 += 16) {
        const std::size_t k1 = min_size(k0 + 16, e);
        if (stream != nullptr) read_ahead<Arch>(*stream, ahead_first + k0 * ahead_rows / e, ahead_first + k1 * ahead_rows / e);
        for (std::size_t k = k0; k < k1; k += 2) {
            __m512i w[NA];
            if constexpr (NB == 2) {
                const __m512i x = _mm512_loadu_si512(rows[k] + c0), z = _mm512_loadu_si512(rows[k + 1] + c0);
                fp8_words<E>(_mm512_unpacklo_epi8(x, z), w[0], w[1]);
                fp8_words<E>(_mm512_unpackhi_epi8(x, z), w[2], w[3]);
            } else {
                // Block k of the interleaved bytes: columns 8k .. 8k + 7 of both rows.
                const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k] + c0));
                const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[k + 1] + c0));
                const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi8(x, z)), _mm256_unpackhi_epi8(x, z), 1);
                fp8_words<E>(_mm512_shuffle_i64x2(both, both, 0xD8), w[0], w[1]);
            }
#pragma GCC unroll 4
            for (std::size_t i = 0; i < MR; ++i) {
                std::int32_t two;  // P of the pair's two rows (the first in the low half)
                std::memcpy(&two, pb + i * kBf16ChunkSlots + k, 4);
                const __m512i pair = _mm512_set1_epi32(two);
#pragma GCC unroll 4
                for (std::size_t a = 0; a < NA; ++a) acc[i][a] = dot_pairs<Arch>(acc[i][a], pair, w[a]);
            }
        }
    }
    const __m512 vs = _mm512_set1_ps(kv_scale);
#pragma GCC unroll 4
    for (std::size_t i = 0; i < MR; ++i) {
        float* oi = o + i * ldo + c0;
        if constexpr (NB == 2) {
            // The 4 × 4 transpose of 128-bit blocks: output block k = (acc0, acc1, acc2, acc3)'s block k.
            const __m512 t0 = _mm512_shuffle_f32x4(acc[i][0], acc[i][1], 0x44), t1 = _mm512_shuffle_f32x4(acc[i][2], acc[i][3], 0x44);
            const __m512 t2 = _mm512_shuffle_f32x4(acc[i][0], acc[i][1], 0xEE), t3 = _mm512_shuffle_f32x4(acc[i][2], acc[i][3], 0xEE);
            const __m512 r[4] = {_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD),
                                 _mm512_shuffle_f32x4(t2, t3, 0x88), _mm512_shuffle_f32x4(t2, t3, 0xDD)};
#pragma GCC unroll 4
            for (std::size_t b = 0; b < 4; ++b) _mm512_storeu_ps(oi + 16 * b, _mm512_fmadd_ps(vs, r[b], _mm512_loadu_ps(oi + 16 * b)));
        } else {
            __m512 r0, r1;
            columns_in_order<Arch>(acc[i][0], acc[i][1], r0, r1);
            _mm512_storeu_ps(oi, _mm512_fmadd_ps(vs, r0, _mm512_loadu_ps(oi)));
            _mm512_storeu_ps(oi + 16, _mm512_fmadd_ps(vs, r1, _mm512_loadu_ps(oi + 16)));
        }
    }
}

template <class Arch, class E>
MHA_BF16_DOT_TARGET __attribute__((noinline)) void accumulate_bf16_dot_impl(ConstMatrix p, const BlockedRows<E>& v, Matrix o,
                                                                             const RowStream<Arch>& stream,
                                                                             float kv_scale) noexcept {
    const std::size_t M = o.rows, n = v.rows, d = o.cols;
    alignas(64) static const E zeros[kBf16DotMaxCols] = {};
    alignas(64) std::uint16_t pb[kBf16DotMaxRows * kBf16ChunkSlots];
    const unsigned char* rows[kBf16ChunkSlots];
    const unsigned char* const zero_row = reinterpret_cast<const unsigned char*>(zeros);
    for (std::size_t j0 = 0, g = 0; j0 < n; j0 += g) {
        g = min_size(n - j0, kBf16Chunk - (v.origin + j0) % kBf16Chunk);
        const std::size_t lead = (v.origin + j0) % 2, e = (lead + g + 1) / 2 * 2;
        rows[0] = zero_row;
        rows_by_run<Arch>(v, j0, g, rows + lead, [](std::size_t, std::size_t, const E*) {});
        if (lead + g < e) rows[lead + g] = zero_row;
        for (std::size_t m = 0; m < M; ++m) {
            std::uint16_t* pm = pb + m * kBf16ChunkSlots;
            pm[0] = 0;
            pm[e - 1] = 0;
            narrow_to_bf16<Arch>(p.data + m * p.stride + j0, g, pm + lead);
        }
        pv_tiles<Arch>(
            M, d, j0, g, stream, [](std::size_t, std::size_t) {},
            [&](auto MR, std::size_t blocks, std::size_t m0, std::size_t c, const RowStream<Arch>* rs, std::size_t af,
                std::size_t ahead_rows) {
                float* om = o.data + m0 * o.stride;
                const std::uint16_t* pt = pb + m0 * kBf16ChunkSlots;
                if constexpr (kFp8Rows<E>) {
                    if (blocks == 2)
                        fp8_pv_tile<Arch, E, decltype(MR)::value, 2>(rows, e, pt, c, om, o.stride, kv_scale, rs, af, ahead_rows);
                    else
                        fp8_pv_tile<Arch, E, decltype(MR)::value, 1>(rows, e, pt, c, om, o.stride, kv_scale, rs, af, ahead_rows);
                } else if (blocks == 2) {
                    bf16_pv_tile<Arch, E, decltype(MR)::value, 2>(rows, e, pt, c, om, o.stride, rs, af, ahead_rows);
                } else {
                    bf16_pv_tile<Arch, E, decltype(MR)::value, 1>(rows, e, pt, c, om, o.stride, rs, af, ahead_rows);
                }
            });
    }
}

template <class Arch, class E>
void accumulate_bf16_dot(ConstMatrix p, const BlockedRows<E>& v, Matrix o, const RowStream<Arch>& stream,
                         float kv_scale) noexcept {
    accumulate_bf16_dot_impl<Arch, E>(p, v, o, stream, kv_scale);
}
#undef MHA_BF16_DOT_TARGET
#undef MHA_FP8_DOT_TARGET
#endif

}  // namespace mha::simd::decode_detail
