// probe_vnni_scores: what the decode scores of an int8 cache would gain on vpdpbusd (AVX512_VNNI), measured
// against the library's widened kernel (mha::simd::decode_scores) on the same rows in cache (issue 23: "integer
// dot products against Q quantized per block, or rows widened in registers: measure and choose").
//   widened: the library's kernel: each key value sign-extended, converted, times its block's float16 scale, and
//            fp32 FMAs against the float query rows.
//   vnni:    a probe kernel, not the library's: Q quantized to the cache's own int8 row format (blocks of 32 with a
//            float16 scale: mha::quantize_row_int8), K read as unsigned (k + 128, an xor) so vpdpbusd takes it,
//            each 32-bit lane's dot of 4 bytes started at -128·(the lane's 4 query bytes summed); per lane the
//            exact int32 is converted and multiplied by s_q·s_k (exact: two float16) into an fp32 accumulator.
// Keys: n rows of d values (L2-resident), M query rows, one thread. Prints ns per key, GFLOP/s counted as
// 2·M·d per key, the probe's error against an exact evaluation of its own quantized inputs, and the error that
// quantizing Q adds to the scores (against the float query's exact scores), both relative to the RMS score.
// Usage: probe_vnni_scores [M=4] [n=512] [iterations=20000]. x86-64 with AVX512_VNNI only; elsewhere it says so.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <mha/mha.hpp>

#include "simd/simd.hpp"

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* operands) when they are inlined into a
// function with a target attribute: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define PROBE_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

namespace {

constexpr std::size_t kD = 128, kBlocks = kD / 32, kRow = kD + 2 * kBlocks;

// Lane 4b + i of the result: the sum of v_i's lanes in 128-bit block b (pairs, then pairs of pairs).
PROBE_TARGET inline __m512 block_sums4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
    const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
// Lane 4m + t: the lane sum of acc[m][t].
PROBE_TARGET inline __m512 reduce16(const __m512 (&acc)[4][4]) {
    const __m512 c0 = block_sums4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    const __m512 c1 = block_sums4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
    const __m512 c2 = block_sums4(acc[2][0], acc[2][1], acc[2][2], acc[2][3]);
    const __m512 c3 = block_sums4(acc[3][0], acc[3][1], acc[3][2], acc[3][3]);
    const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x44), _mm512_shuffle_f32x4(c0, c1, 0xEE));
    const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c2, c3, 0x44), _mm512_shuffle_f32x4(c2, c3, 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, 0x88), _mm512_shuffle_f32x4(e01, e23, 0xDD));
}

// Query rows quantized for the probe: per row and 64-byte chunk, the bytes, the lanes' starting values and the
// lanes' query scales ([s_2c] × 8, [s_2c+1] × 8).
struct QuantizedQueries {
    std::size_t rows = 0;
    std::vector<std::int8_t> bytes;     // [rows, d]
    std::vector<std::int32_t> start;    // [rows, d / 64, 16]
    std::vector<float> lane_scale;      // [rows, d / 64, 16]
};

QuantizedQueries quantize_queries(const std::vector<float>& q, std::size_t rows) {
    QuantizedQueries z;
    z.rows = rows;
    z.bytes.resize(rows * kD);
    z.start.resize(rows * kD / 4);
    z.lane_scale.resize(rows * kD / 4);
    std::vector<unsigned char> row(kRow);
    for (std::size_t m = 0; m < rows; ++m) {
        mha::quantize_row_int8(q.data() + m * kD, kD, row.data());
        std::memcpy(z.bytes.data() + m * kD, row.data(), kD);
        for (std::size_t lane = 0; lane < kD / 4; ++lane) {
            int sum = 0;
            for (std::size_t i = 0; i < 4; ++i) sum += z.bytes[m * kD + 4 * lane + i];
            z.start[m * kD / 4 + lane] = -128 * sum;
            z.lane_scale[m * kD / 4 + lane] = mha::int8_row_scale(row.data(), kD, 4 * lane / 32);
        }
    }
    return z;
}

// s[m, j] = scale·Σ_b s_q,b·s_k,b·Σ_{c in b} q_c·k_c for query rows [m0, m0 + MR), keys j < n (a multiple of 4).
// Every loop has constant bounds, so that both compilers keep the 16 accumulators in registers.
template <std::size_t MR>
PROBE_TARGET __attribute__((noinline)) void scores_vnni_tile(const QuantizedQueries& q, std::size_t m0, const unsigned char* k,
                                                              std::size_t n, float scale, float* s) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m256i pick = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (std::size_t j = 0; j < n; j += 4) {
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (std::size_t m = 0; m < 4; ++m)
#pragma GCC unroll 4
            for (std::size_t t = 0; t < 4; ++t) acc[m][t] = _mm512_setzero_ps();
#pragma GCC unroll 2
        for (std::size_t c = 0; c < kD / 64; ++c) {
            __m512i kv[4];
            __m512 ks[4];
#pragma GCC unroll 4
            for (std::size_t t = 0; t < 4; ++t) {
                const unsigned char* row = k + (j + t) * kRow;
                kv[t] = _mm512_xor_si512(_mm512_loadu_si512(row + 64 * c), flip);
                std::uint32_t two;
                std::memcpy(&two, row + kD + 4 * c, 4);  // the float16 scales of blocks 2c and 2c + 1
                ks[t] = _mm512_cvtph_ps(_mm256_permutexvar_epi16(pick, _mm256_set1_epi32(static_cast<int>(two))));
            }
#pragma GCC unroll 4
            for (std::size_t m = 0; m < MR; ++m) {
                const std::size_t at = (m0 + m) * kD / 4 + 16 * c;
                const __m512i qv = _mm512_loadu_si512(q.bytes.data() + (m0 + m) * kD + 64 * c);
                const __m512i start = _mm512_loadu_si512(q.start.data() + at);
                const __m512 qs = _mm512_loadu_ps(q.lane_scale.data() + at);
#pragma GCC unroll 4
                for (std::size_t t = 0; t < 4; ++t) {
                    const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, kv[t], qv));
                    acc[m][t] = _mm512_fmadd_ps(dot, _mm512_mul_ps(ks[t], qs), acc[m][t]);
                }
            }
        }
        alignas(64) float out[16];
        _mm512_store_ps(out, _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale)));
        for (std::size_t m = 0; m < MR; ++m)
            for (std::size_t t = 0; t < 4; ++t) s[(m0 + m) * n + j + t] = out[4 * m + t];
    }
}

