// Argument checks shared by the public entry points. Each throws mha::invalid_argument with a
// message that names the argument and its values.
#pragma once
#include <cstddef>
#include <string>

#include "mha/error.hpp"
#include "mha/view.hpp"

namespace mha::detail {

[[noreturn]] inline void fail(const std::string& message) { throw invalid_argument(message); }

inline std::string shape_str(std::size_t r, std::size_t c) {
    // Appends rather than "[" + ...: g++ 12 gives a false -Wrestrict on that form (GCC bug 105651).
    std::string s("[");
    s.append(std::to_string(r)).append(", ").append(std::to_string(c)).append("]");
    return s;
}

// A non-empty matrix view with a valid pointer and stride >= cols.
template <class T>
void check_matrix(const char* name, const MatrixView<T>& m) {
    if (m.rows == 0 || m.cols == 0) fail(std::string(name) + " has zero size " + shape_str(m.rows, m.cols));
    if (m.data == nullptr) fail(std::string(name) + " is a null pointer");
    if (m.stride < m.cols)
        fail(std::string(name) + " stride " + std::to_string(m.stride) + " is smaller than its row of " +
             std::to_string(m.cols) + " columns");
}

template <class T>
void check_batch(const char* name, const BatchView<T>& b) {
    if (b.batch == 0 || b.rows == 0 || b.cols == 0)
        fail(std::string(name) + " has zero size [" + std::to_string(b.batch) + ", " + std::to_string(b.rows) + ", " +
             std::to_string(b.cols) + "]");
    if (b.data == nullptr) fail(std::string(name) + " is a null pointer");
    if (b.row_stride < b.cols)
        fail(std::string(name) + " row stride " + std::to_string(b.row_stride) + " is smaller than its row of " +
             std::to_string(b.cols) + " columns");
    if (b.batch > 1 && b.batch_stride < (b.rows - 1) * b.row_stride + b.cols)
        fail(std::string(name) + " batch stride " + std::to_string(b.batch_stride) + " is smaller than one matrix of " +
             shape_str(b.rows, b.cols) + " with row stride " + std::to_string(b.row_stride));
}

// Half-open byte ranges [first, last) touched by two views; true if they intersect.
template <class T, class U>
bool overlaps(const MatrixView<T>& a, const MatrixView<U>& b) {
    const auto* a0 = reinterpret_cast<const char*>(a.data);
    const auto* a1 = reinterpret_cast<const char*>(a.data + (a.rows - 1) * a.stride + a.cols);
    const auto* b0 = reinterpret_cast<const char*>(b.data);
    const auto* b1 = reinterpret_cast<const char*>(b.data + (b.rows - 1) * b.stride + b.cols);
    return a0 < b1 && b0 < a1;
}

template <class T, class U>
bool overlaps(const BatchView<T>& a, const BatchView<U>& b) {
    const MatrixView<T> fa(a.data, 1, (a.batch - 1) * a.batch_stride + (a.rows - 1) * a.row_stride + a.cols);
    const MatrixView<U> fb(b.data, 1, (b.batch - 1) * b.batch_stride + (b.rows - 1) * b.row_stride + b.cols);
    return overlaps(fa, fb);
}

}  // namespace mha::detail
