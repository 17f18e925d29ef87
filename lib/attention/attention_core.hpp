// The SIMD attention core on projected heads, shared by MultiheadAttention (its Q, K, V and context are
// strided head views into the projection buffers) and mha::scaled_dot_product_attention:
//   out_h = softmax(scale·q_h·k_{h/G}ᵀ + masks)·v_{h/G}  for query heads h < H, G = H / Hkv.
// Two paths, both parallel over tasks whose sizes depend on the shape only (bitwise equal results for any
// thread count):
//   grouped (fused): per (batch, KV head, query block) the G query heads' rows are stacked into one
//     [G·rows, d] block and run against one pass over that KV head's keys, K_hᵀ and V_h packed into GEMM
//     panels once per call (reads each K and V row once per group), key tiles with the online softmax;
//   decode (few queries: Lq <= 16 and G·Lq <= 128): per (batch, KV head, split: decode_split) the G·Lq stacked
//     rows against the split's keys read in place by the decode kernels (simd::decode_scores, then the split's
//     softmax, then simd::decode_accumulate: every cached row read once per group, no copy of the cache);
//     the splits' (max, sum, output) are merged exactly by rescaling (flash-decoding). Splits depend on the
//     shape only;
//   materialized: per (batch, query head, 64 query rows) the scores [rows, Lk] and a plain softmax; the
//     only path that can return the probabilities (need_weights). It reads K and V once per (query head,
//     64-row query block).
// Preconditions: arguments validated by the public entry point; scratch laid out by core_layout.
// Files: this interface; core_layout.cpp (path choice, scratch); core_context.* (what the paths share: key
// visibility, the mask / non-finite value policy, slots); core_materialized.cpp, core_grouped.cpp,
// core_decode.cpp (one path each); attention_core.cpp (run: the path's task loops).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mha/attention.hpp"
#include "mha/sdpa.hpp"
#include "../simd/gemm_bf16.hpp"
#include "../simd/simd.hpp"
#include "kv_rows.hpp"

