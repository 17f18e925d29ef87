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

}  // namespace mha::simd
