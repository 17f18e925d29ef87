// KVCache with bf16 / f16 elements (issue 14) and MultiheadAttention::forward with such a cache:
//   - storage: element_type(), bytes() at 2 bytes per element, append rounds to nearest even (the widened
//     rows equal mha::round_to_bf16 / round_to_f16 of what was appended), keys_as<T>() / copy_keys; the fp32
//     accessors refuse a half cache with mha::invalid_argument and so do keys_as of the wrong type and
//     copy_keys into a wrong shape;
//   - a decode step (B = 2 ragged prefixes over two 2048-key splits, G = 4, RoPE, Lq = 1 and 4) and the
//     grouped (Lq = 20) and materialized (Impl::materialized) paths, each on the scalar backend and on SIMD on
//     every ISA, against a double evaluation of the same step (decode_test_util.hpp: step_double with
//     KVRounding): the cached rows exact (bound 0), each new K / V element rounded when appended, which adds
//     u_h·|x| + a to its bound (u_h = 2^-8 bf16, 2^-11 f16; a = 2^-25 for f16 subnormals). Both backends are
//     within kDecoderSafety (2) times that bound of the double value, and within 2·2 times it of each other;
//   - attention used the rounded rows: each backend's output is within the float-level bound of a double
//     evaluation over the rows that call stored (old and new, exact); that bound rejects the same step over an
//     f32 cache holding the unrounded prefix, or the prefix rounded toward zero instead of to nearest (prefix
//     values put 0.51 ulp past a representable value, so the differences are systematic; measured: outside
//     the bound by 27x / 55x (bf16) and 3.2x / 6.6x (f16) on a small layer, while the right cache uses 0.3 %);
//   - against the f32 cache holding the unrounded prefix: the half cache's result is within the bound that
//     gives every cached and new K / V element the rounding term (KVRounding with cached_rows);
//   - bitwise identical outputs and caches for threads 1, 2 and 3 (decode and grouped paths);
//   - a NaN token's rows (NaN in the half cache) never reach the tokens before it (decode and grouped paths);
//   - a Workspace of exactly workspace_bytes(in, opt, cache) suffices on every path and gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "decode_test_util.hpp"

namespace {

using mha::DataType;
using mha_decode_test::DecoderLayer;
using mha_decode_test::KVRounding;

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> times(const std::vector<double>& v, double c) {
    std::vector<double> r(v);
    for (double& x : r) x *= c;
    return r;
}

// max_i |got_i − want_i| / tol_i: how far inside (< 1) or outside (> 1) its bound a result is.
double worst_ratio(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& tol) {
    double r = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) r = std::max(r, std::abs(double(got[i]) - want[i]) / tol[i]);
    return r;
}

float round_to(DataType t, float x) { return t == DataType::bf16 ? mha::round_to_bf16(x) : mha::round_to_f16(x); }

// x rounded toward zero to t (a wrong rounding: drops the low bits).
float truncate_to(DataType t, float x) {
    if (t == DataType::bf16) return mha::bfloat16::from_bits(static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16)).to_float();
    const mha::float16 h = mha::float16::from_float(x);
    if (std::fabs(h.to_float()) <= std::fabs(x)) return h.to_float();
    return mha::float16::from_bits(static_cast<std::uint16_t>(h.bits - 1)).to_float();  // one step toward zero
}

// x moved to 0.51 of the way from its rounding r to the next representable value away from zero: RNE then
// gives that next value, truncation gives r, and the unrounded x is 0.49 ulp off RNE, always in the same
// direction (a systematic difference that sums over keys instead of averaging out).
float nudge(DataType t, float x) {
    const float r = round_to(t, x);
    if (r == 0.0f) return x;
    const std::uint16_t bits = t == DataType::bf16 ? mha::bfloat16::from_float(r).bits : mha::float16::from_float(r).bits;
    const auto next_bits = static_cast<std::uint16_t>(bits + 1);  // magnitude + 1 ulp (sign-magnitude)
    const float next = t == DataType::bf16 ? mha::bfloat16::from_bits(next_bits).to_float() : mha::float16::from_bits(next_bits).to_float();
    return static_cast<float>(double(r) + 0.51 * (double(next) - double(r)));
}

// ---- the cache itself ----------------------------------------------------------------------------

