// ISA names, and the cap set by MHA_ISA or set_isa_cap on what the CPU has. Arch-neutral: detected_isa()
// is lib/simd's (x86/cpu_features.cpp, arm/cpu_features.cpp, generic/cpu_features.cpp elsewhere).
#include <atomic>
#include <cstdlib>
#include <string>

#include "mha/error.hpp"
#include "mha/isa.hpp"

namespace mha {
namespace {

constexpr int kNoCap = -1;
constexpr Isa kAllIsas[] = {Isa::sse2, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::neon, Isa::neon_bf16};

bool is_arm(Isa isa) noexcept { return isa == Isa::neon || isa == Isa::neon_bf16; }
// The rank of a level within its family (0 = the family's baseline).
int rank(Isa isa) noexcept { return is_arm(isa) ? static_cast<int>(isa) - static_cast<int>(Isa::neon) : static_cast<int>(isa); }

int initial_cap() noexcept {
    const char* env = std::getenv("MHA_ISA");
    if (env == nullptr) return kNoCap;
    for (Isa isa : kAllIsas)
        if (isa_name(isa) == env) return static_cast<int>(isa);
    return kNoCap;  // unknown names cap nothing (the tools reject them with a message)
}

std::atomic<int>& cap() noexcept {
    static std::atomic<int> value{initial_cap()};
    return value;
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
    switch (isa) {
        case Isa::sse2: return "sse2";
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
        case Isa::avx512_bf16: return "avx512_bf16";
        case Isa::neon: return "neon";
        case Isa::neon_bf16: return "neon_bf16";
    }
    return "unknown";
}

Isa parse_isa(std::string_view name) {
    for (Isa isa : kAllIsas)
        if (isa_name(isa) == name) return isa;
    throw invalid_argument("isa '" + std::string(name) + "' is not one of sse2, avx2, avx512, avx512_bf16, neon, neon_bf16");
}

Isa active_isa() noexcept {
    const int c = cap().load(std::memory_order_relaxed);
    const Isa d = detected_isa();
    if (c == kNoCap) return d;
    // Within the detected family, the lower rank of the two.
    const int r = rank(static_cast<Isa>(c));
    if (r >= rank(d)) return d;
    return static_cast<Isa>(static_cast<int>(d) - rank(d) + r);
}

void set_isa_cap(Isa c) noexcept { cap().store(static_cast<int>(c), std::memory_order_relaxed); }

bool has_bf16_kernels(Isa isa) noexcept { return isa == Isa::avx512_bf16 || isa == Isa::neon_bf16; }

Isa fp32_kernel_isa(Isa isa) noexcept {
    if (isa == Isa::avx512_bf16) return Isa::avx512;
    if (isa == Isa::neon_bf16) return Isa::neon;
    return isa;
}

}  // namespace mha
