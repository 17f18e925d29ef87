// The GEMM entry points of simd.hpp: pick the ISA (mha::active_isa() for gemm, the packing ISA for
// gemm_packed) and call that ISA's kernel; PackedMatrix's storage, segments and unpacking. Baseline TU:
// all allocation happens here, never in the ISA TUs.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "../core/scratch.hpp"
#include "gemm.hpp"

namespace mha::simd {

struct PackedMatrix::Impl {
    struct Storage {  // owns `bytes` bytes from detail::allocate_aligned
        void* p = nullptr;
        std::size_t bytes = 0;
        Storage() = default;
        void allocate(std::size_t n) {  // once, on an empty Storage; zero-filled (the panels' padding is zero)
            p = detail::allocate_aligned(n);
            bytes = n;
            std::memset(p, 0, n);
        }
        ~Storage() { detail::free_aligned(p, bytes); }
        Storage(const Storage&) = delete;
        Storage& operator=(const Storage&) = delete;
    };
    Storage data;
    PanelElement element = PanelElement::f32;
    const float* f32() const { return element == PanelElement::f32 ? static_cast<const float*>(data.p) : nullptr; }
    const std::uint16_t* bf16() const {
        return element == PanelElement::bf16 ? static_cast<const std::uint16_t*>(data.p) : nullptr;
    }
    float value(std::size_t i) const {  // element i of the panels, exactly
        return element == PanelElement::f32 ? f32()[i] : bfloat16::from_bits(bf16()[i]).to_float();
    }
    std::size_t k = 0, n = 0, kc = 0, nr = 0;
    std::vector<std::size_t> segment_n;       // columns of each segment
    std::vector<std::size_t> segment_panel0;  // first panel of each segment, then the total panel count
    Isa isa = Isa::sse2;
    std::size_t pitch() const { return segment_panel0.back() * nr; }  // elements per row of a k-block
    // The segment and the column within it of column j.
    std::pair<std::size_t, std::size_t> locate(std::size_t j) const {
        std::size_t s = 0;
        while (j >= segment_n[s]) j -= segment_n[s++];
        return {s, j};
    }
};

GemmScratchSize gemm_scratch_bound(Isa isa, std::size_t m, std::size_t n, std::size_t k, Trans ta, Trans tb) noexcept {
    return dispatch(isa, GemmScratchBoundKernel{}, m, n, k, ta, tb);
}

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c,
          const GemmScratch& scratch) noexcept {
    dispatch(active_isa(), GemmKernel{}, alpha, a, ta, b, tb, beta, c, scratch);
}

void gemm(float alpha, ConstMatrix a, Trans ta, ConstMatrix b, Trans tb, float beta, Matrix c) {
    const Isa isa = active_isa();
    const std::size_t k = ta == Trans::no ? a.cols : a.rows;
    const GemmScratchSize size = gemm_scratch_bound(isa, c.rows, c.cols, k, ta, tb);
    const std::size_t b_offset = (size.a_floats + 15) / 16 * 16;
    detail::ScratchLease lease((b_offset + size.b_floats) * sizeof(float));
    float* base = static_cast<float*>(lease.data());
    dispatch(isa, GemmKernel{}, alpha, a, ta, b, tb, beta, c,
             GemmScratch{base, size.a_floats, base + b_offset, size.b_floats});
}

PackedMatrix::PackedMatrix() = default;
namespace {

// op(B) [k, n] cut into `segments` equal column blocks, as parts.
std::vector<ConstMatrix> equal_parts(ConstMatrix b, Trans tb, std::size_t segments) {
    const bool tr = tb == Trans::yes;
    const std::size_t count = std::max<std::size_t>(segments, 1), width = (tr ? b.rows : b.cols) / count;
    std::vector<ConstMatrix> parts;
    for (std::size_t s = 0; s < count; ++s) parts.push_back(tr ? b.row_block(s * width, width) : b.columns(s * width, width));
    return parts;
}

}  // namespace

PackedMatrix::PackedMatrix(ConstMatrix b, Trans tb, std::size_t segments, PanelElement element)
    : PackedMatrix(equal_parts(b, tb, segments), tb, element) {}

