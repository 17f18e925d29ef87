// The extension module mha._mha: pybind11 bindings of MultiheadAttention, scaled_dot_product_attention and
// KVCache on numpy arrays. Arrays are read in place as strided views whenever the library can address them
// (unit stride along the last axis, positive strides that are whole elements); other layouts (F-order,
// negative or zero strides) are copied once, and input_copies() counts those copies so the tests can check that the
// common layouts are not copied. Activations are float32, or 16-bit (float16, or uint16 arrays holding
// bfloat16 bits) for the library's HalfAttentionInputs forward. Outputs are written in place (a fresh C-order array, or `out`).
// mha::invalid_argument becomes ValueError carrying the library's message; wrong Python types or dtypes are
// TypeError. The GIL is released while the library computes, so Python threads run forwards in parallel.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mha/mha.hpp"

namespace py = pybind11;

// x as a Python int through __index__ (numpy's integers too), or a null object for a float, a bool (True is not
// sequence 1) or anything without __index__. Both integer readers below start here.
namespace {
py::object index_of(py::handle x) {
    if (!x || PyFloat_Check(x.ptr()) || PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr())) return {};
    py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(x.ptr()));
    if (!i) throw py::error_already_set();
    return i;
}
}  // namespace

// A count, size, index or id argument: a Python int (or any object with __index__, as numpy's integers) >= 0.
// pybind's own std::size_t caster reports a negative value as a TypeError ("incompatible function arguments");
// here it is a ValueError, as the library's own refusals. A non-integer is still a TypeError.
struct Count {
    std::size_t value = 0;
    operator std::size_t() const noexcept { return value; }  // NOLINT(google-explicit-constructor)
};

namespace pybind11::detail {
template <>
struct type_caster<Count> {
    PYBIND11_TYPE_CASTER(Count, const_name("int"));
    bool load(handle src, bool) {
        const object i = index_of(src);
        if (!i) return false;  // pybind's TypeError
        const object zero = reinterpret_steal<object>(PyLong_FromLong(0));
        const int negative = PyObject_RichCompareBool(i.ptr(), zero.ptr(), Py_LT);
        if (negative < 0) throw error_already_set();
        if (negative) throw value_error("sizes, counts, ids and positions must be >= 0, got " + std::string(py::str(src)));
        const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
        if (PyErr_Occurred() || v > SIZE_MAX) {
            PyErr_Clear();
            throw value_error("an int argument is out of range (above 2^64 - 1): " + std::string(py::str(src)));
        }
        value.value = static_cast<std::size_t>(v);
        return true;
    }
    static handle cast(Count c, return_value_policy, handle) { return PyLong_FromSize_t(c.value); }
};
}  // namespace pybind11::detail

namespace {

std::atomic<std::size_t> g_input_copies{0};

[[noreturn]] void type_error(const std::string& msg) { throw py::type_error(msg); }
[[noreturn]] void value_error(const std::string& msg) { throw py::value_error(msg); }

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }
std::string dtype_name(const py::array& a) { return py::str(a.dtype()); }

// x as a long long: an int (or __index__) in range, else TypeError / ValueError naming `what`.
long long int_of(py::handle x, const std::string& what) {
    const py::object i = index_of(x);
    if (!i) type_error(what + " must be an int, got " + type_name(x));
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0) value_error(what + " is out of range: " + std::string(py::str(x)));
    return v;
}

