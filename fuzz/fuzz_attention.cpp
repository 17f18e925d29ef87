// libFuzzer target: MultiheadAttention::forward on shapes, strides, masks and options decoded from the
// input bytes, with Backend::simd and Backend::scalar. Two modes (one bit of the input):
//   classic  nn.MultiheadAttention: MultiheadAttention(weights, E, H), in_proj_weight [3E, E], d = E / H;
//            the oracle is tests/attention_test_util.hpp's attention_double.
//   decoder  MultiheadAttention(weights, AttentionConfig) (issue 12): Hkv dividing H (num_kv_heads 0 or
//            explicit), head_dim default or explicit (H·d != E), kdim / vdim default, = E or not (then
//            separate weights), packed in_proj_weight or separate q/k/v_proj_weight, biases as in_proj_bias
//            or per projection (each present or absent), RoPE off / half / interleaved with rotary dims d
//            or fewer and several thetas, a position_offset (0, small, 2^20 ± 64, < 2^32, or the last
//            start before 2^53) or per-sequence positions, causal top-left or bottom-right with Lq != Lk
//            (the alignment also moves the RoPE query positions), cross-attention key / value rows that the
//            key padding mask hides sometimes NaN or ±inf (they must not reach any output); the oracle is
//            decoder_oracle.hpp's layer_double (same bound construction, extended by RoPE and GQA).
//
// Valid problems: both backends must match the double-precision oracle within its propagated first-order
// error bound, times 2 (so simd and scalar agree within twice that); every output element and every
// attention weight must be written, and the padding of a strided output left untouched. The SIMD result
// must be bitwise the same for two thread counts (the design promises thread-count independence), the
// second run sometimes in a caller's Workspace of exactly workspace_bytes().
// Values stay in ranges where the first-order bound holds (scores' absolute error ≪ 1), see decode().
//
// Invalid problems (one corruption applied to a valid one): the constructor or both forward calls must
// throw mha::invalid_argument and leave the output, weight (and borrowed workspace) buffers exactly as
// they were.
//
// Input layout (FuzzedDataProvider): option bytes, then a 32-bit seed from which the values are drawn.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention_oracle.hpp"
#include "decoder_oracle.hpp"

