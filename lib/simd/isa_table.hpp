// The one list of SIMD ISA levels the kernels are compiled for. Each kernel is instantiated once per entry
// (CMake generates one TU per kernel and entry from cmake/simd_kernel_isa.cpp.in, with that entry's flags
// from the mha_simd_isa_flags_<suffix> table in CMakeLists.txt); dispatch() (dispatch.hpp) switches over
// it; the tests (tests/isa_test_util.hpp) and lib/attention loop over kSimdIsas.
// Isa::avx512_bf16 is not an entry: it runs the avx512 fp32 kernels, plus the bf16 GEMM TU
// (gemm_bf16_avx512bf16.cpp); nor is Isa::neon_bf16, which runs the neon kernels plus gemm_bf16_neonbf16.cpp. Arch-neutral: no xsimd or intrinsics header needed to include this one.
#pragma once

#include "mha/isa.hpp"

// X(isa, arch, suffix): the mha::Isa enumerator, the xsimd arch type its kernels are instantiated on, and
// the suffix of its generated TUs and compile flags. Baseline first, in the order of mha::Isa.
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define MHA_SIMD_X86 1
#define MHA_SIMD_ARCHS(X)                   \
    X(sse2, xsimd::sse2, sse2)              \
    X(avx2, xsimd::fma3<xsimd::avx2>, avx2) \
    X(avx512, xsimd::avx512bw, avx512)
#define MHA_SIMD_ARM 0
#elif defined(__aarch64__)
#define MHA_SIMD_X86 0
#define MHA_SIMD_ARM 1
// AArch64: Advanced SIMD is part of the baseline (Isa::neon_bf16 runs these kernels too).
#define MHA_SIMD_ARCHS(X) X(neon, xsimd::neon64, neon)
#else
#define MHA_SIMD_X86 0
#define MHA_SIMD_ARM 0
// Elsewhere one level: the baseline (Isa::sse2 is the lowest level, whatever the target calls it).
#define MHA_SIMD_ARCHS(X) X(sse2, xsimd::default_arch, generic)
#endif

namespace mha::simd {

#define MHA_SIMD_ISA_ENTRY_(isa, arch, suffix) Isa::isa,
// Every level with kernels of its own, lowest first.
inline constexpr Isa kSimdIsas[] = {MHA_SIMD_ARCHS(MHA_SIMD_ISA_ENTRY_)};
#undef MHA_SIMD_ISA_ENTRY_

}  // namespace mha::simd
