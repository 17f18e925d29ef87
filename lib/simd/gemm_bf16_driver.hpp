// The bf16 GEMM's loops around an ISA's microkernels, shared by gemm_bf16_avx512bf16.cpp (vdpbf16ps) and
// gemm_bf16_neonbf16.cpp (BFDOT); included only by those TUs. Layout and contract: gemm_bf16.hpp.
//
// Loops (BLIS layers as in gemm_impl.hpp, with A packed once per k-block for all its rows):
//   for each k-block (balanced, even boundaries, at most kBf16KBlock long):
//     pack A[:, block] into row panels of kBf16Rows rows (scratch)
//     for jc in N step NC:  for each row panel:  for each 32-column panel of B in jc's block: Kernel::panel
// Every C element is summed over the same k-blocks in the same order (one dot-product step per k-pair),
// whatever the row panel or the caller's split of M.
//
// Kernel (a type in the ISA TU's anonymous namespace) provides:
//   scatter_pairs(src, kc, dst, step): the contiguous fp32 run src[0, kc), rounded to bf16, as pairs
//     dst[q·step] for pair q (a missing odd last value is 0);
//   interleave_rows(r0, r1, n, dst): two rows of n <= 32 fp32 values (r1 null: zeros) as 32 pairs
//     dst[j] = (r0[j], r1[j]), the pairs past n zero;
//   panel(m, n, kp, a, b, out): C rows [0, m) × columns [0, n <= 32) of one row panel and one B panel over
//     kp k-pairs (a: the packed row panel, b: the B panel at the k-block's first pair);
//   optionally prefetch_l2(p, bytes): a hint that never faults (the next B panel with few rows), or
//     panel_reading_ahead(m, n, kp, a, b, out, ahead, step): panel, asking [ahead, ahead + kp·step) into L2;
//   optionally wide_panels(m) and wide(m, kp, a, b, panel_stride, out): for m rows (np = 1), wide_panels(m)
//     full B panels at b + p·panel_stride in one tile (0: none), each C element the same chain as panel's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gemm_bf16.hpp"
#include "gemm_microkernel.hpp"

namespace mha::simd {

// A pair of bf16 values (k even in the low half) seen as one 32-bit word.
using bf16_pair = std::uint32_t __attribute__((may_alias));

template <class Kernel>
struct Bf16GemmDriver {
    static constexpr std::size_t MR = kBf16Rows, NR = kBf16PanelWidth, NC = 512;
    // Row panels up to which each B panel is taken by all of them in turn (few rows: B streams from memory once).
    static constexpr std::size_t kFewRowPanels = 4;

    static std::size_t min_size(std::size_t a, std::size_t b) noexcept { return b < a ? b : a; }
    // How the few-rows loop asks the next B panel into L2 while one is computed: in a burst before the panel's
    // tiles (Kernel::prefetch_l2; NEON), or a share of it along each row panel's tile (Kernel::panel_reading_ahead;
    // AVX-512). On Zen 5 the burst of 1024 line prefetches per 64 KB k-block slowed the projections, and spread
    // over the tiles they keep memory busy while the tiles compute (bf16 layer step, E 4096, decodes over 16
    // keys, one thread, two A/B runs: burst -> none 3.58 -> 2.72 ms for 4 rows, 8.47 -> 7.50 for 32; none ->
    // spread 3.04 -> 2.32 and 7.41 -> 5.64).
    static constexpr bool kPrefetchesPanels = requires { Kernel::prefetch_l2(nullptr, std::size_t{1}); };
    static constexpr bool kReadsAheadInTiles = requires { &Kernel::panel_reading_ahead; };
    static_assert(kPrefetchesPanels != kReadsAheadInTiles, "a kernel reads the next B panel ahead one way");
    // Row panel r of np reads ahead bytes [kp·share_start, kp·(share_start + share_step)) of the next panel's
    // k-block (kp·128 bytes), share_step per k-pair: equal shares, the last one the rest, so that together they
    // cover the block and no step skips a cache line (the kernel asks two lines per step above 64 bytes).
    static constexpr std::size_t kPairBytes = 2 * NR * 2;
    static constexpr std::size_t share_start(std::size_t np, std::size_t r) noexcept { return r * (kPairBytes / np); }
    static constexpr std::size_t kp_share_step(std::size_t np, std::size_t r) noexcept {
        return r + 1 == np ? kPairBytes - r * (kPairBytes / np) : kPairBytes / np;
    }
    static constexpr bool shares_cover(std::size_t np) noexcept {
        std::size_t end = 0;
        for (std::size_t r = 0; r < np; ++r) {
            if (share_start(np, r) != end || kp_share_step(np, r) > 128) return false;
            end += kp_share_step(np, r);
        }
        return end == kPairBytes;
    }
    static_assert(shares_cover(1) && shares_cover(2) && shares_cover(3) && shares_cover(4) && kFewRowPanels == 4,
                  "the read-ahead shares tile the next panel's k-block");
    // Full B panels per tile for M rows: Kernel::wide_panels(M) where the kernel has wide tiles, else 0 (none).
    static constexpr bool kHasWide = requires { Kernel::wide_panels(std::size_t{1}); };
    static constexpr std::size_t wide_panels(std::size_t m) noexcept {
        if constexpr (kHasWide)
            return Kernel::wide_panels(m);
        else
            return 0;
    }
    static std::size_t kblock_start(std::size_t b, std::size_t k, std::size_t nb) noexcept {
        return min_size(k, b * ((k + 1) / 2) / nb * 2);
    }

