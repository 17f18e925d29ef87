// One serving step of a MultiheadAttention layer over a paged KV cache (MultiheadAttention::forward_step):
// the T tokens of n sequences, packed [T, E], projected in one pass over the weights (LayerForward's
// projections as one batch of T rows, each row rotated at its own sequence's position), their K / V rows
// written into the blocks the step reserved, the paged core (paged_core.hpp) on the Q and context views,
// then the output projection (LayerForward's, with the post-norm).
// Batch invariance: a row's projections do not depend on the rows beside it (the GEMM's k-order is fixed per
// element; rows are not split across tasks), and the core is per sequence (paged_core.hpp).
// Preconditions: validated by MultiheadAttention::forward_step; r = PagedKVCacheAccess::plan_step's.
#pragma once
#include <cstddef>
#include <vector>

#include "layer_forward.hpp"
#include "paged_core.hpp"
#include "paged_kv_cache_access.hpp"

namespace mha::detail {

struct StepLayout {
    LayerCall call;                      // B = 1, Lq = Lk = T, self-attention, no cache
    std::vector<std::size_t> positions;  // [T]: each token's position in its sequence
    PagedCoreLayout core;
    ScratchLayout scratch;
};
StepLayout step_layout(const LayerState& st, const ConstMatrix& x, const Matrix& y, const StepReservation& r, int threads);

// Everything but the commit (inside the arena the layout's slots were sized for).
void run_step(const LayerState& st, const StepLayout& l, float* scratch, const KVRows& keys, const KVRows& values,
              const StepReservation& r);

}  // namespace mha::detail
