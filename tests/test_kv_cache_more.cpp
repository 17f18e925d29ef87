// KVCache and MultiheadAttention::forward with a cache, issue 13's list (tests/test_kv_cache.cpp has the first
// checks; these go further), on both backends and, for the SIMD one, on every ISA this CPU has:
//   - incremental == one-shot: a 130-token sequence pair (B = 2) fed in chunks of 1, 2, 7, 64 and mixed sizes
//     equals one causal forward over the whole sequence, with GQA, RoPE half and interleaved (all dims and
//     partial), q/k/v/out biases, the post-norm (with and without gamma/beta), H·d ≠ E; the cache then holds
//     the rotated K and the V of every token;
//   - a ragged batch (lengths 0, 1, 5, capacity − Lq) decoded together == each sequence decoded alone;
//   - capacity overflow: mha::invalid_argument naming the sequence, the cache (keys, values, stale rows,
//     lengths) and the output untouched; a call that fills the cache exactly works;
//   - truncate then continue == never having fed the dropped tokens (bitwise), also with NaN in the stale
//     rows past the length (never read); partial acceptance within the bound; reset;
//   - append() of external K/V (Hugging Face past_key_values, [B, Hkv, L, d] or [B, L, Hkv, d], in pieces) then
//     forward == having produced them by forward (bitwise); append's own errors write nothing;
//   - every validation error of the cache call (cache shape, key/value, masks, need_weights, positions, batch,
//     overlaps with the cache, an empty cache) throws mha::invalid_argument naming the problem, writes nothing
//     (cache included), and workspace_bytes(in, opt, cache) refuses the same calls;
//   - workspace_bytes(in, opt, cache) is enough: a workspace of exactly that size gives the same bits, one byte
//     less is refused with nothing written;
//   - threads 1, 2 and 3 give the same bits.
// Tolerances (decode_test_util.hpp): the double evaluation of the whole causal forward carries a first-order
// bound per output element; each backend, chunked or not, is within kDecoderSafety (2) times it of the exact
// value, so two float results differ by at most 2·2·bound. Where the same computation meets the same cached
// rows (truncate, reset, append of the rows forward wrote, thread counts) the results are compared bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <tbb/global_control.h>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"
#include "compare_util.hpp"
#include "decode_test_util.hpp"

