"""Float64 reference of multi-head attention for the Python tests, with an error bound derived from float32
arithmetic, so the tests compare against a tolerance that follows from the math rather than a guess.

Error model (the probabilistic rounding-error analysis of Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019):
every float32 operation returns op(a, b)(1 + delta), |delta| <= u = 2^-24, the deltas independent with mean
zero. A dot product of length n, in any summation order, with or without FMA, then has an error that is a sum
of at most n + 1 independent terms, each bounded by u * S (S = sum |x_i y_i|, which bounds every partial sum);
its Hoeffding radius is r = u * sqrt(n + 1) * S. A quantity whose first-order error is sum_k a_k e_k over
independent elementary errors |e_k| <= b_k has radius r = sqrt(sum a_k^2 b_k^2) and, by Hoeffding's
inequality, |error| <= LAMBDA * r except with probability 2 exp(-LAMBDA^2 / 2) (2.5e-14 per element for
LAMBDA = 8). The radii below are that first-order propagation, written out per stage of attention:

  Q, K, V      projections: own rounding u sqrt(n + 1) (|x||W|^T + |b|)
  s = Q K^T c  (c = scale) plus the mask: own rounding u sqrt(d + 2) c |Q||K|^T + u |s|; the running-max
               subtraction u |s - max| and exp (at most 1.52 ulp: lib/simd/softmax_math.hpp) add 2u, all on s
  p = softmax  the normalizing sum (a common relative error, radius u sqrt(2 Lk): the online softmax's
               rescalings included) and the division (u per element)
  C = P V      own rounding u sqrt(2 Lk) P|V|;  errors of Q, K and the scores reach C through the exact
               derivative of softmax (they are correlated along a row, so they are carried to C and to the
               output projection as one linear map, not as separate radii)
  out = C Wo^T own rounding u sqrt(H d + 1) (|C||Wo|^T + |bo|)
With bf16 operands (compute='bf16') every product of a GEMM also has its two operands rounded to bfloat16
(ub = 2^-8 each): radius 2 ub sqrt(sum (x_i y_i)^2).

mha against the float64 reference: |error| <= LAMBDA r. Two float32 implementations (mha and torch), each
with independent errors of radius r: |difference| <= LAMBDA sqrt(2) r.
"""
import numpy as np

U32 = 2.0 ** -24
UBF16 = 2.0 ** -8
LAMBDA = 8.0


