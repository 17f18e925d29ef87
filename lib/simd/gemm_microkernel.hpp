// GEMM microkernel: one register tile C[M×n] = alpha·A·B + beta·C (+ bias[j]) for a k-range of kc.
//   A: M rows × kc, element (i, p) at a[i + p·lda] (ALayout::col_panel: a packed A panel with lda = MR,
//      or a transposed A read in place) or at a[i·lda + p] (ALayout::row_major: A read in place).
//   B: kc rows of NV·W floats, row p at b + p·ldb (a packed panel with ldb = NR, or B read in place); or
//      with BT = uint16_t, of bf16 bits widened exactly (load_b). All NV·W elements of every row must be
//      readable; columns >= n are computed and dropped.
//   C: M rows × n columns (n <= NV·W) at c with row stride ldc. beta == 0: C is not read.
//   bias: nullptr or n floats added to every row.
// The accumulators stay in registers; M and NV are template parameters so that every tail size is
// the same code with a smaller tile (no padding FMAs on the row tail).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "dispatch.hpp"
#if MHA_SIMD_X86
#include <immintrin.h>  // load_b's widening, named in every x86 TU (each instantiates its own Arch's branch)
#endif
#if MHA_SIMD_ARM
#include <arm_neon.h>
#endif

namespace mha::simd {

enum class ALayout { col_panel, row_major };

// Where a tile's results go, and how they combine with what is there.
struct GemmTileOut {
    float* c;
    std::size_t ldc;
    std::size_t n;  // valid columns
    float alpha, beta;
    const float* bias;  // nullptr: none
};

namespace gemm_detail {

#define MHA_GEMM_INLINE __attribute__((always_inline))

// f(integral_constant<size_t, 0>) ... f(integral_constant<size_t, N-1>), fully unrolled. Everything on
// the way is force-inlined so the accumulator arrays stay in registers.
template <class F, std::size_t... I>
inline MHA_GEMM_INLINE void unroll_impl(F& f, std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
}
template <std::size_t N, class F>
inline MHA_GEMM_INLINE void unroll(F&& f) {
    unroll_impl(f, std::make_index_sequence<N>{});
}

// x·y + z, fused where the ISA has FMA. Spelled with the intrinsic on AVX-512 because xsimd 8.1 has no
// fused kernel there and leaves the contraction to the compiler (clang does not contract by default).
template <class Arch>
inline MHA_GEMM_INLINE xsimd::batch<float, Arch> fmadd(xsimd::batch<float, Arch> x, xsimd::batch<float, Arch> y,
                                                       xsimd::batch<float, Arch> z) {
    if constexpr (std::is_same_v<Arch, arch_avx512>)
        return _mm512_fmadd_ps(x, y, z);
    else if constexpr (std::is_same_v<Arch, arch_avx2>)
        return _mm256_fmadd_ps(x, y, z);
#if MHA_SIMD_ARM
    else if constexpr (std::is_same_v<Arch, arch_neon>)
        return vfmaq_f32(z, x, y);  // fused whatever -ffp-contract says
#endif
    else
        return x * y + z;
}

// x·y + z as fmadd<Arch> computes it: fused on the same Archs, else a product and a sum in two statements
// (one expression may be contracted under clang's default -ffp-contract=on when the flags allow FMA).
template <class Arch>
inline MHA_GEMM_INLINE float fmadd_scalar(float x, float y, float z) {
#if MHA_SIMD_ARM
    constexpr bool fused_on_arm = std::is_same_v<Arch, arch_neon>;
#else
    constexpr bool fused_on_arm = false;
#endif
    if constexpr (std::is_same_v<Arch, arch_avx512> || std::is_same_v<Arch, arch_avx2> || fused_on_arm) {
        return __builtin_fmaf(x, y, z);
    } else {
        const float p = x * y;
        return p + z;
    }
}

// c[j] = alpha·r[j] + beta·c[j] (beta·c only when read_c) + bias[j] for j < n: a partial vector's
// columns, kept out of line so that the rarely used tail does not bloat the unrolled tiles. A template
// on Arch like everything here, so each ISA TU has its own copy (no weak symbol shared across ISAs).
// The operations of store_vector, spelled out, so that -ffp-contract cannot fuse them differently.
template <class Arch>
__attribute__((noinline)) void store_tail(const float* r, float* c, std::size_t n, float alpha, float beta,
                                                 bool read_c, const float* bias) noexcept {
    for (std::size_t j = 0; j < n; ++j) {
        float v;
        if (read_c) {
            v = fmadd_scalar<Arch>(beta, c[j], alpha * r[j]);
            if (bias != nullptr) v += bias[j];
        } else {
            v = bias != nullptr ? fmadd_scalar<Arch>(alpha, r[j], bias[j]) : alpha * r[j];
        }
        c[j] = v;
    }
}

// W floats of a B row: loaded (f32 panels), or widened from bf16 bits (PanelElement::bf16): a bf16 value is the
// high half of its float, so a zero-extend and a shift give it exactly.
template <class Arch>
inline MHA_GEMM_INLINE xsimd::batch<float, Arch> load_b(const float* b) {
    return xsimd::batch<float, Arch>::load_unaligned(b);
}
template <class Arch>
inline MHA_GEMM_INLINE xsimd::batch<float, Arch> load_b(const std::uint16_t* b) {
    using batch = xsimd::batch<float, Arch>;
    if constexpr (false) {
#if MHA_SIMD_X86
    } else if constexpr (std::is_same_v<Arch, arch_avx512>) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))), 16));
    } else if constexpr (std::is_same_v<Arch, arch_avx2>) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))), 16));
    } else if constexpr (std::is_same_v<Arch, arch_sse2>) {  // no zero-extend before SSE4.1: interleave with zeros
        return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
#endif
#if MHA_SIMD_ARM
    } else if constexpr (std::is_same_v<Arch, arch_neon>) {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(b), 16));
