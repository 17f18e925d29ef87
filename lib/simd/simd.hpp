// The SIMD backend's kernels (xsimd), dispatched at run time to the best ISA allowed by
// mha::active_isa(). Same contracts as lib/reference/reference.hpp. Unchecked and noexcept:
// the public API validates first. Single-threaded; callers may run them on many threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mha/half.hpp"
#include "mha/isa.hpp"
#include "mha/view.hpp"
#include "mask_row.hpp"
#include "rows_ahead.hpp"
#include "../core/element_format.hpp"

namespace mha::simd {

// Pack buffers one GEMM call may use (only when op(B) is not prepacked, or op(A) = Aᵀ): a caller-owned
// region, so the kernels never allocate. gemm_scratch_bound says how many floats a call needs.
struct GemmScratch {
    float* a = nullptr;  // 64-byte aligned
    std::size_t a_floats = 0;
    float* b = nullptr;  // 64-byte aligned
    std::size_t b_floats = 0;
};
struct GemmScratchSize {
    std::size_t a_floats = 0, b_floats = 0;
};
// Floats of each pack buffer that any gemm call on isa needs with op(A) [m', k'], op(B) [k', n'] for
// m' <= m, n' <= n, k' <= k and the given transposes (gemm_packed and gemm_panels with ta == no need none).
GemmScratchSize gemm_scratch_bound(Isa isa, std::size_t m, std::size_t n, std::size_t k, Trans ta, Trans tb) noexcept;

// C = alpha·op(A)·op(B) + beta·C; beta == 0 does not read C. Pack buffers from `scratch`, which must
// hold gemm_scratch_bound(active_isa(), M, N, K, ta, tb).
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
          const GemmScratch& scratch) noexcept;
// The same with pack buffers leased from the scratch pool for this call (may throw std::bad_alloc).
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c);

// Same contract as reference::softmax_row.
// Masks: additive floats or bytes (mask_row.hpp), each holding n_valid entries, or none. mods: the score
// modifiers applied to scale·x_j before the masks (ScoreRowModifiers; default none).
void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0, MaskRow mask1,
                 ScoreRowModifiers mods = {}) noexcept;

// One key tile of the online softmax (fused attention): on x[0, n), z_j = mods(scale·x_j) + mask0_j + mask1_j
// for j < n_valid (masks may be null, mods none); running_max becomes max(running_max, max_j z_j); then
// x_j = exp(z_j − running_max) for j < n_valid and 0 for j >= n_valid (every x_j = 0 while running_max
// is still -inf; the sum is then NaN if a z_j was NaN, else 0). Returns Σ_j x_j. The caller rescales its earlier sums by exp(old_max − running_max).
float softmax_tile_online(float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0, MaskRow mask1,
                          float& running_max, ScoreRowModifiers mods = {}) noexcept;

// x[0, n) *= alpha (the online softmax's rescale of an accumulator row when the max grows): the bits of the plain loop.
void scale_row(float* x, std::size_t n, float alpha) noexcept;

// The score modifiers alone on x[0, n) (what the softmax kernels apply before the masks; for tests and any path
// that needs modified scores without a softmax).
void modify_scores(float* x, std::size_t n, ScoreRowModifiers mods) noexcept;

// Same contract as reference::layernorm_row.
void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept;

