#!/usr/bin/env bash
# What each score modifier costs the fused causal prefill (issue 24's "softcap < 10 %, sinks and ALiBi < 3 %";
# docs/score-modifiers.md), two ways:
#   instructions  valgrind callgrind (exact; the AVX2 path, valgrind has no AVX-512): inclusive cost of
#                 mha::scaled_dot_product_attention over the warm-up and one timed call of
#                 `mha bench --op sdpa --batch 1 --heads 8 --kv-heads 2 --head-dim 128 --seq 1024 --causal`
#   time          the same op at B 1, H 32, Hkv 8, d 128, L 4096 on the detected ISA, plain and each modifier in
#                 turn, ROUNDS alternating rounds of --reps 3, medians of the rounds' medians
# Usage: tools/modifier_overhead.sh [BUILD_DIR] [ROUNDS] [THREADS]   (SKIP_CALLGRIND=1: timings only)
set -euo pipefail
M=${1:-build}/tools/mha; R=${2:-5}; T=${3:-1}
mods=("" "--softcap 30" "--sinks" "--alibi")
name() { [ -z "$1" ] && echo plain || echo "$1" | tr -d ' -'; }
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
pct() { python3 -c "print(f'{100 * ($1 / $2 - 1):+.2f} %')"; }
if [ "${SKIP_CALLGRIND:-0}" != 1 ] && command -v valgrind > /dev/null; then
  out=$(mktemp -d)
  echo "instructions (callgrind, MHA_ISA=avx2, L 1024, H 8, Hkv 2):"
  base=
  for m in "${mods[@]}"; do
    # shellcheck disable=SC2086
    MHA_ISA=avx2 valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$M" bench --op sdpa --batch 1 --heads 8 \
      --kv-heads 2 --head-dim 128 --seq 1024 --causal --threads 1 --reps 1 $m > /dev/null 2>&1
    ir=$(callgrind_annotate --inclusive=yes "$out/cg" 2>/dev/null | grep 'mha::scaled_dot_product_attention(' \
         | head -1 | awk '{gsub(",", "", $1); print $1}')
    base=${base:-$ir}
    echo "  $(name "$m") $ir $(pct "$ir" "$base")"
  done
  rm -rf "$out"
fi
declare -A ms=()
for _ in $(seq "$R"); do
  for m in "${mods[@]}"; do
    # shellcheck disable=SC2086
    ms[$(name "$m")]+="$("$M" bench --op sdpa --batch 1 --heads 32 --kv-heads 8 --head-dim 128 --seq 4096 --causal $m \
      --threads "$T" --reps 3 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['ms_median'])") "
  done
done
echo "time (L 4096, H 32, Hkv 8, $T thread(s), medians of $R alternating rounds):"
plain=$(echo ${ms[plain]} | tr ' ' '\n' | med)
for m in "${mods[@]}"; do
  k=$(name "$m"); v=$(echo ${ms[$k]} | tr ' ' '\n' | med)
  echo "  $k $v ms $(pct "$v" "$plain")   [${ms[$k]}]"
done
