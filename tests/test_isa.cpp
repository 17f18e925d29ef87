// ISA selection: names, the cap (set_isa_cap and the MHA_ISA environment variable), and
// active_isa() = min(detected, cap). MHA_ISA is read once per process, so it is tested in child
// processes: this test binary itself, running only the helper test IsaChild.DISABLED_PrintActiveIsa.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <unistd.h>

#include <mha/mha.hpp>

namespace {

constexpr mha::Isa kX86[] = {mha::Isa::sse2, mha::Isa::avx2, mha::Isa::avx512, mha::Isa::avx512_bf16};
constexpr mha::Isa kArm[] = {mha::Isa::neon, mha::Isa::neon_bf16};
constexpr mha::Isa kAll[] = {mha::Isa::sse2, mha::Isa::avx2, mha::Isa::avx512, mha::Isa::avx512_bf16,
                             mha::Isa::neon, mha::Isa::neon_bf16};

bool is_arm(mha::Isa isa) { return isa == mha::Isa::neon || isa == mha::Isa::neon_bf16; }
// Position of a level in its family's list (isa.hpp: families ordered lowest first).
std::size_t rank(mha::Isa isa) {
    const mha::Isa* family = is_arm(isa) ? kArm : kX86;
    std::size_t r = 0;
    while (family[r] != isa) ++r;
    return r;
}
// What a cap gives on this CPU: the detected family's level of rank min(rank(cap), rank(detected)).
mha::Isa capped(mha::Isa cap, mha::Isa detected) {
    const mha::Isa* family = is_arm(detected) ? kArm : kX86;
    return family[std::min(rank(cap), rank(detected))];
}

TEST(Isa, NamesRoundTrip) {
    EXPECT_EQ(mha::isa_name(mha::Isa::sse2), "sse2");
    EXPECT_EQ(mha::isa_name(mha::Isa::avx2), "avx2");
    EXPECT_EQ(mha::isa_name(mha::Isa::avx512), "avx512");
    EXPECT_EQ(mha::isa_name(mha::Isa::avx512_bf16), "avx512_bf16");
    EXPECT_EQ(mha::isa_name(mha::Isa::neon), "neon");
    EXPECT_EQ(mha::isa_name(mha::Isa::neon_bf16), "neon_bf16");
    for (mha::Isa isa : kAll) EXPECT_EQ(mha::parse_isa(mha::isa_name(isa)), isa);
}

// The helpers that say which kernels a level runs.
TEST(Isa, Bf16KernelsAndFp32Levels) {
    for (mha::Isa isa : kAll) EXPECT_EQ(mha::has_bf16_kernels(isa), isa == mha::Isa::avx512_bf16 || isa == mha::Isa::neon_bf16) << mha::isa_name(isa);
    EXPECT_EQ(mha::fp32_kernel_isa(mha::Isa::avx512_bf16), mha::Isa::avx512);
    EXPECT_EQ(mha::fp32_kernel_isa(mha::Isa::neon_bf16), mha::Isa::neon);
    for (mha::Isa isa : {mha::Isa::sse2, mha::Isa::avx2, mha::Isa::avx512, mha::Isa::neon})
        EXPECT_EQ(mha::fp32_kernel_isa(isa), isa);
}

// The detected level belongs to the family of the target the library was built for.
TEST(Isa, DetectedLevelIsThisTargetsFamily) {
#if defined(__aarch64__)
    EXPECT_TRUE(is_arm(mha::detected_isa())) << mha::isa_name(mha::detected_isa());
#else
    EXPECT_FALSE(is_arm(mha::detected_isa())) << mha::isa_name(mha::detected_isa());
#endif
}

TEST(Isa, ParseRejectsOtherNames) {
    for (const char* bad : {"", "AVX2", "avx", "avx512f", "sse2 ", "native", "NEON", "sve", "neon64"}) {
        try {
            mha::parse_isa(bad);
            ADD_FAILURE() << "parse_isa(\"" << bad << "\") did not throw";
        } catch (const mha::invalid_argument& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("'" + std::string(bad) + "'"), std::string::npos) << msg;  // names the input
            EXPECT_NE(msg.find("sse2, avx2, avx512, avx512_bf16, neon, neon_bf16"), std::string::npos) << msg;  // and the choices
        }
    }
    // The exception is also a std::invalid_argument, as the public API promises.
    EXPECT_THROW(mha::parse_isa("sve2"), std::invalid_argument);
}

