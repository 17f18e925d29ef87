// The public mha::scaled_dot_product_attention (mha/sdpa.hpp): the SIMD backend against the scalar one
// on every ISA this CPU has and every impl, with q/k/v as [B, H, L, d], [B, L, H, d] or [L, B, H, d] and the
// output as [B, H, Lq, d], [B, Lq, H·d] or [Lq, B, H·d]; mixed layouts, stride-0 heads, padded output rows;
// grouped-query heads against MHA with K/V repeated per head; MQA; scale;
// causal in both alignments; every mask kind and rank; fully masked rows; the masked-NaN rule; the
// validation of every argument (mha::invalid_argument naming it, nothing written); the Workspace.
//
// Tolerances (attention_test_util.hpp, core_double): a double evaluation of the same formula carries a
// bound on the error of a float evaluation of it, per output element, of the form c·u·(growth with d and
// Lk)·(magnitude of the terms), u = 2^-24, T = ⌈Lk / 256⌉ key tiles, g(n) = min(n, 6·√n):
//   scores   |Δz_j| ≤ g(d + 3)·u·scale·Σ|q||k| + 2u·(|s| + |masks|)
//   context  |Δc| ≤ Σ_j p_j·|Δz_j|·|v_j − c| + Σ_j p_j·((4 + 3T)·u + 2u·|z_j − max z|)·|v_j|
//                  + (g(Lk) + 2T)·u·Σ_j p_j|v_j| + (g(Lk) + 2 + 3T)·u·|c|
// (score errors move c by Σ p_j δ_j (v_j − c) to first order; the rounding of the softmax's sum and
// division scales every p_j alike; the P·V sum has Lk terms). Each backend is within kDecoderSafety (2)
// times that bound of the exact value, so |simd − scalar| ≤ 2·2·bound; the scalar backend is also
// checked against the double value (2·bound), which pins the semantics (causal offsets, masks, GQA head
// mapping) and not only the agreement of two backends. The bounds are 3e-5 to 4e-4 of the largest output
// (checked: < kMaxRelativeBound), against measured differences near 1e-6 of it; ToleranceCatchesOneKey
// checks that a single key more or less is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "compare_util.hpp"

namespace {

using mha::ConstHeads;
using mha::Heads;
using mha_test::CoreExpected;
using mha_test::HeadsD;

// [B, H, L, d], [B, L, H, d] (= [B, L, H·d]) or sequence-first [L, B, H, d] (= [L, B, H·d]).
enum class Layout { bhld, blhd, lbhd };

const char* layout_name(Layout l) { return l == Layout::bhld ? "bhld" : l == Layout::blhd ? "blhd" : "lbhd"; }

struct Shape {
    std::size_t B, H, Hkv, Lq, Lk, d;
};

// Index of element (b, h, i, c) of a contiguous [B, H, L, d] tensor stored in layout l.
std::size_t index_of(Layout l, std::size_t B, std::size_t H, std::size_t L, std::size_t d, std::size_t b, std::size_t h,
                     std::size_t i, std::size_t c) {
    if (l == Layout::bhld) return ((b * H + h) * L + i) * d + c;
    if (l == Layout::blhd) return ((b * L + i) * H + h) * d + c;
    return ((i * B + b) * H + h) * d + c;
}

// x (canonical [B, H, L, d]) stored in layout l.
std::vector<float> to_layout(const std::vector<float>& x, Layout l, std::size_t B, std::size_t H, std::size_t L, std::size_t d) {
    std::vector<float> y(x.size());
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t c = 0; c < d; ++c) y[index_of(l, B, H, L, d, b, h, i, c)] = x[((b * H + h) * L + i) * d + c];
    return y;
}

template <class T>
mha::HeadsView<T> view(T* p, Layout l, std::size_t B, std::size_t H, std::size_t L, std::size_t d) {
    if (l == Layout::bhld) return mha::HeadsView<T>::bhld(p, B, H, L, d);
    if (l == Layout::blhd) return mha::HeadsView<T>::blhd(p, B, L, H, d);
    return mha::HeadsView<T>(p, B, H, L, d, H * d, d, B * H * d);
}

// A random problem. The values depend on the seed only, not on the layout: q in [-2, 2] (peaked
// softmax rows), k and v in [-1, 1].
struct Problem {
    Shape s;
    Layout layout = Layout::bhld;
    std::vector<float> q, k, v;  // stored in `layout`
    mha_test::Mask key_padding_mask, attn_mask;
    mha::SdpaOptions opt;

    Problem(Shape shape, Layout l, std::uint32_t seed) : s(shape), layout(l) {
        q = to_layout(mha_test::random_floats(s.B * s.H * s.Lq * s.d, -2.0f, 2.0f, seed), l, s.B, s.H, s.Lq, s.d);
        k = to_layout(mha_test::random_floats(s.B * s.Hkv * s.Lk * s.d, -1.0f, 1.0f, seed + 1), l, s.B, s.Hkv, s.Lk, s.d);
        v = to_layout(mha_test::random_floats(s.B * s.Hkv * s.Lk * s.d, -1.0f, 1.0f, seed + 2), l, s.B, s.Hkv, s.Lk, s.d);
    }
    ConstHeads qv() const { return view(q.data(), layout, s.B, s.H, s.Lq, s.d); }
    ConstHeads kv() const { return view(k.data(), layout, s.B, s.Hkv, s.Lk, s.d); }
    ConstHeads vv() const { return view(v.data(), layout, s.B, s.Hkv, s.Lk, s.d); }
    mha::SdpaInputs inputs() const { return {qv(), kv(), vv(), key_padding_mask.view(), attn_mask.view()}; }
    float scale() const { return opt.scale ? *opt.scale : 1.0f / std::sqrt(static_cast<float>(s.d)); }

