// The bf16 GEMM's kernels on AVX512_BF16 (compiled with -mavx512bf16; run only when active_isa() is
// avx512_bf16): packing fp32 A and B into bf16 pairs (vcvtne2ps2bf16, round to nearest even) and the
// MR×32 microkernel on vdpbf16ps, which adds two bf16 products per fp32 lane (twice the fp32 FMA's
// products per instruction). Layout and contract: gemm_bf16.hpp; the loops around the microkernel:
// gemm_bf16_driver.hpp.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "gemm_bf16_driver.hpp"

namespace mha::simd {
namespace {

using u32a = bf16_pair;

// 8 rows × 2 vectors = 16 accumulators, as the fp32 kernel (two dot-product ports, latency ~6 cycles).
constexpr std::size_t MR = kBf16Rows, NR = kBf16PanelWidth;

template <class Arch>
struct Bf16Gemm {
    static std::size_t min_size(std::size_t a, std::size_t b) noexcept { return b < a ? b : a; }

    // n <= 32 floats at p (nothing past them read) as 16 lanes of bf16 pairs (p[2t], p[2t + 1]); missing ones 0.
    static inline __attribute__((always_inline)) __m512i pairs(const float* p, std::size_t n) noexcept {
        const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
        const __mmask16 m1 = n >= 32 ? __mmask16(0xffff) : n > 16 ? __mmask16((1u << (n - 16)) - 1) : __mmask16(0);
        const __m512 lo = _mm512_maskz_loadu_ps(m0, p), hi = _mm512_maskz_loadu_ps(m1, p + 16);
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }

    // Scatters the pairs of one contiguous fp32 run src[0, kc) into dst[q·step] for pair q.
    static void scatter_pairs(const float* src, std::size_t kc, u32a* dst, std::size_t step) noexcept {
        alignas(64) std::uint32_t w[16];
        for (std::size_t k0 = 0; k0 < kc; k0 += 32) {
            _mm512_store_si512(w, pairs(src + k0, min_size(32, kc - k0)));
            const std::size_t np = (min_size(32, kc - k0) + 1) / 2;
            for (std::size_t t = 0; t < np; ++t) dst[(k0 / 2 + t) * step] = w[t];
        }
    }

