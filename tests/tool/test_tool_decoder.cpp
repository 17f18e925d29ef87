// Tests of `mha run` on decoder-style layers: separate q/k/v projection weights (q_proj_weight.npy,
// k_proj_weight.npy, v_proj_weight.npy), grouped-query heads (--kv-heads), a head dim of its own
// (--head-dim, H·d != E), key/value widths kdim/vdim != E, rotary embeddings (--rope-theta, --rope-style,
// --rope-dims, --position-offset) and bottom-right causal masks (--causal-bottom-right). Each runs the real
// binary (MHA_TOOL_PATH) in a fresh temporary folder:
//   - results: output.npy (and attn_weights.npy) must be bitwise what mha::MultiheadAttention gives when
//     called here on the same arrays with the same AttentionConfig and ForwardOptions, for each backend;
//   - bad input: exactly one line on stderr naming the files and values, a nonzero exit code, no file.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "npy.hpp"
#include "tool_files.hpp"
#include "tool_process.hpp"

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;
using mha_tool_test::Result;

using mha_tool_test::random_floats;
using mha_tool_test::save;

enum class Proj { packed, separate };
enum class Causal { none, top_left, bottom_right };

struct DecoderCase {
    const char* name = "";
    std::size_t B = 2, Lq = 5, Lk = 5, E = 16, H = 4, Hkv = 4, d = 4, kdim = 16, vdim = 16;
    bool kv_heads_flag = false;  // pass --kv-heads Hkv (else its default, H)
    bool head_dim_flag = false;  // pass --head-dim d (else derived: q rows / H or E / H)
    Proj proj = Proj::separate;
    bool key_file = false, value_file = false;  // key.npy / value.npy (else key = query, value = key)
    bool rope = false;
    std::optional<mha::RopeStyle> rope_style = std::nullopt;  // --rope-style (absent: the default, half)
    std::size_t rope_dims = 0;                 // --rope-dims (0: flag absent, all dims)
    std::size_t position_offset = 0;           // --position-offset (0: flag absent)
    Causal causal = Causal::none;
    bool masks = false;
    bool need_weights = false;
    bool seq_first = false;
    bool bias = true;  // in_proj_bias.npy
};

// gtest prints a parameter in test names and failures: its name, not its bytes.
void PrintTo(const DecoderCase& c, std::ostream* os) { *os << c.name; }

class DecoderToolTest : public mha_tool_test::ToolDirTest {};
class DecoderVsLibrary : public DecoderToolTest, public ::testing::WithParamInterface<DecoderCase> {};

