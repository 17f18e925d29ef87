// Runs the real `mha` binary (MHA_TOOL_PATH) for the tool tests: arguments in, exit code and the captured
// stdout/stderr out; a test fixture with its own temporary folder. Shared by tests/tool/test_tool*.cpp.
#pragma once
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

extern char** environ;

namespace mha_tool_test {

namespace fs = std::filesystem;

struct Result {
    int exit_code = -1;
    std::string out, err;
};

inline std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `mha args...` with stdout and stderr captured in files under capture_dir.
inline Result run_tool(const std::vector<std::string>& args, const fs::path& capture_dir) {
    fs::create_directories(capture_dir);
    const std::string out_path = (capture_dir / "stdout").string(), err_path = (capture_dir / "stderr").string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    // A cross build's tool runs under the emulator its tests run under (CTest's CMAKE_CROSSCOMPILING_EMULATOR).
    const std::string emulator = MHA_TEST_EMULATOR;
    std::vector<std::string> argv_strings{MHA_TOOL_PATH};
    if (!emulator.empty()) argv_strings.insert(argv_strings.begin(), emulator);
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int spawn_rc = posix_spawn(&pid, argv_strings.front().c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    Result r;
    if (spawn_rc != 0) {
        ADD_FAILURE() << "cannot start " << MHA_TOOL_PATH << ": " << std::strerror(spawn_rc);
        return r;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_text(out_path);
    r.err = read_text(err_path);
    return r;
}

// A .npy file of bytes ('|b1' bool or '|u1' uint8) in C order, as NumPy writes it (format 1.0).
inline void write_bytes_npy(const fs::path& p, const std::vector<std::uint8_t>& v, const std::vector<std::size_t>& shape,
                            const char* descr = "|b1") {
    std::string tuple = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) tuple += (i ? ", " : "") + std::to_string(shape[i]);
    tuple += shape.size() == 1 ? ",)" : ")";
    std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + tuple + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string f("\x93NUMPY\x01\x00", 8);
    f += static_cast<char>(header.size() & 0xff);
    f += static_cast<char>(header.size() >> 8);
    f += header;
    f.append(reinterpret_cast<const char*>(v.data()), v.size());
    std::ofstream(p, std::ios::binary).write(f.data(), static_cast<std::streamsize>(f.size()));
}

// The names in a folder.
inline std::set<std::string> listing(const fs::path& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

// A test with its own temporary folder: base_ (removed unless the test failed, for a look) and dir_ =
// base_/in for the input files; mha(args) runs the tool with its output captured under base_.
class ToolDirTest : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        base_ = fs::temp_directory_path() / ("mha_tool_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
                                             std::to_string(::getpid()));
        fs::remove_all(base_);
        dir_ = base_ / "in";
        fs::create_directories(dir_);
    }
    void TearDown() override {
        if (!HasFailure()) fs::remove_all(base_);
    }
    Result mha(const std::vector<std::string>& args) { return run_tool(args, base_ / "capture"); }
    // The command must fail: exit code != 0, nothing on stdout, exactly one line on stderr containing every
    // needle, and no file created in the input folder.
    void expect_failure_with(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
        const std::set<std::string> before = listing(dir_);
        const Result r = mha(args);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_EQ(r.out, "");
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
        EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << "stderr: " << r.err;
        for (const std::string& needle : needles) EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
        EXPECT_EQ(listing(dir_), before) << "files were created";
        EXPECT_FALSE(fs::exists(dir_ / "output.npy"));
    }
    fs::path base_, dir_;
};

}  // namespace mha_tool_test
