"""mha.torch: the library behind PyTorch's interfaces (needs torch; `import mha.torch`, or just use mha.torch).

    mha.torch.MultiheadAttention          a torch.nn.MultiheadAttention whose forward runs mha
    mha.torch.replace_attention(model)    swaps every nn.MultiheadAttention of a model in place, returns the count
    mha.torch.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                           enable_gqa=False)

Tensors go to the library as numpy views of their memory (no copy for float32 CPU tensors whose last dim is
contiguous). Inference only: with grad enabled and parameters or inputs that require grad, forward raises.
"""
import collections
import threading

import numpy as np
import torch
from torch import nn

from . import MultiheadAttention as _Layer
from . import scaled_dot_product_attention as _np_sdpa

__all__ = ["MultiheadAttention", "replace_attention", "scaled_dot_product_attention"]


def _real_same_dim(module):
    # mha.torch.MultiheadAttention reports _qkv_same_embed_dim = False to torch (see the class); the truth is here.
    return module.__dict__.get("_mha_qkv_same", module.__dict__.get("_qkv_same_embed_dim", True))


def _unsupported(module):
    """Why the library cannot run this nn.MultiheadAttention, or None."""
    if module.bias_k is not None or module.bias_v is not None:
        return "add_bias_kv=True is not supported by mha"
    if module.add_zero_attn:
        return "add_zero_attn=True is not supported by mha"
    for name, p in module.named_parameters():
        if p.dtype != torch.float32 or p.device.type != "cpu":
            return f"parameter {name} is {p.dtype} on {p.device}; mha runs float32 on the CPU"
    return None


def _np(t):
    return t.detach().numpy()


def _module_weights(module):
    """An nn.MultiheadAttention's weights as numpy arrays (views of the parameters) named as mha's constructor
    names them."""
    why = _unsupported(module)
    if why:
        raise ValueError(why)
    w = {}
    if _real_same_dim(module):
        w["in_proj_weight"] = _np(module.in_proj_weight)
    else:
        w["q_proj_weight"] = _np(module.q_proj_weight)
        w["k_proj_weight"] = _np(module.k_proj_weight)
        w["v_proj_weight"] = _np(module.v_proj_weight)
    if module.in_proj_bias is not None:
        w["in_proj_bias"] = _np(module.in_proj_bias)
    w["out_proj_weight"] = _np(module.out_proj.weight)
    if module.out_proj.bias is not None:
        w["out_proj_bias"] = _np(module.out_proj.bias)
    return w


