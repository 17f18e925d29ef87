"""Score modifiers (issue 24) through mha.torch: MultiheadAttention(..., window=, softcap=, sinks=, alibi_slopes=),
set_score_modifiers, from_torch, TransformerEncoderLayer, replace_attention and scaled_dot_product_attention.

Window and ALiBi are an additive float64 mask, so mha_reference (attention_reference.py) with that mask is the
oracle, within its derived radius plus ALiBi's own rounding (test_modifiers.py derives that term). Softcap and
sinks have no torch equivalent: the module must give the bits of mha.MultiheadAttention built with the same
weights and keywords (the wiring), whose values test_modifiers.py and the C++ fixtures check against the models'
formulas; a float64 evaluation of gpt-oss's / Gemma 2's formula is checked here too, within twice the radius of
the unmodified problem (test_modifiers.py: neither modifier enlarges the first-order radius beyond 5u per score)."""
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import mha  # noqa: E402
import mha.torch as mt  # noqa: E402
from attention_reference import U32, assert_within, mha_reference  # noqa: E402

RNG = np.random.default_rng(77)


def window_alibi_mask(L, H, left, slopes):
    """[1, H, L, L] additive float64 mask: causal, keys at p - left .. p visible (left -1: all), ALiBi slopes."""
    p, j = np.arange(L)[:, None], np.arange(L)[None, :]
    hide = j > p
    if left >= 0:
        hide |= j < p - left
    m = np.zeros((1, H, L, L))
    if slopes is not None:
        m = m - np.asarray(slopes, np.float64)[None, :, None, None] * (p - j)[None, None]
    return np.where(hide[None, None], -np.inf, m)


def module(E, H, seed=0, **kw):
    torch.manual_seed(seed)
    m = mt.MultiheadAttention(E, H, batch_first=True, **kw).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "bias" in name:
                p.normal_()
    return m


def x_of(B, L, E, dtype=torch.float32):
    return torch.from_numpy(RNG.standard_normal((B, L, E)).astype(np.float32)).to(dtype)


def np_layer(m, **kw):
    """mha.MultiheadAttention (the numpy API) with m's weights and the given keywords."""
    return mha.MultiheadAttention.from_torch(m, **kw)


def alibi_extra(mask, ref):
    finite = np.where(np.isfinite(mask), mask, 0)
    return 8 * U32 * float(np.max(np.abs(finite))) * np.abs(ref).max()


@torch.no_grad()
@pytest.mark.parametrize("left,alibi", [(5, None), (None, "standard"), (3, "array")])
def test_window_and_alibi_against_the_float64_mask(left, alibi):
    E, H, B, L = 32, 4, 2, 19
    slopes = {"standard": mha.alibi_standard_slopes(H), "array": RNG.random(H).astype(np.float32) * 0.4}.get(alibi)
    kw = {}
    if left is not None:
        kw["window"] = (left, 0)
    if alibi is not None:
        kw["alibi_slopes"] = "standard" if alibi == "standard" else torch.from_numpy(slopes)
    m = module(E, H, **kw)
    x = x_of(B, L, E)
    y, _ = m(x, x, x, need_weights=False, is_causal=True)
    mask = window_alibi_mask(L, H, -1 if left is None else left, slopes)
    ref, bound, _, _ = mha_reference(x.numpy(), x.numpy(), x.numpy(), mt._module_weights(m), H, mask=mask)
    assert_within(y.numpy(), ref, bound + alibi_extra(mask, ref), "mha.torch window / ALiBi")
    # torch's own module with the same additive mask, as a second opinion (float32 on both sides).
    plain = nn.MultiheadAttention(E, H, batch_first=True).eval()
    plain.load_state_dict(m.state_dict())
    am = torch.from_numpy(np.broadcast_to(mask, (B, H, L, L)).reshape(B * H, L, L).astype(np.float32))
    with torch.enable_grad():
        t, _ = plain(x, x, x, attn_mask=am, need_weights=False)
    assert_within(t.detach().numpy(), ref, 4 * bound + alibi_extra(mask, ref), "torch with the mask")


