// Decoder-model attention (issue 12) against PyTorch: the float64 results tools/make_fixtures.py saved in
// tests/data/decoder/<case>/ (tests/data/README.md): a Llama-style layer written in the script (separate
// projections, GQA through repeat_interleave, RoPE in both pairings, offsets up to 2^20 − 3, per-sequence
// starts, biases or none, H·d != E), nn.MultiheadAttention with kdim/vdim != E, and
// F.scaled_dot_product_attention for the core (GQA, causal top-left, bottom-right with Lq < Lk, a given
// scale, boolean and additive masks).
//
//   DecoderFixtures     the scalar reference itself: reference::multihead_attention with a reference::Layer
//                       built from the files, reference::attention_core on q/k/v.
//   DecoderFixturesApi  the public API: MultiheadAttention(weights, AttentionConfig)::forward (biases as
//                       in_proj_bias and as q/k/v_proj_bias) and mha::scaled_dot_product_attention (output
//                       as [B, H, Lq, d] and as [B, Lq, H·d]); Backend::scalar, and Backend::simd on every
//                       ISA the CPU has with Impl automatic, materialized and fused.
//
// Tolerance: the inputs are the float32 values PyTorch computed on in float64, so the only error is the
// library's float32 arithmetic. The test recomputes the case in double from the saved inputs, carrying a
// first-order bound e(·) on the error of a float computation of each value (u = 2^-24; a float dot product
// of length n is off by at most n·u·Σ|a||b|), element by element:
//   projections  y = x·Wᵀ + b:        e_y = (n + 2)·u·(Σ|x||w| + |b|)          (n = E, kdim or vdim)
//   RoPE         (x1, x2) rotated:    e_y1 = e_y2 = e_x1 + e_x2 + 8·u·(|x1| + |x2|)   (cos/sin rounded to
//                                     float, two products, one sum; dims past r keep their error)
//   scores       s = scale·Σ_d q·k:   e_s = scale·Σ(e_q|k| + |q|e_k) + (d + 3)·u·scale·Σ|q||k|
//                                           + 4·u·(scale·Σ|q||k| + |mask|)  (the float scale, the masks'
//                                           adds, the softmax's max subtraction)
//   softmax      |Δp_j| ≤ p_j·r_p,    r_p = 2·max_j e_s + (Lk + 4)·u          (over the row's unmasked keys)
//   context      c = Σ_j p_j·v_j:     e_c = Σ_j p_j·(r_p·|v_j| + e_v_j) + Lk·u·Σ_j p_j|v_j|
//   output       o = C·Woᵀ + bo:      e_o = Σ e_c|w| + (H·d + 2)·u·(Σ|c||w| + |bo|)
// The tolerance is 2·e (the factor covers second-order terms) plus u·|expected| (the float64 expected
// values are read as float); weights: 2·r_p·p per head, 2·(mean_h r_p·p_h + (H + 1)·u·mean_h p_h) averaged. For the core the
// inputs are exact (e_q = e_k = e_v = 0) and the output is the context. Every case also checks that the
// bound stays far below the values (< 1e-3 of max|expected|), or it would prove nothing; measured errors
// and bounds are recorded as test properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <mha/mha.hpp>
#include "compare_util.hpp"
#include "isa_test_util.hpp"
#include "npy.hpp"
#include "reference/reference.hpp"

namespace {

namespace fs = std::filesystem;
using mha::Backend;
using mha::CausalAlignment;
using nlohmann::json;

constexpr double kU = 0x1p-24;
const fs::path kDecoderDir = fs::path(MHA_TEST_DATA_DIR) / "decoder";

const std::vector<std::string> kExpectedCases = {
    "llama_gqa_half", "llama_mqa_interleaved_offset", "llama_bias_partial_rope", "llama_positions",
    "mha_kdim_vdim_bottom_right", "mha_kdim_vdim_key_padding", "sdpa_gqa_causal", "sdpa_mqa_bottom_right_scale",
    "sdpa_bool_attn_mask", "sdpa_float_key_padding_scale"};

std::vector<std::string> case_names() {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(kDecoderDir, ec))
        if (entry.is_directory() && fs::exists(entry.path() / "args.json")) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(DecoderFixtures, AllCasesPresent) {
    const auto names = case_names();
    EXPECT_EQ(names.size(), kExpectedCases.size()) << kDecoderDir << " should hold " << kExpectedCases.size() << " cases";
    for (const auto& name : kExpectedCases)
        EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name << " is missing";
}

// One case folder: every .npy by file stem ("out_proj.weight" for out_proj.weight.npy) and args.json.
struct Case {
    std::string name;
    json args;
    std::map<std::string, mha::npy::Array> files;
    bool has(const std::string& f) const { return files.count(f) != 0; }
    const mha::npy::Array& at(const std::string& f) const { return files.at(f); }
    const float* data(const std::string& f) const { return has(f) ? at(f).values.data() : nullptr; }
    bool is_layer() const { return args.at("kind") == "layer"; }
};

Case load_case(const std::string& name) {
    Case c;
    c.name = name;
    const fs::path dir = kDecoderDir / name;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".npy") c.files[e.path().stem().string()] = mha::npy::load(e.path().string());
    std::ifstream f(dir / "args.json");
    c.args = json::parse(f);
    return c;
}

