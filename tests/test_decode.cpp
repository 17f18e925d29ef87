// The decode path of the attention core (lib/attention/attention_core.hpp: Lq <= 16 and G·Lq <= 128; per
// (batch, KV head, split of decode_split = 512 fp32 keys) tasks, each key tile of kKeyTile = 256 read in place,
// the splits' (max, sum, output) merged in a fixed order), issue 13:
//   - through mha::scaled_dot_product_attention (q [B, H, Lq, d], k/v [B, Hkv, Lk, d]) at the split and tile
//     edges Lk ∈ {1, 255, 256, 257, 511, 512, 513, 4097}, every G ∈ {1, 2, 4, 8, H = 16}, d ∈ {64, 128, 80},
//     Lq ∈ {1, 2, 4, 16}; causal in both alignments (bottom-right with Lq > Lk: rows that see no key);
//   - key padding masks, bool and float, with a whole split padded and a sequence with every key padded
//     (zero rows), attn masks 2-D / 3-D, bool / additive, a query head with every key masked;
//   - NaN in masked keys' K and V rows (a padded split, a partly padded tile, an attn_mask entry for one
//     head of a group, keys hidden by causal) never reaches the output;
//   - the same through MultiheadAttention::forward with a KVCache (a ragged batch whose longer sequence
//     crosses the edges, RoPE at positions length(b) + i, biases): outputs, and the rows appended; every Impl
//     with a cache; a NaN token in a call hidden (causal) from the tokens before it;
//   - bitwise identical results for threads 1, 2 and 3 (tbb::global_control lifted to 3);
//   - detail::kv_rows_read(): a decode call reads each visible K and V row once per group, 2·B·Hkv·keys.
// Every SIMD check runs on each ISA this CPU has (mha_test::for_each_cpu_isa).
//
// Tolerances (attention_test_util.hpp, core_double; decode_test_util.hpp for the layer): a double
// evaluation carries a first-order bound on the error of a float evaluation of the same formula per output
// element; each backend is within kDecoderSafety (2) times it of the exact value, so |simd − scalar| ≤ 2·2·bound;
// the scalar backend is also checked against the double value. The decode path's extra roundings are inside
// core_double's T = ⌈Lk / 256⌉ term: a key's partial sum is rescaled at most once more inside its split (two
// tiles) and once by the merge (e^(m_split − m), exactly 1 for the split holding the maximum), ≤ 2 rescales
// against the 3T·u budget for T ≥ 2; with T = 1 there is one tile and one split, so no rescale at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <mha/mha.hpp>

#include "attention/attention_core.hpp"
#include "attention_test_util.hpp"
#include "compare_util.hpp"
#include "decode_test_util.hpp"

namespace {

using mha_decode_test::as_double;
using mha_decode_test::times;
using mha_test::CoreExpected;
using mha_test::HeadsD;

// The largest |simd − scalar| bound relative to the largest output: measured 4e-6 .. 2.6e-3 (SDPA) and
// 4e-4 .. 1.7e-3 (layer) here, against measured differences of at most 3e-6 of the largest output.
constexpr double kMaxRelativeBound = 1e-2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The most query rows the decode path takes for a group of G heads: Lq <= 16 and G·Lq <= 128.
std::size_t max_decode_queries(std::size_t G) {
    return std::min(mha::detail::kDecodeMaxQueries, mha::detail::kGroupRows / G);
}

bool is_decode(std::size_t H, std::size_t Hkv, std::size_t Lq, std::size_t Lk) {
    return mha::detail::core_path(H, Hkv, Lq, Lk, mha::NeedWeights::none, mha::Impl::automatic) == mha::detail::CorePath::decode;
}

// ---------------------------------------------------------------------------------------------------
// The core through scaled_dot_product_attention.

struct Sdpa {
    std::size_t B, H, Hkv, Lq, Lk, d;
    std::vector<float> q, k, v;  // [B, H, Lq, d], [B, Hkv, Lk, d]
    mha_test::Mask kpm, am;
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;

    Sdpa(std::size_t b, std::size_t h, std::size_t hkv, std::size_t lq, std::size_t lk, std::size_t dd, std::uint32_t seed)
        : B(b), H(h), Hkv(hkv), Lq(lq), Lk(lk), d(dd), q(mha_test::random_floats(b * h * lq * dd, -2.0f, 2.0f, seed)),
          k(mha_test::random_floats(b * hkv * lk * dd, -1.0f, 1.0f, seed + 1)),
          v(mha_test::random_floats(b * hkv * lk * dd, -1.0f, 1.0f, seed + 2)) {}