TEST_P(DecoderVsLibrary, SameAsLibrary) {
    const DecoderCase c = GetParam();
    const std::size_t B = c.B, Lq = c.Lq, Lk = c.Lk, E = c.E, H = c.H, Hkv = c.Hkv, d = c.d;
    ASSERT_TRUE(c.key_file || (Lk == Lq && c.kdim == E));
    ASSERT_TRUE(c.value_file || c.vdim == (c.key_file ? c.kdim : E));
    std::mt19937 rng(1234);
    const std::vector<float> query = random_floats(B * Lq * E, 1.0f, rng);
    const std::vector<float> key = random_floats(B * Lk * c.kdim, 1.0f, rng);
    const std::vector<float> value = random_floats(B * Lk * c.vdim, 1.0f, rng);
    const std::vector<float> q_w = random_floats(H * d * E, 0.5f, rng);
    const std::vector<float> k_w = random_floats(Hkv * d * c.kdim, 0.5f, rng);
    const std::vector<float> v_w = random_floats(Hkv * d * c.vdim, 0.5f, rng);
    std::vector<float> in_w = q_w;  // [Wq; Wk; Wv] (packed only when kdim = vdim = E)
    in_w.insert(in_w.end(), k_w.begin(), k_w.end());
    in_w.insert(in_w.end(), v_w.begin(), v_w.end());
    const std::vector<float> in_b = random_floats(H * d + 2 * Hkv * d, 0.5f, rng);
    const std::vector<float> out_w = random_floats(E * H * d, 0.5f, rng), out_b = random_floats(E, 0.5f, rng);
    // Masks: a bool key padding (key 1 of batch 0, last key of batch 1) and a float [B·H, Lq, Lk] attn_mask.
    std::vector<std::uint8_t> kpm(B * Lk, 0);
    kpm[1] = 1, kpm[B * Lk - 1] = 1;
    const std::vector<float> am = random_floats(B * H * Lq * Lk, 2.0f, rng);

    // Files as the tool reads them; [B, L, F] or, with --seq-first, [L, B, F].
    const auto layout = [&](const std::vector<float>& v, std::size_t L, std::size_t F) {
        if (!c.seq_first) return v;
        std::vector<float> t(v.size());
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t f = 0; f < F; ++f) t[(i * B + b) * F + f] = v[(b * L + i) * F + f];
        return t;
    };
    const auto shape = [&](std::size_t L, std::size_t F) { return c.seq_first ? Shape{L, B, F} : Shape{B, L, F}; };
    save(dir_ / "query.npy", layout(query, Lq, E), shape(Lq, E));
    if (c.key_file) save(dir_ / "key.npy", layout(key, Lk, c.kdim), shape(Lk, c.kdim));
    if (c.value_file) save(dir_ / "value.npy", layout(value, Lk, c.vdim), shape(Lk, c.vdim));
    if (c.proj == Proj::packed) {
        save(dir_ / "in_proj_weight.npy", in_w, {H * d + 2 * Hkv * d, E});
    } else {
        save(dir_ / "q_proj_weight.npy", q_w, {H * d, E});
        save(dir_ / "k_proj_weight.npy", k_w, {Hkv * d, c.kdim});
        save(dir_ / "v_proj_weight.npy", v_w, {Hkv * d, c.vdim});
    }
    if (c.bias) save(dir_ / "in_proj_bias.npy", in_b, {H * d + 2 * Hkv * d});
    save(dir_ / "out_proj.weight.npy", out_w, {E, H * d});
    save(dir_ / "out_proj.bias.npy", out_b, {E});
    if (c.masks) {
        mha_tool_test::write_bytes_npy(dir_ / "key_padding_mask.npy", kpm, {B, Lk});
        save(dir_ / "attn_mask.npy", am, {B * H, Lq, Lk});
    }

    // The library on the same arrays, in the same layout.
    mha::AttentionWeights w;
    if (c.proj == Proj::packed) {
        w.in_proj_weight = in_w.data();
    } else {
        w.q_proj_weight = q_w.data();
        w.k_proj_weight = k_w.data();
        w.v_proj_weight = v_w.data();
    }
    w.in_proj_bias = c.bias ? in_b.data() : nullptr;
    w.out_proj_weight = out_w.data();
    w.out_proj_bias = out_b.data();
    mha::AttentionConfig config;
    config.embed_dim = E;
    config.num_heads = H;
    config.num_kv_heads = Hkv;
    config.head_dim = d;
    config.kdim = c.kdim;
    config.vdim = c.vdim;
    if (c.rope) {
        mha::RopeConfig rope;
        rope.theta = 10000.0f;
        rope.dims = c.rope_dims;
        rope.style = c.rope_style.value_or(mha::RopeStyle::half);
        config.rope = rope;
    }
    const mha::MultiheadAttention attention(w, config);
    const std::vector<float> q_file = layout(query, Lq, E), k_file = layout(key, Lk, c.kdim), v_file = layout(value, Lk, c.vdim);
    const auto view = [&](const std::vector<float>& v, std::size_t L, std::size_t F) {
        return c.seq_first ? mha::ConstBatch(v.data(), B, L, F, B * F, F) : mha::ConstBatch(v.data(), B, L, F);
    };
    mha::AttentionInputs in;
    in.query = view(q_file, Lq, E);
    if (c.key_file) in.key = view(k_file, Lk, c.kdim);
    if (c.value_file) in.value = view(v_file, Lk, c.vdim);
    if (c.masks) {
        in.key_padding_mask = mha::MaskView::boolean(kpm.data(), B, Lk);
        in.attn_mask = mha::MaskView::additive(am.data(), B * H, Lq, Lk);
    }
    mha::ForwardOptions fo;
    fo.causal = c.causal != Causal::none;
    fo.causal_alignment = c.causal == Causal::bottom_right ? mha::CausalAlignment::bottom_right : mha::CausalAlignment::top_left;
    fo.position_offset = c.position_offset;
    fo.need_weights = c.need_weights ? mha::NeedWeights::averaged : mha::NeedWeights::none;

    std::vector<std::string> flags{"--heads", std::to_string(H)};
    if (c.kv_heads_flag) flags.insert(flags.end(), {"--kv-heads", std::to_string(Hkv)});
    if (c.head_dim_flag) flags.insert(flags.end(), {"--head-dim", std::to_string(d)});
    if (c.rope) flags.insert(flags.end(), {"--rope-theta", "10000"});
    if (c.rope_style) flags.insert(flags.end(), {"--rope-style", *c.rope_style == mha::RopeStyle::half ? "half" : "interleaved"});
    if (c.rope_dims) flags.insert(flags.end(), {"--rope-dims", std::to_string(c.rope_dims)});
    if (c.position_offset) flags.insert(flags.end(), {"--position-offset", std::to_string(c.position_offset)});
    if (c.causal == Causal::top_left) flags.push_back("--causal");
    if (c.causal == Causal::bottom_right) flags.push_back("--causal-bottom-right");
    if (c.need_weights) flags.push_back("--need-weights");
    if (c.seq_first) flags.push_back("--seq-first");

    for (const mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd}) {
        const std::string name = backend == mha::Backend::scalar ? "scalar" : "simd";
        SCOPED_TRACE(name);
        std::vector<float> want(B * Lq * E), want_w(c.need_weights ? B * Lq * Lk : 0);
        fo.backend = backend;
        mha::AttentionOutputs out;
        out.output = c.seq_first ? mha::Batch(want.data(), B, Lq, E, B * E, E) : mha::Batch(want.data(), B, Lq, E);
        out.attn_weights = c.need_weights ? want_w.data() : nullptr;
        attention.forward(in, out, fo);

        const fs::path out_dir = base_ / ("out_" + name);
        fs::create_directories(out_dir);
        std::vector<std::string> args{"run", "--npy", dir_.string(), "--backend", name, "--threads", "2", "--out",
                                      (out_dir / "output.npy").string()};
        args.insert(args.end(), flags.begin(), flags.end());
        const Result r = mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err, "");
        const mha::npy::Array got = mha::npy::load((out_dir / "output.npy").string());
        EXPECT_EQ(got.dtype, mha::npy::DType::float32);
        EXPECT_EQ(got.shape, shape(Lq, E));
        EXPECT_EQ(got.values, want);  // bitwise: the same code on the same floats
        if (c.need_weights) {
            const mha::npy::Array got_w = mha::npy::load((out_dir / "attn_weights.npy").string());
            EXPECT_EQ(got_w.shape, (Shape{B, Lq, Lk}));
            EXPECT_EQ(got_w.values, want_w);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DecoderVsLibrary,
    ::testing::Values(
        // nn.MultiheadAttention's separate weights (its kdim/vdim form) at kdim = vdim = E; d = q rows / H.
        DecoderCase{.name = "separate_weights", .Lk = 7, .key_file = true, .value_file = true, .masks = true, .need_weights = true},
        // Grouped-query: H = 4, Hkv = 2, causal, masks, [B·H, Lq, Lk] attn_mask over the query heads.
        DecoderCase{.name = "gqa", .Hkv = 2, .kv_heads_flag = true, .causal = Causal::top_left, .masks = true, .need_weights = true},
        // --head-dim 6 with H·d = 24 != E = 16 (out_proj [E, H·d]), GQA, no bias.
        DecoderCase{.name = "head_dim", .Hkv = 2, .d = 6, .kv_heads_flag = true, .head_dim_flag = true, .bias = false},
        // key/value widths of their own: kdim 5, vdim 7; cross-attention Lq 4, Lk 6.
        DecoderCase{.name = "kdim_vdim", .Lq = 4, .Lk = 6, .kdim = 5, .vdim = 7, .key_file = true, .value_file = true},
        // The same in --seq-first layout ([L, B, F] with row stride B·F for each width F).
        DecoderCase{.name = "kdim_vdim_seq_first", .Lq = 4, .Lk = 6, .kdim = 5, .vdim = 7, .key_file = true, .value_file = true,
                    .masks = true, .seq_first = true},
        // value.npy alone (key = query) with its own width.
        DecoderCase{.name = "value_only", .vdim = 3, .value_file = true},
        // Packed in_proj_weight [H·d + 2·Hkv·d, E] with GQA and --head-dim.
        DecoderCase{.name = "packed_gqa", .Hkv = 1, .d = 8, .kv_heads_flag = true, .head_dim_flag = true, .proj = Proj::packed},
        // RoPE, half pairs (the default style), at positions 3.., bottom-right causal with Lq < Lk, GQA, d 8.
        DecoderCase{.name = "rope_half", .Lq = 3, .Lk = 8, .Hkv = 2, .d = 8, .kv_heads_flag = true, .key_file = true,
                    .value_file = true, .rope = true, .position_offset = 3, .causal = Causal::bottom_right, .need_weights = true},
        // RoPE, interleaved pairs on 4 of 8 dims, self-attention, top-left causal, packed weights.
        DecoderCase{.name = "rope_interleaved", .H = 2, .Hkv = 2, .d = 8, .proj = Proj::packed, .rope = true,
                    .rope_style = mha::RopeStyle::interleaved, .rope_dims = 4, .causal = Causal::top_left},
        // RoPE, --rope-style half given explicitly, with --seq-first and masks.
        DecoderCase{.name = "rope_half_explicit_seq_first", .Hkv = 2, .kv_heads_flag = true, .rope = true,
                    .rope_style = mha::RopeStyle::half, .position_offset = 100, .masks = true, .seq_first = true}),
    [](const ::testing::TestParamInfo<DecoderCase>& i) { return std::string(i.param.name); });

