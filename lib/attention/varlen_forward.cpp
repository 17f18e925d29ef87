// A variable-length batch without a cache (varlen_forward.hpp).
#include "varlen_forward.hpp"

#include <algorithm>
#include <cmath>

namespace mha::detail {

VarlenLayout varlen_layout(const LayerState& st, const ConstMatrix& x, const Matrix& y, const std::size_t* starts,
                           std::size_t n, int threads) {
    VarlenLayout l;
    const std::size_t T = x.rows;
    l.call = packed_call(st, T, threads);
    bind_packed(l.call, x, y);
    l.positions.resize(T);
    l.paths.resize(n);
    l.cores.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t q = starts[i + 1] - starts[i];
        for (std::size_t t = 0; t < q; ++t) l.positions[starts[i] + t] = t;
        l.paths[i] = core_path(st.H, st.Hkv, q, q, NeedWeights::none, Impl::automatic);
    }
    struct Args {
        const LayerState& st;
        VarlenLayout& l;
        const std::size_t* starts;
        std::size_t n;
    } args{st, l, starts, n};
    l.scratch = scratch_layout(st, l.call, [](void* ctx, Carver& call, Carver& slot) {
        auto& a = *static_cast<Args*>(ctx);
        std::size_t call_end = call.total, slot_end = slot.total;
        for (std::size_t i = 0; i < a.n; ++i) {
            const std::size_t q = a.starts[i + 1] - a.starts[i];
            if (q == 0) continue;
            Carver cc{call.total}, sc{slot.total};
            a.l.cores[i] = core_layout(CoreShape{1, a.st.H, a.st.Hkv, a.st.d, q, q, a.st.compute}, a.l.paths[i], NeedWeights::none, cc, sc);
            call_end = std::max(call_end, cc.total);
            slot_end = std::max(slot_end, sc.total);
        }
        call.total = call_end;
        slot.total = slot_end;
    }, &args);
    return l;
}

void run_varlen(const LayerState& st, const VarlenLayout& l, float* scratch, const std::size_t* starts, std::size_t n,
                bool causal) {
    const LayerForward layer(st, l.call, l.scratch, scratch, nullptr, l.positions.data());
    layer.project_inputs();
    const std::size_t d = st.d, H = st.H, Hkv = st.Hkv;
    const Batch &Q = layer.queries(), &K = layer.keys(), &V = layer.values(), &C = layer.context();
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t r0 = starts[i], q = starts[i + 1] - r0;
        if (q == 0) continue;
        CoreProblem p;
        p.q = ConstHeads(Q[0].row(r0), 1, H, q, d, 0, d, Q.row_stride);
        p.out = Heads(C[0].row(r0), 1, H, q, d, 0, d, C.row_stride);
        p.k = ConstHeads(K[0].row(r0), 1, Hkv, q, d, 0, d, K.row_stride);
        p.v = ConstHeads(V[0].row(r0), 1, Hkv, q, d, 0, d, V.row_stride);
        p.scale = 1.0f / std::sqrt(static_cast<float>(d));
        p.causal = causal;  // Lq = Lk: top-left and bottom-right agree
        p.compute = st.compute;
        p.mods = st.modifiers();
        AttentionCore(p, l.paths[i], l.cores[i], scratch, scratch + l.scratch.slots, l.scratch.slot_floats, l.scratch.threads).run();
    }
    layer.project_output();
}

}  // namespace mha::detail
