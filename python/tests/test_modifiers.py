"""The score-modifier keywords (issue 24) of mha.MultiheadAttention and mha.scaled_dot_product_attention:
window=(left, right), softcap=, sinks=[H], alibi_slopes=[H] or "standard".

Sliding windows and ALiBi are additive masks in float64 (-inf outside the window, -slope_h (p_i - j) inside), so
the library's result is checked against attention_reference.py's float64 evaluation with that mask, within its
derived bound. Softcap and sinks are checked against the model formulas' fixtures (tests/data/modifiers, written
by tools/make_fixtures.py from Gemma 2's and gpt-oss's code): the first-order radius of the scores is not larger
after c tanh(s / c) (slope <= 1; the tanh adds 2 ulp, the product by 1/c and by c 3u) and a sink only adds a positive
term to each denominator, so the unmodified problem's radius, with those 5u per score, bounds them."""
import json
import os

import numpy as np
import pytest

import mha
from attention_reference import U32, assert_within, mha_reference, sdpa_reference

RNG = np.random.default_rng(2024)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "modifiers")


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def window_alibi_mask(Lq, Lk, H, left, right, causal, bottom_right, slopes):
    """[1, H, Lq, Lk] additive float64 mask: the window, causal rule and ALiBi of the library's documentation."""
    p = np.arange(Lq)[:, None] + (Lk - Lq if bottom_right else 0)
    j = np.arange(Lk)[None, :]
    hide = np.zeros((Lq, Lk), bool)
    if causal:
        hide |= j > p
    if left >= 0:
        hide |= j < p - left
    if right >= 0:
        hide |= j > p + right
    m = np.zeros((1, H, Lq, Lk))
    if slopes is not None:
        m = m - np.asarray(slopes, np.float64)[None, :, None, None] * (p - j)[None, None]
    return np.where(hide[None, None], -np.inf, m)


