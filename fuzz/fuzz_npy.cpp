// libFuzzer target: mha::npy::parse on arbitrary bytes.
// Contract checked: parse either throws mha::npy::error (anything else escaping is a bug and aborts the
// fuzzer), or returns an array whose element count is the product of its shape and whose payload is
// exactly the last count · itemsize bytes of the input (the format puts the data at the end, and the
// parser rejects trailing bytes), converted as the dtype says. ASan/UBSan catch out-of-bounds reads and
// overflowing size arithmetic.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "npy.hpp"

namespace {

void require(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_npy: invariant violated: %s\n", what);
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    mha::npy::Array a;
    try {
        a = mha::npy::parse(data, size);
    } catch (const mha::npy::error&) {
        return 0;  // rejected: the expected outcome for most inputs
    }

    std::size_t count = 1;
    for (std::size_t d : a.shape) count *= d;  // cannot wrap: the parser checked count · itemsize fits
    require(count == a.size(), "Array::size() differs from the product of the shape");
    require(std::memcmp(data, "\x93NUMPY", 6) == 0, "accepted a file without the magic string");

    using mha::npy::DType;
    const bool is_float = a.dtype == DType::float32 || a.dtype == DType::float64;
    const std::size_t itemsize = a.dtype == DType::float64 ? 8 : a.dtype == DType::float32 ? 4 : 1;
    require(count <= size / itemsize, "shape claims more data than the input holds");
    const std::uint8_t* payload = data + size - count * itemsize;
    if (is_float) {
        require(a.values.size() == count && a.bytes.empty(), "float array with the wrong payload vector");
    } else {
        require(a.bytes.size() == count && a.values.empty(), "byte array with the wrong payload vector");
        require(count == 0 || std::memcmp(a.bytes.data(), payload, count) == 0, "bool/uint8 payload differs from the input");
        return 0;
    }
    for (std::size_t i = 0; i < count; ++i) {
        float expected;
        if (a.dtype == DType::float32) {
            std::memcpy(&expected, payload + 4 * i, 4);
        } else {
            double v;
            std::memcpy(&v, payload + 8 * i, 8);
            expected = static_cast<float>(v);
        }
        // Compare bit patterns: NaN payloads must survive too (float64 NaN → some float NaN).
        const bool both_nan = expected != expected && a.values[i] != a.values[i];
        require(both_nan || std::memcmp(&expected, &a.values[i], 4) == 0, "float payload differs from the input");
    }
    return 0;
}
