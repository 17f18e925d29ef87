// Zero-sized calls accepted where PyTorch accepts them (issue 21): MultiheadAttention::forward (fp32, 16-bit,
// workspace, KV cache) and scaled_dot_product_attention with B = 0 or Lq = 0 validate, then write nothing
// (outputs with sentinels around them, empty views with null pointers); Lk = 0 gives fully masked rows: the
// out-projection bias (then LayerNorm(query + bias) with the post-norm), zeros for SDPA. Heads, features and
// head dims of 0 stay errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

namespace {

using mha::Backend;
using mha::Batch;
using mha::ConstBatch;
using mha::ConstHeads;
using mha::Heads;
using mha::MaskView;
using mha::NeedWeights;

constexpr float kSentinel = -12345.0f;
constexpr std::uint16_t kSentinelBits = 0xBEEF;
constexpr std::size_t E = 8, H = 2;
const Backend kBackends[] = {Backend::scalar, Backend::simd};

std::vector<float> random_vector(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
}

template <class T>
bool all_equal(const std::vector<T>& v, T value) {
    for (T x : v)
        if (x != value) return false;
    return true;
}

void expect_invalid(const std::function<void()>& f, const std::string& substring) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one mentioning \"" << substring << "\"";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
    }
}

// An E = 8, H = 2 layer with random weights and biases; with_norm: the post-norm block with random gamma, beta.
struct Layer {
    std::vector<float> in_w = random_vector(3 * E * E, 1), in_b = random_vector(3 * E, 2), out_w = random_vector(E * E, 3),
                       out_b = random_vector(E, 4), gamma = random_vector(E, 5), beta = random_vector(E, 6);
    mha::MultiheadAttention make(bool with_bias = true, bool with_norm = false,
                                 mha::DataType compute = mha::DataType::f32) const {
        mha::AttentionWeights w{in_w.data(), in_b.data(), out_w.data(), with_bias ? out_b.data() : nullptr};
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.compute = compute;
        if (with_norm) w.norm_weight = gamma.data(), w.norm_bias = beta.data(), c.norm_eps = 1e-5f;
        return mha::MultiheadAttention(w, c);
    }
};

// Every option that reads a zero dimension: masks with the zero dims and null pointers, per-head weights.
mha::AttentionInputs with_empty_masks(mha::AttentionInputs in, std::size_t B, std::size_t Lq, std::size_t Lk) {
    in.key_padding_mask = MaskView::boolean(nullptr, B, Lk);
    in.attn_mask = MaskView::additive(nullptr, B * H, Lq, Lk);
    return in;
}

// ---------------------------------------------------------------------------------------------------
// MultiheadAttention, B = 0 or Lq = 0: accepted, nothing written, no workspace, the scalar path.

TEST(ZeroSizes, EmptyBatchAndEmptyQueryWriteNothing) {
    const Layer layer;
    const mha::MultiheadAttention m = layer.make(true, true);
    const std::vector<float> key = random_vector(2 * 4 * E, 7);
    std::vector<float> around(64, kSentinel), weights(64, kSentinel);
    struct Case {
        const char* name;
        mha::AttentionInputs in;
        Batch output;
    };
    const Case cases[] = {
        // B = 0, self-attention (legacy null key): every view null
        {"B = 0, null views", {ConstBatch(nullptr, 0, 3, E), {}, {}, {}, {}}, Batch(nullptr, 0, 3, E)},
        // B = 0, cross-attention, with masks of the zero dims, the output a pointer into a sentinel buffer
        {"B = 0, cross", with_empty_masks({ConstBatch(nullptr, 0, 3, E), ConstBatch(key.data(), 0, 4, E), ConstBatch(key.data(), 0, 4, E), {}, {}}, 0, 3, 4),
         Batch(around.data() + 16, 0, 3, E)},
        // Lq = 0 with real keys and a real key padding mask; attn_mask [0, Lk] null
        {"Lq = 0", {ConstBatch(nullptr, 2, 0, E), ConstBatch(key.data(), 2, 4, E), ConstBatch(key.data(), 2, 4, E), {}, MaskView::additive(nullptr, 0, 4)},
         Batch(nullptr, 2, 0, E)},
        {"Lq = 0, Lk = 0", with_empty_masks({ConstBatch(nullptr, 2, 0, E), ConstBatch(key.data(), 2, 0, E), ConstBatch(key.data(), 2, 0, E), {}, {}}, 2, 0, 0),
         Batch(around.data() + 16, 2, 0, E)},
    };
    const std::vector<std::uint8_t> kpm(2 * 4, 1);
    for (const Case& c : cases)
        for (Backend backend : kBackends)
            for (NeedWeights nw : {NeedWeights::none, NeedWeights::averaged, NeedWeights::per_head}) {
                SCOPED_TRACE(::testing::Message() << c.name << (backend == Backend::scalar ? ", scalar" : ", simd") << ", weights "
                                                  << static_cast<int>(nw));
                mha::AttentionInputs in = c.in;
                if (std::string(c.name) == "Lq = 0") in.key_padding_mask = MaskView::boolean(kpm.data(), 2, 4);
                mha::ForwardOptions opt;
                opt.backend = backend;
                opt.need_weights = nw;
                for (float* w : {static_cast<float*>(nullptr), weights.data()}) {
                    const mha::AttentionOutputs out{c.output, w};
                    EXPECT_NO_THROW(m.forward(in, out, opt));
                    EXPECT_EQ(m.workspace_bytes(in, opt), 0u);
                    EXPECT_EQ(m.path(in, opt), mha::AttentionPath::scalar);
                    mha::Workspace none;  // 0 bytes: enough for a call with nothing to compute
                    EXPECT_NO_THROW(m.forward(in, out, opt, none));
                }
                EXPECT_TRUE(all_equal(around, kSentinel));
                EXPECT_TRUE(all_equal(weights, kSentinel));
            }
}

