// Scalar reference rotary position embedding (RoPE) of one head row x[0, d) at token position p:
// with r = rope.dims rotary dims and θ_k = theta^(−2k/r), k = 0 .. r/2 − 1, each pair (x1, x2) becomes
//   (x1·cos(p·θ_k) − x2·sin(p·θ_k),  x2·cos(p·θ_k) + x1·sin(p·θ_k)).
// Pairs: half (x_k, x_{k+r/2}); interleaved (x_{2k}, x_{2k+1}). Dims r..d−1 are not touched.
// θ_k, the angle, cos, sin and the rotation are computed in double and each result rounded once to
// float, so a position like 2^20 (angle up to 2^20 radians) keeps float accuracy: the angle's absolute
// error is about p·2^-53, far below a float ulp of the result.
// Preconditions (checked by the public API): rope.dims even and > 0 (resolved), theta > 0 and finite.
#include <cmath>

#include "reference.hpp"

namespace mha::reference {

void rope_row(float* x, const RopeConfig& rope, std::size_t position) noexcept {
    const std::size_t r = rope.dims, half = r / 2;
    for (std::size_t k = 0; k < half; ++k) {
        const double theta_k = std::pow(double(rope.theta), -2.0 * double(k) / double(r));
        const double angle = double(position) * theta_k;
        const double c = std::cos(angle), s = std::sin(angle);
        const std::size_t i1 = rope.style == RopeStyle::half ? k : 2 * k;
        const std::size_t i2 = rope.style == RopeStyle::half ? k + half : 2 * k + 1;
        const double x1 = x[i1], x2 = x[i2];
        x[i1] = static_cast<float>(x1 * c - x2 * s);
        x[i2] = static_cast<float>(x2 * c + x1 * s);
    }
}

}  // namespace mha::reference
