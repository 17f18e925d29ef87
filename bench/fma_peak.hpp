// Measures this machine's fp32 FMA peak (GFLOP/s) with a register-only loop, so the benchmarks can
// report "% of peak" against a number taken on the machine they run on, not a datasheet.
//   One thread, then one loop per hardware thread at once (all-core clocks can be lower); each rate is
//   FLOPs ÷ the thread's own CPU time, best of several repetitions.
//   x86-64: AVX-512 when the CPU and OS support it (__builtin_cpu_supports), else AVX2+FMA, else none (0);
//   the ISA code sits in functions with target attributes, so the binary itself stays baseline x86-64.
//   AArch64: NEON fmla (baseline). Other targets: none.
// Takes about 0.4 s. Preconditions: g++ or clang++ (GNU attributes and builtins).
#pragma once
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace mha_bench {

struct FmaPeak {
    std::string isa;               // "avx512", "avx2", "neon" or "none"
    unsigned threads = 1;          // hardware threads used for the all-thread figure
    double gflops_1 = 0;           // one thread
    double gflops_all = 0;         // all `threads` threads together

    // The peak available to a run on t threads: t times the better per-thread estimate. Other work on
    // the machine (or vCPUs that share a physical core) only ever lowers a measurement, and the
    // all-thread run is the more exposed to it; where all-core clocks are lower than one-core clocks,
    // this overstates the all-thread peak by that ratio.
    double for_threads(unsigned t) const { return std::max(gflops_1, gflops_all / threads) * t; }
};

namespace fma_detail {

#if defined(__x86_64__) || defined(__i386__)
// 12 independent accumulators: FMA latency (4 cycles) × 2 FMA pipes needs at least 8 in flight.
// x ← x·m + a with m slightly below 1 stays finite and normal forever. 12 FMAs × 16 lanes × 2 FLOP.
__attribute__((target("avx512f"))) inline float loop_avx512(std::uint64_t iters) {
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-6f);
    __m512 x0 = _mm512_set1_ps(1.00f), x1 = _mm512_set1_ps(1.01f), x2 = _mm512_set1_ps(1.02f), x3 = _mm512_set1_ps(1.03f);
    __m512 x4 = _mm512_set1_ps(1.04f), x5 = _mm512_set1_ps(1.05f), x6 = _mm512_set1_ps(1.06f), x7 = _mm512_set1_ps(1.07f);
    __m512 x8 = _mm512_set1_ps(1.08f), x9 = _mm512_set1_ps(1.09f), x10 = _mm512_set1_ps(1.10f), x11 = _mm512_set1_ps(1.11f);
    for (std::uint64_t i = 0; i < iters; ++i) {
        x0 = _mm512_fmadd_ps(x0, m, a); x1 = _mm512_fmadd_ps(x1, m, a); x2 = _mm512_fmadd_ps(x2, m, a);
        x3 = _mm512_fmadd_ps(x3, m, a); x4 = _mm512_fmadd_ps(x4, m, a); x5 = _mm512_fmadd_ps(x5, m, a);
        x6 = _mm512_fmadd_ps(x6, m, a); x7 = _mm512_fmadd_ps(x7, m, a); x8 = _mm512_fmadd_ps(x8, m, a);
        x9 = _mm512_fmadd_ps(x9, m, a); x10 = _mm512_fmadd_ps(x10, m, a); x11 = _mm512_fmadd_ps(x11, m, a);
        // Opaque to the optimizer: without it, chains can be merged or the recurrence rewritten.
        asm volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5), "+v"(x6), "+v"(x7),
                          "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));
    }
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                                   _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)),
                                                 _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11))));
    alignas(64) float lanes[16];  // (g++ 12 warns inside _mm512_reduce_add_ps)
    _mm512_store_ps(lanes, s);
    float sum = 0;
    for (float v : lanes) sum += v;
    return sum;  // the result is used, so the loop cannot be removed
}
inline constexpr double kFlopsPerIterAvx512 = 12 * 16 * 2;

