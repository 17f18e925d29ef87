// mha::simd::softmax_row: resolves the ISA once per call (mha::active_isa(), an atomic load) and runs
// that ISA's softmax_kernel. Baseline TU: it only calls the kernels the ISA TUs instantiated.
#include "softmax.hpp"
#include "simd.hpp"

namespace mha::simd {

void softmax_row(float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0, MaskRow mask1,
                 ScoreRowModifiers mods) noexcept {
    dispatch(active_isa(), softmax_kernel{}, x, n, n_valid, scale, mask0, mask1, mods);
}

}  // namespace mha::simd
