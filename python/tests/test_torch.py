"""mha.torch against PyTorch: nn.MultiheadAttention with every mask kind, causal, cross-attention, kdim/vdim,
batch_first True / False, unbatched, need_weights averaged / per head; scaled_dot_product_attention against a
matmul / softmax reference in torch (GQA with repeat_interleave); a whole nn.TransformerEncoderLayer whose
self_attn is replaced; replace_attention; weights followed after load_state_dict; inference-only errors;
four Python threads on one module. Tolerances: attention_reference.py's derived radius."""
import copy
import pickle
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mha  # noqa: E402
import mha.torch as mt  # noqa: E402
from attention_reference import LAMBDA, U32, additive, assert_within, mha_reference, sdpa_reference  # noqa: E402


def torch_mha(E, H, seed=0, **kw):
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(E, H, **kw).eval()
    with torch.no_grad():  # torch starts with zero biases: make them matter
        for name, p in m.named_parameters():
            if "bias" in name:
                p.normal_()
    return m


def torch_ref(m, *args, **kw):
    """torch's result on its ordinary (Python) path: grad enabled keeps it off the native fast path, which in
    torch 1.13 turns a float key_padding_mask into a bool one (every nonzero float masks its key)."""
    with torch.enable_grad():
        out, w = m(*args, **kw)
    return out.detach(), (w.detach() if w is not None else None)


def weights_of(m):
    return {k: v.copy() for k, v in mt._module_weights(m).items()}


def masks(kind, B, H, Lq, Lk, g):
    """(key_padding_mask, attn_mask, additive float64 [B, H, Lq, Lk]) of one mask kind, in torch's convention."""
    kpm = am = None
    add = np.zeros((B, H, Lq, Lk))
    if "kpm_bool" in kind:
        kpm = torch.rand(B, Lk, generator=g) < 0.3
        kpm[:, 0] = False  # no query loses every key (torch gives NaN there, mha zeros)
    if "kpm_float" in kind:
        kpm = torch.randn(B, Lk, generator=g)
    if "attn2_bool" in kind:
        am = torch.rand(Lq, Lk, generator=g) < 0.3
        am[:, 1] = False
    if "attn2_float" in kind:
        am = torch.randn(Lq, Lk, generator=g)
    if "attn3_bool" in kind:
        am = torch.rand(B * H, Lq, Lk, generator=g) < 0.3
        am[..., 1] = False
    if "attn3_float" in kind:
        am = torch.randn(B * H, Lq, Lk, generator=g)
    if kpm is not None:
        add = add + additive(kpm.numpy())[:, None, None, :]
    if am is not None:
        a = additive(am.numpy())
        add = add + (a.reshape(B, H, Lq, Lk) if a.ndim == 3 else a)
    return kpm, am, add


MASKS = ["none", "kpm_bool", "kpm_float", "attn2_bool", "attn2_float", "attn3_bool", "attn3_float",
         "kpm_bool+attn2_float", "kpm_bool+attn3_bool", "causal"]
# (torch 1.13 reads a float key_padding_mask as bool when an attn_mask comes with it: not compared)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("average", [True, False])
def test_self_attention_matches_torch(batch_first, kind, average):
    B, L, E, H = 3, 6, 32, 4
    ref_mod = torch_mha(E, H, batch_first=batch_first)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, L, E, generator=g)
    kpm, am, add = masks(kind, B, H, L, L, g)
    causal = kind == "causal"
    if causal:
        am = torch.triu(torch.full((L, L), float("-inf")), 1)
        add = add + am.numpy().astype(np.float64)
    xin = x if batch_first else x.transpose(0, 1)
    ref_out, ref_w = torch_ref(ref_mod, xin, xin, xin, key_padding_mask=kpm, attn_mask=am,
                               average_attn_weights=average)
    with torch.no_grad():
        out, w = mod(xin, xin, xin, key_padding_mask=kpm, attn_mask=None if causal else am,
                     average_attn_weights=average, is_causal=causal)
    assert out.shape == ref_out.shape and w.shape == ref_w.shape
    ref, r, p, rp = mha_reference(x.numpy(), x.numpy(), x.numpy(), weights_of(ref_mod), H, mask=add)
    if not batch_first:
        out, ref_out = out.transpose(0, 1), ref_out.transpose(0, 1)
    assert_within(out.numpy(), ref, r, "mha vs float64")
    assert_within(out.numpy(), ref_out.numpy(), r, "mha vs torch", implementations=2)
    if average:
        p, rp = p.mean(1), np.sqrt((rp * rp).sum(1)) / H
    assert_within(w.numpy(), p, rp, "weights vs float64")
    assert_within(w.numpy(), ref_w.numpy(), rp, "weights vs torch", implementations=2)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim, vdim", [(None, None), (12, 20)])