// "(2, 3)"; "(4,)" for one dimension, as numpy prints shapes.
template <class T>
std::string shape_string(const std::vector<T>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    s += shape.size() == 1 ? ",)" : ")";
    return s;
}
std::string shape_string(const py::array& a) {
    return shape_string(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

py::array require_ndarray(py::handle h, const char* name) {
    if (!py::isinstance<py::array>(h)) type_error(std::string(name) + " must be a numpy.ndarray, got " + type_name(h));
    return py::reinterpret_borrow<py::array>(h);
}

void check_rank(const py::array& a, const char* name, int lo, int hi) {
    if (a.ndim() < lo || a.ndim() > hi) {
        value_error(std::string(name) + " must have " + std::to_string(lo) + (lo == hi ? "" : " or " + std::to_string(hi)) +
                    " dimensions, got " + std::to_string(a.ndim()) + " (shape " + shape_string(a) + ")");
    }
}

// True when the library can read the array in place: whole-element, positive strides and contiguous rows. A zero
// stride (a broadcast: expand(), np.broadcast_to) is not: the views below take a zero stride for a size-1 axis.
bool addressable(const py::array& a) {
    const py::ssize_t item = a.itemsize();
    if (reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(item) != 0) return false;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
        if (a.shape(i) <= 1) continue;
        if (a.strides(i) <= 0 || a.strides(i) % item != 0) return false;
    }
    return a.ndim() == 0 || a.shape(a.ndim() - 1) <= 1 || a.strides(a.ndim() - 1) == item;
}

// A float32 input, in place when addressable, else one C-order copy (counted).
py::array float_input(py::handle h, const char* name, int lo, int hi) {
    py::array a = require_ndarray(h, name);
    if (!a.dtype().is(py::dtype::of<float>())) type_error(std::string(name) + " must be float32, got " + dtype_name(a));
    check_rank(a, name, lo, hi);
    if (!addressable(a)) {
        a = py::array_t<float, py::array::c_style>::ensure(a);
        if (!a) throw py::error_already_set();
        ++g_input_copies;
    }
    return a;
}

// An activation array of the query's element type (float32, float16, or uint16 holding bfloat16 bits), in place
// when addressable, else one C-order copy (counted).
py::array activation_input(py::handle h, const char* name, int lo, int hi, const py::dtype& want) {
    py::array a = require_ndarray(h, name);
    if (!a.dtype().is(want)) {
        type_error(std::string(name) + " must be " + std::string(py::str(py::dtype(want))) + " like the query, got " + dtype_name(a));
    }
    check_rank(a, name, lo, hi);
    if (!addressable(a)) {
        a = py::array::ensure(a, py::array::c_style);
        if (!a) throw py::error_already_set();
        ++g_input_copies;
    }
    return a;
}

// Element stride of axis i; a size-1 axis gets `fallback` (its stride is never used to reach an element).
std::size_t stride_of(const py::array& a, int i, std::size_t fallback) {
    return a.shape(i) <= 1 ? fallback : static_cast<std::size_t>(a.strides(i) / a.itemsize());
}
std::size_t dim(const py::array& a, int i) { return static_cast<std::size_t>(a.shape(i)); }

// A [B, L, C] view of a rank-3 array in batch-first ([B, L, C]) or sequence-first ([L, B, C]) order, or of a
// rank-2 unbatched [L, C] array (B = 1).
template <class T>
mha::BatchView<T> batch_view(const py::array& a, T* data, bool batch_first) {
    if (a.ndim() == 2) {
        const std::size_t rows = dim(a, 0), cols = dim(a, 1);
        const std::size_t rs = stride_of(a, 0, cols);
        return {data, 1, rows, cols, rs, rows * rs};
    }
    const int bax = batch_first ? 0 : 1, lax = batch_first ? 1 : 0;
    const std::size_t batch = dim(a, bax), rows = dim(a, lax), cols = dim(a, 2);
    std::size_t rs = stride_of(a, lax, 0), bs = stride_of(a, bax, 0);
    // Size-1 axes: strides that keep rows apart, as the output check wants.
    if (rs == 0) rs = (batch > 1 && bs == cols) ? cols * batch : cols;
    if (bs == 0) bs = rows * rs;
    return {data, batch, rows, cols, rs, bs};
}

// A 4-D [B, H, L, d] view.
template <class T>
mha::HeadsView<T> heads_view(const py::array& a, T* data) {
    const std::size_t d = dim(a, 3), l = dim(a, 2), h = dim(a, 1);
    const std::size_t rs = stride_of(a, 2, d), hs = stride_of(a, 1, l * rs), bs = stride_of(a, 0, h * hs);
    return {data, dim(a, 0), h, l, d, bs, hs, rs};
}

// A writable float32 output array given by the caller: never copied, so its layout must be addressable.
py::array out_array(py::handle h, const char* name, const std::vector<py::ssize_t>& shape,
                    const py::dtype& want = py::dtype::of<float>()) {
    py::array a = require_ndarray(h, name);
    if (!a.dtype().is(want)) type_error(std::string(name) + " must be " + std::string(py::str(py::dtype(want))) + ", got " + dtype_name(a));
    if (!a.writeable()) value_error(std::string(name) + " is read-only");
    bool same = a.ndim() == static_cast<py::ssize_t>(shape.size());
    for (std::size_t i = 0; same && i < shape.size(); ++i) same = a.shape(static_cast<py::ssize_t>(i)) == shape[i];
    if (!same) value_error(std::string(name) + " has shape " + shape_string(a) + ", expected " + shape_string(shape));
    if (!addressable(a)) {
        value_error(std::string(name) + " must have positive strides and a contiguous last axis (it is written "
                                        "in place, never copied)");
    }
    return a;
}

// A mask: bool or uint8 (nonzero = masked) read in place as bytes, or float32 added to the scores.
// The library reads masks contiguous: other layouts are copied (counted).
struct Mask {
    py::object array;  // keeps the data alive (py::object: a default py::array would allocate one)
    mha::MaskView view;
};

Mask mask_input(py::handle h, const char* name, int lo, int hi) {
    Mask m;
    if (h.is_none()) return m;
    py::array a = require_ndarray(h, name);
    check_rank(a, name, lo, hi);
    const bool is_bool = a.dtype().is(py::dtype::of<bool>()) || a.dtype().is(py::dtype::of<std::uint8_t>());
    bool is_float = a.dtype().is(py::dtype::of<float>());
    if (!is_bool && !is_float && (a.dtype().is(py::dtype::of<double>()) || a.dtype().is(py::dtype("float16")))) {
        // PyTorch accepts any floating mask: converted to float32 once (counted like a layout copy).
        a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
        if (!a) throw py::error_already_set();
        ++g_input_copies;
        is_float = true;
    }
    if (!is_bool && !is_float) {
        type_error(std::string(name) + " must be bool, uint8 or floating (float16, float32, float64), got " + dtype_name(a));
    }
    if (!(a.flags() & py::array::c_style)) {
        a = is_float ? py::array(py::array_t<float, py::array::c_style>::ensure(a))
                     : py::array(py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(a));
        if (!a) throw py::error_already_set();
        ++g_input_copies;
    }
    // Rank 1 (an unbatched key_padding_mask [Lk]) is a [1, Lk] mask.
    std::size_t s[3] = {1, 1, 1};
    const int rank = a.ndim() == 1 ? 2 : static_cast<int>(a.ndim());
    if (a.ndim() == 1) {
        s[1] = dim(a, 0);
    } else {
        for (int i = 0; i < rank; ++i) s[i] = dim(a, i);
    }
    if (is_float) {
        const auto* p = static_cast<const float*>(a.data());
        m.view = rank == 2 ? mha::MaskView::additive(p, s[0], s[1]) : mha::MaskView::additive(p, s[0], s[1], s[2]);
    } else {
        const auto* p = static_cast<const std::uint8_t*>(a.data());
        m.view = rank == 2 ? mha::MaskView::boolean(p, s[0], s[1]) : mha::MaskView::boolean(p, s[0], s[1], s[2]);
    }
    m.array = std::move(a);
    return m;
}

mha::Backend parse_backend(const std::string& s) {
    if (s == "simd") return mha::Backend::simd;
    if (s == "scalar") return mha::Backend::scalar;
    value_error("backend must be 'simd' or 'scalar', got '" + s + "'");
}
mha::Impl parse_impl(const std::string& s) {
    if (s == "auto") return mha::Impl::automatic;
    if (s == "materialized") return mha::Impl::materialized;
    if (s == "fused") return mha::Impl::fused;
    value_error("impl must be 'auto', 'materialized' or 'fused', got '" + s + "'");
}
mha::CausalAlignment parse_alignment(const std::string& s) {
    if (s == "top_left") return mha::CausalAlignment::top_left;
    if (s == "bottom_right") return mha::CausalAlignment::bottom_right;
    value_error("causal_alignment must be 'top_left' or 'bottom_right', got '" + s + "'");
}
mha::DataType parse_compute(const std::string& s) {
    if (s == "f32") return mha::DataType::f32;
    if (s == "bf16") return mha::DataType::bf16;
    value_error("compute must be 'f32' or 'bf16', got '" + s + "'");
}
int parse_threads(int threads) {
    if (threads < 0) value_error("threads must be >= 0 (0: all cores), got " + std::to_string(threads));
    return threads;
}

// ---- KVCache ---------------------------------------------------------------------------------------------
// The cache plus a flag that refuses a second concurrent user (the library's cache is not synchronized, and
// with the GIL released two Python threads could otherwise reach it at once).
struct PyKVCache {
    mha::KVCache cache;
    std::atomic<bool> busy{false};

    PyKVCache(std::size_t b, std::size_t h, std::size_t d, std::size_t cap, mha::DataType type, float ks, float vs)
        : cache(b, h, d, cap, type, ks, vs) {}
};

// Refuses a second concurrent user of a cache (KVCache, PagedKVCache) for the guard's lifetime.
template <class Cache>
class InUse {
public:
    InUse(Cache& c, const char* what) : c_(c) {
        if (c_.busy.exchange(true)) value_error(std::string("the ") + what + " is in use by another call (one call at a time)");
    }
    ~InUse() { c_.busy.store(false); }
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

private:
    Cache& c_;
};

struct CacheUse : InUse<PyKVCache> {
    explicit CacheUse(PyKVCache& c) : InUse(c, "KVCache") {}
};

// ---- PagedKVCache ----------------------------------------------------------------------------------------
struct PyPagedKVCache {
    mha::PagedKVCache cache;
    std::atomic<bool> busy{false};

    PyPagedKVCache(std::size_t n, std::size_t bs, std::size_t h, std::size_t d, mha::DataType type, float ks, float vs)
        : cache(n, bs, h, d, type, ks, vs) {}
};

struct PagedUse : InUse<PyPagedKVCache> {
    explicit PagedUse(PyPagedKVCache& c) : InUse(c, "PagedKVCache") {}
};

// Sequence s's keys or values as a float32 copy [Hkv, length, d].
py::array paged_rows(const PyPagedKVCache& c, std::size_t s, bool values) {
    const mha::PagedKVCache& pc = c.cache;
    const std::size_t H = pc.kv_heads(), L = pc.length(s), d = pc.head_dim();
    py::array_t<float> a({static_cast<py::ssize_t>(H), static_cast<py::ssize_t>(L), static_cast<py::ssize_t>(d)});
    float* p = a.mutable_data();
    for (std::size_t h = 0; h < H; ++h) {
        const mha::Matrix dst(p + h * L * d, L, d);
        values ? pc.copy_values(s, h, dst) : pc.copy_keys(s, h, dst);
    }
    return a;
}

mha::DataType parse_kv_dtype(const std::string& dtype) {
    for (mha::DataType t : {mha::DataType::f32, mha::DataType::bf16, mha::DataType::f16, mha::DataType::int8, mha::DataType::fp8_e4m3,
                            mha::DataType::fp8_e5m2})
        if (dtype == mha::data_type_name(t)) return t;
    value_error("dtype must be 'f32', 'bf16', 'f16', 'int8', 'fp8_e4m3' or 'fp8_e5m2', got '" + dtype + "'");
    return mha::DataType::f32;
}

std::vector<std::size_t> sizes_of(py::handle h, const char* name) {
    std::vector<std::size_t> out;
    for (auto item : py::iter(h)) {
        const long long v = int_of(item, std::string(name) + "[" + std::to_string(out.size()) + "]");
        if (v < 0) value_error(std::string(name) + " must hold values >= 0, got " + std::to_string(v));
        out.push_back(static_cast<std::size_t>(v));
    }
    return out;
}

// A read-only [B, Hkv, capacity, d] numpy view of the cache's keys or values that keeps the cache alive: float32,
// float16, or uint16 holding bfloat16 bits, as the cache's element type. The 8-bit types (whose values need
// their scales): a float32 copy, dequantized exactly, rows at or past length(b) zero.
py::array cache_view(py::object self, bool keys) {
    auto& c = self.cast<PyKVCache&>();
    const mha::KVCache& kv = c.cache;
    const mha::DataType t = kv.element_type();
    if (mha::data_type_bytes(t) == 1) {
        CacheUse u(c);  // a copy of consistent lengths (a forward in another thread appends)
        const std::size_t B = kv.batch(), H = kv.kv_heads(), L = kv.capacity(), d = kv.head_dim();
        py::array_t<float> a({B, H, L, d});
        auto* out = a.mutable_data();
        std::fill(out, out + B * H * L * d, 0.0f);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h) {
                const mha::Matrix dst(out + (b * H + h) * L * d, kv.length(b), d);
                if (keys)
                    kv.copy_keys(b, h, dst);
                else
                    kv.copy_values(b, h, dst);
            }
        return a;
    }
    const py::dtype dtype = t == mha::DataType::f32 ? py::dtype::of<float>()
                            : t == mha::DataType::f16 ? py::dtype("float16")
                                                      : py::dtype::of<std::uint16_t>();
    const auto f = static_cast<py::ssize_t>(mha::data_type_bytes(t));
    const auto B = static_cast<py::ssize_t>(kv.batch()), H = static_cast<py::ssize_t>(kv.kv_heads()),
               L = static_cast<py::ssize_t>(kv.capacity()), d = static_cast<py::ssize_t>(kv.head_dim());
    py::array a(dtype, {B, H, L, d}, {H * L * d * f, L * d * f, d * f, f}, keys ? kv.key_storage() : kv.value_storage(), self);
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
}

