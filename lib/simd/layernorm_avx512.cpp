// Instantiates layernorm_kernel for arch_avx512 (compiled with that ISA's flags; see CMakeLists.txt).
#include "layernorm_impl.hpp"

namespace mha::simd {
template void layernorm_kernel::operator()<arch_avx512>(arch_avx512, float*, const float*, const float*, std::size_t, const float*, const float*, float) const noexcept;
}  // namespace mha::simd
