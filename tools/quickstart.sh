#!/usr/bin/env bash
# One command for each job on a fresh Debian 12 machine (as root, or with sudo available):
#   tools/quickstart.sh test    install what is missing, build, run the whole test suite (ctest)
#   tools/quickstart.sh bench   install what is missing, build, run the head-count scaling benchmark
#   tools/quickstart.sh pybench install what is missing, build, run python3 -m mha.bench (mha vs torch from Python)
# Extra arguments after "bench" go to tools/scaling.sh, after "pybench" to mha.bench (see README).
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
bash tools/install_packages.sh "${packages[@]}"

build=${MHA_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
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
