// The scalar reference: plain loops that read like the math. It defines every result the library
// computes; the SIMD backend is tested against it. Compiled without auto-vectorization.
// Preconditions (checked by the public API, not here): shapes agree, pointers valid, no overlap
// unless stated.
#pragma once
#include <cstddef>

#include "mha/attention.hpp"
#include "mha/kernels.hpp"
#include "mha/view.hpp"

namespace mha::reference {

// C = alpha·op(A)·op(B) + beta·C; beta == 0 does not read C.
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept;

// In place on x[0, n): z_j = scale·x_j + mask0_j + mask1_j for j < n_valid (masks may be null), and
// z_j = -inf where a mask entry is -inf (a masked entry's x does not matter, even NaN);
// x_j = exp(z_j − max z) / Σ exp(z − max z) for j < n_valid, 0 for j >= n_valid.
// If every z_j is -inf (or n_valid == 0) the whole row becomes 0; if every z_j is -inf or NaN and
// at least one is NaN, entries below n_valid become NaN (a NaN is never mistaken for a masked row).
void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                 const float* mask1) noexcept;

// y = gamma·(z − mean)/sqrt(var + eps) + beta with z = x (+ residual), biased var, two passes,
// accumulated in double with one rounding at the end (a constant row gives exactly beta).
// gamma/beta/residual may be null (ones/zeros/none). y may alias x or residual.
void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept;

// Multi-head attention as documented in mha/attention.hpp. w: every pointer non-null except the
// norm ones. Inputs validated by the caller; key/value already resolved (non-null).
// Allocates its own scratch. Writes out.output (and out.attn_weights if requested).
void multihead_attention(const AttentionWeights& w, std::size_t embed_dim, std::size_t num_heads,
                         const AttentionInputs& in, const AttentionOutputs& out, const ForwardOptions& opt);

}  // namespace mha::reference
