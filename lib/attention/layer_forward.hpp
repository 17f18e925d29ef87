// LayerForward: the executor of one SIMD MultiheadAttention forward. What it shares between its steps: shapes, the projected Q/K/V and context
// buffers (heads are strided views into them, handed to the attention core), and the per-thread scratch
// slots, all carved from one caller-provided block (a Workspace or a lease from the scratch cache).
// Preconditions: arguments validated by MultiheadAttention::forward, key/value resolved.
#pragma once
#include <cstddef>
#include <optional>

#include "mha/attention.hpp"
#include "mha/kv_cache.hpp"
#include "../simd/simd.hpp"
#include "attention_core.hpp"
#include "gemm_operands.hpp"
#include "kv_rows.hpp"
#include "validate_call.hpp"
#include "state.hpp"

namespace mha::detail {

// Where a forward's scratch lives, in floats from a 64-byte aligned base: the projections, the context and
// the core's per-call regions, then one slot per thread of the arena (tbb's current_thread_index picks it).
// Sizes depend on the shape, the path and the thread count only.
struct ScratchLayout : SlotLayout {
    std::size_t projections = 0, key_values = 0, context = 0;
    std::size_t tokens = 0;       // few-token path: the query rows gathered into [B·Lq, E] (0: read in place)
    // few-token path, bf16 compute: the GEMM's A (the tokens, then the context) packed into bf16 pairs once for all
    // column tasks (simd::pack_a_bf16); 0: none.
    std::size_t tokens16 = 0;
    std::size_t key_lengths = 0;  // with a cache: B size_t, each sequence's keys after the append
    std::size_t cache_keys = 0;   // with a cache: the core's Lk (the longest sequence after the append)
    // With a cache whose rows are not fp32 heads on the materialized path: the cached K and V widened to fp32,
    // [B, Hkv, cache_keys, d] each (decode reads the rows in place, grouped widens them as it packs).
    std::size_t widened_keys = 0, widened_values = 0;
    bool widen_cache = false;
    CoreLayout core;
    std::size_t rope_table = 0;  // within a slot: cos and sin of one projection row block
    std::size_t linear16 = 0;    // within a slot, bf16 compute: the bf16 GEMM's A pack buffer, or a rounded copy of A
};

// The concurrency of the arena a forward with `threads` (0: the caller's arena) runs in.
std::size_t arena_threads(int threads);
// The per-thread slots after the call's regions: `slot` sized one slot, `call` the regions so far.
SlotLayout place_slots(Carver& call, const Carver& slot, int threads);
// Self-attention over at most kFewTokens tokens in all (B·Lq, decode steps and short chunks) projects with
// the weights' columns split across tasks, so each weight streams from memory once for the whole batch and
// every core has work; more tokens split the rows.
inline constexpr std::size_t kFewTokens = 64;
bool few_tokens(const LayerCall& call) noexcept;
// The scratch of a validated call (its shapes, self-attention, cache, and core path).
// core_regions: null for the call's own core (call.core_path); else it carves another core's regions and
// per-thread regions (a paged step's core, paged_core.hpp) where the core's would go.
using CoreCarving = void (*)(void* context, Carver& call, Carver& slot);
ScratchLayout scratch_layout(const detail::LayerState& st, const LayerCall& call, CoreCarving core_regions = nullptr,
                             void* context = nullptr);

// A self-attention call of T packed tokens as one batch (B = 1, Lq = Lk = T, no cache) whose core is the
// caller's own (a paged step's, a varlen batch's per-sequence calls): x and y unbound, with a stride past E so
// that scratch_layout reserves the gathering region any stride of x needs. bind_packed points it at x, y.
LayerCall packed_call(const LayerState& st, std::size_t T, int threads);
void bind_packed(LayerCall& call, const ConstMatrix& x, const Matrix& y);

class LayerForward {
public:
    // scratch: layout.total_floats floats, 64-byte aligned, layout = scratch_layout(st, call); cache: call's, mutable.
    // row_positions (self-attention, B = 1, no cache): the rotary position of each query row (a paged step's
    // tokens, each at its own sequence's position) instead of start_position(0) + i.
    LayerForward(const detail::LayerState& st, const LayerCall& call, const ScratchLayout& layout, float* scratch, KVCache* cache,
                 const std::size_t* row_positions = nullptr);
    // The whole forward. Call inside the arena.
    void run() const;

