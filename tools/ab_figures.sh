#!/usr/bin/env bash
# Issue 20's "performance unchanged" check: two builds of the mha tool (e.g. before and after a restructure)
# run alternately, ROUNDS rounds, medians of the per-run median times, and the ratio new / old for:
#   BERT-base self-attention E 768 H 12, B 8 L 128 (fp32 and bf16 compute);
#   SDPA B 1 H 32 Hkv 8 d 128 L 2048 causal (the grouped path);
#   a decode step E 4096 H 32 Hkv 8 d 128, B 1, LK 8192 (f32 cache, and bf16 compute with a bf16 cache).
# Also fma_peak and read_bw from ANCHOR_DIR when present (../shared/anchors/README.md builds them).
# Usage: tools/ab_figures.sh OLD_BUILD NEW_BUILD [ROUNDS] [THREADS] [ANCHOR_DIR]
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} threads=${4:-1} anchors=${5:-/tmp/mha-anchors}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cases=(
  "attn_f32|--op attention --batch 8 --seq 128 --embed 768 --heads 12 --dtype f32 --reps 5"
  "attn_bf16|--op attention --batch 8 --seq 128 --embed 768 --heads 12 --dtype bf16 --reps 5"
  "sdpa|--op sdpa --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --seq 2048 --causal --reps 5"
  "decode_f32|--op decode --batch 1 --kv-seq 8192 --embed 4096 --heads 32 --kv-heads 8 --head-dim 128 --reps 9"
  "decode_bf16|--op decode --batch 1 --kv-seq 8192 --embed 4096 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --kv-type bf16 --reps 9"
)
for ((i = 0; i < rounds; i++)); do
  [ -x "$anchors/fma_peak" ] && echo "peak $("$anchors/fma_peak" 1 | grep -Eo '[0-9]+(\.[0-9]+)? GFLOP/s' | head -1 | cut -d' ' -f1)" >> "$out"
  [ -x "$anchors/read_bw" ] && echo "bw $("$anchors/read_bw" 268 1 5 | grep -Eo 'gbps=[0-9.]+' | cut -d= -f2)" >> "$out"
  for c in "${cases[@]}"; do
    name=${c%%|*} args=${c#*|}
    for which in old new; do
      dir=$old; [ $which = new ] && dir=$new
      echo "$name $which $("$dir/tools/mha" bench $args --threads "$threads" --json)" >> "$out"
    done
  done
done
python3 - "$out" "$threads" <<'PY'
import json, statistics as st, sys
vals = {}
for line in open(sys.argv[1]):
    f = line.split(maxsplit=2)
    if f[0] in ('peak', 'bw'):
        vals.setdefault((f[0],), []).append(float(f[1]))
        continue
    j = json.loads(f[2])
    vals.setdefault((f[0], f[1]), []).append((j['ms_median'], j.get('gflops') or j.get('gbps'), j.get('path', '')))
if ('peak',) in vals: print(f"fma_peak 1 thread: {st.median(vals[('peak',)]):.1f} GFLOP/s")
if ('bw',) in vals: print(f"read_bw 1 thread: {st.median(vals[('bw',)]):.1f} GB/s")
for name in dict.fromkeys(k[0] for k in vals if len(k) == 2):
    o = st.median(v[0] for v in vals[(name, 'old')]); n = st.median(v[0] for v in vals[(name, 'new')])
    rate = st.median(v[1] for v in vals[(name, 'new')])
    print(f"{name} threads {sys.argv[2]}: old {o:.3f} ms, new {n:.3f} ms, new/old {n / o:.3f} (new rate {rate:.1f}) {vals[(name, 'new')][0][2]}")
PY
