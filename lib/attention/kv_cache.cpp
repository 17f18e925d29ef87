// KVCache: storage (one aligned block: keys, then values), lengths, and the sequence operations.
#include "mha/kv_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <string>
#include <utility>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "kv_cache_access.hpp"

namespace mha {

using detail::fail;


KVCache::KVCache(std::size_t batch, std::size_t kv_heads, std::size_t head_dim, std::size_t capacity, DataType element,
                 float k_scale, float v_scale) {
    if (!detail::is_element_type(element))
        fail("KVCache element type " + std::to_string(static_cast<int>(element)) +
             " is not f32, bf16, f16, int8, fp8_e4m3 or fp8_e5m2");
    detail::check_kv_scales("KVCache", element, k_scale, v_scale);
    if (batch == 0 || kv_heads == 0 || head_dim == 0 || capacity == 0)
        fail("KVCache dimensions must be non-zero: batch " + std::to_string(batch) + ", kv_heads " + std::to_string(kv_heads) +
             ", head_dim " + std::to_string(head_dim) + ", capacity " + std::to_string(capacity));
    std::size_t n = detail::checked_madd(batch, kv_heads, 0, "KVCache", "size");
    n = detail::checked_madd(n, capacity, 0, "KVCache", "size");
    n = detail::checked_madd(n, detail::element_format(element).row_elements(head_dim), 0, "KVCache", "size");
    detail::checked_extent("KVCache", static_cast<const float*>(nullptr), detail::checked_madd(n, 2, 0, "KVCache", "size"));
    const std::size_t size = detail::element_format(element).bytes, total = 2 * n * size;
    auto* block = static_cast<unsigned char*>(detail::allocate_aligned(total));
    // 2 MB pages where the kernel allows them: the decode kernels streamed K/V 30-50 % faster from them than
    // from 4 KB pages (bench_decode --huge_pages, M <= 4, on the Zen 4 dev machine). Only a hint: blocks below
    // 1 MiB come from malloc, not page-aligned, and the call then fails harmlessly.
#ifdef MADV_HUGEPAGE
    madvise(block, total, MADV_HUGEPAGE);
#endif
    batch_ = batch, kv_heads_ = kv_heads, head_dim_ = head_dim, capacity_ = capacity, element_ = element;
    k_scale_ = k_scale, v_scale_ = v_scale;
    keys_ = block;
    values_ = block + n * size;  // a multiple of 64 bytes when d is a multiple of 32; alignment is not required
    try {
        lengths_.assign(batch, 0);
    } catch (...) {
        detail::free_aligned(block, total);
        throw;
    }
}

KVCache::~KVCache() {
    if (keys_ != nullptr) detail::free_aligned(keys_, bytes());
}

KVCache::KVCache(KVCache&& o) noexcept
    : batch_(o.batch_), kv_heads_(o.kv_heads_), head_dim_(o.head_dim_), capacity_(o.capacity_),
      element_(o.element_), k_scale_(o.k_scale_), v_scale_(o.v_scale_), keys_(o.keys_), values_(o.values_),
      lengths_(std::move(o.lengths_)) {
    o.batch_ = o.kv_heads_ = o.head_dim_ = o.capacity_ = 0;
    o.keys_ = o.values_ = nullptr;
    o.lengths_.clear();
}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
    if (this != &o) {
        KVCache tmp(std::move(o));
        std::swap(batch_, tmp.batch_);
        std::swap(kv_heads_, tmp.kv_heads_);
        std::swap(head_dim_, tmp.head_dim_);
        std::swap(capacity_, tmp.capacity_);
        std::swap(element_, tmp.element_);
        std::swap(k_scale_, tmp.k_scale_);
        std::swap(v_scale_, tmp.v_scale_);
        std::swap(keys_, tmp.keys_);
        std::swap(values_, tmp.values_);
        std::swap(lengths_, tmp.lengths_);
    }
    return *this;
}

