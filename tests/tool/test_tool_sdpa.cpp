// Tests of `mha sdpa` (mha::scaled_dot_product_attention on q.npy [B, H, Lq, d], k.npy / v.npy
// [B, Hkv, Lk, d] and the optional masks). Each runs the real binary (MHA_TOOL_PATH) in a fresh temporary
// folder:
//   - results: output.npy [B, H, Lq, d] must be bitwise what the library gives when called here on the same
//     arrays with the same options, for each backend: grouped-query and multi-query heads, top-left and
//     bottom-right causal (Lq < Lk), bool/uint8/float masks of each shape, --scale, --impl;
//   - bad input: exactly one line on stderr naming the files and both values, a nonzero exit code, no file.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <mha/mha.hpp>
#include <mha/sdpa.hpp>

#include "npy.hpp"
#include "tool_files.hpp"
#include "tool_process.hpp"

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;
using mha_tool_test::Result;

using mha_tool_test::random_floats;
using mha_tool_test::save;

enum class Causal { none, top_left, bottom_right };
enum class Masks { none, bool_kpm_float_2d, float_kpm_uint8_3d, float_3d };

struct SdpaCase {
    const char* name = "";
    std::size_t B = 2, H = 4, Hkv = 2, Lq = 5, Lk = 7, d = 8;
    Causal causal = Causal::none;
    Masks masks = Masks::none;
    std::optional<float> scale = std::nullopt;
    const char* impl = nullptr;  // --impl (nullptr: flag absent)
};

// gtest prints a parameter in test names and failures: its name, not its bytes.
void PrintTo(const SdpaCase& c, std::ostream* os) { *os << c.name; }

class SdpaToolTest : public mha_tool_test::ToolDirTest {};
class SdpaVsLibrary : public SdpaToolTest, public ::testing::WithParamInterface<SdpaCase> {};

