"""mha.torch: the library behind PyTorch's interfaces (needs torch; `import mha.torch`, or just use mha.torch).

    mha.torch.MultiheadAttention          a torch.nn.MultiheadAttention whose forward runs mha
    mha.torch.TransformerEncoderLayer     a torch.nn.TransformerEncoderLayer whose self-attention runs mha
    mha.torch.replace_attention(model)    makes every nn.MultiheadAttention (and encoder layer) of a model run mha,
                                          in place; returns how many attention modules it swapped
    mha.torch.multi_head_attention_forward(...)   torch.nn.functional.multi_head_attention_forward's signature
    mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                           enable_gqa=False, *, window=None, softcap=None, sinks=None,
                                           alibi_slopes=None)

Score modifiers (mha.MultiheadAttention's keywords, docs/score-modifiers.md): window=(left, right), softcap=c,
sinks=[H], alibi_slopes=[H] or "standard", taken by MultiheadAttention(..., window=...), set_score_modifiers,
from_torch, TransformerEncoderLayer(..., window=...), replace_attention(model, window=...) and
scaled_dot_product_attention. Arrays may be tensors (an nn.Parameter of sinks, say) or numpy arrays; they are
copied as float32 when given.

Tensors go to the library as numpy views of their memory (no copy for float32, bfloat16 and float16 CPU tensors
whose last dim is contiguous); outputs come back as tensors over the library's output memory. Modules may be
float32, bfloat16 (the library's bf16 GEMM operands) or float16 (float32 compute); activations have the
parameters' dtype and outputs are returned in it, as torch returns them. Inference only: with grad enabled and
parameters or inputs that require grad, forward raises.

Errors: shape and mask-size misuse raises ShapeError, dtype / type / device misuse DTypeError. Both carry mha's
message and are ValueError / TypeError as in the numpy API, and also AssertionError and RuntimeError, the types
torch raises for the same misuse (which one depends on the case and the torch version).
"""
import collections
import threading
import weakref

import numpy as np
import torch
from torch import nn

from . import _mha
from . import MultiheadAttention as _Layer
from . import scaled_dot_product_attention as _np_sdpa

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "replace_attention", "multi_head_attention_forward",
           "scaled_dot_product_attention", "ShapeError", "DTypeError"]


class ShapeError(ValueError, AssertionError, RuntimeError):
    """A shape or mask-size error (mha's message). torch raises AssertionError or RuntimeError there."""


class DTypeError(TypeError, AssertionError, RuntimeError):
    """A dtype, type or device error (mha's message). torch raises RuntimeError or AssertionError there."""


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

from torch.nn.modules import module as _torch_module  # noqa: E402

# nn.Module.__call__'s global hook registries (their names differ between torch versions): MultiheadAttention's
# __call__ goes straight to forward only while all of them, and the module's own, are empty.
_GLOBAL_HOOKS = tuple(v for k, v in vars(_torch_module).items() if k.startswith("_global_") and k.endswith("hooks")
                      and isinstance(v, dict) and "registration" not in k)
