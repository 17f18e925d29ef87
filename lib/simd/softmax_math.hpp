// Math shared by the softmax kernels (row softmax and the fused path's online tile softmax): the largest
// lane, exp(d) for the d = z − max <= 0 of a softmax, and the two passes both kernels make over a row
// (z and its max; exp and its sum). Included only by per-ISA kernel TUs; every helper is a template on
// Arch or an overload for one Arch, called only from that Arch's TU (no weak symbol shared across ISAs).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "mask_row.hpp"
#include "row_tail.hpp"

namespace mha::simd::softmax_detail {

using row_detail::batch;

// Compile-time constants (no numeric_limits call is emitted in an ISA TU, even at -O0).
inline constexpr float kInf = __builtin_inff();
inline constexpr float kNegInf = -__builtin_inff();
inline constexpr float kNaN = __builtin_nanf("");

// Lane numbers, to build the "lane < k" mask of a tail.
alignas(64) inline constexpr float lane_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// Largest lane (lanes are never NaN here).
template <class Arch>
float reduce_max(Arch, const batch<Arch>& v) noexcept {
    alignas(64) float buf[batch<Arch>::size];
    v.store_aligned(buf);
    float m = buf[0];
    for (std::size_t i = 1; i < batch<Arch>::size; ++i) m = buf[i] > m ? buf[i] : m;
    return m;
}

// exp(d) for the d = z − max of a softmax: d <= 0, -inf or NaN.
template <class Arch>
batch<Arch> exp_nonpositive(Arch, const batch<Arch>& d) noexcept {
    return xsimd::exp(d);
}

#if defined(__AVX512F__)
// Only the AVX-512 TU sees these; overload resolution prefers them to the templates above.

// exp(d) for d <= 0 (or -inf, NaN) in 12 instructions, vs about 22 for xsimd::exp (whose ldexp and
// overflow/underflow selects this domain does not need): d = n·ln2 + r with |r| <= ln2/2 (Cody-Waite,
// two constants), a degree-6 polynomial for exp(r) (Chebyshev fit, 0.35 ulp), then vscalefps
// multiplies by 2^n, rounding into the subnormals correctly. Checked against exp in double on every
// float in [-104, 0]: at most 1.07 ulp where the result is normal (xsimd::exp: 1.52), within one
// subnormal step below. d < -104 is clamped to -104 (exp < 2^-149: rounds to 0); the clamp keeps NaN
// (maxps returns its second operand when one is NaN).
inline batch<arch_avx512> exp_nonpositive(arch_avx512, const batch<arch_avx512>& d) noexcept {
    const __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), d);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // n·ln2_hi is exact for |n| <= 150
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);     // ln2 − ln2_hi
    __m512 p = _mm512_set1_ps(0x1.6dafbp-10f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.1276bcp-7f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.55545ap-5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0x1.5553f6p-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

inline float reduce_max(arch_avx512, const batch<arch_avx512>& v) noexcept { return _mm512_reduce_max_ps(v); }
#endif

// A boolean mask's bytes p[0, W) as additive values: -inf where the byte is nonzero, else 0.
#if MHA_SIMD_X86
inline batch<arch_sse2> bool_mask_additive(arch_sse2, const std::uint8_t* p) noexcept {
    int bytes;
    __builtin_memcpy(&bytes, p, 4);
    const __m128i zero = _mm_setzero_si128();
    const __m128i b32 = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(bytes), zero), zero);
    const __m128i is_zero = _mm_cmpeq_epi32(b32, zero);
    return _mm_andnot_ps(_mm_castsi128_ps(is_zero), _mm_set1_ps(-kInf));
}
#else
template <class Arch>  // a generic arch (not x86)
batch<Arch> bool_mask_additive(Arch, const std::uint8_t* p) noexcept {
    alignas(64) float t[batch<Arch>::size];
    for (std::size_t i = 0; i < batch<Arch>::size; ++i) t[i] = p[i] != 0 ? kNegInf : 0.0f;
    return batch<Arch>::load_aligned(t);
}
#endif
#if defined(__AVX2__)
inline batch<arch_avx2> bool_mask_additive(arch_avx2, const std::uint8_t* p) noexcept {
    const __m256i b32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i is_zero = _mm256_cmpeq_epi32(b32, _mm256_setzero_si256());
    return _mm256_andnot_ps(_mm256_castsi256_ps(is_zero), _mm256_set1_ps(-kInf));
}
#endif
#if defined(__AVX512F__)
inline batch<arch_avx512> bool_mask_additive(arch_avx512, const std::uint8_t* p) noexcept {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_maskz_mov_ps(_mm_test_epi8_mask(b, b), _mm512_set1_ps(-kInf));
}
#endif

