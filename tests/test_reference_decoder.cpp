// The scalar reference's decoder-model pieces (issue 12) against math written here:
//   reference::rope_row   — closed forms at angles the test knows exactly, the pairing of each style (a unit
//                           vector lands on its partner only), dims r..d−1 and the memory past the row left
//                           alone, and positions up to 2^20 against a long-double computation: the result
//                           must be the float rounding of the exact rotation (|Δ| ≤ u·|(x1, x2)| with
//                           u = 2^-24, plus 2^-30 of it for the double angle), which a float angle (error
//                           ~p·2^-24 rad) misses by far — checked too, so the bound has teeth.
//   reference::attention_core — grouped-query heads equal the same call with K and V repeated per query head
//                           (bitwise: query head h must read KV head h / G and nothing else); causal, both
//                           alignments, equals an explicit boolean attn_mask built here (bitwise); Lq > Lk
//                           bottom-right gives zero rows to the queries that see no key; a masked key's NaN
//                           k and v rows change nothing; [B, L, H, d] views (with padded rows) give what
//                           [B, H, L, d] gives (bitwise).
//   reference::multihead_attention — per-sequence positions equal one call per sequence with its offset,
//                           and the whole layer equals its composition from gemm, rope_row and one
//                           attention_core call over all batches with the full masks (bitwise).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <mha/mha.hpp>
#include "attention_test_util.hpp"
#include "reference/reference.hpp"

namespace {

using mha::CausalAlignment;
using mha::ConstHeads;
using mha::Heads;
using mha::RopeConfig;
using mha::RopeStyle;
using mha_test::random_floats;

constexpr double kU = 0x1p-24;
const float kSentinel = std::bit_cast<float>(std::uint32_t{0x7fc0dead});  // a NaN with a payload
bool is_sentinel(float v) { return std::bit_cast<std::uint32_t>(v) == 0x7fc0deadu; }

RopeConfig rope_config(float theta, std::size_t dims, RopeStyle style) {
    RopeConfig r;
    r.theta = theta;
    r.dims = dims;
    r.style = style;
    return r;
}

// The index pair (x1, x2) that frequency k rotates.
std::pair<std::size_t, std::size_t> pair_of(RopeStyle style, std::size_t k, std::size_t r) {
    return style == RopeStyle::half ? std::pair{k, k + r / 2} : std::pair{2 * k, 2 * k + 1};
}

// ---------------------------------------------------------------------------------------------
// rope_row

TEST(ReferenceRope, PositionZeroIsIdentity) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        const auto x = random_floats(16, -2.0f, 2.0f, 1);
        auto y = x;
        mha::reference::rope_row(y.data(), rope_config(10000.0f, 16, style), 0);
        EXPECT_EQ(y, x);  // cos 0 = 1, sin 0 = 0 exactly
    }
}

// theta = 16, r = 4: θ_0 = 1 and θ_1 = 16^(-1/2) = 1/4 exactly, so the angles are p and p/4 with no rounding
// in them; d = 6 leaves dims 4 and 5 alone. Each result is the float rounding of the closed form.
TEST(ReferenceRope, KnownAnglesBothPairings) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        for (std::size_t p : {1u, 2u, 3u, 7u, 100u}) {
            const auto x = random_floats(6, -1.0f, 1.0f, 10 + std::uint32_t(p));
            auto y = x;
            mha::reference::rope_row(y.data(), rope_config(16.0f, 4, style), p);
            const double angles[2] = {double(p), double(p) / 4.0};
            for (std::size_t k = 0; k < 2; ++k) {
                const auto [i1, i2] = pair_of(style, k, 4);
                const double c = std::cos(angles[k]), s = std::sin(angles[k]);
                const double want1 = x[i1] * c - x[i2] * s, want2 = x[i2] * c + x[i1] * s;
                const double tol = kU * std::hypot(double(x[i1]), double(x[i2]));
                EXPECT_NEAR(y[i1], want1, tol) << "p " << p << " k " << k;
                EXPECT_NEAR(y[i2], want2, tol) << "p " << p << " k " << k;
            }
            EXPECT_EQ(y[4], x[4]);
            EXPECT_EQ(y[5], x[5]);
        }
    }
}

