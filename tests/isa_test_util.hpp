// The SIMD ISA levels a test runs on: those of lib/simd/isa_table.hpp (simd::kSimdIsas) that this CPU has,
// optionally with the detected bf16 level (avx512_bf16 or neon_bf16: the bf16 GEMM kernels), each selected
// with mha::set_isa_cap.
#pragma once

#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include <mha/isa.hpp>

// By its path from here: also included (through attention_test_util.hpp) where lib/ is no include folder.
#include "../lib/simd/isa_table.hpp"

namespace mha_test {

// The levels of simd::kSimdIsas this CPU has, lowest first, then the detected level if with_bf16 and it has
// bf16 kernels (avx512_bf16, neon_bf16).
inline std::vector<mha::Isa> cpu_isas(bool with_bf16 = false) {
    std::vector<mha::Isa> isas;
    for (mha::Isa isa : mha::simd::kSimdIsas)
        if (isa <= mha::detected_isa()) isas.push_back(isa);
    if (with_bf16 && mha::has_bf16_kernels(mha::detected_isa())) isas.push_back(mha::detected_isa());
    return isas;
}

// Runs f(isa) (or f()) once per level of cpu_isas(with_bf16) with the cap set to it, restoring the ISA that
// was active before (also when f fails an ASSERT or throws).
template <class F>
void for_each_cpu_isa(F f, bool with_bf16 = false) {
    struct Restore {
        mha::Isa isa;
        ~Restore() { mha::set_isa_cap(isa); }
    } restore{mha::active_isa()};
    for (mha::Isa isa : cpu_isas(with_bf16)) {
        mha::set_isa_cap(isa);
        SCOPED_TRACE(mha::isa_name(isa));
        if constexpr (std::is_invocable_v<F&, mha::Isa>)
            f(isa);
        else
            f();
    }
}

}  // namespace mha_test
