#!/usr/bin/env bash
# The figures of issue 24 (score modifiers; docs/score-modifiers.md), per thread count, alternating rounds, medians:
#   prefill   sdpa B 1, H 32, Hkv 8, d 128, L 16384, causal: full vs --window-left 4095 (gflops count visible pairs)
#   decode    LK 32768 (E 4096): the attention core (step --core-only, one sequence) and the layer step, full vs
#             window 4096
#   overhead  sdpa L 4096 causal: plain, --softcap 30, --sinks, --alibi, all four
#   ggml      bench/anchors/ggml_attn_modifiers (flash_attn_ext with a causal mask) on the prefill shape with the
#             window and softcap / ALiBi / sinks, against ours with the same flags (first round only: ggml takes
#             tens of seconds per call)
# plus fma_peak and read_bw. Usage: tools/modifier_figures.sh [BUILD_DIR] [ANCHOR_DIR] [ROUNDS]
set -e
A=${2:-/tmp/mha-anchors}; M=${1:-build}/tools/mha; R=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
G=$A/ggml_attn_modifiers
if ! [ -x "$G" ] || [ "$here/bench/anchors/ggml_attn_modifiers.c" -nt "$G" ]; then
  g=$A/ggml/build/src
  gcc -O2 -I"$A/ggml/include" "$here/bench/anchors/ggml_attn_modifiers.c" -o "$G" "$g/libggml.a" "$g/libggml-cpu.a" \
      "$g/libggml-base.a" -lstdc++ -lm -fopenmp -lpthread
fi
core="--batch 1 --heads 32 --kv-heads 8 --head-dim 128"
shape="--embed 4096 --heads 32 --kv-heads 8 --head-dim 128"
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
f() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
ms() { sed 's/.*ms=\([0-9.]*\).*/\1/'; }
for t in ${THREADS:-1 2}; do
  declare -A r=()
  for i in $(seq $R); do
    j=$($M bench --op sdpa $core --seq 16384 --causal --threads $t --reps 1 --json); r[pre_full_ms]+="$(echo $j | f ms_median) "; r[pre_full_gf]+="$(echo $j | f gflops) "
    j=$($M bench --op sdpa $core --seq 16384 --causal --window-left 4095 --threads $t --reps 2 --json); r[pre_win_ms]+="$(echo $j | f ms_median) "; r[pre_win_gf]+="$(echo $j | f gflops) "
    for w in "" "--window-left 4095"; do
      k=${w:+win}; k=${k:-full}
      j=$($M bench --op step $shape --decode-seqs 1 --kv-seq 32768 --core-only --block-size 256 $w --threads $t --reps 10 --json)
      r[dec_core_${k}_ms]+="$(echo $j | f ms_median) "; r[dec_core_${k}_gbps]+="$(echo $j | f kv_gbps) "
      r[dec_layer_${k}_ms]+="$($M bench --op decode --batch 1 --kv-seq 32768 $shape $w --threads $t --reps 5 --json | f ms_median) "
    done
    for m in plain "--softcap 30" "--sinks" "--alibi" "--window-left 4095 --softcap 30 --sinks --alibi"; do
      k=$(echo "$m" | tr -d ' -' | cut -c1-24)
      [ "$m" = plain ] && m=""
      r[ovh_$k]+="$($M bench --op sdpa $core --seq 4096 --causal $m --threads $t --reps 3 --json | f ms_median) "
    done
    for m in "30 0 0:--softcap 30" "0 1 0:--alibi" "0 0 1:--sinks"; do  # ggml (seconds per call): the first round only
      [ $i = 1 ] || continue
      args=${m%%:*}; flags=${m#*:}; k=$(echo "$flags" | tr -d ' -')
      r[ggml_$k]+="$($G 16384 16384 32 8 128 $t 1 4095 $args | ms) "
      r[ours_$k]+="$($M bench --op sdpa $core --seq 16384 --causal --window-left 4095 $flags --threads $t --reps 2 --json | f ms_median) "
    done
  done
  echo "threads $t"
  for key in "${!r[@]}"; do echo "  $key $(echo ${r[$key]} | tr ' ' '\n' | med)   [${r[$key]}]"; done | sort
  echo "  fma_peak: $($A/fma_peak $t)"
  echo "  read_bw: $($A/read_bw 512 $t 5)"
done
