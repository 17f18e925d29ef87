// Bad input at the public API: each case must throw mha::invalid_argument (a std::invalid_argument)
// whose message names the argument and the values, and must leave the output buffer (filled with a
// sentinel) untouched. Every forward/kernel case runs with both backends: validation comes first.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <mha/mha.hpp>

namespace {

using mha::Backend;
using mha::Batch;
using mha::ConstBatch;
using mha::ConstMatrix;
using mha::Matrix;
using mha::MaskView;
using mha::NeedWeights;
using mha::Trans;

static_assert(std::is_base_of_v<std::invalid_argument, mha::invalid_argument>);

constexpr float kSentinel = -12345.0f;
constexpr float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();

// Runs f and expects mha::invalid_argument whose message contains `substring`.
void expect_invalid(const std::function<void()>& f, const std::string& substring) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one mentioning \"" << substring << "\"";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << substring << "\"";
    }
}

bool all_equal(const std::vector<float>& v, float value) {
    for (float x : v)
        if (x != value) return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Construction

struct Weights {
    static constexpr std::size_t E = 8;
    std::vector<float> in_w = std::vector<float>(3 * E * E, 0.1f), in_b = std::vector<float>(3 * E, 0.0f),
                       out_w = std::vector<float>(E * E, 0.1f), out_b = std::vector<float>(E, 0.0f);
    mha::AttentionWeights get() const { return {in_w.data(), in_b.data(), out_w.data(), out_b.data()}; }
};

TEST(ApiValidation, EmbedDimZero) {
    const Weights w;
    expect_invalid([&] { mha::MultiheadAttention(w.get(), 0, 2); }, "embed_dim is 0");
}

TEST(ApiValidation, NumHeadsZero) {
    const Weights w;
    expect_invalid([&] { mha::MultiheadAttention(w.get(), 8, 0); }, "num_heads is 0");
}

TEST(ApiValidation, EmbedDimNotMultipleOfHeads) {
    const std::vector<float> in_w(3 * 10 * 10, 0.0f), out_w(10 * 10, 0.0f);
    try {
        mha::MultiheadAttention(mha::AttentionWeights{in_w.data(), nullptr, out_w.data()}, 10, 3);
        ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {  // catchable as the standard type
        EXPECT_STREQ(e.what(), "embed_dim 10 is not a multiple of num_heads 3");
    }
}

TEST(ApiValidation, NullInProjWeight) {
    Weights w;
    auto a = w.get();
    a.in_proj_weight = nullptr;
    expect_invalid([&] { mha::MultiheadAttention(a, 8, 2); }, "in_proj_weight is a null pointer");
}

TEST(ApiValidation, NullOutProjWeight) {
    Weights w;
    auto a = w.get();
    a.out_proj_weight = nullptr;
    expect_invalid([&] { mha::MultiheadAttention(a, 8, 2); }, "out_proj_weight is a null pointer");
}

// ---------------------------------------------------------------------------------------------
// forward: E = 8, H = 2, B = 2, Lq = 3, Lk = 4 (cross-attention), valid unless a test breaks it.

class ForwardValidation : public testing::Test {
protected:
    static constexpr std::size_t E = 8, H = 2, B = 2, Lq = 3, Lk = 4;
    Weights w;
    mha::MultiheadAttention attention{w.get(), E, H};
    std::vector<float> query = std::vector<float>(B * Lq * E, 0.5f), key = std::vector<float>(B * Lk * E, 0.25f),
                       value = std::vector<float>(B * Lk * E, 0.75f);
    std::vector<float> output = std::vector<float>(B * Lq * E, kSentinel),
                       weights = std::vector<float>(B * H * Lq * Lk, kSentinel);
    std::vector<std::uint8_t> kpm_bytes = std::vector<std::uint8_t>(B * Lk, 0);
    std::vector<float> mask_values = std::vector<float>(B * H * Lq * Lk, 0.0f);

    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    mha::ForwardOptions opt;

    void SetUp() override {
        in.query = ConstBatch(query.data(), B, Lq, E);
        in.key = ConstBatch(key.data(), B, Lk, E);
        in.value = ConstBatch(value.data(), B, Lk, E);
        out.output = Batch(output.data(), B, Lq, E);
        out.attn_weights = weights.data();
    }

    // forward with the current arguments must throw, with both backends, and write nothing.
    void expect_rejected(const std::string& substring) {
        for (Backend backend : {Backend::scalar, Backend::simd}) {
            SCOPED_TRACE(backend == Backend::scalar ? "scalar" : "simd");
            opt.backend = backend;
            expect_invalid([&] { attention.forward(in, out, opt); }, substring);
            EXPECT_TRUE(all_equal(output, kSentinel)) << "output written";
            EXPECT_TRUE(all_equal(weights, kSentinel)) << "attn_weights written";
        }
    }
};

TEST_F(ForwardValidation, ValidArgumentsPass) {
    // The baseline every other test breaks one thing of: it must be accepted.
    in.key_padding_mask = MaskView::boolean(kpm_bytes.data(), B, Lk);
    in.attn_mask = MaskView::additive(mask_values.data(), B * H, Lq, Lk);
    opt.need_weights = NeedWeights::per_head;
    opt.norm_eps = 1e-5f;
    for (Backend backend : {Backend::scalar, Backend::simd}) {
        opt.backend = backend;
        EXPECT_NO_THROW(attention.forward(in, out, opt));
    }
    EXPECT_FALSE(all_equal(output, kSentinel));
}

TEST_F(ForwardValidation, NullQuery) {
    in.query.data = nullptr;
    expect_rejected("query is a null pointer");
}

TEST_F(ForwardValidation, NullOutput) {
    out.output.data = nullptr;
    expect_rejected("output is a null pointer");
}

// Zero B, Lq and Lk are valid calls (tests/test_zero_sizes.cpp), but the other views must still agree.
TEST_F(ForwardValidation, ZeroBatch) {
    in.query.batch = 0;
    expect_rejected("key batch 2 differs from query batch 0");
}

TEST_F(ForwardValidation, ZeroQueryLength) {
    in.query.rows = 0;
    expect_rejected("output is [2, 3, 8] but must be [B, Lq, E] = [2, 0, 8]");
}

TEST_F(ForwardValidation, ZeroKeyLength) {
    in.key.rows = 0;
    expect_rejected("value length 4 differs from key length 0");
}

TEST_F(ForwardValidation, ZeroFeatures) {
    in.query.cols = 0;
    expect_rejected("query has 0 features but embed_dim is 8");
    in.query.cols = E;
    in.value.cols = 0;
    expect_rejected("value has 0 features but vdim is 8");
}

TEST_F(ForwardValidation, QueryWrongFeatureCount) {
    in.query = ConstBatch(query.data(), B, Lq, 6);
    expect_rejected("query has 6 features but embed_dim is 8");
}

TEST_F(ForwardValidation, KeyWrongFeatureCount) {
    in.key = ConstBatch(key.data(), B, Lk, 7);
    expect_rejected("key has 7 features but kdim is 8");
}

TEST_F(ForwardValidation, ValueWrongFeatureCount) {
    in.value = ConstBatch(value.data(), B, Lk, 4);
    expect_rejected("value has 4 features but vdim is 8");
}

TEST_F(ForwardValidation, KeyBatchMismatch) {
    in.key.batch = 1;
    expect_rejected("key batch 1 differs from query batch 2");
}

TEST_F(ForwardValidation, ValueBatchMismatch) {
    in.value.batch = 1;
    expect_rejected("value batch 1 differs from query batch 2");
}

TEST_F(ForwardValidation, ValueLengthMismatch) {
    in.value.rows = 3;
    expect_rejected("value length 3 differs from key length 4");
}

TEST_F(ForwardValidation, OutputWrongShape) {
    out.output = Batch(output.data(), B, 2, E);
    expect_rejected("output is [2, 2, 8] but must be [B, Lq, E] = [2, 3, 8]");
}

TEST_F(ForwardValidation, InputRowsMayOverlap) {
    // Inputs may use any strides: rows that overlap (row stride 7 < 8 columns) and a batch stride of 0
    // (one matrix broadcast to both batches) are read, never written. Same result as the copied layout.
    for (std::size_t i = 0; i < query.size(); ++i) query[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    in.query = ConstBatch(query.data(), B, Lq, E, 7, 0);
    std::vector<float> copied(B * Lq * E);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t j = 0; j < E; ++j) copied[(b * Lq + i) * E + j] = query[i * 7 + j];
    mha::AttentionInputs contiguous = in;
    contiguous.query = ConstBatch(copied.data(), B, Lq, E);
    for (Backend backend : {Backend::scalar, Backend::simd}) {
        opt.backend = backend;
        std::vector<float> want(B * Lq * E);
        attention.forward(contiguous, {Batch(want.data(), B, Lq, E)}, opt);
        attention.forward(in, out, opt);
        EXPECT_EQ(output, want);
    }
}

TEST_F(ForwardValidation, OutputRowStrideSmallerThanRow) {
    out.output.row_stride = 5;
    expect_rejected("output rows overlap each other (row stride 5, batch stride 24, 8 columns)");
}

TEST_F(ForwardValidation, OutputBatchStrideOverlapsRows) {
    out.output.batch_stride = 23;  // one [3, 8] matrix needs 24
    expect_rejected("output rows overlap each other (row stride 8, batch stride 23, 8 columns)");
}

TEST_F(ForwardValidation, OutputSequenceFirstRowsOverlap) {
    // [Lq, B, E] layout with a row stride one short of B·E: batch 1 of row i overlaps row i + 1.
    out.output = Batch(output.data(), B, Lq, E, B * E - 1, E);
    expect_rejected("output rows overlap each other (row stride 15, batch stride 8, 8 columns)");
}

TEST_F(ForwardValidation, OutputSequenceFirstAccepted) {
    out.output = Batch(output.data(), B, Lq, E, B * E, E);
    opt.need_weights = NeedWeights::none;
    EXPECT_NO_THROW(attention.forward(in, out, opt));
}

TEST_F(ForwardValidation, RowStrideExtentOverflows) {
    // (rows − 1)·row_stride wraps size_t: must be refused, not computed modulo 2^64.
    in.key.row_stride = std::size_t{1} << 63;  // 3 · 2^63 wraps
    expect_rejected("key extent (rows − 1)·row_stride + cols overflows the address space");
}

TEST_F(ForwardValidation, BatchStrideExtentOverflows) {
    in.value.batch_stride = ~std::size_t{0} - 5;
    expect_rejected("value extent (batch − 1)·batch_stride + … overflows the address space");
}

TEST_F(ForwardValidation, ExtentPastAddressSpace) {
    // Fits in size_t as elements but not as bytes after the pointer.
    in.query.batch_stride = std::size_t{1} << 61;
    expect_rejected("query spans");
}

TEST_F(ForwardValidation, OutputExtentOverflows) {
    out.output.batch_stride = ~std::size_t{0} - 3;
    expect_rejected("output extent (batch − 1)·batch_stride + … overflows the address space");
}

TEST_F(ForwardValidation, KeyPaddingMaskWrongShape) {
    in.key_padding_mask = MaskView::boolean(kpm_bytes.data(), B, Lq);
    expect_rejected("key_padding_mask has shape [2, 3] but must be [B, Lk] = [2, 4]");
}

TEST_F(ForwardValidation, KeyPaddingMaskWrongRank) {
    in.key_padding_mask = MaskView::boolean(kpm_bytes.data(), 1, B, Lk);
    expect_rejected("key_padding_mask has shape [1, 2, 4] but must be [B, Lk] = [2, 4]");
}

TEST_F(ForwardValidation, AttnMask2DWrongShape) {
    in.attn_mask = MaskView::additive(mask_values.data(), Lk, Lq);
    expect_rejected("attn_mask has shape [4, 3] but must be [Lq, Lk] = [3, 4] or [B·H, Lq, Lk] = [4, 3, 4]");
}

TEST_F(ForwardValidation, AttnMask3DWrongShape) {
    in.attn_mask = MaskView::boolean(kpm_bytes.data(), B, Lq, Lk);  // B instead of B·H
    expect_rejected("attn_mask has shape [2, 3, 4]");
}

TEST_F(ForwardValidation, MaskRankOutOfRange) {
    // MaskView::shape holds 3 dimensions; a larger rank must be rejected, not read past the array.
    in.attn_mask = MaskView::additive(mask_values.data(), Lq, Lk);
    in.attn_mask.rank = 5;
    expect_rejected("attn_mask has rank 5 but must be 2 or 3");
}

TEST_F(ForwardValidation, MaskUnknownType) {
    in.key_padding_mask = MaskView::boolean(kpm_bytes.data(), B, Lk);
    in.key_padding_mask.type = static_cast<mha::MaskType>(7);
    expect_rejected("key_padding_mask has an unknown mask type 7");
}

TEST_F(ForwardValidation, BooleanMaskWithNullData) {
    in.key_padding_mask = MaskView::boolean(nullptr, B, Lk);
    expect_rejected("key_padding_mask is boolean with a null pointer");
}

TEST_F(ForwardValidation, AdditiveMaskWithNullData) {
    in.attn_mask = MaskView::additive(nullptr, Lq, Lk);
    expect_rejected("attn_mask is additive with a null pointer");
}

TEST_F(ForwardValidation, NeedWeightsWithoutBuffer) {
    opt.need_weights = NeedWeights::averaged;
    out.attn_weights = nullptr;
    expect_rejected("need_weights is set but attn_weights is a null pointer");
}

TEST_F(ForwardValidation, OutOfRangeNeedWeights) {
    opt.need_weights = static_cast<NeedWeights>(5);
    expect_rejected("need_weights 5 is not none, averaged or per_head");
}

TEST_F(ForwardValidation, OutOfRangeImpl) {
    opt.impl = static_cast<mha::Impl>(7);
    expect_rejected("impl 7 is not automatic, materialized or fused");
}

TEST_F(ForwardValidation, OutOfRangeBackend) {
    opt.backend = static_cast<Backend>(3);
    expect_invalid([&] { attention.forward(in, out, opt); }, "backend 3 is not scalar or simd");
    EXPECT_TRUE(all_equal(output, kSentinel)) << "output written";
}

TEST_F(ForwardValidation, NegativeThreads) {
    opt.threads = -1;
    expect_rejected("threads -1 is negative");
}

TEST_F(ForwardValidation, NegativeNormEps) {
    opt.norm_eps = -1e-5f;
    expect_rejected("norm_eps -0.000010 is not a finite value >= 0");
}

TEST_F(ForwardValidation, NaNNormEps) {
    opt.norm_eps = std::numeric_limits<float>::quiet_NaN();
    expect_rejected("is not a finite value >= 0");
}

TEST_F(ForwardValidation, InfiniteNormEps) {
    opt.norm_eps = std::numeric_limits<float>::infinity();
    expect_rejected("norm_eps inf is not a finite value >= 0");
}

TEST_F(ForwardValidation, OutputOverlapsQuery) {
    // The output is the query buffer itself: nothing in it may change.
    std::vector<float> shared(B * Lq * E + 4, 0.5f);
    in.query = ConstBatch(shared.data(), B, Lq, E);
    out.output = Batch(shared.data() + 4, B, Lq, E);
    expect_rejected("output overlaps query, key or value");
    EXPECT_TRUE(all_equal(shared, 0.5f));
}

TEST_F(ForwardValidation, OutputOverlapsValue) {
    std::vector<float> shared(B * Lk * E, 0.75f);
    in.value = ConstBatch(shared.data(), B, Lk, E);
    out.output = Batch(shared.data() + E, B, Lq, E);  // [2, 3, 8] fits inside [2, 4, 8]
    expect_rejected("output overlaps query, key or value");
    EXPECT_TRUE(all_equal(shared, 0.75f));
}

TEST_F(ForwardValidation, AttnWeightsOverlapOutput) {
    opt.need_weights = NeedWeights::averaged;
    out.attn_weights = output.data() + 3;
    expect_rejected("attn_weights [24 floats] overlaps output, query, key or value");
}

TEST_F(ForwardValidation, MovedFromObject) {
    mha::MultiheadAttention taken = std::move(attention);
    expect_invalid([&] { attention.forward(in, out, opt); }, "the attention object was moved from");  // NOLINT
    EXPECT_TRUE(all_equal(output, kSentinel));
}

TEST_F(ForwardValidation, MovedFromAccessorsReturnZero) {
    mha::MultiheadAttention taken = std::move(attention);
    EXPECT_EQ(taken.embed_dim(), E);
    EXPECT_EQ(attention.embed_dim(), 0u);  // NOLINT(bugprone-use-after-move): documented
    EXPECT_EQ(attention.num_heads(), 0u);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(attention.head_dim(), 0u);   // NOLINT(bugprone-use-after-move)
}

TEST_F(ForwardValidation, AttnWeightsOverlapKeyPaddingMask) {
    // Weights written over the float key-padding mask they are computed from.
    std::vector<float> shared(B * H * Lq * Lk, 0.0f);
    in.key_padding_mask = MaskView::additive(shared.data(), B, Lk);
    opt.need_weights = NeedWeights::averaged;
    out.attn_weights = shared.data() + 2;
    expect_rejected("attn_weights [24 floats] overlaps key_padding_mask");
    EXPECT_TRUE(all_equal(shared, 0.0f));
}

TEST_F(ForwardValidation, AttnWeightsOverlapBoolAttnMask) {
    std::vector<float> shared(B * H * Lq * Lk + 8, 0.0f);
    in.attn_mask = MaskView::boolean(reinterpret_cast<const std::uint8_t*>(shared.data() + 5), Lq, Lk);
    opt.need_weights = NeedWeights::per_head;
    out.attn_weights = shared.data();
    expect_rejected("attn_weights [48 floats] overlaps attn_mask");
}

TEST_F(ForwardValidation, OutputOverlapsMask) {
    // The output written over the float attn_mask it is computed from (batch 1's rows are read after
    // batch 0's output is written by the reference).
    std::vector<float> shared(B * H * Lq * Lk + B * Lq * E, 0.0f);
    in.attn_mask = MaskView::additive(shared.data(), B * H, Lq, Lk);
    out.output = Batch(shared.data() + 8, B, Lq, E);
    expect_rejected("output overlaps attn_mask");
    EXPECT_TRUE(all_equal(shared, 0.0f));
}

TEST_F(ForwardValidation, ScalarBuffersOverflowWithBroadcastInputs) {
    // Inputs may repeat one row (stride 0), so Lq and Lk are not bounded by real memory; the output view
    // is valid address arithmetic (never touched). The scalar backend's [Lq, Lk] scores (2^80 floats)
    // must be refused, not wrapped; the SIMD backend's scratch (2^49 bytes) cannot be allocated.
    // The query row and the output's first row share one buffer, the query first, so the output view's extent
    // lies above the query wherever the heap puts the buffer (separate vectors overlap it when the query's
    // happens to sit above the output's).
    const std::size_t L = std::size_t{1} << 40;
    std::vector<float> buffer(2 * E, kSentinel);
    std::fill(buffer.begin(), buffer.begin() + E, 0.5f);
    in.query = ConstBatch(buffer.data(), B, L, E, 0, 0);
    in.key = in.value = mha::ConstBatch();
    out.output = Batch(buffer.data() + E, B, L, E, E, L * E);
    opt.backend = Backend::scalar;
    expect_invalid([&] { attention.forward(in, out, opt); }, "the scalar backend's scores overflows the address space");
    opt.backend = Backend::simd;
    EXPECT_THROW(attention.forward(in, out, opt), std::bad_alloc);
    EXPECT_TRUE(all_equal(std::vector<float>(buffer.begin() + E, buffer.end()), kSentinel));
}

TEST_F(ForwardValidation, NeedWeightsRangeCheckedFirst) {
    // An out-of-range need_weights with a null attn_weights: the range is reported, not the pointer
    // (the value is checked before it is used to size anything).
    opt.need_weights = static_cast<NeedWeights>(7);
    out.attn_weights = nullptr;
    expect_rejected("need_weights 7 is not none, averaged or per_head");
}


// ---------------------------------------------------------------------------------------------
// Kernels: A [3, 4], B [4, 2], C [3, 2]; the output (C, x for softmax, y for layernorm) holds a sentinel.

class KernelValidation : public testing::Test {
protected:
    std::vector<float> a = std::vector<float>(3 * 4, 1.0f), b = std::vector<float>(4 * 2, 1.0f),
                       c = std::vector<float>(3 * 2 + 8, kSentinel);

    void expect_gemm_rejected(ConstMatrix av, Trans ta, ConstMatrix bv, Trans tb, Matrix cv,
                              const std::string& substring, const std::vector<float>* untouched = nullptr,
                              float untouched_value = kSentinel) {
        for (Backend backend : {Backend::scalar, Backend::simd}) {
            expect_invalid([&] { mha::gemm(1.0f, av, ta, bv, tb, 0.0f, cv, backend); }, substring);
            EXPECT_TRUE(all_equal(untouched ? *untouched : c, untouched_value)) << "output written";
        }
    }
};

TEST_F(KernelValidation, GemmInnerDimensionsDiffer) {
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::no, ConstMatrix(b.data(), 2, 4), Trans::no,
                         Matrix(c.data(), 3, 4), "gemm inner dimensions differ: op(A) is [3, 4] and op(B) is [2, 4]");
}

TEST_F(KernelValidation, GemmInnerDimensionsDifferTransposed) {
    // Ta = yes: A [3, 4] is op(A) = [4, 3]; B [4, 2] has K = 4, not 3.
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::yes, ConstMatrix(b.data(), 4, 2), Trans::no,
                         Matrix(c.data(), 4, 2), "op(A) is [4, 3] and op(B) is [4, 2]");
}

