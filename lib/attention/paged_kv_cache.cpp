// PagedKVCache (mha/paged_kv_cache.hpp): the pool, the block tables and reference counts, the sequence
// operations; the step reservation (paged_kv_cache_access.hpp); the level-2 write paged_write_kv.
#include "mha/paged_kv_cache.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "attention_core.hpp"
#include "kv_cache_access.hpp"
#include "paged_kv_cache_access.hpp"

namespace mha {

using detail::fail;

namespace {

std::string str(std::size_t n) { return std::to_string(n); }

bool valid_block_size(std::size_t bs) { return bs == 16 || bs == 32 || bs == 64 || bs == 128 || bs == 256; }

std::size_t blocks_for(std::size_t tokens, std::size_t bs) { return (tokens + bs - 1) / bs; }

}  // namespace

namespace detail {

KVRows pool_rows(const PagedKVPool& pool, bool values, const std::uint32_t* tables, std::size_t table_stride) noexcept {
    KVRows r;
    r.base = values ? pool.values : pool.keys;
    r.format = &element_format(pool.element);
    r.dim = pool.head_dim;
    r.scale = values ? pool.v_scale : pool.k_scale;
    r.row_stride = r.format->row_elements(pool.head_dim);
    r.head_stride = pool.block_size * r.row_stride;
    r.batch_stride = pool.kv_heads * r.head_stride;
    r.block_table = tables;
    r.table_stride = table_stride;
    r.block_rows = pool.block_size;
    return r;
}

std::size_t check_pool_layout(const std::string& what, DataType element, float k_scale, float v_scale, std::size_t num_blocks,
                              std::size_t block_size, std::size_t kv_heads, std::size_t head_dim) {
    if (!is_element_type(element))
        fail(what + " element type " + std::to_string(static_cast<int>(element)) +
             " is not f32, bf16, f16, int8, fp8_e4m3 or fp8_e5m2");
    check_kv_scales(what.c_str(), element, k_scale, v_scale);
    if (num_blocks == 0 || kv_heads == 0 || head_dim == 0)
        fail(what + " dimensions must be non-zero: num_blocks " + str(num_blocks) + ", kv_heads " + str(kv_heads) +
             ", head_dim " + str(head_dim));
    if (!valid_block_size(block_size)) fail(what + " block_size " + str(block_size) + " is not 16, 32, 64, 128 or 256");
    if (num_blocks > UINT32_MAX) fail(what + " num_blocks " + str(num_blocks) + " exceeds 2^32 - 1 (block tables are 32-bit)");
    if (head_dim > SIZE_MAX / 8) fail(what + " head_dim " + str(head_dim) + " overflows the address space");
    const ElementFormat& format = element_format(element);
    const std::size_t row = checked_madd(format.row_elements(head_dim), format.bytes, 0, what.c_str(), "row bytes");
    const std::size_t rows = checked_madd(kv_heads, block_size, 0, what.c_str(), "rows per block (kv_heads · block_size)");
    const std::size_t block = checked_madd(rows, row, 0, what.c_str(), "block bytes");
    const std::size_t bytes = checked_madd(num_blocks, block, 0, what.c_str(), "bytes (num_blocks · kv_heads · block_size · row)");
    checked_extent(what.c_str(), static_cast<const unsigned char*>(nullptr), checked_madd(bytes, 2, 0, what.c_str(), "bytes"));
    return bytes;
}

std::size_t check_caller_pool(const PagedKVPool& pool) {
    if (pool.keys == nullptr || pool.values == nullptr) fail("the pool's keys and values must not be null");
    const std::size_t bytes = check_pool_layout("the pool's", pool.element, pool.k_scale, pool.v_scale, pool.num_blocks,
                                                pool.block_size, pool.kv_heads, pool.head_dim);
    checked_extent("the pool's keys", static_cast<const unsigned char*>(pool.keys), bytes);
    checked_extent("the pool's values", static_cast<const unsigned char*>(pool.values), bytes);
    if (overlaps(static_cast<const unsigned char*>(pool.keys), bytes, static_cast<const unsigned char*>(pool.values), bytes))
        fail("the pool's keys and values overlap (" + str(bytes) + " bytes each)");
    return bytes;
}

bool overlaps_pool(const PagedKVPool& pool, std::size_t bytes, const float* data, std::size_t floats) {
    return overlaps(data, floats, static_cast<const unsigned char*>(pool.keys), bytes) ||
           overlaps(data, floats, static_cast<const unsigned char*>(pool.values), bytes);
}

StepComposition PagedKVCacheAccess::compose_step(const PagedKVCache& c, const std::size_t* ids, const std::size_t* q_lens,
                                                 std::size_t n) {
    if (n == 0) fail("a step needs at least one sequence");
    if (ids == nullptr || q_lens == nullptr) fail("seq_ids and q_lens must not be null");
    const std::size_t bs = c.pool_.block_size;
    StepComposition r;
    r.sequences = n;
    r.block_size = bs;
    r.element = c.pool_.element;
    r.ids.assign(ids, ids + n);
    r.query_starts.assign(n + 1, 0);
    r.key_lengths.assign(n, 0);
    std::size_t new_blocks = 0;
    std::vector<std::size_t> sorted(ids, ids + n);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i + 1 < n; ++i)
        if (sorted[i] == sorted[i + 1]) fail("sequence " + str(sorted[i]) + " appears twice in one step");
    for (std::size_t i = 0; i < n; ++i) {
        c.check_sequence(ids[i]);
        if (q_lens[i] == 0) fail("q_lens[" + str(i) + "] is 0: every sequence of a step has at least one new token");
        const std::size_t len = c.seqs_[ids[i]].length;
        if (q_lens[i] > SIZE_MAX / 2 - len) fail("q_lens[" + str(i) + "] is too large");
        r.key_lengths[i] = len + q_lens[i];
        r.query_starts[i + 1] = r.query_starts[i] + q_lens[i];
        if (r.query_starts[i + 1] < r.query_starts[i]) fail("the step's token count overflows");
        r.table_stride = std::max(r.table_stride, blocks_for(r.key_lengths[i], bs));
        // Checked here, before anything is sized by the step: more new blocks than the whole pool never fit.
        new_blocks += blocks_for(r.key_lengths[i], bs) - blocks_for(len, bs);
        if (new_blocks > c.pool_.num_blocks)
            fail("the paged KV cache has " + str(c.free_.size()) + " free blocks but this step needs at least " + str(new_blocks) +
                 ", more than its " + str(c.pool_.num_blocks) + " blocks of " + str(bs) + " tokens in all");
    }
    return r;
}

StepReservation PagedKVCacheAccess::reserve_step(const PagedKVCache& c, const StepComposition& step) {
    const std::size_t bs = c.pool_.block_size, n = step.sequences;
    if (bs != step.block_size)
        fail("the step plan was made for blocks of " + str(step.block_size) + " tokens but this cache has blocks of " + str(bs));
    if (c.pool_.element != step.element)
        fail("the step plan was made for a cache of " + std::string(data_type_name(step.element)) + " but this cache holds " +
             std::string(data_type_name(c.pool_.element)));
    // Copy-on-write of a shared partial last block: each of its writers in this step copies it, except that when
    // every sequence holding it writes, the longest of them (the last such in step order) keeps it and writes in
    // place, past every other holder's rows (so a failed step leaves only rows nobody reads).
    struct SharedWrite {
        std::size_t writers = 0, keeper = 0, keeper_past = 0;
    };
    std::map<std::uint32_t, SharedWrite> shared;
    std::size_t needed = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t id = step.ids[i], q = step.query_starts[i + 1] - step.query_starts[i], past = step.key_lengths[i] - q;
        if (id >= c.seqs_.size() || !c.seqs_[id].live)
            fail("the step plan's sequence " + str(id) + " is not in this paged KV cache");
        const PagedKVCache::Sequence& s = c.seqs_[id];
        if (s.length != past)
            fail("the step plan was made for sequence " + str(id) + " at " + str(past) + " tokens but this cache holds " +
                 str(s.length) + " (a plan serves one step, in caches that took the same steps)");
        needed += blocks_for(step.key_lengths[i], bs) - blocks_for(past, bs);
        if (past % bs != 0 && c.refs_[s.blocks.back()] > 1) {
            SharedWrite& w = shared[s.blocks.back()];  // inserted on first sight
            if (w.writers++ == 0 || past >= w.keeper_past) w.keeper = i, w.keeper_past = past;
        }
    }
    for (const auto& [block, w] : shared) needed += w.writers == c.refs_[block] ? w.writers - 1 : w.writers;
    if (needed > c.free_.size())
        fail("the paged KV cache has " + str(c.free_.size()) + " free blocks but this step needs " + str(needed) + " (" +
             str(c.pool_.num_blocks) + " blocks of " + str(bs) + " tokens in all)");
    StepReservation r;
    r.step = &step;
    r.tables.assign(detail::scratch_mul(n, step.table_stride), 0);
    std::size_t next = c.free_.size();  // blocks are taken from the top of the stack down
    for (std::size_t i = 0; i < n; ++i) {
        const PagedKVCache::Sequence& s = c.seqs_[step.ids[i]];
        std::uint32_t* t = r.tables.data() + i * step.table_stride;
        std::copy(s.blocks.begin(), s.blocks.end(), t);
        if (s.length % bs != 0 && c.refs_[s.blocks.back()] > 1) {
            const SharedWrite& w = shared.at(s.blocks.back());
            if (w.writers != c.refs_[s.blocks.back()] || w.keeper != i) {
                const std::uint32_t copy = c.free_[--next];
                r.copies.emplace_back(s.blocks.back(), copy);
                t[s.blocks.size() - 1] = copy;
            }
        }
        for (std::size_t b = s.blocks.size(); b < blocks_for(step.key_lengths[i], bs); ++b) t[b] = c.free_[--next];
    }
    r.blocks_taken = c.free_.size() - next;
    return r;
}

