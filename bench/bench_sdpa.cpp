// The attention core alone (mha::scaled_dot_product_attention, no projections): grouped-query scaling.
//   groups  H = 32 query heads, d = 128, Lq = Lk = --seq (default 2048), B = 1, KV heads Hkv in
//           {1, 2, 4, 8, 32} (MQA .. MHA): GQA should cost nothing, so GFLOP/s should stay flat.
//   causal  the same at Hkv = 8 with the causal mask (tiles above the diagonal are skipped).
// Each on one thread and on all. FLOPs: 4·B·H·Lq·Lk·d without a mask; with causal only the visible
// (query, key) pairs count: 4·B·H·d·Σ_i min(Lk, i + 1 + Lk − Lq).
// Counters: GFLOPS; pct_peak against the FMA peak measured at start-up (bench/fma_peak.hpp);
// kv_gbps = bytes of K and V (read once per call) ÷ time.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "fma_peak.hpp"

namespace {

mha_bench::FmaPeak g_peak;

struct Problem {
    std::size_t B = 1, H = 32, Hkv = 8, d = 128, Lq = 2048, Lk = 2048;
    std::vector<float> q, k, v, out;
    Problem(std::size_t h, std::size_t hkv, std::size_t d_, std::size_t lq, std::size_t lk)
        : H(h), Hkv(hkv), d(d_), Lq(lq), Lk(lk), q(B * H * Lq * d), k(B * Hkv * Lk * d), v(k.size()), out(q.size()) {
        std::mt19937 rng(7);
        std::normal_distribution<float> n(0.0f, 1.0f);
        for (auto* x : {&q, &k, &v})
            for (float& e : *x) e = n(rng);
    }
    void run(const mha::SdpaOptions& opt) {
        const mha::SdpaInputs in{mha::ConstHeads::bhld(q.data(), B, H, Lq, d), mha::ConstHeads::bhld(k.data(), B, Hkv, Lk, d),
                                 mha::ConstHeads::bhld(v.data(), B, Hkv, Lk, d), {}, {}};
        mha::scaled_dot_product_attention(in, mha::Heads::bhld(out.data(), B, H, Lq, d), opt);
    }
    double flops(bool causal) const {
        if (!causal) return 4.0 * double(B * H * Lq * Lk * d);
        double pairs = 0;
        for (std::size_t i = 0; i < Lq; ++i) {
            const double n = double(i) + 1.0 + double(Lk) - double(Lq);
            pairs += n <= 0 ? 0 : std::min(double(Lk), n);
        }
        return 4.0 * double(B * H * d) * pairs;
    }
};

void run_case(benchmark::State& state, std::size_t hkv, std::size_t seq, bool causal, int threads) {
    Problem p(32, hkv, 128, seq, seq);
    mha::SdpaOptions opt;
    opt.causal = causal;
    opt.threads = threads;
    p.run(opt);  // untimed: starts the workers, fills the scratch cache
    double seconds = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        p.run(opt);
        benchmark::DoNotOptimize(p.out.data());
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double iters = double(state.iterations());
    const double gflops = p.flops(causal) * iters / seconds * 1e-9;
    state.counters["GFLOPS"] = gflops;
    const unsigned t = threads > 0 ? unsigned(threads) : g_peak.threads;
    if (g_peak.gflops_1 > 0) state.counters["pct_peak"] = 100.0 * gflops / g_peak.for_threads(t);
    state.counters["kv_gbps"] = 2.0 * double(p.B * p.Hkv * p.Lk * p.d) * sizeof(float) * iters / seconds * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t seq = 2048;
    // Our flag (--seq=N) is removed before benchmark::Initialize.
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--seq=", 6) == 0)
            seq = std::strtoul(argv[i] + 6, nullptr, 10);
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    if (seq == 0) {
        std::fprintf(stderr, "--seq must be a positive length\n");
        return 2;
    }
    g_peak = mha_bench::measure_fma_peak();
    std::printf("FMA peak (%s loop): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %u threads\n", g_peak.isa.c_str(),
                g_peak.gflops_1, g_peak.gflops_all, g_peak.threads);
    for (int threads : {1, 0})
        for (std::size_t hkv : {1, 2, 4, 8, 32}) {
            const std::string name = "groups/H:32/Hkv:" + std::to_string(hkv) + "/d:128/L:" + std::to_string(seq) +
                                     "/threads:" + (threads ? std::to_string(threads) : std::string("all"));
            benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run_case(s, hkv, seq, false, threads); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
    for (int threads : {1, 0}) {
        const std::string name = "causal/H:32/Hkv:8/d:128/L:" + std::to_string(seq) +
                                 "/threads:" + (threads ? std::to_string(threads) : std::string("all"));
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { run_case(s, 8, seq, true, threads); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
