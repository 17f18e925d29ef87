// The fused long-sequence path: attention for one (batch, head, query block) without materializing
// the Lq×Lk scores. Memory per task: rows × key_tile scores + rows × d accumulator.
#pragma once
#include <cstddef>

#include "attention_plan.hpp"

namespace mha::detail {

// Keys per tile of the fused path (see fused_attention.cpp for the choice).
inline constexpr std::size_t kFusedKeyTile = 256;
// automatic uses the fused path from this many keys on (the materialized scores row block of
// 64 × Lk floats no longer fits in L2 next to K and V).
inline constexpr std::size_t kFusedMinKeys = 1024;

// Writes the head's columns of context rows [i0, i0 + rows) of batch b into plan.C.
void fused_attend_block(const AttentionPlan& plan, std::size_t b, std::size_t h, std::size_t i0, std::size_t rows);

}  // namespace mha::detail