namespace {

using mha_decode_test::as_double;
using mha_decode_test::CacheSnapshot;
using mha_decode_test::DecoderLayer;
using mha_decode_test::same_bits;
using mha_decode_test::times;

constexpr float kSentinel = 777.0f;  // output memory no failed call may write
constexpr double kMaxRelativeBound = 1e-2;

// Feeds rows [i0, i0 + n) of every sequence of x [B, L, E] (a strided view, no copy) into the cache; returns the
// outputs [B, n, E].
std::vector<float> feed(const mha::MultiheadAttention& m, const std::vector<float>& x, std::size_t B, std::size_t L,
                        std::size_t i0, std::size_t n, mha::KVCache& cache, const mha::ForwardOptions& opt) {
    const std::size_t E = m.embed_dim();
    std::vector<float> out(B * n * E, std::numeric_limits<float>::quiet_NaN());
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(x.data() + i0 * E, B, n, E, E, L * E);
    m.forward(in, {mha::Batch(out.data(), B, n, E)}, opt, cache);
    return out;
}

mha::ForwardOptions options(mha::Backend backend, std::optional<float> eps = std::nullopt, int threads = 0) {
    mha::ForwardOptions o;
    o.backend = backend, o.norm_eps = eps, o.threads = threads;
    return o;
}

// Runs f(backend) for the scalar backend, then for the SIMD one on every ISA.
template <class F>
void each_backend(F f) {
    {
        SCOPED_TRACE("scalar");
        f(mha::Backend::scalar);
    }
    mha_test::for_each_cpu_isa([&](mha::Isa) { f(mha::Backend::simd); });
}

// Copies `src` rows [from, from + n) of `dst`-shaped [B, n_total, E] blocks into dst rows [at, at + n).
void put_rows(std::vector<float>& dst, const std::vector<float>& src, std::size_t B, std::size_t L, std::size_t E, std::size_t at,
              std::size_t n) {
    for (std::size_t b = 0; b < B; ++b)
        std::copy_n(src.begin() + std::ptrdiff_t(b * n * E), n * E, dst.begin() + std::ptrdiff_t((b * L + at) * E));
}

// The first n rows of sequence b of a cache as a [1, Hkv, n, d] view (append's argument).
mha::ConstHeads prefix(const mha::KVCache& c, std::size_t b, std::size_t n, bool values) {
    const mha::ConstHeads all = values ? c.values() : c.keys();
    return mha::ConstHeads(all.data + b * all.batch_stride, 1, all.heads, n, all.dim, all.batch_stride, all.head_stride, all.row_stride);
}

mha::RopeConfig rope(mha::RopeStyle style, std::size_t dims = 0) { return {10000.0f, dims, style}; }

// ---------------------------------------------------------------------------------------------------
// Incremental == one-shot.

struct ChunkCase {
    const char* name;
    std::size_t E, H, Hkv, d;
    std::optional<mha::RopeConfig> rope;
    bool biases, norm_params;
    std::optional<float> eps;
    std::size_t L;
};

const ChunkCase kChunkCases[] = {
    {"GQA G=4, RoPE half, biases", 64, 8, 2, 16, rope(mha::RopeStyle::half), true, false, std::nullopt, 130},
    {"MQA G=4 d=32, RoPE interleaved, biases, post-norm with gamma/beta", 64, 4, 1, 32, rope(mha::RopeStyle::interleaved), true, true,
     1e-5f, 130},
    {"G=2 H·d=96 != E=48, RoPE half on 8 of 16 dims, no biases, post-norm eps 1e-3 without gamma/beta", 48, 6, 3, 16,
     rope(mha::RopeStyle::half, 8), false, false, 1e-3f, 100},
};

std::vector<std::vector<std::size_t>> chunkings(std::size_t L) {
    auto repeat = [L](std::size_t n) {
        std::vector<std::size_t> c(L / n, n);
        if (L % n) c.push_back(L % n);
        return c;
    };
    std::vector<std::size_t> mixed;
    const std::size_t pattern[] = {1, 16, 3, 64, 2, 7, 1, 5};
    for (std::size_t at = 0, k = 0; at < L; ++k) {
        const std::size_t n = std::min(pattern[k % 8], L - at);
        mixed.push_back(n), at += n;
    }
    return {repeat(1), repeat(2), repeat(7), repeat(64), mixed, {L}};
}

TEST(KvCacheMore, AnyChunkingEqualsOneCausalForward) {
    std::uint32_t seed = 100;
    for (const ChunkCase& cc : kChunkCases) {
        SCOPED_TRACE(cc.name);
        const DecoderLayer layer(cc.E, cc.H, cc.Hkv, cc.d, cc.rope, cc.biases, cc.norm_params, seed += 20);
        const mha::MultiheadAttention m = layer.make();
        const std::size_t B = 2, L = cc.L, E = cc.E;
        const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, seed + 11);
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(layer.ref(cc.eps), x.data(), B, L, nullptr);
        const std::vector<double> tol2 = times(ex.out_err, mha_test::kDecoderSafety), tol4 = mha_test::backend_difference_bound(ex.out_err);
        ASSERT_LT(mha_test::relative_tolerance(ex.out, tol4), kMaxRelativeBound) << "bound too loose to catch anything";
        // The cache's rows in order (b, KV head, token) and their bounds.
        const std::vector<double> k_err = times(ex.k.err, mha_test::kDecoderSafety), v_err = times(ex.v.err, mha_test::kDecoderSafety);
        each_backend([&](mha::Backend backend) {
            // One causal forward over the whole sequences, no cache.
            std::vector<float> one_shot(B * L * E, std::numeric_limits<float>::quiet_NaN());
            mha::ForwardOptions o = options(backend, cc.eps);
            o.causal = true;
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data(), B, L, E);
            m.forward(in, {mha::Batch(one_shot.data(), B, L, E)}, o);
            ASSERT_TRUE(mha_test::all_within(one_shot, ex.out, tol2)) << "one causal forward vs double";
            for (const std::vector<std::size_t>& chunks : chunkings(L)) {
                SCOPED_TRACE(::testing::Message() << chunks.size() << " chunks, the first of " << chunks[0]);
                mha::KVCache cache = mha_decode_test::filled_cache(B, cc.Hkv, cc.d, L + 3);
                std::vector<float> got(B * L * E, std::numeric_limits<float>::quiet_NaN());
                std::size_t at = 0;
                for (std::size_t n : chunks) {
                    put_rows(got, feed(m, x, B, L, at, n, cache, options(backend, cc.eps)), B, L, E, at, n);
                    at += n;
                    ASSERT_EQ(cache.length(0), at);
                    ASSERT_EQ(cache.length(1), at);
                }
                ASSERT_TRUE(mha_test::all_within(got, ex.out, tol2)) << "chunked vs double";
                ASSERT_TRUE(mha_test::all_within(got, as_double(one_shot), tol4)) << "chunked vs one causal forward";
                ASSERT_TRUE(mha_test::all_within(mha_decode_test::cached_rows(cache, false), ex.k.val, k_err)) << "cached K (rotated)";
                ASSERT_TRUE(mha_test::all_within(mha_decode_test::cached_rows(cache, true), ex.v.val, v_err)) << "cached V";
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------------
// Ragged batches.

// Sequences with prefixes of 0, 1, 5 and capacity − Lq cached rows (loaded with append) take Lq tokens together,
// and each alone in a batch-1 cache with the same prefix: the same outputs within the bound (and each within the
// bound of the double evaluation), the same appended rows, each sequence's length advanced by Lq. capacity 600
// puts the longest over two splits of 512. Lq = 1 and 3 run the few-token projections and the decode path; Lq = 40
// (B·Lq = 160 tokens) the row-block projections and, with G = 4, the grouped path, with G = 1 the materialized
// one: each with its per-sequence key lengths and bottom-right causal edge.
TEST(KvCacheMore, RaggedBatchDecodedTogetherEqualsEachAlone) {
    const std::size_t E = 64, d = 32, cap = 600;
    for (std::size_t Hkv : {2, 8}) {
        const DecoderLayer layer(E, 8, Hkv, d, rope(mha::RopeStyle::interleaved), true, false, 300 + std::uint32_t(Hkv));
        const mha::MultiheadAttention m = layer.make();
        for (std::size_t Lq : {1, 3, 40}) {
            SCOPED_TRACE(::testing::Message() << "Hkv " << Hkv << ", Lq " << Lq);
            const std::vector<std::size_t> lengths = {0, 1, 5, cap - Lq};
            const std::size_t B = lengths.size();
            std::vector<std::vector<float>> pk, pv;
            const std::vector<float> mean = mha_decode_test::uniform(Hkv * d, 1.0f, 305);  // values with a mean (see test_decode.cpp)
            for (std::size_t b = 0; b < B; ++b) {
                pk.push_back(mha_decode_test::uniform(Hkv * lengths[b] * d, 2.0f, 310 + std::uint32_t(b)));
                pv.push_back(mha_decode_test::uniform(Hkv * lengths[b] * d, 0.5f, 320 + std::uint32_t(b)));
                for (std::size_t n = 0; n < pv[b].size(); ++n) pv[b][n] += mean[(n / (lengths[b] * d)) * d + n % d];
            }
            auto load = [&](mha::KVCache& c, std::size_t slot, std::size_t b) {
                if (lengths[b] > 0)
                    c.append(slot, mha::ConstHeads::bhld(pk[b].data(), 1, Hkv, lengths[b], d), mha::ConstHeads::bhld(pv[b].data(), 1, Hkv, lengths[b], d));
            };
            const std::vector<float> x = mha_decode_test::uniform(B * Lq * E, 1.0f, 330);
            mha::KVCache before = mha_decode_test::filled_cache(B, Hkv, d, cap);
            for (std::size_t b = 0; b < B; ++b) load(before, b, b);
            const mha_decode_test::StepExpected ex = mha_decode_test::step_double(layer.ref(), x.data(), B, Lq, &before);
            const std::vector<double> tol = mha_test::backend_difference_bound(ex.out_err);
            ASSERT_LT(mha_test::relative_tolerance(ex.out, tol), kMaxRelativeBound) << "bound too loose to catch anything";
            each_backend([&](mha::Backend backend) {
                mha::KVCache together = mha_decode_test::filled_cache(B, Hkv, d, cap);
                for (std::size_t b = 0; b < B; ++b) load(together, b, b);
                std::vector<float> out_together = feed(m, x, B, Lq, 0, Lq, together, options(backend));
                std::vector<float> out_alone(B * Lq * E);
                for (std::size_t b = 0; b < B; ++b) {
                    mha::KVCache alone = mha_decode_test::filled_cache(1, Hkv, d, cap);
                    load(alone, 0, b);
                    const std::vector<float> xb(x.begin() + std::ptrdiff_t(b * Lq * E), x.begin() + std::ptrdiff_t((b + 1) * Lq * E));
                    const std::vector<float> ob = feed(m, xb, 1, Lq, 0, Lq, alone, options(backend));
                    std::copy(ob.begin(), ob.end(), out_alone.begin() + std::ptrdiff_t(b * Lq * E));
                    ASSERT_EQ(alone.length(0), lengths[b] + Lq);
                    ASSERT_EQ(together.length(b), lengths[b] + Lq);
                    for (std::size_t h = 0; h < Hkv; ++h)
                        for (bool values : {false, true}) {
                            const mha::ConstMatrix a = values ? alone.values(0, h) : alone.keys(0, h);
                            const mha::ConstMatrix t = values ? together.values(b, h) : together.keys(b, h);
                            for (std::size_t i = 0; i < lengths[b] + Lq; ++i)
                                for (std::size_t c = 0; c < d; ++c) {
                                    const double bound = i < lengths[b] ? 0.0
                                                                        : 2 * mha_test::kDecoderSafety *
                                                                              (values ? ex.v.err : ex.k.err)[ex.k.at(b, h, i - lengths[b], c)];
                                    ASSERT_LE(std::abs(double(a(i, c)) - double(t(i, c))), bound) << "b " << b << " h " << h << " row " << i;
                                }
                        }
                }
                ASSERT_TRUE(mha_test::all_within(out_together, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "together vs double";
                ASSERT_TRUE(mha_test::all_within(out_alone, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "alone vs double";
                ASSERT_TRUE(mha_test::all_within(out_together, as_double(out_alone), tol)) << "together vs each alone";
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Capacity.

TEST(KvCacheMore, CapacityOverflowLeavesCacheAndOutputUntouched) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), true, false, 400);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64, cap = 10;
    const std::vector<float> x = mha_decode_test::uniform(4 * cap * E, 1.0f, 401);  // room for a batch stride of cap rows
    struct Over {
        std::vector<std::size_t> lengths;
        std::size_t Lq;
        const char* message;
    };
    const Over cases[] = {
        {{10, 3, 9}, 1, "sequence 0 holds 10 tokens; 1 more exceed the KV cache's capacity 10"},
        {{3, 9, 0}, 2, "sequence 1 holds 9 tokens; 2 more exceed the KV cache's capacity 10"},
        {{0, 0, 1}, 10, "sequence 2 holds 1 tokens; 10 more exceed the KV cache's capacity 10"},
        {{0, 0, 0}, 11, "sequence 0 holds 0 tokens; 11 more exceed the KV cache's capacity 10"},
    };
    each_backend([&](mha::Backend backend) {
        for (const Over& c : cases) {
            SCOPED_TRACE(c.message);
            mha::KVCache cache = mha_decode_test::filled_cache(3, 2, 16, cap, -3.0f);
            for (std::size_t b = 0; b < 3; ++b) {  // fill sequence b to its length with rows forward computed
                mha::KVCache one(1, 2, 16, cap);
                if (c.lengths[b] == 0) continue;
                (void)feed(m, x, 1, cap, 0, c.lengths[b], one, options(backend));
                cache.append(b, prefix(one, 0, c.lengths[b], false), prefix(one, 0, c.lengths[b], true));
            }
            const CacheSnapshot before(cache);
            std::vector<float> out(3 * c.Lq * E, kSentinel);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data(), 3, c.Lq, E, E, cap * E);
            for (bool with_workspace : {false, true}) {
                try {
                    if (with_workspace) {
                        mha::Workspace ws(std::size_t(1) << 22);
                        m.forward(in, {mha::Batch(out.data(), 3, c.Lq, E)}, options(backend), cache, ws);
                    } else {
                        m.forward(in, {mha::Batch(out.data(), 3, c.Lq, E)}, options(backend), cache);
                    }
                    ADD_FAILURE() << "no exception";
                } catch (const mha::invalid_argument& e) {
                    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
                }
                EXPECT_TRUE(CacheSnapshot(cache) == before) << "cache changed";
                EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; })) << "output written";
            }
        }
        // Filling the cache exactly is allowed: lengths 7 and 0 take 3 more and then 7 more.
        mha::KVCache cache(2, 2, 16, cap);
        (void)feed(m, x, 2, cap, 0, 7, cache, options(backend));
        (void)feed(m, x, 2, cap, 7, 3, cache, options(backend));
        EXPECT_EQ(cache.length(0), cap);
        EXPECT_EQ(cache.length(1), cap);
        EXPECT_THROW((void)feed(m, x, 2, cap, 0, 1, cache, options(backend)), mha::invalid_argument);
    });
}

// ---------------------------------------------------------------------------------------------------
// Truncate, reset, append.

// Sets every stale row of the cache (rows at or past each sequence's length) to NaN: no call may read them.
void poison_stale_rows(mha::KVCache& c) {
    const std::size_t d = c.head_dim(), cap = c.capacity();
    for (std::size_t b = 0; b < c.batch(); ++b)
        for (std::size_t h = 0; h < c.kv_heads(); ++h) {
            const std::size_t at = ((b * c.kv_heads() + h) * cap + c.length(b)) * d, n = (cap - c.length(b)) * d;
            std::fill_n(mha::detail::KVCacheAccess::key_data(c) + at, n, std::numeric_limits<float>::quiet_NaN());
            std::fill_n(mha::detail::KVCacheAccess::value_data(c) + at, n, std::numeric_limits<float>::quiet_NaN());
        }
}

// A speculative draft of 4 tokens rejected (truncate back to the prompt's 9) then 3 more tokens: the same bits
// as a cache that never saw the draft (outputs and cached rows), also with NaN in every stale row. Partial
// acceptance (sequence 1 keeps 2 draft tokens, sequence 0 none: ragged) attends over exactly the kept rows at
// the kept positions: within the bound of the double evaluation of that state.
TEST(KvCacheMore, TruncateThenContinueEqualsNeverFeedingTheDraft) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), true, true, 500);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 16, E = 64, cap = 20;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 501);  // prompt 0..8, draft 9..12, next 13..15
    const std::optional<float> eps = 1e-5f;
    each_backend([&](mha::Backend backend) {
        const mha::ForwardOptions o = options(backend, eps);
        mha::KVCache never = mha_decode_test::filled_cache(B, 2, 16, cap);
        (void)feed(m, x, B, L, 0, 9, never, o);
        const std::vector<float> want = feed(m, x, B, L, 13, 3, never, o);
        for (bool poison : {false, true}) {
            SCOPED_TRACE(poison ? "NaN in the stale rows" : "stale rows as the draft left them");
            mha::KVCache drafted = mha_decode_test::filled_cache(B, 2, 16, cap);
            (void)feed(m, x, B, L, 0, 9, drafted, o);
            (void)feed(m, x, B, L, 9, 4, drafted, o);
            drafted.truncate(0, 9), drafted.truncate(1, 9);
            EXPECT_EQ(drafted.lengths(), (std::vector<std::size_t>{9, 9}));
            if (poison) poison_stale_rows(drafted);
            EXPECT_TRUE(same_bits(feed(m, x, B, L, 13, 3, drafted, o), want)) << "outputs";
            EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(drafted, false), mha_decode_test::cached_rows(never, false))) << "keys";
            EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(drafted, true), mha_decode_test::cached_rows(never, true))) << "values";
        }
        // Partial acceptance, ragged: sequence 0 back to 9, sequence 1 keeps 2 draft tokens (11).
        mha::KVCache partial = mha_decode_test::filled_cache(B, 2, 16, cap);
        (void)feed(m, x, B, L, 0, 9, partial, o);
        (void)feed(m, x, B, L, 9, 4, partial, o);
        partial.truncate(0, 9), partial.truncate(1, 11);
        poison_stale_rows(partial);
        const std::vector<float> next = mha_decode_test::rows_of(x, B, L, E, 13, 3);
        const mha_decode_test::StepExpected ex = mha_decode_test::step_double(layer.ref(eps), next.data(), B, 3, &partial);
        const std::vector<float> got = feed(m, x, B, L, 13, 3, partial, o);
        EXPECT_TRUE(mha_test::all_within(got, ex.out, times(ex.out_err, mha_test::kDecoderSafety))) << "partial acceptance vs double";
        EXPECT_EQ(partial.lengths(), (std::vector<std::size_t>{12, 14}));
        // Sequence 0 matches the never-drafted cache's sequence 0 (the same rows, positions and call shape).
        for (std::size_t k = 0; k < 3 * E; ++k) ASSERT_EQ(got[k], want[k]) << "sequence 0, element " << k;
    });
    mha::KVCache c(2, 2, 16, cap);
    mha::ForwardOptions o;
    (void)feed(m, x, B, L, 0, 9, c, o);
    try {
        c.truncate(0, 10);
        ADD_FAILURE() << "truncate past the length";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("cannot truncate sequence 0 to 10 tokens: it holds 9"), std::string::npos) << e.what();
    }
    EXPECT_THROW(c.truncate(2, 0), mha::invalid_argument);
    EXPECT_EQ(c.lengths(), (std::vector<std::size_t>{9, 9}));
    c.truncate(1, 9);  // to its own length: nothing changes
    EXPECT_EQ(c.length(1), 9u);
}

