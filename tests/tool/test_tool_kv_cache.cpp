// Tests of `mha run` with a KV cache: past_key.npy / past_value.npy (Hugging Face's past_key_values,
// [B, Hkv, Lp, d]) with past_lengths.npy (int32 or int64), --chunk N, and the present_key.npy /
// present_value.npy files written beside output.npy. Each runs the real binary (MHA_TOOL_PATH) in a fresh
// temporary folder:
//   - results: output.npy and present_*.npy must be bitwise what mha::MultiheadAttention::forward with a
//     mha::KVCache gives when called here on the same arrays (the same appends, the same chunks), for each
//     backend; --chunk N must agree with one causal `mha run` within 2e-5·max|x|;
//   - --kv-type bf16 / f16: the same against a KVCache of that element type; present_*.npy hold the cached
//     (rounded) values as float32, the past rows exactly mha::round_to_bf16 / round_to_f16 of the file's;
//   - bad input: exactly one line on stderr naming the files and values, a nonzero exit code, no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <mha/mha.hpp>
#include <nlohmann/json.hpp>

#include "npy.hpp"
#include "tool_files.hpp"
#include "tool_process.hpp"

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;
using mha_tool_test::Result;

using mha_tool_test::random_floats;
using mha_tool_test::save;

// An integer .npy file ('<i4' int32 or '<i8' int64), little-endian, as NumPy writes it.
void save_ints(const fs::path& p, const std::vector<std::int64_t>& v, const Shape& s, bool int64) {
    std::vector<std::uint8_t> bytes;
    for (const std::int64_t x : v) {
        std::uint8_t b[8];
        if (int64) {
            std::memcpy(b, &x, 8);
            bytes.insert(bytes.end(), b, b + 8);
        } else {
            const auto y = static_cast<std::int32_t>(x);
            std::memcpy(b, &y, 4);
            bytes.insert(bytes.end(), b, b + 4);
        }
    }
    mha_tool_test::write_bytes_npy(p, bytes, s, int64 ? "<i8" : "<i4");
}

const char* backend_name(mha::Backend b) { return b == mha::Backend::scalar ? "scalar" : "simd"; }

// max |a − b| <= tol · max|b|.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0, worst = 0;
    for (const float x : want) scale = std::max(scale, double(std::fabs(x)));
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])));
    EXPECT_LE(worst, tol * scale) << "max |difference| " << worst << ", max |x| " << scale;
}

enum class Lengths { none, int32, int64 };

struct CacheCase {
    const char* name = "";
    std::size_t B = 3, Lp = 6, Lq = 5, E = 16, H = 4, Hkv = 2, d = 4;
    bool past = true;                          // past_key.npy / past_value.npy
    std::vector<std::int64_t> lengths = {};    // past_lengths.npy values (empty: every sequence Lp)
    Lengths lengths_file = Lengths::none;
    std::size_t chunk = 0;                     // --chunk (0: flag absent)
    bool rope = true;                          // --rope-theta 10000
    bool packed = false;                       // in_proj_weight.npy (else q/k/v_proj_weight.npy)
    bool seq_first = false;
    bool unbatched = false;                    // query [Lq, E], past [Hkv, Lp, d], past_lengths 0-d (B must be 1)
    bool causal_flag = false;                  // pass --causal (accepted: it is what happens anyway)
    bool norm = false;                         // --norm-eps 1e-5 with norm weights
    std::optional<mha::DataType> kv_type = {};  // --kv-type (absent: f32)
    std::optional<float> k_scale = {}, v_scale = {};  // --k-scale / --v-scale (fp8)
};

void PrintTo(const CacheCase& c, std::ostream* os) { *os << c.name; }

// A layer's files and the same layer in-process.
struct Layer {
    std::vector<float> query, past_k, past_v, q_w, k_w, v_w, in_w, in_b, out_w, out_b, norm_w, norm_b;
    mha::AttentionWeights weights;
    mha::AttentionConfig config;
};