// A unit vector e_{i1} rotates into its partner only: (cos, sin) at (i1, i2), exact zeros elsewhere. This is
// the pairing itself: half (k, k + r/2), interleaved (2k, 2k + 1).
TEST(ReferenceRope, PairingOfEachStyle) {
    const std::size_t r = 8, p = 3;
    const double theta = 10000.0;
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        for (std::size_t k = 0; k < r / 2; ++k) {
            const auto [i1, i2] = pair_of(style, k, r);
            std::vector<float> y(r, 0.0f);
            y[i1] = 1.0f;
            mha::reference::rope_row(y.data(), rope_config(float(theta), r, style), p);
            const double angle = double(p) * std::pow(theta, -2.0 * double(k) / double(r));
            for (std::size_t i = 0; i < r; ++i) {
                const double want = i == i1 ? std::cos(angle) : i == i2 ? std::sin(angle) : 0.0;
                EXPECT_NEAR(y[i], want, kU) << "style " << int(style) << " k " << k << " i " << i;
                if (i != i1 && i != i2) {
                    EXPECT_EQ(y[i], 0.0f);
                }
            }
        }
    }
}

// r < d: dims r..d−1 keep their bits (NaN payloads included), and so does the memory past the row.
TEST(ReferenceRope, TailPastRotaryDimsUntouched) {
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        const std::size_t d = 12, r = 6;
        std::vector<float> x = random_floats(d + 4, -1.0f, 1.0f, 3);
        for (std::size_t i = r; i < d + 4; ++i) x[i] = kSentinel;
        x[d - 1] = -0.0f;
        mha::reference::rope_row(x.data(), rope_config(500000.0f, r, style), 12345);
        for (std::size_t i = r; i < d - 1; ++i) EXPECT_TRUE(is_sentinel(x[i])) << i;
        EXPECT_EQ(std::bit_cast<std::uint32_t>(x[d - 1]), 0x80000000u);
        for (std::size_t i = d; i < d + 4; ++i) EXPECT_TRUE(is_sentinel(x[i])) << i;
        for (std::size_t i = 0; i < r; ++i) EXPECT_TRUE(std::isfinite(x[i])) << i;
    }
}

// Positions near and at 2^20, d = r = 128 (64 frequencies, angles up to 2^20 rad), against long double.
TEST(ReferenceRope, LargePositionsMatchLongDouble) {
    const std::size_t r = 128;
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        for (std::size_t p : {std::size_t{1} << 20, (std::size_t{1} << 20) - 3, (std::size_t{1} << 20) + 77777}) {
            for (float theta : {10000.0f, 500000.0f}) {
                const auto x = random_floats(r, -3.0f, 3.0f, std::uint32_t(p));
                auto y = x;
                mha::reference::rope_row(y.data(), rope_config(theta, r, style), p);
                double worst_float_angle = 0.0;  // how far a float-angle rotation lands, in units of the bound
                for (std::size_t k = 0; k < r / 2; ++k) {
                    const auto [i1, i2] = pair_of(style, k, r);
                    const long double theta_k = std::pow((long double)theta, -2.0L * (long double)k / (long double)r);
                    const long double angle = (long double)p * theta_k;
                    const long double c = std::cos(angle), s = std::sin(angle);
                    const long double x1 = x[i1], x2 = x[i2];
                    const long double want1 = x1 * c - x2 * s, want2 = x2 * c + x1 * s;
                    const double tol = (kU + 0x1p-30) * std::hypot(double(x1), double(x2));
                    EXPECT_LE(std::abs((long double)y[i1] - want1), tol) << "p " << p << " k " << k;
                    EXPECT_LE(std::abs((long double)y[i2] - want2), tol) << "p " << p << " k " << k;
                    // A float angle (p·θ_k rounded to float, then cos/sin): what accurate angles avoid.
                    const float fa = float(p) * float(theta_k);
                    const double f1 = double(x[i1]) * std::cos(double(fa)) - double(x[i2]) * std::sin(double(fa));
                    worst_float_angle = std::max(worst_float_angle, double(std::abs((long double)f1 - want1)) / tol);
                }
                EXPECT_GT(worst_float_angle, 100.0) << "the bound would not tell a float angle from an exact one";
            }
        }
    }
}

