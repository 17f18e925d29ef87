// Row layernorm on one ISA: the definition of layernorm_kernel::operator(), included only by the
// generated layernorm_<isa>.cpp TUs. For z = x (+ residual) of length n:
//   y = gamma·(z − mean)/sqrt(var + eps) + beta, var biased; gamma/beta null mean ones/zeros.
// Preconditions: n >= 1; y is the same memory as x or residual, or overlaps neither; gamma/beta hold n.
// Passes (the row stays in L1/L2):
//   1. z (stored into y when there is a residual, so later passes read one array), mean0 = Σz / n;
//   2. d = z − mean0, Σd and Σd²;  3. y = gamma·((z − mean0) − c)·inv_std + beta with c = Σd / n
//      (computed as (z − mean0)·inv_std − c·inv_std).
// Pass 2 is the plain two-pass variance plus the correction c (Chan, Golub, LeVeque): var = Σd²/n − c².
// c is tiny (mean0's rounding), so there is no cancellation, and keeping mean0 and c apart means a row
// with mean 1e4 is centred to a few ulp of its deviations rather than to an ulp of 1e4.
// Every helper is a template on Arch (or exists only in the AVX-512 TU): see softmax_impl.hpp.
#pragma once
#include <cstddef>
#include <limits>

#include "layernorm.hpp"
#include "row_tail.hpp"

