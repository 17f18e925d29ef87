// libFuzzer target: mha::scaled_dot_product_attention (mha/sdpa.hpp) on shapes, layouts, masks and options
// decoded from the input bytes.
//
// Valid problems: q [B, H, Lq, d], k and v [B, Hkv, Lk, d] with H = G·Hkv (MHA, GQA, MQA), each a HeadsView in
// its own layout: any nesting order of batch, head and row ([B, H, L, d], [B, L, H, d], [L, B, H, d], ...)
// with padding after each level, inputs sometimes repeated (batch or head stride 0), q/k/v sometimes
// interleaved in one packed [B, L, (H + 2·Hkv)·d] buffer, v sometimes the very view of k; the output in any
// nesting order with padding. Masks: key padding [B, Lk] and attn_mask [Lq, Lk] or [B·H, Lq, Lk], boolean or
// additive with -inf; causal top-left or bottom-right with Lq != Lk; the default scale or an explicit one
// (0, negative, 1, random); the K and V rows of keys the key padding mask hides sometimes NaN or ±inf (a
// masked key never contributes). Backend::scalar and Backend::simd with each Impl (automatic, materialized,
// fused) must match decoder_oracle.hpp's sdpa_double within its derived bound (times 2), write every output
// element and leave the output's padding untouched; the SIMD result must be bitwise the same for two thread
// counts (the second run sometimes in a caller's Workspace of exactly sdpa_workspace_bytes()).
//
// Invalid problems (one corruption applied to a valid one): both backends must throw mha::invalid_argument and
// leave the output buffer (and a borrowed workspace) exactly as they were.
//
// Input layout (FuzzedDataProvider): option bytes, then a 32-bit seed from which the values are drawn.
// MHA_FUZZ_VERBOSE=1 prints one line per case.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
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

#include "decoder_oracle.hpp"

namespace {

using mha_test::Mask;

constexpr float kSentinel = -7777.25f;  // padding and unwritten outputs; never a result here
constexpr double kFltMin = std::numeric_limits<float>::min();

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz_sdpa: %s\n", what.c_str());
    std::abort();
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

float draw(std::mt19937& rng, float lo, float hi) { return lo + (hi - lo) * float(rng() >> 8) * 0x1p-24f; }
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
        for (auto& b : m.bools) b = coin(rng, density) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
    } else {
        m.type = mha::MaskType::additive;
        m.values.resize(n);
        for (auto& v : m.values) v = coin(rng, inf_density) ? -std::numeric_limits<float>::infinity() : draw(rng, -range, range);
    }
    return m;
}

// The memory layout of one [B, heads, L, d] tensor: the nesting order of batch (0), head (1) and row (2),
// outermost first, the padding after each level (innermost first), and an optional repeat (an input's batch
// or head stride 0).
struct Layout {
    int order = 0;  // index into kOrders
    std::size_t pad[3] = {};
    int repeat = 0;  // 0 none, 1 batch stride 0, 2 head stride 0
};
constexpr int kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {2, 0, 1}, {1, 0, 2}, {1, 2, 0}, {2, 1, 0}};
const char* const kOrderNames[6] = {"bhl", "blh", "lbh", "hbl", "hlb", "lhb"};

// A view of that layout over `base` (strides only; extent() is the floats it spans).
mha::Heads layout_view(const Layout& lay, float* base, std::size_t B, std::size_t heads, std::size_t L, std::size_t d) {
    const std::size_t count[3] = {lay.repeat == 1 ? 1 : B, lay.repeat == 2 ? 1 : heads, L};
    std::size_t stride[3] = {0, 0, 0};
    std::size_t step = d + lay.pad[0];  // the stride of the innermost level
    for (int level = 2; level >= 0; --level) {
        const int dim = kOrders[lay.order][level];
        stride[dim] = step;
        step = count[dim] * step + (level > 0 ? lay.pad[3 - level] : 0);
    }
    if (lay.repeat == 1) stride[0] = 0;
    if (lay.repeat == 2) stride[1] = 0;
    return mha::Heads(base, B, heads, L, d, stride[0], stride[1], stride[2]);
}

std::size_t extent(const mha::ConstHeads& v) {
    return (v.batch - 1) * v.batch_stride + (v.heads - 1) * v.head_stride + (v.rows - 1) * v.row_stride + v.dim;
}