// The zero-sized calls are still validated: batches, features, output shape and masks must agree.
TEST(ZeroSizes, EmptyCallsAreStillValidated) {
    const Layer layer;
    const mha::MultiheadAttention m = layer.make();
    const std::vector<float> key = random_vector(2 * 4 * E, 7);
    std::vector<float> around(64, kSentinel);
    const auto expect_refused = [&](const mha::AttentionInputs& in, Batch output, const std::string& message) {
        for (Backend backend : kBackends) {
            mha::ForwardOptions opt;
            opt.backend = backend;
            expect_invalid([&] { m.forward(in, {output, nullptr}, opt); }, message);
            EXPECT_TRUE(all_equal(around, kSentinel));
        }
    };
    const ConstBatch q0(nullptr, 0, 3, E), k0(key.data(), 0, 4, E);
    expect_refused({q0, ConstBatch(key.data(), 2, 4, E), {}, {}, {}}, Batch(nullptr, 0, 3, E), "key batch 2 differs from query batch 0");
    expect_refused({q0, k0, k0, {}, {}}, Batch(around.data(), 2, 3, E), "output is [2, 3, 8] but must be [B, Lq, E] = [0, 3, 8]");
    expect_refused({q0, k0, k0, {}, {}}, Batch(around.data(), 0, 4, E), "output is [0, 4, 8] but must be [B, Lq, E] = [0, 3, 8]");
    expect_refused({ConstBatch(nullptr, 0, 3, 6), k0, k0, {}, {}}, Batch(nullptr, 0, 3, E), "query has 6 features but embed_dim is 8");
    expect_refused({q0, ConstBatch(key.data(), 0, 4, 0), k0, {}, {}}, Batch(nullptr, 0, 3, E), "key has 0 features but kdim is 8");
    expect_refused({q0, k0, k0, MaskView::boolean(nullptr, 0, 5), {}}, Batch(nullptr, 0, 3, E), "key_padding_mask has shape [0, 5]");
    expect_refused({ConstBatch(nullptr, 2, 0, E), ConstBatch(key.data(), 2, 4, E), {}, {}, MaskView::additive(nullptr, 0, 5)},
                   Batch(nullptr, 2, 0, E), "attn_mask has shape [0, 5]");
    // A mask with elements still needs its pointer.
    expect_refused({ConstBatch(nullptr, 2, 0, E), ConstBatch(key.data(), 2, 4, E), {}, MaskView::boolean(nullptr, 2, 4), {}},
                   Batch(nullptr, 2, 0, E), "key_padding_mask is boolean with a null pointer");
    // workspace_bytes and path check the features too.
    expect_invalid([&] { (void)m.workspace_bytes({ConstBatch(nullptr, 0, 3, 6), {}, {}, {}, {}}); }, "query is [0, 3, 6] but must have 8 features");
    expect_invalid([&] { (void)m.path({q0, ConstBatch(key.data(), 0, 4, 5), {}, {}, {}}); }, "key is [0, 4, 5] but must have 8 features");
}

// ---------------------------------------------------------------------------------------------------
// MultiheadAttention, Lk = 0: every row attends to nothing, output = bo (zeros without a bias), then the
// post-norm LayerNorm(query + bo), computed here in double.

