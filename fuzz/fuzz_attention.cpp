// libFuzzer target: MultiheadAttention::forward on shapes, strides, masks and options decoded from the
// input bytes, with Backend::simd and Backend::scalar.
//
// Valid problems: both backends must match an independent double-precision computation
// (tests/attention_test_util.hpp: attention_double) within its propagated first-order error bound,
// times 2 (so simd and scalar agree within twice that); every output element and every attention
// weight must be written, and the padding of a strided output left untouched. The SIMD result must be
// bitwise the same for two thread counts (the design promises thread-count independence).
// Values stay in ranges where the first-order bound holds (scores' absolute error ≪ 1), see decode().
//
// Invalid problems (one corruption applied to a valid one): the constructor or both forward calls must
// throw mha::invalid_argument and leave the output and weight buffers exactly as they were.
//
// Input layout (FuzzedDataProvider): option bytes, then a 32-bit seed from which the values are drawn.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "attention_oracle.hpp"

namespace {

using mha_test::Mask;

constexpr float kSentinel = -7777.25f;  // padding and unwritten outputs; never a result here

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz_attention: %s\n", what.c_str());
    std::abort();
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// A [B, rows, cols] batch with padded rows and matrices, in a buffer of exactly its extent (so ASan
// flags any access past it); padding holds kSentinel.
struct Strided {
    std::vector<float> buf;
    std::size_t B = 0, rows = 0, cols = 0, rs = 0, bs = 0;

    Strided(std::size_t b, std::size_t r, std::size_t c, std::size_t row_pad, std::size_t batch_pad)
        : B(b), rows(r), cols(c), rs(c + row_pad), bs(r * (c + row_pad) + batch_pad) {
        buf.assign((B - 1) * bs + (rows - 1) * rs + cols, kSentinel);
    }
    Strided(const std::vector<float>& contiguous, std::size_t b, std::size_t r, std::size_t c, std::size_t row_pad,
            std::size_t batch_pad)
        : Strided(b, r, c, row_pad, batch_pad) {
        for (std::size_t x = 0; x < B; ++x)
            for (std::size_t i = 0; i < rows; ++i)
                std::memcpy(&buf[x * bs + i * rs], &contiguous[(x * rows + i) * cols], cols * sizeof(float));
    }
    mha::Batch view() { return {buf.data(), B, rows, cols, rs, bs}; }
    mha::ConstBatch cview() const { return {buf.data(), B, rows, cols, rs, bs}; }
    bool in_view(std::size_t flat) const {
        const std::size_t x = flat / bs, in = flat % bs;
        return in / rs < rows && in % rs < cols && x < B;
    }
    float at(std::size_t x, std::size_t i, std::size_t c) const { return buf[x * bs + i * rs + c]; }
};

enum class Corruption {
    none,
    heads_do_not_divide,
    row_stride_too_small,
    batch_stride_too_small,
    output_overlaps_query,
    key_padding_shape,
    attn_mask_shape,
    mask_rank,
    mask_null_pointer,
    mask_type_unknown,
    negative_threads,
    bad_norm_eps,
    weights_null,
    key_batch,
    value_length,
    output_shape,
    zero_size,
    count
};

struct Case {
    mha_test::Problem p;       // contiguous data and masks for the oracle
    int kv_mode = 0;           // 0 self (key null), 1 cross (distinct key, value), 2 key given and value null,
                               // 3 key and value passed as the query's own view
    std::size_t pad[4][2] = {};  // row / batch padding of query, key, value, output
    bool null_in_bias = false, null_out_bias = false;
    mha::NeedWeights need = mha::NeedWeights::none;
    mha::Impl impl = mha::Impl::automatic;
    int threads_a = 0, threads_b = 1;
    Corruption corruption = Corruption::none;
    int corruption_detail = 0;
};

// Uniform in [lo, hi) from 24 random bits (std::uniform_real_distribution calls logl per draw in
// libstdc++, which dominated the run time).
float draw(std::mt19937& rng, float lo, float hi) { return lo + (hi - lo) * float(rng() >> 8) * 0x1p-24f; }
// True with probability p (to 2^-32).
bool coin(std::mt19937& rng, double p) { return double(rng()) < p * 4294967296.0; }

Mask make_mask(bool boolean, std::vector<std::size_t> dims, double density, double inf_density, float range,
               std::mt19937& rng) {
    Mask m;
    m.rank = static_cast<int>(dims.size());
    std::size_t n = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) m.shape[i] = dims[i], n *= dims[i];
    if (boolean) {
        m.type = mha::MaskType::boolean;
        m.bools.resize(n);
        // Any nonzero byte means "masked": use varied nonzero values.
        for (auto& b : m.bools) b = coin(rng, density) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
    } else {
        m.type = mha::MaskType::additive;
        m.values.resize(n);
        for (auto& v : m.values) v = coin(rng, inf_density) ? -std::numeric_limits<float>::infinity() : draw(rng, -range, range);
    }
    return m;
}

