// Incremental decoding against PyTorch (issue 13): the float64 results tools/make_fixtures.py saved in
// tests/data/kv_cache/<case>/ (tests/data/README.md). The script runs a Llama-style layer (separate q/k/v/o
// projections, GQA by repeat_interleave, RoPE half pairing, no biases) the way a generating model does, with Hugging
// Face's past_key_values semantics: each sequence's prompt in one causal pass, then tokens one at a time, each
// rotated at past_len and attending over the concatenated cache. Sequences are ragged (prompts of 20 and 13 tokens,
// 8 generated each). It saves every token's output and the final cache (present_key with K rotated, present_value).
//
// Here the same layer runs through MultiheadAttention::forward with a KVCache, both backends (the SIMD one on
// every ISA the CPU has), two ways:
//   truncate  the prompts in one call for the whole batch ([B, max prompt, E]; the shorter prompt padded with the
//             following rows of its sequence), each sequence then truncated to its prompt length (ragged), then
//             the generated tokens in single-token calls for the whole batch;
//   append    each prompt in one call on its own batch-1 cache, loaded into the batch cache with KVCache::append
//             (past_key_values handed over), then the same single-token calls;
// and compares every output row (the prompt rows from the prompt call, the others from their step) and the final
// cache (KVCache::keys(b, h) / values(b, h), lengths prompt + generated) with the saved values.
//
// Tolerance: the inputs are the float32 values PyTorch computed on in float64, so the only error is the library's
// float arithmetic. decode_test_util.hpp's double evaluation of the whole causal pass over each sequence carries a
// first-order bound per element (projections g(E + 1)·u·Σ|x||w|, RoPE, the core with g(keys) and T key tiles,
// the output projection g(H·d + 1)·u·Σ|c||w|, g(n) = min(n, 6√n)); it also bounds the incremental computation,
// whose cached rows are the same float projections and rotations of the same tokens and whose steps see a subset
// of the keys. Tolerance = kDecoderSafety (2)·bound + u·|expected| (the float64 expected values are read as
// float). Each case also checks that the bound stays far below the values (< 1e-3 of max|expected|); the
// measured errors and bounds are recorded as test properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "compare_util.hpp"
#include "decode_test_util.hpp"
#include "npy.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kKvDir = fs::path(MHA_TEST_DATA_DIR) / "kv_cache";
const std::vector<std::string> kExpectedCases = {"llama_generate_ragged"};

std::vector<std::string> case_names() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(kKvDir, ec))
        if (entry.is_directory() && fs::exists(entry.path() / "args.json")) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(KvCacheFixtures, AllCasesPresent) {
    const auto names = case_names();
    EXPECT_EQ(names, kExpectedCases) << kKvDir;
}

std::string sci(double v) {
    std::ostringstream s;
    s << std::scientific << v;
    return s.str();
}

// One case: the files, the layer, and per sequence the expected rows and cache with their tolerances.
struct Case {
    std::map<std::string, mha::npy::Array> files;
    json args;
    std::size_t B = 0, T = 0, E = 0, H = 0, Hkv = 0, d = 0, steps = 0;
    std::vector<std::size_t> prompts;
    mha::RopeConfig rope;
    const mha::npy::Array& at(const std::string& f) const { return files.at(f); }
    const float* data(const std::string& f) const { return at(f).values.data(); }
    std::size_t tokens(std::size_t b) const { return prompts[b] + steps; }

    // Tolerances per sequence: output rows [tokens, E], cache rows [Hkv, tokens, d].
    std::vector<std::vector<double>> out_tol, k_tol, v_tol;

