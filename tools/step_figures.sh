#!/usr/bin/env bash
# The figures of issue 22 (paged KV cache, variable-length steps), ours and the anchors alternately, medians
# of ROUNDS rounds (H=32 Hkv=8 d=128 throughout):
#   core:  16 decode sequences ragged around 2048 keys (1024 .. 3072), f32 (mha bench --op step --core-only):
#          K/V GB/s against read_bw on a working set of the same size, and ggml_batch streams on the same spec;
#   mixed: the same 16 decodes + 2 prefill chunks of 256 tokens on 256 cached keys, core only: ms against
#          ggml_batch streams (decode call + prefill call, as llama.cpp runs them in separate ubatches) and the
#          roofline K/V bytes / read_bw + prefill FLOPs / (0.85 · fma_peak), and the floor at the full peak (the
#          best ratio over ggml the machine allows);
#   layer: E=4096, 32 ragged decodes around 2048, bf16 compute and bf16 cache: ms against
#          (weight bytes read + K/V bytes) / read_bw, and its attention core alone (K/V GB/s);
#   paged vs contiguous: the full decode step of 16 sequences at 2048 keys (mha bench --op decode, a KVCache)
#          against --op step with block sizes 16, 64 and 256 (f32).
# Usage: tools/step_figures.sh [BUILD_DIR] [ANCHOR_DIR] [ROUNDS] [THREADS...]
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
anchor_ms() { sed 's/.*ms=\([0-9.]*\).*/\1/'; }
shape=(--embed 4096 --heads 32 --kv-heads 8 --head-dim 128)
# The ragged decode lengths of mha bench --ragged (LK/2 + i·LK/(N−1)), each + 1 key for its new token.
spec=""
for ((i = 0; i < 16; i++)); do spec+="1:$(( 1024 + i * 2048 / 15 + 1 )) "; done
peak=$("$anchors/fma_peak" 1 | awk '{print $2}')
for t in "${threads[@]}"; do
  declare -A r=()
  for ((i = 0; i < rounds; i++)); do
    j=$("$mha" bench --op step "${shape[@]}" --decode-seqs 16 --kv-seq 2048 --ragged --core-only --threads "$t" --reps 20 --json)
    r[core]+="$(echo "$j" | field kv_gbps) "
    mb=$(echo "$j" | python3 -c "import json,sys; print(int(json.load(sys.stdin)['kv_bytes'] / 1e6))")
    r[bw]+="$("$anchors/read_bw" "$mb" "$t" 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
    r[ggml_dec]+="$("$anchors/ggml_batch" streams 32 8 128 f32 "$t" 10 $spec | anchor_ms) "
    r[core_ms]+="$(echo "$j" | field ms_median) "
    j=$("$mha" bench --op step "${shape[@]}" --decode-seqs 16 --kv-seq 2048 --ragged --prefill-seqs 2 --prefill-len 256 \
        --prefill-past 256 --core-only --threads "$t" --reps 20 --json)
    r[mixed]+="$(echo "$j" | field ms_median) "
    r[mixed_kv]+="$(echo "$j" | field kv_bytes) "
    r[ggml_pre]+="$("$anchors/ggml_batch" streams 32 8 128 f32 "$t" 10 2x256:512 | anchor_ms) "
    j=$("$mha" bench --op step "${shape[@]}" --decode-seqs 32 --kv-seq 2048 --ragged --dtype bf16 --kv-type bf16 --threads "$t" \
        --reps 10 --json)
    r[layer]+="$(echo "$j" | field ms_median) "
    r[layer_bytes]+="$(echo "$j" | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['weight_bytes'] + j['kv_bytes'])") "
    j=$("$mha" bench --op step "${shape[@]}" --decode-seqs 32 --kv-seq 2048 --ragged --kv-type bf16 --core-only --threads "$t" \
        --reps 10 --json)
    r[layer_core]+="$(echo "$j" | field ms_median) "
    r[layer_core_gbps]+="$(echo "$j" | field kv_gbps) "
    r[bw_layer]+="$("$anchors/read_bw" 512 "$t" 10 | sed 's/.*gbps=\([0-9.]*\).*/\1/') "
    r[contig]+="$("$mha" bench --op decode --batch 16 --kv-seq 2048 "${shape[@]}" --threads "$t" --reps 10 --json | field ms_median) "
    for bs in 16 64 256; do
      r[paged$bs]+="$("$mha" bench --op step "${shape[@]}" --decode-seqs 16 --kv-seq 2048 --block-size $bs --threads "$t" --reps 10 --json | field ms_median) "
    done
  done
  m() { echo ${r[$1]} | tr ' ' '\n' | median; }
  echo "threads $t (medians of $rounds; fma_peak(1 thread) $peak GFLOP/s)"
  printf '  core 16 ragged decodes ~2048: K/V %6.2f GB/s  read_bw(same size) %6.2f  = %5.1f %%   %.3f ms vs ggml streams %.3f ms (%.2fx)\n' \
    "$(m core)" "$(m bw)" "$(calc "$(m core) * 100 / $(m bw)")" "$(m core_ms)" "$(m ggml_dec)" "$(calc "$(m ggml_dec) / $(m core_ms)")"
  flops=$(calc "4 * 32 * 128 * 2 * (256 * 256 + 256 * 257 / 2)")  # 2 chunks: visible pairs of 256 queries on 256 + 256 keys
  roof=$(calc "$(m mixed_kv) / ($(m bw) * 1e6) + $flops / (0.85 * $peak * $t * 1e6)")
  printf '  mixed core step: %.3f ms  ggml streams decode + prefill %.3f + %.3f ms (%.2fx)  roofline %.3f ms (%.2fx of it)\n' \
    "$(m mixed)" "$(m ggml_dec)" "$(m ggml_pre)" "$(calc "($(m ggml_dec) + $(m ggml_pre)) / $(m mixed)")" "$roof" "$(calc "$(m mixed) / $roof")"
  # The most any fp32 kernel could gain over ggml here: K/V at read_bw and the prefill FLOPs at the full FMA peak.
  floor=$(calc "$(m mixed_kv) / ($(m bw) * 1e6) + $flops / ($peak * $t * 1e6)")
  printf '    its floor (K/V at read_bw, prefill at 100 %% of fma_peak) %.3f ms: at most %.2fx ggml on this machine\n' \
    "$floor" "$(calc "($(m ggml_dec) + $(m ggml_pre)) / $floor")"
  lroof=$(calc "$(m layer_bytes) / ($(m bw_layer) * 1e6)")
  printf '  layer step E=4096, 32 ragged decodes, bf16: %.3f ms  (weights + K/V) / read_bw(512 MB) %.3f ms  = %.2fx\n' \
    "$(m layer)" "$lroof" "$(calc "$(m layer) / $lroof")"
  printf '    its attention core alone (fp32 compute over the bf16 cache) %.3f ms, K/V %.2f GB/s = %.1f %% of read_bw(512 MB)\n' \
    "$(m layer_core)" "$(m layer_core_gbps)" "$(calc "$(m layer_core_gbps) * 100 / $(m bw_layer)")"
  printf '  decode 16 x 2048, layer: contiguous %.3f ms  paged bs16 %.3f (%+.1f %%)  bs64 %.3f (%+.1f %%)  bs256 %.3f (%+.1f %%)\n' \
    "$(m contig)" "$(m paged16)" "$(calc "($(m paged16) / $(m contig) - 1) * 100")" "$(m paged64)" \
    "$(calc "($(m paged64) / $(m contig) - 1) * 100")" "$(m paged256)" "$(calc "($(m paged256) / $(m contig) - 1) * 100")"
done