def gpt_oss_reference(m, x, softcap, sinks):
    """Float64: projections, scores / sqrt(d), c tanh(s / c) (Gemma 2), a sink logit per head in the denominator
    (gpt-oss), P V, output projection. Non-causal."""
    w = {k: np.asarray(v, np.float64) for k, v in mt._module_weights(m).items()}
    E, H = m.embed_dim, m.num_heads
    d = E // H
    X = x.double().numpy()
    Wq, Wk, Wv = np.split(w["in_proj_weight"], 3)
    bq, bk, bv = np.split(w["in_proj_bias"], 3)
    out = []
    for b in range(X.shape[0]):
        Q, K, V = X[b] @ Wq.T + bq, X[b] @ Wk.T + bk, X[b] @ Wv.T + bv
        heads = []
        for h in range(H):
            s = Q[:, h * d:(h + 1) * d] @ K[:, h * d:(h + 1) * d].T / np.sqrt(d)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            mx = s.max(-1, keepdims=True)
            e = np.exp(s - mx)
            den = e.sum(-1, keepdims=True) + (0.0 if sinks is None else np.exp(float(sinks[h]) - mx))
            heads.append((e / den) @ V[:, h * d:(h + 1) * d])
        out.append(np.concatenate(heads, -1) @ w["out_proj_weight"].T + w["out_proj_bias"])
    return np.stack(out)


@torch.no_grad()
@pytest.mark.parametrize("softcap,with_sinks", [(2.0, False), (None, True), (1.5, True)])
def test_softcap_and_sinks_are_the_layers_bits_and_the_models_formula(softcap, with_sinks):
    E, H, B, L = 32, 4, 2, 13
    sinks = nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0])) if with_sinks else None  # gpt-oss keeps a Parameter
    m = module(E, H, softcap=softcap, sinks=sinks)
    x = x_of(B, L, E)
    y, w = m(x, x, x, need_weights=True, average_attn_weights=False)
    ny, nw = np_layer(m, softcap=softcap, sinks=None if sinks is None else sinks.detach().numpy())(
        x.numpy(), need_weights=True, average_attn_weights=False)
    assert np.array_equal(y.numpy(), ny) and np.array_equal(w.numpy(), nw)
    if with_sinks:
        assert np.all(w.sum(-1).numpy() < 1)  # the sink takes a share of every row
    ref = gpt_oss_reference(m, x, softcap, None if sinks is None else sinks.detach().numpy())
    _, bound, _, _ = mha_reference(x.numpy(), x.numpy(), x.numpy(), mt._module_weights(m), H)
    assert_within(y.numpy(), ref, 2 * bound, "mha.torch softcap / sinks")
    if with_sinks:  # a copy was taken: writing to the parameter later changes nothing
        fused = m(x, x, x, need_weights=False)[0]
        sinks.add_(10.0)
        assert torch.equal(m(x, x, x, need_weights=False)[0], fused)


@torch.no_grad()
def test_bf16_module_takes_the_modifiers():
    E, H, B, L = 32, 4, 1, 11
    kw = dict(window=(4, 0), softcap=3.0, sinks=np.array([0.1, 0.2, -0.3, 1.0], np.float32), alibi_slopes="standard")
    m = module(E, H, **kw).to(torch.bfloat16)
    x = x_of(B, L, E, torch.bfloat16)
    y, _ = m(x, x, x, need_weights=False, is_causal=True)
    ref_layer = np_layer(m, compute="bf16", **kw)
    ny, _ = ref_layer(x.view(torch.int16).numpy().view(np.uint16), is_causal=True)
    assert np.array_equal(y.view(torch.int16).numpy().view(np.uint16), ny)
    plain = module(E, H).to(torch.bfloat16)
    plain.load_state_dict(m.state_dict())
    assert not torch.equal(plain(x, x, x, need_weights=False, is_causal=True)[0], y)  # the modifiers acted


@torch.no_grad()
def test_set_score_modifiers_checks_and_changes_nothing_on_error():
    E, H = 32, 4
    m = module(E, H, window=(2, 0))
    x = x_of(1, 9, E)
    before = m(x, x, x, need_weights=False, is_causal=True)[0]
    for kw, message in [(dict(window=(-2, 0)), "window left"), (dict(softcap=-1.0), "softcap"),
                        (dict(sinks=np.zeros(3, np.float32)), r"sinks must have shape \[4\]"),
                        (dict(sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), "not finite"),
                        (dict(alibi_slopes="bloom"), "alibi_slopes")]:
        with pytest.raises(ValueError, match=message):
            m.set_score_modifiers(**kw)
        with pytest.raises(ValueError, match=message):
            mt.MultiheadAttention(E, H, **kw)
        assert m.score_modifiers == {"window": (2, 0), "softcap": None, "sinks": None, "alibi_slopes": None}
        assert torch.equal(m(x, x, x, need_weights=False, is_causal=True)[0], before)
    m.set_score_modifiers()  # all off: torch's own result
    plain = nn.MultiheadAttention(E, H, batch_first=True).eval()
    plain.load_state_dict(m.state_dict())
    ref, bound, _, _ = mha_reference(x.numpy(), x.numpy(), x.numpy(), mt._module_weights(m), H,
                                     mask=window_alibi_mask(9, H, -1, None))
    assert_within(m(x, x, x, need_weights=False, is_causal=True)[0].numpy(), ref, bound, "modifiers off")
    assert not torch.equal(m(x, x, x, need_weights=False, is_causal=True)[0], before)