Layer make_layer(const CacheCase& c, const fs::path& dir) {
    std::mt19937 rng(77);
    Layer l;
    const std::size_t B = c.B, E = c.E, H = c.H, Hkv = c.Hkv, d = c.d;
    l.query = random_floats(B * c.Lq * E, 1.0f, rng);  // [B, Lq, E] (written [Lq, B, E] with --seq-first)
    l.past_k = random_floats(B * Hkv * c.Lp * d, 1.0f, rng);
    l.past_v = random_floats(B * Hkv * c.Lp * d, 1.0f, rng);
    l.q_w = random_floats(H * d * E, 0.5f, rng);
    l.k_w = random_floats(Hkv * d * E, 0.5f, rng);
    l.v_w = random_floats(Hkv * d * E, 0.5f, rng);
    l.in_w = l.q_w;
    l.in_w.insert(l.in_w.end(), l.k_w.begin(), l.k_w.end());
    l.in_w.insert(l.in_w.end(), l.v_w.begin(), l.v_w.end());
    l.in_b = random_floats(H * d + 2 * Hkv * d, 0.5f, rng);
    l.out_w = random_floats(E * H * d, 0.5f, rng);
    l.out_b = random_floats(E, 0.5f, rng);
    l.norm_w = random_floats(E, 1.0f, rng);
    l.norm_b = random_floats(E, 1.0f, rng);

    std::vector<float> q_file = l.query;
    if (c.seq_first) {
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < c.Lq; ++i)
                for (std::size_t f = 0; f < E; ++f) q_file[(i * B + b) * E + f] = l.query[(b * c.Lq + i) * E + f];
    }
    save(dir / "query.npy", q_file, c.unbatched ? Shape{c.Lq, E} : c.seq_first ? Shape{c.Lq, B, E} : Shape{B, c.Lq, E});
    if (c.packed) {
        save(dir / "in_proj_weight.npy", l.in_w, {H * d + 2 * Hkv * d, E});
    } else {
        save(dir / "q_proj_weight.npy", l.q_w, {H * d, E});
        save(dir / "k_proj_weight.npy", l.k_w, {Hkv * d, E});
        save(dir / "v_proj_weight.npy", l.v_w, {Hkv * d, E});
    }
    save(dir / "in_proj_bias.npy", l.in_b, {H * d + 2 * Hkv * d});
    save(dir / "out_proj.weight.npy", l.out_w, {E, H * d});
    save(dir / "out_proj.bias.npy", l.out_b, {E});
    if (c.norm) {
        save(dir / "norm.weight.npy", l.norm_w, {E});
        save(dir / "norm.bias.npy", l.norm_b, {E});
    }
    if (c.past) {
        const Shape past_shape = c.unbatched ? Shape{Hkv, c.Lp, d} : Shape{B, Hkv, c.Lp, d};
        save(dir / "past_key.npy", l.past_k, past_shape);
        save(dir / "past_value.npy", l.past_v, past_shape);
        if (c.lengths_file != Lengths::none)
            save_ints(dir / "past_lengths.npy", c.lengths, c.unbatched ? Shape{} : Shape{B}, c.lengths_file == Lengths::int64);
    }

    if (c.packed) {
        l.weights.in_proj_weight = l.in_w.data();
    } else {
        l.weights.q_proj_weight = l.q_w.data();
        l.weights.k_proj_weight = l.k_w.data();
        l.weights.v_proj_weight = l.v_w.data();
    }
    l.weights.in_proj_bias = l.in_b.data();
    l.weights.out_proj_weight = l.out_w.data();
    l.weights.out_proj_bias = l.out_b.data();
    if (c.norm) {
        l.weights.norm_weight = l.norm_w.data();
        l.weights.norm_bias = l.norm_b.data();
    }
    l.config.embed_dim = E;
    l.config.num_heads = H;
    l.config.num_kv_heads = Hkv;
    l.config.head_dim = d;
    if (c.rope) {
        mha::RopeConfig rope;
        rope.theta = 10000.0f;
        l.config.rope = rope;
    }
    return l;
}

struct Expected {
    std::vector<float> output;            // [B, Lq, E]
    std::vector<float> present_k, present_v;  // [B, Hkv, Lp + Lq, d]
};

// The library in-process: a KVCache(B, Hkv, d, Lp + Lq) holding sequence b's first lengths[b] past rows,
// then forward over the query in calls of `chunk` tokens (all at once when 0).
Expected library(const CacheCase& c, const Layer& l, mha::Backend backend) {
    const std::size_t B = c.B, Hkv = c.Hkv, d = c.d, E = c.E, Lp = c.past ? c.Lp : 0, cap = Lp + c.Lq;
    const mha::MultiheadAttention attention(l.weights, l.config);
    mha::KVCache cache(B, Hkv, d, cap, c.kv_type.value_or(mha::DataType::f32), c.k_scale.value_or(1.0f), c.v_scale.value_or(1.0f));
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t n = !c.past ? 0 : c.lengths.empty() ? Lp : std::size_t(c.lengths[b]);
        const std::size_t off = b * Hkv * Lp * d;
        cache.append(b, mha::ConstHeads(l.past_k.data() + off, 1, Hkv, n, d, Hkv * Lp * d, Lp * d, d),
                     mha::ConstHeads(l.past_v.data() + off, 1, Hkv, n, d, Hkv * Lp * d, Lp * d, d));
    }
    Expected e;
    e.output.assign(B * c.Lq * E, 0.0f);
    mha::ForwardOptions fo;
    fo.backend = backend;
    fo.threads = 2;
    if (c.norm) fo.norm_eps = 1e-5f;
    const std::size_t step = c.chunk ? c.chunk : c.Lq;
    for (std::size_t start = 0; start < c.Lq; start += step) {
        const std::size_t n = std::min(step, c.Lq - start);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(l.query.data() + start * E, B, n, E, E, c.Lq * E);
        mha::AttentionOutputs out;
        out.output = mha::Batch(e.output.data() + start * E, B, n, E, E, c.Lq * E);
        attention.forward(in, out, fo, cache);
    }
    e.present_k.assign(B * Hkv * cap * d, 0.0f);
    e.present_v.assign(B * Hkv * cap * d, 0.0f);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < Hkv; ++h) {
            const std::size_t n = cache.length(b);
            cache.copy_keys(b, h, mha::Matrix(e.present_k.data() + (b * Hkv + h) * cap * d, n, d));
            cache.copy_values(b, h, mha::Matrix(e.present_v.data() + (b * Hkv + h) * cap * d, n, d));
        }
    return e;
}

// [Lq, B, E] back to [B, Lq, E].
std::vector<float> batch_first(const std::vector<float>& v, std::size_t B, std::size_t L, std::size_t E) {
    std::vector<float> t(v.size());
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < L; ++i)
            for (std::size_t f = 0; f < E; ++f) t[(b * L + i) * E + f] = v[(i * B + b) * E + f];
    return t;
}

