"""mha.torch as a drop-in for programs written against torch (issue 21): torch's attributes stay truthful
(_qkv_same_embed_dim, q_proj_weight) while whole nn.TransformerEncoder models run mha; empty batches and
lengths; nested tensors; float64 / float16 / bfloat16 masks; exceptions of torch's types; the function form
multi_head_attention_forward with its packed-weight cache; bfloat16 and float16 modules. Tolerances:
attention_reference.py's derived radius (float32), its bf16 operand model plus the output's rounding (bf16)."""
import gc
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import mha  # noqa: E402
import mha.torch as mt  # noqa: E402
from attention_reference import LAMBDA, U32, UBF16, additive, assert_within, mha_reference  # noqa: E402
from test_torch import layer_bound, torch_mha, torch_ref, weights_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def f64(t):
    return t.detach().double().numpy()


# ---- torch's attributes are truthful ------------------------------------------------------------------------
def test_qkv_same_embed_dim_is_truthful_and_torch_forward_runs_on_the_module():
    same = mt.MultiheadAttention(12, 4, kdim=12, vdim=12)
    assert same._qkv_same_embed_dim is True and same.q_proj_weight is None and same.in_proj_weight is not None
    other = mt.MultiheadAttention(12, 4, kdim=8, vdim=6)
    assert other._qkv_same_embed_dim is False and other.q_proj_weight is not None
    assert mt.MultiheadAttention.from_torch(nn.MultiheadAttention(12, 4))._qkv_same_embed_dim is True
    # torch's own forward reads the flag and the weights it names: it must run on our module.
    torch.manual_seed(0)
    x = torch.randn(5, 2, 12)
    for mod in (same.eval(), other.eval()):
        k = torch.randn(5, 2, mod.kdim)
        v = torch.randn(5, 2, mod.vdim)
        with torch.no_grad():
            theirs = nn.MultiheadAttention.forward(mod, x, k, v)[0]
            ours = mod(x, k, v)[0]
        r = mha_reference(x.transpose(0, 1).numpy(), k.transpose(0, 1).numpy(), v.transpose(0, 1).numpy(),
                          weights_of(mod), 4)[1]
        assert_within(ours.transpose(0, 1).numpy(), theirs.transpose(0, 1).numpy(), r, "torch forward",
                      implementations=2)


def encoder(E, H, layers, seed, norm_first=False):
    torch.manual_seed(seed)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 2 * E, dropout=0.0, batch_first=True,
                                                           norm_first=norm_first), layers).eval()
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if "bias" in name or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return enc