    // The steps a paged step (step_forward.cpp) runs around its own core:
    // Q, K, V = projections of the inputs (bias fused, then RoPE on the block's rows), parallel over row blocks.
    void project_inputs() const;
    // output = C·Woᵀ + bo, then the optional post-norm, parallel over row blocks (few tokens: over columns).
    void project_output() const;
    // The projections [B, Lq, H·d | Hkv·d] and the context [B, Lq, H·d] (the core's input and output).
    const Batch& queries() const noexcept { return Q_; }
    const Batch& keys() const noexcept { return K_; }
    const Batch& values() const noexcept { return V_; }
    const Batch& context() const noexcept { return C_; }

private:
    // The few-token path of project_inputs: columns of the packed weights split across tasks.
    void project_few_tokens() const;
    // Appends the new tokens' K and V rows to the cache (after RoPE), rounded to its element type.
    void append_to_cache() const;
    // With layout_.widen_cache: each sequence's first key_lengths[b] cached K and V rows as fp32 in scratch
    // ([B, Hkv, cache_keys, d] each).
    void widen_cache(const std::size_t* key_lengths) const;
    // y = x·Wᵀ + bias over columns [c0, c0 + nc) of weight `w` (kQ, kK, kV: a projection, kQkv: all three,
    // kOut: the output projection); at most kRowBlock rows. bf16 compute: on the bf16 kernels, or x rounded
    // into the slot and the fp32 GEMM on the rounded weights.
    enum Weight { kQ = 0, kK = 1, kV = 2, kQkv = 3, kOut = 4 };
    void linear(ConstMatrix x, Weight w, std::size_t c0, std::size_t nc, const float* bias, Matrix y) const;
    // The few-token path's A for linear_packed: x packed once into layout_.tokens16 on the bf16 kernels (true),
    // else nothing (false: the tasks call linear on x).
    bool pack_tokens(ConstMatrix x) const;
    // linear() on columns [c0, c0 + nc) of w with A as pack_tokens packed x ([rows, k]).
    void linear_packed(std::size_t rows, std::size_t k, Weight w, std::size_t c0, std::size_t nc, const float* bias, Matrix y) const;
    // Wq, Wk, Wv side by side form one B operand (their segments are whole panels).
    bool qkv_contiguous() const noexcept;
    // bf16 compute: Q, K, V (after RoPE) rounded in place.
    void round_projection(Matrix x) const noexcept;
    // RoPE on the rows of `x` (columns: heads × d) at positions p0, p0 + 1, ...
    void rotate(Matrix x, std::size_t heads, std::size_t p0, float* table) const;
    // rotate() for query rows [r0, r0 + x.rows) of batch b of a self-attention call: at start_position(b) + r0 + i,
    // or at row_positions_ (runs of consecutive positions rotated together).
    void rotate_query_rows(Matrix x, std::size_t heads, std::size_t b, std::size_t r0, float* table) const;
    std::size_t start_position(std::size_t b) const noexcept {
        if (cache_ != nullptr) return cache_->lengths()[b];
        return opt_.positions != nullptr ? opt_.positions[b] : opt_.position_offset;
    }
    // Query row i is at start_position(b) + query_shift_ + i (validated >= 0): bottom-right alignment puts the
    // queries at the end of the key sequence.
    std::size_t query_start(std::size_t b) const noexcept { return start_position(b) + query_shift_; }

    const detail::LayerState& st_;
    const LayerCall& call_;
    const AttentionInputs& in_;
    const AttentionOutputs& out_;
    const ForwardOptions& opt_;
    ScratchLayout layout_;
    std::size_t B_, Lq_, Lk_;
    bool self_attention_;
    std::size_t query_shift_;  // Lk − Lq with bottom-right alignment (wraps when negative; start + shift >= 0)
    Batch Q_, K_, V_;  // [B, L, H·d | Hkv·d] views
    Batch C_;          // context [B, Lq, H·d]
    float* scratch_;
    KVCache* cache_;
    bool few_tokens_;
    GemmOperands operands_;  // of the projections (bf16 kernels: the weights' bf16 panels, and the CPU allows them)
    KVRows cache_keys_, cache_values_;  // with a cache: where its rows live (kv_rows.hpp)
    const std::size_t* row_positions_;
};

}  // namespace mha::detail
