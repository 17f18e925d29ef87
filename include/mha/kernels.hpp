// The kernels attention is built from, callable on their own: matrix multiply, row softmax and
// row layernorm. Each checks its arguments and throws mha::invalid_argument (message naming the
// argument and the values) before writing anything. Single-threaded; they never spawn threads.
#pragma once
#include <cstddef>

#include "mha/isa.hpp"
#include "mha/view.hpp"

namespace mha {

// Backend (scalar reference or SIMD): mha/isa.hpp.
// Trans (op(X) = X or Xᵀ): mha/view.hpp.

// C = alpha · op(A) · op(B) + beta · C.
//   op(A) is [M, K], op(B) is [K, N], C is [M, N]; every view row-major with its own stride.
//   Ta == yes means A is stored as [K, M]; Tb == yes means B is stored as [N, K] (the nn.Linear layout:
//   y = x · Wᵀ is gemm(1, x, no, W, yes, 0, y)).
//   beta == 0 overwrites C without reading it (C may hold NaN). C must not overlap A or B.
void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
          Backend backend = Backend::simd);

// The same with op(A) and op(B) rounded to bfloat16 (nearest even, mha/half.hpp) and fp32 accumulation: on the
// vdpbf16ps kernels where the CPU has AVX512_BF16 (Isa::avx512_bf16), otherwise the fp32 GEMM on the rounded
// values (the same products, not faster); Backend::scalar: the reference on the rounded values. op(B) is
// packed into bf16 panels per call (the layer packs its weights once): scratch leased from the scratch cache.
void gemm_bf16(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
               Backend backend = Backend::simd);

// Row softmax in place: x[i, :] = softmax(scale · x[i, :] + mask[i, :]); scale must be finite.
//   mask: additive, same rows and cols as x (data == nullptr: no mask). -inf entries drop that column.
//   Numerically stable (the row max is subtracted). A row whose entries are all -inf becomes zeros.
void softmax_rows(Matrix x, float scale = 1.0f, ConstMatrix mask = {}, Backend backend = Backend::simd);

// Row layernorm: y[i, :] = gamma · (z − mean(z)) / sqrt(var(z) + eps) + beta, z = x[i, :] (+ residual[i, :]).
//   var is the biased variance (divide by cols); eps is inside the square root (TF style, seed 000).
//   gamma, beta: [cols] each, nullptr means ones / zeros. residual: same shape as x, or data == nullptr.
//   y may be the same memory as x or residual (in place), otherwise it must not overlap them.
void layernorm_rows(ConstMatrix x, Matrix y, const float* gamma, const float* beta, float eps,
                    ConstMatrix residual = {}, Backend backend = Backend::simd);

}  // namespace mha
