"""Packed batches of independent sequences (MultiheadAttention.forward with seq_lens; the C++
forward_varlen): each sequence's rows equal the layer on that sequence alone (bitwise), causal or not, with
RoPE restarting per sequence; the float64 reference; backend="scalar" (the reference on each sequence alone);
refusals as ValueError. mha.torch's nested tensors run
this path for self-attention without weights (MultiheadAttention and TransformerEncoderLayer), bitwise equal
to each sequence alone, float32 and bfloat16; with hooks the encoder calls self_attn once per sequence."""
import numpy as np
import pytest

import mha
from attention_reference import assert_within, mha_reference

torch = pytest.importorskip("torch")
import mha.torch as mt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
RNG = np.random.default_rng(2300)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def weights(E, H, Hkv, d):
    return {"in_proj_weight": rand(H * d + 2 * Hkv * d, E) / np.sqrt(E), "in_proj_bias": rand(H * d + 2 * Hkv * d),
            "out_proj_weight": rand(E, H * d) / np.sqrt(H * d), "out_proj_bias": rand(E)}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope", [None, 10000.0])
def test_packed_sequences_equal_each_alone(causal, rope):
    E, H, Hkv, d = 32, 4, 2, 8
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, rope_theta=rope, **weights(E, H, Hkv, d))
    lens = [7, 1, 0, 40, 16]
    seqs = [rand(n, E) for n in lens]
    x = np.concatenate(seqs)
    for threads in (1, 2):
        y, w = layer(x, seq_lens=lens, is_causal=causal, threads=threads)
        assert w is None and y.shape == x.shape
        at = 0
        for s in seqs:
            if len(s):
                alone, _ = layer(s[None], is_causal=causal)
                np.testing.assert_array_equal(y[at:at + len(s)], alone[0])
            at += len(s)


def test_packed_sequences_agree_with_the_float64_reference():
    E, H = 32, 4
    w = weights(E, H, H, 8)
    layer = mha.MultiheadAttention(E, H, **w)
    seqs = [rand(n, E) for n in (5, 12)]
    y, _ = layer(np.concatenate(seqs), seq_lens=[5, 12])
    at = 0
    for i, s in enumerate(seqs):
        ref, bound, _, _ = mha_reference(s[None], s[None], s[None], w, H)
        assert_within(y[None, at:at + len(s)], ref, bound, f"sequence {i}")
        at += len(s)


@pytest.mark.parametrize("causal", [False, True])
def test_scalar_backend_runs_the_reference_on_each_sequence(causal):
    E, H, Hkv, d = 32, 4, 2, 8
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, rope_theta=10000.0, **weights(E, H, Hkv, d))
    lens = [9, 0, 3, 21]
    seqs = [rand(n, E) for n in lens]
    y, _ = layer(np.concatenate(seqs), seq_lens=lens, is_causal=causal, backend="scalar")
    at = 0
    for s in seqs:
        if len(s):
            alone, _ = layer(s[None], is_causal=causal, backend="scalar")
            np.testing.assert_array_equal(y[at:at + len(s)], alone[0])
        at += len(s)
    with pytest.raises(ValueError, match="backend"):
        layer(np.concatenate(seqs), seq_lens=lens, backend="fast")


def test_packed_refusals():
    E, H = 32, 4
    layer = mha.MultiheadAttention(E, H, **weights(E, H, H, 8))
    x = rand(6, E)
    out = np.full((6, E), 7.0, np.float32)
    with pytest.raises(ValueError, match="T = seq_starts"):
        layer(x, seq_lens=[2, 3], out=out)
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match="takes no cache"):
        layer(x, seq_lens=[6], cache=mha.KVCache(1, H, 8, 8))
    with pytest.raises(ValueError, match="need_weights"):
        layer(x, seq_lens=[6], need_weights=True)
    with pytest.raises(ValueError, match="key must be None"):
        layer(x, x.copy(), seq_lens=[6])
    y, _ = layer(np.zeros((0, E), np.float32), seq_lens=[])
    assert y.shape == (0, E)


def torch_module(E, H, dtype, seed):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_bias.normal_()
    return mt.MultiheadAttention.from_torch(ref.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nested_self_attention_runs_packed_and_equals_each_alone(dtype, monkeypatch):
    E, H = 32, 4
    mod = torch_module(E, H, dtype, 11)
    seqs = [torch.randn(n, E).to(dtype) for n in (3, 17, 1, 9)]
    nt = torch.nested.nested_tensor(seqs)
    packed_calls = []
    real = mt._packed_self_attention
    monkeypatch.setattr(mt, "_packed_self_attention", lambda *a: packed_calls.append(a[3]) or real(*a))
    with torch.no_grad():
        for causal in (False, True):
            out, w = mod(nt, nt, nt, need_weights=False, is_causal=causal)
            assert out.is_nested and w is None and out.dtype == dtype
            for o, s in zip(out.unbind(), seqs):
                alone, _ = mod(s[None], s[None], s[None], need_weights=False, is_causal=causal)
                np.testing.assert_array_equal(o.float().numpy(), alone[0].float().numpy())
    assert packed_calls == [[3, 17, 1, 9]] * 2  # one library call per nested forward


@pytest.mark.parametrize("norm_first", [False, True])
def test_nested_encoder_layer_runs_packed(norm_first, monkeypatch):
    torch.manual_seed(12)
    layer = mt.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    seqs = [torch.randn(n, 16) for n in (4, 11, 2)]
    packed_calls = []
    real = mt._packed_self_attention
    monkeypatch.setattr(mt, "_packed_self_attention", lambda *a: packed_calls.append(a[3]) or real(*a))
    with torch.no_grad():
        out = layer(torch.nested.nested_tensor(seqs))
        assert packed_calls == [[4, 11, 2]]
        for o, s in zip(out.unbind(), seqs):
            np.testing.assert_array_equal(o.numpy(), layer(s[None])[0].numpy())
        # With a hook on self_attn, the encoder calls it once per sequence (the hook sees each call).
        seen = []
        layer.self_attn.register_forward_hook(lambda m, args, o: seen.append(tuple(args[0].shape)))
        packed_calls.clear()
        hooked = layer(torch.nested.nested_tensor(seqs))
        assert sorted(seen) == sorted([(n, 16) for n in (4, 11, 2)]) and packed_calls == []
        for o, p in zip(hooked.unbind(), out.unbind()):
            np.testing.assert_array_equal(o.numpy(), p.numpy())
