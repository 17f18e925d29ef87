// The `mha` command-line tool: `mha run` (attention on .npy files), `mha sdpa` (the attention core on
// already-projected heads in .npy files), `mha bench` (time one op),
// `mha --version`, `mha --help`. Flags are parsed by CLI11. Every error, from the flags or from the
// work, is reported as exactly one line on stderr with a nonzero exit code.
#include <cstdlib>
#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <mha/mha.hpp>

#include "commands.hpp"

namespace {

using namespace mha::tool;

// One line, whatever the message holds (paths and library messages could contain newlines).
void print_error(const std::string& where, const std::string& message) {
    std::string line = where + ": error: " + message;
    for (char& c : line)
        if (c == '\n' || c == '\r') c = ' ';
    std::fprintf(stderr, "%s\n", line.c_str());
}

const std::map<std::string, mha::Backend> backend_names{{"scalar", mha::Backend::scalar}, {"simd", mha::Backend::simd}};
const std::map<std::string, mha::Algorithm> impl_names{
    {"auto", mha::Algorithm::automatic}, {"materialized", mha::Algorithm::materialized}, {"fused", mha::Algorithm::fused}};
const std::map<std::string, BenchOp> op_names{{"attention", BenchOp::attention}, {"step", BenchOp::step},
                                              {"sdpa", BenchOp::sdpa},
                                              {"decode", BenchOp::decode},
                                              {"gemm", BenchOp::gemm},
                                              {"softmax", BenchOp::softmax},
                                              {"layernorm", BenchOp::layernorm}};
const std::map<std::string, mha::DataType> dtype_names{{"f32", mha::DataType::f32}, {"bf16", mha::DataType::bf16}};
const std::map<std::string, mha::DataType> kv_type_names{
    {"f32", mha::DataType::f32},   {"bf16", mha::DataType::bf16},         {"f16", mha::DataType::f16},
    {"int8", mha::DataType::int8}, {"fp8_e4m3", mha::DataType::fp8_e4m3}, {"fp8_e5m2", mha::DataType::fp8_e5m2}};
const std::map<std::string, mha::RopeStyle> rope_style_names{{"half", mha::RopeStyle::half},
                                                             {"interleaved", mha::RopeStyle::interleaved}};

// --window-left, --window-right, --softcap and --alibi on one subcommand (ModifierOptions); read() after parsing.
struct ModifierFlags {
    long long left = 0, right = 0;
    float softcap = 0.0f;
    bool alibi = false;
    CLI::Option *left_opt = nullptr, *right_opt = nullptr, *softcap_opt = nullptr, *alibi_opt = nullptr;

    void add(CLI::App* app, const CLI::Validator& positive_real, const std::string& files) {
        const CLI::Range side(-1LL, std::numeric_limits<long long>::max() / 4);  // -1: unbounded, as absent
        left_opt = app->add_option("--window-left", left,
                                   "Sliding window: query at position p sees keys j >= p - N (Hugging Face sliding_window w "
                                   "is --window-left w-1; -1 or absent: unbounded)")
                       ->check(side);
        right_opt = app->add_option("--window-right", right, "Sliding window: keys j <= p + N (-1 or absent: unbounded; causal: 0)")
                        ->check(side);
        softcap_opt = app->add_option("--softcap", softcap, "Logit softcap C: scores become C*tanh(s/C) (Gemma 2)")->check(positive_real);
        alibi_opt = app->add_flag("--alibi", alibi, "ALiBi with BLOOM's standard slopes for H heads" + files);
    }
    ModifierOptions read() const {
        ModifierOptions m;
        if (left_opt->count() > 0 && left >= 0) m.window_left = left;
        if (right_opt->count() > 0 && right >= 0) m.window_right = right;
        if (softcap_opt->count() > 0) m.softcap = softcap;
        m.alibi = alibi;
        return m;
    }
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"mha: multi-head attention on CPUs (torch.nn.MultiheadAttention semantics, eval; batch_first, or "
                 "sequence-first with run --seq-first)",
                 "mha"};
    app.set_version_flag("--version", std::string(mha::version()), "Print the library version and exit");
    app.require_subcommand(1);

