// Tests of `mha run --seq-first` (PyTorch's batch_first=False layout): query.npy, key.npy, value.npy and
// output.npy are [L, B, E]; masks and attn_weights.npy keep their shapes. Each test runs the real binary
// (MHA_TOOL_PATH) in a fresh temporary folder:
//   - PyTorch fixtures from tests/data with query/key/value transposed to [L, B, E] (here, in C++): the
//     output must be the transposed expected output, within the fixture tests' tolerance, and bitwise
//     equal to the transposed output of the same run on the original batch-first files;
//   - unbatched [L, E] files give the same bytes with and without the flag;
//   - a key_padding_mask or key whose B disagrees with the query's [Lq, B, E] is one error line naming
//     the shapes, a nonzero exit code and no output file.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "npy.hpp"
#include "tool_process.hpp"

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::size_t>;

using mha_tool_test::Result;
using mha_tool_test::read_text;
using mha_tool_test::run_tool;

using mha_tool_test::listing;

// [d0, d1, E] → [d1, d0, E]: swaps the two leading axes (batch-first ↔ sequence-first).
std::vector<float> swap_leading_axes(const std::vector<float>& v, const Shape& s) {
    const std::size_t d0 = s.at(0), d1 = s.at(1), E = s.at(2);
    std::vector<float> t(v.size());
    for (std::size_t a = 0; a < d0; ++a)
        for (std::size_t b = 0; b < d1; ++b)
            for (std::size_t j = 0; j < E; ++j) t[(b * d0 + a) * E + j] = v[(a * d1 + b) * E + j];
    return t;
}

float max_abs(const std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
}

// Every |got − want| <= tol, written so that a NaN on either side fails (NaN <= tol is false).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements outside ±" << tol << ", first at " << first << ": got "
                       << got[first] << " want " << want[first];
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

class SeqFirstToolTest : public mha_tool_test::ToolDirTest {
protected:

    // A valid case in dir_: query in `query_shape`, random weights for E = query_shape.back().
    void write_case(const Shape& query_shape) {
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        const auto random = [&](std::size_t n) {
            std::vector<float> v(n);
            for (float& x : v) x = u(rng);
            return v;
        };
        std::size_t n = 1;
        for (std::size_t d : query_shape) n *= d;
        const std::size_t E = query_shape.back();
        mha::npy::save((dir_ / "query.npy").string(), random(n).data(), query_shape);
        mha::npy::save((dir_ / "in_proj_weight.npy").string(), random(3 * E * E).data(), {3 * E, E});
        mha::npy::save((dir_ / "out_proj.weight.npy").string(), random(E * E).data(), {E, E});
        mha::npy::save((dir_ / "out_proj.bias.npy").string(), random(E).data(), {E});
    }

    void expect_failure(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
        expect_failure_with(args, needles);
    }
};

