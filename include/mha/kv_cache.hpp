// A key/value cache for incremental decoding (design.md §5): the projected and rotated K and V of B
// sequences, Hkv heads of head dim d, up to `capacity` tokens each. Each sequence has its own length
// (a ragged batch: requests of different lengths decode together).
//
// Layout (what the decode kernel reads): keys and values are two arrays [B, Hkv, capacity, d], row-major
// and contiguous, 64-byte aligned: the cached rows of one (sequence, KV head) are consecutive, so a decode
// step streams them in order. Rows at or past a sequence's length hold stale data and are never read.
// Appending n tokens writes n rows per head: O(new tokens).
//
// MultiheadAttention::forward with a cache (mha/attention.hpp) projects only the new tokens, rotates them at
// positions length(b) + i, appends them and attends over length(b) + Lq keys, bottom-right aligned.
// A cache is not synchronized: one call at a time may use it.
#pragma once
#include <cstddef>
#include <vector>

#include "mha/sdpa.hpp"
#include "mha/view.hpp"

namespace mha {

class KVCache {
public:
    KVCache() noexcept = default;  // empty: batch 0
    // Allocates 2·B·Hkv·capacity·d floats (std::bad_alloc may propagate); every length 0. Throws
    // mha::invalid_argument if a dimension is 0 or the size overflows.
    KVCache(std::size_t batch, std::size_t kv_heads, std::size_t head_dim, std::size_t capacity);
    ~KVCache();
    KVCache(KVCache&& other) noexcept;
    KVCache& operator=(KVCache&& other) noexcept;
    KVCache(const KVCache&) = delete;
    KVCache& operator=(const KVCache&) = delete;

    std::size_t batch() const noexcept { return batch_; }
    std::size_t kv_heads() const noexcept { return kv_heads_; }
    std::size_t head_dim() const noexcept { return head_dim_; }
    std::size_t capacity() const noexcept { return capacity_; }
    std::size_t bytes() const noexcept { return 2 * batch_ * kv_heads_ * capacity_ * head_dim_ * sizeof(float); }

    // Tokens cached for sequence b (mha::invalid_argument if b >= batch()).
    std::size_t length(std::size_t b) const;
    const std::vector<std::size_t>& lengths() const noexcept { return lengths_; }
    // Forget sequence b (length 0). Its rows are not cleared.
    void reset(std::size_t b);
    // Keep the first n tokens of sequence b (n <= length(b)): rejects a speculative draft.
    void truncate(std::size_t b, std::size_t n);

    // The cached K / V of all sequences [B, Hkv, capacity, d] (rows >= length(b) are stale).
    ConstHeads keys() const noexcept { return {keys_, batch_, kv_heads_, capacity_, head_dim_, head_stride() * kv_heads_, head_stride(), head_dim_}; }
    ConstHeads values() const noexcept { return {values_, batch_, kv_heads_, capacity_, head_dim_, head_stride() * kv_heads_, head_stride(), head_dim_}; }
    // Sequence b's first length(b) K / V rows of KV head h, [length(b), d].
    ConstMatrix keys(std::size_t b, std::size_t h) const;
    ConstMatrix values(std::size_t b, std::size_t h) const;

    // Writes n = k.rows tokens of already projected and rotated K and V ([1, Hkv, n, d] each: k.batch and
    // v.batch must be 1) after sequence b's length(b) tokens and advances its length (Hugging Face's
    // past_key_values, loaded into a cache). mha::invalid_argument past the capacity, nothing written.
    void append(std::size_t b, const ConstHeads& k, const ConstHeads& v);

    // Internal (the forward that appends): mutable rows, and the length set after a successful append.
    float* key_data() noexcept { return keys_; }
    float* value_data() noexcept { return values_; }
    void set_length(std::size_t b, std::size_t n) noexcept { lengths_[b] = n; }

private:
    std::size_t head_stride() const noexcept { return capacity_ * head_dim_; }
    void check_sequence(std::size_t b) const;
    std::size_t batch_ = 0, kv_heads_ = 0, head_dim_ = 0, capacity_ = 0;
    float* keys_ = nullptr;
    float* values_ = nullptr;
    std::vector<std::size_t> lengths_;
};

}  // namespace mha
