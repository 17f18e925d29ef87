// The GEMM's loops around the microkernel (BLIS layers), templated on the xsimd Arch; included only by
// the per-ISA TUs gemm_<isa>.cpp (generated, see dispatch.hpp), which instantiate the functors of gemm.hpp.
//   C = alpha·op(A)·op(B) + beta·C (+ bias[j] when given), op(A) [M, K], op(B) [K, N], C [M, N].
//   beta == 0: C is only written. K == 0: C = beta·C (+ bias). C must not overlap A or B.
// B prepacked in bf16 (PackedMatrix::View::data16) runs the same loops on microkernels that widen B exactly.
// Blocking and loop order: see gemm_blocking.hpp. Each C element is summed over k in the same order
// (the same k-blocks, in order, one FMA per k) whatever the path (packed or in-place operands, which
// row panel), so splitting M across threads gives bitwise the same rows.
#pragma once
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "gemm.hpp"
#include "gemm_blocking.hpp"
#include "gemm_microkernel.hpp"
#include "gemm_pack.hpp"

namespace mha::simd {
namespace gemm_detail {
namespace {
// Internal linkage: each ISA TU has its own copy, never one the linker could share with another ISA.
constexpr std::size_t min_size(std::size_t a, std::size_t b) noexcept { return b < a ? b : a; }
}  // namespace

template <class Arch>
struct Gemm {
    using Blk = GemmBlocking<Arch>;
    static constexpr std::size_t MR = Blk::MR, NV = Blk::NV, NR = Blk::NR, W = Blk::W;
    // Row panels of at most kWideRows rows run kWidePanels / rows B panels per tile (one panel's 1 × NV
    // accumulators leave the FMA latency exposed: bf16 weights on AVX2 read at half the bytes per FMA).
    static constexpr std::size_t kWideRows = 2, kWidePanels = 4;
    template <class BT>  // BT: the B panels' element, float or uint16_t (bf16 bits, PanelElement::bf16)
    using Kernel = void (*)(std::size_t, const float*, std::size_t, const BT*, std::size_t, const GemmTileOut&) noexcept;
    // Plain arrays (indexing them calls no std::array member, which the AVX2 and SSE2 TUs would share:
    // both have MR = 6 and NV = 2).
    template <class BT>
    struct KernelRow {
        Kernel<BT> k[MR];  // [rows - 1]
    };
    template <class BT>
    struct KernelTable {
        KernelRow<BT> v[NV];  // [vectors - 1]
    };

    template <class BT, ALayout L, std::size_t V, std::size_t... I>
    static constexpr KernelRow<BT> kernel_rows(std::index_sequence<I...>) {
        return {{&gemm_microkernel<Arch, I + 1, V, L, BT>...}};
    }
    template <class BT, ALayout L, std::size_t... V>
    static constexpr KernelTable<BT> kernel_table(std::index_sequence<V...>) {
        return {{kernel_rows<BT, L, V + 1>(std::make_index_sequence<MR>{})...}};
    }
    template <class BT, ALayout L>
    static constexpr KernelTable<BT> kernels = kernel_table<BT, L>(std::make_index_sequence<NV>{});

    // Row panels of C: ceil(m / MR) panels of balanced height (they differ by at most one row), so a
    // tail never runs a 1- or 2-row tile that leaves FMA ports idle.
    static std::size_t panel_count(std::size_t m) { return (m + MR - 1) / MR; }
    static std::size_t panel_start(std::size_t r, std::size_t m, std::size_t np) { return r * m / np; }

    // k-blocks: ceil(K / KC) blocks of balanced length (768 + 32 would waste a pass over C).
    static std::size_t kblock_count(std::size_t k, std::size_t kc) { return (k + kc - 1) / kc; }
    static std::size_t kblock_start(std::size_t b, std::size_t k, std::size_t nb) { return b * k / nb; }

    // The B operand of one k-block × NC block: panel jr at base + jr·panel_step, rows ldb apart. A partial
    // last panel (fewer than NR columns) is read from `edge` (packed, rows NR apart) when edge != nullptr.
    template <class BT>
    struct BPanels {
        const BT* base;
        std::size_t panel_step, ldb;
        const BT* edge;
    };

