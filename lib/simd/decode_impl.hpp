// The decode-step kernels on one ISA: definitions of decode_scores_kernel and decode_accumulate_kernel,
// included only by the generated decode_<isa>.cpp TUs (dispatch.hpp).
//   scores:     s[m, j] = scale·Σ_c q[m, c]·k[j, c]   q [M, d], k [n, d], s [M, n]
//   accumulate: o[m, c] += Σ_j p[m, j]·v[j, c]        p [M, n], v [n, d], o [M, d]
// K and V are float, bfloat16, float16, int8 or fp8 (a KV cache's element type): narrower elements are
// widened to float in registers as they are loaded (bf16: zero-extend to 32 bits and shift left 16; f16:
// vcvtph2ps on AVX2 and AVX-512, half.hpp's scalar conversion on SSE2; int8 and fp8: RowReader), exactly,
// so the fp32 arithmetic below and its summation order are the same for every element type. Except int8 V:
// accumulate reads its integers unscaled and folds each row's block scales into P (o += Σ_j fl(p_j·s_j,b)·q_j,c,
// the same order), and int8 K on AVX512_VNNI: scores on integer dot products (decode_int8_dot_impl.hpp).
// bf16 compute's kernels (decode_scores_bf16_kernel, decode_accumulate_bf16_kernel) run on vdpbf16ps on the AVX-512
// level with AVX512_BF16 (decode_bf16_dot_impl.hpp) and are the kernels below elsewhere.
// K and V are read in place (row stride ld >= d); nothing at or past row n of k / v, column d of a row,
// or column n of p is read, and nothing outside s / o is written. M, n, d >= 0 of any size.
//
// Memory-bound decode: each K and V row comes from memory once and should stream at read bandwidth,
// with the query rows (and o) hot in L1.
// scores: a register tile of query rows × key rows (ScoresShapes; AVX-512: 4 × 4 zmm accumulators; AVX2,
//   SSE2 and NEON 2 × 4; AVX2 with M > 2: 4 × 2 for 8-bit keys, 4 × 3 for 16-bit keys) runs along d,
//   lane l summing the columns c ≡ l (mod W) in order (the last, partial vector with masked or buffered loads,
//   zeros in the missing lanes). Then one transposed reduction turns the accumulators into sums with the same
//   fixed tree for every sum: per 128-bit block (l0 + l2) + (l1 + l3), then across blocks (b0 + b2) +
//   (b1 + b3) (AVX2: b0 + b1). Missing rows or keys of a tail tile are zero accumulators, so every s[m, j] is
//   bitwise the same whatever M and n are, whatever the tile's shape and wherever it sits in it. Loop order:
//   blocks of MQ query rows (kScoresQueryFloats, stay in L1), then key blocks of a tile's key rows (read from memory
//   for the first query tile, from L1 for the others, from L2 for the next query block), then the query
//   tiles.
// accumulate: a register tile of MB query rows × NV vectors of d (AVX-512: 4 × 4 zmm; AVX2 and SSE2: 4 × 2,
//   AVX2 with 16-bit V 4 × 3, or 2 × 4 when M <= 2 and V is not float) starts from o, adds p[m, j]·v[j, c]
//   for j = 0, 1, ... in order (one FMA each where the ISA has FMA), and is stored back. Each o[m, c] is its own
//   lane: the result is the sequential sum ((o + p0·v0) + p1·v1) + ..., bitwise the same for any M, any column
//   tiling, and any split of n into consecutive calls. Loop order: chunks of J rows of V (they stay in
//   L1), then query tiles, then column tiles; the first tile reads the chunk from memory, the others
//   from L1. int8 V: columns in slices of kFoldCols outermost, chunks of at most kFoldKeys rows, and per chunk
//   and query tile P times each block's scales into a [block][row][kFoldKeys] buffer the tiles read.
// Memory order: from memory, rows are read ahead by software prefetch (into L2) a fixed distance ahead of
//   the rows the tiles use (kAheadBytes, at least a tile; at most 16 rows or the rows ahead, if more;
//   read_ahead.hpp), in the caller's reading
//   order: past the kernel's own rows into RowsAhead, the rows the caller reads next (the next block of a paged
//   cache, or V after K). The tiles' own order (4 key rows at once, or a column slice of each V row) streams far
//   slower through the hardware prefetchers, and they restart at every block of a paged cache and fetch past
//   its end; reading ahead by prefetch measured 1.3-1.6× faster than reading each row's lines in address order
//   just before use ("touch", this kernel's earlier scheme) on one AMD Zen 5 core,
//   on contiguous rows and on blocks of 64 and 256 rows alike (bench/bench_decode.cpp, bench --op step).
//   A block's or chunk's read-ahead is spread over its tiles (a share of its rows per query tile of scores,
//   per tile of accumulate), not issued by the first tile alone: on AVX2 a 128-float V chunk takes 8 column
//   tiles, and one tile's burst of 64 line prefetches left memory idle through the other seven (accumulate at
//   M = 4 went from 5.5 to 11.9 GB/s on one AVX2 core, read_bw 12.4-14.3).
//   Where many query tiles reuse each block or chunk the kernel is compute-bound, and the next block or
//   chunk is also prefetched into L2 during the current one. Prefetches name no byte outside the rows.
// Every helper is a template on Arch (or has internal linkage), so no weak symbol compiled with one
// ISA's flags can be picked by the linker for another ISA's path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "decode.hpp"
#include "mha/half.hpp"
#include "mha/quantized.hpp"
#include "gemm_microkernel.hpp"  // gemm_detail::unroll, gemm_detail::fmadd, MHA_GEMM_INLINE
#include "read_ahead.hpp"        // RowStream, read_ahead
#include "row_tail.hpp"          // row_detail::load_head / store_head (SSE2 partial vectors)

// The tile functions start on a 64-byte boundary: their loops are a few instructions long, and on Zen 2 the same
// machine code ran up to 10 % slower at another offset (int8 accumulate, M 8 and 16: function start at 48 mod
// 64 against 0), so their speed moved with unrelated changes elsewhere in the TU.
#define MHA_DECODE_TILE __attribute__((aligned(64)))