    mha::SdpaInputs inputs() const {
        return {mha::ConstHeads::bhld(q.data(), B, H, Lq, d), mha::ConstHeads::bhld(k.data(), B, Hkv, Lk, d),
                mha::ConstHeads::bhld(v.data(), B, Hkv, Lk, d), kpm.view(), am.view()};
    }
    std::vector<float> run(mha::Backend backend, int threads = 0, mha::Impl impl = mha::Impl::automatic) const {
        std::vector<float> out(B * H * Lq * d, kNaN);
        mha::SdpaOptions o;
        o.backend = backend, o.threads = threads, o.impl = impl, o.causal = causal, o.causal_alignment = alignment;
        mha::scaled_dot_product_attention(inputs(), mha::Heads::bhld(out.data(), B, H, Lq, d), o);
        return out;
    }
    CoreExpected expected() const {
        mha_test::CoreSpec spec;
        spec.scale = double(1.0f / std::sqrt(static_cast<float>(d)));
        spec.causal = causal, spec.alignment = alignment;
        spec.key_padding_mask = kpm.view(), spec.attn_mask = am.view();
        const mha::SdpaInputs in = inputs();
        return mha_test::core_double(HeadsD::from(in.query), HeadsD::from(in.key), HeadsD::from(in.value), spec);
    }
    std::size_t row(std::size_t b, std::size_t h, std::size_t i) const { return ((b * H + h) * Lq + i) * d; }
};

#define TRACE_SDPA(p)                                                                                                  \
    SCOPED_TRACE(::testing::Message() << "B=" << (p).B << " H=" << (p).H << " Hkv=" << (p).Hkv << " Lq=" << (p).Lq      \
                                      << " Lk=" << (p).Lk << " d=" << (p).d << " causal=" << (p).causal                \
                                      << ((p).alignment == mha::CausalAlignment::top_left ? " top-left" : " bottom-right"))

// The scalar backend against the double value, then the SIMD backend (decode path) on every ISA against the
// scalar one; Impl::fused takes the decode path too and gives the same bits. Returns the scalar output.
std::vector<float> check_decode(const Sdpa& p) {
    EXPECT_TRUE(is_decode(p.H, p.Hkv, p.Lq, p.Lk)) << "not the decode path";
    const CoreExpected ex = p.expected();
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.ctx.err);
    EXPECT_LT(mha_test::relative_tolerance(ex.ctx.val, tol), kMaxRelativeBound) << "bound too loose to catch anything";
    const std::vector<float> scalar = p.run(mha::Backend::scalar);
    EXPECT_TRUE(mha_test::all_within(scalar, ex.ctx.val, times(ex.ctx.err, mha_test::kDecoderSafety))) << "scalar vs double";
    const std::vector<double> ref = as_double(scalar);
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        const std::vector<float> simd = p.run(mha::Backend::simd);
        ASSERT_TRUE(mha_test::all_within(simd, ref, tol)) << "SIMD (decode) vs scalar";
        EXPECT_TRUE(mha_decode_test::same_bits(p.run(mha::Backend::simd, 0, mha::Impl::fused), simd)) << "fused != automatic";
    });
    return scalar;
}

constexpr std::size_t kEdges[] = {1, 255, 256, 257, 511, 512, 513, 4097};

// Every split / tile edge × every group size (H = 16: G = 1, 2, 4, 8, 16) with d and Lq rotating through
// {64, 128, 80} and {1, 2, 4, 16} (G·Lq <= 128 keeps the decode path: Lq <= 8 at G = 16). Lk = 4097 (nine
// splits, the last one key) runs with B = 1 and Lq <= 2 to keep the double evaluation quick.
TEST(DecodeSdpa, SplitAndTileEdgesEveryGroupSize) {
    const std::size_t H = 16, groups[] = {1, 2, 4, 8, 16}, dims[] = {64, 128, 80}, lqs[] = {1, 2, 4, 16};
    std::uint32_t seed = 1000;
    for (std::size_t e = 0; e < std::size(kEdges); ++e)
        for (std::size_t g = 0; g < std::size(groups); ++g) {
            const std::size_t Lk = kEdges[e], G = groups[g], big = Lk > 1024;
            std::size_t Lq = std::min(lqs[(e + g) % 4], max_decode_queries(G));
            if (big) Lq = std::min<std::size_t>(Lq, 2);
            const std::size_t d = big ? (g % 2 ? 80 : 64) : dims[(5 * e + g) % 3];
            const Sdpa p(big ? 1 : 2, H, H / G, Lq, Lk, d, seed += 10);
            TRACE_SDPA(p);
            check_decode(p);
        }
}