// RoPE makes q·k depend on the positions' difference only: shifting both by the same amount keeps the dot
// product (to a few float roundings of Σ|q||k|).
TEST(ReferenceRope, DotProductDependsOnRelativePosition) {
    const std::size_t d = 32;
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        const auto q = random_floats(d, -1.0f, 1.0f, 5), k = random_floats(d, -1.0f, 1.0f, 6);
        auto dot_at = [&](std::size_t m, std::size_t n) {
            auto a = q, b = k;
            mha::reference::rope_row(a.data(), rope_config(10000.0f, d, style), m);
            mha::reference::rope_row(b.data(), rope_config(10000.0f, d, style), n);
            double s = 0.0;
            for (std::size_t i = 0; i < d; ++i) s += double(a[i]) * double(b[i]);
            return s;
        };
        double mag = 0.0;
        for (std::size_t i = 0; i < d; ++i) mag += 2.0 * std::abs(q[i]) * 2.0 * std::abs(k[i]);
        const double base = dot_at(9, 4);
        for (std::size_t shift : {1u, 100u, 65536u, 1000000u})
            EXPECT_NEAR(dot_at(9 + shift, 4 + shift), base, 4 * kU * mag) << "shift " << shift;
    }
}

// ---------------------------------------------------------------------------------------------
// attention_core

// Owned [B, heads, L, d] tensors and masks for attention_core.
struct Core {
    std::size_t B, H, Hkv, Lq, Lk, d;
    std::vector<float> q, k, v;
    mha_test::Mask kpm, am;
    Core(std::size_t B_, std::size_t H_, std::size_t Hkv_, std::size_t Lq_, std::size_t Lk_, std::size_t d_,
         std::uint32_t seed)
        : B(B_), H(H_), Hkv(Hkv_), Lq(Lq_), Lk(Lk_), d(d_), q(random_floats(B * H * Lq * d, -1.5f, 1.5f, seed)),
          k(random_floats(B * Hkv * Lk * d, -1.5f, 1.5f, seed + 1)), v(random_floats(B * Hkv * Lk * d, -1.0f, 1.0f, seed + 2)) {}

    mha::SdpaInputs inputs() const {
        mha::SdpaInputs in;
        in.query = ConstHeads::bhld(q.data(), B, H, Lq, d);
        in.key = ConstHeads::bhld(k.data(), B, Hkv, Lk, d);
        in.value = ConstHeads::bhld(v.data(), B, Hkv, Lk, d);
        in.key_padding_mask = kpm.view();
        in.attn_mask = am.view();
        return in;
    }
};

struct CoreResult {
    std::vector<float> out, probs;
};

CoreResult run_core(const mha::SdpaInputs& in, float scale, bool causal, CausalAlignment alignment) {
    const std::size_t B = in.query.batch, H = in.query.heads, Lq = in.query.rows, Lk = in.key.rows, d = in.value.dim;
    CoreResult r{std::vector<float>(B * H * Lq * d, kSentinel), std::vector<float>(B * H * Lq * Lk, kSentinel)};
    mha::reference::attention_core(in, Heads::bhld(r.out.data(), B, H, Lq, d), scale, causal, alignment, r.probs.data());
    return r;
}

using mha_test::same_bits;

