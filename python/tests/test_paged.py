"""mha.PagedKVCache and variable-length steps through the layer (the Python contract of issue 22): a step mixing
prefill chunks and decodes equals each sequence alone (bitwise) and the float64 reference of each sequence
from its own tokens; fork / truncate / free and the block accounting; errors as ValueError, nothing changed."""
import numpy as np
import pytest

import mha
from attention_reference import assert_within, mha_reference

RNG = np.random.default_rng(2200)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def make_layer(E=32, H=4, Hkv=2, d=8):
    w = {"in_proj_weight": rand(H * d + 2 * Hkv * d, E) / np.sqrt(E), "in_proj_bias": rand(H * d + 2 * Hkv * d),
         "out_proj_weight": rand(E, H * d) / np.sqrt(H * d), "out_proj_bias": rand(E)}
    return mha.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=d, rope_theta=10000.0, **w), w


def causal_reference(x, w, H, Hkv, d):
    L = x.shape[0]
    pos = np.arange(L)
    return mha_reference(x[None], x[None], x[None], w, H, Hkv, d, mask=np.triu(np.full((L, L), -np.inf), 1),
                         rope_theta=10000.0, positions_q=pos, positions_k=pos)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "int8", "fp8_e4m3", "fp8_e5m2"])
def test_mixed_steps_equal_each_sequence_alone(block_size, dtype):
    E, H, Hkv, d = 32, 4, 2, 8
    layer, w = make_layer(E, H, Hkv, d)
    tokens = [rand(n, E) for n in (23, 42, 10)]
    steps = [[(0, 20), (1, 40)], [(0, 1), (1, 1), (2, 9)], [(2, 1), (0, 2), (1, 1)]]
    cache = mha.PagedKVCache(32, block_size, Hkv, d, dtype=dtype)
    ids = [cache.add_sequence() for _ in tokens]
    alone = [mha.KVCache(1, Hkv, d, len(t), dtype=dtype) for t in tokens]
    at = [0, 0, 0]
    for step in steps:
        x = np.concatenate([tokens[s][at[s]:at[s] + q] for s, q in step])
        y, weights = layer(x, cache=cache, seq_ids=[ids[s] for s, _ in step], q_lens=[q for _, q in step])
        assert weights is None and y.shape == x.shape and y.dtype == np.float32
        row = 0
        for s, q in step:
            want, _ = layer(tokens[s][None, at[s]:at[s] + q], cache=alone[s])
            np.testing.assert_array_equal(y[row:row + q], want[0])
            row += q
            at[s] += q
    for s, t in enumerate(tokens):
        assert cache.length(ids[s]) == len(t)
        assert cache.keys(ids[s]).shape == (Hkv, len(t), d) and cache.keys(ids[s]).dtype == np.float32
        np.testing.assert_array_equal(cache.keys(ids[s]), mha_cache_rows(alone[s], True, len(t)))
        np.testing.assert_array_equal(cache.values(ids[s]), mha_cache_rows(alone[s], False, len(t)))
    used = sum(-(-len(t) // block_size) for t in tokens)
    assert cache.free_blocks == cache.num_blocks - used and cache.block_size == block_size and cache.num_blocks == 32


def mha_cache_rows(kv, keys, n):
    a = (kv.keys() if keys else kv.values())[0, :, :n]
    if kv.dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def test_steps_agree_with_the_float64_reference():
    E, H, Hkv, d = 32, 4, 2, 8
    layer, w = make_layer(E, H, Hkv, d)
    tokens = [rand(17, E), rand(5, E)]
    cache = mha.PagedKVCache(8, 16, Hkv, d)
    a, b = cache.add_sequence(), cache.add_sequence()
    y1, _ = layer(np.concatenate([tokens[0][:16], tokens[1][:4]]), cache=cache, seq_ids=[a, b], q_lens=[16, 4])
    y2, _ = layer(np.concatenate([tokens[1][4:], tokens[0][16:]]), cache=cache, seq_ids=[b, a], q_lens=[1, 1])
    got = [np.concatenate([y1[:16], y2[1:]]), np.concatenate([y1[16:], y2[:1]])]
    for s in range(2):
        ref, bound, _, _ = causal_reference(tokens[s], w, H, Hkv, d)
        assert_within(got[s][None], ref, bound, f"sequence {s}")


def test_fork_truncate_free_and_append():
    E, H, Hkv, d = 32, 4, 2, 8
    layer, _ = make_layer(E, H, Hkv, d)
    cache = mha.PagedKVCache(6, 16, Hkv, d)
    s = cache.add_sequence()
    layer(rand(20, E), cache=cache, seq_ids=[s], q_lens=[20])
    assert cache.free_blocks == 4
    t = cache.fork(s)
    assert cache.length(t) == 20 and cache.free_blocks == 4
    keys_s = cache.keys(s)
    layer(rand(2, E), cache=cache, seq_ids=[t, s], q_lens=[1, 1])  # both copy the shared second block
    assert cache.free_blocks == 3
    np.testing.assert_array_equal(cache.keys(s)[:, :20], keys_s)
    np.testing.assert_array_equal(cache.keys(t)[:, :20], keys_s)
    assert not np.array_equal(cache.keys(s)[:, 20], cache.keys(t)[:, 20])
    cache.truncate(t, 3)
    assert cache.length(t) == 3 and cache.free_blocks == 4
    cache.free_sequence(t)
    cache.free_sequence(s)
    assert cache.free_blocks == 6
    u = cache.add_sequence()
    k, v = rand(Hkv, 5, d), rand(Hkv, 5, d)
    cache.append(u, k, v)
    np.testing.assert_array_equal(cache.keys(u), k)
    np.testing.assert_array_equal(cache.values(u), v)


def test_errors_change_nothing():
    E, H, Hkv, d = 32, 4, 2, 8
    layer, _ = make_layer(E, H, Hkv, d)
    cache = mha.PagedKVCache(3, 16, Hkv, d)
    a, b = cache.add_sequence(), cache.add_sequence()
    layer(rand(20, E), cache=cache, seq_ids=[a, b], q_lens=[10, 10])
    keys = cache.keys(a)
    before = (cache.free_blocks, cache.length(a), cache.length(b))
    out = np.full((40, E), 7.0, np.float32)
    for ids, q, T, words in [([a, b], [20, 20], 40, "free blocks but this step needs"),
                             ([a, a], [1, 1], 2, "appears twice"),
                             ([a, b], [1, 0], 1, "q_lens\\[1\\] is 0"),
                             ([a, b], [1, 1], 3, "sum of q_lens"),
                             ([a, 7], [1, 1], 2, "not in this paged KV cache")]:
        with pytest.raises(ValueError, match=words):
            layer(rand(T, E), cache=cache, seq_ids=ids, q_lens=q, out=out[:T])
        assert (cache.free_blocks, cache.length(a), cache.length(b)) == before
        np.testing.assert_array_equal(cache.keys(a), keys)
        assert (out == 7.0).all()
    with pytest.raises(ValueError, match="seq_ids has 2 entries but q_lens has 1"):
        layer(rand(2, E), cache=cache, seq_ids=[a, b], q_lens=[2])
    with pytest.raises(ValueError, match="needs seq_ids and q_lens"):
        layer(rand(2, E), cache=cache)
    with pytest.raises(ValueError, match="block_size"):
        mha.PagedKVCache(4, 24, Hkv, d)
    with pytest.raises(ValueError, match="dtype"):
        mha.PagedKVCache(4, 16, Hkv, d, dtype="f64")


def test_shared_block_written_by_every_holder_needs_one_copy_fewer():
    E, H, Hkv, d = 32, 4, 2, 8
    layer, _ = make_layer(E, H, Hkv, d)
    cache = mha.PagedKVCache(3, 16, Hkv, d)  # s takes 2 blocks, 1 is free
    s = cache.add_sequence()
    layer(rand(20, E), cache=cache, seq_ids=[s], q_lens=[20])
    t = cache.fork(s)
    layer(rand(2, E), cache=cache, seq_ids=[s, t], q_lens=[1, 1])  # one copy; the other holder keeps the block
    assert cache.free_blocks == 0 and cache.length(s) == cache.length(t) == 21
    u = cache.fork(s)
    with pytest.raises(ValueError, match="0 free blocks but this step needs 1"):
        layer(rand(1, E), cache=cache, seq_ids=[u], q_lens=[1])


def test_bad_ids_and_counts_are_value_or_type_errors():
    E, H, Hkv, d = 32, 4, 2, 8
    layer, _ = make_layer(E, H, Hkv, d)
    cache = mha.PagedKVCache(4, 16, Hkv, d)
    s = cache.add_sequence()
    layer(rand(3, E), cache=cache, seq_ids=[s], q_lens=[3])
    keys = cache.keys(s)
    with pytest.raises(TypeError):  # True is not sequence 1
        cache.length(True)
    for call in [lambda: cache.length(-1), lambda: cache.truncate(s, -1), lambda: cache.fork(-3), lambda: cache.keys(-1),
                 lambda: cache.free_sequence(-1), lambda: mha.PagedKVCache(-1, 16, Hkv, d)]:
        with pytest.raises(ValueError, match=">= 0"):
            call()
    for ids, q in [([0.5], [1]), ([s], [1.0]), ([None], [1]), ([True], [1]), ([s], [True])]:
        with pytest.raises(TypeError, match="must be an int"):
            layer(rand(1, E), cache=cache, seq_ids=ids, q_lens=q)
    with pytest.raises(ValueError, match="needs at least"):  # sized by the pool before anything by the tokens
        layer(rand(1, E), cache=cache, seq_ids=[s], q_lens=[2**40])
    assert cache.length(s) == 3 and cache.free_blocks == 3
    np.testing.assert_array_equal(cache.keys(s), keys)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
def test_scalar_backend_steps_equal_the_kv_cache_reference(dtype):
    """backend='scalar' runs each sequence through the reference of cached decoding: bitwise the contiguous
    KVCache's scalar forward on each sequence alone (outputs and cached rows), with or without a plan; the SIMD
    step stays within the float64 bound; an unknown backend is refused with nothing changed."""
    E, H, Hkv, d = 32, 4, 2, 8
    layer, w = make_layer(E, H, Hkv, d)
    tokens = [rand(n, E) for n in (21, 6)]
    cache = mha.PagedKVCache(8, 16, Hkv, d, dtype=dtype)
    ids = [cache.add_sequence() for _ in tokens]
    alone = [mha.KVCache(1, Hkv, d, len(t), dtype=dtype) for t in tokens]
    at = [0, 0]
    for k, step in enumerate([[(0, 17), (1, 5)], [(1, 1), (0, 1)], [(0, 3)]]):
        x = np.concatenate([tokens[s][at[s]:at[s] + q] for s, q in step])
        sids, qs = [ids[s] for s, _ in step], [q for _, q in step]
        if k == 1:
            y, _ = layer(x, cache=cache, plan=mha.StepPlan(layer, cache, sids, qs), backend="scalar")
        else:
            y, _ = layer(x, cache=cache, seq_ids=sids, q_lens=qs, backend="scalar")
        row = 0
        for s, q in step:
            want, _ = layer(tokens[s][None, at[s]:at[s] + q], cache=alone[s], backend="scalar")
            np.testing.assert_array_equal(y[row:row + q], want[0])
            row += q
            at[s] += q
    for s, t in enumerate(tokens):
        np.testing.assert_array_equal(cache.keys(ids[s]), mha_cache_rows(alone[s], True, len(t)))
        np.testing.assert_array_equal(cache.values(ids[s]), mha_cache_rows(alone[s], False, len(t)))
    free, length = cache.free_blocks, cache.length(ids[0])
    with pytest.raises(ValueError, match="backend"):
        layer(rand(1, E), cache=cache, seq_ids=[ids[0]], q_lens=[1], backend="fast")
    assert cache.free_blocks == free and cache.length(ids[0]) == length


def test_one_step_plan_for_every_layer():
    """A two-layer model, a cache per layer: one StepPlan per step given to both layers equals each layer
    planning its own step (bitwise); a plan used twice on one cache, or with the wrong arguments, is refused."""
    E, H, Hkv, d = 32, 4, 2, 8
    layers = [make_layer(E, H, Hkv, d)[0] for _ in range(2)]
    own = [mha.PagedKVCache(16, 16, Hkv, d) for _ in layers]
    shared = [mha.PagedKVCache(16, 16, Hkv, d) for _ in layers]
    ids = [[c.add_sequence() for _ in range(2)] for c in own + shared]
    assert all(i == ids[0] for i in ids)
    a, b = ids[0]
    for step in [([a, b], [12, 5]), ([b, a], [1, 1]), ([a, b], [3, 1])]:
        x = rand(sum(step[1]), E)
        plan = mha.StepPlan(layers[0], shared[0], step[0], step[1], threads=1)
        assert plan.tokens == x.shape[0] and plan.sequences == 2
        h_own, h_plan = x, x
        for layer, c_own, c_shared in zip(layers, own, shared):
            h_own, _ = layer(h_own, cache=c_own, seq_ids=step[0], q_lens=step[1], threads=1)
            h_plan, _ = layer(h_plan, cache=c_shared, plan=plan)
            np.testing.assert_array_equal(h_plan, h_own)
        with pytest.raises(ValueError, match="a plan serves one step"):
            layers[0](x, cache=shared[0], plan=plan)
    for c_own, c_shared in zip(own, shared):
        for s in (a, b):
            np.testing.assert_array_equal(c_shared.keys(s), c_own.keys(s))
    plan = mha.StepPlan(layers[0], shared[0], [a], [1])
    with pytest.raises(ValueError, match="not both"):
        layers[0](rand(1, E), cache=shared[0], plan=plan, seq_ids=[a], q_lens=[1])
    with pytest.raises(ValueError, match="sum of q_lens"):
        layers[0](rand(2, E), cache=shared[0], plan=plan)
    with pytest.raises(ValueError, match="needs cache=PagedKVCache"):
        layers[0](rand(1, E), plan=plan)
    with pytest.raises(TypeError, match="plan must be a StepPlan"):
        layers[0](rand(1, E), cache=shared[0], plan="plan")
    with pytest.raises(ValueError, match="q_lens\\[0\\] is 0"):
        mha.StepPlan(layers[0], shared[0], [a], [0])
    assert shared[0].length(a) == own[0].length(a)


def test_readers_during_a_step_in_another_thread_are_refused_or_consistent():
    """A step releases the GIL and moves block tables; keys() / block_table() / length() in another thread then
    raise ValueError ("in use") or see a consistent cache (they used to read a moved table: a crash)."""
    import threading
    E, H, Hkv, d = 64, 4, 2, 16
    layer, _ = make_layer(E, H, Hkv, d)
    cache = mha.PagedKVCache(512, 16, Hkv, d)
    ids = [cache.add_sequence() for _ in range(4)]
    layer(rand(4 * 20, E), cache=cache, seq_ids=ids, q_lens=[20] * 4)
    x = rand(4, E)
    done = threading.Event()

    def steps():
        for _ in range(300):
            layer(x, cache=cache, seq_ids=ids, q_lens=[1] * 4, threads=1)
        done.set()

    t = threading.Thread(target=steps)
    t.start()
    reads = refused = 0
    while not done.is_set():
        try:
            k, n, table = cache.keys(ids[1]), cache.length(ids[2]), cache.block_table(ids[3])
            assert k.shape[0] == Hkv and k.shape[2] == d and 20 <= k.shape[1] <= 320 and 20 <= n <= 320
            assert len(table) >= 2
            reads += 1
        except ValueError as e:
            assert "in use by another call" in str(e)
            refused += 1
    t.join()
    assert cache.length(ids[0]) == 320 and reads + refused > 0
