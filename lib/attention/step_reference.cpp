// The scalar backend of a serving step (MultiheadAttention::forward_step with Backend::scalar): each
// sequence alone through the reference's cached decoding (reference::cached_attention on its cached rows,
// widened), as the contiguous KVCache's scalar forward runs it (rows of released blocks are NaN there and lie
// outside every query's window: the reference skips masked keys). Every output and new K / V row is computed
// into buffers first; only then are the new rows written into the step's blocks and y filled, so a failure
// (std::bad_alloc) changes nothing. Preconditions: validated by forward_step; r reserved for the step.
#include <algorithm>
#include <vector>

#include "../reference/reference.hpp"
#include "step_forward.hpp"

namespace mha::detail {

void reference_step(const LayerState& st, const ConstMatrix& x, const Matrix& y, PagedKVCache& cache, const StepReservation& r) {
    const StepComposition& s = *r.step;
    const std::size_t n = s.sequences, T = s.query_starts[n], E = st.E, Hkv = st.Hkv, d = st.d, w = Hkv * d;
    const LayerState::Unpacked weights = st.unpacked();
    reference::Layer layer = weights.layer(st);
    layer.compute = st.compute;  // bf16: the reference rounds where the SIMD path does
    ForwardOptions opt;
    opt.norm_eps = st.norm_eps;
    const ElementFormat& format = element_format(cache.element_type());
    // Sequence i's queries [q0, q0 + q) of the packed rows, after `past` cached tokens (reserve_step checked that
    // the cache holds it at that length).
    auto queries = [&s](std::size_t i) { return s.query_starts[i + 1] - s.query_starts[i]; };
    auto past_of = [&](std::size_t i) { return s.key_lengths[i] - queries(i); };
    std::vector<float> out(T * E), new_keys(T * w), new_values(T * w), past_keys, past_values;
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t id = s.ids[i], q0 = s.query_starts[i], q = queries(i), past = past_of(i);
        past_keys.resize(Hkv * past * d);  // released rows come as NaN: outside every window, the reference never reads them
        past_values.resize(Hkv * past * d);
        for (std::size_t h = 0; h < Hkv; ++h) {
            cache.copy_keys(id, h, Matrix(past_keys.data() + h * past * d, past, d));
            cache.copy_values(id, h, Matrix(past_values.data() + h * past * d, past, d));
        }
        const reference::CachedRows rows{past_keys.data(), past_values.data(), past};
        reference::cached_attention(layer, ConstBatch(x.row(q0), 1, q, E, x.stride, q * x.stride),
                                    Batch(out.data() + q0 * E, 1, q, E, E, q * E), opt, format, cache.k_scale(), cache.v_scale(),
                                    &rows, Batch(new_keys.data() + q0 * w, 1, q, w, w, q * w),
                                    Batch(new_values.data() + q0 * w, 1, q, w, w, q * w));
    }
    PagedKVCacheAccess::prepare_step(cache, r);  // std::bad_alloc: nothing changed
    const KVRows keys = PagedKVCacheAccess::keys(cache, r), values = PagedKVCacheAccess::values(cache, r);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t q0 = s.query_starts[i], q = queries(i), past = past_of(i);
        for (std::size_t t = 0; t < q; ++t)
            for (std::size_t h = 0; h < Hkv; ++h) {
                keys.write_row(i, h, past + t, new_keys.data() + (q0 + t) * w + h * d);
                values.write_row(i, h, past + t, new_values.data() + (q0 + t) * w + h * d);
            }
    }
    for (std::size_t t = 0; t < T; ++t) std::copy_n(out.data() + t * E, E, y.row(t));
    PagedKVCacheAccess::commit_step(cache, r);
}

}  // namespace mha::detail
