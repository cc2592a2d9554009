"""An independent float64 RoPE for the tests, written from the formula, not from fastpe.

RoFormer (Su et al. 2021, eq. 34) rotates feature pair (x_i, x_j) of a token at position p
by the angle p * w_k of the pair's frequency w_k:

    x_i' = x_i cos(p w_k) - x_j sin(p w_k)
    x_j' = x_j cos(p w_k) + x_i sin(p w_k)

and Hugging Face's rotary modules multiply cos and sin by an ``attention_scaling``. The
pairs are (k, k + r/2) for the "neox" style (HF ``rotate_half``) and (2k, 2k + 1) for
"gptj" (GPT-J, RoFormer's own code), over the first r = rotary_dim features; the others
are left alone. The inverse rotates by -p w_k and divides by the scaling.

Everything here loops over explicit pair indices in float64, so it shares no code path
with ``fastpe.reference`` (slices and broadcasting) or the kernels (in-place pointer loops).

Two truths for cos and sin of an angle p * w (integer p, float64 w):

- ``cos_sin``: np.cos / np.sin of the float64 product fl(p * w). For the positions models
  use (below ~2**24) that product is exact to about 1e-9 relative, far below what float32
  can show, so this is the "float64 formula".
- ``exact_cos_sin``: of the real product p * w, evaluated with mpmath (when installed) or
  by splitting the exact rational product into hi + lo doubles and using the addition
  theorem with libm's (fully range-reduced) math.cos / math.sin. At very large positions
  (2**40) the two truths differ by up to half a float64 ulp of the angle.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

try:
    import mpmath
except ImportError:  # optional: the Fraction split below is exact enough on its own
    mpmath = None

STYLES = ("neox", "gptj")


def pair_indices(rotary_dim: int, style: str) -> tuple[np.ndarray, np.ndarray]:
    """(first, second) feature index of every rotary pair."""
    half = rotary_dim // 2
    k = np.arange(half)
    if style == "neox":
        return k, k + half
    if style == "gptj":
        return 2 * k, 2 * k + 1
    raise ValueError(style)


def cos_sin(positions, inv_freq) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the float64 angles fl(p * w): shape positions.shape + (len(w),)."""
    ang = np.asarray(positions, dtype=np.float64)[..., None] * np.asarray(inv_freq, np.float64)
    return np.cos(ang), np.sin(ang)


def _exact_scalar(p: int, w: float) -> tuple[float, float]:
    if mpmath is not None:
        with mpmath.workprec(200):
            a = mpmath.mpf(p) * mpmath.mpf(w)  # exact: 64 + 53 bits fit in 200
            return float(mpmath.cos(a)), float(mpmath.sin(a))
    prod = Fraction(p) * Fraction(w)  # the real product, exactly
    hi = float(prod)
    lo = float(prod - Fraction(hi))   # |lo| <= ulp(hi) / 2
    ch, sh, cl, sl = math.cos(hi), math.sin(hi), math.cos(lo), math.sin(lo)
    return ch * cl - sh * sl, sh * cl + ch * sl


def exact_cos_sin(positions, inv_freq) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the real products p * w (to about one float64 ulp)."""
    pos = np.asarray(positions)
    w = np.asarray(inv_freq, dtype=np.float64)
    c = np.empty(pos.shape + w.shape)
    s = np.empty(pos.shape + w.shape)
    for idx in np.ndindex(pos.shape):
        p = int(pos[idx])
        for k, wk in enumerate(w.tolist()):
            c[idx + (k,)], s[idx + (k,)] = _exact_scalar(p, wk)
    return c, s


def rotate(x, positions, inv_freq, *, style: str = "neox", attention_scaling: float = 1.0,
           inverse: bool = False, cos_sin_fn=cos_sin) -> np.ndarray:
    """RoPE of x (batch, seq, heads, head_dim), any float dtype, as a new float64 array.

    positions: (seq,) or (batch, seq) integers; inv_freq: (rotary_dim // 2,) float64.
    """
    x = np.asarray(x).astype(np.float64)
    batch, seq = x.shape[:2]
    pos = np.broadcast_to(np.asarray(positions), (batch, seq))
    w = np.asarray(inv_freq, dtype=np.float64)
    c, s = cos_sin_fn(pos, w)                      # (batch, seq, half)
    c, s = c[:, :, None, :], s[:, :, None, :]      # shared by every head
    if inverse:
        c, s = c / attention_scaling, -s / attention_scaling
    else:
        c, s = c * attention_scaling, s * attention_scaling
    out = x.copy()
    first, second = pair_indices(2 * w.size, style)
    a, b = x[..., first], x[..., second]
    out[..., first] = a * c - b * s
    out[..., second] = b * c + a * s
    return out


def pair_norms(x, rotary_dim: int, style: str) -> np.ndarray:
    """sqrt(a^2 + b^2) of every rotary pair of x (..., head_dim): shape (..., rotary_dim/2)."""
    x = np.asarray(x).astype(np.float64)
    first, second = pair_indices(rotary_dim, style)
    return np.hypot(x[..., first], x[..., second])