def _as_input(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise TypeError(f"{name} is on {t.device}; mha runs on the CPU")
    return t.detach().numpy()


def _as_mask(t, name):
    if t is None:
        return None
    a = _as_input(t, name)
    return a


def _check_inference(module, tensors):
    if torch.is_grad_enabled() and (any(p.requires_grad for p in module.parameters())
                                    or any(t is not None and t.requires_grad for t in tensors)):
        raise RuntimeError("mha.torch.MultiheadAttention is inference only (it computes no gradients), but grad is "
                           "enabled and a parameter or input requires grad: run it under torch.no_grad() or "
                           "torch.inference_mode(), or call requires_grad_(False)")
    if module.training and module.dropout > 0:
        raise RuntimeError(f"mha.torch.MultiheadAttention is inference only: the module is in training mode with "
                           f"dropout={module.dropout}; call .eval()")


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention (same constructor, parameters, state_dict) whose forward runs mha.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True, is_causal=False) returns (attn_output, attn_weights) as torch does, for
    batch_first True and False and unbatched inputs. is_causal (torch >= 2.0's hint) is accepted on any torch:
    without attn_mask it applies the causal mask; with attn_mask, the mask is used.

    The library packs the weights when it is built. The packed layer is rebuilt when a parameter changed: each
    call compares the parameters' identity, data pointer and version counter (in-place writes such as
    load_state_dict, optimizer steps or torch.no_grad() copies bump the version). Writes through .data do not
    bump it: call refresh() after those.

    mha_threads (attribute, default 0 = all cores): how many threads the library uses.

    Differences from torch: a query whose keys are all masked gets zero weights and the output bias (torch:
    NaN); add_bias_kv and add_zero_attn are not supported (ValueError); inference only.
    """

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_mha_honest", True)  # torch's __init__ reads _qkv_same_embed_dim
        super().__init__(*args, **kwargs)
        self.__dict__["_mha_honest"] = False
        if self.bias_k is not None or self.add_zero_attn:  # dtype and device are checked when packing
            raise ValueError(_unsupported(self))
        self._mha_init()

    def _mha_init(self):
        self.__dict__["_mha_lock"] = threading.Lock()
        self.__dict__["_mha_layer"] = None
        self.__dict__["_mha_key"] = None
        self.__dict__.setdefault("_mha_honest", False)

    # torch's TransformerEncoderLayer / TransformerEncoder (1.13 and later) run a fused kernel of their own that
    # reads self_attn's weights and never calls self_attn.forward when self_attn._qkv_same_embed_dim is True (and
    # batch_first, eval, no grad, ...). Reporting False makes them take their ordinary path through this forward;
    # nothing else of torch's reads the flag once the module is built (our forward and _reset_parameters use the
    # real value, kept in _mha_qkv_same).
    @property
    def _qkv_same_embed_dim(self):
        same = self.__dict__.get("_mha_qkv_same", True)
        return same if self.__dict__.get("_mha_honest", False) else False

    @_qkv_same_embed_dim.setter
    def _qkv_same_embed_dim(self, value):
        self.__dict__["_mha_qkv_same"] = bool(value)

    def _reset_parameters(self):
        self.__dict__["_mha_honest"] = True
        try:
            super()._reset_parameters()
        finally:
            self.__dict__["_mha_honest"] = False
        self.refresh()

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in ("_mha_lock", "_mha_layer", "_mha_key"):
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.pop("_qkv_same_embed_dim", None)  # torch's __setstate__ may add it; ours is the property
        self._mha_init()

    @classmethod
    def from_torch(cls, module):
        """An mha.torch.MultiheadAttention sharing module's parameters, submodules and hooks (no copy): what
        module computed, this computes with mha. Raises ValueError for add_bias_kv / add_zero_attn, non-float32
        or non-CPU parameters."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"from_torch needs a torch.nn.MultiheadAttention, got {type(module).__name__}")
        why = _unsupported(module)
        if why:
            raise ValueError(why)
        new = cls.__new__(cls)
        state = {k: (v.copy() if isinstance(v, dict) else v) for k, v in module.__dict__.items()}
        state["_mha_qkv_same"] = _real_same_dim(module)
        state.pop("_qkv_same_embed_dim", None)
        state["_mha_honest"] = False
        for k in ("_mha_lock", "_mha_layer", "_mha_key"):
            state.pop(k, None)
        new.__dict__.update(state)
        new._mha_init()
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

    def _layer(self):
        # Which tensors the parameters are and what was last written to them: a new Parameter object, new memory
        # (.to(), .data = ...) or an in-place write (version counter) all change the key.
        # (A resize in place bumps the version too.)
        key = tuple(None if p is None else (id(p), p.data_ptr(), p._version) for p in self._params())
        layer = self._mha_layer
        if layer is not None and key == self._mha_key:
            return layer
        with self._mha_lock:
            if self._mha_layer is None or key != self._mha_key:
                why = _unsupported(self)
                if why:
                    raise ValueError(why)
                self.__dict__["_mha_layer"] = _Layer(self.embed_dim, self.num_heads, kdim=self.kdim, vdim=self.vdim,
                                                     **_module_weights(self))
                self.__dict__["_mha_key"] = key
            return self._mha_layer

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        _check_inference(self, (query, key, value))
        threads = self.__dict__.get("mha_threads", 0)
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != torch.float32:
                raise TypeError(f"{name} must be float32 (mha computes in float32), got {t.dtype}")
        layer = self._layer()
        q = _as_input(query, "query")
        k = None if key is query else _as_input(key, "key")
        v = None if value is key else _as_input(value, "value")
        out, w = layer.forward(q, k, v, _as_mask(key_padding_mask, "key_padding_mask"), need_weights,
                               _as_mask(attn_mask, "attn_mask"), average_attn_weights,
                               bool(is_causal) and attn_mask is None, batch_first=self.batch_first, threads=threads)
        return torch.from_numpy(out), (torch.from_numpy(w) if w is not None else None)


def replace_attention(model):
    """Replaces every torch.nn.MultiheadAttention inside model (not model itself) by an
    mha.torch.MultiheadAttention sharing its parameters, in place; returns how many were replaced. Modules mha
    cannot run (add_bias_kv, add_zero_attn, non-float32 or non-CPU parameters) and subclasses of
    nn.MultiheadAttention are left as they are."""
    count = 0
    for name, child in list(model.named_children()):
        if type(child) is nn.MultiheadAttention and _unsupported(child) is None:
            setattr(model, name, MultiheadAttention.from_torch(child))
            count += 1
        else:
            count += replace_attention(child)
    return count


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention (PyTorch 2.5's signature) on CPU float32 tensors
    [..., H, L, d] (rank 3 or 4), computed by mha. dropout_p must be 0 (inference only); no gradients."""
    if dropout_p != 0.0:
        raise ValueError("mha is inference only: dropout_p must be 0")
    tensors = (query, key, value, attn_mask)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError("mha.torch.scaled_dot_product_attention is inference only: an input requires grad; "
                           "run it under torch.no_grad() or torch.inference_mode()")
    arrays = [_as_input(t, n) if t is not None else None for t, n in zip(tensors, ("query", "key", "value", "attn_mask"))]
    return torch.from_numpy(_np_sdpa(*arrays[:3], attn_mask=arrays[3], is_causal=is_causal, scale=scale,
                                     enable_gqa=enable_gqa))
