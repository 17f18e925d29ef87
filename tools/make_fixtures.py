#!/usr/bin/python3
"""Writes the PyTorch fixtures in tests/data/<case>/ (a developer tool; the tests never need torch).

Each case folder is laid out as `mha run --npy DIR` reads it:
  query.npy [B, Lq, E] float32; key.npy / value.npy [B, Lk, E] when they differ from query;
  in_proj_weight.npy [3E, E]; in_proj_bias.npy [3E]; out_proj.weight.npy [E, E]; out_proj.bias.npy [E];
  key_padding_mask.npy [B, Lk] (bool or float32); attn_mask.npy [Lq, Lk] or [B*H, Lq, Lk] (bool or float32);
  norm.weight.npy / norm.bias.npy [E] (post-norm case);
  expected_output.npy [B, Lq, E] float64; expected_attn_weights.npy float64 ([B, Lq, Lk] averaged,
  [B, H, Lq, Lk] per head) when weights are requested;
  args.json {"heads", "causal", "need_weights": "none"|"averaged"|"per_head", "norm_eps": null|number}.
Expected values come from the module in float64 (.double()) on the float64 copies of the float32
values that were saved, so the only difference left for the library is its own float32 rounding.
Every case is also checked here against a small NumPy float64 implementation of the documented
semantics, so a fixture cannot silently encode a different meaning (e.g. a torch fast path).
No fully masked rows (PyTorch gives NaN there).

Large cases (E up to 1024, L up to 1100: the fused path, GEMM k-blocks past KC = 768, many query
blocks) would be megabytes as .npy, so they are stored in tests/data/large_fixtures.json as a recipe
plus a summary of PyTorch's float64 result: inputs and parameters come from a counter-based generator
(`counter_uniform` below; tests/test_pytorch_large_fixtures.cpp implements the same one), and the
expected output (and averaged weights) are kept as a checksum Σ o_i·r_i with r_i from the same
generator, max|o|, and every 997th element in float64.

usage: /usr/bin/python3 tools/make_fixtures.py [OUT_DIR]   (default: tests/data next to this script)
"""
import json
import math
import os
import re
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")


# Seed 000's module (BERT-style self-attention with a TF-style post-norm), as written there,
# without the commented-out attention mask. Dropout is inactive in eval mode.
class LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class SelfAttention(nn.Module):
    def __init__(self, num_attention_heads, input_size, hidden_size, hidden_dropout_prob):
        super().__init__()
        if hidden_size % num_attention_heads != 0:
            raise ValueError("hidden size %d is not a multiple of heads %d" % (hidden_size, num_attention_heads))
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = int(hidden_size / num_attention_heads)
        self.all_head_size = hidden_size
        self.query = nn.Linear(input_size, self.all_head_size)
        self.key = nn.Linear(input_size, self.all_head_size)
        self.value = nn.Linear(input_size, self.all_head_size)
        self.attn_dropout = nn.Dropout(0.8)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = LayerNorm(hidden_size, eps=1e-12)
        self.out_dropout = nn.Dropout(hidden_dropout_prob)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(*new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, input_tensor):
        query_layer = self.transpose_for_scores(self.query(input_tensor))
        key_layer = self.transpose_for_scores(self.key(input_tensor))
        value_layer = self.transpose_for_scores(self.value(input_tensor))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_probs = nn.Softmax(dim=-1)(attention_scores)
        attention_probs = self.attn_dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        context_layer = context_layer.view(*(context_layer.size()[:-2] + (self.all_head_size,)))
        hidden_states = self.out_dropout(self.dense(context_layer))
        return self.LayerNorm(hidden_states + input_tensor)


def f32(t):
    return t.detach().to(torch.float32).numpy()


