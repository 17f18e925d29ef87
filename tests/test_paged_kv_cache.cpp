// The paged KV cache and variable-length steps (mha/paged_kv_cache.hpp, MultiheadAttention::forward_step):
//   steps mixing prefill chunks and decodes vs each sequence alone in a contiguous B = 1 KVCache fed the same
//   chunks (bitwise: batch invariance and paged = contiguous), for every block size and element type (the 8-bit
//   ones included), layer
//   shapes that take the decode, grouped and materialized paths, 1 / 2 / 3 threads, any sequence order;
//   f32 steps against the float64 evaluation of each sequence from its own token history (decode_test_util.hpp);
//   fork and copy-on-write, truncate / free / reuse of blocks (non-consecutive, reused ids), pool exhaustion
//   mid-step (nothing changed, both backends), the refusals; Backend::scalar = the contiguous cache's scalar
//   forward on each sequence (bitwise) and within the float64 bound; one StepPlan for every layer of a model (= each layer planning
//   its own step), plans that do not fit refused; level 2 with caller-made block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <set>
#include <vector>

#include <mha/mha.hpp>

#include "decode_test_util.hpp"
#include "isa_test_util.hpp"

namespace {

using mha_decode_test::DecoderLayer;
using mha_decode_test::uniform;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One sequence's part of a step: q tokens of sequence `seq`.
struct Part {
    std::size_t seq, q;
};
using Step = std::vector<Part>;

// Four sequences through four steps: prefills of 37, 5 and 70 tokens; then decodes, a chunk of 16, a new
// prompt of 20; then all decoding; then a chunk of 130 (> 64 tokens, > 2 blocks of 64) beside a 3-token draft.
const std::vector<Step> kSteps = {
    {{0, 37}, {1, 5}, {2, 70}},
    {{1, 1}, {0, 1}, {3, 20}, {2, 16}},
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
    {{3, 130}, {0, 3}},
};
constexpr std::size_t kSequences = 4;

std::size_t total_tokens(std::size_t seq) {
    std::size_t n = 0;
    for (const Step& s : kSteps)
        for (const Part& p : s)
            if (p.seq == seq) n += p.q;
    return n;
}

// Token rows of each sequence [its total tokens, E].
std::vector<std::vector<float>> token_rows(std::size_t E, std::uint32_t seed) {
    std::vector<std::vector<float>> x(kSequences);
    for (std::size_t s = 0; s < kSequences; ++s) x[s] = uniform(total_tokens(s) * E, 1.0f, seed + std::uint32_t(s));
    return x;
}

// Outputs of each part of each step: out[step][part] = [q, E].
using StepOutputs = std::vector<std::vector<std::vector<float>>>;

// Each sequence alone in its own contiguous KVCache (B = 1), fed the same chunks in the same order.
StepOutputs run_alone(const mha::MultiheadAttention& m, const DecoderLayer& layer, const std::vector<std::vector<float>>& x,
                      mha::DataType type, std::vector<mha::KVCache>* caches = nullptr, mha::Backend backend = mha::Backend::simd) {
    const std::size_t E = layer.E;
    std::vector<mha::KVCache> local;
    std::vector<mha::KVCache>& c = caches ? *caches : local;
    c.clear();
    for (std::size_t s = 0; s < kSequences; ++s) c.emplace_back(1, layer.Hkv, layer.d, total_tokens(s) + 1, type);
    std::vector<std::size_t> at(kSequences, 0);
    StepOutputs out;
    for (const Step& step : kSteps) {
        out.emplace_back();
        for (const Part& p : step) {
            std::vector<float> y(p.q * E, kNaN);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x[p.seq].data() + at[p.seq] * E, 1, p.q, E);
            mha::ForwardOptions opt;
            opt.backend = backend;
            m.forward(in, {mha::Batch(y.data(), 1, p.q, E)}, opt, c[p.seq]);
            at[p.seq] += p.q;
            out.back().push_back(std::move(y));
        }
    }
    return out;
}

// The steps through one paged cache; `order` permutes the parts of every step (their rows are packed in that order).
StepOutputs run_paged(const mha::MultiheadAttention& m, const DecoderLayer& layer, const std::vector<std::vector<float>>& x,
                      mha::PagedKVCache& cache, std::vector<std::size_t>& ids, int threads, bool reversed = false,
                      mha::Backend backend = mha::Backend::simd) {
    const std::size_t E = layer.E;
    ids.clear();
    for (std::size_t s = 0; s < kSequences; ++s) ids.push_back(cache.add_sequence());
    std::vector<std::size_t> at(kSequences, 0);
    StepOutputs out;
    for (const Step& step : kSteps) {
        std::vector<std::size_t> order(step.size());
        std::iota(order.begin(), order.end(), 0);
        if (reversed) std::reverse(order.begin(), order.end());
        std::vector<std::size_t> seq_ids, q_lens;
        std::vector<float> packed;
        for (std::size_t k : order) {
            const Part& p = step[k];
            seq_ids.push_back(ids[p.seq]);
            q_lens.push_back(p.q);
            packed.insert(packed.end(), x[p.seq].begin() + std::ptrdiff_t(at[p.seq] * E),
                          x[p.seq].begin() + std::ptrdiff_t((at[p.seq] + p.q) * E));
            at[p.seq] += p.q;
        }
        const std::size_t T = packed.size() / E;
        std::vector<float> y(T * E, kNaN);
        m.forward_step(mha::ConstMatrix(packed.data(), T, E), mha::Matrix(y.data(), T, E), cache, seq_ids.data(), q_lens.data(),
                       seq_ids.size(), threads, backend);
        out.emplace_back(step.size());
        std::size_t row = 0;
        for (std::size_t k : order) {
            const Part& p = step[k];
            out.back()[k].assign(y.begin() + std::ptrdiff_t(row * E), y.begin() + std::ptrdiff_t((row + p.q) * E));
            row += p.q;
        }
    }
    return out;
}

// [1, Hkv, n, d] contiguous.
mha::ConstHeads kv_heads(const float* p, std::size_t Hkv, std::size_t n, std::size_t d) {
    return mha::ConstHeads(p, 1, Hkv, n, d, Hkv * n * d, n * d, d);
}

using mha_test::same_bits;

void expect_same(const StepOutputs& got, const StepOutputs& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t s = 0; s < got.size(); ++s)
        for (std::size_t k = 0; k < got[s].size(); ++k)
            EXPECT_TRUE(same_bits(got[s][k], want[s][k])) << what << ": step " << s << ", part " << k << " (sequence "
                                                          << kSteps[s][k].seq << ", q " << kSteps[s][k].q << ")";
}

std::vector<float> paged_rows(const mha::PagedKVCache& c, std::size_t s, std::size_t h, bool values) {
    std::vector<float> r(c.length(s) * c.head_dim());
    const mha::Matrix dst(r.data(), c.length(s), c.head_dim());
    values ? c.copy_values(s, h, dst) : c.copy_keys(s, h, dst);
    return r;
}

std::vector<float> contiguous_rows(const mha::KVCache& c, std::size_t b, std::size_t h, bool values) {
    std::vector<float> r(c.length(b) * c.head_dim());
    const mha::Matrix dst(r.data(), c.length(b), c.head_dim());
    values ? c.copy_values(b, h, dst) : c.copy_keys(b, h, dst);
    return r;
}

