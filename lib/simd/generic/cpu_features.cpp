// mha::detected_isa() on targets other than x86 (lib/simd/x86/cpu_features.cpp is x86's): no SIMD level
// beyond the baseline, the one level of lib/simd/isa_table.hpp there.
#include "mha/isa.hpp"

namespace mha {

Isa detected_isa() noexcept { return Isa::sse2; }

}  // namespace mha
