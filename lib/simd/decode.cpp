// mha::simd::decode_scores / decode_accumulate: resolve the ISA once per call (mha::active_isa(), an
// atomic load) and run that ISA's kernel for the K / V element type. Baseline TU: it only calls the kernels
// the ISA TUs instantiated.
#include "decode.hpp"
#include "simd.hpp"

namespace mha::simd {

void decode_scores(float scale, ConstMatrix q, ConstMatrix k, Matrix s) noexcept {
    dispatch(active_isa(), decode_scores_kernel{}, scale, q, k, s);
}
void decode_scores(float scale, ConstMatrix q, MatrixView<const bfloat16> k, Matrix s) noexcept {
    dispatch(active_isa(), decode_scores_kernel{}, scale, q, k, s);
}
void decode_scores(float scale, ConstMatrix q, MatrixView<const float16> k, Matrix s) noexcept {
    dispatch(active_isa(), decode_scores_kernel{}, scale, q, k, s);
}

void decode_accumulate(ConstMatrix p, ConstMatrix v, Matrix o) noexcept {
    dispatch(active_isa(), decode_accumulate_kernel{}, p, v, o);
}
void decode_accumulate(ConstMatrix p, MatrixView<const bfloat16> v, Matrix o) noexcept {
    dispatch(active_isa(), decode_accumulate_kernel{}, p, v, o);
}
void decode_accumulate(ConstMatrix p, MatrixView<const float16> v, Matrix o) noexcept {
    dispatch(active_isa(), decode_accumulate_kernel{}, p, v, o);
}

}  // namespace mha::simd