namespace mha::simd {
namespace decode_detail {
namespace {
constexpr std::size_t min_size(std::size_t a, std::size_t b) noexcept { return b < a ? b : a; }
constexpr std::size_t max_size(std::size_t a, std::size_t b) noexcept { return b > a ? b : a; }
// Query rows per scores block: MQ·d <= kScoresQueryFloats (16 KB of q stay in L1 while the K tile
// streams past; later query blocks read the tile from L2).
constexpr std::size_t kScoresQueryFloats = 4096;
// Query rows per block above which scores prefetches the next key block into L2 (compute-bound): more than
// this many wide tiles' rows.
constexpr std::size_t kScoresPrefetchTiles = 4;
// V rows per accumulate chunk: J rows of at most kChunkBytesFew bytes when a chunk has at most
// kFewQueryTiles query tiles (memory-bound: a 4 KB chunk keeps the gaps short in which the other tiles
// compute from L1 and memory idles; counted in bytes, so narrow elements that widen get longer chunks,
// which amortize loading and storing the accumulators: int8, M 4, d 128 on Zen 2: 10.0 -> 7.7 ms), else
// J·d <= kChunkFloatsMany (compute-bound: longer chunks amortize loading and storing the accumulators,
// and the next chunk is prefetched into L2, spread over the tiles).
constexpr std::size_t kChunkBytesFew = 4096;
constexpr std::size_t kChunkFloatsMany = 4096;
constexpr std::size_t kFewQueryTiles = 2;
// Distance of the read-ahead, in bytes of rows (see the header), and its cap in rows where fewer rows are
// ahead (a paged cache's smallest block; row_stream). Capped at 16 rows whatever the rows ahead, 16-bit and
// 8-bit rows were read only 4 KB / 2 KB ahead: on one Zen 5 core the bf16 core of 16 decodes around 2048 keys
// in blocks of 64 took 6.21 ms, 4.89 with 32 rows ahead (int8 6.09 -> 5.12). Until stop 56 rows went into L1 at
// 8 KB and (fp32, 16-bit) into L2 at 16 KB; on one Zen 4 core the L1 prefetches stalled the kernels once the
// miss buffers filled, and L2 alone at 16 KB measured faster for every row type (docs/kv-cache-types.md, stop 56).
constexpr std::size_t kAheadBytes = 16384;
constexpr std::size_t kAheadMaxRows = 16;
}  // namespace

using gemm_detail::fmadd;
using gemm_detail::unroll;

template <class Arch>
using batch = xsimd::batch<float, Arch>;

// AVX2 with K / V of 8 or 16 bits: the tiles that widen elements take more query rows or vectors (see below).
template <class Arch, class T, std::size_t Bytes>
inline constexpr bool kAvx2Narrow = std::is_same_v<Arch, arch_avx2> && sizeof(T) == Bytes;

template <class Arch>
struct DecodeTiles {
    static constexpr std::size_t W = batch<Arch>::size;
    // scores: at most QB query rows × KB key rows of accumulators (ScoresShapes picks a tile's shape).
    static constexpr std::size_t QB = W == 4 ? 2 : 4;
    static constexpr std::size_t KB = 4;
    // accumulate: MB query rows × NV vectors, plus NV V vectors and a broadcast p
    // (AVX-512: 16 + 5 of 32; AVX2 and SSE2: 8 + 3 of 16).
    static constexpr std::size_t MB = 4;
    static constexpr std::size_t NV = W == 16 ? 4 : 2;
    // With at most FEW_ROWS query rows and V narrower than float the tile is NV_FEW vectors wide (AVX2 and
    // SSE2: 2 × 4 + 4 + 1 of 16): half the tiles per V row, so half the loop overhead per element.
    static constexpr std::size_t FEW_ROWS = 2;
    static constexpr std::size_t NV_FEW = 4;
    static constexpr std::size_t NV_MAX = NV > NV_FEW ? NV : NV_FEW;
    // Vectors per tile with more than FEW_ROWS rows: AVX2 with 16-bit V 4 × 3 (+ 3 + 1 of 16): 12 FMA chains
    // instead of 8 hide the FMA latency (bf16, M 4, d 128 on Zen 2: accumulate 7.1 -> 6.5 ms).
    template <class T>
    static constexpr std::size_t nv_many() noexcept { return kAvx2Narrow<Arch, T, 2> ? 3 : NV; }
};

// A scores tile: Rows query rows × Keys key rows of accumulators (at most QB × KB), plus Keys key vectors and a
// query vector.
template <std::size_t Rows, std::size_t Keys>
struct TileShape {
    static constexpr std::size_t rows = Rows, keys = Keys;
};

// The scores tiles for keys of T. Wide: AVX-512 4 × 4 (+ 5 of 32 registers), AVX2, SSE2 and NEON 2 × 4 (+ 5 of
// 16); float keys and any M. Tall, for M > 2: on AVX2 with 8-bit keys 4 × 2 (+ 3, + 2 int8 scales), which widens
// each key vector once for 4 query rows instead of 2 (int8 scores, M 4, d 128 on Zen 2: 8.2 -> 7.5 ms;
// e5m2 8.7 -> 7.2); on AVX2 with 16-bit keys 4 × 3 (+ 4 of 16): 12 FMA chains instead of 8 hide the FMA latency
// (bf16 scores from L2, M 4, d 128 on Zen 2: 44 -> 50 GFLOP/s; M 8 from memory 12.0 -> 9.9 ms; a 4 × 2 tile did
// not gain); elsewhere the wide tile.
template <class Arch, class T>
struct ScoresShapes {
    using Wide = TileShape<batch<Arch>::size == 16 ? 4 : 2, 4>;
    using Tall = std::conditional_t<kAvx2Narrow<Arch, T, 1>, TileShape<4, 2>,
                                    std::conditional_t<kAvx2Narrow<Arch, T, 2>, TileShape<4, 3>, Wide>>;
    static_assert(Wide::rows <= DecodeTiles<Arch>::QB && Tall::rows <= DecodeTiles<Arch>::QB, "tiles fit the accumulators");
};

// The lanes [0, r) of a vector, 0 < r < W: load() reads only p[0, r) (zeros in the other lanes),
// store() writes only p[0, r). A stack buffer here (SSE2); masked instructions on AVX2 and AVX-512
// (masked-off lanes never fault), in specializations that exist only in the TU of their ISA (never an
// out-of-line copy compiled with AVX-512 flags that the AVX2 path could be linked to).
template <class Arch>
struct Part {
    using B = batch<Arch>;
    std::size_t r;
    explicit MHA_GEMM_INLINE Part(std::size_t count) noexcept : r(count) {}
    MHA_GEMM_INLINE B load(const float* p) const noexcept { return row_detail::load_head(Arch{}, p, r, 0.0f); }
    MHA_GEMM_INLINE void store(const B& v, float* p) const noexcept { row_detail::store_head(Arch{}, v, p, r); }
};

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
template <>
struct Part<arch_avx2> {
    using B = batch<arch_avx2>;
    __m256i mask;
    explicit MHA_GEMM_INLINE Part(std::size_t r) noexcept
        : mask(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))) {}
    MHA_GEMM_INLINE B load(const float* p) const noexcept { return _mm256_maskload_ps(p, mask); }
    MHA_GEMM_INLINE void store(const B& v, float* p) const noexcept { _mm256_maskstore_ps(p, mask, v); }
};
#endif

#if defined(__AVX512F__)
template <>
struct Part<arch_avx512> {
    using B = batch<arch_avx512>;
    __mmask16 mask;
    explicit MHA_GEMM_INLINE Part(std::size_t r) noexcept : mask(static_cast<__mmask16>((1u << r) - 1u)) {}
    MHA_GEMM_INLINE B load(const float* p) const noexcept { return _mm512_maskz_loadu_ps(mask, p); }
    MHA_GEMM_INLINE void store(const B& v, float* p) const noexcept { _mm512_mask_storeu_ps(p, mask, v); }
};
#endif

// The float value of element c of a K / V row of d elements of T: what ElementFormat::widen gives (exact;
// int8: q·s_b with s_b the row's float16 scale of block c / 32; fp8: to_float·scale, the tensor's scale).
template <class T>
inline MHA_GEMM_INLINE float element_value(const T* row, std::size_t d, std::size_t c, float scale) noexcept {
    if constexpr (std::is_same_v<T, float>)
        return row[c];
    else if constexpr (std::is_same_v<T, qint8>)
        return static_cast<float>(row[c].bits) * int8_row_scale(row, d, c / kInt8Block);
    else if constexpr (std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>)
        return row[c].to_float() * scale;
    else
        return row[c].to_float();
}

// Bytes of a stored row of d elements of T (an int8 row with its scales).
template <class T>
constexpr std::size_t row_storage_bytes(std::size_t d) noexcept {
    return std::is_same_v<T, qint8> ? int8_row_bytes(d) : d * sizeof(T);
}

// Reads a kernel's K / V rows of T as vectors of W floats: full(row, c) the values of columns [c, c + W),
// part(row, c, r) those of [c, c + r) and zeros in the other lanes (0 < r < W; nothing past them read).
// d: the row's elements (int8: where its scales start); scale: the tensor's scale (fp8). Here: one element
// at a time (SSE2 and other ISAs); float with plain and masked loads, and the 16-bit and 8-bit types with
// conversion instructions in specializations that exist only in the AVX2, AVX-512 and NEON TUs.
// row(p) makes what full / part read a row through (the row's start; for int8 on AVX2 / AVX-512 also its block
// scales, widened once per row).
template <class Arch, class T, class = void>
struct RowReader {
    using B = batch<Arch>;
    using Row = const T*;
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const T* p) const noexcept { return p; }
    MHA_GEMM_INLINE B full(const T* row, std::size_t c) const noexcept {
        alignas(64) float t[B::size];
        for (std::size_t i = 0; i < B::size; ++i) t[i] = element_value(row, d, c + i, scale);
        return B::load_aligned(t);
    }
    MHA_GEMM_INLINE B part(const T* row, std::size_t c, std::size_t r) const noexcept {
        alignas(64) float t[B::size] = {};
        for (std::size_t i = 0; i < r; ++i) t[i] = element_value(row, d, c + i, scale);
        return B::load_aligned(t);
    }
};

template <class Arch>
struct RowReader<Arch, float> {
    using B = batch<Arch>;
    using Row = const float*;
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const float* p) const noexcept { return p; }
    MHA_GEMM_INLINE B full(const float* row, std::size_t c) const noexcept { return B::load_unaligned(row + c); }
    MHA_GEMM_INLINE B part(const float* row, std::size_t c, std::size_t r) const noexcept { return Part<Arch>(r).load(row + c); }
};

// Columns per scale block of a reader whose rows a kernel must enter at each block it reads (R::at_block, before
// full / part read a column of the block; the blocks are multiples of W); 0: none.
template <class R, class = void>
inline constexpr std::size_t kScaleBlock = 0;
template <class R>
inline constexpr std::size_t kScaleBlock<R, std::void_t<decltype(R::kScaleBlock)>> = R::kScaleBlock;

// Enters `row` at column c's block if c starts one, or `first` (c: a multiple of W).
template <class R>
inline MHA_GEMM_INLINE void enter_block(const R& reader, typename R::Row& row, std::size_t c, bool first) noexcept {
    if constexpr (kScaleBlock<R> != 0)
        if (first || c % kScaleBlock<R> == 0) row = reader.at_block(row, c);
}

// Archs whose TU defines the conversions below (the AVX2, AVX-512 and NEON TUs): 16-bit and 8-bit elements widened
// with conversion instructions.
template <class Arch>
inline constexpr bool kWidensInRegisters = false;

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
// 8 elements of 16 bits or 8 bits: a full load, or r elements copied into a zeroed buffer.
inline MHA_GEMM_INLINE __m128i load_8x16(const void* p) noexcept { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline MHA_GEMM_INLINE __m128i load_8x16(const void* p, std::size_t r) noexcept {
    alignas(16) std::uint16_t t[8] = {};
    std::memcpy(t, p, r * 2);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}
inline MHA_GEMM_INLINE __m128i load_8x8(const void* p) noexcept { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline MHA_GEMM_INLINE __m128i load_8x8(const void* p, std::size_t r) noexcept {
    alignas(16) std::uint8_t t[16] = {};
    std::memcpy(t, p, r);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}
inline MHA_GEMM_INLINE __m256 to_float(bfloat16, __m128i h) noexcept {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline MHA_GEMM_INLINE __m256 to_float(float16, __m128i h) noexcept { return _mm256_cvtph_ps(h); }
inline MHA_GEMM_INLINE __m128i load_16bit(arch_avx2, const void* p) noexcept { return load_8x16(p); }
inline MHA_GEMM_INLINE __m128i load_16bit(arch_avx2, const void* p, std::size_t r) noexcept { return load_8x16(p, r); }
inline MHA_GEMM_INLINE __m128i load_8bit(arch_avx2, const void* p) noexcept { return load_8x8(p); }
inline MHA_GEMM_INLINE __m128i load_8bit(arch_avx2, const void* p, std::size_t r) noexcept { return load_8x8(p, r); }
// 8 int8 as floats; fp8 bytes as float16 bits (e5m2: the byte is the upper half; e4m3: sign, then exponent and
// mantissa shifted so that the float16 value is the e4m3 value / 256 (fp8_unit), NaN (S.1111.111) mended after).
inline MHA_GEMM_INLINE __m256 int8_to_float(__m128i b) noexcept { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }
inline MHA_GEMM_INLINE float half_to_float(arch_avx2, std::uint16_t h) noexcept { return _cvtsh_ss(h); }
inline MHA_GEMM_INLINE __m256 fp8_to_float(fp8_e5m2, __m128i b) noexcept {
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8));
}
// e4m3 in 16-bit lanes, all in 128-bit registers (fewer and cheaper instructions than widening first, and
// two constants): the byte in both halves of a lane, shifted right 1 arithmetically, bits 14 and 6..0
// cleared; NaN codes become 0x7F00, a float16 quiet NaN.
inline MHA_GEMM_INLINE __m256 fp8_to_float(fp8_e4m3, __m128i b) noexcept {
    const __m128i w = _mm_unpacklo_epi8(b, b);
    const __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16(static_cast<short>(0xBF80)));
    const __m128i top = _mm_set1_epi16(0x7F00);
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(w, top), top);
    return _mm256_cvtph_ps(_mm_blendv_epi8(h, top, nan));  // the value / 256
}
template <>
inline constexpr bool kWidensInRegisters<arch_avx2> = true;
#endif