// Every (causal, alignment) the core knows, for loops.
struct CausalCase {
    bool causal;
    CausalAlignment alignment;
};
constexpr CausalCase kCausalCases[] = {
    {false, CausalAlignment::top_left}, {true, CausalAlignment::top_left}, {true, CausalAlignment::bottom_right}};

TEST(ReferenceAttentionCore, GroupedQueryHeadsEqualRepeatedKeysAndValues) {
    const std::size_t B = 2, H = 6, Lq = 5, Lk = 7, d = 8;
    for (std::size_t Hkv : {1u, 2u, 3u, 6u}) {
        const std::size_t G = H / Hkv;
        Core grouped(B, H, Hkv, Lq, Lk, d, 100 + std::uint32_t(Hkv));
        grouped.kpm = mha_test::random_bool_mask({B, Lk}, 0.25, 7);
        grouped.am = mha_test::random_bool_mask({B * H, Lq, Lk}, 0.2, 8);
        grouped.am.type = mha::MaskType::additive;  // an additive [B·H, Lq, Lk] mask: one matrix per query head
        grouped.am.values = random_floats(B * H * Lq * Lk, -2.0f, 1.0f, 9);
        grouped.am.bools.clear();
        // K and V repeated per query head: [B, H, Lk, d] with head h = KV head h / G (repeat_interleave).
        Core repeated = grouped;
        repeated.Hkv = H;
        repeated.k.assign(B * H * Lk * d, 0.0f);
        repeated.v.assign(B * H * Lk * d, 0.0f);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t x = 0; x < Lk * d; ++x) {
                    repeated.k[(b * H + h) * Lk * d + x] = grouped.k[(b * Hkv + h / G) * Lk * d + x];
                    repeated.v[(b * H + h) * Lk * d + x] = grouped.v[(b * Hkv + h / G) * Lk * d + x];
                }
        for (const CausalCase& cc : kCausalCases) {
            const CoreResult a = run_core(grouped.inputs(), 0.3f, cc.causal, cc.alignment);
            const CoreResult b = run_core(repeated.inputs(), 0.3f, cc.causal, cc.alignment);
            EXPECT_TRUE(same_bits(a.out, b.out)) << "Hkv " << Hkv << " causal " << cc.causal;
            EXPECT_TRUE(same_bits(a.probs, b.probs)) << "Hkv " << Hkv << " causal " << cc.causal;
            for (float x : a.out) ASSERT_TRUE(std::isfinite(x));
        }
    }
}

