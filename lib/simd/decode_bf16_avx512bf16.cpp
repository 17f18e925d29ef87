// The decode kernels on vdpbf16ps (compiled with -mavx512bf16; run only when active_isa() is avx512_bf16).
// Contract and order of the sums: decode_bf16.hpp.
//   scores: a register tile of 4 query rows × 4 key rows (16 accumulators, 4 key vectors, a query vector),
//     32 columns per vdpbf16ps; then one transposed reduction of the 16 accumulators. Loop order: key blocks
//     of 4 rows (read from memory once, reading ahead), then the query tiles (queries stay in L1).
//   accumulate: a register tile of 4 query rows × 64 columns. Two V rows j, j + 1 are interleaved into
//     lanes of pairs by vpunpck{l,h}wd, so the accumulators hold the columns permuted within each group
//     of 32 (lane 4k + i of the "low" one is column 8k + i, of the "high" one column 8k + 4 + i); o is
//     permuted into that order when the tile loads it and back when it stores. Loop order: chunks of V
//     rows (stay in L1), then query tiles, then column tiles.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "decode_bf16.hpp"
#include "read_ahead.hpp"

namespace mha::simd {
namespace {

constexpr std::size_t kAheadBytes = 8192, kAheadMaxRows = 16;  // as decode_impl.hpp
constexpr std::size_t QB = 4, KB = 4;                          // scores tile
constexpr std::size_t MB = 4, NG = 2;                          // accumulate tile: rows × groups of 32 columns
constexpr std::size_t kChunkBytes = 4096;                      // V rows per accumulate chunk (stay in L1)

template <class Arch>
struct Bf16Decode {
    using Stream = decode_detail::RowStream<Arch>;

