// What the attention core's paths share (core_materialized.cpp, core_grouped.cpp, core_decode.cpp):
// the problem's dimensions, the per-thread slot, and the key policy:
//   visibility: query i of batch b sees keys [lo, hi) of its sequence (visible(): the causal rule and a
//     sliding window's right side bound hi, its left side lo), further masked by the padding and attention
//     masks read row by row; the paths visit only key tiles that meet a block's range;
//   score modifiers: softcap and ALiBi applied by the softmax kernels' first pass (row_modifiers), the keys
//     before a row's lo inside a tile given probability 0 (softmax_tile), and the sink in each row's
//     denominator (row_normalizer);
//   non-finite values: a masked key must not reach the output through 0·NaN, so a KV head whose values hold
//     NaN or ±inf (value_flags) takes the careful P·V (accumulate_unmasked) instead of the GEMM.
// Preconditions: the problem validated, the scratch laid out by core_layout for the same shape and path.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "attention_core.hpp"
#include "gemm_operands.hpp"

namespace mha::detail {

// Keys [lo, hi) of a sequence.
struct KeyRange {
    std::size_t lo = 0, hi = 0;
    bool empty() const noexcept { return hi <= lo; }
};

// A thread's share of the scratch (CoreLayout's per-thread regions).
struct CoreSlot {
    float* q_stack;
    float* scores;
    float* accumulator;
    float* row_stats;
    simd::GemmScratch gemm;
    std::uint16_t* gemm16;  // bf16 scratch (CoreLayout::gemm16)
    float* widen_rows;      // CoreLayout::widen_rows
};

// Counts K and V rows read (kv_rows_read()).
void count_kv_rows(std::size_t rows) noexcept;

// Any of the n elements of a row of `format` is NaN or ±inf (fp32: simd::any_nonfinite; 16-bit: the exponent
// field all ones).
bool any_nonfinite(const ElementFormat& format, const void* x, std::size_t n) noexcept;
// Every key j < n of a padding row is masked (nonzero byte or additive -inf).
bool all_masked(const simd::MaskRow& m, std::size_t n) noexcept;

class CoreContext {
public:
    CoreContext(const CoreProblem& p, const CoreLayout& layout, float* base, float* slots, std::size_t slot_floats,
                std::size_t threads);

    const CoreProblem& p;
    const CoreLayout& layout;
    const std::size_t B, H, Hkv, G, d, Lq, Lk;
    const GemmOperands operands;  // of the core's GEMMs (bf16 kernels only where the layout sized their scratch)
    float* const base;
    const KVRows keys, values;  // decode reads these (p.key_rows / value_rows, else p.k / p.v)

