// The SIMD attention backend against the scalar reference over many shapes, every mask kind,
// causal, need_weights and the post-norm block (attention weights of both backends against the double
// oracle of attention_test_util.hpp, per element); bitwise identity across thread counts, each run in a
// TBB arena that really has that many threads; concurrent calls on one object.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <chrono>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "compare_util.hpp"

namespace {

struct Case {
    std::size_t B, Lq, Lk, E, H;
    bool cross = false;
    bool causal = false;
    bool kp_bool = false, kp_float = false;
    int am_rank = 0;  // 0: none, 2 or 3
    bool am_bool = false;
    mha::NeedWeights need = mha::NeedWeights::none;
    bool norm = false;
    mha::Impl impl = mha::Impl::automatic;
};

std::vector<float> random_vector(std::size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

struct Problem {
    Case c;
    std::vector<float> w_in, b_in, w_out, b_out, gamma, beta, q, k, v, kp_f, am_f;
    std::vector<std::uint8_t> kp_b, am_b;
    mha::AttentionInputs in;

    explicit Problem(const Case& cs, unsigned seed = 1) : c(cs) {
        std::mt19937 rng(seed);
        const float w = 1.0f / std::sqrt(static_cast<float>(c.E));
        w_in = random_vector(3 * c.E * c.E, -w, w, rng);
        b_in = random_vector(3 * c.E, -0.1f, 0.1f, rng);
        w_out = random_vector(c.E * c.E, -w, w, rng);
        b_out = random_vector(c.E, -0.1f, 0.1f, rng);
        gamma = random_vector(c.E, 0.5f, 1.5f, rng);
        beta = random_vector(c.E, -0.5f, 0.5f, rng);
        q = random_vector(c.B * c.Lq * c.E, -1, 1, rng);
        in.query = mha::ConstBatch(q.data(), c.B, c.Lq, c.E);
        if (c.cross) {
            k = random_vector(c.B * c.Lk * c.E, -1, 1, rng);
            v = random_vector(c.B * c.Lk * c.E, -1, 1, rng);
            in.key = mha::ConstBatch(k.data(), c.B, c.Lk, c.E);
            in.value = mha::ConstBatch(v.data(), c.B, c.Lk, c.E);
        }
        std::bernoulli_distribution coin(0.3);
        if (c.kp_bool) {
            kp_b.resize(c.B * c.Lk);
            for (auto& x : kp_b) x = coin(rng);
            in.key_padding_mask = mha::MaskView::boolean(kp_b.data(), c.B, c.Lk);
        } else if (c.kp_float) {
            kp_f = random_vector(c.B * c.Lk, -2, 2, rng);
            for (auto& x : kp_f) if (coin(rng)) x = -std::numeric_limits<float>::infinity();
            in.key_padding_mask = mha::MaskView::additive(kp_f.data(), c.B, c.Lk);
        }
        if (c.am_rank) {
            const std::size_t n = (c.am_rank == 3 ? c.B * c.H : 1) * c.Lq * c.Lk;
            if (c.am_bool) {
                am_b.resize(n);
                for (auto& x : am_b) x = coin(rng);
                in.attn_mask = c.am_rank == 3 ? mha::MaskView::boolean(am_b.data(), c.B * c.H, c.Lq, c.Lk)
                                              : mha::MaskView::boolean(am_b.data(), c.Lq, c.Lk);
            } else {
                am_f = random_vector(n, -3, 3, rng);
                in.attn_mask = c.am_rank == 3 ? mha::MaskView::additive(am_f.data(), c.B * c.H, c.Lq, c.Lk)
                                              : mha::MaskView::additive(am_f.data(), c.Lq, c.Lk);
            }
        }
    }

    mha::MultiheadAttention make() const {
        mha::AttentionWeights wt{w_in.data(), b_in.data(), w_out.data(), b_out.data(),
                                 c.norm ? gamma.data() : nullptr, c.norm ? beta.data() : nullptr};
        return mha::MultiheadAttention(wt, c.E, c.H);
    }

    std::size_t weights_size() const {
        if (c.need == mha::NeedWeights::averaged) return c.B * c.Lq * c.Lk;
        if (c.need == mha::NeedWeights::per_head) return c.B * c.H * c.Lq * c.Lk;
        return 0;
    }

    // Runs one backend; returns output followed by the weights.
    std::vector<float> run(const mha::MultiheadAttention& m, mha::Backend backend, int threads = 0) const {
        std::vector<float> out(c.B * c.Lq * c.E, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> wts(weights_size(), std::numeric_limits<float>::quiet_NaN());
        mha::ForwardOptions o;
        o.backend = backend;
        o.causal = c.causal;
        o.need_weights = c.need;
        o.threads = threads;
        o.impl = c.impl;
        if (c.norm) o.norm_eps = 1e-5f;
        m.forward(in, {mha::Batch(out.data(), c.B, c.Lq, c.E), wts.empty() ? nullptr : wts.data()}, o);
        out.insert(out.end(), wts.begin(), wts.end());
        return out;
    }
};

// The output of both backends, compared with each other. Both compute in float with different
// summation orders. Each output passes through two projections (length-E dot products) and one P·V sum
// (length Lk, weights summing to 1): the float error is bounded by about (2E + Lk)·eps times the
// magnitudes involved (inputs, weights ≤ 1, so values stay O(1)); c = 4 covers the softmax's exp error
// and the layernorm rescale (times 8 more under the post-norm, whose 1/σ amplifies the error).
// Only the output part (the first B·Lq·E values) is compared here; see expect_weights.
void expect_close(const Case& c, const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    const std::size_t n = c.B * c.Lq * c.E;
    ASSERT_GE(got.size(), n);
    const std::vector<float> g(got.begin(), got.begin() + std::ptrdiff_t(n)), w(want.begin(), want.begin() + std::ptrdiff_t(n));
    const double max_ref = mha_test::max_abs(w);  // NaN if the scalar output is not finite
    ASSERT_TRUE(std::isfinite(max_ref)) << "the scalar reference output is not finite";
    const double tol = 4.0 * double(2 * c.E + c.Lk) * std::numeric_limits<float>::epsilon() * std::max(1.0, max_ref) *
                       (c.norm ? 8.0 : 1.0);
    ASSERT_TRUE(mha_test::all_within(g, w, tol)) << "output of " << n;
}

// The problem as tests/attention_test_util.hpp's double oracle takes it. Masks are read through the
// views in p.in, so a test that replaces a mask after construction is converted as it runs.
mha_test::Mask oracle_mask(const mha::MaskView& v) {
    mha_test::Mask m;
    m.type = v.type;
    m.rank = v.rank;
    if (!v.present()) return m;
    std::size_t n = 1;
    for (int i = 0; i < v.rank; ++i) m.shape[std::size_t(i)] = v.shape[i], n *= v.shape[i];
    if (v.type == mha::MaskType::boolean) m.bools.assign(v.bools, v.bools + n);
    else m.values.assign(v.values, v.values + n);
    return m;
}

mha_test::Problem oracle_problem(const Problem& p) {
    mha_test::Problem o;
    o.E = p.c.E, o.H = p.c.H, o.B = p.c.B, o.Lq = p.c.Lq, o.Lk = p.c.cross ? p.c.Lk : p.c.Lq;
    o.in_w = p.w_in, o.in_b = p.b_in, o.out_w = p.w_out, o.out_b = p.b_out;
    o.query = p.q, o.key = p.k, o.value = p.v;  // k, v empty for self-attention: = query
    o.key_padding_mask = oracle_mask(p.in.key_padding_mask);
    o.attn_mask = oracle_mask(p.in.attn_mask);
    o.causal = p.c.causal;
    return o;  // the post-norm does not touch the weights
}

// The attention weights (the values after the output part) of both backends, each against the double
// oracle with a per-element bound on probabilities alone (attention_test_util.hpp derives it):
//   a float score ẑ_k = z_k + δ_k with |δ_k| ≤ Δ (projection error γ_{E+1}·Σ|x||w| carried through the
//   d-long dot, plus (d + 3)·u·Σ|q||k|/√d for the dot itself and the scale, plus the mask additions)
//   changes p_j = e^{z_j}/Σ_k e^{z_k} by the factor e^{δ_j}/Σ_k p_k e^{δ_k} ∈ [e^{-2Δ}, e^{2Δ}], so
//   |Δp_j| ≤ p_j·2Δ to first order; evaluating the softmax in float adds one rounding of z − max
//   amplified by exp, the exp itself, Lk − 1 additions in the sum and the division: (Lk + 4)·u·p_j.
//   So |Δp_j| ≤ p_j·(2Δ + (Lk + 4)·u), relative to p_j and independent of the output's magnitude or
//   the post-norm; averaged weights add (H + 1)·u·avg for the float sum over heads and the 1/H.
// The tolerance is c = 2 times that bound. Masked keys have p = 0 and tolerance 0 (exact zeros).
// The old check used the output's bound (times 8 under the post-norm), about 5 % of a probability.
void expect_weights(const Problem& p, const std::vector<float>& simd, const std::vector<float>& scalar) {
    const std::size_t n_out = p.c.B * p.c.Lq * p.c.E;
    ASSERT_EQ(simd.size(), n_out + p.weights_size());
    ASSERT_EQ(scalar.size(), simd.size());
    const mha_test::Expected ex = mha_test::attention_double(oracle_problem(p));
    const bool averaged = p.c.need == mha::NeedWeights::averaged;
    const std::vector<double>& want = averaged ? ex.averaged : ex.probs;
    const std::vector<double>& tol = averaged ? ex.averaged_tol : ex.probs_tol;
    // The bound must be tighter than a 1e-3 relative error on every nonzero probability.
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i)
        if (want[i] > 0.0) worst = std::max(worst, tol[i] / want[i]);
    ASSERT_LT(worst, 1e-3) << "probability bound too loose to catch a 1e-3 relative error";
    const std::vector<float> simd_w(simd.begin() + std::ptrdiff_t(n_out), simd.end());
    const std::vector<float> scalar_w(scalar.begin() + std::ptrdiff_t(n_out), scalar.end());
    EXPECT_TRUE(mha_test::all_within(simd_w, want, tol)) << "SIMD attention weights";
    EXPECT_TRUE(mha_test::all_within(scalar_w, want, tol)) << "scalar attention weights";
}

void check(const Case& c) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " Lq=" << c.Lq << " Lk=" << c.Lk << " E=" << c.E << " H=" << c.H
                                      << " cross=" << c.cross << " causal=" << c.causal << " am=" << c.am_rank);
    Problem p(c);
    auto m = p.make();
    const auto simd = p.run(m, mha::Backend::simd), scalar = p.run(m, mha::Backend::scalar);
    expect_close(c, simd, scalar);
    if (c.need != mha::NeedWeights::none) expect_weights(p, simd, scalar);
}