// Causal on the decode path: bottom-right (the new tokens at the end) and top-left (only the first Lq keys
// visible: the later splits have nothing to do), across split edges; and bottom-right with Lq > Lk, where the
// first Lq − Lk queries see no key and get exact zero rows.
TEST(DecodeSdpa, CausalBothAlignments) {
    std::uint32_t seed = 2000;
    for (std::size_t Lk : {511, 513, 1025})
        for (std::size_t Lq : {4, 16})
            for (auto align : {mha::CausalAlignment::bottom_right, mha::CausalAlignment::top_left}) {
                Sdpa p(2, 8, 2, Lq, Lk, 64, seed += 10);
                p.causal = true, p.alignment = align;
                TRACE_SDPA(p);
                check_decode(p);
            }
    for (std::size_t Lk : {1, 9}) {
        Sdpa p(2, 8, 1, 16, Lk, 80, seed += 10);
        p.causal = true, p.alignment = mha::CausalAlignment::bottom_right;
        TRACE_SDPA(p);
        const std::vector<float> scalar = check_decode(p);
        auto expect_blind_rows_zero = [&](const std::vector<float>& out) {
            for (std::size_t b = 0; b < p.B; ++b)
                for (std::size_t h = 0; h < p.H; ++h)
                    for (std::size_t i = 0; i < p.Lq; ++i)
                        for (std::size_t c = 0; c < p.d; ++c) {
                            const float x = out[p.row(b, h, i) + c];
                            if (i + Lk < p.Lq) ASSERT_EQ(x, 0.0f) << "query " << i << " sees no key";
                            else ASSERT_TRUE(std::isfinite(x));
                        }
        };
        expect_blind_rows_zero(scalar);
        mha_test::for_each_cpu_isa([&](mha::Isa) { expect_blind_rows_zero(p.run(mha::Backend::simd)); });
    }
}

// Key padding, boolean and additive, Lk = 1500 (splits [0, 512), [512, 1024), [1024, 1500)): sequence 0 has
// split 1 wholly padded and a fifth of the other keys; sequence 1 has every key padded (its rows are exact
// zeros, PyTorch would give NaN); sequence 2 sees only keys [512, 768) (splits 0 and 2 and the second tile of
// split 1 padded). The additive mask puts -inf there and values in [-2, 2] elsewhere.
TEST(DecodeSdpa, KeyPaddingWholeSplitAndFullyPaddedSequence) {
    const std::size_t B = 3, Lk = 1500;
    for (bool boolean : {true, false}) {
        SCOPED_TRACE(boolean ? "bool key_padding_mask" : "float key_padding_mask");
        Sdpa p(B, 8, 2, 4, Lk, 64, boolean ? 3000 : 3100);
        std::vector<bool> padded(B * Lk, false);
        const mha_test::Mask random = mha_test::random_bool_mask({B, Lk}, 0.2, 7);
        for (std::size_t j = 0; j < Lk; ++j) {
            padded[0 * Lk + j] = (j >= 512 && j < 1024) || random.bools[j];
            padded[1 * Lk + j] = true;
            padded[2 * Lk + j] = !(j >= 512 && j < 768);
        }
        if (boolean) {
            p.kpm = mha_test::random_bool_mask({B, Lk}, 0.0, 1);
            for (std::size_t n = 0; n < B * Lk; ++n) p.kpm.bools[n] = padded[n] ? 1 : 0;
        } else {
            p.kpm = mha_test::random_float_mask({B, Lk}, 0.0, 2);
            for (std::size_t n = 0; n < B * Lk; ++n)
                if (padded[n]) p.kpm.values[n] = -INFINITY;
        }
        const std::vector<float> scalar = check_decode(p);
        auto expect_zero_sequence = [&](const std::vector<float>& out) {
            for (std::size_t h = 0; h < p.H; ++h)
                for (std::size_t i = 0; i < p.Lq; ++i)
                    for (std::size_t c = 0; c < p.d; ++c) ASSERT_EQ(out[p.row(1, h, i) + c], 0.0f) << "every key padded";
        };
        expect_zero_sequence(scalar);
        mha_test::for_each_cpu_isa([&](mha::Isa) { expect_zero_sequence(p.run(mha::Backend::simd)); });
    }
}

// attn_mask on the decode path: [Lq, Lk] and [B·H, Lq, Lk], boolean and additive, alone and with a float key
// padding and bottom-right causal; in the 3-D additive mask query 2 of head 3 (batch 0) has every key at -inf
// and gets a zero row while the other heads of its group do not.
TEST(DecodeSdpa, AttnMasks) {
    const std::size_t B = 2, H = 8, Lq = 4, Lk = 700;
    std::uint32_t seed = 4000;
    for (int am = 1; am <= 4; ++am)
        for (bool with_padding : {false, true}) {
            Sdpa p(B, H, 2, Lq, Lk, 128, seed += 10);
            const std::vector<std::size_t> dims = am <= 2 ? std::vector<std::size_t>{Lq, Lk} : std::vector<std::size_t>{B * H, Lq, Lk};
            p.am = am % 2 ? mha_test::random_bool_mask(dims, 0.25, seed + 1) : mha_test::random_float_mask(dims, 0.2, seed + 1);
            if (with_padding) {
                p.kpm = mha_test::random_float_mask({B, Lk}, 0.1, seed + 2);
                p.causal = true, p.alignment = mha::CausalAlignment::bottom_right;
            }
            const bool blind_row = am == 4;
            if (blind_row)
                for (std::size_t j = 0; j < Lk; ++j) p.am.values[((0 * H + 3) * Lq + 2) * Lk + j] = -INFINITY;
            SCOPED_TRACE(::testing::Message() << "attn_mask kind " << am << (with_padding ? " + float padding + causal" : ""));
            const std::vector<float> scalar = check_decode(p);
            if (!blind_row) continue;
            auto expect_row = [&](const std::vector<float>& out) {
                for (std::size_t c = 0; c < p.d; ++c) ASSERT_EQ(out[p.row(0, 3, 2) + c], 0.0f);
                bool other_nonzero = false;
                for (std::size_t c = 0; c < p.d; ++c) other_nonzero |= out[p.row(0, 2, 2) + c] != 0.0f;
                EXPECT_TRUE(other_nonzero) << "head 2 of the same group is not masked";
            };
            expect_row(scalar);
            mha_test::for_each_cpu_isa([&](mha::Isa) { expect_row(p.run(mha::Backend::simd)); });
        }
}