std::vector<float> expected_unattended(const Layer& layer, const std::vector<float>& query, std::size_t rows, bool with_bias,
                                       bool with_norm) {
    std::vector<float> y(rows * E);
    for (std::size_t r = 0; r < rows; ++r) {
        double z[E], mean = 0.0, var = 0.0;
        for (std::size_t j = 0; j < E; ++j) {
            const double bias = with_bias ? layer.out_b[j] : 0.0;
            z[j] = with_norm ? query[r * E + j] + bias : bias;
            mean += z[j] / E;
        }
        for (std::size_t j = 0; j < E; ++j) var += (z[j] - mean) * (z[j] - mean) / E;
        for (std::size_t j = 0; j < E; ++j)
            y[r * E + j] = static_cast<float>(with_norm ? layer.gamma[j] * (z[j] - mean) / std::sqrt(var + 1e-5) + layer.beta[j] : z[j]);
    }
    return y;
}

TEST(ZeroSizes, NoKeysGiveTheOutputBiasRows) {
    const Layer layer;
    constexpr std::size_t B = 2, Lq = 3, pad = 5, stride = E + pad;  // output rows padded with sentinels
    const std::vector<float> query = random_vector(B * Lq * E, 11), key(E, 0.5f);
    for (mha::DataType compute : {mha::DataType::f32, mha::DataType::bf16})
        for (bool with_bias : {true, false})
            for (bool with_norm : {false, true}) {
                const mha::MultiheadAttention m = layer.make(with_bias, with_norm, compute);
                const std::vector<float> expected = expected_unattended(layer, query, B * Lq, with_bias, with_norm);
                for (Backend backend : kBackends)
                    for (NeedWeights nw : {NeedWeights::none, NeedWeights::per_head})
                        for (bool causal : {false, true}) {
                            SCOPED_TRACE(::testing::Message() << (compute == mha::DataType::bf16 ? "bf16" : "f32") << " bias " << with_bias
                                                              << " norm " << with_norm << (backend == Backend::scalar ? " scalar" : " simd")
                                                              << " weights " << static_cast<int>(nw) << " causal " << causal);
                            // key and value [B, 0, E]: a non-null pointer (null means key = query).
                            const ConstBatch k(key.data(), B, 0, E);
                            const mha::AttentionInputs in = with_empty_masks({ConstBatch(query.data(), B, Lq, E), k, k, {}, {}}, B, Lq, 0);
                            mha::ForwardOptions opt;
                            opt.backend = backend, opt.need_weights = nw, opt.causal = causal;
                            EXPECT_EQ(m.path(in, opt), mha::AttentionPath::scalar);
                            EXPECT_EQ(m.workspace_bytes(in, opt), 0u);
                            for (bool use_workspace : {false, true}) {
                                std::vector<float> buf(16 + B * Lq * stride + 16, kSentinel);
                                const Batch output(buf.data() + 16, B, Lq, E, stride, Lq * stride);
                                mha::Workspace none;
                                if (use_workspace)
                                    m.forward(in, {output, nullptr}, opt, none);
                                else
                                    m.forward(in, {output, nullptr}, opt);
                                for (std::size_t n = 0; n < buf.size(); ++n) {
                                    const std::size_t at = n - 16, r = at / stride, j = at % stride;
                                    if (n < 16 || n >= 16 + B * Lq * stride || j >= E)
                                        ASSERT_EQ(buf[n], kSentinel) << "written outside the output at " << n;
                                    else if (with_norm)
                                        ASSERT_NEAR(buf[n], expected[r * E + j], 1e-5f * (1.0f + std::fabs(expected[r * E + j]))) << r << ", " << j;
                                    else
                                        ASSERT_EQ(buf[n], expected[r * E + j]) << r << ", " << j;  // the bias, exactly
                                }
                            }
                        }
            }
}

// ---------------------------------------------------------------------------------------------------
// 16-bit activations: the same rules (the output rounded to the inputs' type).

