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

Decoder-model cases (issue 12) go to tests/data/decoder/<case>/ (a folder of their own, so the tests and
tool runs that take every tests/data/<case>/ as an nn.MultiheadAttention case do not see them): a
Llama-style layer written here in float64 torch (separate q/k/v/o projections, GQA by repeat_interleave,
RoPE in both pairings at offsets up to 2^20 and per-sequence starts), nn.MultiheadAttention with
kdim/vdim != E, and the core as F.scaled_dot_product_attention (torch 1.13's private
F._scaled_dot_product_attention where the public one is missing). Files and args.json: see the comment
above write_decoder_cases and tests/data/README.md. Each is checked against NumPy float64 loops (KV head
h // G without repeating, RoPE as complex rotations) to 1e-12.

KV-cache generation cases (issue 13) go to tests/data/kv_cache/<case>/: the Llama-style layer run as a generating
model runs it (a prompt in one causal pass, then tokens one at a time against Hugging Face-style past_key_values),
with every token's output and the final cache (present_key / present_value); see the comment above
write_kv_cache_cases and tests/data/README.md.

bf16 cases (issue 14) go to tests/data/bf16/<case>/: inputs, weights, biases and additive masks rounded to
bfloat16 values first (stored as float32, exactly representable), the float64 oracle (expected_output.npy: the
module in float64 on those values) and PyTorch's own bf16 CPU result (torch_bf16_output.npy, float32: the
module and inputs .to(torch.bfloat16), the output widened); args.json adds "torch_bf16_max_abs_error" (its max
|torch bf16 − oracle|). See the comment above write_bf16_cases and tests/data/README.md.

Score-modifier cases (issue 24) go to tests/data/modifiers/<case>/: the attention core with Mistral's sliding
window, Gemma 2's softcap, gpt-oss's sinks and BLOOM's ALiBi written as each model's code does; see the comment
above write_modifier_cases.

usage: /usr/bin/python3 tools/make_fixtures.py [OUT_DIR [modifiers]]   (default: tests/data next to this script;
       `modifiers` rewrites only tests/data/modifiers/)
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
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else os.path.join(ROOT, "tests", "data")


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


# --- Decoder-model cases (issue 12): tests/data/decoder/<case>/ -------------------------------------
#
# Layers (args "kind": "layer"): query.npy [B, Lq, E]; key.npy [B, Lk, kdim], value.npy [B, Lk, vdim] when
# they differ from query; q_proj_weight.npy [H·d, E], k_proj_weight.npy [Hkv·d, kdim], v_proj_weight.npy
# [Hkv·d, vdim]; in_proj_bias.npy [H·d + 2·Hkv·d] (q; k; v) and out_proj.bias.npy [E] only when the layer has
# biases; out_proj.weight.npy [E, H·d]; optional masks as above; expected_output.npy [B, Lq, E] float64
# (and expected_attn_weights.npy). args.json: heads, kv_heads, head_dim, rope_theta / rope_style / rope_dims
# (null without RoPE), position_offset, positions (null or one start per sequence), causal (top-left),
# causal_bottom_right, need_weights, norm_eps (null).
# Core (args "kind": "sdpa"): q.npy [B, H, Lq, d], k.npy and v.npy [B, Hkv, Lk, d], optional masks,
# expected_output.npy [B, H, Lq, d] float64; args.json: heads, kv_heads, scale (null: 1/sqrt(d)), causal,
# causal_bottom_right. causal and causal_bottom_right are never both true.

DECODER_DIR = "decoder"


def uniform(gen, shape, a=1.0):
    """Uniform in [-a, a), rounded to float32 (the saved value is exactly what float64 torch computes on)."""
    return f32(a * (2 * torch.rand(shape, generator=gen) - 1))


def rope_torch(x, theta, r, style, positions):
    """design.md §5 in float64 on x [B, heads, L, d] at positions [B, L]: θ_k = theta^(−2k/r),
    (x1, x2) → (x1·cos(pθ_k) − x2·sin(pθ_k), x2·cos(pθ_k) + x1·sin(pθ_k)); half pairs (x_k, x_{k+r/2}),
    interleaved (x_{2k}, x_{2k+1}); dims r.. untouched."""
    k = torch.arange(r // 2, dtype=torch.float64)
    theta_k = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -2.0 * k / r)
    angle = positions[:, None, :, None] * theta_k  # [B, 1, L, r/2]
    c, s = torch.cos(angle), torch.sin(angle)
    i1 = torch.arange(r // 2) if style == "half" else 2 * torch.arange(r // 2)
    i2 = i1 + r // 2 if style == "half" else i1 + 1
    x1, x2 = x[..., i1], x[..., i2]
    y = x.clone()
    y[..., i1] = x1 * c - x2 * s
    y[..., i2] = x2 * c + x1 * s
    return y


def llama_attention(x, wq, wk, wv, wo, bias, H, Hkv, d, rope, starts, causal):
    """Llama-style self-attention in float64 torch: separate projections, RoPE on Q and K, GQA through
    repeat_interleave (Hugging Face's repeat_kv), top-left causal mask, output projection."""
    B, L, _ = x.shape
    bq, bk, bv, bo = bias if bias is not None else (None, None, None, None)
    q = F.linear(x, wq, bq).view(B, L, H, d).transpose(1, 2)
    k = F.linear(x, wk, bk).view(B, L, Hkv, d).transpose(1, 2)
    v = F.linear(x, wv, bv).view(B, L, Hkv, d).transpose(1, 2)
    if rope is not None:
        positions = torch.tensor(starts, dtype=torch.float64)[:, None] + torch.arange(L, dtype=torch.float64)
        q = rope_torch(q, rope["theta"], rope["dims"], rope["style"], positions)
        k = rope_torch(k, rope["theta"], rope["dims"], rope["style"], positions)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    c = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * d)
    return F.linear(c, wo, bo)


