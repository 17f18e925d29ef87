// .npy reader and writer. The reader is a strict parser of untrusted bytes:
//   magic "\x93NUMPY", version byte pair (1,0) | (2,0) | (3,0), header length (uint16 LE for 1.0,
//   uint32 LE otherwise), then the header: a Python dict literal ending in '\n', with exactly the keys
//   'descr', 'fortran_order', 'shape', then the data, exactly count · itemsize bytes.
// Every read is bounds-checked; every size computation is overflow-checked.
#include "npy.hpp"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>

namespace mha::npy {

static_assert(std::endian::native == std::endian::little, "the .npy reader and writer assume a little-endian host");
static_assert(std::numeric_limits<float>::is_iec559 && std::numeric_limits<double>::is_iec559);

namespace {

constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

[[noreturn]] void fail(const std::string& message) { throw error(message); }

// a · b, or nullopt when it does not fit in size_t.
std::optional<std::size_t> checked_mul(std::size_t a, std::size_t b) {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
    return r;
}

std::size_t itemsize(DType t) {
    switch (t) {
        case DType::float64:
        case DType::int64: return 8;
        case DType::float32:
        case DType::int32: return 4;
        case DType::uint16: return 2;
        case DType::boolean:
        case DType::uint8: return 1;
    }
    return 1;
}

// Recursive-descent parser of the header dict. Only the subset of Python literal syntax that the
// three keys need: single- or double-quoted strings without escapes, True/False, tuples of
// non-negative decimal integers. Spaces may separate tokens; trailing commas are allowed, as in Python.
class HeaderParser {
public:
    HeaderParser(std::string_view text, Accept accept) : s_(text), accept_(accept) {}

    struct Result {
        DType dtype;
        std::vector<std::size_t> shape;
    };

    Result parse() {
        std::optional<std::string> descr;
        std::optional<bool> fortran_order;
        std::optional<std::vector<std::size_t>> shape;

        skip_spaces();
        expect('{', "'{' opening the header dict");
        skip_spaces();
        while (peek() != '}') {
            const std::string key = string_literal("a quoted key");
            skip_spaces();
            expect(':', "':' after key '" + key + "'");
            skip_spaces();
            if (key == "descr") {
                if (descr) fail("duplicate key 'descr' in header");
                descr = string_literal("a quoted dtype string for 'descr'");
            } else if (key == "fortran_order") {
                if (fortran_order) fail("duplicate key 'fortran_order' in header");
                fortran_order = boolean_literal();
            } else if (key == "shape") {
                if (shape) fail("duplicate key 'shape' in header");
                shape = shape_tuple();
            } else {
                fail("unexpected key '" + key + "' in header (allowed: 'descr', 'fortran_order', 'shape')");
            }
            skip_spaces();
            if (peek() == ',') {
                ++pos_;
                skip_spaces();
            } else if (peek() != '}') {
                fail_expected("',' or '}' after the value of '" + key + "'");
            }
        }
        ++pos_;  // '}'
        // NumPy pads the header with spaces and ends it with '\n'.
        while (pos_ + 1 < s_.size() && s_[pos_] == ' ') ++pos_;
        if (pos_ + 1 != s_.size() || s_[pos_] != '\n')
            fail("header has unexpected bytes after the dict at offset " + std::to_string(pos_) +
                 " (only space padding and a final newline are allowed)");

        if (!descr) fail("header lacks the key 'descr'");
        if (!fortran_order) fail("header lacks the key 'fortran_order'");
        if (!shape) fail("header lacks the key 'shape'");
        if (*fortran_order) fail("array is stored in Fortran order (fortran_order: True); only C order is supported");
        return {parse_descr(*descr, accept_), std::move(*shape)};
    }

private:
    static DType parse_descr(const std::string& d, Accept accept) {
        const bool integers = accept == Accept::with_integers, bits = accept == Accept::with_bf16_bits;
        if (d == "<f4") return DType::float32;
        if (d == "<f8") return DType::float64;
        if (d == "|b1") return DType::boolean;
        if (d == "|u1") return DType::uint8;
        if (integers && d == "<i4") return DType::int32;
        if (integers && d == "<i8") return DType::int64;
        if (bits && d == "<u2") return DType::uint16;
        const std::string supported = integers ? "'<f4', '<f8', '|b1', '|u1', '<i4', '<i8'"
                                      : bits   ? "'<f4', '<f8', '|b1', '|u1', '<u2'"
                                               : "'<f4', '<f8', '|b1', '|u1'";
        if (!d.empty() && d[0] == '>')
            fail("dtype '" + d + "' is big-endian; only little-endian " + supported + " are supported");
        fail("dtype '" + d + "' is not supported (supported: " + supported + ")");
    }