// Each ISA this CPU has (mha_test::for_each_cpu_isa): the fused path packs K and V into the ISA's GEMM panels
// (32, 16 or 8 columns wide), so each ISA has its own layout.
TEST(SimdAttention, ShapesAndHeadDims) {
    for (std::size_t d : {1, 8, 16, 64, 80})
        for (std::size_t H : {1, 2, 3})
            for (std::size_t L : {1, 7, 65, 130}) check({L % 3 + 1, L, L, d * H, H});
}

TEST(SimdAttention, HeadsFromOneToE) {
    for (std::size_t H : {1, 2, 4, 8, 16, 32}) check({2, 33, 33, 32, H});
}

TEST(SimdAttention, CrossAttention) {
    for (auto [lq, lk] : {std::pair<std::size_t, std::size_t>{1, 9}, {17, 5}, {70, 130}, {130, 64}}) {
        Case c{2, lq, lk, 48, 3};
        c.cross = true;
        check(c);
    }
}

TEST(SimdAttention, EveryMaskKind) {
    for (int kp = 0; kp < 3; ++kp)
        for (int am = 0; am < 5; ++am)
            for (bool causal : {false, true}) {
                Case c{3, 67, 67, 32, 4};
                c.kp_bool = kp == 1;
                c.kp_float = kp == 2;
                c.am_rank = am == 0 ? 0 : (am <= 2 ? 2 : 3);
                c.am_bool = am % 2 == 1;
                c.causal = causal;
                check(c);
                c.cross = true;
                c.Lk = 41;
                check(c);
            }
}

