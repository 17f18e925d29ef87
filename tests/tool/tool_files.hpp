// Input files for the tool tests that write their own .npy cases (decoder, sdpa, KV cache): random floats
// and a float32 .npy writer. Shared by tests/tool/test_tool_{decoder,sdpa,kv_cache}.cpp.
#pragma once
#include <cstddef>
#include <filesystem>
#include <random>
#include <vector>

#include "npy.hpp"

namespace mha_tool_test {

inline std::vector<float> random_floats(std::size_t n, float amplitude, std::mt19937& rng) {
    std::uniform_real_distribution<float> d(-amplitude, amplitude);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

inline void save(const std::filesystem::path& p, const std::vector<float>& v, const std::vector<std::size_t>& shape) {
    mha::npy::save(p.string(), v.data(), shape);
}

}  // namespace mha_tool_test
