// MultiheadAttention::forward on 16-bit activations (HalfAttentionInputs): it must equal, bit for bit, the
// fp32 forward on the exactly widened inputs with its output rounded to the same type (mha/half.hpp) —
// for bf16 and f16, strided (sequence-first) views, cross-attention with other widths, bf16 compute, and
// the KV cache overload; and reject a bad type, overlapping output and wrong shapes without writing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <mha/mha.hpp>

namespace {

using mha::DataType;

std::vector<float> random_floats(std::size_t n, unsigned seed, float scale) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

std::uint16_t narrow(float x, DataType t) { return t == DataType::bf16 ? mha::bfloat16::from_float(x).bits : mha::float16::from_float(x).bits; }
float widen(std::uint16_t h, DataType t) { return t == DataType::bf16 ? mha::bfloat16::from_bits(h).to_float() : mha::float16::from_bits(h).to_float(); }

struct Layer {
    std::size_t E = 48, H = 4, kdim = 48, vdim = 48;
    std::vector<float> w_in, w_q, w_k, w_v, w_o, b_in;
    mha::MultiheadAttention make(DataType compute) const {
        mha::AttentionWeights w;
        w.q_proj_weight = w_q.data(), w.k_proj_weight = w_k.data(), w.v_proj_weight = w_v.data();
        w.out_proj_weight = w_o.data(), w.in_proj_bias = b_in.data();
        mha::AttentionConfig c;
        c.embed_dim = E, c.num_heads = H, c.kdim = kdim, c.vdim = vdim, c.compute = compute;
        return mha::MultiheadAttention(w, c);
    }
    Layer(std::size_t kd, std::size_t vd) : kdim(kd), vdim(vd) {
        w_q = random_floats(E * E, 1, 0.15f), w_k = random_floats(E * kdim, 2, 0.15f), w_v = random_floats(E * vdim, 3, 0.15f);
        w_o = random_floats(E * E, 4, 0.15f), b_in = random_floats(3 * E, 5, 0.1f);
    }
};

void check_equal_to_fp32(DataType type, DataType compute, bool cross, bool seq_first) {
    const Layer layer(cross ? 40 : 48, cross ? 24 : 48);
    const auto attn = layer.make(compute);
    const std::size_t B = 3, Lq = 7, Lk = cross ? 9 : 7, E = layer.E;
    // Half inputs (random values rounded to the type), stored batch-first or sequence-first.
    auto store = [&](std::size_t L, std::size_t C, unsigned seed, std::vector<std::uint16_t>& bits) {
        const auto x = random_floats(B * L * C, seed, 1.0f);
        bits.resize(B * L * C);
        for (std::size_t i = 0; i < x.size(); ++i) bits[i] = narrow(x[i], type);
        return seq_first ? mha::BatchView<const std::uint16_t>(bits.data(), B, L, C, B * C, C)
                         : mha::BatchView<const std::uint16_t>(bits.data(), B, L, C);
    };
    std::vector<std::uint16_t> qb, kb, vb;
    mha::HalfAttentionInputs in;
    in.type = type;
    in.query = store(Lq, E, 10, qb);
    if (cross) in.key = store(Lk, layer.kdim, 11, kb), in.value = store(Lk, layer.vdim, 12, vb);
    std::vector<std::uint16_t> yb(B * Lq * E, 0xffff);
    mha::HalfAttentionOutputs out;
    out.output = seq_first ? mha::BatchView<std::uint16_t>(yb.data(), B, Lq, E, B * E, E) : mha::BatchView<std::uint16_t>(yb.data(), B, Lq, E);
    mha::ForwardOptions opt;
    opt.causal = !cross;
    attn.forward(in, out, opt);

    // The same through the fp32 API on widened copies (same layouts).
    auto widened = [&](const std::vector<std::uint16_t>& bits) {
        std::vector<float> f(bits.size());
        for (std::size_t i = 0; i < bits.size(); ++i) f[i] = widen(bits[i], type);
        return f;
    };
    const auto qf = widened(qb), kf = widened(kb), vf = widened(vb);
    auto view = [&](const std::vector<float>& f, std::size_t L, std::size_t C) {
        return seq_first ? mha::ConstBatch(f.data(), B, L, C, B * C, C) : mha::ConstBatch(f.data(), B, L, C);
    };
    mha::AttentionInputs in32;
    in32.query = view(qf, Lq, E);
    if (cross) in32.key = view(kf, Lk, layer.kdim), in32.value = view(vf, Lk, layer.vdim);
    std::vector<float> y(B * Lq * E);
    mha::AttentionOutputs out32;
    out32.output = seq_first ? mha::Batch(y.data(), B, Lq, E, B * E, E) : mha::Batch(y.data(), B, Lq, E);
    attn.forward(in32, out32, opt);
    for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(yb[i], narrow(y[i], type)) << "element " << i;
}

TEST(HalfForward, Bf16SelfAttentionEqualsWidenedFp32) { check_equal_to_fp32(DataType::bf16, DataType::f32, false, false); }
TEST(HalfForward, F16SequenceFirstEqualsWidenedFp32) { check_equal_to_fp32(DataType::f16, DataType::f32, false, true); }
TEST(HalfForward, Bf16CrossAttentionOtherWidths) { check_equal_to_fp32(DataType::bf16, DataType::f32, true, true); }
TEST(HalfForward, Bf16ComputeWithBf16Activations) { check_equal_to_fp32(DataType::bf16, DataType::bf16, false, false); }
TEST(HalfForward, F16CrossAttentionBf16Compute) { check_equal_to_fp32(DataType::f16, DataType::bf16, true, false); }

TEST(HalfForward, KvCacheStepsEqualWidenedFp32) {
    const Layer layer(48, 48);
    const auto attn = layer.make(DataType::f32);
    const std::size_t B = 2, E = 48, d = 12;
    mha::KVCache c16(B, 4, d, 16), c32(B, 4, d, 16);
    for (std::size_t step = 0; step < 3; ++step) {
        const std::size_t L = step == 0 ? 5 : 1;
        const auto x = random_floats(B * L * E, 20 + unsigned(step), 1.0f);
        std::vector<std::uint16_t> xb(x.size()), yb(x.size());
        std::vector<float> xf(x.size()), y(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) xb[i] = narrow(x[i], DataType::bf16), xf[i] = widen(xb[i], DataType::bf16);
        mha::HalfAttentionInputs in;
        in.query = mha::BatchView<const std::uint16_t>(xb.data(), B, L, E);
        mha::HalfAttentionOutputs out;
        out.output = mha::BatchView<std::uint16_t>(yb.data(), B, L, E);
        attn.forward(in, out, {}, c16);
        mha::AttentionInputs in32;
        in32.query = mha::ConstBatch(xf.data(), B, L, E);
        mha::AttentionOutputs out32;
        out32.output = mha::Batch(y.data(), B, L, E);
        attn.forward(in32, out32, {}, c32);
        for (std::size_t i = 0; i < y.size(); ++i) ASSERT_EQ(yb[i], narrow(y[i], DataType::bf16)) << "step " << step << " element " << i;
        EXPECT_EQ(c16.lengths(), c32.lengths());
    }
}

TEST(HalfForward, RejectsBadInputsWithoutWriting) {
    const Layer layer(48, 48);
    const auto attn = layer.make(DataType::f32);
    std::vector<std::uint16_t> x(2 * 3 * 48, 0x3f80), y(2 * 3 * 48, 0x1234);
    mha::HalfAttentionInputs in;
    in.query = mha::BatchView<const std::uint16_t>(x.data(), 2, 3, 48);
    mha::HalfAttentionOutputs out;
    out.output = mha::BatchView<std::uint16_t>(y.data(), 2, 3, 48);
    auto expect_error = [&](const mha::HalfAttentionInputs& i, const mha::HalfAttentionOutputs& o, const char* text) {
        try {
            attn.forward(i, o);
            ADD_FAILURE() << "no error; expected one containing '" << text << "'";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
        }
        for (std::uint16_t v : y) ASSERT_EQ(v, 0x1234);
    };
    mha::HalfAttentionInputs bad = in;
    bad.type = DataType::f32;
    expect_error(bad, out, "must be bf16 or f16, not f32");
    bad = in;
    bad.query = mha::BatchView<const std::uint16_t>(x.data(), 2, 3, 40);
    expect_error(bad, out, "query has 40 features but embed_dim is 48");
    mha::HalfAttentionOutputs alias = out;
    alias.output = mha::BatchView<std::uint16_t>(x.data(), 2, 3, 48);
    expect_error(in, alias, "output overlaps query");
    mha::HalfAttentionOutputs wrong = out;
    wrong.output = mha::BatchView<std::uint16_t>(y.data(), 2, 2, 48);
    expect_error(in, wrong, "output is [2, 2, 48]");
    // The fp32 forward behind this one sees only widened copies: the caller's 16-bit buffers are checked here.
    std::vector<float> weights(2 * 3 * 3, 7.0f);
    mha::ForwardOptions with_weights;
    with_weights.need_weights = mha::NeedWeights::averaged;
    for (std::uint16_t* inside : {y.data(), x.data() + 10}) {
        mha::HalfAttentionOutputs w = out;
        w.attn_weights = reinterpret_cast<float*>(inside);
        const std::vector<std::uint16_t> x0 = x;
        try {
            attn.forward(in, w, with_weights);
            ADD_FAILURE() << "attn_weights inside a 16-bit buffer: no error";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("attn_weights [18 floats] overlaps output, query, key or value"), std::string::npos)
                << e.what();
        }
        for (std::uint16_t v : y) ASSERT_EQ(v, 0x1234);
        ASSERT_EQ(x, x0);
    }
    mha::HalfAttentionOutputs w = out;
    w.attn_weights = weights.data();
    attn.forward(in, w, with_weights);  // apart: runs
    EXPECT_NE(weights[0], 7.0f);
    // With a bf16 cache, an output (or query) inside the cache's storage is refused before anything is appended.
    mha::KVCache cache(2, attn.num_kv_heads(), attn.head_dim(), 8, DataType::bf16);
    auto* storage = const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(cache.key_storage()));
    const std::vector<std::uint16_t> stored(storage, storage + cache.bytes() / 2);
    mha::HalfAttentionOutputs into = out;
    into.output = mha::BatchView<std::uint16_t>(storage + 4, 2, 3, 48);
    mha::HalfAttentionInputs from = in;
    from.query = mha::BatchView<const std::uint16_t>(storage + 4, 2, 3, 48);
    for (const auto& [i, o, text] : {std::tuple{in, into, "output overlaps the KV cache"}, std::tuple{from, out, "query overlaps the KV cache"}}) {
        try {
            attn.forward(i, o, mha::ForwardOptions{}, cache);
            ADD_FAILURE() << "no error; expected " << text;
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
        }
        EXPECT_EQ(cache.lengths()[0], 0u);
        ASSERT_TRUE(std::equal(stored.begin(), stored.end(), storage));
    }
}

}  // namespace