// causal = an explicit boolean [Lq, Lk] mask, built here from the definitions: top-left hides j > i,
// bottom-right hides j > i + Lk − Lq. Lq < Lk, Lq = Lk and Lq > Lk (then the first Lq − Lk queries see no
// key: zero probabilities and a zero output row).
TEST(ReferenceAttentionCore, CausalEqualsExplicitBooleanMask) {
    const std::size_t B = 2, H = 4, Hkv = 2, d = 8;
    const std::pair<std::size_t, std::size_t> lengths[] = {{3, 9}, {6, 6}, {7, 4}, {1, 5}};
    for (const auto& [Lq, Lk] : lengths) {
        Core c(B, H, Hkv, Lq, Lk, d, 200 + std::uint32_t(Lq * 16 + Lk));
        for (CausalAlignment alignment : {CausalAlignment::top_left, CausalAlignment::bottom_right}) {
            Core explicit_mask = c;
            explicit_mask.am.type = mha::MaskType::boolean;
            explicit_mask.am.rank = 2;
            explicit_mask.am.shape = {Lq, Lk, 0};
            explicit_mask.am.bools.assign(Lq * Lk, 0);
            std::size_t blind_queries = 0;  // queries with every key hidden
            for (std::size_t i = 0; i < Lq; ++i) {
                bool sees_any = false;
                for (std::size_t j = 0; j < Lk; ++j) {
                    const long long last = alignment == CausalAlignment::top_left
                                               ? (long long)i
                                               : (long long)i + (long long)Lk - (long long)Lq;
                    explicit_mask.am.bools[i * Lk + j] = (long long)j > last;
                    sees_any = sees_any || (long long)j <= last;
                }
                blind_queries += !sees_any;
            }
            const CoreResult got = run_core(c.inputs(), 0.25f, true, alignment);
            const CoreResult want = run_core(explicit_mask.inputs(), 0.25f, false, alignment);
            EXPECT_TRUE(same_bits(got.out, want.out)) << "Lq " << Lq << " Lk " << Lk << " " << int(alignment);
            EXPECT_TRUE(same_bits(got.probs, want.probs)) << "Lq " << Lq << " Lk " << Lk << " " << int(alignment);
            // Bottom-right with Lq > Lk: queries i < Lq − Lk see nothing.
            const std::size_t blind_expected =
                alignment == CausalAlignment::bottom_right && Lq > Lk ? Lq - Lk : 0;
            EXPECT_EQ(blind_queries, blind_expected);
            for (std::size_t bh = 0; bh < B * H; ++bh)
                for (std::size_t i = 0; i < Lq; ++i) {
                    const bool blind = i < blind_expected;
                    for (std::size_t c2 = 0; c2 < d; ++c2) {
                        const float o = got.out[(bh * Lq + i) * d + c2];
                        if (blind) {
                            EXPECT_EQ(o, 0.0f) << "query " << i << " sees no key";
                        } else {
                            EXPECT_TRUE(std::isfinite(o));
                        }
                    }
                    double sum = 0.0;
                    for (std::size_t j = 0; j < Lk; ++j) sum += got.probs[(bh * Lq + i) * Lk + j];
                    EXPECT_NEAR(sum, blind ? 0.0 : 1.0, blind ? 0.0 : 4 * Lk * kU);
                }
        }
    }
}

// A key masked for every query (key padding) whose k and v rows are NaN changes nothing: the result is
// bitwise that of the same key with finite rows.
TEST(ReferenceAttentionCore, MaskedKeyNaNRowsNeverContribute) {
    const std::size_t B = 1, H = 4, Hkv = 2, Lq = 3, Lk = 6, d = 4, masked = 2;
    Core finite(B, H, Hkv, Lq, Lk, d, 300);
    finite.kpm = mha_test::random_bool_mask({B, Lk}, 0.0, 1);
    finite.kpm.bools[masked] = 1;
    Core poisoned = finite;
    for (std::size_t g = 0; g < Hkv; ++g)
        for (std::size_t c = 0; c < d; ++c) {
            poisoned.k[(g * Lk + masked) * d + c] = std::numeric_limits<float>::quiet_NaN();
            poisoned.v[(g * Lk + masked) * d + c] = std::numeric_limits<float>::quiet_NaN();
        }
    for (const CausalCase& cc : kCausalCases) {
        const CoreResult a = run_core(finite.inputs(), 0.5f, cc.causal, cc.alignment);
        const CoreResult b = run_core(poisoned.inputs(), 0.5f, cc.causal, cc.alignment);
        EXPECT_TRUE(same_bits(a.out, b.out));
        EXPECT_TRUE(same_bits(a.probs, b.probs));
    }
}