namespace mha::detail {

// Rows of the materialized path's tasks: 64 rows × Lk scores stay in L2.
inline constexpr std::size_t kQueryBlock = 64;
// Stacked query rows (G heads × rows) of a grouped task. 128 halves how often each packed key/value tile
// is streamed from L2 per query row, against 64 (measured for the MHA-only fused path, issue 9).
inline constexpr std::size_t kGroupRows = 128;
// Keys per tile of the grouped path (128 reruns the short-K microkernel epilogue and the per-row softmax
// bookkeeping twice as often; 512 gains nothing and doubles the score tile).
inline constexpr std::size_t kKeyTile = 256;
// Where a query block's first key tile starts: its first visible key rounded down to this (every fp32 and
// bf16 panel width divides it), not to kKeyTile, so a sliding window's left edge computes at most 31 hidden
// keys per row instead of up to 255 (about 3.5 % of the pairs at window 4096, docs/score-modifiers.md).
inline constexpr std::size_t kKeyTileAlign = 32;
// automatic takes the grouped path from this many keys on, or whenever heads share KV heads (G > 1).
inline constexpr std::size_t kFusedMinKeys = 1024;

// The decode path's limits and split (keys per split). fp32: 512 keys (B = 1, Hkv = 8 at 4096 keys in 64 tasks).
// 16 and 8 bits: 2048 keys, halved while the split's m × keys scores (m = G·Lq stacked query rows) would pass
// 64 K floats (256 KB: m 64 gets 1024, m 128 gets 512). Narrow rows are compute-bound (bf16 nearly), and each
// split costs its own setup, per-row softmax calls, partial result and merge. One Zen 5 core, one sequence of
// 32768 keys, m 4, splits of 512 / 1024 / 2048 keys: int8 4.00 / 3.83 / 3.70 ms; bf16 4.52 → 4.35 ms from 512 to
// 1024 and 4.30 → 4.06 from 1024 to 2048 (two sittings). fp32 rows, at the read bandwidth, gain nothing (one
// sequence 7.99 / 7.75 / 7.94 ms, 16 ragged decodes around 2048 keys 9.63 / 9.73 / 9.67 ms), so they keep the
// parallelism of short splits. Longer splits mean fewer tasks: B·Hkv·⌈L / split⌉ (int8, B 1, Hkv 8, 4096 keys:
// 16), which many cores would not fill on a short single sequence (not measured past 2 threads). The split
// depends on the element type and m only (a sequence's own q and the layer's G): every batch and thread count
// sees the same one.
inline constexpr std::size_t kDecodeMaxQueries = 16;
inline constexpr std::size_t decode_split(DataType kv, std::size_t m) noexcept {
    if (kv == DataType::f32) return 512;
    std::size_t split = 2048;
    while (split > 512 && m * split > 65536) split /= 2;
    return split;
}

enum class CorePath { materialized, grouped, decode };
CorePath core_path(std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk, NeedWeights need_weights, Impl impl) noexcept;

// Carves 64-byte aligned regions (16 floats) out of a running total, overflow-checked
// (mha::invalid_argument if the scratch would not fit in the address space).
struct Carver {
    std::size_t total = 0;
    std::size_t take(std::size_t floats);
};
// Where a call's per-thread slots start (in floats from its base), their size and count, and the call's total.
struct SlotLayout {
    std::size_t slots = 0, slot_floats = 0, threads = 0, total_floats = 0;
    std::size_t bytes() const noexcept { return total_floats * sizeof(float); }
};
// a·b, or mha::invalid_argument if the scratch size overflows.
std::size_t scratch_mul(std::size_t a, std::size_t b);

struct CoreShape {
    std::size_t B = 0, H = 0, Hkv = 0, d = 0, Lq = 0, Lk = 0;
    DataType compute = DataType::f32;  // CoreProblem::compute
    DataType kv = DataType::f32;       // the K / V rows' element type (the decode path's split)
    // K and V come as CoreProblem::key_rows / value_rows that are not fp32 heads (a 16-bit or 8-bit cache, a
    // paged pool): the grouped path widens each block of rows it packs in a per-thread region.
    bool widen_rows = false;
};
// Keys per packing task of the grouped path (a multiple of every ISA's panel width and of 16).
inline constexpr std::size_t kGroupedPackBlock = 256;

// Where the core's scratch lives, in floats: per-call regions from `call`, per-thread regions from `slot`
// (the caller multiplies the slot by the thread count). Sizes cover every ISA this CPU has.
struct CoreLayout {
    std::size_t key_panels = 0, value_panels = 0, value_flags = 0;         // per call
    std::size_t partials = 0, splits = 0, split = 0;                       // decode: per call, splits per head, keys per split
    std::size_t q_stack = 0, scores = 0, accumulator = 0, row_stats = 0;  // per thread
    std::size_t gemm_a = 0, gemm_b = 0;
    simd::GemmScratchSize gemm{};
    std::size_t gemm16 = 0, gemm16_floats = 0;  // per thread, grouped bf16: the bf16 GEMM's A pack buffer
    std::size_t widen_rows = 0;                 // per thread, grouped with CoreShape::widen_rows: K then V rows of a pack block
};
CoreLayout core_layout(const CoreShape& shape, CorePath path, NeedWeights need_weights, Carver& call, Carver& slot);

// The problem, validated. query_shift: query i sits at position i + query_shift (0: top-left, Lk − Lq:
// bottom-right), so with causal it sees keys j <= i + query_shift (with key_lengths: key_lengths[b] − Lq).
struct CoreProblem {
    ConstHeads q, k, v;  // [B, H, Lq, d], [B, Hkv, Lk, d], [B, Hkv, Lk, d]
    Heads out;           // [B, H, Lq, d]
    // Where decode reads K and V rows (kv_rows.hpp: any element format or layout, e.g. a KV cache's rows in
    // place), and the grouped path when they are not fp32 heads (widened block by block as it packs them:
    // CoreShape::widen_rows); base == nullptr: k / v. The materialized path reads k / v (fp32 heads).
    KVRows key_rows, value_rows;
    float scale = 1.0f;
    bool causal = false;
    std::ptrdiff_t query_shift = 0;
    // Sliding window, softcap, sinks, ALiBi (mha/attention.hpp), validated; pointers live for the call.
    ScoreModifiers mods;
    MaskView key_padding_mask, attn_mask;
    // [B] or nullptr: batch b has key_lengths[b] <= Lk keys (rows past it are never read), and causal is then
    // bottom-right per sequence (query i sees keys j <= i + key_lengths[b] − Lq): a KV cache's ragged batch.
    const std::size_t* key_lengths = nullptr;
    NeedWeights need_weights = NeedWeights::none;
    float* attn_weights = nullptr;  // averaged [B, Lq, Lk] or per_head [B, H, Lq, Lk]
    // bf16 compute (AttentionConfig::compute): q, k, v already hold bf16 values; P is rounded to bf16 as the
    // input of P·V (so returned weights are the rounded P), and the GEMMs run on the bf16 kernels when the
    // CPU has them (gemm_operands.hpp).
    DataType compute = DataType::f32;
};

// The per-thread slot of this thread in the arena (tbb's current_thread_index).
float* thread_slot(float* slots, std::size_t slot_floats, std::size_t threads) noexcept;

// Query rows of a grouped task: G heads × rows ≈ kGroupRows stacked rows.
inline std::size_t group_query_rows(std::size_t G, std::size_t Lq) noexcept {
    return std::min(Lq, std::max<std::size_t>(1, kGroupRows / G));
}

class AttentionCore {
public:
    // base: the call's scratch (offsets of `layout` from it); slots: `threads` slots of slot_floats floats.
    AttentionCore(const CoreProblem& problem, CorePath path, const CoreLayout& layout, float* base, float* slots,
                  std::size_t slot_floats, std::size_t threads);
    // Computes out (and attn_weights). Call inside the arena the slots were sized for.
    void run() const;

private:
    CoreProblem p_;
    CorePath path_;
    CoreLayout layout_;
    float* base_;
    float* slots_;
    std::size_t slot_floats_, threads_;
};

// K and V rows the core has read since the process started (each pack of a key/value row, or each row a
// materialized task multiplies): tests check that a grouped call reads every row once per group.
std::uint64_t kv_rows_read() noexcept;

}  // namespace mha::detail