def numpy_rope(x, theta, r, style, p):
    """The same rotation written independently: each pair as a complex number times e^(i·p·θ_k)
    (Meta's Llama writes interleaved RoPE this way)."""
    k = np.arange(r // 2)
    w = np.exp(1j * p * float(theta) ** (-2.0 * k / r))
    y = x.copy()
    if style == "half":
        z = (x[:r // 2] + 1j * x[r // 2:r]) * w
        y[:r // 2], y[r // 2:r] = z.real, z.imag
    else:
        z = (x[0:r:2] + 1j * x[1:r:2]) * w
        y[0:r:2], y[1:r:2] = z.real, z.imag
    return y


def numpy_scores_mask(b, h, H, Lq, Lk, kpm, am, causal, bottom_right):
    """Additive mask of (b, h) as the library documents it: -inf where masked."""
    m = np.zeros((Lq, Lk))
    if kpm is not None:
        m = m + (np.where(kpm[b], -np.inf, 0.0) if kpm.dtype == bool else kpm[b].astype(np.float64))
    if am is not None:
        a = am if am.ndim == 2 else am[b * H + h]
        m = m + (np.where(a, -np.inf, 0.0) if a.dtype == bool else a.astype(np.float64))
    i, j = np.arange(Lq)[:, None], np.arange(Lk)[None, :]
    if causal:
        m = m + np.where(j > i, -np.inf, 0.0)
    if bottom_right:
        m = m + np.where(j > i + Lk - Lq, -np.inf, 0.0)
    return m


def numpy_core(q, k, v, scale, kpm, am, causal, bottom_right):
    """q [B, H, Lq, d], k/v [B, Hkv, Lk, d] in float64, query head h on KV head h // (H/Hkv) (no repeat)."""
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    out = np.zeros(q.shape[:3] + (v.shape[3],))
    probs = np.zeros((B, H, Lq, Lk))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            s = scale * (q[b, h] @ k[b, g].T) + numpy_scores_mask(b, h, H, Lq, Lk, kpm, am, causal, bottom_right)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            probs[b, h], out[b, h] = p, p @ v[b, g]
    return out, probs


def numpy_layer(query, key, value, a, H, Hkv, d, rope, starts, kpm, am, causal, bottom_right):
    """The documented layer in float64 NumPy: projections, RoPE at start_b + index, numpy_core, output."""
    Q = query @ a["q_proj_weight"].T
    K = key @ a["k_proj_weight"].T
    V = value @ a["v_proj_weight"].T
    if "in_proj_bias" in a:
        bias = a["in_proj_bias"]
        Q, K, V = Q + bias[:H * d], K + bias[H * d:H * d + Hkv * d], V + bias[H * d + Hkv * d:]
    B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
    Q, K, V = Q.reshape(B, Lq, H, d), K.reshape(B, Lk, Hkv, d), V.reshape(B, Lk, Hkv, d)
    if rope is not None:
        for b in range(B):
            for i in range(Lq):
                for h in range(H):
                    Q[b, i, h] = numpy_rope(Q[b, i, h], rope["theta"], rope["dims"], rope["style"], starts[b] + i)
            for j in range(Lk):
                for h in range(Hkv):
                    K[b, j, h] = numpy_rope(K[b, j, h], rope["theta"], rope["dims"], rope["style"], starts[b] + j)
    ctx, probs = numpy_core(Q.transpose(0, 2, 1, 3), K.transpose(0, 2, 1, 3), V.transpose(0, 2, 1, 3),
                            1.0 / math.sqrt(d), kpm, am, causal, bottom_right)
    out = ctx.transpose(0, 2, 1, 3).reshape(B, Lq, H * d) @ a["out_proj.weight"].T
    if "out_proj.bias" in a:
        out = out + a["out_proj.bias"]
    return out, probs


def layer_args(H, Hkv, d, rope=None, offset=0, positions=None, causal=False, bottom_right=False, need="none"):
    return {"kind": "layer", "heads": H, "kv_heads": Hkv, "head_dim": d,
            "rope_theta": None if rope is None else rope["theta"],
            "rope_style": None if rope is None else rope["style"],
            "rope_dims": None if rope is None else rope["dims"],
            "position_offset": offset, "positions": positions, "causal": causal,
            "causal_bottom_right": bottom_right, "need_weights": need, "norm_eps": None}


def write_decoder_case(name, arrays, args, expected_out, expected_w=None):
    write_case(os.path.join(DECODER_DIR, name), arrays, args, expected_out, expected_w)


def llama_case(name, gen, B, L, E, H, Hkv, d, rope, offset=0, positions=None, bias=False, causal=True):
    """Llama-style self-attention (no bias unless `bias`: Qwen-style q/k/v and an output bias too)."""
    fan = lambda n: 1.0 / math.sqrt(n)
    a = {"query": uniform(gen, (B, L, E)),
         "q_proj_weight": uniform(gen, (H * d, E), fan(E)), "k_proj_weight": uniform(gen, (Hkv * d, E), fan(E)),
         "v_proj_weight": uniform(gen, (Hkv * d, E), fan(E)), "out_proj.weight": uniform(gen, (E, H * d), fan(H * d))}
    if bias:
        a["in_proj_bias"] = uniform(gen, (H * d + 2 * Hkv * d,), fan(E))
        a["out_proj.bias"] = uniform(gen, (E,), fan(H * d))
    starts = positions if positions is not None else [offset] * B
    t = lambda n: torch.from_numpy(a[n].astype(np.float64))
    biases = None
    if bias:
        bqkv = t("in_proj_bias")
        biases = (bqkv[:H * d], bqkv[H * d:H * d + Hkv * d], bqkv[H * d + Hkv * d:], t("out_proj.bias"))
    out = llama_attention(t("query"), t("q_proj_weight"), t("k_proj_weight"), t("v_proj_weight"), t("out_proj.weight"),
                          biases, H, Hkv, d, rope, starts, causal).numpy()
    x = a["query"].astype(np.float64)
    check, _ = numpy_layer(x, x, x, {n: v.astype(np.float64) for n, v in a.items()}, H, Hkv, d, rope, starts,
                           None, None, causal, False)
    assert np.isfinite(out).all(), name
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    write_decoder_case(name, a, layer_args(H, Hkv, d, rope, offset if positions is None else 0, positions, causal),
                       out)


def mha_kdim_case(name, gen, B, Lq, Lk, E, H, kdim, vdim, kpm=None, bottom_right=False, need="none"):
    """nn.MultiheadAttention with kdim/vdim != E (separate q/k/v_proj_weight), float64, eval."""
    m = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, batch_first=True)
    randomize(m, gen)
    m.eval()
    q, k, v = uniform(gen, (B, Lq, E)), uniform(gen, (B, Lk, kdim)), uniform(gen, (B, Lk, vdim))
    mask = ~torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq) if bottom_right else None
    t = lambda x: None if x is None else torch.from_numpy(x if x.dtype == bool else x.astype(np.float64))
    out, w = m.double()(t(q), t(k), t(v), key_padding_mask=t(kpm), attn_mask=mask, need_weights=need != "none",
                        average_attn_weights=need == "averaged")
    out = out.detach().numpy()
    w = None if need == "none" else w.detach().numpy()
    a = {"query": q, "key": k, "value": v, "q_proj_weight": f32(m.q_proj_weight), "k_proj_weight": f32(m.k_proj_weight),
         "v_proj_weight": f32(m.v_proj_weight), "in_proj_bias": f32(m.in_proj_bias),
         "out_proj.weight": f32(m.out_proj.weight), "out_proj.bias": f32(m.out_proj.bias)}
    if kpm is not None:
        a["key_padding_mask"] = kpm
    d = E // H
    check, probs = numpy_layer(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               {n: x.astype(np.float64) for n, x in a.items()}, H, H, d, None, [0] * B, kpm, None,
                               False, bottom_right)
    assert np.isfinite(out).all(), name
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    if w is not None:
        want = probs.mean(1) if need == "averaged" else probs
        assert w.shape == want.shape and np.allclose(w, want, rtol=0, atol=1e-12), name
    write_decoder_case(name, a, layer_args(H, H, d, bottom_right=bottom_right, need=need), out, w)


def torch_sdpa(q, k, v, mask, causal, scale):
    """PyTorch's scaled_dot_product_attention in float64; torch < 2.1 has no `scale` argument (1.13 only the
    private F._scaled_dot_product_attention, which scales by 1/sqrt(d)): q is pre-multiplied instead."""
    d = q.shape[-1]
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q * (scale * math.sqrt(d)), k, v, attn_mask=mask, is_causal=causal)
    return F._scaled_dot_product_attention(q * (scale * math.sqrt(d)), k, v, mask, 0.0, False, causal)[0]


def sdpa_case(name, gen, B, H, Hkv, Lq, Lk, d, scale=None, causal=False, bottom_right=False, kpm=None, am=None):
    """F.scaled_dot_product_attention on q [B, H, Lq, d], k/v [B, Hkv, Lk, d] expanded by repeat_interleave.
    Masks go to torch as one mask: boolean (True = may attend) when every part is boolean, else additive;
    bottom-right causal as the boolean torch.ones(Lq, Lk).tril(diagonal=Lk − Lq)."""
    q, k, v = uniform(gen, (B, H, Lq, d)), uniform(gen, (B, Hkv, Lk, d)), uniform(gen, (B, Hkv, Lk, d))
    s = scale if scale is not None else 1.0 / math.sqrt(d)
    parts = []  # (kind, [B, H, Lq, Lk]-broadcastable tensor): kind "bool" = True may attend, "add" = added
    if kpm is not None:
        parts.append(("bool", torch.from_numpy(~kpm)[:, None, None, :]) if kpm.dtype == bool
                     else ("add", torch.from_numpy(kpm.astype(np.float64))[:, None, None, :]))
    if am is not None:
        m = torch.from_numpy(am if am.dtype == bool else am.astype(np.float64))
        m = m if am.ndim == 2 else m.view(B, H, Lq, Lk)
        parts.append(("bool", ~m) if am.dtype == bool else ("add", m))
    if bottom_right:
        parts.append(("bool", torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)))
    mask = None
    if parts and all(kind == "bool" for kind, _ in parts):
        mask = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
        for _, m in parts:
            mask = mask & m
    elif parts:
        mask = torch.zeros(B, H, Lq, Lk, dtype=torch.float64)
        for kind, m in parts:
            mask = mask + (torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, -math.inf) if kind == "bool" else m)
    G = H // Hkv
    t = lambda x: torch.from_numpy(x.astype(np.float64))
    out = torch_sdpa(t(q), t(k).repeat_interleave(G, dim=1), t(v).repeat_interleave(G, dim=1), mask, causal, s).numpy()
    check, _ = numpy_core(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), s, kpm, am, causal,
                          bottom_right)
    assert np.isfinite(out).all(), name
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    a = {"q": q, "k": k, "v": v}
    if kpm is not None:
        a["key_padding_mask"] = kpm
    if am is not None:
        a["attn_mask"] = am
    write_decoder_case(name, a, {"kind": "sdpa", "heads": H, "kv_heads": Hkv, "scale": scale, "causal": causal,
                                 "causal_bottom_right": bottom_right}, out)