// --- help ----------------------------------------------------------------------------------------

TEST_F(DecoderToolTest, HelpNamesTheFlags) {
    const Result r = mha({"run", "--help"});
    EXPECT_EQ(r.exit_code, 0);
    for (const char* flag : {"--kv-heads", "--head-dim", "--rope-theta", "--rope-style", "--rope-dims", "--position-offset",
                             "--causal-bottom-right", "q_proj_weight.npy"})
        EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing in\n" << r.out;
}

// --- bad input -----------------------------------------------------------------------------------

class DecoderErrors : public DecoderToolTest {
protected:
    // A valid GQA case: B 1, Lq = Lk 3, E 16, H 4, Hkv 2, d 4, separate weights, in_proj_bias.
    void write_gqa_case() {
        std::mt19937 rng(3);
        save(dir_ / "query.npy", random_floats(3 * 16, 1.0f, rng), {1, 3, 16});
        save(dir_ / "q_proj_weight.npy", random_floats(16 * 16, 0.5f, rng), {16, 16});
        save(dir_ / "k_proj_weight.npy", random_floats(8 * 16, 0.5f, rng), {8, 16});
        save(dir_ / "v_proj_weight.npy", random_floats(8 * 16, 0.5f, rng), {8, 16});
        save(dir_ / "in_proj_bias.npy", random_floats(32, 0.5f, rng), {32});
        save(dir_ / "out_proj.weight.npy", random_floats(16 * 16, 0.5f, rng), {16, 16});
    }
    std::vector<std::string> gqa_args(std::vector<std::string> extra = {}) {
        std::vector<std::string> args{"run", "--npy", dir_.string(), "--heads", "4", "--kv-heads", "2"};
        args.insert(args.end(), extra.begin(), extra.end());
        return args;
    }
};

