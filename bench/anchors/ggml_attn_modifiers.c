// ggml's CPU flash attention (ggml_flash_attn_ext) with the score modifiers of issue 24, as an anchor for
// `mha bench --op sdpa` with the same flags: a causal mask (an f16 [Lk, Lq padded] mask of 0 / -inf, which is how
// llama.cpp gives ggml causality and sliding windows), a left window, logit softcap, ALiBi (max_bias 8: BLOOM's
// slopes; ggml multiplies the mask by the slope, so the mask holds −(p_i − j) for visible keys) and sinks
// (ggml_flash_attn_ext_add_sinks, one logit per head). K and V f32; one sequence, queries at the last Lq of Lk
// positions. Built against the anchors' ggml (../shared/anchors/build.sh) by tools/modifier_figures.sh.
// Prints `anchor ms=<median> gflops=<4·H·d·visible pairs / t>`.
// Usage: ggml_attn_modifiers LQ LK H HKV D THREADS REPS WINDOW_LEFT SOFTCAP ALIBI(0|1) SINKS(0|1)
//        (WINDOW_LEFT -1: none; SOFTCAP 0: none)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmp(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static void fill(struct ggml_tensor* t, unsigned* s) {
    float* x = (float*)t->data;
    for (int64_t i = 0; i < ggml_nelements(t); ++i) {
        *s = *s * 1664525u + 1013904223u;
        x[i] = ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
    }
}

int main(int argc, char** argv) {
    if (argc < 12) {
        fprintf(stderr, "usage: ggml_attn_modifiers LQ LK H HKV D THREADS REPS WINDOW_LEFT SOFTCAP ALIBI SINKS\n");
        return 2;
    }
    const int Lq = atoi(argv[1]), Lk = atoi(argv[2]), H = atoi(argv[3]), Hkv = atoi(argv[4]), d = atoi(argv[5]);
    const int T = atoi(argv[6]), reps = atoi(argv[7]), left = atoi(argv[8]), alibi = atoi(argv[10]), sinks = atoi(argv[11]);
    const float softcap = (float)atof(argv[9]);
    const int Lq_pad = (Lq + 63) / 64 * 64;
    const size_t mem = (size_t)H * Lq * d * 4 * 2 + (size_t)Hkv * Lk * d * 4 * 2 + (size_t)Lk * Lq_pad * 2 + (size_t)H * 4 +
                       ((size_t)256 << 20);
    struct ggml_init_params ip = {mem, NULL, false};
    struct ggml_context* ctx = ggml_init(ip);
    struct ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, Lq, H, 1);
    struct ggml_tensor* k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, Lk, Hkv, 1);
    struct ggml_tensor* v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, Lk, Hkv, 1);
    struct ggml_tensor* mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, Lk, Lq_pad);
    unsigned s = 12345u;
    fill(q, &s), fill(k, &s), fill(v, &s);
    double pairs = 0;
    ggml_fp16_t* m = (ggml_fp16_t*)mask->data;
    for (int i = 0; i < Lq_pad; ++i) {
        const int p = i + Lk - Lq;
        for (int j = 0; j < Lk; ++j) {
            const int visible = i < Lq && j <= p && (left < 0 || j >= p - left);
            pairs += visible;
            m[(size_t)i * Lk + j] = ggml_fp32_to_fp16(!visible ? -INFINITY : alibi ? -(float)(p - j) : 0.0f);
        }
    }
    struct ggml_tensor* o = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / sqrtf((float)d), alibi ? 8.0f : 0.0f, softcap);
    ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
    if (sinks) {
        struct ggml_tensor* sk = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, H);
        fill(sk, &s);
        ggml_flash_attn_ext_add_sinks(o, sk);
    }
    struct ggml_cgraph* gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o);
    ggml_graph_compute_with_ctx(ctx, gf, T);  // warm-up
    double* ts = malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; ++r) {
        const double t0 = now();
        ggml_graph_compute_with_ctx(ctx, gf, T);
        ts[r] = now() - t0;
    }
    qsort(ts, reps, sizeof(double), cmp);
    const double med = ts[reps / 2];
    printf("anchor ms=%.3f gflops=%.1f\n", med * 1e3, 4.0 * H * d * pairs / med / 1e9);
    ggml_free(ctx);
    free(ts);
    return 0;
}