    const CLI::Range thread_count(0, std::numeric_limits<int>::max());
    // An integer of at least `least` (CLI::PositiveNumber's message prints DBL_MAX in full and accepts 1e30, and
    // CLI11's size_t parse takes "-1" as 2^64 - 1): say it plainly instead.
    auto integer_at_least = [](long long least, const std::string& what, const std::string& name) {
        return CLI::Validator(
            [least, what](std::string& v) {
                char* end = nullptr;
                errno = 0;
                const long long n = std::strtoll(v.c_str(), &end, 10);
                const bool ok = !v.empty() && end != nullptr && *end == '\0' && errno == 0 && n >= least;
                return ok ? std::string() : "must be " + what + ", got '" + v + "'";
            },
            name);
    };
    const CLI::Validator positive = integer_at_least(1, "a positive integer", "POSITIVE");
    const CLI::Validator non_negative = integer_at_least(0, "an integer >= 0", "NONNEGATIVE");  // a count that may be 0
    // A positive real number that is finite as a 32-bit float (the library's float: 3.4028235e38 is, 1e39 and 1e-46
    // are not), as the library takes its scales and softcap.
    const CLI::Validator positive_real(
        [](std::string& v) {
            char* end = nullptr;
            const float x = std::strtof(v.c_str(), &end);
            const bool ok = end != v.c_str() && *end == '\0' && std::isfinite(x) && x > 0.0f;
            return ok ? std::string() : "must be a positive number that is finite as a 32-bit float, got '" + v + "'";
        },
        "POSITIVE");

    // --- mha run ------------------------------------------------------------------------------
    RunOptions run_opts;
    float norm_eps = 0.0f, rope_theta = 0.0f;
    std::size_t kv_heads = 0, head_dim = 0, rope_dims = 0;
    std::string rope_style;
    CLI::App* run = app.add_subcommand("run", "Run attention on PyTorch-named .npy files and write output.npy");
    run->add_option("--npy", run_opts.npy_dir,
                    "Folder with query.npy, out_proj.weight.npy and either in_proj_weight.npy or q_proj_weight.npy, "
                    "k_proj_weight.npy, v_proj_weight.npy (required); optionally key.npy, value.npy (widths kdim, "
                    "vdim: any with the separate q/k/v weights), in_proj_bias.npy, out_proj.bias.npy, "
                    "key_padding_mask.npy, attn_mask.npy, norm.weight.npy, norm.bias.npy (read only with --norm-eps); "
                    "past_key.npy, past_value.npy [B, Hkv, Lp, d] and past_lengths.npy [B] (int32/int64) to continue "
                    "cached sequences (a KV cache: also writes present_key.npy, present_value.npy)")
        ->required();
    run->add_option("--heads", run_opts.heads, "Number of query heads H")->required()->check(positive);
    CLI::Option* kv_heads_opt =
        run->add_option("--kv-heads", kv_heads, "Number of key/value heads Hkv (grouped-query attention; H % Hkv == 0; default H)")
            ->check(positive);
    CLI::Option* head_dim_opt = run->add_option("--head-dim", head_dim,
                                                "Head dim d (default: q_proj_weight.npy's rows / H with the separate "
                                                "weights, else E / H)")
                                    ->check(positive);
    CLI::Option* rope_theta_opt =
        run->add_option("--rope-theta", rope_theta, "Rotary position embeddings with this base (e.g. 10000) on Q and K");
    CLI::Option* rope_style_opt =
        run->add_option("--rope-style", rope_style, "Rotary pairs: half (GPT-NeoX, HF Llama; default) or interleaved (GPT-J)")
            ->check(CLI::IsMember(rope_style_names))
            ->needs(rope_theta_opt);
    CLI::Option* rope_dims_opt =
        run->add_option("--rope-dims", rope_dims, "Rotary dims per head (even; default: the head dim)")->check(positive)->needs(rope_theta_opt);
    std::size_t position_offset = 0, chunk = 0;
    CLI::Option* position_offset_opt =
        run->add_option("--position-offset", position_offset, "Rotary position of the first query and key row (default 0)")
            ->needs(rope_theta_opt);
    CLI::Option* run_causal = run->add_flag("--causal", run_opts.causal, "Mask key j for query i when j > i");
    bool run_bottom_right = false;
    run->add_flag("--causal-bottom-right", run_bottom_right, "Mask key j for query i when j > i + Lk - Lq (new tokens at the end)")
        ->excludes(run_causal);
    CLI::Option* norm_opt = run->add_option("--norm-eps", norm_eps, "Apply the post-norm block LayerNorm(out + query) with this eps");
    run->add_flag("--need-weights", run_opts.need_weights, "Also write attn_weights.npy (averaged over heads) next to the output");
    std::string run_backend = "simd", run_impl = "auto";
    run->add_option("--backend", run_backend, "Kernels: scalar (the reference) or simd (default)")->check(CLI::IsMember(backend_names));
    run->add_option("--threads", run_opts.threads, "Threads (0: all cores)")->check(thread_count);
    run->add_option("--impl", run_impl, "Attention: auto (default), materialized or fused")->check(CLI::IsMember(impl_names));
    std::string run_dtype = "f32";
    run->add_option("--dtype", run_dtype,
                    "Compute type: f32 (default) or bf16 (inputs, weights, Q, K, V, P and the attention output rounded to "
                    "bfloat16, fp32 accumulation; .npy files stay float32 unless --bf16-raw)")
        ->check(CLI::IsMember(dtype_names));
    run->add_flag("--bf16-raw", run_opts.bf16_raw,
                  "Float inputs and weights are uint16 .npy arrays holding bfloat16 bit patterns (widened exactly); "
                  "output files stay float32");
    run->add_flag("--seq-first", run_opts.seq_first,
                  "query.npy, key.npy, value.npy and output.npy are [L, B, E] (PyTorch's batch_first=False) instead "
                  "of [B, L, E]; masks and attn_weights.npy keep their shapes; unbatched [L, E] files are unaffected");
    CLI::Option* chunk_opt =
        run->add_option("--chunk", chunk,
                        "Feed the query through a KV cache N tokens per call (causal; self-attention; continues "
                        "past_key.npy / past_value.npy when present); also writes present_key.npy and present_value.npy")
            ->check(positive);
    std::string run_kv_type;
    CLI::Option* run_kv_type_opt =
        run->add_option("--kv-type", run_kv_type,
                        "KV cache element type: f32 (default), bf16, f16, int8 (blocks of 32 with a float16 scale), fp8_e4m3 or "
                        "fp8_e5m2 (KV cache path only: past_key.npy or --chunk); K and V are rounded into it and present_*.npy "
                        "hold the stored values, dequantized, as float32")
            ->check(CLI::IsMember(kv_type_names));
    float run_k_scale = 1.0f, run_v_scale = 1.0f;
    CLI::Option* run_k_scale_opt =
        run->add_option("--k-scale", run_k_scale, "fp8 KV cache: the keys' scale (stored fp8(k / S), read as fp8·S; default 1)")
            ->check(positive_real);
    CLI::Option* run_v_scale_opt =
        run->add_option("--v-scale", run_v_scale, "fp8 KV cache: the values' scale (default 1)")->check(positive_real);
    ModifierFlags run_mods;
    run_mods.add(run, positive_real, " (or alibi_slopes.npy [H] in the folder; sinks.npy [H] adds attention sinks)");
    run->add_option("--out", run_opts.out,
                    "Output file (default: <npy dir>/output.npy); attn_weights.npy, present_key.npy, present_value.npy go "
                    "beside it");

