// `mha run`: multi-head attention on PyTorch-named .npy files.
//   DIR/query.npy [B, Lq, E] or [Lq, E] (unbatched), key.npy / value.npy [B, Lk, E] (default: query;
//   value defaults to key), in_proj_weight.npy [3E, E], in_proj_bias.npy [3E], out_proj.weight.npy [E, E],
//   out_proj.bias.npy [E], key_padding_mask.npy [B, Lk] ([Lk] unbatched), attn_mask.npy [Lq, Lk] or
//   [B·H, Lq, Lk] (bool/uint8: true = masked; float: added to the scores), norm.weight.npy / norm.bias.npy [E]
//   (only with --norm-eps). Writes output.npy (float32, the query's shape) and, with --need-weights,
//   attn_weights.npy [B, Lq, Lk] ([Lq, Lk] unbatched) next to it.
//   --seq-first (PyTorch's batch_first=False): query.npy [Lq, B, E], key.npy / value.npy [Lk, B, E] and
//   output.npy [Lq, B, E]; masks and attn_weights.npy keep the shapes above, and unbatched [L, E] files
//   are the same in both layouts. The arrays go to the library as strided views (row stride B·E, batch
//   stride E) and the output is written in place in [Lq, B, E]: nothing is transposed.
// Order of work: load and check everything, compute, then write each file under a temporary name and
// rename, so an error leaves no output file behind.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "npy.hpp"

