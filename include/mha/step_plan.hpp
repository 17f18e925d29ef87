// mha::StepPlan: what one serving step is, computed once and given to every layer of a model (vLLM's
// attention metadata): the sequences, their new token counts q_i and key lengths, each token's position, and
// how the attention core groups and splits the work (paged_kv_cache.hpp's semantics of a step).
// MultiheadAttention::forward_step(x, y, cache, plan) does no other planning: it checks that the plan fits
// (the layer's configuration, the cache's block size and lengths, x and y), takes this cache's blocks for the
// new rows, and runs. forward_step(x, y, cache, seq_ids, q_lens, n) is a plan made and used once.
//
//   mha::StepPlan plan(layers[0], caches[0], ids, q_lens, n);   // once per step
//   for (l = 0; l < L; ++l) layers[l].forward_step(h[l], h[l + 1], caches[l], plan);
#pragma once
#include <cstddef>
#include <memory>

#include "mha/attention.hpp"
#include "mha/paged_kv_cache.hpp"

namespace mha {
namespace detail {
struct StepPlanData;  // lib/attention/step_forward.hpp
}

class StepPlan {
public:
    // The step of sequences seq_ids[i] (i < sequences) taking q_lens[i] new tokens each, as `cache` holds them
    // now, for layers configured as `layer` (embed_dim, num_heads, kv_heads, head_dim, compute type and RoPE
    // dims equal) run with `threads` (0: all cores of the arena the plan is made in; make it where
    // forward_step runs). Usable with every cache of `cache`'s block size, element type, KV heads and head dim
    // that holds each sequence at the length it has in `cache` now: the caches of a model's layers, which take
    // the same steps. Once a cache took the step its sequences are longer, so the plan is refused there
    // (mha::invalid_argument): a plan serves one step. Errors (mha::invalid_argument, nothing changed): an id
    // not in the cache or given twice, q_lens[i] = 0, a step needing more new blocks than `cache` has in all
    // (checked here, before anything is sized by its tokens), a layer that is not self-attention (kdim = vdim =
    // E), the cache's KV heads or head dim not the layer's, threads < 0.
    StepPlan(const MultiheadAttention& layer, const PagedKVCache& cache, const std::size_t* seq_ids,
             const std::size_t* q_lens, std::size_t sequences, int threads = 0);
    ~StepPlan();
    StepPlan(StepPlan&& other) noexcept;
    StepPlan& operator=(StepPlan&& other) noexcept;
    StepPlan(const StepPlan&) = delete;
    StepPlan& operator=(const StepPlan&) = delete;

    std::size_t sequences() const noexcept;
    std::size_t tokens() const noexcept;  // T = Σ q_lens: the rows of forward_step's x and y

private:
    friend class MultiheadAttention;
    std::unique_ptr<detail::StepPlanData> data_;
};

}  // namespace mha