// reset(b) forgets sequence b only: feeding the next tokens then gives the bits of a cache in which sequence b
// was never fed and the other sequence holds the same rows.
TEST(KvCacheMore, ResetOneSequence) {
    const DecoderLayer layer(64, 4, 2, 32, rope(mha::RopeStyle::interleaved), false, false, 600);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 12, cap = 16;
    const std::vector<float> x = mha_decode_test::uniform(B * L * 64, 1.0f, 601);
    each_backend([&](mha::Backend backend) {
        const mha::ForwardOptions o = options(backend);
        mha::KVCache a = mha_decode_test::filled_cache(B, 2, 32, cap);
        (void)feed(m, x, B, L, 0, 5, a, o);
        std::vector<float> k1, v1;  // sequence 1's five rows per KV head, [1, Hkv, 5, d]
        for (std::size_t h = 0; h < 2; ++h)
            for (std::size_t j = 0; j < 5; ++j) {
                k1.insert(k1.end(), a.keys(1, h).row(j), a.keys(1, h).row(j) + 32);
                v1.insert(v1.end(), a.values(1, h).row(j), a.values(1, h).row(j) + 32);
            }
        a.reset(0);
        EXPECT_EQ(a.lengths(), (std::vector<std::size_t>{0, 5}));
        EXPECT_EQ(a.keys(0, 1).rows, 0u);
        mha::KVCache w = mha_decode_test::filled_cache(B, 2, 32, cap);
        w.append(1, mha::ConstHeads::bhld(k1.data(), 1, 2, 5, 32), mha::ConstHeads::bhld(v1.data(), 1, 2, 5, 32));
        EXPECT_TRUE(same_bits(feed(m, x, B, L, 5, 3, a, o), feed(m, x, B, L, 5, 3, w, o)));
        EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(a, false), mha_decode_test::cached_rows(w, false)));
        EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(a, true), mha_decode_test::cached_rows(w, true)));
        EXPECT_EQ(a.lengths(), (std::vector<std::size_t>{3, 8}));
    });
    mha::KVCache c(2, 2, 32, cap);
    EXPECT_THROW(c.reset(2), mha::invalid_argument);
    EXPECT_THROW((void)c.length(2), mha::invalid_argument);
    EXPECT_THROW((void)c.keys(0, 2), mha::invalid_argument);
}