    mha_decode_test::LayerRef layer() const {
        mha_decode_test::LayerRef L;
        L.E = E, L.H = H, L.Hkv = Hkv, L.d = d, L.rope = rope;
        L.wq = data("q_proj_weight"), L.wk = data("k_proj_weight"), L.wv = data("v_proj_weight"), L.wo = data("out_proj.weight");
        return L;
    }
    mha::MultiheadAttention make() const {
        mha::AttentionWeights w;
        w.q_proj_weight = data("q_proj_weight"), w.k_proj_weight = data("k_proj_weight"), w.v_proj_weight = data("v_proj_weight");
        w.out_proj_weight = data("out_proj.weight");
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = Hkv, c.head_dim = d, c.rope = rope;
        return mha::MultiheadAttention(w, c);
    }
    // Row i of sequence b of a [B, T, width] float64-as-float array.
    const float* row(const std::string& f, std::size_t b, std::size_t i, std::size_t width) const { return data(f) + (b * T + i) * width; }
};

Case load_case(const std::string& name) {
    Case c;
    const fs::path dir = kKvDir / name;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".npy") c.files[e.path().stem().string()] = mha::npy::load(e.path().string());
    std::ifstream f(dir / "args.json");
    c.args = json::parse(f);
    EXPECT_EQ(c.args.at("kind"), "generate");
    const auto& q = c.at("query");
    EXPECT_EQ(q.shape.size(), 3u);
    c.B = q.shape[0], c.T = q.shape[1], c.E = q.shape[2];
    c.H = c.args.at("heads").get<std::size_t>(), c.Hkv = c.args.at("kv_heads").get<std::size_t>(), c.d = c.args.at("head_dim").get<std::size_t>();
    c.prompts = c.args.at("prompt_lengths").get<std::vector<std::size_t>>();
    c.steps = c.args.at("generated").get<std::size_t>();
    EXPECT_EQ(c.prompts.size(), c.B);
    EXPECT_EQ(*std::max_element(c.prompts.begin(), c.prompts.end()) + c.steps, c.T);
    c.rope.theta = c.args.at("rope_theta").get<float>();
    c.rope.dims = c.args.at("rope_dims").get<std::size_t>();
    EXPECT_TRUE(c.args.at("rope_style") == "half" || c.args.at("rope_style") == "interleaved");
    c.rope.style = c.args.at("rope_style") == "half" ? mha::RopeStyle::half : mha::RopeStyle::interleaved;
    EXPECT_EQ(c.at("q_proj_weight").shape, (std::vector<std::size_t>{c.H * c.d, c.E}));
    EXPECT_EQ(c.at("k_proj_weight").shape, (std::vector<std::size_t>{c.Hkv * c.d, c.E}));
    EXPECT_EQ(c.at("v_proj_weight").shape, (std::vector<std::size_t>{c.Hkv * c.d, c.E}));
    EXPECT_EQ(c.at("out_proj.weight").shape, (std::vector<std::size_t>{c.E, c.H * c.d}));
    EXPECT_EQ(c.at("expected_output").shape, (std::vector<std::size_t>{c.B, c.T, c.E}));
    EXPECT_EQ(c.at("present_key").shape, (std::vector<std::size_t>{c.B, c.Hkv, c.T, c.d}));
    EXPECT_EQ(c.at("present_value").shape, (std::vector<std::size_t>{c.B, c.Hkv, c.T, c.d}));
    // The bound: the whole causal pass over each sequence in double (an empty cache, Lq = its tokens).
    for (std::size_t b = 0; b < c.B; ++b) {
        const std::size_t n = c.tokens(b);
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(c.layer(), c.row("query", b, 0, c.E), 1, n, nullptr);
        std::vector<double> ot(n * c.E), kt(c.Hkv * n * c.d), vt(kt.size());
        for (std::size_t k = 0; k < ot.size(); ++k)
            ot[k] = mha_test::kDecoderSafety * ex.out_err[k] + mha_test::kU * std::abs(double(c.row("expected_output", b, 0, c.E)[k]));
        for (std::size_t h = 0; h < c.Hkv; ++h)
            for (std::size_t j = 0; j < n; ++j)
                for (std::size_t t = 0; t < c.d; ++t) {
                    const std::size_t at = (h * n + j) * c.d + t, src = ex.k.at(0, h, j, t);
                    const double pk = c.data("present_key")[((b * c.Hkv + h) * c.T + j) * c.d + t];
                    const double pv = c.data("present_value")[((b * c.Hkv + h) * c.T + j) * c.d + t];
                    kt[at] = mha_test::kDecoderSafety * ex.k.err[src] + mha_test::kU * std::abs(pk);
                    vt[at] = mha_test::kDecoderSafety * ex.v.err[src] + mha_test::kU * std::abs(pv);
                    // The saved cache is the double evaluation's (an independent check of the files' meaning).
                    EXPECT_NEAR(pk, ex.k.val[src], 1e-6 + 1e-6 * std::abs(pk));
                    EXPECT_NEAR(pv, ex.v.val[src], 1e-6 + 1e-6 * std::abs(pv));
                }
        c.out_tol.push_back(std::move(ot)), c.k_tol.push_back(std::move(kt)), c.v_tol.push_back(std::move(vt));
    }
    return c;
}