mha::MaskView mask_view(const mha::npy::Array& a) {
    const bool boolean = a.dtype == mha::npy::DType::boolean || a.dtype == mha::npy::DType::uint8;
    mha::MaskView m;
    m.type = boolean ? mha::MaskType::boolean : mha::MaskType::additive;
    m.bools = boolean ? a.bytes.data() : nullptr;
    m.values = boolean ? nullptr : a.values.data();
    m.rank = int(a.shape.size());
    for (std::size_t i = 0; i < a.shape.size() && i < 3; ++i) m.shape[i] = a.shape[i];
    return m;
}

double max_abs(const std::vector<float>& v) { return mha_test::max_abs(v); }

// The causal flags of args.json ("causal": top-left, "causal_bottom_right"; never both).
struct Causal {
    bool on = false;
    CausalAlignment alignment = CausalAlignment::top_left;
};
Causal causal_of(const json& args) {
    Causal c;
    const bool top_left = args.at("causal").get<bool>(), bottom_right = args.at("causal_bottom_right").get<bool>();
    EXPECT_FALSE(top_left && bottom_right) << "causal and causal_bottom_right both set";
    c.on = top_left || bottom_right;
    c.alignment = bottom_right ? CausalAlignment::bottom_right : CausalAlignment::top_left;
    return c;
}

// A value computed in double and the bound on the error of its float computation (the header's e).
struct Bounded {
    std::vector<double> x, e;
    explicit Bounded(std::size_t n = 0) : x(n, 0.0), e(n, 0.0) {}
};

// y = x·Wᵀ + b for x [rows, n] (floats), W [out, n], b [out] or null.
Bounded linear_bounded(const float* x, std::size_t rows, std::size_t n, const float* w, std::size_t out, const float* b) {
    Bounded y(rows * out);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < out; ++j) {
            double sum = b ? double(b[j]) : 0.0, mag = b ? std::abs(double(b[j])) : 0.0;
            for (std::size_t e = 0; e < n; ++e) {
                sum += double(x[i * n + e]) * double(w[j * n + e]);
                mag += std::abs(double(x[i * n + e]) * double(w[j * n + e]));
            }
            y.x[i * out + j] = sum;
            y.e[i * out + j] = (double(n) + 2) * kU * mag;
        }
    return y;
}

// RoPE of design.md §5 in double on each d-wide head of row i (of `heads`) at position start + i.
void rope_bounded(Bounded& y, std::size_t rows, std::size_t heads, std::size_t d, const mha::RopeConfig& rope,
                  std::size_t start) {
    const std::size_t r = rope.dims;
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t k = 0; k < r / 2; ++k) {
                const std::size_t base = (i * heads + h) * d;
                const std::size_t i1 = base + (rope.style == mha::RopeStyle::half ? k : 2 * k);
                const std::size_t i2 = base + (rope.style == mha::RopeStyle::half ? k + r / 2 : 2 * k + 1);
                const double angle = double(start + i) * std::pow(double(rope.theta), -2.0 * double(k) / double(r));
                const double c = std::cos(angle), sn = std::sin(angle), x1 = y.x[i1], x2 = y.x[i2];
                const double e = y.e[i1] + y.e[i2] + 8 * kU * (std::abs(x1) + std::abs(x2));
                y.x[i1] = x1 * c - x2 * sn, y.x[i2] = x2 * c + x1 * sn;
                y.e[i1] = y.e[i2] = e;
            }
}