__attribute__((target("avx2,fma"))) inline float loop_avx2(std::uint64_t iters) {
    const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-6f);
    __m256 x0 = _mm256_set1_ps(1.00f), x1 = _mm256_set1_ps(1.01f), x2 = _mm256_set1_ps(1.02f), x3 = _mm256_set1_ps(1.03f);
    __m256 x4 = _mm256_set1_ps(1.04f), x5 = _mm256_set1_ps(1.05f), x6 = _mm256_set1_ps(1.06f), x7 = _mm256_set1_ps(1.07f);
    __m256 x8 = _mm256_set1_ps(1.08f), x9 = _mm256_set1_ps(1.09f), x10 = _mm256_set1_ps(1.10f), x11 = _mm256_set1_ps(1.11f);
    for (std::uint64_t i = 0; i < iters; ++i) {
        x0 = _mm256_fmadd_ps(x0, m, a); x1 = _mm256_fmadd_ps(x1, m, a); x2 = _mm256_fmadd_ps(x2, m, a);
        x3 = _mm256_fmadd_ps(x3, m, a); x4 = _mm256_fmadd_ps(x4, m, a); x5 = _mm256_fmadd_ps(x5, m, a);
        x6 = _mm256_fmadd_ps(x6, m, a); x7 = _mm256_fmadd_ps(x7, m, a); x8 = _mm256_fmadd_ps(x8, m, a);
        x9 = _mm256_fmadd_ps(x9, m, a); x10 = _mm256_fmadd_ps(x10, m, a); x11 = _mm256_fmadd_ps(x11, m, a);
        // Opaque to the optimizer: without it, chains can be merged or the recurrence rewritten.
        asm volatile("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5), "+v"(x6), "+v"(x7),
                          "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                                   _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)),
                                                 _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11))));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, s);
    float sum = 0;
    for (float v : lanes) sum += v;
    return sum;
}
inline constexpr double kFlopsPerIterAvx2 = 12 * 8 * 2;
#elif defined(__aarch64__)
// 16 independent accumulators: 4 FMA pipes (Neoverse V1/V2) × 4 cycles of latency. 16 × 4 lanes × 2 FLOP.
inline float loop_neon(std::uint64_t iters) {
    const float32x4_t m = vdupq_n_f32(0.999999f), a = vdupq_n_f32(1e-6f);
    float32x4_t x[16];
    for (int i = 0; i < 16; ++i) x[i] = vdupq_n_f32(1.0f + 0.01f * float(i));
    for (std::uint64_t i = 0; i < iters; ++i) {
        for (int j = 0; j < 16; ++j) x[j] = vfmaq_f32(a, x[j], m);
        asm volatile("" : "+w"(x[0]), "+w"(x[1]), "+w"(x[2]), "+w"(x[3]), "+w"(x[4]), "+w"(x[5]), "+w"(x[6]), "+w"(x[7]));
        asm volatile("" : "+w"(x[8]), "+w"(x[9]), "+w"(x[10]), "+w"(x[11]), "+w"(x[12]), "+w"(x[13]), "+w"(x[14]), "+w"(x[15]));
    }
    float32x4_t s = x[0];
    for (int j = 1; j < 16; ++j) s = vaddq_f32(s, x[j]);
    return vaddvq_f32(s);
}
inline constexpr double kFlopsPerIterNeon = 16 * 4 * 2;
#endif

// CPU time of the calling thread: what other processes take from the core is not counted, so a
// busy machine (other builds running) lowers the measured peak much less than wall time would.
inline double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// GFLOP/s of one thread running loop(iters), on its own CPU time.
template <class Loop>
double timed_loop(Loop loop, double flops_per_iter, std::uint64_t iters, std::atomic<float>& sink) {
    const double t0 = thread_cpu_seconds();
    sink.store(loop(iters), std::memory_order_relaxed);  // the result is used, so the loop stays
    return flops_per_iter * double(iters) / (thread_cpu_seconds() - t0) * 1e-9;
}

// Sum of the GFLOP/s of `threads` copies of loop(iters) started together; best of `reps`.
template <class Loop>
double run_loop(Loop loop, double flops_per_iter, std::uint64_t iters, unsigned threads, int reps) {
    std::atomic<float> sink{0};
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        std::atomic<unsigned> ready{0};
        std::atomic<bool> go{false};
        std::vector<double> rate(threads, 0.0);
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < threads; ++t)
            pool.emplace_back([&, t] {
                ready.fetch_add(1);
                while (!go.load()) std::this_thread::yield();
                rate[t] = timed_loop(loop, flops_per_iter, iters, sink);
            });
        while (ready.load() + 1 < threads) std::this_thread::yield();
        go.store(true);
        rate[0] = timed_loop(loop, flops_per_iter, iters, sink);
        for (auto& th : pool) th.join();
        double sum = 0;
        for (double x : rate) sum += x;
        best = std::max(best, sum);
    }
    return best;
}

template <class Loop>
FmaPeak measure_with(Loop loop, double flops_per_iter, const char* isa, double seconds_per_rep) {
    // Calibrate the iteration count so one repetition lasts about seconds_per_rep.
    std::uint64_t iters = 1 << 16;
    for (;;) {
        const double t0 = thread_cpu_seconds();
        volatile float keep = loop(iters);
        (void)keep;
        const double s = thread_cpu_seconds() - t0;
        if (s > seconds_per_rep / 4) {
            iters = std::uint64_t(double(iters) * seconds_per_rep / s) + 1;
            break;
        }
        iters *= 4;
    }
    FmaPeak p;
    p.isa = isa;
    p.threads = std::max(1u, std::thread::hardware_concurrency());
    p.gflops_1 = run_loop(loop, flops_per_iter, iters, 1, 8);
    p.gflops_all = p.threads == 1 ? p.gflops_1 : run_loop(loop, flops_per_iter, iters, p.threads, 8);
    return p;
}

}  // namespace fma_detail

// 16 repetitions of seconds_per_rep (8 on one thread, 8 on all; best of each), plus calibration.
inline FmaPeak measure_fma_peak(double seconds_per_rep = 0.025) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return fma_detail::measure_with(fma_detail::loop_avx512, fma_detail::kFlopsPerIterAvx512, "avx512", seconds_per_rep);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return fma_detail::measure_with(fma_detail::loop_avx2, fma_detail::kFlopsPerIterAvx2, "avx2", seconds_per_rep);
#elif defined(__aarch64__)
    return fma_detail::measure_with(fma_detail::loop_neon, fma_detail::kFlopsPerIterNeon, "neon", seconds_per_rep);
#endif
    FmaPeak none;
    none.isa = "none";
    return none;
}

}  // namespace mha_bench