// A sequence's rows of a step, given the whole step (sequence ids and q_lens), the tokens packed in order.
std::vector<float> step_rows(const mha::MultiheadAttention& m, mha::PagedKVCache& c, const std::vector<std::size_t>& ids,
                             const std::vector<std::size_t>& q_lens, const std::vector<float>& x, std::size_t E,
                             mha::Backend backend = mha::Backend::simd) {
    const std::size_t T = x.size() / E;
    std::vector<float> y(T * E, kNaN);
    m.forward_step(mha::ConstMatrix(x.data(), T, E), mha::Matrix(y.data(), T, E), c, ids.data(), q_lens.data(), ids.size(), 0, backend);
    return y;
}

struct Shape {
    std::size_t E, H, Hkv, d;
};
// GQA (G = 4: decode and grouped paths) and MHA (G = 1: decode and materialized below 1024 keys).
const Shape kShapes[] = {{64, 8, 2, 16}, {48, 3, 3, 16}};

TEST(PagedKVCache, StepsEqualEachSequenceAloneInAContiguousCache) {
    mha_test::for_each_cpu_isa([&] {
        for (const Shape& sh : kShapes) {
            const DecoderLayer layer(sh.E, sh.H, sh.Hkv, sh.d, mha::RopeConfig{}, true, true, 901);
            const mha::MultiheadAttention m = layer.make();
            const std::vector<std::vector<float>> x = token_rows(sh.E, 77);
            for (mha::DataType type : {mha::DataType::f32, mha::DataType::bf16, mha::DataType::f16, mha::DataType::int8,
                                       mha::DataType::fp8_e4m3, mha::DataType::fp8_e5m2}) {
                std::vector<mha::KVCache> alone_caches;
                const StepOutputs alone = run_alone(m, layer, x, type, &alone_caches);
                for (std::size_t bs : {16u, 64u, 256u}) {
                    SCOPED_TRACE("H " + std::to_string(sh.H) + ", Hkv " + std::to_string(sh.Hkv) + ", type " +
                                 std::string(mha::data_type_name(type)) + ", block_size " + std::to_string(bs));
                    for (int threads : {1, 2, 3}) {
                        mha::PagedKVCache cache(64, bs, sh.Hkv, sh.d, type);
                        std::vector<std::size_t> ids;
                        const StepOutputs paged = run_paged(m, layer, x, cache, ids, threads, threads == 2);
                        expect_same(paged, alone, "threads " + std::to_string(threads));
                        for (std::size_t s = 0; s < kSequences; ++s) {
                            ASSERT_EQ(cache.length(ids[s]), total_tokens(s));
                            for (std::size_t h = 0; h < sh.Hkv; ++h) {
                                EXPECT_TRUE(same_bits(paged_rows(cache, ids[s], h, false), contiguous_rows(alone_caches[s], 0, h, false)));
                                EXPECT_TRUE(same_bits(paged_rows(cache, ids[s], h, true), contiguous_rows(alone_caches[s], 0, h, true)));
                            }
                        }
                        // Memory in use: the blocks that hold tokens.
                        std::size_t blocks = 0;
                        for (std::size_t s = 0; s < kSequences; ++s) blocks += (total_tokens(s) + bs - 1) / bs;
                        EXPECT_EQ(cache.used_blocks(), blocks);
                    }
                }
            }
        }
    });
}

// int8 caches with d 64 (on CPUs with AVX512_VNNI the decode scores are integer dot products at the avx512_bf16
// level): steps equal each sequence alone in a contiguous cache, bitwise, for block sizes 16 and 64 and threads 1 / 3,
// on every ISA level including avx512_bf16.
TEST(PagedKVCache, Int8StepsOnDotProductsEqualEachSequenceAlone) {
    const DecoderLayer layer(64, 8, 2, 64, mha::RopeConfig{}, true, true, 905);
    const mha::MultiheadAttention m = layer.make();
    const std::vector<std::vector<float>> x = token_rows(64, 78);
    mha_test::for_each_cpu_isa([&] {
        const StepOutputs alone = run_alone(m, layer, x, mha::DataType::int8);
        for (std::size_t bs : {16u, 64u})
            for (int threads : {1, 3}) {
                mha::PagedKVCache cache(64, bs, 2, 64, mha::DataType::int8);
                std::vector<std::size_t> ids;
                expect_same(run_paged(m, layer, x, cache, ids, threads, threads == 3), alone,
                            "block_size " + std::to_string(bs) + ", threads " + std::to_string(threads));
            }
    }, true);
}

// Sequences past one decode split (512 fp32 keys, 2048 of 16 or 8 bits: decode_split) and past kFusedMinKeys
// (1024: MHA takes the grouped path), in chunks, then decoding together with a new short prompt: ragged decode
// groups whose splits span blocks.
TEST(PagedKVCache, LongSequencesAcrossSplitsAndBlocks) {
    const std::vector<Step> steps = {{{0, 300}, {1, 2100}}, {{0, 300}, {2, 7}}, {{1, 1}, {0, 1}, {2, 1}}, {{2, 1}, {1, 2}, {0, 1}}};
    std::vector<std::size_t> total(3, 0);
    for (const Step& s : steps)
        for (const Part& p : s) total[p.seq] += p.q;
    for (const Shape& sh : kShapes) {
        const DecoderLayer layer(sh.E, sh.H, sh.Hkv, sh.d, mha::RopeConfig{}, true, false, 915);
        const mha::MultiheadAttention m = layer.make();
        std::vector<std::vector<float>> x(3);
        for (std::size_t s = 0; s < 3; ++s) x[s] = uniform(total[s] * sh.E, 1.0f, 40 + std::uint32_t(s));
        for (mha::DataType type : {mha::DataType::f32, mha::DataType::bf16, mha::DataType::int8, mha::DataType::fp8_e4m3}) {
            // Each part alone in its sequence's contiguous cache.
            std::vector<mha::KVCache> alone;
            for (std::size_t s = 0; s < 3; ++s) alone.emplace_back(1, sh.Hkv, sh.d, total[s], type);
            StepOutputs want;
            std::vector<std::size_t> at(3, 0);
            for (const Step& step : steps) {
                want.emplace_back();
                for (const Part& p : step) {
                    want.back().emplace_back(p.q * sh.E, kNaN);
                    mha::AttentionInputs in;
                    in.query = mha::ConstBatch(x[p.seq].data() + at[p.seq] * sh.E, 1, p.q, sh.E);
                    m.forward(in, {mha::Batch(want.back().back().data(), 1, p.q, sh.E)}, {}, alone[p.seq]);
                    at[p.seq] += p.q;
                }
            }
            for (std::size_t bs : {16u, 128u}) {
                SCOPED_TRACE("H " + std::to_string(sh.H) + ", type " + std::string(mha::data_type_name(type)) + ", block_size " +
                             std::to_string(bs));
                mha::PagedKVCache cache(240, bs, sh.Hkv, sh.d, type);
                std::vector<std::size_t> ids;
                for (std::size_t s = 0; s < 3; ++s) ids.push_back(cache.add_sequence());
                std::fill(at.begin(), at.end(), 0);
                for (std::size_t st = 0; st < steps.size(); ++st) {
                    std::vector<std::size_t> seq_ids, q_lens;
                    std::vector<float> packed;
                    for (const Part& p : steps[st]) {
                        seq_ids.push_back(ids[p.seq]);
                        q_lens.push_back(p.q);
                        packed.insert(packed.end(), x[p.seq].begin() + std::ptrdiff_t(at[p.seq] * sh.E),
                                      x[p.seq].begin() + std::ptrdiff_t((at[p.seq] + p.q) * sh.E));
                        at[p.seq] += p.q;
                    }
                    const std::vector<float> y = step_rows(m, cache, seq_ids, q_lens, packed, sh.E);
                    std::size_t row = 0;
                    for (std::size_t k = 0; k < steps[st].size(); ++k) {
                        const std::vector<float> got(y.begin() + std::ptrdiff_t(row * sh.E),
                                                     y.begin() + std::ptrdiff_t((row + q_lens[k]) * sh.E));
                        EXPECT_TRUE(same_bits(got, want[st][k])) << "step " << st << ", sequence " << steps[st][k].seq;
                        row += q_lens[k];
                    }
                }
            }
        }
    }
}

