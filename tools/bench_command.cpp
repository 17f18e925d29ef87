// `mha bench`: times one op of the public API on random inputs (fixed seed): one warm-up call, then
// `reps` timed calls (std::chrono::steady_clock); reports the median and minimum time and the rate
// at the median time:
//   attention  query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim]; H heads, Hkv KV heads, head dim d
//              gflops = (2·B·(Lq·E·H·d + Lk·(kdim + vdim)·Hkv·d + Lq·H·d·E) + 4·B·H·Lq·Lk·d) / t
//              (projections q, k and v, out; then scores and P·V). nn.MultiheadAttention's shape (Hkv = H,
//              H·d = E = kdim = vdim) gives (4·B·E²·(Lq+Lk) + 4·B·Lq·Lk·E) / t. Causal does not change the count.
//   sdpa       q [B, H, Lq, d], k and v [B, Hkv, Lk, d]
//              gflops = 4·B·H·d·(pairs (i, j) computed) / t: Lq·Lk pairs, or with --causal only the visible
//              ones, Σ_i min(Lk, max(0, i + 1 + Lk − Lq)) (bottom-right aligned; the same as top-left when
//              Lq = Lk); JSON "flops_counted": "all pairs" / "visible pairs"
//              gbps   = K and V read once per call: 2·B·Hkv·Lk·d·4 bytes / t
//   decode     one decode step of the layer with a KV cache: B sequences of Lk cached tokens (random K/V
//              appended to a mha::KVCache of capacity Lk + Lq), Lq new tokens each (default 1): projections,
//              RoPE (with --rope-theta), append, attention over Lk + Lq keys, output projection. Before each
//              call (outside the timed region) every sequence is truncated back to Lk, so each call appends the
//              same Lq tokens. Self-attention; separate q/k/v weights unless H = Hkv and H·d = E (packed).
//              gflops = (2·B·Lq·(E·H·d + 2·E·Hkv·d + H·d·E) + 4·B·H·Lq·(Lk + Lq)·d) / t
//              gbps   = (weight bytes + K/V cache bytes read) / t, weight bytes = MultiheadAttention::weight_bytes_read()
//                       (packed projections with their padding, biases), cache bytes = 2·B·Hkv·(Lk + Lq)·d·4
//   step       one serving step over a mha::PagedKVCache (MultiheadAttention::forward_step): --decode-seqs N
//              sequences of --kv-seq LK cached keys (--ragged: evenly spaced from LK/2 to 3·LK/2) with one new
//              token each, and --prefill-seqs P chunks of --prefill-len LQ tokens on --prefill-past LP cached
//              keys, T = N + P·LQ tokens in one call; before each call every sequence is truncated back to its
//              cached keys (outside the timed region). --core-only times mha::paged_attention alone on the
//              step's queries [T, H·d] over the same pool (keys of the new tokens already written).
//              gflops = (2·T·(E·H·d + 2·E·Hkv·d + H·d·E) + 4·H·d·Σ visible pairs) / t (core-only: the pairs)
//              gbps   = (weight bytes + K/V bytes read: 2·Hkv·d·Σ keys·element bytes) / t (core-only: K/V)
//              JSON: "tokens" T, "kv_blocks" the blocks in use, "path" decode / grouped / materialized when
//              every sequence takes it, else "mixed"
//   gemm       C[m, n] = A[m, k]·B[n, k]ᵀ        gflops = 2·m·n·k / t
//   softmax    [rows, cols] in place              gbps   = 2·rows·cols·4 bytes / t   (read + write)
//   layernorm  [rows, cols] → [rows, cols]        gbps   = 2·rows·cols·4 bytes / t
// The kernels are single-threaded, so gemm/softmax/layernorm accept only --threads 1.
// attention, sdpa and decode report "path": the path the call takes (MultiheadAttention::path, sdpa_path:
// scalar, materialized, grouped or decode).
// --dtype f32|bf16 (attention, decode, gemm) is the compute type (AttentionConfig::compute); JSON "dtype". "isa" names
// the kernels that ran: the active ISA's fp32 level (avx512_bf16 runs avx512's, neon_bf16 neon's), except bf16 on a
// level with bf16 kernels (avx512_bf16: vdpbf16ps); elsewhere bf16 is widened to the fp32 kernels.
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"

