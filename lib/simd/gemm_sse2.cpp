// Instantiates the GEMM functors of gemm.hpp for sse2 (this TU gets the ISA flags; see dispatch.hpp).
#include "gemm_impl.hpp"

namespace mha::simd {
template void GemmKernel::operator()<arch_sse2>(arch_sse2, float, ConstMatrix, Trans, ConstMatrix, Trans, float, Matrix,
                                          const GemmScratch&) const noexcept;
template void GemmPackedKernel::operator()<arch_sse2>(arch_sse2, float, ConstMatrix, Trans, const PackedMatrix::View&, float,
                                                const float*, Matrix, const GemmScratch&) const noexcept;
template void PackBKernel::operator()<arch_sse2>(arch_sse2, ConstMatrix, Trans, float*, const PackedMatrix::View&) const noexcept;
template void GemmPanelsKernel::operator()<arch_sse2>(arch_sse2, float, ConstMatrix, Trans, const PanelMatrix&, float, Matrix,
                                                const GemmScratch&) const noexcept;
template void PackPanelsKernel::operator()<arch_sse2>(arch_sse2, ConstMatrix, Trans, float*, std::size_t) const noexcept;
template std::size_t PanelWidthKernel::operator()<arch_sse2>(arch_sse2) const noexcept;
template std::size_t PackedKcKernel::operator()<arch_sse2>(arch_sse2) const noexcept;
template GemmScratchSize GemmScratchBoundKernel::operator()<arch_sse2>(arch_sse2, std::size_t, std::size_t, std::size_t, Trans,
                                                                 Trans) const noexcept;
}  // namespace mha::simd