#endif
    } else {
        alignas(64) float w[batch::size];
        for (std::size_t i = 0; i < batch::size; ++i) {  // no inline function of baseline code in an ISA TU
            const std::uint32_t u = std::uint32_t{b[i]} << 16;
            __builtin_memcpy(&w[i], &u, sizeof(u));
        }
        return batch::load_aligned(w);
    }
}

// Writes one vector of results: c[j0, min(j0 + W, n)) = alpha·acc + beta·c + bias; C is read only when
// ReadC, and nothing at or past column n is touched.
template <class Arch, bool ReadC>
inline MHA_GEMM_INLINE void store_vector(xsimd::batch<float, Arch> acc, float* c, std::size_t j0, std::size_t n,
                                         float alpha, float beta, const float* bias) {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t W = batch::size;
    if (j0 >= n) return;
    if (j0 + W <= n) {
        // Every product and sum explicit (-ffp-contract would fuse alpha·acc + bias in some tiles and not in
        // others, and row blocks of one GEMM would then differ in the last bit).
        batch r;
        if constexpr (ReadC) {
            r = fmadd<Arch>(batch(beta), batch::load_unaligned(c + j0), acc * batch(alpha));
            if (bias != nullptr) r += batch::load_unaligned(bias + j0);
        } else {
            r = bias != nullptr ? fmadd<Arch>(acc, batch(alpha), batch::load_unaligned(bias + j0)) : acc * batch(alpha);
        }
        r.store_unaligned(c + j0);
    } else {
        alignas(64) float tmp[W];
        acc.store_aligned(tmp);
        store_tail<Arch>(tmp, c + j0, n - j0, alpha, beta, ReadC, bias != nullptr ? bias + j0 : nullptr);
    }
}

}  // namespace gemm_detail

