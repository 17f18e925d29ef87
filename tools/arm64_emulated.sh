#!/usr/bin/env bash
# The aarch64 build and its test suite under emulation (issue 25), on an x86-64 Debian 12 machine:
#   installs g++-aarch64-linux-gnu, qemu-user-static and the arm64 multiarch libraries (adds the arm64
#   architecture to dpkg if missing), cross-builds the library, tool, tests and benchmarks with
#   cmake/toolchains/aarch64-linux-gnu.cmake, then runs ctest under qemu-aarch64-static once per CPU model:
#   max (FEAT_BF16, FP16: Isa::neon_bf16) and cortex-a72 (Armv8.0: Isa::neon).
# Emulation is 10-100x slower than the host, so to stay within CI's budget (25 min) the default leaves out,
# at -cpu max, the tests whose cost is size, not Arm coverage: the large PyTorch fixtures (E 1024, L 1100:
# ~5 min emulated; the GEMM's k-blocks and tails are covered per ISA by SimdGemm) and the resident-memory
# checks (they would measure qemu's memory, not the program's); at -cpu cortex-a72, where the same NEON
# kernels run and only the detected level differs (neon, not neon_bf16), the ISA, bf16, half and per-ISA
# kernel tests. MHA_ARM64_FULL=1 runs the whole suite at both models (about 15 min each on 2 cores).
# Environment: MHA_ARM64_BUILD (build folder, default build-arm64), MHA_ARM64_JOBS (default nproc),
#              MHA_ARM64_FULL (default 0).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MHA_ARM64_BUILD:-build-arm64}
jobs=${MHA_ARM64_JOBS:-$(nproc)}
full=${MHA_ARM64_FULL:-0}

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo_cmd dpkg --add-architecture arm64
  $sudo_cmd apt-get update -q
fi
bash tools/install_packages.sh cmake make g++-aarch64-linux-gnu qemu-user-static libxsimd-dev libcli11-dev \
  nlohmann-json3-dev libtbb-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"
rc=0
run() {  # run CPU [ctest selection...]
  local cpu=$1 t0
  shift
  echo "== ctest under qemu-aarch64-static -cpu $cpu $*"
  t0=$(date +%s)
  MHA_QEMU_CPU=$cpu ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 "$@" || rc=1
  echo "== -cpu $cpu: $(($(date +%s) - t0)) s"
}
if [ "$full" = 1 ]; then
  run max
  run cortex-a72
else
  run max -E '^(PyTorch/PyTorchLarge\.|Memory\.ResidentMemory|memory_soak_smoke$)'
  run cortex-a72 -R '^(Isa\.|IsaChild|Bf16|F16\.|BF16\.|EveryIsa/|AllIsas/|SimdGemm|SimdRows|DecodeKernels|SdpaApi\.SimdMatchesScalar)'
fi
exit $rc
