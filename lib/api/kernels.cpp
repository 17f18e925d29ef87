// The public kernel entry points (mha/kernels.hpp): validate, then run the scalar reference or the SIMD kernel.
// lib/api sits above the kernels (lib/simd, lib/reference) and lib/core, beside lib/attention.
#include <cmath>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "../reference/reference.hpp"
#include "../simd/gemm_bf16.hpp"
#include "../simd/round_bf16.hpp"
#include "../simd/simd.hpp"
#include "mha/kernels.hpp"

namespace mha {

using detail::check_matrix;
using detail::fail;
using detail::shape_str;

namespace {

void check_gemm(ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, Matrix c, Backend backend) {
    detail::check_backend(backend);
    detail::check_trans(ta, "ta");
    detail::check_trans(tb, "tb");
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
}

// A row-major copy of x rounded to bfloat16 (transposed when t == yes) at dst.
ConstMatrix rounded_copy(ConstMatrix x, Trans t, float* dst) {
    const std::size_t rows = t == Trans::no ? x.rows : x.cols, cols = t == Trans::no ? x.cols : x.rows;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) dst[i * cols + j] = t == Trans::no ? x(i, j) : x(j, i);
    simd::round_to_bf16_inplace(dst, rows * cols);
    return {dst, rows, cols, cols};
}

}  // namespace

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c, Backend backend) {
    check_gemm(a, ta, b, tb, c, backend);
    if (backend == Backend::scalar)
        reference::gemm(alpha, a, ta, b, tb, beta, c);
    else
        simd::gemm(alpha, a, ta, b, tb, beta, c);
}

void gemm_bf16(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c, Backend backend) {
    check_gemm(a, ta, b, tb, c, backend);
    const std::size_t m = c.rows, n = c.cols, k = ta == Trans::no ? a.cols : a.rows;
    if (backend == Backend::simd && simd::bf16_kernels_available()) {
        // op(A) in place unless transposed (the kernel rounds it while packing); op(B) into bf16 panels.
        const std::size_t a_floats = ta == Trans::yes ? m * k : 0, stride = simd::Bf16Panels::min_panel_stride(k);
        const std::size_t panel_elems = simd::Bf16Panels::elements(n, stride);
        detail::ScratchLease lease((a_floats + panel_elems / 2 + 32) * sizeof(float) + simd::gemm_bf16_scratch(m, k) * 2 + 64);
        float* base = static_cast<float*>(lease.data());
        auto* panels = static_cast<std::uint16_t*>(detail::align_up(base + a_floats));
        auto* a_pack = reinterpret_cast<std::uint16_t*>(detail::align_up(panels + panel_elems));
        if (ta == Trans::yes) {
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < k; ++j) base[i * k + j] = a(j, i);
            a = ConstMatrix(base, m, k, k);
        }
        simd::pack_panels_bf16(b, tb, panels, stride);
        simd::gemm_bf16(alpha, a, simd::Bf16Panels{panels, k, n, stride}, beta, nullptr, c, a_pack);
        return;
    }
    detail::ScratchLease lease((m * k + k * n + 16) * sizeof(float));
    float* base = static_cast<float*>(lease.data());
    const ConstMatrix ar = rounded_copy(a, ta, base), br = rounded_copy(b, tb, static_cast<float*>(detail::align_up(base + m * k)));
    if (backend == Backend::scalar)
        reference::gemm(alpha, ar, Trans::no, br, Trans::no, beta, c);
    else
        simd::gemm(alpha, ar, Trans::no, br, Trans::no, beta, c);
}

void softmax_rows(Matrix x, float scale, ConstMatrix mask, Backend backend) {
    detail::check_backend(backend);
    if (!std::isfinite(scale)) fail("scale " + std::to_string(scale) + " is not finite");
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
    detail::check_backend(backend);
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
