// AttentionCore: the grouped (fused, online-softmax) and materialized paths of the SIMD attention core.
// Grouped task, per key tile [j0, j0 + kt) of its KV head (FlashAttention's online softmax):
//   S = scale·Q_stack·K_tileᵀ (SIMD GEMM on Kᵀ packed once per call), masks added row by row;
//   m_new = max(m, max S_row); P_row = exp(S_row − m_new); l = l·e^(m − m_new) + Σ P_row;
//   O_row = O_row·e^(m − m_new); then O += P·V_tile (GEMM with beta = 1)
//   out rows = O / l (rows with l = 0, every key masked, become 0: zero probabilities).
// Causal: tiles past the block's last visible key are never visited; a tile whose keys are all padded is
// skipped. Memory per task: G·rows × (d + tile + d) floats.
#include "attention_core.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <emmintrin.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "../core/validate.hpp"
#include "../simd/round_bf16.hpp"

namespace mha::detail {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
// Keys per packing task (a multiple of every ISA's panel width and of 16).
constexpr std::size_t kPackBlock = 256;
// Sizes are the largest over the ISAs this CPU has (the cap may change between a workspace query and the
// call; it can only select one of these). Never asks an ISA the CPU lacks.
constexpr Isa kIsas[] = {Isa::sse2, Isa::avx2, Isa::avx512};

std::atomic<std::uint64_t> g_kv_rows_read{0};

// A mask's data as a row reader (the row offset is added per use).
simd::MaskRow mask_row(const MaskView& m) {
    if (!m.present()) return {};
    return m.type == MaskType::boolean ? simd::MaskRow(m.bools) : simd::MaskRow(m.values);
}

// Any of x[0, n) is NaN or ±inf: its exponent bits are all set. SSE2 (the x86-64 baseline), four at a time:
// ((bits & exponent) + 2^23) has its top bit set exactly when the exponent field is all ones.
bool any_nonfinite(const float* x, std::size_t n) {
    const __m128i exponent = _mm_set1_epi32(0x7f800000), one = _mm_set1_epi32(0x00800000);
    __m128i acc = _mm_setzero_si128();
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j));
        acc = _mm_or_si128(acc, _mm_add_epi32(_mm_and_si128(bits, exponent), one));
    }
    bool bad = (_mm_movemask_ps(_mm_castsi128_ps(acc)) != 0);
    for (; j < n; ++j) bad |= !std::isfinite(x[j]);
    return bad;
}

// Any of the 16-bit elements x[0, n) is NaN or ±inf: its exponent field (bf16 0x7f80, f16 0x7c00) is all ones.
template <class E>
bool any_nonfinite(const E* x, std::size_t n) {
    constexpr std::uint16_t exponent = std::is_same_v<E, bfloat16> ? 0x7f80 : 0x7c00;
    bool bad = false;
    for (std::size_t j = 0; j < n; ++j) bad |= (x[j].bits & exponent) == exponent;
    return bad;
}

// Floats of one head's packed panels: ceil(n / NR) panels of round16(k·NR) floats (PanelMatrix), checked.
std::size_t panel_floats(Isa isa, std::size_t k, std::size_t n) {
    const std::size_t nr = simd::PanelMatrix::panel_width(isa);
    return scratch_mul((n + nr - 1) / nr, (scratch_mul(k, nr) + 15) / 16 * 16);
}

// Every key of a padding row is masked (nonzero byte or additive -inf).
bool all_masked(const simd::MaskRow& m, std::size_t n) {
    for (std::size_t j = 0; j < n; ++j)
        if (!m.masked(j)) return false;
    return true;
}

// Query rows of a grouped task: G heads × rows ≈ kGroupRows stacked rows.
std::size_t group_query_rows(std::size_t G, std::size_t Lq) {
    return std::min(Lq, std::max<std::size_t>(1, kGroupRows / G));
}

// The online softmax's state before the first key: maxima -inf, sums 0, outputs 0 (o has o.rows rows).
void reset_online_softmax(float* row_max, float* row_sum, Matrix o) {
    std::fill(row_max, row_max + o.rows, kMinusInf);
    std::fill(row_sum, row_sum + o.rows, 0.0f);
    for (std::size_t r = 0; r < o.rows; ++r) std::fill(o.row(r), o.row(r) + o.cols, 0.0f);
}

}  // namespace

