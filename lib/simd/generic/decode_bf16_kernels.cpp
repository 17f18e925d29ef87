// The bf16 decode kernels elsewhere than x86 (x86's: lib/simd/decode_bf16_avx512bf16.cpp): there are none.
// bf16_kernels_available() is false here, so callers never reach these; they exist so that programs link.
#include <cstdlib>

#include "../decode_bf16.hpp"

namespace mha::simd {

#define MHA_BF16_DECODE_ABSENT_(E)                                                                                    \
    void Bf16DecodeKernels::scores(arch_avx512, float, MatrixView<const bfloat16>, MatrixView<const E>, Matrix,          \
                                   const RowsAhead&) noexcept {                                                          \
        std::abort();                                                                                                    \
    }                                                                                                                    \
    void Bf16DecodeKernels::accumulate(arch_avx512, MatrixView<const bfloat16>, MatrixView<const E>, Matrix,             \
                                       const RowsAhead&) noexcept {                                                      \
        std::abort();                                                                                                    \
    }
MHA_BF16_DECODE_ABSENT_(bfloat16)
MHA_BF16_DECODE_ABSENT_(float)
#undef MHA_BF16_DECODE_ABSENT_
void Bf16DecodeKernels::narrow(arch_avx512, ConstMatrix, MatrixView<bfloat16>) noexcept { std::abort(); }

}  // namespace mha::simd