// mask's entries [j, j + W) as additive values (k < W: only [j, j + k), the other lanes 0).
template <class Arch>
batch<Arch> mask_at(Arch arch, const MaskRow& mask, std::size_t j, std::size_t k = batch<Arch>::size) noexcept {
    constexpr std::size_t W = batch<Arch>::size;
    if (mask.values != nullptr)
        return k == W ? batch<Arch>::load_unaligned(mask.values + j) : row_detail::load_head(arch, mask.values + j, k, 0.0f);
    if (k == W) return bool_mask_additive(arch, mask.bools + j);
    alignas(16) std::uint8_t buf[W] = {};
    for (std::size_t i = 0; i < k; ++i) buf[i] = mask.bools[j + i];
    return bool_mask_additive(arch, buf);
}

// The score modifiers (ScoreRowModifiers) on z, the entries j .. j + W − 1 of a row: the one definition every
// path uses (softmax passes and simd::modify_scores), so an entry's bits do not depend on where it sits. Softcap:
// c·tanh(z·(1/c)), the tanh xsimd's (within 2 ulp: tests/test_score_modifiers.cpp); ALiBi's product is one fma, its distances t0 + j +
// lane exact (integers below 2^24). Inlined: the loop invariants stay in registers.
template <class Arch>
struct ScoreModifierVectors {
    using B = batch<Arch>;
    bool cap, alibi;
    B c, inv_c, slope, t_first;  // softcap, 1 / softcap (a product, not a division per score), slope, t0 + lane
    explicit ScoreModifierVectors(const ScoreRowModifiers& m) noexcept
        : cap(m.softcap > 0.0f), alibi(m.slope != 0.0f), c(m.softcap), inv_c(cap ? 1.0f / m.softcap : 0.0f), slope(m.slope),
          t_first(B(m.t0) + B::load_aligned(lane_index)) {}
    // The distances of entries j .. j + W − 1: t_first + j (callers walking a row add W to it per vector).
    B distances(std::size_t j) const noexcept { return t_first + B(static_cast<float>(j)); }
    // The modifiers with cap and alibi known at compile time (the branch-free loops of pass 1).
    template <bool Cap, bool Alibi>
    inline __attribute__((always_inline)) B apply(B z, const B& t) const noexcept {
        if constexpr (Cap) z = c * xsimd::tanh(z * inv_c);
        if constexpr (Alibi) z = xsimd::fma(slope, t, z);
        return z;
    }
    inline __attribute__((always_inline)) B operator()(B z, const B& t) const noexcept {
        if (cap) return alibi ? apply<true, true>(z, t) : apply<true, false>(z, t);
        return alibi ? apply<false, true>(z, t) : z;
    }
};