TEST_F(KernelValidation, GemmOutputShapeWrong) {
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::no, ConstMatrix(b.data(), 4, 2), Trans::no,
                         Matrix(c.data(), 2, 3), "C is [2, 3] but op(A)·op(B) is [3, 2]");
}

TEST_F(KernelValidation, GemmCOverlapsA) {
    // C [3, 2] placed inside A [3, 4]; neither may change.
    std::vector<float> shared(3 * 4, 1.0f);
    expect_gemm_rejected(ConstMatrix(shared.data(), 3, 4), Trans::no, ConstMatrix(b.data(), 4, 2), Trans::no,
                         Matrix(shared.data() + 2, 3, 2, 4), "C overlaps A or B", &shared, 1.0f);
}

TEST_F(KernelValidation, GemmCOverlapsB) {
    std::vector<float> shared(4 * 2, 1.0f);
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::no, ConstMatrix(shared.data(), 4, 2), Trans::no,
                         Matrix(shared.data() + 1, 3, 2), "C overlaps A or B", &shared, 1.0f);
}

TEST_F(KernelValidation, GemmNullA) {
    expect_gemm_rejected(ConstMatrix(nullptr, 3, 4), Trans::no, ConstMatrix(b.data(), 4, 2), Trans::no,
                         Matrix(c.data(), 3, 2), "A is a null pointer");
}

