// Instantiates the online-softmax tile kernel for avx2 (compiled with that ISA's flags only).
#include "online_softmax_impl.hpp"

namespace mha::simd {
template float softmax_tile_online_kernel::operator()<arch_avx2>(arch_avx2, float*, std::size_t, std::size_t, float,
                                                                 MaskRow, MaskRow, float&) const noexcept;
}  // namespace mha::simd
