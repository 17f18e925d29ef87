// mha::detected_isa() on x86: cpuid and the OS-enabled register state in XCR0; and the extensions of
// lib/simd/cpu_features.hpp. The only place in the library that asks the CPU what it has (lib/core/isa.cpp
// caps it; lib/simd/generic/ and lib/simd/arm/ are the other targets').
#include <cpuid.h>

#include <cstdint>

#include "mha/isa.hpp"
#include "../cpu_features.hpp"

namespace mha {

// xsimd 8.1's detection reads cpuid feature bits only: it does not check that the OS saves the YMM/ZMM
// state (XCR0), nor AVX512VL, which the AVX-512 TUs are compiled for. Hence our own check.
Isa detected_isa() noexcept {
    static const Isa best = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return Isa::sse2;
        const bool fma = (ecx >> 12 & 1) != 0, osxsave = (ecx >> 27 & 1) != 0, avx = (ecx >> 28 & 1) != 0,
                   f16c = (ecx >> 29 & 1) != 0;
        if (!osxsave || !avx || !fma || !f16c) return Isa::sse2;
        std::uint32_t xcr0_lo = 0, xcr0_hi = 0;
        __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
        const std::uint64_t xcr0 = (std::uint64_t{xcr0_hi} << 32) | xcr0_lo;
        if ((xcr0 & 0x6) != 0x6) return Isa::sse2;  // XMM and YMM state
        if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return Isa::sse2;
        if ((ebx >> 5 & 1) == 0) return Isa::sse2;  // AVX2
        const bool avx512 = (ebx >> 16 & 1) && (ebx >> 17 & 1) && (ebx >> 28 & 1) && (ebx >> 30 & 1) &&
                            (ebx >> 31 & 1);  // F, DQ, CD, BW, VL
        const bool zmm_state = (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper halves, ZMM16-31
        if (!avx512 || !zmm_state) return Isa::avx2;
        // AVX512_BF16: leaf 7 sub-leaf 1, EAX bit 5 (sub-leaf 1 exists when leaf 7.0 EAX >= 1).
        unsigned max_sub = 0;
        __get_cpuid_count(7, 0, &max_sub, &ebx, &ecx, &edx);
        if (max_sub < 1 || __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return Isa::avx512;
        return (eax >> 5 & 1) != 0 ? Isa::avx512_bf16 : Isa::avx512;
    }();
    return best;
}

namespace simd {
namespace {
// cpuid leaf 7 sub-leaf 0, ECX bit `bit`.
bool leaf7_ecx(unsigned bit) noexcept {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ecx >> bit & 1) != 0;
}
}  // namespace

bool cpu_has_avx512_vnni() noexcept {
    static const bool has = leaf7_ecx(11);
    return has;
}
bool cpu_has_avx512_vbmi() noexcept {
    static const bool has = leaf7_ecx(1);
    return has;
}
}  // namespace simd

}  // namespace mha
