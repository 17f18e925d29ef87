// Scalar reference row softmax: z = scale·x + masks (z = -inf where a mask is -inf),
// x = exp(z − max z) / Σ exp(z − max z).
// Entries at or past n_valid get probability 0; an all -inf row becomes zeros instead of NaN.
#include <cmath>
#include <limits>

#include "reference.hpp"

namespace mha::reference {

namespace {
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
}  // namespace

void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, const float* mask0,
                 const float* mask1) noexcept {
    float max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < n_valid; ++j) {
        float z = scale * x[j];
        if (mask0) z += mask0[j];
        if (mask1) z += mask1[j];
        // A -inf mask entry drops the column whatever x is (a NaN there does not poison the row).
        if ((mask0 && mask0[j] == kMinusInf) || (mask1 && mask1[j] == kMinusInf)) z = kMinusInf;
        x[j] = z;
        if (z > max) max = z;
    }
    if (max == -std::numeric_limits<float>::infinity()) {
        // Every z is -inf (fully masked: zeros) or NaN (then NaN, never a silent "masked" row).
        bool has_nan = false;
        for (std::size_t j = 0; j < n_valid; ++j)
            if (std::isnan(x[j])) has_nan = true;
        for (std::size_t j = 0; j < n; ++j) x[j] = has_nan && j < n_valid ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        return;
    }
    float sum = 0.0f;
    for (std::size_t j = 0; j < n_valid; ++j) {
        x[j] = std::exp(x[j] - max);
        sum += x[j];
    }
    for (std::size_t j = 0; j < n_valid; ++j) x[j] /= sum;
    for (std::size_t j = n_valid; j < n; ++j) x[j] = 0.0f;
}

}  // namespace mha::reference
