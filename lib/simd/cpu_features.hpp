// Instruction-set extensions some kernels need beyond their ISA level (mha::detected_isa() gives the levels),
// answered by the target's lib/simd/{x86,arm,generic}/cpu_features.cpp: false where the target has none.
// They say what the CPU has, not whether the OS saves its state: callers also need the level whose TU runs
// them (the avx512_bf16 level for both below).
#pragma once

namespace mha::simd {

bool cpu_has_avx512_vnni() noexcept;  // vpdpbusd, vpdpwssd (the int8 decode kernels)
bool cpu_has_avx512_vbmi() noexcept;  // vpermi2b (the fp8 decode kernels on vdpbf16ps)

}  // namespace mha::simd