// The masked-NaN rule on the decode path: NaN in the K and V rows of keys that are masked never reaches the
// output. Lk = 1100, KV head 1 of batch 0 poisoned at key 600 (inside split 1, wholly padded: its tiles are
// skipped), key 5 (padded alone, in a tile that is otherwise visible) and key 1050 (masked by the 3-D
// attn_mask for query head 4 only: head 5, same group, sees it and its rows are NaN). Every row that does not
// see a NaN key matches the unpoisoned problem within the bound.
TEST(DecodeSdpa, NanInMaskedKeysDoesNotLeak) {
    const std::size_t B = 2, H = 8, Hkv = 2, Lq = 4, Lk = 1100, d = 64;
    Sdpa finite(B, H, Hkv, Lq, Lk, d, 5000);
    finite.kpm = mha_test::random_bool_mask({B, Lk}, 0.0, 1);
    for (std::size_t j = 512; j < 1024; ++j) finite.kpm.bools[j] = 1;
    finite.kpm.bools[5] = 1;
    finite.am = mha_test::random_float_mask({B * H, Lq, Lk}, 0.05, 2);
    for (std::size_t i = 0; i < Lq; ++i) finite.am.values[((0 * H + 4) * Lq + i) * Lk + 1050] = -INFINITY;
    for (std::size_t h = 0; h < H; ++h)  // key 1050 unmasked for head 5 (and the rest) by the random mask
        for (std::size_t i = 0; i < Lq; ++i)
            if (h != 4) finite.am.values[((0 * H + h) * Lq + i) * Lk + 1050] = 0.5f;
    Sdpa poisoned = finite;
    for (std::size_t j : {5, 600, 1050})
        for (std::size_t c = 0; c < d; ++c) {
            poisoned.k[((0 * Hkv + 1) * Lk + j) * d + c] = kNaN;
            poisoned.v[((0 * Hkv + 1) * Lk + j) * d + c] = kNaN;
        }
    EXPECT_TRUE(is_decode(H, Hkv, Lq, Lk));
    const CoreExpected ex = finite.expected();
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.ctx.err);
    const std::vector<double> want = as_double(finite.run(mha::Backend::scalar));
    auto check = [&](const std::vector<float>& got) {
        std::size_t nan_rows = 0;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Lq; ++i) {
                    const std::size_t row = poisoned.row(b, h, i);
                    if (b == 0 && h / (H / Hkv) == 1 && h != 4) {  // sees key 1050
                        bool finite_row = true;
                        for (std::size_t c = 0; c < d; ++c) finite_row = finite_row && std::isfinite(got[row + c]);
                        EXPECT_FALSE(finite_row) << "head " << h << " query " << i << " sees key 1050 (NaN)";
                        ++nan_rows;
                        continue;
                    }
                    for (std::size_t c = 0; c < d; ++c)
                        ASSERT_TRUE(std::isfinite(got[row + c]) && std::abs(double(got[row + c]) - want[row + c]) <= tol[row + c])
                            << "b " << b << " head " << h << " query " << i << " col " << c << ": got " << got[row + c]
                            << ", want " << want[row + c] << " ± " << tol[row + c];
                }
        EXPECT_EQ(nan_rows, 3u * Lq);
    };
    check(poisoned.run(mha::Backend::scalar));
    mha_test::for_each_cpu_isa([&](mha::Isa) { check(poisoned.run(mha::Backend::simd)); });

    // Keys hidden by causal only: top-left, queries 0..3 see keys 0..i. NaN at key 2 (seen by queries 2 and 3)
    // and at key 700 (seen by none) in KV head 0 of batch 1.
    Sdpa cf(B, H, Hkv, Lq, Lk, d, 5100);
    cf.causal = true;
    Sdpa cp = cf;
    for (std::size_t j : {2, 700})
        for (std::size_t c = 0; c < d; ++c) cp.k[((1 * Hkv + 0) * Lk + j) * d + c] = kNaN, cp.v[((1 * Hkv + 0) * Lk + j) * d + c] = kNaN;
    const CoreExpected cex = cf.expected();
    const std::vector<double> ctol = mha_test::backend_difference_bound(cex.ctx.err);
    const std::vector<double> cwant = as_double(cf.run(mha::Backend::scalar));
    auto check_causal = [&](const std::vector<float>& got) {
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t i = 0; i < Lq; ++i) {
                    const std::size_t row = cp.row(b, h, i);
                    if (b == 1 && h < H / Hkv && i >= 2) {
                        EXPECT_TRUE(std::isnan(got[row])) << "head " << h << " query " << i << " sees key 2 (NaN)";
                        continue;
                    }
                    for (std::size_t c = 0; c < d; ++c)
                        ASSERT_TRUE(std::isfinite(got[row + c]) && std::abs(double(got[row + c]) - cwant[row + c]) <= ctol[row + c])
                            << "b " << b << " head " << h << " query " << i << " col " << c;
                }
    };
    check_causal(cp.run(mha::Backend::scalar));
    mha_test::for_each_cpu_isa([&](mha::Isa) { check_causal(cp.run(mha::Backend::simd)); });
}

