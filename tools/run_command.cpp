// `mha run`: multi-head attention on PyTorch-named .npy files (H = --heads, Hkv = --kv-heads, default H;
// d = the head dim, below).
//   DIR/query.npy [B, Lq, E] or [Lq, E] (unbatched); key.npy [B, Lk, kdim] (default: query) and
//   value.npy [B, Lk, vdim] (default: key).
//   Input projections, one of two sets:
//     packed    in_proj_weight.npy [H·d + 2·Hkv·d, E] (nn.MultiheadAttention's [3E, E]; needs kdim = vdim = E)
//     separate  q_proj_weight.npy [H·d, E], k_proj_weight.npy [Hkv·d, kdim], v_proj_weight.npy [Hkv·d, vdim]
//               (nn.MultiheadAttention's names when kdim / vdim != E; Hugging Face's q_proj / k_proj / v_proj)
//   in_proj_bias.npy [H·d + 2·Hkv·d] (q; k; v), out_proj.weight.npy [E, H·d], out_proj.bias.npy [E],
//   key_padding_mask.npy [B, Lk] ([Lk] unbatched), attn_mask.npy [Lq, Lk] or [B·H, Lq, Lk] (bool/uint8:
//   true = masked; float: added to the scores), norm.weight.npy / norm.bias.npy [E] (only with --norm-eps).
//   The head dim d: --head-dim; without it q_proj_weight.npy's rows / H (separate weights) or E / H (packed).
//   Writes output.npy (float32, the query's shape) and, with --need-weights, attn_weights.npy [B, Lq, Lk]
//   ([Lq, Lk] unbatched) next to it.
//   --rope-theta T turns on rotary embeddings (--rope-style half|interleaved, --rope-dims R) at positions
//   --position-offset + i; --causal masks key j > i, --causal-bottom-right key j > i + Lk − Lq.
//   --seq-first (PyTorch's batch_first=False): query.npy [Lq, B, E], key.npy / value.npy [Lk, B, kdim / vdim]
//   and output.npy [Lq, B, E]; masks and attn_weights.npy keep the shapes above, and unbatched [L, E] files
//   are the same in both layouts. The arrays go to the library as strided views (row stride B·E, batch
//   stride E) and the output is written in place in [Lq, B, E]: nothing is transposed.
//   KV cache (incremental decoding), when past_key.npy / past_value.npy are in DIR or --chunk N is given:
//     past_key.npy, past_value.npy [B, Hkv, Lp, d] (float; projected and rotated: Hugging Face's
//     past_key_values; [Hkv, Lp, d] with an unbatched query), past_lengths.npy [B] ([] unbatched; int32 or
//     int64; each <= Lp, default Lp): the query tokens continue those sequences. The tool builds a
//     mha::KVCache(B, Hkv, d, capacity Lp + Lq), appends sequence b's first past_lengths[b] rows, then runs
//     MultiheadAttention::forward with the cache: the new tokens are rotated at positions past_lengths[b] + i
//     and attend causally (bottom-right) over past and new tokens. --chunk N feeds the query N tokens per
//     call (with or without a past). Writes output.npy and present_key.npy / present_value.npy
//     [B, Hkv, Lp + Lq, d] beside it: sequence b's first past_lengths[b] + Lq rows are its cache rows, the
//     rest zeros. Self-attention only (no key.npy / value.npy), no masks, no --need-weights, no
//     --position-offset, no --causal-bottom-right (--causal may be given: it is what happens anyway).
//     --kv-type f32|bf16|f16|int8|fp8_e4m3|fp8_e5m2 (only on this path; default f32): the cache's element type.
//     Past and new K and V are rounded into it (round to nearest even; mha/quantized.hpp for the 8-bit types),
//     attention uses the stored values, and present_*.npy (float32) hold them dequantized. --k-scale S and
//     --v-scale S: an fp8 cache's scales (default 1; other types refuse scales other than 1).
//   Score modifiers (AttentionConfig::modifiers): --window-left N, --window-right N, --softcap C, --alibi (standard
//   slopes), and sinks.npy [H], alibi_slopes.npy [H] in DIR; on every path, the KV cache's included.
//   --dtype f32|bf16 sets AttentionConfig::compute (float .npy inputs are converted as the library rounds them).
//   --bf16-raw: every float input and weight file (query, key, value, the projection weights and biases,
//   norm.*, past_key / past_value) must be a uint16 array of bfloat16 bit patterns, widened exactly to float;
//   masks may be bool / uint8, float32 or uint16 bits; outputs stay float32. Independent of --dtype.
// Order of work: load and check everything, compute, then write each file under a temporary name and
// rename, so an error leaves no output file behind.
#include <algorithm>
#include <cstdint>
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

