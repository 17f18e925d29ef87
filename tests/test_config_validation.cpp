// Bad decoder-layer configurations (mha::AttentionConfig, separate q/k/v weights, RoPE) and bad RoPE
// positions at forward: each must throw mha::invalid_argument naming the field and its values, and a
// forward must leave its sentinel-filled output untouched (both backends). Valid edge cases are
// accepted: the accessors report the resolved configuration.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <mha/mha.hpp>

namespace {

constexpr float kSentinel = -12345.0f;

void expect_invalid(const std::function<void()>& f, const std::string& substring) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one mentioning \"" << substring << "\"";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << substring << "\"";
    }
}

// Separate weights for E = 16, H = 4, Hkv = 2, d = 8 (H·d = 32 ≠ E), kdim = 12, vdim = 20.
struct Decoder {
    std::size_t E = 16, H = 4, Hkv = 2, d = 8, kdim = 12, vdim = 20;
    std::vector<float> wq = std::vector<float>(H * d * E, 0.01f), wk = std::vector<float>(Hkv * d * kdim, 0.02f),
                       wv = std::vector<float>(Hkv * d * vdim, 0.03f), wo = std::vector<float>(E * H * d, 0.04f),
                       packed = std::vector<float>((H * d + 2 * Hkv * d) * E, 0.05f), bias = std::vector<float>(H * d + 2 * Hkv * d, 0.1f);
    mha::AttentionConfig config() const {
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = Hkv, c.head_dim = d, c.kdim = kdim, c.vdim = vdim;
        return c;
    }
    mha::AttentionWeights weights() const {
        mha::AttentionWeights w;
        w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wv.data(), w.out_proj_weight = wo.data();
        return w;
    }
};

TEST(ConfigValidation, ResolvedAccessors) {
    const Decoder dec;
    const mha::MultiheadAttention m(dec.weights(), dec.config());
    EXPECT_EQ(m.embed_dim(), 16u);
    EXPECT_EQ(m.num_heads(), 4u);
    EXPECT_EQ(m.num_kv_heads(), 2u);
    EXPECT_EQ(m.head_dim(), 8u);
    EXPECT_EQ(m.kdim(), 12u);
    EXPECT_EQ(m.vdim(), 20u);
    // Defaults: Hkv = H, d = E / H, kdim = vdim = E.
    mha::AttentionConfig c;
    c.embed_dim = 16, c.num_heads = 4;
    mha::AttentionWeights w;
    w.in_proj_weight = dec.packed.data(), w.out_proj_weight = dec.wo.data();
    const mha::MultiheadAttention d(w, c);
    EXPECT_EQ(d.num_kv_heads(), 4u);
    EXPECT_EQ(d.head_dim(), 4u);
    EXPECT_EQ(d.kdim(), 16u);
    EXPECT_EQ(d.vdim(), 16u);
}

TEST(ConfigValidation, HeadsNotMultipleOfKvHeads) {
    const Decoder dec;
    mha::AttentionConfig c = dec.config();
    c.num_kv_heads = 3;
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "num_heads 4 is not a multiple of num_kv_heads 3");
}

TEST(ConfigValidation, ComputeF16IsNotAComputeType) {
    const Decoder dec;
    mha::AttentionConfig c = dec.config();
    c.compute = mha::DataType::f16;
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "compute type f16 is not supported (f32 or bf16");
}

TEST(ConfigValidation, EmbedDimNotMultipleOfHeadsWithoutHeadDim) {
    const Decoder dec;
    mha::AttentionConfig c = dec.config();
    c.num_heads = 3, c.num_kv_heads = 0, c.head_dim = 0;
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "embed_dim 16 is not a multiple of num_heads 3 (set head_dim");
}

TEST(ConfigValidation, BothPackedAndSeparateWeights) {
    const Decoder dec;
    mha::AttentionWeights w = dec.weights();
    w.in_proj_weight = dec.packed.data();
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "both in_proj_weight and q/k/v_proj_weight");
}

TEST(ConfigValidation, MissingSeparateWeight) {
    const Decoder dec;
    mha::AttentionWeights w = dec.weights();
    w.k_proj_weight = nullptr;
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "k_proj_weight is a null pointer");
    w = dec.weights();
    w.q_proj_weight = nullptr;
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "q_proj_weight is a null pointer");
    w = dec.weights();
    w.out_proj_weight = nullptr;
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "out_proj_weight is a null pointer");
    w = {};
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "no q/k/v_proj_weight is given");
}

TEST(ConfigValidation, PackedNeedsKdimAndVdimEqualToEmbedDim) {
    const Decoder dec;
    mha::AttentionWeights w;
    w.in_proj_weight = dec.packed.data(), w.out_proj_weight = dec.wo.data();
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "in_proj_weight needs kdim == vdim == embed_dim (16), but kdim is 12 and vdim 20");
}

TEST(ConfigValidation, BothBiasKinds) {
    const Decoder dec;
    mha::AttentionWeights w = dec.weights();
    w.in_proj_bias = dec.bias.data();
    w.v_proj_bias = dec.bias.data();
    expect_invalid([&] { mha::MultiheadAttention(w, dec.config()); }, "both in_proj_bias and q/k/v_proj_bias");
}

