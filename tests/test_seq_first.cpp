// Sequence-first layouts at the public API: PyTorch's default batch_first=False stores [L, B, E], which is
// the library's BatchView with row stride B·E and batch stride E. Every case runs the same problem on
// batch-first copies and on [L, B, E] data (query/key/value and output chosen independently, plus padded
// seq-first views whose NaN padding must be neither read nor written), on the scalar backend and on the
// SIMD backend with Impl::materialized and Impl::fused on every ISA the CPU has. Checks:
//   - each seq-first result is bitwise equal to the same backend/impl/ISA on batch-first data: the kernels
//     and their summation orders are the same, only the strides that address the rows differ;
//   - each result is within the double-precision oracle's derived bound (attention_test_util.hpp), and
//     the scalar reference on batch-first data is within it too (the oracle the other tests trust).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention_test_util.hpp"

namespace {

using mha_test::Problem;

// How a [B, L, E] tensor is laid out in memory.
enum class Layout { batch_first, seq_first, seq_first_padded };

const char* layout_name(Layout l) {
    switch (l) {
        case Layout::batch_first: return "batch_first";
        case Layout::seq_first: return "seq_first";
        case Layout::seq_first_padded: return "seq_first_padded";
    }
    return "?";
}

// A NaN with a payload no computation produces: padding must still hold exactly these bits afterwards.
float sentinel() {
    const std::uint32_t bits = 0x7fc0beefu;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

bool is_sentinel(float f) {
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits == 0x7fc0beefu;
}

// A tensor [B, L, E] stored in one of the layouts, with the view that addresses it. Padded seq-first:
// each token's E features are followed by 3 unused floats and each sequence position by 5 more, so
// batch stride E + 3 and row stride B·(E + 3) + 5 (both leave gaps the kernels must skip).
struct Strided {
    std::size_t B = 0, L = 0, E = 0, row_stride = 0, batch_stride = 0;
    std::vector<float> data;

    Strided(Layout layout, std::size_t b, std::size_t l, std::size_t e) : B(b), L(l), E(e) {
        switch (layout) {
            case Layout::batch_first: row_stride = E, batch_stride = L * E; break;
            case Layout::seq_first: row_stride = B * E, batch_stride = E; break;
            case Layout::seq_first_padded: batch_stride = E + 3, row_stride = B * (E + 3) + 5; break;
        }
        const std::size_t span = std::max((L - 1) * row_stride + (B - 1) * batch_stride + E, L * row_stride);
        data.assign(span, sentinel());
    }
    std::size_t at(std::size_t b, std::size_t i, std::size_t j) const { return b * batch_stride + i * row_stride + j; }
    mha::ConstBatch cview() const { return mha::ConstBatch(data.data(), B, L, E, row_stride, batch_stride); }
    mha::Batch view() { return mha::Batch(data.data(), B, L, E, row_stride, batch_stride); }

    // Copies of batch-first [B, L, E] data in and out.
    void fill_from(const std::vector<float>& bf) {
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < E; ++j) data[at(b, i, j)] = bf[(b * L + i) * E + j];
    }
    std::vector<float> to_batch_first() const {
        std::vector<float> bf(B * L * E);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < E; ++j) bf[(b * L + i) * E + j] = data[at(b, i, j)];
        return bf;
    }
    // Elements that no (b, i, j) addresses: still the sentinel, bit for bit.
    std::size_t padding_written() const {
        std::vector<bool> used(data.size(), false);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < E; ++j) used[at(b, i, j)] = true;
        std::size_t n = 0;
        for (std::size_t k = 0; k < data.size(); ++k) n += !used[k] && !is_sentinel(data[k]);
        return n;
    }
};

struct Case {
    std::size_t B, Lq, Lk, E, H;
    bool cross = false;
    bool causal = false;
    bool key_padding = false;   // boolean [B, Lk]
    int attn_mask_rank = 0;     // 0: none; 2: float [Lq, Lk]; 3: bool [B·H, Lq, Lk]
    bool need_weights = false;  // averaged weights too ([B, Lq, Lk], the same in every layout)
    bool norm = false;          // post-norm block: its residual is the query, read through the query's view
};