// q, k, v and out as [B, L, H, d] (rows of H·d plus 3 padding floats holding a sentinel) give bitwise what
// contiguous [B, H, L, d] gives, and the padding stays untouched.
TEST(ReferenceAttentionCore, StridedLayoutsAgree) {
    const std::size_t B = 2, H = 4, Hkv = 2, Lq = 5, Lk = 6, d = 8, pad = 3;
    Core c(B, H, Hkv, Lq, Lk, d, 400);
    c.kpm = mha_test::random_bool_mask({B, Lk}, 0.2, 2);
    c.kpm.bools[0] = c.kpm.bools[Lk] = 0;
    // [B, L, heads·d + pad] copies with the padding set to the sentinel.
    auto to_blhd = [&](const std::vector<float>& x, std::size_t heads, std::size_t L) {
        const std::size_t rs = heads * d + pad;
        std::vector<float> y(B * L * rs, kSentinel);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < heads; ++h)
                for (std::size_t i = 0; i < L; ++i)
                    for (std::size_t e = 0; e < d; ++e) y[b * L * rs + i * rs + h * d + e] = x[((b * heads + h) * L + i) * d + e];
        return y;
    };
    const auto q2 = to_blhd(c.q, H, Lq), k2 = to_blhd(c.k, Hkv, Lk), v2 = to_blhd(c.v, Hkv, Lk);
    auto view = [&](const std::vector<float>& x, std::size_t heads, std::size_t L) {
        const std::size_t rs = heads * d + pad;
        return ConstHeads(x.data(), B, heads, L, d, L * rs, d, rs);
    };
    mha::SdpaInputs strided = c.inputs();
    strided.query = view(q2, H, Lq);
    strided.key = view(k2, Hkv, Lk);
    strided.value = view(v2, Hkv, Lk);
    const std::size_t ors = H * d + pad;
    std::vector<float> out2(B * Lq * ors, kSentinel), probs2(B * H * Lq * Lk);
    for (const CausalCase& cc : kCausalCases) {
        std::fill(out2.begin(), out2.end(), kSentinel);
        mha::reference::attention_core(strided, Heads(out2.data(), B, H, Lq, d, Lq * ors, d, ors), 0.35f, cc.causal,
                                       cc.alignment, probs2.data());
        const CoreResult want = run_core(c.inputs(), 0.35f, cc.causal, cc.alignment);
        EXPECT_TRUE(same_bits(probs2, want.probs));
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Lq; ++i) {
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t e = 0; e < d; ++e)
                        ASSERT_EQ(std::bit_cast<std::uint32_t>(out2[(b * Lq + i) * ors + h * d + e]),
                                  std::bit_cast<std::uint32_t>(want.out[((b * H + h) * Lq + i) * d + e]))
                            << b << " " << i << " " << h << " " << e;
                for (std::size_t e = H * d; e < ors; ++e) ASSERT_TRUE(is_sentinel(out2[(b * Lq + i) * ors + e]));
            }
    }
}

// ---------------------------------------------------------------------------------------------
// multihead_attention (reference::Layer)

// A GQA layer with RoPE, H·d != E, kdim and vdim != E, biases, owned.
struct DecoderLayer {
    std::size_t E = 20, H = 4, Hkv = 2, d = 6, kdim = 12, vdim = 9;
    std::vector<float> wq, wk, wv, wo, bq, bk, bv, bo;
    explicit DecoderLayer(std::uint32_t seed)
        : wq(random_floats(H * d * E, -0.3f, 0.3f, seed)), wk(random_floats(Hkv * d * kdim, -0.3f, 0.3f, seed + 1)),
          wv(random_floats(Hkv * d * vdim, -0.3f, 0.3f, seed + 2)), wo(random_floats(E * H * d, -0.3f, 0.3f, seed + 3)),
          bq(random_floats(H * d, -0.2f, 0.2f, seed + 4)), bk(random_floats(Hkv * d, -0.2f, 0.2f, seed + 5)),
          bv(random_floats(Hkv * d, -0.2f, 0.2f, seed + 6)), bo(random_floats(E, -0.2f, 0.2f, seed + 7)) {}
    mha::reference::Layer layer(RopeStyle style) const {
        mha::reference::Layer l;
        l.E = E, l.H = H, l.Hkv = Hkv, l.d = d, l.kdim = kdim, l.vdim = vdim;
        l.rope = rope_config(10000.0f, d, style);
        l.wq = wq.data(), l.wk = wk.data(), l.wv = wv.data(), l.wo = wo.data();
        l.bq = bq.data(), l.bk = bk.data(), l.bv = bv.data(), l.bo = bo.data();
        return l;
    }
};

