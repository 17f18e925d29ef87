"""Float64 reference of multi-head attention for the Python tests, with a forward error bound derived from
float32 arithmetic, so the tests compare against a tolerance that follows from the math rather than a guess.

Error model (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3): a float32 dot product of length
n, in any summation order, with or without FMA, is within gamma(n) * sum |x_i| |y_i| of the exact value,
gamma(n) = n u / (1 - n u), u = 2^-24. With bf16 operands (compute='bf16') each operand is first rounded
with unit roundoff ub = 2^-8, adding (2 ub + ub^2) * sum |x_i| |y_i|. The bound is propagated to first order
through the steps, elementwise on absolute values:
  Q = x Wq^T + bq      eQ = g_E |x||Wq|^T + u |Q|                    (likewise K, V)
  s = q.k * scale      es = (eQ.|k| + |q|.eK + g_d |q|.|k|) scale + u |s|
  p = softmax(s)       ep_j = p_j (es_j + sum_k p_k es_k) + g_(Lk+8) p_j   (exp, sum and division roundings)
  c = sum_j p_j v_j    ec = sum_j (ep_j |v_j| + p_j eV_j) + g_Lk sum_j p_j |v_j|
  o = c Wo^T + bo      eo = ec |Wo|^T + g_(Hd) |c||Wo|^T + u |o|
Two implementations each within the bound of the exact result differ by at most twice the bound.
"""
import numpy as np

U32 = 2.0 ** -24
UBF16 = 2.0 ** -8


def gamma(n, u=U32):
    return n * u / (1 - n * u)


def dot_err(n, ub):
    return gamma(n) + (2 * ub + ub * ub if ub else 0.0)


def rope_tables(positions, d, theta, dims=0):
    r = dims or d
    k = np.arange(r // 2, dtype=np.float64)
    inv = theta ** (-2.0 * k / r)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang), r