#if defined(__AVX512F__)
// 16 elements of 16 bits (a 256-bit load) or 8 bits (a 128-bit load), whole or masked (masked-off elements
// never fault).
inline MHA_GEMM_INLINE __m512 to_float(bfloat16, __m256i h) noexcept {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline MHA_GEMM_INLINE __m512 to_float(float16, __m256i h) noexcept { return _mm512_cvtph_ps(h); }
inline MHA_GEMM_INLINE __m256i load_16bit(arch_avx512, const void* p) noexcept {
    return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline MHA_GEMM_INLINE __m256i load_16bit(arch_avx512, const void* p, std::size_t r) noexcept {
    return _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << r) - 1u), p);
}
inline MHA_GEMM_INLINE __m128i load_8bit(arch_avx512, const void* p) noexcept { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline MHA_GEMM_INLINE __m128i load_8bit(arch_avx512, const void* p, std::size_t r) noexcept {
    return _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << r) - 1u), p);
}
inline MHA_GEMM_INLINE __m512 int8_to_float(__m128i b) noexcept { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
inline MHA_GEMM_INLINE float half_to_float(arch_avx512, std::uint16_t h) noexcept { return _cvtsh_ss(h); }
// The first n <= 16 float16 values at p as floats (lanes past n: 0).
inline MHA_GEMM_INLINE __m512 block_scales(arch_avx512, const void* p, std::size_t n) noexcept {
    return _mm512_cvtph_ps(load_16bit(arch_avx512{}, p, n));
}
inline MHA_GEMM_INLINE __m512 pick_lane(arch_avx512, __m512 v, std::size_t b) noexcept {
    return _mm512_permutexvar_ps(_mm512_set1_epi32(static_cast<int>(b)), v);
}
inline MHA_GEMM_INLINE __m512 fp8_to_float(fp8_e5m2, __m128i b) noexcept {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
}
// e4m3: the byte sign-extended to 16 bits and shifted left 7 puts the sign in bits 15 and 14 and the exponent and
// mantissa in 13..7; clearing bit 14 leaves the float16 of the value / 256. NaN codes (S.1111.111: the byte or
// 0x80 is 0xFF) mended after. Three instructions fewer than assembling sign and magnitude from a zero extension
// (e4m3 core, one sequence of 32768 keys, one Zen 5 core: see docs/kv-quantization.md).
inline MHA_GEMM_INLINE __m512 fp8_to_float(fp8_e4m3, __m128i b) noexcept {
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(b, _mm_set1_epi8(static_cast<char>(0x80))), _mm_set1_epi8(static_cast<char>(0xFF)));
    return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));  // the value / 256
}
template <>
inline constexpr bool kWidensInRegisters<arch_avx512> = true;
#endif

#if MHA_SIMD_ARM
// NEON (4 lanes): 4 elements of 16 bits (a 64-bit load) or 8 bits (a 32-bit load), whole or copied into a
// zeroed buffer. bf16: shift left by 16 (ushll); f16: fcvtl; fp8 through float16 bits as on x86.
inline MHA_GEMM_INLINE uint16x4_t load_16bit(arch_neon, const void* p) noexcept {
    return vld1_u16(static_cast<const std::uint16_t*>(p));
}
inline MHA_GEMM_INLINE uint16x4_t load_16bit(arch_neon, const void* p, std::size_t r) noexcept {
    alignas(8) std::uint16_t t[4] = {};
    std::memcpy(t, p, r * 2);
    return vld1_u16(t);
}
inline MHA_GEMM_INLINE float32x4_t to_float(bfloat16, uint16x4_t h) noexcept { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }
inline MHA_GEMM_INLINE float32x4_t to_float(float16, uint16x4_t h) noexcept { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
inline MHA_GEMM_INLINE uint8x8_t load_8bit(arch_neon, const void* p) noexcept {
    std::uint32_t w;
    std::memcpy(&w, p, 4);
    return vreinterpret_u8_u32(vdup_n_u32(w));
}
inline MHA_GEMM_INLINE uint8x8_t load_8bit(arch_neon, const void* p, std::size_t r) noexcept {
    std::uint32_t w = 0;
    std::memcpy(&w, p, r);
    return vreinterpret_u8_u32(vdup_n_u32(w));
}
inline MHA_GEMM_INLINE float32x4_t int8_to_float(uint8x8_t b) noexcept {
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b)))));
}
inline MHA_GEMM_INLINE float half_to_float(arch_neon, std::uint16_t h) noexcept {
    return vgetq_lane_f32(to_float(float16{}, vdup_n_u16(h)), 0);
}
inline MHA_GEMM_INLINE float32x4_t block_scales(arch_neon, const void* p, std::size_t n) noexcept {
    return to_float(float16{}, n == 4 ? load_16bit(arch_neon{}, p) : load_16bit(arch_neon{}, p, n));
}
inline MHA_GEMM_INLINE float32x4_t pick_lane(arch_neon, float32x4_t v, std::size_t b) noexcept {
    alignas(16) float t[4];
    vst1q_f32(t, v);
    return vdupq_n_f32(t[b]);
}
inline MHA_GEMM_INLINE float32x4_t fp8_to_float(fp8_e5m2, uint8x8_t b) noexcept {
    return to_float(float16{}, vget_low_u16(vshll_n_u8(b, 8)));
}
inline MHA_GEMM_INLINE float32x4_t fp8_to_float(fp8_e4m3, uint8x8_t b) noexcept {
    const uint16x4_t w = vget_low_u16(vmovl_u8(b)), low = vand_u16(w, vdup_n_u16(0x7f));
    const uint16x4_t h = vorr_u16(vshl_n_u16(vand_u16(w, vdup_n_u16(0x80)), 8), vshl_n_u16(low, 7));
    const float32x4_t v = to_float(float16{}, h);  // the value / 256
    const uint32x4_t nan = vreinterpretq_u32_s32(vmovl_s16(vreinterpret_s16_u16(vceq_u16(low, vdup_n_u16(0x7f)))));  // all ones
    return vbslq_f32(nan, vdupq_n_f32(std::numeric_limits<float>::quiet_NaN()), v);
}
template <>
inline constexpr bool kWidensInRegisters<arch_neon> = true;
#endif

// 16-bit elements (bf16: zero-extend and shift by 16; f16: vcvtph2ps).
template <class Arch, class T>
struct RowReader<Arch, T, std::enable_if_t<sizeof(T) == 2 && kWidensInRegisters<Arch>>> {
    using B = batch<Arch>;
    using Row = const T*;
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const T* p) const noexcept { return p; }
    MHA_GEMM_INLINE B full(const T* row, std::size_t c) const noexcept { return to_float(T{}, load_16bit(Arch{}, row + c)); }
    MHA_GEMM_INLINE B part(const T* row, std::size_t c, std::size_t r) const noexcept {
        return to_float(T{}, load_16bit(Arch{}, row + c, r));
    }
};

// The float16 scale of block b of the int8 row of d elements at p (its scales follow the elements), as a float.
template <class Arch>
inline MHA_GEMM_INLINE float int8_scale_value(const qint8* p, std::size_t d, std::size_t b) noexcept {
    if constexpr (kWidensInRegisters<Arch>) {
        std::uint16_t h;
        std::memcpy(&h, reinterpret_cast<const unsigned char*>(p) + d + 2 * b, 2);
        return half_to_float(Arch{}, h);
    } else {
        return int8_row_scale(p, d, b);
    }
}

// The same in every lane.
template <class Arch>
inline MHA_GEMM_INLINE batch<Arch> int8_block_scale(const qint8* p, std::size_t d, std::size_t b) noexcept {
    return batch<Arch>(int8_scale_value<Arch>(p, d, b));
}