class KvCacheToolTest : public mha_tool_test::ToolDirTest {
protected:
    std::vector<std::string> layer_args(const CacheCase& c) {
        std::vector<std::string> a{"run", "--npy", dir_.string(), "--heads", std::to_string(c.H), "--kv-heads",
                                   std::to_string(c.Hkv), "--threads", "2"};
        if (c.rope) a.insert(a.end(), {"--rope-theta", "10000"});
        if (c.chunk) a.insert(a.end(), {"--chunk", std::to_string(c.chunk)});
        if (c.seq_first) a.push_back("--seq-first");
        if (c.causal_flag) a.push_back("--causal");
        if (c.norm) a.insert(a.end(), {"--norm-eps", "1e-5"});
        if (c.kv_type) a.insert(a.end(), {"--kv-type", std::string(mha::data_type_name(*c.kv_type))});
        if (c.k_scale) a.insert(a.end(), {"--k-scale", std::to_string(*c.k_scale)});
        if (c.v_scale) a.insert(a.end(), {"--v-scale", std::to_string(*c.v_scale)});
        return a;
    }
    // Runs the tool with output to base_/<name>/output.npy; returns that folder.
    fs::path run_into(const std::string& name, std::vector<std::string> args) {
        const fs::path out_dir = base_ / name;
        fs::create_directories(out_dir);
        args.insert(args.end(), {"--out", (out_dir / "output.npy").string()});
        const Result r = mha(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err, "");
        return out_dir;
    }
};

class KvCacheVsLibrary : public KvCacheToolTest, public ::testing::WithParamInterface<CacheCase> {};

