// The bf16 decode kernels' entry points (decode_bf16.hpp). Baseline TU: it only calls the kernels of
// decode_bf16_avx512bf16.cpp, after checking that they may run.
#include "decode_bf16.hpp"

#include <cassert>

#include "gemm_bf16.hpp"

namespace mha::simd {

#define MHA_BF16_DECODE_DEFINE_(E)                                                                                    \
    void decode_scores_bf16(float scale, MatrixView<const bfloat16> q, MatrixView<const E> k, Matrix s,                 \
                            const RowsAhead& ahead) noexcept {                                                          \
        assert(bf16_kernels_available() && q.cols == k.cols && s.rows == q.rows && s.cols == k.rows);                   \
        Bf16DecodeKernels::scores(arch_avx512{}, scale, q, k, s, ahead);                                                \
    }                                                                                                                   \
    void decode_accumulate_bf16(MatrixView<const bfloat16> p, MatrixView<const E> v, Matrix o, const RowsAhead& ahead) noexcept { \
        assert(bf16_kernels_available() && p.rows == o.rows && p.cols == v.rows && v.cols == o.cols);                   \
        Bf16DecodeKernels::accumulate(arch_avx512{}, p, v, o, ahead);                                                   \
    }
MHA_BF16_DECODE_DEFINE_(bfloat16)
MHA_BF16_DECODE_DEFINE_(float)
#undef MHA_BF16_DECODE_DEFINE_

void narrow_rows_bf16(ConstMatrix x, MatrixView<bfloat16> y) noexcept {
    assert(bf16_kernels_available() && x.rows == y.rows && x.cols == y.cols);
    Bf16DecodeKernels::narrow(arch_avx512{}, x, y);
}

}  // namespace mha::simd
