// mha::scaled_dot_product_attention: validates every argument (shapes, strides, extents, overlaps, masks,
// options), then runs the scalar reference (reference::attention_core) or the SIMD attention core.
// Nothing is written before validation passes.
#include <cmath>
#include <string>

#include "../core/validate.hpp"
#include "../reference/reference.hpp"
#include "checks.hpp"
#include "mha/sdpa.hpp"
#include "simd_attention.hpp"

namespace mha {
namespace {

using detail::fail;

std::string heads_shape(const ConstHeads& v) {
    // Appends rather than "[" + ...: g++ 12 gives a false -Wrestrict on that form (GCC bug 105651).
    std::string s("[");
    s.append(std::to_string(v.batch)).append(", ").append(std::to_string(v.heads)).append(", ");
    s.append(std::to_string(v.rows)).append(", ").append(std::to_string(v.dim)).append("]");
    return s;
}

// Elements from the view's first to one past its last element, checked to fit the address space.
std::size_t heads_extent(const char* name, const ConstHeads& v) {
    std::size_t n = detail::checked_madd(v.rows - 1, v.row_stride, v.dim, name, "extent");
    n = detail::checked_madd(v.heads - 1, v.head_stride, n, name, "extent");
    n = detail::checked_madd(v.batch - 1, v.batch_stride, n, name, "extent");
    return detail::checked_extent(name, v.data, n);
}

void check_heads(const char* name, const ConstHeads& v) {
    if (v.batch == 0 || v.heads == 0 || v.rows == 0 || v.dim == 0) fail(std::string(name) + " has zero size " + heads_shape(v));
    if (v.data == nullptr) fail(std::string(name) + " is a null pointer");
    heads_extent(name, v);
}

// The output's rows (b, h, i) do not overlap each other: with the dimensions that have more than one entry
// sorted by stride, each stride is at least the extent of everything below it.
void check_output_rows_disjoint(const ConstHeads& v) {
    struct Dim {
        std::size_t stride, count;
    } dims[3];
    int n = 0;
    if (v.rows > 1) dims[n++] = {v.row_stride, v.rows};
    if (v.heads > 1) dims[n++] = {v.head_stride, v.heads};
    if (v.batch > 1) dims[n++] = {v.batch_stride, v.batch};
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j) std::swap(dims[j], dims[j - 1]);
    std::size_t extent = v.dim;  // elements one step of the next dimension must clear
    for (int i = 0; i < n; ++i) {
        if (dims[i].stride < extent)
            fail("output rows overlap each other (batch stride " + std::to_string(v.batch_stride) + ", head stride " +
                 std::to_string(v.head_stride) + ", row stride " + std::to_string(v.row_stride) + ", dim " +
                 std::to_string(v.dim) + ")");
        extent = (dims[i].count - 1) * dims[i].stride + extent;
    }
}

float validate(const SdpaInputs& in, const Heads& out, const SdpaOptions& opt) {
    detail::check_common_options(opt.impl, opt.backend, opt.threads);
    detail::check_causal_alignment(opt.causal_alignment);
    check_heads("query", in.query);
    check_heads("key", in.key);
    check_heads("value", in.value);
    check_heads("output", out);
    check_output_rows_disjoint(out);
    const std::size_t B = in.query.batch, H = in.query.heads, Lq = in.query.rows, d = in.query.dim;
    const std::size_t Hkv = in.key.heads, Lk = in.key.rows;
    if (in.key.batch != B || in.value.batch != B)
        fail("key " + heads_shape(in.key) + " and value " + heads_shape(in.value) + " must have query's batch " + std::to_string(B));
    if (in.key.dim != d || in.value.dim != d)
        fail("key " + heads_shape(in.key) + " and value " + heads_shape(in.value) + " must have query's head dim " + std::to_string(d));
    if (in.value.heads != Hkv || in.value.rows != Lk)
        fail("value " + heads_shape(in.value) + " must have key's heads and length " + heads_shape(in.key));
    if (H % Hkv != 0)
        fail("query heads " + std::to_string(H) + " are not a multiple of key/value heads " + std::to_string(Hkv));
    if (out.batch != B || out.heads != H || out.rows != Lq || out.dim != d)
        fail("output is " + heads_shape(out) + " but must be [B, H, Lq, d] = " + heads_shape(in.query));
    detail::check_masks(in.key_padding_mask, in.attn_mask, B, H, Lq, Lk);
    const std::size_t out_elements = heads_extent("output", out);
    for (const auto& [name, v] : {std::pair<const char*, const ConstHeads*>{"query", &in.query}, {"key", &in.key}, {"value", &in.value}})
        if (detail::overlaps(out.data, out_elements, v->data, heads_extent(name, *v))) fail(std::string("output overlaps ") + name);
    if (detail::mask_overlaps(in.key_padding_mask, out.data, out_elements)) fail("output overlaps key_padding_mask");
    if (detail::mask_overlaps(in.attn_mask, out.data, out_elements)) fail("output overlaps attn_mask");
    const float scale = opt.scale ? *opt.scale : 1.0f / std::sqrt(static_cast<float>(d));
    if (!std::isfinite(scale)) fail("scale " + std::to_string(scale) + " is not finite");
    return scale;
}

void run(const SdpaInputs& in, const Heads& out, const SdpaOptions& opt, Workspace* workspace) {
    const float scale = validate(in, out, opt);
    if (workspace != nullptr && workspace->data() != nullptr) {
        // A borrowed workspace must not share memory with anything the call reads or writes.
        const auto* w = static_cast<const unsigned char*>(workspace->data());
        const std::size_t wb = workspace->bytes();
        auto hits = [&](const char* name, const ConstHeads& v) { return detail::overlaps(w, wb, v.data, heads_extent(name, v)); };
        if (hits("query", in.query) || hits("key", in.key) || hits("value", in.value) || hits("output", out) ||
            detail::mask_overlaps(in.key_padding_mask, w, wb) || detail::mask_overlaps(in.attn_mask, w, wb))
            fail("workspace overlaps an input, the output or a mask");
    }
    if (opt.backend == Backend::scalar) {
        // The reference's scores [Lq, Lk] (inputs may repeat rows with stride 0, so Lq and Lk are not bounded
        // by real memory).
        detail::checked_extent("the scalar backend's scores", static_cast<const float*>(nullptr),
                               detail::checked_madd(in.query.rows, in.key.rows, 0, "the scalar backend's", "scores"));
        reference::attention_core(in, out, scale, opt.causal, opt.causal_alignment, nullptr);
        return;
    }
    simd_sdpa(in, out, scale, opt, workspace);
}

}  // namespace

void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options) {
    run(in, output, options, nullptr);
}

void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options, Workspace& workspace) {
    run(in, output, options, &workspace);
}

std::size_t sdpa_workspace_bytes(const SdpaInputs& in, const SdpaOptions& options) {
    detail::check_common_options(options.impl, options.backend, options.threads);
    for (const auto& [name, v] : {std::pair<const char*, const ConstHeads*>{"query", &in.query}, {"key", &in.key}, {"value", &in.value}})
        if (v->batch == 0 || v->heads == 0 || v->rows == 0 || v->dim == 0) fail(std::string(name) + " has zero size " + heads_shape(*v));
    if (in.query.heads % in.key.heads != 0)
        fail("query heads " + std::to_string(in.query.heads) + " are not a multiple of key/value heads " + std::to_string(in.key.heads));
    if (options.backend == Backend::scalar) return 0;
    return simd_sdpa_workspace_bytes(in, options);
}

}  // namespace mha