TEST_P(KvCacheVsLibrary, SameAsLibrary) {
    const CacheCase c = GetParam();
    ASSERT_TRUE(!c.unbatched || c.B == 1);
    const Layer l = make_layer(c, dir_);
    const std::size_t Lp = c.past ? c.Lp : 0;
    const Shape present_shape = c.unbatched ? Shape{c.Hkv, Lp + c.Lq, c.d} : Shape{c.B, c.Hkv, Lp + c.Lq, c.d};
    for (const mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd}) {
        SCOPED_TRACE(backend_name(backend));
        const Expected want = library(c, l, backend);
        std::vector<std::string> args = layer_args(c);
        args.insert(args.end(), {"--backend", backend_name(backend)});
        const fs::path out_dir = run_into(std::string("out_") + backend_name(backend), args);
        const mha::npy::Array out = mha::npy::load((out_dir / "output.npy").string());
        const mha::npy::Array pk = mha::npy::load((out_dir / "present_key.npy").string());
        const mha::npy::Array pv = mha::npy::load((out_dir / "present_value.npy").string());
        EXPECT_EQ(out.shape, (c.unbatched ? Shape{c.Lq, c.E} : c.seq_first ? Shape{c.Lq, c.B, c.E} : Shape{c.B, c.Lq, c.E}));
        EXPECT_EQ(c.seq_first ? batch_first(out.values, c.B, c.Lq, c.E) : out.values, want.output);  // bitwise
        EXPECT_EQ(pk.dtype, mha::npy::DType::float32);
        EXPECT_EQ(pk.shape, present_shape);
        EXPECT_EQ(pv.shape, present_shape);
        EXPECT_EQ(pk.values, want.present_k);
        EXPECT_EQ(pv.values, want.present_v);
        // The past rows are the file's, unchanged; rows past past_lengths[b] + Lq are zeros.
        for (std::size_t b = 0; b < c.B; ++b) {
            const std::size_t n = !c.past ? 0 : c.lengths.empty() ? Lp : std::size_t(c.lengths[b]);
            for (std::size_t h = 0; h < c.Hkv; ++h)
                for (std::size_t i = 0; i < Lp + c.Lq; ++i)
                    for (std::size_t x = 0; x < c.d; ++x) {
                        const float got = pk.values[((b * c.Hkv + h) * (Lp + c.Lq) + i) * c.d + x];
                        if (i < n) {
                            const float past = l.past_k[((b * c.Hkv + h) * Lp + i) * c.d + x];
                            const mha::DataType t = c.kv_type.value_or(mha::DataType::f32);
                            if (mha::data_type_bytes(t) == 1) continue;  // 8-bit rows: the library's (want.present_k) above
                            ASSERT_EQ(got, t == mha::DataType::bf16 ? mha::round_to_bf16(past)
                                           : t == mha::DataType::f16 ? mha::round_to_f16(past) : past);
                        } else if (i >= n + c.Lq) {
                            ASSERT_EQ(got, 0.0f);
                        }
                    }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, KvCacheVsLibrary,
    ::testing::Values(
        // Ragged int32 past_lengths with a length-0 sequence; GQA, RoPE; --causal given (accepted).
        CacheCase{.name = "ragged_int32", .lengths = {6, 0, 3}, .lengths_file = Lengths::int32, .causal_flag = true},
        // The same with int64 lengths, --seq-first query and output, and the post-norm block.
        CacheCase{.name = "ragged_int64_seq_first", .lengths = {2, 6, 0}, .lengths_file = Lengths::int64, .seq_first = true,
                  .norm = true},
        // No past_lengths.npy: every sequence holds Lp; packed weights, no RoPE, MQA.
        CacheCase{.name = "full_past_packed", .B = 2, .Lp = 4, .Lq = 3, .Hkv = 1, .rope = false, .packed = true},
        // Unbatched: query [Lq, E], past [Hkv, Lp, d], past_lengths 0-d.
        CacheCase{.name = "unbatched", .B = 1, .lengths = {4}, .lengths_file = Lengths::int64, .unbatched = true},
        // One new token (a decode step) over a longer ragged past.
        CacheCase{.name = "decode_step", .Lp = 40, .Lq = 1, .lengths = {40, 17, 1}, .lengths_file = Lengths::int32},
        // An empty past (Lp = 0).
        CacheCase{.name = "empty_past", .B = 2, .Lp = 0, .Lq = 4},
        // --chunk continuing a ragged past: the library loop with the same chunks.
        CacheCase{.name = "past_chunk2", .lengths = {6, 0, 3}, .lengths_file = Lengths::int64, .chunk = 2},
        // --chunk without a past: an empty cache of capacity Lq.
        CacheCase{.name = "chunk3_no_past", .B = 2, .Lq = 7, .past = false, .chunk = 3},
        CacheCase{.name = "chunk1_no_past_seq_first", .B = 2, .Lq = 7, .past = false, .chunk = 1, .seq_first = true},
        // --kv-type: the past rounded into a bf16 / f16 cache, the new tokens too (a decode step, chunks).
        CacheCase{.name = "decode_step_bf16", .Lp = 40, .Lq = 1, .lengths = {40, 17, 1}, .lengths_file = Lengths::int32,
                  .kv_type = mha::DataType::bf16},
        CacheCase{.name = "past_chunk2_f16", .lengths = {6, 0, 3}, .lengths_file = Lengths::int64, .chunk = 2,
                  .kv_type = mha::DataType::f16},
        CacheCase{.name = "ragged_bf16_norm", .lengths = {2, 6, 0}, .lengths_file = Lengths::int64, .norm = true,
                  .kv_type = mha::DataType::bf16},
        CacheCase{.name = "explicit_f32", .B = 2, .Lp = 4, .Lq = 3, .kv_type = mha::DataType::f32},
        // The 8-bit types: present_*.npy hold the stored values dequantized (the library's, bit for bit).
        CacheCase{.name = "decode_step_int8", .Lp = 40, .Lq = 1, .lengths = {40, 17, 1}, .lengths_file = Lengths::int32,
                  .kv_type = mha::DataType::int8},
        CacheCase{.name = "past_chunk2_e4m3_scaled", .lengths = {6, 0, 3}, .lengths_file = Lengths::int64, .chunk = 2,
                  .kv_type = mha::DataType::fp8_e4m3, .k_scale = 0.25f, .v_scale = 2.0f},
        CacheCase{.name = "decode_step_e5m2", .Lp = 40, .Lq = 1, .lengths = {40, 17, 1}, .lengths_file = Lengths::int32,
                  .kv_type = mha::DataType::fp8_e5m2, .v_scale = 0.5f}),
    [](const ::testing::TestParamInfo<CacheCase>& i) { return std::string(i.param.name); });

// --chunk N against one causal `mha run` (no cache): the same up to float rounding; and against the
// library loop feeding the same chunks: bitwise (output and present_*).
class ChunkVsOneShot : public KvCacheToolTest, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(ChunkVsOneShot, MatchesOneCausalCall) {
    const std::size_t N = GetParam();
    const CacheCase base{.name = "chunk", .B = 2, .Lq = 7, .past = false};
    const Layer l = make_layer(base, dir_);
    for (const mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd}) {
        SCOPED_TRACE(backend_name(backend));
        std::vector<std::string> args = layer_args(base);
        args.insert(args.end(), {"--backend", backend_name(backend)});
        std::vector<std::string> one_shot = args;
        one_shot.push_back("--causal");
        const fs::path ref_dir = run_into(std::string("one_shot_") + backend_name(backend), one_shot);
        EXPECT_FALSE(fs::exists(ref_dir / "present_key.npy"));  // no cache, no present_*
        args.insert(args.end(), {"--chunk", std::to_string(N)});
        const fs::path out_dir = run_into(std::string("chunk_") + backend_name(backend), args);
        const mha::npy::Array ref = mha::npy::load((ref_dir / "output.npy").string());
        const mha::npy::Array got = mha::npy::load((out_dir / "output.npy").string());
        ASSERT_EQ(got.shape, ref.shape);
        expect_close(got.values, ref.values, 2e-5);

        CacheCase c = base;
        c.chunk = N;
        const Expected want = library(c, l, backend);
        EXPECT_EQ(got.values, want.output);
        const mha::npy::Array pk = mha::npy::load((out_dir / "present_key.npy").string());
        const mha::npy::Array pv = mha::npy::load((out_dir / "present_value.npy").string());
        EXPECT_EQ(pk.shape, (Shape{2, base.Hkv, 7, base.d}));
        EXPECT_EQ(pk.values, want.present_k);
        EXPECT_EQ(pv.values, want.present_v);
        // Every row of present_* is a cached token: K is the rotated projection, never all zero here.
        for (std::size_t r = 0; r < 2 * base.Hkv * 7; ++r) {
            const auto row = pk.values.begin() + std::ptrdiff_t(r * base.d);
            EXPECT_TRUE(std::any_of(row, row + std::ptrdiff_t(base.d), [](float x) { return x != 0.0f; })) << "row " << r;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(ChunkSizes, ChunkVsOneShot, ::testing::Values(std::size_t{1}, std::size_t{3}, std::size_t{7}),
                         [](const ::testing::TestParamInfo<std::size_t>& i) { return "chunk" + std::to_string(i.param); });

// --chunk continuing a past agrees with the same past fed in one call.
TEST_F(KvCacheToolTest, ChunkedPastMatchesOneCall) {
    CacheCase c{.name = "past", .lengths = {6, 0, 3}, .lengths_file = Lengths::int32};
    make_layer(c, dir_);
    const fs::path one = run_into("one", layer_args(c));
    c.chunk = 2;
    const fs::path chunked = run_into("chunked", layer_args(c));
    for (const char* file : {"output.npy", "present_key.npy", "present_value.npy"}) {
        SCOPED_TRACE(file);
        const mha::npy::Array a = mha::npy::load((one / file).string());
        const mha::npy::Array b = mha::npy::load((chunked / file).string());
        ASSERT_EQ(a.shape, b.shape);
        expect_close(b.values, a.values, 2e-5);
    }
}

// present_*.npy go beside output.npy: in the --npy folder without --out.
TEST_F(KvCacheToolTest, PresentFilesBesideDefaultOutput) {
    const CacheCase c{.name = "default_out", .B = 1, .Lp = 2, .Lq = 2};
    make_layer(c, dir_);
    const Result r = mha(layer_args(c));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* file : {"output.npy", "present_key.npy", "present_value.npy"}) EXPECT_TRUE(fs::exists(dir_ / file)) << file;
}

// The rounding shows: a bf16 and an f16 cache give outputs that differ from the f32 cache's (and from each
// other), within the effect of rounding K and V (relative 2^-8 / 2^-11 of the values, through attention:
// a loose 1e-2 / 2e-3 of max|output| here).
TEST_F(KvCacheToolTest, KvTypeChangesTheResultByTheRounding) {
    CacheCase c{.name = "types", .Lp = 40, .Lq = 2, .lengths = {40, 17, 1}, .lengths_file = Lengths::int32};
    make_layer(c, dir_);
    const fs::path f32 = run_into("f32", layer_args(c));
    c.kv_type = mha::DataType::bf16;
    const fs::path bf16 = run_into("bf16", layer_args(c));
    c.kv_type = mha::DataType::f16;
    const fs::path f16 = run_into("f16", layer_args(c));
    const auto load = [](const fs::path& d) { return mha::npy::load((d / "output.npy").string()).values; };
    const std::vector<float> a = load(f32), b = load(bf16), h = load(f16);
    EXPECT_NE(a, b);
    EXPECT_NE(a, h);
    EXPECT_NE(b, h);
    expect_close(b, a, 1e-2);
    expect_close(h, a, 2e-3);
}

TEST_F(KvCacheToolTest, HelpNamesTheFilesAndFlags) {
    const Result r = mha({"run", "--help"});
    EXPECT_EQ(r.exit_code, 0);
    for (const char* s : {"--chunk", "past_key.npy", "past_value.npy", "past_lengths.npy", "present_key.npy", "--kv-type"})
        EXPECT_NE(r.out.find(s), std::string::npos) << s << " missing in\n" << r.out;
}

// --- bad input -----------------------------------------------------------------------------------

class KvCacheErrors : public KvCacheToolTest {
protected:
    // A valid case: B 3, Lp 6, Lq 5, E 16, H 4, Hkv 2, d 4, RoPE, int32 past_lengths {6, 0, 3}.
    const CacheCase base_case{.name = "errors", .lengths = {6, 0, 3}, .lengths_file = Lengths::int32};
    void write_case() { make_layer(base_case, dir_); }
    std::vector<std::string> args(std::vector<std::string> extra = {}) {
        std::vector<std::string> a = layer_args(base_case);
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    }
};

TEST_F(KvCacheErrors, ValidCaseRuns) {
    write_case();
    const Result r = mha(args());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir_ / "present_key.npy"));
}

