// The library's side of mha::PagedKVCache: a pool as KVRows (blocked: kv_rows.hpp), and a step's block
// reservation, planned without changing the cache, then committed once the step succeeded:
//   compose_step: what the step is (ids, q_i, key lengths), validated against the cache; the same for every
//     cache holding those sequences at those lengths (the caches of a model's layers; mha::StepPlan keeps it);
//   reserve_step: for one cache, each sequence's blocks (new blocks for rows past its last block; a copy of
//     its last block when that block is shared with a fork and the step writes into it, except for the longest
//     holder when every holder writes: it keeps the block) and its dense block
//     table; mha::invalid_argument naming blocks needed and free when the pool lacks them;
//   prepare_step: grows the tables' capacity, copies the shared blocks' rows into their private copies (free
//     blocks: nothing visible);
//   commit_step: the tables, lengths, reference counts and free list.
// Writes of the new rows go to blocks the step owns alone (new, copied, or an unshared last block past the
// sequence's length) or, for the keeper of a shared block, past every other holder's length: so a failure
// before the commit leaves every row any sequence reads as it was.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mha/paged_kv_cache.hpp"
#include "kv_rows.hpp"

namespace mha::detail {

// A pool's element type, scales, sizes (non-zero; a block size of 16–256; at most 2^32 - 1 blocks) and byte count
// checked, messages starting with `what`; returns the bytes of its keys (as of its values). Both levels use it.
std::size_t check_pool_layout(const std::string& what, DataType element, float k_scale, float v_scale, std::size_t num_blocks,
                              std::size_t block_size, std::size_t kv_heads, std::size_t head_dim);
// A caller's pool (level 2) checked: pointers, element type and scales, non-zero sizes, a block size of 16–256,
// extents that fit, keys and values apart. Returns the bytes of each array.
std::size_t check_caller_pool(const PagedKVPool& pool);
// Whether `floats` floats at data touch the pool's keys or values (`bytes` each, as check_caller_pool gave).
bool overlaps_pool(const PagedKVPool& pool, std::size_t bytes, const float* data, std::size_t floats);

// A pool's K or V rows; block_table / table_stride set per use.
KVRows pool_rows(const PagedKVPool& pool, bool values, const std::uint32_t* tables, std::size_t table_stride) noexcept;

struct StepComposition {
    std::size_t sequences = 0, table_stride = 0, block_size = 0;
    DataType element = DataType::f32;  // the pool's (the decode path's split)
    std::vector<std::size_t> ids, query_starts, key_lengths;  // [n], [n + 1], [n]: key lengths after the step
};

struct StepReservation {
    const StepComposition* step = nullptr;  // what it reserves for (outlives the reservation)
    std::vector<std::uint32_t> tables;      // [n, table_stride]
    std::vector<std::pair<std::uint32_t, std::uint32_t>> copies;  // (shared block, its private copy)
    std::size_t blocks_taken = 0;                               // from the top of the free stack
};

struct PagedKVCacheAccess {
    // Validates ids (live, distinct) and q_lens (>= 1). Changes nothing.
    static StepComposition compose_step(const PagedKVCache& c, const std::size_t* ids, const std::size_t* q_lens, std::size_t n);
    // Checks that c has s's block size and holds each of its sequences at its length before the step, then
    // reserves (a pool short of blocks: mha::invalid_argument). Changes nothing.
    static StepReservation reserve_step(const PagedKVCache& c, const StepComposition& s);
    static void prepare_step(PagedKVCache& c, const StepReservation& r);  // std::bad_alloc: nothing changed
    static void commit_step(PagedKVCache& c, const StepReservation& r) noexcept;
    static KVRows keys(const PagedKVCache& c, const StepReservation& r) noexcept {
        return pool_rows(c.pool_, false, r.tables.data(), r.step->table_stride);
    }
    static KVRows values(const PagedKVCache& c, const StepReservation& r) noexcept {
        return pool_rows(c.pool_, true, r.tables.data(), r.step->table_stride);
    }
};

}  // namespace mha::detail
