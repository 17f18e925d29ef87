// Instantiates the decode kernels of decode.hpp for arch_avx2 and every K / V element type (compiled with that
// ISA's flags; see CMakeLists.txt).
#include "decode_impl.hpp"

namespace mha::simd {
MHA_DECODE_INSTANTIATE(, arch_avx2)
}  // namespace mha::simd