TEST_F(KernelValidation, GemmNullC) {
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::no, ConstMatrix(b.data(), 4, 2), Trans::no,
                         Matrix(nullptr, 3, 2), "C is a null pointer");
}

TEST_F(KernelValidation, GemmZeroSize) {
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 0), Trans::no, ConstMatrix(b.data(), 0, 2), Trans::no,
                         Matrix(c.data(), 3, 2), "A has zero size [3, 0]");
}

TEST_F(KernelValidation, GemmStrideSmallerThanCols) {
    expect_gemm_rejected(ConstMatrix(a.data(), 3, 4), Trans::no, ConstMatrix(b.data(), 4, 2, 1), Trans::no,
                         Matrix(c.data(), 3, 2), "B stride 1 is smaller than its row of 2 columns");
}

TEST_F(KernelValidation, SoftmaxMaskShape) {
    std::vector<float> x(3 * 5, kSentinel), mask(2 * 5, 0.0f);
    for (Backend backend : {Backend::scalar, Backend::simd})
        expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 3, 5), 1.0f, ConstMatrix(mask.data(), 2, 5), backend); },
                       "mask is [2, 5] but x is [3, 5]");
    EXPECT_TRUE(all_equal(x, kSentinel));
}

TEST_F(KernelValidation, SoftmaxMaskOverlapsX) {
    std::vector<float> x(3 * 5 + 2, kSentinel);
    for (Backend backend : {Backend::scalar, Backend::simd})
        expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 3, 5), 1.0f, ConstMatrix(x.data() + 2, 3, 5), backend); },
                       "mask overlaps x");
    EXPECT_TRUE(all_equal(x, kSentinel));
}

