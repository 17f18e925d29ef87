// The decode-step kernels mha::simd::decode_scores (s = scale·q·kᵀ) and decode_accumulate (o += p·v),
// one thread, over a KV cache much larger than the last-level cache, so K and V come from memory:
//   scores/M/d      per tile of n = 256 cache rows: decode_scores(q [M, d], K tile, s [M, 256])
//   accumulate/M/d  per tile: decode_accumulate(p [M, 256], V tile, o [M, d])
//   decode/M/d      per tile: both, K tile then V tile (a decode step without the softmax in between)
//   scores_bf16, accumulate_bf16, decode_bf16 (bf16 and fp8 rows): the same with decode_scores_bf16 /
//                   decode_accumulate_bf16, bf16 compute's kernels (vdpbf16ps where the CPU has AVX512_BF16)
// One iteration walks every tile of the cache once (rows contiguous, row stride d). M in {1, 4, 8, 16,
// 32, 64, 128}, d in {64, 128}, and the cache's element type: type 0 f32, 1 bf16, 2 f16, 3 int8, 4 fp8_e4m3,
// 5 fp8_e5m2 (mha::DataType's values: a KV cache of that type, K and V widened in registers; the same rows,
// half or a quarter of the bytes (an int8 row with its scales); fp8 with the scale 1). At the default size, M = 4 and
// d = 128 is the attention core of one decode step of Llama-3-8B-like shapes (H = 32, Hkv = 8, 32768 keys).
// Counters: GB/s = bytes of K (scores), V (accumulate) or K + V (decode) read ÷ time (at the element size), to compare with
// the machine's read bandwidth (e.g. /tmp/mha-anchors/read_bw 32 1 20, run in the same sitting);
// GFLOPS = 2·M·256·d per kernel per tile ÷ time (what matters at M = 32..128).
// Flags (ours, removed before benchmark::Initialize): --cache_mb=X  megabytes of K and of V each
// (default 128, in f32; the rows per tensor are X·2^20 / (4·d), rounded down to whole tiles, at least one group,
// the same rows for every element type;
// a small X such as 0.25 keeps the cache in L2 and measures the kernels' compute alone); --huge_pages
// asks for 2 MB pages for the cache (madvise; the hardware prefetchers stop at page boundaries);
// --group=G runs the scores of G consecutive K tiles, then the accumulation of their G V tiles (default
// 1: K tile, V tile, K tile, ...; switching between the K and V streams at every tile costs bandwidth).
// Run pinned, with repetitions: taskset -c 1 bench_decode --benchmark_repetitions=5
//   --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

#include <mha/mha.hpp>

#include "core/element_format.hpp"
#include "simd/simd.hpp"