    // The output of one call, returned as canonical [B, H, Lq, d] whatever layout it was written in.
    std::vector<float> run(mha::Backend backend, mha::Impl impl, Layout out_layout = Layout::bhld, int threads = 0) const {
        std::vector<float> out(s.B * s.H * s.Lq * s.d, std::numeric_limits<float>::quiet_NaN());
        mha::SdpaOptions o = opt;
        o.backend = backend;
        o.impl = impl;
        o.threads = threads;
        mha::scaled_dot_product_attention(inputs(), view(out.data(), out_layout, s.B, s.H, s.Lq, s.d), o);
        std::vector<float> canonical(out.size());
        for (std::size_t b = 0; b < s.B; ++b)
            for (std::size_t h = 0; h < s.H; ++h)
                for (std::size_t i = 0; i < s.Lq; ++i)
                    for (std::size_t c = 0; c < s.d; ++c)
                        canonical[((b * s.H + h) * s.Lq + i) * s.d + c] = out[index_of(out_layout, s.B, s.H, s.Lq, s.d, b, h, i, c)];
        return canonical;
    }

    CoreExpected expected() const {
        mha_test::CoreSpec spec;
        spec.scale = double(scale());
        spec.causal = opt.causal;
        spec.alignment = opt.causal_alignment;
        spec.key_padding_mask = key_padding_mask.view();
        spec.attn_mask = attn_mask.view();
        return mha_test::core_double(HeadsD::from(qv()), HeadsD::from(kv()), HeadsD::from(vv()), spec);
    }
};

constexpr float kPadding = 777.0f;  // memory next to an output that no call may write

std::vector<double> scaled(const std::vector<double>& bound, double c) {
    std::vector<double> t(bound);
    for (double& x : t) x *= c;
    return t;
}

std::vector<double> as_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

// The largest |simd − scalar| bound relative to the largest output must stay below this (see above).
constexpr double kMaxRelativeBound = 1e-3;

// The scalar backend against the double value, and the bound's own usefulness.
void expect_scalar_exact_within(const std::vector<float>& scalar, const CoreExpected& ex) {
    const std::vector<double> tol = scaled(ex.ctx.err, mha_test::kDecoderSafety);
    ASSERT_LT(mha_test::relative_tolerance(ex.ctx.val, mha_test::backend_difference_bound(ex.ctx.err)), kMaxRelativeBound)
        << "the bound is too loose to catch anything";
    EXPECT_TRUE(mha_test::all_within(scalar, ex.ctx.val, tol)) << "scalar backend against the double evaluation";
}

void expect_simd_matches_scalar(const std::vector<float>& simd, const std::vector<float>& scalar, const CoreExpected& ex) {
    ASSERT_TRUE(mha_test::all_within(simd, as_double(scalar), mha_test::backend_difference_bound(ex.ctx.err)))
        << "SIMD against scalar";
}

constexpr mha::Impl kImpls[] = {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused};
const char* impl_name(mha::Impl i) {
    return i == mha::Impl::automatic ? "automatic" : i == mha::Impl::materialized ? "materialized" : "fused";
}

// The problem's scalar result (checked against the double value), then every ISA × impl × output layout
// of the SIMD backend against it.
void check_all_paths(const Problem& p, const std::vector<Layout>& out_layouts = {Layout::bhld, Layout::blhd, Layout::lbhd}) {
    const CoreExpected ex = p.expected();
    const std::vector<float> scalar = p.run(mha::Backend::scalar, mha::Impl::automatic);
    expect_scalar_exact_within(scalar, ex);
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls)
            for (Layout ol : out_layouts) {
                SCOPED_TRACE(::testing::Message() << impl_name(impl) << ", output " << layout_name(ol));
                expect_simd_matches_scalar(p.run(mha::Backend::simd, impl, ol), scalar, ex);
            }
    });
}

#define TRACE_SHAPE(p)                                                                                                 \
    SCOPED_TRACE(::testing::Message() << "B=" << (p).s.B << " H=" << (p).s.H << " Hkv=" << (p).s.Hkv << " Lq=" << (p).s.Lq \
                                      << " Lk=" << (p).s.Lk << " d=" << (p).s.d << " in " << layout_name((p).layout))

// ---------------------------------------------------------------------------------------------------
// Numerics

TEST(SdpaApi, SimdMatchesScalarEveryLayout) {
    // GQA G = 4 over three key tiles; MHA with a long-ish tail; MQA with a one-row decode step; odd d.
    // Also: d = 1 and d = 3 with one key; G = 160 > 128 stacked rows (one query row per grouped task).
    const Shape shapes[] = {{2, 8, 2, 37, 300, 64}, {1, 4, 4, 65, 257, 80}, {2, 6, 1, 1, 63, 32}, {1, 2, 1, 7, 7, 128},
                            {2, 4, 2, 130, 65, 24},  {1, 2, 1, 3, 1, 1},     {2, 6, 3, 5, 1, 3},  {1, 160, 1, 3, 20, 8}};
    std::uint32_t seed = 100;
    for (const Shape& s : shapes)
        for (Layout l : {Layout::bhld, Layout::blhd, Layout::lbhd}) {
            const Problem p(s, l, seed += 10);
            TRACE_SHAPE(p);
            check_all_paths(p);
        }
}

