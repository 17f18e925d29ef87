// The .npy parser (tools/npy.*) on byte buffers built here: every accepted dtype and format version,
// and every rejection (each must throw npy::error with a one-line message naming the problem).
// Also reads files that NumPy itself wrote (tests/tool/npy/, made by numpy.lib.format.write_array).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

using mha::npy::Array;
using mha::npy::DType;
using Bytes = std::vector<std::uint8_t>;

// magic, version, little-endian header length (2 bytes for 1.0, 4 otherwise), header text as given, payload.
Bytes raw_file(int major, int minor, const std::string& header, const Bytes& payload) {
    // Built as a string: g++ 12 gives a false -Warray-bounds on inserting into a small braced vector.
    std::string f("\x93NUMPY", 6);
    f += static_cast<char>(major);
    f += static_cast<char>(minor);
    const int len_bytes = major == 1 ? 2 : 4;
    for (int i = 0; i < len_bytes; ++i) f += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    f += header;
    f.append(payload.begin(), payload.end());
    return Bytes(f.begin(), f.end());
}

// As NumPy writes it: the dict, space padding to a 64-byte boundary, '\n'.
Bytes npy_file(const std::string& dict, const Bytes& payload, int major = 1) {
    const std::size_t prefix = major == 1 ? 10 : 12;
    std::string header = dict;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    return raw_file(major, 0, header, payload);
}

std::string dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

template <class T>
Bytes payload_of(const std::vector<T>& v) {
    Bytes b(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

Array parse(const Bytes& f) { return mha::npy::parse(f.data(), f.size()); }

// The parser must throw npy::error whose one-line message contains `needle`.
void expect_rejected(const Bytes& f, const std::string& needle) {
    try {
        parse(f);
        ADD_FAILURE() << "accepted; expected an error containing \"" << needle << "\"";
    } catch (const mha::npy::error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(needle), std::string::npos) << "message: " << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << "message spans lines: " << m;
    }
}

std::filesystem::path temp_dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    auto dir = std::filesystem::temp_directory_path() / ("mha_npy_" + std::string(info->name()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

Bytes read_bytes(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// --- accepted ------------------------------------------------------------------------------------

TEST(NpyParse, Float32Version1) {
    const std::vector<float> v = {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -std::numeric_limits<float>::infinity()};
    const Array a = parse(npy_file(dict("<f4", "(2, 3)"), payload_of(v)));
    EXPECT_EQ(a.dtype, DType::float32);
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(a.size(), 6u);
    EXPECT_EQ(a.values, v);
    EXPECT_TRUE(a.bytes.empty());
}

TEST(NpyParse, Float64Version2ConvertsToNearestFloat) {
    const std::vector<double> v = {0.1, -2.5, 1e300, 1e-300};
    const Array a = parse(npy_file(dict("<f8", "(4,)"), payload_of(v), 2));
    EXPECT_EQ(a.dtype, DType::float64);
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{4}));
    ASSERT_EQ(a.values.size(), 4u);
    EXPECT_EQ(a.values[0], 0.1f);  // the float nearest to 0.1
    EXPECT_EQ(a.values[1], -2.5f);
    EXPECT_EQ(a.values[2], std::numeric_limits<float>::infinity());  // IEEE overflow
    EXPECT_EQ(a.values[3], 0.0f);                                     // IEEE underflow
}

TEST(NpyParse, BoolVersion3) {
    const Array a = parse(npy_file(dict("|b1", "(4,)"), {1, 0, 0, 1}, 3));
    EXPECT_EQ(a.dtype, DType::boolean);
    EXPECT_EQ(a.bytes, (Bytes{1, 0, 0, 1}));
    EXPECT_TRUE(a.values.empty());
}

TEST(NpyParse, Uint8Version1) {
    const Array a = parse(npy_file(dict("|u1", "(2, 2)"), {0, 255, 7, 128}));
    EXPECT_EQ(a.dtype, DType::uint8);
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{2, 2}));
    EXPECT_EQ(a.bytes, (Bytes{0, 255, 7, 128}));
}

TEST(NpyParse, ZeroDimensionalArrayHasOneElement) {
    const Array a = parse(npy_file(dict("<f4", "()"), payload_of(std::vector<float>{3.5f})));
    EXPECT_TRUE(a.shape.empty());
    EXPECT_EQ(a.size(), 1u);
    EXPECT_EQ(a.values, std::vector<float>{3.5f});
}

TEST(NpyParse, EmptyArray) {
    const Array a = parse(npy_file(dict("<f4", "(0, 4)"), {}));
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{0, 4}));
    EXPECT_EQ(a.size(), 0u);
    EXPECT_TRUE(a.values.empty());
}

