// One thread's read bandwidth as a function of how many sequential streams it reads at once: an array of MB
// megabytes cut into S equal slices, summed slice by slice in lockstep (64 bytes of each slice in turn), REPS
// times after a warm-up pass; prints the median GB/s. With S = 1 it is read_bw's single stream. On a Zen 2
// core one stream reads about 10 GB/s and four about 15, so a kernel that reads one row after another is held
// below what the core can pull from memory (see docs/kv-cache-types.md).
// Usage: read_streams MB STREAMS REPS   (run pinned: taskset -c 1 read_streams 512 4 5)
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: read_streams MB STREAMS REPS\n");
        return 2;
    }
    const std::size_t mb = std::strtoul(argv[1], nullptr, 10), streams = std::strtoul(argv[2], nullptr, 10);
    const int reps = std::atoi(argv[3]);
    if (mb == 0 || streams == 0 || reps <= 0) {
        std::fprintf(stderr, "read_streams: MB, STREAMS and REPS must be positive\n");
        return 2;
    }
    constexpr std::size_t kLine = 16;  // floats per 64-byte line
    const std::size_t n = mb * (std::size_t(1) << 20) / sizeof(float), slice = n / streams / kLine * kLine;
    std::vector<float> a(n);
    for (std::size_t i = 0; i < n; ++i) a[i] = float(i & 7) * 0.125f;
    std::vector<double> seconds;
    double sink = 0;
    for (int r = 0; r <= reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        float acc[kLine] = {};
        for (std::size_t i = 0; i < slice; i += kLine)
            for (std::size_t s = 0; s < streams; ++s) {
                const float* p = a.data() + s * slice + i;
                for (std::size_t l = 0; l < kLine; ++l) acc[l] += p[l];
            }
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) seconds.push_back(t);  // the first pass is a warm-up
        for (float x : acc) sink += x;
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    std::printf("streams=%zu gbps=%.1f ms=%.3f (%zu MB, chk %g)\n", streams,
                double(slice * streams * sizeof(float)) / median / 1e9, median * 1e3, mb, sink);
    return 0;
}