    static inline __attribute__((always_inline)) __mmask32 mask32(std::size_t r) noexcept {
        return r >= 32 ? ~__mmask32(0) : (__mmask32(1) << r) - 1;
    }
    static inline __attribute__((always_inline)) __mmask16 mask16(std::size_t r) noexcept {
        return r >= 16 ? __mmask16(0xffff) : __mmask16((1u << r) - 1);
    }
    // 32 bf16 at p: all, or the first r (zeros in the other lanes; nothing past them read).
    static inline __attribute__((always_inline)) __m512i load(const bfloat16* p) noexcept { return _mm512_loadu_si512(p); }
    static inline __attribute__((always_inline)) __m512i load(const bfloat16* p, __mmask32 m) noexcept {
        return _mm512_maskz_loadu_epi16(m, p);
    }
    // 32 elements of a K / V row as bf16: bf16 rows loaded, fp32 rows narrowed (vcvtne2ps2bf16: exact for the
    // bf16 values that bf16 compute stores in an f32 cache).
    static inline __attribute__((always_inline)) __m512i row32(const bfloat16* p) noexcept { return load(p); }
    static inline __attribute__((always_inline)) __m512i row32(const bfloat16* p, __mmask32 m) noexcept { return load(p, m); }
    static inline __attribute__((always_inline)) __m512i row32(const float* p) noexcept {
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
    }
    static inline __attribute__((always_inline)) __m512i row32(const float* p, __mmask32 m) noexcept {
        const __m512 lo = _mm512_maskz_loadu_ps(__mmask16(m), p), hi = _mm512_maskz_loadu_ps(__mmask16(m >> 16), p + 16);
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    static inline __attribute__((always_inline)) __m512 dp(__m512 acc, __m512i a, __m512i b) noexcept {
        return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
    }

    // ---- scores ---------------------------------------------------------------------------------------

    // Lane 4b + i of the result: (v_i[4b] + v_i[4b + 2]) + (v_i[4b + 1] + v_i[4b + 3]).
    static inline __attribute__((always_inline)) __m512 block_sums(__m512 v0, __m512 v1, __m512 v2, __m512 v3) noexcept {
        const __m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
        const __m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
        return _mm512_add_ps(_mm512_shuffle_ps(t01, t23, 0x44), _mm512_shuffle_ps(t01, t23, 0xEE));
    }

    // s[m, j] for m < qr, j < kr of the tile's accumulators acc[m][j]: lane sums by one fixed tree, times scale.
    static inline __attribute__((always_inline)) void reduce_store(const __m512 (&acc)[QB][KB], std::size_t qr, std::size_t kr,
                                                                   float scale, float* s, std::size_t lds) noexcept {
        __m512 u[QB];
        for (std::size_t m = 0; m < QB; ++m) u[m] = block_sums(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
        const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
        const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
        __m512 sums = _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
        sums = _mm512_mul_ps(sums, _mm512_set1_ps(scale));  // lane 4m + j: s[m, j]
        alignas(64) float t[16];
        _mm512_store_ps(t, sums);
        const __mmask16 keys = mask16(kr);
        for (std::size_t m = 0; m < qr; ++m) _mm512_mask_storeu_ps(s + m * lds, keys, _mm512_maskz_loadu_ps(mask16(4), t + 4 * m));
    }

    // s[m, j] for m < qr, j < kr (<= QB, KB) against d columns.
    template <class E>
    static void scores_tile(std::size_t qr, std::size_t kr, std::size_t d, float scale, const bfloat16* q, std::size_t ldq,
                            const E* k, std::size_t ldk, float* s, std::size_t lds) noexcept {
        __m512 acc[QB][KB];
        for (std::size_t m = 0; m < QB; ++m)
            for (std::size_t j = 0; j < KB; ++j) acc[m][j] = _mm512_setzero_ps();
        // Rows past qr / kr of a tail tile are read as the tile's last row (their sums are never stored).
        const E* kj[KB];
        const bfloat16* qm[QB];
        for (std::size_t j = 0; j < KB; ++j) kj[j] = k + (j < kr ? j : kr - 1) * ldk;
        for (std::size_t m = 0; m < QB; ++m) qm[m] = q + (m < qr ? m : qr - 1) * ldq;
        const std::size_t body = d / 32 * 32;
        for (std::size_t c = 0; c < body; c += 32) {
            const __m512i k0 = row32(kj[0] + c), k1 = row32(kj[1] + c), k2 = row32(kj[2] + c), k3 = row32(kj[3] + c);
            for (std::size_t m = 0; m < QB; ++m) {
                const __m512i qv = load(qm[m] + c);
                acc[m][0] = dp(acc[m][0], qv, k0);
                acc[m][1] = dp(acc[m][1], qv, k1);
                acc[m][2] = dp(acc[m][2], qv, k2);
                acc[m][3] = dp(acc[m][3], qv, k3);
            }
        }
        if (body < d) {
            const __mmask32 tail = mask32(d - body);
            const __m512i k0 = row32(kj[0] + body, tail), k1 = row32(kj[1] + body, tail), k2 = row32(kj[2] + body, tail),
                          k3 = row32(kj[3] + body, tail);
            for (std::size_t m = 0; m < QB; ++m) {
                const __m512i qv = load(qm[m] + body, tail);
                acc[m][0] = dp(acc[m][0], qv, k0);
                acc[m][1] = dp(acc[m][1], qv, k1);
                acc[m][2] = dp(acc[m][2], qv, k2);
                acc[m][3] = dp(acc[m][3], qv, k3);
            }
        }
        reduce_store(acc, qr, kr, scale, s, lds);
    }

    template <class E>
    static void scores(float scale, MatrixView<const bfloat16> q, MatrixView<const E> k, Matrix s, const RowsAhead& ahead) noexcept {
        const std::size_t M = q.rows, n = k.rows, d = q.cols;
        if (M == 0 || n == 0) return;
        if (d == 0) {
            for (std::size_t m = 0; m < M; ++m)
                for (std::size_t j = 0; j < n; ++j) s.data[m * s.stride + j] = 0.0f;
            return;
        }
        const Stream stream = decode_detail::row_stream<Arch>(k, ahead, kAheadBytes, kAheadMaxRows);
        decode_detail::read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
        for (std::size_t j = 0; j < n; j += KB) {
            const std::size_t kr = n - j < KB ? n - j : KB;
            decode_detail::read_ahead<Arch>(stream, j + stream.distance, j + stream.distance + kr);
            for (std::size_t m = 0; m < M; m += QB)
                scores_tile(M - m < QB ? M - m : QB, kr, d, scale, q.data + m * q.stride, q.stride, k.data + j * k.stride,
                            k.stride, s.data + m * s.stride + j, s.stride);
        }
    }

    // ---- accumulate -----------------------------------------------------------------------------------

    // Columns [c, c + 32) of o's row in the accumulators' order (lo: 8k + i, hi: 8k + 4 + i), and back.
    static inline __attribute__((always_inline)) void load_group(const float* o, std::size_t r, __m512& lo, __m512& hi) noexcept {
        const __m512 n0 = _mm512_maskz_loadu_ps(mask16(r), o);
        const __m512 n1 = r > 16 ? _mm512_maskz_loadu_ps(mask16(r - 16), o + 16) : _mm512_setzero_ps();
        lo = _mm512_permutex2var_ps(n0, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), n1);
        hi = _mm512_permutex2var_ps(n0, _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31), n1);
    }
    static inline __attribute__((always_inline)) void store_group(__m512 lo, __m512 hi, float* o, std::size_t r) noexcept {
        const __m512 n0 = _mm512_permutex2var_ps(lo, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), hi);
        const __m512 n1 =
            _mm512_permutex2var_ps(lo, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), hi);
        _mm512_mask_storeu_ps(o, mask16(r), n0);
        if (r > 16) _mm512_mask_storeu_ps(o + 16, mask16(r - 16), n1);
    }
    // The pair (p[j], p[j + 1]) as one 32-bit lane value, or (p[j], 0).
    static inline __attribute__((always_inline)) __m512i pair(const bfloat16* p) noexcept {
        std::uint32_t w;
        std::memcpy(&w, p, 4);
        return _mm512_set1_epi32(static_cast<int>(w));
    }
    static inline __attribute__((always_inline)) __m512i single(const bfloat16* p) noexcept {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        return _mm512_set1_epi32(static_cast<int>(h));
    }