    CoreSlot slot() const noexcept;
    // Keys of batch b (key_lengths[b], or Lk).
    std::size_t keys_of(std::size_t b) const noexcept { return p.key_lengths != nullptr ? p.key_lengths[b] : Lk; }
    // The keys query i of batch b may see (before the masks).
    KeyRange visible(std::size_t b, std::size_t i) const noexcept;
    // The keys some query of rows [i0, i0 + rows) may see: tiles outside it are never visited.
    KeyRange visible_block(std::size_t b, std::size_t i0, std::size_t rows) const noexcept;
    // Of tile [j0, j0 + n), the keys query i sees by visibility, counted from j0: the softmax kernels' n_valid.
    // The keys before range.lo in the tile (hidden_prefix) are left out of the softmax by the paths (probability 0).
    std::size_t tile_valid(KeyRange range, std::size_t j0, std::size_t n) const noexcept {
        return range.hi > j0 ? (range.hi - j0 < n ? range.hi - j0 : n) : 0;
    }
    simd::MaskRow key_padding_row(std::size_t b) const noexcept { return key_padding_.from(b * Lk); }
    simd::MaskRow attn_mask_row(std::size_t b, std::size_t h, std::size_t i) const noexcept {
        if (!attn_mask_.present()) return {};
        return attn_mask_.from(((p.attn_mask.rank == 3 ? (b * H + h) * Lq : 0) + i) * Lk);
    }
    bool any_mask() const noexcept { return key_padding_.present() || attn_mask_.present(); }
    // Some key can be hidden from some query (causal, a window or a mask): NaN values need the careful P·V.
    bool hides_keys() const noexcept { return p.causal || p.mods.window() || any_mask(); }
    // Query i of batch b's position (keys are at their indices).
    std::ptrdiff_t query_position(std::size_t b, std::size_t i) const noexcept {
        const std::ptrdiff_t shift = p.key_lengths != nullptr ? static_cast<std::ptrdiff_t>(keys_of(b)) - static_cast<std::ptrdiff_t>(Lq)
                                                              : p.query_shift;
        return static_cast<std::ptrdiff_t>(i) + shift;
    }
    static std::size_t hidden_prefix(KeyRange range, std::size_t j0, std::size_t n) noexcept {
        return range.lo > j0 ? (range.lo - j0 < n ? range.lo - j0 : n) : 0;
    }
    bool modifies_scores() const noexcept { return p.mods.softcap > 0.0f || p.mods.alibi_slopes != nullptr; }
    // Softcap and ALiBi of query i of head h (batch b) against keys from j0 on, as the softmax kernels take them.
    simd::ScoreRowModifiers row_modifiers(std::size_t b, std::size_t h, std::size_t i, std::size_t j0) const noexcept;
    // The factor that turns a row's unnormalized output (running max m, sum l) into probabilities: 1 / l, or
    // with a sink σ_h exp(m − m')/(l·exp(m − m') + exp(σ_h − m')), m' = max(m, σ_h). 0 when l = 0 (every key
    // masked); NaN stays NaN.
    float row_normalizer(std::size_t h, float m, float l) const noexcept;
    // One key tile of query i of head h (batch b), scores x[0, n) against keys [j0, j0 + n): the score
    // modifiers, then simd::softmax_tile_online over the keys the query sees (those before its window get 0).
    float softmax_tile(std::size_t b, std::size_t h, std::size_t i, std::size_t j0, float* x, std::size_t n,
                       float& running_max) const noexcept;
    bool key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept;

    // [B·Hkv] flags, when a key can be masked (causal or a mask): KV head (b, kvh) has a non-finite value.
    std::uint8_t* value_flags() const noexcept { return value_flags_; }
    bool value_nonfinite(std::size_t b, std::size_t kvh) const noexcept {
        return value_flags_ != nullptr && __atomic_load_n(&value_flags_[b * Hkv + kvh], __ATOMIC_RELAXED) != 0;
    }
    // o[r, :] += Σ_j probs[r, j]·v[j0 + j, :] over the keys not masked for query i0 + r of head h: the P·V of a
    // KV head whose values are not all finite (0·NaN must not reach o). Plain loops: a rare path.
    void accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                             Matrix o) const noexcept;
    // Copies the G heads' query rows [i0, i0 + rows) of KV head kvh into q (row t·rows + r).
    void stack_queries(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows, Matrix q) const noexcept;

private:
    // Value (j, c) of KV head kvh, widened to float.
    float value_at(std::size_t b, std::size_t kvh, std::size_t j, std::size_t c) const noexcept;

    simd::MaskRow key_padding_, attn_mask_;
    std::uint8_t* value_flags_ = nullptr;
    float* slots_;
    std::size_t slot_floats_, threads_;
};

// The online softmax's state before the first key: maxima -inf, sums 0, outputs 0 (o has o.rows rows).
void reset_online_softmax(float* row_max, float* row_sum, Matrix o) noexcept;

// The paths (one file each); the task loops are theirs.
void run_materialized(const CoreContext& c);
void run_grouped(const CoreContext& c);
void run_decode(const CoreContext& c);

}  // namespace mha::detail