// Hugging Face's past_key_values loaded with append() (as [B, Hkv, L, d], and as [B, L, Hkv, d] through strides,
// in two pieces so the second lands after rows already there), then forward: the same bits as the cache forward
// filled itself. append's errors write nothing.
TEST(KvCacheMore, AppendExternalKeysValuesThenForward) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), true, false, 700);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 14, E = 64, Hkv = 2, d = 16, P = 9, cap = 14;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 701);
    each_backend([&](mha::Backend backend) {
        const mha::ForwardOptions o = options(backend);
        mha::KVCache produced = mha_decode_test::filled_cache(B, Hkv, d, cap);
        (void)feed(m, x, B, L, 0, P, produced, o);
        // past_key_values as Hugging Face holds them: [B, Hkv, P, d] (and a [B, P, Hkv, d] copy).
        std::vector<float> pk(B * Hkv * P * d), pv(pk.size()), pk2(pk.size()), pv2(pk.size());
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < Hkv; ++h)
                for (std::size_t j = 0; j < P; ++j)
                    for (std::size_t c = 0; c < d; ++c) {
                        pk[((b * Hkv + h) * P + j) * d + c] = produced.keys(b, h)(j, c);
                        pv[((b * Hkv + h) * P + j) * d + c] = produced.values(b, h)(j, c);
                        pk2[((b * P + j) * Hkv + h) * d + c] = produced.keys(b, h)(j, c);
                        pv2[((b * P + j) * Hkv + h) * d + c] = produced.values(b, h)(j, c);
                    }
        mha::KVCache loaded = mha_decode_test::filled_cache(B, Hkv, d, cap, 5.0f), loaded2 = mha_decode_test::filled_cache(B, Hkv, d, cap, -1.0f);
        for (std::size_t b = 0; b < B; ++b)
            for (const auto& [j0, n] : {std::pair<std::size_t, std::size_t>{0, 4}, {4, P - 4}}) {
                // rows [j0, j0 + n) of sequence b: [1, Hkv, n, d] views into the [B, Hkv, P, d] arrays
                loaded.append(b, mha::ConstHeads(pk.data() + (b * Hkv * P + j0) * d, 1, Hkv, n, d, Hkv * P * d, P * d, d),
                              mha::ConstHeads(pv.data() + (b * Hkv * P + j0) * d, 1, Hkv, n, d, Hkv * P * d, P * d, d));
                loaded2.append(b, mha::ConstHeads(pk2.data() + (b * P + j0) * Hkv * d, 1, Hkv, n, d, P * Hkv * d, d, Hkv * d),
                               mha::ConstHeads(pv2.data() + (b * P + j0) * Hkv * d, 1, Hkv, n, d, P * Hkv * d, d, Hkv * d));
                EXPECT_EQ(loaded.length(b), j0 + n);
            }
        const std::vector<float> want = feed(m, x, B, L, P, 3, produced, o);
        for (mha::KVCache* c : {&loaded, &loaded2}) {
            EXPECT_TRUE(same_bits(feed(m, x, B, L, P, 3, *c, o), want)) << "outputs";
            EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(*c, false), mha_decode_test::cached_rows(produced, false)));
            EXPECT_TRUE(same_bits(mha_decode_test::cached_rows(*c, true), mha_decode_test::cached_rows(produced, true)));
        }
    });

    // append's errors: each names the problem and leaves the cache as it was.
    mha::KVCache c = mha_decode_test::filled_cache(B, Hkv, d, 12);
    const std::vector<float> k = mha_decode_test::uniform(2 * Hkv * P * d, 1.0f, 702);
    c.append(0, mha::ConstHeads::bhld(k.data(), 1, Hkv, P, d), mha::ConstHeads::bhld(k.data(), 1, Hkv, P, d));
    const CacheSnapshot before(c);
    const mha::ConstHeads good = mha::ConstHeads::bhld(k.data(), 1, Hkv, 4, d);
    struct Bad {
        std::size_t b;
        mha::ConstHeads k, v;
        const char* message;
    };
    const Bad bad[] = {
        {0, good, good, "sequence 0 holds 9 tokens; 4 more exceed the capacity 12"},
        {2, good, good, "sequence 2 is out of range"},
        {1, mha::ConstHeads::bhld(k.data(), 2, Hkv, 4, d), good, "k is [2, 2, 4, 16] but must be [1, Hkv, n, d] with Hkv = 2 and d = 16"},
        {1, good, mha::ConstHeads::bhld(k.data(), 1, 1, 4, d), "v is [1, 1, 4, 16] but must be [1, Hkv, n, d]"},
        {1, good, mha::ConstHeads::bhld(k.data(), 1, Hkv, 4, 8), "v is [1, 2, 4, 8] but must be [1, Hkv, n, d]"},
        {1, good, mha::ConstHeads::bhld(k.data(), 1, Hkv, 3, d), "v has 3 tokens but k has 4"},
        {1, mha::ConstHeads::bhld(nullptr, 1, Hkv, 4, d), good, "k is a null pointer"},
    };
    for (const Bad& e : bad) {
        SCOPED_TRACE(e.message);
        try {
            c.append(e.b, e.k, e.v);
            ADD_FAILURE() << "no exception";
        } catch (const mha::invalid_argument& ex) {
            EXPECT_NE(std::string(ex.what()).find(e.message), std::string::npos) << ex.what();
        }
        EXPECT_TRUE(CacheSnapshot(c) == before);
    }
    c.append(1, mha::ConstHeads::bhld(k.data(), 1, Hkv, 0, d), mha::ConstHeads::bhld(k.data(), 1, Hkv, 0, d));  // nothing
    EXPECT_TRUE(CacheSnapshot(c) == before);
}