    char peek() const {
        if (pos_ >= s_.size()) fail("header ends early (unterminated dict)");
        return s_[pos_];
    }
    void skip_spaces() {
        while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    }
    [[noreturn]] void fail_expected(const std::string& what) const {
        if (pos_ >= s_.size()) fail("malformed header: expected " + what + " but the header ends");
        const std::string found = s_[pos_] == '\n' ? "a newline" : "'" + std::string(1, s_[pos_]) + "'";
        fail("malformed header: expected " + what + " at offset " + std::to_string(pos_) + ", found " + found);
    }
    void expect(char c, const std::string& what) {
        if (pos_ >= s_.size() || s_[pos_] != c) fail_expected(what);
        ++pos_;
    }
    bool consume_word(std::string_view w) {
        if (s_.substr(pos_, w.size()) != w) return false;
        pos_ += w.size();
        return true;
    }

    std::string string_literal(const std::string& what) {
        if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) fail_expected(what);
        const char quote = s_[pos_++];
        const std::size_t start = pos_;
        while (pos_ < s_.size() && s_[pos_] != quote) {
            if (s_[pos_] == '\\') fail("malformed header: escape sequences in strings are not supported");
            if (s_[pos_] == '\n') fail("malformed header: unterminated string at offset " + std::to_string(start - 1));
            ++pos_;
        }
        if (pos_ >= s_.size()) fail("malformed header: unterminated string at offset " + std::to_string(start - 1));
        return std::string(s_.substr(start, pos_++ - start));
    }

    bool boolean_literal() {
        if (consume_word("True")) return true;
        if (consume_word("False")) return false;
        fail_expected("True or False for 'fortran_order'");
    }

    std::size_t integer() {
        if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail_expected("a non-negative integer in 'shape'");
        if (s_[pos_] == '0' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9')
            fail("malformed header: integer with a leading zero in 'shape' at offset " + std::to_string(pos_));
        std::size_t v = 0;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            if (__builtin_mul_overflow(v, std::size_t{10}, &v) ||
                __builtin_add_overflow(v, static_cast<std::size_t>(s_[pos_] - '0'), &v))
                fail("dimension in 'shape' does not fit in 64 bits");
            ++pos_;
        }
        return v;
    }

    // "()", "(n,)", "(a, b)", "(a, b,)". "(n)" is an int in Python, not a tuple: rejected.
    std::vector<std::size_t> shape_tuple() {
        expect('(', "'(' opening the 'shape' tuple");
        std::vector<std::size_t> dims;
        skip_spaces();
        bool comma_after_last = false;
        while (peek() != ')') {
            dims.push_back(integer());
            skip_spaces();
            comma_after_last = false;
            if (peek() == ',') {
                ++pos_;
                comma_after_last = true;
                skip_spaces();
            } else if (peek() != ')') {
                fail_expected("',' or ')' in 'shape'");
            }
        }
        ++pos_;  // ')'
        if (dims.size() == 1 && !comma_after_last)
            fail("malformed header: 'shape' (" + std::to_string(dims[0]) + ") is not a tuple (a 1-d shape is written (n,))");
        return dims;
    }

