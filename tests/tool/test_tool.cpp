// Tests of the `mha` command-line tool: each runs the real binary (MHA_TOOL_PATH) in a fresh temporary
// folder and checks its exit code, stdout, stderr and the files it leaves.
//   run:   a case checked on paper (E = 2, H = 1, identity weights); the tool against the library called
//          here on the same arrays; every kind of bad input (exit != 0, exactly one line on stderr,
//          no file created); the PyTorch fixtures in tests/data when present.
//   bench: --json for each op is one valid JSON object with the required fields.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <mha/mha.hpp>
#include <nlohmann/json.hpp>

#include "../compare_util.hpp"
#include "npy.hpp"
#include "tool_process.hpp"

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;

using mha_tool_test::Result;
using mha_tool_test::read_text;
using mha_tool_test::run_tool;

// Bytes of a .npy file with any header (NumPy's layout: dict, space padding, '\n').
std::vector<std::uint8_t> npy_bytes(const std::string& descr, const std::string& shape_tuple, const void* data,
                                    std::size_t nbytes, bool fortran = false) {
    std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                         ", 'shape': " + shape_tuple + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    // Built as a string: g++ 12 gives a false -Warray-bounds on inserting into a small braced vector.
    std::string f("\x93NUMPY\x01\x00", 8);
    f += static_cast<char>(header.size() & 0xff);
    f += static_cast<char>(header.size() >> 8);
    f += header;
    if (nbytes) f.append(static_cast<const char*>(data), nbytes);
    return std::vector<std::uint8_t>(f.begin(), f.end());
}

