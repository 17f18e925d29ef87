// Row softmax and row layernorm through the public API (mha::softmax_rows / mha::layernorm_rows), SIMD
// next to the scalar reference, single thread, on 1024 rows × 768 and × 1024.
// Counters: GB/s = (bytes read + bytes written) / time, counting the row data once per pass over the
// matrix as a whole: softmax reads and writes x (8 bytes per element, no mask); layernorm reads x and
// writes y (8 bytes per element; gamma and beta are one row, reused from cache).
// After the runs, a table gives scalar CPU time / SIMD CPU time per shape (medians when
// --benchmark_repetitions is set; CPU time because the machine is shared and wall time absorbs
// other processes). Run pinned: taskset -c 1 bench_rows --benchmark_repetitions=5.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <mha/mha.hpp>

namespace {

constexpr std::size_t kRows = 1024;

std::vector<float> random_matrix(std::size_t n, float lo, float hi, unsigned seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

void set_counters(benchmark::State& state, std::size_t cols, double bytes_per_element) {
    const double bytes = bytes_per_element * double(kRows) * double(cols);
    // Shown as "GB" with a "/s" suffix: a rate over the benchmark's CPU time.
    state.counters["GB"] = benchmark::Counter(bytes * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
    state.counters["rows"] = double(kRows);
    state.counters["cols"] = double(cols);
}

void softmax_bench(benchmark::State& state, mha::Backend backend, std::size_t cols) {
    // Attention-like scores; in place, so later iterations see probabilities (same work per element).
    auto x = random_matrix(kRows * cols, -8.0f, 8.0f, 1);
    for (auto _ : state) {
        mha::softmax_rows(mha::Matrix(x.data(), kRows, cols), 0.125f, {}, backend);
        benchmark::DoNotOptimize(x.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, cols, 8.0);
}

void layernorm_bench(benchmark::State& state, mha::Backend backend, std::size_t cols) {
    const auto x = random_matrix(kRows * cols, -3.0f, 5.0f, 2);
    const auto gamma = random_matrix(cols, 0.5f, 1.5f, 3), beta = random_matrix(cols, -1.0f, 1.0f, 4);
    std::vector<float> y(kRows * cols);
    for (auto _ : state) {
        mha::layernorm_rows(mha::ConstMatrix(x.data(), kRows, cols), mha::Matrix(y.data(), kRows, cols), gamma.data(),
                            beta.data(), 1e-5f, {}, backend);
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    set_counters(state, cols, 8.0);
}

// Prints the console output, then scalar / SIMD time per (op, shape): from the median aggregate when
// there are repetitions, else from the single run.
class RatioReporter : public benchmark::ConsoleReporter {
public:
    // Colour only on a terminal (this reporter replaces the one --benchmark_color would configure).
    RatioReporter() : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular) {}
    void ReportRuns(const std::vector<Run>& runs) override {
        for (const Run& run : runs) {
            if (run.error_occurred) continue;
            const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
            const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
            if (!median && !single) continue;
            // Names are "<op>/<backend>/<rows>x<cols>".
            const std::string name = run.run_name.function_name;
            const auto first = name.find('/'), second = name.find('/', first + 1);
            const std::string key = name.substr(0, first) + "/" + name.substr(second + 1);
            const std::string backend = name.substr(first + 1, second - first - 1);
            times_[key][backend] = run.GetAdjustedCPUTime();
        }
        ConsoleReporter::ReportRuns(runs);
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        std::printf("\n%-24s %14s %14s %10s\n", "op/shape", "scalar", "simd", "speedup");
        for (const auto& [key, by_backend] : times_) {
            const auto scalar = by_backend.find("scalar"), simd = by_backend.find("simd");
            if (scalar == by_backend.end() || simd == by_backend.end()) continue;
            std::printf("%-24s %14.1f %14.1f %9.2fx\n", key.c_str(), scalar->second, simd->second,
                        scalar->second / simd->second);
        }
        std::printf("(CPU time per iteration in the benchmark's time unit; medians when repeated)\n");
    }

private:
    std::map<std::string, std::map<std::string, double>> times_;
};

}  // namespace

int main(int argc, char** argv) {
    for (std::size_t cols : {std::size_t{768}, std::size_t{1024}}) {
        const std::string shape = std::to_string(kRows) + "x" + std::to_string(cols);
        for (auto [backend, label] : {std::pair{mha::Backend::scalar, "scalar"}, std::pair{mha::Backend::simd, "simd"}}) {
            benchmark::RegisterBenchmark(("softmax_rows/" + std::string(label) + "/" + shape).c_str(), softmax_bench,
                                         backend, cols)
                ->Unit(benchmark::kMicrosecond);
            benchmark::RegisterBenchmark(("layernorm_rows/" + std::string(label) + "/" + shape).c_str(),
                                         layernorm_bench, backend, cols)
                ->Unit(benchmark::kMicrosecond);
        }
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
