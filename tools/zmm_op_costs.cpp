// Throughput of the 512-bit instructions the int8 decode kernels are made of, alone and in pairs, in units of one
// independent vfmadd231ps zmm (measured in the same run; 1 per cycle on Zen 4 and most AVX-512 cores). It shows
// what a kernel's instruction mix costs where there are no performance counters (cloud guests). x86-64 with
// AVX512_VNNI only; not part of the build:
//   g++ -O2 -march=native -o /tmp/zmm_op_costs tools/zmm_op_costs.cpp && taskset -c 1 /tmp/zmm_op_costs
// Each test runs 12 independent instructions (or 6 pairs) per iteration into zmm0..zmm11 from zmm20 and zmm21.
#include <chrono>
#include <cstdio>

namespace {

constexpr long kIterations = 50000000;

#define MHA_X12(I) I(0) I(1) I(2) I(3) I(4) I(5) I(6) I(7) I(8) I(9) I(10) I(11)
#define MHA_X6(I) I(0, 6) I(1, 7) I(2, 8) I(3, 9) I(4, 10) I(5, 11)
#define MHA_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"
// Nanoseconds per instruction (per pair with MHA_X6) of the block `text`.
#define MHA_TIME(per, text)                                                                          \
    [] {                                                                                             \
        const auto t0 = std::chrono::steady_clock::now();                                            \
        for (long k = 0; k < kIterations; ++k) asm volatile(text ::: MHA_CLOBBERS);                  \
        const std::chrono::duration<double> t = std::chrono::steady_clock::now() - t0;               \
        return t.count() * 1e9 / (kIterations * double(per));                                        \
    }()

#define FMA(i) "vfmadd231ps %%zmm20, %%zmm21, %%zmm" #i "\n\t"
#define DPWSSD(i) "vpdpwssd %%zmm20, %%zmm21, %%zmm" #i "\n\t"
#define DPBUSD(i) "vpdpbusd %%zmm20, %%zmm21, %%zmm" #i "\n\t"
#define UNPCKLDQ(i) "vpunpckldq %%zmm20, %%zmm21, %%zmm" #i "\n\t"
#define SHUFI32X4(i) "vshufi32x4 $0x88, %%zmm20, %%zmm21, %%zmm" #i "\n\t"
#define PMOVSXBW(i) "vpmovsxbw %%ymm20, %%zmm" #i "\n\t"
#define PUNPCKLBW_Y(i) "vpunpcklbw %%ymm20, %%ymm21, %%ymm" #i "\n\t"
#define CVTDQ2PS(i) "vcvtdq2ps %%zmm20, %%zmm" #i "\n\t"
#define BROADCAST(i) "vpbroadcastd (%%rsp), %%zmm" #i "\n\t"
#define DPWSSD_PMOVSXBW(i, j) DPWSSD(i) PMOVSXBW(j)
#define DPBUSD_SHUFI32X4(i, j) DPBUSD(i) SHUFI32X4(j)
#define DPBUSD_UNPCKLDQ(i, j) DPBUSD(i) UNPCKLDQ(j)
#define DPBUSD_CVTDQ2PS(i, j) DPBUSD(i) CVTDQ2PS(j)
#define DPBUSD_BROADCAST(i, j) DPBUSD(i) BROADCAST(j)
#define DPBUSD_PXORD(i, j) DPBUSD(i) "vpxord %%zmm20, %%zmm21, %%zmm" #j "\n\t"
#define FMA_DPWSSD(i, j) FMA(i) DPWSSD(j)

}  // namespace

int main() {
    asm volatile("vpxord %%zmm20, %%zmm20, %%zmm20\n\tvpxord %%zmm21, %%zmm21, %%zmm21" ::: "xmm20", "xmm21");
    const double fma = MHA_TIME(12, MHA_X12(FMA));
    struct Row {
        const char* name;
        double ns;
    };
    const Row single[] = {
        {"vpdpwssd zmm", MHA_TIME(12, MHA_X12(DPWSSD))},         {"vpdpbusd zmm", MHA_TIME(12, MHA_X12(DPBUSD))},
        {"vpunpckldq zmm", MHA_TIME(12, MHA_X12(UNPCKLDQ))},     {"vshufi32x4 zmm", MHA_TIME(12, MHA_X12(SHUFI32X4))},
        {"vpmovsxbw ymm->zmm", MHA_TIME(12, MHA_X12(PMOVSXBW))}, {"vpunpcklbw ymm", MHA_TIME(12, MHA_X12(PUNPCKLBW_Y))},
        {"vcvtdq2ps zmm", MHA_TIME(12, MHA_X12(CVTDQ2PS))},      {"vpbroadcastd m32->zmm", MHA_TIME(12, MHA_X12(BROADCAST))},
    };
    const Row pairs[] = {
        {"vpdpwssd + vpmovsxbw", MHA_TIME(6, MHA_X6(DPWSSD_PMOVSXBW))}, {"vpdpbusd + vshufi32x4", MHA_TIME(6, MHA_X6(DPBUSD_SHUFI32X4))},
        {"vpdpbusd + vpunpckldq", MHA_TIME(6, MHA_X6(DPBUSD_UNPCKLDQ))}, {"vpdpbusd + vcvtdq2ps", MHA_TIME(6, MHA_X6(DPBUSD_CVTDQ2PS))},
        {"vpdpbusd + vpxord", MHA_TIME(6, MHA_X6(DPBUSD_PXORD))},       {"vpdpbusd + vpbroadcastd m32", MHA_TIME(6, MHA_X6(DPBUSD_BROADCAST))},
        {"vfmadd231ps + vpdpwssd", MHA_TIME(6, MHA_X6(FMA_DPWSSD))},
    };
    std::printf("vfmadd231ps zmm: %.4f ns each (the unit below)\n", fma);
    for (const Row& r : single) std::printf("  %-30s %.2f\n", r.name, r.ns / fma);
    std::printf("pairs (per pair):\n");
    for (const Row& r : pairs) std::printf("  %-30s %.2f\n", r.name, r.ns / fma);
}
