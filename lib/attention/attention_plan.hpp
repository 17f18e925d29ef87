// What one SIMD forward call shares between its steps: shapes, the projected Q/K/V and context buffers
// (heads are column views into them), the mask rows, and the per-thread scratch slots,
// all carved from one caller-provided block (a Workspace or a lease from the scratch cache).
// Preconditions: arguments validated by MultiheadAttention::forward, key/value resolved.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <cstdint>

#include "mha/attention.hpp"
#include "../simd/simd.hpp"
#include "state.hpp"

namespace mha::detail {

// Where a forward's scratch lives, in floats from a 64-byte aligned base (each region 64-byte aligned):
// the per-call buffers, then one slot per thread of the arena (tbb's current_thread_index picks it).
// Sizes depend on the shape, the path and the thread count only. Arithmetic is overflow-checked
// (mha::invalid_argument if the scratch would not fit in the address space).
struct ScratchLayout {
    std::size_t projections = 0, key_values = 0, context = 0, key_panels = 0, value_panels = 0;
    std::size_t slots = 0, slot_floats = 0, threads = 0;
    // within a slot
    std::size_t scores = 0, accumulator = 0, row_stats = 0, gemm_a = 0, gemm_b = 0;
    std::size_t value_flags = 0;  // B·H bytes (per call)
    simd::GemmScratchSize gemm{};
    std::size_t total_floats = 0;
    std::size_t bytes() const noexcept { return total_floats * sizeof(float); }
};

// The fused path is taken for this call (need_weights needs the materialized probabilities).
bool use_fused(const AttentionInputs& in, const ForwardOptions& opt) noexcept;
// key and value are the query itself (one GEMM for Q, K and V). key/value resolved.
bool is_self_attention(const AttentionInputs& in) noexcept;
// The concurrency of the arena a forward with these options runs in.
std::size_t arena_threads(const ForwardOptions& opt);
ScratchLayout scratch_layout(std::size_t E, std::size_t H, std::size_t B, std::size_t Lq, std::size_t Lk, bool self_attention,
                             bool fused, NeedWeights need_weights, std::size_t threads);

struct AttentionPlan {
    std::size_t E, H, head_dim, B, Lq, Lk;
    float scale;  // 1/sqrt(head_dim)
    bool causal;
    NeedWeights need_weights;
    std::size_t query_block;  // query rows per attention task (depends on the path only, not the threads)
    std::size_t row_block;    // token rows per projection task (depends on the shape only)
    bool self_attention;      // query, key and value are the same view: one GEMM for Q, K and V

    Batch Q, K, V;  // [B, Lq|Lk, E] views (row stride 3E for self-attention)
    Batch C;        // context [B, Lq, E]
    // Fused path only: each head's K_hᵀ [d, Lk] and V_h [Lk, d] packed once into GEMM panels, so the
    // per-tile GEMMs read them contiguously (Kᵀ read in place has a row stride of Lk floats, which at
    // Lk = 4096 maps every row to the same L1 set; packed: QKᵀ 108 vs 100 GFLOP/s, P·V 114 vs 104).
    simd::PanelMatrix key_panels(std::size_t b, std::size_t h) const noexcept {
        return {key_panels_ + (b * H + h) * key_head_floats_, head_dim, Lk, key_panel_stride_, panel_isa_};
    }
    simd::PanelMatrix value_panels(std::size_t b, std::size_t h) const noexcept {
        return {value_panels_ + (b * H + h) * value_head_floats_, Lk, head_dim, value_panel_stride_, panel_isa_};
    }
    // Fills the panels from K and V (after project_inputs), parallel over (batch, head, key blocks).
    // Call inside the arena.
    void pack_keys_values() const;

    // scratch: layout.total_floats floats, 64-byte aligned, for layout = scratch_layout(...) of this call.
    AttentionPlan(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs& out,
                  const ForwardOptions& opt, bool fused, const ScratchLayout& layout, float* scratch);

    // This thread's slot: the score block, the fused path's accumulator and row statistics, and the GEMM
    // pack buffers. Call inside the arena, from one task at a time per thread (tasks never nest).
    struct ThreadScratch {
        float* scores;
        float* accumulator;
        float* row_stats;
        simd::GemmScratch gemm;
    };
    ThreadScratch thread_scratch() const noexcept;

    // The key-padding row of batch b ([Lk]) and the attn_mask row of query i for (b, h) ([Lk]), read in
    // place (boolean masks as bytes); absent masks give an empty MaskRow.
    simd::MaskRow key_padding_row(std::size_t b) const noexcept { return key_padding_.from(b * Lk); }
    simd::MaskRow attn_mask_row(std::size_t b, std::size_t h, std::size_t i) const noexcept {
        if (!attn_mask_.present()) return {};
        return attn_mask_.from(((attn_mask_rank_ == 3 ? (b * H + h) * Lq : 0) + i) * Lk);
    }
    bool has_masks() const noexcept { return causal || key_padding_.present() || attn_mask_.present(); }
    // Key j is masked for query i (a boolean entry set, an additive -inf, or causal j > i).
    bool key_masked(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const noexcept;
    // Some value of head h of batch b is NaN or ±inf (computed by check_values when has_masks()).
    bool value_nonfinite(std::size_t b, std::size_t h) const noexcept {
        return value_flags_ != nullptr && value_flags_[b * H + h] != 0;
    }
    // Sets the value flags from V (after project_inputs), parallel over batch × head. Call inside the arena.
    void check_values() const;
    // o[r, :] += Σ_j probs[r, j]·V_h[j0 + j, :] over the keys j0 + j not masked for query i0 + r: the P·V
    // of a head whose values are not all finite (0·NaN must not reach o). Plain loops: a rare path.
    void accumulate_unmasked(std::size_t b, std::size_t h, std::size_t i0, std::size_t j0, ConstMatrix probs,
                             Matrix o) const noexcept;

    // Q, K, V = projections of the inputs (bias fused), parallel over row blocks. Call inside the arena.
    void project_inputs(const MultiheadAttention::State& st, const AttentionInputs& in) const;
    // output = C·Woᵀ + bo, then the optional post-norm, parallel over row blocks. Call inside the arena.
    void project_output(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs& out) const;

private:
    simd::MaskRow key_padding_, attn_mask_;
    int attn_mask_rank_ = 0;
    std::uint8_t* value_flags_ = nullptr;  // [B·H] when has_masks()
    std::optional<float> norm_eps_;
    float* key_panels_ = nullptr;
    float* value_panels_ = nullptr;
    std::size_t key_panel_stride_ = 0, value_panel_stride_ = 0, key_head_floats_ = 0, value_head_floats_ = 0;
    Isa panel_isa_ = Isa::sse2;
    float* slots_ = nullptr;
    ScratchLayout layout_;
};

}  // namespace mha::detail