TEST(ConfigValidation, RopeDimsAndTheta) {
    const Decoder dec;
    mha::AttentionConfig c = dec.config();
    c.rope = mha::RopeConfig{10000.0f, 5, mha::RopeStyle::half};
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "rope dims 5 must be even and at most head_dim 8");
    c.rope->dims = 10;
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "rope dims 10 must be even and at most head_dim 8");
    c.rope->dims = 0;
    c.rope->theta = 0.0f;
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "rope theta 0.000000 is not a finite value > 0");
    c.rope->theta = std::numeric_limits<float>::infinity();
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "rope theta inf is not a finite value > 0");
    c.rope->theta = 10000.0f;
    c.rope->style = static_cast<mha::RopeStyle>(7);
    expect_invalid([&] { mha::MultiheadAttention(dec.weights(), c); }, "rope style 7 is not half or interleaved");
    c.rope->style = mha::RopeStyle::interleaved;
    c.rope->dims = 4;  // partial rotary dims are fine
    EXPECT_NO_THROW(mha::MultiheadAttention(dec.weights(), c));
}

// A forward with key/value of the configured kdim/vdim; bad positions are refused before anything is written.
class DecoderForward : public ::testing::TestWithParam<mha::Backend> {
protected:
    Decoder dec;
    std::size_t B = 2, Lq = 3, Lk = 5;
    std::vector<float> query = std::vector<float>(B * Lq * dec.E, 0.5f), key = std::vector<float>(B * Lk * dec.kdim, 0.25f),
                       value = std::vector<float>(B * Lk * dec.vdim, 0.75f), out = std::vector<float>(B * Lq * dec.E, kSentinel);
    mha::AttentionInputs inputs() const {
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), B, Lq, dec.E);
        in.key = mha::ConstBatch(key.data(), B, Lk, dec.kdim);
        in.value = mha::ConstBatch(value.data(), B, Lk, dec.vdim);
        return in;
    }
    bool untouched() const {
        for (float x : out)
            if (x != kSentinel) return false;
        return true;
    }
};

TEST_P(DecoderForward, KeyOfEmbedDimWidthIsRefused) {
    const mha::MultiheadAttention m(dec.weights(), dec.config());
    mha::AttentionInputs in = inputs();
    std::vector<float> wide(B * Lk * dec.E, 0.0f);
    in.key = mha::ConstBatch(wide.data(), B, Lk, dec.E);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    expect_invalid([&] { m.forward(in, {mha::Batch(out.data(), B, Lq, dec.E)}, opt); }, "key has 16 features but kdim is 12");
    // Self-attention (key = query) needs kdim == E.
    in = inputs();
    in.key = {};
    in.value = {};
    expect_invalid([&] { m.forward(in, {mha::Batch(out.data(), B, Lq, dec.E)}, opt); }, "key has 16 features but kdim is 12");
    EXPECT_TRUE(untouched());
}

TEST_P(DecoderForward, PositionsPastTwoToThe53AreRefused) {
    mha::AttentionConfig c = dec.config();
    c.rope = mha::RopeConfig{};
    const mha::MultiheadAttention m(dec.weights(), c);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    opt.position_offset = (std::size_t{1} << 53) - 2;  // + Lk = 5 passes 2^53
    expect_invalid([&] { m.forward(inputs(), {mha::Batch(out.data(), B, Lq, dec.E)}, opt); },
                   "position_offset 9007199254740990 + length 5 exceeds 2^53");
    const std::size_t starts[2] = {0, std::size_t{1} << 60};
    opt.position_offset = 0;
    opt.positions = starts;
    expect_invalid([&] { m.forward(inputs(), {mha::Batch(out.data(), B, Lq, dec.E)}, opt); }, "positions[1] 1152921504606846976");
    EXPECT_TRUE(untouched());
    // Just below the limit is accepted.
    opt.positions = nullptr;
    opt.position_offset = (std::size_t{1} << 53) - 5;
    EXPECT_NO_THROW(m.forward(inputs(), {mha::Batch(out.data(), B, Lq, dec.E)}, opt));
}

TEST_P(DecoderForward, BadCausalAlignment) {
    const mha::MultiheadAttention m(dec.weights(), dec.config());
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    opt.causal = true;
    opt.causal_alignment = static_cast<mha::CausalAlignment>(5);
    expect_invalid([&] { m.forward(inputs(), {mha::Batch(out.data(), B, Lq, dec.E)}, opt); },
                   "causal_alignment 5 is not top_left or bottom_right");
    EXPECT_TRUE(untouched());
}

TEST_P(DecoderForward, AttnMaskIsIndexedByQueryHeads) {
    const mha::MultiheadAttention m(dec.weights(), dec.config());
    std::vector<std::uint8_t> per_kv_head(B * dec.Hkv * Lq * Lk, 0);  // [B·Hkv, Lq, Lk]: the wrong head count
    mha::AttentionInputs in = inputs();
    in.attn_mask = mha::MaskView::boolean(per_kv_head.data(), B * dec.Hkv, Lq, Lk);
    mha::ForwardOptions opt;
    opt.backend = GetParam();
    expect_invalid([&] { m.forward(in, {mha::Batch(out.data(), B, Lq, dec.E)}, opt); }, "[B·H, Lq, Lk] = [8, 3, 5]");
    EXPECT_TRUE(untouched());
}

INSTANTIATE_TEST_SUITE_P(Backends, DecoderForward, ::testing::Values(mha::Backend::scalar, mha::Backend::simd),
                         [](const auto& info) { return info.param == mha::Backend::scalar ? "scalar" : "simd"; });

}  // namespace