// The layer of an H 8, Hkv 2 DecoderLayer (E 64, d 16 unless given) with bf16 compute.
mha::MultiheadAttention bf16_layer(const DecoderLayer& layer, std::size_t E = 64, std::size_t d = 16) {
    mha::AttentionConfig c;
    c.embed_dim = E, c.num_heads = 8, c.num_kv_heads = 2, c.head_dim = d, c.rope = layer.rope, c.compute = mha::DataType::bf16;
    mha::AttentionWeights w;
    w.q_proj_weight = layer.wq.data(), w.k_proj_weight = layer.wk.data(), w.v_proj_weight = layer.wv.data();
    w.out_proj_weight = layer.wo.data();
    w.q_proj_bias = layer.bq.data(), w.k_proj_bias = layer.bk.data(), w.v_proj_bias = layer.bv.data(), w.out_proj_bias = layer.bo.data();
    return mha::MultiheadAttention(w, c);
}

// d 16, and d 64: its decode steps on vdpbf16ps where the CPU has AVX512_BF16 (simd::bf16_decode_on_dot_products).
TEST(PagedKVCache, Bf16ComputeStepsEqualTheContiguousCache) {
    for (const std::size_t d : {std::size_t(16), std::size_t(64)}) {
        SCOPED_TRACE(::testing::Message() << "d " << d);
        const std::size_t E = 8 * d;
        DecoderLayer layer(E, 8, 2, d, mha::RopeConfig{}, true, false, 903);
        const mha::MultiheadAttention m = bf16_layer(layer, E, d);
        const std::vector<std::vector<float>> x = token_rows(E, 91);
        mha_test::for_each_cpu_isa([&] {
            const StepOutputs alone = run_alone(m, layer, x, mha::DataType::bf16);
            mha::PagedKVCache cache(32, 32, 2, d, mha::DataType::bf16);
            std::vector<std::size_t> ids;
            expect_same(run_paged(m, layer, x, cache, ids, 2), alone, "bf16 compute");
        }, true);
    }
}

// f32 steps against the float64 evaluation of each sequence from its own history (the bound of
// decode_test_util.hpp, × kDecoderSafety), the reference's cache holding exactly the rows the step stored.
TEST(PagedKVCache, StepsAgreeWithAFloat64EvaluationOfEachSequence) {
    const Shape sh = kShapes[0];
    const DecoderLayer layer(sh.E, sh.H, sh.Hkv, sh.d, mha::RopeConfig{}, true, true, 905);
    const mha::MultiheadAttention m = layer.make();
    const std::vector<std::vector<float>> x = token_rows(sh.E, 79);
    for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar}) {
    SCOPED_TRACE(backend == mha::Backend::simd ? "simd" : "scalar");
    mha::PagedKVCache cache(64, 16, sh.Hkv, sh.d);
    std::vector<std::size_t> ids;
    for (std::size_t s = 0; s < kSequences; ++s) ids.push_back(cache.add_sequence());
    // The double evaluation reads the cache before each part as a contiguous KVCache of the same rows.
    std::vector<std::size_t> at(kSequences, 0);
    for (const Step& step : kSteps) {
        std::vector<std::size_t> seq_ids, q_lens;
        std::vector<float> packed;
        std::vector<mha_decode_test::StepExpected> expected;
        for (const Part& p : step) {
            mha::KVCache before(1, sh.Hkv, sh.d, at[p.seq] + p.q);
            std::vector<float> k(sh.Hkv * at[p.seq] * sh.d), v(k.size());
            for (std::size_t h = 0; h < sh.Hkv; ++h) {
                cache.copy_keys(ids[p.seq], h, mha::Matrix(k.data() + h * at[p.seq] * sh.d, at[p.seq], sh.d));
                cache.copy_values(ids[p.seq], h, mha::Matrix(v.data() + h * at[p.seq] * sh.d, at[p.seq], sh.d));
            }
            before.append(0, kv_heads(k.data(), sh.Hkv, at[p.seq], sh.d), kv_heads(v.data(), sh.Hkv, at[p.seq], sh.d));
            const float* rows = x[p.seq].data() + at[p.seq] * sh.E;
            expected.push_back(mha_decode_test::step_double(layer.ref(), rows, 1, p.q, &before));
            seq_ids.push_back(ids[p.seq]);
            q_lens.push_back(p.q);
            packed.insert(packed.end(), rows, rows + p.q * sh.E);
            at[p.seq] += p.q;
        }
        const std::size_t T = packed.size() / sh.E;
        std::vector<float> y(T * sh.E, kNaN);
        m.forward_step(mha::ConstMatrix(packed.data(), T, sh.E), mha::Matrix(y.data(), T, sh.E), cache, seq_ids.data(), q_lens.data(),
                       seq_ids.size(), 0, backend);
        std::size_t row = 0;
        for (std::size_t k = 0; k < step.size(); ++k) {
            const std::vector<float> got(y.begin() + std::ptrdiff_t(row * sh.E), y.begin() + std::ptrdiff_t((row + step[k].q) * sh.E));
            const std::vector<double> tol = mha_decode_test::times(expected[k].out_err, mha_test::kDecoderSafety);
            EXPECT_TRUE(mha_test::all_within(got, expected[k].out, tol)) << "sequence " << step[k].seq;
            EXPECT_LT(mha_test::relative_tolerance(expected[k].out, tol), 1e-3) << "bound too loose to catch anything";
            row += step[k].q;
        }
    }
    }
}