enum class Prefill { truncate, append };

// What one run produced: every sequence's output rows [tokens, E] and its final cache rows [Hkv, tokens, d].
struct Run {
    std::vector<std::vector<float>> out, keys, values;
};

Run generate(const Case& c, mha::Backend backend, Prefill how) {
    const mha::MultiheadAttention m = c.make();
    const std::size_t B = c.B, E = c.E, Pmax = *std::max_element(c.prompts.begin(), c.prompts.end());
    mha::ForwardOptions opt;
    opt.backend = backend;
    mha::KVCache cache(B, c.Hkv, c.d, c.T);
    Run r;
    for (std::size_t b = 0; b < B; ++b) r.out.emplace_back(c.tokens(b) * E, std::numeric_limits<float>::quiet_NaN());
    if (how == Prefill::truncate) {
        std::vector<float> out(B * Pmax * E);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(c.data("query"), B, Pmax, E, E, c.T * E);  // a shorter prompt is followed by its next rows
        m.forward(in, {mha::Batch(out.data(), B, Pmax, E)}, opt, cache);
        for (std::size_t b = 0; b < B; ++b) {
            cache.truncate(b, c.prompts[b]);
            std::copy_n(out.begin() + std::ptrdiff_t(b * Pmax * E), c.prompts[b] * E, r.out[b].begin());
        }
    } else {
        for (std::size_t b = 0; b < B; ++b) {
            mha::KVCache one(1, c.Hkv, c.d, c.prompts[b]);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(c.row("query", b, 0, E), 1, c.prompts[b], E);
            m.forward(in, {mha::Batch(r.out[b].data(), 1, c.prompts[b], E)}, opt, one);
            cache.append(b, one.keys(), one.values());  // capacity = the prompt: the views hold exactly its rows
        }
    }
    for (std::size_t b = 0; b < B; ++b) EXPECT_EQ(cache.length(b), c.prompts[b]);
    for (std::size_t t = 0; t < c.steps; ++t) {
        std::vector<float> x(B * E), y(B * E);
        for (std::size_t b = 0; b < B; ++b) std::copy_n(c.row("query", b, c.prompts[b] + t, E), E, x.begin() + std::ptrdiff_t(b * E));
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), B, 1, E);
        m.forward(in, {mha::Batch(y.data(), B, 1, E)}, opt, cache);
        for (std::size_t b = 0; b < B; ++b)
            std::copy_n(y.begin() + std::ptrdiff_t(b * E), E, r.out[b].begin() + std::ptrdiff_t((c.prompts[b] + t) * E));
    }
    for (std::size_t b = 0; b < B; ++b) {
        EXPECT_EQ(cache.length(b), c.tokens(b));
        std::vector<float> k, v;
        for (std::size_t h = 0; h < c.Hkv; ++h)
            for (std::size_t j = 0; j < cache.length(b); ++j) {
                k.insert(k.end(), cache.keys(b, h).row(j), cache.keys(b, h).row(j) + c.d);
                v.insert(v.end(), cache.values(b, h).row(j), cache.values(b, h).row(j) + c.d);
            }
        r.keys.push_back(std::move(k)), r.values.push_back(std::move(v));
    }
    return r;
}