void KVCache::check_sequence(std::size_t b) const {
    if (b >= batch_) fail("sequence " + std::to_string(b) + " is out of range: the cache holds " + std::to_string(batch_));
}

std::size_t KVCache::length(std::size_t b) const {
    check_sequence(b);
    return lengths_[b];
}

void KVCache::reset(std::size_t b) {
    check_sequence(b);
    lengths_[b] = 0;
}

void KVCache::truncate(std::size_t b, std::size_t n) {
    check_sequence(b);
    if (n > lengths_[b])
        fail("cannot truncate sequence " + std::to_string(b) + " to " + std::to_string(n) + " tokens: it holds " +
             std::to_string(lengths_[b]));
    lengths_[b] = n;
}

void KVCache::check_element(DataType t, const char* what) const {
    if (element_ != t)
        fail(std::string(what) + " needs a " + std::string(data_type_name(t)) + " KV cache, but this one holds " +
             std::string(data_type_name(element_)) + " elements (use copy_keys / copy_values, or keys_as / values_as)");
}

ConstHeads KVCache::keys() const {
    check_element(DataType::f32, "keys()");
    return detail::KVCacheAccess::keys(*this).f32_heads(batch_, kv_heads_, capacity_);
}

ConstHeads KVCache::values() const {
    check_element(DataType::f32, "values()");
    return detail::KVCacheAccess::values(*this).f32_heads(batch_, kv_heads_, capacity_);
}

template <class T>
HeadsView<const T> KVCache::keys_as() const {
    return detail::KVCacheAccess::typed<T>(*this, false);
}

template <class T>
HeadsView<const T> KVCache::values_as() const {
    return detail::KVCacheAccess::typed<T>(*this, true);
}

#define MHA_TYPED_VIEWS_(name, E)                                \
    template HeadsView<const E> KVCache::keys_as<E>() const; \
    template HeadsView<const E> KVCache::values_as<E>() const;
MHA_KV_ELEMENT_TYPES(MHA_TYPED_VIEWS_)
#undef MHA_TYPED_VIEWS_

ConstMatrix KVCache::keys(std::size_t b, std::size_t h) const {
    check_sequence(b);
    if (h >= kv_heads_) fail("KV head " + std::to_string(h) + " is out of range: the cache has " + std::to_string(kv_heads_));
    check_element(DataType::f32, "keys(b, h)");
    return detail::KVCacheAccess::keys(*this).run_view<float>(b, h, 0, lengths_[b]);
}

ConstMatrix KVCache::values(std::size_t b, std::size_t h) const {
    check_sequence(b);
    if (h >= kv_heads_) fail("KV head " + std::to_string(h) + " is out of range: the cache has " + std::to_string(kv_heads_));
    check_element(DataType::f32, "values(b, h)");
    return detail::KVCacheAccess::values(*this).run_view<float>(b, h, 0, lengths_[b]);
}

void KVCache::copy_rows(bool values, std::size_t b, std::size_t h, Matrix dst, const char* what) const {
    check_sequence(b);
    if (h >= kv_heads_) fail("KV head " + std::to_string(h) + " is out of range: the cache has " + std::to_string(kv_heads_));
    if (dst.rows != lengths_[b] || dst.cols != head_dim_ || dst.stride < dst.cols || (dst.data == nullptr && dst.rows != 0))
        fail(std::string(what) + ": dst is " + detail::shape_str(dst.rows, dst.cols) + " with stride " + std::to_string(dst.stride) +
             " but must be [length(b), d] = " + detail::shape_str(lengths_[b], head_dim_) + " with stride >= d");
    detail::KVCacheAccess::rows(*this, values).widen(b, h, 0, dst.rows, dst);
}

void KVCache::copy_keys(std::size_t b, std::size_t h, Matrix dst) const { copy_rows(false, b, h, dst, "copy_keys"); }
void KVCache::copy_values(std::size_t b, std::size_t h, Matrix dst) const { copy_rows(true, b, h, dst, "copy_values"); }

