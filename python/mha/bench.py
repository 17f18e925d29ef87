"""python3 -m mha.bench: torch.nn.MultiheadAttention against mha on BERT shapes and a Llama-like shape, on one
thread and on all threads, called from Python (call overhead included); prints a Markdown table and writes a
PNG chart (matplotlib).

    python3 -m mha.bench [--reps N] [--rounds N] [--threads 1,2] [--out DIR] [--quick]

Columns: torch = nn.MultiheadAttention(batch_first=True).eval() under torch.inference_mode(); mha.torch = the
same module through mha.torch.MultiheadAttention.from_torch (torch tensors in and out); mha.torch overhead =
mha.torch's time over the numpy API's on the same layer (ratio and microseconds per call: what the torch
interface costs; n/a for the Llama-like row, whose numpy layer is a different one); mha numpy =
mha.torch's own packed layer called with numpy arrays (same weights, same addresses), or for the Llama-like row the real grouped-query
layer with RoPE (torch has no grouped-query nn.MultiheadAttention, so its baseline is the full-KV layer of the
same size); mha numpy bf16 = the numpy layer with compute='bf16' (bf16 GEMM operands, fp32 accumulation: less
accurate, for reference only). Self-attention, float32 [B, L, E], need_weights=False. torch.set_num_threads(N) for torch, the
threads option (mha_threads attribute for mha.torch) for mha.
Timing: after two warm-up calls each, every round times a block of calls of each in turn (one untimed call,
then as many as fit in about --seconds, at least 3, at most --reps), the order rotating from round to round,
and takes each block's median; the reported time is the median of --rounds rounds, so load changes on a
shared machine hit all of them alike.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

SHAPES = [  # name, B, L, E, H, Hkv, causal
    ("BERT-base", 8, 128, 768, 12, 12, False),
    ("BERT-base L=512", 1, 512, 768, 12, 12, False),
    ("BERT-large", 8, 128, 1024, 16, 16, False),
    ("Llama-like prefill (GQA 32/8, causal)", 1, 256, 4096, 32, 8, True),
    ("tiny (call overhead)", 1, 1, 64, 4, 4, False),
]


def median_times(fns, reps, rounds, seconds):
    """Median seconds per call of each function. Each round times a block of calls of each function in turn
    (a a a, b b b, c c c, then the next round, starting one function later), so a change in the machine's load
    during the run (other processes) hits them alike. Each block starts with an untimed call: the block after a
    slow one (torch's, seconds long at BERT shapes with a reference BLAS) would otherwise time its first calls
    with cold caches and freshly faulted memory, a bias of several percent when a block is only a few calls
    long. The rotation of the order spreads what remains over all of them."""
    once = []
    for fn in fns:
        fn()
        t0 = time.perf_counter()
        fn()
        once.append(time.perf_counter() - t0)
    counts = [int(max(3, min(reps, seconds / max(t, 1e-9)))) for t in once]
    meds = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            fn = fns[i]
            fn()  # untimed: warms this function's caches and memory after the previous block
            ts = []
            for _ in range(counts[i]):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            meds[i].append(statistics.median(ts))
    return [statistics.median(m) for m in meds]


def blas_set_threads(n):
    """torch.set_num_threads does not reach an OpenBLAS that torch was not built against (Debian's torch calls a
    generic libblas.so.3, which the libopenblas0 package replaces); set its pool too. Returns the BLAS name."""
    import ctypes

    try:
        lib = ctypes.CDLL("libblas.so.3")
    except OSError:
        return "unknown"
    if hasattr(lib, "openblas_set_num_threads"):
        lib.openblas_set_num_threads(ctypes.c_int(n))
        return "OpenBLAS"
    return "reference BLAS" if not hasattr(lib, "mkl_set_num_threads") else "MKL"


def run(shapes, threads_list, reps, rounds, seconds):
    import torch
    from torch import nn

    import mha
    import mha.torch as mt

    rows = []
    for name, B, L, E, H, Hkv, causal in shapes:
        torch.manual_seed(0)
        x = torch.randn(B, L, E)
        xn = x.numpy()
        mask = torch.triu(torch.full((L, L), float("-inf")), 1) if causal else None
        ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
        fast = mt.MultiheadAttention.from_torch(ref)
        if Hkv == H:
            with torch.no_grad():
                fast(x, x, x, need_weights=False)  # packs the weights
            # the numpy column runs mha.torch's own packed layer: the same weights at the same addresses, so
            # the difference is what the torch interface costs (two separately packed copies differ by a few
            # percent at BERT shapes through cache placement alone)
            layer = fast._mha_layer[0]
            layer16 = mha.MultiheadAttention.from_torch(ref, compute="bf16")
        else:
            layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, rope_theta=500000.0, seed=0)
            layer16 = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, rope_theta=500000.0, seed=0, compute="bf16")
        for threads in threads_list:
            torch.set_num_threads(threads)
            blas = blas_set_threads(threads)
            fast.mha_threads = threads
            with torch.inference_mode():
                t_torch, t_fast, t_np, t_16 = median_times(
                    [lambda: ref(x, x, x, attn_mask=mask, need_weights=False),
                     lambda: fast(x, x, x, attn_mask=None, need_weights=False, is_causal=causal),
                     lambda: layer(xn, is_causal=causal, threads=threads),
                     lambda: layer16(xn, is_causal=causal, threads=threads)], reps, rounds, seconds)
            rows.append(dict(shape=name, B=B, L=L, E=E, H=H, Hkv=Hkv, causal=causal, threads=threads,
                             torch_ms=t_torch * 1e3, mha_torch_ms=t_fast * 1e3, mha_numpy_ms=t_np * 1e3,
                             mha_numpy_bf16_ms=t_16 * 1e3,
                             speedup=t_torch / t_fast,
                             torch_over_numpy=(t_fast / t_np if Hkv == H else None),
                             torch_overhead_us=((t_fast - t_np) * 1e6 if Hkv == H else None),
                             torch_blas=blas, torch_version=torch.__version__))
    return rows


def table(rows):
    lines = ["| shape | B | L | E | H / Hkv | threads | torch ms | mha.torch ms | speedup | mha numpy ms | "
             "mha.torch / numpy | mha.torch − numpy µs | mha numpy bf16 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "n/a" if r["torch_over_numpy"] is None else f"{r['torch_over_numpy']:.3f}"
        extra = "n/a" if r["torch_overhead_us"] is None else f"{r['torch_overhead_us']:.1f}"
        lines.append(f"| {r['shape']} | {r['B']} | {r['L']} | {r['E']} | {r['H']} / {r['Hkv']} | {r['threads']} | "
                     f"{r['torch_ms']:.4g} | {r['mha_torch_ms']:.4g} | {r['speedup']:.2f}x | {r['mha_numpy_ms']:.4g} | "
                     f"{ratio} | {extra} | {r['mha_numpy_bf16_ms']:.4g} |")
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads_list = sorted({r["threads"] for r in rows})
    names = list(dict.fromkeys(r["shape"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(threads_list)
    for i, t in enumerate(threads_list):
        sp = [next(r["speedup"] for r in rows if r["shape"] == n and r["threads"] == t) for n in names]
        bars = ax.bar(np.arange(len(names)) + i * width, sp, width, label=f"{t} thread{'s' if t > 1 else ''}")
        ax.bar_label(bars, fmt="%.1fx", fontsize=8)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(names)) + width * (len(threads_list) - 1) / 2)
    ax.set_xticklabels(names, fontsize=8, rotation=10)
    ax.set_ylabel("speedup of mha.torch over torch")
    ax.set_title("mha vs torch.nn.MultiheadAttention from Python (median time per call, batch_first, eval)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m mha.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="at most this many timed calls per round")
    ap.add_argument("--seconds", type=float, default=1.0, help="about this long per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the median of the rounds' medians is reported")
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)")
    ap.add_argument("--out", default="results", help="folder for bench_python.json / .md / .png")
    ap.add_argument("--quick", action="store_true", help="BERT-base and the tiny shape only")
    args = ap.parse_args(argv)
    ncpu = os.cpu_count() or 1
    threads_list = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, ncpu})
    shapes = [s for s in SHAPES if not args.quick or s[0] in ("BERT-base", "tiny (call overhead)")]
    rows = run(shapes, threads_list, args.reps, args.rounds, args.seconds)
    os.makedirs(args.out, exist_ok=True)
    md = table(rows)
    md += (f"\n\ntorch {rows[0]['torch_version']} with {rows[0]['torch_blas']}; mha ISA "
           f"{__import__('mha').detected_isa()}; {ncpu} logical CPUs")
    print(md)
    with open(os.path.join(args.out, "bench_python.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(args.out, "bench_python.json"), "w") as f:
        json.dump(rows, f, indent=1)
    try:
        plot(rows, os.path.join(args.out, "bench_python.png"))
        print(f"wrote {os.path.join(args.out, 'bench_python.png')}")
    except ImportError:
        print("matplotlib missing: no chart")


if __name__ == "__main__":
    main()