std::uint64_t kv_rows_read() noexcept { return g_kv_rows_read.load(std::memory_order_relaxed); }

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
    std::size_t q_stack = 0, scores = 0, accumulator = 0, row_stats = 0, gemm16 = 0;
    if (path == CorePath::decode) {  // the decode kernels read K and V in place: no GEMM pack buffers
        const std::size_t m = s.H / s.Hkv * s.Lq;
        l.splits = (s.Lk + kDecodeSplit - 1) / kDecodeSplit;
        l.partials = call.take(scratch_mul(scratch_mul(scratch_mul(s.B, s.Hkv), l.splits), scratch_mul(m, s.d + 2)));
        q_stack = scratch_mul(m, s.d);
        scores = scratch_mul(m, kDecodeSplit);
        accumulator = scratch_mul(m, s.d);
        row_stats = scratch_mul(2, m);
    } else if (path == CorePath::grouped) {
        std::size_t key_floats = 0, value_floats = 0;
        for (Isa isa : kIsas) {
            if (isa > detected_isa()) continue;
            key_floats = std::max(key_floats, panel_floats(isa, s.d, s.Lk));    // K_hᵀ: [d, Lk]
            value_floats = std::max(value_floats, panel_floats(isa, s.Lk, s.d));  // V_h: [Lk, d]
        }
        l.key_panels = call.take(scratch_mul(scratch_mul(s.B, s.Hkv), key_floats));
        l.value_panels = call.take(scratch_mul(scratch_mul(s.B, s.Hkv), value_floats));
        const std::size_t G = s.H / s.Hkv, m = G * group_query_rows(G, s.Lq);
        q_stack = scratch_mul(m, s.d);
        scores = scratch_mul(m, kKeyTile);
        accumulator = scratch_mul(m, s.d);
        row_stats = scratch_mul(2, m);
        // bf16 panels take at most half the floats of the fp32 ones sized above; the A pack buffer is per thread.
        if (s.bf16 && detected_isa() >= Isa::avx512_bf16) gemm16 = simd::gemm_bf16_scratch(m, std::max(s.d, kKeyTile)) / 2 + 1;
    } else {
        // per_head writes the probabilities straight into attn_weights.
        scores = need_weights == NeedWeights::per_head ? 0 : scratch_mul(kQueryBlock, s.Lk);
        for (Isa isa : kIsas) {
            if (isa > detected_isa()) continue;
            // S = Q_h·K_hᵀ: [rows, keys] over d; then P·V_h: [rows, d] over keys.
            const simd::GemmScratchSize qk = simd::gemm_scratch_bound(isa, kQueryBlock, s.Lk, s.d, Trans::no, Trans::yes);
            const simd::GemmScratchSize pv = simd::gemm_scratch_bound(isa, kQueryBlock, s.d, s.Lk, Trans::no, Trans::no);
            l.gemm.a_floats = std::max({l.gemm.a_floats, qk.a_floats, pv.a_floats});
            l.gemm.b_floats = std::max({l.gemm.b_floats, qk.b_floats, pv.b_floats});
        }
        // bf16: the block's K_hᵀ and V_h in bf16 panels, and the A pack buffer (uint16 elements / 2).
        if (s.bf16 && detected_isa() >= Isa::avx512_bf16)
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
    return l;
}

float* thread_slot(float* slots, std::size_t slot_floats, std::size_t threads) noexcept {
    const int index = tbb::this_task_arena::current_thread_index();
    assert(index >= 0 && static_cast<std::size_t>(index) < threads);
    (void)threads;
    return slots + static_cast<std::size_t>(index) * slot_floats;
}

struct AttentionCore::Slot {
    float* q_stack;
    float* scores;
    float* accumulator;
    float* row_stats;
    simd::GemmScratch gemm;
};

AttentionCore::Slot AttentionCore::slot() const noexcept {
    float* s = thread_slot(slots_, slot_floats_, threads_);
    return {s + layout_.q_stack, s + layout_.scores, s + layout_.accumulator, s + layout_.row_stats,
            simd::GemmScratch{s + layout_.gemm_a, layout_.gemm.a_floats, s + layout_.gemm_b, layout_.gemm.b_floats}};
}

