// mha::MultiheadAttention against torch.nn.MultiheadAttention (float64, eval, batch_first) on shapes
// the small fixtures never reach: E = 1024 (GEMM k-blocks past KC = 768), L = 1100 (nine 128-row
// query blocks; Lk >= 1024 picks the fused path by default), cross-attention with Lq = 300 != Lk = 1100.
// tests/data/large_fixtures.json (written by tools/make_fixtures.py, see tests/data/README.md) holds
// each case's recipe and a summary of PyTorch's result; the inputs and parameters are regenerated here
// with the same counter-based generator (splitmix64; every value exact in float32).
// Checked, for the SIMD backend through the public API with Impl::automatic (= fused here), Impl::fused
// and Impl::materialized, and averaged weights (materialized) for the case that stores them, on every
// ISA the CPU has (the scalar backend is too slow at this size):
//   every element finite;
//   each stored sample (every 997th element): |got − expected| ≤ 1e-5·max|expected|, the bound of the
//     small fixtures (test_pytorch_fixtures.cpp). The worst-case float bound here, ~(2E + Lk)·u ≈ 2e-4
//     relative, is far looser: the roundings of long sums do not all point one way, and their sum grows
//     like √n·u (≈ 1e-6 at n = 3000). Measured on sse2, avx2, avx512: at most 5.2e-7 (output) and
//     2.4e-7 (weights), so 1e-5 leaves a factor 20;
//   the checksum Σ got_i·r_i against PyTorch's Σ expected_i·r_i (r_i in [-1, 1) from the generator):
//     if every element is within the bound above, |Δ| ≤ 1e-5·max|expected|·Σ|r_i|; so this catches
//     gross errors and NaN/inf anywhere, including elements between the samples.
// Each case takes 1 to 5 s in Release on 2 cores (3 ISAs × 3 or 4 forward calls).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mha/mha.hpp>

#include "compare_util.hpp"
#include "isa_test_util.hpp"

namespace {

using mha::Impl;
using mha::NeedWeights;

constexpr double kMaxRelativeError = 1e-5;  // as test_pytorch_fixtures.cpp

// The generator of tools/make_fixtures.py: value i of stream s is built from the top 24 bits k of
// splitmix64(s·0xD1B54A32D192ED03 + i) (uint64 wraparound), x = 2^a·(k − 2^23)/2^23, exact in float.
std::uint64_t splitmix64(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
std::int64_t counter_bits(std::uint64_t stream, std::uint64_t i) {
    return std::int64_t(splitmix64(stream * 0xD1B54A32D192ED03ull + i) >> 40);
}
std::vector<float> counter_uniform(std::uint64_t stream, std::size_t n, int amplitude_log2) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(std::ldexp(double(counter_bits(stream, i) - (1 << 23)), amplitude_log2 - 23));
    return v;
}

// Stream indices within a case (tools/make_fixtures.py: STREAMS).
enum Stream : std::uint64_t { in_w, in_b, out_w, out_b, query, key, value, kpm, output_checksum, weights_checksum };

nlohmann::json load_json() {
    std::ifstream f(std::filesystem::path(MHA_TEST_DATA_DIR) / "large_fixtures.json");
    if (!f) return nlohmann::json();
    return nlohmann::json::parse(f);
}

TEST(PyTorchLargeFixtures, GeneratorMatchesPython) {
    // splitmix64's published first output for seed 0 (the state is advanced by the golden gamma first).
    EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
    // Values printed by tools/make_fixtures.py: counter_uniform(16, 3, 0), counter_bits(23, 2),
    // counter_uniform(52, 2, -5) (float32, printed exactly).
    EXPECT_EQ(counter_uniform(16, 3, 0), (std::vector<float>{-0.8250851631164551f, 0.5884164571762085f, 0.8822853565216064f}));
    EXPECT_EQ(counter_bits(23, 0), 714903);
    EXPECT_EQ(counter_bits(23, 1), 7210947);
    EXPECT_EQ(counter_uniform(52, 2, -5), (std::vector<float>{0.015696313232183456f, -0.01833384856581688f}));
    const auto doc = load_json();
    ASSERT_FALSE(doc.is_null()) << "tests/data/large_fixtures.json is missing";
    ASSERT_EQ(doc.at("streams").size(), 10u);
    EXPECT_EQ(doc.at("streams").at(Stream::output_checksum).get<std::string>(), "output_checksum");
    EXPECT_EQ(doc.at("streams").at(Stream::kpm).get<std::string>(), "key_padding_mask");
}

TEST(PyTorchLargeFixtures, AllCasesPresent) {
    const auto doc = load_json();
    ASSERT_FALSE(doc.is_null()) << "tests/data/large_fixtures.json is missing";
    std::vector<std::string> names;
    for (const auto& c : doc.at("cases")) names.push_back(c.at("name").get<std::string>());
    EXPECT_EQ(names, (std::vector<std::string>{"large_self_key_padding", "large_causal", "large_cross"}));
}

// One summary (output or weights) against a result; returns the largest sampled error relative to max|expected|.
double check_summary(const std::vector<float>& got, const nlohmann::json& s, std::uint64_t checksum_stream,
                     const char* what) {
    const std::size_t n = s.at("count").get<std::size_t>(), stride = s.at("stride").get<std::size_t>();
    const double max_abs = s.at("max_abs").get<double>();
    EXPECT_EQ(got.size(), n) << what;
    if (got.size() != n) return INFINITY;
    const std::vector<double> want = s.at("samples").get<std::vector<double>>();
    EXPECT_EQ(want.size(), (n + stride - 1) / stride) << what;
    std::vector<float> sampled;
    for (std::size_t i = 0; i < n; i += stride) sampled.push_back(got[i]);
    const double err = mha_test::max_abs_diff(sampled, want);  // NaN on any non-finite value or size mismatch
    EXPECT_LE(err, kMaxRelativeError * max_abs) << what << ": sampled elements";
    double sum = 0.0, weight = 0.0;
    std::size_t nonfinite = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i])) ++nonfinite;
        const double r = std::ldexp(double(counter_bits(checksum_stream, i) - (1 << 23)), -23);
        sum += double(got[i]) * r, weight += std::abs(r);
    }
    EXPECT_EQ(nonfinite, 0u) << what;
    EXPECT_LE(std::abs(sum - s.at("checksum").get<double>()), kMaxRelativeError * max_abs * weight) << what << ": checksum";
    return err / max_abs;
}

