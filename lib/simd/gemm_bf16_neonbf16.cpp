// The bf16 GEMM's kernels on AArch64 FEAT_BF16 (compiled with +bf16; run only when active_isa() is neon_bf16):
// packing fp32 A and B into bf16 pairs (nearest even, in integer arithmetic: the bits of mha::round_to_bf16)
// and an 8×12 microkernel on BFDOT by element (vbfdotq_laneq_f32), which adds two bf16 products per fp32
// lane: twice the products of an fmla per instruction. Layout and contract: gemm_bf16.hpp; the loops around
// the microkernel: gemm_bf16_driver.hpp.
//
// Register tile: 8 rows × 12 columns = 24 accumulators (4 columns each), 3 B vectors and the 8 rows' pairs
// in 2 A vectors: 29 of the 32 q registers. Per k-pair: 24 BFDOT, 5 loads (4.8 BFDOT per vector loaded, as
// the fp32 12×8 tile's fmla). A 32-column B panel is taken as 12 + 12 + 8 columns. The inner loop
// (aarch64-linux-gnu-objdump -d, tile<8, 3>): 31 instructions per k-pair, 24 bfdot, 3 load instructions
// (ldp + ldur of B, ldp of A), no spills.
#include <arm_neon.h>

#include <cstdint>
#include <utility>

#include "gemm_bf16_driver.hpp"

namespace mha::simd {
namespace {

constexpr std::size_t MR = kBf16Rows, NR = kBf16PanelWidth;
constexpr std::size_t kTileColumns = 12, kTileVectors = kTileColumns / 4;

// A template (on the one Arch it runs on) so that the tile table can refer to the class's own tiles.
template <class Arch>
struct NeonBf16Gemm {
    static std::size_t min_size(std::size_t a, std::size_t b) noexcept { return b < a ? b : a; }