def randomize(module, gen):
    """Every parameter uniform in ±1/sqrt(fan-in) (PyTorch zero-initializes the biases)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "LayerNorm" in name:  # gamma around 1, beta around 0
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.5 * (2 * torch.rand(p.shape, generator=gen) - 1))
            else:
                a = 1.0 / math.sqrt(p.shape[-1] if p.dim() > 1 else p.shape[0])
                p.copy_(a * (2 * torch.rand(p.shape, generator=gen) - 1))
            # Round to float32 so the float64 module computes on exactly the values that are saved.
            p.copy_(p.to(torch.float32).to(p.dtype))


def numpy_mha(q, k, v, w_in, b_in, w_out, b_out, H, kpm, am, causal, need, norm):
    """The documented semantics in float64 NumPy (an independent check of the torch result)."""
    E = q.shape[-1]
    d = E // H
    Q, K, V = (x @ w_in[i * E:(i + 1) * E].T + b_in[i * E:(i + 1) * E] for i, x in enumerate((q, k, v)))
    B, Lq, Lk = q.shape[0], q.shape[1], k.shape[1]
    ctx = np.zeros((B, Lq, E))
    probs = np.zeros((B, H, Lq, Lk))
    for b in range(B):
        for h in range(H):
            s = Q[b][:, h * d:(h + 1) * d] @ K[b][:, h * d:(h + 1) * d].T / math.sqrt(d)
            if kpm is not None:
                s = s + (np.where(kpm[b], -np.inf, 0.0) if kpm.dtype == bool else kpm[b].astype(np.float64))
            if am is not None:
                m = am if am.ndim == 2 else am[b * H + h]
                s = s + (np.where(m, -np.inf, 0.0) if m.dtype == bool else m.astype(np.float64))
            if causal:
                s = s + np.where(np.triu(np.ones((Lq, Lk), bool), 1), -np.inf, 0.0)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            probs[b, h] = p
            ctx[b][:, h * d:(h + 1) * d] = p @ V[b][:, h * d:(h + 1) * d]
    out = ctx @ w_out.T + b_out
    if norm is not None:
        g, beta, eps = norm
        z = out + q
        mu = z.mean(-1, keepdims=True)
        out = g * (z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + eps) + beta
    weights = probs.mean(1) if need == "averaged" else probs if need == "per_head" else None
    return out, weights


def write_case(name, arrays, args, expected_out, expected_w):
    folder = os.path.join(OUT, name)
    os.makedirs(folder)
    for fname, arr in arrays.items():
        np.save(os.path.join(folder, fname + ".npy"), arr)
    np.save(os.path.join(folder, "expected_output.npy"), expected_out.astype(np.float64))
    if expected_w is not None:
        np.save(os.path.join(folder, "expected_attn_weights.npy"), expected_w.astype(np.float64))
    with open(os.path.join(folder, "args.json"), "w") as f:
        json.dump(args, f, indent=1)
        f.write("\n")


def mha_case(name, gen, B, Lq, Lk, E, H, cross=False, kpm=None, am=None, causal=False, need="none"):
    m = nn.MultiheadAttention(E, H, batch_first=True)
    randomize(m, gen)
    m.eval()
    q = f32(2 * torch.rand(B, Lq, E, generator=gen) - 1)
    k = f32(2 * torch.rand(B, Lk, E, generator=gen) - 1) if cross else q
    v = f32(2 * torch.rand(B, Lk, E, generator=gen) - 1) if cross else q
    md = m.double()
    mask = am
    if causal:  # torch 1.13 has no is_causal: a boolean upper-triangular mask; the library gets causal=true
        assert am is None
        mask = np.triu(np.ones((Lq, Lk), bool), 1)
    t = lambda a: None if a is None else torch.from_numpy(a if a.dtype == bool else a.astype(np.float64))
    # Grad stays enabled (parameters require grad), which keeps torch off its native fast path.
    out, w = md(t(q), t(k), t(v), key_padding_mask=t(kpm), attn_mask=t(mask), need_weights=need != "none",
                average_attn_weights=need == "averaged")
    out = out.detach().numpy()
    w = None if need == "none" else w.detach().numpy()
    arrays = {"query": q, "in_proj_weight": f32(m.in_proj_weight), "in_proj_bias": f32(m.in_proj_bias),
              "out_proj.weight": f32(m.out_proj.weight), "out_proj.bias": f32(m.out_proj.bias)}
    if cross:
        arrays["key"], arrays["value"] = k, v
    if kpm is not None:
        arrays["key_padding_mask"] = kpm
    if am is not None:
        arrays["attn_mask"] = am
    check = numpy_mha(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                      *(arrays[n].astype(np.float64) for n in ("in_proj_weight", "in_proj_bias", "out_proj.weight",
                                                               "out_proj.bias")), H, kpm, am, causal, need, None)
    assert np.isfinite(out).all(), name
    assert np.allclose(out, check[0], rtol=0, atol=1e-12), name
    if w is not None:
        assert w.shape == check[1].shape and np.allclose(w, check[1], rtol=0, atol=1e-12), name
    write_case(name, arrays, {"heads": H, "causal": causal, "need_weights": need, "norm_eps": None}, out, w)


def seed000_case(name, gen, B, L, E, H):
    m = SelfAttention(H, E, E, 0.1)
    randomize(m, gen)
    m.eval()
    x = f32(2 * torch.rand(B, L, E, generator=gen) - 1)
    out = m.double()(torch.from_numpy(x.astype(np.float64))).detach().numpy()
    arrays = {"query": x,
              "in_proj_weight": f32(torch.cat([m.query.weight, m.key.weight, m.value.weight])),
              "in_proj_bias": f32(torch.cat([m.query.bias, m.key.bias, m.value.bias])),
              "out_proj.weight": f32(m.dense.weight), "out_proj.bias": f32(m.dense.bias),
              "norm.weight": f32(m.LayerNorm.weight), "norm.bias": f32(m.LayerNorm.bias)}
    xd = x.astype(np.float64)
    check, _ = numpy_mha(xd, xd, xd, *(arrays[n].astype(np.float64) for n in ("in_proj_weight", "in_proj_bias",
                                                                              "out_proj.weight", "out_proj.bias")),
                         H, None, None, False, "none",
                         (arrays["norm.weight"].astype(np.float64), arrays["norm.bias"].astype(np.float64), 1e-12))
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    write_case(name, arrays, {"heads": H, "causal": False, "need_weights": "none", "norm_eps": 1e-12}, out, None)


def bool_mask(gen, shape, density, keep_col):
    """Random boolean mask (True = masked); column keep_col(row index) stays unmasked in every row."""
    m = (torch.rand(shape, generator=gen) < density).numpy()
    rows = m.reshape(-1, shape[-1])
    for r in range(rows.shape[0]):
        rows[r, keep_col(r)] = False
    return m


# --- Large cases: a counter-based generator shared with tests/test_pytorch_large_fixtures.cpp ----------

M64 = (1 << 64) - 1
STREAM_MUL = 0xD1B54A32D192ED03
SAMPLE_STRIDE = 997
# Streams of a case with seed S: S*16 + k for k = 0 in_proj_weight, 1 in_proj_bias, 2 out_proj.weight,
# 3 out_proj.bias, 4 query, 5 key, 6 value, 7 key_padding_mask, 8 output checksum, 9 weights checksum.
STREAMS = {"in_proj_weight": 0, "in_proj_bias": 1, "out_proj.weight": 2, "out_proj.bias": 3, "query": 4,
           "key": 5, "value": 6, "key_padding_mask": 7, "output_checksum": 8, "weights_checksum": 9}


def splitmix64(x):
    """splitmix64's output function on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def counter_bits(stream, n):
    """The top 24 bits of splitmix64(stream·0xD1B54A32D192ED03 + i), i = 0 .. n-1 (mod 2^64), as int64."""
    base = np.uint64((stream * STREAM_MUL) & M64)
    with np.errstate(over="ignore"):
        x = base + np.arange(n, dtype=np.uint64)
    return (splitmix64(x) >> np.uint64(40)).astype(np.int64)