// Inputs need not share a layout, and may broadcast with stride 0: q as [B, L, H, d], k as [B, H, L, d],
// v with every head at the same memory (head stride 0: MQA through strides); the output written into rows
// padded with sentinels, which must stay untouched. Against the double value of the same problem with
// one KV head (and the scalar backend on the same views).
TEST(SdpaApi, MixedLayoutsBroadcastAndPaddedOutput) {
    const std::size_t B = 2, H = 4, Lq = 33, Lk = 70, d = 40;
    const Problem mqa({B, H, 1, Lq, Lk, d}, Layout::bhld, 61);  // the reference problem: Hkv = 1
    const std::vector<float> q_blhd = to_layout(mqa.q, Layout::blhd, B, H, Lq, d);
    std::vector<float> k_rep(B * H * Lk * d);  // K repeated per head, [B, H, Lk, d]
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
            std::copy_n(mqa.k.begin() + std::ptrdiff_t(b * Lk * d), Lk * d, k_rep.begin() + std::ptrdiff_t((b * H + h) * Lk * d));
    mha::SdpaInputs in;
    in.query = ConstHeads::blhd(q_blhd.data(), B, Lq, H, d);
    in.key = ConstHeads::bhld(k_rep.data(), B, H, Lk, d);
    in.value = ConstHeads(mqa.v.data(), B, H, Lk, d, Lk * d, 0, d);  // head stride 0
    const CoreExpected ex = mqa.expected();
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.ctx.err);
    const std::size_t pad = 7, row = H * d + pad;  // output [B, Lq, H·d] with 7 padding floats per row
    auto run = [&](mha::Backend backend, mha::Impl impl) {
        std::vector<float> out(B * Lq * row, kPadding);
        mha::SdpaOptions o;
        o.backend = backend, o.impl = impl;
        mha::scaled_dot_product_attention(in, Heads(out.data(), B, H, Lq, d, Lq * row, d, row), o);
        std::vector<float> got(B * H * Lq * d);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Lq; ++i) {
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t c = 0; c < d; ++c) got[((b * H + h) * Lq + i) * d + c] = out[(b * Lq + i) * row + h * d + c];
                for (std::size_t c = H * d; c < row; ++c) EXPECT_EQ(out[(b * Lq + i) * row + c], kPadding) << "padding written";
            }
        return got;
    };
    const std::vector<float> scalar = run(mha::Backend::scalar, mha::Impl::automatic);
    expect_scalar_exact_within(scalar, ex);
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls) {
            SCOPED_TRACE(impl_name(impl));
            expect_simd_matches_scalar(run(mha::Backend::simd, impl), scalar, ex);
        }
    });
}

// K and V of Hkv heads repeated to H heads the way repeat_interleave (enable_gqa=True) does it: query head
// h reads KV head h / G. GQA on [B, Hkv, Lk, d] must equal MHA on the repeated [B, H, Lk, d] within the
// float bound (different algorithms: the grouped path stacks a group's query rows, MHA may run per head).
TEST(SdpaApi, GqaEqualsMhaWithRepeatedKeysAndValues) {
    for (std::size_t Hkv : {1, 2, 4}) {
        const Shape s{2, 8, Hkv, 37, 300, 64};
        Problem gqa(s, Layout::bhld, 300 + std::uint32_t(Hkv));
        gqa.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.2, 5);
        gqa.opt.causal = true;
        gqa.opt.causal_alignment = mha::CausalAlignment::bottom_right;
        Problem mha_p = gqa;
        mha_p.s.Hkv = s.H;
        const std::size_t G = s.H / Hkv;
        mha_p.k.assign(s.B * s.H * s.Lk * s.d, 0.0f);
        mha_p.v.assign(s.B * s.H * s.Lk * s.d, 0.0f);
        for (std::size_t b = 0; b < s.B; ++b)
            for (std::size_t h = 0; h < s.H; ++h)
                for (std::size_t j = 0; j < s.Lk * s.d; ++j) {
                    mha_p.k[(b * s.H + h) * s.Lk * s.d + j] = gqa.k[(b * Hkv + h / G) * s.Lk * s.d + j];
                    mha_p.v[(b * s.H + h) * s.Lk * s.d + j] = gqa.v[(b * Hkv + h / G) * s.Lk * s.d + j];
                }
        SCOPED_TRACE(::testing::Message() << "Hkv=" << Hkv);
        const CoreExpected ex = gqa.expected();
        const std::vector<float> scalar_mha = mha_p.run(mha::Backend::scalar, mha::Impl::automatic);
        expect_scalar_exact_within(scalar_mha, ex);
        expect_simd_matches_scalar(gqa.run(mha::Backend::scalar, mha::Impl::automatic), scalar_mha, ex);
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : kImpls) {
                SCOPED_TRACE(impl_name(impl));
                expect_simd_matches_scalar(gqa.run(mha::Backend::simd, impl), scalar_mha, ex);
                expect_simd_matches_scalar(mha_p.run(mha::Backend::simd, impl), scalar_mha, ex);
            }
        });
    }
}