Case decode(FuzzedDataProvider& in) {
    Case c;
    mha_test::Problem& p = c.p;
    mha::set_isa_cap(static_cast<mha::Isa>(in.ConsumeIntegralInRange<int>(0, 2)));  // capped at the CPU's best

    // Shapes. Mostly small (the oracle is O(B·L·E²) in double under ASan); one input in eight has long
    // keys (past the fused path's 256-key tile, with a small E), one in eight crosses the 64-row query block.
    const int size_class = in.ConsumeIntegralInRange<int>(0, 7);
    const bool long_keys = size_class == 0, long_queries = size_class == 1;
    p.H = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : 8);
    const std::size_t d = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 4 : long_queries ? 8 : 16);
    p.E = p.H * d;
    p.B = long_keys ? 1 : in.ConsumeIntegralInRange<std::size_t>(1, 3);
    c.kv_mode = in.ConsumeIntegralInRange<int>(0, 3);
    const bool has_own_keys = c.kv_mode == 1 || c.kv_mode == 2;
    if (long_keys) {
        p.Lq = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 12) : in.ConsumeIntegralInRange<std::size_t>(200, 400);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(200, 600) : p.Lq;
    } else if (long_queries) {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(60, 70);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 70) : p.Lq;
    } else {
        p.Lq = in.ConsumeIntegralInRange<std::size_t>(1, 20);
        p.Lk = has_own_keys ? in.ConsumeIntegralInRange<std::size_t>(1, 20) : p.Lq;
    }
    for (auto& pd : c.pad) {
        pd[0] = in.ConsumeIntegralInRange<std::size_t>(0, 3);
        pd[1] = in.ConsumeIntegralInRange<std::size_t>(0, 5);
    }

    // Magnitudes: inputs up to 32, weights up to 4/√E (projections typically below ~100). Scores then
    // typically stay below ~1e4 and their absolute float error below ~0.05, where the oracle's
    // first-order softmax bound (with its factor 2) covers the second-order terms.
    static constexpr float input_ranges[] = {1.0f, 4.0f, 32.0f};
    const float input_range = input_ranges[in.ConsumeIntegralInRange<int>(0, 2)];
    const float weight_range = (in.ConsumeBool() ? 4.0f : 1.0f) / std::sqrt(static_cast<float>(p.E));
    c.null_in_bias = in.ConsumeIntegralInRange<int>(0, 5) == 0;
    c.null_out_bias = in.ConsumeIntegralInRange<int>(0, 5) == 0;

    const int kpm_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, bool, float
    const int am_kind = in.ConsumeIntegralInRange<int>(0, 4);   // none, bool 2-D, bool 3-D, float 2-D, float 3-D
    static constexpr double densities[] = {0.0, 0.1, 0.3, 0.7, 1.0};
    const double density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const double inf_density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const float mask_range = in.ConsumeBool() ? 3.0f : 30.0f;
    p.causal = in.ConsumeBool();
    c.need = static_cast<mha::NeedWeights>(in.ConsumeIntegralInRange<int>(0, 2));
    const int norm_kind = in.ConsumeIntegralInRange<int>(0, 4);  // 0, 1: none; else eps 1e-5, 1e-3, 1e-12
    const bool norm_params = in.ConsumeBool();
    c.impl = static_cast<mha::Impl>(in.ConsumeIntegralInRange<int>(0, 2));
    c.threads_a = in.ConsumeIntegralInRange<int>(0, 4);
    c.threads_b = in.ConsumeIntegralInRange<int>(1, 3);
    const int corruption = in.ConsumeIntegralInRange<int>(0, 79);
    c.corruption = corruption < static_cast<int>(Corruption::count) ? static_cast<Corruption>(corruption) : Corruption::none;
    c.corruption_detail = in.ConsumeIntegralInRange<int>(0, 3);

    std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
    auto uniform = [&](std::size_t n, float r) {
        std::vector<float> v(n);
        for (float& x : v) x = draw(rng, -r, r);
        return v;
    };
    const std::size_t E = p.E;
    p.in_w = uniform(3 * E * E, weight_range);
    p.in_b = c.null_in_bias ? std::vector<float>(3 * E, 0.0f) : uniform(3 * E, weight_range);
    p.out_w = uniform(E * E, weight_range);
    p.out_b = c.null_out_bias ? std::vector<float>(E, 0.0f) : uniform(E, weight_range);
    p.query = uniform(p.B * p.Lq * E, input_range);
    if (c.kv_mode == 1) {
        p.key = uniform(p.B * p.Lk * E, input_range);
        p.value = uniform(p.B * p.Lk * E, input_range);
    } else if (c.kv_mode == 2) {
        p.key = uniform(p.B * p.Lk * E, input_range);
    }
    if (kpm_kind) p.key_padding_mask = make_mask(kpm_kind == 1, {p.B, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 1 || am_kind == 3)
        p.attn_mask = make_mask(am_kind == 1, {p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 2 || am_kind == 4)
        p.attn_mask = make_mask(am_kind == 2, {p.B * p.H, p.Lq, p.Lk}, density, inf_density, mask_range, rng);
    if (norm_kind >= 2) {
        static constexpr float eps[] = {1e-5f, 1e-3f, 1e-12f};
        p.norm_eps = eps[norm_kind - 2];
        if (norm_params) {
            p.norm_w.resize(E);
            for (float& x : p.norm_w) x = draw(rng, 0.5f, 1.5f);
            p.norm_b = uniform(E, 0.5f);
        }
    }
    return c;
}

// Everything one forward call needs, with the corruption (if any) applied. Owns all buffers.
struct Call {
    std::optional<Strided> query, key, value, output;
    std::vector<float> weights;  // exactly the size the call writes (ASan catches a write past it)
    mha::AttentionInputs in;
    mha::AttentionOutputs out;
    mha::ForwardOptions opt;
    Mask kpm, am;

    Call(const Case& c, mha::Backend backend, int threads) {
        const mha_test::Problem& p = c.p;
        query.emplace(p.query, p.B, p.Lq, p.E, c.pad[0][0], c.pad[0][1]);
        in.query = query->cview();
        if (c.kv_mode == 1 || c.kv_mode == 2) {
            key.emplace(p.key, p.B, p.Lk, p.E, c.pad[1][0], c.pad[1][1]);
            in.key = key->cview();
        }
        if (c.kv_mode == 1) {
            value.emplace(p.value, p.B, p.Lk, p.E, c.pad[2][0], c.pad[2][1]);
            in.value = value->cview();
        }
        if (c.kv_mode == 3) in.key = in.value = in.query;
        output.emplace(p.B, p.Lq, p.E, c.pad[3][0], c.pad[3][1]);
        out.output = output->view();
        kpm = p.key_padding_mask;
        am = p.attn_mask;
        in.key_padding_mask = kpm.view();
        in.attn_mask = am.view();
        const std::size_t heads = c.need == mha::NeedWeights::per_head ? p.H : 1;
        if (c.need != mha::NeedWeights::none) weights.assign(p.B * heads * p.Lq * p.Lk, kSentinel);
        out.attn_weights = weights.empty() ? nullptr : weights.data();
        opt.backend = backend;
        opt.causal = p.causal;
        opt.need_weights = c.need;
        opt.norm_eps = p.norm_eps;
        opt.impl = c.impl;
        opt.threads = threads;
        corrupt(c);
    }

    void corrupt(const Case& c) {
        const mha_test::Problem& p = c.p;
        const int k = c.corruption_detail;
        // A valid mask to corrupt: the problem's own, or an all-zero one when it has none there.
        auto ensure_attn_mask = [&]() -> mha::MaskView& {
            if (!in.attn_mask.present()) {
                am = Mask();
                am.type = mha::MaskType::boolean, am.rank = 2, am.shape = {p.Lq, p.Lk, 0};
                am.bools.assign(p.Lq * p.Lk, 0);
                in.attn_mask = am.view();
            }
            return in.attn_mask;
        };
        auto ensure_key_padding = [&]() -> mha::MaskView& {
            if (!in.key_padding_mask.present()) {
                kpm = Mask();
                kpm.type = mha::MaskType::additive, kpm.rank = 2, kpm.shape = {p.B, p.Lk, 0};
                kpm.values.assign(p.B * p.Lk, 0.0f);
                in.key_padding_mask = kpm.view();
            }
            return in.key_padding_mask;
        };
        auto some_mask = [&]() -> mha::MaskView& { return (k & 1) ? ensure_attn_mask() : ensure_key_padding(); };
        switch (c.corruption) {
            case Corruption::none:
            case Corruption::heads_do_not_divide:  // applied to the constructor
            case Corruption::count:
                break;
            // Inputs may use any strides; the output's rows must not overlap each other.
            case Corruption::row_stride_too_small:
                out.output.row_stride = out.output.cols - 1;  // cols >= 1; stride 0 when cols == 1
                // One output row cannot overlap itself: then claim two rows (a shape the call must refuse).
                out.output.rows = std::max<std::size_t>(out.output.rows, 2);
                break;
            case Corruption::batch_stride_too_small:
                out.output.batch = std::max<std::size_t>(out.output.batch, 2);  // needs more than one matrix
                out.output.batch_stride = (out.output.rows - 1) * out.output.row_stride + out.output.cols - 1;
                in.query.batch = out.output.batch;
                break;
            case Corruption::output_overlaps_query:
                // Output aliases the query (a writable buffer, so a wrong write shows up as a change).
                in.query = out.output;
                if (c.kv_mode == 3) in.key = in.value = in.query;
                break;
            case Corruption::key_padding_shape:
                ensure_key_padding().shape[(k & 2) ? 0 : 1] += 1;
                break;
            case Corruption::attn_mask_shape:
                ensure_attn_mask();
                in.attn_mask.shape[static_cast<std::size_t>(k) % static_cast<std::size_t>(in.attn_mask.rank)] += 1;
                break;
            case Corruption::mask_rank:
                some_mask().rank = (k & 2) ? 4 : 1;
                break;
            case Corruption::mask_null_pointer: {
                mha::MaskView& m = some_mask();
                m.bools = nullptr, m.values = nullptr;
                break;
            }
            case Corruption::mask_type_unknown:
                some_mask().type = static_cast<mha::MaskType>(3 + k);
                break;
            case Corruption::negative_threads:
                opt.threads = -1 - k;
                break;
            case Corruption::bad_norm_eps: {
                const float bad[] = {-1e-5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity()};
                opt.norm_eps = bad[k];
                break;
            }
            case Corruption::weights_null:
                opt.need_weights = (k & 1) ? mha::NeedWeights::per_head : mha::NeedWeights::averaged;
                out.attn_weights = nullptr;
                break;
            case Corruption::key_batch:
                if (c.kv_mode == 1 || c.kv_mode == 2) {
                    in.key.batch += 1;  // view now claims more than the buffer holds: must be rejected unread
                } else {
                    in.key = in.query;
                    in.key.batch += 1;
                }
                break;
            case Corruption::value_length:
                in.value = in.key.data ? in.key : in.query;
                in.value.rows += 1;
                break;
            case Corruption::output_shape:
                if (k & 1) out.output.rows += 1; else out.output.cols += 1;
                break;
            case Corruption::zero_size:
                if (k == 0) in.query.rows = 0; else if (k == 1) in.query.cols = 0; else if (k == 2) in.query.batch = 0; else in.query.data = nullptr;
                break;
        }
    }
};

// The oracle's bounds are relative; float exp underflows (xsimd flushes to 0 below e^-87.9, std::exp
// goes through denormals), which costs up to FLT_MIN absolute per probability (the softmax sum is
// >= 1, so the division does not amplify it). In an output: ≤ Lk·FLT_MIN·max|v|·max_r Σ_t|Wo_rt|,
// with the decoded ranges (|v| ≤ 32·4·√E < 2e3 after projection, Σ|Wo| ≤ 4·√E < 50) below Lk·1e5·FLT_MIN.
constexpr double kFltMin = std::numeric_limits<float>::min();

void check_close(float got, double expected, double tol, const char* what, const char* backend, std::size_t index) {
    if (!(std::abs(double(got) - expected) <= tol)) {
        char line[200];
        std::snprintf(line, sizeof line, "%s %s[%zu] = %.9g, expected %.17g ± %.3g", backend, what, index, double(got),
                      expected, tol);
        fail(line);
    }
}

void check_valid(const Case& c, const mha::MultiheadAttention& attention, const mha_test::Expected& ex, mha::Backend backend,
                 std::vector<float>* output_bits) {
    const mha_test::Problem& p = c.p;
    const char* name = backend == mha::Backend::simd ? "simd" : "scalar";
    Call call(c, backend, c.threads_a);
    attention.forward(call.in, call.out, call.opt);
    const Strided& o = *call.output;
    for (std::size_t flat = 0; flat < o.buf.size(); ++flat)
        if (!o.in_view(flat) && !same_bits(o.buf[flat], kSentinel))
            fail(std::string(name) + " wrote output padding at buffer index " + std::to_string(flat));
    for (std::size_t b = 0; b < p.B; ++b)
        for (std::size_t i = 0; i < p.Lq; ++i)
            for (std::size_t e = 0; e < p.E; ++e) {
                const std::size_t at = (b * p.Lq + i) * p.E + e;
                check_close(o.at(b, i, e), ex.output[at], ex.output_tol[at] + double(p.Lk) * 1e5 * kFltMin, "output", name, at);
            }
    if (c.need != mha::NeedWeights::none) {
        const auto& w = c.need == mha::NeedWeights::per_head ? ex.probs : ex.averaged;
        const auto& t = c.need == mha::NeedWeights::per_head ? ex.probs_tol : ex.averaged_tol;
        for (std::size_t i = 0; i < w.size(); ++i) check_close(call.weights[i], w[i], t[i] + kFltMin, "attn_weights", name, i);
    }
    if (output_bits) {
        output_bits->assign(o.buf.begin(), o.buf.end());
        output_bits->insert(output_bits->end(), call.weights.begin(), call.weights.end());
    }
}

void check_invalid(const Case& c, const mha::MultiheadAttention& attention, mha::Backend backend) {
    Call call(c, backend, c.threads_a);
    const std::vector<float> output_before = call.output->buf, weights_before = call.weights;
    try {
        attention.forward(call.in, call.out, call.opt);
    } catch (const mha::invalid_argument&) {
        if (std::memcmp(call.output->buf.data(), output_before.data(), output_before.size() * sizeof(float)) != 0 ||
            (!weights_before.empty() &&
             std::memcmp(call.weights.data(), weights_before.data(), weights_before.size() * sizeof(float)) != 0))
            fail("forward threw but wrote to the outputs first (corruption " + std::to_string(int(c.corruption)) + ")");
        return;
    }
    fail(std::string("forward accepted an invalid call (corruption ") + std::to_string(int(c.corruption)) + ", " +
         (backend == mha::Backend::simd ? "simd" : "scalar") + ")");
}

// One line describing a case, printed for a failing input when MHA_FUZZ_VERBOSE is set:
//   MHA_FUZZ_VERBOSE=1 build-fuzz/fuzz/fuzz_attention <crash file>
void print_case(const Case& c) {
    const mha_test::Problem& p = c.p;
    char eps[32] = "none";
    if (p.norm_eps) std::snprintf(eps, sizeof eps, "%g", double(*p.norm_eps));
    std::fprintf(stderr,
                 "case: isa %s B %zu Lq %zu Lk %zu E %zu H %zu kv_mode %d pads q %zu/%zu k %zu/%zu v %zu/%zu o %zu/%zu "
                 "null biases %d/%d kpm %d am %d/rank %d causal %d need %d norm %s impl %d threads %d/%d corruption %d/%d\n",
                 std::string(mha::isa_name(mha::active_isa())).c_str(), p.B, p.Lq, p.Lk, p.E, p.H, c.kv_mode, c.pad[0][0],
                 c.pad[0][1], c.pad[1][0], c.pad[1][1], c.pad[2][0], c.pad[2][1], c.pad[3][0], c.pad[3][1], c.null_in_bias,
                 c.null_out_bias, int(p.key_padding_mask.type), int(p.attn_mask.type), p.attn_mask.rank, p.causal,
                 int(c.need), eps, int(c.impl), c.threads_a,
                 c.threads_b, int(c.corruption), c.corruption_detail);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider provider(data, size);
    const Case c = decode(provider);
    if (std::getenv("MHA_FUZZ_VERBOSE")) print_case(c);
    const mha_test::Problem& p = c.p;
    mha::AttentionWeights w = p.weights();
    if (c.null_in_bias) w.in_proj_bias = nullptr;
    if (c.null_out_bias) w.out_proj_bias = nullptr;

    if (c.corruption == Corruption::heads_do_not_divide) {
        const std::size_t bad_heads[] = {p.E + 1, 0, 2 * p.E, p.E + 7};
        try {
            const mha::MultiheadAttention attention(w, p.E, bad_heads[c.corruption_detail]);
        } catch (const mha::invalid_argument&) {
            return 0;
        }
        fail("constructor accepted num_heads " + std::to_string(bad_heads[c.corruption_detail]) + " for embed_dim " +
             std::to_string(p.E));
    }
    const mha::MultiheadAttention attention(w, p.E, p.H);
    if (c.corruption != Corruption::none) {
        check_invalid(c, attention, mha::Backend::scalar);
        check_invalid(c, attention, mha::Backend::simd);
        return 0;
    }

    const mha_test::Expected ex = oracle_attention(p);
    check_valid(c, attention, ex, mha::Backend::scalar, nullptr);
    std::vector<float> bits_a, bits_b;
    check_valid(c, attention, ex, mha::Backend::simd, &bits_a);
    Case other_threads = c;
    other_threads.threads_a = c.threads_b;
    check_valid(other_threads, attention, ex, mha::Backend::simd, &bits_b);
    if (std::memcmp(bits_a.data(), bits_b.data(), bits_a.size() * sizeof(float)) != 0)
        fail("simd results differ between " + std::to_string(c.threads_a) + " and " + std::to_string(c.threads_b) +
             " threads");
    return 0;
}
