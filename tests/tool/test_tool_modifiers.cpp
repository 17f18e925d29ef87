// Tests of the score-modifier flags and files of the `mha` tool (issue 24): --window-left, --window-right,
// --softcap, --alibi, sinks.npy [H] and alibi_slopes.npy [H] in DIR, on `mha sdpa` (every case of
// tests/data/modifiers/, the model formulas' fixtures), `mha run` (a decoder layer, with and without a KV
// cache) and `mha bench`. Each runs the real binary (MHA_TOOL_PATH) in a fresh temporary folder:
//   - results: output.npy bitwise what the library gives when called here with the same modifiers (the
//     library itself is checked against the fixtures' float64 values in tests/test_score_modifiers.cpp);
//   - bad input: one line on stderr naming the problem, a nonzero exit code, no file written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <mha/mha.hpp>
#include <mha/sdpa.hpp>
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

class ModifierToolTest : public mha_tool_test::ToolDirTest {};

std::string num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", x);
    return buf;
}

TEST_F(ModifierToolTest, SdpaFixturesSameAsLibrary) {
    const fs::path root = fs::path(MHA_TEST_DATA_DIR) / "modifiers";
    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(root))
        if (fs::exists(e.path() / "args.json")) cases.push_back(e.path());
    ASSERT_EQ(cases.size(), 6u);
    for (const fs::path& c : cases) {
        SCOPED_TRACE(c.filename().string());
        for (const auto& e : fs::directory_iterator(dir_)) fs::remove(e.path());
        for (const char* f : {"q.npy", "k.npy", "v.npy", "sinks.npy", "alibi_slopes.npy"})
            if (fs::exists(c / f)) fs::copy_file(c / f, dir_ / f);
        std::ifstream in(c / "args.json");
        const nlohmann::json a = nlohmann::json::parse(in);
        const mha::npy::Array q = mha::npy::load((c / "q.npy").string()), k = mha::npy::load((c / "k.npy").string());
        const std::vector<float> v = mha::npy::load((c / "v.npy").string()).values;
        const std::size_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], d = q.shape[3], Hkv = k.shape[1], Lk = k.shape[2];
        std::vector<float> sinks, slopes;
        if (fs::exists(c / "sinks.npy")) sinks = mha::npy::load((c / "sinks.npy").string()).values;
        if (fs::exists(c / "alibi_slopes.npy")) slopes = mha::npy::load((c / "alibi_slopes.npy").string()).values;
        if (a["alibi"].get<bool>()) slopes = mha::alibi_standard_slopes(H);

        std::vector<std::string> args{"sdpa", "--npy", dir_.string(), "--threads", "2"};
        mha::SdpaOptions o;
        if (a["causal"].get<bool>()) args.push_back("--causal"), o.causal = true;
        if (a["causal_bottom_right"].get<bool>())
            args.push_back("--causal-bottom-right"), o.causal = true, o.causal_alignment = mha::CausalAlignment::bottom_right;
        o.modifiers.window_left = a["window_left"].get<long long>(), o.modifiers.window_right = a["window_right"].get<long long>();
        // Always given: -1 (unbounded) is a value the flags take, as the library and Python do.
        args.insert(args.end(), {"--window-left", std::to_string(o.modifiers.window_left)});
        args.insert(args.end(), {"--window-right", std::to_string(o.modifiers.window_right)});
        if (!a["softcap"].is_null()) o.modifiers.softcap = a["softcap"].get<float>(), args.insert(args.end(), {"--softcap", num(o.modifiers.softcap)});
        if (a["alibi"].get<bool>()) args.push_back("--alibi");
        o.modifiers.sinks = sinks.empty() ? nullptr : sinks.data();
        o.modifiers.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
        o.threads = 2;

        mha::SdpaInputs si;
        si.query = mha::ConstHeads::bhld(q.values.data(), B, H, Lq, d);
        si.key = mha::ConstHeads::bhld(k.values.data(), B, Hkv, Lk, d);
        si.value = mha::ConstHeads::bhld(v.data(), B, Hkv, Lk, d);
        std::vector<float> want(B * H * Lq * d);
        mha::scaled_dot_product_attention(si, mha::Heads::bhld(want.data(), B, H, Lq, d), o);

        const Result r = mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.err, "");
        const mha::npy::Array got = mha::npy::load((dir_ / "output.npy").string());
        EXPECT_EQ(got.shape, (Shape{B, H, Lq, d}));
        EXPECT_EQ(got.values, want);  // bitwise: the same code on the same floats
    }
}