TEST(ReferenceDecoderLayer, PerSequencePositionsEqualOneCallPerSequence) {
    const DecoderLayer L(500);
    const std::size_t B = 3, Lq = 4, Lk = 5;
    const auto query = random_floats(B * Lq * L.E, -1.0f, 1.0f, 1), key = random_floats(B * Lk * L.kdim, -1.0f, 1.0f, 2),
               value = random_floats(B * Lk * L.vdim, -1.0f, 1.0f, 3);
    const std::size_t starts[B] = {0, 17, (std::size_t{1} << 20) - 3};
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), B, Lq, L.E);
        in.key = mha::ConstBatch(key.data(), B, Lk, L.kdim);
        in.value = mha::ConstBatch(value.data(), B, Lk, L.vdim);
        mha::ForwardOptions opt;
        opt.causal = true;
        opt.causal_alignment = CausalAlignment::bottom_right;
        opt.positions = starts;
        opt.position_offset = 999;  // ignored when positions are given
        std::vector<float> all(B * Lq * L.E, kSentinel);
        mha::reference::multihead_attention(L.layer(style), in, {mha::Batch(all.data(), B, Lq, L.E)}, opt);
        for (std::size_t b = 0; b < B; ++b) {
            mha::AttentionInputs one;
            one.query = mha::ConstBatch(query.data() + b * Lq * L.E, 1, Lq, L.E);
            one.key = mha::ConstBatch(key.data() + b * Lk * L.kdim, 1, Lk, L.kdim);
            one.value = mha::ConstBatch(value.data() + b * Lk * L.vdim, 1, Lk, L.vdim);
            mha::ForwardOptions o = opt;
            o.positions = nullptr;
            o.position_offset = starts[b];
            std::vector<float> single(Lq * L.E, kSentinel);
            mha::reference::multihead_attention(L.layer(style), one, {mha::Batch(single.data(), 1, Lq, L.E)}, o);
            EXPECT_EQ(0, std::memcmp(single.data(), all.data() + b * Lq * L.E, single.size() * sizeof(float)))
                << "sequence " << b;
        }
        // And the positions matter: the same call at offset 0 differs for the sequences that start later.
        opt.positions = nullptr;
        opt.position_offset = 0;
        std::vector<float> at0(B * Lq * L.E);
        mha::reference::multihead_attention(L.layer(style), in, {mha::Batch(at0.data(), B, Lq, L.E)}, opt);
        EXPECT_EQ(0, std::memcmp(at0.data(), all.data(), Lq * L.E * sizeof(float)));
        EXPECT_NE(0, std::memcmp(at0.data() + Lq * L.E, all.data() + Lq * L.E, Lq * L.E * sizeof(float)));
    }
}

