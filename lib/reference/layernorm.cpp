// Scalar reference layernorm of one row (TF style, seed 000): z = x (+ residual),
// y = gamma·(z − mean)/sqrt(var + eps) + beta, biased variance, computed in two passes
// (mean first, then squared deviations) so a large mean does not cancel the variance.
// Accumulates in double and rounds once at the end: a float mean is off by up to n·u·|mean|, and
// 1/sqrt(var + eps) amplifies that (a constant row with eps = 1e-12 would give beta ± 1, not beta).
#include <cmath>

#include "reference.hpp"

namespace mha::reference {

void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept {
    // x + residual is exact in double (two floats), so a constant row has deviations exactly 0.
    const auto z = [&](std::size_t j) { return residual ? double(x[j]) + double(residual[j]) : double(x[j]); };
    double sum = 0.0;
    for (std::size_t j = 0; j < n; ++j) sum += z(j);
    const double mean = sum / static_cast<double>(n);
    double sq = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
        const double dev = z(j) - mean;
        sq += dev * dev;
    }
    const double inv_std = 1.0 / std::sqrt(sq / static_cast<double>(n) + static_cast<double>(eps));
    // y may alias x or residual: element j is read before it is written.
    for (std::size_t j = 0; j < n; ++j) {
        const double g = gamma ? gamma[j] : 1.0;
        const double b = beta ? beta[j] : 0.0;
        y[j] = static_cast<float>(g * ((z(j) - mean) * inv_std) + b);
    }
}

}  // namespace mha::reference