// op(B) [K, N] packed once into the microkernel's panel layout (for constant weights), for the ISA
// active when it was packed. Immutable after construction: share it across threads.
// With `segments` > 1, the N columns are `segments` equal blocks (N % segments == 0), each padded to whole
// panels, so one block is a valid B operand on its own (nn.MultiheadAttention's in_proj [3E, E] holds
// Wq, Wk, Wv: one packed copy serves the fused Q/K/V GEMM and the three separate ones). From parts, each
// part is one segment of its own width (Wq [H·d, E], Wk and Wv [Hkv·d, E]); all parts share K.
// PanelElement::bf16 stores each value rounded to bfloat16 (nearest even), the same panels at half the bytes:
// the microkernel widens them exactly in registers, so a GEMM gives the bits of f32 panels holding the rounded
// values (bf16 compute without AVX512_BF16: the projections stream half the weight bytes).
enum class PanelElement { f32, bf16 };
class PackedMatrix {
public:
    PackedMatrix();
    // Both allocate (may throw std::bad_alloc).
    PackedMatrix(ConstMatrix b, Trans tb, std::size_t segments = 1, PanelElement element = PanelElement::f32);
    PackedMatrix(const std::vector<ConstMatrix>& parts, Trans tb, PanelElement element = PanelElement::f32);  // parts non-empty
    ~PackedMatrix();
    PackedMatrix(PackedMatrix&&) noexcept;
    PackedMatrix& operator=(PackedMatrix&&) noexcept;
    std::size_t k() const noexcept;
    std::size_t n() const noexcept;
    Isa isa() const noexcept;
    std::size_t bytes() const noexcept;  // the packed data, padding included
    PanelElement element() const noexcept;
    // Columns of segments [first, first + count) as a B operand. More than one segment only when they
    // are contiguous (segments_contiguous(): the segment width is a multiple of the panel width).
    // A block of whole panels: op(B) columns [panel0·nr, panel0·nr + n) of every k-block. k-block b
    // starts at data + pc_b·pitch (pc_b its first row); panel p of it at + p·kcb·nr.
    // The panels are at data (f32) or at data16 (bf16 bits), the other null; offsets count elements.
    struct View {
        const float* data = nullptr;
        const std::uint16_t* data16 = nullptr;
        std::size_t k = 0, n = 0, kc = 0, nr = 0, pitch = 0, panel0 = 0;
        Isa isa = Isa::sse2;
    };
    View segments(std::size_t first, std::size_t count) const noexcept;
    View all() const noexcept;
    // Columns [c0, c0 + count) of a view (c0 a multiple of v.nr, c0 + count <= v.n): a B operand that lets
    // callers split N across threads (few-token projections stream each weight once, all cores busy).
    static View columns(const View& v, std::size_t c0, std::size_t count) noexcept {
        View r = v;
        r.n = count;
        r.panel0 = v.panel0 + c0 / v.nr;
        return r;
    }
    std::size_t segment_count() const noexcept;
    bool segments_contiguous() const noexcept;
    // Writes op(B) back as a row-major matrix: dst [K, N] (tb == no) or its transpose [N, K] (tb == yes).
    // The values are the packed ones, exactly.
    void unpack(Matrix dst, Trans tb) const noexcept;
    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// C = alpha·op(A)·B + beta·C, then C[i, j] += bias[j] when bias != nullptr. B prepacked; op(A) is
// [M, K] with K == b.k, C is [M, b.n]. Callers split M across threads (same B, disjoint rows of C).
// ta == no needs no scratch and never allocates; ta == yes leases the A pack buffer when `scratch` lacks it
// (gemm_scratch_bound), and may then throw std::bad_alloc.
void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix::View& b, float beta, const float* bias,
                 Matrix c, const GemmScratch& scratch = {});
inline void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix& b, float beta, const float* bias,
                        Matrix c, const GemmScratch& scratch = {}) {
    gemm_packed(alpha, a, ta, b.all(), beta, bias, c, scratch);
}

// A B operand the caller packed once into the microkernel's panel layout for one ISA (the fused attention
// path packs each head's Kᵀ and V once per forward and then multiplies tiles of them in place).
// op(B) [k, n] is cut into ceil(n / NR) panels of NR columns (NR = panel_width(isa)); panel p holds
// op(B)[r, p·NR + j] at data[p·panel_stride + r·NR + j], columns past n are zero. panel_stride >= k·NR
// and a multiple of 16 floats; data 64-byte aligned.
struct PanelMatrix {
    const float* data;
    std::size_t k, n, panel_stride;
    Isa isa;
    // Rows [r0, r0 + count) of op(B): the same panels, started r0 rows in.
    PanelMatrix rows(std::size_t r0, std::size_t count) const noexcept {
        return {data + r0 * panel_width(isa), count, n, panel_stride, isa};
    }
    // Columns [c0, c0 + count) of op(B); c0 must be a multiple of NR.
    PanelMatrix columns(std::size_t c0, std::size_t count) const noexcept {
        return {data + c0 / panel_width(isa) * panel_stride, k, count, panel_stride, isa};
    }
    static std::size_t panel_width(Isa isa) noexcept;
    // The smallest valid panel_stride for k rows, and the floats that n columns of it take.
    static std::size_t min_panel_stride(Isa isa, std::size_t k) noexcept {
        return (k * panel_width(isa) + 15) / 16 * 16;
    }
    static std::size_t floats(Isa isa, std::size_t n, std::size_t panel_stride) noexcept {
        return (n + panel_width(isa) - 1) / panel_width(isa) * panel_stride;
    }
};

// Packs op(B) [K, N] into the panels of a PanelMatrix {dst, K, N, panel_stride, isa}. A caller may pack
// a row block r0.. of a larger PanelMatrix by passing dst + r0·NR (then r0·NR·4 bytes must keep dst
// 64-byte aligned: r0 a multiple of 16 does), or a column block by passing dst + (c0 / NR)·panel_stride.
void pack_panels(Isa isa, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) noexcept;

