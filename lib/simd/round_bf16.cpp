// simd::round_to_bf16_inplace: dispatches to the best allowed ISA.
#include "round_bf16.hpp"
#include "simd.hpp"

namespace mha::simd {

void round_to_bf16_inplace(float* x, std::size_t n) noexcept { dispatch(active_isa(), round_bf16_kernel{}, x, n); }

}  // namespace mha::simd
