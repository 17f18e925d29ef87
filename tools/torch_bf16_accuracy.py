#!/usr/bin/env python3
"""A bfloat16 nn.MultiheadAttention through mha.torch and through torch, each against the float64 oracle on the
same bf16 weights and inputs (E 64, H 4, B 2, L 16: test_torch_dropin's setup); rms and max errors.

    cd python/tests && PYTHONPATH=../../build/python python3 ../../tools/torch_bf16_accuracy.py
"""
import numpy as np, torch, sys
sys.path.insert(0, ".")
import mha.torch as mt
from attention_reference import mha_reference, UBF16
from test_torch import torch_mha, weights_of
for seed in (13, 21, 34):
    E, H, B, L = 64, 4, 2, 16
    tm = torch_mha(E, H, seed=seed, batch_first=True).to(torch.bfloat16)
    mod = mt.MultiheadAttention.from_torch(tm)
    torch.manual_seed(seed)
    x = torch.randn(B, L, E).to(torch.bfloat16)
    with torch.no_grad():
        out = mod(x, x, x)[0]; t_out = tm(x, x, x)[0]
    w64 = {k: torch.from_numpy(v).double().numpy() for k, v in weights_of(tm).items()}
    xs = x.double().numpy()
    ref = mha_reference(xs, xs, xs, w64, H, ub=UBF16)[0]
    e = np.abs(out.double().numpy() - ref); t = np.abs(t_out.double().numpy() - ref)
    print(f"seed {seed}: mha rms {np.sqrt((e**2).mean()):.2e} max {e.max():.2e}; torch bf16 rms {np.sqrt((t**2).mean()):.2e} max {t.max():.2e}; ratio rms {np.sqrt((e**2).mean())/np.sqrt((t**2).mean()):.2f}")