// int8 (the scores' reader; decode_accumulate reads V unscaled, Int8RawReader): sign-extend, convert, times the
// block's scale (a vector lies within one block of 32). Two readers: AVX2
// widens one block's scale as a kernel enters the block (at_block, kScaleBlock); AVX-512 and NEON widen the
// row's first W block scales once per row (row()) and pick a vector's by a permute, later blocks (d > 32·W)
// one at a time. On Zen 2 the per-row vector conversion and lane-crossing permutes cost more (measured when
// accumulate still read V through it, M 1, d 128: 11.6 ms against 7.0 ms with a scale widened per vector).
template <class Arch>
struct RowReader<Arch, qint8, std::enable_if_t<kWidensInRegisters<Arch> && std::is_same_v<Arch, arch_avx2>>> {
    using B = batch<Arch>;
    static constexpr std::size_t kScaleBlock = kInt8Block;
    struct Row {
        const qint8* p;
        B scale;  // of the block at_block entered last, in every lane
    };
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const qint8* p) const noexcept { return {p, B(0.0f)}; }  // no block entered yet
    // The row entered at the block of column c: full / part read columns of that block through it.
    MHA_GEMM_INLINE Row at_block(const Row& r, std::size_t c) const noexcept {
        return {r.p, int8_block_scale<Arch>(r.p, d, c / kInt8Block)};
    }
    MHA_GEMM_INLINE B full(const Row& r, std::size_t c) const noexcept { return B(int8_to_float(load_8bit(Arch{}, r.p + c))) * r.scale; }
    MHA_GEMM_INLINE B part(const Row& r, std::size_t c, std::size_t n) const noexcept {
        return B(int8_to_float(load_8bit(Arch{}, r.p + c, n))) * r.scale;
    }
};

template <class Arch>
struct RowReader<Arch, qint8, std::enable_if_t<kWidensInRegisters<Arch> && !std::is_same_v<Arch, arch_avx2>>> {
    using B = batch<Arch>;
    struct Row {
        const qint8* p;
        B scales;  // lane b < min(blocks, W): the scale of block b
    };
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const qint8* p) const noexcept {
        const std::size_t blocks = (d + kInt8Block - 1) / kInt8Block;
        return {p, B(block_scales(Arch{}, reinterpret_cast<const unsigned char*>(p) + d, blocks < B::size ? blocks : B::size))};
    }
    MHA_GEMM_INLINE B block_scale(const Row& r, std::size_t c) const noexcept {
        const std::size_t b = c / kInt8Block;
        return b < B::size ? B(pick_lane(Arch{}, r.scales, b)) : int8_block_scale<Arch>(r.p, d, b);
    }
    MHA_GEMM_INLINE B full(const Row& r, std::size_t c) const noexcept {
        return B(int8_to_float(load_8bit(Arch{}, r.p + c))) * block_scale(r, c);
    }
    MHA_GEMM_INLINE B part(const Row& r, std::size_t c, std::size_t n) const noexcept {
        return B(int8_to_float(load_8bit(Arch{}, r.p + c, n))) * block_scale(r, c);
    }
};

// int8 V in decode_accumulate: the integers as floats, unscaled (each row's block scales are folded into P:
// see decode_accumulate_kernel). Generic: one element at a time; in registers where the TU widens there.
template <class Arch, class = void>
struct Int8RawReader {
    using B = batch<Arch>;
    using Row = const qint8*;
    MHA_GEMM_INLINE Row row(const qint8* p) const noexcept { return p; }
    MHA_GEMM_INLINE B full(const qint8* row, std::size_t c) const noexcept {
        alignas(64) float t[B::size];
        for (std::size_t i = 0; i < B::size; ++i) t[i] = static_cast<float>(row[c + i].bits);
        return B::load_aligned(t);
    }
    MHA_GEMM_INLINE B part(const qint8* row, std::size_t c, std::size_t r) const noexcept {
        alignas(64) float t[B::size] = {};
        for (std::size_t i = 0; i < r; ++i) t[i] = static_cast<float>(row[c + i].bits);
        return B::load_aligned(t);
    }
};

template <class Arch>
struct Int8RawReader<Arch, std::enable_if_t<kWidensInRegisters<Arch>>> {
    using B = batch<Arch>;
    using Row = const qint8*;
    MHA_GEMM_INLINE Row row(const qint8* p) const noexcept { return p; }
    MHA_GEMM_INLINE B full(const qint8* row, std::size_t c) const noexcept { return B(int8_to_float(load_8bit(Arch{}, row + c))); }
    MHA_GEMM_INLINE B part(const qint8* row, std::size_t c, std::size_t r) const noexcept {
        return B(int8_to_float(load_8bit(Arch{}, row + c, r)));
    }
};

// Whether decode_accumulate folds T's scales into P (int8: o += Σ_j fl(p_j·s_j,b)·q_j,c) rather than widening
// V to its values; and the reader its tiles read V through.
template <class T>
inline constexpr bool kFoldsScaleIntoP = std::is_same_v<T, qint8>;
template <class Arch, class T>
using AccumulateReader = std::conditional_t<kFoldsScaleIntoP<T>, Int8RawReader<Arch>, RowReader<Arch, T>>;

// fp8: to float16 bits, vcvtph2ps (e4m3: times 256, NaN mended), times the tensor's scale.
template <class Arch, class T>
struct RowReader<Arch, T, std::enable_if_t<(std::is_same_v<T, fp8_e4m3> || std::is_same_v<T, fp8_e5m2>) && kWidensInRegisters<Arch>>> {
    using B = batch<Arch>;
    using Row = const T*;
    std::size_t d;
    float scale;
    MHA_GEMM_INLINE Row row(const T* p) const noexcept { return p; }
    // Times the scale: e4m3's float16 values are a 256th of the value, so one product by 256·scale, which gives
    // the bits of (value·256)·scale (256·scale is exact, and scaling by 256 commutes with rounding) unless
    // 256·scale overflows.
    MHA_GEMM_INLINE B scaled(B v) const noexcept {
        if constexpr (std::is_same_v<T, fp8_e4m3>) {
            const float s256 = scale * 256.0f;
            return s256 <= std::numeric_limits<float>::max() ? v * B(s256) : (v * B(256.0f)) * B(scale);
        } else {
            return v * B(scale);
        }
    }
    MHA_GEMM_INLINE B full(const T* row, std::size_t c) const noexcept { return scaled(B(fp8_to_float(T{}, load_8bit(Arch{}, row + c)))); }
    MHA_GEMM_INLINE B part(const T* row, std::size_t c, std::size_t r) const noexcept {
        return scaled(B(fp8_to_float(T{}, load_8bit(Arch{}, row + c, r))));
    }
};

// The V rows an accumulate tile brings in as it goes, at its iteration i: row `ahead_first + i` of the
// stream into L2 (i < n_ahead), and `prefetch` rows (of the next chunk) into L2.
template <class Arch>
struct RowPlan {
    const RowStream<Arch>* stream = nullptr;
    std::size_t ahead_first = 0, n_ahead = 0;
    const char* prefetch = nullptr;
    std::size_t n_prefetch = 0;
    std::size_t ld = 0, bytes = 0;
};

// ---- scores ----------------------------------------------------------------------------------------

// Per 128-bit block, the partial sums of v0..v3: lane 4b + i of the result is
// (v_i[4b] + v_i[4b + 2]) + (v_i[4b + 1] + v_i[4b + 3]).
template <class Arch>
inline MHA_GEMM_INLINE batch<Arch> block_sums4(const batch<Arch>& v0, const batch<Arch>& v1, const batch<Arch>& v2,
                                        const batch<Arch>& v3) noexcept {
    using B = batch<Arch>;
#if MHA_SIMD_X86
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        const B t01 = B(_mm512_unpacklo_ps(v0, v1)) + B(_mm512_unpackhi_ps(v0, v1));
        const B t23 = B(_mm512_unpacklo_ps(v2, v3)) + B(_mm512_unpackhi_ps(v2, v3));
        return B(_mm512_shuffle_ps(t01, t23, 0x44)) + B(_mm512_shuffle_ps(t01, t23, 0xEE));
    } else if constexpr (std::is_same_v<Arch, arch_avx2>) {
        const B t01 = B(_mm256_unpacklo_ps(v0, v1)) + B(_mm256_unpackhi_ps(v0, v1));
        const B t23 = B(_mm256_unpacklo_ps(v2, v3)) + B(_mm256_unpackhi_ps(v2, v3));
        return B(_mm256_shuffle_ps(t01, t23, 0x44)) + B(_mm256_shuffle_ps(t01, t23, 0xEE));
    } else {
        const B t01 = B(_mm_unpacklo_ps(v0, v1)) + B(_mm_unpackhi_ps(v0, v1));
        const B t23 = B(_mm_unpacklo_ps(v2, v3)) + B(_mm_unpackhi_ps(v2, v3));
        return B(_mm_shuffle_ps(t01, t23, 0x44)) + B(_mm_shuffle_ps(t01, t23, 0xEE));
    }
#elif MHA_SIMD_ARM
    // zip1 / zip2 are unpacklo / unpackhi; the 64-bit halves recombined are the 0x44 / 0xEE shuffles.
    const float32x4_t t01 = vaddq_f32(vzip1q_f32(v0, v1), vzip2q_f32(v0, v1));
    const float32x4_t t23 = vaddq_f32(vzip1q_f32(v2, v3), vzip2q_f32(v2, v3));
    return B(vaddq_f32(vcombine_f32(vget_low_f32(t01), vget_low_f32(t23)), vcombine_f32(vget_high_f32(t01), vget_high_f32(t23))));
#else
    // A generic 4-lane arch (not x86): the same sums through memory.
    static_assert(B::size == 4, "the decode kernels' generic path has 4 lanes");
    alignas(64) float v[4][4], r[4];
    v0.store_aligned(v[0]);
    v1.store_aligned(v[1]);
    v2.store_aligned(v[2]);
    v3.store_aligned(v[3]);
    for (std::size_t i = 0; i < 4; ++i) r[i] = (v[i][0] + v[i][2]) + (v[i][1] + v[i][3]);
    return B::load_aligned(r);
#endif
}

// Writes scale·(lane sum of acc[m][j]) to s[m·lds + j] for m < QR, j < KR (acc [QB][4]).
template <class Arch, std::size_t QR, std::size_t KR>
inline MHA_GEMM_INLINE void reduce_store(const batch<Arch> (&acc)[DecodeTiles<Arch>::QB][4], float scale, float* s,
                                  std::size_t lds) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t QB = DecodeTiles<Arch>::QB;