TEST(ZeroSizes, HalfInputs) {
    const Layer layer;
    const mha::MultiheadAttention m = layer.make();
    constexpr std::size_t B = 2, Lq = 3;
    std::vector<std::uint16_t> q(B * Lq * E), around(64, kSentinelBits);
    for (std::size_t n = 0; n < q.size(); ++n) q[n] = mha::bfloat16::from_float(0.01f * static_cast<float>(n)).bits;
    using View = mha::BatchView<const std::uint16_t>;
    using Out = mha::BatchView<std::uint16_t>;
    for (Backend backend : kBackends) {
        SCOPED_TRACE(backend == Backend::scalar ? "scalar" : "simd");
        mha::ForwardOptions opt;
        opt.backend = backend;
        // B = 0 and Lq = 0: nothing written.
        mha::HalfAttentionInputs in;
        in.type = mha::DataType::bf16;
        in.query = View(nullptr, 0, Lq, E);
        EXPECT_NO_THROW(m.forward(in, {Out(nullptr, 0, Lq, E), nullptr}, opt));
        in.query = View(nullptr, B, 0, E);
        in.key = View(q.data(), B, Lq, E);
        EXPECT_NO_THROW(m.forward(in, {Out(around.data() + 8, B, 0, E), nullptr}, opt));
        EXPECT_TRUE(all_equal(around, kSentinelBits));
        // Lk = 0: the bias rows, rounded to bf16.
        in.query = View(q.data(), B, Lq, E);
        in.key = in.value = View(q.data(), B, 0, E);
        std::vector<std::uint16_t> out(B * Lq * E, kSentinelBits);
        m.forward(in, {Out(out.data(), B, Lq, E), nullptr}, opt);
        for (std::size_t n = 0; n < out.size(); ++n) EXPECT_EQ(out[n], mha::bfloat16::from_float(layer.out_b[n % E]).bits) << n;
        // Still validated: the key's batch must be the query's.
        in.query = View(nullptr, 0, Lq, E);
        in.key = View(q.data(), B, Lq, E);
        expect_invalid([&] { m.forward(in, {Out(nullptr, 0, Lq, E), nullptr}, opt); }, "key batch 2 differs from query batch 0");
    }
}

// ---------------------------------------------------------------------------------------------------
// KV cache: Lq = 0 appends nothing (lengths and rows unchanged); B = 0 is refused (the cache's batch is > 0).

TEST(ZeroSizes, KVCacheEmptyStepAppendsNothing) {
    const Layer layer;
    const mha::MultiheadAttention m = layer.make(true, true);
    constexpr std::size_t B = 2, L = 3;
    const std::vector<float> prompt = random_vector(B * L * E, 13);
    for (Backend backend : kBackends) {
        SCOPED_TRACE(backend == Backend::scalar ? "scalar" : "simd");
        mha::ForwardOptions opt;
        opt.backend = backend;
        mha::KVCache cache(B, H, E / H, 8);
        std::vector<float> first(B * L * E);
        m.forward({ConstBatch(prompt.data(), B, L, E), {}, {}, {}, {}}, {Batch(first.data(), B, L, E), nullptr}, opt, cache);
        const std::vector<std::size_t> lengths = cache.lengths();
        const ConstHeads keys = cache.keys(), values = cache.values();
        const std::size_t n = B * H * 8 * (E / H);
        const std::vector<float> k_before(keys.data, keys.data + n), v_before(values.data, values.data + n);

        std::vector<float> around(64, kSentinel);
        const mha::AttentionInputs empty{ConstBatch(nullptr, B, 0, E), {}, {}, {}, {}};
        EXPECT_EQ(m.path(empty, opt, cache), mha::AttentionPath::scalar);
        EXPECT_EQ(m.workspace_bytes(empty, opt, cache), 0u);
        EXPECT_NO_THROW(m.forward(empty, {Batch(nullptr, B, 0, E), nullptr}, opt, cache));
        mha::Workspace none;
        EXPECT_NO_THROW(m.forward(empty, {Batch(around.data() + 8, B, 0, E), nullptr}, opt, cache, none));
        mha::HalfAttentionInputs half;
        half.query = mha::BatchView<const std::uint16_t>(nullptr, B, 0, E);
        EXPECT_NO_THROW(m.forward(half, {mha::BatchView<std::uint16_t>(nullptr, B, 0, E), nullptr}, opt, cache));
        EXPECT_TRUE(all_equal(around, kSentinel));
        EXPECT_EQ(cache.lengths(), lengths);
        EXPECT_EQ(std::vector<float>(keys.data, keys.data + n), k_before);
        EXPECT_EQ(std::vector<float>(values.data, values.data + n), v_before);

        expect_invalid([&] { m.forward({ConstBatch(nullptr, 0, 1, E), {}, {}, {}, {}}, {Batch(nullptr, 0, 1, E), nullptr}, opt, cache); },
                       "query batch 0 differs from the KV cache's batch 2");
        EXPECT_EQ(cache.lengths(), lengths);
    }
}

// ---------------------------------------------------------------------------------------------------
// scaled_dot_product_attention: B = 0 or Lq = 0 writes nothing, Lk = 0 zero rows; heads and d stay > 0.

