// A key/value cache for incremental decoding (design.md §5): the projected and rotated K and V of B
// sequences, Hkv heads of head dim d, up to `capacity` tokens each. Each sequence has its own length
// (a ragged batch: requests of different lengths decode together).
//
// Element type (DataType, mha/half.hpp and mha/quantized.hpp): f32 (default), bf16, f16, int8 (blocks of 32
// values with a float16 scale each, stored in the row), fp8_e4m3 or fp8_e5m2 (with a per-tensor scale for K and
// for V: k_scale, v_scale, as vLLM's). K and V are stored in it; append and the forward round the fp32 rows
// they are given to it (round to nearest, ties to even; quantized.hpp says how the 8-bit types quantize), and
// attention then uses the stored values for every key, old and new, read back exactly as copy_keys /
// copy_values give them. A decode step reads half the bytes with bf16 / f16, about a quarter with the 8-bit
// types (an int8 row of d = 128 is 136 bytes).
//
// Layout (what the decode kernel reads): keys and values are two arrays [B, Hkv, capacity, row] of the element
// type, row-major and contiguous, 64-byte aligned, where a row is d elements (int8: d values then their
// ceil(d / 32) float16 scales, kv_row_bytes(int8, d) bytes): the cached rows of one (sequence, KV head) are
// consecutive, so a decode step streams them in order. Rows at or past a sequence's length hold stale data and are never read.
// Appending n tokens writes n rows per head: O(new tokens).
//
// MultiheadAttention::forward with a cache (mha/attention.hpp) projects only the new tokens, rotates them at
// positions length(b) + i, appends them and attends over length(b) + Lq keys, bottom-right aligned.
// A cache is not synchronized: one call at a time may use it.
#pragma once
#include <cstddef>
#include <vector>

#include "mha/half.hpp"
#include "mha/quantized.hpp"
#include "mha/sdpa.hpp"
#include "mha/view.hpp"

namespace mha {
namespace detail {
struct KVCacheAccess;  // lib/attention/kv_cache_access.hpp
}

class KVCache {
public:
    KVCache() noexcept = default;  // empty: batch 0
    // Allocates 2·B·Hkv·capacity rows of `element` (std::bad_alloc may propagate); every length 0. k_scale and
    // v_scale: the fp8 types' per-tensor scales (a stored key is fp8(k / k_scale), read back as fp8·k_scale),
    // positive and at most FLT_MAX / the format's largest value (448 for e4m3, 57344 for e5m2: every read-back
    // value finite); the other types take only 1.
    // Throws mha::invalid_argument if a dimension is 0, the size overflows, `element` is not a DataType, or a
    // scale is not as above.
    KVCache(std::size_t batch, std::size_t kv_heads, std::size_t head_dim, std::size_t capacity,
            DataType element = DataType::f32, float k_scale = 1.0f, float v_scale = 1.0f);
    ~KVCache();
    KVCache(KVCache&& other) noexcept;
    KVCache& operator=(KVCache&& other) noexcept;
    KVCache(const KVCache&) = delete;
    KVCache& operator=(const KVCache&) = delete;

    std::size_t batch() const noexcept { return batch_; }
    std::size_t kv_heads() const noexcept { return kv_heads_; }
    std::size_t head_dim() const noexcept { return head_dim_; }
    std::size_t capacity() const noexcept { return capacity_; }
    DataType element_type() const noexcept { return element_; }
    float k_scale() const noexcept { return k_scale_; }
    float v_scale() const noexcept { return v_scale_; }
    // K and V storage: 2·B·Hkv·capacity rows of kv_row_bytes(element_type(), d) bytes.
    std::size_t bytes() const noexcept { return 2 * batch_ * kv_heads_ * capacity_ * kv_row_bytes(element_, head_dim_); }

    // Tokens cached for sequence b (mha::invalid_argument if b >= batch()).
    std::size_t length(std::size_t b) const;
    const std::vector<std::size_t>& lengths() const noexcept { return lengths_; }
    // Forget sequence b (length 0). Its rows are not cleared.
    void reset(std::size_t b);
    // Keep the first n tokens of sequence b (n <= length(b)): rejects a speculative draft.
    void truncate(std::size_t b, std::size_t n);

    // fp32 views, for f32 caches only: they throw mha::invalid_argument on a bf16 / f16 cache (whose 16-bit
    // data must not be read as floats; use the element-typed views or copy_keys / copy_values below).
    // The cached K / V of all sequences [B, Hkv, capacity, d] (rows >= length(b) are stale).
    ConstHeads keys() const;
    ConstHeads values() const;
    // Sequence b's first length(b) K / V rows of KV head h, [length(b), d].
    ConstMatrix keys(std::size_t b, std::size_t h) const;
    ConstMatrix values(std::size_t b, std::size_t h) const;

    // Any element type: the raw storage of K / V, [B, Hkv, capacity, row] of element_type(), row-major.
    const void* key_storage() const noexcept { return keys_; }
    const void* value_storage() const noexcept { return values_; }
    // Element-typed views [B, Hkv, capacity, d] (strides in elements; an int8 row's stride covers its scales):
    // T is float, bfloat16, float16, qint8, fp8_e4m3 or fp8_e5m2 and must match element_type() (else
    // mha::invalid_argument).
    template <class T>
    HeadsView<const T> keys_as() const;
    template <class T>
    HeadsView<const T> values_as() const;
    // Sequence b's first length(b) K / V rows of KV head h widened to float (exactly) into dst, which must be
    // [length(b), d] with stride >= d (mha::invalid_argument otherwise, nothing written). Any element type.
    void copy_keys(std::size_t b, std::size_t h, Matrix dst) const;
    void copy_values(std::size_t b, std::size_t h, Matrix dst) const;

    // Writes n = k.rows tokens of already projected and rotated K and V ([1, Hkv, n, d] each: k.batch and
    // v.batch must be 1) after sequence b's length(b) tokens and advances its length (Hugging Face's
    // past_key_values, loaded into a cache), rounded to the element type (RNE). mha::invalid_argument past the
    // capacity, nothing written.
    void append(std::size_t b, const ConstHeads& k, const ConstHeads& v);

private:
    friend struct detail::KVCacheAccess;  // the library's forward: the rows as KVRows, lengths after an append
    void check_sequence(std::size_t b) const;
    void check_element(DataType t, const char* what) const;
    void copy_rows(bool values, std::size_t b, std::size_t h, Matrix dst, const char* what) const;
    std::size_t batch_ = 0, kv_heads_ = 0, head_dim_ = 0, capacity_ = 0;
    DataType element_ = DataType::f32;
    float k_scale_ = 1.0f, v_scale_ = 1.0f;
    void* keys_ = nullptr;
    void* values_ = nullptr;
    std::vector<std::size_t> lengths_;
};

}  // namespace mha
