// Bottom-right alignment places the queries at the end of the key sequence, for the causal rule and for
// the rotary positions alike: attending with the last Lq tokens of a sequence as the query and the whole
// sequence as key/value (cross-attention, bottom-right causal, RoPE) gives the last Lq rows of causal
// self-attention over the whole sequence. That is what a KV cache relies on. Both backends, both pairings,
// with a position offset; the SIMD paths (grouped and materialized) run different blockings for the two
// calls, so the comparison allows float rounding: |a − b| <= 1e-5·max|b| (values of order 1, sums of at most
// 64 + 2·32 products each rounded at 2^-24, far inside that).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <mha/mha.hpp>

namespace {

struct Case {
    mha::Backend backend;
    mha::Impl impl;
    mha::RopeStyle style;
};

class RopeAlignment : public ::testing::TestWithParam<Case> {};

TEST_P(RopeAlignment, LastQueriesAgainstWholeSequenceEqualSelfAttentionRows) {
    const Case c = GetParam();
    const std::size_t E = 32, H = 4, Hkv = 2, d = 16, L = 37, Lq = 9, B = 2;
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.0f, 0.3f);
    auto random = [&](std::size_t count) {
        std::vector<float> v(count);
        for (float& x : v) x = n(rng);
        return v;
    };
    const std::vector<float> wq = random(H * d * E), wk = random(Hkv * d * E), wv = random(Hkv * d * E), wo = random(E * H * d);
    const std::vector<float> x = random(B * L * E);
    mha::AttentionConfig cfg;
    cfg.embed_dim = E, cfg.num_heads = H, cfg.num_kv_heads = Hkv, cfg.head_dim = d;
    cfg.rope = mha::RopeConfig{10000.0f, 0, c.style};
    mha::AttentionWeights w;
    w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
    const mha::MultiheadAttention m(w, cfg);

    mha::ForwardOptions opt;
    opt.backend = c.backend;
    opt.impl = c.impl;
    opt.causal = true;
    opt.position_offset = 1000;
    std::vector<float> full(B * L * E), last(B * Lq * E);
    mha::AttentionInputs self;
    self.query = mha::ConstBatch(x.data(), B, L, E);
    m.forward(self, {mha::Batch(full.data(), B, L, E)}, opt);

    mha::AttentionInputs cross;
    cross.query = mha::ConstBatch(x.data() + (L - Lq) * E, B, Lq, E, E, L * E);  // rows L − Lq .. L − 1
    cross.key = mha::ConstBatch(x.data(), B, L, E);
    cross.value = cross.key;
    opt.causal_alignment = mha::CausalAlignment::bottom_right;
    m.forward(cross, {mha::Batch(last.data(), B, Lq, E)}, opt);

    float scale = 0.0f;
    for (float v : full) scale = std::max(scale, std::fabs(v));
    ASSERT_GT(scale, 0.0f);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t e = 0; e < E; ++e)
                ASSERT_NEAR(last[(b * Lq + i) * E + e], full[(b * L + L - Lq + i) * E + e], 1e-5f * scale)
                    << "b " << b << " query " << i << " feature " << e;

    // Top-left alignment would rotate the queries at 1000 + i instead: a different result (the test can fail).
    opt.causal = false;
    opt.causal_alignment = mha::CausalAlignment::top_left;
    std::vector<float> shifted(B * Lq * E), aligned(B * Lq * E);
    m.forward(cross, {mha::Batch(shifted.data(), B, Lq, E)}, opt);
    opt.causal_alignment = mha::CausalAlignment::bottom_right;
    m.forward(cross, {mha::Batch(aligned.data(), B, Lq, E)}, opt);
    float differ = 0.0f;
    for (std::size_t k = 0; k < shifted.size(); ++k) differ = std::max(differ, std::fabs(shifted[k] - aligned[k]));
    EXPECT_GT(differ, 1e-3f * scale);
}

TEST(RopeAlignment, NegativeQueryPositionIsRefused) {
    const std::size_t E = 8, H = 2;
    std::vector<float> in_w(3 * E * E, 0.1f), out_w(E * E, 0.1f), q(5 * E, 1.0f), k(2 * E, 1.0f), out(5 * E, -7.0f);
    mha::AttentionConfig cfg;
    cfg.embed_dim = E, cfg.num_heads = H, cfg.rope = mha::RopeConfig{};
    mha::AttentionWeights w;
    w.in_proj_weight = in_w.data(), w.out_proj_weight = out_w.data();
    const mha::MultiheadAttention m(w, cfg);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(q.data(), 1, 5, E);
    in.key = mha::ConstBatch(k.data(), 1, 2, E);
    mha::ForwardOptions opt;
    opt.causal_alignment = mha::CausalAlignment::bottom_right;
    opt.position_offset = 2;  // Lq − Lk = 3
    try {
        m.forward(in, {mha::Batch(out.data(), 1, 5, E)}, opt);
        ADD_FAILURE() << "no exception";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("position_offset 2 is smaller than Lq − Lk = 3"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -7.0f; }));
    opt.position_offset = 3;
    EXPECT_NO_THROW(m.forward(in, {mha::Batch(out.data(), 1, 5, E)}, opt));
}

INSTANTIATE_TEST_SUITE_P(
    All, RopeAlignment,
    ::testing::Values(Case{mha::Backend::scalar, mha::Impl::automatic, mha::RopeStyle::half},
                      Case{mha::Backend::scalar, mha::Impl::automatic, mha::RopeStyle::interleaved},
                      Case{mha::Backend::simd, mha::Impl::fused, mha::RopeStyle::half},
                      Case{mha::Backend::simd, mha::Impl::fused, mha::RopeStyle::interleaved},
                      Case{mha::Backend::simd, mha::Impl::materialized, mha::RopeStyle::half}),
    [](const auto& info) {
        const Case& c = info.param;
        return std::string(c.backend == mha::Backend::scalar ? "scalar" : "simd") +
               (c.impl == mha::Impl::fused ? "_fused" : c.impl == mha::Impl::materialized ? "_materialized" : "") +
               (c.style == mha::RopeStyle::half ? "_half" : "_interleaved");
    });

}  // namespace