TEST_F(DecoderErrors, ValidCaseRuns) {  // the base of the tests below is valid
    write_gqa_case();
    const Result r = mha(gqa_args());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir_ / "output.npy"));
}

TEST_F(DecoderErrors, KProjRowsDisagreeWithKvHeads) {
    write_gqa_case();
    std::mt19937 rng(4);
    save(dir_ / "k_proj_weight.npy", random_floats(16 * 16, 0.5f, rng), {16, 16});
    expect_failure_with(gqa_args(), {"k_proj_weight.npy has 16 rows but --kv-heads 2 × head dim 4 = 8"});
    // Without --kv-heads, Hkv is H: the 8-row k_proj disagrees with it, and the message says where 4 came from.
    write_gqa_case();
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "4"},
                        {"k_proj_weight.npy has 8 rows but --kv-heads 4 × head dim 4 = 16", "--kv-heads defaults to --heads"});
    // With --head-dim: q_proj's rows are checked against it.
    write_gqa_case();
    expect_failure_with(gqa_args({"--head-dim", "2"}), {"q_proj_weight.npy has 16 rows but --heads 4 × head dim 2 = 8",
                                                        "head dim from --head-dim"});
}

TEST_F(DecoderErrors, VProjRowsDisagreeWithKvHeads) {
    write_gqa_case();
    std::mt19937 rng(4);
    save(dir_ / "v_proj_weight.npy", random_floats(4 * 16, 0.5f, rng), {4, 16});
    expect_failure_with(gqa_args(), {"v_proj_weight.npy has 4 rows but --kv-heads 2 × head dim 4 = 8"});
}

