"""mha's numpy API (mha.MultiheadAttention, mha.scaled_dot_product_attention, mha.KVCache) against the float64
reference of attention_reference.py within its derived float32 error bound; layouts read without copies; bad
input raising ValueError / TypeError with the library's message and writing nothing; Python threads."""
import platform
import threading

import numpy as np
import pytest

import mha
from attention_reference import additive, assert_within, mha_reference, rope_half, sdpa_reference, UBF16

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def layer_and_weights(E, H, Hkv=0, d=0, kdim=0, vdim=0, **kw):
    hd = d or E // H
    hkv = Hkv or H
    w = {"out_proj_weight": rand(E, H * hd) / np.sqrt(H * hd), "out_proj_bias": rand(E)}
    if kdim or vdim:
        w.update(q_proj_weight=rand(H * hd, E) / np.sqrt(E), k_proj_weight=rand(hkv * hd, kdim or E) / np.sqrt(kdim or E),
                 v_proj_weight=rand(hkv * hd, vdim or E) / np.sqrt(vdim or E))
    else:
        w["in_proj_weight"] = rand(H * hd + 2 * hkv * hd, E) / np.sqrt(E)
    w["in_proj_bias"] = rand(H * hd + 2 * hkv * hd)
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, kdim=kdim, vdim=vdim, **w, **kw)
    return layer, w


def test_import_and_repr():
    layer = mha.MultiheadAttention(32, 4, seed=0)
    assert layer.embed_dim == 32 and layer.num_heads == 4 and layer.head_dim == 8
    assert "MultiheadAttention" in repr(layer)
    # This build's family: x86-64 or AArch64 (the extension is cross-built and tested under qemu there).
    arm = platform.machine() in ("aarch64", "arm64")
    family = ("neon", "neon_bf16") if arm else ("sse2", "avx2", "avx512", "avx512_bf16")
    assert mha.detected_isa() in family


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "kpm_bool", "kpm_float", "attn2_bool", "attn3_float"])
def test_self_attention_vs_reference(causal, mask):
    B, L, E, H = 2, 7, 32, 4
    layer, w = layer_and_weights(E, H)
    x = rand(B, L, E)
    kpm = am = None
    ref_mask = np.zeros((B, H, L, L))
    if mask == "kpm_bool":
        kpm = np.zeros((B, L), bool)
        kpm[0, -2:] = True
        ref_mask = ref_mask + additive(kpm)[:, None, None, :]
    elif mask == "kpm_float":
        kpm = rand(B, L)
        ref_mask = ref_mask + kpm.astype(np.float64)[:, None, None, :]
    elif mask == "attn2_bool":
        am = RNG.random((L, L)) < 0.3
        np.fill_diagonal(am, False)
        ref_mask = ref_mask + additive(am)
    elif mask == "attn3_float":
        am = rand(B * H, L, L)
        ref_mask = ref_mask + am.astype(np.float64).reshape(B, H, L, L)
    if causal:
        ref_mask = ref_mask + np.triu(np.full((L, L), -np.inf), 1)
    out, weights = layer(x, key_padding_mask=kpm, attn_mask=am, is_causal=causal, need_weights=True,
                         average_attn_weights=False)
    ref, bound, p, ep = mha_reference(x, x, x, w, H, mask=ref_mask)
    assert_within(out, ref, bound, "output")
    assert_within(weights, p, ep, "per-head weights")


@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_kdim_vdim_layouts(batch_first):
    B, Lq, Lk, E, H = 3, 5, 9, 24, 3
    layer, w = layer_and_weights(E, H, kdim=10, vdim=14)
    q, k, v = rand(B, Lq, E), rand(B, Lk, 10), rand(B, Lk, 14)
    ref, bound, p, ep = mha_reference(q, k, v, w, H)
    if batch_first:
        out, weights = layer(q, k, v, need_weights=True)
    else:
        # [L, B, E] views of the same data: no copy, the strides say where the rows are.
        before = mha.input_copies()
        out, weights = layer(q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2), need_weights=True,
                             batch_first=False)
        assert mha.input_copies() == before
        out = out.transpose(1, 0, 2)
    assert_within(out, ref, bound, "output")
    assert_within(weights, p.mean(1), np.sqrt((ep * ep).sum(1)) / H, "averaged weights")


