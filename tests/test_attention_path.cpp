// The explicit public API of issue 20: which path a call takes (MultiheadAttention::path, sdpa_path,
// attention_path_name) against the rules of the core's path choice (attention_core.hpp):
//   scalar backend → scalar; need_weights or Algorithm::materialized → materialized;
//   Lq <= 16 and G·Lq <= 128 (fused / automatic) → decode; fused, G > 1 or Lk >= 1024 → grouped; else materialized;
//   with a KV cache Lk is the longest cached sequence + Lq.
// And: AttentionInputs::self_attention is the legacy null key bitwise; AttentionConfig::norm_eps is the per-call
// ForwardOptions::norm_eps bitwise (which, when set, overrides it); Impl is Algorithm.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <mha/mha.hpp>

#include "attention/attention_core.hpp"
#include "attention_test_util.hpp"

namespace {

using mha::AttentionPath;

static_assert(std::is_same_v<mha::Impl, mha::Algorithm>, "Impl is the deprecated name of Algorithm");
static_assert(mha::Impl::fused == mha::Algorithm::fused);

struct Layer {
    std::size_t E, H, Hkv, d;
    std::vector<float> wq, wk, wv, wo, bo, gamma, beta;
    Layer(std::size_t E_, std::size_t H_, std::size_t Hkv_, std::size_t d_)
        : E(E_), H(H_), Hkv(Hkv_), d(d_), wq(mha_test::random_floats(H * d * E, -0.3f, 0.3f, 1)),
          wk(mha_test::random_floats(Hkv * d * E, -0.3f, 0.3f, 2)), wv(mha_test::random_floats(Hkv * d * E, -0.3f, 0.3f, 3)),
          wo(mha_test::random_floats(E * H * d, -0.3f, 0.3f, 4)), bo(mha_test::random_floats(E, -0.1f, 0.1f, 5)),
          gamma(mha_test::random_floats(E, 0.5f, 1.5f, 6)), beta(mha_test::random_floats(E, -0.5f, 0.5f, 7)) {}
    mha::MultiheadAttention make(std::optional<float> norm_eps = std::nullopt) const {
        mha::AttentionWeights w;
        w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data();
        w.out_proj_weight = wo.data(), w.out_proj_bias = bo.data(), w.norm_weight = gamma.data(), w.norm_bias = beta.data();
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = Hkv, c.head_dim = d, c.norm_eps = norm_eps;
        return mha::MultiheadAttention(w, c);
    }
};

// The rule, written out (what the SIMD core decides).
AttentionPath expected_path(std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk, mha::NeedWeights nw,
                            mha::Algorithm a, mha::Backend backend = mha::Backend::simd) {
    if (backend == mha::Backend::scalar) return AttentionPath::scalar;
    if (nw != mha::NeedWeights::none || a == mha::Algorithm::materialized) return AttentionPath::materialized;
    if (Lq <= 16 && H / Hkv * Lq <= 128) return AttentionPath::decode;
    if (a == mha::Algorithm::fused || H != Hkv || Lk >= 1024) return AttentionPath::grouped;
    return AttentionPath::materialized;
}

TEST(AttentionPath, Names) {
    EXPECT_EQ(mha::attention_path_name(AttentionPath::scalar), "scalar");
    EXPECT_EQ(mha::attention_path_name(AttentionPath::materialized), "materialized");
    EXPECT_EQ(mha::attention_path_name(AttentionPath::grouped), "grouped");
    EXPECT_EQ(mha::attention_path_name(AttentionPath::decode), "decode");
}

TEST(AttentionPath, LayerFollowsTheRules) {
    struct Shape {
        std::size_t H, Hkv, Lq, Lk;
    };
    // decode (Lq <= 16, G·Lq <= 128), G·Lq > 128, Lq = 17, long keys, grouped heads, cross-attention.
    const Shape shapes[] = {{4, 4, 1, 1}, {4, 4, 16, 16}, {4, 1, 16, 40}, {16, 1, 16, 16}, {16, 1, 9, 20},
                            {4, 4, 17, 17}, {4, 4, 17, 1024}, {4, 2, 32, 32}, {4, 4, 40, 1030}};
    const mha::NeedWeights needs[] = {mha::NeedWeights::none, mha::NeedWeights::averaged, mha::NeedWeights::per_head};
    const mha::Algorithm algorithms[] = {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused};
    for (const Shape& s : shapes) {
        const Layer l(32, s.H, s.Hkv, 8);
        const mha::MultiheadAttention m = l.make();
        const std::vector<float> q(2 * s.Lq * 32), kv(2 * s.Lk * 32);
        const mha::AttentionInputs self = mha::AttentionInputs::self_attention(mha::ConstBatch(q.data(), 2, s.Lq, 32));
        mha::AttentionInputs cross;
        cross.query = mha::ConstBatch(q.data(), 2, s.Lq, 32);
        cross.key = cross.value = mha::ConstBatch(kv.data(), 2, s.Lk, 32);
        const mha::AttentionInputs& in = s.Lq == s.Lk ? self : cross;
        for (mha::NeedWeights nw : needs)
            for (mha::Algorithm a : algorithms)
                for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar}) {
                    SCOPED_TRACE("H " + std::to_string(s.H) + " Hkv " + std::to_string(s.Hkv) + " Lq " + std::to_string(s.Lq) +
                                 " Lk " + std::to_string(s.Lk) + " need_weights " + std::to_string(int(nw)) + " algorithm " +
                                 std::to_string(int(a)) + " backend " + std::to_string(int(backend)));
                    mha::ForwardOptions opt;
                    opt.need_weights = nw, opt.impl = a, opt.backend = backend;
                    const AttentionPath p = m.path(in, opt);
                    EXPECT_EQ(p, expected_path(s.H, s.Hkv, s.Lq, s.Lk, nw, a, backend));
                    if (backend == mha::Backend::simd) {  // the same call as the forward's
                        EXPECT_EQ(static_cast<int>(mha::detail::core_path(s.H, s.Hkv, s.Lq, s.Lk, nw, a)) + 1, static_cast<int>(p));
                    }
                }
    }
}

