// The operand type of a computation's GEMMs, decided once per layer or call (AttentionConfig::compute and
// what the CPU has), then consulted by every step instead of testing the compute type itself:
//   f32:          fp32 operands, the fp32 kernels.
//   bf16_rounded: operands rounded to bfloat16 (nearest even) at the documented points, the fp32 kernels
//                 (a CPU without AVX512_BF16, or an ISA cap below it: same roundings; the weights' panels
//                 hold bf16, widened exactly by the microkernel).
//   bf16_kernels: the same roundings, the products on vdpbf16ps (operands packed as bf16 panels).
#pragma once
#include "mha/half.hpp"

namespace mha::detail {

enum class GemmOperands { f32, bf16_rounded, bf16_kernels };

// compute: the layer's compute type; bf16_ready: the bf16 kernels are allowed now and what they read was
// prepared (the layer's bf16 weight panels, the core's bf16 scratch).
constexpr GemmOperands gemm_operands(DataType compute, bool bf16_ready) noexcept {
    if (compute != DataType::bf16) return GemmOperands::f32;
    return bf16_ready ? GemmOperands::bf16_kernels : GemmOperands::bf16_rounded;
}
// The operands are rounded to bfloat16 (by the step itself unless the bf16 kernels round while packing).
constexpr bool rounds_to_bf16(GemmOperands g) noexcept { return g != GemmOperands::f32; }
constexpr bool on_bf16_kernels(GemmOperands g) noexcept { return g == GemmOperands::bf16_kernels; }

}  // namespace mha::detail