    // C[0, m) × [0, nc) (+)= A micro-panel · B block: one sweep over the B panels for one A micro-panel
    // (m <= MR rows), which stays in L1 meanwhile.
    template <class BT>
    static void sweep(std::size_t m, std::size_t nc, std::size_t kc, const float* a, std::size_t lda, ALayout layout,
                      const BPanels<BT>& b, float* c, std::size_t ldc, float alpha, float beta,
                      const float* bias) noexcept {
        const KernelTable<BT>& table = layout == ALayout::col_panel ? kernels<BT, ALayout::col_panel> : kernels<BT, ALayout::row_major>;
        std::size_t j0 = 0, jr = 0;
        if (m <= kWideRows && layout == ALayout::row_major) {
            // Few rows (a decode step's projections): kWidePanels full panels per tile, for enough FMA chains.
            const auto wide = m == 1 ? &gemm_microkernel_wide<Arch, 1, NV, ALayout::row_major, BT, kWidePanels>
                                     : &gemm_microkernel_wide<Arch, 2, NV, ALayout::row_major, BT, kWidePanels / 2>;
            const std::size_t step = kWidePanels / m;  // panels per tile
            for (; j0 + step * NR <= nc; j0 += step * NR, jr += step) {  // full panels only
                const GemmTileOut out{c + j0, ldc, step * NR, alpha, beta, bias != nullptr ? bias + j0 : nullptr};
                wide(kc, a, lda, b.base + jr * b.panel_step, b.ldb, b.panel_step, out);
            }
        }
        for (; j0 < nc; j0 += NR, ++jr) {
            const std::size_t n = min_size(NR, nc - j0);
            const bool edge = n < NR && b.edge != nullptr;
            const GemmTileOut out{c + j0, ldc, n, alpha, beta, bias != nullptr ? bias + j0 : nullptr};
            table.v[(n + W - 1) / W - 1].k[m - 1](kc, a, lda, edge ? b.edge : b.base + jr * b.panel_step,
                                              edge ? NR : b.ldb, out);
        }
    }

    // C = beta·C (+ bias) for K == 0.
    static void scale_only(float beta, const float* bias, Matrix c) noexcept {
        for (std::size_t i = 0; i < c.rows; ++i)
            for (std::size_t j = 0; j < c.cols; ++j) {
                float& cij = c.data[i * c.stride + j];
                const float v = beta == 0.0f ? 0.0f : beta * cij;
                cij = bias != nullptr ? v + bias[j] : v;
            }
    }

    // op(B) = B stored row-major, one k-block and one N block, few rows of A (attention's P·V_h): B's
    // rows are read in place, since a packed copy would be reused by too few A micro-panels to pay
    // for the pass (M = 32: 100 vs 90 GFLOP/s in place; M = 1024: 108 vs 110 packed). Only a partial
    // last panel is packed, for its zero padding.
    static bool b_in_place(std::size_t m, std::size_t n, std::size_t nkb, Trans tb) {
        return tb == Trans::no && nkb == 1 && n <= Blk::NC && m <= 32 * MR;
    }

    // The pack buffers run() asks for, at most, for any m' <= m, n' <= n, k' <= k (the longest balanced
    // k-block is at most min(k, KC); the in-place case only shrinks as the sizes do).
    static GemmScratchSize scratch_bound(std::size_t m, std::size_t n, std::size_t k, Trans ta, Trans tb) {
        if (m == 0 || n == 0 || k == 0) return {};
        const std::size_t kc = min_size(k, Blk::KC);
        const bool in_place = b_in_place(m, n, kblock_count(k, Blk::KC), tb);
        return {ta == Trans::yes ? kc * MR : 0, in_place ? kc * NR : kc * ((min_size(Blk::NC, n) + NR - 1) / NR * NR)};
    }

