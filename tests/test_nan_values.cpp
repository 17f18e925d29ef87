// The masking rule for non-finite values (mha/attention.hpp): a key masked for a query (boolean mask,
// additive -inf, or causal) never contributes to that query's output, even when its key or value row is
// NaN or ±inf (so its score is NaN or ±inf), on every path — the scalar reference, the SIMD materialized path, the SIMD fused path (which
// also skips fully padded and causal tiles) — and on every ISA. Oracle: the same call with those value
// and key rows replaced by finite numbers must give the same rows for every query that has all of them masked;
// every query that sees one of them gets a non-finite row.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"

namespace {

// Uniform in [-bound, bound).
std::vector<float> uniform(std::size_t n, float bound, std::uint32_t seed) { return mha_test::random_floats(n, -bound, bound, seed); }

struct Path {
    const char* name;
    mha::Backend backend;
    mha::Impl impl;
};
constexpr Path kPaths[] = {{"scalar", mha::Backend::scalar, mha::Impl::materialized},
                           {"materialized", mha::Backend::simd, mha::Impl::materialized},
                           {"fused", mha::Backend::simd, mha::Impl::fused}};

enum class Kind { padding_bool, padding_additive, attn_mask_bool_2d, attn_mask_additive_3d, causal };

struct Case {
    Kind kind;
    float bad;  // NaN, +inf or -inf written into the value rows of the bad keys
};

std::string name(const Case& c) {
    const char* kinds[] = {"padding_bool", "padding_additive", "attn_mask_bool_2d", "attn_mask_additive_3d", "causal"};
    return std::string(kinds[static_cast<int>(c.kind)]) + (std::isnan(c.bad) ? "_nan" : c.bad > 0 ? "_posinf" : "_neginf");
}

class NonFiniteValues : public testing::TestWithParam<Case> {};

TEST_P(NonFiniteValues, MaskedKeysNeverContribute) {
    const Case c = GetParam();
    // Lk = 600 spans three 256-key tiles of the fused path; the bad keys sit in the last tile and one
    // in the first. With padding, keys 512.. are all padded: the fused path skips that tile.
    const std::size_t E = 32, H = 4, B = 2, Lq = 40, Lk = 600;
    const bool causal = c.kind == Kind::causal;
    const std::size_t lq = causal ? Lk : Lq;  // causal: self-length queries so late ones see the bad keys
    const std::vector<std::size_t> bad_keys = causal ? std::vector<std::size_t>{300, 590}
                                                     : std::vector<std::size_t>{7, 520, 599};
    const float w = 1.0f / std::sqrt(float(E));
    const auto in_w = uniform(3 * E * E, w, 1), in_b = uniform(3 * E, w, 2), out_w = uniform(E * E, w, 3),
               out_b = uniform(E, w, 4);
    const mha::MultiheadAttention m({in_w.data(), in_b.data(), out_w.data(), out_b.data()}, E, H);
    const auto query = uniform(B * lq * E, 1.0f, 5);
    // The bad keys' value rows AND key rows are non-finite: a masked key's score (NaN or ±inf here) must
    // not matter either, including where the fused path skips a whole padded tile.
    auto value_bad = uniform(B * Lk * E, 1.0f, 7), value_finite = value_bad;
    auto key_bad = uniform(B * Lk * E, 1.0f, 6), key_finite = key_bad;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t j : bad_keys)
            for (std::size_t e = 0; e < E; ++e) value_bad[(b * Lk + j) * E + e] = key_bad[(b * Lk + j) * E + e] = c.bad;

