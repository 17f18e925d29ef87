// mha::scaled_dot_product_attention: validates every argument (validate_call.hpp: shapes, strides, extents,
// overlaps, masks, options), then runs the scalar reference (reference::attention_core) or the SIMD attention
// core. Nothing is written before validation passes. B = 0 or Lq = 0 writes nothing; Lk = 0 writes zero rows.
#include <algorithm>

#include "../reference/reference.hpp"
#include "mha/sdpa.hpp"
#include "simd_attention.hpp"
#include "validate_call.hpp"

namespace mha {
namespace {

void run(const SdpaInputs& in, const Heads& out, const SdpaOptions& opt, Workspace* workspace) {
    const detail::SdpaCall call = detail::validate_sdpa_call(in, out, opt, workspace);
    if (call.B == 0 || call.Lq == 0) return;  // validated; nothing to compute
    if (call.Lk == 0) {  // every key masked: zero rows (the inputs' views may be null, so no reference loops)
        for (std::size_t b = 0; b < call.B; ++b)
            for (std::size_t h = 0; h < call.H; ++h) {
                const Matrix o = out.head(b, h);
                for (std::size_t i = 0; i < o.rows; ++i) std::fill(o.row(i), o.row(i) + o.cols, 0.0f);
            }
        return;
    }
    if (call.path == AttentionPath::scalar)
        reference::attention_core(in, out, call.scale, opt.causal, opt.causal_alignment, nullptr, DataType::f32, opt.modifiers);
    else
        simd_sdpa(in, out, call, opt, workspace);
}

}  // namespace

void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options) {
    run(in, output, options, nullptr);
}

void scaled_dot_product_attention(const SdpaInputs& in, const Heads& output, const SdpaOptions& options, Workspace& workspace) {
    run(in, output, options, &workspace);
}

std::size_t sdpa_workspace_bytes(const SdpaInputs& in, const SdpaOptions& options) {
    const detail::SdpaCall call = detail::describe_sdpa_call(in, options);
    if (call.path == AttentionPath::scalar) return 0;
    return simd_sdpa_workspace_bytes(call, options);
}

AttentionPath sdpa_path(const SdpaInputs& in, const SdpaOptions& options) { return detail::describe_sdpa_call(in, options).path; }

}  // namespace mha