def counter_uniform(stream, n, amplitude_log2):
    """a·(k − 2^23)/2^23 for the 24-bit k above, a = 2^amplitude_log2: uniform in [-a, a), exact in float32."""
    return ((counter_bits(stream, n) - (1 << 23)) * 2.0 ** (amplitude_log2 - 23)).astype(np.float32)


def summary(x, stream):
    """What the JSON keeps of a float64 result: checksum with r_i = counter_uniform(stream, n, 0) in
    float64, max|x|, and the elements at flat index 0, 997, 1994, ... to 12 significant digits (1e-12
    relative, far below the tests' 1e-5)."""
    flat = x.astype(np.float64).ravel()
    r = counter_uniform(stream, flat.size, 0).astype(np.float64)
    return {"count": int(flat.size), "checksum": float(np.dot(flat, r)), "max_abs": float(np.abs(flat).max()),
            "stride": SAMPLE_STRIDE, "samples": [float("%.12g" % v) for v in flat[::SAMPLE_STRIDE]]}


def large_case(name, seed, B, Lq, Lk, E, H, cross=False, causal=False, kpm_density=0.0, need="none",
               weight_log2=-5):
    S = seed * 16
    u = lambda key, n, a: counter_uniform(S + STREAMS[key], n, a)
    arrays = {"in_proj_weight": u("in_proj_weight", 3 * E * E, weight_log2).reshape(3 * E, E),
              "in_proj_bias": u("in_proj_bias", 3 * E, weight_log2),
              "out_proj.weight": u("out_proj.weight", E * E, weight_log2).reshape(E, E),
              "out_proj.bias": u("out_proj.bias", E, weight_log2)}
    q = u("query", B * Lq * E, 0).reshape(B, Lq, E)
    k = u("key", B * Lk * E, 0).reshape(B, Lk, E) if cross else q
    v = u("value", B * Lk * E, 0).reshape(B, Lk, E) if cross else q
    kpm = None
    if kpm_density > 0:  # True (masked) where the 24 bits fall below density·2^24; key 0 never masked
        kpm = (counter_bits(S + STREAMS["key_padding_mask"], B * Lk) < int(kpm_density * (1 << 24))).reshape(B, Lk)
        kpm[:, 0] = False
    m = nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.from_numpy(arrays["in_proj_weight"]))
        m.in_proj_bias.copy_(torch.from_numpy(arrays["in_proj_bias"]))
        m.out_proj.weight.copy_(torch.from_numpy(arrays["out_proj.weight"]))
        m.out_proj.bias.copy_(torch.from_numpy(arrays["out_proj.bias"]))
    m.eval()
    md = m.double()
    mask = np.triu(np.ones((Lq, Lk), bool), 1) if causal else None
    t = lambda a: None if a is None else torch.from_numpy(a if a.dtype == bool else a.astype(np.float64))
    out, w = md(t(q), t(k), t(v), key_padding_mask=t(kpm), attn_mask=t(mask), need_weights=need != "none",
                average_attn_weights=True)
    out = out.detach().numpy()
    assert np.isfinite(out).all(), name
    check, check_w = numpy_mha(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               *(arrays[n].astype(np.float64) for n in ("in_proj_weight", "in_proj_bias",
                                                                        "out_proj.weight", "out_proj.bias")),
                               H, kpm, None, causal, need, None)
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    case = {"name": name, "seed": seed, "B": B, "Lq": Lq, "Lk": Lk, "E": E, "H": H, "cross": cross,
            "causal": causal, "key_padding_density": kpm_density, "weight_amplitude_log2": weight_log2,
            "need_weights": need, "output": summary(out, S + STREAMS["output_checksum"])}
    if need != "none":
        w = w.detach().numpy()
        assert np.allclose(w, check_w, rtol=0, atol=1e-12), name
        case["attn_weights"] = summary(w, S + STREAMS["weights_checksum"])
    return case


