#!/usr/bin/env bash
# Issue 14's decode figures for the KV cache element types, alternately and in ROUNDS rounds, medians:
#   the full decode step (mha bench --op decode, E=4096 H=32 Hkv=8 d=128, B=1) at LK = 32768 with --kv-type
#   f32, bf16, f16 on each thread count, and at LK = 1 (the projections alone, ~168 MB of fp32 weights); the
#   attention core's part is the difference of the two, its GB/s the cache bytes over that time;
#   the decode kernels alone (bench_decode decode/M:4/d:128: one thread, K and V of 8 heads × 32768 rows).
# Usage: tools/kv_type_figures.sh [BUILD_DIR] [ROUNDS] [THREADS...]
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 0; i < rounds; i++)); do
  for t in "${threads[@]}"; do
    for type in f32 bf16 f16; do
      for lk in 32768 1; do
        echo "step $t $type $lk $("$build/tools/mha" bench --op decode --batch 1 --kv-seq $lk --embed 4096 --heads 32 --kv-heads 8 \
          --head-dim 128 --threads "$t" --reps 5 --json --kv-type $type)" >> "$out"
      done
    done
  done
  "$build/bench/bench_decode" --benchmark_filter='decode/M:4/d:128/' --benchmark_format=json 2>/dev/null |
    python3 -c "import json,sys; [print('kernel', b['name'].split(':')[-1], b['real_time']) for b in json.load(sys.stdin)['benchmarks']]" >> "$out"
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
step, kernel = {}, {}
for line in open(sys.argv[1]):
    f = line.split(maxsplit=4)
    if f[0] == 'step':
        step.setdefault((int(f[1]), f[2], int(f[3])), []).append(json.loads(f[4]))
    else:
        kernel.setdefault(int(f[1]), []).append(float(f[2]))
for t in sorted({k[0] for k in step}):
    base = None
    for ty in ('f32', 'bf16', 'f16'):
        a, b = step[(t, ty, 32768)], step[(t, ty, 1)]
        ms, ms1 = st.median(x['ms_median'] for x in a), st.median(x['ms_median'] for x in b)
        core, cache = ms - ms1, a[0]['cache_bytes']
        if ty == 'f32': base = (ms, core)
        print(f"threads {t} {ty:4} step {ms:6.2f} ms ({st.median(x['gbps'] for x in a):5.1f} GB/s)  LK=1 {ms1:6.2f} ms  "
              f"core {core:6.2f} ms ({cache / core / 1e6:5.1f} GB/s)  f32/{ty}: step {base[0] / ms:.2f}, core {base[1] / core:.2f}")
names = {0: 'f32', 1: 'bf16', 2: 'f16'}
for k in sorted(kernel):
    ms = st.median(kernel[k])
    print(f"kernels decode/M:4/d:128 {names[k]:4} {ms:6.2f} ms ({2 * 8 * 32768 * 128 * (4 if k == 0 else 2) / ms / 1e6:5.1f} GB/s)"
          f"  f32/{names[k]}: {st.median(kernel[0]) / ms:.2f}")
PY
