// AttentionCore::run: the chosen path (core_layout.cpp chose it and laid out its scratch) over the
// problem's shared context (core_context.hpp).
#include "attention_core.hpp"

#include "core_context.hpp"

namespace mha::detail {

AttentionCore::AttentionCore(const CoreProblem& problem, CorePath path, const CoreLayout& layout, float* base, float* slots,
                             std::size_t slot_floats, std::size_t threads)
    : p_(problem), path_(path), layout_(layout), base_(base), slots_(slots), slot_floats_(slot_floats), threads_(threads) {}

void AttentionCore::run() const {
    const CoreContext c(p_, layout_, base_, slots_, slot_floats_, threads_);
    switch (path_) {
        case CorePath::decode: return run_decode(c);
        case CorePath::grouped: return run_grouped(c);
        case CorePath::materialized: break;
    }
    run_materialized(c);
}

}  // namespace mha::detail