_NEWER_HOOKS = ("_backward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                "_forward_hooks_always_called")  # torch >= 2.0's, besides the three every version has


def _dtype_of(module):
    """The dtype every parameter of an nn.MultiheadAttention has (float32, bfloat16 or float16), or a reason."""
    dtype = None
    for name, p in module.named_parameters():
        if p.device.type != "cpu":
            return None, f"parameter {name} is on {p.device}; mha runs on the CPU"
        if p.dtype not in _DTYPES:
            return None, f"parameter {name} is {p.dtype}; mha runs float32, bfloat16 or float16 modules"
        if dtype is not None and p.dtype != dtype:
            return None, f"parameter {name} is {p.dtype} but others are {dtype}; mha needs one dtype"
        dtype = p.dtype
    return dtype or torch.float32, None


def _unsupported_config(module):
    """The nn.MultiheadAttention option the library lacks, or None."""
    if module.bias_k is not None or module.bias_v is not None:
        return "add_bias_kv=True is not supported by mha"
    if module.add_zero_attn:
        return "add_zero_attn=True is not supported by mha"
    return None


def _unsupported(module):
    """Why the library cannot run this nn.MultiheadAttention, or None."""
    return _unsupported_config(module) or _dtype_of(module)[1]


def _check_supported(module):
    """Raises why the library cannot run this module: ValueError for an option it lacks (add_bias_kv,
    add_zero_attn), DTypeError for the parameters' dtype or device (as for inputs)."""
    why = _unsupported_config(module)
    if why:
        raise ValueError(why)
    why = _dtype_of(module)[1]
    if why:
        raise DTypeError(why)


def _f32(t):
    # float32 parameters are read in place (the constructor copies and packs them); 16-bit ones are widened once.
    t = t.detach()
    return (t if t.dtype == torch.float32 else t.float()).numpy()


def _weights(in_w, q_w, k_w, v_w, in_b, out_w, out_b):
    """Projection tensors (torch's layout) as the float32 numpy arrays mha's constructor takes, by its names."""
    w = {}
    if in_w is not None:
        w["in_proj_weight"] = _f32(in_w)
    else:
        w["q_proj_weight"], w["k_proj_weight"], w["v_proj_weight"] = _f32(q_w), _f32(k_w), _f32(v_w)
    if in_b is not None:
        w["in_proj_bias"] = _f32(in_b)
    w["out_proj_weight"] = _f32(out_w)
    if out_b is not None:
        w["out_proj_bias"] = _f32(out_b)
    return w


def _module_weights(module):
    """An nn.MultiheadAttention's weights as float32 numpy arrays named as mha's constructor names them."""
    _check_supported(module)
    same = module._qkv_same_embed_dim
    return _weights(module.in_proj_weight if same else None, None if same else module.q_proj_weight,
                    None if same else module.k_proj_weight, None if same else module.v_proj_weight,
                    module.in_proj_bias, module.out_proj.weight, module.out_proj.bias)


_MODIFIERS = ("window", "softcap", "sinks", "alibi_slopes")


def _modifier_value(v):
    """A score modifier as the library takes it: a tensor or an array becomes a float32 numpy copy (so a later
    write to it, or to the parameter it came from, changes nothing); a window becomes a tuple."""
    if isinstance(v, torch.Tensor):
        return v.detach().to(device="cpu", dtype=torch.float32).numpy().copy()
    if isinstance(v, np.ndarray):
        return np.array(v, dtype=np.float32)
    if isinstance(v, list):
        return tuple(v)
    return v


def _given_modifiers(window, softcap, sinks, alibi_slopes):
    """The score modifiers given (None: absent), by name, as the library takes them (_modifier_value)."""
    return {k: _modifier_value(v) for k, v in zip(_MODIFIERS, (window, softcap, sinks, alibi_slopes)) if v is not None}


def _score_modifiers(heads, window, softcap, sinks, alibi_slopes):
    """The score modifiers given (None: absent) as keyword arguments for the library's layer, checked for a layer
    of `heads` query heads: ValueError / TypeError with the library's message, as its constructor would raise."""
    given = _given_modifiers(window, softcap, sinks, alibi_slopes)
    _mha._check_modifiers(heads, **given)
    return given


def _compute(dtype):
    return "bf16" if dtype == torch.bfloat16 else "f32"


def _array(t, name, dtype):
    """A CPU tensor of the module's dtype as a numpy view (bfloat16 as uint16 bits)."""
    if not isinstance(t, torch.Tensor):
        raise DTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise DTypeError(f"{name} is {t.dtype} but the module's parameters are {dtype}: they must match")
    if not t.is_cpu:  # (t.device.type costs a device object per call)
        raise DTypeError(f"{name} is on {t.device}; mha runs on the CPU")
    if t.requires_grad:
        t = t.detach()
    if dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _mask(t, name):
    """A mask tensor as a numpy view: bool, uint8 and float32 / float16 / float64 (the binding converts the last
    two once); bfloat16 is widened here (numpy has no bfloat16), counted as a copy."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise DTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise DTypeError(f"{name} is on {t.device}; mha runs on the CPU")
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        _mha._count_input_copy()
        t = t.float()
    return t.numpy()


def _tensor(a, dtype):
    """The library's output array as a tensor of dtype over the same memory."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _weights_tensor(w, dtype):
    # The library writes attention weights in float32; torch returns them in the activations' dtype.
    if w is None:
        return None
    w = torch.from_numpy(w)
    return w if dtype == torch.float32 else w.to(dtype)


def _check_grad(params, tensors, what):
    # Called only with grad enabled (torch.is_grad_enabled()), so inference-mode calls pay nothing here.
    if any(p is not None and p.requires_grad for p in params) or any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(f"{what} is inference only (it computes no gradients), but grad is enabled and a "
                           "parameter or input requires grad: run it under torch.no_grad() or "
                           "torch.inference_mode(), or call requires_grad_(False)")


def _run(layer, dtype, q, k, v, kpm, need_weights, am, average, causal, batch_first, threads):
    """One library forward on tensors; library errors become ShapeError / DTypeError. (Per-call cost matters
    here: each step is a few hundred nanoseconds, so the common case avoids helper calls.)"""
    try:
        qa = _array(q, "query", dtype)
        ka = None if k is q else _array(k, "key", dtype)
        va = None if v is k else _array(v, "value", dtype)
        out, w = layer.forward(qa, ka, va, None if kpm is None else _mask(kpm, "key_padding_mask"), need_weights,
                               None if am is None else _mask(am, "attn_mask"), average, causal,
                               batch_first=batch_first, threads=threads)
    except (ShapeError, DTypeError):
        raise
    except ValueError as e:
        raise ShapeError(str(e)) from None
    except TypeError as e:
        raise DTypeError(str(e)) from None
    if dtype is torch.float32:
        return torch.from_numpy(out), (None if w is None else torch.from_numpy(w))
    return _tensor(out, dtype), _weights_tensor(w, dtype)


def _hooked(d):
    """Whether a module (its __dict__) has hooks, or tracing is on: its calls must then go through
    nn.Module.__call__, one per sequence where the caller made one per sequence."""
    return bool(d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or any(_GLOBAL_HOOKS)
                or any(map(d.get, _NEWER_HOOKS)) or torch._C._get_tracing_state())


def _packed_self_attention(layer, dtype, x, lens, causal, threads):
    """Self-attention of independent sequences packed [T, E] (x: a tensor of dtype; lens: their lengths) in one
    library call (MultiheadAttention.forward with seq_lens: one pass over the weights for all of them, each
    sequence attending over its own tokens). 16-bit activations are widened exactly and the output rounded
    back, as the library's 16-bit forward does. Returns y [T, E] of dtype."""
    xa = x.numpy() if dtype is torch.float32 else x.float().numpy()
    try:
        y, _ = layer.forward(xa, seq_lens=lens, is_causal=causal, threads=threads)
    except ValueError as e:
        raise ShapeError(str(e)) from None
    y = torch.from_numpy(y)
    return y if dtype is torch.float32 else y.to(dtype)


def _packs(layer, query, key, value, need_weights):
    """Whether a nested call runs packed: self-attention (key and value the query), no weights asked for, a
    self-attention layer."""
    return (key is query and value is query and not need_weights and layer.kdim == layer.embed_dim
            and layer.vdim == layer.embed_dim)


def _nested_forward(layer, dtype, heads, query, key, value, key_padding_mask, need_weights, attn_mask, average,
                    causal, threads):
    """Nested (ragged, batch-first) tensors: each sequence runs at its own length, so no padding is computed. The
    output is a nested tensor (its buffer is a copy of the per-sequence outputs); weights, when asked for, are
    zero-padded to the longest sequences as torch's nested path returns them. Self-attention without weights
    (torch's own fast path for nested tensors) runs all sequences packed in one call; other calls run one
    sequence at a time."""
    if key_padding_mask is not None or attn_mask is not None:
        raise ShapeError("masks are not taken with nested tensors (each sequence's own length is its padding)")
    seqs = query.unbind() if _packs(layer, query, key, value, need_weights) else None
    if seqs and all(s.dim() == 2 and s.shape[1] == layer.embed_dim for s in seqs):  # else the errors of the loop
        for s in seqs:
            _array(s, "query", dtype)  # dtype and device checks, as the per-sequence path makes them
        lens = [s.shape[0] for s in seqs]
        y = _packed_self_attention(layer, dtype, torch.cat(seqs), lens, causal, threads)
        return torch.nested.nested_tensor(list(y.split(lens)), dtype=dtype), None
    seqs = []
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not getattr(t, "is_nested", False):
            raise DTypeError(f"{name} must be a nested tensor like the query (torch.nested.nested_tensor)")
        seqs.append(t.unbind())
    qs, ks, vs = seqs
    if not len(qs) == len(ks) == len(vs):
        raise ShapeError(f"query, key and value hold {len(qs)}, {len(ks)} and {len(vs)} sequences: they must match")
    outs, ws = [], []
    for i in range(len(qs)):
        k = qs[i] if key is query else ks[i]
        v = k if value is key else vs[i]
        o, w = _run(layer, dtype, qs[i], k, v, None, need_weights, None, average, causal, True, threads)
        outs.append(o)
        ws.append(w)
    out = torch.nested.nested_tensor(outs, dtype=dtype) if outs else torch.nested.nested_tensor([], dtype=dtype)
    if not need_weights:
        return out, None
    lq = max((q.shape[0] for q in qs), default=0)
    lk = max((w.shape[-1] for w in ws), default=0)
    shape = (len(qs), lq, lk) if average else (len(qs), heads, lq, lk)
    padded = torch.zeros(shape, dtype=dtype)
    for i, w in enumerate(ws):
        padded[i, ..., :w.shape[-2], :w.shape[-1]] = w
    return out, padded


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention (same constructor, parameters, attributes, state_dict) whose forward runs mha.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) returns (attn_output, attn_weights) as torch does, for
    batch_first True and False, unbatched and nested (ragged) inputs, and empty batches or lengths. is_causal
    (torch >= 2.0's hint) is accepted on any torch: without attn_mask it applies the causal mask; with
    attn_mask, the mask is used. Masks: bool, uint8 or any floating dtype (converted once to float32).

    Parameters may be float32, bfloat16 or float16 (all one dtype); the activations must have that dtype (as in
    torch) and the outputs have it. bfloat16 modules compute with the library's bf16 GEMM operands
    (compute='bf16'), float16 ones in float32; 16-bit activations are read and written in place.

    The library packs the weights when it is built. The packed layer is rebuilt when a parameter changed: each
    call compares the parameters' identity, data pointer and version counter (in-place writes such as
    load_state_dict, optimizer steps or torch.no_grad() copies bump the version). Writes through .data do not
    bump it: call refresh() after those.

    Inside an nn.TransformerEncoderLayer, torch's fused path would run its own kernel instead of this forward:
    use mha.torch.TransformerEncoderLayer, or replace_attention(model), which converts the encoder layers too.

    mha_threads (attribute, default 0 = all cores): how many threads the library uses.

    Score modifiers (keyword-only, beyond torch's constructor; none by default): window=(left, right),
    softcap=c, sinks=[num_heads], alibi_slopes=[num_heads] or "standard", as mha.MultiheadAttention takes them
    (query i at position i: a sliding-window layer is window=(w - 1, 0) with is_causal=True).
    set_score_modifiers(...) replaces them, score_modifiers returns them. They are not parameters: state_dict
    does not hold them, pickling and copy.deepcopy keep them.

    Differences from torch: a query whose keys are all masked gets zero weights and the output bias (torch:
    NaN); add_bias_kv and add_zero_attn are not supported (ValueError); inference only.
    """

    def __init__(self, *args, window=None, softcap=None, sinks=None, alibi_slopes=None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.bias_k is not None or self.add_zero_attn:  # dtype and device are checked when packing
            raise ValueError(_unsupported(self))
        self._mha_init()
        self.set_score_modifiers(window=window, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes)

    def _mha_init(self):
        self.__dict__["_mha_lock"] = threading.Lock()
        self.__dict__["_mha_layer"] = None
        self.__dict__["_mha_key"] = None
        self.__dict__.setdefault("_mha_modifiers", {})

    def set_score_modifiers(self, *, window=None, softcap=None, sinks=None, alibi_slopes=None):
        """Replaces the score modifiers (those not given are off). Checked now against num_heads: on ValueError /
        TypeError nothing changes. The next forward packs the layer again."""
        given = _score_modifiers(self.num_heads, window, softcap, sinks, alibi_slopes)
        self.__dict__["_mha_modifiers"] = given
        self.refresh()

    @property
    def score_modifiers(self):
        """The score modifiers set (a new dict: window, softcap, sinks, alibi_slopes; absent ones are None)."""
        m = self.__dict__.get("_mha_modifiers", {})
        return {k: (m[k].copy() if isinstance(m.get(k), np.ndarray) else m.get(k)) for k in _MODIFIERS}

    def _reset_parameters(self):
        super()._reset_parameters()
        self.refresh()

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("_mha_lock", "_mha_layer", "_mha_key"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        state = dict(state)
        if "_mha_qkv_same" in state:  # pickled by an older mha.torch, which hid the flag
            state["_qkv_same_embed_dim"] = state.pop("_mha_qkv_same")
        state.pop("_mha_honest", None)
        super().__setstate__(state)
        self._mha_init()

    @classmethod
    def from_torch(cls, module, *, window=None, softcap=None, sinks=None, alibi_slopes=None):
        """An mha.torch.MultiheadAttention sharing module's parameters, submodules and hooks (no copy): what
        module computed, this computes with mha. Raises ValueError for add_bias_kv / add_zero_attn, mixed,
        non-floating or non-CPU parameters. With score modifiers given, the new module has those (and only
        those); without, it keeps module's (none for a torch module)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"from_torch needs a torch.nn.MultiheadAttention, got {type(module).__name__}")
        _check_supported(module)
        modifiers = (window, softcap, sinks, alibi_slopes)
        given = (_score_modifiers(module.num_heads, *modifiers) if any(m is not None for m in modifiers)
                 else None)  # checked before anything is made
        new = cls.__new__(cls)
        state = {k: (v.copy() if isinstance(v, dict) else v) for k, v in module.__dict__.items()}
        for k in ("_mha_lock", "_mha_layer", "_mha_key"):
            state.pop(k, None)
        new.__dict__.update(state)
        new._mha_init()
        if given is not None:
            new.__dict__["_mha_modifiers"] = given
        return new

    def refresh(self):
        """Forget the packed weights: the next forward packs the parameters again."""
        if "_mha_lock" in self.__dict__:
            with self._mha_lock:
                self.__dict__["_mha_layer"] = None
                self.__dict__["_mha_key"] = None

    def _params(self):
        # Read from the parameter dicts directly: nn.Module.__getattr__ would cost a microsecond per name here,
        # on every call.
        own = self.__dict__["_parameters"]
        out = self.__dict__["_modules"]["out_proj"].__dict__["_parameters"]
        return (own.get("in_proj_weight"), own.get("q_proj_weight"), own.get("k_proj_weight"),
                own.get("v_proj_weight"), own.get("in_proj_bias"), out.get("weight"), out.get("bias"))

    def _layer(self, params):
        """(packed layer, dtype). Which tensors the parameters are and what was last written to them: a new
        Parameter object, new memory (.to(), .data = ...) or an in-place write (version counter, bumped by a
        resize in place too) all change the key."""
        key = [None if p is None else (id(p), p.data_ptr(), p._version) for p in params]
        d = self.__dict__
        if key == d["_mha_key"]:
            return d["_mha_layer"]
        with d["_mha_lock"]:
            if d["_mha_layer"] is None or key != d["_mha_key"]:
                _check_supported(self)
                dtype = _dtype_of(self)[0]
                layer = _Layer(self.embed_dim, self.num_heads, kdim=self.kdim, vdim=self.vdim,
                               compute=_compute(dtype), **d["_mha_modifiers"], **_module_weights(self))
                d["_mha_layer"] = (layer, dtype)
                d["_mha_key"] = key
            return d["_mha_layer"]

    def _packed(self, x, lens, is_causal):
        """Self-attention of the sequences packed in x [T, E] (lengths lens), each over its own tokens, as a
        [T, E] tensor: the packed form of a nested call, for TransformerEncoderLayer's nested path."""
        params = self._params()
        if torch.is_grad_enabled():
            _check_grad(params, (x,), "mha.torch.MultiheadAttention")
        layer, dtype = self._layer(params)
        if not isinstance(x, torch.Tensor) or x.dtype != dtype or not x.is_cpu:
            _array(x, "query", dtype)  # raises the usual error
        if layer.kdim != layer.embed_dim or layer.vdim != layer.embed_dim:
            raise ShapeError("packed sequences need a self-attention module (kdim = vdim = embed_dim)")
        return _packed_self_attention(layer, dtype, x.detach() if x.requires_grad else x, lens, is_causal,
                                      self.__dict__.get("mha_threads", 0))

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                 average_attn_weights=True, is_causal=False):
        # nn.Module.__call__ without hooks is forward(*args, **kwargs) after a few checks; the same checks here,
        # with forward's own signature, save the argument repacking (about a microsecond per call).
        d = self.__dict__
        if _hooked(d):
            return super().__call__(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                    attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                    is_causal=is_causal)
        return self.forward(query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                            is_causal)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        d = self.__dict__
        own = d["_parameters"]
        out = d["_modules"]["out_proj"].__dict__["_parameters"]
        params = (own.get("in_proj_weight"), own.get("q_proj_weight"), own.get("k_proj_weight"),
                  own.get("v_proj_weight"), own.get("in_proj_bias"), out.get("weight"), out.get("bias"))
        if torch.is_grad_enabled():
            _check_grad(params, (query, key, value), "mha.torch.MultiheadAttention")
        if d["training"] and d["dropout"] > 0:
            raise RuntimeError(f"mha.torch.MultiheadAttention is inference only: the module is in training mode "
                               f"with dropout={d['dropout']}; call .eval()")
        if [None if p is None else (id(p), p.data_ptr(), p._version) for p in params] == d["_mha_key"]:
            layer, dtype = d["_mha_layer"]
        else:
            layer, dtype = self._layer(params)
        causal = attn_mask is None and bool(is_causal)
        threads = d.get("mha_threads", 0)
        if query.is_nested if isinstance(query, torch.Tensor) else False:
            if not d["batch_first"]:
                raise ShapeError("nested tensors need batch_first=True (as in torch)")
            return _nested_forward(layer, dtype, self.num_heads, query, key, value, key_padding_mask, need_weights,
                                   attn_mask, average_attn_weights, causal, threads)
        return _run(layer, dtype, query, key, value, key_padding_mask, need_weights, attn_mask,
                    average_attn_weights, causal, d["batch_first"], threads)


