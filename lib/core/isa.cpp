// ISA names, and the cap set by MHA_ISA or set_isa_cap on what the CPU has. Arch-neutral: detected_isa()
// is lib/simd's (x86/cpu_features.cpp, generic/cpu_features.cpp elsewhere).
#include <atomic>
#include <cstdlib>
#include <string>

#include "mha/error.hpp"
#include "mha/isa.hpp"

namespace mha {
namespace {

Isa initial_cap() noexcept {
    const char* env = std::getenv("MHA_ISA");
    if (env == nullptr) return Isa::avx512_bf16;
    const std::string_view s(env);
    if (s == "sse2") return Isa::sse2;
    if (s == "avx2") return Isa::avx2;
    if (s == "avx512") return Isa::avx512;
    return Isa::avx512_bf16;
}

std::atomic<int>& cap() noexcept {
    static std::atomic<int> value{static_cast<int>(initial_cap())};
    return value;
}

}  // namespace

std::string_view isa_name(Isa isa) noexcept {
    switch (isa) {
        case Isa::sse2: return "sse2";
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
        case Isa::avx512_bf16: return "avx512_bf16";
    }
    return "unknown";
}

Isa parse_isa(std::string_view name) {
    if (name == "sse2") return Isa::sse2;
    if (name == "avx2") return Isa::avx2;
    if (name == "avx512") return Isa::avx512;
    if (name == "avx512_bf16") return Isa::avx512_bf16;
    throw invalid_argument("isa '" + std::string(name) + "' is not one of sse2, avx2, avx512, avx512_bf16");
}

Isa active_isa() noexcept {
    const int c = cap().load(std::memory_order_relaxed);
    const int d = static_cast<int>(detected_isa());
    return static_cast<Isa>(c < d ? c : d);
}

void set_isa_cap(Isa c) noexcept { cap().store(static_cast<int>(c), std::memory_order_relaxed); }

}  // namespace mha
