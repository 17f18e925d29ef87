// The .npy reader's integer dtypes (tools/npy.hpp, Accept::with_integers): int32 '<i4' and int64 '<i8',
// read only when the caller asks for them (past_lengths.npy of `mha run`); by default they stay refused,
// as every other file of the tool must be float, bool or uint8. The buffers are built here byte by byte as
// NumPy 1.24 writes them (np.save of np.array([...], dtype=np.int32 / np.int64)).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

using mha::npy::Accept;
using mha::npy::Array;
using mha::npy::DType;
using Bytes = std::vector<std::uint8_t>;

// A version 1.0 file: header dict padded with spaces to a multiple of 64 bytes, then the payload.
Bytes npy_file(const std::string& descr, const std::string& shape, const Bytes& payload) {
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string text("\x93NUMPY\x01\x00", 8);
    text += static_cast<char>(header.size() & 0xff);
    text += static_cast<char>(header.size() >> 8);
    text += header;
    Bytes f(text.begin(), text.end());
    f.insert(f.end(), payload.begin(), payload.end());
    return f;
}

template <class T>
Bytes payload_of(const std::vector<T>& v) {
    Bytes b(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

Array parse(const Bytes& f, Accept accept = Accept::with_integers) { return mha::npy::parse(f.data(), f.size(), accept); }

void expect_rejected(const Bytes& f, const std::string& needle, Accept accept = Accept::with_integers) {
    try {
        parse(f, accept);
        ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
    } catch (const mha::npy::error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(NpyIntegers, Int32WidensExactly) {
    const std::vector<std::int32_t> v{0, 1, -1, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(), 7};
    const Array a = parse(npy_file("<i4", "(2, 3)", payload_of(v)));
    EXPECT_EQ(a.dtype, DType::int32);
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(a.integers, (std::vector<std::int64_t>(v.begin(), v.end())));
    EXPECT_TRUE(a.values.empty());
    EXPECT_TRUE(a.bytes.empty());
    EXPECT_STREQ(mha::npy::dtype_name(a.dtype), "int32");
}

TEST(NpyIntegers, Int64Exactly) {
    const std::vector<std::int64_t> v{std::numeric_limits<std::int64_t>::min(), -5, 0, std::numeric_limits<std::int64_t>::max()};
    const Array a = parse(npy_file("<i8", "(4,)", payload_of(v)));
    EXPECT_EQ(a.dtype, DType::int64);
    EXPECT_EQ(a.integers, v);
    EXPECT_STREQ(mha::npy::dtype_name(a.dtype), "int64");
}

TEST(NpyIntegers, ZeroDimensionalAndEmpty) {
    const Array scalar = parse(npy_file("<i8", "()", payload_of(std::vector<std::int64_t>{42})));
    EXPECT_TRUE(scalar.shape.empty());
    EXPECT_EQ(scalar.integers, (std::vector<std::int64_t>{42}));
    const Array empty = parse(npy_file("<i4", "(0,)", {}));
    EXPECT_EQ(empty.shape, (std::vector<std::size_t>{0}));
    EXPECT_TRUE(empty.integers.empty());
}

TEST(NpyIntegers, FloatsStillReadWithIntegersAccepted) {
    const Array a = parse(npy_file("<f4", "(2,)", payload_of(std::vector<float>{1.5f, -2})));
    EXPECT_EQ(a.dtype, DType::float32);
    EXPECT_EQ(a.values, (std::vector<float>{1.5f, -2}));
    EXPECT_TRUE(a.integers.empty());
}

TEST(NpyIntegers, RefusedByDefault) {
    expect_rejected(npy_file("<i4", "(1,)", payload_of(std::vector<std::int32_t>{1})), "dtype '<i4' is not supported",
                    Accept::default_types);
    expect_rejected(npy_file("<i8", "(1,)", payload_of(std::vector<std::int64_t>{1})), "dtype '<i8' is not supported",
                    Accept::default_types);
}

TEST(NpyIntegers, OtherIntegerDtypesRefused) {
    expect_rejected(npy_file("<i2", "(1,)", Bytes(2, 0)), "dtype '<i2' is not supported (supported: '<f4', '<f8', '|b1', '|u1', '<i4', '<i8')");
    expect_rejected(npy_file("<u4", "(1,)", Bytes(4, 0)), "is not supported");
    expect_rejected(npy_file("<u8", "(1,)", Bytes(8, 0)), "is not supported");
    expect_rejected(npy_file("|i1", "(1,)", Bytes(1, 0)), "is not supported");
    expect_rejected(npy_file("=i4", "(1,)", Bytes(4, 0)), "is not supported");
    expect_rejected(npy_file(">i4", "(1,)", Bytes(4, 0)), "big-endian");
    expect_rejected(npy_file(">i8", "(1,)", Bytes(8, 0)), "big-endian");
}

TEST(NpyIntegers, PayloadSizeChecked) {
    // One byte short, one byte over, and an int32 payload under an int64 header.
    expect_rejected(npy_file("<i4", "(2,)", Bytes(7, 0)), "file truncated");
    expect_rejected(npy_file("<i8", "(1,)", Bytes(9, 0)), "trailing bytes");
    expect_rejected(npy_file("<i8", "(2,)", payload_of(std::vector<std::int32_t>{1, 2})), "needs 16");
    // An element count whose byte count overflows size_t.
    expect_rejected(npy_file("<i8", "(2305843009213693952,)", {}), "overflows");
}

}  // namespace