// Pass 1's vector body for a row without masks: z_j = modifiers(scale·x_j) stored over x (only read when there is
// nothing to apply), the max in two chains. The same operations as scale_mask_max's general loop (its bits), with
// the branches taken out of the loop: that loop tests the masks and modifiers per vector, 2–3× the instructions.
template <bool Scale, bool Cap, bool Alibi, class Arch>
void unmasked_body_max(float* x, std::size_t body, const batch<Arch>& vscale, const ScoreModifierVectors<Arch>& modify,
                       batch<Arch>& max_a, batch<Arch>& max_b) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size;
    const B step(static_cast<float>(W)), step2(static_cast<float>(2 * W));
    B t = modify.t_first;
    auto z_at = [&](std::size_t j, const B& tj) noexcept {
        B z = B::load_unaligned(x + j);
        if constexpr (Scale) z = z * vscale;
        z = modify.template apply<Cap, Alibi>(z, tj);
        if constexpr (Scale || Cap || Alibi) z.store_unaligned(x + j);
        return z;
    };
    std::size_t j = 0;
    for (; j + 2 * W <= body; j += 2 * W) {
        max_a = xsimd::max(z_at(j, t), max_a);
        max_b = xsimd::max(z_at(j + W, t + step), max_b);
        if constexpr (Alibi) t += step2;
    }
    for (; j < body; j += W) max_a = xsimd::max(z_at(j, t), max_a);
}

// z with the masks' additive values m0 / m1 (those present) added. A masked entry (-inf in either mask) is -inf
// whatever the score: a masked key's score never matters, so a NaN there does not poison the row (as when the
// fused path skips a padded tile).
template <class Arch>
inline __attribute__((always_inline)) batch<Arch> add_masks(batch<Arch> z, bool has0, bool has1, const batch<Arch>& m0,
                                                            const batch<Arch>& m1) noexcept {
    using B = batch<Arch>;
    if (!has0 && !has1) return z;
    if (has0) z += m0;
    if (has1) z += m1;
    return xsimd::select((m0 == B(kNegInf)) | (m1 == B(kNegInf)), B(kNegInf), z);
}

// Pass 1's vector body for a row with a mask: z_j = masks(modifiers(scale·x_j)) stored over x, the max in two
// chains. Out of line: its closures would otherwise be set up on every call of the unmasked rows too.
template <class Arch>
__attribute__((noinline)) void masked_body_max(Arch arch, float* x, std::size_t body, const batch<Arch>& vscale,
                                               MaskRow mask0, MaskRow mask1, bool modified,
                                               const ScoreModifierVectors<Arch>& modify, batch<Arch>& max_a,
                                               batch<Arch>& max_b) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size;
    const bool has0 = mask0.values != nullptr || mask0.bools != nullptr;
    const bool has1 = mask1.values != nullptr || mask1.bools != nullptr;
    B t = modify.t_first;  // the distances of the next vector z_at reads (z_at walks the row in order)
    const B step(static_cast<float>(W));
    auto z_at = [&](std::size_t j) noexcept {
        B z = B::load_unaligned(x + j) * vscale;
        if (modified) {
            z = modify(z, t);
            if (modify.alibi) t += step;
        }
        z = add_masks(z, has0, has1, has0 ? mask_at(arch, mask0, j) : B(0.0f), has1 ? mask_at(arch, mask1, j) : B(0.0f));
        z.store_unaligned(x + j);
        return z;
    };
    std::size_t j = 0;
    for (; j + 2 * W <= body; j += 2 * W) {
        max_a = xsimd::max(z_at(j), max_a);
        max_b = xsimd::max(z_at(j + W), max_b);
    }
    for (; j < body; j += W) max_a = xsimd::max(z_at(j), max_a);
}

