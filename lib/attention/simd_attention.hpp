// The SIMD backend of mha::scaled_dot_product_attention (lib/attention/simd_attention.cpp).
// Arguments validated by the public entry point (lib/attention/sdpa.cpp).
#pragma once
#include <cstddef>

#include "mha/paged_kv_cache.hpp"
#include "mha/sdpa.hpp"
#include "paged_kv_cache_access.hpp"
#include "step_forward.hpp"
#include "validate_call.hpp"

namespace mha {

// call: validate_sdpa_call's (or describe_sdpa_call's, for the workspace size) resolution of the same call.
void simd_sdpa(const SdpaInputs& in, const Heads& out, const detail::SdpaCall& call, const SdpaOptions& opt, Workspace* workspace);
std::size_t simd_sdpa_workspace_bytes(const detail::SdpaCall& call, const SdpaOptions& opt);

// A serving step over a paged cache (step_forward.hpp): prepares r (copy-on-write), runs the plan bound to x
// and y, then commits r.
void simd_forward_step(const detail::LayerState& st, const detail::StepLayout& plan, const ConstMatrix& x, const Matrix& y,
                       PagedKVCache& cache, const detail::StepReservation& r);
// A variable-length batch without a cache (varlen_forward.hpp) on validated arguments.
void simd_forward_varlen(const detail::LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* starts,
                         std::size_t n, bool causal, int threads);
// Level-2 paged attention (paged_core.hpp) on validated arguments; tables: [n, table_stride].
void simd_paged_attention(const ConstMatrix& q, const PagedKVPool& pool, const PagedSequences& seqs, const Matrix& out,
                          std::size_t H, float scale, int threads, const ScoreModifiers& mods);

}  // namespace mha
