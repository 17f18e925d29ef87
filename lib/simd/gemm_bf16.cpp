// The bf16 GEMM's entry points (gemm_bf16.hpp) and Bf16PackedMatrix's storage. Baseline TU: allocation and
// the availability check happen here; the kernels are in the ISA TU (gemm_bf16_avx512bf16.cpp on x86,
// gemm_bf16_neonbf16.cpp on AArch64).
#include "gemm_bf16.hpp"

#include <cassert>
#include <cstdint>
#include <cstring>

#include "../core/scratch.hpp"

namespace mha::simd {

bool bf16_kernels_available() noexcept { return has_bf16_kernels(active_isa()); }

void pack_panels_bf16(ConstMatrix b, Trans tb, std::uint16_t* dst, std::size_t panel_stride) noexcept {
    assert(bf16_kernels_available() && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0 && panel_stride % 32 == 0);
    Bf16Kernels::pack_panels(arch_bf16{}, b, tb, dst, panel_stride);
}

void gemm_bf16(float alpha, ConstMatrix a, const Bf16Panels& b, float beta, const float* bias, Matrix c,
               std::uint16_t* scratch) {
    assert(bf16_kernels_available() && a.cols == b.k && c.cols == b.n && a.rows == c.rows);
    assert(reinterpret_cast<std::uintptr_t>(b.data) % 64 == 0 && reinterpret_cast<std::uintptr_t>(scratch) % 64 == 0);
    if (scratch != nullptr || c.rows == 0 || c.cols == 0 || a.cols == 0)
        return Bf16Kernels::gemm(arch_bf16{}, alpha, a, b, beta, bias, c, scratch);
    detail::ScratchLease lease(gemm_bf16_scratch(c.rows, a.cols) * 2);
    Bf16Kernels::gemm(arch_bf16{}, alpha, a, b, beta, bias, c, static_cast<std::uint16_t*>(lease.data()));
}

void pack_a_bf16(ConstMatrix a, std::uint16_t* dst) noexcept {
    assert(bf16_kernels_available() && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0);
    Bf16Kernels::pack_a(arch_bf16{}, a, dst);
}

void gemm_bf16_packed_a(float alpha, const std::uint16_t* a, std::size_t m, std::size_t k, const Bf16Panels& b, float beta,
                        const float* bias, Matrix c) noexcept {
    assert(bf16_kernels_available() && k == b.k && c.cols == b.n && m == c.rows);
    assert(reinterpret_cast<std::uintptr_t>(b.data) % 64 == 0 && reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
    Bf16Kernels::gemm_packed_a(arch_bf16{}, alpha, a, m, k, b, beta, bias, c);
}

void Bf16PackedMatrix::Free::operator()(std::uint16_t* p) const noexcept { detail::free_aligned(p, bytes); }

Bf16PackedMatrix::Bf16PackedMatrix(const std::vector<ConstMatrix>& parts, Trans tb) {
    assert(!parts.empty() && bf16_kernels_available());
    const bool tr = tb == Trans::yes;
    k_ = tr ? parts[0].cols : parts[0].rows;
    stride_ = Bf16Panels::min_panel_stride(k_);
    std::size_t panels = 0;
    for (const ConstMatrix& p : parts) {
        const std::size_t w = tr ? p.rows : p.cols;
        widths_.push_back(w);
        panel0_.push_back(panels);
        panels += (w + kBf16PanelWidth - 1) / kBf16PanelWidth;
        n_ += w;
    }
    panel0_.push_back(panels);
    elements_ = panels * stride_;
    const std::size_t bytes = elements_ * 2 > 0 ? elements_ * 2 : 64;
    data_ = std::unique_ptr<std::uint16_t, Free>(static_cast<std::uint16_t*>(detail::allocate_aligned(bytes)), Free{bytes});
    std::memset(data_.get(), 0, bytes);
    for (std::size_t i = 0; i < parts.size(); ++i)
        pack_panels_bf16(parts[i], tb, data_.get() + panel0_[i] * stride_, stride_);
}

Bf16Panels Bf16PackedMatrix::segments(std::size_t first, std::size_t count) const noexcept {
    std::size_t n = 0;
    for (std::size_t i = first; i < first + count; ++i) {
        assert(i + 1 == first + count || widths_[i] % kBf16PanelWidth == 0);
        n += widths_[i];
    }
    return {data_.get() + panel0_[first] * stride_, k_, n, stride_};
}

void Bf16PackedMatrix::unpack(Matrix dst) const noexcept {
    for (std::size_t part = 0, j0 = 0; part < widths_.size(); j0 += widths_[part++]) {
        const std::uint16_t* base = data_.get() + panel0_[part] * stride_;
        for (std::size_t j = 0; j < widths_[part]; ++j)
            for (std::size_t r = 0; r < k_; ++r) {
                const std::uint16_t h = base[j / kBf16PanelWidth * stride_ + r / 2 * 2 * kBf16PanelWidth +
                                             2 * (j % kBf16PanelWidth) + r % 2];
                const std::uint32_t bits = std::uint32_t{h} << 16;
                std::memcpy(&dst.data[r * dst.stride + j0 + j], &bits, 4);
            }
    }
}

}  // namespace mha::simd