PackedMatrix::PackedMatrix(const std::vector<ConstMatrix>& parts, Trans tb, PanelElement element) : impl_(std::make_unique<Impl>()) {
    Impl& p = *impl_;
    p.isa = active_isa();
    p.element = element;
    const bool tr = tb == Trans::yes;
    p.k = tr ? parts.front().cols : parts.front().rows;
    p.kc = dispatch(p.isa, PackedKcKernel{});
    p.nr = PanelMatrix::panel_width(p.isa);
    p.segment_panel0.push_back(0);
    for (const ConstMatrix& part : parts) {
        const std::size_t n = tr ? part.rows : part.cols;
        p.n += n;
        p.segment_n.push_back(n);
        p.segment_panel0.push_back(p.segment_panel0.back() + (n + p.nr - 1) / p.nr);
    }
    const std::size_t elements = p.k * p.pitch();
    // f32: packed in place. bf16: packed as f32, then each value rounded to its bf16 bits (zeros stay zero).
    Impl::Storage f32;
    Impl::Storage& packed = element == PanelElement::f32 ? p.data : f32;
    packed.allocate(elements * sizeof(float));
    for (std::size_t s = 0; s < parts.size(); ++s)
        dispatch(p.isa, PackBKernel{}, parts[s], tb, static_cast<float*>(packed.p), this->segments(s, 1));
    if (element == PanelElement::bf16) {
        p.data.allocate(elements * sizeof(std::uint16_t));
        const float* src = static_cast<const float*>(f32.p);
        auto* dst = static_cast<std::uint16_t*>(p.data.p);
        for (std::size_t i = 0; i < elements; ++i) dst[i] = bfloat16::from_float(src[i]).bits;
    }
}
PackedMatrix::~PackedMatrix() = default;
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
std::size_t PackedMatrix::k() const noexcept { return impl_ ? impl_->k : 0; }
std::size_t PackedMatrix::n() const noexcept { return impl_ ? impl_->n : 0; }
Isa PackedMatrix::isa() const noexcept { return impl_ ? impl_->isa : Isa::sse2; }
std::size_t PackedMatrix::bytes() const noexcept { return impl_ ? impl_->data.bytes : 0; }
PanelElement PackedMatrix::element() const noexcept { return impl_ ? impl_->element : PanelElement::f32; }
std::size_t PackedMatrix::segment_count() const noexcept { return impl_ ? impl_->segment_n.size() : 0; }
bool PackedMatrix::segments_contiguous() const noexcept {
    if (!impl_) return false;
    for (std::size_t s = 0; s + 1 < impl_->segment_n.size(); ++s)
        if (impl_->segment_n[s] % impl_->nr != 0) return false;
    return true;
}

PackedMatrix::View PackedMatrix::all() const noexcept { return segments(0, segment_count()); }

PackedMatrix::View PackedMatrix::segments(std::size_t first, std::size_t count) const noexcept {
    if (!impl_) return {};
    const Impl& p = *impl_;
    std::size_t n = 0;
    for (std::size_t s = first; s < first + count; ++s) n += p.segment_n[s];
    return {p.f32(), p.bf16(), p.k, n, p.kc, p.nr, p.pitch(), p.segment_panel0[first], p.isa};
}

void PackedMatrix::unpack(Matrix dst, Trans tb) const noexcept {
    if (!impl_) return;
    const Impl& p = *impl_;
    // The layout of gemm_impl.hpp: k-block b covers rows [pc, pc + kcb) (balanced blocks), panel q of it
    // starts at pc·pitch + q·kcb·nr, row r of the panel at + (r − pc)·nr.
    const std::size_t nkb = (p.k + p.kc - 1) / p.kc;
    for (std::size_t kb = 0; kb < nkb; ++kb) {
        const std::size_t pc = kb * p.k / nkb, kcb = (kb + 1) * p.k / nkb - pc;
        for (std::size_t j = 0; j < p.n; ++j) {
            const auto [s, jj] = p.locate(j);
            const std::size_t q = p.segment_panel0[s] + jj / p.nr;
            const std::size_t panel = pc * p.pitch() + q * kcb * p.nr + jj % p.nr;
            for (std::size_t r = 0; r < kcb; ++r) {
                const float v = p.value(panel + r * p.nr);
                if (tb == Trans::no)
                    dst(pc + r, j) = v;
                else
                    dst(j, pc + r) = v;
            }
        }
    }
}

namespace {

// Runs kernel(scratch') where scratch' is `scratch` if it holds what op(A) = Aᵀ needs, else a lease.
template <class Call>
void with_a_scratch(Isa isa, Trans ta, std::size_t m, std::size_t k, const GemmScratch& scratch, const Call& call) {
    const std::size_t need = ta == Trans::yes ? gemm_scratch_bound(isa, m, 1, k, ta, Trans::no).a_floats : 0;
    if (scratch.a_floats >= need) return call(scratch);
    detail::ScratchLease lease(need * sizeof(float));
    call(GemmScratch{static_cast<float*>(lease.data()), need, nullptr, 0});
}

}  // namespace

void gemm_packed(float alpha, ConstMatrix a, Trans ta, const PackedMatrix::View& b, float beta, const float* bias,
                 Matrix c, const GemmScratch& scratch) {
    with_a_scratch(b.isa, ta, c.rows, b.k, scratch, [&](const GemmScratch& s) {
        dispatch(b.isa, GemmPackedKernel{}, alpha, a, ta, b, beta, bias, c, s);
    });
}

std::size_t PanelMatrix::panel_width(Isa isa) noexcept { return dispatch(isa, PanelWidthKernel{}); }

void pack_panels(Isa isa, ConstMatrix b, Trans tb, float* dst, std::size_t panel_stride) noexcept {
    dispatch(isa, PackPanelsKernel{}, b, tb, dst, panel_stride);
}

void gemm_panels(float alpha, ConstMatrix a, Trans ta, const PanelMatrix& b, float beta, Matrix c,
                 const GemmScratch& scratch) {
    with_a_scratch(b.isa, ta, c.rows, b.k, scratch, [&](const GemmScratch& s) {
        dispatch(b.isa, GemmPanelsKernel{}, alpha, a, ta, b, beta, c, s);
    });
}

}  // namespace mha::simd
