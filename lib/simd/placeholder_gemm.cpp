// TEMPORARY: forwards the SIMD entry points to the reference until the xsimd kernels land.
#include <vector>

#include "../reference/reference.hpp"
#include "simd.hpp"

namespace mha::simd {

struct PackedMatrix::Impl {
    std::vector<float> b;  // op(B) as [K, N]
    std::size_t k = 0, n = 0;
};
PackedMatrix::PackedMatrix() = default;
PackedMatrix::PackedMatrix(ConstMatrix b, Trans tb) : impl_(std::make_unique<Impl>()) {
    impl_->k = tb == Trans::no ? b.rows : b.cols;
    impl_->n = tb == Trans::no ? b.cols : b.rows;
    impl_->b.resize(impl_->k * impl_->n);
    for (std::size_t p = 0; p < impl_->k; ++p)
        for (std::size_t j = 0; j < impl_->n; ++j) impl_->b[p * impl_->n + j] = tb == Trans::no ? b(p, j) : b(j, p);
}
PackedMatrix::~PackedMatrix() = default;
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
std::size_t PackedMatrix::k() const noexcept { return impl_->k; }
std::size_t PackedMatrix::n() const noexcept { return impl_->n; }
Isa PackedMatrix::isa() const noexcept { return Isa::sse2; }

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept {
    reference::gemm(alpha, a, ta, b, tb, beta, c);
}
void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix& b, float beta, const float* bias,
                 Matrix c) noexcept {
    const auto& p = b.impl();
    reference::gemm(alpha, a, ta, ConstMatrix(p.b.data(), p.k, p.n), Trans::no, beta, c);
    if (bias)
        for (std::size_t i = 0; i < c.rows; ++i)
            for (std::size_t j = 0; j < c.cols; ++j) c(i, j) += bias[j];
}
}  // namespace mha::simd