TEST(NpyParse, ZeroDimensionMakesEmptyArrayEvenWithHugeOtherDims) {
    const Array a = parse(npy_file(dict("<f4", "(4294967296, 4294967296, 0)"), {}));
    EXPECT_EQ(a.size(), 0u);
    EXPECT_TRUE(a.values.empty());
}

TEST(NpyParse, KeysInAnyOrderDoubleQuotesNoPadding) {
    const Array a = parse(raw_file(1, 0, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<f4\"}\n",
                                   payload_of(std::vector<float>{1, 2, 3})));
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{3}));
    EXPECT_EQ(a.values, (std::vector<float>{1, 2, 3}));
}

TEST(NpyParse, TrailingCommaInShape) {
    const Array a = parse(npy_file(dict("<f4", "(1, 2,)"), payload_of(std::vector<float>{1, 2})));
    EXPECT_EQ(a.shape, (std::vector<std::size_t>{1, 2}));
}

TEST(NpyParse, HeaderLengthUsesBothLittleEndianBytes) {
    std::string header = dict("<f4", "(2,)");
    header.append(300 - header.size() - 1, ' ').push_back('\n');  // 300 = 0x012c: both bytes matter
    const Array a = parse(raw_file(1, 0, header, payload_of(std::vector<float>{7, 8})));
    EXPECT_EQ(a.values, (std::vector<float>{7, 8}));
}

TEST(NpyParse, Version2HeaderLongerThan64KiB) {
    std::string header = dict("|u1", "(1,)");
    header.append(70000 - header.size() - 1, ' ').push_back('\n');
    EXPECT_EQ(parse(raw_file(2, 0, header, {9})).bytes, Bytes{9});
}

// Files written by NumPy 1.24 (numpy.lib.format.write_array with version=(1,0), (2,0), (3,0)):
// arange(6).reshape(2, 3) % 2 in each dtype.
TEST(NpyLoad, FilesWrittenByNumpy) {
    const std::filesystem::path dir = std::filesystem::path(MHA_TEST_DATA_DIR) / ".." / "tool" / "npy";
    for (int v = 1; v <= 3; ++v) {
        for (const char* t : {"f4", "f8", "b1", "u1"}) {
            // Appends rather than "v" + ...: g++ 12 gives a false -Wrestrict on that form (GCC bug 105651).
            std::string name("v");
            name.append(std::to_string(v)).append("_").append(t).append(".npy");
            SCOPED_TRACE(name);
            const Array a = mha::npy::load((dir / name).string());
            EXPECT_EQ(a.shape, (std::vector<std::size_t>{2, 3}));
            if (t[0] == 'f') {
                EXPECT_EQ(a.values, (std::vector<float>{0, 1, 0, 1, 0, 1}));
            } else {
                EXPECT_EQ(a.bytes, (Bytes{0, 1, 0, 1, 0, 1}));
            }
        }
    }
    // NumPy's own big-endian, float16 and Fortran-order files are refused.
    EXPECT_THROW(mha::npy::load((dir / "big_endian_f4.npy").string()), mha::npy::error);
    EXPECT_THROW(mha::npy::load((dir / "float16.npy").string()), mha::npy::error);
    EXPECT_THROW(mha::npy::load((dir / "fortran_order.npy").string()), mha::npy::error);
}

// --- rejected ------------------------------------------------------------------------------------

TEST(NpyReject, MissingMagic) {
    Bytes f = npy_file(dict("<f4", "(1,)"), payload_of(std::vector<float>{1}));
    f[5] = 'X';
    expect_rejected(f, "magic");
}

TEST(NpyReject, EmptyInput) { expect_rejected({}, "magic"); }

TEST(NpyReject, EndsInsideVersion) { expect_rejected({0x93, 'N', 'U', 'M', 'P', 'Y', 1}, "version"); }

TEST(NpyReject, EndsInsideHeaderLength) {
    expect_rejected({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0x10}, "header length");
    expect_rejected({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x10, 0, 0}, "header length");
}

TEST(NpyReject, UnsupportedVersion) {
    const std::string h = dict("<f4", "(1,)") + "\n";
    const Bytes one = payload_of(std::vector<float>{1});
    expect_rejected(raw_file(4, 0, h, one), "version 4.0");
    expect_rejected(raw_file(1, 1, h, one), "version 1.1");
    expect_rejected(raw_file(0, 0, h, one), "version 0.0");
}