// An output whose rows are padded (row stride E + 5, batch stride 3 more): only the E values of each row are
// written, and they are the contiguous call's bits (a decode step, and a 40-token chunk on the row path).
TEST(KvCacheMore, OutputIntoPaddedRows) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), true, true, 1100);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 50, E = 64, rs = E + 5;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 1101);
    each_backend([&](mha::Backend backend) {
        const mha::ForwardOptions o = options(backend, 1e-5f);
        for (std::size_t Lq : {1, 40}) {
            SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
            mha::KVCache a = mha_decode_test::filled_cache(B, 2, 16, L), c = mha_decode_test::filled_cache(B, 2, 16, L);
            (void)feed(m, x, B, L, 0, 7, a, o);
            (void)feed(m, x, B, L, 0, 7, c, o);
            const std::vector<float> want = feed(m, x, B, L, 7, Lq, a, o);
            const std::size_t bs = Lq * rs + 3;
            std::vector<float> padded(B * bs, kSentinel);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data() + 7 * E, B, Lq, E, E, L * E);
            m.forward(in, {mha::Batch(padded.data(), B, Lq, E, rs, bs)}, o, c);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t t = 0; t < bs; ++t) {
                    const std::size_t i = t / rs, e = t % rs;
                    const float got = padded[b * bs + t];
                    if (i < Lq && e < E) ASSERT_EQ(got, want[(b * Lq + i) * E + e]) << b << " " << i << " " << e;
                    else ASSERT_EQ(got, kSentinel) << "padding written at " << b << " " << t;
                }
            EXPECT_TRUE(CacheSnapshot(a) == CacheSnapshot(c));
        }
    });
}