// ---- MultiheadAttention ----------------------------------------------------------------------------------

// The score modifiers' keywords (mha/attention.hpp's ScoreModifiers) for H heads: window=(left, right) (None or
// -1: unbounded on that side), softcap (None or > 0), sinks [H], alibi_slopes [H] or "standard". The arrays are
// copied into `store`; the returned view points at them.
struct ModifierStore {
    std::vector<float> sinks, slopes;
};
mha::ScoreModifiers modifiers_of(py::handle window, py::handle softcap, py::handle sinks, py::handle alibi_slopes, std::size_t H,
                                 ModifierStore& store) {
    mha::ScoreModifiers m;
    if (!window.is_none()) {
        if (!py::isinstance<py::sequence>(window) || py::isinstance<py::str>(window) || py::len(window) != 2)
            value_error("window must be a pair (left, right); None or -1 leaves that side unbounded");
        const py::sequence w = py::reinterpret_borrow<py::sequence>(window);
        auto side = [&](py::handle x, const char* name) -> long long {
            if (x.is_none()) return -1;
            const long long v = int_of(x, std::string("window ") + name);
            if (v < -1) value_error(std::string("window ") + name + " must be >= -1 (-1: unbounded), got " + std::to_string(v));
            return v;
        };
        m.window_left = side(w[0], "left"), m.window_right = side(w[1], "right");
    }
    if (!softcap.is_none()) {
        m.softcap = py::cast<float>(softcap);
        if (!(m.softcap > 0.0f) || !std::isfinite(m.softcap)) value_error("softcap must be a positive finite number, got " + std::to_string(m.softcap));
    }
    auto per_head = [&](py::handle h, const char* name, std::vector<float>& dst) {
        auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(h);
        if (!a) type_error(std::string(name) + " must be an array of " + std::to_string(H) + " floats");
        if (a.ndim() != 1 || static_cast<std::size_t>(a.shape(0)) != H)
            value_error(std::string(name) + " must have shape [" + std::to_string(H) + "] (one per query head), got " +
                        shape_string(a));
        dst.assign(a.data(), a.data() + H);
        for (std::size_t h = 0; h < H; ++h)
            if (!std::isfinite(dst[h])) value_error(std::string(name) + "[" + std::to_string(h) + "] = " + std::to_string(dst[h]) + " is not finite");
    };
    if (!sinks.is_none()) per_head(sinks, "sinks", store.sinks), m.sinks = store.sinks.data();
    if (!alibi_slopes.is_none()) {
        if (py::isinstance<py::str>(alibi_slopes)) {
            if (py::cast<std::string>(alibi_slopes) != "standard")
                value_error("alibi_slopes must be an array [H] or \"standard\", got '" + py::cast<std::string>(alibi_slopes) + "'");
            store.slopes = mha::alibi_standard_slopes(H);
        } else {
            per_head(alibi_slopes, "alibi_slopes", store.slopes);
        }
        m.alibi_slopes = store.slopes.data();
    }
    return m;
}

struct PyLayer {
    mha::MultiheadAttention layer;
    std::size_t heads;  // H, for the shape of per-head weights
};