TEST_F(KernelValidation, SoftmaxNullX) {
    for (Backend backend : {Backend::scalar, Backend::simd})
        expect_invalid([&] { mha::softmax_rows(Matrix(nullptr, 3, 5), 1.0f, {}, backend); }, "x is a null pointer");
}

TEST_F(KernelValidation, SoftmaxZeroSize) {
    std::vector<float> x(5, kSentinel);
    for (Backend backend : {Backend::scalar, Backend::simd})
        expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 0, 5), 1.0f, {}, backend); }, "x has zero size [0, 5]");
    EXPECT_TRUE(all_equal(x, kSentinel));
}

TEST_F(KernelValidation, SoftmaxStrideSmallerThanCols) {
    std::vector<float> x(3 * 5, kSentinel);
    for (Backend backend : {Backend::scalar, Backend::simd})
        expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 3, 5, 4), 1.0f, {}, backend); },
                       "x stride 4 is smaller than its row of 5 columns");
    EXPECT_TRUE(all_equal(x, kSentinel));
}

// Enum values cast from integers, and a non-finite softmax scale: refused by every kernel, nothing written.
TEST_F(KernelValidation, EnumsOutOfRangeAndNonFiniteScale) {
    const ConstMatrix av(a.data(), 3, 4), bv(b.data(), 4, 2);
    const Matrix cv(c.data(), 3, 2);
    const auto bad_backend = static_cast<Backend>(5);
    expect_invalid([&] { mha::gemm(1.0f, av, Trans::no, bv, Trans::no, 0.0f, cv, bad_backend); }, "backend 5 is not scalar or simd");
    expect_invalid([&] { mha::gemm_bf16(1.0f, av, Trans::no, bv, Trans::no, 0.0f, cv, bad_backend); }, "backend 5 is not scalar or simd");
    const ConstMatrix square(a.data(), 2, 2);
    const Matrix c2(c.data(), 2, 2);
    for (Backend backend : {Backend::scalar, Backend::simd}) {
        expect_invalid([&] { mha::gemm(1.0f, square, static_cast<Trans>(5), square, Trans::no, 0.0f, c2, backend); },
                       "ta 5 is not Trans::no or Trans::yes");
        expect_invalid([&] { mha::gemm_bf16(1.0f, square, Trans::no, square, static_cast<Trans>(2), 0.0f, c2, backend); },
                       "tb 2 is not Trans::no or Trans::yes");
    }
    EXPECT_TRUE(all_equal(c, kSentinel)) << "output written";
    std::vector<float> x(3 * 5, kSentinel), y(3 * 5, kSentinel);
    expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 3, 5), 1.0f, {}, bad_backend); }, "backend 5 is not scalar or simd");
    for (Backend backend : {Backend::scalar, Backend::simd})
        for (float scale : {kInf, -kInf, kNaN})
            expect_invalid([&] { mha::softmax_rows(Matrix(x.data(), 3, 5), scale, {}, backend); }, "is not finite");
    expect_invalid([&] { mha::layernorm_rows(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 5), nullptr, nullptr, 1e-5f, {}, bad_backend); },
                   "backend 5 is not scalar or simd");
    EXPECT_TRUE(all_equal(x, kSentinel));
    EXPECT_TRUE(all_equal(y, kSentinel));
}