TEST_F(DecoderErrors, QProjRowsNotAMultipleOfHeads) {
    write_gqa_case();
    save(dir_ / "q_proj_weight.npy", std::vector<float>(10 * 16, 0.0f), {10, 16});
    expect_failure_with(gqa_args(), {"q_proj_weight.npy has 10 rows, not a multiple of --heads 4"});
}

TEST_F(DecoderErrors, ProjectionColumnsDisagreeWithInputs) {
    write_gqa_case();
    save(dir_ / "q_proj_weight.npy", std::vector<float>(16 * 12, 0.0f), {16, 12});
    expect_failure_with(gqa_args(), {"q_proj_weight.npy has shape [16, 12] but must be [H·d, E]", "E = 16 from query.npy"});
    write_gqa_case();
    save(dir_ / "key.npy", std::vector<float>(3 * 5, 0.0f), {1, 3, 5});  // kdim 5
    expect_failure_with(gqa_args(), {"k_proj_weight.npy has shape [8, 16] but must be [Hkv·d, kdim] = [8, 5] (kdim = 5 from key.npy)"});
    write_gqa_case();
    fs::remove(dir_ / "key.npy");
    save(dir_ / "value.npy", std::vector<float>(3 * 7, 0.0f), {1, 3, 7});  // vdim 7, key = query
    expect_failure_with(gqa_args(), {"v_proj_weight.npy has shape [8, 16] but must be [Hkv·d, vdim] = [8, 7] (vdim = 7 from value.npy)"});
}

TEST_F(DecoderErrors, ValueMustMatchKeyButItsWidth) {
    write_gqa_case();
    save(dir_ / "key.npy", std::vector<float>(4 * 16, 0.0f), {1, 4, 16});
    save(dir_ / "value.npy", std::vector<float>(5 * 16, 0.0f), {1, 5, 16});
    expect_failure_with(gqa_args(), {"value.npy has shape [1, 5, 16] but key.npy has shape [1, 4, 16]", "all but the last dim"});
}

TEST_F(DecoderErrors, PackedWeightsNeedKdimE) {
    std::mt19937 rng(5);
    save(dir_ / "query.npy", random_floats(3 * 8, 1.0f, rng), {1, 3, 8});
    save(dir_ / "key.npy", random_floats(3 * 6, 1.0f, rng), {1, 3, 6});
    save(dir_ / "in_proj_weight.npy", random_floats(24 * 8, 0.5f, rng), {24, 8});
    save(dir_ / "out_proj.weight.npy", random_floats(8 * 8, 0.5f, rng), {8, 8});
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2"},
                        {"key.npy has shape [1, 3, 6] but query.npy has shape [1, 3, 8]", "in_proj_weight.npy needs kdim = E"});
}

TEST_F(DecoderErrors, PackedWeightsWithOtherShapeNameTheFormula) {
    std::mt19937 rng(5);
    save(dir_ / "query.npy", random_floats(3 * 8, 1.0f, rng), {1, 3, 8});
    save(dir_ / "in_proj_weight.npy", random_floats(24 * 8, 0.5f, rng), {24, 8});
    save(dir_ / "out_proj.weight.npy", random_floats(8 * 8, 0.5f, rng), {8, 8});
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--kv-heads", "1"},
                        {"in_proj_weight.npy has shape [24, 8] but must be [H·d + 2·Hkv·d, E] (H·d = 2·4, Hkv·d = 1·4, E = 8 "
                         "from query.npy) = [16, 8]"});
}