// P panels side by side (P > 1: a few rows of A, where one panel's M·NV accumulators are too few FMA chains to
// hide the FMA latency): vector v of a B row is vector v % NV of panel v / NV, the panels panel_step elements
// apart; C's columns are the panels' in order (n <= P·NV·W). Each C element is the same sum as with P = 1.
template <class Arch, std::size_t M, std::size_t NV, ALayout L, class BT, std::size_t P>
inline MHA_GEMM_INLINE void gemm_microkernel_panels(std::size_t kc, const float* a, std::size_t lda, const BT* b,
                                                    std::size_t ldb, std::size_t panel_step, const GemmTileOut& out) noexcept {
    using batch = xsimd::batch<float, Arch>;
    constexpr std::size_t W = batch::size, NT = P * NV;
    using gemm_detail::unroll;
    // Copies: stores to C must not make the compiler reload these from `out`.
    const std::size_t n = out.n, ldc = out.ldc;
    const float alpha = out.alpha, beta = out.beta;
    const float* bias = out.bias;
    float* c = out.c;

    batch acc[M][NT];
    unroll<M>([&](auto i) MHA_GEMM_INLINE { unroll<NT>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = batch(0.0f); }); });

    // Ask for the C tile now so that its cache misses overlap the k loop instead of stalling the stores.
    unroll<M>([&](auto i) MHA_GEMM_INLINE {
        unroll<NT>([&](auto v) MHA_GEMM_INLINE { __builtin_prefetch(c + i * ldc + v * W, 1, 3); });
    });
    // row_major A: M row pointers advance by one float per k; col_panel A: one pointer advances by lda.
    for (std::size_t p = 0; p < kc; ++p) {
        batch bv[NT];
        unroll<NT>([&](auto v) MHA_GEMM_INLINE {
            constexpr std::size_t panel = decltype(v)::value / NV, vec = decltype(v)::value % NV;
            bv[v] = gemm_detail::load_b<Arch>(b + panel * panel_step + vec * W);
        });
#if MHA_SIMD_ARM
        if constexpr (std::is_same_v<Arch, arch_neon> && L == ALayout::col_panel && M % 4 == 0) {
            // A's M floats as M/4 vectors, each used by lane (fmla by element): M/4 loads instead of M
            // broadcasts. Same products and sums as the broadcast form, so the same bits.
            unroll<M / 4>([&](auto g) MHA_GEMM_INLINE {
                const float32x4_t a4 = vld1q_f32(a + 4 * g);
                unroll<4>([&](auto lane) MHA_GEMM_INLINE {
                    unroll<NT>([&](auto v) MHA_GEMM_INLINE {
                        acc[4 * g + lane][v] = vfmaq_laneq_f32(acc[4 * g + lane][v], bv[v], a4, lane);
                    });
                });
            });
        } else
#endif
        unroll<M>([&](auto i) MHA_GEMM_INLINE {
            const batch ai(L == ALayout::col_panel ? a[i] : a[i * lda]);
            unroll<NT>([&](auto v) MHA_GEMM_INLINE { acc[i][v] = gemm_detail::fmadd<Arch>(ai, bv[v], acc[i][v]); });
        });
        a += L == ALayout::col_panel ? lda : 1;
        b += ldb;
    }

    unroll<M>([&](auto i) MHA_GEMM_INLINE {
        unroll<NT>([&](auto v) MHA_GEMM_INLINE {
            if (beta != 0.0f)
                gemm_detail::store_vector<Arch, true>(acc[i][v], c + i * ldc, v * W, n, alpha, beta, bias);
            else
                gemm_detail::store_vector<Arch, false>(acc[i][v], c + i * ldc, v * W, n, alpha, beta, bias);
        });
    });
}

template <class Arch, std::size_t M, std::size_t NV, ALayout L, class BT = float>
void gemm_microkernel(std::size_t kc, const float* a, std::size_t lda, const BT* b, std::size_t ldb,
                      const GemmTileOut& out) noexcept {
    gemm_microkernel_panels<Arch, M, NV, L, BT, 1>(kc, a, lda, b, ldb, 0, out);
}

// P full panels at once (see gemm_microkernel_panels).
template <class Arch, std::size_t M, std::size_t NV, ALayout L, class BT, std::size_t P>
void gemm_microkernel_wide(std::size_t kc, const float* a, std::size_t lda, const BT* b, std::size_t ldb,
                           std::size_t panel_step, const GemmTileOut& out) noexcept {
    gemm_microkernel_panels<Arch, M, NV, L, BT, P>(kc, a, lda, b, ldb, panel_step, out);
}

}  // namespace mha::simd