class HalfCache : public ::testing::TestWithParam<DataType> {};

TEST_P(HalfCache, StoresRoundedElementsAndRefusesFloatViews) {
    const DataType t = GetParam();
    const std::size_t B = 2, Hkv = 3, d = 20, cap = 7;
    mha::KVCache c(B, Hkv, d, cap, t);
    EXPECT_EQ(c.element_type(), t);
    EXPECT_EQ(c.bytes(), 2 * B * Hkv * cap * d * 2);
    // Values that need rounding: ties, halfway cases, large and tiny magnitudes.
    std::vector<float> k = mha_test::random_floats(Hkv * 5 * d, -3.0f, 3.0f, 41), v = mha_test::random_floats(Hkv * 5 * d, -1e-3f, 1e-3f, 42);
    k[0] = 1.0f + 0x1p-8f, k[1] = 1.0f + 0x1p-11f, k[2] = 65519.0f, k[3] = -1e-7f;
    c.append(1, mha::ConstHeads::bhld(k.data(), 1, Hkv, 5, d), mha::ConstHeads::bhld(v.data(), 1, Hkv, 5, d));
    EXPECT_EQ(c.length(1), 5u);
    for (std::size_t h = 0; h < Hkv; ++h) {
        std::vector<float> kw(5 * d), vw(5 * d);
        c.copy_keys(1, h, mha::Matrix(kw.data(), 5, d));
        c.copy_values(1, h, mha::Matrix(vw.data(), 5, d));
        for (std::size_t i = 0; i < 5 * d; ++i) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(kw[i]), std::bit_cast<std::uint32_t>(round_to(t, k[h * 5 * d + i]))) << i;
            ASSERT_EQ(std::bit_cast<std::uint32_t>(vw[i]), std::bit_cast<std::uint32_t>(round_to(t, v[h * 5 * d + i]))) << i;
        }
    }
    // The typed views: the same bits.
    if (t == DataType::bf16) {
        const mha::HeadsView<const mha::bfloat16> kv = c.keys_as<mha::bfloat16>();
        EXPECT_EQ(kv.head(1, 2)(4, 7).bits, mha::bfloat16::from_float(k[(2 * 5 + 4) * d + 7]).bits);
        EXPECT_THROW((void)c.keys_as<mha::float16>(), mha::invalid_argument);
    } else {
        const mha::HeadsView<const mha::float16> vv = c.values_as<mha::float16>();
        EXPECT_EQ(vv.head(1, 2)(4, 7).bits, mha::float16::from_float(v[(2 * 5 + 4) * d + 7]).bits);
        EXPECT_THROW((void)c.values_as<mha::bfloat16>(), mha::invalid_argument);
    }
    EXPECT_THROW((void)c.keys_as<float>(), mha::invalid_argument);
    // fp32 views of 16-bit data are refused, with a message naming the type.
    try {
        (void)c.keys(1, 0);
        ADD_FAILURE() << "keys(b, h) of a half cache did not throw";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(mha::data_type_name(t))), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)c.values(1, 0), mha::invalid_argument);
    EXPECT_THROW((void)c.keys(), mha::invalid_argument);
    EXPECT_THROW((void)c.values(), mha::invalid_argument);
    EXPECT_THROW((void)mha::detail::KVCacheAccess::key_data(c), mha::invalid_argument);
    EXPECT_THROW((void)mha::detail::KVCacheAccess::value_data(c), mha::invalid_argument);
    std::vector<float> small(4 * d);
    EXPECT_THROW(c.copy_keys(1, 0, mha::Matrix(small.data(), 4, d)), mha::invalid_argument);  // length is 5
    EXPECT_THROW(c.copy_keys(1, 3, mha::Matrix(small.data(), 5, d)), mha::invalid_argument);  // no KV head 3
    EXPECT_NO_THROW(c.copy_keys(0, 0, mha::Matrix(nullptr, 0, d)));                          // empty sequence
    // A move keeps the type and the data.
    mha::KVCache moved(std::move(c));
    EXPECT_EQ(moved.element_type(), t);
    EXPECT_EQ(moved.length(1), 5u);
    // An f32 cache keeps its float views.
    const mha::KVCache f(1, 1, 4, 2);
    EXPECT_EQ(f.element_type(), DataType::f32);
    EXPECT_EQ(f.bytes(), 2u * 4 * 2 * 4);
    EXPECT_NO_THROW((void)f.keys());
}

