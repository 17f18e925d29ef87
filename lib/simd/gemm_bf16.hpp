// The bf16 GEMM: C = alpha·op(A)·B + beta·C (+ bias[j]) with op(A) and B rounded to bfloat16 (nearest even)
// and products summed in fp32 by a bf16 dot-product instruction: vdpbf16ps (AVX512_BF16) on x86, BFDOT
// (FEAT_BF16) on AArch64. Only where has_bf16_kernels(active_isa()) (avx512_bf16, neon_bf16): callers check
// bf16_kernels_available() and otherwise round the operands themselves and run the fp32 GEMM (simd.hpp).
//
// B layout (what vdpbf16ps and BFDOT want: two bf16 of consecutive k in each 32-bit lane): op(B) [K, N] is cut into
// panels of 32 columns; panel p holds k-pair q (rows 2q, 2q + 1) at data[p·panel_stride + 64·q, + 64), column
// j's two values at offsets 2j (row 2q) and 2j + 1 (row 2q + 1). K is padded to even and columns past N to 32
// with zeros. A panel's rows are contiguous over all of K, so a k-range starting at an even row is a panel too.
// Both instructions count inputs below 2^-126 in magnitude as zero. Each k-pair's two exact products are
// added to the fp32 sum with at most two roundings: nearest even on x86 (vdpbf16ps); on AArch64 BFDOT
// rounds to odd (Armv8.6 without FPCR.EBF), so the last bits differ between the two.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dispatch.hpp"
#include "simd.hpp"

namespace mha::simd {

inline constexpr std::size_t kBf16PanelWidth = 32;
// The microkernel's rows and the longest k-block (even): the A pack buffer holds one k-block of all rows.
inline constexpr std::size_t kBf16Rows = 8, kBf16KBlock = 1024;

// A B operand in bf16 panels (layout above); data 64-byte aligned, panel_stride a multiple of 32 elements.
struct Bf16Panels {
    const std::uint16_t* data = nullptr;
    std::size_t k = 0, n = 0, panel_stride = 0;  // panel_stride in uint16 elements

