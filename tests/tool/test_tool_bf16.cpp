// The `mha` tool's bf16 options end to end: `mha run --dtype f32|bf16` on the PyTorch bf16 fixtures of
// tests/data/bf16 (our bf16 error against the float64 oracle at most 1.5 × PyTorch's bf16 error; bf16 and f32
// give different results, f32 the more accurate), `--bf16-raw` (the same files as uint16 bfloat16 bits give
// bitwise the results of the float32 files), the errors of both flags, and `mha bench --dtype` ("dtype" and
// "isa" in the JSON; refused for the ops it does not apply to).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <mha/mha.hpp>

#include "../compare_util.hpp"
#include "npy.hpp"
#include "tool_files.hpp"
#include "tool_process.hpp"

namespace {

using namespace mha_tool_test;

const fs::path kData = fs::path(MHA_TEST_DATA_DIR) / "bf16";

// The `mha run` flags of a bf16 fixture case (args.json).
std::vector<std::string> case_flags(const fs::path& c) {
    const nlohmann::json a = nlohmann::json::parse(read_text(c / "args.json"));
    std::vector<std::string> f{"--heads", std::to_string(a.at("heads").get<int>()), "--kv-heads",
                               std::to_string(a.at("kv_heads").get<int>()), "--head-dim", std::to_string(a.at("head_dim").get<int>())};
    if (!a.at("rope_theta").is_null())
        f.insert(f.end(), {"--rope-theta", std::to_string(a.at("rope_theta").get<double>()), "--rope-style",
                           a.at("rope_style").get<std::string>(), "--rope-dims", std::to_string(a.at("rope_dims").get<int>())});
    if (a.at("causal").get<bool>()) f.push_back("--causal");
    return f;
}

std::vector<float> load_floats(const fs::path& p) { return mha::npy::load(p.string()).values; }

// A float32 array's values as a '<u2' .npy of their bfloat16 bits (the values must be bfloat16 values).
void save_bits(const fs::path& p, const std::vector<float>& v, const std::vector<std::size_t>& shape) {
    std::vector<std::uint8_t> bytes(2 * v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
        const std::uint16_t b = mha::bfloat16::from_float(v[i]).bits;
        ASSERT_EQ(mha::bfloat16::from_bits(b).to_float(), v[i]) << p << " [" << i << "] is not a bfloat16 value";
        std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
    write_bytes_npy(p, bytes, shape, "<u2");
}

// Copies fixture case c into dir: float arrays as bfloat16 bits (bits) or as they are, bool arrays as they are.
void copy_case(const fs::path& c, const fs::path& dir, bool bits) {
    for (const auto& e : fs::directory_iterator(c)) {
        const std::string name = e.path().filename().string();
        if (e.path().extension() != ".npy" || name == "expected_output.npy" || name == "torch_bf16_output.npy") continue;
        const mha::npy::Array a = mha::npy::load(e.path().string());
        if (a.dtype == mha::npy::DType::boolean || !bits)
            fs::copy_file(e.path(), dir / name);
        else
            save_bits(dir / name, a.values, a.shape);
    }
}

class Bf16Tool : public ToolDirTest {};

TEST_F(Bf16Tool, DtypeOnPytorchFixtures) {
    for (const char* name : {"bert_self_masks", "cross_kdim_vdim", "llama_gqa_rope"}) {
        SCOPED_TRACE(name);
        const fs::path c = kData / name;
        const std::vector<float> oracle = load_floats(c / "expected_output.npy");
        const double torch_err = mha_test::max_abs_diff(load_floats(c / "torch_bf16_output.npy"), oracle);
        ASSERT_GT(torch_err, 0.0);
        auto run = [&](const std::string& backend, const std::string& dtype) {
            const fs::path out = base_ / (std::string(name) + "_" + backend + "_" + dtype + ".npy");
            std::vector<std::string> argv{"run", "--npy", c.string(), "--backend", backend, "--dtype", dtype, "--out", out.string()};
            const std::vector<std::string> f = case_flags(c);
            argv.insert(argv.end(), f.begin(), f.end());
            const Result r = mha(argv);
            EXPECT_EQ(r.exit_code, 0) << r.err;
            return load_floats(out);
        };
        const std::vector<float> bf_scalar = run("scalar", "bf16"), f32_scalar = run("scalar", "f32"), bf_simd = run("simd", "bf16");
        EXPECT_LE(mha_test::max_abs_diff(bf_scalar, oracle), 1.5 * torch_err);
        EXPECT_LE(mha_test::max_abs_diff(bf_simd, oracle), 1.5 * torch_err);
        EXPECT_LT(mha_test::max_abs_diff(f32_scalar, oracle), 1e-5) << "--dtype f32 is fp32";
        EXPECT_GT(mha_test::max_abs_diff(bf_scalar, f32_scalar), 1e-4) << "--dtype bf16 did not reach the layer";
    }
}

TEST_F(Bf16Tool, RawBitsGiveTheResultsOfTheFloatFiles) {
    for (const char* name : {"bert_self_masks", "llama_gqa_rope"}) {
        SCOPED_TRACE(name);
        const fs::path c = kData / name, raw = base_ / (std::string(name) + "_raw"), plain = base_ / (std::string(name) + "_f32");
        fs::create_directories(raw), fs::create_directories(plain);
        copy_case(c, raw, true);
        copy_case(c, plain, false);
        for (const char* dtype : {"bf16", "f32"}) {
            SCOPED_TRACE(dtype);
            std::vector<std::string> f = case_flags(c);
            f.insert(f.end(), {"--dtype", dtype, "--backend", "scalar"});
            std::vector<std::string> a{"run", "--npy", raw.string(), "--bf16-raw"}, b{"run", "--npy", plain.string()};
            a.insert(a.end(), f.begin(), f.end()), b.insert(b.end(), f.begin(), f.end());
            ASSERT_EQ(mha(a).exit_code, 0);
            ASSERT_EQ(mha(b).exit_code, 0);
            const mha::npy::Array x = mha::npy::load((raw / "output.npy").string()), y = mha::npy::load((plain / "output.npy").string());
            EXPECT_EQ(x.dtype, mha::npy::DType::float32) << "outputs stay float32";
            EXPECT_EQ(x.shape, y.shape);
            EXPECT_TRUE(x.values == y.values) << "--bf16-raw must widen the bits exactly";
        }
    }
}

// A small self-attention case in dir_: float32 files (bfloat16 values), or their bits.
void write_small_case(const fs::path& dir, bool bits, std::uint32_t seed = 5) {
    std::mt19937 rng(seed);
    auto vals = [&](std::size_t n) {
        std::vector<float> v = random_floats(n, 0.5f, rng);
        for (float& x : v) x = mha::round_to_bf16(x);
        return v;
    };
    const std::size_t B = 2, L = 5, E = 8;
    const auto put = [&](const char* file, const std::vector<float>& v, const std::vector<std::size_t>& shape) {
        if (bits) save_bits(dir / file, v, shape);
        else save(dir / file, v, shape);
    };
    put("query.npy", vals(B * L * E), {B, L, E});
    put("in_proj_weight.npy", vals(3 * E * E), {3 * E, E});
    put("out_proj.weight.npy", vals(E * E), {E, E});
}

TEST_F(Bf16Tool, DtypeErrors) {
    write_small_case(dir_, false);
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--dtype", "f16"}, {"--dtype", "f16"});
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--dtype", "bfloat16"}, {"--dtype", "bfloat16"});
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--dtype"}, {"--dtype"});
    EXPECT_EQ(mha({"run", "--npy", dir_.string(), "--heads", "2", "--dtype", "bf16", "--out", (base_ / "o.npy").string()}).exit_code, 0);
}

TEST_F(Bf16Tool, RawErrors) {
    // Float32 files with --bf16-raw: the first float input is named.
    write_small_case(dir_, false);
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--bf16-raw"},
                        {"query.npy has dtype float32 but --bf16-raw needs uint16"});
    // uint16 bits without --bf16-raw.
    fs::remove_all(dir_), fs::create_directories(dir_);
    write_small_case(dir_, true);
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2"}, {"query.npy has dtype uint16", "--bf16-raw"});
    EXPECT_EQ(mha({"run", "--npy", dir_.string(), "--heads", "2", "--bf16-raw", "--out", (base_ / "o.npy").string()}).exit_code, 0);
    // One weight left as float32 among bits.
    {
        std::mt19937 rng(9);
        save(dir_ / "out_proj.weight.npy", random_floats(64, 0.5f, rng), {8, 8});
    }
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--bf16-raw"},
                        {"out_proj.weight.npy has dtype float32 but --bf16-raw needs uint16"});
    // Other integer dtypes are not bfloat16 bits.
    write_bytes_npy(dir_ / "out_proj.weight.npy", std::vector<std::uint8_t>(4 * 64, 0), {8, 8}, "<u4");
    expect_failure_with({"run", "--npy", dir_.string(), "--heads", "2", "--bf16-raw"}, {"out_proj.weight.npy", "'<u4' is not supported"});
    // A uint16 file where the sdpa command wants floats.
    fs::remove_all(dir_), fs::create_directories(dir_);
    save_bits(dir_ / "q.npy", std::vector<float>(16, 0.5f), {1, 1, 2, 8});
    expect_failure_with({"sdpa", "--npy", dir_.string()}, {"q.npy has dtype uint16"});
}