// Backend::scalar: each sequence through the reference of cached decoding, so a step's rows are bitwise those of
// the contiguous KVCache's scalar forward on each sequence alone (outputs and cached rows), for every element
// type, block size, order and thread count, with RoPE, GQA and MHA; and bf16 compute likewise.
TEST(PagedKVCache, ScalarBackendStepsEqualTheContiguousCacheReference) {
    for (const Shape& sh : kShapes) {
        const DecoderLayer layer(sh.E, sh.H, sh.Hkv, sh.d, mha::RopeConfig{}, true, true, 921);
        const mha::MultiheadAttention m = layer.make();
        const std::vector<std::vector<float>> x = token_rows(sh.E, 83);
        for (mha::DataType type : {mha::DataType::f32, mha::DataType::bf16, mha::DataType::f16, mha::DataType::int8,
                                   mha::DataType::fp8_e4m3, mha::DataType::fp8_e5m2}) {
            std::vector<mha::KVCache> alone_caches;
            const StepOutputs alone = run_alone(m, layer, x, type, &alone_caches, mha::Backend::scalar);
            for (std::size_t bs : {16u, 256u}) {
                SCOPED_TRACE("H " + std::to_string(sh.H) + ", type " + std::string(mha::data_type_name(type)) + ", block_size " +
                             std::to_string(bs));
                mha::PagedKVCache cache(64, bs, sh.Hkv, sh.d, type);
                std::vector<std::size_t> ids;
                expect_same(run_paged(m, layer, x, cache, ids, bs == 16 ? 1 : 3, bs == 16, mha::Backend::scalar), alone, "scalar");
                for (std::size_t s = 0; s < kSequences; ++s)
                    for (std::size_t h = 0; h < sh.Hkv; ++h) {
                        EXPECT_TRUE(same_bits(paged_rows(cache, ids[s], h, false), contiguous_rows(alone_caches[s], 0, h, false)));
                        EXPECT_TRUE(same_bits(paged_rows(cache, ids[s], h, true), contiguous_rows(alone_caches[s], 0, h, true)));
                    }
            }
        }
    }
    DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, true, false, 923);
    const mha::MultiheadAttention m = bf16_layer(layer);
    const std::vector<std::vector<float>> x = token_rows(64, 93);
    const StepOutputs alone = run_alone(m, layer, x, mha::DataType::bf16, nullptr, mha::Backend::scalar);
    mha::PagedKVCache cache(32, 32, 2, 16, mha::DataType::bf16);
    std::vector<std::size_t> ids;
    expect_same(run_paged(m, layer, x, cache, ids, 2, false, mha::Backend::scalar), alone, "bf16 compute, scalar");
}

TEST(PagedKVCache, ForkSharesBlocksAndCopiesOnWrite) {
    const DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, true, false, 907);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64, d = 16;
    const std::vector<float> prompt = uniform(40 * E, 1.0f, 1), ta = uniform(E, 1.0f, 2), tb = uniform(E, 1.0f, 3);
    mha::PagedKVCache c(16, 16, 2, d);
    const std::size_t a = c.add_sequence();
    (void)step_rows(m, c, {a}, {40}, prompt, E);
    EXPECT_EQ(c.used_blocks(), 3u);  // 16 + 16 + 8
    const std::vector<float> a_keys = paged_rows(c, a, 1, false);
    const std::size_t b = c.fork(a);
    EXPECT_EQ(c.used_blocks(), 3u);
    EXPECT_EQ(c.length(b), 40u);
    EXPECT_EQ(c.block_table(b), c.block_table(a));
    // Both write into the shared third block: a copies it, b (the last of the equally long holders) keeps it.
    std::vector<float> both(ta);
    both.insert(both.end(), tb.begin(), tb.end());
    const std::vector<float> y = step_rows(m, c, {a, b}, {1, 1}, both, E);
    EXPECT_EQ(c.used_blocks(), 4u);
    EXPECT_EQ(c.block_table(a)[0], c.block_table(b)[0]);
    EXPECT_NE(c.block_table(a)[2], c.block_table(b)[2]);
    for (std::size_t s : {a, b}) {
        const std::vector<float> k = paged_rows(c, s, 1, false);
        ASSERT_EQ(k.size(), 41 * d);
        EXPECT_TRUE(same_bits(std::vector<float>(k.begin(), k.begin() + 40 * d), a_keys)) << "the shared prefix is kept";
    }
    EXPECT_FALSE(same_bits(paged_rows(c, a, 1, false), paged_rows(c, b, 1, false)));
    // Each equals a contiguous cache fed its own history.
    for (const auto& [s, token, row] : {std::tuple<std::size_t, const std::vector<float>*, std::size_t>{a, &ta, 0}, {b, &tb, 1}}) {
        mha::KVCache kv(1, 2, d, 64);
        std::vector<float> out(40 * E), one(E, kNaN);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(prompt.data(), 1, 40, E);
        m.forward(in, {mha::Batch(out.data(), 1, 40, E)}, {}, kv);
        in.query = mha::ConstBatch(token->data(), 1, 1, E);
        m.forward(in, {mha::Batch(one.data(), 1, 1, E)}, {}, kv);
        EXPECT_TRUE(same_bits(std::vector<float>(y.begin() + std::ptrdiff_t(row * E), y.begin() + std::ptrdiff_t((row + 1) * E)), one));
        EXPECT_TRUE(same_bits(paged_rows(c, s, 0, true), contiguous_rows(kv, 0, 0, true)));
    }
    // When every holder of the shared block writes, one copy fewer than holders is needed: an exact-fit pool
    // (3 blocks held, 1 free) takes the same step, with the same bits, and three holders need two copies.
    mha::PagedKVCache tight(4, 16, 2, d);
    const std::size_t ta0 = tight.add_sequence();
    (void)step_rows(m, tight, {ta0}, {40}, prompt, E);
    const std::size_t tb0 = tight.fork(ta0);
    EXPECT_TRUE(same_bits(step_rows(m, tight, {ta0, tb0}, {1, 1}, both, E), y));
    EXPECT_EQ(tight.used_blocks(), 4u);
    for (const auto& [s, t] : {std::pair<std::size_t, std::size_t>{a, ta0}, {b, tb0}})
        EXPECT_TRUE(same_bits(paged_rows(c, s, 1, false), paged_rows(tight, t, 1, false)));
    mha::PagedKVCache three(5, 16, 2, d);
    const std::size_t h0 = three.add_sequence();
    (void)step_rows(m, three, {h0}, {40}, prompt, E);
    const std::size_t h1 = three.fork(h0), h2 = three.fork(h0);
    std::vector<float> all3(both);
    all3.insert(all3.end(), ta.begin(), ta.end());
    (void)step_rows(m, three, {h0, h1, h2}, {1, 1, 1}, all3, E);
    EXPECT_EQ(three.used_blocks(), 5u);
    const std::set<std::uint32_t> last{three.block_table(h0)[2], three.block_table(h1)[2], three.block_table(h2)[2]};
    EXPECT_EQ(last.size(), 3u);
    // Holders of different lengths (b truncated inside the shared block): the longer keeps it and writes past
    // the other's rows, in either step order; each sequence's output and rows equal it run alone in a fresh cache.
    for (bool a_first : {true, false}) {
        mha::PagedKVCache cut(4, 16, 2, d);
        const std::size_t a1 = cut.add_sequence();
        (void)step_rows(m, cut, {a1}, {40}, prompt, E);
        const std::size_t b1 = cut.fork(a1);
        cut.truncate(b1, 35);
        std::vector<float> x2(a_first ? ta : tb);
        x2.insert(x2.end(), (a_first ? tb : ta).begin(), (a_first ? tb : ta).end());
        const std::vector<float> y2 = step_rows(m, cut, a_first ? std::vector<std::size_t>{a1, b1} : std::vector<std::size_t>{b1, a1}, {1, 1}, x2, E);
        EXPECT_EQ(cut.used_blocks(), 4u);
        for (const auto& [s, len, token] : {std::tuple<std::size_t, std::size_t, const std::vector<float>*>{a1, 40, &ta}, {b1, 35, &tb}}) {
            mha::PagedKVCache alone(4, 16, 2, d);
            const std::size_t u = alone.add_sequence();
            (void)step_rows(m, alone, {u}, {len}, std::vector<float>(prompt.begin(), prompt.begin() + std::ptrdiff_t(len * E)), E);
            const std::vector<float> want = step_rows(m, alone, {u}, {1}, *token, E);
            const std::size_t row = (s == a1) == a_first ? 0 : 1;
            EXPECT_TRUE(same_bits(std::vector<float>(y2.begin() + std::ptrdiff_t(row * E), y2.begin() + std::ptrdiff_t((row + 1) * E)), want))
                << "output of " << (s == a1 ? "a" : "b") << (a_first ? ", a first" : ", b first");
            for (std::size_t h = 0; h < 2; ++h)
                for (bool values : {false, true})
                    EXPECT_TRUE(same_bits(paged_rows(cut, s, h, values), paged_rows(alone, u, h, values)))
                        << (s == a1 ? "a" : "b") << " head " << h << (values ? " values" : " keys");
        }
    }
    mha::PagedKVCache some(4, 16, 2, d);  // two of three holders write: both copy, and one block is free
    const std::size_t p0 = some.add_sequence();
    (void)step_rows(m, some, {p0}, {40}, prompt, E);
    const std::size_t p1 = some.fork(p0), p2 = some.fork(p0);
    try {
        (void)step_rows(m, some, {p0, p2}, {1, 1}, both, E);
        ADD_FAILURE() << "a step needing 2 blocks ran with 1 free";
    } catch (const mha::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("1 free blocks but this step needs 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(some.used_blocks(), 3u);
    EXPECT_EQ(some.length(p0) + some.length(p1) + some.length(p2), 120u);
    // A fork of a sequence whose last block is full shares everything and copies nothing on its next write.
    mha::PagedKVCache full(8, 16, 2, d);
    const std::size_t p = full.add_sequence();
    (void)step_rows(m, full, {p}, {32}, std::vector<float>(prompt.begin(), prompt.begin() + 32 * E), E);
    const std::size_t q = full.fork(p);
    (void)step_rows(m, full, {q}, {1}, tb, E);
    EXPECT_EQ(full.used_blocks(), 3u);
    EXPECT_EQ(full.length(p), 32u);
    EXPECT_EQ(full.length(q), 33u);
}

TEST(PagedKVCache, TruncateFreeAndReuseBlocks) {
    const DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, false, false, 909);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64, d = 16;
    mha::PagedKVCache c(12, 16, 2, d);
    EXPECT_EQ(c.free_blocks(), 12u);
    const std::size_t a = c.add_sequence(), b = c.add_sequence();
    (void)step_rows(m, c, {a, b}, {50, 20}, uniform(70 * E, 1.0f, 5), E);
    EXPECT_EQ(c.used_blocks(), 4u + 2u);
    c.truncate(a, 17);  // a speculative draft rejected: blocks 3 and 4 of a return
    EXPECT_EQ(c.length(a), 17u);
    EXPECT_EQ(c.used_blocks(), 2u + 2u);
    EXPECT_THROW(c.truncate(a, 18), mha::invalid_argument);
    c.free_sequence(b);
    EXPECT_EQ(c.used_blocks(), 2u);
    EXPECT_THROW((void)c.length(b), mha::invalid_argument);
    const std::size_t r = c.add_sequence();
    EXPECT_EQ(r, b) << "ids are reused";
    EXPECT_EQ(c.length(r), 0u);
    // The reused sequence gets blocks freed in a different order: a non-consecutive table. Its result still
    // equals a contiguous cache's.
    const std::vector<float> xr = uniform(60 * E, 1.0f, 6);
    const std::vector<float> y = step_rows(m, c, {r}, {60}, xr, E);
    const std::vector<std::uint32_t>& t = c.block_table(r);
    ASSERT_EQ(t.size(), 4u);
    bool consecutive = true;
    for (std::size_t i = 1; i < t.size(); ++i) consecutive = consecutive && t[i] == t[i - 1] + 1;
    EXPECT_FALSE(consecutive);
    mha::KVCache kv(1, 2, d, 60);
    std::vector<float> want(60 * E);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(xr.data(), 1, 60, E);
    m.forward(in, {mha::Batch(want.data(), 1, 60, E)}, {}, kv);
    EXPECT_TRUE(same_bits(y, want));
    c.free_sequence(a);
    c.free_sequence(r);
    EXPECT_EQ(c.free_blocks(), 12u);
}

