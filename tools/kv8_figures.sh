#!/usr/bin/env bash
# The figures of issue 23 (8-bit KV caches; docs/kv-quantization.md): per thread count, 5 alternating rounds of the decode
# step (B 1, LK 32768, bf16 compute) per cache type and f32, the attention core alone over one sequence of 32768 keys,
# read_bw on the int8 core's bytes, ggml_attn with q8_0, and 16 ragged decodes around 2048 keys (core and layer);
# medians. Usage: tools/kv8_figures.sh [BUILD_DIR] [ANCHOR_DIR]
A=${2:-/tmp/mha-anchors}; M=${1:-build}/tools/mha
shape="--embed 4096 --heads 32 --kv-heads 8 --head-dim 128"
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
f() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
for t in 1 2; do
  declare -A r=()
  for i in 1 2 3 4 5; do
    for k in bf16 int8 fp8_e4m3 fp8_e5m2; do
      r[dec_$k]+="$($M bench --op decode --batch 1 --kv-seq 32768 $shape --dtype bf16 --kv-type $k --threads $t --reps 10 --json | f ms_median) "
    done
    r[dec_f32]+="$($M bench --op decode --batch 1 --kv-seq 32768 $shape --threads $t --reps 10 --json | f ms_median) "
    for k in bf16 int8 fp8_e4m3; do
      j=$($M bench --op step $shape --decode-seqs 1 --kv-seq 32768 --core-only --block-size 256 --kv-type $k --threads $t --reps 10 --json)
      r[core_$k]+="$(echo $j | f ms_median) "; r[coregb_$k]+="$(echo $j | f kv_gbps) "
    done
    r[bw]+="$($A/read_bw 71 $t 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
    r[ggml]+="$($A/ggml_attn 1 1 32768 32 8 128 q8_0 $t 5 | sed 's/.*ms=\([0-9.]*\).*/\1/') "
    for k in bf16 int8; do
      r[p16_$k]+="$($M bench --op step $shape --decode-seqs 16 --kv-seq 2048 --ragged --core-only --kv-type $k --threads $t --reps 10 --json | f ms_median) "
      r[l16_$k]+="$($M bench --op step $shape --decode-seqs 16 --kv-seq 2048 --ragged --dtype bf16 --kv-type $k --threads $t --reps 10 --json | f ms_median) "
    done
  done
  echo "threads $t"
  for key in "${!r[@]}"; do echo "  $key $(echo ${r[$key]} | tr ' ' '\n' | med)   [${r[$key]}]"; done | sort
done
$A/fma_peak 1
