// The SIMD GEMM's kernels as dispatchable functors (see dispatch.hpp). Entry points are in simd.hpp
// (gemm, gemm_packed, PackedMatrix).
//   GemmKernel:       C = alpha·op(A)·op(B) + beta·C
//   GemmPackedKernel: C = alpha·op(A)·B + beta·C (+ bias[j]), B prepacked for the same Arch
//   PackBKernel:      packs op(B) [K, N] into a PackedMatrix's storage for that Arch
//   GemmPanelsKernel: C = alpha·op(A)·B + beta·C, B a caller-packed PanelMatrix for the same Arch
//   PackPanelsKernel: packs op(B) into a PanelMatrix's panels; width() is that Arch's NR
// Preconditions as in simd.hpp (shapes agree, no overlap of C with A or B).
#pragma once
#include <cstddef>

#include <xsimd/xsimd.hpp>

#include "dispatch.hpp"
#include "simd.hpp"

namespace mha::simd {

// What the ISA code needs to know of a PackedMatrix's layout (PackedMatrix::View) is all it sees: the
// storage is allocated and freed in baseline code (gemm.cpp), so no allocator or container is ever
// instantiated in an ISA TU (the linker keeps one copy of such an instantiation, possibly the AVX-512
// one, and the AVX2/SSE2 paths would then run AVX-512 code).

struct GemmKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
                    const GemmScratch& scratch) const noexcept;
};

struct GemmPackedKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PackedMatrix::View& b, float beta,
                    const float* bias, Matrix c, const GemmScratch& scratch) const noexcept;
};

struct GemmPanelsKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c,
                    const GemmScratch& scratch) const noexcept;
};

struct PackPanelsKernel {
    template <class Arch>
    void operator()(Arch, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) const noexcept;
};

struct PanelWidthKernel {
    template <class Arch>
    std::size_t operator()(Arch) const noexcept;
};

// The k-block length KC of the packed layout (its panel width is PanelWidthKernel's).
struct PackedKcKernel {
    template <class Arch>
    std::size_t operator()(Arch) const noexcept;
};

// Packs op(B) [K, N] into the panels of `dst` (a View over zero-filled storage with dst.k == K, dst.n == N).
struct PackBKernel {
    template <class Arch>
    void operator()(Arch, ConstMatrix b, Trans tb, float* data, const PackedMatrix::View& dst) const noexcept;
};

struct GemmScratchBoundKernel {
    template <class Arch>
    GemmScratchSize operator()(Arch, std::size_t m, std::size_t n, std::size_t k, Trans ta, Trans tb) const noexcept;
};

// The instantiations of one Arch (PREFIX: extern, or empty in the generated TU of that Arch).
#define MHA_GEMM_INSTANTIATE(PREFIX, ARCH)                                                                            \
    PREFIX template void GemmKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans, ConstMatrix, Trans,            \
                                                      float, Matrix, const GemmScratch&) const noexcept;              \
    PREFIX template void GemmPackedKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans,                          \
                                                            const PackedMatrix::View&, float, const float*,           \
                                                            Matrix, const GemmScratch&) const noexcept;               \
    PREFIX template void PackBKernel::operator()<ARCH>(ARCH, ConstMatrix, Trans, float*,                              \
                                                       const PackedMatrix::View&) const noexcept;                     \
    PREFIX template void GemmPanelsKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans, const PanelMatrix&,      \
                                                            float, Matrix, const GemmScratch&) const noexcept;        \
    PREFIX template void PackPanelsKernel::operator()<ARCH>(ARCH, ConstMatrix, Trans, float*, std::size_t)            \
        const noexcept;                                                                                               \
    PREFIX template std::size_t PanelWidthKernel::operator()<ARCH>(ARCH) const noexcept;                              \
    PREFIX template std::size_t PackedKcKernel::operator()<ARCH>(ARCH) const noexcept;                                \
    PREFIX template GemmScratchSize GemmScratchBoundKernel::operator()<ARCH>(ARCH, std::size_t, std::size_t,          \
                                                                             std::size_t, Trans, Trans) const noexcept;
#define MHA_GEMM_EXTERN_(isa, arch, suffix) MHA_GEMM_INSTANTIATE(extern, arch)
MHA_SIMD_ARCHS(MHA_GEMM_EXTERN_)
#undef MHA_GEMM_EXTERN_

}  // namespace mha::simd