TEST(PagedKVCache, ExhaustionAndBadStepsChangeNothing) {
    const DecoderLayer layer(64, 8, 2, 16, mha::RopeConfig{}, true, false, 911);
    const mha::MultiheadAttention m = layer.make();
    const std::size_t E = 64, d = 16;
    mha::PagedKVCache c(4, 16, 2, d);
    const std::size_t a = c.add_sequence(), b = c.add_sequence();
    (void)step_rows(m, c, {a, b}, {20, 10}, uniform(30 * E, 1.0f, 7), E);
    const std::size_t free_before = c.free_blocks();
    const std::vector<float> ka = paged_rows(c, a, 0, false), vb = paged_rows(c, b, 1, true);
    auto unchanged = [&] {
        EXPECT_EQ(c.free_blocks(), free_before);
        EXPECT_EQ(c.length(a), 20u);
        EXPECT_EQ(c.length(b), 10u);
        EXPECT_TRUE(same_bits(paged_rows(c, a, 0, false), ka));
        EXPECT_TRUE(same_bits(paged_rows(c, b, 1, true), vb));
    };
    auto refused = [&](const std::vector<std::size_t>& ids, const std::vector<std::size_t>& q, std::size_t T, const std::string& words) {
        const std::vector<float> x = uniform(T * E, 1.0f, 8);
        std::vector<float> y(T * E, 7.0f);
        for (mha::Backend backend : {mha::Backend::simd, mha::Backend::scalar}) {
            try {
                m.forward_step(mha::ConstMatrix(x.data(), T, E), mha::Matrix(y.data(), T, E), c, ids.data(), q.data(), ids.size(), 0,
                               backend);
                ADD_FAILURE() << "accepted: " << words;
            } catch (const mha::invalid_argument& e) {
                EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
            }
            EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
            unchanged();
        }
    };
    // a needs 2 more blocks (to 60 tokens), b 1 more: 3 > 1 free.
    refused({b, a}, {10, 40}, 50, "has 1 free blocks but this step needs 3");
    refused({a, a}, {1, 1}, 2, "appears twice");
    refused({a, b}, {1, 0}, 1, "q_lens[1] is 0");
    refused({a, b}, {1, 1}, 3, "T = sum of q_lens");
    refused({a, 9}, {1, 1}, 2, "sequence 9 is not in this paged KV cache");
    refused({}, {}, 1, "at least one sequence");
    // More new blocks than the whole pool: refused before the step sizes anything by its tokens (x is not read).
    refused({a, b}, {1, std::size_t{1} << 40}, 1, "this step needs at least 68719476736, more than its 4 blocks");
    {  // a Backend value that is neither scalar nor simd
        const std::vector<float> x = uniform(2 * E, 1.0f, 8);
        std::vector<float> y(2 * E, 7.0f);
        const std::vector<std::size_t> ids = {a, b}, q = {1, 1};
        try {
            m.forward_step(mha::ConstMatrix(x.data(), 2, E), mha::Matrix(y.data(), 2, E), c, ids.data(), q.data(), 2, 0,
                           static_cast<mha::Backend>(7));
            ADD_FAILURE() << "backend 7 accepted";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("backend 7 is not scalar or simd"), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
        unchanged();
    }
    {  // y or x inside the pool, which pool() hands out writable (y there would overwrite cached rows)
        const std::vector<float> x = uniform(2 * E, 1.0f, 8);
        std::vector<float> y(2 * E, 7.0f);
        const std::vector<std::size_t> ids = {a, b}, q = {1, 1};
        float* inside = static_cast<float*>(c.pool().keys) + 8;
        for (const bool into_y : {true, false}) {
            try {
                if (into_y)
                    m.forward_step(mha::ConstMatrix(x.data(), 2, E), mha::Matrix(inside, 2, E), c, ids.data(), q.data(), 2);
                else
                    m.forward_step(mha::ConstMatrix(inside, 2, E), mha::Matrix(y.data(), 2, E), c, ids.data(), q.data(), 2);
                ADD_FAILURE() << (into_y ? "y" : "x") << " inside the pool accepted";
            } catch (const mha::invalid_argument& e) {
                EXPECT_NE(std::string(e.what()).find(into_y ? "y overlaps the paged KV cache's pool" : "x overlaps the paged KV cache's pool"),
                          std::string::npos)
                    << e.what();
            }
            EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
            unchanged();
        }
    }
    // The same step fits once blocks are freed.
    c.free_sequence(b);
    const std::vector<float> x = uniform(40 * E, 1.0f, 9);
    (void)step_rows(m, c, {a}, {40}, x, E);
    EXPECT_EQ(c.length(a), 60u);
    // Direct appends check the pool the same way.
    const std::vector<float> k(2 * 20 * d, 1.0f);
    EXPECT_THROW(c.append(a, kv_heads(k.data(), 2, 20, d), kv_heads(k.data(), 2, 20, d)), mha::invalid_argument);
    EXPECT_EQ(c.length(a), 60u);
}

// A model of three layers, each with its own paged cache, through kSteps: one StepPlan per step given to every
// layer equals each layer planning its own step (bitwise: outputs and cached rows), for 1 and 2 threads.
TEST(PagedKVCache, OneStepPlanServesEveryLayerOfAModel) {
    const std::size_t E = 64, H = 8, Hkv = 2, d = 16, L = 3;
    std::vector<DecoderLayer> layers;
    std::vector<mha::MultiheadAttention> m;
    for (std::size_t l = 0; l < L; ++l) {
        layers.emplace_back(E, H, Hkv, d, mha::RopeConfig{}, true, l == 1, 931 + 10 * std::uint32_t(l));
        m.push_back(layers.back().make());
    }
    const std::vector<std::vector<float>> x = token_rows(E, 55);
    for (int threads : {1, 2}) {
        std::vector<mha::PagedKVCache> own, shared;
        for (std::size_t l = 0; l < L; ++l) own.emplace_back(64, 32, Hkv, d), shared.emplace_back(64, 32, Hkv, d);
        std::vector<std::size_t> ids;
        for (std::size_t s = 0; s < kSequences; ++s) {
            ids.push_back(own[0].add_sequence());
            for (std::size_t l = 0; l < L; ++l) {
                if (l > 0) {
                    ASSERT_EQ(own[l].add_sequence(), ids[s]);
                }
                ASSERT_EQ(shared[l].add_sequence(), ids[s]);
            }
        }
        std::vector<std::size_t> at(kSequences, 0);
        for (const Step& step : kSteps) {
            std::vector<std::size_t> seq_ids, q_lens;
            std::vector<float> h0;
            for (const Part& p : step) {
                seq_ids.push_back(ids[p.seq]);
                q_lens.push_back(p.q);
                h0.insert(h0.end(), x[p.seq].begin() + std::ptrdiff_t(at[p.seq] * E), x[p.seq].begin() + std::ptrdiff_t((at[p.seq] + p.q) * E));
                at[p.seq] += p.q;
            }
            const std::size_t T = h0.size() / E;
            std::vector<float> a = h0, b = h0, next(T * E);
            const mha::StepPlan plan(m[0], shared[0], seq_ids.data(), q_lens.data(), seq_ids.size(), threads);
            EXPECT_EQ(plan.tokens(), T);
            EXPECT_EQ(plan.sequences(), step.size());
            for (std::size_t l = 0; l < L; ++l) {
                std::fill(next.begin(), next.end(), kNaN);
                m[l].forward_step(mha::ConstMatrix(a.data(), T, E), mha::Matrix(next.data(), T, E), own[l], seq_ids.data(),
                                  q_lens.data(), seq_ids.size(), threads);
                a.swap(next);
                std::fill(next.begin(), next.end(), kNaN);
                m[l].forward_step(mha::ConstMatrix(b.data(), T, E), mha::Matrix(next.data(), T, E), shared[l], plan);
                b.swap(next);
                EXPECT_TRUE(same_bits(a, b)) << "layer " << l << ", threads " << threads;
            }
        }
        for (std::size_t l = 0; l < L; ++l)
            for (std::size_t s = 0; s < kSequences; ++s) {
                ASSERT_EQ(shared[l].length(ids[s]), total_tokens(s));
                EXPECT_TRUE(same_bits(paged_rows(shared[l], ids[s], 1, false), paged_rows(own[l], ids[s], 1, false)));
                EXPECT_TRUE(same_bits(paged_rows(shared[l], ids[s], 0, true), paged_rows(own[l], ids[s], 0, true)));
            }
    }
}

// A plan that does not fit the layer or the cache is refused with nothing changed.
TEST(PagedKVCache, AStepPlanThatDoesNotFitIsRefused) {
    const std::size_t E = 64, d = 16;
    const DecoderLayer layer(E, 8, 2, d, mha::RopeConfig{}, true, false, 941), other(E, 4, 2, d, mha::RopeConfig{}, true, false, 942);
    const mha::MultiheadAttention m = layer.make(), wide = other.make();
    mha::PagedKVCache c(8, 16, 2, d), taken(8, 16, 2, d), blocks32(8, 32, 2, d), heads4(8, 16, 4, d),
        int8s(8, 16, 2, d, mha::DataType::int8);
    const std::size_t a = c.add_sequence(), b = c.add_sequence();
    (void)taken.add_sequence(), (void)taken.add_sequence(), (void)blocks32.add_sequence(), (void)blocks32.add_sequence();
    (void)heads4.add_sequence(), (void)int8s.add_sequence(), (void)int8s.add_sequence();
    (void)step_rows(m, c, {a, b}, {20, 10}, uniform(30 * E, 1.0f, 7), E);
    (void)step_rows(m, taken, {a, b}, {20, 10}, uniform(30 * E, 1.0f, 7), E);
    (void)step_rows(m, blocks32, {a, b}, {20, 10}, uniform(30 * E, 1.0f, 7), E);
    (void)step_rows(m, int8s, {a, b}, {20, 10}, uniform(30 * E, 1.0f, 7), E);
    const std::vector<std::size_t> ids = {b, a}, q = {1, 3};
    const mha::StepPlan plan(m, c, ids.data(), q.data(), 2);
    const std::vector<float> x = uniform(4 * E, 1.0f, 8);
    auto refused = [&](const mha::MultiheadAttention& layer_, mha::PagedKVCache& cache, std::size_t T, const std::string& words) {
        const std::size_t free_before = cache.free_blocks();
        auto length_or_none = [&](std::size_t s) {  // a freed sequence: none
            try {
                return cache.length(s);
            } catch (const mha::invalid_argument&) {
                return SIZE_MAX;
            }
        };
        const std::size_t la = length_or_none(a), lb = length_or_none(b);
        std::vector<float> y(T * E, 7.0f);
        try {
            layer_.forward_step(mha::ConstMatrix(x.data(), T, E), mha::Matrix(y.data(), T, E), cache, plan);
            ADD_FAILURE() << "accepted: " << words;
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
        EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; })) << "output written";
        EXPECT_EQ(cache.free_blocks(), free_before);
        EXPECT_EQ(length_or_none(a), la);
        EXPECT_EQ(length_or_none(b), lb);
    };
    refused(wide, c, 4, "the step plan was made for a layer of embed_dim 64, 8 heads");
    refused(m, c, 3, "T = sum of q_lens");
    refused(m, blocks32, 4, "made for blocks of 16 tokens but this cache has blocks of 32");
    refused(m, heads4, 4, "holds 4 KV heads of dim 16");
    // Another element type: the decode path splits the keys by element size (decode_split), sized in the plan.
    refused(m, int8s, 4, "the step plan was made for a cache of f32 but this cache holds int8");
    // The plan serves one step: once a cache took it, that cache is past it.
    std::vector<float> y(4 * E);
    m.forward_step(mha::ConstMatrix(x.data(), 4, E), mha::Matrix(y.data(), 4, E), taken, plan);
    EXPECT_EQ(taken.length(a), 23u);
    refused(m, taken, 4, "the step plan was made for sequence 1 at 10 tokens but this cache holds 11");
    // A sequence the plan names, freed in this cache.
    taken.free_sequence(b);
    refused(m, taken, 4, "the step plan's sequence 1 is not in this paged KV cache");
    // A moved-from plan.
    mha::StepPlan moved = mha::StepPlan(m, c, ids.data(), q.data(), 2);
    const mha::StepPlan into = std::move(moved);
    EXPECT_EQ(into.tokens(), 4u);
    EXPECT_THROW(m.forward_step(mha::ConstMatrix(x.data(), 4, E), mha::Matrix(y.data(), 4, E), c, moved), mha::invalid_argument);
    // Planning validates as forward_step does.
    const std::vector<std::size_t> zero = {1, 0};
    EXPECT_THROW((void)mha::StepPlan(m, c, ids.data(), zero.data(), 2), mha::invalid_argument);
    EXPECT_THROW((void)mha::StepPlan(m, heads4, ids.data(), q.data(), 1), mha::invalid_argument);
    EXPECT_THROW((void)mha::StepPlan(m, c, ids.data(), q.data(), 2, -1), mha::invalid_argument);
}