TEST_F(KvCacheErrors, KvTypeNeedsTheCachePathAndAKnownType) {
    write_case();
    fs::remove(dir_ / "past_key.npy");
    fs::remove(dir_ / "past_value.npy");
    fs::remove(dir_ / "past_lengths.npy");
    expect_failure_with(args({"--kv-type", "bf16"}), {"--kv-type applies only to the KV cache path"});
    write_case();
    expect_failure_with(args({"--kv-type", "fp8"}), {"--kv-type", "fp8"});
    // A scale other than 1 needs an fp8 type; 1 is no scale, which every type takes (as the library's caches).
    expect_failure_with(args({"--kv-type", "int8", "--k-scale", "2"}), {"--k-scale / --v-scale apply only to an fp8 KV cache", "int8"});
    const Result one = mha(args({"--kv-type", "int8", "--k-scale", "1", "--v-scale", "1"}));
    EXPECT_EQ(one.exit_code, 0) << one.err;
    // Scales are 32-bit floats: the largest finite one parses, one that rounds to 0 or to inf does not; a scale
    // whose fp8 read-back overflows is the library's refusal.
    fs::remove(dir_ / "output.npy");  // written by the run above; a refused run writes none
    expect_failure_with(args({"--kv-type", "fp8_e4m3", "--k-scale", "1e-46"}), {"--k-scale", "finite as a 32-bit float", "1e-46"});
    expect_failure_with(args({"--kv-type", "fp8_e4m3", "--v-scale", "1e39"}), {"--v-scale", "finite as a 32-bit float", "1e39"});
    expect_failure_with(args({"--kv-type", "fp8_e4m3", "--k-scale", "3.4028235e38"}), {"k_scale is 3.4028235e+38", "overflows float"});
    const Result e5m2 = mha(args({"--kv-type", "fp8_e5m2", "--k-scale", "1e30", "--v-scale", "1e-30"}));
    EXPECT_EQ(e5m2.exit_code, 0) << e5m2.err;
}

TEST_F(KvCacheErrors, PastKvHeadsDisagreeWithKvHeads) {
    write_case();
    save(dir_ / "past_key.npy", std::vector<float>(3 * 3 * 6 * 4), {3, 3, 6, 4});
    save(dir_ / "past_value.npy", std::vector<float>(3 * 3 * 6 * 4), {3, 3, 6, 4});
    expect_failure_with(args(), {"past_key.npy has 3 KV heads", "[3, 3, 6, 4]", "--kv-heads is 2"});
}

TEST_F(KvCacheErrors, PastHeadDimDisagreesWithLayer) {
    write_case();
    save(dir_ / "past_key.npy", std::vector<float>(3 * 2 * 6 * 8), {3, 2, 6, 8});
    save(dir_ / "past_value.npy", std::vector<float>(3 * 2 * 6 * 8), {3, 2, 6, 8});
    expect_failure_with(args(), {"past_key.npy has head dim 8", "the layer's head dim is 4", "q_proj_weight.npy rows / --heads"});
    expect_failure_with(args({"--head-dim", "4"}), {"past_key.npy has head dim 8", "the layer's head dim is 4 (from --head-dim)"});
}

