// Instantiates softmax_kernel for arch_sse2 (compiled with that ISA's flags; see CMakeLists.txt).
#include "softmax_impl.hpp"

namespace mha::simd {
template void softmax_kernel::operator()<arch_sse2>(arch_sse2, float*, std::size_t, std::size_t, float, MaskRow, MaskRow) const noexcept;
}  // namespace mha::simd
