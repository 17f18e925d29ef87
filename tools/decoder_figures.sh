#!/usr/bin/env bash
# The figures of issue 12 (decoder attention), ours and the anchors alternately, medians of ROUNDS rounds:
#   FMA peak; mha bench --op sdpa at B=1 H=32 Hkv=8 d=128 L=2048 (no mask, causal) vs ggml's flash_attn_ext;
#   the KV-group sweep Hkv ∈ {1,2,4,8,32}; --op attention with Llama-7B-like shapes, RoPE on and off.
# Usage: tools/decoder_figures.sh [BUILD_DIR] [ANCHOR_DIR] [ROUNDS] [THREADS...]
#   ANCHOR_DIR: the folder ../shared/anchors/build.sh printed (ggml_attn, fma_peak); THREADS default "1 N".
set -euo pipefail
build=${1:-build}
anchors=${2:-/tmp/mha-anchors}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 "$(nproc)")
mha="$build/tools/mha"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
calc() { awk "BEGIN {print $1}"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

for t in "${threads[@]}"; do
  declare -A r=()
  for ((i = 0; i < rounds; i++)); do
    r[peak]+="$("$anchors/fma_peak" "$t" | awk '{print $2}') "
    r[sdpa]+="$("$mha" bench --op sdpa --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --seq 2048 --kv-seq 2048 --threads "$t" --reps 3 --json | field gflops) "
    r[ggml]+="$("$anchors/ggml_attn" 1 2048 2048 32 8 128 f32 "$t" 3 | sed 's/.*gflops=\([0-9.]*\).*/\1/') "
    r[causal]+="$("$mha" bench --op sdpa --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --seq 2048 --kv-seq 2048 --causal --threads "$t" --reps 3 --json | field gflops) "
    for hkv in 1 2 4 32; do
      r[hkv$hkv]+="$("$mha" bench --op sdpa --batch 1 --heads 32 --kv-heads $hkv --head-dim 128 --seq 2048 --kv-seq 2048 --threads "$t" --reps 3 --json | field gflops) "
    done
    for hkv in 8 32; do
      for rope in off on; do
        flag=(); [ $rope = on ] && flag=(--rope-theta 10000)
        r[llama$hkv$rope]+="$("$mha" bench --op attention --batch 1 --seq 512 --embed 4096 --heads 32 --kv-heads $hkv --head-dim 128 "${flag[@]}" --threads "$t" --reps 3 --json | field ms_median) "
        r[llamag$hkv$rope]+="$("$mha" bench --op attention --batch 1 --seq 512 --embed 4096 --heads 32 --kv-heads $hkv --head-dim 128 "${flag[@]}" --threads "$t" --reps 3 --json | field gflops) "
      done
    done
  done
  m() { echo ${r[$1]} | tr ' ' '\n' | median; }
  peak=$(m peak)
  echo "threads $t: FMA peak $peak GFLOP/s (median of $rounds)"
  printf '  sdpa H32 Hkv8 d128 L2048         %7.1f GFLOP/s  %5.1f %% of peak  ggml %6.1f  ratio %.2f\n' "$(m sdpa)" "$(calc "$(m sdpa) * 100 / $peak")" "$(m ggml)" "$(calc "$(m sdpa) / $(m ggml)")"
  printf '  sdpa causal (visible pairs)      %7.1f GFLOP/s  %5.1f %% of peak\n' "$(m causal)" "$(calc "$(m causal) * 100 / $peak")"
  for hkv in 1 2 4 32; do printf '  sdpa Hkv %-2s                      %7.1f GFLOP/s\n' $hkv "$(m hkv$hkv)"; done
  for hkv in 8 32; do
    printf '  attention E4096 H32 Hkv%-2s L512   rope off %7.1f ms %6.1f GFLOP/s | on %7.1f ms %6.1f GFLOP/s (%5.1f %% of peak)  rope cost %+.1f %%\n' $hkv \
      "$(m llama${hkv}off)" "$(m llamag${hkv}off)" "$(m llama${hkv}on)" "$(m llamag${hkv}on)" "$(calc "$(m llamag${hkv}on) * 100 / $peak")" \
      "$(calc "($(m llama${hkv}on) - $(m llama${hkv}off)) * 100 / $(m llama${hkv}off)")"
  done
  unset r
done