TEST(HalfCacheArguments, RejectsAnUnknownElementType) {
    EXPECT_THROW(mha::KVCache(1, 1, 4, 4, static_cast<DataType>(7)), mha::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Types, HalfCache, ::testing::Values(DataType::bf16, DataType::f16),
                         [](const auto& info) { return std::string(mha::data_type_name(info.param)); });

// ---- the layer with a half cache -----------------------------------------------------------------

// A step of Lq new tokens after per-sequence prefixes appended from pk / pv (rounded by the cache).
struct HalfStep {
    DecoderLayer layer;
    std::size_t B, Lq, capacity;
    std::vector<std::size_t> prefix;
    std::vector<std::vector<float>> pk, pv;  // [1, Hkv, n_b, d] per sequence, unrounded
    std::vector<float> x;                    // [B, Lq, E]

    HalfStep(DecoderLayer l, std::size_t lq, std::vector<std::size_t> n, std::uint32_t seed)
        : layer(std::move(l)), B(n.size()), Lq(lq), prefix(std::move(n)) {
        capacity = *std::max_element(prefix.begin(), prefix.end()) + Lq;
        mha_decode_test::random_prefixes(layer.Hkv, layer.d, prefix, seed, pk, pv);
        x = mha_decode_test::uniform(B * Lq * layer.E, 1.0f, seed + 999);
    }
    // A cache of type t holding the prefixes, each element first passed through `f` (identity: the cache rounds).
    template <class F>
    mha::KVCache cache(DataType t, F f) const {
        mha::KVCache c = mha_decode_test::filled_cache(B, layer.Hkv, layer.d, capacity, 0.0f, t);
        for (std::size_t b = 0; b < B; ++b) {
            std::vector<float> k = pk[b], v = pv[b];
            for (float& e : k) e = f(e);
            for (float& e : v) e = f(e);
            if (prefix[b] > 0)
                c.append(b, mha::ConstHeads::bhld(k.data(), 1, layer.Hkv, prefix[b], layer.d),
                         mha::ConstHeads::bhld(v.data(), 1, layer.Hkv, prefix[b], layer.d));
        }
        return c;
    }
    mha::KVCache cache(DataType t) const {
        return cache(t, [](float e) { return e; });
    }
    std::vector<float> run(const mha::MultiheadAttention& m, mha::KVCache& c, mha::Backend backend, int threads = 0,
                           mha::Impl impl = mha::Impl::automatic, mha::Workspace* ws = nullptr) const {
        std::vector<float> out(B * Lq * layer.E, std::nanf(""));
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), B, Lq, layer.E);
        mha::ForwardOptions o;
        o.backend = backend, o.threads = threads, o.impl = impl;
        if (ws != nullptr)
            m.forward(in, {mha::Batch(out.data(), B, Lq, layer.E)}, o, c, *ws);
        else
            m.forward(in, {mha::Batch(out.data(), B, Lq, layer.E)}, o, c);
        return out;
    }
    std::size_t workspace_bytes(const mha::MultiheadAttention& m, const mha::KVCache& c, mha::Impl impl) const {
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(x.data(), B, Lq, layer.E);
        mha::ForwardOptions o;
        o.impl = impl;
        return m.workspace_bytes(in, o, c);
    }
};

// All K and V rows of a cache (lengths as they are), widened, [B, Hkv, length, d] concatenated.
std::vector<float> cache_rows(const mha::KVCache& c) {
    std::vector<float> r;
    for (std::size_t b = 0; b < c.batch(); ++b)
        for (std::size_t h = 0; h < c.kv_heads(); ++h) {
            std::vector<float> k(c.length(b) * c.head_dim()), v(k.size());
            c.copy_keys(b, h, mha::Matrix(k.data(), c.length(b), c.head_dim()));
            c.copy_values(b, h, mha::Matrix(v.data(), c.length(b), c.head_dim()));
            r.insert(r.end(), k.begin(), k.end());
            r.insert(r.end(), v.begin(), v.end());
        }
    return r;
}

struct PathCase {
    std::size_t Lq;
    mha::Impl impl;
    const char* name;
};