    // o[m, c] += Σ_{j < n} p[m, j]·v[j, c] for m < mr, c < cols (<= NG·32). Reads ahead the rows
    // [ahead_first, ahead_first + n_ahead) of the stream, one per row it reads.
    template <std::size_t MR, std::size_t G, class E>
    static void accumulate_tile(std::size_t n, std::size_t cols, const bfloat16* p, std::size_t ldp, const E* v,
                                std::size_t ldv, float* o, std::size_t ldo, const Stream* stream, std::size_t ahead_first,
                                std::size_t n_ahead) noexcept {
        __m512 lo[MR][G], hi[MR][G];
        __mmask32 vm[G];
        std::size_t r[G];
        for (std::size_t g = 0; g < G; ++g) {
            r[g] = cols > 32 * g + 32 ? 32 : cols - 32 * g;
            vm[g] = mask32(r[g]);
        }
        for (std::size_t m = 0; m < MR; ++m)
            for (std::size_t g = 0; g < G; ++g) load_group(o + m * ldo + 32 * g, r[g], lo[m][g], hi[m][g]);
        std::size_t j = 0;
        for (; j + 2 <= n; j += 2) {
            if (j < n_ahead) decode_detail::read_ahead<Arch>(*stream, ahead_first + j, ahead_first + (j + 2 < n_ahead ? j + 2 : n_ahead));
            __m512i vl[G], vh[G];
            for (std::size_t g = 0; g < G; ++g) {
                const __m512i a = row32(v + j * ldv + 32 * g, vm[g]), b = row32(v + (j + 1) * ldv + 32 * g, vm[g]);
                vl[g] = _mm512_unpacklo_epi16(a, b);
                vh[g] = _mm512_unpackhi_epi16(a, b);
            }
            for (std::size_t m = 0; m < MR; ++m) {
                const __m512i pm = pair(p + m * ldp + j);
                for (std::size_t g = 0; g < G; ++g) {
                    lo[m][g] = dp(lo[m][g], pm, vl[g]);
                    hi[m][g] = dp(hi[m][g], pm, vh[g]);
                }
            }
        }
        if (j < n) {  // the last row alone: its partner is zero
            if (j < n_ahead) decode_detail::read_ahead<Arch>(*stream, ahead_first + j, ahead_first + j + 1);
            __m512i vl[G], vh[G];
            for (std::size_t g = 0; g < G; ++g) {
                const __m512i a = row32(v + j * ldv + 32 * g, vm[g]), b = _mm512_setzero_si512();
                vl[g] = _mm512_unpacklo_epi16(a, b);
                vh[g] = _mm512_unpackhi_epi16(a, b);
            }
            for (std::size_t m = 0; m < MR; ++m) {
                const __m512i pm = single(p + m * ldp + j);
                for (std::size_t g = 0; g < G; ++g) {
                    lo[m][g] = dp(lo[m][g], pm, vl[g]);
                    hi[m][g] = dp(hi[m][g], pm, vh[g]);
                }
            }
        }
        for (std::size_t m = 0; m < MR; ++m)
            for (std::size_t g = 0; g < G; ++g) store_group(lo[m][g], hi[m][g], o + m * ldo + 32 * g, r[g]);
    }