namespace mha::simd {
namespace layernorm_detail {
using row_detail::batch;
using row_detail::load_head;
using row_detail::reduce_add;
using row_detail::store_head;
}  // namespace layernorm_detail
namespace {
constexpr float kInfinity = std::numeric_limits<float>::infinity();  // internal linkage: no symbol shared across ISAs
}  // namespace

template <class Arch>
void layernorm_kernel::operator()(Arch arch, float* y, const float* x, const float* residual, std::size_t n,
                                  const float* gamma, const float* beta, float eps) const noexcept {
    using B = layernorm_detail::batch<Arch>;
    using layernorm_detail::load_head;
    using layernorm_detail::store_head;
    constexpr std::size_t W = B::size;
    const std::size_t body = n - n % W;
    const std::size_t tail = n - body;
    const B count(static_cast<float>(n));

    // Pass 1: Σz with four chains (the add latency, not the loads, would limit one chain).
    const float* z = x;
    B s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
    std::size_t j = 0;
    if (residual) {
        for (; j + 4 * W <= body; j += 4 * W) {
            const B z0 = B::load_unaligned(x + j) + B::load_unaligned(residual + j);
            const B z1 = B::load_unaligned(x + j + W) + B::load_unaligned(residual + j + W);
            const B z2 = B::load_unaligned(x + j + 2 * W) + B::load_unaligned(residual + j + 2 * W);
            const B z3 = B::load_unaligned(x + j + 3 * W) + B::load_unaligned(residual + j + 3 * W);
            z0.store_unaligned(y + j);
            z1.store_unaligned(y + j + W);
            z2.store_unaligned(y + j + 2 * W);
            z3.store_unaligned(y + j + 3 * W);
            s0 += z0;
            s1 += z1;
            s2 += z2;
            s3 += z3;
        }
        for (; j < body; j += W) {
            const B zj = B::load_unaligned(x + j) + B::load_unaligned(residual + j);
            zj.store_unaligned(y + j);
            s0 += zj;
        }
        if (tail != 0) {
            const B zj = load_head(arch, x + body, tail, 0.0f) + load_head(arch, residual + body, tail, 0.0f);
            store_head(arch, zj, y + body, tail);
            s1 += zj;
        }
        z = y;  // y now holds z; x and residual are not read again (y may be either of them)
    } else {
        for (; j + 4 * W <= body; j += 4 * W) {
            s0 += B::load_unaligned(x + j);
            s1 += B::load_unaligned(x + j + W);
            s2 += B::load_unaligned(x + j + 2 * W);
            s3 += B::load_unaligned(x + j + 3 * W);
        }
        for (; j < body; j += W) s0 += B::load_unaligned(x + j);
        if (tail != 0) s1 += load_head(arch, x + body, tail, 0.0f);
    }
    const float mean0_scalar = layernorm_detail::reduce_add(arch, (s0 + s1) + (s2 + s3)) / static_cast<float>(n);
    const B mean0(mean0_scalar);

    // Pass 2: Σd and Σd² of d = z − mean0. Tail lanes load mean0, so their d is 0.
    B d_sum0(0.0f), d_sum1(0.0f), sq0(0.0f), sq1(0.0f);
    for (j = 0; j + 2 * W <= body; j += 2 * W) {
        const B da = B::load_unaligned(z + j) - mean0;
        const B db = B::load_unaligned(z + j + W) - mean0;
        d_sum0 += da;
        d_sum1 += db;
        sq0 = xsimd::fma(da, da, sq0);
        sq1 = xsimd::fma(db, db, sq1);
    }
    for (; j < body; j += W) {
        const B d = B::load_unaligned(z + j) - mean0;
        d_sum0 += d;
        sq0 = xsimd::fma(d, d, sq0);
    }
    if (tail != 0) {
        const B d = load_head(arch, z + body, tail, mean0_scalar) - mean0;
        d_sum1 += d;
        sq1 = xsimd::fma(d, d, sq1);
    }
    const B shift = B(layernorm_detail::reduce_add(arch, d_sum0 + d_sum1)) / count;  // c = mean − mean0
    // Σd²/n >= c² in exact arithmetic; rounding can take a constant row just below 0. maxps returns its
    // second operand when one is NaN, so a NaN variance stays NaN.
    const float sum_sq = layernorm_detail::reduce_add(arch, sq0 + sq1);
    const B var = xsimd::max(B(0.0f), B(sum_sq) / count - shift * shift);
    B inv_std = B(1.0f) / xsimd::sqrt(var + B(eps));
    if (sum_sq == kInfinity && mean0_scalar - mean0_scalar == 0.0f) {
        // Finite z whose deviations pass ~1.8e19: their squares overflow (inv_std would be 0, every y beta). Rare:
        // Σ(d·p)² again with p the power of 2 below 1 / max|d| (exact scaling), inv_std = p / sqrt(var·p² + eps·p²).
        B largest(0.0f);
        for (j = 0; j < body; j += W) largest = xsimd::max(largest, xsimd::abs(B::load_unaligned(z + j) - mean0));
        if (tail != 0) largest = xsimd::max(largest, xsimd::abs(load_head(arch, z + body, tail, mean0_scalar) - mean0));
        alignas(64) float lanes[W];
        largest.store_aligned(lanes);
        float m = 0.0f;
        for (std::size_t i = 0; i < W; ++i) m = lanes[i] > m ? lanes[i] : m;
        const B p(__builtin_ldexpf(1.0f, -__builtin_ilogbf(m) - 1));
        B sq(0.0f);
        for (j = 0; j < body; j += W) {
            const B d = (B::load_unaligned(z + j) - mean0) * p;
            sq = xsimd::fma(d, d, sq);
        }
        if (tail != 0) {
            const B d = (load_head(arch, z + body, tail, mean0_scalar) - mean0) * p;
            sq = xsimd::fma(d, d, sq);
        }
        const B shift_p = shift * p;
        const B var_p = xsimd::max(B(0.0f), B(layernorm_detail::reduce_add(arch, sq)) / count - shift_p * shift_p);
        inv_std = p / xsimd::sqrt(var_p + B(eps) * p * p);
    }

    // Pass 3: y = gamma·t + beta, t = (z − mean0)·inv_std − c·inv_std in one fma (one rounding of t).
    // gamma/beta presence is fixed for the row, so these branches are perfectly predicted.
    const B neg_shift_scaled = -(shift * inv_std);
    auto normalize = [&](const B& zj, std::size_t at, std::size_t k) noexcept {
        const B t = xsimd::fma(zj - mean0, inv_std, neg_shift_scaled);
        const B g = gamma ? (k == W ? B::load_unaligned(gamma + at) : load_head(arch, gamma + at, k, 0.0f)) : B(1.0f);
        const B b = beta ? (k == W ? B::load_unaligned(beta + at) : load_head(arch, beta + at, k, 0.0f)) : B(0.0f);
        return gamma ? xsimd::fma(t, g, b) : t + b;
    };
    for (j = 0; j < body; j += W) normalize(B::load_unaligned(z + j), j, W).store_unaligned(y + j);
    if (tail != 0) store_head(arch, normalize(load_head(arch, z + body, tail, 0.0f), body, tail), y + body, tail);
}

}  // namespace mha::simd
