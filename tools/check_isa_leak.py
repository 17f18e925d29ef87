#!/usr/bin/env python3
"""Checks that no function outside the per-ISA kernels of a linked binary holds AVX-512 (or AVX) code.

usage: check_isa_leak.py [--objdump PROG] [--cxxfilt PROG] [--no-vex] BINARY

Why: lib/simd compiles *_avx512.cpp and *_avx2.cpp with ISA flags and picks one at run time. An inline
function or template instantiation those TUs share with baseline code (e.g. clang's
std::vector<float, xsimd::aligned_allocator<float, 64>>::_M_fill_assign) is emitted in every TU that
uses it, and the linker keeps one copy, possibly the AVX-512-compiled one; the AVX2 or SSE2 path then
runs it and dies with SIGILL on a CPU without AVX-512. Tests on an AVX-512 machine never notice.

How: `objdump -d -w` (raw bytes shown) splits the code into functions at each `<symbol>:` header; an
instruction's first opcode byte, after any 0x67 / segment-override (26 2e 36 3e 64 65) prefixes, is
  0x62        EVEX, i.e. AVX-512 (in 64-bit mode 0x62 is never BOUND);
  0xc4, 0xc5  VEX, i.e. AVX/AVX2/FMA/BMI (in 64-bit mode never LES/LDS).
(Other legacy prefixes or REX before VEX/EVEX are #UD, so they cannot occur in valid code.)

The rule, on the mangled symbol of each function (xsimd's arch types are what marks per-ISA code;
lib/simd/dispatch.hpp instantiates every kernel on arch_avx512 = xsimd::avx512bw, arch_avx2 =
xsimd::fma3<xsimd::avx2>, arch_sse2 = xsimd::sse2, and xsimd's own helpers carry their arch in a
template argument or a requires_arch<...> parameter):
  - an arch marker is one of those type names as an Itanium <source-name>, i.e. preceded by its length
    and not by another digit: AVX-512 markers 8avx512bw 7avx512f 8avx512cd 8avx512dq (xsimd's AVX-512
    archs); AVX2 markers 4avx2 4fma3 (any xsimd::fma3<...> is VEX-encoded FMA code);
  - EVEX in a function whose symbol has no AVX-512 marker is a leak;
  - VEX in a function whose symbol has neither an AVX-512 nor an AVX2 marker is a leak (the SSE2
    baseline must not run AVX code either), unless --no-vex.
A symbol that names xsimd::sse2 (and no other arch) gets no exemption: its SSE2 path must stay SSE.
Limit: a function whose signature names an AVX-512 arch is trusted to run only after dispatch chose
AVX-512 (true of lib/simd's kernels); the check cannot tell which TU a kept copy came from.

Output: one line per offending function (EVEX, VEX or EVEX+VEX, how many such instructions, the
demangled name, the first of them, EVEX first), then a summary line with how many functions were
scanned. Exit 1 if any function leaks, 0 if none,
2 if the binary could not be disassembled.
"""
import argparse
import re
import subprocess
import sys

AVX512_MARKERS = ("avx512bw", "avx512f", "avx512cd", "avx512dq")
AVX2_MARKERS = ("avx2", "fma3")
PREFIXES = {0x67, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65}

HEADER = re.compile(r"^[0-9a-f]+ <(.+)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f]{2}(?: [0-9a-f]{2})*)\s*(?:\t(.*))?$")


def marker_regex(names):
    # A <source-name> is <length><identifier>; the lookbehind keeps "18avx2" etc. from matching.
    return re.compile("|".join(r"(?<![0-9])%d%s" % (len(n), n) for n in names))


IS_AVX512 = marker_regex(AVX512_MARKERS)
IS_AVX2 = marker_regex(AVX2_MARKERS)


def encoding(raw):
    """'evex', 'vex' or None for one instruction's raw bytes."""
    for byte in raw:
        if byte in PREFIXES:
            continue
        if byte == 0x62:
            return "evex"
        if byte in (0xC4, 0xC5):
            return "vex"
        return None
    return None


def scan(lines, check_vex):
    """Returns ([(symbol, kinds, count, first offending instruction)] per leaking function, functions scanned)."""
    found = []
    scanned = 0
    symbol = None
    hits = []  # (kind, instruction text) of this function's EVEX/VEX instructions, in address order

    def finish():
        if symbol is None:
            return
        allowed = {"evex", "vex"} if IS_AVX512.search(symbol) else {"vex"} if IS_AVX2.search(symbol) else set()
        if not check_vex:
            allowed.add("vex")
        bad = [(kind, insn) for kind, insn in hits if kind not in allowed]
        if bad:
            kinds = "+".join(k.upper() for k in ("evex", "vex") if any(kind == k for kind, _ in bad))
            # Show the first EVEX one if any: that is the instruction a CPU without AVX-512 stops at.
            first = next((i for k, i in bad if k == "evex"), bad[0][1])
            found.append((symbol, kinds, len(bad), first))

    for line in lines:
        if "file format " in line and not line.rstrip().endswith("file format elf64-x86-64"):
            # The byte rules above hold in 64-bit mode only (0x62 is BOUND in 32-bit code).
            raise ValueError("not an x86-64 ELF binary: " + line.strip())
        m = HEADER.match(line)
        if m:
            finish()
            symbol = m.group(1)
            scanned += 1
            hits = []
            continue
        m = INSN.match(line)
        if not m or symbol is None:
            continue
        kind = encoding(bytes.fromhex(m.group(2).replace(" ", "")))
        if kind:
            hits.append((kind, "%s: %s  %s" % (m.group(1), m.group(2), " ".join((m.group(3) or "").split()))))
    finish()
    return found, scanned


def demangle(names, cxxfilt):
    if not names:
        return {}
    try:
        out = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout
        pretty = out.splitlines()
        if len(pretty) == len(names):
            return dict(zip(names, pretty))
    except (OSError, subprocess.CalledProcessError):
        pass
    return {n: n for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", help="a linked x86-64 ELF executable (or object)")
    ap.add_argument("--objdump", default="objdump", help="GNU objdump to run (default: objdump)")
    ap.add_argument("--cxxfilt", default="c++filt", help="demangler for the report (default: c++filt)")
    ap.add_argument("--no-vex", action="store_true", help="check only for AVX-512 (EVEX) outside its kernels")
    args = ap.parse_args()

    try:
        proc = subprocess.Popen([args.objdump, "-d", "-w", args.binary], stdout=subprocess.PIPE, text=True)
    except OSError as e:
        print("check_isa_leak: cannot run %s: %s" % (args.objdump, e), file=sys.stderr)
        return 2
    try:
        found, scanned = scan(proc.stdout, not args.no_vex)
    except ValueError as e:
        proc.kill()
        print("check_isa_leak: %s: %s" % (args.binary, e), file=sys.stderr)
        return 2
    if proc.wait() != 0 or scanned == 0:
        print("check_isa_leak: %s disassembled to no functions (objdump exit %d)" % (args.binary, proc.returncode),
              file=sys.stderr)
        return 2

    pretty = demangle(sorted({f[0] for f in found}), args.cxxfilt)
    for symbol, kinds, count, insn in found:
        print("LEAK %-8s %5d  %s  [first: %s]" % (kinds, count, pretty[symbol], insn))
    checks = "EVEX" if args.no_vex else "EVEX and VEX"
    print("check_isa_leak: %s: %d functions scanned for %s outside per-ISA code, %d leaking"
          % (args.binary, scanned, checks, len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
