// The attention core's path choice and scratch layout (attention_core.hpp): which path a shape takes, and
// where each region of its scratch lives (per call and per thread), for every ISA this CPU has.
#include <algorithm>
#include <cassert>

#include <tbb/task_arena.h>

#include "../core/validate.hpp"
#include "../simd/isa_table.hpp"
#include "attention_core.hpp"

namespace mha::detail {
namespace {

// Floats of one head's packed panels: ceil(n / NR) panels of round16(k·NR) floats (PanelMatrix), checked.
std::size_t panel_floats(Isa isa, std::size_t k, std::size_t n) {
    const std::size_t nr = simd::PanelMatrix::panel_width(isa);
    return scratch_mul((n + nr - 1) / nr, (scratch_mul(k, nr) + 15) / 16 * 16);
}

// Floats of one head's bf16 panels (Bf16Panels: ceil(n / 32) panels of ceil(k / 2) pairs × 32 columns, 4 bytes
// a pair): Bf16Panels::elements(n, Bf16Panels::min_panel_stride(k)) / 2, checked.
std::size_t bf16_panel_floats(std::size_t k, std::size_t n) {
    constexpr std::size_t nr = simd::kBf16PanelWidth;
    return scratch_mul((n + nr - 1) / nr, scratch_mul((k + 1) / 2, nr));
}

}  // namespace

std::size_t scratch_mul(std::size_t a, std::size_t b) {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail("the scratch of this call overflows the address space");
    return r;
}

std::size_t Carver::take(std::size_t floats) {
    const std::size_t at = total;
    std::size_t end = 0;
    if (__builtin_add_overflow(total, floats, &end) || end > SIZE_MAX / sizeof(float) - 16)
        fail("the scratch of this call overflows the address space");
    total = (end + 15) / 16 * 16;
    return at;
}

CorePath core_path(std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk, NeedWeights need_weights, Impl impl) noexcept {
    if (need_weights != NeedWeights::none || impl == Impl::materialized) return CorePath::materialized;
    if (Lq <= kDecodeMaxQueries && H / Hkv * Lq <= kGroupRows) return CorePath::decode;
    if (impl == Impl::fused || H != Hkv || Lk >= kFusedMinKeys) return CorePath::grouped;
    return CorePath::materialized;
}

CoreLayout core_layout(const CoreShape& s, CorePath path, NeedWeights need_weights, Carver& call, Carver& slot) {
    CoreLayout l;
    l.value_flags = call.take(scratch_mul(s.B, s.Hkv) / sizeof(float) + 1);
    std::size_t q_stack = 0, scores = 0, accumulator = 0, row_stats = 0, gemm16 = 0, widen = 0;
    if (path == CorePath::decode) {  // the decode kernels read K and V in place: no GEMM pack buffers
        const std::size_t m = s.H / s.Hkv * s.Lq;
        l.split = decode_split(s.kv, m);
        l.splits = (s.Lk + l.split - 1) / l.split;
        l.partials = call.take(scratch_mul(scratch_mul(scratch_mul(s.B, s.Hkv), l.splits), scratch_mul(m, s.d + 2)));
        q_stack = scratch_mul(m, s.d);
        scores = scratch_mul(m, l.split);
        accumulator = scratch_mul(m, s.d);
        row_stats = scratch_mul(2, m);
    } else if (path == CorePath::grouped) {
        std::size_t key_floats = 0, value_floats = 0;
        for (Isa isa : simd::kSimdIsas) {  // the largest over the ISAs this CPU has: the cap may change before the call
            if (isa > detected_isa()) continue;
            key_floats = std::max(key_floats, panel_floats(isa, s.d, s.Lk));    // K_hᵀ: [d, Lk]
            value_floats = std::max(value_floats, panel_floats(isa, s.Lk, s.d));  // V_h: [Lk, d]
        }
        // bf16: the same matrices in bf16 panels (GroupedPanels, a head every Bf16Panels::elements apart). Half
        // the bytes per element, but every panel 32 columns wide: more than an fp32 ISA's panels of narrower
        // columns when the panels are mostly padding, e.g. V_h with d < 16 on NEON (fp32 panels 8 wide: 8·Lk
        // floats at d 8, in bf16 16·Lk), whose last heads then ran past the region into the threads' slots.
        const bool bf16 = s.compute == DataType::bf16 && has_bf16_kernels(detected_isa());
        if (bf16) {
            key_floats = std::max(key_floats, bf16_panel_floats(s.d, s.Lk));
            value_floats = std::max(value_floats, bf16_panel_floats(s.Lk, s.d));
        }
        l.key_panels = call.take(scratch_mul(scratch_mul(s.B, s.Hkv), key_floats));
        l.value_panels = call.take(scratch_mul(scratch_mul(s.B, s.Hkv), value_floats));
        const std::size_t G = s.H / s.Hkv, m = G * group_query_rows(G, s.Lq);
        q_stack = scratch_mul(m, s.d);
        scores = scratch_mul(m, kKeyTile);
        accumulator = scratch_mul(m, s.d);
        row_stats = scratch_mul(2, m);
        if (s.widen_rows) widen = scratch_mul(2 * kGroupedPackBlock, s.d);
        // bf16: the A pack buffer, per thread.
        if (bf16) gemm16 = simd::gemm_bf16_scratch(m, std::max(s.d, kKeyTile)) / 2 + 1;
    } else {
        // per_head writes the probabilities straight into attn_weights.
        scores = need_weights == NeedWeights::per_head ? 0 : scratch_mul(kQueryBlock, s.Lk);
        for (Isa isa : simd::kSimdIsas) {  // the largest over the ISAs this CPU has: the cap may change before the call
            if (isa > detected_isa()) continue;
            // S = Q_h·K_hᵀ: [rows, keys] over d; then P·V_h: [rows, d] over keys.
            const simd::GemmScratchSize qk = simd::gemm_scratch_bound(isa, kQueryBlock, s.Lk, s.d, Trans::no, Trans::yes);
            const simd::GemmScratchSize pv = simd::gemm_scratch_bound(isa, kQueryBlock, s.d, s.Lk, Trans::no, Trans::no);
            l.gemm.a_floats = std::max({l.gemm.a_floats, qk.a_floats, pv.a_floats});
            l.gemm.b_floats = std::max({l.gemm.b_floats, qk.b_floats, pv.b_floats});
        }
        // bf16: the block's K_hᵀ and V_h in bf16 panels, and the A pack buffer (uint16 elements / 2).
        if (s.compute == DataType::bf16 && has_bf16_kernels(detected_isa()))
            gemm16 = (simd::Bf16Panels::elements(s.Lk, simd::Bf16Panels::min_panel_stride(s.d)) +
                      simd::Bf16Panels::elements(s.d, simd::Bf16Panels::min_panel_stride(s.Lk)) +
                      simd::gemm_bf16_scratch(kQueryBlock, std::max(s.d, s.Lk))) / 2 + 64;
    }
    l.q_stack = slot.take(q_stack);
    l.scores = slot.take(scores);
    l.accumulator = slot.take(accumulator);
    l.row_stats = slot.take(row_stats);
    l.gemm_a = slot.take(l.gemm.a_floats);
    l.gemm_b = slot.take(l.gemm.b_floats);
    l.gemm16_floats = gemm16;
    l.gemm16 = slot.take(gemm16);
    l.widen_rows = slot.take(widen);
    return l;
}

float* thread_slot(float* slots, std::size_t slot_floats, std::size_t threads) noexcept {
    const int index = tbb::this_task_arena::current_thread_index();
    assert(index >= 0 && static_cast<std::size_t>(index) < threads);
    (void)threads;
    return slots + static_cast<std::size_t>(index) * slot_floats;
}


}  // namespace mha::detail