#if MHA_SIMD_X86
    if constexpr (std::is_same_v<Arch, arch_avx2> && KR == 2 && QR > 2) {
        // Two keys per row: rows 2h and 2h + 1 share a block_sums4, so one vector holds 4 rows × 2 keys
        // (lanes 2m + j), each sum by the same tree as below.
        const B u0 = block_sums4<Arch>(acc[0][0], acc[0][1], acc[1][0], acc[1][1]);
        const B u1 = block_sums4<Arch>(acc[2][0], acc[2][1], acc[3][0], acc[3][1]);
        const B sums = (B(_mm256_permute2f128_ps(u0, u1, 0x20)) + B(_mm256_permute2f128_ps(u0, u1, 0x31))) * B(scale);
        const __m128 lo = _mm256_castps256_ps128(sums), hi = _mm256_extractf128_ps(sums, 1);
        _mm_storel_pi(reinterpret_cast<__m64*>(s), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(s + lds), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(s + 2 * lds), hi);
        if constexpr (QR == 4) _mm_storeh_pi(reinterpret_cast<__m64*>(s + 3 * lds), hi);
        return;
    }
#endif
    // sums[g] holds the sums of query rows [g·R, (g + 1)·R), R = W / 4, four keys per row.
    constexpr std::size_t R = B::size / 4, G = (QR + R - 1) / R;
    static_assert(G * R <= QB, "a tile's rows fit the accumulators");
    B sums[G];
    B u[G * R];
    unroll<G * R>([&](auto m) MHA_GEMM_INLINE { u[m] = block_sums4<Arch>(acc[m][0], acc[m][1], acc[m][2], acc[m][3]); });
#if MHA_SIMD_X86
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        const B w01 = B(_mm512_shuffle_f32x4(u[0], u[1], 0x44)) + B(_mm512_shuffle_f32x4(u[0], u[1], 0xEE));
        const B w23 = B(_mm512_shuffle_f32x4(u[2], u[3], 0x44)) + B(_mm512_shuffle_f32x4(u[2], u[3], 0xEE));
        sums[0] = B(_mm512_shuffle_f32x4(w01, w23, 0x88)) + B(_mm512_shuffle_f32x4(w01, w23, 0xDD));
    } else if constexpr (std::is_same_v<Arch, arch_avx2>) {
        unroll<G>([&](auto g) MHA_GEMM_INLINE {
            const B& lo = u[2 * g];
            const B& hi = u[2 * g + 1];
            sums[g] = B(_mm256_permute2f128_ps(lo, hi, 0x20)) + B(_mm256_permute2f128_ps(lo, hi, 0x31));
        });
    } else
#endif
    {
        unroll<G>([&](auto m) MHA_GEMM_INLINE { sums[m] = u[m]; });
    }
    unroll<G>([&](auto g) MHA_GEMM_INLINE { sums[g] = sums[g] * B(scale); });
    if constexpr (KR == 4) {
        // One 128-bit store per query row.
        unroll<QR>([&](auto m) MHA_GEMM_INLINE {
            constexpr std::size_t g = decltype(m)::value / R;
#if MHA_SIMD_X86
            constexpr std::size_t b = decltype(m)::value % R;
            if constexpr (std::is_same_v<Arch, arch_avx512>)
                _mm_storeu_ps(s + m * lds, _mm512_extractf32x4_ps(sums[g], b));
            else if constexpr (std::is_same_v<Arch, arch_avx2>)
                _mm_storeu_ps(s + m * lds, _mm256_extractf128_ps(sums[g], b));
            else
#endif
                sums[g].store_unaligned(s + m * lds);
        });
    } else {
        alignas(64) float t[G * B::size];
        unroll<G>([&](auto g) MHA_GEMM_INLINE { sums[g].store_aligned(t + g * B::size); });
        for (std::size_t m = 0; m < QR; ++m)
            for (std::size_t j = 0; j < KR; ++j) s[m * lds + j] = t[4 * m + j];
    }
}

// The column walk of a row of d elements in vectors of W: full(c) for each whole vector [c, c + W), then
// part(c, r) for the last r < W columns, if any.
template <std::size_t W, class Full, class Partial>
inline MHA_GEMM_INLINE void for_each_vector(std::size_t d, Full&& full, Partial&& part) {
    const std::size_t body = d - d % W;
    for (std::size_t c = 0; c < body; c += W) full(c);
    if (body < d) part(body, d - body);
}

// One register tile: s[m, j] for m < QR, j < KR (QR <= QB, KR <= KB; ScoresShapes says which).
template <class Arch, class T, std::size_t QR, std::size_t KR>
MHA_DECODE_TILE void scores_tile(const RowReader<Arch, T>& reader, float scale, const float* q, std::size_t ldq, const T* k,
                                 std::size_t ldk, float* s, std::size_t lds) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size, QB = DecodeTiles<Arch>::QB;
    const std::size_t d = reader.d;
    B acc[QB][4];
    unroll<QB>([&](auto m) MHA_GEMM_INLINE { unroll<4>([&](auto j) MHA_GEMM_INLINE { acc[m][j] = B(0.0f); }); });
    // One vector of columns from c on: KR key vectors, then each query vector against all of them.
    typename RowReader<Arch, T>::Row rows[KR];
    unroll<KR>([&](auto j) MHA_GEMM_INLINE { rows[j] = reader.row(k + j * ldk); });
    auto step = [&](std::size_t c, auto load_k, auto load_q) MHA_GEMM_INLINE {
        unroll<KR>([&](auto j) MHA_GEMM_INLINE { enter_block(reader, rows[j], c, false); });
        B kv[KR];
        unroll<KR>([&](auto j) MHA_GEMM_INLINE { kv[j] = load_k(rows[j], c); });
        unroll<QR>([&](auto m) MHA_GEMM_INLINE {
            const B qv = load_q(q + m * ldq + c);
            unroll<KR>([&](auto j) MHA_GEMM_INLINE { acc[m][j] = fmadd<Arch>(qv, kv[j], acc[m][j]); });
        });
    };
    for_each_vector<W>(
        d,
        [&](std::size_t c) MHA_GEMM_INLINE {
            step(c, [&reader](const auto& row, std::size_t col) MHA_GEMM_INLINE { return reader.full(row, col); },
                 [](const float* p) MHA_GEMM_INLINE { return B::load_unaligned(p); });
        },
        [&](std::size_t c, std::size_t r) MHA_GEMM_INLINE {
            const Part<Arch> part_q(r);
            step(c, [&reader, r](const auto& row, std::size_t col) MHA_GEMM_INLINE { return reader.part(row, col, r); },
                 [&part_q](const float* p) MHA_GEMM_INLINE { return part_q.load(p); });
        });
    reduce_store<Arch, QR, KR>(acc, scale, s, lds);
}

// Widens rows [0, kr) of k (row stride ldk) to floats at w (row stride ldw, a multiple of W >= d; the
// lanes of the last vector past d: 0), exactly as the kernels read them.
template <class Arch, class T>
MHA_DECODE_TILE void widen_rows(const RowReader<Arch, T>& reader, const T* k, std::size_t ldk, std::size_t kr, float* w,
                                std::size_t ldw) noexcept {
    constexpr std::size_t W = batch<Arch>::size;
    for (std::size_t i = 0; i < kr; ++i) {
        typename RowReader<Arch, T>::Row row = reader.row(k + i * ldk);
        float* out = w + i * ldw;
        for_each_vector<W>(
            reader.d,
            [&](std::size_t c) MHA_GEMM_INLINE {
                enter_block(reader, row, c, false);
                reader.full(row, c).store_aligned(out + c);
            },
            [&](std::size_t c, std::size_t r) MHA_GEMM_INLINE {
                enter_block(reader, row, c, false);
                reader.part(row, c, r).store_aligned(out + c);
            });
    }
}

// Keys at most this wide are widened once per key block (the buffer: 4 KB on the stack).
constexpr std::size_t kWidenMaxD = 256;

// Whether scores widens each key block of T once for all query_tiles tiles of Shape (widen_rows) rather than
// once per tile: where storing and reloading the floats costs less than widening again. Measured on Zen 2
// (AVX2, d 64 and 128) with tiles of 2 query rows: e4m3 (the costliest widening) gains from 2 tiles (M 4:
// 16.4 -> 12.4 ms), int8 and e5m2 from 3 (at 2, int8 loses 7-14 %, e5m2 breaks even; at 4, M 8, they gain
// 12-26 %). With AVX2's tall tiles of 4 rows: at one tile (M 4) all three lose (e4m3 10.7 -> 11.9 ms); at 2
// (M 8) e5m2 gains (13.4 -> 12.5), int8 breaks even or loses (13.1 -> 13.2-14.2 over builds), e4m3 breaks
// even. 16-bit keys lose (bf16, M 4: 6.3 -> 8.0 ms) and float keys need no widening.
template <class Arch, class T, class Shape>
constexpr bool widens_key_block_once(std::size_t query_tiles, std::size_t d) noexcept {
    if (d > kWidenMaxD || sizeof(T) != 1) return false;
    const bool tall_avx2 = std::is_same_v<Arch, arch_avx2> && Shape::rows == 4;
    const bool from_two = std::is_same_v<T, fp8_e4m3> || (std::is_same_v<T, fp8_e5m2> && tall_avx2);
    return query_tiles >= (from_two ? 2 : 3);
}

template <class Arch, class T>
using ScoresTileFn = void (*)(const RowReader<Arch, T>&, float, const float*, std::size_t, const T*, std::size_t, float*,
                              std::size_t) noexcept;

