// The SIMD GEMM's kernels as dispatchable functors (see dispatch.hpp), the packed-B layout, and the
// per-thread pack buffers. Entry points are in simd.hpp (gemm, gemm_packed, PackedMatrix).
//   GemmKernel:       C = alpha·op(A)·op(B) + beta·C
//   GemmPackedKernel: C = alpha·op(A)·B + beta·C (+ bias[j]), B prepacked for the same Arch
//   PackBKernel:      packs op(B) [K, N] into a PackedMatrix::Impl for that Arch
//   GemmPanelsKernel: C = alpha·op(A)·B + beta·C, B a caller-packed PanelMatrix for the same Arch
//   PackPanelsKernel: packs op(B) into a PanelMatrix's panels; width() is that Arch's NR
// Preconditions as in simd.hpp (shapes agree, no overlap of C with A or B).
#pragma once
#include <cstddef>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "dispatch.hpp"
#include "simd.hpp"

namespace mha::simd {

// op(B) [k, n] cut into k-blocks of kc rows (the last may be shorter) and, within each, panels of nr
// columns (the last zero-padded to nr). Panel jr of the k-block starting at row pc holds
// op(B)[pc + p, jr·nr + j] at data[pc·n_padded + jr·kcb·nr + p·nr + j], kcb = min(kc, k − pc).
struct PackedMatrix::Impl {
    std::vector<float, xsimd::aligned_allocator<float, 64>> data;
    std::size_t k = 0, n = 0;
    std::size_t kc = 0, nr = 0, n_padded = 0;
    Isa isa = Isa::sse2;
};

struct GemmKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta,
                    Matrix c) const noexcept;
};

struct GemmPackedKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PackedMatrix::Impl& b, float beta,
                    const float* bias, Matrix c) const noexcept;
};

struct GemmPanelsKernel {
    template <class Arch>
    void operator()(Arch, float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c) const noexcept;
};

struct PackPanelsKernel {
    template <class Arch>
    void operator()(Arch, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) const noexcept;
};

struct PanelWidthKernel {
    template <class Arch>
    std::size_t operator()(Arch) const noexcept;
};

struct PackBKernel {
    // Allocates packed.data (may throw std::bad_alloc); sets every field of packed.
    template <class Arch>
    void operator()(Arch, ConstMatrix b, Trans tb, PackedMatrix::Impl& packed) const;
};

// This thread's pack buffer for A or B blocks: at least `floats` floats, 64-byte aligned. Allocated on
// first use and grown when a larger block comes, so steady-state calls do not allocate. Valid until the
// same thread asks for the same buffer again.
enum class GemmBuffer { a, b };
float* gemm_scratch(GemmBuffer which, std::size_t floats) noexcept;

#define MHA_GEMM_EXTERN(ARCH)                                                                                \
    extern template void GemmKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans, ConstMatrix, Trans, \
                                                      float, Matrix) const noexcept;                         \
    extern template void GemmPackedKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans,                 \
                                                            const PackedMatrix::Impl&, float, const float*, \
                                                            Matrix) const noexcept;                          \
    extern template void PackBKernel::operator()<ARCH>(ARCH, ConstMatrix, Trans, PackedMatrix::Impl&) const;      \
    extern template void GemmPanelsKernel::operator()<ARCH>(ARCH, float, ConstMatrix, Trans, const PanelMatrix&,  \
                                                            float, Matrix) const noexcept;                       \
    extern template void PackPanelsKernel::operator()<ARCH>(ARCH, ConstMatrix, Trans, float*, std::size_t)        \
        const noexcept;                                                                                          \
    extern template std::size_t PanelWidthKernel::operator()<ARCH>(ARCH) const noexcept;
MHA_GEMM_EXTERN(arch_avx512)
MHA_GEMM_EXTERN(arch_avx2)
MHA_GEMM_EXTERN(arch_sse2)
#undef MHA_GEMM_EXTERN

}  // namespace mha::simd