namespace mha::tool {

namespace {

namespace fs = std::filesystem;

struct Input {
    std::string file;  // "query.npy": the name used in messages
    npy::Array array;
    const std::vector<std::size_t>& shape() const { return array.shape; }
    std::string shape_str() const { return npy::shape_string(array.shape); }
};

[[noreturn]] void fail(const std::string& message) { throw tool_error(message); }

std::optional<Input> load_input(const fs::path& dir, const std::string& file, bool required) {
    const fs::path path = dir / file;
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    if (!exists && !ec) {
        if (required) fail((path.string() + ": required input is missing"));
        return std::nullopt;
    }
    return Input{file, npy::load(path.string())};  // npy::load reports unreadable files itself
}

void require_float(const Input& in) {
    if (in.array.dtype != npy::DType::float32 && in.array.dtype != npy::DType::float64)
        fail(in.file + " has dtype " + npy::dtype_name(in.array.dtype) + " but must be float32 or float64");
}

void require_shape(const Input& in, const std::vector<std::size_t>& want, const std::string& formula) {
    if (in.shape() != want)
        fail(in.file + " has shape " + in.shape_str() + " but must be " + formula + " = " + npy::shape_string(want));
}

// The mask as the library's view, with dims (the file's shape, or [1, Lk] for an unbatched key_padding_mask).
MaskView mask_view(const Input& in, const std::vector<std::size_t>& dims) {
    const bool boolean = in.array.dtype == npy::DType::boolean || in.array.dtype == npy::DType::uint8;
    const std::uint8_t* bools = in.array.bytes.data();
    const float* values = in.array.values.data();
    if (dims.size() == 2)
        return boolean ? MaskView::boolean(bools, dims[0], dims[1]) : MaskView::additive(values, dims[0], dims[1]);
    return boolean ? MaskView::boolean(bools, dims[0], dims[1], dims[2]) : MaskView::additive(values, dims[0], dims[1], dims[2]);
}

struct OutputFile {
    fs::path path;
    const std::vector<float>* data;
    std::vector<std::size_t> shape;
};

// Writes every file under a temporary name, then renames them all; on any failure removes what it wrote.
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

}  // namespace

void run_command(const RunOptions& opt) {
    const fs::path dir(opt.npy_dir);
    if (!fs::is_directory(dir)) fail(opt.npy_dir + ": not a folder (--npy)");

    const fs::path out_path = opt.out.empty() ? dir / "output.npy" : fs::path(opt.out);
    const fs::path weights_path = out_path.parent_path() / "attn_weights.npy";
    if (opt.need_weights && out_path.lexically_normal() == weights_path.lexically_normal())
        fail("output " + out_path.string() + " would be overwritten by attn_weights.npy (--need-weights)");
    const fs::path out_dir = out_path.parent_path().empty() ? fs::path(".") : out_path.parent_path();
    if (!fs::is_directory(out_dir)) fail("cannot write " + out_path.string() + ": folder " + out_dir.string() + " does not exist");

    // --- load and check ----------------------------------------------------------------------
    // Where B and L sit in a batched [B, L, E] (or, with --seq-first, [L, B, E]) file.
    const std::size_t batch_axis = opt.seq_first ? 1 : 0, length_axis = opt.seq_first ? 0 : 1;
    const std::string q_layout = opt.seq_first ? "[Lq, B, E] (--seq-first)" : "[B, Lq, E]";
    const std::string k_layout = opt.seq_first ? "[Lk, B, E]" : "[B, Lk, E]";

    const Input query = *load_input(dir, "query.npy", true);
    require_float(query);
    if (query.shape().size() != 2 && query.shape().size() != 3)
        fail("query.npy has shape " + query.shape_str() + " but must be " + q_layout + " or [Lq, E] (unbatched)");
    const bool batched = query.shape().size() == 3;
    const std::size_t B = batched ? query.shape()[batch_axis] : 1;
    const std::size_t Lq = query.shape()[batched ? length_axis : 0];
    const std::size_t E = query.shape().back();
    const std::string E_is = " (E = " + std::to_string(E) + " from query.npy)";

    const std::optional<Input> key = load_input(dir, "key.npy", false);
    const std::optional<Input> value = load_input(dir, "value.npy", false);
    const Input& key_or_query = key ? *key : query;
    if (key) {
        require_float(*key);
        const auto& s = key->shape();
        const bool ok = s.size() == query.shape().size() && s.back() == E && (!batched || s[batch_axis] == B);
        if (!ok)
            fail("key.npy has shape " + key->shape_str() + " but query.npy has shape " + query.shape_str() +
                 (batched ? ": key must be " + k_layout + " with the query's B and E" : ": key must be [Lk, E] with the query's E"));
    }
    if (value) {
        require_float(*value);
        if (value->shape() != key_or_query.shape())
            fail("value.npy has shape " + value->shape_str() + " but " + key_or_query.file + " has shape " +
                 key_or_query.shape_str() + "; they must be equal");
    }
    const std::size_t Lk = key_or_query.shape()[batched ? length_axis : 0];

    // Parameters: float, exactly the shape the formula gives.
    auto load_param = [&](const std::string& file, bool required, const std::vector<std::size_t>& want,
                          const std::string& formula) {
        std::optional<Input> p = load_input(dir, file, required);
        if (p) {
            require_float(*p);
            require_shape(*p, want, formula + E_is);
        }
        return p;
    };
    const std::optional<Input> in_w = load_param("in_proj_weight.npy", true, {3 * E, E}, "[3E, E]");
    const std::optional<Input> in_b = load_param("in_proj_bias.npy", false, {3 * E}, "[3E]");
    const std::optional<Input> out_w = load_param("out_proj.weight.npy", true, {E, E}, "[E, E]");
    const std::optional<Input> out_b = load_param("out_proj.bias.npy", false, {E}, "[E]");
    // Without --norm-eps there is no norm block, so its weights are not read.
    const std::optional<Input> norm_w = opt.norm_eps ? load_param("norm.weight.npy", false, {E}, "[E]") : std::nullopt;
    const std::optional<Input> norm_b = opt.norm_eps ? load_param("norm.bias.npy", false, {E}, "[E]") : std::nullopt;

    const std::optional<Input> kpm = load_input(dir, "key_padding_mask.npy", false);
    if (kpm) {
        const std::vector<std::size_t> want = batched ? std::vector<std::size_t>{B, Lk} : std::vector<std::size_t>{Lk};
        if (kpm->shape() != want)
            fail("key_padding_mask.npy has shape " + kpm->shape_str() + " but must be " + (batched ? "[B, Lk]" : "[Lk]") +
                 " = " + npy::shape_string(want) + " (from query.npy " + query.shape_str() + (batched ? " = " + q_layout : "") +
                 " and " + key_or_query.file + " " + key_or_query.shape_str() + ")");
    }
    const std::optional<Input> attn_mask = load_input(dir, "attn_mask.npy", false);
    if (attn_mask) {
        const auto& s = attn_mask->shape();
        std::size_t BH = 0;
        const bool bh_fits = !__builtin_mul_overflow(B, opt.heads, &BH);
        const bool ok = (s.size() == 2 && s[0] == Lq && s[1] == Lk) ||
                        (s.size() == 3 && bh_fits && s[0] == BH && s[1] == Lq && s[2] == Lk);
        if (!ok)
            fail("attn_mask.npy has shape " + attn_mask->shape_str() + " but must be [Lq, Lk] = " +
                 npy::shape_string({Lq, Lk}) + " or [B·H, Lq, Lk] = [" + std::to_string(B) + "·" +
                 std::to_string(opt.heads) + ", " + std::to_string(Lq) + ", " + std::to_string(Lk) + "]");
    }

    // --- compute (the library validates the rest, e.g. E % H, and throws mha::invalid_argument) ---
    AttentionWeights weights;
    weights.in_proj_weight = in_w->array.values.data();
    weights.in_proj_bias = in_b ? in_b->array.values.data() : nullptr;
    weights.out_proj_weight = out_w->array.values.data();
    weights.out_proj_bias = out_b ? out_b->array.values.data() : nullptr;
    weights.norm_weight = norm_w ? norm_w->array.values.data() : nullptr;
    weights.norm_bias = norm_b ? norm_b->array.values.data() : nullptr;
    const MultiheadAttention attention(weights, E, opt.heads);

    // [B, L, E]: row stride E, batch stride L·E; [L, B, E]: row stride B·E, batch stride E.
    const auto view = [&](const float* data, std::size_t L) {
        return opt.seq_first ? ConstBatch(data, B, L, E, B * E, E) : ConstBatch(data, B, L, E);
    };
    AttentionInputs inputs;
    inputs.query = view(query.array.values.data(), Lq);
    if (key) inputs.key = view(key->array.values.data(), Lk);
    if (value) inputs.value = view(value->array.values.data(), Lk);
    if (kpm) inputs.key_padding_mask = mask_view(*kpm, {B, Lk});
    if (attn_mask) inputs.attn_mask = mask_view(*attn_mask, attn_mask->shape());

    std::size_t weights_count = 0;
    if (__builtin_mul_overflow(B * Lq, Lk, &weights_count)) fail("attention weights [B, Lq, Lk] would overflow size_t");
    std::vector<float> output(query.array.size());
    std::vector<float> attn_weights(opt.need_weights ? weights_count : 0);
    AttentionOutputs outputs;
    outputs.output = opt.seq_first ? Batch(output.data(), B, Lq, E, B * E, E) : Batch(output.data(), B, Lq, E);
    outputs.attn_weights = opt.need_weights ? attn_weights.data() : nullptr;

    ForwardOptions fo;
    fo.causal = opt.causal;
    fo.need_weights = opt.need_weights ? NeedWeights::averaged : NeedWeights::none;
    fo.norm_eps = opt.norm_eps;
    fo.backend = opt.backend;
    fo.threads = opt.threads;
    fo.impl = opt.impl;
    attention.forward(inputs, outputs, fo);

    // --- write -----------------------------------------------------------------------------------
    const std::vector<std::size_t> weights_shape = batched ? std::vector<std::size_t>{B, Lq, Lk} : std::vector<std::size_t>{Lq, Lk};
    std::vector<OutputFile> files{{out_path, &output, query.shape()}};
    if (opt.need_weights) files.push_back({weights_path, &attn_weights, weights_shape});
    write_outputs(files);
}

}  // namespace mha::tool