// A cache keeps working after a move (constructor and assignment): the moved-to cache continues the sequence
// with the same bits; the moved-from one is empty and refused.
TEST(KvCacheMore, MovedCacheContinues) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), false, false, 1200);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 12;
    const std::vector<float> x = mha_decode_test::uniform(B * L * 64, 1.0f, 1201);
    each_backend([&](mha::Backend backend) {
        const mha::ForwardOptions o = options(backend);
        mha::KVCache ref = mha_decode_test::filled_cache(B, 2, 16, L), first = mha_decode_test::filled_cache(B, 2, 16, L);
        (void)feed(m, x, B, L, 0, 5, ref, o);
        (void)feed(m, x, B, L, 0, 5, first, o);
        mha::KVCache second(std::move(first));
        EXPECT_EQ(first.batch(), 0u);
        EXPECT_EQ(second.lengths(), (std::vector<std::size_t>{5, 5}));
        const std::vector<float> want = feed(m, x, B, L, 5, 2, ref, o);
        EXPECT_TRUE(same_bits(feed(m, x, B, L, 5, 2, second, o), want));
        mha::KVCache third(1, 1, 1, 1);
        third = std::move(second);
        EXPECT_EQ(second.batch(), 0u);
        EXPECT_EQ(third.capacity(), L);
        EXPECT_TRUE(same_bits(feed(m, x, B, L, 7, 1, third, o), feed(m, x, B, L, 7, 1, ref, o)));
        EXPECT_THROW((void)feed(m, x, B, L, 8, 1, second, o), mha::invalid_argument);
    });
}

// Construction: zero dimensions and sizes past the address space are refused; the views describe the storage.
TEST(KvCacheMore, ConstructionAndViews) {
    for (const auto& dims : {std::vector<std::size_t>{0, 2, 16, 8}, {2, 0, 16, 8}, {2, 2, 0, 8}, {2, 2, 16, 0}}) {
        try {
            mha::KVCache c(dims[0], dims[1], dims[2], dims[3]);
            ADD_FAILURE() << "a zero dimension was taken";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("KVCache dimensions must be non-zero"), std::string::npos) << e.what();
        }
    }
    const std::size_t big = std::size_t(1) << 20;
    EXPECT_THROW(mha::KVCache(big, big, big, big), mha::invalid_argument);
    EXPECT_THROW(mha::KVCache(1, 1, big * big, big), mha::invalid_argument);
    const mha::KVCache c(3, 2, 16, 10);
    EXPECT_EQ(c.batch(), 3u);
    EXPECT_EQ(c.kv_heads(), 2u);
    EXPECT_EQ(c.head_dim(), 16u);
    EXPECT_EQ(c.capacity(), 10u);
    EXPECT_EQ(c.bytes(), 2u * 3 * 2 * 10 * 16 * sizeof(float));
    EXPECT_EQ(c.lengths(), (std::vector<std::size_t>{0, 0, 0}));
    const mha::ConstHeads k = c.keys(), v = c.values();
    EXPECT_EQ(k.batch, 3u);
    EXPECT_EQ(k.heads, 2u);
    EXPECT_EQ(k.rows, 10u);
    EXPECT_EQ(k.dim, 16u);
    EXPECT_EQ(k.row_stride, 16u);
    EXPECT_EQ(k.head_stride, 160u);
    EXPECT_EQ(k.batch_stride, 320u);
    EXPECT_EQ(v.batch_stride, 320u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(k.data) % 64, 0u) << "keys 64-byte aligned";
    EXPECT_EQ(c.keys(2, 1).rows, 0u);
    EXPECT_EQ(c.keys(2, 1).data, k.data + 2 * 320 + 160);
    EXPECT_EQ(c.values(1, 0).data, v.data + 320);
    const mha::KVCache empty;
    EXPECT_EQ(empty.batch(), 0u);
    EXPECT_EQ(empty.bytes(), 0u);
}

// ---------------------------------------------------------------------------------------------------
// Validation of the cache call.

struct CallSetup {
    const mha::MultiheadAttention* m;
    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    mha::ForwardOptions opt;
    mha::KVCache* cache;
};