// Weights on every ISA: the materialized path's softmax and GEMMs differ per ISA.
TEST(SimdAttention, NeedWeightsAndPostNorm) {
    mha_test::for_each_cpu_isa([] {
        for (auto need : {mha::NeedWeights::averaged, mha::NeedWeights::per_head})
            for (bool causal : {false, true})
                for (bool norm : {false, true}) {
                    Case c{2, 70, 70, 64, 4};
                    c.need = need;
                    c.causal = causal;
                    c.norm = norm;
                    c.kp_bool = true;
                    check(c);
                }
    });
}

TEST(SimdAttention, FullyMaskedRowGivesBias) {
    Case c{1, 5, 5, 16, 2};
    Problem p(c);
    std::vector<std::uint8_t> mask(5, 1);
    p.in.key_padding_mask = mha::MaskView::boolean(mask.data(), 1, 5);
    auto m = p.make();
    const auto out = p.run(m, mha::Backend::simd);
    for (std::size_t i = 0; i < 5; ++i)
        for (std::size_t j = 0; j < 16; ++j) EXPECT_EQ(out[i * 16 + j], p.b_out[j]);
}

// Records the distinct threads that enter one arena: the caller of execute and each worker that joins.
class ThreadRecorder : public tbb::task_scheduler_observer {
public:
    explicit ThreadRecorder(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) { observe(true); }
    ~ThreadRecorder() override { observe(false); }
    void on_scheduler_entry(bool) override {
        const std::lock_guard<std::mutex> lock(mutex_);
        ids_.insert(std::this_thread::get_id());
    }
    std::size_t count() {
        const std::lock_guard<std::mutex> lock(mutex_);
        return ids_.size();
    }

private:
    std::mutex mutex_;
    std::set<std::thread::id> ids_;
};

