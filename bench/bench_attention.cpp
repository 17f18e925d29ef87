// Multi-head self-attention forward speed (MultiheadAttention::forward, no masks, no weights out):
// BERT-base shapes and three scaling sweeps, registered at run time from command-line lists.
//   FLOPs of one forward: 8·B·L·E² (Q, K, V and output projections) + 4·B·L²·E (Q·Kᵀ and P·V).
// Suites (--suites=bert,heads,threads,lengths; default: all):
//   bert     E 768, H 12, L 128 and 512, B 1 and 8; simd on 1 thread and on all; scalar at B=1 L=128 only.
//   heads    H in --heads at each E in --embed, B = --batch, L = --seq: simd on all threads, and the
//            scalar reference at B = --scalar-batch (default 1: B=8 would take minutes), one thread.
//   threads  simd with each thread count in --threads (default 1..hardware threads), at B = --batch,
//            L = --seq, E = first of --embed, H 12.
//   lengths  L in --lengths, B 1, E 768, H 12, all threads, Impl::materialized vs Impl::fused.
//   bf16     E 768, H 12 at B 8 L 128 and B 1 L 2048, 1 thread and all: fp32, then bf16 compute
//            (AttentionConfig::compute; on the vdpbf16ps kernels where the CPU has AVX512_BF16).
// Counters (every time is wall-clock time, UseRealTime: the work runs on oneTBB worker threads):
//   GFLOPS             FLOPs above ÷ time.
//   pct_peak           GFLOPS as % of the FMA peak this binary measures at start-up on the same
//                      number of threads (bench/fma_peak.hpp; the scalar runs count against it too).
//   speedup_vs_scalar  heads and bert: simd GFLOP/s ÷ scalar GFLOP/s at the same E and H (heads: the
//                      scalar is at B = --scalar-batch, one thread; the simd on all threads).
//   speedup_vs_1t      threads: GFLOP/s ÷ GFLOP/s of the 1-thread run.
//   speedup_vs_f32     bf16: GFLOP/s ÷ GFLOP/s of the fp32 run of the same shape and threads.
//   scratch            lengths: bytes of working memory, computed from the shape (see scratch_bytes).
//   rss_growth         lengths: measured rise of the peak resident memory over one forward call in a
//                      fresh process (this binary re-run with --memory-probe, see probe_memory): the
//                      same memory the model above counts, as the system sees it. A fresh process,
//                      because the library keeps its buffers per thread for later calls.
// Our flags are removed before benchmark::Initialize; Google Benchmark's own flags work as usual
// (--benchmark_filter, --benchmark_min_time=0.01, --benchmark_out=FILE --benchmark_out_format=json).
#include <benchmark/benchmark.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <tbb/task_arena.h>

#include <mha/mha.hpp>

#include "fma_peak.hpp"

namespace {

// --- command line ----------------------------------------------------------------------------------

struct Options {
    std::set<std::string> suites{"bert", "heads", "threads", "lengths", "bf16"};
    std::vector<std::size_t> heads{1, 2, 4, 8, 12, 16, 32, 64};
    std::vector<std::size_t> embeds{768, 1024};
    std::size_t batch = 8;
    std::size_t seq = 128;
    std::vector<std::size_t> threads;  // empty: 1..hardware threads
    std::vector<std::size_t> lengths{128, 512, 1024, 2048, 4096, 8192};
    std::size_t scalar_batch = 1;
    bool scalar = true;
};

const char* const kUsage =
    "Attention benchmark options (before or among Google Benchmark's --benchmark_* flags):\n"
    "  --suites=LIST        bert,heads,threads,lengths,bf16 (default: all five)\n"
    "  --heads=LIST         head counts of the heads sweep (default 1,2,4,8,12,16,32,64)\n"
    "  --embed=LIST         embed dims of the heads sweep; the first one is used by the threads sweep (768,1024)\n"
    "  --batch=N            batch of the heads and threads sweeps (8)\n"
    "  --seq=N              sequence length of the heads and threads sweeps (128)\n"
    "  --threads=LIST       thread counts of the threads sweep (default 1..hardware threads)\n"
    "  --lengths=LIST       sequence lengths of the lengths sweep (128,512,1024,2048,4096,8192)\n"
    "  --scalar-batch=N     batch of the scalar runs in the heads sweep (1)\n"
    "  --no-scalar          skip the scalar runs of the heads sweep\n"
    "LIST is comma-separated positive integers; a value may follow '=' or come as the next argument.\n";

[[noreturn]] void usage_error(const std::string& message) {
    std::cerr << "bench_attention: " << message << "\n" << kUsage;
    std::exit(2);
}

std::size_t parse_count(const std::string& flag, const std::string& text) {
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
        v = std::stoull(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != text.size() || text.empty() || text[0] == '-' || v == 0 || v > (1ull << 20))
        usage_error(flag + ": '" + text + "' is not a positive integer (at most 2^20)");
    return std::size_t(v);
}

std::vector<std::size_t> parse_list(const std::string& flag, const std::string& text) {
    std::vector<std::size_t> values;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) values.push_back(parse_count(flag, item));
    if (values.empty()) usage_error(flag + " needs at least one value");
    return values;
}

