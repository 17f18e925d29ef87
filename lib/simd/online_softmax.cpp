// simd::softmax_tile_online and simd::scale_row: dispatch to the best allowed ISA.
#include "online_softmax.hpp"
#include "simd.hpp"

namespace mha::simd {

float softmax_tile_online(float* x, std::size_t n, std::size_t n_valid, float scale, MaskRow mask0,
                          MaskRow mask1, float& running_max, ScoreRowModifiers mods) noexcept {
    return dispatch(active_isa(), softmax_tile_online_kernel{}, x, n, n_valid, scale, mask0, mask1, running_max, mods);
}

void scale_row(float* x, std::size_t n, float alpha) noexcept { dispatch(active_isa(), scale_row_kernel{}, x, n, alpha); }

}  // namespace mha::simd
