// The decode-step kernels as functors templated on the xsimd Arch and on the K / V element type E (float,
// bfloat16 or float16: a KV cache's element type, widened to float as it is loaded) (recipe: dispatch.hpp).
// Contracts: simd::decode_scores and simd::decode_accumulate in simd.hpp. Definitions in decode_impl.hpp,
// instantiated once per ISA by the generated decode_<isa>.cpp (dispatch.hpp); everyone else sees only the extern declarations below.
#pragma once

#include "dispatch.hpp"
#include "mha/half.hpp"
#include "../core/element_format.hpp"
#include "mha/view.hpp"
#include "rows_ahead.hpp"

namespace mha::simd {

// Query values (M·d) at most for the int8 scores on dot products (decode_int8_dot_impl.hpp: about 50 KB on the stack).
inline constexpr std::size_t kDotMaxQueryValues = 8192;

// int8 K (decode_scores only): where this holds, the scores are integer dot products instead (vpdpbusd, on CPUs
// with AVX512_VNNI when the active ISA is avx512_bf16; lib/simd/decode_int8_dot_impl.hpp): each query row is
// quantized per block of 32 (int8 with the fp32 scale amax / 127), and s[m, j] = scale·Σ_b s_q,b·s_k,b·Σ q·k with
// exact integer sums, so Q's rounding joins K's in the error (docs/kv-quantization.md); the same bits for any M, n,
// row placement and thread count, but not those of a float cache of the dequantized values; a query block holding
// ±inf makes its row's scores NaN. d a multiple of 64, M·d <= kDotMaxQueryValues (else the widened kernel).
bool int8_scores_on_dot_products(std::size_t M, std::size_t d) noexcept;

// Columns (d) at most for the int8 P·V on dot products (decode_int8_pv_impl.hpp: 13 KB on the stack).
inline constexpr std::size_t kPvMaxCols = 512;

// int8 V (decode_accumulate only): where this holds, P·V runs on integer dot products (vpdpwssd; the same CPUs and
// ISA level as int8_scores_on_dot_products; lib/simd/decode_int8_pv_impl.hpp): per group of at most 64 keys (ending
// at the multiples of 64 of v.origin + j, and at n), query row and block of 32 columns, P times the rows' block
// scales is rounded to int16 at 15 bits of the group's largest, the products summed exactly in int32 and added to
// o with one fma per group: o[m, c] = fma(float(Σ_j u_j·v[j, c]), t, o[m, c]). P's rounding joins V's in the error
// (docs/kv-quantization.md); the same bits for any M, row placement and thread count, and for any split of the
// rows into calls at the multiples of 64 of their absolute positions; a group holding a non-finite P·s makes
// its block's outputs NaN. d a multiple of 32, at most kPvMaxCols (else the widened kernel).
bool int8_values_on_dot_products(std::size_t d) noexcept;

// Query rows (M) and columns (d) at most for the bf16 decode on vdpbf16ps (decode_bf16_dot_impl.hpp).
inline constexpr std::size_t kBf16DotMaxRows = 128;
inline constexpr std::size_t kBf16DotMaxCols = 512;

// bf16 compute over a bf16 cache (decode_scores_bf16 / decode_accumulate_bf16 in simd.hpp): where this holds, the
// scores and P·V run on vdpbf16ps (the avx512_bf16 level; lib/simd/decode_bf16_dot_impl.hpp): q and p rounded to
// bf16, each product exact, a lane's two products added at once. d a multiple of 32, at most kBf16DotMaxCols;
// M <= kBf16DotMaxRows and M·d <= kDotMaxQueryValues.
bool bf16_decode_on_dot_products(std::size_t M, std::size_t d) noexcept;
// The same for an fp8 cache: bf16_decode_on_dot_products and AVX512_VBMI (the codes' conversion, vpermi2b).
bool fp8_decode_on_dot_products(std::size_t M, std::size_t d) noexcept;

// s = scale·q·kᵀ: q [M, d], k [n, d], s [M, n].
struct decode_scores_kernel {
    template <class Arch, class E>
    void operator()(Arch, float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead,
                    float kv_scale) const noexcept;
};

// o += p·v: p [M, n], v [n, d], o [M, d].
struct decode_accumulate_kernel {
    template <class Arch, class E>
    void operator()(Arch, ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead, float kv_scale) const noexcept;
};

// The same on vdpbf16ps where bf16_decode_on_dot_products(M, d) holds, else the widened kernels above.
// E: bfloat16, float (rows holding bf16 values, what bf16 compute stores in an f32 cache), fp8_e4m3 or fp8_e5m2
// (kv_scale: the tensor's scale; 1 for the others).
struct decode_scores_bf16_kernel {
    template <class Arch, class E>
    void operator()(Arch, float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead,
                    float kv_scale) const noexcept;
};
struct decode_accumulate_bf16_kernel {
    template <class Arch, class E>
    void operator()(Arch, ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead, float kv_scale) const noexcept;
};

// The instantiations of one Arch for every element type (PREFIX: extern, or empty in the Arch's generated TU).
#define MHA_DECODE_INSTANTIATE_TYPE(PREFIX, ARCH, E)                                                                  \
    PREFIX template void decode_scores_kernel::operator()<ARCH, E>(ARCH, float, ConstMatrix, BlockedRows<E>,        \
                                                                   Matrix, const RowsAhead&, float) const noexcept;   \
    PREFIX template void decode_accumulate_kernel::operator()<ARCH, E>(ARCH, ConstMatrix, BlockedRows<E>, Matrix,    \
                                                                       const RowsAhead&, float) const noexcept;
// Every element type of MHA_KV_ELEMENT_TYPES (lib/core/element_format.hpp).
#define MHA_DECODE_INSTANTIATE_ELEMENT_(PREFIX, ARCH, name, E) MHA_DECODE_INSTANTIATE_TYPE(PREFIX, ARCH, E)
#define MHA_DECODE_INSTANTIATE(PREFIX, ARCH)                                                                          \
    MHA_KV_ELEMENT_TYPES_WITH(MHA_DECODE_INSTANTIATE_ELEMENT_, PREFIX, ARCH)                                          \
    MHA_DECODE_INSTANTIATE_BF16(PREFIX, ARCH, bfloat16) MHA_DECODE_INSTANTIATE_BF16(PREFIX, ARCH, float)             \
    MHA_DECODE_INSTANTIATE_BF16(PREFIX, ARCH, fp8_e4m3) MHA_DECODE_INSTANTIATE_BF16(PREFIX, ARCH, fp8_e5m2)
#define MHA_DECODE_INSTANTIATE_BF16(PREFIX, ARCH, E)                                                                  \
    PREFIX template void decode_scores_bf16_kernel::operator()<ARCH, E>(ARCH, float, ConstMatrix, BlockedRows<E>,    \
                                                                        Matrix, const RowsAhead&, float) const noexcept; \
    PREFIX template void decode_accumulate_bf16_kernel::operator()<ARCH, E>(ARCH, ConstMatrix, BlockedRows<E>, Matrix, \
                                                                            const RowsAhead&, float) const noexcept;

#define MHA_DECODE_EXTERN_(isa, arch, suffix) MHA_DECODE_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_DECODE_EXTERN_)
#undef MHA_DECODE_EXTERN_

}  // namespace mha::simd
