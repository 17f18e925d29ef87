// mha::simd::decode_scores / decode_accumulate: resolve the ISA once per call (mha::active_isa(), an
// atomic load) and run that ISA's kernel for the K / V element type. Baseline TU: it only calls the kernels
// the ISA TUs instantiated.
#include "decode.hpp"
#include "cpu_features.hpp"
#include "simd.hpp"

namespace mha::simd {

bool int8_scores_on_dot_products(std::size_t M, std::size_t d) noexcept {
    // AVX512_VNNI implies nothing about the OS state: the avx512_bf16 level (checked with it) does.
    return cpu_has_avx512_vnni() && active_isa() == Isa::avx512_bf16 && M != 0 && d != 0 && d % 64 == 0 &&
           M * d <= kDotMaxQueryValues;
}

bool int8_values_on_dot_products(std::size_t d) noexcept {
    return int8_scores_on_dot_products(1, 64) && d != 0 && d % 32 == 0 && d <= kPvMaxCols;
}

bool bf16_decode_on_dot_products(std::size_t M, std::size_t d) noexcept {
    return active_isa() == Isa::avx512_bf16 && MHA_SIMD_X86 && M != 0 && M <= kBf16DotMaxRows && d != 0 && d % 32 == 0 &&
           d <= kBf16DotMaxCols && M * d <= kDotMaxQueryValues;
}

bool fp8_decode_on_dot_products(std::size_t M, std::size_t d) noexcept {
    // AVX512_VBMI implies nothing about the OS state: the avx512_bf16 level (checked with it) does.
    return cpu_has_avx512_vbmi() && bf16_decode_on_dot_products(M, d);
}

#define MHA_DECODE_BF16_DEFINE_(E)                                                                                  \
    void decode_scores_bf16(float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead,           \
                            float kv_scale) noexcept {                                                                 \
        dispatch(active_isa(), decode_scores_bf16_kernel{}, scale, q, k, s, ahead, kv_scale);                          \
    }                                                                                                                  \
    void decode_accumulate_bf16(ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead,                     \
                                float kv_scale) noexcept {                                                             \
        dispatch(active_isa(), decode_accumulate_bf16_kernel{}, p, v, o, ahead, kv_scale);                             \
    }
MHA_DECODE_BF16_DEFINE_(bfloat16)
MHA_DECODE_BF16_DEFINE_(float)
MHA_DECODE_BF16_DEFINE_(fp8_e4m3)
MHA_DECODE_BF16_DEFINE_(fp8_e5m2)
#undef MHA_DECODE_BF16_DEFINE_

#define MHA_DECODE_DEFINE_(name, E)                                                            \
    void decode_scores(float scale, ConstMatrix q, BlockedRows<E> k, Matrix s, const RowsAhead& ahead, float kv_scale) noexcept { \
        dispatch(active_isa(), decode_scores_kernel{}, scale, q, k, s, ahead, kv_scale);       \
    }                                                                                          \
    void decode_accumulate(ConstMatrix p, BlockedRows<E> v, Matrix o, const RowsAhead& ahead, float kv_scale) noexcept { \
        dispatch(active_isa(), decode_accumulate_kernel{}, p, v, o, ahead, kv_scale);          \
    }
MHA_KV_ELEMENT_TYPES(MHA_DECODE_DEFINE_)
#undef MHA_DECODE_DEFINE_

}  // namespace mha::simd