def test_gqa_head_dim_rope_vs_reference():
    B, L, E, H, Hkv, d, theta, start = 2, 6, 48, 8, 2, 8, 10000.0, 5
    layer, w = layer_and_weights(E, H, Hkv, d, rope_theta=theta)
    x = rand(B, L, E)
    out, _ = layer(x, is_causal=True, position_offset=start)
    pos = np.arange(start, start + L)
    ref, bound, _, _ = mha_reference(x, x, x, w, H, Hkv, d, mask=np.triu(np.full((L, L), -np.inf), 1),
                                     rope_theta=theta, positions_q=pos, positions_k=pos)
    assert_within(out, ref, bound, "output")


def test_bf16_compute_within_bf16_bound():
    B, L, E, H = 2, 8, 32, 4
    layer, w = layer_and_weights(E, H, compute="bf16")
    x = rand(B, L, E)
    out, _ = layer(x)
    ref, bound, _, _ = mha_reference(x, x, x, w, H, ub=UBF16)
    assert_within(out, ref, bound, "bf16 output")


def test_unbatched_and_no_copy_for_strided_views():
    E, H = 16, 2
    layer, w = layer_and_weights(E, H)
    big = rand(4, 10, 2 * E)
    x = big[1:3, ::2, :E]  # strided in every axis but the last: read in place
    before = mha.input_copies()
    out, _ = layer(x)
    assert mha.input_copies() == before
    ref, bound, _, _ = mha_reference(x, x, x, w, H)
    assert_within(out, ref, bound, "strided")
    out1, _ = layer(np.ascontiguousarray(x[0]))  # unbatched [L, E]
    assert out1.shape == (5, E)
    assert_within(out1, ref[0], bound[0], "unbatched")


def test_fortran_order_is_copied_once_and_right():
    E, H = 16, 2
    layer, w = layer_and_weights(E, H)
    x = np.asfortranarray(rand(2, 5, E))
    before = mha.input_copies()
    out, _ = layer(x)
    assert mha.input_copies() == before + 1
    ref, bound, _, _ = mha_reference(x, x, x, w, H)
    assert_within(out, ref, bound, "F-order")


def test_broadcast_inputs_are_copied_and_right():
    """Zero strides (np.broadcast_to, torch's expand) over the batch, the sequence or only key / value: each such
    input is copied once (a zero stride never reaches the library, whose views take it for a size-1 axis)."""
    E, H = 16, 2
    layer, w = layer_and_weights(E, H)
    for x, kv in [(np.broadcast_to(rand(1, 5, E), (3, 5, E)), None), (np.broadcast_to(rand(3, 1, E), (3, 5, E)), None),
                  (rand(3, 4, E), np.broadcast_to(rand(1, 6, E), (3, 6, E)))]:
        k = x if kv is None else kv
        before = mha.input_copies()
        out, _ = layer(x) if kv is None else layer(x, kv, kv)
        assert mha.input_copies() == before + 1  # key is value: one copy serves both
        ref, bound, _, _ = mha_reference(np.ascontiguousarray(x), np.ascontiguousarray(k), np.ascontiguousarray(k), w, H)
        assert_within(out, ref, bound, "broadcast")
    out = np.broadcast_to(np.zeros((1, 5, E), np.float32), (2, 5, E))
    with pytest.raises(ValueError):  # read-only, and two batches on the same memory
        layer(rand(2, 5, E), out=out)


def test_out_parameter_written_in_place():
    layer, _ = layer_and_weights(16, 2)
    x = rand(2, 3, 16)
    out = np.empty((2, 3, 16), np.float32)
    res, _ = layer(x, out=out)
    assert res is out
    np.testing.assert_array_equal(out, layer(x)[0])


def sentinel(shape):
    return np.full(shape, 7.0, np.float32)


