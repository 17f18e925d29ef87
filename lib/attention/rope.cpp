// Rotary position embedding: angle tables in double, rotation in float (see rope.hpp).
#include "rope.hpp"

#include <cmath>

namespace mha::detail {

std::vector<double> rope_frequencies(float theta, std::size_t r) {
    std::vector<double> f(r / 2);
    for (std::size_t k = 0; k < r / 2; ++k)
        f[k] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(k) / static_cast<double>(r));
    return f;
}

void rope_table(const double* freq, std::size_t half, std::size_t p0, std::size_t n, float* cos_t, float* sin_t) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
        const double p = static_cast<double>(p0 + i);
        for (std::size_t k = 0; k < half; ++k) {
            const double a = p * freq[k];  // relative error ~2^-52: about 2^-32 rad at p = 2^20
            cos_t[i * half + k] = static_cast<float>(std::cos(a));
            sin_t[i * half + k] = static_cast<float>(std::sin(a));
        }
    }
}

void rope_rows(Matrix x, std::size_t r, RopeStyle style, const float* cos_t, const float* sin_t) noexcept {
    const std::size_t half = r / 2;
    for (std::size_t i = 0; i < x.rows; ++i) {
        float* row = x.row(i);
        const float* c = cos_t + i * half;
        const float* s = sin_t + i * half;
        if (style == RopeStyle::half) {
            for (std::size_t k = 0; k < half; ++k) {
                const float x1 = row[k], x2 = row[k + half];
                row[k] = x1 * c[k] - x2 * s[k];
                row[k + half] = x2 * c[k] + x1 * s[k];
            }
        } else {
            for (std::size_t k = 0; k < half; ++k) {
                const float x1 = row[2 * k], x2 = row[2 * k + 1];
                row[2 * k] = x1 * c[k] - x2 * s[k];
                row[2 * k + 1] = x2 * c[k] + x1 * s[k];
            }
        }
    }
}

}  // namespace mha::detail
