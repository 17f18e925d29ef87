// The public kernel entry points: validate, then run the scalar reference or the SIMD kernel.
#include <cmath>

#include "../reference/reference.hpp"
#include "../simd/simd.hpp"
#include "mha/kernels.hpp"
#include "validate.hpp"

namespace mha {

using detail::check_matrix;
using detail::fail;
using detail::shape_str;

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c, Backend backend) {
    check_matrix("A", a);
    check_matrix("B", b);
    check_matrix("C", c);
    const std::size_t m = ta == Trans::no ? a.rows : a.cols, ka = ta == Trans::no ? a.cols : a.rows;
    const std::size_t kb = tb == Trans::no ? b.rows : b.cols, n = tb == Trans::no ? b.cols : b.rows;
    if (ka != kb)
        fail("gemm inner dimensions differ: op(A) is " + shape_str(m, ka) + " and op(B) is " + shape_str(kb, n));
    if (c.rows != m || c.cols != n)
        fail("C is " + shape_str(c.rows, c.cols) + " but op(A)·op(B) is " + shape_str(m, n));
    if (detail::overlaps(a, c) || detail::overlaps(b, c)) fail("C overlaps A or B");
    if (backend == Backend::scalar)
        reference::gemm(alpha, a, ta, b, tb, beta, c);
    else
        simd::gemm(alpha, a, ta, b, tb, beta, c);
}

void softmax_rows(Matrix x, float scale, ConstMatrix mask, Backend backend) {
    check_matrix("x", x);
    if (mask.data != nullptr) {
        check_matrix("mask", mask);
        if (mask.rows != x.rows || mask.cols != x.cols)
            fail("mask is " + shape_str(mask.rows, mask.cols) + " but x is " + shape_str(x.rows, x.cols));
        if (detail::overlaps(x, mask)) fail("mask overlaps x");
    }
    for (std::size_t i = 0; i < x.rows; ++i) {
        const float* m = mask.data ? mask.row(i) : nullptr;
        if (backend == Backend::scalar)
            reference::softmax_row(x.row(i), x.cols, x.cols, scale, m, nullptr);
        else
            simd::softmax_row(x.row(i), x.cols, x.cols, scale, m, nullptr);
    }
}

void layernorm_rows(ConstMatrix x, Matrix y, const float* gamma, const float* beta, float eps, ConstMatrix residual,
                    Backend backend) {
    check_matrix("x", x);
    check_matrix("y", y);
    if (y.rows != x.rows || y.cols != x.cols)
        fail("y is " + shape_str(y.rows, y.cols) + " but x is " + shape_str(x.rows, x.cols));
    if (!(eps >= 0.0f) || !std::isfinite(eps)) fail("eps " + std::to_string(eps) + " is not a finite value >= 0");
    const bool same_xy = x.data == y.data && x.stride == y.stride;
    if (!same_xy && detail::overlaps(x, y)) fail("y overlaps x without being the same memory");
    if (residual.data != nullptr) {
        check_matrix("residual", residual);
        if (residual.rows != x.rows || residual.cols != x.cols)
            fail("residual is " + shape_str(residual.rows, residual.cols) + " but x is " + shape_str(x.rows, x.cols));
        const bool same_ry = residual.data == y.data && residual.stride == y.stride;
        if (!same_ry && detail::overlaps(residual, y)) fail("y overlaps residual without being the same memory");
    }
    auto row = backend == Backend::scalar ? &reference::layernorm_row : &simd::layernorm_row;
    for (std::size_t i = 0; i < x.rows; ++i)
        row(y.row(i), x.row(i), residual.data ? residual.row(i) : nullptr, x.cols, gamma, beta, eps);
}

}  // namespace mha
