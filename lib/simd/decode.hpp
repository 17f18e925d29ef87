// The decode-step kernels as functors templated on the xsimd Arch (recipe: dispatch.hpp).
// Contracts: simd::decode_scores and simd::decode_accumulate in simd.hpp. Definitions in decode_impl.hpp,
// instantiated once per ISA by decode_<isa>.cpp; everyone else sees only the extern declarations below.
#pragma once

#include "dispatch.hpp"
#include "mha/view.hpp"

namespace mha::simd {

// s = scale·q·kᵀ: q [M, d], k [n, d], s [M, n].
struct decode_scores_kernel {
    template <class Arch>
    void operator()(Arch, float scale, ConstMatrix q, ConstMatrix k, Matrix s) const noexcept;
};

// o += p·v: p [M, n], v [n, d], o [M, d].
struct decode_accumulate_kernel {
    template <class Arch>
    void operator()(Arch, ConstMatrix p, ConstMatrix v, Matrix o) const noexcept;
};

extern template void decode_scores_kernel::operator()<arch_avx512>(arch_avx512, float, ConstMatrix, ConstMatrix,
                                                                   Matrix) const noexcept;
extern template void decode_scores_kernel::operator()<arch_avx2>(arch_avx2, float, ConstMatrix, ConstMatrix,
                                                                 Matrix) const noexcept;
extern template void decode_scores_kernel::operator()<arch_sse2>(arch_sse2, float, ConstMatrix, ConstMatrix,
                                                                 Matrix) const noexcept;
extern template void decode_accumulate_kernel::operator()<arch_avx512>(arch_avx512, ConstMatrix, ConstMatrix,
                                                                       Matrix) const noexcept;
extern template void decode_accumulate_kernel::operator()<arch_avx2>(arch_avx2, ConstMatrix, ConstMatrix,
                                                                     Matrix) const noexcept;
extern template void decode_accumulate_kernel::operator()<arch_sse2>(arch_sse2, ConstMatrix, ConstMatrix,
                                                                     Matrix) const noexcept;

}  // namespace mha::simd