enum class Corruption {
    none,
    output_rows_overlap,
    output_overlaps_input,  // the query, key, value or an additive mask inside the output's range
    kv_heads_do_not_divide,
    dims_mismatch,          // key dim, value dim, value heads, value rows
    batch_mismatch,
    output_shape,
    zero_size,
    key_padding_shape,
    attn_mask_shape,
    mask_rank,
    mask_null_pointer,
    mask_type_unknown,
    bad_impl,
    bad_backend,
    bad_causal_alignment,
    negative_threads,
    bad_scale,
    workspace_too_small,  // simd only
    workspace_overlaps,
    count
};

struct Case {
    std::size_t B = 1, H = 1, Hkv = 1, Lq = 1, Lk = 1, d = 1;
    Layout lay[4];           // q, k, v, out
    bool packed_qkv = false;  // q, k, v interleaved in one [B, L, (H + 2·Hkv)·d] buffer (Lq == Lk)
    bool v_is_k = false;      // value passed as the key's view
    std::vector<float> q, k, v;  // contiguous [B, H, Lq, d], [B, Hkv, Lk, d] (v_is_k: v empty)
    Mask kpm, am;
    bool causal = false;
    mha::CausalAlignment alignment = mha::CausalAlignment::top_left;
    std::optional<float> scale;
    int poison = 0;  // 0 none; else the K and V rows of keys hidden by the key padding mask become NaN, +inf, -inf
    int threads_a = 0, threads_b = 1;
    bool workspace_b = false;
    Corruption corruption = Corruption::none;
    int corruption_detail = 0;
};

Case decode(FuzzedDataProvider& in) {
    Case c;
    mha::set_isa_cap(static_cast<mha::Isa>(in.ConsumeIntegralInRange<int>(0, 2)));
    const int corruption = in.ConsumeIntegralInRange<int>(0, 99);
    c.corruption = corruption < static_cast<int>(Corruption::count) ? static_cast<Corruption>(corruption) : Corruption::none;
    c.corruption_detail = in.ConsumeIntegralInRange<int>(0, 3);

    // Shapes: one input in eight has long keys (past the fused path's 256-key tiles and its automatic
    // threshold of 1024 keys), one in eight long queries (past the 64-row query block and, with G heads
    // stacked, the 128-row group), else small. d up to 40 crosses the 16-float vectors twice.
    const int size_class = in.ConsumeIntegralInRange<int>(0, 7);
    const bool long_keys = size_class == 0, long_queries = size_class == 1;
    c.B = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 2 : 3);
    c.Hkv = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 2 : 4);
    c.H = c.Hkv * in.ConsumeIntegralInRange<std::size_t>(1, 4);
    c.d = in.ConsumeIntegralInRange<std::size_t>(1, long_keys ? 8 : long_queries ? 16 : 40);
    if (long_keys) {
        c.Lq = in.ConsumeIntegralInRange<std::size_t>(1, 8);
        c.Lk = in.ConsumeIntegralInRange<std::size_t>(200, 1100);
    } else if (long_queries) {
        c.Lq = in.ConsumeIntegralInRange<std::size_t>(60, 70);
        c.Lk = in.ConsumeIntegralInRange<std::size_t>(1, 70);
    } else {
        c.Lq = in.ConsumeIntegralInRange<std::size_t>(1, 20);
        c.Lk = in.ConsumeBool() ? c.Lq : in.ConsumeIntegralInRange<std::size_t>(1, 20);
    }
    if (c.corruption == Corruption::output_rows_overlap && c.B == 1 && c.H == 1 && c.Lq == 1) c.Lq = 2;

    for (int t = 0; t < 4; ++t) {
        Layout& lay = c.lay[t];
        lay.order = in.ConsumeIntegralInRange<int>(0, 5);
        if (in.ConsumeBool())
            for (auto& pd : lay.pad) pd = in.ConsumeIntegralInRange<std::size_t>(0, 5);
        if (t < 3) lay.repeat = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegralInRange<int>(1, 2) : 0;
    }
    c.packed_qkv = c.Lq == c.Lk && in.ConsumeIntegralInRange<int>(0, 3) == 0;
    c.v_is_k = !c.packed_qkv && in.ConsumeIntegralInRange<int>(0, 5) == 0;

    // Magnitudes: q, k, v up to 16, |scale| <= 2/√d: scores below ~4·16²·√d ≈ 6500, their float error ≪ 1.
    static constexpr float ranges[] = {1.0f, 4.0f, 16.0f};
    const float range = ranges[in.ConsumeIntegralInRange<int>(0, 2)];
    const float inv_sqrt_d = 1.0f / std::sqrt(float(c.d));
    const int scale_mode = in.ConsumeIntegralInRange<int>(0, 7);
    const int kpm_kind = in.ConsumeIntegralInRange<int>(0, 2);  // none, bool, float
    const int am_kind = in.ConsumeIntegralInRange<int>(0, 4);   // none, bool 2-D, bool 3-D, float 2-D, float 3-D
    static constexpr double densities[] = {0.0, 0.1, 0.3, 0.7, 1.0};
    const double density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const double inf_density = densities[in.ConsumeIntegralInRange<int>(0, 4)];
    const float mask_range = in.ConsumeBool() ? 3.0f : 30.0f;
    c.causal = in.ConsumeBool();
    c.alignment = in.ConsumeBool() ? mha::CausalAlignment::bottom_right : mha::CausalAlignment::top_left;
    c.poison = in.ConsumeIntegralInRange<int>(0, 5);
    if (c.poison > 3) c.poison = 0;
    c.threads_a = in.ConsumeIntegralInRange<int>(0, 4);
    c.threads_b = in.ConsumeIntegralInRange<int>(1, 3);
    c.workspace_b = in.ConsumeBool();

    std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
    auto uniform = [&](std::size_t n, float r) {
        std::vector<float> x(n);
        for (float& e : x) e = draw(rng, -r, r);
        return x;
    };
    switch (scale_mode) {
        case 4: c.scale = 1.0f; break;
        case 5: c.scale = inv_sqrt_d; break;
        case 6: c.scale = draw(rng, -2.0f, 2.0f) * inv_sqrt_d; break;
        case 7: {
            const float special[] = {0.0f, -inv_sqrt_d, 1.0f / float(c.d), -0.0f};
            c.scale = special[rng() % 4];
            break;
        }
        default: break;  // the default 1/√d
    }
    c.q = uniform(c.B * c.H * c.Lq * c.d, range);
    c.k = uniform(c.B * c.Hkv * c.Lk * c.d, range);
    if (!c.v_is_k) c.v = uniform(c.B * c.Hkv * c.Lk * c.d, range);
    if (kpm_kind) c.kpm = make_mask(kpm_kind == 1, {c.B, c.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 1 || am_kind == 3) c.am = make_mask(am_kind == 1, {c.Lq, c.Lk}, density, inf_density, mask_range, rng);
    if (am_kind == 2 || am_kind == 4)
        c.am = make_mask(am_kind == 2, {c.B * c.H, c.Lq, c.Lk}, density, inf_density, mask_range, rng);
    return c;
}

