// The decode-step kernels on vdpbf16ps (AVX512_BF16): bf16 query rows and probabilities against a bf16 KV
// cache's rows read in place, the products summed in fp32 two at a time. Only for Isa::avx512_bf16: callers
// check bf16_kernels_available() (gemm_bf16.hpp) and otherwise run simd::decode_scores / decode_accumulate
// on widened rows (the same products, summed one at a time).
//   scores:     s[m, j] = scale·Σ_c q[m, c]·k[j, c]     q [M, d] bf16, k [n, d], s [M, n] fp32 (written)
//   accumulate: o[m, c] += Σ_j p[m, j]·v[j, c]          p [M, n] bf16, v [n, d], o [M, d] fp32
// Order of the sums (each product of two bf16 values is exact in fp32; vdpbf16ps adds a lane's two products
// to its accumulator, rounding to nearest even, and treats inputs and results below 2^-126 as zero):
//   scores: lane l of an accumulator takes the pairs (c, c + 1) with c ≡ 2l (mod 32) in order of c, then the
//     16 lanes are added by one fixed tree. Every s[m, j] is bitwise the same whatever M and n are and
//     wherever it sits in s.
//   accumulate: v's rows in pairs (2t, 2t + 1) counted from its first row (an odd n: the last row alone),
//     each pair's two products added to o[m, c] in order t = 0, 1, ... So splitting v's rows into
//     consecutive calls at even row counts gives bitwise the same o, as does any M or column range.
// Rows are read in place (row strides in elements); nothing at or past row n of k / v, column d of a row,
// or column n of p is read, nothing outside s / o written. Read-ahead into `ahead` as in decode_impl.hpp.
// Any M, n, d >= 0. No allocation; single-threaded.
#pragma once
#include <cstddef>

#include "dispatch.hpp"
#include "mha/half.hpp"
#include "mha/view.hpp"
#include "rows_ahead.hpp"

namespace mha::simd {

// K / V rows of bf16 (a bf16 cache), or of fp32 holding bf16 values (what bf16 compute stores in an f32 cache:
// narrowed exactly as they are loaded, so both caches give the same bits).
#define MHA_BF16_DECODE_DECLARE_(E)                                                                                    \
    void decode_scores_bf16(float scale, MatrixView<const bfloat16> q, MatrixView<const E> k, Matrix s,                \
                            const RowsAhead& ahead = {}) noexcept;                                                     \
    void decode_accumulate_bf16(MatrixView<const bfloat16> p, MatrixView<const E> v, Matrix o, const RowsAhead& ahead = {}) noexcept;
MHA_BF16_DECODE_DECLARE_(bfloat16)
MHA_BF16_DECODE_DECLARE_(float)
#undef MHA_BF16_DECODE_DECLARE_
// y = bf16(x), rounded to nearest even (vcvtne2ps2bf16: NaN made quiet, inputs below 2^-126 become ±0, as
// vdpbf16ps would read them): x [M, d] fp32, y [M, d].
void narrow_rows_bf16(ConstMatrix x, MatrixView<bfloat16> y) noexcept;

// The ISA kernels (decode_bf16_avx512bf16.cpp); Arch-tagged so they are recognizably AVX-512 code.
struct Bf16DecodeKernels {
#define MHA_BF16_DECODE_KERNELS_(E)                                                                                  \
    static void scores(arch_avx512, float scale, MatrixView<const bfloat16> q, MatrixView<const E> k, Matrix s,     \
                       const RowsAhead& ahead) noexcept;                                                            \
    static void accumulate(arch_avx512, MatrixView<const bfloat16> p, MatrixView<const E> v, Matrix o,               \
                           const RowsAhead& ahead) noexcept;
    MHA_BF16_DECODE_KERNELS_(bfloat16)
    MHA_BF16_DECODE_KERNELS_(float)
#undef MHA_BF16_DECODE_KERNELS_
    static void narrow(arch_avx512, ConstMatrix x, MatrixView<bfloat16> y) noexcept;
};

}  // namespace mha::simd