// Plain arrays (indexing them calls no std::array member, which two ISA TUs would share).
template <class Arch, class T>
struct ScoresTable {
    ScoresTileFn<Arch, T> f[DecodeTiles<Arch>::QB][DecodeTiles<Arch>::KB];  // [rows - 1][keys - 1]
};

// The tile of QR rows × KR keys where one of T's shapes holds it, else null (never called: a kernel's tiles
// are at most its shape; AVX2 keeps no 3-4 × 4 tiles, which would spill).
template <class Arch, class T, std::size_t QR, std::size_t KR>
constexpr ScoresTileFn<Arch, T> scores_entry() {
    using Shapes = ScoresShapes<Arch, T>;
    constexpr bool in_wide = QR <= Shapes::Wide::rows && KR <= Shapes::Wide::keys;
    constexpr bool in_tall = QR <= Shapes::Tall::rows && KR <= Shapes::Tall::keys;
    if constexpr (in_wide || in_tall)
        return &scores_tile<Arch, T, QR, KR>;
    else
        return nullptr;
}

template <class Arch, class T, std::size_t... I>
constexpr ScoresTable<Arch, T> make_scores_table(std::index_sequence<I...>) {
    constexpr std::size_t KB = DecodeTiles<Arch>::KB;
    ScoresTable<Arch, T> t{};
    ((t.f[I / KB][I % KB] = scores_entry<Arch, T, I / KB + 1, I % KB + 1>()), ...);
    return t;
}

// The tiles of T's shapes, for the tails of the query rows and keys.
template <class Arch, class T>
inline constexpr ScoresTable<Arch, T> kScoresTable =
    make_scores_table<Arch, T>(std::make_index_sequence<DecodeTiles<Arch>::QB * DecodeTiles<Arch>::KB>{});

// The scores of query rows [0, qr) at q against key rows [0, kr) at k into s: one tile of Shape, or of its tail.
template <class Arch, class T, class Shape>
inline MHA_GEMM_INLINE void scores_tile_of(const RowReader<Arch, T>& reader, float scale, const float* q, std::size_t ldq,
                                           std::size_t qr, const T* k, std::size_t ldk, std::size_t kr, float* s,
                                           std::size_t lds) noexcept {
    if (qr == Shape::rows && kr == Shape::keys)
        scores_tile<Arch, T, Shape::rows, Shape::keys>(reader, scale, q, ldq, k, ldk, s, lds);
    else
        kScoresTable<Arch, T>.f[qr - 1][kr - 1](reader, scale, q, ldq, k, ldk, s, lds);
}

// The scores of one key block (kr <= KB rows at k, row stride ldk) for query rows [m0, m_end) of q, into
// s[m·lds + j] (j < kr): the keys widened once into L1 and read by every query tile as floats (wide tiles).
// The same values, so the same bits, as widening them per tile (scores_tile on T). d <= kWidenMaxD.
template <class Arch, class T>
MHA_DECODE_TILE __attribute__((noinline)) void scores_block_widened(const RowReader<Arch, T>& reader, float scale,
                                                                    ConstMatrix q, std::size_t m0, std::size_t m_end,
                                                                    const T* k, std::size_t ldk, std::size_t kr, float* s,
                                                                    std::size_t lds) noexcept {
    using Shape = typename ScoresShapes<Arch, float>::Wide;
    constexpr std::size_t W = batch<Arch>::size, KB = DecodeTiles<Arch>::KB;
    alignas(64) float widened[KB * kWidenMaxD];
    const std::size_t d = reader.d, ldw = (d + W - 1) / W * W;
    widen_rows<Arch, T>(reader, k, ldk, kr, widened, ldw);
    const RowReader<Arch, float> float_reader{d, 1.0f};
    for (std::size_t m = m0; m < m_end; m += Shape::rows) {
        const std::size_t qr = min_size(Shape::rows, m_end - m);
        scores_tile_of<Arch, float, Shape>(float_reader, scale, q.data + m * q.stride, q.stride, qr, widened, ldw, kr,
                                           s + m * lds, lds);
    }
}

// All the scores s [M, n] in tiles of Shape (see decode_scores_kernel).
template <class Arch, class E, class Shape>
void scores_in_tiles(const RowReader<Arch, E>& reader, const RowStream<Arch>& stream, float scale, ConstMatrix q,
                     const BlockedRows<E>& k, Matrix s) noexcept {
    using Wide = typename ScoresShapes<Arch, float>::Wide;  // the tiles over keys widened once
    constexpr std::size_t QR = Shape::rows;
    const std::size_t M = q.rows, n = k.rows, d = q.cols, bytes = row_storage_bytes<E>(d);
    // Query rows per block: as many whole tiles as fit kScoresQueryFloats, at least one tile.
    const std::size_t MQ = max_size(QR, kScoresQueryFloats / max_size(d, 1) / QR * QR);
    for (std::size_t m0 = 0; m0 < M; m0 += MQ) {
        const std::size_t m_end = min_size(M, m0 + MQ);
        const std::size_t query_tiles = (m_end - m0 + QR - 1) / QR;
        const bool prefetch = m_end - m0 > kScoresPrefetchTiles * Wide::rows;
        const bool widen_once = widens_key_block_once<Arch, E, Shape>(query_tiles, d);
        const std::size_t KR = widen_once ? Wide::keys : Shape::keys;          // key rows per block
        const std::size_t ahead_share = (KR + query_tiles - 1) / query_tiles;  // key rows each tile reads ahead
        for (std::size_t j = 0, kr = 0; j < n; j += kr) {
            kr = min_size(KR, run_end<Arch>(k.blocks, n, j) - j);  // a key block lies within one run
            const E* kj = row_of<Arch>(k, j);
            if (m0 == 0 && d != 0) {  // the first query block reads the keys from memory
                if (prefetch)
                    for (std::size_t i = j + kr; i < min_size(n, j + kr + KR); ++i) prefetch_row_l2<Arch>(row_of<Arch>(k, i), bytes);
            }
            if (widen_once) {
                if (m0 == 0 && d != 0) read_ahead<Arch>(stream, j + stream.distance, j + stream.distance + kr);
                scores_block_widened<Arch, E>(reader, scale, q, m0, m_end, kj, k.stride, kr, s.data + j, s.stride);
                continue;
            }
            for (std::size_t m = m0; m < m_end; m += QR) {
                if (m0 == 0 && d != 0) {  // the block's read-ahead, a share per query tile
                    const std::size_t a0 = min_size((m - m0) / QR * ahead_share, kr), a1 = min_size(a0 + ahead_share, kr);
                    read_ahead<Arch>(stream, j + stream.distance + a0, j + stream.distance + a1);
                }
                const std::size_t qr = min_size(QR, m_end - m);
                scores_tile_of<Arch, E, Shape>(reader, scale, q.data + m * q.stride, q.stride, qr, kj, k.stride, kr,
                                               s.data + m * s.stride + j, s.stride);
            }
        }
    }
}

// ---- accumulate ------------------------------------------------------------------------------------

// Folded P: a chunk's scaled P is laid out [block][query row][kFoldKeys] (at most kFoldKeys keys per chunk), so
// that a tile reads every P it needs at a constant offset from one pointer.
constexpr std::size_t kFoldKeys = 64;
// Every accumulate tile of T is a multiple of kInt8Block columns wide or divides it, so vector i of a tile at
// column c0 lies in block c0 / 32 + i·W / 32.
template <class Arch, class T>
constexpr bool tiles_fit_blocks() noexcept {
    using D = DecodeTiles<Arch>;
    constexpr std::size_t a = D::NV_FEW * D::W, b = D::template nv_many<T>() * D::W;
    return (a % kInt8Block == 0 || kInt8Block % a == 0) && (b % kInt8Block == 0 || kInt8Block % b == 0);
}

// int8 V: P scaled per block, in slices of at most kFoldCols columns.
constexpr std::size_t kFoldBlocks = 16;
constexpr std::size_t kFoldCols = kFoldBlocks * kInt8Block;

// out[b·kFoldKeys + j] = the scale of block b0 + b of row j, as a float, for b < nb and j < n <= kFoldKeys (rows at
// v, ld elements apart, of d values each). One row and block at a time; AVX-512: below.
template <class Arch>
inline void chunk_block_scales(Arch, const qint8* v, std::size_t ld, std::size_t n, std::size_t d, std::size_t b0, std::size_t nb,
                               float* out, std::size_t ldo = kFoldKeys) noexcept {
    for (std::size_t j = 0; j < n; ++j)
        for (std::size_t b = 0; b < nb; ++b) out[b * ldo + j] = int8_scale_value<Arch>(v + j * ld, d, b0 + b);
}

