// What one SIMD forward call shares between its steps: shapes, the projected Q/K/V and context buffers
// (heads are column views into them), the masks as additive rows, and the per-thread scratch.
// Preconditions: arguments validated by MultiheadAttention::forward, key/value resolved.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "mha/attention.hpp"
#include "../simd/simd.hpp"
#include "state.hpp"

namespace mha::detail {

// A 64-byte aligned float array, left uninitialized (every element is written before it is read).
class AlignedArray {
public:
    AlignedArray() = default;
    explicit AlignedArray(std::size_t n);
    float* data() const noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }

private:
    struct Free {
        void operator()(float* p) const noexcept;
    };
    std::unique_ptr<float, Free> data_;
    std::size_t size_ = 0;
};

// Per-thread scratch reused across tasks and calls: no allocation per task, none per call after the
// first call of a shape. get(n, slot) returns at least n floats, valid until the same thread asks for
// the same slot again. Grows, never shrinks (memory stays with the thread, as with any thread cache).
// Slots 0..2 belong to one attention task (which never waits on other tasks); slots 3..5 hold the
// buffers of one forward call on the calling thread, whose wait is isolated so that thread cannot
// start another forward meanwhile.
struct Scratch {
    enum Slot { scores = 0, accumulator = 1, row_stats = 2, projections = 3, key_values = 4, context = 5, key_panels = 6,
               value_panels = 7, count = 8 };
    static float* get(std::size_t n, Slot slot);
};

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

    AttentionPlan(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs& out,
                  const ForwardOptions& opt, bool fused);

    // The additive key-padding row of batch b ([Lk]), or nullptr.
    const float* key_padding_row(std::size_t b) const noexcept { return key_padding_ ? key_padding_ + b * Lk : nullptr; }
    // The additive attn_mask row of query i for (b, h) ([Lk]), or nullptr.
    const float* attn_mask_row(std::size_t b, std::size_t h, std::size_t i) const noexcept {
        if (!attn_mask_) return nullptr;
        return attn_mask_ + ((attn_mask_rank_ == 3 ? (b * H + h) * Lq : 0) + i) * Lk;
    }

    // Q, K, V = projections of the inputs (bias fused), parallel over row blocks. Call inside the arena.
    void project_inputs(const MultiheadAttention::State& st, const AttentionInputs& in) const;
    // output = C·Woᵀ + bo, then the optional post-norm, parallel over row blocks. Call inside the arena.
    void project_output(const MultiheadAttention::State& st, const AttentionInputs& in, const AttentionOutputs& out) const;

private:
    std::vector<float> key_padding_store_, attn_mask_store_;  // bool masks converted to 0 / -inf
    const float* key_padding_ = nullptr;
    const float* attn_mask_ = nullptr;
    int attn_mask_rank_ = 0;
    std::optional<float> norm_eps_;
    float* key_panels_ = nullptr;
    float* value_panels_ = nullptr;
    std::size_t key_panel_stride_ = 0, value_panel_stride_ = 0, key_head_floats_ = 0, value_head_floats_ = 0;
    Isa panel_isa_ = Isa::sse2;
};

}  // namespace mha::detail
