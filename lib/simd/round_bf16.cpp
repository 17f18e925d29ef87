// simd::round_to_bf16_inplace: dispatches to the best allowed ISA.
#include "round_bf16.hpp"
#include "simd.hpp"

namespace mha::simd {

void round_to_bf16_inplace(float* x, std::size_t n) noexcept { dispatch(active_isa(), round_bf16_kernel{}, x, n); }

void round_to_bf16_inplace(Matrix x) noexcept {
    if (x.stride == x.cols) return round_to_bf16_inplace(x.data, x.rows * x.cols);
    for (std::size_t r = 0; r < x.rows; ++r) round_to_bf16_inplace(x.row(r), x.cols);
}

}  // namespace mha::simd