TEST(ZeroSizes, Sdpa) {
    constexpr std::size_t B = 2, Hq = 4, Hkv = 2, Lq = 3, d = 8, pad = 3, stride = Hq * d + pad;  // [B, Lq, H·d] padded
    const std::vector<float> q = random_vector(B * Hq * Lq * d, 21), kv = random_vector(B * Hkv * 5 * d, 22);
    for (Backend backend : kBackends)
        for (mha::Impl impl : {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused}) {
            SCOPED_TRACE(::testing::Message() << (backend == Backend::scalar ? "scalar" : "simd") << " impl " << static_cast<int>(impl));
            mha::SdpaOptions opt;
            opt.backend = backend, opt.impl = impl;
            std::vector<float> buf(8 + B * Lq * stride + 8, kSentinel);
            const Heads out(buf.data() + 8, B, Hq, Lq, d, Lq * stride, d, stride);
            const auto run = [&](const mha::SdpaInputs& in, const Heads& o) {
                EXPECT_EQ(mha::sdpa_workspace_bytes(in, opt), 0u);
                EXPECT_EQ(mha::sdpa_path(in, opt), mha::AttentionPath::scalar);
                mha::scaled_dot_product_attention(in, o, opt);
                mha::Workspace none;
                mha::scaled_dot_product_attention(in, o, opt, none);
            };
            // B = 0, every view null; Lq = 0 with real keys and a mask.
            mha::SdpaInputs in;
            in.query = ConstHeads(nullptr, 0, Hq, Lq, d, 0, 0, 0);
            in.key = in.value = ConstHeads(nullptr, 0, Hkv, 5, d, 0, 0, 0);
            in.key_padding_mask = MaskView::boolean(nullptr, 0, 5);
            run(in, Heads(nullptr, 0, Hq, Lq, d, 0, 0, 0));
            in.query = ConstHeads::bhld(nullptr, B, Hq, 0, d);
            in.key = in.value = ConstHeads::bhld(kv.data(), B, Hkv, 5, d);
            const std::vector<std::uint8_t> kpm(B * 5, 0);
            in.key_padding_mask = MaskView::boolean(kpm.data(), B, 5);
            in.attn_mask = MaskView::additive(nullptr, B * Hq, 0, 5);
            run(in, Heads(buf.data() + 8, B, Hq, 0, d, Lq * stride, d, stride));
            EXPECT_TRUE(all_equal(buf, kSentinel));
            // Lk = 0: zero rows, padding and the space around untouched.
            in.query = ConstHeads::bhld(q.data(), B, Hq, Lq, d);
            in.key = in.value = ConstHeads::bhld(nullptr, B, Hkv, 0, d);
            in.key_padding_mask = MaskView::boolean(nullptr, B, 0);
            in.attn_mask = MaskView::additive(nullptr, Lq, 0);
            opt.causal = true;
            run(in, out);
            for (std::size_t n = 0; n < buf.size(); ++n) {
                const bool inside = n >= 8 && n < 8 + B * Lq * stride && (n - 8) % stride < Hq * d;
                ASSERT_EQ(buf[n], inside ? 0.0f : kSentinel) << n;
            }
        }
    // Heads and the head dim of 0 stay errors.
    mha::SdpaInputs in;
    in.query = ConstHeads::bhld(q.data(), B, 0, Lq, d);
    in.key = in.value = ConstHeads::bhld(kv.data(), B, Hkv, 5, d);
    std::vector<float> buf(B * Hq * Lq * d, kSentinel);
    expect_invalid([&] { mha::scaled_dot_product_attention(in, Heads::bhld(buf.data(), B, 0, Lq, d)); }, "query has zero heads or head dim [2, 0, 3, 8]");
    in.query = ConstHeads::bhld(q.data(), B, Hq, Lq, d);
    in.key.dim = 0;
    expect_invalid([&] { mha::scaled_dot_product_attention(in, Heads::bhld(buf.data(), B, Hq, Lq, d)); }, "key has zero heads or head dim");
    expect_invalid([&] { (void)mha::sdpa_workspace_bytes(in); }, "key has zero heads or head dim");
    EXPECT_TRUE(all_equal(buf, kSentinel));
}

// The standalone kernels keep refusing zero sizes (they have no PyTorch zero-size counterpart to follow).
TEST(ZeroSizes, KernelsStillRefuseZeroSizes) {
    std::vector<float> x(8, 1.0f);
    expect_invalid([&] { mha::softmax_rows(mha::Matrix(x.data(), 0, 4), 1.0f); }, "x has zero size [0, 4]");
}

}  // namespace
