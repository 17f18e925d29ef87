// A serving step over a paged cache (step_forward.hpp).
#include "step_forward.hpp"

#include <cmath>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace mha::detail {

StepLayout step_layout(const LayerState& st, const StepComposition& r, int threads) {
    StepLayout l;
    const std::size_t n = r.sequences, T = r.query_starts[n];
    l.call = packed_call(st, T, threads);
    l.positions.resize(T);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t q0 = r.query_starts[i], q = r.query_starts[i + 1] - q0, past = r.key_lengths[i] - q;
        for (std::size_t t = 0; t < q; ++t) l.positions[q0 + t] = past + t;
    }
    struct Args {
        const LayerState& st;
        const StepComposition& r;
        PagedCoreLayout& core;
    } args{st, r, l.core};
    l.scratch = scratch_layout(st, l.call, [](void* ctx, Carver& call, Carver& slot) {
        auto& a = *static_cast<Args*>(ctx);
        a.core = paged_core_layout(a.r.sequences, a.r.key_lengths.data(), a.r.query_starts.data(), a.r.table_stride, a.st.H,
                                   a.st.Hkv, a.st.d, a.st.compute, a.r.element, call, slot);
    }, &args);
    return l;
}

void run_step(const LayerState& st, const StepLayout& l, const LayerCall& call, float* scratch, const KVRows& keys,
              const KVRows& values, const StepReservation& reservation) {
    const StepComposition& r = *reservation.step;
    const LayerForward layer(st, call, l.scratch, scratch, nullptr, l.positions.data());
    layer.project_inputs();
    const std::size_t d = st.d, Hkv = st.Hkv, H = st.H, n = r.sequences;
    const Batch &Q = layer.queries(), &K = layer.keys(), &V = layer.values(), &C = layer.context();
    // The new rows into the step's blocks, per (sequence, KV head).
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n * Hkv), [&](const tbb::blocked_range<std::size_t>& range) {
        for (std::size_t t = range.begin(); t != range.end(); ++t) {
            const std::size_t i = t / Hkv, h = t % Hkv, q0 = r.query_starts[i];
            for (std::size_t row = q0; row < r.query_starts[i + 1]; ++row) {
                keys.write_row(i, h, l.positions[row], K[0].row(row) + h * d);
                values.write_row(i, h, l.positions[row], V[0].row(row) + h * d);
            }
        }
    });
    PagedCoreProblem p;
    p.q = ConstMatrix(Q.data, Q.rows, H * d, Q.row_stride);
    p.out = Matrix(C.data, C.rows, H * d, C.row_stride);
    p.keys = keys, p.values = values;
    p.sequences = n, p.H = H, p.Hkv = Hkv, p.d = d;
    p.key_lengths = r.key_lengths.data();
    p.query_starts = r.query_starts.data();
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    p.mods = st.modifiers();
    p.compute = st.compute;
    run_paged_core(p, l.core, scratch, scratch + l.scratch.slots, l.scratch.slot_floats, l.scratch.threads);
    layer.project_output();
}

}  // namespace mha::detail