TEST_F(KvCacheErrors, PastBatchOrRankWrong) {
    write_case();
    save(dir_ / "past_key.npy", std::vector<float>(2 * 2 * 6 * 4), {2, 2, 6, 4});
    save(dir_ / "past_value.npy", std::vector<float>(2 * 2 * 6 * 4), {2, 2, 6, 4});
    expect_failure_with(args(), {"past_key.npy has batch 2", "query.npy has B = 3"});
    save(dir_ / "past_key.npy", std::vector<float>(2 * 6 * 4), {2, 6, 4});
    expect_failure_with(args(), {"past_key.npy has shape [2, 6, 4] but must be [B, Hkv, Lp, d]"});
}

TEST_F(KvCacheErrors, PastValueShapeDiffers) {
    write_case();
    save(dir_ / "past_value.npy", std::vector<float>(3 * 2 * 5 * 4), {3, 2, 5, 4});
    expect_failure_with(args(), {"past_value.npy has shape [3, 2, 5, 4] but past_key.npy has shape [3, 2, 6, 4]"});
}

TEST_F(KvCacheErrors, PastKeyOrValueAlone) {
    write_case();
    fs::remove(dir_ / "past_value.npy");
    expect_failure_with(args(), {"past_key.npy is present but past_value.npy is missing"});
    write_case();
    fs::remove(dir_ / "past_key.npy");
    expect_failure_with(args(), {"past_value.npy is present but past_key.npy is missing"});
    fs::remove(dir_ / "past_value.npy");
    expect_failure_with(args(), {"past_lengths.npy is present without past_key.npy and past_value.npy"});
}

TEST_F(KvCacheErrors, PastFloatsWrongDtype) {
    write_case();
    save_ints(dir_ / "past_key.npy", std::vector<std::int64_t>(3 * 2 * 6 * 4), {3, 2, 6, 4}, false);
    expect_failure_with(args(), {"past_key.npy", "dtype '<i4' is not supported"});
    write_case();
    mha_tool_test::write_bytes_npy(dir_ / "past_value.npy", std::vector<std::uint8_t>(3 * 2 * 6 * 4), {3, 2, 6, 4});
    expect_failure_with(args(), {"past_value.npy has dtype bool but must be float32 or float64"});
}

TEST_F(KvCacheErrors, LengthPastLp) {
    write_case();
    save_ints(dir_ / "past_lengths.npy", {6, 0, 7}, {3}, false);
    expect_failure_with(args(), {"past_lengths.npy[2] is 7 but past_key.npy holds Lp = 6 tokens per sequence"});
    save_ints(dir_ / "past_lengths.npy", {6, -1, 3}, {3}, true);
    expect_failure_with(args(), {"past_lengths.npy[1] is -1 but a length must be >= 0"});
    save_ints(dir_ / "past_lengths.npy", {6, 0, std::int64_t{1} << 40}, {3}, true);
    expect_failure_with(args(), {"past_lengths.npy[2] is 1099511627776 but past_key.npy holds Lp = 6"});
}

TEST_F(KvCacheErrors, LengthsWrongDtypeOrShape) {
    write_case();
    save(dir_ / "past_lengths.npy", {6, 0, 3}, {3});
    expect_failure_with(args(), {"past_lengths.npy has dtype float32 but must be int32 or int64"});
    mha_tool_test::write_bytes_npy(dir_ / "past_lengths.npy", {6, 0, 3}, {3}, "|u1");
    expect_failure_with(args(), {"past_lengths.npy has dtype uint8 but must be int32 or int64"});
    mha_tool_test::write_bytes_npy(dir_ / "past_lengths.npy", {6, 0, 0, 0, 0, 0}, {3}, "<i2");
    expect_failure_with(args(), {"past_lengths.npy", "dtype '<i2' is not supported"});
    save_ints(dir_ / "past_lengths.npy", {6, 0, 3, 1}, {4}, false);
    expect_failure_with(args(), {"past_lengths.npy has shape [4] but must be [B] = [3]"});
    save_ints(dir_ / "past_lengths.npy", {6, 0, 3}, {1, 3}, true);
    expect_failure_with(args(), {"past_lengths.npy has shape [1, 3] but must be [B] = [3]"});
}

TEST_F(KvCacheErrors, PastWithKeyOrValueFile) {
    for (const char* file : {"key.npy", "value.npy"}) {
        SCOPED_TRACE(file);
        write_case();
        std::mt19937 rng(9);
        save(dir_ / file, random_floats(3 * 5 * 16, 1.0f, rng), {3, 5, 16});
        expect_failure_with(args(), {std::string(file) + " is not taken with past_key.npy", "self-attention"});
        expect_failure_with(args({"--chunk", "2"}), {std::string(file) + " is not taken with past_key.npy and --chunk"});
        fs::remove(dir_ / "past_key.npy"), fs::remove(dir_ / "past_value.npy"), fs::remove(dir_ / "past_lengths.npy");
        expect_failure_with(args({"--chunk", "2"}), {std::string(file) + " is not taken with --chunk"});
        fs::remove(dir_ / file);
    }
}

TEST_F(KvCacheErrors, PastWithMasks) {
    write_case();
    mha_tool_test::write_bytes_npy(dir_ / "key_padding_mask.npy", std::vector<std::uint8_t>(3 * 5), {3, 5});
    expect_failure_with(args(), {"key_padding_mask.npy is not taken with past_key.npy: no masks with a KV cache",
                                 "past_lengths.npy gives each sequence's valid past"});
    fs::remove(dir_ / "key_padding_mask.npy");
    save(dir_ / "attn_mask.npy", std::vector<float>(5 * 5), {5, 5});
    expect_failure_with(args(), {"attn_mask.npy is not taken with past_key.npy"});
    fs::remove(dir_ / "past_key.npy"), fs::remove(dir_ / "past_value.npy"), fs::remove(dir_ / "past_lengths.npy");
    expect_failure_with(args({"--chunk", "1"}), {"attn_mask.npy is not taken with --chunk"});
}

