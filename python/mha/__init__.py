"""mha: multi-head attention on CPUs (the C++ library mha) for numpy arrays.

    mha.MultiheadAttention(embed_dim, num_heads, ...)   a layer; forward(query, key, value, ...) -> (out, weights)
    mha.scaled_dot_product_attention(q, k, v, ...)      PyTorch's F.scaled_dot_product_attention (eval, no dropout)
    mha.KVCache(batch, kv_heads, head_dim, capacity, dtype='f32'|'bf16'|'f16')    incremental decoding: layer(x, cache=cache)
    mha.PagedKVCache(num_blocks, block_size, kv_heads, head_dim, dtype='f32')   serving: blocks shared by many
        sequences; s = cache.add_sequence(); y, _ = layer(x, cache=cache, seq_ids=[s, ...], q_lens=[...]) with
        x [sum(q_lens), E]: prefill chunks and decode tokens of many sequences in one call
    mha.StepPlan(layer, cache, seq_ids, q_lens)         one step planned once for every layer of a model:
        layer_l(x, cache=cache_l, plan=plan)
    mha.torch                                           torch.nn.MultiheadAttention drop-in (needs torch)

Arrays are float32 and read in place when their last axis is contiguous (any other strides, e.g. the
sequence-first [L, B, E] layout or a transposed view, need no copy); other layouts are copied once. Bad shapes
raise ValueError with the library's message, wrong types and dtypes TypeError. The GIL is released while the
library computes. Inference only (no dropout, no gradients).
"""
import numpy as _np

from . import _mha
from ._mha import KVCache, PagedKVCache, StepPlan, alibi_standard_slopes, detected_isa, input_copies