    // Four floats rounded to bf16 (nearest even; NaN kept and made quiet), the bits in each lane's low half.
    static inline __attribute__((always_inline)) uint32x4_t bf16_bits(float32x4_t x) noexcept {
        const uint32x4_t u = vreinterpretq_u32_f32(x);
        const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
        const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), lsb)), 16);
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
        const uint32x4_t quiet = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x0040));
        return vbslq_u32(nan, quiet, rounded);
    }

    // n <= 4 floats at p (nothing past them read); missing ones 0. Lane by lane, not memcpy: a call in the
    // tile's epilogue would keep its accumulators in memory through the loop (the upper halves of v8-v15 do
    // not survive calls), 9 spills per k-pair in the 8×12 tile.
    static inline __attribute__((always_inline)) float32x4_t load_partial(const float* p, std::size_t n) noexcept {
        if (n >= 4) return vld1q_f32(p);
        float32x4_t r = vdupq_n_f32(0.0f);
        if (n > 0) r = vld1q_lane_f32(p, r, 0);
        if (n > 1) r = vld1q_lane_f32(p + 1, r, 1);
        if (n > 2) r = vld1q_lane_f32(p + 2, r, 2);
        return r;
    }

    // Scatters the pairs of one contiguous fp32 run src[0, kc) into dst[q·step] for pair q.
    static void scatter_pairs(const float* src, std::size_t kc, bf16_pair* dst, std::size_t step) noexcept {
        for (std::size_t k0 = 0; k0 < kc; k0 += 8) {
            const std::size_t n = min_size(8, kc - k0);
            const float32x4_t x0 = load_partial(src + k0, n), x1 = load_partial(src + k0 + 4, n > 4 ? n - 4 : 0);
            const uint32x4_t w = vreinterpretq_u32_u16(vcombine_u16(vmovn_u32(bf16_bits(x0)), vmovn_u32(bf16_bits(x1))));
            bf16_pair* d = dst + k0 / 2 * step;
            const std::size_t np = (n + 1) / 2;
            vst1q_lane_u32(d, w, 0);
            if (np > 1) vst1q_lane_u32(d + step, w, 1);
            if (np > 2) vst1q_lane_u32(d + 2 * step, w, 2);
            if (np > 3) vst1q_lane_u32(d + 3 * step, w, 3);
        }
    }

    // Two rows of n <= 32 floats (r1 null: zeros) as 32 pairs (r0[j], r1[j]), 4 columns at a time: the low
    // and high halves of each 32-bit lane.
    static void interleave_rows(const float* r0, const float* r1, std::size_t n, bf16_pair* dst) noexcept {
        for (std::size_t h = 0; h < NR; h += 4) {
            const std::size_t cnt = n > h ? min_size(4, n - h) : 0;
            const uint32x4_t lo = bf16_bits(load_partial(r0 + h, cnt));
            const uint32x4_t hi = r1 != nullptr ? bf16_bits(load_partial(r1 + h, cnt)) : vdupq_n_u32(0);
            vst1q_u32(dst + h, vorrq_u32(lo, vshlq_n_u32(hi, 16)));
        }
    }

    // c[j0, j0 + 4) ∩ [0, n) = alpha·acc + beta·c + bias, the same arithmetic for a partial vector's columns.
    static inline __attribute__((always_inline)) void store(float32x4_t acc, const GemmTileOut& out, float* c,
                                                            std::size_t j0) noexcept {
        if (j0 >= out.n) return;
        const std::size_t cnt = min_size(4, out.n - j0);
        // Every product and sum explicit (as gemm_microkernel.hpp's store_vector: -ffp-contract could fuse
        // alpha·acc + bias in one tile shape and not another).
        float32x4_t r;
        if (out.beta != 0.0f) {
            r = vfmaq_n_f32(vmulq_n_f32(acc, out.alpha), load_partial(c + j0, cnt), out.beta);
            if (out.bias != nullptr) r = vaddq_f32(r, load_partial(out.bias + j0, cnt));
        } else {
            r = out.bias != nullptr ? vfmaq_n_f32(load_partial(out.bias + j0, cnt), acc, out.alpha) : vmulq_n_f32(acc, out.alpha);
        }
        if (cnt == 4) return vst1q_f32(c + j0, r);
        vst1q_lane_f32(c + j0, r, 0);
        if (cnt > 1) vst1q_lane_f32(c + j0 + 1, r, 1);
        if (cnt > 2) vst1q_lane_f32(c + j0 + 2, r, 2);
    }

    // One M × 4·NV tile over kp k-pairs: a[q·MR + i], b[q·64 + 2j] (column j's pair).
    template <std::size_t M, std::size_t NV>
    static void tile(std::size_t kp, const bf16_pair* a, const std::uint16_t* b, const GemmTileOut& out) noexcept {
        using gemm_detail::unroll;
        float32x4_t acc[M][NV];
        unroll<M>([&](auto i) MHA_GEMM_INLINE { unroll<NV>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = vdupq_n_f32(0.0f); }); });
        for (std::size_t q = 0; q < kp; ++q) {
            bfloat16x8_t bv[NV];
            unroll<NV>([&](auto v) MHA_GEMM_INLINE { bv[v] = vreinterpretq_bf16_u16(vld1q_u16(b + q * 2 * NR + v * 8)); });
            bfloat16x8_t av[(M + 3) / 4];
            unroll<(M + 3) / 4>([&](auto h) MHA_GEMM_INLINE { av[h] = vreinterpretq_bf16_u32(vld1q_u32(a + q * MR + 4 * h)); });
            unroll<M>([&](auto i) MHA_GEMM_INLINE {
                constexpr int lane = static_cast<int>(decltype(i)::value % 4);
                unroll<NV>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = vbfdotq_laneq_f32(acc[i][v], bv[v], av[i / 4], lane); });
            });
        }
        unroll<M>([&](auto i) MHA_GEMM_INLINE {
            float* c = out.c + i * out.ldc;
            unroll<NV>([&](auto v) MHA_GEMM_INLINE { store(acc[i][v], out, c, v * 4); });
        });
    }

    using Tile = void (*)(std::size_t, const bf16_pair*, const std::uint16_t*, const GemmTileOut&) noexcept;
    struct TileRow {
        Tile t[MR];
    };
    template <std::size_t NV, std::size_t... I>
    static constexpr TileRow tile_row(std::index_sequence<I...>) {
        return {{&tile<I + 1, NV>...}};
    }
    static constexpr TileRow tiles[kTileVectors] = {tile_row<1>(std::make_index_sequence<MR>{}),
                                                    tile_row<2>(std::make_index_sequence<MR>{}),
                                                    tile_row<3>(std::make_index_sequence<MR>{})};

    static void prefetch_l2(const void* p, std::size_t bytes) noexcept {
        const char* t = static_cast<const char*>(p);
        for (std::size_t i = 0; i < bytes; i += 64) __builtin_prefetch(t + i, 0, 2);
    }

    // One row panel (m rows) × one B panel (n <= 32 columns), as tiles of 12, 12 and 8 columns.
    static void panel(std::size_t m, std::size_t n, std::size_t kp, const bf16_pair* a, const std::uint16_t* b,
                      const GemmTileOut& out) noexcept {
        for (std::size_t c0 = 0; c0 < n; c0 += kTileColumns) {
            const std::size_t w = min_size(kTileColumns, n - c0);
            const GemmTileOut part{out.c + c0, out.ldc, w, out.alpha, out.beta, out.bias != nullptr ? out.bias + c0 : nullptr};
            tiles[(w + 3) / 4 - 1].t[m - 1](kp, a, b + 2 * c0, part);
        }
    }
};

using Kernel = NeonBf16Gemm<arch_neon>;
using Driver = Bf16GemmDriver<Kernel>;

}  // namespace

void Bf16Kernels::pack_panels(arch_neon, ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept {
    Driver::pack_panels(b, tb, dst, panel_stride);
}

void Bf16Kernels::gemm(arch_neon, float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias,
                       Matrix c, std::uint16_t* scratch) noexcept {
    Driver::gemm(alpha, a, b, beta, bias, c, scratch);
}

void Bf16Kernels::pack_a(arch_neon, ConstMatrix a, std::uint16_t* dst) noexcept {
    Driver::pack_a_all(a, reinterpret_cast<bf16_pair*>(dst));
}

void Bf16Kernels::gemm_packed_a(arch_neon, float alpha, const std::uint16_t* a, std::size_t m, std::size_t k,
                                const Bf16Panels& b, float beta, const float* bias, Matrix c) noexcept {
    Driver::gemm(alpha, ConstMatrix(nullptr, m, k, k), b, beta, bias, c, nullptr, reinterpret_cast<const bf16_pair*>(a));
}

}  // namespace mha::simd