const float* weight_ptr(py::handle h, const char* name, std::vector<std::size_t> shape, std::vector<py::array>& keep) {
    if (h.is_none()) return nullptr;
    // Weights are packed (copied) by the constructor anyway: any real dtype is accepted and converted.
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(h);
    if (!a) {
        PyErr_Clear();
        type_error(std::string(name) + " must be an array of numbers, got " + type_name(h));
    }
    bool same = a.ndim() == static_cast<py::ssize_t>(shape.size());
    for (std::size_t i = 0; same && i < shape.size(); ++i) same = dim(a, static_cast<int>(i)) == shape[i];
    if (!same) value_error(std::string(name) + " has shape " + shape_string(a) + ", expected " + shape_string(shape));
    keep.push_back(a);
    return a.data();
}

std::unique_ptr<PyLayer> make_layer(std::size_t E, std::size_t H, std::size_t Hkv, std::size_t d, std::size_t kdim,
                                    std::size_t vdim, std::optional<float> rope_theta, std::size_t rope_dims,
                                    const std::string& rope_style, const std::string& compute, const py::dict& w,
                                    py::handle window, py::handle softcap, py::handle sinks, py::handle alibi_slopes) {
    mha::AttentionConfig cfg;
    cfg.embed_dim = E;
    cfg.num_heads = H;
    cfg.num_kv_heads = Hkv;
    cfg.head_dim = d;
    cfg.kdim = kdim;
    cfg.vdim = vdim;
    cfg.compute = parse_compute(compute);
    if (rope_theta) {
        mha::RopeStyle style = mha::RopeStyle::half;
        if (rope_style == "interleaved") {
            style = mha::RopeStyle::interleaved;
        } else if (rope_style != "half") {
            value_error("rope_style must be 'half' or 'interleaved', got '" + rope_style + "'");
        }
        cfg.rope = mha::RopeConfig{*rope_theta, rope_dims, style};
    } else if (rope_dims != 0 || rope_style != "half") {
        value_error("rope_dims and rope_style need rope_theta");
    }
    // Shapes to check the arrays against (the library takes bare pointers); the library checks the rest.
    if (E == 0 || H == 0) value_error("embed_dim and num_heads must be positive");
    const std::size_t hkv = Hkv ? Hkv : H;
    if (d == 0 && E % H != 0) {
        value_error("embed_dim " + std::to_string(E) + " is not divisible by num_heads " + std::to_string(H) +
                    " (give head_dim)");
    }
    const std::size_t hd = d ? d : E / H, qd = H * hd, kvd = hkv * hd;
    const std::size_t kd = kdim ? kdim : E, vd = vdim ? vdim : E;
    ModifierStore mods;  // copied by the constructor
    cfg.modifiers = modifiers_of(window, softcap, sinks, alibi_slopes, H, mods);
    auto get = [&](const char* key) -> py::handle { return w.contains(key) ? py::handle(w[key]) : py::handle(py::none()); };

    std::vector<py::array> keep;
    mha::AttentionWeights aw;
    aw.in_proj_weight = weight_ptr(get("in_proj_weight"), "in_proj_weight", {qd + 2 * kvd, E}, keep);
    aw.in_proj_bias = weight_ptr(get("in_proj_bias"), "in_proj_bias", {qd + 2 * kvd}, keep);
    aw.out_proj_weight = weight_ptr(get("out_proj_weight"), "out_proj_weight", {E, qd}, keep);
    aw.out_proj_bias = weight_ptr(get("out_proj_bias"), "out_proj_bias", {E}, keep);
    aw.q_proj_weight = weight_ptr(get("q_proj_weight"), "q_proj_weight", {qd, E}, keep);
    aw.k_proj_weight = weight_ptr(get("k_proj_weight"), "k_proj_weight", {kvd, kd}, keep);
    aw.v_proj_weight = weight_ptr(get("v_proj_weight"), "v_proj_weight", {kvd, vd}, keep);
    aw.q_proj_bias = weight_ptr(get("q_proj_bias"), "q_proj_bias", {qd}, keep);
    aw.k_proj_bias = weight_ptr(get("k_proj_bias"), "k_proj_bias", {kvd}, keep);
    aw.v_proj_bias = weight_ptr(get("v_proj_bias"), "v_proj_bias", {kvd}, keep);
    aw.norm_weight = weight_ptr(get("norm_weight"), "norm_weight", {E}, keep);
    aw.norm_bias = weight_ptr(get("norm_bias"), "norm_bias", {E}, keep);
    for (auto item : w) {
        static const char* known[] = {"in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias",
                                      "q_proj_weight",  "k_proj_weight", "v_proj_weight",   "q_proj_bias",
                                      "k_proj_bias",    "v_proj_bias",   "norm_weight",     "norm_bias"};
        const std::string key = py::str(item.first);
        bool found = false;
        for (const char* k : known) found = found || key == k;
        if (!found) type_error("unknown weight '" + key + "'");
    }
    py::gil_scoped_release release;  // packing large weights takes a while
    return std::unique_ptr<PyLayer>(new PyLayer{mha::MultiheadAttention(aw, cfg), H});
}


// A StepPlan (mha/step_plan.hpp): made once per step, given to every layer's call with plan=.
struct PyStepPlan {
    mha::StepPlan plan;
};