    // Two rows of n <= 32 floats (r1 null: zeros) as 32 pairs (r0[j], r1[j]), 16 columns at a time: the low
    // and high halves of each 32-bit lane.
    static void interleave_rows(const float* r0, const float* r1, std::size_t n, u32a* dst) noexcept {
        for (std::size_t h = 0; h < NR; h += 16) {
            const std::size_t cnt = n > h ? min_size(16, n - h) : 0;
            const __mmask16 mk = cnt >= 16 ? __mmask16(0xffff) : __mmask16((1u << cnt) - 1);
            const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r0 + h)));
            const __m512i hi = r1 != nullptr ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, r1 + h)))
                                             : _mm512_setzero_si512();
            _mm512_store_si512(static_cast<void*>(dst + h), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }

    // One MR×32 (or smaller) tile over kp k-pairs: a[q·MR + i], b[q·64 + ...]; with P > 1, P full panels side by
    // side (panel p at b + p·panel_stride, C columns [32p, 32p + 32)). Each C element is the same chain of
    // vdpbf16ps over q whatever P is. ahead (non-null): the bytes [ahead, ahead + kp·ahead_step) are asked into L2
    // along the way, ahead_step bytes per k-pair (ahead_step <= 128).
    template <std::size_t M, std::size_t NV, std::size_t P = 1>
    static void tile(std::size_t kp, const u32a* a, const std::uint16_t* b, std::size_t panel_stride, const GemmTileOut& out,
                     const char* ahead, std::size_t ahead_step) noexcept {
        using gemm_detail::unroll;
        static_assert(P == 1 || NV == 2, "several panels are full ones");
        __m512 acc[M][P * NV];
        unroll<M>([&](auto i) MHA_GEMM_INLINE { unroll<P * NV>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = _mm512_setzero_ps(); }); });
        for (std::size_t q = 0; q < kp; ++q) {
            if (ahead != nullptr) {
                _mm_prefetch(ahead + q * ahead_step, _MM_HINT_T1);
                if (ahead_step > 64) _mm_prefetch(ahead + q * ahead_step + 64, _MM_HINT_T1);
            }
            __m512bh bv[P * NV];
            unroll<P * NV>([&](auto v) MHA_GEMM_INLINE {
                bv[v] = (__m512bh)_mm512_load_si512(b + v / NV * panel_stride + q * 2 * NR + v % NV * 32);
            });
            unroll<M>([&](auto i) MHA_GEMM_INLINE {
                const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[q * MR + i]));
                unroll<P * NV>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]); });
            });
        }
        const __m512 alpha = _mm512_set1_ps(out.alpha), beta = _mm512_set1_ps(out.beta);
        unroll<M>([&](auto i) MHA_GEMM_INLINE {
            unroll<P * NV>([&](auto v) MHA_GEMM_INLINE {
                const std::size_t j = v * 16;
                if (j >= out.n) return;
                const __mmask16 mk = out.n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (out.n - j)) - 1);
                float* c = out.c + i * out.ldc + j;
                // Every product and sum explicit, as in gemm_microkernel.hpp's store_vector: -ffp-contract would
                // fuse alpha·acc + bias in some tile shapes and not in others, and rows alone would then differ in
                // the last bit from the same rows in a longer call.
                __m512 r;
                if (out.beta != 0.0f) {
                    r = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mk, c), _mm512_mul_ps(acc[i][v], alpha));
                    if (out.bias != nullptr) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, out.bias + j));
                } else {
                    r = out.bias != nullptr ? _mm512_fmadd_ps(acc[i][v], alpha, _mm512_maskz_loadu_ps(mk, out.bias + j))
                                            : _mm512_mul_ps(acc[i][v], alpha);
                }
                _mm512_mask_storeu_ps(c, mk, r);
            });
        });
    }

    using Tile = void (*)(std::size_t, const u32a*, const std::uint16_t*, std::size_t, const GemmTileOut&, const char*,
                          std::size_t) noexcept;
    struct TileRow {
        Tile t[MR];
    };
    template <std::size_t NV, std::size_t... I>
    static constexpr TileRow tile_row(std::index_sequence<I...>) {
        return {{&tile<I + 1, NV>...}};
    }
    static constexpr TileRow tiles[2] = {tile_row<1>(std::make_index_sequence<MR>{}), tile_row<2>(std::make_index_sequence<MR>{})};

    // One row panel (m rows) × one B panel (n <= 32 columns).
    static void panel(std::size_t m, std::size_t n, std::size_t kp, const u32a* a, const std::uint16_t* b,
                      const GemmTileOut& out) noexcept {
        tiles[n > 16 ? 1 : 0].t[m - 1](kp, a, b, 0, out, nullptr, 0);
    }
    // The same, asking [ahead, ahead + kp·ahead_step) into L2 meanwhile (ahead_step <= 128 bytes per k-pair): the
    // few-rows loop spreads the next B panel over its row panels' tiles this way.
    static void panel_reading_ahead(std::size_t m, std::size_t n, std::size_t kp, const u32a* a, const std::uint16_t* b,
                                    const GemmTileOut& out, const void* ahead, std::size_t ahead_step) noexcept {
        tiles[n > 16 ? 1 : 0].t[m - 1](kp, a, b, 0, out, static_cast<const char*>(ahead), ahead_step);
    }

    // One or two rows: wide_panels(m) full B panels per tile (8 accumulators, 8 dot-product chains against the
    // latency; one panel at a time gives 2 or 4), their columns read side by side.
    static constexpr std::size_t wide_panels(std::size_t m) noexcept { return m == 1 ? 4 : m == 2 ? 2 : 0; }
    static void wide(std::size_t m, std::size_t kp, const u32a* a, const std::uint16_t* b, std::size_t panel_stride,
                     const GemmTileOut& out) noexcept {
        if (m == 1)
            tile<1, 2, 4>(kp, a, b, panel_stride, out, nullptr, 0);
        else
            tile<2, 2, 2>(kp, a, b, panel_stride, out, nullptr, 0);
    }
};

}  // namespace

void Bf16Kernels::pack_panels(arch_avx512, ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept {
    Bf16GemmDriver<Bf16Gemm<arch_avx512>>::pack_panels(b, tb, dst, panel_stride);
}

void Bf16Kernels::gemm(arch_avx512, float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias,
                       Matrix c, std::uint16_t* scratch) noexcept {
    Bf16GemmDriver<Bf16Gemm<arch_avx512>>::gemm(alpha, a, b, beta, bias, c, scratch);
}

void Bf16Kernels::pack_a(arch_avx512, ConstMatrix a, std::uint16_t* dst) noexcept {
    Bf16GemmDriver<Bf16Gemm<arch_avx512>>::pack_a_all(a, reinterpret_cast<u32a*>(dst));
}

void Bf16Kernels::gemm_packed_a(arch_avx512, float alpha, const std::uint16_t* a, std::size_t m, std::size_t k,
                                const Bf16Panels& b, float beta, const float* bias, Matrix c) noexcept {
    Bf16GemmDriver<Bf16Gemm<arch_avx512>>::gemm(alpha, ConstMatrix(nullptr, m, k, k), b, beta, bias, c, nullptr,
                                                reinterpret_cast<const u32a*>(a));
}

}  // namespace mha::simd
