// RowsAhead: the rows a decode kernel's caller reads next, after the kernel's own K / V rows (the next block's
// run of a paged cache, or the V stream after the K stream). The kernels prefetch a fixed distance ahead
// of the row they read, into these rows once past their own: a stream broken into short runs at scattered
// addresses then reads like one long stream (the hardware prefetchers restart at every run and also fetch
// past its end). Only prefetched, never read: any address is safe, but the caller names exactly its rows.
#pragma once
#include <cstddef>

namespace mha::simd {

struct RowsAhead {
    const void* data = nullptr;    // the first row (null: none)
    std::size_t rows = 0;          // rows that follow, equally strided
    std::size_t stride_bytes = 0;  // bytes from one row to the next
    std::size_t row_bytes = 0;     // bytes of one stored row (d elements; an int8 row with its scales)
};

}  // namespace mha::simd
