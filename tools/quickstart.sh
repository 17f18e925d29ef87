#!/usr/bin/env bash
# One command for each job on a fresh Debian 12 machine (as root, or with sudo available):
#   tools/quickstart.sh test    install what is missing, build, run the whole test suite (ctest)
#   tools/quickstart.sh bench   install what is missing, build, run the head-count scaling benchmark
#   tools/quickstart.sh pybench install what is missing, build, run python3 -m mha.bench (mha vs torch from Python)
# Extra arguments after "bench" go to tools/scaling.sh, after "pybench" to mha.bench (see README).
# test and pybench build the Python package: they configure with -DMHA_BUILD_PYTHON=ON, so a build directory
# configured earlier without pybind11 (e.g. by "bench" on a fresh machine) gets it now, and a missing
# Python or pybind11 fails the configure with a message instead of skipping the Python tests.
# MHA_BUILD_DIR=DIR: the build directory (default build). MHA_QUICKSTART_ONLY=configure: only the configure
# step, nothing installed (tests/tool/quickstart_python.sh checks it so).
set -euo pipefail
mode=${1:-test}
shift || true
cd "$(dirname "$0")/.."

packages=(cmake make g++ libxsimd-dev libtbb-dev libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev)
[ "$mode" = bench ] && packages+=(python3 python3-matplotlib)
# The Python package (pybind11 extension) and its tests against torch: test and pybench.
python_packages=(python3 python3-dev pybind11-dev python3-pytest python3-numpy python3-torch)
[ "$mode" = test ] && packages+=("${python_packages[@]}")
[ "$mode" = pybench ] && packages+=("${python_packages[@]}" python3-matplotlib)
configure_args=(-DCMAKE_BUILD_TYPE=Release)
[ "$mode" = test ] || [ "$mode" = pybench ] && configure_args+=(-DMHA_BUILD_PYTHON=ON)
only=${MHA_QUICKSTART_ONLY:-}
[ "$only" = configure ] || bash tools/install_packages.sh "${packages[@]}"

build=${MHA_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build" "${configure_args[@]}"
[ "$only" = configure ] && exit 0
cmake --build "$build" -j "$jobs"

case "$mode" in
  test)
    ctest --test-dir "$build" --output-on-failure -j "$jobs"
    ;;
  bench)
    MHA_BUILD_DIR="$build" bash tools/scaling.sh "$@"
    ;;
  pybench)
    PYTHONPATH="$build/python" /usr/bin/python3 -m mha.bench "$@"
    ;;
  *)
    echo "usage: tools/quickstart.sh test|bench|pybench [options]" >&2
    exit 2
    ;;
esac
