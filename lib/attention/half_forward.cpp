// MultiheadAttention::forward on 16-bit activations (HalfAttentionInputs, mha/attention.hpp): the 16-bit views
// validated (validate_half_call), the inputs widened exactly into fp32 copies, the fp32 forward (which validates
// everything else), the output rounded to the inputs' type. The copies are leased from the scratch cache before
// anything is written. An absent key or value stays absent in the fp32 call (the cache overload requires it).
#include <cstring>

#include "../core/scratch.hpp"
#include "../core/validate.hpp"
#include "mha/attention.hpp"
#include "validate_call.hpp"

namespace mha {
namespace {

float widen(std::uint16_t bits, DataType t) noexcept {
    return t == DataType::bf16 ? bfloat16::from_bits(bits).to_float() : float16::from_bits(bits).to_float();
}
std::uint16_t narrow(float x, DataType t) noexcept {
    return t == DataType::bf16 ? bfloat16::from_float(x).bits : float16::from_float(x).bits;
}

// dst [B, L, C] contiguous = the widened src.
void widen_batch(const BatchView<const std::uint16_t>& src, DataType t, float* dst) {
    for (std::size_t b = 0; b < src.batch; ++b)
        for (std::size_t i = 0; i < src.rows; ++i) {
            const std::uint16_t* row = src[b].row(i);
            float* out = dst + (b * src.rows + i) * src.cols;
            for (std::size_t j = 0; j < src.cols; ++j) out[j] = widen(row[j], t);
        }
}

struct Widened {
    AttentionInputs in;
    AttentionOutputs out;
};

// The caller's own buffers against each other, as the fp32 forward checks them (it sees only the widened copies):
// attn_weights (weight_heads per batch: H, 1, or 0 without need_weights) apart from the 16-bit views, and with a
// cache, the query and output apart from its storage.
void check_half_buffers(const HalfAttentionInputs& in, const HalfAttentionOutputs& out, std::size_t weight_heads,
                        const KVCache* cache) {
    auto bytes = [](const BatchView<const std::uint16_t>& v) {
        return v.data == nullptr || v.batch == 0 || v.rows == 0 || v.cols == 0 ? std::size_t{0} : detail::batch_elements(v) * 2;
    };
    auto apart = [&](const void* p, std::size_t n, const BatchView<const std::uint16_t>& v) {
        return n == 0 || bytes(v) == 0 ||
               !detail::overlaps(static_cast<const unsigned char*>(p), n, reinterpret_cast<const unsigned char*>(v.data), bytes(v));
    };
    const BatchView<const std::uint16_t> output = out.output;
    const std::size_t B = in.query.batch, Lq = in.query.rows, Lk = in.key.rows;
    if (weight_heads != 0 && out.attn_weights != nullptr && B != 0 && Lq != 0 && Lk != 0) {
        const std::size_t n = detail::checked_madd(detail::checked_madd(B, weight_heads, 0, "attn_weights", "[B, H]"),
                                                   detail::checked_madd(Lq, Lk, 0, "attn_weights", "[Lq, Lk]"), 0, "attn_weights",
                                                   "size");
        const std::size_t n_bytes = detail::checked_madd(n, sizeof(float), 0, "attn_weights", "bytes");
        if (!apart(out.attn_weights, n_bytes, output) || !apart(out.attn_weights, n_bytes, in.query) ||
            !apart(out.attn_weights, n_bytes, in.key) || !apart(out.attn_weights, n_bytes, in.value))
            detail::fail("attn_weights [" + std::to_string(n) + " floats] overlaps output, query, key or value");
    }
    if (cache != nullptr) {
        if (!apart(cache->key_storage(), cache->bytes(), in.query)) detail::fail("query overlaps the KV cache");
        if (!apart(cache->key_storage(), cache->bytes(), output)) detail::fail("output overlaps the KV cache");
    }
}

template <class Forward>
void run_half(const HalfAttentionInputs& in_arg, const HalfAttentionOutputs& out, std::size_t weight_heads, const KVCache* cache,
              Forward&& forward) {
    const HalfAttentionInputs in = detail::validate_half_call(in_arg, out);  // key and value resolved
    check_half_buffers(in, out, weight_heads, cache);
    const bool key_is_query = detail::same_view(in.key, in.query), value_is_key = detail::same_view(in.value, in.key);
    const std::size_t nq = detail::checked_madd(in.query.batch * in.query.rows, in.query.cols, 0, "query", "size");
    const std::size_t nk = key_is_query ? 0 : detail::checked_madd(in.key.batch * in.key.rows, in.key.cols, 0, "key", "size");
    const std::size_t nv = value_is_key ? 0 : detail::checked_madd(in.value.batch * in.value.rows, in.value.cols, 0, "value", "size");
    const std::size_t no = detail::checked_madd(out.output.batch * out.output.rows, out.output.cols, 0, "output", "size");
    detail::ScratchLease lease((nq + nk + nv + no + 64) * sizeof(float));
    float* base = static_cast<float*>(lease.data());
    float *q = base, *k = q + nq, *v = k + nk, *y = v + nv;
    widen_batch(in.query, in.type, q);
    if (!key_is_query) widen_batch(in.key, in.type, k);
    if (!value_is_key) widen_batch(in.value, in.type, v);
    Widened w;
    w.in.query = ConstBatch(q, in.query.batch, in.query.rows, in.query.cols);
    const ConstBatch key = key_is_query ? w.in.query : ConstBatch(k, in.key.batch, in.key.rows, in.key.cols);
    const ConstBatch value = value_is_key ? key : ConstBatch(v, in.value.batch, in.value.rows, in.value.cols);
    if (in_arg.key.data != nullptr) w.in.key = key;  // absent stays absent
    if (in_arg.value.data != nullptr) w.in.value = value;
    w.in.key_padding_mask = in.key_padding_mask;
    w.in.attn_mask = in.attn_mask;
    w.out.output = Batch(y, out.output.batch, out.output.rows, out.output.cols);
    w.out.attn_weights = out.attn_weights;
    forward(w.in, w.out);
    for (std::size_t b = 0; b < out.output.batch; ++b)
        for (std::size_t i = 0; i < out.output.rows; ++i) {
            std::uint16_t* row = out.output[b].row(i);
            const float* src = y + (b * out.output.rows + i) * out.output.cols;
            for (std::size_t j = 0; j < out.output.cols; ++j) row[j] = narrow(src[j], in.type);
        }
}

}  // namespace

void MultiheadAttention::forward(const HalfAttentionInputs& in, const HalfAttentionOutputs& out, const ForwardOptions& opt) const {
    const std::size_t weight_heads =
        opt.need_weights == NeedWeights::per_head ? num_heads() : opt.need_weights == NeedWeights::averaged ? 1 : 0;
    run_half(in, out, weight_heads, nullptr, [&](const AttentionInputs& i, const AttentionOutputs& o) { forward(i, o, opt); });
}

void MultiheadAttention::forward(const HalfAttentionInputs& in, const HalfAttentionOutputs& out, const ForwardOptions& opt,
                                 KVCache& cache) const {
    run_half(in, out, 0, &cache, [&](const AttentionInputs& i, const AttentionOutputs& o) { forward(i, o, opt, cache); });
}

}  // namespace mha
