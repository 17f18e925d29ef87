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

}  // namespace mha::simd
