// Reader and writer of NumPy .npy files (format versions 1.0, 2.0 and 3.0), for the mha tool and tests.
//
// The reader treats its input as untrusted: the header must be exactly the dict NumPy writes
// ({'descr': ..., 'fortran_order': False, 'shape': (...), } in any key order), the dtype one of
// '<f4', '<f8', '|b1', '|u1' (and, only when the caller asks for them with Accept::with_integers, the
// integers '<i4', '<i8'; with Accept::with_bf16_bits, '<u2': bfloat16 bit patterns as uint16), the data C-ordered, and the data length exactly count · itemsize.
// Anything else throws npy::error with a one-line message naming the problem.
// The writer writes float32 ('<f4'), C order, format 1.0 (2.0 only if the header needs it).
// Byte order: the host must be little-endian (checked at compile time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mha::npy {

class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class DType { float32, float64, boolean, uint8, int32, int64, uint16 };

// The dtypes a parse accepts: by default the float, bool and uint8 ones (what the attention inputs may
// be); with_integers adds int32 '<i4' and int64 '<i8' (index files such as past_lengths.npy); with_bf16_bits
// adds uint16 '<u2' (bfloat16 values stored as their bits, `mha run --bf16-raw`).
enum class Accept { default_types, with_integers, with_bf16_bits };

struct Array {
    DType dtype = DType::float32;         // as stored in the file
    std::vector<std::size_t> shape;
    std::vector<float> values;            // float32 / float64 files (float64 converted to float); else empty
    std::vector<std::uint8_t> bytes;      // bool / uint8 files; else empty
    std::vector<std::int64_t> integers;   // int32 / int64 files (int32 widened); else empty
    std::vector<std::uint16_t> words;     // uint16 files; else empty
    std::size_t size() const;             // product of shape (1 for a 0-d array)
};

// Parses a whole .npy file held in memory. Throws npy::error.
Array parse(const std::uint8_t* data, std::size_t size, Accept accept = Accept::default_types);
// Reads and parses a file. Throws npy::error "<path>: <what is wrong>".
Array load(const std::string& path, Accept accept = Accept::default_types);
// Writes data [shape] as float32 '<f4', C order. Throws npy::error "<path>: <what is wrong>";
// on failure the partly written file is removed.
void save(const std::string& path, const float* data, const std::vector<std::size_t>& shape);

// "float32", "float64", "bool", "uint8", "int32", "int64", "uint16".
const char* dtype_name(DType dtype) noexcept;
// "[2, 3]" (and "[]" for a 0-d array).
std::string shape_string(const std::vector<std::size_t>& shape);

}  // namespace mha::npy
