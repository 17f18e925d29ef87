#!/usr/bin/env bash
# Compile check of the library for a target other than x86: configures and builds target mha for 64-bit Arm
# Linux with Debian's cross compiler (cmake/aarch64-linux-gnu.cmake). Only the compile: nothing is run.
# There lib/simd has one ISA level (xsimd's default arch, NEON), no x86 TUs are compiled, and CPU detection is
# lib/simd/generic/'s.
# Needs g++-aarch64-linux-gnu and libtbb-dev:arm64 (multiarch); with --install, installs them with apt-get
# (as root: dpkg --add-architecture arm64, apt-get update, apt-get install).
# Environment: MHA_CROSS_BUILD (build folder, default build-aarch64), MHA_CROSS_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${MHA_CROSS_BUILD:-build-aarch64}
jobs=${MHA_CROSS_JOBS:-$(nproc)}

if [[ ${1:-} == --install ]]; then
  dpkg --add-architecture arm64
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu libtbb-dev:arm64
fi
if ! command -v aarch64-linux-gnu-g++ > /dev/null || [[ ! -d /usr/lib/aarch64-linux-gnu/cmake/TBB ]]; then
  echo "cross_check_aarch64: needs g++-aarch64-linux-gnu and libtbb-dev:arm64 (run with --install)" >&2
  exit 2
fi

cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DMHA_BUILD_TESTS=OFF -DMHA_BUILD_TOOLS=OFF -DMHA_BUILD_BENCH=OFF -DMHA_BUILD_PYTHON=OFF
cmake --build "$build" -j "$jobs" --target mha
echo "cross_check_aarch64: target mha compiled for aarch64 ($build/libmha.a)"