def rope_half(x, positions, theta, dims=0):
    """Rotary embedding, 'half' style, on x [..., L, d] (positions [L])."""
    d = x.shape[-1]
    c, s, r = rope_tables(positions, d, theta, dims)
    y = x.copy()
    x1, x2 = x[..., : r // 2], x[..., r // 2: r]
    y[..., : r // 2] = x1 * c - x2 * s
    y[..., r // 2: r] = x2 * c + x1 * s
    return y


def sdpa_reference(q, k, v, scale=None, mask=None, eq=None, ek=None, ev=None, ub=0.0):
    """q [B, H, Lq, d], k / v [B, H, Lk, d] (already repeated for GQA), mask broadcastable to [B, H, Lq, Lk]
    as additive float64 (-inf = masked). Returns (out, bound, probabilities, probability bound); eq, ek, ev:
    error bounds of the inputs (0 when exact)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    d, Lk = q.shape[-1], k.shape[-2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + mask
    aq, ak, av = np.abs(q), np.abs(k), np.abs(v)
    es = gamma(1) * np.abs(np.nan_to_num(s, neginf=0)) + dot_err(d, ub) * (aq @ np.swapaxes(ak, -1, -2)) * scale
    if eq is not None:
        es = es + (eq @ np.swapaxes(ak, -1, -2) + aq @ np.swapaxes(ek, -1, -2)) * scale
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    p = np.where(den > 0, e / np.where(den > 0, den, 1), 0)
    es = np.where(np.isfinite(s), es, 0)
    ep = p * (es + (p * es).sum(-1, keepdims=True)) + gamma(Lk + 8) * p + ub * p
    out = p @ v
    eo = ep @ av + dot_err(Lk, ub) * (p @ av)
    if ev is not None:
        eo = eo + p @ ev
    return out, eo, p, ep


def mha_reference(query, key, value, w, num_heads, num_kv_heads=None, head_dim=None, mask=None, ub=0.0,
                  rope_theta=None, positions_q=None, positions_k=None):
    """nn.MultiheadAttention (batch_first) in float64 with its error bound.

    query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim]; w: dict of numpy weights named as
    mha.MultiheadAttention's constructor names them; mask: additive float64 broadcastable to [B, H, Lq, Lk].
    Returns (out, bound, per-head probabilities [B, H, Lq, Lk], their bound)."""
    H = num_heads
    Hkv = num_kv_heads or H
    x, kx, vx = (np.asarray(a, np.float64) for a in (query, key, value))
    E = x.shape[-1]
    d = head_dim or E // H
    if "in_proj_weight" in w:
        W = np.asarray(w["in_proj_weight"], np.float64)
        Wq, Wk, Wv = W[: H * d], W[H * d: H * d + Hkv * d], W[H * d + Hkv * d:]
    else:
        Wq, Wk, Wv = (np.asarray(w[n], np.float64) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    if "in_proj_bias" in w:
        b = np.asarray(w["in_proj_bias"], np.float64)
        bq, bk, bv = b[: H * d], b[H * d: H * d + Hkv * d], b[H * d + Hkv * d:]
    else:
        bq, bk, bv = (np.asarray(w.get(n, 0.0), np.float64) for n in ("q_proj_bias", "k_proj_bias", "v_proj_bias"))
    Wo = np.asarray(w["out_proj_weight"], np.float64)
    bo = np.asarray(w.get("out_proj_bias", 0.0), np.float64)

    def proj(a, W_, b_):
        y = a @ W_.T + b_
        return y, dot_err(a.shape[-1], ub) * (np.abs(a) @ np.abs(W_).T) + gamma(1) * np.abs(y)

    def heads(a, n):  # [B, L, n*d] -> [B, n, L, d]
        B_, L_ = a.shape[:2]
        return a.reshape(B_, L_, n, d).transpose(0, 2, 1, 3)

    Q, eQ = proj(x, Wq, bq)
    K, eK = proj(kx, Wk, bk)
    V, eV = proj(vx, Wv, bv)
    Q, eQ, K, eK, V, eV = heads(Q, H), heads(eQ, H), heads(K, Hkv), heads(eK, Hkv), heads(V, Hkv), heads(eV, Hkv)
    if rope_theta is not None:
        # A rotation keeps norms: the bound of a pair grows to the sum of both parts' bounds, plus the
        # rounding of cos / sin (once each) and of the two products and the sum, within 4u of |x1| + |x2|.
        r = d // 2

        def pair(a):  # each element of a rotated pair gets the sum over the pair
            return np.concatenate([a[..., :r] + a[..., r:]] * 2, -1)

        eQ = pair(eQ) + 4 * U32 * pair(np.abs(Q))
        eK = pair(eK) + 4 * U32 * pair(np.abs(K))
        Q = rope_half(Q, positions_q, rope_theta)
        K = rope_half(K, positions_k, rope_theta)
    G = H // Hkv
    K, eK, V, eV = (np.repeat(a, G, axis=1) for a in (K, eK, V, eV))
    c, ec, p, ep = sdpa_reference(Q, K, V, mask=mask, eq=eQ, ek=eK, ev=eV, ub=ub)
    B, _, Lq, _ = c.shape
    c, ec = (a.transpose(0, 2, 1, 3).reshape(B, Lq, H * d) for a in (c, ec))
    out = c @ Wo.T + bo
    eo = ec @ np.abs(Wo).T + dot_err(H * d, ub) * (np.abs(c) @ np.abs(Wo).T) + gamma(1) * np.abs(out)
    return out, eo, p, ep


def additive(mask, dtype=np.float64):
    """A torch-style mask (bool True = not allowed, or float added) as float64 additive."""
    m = np.asarray(mask)
    if m.dtype == np.bool_ or m.dtype == np.uint8:
        return np.where(m.astype(bool), -np.inf, 0.0).astype(dtype)
    return m.astype(dtype)


def assert_within(actual, expected, bound, what=""):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} elements outside the bound; worst at {i}: "
                             f"|{actual[i]} - {expected[i]}| = {err[i]} > {bound[i]}")