    // A rows [i0, i0 + m) × columns [pc, pc + kc) → dst[q·MR + i] (the pair of row i0 + i at k-pair q).
    static void pack_a(ConstMatrix a, std::size_t i0, std::size_t m, std::size_t pc, std::size_t kc, bf16_pair* dst) noexcept {
        for (std::size_t i = 0; i < m; ++i) Kernel::scatter_pairs(a.data + (i0 + i) * a.stride + pc, kc, dst + i, MR);
    }

    // op(B) [K, N] into the panels of gemm_bf16.hpp at dst, padding zeros included.
    static void pack_panels(ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept {
        const bool tr = tb == Trans::yes;
        const std::size_t k = tr ? b.cols : b.rows, n = tr ? b.rows : b.cols, kp = (k + 1) / 2;
        for (std::size_t p = 0; p * NR < n; ++p) {
            bf16_pair* panel = reinterpret_cast<bf16_pair*>(dst + p * panel_stride);
            const std::size_t j0 = p * NR, nj = min_size(NR, n - j0);
            if (tr) {  // column j of op(B) is row j of b: its k run is contiguous
                if (nj < NR) std::memset(static_cast<void*>(panel), 0, kp * NR * 4);
                for (std::size_t j = 0; j < nj; ++j) Kernel::scatter_pairs(b.data + (j0 + j) * b.stride, k, panel + j, NR);
                continue;
            }
            for (std::size_t q = 0; q < kp; ++q) {  // rows 2q and 2q + 1 of op(B)
                const float* r0 = b.data + 2 * q * b.stride + j0;
                Kernel::interleave_rows(r0, 2 * q + 1 < k ? r0 + b.stride : nullptr, nj, panel + q * NR);
            }
        }
    }

    // A [M, K] packed for every k-block in turn: block kb's row panels at ceil(pc / 2)·MR·np pairs (pc its start).
    static void pack_a_all(ConstMatrix a, bf16_pair* dst) noexcept {
        const std::size_t M = a.rows, K = a.cols, np = (M + MR - 1) / MR, nb = bf16_kblocks(K);
        for (std::size_t kb = 0; kb < nb; ++kb) {
            const std::size_t pc = kblock_start(kb, K, nb), kc = kblock_start(kb + 1, K, nb) - pc, kp = (kc + 1) / 2;
            for (std::size_t r = 0; r < np; ++r) {
                const std::size_t i0 = r * M / np, m = (r + 1) * M / np - i0;
                pack_a(a, i0, m, pc, kc, dst + pc / 2 * MR * np + r * MR * kp);
            }
        }
    }

    // a: the fp32 A (its rows and columns give M and K; read only when packed_a is null), or packed_a: A as
    // pack_a_all made it.
    static void gemm(float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias, Matrix c,
                     std::uint16_t* scratch_buf, const bf16_pair* packed_a = nullptr) noexcept {
        const std::size_t M = c.rows, N = c.cols, K = a.cols;
        if (M == 0 || N == 0) return;
        if (K == 0) {
            for (std::size_t i = 0; i < M; ++i)
                for (std::size_t j = 0; j < N; ++j) {
                    float& cij = c.data[i * c.stride + j];
                    const float v = beta == 0.0f ? 0.0f : beta * cij;
                    cij = bias != nullptr ? v + bias[j] : v;
                }
            return;
        }
        const std::size_t np = (M + MR - 1) / MR, nb = bf16_kblocks(K);
        for (std::size_t kb = 0; kb < nb; ++kb) {
            const std::size_t pc = kblock_start(kb, K, nb), kc = kblock_start(kb + 1, K, nb) - pc, kp = (kc + 1) / 2;
            const bf16_pair* ap = packed_a != nullptr ? packed_a + pc / 2 * MR * np : nullptr;
            if (packed_a == nullptr) {
                bf16_pair* buf = reinterpret_cast<bf16_pair*>(scratch_buf);
                for (std::size_t r = 0; r < np; ++r) {
                    const std::size_t i0 = r * M / np, m = (r + 1) * M / np - i0;
                    pack_a(a, i0, m, pc, kc, buf + r * MR * kp);
                }
                ap = buf;
            }
            const float beta_k = kb == 0 ? beta : 1.0f;
            const float* bias_k = kb + 1 == nb ? bias : nullptr;
            auto tile_out = [&](std::size_t i0, std::size_t j0, std::size_t n) {
                return GemmTileOut{c.data + i0 * c.stride + j0, c.stride, n, alpha, beta_k, bias_k != nullptr ? bias_k + j0 : nullptr};
            };
            // Row panel r × the B panel at column j0; with `next` (the following panel's k-block) and a kernel that
            // reads ahead in its tiles, the row panel's share of it is asked into L2 meanwhile.
            auto run_panel = [&](std::size_t r, std::size_t j0, std::size_t n, const char* next = nullptr) {
                const std::size_t i0 = r * M / np, m = (r + 1) * M / np - i0;
                const std::uint16_t* panel = b.data + j0 / NR * b.panel_stride + pc * NR;
                if constexpr (kReadsAheadInTiles)
                    if (next != nullptr)
                        return Kernel::panel_reading_ahead(m, n, kp, ap + r * MR * kp, panel, tile_out(i0, j0, n),
                                                           next + kp * share_start(np, r), kp_share_step(np, r));
                Kernel::panel(m, n, kp, ap + r * MR * kp, panel, tile_out(i0, j0, n));
            };
            if (np <= kFewRowPanels) {
                // Few rows (a decode step's projections): each B panel, streamed from memory once, serves every
                // row panel from L1 / L2 right away (the next one prefetched into L2 meanwhile where the kernel asks);
                // one or two rows take several full panels per tile where the kernel has wide tiles.
                const std::size_t wide = wide_panels(M);
                for (std::size_t j0 = 0; j0 < N;) {
                    const std::size_t take = wide != 0 && j0 + wide * NR <= N ? wide : 1;
                    const auto* next = j0 + NR < N ? reinterpret_cast<const char*>(b.data + (j0 / NR + 1) * b.panel_stride + pc * NR) : nullptr;
                    if constexpr (kPrefetchesPanels)
                        if (next != nullptr) Kernel::prefetch_l2(next, kp * kPairBytes);
                    if (take > 1) {
                        if constexpr (kHasWide)
                            Kernel::wide(M, kp, ap, b.data + j0 / NR * b.panel_stride + pc * NR, b.panel_stride, tile_out(0, j0, take * NR));
                    } else {
                        for (std::size_t r = 0; r < np; ++r) run_panel(r, j0, min_size(NR, N - j0), next);
                    }
                    j0 += take * NR;
                }
                continue;
            }
            for (std::size_t jc = 0; jc < N; jc += NC) {
                const std::size_t nc = min_size(NC, N - jc);
                for (std::size_t r = 0; r < np; ++r)
                    for (std::size_t j0 = jc; j0 < jc + nc; j0 += NR) run_panel(r, j0, min_size(NR, jc + nc - j0));
            }
        }
    }
};

}  // namespace mha::simd
