// The whole public API of mha: views, kernels, multi-head attention, the attention core (SDPA), ISA control, errors.
#pragma once
#include "mha/attention.hpp"
#include "mha/error.hpp"
#include "mha/half.hpp"
#include "mha/isa.hpp"
#include "mha/kernels.hpp"
#include "mha/kv_cache.hpp"
#include "mha/paged_kv_cache.hpp"
#include "mha/quantized.hpp"
#include "mha/sdpa.hpp"
#include "mha/step_plan.hpp"
#include "mha/view.hpp"
#include "mha/workspace.hpp"

namespace mha {
// The library's version, "MAJOR.MINOR.PATCH".
const char* version() noexcept;
}  // namespace mha