py::tuple layer_forward(const PyLayer& self, py::handle query, py::handle key, py::handle value, py::handle key_padding_mask,
                        bool need_weights, py::handle attn_mask, bool average_attn_weights, bool is_causal,
                        bool batch_first, const std::string& causal_alignment, std::size_t position_offset,
                        py::handle positions, std::optional<float> norm_eps, int threads, const std::string& backend,
                        const std::string& impl, py::handle out, py::handle cache_arg, py::handle seq_ids, py::handle q_lens,
                        py::handle plan_arg, py::handle seq_lens) {
    if (!seq_lens.is_none()) {
        // Independent sequences packed [T, E] without padding (MultiheadAttention::forward_varlen).
        if (!cache_arg.is_none() || !plan_arg.is_none() || !seq_ids.is_none() || !q_lens.is_none())
            value_error("seq_lens (a packed batch of independent sequences) takes no cache, plan, seq_ids or q_lens");
        if (!key.is_none() && !key.is(query)) value_error("key must be None or the query with seq_lens (self-attention)");
        if (!value.is_none() && !value.is(key.is_none() ? query : key)) value_error("value must be None or the query with seq_lens");
        if (!key_padding_mask.is_none() || !attn_mask.is_none() || need_weights || !positions.is_none() || position_offset != 0)
            value_error("masks, need_weights and positions do not apply with seq_lens (each sequence attends over its own tokens)");
        const mha::Backend varlen_backend = parse_backend(backend);
        const py::array x = float_input(query, "query", 2, 2);
        const std::vector<std::size_t> lens = sizes_of(seq_lens, "seq_lens");
        std::vector<std::size_t> starts(lens.size() + 1, 0);
        for (std::size_t i = 0; i < lens.size(); ++i) {
            starts[i + 1] = starts[i] + lens[i];
            if (starts[i + 1] < starts[i]) value_error("seq_lens overflow");
        }
        const std::size_t T = dim(x, 0), E = self.layer.embed_dim();
        const std::vector<py::ssize_t> oshape = {static_cast<py::ssize_t>(T), static_cast<py::ssize_t>(E)};
        py::array o = out.is_none() ? py::array(py::array_t<float>(oshape)) : out_array(out, "out", oshape);
        const mha::ConstMatrix xv(static_cast<const float*>(x.data()), T, dim(x, 1), stride_of(x, 0, dim(x, 1)));
        const mha::Matrix ov(static_cast<float*>(o.mutable_data()), T, E, stride_of(o, 0, E));
        const int th = parse_threads(threads);
        {
            py::gil_scoped_release release;
            self.layer.forward_varlen(xv, ov, starts.data(), lens.size(), is_causal, th, varlen_backend);
        }
        return py::make_tuple(o, py::none());
    }
    if (!plan_arg.is_none() && !py::isinstance<PyStepPlan>(plan_arg)) type_error("plan must be a StepPlan, got " + type_name(plan_arg));
    if (!plan_arg.is_none() && (cache_arg.is_none() || !py::isinstance<PyPagedKVCache>(cache_arg)))
        value_error("plan needs cache=PagedKVCache");
    if (!cache_arg.is_none() && py::isinstance<PyPagedKVCache>(cache_arg)) {
        // A serving step: x [T, E] float32, the next q_lens[i] tokens of sequence seq_ids[i], packed; or the
        // sequences of a StepPlan made once for every layer.
        const PyStepPlan* plan = plan_arg.is_none() ? nullptr : &plan_arg.cast<const PyStepPlan&>();
        if (plan != nullptr && (!seq_ids.is_none() || !q_lens.is_none()))
            value_error("give seq_ids and q_lens, or a plan (which holds them), not both");
        if (plan != nullptr && threads != 0) value_error("threads come from the plan (StepPlan(..., threads=N))");
        if (plan == nullptr && (seq_ids.is_none() || q_lens.is_none())) value_error("a PagedKVCache step needs seq_ids and q_lens");
        if (!key.is_none() && !key.is(query)) value_error("key must be None with a PagedKVCache (the cache holds the keys)");
        if (!value.is_none() && !value.is(query)) value_error("value must be None with a PagedKVCache");
        if (!key_padding_mask.is_none() || !attn_mask.is_none() || need_weights || !positions.is_none() || position_offset != 0)
            value_error("masks, need_weights and positions do not apply to a PagedKVCache step (causal over each sequence's keys)");
        const py::array x = float_input(query, "query", 2, 2);
        std::vector<std::size_t> ids, ql;
        if (plan == nullptr) {
            ids = sizes_of(seq_ids, "seq_ids"), ql = sizes_of(q_lens, "q_lens");
            if (ids.size() != ql.size())
                value_error("seq_ids has " + std::to_string(ids.size()) + " entries but q_lens has " + std::to_string(ql.size()));
        }
        const std::size_t T = dim(x, 0), E = self.layer.embed_dim();
        const std::vector<py::ssize_t> oshape = {static_cast<py::ssize_t>(T), static_cast<py::ssize_t>(E)};
        py::array o;
        if (out.is_none()) {
            o = py::array_t<float>(oshape);
        } else {
            o = out_array(out, "out", oshape);
        }
        const mha::ConstMatrix xv(static_cast<const float*>(x.data()), T, dim(x, 1), stride_of(x, 0, dim(x, 1)));
        const mha::Matrix ov(static_cast<float*>(o.mutable_data()), T, E, stride_of(o, 0, E));
        auto& pc = cache_arg.cast<PyPagedKVCache&>();
        const int th = parse_threads(threads);
        const mha::Backend step_backend = parse_backend(backend);
        {
            PagedUse use(pc);
            py::gil_scoped_release release;
            if (plan != nullptr)
                self.layer.forward_step(xv, ov, pc.cache, plan->plan, step_backend);
            else
                self.layer.forward_step(xv, ov, pc.cache, ids.data(), ql.data(), ids.size(), th, step_backend);
        }
        return py::make_tuple(o, py::none());
    }
    if (!seq_ids.is_none() || !q_lens.is_none()) value_error("seq_ids and q_lens need cache=PagedKVCache");
    PyKVCache* cache = nullptr;
    if (!cache_arg.is_none()) {
        if (!py::isinstance<PyKVCache>(cache_arg)) type_error("cache must be a KVCache or a PagedKVCache, got " + type_name(cache_arg));
        cache = &cache_arg.cast<PyKVCache&>();
    }
    // float32 activations, or 16-bit ones (float16, or uint16 arrays holding bfloat16 bits) for the library's
    // HalfAttentionInputs forward, which widens them exactly and rounds the output to the same type.
    const py::array q0 = require_ndarray(query, "query");
    const py::dtype f32 = py::dtype::of<float>(), f16("float16"), u16 = py::dtype::of<std::uint16_t>();
    const bool is_f16 = q0.dtype().is(f16), is_bf16 = q0.dtype().is(u16), half = is_f16 || is_bf16;
    if (!half && !q0.dtype().is(f32)) {
        type_error("query must be float32 (or float16, or uint16 holding bfloat16 bits), got " + dtype_name(q0));
    }
    const py::dtype dt = q0.dtype();
    const py::array q = activation_input(query, "query", 2, 3, dt);
    const bool unbatched = q.ndim() == 2;
    // std::optional: a default-constructed py::array is not empty but a new zero-length array.
    std::optional<py::array> k, v;
    if (!key.is_none() && !key.is(query)) {
        k = activation_input(key, "key", 2, 3, dt);
        if (k->ndim() != q.ndim()) value_error("key has " + std::to_string(k->ndim()) + " dimensions but query has " + std::to_string(q.ndim()));
    }
    if (!value.is_none() && !value.is(key.is_none() ? query : key)) {
        v = activation_input(value, "value", 2, 3, dt);
        if (v->ndim() != q.ndim()) value_error("value has " + std::to_string(v->ndim()) + " dimensions but query has " + std::to_string(q.ndim()));
    }
    const Mask kpm = mask_input(key_padding_mask, "key_padding_mask", unbatched ? 1 : 2, unbatched ? 1 : 2);
    const Mask am = mask_input(attn_mask, "attn_mask", 2, 3);

    mha::AttentionInputs in;
    mha::HalfAttentionInputs in16;
    if (half) {
        using U = const std::uint16_t;
        in16.type = is_bf16 ? mha::DataType::bf16 : mha::DataType::f16;
        in16.query = batch_view(q, static_cast<U*>(q.data()), batch_first);
        if (k) in16.key = batch_view(*k, static_cast<U*>(k->data()), batch_first);
        if (v) in16.value = batch_view(*v, static_cast<U*>(v->data()), batch_first);
        in16.key_padding_mask = kpm.view;
        in16.attn_mask = am.view;
        // The shapes below are read from `in`.
        in.query = {nullptr, in16.query.batch, in16.query.rows, in16.query.cols};
        if (k) in.key = {nullptr, in16.key.batch, in16.key.rows, in16.key.cols};
    } else {
        in.query = batch_view(q, static_cast<const float*>(q.data()), batch_first);
        if (k) in.key = batch_view(*k, static_cast<const float*>(k->data()), batch_first);
        if (v) in.value = batch_view(*v, static_cast<const float*>(v->data()), batch_first);
        in.key_padding_mask = kpm.view;
        in.attn_mask = am.view;
    }

    mha::ForwardOptions opt;
    opt.causal = is_causal;
    opt.causal_alignment = parse_alignment(causal_alignment);
    opt.position_offset = position_offset;
    std::vector<std::size_t> pos;
    if (!positions.is_none()) {
        pos = sizes_of(positions, "positions");
        if (pos.size() != in.query.batch) {
            value_error("positions has " + std::to_string(pos.size()) + " entries, expected the batch size " +
                        std::to_string(in.query.batch));
        }
        opt.positions = pos.data();
    }
    opt.need_weights = need_weights ? (average_attn_weights ? mha::NeedWeights::averaged : mha::NeedWeights::per_head)
                                    : mha::NeedWeights::none;
    opt.norm_eps = norm_eps;
    opt.threads = parse_threads(threads);
    opt.backend = parse_backend(backend);
    opt.impl = parse_impl(impl);

    const std::size_t B = in.query.batch, Lq = in.query.rows, E = self.layer.embed_dim();
    const std::size_t Lk = k ? in.key.rows : Lq;
    std::vector<py::ssize_t> oshape;
    if (unbatched) {
        oshape = {static_cast<py::ssize_t>(Lq), static_cast<py::ssize_t>(E)};
    } else if (batch_first) {
        oshape = {static_cast<py::ssize_t>(B), static_cast<py::ssize_t>(Lq), static_cast<py::ssize_t>(E)};
    } else {
        oshape = {static_cast<py::ssize_t>(Lq), static_cast<py::ssize_t>(B), static_cast<py::ssize_t>(E)};
    }
    py::array o;
    if (out.is_none()) {
        o = py::array(dt, oshape);
    } else {
        o = out_array(out, "out", oshape, dt);
    }
    py::object weights = py::none();
    float* wp = nullptr;
    if (need_weights) {
        std::vector<py::ssize_t> ws;
        if (!unbatched) ws.push_back(static_cast<py::ssize_t>(B));
        if (!average_attn_weights) ws.push_back(static_cast<py::ssize_t>(self.heads));
        ws.push_back(static_cast<py::ssize_t>(Lq));
        ws.push_back(static_cast<py::ssize_t>(Lk));
        py::array_t<float> wa(ws);
        wp = wa.mutable_data();
        weights = std::move(wa);
    }
    if (half) {
        const mha::HalfAttentionOutputs outs{batch_view(o, static_cast<std::uint16_t*>(o.mutable_data()), batch_first), wp};
        if (cache) {
            CacheUse use(*cache);
            py::gil_scoped_release release;
            self.layer.forward(in16, outs, opt, cache->cache);
        } else {
            py::gil_scoped_release release;
            self.layer.forward(in16, outs, opt);
        }
        return py::make_tuple(o, weights);
    }
    mha::AttentionOutputs outs{batch_view(o, static_cast<float*>(o.mutable_data()), batch_first), wp};
    if (cache) {
        CacheUse use(*cache);
        py::gil_scoped_release release;
        self.layer.forward(in, outs, opt, cache->cache);
    } else {
        py::gil_scoped_release release;
        self.layer.forward(in, outs, opt);
    }
    return py::make_tuple(o, weights);
}