    // Rows [r0, r0 + count) of op(B); r0 even.
    Bf16Panels rows(std::size_t r0, std::size_t count) const noexcept { return {data + r0 / 2 * 2 * kBf16PanelWidth, count, n, panel_stride}; }
    // Columns [c0, c0 + count); c0 a multiple of 32.
    Bf16Panels columns(std::size_t c0, std::size_t count) const noexcept { return {data + c0 / kBf16PanelWidth * panel_stride, k, count, panel_stride}; }
    static std::size_t min_panel_stride(std::size_t k) noexcept { return (k + 1) / 2 * 2 * kBf16PanelWidth; }
    // uint16 elements that n columns take.
    static std::size_t elements(std::size_t n, std::size_t panel_stride) noexcept {
        return (n + kBf16PanelWidth - 1) / kBf16PanelWidth * panel_stride;
    }
};

// True when the bf16 kernels may run (has_bf16_kernels(active_isa())).
bool bf16_kernels_available() noexcept;

// Packs op(B) [K, N] (fp32, rounded to bf16) into the panels at dst (64-byte aligned; panel_stride >=
// Bf16Panels::min_panel_stride(K), a multiple of 32). Writes the padding zeros too. bf16 kernels only.
void pack_panels_bf16(ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept;

// k-blocks of K: balanced, whole pairs each (only the last may end on an odd row), at most kBf16KBlock long.
inline std::size_t bf16_kblocks(std::size_t k) noexcept { return ((k + 1) / 2 + kBf16KBlock / 2 - 1) / (kBf16KBlock / 2); }
// uint16 elements of A pack buffer gemm_bf16 needs for M rows and K columns (any m' <= m, k' <= k).
inline std::size_t gemm_bf16_scratch(std::size_t m, std::size_t k) noexcept {
    if (m == 0 || k == 0) return 0;
    const std::size_t nb = bf16_kblocks(k), kp_max = ((k + 1) / 2 + nb - 1) / nb;
    return (m + kBf16Rows - 1) / kBf16Rows * kBf16Rows * kp_max * 2;
}

// C = alpha·A·B + beta·C (+ bias[j] when bias != nullptr); A [M, K] fp32 row-major (rounded to bf16 while
// packed), B [K, N] in panels, C [M, N]. beta == 0 does not read C. scratch: gemm_bf16_scratch(M, K) uint16,
// 64-byte aligned, or nullptr to lease one (may then throw std::bad_alloc). Every element of C is summed over
// k in the same order whatever M is and however the caller splits the rows. bf16 kernels only.
void gemm_bf16(float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias, Matrix c,
               std::uint16_t* scratch = nullptr);

// A [M, K] packed once into bf16 pairs for all of K (what gemm_bf16 packs on every call), so that many calls
// on column blocks of one B share one packing of A: gemm_bf16_packed_a_elements(M, K) uint16 elements at dst,
// 64-byte aligned. bf16 kernels only.
inline std::size_t gemm_bf16_packed_a_elements(std::size_t m, std::size_t k) noexcept {
    return (m + kBf16Rows - 1) / kBf16Rows * kBf16Rows * ((k + 1) / 2) * 2;
}
void pack_a_bf16(ConstMatrix a, std::uint16_t* dst) noexcept;
// gemm_bf16 with A [m, k] as pack_a_bf16 packed it: the same bits as gemm_bf16 on that A. bf16 kernels only.
void gemm_bf16_packed_a(float alpha, const std::uint16_t* a, std::size_t m, std::size_t k, const Bf16Panels& b, float beta,
                        const float* bias, Matrix c) noexcept;

// Constant weights packed once into bf16 panels: the parts op(B_i) [K, N_i] side by side (segments), each
// padded to whole panels (the bf16 twin of PackedMatrix built from parts). Immutable: share across threads.
// Constructing it requires bf16_kernels_available().
class Bf16PackedMatrix {
public:
    Bf16PackedMatrix() = default;
    Bf16PackedMatrix(const std::vector<ConstMatrix>& parts, Trans tb);  // allocates (may throw std::bad_alloc)
    std::size_t k() const noexcept { return k_; }
    std::size_t n() const noexcept { return n_; }
    bool empty() const noexcept { return data_ == nullptr; }
    std::size_t bytes() const noexcept { return elements_ * 2; }
    // Segments [first, first + count): more than one only when the earlier ones are whole panels wide.
    Bf16Panels segments(std::size_t first, std::size_t count) const noexcept;
    Bf16Panels all() const noexcept { return segments(0, widths_.size()); }
    // op(B) back as a row-major [K, N] fp32 matrix (the rounded values).
    void unpack(Matrix dst) const noexcept;

private:
    struct Free {
        std::size_t bytes;
        void operator()(std::uint16_t* p) const noexcept;
    };
    std::unique_ptr<std::uint16_t, Free> data_{nullptr, Free{0}};
    std::size_t k_ = 0, n_ = 0, stride_ = 0, elements_ = 0;
    std::vector<std::size_t> widths_, panel0_;  // per part: columns, first panel
};

// The arch whose TU holds this target's bf16 kernels: gemm_bf16_avx512bf16.cpp on x86, gemm_bf16_neonbf16.cpp
// on AArch64; elsewhere generic/gemm_bf16_kernels.cpp's stubs (never called).
#if MHA_SIMD_ARM
using arch_bf16 = arch_neon;
#else
using arch_bf16 = arch_avx512;
#endif

// The ISA kernels; Arch-tagged so they are recognizably that ISA's code.
struct Bf16Kernels {
    static void pack_panels(arch_bf16, ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept;
    static void gemm(arch_bf16, float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias,
                     Matrix c, std::uint16_t* scratch) noexcept;
    static void pack_a(arch_bf16, ConstMatrix a, std::uint16_t* dst) noexcept;
    static void gemm_packed_a(arch_bf16, float alpha, const std::uint16_t* a, std::size_t m, std::size_t k, const Bf16Panels& b,
                              float beta, const float* bias, Matrix c) noexcept;
};

}  // namespace mha::simd
