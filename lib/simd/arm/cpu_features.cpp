// mha::detected_isa() on AArch64 Linux: the kernel's hardware capabilities (getauxval). Advanced SIMD is
// part of the baseline; FEAT_BF16 (BFDOT / BFMMLA, Armv8.6, Graviton 3 and later) is HWCAP2_BF16.
#include <sys/auxv.h>

#include "mha/isa.hpp"
#include "../cpu_features.hpp"

namespace mha {

namespace {
constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16 (asm/hwcap.h), spelled out for older headers
}

Isa detected_isa() noexcept {
    static const Isa best = (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0 ? Isa::neon_bf16 : Isa::neon;
    return best;
}

namespace simd {
bool cpu_has_avx512_vnni() noexcept { return false; }
bool cpu_has_avx512_vbmi() noexcept { return false; }
}  // namespace simd

}  // namespace mha