namespace mha::tool {

namespace {

struct Timing {
    double median_ms = 0;
    double min_ms = 0;
};

// prepare() runs before each call, outside the timed region.
template <class F, class P>
Timing time_calls(int reps, F&& call, P&& prepare) {
    prepare();
    call();  // warm-up: page faults, caches, one-time setup
    std::vector<double> ms;
    ms.reserve(static_cast<std::size_t>(reps));
    for (int r = 0; r < reps; ++r) {
        prepare();
        const auto t0 = std::chrono::steady_clock::now();
        call();
        const auto t1 = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const std::size_t n = ms.size();
    return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
}

template <class F>
Timing time_calls(int reps, F&& call) {
    return time_calls(reps, call, [] {});
}

// Product of the sizes, or a tool_error naming the buffer when it does not fit in size_t.
std::size_t count_of(const char* what, std::initializer_list<std::size_t> dims) {
    std::size_t n = 1;
    for (std::size_t d : dims)
        if (__builtin_mul_overflow(n, d, &n)) throw tool_error(std::string("the size of ") + what + " overflows size_t");
    return n;
}

std::vector<float> random_values(std::size_t n, float amplitude, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-amplitude, amplitude);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// A layer with random weights that keep the projections O(1): nn.MultiheadAttention's packed in_proj_weight
// for its shape (Hkv = H, H·d = E, kdim = vdim = E), the separate q/k/v weights otherwise; biases present.
// The weights are packed by the constructor, so the vectors may go.
MultiheadAttention random_layer(std::size_t E, std::size_t H, std::size_t Hkv, std::size_t d, std::size_t kdim,
                                std::size_t vdim, std::optional<float> rope_theta, DataType compute, std::mt19937& rng,
                                const ScoreModifiers& modifiers) {
    const std::size_t Hd = count_of("H·d", {H, d}), Hkvd = count_of("Hkv·d", {Hkv, d});
    const bool packed = Hkv == H && Hd == E && kdim == E && vdim == E;
    const float w_amp = 1.0f / std::sqrt(static_cast<float>(E));
    const float k_amp = 1.0f / std::sqrt(static_cast<float>(kdim)), v_amp = 1.0f / std::sqrt(static_cast<float>(vdim));
    std::vector<float> in_w, q_w, k_w, v_w;
    if (packed) {
        in_w = random_values(count_of("in_proj_weight", {3, E, E}), w_amp, rng);
    } else {
        q_w = random_values(count_of("q_proj_weight", {Hd, E}), w_amp, rng);
        k_w = random_values(count_of("k_proj_weight", {Hkvd, kdim}), k_amp, rng);
        v_w = random_values(count_of("v_proj_weight", {Hkvd, vdim}), v_amp, rng);
    }
    const std::vector<float> in_b = random_values(Hd + 2 * Hkvd, w_amp, rng);
    const std::vector<float> out_w = random_values(count_of("out_proj_weight", {E, Hd}), 1.0f / std::sqrt(float(Hd)), rng);
    const std::vector<float> out_b = random_values(E, w_amp, rng);
    AttentionWeights w;
    w.in_proj_weight = packed ? in_w.data() : nullptr;
    w.q_proj_weight = packed ? nullptr : q_w.data();
    w.k_proj_weight = packed ? nullptr : k_w.data();
    w.v_proj_weight = packed ? nullptr : v_w.data();
    w.in_proj_bias = in_b.data();
    w.out_proj_weight = out_w.data();
    w.out_proj_bias = out_b.data();
    AttentionConfig config;
    config.embed_dim = E;
    config.num_heads = H;
    config.num_kv_heads = Hkv;
    config.head_dim = d;
    config.kdim = kdim;
    config.vdim = vdim;
    config.compute = compute;
    config.modifiers = modifiers;
    if (rope_theta) {
        RopeConfig rope;
        rope.theta = *rope_theta;
        config.rope = rope;
    }
    return MultiheadAttention(w, config);
}

// The score modifiers of --window-left/--window-right/--softcap/--alibi/--sinks for H heads (sinks random in
// [-1, 1]); the view points into the vectors.
struct BenchModifiers {
    std::vector<float> sinks, slopes;
    ScoreModifiers view;
    BenchModifiers(const ModifierOptions& o, std::size_t H, std::mt19937& rng) {
        view.window_left = o.window_left.value_or(-1), view.window_right = o.window_right.value_or(-1);
        view.softcap = o.softcap.value_or(0.0f);
        if (o.sinks) sinks = random_values(H, 1.0f, rng), view.sinks = sinks.data();
        if (o.alibi) slopes = alibi_standard_slopes(H), view.alibi_slopes = slopes.data();
    }
    // The keys [lo, hi] the query at position p of a sequence of n keys sees (causal: hi <= p); empty: lo > hi.
    std::pair<double, double> span(double p, double n, bool causal) const {
        double lo = 0, hi = causal ? std::min(p, n - 1) : n - 1;
        if (view.window_left >= 0) lo = std::max(lo, p - double(view.window_left));
        if (view.window_right >= 0) hi = std::min(hi, p + double(view.window_right));
        return {lo, hi};
    }
    double visible(double p, double n, bool causal) const {
        const auto [lo, hi] = span(p, n, causal);
        return std::max(0.0, hi - lo + 1);
    }
    // Keys read by Lq queries at positions n − Lq .. n − 1 (causal): the union of their spans.
    double keys_read(double lq, double n) const {
        const double lo = span(n - lq, n, true).first, hi = n - 1;
        return std::max(0.0, hi - lo + 1);
    }
    void describe(nlohmann::ordered_json& j, std::string& shape) const {
        if (!view.any()) return;
        j["window_left"] = view.window_left, j["window_right"] = view.window_right, j["softcap"] = view.softcap;
        j["alibi"] = !slopes.empty(), j["sinks"] = !sinks.empty();
        if (view.window()) shape += " window=(" + std::to_string(view.window_left) + "," + std::to_string(view.window_right) + ")";
        if (view.softcap > 0) shape += " softcap=" + std::to_string(view.softcap);
        if (!slopes.empty()) shape += " alibi";
        if (!sinks.empty()) shape += " sinks";
    }
};

const char* op_name(BenchOp op) {
    switch (op) {
        case BenchOp::attention: return "attention";
        case BenchOp::sdpa: return "sdpa";
        case BenchOp::decode: return "decode";
        case BenchOp::step: return "step";
        case BenchOp::gemm: return "gemm";
        case BenchOp::softmax: return "softmax";
        case BenchOp::layernorm: return "layernorm";
    }
    return "?";
}

// --k-scale / --v-scale take an fp8 --kv-type.
void check_scales(const BenchOptions& opt) {
    if ((opt.k_scale != 1.0f || opt.v_scale != 1.0f) && !has_tensor_scale(opt.kv_type))
        throw tool_error("--k-scale / --v-scale apply only to an fp8 KV cache (--kv-type fp8_e4m3 or fp8_e5m2), not " +
                         std::string(data_type_name(opt.kv_type)));
}

const char* impl_name(Algorithm impl) {
    switch (impl) {
        case Algorithm::automatic: return "auto";
        case Algorithm::materialized: return "materialized";
        case Algorithm::fused: return "fused";
    }
    return "?";
}

}  // namespace

void bench_command(const BenchOptions& opt) {
    const bool kernel = opt.op != BenchOp::attention && opt.op != BenchOp::sdpa && opt.op != BenchOp::decode && opt.op != BenchOp::step;
    if (kernel && opt.threads && *opt.threads != 1)
        throw tool_error("--threads " + std::to_string(*opt.threads) + " is not supported for --op " + op_name(opt.op) +
                         ": the kernels are single-threaded (use --threads 1 or leave it out)");
    // Threads actually used. The kernels and the scalar backend (the plain-loop reference) run on one;
    // the SIMD attention and sdpa run on oneTBB's pool: 0 means all of it, and a larger request is clamped to it.
    const int pool = tbb::this_task_arena::max_concurrency();
    const int requested = opt.threads.value_or(0);
    const int threads = kernel || opt.backend == Backend::scalar ? 1 : requested == 0 ? pool : std::min(requested, pool);

    nlohmann::ordered_json j;
    j["op"] = op_name(opt.op);
    j["backend"] = opt.backend == Backend::scalar ? "scalar" : "simd";
    const Isa kernels = opt.dtype == DataType::bf16 && has_bf16_kernels(active_isa()) ? active_isa() : fp32_kernel_isa(active_isa());
    j["isa"] = opt.backend == Backend::scalar ? std::string("scalar") : std::string(isa_name(kernels));
    j["dtype"] = std::string(data_type_name(opt.dtype));
    j["threads"] = threads;
    j["reps"] = opt.reps;

    std::mt19937 rng(20240607);
    Timing t;
    double flops = 0, bytes = 0;
    std::string shape;
    switch (opt.op) {
        case BenchOp::attention: {
            const std::size_t L = opt.seq.value_or(128);
            const std::size_t B = opt.batch, Lk = opt.kv_seq.value_or(L), E = opt.embed, H = opt.heads;
            const std::size_t Hkv = opt.kv_heads.value_or(H);
            if (!opt.head_dim && E % H != 0)
                throw tool_error("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H) +
                                 " (the head dim defaults to --embed / --heads; give --head-dim)");
            const std::size_t d = opt.head_dim.value_or(E / H);
            const std::size_t kdim = opt.kdim.value_or(E), vdim = opt.vdim.value_or(kdim);
            const std::size_t Hd = count_of("H·d", {H, d}), Hkvd = count_of("Hkv·d", {Hkv, d});
            // nn.MultiheadAttention's shape (random_layer packs its in_proj_weight): the readable line omits kdim/vdim.
            const bool packed = Hkv == H && Hd == E && kdim == E && vdim == E;
            const std::vector<float> query = random_values(count_of("query", {B, L, E}), 1.0f, rng);
            // Self-attention (key = value = query) unless the lengths or widths differ.
            const bool own_key = Lk != L || kdim != E, own_value = vdim != kdim;
            const std::vector<float> key = own_key ? random_values(count_of("key", {B, Lk, kdim}), 1.0f, rng) : std::vector<float>{};
            const std::vector<float> value =
                own_value ? random_values(count_of("value", {B, Lk, vdim}), 1.0f, rng) : std::vector<float>{};
            std::vector<float> output(query.size());
            const BenchModifiers mods(opt.modifiers, H, rng);
            const MultiheadAttention attention = random_layer(E, H, Hkv, d, kdim, vdim, opt.rope_theta, opt.dtype, rng, mods.view);
            AttentionInputs in;
            in.query = ConstBatch(query.data(), B, L, E);
            if (own_key) in.key = ConstBatch(key.data(), B, Lk, kdim);  // cross-attention; else self-attention
            if (own_value) in.value = ConstBatch(value.data(), B, Lk, vdim);
            AttentionOutputs out;
            out.output = Batch(output.data(), B, L, E);
            ForwardOptions fo;
            fo.causal = opt.causal;
            fo.backend = opt.backend;
            fo.threads = opt.threads.value_or(0);
            fo.impl = opt.impl;
            t = time_calls(opt.reps, [&] { attention.forward(in, out, fo); });
            const AttentionPath path = attention.path(in, fo);
            const double b = double(B), l = double(L), lk = double(Lk), e = double(E), hd = double(Hd), hkvd = double(Hkvd);
            // Score pairs: all (causal or not, as before), or with a window the visible ones.
            double pairs = l * lk;
            if (mods.view.window()) {
                pairs = 0;
                for (std::size_t i = 0; i < L; ++i) pairs += mods.visible(double(i), lk, opt.causal);
                j["flops_counted"] = "visible pairs";
            }
            flops = 2 * b * (l * e * hd + lk * (double(kdim) + double(vdim)) * hkvd + l * hd * e) + 4 * b * pairs * hd;
            j["impl"] = impl_name(opt.impl);
            j["path"] = std::string(attention_path_name(path));
            j["causal"] = opt.causal;
            j["batch"] = B, j["seq"] = L, j["kv_seq"] = Lk, j["embed"] = E, j["heads"] = H;
            j["kv_heads"] = Hkv, j["head_dim"] = d, j["kdim"] = kdim, j["vdim"] = vdim;
            j["rope_theta"] = opt.rope_theta ? nlohmann::ordered_json(*opt.rope_theta) : nlohmann::ordered_json(nullptr);
            shape = "batch=" + std::to_string(B) + " seq=" + std::to_string(L) + " kv_seq=" + std::to_string(Lk) +
                    " embed=" + std::to_string(E) + " heads=" + std::to_string(H) + " kv_heads=" + std::to_string(Hkv) +
                    " head_dim=" + std::to_string(d) + (packed ? "" : " kdim=" + std::to_string(kdim) + " vdim=" + std::to_string(vdim)) +
                    (opt.rope_theta ? " rope_theta=" + std::to_string(*opt.rope_theta) : "") + " impl=" + impl_name(opt.impl) +
                    (opt.causal ? " causal" : "");
            mods.describe(j, shape);
            break;
        }
        case BenchOp::sdpa: {
            const std::size_t Lq = opt.seq.value_or(128);
            const std::size_t B = opt.batch, Lk = opt.kv_seq.value_or(Lq), H = opt.heads;
            const std::size_t Hkv = opt.kv_heads.value_or(H), d = opt.head_dim.value_or(64);
            const std::vector<float> q = random_values(count_of("q", {B, H, Lq, d}), 1.0f, rng);
            const std::vector<float> k = random_values(count_of("k", {B, Hkv, Lk, d}), 1.0f, rng);
            const std::vector<float> v = random_values(count_of("v", {B, Hkv, Lk, d}), 1.0f, rng);
            std::vector<float> output(q.size());
            SdpaInputs in;
            in.query = ConstHeads::bhld(q.data(), B, H, Lq, d);
            in.key = ConstHeads::bhld(k.data(), B, Hkv, Lk, d);
            in.value = ConstHeads::bhld(v.data(), B, Hkv, Lk, d);
            const Heads out = Heads::bhld(output.data(), B, H, Lq, d);
            SdpaOptions so;
            so.causal = opt.causal;
            so.causal_alignment = CausalAlignment::bottom_right;  // the same as top-left when Lq == Lk
            so.backend = opt.backend;
            so.threads = opt.threads.value_or(0);
            so.impl = opt.impl;
            const BenchModifiers mods(opt.modifiers, H, rng);
            so.modifiers = mods.view;
            t = time_calls(opt.reps, [&] { scaled_dot_product_attention(in, out, so); });
            const AttentionPath path = sdpa_path(in, so);
            // Pairs (i, j) whose score is computed: all, or with causal those with j <= i + Lk − Lq.
            // With a window: those inside it (query i at position i + Lk − Lq).
            // K/V bytes: the keys some query sees (all, or with a window the union of the windows).
            double pairs = double(Lq) * double(Lk), first = 0, last = double(Lk) - 1;
            if (opt.causal || mods.view.window()) {
                pairs = 0, first = double(Lk), last = -1;
                for (std::size_t i = 0; i < Lq; ++i) {  // exact: all below 2^53
                    const double p = double(i) + double(Lk) - double(Lq);
                    const auto [lo, hi] = mods.span(p, double(Lk), opt.causal);
                    pairs += mods.visible(p, double(Lk), opt.causal);
                    if (lo <= hi) first = std::min(first, lo), last = std::max(last, hi);
                }
            }
            flops = 4.0 * double(B) * double(H) * double(d) * pairs;
            bytes = 2.0 * double(B) * double(Hkv) * std::max(0.0, last - first + 1) * double(d) * sizeof(float);
            j["impl"] = impl_name(opt.impl);
            j["path"] = std::string(attention_path_name(path));
            j["causal"] = opt.causal;
            j["batch"] = B, j["heads"] = H, j["kv_heads"] = Hkv, j["head_dim"] = d, j["seq"] = Lq, j["kv_seq"] = Lk;
            j["flops_counted"] = opt.causal || mods.view.window() ? "visible pairs" : "all pairs";
            shape = "batch=" + std::to_string(B) + " heads=" + std::to_string(H) + " kv_heads=" + std::to_string(Hkv) +
                    " head_dim=" + std::to_string(d) + " seq=" + std::to_string(Lq) + " kv_seq=" + std::to_string(Lk) +
                    " impl=" + impl_name(opt.impl) + (opt.causal ? " causal" : "");
            mods.describe(j, shape);
            break;
        }
        case BenchOp::decode: {
            const std::size_t B = opt.batch, Lq = opt.seq.value_or(1), Lk = opt.kv_seq.value_or(1024), E = opt.embed, H = opt.heads;
            const std::size_t Hkv = opt.kv_heads.value_or(H);
            if (!opt.head_dim && E % H != 0)
                throw tool_error("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H) +
                                 " (the head dim defaults to --embed / --heads; give --head-dim)");
            const std::size_t d = opt.head_dim.value_or(E / H);
            const std::size_t Hd = count_of("H·d", {H, d}), Hkvd = count_of("Hkv·d", {Hkv, d});
            std::size_t capacity = 0;
            if (__builtin_add_overflow(Lk, Lq, &capacity)) throw tool_error("--kv-seq + --seq overflows size_t");
            const std::vector<float> query = random_values(count_of("query", {B, Lq, E}), 1.0f, rng);
            std::vector<float> output(query.size());
            const BenchModifiers mods(opt.modifiers, H, rng);
            const MultiheadAttention attention = random_layer(E, H, Hkv, d, E, E, opt.rope_theta, opt.dtype, rng, mods.view);
            // The cached tokens: random K and V, Lk rows per (sequence, KV head), appended sequence by sequence.
            check_scales(opt);
            KVCache cache(B, Hkv, d, capacity, opt.kv_type, opt.k_scale, opt.v_scale);
            {
                const std::vector<float> k = random_values(count_of("the cached keys", {Hkv, Lk, d}), 1.0f, rng);
                const std::vector<float> v = random_values(count_of("the cached values", {Hkv, Lk, d}), 1.0f, rng);
                for (std::size_t b = 0; b < B; ++b)
                    cache.append(b, ConstHeads::bhld(k.data(), 1, Hkv, Lk, d), ConstHeads::bhld(v.data(), 1, Hkv, Lk, d));
            }
            AttentionInputs in;
            in.query = ConstBatch(query.data(), B, Lq, E);
            AttentionOutputs out;
            out.output = Batch(output.data(), B, Lq, E);
            ForwardOptions fo;
            fo.backend = opt.backend;
            fo.threads = opt.threads.value_or(0);
            fo.impl = opt.impl;
            const AttentionPath path = attention.path(in, fo, cache);  // the cache holds Lk tokens, as in each call
            t = time_calls(
                opt.reps, [&] { attention.forward(in, out, fo, cache); },
                [&] {
                    for (std::size_t b = 0; b < B; ++b) cache.truncate(b, Lk);
                });
            const double b = double(B), lq = double(Lq), lk = double(Lk), e = double(E), hd = double(Hd), hkvd = double(Hkvd);
            double pairs = lq * (lk + lq);  // every key per new token, as documented; with a window the visible pairs
            if (mods.view.window()) {
                pairs = 0;
                for (std::size_t i = 0; i < Lq; ++i) pairs += mods.visible(lk + double(i), lk + lq, true);
                j["flops_counted"] = "visible pairs";
            }
            flops = 2 * b * lq * (e * hd + 2 * e * hkvd + hd * e) + 4 * b * pairs * hd;
            const double weight_bytes = double(attention.weight_bytes_read());
            const std::size_t cache_bytes = count_of("the K/V cache", {2, B, Hkv, capacity, kv_row_bytes(opt.kv_type, d)});
            // The cache rows read: all, or with a window those in the union of the new tokens' windows.
            const double read_bytes = double(cache_bytes) * mods.keys_read(lq, lk + lq) / (lk + lq);
            bytes = weight_bytes + read_bytes;
            j["impl"] = impl_name(opt.impl);
            j["path"] = std::string(attention_path_name(path));
            j["batch"] = B, j["kv_seq"] = Lk, j["seq"] = Lq, j["embed"] = E, j["heads"] = H;
            j["kv_heads"] = Hkv, j["head_dim"] = d;
            j["rope_theta"] = opt.rope_theta ? nlohmann::ordered_json(*opt.rope_theta) : nlohmann::ordered_json(nullptr);
            j["weight_bytes"] = attention.weight_bytes_read();
            j["cache_bytes"] = cache_bytes;
            j["kv_type"] = std::string(data_type_name(opt.kv_type));
            shape = "batch=" + std::to_string(B) + " kv_seq=" + std::to_string(Lk) + " seq=" + std::to_string(Lq) +
                    " embed=" + std::to_string(E) + " heads=" + std::to_string(H) + " kv_heads=" + std::to_string(Hkv) +
                    " head_dim=" + std::to_string(d) + (opt.rope_theta ? " rope_theta=" + std::to_string(*opt.rope_theta) : "") +
                    " impl=" + impl_name(opt.impl) + " kv_type=" + std::string(data_type_name(opt.kv_type));
            mods.describe(j, shape);
            break;
        }
        case BenchOp::step: {
            const std::size_t E = opt.embed, H = opt.heads, Hkv = opt.kv_heads.value_or(H), LK = opt.kv_seq.value_or(2048);
            if (!opt.head_dim && E % H != 0)
                throw tool_error("embed_dim " + std::to_string(E) + " is not a multiple of num_heads " + std::to_string(H) +
                                 " (the head dim defaults to --embed / --heads; give --head-dim)");
            const std::size_t d = opt.head_dim.value_or(E / H), N = opt.decode_seqs, P = opt.prefill_seqs;
            if (N + P == 0) throw tool_error("--decode-seqs and --prefill-seqs are both 0: the step has no sequence");
            if (opt.backend == Backend::scalar) throw tool_error("--op step runs the SIMD backend only");
            if (opt.core_only && opt.dtype != DataType::f32)
                throw tool_error("--dtype " + std::string(data_type_name(opt.dtype)) +
                                 " does not apply with --core-only: the attention core (mha::paged_attention) computes in fp32");
            if (opt.core_only && opt.rope_theta)
                throw tool_error("--rope-theta does not apply with --core-only: the attention core takes rotated queries and keys");
            // Per sequence: cached keys and new tokens; decodes first, then the prefill chunks.
            std::vector<std::size_t> past, q_lens;
            for (std::size_t i = 0; i < N; ++i) {
                past.push_back(opt.ragged && N > 1 ? LK / 2 + i * LK / (N - 1) : LK);
                q_lens.push_back(1);
            }
            for (std::size_t i = 0; i < P; ++i) past.push_back(opt.prefill_past), q_lens.push_back(opt.prefill_len);
            const std::size_t n = past.size(), bs = opt.block_size;
            const BenchModifiers mods(opt.modifiers, H, rng);
            std::size_t T = 0, blocks = 0;
            double pairs = 0, keys = 0;  // keys: those read (in some new token's window)
            for (std::size_t i = 0; i < n; ++i) {
                const double len = double(past[i] + q_lens[i]);
                T += q_lens[i];
                blocks += (past[i] + q_lens[i] + bs - 1) / bs;
                keys += mods.keys_read(double(q_lens[i]), len);
                for (std::size_t t = 0; t < q_lens[i]; ++t) pairs += mods.visible(double(past[i] + t), len, true);
            }
            const MultiheadAttention attention = random_layer(E, H, Hkv, d, E, E, opt.rope_theta, opt.dtype, rng, mods.view);
            check_scales(opt);
            PagedKVCache cache(blocks, bs, Hkv, d, opt.kv_type, opt.k_scale, opt.v_scale);
            std::vector<std::size_t> ids;
            {
                std::size_t longest = 0;
                for (std::size_t i = 0; i < n; ++i) longest = std::max(longest, past[i] + q_lens[i]);
                const std::vector<float> k = random_values(count_of("the cached keys", {Hkv, longest, d}), 1.0f, rng);
                const std::vector<float> v = random_values(count_of("the cached values", {Hkv, longest, d}), 1.0f, rng);
                for (std::size_t i = 0; i < n; ++i) {
                    ids.push_back(cache.add_sequence());
                    // Core-only: the new tokens' keys are in the pool too (the layer step writes them itself).
                    const std::size_t rows = opt.core_only ? past[i] + q_lens[i] : past[i];
                    if (rows != 0)
                        cache.append(ids[i], ConstHeads(k.data(), 1, Hkv, rows, d, 0, longest * d, d),
                                     ConstHeads(v.data(), 1, Hkv, rows, d, 0, longest * d, d));
                }
            }
            // The path of each sequence's core (sdpa_path on its shape: the rule the paged core applies).
            std::string path;
            {
                const float dummy[1] = {0.0f};
                for (std::size_t i = 0; i < n; ++i) {
                    SdpaInputs in{ConstHeads(dummy, 1, H, q_lens[i], d, 0, 0, 0), ConstHeads(dummy, 1, Hkv, past[i] + q_lens[i], d, 0, 0, 0),
                                  ConstHeads(dummy, 1, Hkv, past[i] + q_lens[i], d, 0, 0, 0), {}, {}};
                    const std::string p(attention_path_name(sdpa_path(in)));
                    path = path.empty() || path == p ? p : "mixed";
                }
            }
            const std::size_t Hd = count_of("H·d", {H, d}), Hkvd = count_of("Hkv·d", {Hkv, d});
            const double kv_bytes = 2.0 * double(Hkv) * keys * double(kv_row_bytes(opt.kv_type, d));
            const double core_flops = 4.0 * double(Hd) * pairs;
            const int th = opt.threads.value_or(0);
            if (opt.core_only) {
                std::vector<std::size_t> lengths(n), starts(n + 1, 0);
                std::size_t stride = 0;
                for (std::size_t i = 0; i < n; ++i) {
                    lengths[i] = past[i] + q_lens[i];
                    starts[i + 1] = starts[i] + q_lens[i];
                    stride = std::max(stride, cache.block_table(ids[i]).size());
                }
                std::vector<std::uint32_t> tables(n * stride, 0);
                for (std::size_t i = 0; i < n; ++i)
                    std::copy(cache.block_table(ids[i]).begin(), cache.block_table(ids[i]).end(), tables.begin() + std::ptrdiff_t(i * stride));
                const std::vector<float> q = random_values(count_of("q", {T, Hd}), 1.0f, rng);
                std::vector<float> out(q.size());
                const PagedSequences seqs{n, tables.data(), stride, lengths.data(), starts.data()};
                PagedAttentionOptions po;
                po.threads = th;
                po.modifiers = mods.view;
                t = time_calls(opt.reps, [&] { paged_attention(ConstMatrix(q.data(), T, Hd), cache.pool(), seqs, Matrix(out.data(), T, Hd), po); });
                flops = core_flops;
                bytes = kv_bytes;
            } else {
                const std::vector<float> x = random_values(count_of("x", {T, E}), 1.0f, rng);
                std::vector<float> y(x.size());
                t = time_calls(
                    opt.reps,
                    [&] { attention.forward_step(ConstMatrix(x.data(), T, E), Matrix(y.data(), T, E), cache, ids.data(), q_lens.data(), n, th); },
                    [&] {
                        for (std::size_t i = 0; i < n; ++i) cache.truncate(ids[i], past[i]);
                    });
                flops = 2.0 * double(T) * (double(E) * double(Hd) * 2 + 2.0 * double(E) * double(Hkvd)) + core_flops;
                bytes = double(attention.weight_bytes_read()) + kv_bytes;
                j["weight_bytes"] = attention.weight_bytes_read();
            }
            j["path"] = path;
            j["tokens"] = T;
            j["kv_blocks"] = cache.used_blocks();
            j["kv_bytes"] = kv_bytes;
            j["decode_seqs"] = N, j["kv_seq"] = LK, j["ragged"] = opt.ragged, j["prefill_seqs"] = P;
            j["prefill_len"] = opt.prefill_len, j["prefill_past"] = opt.prefill_past, j["block_size"] = bs;
            j["embed"] = E, j["heads"] = H, j["kv_heads"] = Hkv, j["head_dim"] = d;
            j["kv_type"] = std::string(data_type_name(opt.kv_type));
            j["rope_theta"] = opt.rope_theta ? nlohmann::ordered_json(*opt.rope_theta) : nlohmann::ordered_json(nullptr);
            j["core_only"] = opt.core_only;
            shape = "decode_seqs=" + std::to_string(N) + " kv_seq=" + std::to_string(LK) + (opt.ragged ? " ragged" : "") +
                    " prefill_seqs=" + std::to_string(P) + " prefill_len=" + std::to_string(opt.prefill_len) +
                    " prefill_past=" + std::to_string(opt.prefill_past) + " block_size=" + std::to_string(bs) + " tokens=" +
                    std::to_string(T) + " embed=" + std::to_string(E) + " heads=" + std::to_string(H) + " kv_heads=" +
                    std::to_string(Hkv) + " head_dim=" + std::to_string(d) + " kv_type=" + std::string(data_type_name(opt.kv_type)) +
                    (opt.rope_theta ? " rope_theta=" + std::to_string(*opt.rope_theta) : "") + (opt.core_only ? " core_only" : "") +
                    " path=" + path;
            mods.describe(j, shape);
            break;
        }
        case BenchOp::gemm: {
            const std::size_t M = opt.m, N = opt.n, K = opt.k;
            const std::vector<float> a = random_values(count_of("A", {M, K}), 1.0f, rng);
            const std::vector<float> b = random_values(count_of("B", {N, K}), 1.0f, rng);
            std::vector<float> c(count_of("C", {M, N}));
            t = time_calls(opt.reps, [&] {
                // bf16: B is packed into bf16 panels in each call, as the fp32 GEMM packs it.
                (opt.dtype == DataType::bf16 ? gemm_bf16 : gemm)(1.0f, ConstMatrix(a.data(), M, K), Trans::no,
                                                                ConstMatrix(b.data(), N, K), Trans::yes, 0.0f,
                                                                Matrix(c.data(), M, N), opt.backend);
            });
            flops = 2.0 * double(M) * double(N) * double(K);
            j["m"] = M, j["n"] = N, j["k"] = K;
            shape = "m=" + std::to_string(M) + " n=" + std::to_string(N) + " k=" + std::to_string(K);
            break;
        }
        case BenchOp::softmax:
        case BenchOp::layernorm: {
            const std::size_t R = opt.rows, C = opt.cols;
            std::vector<float> x = random_values(count_of("x", {R, C}), 4.0f, rng);
            if (opt.op == BenchOp::softmax) {
                // In place: after the first call the rows hold probabilities, still ordinary finite inputs.
                t = time_calls(opt.reps, [&] { softmax_rows(Matrix(x.data(), R, C), 1.0f, {}, opt.backend); });
            } else {
                std::vector<float> y(x.size());
                const std::vector<float> gamma = random_values(C, 1.0f, rng);
                const std::vector<float> beta = random_values(C, 1.0f, rng);
                t = time_calls(opt.reps, [&] {
                    layernorm_rows(ConstMatrix(x.data(), R, C), Matrix(y.data(), R, C), gamma.data(), beta.data(), 1e-5f,
                                   {}, opt.backend);
                });
            }
            bytes = 2.0 * double(R) * double(C) * sizeof(float);
            j["rows"] = R, j["cols"] = C;
            shape = "rows=" + std::to_string(R) + " cols=" + std::to_string(C);
            break;
        }
    }
    const double seconds = t.median_ms * 1e-3;
    j["ms_median"] = t.median_ms;
    j["ms_min"] = t.min_ms;
    if (opt.op != BenchOp::softmax && opt.op != BenchOp::layernorm) j["gflops"] = flops / seconds / 1e9;
    if (opt.op != BenchOp::attention && opt.op != BenchOp::gemm) j["gbps"] = bytes / seconds / 1e9;
    if (opt.op == BenchOp::step) j["kv_gbps"] = j["kv_bytes"].get<double>() / seconds / 1e9;

    if (opt.json) {
        std::printf("%s\n", j.dump().c_str());
        return;
    }
    std::string rates;
    char buf[64];
    if (j.contains("gflops")) {
        std::snprintf(buf, sizeof buf, ", %.2f GFLOP/s", j["gflops"].get<double>());
        rates += buf;
    }
    if (j.contains("gbps")) {
        std::snprintf(buf, sizeof buf, ", %.2f GB/s", j["gbps"].get<double>());
        rates += buf;
    }
    std::printf("%s %s backend=%s isa=%s dtype=%s threads=%d reps=%d: median %.3f ms, min %.3f ms%s\n", op_name(opt.op),
                shape.c_str(), j["backend"].get<std::string>().c_str(), j["isa"].get<std::string>().c_str(),
                j["dtype"].get<std::string>().c_str(), threads, opt.reps, t.median_ms,
                t.min_ms, rates.c_str());
}

}  // namespace mha::tool
