// The attention core over a paged pool (paged_core.hpp): the step's groups, their scratch, and their runs.
#include "paged_core.hpp"

#include <algorithm>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace mha::detail {

PagedCoreLayout paged_core_layout(std::size_t n, const std::size_t* key_lengths, const std::size_t* query_starts,
                                  std::size_t table_stride, std::size_t H, std::size_t Hkv, std::size_t d, DataType compute,
                                  DataType kv, Carver& call, Carver& slot) {
    PagedCoreLayout l;
    // Decode groups by q (at most kDecodeMaxQueries of them): group index + 1 per q, 0 = none yet.
    std::size_t decode_group[kDecodeMaxQueries + 1] = {};
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t q = query_starts[i + 1] - query_starts[i], L = key_lengths[i];
        const CorePath path = core_path(H, Hkv, q, L, NeedWeights::none, Impl::automatic);
        if (path == CorePath::decode) {
            if (decode_group[q] == 0) {
                l.groups.emplace_back();
                l.groups.back().q = q;
                l.groups.back().path = path;
                decode_group[q] = l.groups.size();
            }
            PagedCoreGroup& g = l.groups[decode_group[q] - 1];
            g.members.push_back(i);
            g.keys = std::max(g.keys, L);
            continue;
        }
        l.groups.emplace_back();
        PagedCoreGroup& g = l.groups.back();
        g.members.push_back(i), g.q = q, g.keys = L, g.path = path;
    }
    const std::size_t call0 = call.total, slot0 = slot.total;
    std::size_t call_end = call0, slot_end = slot0;
    for (PagedCoreGroup& g : l.groups) {
        Carver c{call0}, s{slot0};
        const std::size_t k = g.members.size();
        if (g.path == CorePath::decode) {
            const std::size_t rows = scratch_mul(scratch_mul(k, g.q), H * d);
            g.gathered_q = c.take(rows);
            g.gathered_out = c.take(rows);
            g.lengths = c.take(scratch_mul(k, sizeof(std::size_t) / sizeof(float)));
            g.tables = c.take(scratch_mul(k, table_stride) + 1);  // uint32 ids: one float each
        } else if (g.path == CorePath::materialized) {  // reads fp32 heads: the sequence widened into scratch
            const std::size_t floats = scratch_mul(scratch_mul(Hkv, g.keys), d);
            g.widened_k = c.take(floats);
            g.widened_v = c.take(floats);
            g.lengths = c.take(sizeof(std::size_t) / sizeof(float));
        } else {  // grouped: widens the pool's rows as it packs them
            g.lengths = c.take(sizeof(std::size_t) / sizeof(float));
        }
        g.core = core_layout(CoreShape{k, H, Hkv, d, g.q, g.keys, compute, kv, g.path == CorePath::grouped}, g.path, NeedWeights::none,
                             c, s);
        call_end = std::max(call_end, c.total);
        slot_end = std::max(slot_end, s.total);
    }
    call.total = call_end;
    slot.total = slot_end;
    return l;
}

namespace {

void run_decode_group(const PagedCoreProblem& p, const PagedCoreGroup& g, float* base, float* slots, std::size_t slot_floats,
                      std::size_t threads) {
    const std::size_t k = g.members.size(), q = g.q, w = p.H * p.d, stride = p.keys.table_stride;
    float* gq = base + g.gathered_q;
    float* gout = base + g.gathered_out;
    auto* lengths = reinterpret_cast<std::size_t*>(base + g.lengths);
    auto* tables = reinterpret_cast<std::uint32_t*>(base + g.tables);
    for (std::size_t b = 0; b < k; ++b) {
        const std::size_t i = g.members[b], r0 = p.query_starts[i];
        for (std::size_t r = 0; r < q; ++r) std::memcpy(gq + (b * q + r) * w, p.q.row(r0 + r), w * sizeof(float));
        lengths[b] = p.key_lengths[i];
        std::memcpy(tables + b * stride, p.keys.block_table + i * stride, stride * sizeof(std::uint32_t));
    }
    CoreProblem c;
    c.q = ConstHeads(gq, k, p.H, q, p.d, q * w, p.d, w);
    c.out = Heads(gout, k, p.H, q, p.d, q * w, p.d, w);
    c.key_rows = p.keys, c.value_rows = p.values;
    c.key_rows.block_table = c.value_rows.block_table = tables;
    // decode reads key_rows / value_rows; k / v give the geometry only.
    c.k = ConstHeads(nullptr, k, p.Hkv, g.keys, p.d, 0, 0, p.d);
    c.v = c.k;
    c.key_lengths = lengths;
    c.scale = p.scale;
    c.causal = true;  // bottom-right per sequence through key_lengths
    c.compute = p.compute;
    c.mods = p.mods;
    AttentionCore(c, g.path, g.core, base, slots, slot_floats, threads).run();
    for (std::size_t b = 0; b < k; ++b) {
        const std::size_t r0 = p.query_starts[g.members[b]];
        for (std::size_t r = 0; r < q; ++r) std::memcpy(p.out.row(r0 + r), gout + (b * q + r) * w, w * sizeof(float));
    }
}

void run_single(const PagedCoreProblem& p, const PagedCoreGroup& g, float* base, float* slots, std::size_t slot_floats,
                std::size_t threads) {
    const std::size_t i = g.members[0], L = g.keys, d = p.d, Hkv = p.Hkv, r0 = p.query_starts[i];
    auto* length = reinterpret_cast<std::size_t*>(base + g.lengths);
    *length = L;
    CoreProblem c;
    c.q = ConstHeads(p.q.data + r0 * p.q.stride, 1, p.H, g.q, d, 0, d, p.q.stride);
    c.out = Heads(p.out.data + r0 * p.out.stride, 1, p.H, g.q, d, 0, d, p.out.stride);
    if (g.path == CorePath::grouped) {  // the sequence's rows in the pool, as a batch of one
        c.key_rows = p.keys, c.value_rows = p.values;
        c.key_rows.block_table = c.value_rows.block_table = p.keys.block_table + i * p.keys.table_stride;
        c.k = c.v = ConstHeads(nullptr, 1, Hkv, L, d, 0, 0, d);  // the geometry only
    } else {
        float* wk = base + g.widened_k;
        float* wv = base + g.widened_v;
        tbb::parallel_for(tbb::blocked_range<std::size_t>(0, Hkv), [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t h = r.begin(); h != r.end(); ++h) {
                p.keys.widen(i, h, 0, L, Matrix(wk + h * L * d, L, d));
                p.values.widen(i, h, 0, L, Matrix(wv + h * L * d, L, d));
            }
        });
        c.k = ConstHeads(wk, 1, Hkv, L, d, Hkv * L * d, L * d, d);
        c.v = ConstHeads(wv, 1, Hkv, L, d, Hkv * L * d, L * d, d);
    }
    c.key_lengths = length;
    c.scale = p.scale;
    c.causal = true;
    c.compute = p.compute;
    c.mods = p.mods;
    AttentionCore(c, g.path, g.core, base, slots, slot_floats, threads).run();
}

}  // namespace

void run_paged_core(const PagedCoreProblem& p, const PagedCoreLayout& layout, float* base, float* slots, std::size_t slot_floats,
                    std::size_t threads) {
    for (const PagedCoreGroup& g : layout.groups) {
        if (g.path == CorePath::decode)
            run_decode_group(p, g, base, slots, slot_floats, threads);
        else
            run_single(p, g, base, slots, slot_floats, threads);
    }
}

}  // namespace mha::detail