// The SIMD output (and weights) computed by 2, 3 and 8 real threads is bitwise equal to one thread's.
// ForwardOptions::threads alone is clamped to what TBB may run (the core count: asking for 8 on a
// 2-core machine ran 2), so each count runs in an arena that really has n threads: a global_control
// lifts TBB's limit to 8 and forward is called with threads = 0 (= the calling arena) inside
// arena.execute. A ThreadRecorder counts the distinct threads that entered the arena; only these
// forward calls run there. Workers join lazily (and slowly on a loaded 2-core machine), so the call is
// repeated, each result compared, until all n threads have taken part, or at least kMinAttempts calls
// and kPatience have passed; for n ≥ 3 more than 2 threads must have taken part (n = 2 may end with
// 1 on a loaded machine; its results are compared all the same).
// One global_control and one arena per count for all attempts: destroying and recreating them per
// call left the workers asleep after a few rounds (oneTBB 2021.8), and no worker joined.
void expect_bitwise_identical_across_threads(const Problem& p, const mha::MultiheadAttention& m) {
    constexpr int kMinAttempts = 10;
    constexpr auto kPatience = std::chrono::seconds(2);
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 8);
    std::vector<float> one;
    for (int n : {1, 2, 3, 8}) {
        tbb::task_arena arena(n);
        arena.initialize();
        ThreadRecorder recorder(arena);
        const auto start = std::chrono::steady_clock::now();
        for (int attempt = 0; recorder.count() < std::size_t(n); ++attempt) {
            if (attempt >= kMinAttempts && std::chrono::steady_clock::now() - start > kPatience) break;
            if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let sleeping workers wake
            std::vector<float> got;
            arena.execute([&] { got = p.run(m, mha::Backend::simd, 0); });
            if (n == 1) {
                one = got;
                continue;
            }
            ASSERT_TRUE(got == one) << n << " threads (" << recorder.count() << " so far), attempt " << attempt;
        }
        if (n == 1) {
            ASSERT_EQ(recorder.count(), 1u) << "the recorder should see the calling thread alone";
        } else if (n >= 3) {
            EXPECT_GT(recorder.count(), 2u) << "an arena of " << n << " threads ran on " << recorder.count();
        }
        ::testing::Test::RecordProperty("threads_" + std::to_string(n), int(recorder.count()));
    }
}

TEST(SimdAttention, BitwiseIdenticalAcrossThreadCounts) {
    for (auto need : {mha::NeedWeights::none, mha::NeedWeights::averaged}) {
        SCOPED_TRACE(need == mha::NeedWeights::none ? "no weights" : "averaged weights");
        // 4 batches × 8 query blocks of 64 rows (× 8 heads without weights): 32 or 256 attention tasks,
        // a few ms per call, long enough for workers to wake up and join.
        Case c{4, 512, 512, 64, 8};
        c.need = need;
        c.kp_bool = true;
        c.causal = true;
        Problem p(c);
        auto m = p.make();
        expect_bitwise_identical_across_threads(p, m);
    }
}