TEST(NpyReject, HeaderLengthPastEnd) {
    Bytes f = npy_file(dict("<f4", "(1,)"), payload_of(std::vector<float>{1}));
    f[8] = 0xff, f[9] = 0x7f;  // header_len 32767, far past the end
    expect_rejected(f, "runs past the end");
}

TEST(NpyReject, HeaderWithoutNewline) {
    expect_rejected(raw_file(1, 0, dict("<f4", "(1,)") + "   ", payload_of(std::vector<float>{1})), "newline");
}

TEST(NpyReject, FortranOrder) {
    expect_rejected(npy_file(dict("<f4", "(2, 2)", "True"), payload_of(std::vector<float>{1, 2, 3, 4})), "Fortran order");
}

TEST(NpyReject, BigEndian) {
    expect_rejected(npy_file(dict(">f4", "(1,)"), payload_of(std::vector<float>{1})), "big-endian");
    expect_rejected(npy_file(dict(">f8", "(1,)"), payload_of(std::vector<double>{1})), "big-endian");
}

TEST(NpyReject, OtherDtypes) {
    // Each with a payload of the right size for its own itemsize, so only the dtype is wrong.
    const std::vector<std::pair<std::string, std::size_t>> dtypes = {
        {"<i4", 4}, {"<i8", 8}, {"<f2", 2}, {"<c8", 8}, {"|i1", 1}, {"<u1", 1}, {"=f4", 4}, {"|f4", 4}, {"f4", 4}, {"<b1", 1}, {"", 4}};
    for (const auto& [descr, size] : dtypes) {
        SCOPED_TRACE(descr);
        expect_rejected(npy_file(dict(descr, "(1,)"), Bytes(size, 0)), "is not supported");
    }
}

TEST(NpyReject, StructuredDtype) {
    expect_rejected(npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", Bytes(4, 0)),
                    "quoted dtype string");
}

TEST(NpyReject, ShapeNotATuple) {
    expect_rejected(npy_file(dict("<f4", "(3)"), payload_of(std::vector<float>{1, 2, 3})), "not a tuple");
    expect_rejected(npy_file(dict("<f4", "3"), payload_of(std::vector<float>{1, 2, 3})), "'('");
    expect_rejected(npy_file(dict("<f4", "[3]"), payload_of(std::vector<float>{1, 2, 3})), "'('");
}

TEST(NpyReject, NegativeDimension) { expect_rejected(npy_file(dict("<f4", "(-1,)"), {}), "non-negative integer"); }

TEST(NpyReject, NonIntegerDimension) {
    expect_rejected(npy_file(dict("<f4", "(2.0,)"), payload_of(std::vector<float>{1, 2})), "',' or ')'");
    expect_rejected(npy_file(dict("<f4", "(3L,)"), payload_of(std::vector<float>{1, 2, 3})), "',' or ')'");
    expect_rejected(npy_file(dict("<f4", "(02,)"), payload_of(std::vector<float>{1, 2})), "leading zero");
}

TEST(NpyReject, DimensionTooLargeFor64Bits) {
    expect_rejected(npy_file(dict("<f4", "(18446744073709551616,)"), {}), "does not fit in 64 bits");  // 2^64
}

TEST(NpyReject, ElementCountOverflows) {
    // 2^32 · 2^32 = 2^64 elements: the product wraps to 0, which would match an empty payload.
    expect_rejected(npy_file(dict("<f4", "(4294967296, 4294967296)"), {}), "element count that overflows");
    expect_rejected(npy_file(dict("|u1", "(4294967296, 4294967296, 1)"), {}), "element count that overflows");
}

TEST(NpyReject, ByteCountOverflows) {
    // 2^62 float32 elements need 2^64 bytes: the byte count wraps to 0.
    expect_rejected(npy_file(dict("<f4", "(4611686018427387904,)"), {}), "byte count that overflows");
}

TEST(NpyReject, HeaderClaimsMoreDataThanPresent) {
    expect_rejected(npy_file(dict("<f4", "(4,)"), payload_of(std::vector<float>{1, 2, 3})), "truncated");
    expect_rejected(npy_file(dict("<f8", "(2, 2)"), Bytes(31, 0)), "needs 32");
}

TEST(NpyReject, TrailingGarbage) {
    Bytes f = npy_file(dict("<f4", "(2,)"), payload_of(std::vector<float>{1, 2}));
    f.push_back(0);
    expect_rejected(f, "trailing bytes");
}

