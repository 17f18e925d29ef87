// A paged KV cache for serving (vLLM's layout): K and V of many sequences in a shared pool of fixed-size
// blocks, and the attention and writes an engine needs over such a pool, in two levels.
//
// Pool layout: keys and values are two arrays [num_blocks, Hkv, block_size, row] of the element type (any of
// mha::KVCache's: f32, bf16, f16, int8, fp8_e4m3, fp8_e5m2, rounded on write as there; a row is d elements, an
// int8 row d values then their float16 scales; fp8 with the pool's k_scale / v_scale). Token j of a sequence lives in block
// block_table[j / block_size], row j % block_size. block_size is 16, 32, 64, 128 or 256; the decode kernels
// read a block's rows as one run and read ahead into the next block by software prefetch, so the block size
// matters little, and larger blocks are still a little faster: on one Zen 5 core the attention core of 16
// decodes around 2048 keys (f32) read 19, 23.5 and 25 GB/s at blocks of 16, 64 and 256, and a whole decode
// layer step (16 × 2048) was within -8 % .. +5 % of the contiguous cache at all three (issue 22 notes); on one
// AVX2 core (read_bw 13.4 GB/s) the same core reads 11.1 GB/s at blocks of 64 and the layer step is within
// +4 % of the contiguous cache at 16, 64 and 256 (tools/step_figures.sh, stop 36).
//
// Level 2 (an engine that owns its block allocator): paged_write_kv writes new rows at given slots and
// paged_attention attends over the caller's pool given per-sequence block tables, key lengths and query
// offsets. The library never allocates or frees the caller's blocks.
// Level 1 (mha::PagedKVCache): the library owns the pool and the block tables: sequences are added, grown by
// appending, truncated, forked (copy-on-write: a write into a shared block copies it, unless every holder writes
// it in that step: then the longest keeps it) and freed.
// MultiheadAttention::forward_step (mha/attention.hpp) runs one serving step over it.
//
// Semantics of a step: sequence i has q_i >= 1 new tokens, the last q_i of its key_length_i keys; they are
// packed one sequence after another ([T, ·], T = Σ q_i) and attend causally, bottom-right aligned, over
// their own sequence's keys.
// Batch invariance: a sequence's output rows are bitwise identical whether it runs alone or with any other
// sequences, in any order, with any thread count, and whether its keys sit in this pool (any block size) or
// in a contiguous mha::KVCache of batch 1 (forward with the same q_i new tokens; in a ragged batch of several
// sequences the contiguous path blocks work across them). What depends on a sequence is only its own q_i and
// key length. Chunk invariance (one call vs chunks vs token by token) holds within the float bound of
// tests/test_kv_cache.cpp with fp32 compute, not bitwise; with bf16 compute within bf16's error bound (the
// one-call and chunked paths round P at different points, docs/bf16-accuracy.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mha/half.hpp"
#include "mha/quantized.hpp"
#include "mha/sdpa.hpp"
#include "mha/view.hpp"

namespace mha {
namespace detail {
struct PagedKVCacheAccess;  // lib/attention/paged_kv_cache_access.hpp
}

// A caller's pool (level 2): keys and values [num_blocks, kv_heads, block_size, row] of `element`, a row being
// kv_row_bytes(element, head_dim) bytes (mha/quantized.hpp), in two arrays that do not overlap; block_size 16,
// 32, 64, 128 or 256. k_scale / v_scale: fp8's tensor scales (1 otherwise).
struct PagedKVPool {
    void* keys = nullptr;
    void* values = nullptr;
    DataType element = DataType::f32;
    std::size_t num_blocks = 0, block_size = 0, kv_heads = 0, head_dim = 0;
    float k_scale = 1.0f, v_scale = 1.0f;
};

// The sequences of one step over a pool (level 2), vLLM's attention metadata.
struct PagedSequences {
    std::size_t count = 0;                       // n sequences
    const std::uint32_t* block_tables = nullptr;  // [n, table_stride]: block ids (< num_blocks) of each sequence
    std::size_t table_stride = 0;                 // >= ceil(key_lengths[i] / block_size) for every i
    const std::size_t* key_lengths = nullptr;     // [n]: keys of each sequence, this step's tokens included
    const std::size_t* query_starts = nullptr;    // [n + 1]: query_start_loc, 0 = q_0 < ... ; q_i = diff >= 1
};

struct PagedAttentionOptions {
    float scale = 0.0f;  // 0: 1/√d
    int threads = 0;     // 0: all cores
    // Sliding window, softcap, sinks [H], ALiBi slopes [H] (mha/attention.hpp); sequence i's query row t is at
    // position key_lengths[i] − q_i + t.
    ScoreModifiers modifiers;
};

// Writes rows t < k.rows of k and v ([T, kv_heads·head_dim] fp32, head h at columns [h·d, h·d + d)) into the
// pool at slots[t] = block·block_size + row, rounded to the element type. slots[t] = -1 is a padding token (vLLM's
// PAD_SLOT_ID): its row is not written. The other slots must be < num_blocks·block_size and distinct, and k and v
// must not overlap the pool (mha::invalid_argument otherwise, nothing written).
void paged_write_kv(const PagedKVPool& pool, const ConstMatrix& k, const ConstMatrix& v, const std::int64_t* slots);

// out [T, H·d] = attention of q [T, H·d] (T = query_starts[n]; H a multiple of kv_heads) over each sequence's
// keys in the pool: rows [query_starts[i], query_starts[i + 1]) are sequence i's last q_i positions, causal
// bottom-right. out must not overlap q or the pool. Validates everything first (mha::invalid_argument, nothing
// written).
void paged_attention(const ConstMatrix& q, const PagedKVPool& pool, const PagedSequences& seqs, const Matrix& out,
                     const PagedAttentionOptions& options = {});

// Level 1: a managed pool. Sequence ids are small integers, reused after free_sequence. Memory in use is the
// blocks holding tokens (plus the fixed pool, allocated once). Not synchronized: one call at a time.
class PagedKVCache {
public:
    // Allocates the pool (std::bad_alloc may propagate). mha::invalid_argument for a zero dimension, a block
    // size other than 16, 32, 64, 128 or 256, an element type that is not a KVCache type, or scales that are not
    // as KVCache's (fp8: positive, at most FLT_MAX / 448 for e4m3 and FLT_MAX / 57344 for e5m2; the others: 1).
    PagedKVCache(std::size_t num_blocks, std::size_t block_size, std::size_t kv_heads, std::size_t head_dim,
                 DataType element = DataType::f32, float k_scale = 1.0f, float v_scale = 1.0f);
    ~PagedKVCache();
    PagedKVCache(PagedKVCache&& other) noexcept;
    PagedKVCache& operator=(PagedKVCache&& other) noexcept;
    PagedKVCache(const PagedKVCache&) = delete;
    PagedKVCache& operator=(const PagedKVCache&) = delete;