    // The driver. b_packed or b_panels != nullptr: B comes prepacked (b, tb unused); otherwise op(B) from b, tb.
    // Pack buffers come from scratch (sized by scratch_bound).
    static void run(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, const PackedMatrix::View* b_packed,
                    const PanelMatrix* b_panels, float beta, const float* bias, Matrix c,
                    const GemmScratch& scratch) noexcept {
        const std::size_t M = c.rows, N = c.cols, K = ta == Trans::no ? a.cols : a.rows;
        if (M == 0 || N == 0) return;
        if (K == 0) return scale_only(beta, bias, c);

        const std::size_t KC = b_packed != nullptr ? b_packed->kc : Blk::KC;
        [[maybe_unused]] const std::size_t nkb = kblock_count(K, KC), kc_max = (K + nkb - 1) / nkb;  // the longest k-block
        [[maybe_unused]] const std::size_t nc_max = min_size(Blk::NC, N);
        const bool prepacked = b_packed != nullptr || b_panels != nullptr;
        const bool in_place = !prepacked && b_in_place(M, N, nkb, tb);
        const bool pack_a = ta == Trans::yes;  // in place, op(A) = Aᵀ would touch one cache line per k
        float* b_buf = prepacked ? nullptr : scratch.b;
        float* a_buf = pack_a ? scratch.a : nullptr;
        assert(prepacked || scratch.b_floats >= (in_place ? kc_max * NR : kc_max * ((nc_max + NR - 1) / NR * NR)));
        assert(!pack_a || scratch.a_floats >= kc_max * MR);
        const std::size_t np = panel_count(M);

        for (std::size_t jc = 0; jc < N; jc += Blk::NC) {
            const std::size_t nc = min_size(Blk::NC, N - jc);
            for (std::size_t kb = 0; kb < nkb; ++kb) {
                const std::size_t pc = kblock_start(kb, K, nkb), kc = kblock_start(kb + 1, K, nkb) - pc;
                const float beta_k = kb == 0 ? beta : 1.0f;  // later k-blocks accumulate onto C
                const float* bias_k = kb + 1 == nkb && bias != nullptr ? bias + jc : nullptr;  // added once

                // The row panels of A against this B block (f32 or bf16 panels).
                auto sweep_rows = [&](const auto& bp) {
                    for (std::size_t r = 0; r < np; ++r) {
                        const std::size_t i0 = panel_start(r, M, np), m = panel_start(r + 1, M, np) - i0;
                        float* c0 = c.data + i0 * c.stride + jc;
                        if (pack_a) {
                            pack_a_panel<Arch, MR>(m, kc, a.data + pc * a.stride + i0, a.stride, a_buf);
                            sweep(m, nc, kc, a_buf, MR, ALayout::col_panel, bp, c0, c.stride, alpha, beta_k, bias_k);
                        } else {
                            sweep(m, nc, kc, a.data + i0 * a.stride + pc, a.stride, ALayout::row_major, bp, c0, c.stride,
                                  alpha, beta_k, bias_k);
                        }
                    }
                };
                if (b_packed != nullptr) {
                    const std::size_t offset = pc * b_packed->pitch + (b_packed->panel0 * NR + jc) * kc;
                    if (b_packed->data16 != nullptr)
                        sweep_rows(BPanels<std::uint16_t>{b_packed->data16 + offset, kc * NR, NR, nullptr});
                    else
                        sweep_rows(BPanels<float>{b_packed->data + offset, kc * NR, NR, nullptr});
                } else if (b_panels != nullptr) {  // panels span all of K: a k-block starts pc rows in
                    sweep_rows(BPanels<float>{b_panels->data + jc / NR * b_panels->panel_stride + pc * NR, b_panels->panel_stride, NR, nullptr});
                } else if (in_place) {
                    const float* b0 = b.data + pc * b.stride + jc;
                    const std::size_t full = nc / NR * NR;
                    if (full < nc) pack_b_panel<Arch, NR>(nc - full, kc, b0 + full, b.stride, false, b_buf);
                    sweep_rows(BPanels<float>{b0, NR, b.stride, b_buf});
                } else {
                    const bool tr = tb == Trans::yes;
                    for (std::size_t j0 = 0; j0 < nc; j0 += NR) {
                        const float* src = tr ? b.data + (jc + j0) * b.stride + pc : b.data + pc * b.stride + jc + j0;
                        pack_b_panel<Arch, NR>(min_size(NR, nc - j0), kc, src, b.stride, tr, b_buf + j0 * kc);
                    }
                    sweep_rows(BPanels<float>{b_buf, kc * NR, NR, nullptr});
                }
            }
        }
    }

