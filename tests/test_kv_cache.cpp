// KVCache and MultiheadAttention::forward with a cache: feeding a prompt in one call, in chunks, or token by
// token gives the rows of one causal self-attention forward over the whole prompt (both backends, with
// GQA and RoPE); capacity overflow is refused with nothing written; truncate then continue equals never
// having fed the dropped tokens; the cache's contents are the rotated K and V.
// Bound: |a − b| <= 2e-5·max|b| — the two computations differ only in blocking (rounding of sums of at most
// E = 64 or L = 40 products of values of order 1, each term rounded at 2^-24: a few 1e-7 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <mha/mha.hpp>

namespace {

struct Layer {
    std::size_t E = 64, H = 8, Hkv = 2, d = 16;
    std::vector<float> wq, wk, wv, wo, bias;
    mha::MultiheadAttention attn;
    static std::vector<float> random(std::size_t n, std::mt19937& rng, float sd) {
        std::normal_distribution<float> dist(0.0f, sd);
        std::vector<float> v(n);
        for (float& x : v) x = dist(rng);
        return v;
    }
    explicit Layer(bool rope, std::mt19937& rng)
        : wq(random(H * d * E, rng, 0.15f)), wk(random(Hkv * d * E, rng, 0.15f)), wv(random(Hkv * d * E, rng, 0.15f)),
          wo(random(E * H * d, rng, 0.1f)), bias(random(H * d + 2 * Hkv * d, rng, 0.1f)), attn(make(rope)) {}
    mha::MultiheadAttention make(bool rope) const {
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = Hkv, c.head_dim = d;
        if (rope) c.rope = mha::RopeConfig{10000.0f, 0, mha::RopeStyle::half};
        mha::AttentionWeights w;
        w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
        w.in_proj_bias = bias.data();
        return mha::MultiheadAttention(w, c);
    }
};

// Self-attention inputs over the new tokens.
mha::AttentionInputs tokens(const mha::ConstBatch& q) {
    mha::AttentionInputs in;
    in.query = q;
    return in;
}
mha::AttentionOutputs to(const mha::Batch& out) {
    mha::AttentionOutputs o;
    o.output = out;
    return o;
}

float max_abs(const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

class KvCacheChunks : public ::testing::TestWithParam<mha::Backend> {};

TEST_P(KvCacheChunks, AnyChunkingEqualsOneCausalForward) {
    std::mt19937 rng(5);
    const Layer layer(true, rng);
    const std::size_t B = 2, L = 40, E = layer.E;
    const std::vector<float> x = Layer::random(B * L * E, rng, 1.0f);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    opt.causal = true;
    std::vector<float> full(B * L * E);
    layer.attn.forward(tokens(mha::ConstBatch(x.data(), B, L, E)), to(mha::Batch(full.data(), B, L, E)), opt);
    const float scale = max_abs(full);

    for (const std::vector<std::size_t>& chunks : {std::vector<std::size_t>{40}, std::vector<std::size_t>(40, 1),
                                                   std::vector<std::size_t>(20, 2), std::vector<std::size_t>{7, 7, 7, 7, 7, 5},
                                                   std::vector<std::size_t>{1, 16, 3, 20}}) {
        mha::KVCache cache(B, layer.Hkv, layer.d, 48);
        std::vector<float> got(B * L * E);
        std::size_t at = 0;
        mha::ForwardOptions copt;
        copt.backend = GetParam();
        for (std::size_t n : chunks) {
            // Rows at..at+n of every sequence: a strided view into x and into got.
            layer.attn.forward(tokens(mha::ConstBatch(x.data() + at * E, B, n, E, E, L * E)), to(mha::Batch(got.data() + at * E, B, n, E, E, L * E)), copt, cache);
            at += n;
        }
        ASSERT_EQ(at, L);
        EXPECT_EQ(cache.length(0), L);
        EXPECT_EQ(cache.length(1), L);
        float worst = 0.0f;
        for (std::size_t k = 0; k < got.size(); ++k) worst = std::max(worst, std::fabs(got[k] - full[k]));
        EXPECT_LE(worst, 2e-5f * scale) << "chunks of " << chunks.size();
    }
}

TEST_P(KvCacheChunks, RaggedBatchEqualsSeparateSequences) {
    std::mt19937 rng(9);
    const Layer layer(true, rng);
    const std::size_t E = layer.E, B = 3, cap = 16;
    const std::size_t prompt[B] = {0, 1, 5};
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    // Each sequence alone (batch 1 caches), then all three together from the same prompts.
    std::vector<std::vector<float>> prompts, steps;
    for (std::size_t b = 0; b < B; ++b) {
        prompts.push_back(Layer::random(std::max<std::size_t>(prompt[b], 1) * E, rng, 1.0f));
        steps.push_back(Layer::random(E, rng, 1.0f));
    }
    mha::KVCache together(B, layer.Hkv, layer.d, cap);
    std::vector<float> alone_out(B * E), together_out(B * E), sink(cap * E);
    for (std::size_t b = 0; b < B; ++b) {
        mha::KVCache single(1, layer.Hkv, layer.d, cap);
        if (prompt[b] > 0) {
            layer.attn.forward(tokens(mha::ConstBatch(prompts[b].data(), 1, prompt[b], E)), to(mha::Batch(sink.data(), 1, prompt[b], E)), opt, single);
            // Load the same prompt's K/V into sequence b of the batched cache.
            const mha::ConstHeads k = single.keys(), v = single.values();
            together.append(b, mha::ConstHeads(k.data, 1, layer.Hkv, prompt[b], layer.d, 0, k.head_stride, k.row_stride),
                            mha::ConstHeads(v.data, 1, layer.Hkv, prompt[b], layer.d, 0, v.head_stride, v.row_stride));
        }
        layer.attn.forward(tokens(mha::ConstBatch(steps[b].data(), 1, 1, E)), to(mha::Batch(alone_out.data() + b * E, 1, 1, E)), opt, single);
    }
    std::vector<float> batch_step(B * E);
    for (std::size_t b = 0; b < B; ++b) std::copy(steps[b].begin(), steps[b].end(), batch_step.begin() + b * E);
    layer.attn.forward(tokens(mha::ConstBatch(batch_step.data(), B, 1, E)), to(mha::Batch(together_out.data(), B, 1, E)), opt, together);
    for (std::size_t b = 0; b < B; ++b) EXPECT_EQ(together.length(b), prompt[b] + 1);
    const float scale = max_abs(alone_out);
    for (std::size_t k = 0; k < together_out.size(); ++k) EXPECT_NEAR(together_out[k], alone_out[k], 2e-5f * scale) << k;
}

TEST_P(KvCacheChunks, CapacityOverflowWritesNothing) {
    std::mt19937 rng(3);
    const Layer layer(false, rng);
    const std::size_t E = layer.E, B = 2;
    mha::KVCache cache(B, layer.Hkv, layer.d, 4);
    const std::vector<float> x = Layer::random(B * 3 * E, rng, 1.0f);
    std::vector<float> out(B * 3 * E, -7.0f);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    layer.attn.forward(tokens(mha::ConstBatch(x.data(), B, 3, E)), to(mha::Batch(out.data(), B, 3, E)), opt, cache);
    const std::vector<float> keys(cache.keys().data, cache.keys().data + cache.bytes() / sizeof(float) / 2);
    std::fill(out.begin(), out.end(), -7.0f);
    try {
        layer.attn.forward(tokens(mha::ConstBatch(x.data(), B, 2, E)), to(mha::Batch(out.data(), B, 2, E)), opt, cache);
        ADD_FAILURE() << "no exception";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("sequence 0 holds 3 tokens; 2 more exceed the KV cache's capacity 4"), std::string::npos)
            << e.what();
    }
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -7.0f; }));
    EXPECT_EQ(cache.length(0), 3u);
    EXPECT_EQ(cache.length(1), 3u);
    EXPECT_TRUE(std::equal(keys.begin(), keys.end(), cache.keys().data));
}