namespace {

constexpr std::size_t kTile = 256;  // cache rows per kernel call
double g_cache_mb = 128;
bool g_huge_pages = false;
std::size_t g_group = 1;

enum class Op { scores, accumulate, decode };

// 64-byte aligned floats (a KV cache's rows start on cache lines; a misaligned vector load that splits
// two lines costs the kernels a second L1 access).
struct AlignedFree {
    void operator()(void* p) const noexcept { std::free(p); }
};
using Floats = std::unique_ptr<float[], AlignedFree>;
using Halves = std::unique_ptr<std::uint16_t[], AlignedFree>;

Floats random_floats(std::size_t n, float lo, float hi, unsigned seed, bool huge = false) {
    const std::size_t align = huge ? std::size_t(2) << 20 : 64;
    const std::size_t bytes = (std::max<std::size_t>(n, 1) * sizeof(float) + align - 1) / align * align;
    Floats v(static_cast<float*>(std::aligned_alloc(align, bytes)));
    if (!v) throw std::bad_alloc();
    if (huge && madvise(v.get(), bytes, MADV_HUGEPAGE) != 0) std::perror("bench_decode: madvise(MADV_HUGEPAGE)");
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (std::size_t i = 0; i < n; ++i) v[i] = dist(gen);
    return v;
}

// K and V of one head, [rows, d] each, shared by the benchmarks of one d (allocated once: 2·cache_mb), and
// their bf16 / f16 roundings for the benchmarks of that type (made when first asked for).
struct Cache {
    std::size_t d = 0, rows = 0;
    Floats k, v;
    mha::DataType half_type = mha::DataType::f32;
    Halves k16, v16;  // half_type's bits
};
Cache& cache_for(std::size_t d, mha::DataType type) {
    static Cache c64, c128, other;
    Cache& c = d == 64 ? c64 : d == 128 ? c128 : other;
    if (c.d != d) {
        c.d = d;
        c.rows = static_cast<std::size_t>(g_cache_mb * double(1 << 20)) / (4 * d) / kTile * kTile;
        c.rows = std::max(c.rows, g_group * kTile);  // at least one group of tiles
        c.k.reset();  // at most one cache of each d at a time
        c.v.reset();
        c.k16.reset();
        c.v16.reset();
        c.half_type = mha::DataType::f32;
        c.k = random_floats(c.rows * d, -1.0f, 1.0f, 1, g_huge_pages);
        c.v = random_floats(c.rows * d, -1.0f, 1.0f, 2, g_huge_pages);
    }
    if (type != mha::DataType::f32 && c.half_type != type) {
        const std::size_t row = mha::kv_row_bytes(type, d), n = c.rows * row, align = g_huge_pages ? std::size_t(2) << 20 : 64;
        const std::size_t bytes = (n + align - 1) / align * align;
        for (auto [dst, src] : {std::pair{&c.k16, c.k.get()}, std::pair{&c.v16, c.v.get()}}) {
            dst->reset();
            auto* h = static_cast<unsigned char*>(std::aligned_alloc(align, bytes));
            if (h == nullptr) throw std::bad_alloc();
            if (g_huge_pages) madvise(h, bytes, MADV_HUGEPAGE);
            for (std::size_t i = 0; i < c.rows; ++i) mha::detail::element_format(type).narrow(src + i * d, h + i * row, d);
            dst->reset(reinterpret_cast<std::uint16_t*>(h));
        }
        c.half_type = type;
    }
    return c;
}

// The cache types the bf16 kernels on vdpbf16ps read (besides f32).
template <class E>
constexpr bool kDotProductsOf = std::is_same_v<E, mha::bfloat16> || std::is_same_v<E, mha::fp8_e4m3> ||
                                std::is_same_v<E, mha::fp8_e5m2>;

void run(benchmark::State& state, Op op, bool bf16_products = false) {
    const auto M = static_cast<std::size_t>(state.range(0)), d = static_cast<std::size_t>(state.range(1));
    const auto type = static_cast<mha::DataType>(state.range(2));
    Cache& c = cache_for(d, type);
    const Floats q = random_floats(M * d, -1.0f, 1.0f, 3);
    // Probabilities of g_group tiles (uniform-ish, summing to about 1 per row); decode overwrites them.
    const Floats p = random_floats(g_group * M * kTile, 0.0f, 2.0f / float(kTile), 4);
    const Floats o = random_floats(M * d, 0.0f, 0.0f, 5);
    // Small scores, used as weights by decode: o stays finite (and normal) over many passes.
    const float scale = 1e-3f / std::sqrt(float(d));
    const mha::ConstMatrix qv(q.get(), M, d);
    const mha::Matrix ov(o.get(), M, d);
    const std::size_t tiles = c.rows / kTile / g_group * g_group;
    auto p_of = [&](std::size_t t) { return mha::Matrix(p.get() + t % g_group * M * kTile, M, kTile); };
    // One pass over the cache with K and V of element type E.
    auto pass = [&](const auto* k, const auto* v) {
        using E = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
        const std::size_t ld = mha::detail::element_format(mha::detail::element_type_of<E>()).row_elements(d);  // elements per row
        // Tiles in groups of g_group: the scores of the group's K tiles, then its V tiles.
        for (std::size_t t0 = 0; t0 < tiles; t0 += g_group) {
            if (op != Op::accumulate)
                for (std::size_t t = t0; t < t0 + g_group; ++t) {
                    const mha::MatrixView<const E> kt(k + t * kTile * ld, kTile, d, ld);
                    if constexpr (kDotProductsOf<E>)
                        if (bf16_products) {
                            mha::simd::decode_scores_bf16(scale, qv, kt, p_of(t));
                            continue;
                        }
                    mha::simd::decode_scores(scale, qv, kt, p_of(t));
                }
            if (op != Op::scores)
                for (std::size_t t = t0; t < t0 + g_group; ++t) {
                    const mha::MatrixView<const E> vt(v + t * kTile * ld, kTile, d, ld);
                    if constexpr (kDotProductsOf<E>)
                        if (bf16_products) {
                            mha::simd::decode_accumulate_bf16(p_of(t), vt, ov);
                            continue;
                        }
                    mha::simd::decode_accumulate(p_of(t), vt, ov);
                }
        }
    };
    for (auto _ : state) {
        if (type == mha::DataType::f32)
            pass(static_cast<const float*>(c.k.get()), static_cast<const float*>(c.v.get()));
        else
            mha::detail::visit_element_type(type, [&](auto e) {
                using E = decltype(e);
                if constexpr (!std::is_same_v<E, float>)
                    pass(reinterpret_cast<const E*>(c.k16.get()), reinterpret_cast<const E*>(c.v16.get()));
            });
        benchmark::DoNotOptimize(p.get());
        benchmark::DoNotOptimize(o.get());
        benchmark::ClobberMemory();
    }
    const double rows = double(tiles * kTile), tensors = op == Op::decode ? 2.0 : 1.0;
    const double bytes = tensors * rows * double(mha::kv_row_bytes(type, d));
    const double flops = tensors * 2.0 * double(M) * rows * double(d);
    const double it = double(state.iterations());
    state.counters["GB"] = benchmark::Counter(bytes * it / 1e9, benchmark::Counter::kIsRate);
    state.counters["GFLOPS"] = benchmark::Counter(flops * it / 1e9, benchmark::Counter::kIsRate);
    state.counters["cache_rows"] = rows;
    state.SetLabel(std::string(mha::isa_name(mha::active_isa())) + " " + std::string(mha::data_type_name(type)));
}

void shapes(benchmark::internal::Benchmark* b) {
    for (std::int64_t type : {0, 1, 2, 3, 4, 5})
        for (std::int64_t d : {64, 128})
            for (std::int64_t M : {1, 4, 8, 16, 32, 64, 128}) b->Args({M, d, type});
    b->ArgNames({"M", "d", "type"});
    b->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(run, scores, Op::scores)->Apply(shapes);
BENCHMARK_CAPTURE(run, accumulate, Op::accumulate)->Apply(shapes);
BENCHMARK_CAPTURE(run, decode, Op::decode)->Apply(shapes);

void bf16_shapes(benchmark::internal::Benchmark* b) {
    for (mha::DataType type : {mha::DataType::bf16, mha::DataType::fp8_e4m3, mha::DataType::fp8_e5m2})
        for (std::int64_t d : {64, 128})
            for (std::int64_t M : {1, 4, 8, 16, 32}) b->Args({M, d, static_cast<std::int64_t>(type)});
    b->ArgNames({"M", "d", "type"});
    b->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(run, scores_bf16, Op::scores, true)->Apply(bf16_shapes);
BENCHMARK_CAPTURE(run, accumulate_bf16, Op::accumulate, true)->Apply(bf16_shapes);
BENCHMARK_CAPTURE(run, decode_bf16, Op::decode, true)->Apply(bf16_shapes);

// Reads our flags and removes them from argv; everything else goes to benchmark::Initialize.
bool parse_options(int& argc, char** argv) {
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        const char* a = argv[i];
        if (std::strncmp(a, "--cache_mb=", 11) == 0) {
            char* end = nullptr;
            const double mb = std::strtod(a + 11, &end);
            if (*end != '\0' || !(mb > 0)) {
                std::fprintf(stderr, "bench_decode: --cache_mb needs a positive number, got '%s'\n", a + 11);
                return false;
            }
            g_cache_mb = mb;
        } else if (std::strncmp(a, "--group=", 8) == 0) {
            char* end = nullptr;
            const long g = std::strtol(a + 8, &end, 10);
            if (*end != '\0' || g <= 0) {
                std::fprintf(stderr, "bench_decode: --group needs a positive integer, got '%s'\n", a + 8);
                return false;
            }
            g_group = static_cast<std::size_t>(g);
        } else if (std::strcmp(a, "--huge_pages") == 0) {
            g_huge_pages = true;
        } else {
            if (std::strcmp(a, "--help") == 0)
                std::printf("bench_decode flags: --cache_mb=X (MB of K and of V each, default 128), --huge_pages, --group=G\n");
            argv[kept++] = argv[i];
        }
    }
    argc = kept;
    argv[argc] = nullptr;
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    if (!parse_options(argc, argv)) return 2;
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