    // --- mha sdpa -----------------------------------------------------------------------------
    SdpaCommandOptions sdpa_opts;
    float sdpa_scale = 0.0f;
    CLI::App* sdpa = app.add_subcommand("sdpa",
                                        "Scaled dot-product attention on already-projected heads in .npy files "
                                        "(F.scaled_dot_product_attention with grouped-query heads); writes output.npy");
    sdpa->add_option("--npy", sdpa_opts.npy_dir,
                     "Folder with q.npy [B, H, Lq, d], k.npy and v.npy [B, Hkv, Lk, d] (H % Hkv == 0) and optionally "
                     "key_padding_mask.npy [B, Lk], attn_mask.npy [Lq, Lk] or [B*H, Lq, Lk] (bool/uint8: true = masked; "
                     "float: added to the scores)")
        ->required();
    CLI::Option* sdpa_causal = sdpa->add_flag("--causal", sdpa_opts.causal, "Mask key j for query i when j > i (top-left)");
    bool sdpa_bottom_right = false;
    sdpa->add_flag("--causal-bottom-right", sdpa_bottom_right, "Mask key j for query i when j > i + Lk - Lq (bottom-right)")
        ->excludes(sdpa_causal);
    CLI::Option* scale_opt = sdpa->add_option("--scale", sdpa_scale, "Score scale (default 1/sqrt(d))");
    std::string sdpa_backend = "simd", sdpa_impl = "auto";
    sdpa->add_option("--backend", sdpa_backend, "Kernels: scalar (the reference) or simd (default)")->check(CLI::IsMember(backend_names));
    sdpa->add_option("--threads", sdpa_opts.threads, "Threads (0: all cores)")->check(thread_count);
    sdpa->add_option("--impl", sdpa_impl, "auto (default), materialized or fused")->check(CLI::IsMember(impl_names));
    ModifierFlags sdpa_mods;
    sdpa_mods.add(sdpa, positive_real, " (or alibi_slopes.npy [H] in the folder; sinks.npy [H] adds attention sinks)");
    sdpa->add_option("--out", sdpa_opts.out, "Output file (default: <npy dir>/output.npy)");