def write_decoder_cases():
    gen = torch.Generator().manual_seed(20240612)  # its own stream: the cases above stay as they were
    half = lambda dims, theta=10000.0: {"theta": theta, "dims": dims, "style": "half"}
    inter = lambda dims, theta=10000.0: {"theta": theta, "dims": dims, "style": "interleaved"}
    # Llama-style: GQA (G = 2), H·d = 32 != E = 24, half pairing, causal, no biases.
    llama_case("llama_gqa_half", gen, B=2, L=7, E=24, H=4, Hkv=2, d=8, rope=half(8))
    # MQA (Hkv = 1), interleaved pairing, Llama 3's theta, positions near 2^20. With one start for Q and K the
    # offset cancels in q·k (RoPE sees only i − j), so what this case tests is the angles' accuracy: d = 16
    # puts θ_1 ≈ 0.19, an angle ≈ 2·10^5 rad, where a float angle is off by up to 2^-7 rad.
    llama_case("llama_mqa_interleaved_offset", gen, B=2, L=6, E=32, H=4, Hkv=1, d=16, rope=inter(16, 500000.0),
               offset=(1 << 20) - 3)
    # Biases on every projection, rotary dims r = 4 < d = 8 (dims 4..7 not rotated), offset 5.
    llama_case("llama_bias_partial_rope", gen, B=1, L=5, E=16, H=4, Hkv=2, d=8, rope=half(4), offset=5, bias=True)
    # One start per sequence (B = 2), interleaved, GQA, H·d = 24 != E = 20.
    llama_case("llama_positions", gen, B=2, L=5, E=20, H=4, Hkv=2, d=6, rope=inter(6), positions=[3, 1000])
    # nn.MultiheadAttention with kdim / vdim != E.
    mha_kdim_case("mha_kdim_vdim_bottom_right", gen, B=2, Lq=5, Lk=8, E=16, H=4, kdim=12, vdim=20,
                  bottom_right=True, need="averaged")
    mha_kdim_case("mha_kdim_vdim_key_padding", gen, B=2, Lq=6, Lk=7, E=12, H=3, kdim=10, vdim=6,
                  kpm=bool_mask(gen, (2, 7), 0.35, lambda r: r + 2), need="per_head")
    # The core.
    sdpa_case("sdpa_gqa_causal", gen, B=2, H=4, Hkv=2, Lq=6, Lk=6, d=8, causal=True)
    sdpa_case("sdpa_mqa_bottom_right_scale", gen, B=1, H=4, Hkv=1, Lq=3, Lk=8, d=16, scale=0.3, bottom_right=True)
    sdpa_case("sdpa_bool_attn_mask", gen, B=2, H=2, Hkv=2, Lq=5, Lk=7, d=8,
              am=bool_mask(gen, (4, 5, 7), 0.35, lambda r: r % 5))
    kpm = f32(-3 * torch.rand(2, 9, generator=gen) + 0.5)
    kpm[0, 4], kpm[1, 0] = -np.inf, -np.inf
    sdpa_case("sdpa_float_key_padding_scale", gen, B=2, H=6, Hkv=3, Lq=4, Lk=9, d=4, scale=0.125, kpm=kpm,
              am=bool_mask(gen, (4, 9), 0.3, lambda r: 1 + 2 * r))


