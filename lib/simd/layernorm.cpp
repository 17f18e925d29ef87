// mha::simd::layernorm_row: resolves the ISA once per call (mha::active_isa(), an atomic load) and runs
// that ISA's layernorm_kernel. Baseline TU: it only calls the kernels the ISA TUs instantiated.
#include "layernorm.hpp"
#include "simd.hpp"

namespace mha::simd {

void layernorm_row(float* y, const float* x, const float* residual, std::size_t n, const float* gamma,
                   const float* beta, float eps) noexcept {
    dispatch(active_isa(), layernorm_kernel{}, y, x, residual, n, gamma, beta, eps);
}

}  // namespace mha::simd
