// The bf16 GEMM's kernels elsewhere than x86 (x86's: lib/simd/gemm_bf16_avx512bf16.cpp): there are none yet
// (AArch64 included: its neon_bf16 level runs the fp32 kernels on rounded values).
// bf16_kernels_available() is false here (has_bf16_kernels is false for every level), so callers never reach these;
// they exist so that programs link.
#include <cstdlib>

#include "../gemm_bf16.hpp"

namespace mha::simd {

void Bf16Kernels::pack_panels(arch_avx512, ConstMatrix, Trans, std::uint16_t*, std::size_t) noexcept { std::abort(); }
void Bf16Kernels::gemm(arch_avx512, float, ConstMatrix, const Bf16Panels&, float, const float*, Matrix,
                       std::uint16_t*) noexcept {
    std::abort();
}

void Bf16Kernels::pack_a(arch_avx512, ConstMatrix, std::uint16_t*) noexcept { std::abort(); }
void Bf16Kernels::gemm_packed_a(arch_avx512, float, const std::uint16_t*, std::size_t, std::size_t, const Bf16Panels&, float,
                                const float*, Matrix) noexcept {
    std::abort();
}

}  // namespace mha::simd