TEST(SdpaApi, ScaleGivenAndDefault) {
    const Shape s{2, 4, 2, 19, 70, 48};
    Problem p(s, Layout::bhld, 41);
    // The default is 1/√d as a float: passing that float explicitly is the same call.
    const std::vector<float> by_default = p.run(mha::Backend::simd, mha::Impl::fused);
    p.opt.scale = 1.0f / std::sqrt(48.0f);
    EXPECT_EQ(p.run(mha::Backend::simd, mha::Impl::fused), by_default);
    // Other scales: sharper, softer, negative, and 0 (every visible key weighs the same).
    for (float scale : {0.9f, 0.05f, -0.3f, 0.0f}) {
        SCOPED_TRACE(::testing::Message() << "scale " << scale);
        p.opt.scale = scale;
        check_all_paths(p, {Layout::bhld});
    }
    // Scale 0: the output is the plain mean of the visible value rows.
    p.opt.scale = 0.0f;
    const std::vector<float> mean = p.run(mha::Backend::simd, mha::Impl::automatic);
    for (std::size_t b = 0; b < s.B; ++b)
        for (std::size_t h = 0; h < s.H; ++h)
            for (std::size_t c = 0; c < s.d; ++c) {
                double m = 0.0;
                for (std::size_t j = 0; j < s.Lk; ++j) m += p.v[((b * s.Hkv + h / 2) * s.Lk + j) * s.d + c];
                m /= double(s.Lk);
                // core_double's bound with Δz = 0, T = 1 and Σ p|v| <= 1: (Lk + 9)·u from the softmax plus
                // (Lk + 4)·u from the sum, times kDecoderSafety.
                ASSERT_NEAR(mean[((b * s.H + h) * s.Lq + 0) * s.d + c], m, 2 * double(2 * s.Lk + 13) * mha_test::kU)
                    << b << " " << h << " " << c;
            }
}

// Causal in both alignments with Lq < Lk, Lq == Lk and Lq > Lk. Bottom-right with Lq > Lk: query i sees
// keys j <= i + Lk − Lq, so the first Lq − Lk queries see none and their rows are exactly 0 on every path.
TEST(SdpaApi, CausalBothAlignments) {
    const std::pair<std::size_t, std::size_t> lengths[] = {{5, 300}, {65, 65}, {300, 7}, {70, 63}};
    std::uint32_t seed = 500;
    for (const auto& [lq, lk] : lengths)
        for (auto align : {mha::CausalAlignment::top_left, mha::CausalAlignment::bottom_right}) {
            const std::size_t Lq = lq, Lk = lk;  // not the bindings: lambdas below capture them
            Problem p({2, 8, 2, Lq, Lk, 32}, Layout::blhd, seed += 3);
            p.opt.causal = true;
            p.opt.causal_alignment = align;
            TRACE_SHAPE(p);
            SCOPED_TRACE(align == mha::CausalAlignment::top_left ? "top_left" : "bottom_right");
            check_all_paths(p, {Layout::blhd});
            if (align != mha::CausalAlignment::bottom_right || Lq <= Lk) continue;
            const std::size_t blind = Lq - Lk;
            auto expect_zero_rows = [&](const std::vector<float>& out) {
                for (std::size_t b = 0; b < p.s.B; ++b)
                    for (std::size_t h = 0; h < p.s.H; ++h)
                        for (std::size_t i = 0; i < Lq; ++i)
                            for (std::size_t c = 0; c < p.s.d; ++c) {
                                const float x = out[((b * p.s.H + h) * Lq + i) * p.s.d + c];
                                if (i < blind) ASSERT_EQ(x, 0.0f) << "query " << i << " sees no key";
                                else ASSERT_TRUE(std::isfinite(x));
                            }
            };
            expect_zero_rows(p.run(mha::Backend::scalar, mha::Impl::automatic));
            mha_test::for_each_cpu_isa([&](mha::Isa) {
                for (mha::Impl impl : kImpls) {
                    SCOPED_TRACE(impl_name(impl));
                    expect_zero_rows(p.run(mha::Backend::simd, impl));
                }
            });
        }
}

// key_padding_mask (bool, float) × attn_mask (none, 2-D and 3-D, bool and additive), with GQA.
TEST(SdpaApi, EveryMaskKindAndRank) {
    const Shape s{2, 4, 2, 33, 300, 32};
    std::uint32_t seed = 900;
    for (int kp = 0; kp < 3; ++kp)
        for (int am = 0; am < 5; ++am) {
            if (kp == 0 && am == 0) continue;
            Problem p(s, (kp + am) % 2 ? Layout::blhd : Layout::bhld, seed += 7);
            if (kp == 1) p.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.3, seed + 1);
            if (kp == 2) p.key_padding_mask = mha_test::random_float_mask({s.B, s.Lk}, 0.3, seed + 1);
            std::vector<std::size_t> dims = am <= 2 ? std::vector<std::size_t>{s.Lq, s.Lk} : std::vector<std::size_t>{s.B * s.H, s.Lq, s.Lk};
            if (am == 1 || am == 3) p.attn_mask = mha_test::random_bool_mask(dims, 0.3, seed + 2);
            if (am == 2 || am == 4) p.attn_mask = mha_test::random_float_mask(dims, 0.2, seed + 2);
            p.opt.causal = am == 4;
            SCOPED_TRACE(::testing::Message() << "key_padding " << kp << ", attn_mask " << am);
            check_all_paths(p, {Layout::bhld});
        }
}

