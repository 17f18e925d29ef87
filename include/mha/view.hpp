// Non-owning row-major matrix views with a row stride (in elements), batches of them, 4-D head views, and how
// an operand view is read (Trans).
// Element (i, j) of a view lives at data[i * stride + j]; stride >= cols.
// C++17 like every public header, so programs on an older standard can include it.
#pragma once
#include <cstddef>
#include <type_traits>

namespace mha {

namespace detail {
// True when T is const U and U is not already const: the one conversion views allow.
template <class T, class U>
inline constexpr bool adds_const_v = !std::is_same_v<T, U> && std::is_same_v<T, const U>;
}  // namespace detail

template <class T>
struct MatrixView {
    T* data = nullptr;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::size_t stride = 0;  // elements between the starts of consecutive rows

    constexpr MatrixView() = default;
    constexpr MatrixView(T* d, std::size_t r, std::size_t c, std::size_t s) : data(d), rows(r), cols(c), stride(s) {}
    constexpr MatrixView(T* d, std::size_t r, std::size_t c) : data(d), rows(r), cols(c), stride(c) {}
    // A view of mutable data converts to a view of const data (and nothing else converts).
    // enable_if rather than `requires`: the public headers stay C++17.
    template <class U, std::enable_if_t<detail::adds_const_v<T, U>, int> = 0>
    constexpr MatrixView(const MatrixView<U>& o)  // NOLINT(google-explicit-constructor)
        : data(o.data), rows(o.rows), cols(o.cols), stride(o.stride) {}

    constexpr T& operator()(std::size_t i, std::size_t j) const { return data[i * stride + j]; }
    constexpr T* row(std::size_t i) const { return data + i * stride; }
    // Columns [c0, c0 + n) of every row: a head's slice, no copy.
    constexpr MatrixView columns(std::size_t c0, std::size_t n) const { return {data + c0, rows, n, stride}; }
    // Rows [r0, r0 + n).
    constexpr MatrixView row_block(std::size_t r0, std::size_t n) const { return {data + r0 * stride, n, cols, stride}; }
};

using Matrix = MatrixView<float>;
using ConstMatrix = MatrixView<const float>;

// A batch of matrices [batch, rows, cols]: matrix b starts at data + b * batch_stride.
template <class T>
struct BatchView {
    T* data = nullptr;
    std::size_t batch = 0;
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::size_t row_stride = 0;
    std::size_t batch_stride = 0;

    constexpr BatchView() = default;
    // Contiguous [batch, rows, cols].
    constexpr BatchView(T* d, std::size_t b, std::size_t r, std::size_t c)
        : data(d), batch(b), rows(r), cols(c), row_stride(c), batch_stride(r * c) {}
    constexpr BatchView(T* d, std::size_t b, std::size_t r, std::size_t c, std::size_t rs, std::size_t bs)
        : data(d), batch(b), rows(r), cols(c), row_stride(rs), batch_stride(bs) {}
    template <class U, std::enable_if_t<detail::adds_const_v<T, U>, int> = 0>
    constexpr BatchView(const BatchView<U>& o)  // NOLINT(google-explicit-constructor)
        : data(o.data), batch(o.batch), rows(o.rows), cols(o.cols), row_stride(o.row_stride), batch_stride(o.batch_stride) {}

    constexpr MatrixView<T> operator[](std::size_t b) const { return {data + b * batch_stride, rows, cols, row_stride}; }
};

using Batch = BatchView<float>;
using ConstBatch = BatchView<const float>;

// A 4-D strided view [batch, heads, rows, dim]: element (b, h, i, c) at
// data[b·batch_stride + h·head_stride + i·row_stride + c]. Rows are contiguous (dim elements).
template <class T>
struct HeadsView {
    T* data = nullptr;
    std::size_t batch = 0, heads = 0, rows = 0, dim = 0;
    std::size_t batch_stride = 0, head_stride = 0, row_stride = 0;

    constexpr HeadsView() = default;
    constexpr HeadsView(T* p, std::size_t b, std::size_t h, std::size_t l, std::size_t d, std::size_t bs, std::size_t hs,
                        std::size_t rs)
        : data(p), batch(b), heads(h), rows(l), dim(d), batch_stride(bs), head_stride(hs), row_stride(rs) {}
    template <class U, std::enable_if_t<detail::adds_const_v<T, U>, int> = 0>
    constexpr HeadsView(const HeadsView<U>& o)  // NOLINT(google-explicit-constructor)
        : data(o.data), batch(o.batch), heads(o.heads), rows(o.rows), dim(o.dim), batch_stride(o.batch_stride),
          head_stride(o.head_stride), row_stride(o.row_stride) {}

    // Contiguous [B, H, L, d] (PyTorch's SDPA layout).
    static constexpr HeadsView bhld(T* p, std::size_t b, std::size_t h, std::size_t l, std::size_t d) {
        return {p, b, h, l, d, h * l * d, l * d, d};
    }
    // Contiguous [B, L, H, d], i.e. [B, L, H·d] with head h in columns [h·d, h·d + d).
    static constexpr HeadsView blhd(T* p, std::size_t b, std::size_t l, std::size_t h, std::size_t d) {
        return {p, b, h, l, d, l * h * d, d, h * d};
    }
    // Head h of batch b as a [rows, dim] matrix.
    constexpr MatrixView<T> head(std::size_t b, std::size_t h) const {
        return {data + b * batch_stride + h * head_stride, rows, dim, row_stride};
    }
};

using Heads = HeadsView<float>;
using ConstHeads = HeadsView<const float>;

enum class Trans { no, yes };  // an operand view X read as op(X) = X or Xᵀ

}  // namespace mha