def test_cross_attention_kdim_vdim(batch_first, kdim, vdim):
    B, Lq, Lk, E, H = 2, 5, 8, 24, 3
    ref_mod = torch_mha(E, H, batch_first=batch_first, kdim=kdim, vdim=vdim)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(B, Lq, E, generator=g), torch.randn(B, Lk, kdim or E, generator=g), \
        torch.randn(B, Lk, vdim or E, generator=g)
    kpm, _, add = masks("kpm_bool", B, H, Lq, Lk, g)
    tr = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))
    ref_out, ref_w = torch_ref(ref_mod, tr(q), tr(k), tr(v), key_padding_mask=kpm)
    with torch.no_grad():
        out, w = mod(tr(q), tr(k), tr(v), key_padding_mask=kpm)
    ref, r, p, rp = mha_reference(q.numpy(), k.numpy(), v.numpy(), weights_of(ref_mod), H, mask=add)
    assert_within(tr(out).numpy(), ref, r, "mha vs float64")
    assert_within(tr(out).numpy(), tr(ref_out).numpy(), r, "mha vs torch", implementations=2)
    assert_within(w.numpy(), ref_w.numpy(), np.sqrt((rp * rp).sum(1)) / H, "weights", implementations=2)


def test_unbatched_no_bias_and_need_weights_false():
    E, H, L = 16, 2, 5
    ref_mod = torch_mha(E, H, bias=False)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    x = torch.randn(L, E)
    am = torch.rand(H, L, L) < 0.3
    am[..., 0] = False
    ref_out, ref_w = torch_ref(ref_mod, x, x, x, attn_mask=am, average_attn_weights=False)
    with torch.no_grad():
        out, w = mod(x, x, x, attn_mask=am, average_attn_weights=False)
        out2, none = mod(x, x, x, attn_mask=am, need_weights=False)
    assert none is None and w.shape == ref_w.shape == (H, L, L)
    ref, r, p, rp = mha_reference(x.numpy()[None], x.numpy()[None], x.numpy()[None], weights_of(ref_mod), H,
                                  mask=additive(am.numpy())[None])
    assert_within(out.numpy(), ref[0], r[0], "unbatched")
    assert_within(out.numpy(), ref_out.numpy(), r[0], "unbatched vs torch", implementations=2)
    assert_within(out2.numpy(), ref[0], r[0], "need_weights=False")  # another path: not bitwise equal


def test_no_copy_for_contiguous_tensors_and_views():
    mod = mt.MultiheadAttention(32, 4, batch_first=False).eval()
    x = torch.randn(6, 2, 32)
    before = mha.input_copies()
    with torch.no_grad():
        mod(x, x, x)
        mod(x.transpose(0, 1).contiguous().transpose(0, 1), x, x)  # strided view: still no copy
    assert mha.input_copies() == before


@pytest.mark.parametrize("batch_first", [True, False])
def test_expanded_tensors_match_torch(batch_first):
    """expand() gives zero strides: over the batch, the sequence, or only key / value (copied once each)."""
    ref_mod = torch_mha(16, 4, seed=3, batch_first=batch_first)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    B, L = 3, 5
    shape = (B, L, 16) if batch_first else (L, B, 16)
    one_batch = (1, L, 16) if batch_first else (L, 1, 16)
    one_row = (B, 1, 16) if batch_first else (1, B, 16)
    x = torch.randn(shape)
    for q, kv in [(torch.randn(one_batch).expand(shape), None), (torch.randn(one_row).expand(shape), None),
                  (x, torch.randn(one_batch).expand(shape))]:
        k = q if kv is None else kv
        with torch.no_grad():
            out, w = mod(q, k, k)
        want, want_w = torch_ref(ref_mod, q.contiguous(), k.contiguous(), k.contiguous())
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)