void PagedKVCacheAccess::prepare_step(PagedKVCache& c, const StepReservation& r) {
    const StepComposition& step = *r.step;
    for (std::size_t i = 0; i < step.sequences; ++i)  // the tables' growth allocated now (a throw changes nothing)
        c.seqs_[step.ids[i]].blocks.reserve(blocks_for(step.key_lengths[i], c.pool_.block_size));
    const std::size_t block_bytes = c.pool_.kv_heads * c.pool_.block_size * element_format(c.pool_.element).row_bytes(c.pool_.head_dim);
    for (const auto& [from, to] : r.copies) {
        auto* k = static_cast<unsigned char*>(c.pool_.keys);
        auto* v = static_cast<unsigned char*>(c.pool_.values);
        std::memcpy(k + to * block_bytes, k + from * block_bytes, block_bytes);
        std::memcpy(v + to * block_bytes, v + from * block_bytes, block_bytes);
    }
}

void PagedKVCacheAccess::commit_step(PagedKVCache& c, const StepReservation& r) noexcept {
    const std::size_t bs = c.pool_.block_size;
    for (std::size_t b = 0; b < r.blocks_taken; ++b) {
        c.refs_[c.free_.back()] = 1;
        c.free_.pop_back();
    }
    for (const auto& copy : r.copies) c.release(copy.first);
    const StepComposition& step = *r.step;
    for (std::size_t i = 0; i < step.sequences; ++i) {
        PagedKVCache::Sequence& s = c.seqs_[step.ids[i]];
        const std::uint32_t* t = r.tables.data() + i * step.table_stride;
        // Within the capacity prepare_step reserved: no allocation.
        s.blocks.assign(t, t + blocks_for(step.key_lengths[i], bs));
        s.length = step.key_lengths[i];
    }
}

}  // namespace detail

