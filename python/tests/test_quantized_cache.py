"""8-bit KV caches from Python (issue 23's contract): KVCache and PagedKVCache with dtype "int8", "fp8_e4m3" or
"fp8_e5m2" (k_scale= / v_scale= for fp8); keys() / values() read back the stored values dequantized, within
each format's error of what was appended, the same from both cache classes; a decode step over an 8-bit cache
stays close to the f32 cache's; bad scales are ValueError."""
import numpy as np
import pytest

import mha

RNG = np.random.default_rng(2300)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def within_format(x, y, dtype, scale):
    """|y - x| within the format's bound: int8 half a block's step, fp8 half an ulp of x / scale (times scale)."""
    if dtype == "int8":
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        step = np.abs(blocks).max(axis=-1, keepdims=True).astype(np.float32) / np.float32(127)
        step = step.astype(np.float16).astype(np.float64)
        err = np.abs(y.reshape(blocks.shape).astype(np.float64) - blocks)
        return bool(np.all(err <= step / 2 * (1 + 1e-9) + 1e-30))
    mant, emin = (3, -6) if dtype == "fp8_e4m3" else (2, -14)
    a = np.abs(x.astype(np.float64)) / scale
    e = np.maximum(emin, np.floor(np.log2(np.maximum(a, 1e-300))))
    return bool(np.all(np.abs(y.astype(np.float64) - x) <= np.ldexp(0.5, (e - mant).astype(int)) * scale * (1 + 1e-6) + 1e-7 * np.abs(x)))


@pytest.mark.parametrize("dtype,k_scale,v_scale", [("int8", 1.0, 1.0), ("fp8_e4m3", 0.5, 2.0), ("fp8_e5m2", 1.0, 0.25)])
def test_read_back_dequantized_from_both_caches(dtype, k_scale, v_scale):
    Hkv, d, n = 2, 64, 21
    k, v = rand(Hkv, n, d) * 3, rand(Hkv, n, d)
    kw = {"k_scale": k_scale, "v_scale": v_scale} if dtype != "int8" else {}
    cache = mha.KVCache(1, Hkv, d, n + 4, dtype=dtype, **kw)
    assert cache.dtype == dtype and cache.k_scale == k_scale and cache.v_scale == v_scale
    cache.append(0, k, v)
    keys, values = cache.keys(), cache.values()
    assert keys.dtype == np.float32 and keys.shape == (1, Hkv, n + 4, d)
    assert np.all(keys[0, :, n:] == 0) and np.all(values[0, :, n:] == 0)
    assert within_format(k, keys[0, :, :n], dtype, k_scale)
    assert within_format(v, values[0, :, :n], dtype, v_scale)
    paged = mha.PagedKVCache(4, 16, Hkv, d, dtype=dtype, **kw)
    s = paged.add_sequence()
    paged.append(s, k, v)
    np.testing.assert_array_equal(paged.keys(s), keys[0, :, :n])
    np.testing.assert_array_equal(paged.values(s), values[0, :, :n])


@pytest.mark.parametrize("dtype", ["int8", "fp8_e4m3"])
def test_decode_steps_close_to_the_f32_cache(dtype):
    E, H, Hkv, d = 64, 8, 2, 32
    w = {"in_proj_weight": rand(H * d + 2 * Hkv * d, E) / np.sqrt(E), "in_proj_bias": rand(H * d + 2 * Hkv * d) * 0.1,
         "out_proj_weight": rand(E, H * d) / np.sqrt(H * d), "out_proj_bias": rand(E) * 0.1}
    layer = mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, rope_theta=10000.0, **w)
    x = rand(1, 40, E)
    ref = mha.KVCache(1, Hkv, d, 40)
    q8 = mha.KVCache(1, Hkv, d, 40, dtype=dtype)
    for start, n in ((0, 30), (30, 1), (31, 1), (32, 8)):
        y_ref, _ = layer(x[:, start:start + n], cache=ref)
        y_q8, _ = layer(x[:, start:start + n], cache=q8)
        assert np.max(np.abs(y_q8 - y_ref)) < 0.05 * np.max(np.abs(y_ref)) + 1e-3
    assert q8.length(0) == 40


def test_bad_scales_and_dtypes_are_value_errors():
    with pytest.raises(ValueError, match="k_scale"):
        mha.KVCache(1, 1, 32, 4, dtype="int8", k_scale=0.5)
    with pytest.raises(ValueError, match="v_scale"):
        mha.KVCache(1, 1, 32, 4, dtype="fp8_e4m3", v_scale=0.0)
    with pytest.raises(ValueError, match="k_scale"):
        mha.PagedKVCache(4, 16, 1, 32, dtype="fp8_e5m2", k_scale=float("inf"))
    with pytest.raises(ValueError, match="dtype must be"):
        mha.PagedKVCache(4, 16, 1, 32, dtype="int4")