# ---- weights follow the module ------------------------------------------------------------------------------
def test_packed_weights_follow_parameter_changes():
    E, H = 16, 2
    a, b = torch_mha(E, H, seed=1, batch_first=True), torch_mha(E, H, seed=2, batch_first=True)
    mod = mt.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(2, 4, E)

    def check(ref):
        with torch.no_grad():
            out, _ = mod(x, x, x)
            expected, _ = ref(x, x, x)
        r = mha_reference(x.numpy(), x.numpy(), x.numpy(), weights_of(ref), H)[1]
        assert_within(out.numpy(), expected.numpy(), r, "after change", implementations=2)

    mod.load_state_dict(a.state_dict())
    check(a)
    mod.load_state_dict(b.state_dict())  # in-place copy_: the version counter moves
    check(b)
    with torch.no_grad():
        mod.out_proj.weight.mul_(2)
        b.out_proj.weight.mul_(2)
    check(b)
    mod.in_proj_weight = nn.Parameter(a.in_proj_weight.detach().clone())  # a new Parameter object
    b.in_proj_weight = nn.Parameter(a.in_proj_weight.detach().clone())
    check(b)
    mod.in_proj_bias.data.copy_(a.in_proj_bias.data)  # through .data: invisible to the version counter
    b.in_proj_bias.data.copy_(a.in_proj_bias.data)
    mod.refresh()
    check(b)


def test_state_dict_deepcopy_pickle():
    ref_mod = torch_mha(16, 2)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    assert list(mod.state_dict()) == list(ref_mod.state_dict())
    assert mod.in_proj_weight is ref_mod.in_proj_weight  # shared, not copied
    x = torch.randn(3, 2, 16)
    with torch.no_grad():
        out = mod(x, x, x)[0]
        assert torch.equal(copy.deepcopy(mod)(x, x, x)[0], out)
        assert torch.equal(pickle.loads(pickle.dumps(mod))(x, x, x)[0], out)


# ---- inference only, bad input ------------------------------------------------------------------------------
def test_grad_enabled_raises():
    mod = mt.MultiheadAttention(16, 2).eval()
    x = torch.randn(3, 2, 16)
    with pytest.raises(RuntimeError, match="inference only"):
        mod(x, x, x)
    mod.requires_grad_(False)
    mod(x, x, x)  # nothing requires grad: fine
    with pytest.raises(RuntimeError, match="inference only"):
        mod(x.requires_grad_(), x, x)
    mod.train()
    with torch.no_grad():
        mod(x, x, x)  # dropout 0: training mode computes the same
    with pytest.raises(RuntimeError, match="dropout"):
        with torch.no_grad():
            mt.MultiheadAttention(16, 2, dropout=0.1)(x, x, x)


