// mha::alibi_standard_slopes (mha/attention.hpp): BLOOM's ALiBi slopes for H heads, computed in double and
// rounded once to float.
#include <cmath>
#include <vector>

#include "mha/attention.hpp"

namespace mha {

std::vector<float> alibi_standard_slopes(std::size_t heads) {
    std::vector<float> slopes;
    if (heads == 0) return slopes;
    std::size_t n = 1;  // the largest power of two <= heads
    while (n * 2 <= heads) n *= 2;
    slopes.reserve(heads);
    for (std::size_t k = 1; k <= n; ++k) slopes.push_back(static_cast<float>(std::exp2(-8.0 * double(k) / double(n))));
    for (std::size_t k = 1; k <= heads - n; ++k)
        slopes.push_back(static_cast<float>(std::exp2(-4.0 * double(2 * k - 1) / double(n))));
    return slopes;
}

}  // namespace mha