AttentionCore::AttentionCore(const CoreProblem& problem, CorePath path, const CoreLayout& layout, float* base, float* slots,
                             std::size_t slot_floats, std::size_t threads)
    : p_(problem), path_(path), B_(problem.q.batch), H_(problem.q.heads), Hkv_(problem.k.heads), G_(H_ / Hkv_),
      d_(problem.q.dim), Lq_(problem.q.rows), Lk_(problem.k.rows), layout_(layout), slots_(slots),
      slot_floats_(slot_floats), threads_(threads) {
    key_padding_ = mask_row(p_.key_padding_mask);
    attn_mask_ = mask_row(p_.attn_mask);
    attn_mask_rank_ = p_.attn_mask.rank;
    if (p_.causal || key_padding_.present() || attn_mask_.present())
        value_flags_ = reinterpret_cast<std::uint8_t*>(base + layout.value_flags);
    if (path == CorePath::decode) partials_ = base + layout.partials;
    if (path == CorePath::grouped) {
        panel_isa_ = active_isa();
        key_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, d_);
        value_panel_stride_ = simd::PanelMatrix::min_panel_stride(panel_isa_, Lk_);
        key_head_floats_ = simd::PanelMatrix::floats(panel_isa_, Lk_, key_panel_stride_);
        value_head_floats_ = simd::PanelMatrix::floats(panel_isa_, d_, value_panel_stride_);
        key_panels_ = base + layout.key_panels;
        value_panels_ = base + layout.value_panels;
        panels16_ = problem.bf16 && simd::bf16_kernels_available() && layout.gemm16_floats != 0;
        if (panels16_) {  // the same regions in uint16 elements
            key_panel_stride_ = simd::Bf16Panels::min_panel_stride(d_);
            value_panel_stride_ = simd::Bf16Panels::min_panel_stride(Lk_);
            key_head_floats_ = simd::Bf16Panels::elements(Lk_, key_panel_stride_);      // uint16 elements here
            value_head_floats_ = simd::Bf16Panels::elements(d_, value_panel_stride_);
        }
    }
}

simd::Bf16Panels AttentionCore::key_panels16(std::size_t b, std::size_t kvh) const noexcept {
    return {reinterpret_cast<const std::uint16_t*>(key_panels_) + (b * Hkv_ + kvh) * key_head_floats_, d_, Lk_, key_panel_stride_};
}
simd::Bf16Panels AttentionCore::value_panels16(std::size_t b, std::size_t kvh) const noexcept {
    return {reinterpret_cast<const std::uint16_t*>(value_panels_) + (b * Hkv_ + kvh) * value_head_floats_, Lk_, d_, value_panel_stride_};
}

simd::PanelMatrix AttentionCore::key_panels(std::size_t b, std::size_t kvh) const noexcept {
    return {key_panels_ + (b * Hkv_ + kvh) * key_head_floats_, d_, Lk_, key_panel_stride_, panel_isa_};
}
simd::PanelMatrix AttentionCore::value_panels(std::size_t b, std::size_t kvh) const noexcept {
    return {value_panels_ + (b * Hkv_ + kvh) * value_head_floats_, Lk_, d_, value_panel_stride_, panel_isa_};
}

std::size_t AttentionCore::visible_keys(std::size_t b, std::size_t i) const noexcept {
    const std::size_t keys = keys_of(b);
    if (!p_.causal) return keys;
    const std::ptrdiff_t shift = p_.key_lengths != nullptr ? static_cast<std::ptrdiff_t>(keys) - static_cast<std::ptrdiff_t>(Lq_)
                                                           : p_.causal_shift;
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(i) + 1 + shift;
    return n <= 0 ? 0 : std::min(keys, static_cast<std::size_t>(n));
}

bool AttentionCore::key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept {
    return j >= visible_keys(b, i) || key_padding_row(b).masked(j) || attn_mask_row(b, h, i).masked(j);
}

