#!/usr/bin/env bash
# Reliability checks for CI, run after the main test suite (on Debian 12, as root or with sudo):
#   1. asan      g++ build with ASan + UBSan (-DMHA_SANITIZE=ON) of the library, tests and tool; its ctest
#   2. fuzz      clang++ libFuzzer targets (fuzz/), ASan + UBSan; each runs MHA_FUZZ_SECONDS from the
#                committed seed corpus (new inputs go to a scratch folder, never into fuzz/corpus)
#   3. valgrind  memcheck on the real `mha run` over PyTorch fixtures (ctest -L valgrind), and the ISA
#                leak check of the linked binaries (ctest -L isa, tools/check_isa_leak.py), on a clang++
#                Release build (the main suite runs both labels on its g++ Release build): the two
#                compilers inline and link the per-ISA TUs differently, and valgrind's CPU has no AVX-512,
#                so an AVX-512 leak is a SIGILL there.
#   4. arm64     the aarch64 cross build and its tests under qemu-aarch64-static (tools/arm64_emulated.sh).
# Installs what is missing with apt-get. Prints one summary line per step; exits nonzero if any failed.
# Environment: MHA_FUZZ_SECONDS (default 20), MHA_RELIABILITY_JOBS (default nproc),
#              MHA_RELIABILITY_BUILD (folder prefix, default build-: build-asan, build-fuzz, build-clang,
#              build-arm64).
set -uo pipefail
cd "$(dirname "$0")/.."

fuzz_seconds=${MHA_FUZZ_SECONDS:-20}
jobs=${MHA_RELIABILITY_JOBS:-$(nproc)}
prefix=${MHA_RELIABILITY_BUILD:-build-}
start=$(date +%s)

packages=(cmake make g++ clang libclang-rt-14-dev valgrind libxsimd-dev libtbb-dev libgtest-dev
          libbenchmark-dev libcli11-dev nlohmann-json3-dev)
bash tools/install_packages.sh "${packages[@]}" || exit 1

declare -a summary=()
failed=0
step() {  # step NAME COMMAND...: runs the command, records PASS/FAIL and its duration
  local name=$1 t0 rc
  shift
  echo
  echo "======== $name"
  t0=$(date +%s)
  "$@"
  rc=$?
  local took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    summary+=("PASS  $name (${took}s)")
  else
    summary+=("FAIL  $name (${took}s, exit $rc)")
    failed=1
  fi
}

# The sanitized builds keep line tables only (-g1): enough for the reports' function, file and line, and about
# 20 % less compile time than full debug info (-g) under ASan.
debug_lines=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")

asan() {
  local b=${prefix}asan
  CXX=g++ cmake -S . -B "$b" -DMHA_SANITIZE=ON "${debug_lines[@]}" -DMHA_BUILD_BENCH=OFF &&
    cmake --build "$b" -j "$jobs" &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir "$b" --output-on-failure -j "$jobs" -E '^consumer_links_installed_library'
  # consumer_links_installed_library(_cxx17) is skipped here: it links the installed (instrumented) libmha.a
  # into an outside project built without -fsanitize, which cannot link. The main suite runs it.
}

fuzz_build() {
  local b=${prefix}fuzz
  CXX=clang++ cmake -S . -B "$b" -DMHA_BUILD_FUZZERS=ON -DMHA_SANITIZE=ON -DMHA_BUILD_TESTS=OFF \
    -DMHA_BUILD_TOOLS=OFF -DMHA_BUILD_BENCH=OFF "${debug_lines[@]}" &&
    cmake --build "$b" -j "$jobs" --target fuzz_npy fuzz_attention fuzz_sdpa fuzz_paged_step
}

fuzz_run() {  # fuzz_run TARGET CORPUS [libFuzzer flags...]
  local target=$1 corpus=$2 b=${prefix}fuzz
  shift 2
  local scratch="$b/fuzz-work/$target" log="$b/fuzz-work/$target.log"
  rm -rf "$scratch" && mkdir -p "$scratch"
  # -rss_limit_mb: ASan + the attention oracle stay far below; a parser allocating for a lying header would not.
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$b/fuzz/$target" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$b/fuzz-work/$target-" "$@" "$scratch" "$corpus" >"$log" 2>&1
  local rc=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|invariant|fuzz_attention:|fuzz_sdpa:|fuzz_paged_step:" "$log" | tail -n 8
  [ $rc -eq 0 ] || { echo "---- tail of $log"; tail -n 40 "$log"; }
  return $rc
}

valgrind_check() {  # valgrind_check FOLDER CXX BUILD_TYPE: builds what the valgrind and isa tests run, runs them
  local b=${prefix}$1
  CXX=$2 cmake -S . -B "$b" -DCMAKE_BUILD_TYPE="$3" -DMHA_BUILD_BENCH=OFF &&
    cmake --build "$b" -j "$jobs" --target mha_cli mha_tests &&
    ctest --test-dir "$b" --output-on-failure -L 'valgrind|isa' -j "$jobs" --no-tests=error
}

step "asan+ubsan build and ctest" asan
step "fuzz build (clang++)" fuzz_build
if [ -x "${prefix}fuzz/fuzz/fuzz_npy" ]; then
  step "fuzz_npy ${fuzz_seconds}s" fuzz_run fuzz_npy fuzz/corpus/npy -dict=fuzz/npy.dict -max_len=4096
  step "fuzz_attention ${fuzz_seconds}s" fuzz_run fuzz_attention fuzz/corpus/attention -max_len=256
  step "fuzz_sdpa ${fuzz_seconds}s" fuzz_run fuzz_sdpa fuzz/corpus/sdpa -max_len=256
  step "fuzz_paged_step ${fuzz_seconds}s" fuzz_run fuzz_paged_step fuzz/corpus/paged_step -max_len=256
fi
step "valgrind on mha run + isa leak (clang++)" valgrind_check clang clang++ Release
step "aarch64 cross build + tests under qemu" env MHA_ARM64_BUILD="${prefix}arm64" MHA_ARM64_JOBS="$jobs" \
  bash tools/arm64_emulated.sh

echo
echo "======== reliability summary ($(($(date +%s) - start))s total)"
printf '%s\n' "${summary[@]}"
exit $failed
