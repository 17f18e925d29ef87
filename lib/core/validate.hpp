// Argument checks shared by the public entry points. Each throws mha::invalid_argument with a
// message that names the argument and its values. Extents are computed with overflow checks, so a
// garbage stride or shape is refused instead of wrapping around and passing. A view with a zero dimension
// spans no elements (its extent is 0, never (0 − 1)·stride) and overlaps nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "mha/error.hpp"
#include "mha/isa.hpp"
#include "mha/view.hpp"

namespace mha::detail {

[[noreturn]] inline void fail(const std::string& message) { throw invalid_argument(message); }

inline std::string shape_str(std::size_t r, std::size_t c) {
    // Appends rather than "[" + ...: g++ 12 gives a false -Wrestrict on that form (GCC bug 105651).
    std::string s("[");
    s.append(std::to_string(r)).append(", ").append(std::to_string(c)).append("]");
    return s;
}

// x in the fewest significant digits (6 to 9) that read back as x: "1.0000001", not std::to_string's "1.000000".
inline std::string float_str(float x) {
    char buf[32];
    for (int digits = 6; digits <= 9; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(x));
        if (!(std::strtof(buf, nullptr) != x) || x != x) break;
    }
    return buf;
}

// An enum value a caller cast from an integer: one of the enumerators, or fails naming it.
inline void check_backend(Backend backend) {
    if (static_cast<unsigned>(backend) > static_cast<unsigned>(Backend::simd))
        fail("backend " + std::to_string(static_cast<int>(backend)) + " is not scalar or simd");
}
inline void check_trans(Trans t, const char* name) {
    if (static_cast<unsigned>(t) > static_cast<unsigned>(Trans::yes))
        fail(std::string(name) + " " + std::to_string(static_cast<int>(t)) + " is not Trans::no or Trans::yes");
}

// a·b + c, or fails naming `name` and `what` if it does not fit in size_t. Messages are built only on
// failure: a valid call allocates nothing here (a forward in a Workspace allocates nothing at all).
inline std::size_t checked_madd(std::size_t a, std::size_t b, std::size_t c, const char* name, const char* what) {
    std::size_t p = 0, s = 0;
    if (__builtin_mul_overflow(a, b, &p) || __builtin_add_overflow(p, c, &s))
        fail(std::string(name) + " " + what + " overflows the address space");
    return s;
}

// Elements from a view's first to one past its last element; the bytes must fit in the address space
// after the pointer (no wrap-around).
template <class T>
std::size_t checked_extent(const char* name, const T* data, std::size_t elements) {
    constexpr std::size_t max_bytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
    if (elements > max_bytes / sizeof(T) ||
        reinterpret_cast<std::uintptr_t>(data) > std::numeric_limits<std::uintptr_t>::max() - elements * sizeof(T))
        fail(std::string(name) + " spans " + std::to_string(elements) + " elements, which overflows the address space");
    return elements;
}

// A non-empty matrix view with a valid pointer, stride >= cols, and an extent that fits.
template <class T>
void check_matrix(const char* name, const MatrixView<T>& m) {
    if (m.rows == 0 || m.cols == 0) fail(std::string(name) + " has zero size " + shape_str(m.rows, m.cols));
    if (m.data == nullptr) fail(std::string(name) + " is a null pointer");
    if (m.stride < m.cols)
        fail(std::string(name) + " stride " + std::to_string(m.stride) + " is smaller than its row of " +
             std::to_string(m.cols) + " columns");
    checked_extent(name, m.data, checked_madd(m.rows - 1, m.stride, m.cols, name, "extent (rows − 1)·stride + cols"));
}

