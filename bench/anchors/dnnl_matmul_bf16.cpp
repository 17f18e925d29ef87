// Anchor: oneDNN's matmul primitive in bf16, C[M,N] (fp32) = A[M,K] (bf16) · B[N,K]ᵀ (bf16): the Linear
// layout x·Wᵀ with bf16 operands and fp32 accumulation, as issue 14's bf16 GEMM computes it. B is reordered
// once, outside the timing, into the layout the primitive asks for (format_tag::any), as a layer packs its
// weights once; A and C are plain row-major. With "f32" as a 6th argument the same matmul runs in fp32
// (for the bf16 / fp32 ratio in the same sitting).
// Usage: dnnl_matmul_bf16 M N K THREADS REPS [f32]   → prints "anchor ms=<median> gflops=<x>"
// Preconditions: oneDNN 2.x (Debian's libdnnl-dev) built with OpenMP; M, N, K, THREADS, REPS > 0.
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

// The value fill() puts at index i.
float pattern(long i) { return float((i * 37) % 17 - 8) / 16.0f; }

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Fills a memory of n elements with a pattern of small values (exact in bf16), as the type it holds.
void fill(dnnl::memory& m, long n, dt type) {
    void* p = m.get_data_handle();
    for (long i = 0; i < n; ++i) {
        const float x = pattern(i);  // multiples of 1/16 in [-0.5, 0.5]: exact in bf16
        if (type == dt::f32) {
            static_cast<float*>(p)[i] = x;
        } else {
            std::uint32_t u;
            std::memcpy(&u, &x, 4);
            static_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(u >> 16);  // exact: x has few bits
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: dnnl_matmul_bf16 M N K THREADS REPS [f32]\n");
        return 2;
    }
    const long M = std::atol(argv[1]), N = std::atol(argv[2]), K = std::atol(argv[3]);
    const int T = std::atoi(argv[4]), R = std::atoi(argv[5]);
    if (M <= 0 || N <= 0 || K <= 0 || T <= 0 || R <= 0) {
        std::fprintf(stderr, "dnnl_matmul_bf16: M, N, K, THREADS and REPS must be positive\n");
        return 2;
    }
    const dt in_type = argc > 6 && std::strcmp(argv[6], "f32") == 0 ? dt::f32 : dt::bf16;
    omp_set_num_threads(T);

    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const dnnl::memory::desc a_md({M, K}, in_type, tag::ab);
    const dnnl::memory::desc b_plain({K, N}, in_type, tag::ba);  // B[N, K] row-major seen as Bᵀ [K, N]
    const dnnl::memory::desc b_any({K, N}, in_type, tag::any);
    const dnnl::memory::desc c_md({M, N}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);

    dnnl::memory a(a_md, eng), b(b_plain, eng), c(c_md, eng);
    fill(a, M * K, in_type);
    fill(b, N * K, in_type);
    dnnl::memory b_packed = b;
    if (pd.weights_desc() != b_plain) {  // the primitive's own layout, once (prepacked weights)
        b_packed = dnnl::memory(pd.weights_desc(), eng);
        dnnl::reorder(b, b_packed).execute(s, b, b_packed);
    }
    const dnnl::matmul mm(pd);
    auto run = [&] {
        mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b_packed}, {DNNL_ARG_DST, c}});
        s.wait();
    };
    run();  // warm-up
    std::vector<double> ts;
    for (int i = 0; i < R; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    // A check that the product is the one asked for: C[i][j] = Σ_k A[i][k]·B[j][k] at two corners (exact sums).
    const float* cp = static_cast<const float*>(c.get_data_handle());
    for (const long i : {0L, M - 1})
        for (const long j : {0L, N - 1}) {
            double want = 0.0;
            for (long k = 0; k < K; ++k) want += double(pattern(i * K + k)) * double(pattern(j * K + k));
            if (std::abs(double(cp[i * N + j]) - want) > 1e-3 * (1.0 + std::abs(want))) {
                std::fprintf(stderr, "dnnl_matmul_bf16: C[%ld][%ld] = %g, expected %g\n", i, j, double(cp[i * N + j]), want);
                return 1;
            }
        }
    std::sort(ts.begin(), ts.end());
    const double med = ts[ts.size() / 2];
    std::printf("anchor ms=%.3f gflops=%.1f\n", med * 1e3, 2.0 * double(M) * double(N) * double(K) / med / 1e9);
    return 0;
}