def padding(B, L, lengths):
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("with_padding", [False, True])
def test_transformer_encoder_layer_runs_mha_within_bound(with_padding):
    E, H, B, L = 32, 4, 3, 9
    lengths = [9, 5, 2]
    enc = encoder(E, H, 1, seed=4)
    x = torch.randn(B, L, E)
    kpm = padding(B, L, lengths) if with_padding else None
    layer = enc.layers[0]
    with torch.no_grad():
        expected = enc(x, src_key_padding_mask=kpm)  # torch's fused (nested, with padding) path
        a = layer.self_attn(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    original = layer.self_attn
    assert mt.replace_attention(enc) == 1
    assert type(layer) is mt.TransformerEncoderLayer and enc.layers[0] is layer  # converted in place
    assert layer.self_attn._qkv_same_embed_dim is True
    calls = []
    layer.self_attn.register_forward_hook(lambda *args: calls.append(1))
    with torch.no_grad():
        got = enc(x, src_key_padding_mask=kpm)
    assert calls, "torch's fused encoder path bypassed mha"
    assert got.shape == expected.shape
    mask = None if kpm is None else additive(kpm.numpy())[:, None, None, :]
    r_attn = mha_reference(x.numpy(), x.numpy(), x.numpy(), weights_of(original), H, mask=mask)[1]
    bound = layer_bound(layer, x.numpy().astype(np.float64), f64(a), r_attn)
    err = (got - expected).abs().numpy()
    valid = ~kpm.numpy() if kpm is not None else np.ones((B, L), bool)
    assert (err[valid] <= bound[valid]).all(), f"max err {err[valid].max()}"
    assert (got.numpy()[~valid] == 0).all() and (expected.numpy()[~valid] == 0).all()  # torch pads with zeros


@pytest.mark.parametrize("norm_first", [False, True])
def test_two_layer_encoder_with_padding_runs_each_sequence_at_its_length(norm_first):
    E, H, B, L = 16, 2, 3, 7
    lengths = [7, 4, 1]
    enc = encoder(E, H, 2, seed=5, norm_first=norm_first)
    assert mt.replace_attention(enc) == 2
    seen = []
    for lay in enc.layers:
        lay.self_attn.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    x = torch.randn(B, L, E)
    with torch.no_grad():
        got = enc(x, src_key_padding_mask=padding(B, L, lengths))
        seen_padded = list(seen)
        seen.clear()
        alone = [enc(x[b:b + 1, :n])[0] for b, n in enumerate(lengths)]  # each sequence on its own, no padding
    if not norm_first:  # torch's encoder makes a nested tensor only for post-norm layers
        assert sorted(seen_padded) == sorted([(n, E) for n in lengths] * 2), seen_padded  # no padded rows
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(got[b, :n].numpy(), alone[b].numpy())
        if not norm_first:
            assert (got[b, n:] == 0).all()


def test_encoder_layer_constructor_and_nested_src():
    torch.manual_seed(6)
    layer = mt.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    assert isinstance(layer.self_attn, mt.MultiheadAttention)
    assert layer.self_attn.in_proj_weight is layer.state_dict(keep_vars=True)["self_attn.in_proj_weight"]
    seqs = [torch.randn(3, 16), torch.randn(6, 16)]
    with torch.no_grad():
        out = layer(torch.nested.nested_tensor(seqs))
        assert out.is_nested
        for o, s in zip(out.unbind(), seqs):
            np.testing.assert_array_equal(o.numpy(), layer(s[None])[0].numpy())
        with pytest.raises(ValueError, match="nested"):
            layer(torch.nested.nested_tensor(seqs), src_key_padding_mask=torch.zeros(2, 6, dtype=torch.bool))


# ---- empty inputs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("B, Lq, Lk", [(0, 3, 3), (2, 0, 0), (2, 0, 4), (2, 3, 0), (0, 0, 0)])
def test_empty_batches_and_lengths_return_what_torch_returns(batch_first, B, Lq, Lk):
    E, H = 16, 2
    ref = torch_mha(E, H, seed=7, batch_first=batch_first)
    mod = mt.MultiheadAttention.from_torch(ref)
    shape = (lambda b, n: (b, n, E)) if batch_first else (lambda b, n: (n, b, E))
    q, k = torch.randn(shape(B, Lq)), torch.randn(shape(B, Lk))
    kpm = torch.zeros(B, Lk, dtype=torch.bool)
    for average in (True, False):
        with torch.no_grad():
            out, w = mod(q, k, k, key_padding_mask=kpm, average_attn_weights=average)
        t_out, t_w = torch_ref(ref, q, k, k, key_padding_mask=kpm, average_attn_weights=average)
        assert out.shape == t_out.shape and w.shape == t_w.shape
        if Lk == 0 and out.numel():  # no key: every row attends to nothing, torch gives the output bias
            np.testing.assert_array_equal(out.numpy(), t_out.numpy())
            assert (out == ref.out_proj.bias.detach()).all()


def test_empty_unbatched_and_self_attention():
    mod = mt.MultiheadAttention(8, 2).eval()
    with torch.no_grad():
        out, w = mod(torch.randn(0, 8), torch.randn(0, 8), torch.randn(0, 8))
        assert out.shape == (0, 8) and w.shape == (0, 0)
        x = torch.randn(0, 5, 8)
        out, w = mod(x, x, x, need_weights=False)
        assert out.shape == (0, 5, 8) and w is None


# ---- nested tensors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("average", [True, False])
def test_nested_self_attention_matches_torch_and_runs_each_sequence_alone(average):
    E, H = 32, 4
    ref = torch_mha(E, H, seed=8, batch_first=True)
    mod = mt.MultiheadAttention.from_torch(ref)
    seqs = [torch.randn(n, E) for n in (3, 8, 1)]
    nt = torch.nested.nested_tensor(seqs)
    with torch.no_grad():
        out, w = mod(nt, nt, nt, average_attn_weights=average)
        t_out, t_w = ref(nt, nt, nt, average_attn_weights=average)  # torch's nested fast path
        out2, w2 = mod(nt, nt, nt, need_weights=False)
    assert out.is_nested and w2 is None
    assert w.shape == t_w.shape
    for i, (o, s) in enumerate(zip(out.unbind(), seqs)):
        with torch.no_grad():
            alone, wa = mod(s, s, s, average_attn_weights=average)
        np.testing.assert_array_equal(o.numpy(), alone.numpy())
        np.testing.assert_array_equal(w[i, ..., :len(s), :len(s)].numpy(), wa.numpy())
        assert (w[i, ..., len(s):, :] == 0).all() and (w[i, ..., len(s):] == 0).all()
        r = mha_reference(s[None].numpy(), s[None].numpy(), s[None].numpy(), weights_of(ref), H)[1]
        assert_within(o.numpy(), t_out.unbind()[i].numpy(), r[0], f"sequence {i}", implementations=2)
    for o, p in zip(out2.unbind(), out.unbind()):
        assert o.shape == p.shape


def test_nested_refusals_are_clear():
    mod = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    nt = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    with torch.no_grad():
        with pytest.raises(ValueError, match="nested"):
            mod(nt, nt, nt, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
        with pytest.raises(TypeError, match="nested"):
            mod(nt, torch.randn(2, 3, 8), torch.randn(2, 3, 8))
        with pytest.raises(ValueError, match="batch_first"):
            mt.MultiheadAttention(8, 2).eval()(nt, nt, nt)


# ---- mask dtypes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("which", ["attn_mask", "key_padding_mask"])
def test_floating_masks_of_any_dtype_are_converted_once(dtype, which):
    E, H, B, L = 16, 2, 2, 5
    mod = mt.MultiheadAttention.from_torch(torch_mha(E, H, seed=9, batch_first=True))
    x = torch.randn(B, L, E)
    m = torch.randn((L, L) if which == "attn_mask" else (B, L)).to(dtype)  # values exact in float32
    with torch.no_grad():
        before = mha.input_copies()
        got = mod(x, x, x, **{which: m})
        assert mha.input_copies() == before + 1  # one conversion
        want = mod(x, x, x, **{which: m.float()})
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())


def test_integer_masks_are_refused_like_torch():
    mod = mt.MultiheadAttention(8, 2).eval()
    x = torch.randn(3, 2, 8)
    with torch.no_grad(), pytest.raises(AssertionError, match="int64"):
        mod(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int64))