@torch.no_grad()
def test_modifiers_survive_pickle_deepcopy_from_torch_and_load_state_dict():
    E, H = 32, 4
    kw = dict(window=(3, 0), softcap=5.0, alibi_slopes="standard", sinks=np.array([1, 0, -1, 0.5], np.float32))
    m = module(E, H, **kw)
    x = x_of(2, 10, E)
    y = m(x, x, x, need_weights=False, is_causal=True)[0]
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m), mt.MultiheadAttention.from_torch(m)):
        assert torch.equal(other(x, x, x, need_weights=False, is_causal=True)[0], y)
    t = nn.MultiheadAttention(E, H, batch_first=True).eval()
    t.load_state_dict(m.state_dict())  # the modifiers are not parameters: state_dict does not carry them
    swapped = mt.MultiheadAttention.from_torch(t, **kw)
    assert torch.equal(swapped(x, x, x, need_weights=False, is_causal=True)[0], y)
    fresh = module(E, H, seed=5, **kw)
    fresh.load_state_dict(m.state_dict())  # new weights, the same modifiers
    assert torch.equal(fresh(x, x, x, need_weights=False, is_causal=True)[0], y)
    assert mt.MultiheadAttention.from_torch(m, softcap=1.0).score_modifiers["window"] is None  # given: replaced


@torch.no_grad()
def test_encoder_layer_and_replace_attention_pass_them_on():
    E, H, L = 32, 4, 12
    torch.manual_seed(1)
    enc = mt.TransformerEncoderLayer(E, H, dim_feedforward=64, batch_first=True, window=(3, 0),
                                     alibi_slopes="standard").eval()
    assert enc.self_attn.score_modifiers["window"] == (3, 0)
    x = x_of(2, L, E)
    y = enc(x, is_causal=True)
    # The same layer built from torch and converted by replace_attention with the same keywords: the same bits.
    torch.manual_seed(1)
    model = nn.Sequential(nn.TransformerEncoderLayer(E, H, dim_feedforward=64, batch_first=True)).eval()
    model[0].load_state_dict(enc.state_dict())
    assert mt.replace_attention(model, window=(3, 0), alibi_slopes="standard") == 1
    assert torch.equal(model[0](x, is_causal=True), y)
    # Nested (packed through forward_varlen) = each sequence alone.
    seqs = [x_of(1, n, E)[0] for n in (5, 12, 1)]
    nested = enc(torch.nested.nested_tensor(seqs), is_causal=True).unbind()
    for s, o in zip(seqs, nested):
        assert torch.equal(o, enc(s[None], is_causal=True)[0])
    # Sinks that fit the first module (4 heads) but not the second (8): nothing is swapped.
    model2 = nn.Sequential(nn.MultiheadAttention(E, H), nn.MultiheadAttention(E, 8))
    with pytest.raises(ValueError, match="sinks"):
        mt.replace_attention(model2, sinks=np.zeros(H, np.float32))
    assert type(model2[0]) is nn.MultiheadAttention and type(model2[1]) is nn.MultiheadAttention


@torch.no_grad()
def test_functional_sdpa_takes_them():
    B, H, Hkv, L, d = 2, 4, 2, 17, 8
    q = torch.from_numpy(RNG.standard_normal((B, H, L, d)).astype(np.float32))
    k = torch.from_numpy(RNG.standard_normal((B, Hkv, L, d)).astype(np.float32))
    v = torch.from_numpy(RNG.standard_normal((B, Hkv, L, d)).astype(np.float32))
    sinks = torch.tensor([0.0, 1.0, -1.0, 0.5])
    kw = dict(window=(4, 0), softcap=2.5, alibi_slopes="standard")
    out = mt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, sinks=sinks, **kw)
    ref = mha.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), is_causal=True, enable_gqa=True,
                                           sinks=sinks.numpy(), **kw)
    assert np.array_equal(out.numpy(), ref)
    plain = mt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert not torch.equal(out, plain)