#if defined(__AVX512F__)
// The same, four blocks of 16 rows at a time: each row's four float16 scales in one 8-byte load, eight rows to a
// zmm, a 16-bit permute of two of them per block, then one vcvtph2ps (exact, as the scalar conversion). A group's
// rows past n repeat row n − 1 (never read past the chunk): every block's lanes up to the next multiple of 16 are
// written (the last blocks, fewer than 4, one row at a time). Converting one
// scale at a time took about a fifth of the int8 P·V's instructions at d 128.
inline void chunk_block_scales(arch_avx512 arch, const qint8* v, std::size_t ld, std::size_t n, std::size_t d, std::size_t b0,
                               std::size_t nb, float* out, std::size_t ldo = kFoldKeys) noexcept {
    const unsigned char* first = reinterpret_cast<const unsigned char*>(v) + d + 2 * b0;
    std::size_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        for (std::size_t j = 0; j < n; j += 16) {
            const auto eight = [&](std::size_t j8) {  // rows j8 .. j8 + 7, four scales each: 64 bits per row
                __m128i x[4];
                for (std::size_t i = 0; i < 4; ++i) {
                    const unsigned char* lo = first + 2 * b + min_size(j8 + 2 * i, n - 1) * ld;
                    const unsigned char* hi = first + 2 * b + min_size(j8 + 2 * i + 1, n - 1) * ld;
                    x[i] = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo))),
                                                         reinterpret_cast<const double*>(hi)));
                }
                const __m256i y0 = _mm256_inserti128_si256(_mm256_castsi128_si256(x[0]), x[1], 1);
                const __m256i y1 = _mm256_inserti128_si256(_mm256_castsi128_si256(x[2]), x[3], 1);
                return _mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1);
            };
            const __m512i z0 = eight(j), z1 = eight(j + 8);
            for (std::size_t k = 0; k < 4; ++k) {
                // Lane i < 16: the 16-bit element 4·i + k of z0:z1 (row j + i, block b + k).
                const __m512i idx = _mm512_add_epi16(_mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 60, 56, 52, 48,
                                                                      44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0),
                                                     _mm512_set1_epi16(static_cast<short>(k)));
                const __m256i h = _mm512_castsi512_si256(_mm512_permutex2var_epi16(z0, idx, z1));
                _mm512_storeu_ps(out + (b + k) * ldo + j, _mm512_cvtph_ps(h));
            }
        }
    }
    if (b < nb) {
        chunk_block_scales<arch_avx512>(arch, v, ld, n, d, b0 + b, nb - b, out + b * ldo, ldo);
        for (; b < nb; ++b)  // as above: the lanes past n up to a multiple of 16 repeat row n − 1
            for (std::size_t j = n; j % 16 != 0; ++j) out[b * ldo + j] = out[b * ldo + n - 1];
    }
}
#endif

// out[(b·mr + i)·kFoldKeys + j] = p[i·ldp + j]·s[b·kFoldKeys + j] for b < nb, i < mr, j < n <= kFoldKeys (one
// product: the bits of p·s).
template <class Arch>
inline void scale_rows(const float* p, std::size_t ldp, std::size_t mr, std::size_t n, const float* s, std::size_t nb,
                       float* out) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size;
    const std::size_t full = n / W * W;
    const Part<Arch> part(n - full);
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t i = 0; i < mr; ++i) {
            const float* pi = p + i * ldp;
            const float* sb = s + b * kFoldKeys;
            float* oi = out + (b * mr + i) * kFoldKeys;
            for (std::size_t j = 0; j < full; j += W) (B::load_unaligned(pi + j) * B::load_unaligned(sb + j)).store_unaligned(oi + j);
            if (full != n) part.store(part.load(pi + full) * part.load(sb + full), oi + full);
        }
}

// One register tile: o[m, c] += Σ_{j < n} p[m, j]·v[j, c] for m < MR, c < NF·W + (P ? r : 0).
// v: the rows' starts; the tile's columns start at c0 of them. Where T's scales fold into P (int8), v is read
// unscaled and p holds one P per block of 32 columns, [block][MR][kFoldKeys] (column c reads block c / 32's; ldp
// unused).
template <class Arch, class T, std::size_t MR, std::size_t NF, bool P>
MHA_DECODE_TILE void accumulate_tile(const AccumulateReader<Arch, T>& reader, std::size_t n, const float* p, std::size_t ldp,
                                     const T* v, std::size_t ldv, std::size_t c0, float* o, std::size_t ldo,
                                     std::size_t r, const RowPlan<Arch>& plan) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size, NA = NF + (P ? 1 : 0);
    // Folded: vector i reads the P of block c0 / 32 + i·W / 32, at (that block − c0 / 32)·MR·kFoldKeys from p.
    if constexpr (kFoldsScaleIntoP<T>) {
        static_assert(tiles_fit_blocks<Arch, T>());
        p += c0 / kInt8Block * MR * kFoldKeys;
    }
    const Part<Arch> part(P ? r : 1);
    auto load_o = [&](const float* x, auto i) MHA_GEMM_INLINE {
        if constexpr (P && decltype(i)::value == NF)
            return part.load(x + NF * W);
        else
            return B::load_unaligned(x + decltype(i)::value * W);
    };
    auto load_v = [&](const auto& row, auto i) MHA_GEMM_INLINE {
        if constexpr (P && decltype(i)::value == NF)
            return reader.part(row, c0 + NF * W, r);
        else
            return reader.full(row, c0 + decltype(i)::value * W);
    };
    B acc[MR][NA];
    unroll<MR>([&](auto m) MHA_GEMM_INLINE {
        unroll<NA>([&](auto i) MHA_GEMM_INLINE { acc[m][i] = load_o(o + m * ldo, i); });
    });
    const std::size_t n_ahead = plan.n_ahead, n_prefetch = plan.n_prefetch;
    for (std::size_t j = 0; j < n; ++j) {
        if (j < n_ahead) read_ahead<Arch>(*plan.stream, plan.ahead_first + j, plan.ahead_first + j + 1);
        if (j < n_prefetch) prefetch_row_l2<Arch>(plan.prefetch + j * plan.ld, plan.bytes);
        B vv[NA];
        typename AccumulateReader<Arch, T>::Row row = reader.row(v);
        unroll<NA>([&](auto i) MHA_GEMM_INLINE {
            enter_block(reader, row, c0 + decltype(i)::value * W, decltype(i)::value == 0);
            vv[i] = load_v(row, i);
        });
        unroll<MR>([&](auto m) MHA_GEMM_INLINE {
            if constexpr (kFoldsScaleIntoP<T>) {
                unroll<NA>([&](auto i) MHA_GEMM_INLINE {
                    constexpr std::size_t at = (decltype(i)::value * W / kInt8Block * MR + decltype(m)::value) * kFoldKeys;
                    acc[m][i] = fmadd<Arch>(B(p[at]), vv[i], acc[m][i]);
                });
            } else {
                const B pm(p[m * ldp]);
                unroll<NA>([&](auto i) MHA_GEMM_INLINE { acc[m][i] = fmadd<Arch>(pm, vv[i], acc[m][i]); });
            }
        });
        p += 1;
        v += ldv;
    }
    unroll<MR>([&](auto m) MHA_GEMM_INLINE {
        unroll<NA>([&](auto i) MHA_GEMM_INLINE {
            if constexpr (P && decltype(i)::value == NF)
                part.store(acc[m][i], o + m * ldo + NF * W);
            else
                acc[m][i].store_unaligned(o + m * ldo + i * W);
        });
    });
}

template <class Arch, class T>
using AccumulateTileFn = void (*)(const AccumulateReader<Arch, T>&, std::size_t, const float*, std::size_t, const T*,
                                  std::size_t, std::size_t, float*, std::size_t, std::size_t, const RowPlan<Arch>&) noexcept;

template <class Arch, class T>
struct AccumulateTable {
    // [rows - 1][full vectors][partial vector]; null where there is no such tile (no columns, more than
    // nv_many<T>() vectors with more than FEW_ROWS rows, more than NV_FEW vectors).
    AccumulateTileFn<Arch, T> f[DecodeTiles<Arch>::MB][DecodeTiles<Arch>::NV_MAX + 1][2];
};

template <class Arch, class T, std::size_t MR, std::size_t NF, bool P>
constexpr AccumulateTileFn<Arch, T> accumulate_entry() {
    using D = DecodeTiles<Arch>;
    if constexpr (NF + P == 0 || NF + P > (MR <= D::FEW_ROWS ? D::NV_FEW : D::template nv_many<T>()))
        return nullptr;
    else
        return &accumulate_tile<Arch, T, MR, NF, P>;
}

template <class Arch, class T, std::size_t... I>
constexpr AccumulateTable<Arch, T> make_accumulate_table(std::index_sequence<I...>) {
    constexpr std::size_t C = 2 * (DecodeTiles<Arch>::NV_MAX + 1);
    AccumulateTable<Arch, T> t{};
    ((t.f[I / C][I % C / 2][I % 2] = accumulate_entry<Arch, T, I / C + 1, I % C / 2, I % 2 != 0>()), ...);
    return t;
}

// The register tiles of the dot-product P·V kernels over g rows from row j0 (a group or chunk): query rows in tiles
// of up to 4 (query_tile(m0, mr) first), then columns in tiles of 64 (32 at the end of d, a multiple of 32):
// tile(MR, blocks, m0, c, stream, ahead_first, ahead_rows) with MR an integral_constant and blocks (2 or 1) the
// tile's 32-column blocks.
// The first query tile reads the rows ahead ([ahead_first, + ahead_rows) of `stream`), a share per column tile;
// the others get no stream (null).
template <class Arch, class QueryTile, class Tile>
inline __attribute__((always_inline)) void pv_tiles(std::size_t M, std::size_t d, std::size_t j0, std::size_t g,
                                                    const RowStream<Arch>& stream, QueryTile&& query_tile, Tile&& tile) {
    const std::size_t tiles = (d + 63) / 64, share = (g + tiles - 1) / tiles;
    for (std::size_t m0 = 0; m0 < M; m0 += 4) {
        const std::size_t mr = min_size(4, M - m0);
        query_tile(m0, mr);
        for (std::size_t c = 0; c < d; c += 64) {
            const std::size_t nb = c + 64 <= d ? 2 : 1;
            const std::size_t lo = min_size(g, c / 64 * share), hi = min_size(g, lo + share);
            const RowStream<Arch>* rs = m0 == 0 ? &stream : nullptr;
            const std::size_t af = j0 + stream.distance + lo;
            switch (mr) {
                case 1: tile(std::integral_constant<std::size_t, 1>{}, nb, m0, c, rs, af, hi - lo); break;
                case 2: tile(std::integral_constant<std::size_t, 2>{}, nb, m0, c, rs, af, hi - lo); break;
                case 3: tile(std::integral_constant<std::size_t, 3>{}, nb, m0, c, rs, af, hi - lo); break;
                default: tile(std::integral_constant<std::size_t, 4>{}, nb, m0, c, rs, af, hi - lo); break;
            }
        }
    }
}

}  // namespace decode_detail
}  // namespace mha::simd