@pytest.mark.parametrize("case, exc, message", [
    (lambda L, x: L(x.astype(np.float64)), TypeError,
     "query must be float32 (or float16, or uint16 holding bfloat16 bits), got float64"),
    (lambda L, x: L(x.tolist()), TypeError, "query must be a numpy.ndarray, got list"),
    (lambda L, x: L(x[None]), ValueError, "query must have 2 or 3 dimensions, got 4"),
    (lambda L, x: L(x[..., :8]), ValueError, "8"),  # wrong embedding size: the library names the sizes
    (lambda L, x: L(x, rand(2, 4, 16)[:1]), ValueError, "batch"),
    (lambda L, x: L(x, key_padding_mask=np.zeros((2, 4), bool)), ValueError, "key_padding_mask"),
    (lambda L, x: L(x, key_padding_mask=np.zeros((2, 3), np.int64)), TypeError,
     "key_padding_mask must be bool, uint8 or floating (float16, float32, float64), got int64"),
    (lambda L, x: L(x, attn_mask=np.zeros((3, 4), bool)), ValueError, "attn_mask"),
    (lambda L, x: L(x, threads=-1), ValueError, "threads must be >= 0"),
    (lambda L, x: L(x, impl="fast"), ValueError, "impl must be"),
])
def test_bad_input_raises_with_message_and_writes_nothing(case, exc, message):
    layer, _ = layer_and_weights(16, 2)
    x = rand(2, 3, 16)
    out = sentinel((2, 3, 16))

    def call(L, *args, **kw):
        return L.forward(*args, out=out, **kw)

    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        case(lambda *a, **k: call(layer, *a, **k), x)
    np.testing.assert_array_equal(out, sentinel((2, 3, 16)))


def test_bad_out_arrays():
    layer, _ = layer_and_weights(16, 2)
    x = rand(2, 3, 16)
    with pytest.raises(ValueError, match=r"out has shape \(2, 3, 8\), expected \(2, 3, 16\)"):
        layer(x, out=np.empty((2, 3, 8), np.float32))
    with pytest.raises(TypeError, match="out must be float32"):
        layer(x, out=np.empty((2, 3, 16)))
    with pytest.raises(ValueError, match="contiguous last axis"):
        layer(x, out=np.empty((2, 3, 32), np.float32)[..., ::2])
    ro = np.empty((2, 3, 16), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        layer(x, out=ro)


def test_bad_weights_and_config():
    with pytest.raises(ValueError, match=r"in_proj_weight has shape \(47, 16\), expected \(48, 16\)"):
        mha.MultiheadAttention(16, 2, in_proj_weight=rand(47, 16), out_proj_weight=rand(16, 16))
    with pytest.raises(ValueError, match="not divisible"):
        mha.MultiheadAttention(16, 3)
    with pytest.raises(ValueError, match="num_kv_heads|kv"):
        mha.MultiheadAttention(16, 4, num_kv_heads=3, head_dim=4)
    with pytest.raises(ValueError, match="compute must be 'f32' or 'bf16'"):
        mha.MultiheadAttention(16, 2, compute="f16")
    with pytest.raises(TypeError, match="unknown weight 'in_proj_weights'"):
        mha.MultiheadAttention(16, 2, in_proj_weights=rand(48, 16), out_proj_weight=rand(16, 16))


def test_four_python_threads_on_one_layer():
    layer, w = layer_and_weights(64, 4)
    inputs = [rand(2, 33, 64) for _ in range(4)]
    expected = [layer(x)[0] for x in inputs]
    results = [None] * 4
    errors = []

    def work(i):
        try:
            for _ in range(20):
                out, _ = layer(inputs[i])
                if not np.array_equal(out, expected[i]):
                    raise AssertionError(f"thread {i}: wrong result")
            results[i] = True
        except Exception as e:  # reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(results)


# ---- scaled_dot_product_attention (numpy) --------------------------------------------------------------------
@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 2), (6, 1)])
def test_sdpa_gqa_vs_reference(H, Hkv):
    B, Lq, Lk, d = 2, 5, 9, 16
    q, k, v = rand(B, H, Lq, d), rand(B, Hkv, Lk, d), rand(B, Hkv, Lk, d)
    out = mha.scaled_dot_product_attention(q, k, v, enable_gqa=Hkv != H)
    G = H // Hkv
    ref, bound, _ = sdpa_reference(q, np.repeat(k, G, 1), np.repeat(v, G, 1))
    assert_within(out, ref, bound, "sdpa")


