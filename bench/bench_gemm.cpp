// GEMM speed: the SIMD GEMM (best ISA, or capped) next to the scalar reference, in GFLOP/s
// (counter GFLOPS = 2·M·N·K / time). Shapes are M×N×K:
//   Linear layout C = A·Bᵀ (y = x·Wᵀ): 1024×2304×768 (fused QKV projection of 1024 tokens, E = 768),
//   1024×768×768 (one projection), 128×128×64 (Q·Kᵀ of one head, d = 64), 128×64×128 (P·V of one head);
//   Packed: the same with B prepacked once (simd::PackedMatrix) and the bias fused (gemm_packed);
//   PackedBf16: Packed with bf16 operands on AVX512_BF16 or FEAT_BF16 (Bf16PackedMatrix, gemm_bf16; skipped without);
//   Head: the attention calls as the attention code makes them: Q_h·K_hᵀ with Q_h, K_h column slices
//   of a [L, 3E] buffer (stride 3E = 2304), and P·V_h with V_h such a slice (B not transposed).
// Rates use wall time (like the anchors in shared/anchors). Run pinned to one core:
//   taskset -c 1 ./bench_gemm --benchmark_filter=... --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <mha/isa.hpp>
#include <mha/kernels.hpp>

#include "simd/gemm_bf16.hpp"
#include "simd/simd.hpp"

