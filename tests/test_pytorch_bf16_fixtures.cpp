// bf16 compute against PyTorch's own bf16 CPU forward (issue 14's criterion), on the fixtures of
// tests/data/bf16/<case>/ (tools/make_fixtures.py, write_bf16_cases; tests/data/README.md): inputs and
// weights are bfloat16 values (stored as float32), expected_output.npy is the float64 oracle on them and
// torch_bf16_output.npy PyTorch's bf16 result. For each case, with AttentionConfig::compute = bf16:
//   max|ours − oracle| <= 1.5 × max|torch bf16 − oracle|   (the SIMD backend on every ISA of this CPU and
//                                                          every impl, and the scalar reference)
//   |ours − oracle| <= λ·σ per element                     (docs/bf16-accuracy.md, tests/bf16_test_util.hpp)
// The torch error is recomputed from the files and must equal args.json's "torch_bf16_max_abs_error".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mha/mha.hpp>

#include "bf16_test_util.hpp"
#include "compare_util.hpp"
#include "npy.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kDir = fs::path(MHA_TEST_DATA_DIR) / "bf16";
const std::vector<std::string> kCases = {"bert_self_masks", "cross_kdim_vdim", "llama_gqa_rope"};
constexpr double kTorchFactor = 1.5;

struct Case {
    std::map<std::string, mha::npy::Array> files;
    json args;
    bool has(const std::string& n) const { return files.count(n) != 0; }
    const std::vector<float>& f(const std::string& n) const { return files.at(n).values; }
};

Case load(const std::string& name) {
    Case c;
    for (const auto& e : fs::directory_iterator(kDir / name))
        if (e.path().extension() == ".npy") c.files[e.path().stem().string()] = mha::npy::load(e.path().string());
    std::ifstream in(kDir / name / "args.json");
    c.args = json::parse(in);
    return c;
}

TEST(PytorchBf16Fixtures, AllCasesPresent) {
    for (const auto& name : kCases) EXPECT_TRUE(fs::exists(kDir / name / "args.json")) << name;
}

