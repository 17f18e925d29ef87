// The subcommands of the `mha` tool: their options (filled by CLI11 in mha_main.cpp) and entry points.
// Each entry point throws on bad input (npy::error, mha::invalid_argument, tool_error); mha_main.cpp
// turns any exception into one line on stderr and a nonzero exit code.
#pragma once
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>

#include <mha/mha.hpp>

namespace mha::tool {

// Bad input found by the tool itself (shapes that disagree, conflicting options, ...).
class tool_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct RunOptions {
    std::string npy_dir;
    std::size_t heads = 0;
    bool causal = false;
    std::optional<float> norm_eps;
    bool need_weights = false;
    Backend backend = Backend::simd;
    int threads = 0;
    Impl impl = Impl::automatic;
    bool seq_first = false;  // query/key/value and output are [L, B, E] (PyTorch's batch_first=False)
    std::string out;  // empty: <npy_dir>/output.npy
};

// `mha run`: reads the .npy inputs, computes, then writes output.npy (and attn_weights.npy).
// Nothing is written unless every input is valid and the forward pass succeeded.
void run_command(const RunOptions& options);

enum class BenchOp { attention, gemm, softmax, layernorm };

struct BenchOptions {
    BenchOp op = BenchOp::attention;
    // attention
    std::size_t batch = 8, seq = 128, embed = 768, heads = 12;
    std::optional<std::size_t> kv_seq;  // default: seq
    bool causal = false;
    Impl impl = Impl::automatic;
    // gemm: C[m, n] = A[m, k] · B[n, k]ᵀ
    std::size_t m = 1024, n = 2304, k = 768;
    // softmax, layernorm
    std::size_t rows = 1024, cols = 768;
    Backend backend = Backend::simd;
    std::optional<int> threads;  // absent: all cores for attention, 1 for the kernels
    int reps = 10;
    bool json = false;
};

// `mha bench`: times one op and prints one line (readable, or one JSON object with --json).
void bench_command(const BenchOptions& options);

}  // namespace mha::tool