TEST_P(SdpaVsLibrary, SameAsLibrary) {
    const SdpaCase c = GetParam();
    const std::size_t B = c.B, H = c.H, Hkv = c.Hkv, Lq = c.Lq, Lk = c.Lk, d = c.d;
    std::mt19937 rng(99);
    const std::vector<float> q = random_floats(B * H * Lq * d, 1.0f, rng);
    const std::vector<float> k = random_floats(B * Hkv * Lk * d, 1.0f, rng);
    const std::vector<float> v = random_floats(B * Hkv * Lk * d, 1.0f, rng);
    save(dir_ / "q.npy", q, {B, H, Lq, d});
    save(dir_ / "k.npy", k, {B, Hkv, Lk, d});
    save(dir_ / "v.npy", v, {B, Hkv, Lk, d});
    // Masks: key 0 padded in batch 0, the last key in the others; attn_mask entries with (index % 5 == 2)
    // masked, never a whole row (key 1 stays open), or random floats.
    std::vector<std::uint8_t> kpm_bool(B * Lk, 0);
    kpm_bool[0] = 1;
    for (std::size_t b = 1; b < B; ++b) kpm_bool[b * Lk + Lk - 1] = 1;
    std::vector<float> kpm_float(B * Lk);
    for (std::size_t i = 0; i < kpm_float.size(); ++i) kpm_float[i] = kpm_bool[i] ? -1e4f : 0.5f * float(i % 3);
    std::vector<std::uint8_t> am_bool(B * H * Lq * Lk);
    for (std::size_t i = 0; i < am_bool.size(); ++i) am_bool[i] = i % 5 == 2 && i % Lk != 1;
    const std::vector<float> am_float = random_floats(B * H * Lq * Lk, 2.0f, rng);

    mha::SdpaInputs in;
    in.query = mha::ConstHeads::bhld(q.data(), B, H, Lq, d);
    in.key = mha::ConstHeads::bhld(k.data(), B, Hkv, Lk, d);
    in.value = mha::ConstHeads::bhld(v.data(), B, Hkv, Lk, d);
    switch (c.masks) {
        case Masks::none: break;
        case Masks::bool_kpm_float_2d:
            mha_tool_test::write_bytes_npy(dir_ / "key_padding_mask.npy", kpm_bool, {B, Lk});
            save(dir_ / "attn_mask.npy", am_float, {Lq, Lk});
            in.key_padding_mask = mha::MaskView::boolean(kpm_bool.data(), B, Lk);
            in.attn_mask = mha::MaskView::additive(am_float.data(), Lq, Lk);
            break;
        case Masks::float_kpm_uint8_3d:
            save(dir_ / "key_padding_mask.npy", kpm_float, {B, Lk});
            mha_tool_test::write_bytes_npy(dir_ / "attn_mask.npy", am_bool, {B * H, Lq, Lk}, "|u1");
            in.key_padding_mask = mha::MaskView::additive(kpm_float.data(), B, Lk);
            in.attn_mask = mha::MaskView::boolean(am_bool.data(), B * H, Lq, Lk);
            break;
        case Masks::float_3d:
            save(dir_ / "attn_mask.npy", am_float, {B * H, Lq, Lk});
            in.attn_mask = mha::MaskView::additive(am_float.data(), B * H, Lq, Lk);
            break;
    }
    mha::SdpaOptions so;
    so.causal = c.causal != Causal::none;
    so.causal_alignment = c.causal == Causal::bottom_right ? mha::CausalAlignment::bottom_right : mha::CausalAlignment::top_left;
    so.scale = c.scale;
    if (c.impl) so.impl = std::string(c.impl) == "fused" ? mha::Impl::fused : mha::Impl::materialized;

    for (const mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd}) {
        const std::string name = backend == mha::Backend::scalar ? "scalar" : "simd";
        SCOPED_TRACE(name);
        so.backend = backend;
        std::vector<float> want(q.size());
        mha::scaled_dot_product_attention(in, mha::Heads::bhld(want.data(), B, H, Lq, d), so);

        std::vector<std::string> args{"sdpa", "--npy", dir_.string(), "--backend", name, "--threads", "2"};
        if (c.causal == Causal::top_left) args.push_back("--causal");
        if (c.causal == Causal::bottom_right) args.push_back("--causal-bottom-right");
        if (c.scale) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.9g", double(*c.scale));
            args.insert(args.end(), {"--scale", buf});
        }
        if (c.impl) args.insert(args.end(), {"--impl", c.impl});
        fs::remove(dir_ / "output.npy");
        const Result r = mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(r.err, "");
        const mha::npy::Array got = mha::npy::load((dir_ / "output.npy").string());
        EXPECT_EQ(got.dtype, mha::npy::DType::float32);
        EXPECT_EQ(got.shape, (Shape{B, H, Lq, d}));
        EXPECT_EQ(got.values, want);  // bitwise: the same code on the same floats
    }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SdpaVsLibrary,
    ::testing::Values(SdpaCase{.name = "gqa"},
                      SdpaCase{.name = "mha_heads", .Hkv = 4, .Lk = 5},
                      // Multi-query, bottom-right causal with Lq < Lk (new tokens at the end).
                      SdpaCase{.name = "mqa_bottom_right", .Hkv = 1, .Lq = 3, .Lk = 9, .causal = Causal::bottom_right},
                      SdpaCase{.name = "bottom_right_masks", .Lq = 2, .Lk = 6, .causal = Causal::bottom_right,
                               .masks = Masks::float_kpm_uint8_3d},
                      SdpaCase{.name = "top_left", .Lq = 6, .Lk = 6, .causal = Causal::top_left},
                      SdpaCase{.name = "top_left_lq_above_lk", .Lq = 6, .Lk = 4, .causal = Causal::top_left},
                      SdpaCase{.name = "bool_kpm_float_mask", .masks = Masks::bool_kpm_float_2d},
                      SdpaCase{.name = "float_mask_3d_fused", .B = 1, .H = 6, .Hkv = 3, .Lq = 33, .Lk = 70, .d = 16,
                               .masks = Masks::float_3d, .impl = "fused"},
                      SdpaCase{.name = "scale_materialized", .scale = 0.3f, .impl = "materialized"}),
    [](const ::testing::TestParamInfo<SdpaCase>& i) { return std::string(i.param.name); });

