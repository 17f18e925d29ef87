#!/usr/bin/env python3
"""mha.torch against the numpy API on the same packed layer, single calls (batched for tiny shapes) alternated
ABBA: median per-call times, the median paired ratio and difference (issue 21's overhead figures).

    PYTHONPATH=build/python python3 tools/torch_overhead_abba.py B L E H ROUNDS   # e.g. 8 128 768 12 300, 1 1 64 4 3000
"""
import time, statistics, torch, sys
from torch import nn
import mha, mha.torch as mt
B, L, E, H, rounds = (int(a) for a in sys.argv[1:6])
torch.manual_seed(0)
ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
fast = mt.MultiheadAttention.from_torch(ref); fast.mha_threads = 1
x = torch.randn(B, L, E); xn = x.numpy()
with torch.no_grad(): fast(x, x, x)
layer = fast._mha_layer[0]
fns = {"mha.torch": lambda: fast(x, x, x, need_weights=False), "numpy": lambda: layer(xn, threads=1)}
inner = max(1, int(2e-4 / max(1e-7, 1e-9 * B * L * E * E / 5)))  # batch tiny calls: the timer must not dominate
res = {k: [] for k in fns}
with torch.inference_mode():
    for f in fns.values(): f(); f()
    for r in range(rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            f = fns[k]
            t0 = time.perf_counter()
            for _ in range(inner): f()
            res[k].append((time.perf_counter() - t0) / inner)
m = {k: statistics.median(v) for k, v in res.items()}
pr = statistics.median(a / b for a, b in zip(res["mha.torch"], res["numpy"]))
pd = statistics.median(a - b for a, b in zip(res["mha.torch"], res["numpy"]))
print(f"B{B} L{L} E{E} H{H}: mha.torch {m['mha.torch']*1e3:.4f} ms, numpy {m['numpy']*1e3:.4f} ms, "
      f"paired ratio {pr:.4f}, paired difference {pd*1e6:.2f} us ({rounds} rounds x {inner} calls)")
