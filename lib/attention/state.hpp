// What a MultiheadAttention object owns: a copy of the weights (absent biases as zeros) and the
// projection weights packed once for the SIMD GEMM.
#pragma once
#include <vector>

#include "../simd/simd.hpp"
#include "mha/attention.hpp"

namespace mha {

struct MultiheadAttention::State {
    std::size_t E = 0, H = 0;
    std::vector<float> in_w, in_b, out_w, out_b, norm_w, norm_b;  // norm_*: empty when not given
    // Wᵀ of each projection, packed once: y = x·Wᵀ + b is one gemm_packed call. Self-attention uses wqkv
    // (one GEMM for Q, K and V); cross-attention uses wq, wk, wv (this costs a second copy of in_proj).
    simd::PackedMatrix wqkv, wq, wk, wv, wo;

    // Pointers into the copies above (norm ones null when not given).
    AttentionWeights weights() const {
        return {in_w.data(), in_b.data(), out_w.data(), out_b.data(), norm_w.empty() ? nullptr : norm_w.data(),
                norm_b.empty() ? nullptr : norm_b.data()};
    }
};

// The SIMD backend (lib/attention/simd_attention.cpp). Inputs validated, key/value resolved.
void simd_multihead_attention(const MultiheadAttention::State& s, const AttentionInputs& in,
                              const AttentionOutputs& out, const ForwardOptions& opt);

}  // namespace mha