// A query whose every key is masked gets a zero row (PyTorch gives NaN): batch 1 fully padded, and in batch
// 0 query 3 of head 5 (a 3-D attn_mask) and query 10 of every head (padding and attn_mask together).
TEST(SdpaApi, FullyMaskedRowsAreZero) {
    const Shape s{2, 8, 2, 20, 300, 32};
    Problem p(s, Layout::bhld, 77);
    p.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.0, 1);
    for (std::size_t j = 0; j < s.Lk; ++j) p.key_padding_mask.bools[1 * s.Lk + j] = 1;
    for (std::size_t j = 0; j < s.Lk; j += 2) p.key_padding_mask.bools[j] = 1;  // batch 0: even keys padded
    p.attn_mask = mha_test::random_float_mask({s.B * s.H, s.Lq, s.Lk}, 0.1, 2);
    const float inf = std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < s.Lk; ++j) p.attn_mask.values[((0 * s.H + 5) * s.Lq + 3) * s.Lk + j] = -inf;
    for (std::size_t h = 0; h < s.H; ++h)
        for (std::size_t j = 1; j < s.Lk; j += 2) p.attn_mask.values[((0 * s.H + h) * s.Lq + 10) * s.Lk + j] = -inf;
    auto expect_rows = [&](const std::vector<float>& out) {
        for (std::size_t b = 0; b < s.B; ++b)
            for (std::size_t h = 0; h < s.H; ++h)
                for (std::size_t i = 0; i < s.Lq; ++i) {
                    const bool masked = b == 1 || i == 10 || (h == 5 && i == 3);
                    for (std::size_t c = 0; c < s.d; ++c) {
                        const float x = out[((b * s.H + h) * s.Lq + i) * s.d + c];
                        if (masked) ASSERT_EQ(x, 0.0f) << b << " " << h << " " << i;
                        else ASSERT_TRUE(std::isfinite(x));
                    }
                }
    };
    check_all_paths(p, {Layout::bhld});
    expect_rows(p.run(mha::Backend::scalar, mha::Impl::automatic));
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls) {
            SCOPED_TRACE(impl_name(impl));
            expect_rows(p.run(mha::Backend::simd, impl));
        }
    });
}

// The masked-NaN rule (tests/test_nan_values.cpp, mha/attention.hpp): a key masked for a query never
// contributes, even with NaN in its key and value rows. Keys 3 and 290 of KV head 1 in batch 0 are NaN.
// Key 3 is padded (masked for everyone); key 290 is masked by the 3-D attn_mask for query head 4 (the
// first head of KV head 1's group) only, and hidden by causal (top-left) from queries < 290. So head 4's
// rows stay finite and equal the call with finite values there; head 5 (same group) sees key 290 from
// query 290 on: those rows are not finite, earlier ones are unaffected. Other KV heads are untouched.
TEST(SdpaApi, NanInMaskedKeysDoesNotLeak) {
    const Shape s{2, 8, 2, 300, 300, 32};
    Problem finite(s, Layout::bhld, 1234);
    finite.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.0, 1);
    finite.key_padding_mask.bools[0 * s.Lk + 3] = 1;
    finite.attn_mask = mha_test::random_float_mask({s.B * s.H, s.Lq, s.Lk}, 0.0, 2);
    for (std::size_t i = 0; i < s.Lq; ++i) finite.attn_mask.values[((0 * s.H + 4) * s.Lq + i) * s.Lk + 290] = -INFINITY;
    finite.opt.causal = true;
    Problem poisoned = finite;
    for (std::size_t j : {3, 290})
        for (std::size_t c = 0; c < s.d; ++c) {
            poisoned.k[((0 * s.Hkv + 1) * s.Lk + j) * s.d + c] = std::numeric_limits<float>::quiet_NaN();
            poisoned.v[((0 * s.Hkv + 1) * s.Lk + j) * s.d + c] = std::numeric_limits<float>::quiet_NaN();
        }
    const CoreExpected ex = finite.expected();
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.ctx.err);
    const std::vector<float> want = finite.run(mha::Backend::scalar, mha::Impl::automatic);
    auto check = [&](const std::vector<float>& got) {
        std::size_t poisoned_rows = 0;
        for (std::size_t b = 0; b < s.B; ++b)
            for (std::size_t h = 0; h < s.H; ++h)
                for (std::size_t i = 0; i < s.Lq; ++i) {
                    const std::size_t row = ((b * s.H + h) * s.Lq + i) * s.d;
                    const bool sees_nan = b == 0 && h / 4 == 1 && h != 4 && i >= 290;
                    bool finite_row = true;
                    for (std::size_t c = 0; c < s.d; ++c) finite_row = finite_row && std::isfinite(got[row + c]);
                    if (sees_nan) {
                        ASSERT_FALSE(finite_row) << "head " << h << " query " << i << " sees key 290 (NaN)";
                        ++poisoned_rows;
                        continue;
                    }
                    for (std::size_t c = 0; c < s.d; ++c)
                        ASSERT_TRUE(std::isfinite(got[row + c]) && std::abs(double(got[row + c]) - want[row + c]) <= tol[row + c])
                            << "b " << b << " head " << h << " query " << i << " col " << c << ": got " << got[row + c]
                            << ", want " << want[row + c] << " ± " << tol[row + c];
                }
        EXPECT_EQ(poisoned_rows, 3u * 10u);
    };
    check(poisoned.run(mha::Backend::scalar, mha::Impl::automatic));
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls) {
            SCOPED_TRACE(impl_name(impl));
            check(poisoned.run(mha::Backend::simd, impl));
        }
    });
}

