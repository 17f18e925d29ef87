// One row of a mask as the softmax kernels read it: additive floats, or bytes (nonzero = not allowed,
// read as an additive -inf, so a NaN score stays NaN as with PyTorch's -inf fill), or nothing. Boolean
// masks are read as bytes in place: never converted into a float copy.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mha::simd {

struct MaskRow {
    const float* values = nullptr;
    const std::uint8_t* bools = nullptr;

    constexpr MaskRow() = default;
    constexpr MaskRow(std::nullptr_t) {}                        // NOLINT(google-explicit-constructor)
    constexpr MaskRow(const float* v) : values(v) {}            // NOLINT(google-explicit-constructor)
    constexpr MaskRow(const std::uint8_t* b) : bools(b) {}      // NOLINT(google-explicit-constructor)
    constexpr bool present() const { return values != nullptr || bools != nullptr; }
    // Entry j masks its key (a nonzero byte or an additive -inf); false when absent. Baseline code only:
    // the ISA kernels read the fields themselves.
    constexpr bool masked(std::size_t j) const {
        return bools != nullptr ? bools[j] != 0 : values != nullptr && values[j] == -__builtin_inff();
    }
    // The same mask from column j on.
    constexpr MaskRow from(std::size_t j) const {
        MaskRow m;
        m.values = values ? values + j : nullptr;
        m.bools = bools ? bools + j : nullptr;
        return m;
    }
};

// The score modifiers of one row (mha::ScoreModifiers as the softmax kernels apply them, before the masks): softcap
// c > 0: z ← c·tanh(z / c); slope != 0 (ALiBi): z ← z + slope·(t0 + j) for entry j, t0 = the first key's position
// minus the query's (t0 + j exact: integers below 2^24).
struct ScoreRowModifiers {
    float softcap = 0.0f, slope = 0.0f, t0 = 0.0f;
    constexpr bool any() const { return softcap > 0.0f || slope != 0.0f; }
    // The same row from entry j on.
    constexpr ScoreRowModifiers from(std::size_t j) const { return {softcap, slope, t0 + static_cast<float>(j)}; }
};

}  // namespace mha::simd