#include "decode_int8_dot_impl.hpp"  // decode_detail::scores_int8_dot
#include "decode_int8_pv_impl.hpp"   // decode_detail::accumulate_int8_dot
#include "decode_bf16_dot_impl.hpp"  // decode_detail::scores_bf16_dot, accumulate_bf16_dot

namespace mha::simd {

template <class Arch, class E>
void decode_scores_kernel::operator()(Arch, float scale, ConstMatrix q, BlockedRows<E> k, Matrix s,
                                      const RowsAhead& ahead, float kv_scale) const noexcept {
    using namespace decode_detail;
    using Shapes = ScoresShapes<Arch, E>;
    const std::size_t M = q.rows, d = q.cols;
    const RowReader<Arch, E> reader{d, kv_scale};
    const RowStream<Arch> stream = row_stream<Arch>(k, row_storage_bytes<E>(d), ahead, kAheadBytes, kAheadMaxRows);
    if (M != 0 && d != 0) read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
    if constexpr (std::is_same_v<Arch, arch_avx512> && std::is_same_v<E, qint8>) {
        if (int8_scores_on_dot_products(M, d)) return scores_int8_dot<Arch>(scale, q, k, s, stream);
    }
    if (M > 2)
        scores_in_tiles<Arch, E, typename Shapes::Tall>(reader, stream, scale, q, k, s);
    else
        scores_in_tiles<Arch, E, typename Shapes::Wide>(reader, stream, scale, q, k, s);
}

template <class Arch, class E>
void decode_accumulate_kernel::operator()(Arch, ConstMatrix p, BlockedRows<E> v, Matrix o,
                                          const RowsAhead& ahead, float kv_scale) const noexcept {
    using namespace decode_detail;
    using T = DecodeTiles<Arch>;
    constexpr std::size_t W = T::W, MB = T::MB;
    static constexpr AccumulateTable<Arch, E> table =
        make_accumulate_table<Arch, E>(std::make_index_sequence<MB * (T::NV_MAX + 1) * 2>{});
    const std::size_t M = o.rows, n = v.rows, d = o.cols;
    if (M == 0 || n == 0 || d == 0) return;
    const AccumulateReader<Arch, E> reader = [&] {
        if constexpr (kFoldsScaleIntoP<E>)
            return AccumulateReader<Arch, E>{};
        else
            return AccumulateReader<Arch, E>{d, kv_scale};
    }();
    const RowStream<Arch> stream = row_stream<Arch>(v, row_storage_bytes<E>(d), ahead, kAheadBytes, kAheadMaxRows);
    read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
    if constexpr (std::is_same_v<Arch, arch_avx512> && std::is_same_v<E, qint8>) {
        if (int8_values_on_dot_products(d)) return accumulate_int8_dot<Arch>(p, v, o, stream);
    }
    // int8: columns in slices of at most kFoldCols (d up to that in one), P scaled per block into `scaled`.
    alignas(64) float block_scale[kFoldsScaleIntoP<E> ? kFoldBlocks * kFoldKeys : 1];
    alignas(64) float scaled[kFoldsScaleIntoP<E> ? kFoldBlocks * MB * kFoldKeys : 1];
    for (std::size_t cl = 0; cl < d; cl += kFoldsScaleIntoP<E> ? kFoldCols : d) {
        const std::size_t ch = kFoldsScaleIntoP<E> ? min_size(d, cl + kFoldCols) : d, dc = ch - cl;
        const std::size_t nb = (dc + kInt8Block - 1) / kInt8Block;  // int8 blocks of the slice
        const std::size_t full = dc / W, r = dc % W;  // whole vectors per row, then r columns
        // Vectors per column tile. Float V stays on NV: it is memory-bound, and wider tiles read ahead in bigger
        // bursts (f32, M 1, d 64: 10.7 -> 11.9 ms on Zen 2).
        constexpr std::size_t NV_MANY = T::template nv_many<E>();
        const std::size_t NV = M <= T::FEW_ROWS && !std::is_same_v<E, float> ? T::NV_FEW : NV_MANY;
        const std::size_t blocks = full / NV;      // column tiles of NV whole vectors
        const std::size_t tail_full = full - blocks * NV;
        const std::size_t query_tiles = (M + MB - 1) / MB;
        const std::size_t tiles = query_tiles * (blocks + (tail_full != 0 || r != 0 ? 1 : 0));  // per chunk
        const bool few = query_tiles <= kFewQueryTiles;
        std::size_t J = max_size(4, few ? kChunkBytesFew / row_storage_bytes<E>(d) : kChunkFloatsMany / d);  // V rows per chunk
        if constexpr (kFoldsScaleIntoP<E>) J = min_size(J, kFoldKeys);
        for (std::size_t j0 = 0, jn = 0; j0 < n; j0 += jn) {
            jn = min_size(J, run_end<Arch>(v.blocks, n, j0) - j0);  // a chunk lies within one run
            const E* vj = row_of<Arch>(v, j0);
            if constexpr (kFoldsScaleIntoP<E>) {  // the chunk's block scales, block-major
                chunk_block_scales(Arch{}, vj, v.stride, jn, d, cl / kInt8Block, nb, block_scale);
            }
            // The next chunk's rows (within its run), prefetched a share per tile when compute-bound.
            const std::size_t next = few || j0 + jn >= n ? 0 : min_size(J, run_end<Arch>(v.blocks, n, j0 + jn) - j0 - jn);
            const std::size_t share = (next + tiles - 1) / tiles;
            const std::size_t ahead_share = (jn + tiles - 1) / tiles;  // rows each tile reads ahead
            std::size_t t = 0;  // tiles of this chunk so far
            auto plan = [&]() {
                RowPlan<Arch> rp;
                rp.ld = v.stride * sizeof(E);
                rp.bytes = row_storage_bytes<E>(d);
                {  // the chunk's read-ahead (as many rows as it has), a share per tile
                    const std::size_t a0 = min_size(t * ahead_share, jn);
                    rp.stream = &stream;
                    rp.ahead_first = j0 + stream.distance + a0;
                    rp.n_ahead = min_size(ahead_share, jn - a0);
                }
                const std::size_t first = min_size(t * share, next);
                rp.n_prefetch = min_size(min_size(share, next - first), jn);
                if (rp.n_prefetch != 0) rp.prefetch = reinterpret_cast<const char*>(row_of<Arch>(v, j0 + jn + first));
                ++t;
                return rp;
            };
            for (std::size_t m = 0; m < M; m += MB) {
                const std::size_t mr = min_size(MB, M - m);
                const float* pm = p.data + m * p.stride + j0;
                std::size_t ldp = p.stride;
                if constexpr (kFoldsScaleIntoP<E>) {  // P of block b, row mm: scaled[(b·mr + mm)·kFoldKeys + jj] = p·s_b
                    scale_rows<Arch>(pm, p.stride, mr, jn, block_scale, nb, scaled);
                    pm = scaled;
                    ldp = kFoldKeys;
                }
                float* om = o.data + m * o.stride + cl;
                const E* vc = vj + cl;
                for (std::size_t b = 0; b < blocks; ++b) {
                    const std::size_t c = b * NV * W;
                    const RowPlan<Arch> rp = plan();
                    if (mr == MB && NV == NV_MANY)
                        accumulate_tile<Arch, E, MB, NV_MANY, false>(reader, jn, pm, ldp, vc, v.stride, c, om + c, o.stride, 0, rp);
                    else
                        table.f[mr - 1][NV][0](reader, jn, pm, ldp, vc, v.stride, c, om + c, o.stride, 0, rp);
                }
                if (tail_full != 0 || r != 0) {
                    const std::size_t c = blocks * NV * W;
                    const RowPlan<Arch> rp = plan();
                    table.f[mr - 1][tail_full][r != 0](reader, jn, pm, ldp, vc, v.stride, c, om + c, o.stride, r, rp);
                }
            }
        }
    }
}

template <class Arch, class E>
void decode_scores_bf16_kernel::operator()(Arch arch, float scale, ConstMatrix q, BlockedRows<E> k, Matrix s,
                                           const RowsAhead& ahead, float kv_scale) const noexcept {
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        using namespace decode_detail;
        if (k.rows != 0 && runs_on_bf16_dot_products<E>(q.rows, q.cols)) {
            const RowStream<Arch> stream = row_stream<Arch>(k, row_storage_bytes<E>(q.cols), ahead, kAheadBytes, kAheadMaxRows);
            read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
            return scores_bf16_dot<Arch, E>(scale, q, k, s, stream, kv_scale);
        }
    }
    decode_scores_kernel{}(arch, scale, q, k, s, ahead, kv_scale);
}

template <class Arch, class E>
void decode_accumulate_bf16_kernel::operator()(Arch arch, ConstMatrix p, BlockedRows<E> v, Matrix o,
                                               const RowsAhead& ahead, float kv_scale) const noexcept {
    if constexpr (std::is_same_v<Arch, arch_avx512>) {
        using namespace decode_detail;
        if (v.rows != 0 && runs_on_bf16_dot_products<E>(o.rows, o.cols)) {
            const RowStream<Arch> stream = row_stream<Arch>(v, row_storage_bytes<E>(o.cols), ahead, kAheadBytes, kAheadMaxRows);
            read_ahead<Arch>(stream, 0, stream.distance);  // usually in flight already
            return accumulate_bf16_dot<Arch, E>(p, v, o, stream, kv_scale);
        }
    }
    decode_accumulate_kernel{}(arch, p, v, o, ahead, kv_scale);
}

}  // namespace mha::simd
