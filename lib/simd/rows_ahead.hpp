// Where the decode kernels' K / V rows live. BlockedRows: a kernel's own n rows, either equally strided (one run)
// or in the fixed-size blocks of a paged pool, read through its block table (the kernel walks the table: one
// call per stream of a split, not one per block). RowsAhead: the rows a kernel's caller reads next, after the
// kernel's own (the V stream after the K stream, the next task's keys). The kernels prefetch a fixed distance
// ahead of the row they read, into these rows once past their own: a stream broken into blocks at scattered
// addresses then reads like one long stream (the hardware prefetchers restart at every block and also fetch
// past its end). RowsAhead's rows are only prefetched, never read: any address is safe, but the caller names
// exactly its rows.
#pragma once
#include <cstddef>
#include <cstdint>

#include "mha/view.hpp"

namespace mha::simd {

// Rows in blocks: row i of a stream is at
//   table[(first + i) >> shift]·block_bytes + ((first + i) mod 2^shift)·row stride      bytes from its base,
// blocks of 2^shift rows (table: the block ids from the one holding row 0 on; first: row 0's row in its block).
// table == nullptr: unblocked, row i at i·row stride.
struct BlockMap {
    const std::uint32_t* table = nullptr;
    unsigned shift = 0;
    std::size_t block_bytes = 0;
    std::size_t first = 0;
};

// n rows of cols elements of E (row stride in elements; an int8 row's stride covers its scales) from data, placed
// by blocks (block_bytes: bytes). A MatrixView converts to one run. Plain data: the kernels address rows with
// their own helpers (read_ahead.hpp), templates on the Arch.
template <class E>
struct BlockedRows {
    const E* data = nullptr;
    std::size_t rows = 0, cols = 0, stride = 0;
    BlockMap blocks;
    // The absolute position of row 0 (a key's index in its sequence): kernels that group rows at fixed positions
    // (the int8 P·V on dot products) group them the same whatever the rows' placement and the calls around them.
    std::size_t origin = 0;

    constexpr BlockedRows() = default;
    constexpr BlockedRows(MatrixView<const E> v) noexcept  // NOLINT(google-explicit-constructor)
        : data(v.data), rows(v.rows), cols(v.cols), stride(v.stride) {}
    constexpr BlockedRows(MatrixView<E> v) noexcept  // NOLINT(google-explicit-constructor)
        : data(v.data), rows(v.rows), cols(v.cols), stride(v.stride) {}
    constexpr BlockedRows(const E* base, std::size_t n, std::size_t d, std::size_t row_stride, const BlockMap& map,
                          std::size_t first_position = 0) noexcept
        : data(base), rows(n), cols(d), stride(row_stride), blocks(map), origin(first_position) {}
};

struct RowsAhead {
    const void* data = nullptr;    // the base of the rows (row 0 when unblocked; null: none)
    std::size_t rows = 0;          // rows that follow
    std::size_t stride_bytes = 0;  // bytes from one row to the next within a block
    std::size_t row_bytes = 0;     // bytes of one stored row (d elements; an int8 row with its scales)
    BlockMap blocks;               // where row i is (unblocked: data + i·stride_bytes)
};

}  // namespace mha::simd
