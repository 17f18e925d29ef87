// libFuzzer target: the paged KV cache and variable-length steps (mha/paged_kv_cache.hpp) driven by a
// sequence of operations decoded from the input bytes.
//
// Level 1: a small pool (a few blocks of 16 or 32, f32 / bf16 / f16) and a layer (GQA, MHA or MQA, RoPE);
// operations add, fork, truncate and free sequences and run steps whose description is fuzzed: sequence ids
// (live, freed, never added, repeated), q_lens (0 included), T sometimes != Σ q_lens, pools that run out of
// blocks mid-step. Every sequence has a shadow: a contiguous B = 1 mha::KVCache holding the same rows (a fork
// copies its parent's shadow, a truncate truncates it). A step that succeeds must give each sequence's rows
// bitwise equal to a forward of the same tokens on its shadow alone (batch invariance, paged = contiguous),
// and leave the cached rows equal to the shadow's; a step that fails must throw mha::invalid_argument and
// change nothing: output, lengths, free blocks, rows. Half the steps go through a mha::StepPlan made first,
// which the cache must then refuse for a second step (nothing changed); a quarter run Backend::scalar (and
// their shadows too).
// Level 2: random block tables over a caller's pool (ids in any order, sometimes out of range, tables too
// short, queries past the keys): a valid call must match scaled_dot_product_attention on the same keys held
// contiguously (bitwise), an invalid one throw and leave the output untouched.
// MHA_FUZZ_VERBOSE=1 prints one line per operation.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

namespace {

constexpr float kSentinel = -7777.25f;

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz_paged_step: %s\n", what.c_str());
    std::abort();
}