namespace {

using mha::ConstMatrix;
using mha::Matrix;
using mha::Trans;

std::vector<float> random_vector(std::size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

void set_flops(benchmark::State& state, std::size_t m, std::size_t n, std::size_t k) {
    state.counters["GFLOPS"] = benchmark::Counter(2.0 * double(m) * double(n) * double(k) * 1e-9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// Caps the ISA for one benchmark and restores the default (best) afterwards.
struct IsaCap {
    explicit IsaCap(mha::Isa isa) { mha::set_isa_cap(isa); }
    ~IsaCap() { mha::set_isa_cap(mha::Isa::avx512_bf16); }
};

// C[M, N] = A[M, K]·B[N, K]ᵀ. Args: M, N, K, isa (2 avx512, 1 avx2, 0 sse2; -1: scalar reference).
void BM_Linear(benchmark::State& state) {
    const auto m = std::size_t(state.range(0)), n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
    const auto a = random_vector(m * k, 1), b = random_vector(n * k, 2);
    std::vector<float> c(m * n);
    const bool scalar = state.range(3) < 0;
    IsaCap cap(scalar ? mha::Isa::avx512_bf16 : mha::Isa(state.range(3)));
    const auto backend = scalar ? mha::Backend::scalar : mha::Backend::simd;
    for (auto _ : state) {
        mha::gemm(1.0f, ConstMatrix(a.data(), m, k), Trans::no, ConstMatrix(b.data(), n, k), Trans::yes, 0.0f,
                  Matrix(c.data(), m, n), backend);
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_flops(state, m, n, k);
}

// y[M, N] = x[M, K]·W[N, K]ᵀ + bias with W prepacked once outside the loop. Args: M, N, K, isa.
void BM_Packed(benchmark::State& state) {
    const auto m = std::size_t(state.range(0)), n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
    const auto a = random_vector(m * k, 1), w = random_vector(n * k, 2), bias = random_vector(n, 3);
    std::vector<float> c(m * n);
    IsaCap cap{mha::Isa(state.range(3))};
    const mha::simd::PackedMatrix packed(ConstMatrix(w.data(), n, k), Trans::yes);
    for (auto _ : state) {
        mha::simd::gemm_packed(1.0f, ConstMatrix(a.data(), m, k), Trans::no, packed, 0.0f, bias.data(),
                               Matrix(c.data(), m, n));
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_flops(state, m, n, k);
}

// S[Lq, Lk] = Q_h·K_hᵀ, Q_h and K_h = [L, d] column slices of [L, 3E] buffers (stride 3E = 2304).
// BM_Packed in bf16: W packed once into bf16 panels, x rounded while packed, fp32 accumulation. Args: M, N, K.
void BM_PackedBf16(benchmark::State& state) {
    if (!mha::simd::bf16_kernels_available()) {
        state.SkipWithError("this CPU has no AVX512_BF16 / FEAT_BF16");
        return;
    }
    const auto m = std::size_t(state.range(0)), n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
    const auto a = random_vector(m * k, 1), w = random_vector(n * k, 2), bias = random_vector(n, 3);
    std::vector<float> c(m * n);
    const mha::simd::Bf16PackedMatrix packed({ConstMatrix(w.data(), n, k)}, Trans::yes);
    std::vector<std::uint16_t> scratch(mha::simd::gemm_bf16_scratch(m, k) + 32);
    auto* buf = reinterpret_cast<std::uint16_t*>((reinterpret_cast<std::uintptr_t>(scratch.data()) + 63) / 64 * 64);
    for (auto _ : state) {
        mha::simd::gemm_bf16(1.0f, ConstMatrix(a.data(), m, k), packed.all(), 0.0f, bias.data(), Matrix(c.data(), m, n), buf);
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_flops(state, m, n, k);
}

// Args: Lq, Lk, d, isa (-1 scalar).
void BM_HeadQK(benchmark::State& state) {
    const auto lq = std::size_t(state.range(0)), lk = std::size_t(state.range(1)), d = std::size_t(state.range(2));
    constexpr std::size_t ld = 2304;
    const auto q = random_vector(lq * ld, 1), kv = random_vector(lk * ld, 2);
    std::vector<float> s(lq * lk);
    const bool scalar = state.range(3) < 0;
    IsaCap cap(scalar ? mha::Isa::avx512_bf16 : mha::Isa(state.range(3)));
    const auto backend = scalar ? mha::Backend::scalar : mha::Backend::simd;
    for (auto _ : state) {
        mha::gemm(0.125f, ConstMatrix(q.data() + 64, lq, d, ld), Trans::no, ConstMatrix(kv.data() + 832, lk, d, ld),
                  Trans::yes, 0.0f, Matrix(s.data(), lq, lk), backend);
        benchmark::DoNotOptimize(s.data());
        benchmark::ClobberMemory();
    }
    set_flops(state, lq, lk, d);
}

// C_h[Lq, d] = P[Lq, Lk]·V_h, V_h a [Lk, d] column slice of a [Lk, 3E] buffer, C_h a slice of [Lq, E].
// Args: Lq, d, Lk, isa (-1 scalar).
void BM_HeadPV(benchmark::State& state) {
    const auto lq = std::size_t(state.range(0)), d = std::size_t(state.range(1)), lk = std::size_t(state.range(2));
    constexpr std::size_t ld = 2304, ldc = 768;
    const auto p = random_vector(lq * lk, 1), v = random_vector(lk * ld, 2);
    std::vector<float> c(lq * ldc);
    const bool scalar = state.range(3) < 0;
    IsaCap cap(scalar ? mha::Isa::avx512_bf16 : mha::Isa(state.range(3)));
    const auto backend = scalar ? mha::Backend::scalar : mha::Backend::simd;
    for (auto _ : state) {
        mha::gemm(1.0f, ConstMatrix(p.data(), lq, lk), Trans::no, ConstMatrix(v.data() + 1600, lk, d, ld), Trans::no,
                  0.0f, Matrix(c.data() + 64, lq, d, ldc), backend);
        benchmark::DoNotOptimize(c.data());
        benchmark::ClobberMemory();
    }
    set_flops(state, lq, d, lk);
}

constexpr long kAvx512 = 2, kAvx2 = 1, kSse2 = 0, kScalar = -1;

void big_shapes(benchmark::internal::Benchmark* b, long isa) {
    b->Args({1024, 2304, 768, isa})->Args({1024, 768, 768, isa});
}
void small_shapes(benchmark::internal::Benchmark* b, long isa) {
    b->Args({128, 128, 64, isa})->Args({128, 64, 128, isa});
}

BENCHMARK(BM_Linear)->ArgNames({"M", "N", "K", "isa"})->Apply([](auto* b) {
    big_shapes(b, kAvx512);
    small_shapes(b, kAvx512);
    big_shapes(b, kAvx2);
    small_shapes(b, kAvx2);
    small_shapes(b, kSse2);
    small_shapes(b, kScalar);
})->UseRealTime()->Unit(benchmark::kMicrosecond);
// The scalar reference at ~2 GFLOP/s: a few iterations of the smaller big shape only.
BENCHMARK(BM_Linear)->Name("BM_Linear_scalar")->ArgNames({"M", "N", "K", "isa"})->Args({1024, 768, 768, kScalar})
    ->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Packed)->ArgNames({"M", "N", "K", "isa"})->Apply([](auto* b) {
    big_shapes(b, kAvx512);
    small_shapes(b, kAvx512);
    big_shapes(b, kAvx2);
})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PackedBf16)->ArgNames({"M", "N", "K"})->Apply([](auto* b) {
    b->Args({1024, 2304, 768})->Args({1024, 768, 768})->Args({128, 128, 64})->Args({128, 64, 128});
    // A decode step's projections (E 4096, Hkv·d 1024: Q, K, V together, and the output) for 32 and 16 tokens: the
    // weights (48 MB, 32 MB) stream from memory.
    b->Args({32, 6144, 4096})->Args({32, 4096, 4096})->Args({16, 6144, 4096});
})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HeadQK)->ArgNames({"Lq", "Lk", "d", "isa"})->Apply([](auto* b) {
    for (long isa : {kAvx512, kAvx2, kScalar}) b->Args({128, 128, 64, isa});
    b->Args({128, 512, 64, kAvx512})->Args({128, 128, 32, kAvx512})->Args({128, 128, 128, kAvx512});
})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HeadPV)->ArgNames({"Lq", "d", "Lk", "isa"})->Apply([](auto* b) {
    for (long isa : {kAvx512, kAvx2, kScalar}) b->Args({128, 64, 128, isa});
    b->Args({128, 64, 512, kAvx512})->Args({128, 32, 128, kAvx512})->Args({128, 128, 128, kAvx512});
})->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