class HalfCacheLayer : public ::testing::TestWithParam<DataType> {};

// Decode (Lq 1 and 4), grouped (Lq 20) and materialized: both backends against the double value with the
// half cache's rounding, and against each other.
TEST_P(HalfCacheLayer, EveryPathAgainstDoubleAndScalar) {
    const DataType t = GetParam();
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    std::uint32_t seed = 9100;
    for (const PathCase& pc : {PathCase{1, mha::Impl::automatic, "decode"}, PathCase{4, mha::Impl::automatic, "decode"},
                               PathCase{20, mha::Impl::automatic, "grouped"}, PathCase{3, mha::Impl::materialized, "materialized"}})
        for (std::size_t d : {64u, 80u}) {
            seed += 30;
            // The decode cases past one split of 16-bit rows (2048 keys: decode_split), so the merge is checked too.
            const std::vector<std::size_t> prefix = std::string(pc.name) == "decode" ? std::vector<std::size_t>{2200, 517}
                                                                                   : std::vector<std::size_t>{1100, 517};
            const HalfStep s(DecoderLayer(96, 8, 2, d, rope, true, false, seed), pc.Lq, prefix, seed + 3);
            SCOPED_TRACE(::testing::Message() << pc.name << " Lq " << pc.Lq << " d " << d);
            const mha::MultiheadAttention m = s.layer.make();
            const mha::KVCache before = s.cache(t);
            const auto ex = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, s.Lq, &before, KVRounding::of(t));
            const std::vector<double> tol = mha_test::backend_difference_bound(ex.out_err);
            EXPECT_LT(mha_test::relative_tolerance(ex.out, tol), 0.02) << "bound too loose to catch anything";
            mha::KVCache sc = s.cache(t);
            const std::vector<float> scalar = s.run(m, sc, mha::Backend::scalar, 0, pc.impl);
            ASSERT_TRUE(mha_test::all_within(scalar, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "scalar vs double";
            mha_test::for_each_cpu_isa([&](mha::Isa) {
                mha::KVCache c = s.cache(t);
                const std::vector<float> simd = s.run(m, c, mha::Backend::simd, 0, pc.impl);
                ASSERT_TRUE(mha_test::all_within(simd, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "SIMD vs double";
                ASSERT_TRUE(mha_test::all_within(simd, as_double(scalar), tol)) << "SIMD vs scalar";
                // The appended rows: the rounding of the new K / V (within the bound of the double value), prefixes unchanged.
                for (std::size_t b = 0; b < s.B; ++b) {
                    ASSERT_EQ(c.length(b), s.prefix[b] + s.Lq);
                    for (std::size_t h = 0; h < s.layer.Hkv; ++h) {
                        std::vector<float> k(c.length(b) * d), v(k.size());
                        c.copy_keys(b, h, mha::Matrix(k.data(), c.length(b), d));
                        c.copy_values(b, h, mha::Matrix(v.data(), c.length(b), d));
                        for (std::size_t j = 0; j < s.prefix[b]; ++j)
                            for (std::size_t e = 0; e < d; ++e) {
                                ASSERT_EQ(k[j * d + e], round_to(t, s.pk[b][(h * s.prefix[b] + j) * d + e]));
                                ASSERT_EQ(v[j * d + e], round_to(t, s.pv[b][(h * s.prefix[b] + j) * d + e]));
                            }
                        for (std::size_t i = 0; i < s.Lq; ++i)
                            for (std::size_t e = 0; e < d; ++e) {
                                const std::size_t at = ex.k.at(b, h, i, e), row = (s.prefix[b] + i) * d + e;
                                ASSERT_LE(std::abs(k[row] - ex.k.val[at]), mha_test::kDecoderSafety * ex.k.err[at]) << "new K";
                                ASSERT_LE(std::abs(v[row] - ex.v.val[at]), mha_test::kDecoderSafety * ex.v.err[at]) << "new V";
                                ASSERT_EQ(k[row], round_to(t, k[row])) << "new K not representable";
                            }
                    }
                }
            });
        }
}

// Attention used the rounded rows: the output is within the float-level bound of a double evaluation over
// the rows the call stored (old and new, exact), which rejects the same step over an unrounded prefix (an f32
// cache) and over a prefix rounded toward zero. And the half cache's result is within the bound that charges
// every K / V element its rounding, measured from the f32 cache holding the unrounded prefix.
TEST_P(HalfCacheLayer, BoundRejectsAWrongCacheAndHoldsAgainstTheF32Cache) {
    const DataType t = GetParam();
    const mha::RopeConfig rope{10000.0f, 0, mha::RopeStyle::half};
    for (std::size_t Lq : {1u, 4u})
        for (const std::vector<std::size_t>& prefix : {std::vector<std::size_t>{1100, 517}, std::vector<std::size_t>{9, 5}}) {
        const bool small = prefix[0] < 100;  // a small layer: float-level bounds tight enough to see 0.49 f16 ulp
        HalfStep s(small ? DecoderLayer(32, 4, 2, 16, rope, true, false, 9700 + std::uint32_t(Lq))
                         : DecoderLayer(96, 8, 2, 64, rope, true, false, 9700 + std::uint32_t(Lq)),
                   Lq, prefix, 9710);
        for (auto* rows : {&s.pk, &s.pv})
            for (std::vector<float>& seq : *rows)
                for (float& e : seq) e = nudge(t, e);
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq << " prefix " << prefix[0]);
        const mha::MultiheadAttention m = s.layer.make();
        const mha::KVCache before = s.cache(t);
        const mha::KVCache f32_before = s.cache(DataType::f32);
        const auto loose = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, s.Lq, &f32_before, KVRounding::of(t, true));
        for (mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd})
            mha_test::for_each_cpu_isa([&](mha::Isa isa) {
                if (backend == mha::Backend::scalar && isa != mha::simd::kSimdIsas[0]) return;  // scalar: once
                mha::KVCache half = s.cache(t);
                const std::vector<float> out = s.run(m, half, backend);
                const auto ex = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, s.Lq, &before, {}, &half);
                const std::vector<double> tight = times(ex.out_err, mha_test::kDecoderSafety);
                EXPECT_TRUE(mha_test::all_within(out, ex.out, tight)) << "over the stored rows";
                EXPECT_TRUE(mha_test::all_within(out, loose.out, times(loose.out_err, mha_test::kDecoderSafety))) << "vs the f32 cache";
                if (backend == mha::Backend::scalar || !small) return;
                mha::KVCache unrounded = s.cache(DataType::f32);
                const std::vector<float> u_out = s.run(m, unrounded, backend);
                mha::KVCache truncated = s.cache(DataType::f32, [t](float e) { return truncate_to(t, e); });
                const std::vector<float> t_out = s.run(m, truncated, backend);
                EXPECT_GT(worst_ratio(u_out, ex.out, tight), 1.0) << "an unrounded prefix passed";
                EXPECT_GT(worst_ratio(t_out, ex.out, tight), 1.0) << "a truncated prefix passed";
            });
    }
}