def __getattr__(name):
    # mha.torch and mha.bench import torch: loaded on first use, so `import mha` stays light.
    if name in ("torch", "bench"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mha' has no attribute {name!r}")


__all__ = ["MultiheadAttention", "scaled_dot_product_attention", "KVCache", "PagedKVCache", "StepPlan", "alibi_standard_slopes",
           "detected_isa", "input_copies"]


class MultiheadAttention(_mha.MultiheadAttention):
    """Multi-head attention with torch.nn.MultiheadAttention's semantics (batch_first by default), extended to
    grouped-query heads (num_kv_heads), a head dim of its own (head_dim), rotary positions (rope_theta,
    rope_dims, rope_style 'half' | 'interleaved') and bf16 GEMM operands (compute='bf16').

    Weights in PyTorch's layout, as keyword arrays: in_proj_weight [H*d + 2*Hkv*d, E] (or q_proj_weight
    [H*d, E], k_proj_weight [Hkv*d, kdim], v_proj_weight [Hkv*d, vdim]), in_proj_bias (or q/k/v_proj_bias),
    out_proj_weight [E, H*d], out_proj_bias [E], norm_weight / norm_bias [E] (the post-norm block, with
    forward(norm_eps=...)). They are copied and packed once; changing the arrays afterwards has no effect.
    Without any weight, random ones are drawn as torch initializes a new nn.MultiheadAttention (seed=...).

    forward(query, key=None, value=None, key_padding_mask=None, need_weights=False, attn_mask=None,
            average_attn_weights=True, is_causal=False, *, batch_first=True, causal_alignment='top_left',
            position_offset=0, positions=None, norm_eps=None, threads=0, backend='simd', impl='auto',
            out=None, cache=None) -> (output, weights or None)

    query [B, Lq, E] ([Lq, B, E] with batch_first=False, [Lq, E] unbatched); key / value default to query.
    Activations are float32, or 16-bit: float16, or uint16 arrays holding bfloat16 bits (key, value and the
    output then have the query's type; the library widens them exactly and rounds the output once).
    Masks as in torch: key_padding_mask [B, Lk], attn_mask [Lq, Lk] or [B*H, Lq, Lk]; bool or uint8
    (True = not allowed) or float32 (added to the scores). need_weights: [B, Lq, Lk] averaged over heads or
    [B, H, Lq, Lk]. A query whose keys are all masked gets zero weights and the output bias (torch: NaN).
    threads=0 uses all cores. out= writes the output into an existing float32 array.

    Score modifiers of every forward (the C++ AttentionConfig::modifiers; query i at its position p_i, key j at j):
    window=(left, right): key j visible only when p_i - left <= j <= p_i + right (None or -1: unbounded on that
    side; Hugging Face's sliding_window w is window=(w - 1, 0)); softcap=c: scores become c*tanh(s/c) (Gemma 2);
    sinks=[H]: a per-head logit in each row's softmax denominator (gpt-oss); alibi_slopes=[H] or "standard"
    (BLOOM's slopes, alibi_standard_slopes(H)): scores - slope_h*(p_i - j). Arrays are copied.
    """

    def __init__(self, embed_dim, num_heads, *, num_kv_heads=0, head_dim=0, kdim=0, vdim=0, bias=True,
                 rope_theta=None, rope_dims=0, rope_style="half", compute="f32", seed=None, window=None, softcap=None,
                 sinks=None, alibi_slopes=None, **weights):
        weights = {k: v for k, v in weights.items() if v is not None}
        if not any(k.endswith("_weight") and not k.startswith("norm") for k in weights):
            weights.update(_random_weights(embed_dim, num_heads, num_kv_heads, head_dim, kdim, vdim, bias, seed))
        super().__init__(embed_dim, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, kdim=kdim, vdim=vdim,
                         rope_theta=rope_theta, rope_dims=rope_dims, rope_style=rope_style, compute=compute,
                         weights=weights, window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)

    @classmethod
    def from_torch(cls, module, **options):
        """A layer with the weights of a torch.nn.MultiheadAttention (copied now; later changes to the module
        are not seen: mha.torch.MultiheadAttention follows them). options go to the constructor (compute=...)."""
        from .torch import _module_weights  # torch is needed only here
        return cls(module.embed_dim, module.num_heads, kdim=module.kdim, vdim=module.vdim,
                   **_module_weights(module), **options)

    def __repr__(self):
        return (f"mha.MultiheadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, kdim={self.kdim}, vdim={self.vdim})")


def _random_weights(E, H, Hkv, d, kdim, vdim, bias, seed):
    # torch's initialization of a new nn.MultiheadAttention: xavier_uniform projections, zero biases, and the
    # output projection as an nn.Linear (uniform within 1/sqrt(fan_in)).
    rng = _np.random.default_rng(seed)
    Hkv = Hkv or H
    d = d or (E // H if H and E % H == 0 else 0)
    if not d:
        return {}  # let the library report the inconsistent shape
    kdim, vdim = kdim or E, vdim or E

    def xavier(rows, cols):
        a = (6.0 / (rows + cols)) ** 0.5
        return rng.uniform(-a, a, (rows, cols)).astype(_np.float32)

    w = {}
    if kdim == E and vdim == E:
        w["in_proj_weight"] = xavier(H * d + 2 * Hkv * d, E)
    else:
        w["q_proj_weight"], w["k_proj_weight"], w["v_proj_weight"] = (
            xavier(H * d, E), xavier(Hkv * d, kdim), xavier(Hkv * d, vdim))
    b = 1.0 / (H * d) ** 0.5
    w["out_proj_weight"] = rng.uniform(-b, b, (E, H * d)).astype(_np.float32)
    if bias:
        w["in_proj_bias"] = _np.zeros(H * d + 2 * Hkv * d, _np.float32)
        w["out_proj_bias"] = _np.zeros(E, _np.float32)
    return w


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, key_padding_mask=None, causal_alignment="top_left", threads=0,
                                 backend="simd", impl="auto", out=None, window=None, softcap=None, sinks=None,
                                 alibi_slopes=None):
    """PyTorch's F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
    enable_gqa), positions and names alike, on numpy float32 arrays: query [..., H, Lq, d], key / value
    [..., Hkv, Lk, d] (rank 3 or 4; the leading batch axis, if any, is B), returns [..., H, Lq, d]. dropout_p
    must be 0 (inference). value has the query's head dim d (PyTorch also takes another one).

    attn_mask follows PyTorch's SDPA convention (not nn.MultiheadAttention's): a bool mask is True where the
    query MAY attend, a float mask is added to the scores; its shape broadcasts to [B, H, Lq, Lk]. Shapes
    [Lq, Lk], [B, H, Lq, Lk] and float or bool [B, 1, 1, Lk] (padding) are read as the library's masks; a bool
    mask is inverted into a byte copy (the library's bytes mean "masked"), and other broadcast shapes are
    expanded. enable_gqa=True lets Hkv divide H (query head h uses KV head h // (H // Hkv)); without it H
    must equal Hkv, as in PyTorch. is_causal is top-left aligned as in PyTorch (causal_alignment=
    'bottom_right' for new tokens at the end of the keys). key_padding_mask [B, Lk] (True = masked) is an
    extension. A query with every key masked gets zeros (PyTorch: NaN).
    Score modifiers as in MultiheadAttention: window=(left, right), softcap=, sinks=[H], alibi_slopes=[H] or
    "standard"; query i sits at position i (+ Lk - Lq with causal_alignment='bottom_right').
    """
    if dropout_p != 0.0:
        raise ValueError("mha is inference only: dropout_p must be 0")
    arrays = [query, key, value]
    for name, a in zip(("query", "key", "value"), arrays):
        if not isinstance(a, _np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
        if a.ndim not in (3, 4):
            raise ValueError(f"{name} must have 3 or 4 dimensions ([B, H, L, d] or [H, L, d]), got {a.ndim} "
                             f"(shape {a.shape})")
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError(f"query, key and value must have the same rank, got {query.ndim}, {key.ndim}, {value.ndim}")
    unbatched = query.ndim == 3
    q, k, v = (a[None] if unbatched else a for a in arrays)
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv != H and not enable_gqa:
        raise ValueError(f"key has {Hkv} heads but query has {H}: pass enable_gqa=True for grouped-query attention")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal are mutually exclusive (as in PyTorch)")
    kpm = key_padding_mask
    am = None
    if attn_mask is not None:
        kpm_from_mask, am = _sdpa_mask(attn_mask, B, H, Lq, Lk, unbatched)
        if kpm_from_mask is not None:
            if kpm is not None:
                raise ValueError("key_padding_mask together with a [B, 1, 1, Lk] attn_mask: give one of them")
            kpm = kpm_from_mask
    if out is not None and unbatched:
        if not isinstance(out, _np.ndarray):
            raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
        out = out[None]
    o = _mha._sdpa(q, k, v, kpm, am, bool(is_causal), causal_alignment,
                   None if scale is None else float(scale), threads, backend, impl, out,
                   window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)
    return o[0] if unbatched else o


def _sdpa_mask(mask, B, H, Lq, Lk, unbatched):
    """PyTorch's SDPA attn_mask as (key_padding_mask, attn_mask) in the library's convention."""
    if not isinstance(mask, _np.ndarray):
        raise TypeError(f"attn_mask must be a numpy.ndarray, got {type(mask).__name__}")
    if mask.dtype == _np.bool_:
        mask = ~mask  # PyTorch's True = may attend; the library's nonzero = masked (a byte copy)
    elif mask.dtype != _np.float32:
        raise TypeError(f"attn_mask must be bool or float32, got {mask.dtype}")
    full = (B, H, Lq, Lk)
    if mask.ndim > 4:
        raise ValueError(f"attn_mask has {mask.ndim} dimensions, expected at most 4")
    shape = (1,) * (4 - mask.ndim) + mask.shape
    try:
        _np.broadcast_shapes(shape, full)
    except ValueError:
        raise ValueError(f"attn_mask of shape {mask.shape} does not broadcast to [B, H, Lq, Lk] = "
                         f"{list(full[1:] if unbatched else full)}") from None
    if shape[-1] != Lk:
        mask = _np.broadcast_to(mask.reshape(shape), shape[:3] + (Lk,))
        shape = mask.shape
    m4 = mask.reshape(shape)
    if shape[:3] == (1, 1, 1) or shape[:2] == (1, 1) and shape[2] == Lq:
        return None, _np.ascontiguousarray(_np.broadcast_to(m4[0, 0], (Lq, Lk)))
    if shape[1:3] == (1, 1) and shape[0] == B:
        return _np.ascontiguousarray(m4[:, 0, 0, :]), None
    return None, _np.ascontiguousarray(_np.broadcast_to(m4, full)).reshape(B * H, Lq, Lk)