// A decoder layer through `mha run`, one-shot causal and through the KV cache (--chunk), with every modifier.
TEST_F(ModifierToolTest, RunSameAsLibrary) {
    const std::size_t B = 2, L = 9, E = 32, H = 4, Hkv = 2, d = 8;
    std::mt19937 rng(5);
    const std::vector<float> x = random_floats(B * L * E, 1.0f, rng), wq = random_floats(H * d * E, 0.5f, rng),
                             wk = random_floats(Hkv * d * E, 0.5f, rng), wv = random_floats(Hkv * d * E, 0.5f, rng),
                             wo = random_floats(E * H * d, 0.3f, rng), sinks = random_floats(H, 1.0f, rng);
    save(dir_ / "query.npy", x, {B, L, E});
    save(dir_ / "q_proj_weight.npy", wq, {H * d, E});
    save(dir_ / "k_proj_weight.npy", wk, {Hkv * d, E});
    save(dir_ / "v_proj_weight.npy", wv, {Hkv * d, E});
    save(dir_ / "out_proj.weight.npy", wo, {E, H * d});
    save(dir_ / "sinks.npy", sinks, {H});
    const std::vector<float> slopes = mha::alibi_standard_slopes(H);
    mha::AttentionWeights w;
    w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
    mha::AttentionConfig cfg;
    cfg.embed_dim = E, cfg.num_heads = H, cfg.num_kv_heads = Hkv, cfg.head_dim = d, cfg.rope = mha::RopeConfig{};
    cfg.modifiers.window_left = 3, cfg.modifiers.softcap = 5.0f, cfg.modifiers.sinks = sinks.data(), cfg.modifiers.alibi_slopes = slopes.data();
    const mha::MultiheadAttention layer(w, cfg);
    for (const bool chunked : {false, true}) {
        SCOPED_TRACE(chunked ? "chunked" : "one-shot");
        std::vector<float> want(x.size());
        mha::AttentionInputs in;
        mha::ForwardOptions fo;
        fo.threads = 2;
        if (chunked) {  // 4 tokens, then 5, through a cache
            mha::KVCache cache(B, Hkv, d, L);
            for (std::size_t s0 : {std::size_t(0), std::size_t(4)}) {
                const std::size_t n = s0 == 0 ? 4 : L - 4;
                in.query = mha::ConstBatch(x.data() + s0 * E, B, n, E, E, L * E);
                layer.forward(in, {mha::Batch(want.data() + s0 * E, B, n, E, E, L * E)}, fo, cache);
            }
        } else {
            fo.causal = true;
            in.query = mha::ConstBatch(x.data(), B, L, E);
            layer.forward(in, {mha::Batch(want.data(), B, L, E)}, fo);
        }
        std::vector<std::string> args{"run", "--npy", dir_.string(), "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                                      "--rope-theta", "10000", "--threads", "2", "--window-left", "3", "--softcap", "5", "--alibi"};
        if (chunked)
            args.insert(args.end(), {"--chunk", "4"});
        else
            args.push_back("--causal");
        const Result r = mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(mha::npy::load((dir_ / "output.npy").string()).values, want);
        for (const char* f : {"output.npy", "present_key.npy", "present_value.npy"}) fs::remove(dir_ / f);
    }
}

TEST_F(ModifierToolTest, BadModifiersRefused) {
    std::mt19937 rng(2);
    save(dir_ / "q.npy", random_floats(1 * 4 * 3 * 8, 1.0f, rng), {1, 4, 3, 8});
    save(dir_ / "k.npy", random_floats(1 * 2 * 5 * 8, 1.0f, rng), {1, 2, 5, 8});
    save(dir_ / "v.npy", random_floats(1 * 2 * 5 * 8, 1.0f, rng), {1, 2, 5, 8});
    const std::vector<std::string> base{"sdpa", "--npy", dir_.string()};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    expect_failure_with(with({"--window-left", "-2"}), {"--window-left"});
    expect_failure_with(with({"--softcap", "0"}), {"--softcap"});
    expect_failure_with(with({"--softcap", "nan"}), {"--softcap"});
    save(dir_ / "sinks.npy", random_floats(3, 1.0f, rng), {3});
    expect_failure_with(base, {"sinks.npy", "[3]", "[4]"});
    std::vector<float> bad(4, 0.0f);
    bad[1] = INFINITY;
    save(dir_ / "sinks.npy", bad, {4});
    expect_failure_with(base, {"sinks"});
    fs::remove(dir_ / "sinks.npy");
    save(dir_ / "alibi_slopes.npy", random_floats(4, 1.0f, rng), {4});
    expect_failure_with(with({"--alibi"}), {"--alibi", "alibi_slopes.npy"});
    fs::remove(dir_ / "alibi_slopes.npy");
    EXPECT_EQ(mha_tool_test::listing(dir_), (std::set<std::string>{"q.npy", "k.npy", "v.npy"}));
}

TEST_F(ModifierToolTest, BenchReportsTheModifiers) {
    const Result r = mha({"bench", "--op", "sdpa", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--seq",
                          "64", "--causal", "--window-left", "7", "--softcap", "30", "--alibi", "--sinks", "--reps", "1", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["window_left"], 7);
    EXPECT_EQ(j["window_right"], -1);
    EXPECT_EQ(j["softcap"], 30.0);
    EXPECT_EQ(j["alibi"], true);
    EXPECT_EQ(j["sinks"], true);
    EXPECT_EQ(j["flops_counted"], "visible pairs");
    // Visible pairs: query i sees min(i + 1, 8) keys: 4·1·4·16·(36 + 56·8) flops.
    EXPECT_NEAR(j["gflops"].get<double>() * j["ms_median"].get<double>() * 1e6, 4.0 * 4 * 16 * (36 + 56 * 8), 1e-3 * 4.0 * 4 * 16 * 484);
    for (const char* op : {"decode", "step", "attention"}) {
        const Result o = mha({"bench", "--op", op, "--embed", "64", "--heads", "4", "--kv-heads", "2", "--kv-seq", "40",
                              "--window-left", "7", "--softcap", "30", "--alibi", "--sinks", "--reps", "1", "--json"});
        ASSERT_EQ(o.exit_code, 0) << op << ": " << o.err;
        EXPECT_EQ(nlohmann::json::parse(o.out)["window_left"], 7) << op;
    }
    const Result g = mha({"bench", "--op", "gemm", "--softcap", "3", "--reps", "1"});
    EXPECT_NE(g.exit_code, 0);
    EXPECT_NE(g.err.find("--softcap"), std::string::npos) << g.err;
}

}  // namespace