TEST(Isa, CapLimitsActiveIsa) {
    const mha::Isa detected = mha::detected_isa();
    EXPECT_LE(rank(mha::active_isa()), rank(detected));
    EXPECT_EQ(is_arm(mha::active_isa()), is_arm(detected));
    for (mha::Isa cap : kAll) {
        mha::set_isa_cap(cap);
        EXPECT_EQ(mha::active_isa(), capped(cap, detected)) << "cap " << mha::isa_name(cap);
        EXPECT_EQ(mha::detected_isa(), detected);  // the cap never changes detection
    }
    // Spelled out: the other family's lowest caps at this family's lowest, its highest caps nothing.
    mha::set_isa_cap(is_arm(detected) ? mha::Isa::sse2 : mha::Isa::neon);
    EXPECT_EQ(mha::active_isa(), is_arm(detected) ? mha::Isa::neon : mha::Isa::sse2);
    mha::set_isa_cap(is_arm(detected) ? mha::Isa::avx512_bf16 : mha::Isa::neon_bf16);
    EXPECT_EQ(mha::active_isa(), is_arm(detected) ? detected : capped(mha::Isa::avx2, detected));
    mha::set_isa_cap(mha::Isa::avx512_bf16);
    EXPECT_EQ(mha::active_isa(), detected);
}

TEST(Isa, DetectionIsStable) {
    const mha::Isa first = mha::detected_isa();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(mha::detected_isa(), first);
}

// Helper for the environment tests, run only as a child process: prints what this process chose.
TEST(IsaChild, DISABLED_PrintActiveIsa) {
    std::printf("MHA_TEST active_isa=%s detected_isa=%s\n", std::string(mha::isa_name(mha::active_isa())).c_str(),
                std::string(mha::isa_name(mha::detected_isa())).c_str());
}

std::string self_path() {
    char buf[4096];
    const ssize_t len = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (len <= 0) return {};
    return std::string(buf, static_cast<std::size_t>(len));
}

// Runs the helper test in a child with MHA_ISA = value (unset when value is null); returns the ISA
// name it printed, or "" on failure.
std::string child_active_isa(const char* value) {
    const std::string exe = self_path();
    if (exe.empty()) return {};
    std::string cmd = value ? "MHA_ISA='" + std::string(value) + "' " : std::string("env -u MHA_ISA ");
    // A cross build's tests run under an emulator (CTest's CMAKE_CROSSCOMPILING_EMULATOR); so must the child.
    if (const char* emulator = MHA_TEST_EMULATOR; *emulator != '\0') cmd += "'" + std::string(emulator) + "' ";
    cmd += "'" + exe + "' --gtest_also_run_disabled_tests --gtest_filter=IsaChild.DISABLED_PrintActiveIsa 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    if (pipe == nullptr) return {};
    std::string out;
    char chunk[512];
    while (std::fgets(chunk, sizeof(chunk), pipe) != nullptr) out += chunk;
    if (pclose(pipe) != 0) return {};
    const std::string key = "MHA_TEST active_isa=";
    const auto at = out.find(key);
    if (at == std::string::npos) return {};
    return out.substr(at + key.size(), out.find(' ', at + key.size()) - (at + key.size()));
}

TEST(Isa, EnvironmentVariableCapsTheChild) {
    const mha::Isa detected = mha::detected_isa();
    for (mha::Isa cap : kAll) {
        const mha::Isa want = capped(cap, detected);
        EXPECT_EQ(child_active_isa(std::string(mha::isa_name(cap)).c_str()), mha::isa_name(want))
            << "MHA_ISA=" << mha::isa_name(cap);
    }
    // Unset or not a valid name: no cap (isa.hpp: the cap is MHA_ISA "if set and valid").
    EXPECT_EQ(child_active_isa(nullptr), mha::isa_name(detected));
    EXPECT_EQ(child_active_isa("bogus"), mha::isa_name(detected));
}

}  // namespace