// The tolerance refuses a single key more or less: the last key of a 257-key tail (the one key of the
// second tile) padded in one batch, or a key of the first tile unpadded, against the SIMD output.
TEST(SdpaApi, ToleranceCatchesOneKey) {
    const Shape s{2, 8, 2, 37, 257, 64};
    Problem p(s, Layout::bhld, 888);
    p.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.3, 3);
    p.key_padding_mask.bools[256] = 0, p.key_padding_mask.bools[s.Lk + 10] = 1;
    const CoreExpected right = p.expected();
    const std::vector<double> tol = mha_test::backend_difference_bound(right.ctx.err);
    Problem tail = p, other = p;
    tail.key_padding_mask.bools[256] = 1;
    other.key_padding_mask.bools[s.Lk + 10] = 0;
    const std::vector<double> tail_want = tail.expected().ctx.val, other_want = other.expected().ctx.val;
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls) {
            SCOPED_TRACE(impl_name(impl));
            const std::vector<float> simd = p.run(mha::Backend::simd, impl);
            ASSERT_TRUE(mha_test::all_within(simd, right.ctx.val, tol));
            EXPECT_FALSE(mha_test::all_within(simd, tail_want, tol)) << "the tail's last key padded";
            EXPECT_FALSE(mha_test::all_within(simd, other_want, tol)) << "one key unpadded";
        }
    });
}

// ---------------------------------------------------------------------------------------------------
// Validation: every error throws mha::invalid_argument whose message names the argument, before anything
// is written (the sentinel-filled output is unchanged), on both backends.

constexpr float kSentinel = -12345.0f;
constexpr std::size_t huge = std::numeric_limits<std::size_t>::max() / 4;  // a stride past the address space

struct Call {
    std::vector<float> q, k, v, out;
    std::vector<std::uint8_t> kp_bool;
    std::vector<float> am_float;
    mha::SdpaInputs in;
    Heads output;
    mha::SdpaOptions opt;

    // B = 2, H = 4, Hkv = 2, Lq = 5, Lk = 6, d = 8, contiguous [B, H, L, d].
    Call()
        : q(2 * 4 * 5 * 8, 0.5f), k(2 * 2 * 6 * 8, 0.25f), v(2 * 2 * 6 * 8, 1.0f), out(2 * 4 * 5 * 8 + 64, kSentinel),
          kp_bool(2 * 6, 0), am_float(5 * 6, 0.0f) {
        in.query = ConstHeads::bhld(q.data(), 2, 4, 5, 8);
        in.key = ConstHeads::bhld(k.data(), 2, 2, 6, 8);
        in.value = ConstHeads::bhld(v.data(), 2, 2, 6, 8);
        in.key_padding_mask = mha::MaskView::boolean(kp_bool.data(), 2, 6);
        in.attn_mask = mha::MaskView::additive(am_float.data(), 5, 6);
        output = Heads::bhld(out.data(), 2, 4, 5, 8);
    }
    bool untouched() const {
        for (float x : out)
            if (x != kSentinel) return false;
        return true;
    }
};

struct BadCase {
    const char* what;                        // the argument the message must name
    std::function<void(Call&)> break_it;
};

// Expects mha::invalid_argument mentioning `substring` from f, and the output untouched.
void expect_refused(Call& call, const std::function<void()>& f, const std::string& substring) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one naming \"" << substring << "\"";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
            << "message \"" << e.what() << "\" does not name \"" << substring << "\"";
    } catch (const std::exception& e) {
        ADD_FAILURE() << "threw something else: " << e.what();
    }
    EXPECT_TRUE(call.untouched()) << "the output was written before the error";
}