    template <std::size_t MR, class E>
    static void accumulate_rows(std::size_t n, std::size_t cols, const bfloat16* p, std::size_t ldp, const E* v,
                                std::size_t ldv, float* o, std::size_t ldo, const Stream* stream, std::size_t ahead_first,
                                std::size_t n_ahead) noexcept {
        if (cols > 32)
            accumulate_tile<MR, 2, E>(n, cols, p, ldp, v, ldv, o, ldo, stream, ahead_first, n_ahead);
        else
            accumulate_tile<MR, 1, E>(n, cols, p, ldp, v, ldv, o, ldo, stream, ahead_first, n_ahead);
    }

    template <class E>
    static void accumulate(MatrixView<const bfloat16> p, MatrixView<const E> v, Matrix o, const RowsAhead& ahead) noexcept {
        const std::size_t M = o.rows, n = v.rows, d = o.cols;
        if (M == 0 || n == 0 || d == 0) return;
        const Stream stream = decode_detail::row_stream<Arch>(v, ahead, kAheadBytes, kAheadMaxRows);
        decode_detail::read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
        std::size_t J = kChunkBytes / (sizeof(E) * d) / 2 * 2;          // even: pairs never straddle chunks
        if (J < 4) J = 4;
        constexpr std::size_t W = 32 * NG;  // columns per tile
        for (std::size_t j0 = 0; j0 < n; j0 += J) {
            const std::size_t jn = n - j0 < J ? n - j0 : J;
            const E* vj = v.data + j0 * v.stride;
            bool first = true;  // the chunk's first tile reads ahead as far past its rows as the chunk is long
            for (std::size_t m = 0; m < M; m += MB) {
                const std::size_t mr = M - m < MB ? M - m : MB;
                const bfloat16* pm = p.data + m * p.stride + j0;
                float* om = o.data + m * o.stride;
                for (std::size_t c = 0; c < d; c += W) {
                    const std::size_t cols = d - c < W ? d - c : W;
                    const std::size_t n_ahead = first ? jn : 0;
                    first = false;
                    switch (mr) {
                        case 4: accumulate_rows<4>(jn, cols, pm, p.stride, vj + c, v.stride, om + c, o.stride, &stream, j0 + stream.distance, n_ahead); break;
                        case 3: accumulate_rows<3>(jn, cols, pm, p.stride, vj + c, v.stride, om + c, o.stride, &stream, j0 + stream.distance, n_ahead); break;
                        case 2: accumulate_rows<2>(jn, cols, pm, p.stride, vj + c, v.stride, om + c, o.stride, &stream, j0 + stream.distance, n_ahead); break;
                        default: accumulate_rows<1>(jn, cols, pm, p.stride, vj + c, v.stride, om + c, o.stride, &stream, j0 + stream.distance, n_ahead); break;
                    }
                }
            }
        }
    }

    // ---- narrowing ------------------------------------------------------------------------------------

    static void narrow(ConstMatrix x, MatrixView<bfloat16> y) noexcept {
        for (std::size_t i = 0; i < x.rows; ++i) {
            const float* src = x.data + i * x.stride;
            bfloat16* dst = y.data + i * y.stride;
            for (std::size_t c = 0; c < x.cols; c += 32) {
                const std::size_t r = x.cols - c < 32 ? x.cols - c : 32;
                const __m512 a = _mm512_maskz_loadu_ps(mask16(r), src + c);
                const __m512 b = r > 16 ? _mm512_maskz_loadu_ps(mask16(r - 16), src + c + 16) : _mm512_setzero_ps();
                _mm512_mask_storeu_epi16(dst + c, mask32(r), (__m512i)_mm512_cvtne2ps_pbh(b, a));
            }
        }
    }
};

}  // namespace

#define MHA_BF16_DECODE_DEFINE_(E)                                                                                    \
    void Bf16DecodeKernels::scores(arch_avx512, float scale, MatrixView<const bfloat16> q, MatrixView<const E> k, Matrix s, \
                                   const RowsAhead& ahead) noexcept {                                                     \
        Bf16Decode<arch_avx512>::scores(scale, q, k, s, ahead);                                                           \
    }                                                                                                                     \
    void Bf16DecodeKernels::accumulate(arch_avx512, MatrixView<const bfloat16> p, MatrixView<const E> v, Matrix o,        \
                                       const RowsAhead& ahead) noexcept {                                                 \
        Bf16Decode<arch_avx512>::accumulate(p, v, o, ahead);                                                              \
    }
MHA_BF16_DECODE_DEFINE_(bfloat16)
MHA_BF16_DECODE_DEFINE_(float)
#undef MHA_BF16_DECODE_DEFINE_
void Bf16DecodeKernels::narrow(arch_avx512, ConstMatrix x, MatrixView<bfloat16> y) noexcept { Bf16Decode<arch_avx512>::narrow(x, y); }

}  // namespace mha::simd