// The tolerance is not vacuous where the decode path could go wrong: a merge that drops a split, or a tile
// or split boundary off by one. Keys at the edges (the first key of the last split or tile, and the last key
// before it) are given a large score for query head 0 (K rows 0.2·q and 0.4·q: scores near 4 and 8 against
// about ±1 for the rest, weights of a few % even among 4097 keys): the SIMD output must be refused by the bound
// around the expectation with either of them padded, and accepted around the right one.
TEST(DecodeSdpa, ToleranceCatchesOneKeyAtTheEdges) {
    for (std::size_t Lk : {257, 513, 1025, 4097}) {
        Sdpa p(1, 4, 2, 1, Lk, 64, 6500 + std::uint32_t(Lk));
        const std::size_t edge = Lk - 1;  // the first key of the last tile / split (Lk = 256·t + 1)
        for (std::size_t j : {edge - 1, edge})
            for (std::size_t c = 0; c < p.d; ++c) p.k[j * p.d + c] = (j == edge ? 0.2f : 0.4f) * p.q[c];
        p.kpm = mha_test::random_bool_mask({1, Lk}, 0.0, 1);
        SCOPED_TRACE(::testing::Message() << "Lk " << Lk);
        const CoreExpected right = p.expected();
        const std::vector<double> tol = mha_test::backend_difference_bound(right.ctx.err);
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            const std::vector<float> simd = p.run(mha::Backend::simd);
            ASSERT_TRUE(mha_test::all_within(simd, right.ctx.val, tol));
            for (std::size_t j : {edge - 1, edge}) {
                Sdpa wrong = p;
                wrong.kpm.bools[j] = 1;
                EXPECT_FALSE(mha_test::all_within(simd, wrong.expected().ctx.val, tol)) << "key " << j << " dropped went unnoticed";
            }
        });
    }
}

// Threads 1, 2 and 3 give the same bits: the splits and their merge order depend on the shape only.
TEST(DecodeSdpa, BitwiseEqualAcrossThreadCounts) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 3);
    Sdpa padded(2, 8, 2, 4, 4097, 80, 6000);
    padded.kpm = mha_test::random_bool_mask({2, 4097}, 0.2, 3);
    Sdpa causal(1, 16, 1, 8, 1537, 64, 6100);
    causal.causal = true, causal.alignment = mha::CausalAlignment::bottom_right;
    for (const Sdpa* p : {&padded, &causal}) {
        TRACE_SDPA(*p);
        EXPECT_TRUE(is_decode(p->H, p->Hkv, p->Lq, p->Lk));
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            const std::vector<float> one = p->run(mha::Backend::simd, 1);
            for (int threads : {2, 3}) EXPECT_TRUE(mha_decode_test::same_bits(p->run(mha::Backend::simd, threads), one)) << threads << " threads";
            EXPECT_TRUE(mha_decode_test::same_bits(p->run(mha::Backend::simd, 0), one)) << "all threads";
        });
    }
}

// detail::kv_rows_read(): a decode call reads every visible K and V row once per group (not once per query
// head): 2·B·Hkv·(keys the last query sees). Top-left causal: only the first Lq keys are visible. A tile of 256
// keys that is wholly padded is skipped (attention_core.cpp), so it is not read either.
TEST(DecodeSdpa, ReadsEachKeyAndValueRowOncePerGroup) {
    auto rows_read = [](const Sdpa& p) {
        const std::uint64_t before = mha::detail::kv_rows_read();
        (void)p.run(mha::Backend::simd);
        return mha::detail::kv_rows_read() - before;
    };
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (std::size_t Lk : {1, 511, 513, 4097})
            for (std::size_t G : {1, 4, 16}) {
                const Sdpa p(2, 16, 16 / G, std::min<std::size_t>(4, max_decode_queries(G)), Lk, 64, 7000);
                TRACE_SDPA(p);
                ASSERT_TRUE(is_decode(p.H, p.Hkv, p.Lq, p.Lk));
                EXPECT_EQ(rows_read(p), 2u * p.B * p.Hkv * Lk);
            }
        Sdpa br(2, 8, 2, 4, 1000, 64, 7100);
        br.causal = true, br.alignment = mha::CausalAlignment::bottom_right;
        EXPECT_EQ(rows_read(br), 2u * 2 * 2 * 1000);
        Sdpa tl = br;
        tl.alignment = mha::CausalAlignment::top_left;
        EXPECT_EQ(rows_read(tl), 2u * 2 * 2 * 4) << "top-left: keys 0..3 only";
        Sdpa pad(2, 8, 2, 4, 1000, 64, 7200);  // batch 0: keys [256, 512) padded, a whole tile
        pad.kpm = mha_test::random_bool_mask({2, 1000}, 0.0, 1);
        for (std::size_t j = 256; j < 512; ++j) pad.kpm.bools[j] = 1;
        EXPECT_EQ(rows_read(pad), 2u * 2 * (1000 - 256) + 2u * 2 * 1000);
    });
}

