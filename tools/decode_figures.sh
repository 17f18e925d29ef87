#!/usr/bin/env bash
# The figures of issue 13 (KV cache and decode), ours and the anchors alternately, medians of ROUNDS rounds:
#   the attention core at Lq = 1 (B=1 H=32 Hkv=8 d=128, Lk 4096 and 32768) in GB/s of K and V, against
#   read_bw on the same threads and a working set of the same size, and ggml's flash_attn_ext (f32 cache);
#   the full Llama-7B-like decode step (mha bench --op decode, E=4096 H=32 Hkv=8 d=128, RoPE) at B 1 and 8,
#   LK 1024 and 8192, in GB/s of weights + cache against read_bw 256 MB.
# Usage: tools/decode_figures.sh [BUILD_DIR] [ANCHOR_DIR] [ROUNDS] [THREADS...]
set -euo pipefail
build=${1:-build}
anchors=${2:-/tmp/mha-anchors}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 "$(nproc)")
mha="$build/tools/mha"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
calc() { awk "BEGIN {print $1}"; }
for t in "${threads[@]}"; do
  declare -A r=()
  for ((i = 0; i < rounds; i++)); do
    for lk in 4096 32768; do
      mb=$(( 2 * 8 * lk * 128 * 4 / 1000000 ))  # the K/V working set in MB
      r[ours$lk]+="$("$mha" bench --op sdpa --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --seq 1 --kv-seq $lk --threads "$t" --reps 20 --json | field gbps) "
      r[bw$lk]+="$("$anchors/read_bw" $mb "$t" 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
      r[ggml$lk]+="$("$anchors/ggml_attn" 1 1 $lk 32 8 128 f32 "$t" 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
    done
    r[bw256]+="$("$anchors/read_bw" 256 "$t" 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
    for b in 1 8; do
      for lk in 1024 8192; do
        r[step$b$lk]+="$("$mha" bench --op decode --batch $b --kv-seq $lk --embed 4096 --heads 32 --kv-heads 8 --head-dim 128 --rope-theta 10000 --threads "$t" --reps 10 --json | field gbps) "
      done
    done
  done
  m() { echo ${r[$1]} | tr ' ' '\n' | median; }
  echo "threads $t (medians of $rounds)"
  for lk in 4096 32768; do
    printf '  core Lq=1 Lk=%-6s K/V %6.1f GB/s  read_bw(same size) %6.1f  = %5.1f %%   ggml %5.1f GB/s  ratio %.2f\n' $lk \
      "$(m ours$lk)" "$(m bw$lk)" "$(calc "$(m ours$lk) * 100 / $(m bw$lk)")" "$(m ggml$lk)" "$(calc "$(m ours$lk) / $(m ggml$lk)")"
  done
  for b in 1 8; do
    for lk in 1024 8192; do
      printf '  decode step B=%s LK=%-5s %6.1f GB/s  = %5.1f %% of read_bw 256 MB (%.1f)\n' $b $lk "$(m step$b$lk)" \
        "$(calc "$(m step$b$lk) * 100 / $(m bw256)")" "$(m bw256)"
    done
  done
  unset r
done