TEST_F(DecoderErrors, BothPackedAndSeparateWeights) {
    write_gqa_case();
    save(dir_ / "in_proj_weight.npy", std::vector<float>(32 * 16, 0.0f), {32, 16});
    expect_failure_with(gqa_args(), {"q_proj_weight.npy and in_proj_weight.npy are both present"});
    // A stray k_proj or v_proj next to in_proj_weight.npy is named too.
    fs::remove(dir_ / "q_proj_weight.npy");
    expect_failure_with(gqa_args(), {"k_proj_weight.npy and in_proj_weight.npy are both present"});
    fs::remove(dir_ / "k_proj_weight.npy");
    expect_failure_with(gqa_args(), {"v_proj_weight.npy and in_proj_weight.npy are both present"});
}

TEST_F(DecoderErrors, MissingSeparateWeight) {
    for (const char* file : {"q_proj_weight.npy", "k_proj_weight.npy", "v_proj_weight.npy"}) {
        SCOPED_TRACE(file);
        write_gqa_case();
        fs::remove(dir_ / file);
        expect_failure_with(gqa_args(), {std::string(file) + ": required input is missing"});
    }
    write_gqa_case();
    for (const char* file : {"q_proj_weight.npy", "k_proj_weight.npy", "v_proj_weight.npy"}) fs::remove(dir_ / file);
    expect_failure_with(gqa_args(), {"in_proj_weight.npy: required input is missing", "q_proj_weight.npy"});
}

TEST_F(DecoderErrors, WrongInProjBiasLength) {
    write_gqa_case();
    save(dir_ / "in_proj_bias.npy", std::vector<float>(48, 0.0f), {48});  // [3E], but H·d + 2·Hkv·d = 32
    expect_failure_with(gqa_args(), {"in_proj_bias.npy has shape [48] but must be [H·d + 2·Hkv·d]", "= [32]"});
}

TEST_F(DecoderErrors, WrongOutProjForHeadDim) {
    write_gqa_case();
    // --head-dim 2 with a q/k/v of 8/4/4 rows: out_proj must be [E, H·d] = [16, 8].
    save(dir_ / "q_proj_weight.npy", std::vector<float>(8 * 16, 0.0f), {8, 16});
    save(dir_ / "k_proj_weight.npy", std::vector<float>(4 * 16, 0.0f), {4, 16});
    save(dir_ / "v_proj_weight.npy", std::vector<float>(4 * 16, 0.0f), {4, 16});
    save(dir_ / "in_proj_bias.npy", std::vector<float>(16, 0.0f), {16});
    expect_failure_with(gqa_args({"--head-dim", "2"}), {"out_proj.weight.npy has shape [16, 16] but must be [E, H·d]", "= [16, 8]"});
}

TEST_F(DecoderErrors, RopeFlagsNeedRopeTheta) {
    write_gqa_case();
    expect_failure_with(gqa_args({"--rope-style", "interleaved"}), {"--rope-style requires --rope-theta"});
    expect_failure_with(gqa_args({"--rope-dims", "2"}), {"--rope-dims requires --rope-theta"});
    expect_failure_with(gqa_args({"--position-offset", "2"}), {"--position-offset requires --rope-theta"});
    expect_failure_with(gqa_args({"--rope-theta", "1e4", "--rope-style", "sideways"}), {"--rope-style"});
}

TEST_F(DecoderErrors, CausalFlagsAreExclusive) {
    write_gqa_case();
    expect_failure_with(gqa_args({"--causal", "--causal-bottom-right"}), {"excludes"});
}

TEST_F(DecoderErrors, BadFlagValues) {
    write_gqa_case();
    expect_failure_with(gqa_args({"--kv-heads", "0"}), {"--kv-heads: must be a positive integer, got '0'"});
    expect_failure_with(gqa_args({"--head-dim", "x"}), {"--head-dim"});
}

}  // namespace
