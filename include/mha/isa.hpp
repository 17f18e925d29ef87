// Instruction sets the SIMD backend can run on, chosen at run time.
#pragma once
#include <string_view>

namespace mha {

// Two families, one per target architecture, each ordered: a later level implies the earlier ones.
// x86-64: sse2 < avx2 < avx512 < avx512_bf16. avx512_bf16 adds AVX512_BF16 (vdpbf16ps) to avx512: the fp32
// kernels run as on avx512 and bf16 GEMMs use the bf16 dot-product microkernel; below it, bf16 data is
// widened to fp32 and the fp32 kernels run (same values, not faster).
// AArch64: neon < neon_bf16. neon_bf16 adds FEAT_BF16 to neon: the fp32 kernels run as on neon and bf16 GEMMs
// use a BFDOT microkernel; below it, as below avx512_bf16.
// A build runs only its own family's levels; a cap naming the other family's level (MHA_ISA, set_isa_cap)
// applies by rank within its family: sse2 caps at neon, avx512_bf16 caps nothing, and so on.
enum class Isa { sse2 = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, neon = 4, neon_bf16 = 5 };

// What computes a call: scalar, the plain-loop reference; simd, the xsimd kernels at the active ISA.
enum class Backend { scalar, simd };

// Name as used by MHA_ISA and the tools: "sse2", "avx2" (AVX2 + FMA + F16C), "avx512" (F/CD/DQ/BW/VL),
// "avx512_bf16" (avx512 + AVX512_BF16), "neon" (Armv8 Advanced SIMD), "neon_bf16" (neon + FEAT_BF16).
std::string_view isa_name(Isa isa) noexcept;
// Parses a name from isa_name(); throws mha::invalid_argument for anything else.
Isa parse_isa(std::string_view name);

// The best ISA this CPU supports (x86: cpuid and the OS-enabled state; AArch64: getauxval(AT_HWCAP2); a
// build for another target has only its baseline level, reported as Isa::sse2, the lowest).
Isa detected_isa() noexcept;
// The ISA the SIMD kernels use: min(detected, cap). The cap starts as the environment variable
// MHA_ISA (if set and valid) and can be changed with set_isa_cap.
Isa active_isa() noexcept;
// Caps the ISA (process-wide). Kernels read the cap each time they run, so a call running while it changes may
// mix ISAs (each kernel correct, the bits of neither): change it between calls, not during them.
void set_isa_cap(Isa cap) noexcept;
// True where isa runs bf16 GEMMs on bf16 dot-product kernels of its own (avx512_bf16, neon_bf16).
bool has_bf16_kernels(Isa isa) noexcept;
// The level whose fp32 kernels isa runs: avx512_bf16 runs avx512's, neon_bf16 neon's, the others their own.
Isa fp32_kernel_isa(Isa isa) noexcept;

}  // namespace mha
