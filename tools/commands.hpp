// The subcommands of the `mha` tool (run, sdpa, bench): their options (filled by CLI11 in mha_main.cpp)
// and entry points.
// Each entry point throws on bad input (npy::error, mha::invalid_argument, tool_error); mha_main.cpp
// turns any exception into one line on stderr and a nonzero exit code.
#pragma once
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>

#include <mha/mha.hpp>
#include <mha/sdpa.hpp>

namespace mha::tool {

// Bad input found by the tool itself (shapes that disagree, conflicting options, ...).
class tool_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The score modifiers' flags (mha/attention.hpp's ScoreModifiers), shared by run, sdpa and bench:
// --window-left N, --window-right N (absent: unbounded), --softcap C (> 0), --alibi (BLOOM's standard slopes).
// run and sdpa also read sinks.npy [H] and alibi_slopes.npy [H] from DIR (float; alibi_slopes.npy and --alibi
// exclude each other); bench's --sinks draws random sinks.
struct ModifierOptions {
    std::optional<long long> window_left, window_right;
    std::optional<float> softcap;
    bool alibi = false;
    bool sinks = false;  // bench only
    bool any() const { return window_left || window_right || softcap || alibi || sinks; }
};

struct RunOptions {
    std::string npy_dir;
    std::size_t heads = 0;
    std::optional<std::size_t> kv_heads;  // absent: heads
    std::optional<std::size_t> head_dim;  // absent: q_proj_weight.npy rows / heads, or E / heads
    std::optional<float> rope_theta;      // set: rotary embeddings on
    std::optional<RopeStyle> rope_style;  // only with rope_theta; absent: half
    std::optional<std::size_t> rope_dims; // only with rope_theta; absent: the head dim
    std::optional<std::size_t> position_offset;  // --position-offset (absent: 0)
    bool causal = false;
    CausalAlignment causal_alignment = CausalAlignment::top_left;
    std::optional<float> norm_eps;
    bool need_weights = false;
    Backend backend = Backend::simd;
    int threads = 0;
    Algorithm impl = Algorithm::automatic;
    bool seq_first = false;  // query/key/value and output are [L, B, E] (PyTorch's batch_first=False)
    DataType dtype = DataType::f32;  // --dtype: AttentionConfig::compute (f32 or bf16)
    bool bf16_raw = false;           // --bf16-raw: float inputs and weights are uint16 .npy of bfloat16 bits
    // --chunk N: feed the query through a KV cache N tokens at a time (causal). Set, or past_key.npy /
    // past_value.npy in the folder: the KV cache path, which also writes present_key.npy / present_value.npy.
    std::optional<std::size_t> chunk;
    // --kv-type: the KV cache's element type (absent: f32); only with the KV cache path. Past and new K / V
    // are rounded into it, and present_key.npy / present_value.npy hold the cached (rounded) values as float32.
    std::optional<DataType> kv_type;
    // --k-scale / --v-scale: an fp8 cache's scales (absent: 1); refused with another cache type or without a cache.
    std::optional<float> k_scale, v_scale;
    ModifierOptions modifiers;
    std::string out;  // empty: <npy_dir>/output.npy
};

// `mha run`: reads the .npy inputs, computes, then writes output.npy (and attn_weights.npy, or with a KV
// cache present_key.npy and present_value.npy). Nothing is written unless every input is valid and the
// forward pass succeeded.
void run_command(const RunOptions& options);

// `mha sdpa`: scaled_dot_product_attention on q.npy [B, H, Lq, d], k.npy / v.npy [B, Hkv, Lk, d] and the
// optional masks; writes output.npy [B, H, Lq, d]. Nothing is written unless everything succeeded.
struct SdpaCommandOptions {
    std::string npy_dir;
    bool causal = false;
    CausalAlignment causal_alignment = CausalAlignment::top_left;
    std::optional<float> scale;  // absent: 1/sqrt(d)
    Backend backend = Backend::simd;
    int threads = 0;
    Algorithm impl = Algorithm::automatic;
    ModifierOptions modifiers;
    std::string out;  // empty: <npy_dir>/output.npy
};

void sdpa_command(const SdpaCommandOptions& options);

enum class BenchOp { attention, sdpa, decode, step, gemm, softmax, layernorm };

struct BenchOptions {
    BenchOp op = BenchOp::attention;
    // attention, sdpa
    std::size_t batch = 8, embed = 768, heads = 12;
    std::optional<std::size_t> seq;       // default: 128; decode: 1 (the new tokens per step)
    std::optional<std::size_t> kv_seq;    // default: seq; decode: 1024 (the tokens already cached)
    std::optional<std::size_t> kv_heads;  // default: heads
    std::optional<std::size_t> head_dim;  // default: attention embed / heads; sdpa 64
    std::optional<std::size_t> kdim, vdim;     // attention: key / value features, default embed
    std::optional<float> rope_theta;           // attention, decode: rotary embeddings (half style, all dims)
    DataType kv_type = DataType::f32;          // decode, step: the KV cache's element type (--kv-type)
    float k_scale = 1.0f, v_scale = 1.0f;      // decode, step: an fp8 cache's scales (--k-scale, --v-scale)
    bool causal = false;
    Algorithm impl = Algorithm::automatic;
    ModifierOptions modifiers;  // attention, sdpa, decode, step
    // step: one serving step over a paged cache (decode sequences and prefill chunks in one call)
    std::size_t decode_seqs = 16, prefill_seqs = 0, prefill_len = 256, prefill_past = 0, block_size = 64;
    bool ragged = false, core_only = false;
    // gemm: C[m, n] = A[m, k] · B[n, k]ᵀ
    std::size_t m = 1024, n = 2304, k = 768;
    // softmax, layernorm
    std::size_t rows = 1024, cols = 768;
    Backend backend = Backend::simd;
    DataType dtype = DataType::f32;  // --dtype (attention, decode, gemm): the compute type
    std::optional<int> threads;  // absent: all cores for attention, 1 for the kernels
    int reps = 10;
    bool json = false;
};

// `mha bench`: times one op and prints one line (readable, or one JSON object with --json).
void bench_command(const BenchOptions& options);

}  // namespace mha::tool