// a·b, or a tool_error naming the product when it overflows size_t.
std::size_t checked_mul(std::size_t a, std::size_t b, const std::string& what) {
    std::size_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail(what + " = " + str(a) + " × " + str(b) + " overflows size_t");
    return r;
}

// A projection weight [heads·d, cols] (rows_formula "H·d" or "Hkv·d", cols_name "E", "kdim" or "vdim"):
// "<file> has 16 rows but --kv-heads 4 × head dim 8 = 32 (<note>)", or a shape message naming the columns.
void check_projection(const Input& w, const std::string& rows_formula, const std::string& heads_flag, std::size_t heads,
                      std::size_t d, const std::string& note, const std::string& cols_name, std::size_t cols,
                      const std::string& cols_source) {
    require_float(w);
    const std::size_t rows = heads * d;  // checked by the caller
    const auto& s = w.shape();
    if (s.size() == 2 && s[0] != rows)
        fail(w.file + " has " + str(s[0]) + " rows but " + heads_flag + " " + str(heads) + " × head dim " + str(d) + " = " +
             str(rows) + " (" + note + ")");
    if (s.size() != 2 || s[1] != cols)
        fail(w.file + " has shape " + w.shape_str() + " but must be [" + rows_formula + ", " + cols_name + "] = " +
             npy::shape_string({rows, cols}) + " (" + cols_name + " = " + str(cols) + " from " + cols_source + ")");
}

// --k-scale / --v-scale given with a value other than 1 (1 means no scale, as in the library).
bool scales_given(const RunOptions& opt) { return opt.k_scale.value_or(1.0f) != 1.0f || opt.v_scale.value_or(1.0f) != 1.0f; }

}  // namespace

