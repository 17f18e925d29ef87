// See npy_files.hpp.
#include "npy_files.hpp"

#include <unistd.h>

#include <cstdint>
#include <system_error>

namespace mha::tool {

namespace fs = std::filesystem;

namespace {
bool bf16_raw = false;  // set_bf16_raw
}  // namespace

void set_bf16_raw(bool on) { bf16_raw = on; }

std::optional<Input> load_input(const fs::path& dir, const std::string& file, bool required, npy::Accept accept) {
    const fs::path path = dir / file;
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    if (!exists && !ec) {
        if (required) fail(path.string() + ": required input is missing");
        return std::nullopt;
    }
    // The default types plus uint16, so that bfloat16 bits are read with --bf16-raw and named without it.
    if (accept == npy::Accept::default_types) accept = npy::Accept::with_bf16_bits;
    Input in{file, npy::load(path.string(), accept)};  // npy::load reports unreadable files itself
    if (in.array.dtype == npy::DType::uint16) {
        if (!bf16_raw)
            fail(file + " has dtype uint16: bfloat16 bit patterns are read with mha run --bf16-raw; other inputs must be "
                        "float32, float64, bool or uint8");
        in.array.values.resize(in.array.words.size());
        for (std::size_t i = 0; i < in.array.words.size(); ++i) in.array.values[i] = bfloat16::from_bits(in.array.words[i]).to_float();
        in.array.words.clear();
        in.array.dtype = npy::DType::float32;
        in.bf16_bits = true;
    }
    return in;
}

void require_float(const Input& in) {
    if (bf16_raw && !in.bf16_bits)
        fail(in.file + " has dtype " + npy::dtype_name(in.array.dtype) +
             " but --bf16-raw needs uint16 arrays of bfloat16 bit patterns for every float input and weight");
    if (in.array.dtype != npy::DType::float32 && in.array.dtype != npy::DType::float64)
        fail(in.file + " has dtype " + npy::dtype_name(in.array.dtype) + " but must be float32 or float64");
}

void require_shape(const Input& in, const std::vector<std::size_t>& want, const std::string& formula) {
    if (in.shape() != want)
        fail(in.file + " has shape " + in.shape_str() + " but must be " + formula + " = " + npy::shape_string(want));
}

void require_attn_mask_shape(const Input& mask, std::size_t B, std::size_t H, std::size_t Lq, std::size_t Lk,
                             const std::string& from) {
    const auto& s = mask.shape();
    std::size_t BH = 0;
    const bool bh_fits = !__builtin_mul_overflow(B, H, &BH);
    const bool ok = (s.size() == 2 && s[0] == Lq && s[1] == Lk) || (s.size() == 3 && bh_fits && s[0] == BH && s[1] == Lq && s[2] == Lk);
    if (!ok)
        fail(mask.file + " has shape " + mask.shape_str() + " but must be [Lq, Lk] = " + npy::shape_string({Lq, Lk}) +
             " or [B·H, Lq, Lk] = [" + std::to_string(B) + "·" + std::to_string(H) + ", " + std::to_string(Lq) + ", " +
             std::to_string(Lk) + "]" + from);
}

MaskView mask_view(const Input& in, const std::vector<std::size_t>& dims) {
    const bool boolean = in.array.dtype == npy::DType::boolean || in.array.dtype == npy::DType::uint8;
    const std::uint8_t* bools = in.array.bytes.data();
    const float* values = in.array.values.data();
    if (dims.size() == 2)
        return boolean ? MaskView::boolean(bools, dims[0], dims[1]) : MaskView::additive(values, dims[0], dims[1]);
    return boolean ? MaskView::boolean(bools, dims[0], dims[1], dims[2]) : MaskView::additive(values, dims[0], dims[1], dims[2]);
}

LoadedModifiers load_modifiers(const fs::path& dir, const ModifierOptions& flags, std::size_t H) {
    LoadedModifiers m;
    m.view.window_left = flags.window_left.value_or(-1);
    m.view.window_right = flags.window_right.value_or(-1);
    m.view.softcap = flags.softcap.value_or(0.0f);
    auto per_head = [&](const std::string& file) {
        std::vector<float> v;
        if (const std::optional<Input> in = load_input(dir, file, false)) {
            require_float(*in);
            require_shape(*in, {H}, "[H] (H = " + std::to_string(H) + ")");
            v.assign(in->floats(), in->floats() + H);
        }
        return v;
    };
    m.sinks = per_head("sinks.npy");
    m.slopes = per_head("alibi_slopes.npy");
    if (flags.alibi) {
        if (!m.slopes.empty()) fail("--alibi (the standard slopes) and alibi_slopes.npy both give ALiBi slopes: use one");
        m.slopes = alibi_standard_slopes(H);
    }
    m.view.sinks = m.sinks.empty() ? nullptr : m.sinks.data();
    m.view.alibi_slopes = m.slopes.empty() ? nullptr : m.slopes.data();
    return m;
}

fs::path output_path(const fs::path& dir, const std::string& out) {
    const fs::path path = out.empty() ? dir / "output.npy" : fs::path(out);
    const fs::path out_dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (!fs::is_directory(out_dir)) fail("cannot write " + path.string() + ": folder " + out_dir.string() + " does not exist");
    return path;
}

void write_outputs(const std::vector<OutputFile>& files) {
    // A target that exists but is not a regular file (a folder, say) would fail its rename after earlier renames
    // had replaced their files: refused before anything is written.
    for (const OutputFile& f : files) {
        std::error_code ec;
        const fs::file_status st = fs::status(f.path, ec);
        if (fs::exists(st) && !fs::is_regular_file(st))
            fail("cannot write " + f.path.string() + ": it exists and is not a regular file");
    }
    const std::string suffix = ".tmp" + std::to_string(::getpid());
    std::vector<fs::path> temps;
    std::error_code ignored;
    try {
        for (const OutputFile& f : files) {
            temps.push_back(f.path.string() + suffix);
            npy::save(temps.back().string(), f.data->data(), f.shape);
        }
    } catch (...) {
        for (const fs::path& p : temps) fs::remove(p, ignored);
        throw;
    }
    // Each rename replaces its target whole. Should one still fail, the files renamed before it stay (they are
    // the new outputs; removing them would lose the old ones too) and the other temporaries go.
    for (std::size_t i = 0; i < files.size(); ++i) {
        try {
            fs::rename(temps[i], files[i].path);
        } catch (...) {
            for (std::size_t j = i; j < temps.size(); ++j) fs::remove(temps[j], ignored);
            throw;
        }
    }
}

}  // namespace mha::tool