std::string describe(const Case& c) {
    return "B=" + std::to_string(c.B) + " Lq=" + std::to_string(c.Lq) + " Lk=" + std::to_string(c.Lk) +
           " E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) + (c.cross ? " cross" : " self") +
           (c.causal ? " causal" : "") + (c.key_padding ? " key_padding" : "") +
           (c.attn_mask_rank ? " attn_mask" + std::to_string(c.attn_mask_rank) + "d" : "") +
           (c.need_weights ? " need_weights" : "") + (c.norm ? " norm" : "");
}

Problem make_problem(const Case& c, std::uint32_t seed) {
    Problem p = mha_test::random_problem(c.E, c.H, c.B, c.Lq, c.Lk, c.cross, seed);
    p.causal = c.causal;
    if (c.norm) {
        p.norm_eps = 1e-5f;
        p.norm_w = mha_test::random_floats(c.E, 0.5f, 1.5f, seed + 14);
        p.norm_b = mha_test::random_floats(c.E, -0.5f, 0.5f, seed + 15);
    }
    // Low densities, and key 0 always open: no query row is fully masked (whose bias-only output would
    // make a layout mix-up invisible).
    if (c.key_padding) {
        p.key_padding_mask = mha_test::random_bool_mask({c.B, p.Lk}, 0.25, seed + 11);
        for (std::size_t b = 0; b < c.B; ++b) p.key_padding_mask.bools[b * p.Lk] = 0;
    }
    if (c.attn_mask_rank == 2) p.attn_mask = mha_test::random_float_mask({c.Lq, p.Lk}, 0.0, seed + 12);
    if (c.attn_mask_rank == 3) {
        p.attn_mask = mha_test::random_bool_mask({c.B * c.H, c.Lq, p.Lk}, 0.2, seed + 13);
        for (std::size_t r = 0; r < c.B * c.H * c.Lq; ++r) p.attn_mask.bools[r * p.Lk] = 0;
    }
    return p;
}

struct Run {
    mha::Backend backend;
    mha::Impl impl;
};

struct Outcome {
    std::vector<float> output;   // batch-first [B, Lq, E], whatever layout it was written in
    std::vector<float> weights;  // [B, Lq, Lk] or empty
    std::size_t padding_written = 0;
};

// One forward pass with query/key/value in `in_layout` (the key/value in `kv_layout`) and the output
// in `out_layout`. Self-attention passes key and value as null views (so the library sees one input).
Outcome forward(const mha::MultiheadAttention& m, const Problem& p, const Case& c, Run run, Layout in_layout,
                Layout kv_layout, Layout out_layout) {
    Strided q(in_layout, p.B, p.Lq, p.E), k(kv_layout, p.B, p.Lk, p.E), v(kv_layout, p.B, p.Lk, p.E);
    Strided out(out_layout, p.B, p.Lq, p.E);
    q.fill_from(p.query);
    mha::AttentionInputs in;
    in.query = q.cview();
    if (!p.key.empty()) {
        k.fill_from(p.key);
        v.fill_from(p.value);
        in.key = k.cview();
        in.value = v.cview();
    }
    in.key_padding_mask = p.key_padding_mask.view();
    in.attn_mask = p.attn_mask.view();
    Outcome r;
    if (c.need_weights) r.weights.assign(p.B * p.Lq * p.Lk, std::numeric_limits<float>::quiet_NaN());
    mha::ForwardOptions opt;
    opt.backend = run.backend;
    opt.impl = run.impl;
    opt.causal = p.causal;
    opt.need_weights = c.need_weights ? mha::NeedWeights::averaged : mha::NeedWeights::none;
    opt.norm_eps = p.norm_eps;
    m.forward(in, {out.view(), c.need_weights ? r.weights.data() : nullptr}, opt);
    r.output = out.to_batch_first();
    r.padding_written = out.padding_written();
    return r;
}

// Bitwise equality that reports the first differing element (EXPECT_EQ on vectors prints them all).
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << what << "[" << i << "]: " << got[i] << " vs batch-first " << want[i];
}