// C = alpha·op(A)·B + beta·C with B in panels (c.cols == b.n, op(A) [c.rows, b.k]); same summation order
// per element as gemm, so results do not depend on how the caller splits M. Scratch as for gemm_packed.
void gemm_panels(float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c,
                 const GemmScratch& scratch = {});

// The two kernels of a decode step (a few query rows against a tile of a KV cache read in place; the
// cache rows stream from memory once). Row-major views with row strides; M = q.rows, n = k.rows,
// d = q.cols. Nothing at or past row n of k / v, column d of q / k / v or column n of p is read (the tile
// may end at the end of a mapping), and nothing outside s / o is written. Any M, n, d >= 0.
// Summation order depends on the ISA and d (scores) or n (accumulate) only: each result element is
// bitwise the same whatever M is, wherever the element sits in s / o, and however the rows are split
// across calls; repeated calls give bitwise equal results. No allocation; single-threaded.

// K and V may be of any KV element type (float, bfloat16, float16, qint8, fp8_e4m3, fp8_e5m2; strides in
// elements): they are widened to float as they are loaded, to exactly ElementFormat::widen's values, and the
// arithmetic and its order are those of float K / V holding the widened values (bitwise the same results).
// Except int8 V: decode_accumulate folds each row's block scales into P, o[m, c] += Σ_j fl(p[m, j]·s_j,b)·q[j, c]
// (b = c / 32; the order as for float V): one product per block and query row instead of one per element (int8
// accumulate, M 4 / 8 / 32, d 128, from memory on one Zen 5 core: 6 / 13 / 23 % faster). That is one more
// rounding per term (relative 2^-24) than float V holding q·s_b; p·s_b must not overflow (p <= 1 never does).

// One overload of each per element type of MHA_KV_ELEMENT_TYPES (lib/core/element_format.hpp):
// decode_scores: s[m, j] = scale·Σ_c q[m, c]·k[j, c]: q [M, d], k [n, d], s [M, n] (written, not read).
// decode_accumulate: o[m, c] += Σ_j p[m, j]·v[j, c], summed in order j = 0, 1, ..., n − 1 onto o (so
// splitting the rows of v into consecutive calls gives bitwise the same o): p [M, n], v [n, d], o [M, d].
// n == 0 leaves o untouched.
// ahead: the rows the caller reads next (rows_ahead.hpp), prefetched as the kernel nears the end of its own;
// it changes no result. kv_scale: the tensor scale of fp8 rows (k_scale / v_scale; ignored by the other types).
// int8 rows (mha/quantized.hpp) hold d values then their scales: the view's stride covers both, its cols are d.
// int8 K on AVX512_VNNI: decode_scores may use integer dot products instead (int8_scores_on_dot_products, decode.hpp);
// int8 V likewise decode_accumulate (int8_values_on_dot_products: P rounded to int16 per group of 64 keys at fixed
// positions of v.origin, so splitting the rows into calls keeps the bits only at those positions).

#define MHA_DECODE_DECLARE_(name, E)                                                                              \
    void decode_scores(float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead = {},   \
                       float kv_scale = 1.0f) noexcept;                                                           \
    void decode_accumulate(ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead = {},            \
                           float kv_scale = 1.0f) noexcept;
MHA_KV_ELEMENT_TYPES(MHA_DECODE_DECLARE_)
#undef MHA_DECODE_DECLARE_

// bf16 compute over a bf16 cache, an f32 cache holding bf16 values, or an fp8 cache (whose codes are all bf16
// values; kv_scale its tensor scale, 1 for the others): the same two products with q, p and the rows rounded to
// bf16 (nearest even; exact where they hold bf16 values already), on vdpbf16ps where
// bf16_decode_on_dot_products(M, d) holds (decode.hpp; the summation order and bit-for-bit guarantees:
// lib/simd/decode_bf16_dot_impl.hpp; a bf16 row and an f32 row of its values give the same bits), else
// decode_scores / decode_accumulate above on q, p and the rows as given.
#define MHA_DECODE_BF16_DECLARE_(E)                                                                               \
    void decode_scores_bf16(float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead = {},  \
                            float kv_scale = 1.0f) noexcept;                                                      \
    void decode_accumulate_bf16(ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead = {},           \
                                float kv_scale = 1.0f) noexcept;
MHA_DECODE_BF16_DECLARE_(bfloat16)
MHA_DECODE_BF16_DECLARE_(float)
MHA_DECODE_BF16_DECLARE_(fp8_e4m3)
MHA_DECODE_BF16_DECLARE_(fp8_e5m2)
#undef MHA_DECODE_BF16_DECLARE_

}  // namespace mha::simd