std::vector<BadCase> bad_cases() {
    std::vector<BadCase> cases = {
        // shapes
        {"query heads 4 are not a multiple of key/value heads 3",
         [](Call& c) {
             c.k.resize(2 * 3 * 6 * 8), c.v.resize(2 * 3 * 6 * 8);
             c.in.key = ConstHeads::bhld(c.k.data(), 2, 3, 6, 8), c.in.value = ConstHeads::bhld(c.v.data(), 2, 3, 6, 8);
         }},
        {"head dim", [](Call& c) { c.in.key.dim = 7; }},
        {"head dim", [](Call& c) { c.in.value.dim = 7; }},
        {"must have query's batch", [](Call& c) { c.in.key.batch = 1; }},
        {"must have query's batch", [](Call& c) { c.in.value.batch = 1; }},
        {"value [2, 2, 5, 8] must have key's heads and length", [](Call& c) { c.in.value.rows = 5; }},
        {"value [2, 1, 6, 8] must have key's heads and length", [](Call& c) { c.in.value.heads = 1; }},
        {"output is [2, 2, 5, 8]", [](Call& c) { c.output.heads = 2; }},
        {"output is [2, 4, 4, 8]", [](Call& c) { c.output.rows = 4; }},
        {"output is [2, 4, 5, 4]", [](Call& c) { c.output.dim = 4; }},
        {"output is [1, 4, 5, 8]", [](Call& c) { c.output.batch = 1; }},
        // zero sizes (zero B, Lq, Lk are valid: tests/test_zero_sizes.cpp; the other views must agree) and null pointers
        {"must have query's batch 0", [](Call& c) { c.in.query.batch = 0; }},
        {"query has zero heads or head dim [2, 0, 5, 8]", [](Call& c) { c.in.query.heads = 0; }},
        {"output is [2, 4, 5, 8] but must be [B, H, Lq, d] = [2, 4, 0, 8]", [](Call& c) { c.in.query.rows = 0; }},
        {"query has zero heads or head dim [2, 4, 5, 0]", [](Call& c) { c.in.query.dim = 0; }},
        {"key has zero heads or head dim", [](Call& c) { c.in.key.heads = 0; }},
        {"value [2, 2, 6, 8] must have key's heads and length [2, 2, 0, 8]", [](Call& c) { c.in.key.rows = 0; }},
        {"value [2, 2, 0, 8] must have key's heads and length", [](Call& c) { c.in.value.rows = 0; }},
        {"output is [2, 4, 0, 8]", [](Call& c) { c.output.rows = 0; }},
        {"output has zero heads or head dim", [](Call& c) { c.output.dim = 0; }},
        {"query is a null pointer", [](Call& c) { c.in.query.data = nullptr; }},
        {"key is a null pointer", [](Call& c) { c.in.key.data = nullptr; }},
        {"value is a null pointer", [](Call& c) { c.in.value.data = nullptr; }},
        {"output is a null pointer", [](Call& c) { c.output.data = nullptr; }},
        // extents past the address space
        {"query", [](Call& c) { c.in.query.batch_stride = huge; }},
        {"key", [](Call& c) { c.in.key.row_stride = huge; }},
        {"output", [](Call& c) { c.output.head_stride = huge; }},
        // output rows overlapping each other or the inputs / masks
        {"output rows overlap", [](Call& c) { c.output.head_stride = 0; }},
        {"output rows overlap", [](Call& c) { c.output.row_stride = 4; }},
        {"output rows overlap", [](Call& c) { c.output.batch_stride = c.output.head_stride; }},
        {"output overlaps query", [](Call& c) { c.in.query = ConstHeads::bhld(c.out.data() + 8, 2, 4, 5, 8); }},
        {"output overlaps key", [](Call& c) { c.in.key = ConstHeads::bhld(c.out.data() + 300, 2, 2, 6, 8); }},
        {"output overlaps value", [](Call& c) { c.in.value = ConstHeads(c.out.data() + 319, 2, 2, 6, 8, 0, 0, 0); }},
        {"output overlaps key_padding_mask",
         [](Call& c) {
             c.in.key_padding_mask.bools = reinterpret_cast<const std::uint8_t*>(c.out.data() + 2 * 4 * 5 * 8 - 1);
         }},
        {"output overlaps attn_mask", [](Call& c) { c.in.attn_mask.values = c.out.data() + 100; }},
        // masks
        {"key_padding_mask has shape", [](Call& c) { c.in.key_padding_mask.shape[1] = 5; }},
        {"key_padding_mask has shape", [](Call& c) { c.in.key_padding_mask.shape[0] = 1; }},
        {"key_padding_mask has shape",
         [](Call& c) { c.in.key_padding_mask = mha::MaskView::boolean(c.kp_bool.data(), 1, 2, 6); }},
        {"key_padding_mask has rank 1", [](Call& c) { c.in.key_padding_mask.rank = 1; }},
        {"key_padding_mask is boolean with a null pointer", [](Call& c) { c.in.key_padding_mask.bools = nullptr; }},
        {"key_padding_mask has an unknown mask type",
         [](Call& c) { c.in.key_padding_mask.type = static_cast<mha::MaskType>(7); }},
        {"attn_mask has shape", [](Call& c) { c.in.attn_mask.shape[0] = 6; }},
        {"attn_mask has shape", [](Call& c) { c.in.attn_mask.shape[1] = 5; }},
        // per KV head ([B·Hkv, Lq, Lk]) instead of per query head ([B·H, Lq, Lk])
        {"attn_mask has shape",
         [](Call& c) {
             c.am_float.assign(2 * 2 * 5 * 6, 0.0f);
             c.in.attn_mask = mha::MaskView::additive(c.am_float.data(), 2 * 2, 5, 6);
         }},
        {"attn_mask has shape",
         [](Call& c) {
             c.am_float.assign(3 * 4 * 5 * 6, 0.0f);
             c.in.attn_mask = mha::MaskView::additive(c.am_float.data(), 3 * 4, 5, 6);
         }},
        {"attn_mask has rank 4", [](Call& c) { c.in.attn_mask.rank = 4; }},
        {"attn_mask is additive with a null pointer", [](Call& c) { c.in.attn_mask.values = nullptr; }},
        {"attn_mask has an unknown mask type", [](Call& c) { c.in.attn_mask.type = static_cast<mha::MaskType>(-1); }},
        // options
        {"scale", [](Call& c) { c.opt.scale = std::numeric_limits<float>::quiet_NaN(); }},
        {"scale", [](Call& c) { c.opt.scale = std::numeric_limits<float>::infinity(); }},
        {"scale", [](Call& c) { c.opt.scale = -std::numeric_limits<float>::infinity(); }},
        {"impl", [](Call& c) { c.opt.impl = static_cast<mha::Impl>(3); }},
        {"backend", [](Call& c) { c.opt.backend = static_cast<mha::Backend>(2); }},
        {"causal_alignment", [](Call& c) { c.opt.causal_alignment = static_cast<mha::CausalAlignment>(2); }},
        {"threads", [](Call& c) { c.opt.threads = -1; }},
    };
    return cases;
}

TEST(SdpaApiValidation, EveryErrorNamesTheArgumentAndWritesNothing) {
    const std::vector<BadCase> cases = bad_cases();
    for (std::size_t n = 0; n < cases.size(); ++n)
        for (mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd}) {
            SCOPED_TRACE(::testing::Message() << "case " << n << " (" << cases[n].what << "), "
                                              << (backend == mha::Backend::scalar ? "scalar" : "simd"));
            Call call;
            call.opt.backend = backend;
            {  // the unbroken call is valid (so each case fails for its own reason)
                Call good;
                good.opt.backend = backend;
                mha::scaled_dot_product_attention(good.in, good.output, good.opt);
                ASSERT_FALSE(good.untouched());
            }
            cases[n].break_it(call);
            expect_refused(call, [&] { mha::scaled_dot_product_attention(call.in, call.output, call.opt); }, cases[n].what);
            // The same with a workspace large enough for the valid call.
            Call good;
            good.opt.backend = backend;
            mha::Workspace ws(mha::sdpa_workspace_bytes(good.in, good.opt) + 4096);
            expect_refused(call, [&] { mha::scaled_dot_product_attention(call.in, call.output, call.opt, ws); }, cases[n].what);
        }
}

