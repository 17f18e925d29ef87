// `mha sdpa`: mha::scaled_dot_product_attention (PyTorch's F.scaled_dot_product_attention, eval, with
// grouped-query heads) on .npy files in DIR:
//   q.npy [B, H, Lq, d], k.npy and v.npy [B, Hkv, Lk, d] (H % Hkv == 0; query head h uses KV head h / (H / Hkv)),
//   optional key_padding_mask.npy [B, Lk] and attn_mask.npy [Lq, Lk] or [B·H, Lq, Lk] (bool/uint8: true =
//   masked; float: added to the scores). Writes output.npy [B, H, Lq, d] (float32) in DIR or at --out.
//   --causal masks key j for query i when j > i (top-left), --causal-bottom-right when j > i + Lk − Lq;
//   --scale replaces 1/√d. Score modifiers: --window-left / --window-right / --softcap / --alibi, and
//   sinks.npy [H], alibi_slopes.npy [H] in DIR (mha/attention.hpp's ScoreModifiers).
// As `mha run`: load and check everything, compute, then write under a temporary name and rename, so an
// error leaves no output file behind.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "npy.hpp"
#include "npy_files.hpp"

namespace mha::tool {

namespace {

namespace fs = std::filesystem;

std::string str(std::size_t n) { return std::to_string(n); }

Input load_heads(const fs::path& dir, const std::string& file, const std::string& layout) {
    Input in = *load_input(dir, file, true);
    require_float(in);
    if (in.shape().size() != 4) fail(file + " has shape " + in.shape_str() + " but must be " + layout);
    return in;
}

}  // namespace

void sdpa_command(const SdpaCommandOptions& opt) {
    const fs::path dir(opt.npy_dir);
    if (!fs::is_directory(dir)) fail(opt.npy_dir + ": not a folder (--npy)");
    const fs::path out_path = output_path(dir, opt.out);

    // --- load and check ----------------------------------------------------------------------
    const Input q = load_heads(dir, "q.npy", "[B, H, Lq, d]");
    const Input k = load_heads(dir, "k.npy", "[B, Hkv, Lk, d]");
    const Input v = load_heads(dir, "v.npy", "[B, Hkv, Lk, d]");
    const std::size_t B = q.shape()[0], H = q.shape()[1], Lq = q.shape()[2], d = q.shape()[3];
    const std::size_t Hkv = k.shape()[1], Lk = k.shape()[2];
    const std::string both = " (q.npy " + q.shape_str() + " = [B, H, Lq, d], k.npy " + k.shape_str() + " = [B, Hkv, Lk, d])";
    if (k.shape()[0] != B) fail("k.npy has batch " + str(k.shape()[0]) + " but q.npy has batch " + str(B) + both);
    if (k.shape()[3] != d) fail("k.npy has head dim " + str(k.shape()[3]) + " but q.npy has head dim " + str(d) + both);
    if (Hkv == 0 ? H != 0 : H % Hkv != 0)
        fail("q.npy has " + str(H) + " heads, not a multiple of k.npy's " + str(Hkv) + " heads" + both);
    if (v.shape() != k.shape())
        fail("v.npy has shape " + v.shape_str() + " but k.npy has shape " + k.shape_str() + "; they must be equal ([B, Hkv, Lk, d])");

    const std::optional<Input> kpm = load_input(dir, "key_padding_mask.npy", false);
    if (kpm && kpm->shape() != std::vector<std::size_t>{B, Lk})
        fail("key_padding_mask.npy has shape " + kpm->shape_str() + " but must be [B, Lk] = " + npy::shape_string({B, Lk}) +
             " (B from q.npy " + q.shape_str() + ", Lk from k.npy " + k.shape_str() + ")");
    const std::optional<Input> attn_mask = load_input(dir, "attn_mask.npy", false);
    if (attn_mask) require_attn_mask_shape(*attn_mask, B, H, Lq, Lk, " (from q.npy " + q.shape_str() + " and k.npy " + k.shape_str() + ")");
    const LoadedModifiers mods = load_modifiers(dir, opt.modifiers, H);

    // --- compute (the library validates the rest, e.g. the scale, and throws mha::invalid_argument) ---
    SdpaInputs in;
    in.query = ConstHeads::bhld(q.floats(), B, H, Lq, d);
    in.key = ConstHeads::bhld(k.floats(), B, Hkv, Lk, d);
    in.value = ConstHeads::bhld(v.floats(), B, Hkv, Lk, d);
    if (kpm) in.key_padding_mask = mask_view(*kpm, kpm->shape());
    if (attn_mask) in.attn_mask = mask_view(*attn_mask, attn_mask->shape());
    std::vector<float> output(q.array.size());
    SdpaOptions so;
    so.causal = opt.causal;
    so.causal_alignment = opt.causal_alignment;
    so.scale = opt.scale;
    so.backend = opt.backend;
    so.threads = opt.threads;
    so.impl = opt.impl;
    so.modifiers = mods.view;
    scaled_dot_product_attention(in, Heads::bhld(output.data(), B, H, Lq, d), so);

    // --- write -----------------------------------------------------------------------------------
    write_outputs({{out_path, &output, q.shape()}});
}

}  // namespace mha::tool