// Every layout combination for one case: input layouts × output layouts (and, for cross-attention,
// a query in one layout with key/value in the other).
void check_case(const Case& c, std::uint32_t seed) {
    SCOPED_TRACE(describe(c));
    const Problem p = make_problem(c, seed);
    const mha::MultiheadAttention m(p.weights(), p.E, p.H);
    const mha_test::Expected ex = mha_test::attention_double(p);
    // The worst-case bound is about 1e-4 of the largest output at these sizes; a rows mix-up from a wrong
    // stride gives errors of the order of the outputs, so a bound below 1e-3 of them still tells (the
    // limit test_reference_attention.cpp and test_adversarial.cpp use).
    ASSERT_LT(mha_test::relative_tolerance(ex.output, ex.output_tol), 1e-3) << "bound too loose to mean anything";

    struct Combo {
        Layout in, kv, out;
    };
    std::vector<Combo> combos;
    for (Layout in : {Layout::batch_first, Layout::seq_first, Layout::seq_first_padded})
        for (Layout out : {Layout::batch_first, Layout::seq_first, Layout::seq_first_padded})
            if (!(in == Layout::batch_first && out == Layout::batch_first)) combos.push_back({in, in, out});
    if (c.cross) {
        combos.push_back({Layout::seq_first, Layout::batch_first, Layout::seq_first});
        combos.push_back({Layout::batch_first, Layout::seq_first, Layout::batch_first});
    }

    const auto check_run = [&](Run run) {
        SCOPED_TRACE(run.backend == mha::Backend::scalar        ? "scalar"
                     : run.impl == mha::Impl::fused              ? "simd fused"
                                                                 : "simd materialized");
        const Outcome base = forward(m, p, c, run, Layout::batch_first, Layout::batch_first, Layout::batch_first);
        mha_test::expect_within(base.output, ex.output, ex.output_tol, "batch-first output");
        if (c.need_weights) mha_test::expect_within(base.weights, ex.averaged, ex.averaged_tol, "batch-first weights");
        for (const Combo& combo : combos) {
            SCOPED_TRACE(std::string("query ") + layout_name(combo.in) + ", key/value " + layout_name(combo.kv) +
                         ", output " + layout_name(combo.out));
            const Outcome got = forward(m, p, c, run, combo.in, combo.kv, combo.out);
            EXPECT_EQ(got.padding_written, 0u) << "output padding written";
            expect_bitwise(got.output, base.output, "output");
            if (c.need_weights) expect_bitwise(got.weights, base.weights, "attn_weights");
            mha_test::expect_within(got.output, ex.output, ex.output_tol, "output");
        }
    };

    check_run({mha::Backend::scalar, mha::Impl::automatic});  // the reference: no ISA, always materialized
    mha_test::for_each_cpu_isa([&] {
        check_run({mha::Backend::simd, mha::Impl::materialized});
        check_run({mha::Backend::simd, mha::Impl::fused});
    });
}

TEST(SeqFirst, SelfAttention) {
    check_case({2, 7, 7, 32, 4}, 101);
    check_case({3, 1, 1, 16, 2}, 102);  // one position: [1, B, E] is also a valid batch-first layout
    check_case({1, 9, 9, 16, 1}, 103);  // one batch: [L, 1, E] and [1, L, E] are the same memory
}

TEST(SeqFirst, CrossAttention) {
    Case c{3, 5, 11, 32, 4};
    c.cross = true;
    check_case(c, 201);
    c.Lq = 13, c.Lk = 4;
    check_case(c, 202);
}

TEST(SeqFirst, KeyPaddingMask) {
    Case c{3, 6, 6, 32, 2};
    c.key_padding = true;
    check_case(c, 301);
    c.cross = true, c.Lk = 9;
    check_case(c, 302);
}

TEST(SeqFirst, AttnMasks) {
    for (int rank : {2, 3}) {
        Case c{2, 6, 8, 16, 2};
        c.cross = true;
        c.attn_mask_rank = rank;
        check_case(c, 400 + rank);
    }
}

TEST(SeqFirst, CausalWithMasksAndWeights) {
    Case c{2, 8, 8, 32, 4};
    c.causal = true;
    c.key_padding = true;
    c.attn_mask_rank = 3;
    c.need_weights = true;  // Impl::fused falls back to materialized for weights; still compared bitwise
    check_case(c, 501);
    c.cross = true, c.Lk = 12;
    check_case(c, 502);
}

TEST(SeqFirst, PostNorm) {
    Case c{3, 6, 6, 32, 4};
    c.norm = true;
    check_case(c, 701);
    c.cross = true, c.Lk = 10, c.key_padding = true;
    check_case(c, 702);
}

// Longer than the fused path's key tile (256) and query block (128): the tile loop and the packing of
// K/V panels see seq-first strides across several tiles.
TEST(SeqFirst, AcrossFusedTiles) {
    Case c{2, 130, 300, 16, 2};
    c.cross = true;
    c.key_padding = true;
    c.causal = true;
    check_case(c, 601);
}

}  // namespace
