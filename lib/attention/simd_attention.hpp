// The SIMD backend of mha::scaled_dot_product_attention (lib/attention/simd_attention.cpp).
// Arguments validated by the public entry point (lib/attention/sdpa.cpp).
#pragma once
#include <cstddef>

#include "mha/sdpa.hpp"
#include "validate_call.hpp"

namespace mha {

// call: validate_sdpa_call's (or describe_sdpa_call's, for the workspace size) resolution of the same call.
void simd_sdpa(const SdpaInputs& in, const Heads& out, const detail::SdpaCall& call, const SdpaOptions& opt, Workspace* workspace);
std::size_t simd_sdpa_workspace_bytes(const detail::SdpaCall& call, const SdpaOptions& opt);

}  // namespace mha
