// TEMPORARY: the SIMD attention backend runs the reference until the SIMD path lands.
#include "../reference/reference.hpp"
#include "state.hpp"

namespace mha {
void simd_multihead_attention(const MultiheadAttention::State& s, const AttentionInputs& in,
                              const AttentionOutputs& out, const ForwardOptions& opt) {
    reference::multihead_attention(s.weights(), s.E, s.H, in, out, opt);
}
}  // namespace mha
