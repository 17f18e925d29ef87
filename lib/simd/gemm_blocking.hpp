// GEMM register tiles and cache blocks per ISA (BLIS terms). The microkernel computes an MR×NR tile
// of C (NR = NV vectors of W floats); the loops around it (gemm_impl.hpp) are
//   for jc in N step NC:                     B block KC×NC, packed once, stays in L2 (see NC)
//     for pc in K, ceil(K/KC) equal k-blocks:
//       pack B[pc.., jc..]                   (or read it in place, see gemm_impl.hpp)
//       for ir in M step MR:                 A micro-panel MR×KC stays in L1 (packed only if op(A) = Aᵀ)
//         for jr in NC step NR:              B micro-panels stream from L2
//           microkernel(A micro-panel, B micro-panel) → C[ir.., jc + jr..]
// Why these sizes (targets: Sapphire Rapids 48 KB L1d / 2 MB L2 per core, two 512-bit FMA ports; and
// the Zen 4 host where they were measured, 32 KB L1d / 1 MB L2, 512-bit FMA at one per cycle):
//   KC = 768: C tiles are loaded and stored once per k-block; at K = 768 (BERT-base) one block, so C is
//     written once. Smaller KC measured slower on 1024×2304×768 (KC 256: 85, 384: 97, 768: 103 GFLOP/s
//     in an earlier loop order; KC 512 vs 768 now: 106.5 vs 107.7), because each extra k-block is one
//     more read and write of C. KC 1024 gains nothing at K = 768 and makes the A micro-panel spill L1.
//     The A micro-panel MR×KC (AVX-512: 8×768×4 B = 24 KB) still fits L1d.
//   NC = 512: the packed B block KC×NC = 1.5 MB fits Sapphire Rapids' 2 MB L2, so each B element
//     comes from L2 for all M/MR micro-panels of A, and A is re-read from L3 only N/NC times. On Zen 4
//     the block overflows the 1 MB L2 and B panels stream from L3 instead, which measured no slower:
//     NC 128/256/384/512/768 gave 107.5/108.2/107.8/109.2/107.9 GFLOP/s (medians of 3-5 runs).
//   MC: none. A micro-panel is used for one sweep over the B block while it sits in L1 and is not
//     needed again for that (jc, pc), so there is no A block to size for L2.
// Register tiles (measured on 1024×2304×768, in-context, see bench_gemm): AVX-512 6×32 and 8×32
// ~105-108 GFLOP/s, 12×32 and 14×32 ~101-103 (more rows = more A streams and spilled row offsets);
// 8×32 keeps 16 accumulators, enough independent FMAs for two FMA ports with 4-cycle latency.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd {

template <class Arch>
struct GemmBlocking;

// AVX-512 (32 zmm): 16 accumulators + 2 B vectors + 1 broadcast.
template <>
struct GemmBlocking<arch_avx512> {
    static constexpr std::size_t W = 16, MR = 8, NV = 2, NR = NV * W;
    static constexpr std::size_t KC = 768, NC = 512;
};

// AVX2 + FMA (16 ymm): 6×16 = 12 accumulators + 2 B vectors + 1 broadcast.
template <>
struct GemmBlocking<arch_avx2> {
    static constexpr std::size_t W = 8, MR = 6, NV = 2, NR = NV * W;
    static constexpr std::size_t KC = 768, NC = 512;
};

// SSE2 (16 xmm, no FMA): 6×8 = 12 accumulators + 2 B vectors + 1 broadcast.
template <>
struct GemmBlocking<arch_sse2> {
    static constexpr std::size_t W = 4, MR = 6, NV = 2, NR = NV * W;
    static constexpr std::size_t KC = 768, NC = 512;
};

#if MHA_SIMD_ARM
// NEON (32 q registers of 4 floats): 12×8 = 24 accumulators + 2 B vectors + 3 A vectors (MR = 12 floats,
// used by lane: fmla v.4s, v.4s, v.s[i]) = 29 registers. Per k step 24 FMAs against 2 + 3 = 5 loads of
// 16 bytes (4.8 FMAs per load, 24 of 29 instructions FMAs). 24 independent accumulators cover 4 FMA pipes
// × 4 cycles of latency (Neoverse V1/V2: 4 × 128-bit FMA per cycle, 3 loads per cycle). NR stays a
// power of two (panels of K and V tile the 256-key blocks); untuned (no Arm machine here).
// A micro-panel 12×768×4 B = 36 KB fits the 64 KB L1d of V1/V2.
template <>
struct GemmBlocking<arch_neon> {
    static constexpr std::size_t W = 4, MR = 12, NV = 2, NR = NV * W;
    static constexpr std::size_t KC = 768, NC = 512;
};
#elif !MHA_SIMD_X86
// A generic arch (the target's baseline): as SSE2, untuned.
template <>
struct GemmBlocking<arch_generic> {
    static constexpr std::size_t W = xsimd::batch<float, arch_generic>::size, MR = 6, NV = 2, NR = NV * W;
    static constexpr std::size_t KC = 768, NC = 512;
};
#endif

}  // namespace mha::simd
