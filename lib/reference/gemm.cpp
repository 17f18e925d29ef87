// Scalar reference GEMM: C = alpha·op(A)·op(B) + beta·C, one dot product per element of C.
// op(A) is [M, K], op(B) is [K, N]. beta == 0 overwrites C without reading it.
// Also the Linear layer y = x·Wᵀ + b of the attention reference, in fp32 or with bf16 operands
// (reference.hpp).
#include <vector>

#include "reference.hpp"

namespace mha::reference {

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) noexcept {
    const std::size_t m = c.rows, n = c.cols;
    const std::size_t k = ta == Trans::no ? a.cols : a.rows;
    for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
            float sum = 0.0f;
            for (std::size_t p = 0; p < k; ++p) {
                const float aip = ta == Trans::no ? a(i, p) : a(p, i);
                const float bpj = tb == Trans::no ? b(p, j) : b(j, p);
                sum += aip * bpj;
            }
            c(i, j) = beta == 0.0f ? alpha * sum : alpha * sum + beta * c(i, j);
        }
    }
}

void linear(ConstMatrix x, ConstMatrix w, const float* bias, Matrix y, DataType compute) {
    if (compute != DataType::bf16) {
        reference::gemm(1.0f, x, Trans::no, w, Trans::yes, 0.0f, y);
        for (std::size_t i = 0; i < y.rows; ++i)
            for (std::size_t j = 0; j < y.cols; ++j) y(i, j) += bias[j];
        return;
    }
    // Rounded copies of the operands (once each, not once per product).
    const std::size_t k = x.cols;
    std::vector<float> xr(x.rows * k), wr(w.rows * k);
    for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t p = 0; p < k; ++p) xr[i * k + p] = mha::round_to_bf16(x(i, p));
    for (std::size_t j = 0; j < w.rows; ++j)
        for (std::size_t p = 0; p < k; ++p) wr[j * k + p] = mha::round_to_bf16(w(j, p));
    for (std::size_t i = 0; i < y.rows; ++i)
        for (std::size_t j = 0; j < y.cols; ++j) {
            double sum = 0.0;
            for (std::size_t p = 0; p < k; ++p) sum += double(xr[i * k + p]) * double(wr[j * k + p]);
            y(i, j) = static_cast<float>(sum + double(bias[j]));
        }
}

void round_to_bf16(Matrix x) noexcept {
    for (std::size_t i = 0; i < x.rows; ++i)
        for (std::size_t j = 0; j < x.cols; ++j) x(i, j) = mha::round_to_bf16(x(i, j));
}

}  // namespace mha::reference