def write_large_cases():
    cases = [
        # (a) self-attention with key padding: fused by default (Lk >= 1024), 9 query blocks of 128,
        #     projections with K = 1024 > KC = 768; averaged weights through the materialized path.
        large_case("large_self_key_padding", 1, B=1, Lq=1100, Lk=1100, E=1024, H=16, kpm_density=0.25,
                   need="averaged"),
        # (b) causal self-attention, same size.
        large_case("large_causal", 2, B=1, Lq=1100, Lk=1100, E=1024, H=16, causal=True),
        # (c) cross-attention Lq != Lk >= 1024, two batches, key padding, no weights.
        large_case("large_cross", 3, B=2, Lq=300, Lk=1100, E=512, H=8, cross=True, kpm_density=0.2),
    ]
    doc = {"generator": "value i of stream s: k = splitmix64(s*0xD1B54A32D192ED03 + i mod 2^64) >> 40; "
                        "x = 2^a * (k - 2^23) / 2^23 (float32, exact); masks: k < density * 2^24; "
                        "stream of tensor t in a case with seed S: S*16 + index of t in 'streams'",
           "streams": sorted(STREAMS, key=STREAMS.get), "cases": cases}
    text = json.dumps(doc, indent=1)
    text = re.sub(r"\[\s+([-0-9.eE+,\s]+?)\s+\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    with open(os.path.join(OUT, "large_fixtures.json"), "w") as f:
        f.write(text + "\n")


def main():
    if os.path.isdir(OUT):
        for entry in os.listdir(OUT):  # regenerate the case folders; keep README.md
            if os.path.isdir(os.path.join(OUT, entry)):
                shutil.rmtree(os.path.join(OUT, entry))
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20240601)

    mha_case("no_mask", gen, B=2, Lq=7, Lk=7, E=16, H=4)
    mha_case("key_padding_bool", gen, B=3, Lq=8, Lk=8, E=16, H=2,
             kpm=bool_mask(gen, (3, 8), 0.35, lambda r: r % 8))
    kpm_float = f32(-3 * torch.rand(2, 6, generator=gen) + 0.5)
    mha_case("key_padding_float", gen, B=2, Lq=6, Lk=6, E=12, H=3, kpm=kpm_float)
    mha_case("attn_mask_bool_2d", gen, B=2, Lq=9, Lk=9, E=24, H=4,
             am=bool_mask(gen, (9, 9), 0.4, lambda r: r))
    am3 = f32(4 * torch.rand(8, 5, 5, generator=gen) - 3)
    am3[bool_mask(gen, (8, 5, 5), 0.2, lambda r: r % 5)] = -np.inf  # some -inf, never a whole row
    mha_case("attn_mask_float_3d", gen, B=2, Lq=5, Lk=5, E=16, H=4, am=am3)
    mha_case("causal", gen, B=2, Lq=10, Lk=10, E=32, H=8, causal=True)
    mha_case("cross_attention", gen, B=2, Lq=5, Lk=9, E=16, H=2, cross=True)
    mha_case("need_weights_averaged", gen, B=2, Lq=6, Lk=6, E=16, H=4, need="averaged",
             kpm=bool_mask(gen, (2, 6), 0.3, lambda r: 0))
    mha_case("need_weights_per_head", gen, B=2, Lq=4, Lk=7, E=20, H=5, cross=True, need="per_head")
    seed000_case("seed000_self_attention", gen, B=2, L=8, E=32, H=4)
    write_large_cases()
    print("wrote", len([e for e in os.listdir(OUT) if os.path.isdir(os.path.join(OUT, e))]), "cases to", OUT)


if __name__ == "__main__":
    main()