// The additive mask of (b, h, i, j) as the library documents it (-inf where masked).
struct Masks {
    const mha::MaskView *kpm, *am;
    std::size_t H, Lq, Lk;
    bool causal;
    CausalAlignment alignment;
    double at(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
        double m = 0.0;
        auto add = [&](const mha::MaskView& v, std::size_t flat) {
            if (v.type == mha::MaskType::boolean) m += v.bools[flat] ? -INFINITY : 0.0;
            else m += double(v.values[flat]);
        };
        if (kpm->present()) add(*kpm, b * Lk + j);
        if (am->present()) add(*am, (am->rank == 3 ? (b * H + h) * Lq * Lk : 0) + i * Lk + j);
        const long long last = alignment == CausalAlignment::top_left ? (long long)i : (long long)i + (long long)Lk - (long long)Lq;
        if (causal && (long long)j > last) m = -INFINITY;
        return m;
    }
};

// One head in double with the bound: q [Lq, d] and k, v [Lk, d] (element (i, c) at data[i·stride + c]).
// Writes the context and its bound into ctx (row stride cs), its magnitude Σ p|v| into ctx_mag, the
// probabilities into p [Lq, Lk] and each row's r_p into r_p [Lq].
struct HeadIn {
    const Bounded* m;
    std::size_t offset, stride;
    double x(std::size_t i, std::size_t c) const { return m->x[offset + i * stride + c]; }
    double e(std::size_t i, std::size_t c) const { return m->e[offset + i * stride + c]; }
};
void head_bounded(HeadIn q, HeadIn k, HeadIn v, std::size_t Lq, std::size_t Lk, std::size_t d, double scale,
                  const std::function<double(std::size_t, std::size_t)>& mask, Bounded& ctx, std::vector<double>& ctx_mag,
                  std::size_t ctx_offset, std::size_t cs, double* p, double* r_p) {
    for (std::size_t i = 0; i < Lq; ++i) {
        std::vector<double> z(Lk), ez(Lk);
        double zmax = -INFINITY;
        for (std::size_t j = 0; j < Lk; ++j) {
            double dot = 0.0, mag = 0.0, err = 0.0;
            for (std::size_t c = 0; c < d; ++c) {
                dot += q.x(i, c) * k.x(j, c);
                mag += std::abs(q.x(i, c) * k.x(j, c));
                err += q.e(i, c) * std::abs(k.x(j, c)) + std::abs(q.x(i, c)) * k.e(j, c);
            }
            const double m = mask(i, j);
            z[j] = scale * dot + m;
            if (m == -INFINITY) z[j] = -INFINITY;
            ez[j] = scale * err + (double(d) + 3) * kU * scale * mag + 4 * kU * (scale * mag + (std::isfinite(m) ? std::abs(m) : 0.0));
            zmax = std::max(zmax, z[j]);
        }
        double sum = 0.0, es = 0.0;
        for (std::size_t j = 0; j < Lk; ++j) {
            p[i * Lk + j] = z[j] == -INFINITY ? 0.0 : std::exp(z[j] - zmax);
            sum += p[i * Lk + j];
            if (z[j] != -INFINITY) es = std::max(es, ez[j]);
        }
        r_p[i] = 2 * es + (double(Lk) + 4) * kU;
        for (std::size_t j = 0; j < Lk; ++j) p[i * Lk + j] = sum > 0 ? p[i * Lk + j] / sum : 0.0;
        for (std::size_t c = 0; c < d; ++c) {
            double out = 0.0, mag = 0.0, err = 0.0;
            for (std::size_t j = 0; j < Lk; ++j) {
                out += p[i * Lk + j] * v.x(j, c);
                mag += p[i * Lk + j] * std::abs(v.x(j, c));
                err += p[i * Lk + j] * (r_p[i] * std::abs(v.x(j, c)) + v.e(j, c));
            }
            ctx.x[ctx_offset + i * cs + c] = out;
            ctx.e[ctx_offset + i * cs + c] = err + double(Lk) * kU * mag;
            ctx_mag[ctx_offset + i * cs + c] = mag;
        }
    }
}

// Absolute tolerances, element by element: 2·e + u·|expected|.
struct Tolerance {
    std::vector<double> output, weights;
};

std::vector<double> tolerance_of(const std::vector<double>& e, const std::vector<float>& expected) {
    std::vector<double> t(e.size());
    for (std::size_t i = 0; i < e.size(); ++i) t[i] = 2 * e[i] + kU * std::abs(double(expected.at(i)));
    return t;
}

// --- Layers -----------------------------------------------------------------------------------------

// A layer case resolved: shapes, weights (absent biases as zeros), inputs and options.
struct LayerCase {
    std::size_t B = 0, Lq = 0, Lk = 0, E = 0, H = 0, Hkv = 0, d = 0, kdim = 0, vdim = 0;
    std::optional<mha::RopeConfig> rope;
    bool has_bias = false, has_out_bias = false;
    std::vector<float> bias_qkv, bias_o;  // zeros when the files are absent
    std::vector<std::size_t> positions;   // empty: position_offset
    mha::AttentionInputs in;
    mha::ForwardOptions opt;
    const mha::npy::Array *expected = nullptr, *expected_w = nullptr;
    const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    Tolerance tol;
};