std::string tuple_of(const Shape& s) {
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + (s.size() == 1 ? ",)" : ")");
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::size_t count_of(const Shape& s) {
    std::size_t n = 1;
    for (std::size_t d : s) n *= d;
    return n;
}

// Each writes the first count_of(shape) elements of v (tests keep batch 0 first, so an unbatched
// file is batch 0 of the batched data).
void write_f32(const fs::path& p, const std::vector<float>& v, const Shape& s) {
    ASSERT_GE(v.size(), count_of(s));
    mha::npy::save(p.string(), v.data(), s);
}
void write_f64(const fs::path& p, const std::vector<double>& v, const Shape& s) {
    ASSERT_GE(v.size(), count_of(s));
    write_bytes(p, npy_bytes("<f8", tuple_of(s), v.data(), count_of(s) * 8));
}
void write_bool(const fs::path& p, const std::vector<std::uint8_t>& v, const Shape& s, const char* descr = "|b1") {
    ASSERT_GE(v.size(), count_of(s));
    write_bytes(p, npy_bytes(descr, tuple_of(s), v.data(), count_of(s)));
}

std::vector<float> random_floats(std::size_t n, float amplitude, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-amplitude, amplitude);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

using mha_tool_test::listing;

// max_abs, max_abs_diff: tests/compare_util.hpp (NaN, ±inf or a size mismatch give NaN, which fails
// every EXPECT_LE; an all-NaN output used to pass here through std::max).
using mha_test::max_abs;
using mha_test::max_abs_diff;

class ToolTest : public mha_tool_test::ToolDirTest {
protected:

    // A valid self-attention case in dir_: query [B, L, E] (or [L, E] when B == 0), weights, biases.
    void write_valid_case(std::size_t B, std::size_t L, std::size_t E) {
        std::mt19937 rng(7);
        write_f32(dir_ / "query.npy", random_floats((B ? B : 1) * L * E, 1.0f, rng), B ? Shape{B, L, E} : Shape{L, E});
        write_f32(dir_ / "in_proj_weight.npy", random_floats(3 * E * E, 0.5f, rng), {3 * E, E});
        write_f32(dir_ / "in_proj_bias.npy", random_floats(3 * E, 0.5f, rng), {3 * E});
        write_f32(dir_ / "out_proj.weight.npy", random_floats(E * E, 0.5f, rng), {E, E});
        write_f32(dir_ / "out_proj.bias.npy", random_floats(E, 0.5f, rng), {E});
    }

    // The run must fail: exit code != 0, nothing on stdout, exactly one line on stderr containing
    // `needle`, and no file created in the input folder.
    void expect_failure(const std::vector<std::string>& args, const std::string& needle) { expect_failure_with(args, {needle}); }
    void expect_run_failure(const std::string& needle, std::vector<std::string> extra = {}) {
        std::vector<std::string> args{"run", "--npy", dir_.string(), "--heads", "2", "--need-weights"};
        args.insert(args.end(), extra.begin(), extra.end());
        expect_failure(args, needle);
    }

};

// --- mha run: results ----------------------------------------------------------------------------

// E = 2, H = 1, in_proj = [I; I; I], out_proj = I, query rows x0 = (1, 0), x1 = (0, 1), so Q = K = V = X.
// Scores X·Xᵀ/√2 = [[a, 0], [0, a]] with a = 1/√2; softmax rows: [p, q] and [q, p] with
// p = eᵃ/(eᵃ + 1), q = 1/(eᵃ + 1); output = P·V·I + bias = [[p, q], [q, p]] + bias.
// Causal: query 0 sees only key 0, so its row is [1, 0]. The float pipeline rounds about 8 times on
// O(1) values: tolerance 8·eps·1 ≈ 1e-6.
TEST_F(ToolTest, RunHandCheckedTinyCase) {
    write_f32(dir_ / "query.npy", {1, 0, 0, 1}, {2, 2});
    write_f32(dir_ / "in_proj_weight.npy", {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1}, {6, 2});
    write_f32(dir_ / "out_proj.weight.npy", {1, 0, 0, 1}, {2, 2});
    write_f32(dir_ / "out_proj.bias.npy", {0.5f, -0.5f}, {2});
    const double a = 1.0 / std::sqrt(2.0), p = std::exp(a) / (std::exp(a) + 1.0), q = 1.0 / (std::exp(a) + 1.0);
    const double tol = 8 * FLT_EPSILON;
    for (const char* backend : {"scalar", "simd"}) {
        for (bool causal : {false, true}) {
            SCOPED_TRACE(std::string(backend) + (causal ? " causal" : ""));
            std::vector<std::string> args{"run", "--npy", dir_.string(), "--heads", "1", "--need-weights", "--backend", backend};
            if (causal) args.push_back("--causal");
            const Result r = mha(args);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            EXPECT_EQ(r.err, "");
            const mha::npy::Array out = mha::npy::load((dir_ / "output.npy").string());
            const mha::npy::Array w = mha::npy::load((dir_ / "attn_weights.npy").string());
            EXPECT_EQ(out.dtype, mha::npy::DType::float32);
            EXPECT_EQ(out.shape, (Shape{2, 2}));  // unbatched in, unbatched out
            EXPECT_EQ(w.shape, (Shape{2, 2}));
            ASSERT_EQ(out.values.size(), 4u);
            ASSERT_EQ(w.values.size(), 4u);
            const std::vector<double> p0 = causal ? std::vector<double>{1, 0} : std::vector<double>{p, q};
            const std::vector<double> want_w = {p0[0], p0[1], q, p};
            const std::vector<double> want_out = {p0[0] + 0.5, p0[1] - 0.5, q + 0.5, p - 0.5};
            for (int i = 0; i < 4; ++i) {
                EXPECT_NEAR(w.values[i], want_w[i], tol) << i;
                EXPECT_NEAR(out.values[i], want_out[i], tol) << i;
            }
        }
    }
}

// The tool against mha::MultiheadAttention called here on the same arrays. Both masks, separate key
// and value (value stored as float64: the tool must convert it to the same floats), biases, norm block.
// Each backend: the tool must give bitwise what the library gives here for that backend (same code, same
// floats, same ISA; SIMD results do not depend on the thread count). The library itself is checked
// against the reference and PyTorch elsewhere.
struct LibraryCase {
    bool batched;
    bool bool_masks;      // true: |b1 key_padding_mask, |u1 [B·H, Lq, Lk] attn_mask; false: float masks [.., Lk], [Lq, Lk]
    bool norm;
    bool causal;
};

class ToolVsLibrary : public ToolTest, public ::testing::WithParamInterface<LibraryCase> {};

TEST_P(ToolVsLibrary, SameAsLibrary) {
    const LibraryCase c = GetParam();
    const std::size_t B = 2, Lq = 5, Lk = 7, E = 8, H = 2;
    std::mt19937 rng(42);
    const std::vector<float> query = random_floats(B * Lq * E, 1.0f, rng);
    const std::vector<float> key = random_floats(B * Lk * E, 1.0f, rng);
    std::vector<double> value64(B * Lk * E);
    for (double& x : value64) x = std::uniform_real_distribution<double>(-1, 1)(rng);
    std::vector<float> value(value64.begin(), value64.end());  // what the tool must read: nearest floats
    const std::vector<float> in_w = random_floats(3 * E * E, 0.5f, rng), in_b = random_floats(3 * E, 0.5f, rng);
    const std::vector<float> out_w = random_floats(E * E, 0.5f, rng), out_b = random_floats(E, 0.5f, rng);
    const std::vector<float> norm_w = random_floats(E, 1.0f, rng), norm_b = random_floats(E, 1.0f, rng);
    // Key padding: key 6 of batch 0 and key 0 of batch 1 (never a whole row, so no row is all masked).
    std::vector<std::uint8_t> kpm_bool(B * Lk, 0);
    kpm_bool[6] = 1, kpm_bool[Lk] = 1;
    std::vector<float> kpm_float(B * Lk);
    for (std::size_t i = 0; i < kpm_float.size(); ++i) kpm_float[i] = kpm_bool[i] ? -1e4f : 0.25f * float(i % 3);
    std::vector<std::uint8_t> am_bool(B * H * Lq * Lk);
    for (std::size_t i = 0; i < am_bool.size(); ++i) am_bool[i] = (i % 5 == 3);
    for (std::size_t bh = 0; bh < B * H; ++bh)
        for (std::size_t i = 0; i < Lq; ++i) am_bool[(bh * Lq + i) * Lk + 1] = 0;  // key 1 stays open in every row
    const std::vector<float> am_float = random_floats(Lq * Lk, 2.0f, rng);

    const std::size_t Bf = c.batched ? B : 1;  // unbatched: only batch 0
    const Shape qs = c.batched ? Shape{B, Lq, E} : Shape{Lq, E}, ks = c.batched ? Shape{B, Lk, E} : Shape{Lk, E};
    write_f32(dir_ / "query.npy", query, qs);
    write_f32(dir_ / "key.npy", key, ks);
    write_f64(dir_ / "value.npy", value64, ks);
    write_f32(dir_ / "in_proj_weight.npy", in_w, {3 * E, E});
    write_f32(dir_ / "in_proj_bias.npy", in_b, {3 * E});
    write_f32(dir_ / "out_proj.weight.npy", out_w, {E, E});
    write_f32(dir_ / "out_proj.bias.npy", out_b, {E});
    write_f32(dir_ / "norm.weight.npy", norm_w, {E});
    write_f32(dir_ / "norm.bias.npy", norm_b, {E});
    const Shape kpm_shape = c.batched ? Shape{B, Lk} : Shape{Lk};
    if (c.bool_masks) {
        write_bool(dir_ / "key_padding_mask.npy", kpm_bool, kpm_shape);
        write_bool(dir_ / "attn_mask.npy", am_bool, {Bf * H, Lq, Lk}, "|u1");
    } else {
        write_f32(dir_ / "key_padding_mask.npy", kpm_float, kpm_shape);
        write_f32(dir_ / "attn_mask.npy", am_float, {Lq, Lk});
    }

    // The library on the same arrays.
    mha::AttentionWeights w{in_w.data(), in_b.data(), out_w.data(), out_b.data(), norm_w.data(), norm_b.data()};
    const mha::MultiheadAttention attention(w, E, H);
    mha::AttentionInputs in;
    in.query = mha::ConstBatch(query.data(), Bf, Lq, E);
    in.key = mha::ConstBatch(key.data(), Bf, Lk, E);
    in.value = mha::ConstBatch(value.data(), Bf, Lk, E);
    in.key_padding_mask = c.bool_masks ? mha::MaskView::boolean(kpm_bool.data(), Bf, Lk) : mha::MaskView::additive(kpm_float.data(), Bf, Lk);
    in.attn_mask = c.bool_masks ? mha::MaskView::boolean(am_bool.data(), Bf * H, Lq, Lk) : mha::MaskView::additive(am_float.data(), Lq, Lk);
    mha::ForwardOptions fo;
    fo.causal = c.causal;
    fo.need_weights = mha::NeedWeights::averaged;
    if (c.norm) fo.norm_eps = 1e-5f;

    for (const char* backend : {"scalar", "simd"}) {
        std::vector<float> want_out(Bf * Lq * E), want_w(Bf * Lq * Lk);
        fo.backend = std::string(backend) == "scalar" ? mha::Backend::scalar : mha::Backend::simd;
        attention.forward(in, {mha::Batch(want_out.data(), Bf, Lq, E), want_w.data()}, fo);
        SCOPED_TRACE(backend);
        // Written away from the inputs with --out; attn_weights.npy lands next to it.
        const fs::path out_dir = base_ / (std::string("out_") + backend);
        fs::create_directories(out_dir);
        std::vector<std::string> args{"run", "--npy", dir_.string(), "--heads", std::to_string(H), "--need-weights",
                                      "--backend", backend, "--threads", "2", "--out", (out_dir / "result.npy").string()};
        if (c.causal) args.push_back("--causal");
        if (c.norm) args.insert(args.end(), {"--norm-eps", "1e-5"});
        const Result r = mha(args);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.err, "");
        EXPECT_FALSE(fs::exists(dir_ / "output.npy"));
        const mha::npy::Array got = mha::npy::load((out_dir / "result.npy").string());
        const mha::npy::Array got_w = mha::npy::load((out_dir / "attn_weights.npy").string());
        EXPECT_EQ(got.shape, qs);
        EXPECT_EQ(got_w.shape, c.batched ? (Shape{B, Lq, Lk}) : (Shape{Lq, Lk}));
        // The same code on the same floats (the SIMD backend is bitwise the same for any thread count):
        // identical results; only a wrong conversion, layout or option in the tool can differ.
        EXPECT_EQ(got.values, want_out);
        EXPECT_EQ(got_w.values, want_w);
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, ToolVsLibrary,
                         ::testing::Values(LibraryCase{true, true, false, false}, LibraryCase{true, false, true, true},
                                           LibraryCase{false, true, true, false}, LibraryCase{false, false, false, true}),
                         [](const ::testing::TestParamInfo<LibraryCase>& i) {
                             const LibraryCase& c = i.param;
                             return std::string(c.batched ? "batched" : "unbatched") + (c.bool_masks ? "_boolmasks" : "_floatmasks") +
                                    (c.norm ? "_norm" : "") + (c.causal ? "_causal" : "");
                         });

TEST_F(ToolTest, RunWithoutNeedWeightsWritesOnlyOutput) {
    write_valid_case(2, 3, 4);
    const Result r = mha({"run", "--npy", dir_.string(), "--heads", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(fs::exists(dir_ / "output.npy"));
    EXPECT_FALSE(fs::exists(dir_ / "attn_weights.npy"));
    EXPECT_EQ(mha::npy::load((dir_ / "output.npy").string()).shape, (Shape{2, 3, 4}));
}

// key.npy / value.npy with no keys ([B, 0, E]) are given, not absent (the library's null key means key = query):
// every query row is fully masked, so each output row is out_proj.bias (PyTorch's result), and the weights [B, Lq, 0].
// An output name that cannot be replaced (a folder) is refused before any output is renamed into place: the
// files of an earlier run stay as they were (a later failing rename used to delete the ones already replaced).
TEST_F(ToolTest, RunThatCannotWriteAnOutputKeepsTheEarlierOnes) {
    write_valid_case(2, 3, 4);
    const Result first = mha({"run", "--npy", dir_.string(), "--heads", "2"});
    ASSERT_EQ(first.exit_code, 0) << first.err;
    const mha::npy::Array before = mha::npy::load((dir_ / "output.npy").string());
    fs::create_directory(dir_ / "attn_weights.npy");
    write_f32(dir_ / "query.npy", std::vector<float>(2 * 3 * 4, 0.25f), {2, 3, 4});  // a run that would change output.npy
    const Result r = mha({"run", "--npy", dir_.string(), "--heads", "2", "--need-weights"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("attn_weights.npy: it exists and is not a regular file"), std::string::npos) << r.err;
    const mha::npy::Array after = mha::npy::load((dir_ / "output.npy").string());
    EXPECT_EQ(after.shape, before.shape);
    EXPECT_EQ(std::memcmp(after.values.data(), before.values.data(), before.values.size() * sizeof(float)), 0);
    for (const auto& entry : fs::directory_iterator(dir_))  // no temporary left behind
        EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
    fs::remove(dir_ / "attn_weights.npy");
}

TEST_F(ToolTest, RunWithZeroLengthKeysGivesTheBias) {
    write_valid_case(2, 3, 4);
    write_f32(dir_ / "key.npy", {}, {2, 0, 4});
    write_f32(dir_ / "value.npy", {}, {2, 0, 4});
    const std::vector<float> bias = mha::npy::load((dir_ / "out_proj.bias.npy").string()).values;
    for (const char* backend : {"scalar", "simd"}) {
        const Result r = mha({"run", "--npy", dir_.string(), "--heads", "2", "--need-weights", "--backend", backend});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const mha::npy::Array out = mha::npy::load((dir_ / "output.npy").string());
        EXPECT_EQ(out.shape, (Shape{2, 3, 4}));
        for (std::size_t i = 0; i < out.values.size(); ++i) EXPECT_EQ(out.values[i], bias[i % 4]) << backend << " " << i;
        EXPECT_EQ(mha::npy::load((dir_ / "attn_weights.npy").string()).shape, (Shape{2, 3, 0}));
    }
}

// --- mha run: bad input --------------------------------------------------------------------------

TEST_F(ToolTest, RejectsFortranOrder) {
    write_valid_case(1, 2, 4);
    const std::vector<float> q(8, 1.0f);
    write_bytes(dir_ / "query.npy", npy_bytes("<f4", "(1, 2, 4)", q.data(), 32, true));
    expect_run_failure("Fortran order");
}

TEST_F(ToolTest, RejectsBigEndian) {
    write_valid_case(1, 2, 4);
    const std::vector<float> q(8, 1.0f);
    write_bytes(dir_ / "query.npy", npy_bytes(">f4", "(1, 2, 4)", q.data(), 32));
    expect_run_failure("big-endian");
}

TEST_F(ToolTest, RejectsOtherDtype) {
    write_valid_case(1, 2, 4);
    const std::vector<std::int32_t> q(8, 1);
    write_bytes(dir_ / "query.npy", npy_bytes("<i4", "(1, 2, 4)", q.data(), 32));
    expect_run_failure("'<i4' is not supported");
}

TEST_F(ToolTest, RejectsBoolWhereFloatIsNeeded) {
    write_valid_case(1, 2, 4);
    write_bool(dir_ / "in_proj_bias.npy", std::vector<std::uint8_t>(12, 0), {12});
    expect_run_failure("in_proj_bias.npy has dtype bool");
}

TEST_F(ToolTest, RejectsWrongRank) {
    write_valid_case(1, 2, 4);
    write_f32(dir_ / "query.npy", std::vector<float>(8, 1.0f), {8});
    expect_run_failure("query.npy has shape [8] but must be [B, Lq, E] or [Lq, E]");
    write_f32(dir_ / "query.npy", std::vector<float>(8, 1.0f), {1, 1, 2, 4});
    expect_run_failure("query.npy has shape [1, 1, 2, 4]");
}

TEST_F(ToolTest, RejectsTruncatedFile) {
    write_valid_case(2, 3, 4);
    std::vector<std::uint8_t> bytes;
    {
        const std::string s = read_text(dir_ / "query.npy");
        bytes.assign(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2 + 70));  // cut inside the data
    }
    write_bytes(dir_ / "query.npy", bytes);
    expect_run_failure("query.npy: data is");
    write_bytes(dir_ / "query.npy", std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + 30));  // cut inside the header
    expect_run_failure("query.npy: header length");
}

TEST_F(ToolTest, RejectsMalformedHeader) {
    write_valid_case(1, 2, 4);
    const std::vector<float> w(4, 1.0f);
    write_bytes(dir_ / "out_proj.bias.npy", npy_bytes("<f4", "(4)", w.data(), 16));  // (4) is not a tuple
    expect_run_failure("out_proj.bias.npy: malformed header");
}

TEST_F(ToolTest, RejectsHeaderThatLiesAboutTheSize) {
    write_valid_case(1, 2, 4);
    const std::vector<float> q(8, 1.0f);
    write_bytes(dir_ / "query.npy", npy_bytes("<f4", "(1, 3, 4)", q.data(), 32));  // claims 12 floats, has 8
    expect_run_failure("query.npy: data is 32 bytes but shape [1, 3, 4] of float32 needs 48");
}

TEST_F(ToolTest, RejectsShapeWhoseElementCountOverflows) {
    write_valid_case(1, 2, 4);
    write_bytes(dir_ / "query.npy", npy_bytes("<f4", "(4294967296, 4294967296, 4)", nullptr, 0));
    expect_run_failure("overflows");
}

TEST_F(ToolTest, RejectsInProjWeightShape) {
    write_valid_case(1, 2, 4);
    write_f32(dir_ / "in_proj_weight.npy", std::vector<float>(48, 0.0f), {4, 12});
    expect_run_failure("in_proj_weight.npy has shape [4, 12] but must be [3E, E] (E = 4 from query.npy) = [12, 4]");
}

TEST_F(ToolTest, RejectsOutProjShapes) {
    write_valid_case(1, 2, 4);
    write_f32(dir_ / "out_proj.weight.npy", std::vector<float>(12, 0.0f), {4, 3});
    expect_run_failure("out_proj.weight.npy has shape [4, 3]");
    write_valid_case(1, 2, 4);
    write_f32(dir_ / "out_proj.bias.npy", std::vector<float>(5, 0.0f), {5});
    expect_run_failure("out_proj.bias.npy has shape [5]");
}

TEST_F(ToolTest, RejectsKeyThatDisagreesWithQuery) {
    write_valid_case(2, 3, 4);
    write_f32(dir_ / "key.npy", std::vector<float>(2 * 5 * 6, 0.0f), {2, 5, 6});  // E 6 != 4
    expect_run_failure("key.npy has shape [2, 5, 6] but query.npy has shape [2, 3, 4]");
    write_f32(dir_ / "key.npy", std::vector<float>(3 * 5 * 4, 0.0f), {3, 5, 4});  // B 3 != 2
    expect_run_failure("key.npy has shape [3, 5, 4]");
    write_f32(dir_ / "key.npy", std::vector<float>(5 * 4, 0.0f), {5, 4});  // unbatched key, batched query
    expect_run_failure("key.npy has shape [5, 4]");
}

TEST_F(ToolTest, RejectsValueThatDisagreesWithKey) {
    write_valid_case(2, 3, 4);
    write_f32(dir_ / "key.npy", std::vector<float>(2 * 5 * 4, 0.0f), {2, 5, 4});
    write_f32(dir_ / "value.npy", std::vector<float>(2 * 6 * 4, 0.0f), {2, 6, 4});
    expect_run_failure("value.npy has shape [2, 6, 4] but key.npy has shape [2, 5, 4]");
}

TEST_F(ToolTest, RejectsKeyPaddingMaskShape) {
    write_valid_case(2, 3, 4);
    write_bool(dir_ / "key_padding_mask.npy", std::vector<std::uint8_t>(4, 0), {2, 2});
    expect_run_failure("key_padding_mask.npy has shape [2, 2] but must be [B, Lk] = [2, 3]");
}

TEST_F(ToolTest, RejectsAttnMaskShape) {
    write_valid_case(2, 3, 4);
    write_f32(dir_ / "attn_mask.npy", std::vector<float>(3 * 4, 0.0f), {3, 4});
    expect_run_failure("attn_mask.npy has shape [3, 4] but must be [Lq, Lk] = [3, 3] or [B·H, Lq, Lk]");
    write_bool(dir_ / "attn_mask.npy", std::vector<std::uint8_t>(2 * 3 * 3, 0), {2, 3, 3});  // B·H = 4
    expect_run_failure("attn_mask.npy has shape [2, 3, 3]");
}

TEST_F(ToolTest, RejectsHeadsThatDoNotDivideEmbedDim) {  // found by the library (mha::invalid_argument)
    write_valid_case(1, 2, 4);
    expect_failure({"run", "--npy", dir_.string(), "--heads", "3"}, "embed_dim 4 is not a multiple of num_heads 3");
}

TEST_F(ToolTest, RejectsNegativeNormEps) {  // found by the library
    write_valid_case(1, 2, 4);
    expect_run_failure("norm_eps", {"--norm-eps", "-1"});
}

TEST_F(ToolTest, RejectsUnknownFlag) {
    write_valid_case(1, 2, 4);
    expect_run_failure("--frobnicate", {"--frobnicate"});
}

TEST_F(ToolTest, RejectsBadFlagValues) {
    write_valid_case(1, 2, 4);
    expect_run_failure("--backend", {"--backend", "avx"});
    expect_run_failure("--impl", {"--impl", "fast"});
    expect_run_failure("--threads", {"--threads", "-1"});
    expect_failure({"run", "--npy", dir_.string(), "--heads", "0"}, "--heads: must be a positive integer, got '0'");
    expect_failure({"run", "--npy", dir_.string()}, "--heads is required");
    expect_failure({"run", "--heads", "2"}, "--npy is required");
    expect_failure({}, "subcommand");
    expect_failure({"rnu", "--heads", "2"}, "unknown command 'rnu': expected run, sdpa or bench");
}

TEST_F(ToolTest, RejectsMissingRequiredFiles) {
    for (const char* file : {"query.npy", "in_proj_weight.npy", "out_proj.weight.npy"}) {
        SCOPED_TRACE(file);
        write_valid_case(1, 2, 4);
        fs::remove(dir_ / file);
        expect_run_failure(std::string(file) + ": required input is missing");
    }
}

TEST_F(ToolTest, RejectsNpyPathThatIsNotAFolder) {
    expect_failure({"run", "--npy", (dir_ / "nowhere").string(), "--heads", "1"}, "not a folder");
}

TEST_F(ToolTest, RejectsOutputInMissingFolder) {
    write_valid_case(1, 2, 4);
    expect_run_failure("does not exist", {"--out", (base_ / "no" / "such" / "out.npy").string()});
}

TEST_F(ToolTest, RejectsOutputNamedLikeTheWeights) {
    write_valid_case(1, 2, 4);
    expect_run_failure("would be overwritten", {"--out", (dir_ / "attn_weights.npy").string()});
}

// --- mha --version, --help -----------------------------------------------------------------------

TEST_F(ToolTest, Version) {
    const Result r = mha({"--version"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, std::string(mha::version()) + "\n");
    EXPECT_EQ(r.err, "");
}

TEST_F(ToolTest, Help) {
    const Result r = mha({"--help"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("run"), std::string::npos);
    EXPECT_NE(r.out.find("bench"), std::string::npos);
    const Result run_help = mha({"run", "--help"});
    EXPECT_EQ(run_help.exit_code, 0);
    EXPECT_NE(run_help.out.find("--need-weights"), std::string::npos);
}

// --- mha bench -----------------------------------------------------------------------------------

class BenchTest : public ToolTest {
protected:
    // Runs `mha bench --json ...`; its stdout must be exactly one line holding one JSON object.
    nlohmann::json bench(std::vector<std::string> args) {
        args.insert(args.begin(), {"bench", "--json", "--reps", "3"});
        const Result r = mha(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(r.err, "");
        EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
        nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
        EXPECT_TRUE(j.is_object()) << r.out;
        if (!j.is_object()) return nlohmann::json::object();
        // "isa": the kernels that ran: the fp32 level (avx512 for avx512_bf16, neon for neon_bf16) unless "dtype"
        // is bf16 on a level with bf16 kernels.
        const mha::Isa active = mha::active_isa();
        const mha::Isa ran = j.value("dtype", "") == "bf16" && mha::has_bf16_kernels(active) ? active : mha::fp32_kernel_isa(active);
        const std::string isa = std::string(mha::isa_name(ran));
        for (const char* field : {"op", "backend", "isa", "dtype", "threads", "reps", "ms_median", "ms_min"})
            EXPECT_TRUE(j.contains(field)) << field << " missing in " << r.out;
        EXPECT_EQ(j.value("reps", 0), 3);
        EXPECT_EQ(j.value("isa", ""), j.value("backend", "") == "scalar" ? std::string("scalar") : isa);
        EXPECT_TRUE(j["ms_min"].is_number() && j["ms_median"].is_number());
        EXPECT_GT(j.value("ms_min", 0.0), 0.0);
        EXPECT_LE(j.value("ms_min", 0.0), j.value("ms_median", 0.0));
        EXPECT_GE(j.value("threads", 0), 1);
        return j;
    }
};

TEST_F(BenchTest, AttentionJson) {
    const nlohmann::json j = bench({"--op", "attention", "--batch", "2", "--seq", "16", "--kv-seq", "8", "--embed", "32",
                                    "--heads", "4", "--threads", "1", "--impl", "materialized"});
    EXPECT_EQ(j.value("op", ""), "attention");
    EXPECT_EQ(j.value("backend", ""), "simd");
    EXPECT_EQ(j.value("impl", ""), "materialized");
    EXPECT_EQ(j.value("threads", 0), 1);
    EXPECT_EQ(j.value("batch", 0), 2);
    EXPECT_EQ(j.value("seq", 0), 16);
    EXPECT_EQ(j.value("kv_seq", 0), 8);
    EXPECT_EQ(j.value("embed", 0), 32);
    EXPECT_EQ(j.value("heads", 0), 4);
    ASSERT_TRUE(j.contains("gflops") && j["gflops"].is_number());
    // gflops is computed from the median time: 4·B·E²·(Lq+Lk) + 4·B·Lq·Lk·E flops.
    const double flops = 4.0 * 2 * 32 * 32 * (16 + 8) + 4.0 * 2 * 16 * 8 * 32;
    EXPECT_NEAR(j["gflops"].get<double>(), flops / (j["ms_median"].get<double>() * 1e-3) / 1e9, 1e-6 * j["gflops"].get<double>());
}

// A mixed serving step: 3 ragged decodes around 40 keys (20, 40, 60) and 2 chunks of 5 on 3 cached keys.
TEST_F(BenchTest, StepJson) {
    const nlohmann::json j = bench({"--op", "step", "--embed", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                                    "--decode-seqs", "3", "--kv-seq", "40", "--ragged", "--prefill-seqs", "2", "--prefill-len", "5",
                                    "--prefill-past", "3", "--block-size", "16", "--kv-type", "bf16", "--threads", "1"});
    EXPECT_EQ(j.value("op", ""), "step");
    EXPECT_EQ(j.value("tokens", 0), 13);
    // Blocks of 16 holding 21, 41, 61, 8 and 8 keys.
    EXPECT_EQ(j.value("kv_blocks", 0), 2 + 3 + 4 + 1 + 1);
    EXPECT_EQ(j.value("path", ""), "decode");  // 5 queries, G = 2: every sequence takes the decode path
    const double pairs = 21 + 41 + 61 + 2 * (4 + 5 + 6 + 7 + 8), keys = 21 + 41 + 61 + 2 * 8;
    const double flops = 2.0 * 13 * (2 * 32 * 32 + 2 * 32 * 16) + 4.0 * 32 * pairs;
    const double seconds = j["ms_median"].get<double>() * 1e-3;
    EXPECT_NEAR(j["gflops"].get<double>(), flops / seconds / 1e9, 1e-6 * j["gflops"].get<double>());
    const double bytes = j["weight_bytes"].get<double>() + 2.0 * 16 * keys * 2;
    EXPECT_NEAR(j["gbps"].get<double>(), bytes / seconds / 1e9, 1e-6 * j["gbps"].get<double>());
    const nlohmann::json core = bench({"--op", "step", "--embed", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
                                       "--decode-seqs", "2", "--kv-seq", "100", "--prefill-seqs", "1", "--prefill-len", "40",
                                       "--core-only", "--threads", "1"});
    EXPECT_EQ(core.value("path", ""), "mixed");  // 40 queries take the grouped path
    const double core_seconds = core["ms_median"].get<double>() * 1e-3;
    EXPECT_NEAR(core["gbps"].get<double>(), 2.0 * 16 * (101 + 101 + 40) * 4 / core_seconds / 1e9, 1e-6 * core["gbps"].get<double>());
}

TEST_F(BenchTest, AttentionDefaults) {
    const nlohmann::json j = bench({"--op", "attention", "--backend", "scalar", "--seq", "8"});
    EXPECT_EQ(j.value("backend", ""), "scalar");
    EXPECT_EQ(j.value("threads", 0), 1);  // the scalar reference runs on one thread
    EXPECT_EQ(j.value("impl", ""), "auto");
    EXPECT_EQ(j.value("batch", 0), 8);
    EXPECT_EQ(j.value("kv_seq", 0), 8);  // defaults to --seq
    EXPECT_EQ(j.value("embed", 0), 768);
    EXPECT_EQ(j.value("heads", 0), 12);
}

TEST_F(BenchTest, AttentionThreadsAreTheOnesUsed) {
    const std::vector<std::string> shape{"--op", "attention", "--batch", "1", "--seq", "4", "--embed", "8", "--heads", "2"};
    std::vector<std::string> all = shape, many = shape;
    all.insert(all.end(), {"--threads", "0"});
    many.insert(many.end(), {"--threads", "100000"});
    const int pool = bench(all).value("threads", 0);  // all cores: oneTBB's pool
    EXPECT_GE(pool, 1);
    EXPECT_LE(pool, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    EXPECT_EQ(bench(many).value("threads", 0), pool);  // more than the pool is clamped to it
}

// attention with grouped-query heads, a head dim of its own, key/value widths and RoPE: separate q/k/v weights.
// gflops: 2·B·(Lq·E·H·d + Lk·(kdim + vdim)·Hkv·d + Lq·H·d·E) + 4·B·H·Lq·Lk·d flops at the median time.
TEST_F(BenchTest, AttentionDecoderShapesJson) {
    const nlohmann::json j = bench({"--op", "attention", "--batch", "2", "--seq", "8", "--embed", "32", "--heads", "4",
                                    "--kv-heads", "2", "--head-dim", "16", "--rope-theta", "10000", "--threads", "1"});
    EXPECT_EQ(j.value("op", ""), "attention");
    EXPECT_EQ(j.value("kv_heads", 0), 2);
    EXPECT_EQ(j.value("head_dim", 0), 16);
    EXPECT_EQ(j.value("kdim", 0), 32);
    EXPECT_EQ(j.value("vdim", 0), 32);
    EXPECT_EQ(j.value("rope_theta", 0.0), 10000.0);
    ASSERT_TRUE(j.contains("gflops") && j["gflops"].is_number());
    EXPECT_GT(j["gflops"].get<double>(), 0.0);
    const double B = 2, L = 8, E = 32, H = 4, Hkv = 2, d = 16;
    const double flops = 2 * B * (L * E * H * d + L * (E + E) * Hkv * d + L * H * d * E) + 4 * B * H * L * L * d;
    EXPECT_NEAR(j["gflops"].get<double>(), flops / (j["ms_median"].get<double>() * 1e-3) / 1e9, 1e-6 * j["gflops"].get<double>());

    const nlohmann::json x = bench({"--op", "attention", "--batch", "1", "--seq", "4", "--kv-seq", "6", "--embed", "16",
                                    "--heads", "2", "--kdim", "12", "--vdim", "20", "--causal"});
    EXPECT_EQ(x.value("kdim", 0), 12);
    EXPECT_EQ(x.value("vdim", 0), 20);
    EXPECT_EQ(x.value("head_dim", 0), 8);  // E / H
    EXPECT_EQ(x.value("kv_heads", 0), 2);  // H
    EXPECT_TRUE(x.contains("rope_theta") && x["rope_theta"].is_null());
    const double f2 = 2 * 1 * (4 * 16 * 16 + 6 * (12 + 20) * 16 + 4 * 16 * 16) + 4 * 1 * 2 * 4 * 6 * 8;
    EXPECT_NEAR(x["gflops"].get<double>(), f2 / (x["ms_median"].get<double>() * 1e-3) / 1e9, 1e-6 * x["gflops"].get<double>());
}

// sdpa: gflops = 4·B·H·d·(pairs) / t with all Lq·Lk pairs, gbps = K and V read once: 2·B·Hkv·Lk·d·4 bytes / t.
TEST_F(BenchTest, SdpaJson) {
    const nlohmann::json j = bench({"--op", "sdpa", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                                    "--seq", "8", "--kv-seq", "12", "--threads", "1", "--impl", "fused"});
    EXPECT_EQ(j.value("op", ""), "sdpa");
    EXPECT_EQ(j.value("backend", ""), "simd");
    EXPECT_EQ(j.value("impl", ""), "fused");
    EXPECT_EQ(j.value("threads", 0), 1);
    EXPECT_EQ(j.value("batch", 0), 2);
    EXPECT_EQ(j.value("heads", 0), 4);
    EXPECT_EQ(j.value("kv_heads", 0), 2);
    EXPECT_EQ(j.value("head_dim", 0), 16);
    EXPECT_EQ(j.value("seq", 0), 8);
    EXPECT_EQ(j.value("kv_seq", 0), 12);
    EXPECT_EQ(j.value("causal", true), false);
    EXPECT_EQ(j.value("flops_counted", ""), "all pairs");
    ASSERT_TRUE(j.contains("gflops") && j["gflops"].is_number() && j.contains("gbps") && j["gbps"].is_number());
    EXPECT_GT(j["gflops"].get<double>(), 0.0);
    const double seconds = j["ms_median"].get<double>() * 1e-3;
    EXPECT_NEAR(j["gflops"].get<double>(), 4.0 * 2 * 4 * 8 * 12 * 16 / seconds / 1e9, 1e-6 * j["gflops"].get<double>());
    EXPECT_NEAR(j["gbps"].get<double>(), 2.0 * 2 * 2 * 12 * 16 * 4 / seconds / 1e9, 1e-6 * j["gbps"].get<double>());
}

// Causal sdpa counts only the visible pairs: Σ_i min(Lk, max(0, i + 1 + Lk − Lq)) (bottom-right aligned).
TEST_F(BenchTest, SdpaCausalCountsVisiblePairs) {
    struct Shape2 {
        int lq, lk;
        double pairs;
    };
    // Lq 4, Lk 6: 3 + 4 + 5 + 6; Lq 6, Lk 4: 0 + 0 + 1 + 2 + 3 + 4; Lq = Lk = 5: 1 + 2 + 3 + 4 + 5.
    for (const Shape2 s : {Shape2{4, 6, 18}, Shape2{6, 4, 10}, Shape2{5, 5, 15}}) {
        SCOPED_TRACE(std::to_string(s.lq) + "x" + std::to_string(s.lk));
        const nlohmann::json j = bench({"--op", "sdpa", "--batch", "1", "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
                                        "--seq", std::to_string(s.lq), "--kv-seq", std::to_string(s.lk), "--causal"});
        EXPECT_EQ(j.value("causal", false), true);
        EXPECT_EQ(j.value("flops_counted", ""), "visible pairs");
        ASSERT_TRUE(j.contains("gflops"));
        EXPECT_NEAR(j["gflops"].get<double>(), 4.0 * 1 * 2 * 8 * s.pairs / (j["ms_median"].get<double>() * 1e-3) / 1e9,
                    1e-6 * j["gflops"].get<double>());
    }
}

TEST_F(BenchTest, SdpaDefaults) {
    const nlohmann::json j = bench({"--op", "sdpa", "--backend", "scalar", "--seq", "4", "--batch", "1"});
    EXPECT_EQ(j.value("backend", ""), "scalar");
    EXPECT_EQ(j.value("threads", 0), 1);
    EXPECT_EQ(j.value("impl", ""), "auto");
    EXPECT_EQ(j.value("heads", 0), 12);
    EXPECT_EQ(j.value("kv_heads", 0), 12);  // --heads
    EXPECT_EQ(j.value("head_dim", 0), 64);
    EXPECT_EQ(j.value("kv_seq", 0), 4);  // --seq
}

// "path": the path the call takes (MultiheadAttention::path, sdpa_path), for the ops that run a layer or SDPA.
TEST_F(BenchTest, PathField) {
    const std::vector<std::string> layer{"--op", "attention", "--batch", "1", "--embed", "32", "--heads", "4", "--threads", "1"};
    auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
        a.insert(a.end(), more);
        return a;
    };
    EXPECT_EQ(bench(with(layer, {"--seq", "4"})).value("path", ""), "decode");                // Lq <= 16, G·Lq <= 128
    EXPECT_EQ(bench(with(layer, {"--seq", "20"})).value("path", ""), "materialized");         // G = 1, Lk < 1024
    EXPECT_EQ(bench(with(layer, {"--seq", "20", "--impl", "fused"})).value("path", ""), "grouped");
    EXPECT_EQ(bench(with(layer, {"--seq", "20", "--kv-heads", "2"})).value("path", ""), "grouped");  // G > 1
    EXPECT_EQ(bench(with(layer, {"--seq", "4", "--impl", "materialized"})).value("path", ""), "materialized");
    EXPECT_EQ(bench(with(layer, {"--seq", "4", "--backend", "scalar"})).value("path", ""), "scalar");
    const std::vector<std::string> sdpa{"--op", "sdpa", "--batch", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "8"};
    EXPECT_EQ(bench(with(sdpa, {"--seq", "8"})).value("path", ""), "decode");
    EXPECT_EQ(bench(with(sdpa, {"--seq", "20"})).value("path", ""), "grouped");
    EXPECT_EQ(bench(with(sdpa, {"--seq", "20", "--impl", "materialized"})).value("path", ""), "materialized");
    EXPECT_EQ(bench(with(sdpa, {"--seq", "8", "--backend", "scalar"})).value("path", ""), "scalar");
    const std::vector<std::string> decode{"--op", "decode", "--batch", "1", "--embed", "32", "--heads", "4"};
    EXPECT_EQ(bench(with(decode, {"--kv-seq", "1000"})).value("path", ""), "decode");
    EXPECT_EQ(bench(with(decode, {"--kv-seq", "1000", "--seq", "30"})).value("path", ""), "grouped");  // 1000 + 30 >= 1024 keys
    EXPECT_EQ(bench(with(decode, {"--kv-seq", "900", "--seq", "30"})).value("path", ""), "materialized");
    EXPECT_FALSE(bench({"--op", "gemm", "--m", "4", "--n", "4", "--k", "4"}).contains("path"));
}

TEST_F(BenchTest, SdpaReadableLine) {
    const Result r = mha({"bench", "--op", "sdpa", "--batch", "1", "--heads", "2", "--seq", "4", "--head-dim", "8", "--reps", "2"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("GFLOP/s"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
}

TEST_F(BenchTest, GemmJson) {
    const nlohmann::json j = bench({"--op", "gemm", "--m", "33", "--n", "17", "--k", "9"});
    EXPECT_EQ(j.value("op", ""), "gemm");
    EXPECT_EQ(j.value("threads", 0), 1);
    EXPECT_EQ(j.value("m", 0), 33);
    EXPECT_EQ(j.value("n", 0), 17);
    EXPECT_EQ(j.value("k", 0), 9);
    ASSERT_TRUE(j.contains("gflops"));
    EXPECT_NEAR(j["gflops"].get<double>(), 2.0 * 33 * 17 * 9 / (j["ms_median"].get<double>() * 1e-3) / 1e9,
                1e-6 * j["gflops"].get<double>());
    EXPECT_FALSE(j.contains("gbps"));
}

TEST_F(BenchTest, SoftmaxJson) {
    const nlohmann::json j = bench({"--op", "softmax", "--rows", "8", "--cols", "100", "--threads", "1"});
    EXPECT_EQ(j.value("op", ""), "softmax");
    EXPECT_EQ(j.value("rows", 0), 8);
    EXPECT_EQ(j.value("cols", 0), 100);
    ASSERT_TRUE(j.contains("gbps"));
    EXPECT_NEAR(j["gbps"].get<double>(), 2.0 * 8 * 100 * 4 / (j["ms_median"].get<double>() * 1e-3) / 1e9,
                1e-6 * j["gbps"].get<double>());
    EXPECT_FALSE(j.contains("gflops"));
}

TEST_F(BenchTest, LayernormJsonDefaults) {
    const nlohmann::json j = bench({"--op", "layernorm", "--backend", "scalar"});
    EXPECT_EQ(j.value("op", ""), "layernorm");
    EXPECT_EQ(j.value("rows", 0), 1024);
    EXPECT_EQ(j.value("cols", 0), 768);
    EXPECT_TRUE(j.contains("gbps"));
}

TEST_F(BenchTest, ReadableLine) {
    const Result r = mha({"bench", "--op", "softmax", "--rows", "4", "--cols", "8", "--reps", "2"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
}

TEST_F(BenchTest, Errors) {
    expect_failure({"bench", "--op", "gemm", "--threads", "2"}, "single-threaded");
    expect_failure({"bench", "--op", "softmax", "--threads", "0"}, "single-threaded");
    expect_failure({"bench", "--op", "softmax", "--m", "4"}, "--m does not apply to --op softmax");
    expect_failure({"bench", "--op", "gemm", "--causal"}, "--causal does not apply to --op gemm");
    expect_failure({"bench", "--op", "gemm", "--kv-heads", "2"}, "--kv-heads does not apply to --op gemm");
    expect_failure({"bench", "--op", "softmax", "--head-dim", "2"}, "--head-dim does not apply to --op softmax");
    expect_failure({"bench", "--op", "sdpa", "--embed", "8"}, "--embed does not apply to --op sdpa");
    // Counts that may be 0 are still not negative (size_t parsing would wrap -1 to 2^64 - 1).
    for (const char* flag : {"--decode-seqs", "--prefill-seqs", "--prefill-past"})
        expect_failure_with({"bench", "--op", "step", flag, "-1"}, {flag, "must be an integer >= 0, got '-1'"});
    // The attention core alone has no compute type and no rotary embedding: refused, not mislabelled.
    expect_failure({"bench", "--op", "step", "--embed", "16", "--heads", "2", "--kv-seq", "8", "--decode-seqs", "1", "--core-only",
                    "--dtype", "bf16"},
                   "--dtype bf16 does not apply with --core-only");
    expect_failure({"bench", "--op", "step", "--embed", "16", "--heads", "2", "--kv-seq", "8", "--decode-seqs", "1", "--core-only",
                    "--rope-theta", "10000"},
                   "--rope-theta does not apply with --core-only");
    expect_failure({"bench", "--op", "sdpa", "--rope-theta", "10000"}, "--rope-theta does not apply to --op sdpa");
    expect_failure({"bench", "--op", "sdpa", "--kdim", "8"}, "--kdim does not apply to --op sdpa");
    expect_failure({"bench", "--op", "attention", "--embed", "10", "--heads", "3", "--seq", "4", "--kv-heads", "2",
                    "--head-dim", "4"},
                   "num_kv_heads");  // H % Hkv, found by the library
    expect_failure({"bench", "--op", "conv"}, "--op");
    expect_failure({"bench", "--op", "attention", "--embed", "10", "--heads", "3", "--seq", "4"}, "not a multiple");
    expect_failure({"bench", "--op", "gemm", "--m", "0"}, "--m");
    expect_failure({"bench"}, "--op is required");
}

// --- PyTorch fixtures (tests/data/<case>/, written by tests/data's generator) ---------------------

TEST_F(ToolTest, PyTorchFixtures) {
    const fs::path data(MHA_TEST_DATA_DIR);
    std::vector<fs::path> cases;
    if (fs::is_directory(data))
        for (const auto& e : fs::directory_iterator(data))
            if (fs::exists(e.path() / "args.json")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    if (cases.empty()) GTEST_SKIP() << "no fixtures (<case>/args.json) in " << data;
    int checked = 0;
    for (const fs::path& c : cases) {
        SCOPED_TRACE(c.filename().string());
        const nlohmann::json args = nlohmann::json::parse(read_text(c / "args.json"));
        // The tool writes only averaged weights: a per-head case is run for its output alone.
        const std::string need = args.value("need_weights", "none");
        for (const char* backend : {"scalar", "simd"}) {
            SCOPED_TRACE(backend);
            const fs::path out_dir = base_ / c.filename() / backend;
            fs::create_directories(out_dir);
            std::vector<std::string> argv{"run", "--npy", c.string(), "--heads", std::to_string(args.at("heads").get<int>()),
                                          "--backend", backend, "--out", (out_dir / "output.npy").string()};
            if (args.value("causal", false)) argv.push_back("--causal");
            if (need == "averaged") argv.push_back("--need-weights");
            if (args.contains("norm_eps") && !args["norm_eps"].is_null()) {
                char eps[64];
                std::snprintf(eps, sizeof eps, "%.9g", args["norm_eps"].get<double>());
                argv.insert(argv.end(), {"--norm-eps", eps});
            }
            // The decoder fixtures (tests/data/decoder) run in test_tool_decoder_fixtures.cpp.
            const Result r = mha(argv);
            ASSERT_EQ(r.exit_code, 0) << r.err;
            const auto compare = [](const fs::path& got_path, const fs::path& want_path) {
                const mha::npy::Array got = mha::npy::load(got_path.string());
                const mha::npy::Array want = mha::npy::load(want_path.string());
                EXPECT_EQ(got.shape, want.shape) << got_path;
                const double scale = max_abs(want.values);
                EXPECT_LE(max_abs_diff(got.values, want.values), 1e-5f * scale) << got_path;
            };
            compare(out_dir / "output.npy", c / "expected_output.npy");
            if (need == "averaged") compare(out_dir / "attn_weights.npy", c / "expected_attn_weights.npy");
            ++checked;
        }
    }
    EXPECT_EQ(checked, 2 * static_cast<int>(cases.size()));
}

}  // namespace