PagedKVCache::PagedKVCache(std::size_t num_blocks, std::size_t block_size, std::size_t kv_heads, std::size_t head_dim,
                           DataType element, float k_scale, float v_scale) {
    const std::size_t half =
        detail::check_pool_layout("PagedKVCache", element, k_scale, v_scale, num_blocks, block_size, kv_heads, head_dim);
    const std::size_t total = 2 * half;  // keys, then values
    refs_.assign(num_blocks, 0);
    free_.resize(num_blocks);
    for (std::size_t b = 0; b < num_blocks; ++b) free_[b] = static_cast<std::uint32_t>(num_blocks - 1 - b);  // 0 first
    auto* block = static_cast<unsigned char*>(detail::allocate_aligned(total));
#ifdef MADV_HUGEPAGE
    madvise(block, total, MADV_HUGEPAGE);  // as KVCache: a hint, harmless when refused
#endif
    bytes_ = total;
    pool_ = {block, block + half, element, num_blocks, block_size, kv_heads, head_dim, k_scale, v_scale};
}

PagedKVCache::~PagedKVCache() {
    if (pool_.keys != nullptr) detail::free_aligned(pool_.keys, bytes_);
}

PagedKVCache::PagedKVCache(PagedKVCache&& o) noexcept
    : pool_(o.pool_), bytes_(o.bytes_), seqs_(std::move(o.seqs_)), refs_(std::move(o.refs_)), free_(std::move(o.free_)) {
    o.pool_ = {};
    o.bytes_ = 0;
}

PagedKVCache& PagedKVCache::operator=(PagedKVCache&& o) noexcept {
    if (this != &o) {
        PagedKVCache tmp(std::move(o));
        std::swap(pool_, tmp.pool_);
        std::swap(bytes_, tmp.bytes_);
        std::swap(seqs_, tmp.seqs_);
        std::swap(refs_, tmp.refs_);
        std::swap(free_, tmp.free_);
    }
    return *this;
}