// Pass 1 over x[0, n_valid): z_j = modifiers(scale·x_j) (+ mask0_j) (+ mask1_j), stored over x (not when scale
// is 1 and the masks and modifiers are absent: then z = x and the row is only read); returns max z (-inf if none). The max
// is maxps with z first, which returns its second operand when either is NaN: a NaN z is skipped, like
// the reference's `if (z > max) max = z`. Two chains hide the max latency.
template <class Arch>
float scale_mask_max(Arch arch, float* x, std::size_t n_valid, float scale, MaskRow mask0, MaskRow mask1,
                     const ScoreRowModifiers& mods = {}) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size;
    const std::size_t body = n_valid - n_valid % W, tail = n_valid - body;
    // Fields read directly, not through MaskRow's inline members (nothing inline is shared with baseline code).
    const bool has0 = mask0.values != nullptr || mask0.bools != nullptr;
    const bool has1 = mask1.values != nullptr || mask1.bools != nullptr;
    const bool modified = mods.softcap > 0.0f || mods.slope != 0.0f;
    const ScoreModifierVectors<Arch> modify(mods);
    const bool z_is_x = scale == 1.0f && !has0 && !has1 && !modified;
    const B vscale(scale);
    B max_a(kNegInf), max_b(kNegInf);
    if (has0 || has1) {
        masked_body_max(arch, x, body, vscale, mask0, mask1, modified, modify, max_a, max_b);
    } else {  // scale 1 is skipped: z·1 = z, the same bits
        const bool scaled = scale != 1.0f;
        auto run = [&](auto cap, auto alibi) noexcept {
            constexpr bool C = decltype(cap)::value, A = decltype(alibi)::value;
            scaled ? unmasked_body_max<true, C, A>(x, body, vscale, modify, max_a, max_b)
                   : unmasked_body_max<false, C, A>(x, body, vscale, modify, max_a, max_b);
        };
        using yes = std::true_type;
        using no = std::false_type;
        if (modify.cap)
            modify.alibi ? run(yes{}, yes{}) : run(yes{}, no{});
        else
            modify.alibi ? run(no{}, yes{}) : run(no{}, no{});
    }
    if (tail != 0) {
        B z = vscale * row_detail::load_head(arch, x + body, tail, 0.0f);
        if (modified) z = modify(z, modify.distances(body));
        z = add_masks(z, has0, has1, has0 ? mask_at(arch, mask0, body, tail) : B(0.0f),
                      has1 ? mask_at(arch, mask1, body, tail) : B(0.0f));
        if (!z_is_x) row_detail::store_head(arch, z, x + body, tail);
        // Lanes past the tail must not count (scale·0 = 0 could exceed every real z).
        const auto in_tail = B::load_aligned(lane_index) < B(static_cast<float>(tail));
        max_b = xsimd::max(xsimd::select(in_tail, z, B(kNegInf)), max_b);
    }
    return reduce_max(arch, xsimd::max(max_a, max_b));
}

// Whether any of x[0, n) is NaN, and x[0, n) = value (plain loops: no std algorithm instantiated here,
// whose one kept copy could be this TU's ISA-encoded one).
template <class Arch>
bool any_nan(Arch, const float* x, std::size_t n) noexcept {
    bool nan = false;
    for (std::size_t j = 0; j < n; ++j) nan |= x[j] != x[j];
    return nan;
}
template <class Arch>
void fill(Arch, float* x, std::size_t n, float value) noexcept {
    for (std::size_t j = 0; j < n; ++j) x[j] = value;
}

// Pass 2 over x[0, n_valid): x_j = exp(x_j − max), returns Σ x_j. Tail lanes load -inf and add
// exp(-inf) = 0. max must be finite.
template <class Arch>
float exp_sum(Arch arch, float* x, std::size_t n_valid, float max) noexcept {
    using B = batch<Arch>;
    constexpr std::size_t W = B::size;
    const std::size_t body = n_valid - n_valid % W, tail = n_valid - body;
    const B vmax(max);
    B sum_a(0.0f), sum_b(0.0f);
    std::size_t j = 0;
    for (; j + 2 * W <= body; j += 2 * W) {
        const B ea = exp_nonpositive(arch, B::load_unaligned(x + j) - vmax);
        const B eb = exp_nonpositive(arch, B::load_unaligned(x + j + W) - vmax);
        ea.store_unaligned(x + j);
        eb.store_unaligned(x + j + W);
        sum_a += ea;
        sum_b += eb;
    }
    for (; j < body; j += W) {
        const B e = exp_nonpositive(arch, B::load_unaligned(x + j) - vmax);
        e.store_unaligned(x + j);
        sum_a += e;
    }
    if (tail != 0) {
        const B e = exp_nonpositive(arch, row_detail::load_head(arch, x + body, tail, -kInf) - vmax);
        row_detail::store_head(arch, e, x + body, tail);
        sum_b += e;
    }
    return row_detail::reduce_add(arch, sum_a + sum_b);
}

}  // namespace mha::simd::softmax_detail