template <class E>
MatrixView<const E> AttentionCore::kv_rows(bool values, std::size_t b, std::size_t kvh, std::size_t j0, std::size_t n) const noexcept {
    const ConstHeads& g = values ? p_.v : p_.k;
    if constexpr (std::is_same_v<E, float>) {
        return g.head(b, kvh).row_block(j0, n);
    } else {
        const E* base = static_cast<const E*>(values ? p_.v_elements : p_.k_elements);
        return {base + b * g.batch_stride + kvh * g.head_stride + j0 * g.row_stride, n, g.dim, g.row_stride};
    }
}

float AttentionCore::value_at(std::size_t b, std::size_t kvh, std::size_t j, std::size_t c) const noexcept {
    switch (p_.kv_type) {
        case DataType::bf16: return kv_rows<bfloat16>(true, b, kvh, j, 1)(0, c).to_float();
        case DataType::f16: return kv_rows<float16>(true, b, kvh, j, 1)(0, c).to_float();
        case DataType::f32: break;
    }
    return p_.v.head(b, kvh)(j, c);
}

void AttentionCore::accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                                        Matrix o) const noexcept {
    for (std::size_t r = 0; r < probs.rows; ++r)
        for (std::size_t j = 0; j < probs.cols; ++j) {
            if (key_masked(b, h, i0 + r, j0 + j)) continue;
            const float pj = probs(r, j);
            for (std::size_t col = 0; col < d_; ++col) o(r, col) += pj * value_at(b, h / G_, j0 + j, col);
        }
}

void AttentionCore::check_values() const {
    if (value_flags_ == nullptr) return;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * Hkv_), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t bh = r.begin(); bh != r.end(); ++bh) {
            const ConstMatrix v = p_.v.head(bh / Hkv_, bh % Hkv_);
            bool bad = false;
            for (std::size_t j = 0; j < keys_of(bh / Hkv_) && !bad; ++j) bad = any_nonfinite(v.row(j), d_);
            value_flags_[bh] = bad ? 1 : 0;
        }
    });
}

void AttentionCore::pack_keys_values() const {
    if (value_flags_ != nullptr) std::fill(value_flags_, value_flags_ + B_ * Hkv_, std::uint8_t{0});
    const std::size_t nj = (Lk_ + kPackBlock - 1) / kPackBlock, nr = simd::PanelMatrix::panel_width(panel_isa_);
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B_ * Hkv_ * nj), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t bh = t / nj, b = bh / Hkv_, kvh = bh % Hkv_;
            const std::size_t j0 = (t % nj) * kPackBlock;
            if (j0 >= keys_of(b)) continue;  // rows past a sequence's keys are never read
            const std::size_t n = std::min(kPackBlock, keys_of(b) - j0);
            const ConstMatrix k = p_.k.head(b, kvh).row_block(j0, n), v = p_.v.head(b, kvh).row_block(j0, n);
            // Keys j0.. are columns of K_hᵀ (panels j0 / NR..) and rows of V_h (j0 rows into every panel).
            if (panels16_) {  // an odd chunk's last pair gets a zero partner (P·V reads whole pairs)
                auto* keys16 = reinterpret_cast<std::uint16_t*>(key_panels_) + bh * key_head_floats_;
                auto* values16 = reinterpret_cast<std::uint16_t*>(value_panels_) + bh * value_head_floats_;
                simd::pack_panels_bf16(k, Trans::yes, keys16 + j0 / simd::kBf16PanelWidth * key_panel_stride_, key_panel_stride_);
                simd::pack_panels_bf16(v, Trans::no, values16 + j0 * simd::kBf16PanelWidth, value_panel_stride_);
            } else {
                simd::pack_panels(panel_isa_, k, Trans::yes, key_panels_ + bh * key_head_floats_ + j0 / nr * key_panel_stride_,
                                  key_panel_stride_);
                simd::pack_panels(panel_isa_, v, Trans::no, value_panels_ + bh * value_head_floats_ + j0 * nr, value_panel_stride_);
            }
            g_kv_rows_read.fetch_add(2 * n, std::memory_order_relaxed);
            if (value_flags_ != nullptr) {  // while the rows are in cache: a NaN/±inf value needs the careful P·V
                bool bad = false;
                for (std::size_t j = 0; j < n && !bad; ++j) bad = any_nonfinite(v.row(j), d_);
                if (bad) __atomic_store_n(&value_flags_[bh], std::uint8_t{1}, __ATOMIC_RELAXED);
            }
        }
    });
}