class TransformerEncoderLayer(nn.TransformerEncoderLayer):
    """torch.nn.TransformerEncoderLayer (same constructor, parameters, state_dict) whose self-attention runs mha.

    torch's own layer, in eval mode without grad, runs a fused kernel that never calls self_attn; this one always
    takes torch's ordinary path (norm_first or not, the same feed-forward block and norms, dropout when
    training) with self_attn an mha.torch.MultiheadAttention. Nested tensors (what nn.TransformerEncoder makes
    of a padded batch with src_key_padding_mask in eval mode) run packed: all tokens [T, E] through the norms and
    the feed-forward block at once, the attention of every sequence over its own tokens in one library call
    (MultiheadAttention.forward with seq_lens), and come back nested, as torch's fast path returns them. With
    src_mask, in training mode, or with hooks on self_attn, they run one sequence at a time (the hooks see each
    call). forward also takes is_causal (torch >= 2.0's hint). Score modifiers (window=, softcap=, sinks=,
    alibi_slopes=, keyword-only) go to self_attn (mha.torch.MultiheadAttention's)."""

    def __init__(self, *args, window=None, softcap=None, sinks=None, alibi_slopes=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attn = MultiheadAttention.from_torch(self.self_attn, window=window, softcap=softcap, sinks=sinks,
                                                       alibi_slopes=alibi_slopes)  # shares the parameters

    @classmethod
    def convert(cls, layer, **modifiers):
        """Turns an nn.TransformerEncoderLayer into this class in place (it adds no state: the same module object,
        parameters and hooks) and its self_attn into an mha.torch.MultiheadAttention sharing the parameters,
        with the score modifiers given (window=, softcap=, sinks=, alibi_slopes=). Returns 1 when self_attn was
        swapped, else 0 (a self_attn that already runs mha keeps its modifiers). ValueError when mha cannot run
        the attention."""
        if type(layer) is not nn.TransformerEncoderLayer and not isinstance(layer, cls):
            raise TypeError(f"convert needs a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
        swapped = 0
        if not isinstance(layer.self_attn, MultiheadAttention):
            layer.self_attn = MultiheadAttention.from_torch(layer.self_attn, **modifiers)
            swapped = 1
        layer.__class__ = cls
        return swapped

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        if getattr(src, "is_nested", False):
            if src_key_padding_mask is not None:
                raise ShapeError("src_key_padding_mask is not taken with a nested src (each sequence's own length "
                                 "is its padding)")
            seqs = src.unbind()
            if src_mask is None and seqs and not self.training and not _hooked(self.self_attn.__dict__):
                # All sequences packed [T, E]: the norms and the feed-forward block act per token, the
                # attention per sequence (one library call for all of them).
                lens = [s.shape[0] for s in seqs]
                y = self._dense(torch.cat(seqs), None, None, is_causal, lens)
                return torch.nested.nested_tensor(list(y.split(lens)), dtype=src.dtype)
            outs = [self._dense(s, src_mask, None, is_causal) for s in seqs]
            return torch.nested.nested_tensor(outs, dtype=src.dtype)
        return self._dense(src, src_mask, src_key_padding_mask, is_causal)

    def _dense(self, x, mask, padding, is_causal, lens=None):
        if self.norm_first:
            x = x + self._attention(self.norm1(x), mask, padding, is_causal, lens)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._attention(x, mask, padding, is_causal, lens))
        return self.norm2(x + self._ff_block(x))

    def _attention(self, x, mask, padding, is_causal, lens=None):
        if lens is not None:  # x [T, E]: sequences of lengths lens packed
            a = self.self_attn._packed(x, lens, bool(is_causal))
        else:
            a = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding, need_weights=False,
                               is_causal=is_causal)[0]
        return self.dropout1(a)