# ---- exception types ----------------------------------------------------------------------------------------
E_, H_ = 8, 2
X = torch.randn(2, 3, E_)
MISUSE = {
    "key 2-D": lambda m: m(X, X[0], X[0]),
    "embed dim": lambda m: m(X[..., :6], X[..., :6], X[..., :6]),
    "key_padding_mask shape": lambda m: m(X, X, X, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
    "2-D attn_mask shape": lambda m: m(X, X, X, attn_mask=torch.zeros(3, 4, dtype=torch.bool)),
    "3-D attn_mask shape": lambda m: m(X, X, X, attn_mask=torch.zeros(5, 3, 3, dtype=torch.bool)),
    "4-D attn_mask": lambda m: m(X, X, X, attn_mask=torch.zeros(1, 1, 3, 3, dtype=torch.bool)),
    "key batch": lambda m: m(X, torch.randn(3, 3, E_), torch.randn(3, 3, E_)),
    "key / value length": lambda m: m(X, torch.randn(2, 4, E_), torch.randn(2, 5, E_)),
    "4-D query": lambda m: m(X[None], X[None], X[None]),
    "int64 mask": lambda m: m(X, X, X, attn_mask=torch.zeros(3, 3, dtype=torch.int64)),
    "float64 query": lambda m: m(X.double(), X.double(), X.double()),
    "unbatched 2-D key_padding_mask": lambda m: m(X[0], X[0], X[0], key_padding_mask=torch.zeros(2, 3, dtype=torch.bool)),
}


@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_raises_torchs_exception_type_with_mhas_message(case):
    ref = nn.MultiheadAttention(E_, H_, batch_first=True).eval()
    mod = mt.MultiheadAttention.from_torch(ref)
    with torch.no_grad():
        with pytest.raises(Exception) as theirs:
            MISUSE[case](ref)
        with pytest.raises(Exception) as ours:
            MISUSE[case](mod)
    assert isinstance(ours.value, type(theirs.value)), f"torch raised {type(theirs.value).__name__}"
    assert isinstance(ours.value, (mt.ShapeError, mt.DTypeError))
    assert isinstance(ours.value, (ValueError, TypeError))  # what the numpy API raises
    assert "Expected" not in str(ours.value)  # mha's message, not torch's


# ---- the function form --------------------------------------------------------------------------------------
def function_args(E, H, kdim, vdim, seed):
    m = torch_mha(E, H, seed=seed, kdim=kdim, vdim=vdim)
    separate = not m._qkv_same_embed_dim
    return m, dict(embed_dim_to_check=E, num_heads=H, in_proj_weight=m.in_proj_weight,
                   in_proj_bias=m.in_proj_bias, bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
                   out_proj_weight=m.out_proj.weight, out_proj_bias=m.out_proj.bias, training=False,
                   use_separate_proj_weight=separate, q_proj_weight=m.q_proj_weight, k_proj_weight=m.k_proj_weight,
                   v_proj_weight=m.v_proj_weight)


@pytest.mark.parametrize("kdim, vdim", [(None, None), (12, 20)])
@pytest.mark.parametrize("average", [True, False])
def test_function_form_matches_torch(kdim, vdim, average):
    E, H, B, Lq, Lk = 16, 4, 2, 5, 7
    m, args = function_args(E, H, kdim, vdim, seed=10)
    q = torch.randn(Lq, B, E)
    k, v = torch.randn(Lk, B, m.kdim), torch.randn(Lk, B, m.vdim)
    kpm = torch.rand(B, Lk) < 0.3
    kpm[:, 0] = False
    am = torch.randn(Lq, Lk)
    with torch.no_grad():
        out, w = mt.multi_head_attention_forward(q, k, v, key_padding_mask=kpm, attn_mask=am,
                                                 average_attn_weights=average, **args)
    with torch.enable_grad():
        t_out, t_w = F.multi_head_attention_forward(q, k, v, key_padding_mask=kpm, attn_mask=am,
                                                    average_attn_weights=average, **args)
    mask = additive(kpm.numpy())[:, None, None, :] + additive(am.numpy())
    tb = lambda t: t.detach().transpose(0, 1).numpy()  # noqa: E731
    _, r, _, rp = mha_reference(tb(q), tb(k), tb(v), weights_of(m), H, mask=mask)
    assert_within(tb(out), tb(t_out), r, "function output", implementations=2)
    # averaged weights: the mean of the heads' errors is within the largest head's radius
    rw = rp.max(1) if average else rp
    assert w.shape == t_w.shape
    assert_within(w.numpy(), t_w.detach().numpy(), rw, "weights", implementations=2)


def test_function_form_caches_the_packed_layer_and_follows_weight_changes():
    E, H = 16, 2
    m, args = function_args(E, H, None, None, seed=11)
    x = torch.randn(4, 2, E)
    mt._PACKED.clear()
    with torch.no_grad():
        a = mt.multi_head_attention_forward(x, x, x, **args)[0]
        entry = next(iter(mt._PACKED.values()))
        b = mt.multi_head_attention_forward(x, x, x, **args)[0]
        assert len(mt._PACKED) == 1 and next(iter(mt._PACKED.values())) is entry  # not packed again
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        m.in_proj_weight.mul_(0.5)  # in place: the version counter changes
        c = mt.multi_head_attention_forward(x, x, x, **args)[0]
        want = mt.MultiheadAttention.from_torch(m)(x, x, x)[0]
    assert len(mt._PACKED) == 2
    np.testing.assert_array_equal(c.numpy(), want.numpy())
    # A freed weight whose id and address come back is not mistaken for the old one: the entry's weak reference
    # is dead.
    key = next(reversed(mt._PACKED))
    del args, m, entry
    gc.collect()
    refs = mt._PACKED[key][0]
    assert all(r is None or r() is None for r in refs)


def test_function_form_refusals():
    E, H = 8, 2
    m, args = function_args(E, H, None, None, seed=12)
    x = torch.randn(3, 2, E)
    with torch.no_grad():
        with pytest.raises(ValueError, match="bias_k"):
            mt.multi_head_attention_forward(x, x, x, **{**args, "bias_k": torch.zeros(1, 1, E),
                                                        "bias_v": torch.zeros(1, 1, E)})
        with pytest.raises(ValueError, match="add_zero_attn"):
            mt.multi_head_attention_forward(x, x, x, **{**args, "add_zero_attn": True})
        with pytest.raises(ValueError, match="static_k"):
            mt.multi_head_attention_forward(x, x, x, **args, static_k=torch.zeros(4, 3, 4))
        with pytest.raises(RuntimeError, match="inference only"):
            mt.multi_head_attention_forward(x, x, x, **{**args, "training": True, "dropout_p": 0.1})
        with pytest.raises(AssertionError, match="embedding dimension"):
            mt.multi_head_attention_forward(x, x, x, **{**args, "embed_dim_to_check": 12})
        with pytest.raises(AssertionError, match="q_proj_weight"):
            mt.multi_head_attention_forward(x, x, x, **{**args, "use_separate_proj_weight": True})
    with pytest.raises(RuntimeError, match="inference only"):
        mt.multi_head_attention_forward(x, x, x, **args)  # grad enabled, the weights require grad


# ---- bfloat16 and float16 modules ---------------------------------------------------------------------------
def sixteen_bit(E, H, dtype, seed):
    ref = torch_mha(E, H, seed=seed, batch_first=True)
    return ref.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_modules_within_bound_and_not_worse_than_torch(dtype):
    E, H, B, L = 64, 4, 2, 16
    tm = sixteen_bit(E, H, dtype, seed=13)
    mod = mt.MultiheadAttention.from_torch(tm)
    x = torch.randn(B, L, E).to(dtype)
    with torch.no_grad():
        before = mha.input_copies()
        out, w = mod(x, x, x)
        assert mha.input_copies() == before  # 16-bit activations read in place
    assert out.dtype == dtype and w.dtype == dtype
    w64 = {k: f64(torch.from_numpy(v)) for k, v in weights_of(tm).items()}  # the 16-bit weights, exactly
    xs = f64(x)
    ub = UBF16 if dtype == torch.bfloat16 else 0.0  # float16 modules compute in float32
    ref, r, _, _ = mha_reference(xs, xs, xs, w64, H, ub=ub)
    u_out = UBF16 if dtype == torch.bfloat16 else 2.0 ** -11  # the output's own rounding to 16 bits
    err = np.abs(f64(out) - ref)
    bound = LAMBDA * r + u_out * np.abs(ref)
    assert (err <= bound).all(), f"max err {err.max()}, bound there {bound.flat[err.argmax()]}"
    if dtype == torch.bfloat16:  # torch 1.13 runs bf16 on the CPU (not float16)
        with torch.no_grad():
            t_out = tm(x, x, x)[0]
        t_err = np.abs(f64(t_out) - ref)
        assert np.sqrt((err ** 2).mean()) <= 1.5 * np.sqrt((t_err ** 2).mean())
        assert err.max() <= 1.5 * t_err.max()


def test_16_bit_dtype_mismatch_raises_like_torch_and_replace_converts_16_bit_modules():
    tm = sixteen_bit(16, 2, torch.bfloat16, seed=14)
    mod = mt.MultiheadAttention.from_torch(tm)
    x = torch.randn(2, 3, 16)
    with torch.no_grad(), pytest.raises(RuntimeError, match="bfloat16"):
        mod(x, x, x)  # float32 activations on a bf16 module (torch: RuntimeError)
    model = nn.Sequential(nn.MultiheadAttention(16, 2).to(torch.bfloat16), nn.MultiheadAttention(16, 2).half())
    assert mt.replace_attention(model) == 2
    mixed = nn.MultiheadAttention(16, 2)
    mixed.out_proj.half()
    with pytest.raises(mt.DTypeError, match="others are"):  # a RuntimeError, as torch raises there
        mt.MultiheadAttention.from_torch(mixed)
    # the function form takes 16-bit weights too
    args = dict(embed_dim_to_check=16, num_heads=2, in_proj_weight=tm.in_proj_weight, in_proj_bias=tm.in_proj_bias,
                bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0, out_proj_weight=tm.out_proj.weight,
                out_proj_bias=tm.out_proj.bias, training=False)
    xb = x.to(torch.bfloat16).transpose(0, 1)
    with torch.no_grad():
        got = mt.multi_head_attention_forward(xb, xb, xb, **args)[0]
        want = mod(xb.transpose(0, 1), xb.transpose(0, 1), xb.transpose(0, 1))[0]
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.transpose(0, 1).float().numpy(), want.float().numpy())
