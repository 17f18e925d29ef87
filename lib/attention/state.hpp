// What a MultiheadAttention object owns: its resolved configuration, the projection weights packed once
// for the SIMD GEMM (one copy: with kdim == vdim == E, Wq, Wk, Wv are packed as three segments of one
// matrix so self-attention runs one GEMM for Q, K and V and cross-attention uses the segments; otherwise
// three matrices), the biases and norm parameters (absent biases as zeros), and RoPE's frequencies.
// The scalar backend unpacks a plain copy per call (LayerState::unpacked).
// MultiheadAttention holds one through a pointer (mha/attention.hpp declares detail::LayerState).
#pragma once
#include <optional>
#include <vector>

#include "../reference/reference.hpp"
#include "../simd/gemm_bf16.hpp"
#include "../simd/simd.hpp"
#include "mha/attention.hpp"
#include "validate_call.hpp"

namespace mha {

namespace detail {

struct LayerState {
    std::size_t E = 0, H = 0, Hkv = 0, d = 0, kdim = 0, vdim = 0;
    DataType compute = DataType::f32;  // AttentionConfig::compute
    std::optional<float> norm_eps;    // AttentionConfig::norm_eps (validated)
    std::optional<RopeConfig> rope;   // dims resolved
    std::vector<double> rope_freq;    // θ_k = theta^(−2k/r), k < r/2
    std::vector<float> in_b;          // [H·d + 2·Hkv·d]: bq; bk; bv
    std::vector<float> out_b, norm_w, norm_b;  // norm_*: empty when not given
    // AttentionConfig::modifiers (validated), sinks and slopes copied ([H] or empty).
    long long window_left = -1, window_right = -1;
    float softcap = 0.0f;
    std::vector<float> sinks, alibi_slopes;
    ScoreModifiers modifiers() const noexcept {
        ScoreModifiers m;
        m.window_left = window_left, m.window_right = window_right, m.softcap = softcap;
        m.sinks = sinks.empty() ? nullptr : sinks.data();
        m.alibi_slopes = alibi_slopes.empty() ? nullptr : alibi_slopes.data();
        return m;
    }
    // Wᵀ of each projection: y = x·Wᵀ + b is one gemm_packed call.
    bool qkv_packed = false;           // in_proj holds Wq, Wk, Wv as segments 0, 1, 2
    simd::PackedMatrix in_proj;        // qkv_packed
    simd::PackedMatrix q_proj, k_proj, v_proj;  // !qkv_packed
    simd::PackedMatrix out_proj;
    // (bf16 compute: the weights rounded to bf16, in the fp32 kernels' panels, PanelElement::bf16.)
    // bf16 compute on a CPU with AVX512_BF16 or FEAT_BF16 (at construction): the same weights in the bf16
    // kernels' panels (k-pairs, gemm_bf16.hpp). Empty otherwise.
    simd::Bf16PackedMatrix in_proj16, q_proj16, k_proj16, v_proj16, out_proj16;
    bool has_bf16_weights() const noexcept { return !out_proj16.empty(); }
    simd::Bf16Panels projection16(std::size_t part) const noexcept {
        if (qkv_packed) return in_proj16.segments(part, 1);
        return (part == 0 ? q_proj16 : part == 1 ? k_proj16 : v_proj16).all();
    }

    std::size_t q_width() const noexcept { return H * d; }
    std::size_t kv_width() const noexcept { return Hkv * d; }
    // Wq (part 0), Wk (1) or Wv (2) as a B operand.
    simd::PackedMatrix::View projection(std::size_t part) const noexcept {
        if (qkv_packed) return in_proj.segments(part, 1);
        return (part == 0 ? q_proj : part == 1 ? k_proj : v_proj).all();
    }
    const float* bias(std::size_t part) const noexcept {
        return in_b.data() + (part == 0 ? 0 : part == 1 ? q_width() : q_width() + kv_width());
    }

    // Plain row-major weights for the scalar reference, unpacked from the packed copies (exact).
    struct Unpacked {
        std::vector<float> wq, wk, wv, wo;
        reference::Layer layer(const LayerState& s) const {
            reference::Layer l;
            l.E = s.E, l.H = s.H, l.Hkv = s.Hkv, l.d = s.d, l.kdim = s.kdim, l.vdim = s.vdim, l.rope = s.rope;
            l.wq = wq.data(), l.wk = wk.data(), l.wv = wv.data(), l.wo = wo.data();
            l.bq = s.bias(0), l.bk = s.bias(1), l.bv = s.bias(2), l.bo = s.out_b.data();
            l.norm_w = s.norm_w.empty() ? nullptr : s.norm_w.data();
            l.norm_b = s.norm_b.empty() ? nullptr : s.norm_b.data();
            l.mods = s.modifiers();
            return l;
        }
    };
    Unpacked unpacked() const;
    // The weights a SIMD forward reads now (see MultiheadAttention::weight_bytes_read).
    std::size_t bytes_read() const noexcept {
        const std::size_t small = (in_b.size() + out_b.size() + norm_w.size() + norm_b.size()) * sizeof(float);
        if (has_bf16_weights() && simd::bf16_kernels_available())
            return in_proj16.bytes() + q_proj16.bytes() + k_proj16.bytes() + v_proj16.bytes() + out_proj16.bytes() + small;
        return in_proj.bytes() + q_proj.bytes() + k_proj.bytes() + v_proj.bytes() + out_proj.bytes() + small;
    }
    std::size_t bytes() const noexcept {
        return in_proj.bytes() + q_proj.bytes() + k_proj.bytes() + v_proj.bytes() + out_proj.bytes() + in_proj16.bytes() +
               q_proj16.bytes() + k_proj16.bytes() + v_proj16.bytes() + out_proj16.bytes() +
               (in_b.size() + out_b.size() + norm_w.size() + norm_b.size()) * sizeof(float) +
               rope_freq.size() * sizeof(double);
    }
};

}  // namespace detail

// The SIMD backend (lib/attention/simd_attention.cpp) on a validated call (detail::validate_layer_call).
// workspace: the caller's, or nullptr (a lease from the scratch cache).
// cache: nullptr, or the KV cache the new tokens (the query) continue (call.cache, writable).
void simd_multihead_attention(const detail::LayerState& s, const detail::LayerCall& call, Workspace* workspace,
                              KVCache* cache);
// The bytes of workspace simd_multihead_attention needs for this call (detail::describe_layer_call).
std::size_t simd_workspace_bytes(const detail::LayerState& s, const detail::LayerCall& call);

}  // namespace mha