bool verbose() {
    static const bool v = std::getenv("MHA_FUZZ_VERBOSE") != nullptr;
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<float> uniform(std::size_t n, float bound, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(-bound, bound);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

struct Shape {
    std::size_t E, H, Hkv, d;
};
constexpr Shape kShapes[] = {{32, 4, 2, 8}, {24, 3, 3, 8}, {32, 8, 1, 4}};
constexpr std::size_t kMaxKeys = 160;  // per sequence: the shadows' capacity

struct Layer {
    Shape s;
    std::vector<float> wq, wk, wv, wo, bq, bo;
    mha::MultiheadAttention m;
    static mha::MultiheadAttention make(const Shape& s, Layer& l, std::mt19937& rng) {
        const float a = 2.0f / std::sqrt(float(s.E));
        l.wq = uniform(s.H * s.d * s.E, a, rng), l.wk = uniform(s.Hkv * s.d * s.E, a, rng), l.wv = uniform(s.Hkv * s.d * s.E, a, rng);
        l.wo = uniform(s.E * s.H * s.d, a, rng), l.bq = uniform(s.H * s.d, a, rng), l.bo = uniform(s.E, a, rng);
        mha::AttentionConfig c;
        c.embed_dim = s.E, c.num_heads = s.H, c.num_kv_heads = s.Hkv, c.head_dim = s.d, c.rope = mha::RopeConfig{};
        mha::AttentionWeights w;
        w.q_proj_weight = l.wq.data(), w.k_proj_weight = l.wk.data(), w.v_proj_weight = l.wv.data(), w.out_proj_weight = l.wo.data();
        w.q_proj_bias = l.bq.data(), w.out_proj_bias = l.bo.data();
        return mha::MultiheadAttention(w, c);
    }
    Layer(const Shape& shape, std::mt19937& rng) : s(shape), m(make(shape, *this, rng)) {}
};

std::vector<float> rows_of(const mha::PagedKVCache& c, std::size_t s, bool values) {
    std::vector<float> r(c.kv_heads() * c.length(s) * c.head_dim());
    for (std::size_t h = 0; h < c.kv_heads(); ++h) {
        const mha::Matrix dst(r.data() + h * c.length(s) * c.head_dim(), c.length(s), c.head_dim());
        values ? c.copy_values(s, h, dst) : c.copy_keys(s, h, dst);
    }
    return r;
}

std::vector<float> rows_of(const mha::KVCache& c, bool values) {
    std::vector<float> r(c.kv_heads() * c.length(0) * c.head_dim());
    for (std::size_t h = 0; h < c.kv_heads(); ++h) {
        const mha::Matrix dst(r.data() + h * c.length(0) * c.head_dim(), c.length(0), c.head_dim());
        values ? c.copy_values(0, h, dst) : c.copy_keys(0, h, dst);
    }
    return r;
}

// A sequence's shadow: a contiguous cache with the same rows.
std::unique_ptr<mha::KVCache> copy_of(const mha::KVCache& c) {
    auto n = std::make_unique<mha::KVCache>(1, c.kv_heads(), c.head_dim(), c.capacity(), c.element_type());
    const std::vector<float> k = rows_of(c, false), v = rows_of(c, true);
    const std::size_t L = c.length(0), d = c.head_dim(), H = c.kv_heads();
    n->append(0, mha::ConstHeads(k.data(), 1, H, L, d, H * L * d, L * d, d), mha::ConstHeads(v.data(), 1, H, L, d, H * L * d, L * d, d));
    return n;
}

void level1(FuzzedDataProvider& fdp, std::mt19937& rng) {
    const Shape shape = kShapes[fdp.ConsumeIntegralInRange<std::size_t>(0, 2)];
    const std::size_t bs = fdp.ConsumeBool() ? 16 : 32, blocks = fdp.ConsumeIntegralInRange<std::size_t>(1, 20);
    const mha::DataType type = fdp.PickValueInArray({mha::DataType::f32, mha::DataType::bf16, mha::DataType::f16});
    const int threads = fdp.ConsumeIntegralInRange<int>(1, 3);
    Layer layer(shape, rng);
    mha::PagedKVCache cache(blocks, bs, shape.Hkv, shape.d, type);
    std::vector<std::unique_ptr<mha::KVCache>> shadow;  // by sequence id; null: not live
    auto live = [&] {
        std::vector<std::size_t> ids;
        for (std::size_t s = 0; s < shadow.size(); ++s)
            if (shadow[s]) ids.push_back(s);
        return ids;
    };
    auto pick = [&](const std::vector<std::size_t>& ids) { return ids[fdp.ConsumeIntegralInRange<std::size_t>(0, ids.size() - 1)]; };
    auto check_rows = [&](std::size_t s, const char* when) {
        if (cache.length(s) != shadow[s]->length(0)) fail(std::string(when) + ": length differs from the shadow's");
        if (!same_bits(rows_of(cache, s, false), rows_of(*shadow[s], false)) || !same_bits(rows_of(cache, s, true), rows_of(*shadow[s], true)))
            fail(std::string(when) + ": rows differ from the shadow's");
    };
    const int ops = fdp.ConsumeIntegralInRange<int>(1, 10);
    for (int op = 0; op < ops && fdp.remaining_bytes() > 0; ++op) {
        const int kind = fdp.ConsumeIntegralInRange<int>(0, 5);
        std::vector<std::size_t> ids = live();
        if (kind == 0 || ids.empty()) {
            const std::size_t s = cache.add_sequence();
            if (s > shadow.size()) fail("add_sequence skipped an id");
            if (s == shadow.size()) shadow.emplace_back();
            if (shadow[s]) fail("add_sequence returned a live id");
            shadow[s] = std::make_unique<mha::KVCache>(1, shape.Hkv, shape.d, kMaxKeys, type);
            if (verbose()) std::fprintf(stderr, "add -> %zu\n", s);
            continue;
        }
        if (kind == 1) {
            const std::size_t p = pick(ids), s = cache.fork(p);
            if (s == shadow.size()) shadow.emplace_back();
            if (shadow[s]) fail("fork returned a live id");
            shadow[s] = copy_of(*shadow[p]);
            check_rows(s, "fork");
            if (verbose()) std::fprintf(stderr, "fork %zu -> %zu\n", p, s);
            continue;
        }
        if (kind == 2) {
            const std::size_t s = pick(ids), n = fdp.ConsumeIntegralInRange<std::size_t>(0, cache.length(s));
            cache.truncate(s, n);
            shadow[s]->truncate(0, n);
            if (verbose()) std::fprintf(stderr, "truncate %zu to %zu\n", s, n);
            continue;
        }
        if (kind == 3) {
            const std::size_t s = pick(ids);
            cache.free_sequence(s);
            shadow[s].reset();
            if (verbose()) std::fprintf(stderr, "free %zu\n", s);
            continue;
        }
        // A step, sometimes corrupted.
        const std::size_t n = fdp.ConsumeIntegralInRange<std::size_t>(1, std::min<std::size_t>(5, ids.size()));
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<std::size_t> seq(ids.begin(), ids.begin() + std::ptrdiff_t(n)), q(n);
        bool valid = true;
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t room = kMaxKeys - cache.length(seq[i]);
            q[i] = fdp.ConsumeBool() ? 1 : fdp.ConsumeIntegralInRange<std::size_t>(1, std::min<std::size_t>(40, std::max<std::size_t>(room, 1)));
            if (q[i] > room) q[i] = room;  // the shadow's capacity
            if (q[i] == 0) valid = false;
        }
        const int corruption = fdp.ConsumeIntegralInRange<int>(0, 9);
        std::size_t T = 0;
        for (std::size_t x : q) T += x;
        if (corruption == 1) seq.push_back(seq[0]), q.push_back(1), T += 1, valid = false;  // duplicate
        if (corruption == 2) T -= q[0], q[0] = 0, valid = false;
        if (corruption == 3) seq[0] = shadow.size() + 3, valid = false;  // never added
        std::size_t rows = T;
        if (corruption == 4) rows = T + 1, valid = false;
        const std::vector<float> x = uniform(std::max<std::size_t>(rows, 1) * shape.E, 1.0f, rng);
        std::vector<float> y(std::max<std::size_t>(rows, 1) * shape.E, kSentinel);
        // Blocks this step needs: new blocks, plus copies of shared partial last blocks, one per writer, except
        // that when every holder of such a block writes, one of them keeps it (paged_kv_cache.hpp): more than free
        // is refused.
        std::size_t needed = 0;
        if (valid) {
            auto holders = [&](std::uint32_t block) {
                std::size_t n = 0;
                for (std::size_t o : ids) n += std::count(cache.block_table(o).begin(), cache.block_table(o).end(), block) > 0;
                return n;
            };
            std::map<std::uint32_t, std::size_t> writers;  // shared partial last block -> sequences of this step writing it
            for (std::size_t i = 0; i < seq.size(); ++i) {
                const std::size_t len = cache.length(seq[i]);
                needed += (len + q[i] + bs - 1) / bs - (len + bs - 1) / bs;
                if (len % bs == 0) continue;
                const std::uint32_t last = cache.block_table(seq[i]).back();
                if (holders(last) > 1) ++writers[last];
            }
            for (const auto& [block, w] : writers) needed += w == holders(block) ? w - 1 : w;
        }
        std::vector<std::vector<float>> keys_before;
        const std::size_t free_before = cache.free_blocks();
        for (std::size_t s : ids) keys_before.push_back(rows_of(cache, s, false));
        bool threw = false;
        const bool planned = fdp.ConsumeBool();  // through a StepPlan made first (as a model's layers share one)
        // A quarter of the steps on the scalar backend (the reference per sequence; its shadow likewise).
        const mha::Backend backend = fdp.ConsumeIntegralInRange<int>(0, 3) == 0 ? mha::Backend::scalar : mha::Backend::simd;
        std::unique_ptr<mha::StepPlan> plan;
        try {
            if (planned) {
                plan = std::make_unique<mha::StepPlan>(layer.m, cache, seq.data(), q.data(), seq.size(), threads);
                layer.m.forward_step(mha::ConstMatrix(x.data(), rows, shape.E), mha::Matrix(y.data(), rows, shape.E), cache, *plan,
                                     backend);
            } else {
                layer.m.forward_step(mha::ConstMatrix(x.data(), rows, shape.E), mha::Matrix(y.data(), rows, shape.E), cache, seq.data(),
                                     q.data(), seq.size(), threads, backend);
            }
        } catch (const mha::invalid_argument& e) {
            threw = true;
            if (verbose()) std::fprintf(stderr, "step refused: %s\n", e.what());
        }
        if (verbose()) std::fprintf(stderr, "step of %zu sequences, %zu tokens, valid %d, threw %d\n", seq.size(), rows, valid, threw);
        if (!valid && !threw) fail("a corrupted step was accepted");
        if (valid && threw && needed <= free_before) fail("a valid step with enough free blocks was refused");
        if (valid && !threw && needed > free_before) fail("a step needing more blocks than free was accepted");
        if (threw) {
            if (std::any_of(y.begin(), y.end(), [](float v) { return v != kSentinel; })) fail("a refused step wrote its output");
            if (cache.free_blocks() != free_before) fail("a refused step changed the free blocks");
            for (std::size_t k = 0; k < ids.size(); ++k)
                if (!same_bits(rows_of(cache, ids[k], false), keys_before[k])) fail("a refused step changed rows");
            for (std::size_t s : ids) check_rows(s, "after a refused step");
            continue;
        }
        // A plan serves one step: the same plan again on this cache is refused, nothing changed.
        if (plan) {
            std::vector<float> again(y.size(), kSentinel);
            const std::size_t free_after = cache.free_blocks();
            std::vector<std::size_t> lengths;
            for (std::size_t s : seq) lengths.push_back(cache.length(s));
            try {
                layer.m.forward_step(mha::ConstMatrix(x.data(), rows, shape.E), mha::Matrix(again.data(), rows, shape.E), cache, *plan);
                fail("a step plan was accepted twice by one cache");
            } catch (const mha::invalid_argument&) {
            }
            if (std::any_of(again.begin(), again.end(), [](float v) { return v != kSentinel; })) fail("a refused plan wrote its output");
            if (cache.free_blocks() != free_after) fail("a refused plan changed the free blocks");
            for (std::size_t i = 0; i < seq.size(); ++i)
                if (cache.length(seq[i]) != lengths[i]) fail("a refused plan changed a length");
        }
        // Success: each sequence alone on its shadow.
        std::size_t row = 0;
        for (std::size_t i = 0; i < seq.size(); ++i) {
            std::vector<float> want(q[i] * shape.E, kSentinel);
            mha::AttentionInputs in;
            in.query = mha::ConstBatch(x.data() + row * shape.E, 1, q[i], shape.E);
            mha::ForwardOptions opt;
            opt.backend = backend;
            layer.m.forward(in, {mha::Batch(want.data(), 1, q[i], shape.E)}, opt, *shadow[seq[i]]);
            const std::vector<float> got(y.begin() + std::ptrdiff_t(row * shape.E), y.begin() + std::ptrdiff_t((row + q[i]) * shape.E));
            if (!same_bits(got, want)) fail("sequence " + std::to_string(seq[i]) + ": the step's rows differ from the sequence alone");
            row += q[i];
            check_rows(seq[i], "after a step");
        }
    }
    std::size_t used = 0;
    for (std::size_t s : live()) used += (cache.length(s) + bs - 1) / bs;
    if (cache.used_blocks() > used) fail("more blocks in use than the live sequences' tokens need");
}

void level2(FuzzedDataProvider& fdp, std::mt19937& rng) {
    const Shape shape = kShapes[fdp.ConsumeIntegralInRange<std::size_t>(0, 2)];
    const std::size_t bs = 16, blocks = fdp.ConsumeIntegralInRange<std::size_t>(1, 12), Hkv = shape.Hkv, d = shape.d, H = shape.H;
    std::vector<float> kpool = uniform(blocks * Hkv * bs * d, 1.0f, rng), vpool = uniform(kpool.size(), 1.0f, rng);
    const mha::PagedKVPool pool{kpool.data(), vpool.data(), mha::DataType::f32, blocks, bs, Hkv, d};
    const std::size_t n = fdp.ConsumeIntegralInRange<std::size_t>(1, 4), stride = fdp.ConsumeIntegralInRange<std::size_t>(1, 4);
    std::vector<std::uint32_t> tables(n * stride);
    for (auto& t : tables) t = fdp.ConsumeIntegralInRange<std::uint32_t>(0, static_cast<std::uint32_t>(blocks) + (fdp.ConsumeBool() ? 0 : 1) - 1);
    std::vector<std::size_t> lengths(n), starts(n + 1, 0);
    bool valid = true;
    for (std::size_t i = 0; i < n; ++i) {
        lengths[i] = fdp.ConsumeIntegralInRange<std::size_t>(1, stride * bs + (fdp.ConsumeBool() ? 0 : 5));
        const std::size_t q = fdp.ConsumeIntegralInRange<std::size_t>(1, std::min<std::size_t>(lengths[i] + 1, 20));
        starts[i + 1] = starts[i] + q;
        if (q > lengths[i] || (lengths[i] + bs - 1) / bs > stride) valid = false;
        for (std::size_t b = 0; b < std::min(stride, (lengths[i] + bs - 1) / bs); ++b)
            if (tables[i * stride + b] >= blocks) valid = false;
    }
    const std::size_t T = starts[n];
    const std::vector<float> q = uniform(T * H * d, 2.0f, rng);
    std::vector<float> out(T * H * d, kSentinel);
    bool threw = false;
    try {
        mha::paged_attention(mha::ConstMatrix(q.data(), T, H * d), pool, {n, tables.data(), stride, lengths.data(), starts.data()},
                             mha::Matrix(out.data(), T, H * d));
    } catch (const mha::invalid_argument&) {
        threw = true;
    }
    if (threw != !valid) fail(valid ? "a valid level-2 call was refused" : "an invalid level-2 call was accepted");
    if (threw) {
        if (std::any_of(out.begin(), out.end(), [](float v) { return v != kSentinel; })) fail("a refused call wrote its output");
        return;
    }
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t L = lengths[i], q0 = starts[i], nq = starts[i + 1] - q0;
        std::vector<float> k(Hkv * L * d), v(k.size());  // [Hkv, L, d] gathered through the table
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < L; ++j) {
                const std::size_t at = ((tables[i * stride + j / bs] * Hkv + h) * bs + j % bs) * d;
                std::copy(kpool.begin() + std::ptrdiff_t(at), kpool.begin() + std::ptrdiff_t(at + d), k.begin() + std::ptrdiff_t((h * L + j) * d));
                std::copy(vpool.begin() + std::ptrdiff_t(at), vpool.begin() + std::ptrdiff_t(at + d), v.begin() + std::ptrdiff_t((h * L + j) * d));
            }
        std::vector<float> want(nq * H * d);
        mha::SdpaOptions o;
        o.causal = true;
        o.causal_alignment = mha::CausalAlignment::bottom_right;
        mha::scaled_dot_product_attention({mha::ConstHeads(q.data() + q0 * H * d, 1, H, nq, d, 0, d, H * d),
                                           mha::ConstHeads(k.data(), 1, Hkv, L, d, 0, L * d, d), mha::ConstHeads(v.data(), 1, Hkv, L, d, 0, L * d, d),
                                           {}, {}},
                                          mha::Heads(want.data(), 1, H, nq, d, 0, d, H * d), o);
        const std::vector<float> got(out.begin() + std::ptrdiff_t(q0 * H * d), out.begin() + std::ptrdiff_t((q0 + nq) * H * d));
        if (!same_bits(got, want)) fail("level 2: sequence " + std::to_string(i) + " differs from sdpa on the same keys");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider fdp(data, size);
    std::mt19937 rng(fdp.ConsumeIntegral<std::uint32_t>());
    if (fdp.ConsumeBool())
        level1(fdp, rng);
    else
        level2(fdp, rng);
    return 0;
}
