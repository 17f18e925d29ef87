// KVRows: the one owner of where a K or V row lives. Every reader and writer of keys and values goes through
// it: the cache's append, the layer's append, widening, the decode path, the copy-out views.
//
// Row j of sequence b, KV head h, is at element offset
//   block(b, j)·batch_stride + h·head_stride + (j mod block_rows)·row_stride       from `base`,
// of `format` (lib/core/element_format.hpp; strides in elements: an int8 row's stride covers its scales), where
//   unblocked (block_table == nullptr): block(b, j) = b, block_rows = ∞ — SDPA's strided heads, the layer's
//     projections, and the contiguous KVCache [B, Hkv, capacity, d] (batch_stride Hkv·capacity·d);
//   blocked: block(b, j) = block_table[b·table_stride + j / block_rows] — a pool of fixed-size blocks
//     [blocks, Hkv, block_rows, d] indexed per sequence by a block table (a paged cache).
// runs(b, h, lo, hi) gives rows [lo, hi) as maximal runs of equally strided rows: one run unblocked, one per
// block touched when blocked. The attention paths read only runs, so a new layout changes this file only.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mha/view.hpp"
#include "../core/element_format.hpp"
#include "../simd/rows_ahead.hpp"

namespace mha::detail {

// A block-table entry whose block a paged cache released (PagedKVCache::release_before): its rows are never read
// by attention (the window check refuses a layer that would see them); widen() gives zeros for them.
constexpr std::uint32_t kReleasedBlock = 0xFFFFFFFFu;

struct KVRows {
    const void* base = nullptr;
    const ElementFormat* format = &element_format(DataType::f32);
    std::size_t dim = 0;                                        // d: values per row (an int8 row's scales follow them)
    float scale = 1.0f;                                         // the tensor scale of fp8 rows (k_scale / v_scale)
    std::size_t batch_stride = 0, head_stride = 0, row_stride = 0;  // elements; batch_stride: per block when blocked
    const std::uint32_t* block_table = nullptr;                 // blocked: [sequences, table_stride]
    std::size_t table_stride = 0, block_rows = 0;

    // fp32 heads (SDPA's inputs, the projections), read in place.
    static KVRows of(const ConstHeads& x) noexcept {
        KVRows r;
        r.base = x.data, r.dim = x.dim, r.batch_stride = x.batch_stride, r.head_stride = x.head_stride, r.row_stride = x.row_stride;
        return r;
    }

    // The element offset of row j of sequence b, KV head h.
    std::size_t offset(std::size_t b, std::size_t h, std::size_t j) const noexcept {
        if (block_table == nullptr) return b * batch_stride + h * head_stride + j * row_stride;
        const std::size_t block = block_table[b * table_stride + j / block_rows];
        return block * batch_stride + h * head_stride + (j % block_rows) * row_stride;
    }
    // Rows [j, j + n) of one run (n within the run's block) as elements of E (float, bfloat16, float16: format->type).
    template <class E>
    MatrixView<const E> run_view(std::size_t b, std::size_t h, std::size_t j, std::size_t n) const noexcept {
        return {static_cast<const E*>(base) + offset(b, h, j), n, dim, row_stride};
    }
    // The rows of the run that starts at row lo of rows [lo, hi) (lo < hi).
    std::size_t run_rows(std::size_t lo, std::size_t hi) const noexcept {
        return block_table == nullptr ? hi - lo : std::min(hi, (lo / block_rows + 1) * block_rows) - lo;
    }
    // Calls f(j, n) for the runs that make up rows [lo, hi) of (b, h), in order.
    template <class F>
    void runs(std::size_t lo, std::size_t hi, F&& f) const {
        for (std::size_t j = lo; j < hi;) {
            const std::size_t n = run_rows(j, hi);
            f(j, n);
            j += n;
        }
    }
    // Rows [lo, hi) of (b, h) as the decode kernels read them: one run, or blocks through the block table (whose
    // block_rows is a power of two: 16 .. 256, checked where a pool is made or described).
    template <class E>
    simd::BlockedRows<E> blocked_rows(std::size_t b, std::size_t h, std::size_t lo, std::size_t hi) const noexcept {
        const simd::BlockMap m = block_map(b, lo);
        return {static_cast<const E*>(base) + start_offset(b, h, lo, m), hi - lo, dim, row_stride, m, lo};
    }
    // The same rows, to be read ahead into (none when lo >= hi).
    simd::RowsAhead rows_ahead(std::size_t b, std::size_t h, std::size_t lo, std::size_t hi) const noexcept {
        if (lo >= hi) return {};
        const simd::BlockMap m = block_map(b, lo);
        return {static_cast<const unsigned char*>(base) + start_offset(b, h, lo, m) * format->bytes, hi - lo,
                row_stride * format->bytes, stored_row_bytes(), m};
    }
    // Row j of (b, h) as bytes (for writing a cache's own storage, the only rows written through KVRows).
    void* row_bytes(std::size_t b, std::size_t h, std::size_t j) const noexcept {
        return const_cast<unsigned char*>(static_cast<const unsigned char*>(base)) + offset(b, h, j) * format->bytes;
    }
    // Row j of (b, h) rounded from src (d floats) to the format.
    void write_row(std::size_t b, std::size_t h, std::size_t j, const float* src) const noexcept {
        format->narrow(src, row_bytes(b, h, j), dim, scale);
    }
    // Rows [lo, hi) of (b, h) widened into dst (hi − lo rows of d floats, stride >= d); rows of a released block
    // as zeros (a pack block may reach into them before the window; they are masked there).
    void widen(std::size_t b, std::size_t h, std::size_t lo, std::size_t hi, Matrix dst) const noexcept {
        for (std::size_t j = lo; j < hi; ++j) {
            if (released(b, j))
                std::fill(dst.row(j - lo), dst.row(j - lo) + dim, 0.0f);
            else
                format->widen(row_bytes(b, h, j), dst.row(j - lo), dim, scale);
        }
    }
    // Whether row j of sequence b lies in a block the paged cache released.
    bool released(std::size_t b, std::size_t j) const noexcept {
        return block_table != nullptr && block_table[b * table_stride + j / block_rows] == kReleasedBlock;
    }
    // Where the rows from row lo of sequence b lie (unblocked: no table).
    simd::BlockMap block_map(std::size_t b, std::size_t lo) const noexcept {
        simd::BlockMap m;
        if (block_table == nullptr) return m;
        while ((std::size_t{1} << m.shift) < block_rows) ++m.shift;
        m.table = block_table + b * table_stride + lo / block_rows;
        m.block_bytes = batch_stride * format->bytes;
        m.first = lo % block_rows;
        return m;
    }
    // The element offset rows placed by m (from row lo of (b, h)) count from: row lo itself when unblocked, head h
    // of block 0 when blocked.
    std::size_t start_offset(std::size_t b, std::size_t h, std::size_t lo, const simd::BlockMap& m) const noexcept {
        return m.table == nullptr ? offset(b, h, lo) : h * head_stride;
    }
    // Bytes of one stored row.
    std::size_t stored_row_bytes() const noexcept { return format->row_bytes(dim); }
    // fp32 and unblocked: the rows as heads [batch, heads, rows, d], read in place.
    bool is_f32_heads() const noexcept { return format->type == DataType::f32 && block_table == nullptr; }
    ConstHeads f32_heads(std::size_t batch, std::size_t heads, std::size_t rows) const noexcept {
        return {static_cast<const float*>(base), batch, heads, rows, dim, batch_stride, head_stride, row_stride};
    }
};

}  // namespace mha::detail