TEST(NpyReject, MissingKey) {
    expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, }", Bytes(4, 0)), "lacks the key 'shape'");
    expect_rejected(npy_file("{'descr': '<f4', 'shape': (1,), }", Bytes(4, 0)), "lacks the key 'fortran_order'");
    expect_rejected(npy_file("{'fortran_order': False, 'shape': (1,), }", Bytes(4, 0)), "lacks the key 'descr'");
}

TEST(NpyReject, DuplicateKey) {
    expect_rejected(npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", Bytes(4, 0)),
                    "duplicate key 'descr'");
}

TEST(NpyReject, UnknownKey) {
    expect_rejected(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'order': 'C', }", Bytes(4, 0)),
                    "unexpected key 'order'");
}

TEST(NpyReject, BytesAfterTheDict) {
    expect_rejected(npy_file(dict("<f4", "(1,)") + " x", payload_of(std::vector<float>{1})), "after the dict");
}

TEST(NpyReject, NonPrintableByteInHeader) {
    std::string d = dict("<f4", "(1,)");
    d[1] = '\0';
    expect_rejected(npy_file(d, payload_of(std::vector<float>{1})), "0x00");
}

TEST(NpyReject, UnterminatedDictAndString) {
    expect_rejected(raw_file(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)\n", Bytes(4, 0)), "'}'");
    expect_rejected(raw_file(1, 0, "{'descr': '<f4\n", Bytes(4, 0)), "unterminated string");
    expect_rejected(raw_file(1, 0, "{'descr': '<f4', 'fortran_order': Fals\n", Bytes(4, 0)), "True or False");
    expect_rejected(raw_file(1, 0, "\n", Bytes(4, 0)), "'{'");
    expect_rejected(raw_file(1, 0, "", Bytes(4, 0)), "header is empty");
}

// --- load and save -------------------------------------------------------------------------------

TEST(NpyLoad, ErrorsNameThePath) {
    const auto dir = temp_dir();
    const std::string missing = (dir / "missing.npy").string();
    try {
        mha::npy::load(missing);
        ADD_FAILURE() << "loaded a missing file";
    } catch (const mha::npy::error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(missing + ": ", 0), 0u) << e.what();
    }
    EXPECT_THROW(mha::npy::load(dir.string()), mha::npy::error);  // a folder
    std::ofstream(dir / "bad.npy") << "not numpy";
    try {
        mha::npy::load((dir / "bad.npy").string());
        ADD_FAILURE() << "loaded a text file";
    } catch (const mha::npy::error& e) {
        EXPECT_NE(std::string(e.what()).find("bad.npy: not a .npy file"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

TEST(NpySave, WritesNumpysLayoutAndRoundTrips) {
    const auto dir = temp_dir();
    struct Case {
        std::vector<std::size_t> shape;
        std::string tuple;  // as Python's repr() writes it
    };
    for (const Case& c : {Case{{2, 3}, "(2, 3)"}, Case{{5}, "(5,)"}, Case{{}, "()"}, Case{{1, 2, 3}, "(1, 2, 3)"}}) {
        std::size_t n = 1;
        for (std::size_t d : c.shape) n *= d;
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 1.0f;
        const auto path = dir / "a.npy";
        mha::npy::save(path.string(), v.data(), c.shape);

        const Bytes f = read_bytes(path);
        ASSERT_GE(f.size(), 10u);
        EXPECT_EQ(std::string(f.begin(), f.begin() + 8), std::string("\x93NUMPY\x01\x00", 8));
        const std::size_t header_len = f[8] | (f[9] << 8);
        EXPECT_EQ((10 + header_len) % 64, 0u);  // data aligned as NumPy aligns it
        const std::string header(f.begin() + 10, f.begin() + 10 + static_cast<std::ptrdiff_t>(header_len));
        EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': " + c.tuple + ", }", 0), 0u) << header;
        EXPECT_EQ(header.back(), '\n');
        EXPECT_EQ(f.size(), 10 + header_len + 4 * n);
        EXPECT_EQ(std::memcmp(f.data() + 10 + header_len, v.data(), 4 * n), 0);

        const Array a = mha::npy::load(path.string());
        EXPECT_EQ(a.shape, c.shape);
        EXPECT_EQ(a.values, v);
    }
    std::filesystem::remove_all(dir);
}

TEST(NpySave, FailureThrowsAndLeavesNoFile) {
    const auto dir = temp_dir();
    const float x = 1.0f;
    const auto path = dir / "no_such_folder" / "a.npy";
    EXPECT_THROW(mha::npy::save(path.string(), &x, {1}), mha::npy::error);
    EXPECT_FALSE(std::filesystem::exists(path));
    std::filesystem::remove_all(dir);
}

}  // namespace