TEST(PytorchBf16Fixtures, NoWorseThanTorchBf16) {
    for (const auto& name : kCases) {
        SCOPED_TRACE(name);
        const Case c = load(name);
        const auto& qs = c.files.at("query").shape;  // [B, Lq, E]
        const std::size_t B = qs[0], Lq = qs[1], E = qs[2], H = c.args["heads"], Hkv = c.args["kv_heads"], d = c.args["head_dim"];
        const bool cross = c.has("key");
        const std::vector<float>& query = c.f("query");
        const std::vector<float>& key = cross ? c.f("key") : query;
        const std::vector<float>& value = cross ? c.f("value") : query;
        const std::size_t Lk = cross ? c.files.at("key").shape[1] : Lq;
        const std::size_t kdim = cross ? c.files.at("key").shape[2] : E, vdim = cross ? c.files.at("value").shape[2] : E;

        // Weights in the model's form (separate, every bias present) and in the library's.
        mha_bf16::Weights w;
        const std::size_t qw = H * d, kvw = Hkv * d;
        if (c.has("in_proj_weight")) {
            const std::vector<float>& in = c.f("in_proj_weight");
            w.wq.assign(in.begin(), in.begin() + std::ptrdiff_t(qw * E));
            w.wk.assign(in.begin() + std::ptrdiff_t(qw * E), in.begin() + std::ptrdiff_t((qw + kvw) * E));
            w.wv.assign(in.begin() + std::ptrdiff_t((qw + kvw) * E), in.end());
        } else {
            w.wq = c.f("q_proj_weight"), w.wk = c.f("k_proj_weight"), w.wv = c.f("v_proj_weight");
        }
        std::vector<float> in_b = c.has("in_proj_bias") ? c.f("in_proj_bias") : std::vector<float>(qw + 2 * kvw, 0.0f);
        w.bq.assign(in_b.begin(), in_b.begin() + std::ptrdiff_t(qw));
        w.bk.assign(in_b.begin() + std::ptrdiff_t(qw), in_b.begin() + std::ptrdiff_t(qw + kvw));
        w.bv.assign(in_b.begin() + std::ptrdiff_t(qw + kvw), in_b.end());
        w.wo = c.f("out_proj.weight");
        w.bo = c.has("out_proj.bias") ? c.f("out_proj.bias") : std::vector<float>(E, 0.0f);

        mha::AttentionWeights aw;
        if (c.has("in_proj_weight")) aw.in_proj_weight = c.f("in_proj_weight").data();
        else aw.q_proj_weight = w.wq.data(), aw.k_proj_weight = w.wk.data(), aw.v_proj_weight = w.wv.data();
        aw.in_proj_bias = in_b.data(), aw.out_proj_weight = w.wo.data(), aw.out_proj_bias = w.bo.data();
        mha::AttentionConfig cfg;
        cfg.embed_dim = E, cfg.num_heads = H, cfg.num_kv_heads = Hkv, cfg.head_dim = d, cfg.kdim = kdim, cfg.vdim = vdim;
        cfg.compute = mha::DataType::bf16;
        mha_bf16::Spec spec;
        spec.E = E, spec.H = H, spec.Hkv = Hkv, spec.d = d, spec.kdim = kdim, spec.vdim = vdim, spec.B = B, spec.Lq = Lq, spec.Lk = Lk;
        if (!c.args["rope_theta"].is_null()) {
            mha::RopeConfig r;
            r.theta = c.args["rope_theta"].get<float>();
            r.dims = c.args["rope_dims"].get<std::size_t>();
            r.style = c.args["rope_style"] == "half" ? mha::RopeStyle::half : mha::RopeStyle::interleaved;
            cfg.rope = spec.rope = r;
        }
        spec.causal = c.args["causal"].get<bool>();
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), B, Lq, E);
        if (cross) in.key = mha::ConstBatch(key.data(), B, Lk, kdim), in.value = mha::ConstBatch(value.data(), B, Lk, vdim);
        if (c.has("key_padding_mask")) in.key_padding_mask = mha::MaskView::boolean(c.files.at("key_padding_mask").bytes.data(), B, Lk);
        if (c.has("attn_mask")) in.attn_mask = mha::MaskView::additive(c.f("attn_mask").data(), Lq, Lk);
        spec.key_padding_mask = in.key_padding_mask, spec.attn_mask = in.attn_mask;
        const mha_bf16::Expected ex = mha_bf16::evaluate(spec, w, query.data(), key.data(), value.data());

        const std::vector<float>& oracle = c.f("expected_output");
        const double torch_err = mha_test::max_abs_diff(c.f("torch_bf16_output"), oracle);
        EXPECT_NEAR(torch_err, c.args["torch_bf16_max_abs_error"].get<double>(), 1e-6) << "args.json disagrees with the files";
        ASSERT_GT(torch_err, 0.0);
        // The oracle bound (the model's own oracle against the saved one: the same computation).
        ASSERT_TRUE(mha_test::all_within(oracle, ex.out.o, 1e-6)) << "the model and PyTorch's float64 oracle disagree";
        const std::vector<double> bound = mha_bf16::scaled(ex.out.e, mha_bf16::kOracleFactor);

        const mha::MultiheadAttention m(aw, cfg);
        auto check = [&](mha::Backend backend, mha::Impl impl) {
            std::vector<float> out(B * Lq * E, NAN);
            mha::ForwardOptions o;
            o.backend = backend, o.impl = impl, o.causal = spec.causal;
            m.forward(in, {mha::Batch(out.data(), B, Lq, E)}, o);
            const double err = mha_test::max_abs_diff(out, oracle);
            EXPECT_LE(err, kTorchFactor * torch_err) << "ours " << err << ", torch bf16 " << torch_err;
            EXPECT_TRUE(mha_test::all_within(out, ex.out.o, bound)) << "outside the derived bound";
            RecordProperty(name + (backend == mha::Backend::scalar ? " scalar" : " simd " + std::string(mha::isa_name(mha::active_isa()))),
                           "max error " + std::to_string(err) + " (torch bf16 " + std::to_string(torch_err) + ")");
        };
        check(mha::Backend::scalar, mha::Impl::automatic);
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused}) check(mha::Backend::simd, impl);
        }, /*with_bf16=*/true);
    }
}

}  // namespace