    std::string_view s_;
    Accept accept_;
    std::size_t pos_ = 0;
};

std::uint32_t read_le(const std::uint8_t* p, int bytes) {
    std::uint32_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

}  // namespace

std::size_t Array::size() const {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    return n;
}

const char* dtype_name(DType t) noexcept {
    switch (t) {
        case DType::float32: return "float32";
        case DType::float64: return "float64";
        case DType::boolean: return "bool";
        case DType::uint8: return "uint8";
        case DType::int32: return "int32";
        case DType::int64: return "int64";
        case DType::uint16: return "uint16";
    }
    return "?";
}

std::string shape_string(const std::vector<std::size_t>& shape) {
    std::string s("[");
    for (std::size_t i = 0; i < shape.size(); ++i) s.append(i ? ", " : "").append(std::to_string(shape[i]));
    return s.append("]");
}

Array parse(const std::uint8_t* data, std::size_t size, Accept accept) {
    if (size < sizeof magic || std::memcmp(data, magic, sizeof magic) != 0)
        fail("not a .npy file (missing the \\x93NUMPY magic string)");
    if (size < 8) fail("file ends inside the format version (" + std::to_string(size) + " bytes)");
    const unsigned major = data[6], minor = data[7];
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
             " (supported: 1.0, 2.0, 3.0)");
    const int len_bytes = major == 1 ? 2 : 4;
    const std::size_t prefix = 8 + static_cast<std::size_t>(len_bytes);
    if (size < prefix) fail("file ends inside the header length field (" + std::to_string(size) + " bytes)");
    const std::size_t header_len = read_le(data + 8, len_bytes);
    if (header_len > size - prefix)
        fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
             std::to_string(size - prefix) + " bytes after the prefix)");
    for (std::size_t i = 0; i < header_len; ++i) {
        const std::uint8_t c = data[prefix + i];
        if ((c < 0x20 || c > 0x7e) && c != '\n') {
            char hex[8];
            std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(c));
            fail("header contains the byte " + std::string(hex) + " at offset " + std::to_string(i) +
                 " (only printable ASCII is allowed)");
        }
    }
    if (header_len == 0) fail("header is empty");
    const std::string_view header(reinterpret_cast<const char*>(data + prefix), header_len);
    if (header.back() != '\n') fail("header does not end with a newline");

    HeaderParser::Result h = HeaderParser(header, accept).parse();

    // A zero dimension makes the array empty whatever the others are (NumPy's rule); otherwise the
    // product must fit in size_t.
    bool empty = false;
    for (std::size_t d : h.shape) empty = empty || d == 0;
    std::size_t count = empty ? 0 : 1;
    for (std::size_t d : h.shape) {
        if (empty) break;
        const auto next = checked_mul(count, d);
        if (!next) fail("shape " + shape_string(h.shape) + " has an element count that overflows size_t");
        count = *next;
    }
    const auto nbytes = checked_mul(count, itemsize(h.dtype));
    if (!nbytes) fail("shape " + shape_string(h.shape) + " has a byte count that overflows size_t");
    const std::size_t have = size - prefix - header_len;
    if (have != *nbytes)
        fail("data is " + std::to_string(have) + " bytes but shape " + shape_string(h.shape) + " of " +
             dtype_name(h.dtype) + " needs " + std::to_string(*nbytes) +
             (have < *nbytes ? " (file truncated or header lies about the shape)" : " (trailing bytes after the data)"));

    Array a;
    a.dtype = h.dtype;
    a.shape = std::move(h.shape);
    const std::uint8_t* payload = data + prefix + header_len;
    switch (a.dtype) {
        case DType::float32:
            a.values.resize(count);
            if (count) std::memcpy(a.values.data(), payload, *nbytes);
            break;
        case DType::float64:
            a.values.resize(count);
            for (std::size_t i = 0; i < count; ++i) {
                double v;
                std::memcpy(&v, payload + 8 * i, 8);
                a.values[i] = static_cast<float>(v);  // IEEE: out-of-range values round to ±inf
            }
            break;
        case DType::boolean:
        case DType::uint8:
            a.bytes.assign(payload, payload + count);
            break;
        case DType::int32:
            a.integers.resize(count);
            for (std::size_t i = 0; i < count; ++i) {
                std::int32_t v;
                std::memcpy(&v, payload + 4 * i, 4);
                a.integers[i] = v;
            }
            break;
        case DType::int64:
            a.integers.resize(count);
            if (count) std::memcpy(a.integers.data(), payload, *nbytes);
            break;
        case DType::uint16:
            a.words.resize(count);
            if (count) std::memcpy(a.words.data(), payload, *nbytes);
            break;
    }
    return a;
}

Array load(const std::string& path, Accept accept) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status)) fail(path + ": cannot open (no such file)");
    if (!std::filesystem::is_regular_file(status)) fail(path + ": not a regular file");
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail(path + ": cannot open (" + std::strerror(errno) + ")");
    std::vector<std::uint8_t> bytes;
    std::uint8_t chunk[1 << 16];
    std::size_t got;
    while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) bytes.insert(bytes.end(), chunk, chunk + got);
    const bool read_error = std::ferror(f) != 0;
    std::fclose(f);
    if (read_error) fail(path + ": read error");
    try {
        return parse(bytes.data(), bytes.size(), accept);
    } catch (const error& e) {
        fail(path + ": " + e.what());
    }
}

void save(const std::string& path, const float* data, const std::vector<std::size_t>& shape) {
    std::size_t count = 1;
    for (std::size_t d : shape) {
        const auto next = checked_mul(count, d);
        if (!next) fail(path + ": shape " + shape_string(shape) + " overflows size_t");
        count = *next;
    }
    if (count > 0 && data == nullptr) fail(path + ": data is a null pointer");

    // repr() of the shape tuple, as NumPy writes it.
    std::string tuple("(");
    for (std::size_t i = 0; i < shape.size(); ++i) tuple.append(i ? ", " : "").append(std::to_string(shape[i]));
    if (shape.size() == 1) tuple += ",";
    tuple += ")";
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + tuple + ", }";
    // Pad with spaces so that the data starts at a multiple of 64 bytes; version 2.0 if it needs > 65535.
    const bool v2 = header.size() + 1 + 10 + 64 > 65535;
    const std::size_t prefix = v2 ? 12 : 10;
    const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
    header.append(total - prefix - header.size() - 1, ' ');
    header += '\n';

    std::vector<std::uint8_t> head(magic, magic + sizeof magic);
    head.push_back(v2 ? 2 : 1);
    head.push_back(0);
    for (std::size_t i = 0; i < prefix - 8; ++i) head.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
    head.insert(head.end(), header.begin(), header.end());

    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) fail(path + ": cannot create (" + std::strerror(errno) + ")");
    bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
    if (ok && count > 0) ok = std::fwrite(data, sizeof(float), count, f) == count;
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) {
        std::remove(path.c_str());
        fail(path + ": write failed");
    }
}

}  // namespace mha::npy