// Fixtures with masks, cross-attention (Lq ≠ Lk), causal, a 3-D attn_mask, averaged weights (whose
// [B, Lq, Lk] shape is the same in both layouts) and the post-norm block (its residual is the query). The tolerance is the one ToolTest.PyTorchFixtures
// uses on the same fixtures: 1e-5 of the largest expected value.
TEST_F(SeqFirstToolTest, TransposedPyTorchFixtures) {
    const fs::path data(MHA_TEST_DATA_DIR);
    const std::vector<std::string> names{"key_padding_bool", "cross_attention", "causal", "attn_mask_float_3d",
                                         "need_weights_averaged", "seed000_self_attention"};
    int checked = 0;
    for (const std::string& name : names) {
        const fs::path src = data / name;
        if (!fs::exists(src / "args.json")) continue;
        SCOPED_TRACE(name);
        const nlohmann::json args = nlohmann::json::parse(read_text(src / "args.json"));
        const bool weights = args.value("need_weights", "none") == "averaged";

        // The case with query/key/value as [L, B, E]; weights and masks copied unchanged.
        const fs::path seq = base_ / name / "seq_first";
        fs::create_directories(seq);
        for (const auto& e : fs::directory_iterator(src)) {
            const std::string file = e.path().filename().string();
            if (file.rfind("expected_", 0) == 0 || file == "args.json") continue;
            if (file == "query.npy" || file == "key.npy" || file == "value.npy") {
                const mha::npy::Array a = mha::npy::load(e.path().string());
                ASSERT_EQ(a.shape.size(), 3u) << file;
                const std::vector<float> t = swap_leading_axes(a.values, a.shape);
                mha::npy::save((seq / file).string(), t.data(), {a.shape[1], a.shape[0], a.shape[2]});
            } else {
                fs::copy_file(e.path(), seq / file);
            }
        }
        const mha::npy::Array want = mha::npy::load((src / "expected_output.npy").string());
        const Shape want_shape{want.shape.at(1), want.shape.at(0), want.shape.at(2)};
        const std::vector<float> want_seq = swap_leading_axes(want.values, want.shape);

        for (const char* backend : {"scalar", "simd"}) {
            SCOPED_TRACE(backend);
            const fs::path out_bf = base_ / name / backend / "batch_first.npy";
            const fs::path out_sf = base_ / name / backend / "seq_first.npy";
            fs::create_directories(out_bf.parent_path());
            std::vector<std::string> common{"--heads", std::to_string(args.at("heads").get<int>()), "--backend", backend,
                                            "--threads", "2"};
            if (args.value("causal", false)) common.push_back("--causal");
            if (weights) common.push_back("--need-weights");
            if (args.contains("norm_eps") && !args["norm_eps"].is_null()) {  // as ToolTest.PyTorchFixtures passes it
                char eps[64];
                std::snprintf(eps, sizeof eps, "%.9g", args["norm_eps"].get<double>());
                common.insert(common.end(), {"--norm-eps", eps});
            }
            std::vector<std::string> bf{"run", "--npy", src.string(), "--out", out_bf.string()};
            std::vector<std::string> sf{"run", "--seq-first", "--npy", seq.string(), "--out", out_sf.string()};
            bf.insert(bf.end(), common.begin(), common.end());
            sf.insert(sf.end(), common.begin(), common.end());

            // Batch-first first: its attn_weights.npy is read before the seq-first run writes the same name.
            const Result rb = mha(bf);
            ASSERT_EQ(rb.exit_code, 0) << rb.err;
            const mha::npy::Array got_bf = mha::npy::load(out_bf.string());
            const std::vector<float> weights_bf =
                weights ? mha::npy::load((out_bf.parent_path() / "attn_weights.npy").string()).values : std::vector<float>{};
            const Result rs = mha(sf);
            ASSERT_EQ(rs.exit_code, 0) << rs.err;
            EXPECT_EQ(rs.err, "");
            const mha::npy::Array got = mha::npy::load(out_sf.string());
            EXPECT_EQ(got.shape, want_shape);
            expect_close(got.values, want_seq, 1e-5f * max_abs(want.values), "output.npy vs transposed expected output");
            // The same kernels on the same numbers, only addressed through other strides.
            expect_bitwise(got.values, swap_leading_axes(got_bf.values, got_bf.shape), "output.npy vs batch-first run");
            if (weights) {
                const mha::npy::Array w = mha::npy::load((out_sf.parent_path() / "attn_weights.npy").string());
                const mha::npy::Array want_w = mha::npy::load((src / "expected_attn_weights.npy").string());
                EXPECT_EQ(w.shape, want_w.shape);  // [B, Lq, Lk] in both layouts
                expect_close(w.values, want_w.values, 1e-5f * max_abs(want_w.values), "attn_weights.npy");
                expect_bitwise(w.values, weights_bf, "attn_weights.npy vs batch-first run");
            }
            ++checked;
        }
    }
    if (checked == 0) GTEST_SKIP() << "no fixtures in " << data;
    EXPECT_EQ(checked, 2 * static_cast<int>(names.size()));
}

TEST_F(SeqFirstToolTest, UnbatchedInputIsUnaffected) {
    write_case({5, 8});
    const fs::path a = base_ / "a.npy", b = base_ / "b.npy";
    const Result ra = mha({"run", "--npy", dir_.string(), "--heads", "2", "--out", a.string()});
    const Result rb = mha({"run", "--npy", dir_.string(), "--heads", "2", "--seq-first", "--out", b.string()});
    ASSERT_EQ(ra.exit_code, 0) << ra.err;
    ASSERT_EQ(rb.exit_code, 0) << rb.err;
    EXPECT_EQ(mha::npy::load(b.string()).shape, (Shape{5, 8}));
    EXPECT_EQ(read_text(a), read_text(b));
}

TEST_F(SeqFirstToolTest, RejectsKeyPaddingMaskWithOtherBatch) {
    write_case({3, 2, 4});  // [Lq = 3, B = 2, E = 4]
    const std::vector<std::uint8_t> mask(3 * 3, 0);
    {
        // A [B' = 3, Lk = 3] bool mask, written as NumPy does ('|b1').
        std::string header = "{'descr': '|b1', 'fortran_order': False, 'shape': (3, 3), }";
        while ((10 + header.size() + 1) % 64 != 0) header += ' ';
        header += '\n';
        std::string f("\x93NUMPY\x01\x00", 8);
        f += static_cast<char>(header.size() & 0xff);
        f += static_cast<char>(header.size() >> 8);
        f += header;
        f.append(reinterpret_cast<const char*>(mask.data()), mask.size());
        std::ofstream(dir_ / "key_padding_mask.npy", std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
    }
    expect_failure({"run", "--seq-first", "--npy", dir_.string(), "--heads", "2"},
                   {"key_padding_mask.npy has shape [3, 3] but must be [B, Lk] = [2, 3]",
                    "query.npy [3, 2, 4] = [Lq, B, E] (--seq-first)"});
}

TEST_F(SeqFirstToolTest, RejectsKeyWithOtherBatch) {
    write_case({3, 2, 4});
    const std::vector<float> key(5 * 3 * 4, 0.0f);
    mha::npy::save((dir_ / "key.npy").string(), key.data(), {5, 3, 4});  // [Lk = 5, B = 3, E]: B 3 != 2
    expect_failure({"run", "--seq-first", "--npy", dir_.string(), "--heads", "2"},
                   {"key.npy has shape [5, 3, 4] but query.npy has shape [3, 2, 4]: key must be [Lk, B, E]"});
}

TEST_F(SeqFirstToolTest, HelpNamesTheFlag) {
    const Result r = mha({"run", "--help"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--seq-first"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[L, B, E]"), std::string::npos) << r.out;
}

}  // namespace
