// The SIMD backend's entry points: claim the call's scratch (a caller's Workspace or a lease from the scratch
// cache) before any work, enter an arena of the requested thread count, and run the layer (LayerForward) or
// the attention core alone (scaled_dot_product_attention).
//   Layer: 1. projections in fixed row blocks, one gemm_packed call each with the bias fused and RoPE on the
//   block's rows; 2. the attention core (attention_core.hpp) on head views of the projections; 3. the output
//   projection per row block with the bias fused, then the optional post-norm on those rows.
// Work is cut into blocks whose sizes depend on the shape only, never on the thread count, and each
// output element is computed by one task, so results are bitwise identical for any thread count.
// Preconditions: inputs validated and resolved by the public entry points (validate_call.hpp).
#include <optional>
#include <string>

#include <tbb/task_arena.h>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "layer_forward.hpp"
#include "paged_core.hpp"
#include "simd_attention.hpp"
#include "step_forward.hpp"
#include "varlen_forward.hpp"
#include "state.hpp"

namespace mha {
namespace {

// A caller's workspace also needs room to align its start.
std::size_t workspace_bytes_for(std::size_t layout_bytes) { return layout_bytes + detail::kScratchAlign; }

// Claims `bytes` of scratch (all memory of the call, before anything is computed: a failure leaves the
// outputs untouched), then runs body(scratch) isolated in an arena of `threads`.
template <class Body>
void run_with_scratch(std::size_t bytes, Workspace* workspace, std::size_t threads, const Body& body) {
    std::optional<detail::ScratchLease> lease;
    float* scratch = nullptr;
    if (workspace != nullptr) {
        const std::size_t need = workspace_bytes_for(bytes);
        if (workspace->bytes() < need)
            detail::fail("workspace has " + std::to_string(workspace->bytes()) + " bytes but this call needs " +
                         std::to_string(need) + " (workspace_bytes)");
        if (!workspace->try_acquire()) detail::fail("workspace is in use by another call");
        scratch = static_cast<float*>(detail::align_up(workspace->data()));
    } else {
        lease.emplace(bytes);
        scratch = static_cast<float*>(lease->data());
    }
    struct Release {
        Workspace* w;
        ~Release() {
            if (w) w->release();
        }
    } release{workspace};
    // isolate: while this thread waits for its tasks it runs only this call's tasks, not another
    // call's (a caller running forward inside its own TBB loop), which would delay this one.
    auto isolated = [&] { tbb::this_task_arena::isolate([&] { body(scratch); }); };
    if (threads != static_cast<std::size_t>(tbb::this_task_arena::max_concurrency())) {
        tbb::task_arena arena(static_cast<int>(threads));
        arena.execute(isolated);
    } else {
        isolated();
    }
}

// The SDPA call's scratch: the core's regions and one slot per thread.
struct SdpaLayout : detail::SlotLayout {
    detail::CoreLayout core;
};

SdpaLayout sdpa_layout(const detail::SdpaCall& sdpa, const SdpaOptions& opt) {
    SdpaLayout l;
    detail::Carver call, slot;
    const detail::CoreShape shape{sdpa.B, sdpa.H, sdpa.Hkv, sdpa.d, sdpa.Lq, sdpa.Lk};
    l.core = detail::core_layout(shape, sdpa.core_path, NeedWeights::none, call, slot);
    static_cast<detail::SlotLayout&>(l) = detail::place_slots(call, slot, opt.threads);
    return l;
}

}  // namespace

std::size_t simd_workspace_bytes(const detail::LayerState& st, const detail::LayerCall& call) {
    return workspace_bytes_for(detail::scratch_layout(st, call).bytes());
}

void simd_multihead_attention(const detail::LayerState& st, const detail::LayerCall& call, Workspace* workspace, KVCache* cache) {
    const detail::ScratchLayout layout = detail::scratch_layout(st, call);
    run_with_scratch(layout.bytes(), workspace, layout.threads, [&](float* scratch) {
        const detail::LayerForward plan(st, call, layout, scratch, cache);
        plan.run();
    });
}

std::size_t simd_sdpa_workspace_bytes(const detail::SdpaCall& call, const SdpaOptions& opt) {
    return workspace_bytes_for(sdpa_layout(call, opt).bytes());
}

void simd_sdpa(const SdpaInputs& in, const Heads& out, const detail::SdpaCall& call, const SdpaOptions& opt, Workspace* workspace) {
    const SdpaLayout layout = sdpa_layout(call, opt);
    detail::CoreProblem p;
    p.q = in.query;
    p.k = in.key;
    p.v = in.value;
    p.out = out;
    p.scale = call.scale;
    p.causal = opt.causal;
    p.query_shift = opt.causal_alignment == CausalAlignment::bottom_right
                         ? static_cast<std::ptrdiff_t>(in.key.rows) - static_cast<std::ptrdiff_t>(in.query.rows)
                         : 0;
    p.key_padding_mask = in.key_padding_mask;
    p.attn_mask = in.attn_mask;
    p.mods = opt.modifiers;
    run_with_scratch(layout.bytes(), workspace, layout.threads, [&](float* scratch) {
        const detail::AttentionCore core(p, call.core_path, layout.core, scratch, scratch + layout.slots, layout.slot_floats,
                                         layout.threads);
        core.run();
    });
}

void simd_forward_step(const detail::LayerState& st, const detail::StepLayout& layout, const ConstMatrix& x, const Matrix& y,
                       PagedKVCache& cache, const detail::StepReservation& r) {
    detail::LayerCall call = layout.call;
    detail::bind_packed(call, x, y);
    detail::PagedKVCacheAccess::prepare_step(cache, r);  // invisible until the commit
    const detail::KVRows keys = detail::PagedKVCacheAccess::keys(cache, r), values = detail::PagedKVCacheAccess::values(cache, r);
    run_with_scratch(layout.scratch.bytes(), nullptr, layout.scratch.threads,
                     [&](float* scratch) { detail::run_step(st, layout, call, scratch, keys, values, r); });
    detail::PagedKVCacheAccess::commit_step(cache, r);
}

void simd_forward_varlen(const detail::LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* starts,
                         std::size_t n, bool causal, int threads) {
    const detail::VarlenLayout layout = detail::varlen_layout(st, x, y, starts, n, threads);
    run_with_scratch(layout.scratch.bytes(), nullptr, layout.scratch.threads,
                     [&](float* scratch) { detail::run_varlen(st, layout, scratch, starts, n, causal); });
}

void simd_paged_attention(const ConstMatrix& q, const PagedKVPool& pool, const PagedSequences& seqs, const Matrix& out,
                          std::size_t H, float scale, int threads, const ScoreModifiers& mods) {
    detail::Carver call, slot;
    const detail::PagedCoreLayout core = detail::paged_core_layout(seqs.count, seqs.key_lengths, seqs.query_starts, seqs.table_stride,
                                                                   H, pool.kv_heads, pool.head_dim, DataType::f32, pool.element, call,
                                                                   slot);
    const detail::SlotLayout slots = detail::place_slots(call, slot, threads);
    detail::PagedCoreProblem p;
    p.q = q, p.out = out;
    p.keys = detail::pool_rows(pool, false, seqs.block_tables, seqs.table_stride);
    p.values = detail::pool_rows(pool, true, seqs.block_tables, seqs.table_stride);
    p.sequences = seqs.count, p.H = H, p.Hkv = pool.kv_heads, p.d = pool.head_dim;
    p.key_lengths = seqs.key_lengths, p.query_starts = seqs.query_starts;
    p.scale = scale;
    p.mods = mods;
    run_with_scratch(slots.bytes(), nullptr, slots.threads, [&](float* scratch) {
        detail::run_paged_core(p, core, scratch, scratch + slots.slots, slots.slot_floats, slots.threads);
    });
}

}  // namespace mha