TEST(PagedKVCache, ConstructionAndAppendChecks) {
    EXPECT_THROW(mha::PagedKVCache(8, 24, 2, 16), mha::invalid_argument);
    EXPECT_THROW(mha::PagedKVCache(0, 16, 2, 16), mha::invalid_argument);
    EXPECT_THROW(mha::PagedKVCache(8, 16, 0, 16), mha::invalid_argument);
    // Sizes whose row or pool bytes wrap size_t (a row of 2^62 floats is 0 bytes modulo 2^64).
    for (mha::DataType t : {mha::DataType::f32, mha::DataType::int8}) {
        EXPECT_THROW(mha::PagedKVCache(1, 16, 1, std::size_t{1} << 62, t), mha::invalid_argument);
        EXPECT_THROW(mha::PagedKVCache(1, 16, 1, SIZE_MAX - 3, t), mha::invalid_argument);
        EXPECT_THROW(mha::PagedKVCache(std::size_t{1} << 31, 256, std::size_t{1} << 20, 128, t), mha::invalid_argument);
    }
    mha::PagedKVCache c(8, 32, 2, 4, mha::DataType::bf16);
    const std::size_t s = c.add_sequence();
    const std::vector<float> k = uniform(2 * 40 * 4, 3.0f, 11), v = uniform(2 * 40 * 4, 3.0f, 12);
    c.append(s, kv_heads(k.data(), 2, 40, 4), kv_heads(v.data(), 2, 40, 4));
    EXPECT_EQ(c.length(s), 40u);
    EXPECT_EQ(c.used_blocks(), 2u);
    mha::KVCache kv(1, 2, 4, 40, mha::DataType::bf16);
    kv.append(0, kv_heads(k.data(), 2, 40, 4), kv_heads(v.data(), 2, 40, 4));
    for (std::size_t h = 0; h < 2; ++h) {
        EXPECT_TRUE(same_bits(paged_rows(c, s, h, false), contiguous_rows(kv, 0, h, false)));
        EXPECT_TRUE(same_bits(paged_rows(c, s, h, true), contiguous_rows(kv, 0, h, true)));
    }
    EXPECT_THROW(c.append(s, kv_heads(k.data(), 1, 40, 4), kv_heads(v.data(), 2, 40, 4)), mha::invalid_argument);
    std::vector<float> small(4);
    EXPECT_THROW(c.copy_keys(s, 0, mha::Matrix(small.data(), 1, 4)), mha::invalid_argument);
    EXPECT_THROW(c.copy_keys(s, 2, mha::Matrix(small.data(), 1, 4)), mha::invalid_argument);
    // A layer whose KV heads differ from the cache's is refused.
    const DecoderLayer layer(64, 8, 4, 16, std::nullopt, false, false, 913);
    const mha::MultiheadAttention m = layer.make();
    mha::PagedKVCache other(8, 16, 2, 16);
    const std::size_t o = other.add_sequence(), one = 1;
    std::vector<float> x(64), y(64);
    EXPECT_THROW(m.forward_step(mha::ConstMatrix(x.data(), 1, 64), mha::Matrix(y.data(), 1, 64), other, &o, &one, 1), mha::invalid_argument);
    EXPECT_EQ(other.length(o), 0u);
}