// Everything one call needs, with the corruption (if any) applied. Owns all buffers, each of exactly its
// extent (ASan flags any access past it).
struct Call {
    std::vector<float> qbuf, kbuf, vbuf, obuf;  // packed_qkv: all in qbuf
    std::vector<float> arena;                   // memory of a borrowed workspace (workspace_overlaps)
    std::optional<mha::Workspace> workspace;
    mha::SdpaInputs in;
    mha::Heads out;
    mha::SdpaOptions opt;
    Mask kpm, am;

    Call(const Case& c, mha::Backend backend, mha::Impl impl, int threads, bool use_workspace) {
        const std::size_t B = c.B, H = c.H, Hkv = c.Hkv, Lq = c.Lq, Lk = c.Lk, d = c.d;
        auto fill = [&](std::vector<float>& buf, const mha::Heads& v, const std::vector<float>& dense) {
            for (std::size_t b = 0; b < v.batch; ++b)
                for (std::size_t h = 0; h < v.heads; ++h)
                    for (std::size_t i = 0; i < v.rows; ++i)
                        std::memcpy(&buf[b * v.batch_stride + h * v.head_stride + i * v.row_stride],
                                    &dense[((b * v.heads + h) * v.rows + i) * v.dim], v.dim * sizeof(float));
        };
        // A tensor of its own layout: a buffer of its extent, then the values (a repeated input keeps the last
        // batch / head written, and the oracle reads through the same view, so it sees what the library sees).
        auto make = [&](std::vector<float>& buf, const Layout& lay, std::size_t heads, std::size_t L,
                        const std::vector<float>* dense) {
            mha::Heads v = layout_view(lay, nullptr, B, heads, L, d);
            buf.assign(extent(v), kSentinel);
            v.data = buf.data();
            if (dense) fill(buf, v, *dense);
            return v;
        };
        mha::Heads q, k, v;
        if (c.packed_qkv) {
            const std::size_t w = (H + 2 * Hkv) * d + c.lay[0].pad[0], bs = Lq * w + c.lay[0].pad[1];
            qbuf.assign((B - 1) * bs + (Lq - 1) * w + (H + 2 * Hkv) * d, kSentinel);
            q = mha::Heads(qbuf.data(), B, H, Lq, d, bs, d, w);
            k = mha::Heads(qbuf.data() + H * d, B, Hkv, Lk, d, bs, d, w);
            v = mha::Heads(qbuf.data() + (H + Hkv) * d, B, Hkv, Lk, d, bs, d, w);
            fill(qbuf, q, c.q), fill(qbuf, k, c.k), fill(qbuf, v, c.v);
        } else {
            q = make(qbuf, c.lay[0], H, Lq, &c.q);
            k = make(kbuf, c.lay[1], Hkv, Lk, &c.k);
            v = c.v_is_k ? k : make(vbuf, c.lay[2], Hkv, Lk, &c.v);
        }
        kpm = c.kpm, am = c.am;
        // Keys the key padding mask hides for batch b: their K and V rows poisoned (not for a repeated batch,
        // whose rows other batches see).
        if (c.poison && kpm.present() && c.lay[1].repeat != 1 && c.lay[2].repeat != 1) {
            const float bad[] = {0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()};
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t j = 0; j < Lk; ++j)
                    if (kpm.at(b * Lk + j) == -INFINITY)
                        for (std::size_t g = 0; g < Hkv; ++g)
                            for (const mha::Heads* t : {&k, &v})
                                std::fill_n(t->data + b * t->batch_stride + g * t->head_stride + j * t->row_stride, d, bad[c.poison]);
        }
        out = make(obuf, c.lay[3], H, Lq, nullptr);
        in.query = q, in.key = k, in.value = v;
        in.key_padding_mask = kpm.view();
        in.attn_mask = am.view();
        opt.causal = c.causal;
        opt.causal_alignment = c.alignment;
        opt.scale = c.scale;
        opt.backend = backend;
        opt.impl = impl;
        opt.threads = threads;
        if (use_workspace) workspace.emplace(mha::sdpa_workspace_bytes(in, opt));
        corrupt(c);
    }

    void run() {
        if (workspace)
            mha::scaled_dot_product_attention(in, out, opt, *workspace);
        else
            mha::scaled_dot_product_attention(in, out, opt);
    }

    void corrupt(const Case& c) {
        const int k = c.corruption_detail;
        auto ensure_attn_mask = [&]() -> mha::MaskView& {
            if (!in.attn_mask.present()) {
                am = Mask();
                am.type = mha::MaskType::boolean, am.rank = 2, am.shape = {c.Lq, c.Lk, 0};
                am.bools.assign(c.Lq * c.Lk, 0);
                in.attn_mask = am.view();
            }
            return in.attn_mask;
        };
        auto ensure_key_padding = [&]() -> mha::MaskView& {
            if (!in.key_padding_mask.present()) {
                kpm = Mask();
                kpm.type = mha::MaskType::additive, kpm.rank = 2, kpm.shape = {c.B, c.Lk, 0};
                kpm.values.assign(c.B * c.Lk, 0.0f);
                in.key_padding_mask = kpm.view();
            }
            return in.key_padding_mask;
        };
        auto some_mask = [&]() -> mha::MaskView& { return (k & 1) ? ensure_attn_mask() : ensure_key_padding(); };
        switch (c.corruption) {
            case Corruption::none:
            case Corruption::count:
                break;
            case Corruption::output_rows_overlap: {
                // Among the levels with more than one entry: the outer one of two takes the inner one's stride
                // (two rows then share memory), or one takes a stride below d. Strides only shrink: the view
                // stays inside its buffer.
                struct Level {
                    std::size_t* stride;
                    std::size_t count;
                };
                std::vector<Level> levels;
                if (out.rows > 1) levels.push_back({&out.row_stride, out.rows});
                if (out.heads > 1) levels.push_back({&out.head_stride, out.heads});
                if (out.batch > 1) levels.push_back({&out.batch_stride, out.batch});
                if (levels.empty()) fail("output_rows_overlap without a level of two entries");
                if (levels.size() >= 2 && (k & 2)) {
                    Level a = levels[static_cast<std::size_t>(k & 1)], b = levels[static_cast<std::size_t>(k & 1) ^ 1];
                    if (*a.stride < *b.stride) std::swap(a, b);
                    *a.stride = *b.stride;
                } else {
                    *levels[static_cast<std::size_t>(k) % levels.size()].stride = out.dim - 1;
                }
                break;
            }
            case Corruption::output_overlaps_input: {
                // The output's buffer grows by the input's (or mask's) extent, which starts at the output's last
                // element or a little before: their ranges share at least one element.
                const std::size_t n_out = obuf.size();
                const std::size_t shift = std::min<std::size_t>(n_out - 1, static_cast<std::size_t>(k));
                if (k < 3) {
                    mha::ConstHeads& v = k == 0 ? in.query : k == 1 ? in.key : in.value;
                    const std::size_t n = extent(v);
                    std::vector<float> copy(v.data, v.data + n);
                    obuf.resize(n_out + n, kSentinel);
                    out.data = obuf.data();
                    float* at = obuf.data() + n_out - 1 - shift;
                    std::copy(copy.begin(), copy.end(), at);
                    const bool key_is_value = in.key.data == in.value.data;
                    v.data = at;
                    if (k == 1 && key_is_value) in.value.data = at;
                } else {
                    // An additive mask inside the output (a boolean one would need bytes; use the key padding).
                    mha::MaskView& m = ensure_key_padding();
                    if (m.type == mha::MaskType::boolean) {
                        kpm.type = mha::MaskType::additive;
                        kpm.values.assign(kpm.bools.size(), 0.0f);
                        for (std::size_t i = 0; i < kpm.bools.size(); ++i) kpm.values[i] = kpm.bools[i] ? -INFINITY : 0.0f;
                        kpm.bools.clear();
                        m = kpm.view();
                    }
                    obuf.resize(n_out + kpm.values.size(), kSentinel);
                    out.data = obuf.data();
                    float* at = obuf.data() + n_out - 1;
                    std::copy(kpm.values.begin(), kpm.values.end(), at);
                    m.values = at;
                }
                break;
            }
            case Corruption::kv_heads_do_not_divide: {
                std::size_t non_divisor = c.H + 1;
                for (std::size_t h = 2; h < c.H; ++h)
                    if (c.H % h != 0) {
                        non_divisor = h;
                        break;
                    }
                const std::size_t bad[] = {c.H + 1, non_divisor, 2 * c.H, c.H + 3};
                in.key.heads = in.value.heads = bad[k];
                break;
            }
            case Corruption::dims_mismatch:
                if (k == 0) in.key.dim = in.key.dim > 1 ? in.key.dim - 1 : 2;
                if (k == 1) in.value.dim = in.value.dim > 1 ? in.value.dim - 1 : 2;
                if (k == 2) in.value.heads = in.value.heads > 1 ? in.value.heads - 1 : 2;
                if (k == 3) in.value.rows = in.value.rows > 1 ? in.value.rows - 1 : 2;
                break;
            case Corruption::batch_mismatch:
                if (k & 1)
                    in.value.batch = in.value.batch > 1 && (k & 2) ? in.value.batch - 1 : in.value.batch + 1;
                else
                    in.key.batch = in.key.batch > 1 && (k & 2) ? in.key.batch - 1 : in.key.batch + 1;
                break;
            case Corruption::output_shape:
                if (k == 0) out.rows += 1;
                if (k == 1) out.heads += 1;
                if (k == 2) out.dim = out.dim > 1 ? out.dim - 1 : 2;
                if (k == 3) out.batch += 1;
                break;
            case Corruption::zero_size:
                if (k == 0) in.query.heads = out.heads = 0;  // B = 0 or L = 0 are valid (nothing to compute)
                if (k == 1) in.key.dim = in.value.dim = in.query.dim = out.dim = 0;
                if (k == 2) in.value.heads = in.key.heads = 0;
                if (k == 3) in.key.data = nullptr;
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
            case Corruption::bad_impl:
                opt.impl = static_cast<mha::Impl>(3 + k);
                break;
            case Corruption::bad_backend:
                opt.backend = static_cast<mha::Backend>(2 + k);
                break;
            case Corruption::bad_causal_alignment:
                opt.causal_alignment = static_cast<mha::CausalAlignment>(2 + k);
                break;
            case Corruption::negative_threads:
                opt.threads = -1 - k;
                break;
            case Corruption::bad_scale: {
                const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
                opt.scale = bad[k];
                break;
            }
            case Corruption::workspace_too_small: {  // simd only
                const std::size_t need = mha::sdpa_workspace_bytes(in, opt);
                if (need == 0) fail("sdpa_workspace_bytes is 0 for the simd backend");
                const std::size_t sizes[] = {need - 1, need / 2, 0, 64};
                workspace.emplace(std::min(sizes[k], need - 1));
                break;
            }
            case Corruption::workspace_overlaps: {
                // A workspace large enough for the call whose memory also holds the output (k 0, 1: at its start or
                // end), the query (k 2) or an additive key padding mask (k 3).
                mha::SdpaOptions simd_opt = opt;
                simd_opt.backend = mha::Backend::simd;
                const std::size_t room = mha::sdpa_workspace_bytes(in, simd_opt) / sizeof(float) + 64;
                std::vector<float> moved;
                if (k < 2) moved = obuf;
                if (k == 2) moved.assign(in.query.data, in.query.data + extent(in.query));
                if (k == 3) {
                    ensure_key_padding();
                    if (kpm.type == mha::MaskType::boolean) {
                        for (std::uint8_t x : kpm.bools) moved.push_back(x ? -INFINITY : 0.0f);
                        kpm.bools.clear();
                        kpm.type = mha::MaskType::additive;
                        in.key_padding_mask.type = mha::MaskType::additive;
                        in.key_padding_mask.bools = nullptr;
                    } else {
                        moved = kpm.values;
                    }
                }
                arena.assign(room + moved.size(), kSentinel);
                float* at = arena.data() + ((k & 1) ? room : 0);
                std::copy(moved.begin(), moved.end(), at);
                if (k < 2) {
                    out.data = at;
                } else if (k == 2) {
                    in.query.data = at;
                } else {
                    in.key_padding_mask.values = at;
                }
                workspace.emplace(static_cast<void*>(arena.data()), arena.size() * sizeof(float));
                break;
            }
        }
    }
};

