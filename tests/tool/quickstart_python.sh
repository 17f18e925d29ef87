#!/usr/bin/env bash
# quickstart's configure step turns the Python package on (issue 20): a build directory configured first with
# MHA_BUILD_PYTHON=OFF (as `tools/quickstart.sh bench` leaves one on a machine without pybind11) and then by
# `tools/quickstart.sh test` (its configure step only, MHA_QUICKSTART_ONLY=configure) has MHA_BUILD_PYTHON=ON
# and the mha_python target; and MHA_BUILD_PYTHON=ON without a Python fails the configure with its message.
# Usage: quickstart_python.sh SOURCE_DIR WORK_DIR. Needs Python and pybind11 installed (as the Python tests do).
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
fast=(-DMHA_BUILD_TESTS=OFF -DMHA_BUILD_BENCH=OFF -DMHA_BUILD_TOOLS=OFF)  # the library and python/ only

cmake -S "$src" -B "$work/build" -DMHA_BUILD_PYTHON=OFF "${fast[@]}" > "$work/first.log"
grep -q '^MHA_BUILD_PYTHON:BOOL=OFF$' "$work/build/CMakeCache.txt" || { echo "FAIL: the first configure did not set OFF"; exit 1; }
MHA_BUILD_DIR="$work/build" MHA_QUICKSTART_ONLY=configure bash "$src/tools/quickstart.sh" test > "$work/quickstart.log"
grep -q '^MHA_BUILD_PYTHON:BOOL=ON$' "$work/build/CMakeCache.txt" || { echo "FAIL: quickstart test left MHA_BUILD_PYTHON off"; exit 1; }
cmake --build "$work/build" --target help > "$work/targets.txt"
grep -q '\.\.\. mha_python$' "$work/targets.txt" || { echo "FAIL: no mha_python target after quickstart test"; exit 1; }

if cmake -S "$src" -B "$work/missing" -DMHA_BUILD_PYTHON=ON -DPython_EXECUTABLE=/nonexistent "${fast[@]}" > "$work/missing.log" 2>&1; then
  echo "FAIL: MHA_BUILD_PYTHON=ON with -DPython_EXECUTABLE=/nonexistent configured"
  exit 1
fi
grep -q 'MHA_BUILD_PYTHON is ON but Python 3.8+ with its development files' "$work/missing.log" ||
  { echo "FAIL: the missing-Python configure did not say why:"; cat "$work/missing.log"; exit 1; }
echo "PASS"
