// Run-time ISA dispatch for the SIMD kernels (recipe: ../shared/xsimd-notes.md).
//
// A kernel is a functor whose call operator is a template on the xsimd Arch, declared in the
// kernel's header and defined out of class in its *_impl.hpp. One tiny TU per ISA
// (<kernel>_avx512.cpp, <kernel>_avx2.cpp, <kernel>_sse2.cpp; CMake gives them their ISA flags by
// suffix) includes the _impl.hpp and only instantiates the operator for its Arch. The kernel's
// header declares those instantiations `extern template`, so callers never instantiate them with
// baseline flags. Callers reach the kernel through dispatch(), which picks the Arch from an Isa.
#pragma once
#include <utility>

#include <xsimd/xsimd.hpp>

#include "mha/isa.hpp"

namespace mha::simd {

using arch_avx512 = xsimd::avx512bw;
using arch_avx2 = xsimd::fma3<xsimd::avx2>;
using arch_sse2 = xsimd::sse2;

// Calls kernel(Arch{}, args...) for the Arch matching isa.
template <class Kernel, class... Args>
decltype(auto) dispatch(Isa isa, const Kernel& kernel, Args&&... args) {
    switch (isa) {
        case Isa::avx512_bf16:  // the fp32 kernels of avx512; bf16 GEMMs dispatch on their own (gemm_bf16.hpp)
        case Isa::avx512: return kernel(arch_avx512{}, std::forward<Args>(args)...);
        case Isa::avx2: return kernel(arch_avx2{}, std::forward<Args>(args)...);
        case Isa::sse2: break;
    }
    return kernel(arch_sse2{}, std::forward<Args>(args)...);
}

}  // namespace mha::simd