void AttentionCore::stack_queries(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows, Matrix q) const noexcept {
    for (std::size_t t = 0; t < G_; ++t) {
        const ConstMatrix qh = p_.q.head(b, kvh * G_ + t);
        for (std::size_t r = 0; r < rows; ++r) std::copy(qh.row(i0 + r), qh.row(i0 + r) + d_, q.row(t * rows + r));
    }
}

void AttentionCore::decode_task(std::size_t b, std::size_t kvh, std::size_t split) const {
    const std::size_t d = d_, m = G_ * Lq_;
    const Slot s = slot();
    const Matrix q(s.q_stack, m, d, d);
    const Matrix o(s.accumulator, m, d, d);
    float* row_max = s.row_stats;
    float* row_sum = row_max + m;
    reset_online_softmax(row_max, row_sum, o);

    const std::size_t key_end = visible_keys(b, Lq_ - 1);
    std::size_t j0 = split * kDecodeSplit, j_end = std::min(key_end, j0 + kDecodeSplit);
    const simd::MaskRow padding = key_padding_row(b);
    if (padding.present()) {  // wholly padded tiles at either end of the split are not read
        while (j0 < j_end && all_masked(padding.from(j0), std::min(kKeyTile, j_end - j0))) j0 += kKeyTile;
        while (j0 < j_end) {
            const std::size_t last = j0 + (j_end - j0 - 1) / kKeyTile * kKeyTile;
            if (!all_masked(padding.from(last), j_end - last)) break;
            j_end = last;
        }
    }
    if (j0 < j_end) {
        const std::size_t n = j_end - j0;
        stack_queries(b, kvh, 0, Lq_, q);
        const Matrix st(s.scores, m, n, kDecodeSplit);
        switch (p_.kv_type) {
            case DataType::f32: decode_split<float>(b, kvh, j0, n, ConstMatrix(q), st, o, row_max, row_sum); break;
            case DataType::bf16: decode_split<bfloat16>(b, kvh, j0, n, ConstMatrix(q), st, o, row_max, row_sum); break;
            case DataType::f16: decode_split<float16>(b, kvh, j0, n, ConstMatrix(q), st, o, row_max, row_sum); break;
        }
        g_kv_rows_read.fetch_add(2 * n, std::memory_order_relaxed);
    }
    // The split's partial result: row maxima, sums and unnormalized outputs.
    float* part = partials_ + ((b * Hkv_ + kvh) * layout_.splits + split) * m * (d + 2);
    std::copy(row_max, row_max + m, part);
    std::copy(row_sum, row_sum + m, part + m);
    for (std::size_t r = 0; r < m; ++r) std::copy(o.row(r), o.row(r) + d, part + 2 * m + r * d);
}

template <class E>
void AttentionCore::decode_split(std::size_t b, std::size_t kvh, std::size_t j0, std::size_t n, ConstMatrix q, Matrix st,
                                 Matrix o, float* row_max, float* row_sum) const {
    const std::size_t m = G_ * Lq_, j_end = j0 + n;
    const simd::MaskRow padding = key_padding_row(b);
    const MatrixView<const E> k = kv_rows<E>(false, b, kvh, j0, n), v = kv_rows<E>(true, b, kvh, j0, n);
    // All the split's scores first, then all its values: one stream at a time (switching between the K
    // and V streams every 256 rows measured 10-20 % slower at M = 4..8).
    simd::decode_scores(p_.scale, q, k, st);
    for (std::size_t row = 0; row < m; ++row) {
        const std::size_t t = row / Lq_, i = row % Lq_;
        const std::size_t vis = visible_keys(b, i), valid = vis > j0 ? std::min(n, vis - j0) : 0;
        row_sum[row] = simd::softmax_tile_online(st.row(row), n, valid, 1.0f, padding.from(j0),
                                                 attn_mask_row(b, kvh * G_ + t, i).from(j0), row_max[row]);
    }
    // A key of this split is masked for some row (the causal edge of the first query, or a mask): a NaN or
    // ±inf value row must then not reach the output through 0·v.
    const bool masked_here = padding.present() || attn_mask_.present() || (p_.causal && j_end > visible_keys(b, 0));
    bool careful = false;
    for (std::size_t j = 0; masked_here && j < n && !careful; ++j) careful = any_nonfinite(v.row(j), d_);
    if (p_.bf16) simd::round_to_bf16_inplace(st);  // P as the input of P·V
    if (careful) {
        for (std::size_t t = 0; t < G_; ++t)
            accumulate_unmasked(b, kvh * G_ + t, 0, j0, ConstMatrix(st.row_block(t * Lq_, Lq_)), o.row_block(t * Lq_, Lq_));
    } else {
        simd::decode_accumulate(ConstMatrix(st), v, o);
    }
}

