// What a MultiheadAttention object owns: the projection weights packed once for the SIMD GEMM (one copy:
// in_proj [3E, E] packed as three segments Wq, Wk, Wv, each usable alone) and the biases and norm
// parameters (absent biases as zeros). The scalar backend unpacks a plain copy per call (State::unpacked).
#pragma once
#include <vector>

#include "../reference/reference.hpp"
#include "../simd/simd.hpp"
#include "mha/attention.hpp"

namespace mha {

struct MultiheadAttention::State {
    std::size_t E = 0, H = 0;
    std::vector<float> in_b, out_b, norm_w, norm_b;  // norm_*: empty when not given
    // Wᵀ of each projection: y = x·Wᵀ + b is one gemm_packed call. Self-attention multiplies by all of
    // in_proj (one GEMM for Q, K and V), cross-attention by its segments.
    simd::PackedMatrix in_proj, out_proj;

    // Plain row-major weights for the scalar reference, unpacked from the packed copies (exact).
    struct Unpacked {
        std::vector<float> in_w, out_w;
        reference::Layer layer(const State& s) const {
            reference::Layer l;
            l.E = l.kdim = l.vdim = s.E;
            l.H = l.Hkv = s.H;
            l.d = s.E / s.H;
            l.wq = in_w.data(), l.wk = in_w.data() + s.E * s.E, l.wv = in_w.data() + 2 * s.E * s.E, l.wo = out_w.data();
            l.bq = s.in_b.data(), l.bk = s.in_b.data() + s.E, l.bv = s.in_b.data() + 2 * s.E, l.bo = s.out_b.data();
            l.norm_w = s.norm_w.empty() ? nullptr : s.norm_w.data();
            l.norm_b = s.norm_b.empty() ? nullptr : s.norm_b.data();
            return l;
        }
    };
    Unpacked unpacked() const {
        Unpacked u{std::vector<float>(3 * E * E), std::vector<float>(E * E)};
        in_proj.unpack(Matrix(u.in_w.data(), 3 * E, E), Trans::yes);
        out_proj.unpack(Matrix(u.out_w.data(), E, E), Trans::yes);
        return u;
    }
    std::size_t bytes() const noexcept {
        return in_proj.bytes() + out_proj.bytes() +
               (in_b.size() + out_b.size() + norm_w.size() + norm_b.size()) * sizeof(float);
    }
};

// The SIMD backend (lib/attention/simd_attention.cpp). Inputs validated, key/value resolved.
// workspace: the caller's, or nullptr (a lease from the scratch cache).
void simd_multihead_attention(const MultiheadAttention::State& s, const AttentionInputs& in,
                              const AttentionOutputs& out, const ForwardOptions& opt, Workspace* workspace);
// The bytes of workspace simd_multihead_attention needs for this call.
std::size_t simd_workspace_bytes(const MultiheadAttention::State& s, const AttentionInputs& in, const ForwardOptions& opt);

}  // namespace mha
