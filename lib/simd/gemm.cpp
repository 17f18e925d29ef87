// The GEMM entry points of simd.hpp: pick the ISA (mha::active_isa() for gemm, the packing ISA for
// gemm_packed) and call that ISA's kernel; PackedMatrix's storage, segments and unpacking. Baseline TU:
// all allocation happens here, never in the ISA TUs.
#include <algorithm>
#include <cstring>
#include <utility>

#include "../core/scratch.hpp"
#include "gemm.hpp"

namespace mha::simd {

struct PackedMatrix::Impl {
    struct Storage {  // owns floats floats from detail::allocate_aligned
        float* p = nullptr;
        std::size_t floats = 0;
        Storage() = default;
        void allocate(std::size_t n) {  // once, on an empty Storage
            p = static_cast<float*>(detail::allocate_aligned(n * sizeof(float)));
            floats = n;
        }
        ~Storage() { detail::free_aligned(p, floats * sizeof(float)); }
        Storage(const Storage&) = delete;
        Storage& operator=(const Storage&) = delete;
        float* get() const noexcept { return p; }
    };
    Storage data;
    std::size_t k = 0, n = 0, kc = 0, nr = 0;
    std::size_t segments = 1, segment_n = 0, segment_panels = 0;  // per segment: n / segments columns
    Isa isa = Isa::sse2;
    std::size_t pitch() const { return segments * segment_panels * nr; }  // floats per row of a k-block
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
PackedMatrix::PackedMatrix(ConstMatrix b, Trans tb, std::size_t segments) : impl_(std::make_unique<Impl>()) {
    Impl& p = *impl_;
    p.isa = active_isa();
    const bool tr = tb == Trans::yes;
    p.k = tr ? b.cols : b.rows;
    p.n = tr ? b.rows : b.cols;
    p.kc = dispatch(p.isa, PackedKcKernel{});
    p.nr = PanelMatrix::panel_width(p.isa);
    p.segments = std::max<std::size_t>(segments, 1);
    p.segment_n = p.n / p.segments;
    p.segment_panels = (p.segment_n + p.nr - 1) / p.nr;
    p.data.allocate(p.k * p.pitch());
    std::memset(p.data.get(), 0, p.data.floats * sizeof(float));  // the padding columns of each panel are zero
    for (std::size_t s = 0; s < p.segments; ++s) {
        const ConstMatrix part = tr ? b.row_block(s * p.segment_n, p.segment_n) : b.columns(s * p.segment_n, p.segment_n);
        dispatch(p.isa, PackBKernel{}, part, tb, p.data.get(), this->segments(s, 1));
    }
}
PackedMatrix::~PackedMatrix() = default;
PackedMatrix::PackedMatrix(PackedMatrix&&) noexcept = default;
PackedMatrix& PackedMatrix::operator=(PackedMatrix&&) noexcept = default;
std::size_t PackedMatrix::k() const noexcept { return impl_ ? impl_->k : 0; }
std::size_t PackedMatrix::n() const noexcept { return impl_ ? impl_->n : 0; }
Isa PackedMatrix::isa() const noexcept { return impl_ ? impl_->isa : Isa::sse2; }
std::size_t PackedMatrix::bytes() const noexcept { return impl_ ? impl_->data.floats * sizeof(float) : 0; }
std::size_t PackedMatrix::segment_count() const noexcept { return impl_ ? impl_->segments : 0; }
bool PackedMatrix::segments_contiguous() const noexcept {
    return impl_ && (impl_->segments == 1 || impl_->segment_n % impl_->nr == 0);
}

PackedMatrix::View PackedMatrix::all() const noexcept { return segments(0, segment_count()); }

PackedMatrix::View PackedMatrix::segments(std::size_t first, std::size_t count) const noexcept {
    if (!impl_) return {};
    const Impl& p = *impl_;
    return {p.data.get(), p.k, count * p.segment_n, p.kc, p.nr, p.pitch(), first * p.segment_panels, p.isa};
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
            const std::size_t s = j / p.segment_n, jj = j % p.segment_n;
            const std::size_t q = s * p.segment_panels + jj / p.nr;
            const float* panel = p.data.get() + pc * p.pitch() + q * kcb * p.nr + jj % p.nr;
            for (std::size_t r = 0; r < kcb; ++r) {
                const float v = panel[r * p.nr];
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