std::string sci(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3e", v);
    return buf;
}

class PyTorchLarge : public testing::TestWithParam<std::string> {};

TEST_P(PyTorchLarge, MatchesPyTorch) {
    const auto doc = load_json();
    ASSERT_FALSE(doc.is_null()) << "tests/data/large_fixtures.json is missing";
    nlohmann::json c;
    for (const auto& x : doc.at("cases"))
        if (x.at("name") == GetParam()) c = x;
    ASSERT_FALSE(c.is_null()) << GetParam();
    const std::size_t B = c.at("B"), Lq = c.at("Lq"), Lk = c.at("Lk"), E = c.at("E"), H = c.at("H");
    const bool cross = c.at("cross"), causal = c.at("causal");
    const double density = c.at("key_padding_density");
    const int wlog2 = c.at("weight_amplitude_log2");
    const std::uint64_t S = c.at("seed").get<std::uint64_t>() * 16;

    const auto w_in = counter_uniform(S + in_w, 3 * E * E, wlog2), b_in = counter_uniform(S + in_b, 3 * E, wlog2);
    const auto w_out = counter_uniform(S + out_w, E * E, wlog2), b_out = counter_uniform(S + out_b, E, wlog2);
    const auto q = counter_uniform(S + query, B * Lq * E, 0);
    const auto k = cross ? counter_uniform(S + key, B * Lk * E, 0) : std::vector<float>();
    const auto v = cross ? counter_uniform(S + value, B * Lk * E, 0) : std::vector<float>();
    std::vector<std::uint8_t> mask;
    if (density > 0) {
        mask.resize(B * Lk);
        for (std::size_t i = 0; i < B * Lk; ++i)
            mask[i] = i % Lk != 0 && counter_bits(S + kpm, i) < std::int64_t(density * (1 << 24));  // key 0 never masked
    }
    const mha::MultiheadAttention attention(mha::AttentionWeights{w_in.data(), b_in.data(), w_out.data(), b_out.data()}, E, H);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(q.data(), B, Lq, E);
    if (cross) in.key = mha::ConstBatch(k.data(), B, Lk, E), in.value = mha::ConstBatch(v.data(), B, Lk, E);
    if (!mask.empty()) in.key_padding_mask = mha::MaskView::boolean(mask.data(), B, Lk);

    struct Run {
        Impl impl;
        NeedWeights need;
        const char* name;
    };
    std::vector<Run> runs{{Impl::automatic, NeedWeights::none, "automatic"},
                          {Impl::fused, NeedWeights::none, "fused"},
                          {Impl::materialized, NeedWeights::none, "materialized"}};
    if (c.contains("attn_weights")) runs.push_back({Impl::materialized, NeedWeights::averaged, "averaged_weights"});
    // Every ISA this CPU has (the GEMM panels and the fused path's packing differ per ISA).
    for (mha::Isa isa : mha_test::cpu_isas()) {
      mha::set_isa_cap(isa);
      for (const Run& r : runs) {
        SCOPED_TRACE(std::string(mha::isa_name(isa)) + " " + r.name);
        std::vector<float> out(B * Lq * E, NAN), weights(r.need == NeedWeights::none ? 0 : B * Lq * Lk, NAN);
        mha::ForwardOptions opt;
        opt.causal = causal;
        opt.impl = r.impl;
        opt.need_weights = r.need;
        attention.forward(in, {mha::Batch(out.data(), B, Lq, E), weights.empty() ? nullptr : weights.data()}, opt);
        const double out_err = check_summary(out, c.at("output"), S + output_checksum, "output");
        RecordProperty(std::string(mha::isa_name(isa)) + "_" + r.name + "_output_max_relative_error", sci(out_err));
        if (r.need != NeedWeights::none) {
            const double w_err = check_summary(weights, c.at("attn_weights"), S + weights_checksum, "attention weights");
            RecordProperty(std::string(mha::isa_name(isa)) + "_weights_max_relative_error", sci(w_err));
        }
      }
    }
    mha::set_isa_cap(mha::Isa::avx512_bf16);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, PyTorchLarge,
                         testing::Values("large_self_key_padding", "large_causal", "large_cross"),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