// Level 2: a caller's pool, its own block tables (any ids, in any order), rows written at slots; the result
// equals SDPA on the same keys held contiguously (bitwise: the same path and splits).
TEST(PagedKVCache, CallerPoolWithItsOwnBlockTables) {
    const std::size_t Hkv = 2, H = 8, d = 16, bs = 16, blocks = 12;
    std::vector<float> keys(blocks * Hkv * bs * d, kNaN), values(keys.size(), kNaN);  // unused rows stay NaN
    const mha::PagedKVPool pool{keys.data(), values.data(), mha::DataType::f32, blocks, bs, Hkv, d};
    // Sequence 0: 40 keys in blocks 7, 2, 9; sequence 1: 20 keys in blocks 11, 0.
    const std::vector<std::uint32_t> tables = {7, 2, 9, 11, 0, 0};
    const std::vector<std::size_t> lengths = {40, 20}, starts = {0, 1, 4};  // q = 1 and 3
    const std::vector<float> kx = uniform(60 * Hkv * d, 1.0f, 21), vx = uniform(60 * Hkv * d, 1.0f, 22);
    std::vector<std::int64_t> slots;
    for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t j = 0; j < lengths[s]; ++j) slots.push_back(std::int64_t(tables[s * 3 + j / bs] * bs + j % bs));
    mha::paged_write_kv(pool, mha::ConstMatrix(kx.data(), 60, Hkv * d), mha::ConstMatrix(vx.data(), 60, Hkv * d), slots.data());
    const std::vector<float> q = uniform(4 * H * d, 2.0f, 23);
    std::vector<float> out(4 * H * d, kNaN);
    const mha::PagedSequences seqs{2, tables.data(), 3, lengths.data(), starts.data()};
    mha_test::for_each_cpu_isa([&] {
        mha::paged_attention(mha::ConstMatrix(q.data(), 4, H * d), pool, seqs, mha::Matrix(out.data(), 4, H * d));
        for (std::size_t s = 0; s < 2; ++s) {
            const std::size_t L = lengths[s], q0 = starts[s], nq = starts[s + 1] - q0, k0 = s == 0 ? 0 : 40;
            // [1, Hkv, L, d] views of the token-major rows; q / out [1, H, nq, d] views of [T, H·d].
            const mha::ConstHeads k(kx.data() + k0 * Hkv * d, 1, Hkv, L, d, 0, d, Hkv * d), v(vx.data() + k0 * Hkv * d, 1, Hkv, L, d, 0, d, Hkv * d);
            std::vector<float> want(nq * H * d);
            mha::SdpaOptions o;
            o.causal = true;
            o.causal_alignment = mha::CausalAlignment::bottom_right;
            mha::scaled_dot_product_attention({mha::ConstHeads(q.data() + q0 * H * d, 1, H, nq, d, 0, d, H * d), k, v, {}, {}},
                                              mha::Heads(want.data(), 1, H, nq, d, 0, d, H * d), o);
            EXPECT_TRUE(same_bits(std::vector<float>(out.begin() + std::ptrdiff_t(q0 * H * d), out.begin() + std::ptrdiff_t((q0 + nq) * H * d)), want))
                << "sequence " << s;
        }
    });
    // Refusals: a block id past the pool, a table too short, queries past the keys, a slot written twice.
    const std::vector<std::uint32_t> bad = {7, 2, 12, 11, 0, 0};
    EXPECT_THROW(mha::paged_attention(mha::ConstMatrix(q.data(), 4, H * d), pool, {2, bad.data(), 3, lengths.data(), starts.data()},
                                      mha::Matrix(out.data(), 4, H * d)),
                 mha::invalid_argument);
    EXPECT_THROW(mha::paged_attention(mha::ConstMatrix(q.data(), 4, H * d), pool, {2, tables.data(), 2, lengths.data(), starts.data()},
                                      mha::Matrix(out.data(), 4, H * d)),
                 mha::invalid_argument);
    const std::vector<std::size_t> short_keys = {40, 2};
    EXPECT_THROW(mha::paged_attention(mha::ConstMatrix(q.data(), 4, H * d), pool, {2, tables.data(), 3, short_keys.data(), starts.data()},
                                      mha::Matrix(out.data(), 4, H * d)),
                 mha::invalid_argument);
    const std::vector<std::int64_t> twice = {3, 3};
    EXPECT_THROW(mha::paged_write_kv(pool, mha::ConstMatrix(kx.data(), 2, Hkv * d), mha::ConstMatrix(vx.data(), 2, Hkv * d), twice.data()),
                 mha::invalid_argument);

    // More refusals, each leaving out and the pool as they were: a key length whose block count wraps size_t,
    // out inside the pool, keys and values on the same array, a block size the kernels do not take, k inside
    // the pool, a slot below -1.
    const std::vector<float> keys_before = keys, values_before = values, out_before = out;
    auto unchanged = [&](const char* what) {
        EXPECT_TRUE(same_bits(keys, keys_before)) << what;
        EXPECT_TRUE(same_bits(values, values_before)) << what;
        EXPECT_TRUE(same_bits(out, out_before)) << what;
    };
    auto refused = [&](const char* what, const std::string& words, auto&& call) {
        try {
            call();
            ADD_FAILURE() << what << " accepted";
        } catch (const mha::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << what << ": " << e.what();
        }
        unchanged(what);
    };
    const mha::ConstMatrix q4(q.data(), 4, H * d);
    for (std::size_t huge : {std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max() - 14}) {
        const std::vector<std::size_t> wrap = {40, huge};
        refused("a key length near SIZE_MAX", "blocks but table_stride is 3", [&] {
            mha::paged_attention(q4, pool, {2, tables.data(), 3, wrap.data(), starts.data()}, mha::Matrix(out.data(), 4, H * d));
        });
    }
    refused("out inside the pool's keys", "out overlaps the pool", [&] {
        mha::paged_attention(q4, pool, seqs, mha::Matrix(keys.data() + 64, 4, H * d));
    });
    const mha::PagedKVPool same{keys.data(), keys.data(), mha::DataType::f32, blocks, bs, Hkv, d};
    refused("keys and values on one array", "keys and values overlap", [&] {
        mha::paged_attention(q4, same, seqs, mha::Matrix(out.data(), 4, H * d));
    });
    const mha::PagedKVPool odd{keys.data(), values.data(), mha::DataType::f32, blocks * 2, bs / 2, Hkv, d};
    refused("block size 8", "block_size 8 is not 16, 32, 64, 128 or 256", [&] {
        mha::paged_attention(q4, odd, seqs, mha::Matrix(out.data(), 4, H * d));
    });
    const std::vector<std::int64_t> two = {5, 6}, below = {5, -2};
    refused("k inside the pool", "k overlaps the pool", [&] {
        mha::paged_write_kv(pool, mha::ConstMatrix(keys.data(), 2, Hkv * d), mha::ConstMatrix(vx.data(), 2, Hkv * d), two.data());
    });
    refused("a slot of -2", "slot -2 is outside the pool", [&] {
        mha::paged_write_kv(pool, mha::ConstMatrix(kx.data(), 2, Hkv * d), mha::ConstMatrix(vx.data(), 2, Hkv * d), below.data());
    });
    refused("slots inside the pool", "slots overlap the pool", [&] {  // they would change as the rows are written
        mha::paged_write_kv(pool, mha::ConstMatrix(kx.data(), 2, Hkv * d), mha::ConstMatrix(vx.data(), 2, Hkv * d),
                            reinterpret_cast<const std::int64_t*>(values.data() + 64));
    });

    // Slot -1 (vLLM's padding token) is skipped: only the other rows are written.
    const std::vector<std::int64_t> padded = {-1, 5 * std::int64_t(bs) + 3, -1};
    mha::paged_write_kv(pool, mha::ConstMatrix(kx.data(), 3, Hkv * d), mha::ConstMatrix(vx.data(), 3, Hkv * d), padded.data());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const std::size_t block = i / (Hkv * bs * d), h = i / (bs * d) % Hkv, row = i / d % bs, c = i % d;
        const bool written = block == 5 && row == 3;
        const float want_k = written ? kx[1 * Hkv * d + h * d + c] : keys_before[i], want_v = written ? vx[1 * Hkv * d + h * d + c] : values_before[i];
        ASSERT_TRUE(same_bits(std::vector<float>{keys[i]}, std::vector<float>{want_k})) << i;
        ASSERT_TRUE(same_bits(std::vector<float>{values[i]}, std::vector<float>{want_v})) << i;
    }
}

}  // namespace
