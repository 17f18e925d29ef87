// Instantiates layernorm_kernel for arch_sse2 (compiled with that ISA's flags; see CMakeLists.txt).
#include "layernorm_impl.hpp"

namespace mha::simd {
template void layernorm_kernel::operator()<arch_sse2>(arch_sse2, float*, const float*, const float*, std::size_t, const float*, const float*, float) const noexcept;
}  // namespace mha::simd
