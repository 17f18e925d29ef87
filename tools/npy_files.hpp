// Input and output .npy files of the `mha run` and `mha sdpa` commands: loading a named file from the
// --npy folder, dtype checks, masks as library views, and writing outputs under temporary names that are
// renamed only once every file is written (so an error leaves no output file behind).
#pragma once
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "commands.hpp"
#include "npy.hpp"

namespace mha::tool {

[[noreturn]] inline void fail(const std::string& message) { throw tool_error(message); }

struct Input {
    std::string file;  // "query.npy": the name used in messages
    npy::Array array;
    bool bf16_bits = false;  // read from uint16 bfloat16 bits (--bf16-raw), widened into array.values
    const std::vector<std::size_t>& shape() const { return array.shape; }
    std::string shape_str() const { return npy::shape_string(array.shape); }
    const float* floats() const { return array.values.data(); }
};

// dir/file, or nullopt when it does not exist (a tool_error "<path>: required input is missing" when
// required). npy::load reports unreadable files itself; `accept` says which dtypes it takes. With the
// default types, a uint16 file is read too: with set_bf16_raw(true) its values are bfloat16 bit patterns,
// widened exactly to float32 (bf16_bits set); otherwise it is a tool_error naming --bf16-raw.
std::optional<Input> load_input(const std::filesystem::path& dir, const std::string& file, bool required,
                                npy::Accept accept = npy::Accept::default_types);

// `mha run --bf16-raw`: float inputs and weights are read as uint16 bfloat16 bits (process-wide; off by
// default).
void set_bf16_raw(bool on);

// A tool_error unless the file holds float32 or float64 values; with --bf16-raw, unless it held uint16
// bfloat16 bits.
void require_float(const Input& in);

// A tool_error "<file> has shape [..] but must be <formula> = [..]" unless the shape is `want`.
void require_shape(const Input& in, const std::vector<std::size_t>& want, const std::string& formula);

// A tool_error unless attn_mask.npy is [Lq, Lk] or [B·H, Lq, Lk]; `from` ends the message (where B, H, Lq
// and Lk came from).
void require_attn_mask_shape(const Input& mask, std::size_t B, std::size_t H, std::size_t Lq, std::size_t Lk,
                             const std::string& from);

// A mask file (bool/uint8: nonzero = masked; float: added to the scores) as the library's view with dims
// (rank 2 or 3; the file's own shape, or e.g. [1, Lk] for an unbatched key_padding_mask).
MaskView mask_view(const Input& in, const std::vector<std::size_t>& dims);

// The score modifiers of `mha run` / `mha sdpa` for H query heads: the flags, sinks.npy [H] and
// alibi_slopes.npy [H] from dir (float32/float64). `view` points into the vectors (keep the object alive).
struct LoadedModifiers {
    std::vector<float> sinks, slopes;
    ScoreModifiers view;
};
LoadedModifiers load_modifiers(const std::filesystem::path& dir, const ModifierOptions& flags, std::size_t H);

// The output path (--out, or <dir>/output.npy); a tool_error when its folder does not exist.
std::filesystem::path output_path(const std::filesystem::path& dir, const std::string& out);

struct OutputFile {
    std::filesystem::path path;
    const std::vector<float>* data;
    std::vector<std::size_t> shape;
};

// Writes every file under a temporary name, then renames them all; on any failure removes what it wrote.
void write_outputs(const std::vector<OutputFile>& files);

}  // namespace mha::tool