void PagedKVCache::check_sequence(std::size_t s) const {
    if (s >= seqs_.size() || !seqs_[s].live) fail("sequence " + str(s) + " is not in this paged KV cache");
}

void PagedKVCache::release(std::uint32_t block) noexcept {
    if (--refs_[block] == 0) free_.push_back(block);
}

std::size_t PagedKVCache::add_sequence() {
    for (std::size_t s = 0; s < seqs_.size(); ++s)
        if (!seqs_[s].live) {
            seqs_[s] = Sequence{{}, 0, 0, true};
            return s;
        }
    seqs_.push_back(Sequence{{}, 0, 0, true});
    return seqs_.size() - 1;
}

std::size_t PagedKVCache::fork(std::size_t s) {
    check_sequence(s);
    std::vector<std::uint32_t> blocks = seqs_[s].blocks;  // may throw: before anything changes
    const std::size_t length = seqs_[s].length, released = seqs_[s].released;
    const std::size_t t = add_sequence();
    seqs_[t].blocks = std::move(blocks);
    seqs_[t].length = length;
    seqs_[t].released = released;
    for (std::uint32_t b : seqs_[t].blocks)
        if (b != detail::kReleasedBlock) ++refs_[b];
    return t;
}

std::size_t PagedKVCache::length(std::size_t s) const {
    check_sequence(s);
    return seqs_[s].length;
}

const std::vector<std::uint32_t>& PagedKVCache::block_table(std::size_t s) const {
    check_sequence(s);
    return seqs_[s].blocks;
}

void PagedKVCache::truncate(std::size_t s, std::size_t n) {
    check_sequence(s);
    Sequence& q = seqs_[s];
    if (n > q.length)
        fail("cannot truncate sequence " + str(s) + " to " + str(n) + " tokens: it holds " + str(q.length));
    if (n != 0 && n < q.released)
        fail("cannot truncate sequence " + str(s) + " to " + str(n) + " tokens: the blocks of its first " + str(q.released) +
             " tokens were released (release_before)");
    const std::size_t keep = blocks_for(n, pool_.block_size);
    for (std::size_t b = keep; b < q.blocks.size(); ++b)
        if (q.blocks[b] != detail::kReleasedBlock) release(q.blocks[b]);
    q.blocks.resize(keep);
    q.length = n;
    if (n == 0) q.released = 0;
}

std::size_t PagedKVCache::release_before(std::size_t s, std::size_t position) {
    check_sequence(s);
    Sequence& q = seqs_[s];
    if (position > q.length)
        fail("cannot release sequence " + str(s) + "'s blocks before position " + str(position) + ": it holds " + str(q.length) +
             " tokens");
    const std::size_t whole = position / pool_.block_size;
    for (std::size_t b = q.released / pool_.block_size; b < whole; ++b) {
        release(q.blocks[b]);
        q.blocks[b] = detail::kReleasedBlock;
    }
    q.released = std::max(q.released, whole * pool_.block_size);
    return q.released;
}

std::size_t PagedKVCache::released_tokens(std::size_t s) const {
    check_sequence(s);
    return seqs_[s].released;
}

void PagedKVCache::free_sequence(std::size_t s) {
    truncate(s, 0);
    seqs_[s].live = false;
    seqs_[s].blocks.shrink_to_fit();
}

void PagedKVCache::append(std::size_t s, const ConstHeads& k, const ConstHeads& v) {
    check_sequence(s);
    detail::check_appended_rows(k, v, pool_.kv_heads, pool_.head_dim);
    const std::size_t n = k.rows;
    if (n == 0) return;
    const detail::StepComposition step = detail::PagedKVCacheAccess::compose_step(*this, &s, &n, 1);
    const detail::StepReservation r = detail::PagedKVCacheAccess::reserve_step(*this, step);
    detail::PagedKVCacheAccess::prepare_step(*this, r);
    const detail::KVRows keys = detail::PagedKVCacheAccess::keys(*this, r), values = detail::PagedKVCacheAccess::values(*this, r);
    const std::size_t len = seqs_[s].length;
    for (std::size_t h = 0; h < pool_.kv_heads; ++h)
        for (std::size_t i = 0; i < n; ++i) {
            keys.write_row(0, h, len + i, k.head(0, h).row(i));
            values.write_row(0, h, len + i, v.head(0, h).row(i));
        }
    detail::PagedKVCacheAccess::commit_step(*this, r);
}