// Threads 1, 2, 3 (and the default): the same output and cache bits, decode and grouped paths.
TEST_P(HalfCacheLayer, BitwiseEqualAcrossThreadCounts) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 3);
    const DataType t = GetParam();
    for (std::size_t Lq : {1u, 20u}) {
        const HalfStep s(DecoderLayer(96, 8, 2, 64, mha::RopeConfig{10000.0f, 0, mha::RopeStyle::interleaved}, true, false, 9800),
                         Lq, {1300, 700}, 9810);
        const mha::MultiheadAttention m = s.layer.make();
        mha_test::for_each_cpu_isa([&](mha::Isa) {
            mha::KVCache c1 = s.cache(t);
            const std::vector<float> one = s.run(m, c1, mha::Backend::simd, 1);
            for (int threads : {2, 3, 0}) {
                mha::KVCache c = s.cache(t);
                EXPECT_TRUE(mha_decode_test::same_bits(s.run(m, c, mha::Backend::simd, threads), one)) << threads << " threads, Lq " << Lq;
                EXPECT_TRUE(mha_decode_test::same_bits(cache_rows(c), cache_rows(c1))) << threads << " threads, Lq " << Lq;
            }
        });
    }
}

// workspace_bytes(in, opt, cache) is exact for a half cache on every path (the grouped and materialized
// paths widen the cached rows into it): a Workspace of that size runs the call, with the same bits.
TEST_P(HalfCacheLayer, WorkspaceOfTheQueriedSizeSuffices) {
    const DataType t = GetParam();
    for (const PathCase& pc : {PathCase{1, mha::Impl::automatic, "decode"}, PathCase{20, mha::Impl::automatic, "grouped"},
                               PathCase{3, mha::Impl::materialized, "materialized"}}) {
        SCOPED_TRACE(pc.name);
        const HalfStep s(DecoderLayer(64, 4, 2, 32, std::nullopt, false, false, 9900), pc.Lq, {300, 45}, 9910);
        const mha::MultiheadAttention m = s.layer.make();
        mha::KVCache c0 = s.cache(t);
        const std::size_t bytes = s.workspace_bytes(m, c0, pc.impl);
        const std::vector<float> want = s.run(m, c0, mha::Backend::simd, 0, pc.impl);
        std::vector<unsigned char> mem(bytes);
        mha::Workspace ws(mem.data(), mem.size());
        mha::KVCache c = s.cache(t);
        std::vector<float> got;
        ASSERT_NO_THROW(got = s.run(m, c, mha::Backend::simd, 0, pc.impl, &ws));
        EXPECT_TRUE(mha_decode_test::same_bits(got, want));
        // The widened copy is part of the count off the decode path: the f32 cache needs less there. On the
        // decode path nothing is widened, but 16-bit rows are split 2048 keys at a time where fp32 rows are split
        // 512 (decode_split): one split here either way, with a score row four times as long; both 16-bit types
        // need the same.
        const std::size_t f32_bytes = s.workspace_bytes(m, s.cache(DataType::f32), pc.impl);
        EXPECT_GT(bytes, f32_bytes);
        if (std::string(pc.name) == "decode") {
            const DataType other = t == DataType::bf16 ? DataType::f16 : DataType::bf16;
            EXPECT_EQ(bytes, s.workspace_bytes(m, s.cache(other), pc.impl));
        }
    }
}