    // --- mha bench ----------------------------------------------------------------------------
    BenchOptions bench_opts;
    std::size_t bench_seq = 0, kv_seq = 0, bench_kv_heads = 0, bench_head_dim = 0, bench_kdim = 0, bench_vdim = 0;
    float bench_rope_theta = 0.0f;
    int threads = 0;
    CLI::App* bench = app.add_subcommand("bench", "Time one op on random inputs (one warm-up, then --reps timed runs)");
    std::string bench_op, bench_backend = "simd", bench_impl = "auto";
    bench->add_option("--op", bench_op,
                      "The op to time: attention, sdpa, decode (one decode step of the layer with a KV cache), step (one "
                      "serving step over a paged KV cache: decodes and prefill chunks in one call), gemm, softmax or layernorm")
        ->required()
        ->check(CLI::IsMember(op_names));
    // Options that only make sense for some ops; giving one to another op is an error.
    std::vector<std::pair<CLI::Option*, std::vector<BenchOp>>> op_specific;
    auto only_for = [&](CLI::Option* o, std::vector<BenchOp> ops) { op_specific.emplace_back(o, std::move(ops)); };
    const std::vector<BenchOp> attention{BenchOp::attention}, heads_ops{BenchOp::attention, BenchOp::sdpa, BenchOp::decode};
    const std::vector<BenchOp> layer_ops{BenchOp::attention, BenchOp::decode, BenchOp::step};
    const std::vector<BenchOp> step_op{BenchOp::step}, shape_ops{BenchOp::attention, BenchOp::sdpa, BenchOp::decode, BenchOp::step};
    only_for(bench->add_option("--batch", bench_opts.batch, "attention/sdpa/decode: batch B (default 8)")->check(positive), heads_ops);
    CLI::Option* seq_opt =
        bench->add_option("--seq", bench_seq, "attention/sdpa: query length Lq (default 128); decode: new tokens per step (default 1)")
            ->check(positive);
    only_for(seq_opt, heads_ops);
    CLI::Option* kv_opt = bench->add_option("--kv-seq", kv_seq,
                                            "attention/sdpa: key/value length Lk (default: --seq); decode: tokens already "
                                            "cached per sequence (default 1024); step: keys cached per decode sequence (default 2048)")
                              ->check(positive);
    only_for(kv_opt, shape_ops);
    only_for(bench->add_option("--decode-seqs", bench_opts.decode_seqs, "step: decode sequences (one new token each; default 16)")
                 ->check(non_negative),
             step_op);
    only_for(bench->add_flag("--ragged", bench_opts.ragged,
                             "step: decode sequences hold evenly spaced key counts from --kv-seq/2 to 3·--kv-seq/2"),
             step_op);
    only_for(bench->add_option("--prefill-seqs", bench_opts.prefill_seqs, "step: prefill chunks (default 0)")->check(non_negative),
             step_op);
    only_for(bench->add_option("--prefill-len", bench_opts.prefill_len, "step: tokens per prefill chunk (default 256)")->check(positive),
             step_op);
    only_for(bench->add_option("--prefill-past", bench_opts.prefill_past, "step: keys cached before each prefill chunk (default 0)")
                 ->check(non_negative),
             step_op);
    only_for(bench->add_option("--block-size", bench_opts.block_size, "step: paged cache block size 16, 32, 64 (default), 128 or 256")
                 ->check(CLI::IsMember({16, 32, 64, 128, 256})),
             step_op);
    only_for(bench->add_flag("--core-only", bench_opts.core_only,
                             "step: time the attention core alone (mha::paged_attention on the step's queries)"),
             step_op);
    only_for(bench->add_option("--embed", bench_opts.embed, "attention/decode/step: embed dim E (default 768)")->check(positive), layer_ops);
    only_for(bench->add_option("--heads", bench_opts.heads, "attention/sdpa/decode/step: query heads H (default 12)")->check(positive), shape_ops);
    CLI::Option* bench_kv_heads_opt =
        bench->add_option("--kv-heads", bench_kv_heads, "attention/sdpa/decode/step: key/value heads Hkv (default: --heads)")->check(positive);
    only_for(bench_kv_heads_opt, shape_ops);
    CLI::Option* bench_head_dim_opt =
        bench->add_option("--head-dim", bench_head_dim, "attention/sdpa/decode/step: head dim d (default: attention/decode/step E / H, sdpa 64)")
            ->check(positive);
    only_for(bench_head_dim_opt, shape_ops);
    CLI::Option* kdim_opt = bench->add_option("--kdim", bench_kdim, "attention: key features (default: --embed)")->check(positive);
    only_for(kdim_opt, attention);
    CLI::Option* vdim_opt = bench->add_option("--vdim", bench_vdim, "attention: value features (default: --kdim)")->check(positive);
    only_for(vdim_opt, attention);
    CLI::Option* bench_rope_opt =
        bench->add_option("--rope-theta", bench_rope_theta, "attention/decode/step: rotary embeddings (half style, all dims) with this base");
    only_for(bench_rope_opt, layer_ops);
    only_for(bench->add_flag("--causal", bench_opts.causal,
                             "attention: causal mask (top-left); sdpa: causal mask (bottom-right when --kv-seq differs; "
                             "gflops count only the visible pairs); decode is causal by construction"),
             {BenchOp::attention, BenchOp::sdpa});
    only_for(bench->add_option("--impl", bench_impl, "attention/sdpa/decode: auto (default), materialized or fused")
                 ->check(CLI::IsMember(impl_names)),
             heads_ops);
    only_for(bench->add_option("--m", bench_opts.m, "gemm: rows of A and C (default 1024)")->check(positive), {BenchOp::gemm});
    only_for(bench->add_option("--n", bench_opts.n, "gemm: rows of B, cols of C (default 2304)")->check(positive), {BenchOp::gemm});
    only_for(bench->add_option("--k", bench_opts.k, "gemm: reduction length (default 768)")->check(positive), {BenchOp::gemm});
    only_for(bench->add_option("--rows", bench_opts.rows, "softmax/layernorm: rows (default 1024)")->check(positive),
             {BenchOp::softmax, BenchOp::layernorm});
    only_for(bench->add_option("--cols", bench_opts.cols, "softmax/layernorm: cols (default 768)")->check(positive),
             {BenchOp::softmax, BenchOp::layernorm});
    bench->add_option("--backend", bench_backend, "Kernels: scalar (the reference) or simd (default)")->check(CLI::IsMember(backend_names));
    std::string bench_dtype = "f32";
    only_for(bench->add_option("--dtype", bench_dtype, "attention/decode/step/gemm: compute type f32 (default) or bf16 (step: not with --core-only)")
                 ->check(CLI::IsMember(dtype_names)),
             {BenchOp::attention, BenchOp::decode, BenchOp::step, BenchOp::gemm});
    CLI::Option* threads_opt = bench->add_option("--threads", threads,
                                                 "Threads (attention, sdpa: 0 = all cores, the default; the kernels are "
                                                 "single-threaded and accept only 1)")
                                   ->check(thread_count);
    std::string bench_kv_type = "f32";
    only_for(bench->add_option("--kv-type", bench_kv_type,
                               "decode, step: KV cache element type f32 (default), bf16, f16, int8, fp8_e4m3 or fp8_e5m2 (gbps "
                               "counts the cache at its size, an int8 row's scales included)")
                 ->check(CLI::IsMember(kv_type_names)),
             {BenchOp::decode, BenchOp::step});
    only_for(bench->add_option("--k-scale", bench_opts.k_scale, "decode, step: an fp8 cache's key scale (default 1)")->check(positive_real),
             {BenchOp::decode, BenchOp::step});
    only_for(bench->add_option("--v-scale", bench_opts.v_scale, "decode, step: an fp8 cache's value scale (default 1)")->check(positive_real),
             {BenchOp::decode, BenchOp::step});
    ModifierFlags bench_mods;
    bench_mods.add(bench, positive_real, "");
    for (CLI::Option* o : {bench_mods.left_opt, bench_mods.right_opt, bench_mods.softcap_opt, bench_mods.alibi_opt}) only_for(o, shape_ops);
    only_for(bench->add_flag("--sinks", bench_opts.modifiers.sinks, "Attention sinks: a random logit per head in [-1, 1]"), shape_ops);
    bench->add_option("--reps", bench_opts.reps, "Timed repetitions (default 10)")->check(positive);
    bench->add_flag("--json", bench_opts.json, "Print one JSON object on one line");