// '<u2' is read (into Array::words) only with Accept::with_bf16_bits.
TEST(Bf16Npy, ReaderTakesUint16OnlyWhenAsked) {
    std::string header = "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string f("\x93NUMPY\x01\x00", 8);
    f += static_cast<char>(header.size()), f += '\0', f += header;
    f += std::string("\x80\x3f\xc0\xff", 4);  // 0x3f80 (1.0), 0xffc0 (a NaN)
    const auto* p = reinterpret_cast<const std::uint8_t*>(f.data());
    try {
        (void)mha::npy::parse(p, f.size());
        ADD_FAILURE() << "'<u2' taken by default";
    } catch (const mha::npy::error& e) {
        EXPECT_NE(std::string(e.what()).find("dtype '<u2' is not supported"), std::string::npos) << e.what();
    }
    const mha::npy::Array a = mha::npy::parse(p, f.size(), mha::npy::Accept::with_bf16_bits);
    EXPECT_EQ(a.dtype, mha::npy::DType::uint16);
    EXPECT_EQ(a.words, (std::vector<std::uint16_t>{0x3f80, 0xffc0}));
    EXPECT_TRUE(a.values.empty());
}

TEST_F(Bf16Tool, BenchDtype) {
    const mha::Isa active = mha::active_isa();
    for (const char* op : {"attention", "decode", "gemm"})
        for (const char* dtype : {"f32", "bf16"}) {
            SCOPED_TRACE(std::string(op) + " " + dtype);
            const bool gemm = std::string(op) == "gemm";
            const Result r = gemm ? mha({"bench", "--op", op, "--dtype", dtype, "--m", "33", "--n", "40", "--k", "17", "--reps", "1", "--json"})
                                  : mha({"bench", "--op", op, "--dtype", dtype, "--batch", "1", "--seq", "4", "--embed", "32", "--heads", "2",
                                         "--reps", "1", "--json"});
            ASSERT_EQ(r.exit_code, 0) << r.err;
            const nlohmann::json j = nlohmann::json::parse(r.out);
            EXPECT_EQ(j.at("dtype"), dtype);
            const mha::Isa ran = std::string(dtype) == "bf16" && mha::has_bf16_kernels(active) ? active : mha::fp32_kernel_isa(active);
            EXPECT_EQ(j.at("isa"), std::string(mha::isa_name(ran)));
        }
    const Result r = mha({"bench", "--op", "attention", "--batch", "1", "--seq", "4", "--embed", "32", "--heads", "2", "--reps", "1", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("dtype"), "f32") << "the default";
    expect_failure_with({"bench", "--op", "softmax", "--dtype", "bf16"}, {"--dtype does not apply to --op softmax"});
    expect_failure_with({"bench", "--op", "sdpa", "--dtype", "f32"}, {"--dtype does not apply to --op sdpa"});
    expect_failure_with({"bench", "--op", "attention", "--dtype", "f16"}, {"--dtype", "f16"});
}

}  // namespace