TEST(SimdAttention, ConcurrentCallsOnOneObject) {
    Case c{2, 40, 40, 32, 4};
    c.causal = true;
    Problem p(c);
    const auto m = p.make();
    const auto want = p.run(m, mha::Backend::simd, 1);
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int rep = 0; rep < 5; ++rep) got[t] = p.run(m, mha::Backend::simd, 1 + t % 2);
        });
    for (auto& t : threads) t.join();
    for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(SimdAttention, StridedInputsMatchContiguous) {
    Case c{2, 9, 9, 16, 2};
    Problem p(c);
    auto m = p.make();
    const auto want = p.run(m, mha::Backend::simd);
    // The same query with row stride 21 and batch stride 9·21 + 5, padding full of NaN.
    std::vector<float> padded(2 * (9 * 21 + 5), std::numeric_limits<float>::quiet_NaN());
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 9; ++i)
            for (std::size_t j = 0; j < 16; ++j) padded[b * (9 * 21 + 5) + i * 21 + j] = p.q[(b * 9 + i) * 16 + j];
    p.in.query = mha::ConstBatch(padded.data(), 2, 9, 16, 21, 9 * 21 + 5);
    EXPECT_EQ(p.run(m, mha::Backend::simd), want);
}

}  // namespace

namespace {

// The fused path (online softmax over key tiles of 256) against the reference on every ISA: lengths
// around the tile, every mask kind, causal, cross-attention.
TEST(FusedAttention, LengthsAroundTheTile) {
    mha_test::for_each_cpu_isa([] {
        for (std::size_t L : {1, 2, 255, 256, 257, 513}) {
            Case c{1, L, L, 32, 2};
            c.impl = mha::Impl::fused;
            c.causal = L % 2 == 1;
            check(c);
        }
    });
}

// Head dims that are not a multiple of any panel width (d = 24, 40) and one wider than two AVX-512
// panels (d = 80).
TEST(FusedAttention, HeadDimsAcrossPanels) {
    mha_test::for_each_cpu_isa([] {
        for (std::size_t E : {48, 80, 160}) {
            Case c{2, 300, 300, E, 2};
            c.impl = mha::Impl::fused;
            check(c);
        }
    });
}

TEST(FusedAttention, EveryMaskKindAndCross) {
    mha_test::for_each_cpu_isa([] {
        for (int kp = 0; kp < 3; ++kp)
            for (int am = 0; am < 5; ++am)
                for (bool causal : {false, true}) {
                    Case c{2, 70, 300, 32, 4};
                    c.impl = mha::Impl::fused;
                    c.cross = true;
                    c.kp_bool = kp == 1;
                    c.kp_float = kp == 2;
                    c.am_rank = am == 0 ? 0 : (am <= 2 ? 2 : 3);
                    c.am_bool = am % 2 == 1;
                    c.causal = causal;
                    check(c);
                }
    });
}

TEST(FusedAttention, FullyPaddedTilesAndRows) {
    Case c{2, 300, 600, 16, 2};
    c.impl = mha::Impl::fused;
    c.cross = true;
    Problem p(c);
    // Batch 0: keys 0..299 padded (whole first tile skipped); batch 1: every key padded.
    std::vector<std::uint8_t> mask(2 * 600, 0);
    for (std::size_t j = 0; j < 300; ++j) mask[j] = 1;
    for (std::size_t j = 600; j < 1200; ++j) mask[j] = 1;
    p.in.key_padding_mask = mha::MaskView::boolean(mask.data(), 2, 600);
    auto m = p.make();
    const auto got = p.run(m, mha::Backend::simd);
    expect_close(c, got, p.run(m, mha::Backend::scalar));
    for (std::size_t i = 0; i < 300; ++i)
        for (std::size_t j = 0; j < 16; ++j) ASSERT_EQ(got[(300 + i) * 16 + j], p.b_out[j]);
}

TEST(FusedAttention, NeedWeightsFallsBackToMaterialized) {
    mha_test::for_each_cpu_isa([] {
        Case c{1, 40, 40, 16, 2};
        c.impl = mha::Impl::fused;
        c.need = mha::NeedWeights::per_head;
        check(c);
    });
}

// 8 heads × 5 query blocks of 128: 40 fused tasks per call.
TEST(FusedAttention, BitwiseIdenticalAcrossThreadCounts) {
    Case c{1, 600, 600, 64, 8};
    c.impl = mha::Impl::fused;
    c.causal = true;
    Problem p(c);
    auto m = p.make();
    mha_test::for_each_cpu_isa([&] { expect_bitwise_identical_across_threads(p, m); });
}

}  // namespace
