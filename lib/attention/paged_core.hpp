// The attention core over a paged pool for a variable-length step (mha/paged_kv_cache.hpp): n sequences,
// sequence i's q_i query rows at rows [query_starts[i], query_starts[i + 1]) of q [T, H·d], attending causally
// (bottom-right) over its key_lengths[i] keys in the pool's blocks.
// The step is cut into groups, each one AttentionCore call (attention_core.hpp), run one after another:
//   a decode group: the sequences with the same q (decode path: q <= 16, G·q <= 128), their query rows
//     gathered into [k, q, H·d], keys read in place through their block tables, tasks per (sequence,
//     KV head, split of decode_split keys) — balanced by keys visited;
//   a single: any other sequence alone, on the path core_path chooses for (q_i, L): grouped reads its rows in the
//     blocks (widening each block of rows it packs), materialized a copy widened into [Hkv, L, d].
// Batch invariance: what a sequence's rows depend on is its own (q_i, L) and keys only: the path and the
// splits come from them, a decode task reads one sequence, the merge order is fixed, and empty splits of a
// group's longer Lk are skipped. The same bits as the contiguous cache's forward with B = 1.
// Preconditions: validated (ids, lengths, tables within the pool), the scratch laid out by paged_core_layout.
#pragma once
#include <cstddef>
#include <vector>

#include "attention_core.hpp"
#include "kv_rows.hpp"

namespace mha::detail {

struct PagedCoreProblem {
    ConstMatrix q;  // [T, H·d]
    Matrix out;     // [T, H·d]
    KVRows keys, values;  // blocked: block_table [n, table_stride]
    std::size_t sequences = 0, H = 0, Hkv = 0, d = 0;
    const std::size_t* key_lengths = nullptr;   // [n]
    const std::size_t* query_starts = nullptr;  // [n + 1]
    float scale = 1.0f;
    DataType compute = DataType::f32;
    ScoreModifiers mods;  // the layer's (mha/attention.hpp)
};

struct PagedCoreGroup {
    std::vector<std::size_t> members;  // sequence indices
    std::size_t q = 0, keys = 0;       // query rows per member, the longest key length
    CorePath path = CorePath::decode;
    CoreLayout core;
    // floats from the scratch base: decode: gathered q and out [k, q, H·d], key lengths, tables; single: its key
    // length, and for materialized K, V widened
    std::size_t gathered_q = 0, gathered_out = 0, lengths = 0, tables = 0, widened_k = 0, widened_v = 0;
};

struct PagedCoreLayout {
    std::vector<PagedCoreGroup> groups;
};

// Groups and their scratch: regions from call.total on (groups share them: they run one after another), slots
// from slot.total on; both Carvers end past the largest group.
PagedCoreLayout paged_core_layout(std::size_t n, const std::size_t* key_lengths, const std::size_t* query_starts,
                                  std::size_t table_stride, std::size_t H, std::size_t Hkv, std::size_t d, DataType compute,
                                  DataType kv, Carver& call, Carver& slot);

// Runs every group; call inside the arena the slots were sized for.
void run_paged_core(const PagedCoreProblem& p, const PagedCoreLayout& layout, float* base, float* slots, std::size_t slot_floats,
                    std::size_t threads);

}  // namespace mha::detail