// A NaN in one new token's input: its K and V round to NaN in the half cache (bf16 / f16 keep NaN), and the
// tokens before it (causal) stay within their bound of the double value without it; it and the later tokens
// are NaN. Lq = 4 (decode path: the split's careful P·V over 16-bit rows) and 24 (grouped: widened rows).
TEST_P(HalfCacheLayer, NanTokenDoesNotReachEarlierTokens) {
    const DataType t = GetParam();
    for (std::size_t Lq : {4u, 24u}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
        const HalfStep s(DecoderLayer(64, 8, 2, 32, mha::RopeConfig{10000.0f, 0, mha::RopeStyle::half}, true, false, 9950), Lq,
                         {600, 20}, 9951);
        const std::size_t bad = Lq / 2, E = s.layer.E;
        const mha::MultiheadAttention m = s.layer.make();
        HalfStep poisoned = s;
        poisoned.x[bad * E + 3] = std::nanf("");  // sequence 0, token `bad`
        const mha::KVCache before = s.cache(t);
        const auto ex = mha_decode_test::step_double(s.layer.ref(), s.x.data(), s.B, Lq, &before, KVRounding::of(t));
        auto check = [&](mha::Backend backend) {
            mha::KVCache c = poisoned.cache(t);
            const std::vector<float> got = poisoned.run(m, c, backend);
            for (std::size_t b = 0; b < 2; ++b)
                for (std::size_t i = 0; i < Lq; ++i)
                    for (std::size_t e = 0; e < E; ++e) {
                        const std::size_t at = (b * Lq + i) * E + e;
                        if (b == 0 && i >= bad)
                            ASSERT_TRUE(std::isnan(got[at])) << "token " << i << " sees the NaN token";
                        else
                            ASSERT_LE(std::abs(double(got[at]) - ex.out[at]), mha_test::kDecoderSafety * ex.out_err[at])
                                << "b " << b << " token " << i << " col " << e;
                    }
        };
        check(mha::Backend::scalar);
        mha_test::for_each_cpu_isa([&](mha::Isa) { check(mha::Backend::simd); });
    }
}

INSTANTIATE_TEST_SUITE_P(Types, HalfCacheLayer, ::testing::Values(DataType::bf16, DataType::f16),
                         [](const auto& info) { return std::string(mha::data_type_name(info.param)); });

}  // namespace