// The elements a batch view spans: (batch − 1)·batch_stride + (rows − 1)·row_stride + cols, checked; 0
// when a dimension is 0.
template <class T>
std::size_t batch_extent(const char* name, const BatchView<T>& b) {
    if (b.batch == 0 || b.rows == 0 || b.cols == 0) return 0;
    const std::size_t rows = checked_madd(b.rows - 1, b.row_stride, b.cols, name, "extent (rows − 1)·row_stride + cols");
    return checked_extent(name, b.data, checked_madd(b.batch - 1, b.batch_stride, rows, name, "extent (batch − 1)·batch_stride + …"));
}

// A batch view with a valid pointer whose extent fits; one with a zero dimension spans nothing and may be
// null (the callers check the feature counts). Inputs may use any strides (rows may overlap or repeat: a
// stride of 0 broadcasts); an output must have rows_disjoint too.
template <class T>
void check_batch(const char* name, const BatchView<T>& b) {
    if (b.batch == 0 || b.rows == 0 || b.cols == 0) return;
    if (b.data == nullptr) fail(std::string(name) + " is a null pointer");
    batch_extent(name, b);
}

// The rows of an output batch view do not overlap each other. With the two dimensions that have more
// than one entry sorted by stride (small stride s with n entries, large stride S), the rows are disjoint
// when s >= cols and S >= (n − 1)·s + cols: every row of one step of the large stride ends before the
// next one starts. Covers [B, L, E] (batch-first), [L, B, E] (sequence-first) and padded layouts.
template <class T>
void check_rows_disjoint(const char* name, const BatchView<T>& b) {
    if (b.batch == 0 || b.rows == 0 || b.cols == 0) return;  // no rows
    std::pair<std::size_t, std::size_t> dims[2];  // (stride, count)
    int n = 0;
    if (b.rows > 1) dims[n++] = {b.row_stride, b.rows};
    if (b.batch > 1) dims[n++] = {b.batch_stride, b.batch};
    if (n == 2 && dims[1].first < dims[0].first) std::swap(dims[0], dims[1]);
    const bool overlap = (n >= 1 && dims[0].first < b.cols) ||
                         (n == 2 && dims[1].first < (dims[0].second - 1) * dims[0].first + b.cols);
    if (overlap)
        fail(std::string(name) + " rows overlap each other (row stride " + std::to_string(b.row_stride) + ", batch stride " +
             std::to_string(b.batch_stride) + ", " + std::to_string(b.cols) + " columns)");
}

// Half-open byte ranges [first, last) touched by two spans of elements; true if they intersect (an empty
// span intersects nothing, even inside the other).
template <class T, class U>
bool overlaps(const T* a, std::size_t a_elements, const U* b, std::size_t b_elements) {
    if (a_elements == 0 || b_elements == 0) return false;
    const auto* a0 = reinterpret_cast<const char*>(a);
    const auto* b0 = reinterpret_cast<const char*>(b);
    return a0 < reinterpret_cast<const char*>(b + b_elements) && b0 < reinterpret_cast<const char*>(a + a_elements);
}

// Elements from a checked matrix view's first to one past its last element (0 if empty).
template <class T>
std::size_t matrix_elements(const MatrixView<T>& m) {
    return m.rows == 0 || m.cols == 0 ? 0 : (m.rows - 1) * m.stride + m.cols;
}

// Views already checked (extents fit).
template <class T, class U>
bool overlaps(const MatrixView<T>& a, const MatrixView<U>& b) {
    return overlaps(a.data, matrix_elements(a), b.data, matrix_elements(b));
}

// Elements from a checked batch view's first to one past its last element (0 if empty).
template <class T>
std::size_t batch_elements(const BatchView<T>& v) {
    if (v.batch == 0 || v.rows == 0 || v.cols == 0) return 0;
    return (v.batch - 1) * v.batch_stride + (v.rows - 1) * v.row_stride + v.cols;
}

template <class T, class U>
bool overlaps(const BatchView<T>& a, const BatchView<U>& b) {
    return overlaps(a.data, batch_elements(a), b.data, batch_elements(b));
}

}  // namespace mha::detail
