// The bf16 GEMM's kernels on targets without any (x86's: lib/simd/gemm_bf16_avx512bf16.cpp, AArch64's:
// lib/simd/gemm_bf16_neonbf16.cpp). bf16_kernels_available() is false here (no level of such a target has
// bf16 kernels), so callers never reach these; they exist so that programs link.
#include <cstdlib>

#include "../gemm_bf16.hpp"

namespace mha::simd {

void Bf16Kernels::pack_panels(arch_bf16, ConstMatrix, Trans, std::uint16_t*, std::size_t) noexcept { std::abort(); }
void Bf16Kernels::gemm(arch_bf16, float, ConstMatrix, const Bf16Panels&, float, const float*, Matrix,
                       std::uint16_t*) noexcept {
    std::abort();
}

void Bf16Kernels::pack_a(arch_bf16, ConstMatrix, std::uint16_t*) noexcept { std::abort(); }
void Bf16Kernels::gemm_packed_a(arch_bf16, float, const std::uint16_t*, std::size_t, std::size_t, const Bf16Panels&, float,
                                const float*, Matrix) noexcept {
    std::abort();
}

}  // namespace mha::simd
