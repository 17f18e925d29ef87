// Software read-ahead for the decode kernels (decode_impl.hpp): the stream of
// rows a kernel reads — its own rows, then the caller's next rows (RowsAhead) — and prefetches into L2 a fixed
// distance ahead in it; the hardware's L1 prefetcher brings the lines on from there. Templates on Arch, so that
// no copy compiled with one ISA's flags serves another's path.
#pragma once
#include <cstddef>

#include "mha/view.hpp"
#include "rows_ahead.hpp"

namespace mha::simd::decode_detail {

// Asks for each cache line of the row's `bytes` bytes to be brought into L2 (bytes > 0). Never faults.
template <class Arch>
inline __attribute__((always_inline)) void prefetch_row_l2(const void* row, std::size_t bytes) noexcept {
    const char* t = static_cast<const char*>(row);
    for (std::size_t b = 0; b < bytes; b += 64) __builtin_prefetch(t + b, 0, 2);
    __builtin_prefetch(t + bytes - 1, 0, 2);
}

// Row i of rows placed by m from base (rows_ahead.hpp), row stride ld_bytes within a block.
template <class Arch>
inline __attribute__((always_inline)) const char* row_address(const char* base, std::size_t ld_bytes, const BlockMap& m,
                                                              std::size_t i) noexcept {
    if (m.table == nullptr) return base + i * ld_bytes;
    const std::size_t r = m.first + i;
    return base + m.table[r >> m.shift] * m.block_bytes + (r & ((std::size_t{1} << m.shift) - 1)) * ld_bytes;
}

// The end of row i's run of equally strided rows: the first row of the next block, at most n (unblocked: n).
template <class Arch>
inline __attribute__((always_inline)) std::size_t run_end(const BlockMap& m, std::size_t n, std::size_t i) noexcept {
    if (m.table == nullptr) return n;
    const std::size_t end = ((((m.first + i) >> m.shift) + 1) << m.shift) - m.first;
    return end < n ? end : n;
}

// Row i of x.
template <class Arch, class E>
inline __attribute__((always_inline)) const E* row_of(const BlockedRows<E>& x, std::size_t i) noexcept {
    return reinterpret_cast<const E*>(row_address<Arch>(reinterpret_cast<const char*>(x.data), x.stride * sizeof(E), x.blocks, i));
}

// rows[i] = row j + i of x (as bytes) for i < count (j + count <= x.rows), filled a run of equally strided rows at
// a time; on_run(k, e, first) after each run [k, e) of them, first = row j + k.
template <class Arch, class E, class F>
inline __attribute__((always_inline)) void rows_by_run(const BlockedRows<E>& x, std::size_t j, std::size_t count,
                                                       const unsigned char** rows, F&& on_run) noexcept {
    for (std::size_t k = 0, e = 0; k < count; k = e) {
        const std::size_t end = run_end<Arch>(x.blocks, x.rows, j + k) - j;
        e = end < count ? end : count;
        const E* first = row_of<Arch>(x, j + k);
        for (std::size_t i = k; i < e; ++i) rows[i] = reinterpret_cast<const unsigned char*>(first + (i - k) * x.stride);
        on_run(k, e, first);
    }
}

// A kernel's own n rows (row stride ld bytes, placed by `blocks`, `bytes` bytes each), then the caller's next
// rows. row(i) is row i of that stream, or null past its end.
template <class Arch>
struct RowStream {
    const char* own = nullptr;
    std::size_t n = 0, ld = 0, bytes = 0;
    BlockMap blocks;
    RowsAhead ahead;
    std::size_t distance = 0;  // rows read ahead into L2
    inline __attribute__((always_inline)) const char* row(std::size_t i) const noexcept {
        if (i < n) return row_address<Arch>(own, ld, blocks, i);
        i -= n;
        return i < ahead.rows ? row_address<Arch>(static_cast<const char*>(ahead.data), ahead.stride_bytes, ahead.blocks, i)
                              : nullptr;
    }
};

// The stream of x's rows (row_bytes bytes each) then ahead's (ignored unless its rows are as long), read ahead
// by about ahead_bytes, at least 4 rows and at most the larger of max_rows (the smallest run a caller has: a
// paged cache's smallest block) and ahead.rows when ahead is one run: a distance past the rows ahead would
// skip the run after them, one within them never does (with no rows ahead, or rows ahead in blocks, which
// name the caller's whole next stream, there is nothing to skip).
template <class Arch, class E>
inline __attribute__((always_inline)) RowStream<Arch> row_stream(const BlockedRows<E>& x, std::size_t row_bytes, const RowsAhead& ahead,
                                                                 std::size_t ahead_bytes, std::size_t max_rows) noexcept {
    RowStream<Arch> r;
    r.own = reinterpret_cast<const char*>(x.data);
    r.n = x.rows, r.ld = x.stride * sizeof(E), r.bytes = row_bytes, r.blocks = x.blocks;
    if (ahead.data != nullptr && ahead.row_bytes == r.bytes) r.ahead = ahead;
    if (r.bytes != 0) {
        const std::size_t rows = (ahead_bytes + r.bytes - 1) / r.bytes;
        const bool open = r.ahead.data == nullptr || r.ahead.blocks.table != nullptr;
        const std::size_t cap = open ? rows : r.ahead.rows > max_rows ? r.ahead.rows : max_rows;
        r.distance = rows < 4 ? 4 : rows > cap ? cap : rows;
    }
    return r;
}

// Prefetches rows [lo, hi) of the stream into L2 (those that exist).
template <class Arch>
inline __attribute__((always_inline)) void read_ahead(const RowStream<Arch>& s, std::size_t lo, std::size_t hi) noexcept {
    for (std::size_t i = lo; i < hi; ++i) {
        const char* r = s.row(i);
        if (r == nullptr) return;
        prefetch_row_l2<Arch>(r, s.bytes);
    }
}

}  // namespace mha::simd::decode_detail