TEST(AttentionPath, KnownCases) {
    const Layer mha_layer(64, 8, 8, 8), gqa_layer(64, 8, 2, 16);
    const mha::MultiheadAttention m = mha_layer.make(), g = gqa_layer.make();
    const std::vector<float> x(1 * 2048 * 64);
    auto self = [&](std::size_t L) { return mha::AttentionInputs::self_attention(mha::ConstBatch(x.data(), 1, L, 64)); };
    mha::ForwardOptions weights;
    weights.need_weights = mha::NeedWeights::averaged;
    EXPECT_EQ(m.path(self(1), weights), AttentionPath::materialized);   // need_weights always materializes
    EXPECT_EQ(m.path(self(1)), AttentionPath::decode);                  // one token
    EXPECT_EQ(m.path(self(16)), AttentionPath::decode);                 // Lq <= 16, G·Lq = 16
    EXPECT_EQ(m.path(self(17)), AttentionPath::materialized);           // G = 1, Lk < 1024
    EXPECT_EQ(m.path(self(1024)), AttentionPath::grouped);              // Lk >= 1024
    EXPECT_EQ(g.path(self(17)), AttentionPath::grouped);                // G > 1
    mha::ForwardOptions fused;
    fused.impl = mha::Algorithm::fused;
    EXPECT_EQ(m.path(self(1), fused), AttentionPath::decode);           // fused takes the decode path too
    EXPECT_EQ(m.path(self(17), fused), AttentionPath::grouped);
    mha::ForwardOptions scalar;
    scalar.backend = mha::Backend::scalar;
    EXPECT_EQ(m.path(self(1), scalar), AttentionPath::scalar);
    mha::AttentionInputs legacy;  // the null key: the same call
    legacy.query = mha::ConstBatch(x.data(), 1, 17, 64);
    EXPECT_EQ(g.path(legacy), AttentionPath::grouped);
}

// With a cache the core spans the longest sequence after the append: cached + Lq keys.
TEST(AttentionPath, CacheCountsTheCachedKeys) {
    const Layer l(64, 8, 8, 8);
    const mha::MultiheadAttention m = l.make();
    mha::KVCache cache(2, 8, 8, 2048);
    const std::vector<float> kv(8 * 1000 * 8);
    cache.append(1, mha::ConstHeads::bhld(kv.data(), 1, 8, 1000, 8), mha::ConstHeads::bhld(kv.data(), 1, 8, 1000, 8));
    const std::vector<float> x(2 * 32 * 64);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(x.data(), 2, 1, 64);
    EXPECT_EQ(m.path(in, {}, cache), AttentionPath::decode);
    in.query = mha::ConstBatch(x.data(), 2, 32, 64);
    EXPECT_EQ(m.path(in, {}, cache), AttentionPath::grouped);  // 1000 + 32 >= 1024 keys
    cache.truncate(1, 900);
    EXPECT_EQ(m.path(in, {}, cache), AttentionPath::materialized);  // 932 keys, G = 1
    mha::ForwardOptions scalar;
    scalar.backend = mha::Backend::scalar;
    EXPECT_EQ(m.path(in, scalar, cache), AttentionPath::scalar);
    mha::AttentionInputs with_key = in;
    with_key.key = in.query;
    try {
        (void)m.path(with_key, {}, cache);
        ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("key and value must be absent with a KV cache"), std::string::npos) << e.what();
    }
}