TEST(KvCacheMore, EveryCacheCallErrorNamesTheProblemAndWritesNothing) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::half), true, false, 800);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, Lq = 2, E = 64;
    const std::vector<float> x = mha_decode_test::uniform(B * 8 * E, 1.0f, 801);
    std::vector<float> weights(B * Lq * 16, kSentinel);
    std::vector<std::uint8_t> kpm(B * 5, 0);
    std::vector<float> am(Lq * 5, 0.0f);
    const std::size_t positions[2] = {3, 3};
    struct Case {
        const char* message;
        std::function<void(CallSetup&)> change;
        bool output_dependent = false;  // workspace_bytes takes no output: it cannot see this error
        const char* workspace_message = nullptr;  // workspace_bytes' message where it words the error differently
    };
    mha::KVCache wrong_heads = mha_decode_test::filled_cache(B, 1, 16, 16), wrong_dim = mha_decode_test::filled_cache(B, 2, 8, 16);
    mha::KVCache empty, moved_from = mha_decode_test::filled_cache(B, 2, 16, 16);
    { mha::KVCache sink(std::move(moved_from)); }
    mha::MultiheadAttention moved_layer = layer.make();
    { mha::MultiheadAttention sink(std::move(moved_layer)); }
    const Case cases[] = {
        {"the KV cache has 1 KV heads of dim 16 but the layer has 2 of dim 16", [&](CallSetup& s) { s.cache = &wrong_heads; }},
        {"the KV cache has 2 KV heads of dim 8 but the layer has 2 of dim 16", [&](CallSetup& s) { s.cache = &wrong_dim; }},
        {"the KV cache is empty", [&](CallSetup& s) { s.cache = &empty; }},
        {"the KV cache is empty", [&](CallSetup& s) { s.cache = &moved_from; }},
        {"the attention object was moved from", [&](CallSetup& s) { s.m = &moved_layer; }},
        {"key and value must be absent with a KV cache", [&](CallSetup& s) { s.in.key = s.in.query; }},
        {"key and value must be absent with a KV cache", [&](CallSetup& s) { s.in.value = s.in.query; }},
        {"masks are not taken with a KV cache", [&](CallSetup& s) { s.in.key_padding_mask = mha::MaskView::boolean(kpm.data(), B, 5); }},
        {"masks are not taken with a KV cache", [&](CallSetup& s) { s.in.attn_mask = mha::MaskView::additive(am.data(), Lq, 5); }},
        {"need_weights is not available with a KV cache",
         [&](CallSetup& s) { s.opt.need_weights = mha::NeedWeights::averaged, s.out.attn_weights = weights.data(); }},
        {"positions and position_offset must be unset with a KV cache", [&](CallSetup& s) { s.opt.positions = positions; }},
        {"positions and position_offset must be unset with a KV cache", [&](CallSetup& s) { s.opt.position_offset = 3; }},
        {"query batch 1 differs from the KV cache's batch 2",
         [&](CallSetup& s) { s.in.query.batch = 1, s.out.output.batch = 1; }},
        {"query batch 3 differs from the KV cache's batch 2",
         [&](CallSetup& s) { s.in.query = mha::ConstBatch(x.data(), 3, Lq, E), s.out.output.batch = 3; }},
        {"query overlaps the KV cache", [&](CallSetup& s) { s.in.query = mha::ConstBatch(s.cache->keys().data, B, Lq, E); }},
        {"query overlaps the KV cache",
         [&](CallSetup& s) { s.in.query = mha::ConstBatch(s.cache->values().data + 100, B, Lq, E); }},
        {"output overlaps the KV cache", [&](CallSetup& s) { s.out.output = mha::Batch(mha::detail::KVCacheAccess::key_data(*s.cache) + 8, B, Lq, E); }, true},
        {"output overlaps the KV cache", [&](CallSetup& s) { s.out.output = mha::Batch(mha::detail::KVCacheAccess::value_data(*s.cache), B, Lq, E); }, true},
        {"query has 32 features but embed_dim is 64", [&](CallSetup& s) { s.in.query.cols = 32, s.in.query.row_stride = 32; }, false,
         "query is [2, 2, 32] but must have 64 features"},
        {"output is [2, 2, 32] but must be [B, Lq, E]", [&](CallSetup& s) { s.out.output.cols = 32; }, true},
        {"threads -1 is negative", [&](CallSetup& s) { s.opt.threads = -1; }},
        {"sequence 1 holds 15 tokens; 2 more exceed the KV cache's capacity 16", [&](CallSetup& s) { mha::detail::KVCacheAccess::set_length(*s.cache, 1, 15); }},
    };
    for (mha::Backend backend : {mha::Backend::scalar, mha::Backend::simd})
        for (const Case& c : cases) {
            SCOPED_TRACE(::testing::Message() << (backend == mha::Backend::scalar ? "scalar: " : "simd: ") << c.message);
            mha::KVCache cache = mha_decode_test::filled_cache(B, 2, 16, 16, 0.25f);
            (void)feed(m, x, B, 8, 0, 3, cache, options(backend));
            std::vector<float> out(B * 4 * E, kSentinel);
            CallSetup s{&m, {}, {}, options(backend), &cache};
            s.in.query = mha::ConstBatch(x.data() + 3 * E, B, Lq, E, E, 8 * E);
            s.out.output = mha::Batch(out.data(), B, Lq, E);
            c.change(s);
            const CacheSnapshot before(*s.cache), main_before(cache);
            try {
                s.m->forward(s.in, s.out, s.opt, *s.cache);
                ADD_FAILURE() << "no exception";
            } catch (const mha::invalid_argument& e) {
                EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
            }
            EXPECT_TRUE(CacheSnapshot(*s.cache) == before) << "the call's cache changed";
            EXPECT_TRUE(CacheSnapshot(cache) == main_before) << "the cache changed";
            EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; })) << "output written";
            EXPECT_TRUE(std::all_of(weights.begin(), weights.end(), [](float v) { return v == kSentinel; })) << "weights written";
            if (c.output_dependent) continue;
            try {
                (void)s.m->workspace_bytes(s.in, s.opt, *s.cache);
                ADD_FAILURE() << "workspace_bytes took the call";
            } catch (const mha::invalid_argument& e) {
                EXPECT_NE(std::string(e.what()).find(c.workspace_message ? c.workspace_message : c.message), std::string::npos)
                    << "workspace_bytes: " << e.what();
            }
        }
}

// ---------------------------------------------------------------------------------------------------
// Workspace and threads.

// workspace_bytes(in, opt, cache) is enough: a Workspace of exactly that size gives the bits of the call without
// one (outputs and cache); one byte less is refused before anything is written (the cache included). Decode
// steps (Lq = 1 and 16), a chunk on the grouped path (Lq = 40: B·Lq = 80 tokens, past the few-token path) and the
// scalar backend (0 bytes).
TEST(KvCacheMore, WorkspaceBytesAreEnough) {
    const DecoderLayer layer(64, 8, 2, 16, rope(mha::RopeStyle::interleaved), true, true, 900);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 80, E = 64, cap = 90;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 901);
    const std::optional<float> eps = 1e-5f;
    auto primed = [&](mha::Backend backend) {
        mha::KVCache c = mha_decode_test::filled_cache(B, 2, 16, cap);
        (void)feed(m, x, B, L, 0, 20, c, options(backend, eps));
        c.truncate(1, 13);  // ragged
        return c;
    };
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        for (std::size_t Lq : {1, 16, 40}) {
            SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
            const mha::ForwardOptions o = options(mha::Backend::simd, eps);
            mha::KVCache ref_cache = primed(mha::Backend::simd);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data() + 20 * E, B, Lq, E, E, L * E);
            const std::size_t bytes = m.workspace_bytes(in, o, ref_cache);
            ASSERT_GT(bytes, 0u);
            const std::vector<float> want = feed(m, x, B, L, 20, Lq, ref_cache, o);
            {
                mha::KVCache c = primed(mha::Backend::simd);
                mha::Workspace ws(bytes);
                std::vector<float> out(B * Lq * E, kSentinel);
                m.forward(in, {mha::Batch(out.data(), B, Lq, E)}, o, c, ws);
                EXPECT_TRUE(same_bits(out, want)) << "exactly workspace_bytes() = " << bytes;
                EXPECT_TRUE(CacheSnapshot(c) == CacheSnapshot(ref_cache));
            }
            {
                mha::KVCache c = primed(mha::Backend::simd);
                const CacheSnapshot before(c);
                mha::Workspace ws(bytes - 1);
                std::vector<float> out(B * Lq * E, kSentinel);
                try {
                    m.forward(in, {mha::Batch(out.data(), B, Lq, E)}, o, c, ws);
                    ADD_FAILURE() << "a workspace one byte short was taken";
                } catch (const mha::invalid_argument& e) {
                    EXPECT_NE(std::string(e.what()).find("workspace has " + std::to_string(bytes - 1) + " bytes"), std::string::npos) << e.what();
                }
                EXPECT_TRUE(CacheSnapshot(c) == before) << "cache written before the error";
                EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; })) << "output written";
            }
        }
    });
    // The scalar backend needs none: workspace_bytes is 0 and an empty Workspace works.
    mha::KVCache c = primed(mha::Backend::scalar);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(x.data() + 20 * E, B, 1, E, E, L * E);
    EXPECT_EQ(m.workspace_bytes(in, options(mha::Backend::scalar, eps), c), 0u);
    mha::Workspace none;
    std::vector<float> out(B * E, kSentinel);
    m.forward(in, {mha::Batch(out.data(), B, 1, E)}, options(mha::Backend::scalar, eps), c, none);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v) && v != kSentinel; }));
}