namespace {

using mha_test::Mask;

constexpr float kSentinel = -7777.25f;  // padding and unwritten outputs; never a result here
constexpr std::size_t kMaxPosition = std::size_t{1} << 53;

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz_attention: %s\n", what.c_str());
    std::abort();
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A [B, rows, cols] batch with padded rows and matrices, in a buffer of exactly its extent (so ASan
// flags any access past it); padding holds kSentinel.
struct Strided {
    std::vector<float> buf;
    std::size_t B = 0, rows = 0, cols = 0, rs = 0, bs = 0;

    Strided(std::size_t b, std::size_t r, std::size_t c, std::size_t row_pad, std::size_t batch_pad)
        : B(b), rows(r), cols(c), rs(c + row_pad), bs(r * (c + row_pad) + batch_pad) {
        buf.assign((B - 1) * bs + (rows - 1) * rs + cols, kSentinel);
    }
    Strided(const std::vector<float>& contiguous, std::size_t b, std::size_t r, std::size_t c, std::size_t row_pad,
            std::size_t batch_pad)
        : Strided(b, r, c, row_pad, batch_pad) {
        for (std::size_t x = 0; x < B; ++x)
            for (std::size_t i = 0; i < rows; ++i)
                std::memcpy(&buf[x * bs + i * rs], &contiguous[(x * rows + i) * cols], cols * sizeof(float));
    }
    mha::Batch view() { return {buf.data(), B, rows, cols, rs, bs}; }
    mha::ConstBatch cview() const { return {buf.data(), B, rows, cols, rs, bs}; }
    bool in_view(std::size_t flat) const {
        const std::size_t x = flat / bs, in = flat % bs;
        return in / rs < rows && in % rs < cols && x < B;
    }
    float at(std::size_t x, std::size_t i, std::size_t c) const { return buf[x * bs + i * rs + c]; }
};

enum class Corruption {
    none,
    // Both modes (the first 16 are the original target's).
    heads_do_not_divide,  // classic: num_heads not dividing E (constructor); decoder: num_kv_heads not dividing H
    row_stride_too_small,
    batch_stride_too_small,
    output_overlaps_query,
    key_padding_shape,
    attn_mask_shape,
    mask_rank,
    mask_null_pointer,
    mask_type_unknown,
    negative_threads,
    bad_norm_eps,
    weights_null,
    key_batch,
    value_length,
    output_shape,
    zero_size,
    bad_causal_alignment,
    workspace_too_small,  // simd only (the scalar backend needs no workspace)
    workspace_overlaps,   // a borrowed workspace holding the output, the query or a mask
    // Decoder layers, forward.
    position_past_2_53,           // RoPE: start + max(Lq, Lk) > 2^53 (offset or one of positions[])
    bottom_right_negative_start,  // RoPE, bottom-right, Lq > Lk: a start below Lq − Lk
    features_not_kdim,            // key / value features differ from kdim / vdim
    // Decoder layers, the constructor.
    rope_dims_bad,
    rope_theta_bad,
    rope_style_bad,
    packed_and_separate,
    packed_with_kdim,
    separate_weight_missing,
    bias_both_kinds,
    head_dim_default_indivisible,
    out_proj_null,
    count
};
constexpr int kClassicKinds = static_cast<int>(Corruption::workspace_overlaps) + 1;  // none .. workspace_overlaps

bool constructor_corruption(Corruption c) {
    return c == Corruption::heads_do_not_divide || static_cast<int>(c) >= static_cast<int>(Corruption::rope_dims_bad);
}

struct Case {
    bool decoder = false;
    mha_test::Problem p;           // classic: the problem of attention_double
    fuzz_oracle::LayerProblem lp;  // both: the call's shapes, data and options (classic: p's, converted)
    mha::AttentionConfig config;   // decoder: as given to the constructor (zeros: defaults)
    bool packed_weights = true;    // decoder: in_proj_weight, else q/k/v_proj_weight
    int bias_kind = 0;             // decoder: 0 no input biases, 1 in_proj_bias, 2 q/k/v_proj_bias (lp.b* empty: absent)
    std::vector<float> in_w, in_b; // decoder: [Wq; Wk; Wv] (packed weights only) and [bq; bk; bv] (bias_kind 1)
    int kv_mode = 0;           // 0 self (key null), 1 cross (distinct key, value), 2 key given and value null,
                               // 3 key and value passed as the query's own view
    std::size_t pad[4][2] = {};  // row / batch padding of query, key, value, output
    bool null_in_bias = false, null_out_bias = false;  // classic
    mha::NeedWeights need = mha::NeedWeights::none;
    mha::Impl impl = mha::Impl::automatic;
    int threads_a = 0, threads_b = 1;
    bool workspace_b = false;  // the threads_b run in a caller's Workspace
    int poison = 0;            // decoder cross-attention: key / value rows the key padding mask hides are NaN, +inf, -inf
    Corruption corruption = Corruption::none;
    int corruption_detail = 0;
};

// Uniform in [lo, hi) from 24 random bits (std::uniform_real_distribution calls logl per draw in
// libstdc++, which dominated the run time).
float draw(std::mt19937& rng, float lo, float hi) { return lo + (hi - lo) * float(rng() >> 8) * 0x1p-24f; }
// True with probability p (to 2^-32).
bool coin(std::mt19937& rng, double p) { return double(rng()) < p * 4294967296.0; }

Mask make_mask(bool boolean, std::vector<std::size_t> dims, double density, double inf_density, float range,
               std::mt19937& rng) {
    Mask m;
    m.rank = static_cast<int>(dims.size());
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) m.shape[i] = dims[i], n *= dims[i];
    if (boolean) {
        m.type = mha::MaskType::boolean;
        m.bools.resize(n);
        // Any nonzero byte means "masked": use varied nonzero values.
        for (auto& b : m.bools) b = coin(rng, density) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
    } else {
        m.type = mha::MaskType::additive;
        m.values.resize(n);
        for (auto& v : m.values) v = coin(rng, inf_density) ? -std::numeric_limits<float>::infinity() : draw(rng, -range, range);
    }
    return m;
}

// The original target's problems (nn.MultiheadAttention shapes).
Case decode_classic(FuzzedDataProvider& in) {
    Case c;
    mha_test::Problem& p = c.p;

    // Shapes. Mostly small (the oracle is O(B·L·E²) in double under ASan); one input in eight has long
    // keys (past the fused path's 256-key tile, with a small E), one in eight crosses the 64-row query block.
    const int size_class = in.ConsumeIntegralInRange<int>(0, 7);
    const bool long_keys = size_class == 0, long_queries = size_class == 1;
    p.H = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : 8);
    const std::size_t d = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : long_queries ? 8 : 16);
    p.E = p.H * d;
    p.B = long_keys ? 1 : in.ConsumeIntegralInRange<std::size_t>(1, 3);
    c.kv_mode = in.ConsumeIntegralInRange<int>(0, 3);
    const bool has_own_keys = c.kv_mode == 1 || c.kv_mode == 2;
    if (long_keys) {
        p.Lq = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 12) : in.ConsumeIntegralInRange<std::size_t>(200, 400);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(200, 600) : p.Lq;
    } else if (long_queries) {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(60, 70);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 70) : p.Lq;
    } else {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(1, 20);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 20) : p.Lq;
    }
    for (auto& pd : c.pad) {
        pd[0] = in.ConsumeIntegralInRange<std::size_t>(0, 3);
        pd[1] = in.ConsumeIntegralInRange<std::size_t>(0, 5);
    }

    // Magnitudes: inputs up to 32, weights up to 4/√E (projections typically below ~100). Scores then
    // typically stay below ~1e4 and their absolute float error below ~0.05, where the oracle's
    // first-order softmax bound (with its factor 2) covers the second-order terms.
    static constexpr float input_ranges[] = {1.0f, 4.0f, 32.0f};
    const float input_range = input_ranges[in.ConsumeIntegralInRange<int>(0, 2)];
    const float weight_range = (in.ConsumeBool() ? 4.0f : 1.0f) / std::sqrt(static_cast<float>(p.E));
    c.null_in_bias = in.ConsumeIntegralInRange<int>(0, 5) == 0;
    c.null_out_bias = in.ConsumeIntegralInRange<int>(0, 5) == 0;

    const int kpm_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, bool, float
    const int am_kind = in.ConsumeIntegralInRange<int>(0, 4);   // none, bool 2-D, bool 3-D, float 2-D, float 3-D
    static constexpr double densities[] = {0.0, 0.1, 0.3, 0.7, 1.0};
    const double density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const double inf_density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const float mask_range = in.ConsumeBool() ? 3.0f : 30.0f;
    p.causal = in.ConsumeBool();
    c.need = static_cast<mha::NeedWeights>(in.ConsumeIntegralInRange<int>(0, 2));
    const int norm_kind = in.ConsumeIntegralInRange<int>(0, 4);  // 0, 1: none; else eps 1e-5, 1e-3, 1e-12
    const bool norm_params = in.ConsumeBool();
    c.impl = static_cast<mha::Impl>(in.ConsumeIntegralInRange<int>(0, 2));
    c.threads_a = in.ConsumeIntegralInRange<int>(0, 4);
    c.threads_b = in.ConsumeIntegralInRange<int>(1, 3);
    c.workspace_b = in.ConsumeBool();
    const int corruption = in.ConsumeIntegralInRange<int>(0, 99);
    c.corruption = corruption < kClassicKinds ? static_cast<Corruption>(corruption) : Corruption::none;
    c.corruption_detail = in.ConsumeIntegralInRange<int>(0, 3);

    std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
    auto uniform = [&](std::size_t n, float r) {
        std::vector<float> v(n);
        for (float& x : v) x = draw(rng, -r, r);
        return v;
    };
    const std::size_t E = p.E;
    p.in_w = uniform(3 * E * E, weight_range);
    p.in_b = c.null_in_bias ? std::vector<float>(3 * E, 0.0f) : uniform(3 * E, weight_range);
    p.out_w = uniform(E * E, weight_range);
    p.out_b = c.null_out_bias ? std::vector<float>(E, 0.0f) : uniform(E, weight_range);
    p.query = uniform(p.B * p.Lq * E, input_range);
    if (c.kv_mode == 1) {
        p.key = uniform(p.B * p.Lk * E, input_range);
        p.value = uniform(p.B * p.Lk * E, input_range);
    } else if (c.kv_mode == 2) {
        p.key = uniform(p.B * p.Lk * E, input_range);
    }
    if (kpm_kind) p.key_padding_mask = make_mask(kpm_kind == 1, {p.B, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 1 || am_kind == 3)
        p.attn_mask = make_mask(am_kind == 1, {p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 2 || am_kind == 4)
        p.attn_mask = make_mask(am_kind == 2, {p.B * p.H, p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (norm_kind >= 2) {
        static constexpr float eps[] = {1e-5f, 1e-3f, 1e-12f};
        p.norm_eps = eps[norm_kind - 2];
        if (norm_params) {
            p.norm_w.resize(E);
            for (float& x : p.norm_w) x = draw(rng, 0.5f, 1.5f);
            p.norm_b = uniform(E, 0.5f);
        }
    }

    // The same problem as a LayerProblem (what Call reads): Wq, Wk, Wv are in_proj_weight's row blocks.
    fuzz_oracle::LayerProblem& lp = c.lp;
    lp.E = E, lp.H = p.H, lp.Hkv = p.H, lp.d = d, lp.kdim = E, lp.vdim = E, lp.B = p.B, lp.Lq = p.Lq, lp.Lk = p.Lk;
    auto rows = [](const std::vector<float>& v, std::size_t from, std::size_t n) {
        return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + n));
    };
    lp.wq = rows(p.in_w, 0, E * E), lp.wk = rows(p.in_w, E * E, E * E), lp.wv = rows(p.in_w, 2 * E * E, E * E);
    lp.bq = rows(p.in_b, 0, E), lp.bk = rows(p.in_b, E, E), lp.bv = rows(p.in_b, 2 * E, E);
    lp.wo = p.out_w, lp.bo = p.out_b, lp.norm_w = p.norm_w, lp.norm_b = p.norm_b;
    lp.query = p.query, lp.key = p.key, lp.value = p.value;
    lp.key_padding_mask = p.key_padding_mask, lp.attn_mask = p.attn_mask;
    lp.causal = p.causal, lp.norm_eps = p.norm_eps;
    return c;
}

// A decoder layer (AttentionConfig). Constructor corruptions are applied to the config and weights later;
// those of forward that need a shape (RoPE, Lq > Lk) get it here.
Case decode_decoder(FuzzedDataProvider& in) {
    Case c;
    c.decoder = true;
    fuzz_oracle::LayerProblem& p = c.lp;
    const int corruption = in.ConsumeIntegralInRange<int>(0, 129);
    c.corruption = corruption < static_cast<int>(Corruption::count) ? static_cast<Corruption>(corruption) : Corruption::none;
    c.corruption_detail = in.ConsumeIntegralInRange<int>(0, 3);
    const bool needs_rope = c.corruption == Corruption::position_past_2_53 || c.corruption == Corruption::bottom_right_negative_start;
    const bool needs_fewer_keys = c.corruption == Corruption::bottom_right_negative_start;  // Lk < Lq, cross

    // Shapes: as the classic mode, plus Hkv | H, a head dim of its own (up to 24, past the 16-float
    // vectors), E independent of H·d, kdim / vdim.
    const int size_class = in.ConsumeIntegralInRange<int>(0, 7);
    const bool long_keys = size_class == 0, long_queries = size_class == 1;
    p.H = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : 8);
    std::vector<std::size_t> divisors;
    for (std::size_t h = 1; h <= p.H; ++h)
        if (p.H % h == 0) divisors.push_back(h);
    p.Hkv = divisors[in.ConsumeIntegralInRange<std::size_t>(0, 7) % divisors.size()];
    p.d = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : long_queries ? 8 : 24);
    if (needs_rope && p.d < 2) p.d = 2;
    const int e_mode = in.ConsumeIntegralInRange<int>(0, 2);  // E = H·d with head_dim 0 / explicit; E free
    p.E = e_mode == 2 ? in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 8 : 32) : p.H * p.d;
    c.config.embed_dim = p.E, c.config.num_heads = p.H;
    c.config.head_dim = e_mode == 0 ? 0 : p.d;
    c.config.num_kv_heads = p.Hkv == p.H && in.ConsumeBool() ? 0 : p.Hkv;
    auto features = [&](std::size_t& config_value) {  // 0 (default E), E explicitly, or other
        const int mode = in.ConsumeIntegralInRange<int>(0, 3);
        config_value = mode == 0 ? 0 : mode == 1 ? p.E : in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 8 : 24);
        return config_value == 0 ? p.E : config_value;
    };
    p.kdim = features(c.config.kdim);
    p.vdim = features(c.config.vdim);
    p.B = long_keys ? 1 : in.ConsumeIntegralInRange<std::size_t>(1, 3);
    if (p.kdim == p.E && p.vdim == p.E)
        c.kv_mode = in.ConsumeIntegralInRange<int>(0, 3);
    else
        c.kv_mode = p.kdim == p.vdim ? in.ConsumeIntegralInRange<int>(1, 2) : 1;  // key = query needs kdim == E
    if (needs_fewer_keys) c.kv_mode = 1;
    const bool has_own_keys = c.kv_mode == 1 || c.kv_mode == 2;
    if (long_keys) {
        p.Lq = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 12) : in.ConsumeIntegralInRange<std::size_t>(200, 400);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(200, 600) : p.Lq;
    } else if (long_queries) {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(60, 70);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 70) : p.Lq;
    } else {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(1, 20);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 20) : p.Lq;
    }
    if (needs_fewer_keys) {
        p.Lq = std::max<std::size_t>(p.Lq, 2);
        p.Lk = std::min(p.Lk, p.Lq - 1);
    }
    for (auto& pd : c.pad) {
        pd[0] = in.ConsumeIntegralInRange<std::size_t>(0, 3);
        pd[1] = in.ConsumeIntegralInRange<std::size_t>(0, 5);
    }

    // Weights and biases.
    c.packed_weights = p.kdim == p.E && p.vdim == p.E && in.ConsumeBool();
    c.bias_kind = in.ConsumeIntegralInRange<int>(0, 2);
    const bool bias_q = in.ConsumeBool(), bias_k = in.ConsumeBool(), bias_v = in.ConsumeBool();
    const bool bias_out = in.ConsumeIntegralInRange<int>(0, 5) != 0;

    // RoPE: off, half, interleaved; rotary dims d (0 in the config when d is even) or an even r < d.
    int rope_kind = p.d >= 2 ? in.ConsumeIntegralInRange<int>(0, 2) : 0;
    if (needs_rope && rope_kind == 0) rope_kind = 1;
    if (rope_kind != 0) {
        static constexpr float thetas[] = {10000.0f, 500000.0f, 10.0f, 0.5f, 1.0f, 1e6f, 3.75f, 100.0f};
        mha::RopeConfig rope;
        rope.theta = thetas[in.ConsumeIntegralInRange<int>(0, 7)];
        rope.style = rope_kind == 1 ? mha::RopeStyle::half : mha::RopeStyle::interleaved;
        const std::size_t r_max = p.d / 2 * 2;  // the largest even r <= d
        const bool default_dims = p.d % 2 == 0 && in.ConsumeBool();
        const std::size_t r = default_dims ? p.d : 2 * in.ConsumeIntegralInRange<std::size_t>(1, r_max / 2);
        rope.dims = default_dims ? 0 : r;
        c.config.rope = rope;
        rope.dims = r;
        p.rope = rope;
    }

    // Causal alignment (it also places the RoPE query rows), positions.
    p.causal = in.ConsumeBool();
    p.alignment = in.ConsumeBool() ? mha::CausalAlignment::bottom_right : mha::CausalAlignment::top_left;
    if (needs_fewer_keys) p.alignment = mha::CausalAlignment::bottom_right;
    const std::size_t L = std::max(p.Lq, p.Lk);
    const std::size_t min_start = p.alignment == mha::CausalAlignment::bottom_right && p.Lq > p.Lk ? p.Lq - p.Lk : 0;
    auto start = [&](int mode) -> std::size_t {
        std::size_t s = 0;
        switch (mode) {
            case 1: s = in.ConsumeIntegralInRange<std::size_t>(0, 100); break;
            case 2: s = (std::size_t{1} << 20) - 64 + in.ConsumeIntegralInRange<std::size_t>(0, 128); break;
            case 3: s = in.ConsumeIntegral<std::uint32_t>(); break;
            case 4: s = kMaxPosition - L - in.ConsumeIntegralInRange<std::size_t>(0, 3); break;  // the last starts
            default: break;
        }
        return std::min(std::max(s, min_start), kMaxPosition - L);
    };
    const int position_mode = in.ConsumeIntegralInRange<int>(0, 5);  // 5: per-sequence positions
    if (position_mode == 5) {
        for (std::size_t b = 0; b < p.B; ++b) p.positions.push_back(start(in.ConsumeIntegralInRange<int>(0, 4)));
    } else {
        p.position_offset = start(position_mode);
    }

    // Magnitudes as the classic mode: inputs up to 32, each weight up to 4/√(its fan-in).
    static constexpr float input_ranges[] = {1.0f, 4.0f, 32.0f};
    const float input_range = input_ranges[in.ConsumeIntegralInRange<int>(0, 2)];
    const float weight_scale = in.ConsumeBool() ? 4.0f : 1.0f;
    const int kpm_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, bool, float
    const int am_kind = in.ConsumeIntegralInRange<int>(0, 4);   // none, bool 2-D, bool 3-D, float 2-D, float 3-D
    static constexpr double densities[] = {0.0, 0.1, 0.3, 0.7, 1.0};
    const double density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const double inf_density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const float mask_range = in.ConsumeBool() ? 3.0f : 30.0f;
    c.need = static_cast<mha::NeedWeights>(in.ConsumeIntegralInRange<int>(0, 2));
    const int norm_kind = in.ConsumeIntegralInRange<int>(0, 4);  // 0, 1: none; else eps 1e-5, 1e-3, 1e-12
    const bool norm_params = in.ConsumeBool();
    c.impl = static_cast<mha::Impl>(in.ConsumeIntegralInRange<int>(0, 2));
    c.threads_a = in.ConsumeIntegralInRange<int>(0, 4);
    c.threads_b = in.ConsumeIntegralInRange<int>(1, 3);
    c.workspace_b = in.ConsumeBool();
    c.poison = c.kv_mode == 1 ? in.ConsumeIntegralInRange<int>(0, 5) : 0;  // 1..3 (a masked key never contributes)
    if (c.poison > 3) c.poison = 0;

    std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
    auto uniform = [&](std::size_t n, float r) {
        std::vector<float> v(n);
        for (float& x : v) x = draw(rng, -r, r);
        return v;
    };
    const std::size_t E = p.E, qw = p.H * p.d, kvw = p.Hkv * p.d;
    const float rq = weight_scale / std::sqrt(float(E)), rk = weight_scale / std::sqrt(float(p.kdim));
    const float rv = weight_scale / std::sqrt(float(p.vdim)), ro = weight_scale / std::sqrt(float(qw));
    p.wq = uniform(qw * E, rq), p.wk = uniform(kvw * p.kdim, rk), p.wv = uniform(kvw * p.vdim, rv), p.wo = uniform(E * qw, ro);
    if (c.bias_kind == 1 || (c.bias_kind == 2 && bias_q)) p.bq = uniform(qw, rq);
    if (c.bias_kind == 1 || (c.bias_kind == 2 && bias_k)) p.bk = uniform(kvw, rk);
    if (c.bias_kind == 1 || (c.bias_kind == 2 && bias_v)) p.bv = uniform(kvw, rv);
    if (bias_out) p.bo = uniform(E, ro);
    if (c.packed_weights) {
        c.in_w = p.wq;
        c.in_w.insert(c.in_w.end(), p.wk.begin(), p.wk.end());
        c.in_w.insert(c.in_w.end(), p.wv.begin(), p.wv.end());
    }
    if (c.bias_kind == 1) {
        c.in_b = p.bq;
        c.in_b.insert(c.in_b.end(), p.bk.begin(), p.bk.end());
        c.in_b.insert(c.in_b.end(), p.bv.begin(), p.bv.end());
    }
    p.query = uniform(p.B * p.Lq * E, input_range);
    if (has_own_keys) p.key = uniform(p.B * p.Lk * p.kdim, input_range);
    if (c.kv_mode == 1) p.value = uniform(p.B * p.Lk * p.vdim, input_range);
    if (kpm_kind) p.key_padding_mask = make_mask(kpm_kind == 1, {p.B, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 1 || am_kind == 3)
        p.attn_mask = make_mask(am_kind == 1, {p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 2 || am_kind == 4)
        p.attn_mask = make_mask(am_kind == 2, {p.B * p.H, p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (c.poison && p.key_padding_mask.present()) {
        // The key and value input rows of keys the key padding mask hides (their projections are then NaN or
        // ±inf): they must not reach any output (mha/attention.hpp's masked-key rule).
        const float bad[] = {0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity()};
        for (std::size_t b = 0; b < p.B; ++b)
            for (std::size_t j = 0; j < p.Lk; ++j)
                if (p.key_padding_mask.at(b * p.Lk + j) == -INFINITY) {
                    std::fill_n(&p.key[(b * p.Lk + j) * p.kdim], p.kdim, bad[c.poison]);
                    std::fill_n(&p.value[(b * p.Lk + j) * p.vdim], p.vdim, bad[c.poison]);
                }
    }
    if (norm_kind >= 2) {
        static constexpr float eps[] = {1e-5f, 1e-3f, 1e-12f};
        p.norm_eps = eps[norm_kind - 2];
        if (norm_params) {
            p.norm_w.resize(E);
            for (float& x : p.norm_w) x = draw(rng, 0.5f, 1.5f);
            p.norm_b = uniform(E, 0.5f);
        }
    }
    return c;
}

Case decode(FuzzedDataProvider& in) {
    mha::set_isa_cap(static_cast<mha::Isa>(in.ConsumeIntegralInRange<int>(0, 2)));  // capped at the CPU's best
    return in.ConsumeBool() ? decode_decoder(in) : decode_classic(in);
}

// The decoder layer's weights as the case gives them.
mha::AttentionWeights decoder_weights(const Case& c) {
    const fuzz_oracle::LayerProblem& p = c.lp;
    auto ptr = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
    mha::AttentionWeights w;
    if (c.packed_weights) {
        w.in_proj_weight = c.in_w.data();
    } else {
        w.q_proj_weight = p.wq.data(), w.k_proj_weight = p.wk.data(), w.v_proj_weight = p.wv.data();
    }
    if (c.bias_kind == 1) w.in_proj_bias = c.in_b.data();
    if (c.bias_kind == 2) w.q_proj_bias = ptr(p.bq), w.k_proj_bias = ptr(p.bk), w.v_proj_bias = ptr(p.bv);
    w.out_proj_weight = p.wo.data();
    w.out_proj_bias = ptr(p.bo);
    w.norm_weight = ptr(p.norm_w), w.norm_bias = ptr(p.norm_b);
    return w;
}

// Everything one forward call needs, with the corruption (if any) applied. Owns all buffers.
struct Call {
    std::optional<Strided> query, key, value, output;
    std::vector<float> weights;  // exactly the size the call writes (ASan catches a write past it)
    std::vector<std::size_t> positions;
    std::vector<float> arena;    // memory of a borrowed workspace (workspace_overlaps), kSentinel
    std::optional<mha::Workspace> workspace;
    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    mha::ForwardOptions opt;
    Mask kpm, am;

    Call(const Case& c, const mha::MultiheadAttention& attention, mha::Backend backend, int threads, bool use_workspace) {
        const fuzz_oracle::LayerProblem& p = c.lp;
        query.emplace(p.query, p.B, p.Lq, p.E, c.pad[0][0], c.pad[0][1]);
        in.query = query->cview();
        if (c.kv_mode == 1 || c.kv_mode == 2) {
            key.emplace(p.key, p.B, p.Lk, p.kdim, c.pad[1][0], c.pad[1][1]);
            in.key = key->cview();
        }
        if (c.kv_mode == 1) {
            value.emplace(p.value, p.B, p.Lk, p.vdim, c.pad[2][0], c.pad[2][1]);
            in.value = value->cview();
        }
        if (c.kv_mode == 3) in.key = in.value = in.query;
        output.emplace(p.B, p.Lq, p.E, c.pad[3][0], c.pad[3][1]);
        out.output = output->view();
        kpm = p.key_padding_mask;
        am = p.attn_mask;
        in.key_padding_mask = kpm.view();
        in.attn_mask = am.view();
        const std::size_t heads = c.need == mha::NeedWeights::per_head ? p.H : 1;
        if (c.need != mha::NeedWeights::none) weights.assign(p.B * heads * p.Lq * p.Lk, kSentinel);
        out.attn_weights = weights.empty() ? nullptr : weights.data();
        opt.backend = backend;
        opt.causal = p.causal;
        opt.causal_alignment = p.alignment;
        opt.position_offset = p.position_offset;
        if (!p.positions.empty()) positions = p.positions, opt.positions = positions.data();
        opt.need_weights = c.need;
        opt.norm_eps = p.norm_eps;
        opt.impl = c.impl;
        opt.threads = threads;
        if (use_workspace) workspace.emplace(attention.workspace_bytes(in, opt));
        corrupt(c, attention);
    }

    void run(const mha::MultiheadAttention& attention) {
        if (workspace)
            attention.forward(in, out, opt, *workspace);
        else
            attention.forward(in, out, opt);
    }

    void corrupt(const Case& c, const mha::MultiheadAttention& attention) {
        const fuzz_oracle::LayerProblem& p = c.lp;
        const int k = c.corruption_detail;
        // A valid mask to corrupt: the problem's own, or an all-zero one when it has none there.
        auto ensure_attn_mask = [&]() -> mha::MaskView& {
            if (!in.attn_mask.present()) {
                am = Mask();
                am.type = mha::MaskType::boolean, am.rank = 2, am.shape = {p.Lq, p.Lk, 0};
                am.bools.assign(p.Lq * p.Lk, 0);
                in.attn_mask = am.view();
            }
            return in.attn_mask;
        };
        auto ensure_key_padding = [&]() -> mha::MaskView& {
            if (!in.key_padding_mask.present()) {
                kpm = Mask();
                kpm.type = mha::MaskType::additive, kpm.rank = 2, kpm.shape = {p.B, p.Lk, 0};
                kpm.values.assign(p.B * p.Lk, 0.0f);
                in.key_padding_mask = kpm.view();
            }
            return in.key_padding_mask;
        };
        auto some_mask = [&]() -> mha::MaskView& { return (k & 1) ? ensure_attn_mask() : ensure_key_padding(); };
        // Valid per-sequence starts to corrupt one of.
        auto ensure_positions = [&] {
            if (positions.empty()) positions.assign(p.B, opt.position_offset);
            opt.positions = positions.data();
        };
        switch (c.corruption) {
            case Corruption::none:
            case Corruption::count:
                break;
            case Corruption::heads_do_not_divide:  // constructor corruptions: applied there
            case Corruption::rope_dims_bad:
            case Corruption::rope_theta_bad:
            case Corruption::rope_style_bad:
            case Corruption::packed_and_separate:
            case Corruption::packed_with_kdim:
            case Corruption::separate_weight_missing:
            case Corruption::bias_both_kinds:
            case Corruption::head_dim_default_indivisible:
            case Corruption::out_proj_null:
                break;
            // Inputs may use any strides; the output's rows must not overlap each other.
            case Corruption::row_stride_too_small:
                out.output.row_stride = out.output.cols - 1;  // cols >= 1; stride 0 when cols == 1
                // One output row cannot overlap itself: then claim two rows (a shape the call must refuse).
                out.output.rows = std::max<std::size_t>(out.output.rows, 2);
                break;
            case Corruption::batch_stride_too_small:
                out.output.batch = std::max<std::size_t>(out.output.batch, 2);  // needs more than one matrix
                out.output.batch_stride = (out.output.rows - 1) * out.output.row_stride + out.output.cols - 1;
                in.query.batch = out.output.batch;
                break;
            case Corruption::output_overlaps_query:
                // Output aliases the query (a writable buffer, so a wrong write shows up as a change).
                in.query = out.output;
                if (c.kv_mode == 3) in.key = in.value = in.query;
                break;
            case Corruption::key_padding_shape:
                ensure_key_padding().shape[(k & 2) ? 0 : 1] += 1;
                break;
            case Corruption::attn_mask_shape:
                ensure_attn_mask();
                in.attn_mask.shape[static_cast<std::size_t>(k) % static_cast<std::size_t>(in.attn_mask.rank)] += 1;
                break;
            case Corruption::mask_rank:
                some_mask().rank = (k & 2) ? 4 : 1;
                break;
            case Corruption::mask_null_pointer: {
                mha::MaskView& m = some_mask();
                m.bools = nullptr, m.values = nullptr;
                break;
            }
            case Corruption::mask_type_unknown:
                some_mask().type = static_cast<mha::MaskType>(3 + k);
                break;
            case Corruption::negative_threads:
                opt.threads = -1 - k;
                break;
            case Corruption::bad_norm_eps: {
                const float bad[] = {-1e-5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity()};
                opt.norm_eps = bad[k];
                break;
            }
            case Corruption::weights_null:
                opt.need_weights = (k & 1) ? mha::NeedWeights::per_head : mha::NeedWeights::averaged;
                out.attn_weights = nullptr;
                break;
            case Corruption::key_batch:
                if (c.kv_mode == 1 || c.kv_mode == 2) {
                    in.key.batch += 1;  // view now claims more than the buffer holds: must be rejected unread
                } else {
                    in.key = in.query;
                    in.key.batch += 1;
                }
                break;
            case Corruption::value_length:
                // Decoder layers keep a value view of their own (vdim may differ from kdim and E).
                if (!(c.decoder && in.value.data)) in.value = in.key.data ? in.key : in.query;
                in.value.rows += 1;
                break;
            case Corruption::output_shape:
                if (k & 1) out.output.rows += 1; else out.output.cols += 1;
                break;
            case Corruption::zero_size:
                if (k == 0) in.query.rows = 0; else if (k == 1) in.query.cols = 0; else if (k == 2) in.query.batch = 0; else in.query.data = nullptr;
                break;
            case Corruption::bad_causal_alignment:
                opt.causal_alignment = static_cast<mha::CausalAlignment>(2 + k);
                break;
            case Corruption::workspace_too_small: {  // simd only
                const std::size_t need = attention.workspace_bytes(in, opt);
                if (need == 0) fail("workspace_bytes is 0 for the simd backend");
                const std::size_t sizes[] = {need - 1, need / 2, 0, 64};
                workspace.emplace(std::min(sizes[k], need - 1));
                break;
            }
            case Corruption::workspace_overlaps: {
                // A workspace large enough for the call whose memory also holds the output (k 0, 1), the query
                // (k 2) or the key padding mask (k 3), at its start (k even) or its end (k odd).
                mha::ForwardOptions simd_opt = opt;
                simd_opt.backend = mha::Backend::simd;
                const std::size_t room = attention.workspace_bytes(in, simd_opt) / sizeof(float) + 64;
                if (k == 3) ensure_key_padding();
                const bool bools = k == 3 && kpm.type == mha::MaskType::boolean;
                const void* from = k < 2 ? static_cast<const void*>(output->buf.data())
                                   : k == 2 ? static_cast<const void*>(query->buf.data())
                                   : bools  ? static_cast<const void*>(kpm.bools.data())
                                            : static_cast<const void*>(kpm.values.data());
                const std::size_t bytes = k < 2 ? output->buf.size() * sizeof(float)
                                          : k == 2 ? query->buf.size() * sizeof(float)
                                          : bools  ? kpm.bools.size()
                                                   : kpm.values.size() * sizeof(float);
                const std::size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
                arena.assign(room + floats, kSentinel);
                float* at = arena.data() + ((k & 1) ? room : 0);
                std::memcpy(at, from, bytes);
                if (k < 2) {
                    out.output.data = at;
                } else if (k == 2) {
                    in.query.data = at;
                    if (c.kv_mode == 3) in.key = in.value = in.query;
                } else if (bools) {
                    in.key_padding_mask.bools = reinterpret_cast<const std::uint8_t*>(at);
                } else {
                    in.key_padding_mask.values = at;
                }
                workspace.emplace(static_cast<void*>(arena.data()), arena.size() * sizeof(float));
                break;
            }
            case Corruption::position_past_2_53: {  // RoPE layers (decode made sure)
                const std::size_t L = std::max(p.Lq, p.Lk);
                if (k < 2) {
                    opt.positions = nullptr;
                    opt.position_offset = k == 0 ? kMaxPosition - L + 1 : std::numeric_limits<std::size_t>::max() - p.Lq;
                } else {
                    ensure_positions();
                    positions[k == 2 ? p.B - 1 : 0] = k == 2 ? kMaxPosition - L + 1 : std::numeric_limits<std::size_t>::max();
                }
                break;
            }
            case Corruption::bottom_right_negative_start: {  // RoPE, Lq > Lk (decode made sure)
                opt.causal_alignment = mha::CausalAlignment::bottom_right;
                const std::size_t bad = (k & 2) ? 0 : p.Lq - p.Lk - 1;
                if ((k & 1) == 0) {
                    opt.positions = nullptr;
                    opt.position_offset = bad;
                } else {
                    ensure_positions();
                    positions[p.B - 1] = bad;
                }
                break;
            }
            case Corruption::features_not_kdim:
                if (p.kdim != p.E && (k & 1)) {
                    in.key = {};  // key = query: E features, not kdim
                } else if (p.vdim != p.E && !(k & 1)) {
                    in.value = in.query;  // E features, not vdim
                } else {
                    // Fewer features than the layer's (a view that stays inside its buffer), or one more if E == 1.
                    mha::ConstBatch& v = (k & 1) ? in.value : in.key;
                    if (v.data == nullptr) v = (k & 1) && in.key.data ? in.key : in.query;
                    v.cols = v.cols > 1 ? v.cols - 1 : v.cols + 1;
                }
                break;
        }
    }
};

// The oracle's bounds are relative; float exp underflows (xsimd flushes to 0 below e^-87.9, std::exp
// goes through denormals), which costs up to FLT_MIN absolute per probability (the softmax sum is
// >= 1, so the division does not amplify it). In an output: ≤ Lk·FLT_MIN·max|v|·max_r Σ_t|Wo_rt|,
// with the decoded ranges (|v| ≤ 32·4·√E < 2e3 after projection, Σ|Wo| ≤ 4·√E < 50) below Lk·1e5·FLT_MIN.
// (decoder_oracle.hpp's layer_double adds this term itself, from the problem's values.)
constexpr double kFltMin = std::numeric_limits<float>::min();

void check_close(float got, double expected, double tol, const char* what, const char* backend, std::size_t index) {
    if (!(std::abs(double(got) - expected) <= tol)) {
        char line[200];
        std::snprintf(line, sizeof line, "%s %s[%zu] = %.9g, expected %.17g ± %.3g", backend, what, index, double(got),
                      expected, tol);
        fail(line);
    }
}

void check_valid(const Case& c, const mha::MultiheadAttention& attention, const mha_test::Expected& ex, mha::Backend backend,
                 int threads, bool use_workspace, std::vector<float>* output_bits) {
    const fuzz_oracle::LayerProblem& p = c.lp;
    const char* name = backend == mha::Backend::simd ? "simd" : "scalar";
    Call call(c, attention, backend, threads, use_workspace);
    call.run(attention);
    const Strided& o = *call.output;
    for (std::size_t flat = 0; flat < o.buf.size(); ++flat)
        if (!o.in_view(flat) && !same_bits(o.buf[flat], kSentinel))
            fail(std::string(name) + " wrote output padding at buffer index " + std::to_string(flat));
    for (std::size_t b = 0; b < p.B; ++b)
        for (std::size_t i = 0; i < p.Lq; ++i)
            for (std::size_t e = 0; e < p.E; ++e) {
                const std::size_t at = (b * p.Lq + i) * p.E + e;
                check_close(o.at(b, i, e), ex.output[at], ex.output_tol[at] + double(p.Lk) * 1e5 * kFltMin, "output", name, at);
            }
    if (c.need != mha::NeedWeights::none) {
        const auto& w = c.need == mha::NeedWeights::per_head ? ex.probs : ex.averaged;
        const auto& t = c.need == mha::NeedWeights::per_head ? ex.probs_tol : ex.averaged_tol;
        for (std::size_t i = 0; i < w.size(); ++i) check_close(call.weights[i], w[i], t[i] + kFltMin, "attn_weights", name, i);
    }
    if (output_bits) {
        output_bits->assign(o.buf.begin(), o.buf.end());
        output_bits->insert(output_bits->end(), call.weights.begin(), call.weights.end());
    }
}

void check_invalid(const Case& c, const mha::MultiheadAttention& attention, mha::Backend backend) {
    Call call(c, attention, backend, c.threads_a, false);
    const std::vector<float> output_before = call.output->buf, weights_before = call.weights, arena_before = call.arena;
    auto unchanged = [](const std::vector<float>& now, const std::vector<float>& before) {
        return now.size() == before.size() && (before.empty() || std::memcmp(now.data(), before.data(), before.size() * sizeof(float)) == 0);
    };
    try {
        call.run(attention);
    } catch (const mha::invalid_argument& e) {
        if (std::getenv("MHA_FUZZ_VERBOSE")) std::fprintf(stderr, "rejected: %s\n", e.what());
        if (!unchanged(call.output->buf, output_before) || !unchanged(call.weights, weights_before) ||
            !unchanged(call.arena, arena_before))
            fail("forward threw but wrote to the outputs first (corruption " + std::to_string(int(c.corruption)) + ")");
        return;
    }
    fail(std::string("forward accepted an invalid call (corruption ") + std::to_string(int(c.corruption)) + "/" +
         std::to_string(c.corruption_detail) + ", " + (backend == mha::Backend::simd ? "simd" : "scalar") + ")");
}

// Decoder constructor corruptions: the constructor must throw mha::invalid_argument.
void check_constructor_rejects(const Case& c) {
    const fuzz_oracle::LayerProblem& p = c.lp;
    const int k = c.corruption_detail;
    mha::AttentionWeights w = decoder_weights(c);
    mha::AttentionConfig cfg = c.config;
    const std::size_t qw = p.H * p.d, kvw = p.Hkv * p.d;
    // A packed [Wq; Wk; Wv] of the layer's size with embed_dim columns, and a stacked bias, for the kinds that add one.
    const std::vector<float> packed((qw + 2 * kvw) * p.E, 0.25f), packed_bias(qw + 2 * kvw, 0.5f);
    auto ensure_rope = [&] {
        if (!cfg.rope) cfg.rope = mha::RopeConfig{10000.0f, p.d / 2 * 2, mha::RopeStyle::half};  // valid when d >= 2
    };
    switch (c.corruption) {
        case Corruption::heads_do_not_divide: {  // num_kv_heads not dividing num_heads
            std::size_t non_divisor = p.H + 1;
            for (std::size_t h = 2; h < p.H; ++h)
                if (p.H % h != 0) {
                    non_divisor = h;
                    break;
                }
            const std::size_t bad[] = {p.H + 1, non_divisor, 2 * p.H, p.H + 7};
            cfg.num_kv_heads = bad[k];
            break;
        }
        case Corruption::rope_dims_bad: {
            ensure_rope();
            const std::size_t d = p.d;
            const std::size_t bad[] = {d % 2 ? d : d - 1, 1, d % 2 ? d + 1 : d + 2, d % 2 ? 0 : d + 1};  // odd, or even > d
            cfg.rope->dims = bad[k];
            break;
        }
        case Corruption::rope_theta_bad: {
            ensure_rope();
            const float bad[] = {0.0f, -10000.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
            cfg.rope->theta = bad[k];
            break;
        }
        case Corruption::rope_style_bad:
            ensure_rope();
            cfg.rope->style = static_cast<mha::RopeStyle>(2 + k);
            break;
        case Corruption::packed_and_separate:
            if (!w.in_proj_weight) w.in_proj_weight = packed.data();
            if (k == 0 || k == 3) w.q_proj_weight = p.wq.data();
            if (k == 1 || k == 3) w.k_proj_weight = p.wk.data();
            if (k == 2 || k == 3) w.v_proj_weight = p.wv.data();
            break;
        case Corruption::packed_with_kdim:
            w.q_proj_weight = w.k_proj_weight = w.v_proj_weight = nullptr;
            if (!w.in_proj_weight) w.in_proj_weight = packed.data();
            if (p.kdim == p.E && p.vdim == p.E) {
                if (k & 1) cfg.vdim = p.E + 1 + std::size_t(k); else cfg.kdim = p.E + 1 + std::size_t(k);
            }
            break;
        case Corruption::separate_weight_missing:
            w.in_proj_weight = nullptr;
            w.q_proj_weight = k == 0 || k == 3 ? nullptr : p.wq.data();
            w.k_proj_weight = k == 1 || k == 3 ? nullptr : p.wk.data();
            w.v_proj_weight = k == 2 || k == 3 ? nullptr : p.wv.data();
            break;
        case Corruption::bias_both_kinds:
            if (!w.in_proj_bias) w.in_proj_bias = packed_bias.data();
            if (k == 0 || k == 3) w.q_proj_bias = packed_bias.data();
            if (k == 1) w.k_proj_bias = packed_bias.data();
            if (k == 2) w.v_proj_bias = packed_bias.data();
            break;
        case Corruption::head_dim_default_indivisible:
            cfg.head_dim = 0;
            if (p.E % p.H == 0) cfg.num_heads = p.E + 1, cfg.num_kv_heads = 0;  // E % (E + 1) = E
            break;
        case Corruption::out_proj_null:
            w.out_proj_weight = nullptr;
            break;
        default:
            fail("not a constructor corruption");
    }
    try {
        const mha::MultiheadAttention attention(w, cfg);
    } catch (const mha::invalid_argument& e) {
        if (std::getenv("MHA_FUZZ_VERBOSE")) std::fprintf(stderr, "rejected: %s\n", e.what());
        return;
    }
    fail("constructor accepted an invalid configuration (corruption " + std::to_string(int(c.corruption)) + "/" +
         std::to_string(k) + ")");
}

// One line describing a case, printed for a failing input when MHA_FUZZ_VERBOSE is set:
//   MHA_FUZZ_VERBOSE=1 build-fuzz/fuzz/fuzz_attention <crash file>
void print_case(const Case& c) {
    const fuzz_oracle::LayerProblem& p = c.lp;
    char eps[32] = "none";
    if (p.norm_eps) std::snprintf(eps, sizeof eps, "%g", double(*p.norm_eps));
    std::fprintf(stderr,
                 "case: %s isa %s B %zu Lq %zu Lk %zu E %zu H %zu kv_mode %d pads q %zu/%zu k %zu/%zu v %zu/%zu o %zu/%zu "
                 "null biases %d/%d kpm %d am %d/rank %d causal %d need %d norm %s impl %d threads %d/%d workspace %d "
                 "poison %d corruption %d/%d\n",
                 c.decoder ? "decoder" : "classic", std::string(mha::isa_name(mha::active_isa())).c_str(), p.B, p.Lq, p.Lk,
                 p.E, p.H, c.kv_mode, c.pad[0][0], c.pad[0][1], c.pad[1][0], c.pad[1][1], c.pad[2][0], c.pad[2][1],
                 c.pad[3][0], c.pad[3][1], c.null_in_bias, c.null_out_bias, int(p.key_padding_mask.type),
                 int(p.attn_mask.type), p.attn_mask.rank, p.causal, int(c.need), eps, int(c.impl), c.threads_a,
                 c.threads_b, c.workspace_b, c.poison, int(c.corruption), c.corruption_detail);
    if (!c.decoder) return;
    std::string positions;
    for (std::size_t s : p.positions) positions += " " + std::to_string(s);
    std::fprintf(stderr,
                 "decoder: Hkv %zu d %zu kdim %zu vdim %zu (config Hkv %zu head_dim %zu kdim %zu vdim %zu) packed %d "
                 "bias kind %d q/k/v/o %d%d%d%d rope %s theta %g dims %zu (config %zu) alignment %s offset %zu positions [%s ]\n",
                 p.Hkv, p.d, p.kdim, p.vdim, c.config.num_kv_heads, c.config.head_dim, c.config.kdim, c.config.vdim,
                 c.packed_weights, c.bias_kind, !p.bq.empty(), !p.bk.empty(), !p.bv.empty(), !p.bo.empty(),
                 !p.rope ? "off" : p.rope->style == mha::RopeStyle::half ? "half" : "interleaved",
                 p.rope ? double(p.rope->theta) : 0.0, p.rope ? p.rope->dims : 0, c.config.rope ? c.config.rope->dims : 0,
                 p.alignment == mha::CausalAlignment::top_left ? "top_left" : "bottom_right", p.position_offset,
                 positions.c_str());
}

// MHA_FUZZ_ORACLE_CHECK=1: for classic problems, also checks decoder_oracle.hpp's layer_double against
// attention_double (a self-test of the decoder oracle on the shapes both cover).
void cross_check_oracles(const Case& c, const mha_test::Expected& classic) {
    const mha_test::Expected ex = fuzz_oracle::layer_double(c.lp);
    auto agree = [](const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& ta,
                    const std::vector<double>& tb, const char* what) {
        if (a.size() != b.size()) fail(std::string("oracles disagree on the size of ") + what);
        for (std::size_t i = 0; i < a.size(); ++i) {
            if (!(std::abs(a[i] - b[i]) <= 1e-9 * (1.0 + std::abs(a[i]))))
                fail(std::string("oracles disagree on ") + what + "[" + std::to_string(i) + "]: " + std::to_string(a[i]) +
                     " vs " + std::to_string(b[i]));
            if (!(tb[i] >= ta[i] * (1 - 1e-9) && tb[i] <= ta[i] * 1.01 + 1e-25))
                fail(std::string("oracles' tolerances disagree on ") + what + "[" + std::to_string(i) + "]: " +
                     std::to_string(ta[i]) + " vs " + std::to_string(tb[i]));
        }
    };
    agree(classic.output, ex.output, classic.output_tol, ex.output_tol, "output");
    agree(classic.probs, ex.probs, classic.probs_tol, ex.probs_tol, "probs");
    agree(classic.averaged, ex.averaged, classic.averaged_tol, ex.averaged_tol, "averaged");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider provider(data, size);
    const Case c = decode(provider);
    if (std::getenv("MHA_FUZZ_VERBOSE")) print_case(c);

    std::optional<mha::MultiheadAttention> built;
    if (!c.decoder) {
        const mha_test::Problem& p = c.p;
        mha::AttentionWeights w = p.weights();
        if (c.null_in_bias) w.in_proj_bias = nullptr;
        if (c.null_out_bias) w.out_proj_bias = nullptr;
        if (c.corruption == Corruption::heads_do_not_divide) {
            const std::size_t bad_heads[] = {p.E + 1, 0, 2 * p.E, p.E + 7};
            try {
                const mha::MultiheadAttention attention(w, p.E, bad_heads[c.corruption_detail]);
            } catch (const mha::invalid_argument&) {
                return 0;
            }
            fail("constructor accepted num_heads " + std::to_string(bad_heads[c.corruption_detail]) + " for embed_dim " +
                 std::to_string(p.E));
        }
        built.emplace(w, p.E, p.H);
    } else {
        if (constructor_corruption(c.corruption)) {
            check_constructor_rejects(c);
            return 0;
        }
        built.emplace(decoder_weights(c), c.config);
    }
    const mha::MultiheadAttention& attention = *built;
    if (c.corruption != Corruption::none) {
        if (c.corruption != Corruption::workspace_too_small) check_invalid(c, attention, mha::Backend::scalar);
        check_invalid(c, attention, mha::Backend::simd);
        return 0;
    }

    const mha_test::Expected ex = c.decoder ? fuzz_oracle::layer_double(c.lp) : oracle_attention(c.p);
    if (!c.decoder && std::getenv("MHA_FUZZ_ORACLE_CHECK")) cross_check_oracles(c, ex);
    check_valid(c, attention, ex, mha::Backend::scalar, c.threads_a, false, nullptr);
    std::vector<float> bits_a, bits_b;
    check_valid(c, attention, ex, mha::Backend::simd, c.threads_a, false, &bits_a);
    check_valid(c, attention, ex, mha::Backend::simd, c.threads_b, c.workspace_b, &bits_b);
    if (std::memcmp(bits_a.data(), bits_b.data(), bits_a.size() * sizeof(float)) != 0)
        fail("simd results differ between " + std::to_string(c.threads_a) + " and " + std::to_string(c.threads_b) +
             " threads" + (c.workspace_b ? " (the second in a caller's workspace)" : ""));
    return 0;
}
