// See npy_files.hpp.
#include "npy_files.hpp"

#include <unistd.h>

#include <cstdint>
#include <system_error>

namespace mha::tool {

namespace fs = std::filesystem;

std::optional<Input> load_input(const fs::path& dir, const std::string& file, bool required, npy::Accept accept) {
    const fs::path path = dir / file;
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    if (!exists && !ec) {
        if (required) fail(path.string() + ": required input is missing");
        return std::nullopt;
    }
    return Input{file, npy::load(path.string(), accept)};  // npy::load reports unreadable files itself
}

void require_float(const Input& in) {
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

fs::path output_path(const fs::path& dir, const std::string& out) {
    const fs::path path = out.empty() ? dir / "output.npy" : fs::path(out);
    const fs::path out_dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    if (!fs::is_directory(out_dir)) fail("cannot write " + path.string() + ": folder " + out_dir.string() + " does not exist");
    return path;
}

void write_outputs(const std::vector<OutputFile>& files) {
    const std::string suffix = ".tmp" + std::to_string(::getpid());
    std::vector<fs::path> written;
    try {
        for (const OutputFile& f : files) {
            written.push_back(f.path.string() + suffix);
            npy::save(written.back().string(), f.data->data(), f.shape);
        }
        for (std::size_t i = 0; i < files.size(); ++i) {
            fs::rename(written[i], files[i].path);
            written[i] = files[i].path;
        }
    } catch (...) {
        std::error_code ignored;
        for (const fs::path& p : written) fs::remove(p, ignored);
        throw;
    }
}

}  // namespace mha::tool