// ---- scaled_dot_product_attention on [B, H, L, d] arrays (the Python wrapper maps PyTorch's conventions) ----
py::array sdpa(py::handle query, py::handle key, py::handle value, py::handle key_padding_mask, py::handle attn_mask,
               bool is_causal, const std::string& causal_alignment, std::optional<float> scale, int threads,
               const std::string& backend, const std::string& impl, py::handle out, py::handle window, py::handle softcap,
               py::handle sinks, py::handle alibi_slopes) {
    const py::array q = float_input(query, "query", 4, 4), k = float_input(key, "key", 4, 4),
                    v = float_input(value, "value", 4, 4);
    const Mask kpm = mask_input(key_padding_mask, "key_padding_mask", 2, 2);
    const Mask am = mask_input(attn_mask, "attn_mask", 2, 3);
    mha::SdpaInputs in{heads_view(q, static_cast<const float*>(q.data())), heads_view(k, static_cast<const float*>(k.data())),
                       heads_view(v, static_cast<const float*>(v.data())), kpm.view, am.view};
    mha::SdpaOptions opt;
    opt.causal = is_causal;
    opt.causal_alignment = parse_alignment(causal_alignment);
    opt.scale = scale;
    opt.threads = parse_threads(threads);
    opt.backend = parse_backend(backend);
    opt.impl = parse_impl(impl);
    ModifierStore mods;
    opt.modifiers = modifiers_of(window, softcap, sinks, alibi_slopes, static_cast<std::size_t>(q.shape(1)), mods);
    const std::vector<py::ssize_t> oshape = {q.shape(0), q.shape(1), q.shape(2), v.shape(3)};
    py::array o;
    if (out.is_none()) {
        o = py::array_t<float>(oshape);  // assigned, not converted: py::array(array_t) would read it as a shape
    } else {
        o = out_array(out, "out", oshape);
    }
    const mha::Heads ov = heads_view(o, static_cast<float*>(o.mutable_data()));
    py::gil_scoped_release release;
    mha::scaled_dot_product_attention(in, ov, opt);
    return o;
}

}  // namespace