def test_bad_input_raises_with_message():
    mod = mt.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        with pytest.raises(TypeError, match="query is torch.float64 but the module"):
            mod(x.double(), x.double(), x.double())
        with pytest.raises(ValueError, match="key_padding_mask"):
            mod(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
        with pytest.raises(ValueError, match="16|embed"):
            mod(x[..., :8], x[..., :8], x[..., :8])
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            mod(x.numpy(), x, x)
    with pytest.raises(ValueError, match="add_bias_kv"):
        mt.MultiheadAttention(16, 2, add_bias_kv=True)
    with pytest.raises(ValueError, match="add_zero_attn"):
        mt.MultiheadAttention.from_torch(nn.MultiheadAttention(16, 2, add_zero_attn=True))
    # Parameters' dtype is a dtype error, as an input's (README: DTypeError, a TypeError).
    with pytest.raises(mt.DTypeError, match="float64; mha runs float32"):
        mt.MultiheadAttention.from_torch(nn.MultiheadAttention(16, 2).double())
    wide = mt.MultiheadAttention(16, 2, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(mt.DTypeError, match="float64; mha runs float32"):
        wide(x.double(), x.double(), x.double())


def test_four_threads_on_one_module():
    ref_mod = torch_mha(64, 4, batch_first=True)
    mod = mt.MultiheadAttention.from_torch(ref_mod)
    xs = [torch.randn(2, 17, 64) for _ in range(4)]
    with torch.no_grad():
        expected = [mod(x, x, x)[0] for x in xs]
    errors = []

    def work(i):
        try:
            with torch.no_grad():  # grad mode is per thread
                for _ in range(20):
                    if not torch.equal(mod(xs[i], xs[i], xs[i])[0], expected[i]):
                        raise AssertionError(f"thread {i}: wrong result")
        except Exception as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- replace_attention and a whole encoder layer --------------------------------------------------------------
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2)
        self.blocks = nn.Sequential(nn.Linear(16, 16), nn.TransformerEncoderLayer(16, 2, 32))
        self.odd = nn.MultiheadAttention(16, 2, add_bias_kv=True)  # mha cannot run it: left alone


def test_replace_attention_counts_and_swaps():
    model = Model().eval()
    old = model.attn
    assert mt.replace_attention(model) == 2
    assert isinstance(model.attn, mt.MultiheadAttention) and model.attn.in_proj_weight is old.in_proj_weight
    assert isinstance(model.blocks[1].self_attn, mt.MultiheadAttention)
    assert type(model.odd) is nn.MultiheadAttention
    assert mt.replace_attention(model) == 0


def layer_bound(layer, x, a, r_attn):
    """Bound of |difference| of a post-norm (relu) TransformerEncoderLayer's outputs when its attention outputs
    differ by at most LAMBDA sqrt(2) r_attn (mha vs torch). x, a: the layer input and torch's attention output,
    batch first. The difference is carried first-order through norm1, the feed-forward block and norm2
    (evaluated on float64 values), and each of those blocks, which now runs on different inputs in the two runs,
    adds its own float32 rounding twice (LAMBDA times the radius of attention_reference's model)."""
    f = lambda t: t.detach().numpy().astype(np.float64)  # noqa: E731
    W1, b1, W2, b2 = f(layer.linear1.weight), f(layer.linear1.bias), f(layer.linear2.weight), f(layer.linear2.bias)
    E, F = W1.shape[1], W1.shape[0]
    two = 2 * LAMBDA  # one own rounding per run, two runs

    def norm(y, ln, dy):
        g, b = f(ln.weight), f(ln.bias)
        mu = y.mean(-1, keepdims=True)
        sd = np.sqrt(((y - mu) ** 2).mean(-1, keepdims=True) + ln.eps)
        yh = (y - mu) / sd
        out = yh * g + b
        # first order: d LN_i = g_i / sd (dy_i - mean(dy) - yh_i mean(yh dy))
        sens = np.abs(g) / sd * (dy + dy.mean(-1, keepdims=True) + np.abs(yh) * (np.abs(yh) * dy).mean(-1, keepdims=True))
        # own rounding: the mean (a sum of E terms), the centring, the variance (relative u sqrt(E + 2), half of it
        # in sd), the division, the scale and the shift
        own = np.abs(g) * (U32 * np.sqrt(E + 1) * np.abs(y).mean(-1, keepdims=True) / sd
                           + np.abs(yh) * U32 * (3 + np.sqrt(E + 2) / 2)) + U32 * np.abs(out)
        return out, sens + two * own

    y1 = x + a
    n1, dn1 = norm(y1, layer.norm1, LAMBDA * np.sqrt(2) * r_attn + two * U32 * np.abs(y1))
    h = n1 @ W1.T + b1
    dh = dn1 @ np.abs(W1).T + two * U32 * np.sqrt(E + 1) * (np.abs(n1) @ np.abs(W1).T + np.abs(b1))
    hr = np.maximum(h, 0)
    dhr = np.where(h + dh > 0, dh, 0.0)  # relu is 1-Lipschitz, and 0 in both runs where h + dh <= 0
    z = hr @ W2.T + b2
    dz = dhr @ np.abs(W2).T + two * U32 * np.sqrt(F + 1) * (hr @ np.abs(W2).T + np.abs(b2))
    y2 = n1 + z
    _, dout = norm(y2, layer.norm2, dn1 + dz + two * U32 * np.abs(y2))
    return dout


@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_layer_with_replaced_attention(batch_first):
    torch.manual_seed(3)
    E, H, B, L = 32, 4, 2, 9
    layer = nn.TransformerEncoderLayer(E, H, 64, dropout=0.0, batch_first=batch_first).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    with torch.no_grad():
        expected = layer(x)
        a = layer.self_attn(x, x, x, need_weights=False)[0]
    original = layer.self_attn
    assert mt.replace_attention(layer) == 1
    calls = []
    layer.self_attn.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        got = layer(x)
    assert calls, "torch's fused encoder path bypassed the replaced self_attn"
    tb = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))
    xb = tb(x).numpy()
    r_attn = mha_reference(xb, xb, xb, weights_of(original), H)[1]
    bound = layer_bound(layer, xb.astype(np.float64), tb(a).numpy().astype(np.float64), r_attn)
    err = (tb(got) - tb(expected)).abs().numpy()
    assert (err <= bound).all(), f"max err {err.max()} (bound there {bound.flat[err.argmax()]})"


