// Row-kernel helpers shared by the softmax and layernorm kernels: partial ("head") loads and stores
// of the last k < W lanes of a row, and the sum of a batch's lanes. Masked instructions on AVX-512,
// a padded stack buffer elsewhere. Every helper is a template on Arch or exists only in AVX-512 TUs,
// so no weak symbol compiled with one ISA's flags can be picked by the linker for another ISA's path.
#pragma once
#include <cstddef>

#include "dispatch.hpp"

namespace mha::simd::row_detail {

template <class Arch>
using batch = xsimd::batch<float, Arch>;

// Lanes [0, k) from p, the others `fill`; k < batch size. Reads only p[0, k).
template <class Arch>
batch<Arch> load_head(Arch, const float* p, std::size_t k, float fill) noexcept {
    alignas(64) float buf[batch<Arch>::size];
    for (std::size_t i = 0; i < batch<Arch>::size; ++i) buf[i] = i < k ? p[i] : fill;
    return batch<Arch>::load_aligned(buf);
}

// Writes lanes [0, k) of v to p; k < batch size. Writes only p[0, k).
template <class Arch>
void store_head(Arch, const batch<Arch>& v, float* p, std::size_t k) noexcept {
    alignas(64) float buf[batch<Arch>::size];
    v.store_aligned(buf);
    for (std::size_t i = 0; i < k; ++i) p[i] = buf[i];
}

// Sum of the lanes.
template <class Arch>
float reduce_add(Arch, const batch<Arch>& v) noexcept {
    return xsimd::hadd(v);
}

#if defined(__AVX512F__)
inline __mmask16 head_mask(std::size_t k) noexcept { return static_cast<__mmask16>((1u << k) - 1u); }
inline batch<arch_avx512> load_head(arch_avx512, const float* p, std::size_t k, float fill) noexcept {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), head_mask(k), p);
}
inline void store_head(arch_avx512, const batch<arch_avx512>& v, float* p, std::size_t k) noexcept {
    _mm512_mask_storeu_ps(p, head_mask(k), v);
}
// xsimd::hadd would split into two avx2 batches, whose weak out-of-line helpers (in Debug builds)
// would then be AVX-512-encoded copies the linker may pick for the AVX2 path.
inline float reduce_add(arch_avx512, const batch<arch_avx512>& v) noexcept { return _mm512_reduce_add_ps(v); }
#endif

}  // namespace mha::simd::row_detail