// All M query rows, in tiles of 4.
void scores_vnni(const QuantizedQueries& q, const unsigned char* k, std::size_t n, float scale, float* s) {
    for (std::size_t m0 = 0; m0 < q.rows; m0 += 4) {
        switch (q.rows - m0 < 4 ? q.rows - m0 : 4) {
            case 1: scores_vnni_tile<1>(q, m0, k, n, scale, s); break;
            case 2: scores_vnni_tile<2>(q, m0, k, n, scale, s); break;
            case 3: scores_vnni_tile<3>(q, m0, k, n, scale, s); break;
            default: scores_vnni_tile<4>(q, m0, k, n, scale, s); break;
        }
    }
}

template <class F>
double ns_per_key(F&& f, std::size_t n, int iterations) {
    f();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
        f();
        asm volatile("" ::: "memory");
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iterations / double(n);
}

}  // namespace

int main(int argc, char** argv) {
    const std::size_t M = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4;
    const std::size_t n = argc > 2 ? std::strtoul(argv[2], nullptr, 10) / 4 * 4 : 512;
    const int iterations = argc > 3 ? std::atoi(argv[3]) : 20000;
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) {
        std::printf("probe_vnni_scores: this CPU has no AVX512_VNNI; nothing measured\n");
        return 0;
    }
    if (M == 0 || n == 0 || iterations <= 0) {
        std::fprintf(stderr, "usage: probe_vnni_scores [M >= 1] [n >= 4] [iterations >= 1]\n");
        return 2;
    }
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(M * kD), kf(n * kD);
    for (float& x : q) x = normal(gen);
    for (float& x : kf) x = normal(gen);
    std::vector<unsigned char> k(n * kRow);
    for (std::size_t j = 0; j < n; ++j) mha::quantize_row_int8(kf.data() + j * kD, kD, k.data() + j * kRow);
    const float scale = 1.0f / std::sqrt(float(kD));
    const QuantizedQueries qq = quantize_queries(q, M);
    std::vector<float> s_widened(M * n), s_vnni(M * n);
    const mha::MatrixView<const mha::qint8> kv(reinterpret_cast<const mha::qint8*>(k.data()), n, kD, kRow);
    const mha::ConstMatrix qm(q.data(), M, kD, kD);
    const double t_widened =
        ns_per_key([&] { mha::simd::decode_scores(scale, qm, kv, mha::Matrix(s_widened.data(), M, n, n)); }, n, iterations);
    const double t_vnni = ns_per_key([&] { scores_vnni(qq, k.data(), n, scale, s_vnni.data()); }, n, iterations);

    // Errors, relative to the RMS score: the probe against an exact evaluation of its quantized inputs, and that
    // evaluation against the float query's exact scores (what quantizing Q adds).
    double rms = 0, probe_err = 0, q_err = 0;
    std::vector<float> deq(kD), qdeq(kD);
    for (std::size_t m = 0; m < M; ++m) {
        std::vector<unsigned char> qrow(kRow);
        mha::quantize_row_int8(q.data() + m * kD, kD, qrow.data());
        mha::dequantize_row_int8(qrow.data(), kD, qdeq.data());
        for (std::size_t j = 0; j < n; ++j) {
            mha::dequantize_row_int8(k.data() + j * kRow, kD, deq.data());
            double exact_quantized = 0, exact_float = 0;
            for (std::size_t c = 0; c < kD; ++c) {
                exact_quantized += double(qdeq[c]) * deq[c];
                exact_float += double(q[m * kD + c]) * deq[c];
            }
            exact_quantized *= scale, exact_float *= scale;
            rms += exact_float * exact_float;
            probe_err = std::fmax(probe_err, std::fabs(s_vnni[m * n + j] - exact_quantized));
            q_err = std::fmax(q_err, std::fabs(exact_quantized - exact_float));
        }
    }
    rms = std::sqrt(rms / double(M * n));
    const double flops = 2.0 * double(M) * kD;
    std::printf("M %zu, d %zu, %zu keys (%zu KB), %d iterations, one thread\n", M, kD, n, n * kRow / 1024, iterations);
    std::printf("  widened (library): %7.3f ns/key  %7.1f GFLOP/s\n", t_widened, flops / t_widened);
    std::printf("  vnni (probe):      %7.3f ns/key  %7.1f GFLOP/s  (%.2fx)\n", t_vnni, flops / t_vnni, t_widened / t_vnni);
    std::printf("  probe vs its exact: max %.2e of the RMS score; Q quantized vs float Q: max %.2e of the RMS score\n",
                probe_err / rms, q_err / rms);
    return probe_err / rms < 1e-5 ? 0 : 1;
}

#else
int main() {
    std::printf("probe_vnni_scores: x86-64 only; nothing measured\n");
    return 0;
}
#endif