void run_command(const RunOptions& opt) {
    const fs::path dir(opt.npy_dir);
    if (!fs::is_directory(dir)) fail(opt.npy_dir + ": not a folder (--npy)");
    set_bf16_raw(opt.bf16_raw);
    if (!opt.rope_theta && (opt.rope_style || opt.rope_dims))
        fail(std::string(opt.rope_style ? "--rope-style" : "--rope-dims") + " needs --rope-theta");

    const fs::path out_path = output_path(dir, opt.out);
    const fs::path weights_path = out_path.parent_path() / "attn_weights.npy";
    if (opt.need_weights && out_path.lexically_normal() == weights_path.lexically_normal())
        fail("output " + out_path.string() + " would be overwritten by attn_weights.npy (--need-weights)");
    const fs::path present_k_path = out_path.parent_path() / "present_key.npy";
    const fs::path present_v_path = out_path.parent_path() / "present_value.npy";

    // --- load and check ----------------------------------------------------------------------
    // Where B and L sit in a batched [B, L, E] (or, with --seq-first, [L, B, E]) file.
    const std::size_t batch_axis = opt.seq_first ? 1 : 0, length_axis = opt.seq_first ? 0 : 1;
    const std::string q_layout = opt.seq_first ? "[Lq, B, E] (--seq-first)" : "[B, Lq, E]";

    const Input query = *load_input(dir, "query.npy", true);
    require_float(query);
    if (query.shape().size() != 2 && query.shape().size() != 3)
        fail("query.npy has shape " + query.shape_str() + " but must be " + q_layout + " or [Lq, E] (unbatched)");
    const bool batched = query.shape().size() == 3;
    const std::size_t B = batched ? query.shape()[batch_axis] : 1;
    const std::size_t Lq = query.shape()[batched ? length_axis : 0];
    const std::size_t E = query.shape().back();
    const std::string E_is = " (E = " + str(E) + " from query.npy)";

    // Which projections: packed in_proj_weight.npy or separate q/k/v_proj_weight.npy, exactly one set.
    const auto present = [&](const char* file) {
        std::error_code ec;
        return fs::exists(dir / file, ec) || ec;  // an unreadable entry is reported by the loader
    };
    const bool has_in = present("in_proj_weight.npy"), has_q = present("q_proj_weight.npy");
    const bool has_k = present("k_proj_weight.npy"), has_v = present("v_proj_weight.npy");
    if (has_in && (has_q || has_k || has_v))
        fail(std::string(has_q ? "q_proj_weight.npy" : has_k ? "k_proj_weight.npy" : "v_proj_weight.npy") +
             " and in_proj_weight.npy are both present: give either the packed projections (in_proj_weight.npy) or "
             "the separate ones (q_proj_weight.npy, k_proj_weight.npy, v_proj_weight.npy), not both");
    if (!has_in && !has_q && !has_k && !has_v)
        fail((dir / "in_proj_weight.npy").string() +
             ": required input is missing (or give q_proj_weight.npy, k_proj_weight.npy and v_proj_weight.npy)");
    const bool separate = !has_in;
    if (separate)
        for (const auto& [file, has] : {std::pair{"q_proj_weight.npy", has_q}, {"k_proj_weight.npy", has_k}, {"v_proj_weight.npy", has_v}})
            if (!has)
                fail((dir / file).string() + ": required input is missing (separate projections need q_proj_weight.npy, "
                                             "k_proj_weight.npy and v_proj_weight.npy)");

    // The KV cache path: past_key.npy / past_value.npy (a past to continue) or --chunk.
    const bool has_past_k = present("past_key.npy"), has_past_v = present("past_value.npy");
    const bool has_past_len = present("past_lengths.npy");
    if (has_past_k != has_past_v)
        fail(std::string(has_past_k ? "past_key.npy is present but past_value.npy is missing"
                                    : "past_value.npy is present but past_key.npy is missing") +
             ": a past needs both (Hugging Face's past_key_values, [B, Hkv, Lp, d] each)");
    if (has_past_len && !has_past_k)
        fail("past_lengths.npy is present without past_key.npy and past_value.npy (it gives their valid lengths)");
    const bool has_past = has_past_k;
    const bool cached = has_past || opt.chunk.has_value();
    if (cached) {
        // What brought in the cache, for the messages.
        const std::string why = has_past ? (opt.chunk ? "past_key.npy and --chunk" : "past_key.npy") : "--chunk";
        for (const char* file : {"key.npy", "value.npy"})
            if (present(file))
                fail(std::string(file) + " is not taken with " + why +
                     ": the KV cache path is self-attention, the query tokens are the new keys and values");
        for (const char* file : {"key_padding_mask.npy", "attn_mask.npy"})
            if (present(file))
                fail(std::string(file) + " is not taken with " + why + ": no masks with a KV cache" +
                     (has_past ? " (past_lengths.npy gives each sequence's valid past)" : ""));
        if (opt.need_weights) fail("--need-weights is not available with " + why + ": the KV cache path computes no attention weights");
        for (const fs::path& p : {present_k_path, present_v_path})
            if (out_path.lexically_normal() == p.lexically_normal())
                fail("output " + out_path.string() + " would be overwritten by " + p.filename().string() + " (written beside it with " +
                     why + ")");
        if (opt.causal_alignment == CausalAlignment::bottom_right)
            fail("--causal-bottom-right does not apply with " + why +
                 ": the new tokens attend causally over each sequence's past and themselves anyway (--causal may be given)" );
        if (opt.position_offset)
            fail("--position-offset does not apply with " + why + ": the new tokens' rotary positions continue each sequence" +
                 (has_past ? " (past_lengths[b] + i)" : " (0, 1, ...)"));
    } else if (opt.kv_type) {
        fail("--kv-type applies only to the KV cache path (past_key.npy / past_value.npy in the folder, or --chunk)");
    } else if (scales_given(opt)) {
        fail("--k-scale / --v-scale apply only to an fp8 KV cache (--kv-type fp8_e4m3 or fp8_e5m2)");
    }

    // key [B, Lk, kdim], value [B, Lk, vdim]; the packed projections need kdim = vdim = E.
    const std::optional<Input> key = load_input(dir, "key.npy", false);
    const std::optional<Input> value = load_input(dir, "value.npy", false);
    const Input& key_or_query = key ? *key : query;
    if (key) {
        require_float(*key);
        const auto& s = key->shape();
        const bool ok = s.size() == query.shape().size() && (separate || s.back() == E) && (!batched || s[batch_axis] == B);
        const std::string k_layout = std::string(opt.seq_first ? "[Lk, B, " : "[B, Lk, ") + (separate ? "kdim]" : "E]");
        if (!ok)
            fail("key.npy has shape " + key->shape_str() + " but query.npy has shape " + query.shape_str() +
                 (batched ? ": key must be " + k_layout + " with the query's B" + (separate ? "" : " and E")
                          : ": key must be " + std::string(separate ? "[Lk, kdim]" : "[Lk, E] with the query's E")) +
                 (separate ? "" : " (in_proj_weight.npy needs kdim = E; separate k_proj_weight.npy allows other widths)"));
    }
    if (value) {
        require_float(*value);
        const auto& s = value->shape();
        const auto& k = key_or_query.shape();
        bool ok = s.size() == k.size();
        for (std::size_t i = 0; ok && i + 1 < s.size(); ++i) ok = s[i] == k[i];
        if (!separate) ok = ok && s.back() == k.back();
        if (!ok)
            fail("value.npy has shape " + value->shape_str() + " but " + key_or_query.file + " has shape " +
                 key_or_query.shape_str() +
                 (separate ? "; they must agree in all but the last dim (vdim)"
                           : "; they must be equal (in_proj_weight.npy needs vdim = E; separate v_proj_weight.npy allows "
                             "other widths)"));
    }
    const Input& value_or_key = value ? *value : key_or_query;
    const std::size_t Lk = key_or_query.shape()[batched ? length_axis : 0];
    const std::size_t kdim = key_or_query.shape().back(), vdim = value_or_key.shape().back();

    // Heads and head dim.
    const std::size_t H = opt.heads, Hkv = opt.kv_heads.value_or(H);
    std::optional<Input> q_w, k_w, v_w, in_w;
    std::size_t d = 0;
    std::string d_source;
    if (separate) {
        q_w = load_input(dir, "q_proj_weight.npy", true);
        require_float(*q_w);
        if (q_w->shape().size() != 2 || q_w->shape()[1] != E)
            fail("q_proj_weight.npy has shape " + q_w->shape_str() + " but must be [H·d, E]" + E_is);
    }
    if (opt.head_dim) {
        d = *opt.head_dim;
        d_source = "from --head-dim";
    } else if (separate) {
        const std::size_t rows = q_w->shape()[0];
        if (rows % H != 0)
            fail("q_proj_weight.npy has " + str(rows) + " rows, not a multiple of --heads " + str(H) +
                 " (its rows are heads × head dim; give --head-dim)");
        d = rows / H;
        d_source = "= q_proj_weight.npy rows / --heads";
    } else {
        if (E % H != 0)
            fail("embed_dim " + str(E) + " is not a multiple of num_heads " + str(H) +
                 " (the head dim defaults to E / --heads; give --head-dim)");
        d = E / H;
        d_source = "= E / --heads";
    }
    const std::size_t Hd = checked_mul(H, d, "--heads × head dim");
    const std::size_t Hkvd = checked_mul(Hkv, d, "--kv-heads × head dim");
    std::size_t in_rows = 0;
    if (__builtin_add_overflow(Hd, Hkvd, &in_rows) || __builtin_add_overflow(in_rows, Hkvd, &in_rows))
        fail("the projection rows H·d + 2·Hkv·d overflow size_t");
    // nn.MultiheadAttention's shapes keep their old names ([3E, E], [E, E]); other shapes name H·d and Hkv·d.
    const bool classic = Hkv == H && Hd == E;
    const std::string dims_are = classic ? E_is
                                         : " (H·d = " + str(H) + "·" + str(d) + ", Hkv·d = " + str(Hkv) + "·" + str(d) + ", E = " +
                                               str(E) + " from query.npy)";

    // Parameters: float, exactly the shape the formula gives.
    auto load_param = [&](const std::string& file, bool required, const std::vector<std::size_t>& want,
                          const std::string& formula, const std::string& dims) {
        std::optional<Input> p = load_input(dir, file, required);
        if (p) {
            require_float(*p);
            require_shape(*p, want, formula + dims);
        }
        return p;
    };
    if (separate) {
        const std::string note = "head dim " + d_source + (opt.kv_heads ? "" : "; --kv-heads defaults to --heads");
        check_projection(*q_w, "H·d", "--heads", H, d, "head dim " + d_source, "E", E, "query.npy");
        k_w = load_input(dir, "k_proj_weight.npy", true);
        check_projection(*k_w, "Hkv·d", "--kv-heads", Hkv, d, note, "kdim", kdim, key_or_query.file);
        v_w = load_input(dir, "v_proj_weight.npy", true);
        check_projection(*v_w, "Hkv·d", "--kv-heads", Hkv, d, note, "vdim", vdim, value_or_key.file);
    } else {
        in_w = load_param("in_proj_weight.npy", true, {in_rows, E}, classic ? "[3E, E]" : "[H·d + 2·Hkv·d, E]", dims_are);
    }
    const std::optional<Input> in_b = load_param("in_proj_bias.npy", false, {in_rows}, classic ? "[3E]" : "[H·d + 2·Hkv·d]", dims_are);
    const std::optional<Input> out_w = load_param("out_proj.weight.npy", true, {E, Hd}, classic ? "[E, E]" : "[E, H·d]", dims_are);
    const std::optional<Input> out_b = load_param("out_proj.bias.npy", false, {E}, "[E]", E_is);
    // Without --norm-eps there is no norm block, so its weights are not read.
    const std::optional<Input> norm_w = opt.norm_eps ? load_param("norm.weight.npy", false, {E}, "[E]", E_is) : std::nullopt;
    const std::optional<Input> norm_b = opt.norm_eps ? load_param("norm.bias.npy", false, {E}, "[E]", E_is) : std::nullopt;

    const std::optional<Input> kpm = load_input(dir, "key_padding_mask.npy", false);
    if (kpm) {
        const std::vector<std::size_t> want = batched ? std::vector<std::size_t>{B, Lk} : std::vector<std::size_t>{Lk};
        if (kpm->shape() != want)
            fail("key_padding_mask.npy has shape " + kpm->shape_str() + " but must be " + (batched ? "[B, Lk]" : "[Lk]") +
                 " = " + npy::shape_string(want) + " (from query.npy " + query.shape_str() + (batched ? " = " + q_layout : "") +
                 " and " + key_or_query.file + " " + key_or_query.shape_str() + ")");
    }
    const std::optional<Input> attn_mask = load_input(dir, "attn_mask.npy", false);
    if (attn_mask) require_attn_mask_shape(*attn_mask, B, H, Lq, Lk, "");

    // The past: past_key.npy / past_value.npy [B, Hkv, Lp, d] ([Hkv, Lp, d] unbatched), past_lengths.npy [B] ([]).
    std::optional<Input> past_k, past_v, past_len;
    std::size_t Lp = 0;
    std::vector<std::size_t> lengths;  // each sequence's valid past (with past_key.npy)
    if (has_past) {
        const std::string layout = batched ? "[B, Hkv, Lp, d]" : "[Hkv, Lp, d] (unbatched query)";
        const std::size_t axis = batched ? 1 : 0;  // Hkv's axis
        past_k = load_input(dir, "past_key.npy", true);
        require_float(*past_k);
        const auto& s = past_k->shape();
        if (s.size() != (batched ? 4u : 3u))
            fail("past_key.npy has shape " + past_k->shape_str() + " but must be " + layout +
                 " (Hugging Face's past_key_values layout: projected and rotated keys)");
        if (batched && s[0] != B)
            fail("past_key.npy has batch " + str(s[0]) + " (shape " + past_k->shape_str() + " = [B, Hkv, Lp, d]) but query.npy has B = " +
                 str(B) + " (shape " + query.shape_str() + ")");
        if (s[axis] != Hkv)
            fail("past_key.npy has " + str(s[axis]) + " KV heads (shape " + past_k->shape_str() + " = " + layout + ") but --kv-heads " +
                 (opt.kv_heads ? "is " + str(Hkv) : "defaults to --heads " + str(Hkv)));
        if (s.back() != d)
            fail("past_key.npy has head dim " + str(s.back()) + " (shape " + past_k->shape_str() + " = " + layout +
                 ") but the layer's head dim is " + str(d) + " (" + d_source + ")");
        Lp = s[axis + 1];
        past_v = load_input(dir, "past_value.npy", true);
        require_float(*past_v);
        if (past_v->shape() != s)
            fail("past_value.npy has shape " + past_v->shape_str() + " but past_key.npy has shape " + past_k->shape_str() +
                 "; they must be equal");
        lengths.assign(B, Lp);
        past_len = load_input(dir, "past_lengths.npy", false, npy::Accept::with_integers);
        if (past_len) {
            const npy::DType t = past_len->array.dtype;
            if (t != npy::DType::int32 && t != npy::DType::int64)
                fail(std::string("past_lengths.npy has dtype ") + npy::dtype_name(t) + " but must be int32 or int64");
            const std::vector<std::size_t> want = batched ? std::vector<std::size_t>{B} : std::vector<std::size_t>{};
            if (past_len->shape() != want)
                fail("past_lengths.npy has shape " + past_len->shape_str() + " but must be " +
                     (batched ? "[B] = " + npy::shape_string(want) + " (B from query.npy)" : std::string("[] (a 0-d array: the query is unbatched)")));
            for (std::size_t b = 0; b < B; ++b) {
                const std::int64_t n = past_len->array.integers[b];
                const std::string at = batched ? "past_lengths.npy[" + str(b) + "]" : std::string("past_lengths.npy");
                if (n < 0) fail(at + " is " + std::to_string(n) + " but a length must be >= 0");
                if (static_cast<std::uint64_t>(n) > Lp)
                    fail(at + " is " + std::to_string(n) + " but past_key.npy holds Lp = " + str(Lp) + " tokens per sequence (shape " +
                         past_k->shape_str() + ")");
                lengths[b] = static_cast<std::size_t>(n);
            }
        }
    }
    std::size_t capacity = 0;  // Lp + Lq: the present_*.npy rows
    if (cached && __builtin_add_overflow(Lp, Lq, &capacity)) fail("the KV cache's capacity Lp + Lq overflows size_t");

    // --- compute (the library validates the rest, e.g. H % Hkv or the rotary dims, and throws
    // mha::invalid_argument) ---
    AttentionWeights weights;
    if (separate) {
        weights.q_proj_weight = q_w->floats();
        weights.k_proj_weight = k_w->floats();
        weights.v_proj_weight = v_w->floats();
    } else {
        weights.in_proj_weight = in_w->floats();
    }
    weights.in_proj_bias = in_b ? in_b->floats() : nullptr;
    weights.out_proj_weight = out_w->floats();
    weights.out_proj_bias = out_b ? out_b->floats() : nullptr;
    weights.norm_weight = norm_w ? norm_w->floats() : nullptr;
    weights.norm_bias = norm_b ? norm_b->floats() : nullptr;
    AttentionConfig config;
    config.embed_dim = E;
    config.num_heads = H;
    config.num_kv_heads = Hkv;
    config.head_dim = d;
    config.kdim = kdim;
    config.vdim = vdim;
    config.compute = opt.dtype;
    config.norm_eps = opt.norm_eps;  // the post-norm belongs to the layer, with norm.weight / norm.bias
    const LoadedModifiers mods = load_modifiers(dir, opt.modifiers, H);
    config.modifiers = mods.view;  // copied by the constructor
    if (opt.rope_theta) {
        RopeConfig rope;
        rope.theta = *opt.rope_theta;
        rope.dims = opt.rope_dims.value_or(0);
        rope.style = opt.rope_style.value_or(RopeStyle::half);
        config.rope = rope;
    }
    const MultiheadAttention attention(weights, config);

    // [B, L, F]: row stride F, batch stride L·F; [L, B, F]: row stride B·F, batch stride F.
    const auto view = [&](const float* data, std::size_t L, std::size_t F) {
        return opt.seq_first ? ConstBatch(data, B, L, F, B * F, F) : ConstBatch(data, B, L, F);
    };
    AttentionInputs inputs;
    inputs.query = view(query.floats(), Lq, E);
    // A key or value file with no elements (Lk = 0) must not read as absent (a null key is the legacy key = query).
    static const float kEmpty = 0.0f;
    const auto given = [](const float* p) { return p != nullptr ? p : &kEmpty; };
    if (key) inputs.key = view(given(key->floats()), Lk, kdim);
    if (value) inputs.value = view(given(value->floats()), Lk, vdim);
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
    fo.need_weights = opt.need_weights ? NeedWeights::averaged : NeedWeights::none;
    fo.backend = opt.backend;
    fo.threads = opt.threads;
    fo.impl = opt.impl;
    std::vector<float> present_k, present_v;
    if (!cached) {
        fo.causal = opt.causal;
        fo.causal_alignment = opt.causal_alignment;
        fo.position_offset = opt.position_offset.value_or(0);
        attention.forward(inputs, outputs, fo);
    } else {
        // The past in a cache of capacity Lp + Lq, then the query in calls of --chunk tokens (one call without).
        const DataType kv_type = opt.kv_type.value_or(DataType::f32);
        if (scales_given(opt) && !has_tensor_scale(kv_type))
            fail("--k-scale / --v-scale apply only to an fp8 KV cache (--kv-type fp8_e4m3 or fp8_e5m2), not " +
                 std::string(data_type_name(kv_type)));
        KVCache cache(B, Hkv, d, capacity, kv_type, opt.k_scale.value_or(1.0f), opt.v_scale.value_or(1.0f));
        const std::size_t past_head = Lp * d, past_batch = Hkv * past_head;  // strides in past_*.npy
        for (std::size_t b = 0; b < B; ++b) {
            const std::size_t off = b * past_batch;
            const std::size_t n = has_past ? lengths[b] : 0;
            const ConstHeads k(has_past ? past_k->floats() + off : nullptr, 1, Hkv, n, d, past_batch, past_head, d);
            const ConstHeads v(has_past ? past_v->floats() + off : nullptr, 1, Hkv, n, d, past_batch, past_head, d);
            cache.append(b, k, v);
        }
        // Rows start.. of every sequence: [B, n, E] views of the query and the output (either layout).
        const std::size_t row_stride = opt.seq_first ? B * E : E, batch_stride = opt.seq_first ? E : Lq * E;
        const std::size_t step = opt.chunk.value_or(Lq);
        std::size_t start = 0;
        do {  // at least one call, so that the library judges an empty query too
            const std::size_t n = std::min(step, Lq - start);
            AttentionInputs chunk_in;
            chunk_in.query = ConstBatch(query.floats() + start * row_stride, B, n, E, row_stride, batch_stride);
            AttentionOutputs chunk_out;
            chunk_out.output = Batch(output.data() + start * row_stride, B, n, E, row_stride, batch_stride);
            attention.forward(chunk_in, chunk_out, fo, cache);
            start += n;
        } while (start < Lq);
        // present_*: [B, Hkv, Lp + Lq, d], each sequence's cache rows (widened to float32), then zeros.
        const std::size_t count = checked_mul(checked_mul(checked_mul(B, Hkv, "B·Hkv"), capacity, "present_key.npy's rows"), d,
                                            "present_key.npy's size");
        present_k.assign(count, 0.0f);
        present_v.assign(count, 0.0f);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < Hkv; ++h) {
                const std::size_t n = cache.length(b);
                cache.copy_keys(b, h, Matrix(present_k.data() + (b * Hkv + h) * capacity * d, n, d));
                cache.copy_values(b, h, Matrix(present_v.data() + (b * Hkv + h) * capacity * d, n, d));
            }
    }

    // --- write -----------------------------------------------------------------------------------
    const std::vector<std::size_t> weights_shape = batched ? std::vector<std::size_t>{B, Lq, Lk} : std::vector<std::size_t>{Lq, Lk};
    const std::vector<std::size_t> present_shape =
        batched ? std::vector<std::size_t>{B, Hkv, capacity, d} : std::vector<std::size_t>{Hkv, capacity, d};
    std::vector<OutputFile> files{{out_path, &output, query.shape()}};
    if (opt.need_weights) files.push_back({weights_path, &attn_weights, weights_shape});
    if (cached) {
        files.push_back({present_k_path, &present_k, present_shape});
        files.push_back({present_v_path, &present_v, present_shape});
    }
    write_outputs(files);
}

}  // namespace mha::tool
