// memory_soak: resident memory of a long-running program that builds one attention object (E = 768,
// H = 12) and runs forwards whose length grows to L_max and shrinks back, as a server would. Prints the
// resident set (VmRSS) after building the object, after each phase, and at the end; with the library's
// scratch cache the end value stays within the cache limit of the start. Public API only.
//   usage: memory_soak [L_max=16384] [threads=0] [cache_limit_MiB=default]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <mha/mha.hpp>

namespace {

double rss_mb() {
    std::ifstream f("/proc/self/status");
    std::string key;
    while (f >> key) {
        if (key == "VmRSS:") {
            double kb = 0;
            f >> kb;
            return kb / 1024.0;
        }
        std::getline(f, key);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::size_t L_max = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 16384;
    const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
#ifndef MHA_SOAK_OLD_API
    if (argc > 3) mha::set_scratch_cache_limit(std::strtoul(argv[3], nullptr, 10) << 20);
#endif
    const std::size_t E = 768, H = 12;
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-0.03f, 0.03f);
    std::vector<float> in_w(3 * E * E), out_w(E * E);
    for (float& x : in_w) x = dist(gen);
    for (float& x : out_w) x = dist(gen);
    const double start = rss_mb();
    mha::MultiheadAttention attn({in_w.data(), nullptr, out_w.data(), nullptr}, E, H);
    const double built = rss_mb();
    in_w = {};
    out_w = {};
    std::printf("object built: RSS %.1f MiB (+%.1f MiB for the object)\n", built, built - start);
#ifndef MHA_SOAK_OLD_API
    std::printf("weight_bytes: %zu (%.2f MiB)\n", attn.weight_bytes(), attn.weight_bytes() / 1048576.0);
#endif
    std::vector<std::size_t> lengths;
    for (std::size_t L = 128; L < L_max; L *= 2) lengths.push_back(L);
    for (std::size_t L = L_max; L >= 128; L /= 2) lengths.push_back(L);
    for (int rep = 0; rep < 3; ++rep) lengths.push_back(128);
    mha::ForwardOptions opt;
    opt.threads = threads;
    for (std::size_t L : lengths) {
        std::vector<float> q(L * E, 0.5f), out(L * E);
        mha::AttentionInputs in;
        in.query = mha::ConstBatch(q.data(), 1, L, E);
        attn.forward(in, {mha::Batch(out.data(), 1, L, E)}, opt);
        q = {};
        out = {};
        std::printf("after L = %5zu: RSS %.1f MiB\n", L, rss_mb());
    }
    const double end = rss_mb();
#ifndef MHA_SOAK_OLD_API
    std::printf("end: RSS %.1f MiB (cache holds %.1f MiB, limit %.0f MiB)\n", end, mha::scratch_cache_bytes() / 1048576.0,
                mha::scratch_cache_limit() / 1048576.0);
    std::printf("after release_scratch(): RSS %.1f MiB\n", (mha::release_scratch(), rss_mb()));
#else
    std::printf("end: RSS %.1f MiB\n", end);
#endif
    return 0;
}
