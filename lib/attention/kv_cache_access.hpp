// The library's side of mha::KVCache: its K and V storage as KVRows (kv_rows.hpp, the one place that knows
// where a row lives), and the lengths a forward sets after a successful append. Not for users; tests use it
// to plant adversarial values in the storage.
#pragma once
#include <cstddef>

#include "mha/kv_cache.hpp"
#include "kv_rows.hpp"

namespace mha::detail {

// The rows KVCache::append and PagedKVCache::append take: k and v [1, kv_heads, n, d], the same n
// (mha::invalid_argument naming the argument otherwise).
void check_appended_rows(const ConstHeads& k, const ConstHeads& v, std::size_t kv_heads, std::size_t head_dim);
// fp8 caches: k_scale and v_scale positive and at most FLT_MAX / the format's largest value (so that every
// read-back value is finite); the other types: both 1 (mha::invalid_argument naming `what` and the scale
// otherwise).
void check_kv_scales(const char* what, DataType element, float k_scale, float v_scale);

struct KVCacheAccess {
    // The contiguous cache [B, Hkv, capacity, d]: one unblocked run per (sequence, KV head).
    static KVRows rows(const KVCache& c, bool values) noexcept {
        KVRows r;
        r.base = values ? c.values_ : c.keys_;
        r.format = &element_format(c.element_);
        r.dim = c.head_dim_;
        r.scale = values ? c.v_scale_ : c.k_scale_;
        r.row_stride = r.format->row_elements(c.head_dim_);
        r.head_stride = c.capacity_ * r.row_stride;
        r.batch_stride = c.kv_heads_ * r.head_stride;
        return r;
    }
    static KVRows keys(const KVCache& c) noexcept { return rows(c, false); }
    static KVRows values(const KVCache& c) noexcept { return rows(c, true); }
    // Unchecked: n <= capacity (the forward validated it).
    static void set_length(KVCache& c, std::size_t b, std::size_t n) noexcept { c.lengths_[b] = n; }
    // The typed views of KVCache::keys_as / values_as (kv_cache.cpp).
    template <class T>
    static HeadsView<const T> typed(const KVCache& c, bool values);
    // Mutable storage: fp32 rows of an f32 cache (mha::invalid_argument otherwise), or raw bytes of any type.
    static float* key_data(KVCache& c);
    static float* value_data(KVCache& c);
    static void* key_storage(KVCache& c) noexcept { return c.keys_; }
    static void* value_storage(KVCache& c) noexcept { return c.values_; }
};

}  // namespace mha::detail
