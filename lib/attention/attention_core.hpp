// The SIMD attention core on projected heads, shared by MultiheadAttention (its Q, K, V and context are
// strided head views into the projection buffers) and mha::scaled_dot_product_attention:
//   out_h = softmax(scale·q_h·k_{h/G}ᵀ + masks)·v_{h/G}  for query heads h < H, G = H / Hkv.
// Two paths, both parallel over tasks whose sizes depend on the shape only (bitwise equal results for any
// thread count):
//   grouped (fused): per (batch, KV head, query block) the G query heads' rows are stacked into one
//     [G·rows, d] block and run against one pass over that KV head's keys, K_hᵀ and V_h packed into GEMM
//     panels once per call (reads each K and V row once per group), key tiles with the online softmax;
//   decode (few queries: Lq <= 16 and G·Lq <= 128): per (batch, KV head, split of 512 keys) the G·Lq stacked
//     rows against the split's keys read in place by the decode kernels (simd::decode_scores, then the split's
//     softmax, then simd::decode_accumulate: every cached row read once per group, no copy of the cache);
//     the splits' (max, sum, output) are merged exactly by rescaling (flash-decoding). Splits depend on the
//     shape only;
//   materialized: per (batch, query head, 64 query rows) the scores [rows, Lk] and a plain softmax; the
//     only path that can return the probabilities (need_weights). It reads K and V once per (query head,
//     64-row query block).
// Preconditions: arguments validated by the public entry point; scratch laid out by core_layout.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mha/attention.hpp"
#include "mha/sdpa.hpp"
#include "../simd/gemm_bf16.hpp"
#include "../simd/simd.hpp"