std::size_t weight_count(const LayerCase& L) {
    return L.opt.need_weights == mha::NeedWeights::none       ? 0
           : L.opt.need_weights == mha::NeedWeights::averaged ? L.B * L.Lq * L.Lk
                                                              : L.B * L.H * L.Lq * L.Lk;
}

LayerCase resolve_layer(const Case& c) {
    LayerCase L;
    const json& a = c.args;
    const auto& q = c.at("query");
    EXPECT_EQ(q.shape.size(), 3u);
    L.B = q.shape[0], L.Lq = q.shape[1], L.E = q.shape[2];
    L.H = a.at("heads").get<std::size_t>(), L.Hkv = a.at("kv_heads").get<std::size_t>(), L.d = a.at("head_dim").get<std::size_t>();
    const auto& wq = c.at("q_proj_weight");
    const auto& wk = c.at("k_proj_weight");
    const auto& wv = c.at("v_proj_weight");
    const auto& wo = c.at("out_proj.weight");
    L.kdim = wk.shape.at(1), L.vdim = wv.shape.at(1);
    EXPECT_EQ(wq.shape, (std::vector<std::size_t>{L.H * L.d, L.E}));
    EXPECT_EQ(wk.shape, (std::vector<std::size_t>{L.Hkv * L.d, L.kdim}));
    EXPECT_EQ(wv.shape, (std::vector<std::size_t>{L.Hkv * L.d, L.vdim}));
    EXPECT_EQ(wo.shape, (std::vector<std::size_t>{L.E, L.H * L.d}));
    L.wq = wq.values.data(), L.wk = wk.values.data(), L.wv = wv.values.data(), L.wo = wo.values.data();
    const std::size_t qkv = L.H * L.d + 2 * L.Hkv * L.d;
    L.has_bias = c.has("in_proj_bias"), L.has_out_bias = c.has("out_proj.bias");
    L.bias_qkv = L.has_bias ? c.at("in_proj_bias").values : std::vector<float>(qkv, 0.0f);
    L.bias_o = L.has_out_bias ? c.at("out_proj.bias").values : std::vector<float>(L.E, 0.0f);
    EXPECT_EQ(L.bias_qkv.size(), qkv);
    EXPECT_EQ(L.bias_o.size(), L.E);
    if (!a.at("rope_theta").is_null()) {
        mha::RopeConfig r;
        r.theta = a.at("rope_theta").get<float>();
        r.dims = a.at("rope_dims").get<std::size_t>();
        r.style = a.at("rope_style") == "half" ? mha::RopeStyle::half : mha::RopeStyle::interleaved;
        EXPECT_TRUE(a.at("rope_style") == "half" || a.at("rope_style") == "interleaved");
        L.rope = r;
    }

    L.in.query = mha::ConstBatch(q.values.data(), L.B, L.Lq, L.E);
    const auto& key = c.has("key") ? c.at("key") : q;
    const auto& value = c.has("value") ? c.at("value") : key;
    L.Lk = key.shape.at(1);
    EXPECT_EQ(key.shape, (std::vector<std::size_t>{L.B, L.Lk, L.kdim}));
    EXPECT_EQ(value.shape, (std::vector<std::size_t>{L.B, L.Lk, L.vdim}));
    L.in.key = mha::ConstBatch(key.values.data(), L.B, L.Lk, L.kdim);
    L.in.value = mha::ConstBatch(value.values.data(), L.B, L.Lk, L.vdim);
    if (c.has("key_padding_mask")) L.in.key_padding_mask = mask_view(c.at("key_padding_mask"));
    if (c.has("attn_mask")) L.in.attn_mask = mask_view(c.at("attn_mask"));

    const Causal causal = causal_of(a);
    L.opt.causal = causal.on;
    L.opt.causal_alignment = causal.alignment;
    L.opt.position_offset = a.at("position_offset").get<std::size_t>();
    if (!a.at("positions").is_null()) {
        L.positions = a.at("positions").get<std::vector<std::size_t>>();
        EXPECT_EQ(L.positions.size(), L.B);
    }
    const std::string need = a.at("need_weights").get<std::string>();
    L.opt.need_weights = need == "averaged" ? mha::NeedWeights::averaged
                         : need == "per_head" ? mha::NeedWeights::per_head
                                              : mha::NeedWeights::none;
    EXPECT_TRUE(a.at("norm_eps").is_null());
    L.expected = &c.at("expected_output");
    EXPECT_EQ(L.expected->shape, (std::vector<std::size_t>{L.B, L.Lq, L.E}));
    if (L.opt.need_weights != mha::NeedWeights::none) L.expected_w = &c.at("expected_attn_weights");

    // The bound of the header, from the layer recomputed in double.
    const Masks masks{&L.in.key_padding_mask, &L.in.attn_mask, L.H, L.Lq, L.Lk, L.opt.causal, L.opt.causal_alignment};
    const std::size_t Hd = L.H * L.d, Kd = L.Hkv * L.d, G = L.H / L.Hkv, Lq = L.Lq, Lk = L.Lk;
    std::vector<double> e_out(L.B * Lq * L.E), e_w(weight_count(L));
    for (std::size_t b = 0; b < L.B; ++b) {
        Bounded Q = linear_bounded(q.values.data() + b * Lq * L.E, Lq, L.E, L.wq, Hd, L.bias_qkv.data());
        Bounded K = linear_bounded(key.values.data() + b * Lk * L.kdim, Lk, L.kdim, L.wk, Kd, L.bias_qkv.data() + Hd);
        const Bounded V = linear_bounded(value.values.data() + b * Lk * L.vdim, Lk, L.vdim, L.wv, Kd, L.bias_qkv.data() + Hd + Kd);
        if (L.rope) {
            const std::size_t start = L.positions.empty() ? L.opt.position_offset : L.positions[b];
            rope_bounded(Q, Lq, L.H, L.d, *L.rope, start);
            rope_bounded(K, Lk, L.Hkv, L.d, *L.rope, start);
        }
        Bounded C(Lq * Hd);
        std::vector<double> c_mag(Lq * Hd), p(L.H * Lq * Lk), r_p(L.H * Lq);
        for (std::size_t h = 0; h < L.H; ++h)
            head_bounded({&Q, h * L.d, Hd}, {&K, h / G * L.d, Kd}, {&V, h / G * L.d, Kd}, Lq, Lk, L.d,
                         1.0 / std::sqrt(double(L.d)), [&](std::size_t i, std::size_t j) { return masks.at(b, h, i, j); },
                         C, c_mag, h * L.d, Hd, &p[h * Lq * Lk], &r_p[h * Lq]);
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t e = 0; e < L.E; ++e) {
                double err = 0.0, mag = std::abs(double(L.bias_o[e]));
                for (std::size_t c = 0; c < Hd; ++c) {
                    const double w = std::abs(double(L.wo[e * Hd + c]));
                    err += C.e[i * Hd + c] * w;
                    mag += c_mag[i * Hd + c] * w;
                }
                e_out[(b * Lq + i) * L.E + e] = err + (double(Hd) + 2) * kU * mag;
            }
        for (std::size_t i = 0; i < Lq; ++i)
            for (std::size_t j = 0; j < Lk; ++j) {
                double mean_err = 0.0, mean_p = 0.0;
                for (std::size_t h = 0; h < L.H; ++h) {
                    const double err = r_p[h * Lq + i] * p[(h * Lq + i) * Lk + j];
                    if (L.opt.need_weights == mha::NeedWeights::per_head) e_w[((b * L.H + h) * Lq + i) * Lk + j] = err;
                    mean_err += err / double(L.H), mean_p += p[(h * Lq + i) * Lk + j] / double(L.H);
                }
                if (L.opt.need_weights == mha::NeedWeights::averaged)
                    e_w[(b * Lq + i) * Lk + j] = mean_err + (double(L.H) + 1) * kU * mean_p;
            }
    }
    L.tol.output = tolerance_of(e_out, L.expected->values);
    if (L.expected_w) L.tol.weights = tolerance_of(e_w, L.expected_w->values);
    return L;
}