    // Masks: which (b, i) rows have every bad key masked.
    std::vector<std::uint8_t> pad_bool(B * Lk, 0), am_bool(lq * Lk, 0);
    std::vector<float> pad_add(B * Lk, 0.0f), am_add(B * H * lq * Lk, 0.0f);
    std::vector<int> all_bad_masked(B * lq, 0);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query.data(), B, lq, E);
    const float inf = std::numeric_limits<float>::infinity();
    switch (c.kind) {
        case Kind::padding_bool:
        case Kind::padding_additive:
            // Batch 0: keys 512.. padded and key 7 too (every bad key masked); batch 1: only 512.. (key 7 seen).
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t j = 0; j < Lk; ++j)
                    if (j >= 512 || (b == 0 && j == 7)) pad_bool[b * Lk + j] = 1, pad_add[b * Lk + j] = -inf;
            for (std::size_t i = 0; i < lq; ++i) all_bad_masked[0 * lq + i] = 1;
            in.key_padding_mask = c.kind == Kind::padding_bool ? mha::MaskView::boolean(pad_bool.data(), B, Lk)
                                                               : mha::MaskView::additive(pad_add.data(), B, Lk);
            break;
        case Kind::attn_mask_bool_2d:
            // Even queries mask every bad key, odd ones mask none; plus some unrelated masked keys.
            for (std::size_t i = 0; i < lq; ++i) {
                for (std::size_t j = 0; j < Lk; j += 37) am_bool[i * Lk + j] = 1;
                if (i % 2 == 0)
                    for (std::size_t j : bad_keys) am_bool[i * Lk + j] = 1;
                for (std::size_t b = 0; b < B; ++b) all_bad_masked[b * lq + i] = i % 2 == 0;
            }
            in.attn_mask = mha::MaskView::boolean(am_bool.data(), lq, Lk);
            break;
        case Kind::attn_mask_additive_3d:
            // Per (b, h): for head 1 of batch 1 the bad keys are visible to query 3 only; elsewhere masked.
            for (std::size_t bh = 0; bh < B * H; ++bh)
                for (std::size_t i = 0; i < lq; ++i)
                    for (std::size_t j = 0; j < Lk; ++j) {
                        float& a = am_add[(bh * lq + i) * Lk + j];
                        a = 0.01f * float((i + j) % 5);
                        const bool is_bad = j == 7 || j == 520 || j == 599;
                        if (is_bad && !(bh == 1 * H + 1 && i == 3)) a = -inf;
                    }
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < lq; ++i) all_bad_masked[b * lq + i] = !(b == 1 && i == 3);
            in.attn_mask = mha::MaskView::additive(am_add.data(), B * H, lq, Lk);
            break;
        case Kind::causal:
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < lq; ++i) all_bad_masked[b * lq + i] = i < 300;
            break;
    }
    mha::ForwardOptions opt;
    opt.causal = causal;

    auto run = [&](const std::vector<float>& key, const std::vector<float>& value, const Path& path) {
        mha::AttentionInputs call = in;
        call.key = mha::ConstBatch(key.data(), B, Lk, E);
        call.value = mha::ConstBatch(value.data(), B, Lk, E);
        std::vector<float> out(B * lq * E);
        mha::ForwardOptions o = opt;
        o.backend = path.backend;
        o.impl = path.impl;
        m.forward(call, {mha::Batch(out.data(), B, lq, E)}, o);
        return out;
    };

    // The oracle: the scalar reference with finite values, for the rows that must not see the bad keys.
    const std::vector<float> want = run(key_finite, value_finite, kPaths[0]);
    double scale = 0.0;
    for (float x : want) scale = std::max(scale, double(std::fabs(x)));
    const mha::Isa detected = mha::detected_isa();
    for (const Path& path : kPaths) {
        for (int isa = 0; isa <= static_cast<int>(detected); ++isa) {
            if (path.backend == mha::Backend::scalar && isa > 0) continue;
            mha::set_isa_cap(static_cast<mha::Isa>(isa));
            SCOPED_TRACE(std::string(path.name) + " " + std::string(mha::isa_name(static_cast<mha::Isa>(isa))));
            const std::vector<float> got = run(key_bad, value_bad, path);
            std::size_t finite_rows = 0, poisoned_rows = 0;
            for (std::size_t r = 0; r < B * lq; ++r) {
                if (all_bad_masked[r]) {
                    ++finite_rows;
                    for (std::size_t e = 0; e < E; ++e) {
                        const float g = got[r * E + e], x = want[r * E + e];
                        // Same tolerance as the fixture tests: 1e-5 of the largest output (the paths sum in
                        // different orders; the bound is far above their rounding, far below any contribution).
                        ASSERT_TRUE(std::fabs(double(g) - double(x)) <= 1e-5 * scale)
                            << "row " << r << " col " << e << ": got " << g << ", want " << x;
                    }
                } else {
                    ++poisoned_rows;
                    bool nonfinite = false;
                    for (std::size_t e = 0; e < E; ++e) nonfinite |= !std::isfinite(got[r * E + e]);
                    ASSERT_TRUE(nonfinite) << "row " << r << " sees a non-finite value row but came out finite";
                }
            }
            EXPECT_GT(finite_rows, 0u);
            EXPECT_GT(poisoned_rows, 0u);
        }
    }
    mha::set_isa_cap(mha::Isa::avx512_bf16);
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
INSTANTIATE_TEST_SUITE_P(AllMasks, NonFiniteValues,
                         testing::Values(Case{Kind::padding_bool, kNaN}, Case{Kind::padding_additive, kInf},
                                         Case{Kind::attn_mask_bool_2d, kNaN}, Case{Kind::attn_mask_bool_2d, -kInf},
                                         Case{Kind::attn_mask_additive_3d, kNaN}, Case{Kind::causal, kNaN},
                                         Case{Kind::causal, kInf}),
                         [](const testing::TestParamInfo<Case>& info) { return name(info.param); });

}  // namespace