namespace mha::detail {

// Rows of the materialized path's tasks: 64 rows × Lk scores stay in L2.
inline constexpr std::size_t kQueryBlock = 64;
// Stacked query rows (G heads × rows) of a grouped task. 128 halves how often each packed key/value tile
// is streamed from L2 per query row, against 64 (measured for the MHA-only fused path, issue 9).
inline constexpr std::size_t kGroupRows = 128;
// Keys per tile of the grouped path (128 reruns the short-K microkernel epilogue and the per-row softmax
// bookkeeping twice as often; 512 gains nothing and doubles the score tile).
inline constexpr std::size_t kKeyTile = 256;
// automatic takes the grouped path from this many keys on, or whenever heads share KV heads (G > 1).
inline constexpr std::size_t kFusedMinKeys = 1024;

// The decode path's limits and split: a split of 512 keys keeps B = 1, Hkv = 8 at 4096 keys in 64 tasks.
inline constexpr std::size_t kDecodeMaxQueries = 16;
inline constexpr std::size_t kDecodeSplit = 512;

enum class CorePath { materialized, grouped, decode };
CorePath core_path(std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk, NeedWeights need_weights, Impl impl) noexcept;

// Carves 64-byte aligned regions (16 floats) out of a running total, overflow-checked
// (mha::invalid_argument if the scratch would not fit in the address space).
struct Carver {
    std::size_t total = 0;
    std::size_t take(std::size_t floats);
};
// a·b, or mha::invalid_argument if the scratch size overflows.
std::size_t scratch_mul(std::size_t a, std::size_t b);

struct CoreShape {
    std::size_t B = 0, H = 0, Hkv = 0, d = 0, Lq = 0, Lk = 0;
    bool bf16 = false;  // CoreProblem::bf16
};

// Where the core's scratch lives, in floats: per-call regions from `call`, per-thread regions from `slot`
// (the caller multiplies the slot by the thread count). Sizes cover every ISA this CPU has.
struct CoreLayout {
    std::size_t key_panels = 0, value_panels = 0, value_flags = 0;         // per call
    std::size_t partials = 0, splits = 0;                                  // decode: per call, and splits per head
    std::size_t q_stack = 0, scores = 0, accumulator = 0, row_stats = 0;  // per thread
    std::size_t gemm_a = 0, gemm_b = 0;
    simd::GemmScratchSize gemm{};
    std::size_t gemm16 = 0, gemm16_floats = 0;  // per thread, grouped bf16: the bf16 GEMM's A pack buffer
};
CoreLayout core_layout(const CoreShape& shape, CorePath path, NeedWeights need_weights, Carver& call, Carver& slot);

// The problem, validated. causal_shift: query i sees keys j <= i + causal_shift (0: top-left,
// Lk − Lq: bottom-right).
struct CoreProblem {
    ConstHeads q, k, v;  // [B, H, Lq, d], [B, Hkv, Lk, d], [B, Hkv, Lk, d]
    Heads out;           // [B, H, Lq, d]
    // K and V in a KV cache's 16-bit element type (bf16 / f16), decode path only: k_elements / v_elements hold
    // them at the element offsets of k / v, whose data pointers are then null. f32: k / v hold the floats.
    DataType kv_type = DataType::f32;
    const void* k_elements = nullptr;
    const void* v_elements = nullptr;
    float scale = 1.0f;
    bool causal = false;
    std::ptrdiff_t causal_shift = 0;
    MaskView key_padding_mask, attn_mask;
    // [B] or nullptr: batch b has key_lengths[b] <= Lk keys (rows past it are never read), and causal is then
    // bottom-right per sequence (query i sees keys j <= i + key_lengths[b] − Lq): a KV cache's ragged batch.
    const std::size_t* key_lengths = nullptr;
    NeedWeights need_weights = NeedWeights::none;
    float* attn_weights = nullptr;  // averaged [B, Lq, Lk] or per_head [B, H, Lq, Lk]
    // bf16 compute (AttentionConfig::compute): q, k, v already hold bf16 values; P is rounded to bf16 as the
    // input of P·V (so returned weights are the rounded P), and the grouped path runs its GEMMs on the bf16
    // kernels when the CPU has them.
    bool bf16 = false;
};

// The per-thread slot of this thread in the arena (tbb's current_thread_index).
float* thread_slot(float* slots, std::size_t slot_floats, std::size_t threads) noexcept;

class AttentionCore {
public:
    // base: the call's scratch (offsets of `layout` from it); slots: `threads` slots of slot_floats floats.
    AttentionCore(const CoreProblem& problem, CorePath path, const CoreLayout& layout, float* base, float* slots,
                  std::size_t slot_floats, std::size_t threads);
    // Computes out (and attn_weights). Call inside the arena the slots were sized for.
    void run() const;

private:
    struct Slot;
    Slot slot() const noexcept;
    void pack_keys_values() const;  // grouped: panels and value flags
    void check_values() const;      // materialized: value flags
    void grouped_task(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows) const;
    void decode_task(std::size_t b, std::size_t kvh, std::size_t split) const;
    void decode_merge(std::size_t b, std::size_t kvh) const;
    // Copies the G heads' query rows [i0, i0 + rows) of KV head kvh into q (row t·rows + r).
    void stack_queries(std::size_t b, std::size_t kvh, std::size_t i0, std::size_t rows, Matrix q) const noexcept;
    void attend_block(std::size_t b, std::size_t h, std::size_t i0, std::size_t rows, Matrix scores,
                      const simd::GemmScratch& gemm) const;
    // Keys of batch b (key_lengths[b], or Lk).
    std::size_t keys_of(std::size_t b) const noexcept { return p_.key_lengths != nullptr ? p_.key_lengths[b] : Lk_; }
    // Keys visible to query i of batch b by the causal rule (all of batch b's keys without it).
    std::size_t visible_keys(std::size_t b, std::size_t i) const noexcept;
    simd::MaskRow key_padding_row(std::size_t b) const noexcept { return key_padding_.from(b * Lk_); }
    simd::MaskRow attn_mask_row(std::size_t b, std::size_t h, std::size_t i) const noexcept {
        if (!attn_mask_.present()) return {};
        return attn_mask_.from(((attn_mask_rank_ == 3 ? (b * H_ + h) * Lq_ : 0) + i) * Lk_);
    }
    bool key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept;
    bool value_nonfinite(std::size_t b, std::size_t kvh) const noexcept {
        return value_flags_ != nullptr && __atomic_load_n(&value_flags_[b * Hkv_ + kvh], __ATOMIC_RELAXED) != 0;
    }
    // The split's scores and P·V (decode_task) on K and V rows of element type E read in place.
    template <class E>
    void decode_split(std::size_t b, std::size_t kvh, std::size_t j0, std::size_t n, ConstMatrix q, Matrix st, Matrix o,
                      float* row_max, float* row_sum) const;
    // Rows [j0, j0 + n) of KV head kvh of batch b in element type E (E = float: p_.k / p_.v).
    template <class E>
    MatrixView<const E> kv_rows(bool values, std::size_t b, std::size_t kvh, std::size_t j0, std::size_t n) const noexcept;
    // Value (j, c) of KV head kvh, widened to float.
    float value_at(std::size_t b, std::size_t kvh, std::size_t j, std::size_t c) const noexcept;
    // o[r, :] += Σ_j probs[r, j]·v[j0 + j, :] over the keys not masked for query i0 + r of head h: the P·V of
    // a KV head whose values are not all finite (0·NaN must not reach o). Plain loops: a rare path.
    void accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                             Matrix o) const noexcept;
    simd::PanelMatrix key_panels(std::size_t b, std::size_t kvh) const noexcept;
    simd::PanelMatrix value_panels(std::size_t b, std::size_t kvh) const noexcept;

    CoreProblem p_;
    CorePath path_;
    std::size_t B_, H_, Hkv_, G_, d_, Lq_, Lk_;
    simd::MaskRow key_padding_, attn_mask_;
    int attn_mask_rank_ = 0;
    std::uint8_t* value_flags_ = nullptr;  // [B·Hkv] when masks are present
    float* key_panels_ = nullptr;
    float* value_panels_ = nullptr;
    bool panels16_ = false;  // grouped bf16 on the bf16 kernels: the panel regions hold Bf16Panels
    simd::Bf16Panels key_panels16(std::size_t b, std::size_t kvh) const noexcept;
    simd::Bf16Panels value_panels16(std::size_t b, std::size_t kvh) const noexcept;
    float* partials_ = nullptr;  // decode: per (b, kvh, split) M row maxima, M sums, M×d outputs
    std::size_t key_panel_stride_ = 0, value_panel_stride_ = 0, key_head_floats_ = 0, value_head_floats_ = 0;
    Isa panel_isa_ = Isa::sse2;
    CoreLayout layout_;
    float* slots_;
    std::size_t slot_floats_, threads_;
};

// K and V rows the core has read since the process started (each pack of a key/value row, or each row a
// materialized task multiplies): tests check that a grouped call reads every row once per group.
std::uint64_t kv_rows_read() noexcept;

}  // namespace mha::detail
