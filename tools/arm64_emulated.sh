#!/usr/bin/env bash
# The aarch64 build and its test suite under emulation (issue 25), on an x86-64 Debian 12 machine:
#   installs g++-aarch64-linux-gnu, qemu-user-static and the arm64 multiarch libraries (adds the arm64
#   architecture to dpkg if missing), cross-builds the library, tool, tests and benchmarks with
#   cmake/toolchains/aarch64-linux-gnu.cmake (the Python extension too, against an unpacked arm64 Python),
#   then runs ctest and the pytest suite under qemu-aarch64-static once per CPU model:
#   max (FEAT_BF16, FP16: Isa::neon_bf16, the BFDOT GEMM) and cortex-a72 (Armv8.0: Isa::neon, the fallbacks).
# Emulation is 10-100x slower than the host, so to stay within CI's budget (25 min) the default leaves out,
# at both models, the tests whose cost is size, not Arm coverage: the large PyTorch fixtures (E 1024,
# L 1100: ~5 min emulated; the GEMM's k-blocks and tails are covered per ISA by SimdGemm) and the
# resident-memory checks (they would measure qemu's memory, not the program's). At cortex-a72 it also
# leaves out the sweeps (`sweeps` below: 42 tests, 600 of the 990 test-seconds there), whose code the run at
# max already takes on Isa::neon: those in bf16 compute loop over neon and neon_bf16 (tests/
# isa_test_util.hpp), the others compute in fp32 (or are scalar-reference checks), where neon_bf16 runs the
# neon kernels. What a72 alone checks -- that detection picks neon and that nothing past Armv8.0 runs on
# that path (a SIGILL under this model) -- the other 680 tests there check, calling the same kernels and
# layers on smaller shapes. MHA_ARM64_FULL=1 runs the whole suite at both models.
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
  nlohmann-json3-dev libtbb-dev:arm64 libgtest-dev:arm64 libbenchmark-dev:arm64 python3 pybind11-dev

# An arm64 Python with numpy and pytest, unpacked (not installed) into a folder that qemu's -L reads: the
# Python extension is built against its headers and its pytest suite runs on it. Not installed because
# python3.X:arm64 cannot sit beside the build machine's python3.X, and Multi-Arch: same would pin
# libpython3.X-dev:arm64 to the build machine's exact libpython version. No torch for arm64 here: the
# torch tests skip.
mkdir -p "$build"
pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pyroot=$(cd "$build" && pwd)/python-arm64-root
if [ ! -f "$pyroot/.complete" ]; then
  rm -rf "$pyroot" && mkdir -p "$pyroot/debs"
  (cd "$pyroot/debs" && apt-get download -q "python$pyver-minimal:arm64" "libpython$pyver-minimal:arm64" \
    "libpython$pyver-stdlib:arm64" "libpython$pyver-dev:arm64" python3-numpy:arm64 libblas3:arm64 liblapack3:arm64 \
    libgfortran5:arm64 libc6:arm64 libstdc++6:arm64 libgcc-s1:arm64 libtbb12:arm64 libexpat1:arm64 zlib1g:arm64 \
    libffi8:arm64 libbz2-1.0:arm64 liblzma5:arm64 libssl3:arm64 libncursesw6:arm64 libtinfo6:arm64 \
    libreadline8:arm64 libsqlite3-0:arm64 libuuid1:arm64 libcrypt1:arm64 libnsl2:arm64 libtirpc3:arm64 \
    libdb5.3:arm64 python3-pytest python3-iniconfig python3-packaging python3-pluggy python3-attr python3-py \
    python3-more-itertools python3-pkg-resources)
  for deb in "$pyroot"/debs/*.deb; do dpkg-deb -x "$deb" "$pyroot"; done
  # What update-alternatives would have linked.
  ln -sf blas/libblas.so.3 "$pyroot/usr/lib/aarch64-linux-gnu/libblas.so.3"
  ln -sf lapack/liblapack.so.3 "$pyroot/usr/lib/aarch64-linux-gnu/liblapack.so.3"
  rm -rf "$pyroot/debs" && touch "$pyroot/.complete"
fi

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMHA_BUILD_PYTHON=ON -DPython_INCLUDE_DIR="$pyroot/usr/include/python$pyver"
cmake --build "$build" -j "$jobs"
rc=0
run() {  # run CPU [ctest selection...]
  local cpu=$1 t0
  shift
  echo "== ctest under qemu-aarch64-static -cpu $cpu $*"
  t0=$(date +%s)
  MHA_QEMU_CPU=$cpu ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 "$@" || rc=1
  echo "== -cpu $cpu: $(($(date +%s) - t0)) s"
  echo "== pytest under qemu-aarch64-static -cpu $cpu"
  t0=$(date +%s)
  local emulator="qemu-aarch64-static -cpu $cpu -L $pyroot"
  MHA_TEST_EMULATOR="$emulator" PYTHONPATH="$(cd "$build" && pwd)/python" PYTHONDONTWRITEBYTECODE=1 \
    $emulator "$pyroot/usr/bin/python$pyver" -m pytest -q -rs -p no:cacheprovider python/tests || rc=1
  echo "== pytest -cpu $cpu: $(($(date +%s) - t0)) s"
}
size_only='PyTorch/PyTorchLarge\.|Memory\.ResidentMemory|memory_soak_smoke$'
# Each 8-60 s at a72 in CI; a rename here only makes the a72 run longer, never skips a test at max.
sweeps='DecodeSdpa\.(SplitAndTileEdgesEveryGroupSize|CausalBothAlignments|AttnMasks)$|KVQuantizedAccuracy\.'
sweeps+='|DecodeLayer\.CacheStepAtSplitAndTileEdgesEveryGroupSize$|Bf16Simd\.MatchesReferenceOnEveryIsa$'
sweeps+='|Bf16Reference\.|PagedKVCache\.(LongSequencesAcrossSplitsAndBlocks|StepsEqualEachSequenceAloneInAContiguousCache)$'
sweeps+='|SimdDecoder\.(WorkspaceAndPaddedOutput|ToleranceCatchesWrongConfigurations|GroupedLayerMatchesScalar)$'
sweeps+='|SimdDecoder\.(EveryMaskKind|BitwiseEqualAcrossThreadCounts)$|AllMasks/NonFiniteValues\.|Types/HalfCacheLayer\.'
sweeps+='|SdpaApi\.(SimdMatchesScalarEveryLayout|GqaEqualsMhaWithRepeatedKeysAndValues|NanInMaskedKeysDoesNotLeak)$'
sweeps+='|SdpaApi\.EveryMaskKindAndRank$|SimdAttention\.BitwiseIdenticalAcrossThreadCounts$'
sweeps+='|F16\.EveryFloatAtTheBoundariesRoundsLikeF16c$'
if [ "$full" = 1 ]; then
  run max
  run cortex-a72
else
  run max -E "^($size_only)"
  run cortex-a72 -E "^($size_only|$sweeps)"
fi
exit $rc
