// Instruction sets the SIMD backend can run on, chosen at run time.
#pragma once
#include <string_view>

namespace mha {

// Ordered: a later one implies the earlier ones. avx512_bf16 adds AVX512_BF16 (vdpbf16ps) to avx512: the fp32
// kernels run as on avx512 and bf16 GEMMs use the bf16 dot-product microkernel; below it, bf16 data is
// widened to fp32 and the fp32 kernels run (same values, not faster).
enum class Isa { sse2 = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

// Name as used by MHA_ISA and the tools: "sse2", "avx2" (AVX2 + FMA + F16C), "avx512" (F/CD/DQ/BW/VL),
// "avx512_bf16" (avx512 + AVX512_BF16).
std::string_view isa_name(Isa isa) noexcept;
// Parses a name from isa_name(); throws mha::invalid_argument for anything else.
Isa parse_isa(std::string_view name);

// The best ISA this CPU supports (x86: cpuid and the OS-enabled state; a build for another target has only
// its baseline level, reported as Isa::sse2, the lowest).
Isa detected_isa() noexcept;
// The ISA the SIMD kernels use: min(detected, cap). The cap starts as the environment variable
// MHA_ISA (if set and valid) and can be changed with set_isa_cap.
Isa active_isa() noexcept;
// Caps the ISA for later calls (process-wide; not meant to change while kernels run).
void set_isa_cap(Isa cap) noexcept;

}  // namespace mha
