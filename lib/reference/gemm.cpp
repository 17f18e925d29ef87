// Scalar reference GEMM: C = alpha·op(A)·op(B) + beta·C, one dot product per element of C.
// op(A) is [M, K], op(B) is [K, N]. beta == 0 overwrites C without reading it.
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

}  // namespace mha::reference