    // CLI11 would say "A subcommand is required" for a misspelt one; name it instead.
    if (argc > 1 && argv[1][0] != '-' && std::string(argv[1]) != "run" && std::string(argv[1]) != "sdpa" &&
        std::string(argv[1]) != "bench") {
        print_error("mha", "unknown command '" + std::string(argv[1]) + "': expected run, sdpa or bench (see --help)");
        return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
        const CLI::App* sub = *run ? run : *sdpa ? sdpa : *bench ? bench : nullptr;
        print_error(sub ? "mha " + sub->get_name() : std::string("mha"), std::string(e.what()) + " (see --help)");
        return e.get_exit_code();
    }

    const std::string where = "mha " + app.get_subcommands().front()->get_name();
    try {
        if (*run) {
            if (norm_opt->count() > 0) run_opts.norm_eps = norm_eps;
            run_opts.backend = backend_names.at(run_backend);
            run_opts.impl = impl_names.at(run_impl);
            run_opts.dtype = dtype_names.at(run_dtype);
            if (kv_heads_opt->count() > 0) run_opts.kv_heads = kv_heads;
            if (head_dim_opt->count() > 0) run_opts.head_dim = head_dim;
            if (rope_theta_opt->count() > 0) run_opts.rope_theta = rope_theta;
            if (rope_style_opt->count() > 0) run_opts.rope_style = rope_style_names.at(rope_style);
            if (rope_dims_opt->count() > 0) run_opts.rope_dims = rope_dims;
            if (position_offset_opt->count() > 0) run_opts.position_offset = position_offset;
            if (chunk_opt->count() > 0) run_opts.chunk = chunk;
            if (run_kv_type_opt->count() > 0) run_opts.kv_type = kv_type_names.at(run_kv_type);
            if (run_k_scale_opt->count() > 0) run_opts.k_scale = run_k_scale;
            if (run_v_scale_opt->count() > 0) run_opts.v_scale = run_v_scale;
            if (run_bottom_right) {
                run_opts.causal = true;
                run_opts.causal_alignment = mha::CausalAlignment::bottom_right;
            }
            run_opts.modifiers = run_mods.read();
            run_command(run_opts);
        } else if (*sdpa) {
            if (sdpa_bottom_right) {
                sdpa_opts.causal = true;
                sdpa_opts.causal_alignment = mha::CausalAlignment::bottom_right;
            }
            if (scale_opt->count() > 0) sdpa_opts.scale = sdpa_scale;
            sdpa_opts.backend = backend_names.at(sdpa_backend);
            sdpa_opts.impl = impl_names.at(sdpa_impl);
            sdpa_opts.modifiers = sdpa_mods.read();
            sdpa_command(sdpa_opts);
        } else {
            bench_opts.op = op_names.at(bench_op);
            bench_opts.backend = backend_names.at(bench_backend);
            bench_opts.impl = impl_names.at(bench_impl);
            bench_opts.dtype = dtype_names.at(bench_dtype);
            bench_opts.kv_type = kv_type_names.at(bench_kv_type);
            for (const auto& [opt, ops] : op_specific) {
                if (opt->count() == 0) continue;
                if (std::find(ops.begin(), ops.end(), bench_opts.op) == ops.end())
                    throw tool_error(opt->get_name() + " does not apply to --op " + bench_op);
            }
            if (seq_opt->count() > 0) bench_opts.seq = bench_seq;
            if (kv_opt->count() > 0) bench_opts.kv_seq = kv_seq;
            if (threads_opt->count() > 0) bench_opts.threads = threads;
            if (bench_kv_heads_opt->count() > 0) bench_opts.kv_heads = bench_kv_heads;
            if (bench_head_dim_opt->count() > 0) bench_opts.head_dim = bench_head_dim;
            if (kdim_opt->count() > 0) bench_opts.kdim = bench_kdim;
            if (vdim_opt->count() > 0) bench_opts.vdim = bench_vdim;
            if (bench_rope_opt->count() > 0) bench_opts.rope_theta = bench_rope_theta;
            const bool sinks = bench_opts.modifiers.sinks;
            bench_opts.modifiers = bench_mods.read();
            bench_opts.modifiers.sinks = sinks;
            bench_command(bench_opts);
        }
    } catch (const std::bad_alloc&) {
        print_error(where, "out of memory for the requested shapes");
        return 1;
    } catch (const std::exception& e) {
        print_error(where, e.what());
        return 1;
    }
    return 0;
}