# --- KV-cache generation cases (issue 13): tests/data/kv_cache/<case>/ ------------------------------------
#
# The Llama-style layer of the decoder cases (separate q/k/v/o projections, no biases, GQA by repeat_interleave,
# RoPE in half pairing) run the way a generating model runs it, with Hugging Face's past_key_values semantics:
# each sequence's prompt in one causal pass (positions 0 .. P − 1), then `generated` tokens one at a time, token t
# rotated (Q and K) at position past_len = P + t, its K and V concatenated to the cache, its query attending over
# all past_len + 1 keys. The sequences are ragged (prompts of different lengths), each run on its own.
# Files (a folder of its own: neither the nn.MultiheadAttention cases nor the decoder cases see it):
#   query.npy [B, T, E] float32, T = max prompt + generated: sequence b's prompt_lengths[b] + generated token
#     inputs, then zero rows; q_proj_weight.npy [H·d, E], k_proj_weight.npy, v_proj_weight.npy [Hkv·d, E],
#     out_proj.weight.npy [E, H·d] float32;
#   expected_output.npy [B, T, E] float64: each token's output (prompt rows from the prompt pass, the rest from
#     their generation step), zero rows past a sequence's tokens;
#   present_key.npy, present_value.npy [B, Hkv, T, d] float64: the cache after the last step (K rotated), zero
#     rows past a sequence's tokens;
#   args.json {"kind": "generate", "heads", "kv_heads", "head_dim", "rope_theta", "rope_style", "rope_dims",
#     "prompt_lengths": [..], "generated"}.
# Checked here: the generated outputs equal the rows of one causal pass over the whole sequence
# (llama_attention) and numpy_layer's, and the present K / V equal NumPy's rotated projections, to 1e-12.

KV_DIR = "kv_cache"


