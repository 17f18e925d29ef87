// mha::detected_isa() on targets other than x86 (lib/simd/x86/cpu_features.cpp is x86's): no SIMD level
// beyond the baseline, the one level of lib/simd/isa_table.hpp there.
#include "mha/isa.hpp"
#include "../cpu_features.hpp"

namespace mha {

Isa detected_isa() noexcept { return Isa::sse2; }

namespace simd {
bool cpu_has_avx512_vnni() noexcept { return false; }
bool cpu_has_avx512_vbmi() noexcept { return false; }
}  // namespace simd

}  // namespace mha
