// CoreContext (core_context.hpp): key visibility, the mask / non-finite value policy, the per-thread slot.
#include "core_context.hpp"

#include "../simd/nonfinite.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include <tbb/task_arena.h>

namespace mha::detail {
namespace {

std::atomic<std::uint64_t> g_kv_rows_read{0};

// A mask's data as a row reader (the row offset is added per use).
simd::MaskRow mask_row(const MaskView& m) {
    if (!m.present()) return {};
    return m.type == MaskType::boolean ? simd::MaskRow(m.bools) : simd::MaskRow(m.values);
}

KVRows rows_or(const KVRows& rows, const ConstHeads& x) noexcept { return rows.base != nullptr ? rows : KVRows::of(x); }

}  // namespace

std::uint64_t kv_rows_read() noexcept { return g_kv_rows_read.load(std::memory_order_relaxed); }
void count_kv_rows(std::size_t rows) noexcept { g_kv_rows_read.fetch_add(rows, std::memory_order_relaxed); }

bool any_nonfinite(const ElementFormat& format, const void* x, std::size_t n) noexcept {
    if (format.type == DataType::f32) return simd::any_nonfinite(static_cast<const float*>(x), n);
    return any_nonfinite_elements(format, x, n);
}

bool all_masked(const simd::MaskRow& m, std::size_t n) noexcept {
    for (std::size_t j = 0; j < n; ++j)
        if (!m.masked(j)) return false;
    return true;
}

void reset_online_softmax(float* row_max, float* row_sum, Matrix o) noexcept {
    std::fill(row_max, row_max + o.rows, -std::numeric_limits<float>::infinity());
    std::fill(row_sum, row_sum + o.rows, 0.0f);
    for (std::size_t r = 0; r < o.rows; ++r) std::fill(o.row(r), o.row(r) + o.cols, 0.0f);
}

CoreContext::CoreContext(const CoreProblem& problem, const CoreLayout& l, float* scratch, float* slots,
                         std::size_t slot_floats, std::size_t threads)
    : p(problem), layout(l), B(problem.q.batch), H(problem.q.heads), Hkv(problem.k.heads), G(H / Hkv), d(problem.q.dim),
      Lq(problem.q.rows), Lk(problem.k.rows),
      operands(gemm_operands(problem.compute, l.gemm16_floats != 0 && simd::bf16_kernels_available())), base(scratch),
      keys(rows_or(problem.key_rows, problem.k)), values(rows_or(problem.value_rows, problem.v)),
      key_padding_(mask_row(problem.key_padding_mask)), attn_mask_(mask_row(problem.attn_mask)), slots_(slots),
      slot_floats_(slot_floats), threads_(threads) {
    if (hides_keys()) value_flags_ = reinterpret_cast<std::uint8_t*>(scratch + l.value_flags);
}

CoreSlot CoreContext::slot() const noexcept {
    float* s = thread_slot(slots_, slot_floats_, threads_);
    return {s + layout.q_stack, s + layout.scores, s + layout.accumulator, s + layout.row_stats,
            simd::GemmScratch{s + layout.gemm_a, layout.gemm.a_floats, s + layout.gemm_b, layout.gemm.b_floats},
            reinterpret_cast<std::uint16_t*>(s + layout.gemm16), s + layout.widen_rows};
}

KeyRange CoreContext::visible(std::size_t b, std::size_t i) const noexcept {
    const std::size_t keys = keys_of(b);
    if (!p.causal && !p.mods.window()) return {0, keys};
    const std::ptrdiff_t pos = query_position(b, i), n = static_cast<std::ptrdiff_t>(keys);
    std::ptrdiff_t lo = 0, hi = n;  // [lo, hi) in signed arithmetic, then clamped to [0, keys]
    if (p.causal) hi = std::min(hi, pos + 1);
    // A side so long that pos ± side overflows reaches past every key: that bound is dropped, not wrapped.
    std::ptrdiff_t edge = 0;
    if (p.mods.window_right >= 0 && !__builtin_add_overflow(pos + 1, p.mods.window_right, &edge)) hi = std::min(hi, edge);
    if (p.mods.window_left >= 0 && !__builtin_sub_overflow(pos, p.mods.window_left, &edge)) lo = std::max(lo, edge);
    hi = std::max<std::ptrdiff_t>(hi, 0);
    lo = std::min(lo, hi);
    return {static_cast<std::size_t>(lo), static_cast<std::size_t>(hi)};
}

simd::ScoreRowModifiers CoreContext::row_modifiers(std::size_t b, std::size_t h, std::size_t i, std::size_t j0) const noexcept {
    simd::ScoreRowModifiers m;
    if (!modifies_scores()) return m;
    m.softcap = p.mods.softcap;
    m.slope = p.mods.alibi_slopes != nullptr ? p.mods.alibi_slopes[h] : 0.0f;
    m.t0 = static_cast<float>(static_cast<std::ptrdiff_t>(j0) - query_position(b, i));
    return m;
}

float CoreContext::softmax_tile(std::size_t b, std::size_t h, std::size_t i, std::size_t j0, float* x, std::size_t n,
                                float& running_max) const noexcept {
    const KeyRange r = visible(b, i);
    const std::size_t valid = tile_valid(r, j0, n), pre = hidden_prefix(r, j0, valid);
    const float sum = simd::softmax_tile_online(x + pre, n - pre, valid - pre, 1.0f, key_padding_row(b).from(j0 + pre),
                                                attn_mask_row(b, h, i).from(j0 + pre), running_max,
                                                row_modifiers(b, h, i, j0 + pre));
    std::fill(x, x + pre, 0.0f);
    return sum;
}

float CoreContext::row_normalizer(std::size_t h, float m, float l) const noexcept {
    if (l == 0.0f) return 0.0f;  // every key masked
    if (p.mods.sinks == nullptr || std::isnan(l)) return 1.0f / l;
    const float sink = p.mods.sinks[h], top = std::max(m, sink);
    const float a = std::exp(m - top);
    return a / (l * a + std::exp(sink - top));
}

KeyRange CoreContext::visible_block(std::size_t b, std::size_t i0, std::size_t rows) const noexcept {
    return {visible(b, i0).lo, visible(b, i0 + rows - 1).hi};
}

bool CoreContext::key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept {
    const KeyRange r = visible(b, i);
    return j < r.lo || j >= r.hi || key_padding_row(b).masked(j) || attn_mask_row(b, h, i).masked(j);
}

float CoreContext::value_at(std::size_t b, std::size_t kvh, std::size_t j, std::size_t c) const noexcept {
    return values.format->value(values.row_bytes(b, kvh, j), d, c, values.scale);
}

void CoreContext::accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                                      Matrix o) const noexcept {
    for (std::size_t r = 0; r < probs.rows; ++r)
        for (std::size_t j = 0; j < probs.cols; ++j) {
            if (key_masked(b, h, i0 + r, j0 + j)) continue;
            const float pj = probs(r, j);
            for (std::size_t col = 0; col < d; ++col) o(r, col) += pj * value_at(b, h / G, j0 + j, col);
        }
}

void CoreContext::stack_queries(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows, Matrix q) const noexcept {
    for (std::size_t t = 0; t < G; ++t) {
        const ConstMatrix qh = p.q.head(b, kvh * G + t);
        for (std::size_t r = 0; r < rows; ++r) std::copy(qh.row(i0 + r), qh.row(i0 + r) + d, q.row(t * rows + r));
    }
}

}  // namespace mha::detail