def llama_generate(x, wq, wk, wv, wo, H, Hkv, d, rope, prompt, steps):
    """One sequence x [T, E] (float64 torch): the prompt in one causal pass, then `steps` tokens one at a time
    against past_key_values. Returns the outputs [prompt + steps, E] and the final K, V [Hkv, prompt + steps, d]."""
    def project(xs, start):
        L = xs.shape[0]
        q = F.linear(xs, wq).view(1, L, H, d).transpose(1, 2)
        k = F.linear(xs, wk).view(1, L, Hkv, d).transpose(1, 2)
        v = F.linear(xs, wv).view(1, L, Hkv, d).transpose(1, 2)
        positions = (start + torch.arange(L, dtype=torch.float64))[None]
        q = rope_torch(q, rope["theta"], rope["dims"], rope["style"], positions)
        k = rope_torch(k, rope["theta"], rope["dims"], rope["style"], positions)
        return q, k, v

    def attend(q, past_k, past_v, causal):
        L = q.shape[2]
        s = q @ past_k.repeat_interleave(H // Hkv, dim=1).transpose(-1, -2) / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
        c = (s.softmax(-1) @ past_v.repeat_interleave(H // Hkv, dim=1)).transpose(1, 2).reshape(1, L, H * d)
        return F.linear(c, wo)[0]

    q, past_k, past_v = project(x[:prompt], 0)
    outs = [attend(q, past_k, past_v, True)]
    for t in range(steps):
        past_len = past_k.shape[2]
        q, k, v = project(x[past_len:past_len + 1], past_len)
        past_k, past_v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        outs.append(attend(q, past_k, past_v, False))
    return torch.cat(outs, 0), past_k[0], past_v[0]


def generate_case(name, gen, prompts, steps, E, H, Hkv, d, rope):
    B, T = len(prompts), max(prompts) + steps
    fan = lambda n: 1.0 / math.sqrt(n)
    a = {"query": uniform(gen, (B, T, E)),
         "q_proj_weight": uniform(gen, (H * d, E), fan(E)), "k_proj_weight": uniform(gen, (Hkv * d, E), fan(E)),
         "v_proj_weight": uniform(gen, (Hkv * d, E), fan(E)), "out_proj.weight": uniform(gen, (E, H * d), fan(H * d))}
    out = np.zeros((B, T, E))
    present_k, present_v = np.zeros((B, Hkv, T, d)), np.zeros((B, Hkv, T, d))
    t = lambda n: torch.from_numpy(a[n].astype(np.float64))
    w64 = {n: v.astype(np.float64) for n, v in a.items()}
    for b, P in enumerate(prompts):
        n = P + steps
        a["query"][b, n:] = 0.0
        xb = t("query")[b]
        o, k, v = llama_generate(xb, t("q_proj_weight"), t("k_proj_weight"), t("v_proj_weight"), t("out_proj.weight"),
                                 H, Hkv, d, rope, P, steps)
        out[b, :n], present_k[b, :, :n], present_v[b, :, :n] = o.numpy(), k.numpy(), v.numpy()
        # The same tokens in one causal pass: every generated row is that pass's row.
        full = llama_attention(xb[None, :n], t("q_proj_weight"), t("k_proj_weight"), t("v_proj_weight"),
                               t("out_proj.weight"), None, H, Hkv, d, rope, [0], True).numpy()[0]
        x64 = w64["query"][b:b + 1, :n]
        check, _ = numpy_layer(x64, x64, x64, w64, H, Hkv, d, rope, [0], None, None, True, False)
        assert np.isfinite(out[b]).all(), name
        assert np.allclose(out[b, :n], full, rtol=0, atol=1e-12), name
        assert np.allclose(out[b, :n], check[0], rtol=0, atol=1e-12), name
        K = (x64[0] @ w64["k_proj_weight"].T).reshape(n, Hkv, d)
        V = (x64[0] @ w64["v_proj_weight"].T).reshape(n, Hkv, d)
        for j in range(n):
            for h in range(Hkv):
                K[j, h] = numpy_rope(K[j, h], rope["theta"], rope["dims"], rope["style"], j)
        assert np.allclose(present_k[b, :, :n], K.transpose(1, 0, 2), rtol=0, atol=1e-12), name
        assert np.allclose(present_v[b, :, :n], V.transpose(1, 0, 2), rtol=0, atol=1e-12), name
    args = {"kind": "generate", "heads": H, "kv_heads": Hkv, "head_dim": d, "rope_theta": rope["theta"],
            "rope_style": rope["style"], "rope_dims": rope["dims"], "prompt_lengths": prompts, "generated": steps}
    write_case(os.path.join(KV_DIR, name), a, args, out, None)
    np.save(os.path.join(OUT, KV_DIR, name, "present_key.npy"), present_k)
    np.save(os.path.join(OUT, KV_DIR, name, "present_value.npy"), present_v)


def write_kv_cache_cases():
    gen = torch.Generator().manual_seed(20240613)  # its own stream: the cases above stay as they were
    # Llama-style, GQA (G = 2), H·d = 64 != E = 32, RoPE half on all 16 dims; prompts of 20 and 13 tokens, then 8
    # generated tokens each.
    generate_case("llama_generate_ragged", gen, prompts=[20, 13], steps=8, E=32, H=4, Hkv=2, d=16,
                  rope={"theta": 10000.0, "dims": 16, "style": "half"})


# --- bf16 cases (issue 14): tests/data/bf16/<case>/ ---------------------------------------------------
# Each case: the layer's files as `mha run` reads them (float32 arrays holding bfloat16 values exactly),
#   expected_output.npy  float64: the float64 computation on exactly those values (the oracle)
#   torch_bf16_output.npy float32: PyTorch's bf16 CPU forward (parameters and inputs .to(torch.bfloat16);
#                        its bf16 output widened exactly)
#   args.json            layer_args(...) plus "torch_bf16_max_abs_error": max |torch bf16 − oracle|
# Cases: nn.MultiheadAttention self-attention with a boolean key_padding_mask and an additive attn_mask
# (BERT-like), the Llama-style layer with GQA, biases and RoPE written in torch (run in bf16: cos and sin cast
# to bf16 as Hugging Face does), nn.MultiheadAttention cross-attention with kdim / vdim != E.

# --- Score-modifier cases (issue 24): tests/data/modifiers/<case>/ --------------------------------------------
#
# The attention core (q [B, H, Lq, d], k / v [B, Hkv, Lk, d] float32, GQA by repeat_interleave, scale 1/sqrt(d))
# with each model family's own formula, in float64 torch, as its Hugging Face implementation writes it:
#   Mistral   causal mask with the sliding-window overlay: key j visible from query i iff j <= i and j > i − w
#             (config.sliding_window = w; the library: window_left = w − 1);
#   Gemma 2   scores / softcap, tanh, · softcap (attn_logit_softcapping), then the mask;
#   gpt-oss   cat([scores + mask, sinks]), minus the row max, softmax, drop the sink column;
#   BLOOM     build_alibi_tensor: slopes from the closest power of two (and the odd powers of its square root
#             for the rest), a bias slope_h·j per key added to q·kᵀ/sqrt(d) (baddbmm), then the mask.
# Queries are the last Lq of Lk positions when causal_bottom_right (position i + Lk − Lq), else i.
# Files: q.npy, k.npy, v.npy; sinks.npy [H] / alibi_slopes.npy [H] float32 when used; expected_output.npy
# [B, H, Lq, d] float64; args.json {"kind": "sdpa", "heads", "kv_heads", "scale": null, "causal",
# "causal_bottom_right", "window_left", "window_right", "softcap", "alibi": true for BLOOM's standard slopes (the
# tool's --alibi), "model"}. Each case is checked against a NumPy loop of the library's documented order
# (softcap, ALiBi −slope·(p_i − j), window, masks, sink) to 1e-12.

MOD_DIR = "modifiers"


def bloom_slopes(H):
    """transformers' build_alibi_tensor slopes."""
    closest = 2 ** math.floor(math.log2(H))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** k for k in range(1, 1 + closest)]
    if closest != H:
        extra = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** k for k in range(1, 1 + 2 * min(closest, H - closest), 2)]
    return slopes


def numpy_modified_core(q, k, v, scale, causal, bottom_right, left, right, softcap, sinks, slopes):
    """The library's documented order in float64 NumPy loops (KV head h // G, no repeat)."""
    B, H, Lq, d = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    out = np.zeros((B, H, Lq, v.shape[3]))
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            for i in range(Lq):
                p_i = i + (Lk - Lq if bottom_right else 0)
                s = scale * (k[b, g] @ q[b, h, i])
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if slopes is not None:
                    s = s - slopes[h] * (p_i - np.arange(Lk))
                j = np.arange(Lk)
                hide = np.zeros(Lk, dtype=bool)
                if causal:
                    hide |= j > p_i
                if left >= 0:
                    hide |= j < p_i - left
                if right >= 0:
                    hide |= j > p_i + right
                s = np.where(hide, -np.inf, s)
                m = s.max() if sinks is None else max(s.max(), sinks[h])
                e = np.exp(s - m)
                den = e.sum() + (0.0 if sinks is None else math.exp(sinks[h] - m))
                out[b, h, i] = (e / den) @ v[b, g]
    return out


def modifier_case(name, gen, model, B, H, Hkv, Lq, Lk, d, causal=True, bottom_right=False, sliding_window=None,
                  flash_window=None, softcap=None, sinks=False, alibi=None, q_amp=1.0):
    """alibi: None, "standard" (BLOOM's slopes, the tool's --alibi) or "file" (random slopes in alibi_slopes.npy)."""
    q, k, v = uniform(gen, (B, H, Lq, d), q_amp), uniform(gen, (B, Hkv, Lk, d)), uniform(gen, (B, Hkv, Lk, d))
    scale = 1.0 / math.sqrt(d)
    G = H // Hkv
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float64))
    Q, K, V = t(q), t(k).repeat_interleave(G, dim=1), t(v).repeat_interleave(G, dim=1)
    pos_q = torch.arange(Lq, dtype=torch.float64)[:, None] + (Lk - Lq if bottom_right else 0)
    pos_k = torch.arange(Lk, dtype=torch.float64)[None, :]
    visible = torch.ones(Lq, Lk, dtype=torch.bool)
    if causal:
        visible &= pos_k <= pos_q
    left, right = -1, -1
    if sliding_window is not None:  # Mistral's overlay: kv_idx > q_idx - sliding_window
        visible &= pos_k > pos_q - sliding_window
        left = sliding_window - 1
    if flash_window is not None:    # FlashAttention's window_size (wl, wr)
        wl, wr = flash_window
        visible &= (pos_k >= pos_q - wl) & (pos_k <= pos_q + wr)
        left, right = wl, wr
    mask = torch.zeros(Lq, Lk, dtype=torch.float64).masked_fill(~visible, -math.inf)
    scores = torch.matmul(Q, K.transpose(2, 3)) * scale
    slopes = None
    if alibi is not None:
        slopes = bloom_slopes(H) if alibi == "standard" else list(f32(0.5 * torch.rand(H, generator=gen)).astype(np.float64))
        # BLOOM: alibi [B·H, 1, Lk] = slope_h · (position of key j), added to the scores before the mask.
        scores = scores + t(slopes)[None, :, None, None] * pos_k[None, None]
    if softcap is not None:  # Gemma 2 (the only family here that caps comes without ALiBi; order: softcap first)
        assert alibi is None
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + mask
    sink = None
    if sinks:
        sink = f32(torch.rand(H, generator=gen) * 4 - 1).astype(np.float64)
        col = t(sink).reshape(1, -1, 1, 1).expand(B, -1, Lq, -1)
        combined = torch.cat([scores, col], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined, dim=-1)[..., :-1]
    else:
        probs = F.softmax(scores, dim=-1)
    out = torch.matmul(probs, V).numpy()
    check = numpy_modified_core(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), scale, causal,
                                bottom_right, left, right, softcap, sink, slopes)
    assert np.isfinite(out).all(), name
    assert np.allclose(out, check, rtol=0, atol=1e-12), name
    a = {"q": q, "k": k, "v": v}
    if sinks:
        a["sinks"] = sink.astype(np.float32)
    if alibi == "file":
        a["alibi_slopes"] = np.asarray(slopes, dtype=np.float32)
    args = {"kind": "sdpa", "model": model, "heads": H, "kv_heads": Hkv, "scale": None, "causal": causal and not bottom_right,
            "causal_bottom_right": bottom_right, "window_left": left, "window_right": right,
            "softcap": softcap, "alibi": alibi == "standard"}
    write_case(os.path.join(MOD_DIR, name), a, args, out, None)