// ---------------------------------------------------------------------------------------------------
// The layer with a KV cache: a decode step of Lq new tokens after prefixes of n_b cached tokens.

using mha_decode_test::DecoderLayer;

struct CacheStep {
    DecoderLayer layer;
    std::size_t B, Lq, capacity;
    std::vector<std::size_t> prefix;        // n_b
    std::vector<std::vector<float>> pk, pv;  // per sequence: [1, Hkv, n_b, d], the cached rows (any floats)
    std::vector<float> x;                    // [B, Lq, E], the new tokens

    CacheStep(DecoderLayer l, std::size_t lq, std::vector<std::size_t> n, std::uint32_t seed)
        : layer(std::move(l)), B(n.size()), Lq(lq), prefix(std::move(n)) {
        capacity = *std::max_element(prefix.begin(), prefix.end()) + Lq;
        // Cached rows of the magnitude the projections give (x in [-1, 1], Wk at kGain/√E: about ±1.2).
        mha_decode_test::random_prefixes(layer.Hkv, layer.d, prefix, seed, pk, pv);
        x = mha_decode_test::uniform(B * Lq * layer.E, 1.0f, seed + 999);
    }
    // A cache holding the prefixes (the rest of its storage zeros).
    mha::KVCache cache() const {
        mha::KVCache c = mha_decode_test::filled_cache(B, layer.Hkv, layer.d, capacity);
        for (std::size_t b = 0; b < B; ++b)
            if (prefix[b] > 0)
                c.append(b, mha::ConstHeads::bhld(pk[b].data(), 1, layer.Hkv, prefix[b], layer.d),
                         mha::ConstHeads::bhld(pv[b].data(), 1, layer.Hkv, prefix[b], layer.d));
        return c;
    }
    struct Result {
        std::vector<float> out;
        mha::KVCache cache;
    };
    Result run(const mha::MultiheadAttention& m, mha::Backend backend, int threads = 0) const {
        Result r{std::vector<float>(B * Lq * layer.E, kNaN), cache()};
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), B, Lq, layer.E);
        mha::ForwardOptions o;
        o.backend = backend, o.threads = threads;
        m.forward(in, {mha::Batch(r.out.data(), B, Lq, layer.E)}, o, r.cache);
        return r;
    }
};

// The new rows [n_b, n_b + Lq) of every (b, KV head) of a cache after the step, as [B, Hkv, Lq, d].
std::vector<float> appended_rows(const mha::KVCache& c, const CacheStep& s, bool values) {
    std::vector<float> r;
    for (std::size_t b = 0; b < s.B; ++b)
        for (std::size_t h = 0; h < s.layer.Hkv; ++h) {
            const mha::ConstMatrix m = values ? c.values(b, h) : c.keys(b, h);
            for (std::size_t i = 0; i < s.Lq; ++i) r.insert(r.end(), m.row(s.prefix[b] + i), m.row(s.prefix[b] + i) + s.layer.d);
        }
    return r;
}