void AttentionCore::decode_merge(std::size_t b, std::size_t kvh) const {
    const std::size_t d = d_, m = G_ * Lq_, splits = layout_.splits;
    const float* parts = partials_ + (b * Hkv_ + kvh) * splits * m * (d + 2);
    for (std::size_t row = 0; row < m; ++row) {
        float best = kMinusInf;
        for (std::size_t sp = 0; sp < splits; ++sp) {
            const float mx = parts[sp * m * (d + 2) + row];
            best = (std::isnan(mx) || mx > best) ? mx : best;
            if (std::isnan(best)) break;
        }
        float* dst = p_.out.head(b, kvh * G_ + row / Lq_).row(row % Lq_);
        std::fill(dst, dst + d, 0.0f);
        float sum = 0.0f;
        for (std::size_t sp = 0; sp < splits; ++sp) {  // fixed order: the same bits for any thread count
            const float* part = parts + sp * m * (d + 2);
            if (part[row] == kMinusInf) {  // no visible key in this split (a NaN sum still makes the row NaN)
                if (std::isnan(part[m + row])) sum = part[m + row];
                continue;
            }
            const float scale = std::isnan(best) ? best : std::exp(part[row] - best);
            sum += part[m + row] * scale;
            const float* po = part + 2 * m + row * d;
            for (std::size_t c = 0; c < d; ++c) dst[c] += po[c] * scale;
        }
        // sum = 0: every key masked, the row is 0. A NaN sum (NaN scores) stays NaN.
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (std::size_t c = 0; c < d; ++c) dst[c] *= inv;
    }
}

