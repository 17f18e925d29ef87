#!/usr/bin/env bash
# The attention scaling suite in one command: head-count, thread and sequence-length sweeps of
# bench_attention (bench/bench_attention.cpp), then charts and a Markdown table (tools/plot_bench.py).
# Needs a build: bash tools/quickstart.sh bench [options] builds and then runs this script.
#
# usage: tools/scaling.sh [options]
#   --out DIR            results folder (default ./results): <suite>.json, scaling-*.png, scaling.md
#   --suites LIST        which sweeps, in order (default heads,threads,lengths; "bert" adds BERT-base shapes)
#   --heads LIST         head counts (default 1,2,4,8,12,16,32,64)
#   --embed LIST         embed dims of the head sweep; the first is used by the thread sweep (default 768,1024)
#   --batch N            batch of the head and thread sweeps (default 8)
#   --seq N              sequence length of the head and thread sweeps (default 128)
#   --threads LIST       thread counts (default 1..hardware threads)
#   --lengths LIST       sequence lengths of the length sweep (default 128,512,1024,2048,4096,8192)
#   --scalar-batch N     batch of the scalar reference runs in the head sweep (default 1; it is slow)
#   --no-scalar          skip the scalar runs
#   --min-time SECONDS   Google Benchmark's --benchmark_min_time per benchmark (default: its own, 0.5)
#   --repetitions N      run each benchmark N times; tables and charts use the fastest (default 1)
#   --quick              CI-sized smoke run: a few heads at E 768, B 2, short lengths, min time 0.01 s
#                        (explicit options still win)
# Environment: MHA_BUILD_DIR (default build) is where bench/bench_attention is looked for.
# Run on an otherwise idle machine: other work on the cores makes the numbers noisy.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "scaling.sh: $*" >&2; exit 2; }

out=results
suites=heads,threads,lengths
heads="" embed="" batch="" seq="" threads="" lengths="" scalar_batch="" min_time="" repetitions="" no_scalar=0 quick=0
while [ $# -gt 0 ]; do
  opt=$1
  case "$opt" in
    -h|--help) usage; exit 0 ;;
    --quick) quick=1; shift; continue ;;
    --no-scalar) no_scalar=1; shift; continue ;;
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;  # --name=value → --name value
  esac
  [ $# -ge 2 ] || die "$opt needs a value (see --help)"
  case "$opt" in
    --out) out=$2 ;;
    --suites) suites=$2 ;;
    --heads) heads=$2 ;;
    --embed) embed=$2 ;;
    --batch) batch=$2 ;;
    --seq) seq=$2 ;;
    --threads) threads=$2 ;;
    --lengths) lengths=$2 ;;
    --scalar-batch) scalar_batch=$2 ;;
    --min-time) min_time=$2 ;;
    --repetitions) repetitions=$2 ;;
    *) die "unknown option $opt (see --help)" ;;
  esac
  shift 2
done

if [ "$quick" = 1 ]; then
  heads=${heads:-1,4,12}
  embed=${embed:-768}
  batch=${batch:-2}
  lengths=${lengths:-128,512,1024}
  min_time=${min_time:-0.01}
fi

build=${MHA_BUILD_DIR:-build}
bin=$build/bench/bench_attention
[ -x "$bin" ] || die "$bin not found: build first (bash tools/quickstart.sh bench, or cmake -S . -B $build && cmake --build $build)"

# Flags the benchmark binary parses itself (it checks the values).
flags=()
[ -n "$heads" ] && flags+=("--heads=$heads")
[ -n "$embed" ] && flags+=("--embed=$embed")
[ -n "$batch" ] && flags+=("--batch=$batch")
[ -n "$seq" ] && flags+=("--seq=$seq")
[ -n "$threads" ] && flags+=("--threads=$threads")
[ -n "$lengths" ] && flags+=("--lengths=$lengths")
[ -n "$scalar_batch" ] && flags+=("--scalar-batch=$scalar_batch")
[ "$no_scalar" = 1 ] && flags+=("--no-scalar")
[ -n "$min_time" ] && flags+=("--benchmark_min_time=$min_time")
[ -n "$repetitions" ] && flags+=("--benchmark_repetitions=$repetitions" "--benchmark_report_aggregates_only=false")

IFS=, read -r -a suite_list <<< "$suites"
for s in "${suite_list[@]}"; do
  case "$s" in bert|heads|threads|lengths) ;; *) die "unknown suite '$s' (bert, heads, threads, lengths)" ;; esac
done
declare -A title=([bert]="BERT-base shapes" [heads]="head-count sweep" [threads]="thread sweep"
                  [lengths]="sequence-length sweep (materialized vs fused)")

mkdir -p "$out"
total=$(( ${#suite_list[@]} + 1 ))
step=0
jsons=()
start=$SECONDS
for s in "${suite_list[@]}"; do
  step=$((step + 1))
  echo "[$step/$total] ${title[$s]} ..."
  rm -f "$out/$s.json"
  "$bin" --suites="$s" "${flags[@]}" --benchmark_out="$out/$s.json" --benchmark_out_format=json
  jsons+=("$out/$s.json")
done

step=$((step + 1))
echo "[$step/$total] charts and table ..."
python=python3
[ -x /usr/bin/python3 ] && python=/usr/bin/python3  # Debian's python3-matplotlib lives there
"$python" tools/plot_bench.py --out "$out" "${jsons[@]}"
echo "done in $((SECONDS - start)) s; results in $out/"