// A workspace that shares memory with the cache must be refused (mha/workspace.hpp: "throws
// mha::invalid_argument (before writing anything) if the workspace ... overlaps the call's tensors"; the forward
// reads the cached rows and appends to them, so scratch inside the cache corrupts both). The cache is made large
// enough to hold the whole workspace the call needs, holds 5 tokens per sequence, and the workspace borrows the
// cache's own memory (its keys, then the end of its keys and its values).
// LIBRARY BUG found by this test at ad85132 (where it fails on purpose): MultiheadAttention::run checked a borrowed
// workspace against query, key, value, output, attn_weights and the masks but not against the KV cache, so the
// call took it, wrote its scratch over the cached rows and returned wrong outputs. main's 719051a adds the check
// ("workspace overlaps the KV cache"); with it this test passes.
TEST(KvCacheMore, WorkspaceOverlappingTheCacheIsRefused) {
    const DecoderLayer layer(64, 8, 2, 16, std::nullopt, false, false, 950);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, E = 64, L = 6;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 951);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(x.data() + 5 * E, B, 1, E, E, L * E);
    const mha::ForwardOptions o = options(mha::Backend::simd);
    mha::KVCache small(B, 2, 16, 8);
    (void)feed(m, x, B, L, 0, 5, small, o);
    const std::size_t bytes = m.workspace_bytes(in, o, small);  // depends on the lengths, not the capacity
    const std::size_t cap = bytes / (B * 2 * 16 * sizeof(float)) + 16;  // keys alone, and values alone, hold it
    for (int where = 0; where < 2; ++where) {
        SCOPED_TRACE(where == 0 ? "workspace = the cache's keys" : "workspace = the end of the keys and the values");
        mha::KVCache big = mha_decode_test::filled_cache(B, 2, 16, cap, 0.5f);
        (void)feed(m, x, B, L, 0, 5, big, o);
        ASSERT_EQ(m.workspace_bytes(in, o, big), bytes);
        ASSERT_GE(big.bytes() / 2, bytes + 16 * sizeof(float));
        const CacheSnapshot before(big);
        const std::vector<float> keys_before = mha_decode_test::cached_rows(big, false), values_before = mha_decode_test::cached_rows(big, true);
        std::vector<float> want(B * E);
        {
            mha::KVCache ref = mha_decode_test::filled_cache(B, 2, 16, cap, 0.5f);
            (void)feed(m, x, B, L, 0, 5, ref, o);
            want = feed(m, x, B, L, 5, 1, ref, o);
        }
        mha::Workspace ws(where == 0 ? static_cast<void*>(mha::detail::KVCacheAccess::key_data(big)) : static_cast<void*>(mha::detail::KVCacheAccess::value_data(big) - 16), bytes);
        std::vector<float> out(B * E, kSentinel);
        try {
            m.forward(in, {mha::Batch(out.data(), B, 1, E)}, o, big, ws);
            // Describe the damage: the 5 cached rows of each (sequence, KV head) that were there before the call.
            std::vector<float> k_now, v_now;
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t h = 0; h < 2; ++h)
                    for (std::size_t j = 0; j < 5; ++j) {
                        k_now.insert(k_now.end(), big.keys(b, h).row(j), big.keys(b, h).row(j) + 16);
                        v_now.insert(v_now.end(), big.values(b, h).row(j), big.values(b, h).row(j) + 16);
                    }
            std::size_t changed = 0;
            for (std::size_t n = 0; n < k_now.size(); ++n)
                changed += (std::memcmp(&k_now[n], &keys_before[n], sizeof(float)) != 0) + (std::memcmp(&v_now[n], &values_before[n], sizeof(float)) != 0);
            ADD_FAILURE() << "LIBRARY BUG (issue 13): a workspace inside the KV cache's storage was taken; " << changed << " of "
                          << 2 * k_now.size() << " previously cached K/V floats were overwritten; the outputs "
                          << (same_bits(out, want) ? "are still right" : "are wrong") << " (max |out − want| "
                          << mha_test::max_abs_diff(out, want) << ")";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("workspace overlaps"), std::string::npos) << e.what();
            EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == kSentinel; })) << "output written";
            EXPECT_TRUE(CacheSnapshot(big) == before) << "cache changed";
        }
    }
}

// Threads 1, 2 and 3 give the same bits for every step of a chunked feed (few-token path, decode path and a
// 70-token chunk on the row path), outputs and caches.
TEST(KvCacheMore, BitwiseEqualAcrossThreadCounts) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 3);
    const DecoderLayer layer(96, 6, 2, 32, rope(mha::RopeStyle::half, 16), true, true, 990);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t B = 2, L = 100, E = 96;
    const std::vector<float> x = mha_decode_test::uniform(B * L * E, 1.0f, 991);
    const std::size_t chunks[] = {5, 1, 70, 7, 1, 16};
    mha_test::for_each_cpu_isa([&](mha::Isa) {
        std::vector<std::vector<float>> outs[3];
        std::optional<CacheSnapshot> caches[3];
        for (int t = 1; t <= 3; ++t) {
            mha::KVCache c = mha_decode_test::filled_cache(B, 2, 32, L);
            std::size_t at = 0;
            for (std::size_t n : chunks) {
                outs[t - 1].push_back(feed(m, x, B, L, at, n, c, options(mha::Backend::simd, 1e-5f, t)));
                at += n;
            }
            caches[t - 1].emplace(c);
        }
        for (int t = 2; t <= 3; ++t) {
            for (std::size_t k = 0; k < std::size(chunks); ++k) EXPECT_TRUE(same_bits(outs[t - 1][k], outs[0][k])) << t << " threads, chunk " << k;
            EXPECT_TRUE(*caches[t - 1] == *caches[0]) << t << " threads";
        }
    });
}

}  // namespace