TEST_P(KvCacheChunks, TruncateThenContinueEqualsNeverFeedingTheDraft) {
    std::mt19937 rng(4);
    const Layer layer(true, rng);
    const std::size_t E = layer.E;
    const std::vector<float> prompt = Layer::random(6 * E, rng, 1.0f), draft = Layer::random(3 * E, rng, 1.0f),
                             next = Layer::random(2 * E, rng, 1.0f);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    std::vector<float> sink(6 * E), a(2 * E), b(2 * E);
    mha::KVCache with_draft(1, layer.Hkv, layer.d, 16), without(1, layer.Hkv, layer.d, 16);
    layer.attn.forward(tokens(mha::ConstBatch(prompt.data(), 1, 6, E)), to(mha::Batch(sink.data(), 1, 6, E)), opt, with_draft);
    layer.attn.forward(tokens(mha::ConstBatch(prompt.data(), 1, 6, E)), to(mha::Batch(sink.data(), 1, 6, E)), opt, without);
    layer.attn.forward(tokens(mha::ConstBatch(draft.data(), 1, 3, E)), to(mha::Batch(sink.data(), 1, 3, E)), opt, with_draft);
    with_draft.truncate(0, 6);
    layer.attn.forward(tokens(mha::ConstBatch(next.data(), 1, 2, E)), to(mha::Batch(a.data(), 1, 2, E)), opt, with_draft);
    layer.attn.forward(tokens(mha::ConstBatch(next.data(), 1, 2, E)), to(mha::Batch(b.data(), 1, 2, E)), opt, without);
    EXPECT_EQ(a, b);  // the same computation on the same cached rows: bitwise
    EXPECT_THROW(with_draft.truncate(0, 9), mha::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, KvCacheChunks, ::testing::Values(mha::Backend::scalar, mha::Backend::simd),
                         [](const auto& info) { return info.param == mha::Backend::scalar ? "scalar" : "simd"; });

}  // namespace