// Reads our flags and removes them from argv, leaving the program name and everything else for
// benchmark::Initialize. "--help" is left in place too, after printing our part of the usage.
Options parse_options(int& argc, char** argv) {
    Options o;
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::cout << kUsage << "\n";
            argv[kept++] = argv[i];
            continue;
        }
        if (arg == "--no-scalar") {
            o.scalar = false;
            continue;
        }
        const auto eq = arg.find('=');
        const std::string name = arg.substr(0, eq);
        static const std::set<std::string> ours{"--suites", "--heads", "--embed", "--batch", "--seq",
                                                "--threads", "--lengths", "--scalar-batch"};
        if (!ours.count(name)) {
            argv[kept++] = argv[i];
            continue;
        }
        std::string value;
        if (eq != std::string::npos) {
            value = arg.substr(eq + 1);
        } else {
            if (i + 1 >= argc) usage_error(name + " needs a value");
            value = argv[++i];
        }
        if (name == "--suites") {
            o.suites.clear();
            std::stringstream in(value);
            for (std::string s; std::getline(in, s, ',');) {
                if (s != "bert" && s != "heads" && s != "threads" && s != "lengths" && s != "bf16")
                    usage_error("--suites: unknown suite '" + s + "'");
                o.suites.insert(s);
            }
        } else if (name == "--heads") {
            o.heads = parse_list(name, value);
        } else if (name == "--embed") {
            o.embeds = parse_list(name, value);
        } else if (name == "--batch") {
            o.batch = parse_count(name, value);
        } else if (name == "--seq") {
            o.seq = parse_count(name, value);
        } else if (name == "--threads") {
            o.threads = parse_list(name, value);
        } else if (name == "--lengths") {
            o.lengths = parse_list(name, value);
        } else if (name == "--scalar-batch") {
            o.scalar_batch = parse_count(name, value);
        }
    }
    argc = kept;
    argv[argc] = nullptr;
    return o;
}

// --- measurements ----------------------------------------------------------------------------------

mha_bench::FmaPeak g_peak;
// GFLOP/s of the runs other runs compare against, by key (filled in registration order).
std::map<std::string, double> g_baseline_gflops;

struct Shape {
    std::size_t B, L, E, H;
};

double attention_flops(const Shape& s) {
    const double B = double(s.B), L = double(s.L), E = double(s.E);
    return 8 * B * L * E * E + 4 * B * L * L * E;
}

// Threads a run actually gets: the library clamps to what TBB can run; the scalar reference is serial.
unsigned effective_threads(mha::Backend backend, int threads) {
    if (backend == mha::Backend::scalar) return 1;
    const int max = tbb::this_task_arena::max_concurrency();
    return unsigned(threads == 0 ? max : std::min(threads, max));
}