TEST_F(SdpaToolTest, WritesToOut) {
    std::mt19937 rng(1);
    save(dir_ / "q.npy", random_floats(2 * 3 * 4, 1.0f, rng), {1, 2, 3, 4});
    save(dir_ / "k.npy", random_floats(1 * 5 * 4, 1.0f, rng), {1, 1, 5, 4});
    save(dir_ / "v.npy", random_floats(1 * 5 * 4, 1.0f, rng), {1, 1, 5, 4});
    const fs::path out = base_ / "result.npy";
    const Result r = mha({"sdpa", "--npy", dir_.string(), "--out", out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(mha::npy::load(out.string()).shape, (Shape{1, 2, 3, 4}));
    EXPECT_FALSE(fs::exists(dir_ / "output.npy"));
    EXPECT_EQ(mha_tool_test::listing(dir_), (std::set<std::string>{"q.npy", "k.npy", "v.npy"}));
}

TEST_F(SdpaToolTest, Help) {
    const Result top = mha({"--help"});
    EXPECT_NE(top.out.find("sdpa"), std::string::npos) << top.out;
    const Result r = mha({"sdpa", "--help"});
    EXPECT_EQ(r.exit_code, 0);
    for (const char* text : {"--causal-bottom-right", "--scale", "q.npy", "k.npy", "v.npy", "--out"})
        EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing in\n" << r.out;
}

// --- bad input -----------------------------------------------------------------------------------

class SdpaErrors : public SdpaToolTest {
protected:
    // A valid case: q [2, 4, 3, 8], k and v [2, 2, 5, 8].
    void write_case() {
        std::mt19937 rng(2);
        save(dir_ / "q.npy", random_floats(2 * 4 * 3 * 8, 1.0f, rng), {2, 4, 3, 8});
        save(dir_ / "k.npy", random_floats(2 * 2 * 5 * 8, 1.0f, rng), {2, 2, 5, 8});
        save(dir_ / "v.npy", random_floats(2 * 2 * 5 * 8, 1.0f, rng), {2, 2, 5, 8});
    }
    void expect_sdpa_failure(const std::vector<std::string>& needles, std::vector<std::string> extra = {}) {
        std::vector<std::string> args{"sdpa", "--npy", dir_.string()};
        args.insert(args.end(), extra.begin(), extra.end());
        expect_failure_with(args, needles);
    }
};

TEST_F(SdpaErrors, ValidCaseRuns) {
    write_case();
    const Result r = mha({"sdpa", "--npy", dir_.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(SdpaErrors, MissingFiles) {
    for (const char* file : {"q.npy", "k.npy", "v.npy"}) {
        SCOPED_TRACE(file);
        write_case();
        fs::remove(dir_ / file);
        expect_sdpa_failure({std::string(file) + ": required input is missing"});
    }
}

TEST_F(SdpaErrors, WrongRank) {
    write_case();
    save(dir_ / "q.npy", std::vector<float>(4 * 3 * 8, 0.0f), {4, 3, 8});
    expect_sdpa_failure({"q.npy has shape [4, 3, 8] but must be [B, H, Lq, d]"});
    write_case();
    save(dir_ / "k.npy", std::vector<float>(2 * 2 * 5 * 8, 0.0f), {2, 2, 5, 8, 1});
    expect_sdpa_failure({"k.npy has shape [2, 2, 5, 8, 1] but must be [B, Hkv, Lk, d]"});
}

TEST_F(SdpaErrors, KeyDisagreesWithQuery) {
    write_case();
    save(dir_ / "k.npy", std::vector<float>(3 * 2 * 5 * 8, 0.0f), {3, 2, 5, 8});
    save(dir_ / "v.npy", std::vector<float>(3 * 2 * 5 * 8, 0.0f), {3, 2, 5, 8});
    expect_sdpa_failure({"k.npy has batch 3 but q.npy has batch 2", "q.npy [2, 4, 3, 8]", "k.npy [3, 2, 5, 8]"});
    write_case();
    save(dir_ / "k.npy", std::vector<float>(2 * 2 * 5 * 6, 0.0f), {2, 2, 5, 6});
    expect_sdpa_failure({"k.npy has head dim 6 but q.npy has head dim 8"});
    write_case();
    save(dir_ / "k.npy", std::vector<float>(2 * 3 * 5 * 8, 0.0f), {2, 3, 5, 8});
    save(dir_ / "v.npy", std::vector<float>(2 * 3 * 5 * 8, 0.0f), {2, 3, 5, 8});
    expect_sdpa_failure({"q.npy has 4 heads, not a multiple of k.npy's 3 heads"});
}

TEST_F(SdpaErrors, ValueDisagreesWithKey) {
    write_case();
    save(dir_ / "v.npy", std::vector<float>(2 * 2 * 6 * 8, 0.0f), {2, 2, 6, 8});
    expect_sdpa_failure({"v.npy has shape [2, 2, 6, 8] but k.npy has shape [2, 2, 5, 8]"});
}

TEST_F(SdpaErrors, MaskShapes) {
    write_case();
    mha_tool_test::write_bytes_npy(dir_ / "key_padding_mask.npy", std::vector<std::uint8_t>(2 * 3, 0), {2, 3});
    expect_sdpa_failure({"key_padding_mask.npy has shape [2, 3] but must be [B, Lk] = [2, 5]"});
    write_case();
    fs::remove(dir_ / "key_padding_mask.npy");
    save(dir_ / "attn_mask.npy", std::vector<float>(5 * 3, 0.0f), {5, 3});
    expect_sdpa_failure({"attn_mask.npy has shape [5, 3] but must be [Lq, Lk] = [3, 5] or [B·H, Lq, Lk] = [2·4, 3, 5]"});
    // [B·Hkv, Lq, Lk] is not a shape SDPA takes: the mask is per query head.
    mha_tool_test::write_bytes_npy(dir_ / "attn_mask.npy", std::vector<std::uint8_t>(4 * 3 * 5, 0), {4, 3, 5});
    expect_sdpa_failure({"attn_mask.npy has shape [4, 3, 5]"});
}

TEST_F(SdpaErrors, KeyPaddingMaskRank) {
    write_case();
    mha_tool_test::write_bytes_npy(dir_ / "key_padding_mask.npy", std::vector<std::uint8_t>(2 * 5 * 4, 0), {2, 5, 4});
    expect_sdpa_failure({"key_padding_mask.npy has shape [2, 5, 4] but must be [B, Lk] = [2, 5]"});
}

TEST_F(SdpaErrors, BoolWhereFloatIsNeeded) {
    write_case();
    mha_tool_test::write_bytes_npy(dir_ / "v.npy", std::vector<std::uint8_t>(2 * 2 * 5 * 8, 0), {2, 2, 5, 8});
    expect_sdpa_failure({"v.npy has dtype bool but must be float32 or float64"});
}

TEST_F(SdpaErrors, CausalFlagsAreExclusive) {
    write_case();
    expect_sdpa_failure({"excludes"}, {"--causal", "--causal-bottom-right"});
}

TEST_F(SdpaErrors, BadFlags) {
    write_case();
    expect_sdpa_failure({"--frobnicate"}, {"--frobnicate"});
    expect_sdpa_failure({"--backend"}, {"--backend", "avx"});
    expect_sdpa_failure({"--scale"}, {"--scale", "big"});
    expect_sdpa_failure({"--heads"}, {"--heads", "2"});  // a run flag
    expect_failure_with({"sdpa"}, {"--npy is required"});
    expect_failure_with({"sdpa", "--npy", (dir_ / "nowhere").string()}, {"not a folder"});
    expect_sdpa_failure({"does not exist"}, {"--out", (base_ / "no" / "such" / "out.npy").string()});
}

TEST_F(SdpaErrors, NonFiniteScaleIsRefusedByTheLibrary) {
    write_case();
    expect_sdpa_failure({"scale"}, {"--scale", "inf"});
}

}  // namespace
