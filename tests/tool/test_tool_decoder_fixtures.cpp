// The `mha` tool end to end against PyTorch: every decoder fixture of tests/data/decoder (float64 torch
// outputs, tools/make_fixtures.py) run through `mha run` (kind "layer": separate q/k/v weight files,
// --kv-heads, --head-dim, --rope-*, --position-offset, --causal / --causal-bottom-right) or `mha sdpa`
// (kind "sdpa": q/k/v.npy, --scale, --causal / --causal-bottom-right), both backends. The fixture with
// per-sequence positions has no tool flag (the library's ForwardOptions::positions) and is left to
// tests/test_pytorch_decoder_fixtures.cpp. Bound: 1e-5 of the largest expected value (the library-level
// fixture test derives per-element bounds; measured errors there are ~1e-7 relative).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../compare_util.hpp"
#include "npy.hpp"
#include "tool_process.hpp"

namespace {

using namespace mha_tool_test;

class DecoderFixtureTool : public ToolDirTest {};

std::string number(double v) {
    char s[64];
    std::snprintf(s, sizeof s, "%.17g", v);
    return s;
}

TEST_F(DecoderFixtureTool, EveryFixtureThroughTheTool) {
    const fs::path data = fs::path(MHA_TEST_DATA_DIR) / "decoder";
    std::vector<fs::path> cases;
    for (const auto& e : fs::directory_iterator(data))
        if (fs::exists(e.path() / "args.json")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    ASSERT_GE(cases.size(), 9u) << "decoder fixtures missing in " << data;
    int checked = 0, skipped = 0;
    for (const fs::path& c : cases) {
        SCOPED_TRACE(c.filename().string());
        const nlohmann::json a = nlohmann::json::parse(read_text(c / "args.json"));
        if (a.contains("positions") && !a["positions"].is_null()) {
            ++skipped;  // per-sequence starts: a library option only
            continue;
        }
        const bool sdpa = a.at("kind") == "sdpa";
        for (const char* backend : {"scalar", "simd"}) {
            SCOPED_TRACE(backend);
            const fs::path out = base_ / (c.filename().string() + "_" + backend + ".npy");
            std::vector<std::string> argv{sdpa ? "sdpa" : "run", "--npy", c.string(), "--backend", backend, "--out", out.string()};
            if (a.value("causal_bottom_right", false))
                argv.push_back("--causal-bottom-right");
            else if (a.value("causal", false))
                argv.push_back("--causal");
            if (sdpa) {
                if (a.contains("scale") && !a["scale"].is_null()) argv.insert(argv.end(), {"--scale", number(a["scale"].get<double>())});
            } else {
                argv.insert(argv.end(), {"--heads", std::to_string(a.at("heads").get<int>()), "--kv-heads",
                                         std::to_string(a.at("kv_heads").get<int>()), "--head-dim",
                                         std::to_string(a.at("head_dim").get<int>())});
                if (!a.at("rope_theta").is_null()) {
                    argv.insert(argv.end(), {"--rope-theta", number(a["rope_theta"].get<double>()), "--rope-style",
                                             a.at("rope_style").get<std::string>(), "--rope-dims",
                                             std::to_string(a.at("rope_dims").get<int>()), "--position-offset",
                                             std::to_string(a.at("position_offset").get<long long>())});
                }
                if (!a.at("norm_eps").is_null()) argv.insert(argv.end(), {"--norm-eps", number(a["norm_eps"].get<double>())});
            }
            const Result r = mha(argv);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            const mha::npy::Array got = mha::npy::load(out.string());
            const mha::npy::Array want = mha::npy::load((c / "expected_output.npy").string());
            EXPECT_EQ(got.shape, want.shape);
            EXPECT_LE(mha_test::max_abs_diff(got.values, want.values), 1e-5 * mha_test::max_abs(want.values));
            ++checked;
        }
    }
    EXPECT_EQ(checked, 2 * static_cast<int>(cases.size() - skipped));
    EXPECT_EQ(skipped, 1);
}

}  // namespace