TEST_F(KvCacheErrors, FlagsThatDoNotApplyWithACache) {
    write_case();
    expect_failure_with(args({"--need-weights"}), {"--need-weights is not available with past_key.npy"});
    expect_failure_with(args({"--causal-bottom-right"}), {"--causal-bottom-right does not apply with past_key.npy",
                                                          "--causal may be given"});
    expect_failure_with(args({"--position-offset", "3"}),
                        {"--position-offset does not apply with past_key.npy", "past_lengths[b] + i"});
    // --position-offset 0 is still a position offset given: refused too.
    expect_failure_with(args({"--position-offset", "0"}), {"--position-offset does not apply with past_key.npy"});
    fs::remove(dir_ / "past_key.npy"), fs::remove(dir_ / "past_value.npy"), fs::remove(dir_ / "past_lengths.npy");
    expect_failure_with(args({"--chunk", "2", "--need-weights"}), {"--need-weights is not available with --chunk"});
    expect_failure_with(args({"--chunk", "2", "--causal-bottom-right"}), {"--causal-bottom-right does not apply with --chunk"});
    expect_failure_with(args({"--chunk", "2", "--position-offset", "1"}), {"--position-offset does not apply with --chunk"});
    expect_failure_with(args({"--chunk", "0"}), {"--chunk: must be a positive integer, got '0'"});
}

TEST_F(KvCacheErrors, OutputWouldBeOverwrittenByPresent) {
    write_case();
    const fs::path out_dir = base_ / "out";
    fs::create_directories(out_dir);
    for (const char* file : {"present_key.npy", "present_value.npy"}) {
        const Result r = mha(args({"--out", (out_dir / file).string()}));
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.err.find(std::string("would be overwritten by ") + file), std::string::npos) << r.err;
        EXPECT_TRUE(fs::is_empty(out_dir));
    }
}

TEST_F(KvCacheErrors, UnbatchedPastShapes) {
    CacheCase c{.name = "unbatched", .B = 1, .lengths = {4}, .lengths_file = Lengths::int64, .unbatched = true};
    make_layer(c, dir_);
    std::vector<std::string> a = layer_args(c);
    save_ints(dir_ / "past_lengths.npy", {4}, {1}, true);
    expect_failure_with(a, {"past_lengths.npy has shape [1] but must be [] (a 0-d array: the query is unbatched)"});
    fs::remove(dir_ / "past_lengths.npy");
    save(dir_ / "past_key.npy", std::vector<float>(2 * 6 * 4), {1, 2, 6, 4});
    save(dir_ / "past_value.npy", std::vector<float>(2 * 6 * 4), {1, 2, 6, 4});
    expect_failure_with(a, {"past_key.npy has shape [1, 2, 6, 4] but must be [Hkv, Lp, d] (unbatched query)"});
}

// A failing forward (here: the library refuses an empty cache) writes nothing either.
TEST_F(KvCacheErrors, EmptyQueryAndPastWriteNothing) {
    CacheCase c{.name = "empty", .B = 1, .Lp = 0, .Lq = 0};
    make_layer(c, dir_);
    const std::set<std::string> before = mha_tool_test::listing(dir_);
    const Result r = mha(layer_args(c));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(mha_tool_test::listing(dir_), before);
}

// --- mha bench --op decode -------------------------------------------------------------------------

class DecodeBench : public KvCacheToolTest {
protected:
    nlohmann::json bench(std::vector<std::string> args) {
        args.insert(args.begin(), {"bench", "--op", "decode", "--json", "--reps", "3"});
        const Result r = mha(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.err, "");
        EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
        nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
        EXPECT_TRUE(j.is_object()) << r.out;
        if (!j.is_object()) return nlohmann::json::object();
        for (const char* field : {"op", "backend", "isa", "threads", "reps", "batch", "kv_seq", "seq", "embed", "heads",
                                  "kv_heads", "head_dim", "ms_median", "ms_min", "gflops", "gbps", "weight_bytes", "cache_bytes",
                                  "kv_type"})
            EXPECT_TRUE(j.contains(field)) << field << " missing in " << r.out;
        EXPECT_EQ(j.value("op", ""), "decode");
        EXPECT_GT(j.value("ms_min", 0.0), 0.0);
        EXPECT_LE(j.value("ms_min", 0.0), j.value("ms_median", 0.0));
        EXPECT_GT(j.value("gbps", 0.0), 0.0);
        EXPECT_GT(j.value("gflops", 0.0), 0.0);
        // The rates are the documented counts over the median time.
        const double B = j.value("batch", 0.0), Lk = j.value("kv_seq", 0.0), Lq = j.value("seq", 0.0), E = j.value("embed", 0.0);
        const double H = j.value("heads", 0.0), Hkv = j.value("kv_heads", 0.0), d = j.value("head_dim", 0.0);
        const double s = j.value("ms_median", 0.0) * 1e-3;
        const double flops = 2 * B * Lq * (E * H * d + 2 * E * Hkv * d + H * d * E) + 4 * B * H * Lq * (Lk + Lq) * d;
        const std::string kv_type = j.value("kv_type", "");
        // Bytes of a stored row: d elements (an int8 row with its float16 scale per 32 values).
        const double row = kv_type == "f32" ? 4 * d : kv_type == "bf16" || kv_type == "f16" ? 2 * d
                           : kv_type == "int8" ? d + 2 * std::ceil(d / 32) : kv_type == "fp8_e4m3" || kv_type == "fp8_e5m2" ? d : 0;
        EXPECT_GT(row, 0) << "kv_type " << kv_type;
        const double cache_bytes = 2 * B * Hkv * (Lk + Lq) * row;
        EXPECT_NEAR(j.value("gflops", 0.0), flops / s / 1e9, 1e-9 * flops / s / 1e9);
        EXPECT_EQ(j.value("cache_bytes", 0.0), cache_bytes);
        const double bytes = j.value("weight_bytes", 0.0) + cache_bytes;
        EXPECT_NEAR(j.value("gbps", 0.0), bytes / s / 1e9, 1e-9 * bytes / s / 1e9);
        // The four projections at least, read as fp32, or bf16 panels with --dtype bf16 where the CPU has them.
        EXPECT_GE(j.value("weight_bytes", 0.0), (j.value("dtype", "f32") == "bf16" ? 2 : 4) * (2 * E * H * d + 2 * E * Hkv * d));
        return j;
    }
};