void PagedKVCache::copy_rows(bool values, std::size_t s, std::size_t h, Matrix dst) const {
    const char* what = values ? "copy_values" : "copy_keys";
    check_sequence(s);
    const std::size_t len = seqs_[s].length;
    if (h >= pool_.kv_heads) fail("KV head " + str(h) + " is out of range: the cache has " + str(pool_.kv_heads));
    if (dst.rows != len || dst.cols != pool_.head_dim || dst.stride < dst.cols || (dst.data == nullptr && dst.rows != 0))
        fail(std::string(what) + ": dst is " + detail::shape_str(dst.rows, dst.cols) + " with stride " + str(dst.stride) +
             " but must be [length(s), d] = " + detail::shape_str(len, pool_.head_dim) + " with stride >= d");
    const std::size_t released = seqs_[s].released;
    for (std::size_t j = 0; j < released; ++j)
        std::fill(dst.row(j), dst.row(j) + pool_.head_dim, std::numeric_limits<float>::quiet_NaN());
    detail::pool_rows(pool_, values, seqs_[s].blocks.data(), 0).widen(0, h, released, len, dst.row_block(released, len - released));
}

void PagedKVCache::copy_keys(std::size_t s, std::size_t h, Matrix dst) const { copy_rows(false, s, h, dst); }
void PagedKVCache::copy_values(std::size_t s, std::size_t h, Matrix dst) const { copy_rows(true, s, h, dst); }

void paged_write_kv(const PagedKVPool& pool, const ConstMatrix& k, const ConstMatrix& v, const std::int64_t* slots) {
    const std::size_t pool_bytes = detail::check_caller_pool(pool);
    const std::size_t w = pool.kv_heads * pool.head_dim, T = k.rows, capacity = pool.num_blocks * pool.block_size;
    for (const auto& [name, x] : {std::pair<const char*, const ConstMatrix*>{"k", &k}, {"v", &v}}) {
        if (x->rows != T || x->cols != w || x->stride < w || (x->data == nullptr && T != 0))
            fail(std::string(name) + " is " + detail::shape_str(x->rows, x->cols) + " with stride " + str(x->stride) +
                 " but must be [T, kv_heads·head_dim] = " + detail::shape_str(T, w) + " with stride >= " + str(w));
        if (T != 0) {
            detail::check_matrix(name, *x);
            if (detail::overlaps_pool(pool, pool_bytes, x->data, detail::matrix_elements(*x)))
                fail(std::string(name) + " overlaps the pool");
        }
    }
    if (T == 0) return;
    if (slots == nullptr) fail("slots is a null pointer");
    if (detail::overlaps(reinterpret_cast<const unsigned char*>(slots), T * sizeof(std::int64_t),
                         static_cast<const unsigned char*>(pool.keys), pool_bytes) ||
        detail::overlaps(reinterpret_cast<const unsigned char*>(slots), T * sizeof(std::int64_t),
                         static_cast<const unsigned char*>(pool.values), pool_bytes))
        fail("slots overlap the pool (they would change as rows are written)");
    std::vector<std::int64_t> sorted;  // the written slots (-1: a padding token, vLLM's PAD_SLOT_ID, skipped)
    for (std::size_t t = 0; t < T; ++t)
        if (slots[t] != -1) sorted.push_back(slots[t]);
    if (sorted.empty()) return;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() < 0 || static_cast<std::size_t>(sorted.back()) >= capacity)
        fail("slot " + std::to_string(sorted.front() < 0 ? sorted.front() : sorted.back()) + " is outside the pool's " +
             str(capacity) + " rows (-1: a padding token, not written)");
    for (std::size_t t = 0; t + 1 < sorted.size(); ++t)
        if (sorted[t] == sorted[t + 1]) fail("slot " + std::to_string(sorted[t]) + " is written twice");
    const detail::KVRows keys = detail::pool_rows(pool, false, nullptr, 0), values = detail::pool_rows(pool, true, nullptr, 0);
    for (std::size_t t = 0; t < T; ++t) {
        if (slots[t] == -1) continue;
        const std::size_t block = static_cast<std::size_t>(slots[t]) / pool.block_size, row = static_cast<std::size_t>(slots[t]) % pool.block_size;
        for (std::size_t h = 0; h < pool.kv_heads; ++h) {
            // Unblocked rows with batch_stride of a block: row `row` of block `block`.
            keys.write_row(block, h, row, k.row(t) + h * pool.head_dim);
            values.write_row(block, h, row, v.row(t) + h * pool.head_dim);
        }
    }
}

}  // namespace mha