// The step on the scalar backend against the double evaluation (outputs and appended rows), then on the SIMD
// backend on every ISA against the scalar one; lengths advanced, the prefixes left as they were.
void check_step(const CacheStep& s) {
    const mha::MultiheadAttention m = s.layer.make();
    const std::size_t keys = *std::max_element(s.prefix.begin(), s.prefix.end()) + s.Lq;
    EXPECT_TRUE(is_decode(s.layer.H, s.layer.Hkv, s.Lq, keys)) << "not the decode path";
    const mha::KVCache before = s.cache();
    const mha_decode_test::StepExpected ex = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, s.Lq, &before);
    const std::vector<double> tol = mha_test::backend_difference_bound(ex.out_err);
    EXPECT_LT(mha_test::relative_tolerance(ex.out, tol), kMaxRelativeBound) << "bound too loose to catch anything";
    const CacheStep::Result scalar = s.run(m, mha::Backend::scalar);
    EXPECT_TRUE(mha_test::all_within(scalar.out, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "scalar vs double";
    const std::vector<float> sk = appended_rows(scalar.cache, s, false), sv = appended_rows(scalar.cache, s, true);
    EXPECT_TRUE(mha_test::all_within(sk, ex.k.val, times(ex.k.err, mha_test::kDecoderSafety))) << "appended K (rotated) vs double";
    EXPECT_TRUE(mha_test::all_within(sv, ex.v.val, times(ex.v.err, mha_test::kDecoderSafety))) << "appended V vs double";
    auto check_cache = [&](const mha::KVCache& c) {
        for (std::size_t b = 0; b < s.B; ++b) {
            ASSERT_EQ(c.length(b), s.prefix[b] + s.Lq);
            for (std::size_t h = 0; h < s.layer.Hkv; ++h)
                for (std::size_t j = 0; j < s.prefix[b]; ++j)
                    for (std::size_t t = 0; t < s.layer.d; ++t) {
                        ASSERT_EQ(c.keys(b, h)(j, t), s.pk[b][(h * s.prefix[b] + j) * s.layer.d + t]) << "cached key changed";
                        ASSERT_EQ(c.values(b, h)(j, t), s.pv[b][(h * s.prefix[b] + j) * s.layer.d + t]) << "cached value changed";
                    }
        }
    };
    check_cache(scalar.cache);
    const std::vector<double> ref = as_double(scalar.out);
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        const CacheStep::Result simd = s.run(m, mha::Backend::simd);
        ASSERT_TRUE(mha_test::all_within(simd.out, ref, tol)) << "SIMD vs scalar";
        EXPECT_TRUE(mha_test::all_within(appended_rows(simd.cache, s, false), as_double(sk), mha_test::backend_difference_bound(ex.k.err)))
            << "SIMD appended K vs scalar";
        EXPECT_TRUE(mha_test::all_within(appended_rows(simd.cache, s, true), as_double(sv), mha_test::backend_difference_bound(ex.v.err)))
            << "SIMD appended V vs scalar";
        check_cache(simd.cache);
    });
}

mha::RopeConfig rope(mha::RopeStyle style, std::size_t dims = 0) { return {10000.0f, dims, style}; }

// A decode step through the layer whose longer sequence ends at each split / tile edge Lk (n_0 = Lk − Lq cached
// plus Lq new), the other sequence at about half of it (ragged), for every G (H = 8: G = 1, 2, 4, 8 = H) with
// d rotating through {64, 128, 80}, Lq through {1, 2, 4, 16}, RoPE half / interleaved (dims d or d / 2) and
// biases on every other case. E = 96 (H·d ≠ E).
TEST(DecodeLayer, CacheStepAtSplitAndTileEdgesEveryGroupSize) {
    const std::size_t E = 96, H = 8, groups[] = {1, 2, 4, 8}, dims[] = {64, 128, 80}, lqs[] = {1, 2, 4, 16};
    std::uint32_t seed = 8000;
    for (std::size_t e = 0; e < std::size(kEdges); ++e)
        for (std::size_t g = 0; g < std::size(groups); ++g) {
            const std::size_t Lk = kEdges[e], G = groups[g], big = Lk > 1024;
            std::size_t Lq = std::min({lqs[(e + g) % 4], max_decode_queries(G), Lk});
            if (big) Lq = std::min<std::size_t>(Lq, 2);
            const std::size_t d = big ? 64 : dims[(5 * e + g) % 3];
            const mha::RopeConfig r = rope((e + g) % 2 ? mha::RopeStyle::interleaved : mha::RopeStyle::half, g % 3 == 2 ? d / 2 : 0);
            seed += 20;
            const CacheStep s(DecoderLayer(E, H, H / G, d, r, (e + g) % 2 == 0, false, seed), Lq, {Lk - Lq, (Lk - Lq) / 2}, seed + 7);
            SCOPED_TRACE(::testing::Message() << "Lk=" << Lk << " G=" << G << " d=" << d << " Lq=" << Lq << " prefixes "
                                              << s.prefix[0] << ", " << s.prefix[1]);
            check_step(s);
        }
}

// Threads 1, 2 and 3 give the same outputs and the same cache, bit for bit (a ragged batch over three splits).
TEST(DecodeLayer, BitwiseEqualAcrossThreadCounts) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 3);
    const CacheStep s(DecoderLayer(96, 8, 2, 64, rope(mha::RopeStyle::half), true, false, 9000), 4, {1100, 37, 0}, 9001);
    const mha::MultiheadAttention m = s.layer.make();
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        const CacheStep::Result one = s.run(m, mha::Backend::simd, 1);
        for (int threads : {2, 3, 0}) {
            const CacheStep::Result r = s.run(m, mha::Backend::simd, threads);
            EXPECT_TRUE(mha_decode_test::same_bits(r.out, one.out)) << threads << " threads";
            EXPECT_TRUE(mha_decode_test::CacheSnapshot(r.cache) == mha_decode_test::CacheSnapshot(one.cache)) << threads << " threads";
        }
    });
}

// A decode step with a cache reads each sequence's cached and new K/V rows once per group:
// Σ_b 2·Hkv·(n_b + Lq), whatever G; rows past a sequence's length are never read.
TEST(DecodeLayer, ReadsEachCachedRowOncePerGroup) {
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (std::size_t Hkv : {8, 2, 1}) {
            const CacheStep s(DecoderLayer(64, 8, Hkv, 32, std::nullopt, false, false, 9100), 1, {600, 0, 1023}, 9101);
            const mha::MultiheadAttention m = s.layer.make();
            const std::uint64_t before = mha::detail::kv_rows_read();
            (void)s.run(m, mha::Backend::simd);
            EXPECT_EQ(mha::detail::kv_rows_read() - before, 2u * Hkv * (601 + 1 + 1024)) << "Hkv " << Hkv;
        }
    });
}