def rope_half(x, positions, theta):
    """Rotary embedding, 'half' style (all dims), on x [..., L, d] at positions [L]."""
    d = x.shape[-1]
    r = d // 2
    inv = theta ** (-2.0 * np.arange(r, dtype=np.float64) / d)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :r], x[..., r:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _linear(a, ra, W, b, ub):
    """y = a W^T + b with the radius of its error: a's errors (radius ra, independent) and its own rounding."""
    n = a.shape[-1]
    y = a @ W.T + b
    r2 = (U32 * np.sqrt(n + 1) * (np.abs(a) @ np.abs(W).T + np.abs(b))) ** 2
    if ub:
        r2 = r2 + (2 * ub) ** 2 * ((a * a) @ (W * W).T)
    if ra is not None:
        r2 = r2 + (ra * ra) @ (W * W).T
    return y, r2


def _head(Q, rQ2, K, rK2, V, rV2, mask, scale, ub, Wo):
    """One head of one batch: Q [Lq, d], K [Lk, d], V [Lk, dv], squared radii alike, additive mask [Lq, Lk] or
    None. Returns (C [Lq, dv], P, squared radius of P, squared radius of C Wo^T [Lq, E] (or of C when Wo is
    None))."""
    Lk, d = K.shape
    s = scale * (Q @ K.T)
    rs2 = (U32 * np.sqrt(d + 2) * scale * (np.abs(Q) @ np.abs(K).T)) ** 2
    if ub:
        rs2 = rs2 + (2 * ub * scale) ** 2 * ((Q * Q) @ (K * K).T)
    if mask is not None:
        s = s + mask
    finite = np.isfinite(s)
    m = np.max(np.where(finite, s, -np.inf), -1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(finite, np.exp(np.where(finite, s, 0.0) - m), 0.0)
    den = e.sum(-1, keepdims=True)
    P = e / np.where(den > 0, den, 1.0)
    sf = np.where(finite, s, 0.0)
    rs2 = np.where(finite, rs2 + (U32 * sf) ** 2 + (U32 * (sf - m)) ** 2 + (2 * U32) ** 2, 0.0)
    C = P @ V
    Kbar = P @ K                                      # [Lq, d]
    W = np.eye(V.shape[1]) if Wo is None else Wo      # [E, dv]
    VW, CW = V @ W.T, C @ W.T                         # [Lk, E], [Lq, E]
    # dq_ic reaches out_ie with coefficient scale * sum_c' W_ec' sum_j P_ij (K_jc - Kbar_ic) V_jc'
    A = np.einsum("ij,jc,je->ice", P, K, VW) - Kbar[:, :, None] * CW[:, None, :]
    r2 = scale ** 2 * np.einsum("ic,ice->ie", rQ2, A * A)
    # dk_mc: scale Q_ic P_im (VW_me - CW_ie); a score error at (i, m): P_im (VW_me - CW_ie)
    D2 = (VW[None, :, :] - CW[:, None, :]) ** 2       # [Lq, Lk, E]
    src = scale ** 2 * ((Q * Q) @ rK2.T) + rs2         # [Lq, Lk]
    r2 = r2 + np.einsum("im,ime->ie", P * P * src, D2)
    # normalization (common per row) and division (per element)
    r2 = r2 + (U32 ** 2 * 2 * Lk) * CW ** 2 + U32 ** 2 * ((P * P) @ (VW * VW))
    # V's errors and P V's own rounding, per column of C, through W
    rPV2 = (U32 * np.sqrt(2 * Lk) * (P @ np.abs(V))) ** 2
    if ub:
        rPV2 = rPV2 + (2 * ub) ** 2 * ((P * P) @ (V * V))
    r2 = r2 + ((P * P) @ rV2 + rPV2) @ (W * W).T
    # need_weights: the probabilities' own radii
    dK2 = (K[None, :, :] - Kbar[:, None, :]) ** 2      # [Lq, Lk, d]
    rP2 = P * P * (scale ** 2 * np.einsum("ic,ijc->ij", rQ2, dK2) + scale ** 2 * (Q * Q) @ rK2.T + rs2
                   + (P * P * src).sum(-1, keepdims=True) + U32 ** 2 * (2 * Lk + 1))
    return C, P, rP2, r2


def sdpa_reference(q, k, v, scale=None, mask=None):
    """q [B, H, Lq, d], k / v [B, H, Lk, d] (repeated for GQA already), mask additive float64 broadcastable to
    [B, H, Lq, Lk]. Returns (out, radius of out, P)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, H, Lq, d = q.shape
    Lk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    mask = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))
    out = np.zeros(q.shape[:3] + (v.shape[3],))
    r2 = np.zeros_like(out)
    P = np.zeros((B, H, Lq, Lk))
    z = np.zeros((Lk, d))
    for b in range(B):
        for h in range(H):
            C, P[b, h], _, r2[b, h] = _head(q[b, h], np.zeros((Lq, d)), k[b, h], z, v[b, h], np.zeros_like(v[b, h]),
                                            None if mask is None else mask[b, h], scale, 0.0, None)
            out[b, h] = C
    return out, np.sqrt(r2), P


def mha_reference(query, key, value, w, num_heads, num_kv_heads=None, head_dim=None, mask=None, ub=0.0,
                  rope_theta=None, positions_q=None, positions_k=None):
    """nn.MultiheadAttention (batch_first) in float64 with the radius of a float32 implementation's error.

    query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim]; w: dict of numpy weights named as
    mha.MultiheadAttention's constructor names them; mask: additive float64 broadcastable to [B, H, Lq, Lk].
    Returns (out, radius of out, per-head probabilities [B, H, Lq, Lk], their radius)."""
    H = num_heads
    Hkv = num_kv_heads or H
    x, kx, vx = (np.asarray(a, np.float64) for a in (query, key, value))
    B, Lq, E = x.shape
    Lk = kx.shape[1]
    d = head_dim or E // H
    if "in_proj_weight" in w:
        Win = np.asarray(w["in_proj_weight"], np.float64)
        Wq, Wk, Wv = Win[: H * d], Win[H * d: H * d + Hkv * d], Win[H * d + Hkv * d:]
    else:
        Wq, Wk, Wv = (np.asarray(w[n], np.float64) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    if "in_proj_bias" in w:
        bb = np.asarray(w["in_proj_bias"], np.float64)
        bq, bk, bv = bb[: H * d], bb[H * d: H * d + Hkv * d], bb[H * d + Hkv * d:]
    else:
        bq, bk, bv = (np.asarray(w.get(n, np.zeros(m)), np.float64)
                      for n, m in (("q_proj_bias", H * d), ("k_proj_bias", Hkv * d), ("v_proj_bias", Hkv * d)))
    Wo = np.asarray(w["out_proj_weight"], np.float64)
    bo = np.asarray(w.get("out_proj_bias", np.zeros(E)), np.float64)
    mask = None if mask is None else np.broadcast_to(mask, (B, H, Lq, Lk))
    scale = 1.0 / np.sqrt(d)

    def rotate(Y, rY2, pos):  # Y [L, n*d]: each head's pairs rotated; a pair's error radii add up
        if rope_theta is None:
            return Y, rY2
        L, n = Y.shape[0], Y.shape[1] // d
        Yh, R2 = Y.reshape(L, n, d).transpose(1, 0, 2), rY2.reshape(L, n, d).transpose(1, 0, 2)
        r = d // 2
        pair = lambda a: np.concatenate([a[..., :r] + a[..., r:]] * 2, -1)  # noqa: E731
        R2 = pair(R2) + (2 * U32 * pair(np.abs(Yh))) ** 2  # cos / sin rounded once, two products and a sum
        Yh = rope_half(Yh, pos, rope_theta)
        return Yh.transpose(1, 0, 2).reshape(L, n * d), R2.transpose(1, 0, 2).reshape(L, n * d)

    out = np.zeros((B, Lq, E))
    r2 = np.zeros((B, Lq, E))
    P = np.zeros((B, H, Lq, Lk))
    rP2 = np.zeros((B, H, Lq, Lk))
    G = H // Hkv
    for b in range(B):
        Q, rQ2 = rotate(*_linear(x[b], None, Wq, bq, ub), positions_q)
        K, rK2 = rotate(*_linear(kx[b], None, Wk, bk, ub), positions_k)
        V, rV2 = _linear(vx[b], None, Wv, bv, ub)
        Cs = []
        for h in range(H):
            g = h // G
            qs, ks = slice(h * d, h * d + d), slice(g * d, g * d + d)
            C, P[b, h], rP2[b, h], rh2 = _head(Q[:, qs], rQ2[:, qs], K[:, ks], rK2[:, ks], V[:, ks], rV2[:, ks],
                                               None if mask is None else mask[b, h], scale, ub, Wo[:, qs])
            r2[b] += rh2
            Cs.append(C)
        C = np.concatenate(Cs, -1)
        o, ro2 = _linear(C, None, Wo, bo, ub)
        out[b] = o
        r2[b] += ro2
    return out, np.sqrt(r2), P, np.sqrt(rP2)


def additive(mask):
    """A torch-style mask (bool True = not allowed, or float added) as float64 additive."""
    m = np.asarray(mask)
    if m.dtype == np.bool_ or m.dtype == np.uint8:
        return np.where(m.astype(bool), -np.inf, 0.0)
    return m.astype(np.float64)


def assert_within(actual, expected, radius, what="", implementations=1):
    """|actual - expected| <= LAMBDA * radius (times sqrt(2) when both sides are float32 implementations)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bound = LAMBDA * np.sqrt(implementations) * np.asarray(radius)
    err = np.abs(actual - expected)
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {err.size} elements outside the bound; worst at {i}: "
                             f"|{actual[i]} - {expected[i]}| = {err[i]} > {bound[i]}")
