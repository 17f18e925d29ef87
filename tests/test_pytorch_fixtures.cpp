// mha::MultiheadAttention against torch.nn.MultiheadAttention (and seed 000's SelfAttention module):
// the float64 outputs of PyTorch saved by tools/make_fixtures.py in tests/data/<case>/ (see the
// README there). Every case runs with Backend::scalar and Backend::simd and must satisfy
// max|got − expected| / max|expected| ≤ 1e-5 for the output and the attention weights. The inputs
// are the float32 values PyTorch saw (in float64), so the difference is the library's float32
// rounding: about 1e-7 relative here, well inside 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mha/mha.hpp>
#include "compare_util.hpp"
#include "npy.hpp"

namespace {

namespace fs = std::filesystem;
using mha::Backend;

constexpr std::size_t kExpectedCases = 10;  // tools/make_fixtures.py writes this many
constexpr double kMaxRelativeError = 1e-5;

std::vector<std::string> case_names() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(MHA_TEST_DATA_DIR, ec))
        // A case is a folder with args.json; tests/data/decoder holds test_pytorch_decoder_fixtures.cpp's.
        if (entry.is_directory() && fs::exists(entry.path() / "args.json"))
            names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(PyTorchFixtures, AllCasesPresent) {
    const auto names = case_names();
    EXPECT_EQ(names.size(), kExpectedCases) << "tests/data should hold " << kExpectedCases << " case folders";
    for (const char* name : {"no_mask", "key_padding_bool", "key_padding_float", "attn_mask_bool_2d",
                             "attn_mask_float_3d", "causal", "cross_attention", "need_weights_averaged",
                             "need_weights_per_head", "seed000_self_attention"})
        EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name << " is missing";
}

// One case folder, loaded.
struct Case {
    mha::npy::Array query, key, value, in_w, in_b, out_w, out_b, norm_w, norm_b, kpm, am, expected, expected_w;
    bool has_key = false, has_value = false, has_norm_w = false, has_norm_b = false, has_kpm = false, has_am = false,
         has_w = false;
    std::size_t heads = 0;
    bool causal = false;
    mha::NeedWeights need_weights = mha::NeedWeights::none;
    std::optional<float> norm_eps;
};

Case load_case(const std::string& name) {
    const fs::path dir = fs::path(MHA_TEST_DATA_DIR) / name;
    Case c;
    auto load = [&](const char* file, mha::npy::Array& a, bool* present) {
        const fs::path p = dir / file;
        if (present) {
            *present = fs::exists(p);
            if (!*present) return;
        }
        a = mha::npy::load(p.string());
    };
    load("query.npy", c.query, nullptr);
    load("key.npy", c.key, &c.has_key);
    load("value.npy", c.value, &c.has_value);
    load("in_proj_weight.npy", c.in_w, nullptr);
    load("in_proj_bias.npy", c.in_b, nullptr);
    load("out_proj.weight.npy", c.out_w, nullptr);
    load("out_proj.bias.npy", c.out_b, nullptr);
    load("norm.weight.npy", c.norm_w, &c.has_norm_w);
    load("norm.bias.npy", c.norm_b, &c.has_norm_b);
    load("key_padding_mask.npy", c.kpm, &c.has_kpm);
    load("attn_mask.npy", c.am, &c.has_am);
    load("expected_output.npy", c.expected, nullptr);
    load("expected_attn_weights.npy", c.expected_w, &c.has_w);

    std::ifstream f(dir / "args.json");
    const auto args = nlohmann::json::parse(f);
    c.heads = args.at("heads").get<std::size_t>();
    c.causal = args.at("causal").get<bool>();
    const auto nw = args.at("need_weights").get<std::string>();
    c.need_weights = nw == "averaged" ? mha::NeedWeights::averaged
                     : nw == "per_head" ? mha::NeedWeights::per_head
                                        : mha::NeedWeights::none;
    if (!args.at("norm_eps").is_null()) c.norm_eps = args.at("norm_eps").get<float>();
    return c;
}

mha::MaskView mask_view(const mha::npy::Array& a) {
    const bool boolean = a.dtype == mha::npy::DType::boolean || a.dtype == mha::npy::DType::uint8;
    mha::MaskView m;
    m.type = boolean ? mha::MaskType::boolean : mha::MaskType::additive;
    m.bools = boolean ? a.bytes.data() : nullptr;
    m.values = boolean ? nullptr : a.values.data();
    m.rank = int(a.shape.size());
    for (std::size_t i = 0; i < a.shape.size() && i < 3; ++i) m.shape[i] = a.shape[i];
    return m;
}