// Working memory of one forward, in bytes, from the shape: what the SIMD backend allocates (mirrors
// lib/attention; the measured rss_growth checks it):
//   both impls: projected Q|K|V [B, L, 3E] + context [B, L, E] = B·L·4E floats;
//   materialized: per thread the scores of one 64-query block, 64·L floats;
//   fused: each head's K_hᵀ and V_h packed into GEMM panels (2·B·L·E floats, plus the zero padding of the
//   last panel: to 32 keys for K, to 32 columns of d for V on AVX-512), and per thread for one 128-query
//   block a 128×256 score tile, a 128×d context accumulator and 2·128 row statistics.
double scratch_bytes(const Shape& s, mha::Impl impl, unsigned threads) {
    const double B = double(s.B), L = double(s.L), E = double(s.E), d = double(s.E / s.H), H = double(s.H);
    const bool fused = impl == mha::Impl::fused;
    const double padded_l = std::ceil(L / 32.0) * 32.0, padded_d = std::ceil(d / 32.0) * 32.0;
    const double panels = B * H * (padded_l * d + L * padded_d);
    const double buffers = B * L * 4.0 * E + (fused ? panels : 0.0);
    const double per_thread = fused ? 128.0 * 256.0 + 128.0 * d + 2.0 * 128.0 : 64.0 * L;
    return 4.0 * (buffers + threads * per_thread);
}

// Peak resident memory of the process, resettable on Linux: writing 5 to /proc/self/clear_refs (since
// 4.0) sets the high-water mark VmHWM (/proc/self/status) back to the current RSS, so its rise over a
// call is the call's peak extra memory. (getrusage's ru_maxrss is not used: it also keeps the peak
// recorded whenever a thread exits, which no reset clears.) Freed heap goes back to the system first.
struct PeakRss {
    static bool reset() {
#if defined(__GLIBC__)
        malloc_trim(0);
#endif
        std::ofstream f("/proc/self/clear_refs");
        f << "5";
        f.flush();
        return bool(f) && high_water_bytes() > 0;
    }
    // VmHWM in bytes, or 0 if it cannot be read.
    static double high_water_bytes() {
        std::ifstream status("/proc/self/status");
        for (std::string line; std::getline(status, line);)
            if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // "VmHWM:  1234 kB"
        return 0;
    }
};

std::vector<float> random_floats(std::size_t n, float scale, unsigned seed) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

// One self-attention problem: random weights (scaled 1/sqrt(E), which keeps activations O(1) as trained
// weights do), a random query, the output (touched now, so its pages are not the forward's growth).
struct Problem {
    std::vector<float> in_w, in_b, out_w, out_b, query, output;
    mha::MultiheadAttention attention;
    mha::AttentionInputs in;
    mha::AttentionOutputs out;

    explicit Problem(const Shape& s, mha::DataType compute = mha::DataType::f32)
        : in_w(random_floats(3 * s.E * s.E, 1.0f / std::sqrt(float(s.E)), 1)), in_b(random_floats(3 * s.E, 0.1f, 2)),
          out_w(random_floats(s.E * s.E, 1.0f / std::sqrt(float(s.E)), 3)), out_b(random_floats(s.E, 0.1f, 4)),
          query(random_floats(s.B * s.L * s.E, 1.0f, 5)), output(query.size(), 0.0f),
          attention(weights(), mha::AttentionConfig{s.E, s.H, 0, 0, 0, 0, std::nullopt, compute, std::nullopt, {}}) {
        in.query = mha::ConstBatch(query.data(), s.B, s.L, s.E);  // key, value unset: self-attention
        out.output = mha::Batch(output.data(), s.B, s.L, s.E);
    }
    mha::AttentionWeights weights() const {
        mha::AttentionWeights w;
        w.in_proj_weight = in_w.data();
        w.in_proj_bias = in_b.data();
        w.out_proj_weight = out_w.data();
        w.out_proj_bias = out_b.data();
        return w;
    }
    void forward(const mha::ForwardOptions& opt) const { attention.forward(in, out, opt); }
};

mha::ForwardOptions options_for(mha::Backend backend, int threads, mha::Impl impl) {
    mha::ForwardOptions opt;
    opt.backend = backend;
    opt.threads = threads;
    opt.impl = impl;
    return opt;
}

