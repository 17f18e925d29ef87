#!/usr/bin/env bash
# Issue 14's figures (half precision), ours and the anchors alternately in ROUNDS rounds, medians:
#   FMA peak (fma_peak, one thread);
#   GEMM 1024×2304×768 (Linear layout) with the weights prepacked: fp32 (BM_Packed) and bf16 (BM_PackedBf16),
#     and oneDNN's bf16 matmul (bench/anchors/dnnl_matmul_bf16, weights reordered once), one thread;
#   self-attention E 768 H 12, B 8 L 128 and B 1 L 2048, fp32 vs bf16 compute (mha bench --op attention);
#   the decode step E 4096 H 32 Hkv 8 d 128 B 1 LK 32768 for (compute, KV cache) = (f32, f32), (f32, bf16),
#     (bf16, bf16), (bf16, f16) (mha bench --op decode --dtype --kv-type).
# Usage: tools/bf16_figures.sh [BUILD_DIR] [ANCHOR_DIR] [ROUNDS] [THREADS...]
#   ANCHOR_DIR: where ../shared/anchors/build.sh put fma_peak (dnnl_matmul_bf16 is looked for in BUILD_DIR/bench).
set -euo pipefail
build=${1:-build}
anchors=${2:-/tmp/mha-anchors}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
mha=$build/tools/mha
for ((i = 0; i < rounds; i++)); do
  echo "peak $("$anchors/fma_peak" 1 | grep -Eo '[0-9]+(\.[0-9]+)? GFLOP/s' | head -1 | cut -d' ' -f1)" >> "$out"
  "$build/bench/bench_gemm" --benchmark_filter='BM_PackedBf16/M:1024/N:2304/K:768/|BM_Packed/M:1024/N:2304/K:768/isa:2/' \
      --benchmark_format=json 2>/dev/null |
    python3 -c "import json,sys; [print('gemm', 'bf16' if 'Bf16' in b['name'] else 'f32', b['GFLOPS']) for b in json.load(sys.stdin)['benchmarks']]" >> "$out"
  if [ -x "$build/bench/dnnl_matmul_bf16" ]; then
    echo "gemm onednn_bf16 $("$build/bench/dnnl_matmul_bf16" 1024 2304 768 1 20 | grep -Eo 'gflops=[0-9.]+' | cut -d= -f2)" >> "$out"
  fi
  for t in "${threads[@]}"; do
    for shape in "8 128" "1 2048"; do
      set -- $shape
      for dtype in f32 bf16; do
        echo "attn $t $1 $2 $dtype $("$mha" bench --op attention --batch "$1" --seq "$2" --embed 768 --heads 12 --threads "$t" \
          --reps 5 --json --dtype $dtype)" >> "$out"
      done
    done
    for combo in f32:f32 f32:bf16 bf16:bf16 bf16:f16; do
      echo "decode $t $combo $("$mha" bench --op decode --batch 1 --kv-seq 32768 --embed 4096 --heads 32 --kv-heads 8 \
        --head-dim 128 --threads "$t" --reps 5 --json --dtype "${combo%%:*}" --kv-type "${combo##*:}")" >> "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
vals = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == 'peak':
        vals.setdefault(('peak',), []).append(float(f[1]))
    elif f[0] == 'gemm':
        vals.setdefault(('gemm', f[1]), []).append(float(f[2]))
    elif f[0] == 'attn':
        j = json.loads(line.split(maxsplit=5)[5])
        vals.setdefault(('attn', int(f[1]), f[2], f[3], f[4]), []).append(j['ms_median'])
    else:
        j = json.loads(line.split(maxsplit=3)[3])
        vals.setdefault(('decode', int(f[1]), f[2]), []).append((j['ms_median'], j.get('gbps', 0), j['isa']))
med = lambda k: st.median(vals[k])
print(f"FMA peak, 1 thread: {med(('peak',)):.1f} GFLOP/s")
g32, g16 = med(('gemm', 'f32')), med(('gemm', 'bf16'))
print(f"GEMM 1024x2304x768 prepacked, 1 thread: fp32 {g32:.1f}, bf16 {g16:.1f} GFLOP/s (x{g16 / g32:.2f})", end='')
if ('gemm', 'onednn_bf16') in vals:
    d = med(('gemm', 'onednn_bf16'))
    print(f"; oneDNN bf16 {d:.1f} (ours/oneDNN {g16 / d:.2f})", end='')
print()
for k in sorted(k for k in vals if k[0] == 'attn' and k[4] == 'f32'):
    a, b = med(k), med(k[:4] + ('bf16',))
    print(f"attention B {k[2]} L {k[3]} threads {k[1]}: fp32 {a:.2f} ms, bf16 {b:.2f} ms (x{a / b:.2f})")
for t in sorted({k[1] for k in vals if k[0] == 'decode'}):
    base = st.median(v[0] for v in vals[('decode', t, 'f32:f32')])
    for combo in ('f32:f32', 'f32:bf16', 'bf16:bf16', 'bf16:f16'):
        v = vals[('decode', t, combo)]
        ms, gb = st.median(x[0] for x in v), st.median(x[1] for x in v)
        print(f"decode LK 32768 threads {t} compute:cache {combo}: {ms:.2f} ms, {gb:.1f} GB/s (x{base / ms:.2f} vs f32:f32), isa {v[0][2]}")
PY
