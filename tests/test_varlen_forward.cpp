// MultiheadAttention::forward_varlen (a packed batch of independent sequences, no cache): each sequence's rows
// bitwise equal forward on that sequence alone, causal or not, for shapes that take the decode, materialized
// and grouped core paths, with RoPE restarting per sequence, bf16 compute, 1 / 2 / 3 threads, any order and
// strided x / y, on every ISA of this CPU; causal outputs against the float64 evaluation of each sequence
// (decode_test_util.hpp); empty sequences and batches; the refusals (nothing written); Backend::scalar (the
// reference on each sequence alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "decode_test_util.hpp"
#include "isa_test_util.hpp"

namespace {

using mha_decode_test::DecoderLayer;
using mha_decode_test::uniform;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

mha::MultiheadAttention make_layer(const DecoderLayer& l, mha::DataType compute) {
    mha::AttentionConfig c;
    c.embed_dim = l.E, c.num_heads = l.H, c.num_kv_heads = l.Hkv, c.head_dim = l.d, c.rope = l.rope, c.compute = compute;
    mha::AttentionWeights w;
    w.q_proj_weight = l.wq.data(), w.k_proj_weight = l.wk.data(), w.v_proj_weight = l.wv.data(), w.out_proj_weight = l.wo.data();
    w.q_proj_bias = DecoderLayer::ptr(l.bq), w.k_proj_bias = DecoderLayer::ptr(l.bk), w.v_proj_bias = DecoderLayer::ptr(l.bv);
    w.out_proj_bias = DecoderLayer::ptr(l.bo);
    return mha::MultiheadAttention(w, c);
}

// forward on one sequence alone: [1, L, E].
std::vector<float> alone(const mha::MultiheadAttention& m, const float* x, std::size_t L, std::size_t E, bool causal,
                         mha::Backend backend = mha::Backend::simd) {
    std::vector<float> y(L * E, kNaN);
    if (L == 0) return y;
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(x, 1, L, E);
    mha::ForwardOptions opt;
    opt.causal = causal;
    opt.backend = backend;
    m.forward(in, {mha::Batch(y.data(), 1, L, E)}, opt);
    return y;
}

using mha_test::same_bits;

// The sequences packed in `order` into rows of stride `stride` >= E; returns y (stride `stride`) and the starts.
std::vector<float> run_packed(const mha::MultiheadAttention& m, const std::vector<std::vector<float>>& x,
                              const std::vector<std::size_t>& order, std::size_t E, std::size_t stride, bool causal, int threads,
                              std::vector<std::size_t>& starts, mha::Backend backend = mha::Backend::simd) {
    starts.assign(1, 0);
    for (std::size_t k : order) starts.push_back(starts.back() + x[k].size() / E);
    const std::size_t T = starts.back();
    std::vector<float> packed(T * stride, kNaN), y(T * stride, kNaN);
    for (std::size_t j = 0; j < order.size(); ++j)
        for (std::size_t r = 0; r < x[order[j]].size() / E; ++r)
            std::copy_n(x[order[j]].data() + r * E, E, packed.data() + (starts[j] + r) * stride);
    m.forward_varlen(mha::ConstMatrix(packed.data(), T, E, stride), mha::Matrix(y.data(), T, E, stride), starts.data(),
                     order.size(), causal, threads, backend);
    return y;
}

struct Shape {
    std::size_t E, H, Hkv, d;
};

void expect_each_alone(const DecoderLayer& layer, mha::DataType compute, const std::vector<std::size_t>& lengths, std::uint32_t seed) {
    const std::size_t E = layer.E;
    const mha::MultiheadAttention m = make_layer(layer, compute);
    std::vector<std::vector<float>> x;
    for (std::size_t i = 0; i < lengths.size(); ++i) x.push_back(uniform(lengths[i] * E, 1.0f, seed + std::uint32_t(i)));
    for (bool causal : {false, true}) {
        std::vector<std::vector<float>> want;
        for (std::size_t i = 0; i < x.size(); ++i) want.push_back(alone(m, x[i].data(), lengths[i], E, causal));
        for (int threads : {1, 2, 3}) {
            std::vector<std::size_t> order(x.size());
            std::iota(order.begin(), order.end(), 0);
            if (threads == 2) std::reverse(order.begin(), order.end());
            const std::size_t stride = threads == 3 ? E + 5 : E;
            std::vector<std::size_t> starts;
            const std::vector<float> y = run_packed(m, x, order, E, stride, causal, threads, starts);
            for (std::size_t j = 0; j < order.size(); ++j) {
                const std::size_t i = order[j];
                for (std::size_t r = 0; r < lengths[i]; ++r)
                    ASSERT_TRUE(same_bits(y.data() + (starts[j] + r) * stride, want[i].data() + r * E, E))
                        << "sequence " << i << " (length " << lengths[i] << "), row " << r << ", causal " << causal << ", threads "
                        << threads << ", compute " << mha::data_type_name(compute);
            }
        }
    }
}

// Lengths: decode path (<= 16 queries), materialized / grouped, one empty, a tail of 130 (> 2 row blocks).
const std::vector<std::size_t> kLengths = {5, 37, 1, 0, 130, 16, 70};

TEST(ForwardVarlen, EachSequenceEqualsForwardAlone) {
    mha_test::for_each_cpu_isa([&] {
        for (const Shape& sh : {Shape{64, 8, 2, 16}, Shape{48, 3, 3, 16}}) {
            for (bool rope : {false, true}) {
                SCOPED_TRACE("H " + std::to_string(sh.H) + ", Hkv " + std::to_string(sh.Hkv) + ", rope " + std::to_string(rope));
                std::optional<mha::RopeConfig> rc;
                if (rope) rc = mha::RopeConfig{};
                const DecoderLayer layer(sh.E, sh.H, sh.Hkv, sh.d, rc, true, false, 961);
                expect_each_alone(layer, mha::DataType::f32, kLengths, 70);
            }
        }
    });
}

// MHA past kFusedMinKeys (1024 keys: the grouped path) beside short sequences.
TEST(ForwardVarlen, LongSequenceOnTheGroupedPath) {
    const DecoderLayer layer(48, 3, 3, 16, mha::RopeConfig{}, true, false, 962);
    expect_each_alone(layer, mha::DataType::f32, {3, 1030, 20}, 80);
}

// E 128 too: a one-row projection alone takes several B panels per register tile on AVX512_BF16 (at least four
// full panels of 32 columns), the same rows packed with others one panel per tile. d 8 at E 64: V_h's bf16
// panels (32 columns) then take twice the floats of NEON's fp32 ones (8 columns), and with the grouped path's
// value region sized for the fp32 ones only, the second KV head's values ran into the threads' slots: a sequence
// alone gave other bits than packed on neon_bf16 (Bf16Simd.GroupedScratchHoldsTheBf16Panels pins the sizes).
TEST(ForwardVarlen, Bf16ComputeEqualsForwardAlone) {
    mha_test::for_each_cpu_isa([&] {
        for (std::size_t E : {std::size_t(64), std::size_t(128)}) {
            SCOPED_TRACE("E " + std::to_string(E));
            const DecoderLayer layer(E, 8, 2, E / 8, mha::RopeConfig{}, true, false, 963);
            expect_each_alone(layer, mha::DataType::bf16, kLengths, 90);
        }
    }, true);
}

// Causal rows against the float64 evaluation of each sequence on its own (a fresh sequence: causal over itself).
TEST(ForwardVarlen, CausalAgreesWithAFloat64EvaluationOfEachSequence) {
    const DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, true, false, 964);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64;
    const std::vector<std::size_t> lengths = {9, 40, 1};
    std::vector<std::vector<float>> x;
    for (std::size_t i = 0; i < lengths.size(); ++i) x.push_back(uniform(lengths[i] * E, 1.0f, 100 + std::uint32_t(i)));
    std::vector<std::size_t> starts;
    const std::vector<float> y = run_packed(m, x, {0, 1, 2}, E, E, true, 0, starts);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(layer.ref(), x[i].data(), 1, lengths[i], nullptr);
        const std::vector<float> got(y.begin() + std::ptrdiff_t(starts[i] * E), y.begin() + std::ptrdiff_t(starts[i + 1] * E));
        const std::vector<double> tol = mha_decode_test::times(ex.out_err, mha_test::kDecoderSafety);
        EXPECT_TRUE(mha_test::all_within(got, ex.out, tol)) << "sequence " << i;
        EXPECT_LT(mha_test::relative_tolerance(ex.out, tol), 1e-3) << "bound too loose to catch anything";
    }
}