// One small forward on all threads outside any benchmark: starts the TBB workers.
void warm_up() { Problem({1, 64, 64, 4}).forward({}); }

// --- memory probe: one forward in a fresh process ---------------------------------------------------

std::string g_self_exe;  // this binary, for the probe processes

const char* impl_name(mha::Impl impl) {
    return impl == mha::Impl::fused ? "fused" : impl == mha::Impl::materialized ? "materialized" : "automatic";
}

// The child's side (--memory-probe=B,L,E,H,impl,threads): prints the rise of VmHWM over one simd forward
// after the problem exists and the TBB workers run, or -1.
int memory_probe_main(const std::string& spec) {
    std::size_t B = 0, L = 0, E = 0, H = 0;
    int threads = 0;
    char impl[16] = {};
    if (std::sscanf(spec.c_str(), "%zu,%zu,%zu,%zu,%15[a-z],%d", &B, &L, &E, &H, impl, &threads) != 6 || B == 0 ||
        L == 0 || E == 0 || H == 0 || E % H != 0 || threads < 0) {
        std::fprintf(stderr, "bench_attention: bad --memory-probe=%s\n", spec.c_str());
        return 2;
    }
    const mha::Impl which = std::string(impl) == "fused" ? mha::Impl::fused
                            : std::string(impl) == "materialized" ? mha::Impl::materialized
                                                                   : mha::Impl::automatic;
    warm_up();
    const Problem problem({B, L, E, H});
    double growth = -1;
    if (PeakRss::reset()) {
        const double before = PeakRss::high_water_bytes();
        problem.forward(options_for(mha::Backend::simd, threads, which));
        growth = PeakRss::high_water_bytes() - before;
    }
    std::printf("%.0f\n", growth);
    return 0;
}

// The parent's side: runs `this-binary --memory-probe=...` and reads its answer; -1 on any failure.
double probe_memory(const Shape& s, mha::Impl impl, int threads) {
    if (g_self_exe.empty()) return -1;
    const std::string spec = "--memory-probe=" + std::to_string(s.B) + "," + std::to_string(s.L) + "," +
                             std::to_string(s.E) + "," + std::to_string(s.H) + "," + impl_name(impl) + "," +
                             std::to_string(threads);
    int fd[2];
    if (pipe(fd) != 0) return -1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fd[0]);
    posix_spawn_file_actions_addclose(&actions, fd[1]);
    std::vector<char*> args{g_self_exe.data(), const_cast<char*>(spec.c_str()), nullptr};
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, g_self_exe.c_str(), &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fd[1]);
    std::string answer;
    if (spawned == 0) {
        char buf[256];
        for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) answer.append(buf, std::size_t(n));
    }
    close(fd[0]);
    int status = 0;
    if (spawned != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    try {
        return std::stod(answer);
    } catch (const std::exception&) {
        return -1;
    }
}

// --- the benchmark body ---------------------------------------------------------------------------

// What a run compares itself with: it records its GFLOP/s under `record` and, if another run recorded
// under `compare_with`, reports own ÷ that as the counter `counter`.
struct Case {
    Shape shape;
    mha::Backend backend = mha::Backend::simd;
    int threads = 0;  // 0: all
    mha::Impl impl = mha::Impl::automatic;
    mha::DataType compute = mha::DataType::f32;
    std::string record, compare_with, counter;
    std::string label;
    bool memory = false;  // report scratch and rss_growth
};

Case make_case(Shape shape, mha::Backend backend, int threads, mha::Impl impl = mha::Impl::automatic) {
    Case c;
    c.shape = shape;
    c.backend = backend;
    c.threads = threads;
    c.impl = impl;
    return c;
}