// Every Impl with a cache: materialized (per query head, 64 rows) and fused (grouped, or the decode path for few
// queries) take the per-sequence key lengths too. A ragged batch (one sequence empty before the call) with
// Lq = 1, 4 and 40, against the double evaluation, on every ISA.
TEST(DecodeLayer, EveryImplWithACache) {
    for (std::size_t Lq : {1, 4, 40}) {
        const CacheStep s(DecoderLayer(96, 8, 2, 64, rope(mha::RopeStyle::interleaved), true, false, 9200), Lq, {700, 0, 300}, 9201);
        const mha::MultiheadAttention m = s.layer.make();
        const mha::KVCache before = s.cache();
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, s.Lq, &before);
        const std::vector<double> tol = times(ex.out_err, mha_test::kDecoderSafety);
        ASSERT_LT(mha_test::relative_tolerance(ex.out, mha_test::backend_difference_bound(ex.out_err)), kMaxRelativeBound);
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            for (mha::Impl impl : {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused}) {
                SCOPED_TRACE(::testing::Message() << "Lq " << Lq << (impl == mha::Impl::automatic ? " automatic" : impl == mha::Impl::materialized ? " materialized" : " fused"));
                mha::KVCache c = s.cache();
                std::vector<float> out(s.B * Lq * s.layer.E, kNaN);
                mha::AttentionInputs in;
                in.query = mha::ConstBatch(s.x.data(), s.B, Lq, s.layer.E);
                mha::ForwardOptions o;
                o.impl = impl;
                m.forward(in, {mha::Batch(out.data(), s.B, Lq, s.layer.E)}, o, c);
                EXPECT_TRUE(mha_test::all_within(out, ex.out, tol)) << "vs double";
                EXPECT_TRUE(mha_test::all_within(appended_rows(c, s, false), ex.k.val, times(ex.k.err, mha_test::kDecoderSafety)));
            }
        });
    }
}

// The masked-NaN rule with a cache: a new token whose input holds NaN has NaN Q, K and V rows; the tokens before
// it in the same call do not see its key (causal), so their outputs stay finite and within the bound of the call
// without the NaN (not bitwise on the SIMD backend: with a non-finite value in a tile it sums P·V in plain loops
// over the unmasked keys instead of the GEMM); its own row and the later ones are NaN. Sequence 1 is untouched.
// Lq = 4 (decode path) and 40 (grouped path), with the post-norm.
TEST(DecodeLayer, NanTokenDoesNotReachEarlierTokens) {
    for (std::size_t Lq : {4, 40}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
        const CacheStep s(DecoderLayer(64, 8, 2, 32, rope(mha::RopeStyle::half), true, true, 9300), Lq, {600, 20}, 9301);
        const std::size_t bad = Lq / 2, E = s.layer.E;
        const mha::MultiheadAttention m = s.layer.make();
        CacheStep poisoned = s;
        poisoned.x[(0 * Lq + bad) * E + 3] = kNaN;  // sequence 0, token `bad`
        const mha::KVCache before = s.cache();
        const std::optional<float> eps = 1e-5f;
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(s.layer.ref(eps), s.x.data(), s.B, Lq, &before);
        auto run = [&](const CacheStep& c, mha::Backend backend) {
            std::vector<float> out(c.B * Lq * E, kNaN);
            mha::KVCache cache = c.cache();
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(c.x.data(), c.B, Lq, E);
            mha::ForwardOptions o;
            o.backend = backend, o.norm_eps = eps;
            m.forward(in, {mha::Batch(out.data(), c.B, Lq, E)}, o, cache);
            return out;
        };
        auto check = [&](mha::Backend backend) {
            const std::vector<float> got = run(poisoned, backend);
            for (std::size_t b = 0; b < 2; ++b)
                for (std::size_t i = 0; i < Lq; ++i) {
                    const bool sees = b == 0 && i >= bad;
                    for (std::size_t e = 0; e < E; ++e) {
                        const std::size_t at = (b * Lq + i) * E + e;
                        if (sees) ASSERT_TRUE(std::isnan(got[at])) << "token " << i << " sees the NaN token";
                        else
                            ASSERT_TRUE(std::isfinite(got[at]) && std::abs(double(got[at]) - ex.out[at]) <= mha_test::kDecoderSafety * ex.out_err[at])
                                << "b " << b << " token " << i << " col " << e << ": " << got[at] << " vs " << ex.out[at];
                    }
                }
        };
        {
            SCOPED_TRACE("scalar");
            check(mha::Backend::scalar);
        }
        mha_test::for_each_cpu_isa([&](mha::Isa) { check(mha::Backend::simd); });
    }
}

}  // namespace