def _mha_runnable(module):
    return isinstance(module, MultiheadAttention) or (type(module) is nn.MultiheadAttention
                                                        and _unsupported(module) is None)


def replace_attention(model, *, window=None, softcap=None, sinks=None, alibi_slopes=None):
    """Makes model's attention run mha, in place; returns how many nn.MultiheadAttention were swapped.

    Every torch.nn.MultiheadAttention inside model (not model itself) becomes an mha.torch.MultiheadAttention
    sharing its parameters; every torch.nn.TransformerEncoderLayer (model itself included) whose self_attn mha
    can run becomes an mha.torch.TransformerEncoderLayer in place (torch's fused encoder path would bypass the
    attention). Modules mha cannot run (add_bias_kv, add_zero_attn, mixed or non-floating dtypes, non-CPU
    parameters) and subclasses of nn.MultiheadAttention are left as they are.

    Score modifiers given (window=, softcap=, sinks=, alibi_slopes=) apply to every module swapped; modules that
    already ran mha keep their own. They are checked against every module to be swapped (its num_heads) before
    any is: a failing check raises ValueError / TypeError and leaves the whole model as it was."""
    modifiers = _given_modifiers(window, softcap, sinks, alibi_slopes)
    if modifiers:
        for m in model.modules():
            if m is not model and type(m) is nn.MultiheadAttention and _unsupported(m) is None:
                _score_modifiers(m.num_heads, window, softcap, sinks, alibi_slopes)
    return _replace_attention(model, modifiers)