class LayernormValidation : public testing::Test {
protected:
    std::vector<float> x = std::vector<float>(3 * 5, 1.0f), y = std::vector<float>(3 * 5, kSentinel),
                       res = std::vector<float>(3 * 5, 1.0f);

    void expect_rejected(ConstMatrix xv, Matrix yv, float eps, ConstMatrix rv, const std::string& substring) {
        for (Backend backend : {Backend::scalar, Backend::simd})
            expect_invalid([&] { mha::layernorm_rows(xv, yv, nullptr, nullptr, eps, rv, backend); }, substring);
        EXPECT_TRUE(all_equal(y, kSentinel)) << "y written";
        EXPECT_TRUE(all_equal(x, 1.0f) && all_equal(res, 1.0f)) << "inputs written";
    }
};

TEST_F(LayernormValidation, YShape) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 4), 1e-5f, {}, "y is [3, 4] but x is [3, 5]");
}

TEST_F(LayernormValidation, ResidualShape) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 5), 1e-5f, ConstMatrix(res.data(), 2, 5),
                    "residual is [2, 5] but x is [3, 5]");
}

TEST_F(LayernormValidation, NegativeEps) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 5), -1.0f, {}, "eps -1.000000 is not a finite value >= 0");
}

TEST_F(LayernormValidation, NaNEps) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 5), std::nanf(""), {}, "is not a finite value >= 0");
}