@pytest.mark.parametrize("left,right,causal,bottom_right,alibi", [
    (7, None, True, False, None),          # Mistral: sliding_window 8
    (0, 0, False, False, None),            # only itself
    (3, 5, False, False, "standard"),      # FlashAttention's window_size with ALiBi
    (20, None, True, True, "array"),       # bottom-right (new tokens at the end), custom slopes
    (None, None, True, False, "standard"),  # BLOOM
])
def test_sdpa_window_and_alibi_vs_reference(left, right, causal, bottom_right, alibi):
    B, H, Hkv, Lq, Lk, d = 2, 4, 2, 33, 33 if not bottom_right else 300, 16
    q, k, v = rand(B, H, Lq, d), rand(B, Hkv, Lk, d), rand(B, Hkv, Lk, d)
    slopes = None
    if alibi == "standard":
        slopes = mha.alibi_standard_slopes(H)
    elif alibi == "array":
        slopes = (RNG.random(H) * 0.3).astype(np.float32)
    kw = dict(window=(left, right), alibi_slopes=alibi if alibi == "standard" else slopes)
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True,
                                           causal_alignment="bottom_right" if bottom_right else "top_left", **kw)
    mask = window_alibi_mask(Lq, Lk, H, -1 if left is None else left, -1 if right is None else right, causal, bottom_right,
                             slopes)
    ref, bound, _ = sdpa_reference(q, np.repeat(k, H // Hkv, 1), np.repeat(v, H // Hkv, 1), mask=mask)
    # ALiBi's float product and sum: 2u |alibi| per score, through the softmax at most 2 (4u |alibi|) max |v - c|.
    extra = 0.0 if slopes is None else 8 * U32 * float(np.max(np.abs(np.where(np.isfinite(mask), mask, 0)))) * 2 * np.abs(v).max()
    assert_within(out, ref, bound + extra, "sdpa window/alibi")


def fixture_cases():
    return sorted(c for c in os.listdir(DATA) if os.path.exists(os.path.join(DATA, c, "args.json")))


@pytest.mark.parametrize("case", fixture_cases())
def test_sdpa_model_formula_fixtures(case):
    folder = os.path.join(DATA, case)
    a = json.load(open(os.path.join(folder, "args.json")))
    q, k, v = (np.load(os.path.join(folder, f + ".npy")) for f in ("q", "k", "v"))
    expected = np.load(os.path.join(folder, "expected_output.npy"))
    H, Hkv, Lq, Lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    sinks = np.load(os.path.join(folder, "sinks.npy")) if os.path.exists(os.path.join(folder, "sinks.npy")) else None
    slopes = (np.load(os.path.join(folder, "alibi_slopes.npy")) if os.path.exists(os.path.join(folder, "alibi_slopes.npy"))
              else "standard" if a["alibi"] else None)
    bottom_right = a["causal_bottom_right"]
    out = mha.scaled_dot_product_attention(
        q, k, v, is_causal=a["causal"] or bottom_right, enable_gqa=True,
        causal_alignment="bottom_right" if bottom_right else "top_left",
        window=(a["window_left"], a["window_right"]), softcap=a["softcap"], sinks=sinks, alibi_slopes=slopes)
    sl = None if slopes is None else (mha.alibi_standard_slopes(H) if isinstance(slopes, str) else slopes)
    mask = window_alibi_mask(Lq, Lk, H, a["window_left"], a["window_right"], a["causal"] or bottom_right, bottom_right, sl)
    # The unmodified problem's radius (softcap and sinks do not enlarge it, see the top), plus 5u per score.
    _, bound, P = sdpa_reference(q, np.repeat(k, H // Hkv, 1), np.repeat(v, H // Hkv, 1), mask=mask)
    scores = np.abs(np.einsum("bhid,bhjd->bhij", q.astype(np.float64), np.repeat(k, H // Hkv, 1).astype(np.float64))) / np.sqrt(q.shape[3])
    extra = 5 * U32 * np.einsum("bhij,bhij->bhi", P, scores)[..., None] * 2 * np.abs(v).max()
    if sl is not None:
        extra = extra + 8 * U32 * float(np.max(np.abs(np.where(np.isfinite(mask), mask, 0)))) * 2 * np.abs(v).max()
    assert_within(out, expected, bound + extra, case)


def test_layer_keywords_reach_every_forward():
    """window and alibi_slopes on the layer (a mask in float64): its causal forward, and the same tokens one at a
    time through a KV cache, against mha_reference with that mask."""
    E, H, Hkv, d, L = 32, 4, 2, 8, 12
    w = {"q_proj_weight": rand(H * d, E) / np.sqrt(E), "k_proj_weight": rand(Hkv * d, E) / np.sqrt(E),
         "v_proj_weight": rand(Hkv * d, E) / np.sqrt(E), "out_proj_weight": rand(E, H * d) / np.sqrt(H * d)}
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, window=(3, None), alibi_slopes="standard", **w)
    x = rand(1, L, E)
    mask = window_alibi_mask(L, L, H, 3, -1, True, False, mha.alibi_standard_slopes(H))
    ref, bound, _, _ = mha_reference(x, x, x, w, H, Hkv, d, mask=mask)
    extra = 8 * U32 * float(np.max(np.abs(np.where(np.isfinite(mask), mask, 0)))) * np.abs(ref).max()
    y, _ = layer(x, is_causal=True)
    assert_within(y, ref, bound + extra, "layer")
    cache = mha.KVCache(1, Hkv, d, L)
    steps = np.concatenate([layer(x[:, t:t + 1], cache=cache)[0] for t in range(L)], axis=1)
    assert_within(steps, ref, bound + extra, "layer through a KV cache")


def test_sinks_change_the_layer_and_all_masked_rows_give_zeros():
    E, H = 16, 2
    layer_sinks = mha.MultiheadAttention(E, H, seed=3, sinks=np.array([0.5, -1.0], np.float32))
    x = rand(1, 5, E)
    kpm = np.ones((1, 5), bool)  # every key masked: zero probabilities, the output is the output bias (zeros here)
    y, w = layer_sinks(x, key_padding_mask=kpm, need_weights=True)
    assert np.all(w == 0) and np.all(y == 0)
    y, w = layer_sinks(x, need_weights=True, average_attn_weights=False)
    s = w.sum(-1)
    assert np.all(s < 1) and np.all(s > 0)  # the sink takes a share of every row


def test_window_sides_of_any_length_are_unbounded():
    q = rand(1, 4, 6, 8)
    plain = mha.scaled_dot_product_attention(q, q, q)
    for side in [2**63 - 1, 2**63 - 6]:
        for window in [(side, -1), (-1, side), (side, side)]:
            np.testing.assert_array_equal(mha.scaled_dot_product_attention(q, q, q, window=window), plain)


@pytest.mark.parametrize("window", [(1.5, 0), ("a", 0), (0, "1"), (True, 3), (2, False)])
def test_window_sides_must_be_ints(window):
    with pytest.raises(TypeError, match="window (left|right) must be an int"):
        mha.MultiheadAttention(32, 4, seed=0, window=window)


@pytest.mark.parametrize("kw,message", [
    (dict(window=(3,)), "window must be a pair"),
    (dict(window=(-2, 0)), "window left must be >= -1"),
    (dict(softcap=0.0), "softcap must be a positive finite number"),
    (dict(softcap=float("nan")), "softcap must be a positive finite number"),
    (dict(softcap=1e-40), "below the smallest normal float"),
    (dict(window=(2**64, 0)), "window left is out of range"),
    (dict(sinks=np.zeros(3, np.float32)), r"sinks must have shape \[4\]"),
    (dict(sinks=np.array([0, np.nan, 0, 0], np.float32)), "sinks"),
    (dict(alibi_slopes="bloom"), "alibi_slopes must be an array"),
    (dict(alibi_slopes=np.zeros(5, np.float32)), r"alibi_slopes must have shape \[4\]"),
])
def test_bad_keywords_raise(kw, message):
    with pytest.raises(ValueError, match=message):
        mha.MultiheadAttention(32, 4, seed=0, **kw)
    q = rand(1, 4, 3, 8)
    out = np.full((1, 4, 3, 8), 7.0, np.float32)
    with pytest.raises(ValueError, match=message):
        mha.scaled_dot_product_attention(q, q, q, out=out, **kw)
    assert np.all(out == 7.0)


def test_alibi_standard_slopes():
    s = mha.alibi_standard_slopes(12)
    assert s.dtype == np.float32 and s.shape == (12,)
    assert s[0] == 0.5 and s[7] == 2.0 ** -8 and s[8] == np.float32(2.0 ** -0.5)


def test_paged_release_before_keeps_window_memory():
    """A windowed layer generating through a PagedKVCache: releasing the blocks before each new token's window
    after every step changes no output bit and keeps the blocks in use bounded by the window."""
    E, H, Hkv, d, left = 32, 4, 2, 8, 15
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, seed=5, rope_theta=10000.0, window=(left, 0))
    x = rand(100, E)
    kept, freed = mha.PagedKVCache(16, 16, Hkv, d), mha.PagedKVCache(16, 16, Hkv, d)
    a, b = kept.add_sequence(), freed.add_sequence()
    t, most = 0, 0
    while t < 100:
        q = 20 if t == 0 else 1
        ya, _ = layer(x[t:t + q], cache=kept, seq_ids=[a], q_lens=[q])
        yb, _ = layer(x[t:t + q], cache=freed, seq_ids=[b], q_lens=[q])
        assert np.array_equal(ya, yb)
        t += q
        assert freed.release_before(b, t - left) == (t - left) // 16 * 16
        most = max(most, freed.num_blocks - freed.free_blocks)
    assert kept.num_blocks - kept.free_blocks == 7 and most <= 3
    keys = freed.keys(b)
    assert np.isnan(keys[:, :freed.released_tokens(b)]).all()
    plain = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, seed=5, rope_theta=10000.0)
    with pytest.raises(ValueError, match="released"):
        plain(x[:1], cache=freed, seq_ids=[b], q_lens=[1])
    assert freed.length(b) == 100


def _bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_16_bit_activations_take_the_modifiers(kind, need_weights):
    """The 16-bit-activation forward (widened exactly, the float32 forward, the output rounded once) with all four
    modifiers is the float32 forward of the widened inputs, rounded, bitwise; and the modifiers act."""
    E, H, L = 32, 4, 40
    kw = dict(window=(9, 0), softcap=4.0, sinks=np.array([0.3, -0.2, 1.0, 0.0], np.float32), alibi_slopes="standard")
    layer = mha.MultiheadAttention(E, H, seed=11, **kw)
    plain = mha.MultiheadAttention(E, H, seed=11)
    x32 = rand(2, L, E)
    if kind == "f16":
        x16 = x32.astype(np.float16)
        wide, narrow = x16.astype(np.float32), lambda y: y.astype(np.float16)
    else:
        x16 = _bf16_bits(x32)
        wide, narrow = (x16.astype(np.uint32) << 16).view(np.float32), _bf16_bits
    out16, w16 = layer(x16, is_causal=True, need_weights=need_weights)
    ref, ref_w = layer(wide, is_causal=True, need_weights=need_weights)
    np.testing.assert_array_equal(out16, narrow(ref))
    if need_weights:
        np.testing.assert_array_equal(w16, ref_w)
        row = w16[:, 20]  # query 20 sees keys 11 .. 20
        assert np.all(row[:, :11] == 0) and np.all(row[:, 21:] == 0) and np.all(row[:, 11:21] > 0)
    assert not np.array_equal(out16, plain(x16, is_causal=True)[0])
