// Instantiates the decode kernels of decode.hpp for arch_avx2 (compiled with that ISA's flags; see CMakeLists.txt).
#include "decode_impl.hpp"

namespace mha::simd {
template void decode_scores_kernel::operator()<arch_avx2>(arch_avx2, float, ConstMatrix, ConstMatrix, Matrix) const noexcept;
template void decode_accumulate_kernel::operator()<arch_avx2>(arch_avx2, ConstMatrix, ConstMatrix, Matrix) const noexcept;
}  // namespace mha::simd
