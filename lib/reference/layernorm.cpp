// Scalar reference layernorm of one row (TF style, seed 000): z = x (+ residual),
// y = gamma·(z − mean)/sqrt(var + eps) + beta, biased variance, computed in two passes
// (mean first, then squared deviations) so a large mean does not cancel the variance.
#include <cmath>

#include "reference.hpp"

namespace mha::reference {

void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept {
    float sum = 0.0f;
    for (std::size_t j = 0; j < n; ++j) sum += residual ? x[j] + residual[j] : x[j];
    const float mean = sum / static_cast<float>(n);
    float sq = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
        const float dev = (residual ? x[j] + residual[j] : x[j]) - mean;
        sq += dev * dev;
    }
    const float inv_std = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
    for (std::size_t j = 0; j < n; ++j) {
        const float z = residual ? x[j] + residual[j] : x[j];
        const float g = gamma ? gamma[j] : 1.0f;
        const float b = beta ? beta[j] : 0.0f;
        y[j] = g * (z - mean) * inv_std + b;
    }
}

}  // namespace mha::reference