// The saved rows of sequence b: outputs [tokens, E] and the cache [Hkv, tokens, d].
std::vector<float> expected_rows(const Case& c, const char* file, std::size_t b, bool cache_layout) {
    const std::size_t n = c.tokens(b);
    std::vector<float> e;
    if (!cache_layout) return std::vector<float>(c.row(file, b, 0, c.E), c.row(file, b, 0, c.E) + n * c.E);
    for (std::size_t h = 0; h < c.Hkv; ++h)
        e.insert(e.end(), c.data(file) + ((b * c.Hkv + h) * c.T) * c.d, c.data(file) + ((b * c.Hkv + h) * c.T + n) * c.d);
    return e;
}

void check(const Case& c, const Run& r) {
    double worst_out = 0, worst_cache = 0, bound_out = 0, bound_cache = 0;
    for (std::size_t b = 0; b < c.B; ++b) {
        SCOPED_TRACE(::testing::Message() << "sequence " << b << " (prompt " << c.prompts[b] << ")");
        const std::vector<float> out = expected_rows(c, "expected_output", b, false), k = expected_rows(c, "present_key", b, true),
                                 v = expected_rows(c, "present_value", b, true);
        const double max_out = mha_test::max_abs(out), max_tol = *std::max_element(c.out_tol[b].begin(), c.out_tol[b].end());
        EXPECT_LT(max_tol, 1e-3 * max_out) << "the bound is too loose to prove anything";
        EXPECT_TRUE(mha_test::all_within(r.out[b], out, c.out_tol[b])) << "outputs (prompt rows, then one row per step)";
        EXPECT_TRUE(mha_test::all_within(r.keys[b], k, c.k_tol[b])) << "cached keys (rotated) vs present_key";
        EXPECT_TRUE(mha_test::all_within(r.values[b], v, c.v_tol[b])) << "cached values vs present_value";
        worst_out = std::max(worst_out, mha_test::max_abs_diff(r.out[b], out));
        worst_cache = std::max({worst_cache, mha_test::max_abs_diff(r.keys[b], k), mha_test::max_abs_diff(r.values[b], v)});
        bound_out = std::max(bound_out, max_tol);
        bound_cache = std::max({bound_cache, *std::max_element(c.k_tol[b].begin(), c.k_tol[b].end()),
                                *std::max_element(c.v_tol[b].begin(), c.v_tol[b].end())});
    }
    ::testing::Test::RecordProperty("output_max_error", sci(worst_out));
    ::testing::Test::RecordProperty("output_max_bound", sci(bound_out));
    ::testing::Test::RecordProperty("cache_max_error", sci(worst_cache));
    ::testing::Test::RecordProperty("cache_max_bound", sci(bound_cache));
}

class KvCacheFixture : public testing::TestWithParam<std::string> {};

TEST_P(KvCacheFixture, GenerationMatchesPyTorch) {
    const Case c = load_case(GetParam());
    for (Prefill how : {Prefill::truncate, Prefill::append}) {
        SCOPED_TRACE(how == Prefill::truncate ? "prompts in one batch call, truncated" : "prompts alone, appended");
        {
            SCOPED_TRACE("scalar");
            check(c, generate(c, mha::Backend::scalar, how));
        }
        mha_test::for_each_cpu_isa([&](mha::Isa) { check(c, generate(c, mha::Backend::simd, how)); });
    }
}

INSTANTIATE_TEST_SUITE_P(KvCacheFixtures, KvCacheFixture, testing::ValuesIn(case_names()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KvCacheFixture);  // AllCasesPresent reports a missing folder

}  // namespace
