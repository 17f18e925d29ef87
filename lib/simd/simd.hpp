// The SIMD backend's kernels (xsimd), dispatched at run time to the best ISA allowed by
// mha::active_isa(). Same contracts as lib/reference/reference.hpp. Unchecked and noexcept:
// the public API validates first. Single-threaded; callers may run them on many threads at once.
#pragma once
#include <cstddef>
#include <memory>

#include "mha/isa.hpp"
#include "mha/kernels.hpp"
#include "mha/view.hpp"

namespace mha::simd {

// C = alpha·op(A)·op(B) + beta·C; beta == 0 does not read C.
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept;

// Same contract as reference::softmax_row.
void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                 const float* mask1) noexcept;

// One key tile of the online softmax (fused attention): on x[0, n), z_j = scale·x_j + mask0_j + mask1_j
// for j < n_valid (masks may be null); running_max becomes max(running_max, max_j z_j); then
// x_j = exp(z_j − running_max) for j < n_valid and 0 for j >= n_valid (every x_j = 0 while running_max
// is still -inf; the sum is then NaN if a z_j was NaN, else 0). Returns Σ_j x_j. The caller rescales its earlier sums by exp(old_max − running_max).
float softmax_tile_online(float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                          const float* mask1, float& running_max) noexcept;

// Same contract as reference::layernorm_row.
void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept;

// op(B) [K, N] packed once into the microkernel's panel layout (for constant weights), for the ISA
// active when it was packed. Immutable after construction: share it across threads.
class PackedMatrix {
public:
    PackedMatrix();
    PackedMatrix(ConstMatrix b, Trans tb);  // allocates; the only allocation of the packed path
    ~PackedMatrix();
    PackedMatrix(PackedMatrix&&) noexcept;
    PackedMatrix& operator=(PackedMatrix&&) noexcept;
    std::size_t k() const noexcept;
    std::size_t n() const noexcept;
    Isa isa() const noexcept;
    struct Impl;
    const Impl& impl() const noexcept { return *impl_; }

private:
    std::unique_ptr<Impl> impl_;
};

// C = alpha·op(A)·B + beta·C, then C[i, j] += bias[j] when bias != nullptr. B prepacked; op(A) is
// [M, K] with K == b.k(), C is [M, b.n()]. Callers split M across threads (same B, disjoint rows of C).
void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix& b, float beta, const float* bias,
                 Matrix c) noexcept;

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
// per element as gemm, so results do not depend on how the caller splits M.
void gemm_panels(float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c) noexcept;

}  // namespace mha::simd