TEST(AttentionPath, Sdpa) {
    const std::vector<float> q(4 * 40 * 8), kv(2 * 1100 * 8);
    auto inputs = [&](std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk) {
        mha::SdpaInputs in;
        in.query = mha::ConstHeads::bhld(q.data(), 1, H, Lq, 8);
        in.key = in.value = mha::ConstHeads::bhld(kv.data(), 1, Hkv, Lk, 8);
        return in;
    };
    for (mha::Algorithm a : {mha::Algorithm::automatic, mha::Algorithm::materialized, mha::Algorithm::fused})
        for (const auto& [H, Hkv, Lq, Lk] : {std::array<std::size_t, 4>{4, 4, 1, 10}, {4, 4, 40, 10}, {4, 2, 40, 10},
                                             {4, 4, 40, 1100}, {4, 1, 16, 10}}) {
            mha::SdpaOptions opt;
            opt.impl = a;
            EXPECT_EQ(mha::sdpa_path(inputs(H, Hkv, Lq, Lk), opt), expected_path(H, Hkv, Lq, Lk, mha::NeedWeights::none, a));
            opt.backend = mha::Backend::scalar;
            EXPECT_EQ(mha::sdpa_path(inputs(H, Hkv, Lq, Lk), opt), AttentionPath::scalar);
        }
    try {
        (void)mha::sdpa_path(inputs(3, 2, 1, 10));
        ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "query heads 3 are not a multiple of key/value heads 2");
    }
}

TEST(AttentionPath, MovedFromThrows) {
    const Layer l(32, 4, 4, 8);
    mha::MultiheadAttention m = l.make();
    mha::MultiheadAttention sink(std::move(m));
    const std::vector<float> x(32);
    try {
        (void)m.path(mha::AttentionInputs::self_attention(mha::ConstBatch(x.data(), 1, 1, 32)));  // NOLINT(bugprone-use-after-move)
        ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "the attention object was moved from");
    }
}

// --- the explicit inputs and the layer's norm eps ---------------------------------------------------------

std::vector<float> forward(const mha::MultiheadAttention& m, const mha::AttentionInputs& in, const mha::ForwardOptions& opt) {
    std::vector<float> y(in.query.batch * in.query.rows * in.query.cols, -1.0f);
    mha::AttentionOutputs out;
    out.output = mha::Batch(y.data(), in.query.batch, in.query.rows, in.query.cols);
    m.forward(in, out, opt);
    return y;
}

using mha_test::same_bits;

TEST(ExplicitApi, SelfAttentionIsTheNullKey) {
    const Layer l(32, 4, 2, 8);
    const mha::MultiheadAttention m = l.make();
    const std::vector<float> x = mha_test::random_floats(2 * 5 * 32, -1.0f, 1.0f, 11);
    const mha_test::Mask pad = mha_test::random_bool_mask({2, 5}, 0.3, 12);
    const mha::ConstBatch q(x.data(), 2, 5, 32);
    mha::AttentionInputs legacy;
    legacy.query = q;
    legacy.key_padding_mask = pad.view();
    const mha::AttentionInputs explicit_self = mha::AttentionInputs::self_attention(q, pad.view());
    EXPECT_EQ(explicit_self.key.data, x.data());
    EXPECT_EQ(explicit_self.value.data, x.data());
    for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar}) {
        mha::ForwardOptions opt;
        opt.backend = backend;
        opt.causal = true;
        EXPECT_TRUE(same_bits(forward(m, legacy, opt), forward(m, explicit_self, opt)));
        EXPECT_EQ(m.workspace_bytes(legacy, opt), m.workspace_bytes(explicit_self, opt));
    }
}

TEST(ExplicitApi, ConfigNormEpsIsThePerCallOne) {
    const Layer l(32, 4, 4, 8);
    const mha::MultiheadAttention plain = l.make(), normed = l.make(1e-5f), other = l.make(0.5f);
    const std::vector<float> x = mha_test::random_floats(2 * 6 * 32, -1.0f, 1.0f, 21);
    const mha::AttentionInputs in = mha::AttentionInputs::self_attention(mha::ConstBatch(x.data(), 2, 6, 32));
    for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar}) {
        mha::ForwardOptions opt, per_call;
        opt.backend = per_call.backend = backend;
        per_call.norm_eps = 1e-5f;
        const std::vector<float> by_config = forward(normed, in, opt);
        EXPECT_TRUE(same_bits(by_config, forward(plain, in, per_call)));
        EXPECT_TRUE(same_bits(by_config, forward(other, in, per_call)));  // the deprecated field overrides
        EXPECT_FALSE(same_bits(by_config, forward(plain, in, opt)));      // no post-norm without either
        EXPECT_FALSE(same_bits(by_config, forward(other, in, opt)));
    }
}

TEST(ExplicitApi, ConfigNormEpsIsValidated) {
    const Layer l(32, 4, 4, 8);
    for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        try {
            (void)l.make(bad);
            ADD_FAILURE() << "no error for " << bad;
        } catch (const std::invalid_argument& e) {
            EXPECT_EQ(std::string(e.what()), "norm_eps " + std::to_string(bad) + " is not a finite value >= 0");
        }
    }
}

}  // namespace
