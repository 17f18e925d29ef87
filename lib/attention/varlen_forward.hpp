// A variable-length batch without a cache (MultiheadAttention::forward_varlen; PyTorch's nested tensors,
// flash-attention's varlen call): n independent sequences packed [T, E], sequence i at rows
// [starts[i], starts[i + 1]). All T rows are projected in one pass over the weights (LayerForward's projections
// as one batch of T rows, RoPE at each token's position in its own sequence), then each sequence runs the
// attention core alone over its own projected K / V rows, read in place in the projection buffer, one
// sequence after another (each on every core), then the output projection.
// Batch invariance: a row's projections do not depend on the rows beside it, and a sequence's core call is
// the one forward makes for that sequence alone (B = 1, Lq = Lk = its length: the same path and splits).
// Preconditions: validated by MultiheadAttention::forward_varlen (starts nondecreasing, starts[n] = T > 0).
#pragma once
#include <cstddef>
#include <vector>

#include "layer_forward.hpp"

namespace mha::detail {

struct VarlenLayout {
    LayerCall call;                      // packed_call bound to x, y
    std::vector<std::size_t> positions;  // [T]: each token's position in its sequence
    std::vector<CorePath> paths;         // [n]: each sequence's core path (for B = 1, Lq = Lk = its length)
    std::vector<CoreLayout> cores;       // [n]: their scratch (regions shared: the sequences run one by one)
    ScratchLayout scratch;
};
VarlenLayout varlen_layout(const LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* starts,
                           std::size_t n, int threads);

// The whole forward (inside the arena the layout's slots were sized for).
void run_varlen(const LayerState& st, const VarlenLayout& l, float* scratch, const std::size_t* starts, std::size_t n,
                bool causal);

}  // namespace mha::detail