    static void pack_panels(ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) noexcept {
        const bool tr = tb == Trans::yes;
        const std::size_t k = tr ? b.cols : b.rows, n = tr ? b.rows : b.cols;
        for (std::size_t j0 = 0, p = 0; j0 < n; j0 += NR, ++p) {
            const float* src = tr ? b.data + j0 * b.stride : b.data + j0;
            pack_b_panel<Arch, NR>(min_size(NR, n - j0), k, src, b.stride, tr, dst + p * panel_stride);
        }
    }

    // op(B) [K, N] into the panels of dst (zero-filled storage, dst.k == K, dst.n == N, dst.kc == KC).
    static void pack(ConstMatrix b, Trans tb, float* data, const PackedMatrix::View& dst) noexcept {
        const bool tr = tb == Trans::yes;
        const std::size_t nkb = kblock_count(dst.k, dst.kc);
        for (std::size_t kb = 0; kb < nkb; ++kb) {
            // Each k-block is a set of panels of kc rows (panel stride kc·NR) starting at pc·pitch.
            const std::size_t pc = kblock_start(kb, dst.k, nkb), kc = kblock_start(kb + 1, dst.k, nkb) - pc;
            const ConstMatrix rows = tr ? ConstMatrix(b.data + pc, b.rows, kc, b.stride)
                                        : ConstMatrix(b.data + pc * b.stride, kc, b.cols, b.stride);
            pack_panels(rows, tb, data + pc * dst.pitch + dst.panel0 * kc * NR, kc * NR);
        }
    }
};

}  // namespace gemm_detail

template <class Arch>
void GemmKernel::operator()(Arch, float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
                            const GemmScratch& scratch) const noexcept {
    gemm_detail::Gemm<Arch>::run(alpha, a, ta, b, tb, nullptr, nullptr, beta, nullptr, c, scratch);
}

template <class Arch>
void GemmPackedKernel::operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PackedMatrix::View& b, float beta,
                                  const float* bias, Matrix c, const GemmScratch& scratch) const noexcept {
    gemm_detail::Gemm<Arch>::run(alpha, a, ta, ConstMatrix{}, Trans::no, &b, nullptr, beta, bias, c, scratch);
}

template <class Arch>
void GemmPanelsKernel::operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c,
                                  const GemmScratch& scratch) const noexcept {
    gemm_detail::Gemm<Arch>::run(alpha, a, ta, ConstMatrix{}, Trans::no, nullptr, &b, beta, nullptr, c, scratch);
}

template <class Arch>
void PackPanelsKernel::operator()(Arch, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) const noexcept {
    gemm_detail::Gemm<Arch>::pack_panels(b, tb, dst, panel_stride);
}

template <class Arch>
std::size_t PanelWidthKernel::operator()(Arch) const noexcept {
    return gemm_detail::Gemm<Arch>::NR;
}

template <class Arch>
std::size_t PackedKcKernel::operator()(Arch) const noexcept {
    return GemmBlocking<Arch>::KC;
}

template <class Arch>
void PackBKernel::operator()(Arch, ConstMatrix b, Trans tb, float* data, const PackedMatrix::View& dst) const noexcept {
    gemm_detail::Gemm<Arch>::pack(b, tb, data, dst);
}

template <class Arch>
GemmScratchSize GemmScratchBoundKernel::operator()(Arch, std::size_t m, std::size_t n, std::size_t k, Trans ta,
                                                   Trans tb) const noexcept {
    return gemm_detail::Gemm<Arch>::scratch_bound(m, n, k, ta, tb);
}

}  // namespace mha::simd
