// One serving step of a MultiheadAttention layer over a paged KV cache (MultiheadAttention::forward_step):
// the T tokens of n sequences, packed [T, E], projected in one pass over the weights (LayerForward's
// projections as one batch of T rows, each row rotated at its own sequence's position), their K / V rows
// written into the blocks the step reserved, the paged core (paged_core.hpp) on the Q and context views,
// then the output projection (LayerForward's, with the post-norm).
// The plan (mha::StepPlan's data) is everything that depends on the step and the layer's configuration only;
// a forward binds it to x, y and one cache's reservation.
// Batch invariance: a row's projections do not depend on the rows beside it (the GEMM's k-order is fixed per
// element; rows are not split across tasks), and the core is per sequence (paged_core.hpp).
// Preconditions: validated by MultiheadAttention::forward_step; r reserved for the plan's step.
#pragma once
#include <cstddef>
#include <vector>

#include "layer_forward.hpp"
#include "paged_core.hpp"
#include "paged_kv_cache_access.hpp"

namespace mha::detail {

// What of a layer's configuration a plan's layout depends on.
struct StepLayerShape {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0, rope_dims = 0;
    DataType compute = DataType::f32;
    static StepLayerShape of(const LayerState& st) noexcept {
        return {st.E, st.H, st.Hkv, st.d, st.rope ? st.rope->dims : 0, st.compute};
    }
    bool operator==(const StepLayerShape& o) const noexcept {
        return E == o.E && H == o.H && Hkv == o.Hkv && d == o.d && rope_dims == o.rope_dims && compute == o.compute;
    }
};

struct StepLayout {
    LayerCall call;                      // packed_call: x and y not bound
    std::vector<std::size_t> positions;  // [T]: each token's position in its sequence
    PagedCoreLayout core;
    ScratchLayout scratch;  // sized for x read in place or gathered (any stride)
};
StepLayout step_layout(const LayerState& st, const StepComposition& step, int threads);

struct StepPlanData {
    StepLayerShape layer;
    StepComposition step;
    StepLayout layout;
};

// Everything but the commit (inside the arena the layout's slots were sized for); call = layout.call bound to x, y.
void run_step(const LayerState& st, const StepLayout& l, const LayerCall& call, float* scratch, const KVRows& keys,
              const KVRows& values, const StepReservation& r);

// The scalar backend (step_reference.cpp): each sequence alone through reference::cached_attention, then the
// new rows written, y filled and the step committed. Any failure comes before a write.
void reference_step(const LayerState& st, const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const StepReservation& r);

}  // namespace mha::detail