// The layer is its definition composed from the reference kernels here: projections by reference::gemm,
// RoPE by rope_row at offset + index, one attention_core call over all batches with the layer's full masks
// ([B, Lk] key padding, [B·H, Lq, Lk] attn_mask), the output projection; weights per head as the core's
// probabilities, averaged as their mean.
TEST(ReferenceDecoderLayer, EqualsComposition) {
    const DecoderLayer L(600);
    const std::size_t B = 2, Lq = 5, Lk = 7, E = L.E, H = L.H, Hkv = L.Hkv, d = L.d, offset = 40;
    const auto query = random_floats(B * Lq * E, -1.0f, 1.0f, 11), key = random_floats(B * Lk * L.kdim, -1.0f, 1.0f, 12),
               value = random_floats(B * Lk * L.vdim, -1.0f, 1.0f, 13);
    mha_test::Mask kpm = mha_test::random_bool_mask({B, Lk}, 0.3, 14);
    kpm.bools[Lk - 1] = kpm.bools[2 * Lk - 1] = 0;
    mha_test::Mask am = mha_test::random_bool_mask({B * H, Lq, Lk}, 0.3, 15);
    am.type = mha::MaskType::additive;
    am.values = random_floats(B * H * Lq * Lk, -3.0f, 1.0f, 16);
    am.bools.clear();
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
        const mha::reference::Layer layer = L.layer(style);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(query.data(), B, Lq, E);
        in.key = mha::ConstBatch(key.data(), B, Lk, L.kdim);
        in.value = mha::ConstBatch(value.data(), B, Lk, L.vdim);
        in.key_padding_mask = kpm.view();
        in.attn_mask = am.view();
        mha::ForwardOptions opt;
        opt.causal = true;
        opt.position_offset = offset;
        std::vector<float> out(B * Lq * E), per_head(B * H * Lq * Lk), out_avg(B * Lq * E), averaged(B * Lq * Lk);
        opt.need_weights = mha::NeedWeights::per_head;
        mha::reference::multihead_attention(layer, in, {mha::Batch(out.data(), B, Lq, E), per_head.data()}, opt);
        opt.need_weights = mha::NeedWeights::averaged;
        mha::reference::multihead_attention(layer, in, {mha::Batch(out_avg.data(), B, Lq, E), averaged.data()}, opt);

        // The composition: projections of all batches at once ([B·L, features] row-major).
        auto project = [](const std::vector<float>& x, std::size_t rows, std::size_t k, const float* w, std::size_t n,
                          const float* bias) {
            std::vector<float> y(rows * n);
            mha::reference::gemm(1.0f, mha::ConstMatrix(x.data(), rows, k), mha::Trans::no, mha::ConstMatrix(w, n, k),
                                 mha::Trans::yes, 0.0f, mha::Matrix(y.data(), rows, n));
            for (std::size_t i = 0; i < rows; ++i)
                for (std::size_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
            return y;
        };
        auto Q = project(query, B * Lq, E, layer.wq, H * d, layer.bq);
        auto K = project(key, B * Lk, L.kdim, layer.wk, Hkv * d, layer.bk);
        const auto V = project(value, B * Lk, L.vdim, layer.wv, Hkv * d, layer.bv);
        for (std::size_t b = 0; b < B; ++b) {
            for (std::size_t i = 0; i < Lq; ++i)
                for (std::size_t h = 0; h < H; ++h) mha::reference::rope_row(&Q[(b * Lq + i) * H * d + h * d], *layer.rope, offset + i);
            for (std::size_t j = 0; j < Lk; ++j)
                for (std::size_t h = 0; h < Hkv; ++h) mha::reference::rope_row(&K[(b * Lk + j) * Hkv * d + h * d], *layer.rope, offset + j);
        }
        mha::SdpaInputs core;
        core.query = ConstHeads::blhd(Q.data(), B, Lq, H, d);
        core.key = ConstHeads::blhd(K.data(), B, Lk, Hkv, d);
        core.value = ConstHeads::blhd(V.data(), B, Lk, Hkv, d);
        core.key_padding_mask = kpm.view();
        core.attn_mask = am.view();
        std::vector<float> C(B * Lq * H * d), probs(B * H * Lq * Lk);
        mha::reference::attention_core(core, Heads::blhd(C.data(), B, Lq, H, d), 1.0f / std::sqrt(float(d)), true,
                                       CausalAlignment::top_left, probs.data());
        const auto want = project(C, B * Lq, H * d, layer.wo, E, layer.bo);
        EXPECT_TRUE(same_bits(out, want));
        EXPECT_TRUE(same_bits(out_avg, want));
        EXPECT_TRUE(same_bits(per_head, probs));
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t x = 0; x < Lq * Lk; ++x) {
                double mean = 0.0;
                for (std::size_t h = 0; h < H; ++h) mean += probs[(b * H + h) * Lq * Lk + x];
                mean /= double(H);
                EXPECT_NEAR(averaged[b * Lq * Lk + x], mean, (H + 2) * kU * mean) << b << " " << x;
            }
    }
}

}  // namespace
