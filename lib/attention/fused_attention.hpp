// The fused long-sequence path: attention for one (batch, head, query block) without materializing
// the Lq×Lk scores. Memory per task: rows × key_tile scores + rows × d accumulator.
#pragma once
#include <cstddef>

#include "attention_plan.hpp"

namespace mha::detail {

// Query rows of an attention task. Materialized: 64 rows × Lk scores stay in L2. Fused: 128 rows
// halve how often each packed key/value tile is streamed from L2 per query row.
inline constexpr std::size_t kQueryBlock = 64;
inline constexpr std::size_t kFusedQueryBlock = 128;

// Keys per tile of the fused path. With 128-query blocks (kFusedQueryBlock), one
// thread, B=1 E=768 H=12 (`mha bench --op attention --impl fused --threads 1`, medians of 2 runs of 3),
// ms at L=4096 / L=1024 on the Zen 4 dev machine:
//   query block × key tile  128×256: 694.7 / 76.6   64×256: 695.9 / 78.1   256×256: 698.4 / 79.3
//                           128×128: 722.9 / 79.6   128×512: 696.2 / 77.8 (one outlier run at 1024)
// 128 keys re-run the short-K (d) Q·Kᵀ microkernel epilogue and the per-row softmax bookkeeping twice
// as often; 512 gains nothing and doubles the score tile (256 KB at 128 rows).
inline constexpr std::size_t kFusedKeyTile = 256;
// automatic uses the fused path from this many keys on (the materialized scores row block of
// 64 × Lk floats no longer fits in L2 next to K and V).
inline constexpr std::size_t kFusedMinKeys = 1024;

// Writes the head's columns of context rows [i0, i0 + rows) of batch b into plan.C.
void fused_attend_block(const AttentionPlan& plan, std::size_t b, std::size_t h, std::size_t i0, std::size_t rows);

}  // namespace mha::detail