PYBIND11_MODULE(_mha, m) {
    m.doc() = "Multi-head attention on CPUs (the C++ library mha): numpy bindings. Use the package mha.";
    // pybind11 maps std::invalid_argument to ValueError already; registered explicitly so the mapping is part of
    // this module's contract rather than a pybind11 default.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const mha::invalid_argument& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });

    m.def("input_copies", [] { return g_input_copies.load(); },
          "How many input arrays were copied because their layout could not be read in place (for tests).");
    m.def("_count_input_copy", [] { ++g_input_copies; },
          "Counts a copy made in Python (mha.torch converting a bfloat16 mask, which numpy cannot hold).");
    m.def("detected_isa", [] { return std::string(mha::isa_name(mha::active_isa())); });

    py::class_<PyLayer> layer_cls(m, "MultiheadAttention", py::dynamic_attr());
    layer_cls
        .def(py::init([](Count E, Count H, Count Hkv, Count d, Count kdim, Count vdim,
                         std::optional<float> rope_theta, Count rope_dims, const std::string& rope_style,
                         const std::string& compute, const py::dict& weights, py::handle window, py::handle softcap,
                         py::handle sinks, py::handle alibi_slopes) {
                 return make_layer(E, H, Hkv, d, kdim, vdim, rope_theta, rope_dims, rope_style, compute, weights, window, softcap,
                                   sinks, alibi_slopes);
             }),
             py::arg("embed_dim"), py::arg("num_heads"), py::kw_only(), py::arg("num_kv_heads") = 0, py::arg("head_dim") = 0,
             py::arg("kdim") = 0, py::arg("vdim") = 0, py::arg("rope_theta") = py::none(), py::arg("rope_dims") = 0,
             py::arg("rope_style") = "half", py::arg("compute") = "f32", py::arg("weights") = py::dict(),
             py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("sinks") = py::none(),
             py::arg("alibi_slopes") = py::none())
        .def_property_readonly("embed_dim", [](const PyLayer& s) { return s.layer.embed_dim(); })
        .def_property_readonly("num_heads", [](const PyLayer& s) { return s.layer.num_heads(); })
        .def_property_readonly("num_kv_heads", [](const PyLayer& s) { return s.layer.num_kv_heads(); })
        .def_property_readonly("head_dim", [](const PyLayer& s) { return s.layer.head_dim(); })
        .def_property_readonly("kdim", [](const PyLayer& s) { return s.layer.kdim(); })
        .def_property_readonly("vdim", [](const PyLayer& s) { return s.layer.vdim(); })
        .def_property_readonly("weight_bytes", [](const PyLayer& s) { return s.layer.weight_bytes(); });

    const auto fwd = [](const PyLayer& self, py::handle query, py::handle key, py::handle value, py::handle key_padding_mask,
                        bool need_weights, py::handle attn_mask, bool average_attn_weights, bool is_causal,
                        bool batch_first, const std::string& causal_alignment, Count position_offset,
                        py::handle positions, std::optional<float> norm_eps, int threads, const std::string& backend,
                        const std::string& impl, py::handle out, py::handle cache, py::handle seq_ids, py::handle q_lens,
                        py::handle plan, py::handle seq_lens) {
        return layer_forward(self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                             is_causal, batch_first, causal_alignment, position_offset, positions, norm_eps, threads,
                             backend, impl, out, cache, seq_ids, q_lens, plan, seq_lens);
    };
    const char* fwd_doc =
        "forward(query, key=None, value=None, key_padding_mask=None, need_weights=False, attn_mask=None,\n"
        "        average_attn_weights=True, is_causal=False, *, batch_first=True, causal_alignment='top_left',\n"
        "        position_offset=0, positions=None, norm_eps=None, threads=0, backend='simd', impl='auto', out=None,\n"
        "        cache=None, seq_ids=None, q_lens=None, plan=None, seq_lens=None) -> (output, weights or None)\n"
        "With cache=PagedKVCache: query [T, E] float32 holds the next q_lens[i] tokens of sequence seq_ids[i], packed\n"
        "in that order (T = sum(q_lens)); returns (y [T, E], None). plan=StepPlan(...) instead of seq_ids and q_lens:\n"
        "the step planned once for every layer of a model. backend='scalar' runs each sequence alone through the\n"
        "reference of cached decoding.\n"
        "With seq_lens=[...]: query [T, E] float32 packs independent sequences of those lengths (no padding, no cache;\n"
        "is_causal applies per sequence, RoPE positions restart per sequence; backend='scalar' runs the reference on\n"
        "each sequence alone); returns (y [T, E], None).";
    for (const char* name : {"forward", "__call__"}) {
        layer_cls.def(name, fwd, fwd_doc, py::arg("query"), py::arg("key") = py::none(), py::arg("value") = py::none(),
                      py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = false,
                      py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true,
                      py::arg("is_causal") = false, py::kw_only(), py::arg("batch_first") = true,
                      py::arg("causal_alignment") = "top_left", py::arg("position_offset") = 0,
                      py::arg("positions") = py::none(), py::arg("norm_eps") = py::none(), py::arg("threads") = 0,
                      py::arg("backend") = "simd", py::arg("impl") = "auto", py::arg("out") = py::none(),
                      py::arg("cache") = py::none(), py::arg("seq_ids") = py::none(), py::arg("q_lens") = py::none(),
                      py::arg("plan") = py::none(), py::arg("seq_lens") = py::none());
    }

    m.def("_sdpa", &sdpa, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask"),
          py::arg("attn_mask"), py::arg("is_causal"), py::arg("causal_alignment"), py::arg("scale"), py::arg("threads"),
          py::arg("backend"), py::arg("impl"), py::arg("out"), py::arg("window") = py::none(), py::arg("softcap") = py::none(),
          py::arg("sinks") = py::none(), py::arg("alibi_slopes") = py::none());
    m.def("_check_modifiers",
          [](Count heads, py::handle window, py::handle softcap, py::handle sinks, py::handle alibi_slopes) {
              ModifierStore store;
              modifiers_of(window, softcap, sinks, alibi_slopes, heads, store);
          },
          py::arg("heads"), py::arg("window") = py::none(), py::arg("softcap") = py::none(), py::arg("sinks") = py::none(),
          py::arg("alibi_slopes") = py::none(),
          "Raises what a layer of `heads` heads would raise for these score modifiers (mha.torch checks them when set).");
    m.def("alibi_standard_slopes", [](Count heads) {
              const std::vector<float> s = mha::alibi_standard_slopes(heads);
              py::array_t<float> a(static_cast<py::ssize_t>(s.size()));
              std::copy(s.begin(), s.end(), a.mutable_data());
              return a;
          },
          py::arg("heads"), "BLOOM's ALiBi slopes for `heads` heads (float32 [heads]).");

    py::class_<PyKVCache>(m, "KVCache")
        .def(py::init([](Count b, Count h, Count d, Count cap, const std::string& dtype, float ks, float vs) {
                 return std::make_unique<PyKVCache>(b, h, d, cap, parse_kv_dtype(dtype), ks, vs);
             }),
             py::arg("batch"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("capacity"), py::arg("dtype") = "f32", py::kw_only(),
             py::arg("k_scale") = 1.0f, py::arg("v_scale") = 1.0f,
             "KVCache(batch, kv_heads, head_dim, capacity, dtype='f32', *, k_scale=1.0, v_scale=1.0): dtype 'f32', 'bf16', 'f16',\n"
             "'int8' (blocks of 32 values with a float16 scale) or 'fp8_e4m3' / 'fp8_e5m2' (stored fp8(k / k_scale), read back as\n"
             "fp8 * k_scale; the scales are for fp8 only).")
        .def_property_readonly("dtype", [](const PyKVCache& c) { return std::string(mha::data_type_name(c.cache.element_type())); })
        .def_property_readonly("k_scale", [](const PyKVCache& c) { return c.cache.k_scale(); })
        .def_property_readonly("v_scale", [](const PyKVCache& c) { return c.cache.v_scale(); })
        .def_property_readonly("batch", [](const PyKVCache& c) { return c.cache.batch(); })
        .def_property_readonly("kv_heads", [](const PyKVCache& c) { return c.cache.kv_heads(); })
        .def_property_readonly("head_dim", [](const PyKVCache& c) { return c.cache.head_dim(); })
        .def_property_readonly("capacity", [](const PyKVCache& c) { return c.cache.capacity(); })
        .def_property_readonly("nbytes", [](const PyKVCache& c) { return c.cache.bytes(); })
        .def_property_readonly("lengths", [](PyKVCache& c) { CacheUse u(c); return c.cache.lengths(); })
        .def("length", [](PyKVCache& c, Count b) { CacheUse u(c); return c.cache.length(b); }, py::arg("b"))
        .def("reset", [](PyKVCache& c, Count b) { CacheUse u(c); c.cache.reset(b); }, py::arg("b"))
        .def("truncate", [](PyKVCache& c, Count b, Count n) { CacheUse u(c); c.cache.truncate(b, n); },
             py::arg("b"), py::arg("n"))
        .def("append",
             [](PyKVCache& c, Count b, py::handle key, py::handle value) {
                 // [Hkv, n, d] or [1, Hkv, n, d] (Hugging Face's past_key_values of one sequence).
                 py::array k = float_input(key, "key", 3, 4), v = float_input(value, "value", 3, 4);
                 if (k.ndim() == 3) k = k[py::make_tuple(py::none())];
                 if (v.ndim() == 3) v = v[py::make_tuple(py::none())];
                 const mha::ConstHeads kh = heads_view(k, static_cast<const float*>(k.data()));
                 const mha::ConstHeads vh = heads_view(v, static_cast<const float*>(v.data()));
                 CacheUse u(c);
                 c.cache.append(b, kh, vh);
             },
             py::arg("b"), py::arg("key"), py::arg("value"))
        .def("keys", [](py::object self) { return cache_view(std::move(self), true); },
             "Read-only view [B, Hkv, capacity, d] (float32, float16, or uint16 bfloat16 bits); rows at or past length(b) are stale.\n"
             "int8 / fp8 caches: a float32 copy of the dequantized values, rows at or past length(b) zero.")
        .def("values", [](py::object self) { return cache_view(std::move(self), false); },
             "Read-only view [B, Hkv, capacity, d] as keys(); rows at or past length(b) are stale (8-bit types: zero).");

    py::class_<PyPagedKVCache>(m, "PagedKVCache")
        .def(py::init([](Count n, Count bs, Count h, Count d, const std::string& dtype, float ks, float vs) {
                 return std::make_unique<PyPagedKVCache>(n, bs, h, d, parse_kv_dtype(dtype), ks, vs);
             }),
             py::arg("num_blocks"), py::arg("block_size"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype") = "f32",
             py::kw_only(), py::arg("k_scale") = 1.0f, py::arg("v_scale") = 1.0f)
        .def_property_readonly("dtype", [](const PyPagedKVCache& c) { return std::string(mha::data_type_name(c.cache.element_type())); })
        .def_property_readonly("k_scale", [](const PyPagedKVCache& c) { return c.cache.k_scale(); })
        .def_property_readonly("v_scale", [](const PyPagedKVCache& c) { return c.cache.v_scale(); })
        .def_property_readonly("num_blocks", [](const PyPagedKVCache& c) { return c.cache.num_blocks(); })
        .def_property_readonly("block_size", [](const PyPagedKVCache& c) { return c.cache.block_size(); })
        .def_property_readonly("kv_heads", [](const PyPagedKVCache& c) { return c.cache.kv_heads(); })
        .def_property_readonly("head_dim", [](const PyPagedKVCache& c) { return c.cache.head_dim(); })
        // Readers take the cache too: a step in another thread (the GIL released) moves block tables and lengths.
        .def_property_readonly("free_blocks", [](PyPagedKVCache& c) { PagedUse u(c); return c.cache.free_blocks(); })
        .def_property_readonly("used_blocks", [](PyPagedKVCache& c) { PagedUse u(c); return c.cache.used_blocks(); })
        .def("add_sequence", [](PyPagedKVCache& c) { PagedUse u(c); return c.cache.add_sequence(); })
        .def("fork", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return c.cache.fork(s); }, py::arg("s"))
        .def("length", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return c.cache.length(s); }, py::arg("s"))
        .def("block_table", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return c.cache.block_table(s); }, py::arg("s"))
        .def("truncate", [](PyPagedKVCache& c, Count s, Count n) { PagedUse u(c); c.cache.truncate(s, n); },
             py::arg("s"), py::arg("n"))
        .def("free_sequence", [](PyPagedKVCache& c, Count s) { PagedUse u(c); c.cache.free_sequence(s); }, py::arg("s"))
        .def("release_before", [](PyPagedKVCache& c, Count s, Count position) { PagedUse u(c); return c.cache.release_before(s, position); },
             py::arg("s"), py::arg("position"),
             "Sliding-window layers: return the blocks wholly before `position` to the pool (keys no future query's window "
             "reaches); returns released_tokens(s). Opt-in, after a step: position = length(s) - window_left.")
        .def("released_tokens", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return c.cache.released_tokens(s); }, py::arg("s"))
        .def("append",
             [](PyPagedKVCache& c, Count s, py::handle key, py::handle value) {
                 // [Hkv, n, d] or [1, Hkv, n, d], projected and rotated (as KVCache.append).
                 py::array k = float_input(key, "k", 3, 4), v = float_input(value, "v", 3, 4);
                 if (k.ndim() == 3) k = k[py::make_tuple(py::none())];
                 if (v.ndim() == 3) v = v[py::make_tuple(py::none())];
                 const mha::ConstHeads kh = heads_view(k, static_cast<const float*>(k.data()));
                 const mha::ConstHeads vh = heads_view(v, static_cast<const float*>(v.data()));
                 PagedUse u(c);
                 c.cache.append(s, kh, vh);
             },
             py::arg("s"), py::arg("k"), py::arg("v"))
        .def("keys", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return paged_rows(c, s, false); }, py::arg("s"),
             "Sequence s's keys, a float32 copy [Hkv, length, d].")
        .def("values", [](PyPagedKVCache& c, Count s) { PagedUse u(c); return paged_rows(c, s, true); }, py::arg("s"),
             "Sequence s's values, a float32 copy [Hkv, length, d].");

    py::class_<PyStepPlan>(m, "StepPlan",
                           "StepPlan(layer, cache, seq_ids, q_lens, *, threads=0): one serving step (sequences seq_ids with\n"
                           "q_lens new tokens each, as cache holds them now) planned once; give it to every layer of a model\n"
                           "as layer(x, cache=cache_of_that_layer, plan=plan). Each layer's cache must hold the sequences at\n"
                           "the lengths they have in `cache` now (ValueError otherwise, nothing changed); a plan serves one step.")
        .def(py::init([](const PyLayer& layer, PyPagedKVCache& cache, py::handle seq_ids, py::handle q_lens, int threads) {
                 const std::vector<std::size_t> ids = sizes_of(seq_ids, "seq_ids"), ql = sizes_of(q_lens, "q_lens");
                 if (ids.size() != ql.size())
                     value_error("seq_ids has " + std::to_string(ids.size()) + " entries but q_lens has " + std::to_string(ql.size()));
                 const int th = parse_threads(threads);
                 PagedUse u(cache);
                 return std::unique_ptr<PyStepPlan>(new PyStepPlan{mha::StepPlan(layer.layer, cache.cache, ids.data(), ql.data(), ids.size(), th)});
             }),
             py::arg("layer"), py::arg("cache"), py::arg("seq_ids"), py::arg("q_lens"), py::kw_only(), py::arg("threads") = 0)
        .def_property_readonly("sequences", [](const PyStepPlan& p) { return p.plan.sequences(); })
        .def_property_readonly("tokens", [](const PyStepPlan& p) { return p.plan.tokens(); });
}