void check_close(float got, double expected, double tol, const char* what, std::size_t index) {
    if (!(std::abs(double(got) - expected) <= tol)) {
        char line[200];
        std::snprintf(line, sizeof line, "%s output[%zu] = %.9g, expected %.17g ± %.3g", what, index, double(got), expected, tol);
        fail(line);
    }
}

const char* impl_name(mha::Impl impl) {
    return impl == mha::Impl::automatic ? "automatic" : impl == mha::Impl::materialized ? "materialized" : "fused";
}

void check_valid(const Case& c, const fuzz_oracle::SdpaExpected& ex, mha::Backend backend, mha::Impl impl, int threads,
                 bool use_workspace, std::vector<float>* bits) {
    const std::string name = std::string(backend == mha::Backend::simd ? "simd " : "scalar ") + impl_name(impl) + " threads " +
                             std::to_string(threads) + (use_workspace ? " workspace" : "");
    Call call(c, backend, impl, threads, use_workspace);
    call.run();
    const mha::Heads& o = call.out;
    std::vector<char> in_view(call.obuf.size(), 0);
    for (std::size_t b = 0; b < c.B; ++b)
        for (std::size_t h = 0; h < c.H; ++h)
            for (std::size_t i = 0; i < c.Lq; ++i)
                for (std::size_t t = 0; t < c.d; ++t) {
                    const std::size_t flat = b * o.batch_stride + h * o.head_stride + i * o.row_stride + t;
                    const std::size_t at = ((b * c.H + h) * c.Lq + i) * c.d + t;
                    in_view[flat] = 1;
                    check_close(call.obuf[flat], ex.out[at], ex.out_tol[at] + kFltMin, name.c_str(), at);
                }
    for (std::size_t flat = 0; flat < call.obuf.size(); ++flat)
        if (!in_view[flat] && !same_bits(call.obuf[flat], kSentinel))
            fail(name + " wrote output padding at buffer index " + std::to_string(flat));
    if (bits) *bits = call.obuf;
}