# ---- scaled_dot_product_attention ---------------------------------------------------------------------------
def torch_sdpa_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention's definition written with matmul and softmax (torch 1.13 has no public
    one), in float64; GQA as repeat_interleave of K and V along the heads."""
    q, k, v = q.double(), k.double(), v.double()
    if enable_gqa:
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.size(-1) ** -0.5)
    if is_causal:
        s = s.masked_fill(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool \
            else s + attn_mask.double()
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("H, Hkv", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("mask", [None, "bool_B11Lk", "float_LqLk", "bool_BHLqLk", "causal"])
def test_sdpa_matches_torch_definition(H, Hkv, mask):
    g = torch.Generator().manual_seed(4)
    B, Lq, Lk, d = 2, 6, 10, 16
    q, k, v = torch.randn(B, H, Lq, d, generator=g), torch.randn(B, Hkv, Lk, d, generator=g), \
        torch.randn(B, Hkv, Lk, d, generator=g)
    am = None
    if mask == "bool_B11Lk":
        am = torch.rand(B, 1, 1, Lk, generator=g) < 0.7
        am[..., 0] = True
    elif mask == "float_LqLk":
        am = torch.randn(Lq, Lk, generator=g)
    elif mask == "bool_BHLqLk":
        am = torch.rand(B, H, Lq, Lk, generator=g) < 0.7
        am[..., 0] = True
    causal = mask == "causal"
    gqa = H != Hkv
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=am, is_causal=causal, enable_gqa=gqa)
    ref = torch_sdpa_reference(q, k, v, am, causal, enable_gqa=gqa)
    add = None
    if am is not None:
        add = np.where(am.numpy(), 0.0, -np.inf) if am.dtype == torch.bool else am.numpy().astype(np.float64)
    if causal:
        add = np.triu(np.full((Lq, Lk), -np.inf), 1)
    G = H // Hkv
    _, r, _ = sdpa_reference(q.numpy(), np.repeat(k.numpy(), G, 1), np.repeat(v.numpy(), G, 1), mask=add)
    assert_within(out.numpy(), ref.numpy(), r, "sdpa vs torch definition")


def test_sdpa_scale_and_errors():
    q = torch.randn(2, 4, 5, 8)
    out = mt.scaled_dot_product_attention(q, q, q, scale=0.2)
    _, r, _ = sdpa_reference(q.numpy(), q.numpy(), q.numpy(), scale=0.2)
    assert_within(out.numpy(), torch_sdpa_reference(q, q, q, scale=0.2).numpy(), r, "scale")
    with pytest.raises(ValueError, match="enable_gqa"):
        mt.scaled_dot_product_attention(q, q[:, :2], q[:, :2])
    with pytest.raises(ValueError, match="dropout_p"):
        mt.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(TypeError, match="float32"):
        mt.scaled_dot_product_attention(q.double(), q.double(), q.double())
