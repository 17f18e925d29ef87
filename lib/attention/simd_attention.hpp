// The SIMD backend of mha::scaled_dot_product_attention (lib/attention/simd_attention.cpp).
// Arguments validated by the public entry point (lib/attention/sdpa.cpp).
#pragma once
#include <cstddef>

#include "mha/sdpa.hpp"

namespace mha {

void simd_sdpa(const SdpaInputs& in, const Heads& out, float scale, const SdpaOptions& opt, Workspace* workspace);
std::size_t simd_sdpa_workspace_bytes(const SdpaInputs& in, const SdpaOptions& opt);

}  // namespace mha
