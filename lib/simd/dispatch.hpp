// Run-time ISA dispatch for the SIMD kernels (recipe: ../shared/xsimd-notes.md).
//
// A kernel is a functor whose call operator is a template on the xsimd Arch, declared in the
// kernel's header and defined out of class in its *_impl.hpp. For each entry of isa_table.hpp, CMake
// generates one tiny TU (<build>/simd/<kernel>_<suffix>.cpp, with that entry's ISA flags) that includes
// the _impl.hpp and only expands the kernel's MHA_<KERNEL>_INSTANTIATE macro for its Arch. The kernel's
// header declares those instantiations `extern template` for every entry, so callers never instantiate
// them with baseline flags. Callers reach the kernel through dispatch(), which picks the Arch from an Isa.
#pragma once
#include <utility>

#include <xsimd/xsimd.hpp>

#include "isa_table.hpp"
#include "mha/isa.hpp"

namespace mha::simd {

// arch_sse2, arch_avx2, arch_avx512 (arch_<suffix>): the xsimd arch of each entry.
#define MHA_SIMD_ARCH_ALIAS_(isa, arch, suffix) using arch_##suffix = arch;
MHA_SIMD_ARCHS(MHA_SIMD_ARCH_ALIAS_)
#undef MHA_SIMD_ARCH_ALIAS_
#if !MHA_SIMD_X86
// Elsewhere the x86 names stay declared for the kernels' `if constexpr (std::is_same_v<Arch, arch_avx2>)`
// branches, as tags that no kernel is instantiated on (those branches are discarded).
template <int>
struct x86_arch_absent {};
using arch_sse2 = x86_arch_absent<0>;
using arch_avx2 = x86_arch_absent<1>;
using arch_avx512 = x86_arch_absent<2>;
#endif

namespace dispatch_detail {
template <class Void, class First, class...>
struct first_of {
    using type = First;
};
}  // namespace dispatch_detail
#define MHA_SIMD_ARCH_ARG_(isa, arch, suffix) , arch
// The table's lowest entry, the fallback of dispatch().
using arch_baseline = dispatch_detail::first_of<void MHA_SIMD_ARCHS(MHA_SIMD_ARCH_ARG_)>::type;
#undef MHA_SIMD_ARCH_ARG_

// Calls kernel(Arch{}, args...) for the Arch of isa's entry in the table; a level above the table's highest
// runs the highest (Isa::avx512_bf16: the avx512 fp32 kernels; bf16 GEMMs dispatch on their own,
// gemm_bf16.hpp).
template <class Kernel, class... Args>
decltype(auto) dispatch(Isa isa, const Kernel& kernel, Args&&... args) {
    constexpr Isa top = kSimdIsas[sizeof(kSimdIsas) / sizeof(kSimdIsas[0]) - 1];
    switch (isa > top ? top : isa) {
#define MHA_SIMD_DISPATCH_CASE_(level, arch, suffix) \
    case Isa::level: return kernel(arch{}, std::forward<Args>(args)...);
        MHA_SIMD_ARCHS(MHA_SIMD_DISPATCH_CASE_)
#undef MHA_SIMD_DISPATCH_CASE_
        default: break;
    }
    return kernel(arch_baseline{}, std::forward<Args>(args)...);
}

}  // namespace mha::simd
