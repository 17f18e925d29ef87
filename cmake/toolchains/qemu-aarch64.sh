#!/bin/sh
# Runs an aarch64 program under qemu-aarch64-static with Debian's arm64 sysroot: the CTest emulator of
# aarch64-linux-gnu.cmake. MHA_QEMU_CPU picks the emulated CPU model (default max: FEAT_BF16, FP16;
# cortex-a72: Armv8.0 NEON only).
exec qemu-aarch64-static -cpu "${MHA_QEMU_CPU:-max}" -L /usr/aarch64-linux-gnu "$@"