void check_invalid(const Case& c, mha::Backend backend) {
    Call call(c, backend, mha::Impl::automatic, c.threads_a, false);
    const std::vector<float> out_before = call.obuf, arena_before = call.arena;
    auto unchanged = [](const std::vector<float>& now, const std::vector<float>& before) {
        return now.size() == before.size() && (before.empty() || std::memcmp(now.data(), before.data(), before.size() * sizeof(float)) == 0);
    };
    try {
        call.run();
    } catch (const mha::invalid_argument& e) {
        if (std::getenv("MHA_FUZZ_VERBOSE")) std::fprintf(stderr, "rejected: %s\n", e.what());
        if (!unchanged(call.obuf, out_before) || !unchanged(call.arena, arena_before))
            fail("scaled_dot_product_attention threw but wrote first (corruption " + std::to_string(int(c.corruption)) + "/" +
                 std::to_string(c.corruption_detail) + ")");
        return;
    }
    fail(std::string("scaled_dot_product_attention accepted an invalid call (corruption ") + std::to_string(int(c.corruption)) +
         "/" + std::to_string(c.corruption_detail) + ", " + (backend == mha::Backend::simd ? "simd" : "scalar") + ")");
}

void print_case(const Case& c) {
    auto lay = [](const Layout& l) {
        return std::string(kOrderNames[l.order]) + "+" + std::to_string(l.pad[0]) + "/" + std::to_string(l.pad[1]) + "/" +
               std::to_string(l.pad[2]) + (l.repeat == 1 ? "(b0)" : l.repeat == 2 ? "(h0)" : "");
    };
    char scale[32] = "default";
    if (c.scale) std::snprintf(scale, sizeof scale, "%g", double(*c.scale));
    std::fprintf(stderr,
                 "case: isa %s B %zu H %zu Hkv %zu Lq %zu Lk %zu d %zu layouts q %s k %s v %s out %s packed_qkv %d v_is_k %d "
                 "kpm %d am %d/rank %d causal %d %s scale %s poison %d threads %d/%d workspace %d corruption %d/%d\n",
                 std::string(mha::isa_name(mha::active_isa())).c_str(), c.B, c.H, c.Hkv, c.Lq, c.Lk, c.d, lay(c.lay[0]).c_str(),
                 lay(c.lay[1]).c_str(), lay(c.lay[2]).c_str(), lay(c.lay[3]).c_str(), c.packed_qkv, c.v_is_k,
                 int(c.kpm.type), int(c.am.type), c.am.rank, c.causal,
                 c.alignment == mha::CausalAlignment::top_left ? "top_left" : "bottom_right", scale, c.poison, c.threads_a,
                 c.threads_b, c.workspace_b, int(c.corruption), c.corruption_detail);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider provider(data, size);
    const Case c = decode(provider);
    if (std::getenv("MHA_FUZZ_VERBOSE")) print_case(c);
    if (c.corruption != Corruption::none) {
        if (c.corruption != Corruption::workspace_too_small) check_invalid(c, mha::Backend::scalar);
        check_invalid(c, mha::Backend::simd);
        return 0;
    }
    // The oracle reads the inputs through the views of a call (repeats and poisoned rows included).
    fuzz_oracle::SdpaExpected ex;
    {
        Call views(c, mha::Backend::scalar, mha::Impl::automatic, 1, false);
        const double scale = c.scale ? double(*c.scale) : 1.0 / std::sqrt(double(c.d));
        ex = fuzz_oracle::sdpa_double(views.in, scale, c.causal, c.alignment);
    }
    check_valid(c, ex, mha::Backend::scalar, mha::Impl::automatic, c.threads_a, false, nullptr);
    std::vector<float> bits_a, bits_b;
    check_valid(c, ex, mha::Backend::simd, mha::Impl::automatic, c.threads_a, false, &bits_a);
    check_valid(c, ex, mha::Backend::simd, mha::Impl::automatic, c.threads_b, c.workspace_b, &bits_b);
    if (std::memcmp(bits_a.data(), bits_b.data(), bits_a.size() * sizeof(float)) != 0)
        fail("simd results differ between " + std::to_string(c.threads_a) + " and " + std::to_string(c.threads_b) + " threads" +
             (c.workspace_b ? " (the second in a caller's workspace)" : ""));
    check_valid(c, ex, mha::Backend::simd, mha::Impl::materialized, c.threads_b, false, nullptr);
    check_valid(c, ex, mha::Backend::simd, mha::Impl::fused, c.threads_a, false, nullptr);
    return 0;
}
