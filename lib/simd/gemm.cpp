// The GEMM entry points of simd.hpp: pick the ISA (mha::active_isa() for gemm, the packing ISA for
// gemm_packed) and call that ISA's kernel; PackedMatrix's members; the per-thread pack buffers.
#include <utility>

#include "gemm.hpp"

namespace mha::simd {

float* gemm_scratch(GemmBuffer which, std::size_t floats) noexcept {
    // One buffer per thread and kind; it only grows, so after warm-up no call allocates. An allocation
    // failure here terminates (the kernels are noexcept).
    thread_local std::vector<float, xsimd::aligned_allocator<float, 64>> buffers[2];
    auto& buf = buffers[which == GemmBuffer::a ? 0 : 1];
    if (buf.size() < floats) {
        buf = {};  // free first: the old contents are not needed
        buf.resize(floats);
    }
    return buf.data();
}

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept {
    dispatch(active_isa(), GemmKernel{}, alpha, a, ta, b, tb, beta, c);
}

PackedMatrix::PackedMatrix() = default;
PackedMatrix::PackedMatrix(ConstMatrix b, Trans tb) : impl_(std::make_unique<Impl>()) {
    impl_->isa = active_isa();
    dispatch(impl_->isa, PackBKernel{}, b, tb, *impl_);
}
PackedMatrix::~PackedMatrix() = default;
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
std::size_t PackedMatrix::k() const noexcept { return impl_ ? impl_->k : 0; }
std::size_t PackedMatrix::n() const noexcept { return impl_ ? impl_->n : 0; }
Isa PackedMatrix::isa() const noexcept { return impl_ ? impl_->isa : Isa::sse2; }

void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix& b, float beta, const float* bias,
                 Matrix c) noexcept {
    dispatch(b.isa(), GemmPackedKernel{}, alpha, a, ta, b.impl(), beta, bias, c);
}

std::size_t PanelMatrix::panel_width(Isa isa) noexcept { return dispatch(isa, PanelWidthKernel{}); }

void pack_panels(Isa isa, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) noexcept {
    dispatch(isa, PackPanelsKernel{}, b, tb, dst, panel_stride);
}

void gemm_panels(float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c) noexcept {
    dispatch(b.isa, GemmPanelsKernel{}, alpha, a, ta, b, beta, c);
}

}  // namespace mha::simd