def _replace_attention(model, modifiers):
    if type(model) is nn.TransformerEncoderLayer and _mha_runnable(model.self_attn):
        return TransformerEncoderLayer.convert(model, **modifiers) + _replace_attention(model, modifiers)
    count = 0
    for name, child in list(model.named_children()):
        if type(child) is nn.MultiheadAttention and _unsupported(child) is None:
            setattr(model, name, MultiheadAttention.from_torch(child, **modifiers))
            count += 1
        else:
            count += _replace_attention(child, modifiers)
    return count


# ---- F.multi_head_attention_forward -------------------------------------------------------------------------
_PACKED = collections.OrderedDict()  # weights' identity -> (weak references, packed layer, dtype); LRU
_PACKED_MAX = 16
_PACKED_LOCK = threading.Lock()


def _packed(E, H, kdim, vdim, tensors):
    """The packed layer of these weight tensors, cached by identity, data pointer and version: packing costs a
    copy of the weights each time it happens (about E·(3E + E) floats), a cache hit costs a few attribute reads.
    Entries hold weak references, so a freed tensor whose id is reused is not mistaken for the old one."""
    key = (E, H, kdim, vdim) + tuple(None if t is None else (id(t), t.data_ptr(), t._version) for t in tensors)
    with _PACKED_LOCK:
        hit = _PACKED.get(key)
        if hit is not None and all((r is None and t is None) or (r is not None and r() is t)
                                   for r, t in zip(hit[0], tensors)):
            _PACKED.move_to_end(key)
            return hit[1], hit[2]
    dtype = None
    for t in tensors:
        if t is not None:
            if t.dtype not in _DTYPES or t.device.type != "cpu" or (dtype is not None and t.dtype != dtype):
                raise DTypeError(f"projection weights must be one of float32, bfloat16, float16 on the CPU, got "
                                 f"{[None if u is None else (u.dtype, u.device.type) for u in tensors]}")
            dtype = t.dtype
    try:
        layer = _Layer(E, H, kdim=kdim, vdim=vdim, compute=_compute(dtype), **_weights(*tensors))
    except ValueError as e:
        raise ShapeError(str(e)) from None
    with _PACKED_LOCK:
        _PACKED[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors), layer, dtype)
        while len(_PACKED) > _PACKED_MAX:
            _PACKED.popitem(last=False)
    return layer, dtype


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                                 bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias,
                                 training=True, key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None, k_proj_weight=None,
                                 v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
                                 is_causal=False):
    """torch.nn.functional.multi_head_attention_forward (torch 1.13's signature, with 2.x's is_causal) computed
    by mha: query [Lq, B, E] or unbatched [Lq, E] (sequence first), returns (attn_output, attn_weights or None).

    The packed layer is cached by the weight tensors' identity, data pointer and version (the last 16 weight
    sets), so repeated calls with the same weights do not pack them again; in-place writes to the weights are
    seen. Not supported: bias_k / bias_v, add_zero_attn, static_k / static_v (ValueError); dropout_p > 0 while
    training and gradients (RuntimeError): inference only, as mha.torch.MultiheadAttention."""
    if bias_k is not None or bias_v is not None:
        raise ValueError("bias_k / bias_v (add_bias_kv) are not supported by mha")
    if add_zero_attn:
        raise ValueError("add_zero_attn=True is not supported by mha")
    if static_k is not None or static_v is not None:
        raise ValueError("static_k / static_v are not supported by mha")
    if training and dropout_p > 0:
        raise RuntimeError(f"mha is inference only: dropout_p={dropout_p} with training=True")
    if use_separate_proj_weight:
        if q_proj_weight is None or k_proj_weight is None or v_proj_weight is None:
            raise ShapeError("use_separate_proj_weight is True but q_proj_weight, k_proj_weight or v_proj_weight "
                             "is None")
        tensors = (None, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias)
        kdim, vdim = k_proj_weight.shape[1], v_proj_weight.shape[1]
    else:
        if in_proj_weight is None:
            raise ShapeError("use_separate_proj_weight is False but in_proj_weight is None")
        tensors = (in_proj_weight, None, None, None, in_proj_bias, out_proj_weight, out_proj_bias)
        kdim = vdim = embed_dim_to_check
    if torch.is_grad_enabled():
        _check_grad(tensors, (query, key, value), "mha.torch.multi_head_attention_forward")
    if isinstance(query, torch.Tensor) and query.dim() >= 1 and query.shape[-1] != embed_dim_to_check:
        raise ShapeError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {query.shape[-1]}")
    layer, dtype = _packed(embed_dim_to_check, num_heads, kdim, vdim, tensors)
    return _run(layer, dtype, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                bool(is_causal) and attn_mask is None, False, 0)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, window=None, softcap=None, sinks=None, alibi_slopes=None):
    """torch.nn.functional.scaled_dot_product_attention (PyTorch 2.5's signature) on CPU float32 tensors
    [..., H, L, d] (rank 3 or 4), computed by mha. dropout_p must be 0 (inference only); no gradients.
    Score modifiers as mha.scaled_dot_product_attention takes them (window=(left, right), softcap=, sinks=[H],
    alibi_slopes=[H] or "standard"; tensors or arrays)."""
    if dropout_p != 0.0:
        raise ValueError("mha is inference only: dropout_p must be 0")
    tensors = (query, key, value, attn_mask)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError("mha.torch.scaled_dot_product_attention is inference only: an input requires grad; "
                           "run it under torch.no_grad() or torch.inference_mode()")
    arrays = []
    for t, n in zip(tensors, ("query", "key", "value", "attn_mask")):
        if t is None:
            arrays.append(None)
        elif not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
        elif t.device.type != "cpu":
            raise TypeError(f"{n} is on {t.device}; mha runs on the CPU")
        else:
            arrays.append(t.detach().numpy())
    modifiers = _given_modifiers(window, softcap, sinks, alibi_slopes)
    return torch.from_numpy(_np_sdpa(*arrays[:3], attn_mask=arrays[3], is_causal=is_causal, scale=scale,
                                     enable_gqa=enable_gqa, **modifiers))