// Backend::scalar: each sequence through the reference alone (bitwise forward with Backend::scalar on it), in
// any order and stride; causal rows within the float64 bound; the validation before it (nothing written).
TEST(ForwardVarlen, ScalarBackendRunsTheReferenceOnEachSequence) {
    const DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, true, false, 966);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64;
    const std::vector<std::size_t> lengths = {5, 0, 37, 1};
    std::vector<std::vector<float>> x;
    for (std::size_t i = 0; i < lengths.size(); ++i) x.push_back(uniform(lengths[i] * E, 1.0f, 200 + std::uint32_t(i)));
    for (bool causal : {false, true}) {
        for (int threads : {1, 2}) {
            const std::vector<std::size_t> order = threads == 1 ? std::vector<std::size_t>{0, 1, 2, 3} : std::vector<std::size_t>{3, 2, 1, 0};
            const std::size_t stride = threads == 1 ? E : E + 3;
            std::vector<std::size_t> starts;
            const std::vector<float> y = run_packed(m, x, order, E, stride, causal, threads, starts, mha::Backend::scalar);
            const std::vector<float> simd = run_packed(m, x, order, E, stride, causal, threads, starts);
            for (std::size_t j = 0; j < order.size(); ++j) {
                const std::size_t i = order[j];
                const std::vector<float> want = alone(m, x[i].data(), lengths[i], E, causal, mha::Backend::scalar);
                for (std::size_t r = 0; r < lengths[i]; ++r)
                    ASSERT_TRUE(same_bits(y.data() + (starts[j] + r) * stride, want.data() + r * E, E))
                        << "sequence " << i << ", row " << r << ", causal " << causal << ", threads " << threads;
                if (!causal || lengths[i] == 0) continue;
                const mha_decode_test::StepExpected ex = mha_decode_test::step_double(layer.ref(), x[i].data(), 1, lengths[i], nullptr);
                const std::vector<double> tol = mha_decode_test::times(ex.out_err, mha_test::kDecoderSafety);
                for (const std::vector<float>* got : {&y, &simd}) {
                    std::vector<float> rows;
                    for (std::size_t r = 0; r < lengths[i]; ++r)
                        rows.insert(rows.end(), got->begin() + std::ptrdiff_t((starts[j] + r) * stride),
                                    got->begin() + std::ptrdiff_t((starts[j] + r) * stride + E));
                    EXPECT_TRUE(mha_test::all_within(rows, ex.out, tol)) << "sequence " << i << (got == &y ? " scalar" : " simd");
                }
            }
        }
    }
    std::vector<float> y(6 * E, 7.0f);
    const std::vector<std::size_t> bad = {0, 4, 2};
    EXPECT_THROW(m.forward_varlen(mha::ConstMatrix(x[2].data(), 2, E), mha::Matrix(y.data(), 2, E), bad.data(), 2, true, 0,
                                  mha::Backend::scalar),
                 mha::invalid_argument);
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
}

