// One validation module for the public entry points of lib/attention: MultiheadAttention::forward (fp32,
// 16-bit, with and without a KV cache), forward_step, forward_varlen, StepPlan, workspace_bytes, path, and
// scaled_dot_product_attention, sdpa_workspace_bytes, sdpa_path. Each check throws mha::invalid_argument
// naming the argument and its values (the messages are part of the tests); nothing is written before they
// pass.
// A validated call comes back as one resolved description (LayerCall, SdpaCall): the shapes, whether it is
// self-attention (key and value resolved: the legacy null key is resolved here and nowhere else), the
// options as the backends read them, and the path the SIMD core takes.
#pragma once
#include <cstddef>
#include <optional>

#include "../core/validate.hpp"
#include "mha/attention.hpp"
#include "mha/kv_cache.hpp"
#include "mha/paged_kv_cache.hpp"
#include "mha/sdpa.hpp"
#include "mha/workspace.hpp"
#include "attention_core.hpp"

namespace mha::detail {

struct LayerState;  // state.hpp

// The legacy shorthand resolved: key.data == nullptr is key = query, value.data == nullptr is value = key.
// For AttentionInputs and HalfAttentionInputs; the only place that reads a null key as self-attention.
template <class Inputs>
Inputs resolve_key_value(Inputs in) noexcept {
    if (in.key.data == nullptr) in.key = in.query;
    if (in.value.data == nullptr) in.value = in.key;
    return in;
}

// key and value are the query's own views (self-attention: one GEMM for Q, K and V).
template <class T>
bool same_view(const BatchView<T>& a, const BatchView<T>& b) noexcept {
    return a.data == b.data && a.batch == b.batch && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride &&
           a.batch_stride == b.batch_stride;
}

// One MultiheadAttention call, resolved.
struct LayerCall {
    AttentionInputs in;   // key and value resolved (with a cache: the query, the new tokens)
    AttentionOutputs out;
    // As the backends read them: with a cache causal bottom-right; norm_eps the call's (deprecated) or the
    // layer's (AttentionConfig::norm_eps).
    ForwardOptions opt;
    const KVCache* cache = nullptr;
    std::size_t B = 0, Lq = 0, Lk = 0;  // Lk: key rows of the call (with a cache: Lq)
    std::size_t core_keys = 0;          // keys the attention core spans: Lk, or with a cache the longest after the append
    bool self_attention = false;        // key and value are the query
    DataType compute = DataType::f32;   // AttentionConfig::compute
    // scalar also when B, Lq or Lk is 0 (no rows, or rows that attend to no key: nothing for the SIMD core)
    AttentionPath path = AttentionPath::scalar;
    CorePath core_path = CorePath::materialized;  // the SIMD core's path (path unless scalar), chosen here only
    std::size_t weight_count = 0;       // floats of out.attn_weights (forward)
};

// Shapes and options only (workspace_bytes, path): the sizes of in and whether key/value are the query.
LayerCall describe_layer_call(const LayerState& st, const AttentionInputs& in, const ForwardOptions& opt, const KVCache* cache);
// Everything a forward reads and writes: views, extents, shapes, overlaps, masks, positions, weights, the
// workspace, the cache; for the scalar backend the sizes of its buffers.
LayerCall validate_layer_call(const LayerState& st, const AttentionInputs& in, const AttentionOutputs& out,
                              const ForwardOptions& opt, const Workspace* workspace, const KVCache* cache);
// The 16-bit forward's views before they are widened (the fp32 forward validates the rest): the type, the
// views and their overlaps. Returns the inputs with key and value resolved.
HalfAttentionInputs validate_half_call(const HalfAttentionInputs& in, const HalfAttentionOutputs& out);

// AttentionConfig::norm_eps and the deprecated ForwardOptions::norm_eps: finite and >= 0.
void check_norm_eps(const std::optional<float>& eps);
// ScoreModifiers for H query heads: window sides >= −1, softcap finite and >= 0, sinks and slopes finite
// ([H], readable). `owner` names the argument in messages ("modifiers" / "options.modifiers").
void check_modifiers(const ScoreModifiers& m, std::size_t H, const char* owner);

// The packed entry points (forward_step, StepPlan, forward_varlen): checks of the layer, the cache, x and y.
struct StepPlanData;     // step_forward.hpp
struct StepReservation;  // paged_kv_cache_access.hpp
// StepPlan's construction (before the step is composed): a self-attention layer, the cache's KV heads and head
// dim, threads >= 0.
void validate_step_plan(const LayerState& st, const PagedKVCache& cache, int threads);
// forward_step given a plan: the backend, a plan made for this layer's configuration, the cache's heads, x and
// y [plan's T, E]; then the cache's blocks reserved for the step (the cache holds the plan's sequences at their
// lengths, the pool has the blocks: PagedKVCacheAccess::reserve_step) and released blocks before every new
// query's window. Changes nothing.
StepReservation validate_step_call(const LayerState& st, const StepPlanData& plan, const ConstMatrix& x, const Matrix& y,
                                   const PagedKVCache& cache, Backend backend);
// forward_varlen: a self-attention layer, threads, the backend, seq_starts (0 first, non-decreasing), x and y
// [T, E]. Returns T = seq_starts[sequences].
std::size_t validate_varlen_call(const LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* seq_starts,
                                 std::size_t sequences, int threads, Backend backend);

// One scaled_dot_product_attention call, resolved.
struct SdpaCall {
    std::size_t B = 0, H = 0, Hkv = 0, Lq = 0, Lk = 0, d = 0;
    float scale = 1.0f;  // options.scale or 1/√d (validate_sdpa_call)
    AttentionPath path = AttentionPath::scalar;  // scalar also when B, Lq or Lk is 0
    CorePath core_path = CorePath::materialized;  // the SIMD core's path, chosen here only
};
SdpaCall describe_sdpa_call(const SdpaInputs& in, const SdpaOptions& opt);
SdpaCall validate_sdpa_call(const SdpaInputs& in, const Heads& out, const SdpaOptions& opt, const Workspace* workspace);

}  // namespace mha::detail