TEST_F(LayernormValidation, YPartlyOverlapsX) {
    // Same memory is allowed (in place); shifted by one element is not.
    expect_rejected(ConstMatrix(x.data(), 2, 5), Matrix(x.data() + 1, 2, 5), 1e-5f, {},
                    "y overlaps x without being the same memory");
}

TEST_F(LayernormValidation, YPartlyOverlapsResidual) {
    expect_rejected(ConstMatrix(x.data(), 2, 5), Matrix(res.data() + 5, 2, 5), 1e-5f, ConstMatrix(res.data(), 2, 5),
                    "y overlaps residual without being the same memory");
}

TEST_F(LayernormValidation, NullX) {
    expect_rejected(ConstMatrix(nullptr, 3, 5), Matrix(y.data(), 3, 5), 1e-5f, {}, "x is a null pointer");
}

TEST_F(LayernormValidation, NullY) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(nullptr, 3, 5), 1e-5f, {}, "y is a null pointer");
}

TEST_F(LayernormValidation, ZeroSize) {
    expect_rejected(ConstMatrix(x.data(), 3, 0), Matrix(y.data(), 3, 0), 1e-5f, {}, "x has zero size [3, 0]");
}

TEST_F(LayernormValidation, StrideSmallerThanCols) {
    expect_rejected(ConstMatrix(x.data(), 3, 5), Matrix(y.data(), 3, 5, 3), 1e-5f, {},
                    "y stride 3 is smaller than its row of 5 columns");
}

}  // namespace
