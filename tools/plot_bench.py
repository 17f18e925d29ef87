#!/usr/bin/env python3
"""Charts and a Markdown table from bench_attention's Google Benchmark JSON output.

usage: plot_bench.py [--out DIR] FILE.json [FILE.json ...]
       plot_bench.py [--out DIR] --serving FILE.json     (bench/serving_sim --json FILE: serving.png, serving.md)

Reads runs named suite/backend/E:../H:../B:../L:../threads:..[/impl:..] (see bench/bench_attention.cpp)
and writes into DIR (default: results):
  scaling-heads.png    GFLOP/s vs head count, simd and scalar per embed dim, and the simd/scalar speedup
  scaling-threads.png  speedup vs thread count with the ideal (linear) line
  scaling-lengths.png  time and memory vs sequence length, Impl::materialized vs Impl::fused
  scaling.md           the table of every run (also printed)
A chart is skipped when its suite is absent. Without matplotlib only the table is written.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

SUITE_TITLES = OrderedDict([
    ("bert", "BERT-base shapes (E 768, H 12)"),
    ("heads", "Head-count sweep"),
    ("threads", "Thread sweep"),
    ("lengths", "Sequence-length sweep (B 1, E 768, H 12)"),
])


def parse_name(name):
    """'heads/simd/E:768/H:12/B:8/L:128/threads:2/real_time' -> dict of fields (ints where numeric)."""
    parts = name.split("/")
    run = {"suite": parts[0], "backend": parts[1] if len(parts) > 1 else "?"}
    for p in parts[2:]:
        if ":" in p:
            k, v = p.split(":", 1)
            run[k] = int(v) if v.isdigit() else v
    return run


def to_ms(value, unit):
    return value * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def load(files):
    """The contexts of the files, and their iteration runs (the fastest repetition of each name)."""
    contexts, runs = [], OrderedDict()
    for path in files:
        with open(path) as f:
            data = json.load(f)
        contexts.append(data.get("context", {}))
        for b in data.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration":
                continue
            fields = parse_name(b["name"])
            if fields["suite"] not in SUITE_TITLES:
                continue
            if b.get("error_occurred"):
                print(f"plot_bench: {b['name']} failed: {b.get('error_message', '')}", file=sys.stderr)
                continue
            entry = runs.setdefault(b["run_name"], dict(fields, samples=[], context=len(contexts) - 1))
            entry["samples"].append(b)
            entry["label"] = b.get("label", "")
    for r in runs.values():
        # With repetitions, the fastest one: other work on the machine only ever slows a run down.
        samples = r.pop("samples")
        best = min(samples, key=lambda x: to_ms(x["real_time"], x["time_unit"]))
        r["repetitions"] = len(samples)
        r["time_ms"] = to_ms(best["real_time"], best["time_unit"])
        for key in ("GFLOPS", "pct_peak", "speedup_vs_scalar", "speedup_vs_1t", "scratch", "rss_growth"):
            if key in best:
                r[key] = best[key]
    runs = list(runs.values())
    recompute_speedups(runs)
    return contexts, runs


def recompute_speedups(runs):
    """Speedups from the chosen repetitions (the binary compares with the last one it ran):
    heads: simd ÷ scalar at the same E and H; bert: at the same E, H, B and L; threads: ÷ 1 thread."""
    def find(pred):
        return next((r for r in runs if pred(r)), None)
    for r in runs:
        base = None
        if r["backend"] == "simd" and r["suite"] == "heads":
            base = find(lambda b: b["suite"] == "heads" and b["backend"] == "scalar" and b["E"] == r["E"]
                        and b["H"] == r["H"])
            key = "speedup_vs_scalar"
        elif r["backend"] == "simd" and r["suite"] == "bert":
            base = find(lambda b: b["suite"] == "bert" and b["backend"] == "scalar" and
                        all(b[k] == r[k] for k in ("E", "H", "B", "L")))
            key = "speedup_vs_scalar"
        elif r["suite"] == "threads":
            base = find(lambda b: b["suite"] == "threads" and b["threads"] == 1)
            key = "speedup_vs_1t"
        if base is not None and "GFLOPS" in r and "GFLOPS" in base:
            r[key] = r["GFLOPS"] / base["GFLOPS"]


def fmt(v, digits=1):
    return "" if v is None else f"{v:.{digits}f}"


def mib(v):
    return None if v is None else v / 2**20


def describe(context):
    """One line on the machine and the FMA peak the benchmark binary measured when it started."""
    if "fma_peak_gflops_1thread" not in context:
        return ""
    load = ", ".join(f"{x:.1f}" for x in context.get("load_avg", []))
    return (f"FMA peak measured at start-up ({context.get('fma_peak_isa', '?')} loop): "
            f"{float(context['fma_peak_gflops_1thread']):.1f} GFLOP/s on 1 thread, "
            f"{float(context['fma_peak_gflops_all_threads']):.1f} GFLOP/s on {context.get('fma_peak_threads', '?')} "
            f"threads; library ISA {context.get('mha_isa', '?')}; {context.get('num_cpus', '?')} CPUs at "
            f"{context.get('mhz_per_cpu', '?')} MHz; load average {load}; {context.get('date', '')}.")


def buffer_bytes(run):
    """The whole-sequence buffers of one forward: Q/K/V/context B·L·4E floats, and for fused the K and V
    panels, about 2·B·L·E more (see scratch_bytes in bench/bench_attention.cpp for the padding)."""
    return 4 * run["B"] * run["L"] * (6 if run.get("impl") == "fused" else 4) * run["E"]


def markdown(contexts, runs):
    lines = []
    for suite, title in SUITE_TITLES.items():
        rows = [r for r in runs if r["suite"] == suite]
        if not rows:
            continue
        lines.append(f"### {title}")
        lines.append("")
        for i in sorted({r["context"] for r in rows}):
            if describe(contexts[i]):
                lines += [describe(contexts[i]), ""]
        memory = suite == "lengths"
        head = ["backend", "E", "H", "B", "L", "threads"] + (["impl"] if memory else [])
        head += ["time (ms)", "GFLOP/s", "% peak"]
        if suite in ("heads", "bert"):
            head.append("speedup vs scalar")
        if suite == "threads":
            head.append("speedup vs 1 thread")
        if memory:
            head += ["scratch model (MiB)", "peak RSS growth (MiB)"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for r in rows:
            cells = [r["backend"], r.get("E"), r.get("H"), r.get("B"), r.get("L"), r.get("threads")]
            if memory:
                cells.append(r.get("impl", ""))
            cells += [fmt(r["time_ms"], 2), fmt(r.get("GFLOPS")), fmt(r.get("pct_peak"))]
            if suite in ("heads", "bert"):
                cells.append(fmt(r.get("speedup_vs_scalar")))
            if suite == "threads":
                cells.append(fmt(r.get("speedup_vs_1t"), 2))
            if memory:
                cells += [fmt(mib(r.get("scratch"))), fmt(mib(r.get("rss_growth")))]
            lines.append("| " + " | ".join("" if c is None else str(c) for c in cells) + " |")
        notes = sorted({r["label"] for r in rows if r.get("label")})
        reps = max(r["repetitions"] for r in rows)
        if reps > 1:
            notes.append(f"Best of {reps} repetitions (fastest time; its counters).")
        if suite == "heads":
            notes.append("speedup vs scalar = simd GFLOP/s (all threads, batch above) ÷ scalar GFLOP/s at the same "
                         "E and H (one thread, its own batch).")
        if memory:
            notes.append("scratch model = Q/K/V/context buffers B·L·4E floats, plus per thread 64·L score floats "
                         "(materialized), or plus the packed K and V panels, about 2·B·L·E floats, and per thread "
                         "128·256 + 128·d + 256 floats "
                         "(fused). Peak RSS growth = measured rise of "
                         "the peak resident memory (VmHWM) over one forward call in a fresh process, after the "
                         "inputs and weights exist.")
        for n in notes:
            lines.append(f"\n_{n}_")
        lines.append("")
    return "\n".join(lines)


def peak_gflops(context, threads):
    """The FMA peak on `threads` threads as bench_attention counts it (FmaPeak::for_threads), or None."""
    try:
        one = float(context["fma_peak_gflops_1thread"])
        every = float(context["fma_peak_gflops_all_threads"]) / int(context["fma_peak_threads"])
    except (KeyError, ValueError, ZeroDivisionError):
        return None
    return max(one, every) * threads


def plot(contexts, runs, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    heads = [r for r in runs if r["suite"] == "heads"]
    if heads:
        hs_all = sorted({r["H"] for r in heads})
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
        for backend, style in (("simd", "-o"), ("scalar", "--s")):
            for E in sorted({r["E"] for r in heads}):
                pts = sorted((r["H"], r["GFLOPS"], r.get("B"), r.get("threads")) for r in heads
                             if r["backend"] == backend and r["E"] == E)
                if not pts:
                    continue
                _, _, B, T = pts[0]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style,
                        label=f"{backend} E={E} (B={B}, {T} thread{'s' if T != 1 else ''})")
                if backend == "simd":
                    sp = sorted((r["H"], r["speedup_vs_scalar"]) for r in heads
                                if r["backend"] == "simd" and r["E"] == E and "speedup_vs_scalar" in r)
                    if sp:
                        ax2.plot([p[0] for p in sp], [p[1] for p in sp], "-o", label=f"E={E}")
        top_peak = 0
        for T in sorted({r["threads"] for r in heads}):
            peak = peak_gflops(contexts[heads[0]["context"]], T)
            if peak:
                ax.axhline(peak, color="gray", ls=":", lw=1)
                ax.annotate(f"FMA peak, {T} thread{'s' if T != 1 else ''}", (hs_all[-1], peak),
                            textcoords="offset points", xytext=(0, 3), ha="right", fontsize=7, color="gray")
                top_peak = max(top_peak, peak)
        L = heads[0].get("L")
        ax.set(xscale="log", yscale="log", xlabel="heads H", ylabel="GFLOP/s",
               title=f"Self-attention forward, L={L}")
        if top_peak:
            ax.set_ylim(top=max(ax.get_ylim()[1], top_peak * 1.4))  # room for the peak labels
        ax2.set(xscale="log", xlabel="heads H", ylabel="simd ÷ scalar GFLOP/s", title="Speedup over the scalar reference")
        ax2.set_ylim(bottom=0)
        hs = sorted({r["H"] for r in heads})
        for a in (ax, ax2):
            a.set_xticks(hs)
            a.set_xticklabels([str(h) for h in hs])
            a.minorticks_off()
            a.grid(True, which="both", alpha=0.3)
            if a.get_legend_handles_labels()[0]:
                a.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, "scaling-heads.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    threads = sorted((r for r in runs if r["suite"] == "threads"), key=lambda r: r["threads"])
    if threads:
        base = next((r for r in threads if r["threads"] == 1), None)
        fig, ax = plt.subplots(figsize=(6.4, 4.8))
        ts = [r["threads"] for r in threads]
        if base:
            ax.plot(ts, [r["GFLOPS"] / base["GFLOPS"] for r in threads], "-o", label="measured")
            for r in threads:
                ax.annotate(f"{r['GFLOPS']:.0f} GFLOP/s", (r["threads"], r["GFLOPS"] / base["GFLOPS"]),
                            textcoords="offset points", xytext=(4, -12), fontsize=8)
        ax.plot([1, max(ts)], [1, max(ts)], "k:", label="ideal (linear)")
        r0 = threads[0]
        ax.set(xlabel="threads", ylabel="speedup over 1 thread",
               title=f"Thread scaling, B={r0['B']} L={r0['L']} E={r0['E']} H={r0['H']}")
        ax.set_xticks(ts)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, "scaling-threads.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    lengths = [r for r in runs if r["suite"] == "lengths"]
    if lengths:
        fig, (ax, ax1, ax2) = plt.subplots(1, 3, figsize=(16, 4.8))
        for impl, color in (("materialized", "tab:red"), ("fused", "tab:blue")):
            pts = sorted((r for r in lengths if r.get("impl") == impl), key=lambda r: r["L"])
            if not pts:
                continue
            Ls = [r["L"] for r in pts]
            ax.plot(Ls, [r["time_ms"] for r in pts], "-o", color=color, label=impl)
            ax1.plot(Ls, [r["GFLOPS"] for r in pts], "-o", color=color, label=impl)
            ax2.plot(Ls, [mib(r["scratch"]) for r in pts], "-o", color=color, label=f"{impl}: model, total")
            ax2.plot(Ls, [mib(r["scratch"] - buffer_bytes(r)) for r in pts], "--", color=color,
                     label=f"{impl}: model, per-thread scratch only")
            rss = [(r["L"], mib(r["rss_growth"])) for r in pts if "rss_growth" in r]
            if rss:
                ax2.plot([p[0] for p in rss], [p[1] for p in rss], "x:", color=color,
                         label=f"{impl}: peak RSS growth (measured)")
        r0 = lengths[0]
        shape = f"B={r0['B']} E={r0['E']} H={r0['H']}, {r0['threads']} threads"
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="time per forward (ms)",
               title=f"Time ({shape})")
        ax1.set(xscale="log", xlabel="sequence length L", ylabel="GFLOP/s", title="Throughput")
        ax1.set_ylim(bottom=0)
        ax2.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="MiB",
                title="Working memory")
        Ls = sorted({r["L"] for r in lengths})
        for a in (ax, ax1, ax2):
            a.set_xticks(Ls)
            a.set_xticklabels([str(x) for x in Ls])
            a.minorticks_off()
            a.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax1.legend(fontsize=8)
        ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
        fig.tight_layout()
        path = os.path.join(out_dir, "scaling-lengths.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    return written


def serving(path, out_dir):
    """Output tokens/s and peak KV memory of each method of bench/serving_sim."""
    with open(path) as f:
        rows = json.load(f)["serving"]
    lines = ["| method | output tokens/s | peak KV MB | tokens held then, MB |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['peak_kv_bytes'] / 1e6:.1f} | {r['held_kv_bytes'] / 1e6:.1f} |")
    table = "\n".join(lines)
    written = [os.path.join(out_dir, "serving.md")]
    with open(written[0], "w") as f:
        f.write("# Serving simulation\n\n" + table + "\n")
    print(table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_bench: no chart ({e}); install python3-matplotlib", file=sys.stderr)
        return written
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["method"] for r in rows]
    a.bar(names, [r["tokens_per_s"] for r in rows])
    a.set_ylabel("output tokens/s")
    a.set_title("Throughput")
    x = range(len(rows))
    b.bar([i - 0.2 for i in x], [r["peak_kv_bytes"] / 1e6 for r in rows], width=0.4, label="peak KV held")
    b.bar([i + 0.2 for i in x], [r["held_kv_bytes"] / 1e6 for r in rows], width=0.4, label="tokens' K/V then")
    b.set_xticks(list(x))
    b.set_xticklabels(names)
    b.set_ylabel("MB")
    b.set_title("KV memory")
    b.legend()
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=15)
    fig.tight_layout()
    written.append(os.path.join(out_dir, "serving.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="folder for the charts and the table (default: results)")
    ap.add_argument("--serving", action="store_true", help="the files are bench/serving_sim --json output")
    ap.add_argument("files", nargs="+", help="JSON files written with --benchmark_out_format=json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.serving:
        for path in args.files:
            for w in serving(path, args.out):
                print(f"wrote {w}")
        return
    contexts, runs = load(args.files)
    if not runs:
        sys.exit("plot_bench: no attention benchmark runs in " + ", ".join(args.files))

    table = markdown(contexts, runs)
    table_path = os.path.join(args.out, "scaling.md")
    with open(table_path, "w") as f:
        f.write("# Attention scaling results\n\n" + table + "\n")
    print(table)

    try:
        written = plot(contexts, runs, args.out)
    except ImportError as e:
        print(f"plot_bench: no charts ({e}); install python3-matplotlib", file=sys.stderr)
        written = []
    for path in [table_path] + written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