void AttentionCore::grouped_task(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows) const {
    const std::size_t d = d_, tile = kKeyTile, m = G_ * rows;
    const Slot s = slot();
    const Matrix q(s.q_stack, m, d, d);
    stack_queries(b, kvh, i0, rows, q);
    const Matrix sc(s.scores, m, tile, tile);
    const Matrix o(s.accumulator, m, d, d);
    float* row_max = s.row_stats;
    float* row_sum = row_max + m;
    reset_online_softmax(row_max, row_sum, o);

    const simd::PanelMatrix k_t = key_panels(b, kvh), v = value_panels(b, kvh);
    const simd::Bf16Panels k16 = panels16_ ? key_panels16(b, kvh) : simd::Bf16Panels{}, v16 = panels16_ ? value_panels16(b, kvh) : simd::Bf16Panels{};
    auto* a16 = reinterpret_cast<std::uint16_t*>(thread_slot(slots_, slot_floats_, threads_) + layout_.gemm16);
    const simd::MaskRow padding = key_padding_row(b);
    const bool careful = value_nonfinite(b, kvh);  // a value is NaN or ±inf: masked keys must be skipped
    const std::size_t key_end = visible_keys(b, i0 + rows - 1);

    for (std::size_t j0 = 0; j0 < key_end; j0 += tile) {
        const std::size_t kt = std::min(tile, key_end - j0);
        if (padding.present() && all_masked(padding.from(j0), kt)) continue;
        const Matrix st = sc.columns(0, kt);
        if (panels16_)
            simd::gemm_bf16(p_.scale, ConstMatrix(q), k16.columns(j0, kt), 0.0f, nullptr, st, a16);
        else
            simd::gemm_panels(p_.scale, ConstMatrix(q), Trans::no, k_t.columns(j0, kt), 0.0f, st);
        for (std::size_t row = 0; row < m; ++row) {
            const std::size_t t = row / rows, i = i0 + row % rows;
            const std::size_t vis = visible_keys(b, i), valid = vis > j0 ? std::min(kt, vis - j0) : 0;
            const simd::MaskRow am = attn_mask_row(b, kvh * G_ + t, i);
            const float old_max = row_max[row];
            const float tile_sum =
                simd::softmax_tile_online(st.row(row), kt, valid, 1.0f, padding.from(j0), am.from(j0), row_max[row]);
            if (row_max[row] != old_max) {
                // The max grew: rescale what was accumulated under the old max (nothing if it was -inf).
                const float alpha = old_max == kMinusInf ? 0.0f : std::exp(old_max - row_max[row]);
                row_sum[row] *= alpha;
                float* orow = o.row(row);
                for (std::size_t c = 0; c < d; ++c) orow[c] *= alpha;
            }
            row_sum[row] += tile_sum;
        }
        if (p_.bf16 && (careful || !panels16_)) simd::round_to_bf16_inplace(st);  // (the bf16 kernel rounds as it packs)
        if (careful) {  // unpacked V, masked keys left out
            for (std::size_t t = 0; t < G_; ++t)
                accumulate_unmasked(b, kvh * G_ + t, i0, j0, ConstMatrix(st.row_block(t * rows, rows)),
                                    o.row_block(t * rows, rows));
        } else if (panels16_) {
            simd::gemm_bf16(1.0f, ConstMatrix(st), v16.rows(j0, kt), 1.0f, nullptr, o, a16);
        } else {
            simd::gemm_panels(1.0f, ConstMatrix(st), Trans::no, v.rows(j0, kt), 1.0f, o);
        }
    }

    for (std::size_t row = 0; row < m; ++row) {
        // l = 0: every key masked, the row is 0. A NaN l (NaN scores) stays NaN.
        const float inv = row_sum[row] == 0.0f ? 0.0f : 1.0f / row_sum[row];
        float* dst = p_.out.head(b, kvh * G_ + row / rows).row(i0 + row % rows);
        const float* src = o.row(row);
        for (std::size_t c = 0; c < d; ++c) dst[c] = src[c] * inv;
    }
}

void AttentionCore::attend_block(std::size_t b, std::size_t h, std::size_t i0, std::size_t rows, Matrix scores,
                                 const simd::GemmScratch& gemm) const {
    // Causal: keys past the block's last visible key are masked for every row of the block; skip them.
    const std::size_t keys = visible_keys(b, i0 + rows - 1);
    const std::size_t cols = p_.need_weights == NeedWeights::none ? keys : Lk_;
    const Matrix s(scores.data, rows, cols, scores.stride);
    const Matrix c = p_.out.head(b, h).row_block(i0, rows);
    if (keys == 0) {  // bottom-right causal with Lq > Lk: these queries see no key
        for (std::size_t r = 0; r < rows; ++r) {
            if (cols > 0) simd::softmax_row(s.row(r), cols, 0, 1.0f, {}, {});
            std::fill(c.row(r), c.row(r) + d_, 0.0f);
        }
        return;
    }
    const ConstMatrix q = p_.q.head(b, h).row_block(i0, rows);
    const ConstMatrix k = p_.k.head(b, h / G_).row_block(0, keys);
    // bf16 on the bf16 kernels: K_hᵀ and V_h packed into the slot's bf16 panels for this block.
    const bool use16 = p_.bf16 && layout_.gemm16_floats != 0 && simd::bf16_kernels_available();
    auto* k16 = reinterpret_cast<std::uint16_t*>(thread_slot(slots_, slot_floats_, threads_) + layout_.gemm16);
    const std::size_t k16_stride = simd::Bf16Panels::min_panel_stride(d_), v16_stride = simd::Bf16Panels::min_panel_stride(keys);
    std::uint16_t* v16 = k16 + (simd::Bf16Panels::elements(keys, k16_stride) + 31) / 32 * 32;
    std::uint16_t* a16 = v16 + (simd::Bf16Panels::elements(d_, v16_stride) + 31) / 32 * 32;
    if (use16) {
        simd::pack_panels_bf16(k, Trans::yes, k16, k16_stride);
        simd::gemm_bf16(p_.scale, q, simd::Bf16Panels{k16, d_, keys, k16_stride}, 0.0f, nullptr, s.columns(0, keys), a16);
    } else {
        simd::gemm(p_.scale, q, Trans::no, k, Trans::yes, 0.0f, s.columns(0, keys), gemm);
    }
    for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t i = i0 + r;
        simd::softmax_row(s.row(r), cols, visible_keys(b, i), 1.0f, key_padding_row(b), attn_mask_row(b, h, i));
    }
    g_kv_rows_read.fetch_add(2 * keys, std::memory_order_relaxed);
    if (p_.bf16) simd::round_to_bf16_inplace(s);  // P as the input of P·V (and as the weights returned)
    if (value_nonfinite(b, h / G_)) {  // a masked key must not contribute 0·NaN
        for (std::size_t r = 0; r < rows; ++r) std::fill(c.row(r), c.row(r) + d_, 0.0f);
        accumulate_unmasked(b, h, i0, 0, ConstMatrix(s.columns(0, keys)), c);
        return;
    }
    const ConstMatrix v = p_.v.head(b, h / G_).row_block(0, keys);
    if (use16) {
        simd::pack_panels_bf16(v, Trans::no, v16, v16_stride);
        simd::gemm_bf16(1.0f, ConstMatrix(s.columns(0, keys)), simd::Bf16Panels{v16, keys, d_, v16_stride}, 0.0f, nullptr, c, a16);
        return;
    }
    simd::gemm(1.0f, ConstMatrix(s.columns(0, keys)), Trans::no, v, Trans::no, 0.0f, c, gemm);
}