// sdpa_workspace_bytes refuses what it cannot size.
TEST(SdpaApiValidation, WorkspaceBytesRefusesBadShapesAndOptions) {
    const auto expect = [](const std::function<void(Call&)>& f, const std::string& substring) {
        Call c;
        f(c);
        try {
            (void)mha::sdpa_workspace_bytes(c.in, c.opt);
            ADD_FAILURE() << "no exception; expected one naming \"" << substring << "\"";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
        }
    };
    expect([](Call& c) { c.in.query.heads = 0; }, "query has zero heads or head dim");
    expect([](Call& c) { c.in.key.heads = 0; }, "key has zero heads or head dim");
    expect([](Call& c) { c.in.value.dim = 0; }, "value has zero heads or head dim");
    expect([](Call& c) { c.in.key.heads = 3; }, "not a multiple of key/value heads 3");
    expect([](Call& c) { c.opt.impl = static_cast<mha::Impl>(9); }, "impl");
    expect([](Call& c) { c.opt.backend = static_cast<mha::Backend>(9); }, "backend");
    expect([](Call& c) { c.opt.threads = -2; }, "threads");
}

// ---------------------------------------------------------------------------------------------------
// Workspace: sdpa_workspace_bytes() bytes are enough (also at an odd address: "any alignment"), one byte
// fewer is refused before anything is written, and the results are bitwise equal to a call without one
// (and across thread counts 0, 1, 2).
TEST(SdpaApiWorkspace, ExactSizeWorksOneByteLessIsRefused) {
    const Shape s{2, 8, 2, 70, 300, 64};
    Problem p(s, Layout::blhd, 4242);
    p.key_padding_mask = mha_test::random_bool_mask({s.B, s.Lk}, 0.2, 9);
    p.opt.causal = true;
    const std::size_t n = s.B * s.H * s.Lq * s.d;
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (mha::Impl impl : kImpls)
            for (int threads : {0, 1, 2}) {
                // Tasks depend on the shape only: every thread count gives the same bits.
                if (threads > 0) {
                    EXPECT_EQ(p.run(mha::Backend::simd, impl, Layout::bhld, threads), p.run(mha::Backend::simd, impl, Layout::bhld, 0));
                }
                SCOPED_TRACE(::testing::Message() << impl_name(impl) << ", threads " << threads);
                mha::SdpaOptions o = p.opt;
                o.impl = impl;
                o.threads = threads;
                const std::vector<float> want = p.run(mha::Backend::simd, impl, Layout::bhld, threads);
                const std::size_t bytes = mha::sdpa_workspace_bytes(p.inputs(), o);
                ASSERT_GT(bytes, 0u);
                {
                    mha::Workspace ws(bytes);
                    std::vector<float> out(n, kSentinel);
                    mha::scaled_dot_product_attention(p.inputs(), Heads::bhld(out.data(), s.B, s.H, s.Lq, s.d), o, ws);
                    EXPECT_EQ(out, want) << "owned workspace of exactly sdpa_workspace_bytes()";
                }
                {
                    std::vector<unsigned char> memory(bytes + 1);
                    mha::Workspace ws(memory.data() + 1, bytes);  // borrowed, odd address
                    std::vector<float> out(n, kSentinel);
                    mha::scaled_dot_product_attention(p.inputs(), Heads::bhld(out.data(), s.B, s.H, s.Lq, s.d), o, ws);
                    EXPECT_EQ(out, want) << "borrowed workspace at an odd address";
                }
                {
                    mha::Workspace ws(bytes - 1);
                    Call sentinel;  // only for untouched(): its out is the output here
                    sentinel.out.assign(n, kSentinel);
                    expect_refused(
                        sentinel,
                        [&] {
                            mha::scaled_dot_product_attention(p.inputs(), Heads::bhld(sentinel.out.data(), s.B, s.H, s.Lq, s.d), o,
                                                              ws);
                        },
                        "workspace");
                }
            }
    });
    // The scalar backend needs none: 0 bytes, and an empty workspace is enough.
    mha::SdpaOptions o = p.opt;
    o.backend = mha::Backend::scalar;
    EXPECT_EQ(mha::sdpa_workspace_bytes(p.inputs(), o), 0u);
    mha::Workspace empty;
    std::vector<float> out(n, kSentinel);
    mha::scaled_dot_product_attention(p.inputs(), Heads::bhld(out.data(), s.B, s.H, s.Lq, s.d), o, empty);
    EXPECT_EQ(out, p.run(mha::Backend::scalar, mha::Impl::automatic));
}

TEST(SdpaApiWorkspace, OverlappingWorkspaceIsRefused) {
    Call c;
    const std::size_t bytes = mha::sdpa_workspace_bytes(c.in, c.opt);
    std::vector<float> memory(bytes / sizeof(float) + 64);
    std::memcpy(memory.data(), c.q.data(), c.q.size() * sizeof(float));
    c.in.query = ConstHeads::bhld(memory.data(), 2, 4, 5, 8);  // the query lives inside the workspace
    mha::Workspace ws(memory.data(), memory.size() * sizeof(float));
    expect_refused(c, [&] { mha::scaled_dot_product_attention(c.in, c.output, c.opt, ws); }, "workspace overlaps");
}

}  // namespace
