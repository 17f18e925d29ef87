// Run-time ISA detection (cpuid through xsimd) and the cap set by MHA_ISA or set_isa_cap.
#include <atomic>
#include <cstdlib>
#include <string>

#include <xsimd/config/xsimd_cpuid.hpp>

#include "mha/error.hpp"
#include "mha/isa.hpp"

namespace mha {
namespace {

Isa initial_cap() noexcept {
    const char* env = std::getenv("MHA_ISA");
    if (env == nullptr) return Isa::avx512;
    const std::string_view s(env);
    if (s == "sse2") return Isa::sse2;
    if (s == "avx2") return Isa::avx2;
    return Isa::avx512;
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
    }
    return "unknown";
}

Isa parse_isa(std::string_view name) {
    if (name == "sse2") return Isa::sse2;
    if (name == "avx2") return Isa::avx2;
    if (name == "avx512") return Isa::avx512;
    throw invalid_argument("isa '" + std::string(name) + "' is not one of sse2, avx2, avx512");
}

Isa detected_isa() noexcept {
    static const Isa best = [] {
        const auto a = xsimd::available_architectures();
        if (a.avx512f && a.avx512cd && a.avx512dq && a.avx512bw) return Isa::avx512;
        if (a.fma3_avx2) return Isa::avx2;
        return Isa::sse2;
    }();
    return best;
}

Isa active_isa() noexcept {
    const int c = cap().load(std::memory_order_relaxed);
    const int d = static_cast<int>(detected_isa());
    return static_cast<Isa>(c < d ? c : d);
}

void set_isa_cap(Isa c) noexcept { cap().store(static_cast<int>(c), std::memory_order_relaxed); }

}  // namespace mha