def test_sdpa_needs_enable_gqa():
    q, k = rand(1, 4, 3, 8), rand(1, 2, 3, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        mha.scaled_dot_product_attention(q, k, k)


@pytest.mark.parametrize("mask_shape", ["LqLk", "B11Lk", "BHLqLk", "1HLqLk", "B1LqLk"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_masks_follow_torch_convention(mask_shape, kind):
    B, H, Lq, Lk, d = 2, 3, 4, 6, 8
    q, k, v = rand(B, H, Lq, d), rand(B, H, Lk, d), rand(B, H, Lk, d)
    shape = {"LqLk": (Lq, Lk), "B11Lk": (B, 1, 1, Lk), "BHLqLk": (B, H, Lq, Lk), "1HLqLk": (1, H, Lq, Lk),
             "B1LqLk": (B, 1, Lq, Lk)}[mask_shape]
    if kind == "bool":
        m = RNG.random(shape) < 0.6  # True = may attend (PyTorch's SDPA convention)
        m[..., 0] = True
        add = np.where(m, 0.0, -np.inf)
    else:
        m = rand(*shape)
        add = m.astype(np.float64)
    out = mha.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)
    ref, bound, _ = sdpa_reference(q, k, v, scale=0.3, mask=add)
    assert_within(out, ref, bound, "sdpa mask")


def test_sdpa_causal_unbatched_and_blhd_views():
    B, H, L, d = 2, 4, 7, 8
    blhd = rand(B, L, H, d)  # [B, L, H, d] seen as [B, H, L, d]: no copy
    q = blhd.transpose(0, 2, 1, 3)
    before = mha.input_copies()
    out = mha.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert mha.input_copies() == before
    ref, bound, _ = sdpa_reference(q, q, q, mask=np.triu(np.full((L, L), -np.inf), 1))
    assert_within(out, ref, bound, "causal")
    out0 = mha.scaled_dot_product_attention(q[0], q[0], q[0], is_causal=True)
    assert out0.shape == (H, L, d)
    assert_within(out0, ref[0], bound[0], "unbatched")
    # PyTorch's positions: (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    np.testing.assert_array_equal(mha.scaled_dot_product_attention(q, q, q, None, 0.0, True), out)
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        mha.scaled_dot_product_attention(q, q, q, None, 0.1, True)


# ---- KVCache ------------------------------------------------------------------------------------------------
def test_kv_cache_token_by_token_equals_one_causal_call():
    B, L, E, H, Hkv, d = 2, 6, 32, 4, 2, 8
    layer, w = layer_and_weights(E, H, Hkv, d, rope_theta=10000.0)
    x = rand(B, L, E)
    cache = mha.KVCache(B, Hkv, d, L)
    steps = [layer(x[:, i:i + 1], cache=cache)[0] for i in range(L)]
    assert cache.lengths == [L, L]
    pos = np.arange(L)
    ref, bound, _, _ = mha_reference(x, x, x, w, H, Hkv, d, mask=np.triu(np.full((L, L), -np.inf), 1),
                                     rope_theta=10000.0, positions_q=pos, positions_k=pos)
    assert_within(np.concatenate(steps, 1), ref, bound, "decode")
    keys = cache.keys()
    assert keys.shape == (B, Hkv, L, d) and not keys.flags.writeable
    with pytest.raises(ValueError, match="capacity"):
        layer(x[:, :1], cache=cache)
    assert cache.lengths == [L, L]  # nothing written
    cache.truncate(0, 2)
    cache.reset(1)
    assert cache.lengths == [2, 0]
    cache.append(1, rand(Hkv, 3, d), rand(Hkv, 3, d))
    assert cache.length(1) == 3


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_kv_cache_half_element_types_hold_the_rounded_keys(dtype):
    # The cached K and V are the f32 cache's values rounded to the element type (nearest even): the K and V
    # rows of a token depend only on its projection, so the two caches must agree exactly after rounding.
    B, L, E, H, Hkv, d = 2, 5, 32, 4, 2, 8
    layer, _ = layer_and_weights(E, H, Hkv, d, rope_theta=10000.0)
    x = rand(B, L, E)
    c32, c16 = mha.KVCache(B, Hkv, d, L), mha.KVCache(B, Hkv, d, L, dtype=dtype)
    assert c16.dtype == dtype and c16.nbytes * 2 == c32.nbytes
    for i in range(L):
        layer(x[:, i:i + 1], cache=c32)
        layer(x[:, i:i + 1], cache=c16)
    for view16, view32 in ((c16.keys(), c32.keys()), (c16.values(), c32.values())):
        if dtype == "f16":
            assert view16.dtype == np.float16
            np.testing.assert_array_equal(view16, view32.astype(np.float16))
        else:  # uint16 bfloat16 bits: round the float32 bits to nearest even by hand
            assert view16.dtype == np.uint16
            bits = view32.view(np.uint32).astype(np.uint64)
            want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            np.testing.assert_array_equal(view16, want)
    with pytest.raises(ValueError, match="dtype must be 'f32', 'bf16', 'f16', 'int8', 'fp8_e4m3' or 'fp8_e5m2'"):
        mha.KVCache(1, 1, 8, 4, dtype="fp8")


def test_import_mha_does_not_import_torch():
    import os
    import shlex
    import subprocess
    import sys
    code = "import sys, mha; assert 'torch' not in sys.modules; print(mha.detected_isa())"
    # Under emulation (tools/arm64_emulated.sh) the interpreter is a foreign binary: MHA_TEST_EMULATOR is
    # the command line that runs it.
    emulator = shlex.split(os.environ.get("MHA_TEST_EMULATOR", ""))
    subprocess.run(emulator + [sys.executable, "-c", code], check=True, capture_output=True)


def test_rope_positions_per_sequence():
    layer, w = layer_and_weights(32, 4, rope_theta=10000.0)
    x = rand(2, 5, 32)
    out, _ = layer(x, positions=[0, 3], is_causal=True)
    for b, start in enumerate((0, 3)):
        pos = np.arange(start, start + 5)
        ref, r, _, _ = mha_reference(x[b:b + 1], x[b:b + 1], x[b:b + 1], w, 4, mask=np.triu(np.full((5, 5), -np.inf), 1),
                                     rope_theta=10000.0, positions_q=pos, positions_k=pos)
        assert_within(out[b:b + 1], ref, r, f"sequence {b}")
    with pytest.raises(ValueError, match="positions has 1 entries, expected the batch size 2"):
        layer(x, positions=[1])


def to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (finite values)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_16_bit_activations_equal_the_widened_float32_forward(kind, batch_first):
    """The library widens 16-bit inputs exactly, runs the float32 forward and rounds the output once: the result
    is the float32 forward of the widened inputs, rounded (bitwise)."""
    layer, _ = layer_and_weights(32, 4)
    x32 = rand(2, 6, 32) if batch_first else rand(6, 2, 32)
    kpm = np.zeros((2, 6), bool)
    kpm[1, -1] = True
    if kind == "f16":
        x16 = x32.astype(np.float16)
        wide = x16.astype(np.float32)
        out16, w = layer(x16, key_padding_mask=kpm, batch_first=batch_first, need_weights=True)
        assert out16.dtype == np.float16
        ref, ref_w = layer(wide, key_padding_mask=kpm, batch_first=batch_first, need_weights=True)
        np.testing.assert_array_equal(out16, ref.astype(np.float16))
    else:
        x16 = to_bf16_bits(x32)
        wide = from_bf16_bits(x16)
        out16, w = layer(x16, key_padding_mask=kpm, batch_first=batch_first, need_weights=True)
        assert out16.dtype == np.uint16
        ref, ref_w = layer(wide, key_padding_mask=kpm, batch_first=batch_first, need_weights=True)
        np.testing.assert_array_equal(out16, to_bf16_bits(ref))
    np.testing.assert_array_equal(w, ref_w)  # attention weights stay float32
    with pytest.raises(TypeError, match="key must be"):
        layer(x16, x32, x32, batch_first=batch_first)