std::string sci(double v) {
    std::ostringstream s;
    s << std::scientific << v;
    return s.str();
}

// max|got − expected| / max|expected|: tests/compare_util.hpp. NaN (failing EXPECT_LE) on a size
// mismatch or if anything on either side is NaN or inf; this file's own version checked only `got`
// and read past a shorter `expected`.
using mha_test::max_relative_error;

struct FixtureParam {
    std::string name;
    Backend backend;
};

class PyTorchFixture : public testing::TestWithParam<FixtureParam> {};

TEST_P(PyTorchFixture, MatchesPyTorch) {
    const Case c = load_case(GetParam().name);
    ASSERT_EQ(c.query.shape.size(), 3u);
    const std::size_t B = c.query.shape[0], Lq = c.query.shape[1], E = c.query.shape[2], H = c.heads;
    const std::size_t Lk = c.has_key ? c.key.shape[1] : Lq;
    ASSERT_EQ(c.in_w.shape, (std::vector<std::size_t>{3 * E, E}));
    ASSERT_EQ(c.out_w.shape, (std::vector<std::size_t>{E, E}));
    ASSERT_EQ(c.expected.shape, (std::vector<std::size_t>{B, Lq, E}));
    ASSERT_EQ(c.has_w, c.need_weights != mha::NeedWeights::none);

    mha::AttentionWeights w;
    w.in_proj_weight = c.in_w.values.data();
    w.in_proj_bias = c.in_b.values.data();
    w.out_proj_weight = c.out_w.values.data();
    w.out_proj_bias = c.out_b.values.data();
    w.norm_weight = c.has_norm_w ? c.norm_w.values.data() : nullptr;
    w.norm_bias = c.has_norm_b ? c.norm_b.values.data() : nullptr;
    const mha::MultiheadAttention attention(w, E, H);

    mha::AttentionInputs in;
    in.query = mha::ConstBatch(c.query.values.data(), B, Lq, E);
    if (c.has_key) in.key = mha::ConstBatch(c.key.values.data(), B, Lk, E);
    if (c.has_value) in.value = mha::ConstBatch(c.value.values.data(), B, Lk, E);
    if (c.has_kpm) in.key_padding_mask = mask_view(c.kpm);
    if (c.has_am) in.attn_mask = mask_view(c.am);

    std::vector<float> output(B * Lq * E, NAN), weights(c.has_w ? c.expected_w.size() : 0, NAN);
    mha::ForwardOptions opt;
    opt.backend = GetParam().backend;
    opt.causal = c.causal;
    opt.need_weights = c.need_weights;
    opt.norm_eps = c.norm_eps;
    attention.forward(in, {mha::Batch(output.data(), B, Lq, E), c.has_w ? weights.data() : nullptr}, opt);

    const double out_err = max_relative_error(output, c.expected.values);
    EXPECT_LE(out_err, kMaxRelativeError) << "output";
    RecordProperty("output_max_relative_error", sci(out_err));
    if (c.has_w) {
        const std::vector<std::size_t> shape =
            c.need_weights == mha::NeedWeights::averaged ? std::vector<std::size_t>{B, Lq, Lk}
                                                         : std::vector<std::size_t>{B, H, Lq, Lk};
        ASSERT_EQ(c.expected_w.shape, shape);
        const double w_err = max_relative_error(weights, c.expected_w.values);
        EXPECT_LE(w_err, kMaxRelativeError) << "attention weights";
        RecordProperty("weights_max_relative_error", sci(w_err));
    }
}

std::vector<FixtureParam> fixture_params() {
    std::vector<FixtureParam> params;
    for (const auto& name : case_names())
        for (Backend b : {Backend::scalar, Backend::simd}) params.push_back({name, b});
    return params;
}

INSTANTIATE_TEST_SUITE_P(PyTorch, PyTorchFixture, testing::ValuesIn(fixture_params()),
                         [](const testing::TestParamInfo<FixtureParam>& info) {
                             return info.param.name + (info.param.backend == Backend::scalar ? "_scalar" : "_simd");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PyTorchFixture);  // AllCasesPresent reports a missing folder

}  // namespace