void KVCache::append(std::size_t b, const ConstHeads& k, const ConstHeads& v) {
    check_sequence(b);
    detail::check_appended_rows(k, v, kv_heads_, head_dim_);
    const std::size_t n = k.rows;
    if (n > capacity_ - lengths_[b])
        fail("sequence " + std::to_string(b) + " holds " + std::to_string(lengths_[b]) + " tokens; " + std::to_string(n) +
             " more exceed the capacity " + std::to_string(capacity_));
    const detail::KVRows keys = detail::KVCacheAccess::keys(*this), values = detail::KVCacheAccess::values(*this);
    for (std::size_t h = 0; h < kv_heads_; ++h)
        for (std::size_t i = 0; i < n; ++i) {
            keys.write_row(b, h, lengths_[b] + i, k.head(0, h).row(i));
            values.write_row(b, h, lengths_[b] + i, v.head(0, h).row(i));
        }
    lengths_[b] += n;
}

namespace detail {

void check_kv_scales(const char* what, DataType element, float k_scale, float v_scale) {
    for (const auto& [name, x] : {std::pair<const char*, float>{"k_scale", k_scale}, {"v_scale", v_scale}}) {
        if (has_tensor_scale(element) ? !(std::isfinite(x) && x > 0.0f) : x != 1.0f)
            fail(std::string(what) + " " + name + " is " + float_str(x) + " but " +
                 (has_tensor_scale(element) ? std::string("must be positive and finite")
                                            : "must be 1 for a " + std::string(data_type_name(element)) + " cache (only fp8 takes scales)"));
        // Saturation keeps the codes finite; the read-back value (code · scale) must be too.
        const float largest = element == DataType::fp8_e4m3 ? 448.0f : 57344.0f;
        if (has_tensor_scale(element) && !std::isfinite(largest * x))
            fail(std::string(what) + " " + name + " is " + float_str(x) + " but must be at most " +
                 float_str(std::numeric_limits<float>::max() / largest) + " for " + std::string(data_type_name(element)) +
                 ": its largest value " + float_str(largest) + " times the scale overflows float");
    }
}

void check_appended_rows(const ConstHeads& k, const ConstHeads& v, std::size_t kv_heads, std::size_t head_dim) {
    for (const auto& [name, x] : {std::pair<const char*, const ConstHeads*>{"k", &k}, {"v", &v}}) {
        if (x->data == nullptr && x->rows != 0) fail(std::string(name) + " is a null pointer");
        if (x->batch != 1 || x->heads != kv_heads || x->dim != head_dim)
            fail(std::string(name) + " is [" + std::to_string(x->batch) + ", " + std::to_string(x->heads) + ", " +
                 std::to_string(x->rows) + ", " + std::to_string(x->dim) + "] but must be [1, Hkv, n, d] with Hkv = " +
                 std::to_string(kv_heads) + " and d = " + std::to_string(head_dim));
    }
    if (v.rows != k.rows) fail("v has " + std::to_string(v.rows) + " tokens but k has " + std::to_string(k.rows));
}

template <class T>
HeadsView<const T> KVCacheAccess::typed(const KVCache& c, bool values) {
    c.check_element(element_type_of<T>(), "keys_as / values_as");
    const KVRows r = rows(c, values);
    return {static_cast<const T*>(r.base), c.batch_, c.kv_heads_, c.capacity_, c.head_dim_, r.batch_stride, r.head_stride, r.row_stride};
}

float* KVCacheAccess::key_data(KVCache& c) {
    c.check_element(DataType::f32, "key_data()");
    return static_cast<float*>(c.keys_);
}

float* KVCacheAccess::value_data(KVCache& c) {
    c.check_element(DataType::f32, "value_data()");
    return static_cast<float*>(c.values_);
}

}  // namespace detail
}  // namespace mha