def write_modifier_cases():
    gen = torch.Generator().manual_seed(20241124)
    modifier_case("mistral_sliding_window", gen, "mistral", B=2, H=4, Hkv=2, Lq=40, Lk=40, d=16, sliding_window=8)
    modifier_case("mistral_window_chunk", gen, "mistral", B=1, H=4, Hkv=1, Lq=5, Lk=30, d=16, bottom_right=True,
                  sliding_window=11)
    modifier_case("gemma2_softcap", gen, "gemma2", B=2, H=4, Hkv=2, Lq=24, Lk=24, d=32, softcap=20.0, q_amp=24.0)
    modifier_case("gptoss_sinks_window", gen, "gpt-oss", B=1, H=4, Hkv=1, Lq=20, Lk=20, d=16, sliding_window=6,
                  sinks=True)
    modifier_case("bloom_alibi", gen, "bloom", B=1, H=6, Hkv=6, Lq=16, Lk=16, d=8, alibi="standard")
    modifier_case("flash_window_alibi_file", gen, "flash-attention", B=1, H=4, Hkv=2, Lq=12, Lk=30, d=8, causal=False,
                  flash_window=(5, 3), alibi="file")


BF16_DIR = "bf16"


def bf16_exact(x):
    """x rounded to the nearest bfloat16 (ties to even, torch's conversion), kept as float32."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).to(torch.float32).numpy()


def round_params_bf16(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def write_bf16_case(name, arrays, args, oracle, torch_bf16):
    oracle = np.asarray(oracle, dtype=np.float64)
    torch_bf16 = np.asarray(torch_bf16, dtype=np.float32)
    assert np.isfinite(oracle).all() and np.isfinite(torch_bf16).all(), name
    for n, a in arrays.items():  # every float input is a bfloat16 value
        if a.dtype == np.float32:
            assert np.array_equal(a, bf16_exact(a)), (name, n)
    args = dict(args, torch_bf16_max_abs_error=float(np.abs(torch_bf16.astype(np.float64) - oracle).max()))
    write_case(os.path.join(BF16_DIR, name), arrays, args, oracle, None)
    np.save(os.path.join(OUT, BF16_DIR, name, "torch_bf16_output.npy"), torch_bf16)


def bf16_mha_case(name, gen, B, Lq, Lk, E, H, kdim=None, vdim=None, kpm=None, am=None):
    """nn.MultiheadAttention (packed in_proj when kdim = vdim = E), run in float64 and in bf16."""
    kdim, vdim = kdim or E, vdim or E
    m = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, batch_first=True)
    randomize(m, gen)
    round_params_bf16(m)
    m.eval()
    cross = kdim != E or vdim != E or Lk != Lq
    q = bf16_exact(uniform(gen, (B, Lq, E)))
    k = bf16_exact(uniform(gen, (B, Lk, kdim))) if cross else q
    v = bf16_exact(uniform(gen, (B, Lk, vdim))) if cross else q
    if am is not None and am.dtype != bool:
        am = bf16_exact(am)
    t = lambda x, dt: None if x is None else torch.from_numpy(x).to(torch.bool if x.dtype == bool else dt)
    with torch.no_grad():
        oracle, _ = m.double()(t(q, torch.float64), t(k, torch.float64), t(v, torch.float64),
                               key_padding_mask=t(kpm, torch.float64), attn_mask=t(am, torch.float64), need_weights=False)
        low, _ = m.to(torch.bfloat16)(t(q, torch.bfloat16), t(k, torch.bfloat16), t(v, torch.bfloat16),
                                      key_padding_mask=t(kpm, torch.bfloat16), attn_mask=t(am, torch.bfloat16),
                                      need_weights=False)
    m.double()
    a = {"query": q}
    if cross:
        a["key"], a["value"] = k, v
    if kdim == E and vdim == E:
        a["in_proj_weight"] = f32(m.in_proj_weight)
    else:
        a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"] = (f32(m.q_proj_weight), f32(m.k_proj_weight),
                                                                      f32(m.v_proj_weight))
    a["in_proj_bias"], a["out_proj.weight"], a["out_proj.bias"] = f32(m.in_proj_bias), f32(m.out_proj.weight), f32(m.out_proj.bias)
    if kpm is not None:
        a["key_padding_mask"] = kpm
    if am is not None:
        a["attn_mask"] = am
    d = E // H
    w64 = {n: x.astype(np.float64) for n, x in a.items() if x.dtype != bool}
    if "in_proj_weight" in w64:
        w64["q_proj_weight"], w64["k_proj_weight"], w64["v_proj_weight"] = np.split(w64["in_proj_weight"], 3)
    check, _ = numpy_layer(w64["query"], w64.get("key", w64["query"]), w64.get("value", w64["query"]), w64, H, H, d,
                           None, [0] * B, kpm, am, False, False)
    oracle = oracle.numpy()
    assert np.allclose(oracle, check, rtol=0, atol=1e-12), name
    write_bf16_case(name, a, layer_args(H, H, d), oracle, low.to(torch.float32).numpy())


def rope_torch_low(x, theta, r, style, positions):
    """rope_torch for a bf16 x: angles in float64, cos and sin cast to x's dtype, the rotation in that dtype."""
    k = torch.arange(r // 2, dtype=torch.float64)
    theta_k = torch.pow(torch.tensor(float(theta), dtype=torch.float64), -2.0 * k / r)
    angle = positions[:, None, :, None] * theta_k
    c, s = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    i1 = torch.arange(r // 2) if style == "half" else 2 * torch.arange(r // 2)
    i2 = i1 + r // 2 if style == "half" else i1 + 1
    x1, x2 = x[..., i1], x[..., i2]
    y = x.clone()
    y[..., i1] = x1 * c - x2 * s
    y[..., i2] = x2 * c + x1 * s
    return y


def llama_attention_low(x, wq, wk, wv, wo, bias, H, Hkv, d, rope, causal):
    """llama_attention in x's dtype (bf16): the same steps, RoPE through rope_torch_low, positions 0.."""
    B, L, _ = x.shape
    bq, bk, bv, bo = bias
    q = F.linear(x, wq, bq).view(B, L, H, d).transpose(1, 2)
    k = F.linear(x, wk, bk).view(B, L, Hkv, d).transpose(1, 2)
    v = F.linear(x, wv, bv).view(B, L, Hkv, d).transpose(1, 2)
    positions = torch.zeros(B, 1, dtype=torch.float64) + torch.arange(L, dtype=torch.float64)
    q = rope_torch_low(q, rope["theta"], rope["dims"], rope["style"], positions)
    k = rope_torch_low(k, rope["theta"], rope["dims"], rope["style"], positions)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    c = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, H * d)
    return F.linear(c, wo, bo)


def bf16_llama_case(name, gen, B, L, E, H, Hkv, d, rope):
    """Llama-style GQA self-attention with q/k/v and output biases (Qwen-style), RoPE, causal."""
    fan = lambda n: 1.0 / math.sqrt(n)
    a = {"query": uniform(gen, (B, L, E)),
         "q_proj_weight": uniform(gen, (H * d, E), fan(E)), "k_proj_weight": uniform(gen, (Hkv * d, E), fan(E)),
         "v_proj_weight": uniform(gen, (Hkv * d, E), fan(E)), "out_proj.weight": uniform(gen, (E, H * d), fan(H * d)),
         "in_proj_bias": uniform(gen, (H * d + 2 * Hkv * d,), fan(E)), "out_proj.bias": uniform(gen, (E,), fan(H * d))}
    a = {n: bf16_exact(x) for n, x in a.items()}
    def run(dt):
        t = lambda n: torch.from_numpy(a[n]).to(dt)
        b = t("in_proj_bias")
        biases = (b[:H * d], b[H * d:H * d + Hkv * d], b[H * d + Hkv * d:], t("out_proj.bias"))
        if dt == torch.float64:
            return llama_attention(t("query"), t("q_proj_weight"), t("k_proj_weight"), t("v_proj_weight"),
                                   t("out_proj.weight"), biases, H, Hkv, d, rope, [0] * B, True)
        return llama_attention_low(t("query"), t("q_proj_weight"), t("k_proj_weight"), t("v_proj_weight"),
                                   t("out_proj.weight"), biases, H, Hkv, d, rope, True)
    oracle = run(torch.float64).numpy()
    low = run(torch.bfloat16).to(torch.float32).numpy()
    x = a["query"].astype(np.float64)
    check, _ = numpy_layer(x, x, x, {n: v.astype(np.float64) for n, v in a.items()}, H, Hkv, d, rope, [0] * B,
                           None, None, True, False)
    assert np.allclose(oracle, check, rtol=0, atol=1e-12), name
    write_bf16_case(name, a, layer_args(H, Hkv, d, rope, causal=True), oracle, low)


def write_bf16_cases():
    gen = torch.Generator().manual_seed(20240714)  # its own stream: the cases above stay as they were
    os.makedirs(os.path.join(OUT, BF16_DIR), exist_ok=True)
    B, L = 2, 24
    kpm = bool_mask(gen, (B, L), 0.3, lambda r: r % L)
    am = (4 * torch.rand(L, L, generator=gen) - 2).numpy().astype(np.float32)
    bf16_mha_case("bert_self_masks", gen, B=B, Lq=L, Lk=L, E=64, H=4, kpm=kpm, am=am)
    bf16_llama_case("llama_gqa_rope", gen, B=2, L=20, E=64, H=8, Hkv=2, d=16,
                    rope={"theta": 10000.0, "dims": 16, "style": "half"})
    bf16_mha_case("cross_kdim_vdim", gen, B=2, Lq=12, Lk=20, E=48, H=4, kdim=40, vdim=24,
                  kpm=bool_mask(gen, (2, 20), 0.3, lambda r: r))


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "modifiers":  # only the score-modifier cases (issue 24)
        shutil.rmtree(os.path.join(OUT, MOD_DIR), ignore_errors=True)
        write_modifier_cases()
        return
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
    write_decoder_cases()
    write_kv_cache_cases()
    write_bf16_cases()
    write_modifier_cases()
    count = lambda d: len([e for e in os.listdir(d) if os.path.isdir(os.path.join(d, e))])
    print("wrote", count(OUT) - 3, "cases to", OUT, "and", count(os.path.join(OUT, DECODER_DIR)), "to",
          os.path.join(OUT, DECODER_DIR), "and", count(os.path.join(OUT, KV_DIR)), "to", os.path.join(OUT, KV_DIR), "and",
          count(os.path.join(OUT, BF16_DIR)), "to", os.path.join(OUT, BF16_DIR))


if __name__ == "__main__":
    main()