void AttentionCore::run() const {
    const std::size_t B = B_, H = H_, Lq = Lq_, Lk = Lk_;
    if (path_ == CorePath::decode) {
        const std::size_t splits = layout_.splits;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * Hkv_ * splits), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) decode_task(t / splits / Hkv_, t / splits % Hkv_, t % splits);
        });
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * Hkv_), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) decode_merge(t / Hkv_, t % Hkv_);
        });
        return;
    }
    if (path_ == CorePath::grouped) {
        pack_keys_values();
        const std::size_t qr = group_query_rows(G_, Lq), nqb = (Lq + qr - 1) / qr;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * Hkv_ * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t bh = t / nqb, i0 = (t % nqb) * qr;
                grouped_task(bh / Hkv_, bh % Hkv_, i0, std::min(qr, Lq - i0));
            }
        });
        return;
    }
    check_values();
    const std::size_t qb = kQueryBlock, nqb = (Lq + qb - 1) / qb;
    if (p_.need_weights == NeedWeights::averaged) {
        // The heads of a block run in one task so the sum over heads has a fixed order.
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t t = r.begin(); t != r.end(); ++t) {
                const std::size_t b = t / nqb, i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
                const Slot s = slot();
                const Matrix sc(s.scores, rows, Lk);
                const Matrix w(p_.attn_weights + (b * Lq + i0) * Lk, rows, Lk);
                const float inv_h = 1.0f / static_cast<float>(H);
                for (std::size_t h = 0; h < H; ++h) {
                    attend_block(b, h, i0, rows, sc, s.gemm);
                    for (std::size_t i = 0; i < rows; ++i)
                        for (std::size_t j = 0; j < Lk; ++j) w(i, j) = (h == 0 ? 0.0f : w(i, j)) + sc(i, j) * inv_h;
                }
            }
        });
        return;
    }
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, B * H * nqb), [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t t = r.begin(); t != r.end(); ++t) {
            const std::size_t bh = t / nqb, b = bh / H, h = bh % H;
            const std::size_t i0 = (t % nqb) * qb, rows = std::min(qb, Lq - i0);
            const Slot s = slot();
            const Matrix sc = p_.need_weights == NeedWeights::per_head ? Matrix(p_.attn_weights + (bh * Lq + i0) * Lk, rows, Lk)
                                                                       : Matrix(s.scores, rows, Lk);
            attend_block(b, h, i0, rows, sc, s.gemm);
        }
    });
}

}  // namespace mha::detail