TEST(ForwardVarlen, EmptyBatchesAndRefusals) {
    const DecoderLayer layer(64, 8, 2, 16, std::nullopt, true, false, 965);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64;
    // No sequence, and only empty sequences: nothing to do.
    const std::size_t none[] = {0}, empties[] = {0, 0, 0};
    m.forward_varlen(mha::ConstMatrix(nullptr, 0, E), mha::Matrix(nullptr, 0, E), none, 0);
    m.forward_varlen(mha::ConstMatrix(nullptr, 0, E), mha::Matrix(nullptr, 0, E), empties, 2, true);
    const std::vector<float> x = uniform(6 * E, 1.0f, 9);
    auto refused = [&](const std::vector<std::size_t>& starts, std::size_t n, std::size_t T, const std::string& words,
                       const float* xp = nullptr) {
        std::vector<float> y(8 * E, 7.0f);
        try {
            m.forward_varlen(mha::ConstMatrix(xp ? xp : x.data(), T, E), mha::Matrix(y.data(), T, E), starts.data(), n);
            ADD_FAILURE() << "accepted: " << words;
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
    };
    refused({1, 3}, 1, 2, "seq_starts[0] is 1 but must be 0");
    refused({0, 4, 2}, 2, 2, "seq_starts[2] = 2 is below seq_starts[1] = 4");
    refused({0, 2, 6}, 2, 5, "T = seq_starts[sequences]");
    {  // a Backend value that is neither scalar nor simd
        std::vector<float> y(6 * E, 7.0f);
        const std::size_t starts[] = {0, 6};
        try {
            m.forward_varlen(mha::ConstMatrix(x.data(), 6, E), mha::Matrix(y.data(), 6, E), starts, 1, false, 0, static_cast<mha::Backend>(7));
            ADD_FAILURE() << "backend 7 accepted";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("backend 7 is not scalar or simd"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
    }
    EXPECT_THROW(m.forward_varlen(mha::ConstMatrix(x.data(), 6, E), mha::Matrix(const_cast<float*>(x.data()), 6, E),
                                  std::vector<std::size_t>{0, 6}.data(), 1),
                 mha::invalid_argument);  // y overlaps x
    EXPECT_THROW(m.forward_varlen(mha::ConstMatrix(x.data(), 6, E), mha::Matrix(nullptr, 6, E), nullptr, 1), mha::invalid_argument);
    // Cross-attention layers (kdim != E) are refused.
    mha::AttentionConfig c;
    c.embed_dim = E, c.num_heads = 8, c.kdim = 32, c.vdim = 32;
    const std::vector<float> wq = uniform(E * E, 0.1f, 1), wk = uniform(E * 32, 0.1f, 2), wo = uniform(E * E, 0.1f, 3);
    mha::AttentionWeights w;
    w.q_proj_weight = wq.data(), w.k_proj_weight = wk.data(), w.v_proj_weight = wk.data(), w.out_proj_weight = wo.data();
    const mha::MultiheadAttention cross(w, c);
    std::vector<float> y(6 * E);
    EXPECT_THROW(cross.forward_varlen(mha::ConstMatrix(x.data(), 6, E), mha::Matrix(y.data(), 6, E),
                                      std::vector<std::size_t>{0, 6}.data(), 1),
                 mha::invalid_argument);
}

}  // namespace