TEST_F(DecodeBench, JsonOneAndTwoThreads) {
    for (const char* threads : {"1", "2"}) {
        SCOPED_TRACE(threads);
        const nlohmann::json j = bench({"--batch", "2", "--kv-seq", "64", "--embed", "32", "--heads", "4", "--kv-heads", "2",
                                        "--threads", threads});
        EXPECT_GE(j.value("threads", 0), 1);  // the request, clamped to the pool
        EXPECT_LE(j.value("threads", 0), std::stoi(threads));
        EXPECT_EQ(j.value("batch", 0), 2);
        EXPECT_EQ(j.value("kv_seq", 0), 64);
        EXPECT_EQ(j.value("seq", 0), 1);  // the default: one new token
        EXPECT_EQ(j.value("head_dim", 0), 8);
    }
}

TEST_F(DecodeBench, SeveralNewTokensHeadDimRope) {
    const nlohmann::json j = bench({"--batch", "1", "--kv-seq", "40", "--seq", "4", "--embed", "32", "--heads", "4",
                                    "--kv-heads", "1", "--head-dim", "16", "--rope-theta", "10000", "--threads", "2"});
    EXPECT_EQ(j.value("seq", 0), 4);
    EXPECT_EQ(j.value("head_dim", 0), 16);
    EXPECT_EQ(j.value("kv_heads", 0), 1);
}

// --kv-type: "kv_type" in the JSON, and the cache counted at its element size (checked in bench()).
TEST_F(DecodeBench, KvTypes) {
    for (const char* type : {"f32", "bf16", "f16", "int8", "fp8_e4m3", "fp8_e5m2"})
        for (const char* backend : {"simd", "scalar"}) {
            SCOPED_TRACE(std::string(type) + " " + backend);
            std::vector<std::string> a{"--batch", "2", "--kv-seq", "600", "--embed", "32", "--heads", "4", "--kv-heads", "2",
                                       "--kv-type", type, "--backend", backend};
            if (std::string(type).rfind("fp8", 0) == 0) a.insert(a.end(), {"--k-scale", "0.5", "--v-scale", "2"});
            const nlohmann::json j = bench(a);
            EXPECT_EQ(j.value("kv_type", ""), type);
            const std::string t(type);
            const double row = t == "f32" ? 32 : t == "bf16" || t == "f16" ? 16 : t == "int8" ? 8 + 2 : 8;  // d = 8
            EXPECT_EQ(j.value("cache_bytes", 0.0), 2.0 * 2 * 2 * 601 * row);
        }
    const Result scale_without_fp8 = mha({"bench", "--op", "decode", "--kv-type", "int8", "--k-scale", "2"});
    EXPECT_NE(scale_without_fp8.exit_code, 0);
    EXPECT_NE(scale_without_fp8.err.find("--k-scale / --v-scale apply only to an fp8 KV cache"), std::string::npos) << scale_without_fp8.err;
    EXPECT_EQ(bench({"--batch", "1", "--kv-seq", "8", "--embed", "16", "--heads", "2"}).value("kv_type", ""), "f32");  // default
    const Result bad = mha({"bench", "--op", "decode", "--kv-type", "fp8"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("--kv-type"), std::string::npos) << bad.err;
    const Result other_op = mha({"bench", "--op", "attention", "--kv-type", "bf16"});
    EXPECT_NE(other_op.exit_code, 0);
    EXPECT_NE(other_op.err.find("--kv-type does not apply to --op attention"), std::string::npos) << other_op.err;
}

TEST_F(DecodeBench, ScalarBackendAndPackedShape) {
    const nlohmann::json j = bench({"--backend", "scalar", "--batch", "1", "--kv-seq", "16", "--embed", "16", "--heads", "2"});
    EXPECT_EQ(j.value("backend", ""), "scalar");
    EXPECT_EQ(j.value("threads", 0), 1);
}

TEST_F(DecodeBench, ReadableLine) {
    const Result r = mha({"bench", "--op", "decode", "--batch", "1", "--kv-seq", "16", "--embed", "16", "--heads", "2", "--reps", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("decode batch=1 kv_seq=16 seq=1", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
}

TEST_F(DecodeBench, FlagsThatDoNotApply) {
    for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--causal", ""}, {"--kdim", "8"}, {"--vdim", "8"},
                                                                                      {"--m", "4"}, {"--rows", "4"}}) {
        std::vector<std::string> a{"bench", "--op", "decode", "--batch", "1", "--kv-seq", "8", "--embed", "16", "--heads", "2", flag};
        if (!value.empty()) a.push_back(value);
        const Result r = mha(a);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.err.find(flag + " does not apply to --op decode"), std::string::npos) << r.err;
    }
    const Result r = mha({"bench", "--op", "decode", "--embed", "10", "--heads", "3"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("not a multiple"), std::string::npos) << r.err;
}

}  // namespace