std::string sci(double v) {
    std::ostringstream s;
    s << std::scientific << v;
    return s.str();
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// Output and weights against the expected files, within the bound; the bound must be far below the values.
void check_layer(const LayerCase& L, const std::vector<float>& output, const std::vector<float>& weights) {
    EXPECT_LT(max_of(L.tol.output), 1e-3 * max_abs(L.expected->values)) << "the bound is too loose to prove anything";
    EXPECT_TRUE(mha_test::all_within(output, L.expected->values, L.tol.output)) << "output";
    ::testing::Test::RecordProperty("output_max_error", sci(mha_test::max_abs_diff(output, L.expected->values)));
    ::testing::Test::RecordProperty("output_max_bound", sci(max_of(L.tol.output)));
    if (L.expected_w) {
        const bool averaged = L.opt.need_weights == mha::NeedWeights::averaged;
        const std::vector<std::size_t> shape = averaged ? std::vector<std::size_t>{L.B, L.Lq, L.Lk}
                                                        : std::vector<std::size_t>{L.B, L.H, L.Lq, L.Lk};
        EXPECT_EQ(L.expected_w->shape, shape);
        EXPECT_LT(max_of(L.tol.weights), 1e-3) << "the weights' bound is too loose";
        EXPECT_TRUE(mha_test::all_within(weights, L.expected_w->values, L.tol.weights)) << "attention weights";
        ::testing::Test::RecordProperty("weights_max_error", sci(mha_test::max_abs_diff(weights, L.expected_w->values)));
        ::testing::Test::RecordProperty("weights_max_bound", sci(max_of(L.tol.weights)));
    }
}

void run_reference_layer(const Case& c) {
    LayerCase L = resolve_layer(c);
    mha::reference::Layer layer;
    layer.E = L.E, layer.H = L.H, layer.Hkv = L.Hkv, layer.d = L.d, layer.kdim = L.kdim, layer.vdim = L.vdim;
    layer.rope = L.rope;
    layer.wq = L.wq, layer.wk = L.wk, layer.wv = L.wv, layer.wo = L.wo;
    layer.bq = L.bias_qkv.data(), layer.bk = layer.bq + L.H * L.d, layer.bv = layer.bk + L.Hkv * L.d;
    layer.bo = L.bias_o.data();
    if (!L.positions.empty()) L.opt.positions = L.positions.data();
    std::vector<float> output(L.B * L.Lq * L.E, NAN), weights(weight_count(L), NAN);
    mha::reference::multihead_attention(layer, L.in, {mha::Batch(output.data(), L.B, L.Lq, L.E), weights.data()}, L.opt);
    check_layer(L, output, weights);
}

// --- The core ---------------------------------------------------------------------------------------

struct SdpaCase {
    std::size_t B = 0, H = 0, Hkv = 0, Lq = 0, Lk = 0, d = 0;
    float scale = 0.0f;
    Causal causal;
    mha::SdpaInputs in;
    const mha::npy::Array* expected = nullptr;
    std::vector<double> tol;
};

SdpaCase resolve_sdpa(const Case& c) {
    SdpaCase s;
    const auto& q = c.at("q");
    const auto& k = c.at("k");
    const auto& v = c.at("v");
    EXPECT_EQ(q.shape.size(), 4u);
    s.B = q.shape[0], s.H = q.shape[1], s.Lq = q.shape[2], s.d = q.shape[3];
    s.Hkv = k.shape.at(1), s.Lk = k.shape.at(2);
    EXPECT_EQ(k.shape, (std::vector<std::size_t>{s.B, s.Hkv, s.Lk, s.d}));
    EXPECT_EQ(v.shape, k.shape);
    EXPECT_EQ(c.args.at("heads").get<std::size_t>(), s.H);
    EXPECT_EQ(c.args.at("kv_heads").get<std::size_t>(), s.Hkv);
    // The library's default scale is the float 1/√d; a given scale is the float of args' number.
    s.scale = c.args.at("scale").is_null() ? 1.0f / std::sqrt(float(s.d)) : c.args.at("scale").get<float>();
    s.causal = causal_of(c.args);
    s.in.query = mha::ConstHeads::bhld(q.values.data(), s.B, s.H, s.Lq, s.d);
    s.in.key = mha::ConstHeads::bhld(k.values.data(), s.B, s.Hkv, s.Lk, s.d);
    s.in.value = mha::ConstHeads::bhld(v.values.data(), s.B, s.Hkv, s.Lk, s.d);
    if (c.has("key_padding_mask")) s.in.key_padding_mask = mask_view(c.at("key_padding_mask"));
    if (c.has("attn_mask")) s.in.attn_mask = mask_view(c.at("attn_mask"));
    s.expected = &c.at("expected_output");
    EXPECT_EQ(s.expected->shape, q.shape);
    // The bound of the header (inputs exact), from the core recomputed in double at the exact scale.
    const double scale = c.args.at("scale").is_null() ? 1.0 / std::sqrt(double(s.d)) : c.args.at("scale").get<double>();
    const Masks masks{&s.in.key_padding_mask, &s.in.attn_mask, s.H, s.Lq, s.Lk, s.causal.on, s.causal.alignment};
    Bounded Q(q.size()), K(k.size()), V(v.size()), C(q.size());
    std::copy(q.values.begin(), q.values.end(), Q.x.begin());
    std::copy(k.values.begin(), k.values.end(), K.x.begin());
    std::copy(v.values.begin(), v.values.end(), V.x.begin());
    std::vector<double> c_mag(q.size()), p(s.Lq * s.Lk), r_p(s.Lq);
    for (std::size_t b = 0; b < s.B; ++b)
        for (std::size_t h = 0; h < s.H; ++h) {
            const std::size_t g = h / (s.H / s.Hkv), qo = (b * s.H + h) * s.Lq * s.d, ko = (b * s.Hkv + g) * s.Lk * s.d;
            head_bounded({&Q, qo, s.d}, {&K, ko, s.d}, {&V, ko, s.d}, s.Lq, s.Lk, s.d, scale,
                         [&](std::size_t i, std::size_t j) { return masks.at(b, h, i, j); }, C, c_mag, qo, s.d, p.data(),
                         r_p.data());
        }
    s.tol = tolerance_of(C.e, s.expected->values);
    return s;
}

void check_sdpa(const SdpaCase& s, const std::vector<float>& output) {
    EXPECT_LT(max_of(s.tol), 1e-3 * max_abs(s.expected->values)) << "the bound is too loose to prove anything";
    EXPECT_TRUE(mha_test::all_within(output, s.expected->values, s.tol)) << "output";
    ::testing::Test::RecordProperty("output_max_error", sci(mha_test::max_abs_diff(output, s.expected->values)));
    ::testing::Test::RecordProperty("output_max_bound", sci(max_of(s.tol)));
}

void run_reference_sdpa(const Case& c) {
    const SdpaCase s = resolve_sdpa(c);
    std::vector<float> output(s.B * s.H * s.Lq * s.d, NAN);
    mha::reference::attention_core(s.in, mha::Heads::bhld(output.data(), s.B, s.H, s.Lq, s.d), s.scale, s.causal.on,
                                   s.causal.alignment, nullptr);
    check_sdpa(s, output);
}

class DecoderFixture : public testing::TestWithParam<std::string> {};

TEST_P(DecoderFixture, ReferenceMatchesPyTorch) {
    const Case c = load_case(GetParam());
    if (c.is_layer()) run_reference_layer(c);
    else run_reference_sdpa(c);
}

INSTANTIATE_TEST_SUITE_P(DecoderFixtures, DecoderFixture, testing::ValuesIn(case_names()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DecoderFixture);  // AllCasesPresent reports missing folders

// --- The public API (both backends) -----------------------------------------------------------------

// How a layer's q/k/v biases reach AttentionWeights: stacked in in_proj_bias (as the tool passes the
// file) or split into q_proj_bias / k_proj_bias / v_proj_bias (Hugging Face's layout).
enum class BiasForm { stacked, split };

std::vector<float> api_layer_forward(const LayerCase& L, Backend backend, mha::Impl impl, bool want_weights, BiasForm form,
                                     std::vector<float>& weights) {
    std::vector<float> output(L.B * L.Lq * L.E, NAN);
    weights.assign(want_weights ? weight_count(L) : 0, NAN);
    mha::AttentionWeights w;
    w.q_proj_weight = L.wq, w.k_proj_weight = L.wk, w.v_proj_weight = L.wv, w.out_proj_weight = L.wo;
    if (L.has_bias && form == BiasForm::stacked) w.in_proj_bias = L.bias_qkv.data();
    if (L.has_bias && form == BiasForm::split) {
        w.q_proj_bias = L.bias_qkv.data();
        w.k_proj_bias = w.q_proj_bias + L.H * L.d;
        w.v_proj_bias = w.k_proj_bias + L.Hkv * L.d;
    }
    w.out_proj_bias = L.has_out_bias ? L.bias_o.data() : nullptr;
    mha::AttentionConfig config;
    config.embed_dim = L.E, config.num_heads = L.H, config.num_kv_heads = L.Hkv, config.head_dim = L.d;
    config.kdim = L.kdim, config.vdim = L.vdim;
    config.rope = L.rope;
    const mha::MultiheadAttention attention(w, config);
    EXPECT_EQ(attention.num_kv_heads(), L.Hkv);
    EXPECT_EQ(attention.head_dim(), L.d);
    EXPECT_EQ(attention.kdim(), L.kdim);
    EXPECT_EQ(attention.vdim(), L.vdim);
    mha::ForwardOptions opt = L.opt;
    opt.backend = backend;
    opt.impl = impl;
    if (!want_weights) opt.need_weights = mha::NeedWeights::none;
    if (!L.positions.empty()) opt.positions = L.positions.data();
    attention.forward(L.in, {mha::Batch(output.data(), L.B, L.Lq, L.E), weights.empty() ? nullptr : weights.data()},
                      opt);
    return output;
}

std::vector<float> api_sdpa(const SdpaCase& s, Backend backend, mha::Impl impl, bool blhd_output) {
    std::vector<float> output(s.B * s.H * s.Lq * s.d, NAN);
    mha::SdpaOptions opt;
    opt.backend = backend;
    opt.impl = impl;
    opt.causal = s.causal.on;
    opt.causal_alignment = s.causal.alignment;
    opt.scale = s.scale;
    if (!blhd_output) {
        mha::scaled_dot_product_attention(s.in, mha::Heads::bhld(output.data(), s.B, s.H, s.Lq, s.d), opt);
    } else {  // written as [B, Lq, H·d], compared as [B, H, Lq, d]
        std::vector<float> blhd(output.size(), NAN);
        mha::scaled_dot_product_attention(s.in, mha::Heads::blhd(blhd.data(), s.B, s.Lq, s.H, s.d), opt);
        for (std::size_t b = 0; b < s.B; ++b)
            for (std::size_t h = 0; h < s.H; ++h)
                for (std::size_t i = 0; i < s.Lq; ++i)
                    for (std::size_t e = 0; e < s.d; ++e)
                        output[((b * s.H + h) * s.Lq + i) * s.d + e] = blhd[((b * s.Lq + i) * s.H + h) * s.d + e];
    }
    return output;
}

struct ApiParam {
    std::string name;
    Backend backend;
};

void PrintTo(const ApiParam& p, std::ostream* os) {
    *os << p.name << (p.backend == Backend::scalar ? " (scalar)" : " (simd)");
}

class DecoderFixtureApi : public testing::TestWithParam<ApiParam> {};

// The simd backend runs on every ISA the CPU has (set_isa_cap) with each impl; the fused path computes no
// weights, so a case that asks for them runs fused for its output alone.
TEST_P(DecoderFixtureApi, MatchesPyTorch) {
    const Case c = load_case(GetParam().name);
    const Backend backend = GetParam().backend;
    const mha::Isa restore = mha::active_isa();
    std::vector<mha::Isa> isas{restore};
    std::vector<mha::Impl> impls{mha::Impl::automatic};
    if (backend == Backend::simd) {
        isas = mha_test::cpu_isas();
        impls = {mha::Impl::automatic, mha::Impl::materialized, mha::Impl::fused};
    }
    for (mha::Isa isa : isas) {
        mha::set_isa_cap(isa);
        for (mha::Impl impl : impls) {
            SCOPED_TRACE(std::string(mha::isa_name(isa)) + (impl == mha::Impl::automatic      ? " automatic"
                                                            : impl == mha::Impl::materialized ? " materialized"
                                                                                              : " fused"));
            if (c.is_layer()) {
                LayerCase L = resolve_layer(c);
                const bool want_weights = impl != mha::Impl::fused;
                if (!want_weights) L.expected_w = nullptr;
                for (BiasForm form : {BiasForm::stacked, BiasForm::split}) {
                    if (form == BiasForm::split && !L.has_bias) continue;
                    SCOPED_TRACE(form == BiasForm::stacked ? "in_proj_bias" : "q/k/v_proj_bias");
                    std::vector<float> weights;
                    const std::vector<float> output = api_layer_forward(L, backend, impl, want_weights, form, weights);
                    check_layer(L, output, weights);
                }
            } else {
                const SdpaCase s = resolve_sdpa(c);
                check_sdpa(s, api_sdpa(s, backend, impl, false));
                SCOPED_TRACE("output as [B, Lq, H·d]");
                check_sdpa(s, api_sdpa(s, backend, impl, true));
            }
        }
    }
    mha::set_isa_cap(restore);
}

std::vector<ApiParam> api_params() {
    std::vector<ApiParam> params;
    for (const auto& name : case_names())
        for (Backend b : {Backend::scalar, Backend::simd}) params.push_back({name, b});
    return params;
}

INSTANTIATE_TEST_SUITE_P(DecoderFixturesApi, DecoderFixtureApi, testing::ValuesIn(api_params()),
                         [](const testing::TestParamInfo<ApiParam>& info) {
                             return info.param.name + (info.param.backend == Backend::scalar ? "_scalar" : "_simd");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DecoderFixtureApi);

}  // namespace