void run_case(benchmark::State& state, const Case& c) {
    const Shape& s = c.shape;
    const mha::ForwardOptions opt = options_for(c.backend, c.threads, c.impl);
    // Google Benchmark calls this several times per benchmark (and per repetition): probe once.
    static std::map<std::string, double> probed;
    double rss_growth = -1;
    if (c.memory) {
        const std::string key = std::string(impl_name(c.impl)) + "/" + std::to_string(s.L) + "/" + std::to_string(c.threads);
        const auto it = probed.find(key);
        rss_growth = it != probed.end() ? it->second : (probed[key] = probe_memory(s, c.impl, c.threads));
    }

    const Problem problem(s, c.compute);
    // Untimed first call: starts the TBB workers and grows the per-thread buffers.
    try {
        problem.forward(opt);
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
        return;
    }

    // The calls are also timed here (what UseRealTime measures, less the loop's own overhead) for the
    // derived counters, which Google Benchmark would otherwise print as rates per second.
    double seconds = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        problem.forward(opt);
        benchmark::DoNotOptimize(problem.output.data());
        benchmark::ClobberMemory();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    const double gflop = attention_flops(s) * 1e-9;
    const unsigned threads = effective_threads(c.backend, c.threads);
    state.counters["GFLOPS"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
    const double gflops = gflop * double(state.iterations()) / seconds;
    if (g_peak.gflops_1 > 0) state.counters["pct_peak"] = 100.0 * gflops / g_peak.for_threads(threads);
    if (!c.record.empty()) {  // with --benchmark_repetitions: the best repetition
        double& best = g_baseline_gflops[c.record];
        best = std::max(best, gflops);
    }
    if (!c.compare_with.empty()) {
        const auto base = g_baseline_gflops.find(c.compare_with);
        if (base != g_baseline_gflops.end()) state.counters[c.counter] = gflops / base->second;
    }
    if (c.memory) {
        state.counters["scratch"] = benchmark::Counter(scratch_bytes(s, c.impl, threads), benchmark::Counter::kDefaults,
                                                       benchmark::Counter::kIs1024);
        if (rss_growth >= 0)
            state.counters["rss_growth"] =
                benchmark::Counter(rss_growth, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
    }
    if (!c.label.empty()) state.SetLabel(c.label);
}

// --- registration ----------------------------------------------------------------------------------

std::string name_of(const std::string& suite, const Case& c) {
    std::ostringstream n;
    n << suite << '/' << (c.backend == mha::Backend::simd ? "simd" : "scalar") << "/E:" << c.shape.E << "/H:" << c.shape.H
      << "/B:" << c.shape.B << "/L:" << c.shape.L << "/threads:" << effective_threads(c.backend, c.threads);
    if (c.impl != mha::Impl::automatic) n << "/impl:" << (c.impl == mha::Impl::fused ? "fused" : "materialized");
    if (c.compute != mha::DataType::f32) n << "/compute:" << mha::data_type_name(c.compute);
    return n.str();
}

void add(const std::string& suite, const Case& c) {
    benchmark::RegisterBenchmark(name_of(suite, c).c_str(), [c](benchmark::State& st) { run_case(st, c); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

std::string key(const char* what, std::size_t E, std::size_t H) {
    return std::string(what) + "/" + std::to_string(E) + "/" + std::to_string(H);
}

void register_bert() {
    const std::size_t E = 768, H = 12;
    Case scalar = make_case({1, 128, E, H}, mha::Backend::scalar, 1);
    scalar.record = "bert/scalar/B1/L128";
    add("bert", scalar);
    for (std::size_t L : {128, 512})
        for (std::size_t B : {1, 8})
            for (int threads : {1, 0}) {
                Case c = make_case({B, L, E, H}, mha::Backend::simd, threads);
                if (B == 1 && L == 128) {
                    c.compare_with = scalar.record;
                    c.counter = "speedup_vs_scalar";
                }
                add("bert", c);
            }
}

void register_bf16() {
    for (const Shape& shape : {Shape{8, 128, 768, 12}, Shape{1, 2048, 768, 12}})
        for (int threads : {1, 0}) {
            Case f32 = make_case(shape, mha::Backend::simd, threads);
            f32.record = "bf16/f32/" + std::to_string(shape.B) + "/" + std::to_string(shape.L) + "/" + std::to_string(threads);
            add("bf16", f32);
            Case bf16 = f32;
            bf16.record.clear();
            bf16.compute = mha::DataType::bf16;
            bf16.compare_with = f32.record;
            bf16.counter = "speedup_vs_f32";
            add("bf16", bf16);
        }
}

void register_heads(const Options& o) {
    for (std::size_t E : o.embeds)
        for (std::size_t H : o.heads) {
            if (E % H != 0) {
                std::cerr << "heads sweep: skipping E " << E << " H " << H << " (E % H != 0)\n";
                continue;
            }
            if (o.scalar) {
                Case scalar = make_case({o.scalar_batch, o.seq, E, H}, mha::Backend::scalar, 1);
                scalar.record = key("scalar", E, H);
                scalar.label = "scalar reference, 1 thread, B=" + std::to_string(o.scalar_batch) +
                               (o.scalar_batch < o.batch ? " (smaller batch: it is slow)" : "");
                add("heads", scalar);
            }
            Case simd = make_case({o.batch, o.seq, E, H}, mha::Backend::simd, 0);
            simd.compare_with = key("scalar", E, H);
            simd.counter = "speedup_vs_scalar";
            add("heads", simd);
        }
}

void register_threads(const Options& o) {
    const std::size_t E = o.embeds.front(), H = E % 12 == 0 ? 12 : 1;
    std::vector<std::size_t> counts = o.threads;
    if (counts.empty())
        for (unsigned t = 1; t <= std::max(1u, std::thread::hardware_concurrency()); ++t) counts.push_back(t);
    for (std::size_t t : counts) {
        Case c = make_case({o.batch, o.seq, E, H}, mha::Backend::simd, int(t));
        if (t == 1) c.record = "threads/1";
        c.compare_with = "threads/1";
        c.counter = "speedup_vs_1t";
        add("threads", c);
    }
}

void register_lengths(const Options& o) {
    for (std::size_t L : o.lengths)
        for (mha::Impl impl : {mha::Impl::materialized, mha::Impl::fused}) {
            Case c = make_case({1, L, 768, 12}, mha::Backend::simd, 0, impl);
            c.memory = true;
            add("lengths", c);
        }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]).rfind("--memory-probe=", 0) == 0)
        return memory_probe_main(std::string(argv[1]).substr(15));
    char self[4096];
    const ssize_t self_len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (self_len > 0) g_self_exe.assign(self, std::size_t(self_len));

    const Options options = parse_options(argc, argv);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    std::cout.setf(std::ios::unitbuf);  // a line per benchmark as it finishes, also through a pipe

    bool listing = false;
    for (int i = 1; i < argc; ++i) listing |= std::string(argv[i]).rfind("--benchmark_list_tests", 0) == 0;
    if (!listing) {
        g_peak = mha_bench::measure_fma_peak();
        std::printf("FMA peak (%s loop): %.1f GFLOP/s on 1 thread, %.1f GFLOP/s on %u threads\n", g_peak.isa.c_str(),
                    g_peak.gflops_1, g_peak.gflops_all, g_peak.threads);
        benchmark::AddCustomContext("fma_peak_isa", g_peak.isa);
        benchmark::AddCustomContext("fma_peak_gflops_1thread", std::to_string(g_peak.gflops_1));
        benchmark::AddCustomContext("fma_peak_gflops_all_threads", std::to_string(g_peak.gflops_all));
        benchmark::AddCustomContext("fma_peak_threads", std::to_string(g_peak.threads));
        benchmark::AddCustomContext("mha_isa", std::string(mha::isa_name(mha::active_isa())));
        benchmark::AddCustomContext("tbb_max_concurrency", std::to_string(tbb::this_task_arena::max_concurrency()));
    }

    // Start the TBB workers and grow their stacks before the first measurement.
    if (!listing) warm_up();

    if (options.suites.count("bert")) register_bert();
    if (options.suites.count("heads")) register_heads(options);
    if (options.suites.count("threads")) register_threads(options);
    if (options.suites.count("lengths")) register_lengths(options);
    if (options.suites.count("bf16")) register_bf16();

    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
