// Links the installed library and uses the public API the way a program would, compiled with whatever
// standard the consumer's CMake gives it (C++17 must be enough): view conversions, a kernel, ISA
// names, bad-input exceptions and an attention forward whose answer is known: with one head, E = 2,
// identity projections, zero biases and the causal mask, query row 0 sees only key 0, so its output
// row equals its input row and its attention weights are [1, 0].
#include <cstdio>
#include <type_traits>
#include <vector>

#include <mha/mha.hpp>

#ifdef MHA_CONSUMER_EXPECT_CPLUSPLUS
static_assert(__cplusplus == MHA_CONSUMER_EXPECT_CPLUSPLUS, "the consumer was not compiled with the standard asked for");
#endif

// A view of T converts implicitly to a view of const T, and to nothing else.
static_assert(std::is_convertible_v<mha::Matrix, mha::ConstMatrix>);
static_assert(!std::is_convertible_v<mha::ConstMatrix, mha::Matrix>);
static_assert(!std::is_constructible_v<mha::Matrix, mha::ConstMatrix>);
static_assert(!std::is_convertible_v<mha::MatrixView<int>, mha::ConstMatrix>);
static_assert(std::is_convertible_v<mha::Batch, mha::ConstBatch>);
static_assert(!std::is_convertible_v<mha::ConstBatch, mha::Batch>);
static_assert(std::is_trivially_copyable_v<mha::ConstBatch>);

static int failures = 0;
static void check(bool ok, const char* what) {
    if (!ok) {
        std::printf("FAILED: %s\n", what);
        ++failures;
    }
}

int main() {
    // gemm on mutable views passed where const views are expected: C = A·Bᵀ.
    std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1}, c(4, -1.0f);
    mha::Matrix am(a.data(), 2, 2), bm(b.data(), 2, 2);
    mha::gemm(1.0f, am, mha::Trans::no, bm, mha::Trans::yes, 0.0f, mha::Matrix(c.data(), 2, 2));
    check(c == a, "gemm with an identity B");
    const mha::ConstMatrix row1 = am.row_block(1, 1);
    check(row1(0, 1) == 4.0f, "row_block of a converted view");

    check(mha::isa_name(mha::Isa::avx2) == "avx2", "isa_name");
    try {
        mha::parse_isa("mmx");
        check(false, "parse_isa throws on a bad name");
    } catch (const mha::invalid_argument&) {
    }

    const float in_proj[3 * 2 * 2] = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1};
    const float out_proj[2 * 2] = {1, 0, 0, 1};
    mha::MultiheadAttention attn({in_proj, nullptr, out_proj, nullptr}, 2, 1);
    check(attn.head_dim() == 2, "head_dim");

    std::vector<float> query = {0.25f, -0.5f, 1.0f, 2.0f};  // [B 1, L 2, E 2]
    std::vector<float> out(4, 0.0f), weights(4, -1.0f);
    mha::Batch query_mut(query.data(), 1, 2, 2);
    mha::AttentionInputs in;
    in.query = query_mut;  // Batch → ConstBatch
    mha::ForwardOptions opt;
    opt.causal = true;
    opt.need_weights = mha::NeedWeights::averaged;
    opt.threads = 1;
    attn.forward(in, {mha::Batch(out.data(), 1, 2, 2), weights.data()}, opt);
    check(out[0] == 0.25f && out[1] == -0.5f, "causal row 0 attends to itself only");
    check(weights[0] == 1.0f && weights[1] == 0.0f, "row 0's attention weights");
    check(weights[2] + weights[3] > 0.999f && weights[2] + weights[3] < 1.001f, "row 1's weights sum to 1");

    try {
        mha::MultiheadAttention bad({in_proj, nullptr, out_proj, nullptr}, 2, 3);
        check(false, "3 heads of E = 2 is rejected");
    } catch (const mha::invalid_argument&) {
    }

    std::printf("mha %s (C++ %ld): %g %g, %d failures\n", mha::version(), static_cast<long>(__cplusplus), out[0],
                out[1], failures);
    return failures == 0 ? 0 : 1;
}
