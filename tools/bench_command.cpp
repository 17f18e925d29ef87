// `mha bench`: times one op of the public API on random inputs (fixed seed): one warm-up call, then
// `reps` timed calls (std::chrono::steady_clock); reports the median and minimum time and the rate
// at the median time:
//   attention  [B, L, E] x [B, Lk, E], H heads   gflops = (4·B·E²·(L+Lk) + 4·B·L·Lk·E) / t
//   gemm       C[m, n] = A[m, k]·B[n, k]ᵀ        gflops = 2·m·n·k / t
//   softmax    [rows, cols] in place              gbps   = 2·rows·cols·4 bytes / t   (read + write)
//   layernorm  [rows, cols] → [rows, cols]        gbps   = 2·rows·cols·4 bytes / t
// The kernels are single-threaded, so gemm/softmax/layernorm accept only --threads 1.
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.hpp"

namespace mha::tool {

namespace {

struct Timing {
    double median_ms = 0;
    double min_ms = 0;
};

template <class F>
Timing time_calls(int reps, F&& call) {
    call();  // warm-up: page faults, caches, one-time setup
    std::vector<double> ms;
    ms.reserve(static_cast<std::size_t>(reps));
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        call();
        const auto t1 = std::chrono::steady_clock::now();
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const std::size_t n = ms.size();
    return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
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

const char* op_name(BenchOp op) {
    switch (op) {
        case BenchOp::attention: return "attention";
        case BenchOp::gemm: return "gemm";
        case BenchOp::softmax: return "softmax";
        case BenchOp::layernorm: return "layernorm";
    }
    return "?";
}

const char* impl_name(Impl impl) {
    switch (impl) {
        case Impl::automatic: return "auto";
        case Impl::materialized: return "materialized";
        case Impl::fused: return "fused";
    }
    return "?";
}

}  // namespace

void bench_command(const BenchOptions& opt) {
    const bool kernel = opt.op != BenchOp::attention;
    if (kernel && opt.threads && *opt.threads != 1)
        throw tool_error("--threads " + std::to_string(*opt.threads) + " is not supported for --op " + op_name(opt.op) +
                         ": the kernels are single-threaded (use --threads 1 or leave it out)");
    // Threads actually used. The kernels and the scalar backend (the plain-loop reference) run on one;
    // the SIMD attention runs on oneTBB's pool: 0 means all of it, and a larger request is clamped to it.
    const int pool = tbb::this_task_arena::max_concurrency();
    const int requested = opt.threads.value_or(0);
    const int threads = kernel || opt.backend == Backend::scalar ? 1 : requested == 0 ? pool : std::min(requested, pool);

    nlohmann::ordered_json j;
    j["op"] = op_name(opt.op);
    j["backend"] = opt.backend == Backend::scalar ? "scalar" : "simd";
    j["isa"] = opt.backend == Backend::scalar ? std::string("scalar") : std::string(isa_name(active_isa()));
    j["threads"] = threads;
    j["reps"] = opt.reps;

    std::mt19937 rng(20240607);
    Timing t;
    double flops = 0, bytes = 0;
    std::string shape;
    switch (opt.op) {
        case BenchOp::attention: {
            const std::size_t B = opt.batch, L = opt.seq, Lk = opt.kv_seq.value_or(opt.seq), E = opt.embed, H = opt.heads;
            const float w_amp = 1.0f / std::sqrt(static_cast<float>(E));  // keeps projections O(1)
            const std::vector<float> query = random_values(count_of("query", {B, L, E}), 1.0f, rng);
            const std::vector<float> key = Lk != L ? random_values(count_of("key", {B, Lk, E}), 1.0f, rng) : std::vector<float>{};
            const std::vector<float> in_w = random_values(count_of("in_proj_weight", {3, E, E}), w_amp, rng);
            const std::vector<float> in_b = random_values(3 * E, w_amp, rng);
            const std::vector<float> out_w = random_values(count_of("out_proj_weight", {E, E}), w_amp, rng);
            const std::vector<float> out_b = random_values(E, w_amp, rng);
            std::vector<float> output(query.size());
            AttentionWeights w;
            w.in_proj_weight = in_w.data();
            w.in_proj_bias = in_b.data();
            w.out_proj_weight = out_w.data();
            w.out_proj_bias = out_b.data();
            const MultiheadAttention attention(w, E, H);
            AttentionInputs in;
            in.query = ConstBatch(query.data(), B, L, E);
            if (!key.empty()) in.key = ConstBatch(key.data(), B, Lk, E);  // cross-attention; else self-attention
            AttentionOutputs out;
            out.output = Batch(output.data(), B, L, E);
            ForwardOptions fo;
            fo.causal = opt.causal;
            fo.backend = opt.backend;
            fo.threads = opt.threads.value_or(0);
            fo.impl = opt.impl;
            t = time_calls(opt.reps, [&] { attention.forward(in, out, fo); });
            const double b = double(B), l = double(L), lk = double(Lk), e = double(E);
            flops = 4 * b * e * e * (l + lk) + 4 * b * l * lk * e;
            j["impl"] = impl_name(opt.impl);
            j["causal"] = opt.causal;
            j["batch"] = B, j["seq"] = L, j["kv_seq"] = Lk, j["embed"] = E, j["heads"] = H;
            shape = "batch=" + std::to_string(B) + " seq=" + std::to_string(L) + " kv_seq=" + std::to_string(Lk) +
                    " embed=" + std::to_string(E) + " heads=" + std::to_string(H) + " impl=" + impl_name(opt.impl) +
                    (opt.causal ? " causal" : "");
            break;
        }
        case BenchOp::gemm: {
            const std::size_t M = opt.m, N = opt.n, K = opt.k;
            const std::vector<float> a = random_values(count_of("A", {M, K}), 1.0f, rng);
            const std::vector<float> b = random_values(count_of("B", {N, K}), 1.0f, rng);
            std::vector<float> c(count_of("C", {M, N}));
            t = time_calls(opt.reps, [&] {
                gemm(1.0f, ConstMatrix(a.data(), M, K), Trans::no, ConstMatrix(b.data(), N, K), Trans::yes, 0.0f,
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
    if (kernel && opt.op != BenchOp::gemm)
        j["gbps"] = bytes / seconds / 1e9;
    else
        j["gflops"] = flops / seconds / 1e9;

    if (opt.json) {
        std::printf("%s\n", j.dump().c_str());
        return;
    }
    const bool rate_is_bytes = j.contains("gbps");
    std::printf("%s %s backend=%s isa=%s threads=%d reps=%d: median %.3f ms, min %.3f ms, %.2f %s\n", op_name(opt.op),
                shape.c_str(), j["backend"].get<std::string>().c_str(), j["isa"].get<std::string>().c_str(), threads,
                opt.reps, t.median_ms, t.min_ms, rate_is_bytes ? j["gbps"].get<double>() : j["gflops"].get<double>(),
                rate_is_bytes ? "GB/s" : "GFLOP/s");
}

}  // namespace mha::tool