    std::size_t num_blocks() const noexcept { return pool_.num_blocks; }
    std::size_t block_size() const noexcept { return pool_.block_size; }
    std::size_t kv_heads() const noexcept { return pool_.kv_heads; }
    std::size_t head_dim() const noexcept { return pool_.head_dim; }
    DataType element_type() const noexcept { return pool_.element; }
    float k_scale() const noexcept { return pool_.k_scale; }
    float v_scale() const noexcept { return pool_.v_scale; }
    std::size_t free_blocks() const noexcept { return free_.size(); }
    std::size_t used_blocks() const noexcept { return pool_.num_blocks - free_.size(); }
    // The pool as a level-2 view (its storage; the block tables are this object's).
    const PagedKVPool& pool() const noexcept { return pool_; }

    // A new empty sequence (no block until its first token).
    std::size_t add_sequence();
    // A new sequence sharing all of s's blocks and its length (no copy until one of them writes a shared block).
    // A step in which every holder of a shared partial block writes into it makes one copy fewer than holders
    // (the longest keeps the block), so blocks needed = new blocks + those copies.
    std::size_t fork(std::size_t s);
    std::size_t length(std::size_t s) const;
    // Block ids of s's first ceil(length / block_size) blocks.
    const std::vector<std::uint32_t>& block_table(std::size_t s) const;
    // Keep s's first n <= length(s) tokens (n >= released_tokens(s) unless n = 0); blocks past them return to the pool
    // (when no fork still holds them).
    void truncate(std::size_t s, std::size_t n);
    // Forget s: its blocks return to the pool (when not shared), its id may be reused.
    void free_sequence(std::size_t s);
    // Appends n = k.rows tokens of projected, rotated K and V ([1, Hkv, n, d] each, as KVCache::append).
    // mha::invalid_argument when the pool lacks blocks (naming blocks needed and free), nothing changed.
    void append(std::size_t s, const ConstHeads& k, const ConstHeads& v);
    // s's K / V rows of KV head h widened to float into dst [length(s), d] (stride >= d); rows whose blocks were
    // released (release_before) read as NaN.
    void copy_keys(std::size_t s, std::size_t h, Matrix dst) const;
    void copy_values(std::size_t s, std::size_t h, Matrix dst) const;
    // Sliding-window layers (ScoreModifiers::window_left = w): a query at position p sees no key before p − w, and
    // every future query of s sits at length(s) or later, so the blocks wholly before length(s) − w are never read
    // again. release_before(s, position) returns the blocks that lie wholly before `position` (<= length(s)) to the
    // pool (a block still held by a fork stays with it), so a long generation keeps O(w) memory (opt-in: call it after
    // each step with position = length(s) − w). Returns released_tokens(s): the leading tokens whose blocks are gone
    // (a multiple of block_size). Afterwards a forward_step whose layer could see those tokens (no window, or one
    // reaching before released_tokens(s)) is refused with nothing changed, truncate below them is refused, and
    // copy_keys / copy_values give NaN rows there.
    std::size_t release_before(std::size_t s, std::size_t position);
    std::size_t released_tokens(std::size_t s) const;

private:
    friend struct detail::PagedKVCacheAccess;
    struct Sequence {
        std::vector<std::uint32_t> blocks;  // detail::kReleasedBlock for released ones
        std::size_t length = 0;
        std::size_t released = 0;           // leading tokens whose blocks were released
        bool live = false;
    };
    void check_sequence(std::size_t s) const;
    void release(std::uint32_t block) noexcept;
    void copy_rows(bool values, std::size_t s, std::size_t h, Matrix dst) const;

    PagedKVPool pool_;
    std::size_t bytes_ = 0;
    std::vector<Sequence> seqs_;
    std::vector<std::uint32_t> refs_;  // per block: sequences holding it
    std::vector<std::uint32_t> free_;  // a stack: the next block handed out is free_.back()
};

}  // namespace mha
