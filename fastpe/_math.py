"""Float64 math that is not a hot loop, shared by both backends."""

from __future__ import annotations

import functools
import math
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from . import _checks
from ._rope_scaling import MAX_SPEC_INV_FREQ

_T = TypeVar("_T", bound=np.generic)


def frozen(a: NDArray[_T]) -> NDArray[_T]:
    """A read-only copy of `a` for a shared cache: a view of immutable bytes, so
    that not even ``flags.writeable = True`` can make it writable."""
    return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)


@functools.lru_cache(maxsize=256)
def sinusoidal_inv_freq(dim: int, base: float, rows: bool = True) -> NDArray[np.float64]:
    """w_i = base^(-2i/dim) for i < ceil(dim / 2), computed as exp(2i * -ln(base) / dim)
    like the Transformer's reference code (Vaswani et al., 2017). Read-only float64;
    none formed (base checked) for a call without rows to fill (rows False)."""
    return _powers((dim + 1) // 2, 2, -math.log(base) / dim if dim else 0.0, base, dim, rows)


def _powers(count: int, stride: int, step: float, base: float, dim: int,
            rows: bool) -> NDArray[np.float64]:
    """exp(stride * i * step) for i < count, read-only, checked by _check_inv_freq. With
    no rows to fill, only the check, on the two ends (exp is monotonic): an empty
    call's dim may ask for more frequencies than memory holds."""
    i = (np.arange(0, stride * count, stride, dtype=np.float64) if rows else
         np.array([0, stride * (count - 1)] if count else [], dtype=np.float64))
    with np.errstate(over="ignore"):
        w = np.exp(i * step)
    _check_inv_freq(w, base, dim)
    return frozen(w if rows else w[:0])


def _check_inv_freq(w: NDArray[np.float64], base: float, dim: int) -> None:
    """RoPE's limit on frequencies (MAX_SPEC_INV_FREQ) for the sinusoids: past it, the
    angles position * w carry whole radians of rounding (a base far below 1)."""
    if w.size and not w.max() <= MAX_SPEC_INV_FREQ:  # inf when base**(-2i/dim) overflows
        raise ValueError(f"base={base!r} gives inverse wavelength {float(w.max())!r} for "
                         f"dim {dim}, above {MAX_SPEC_INV_FREQ} (radians per position: past "
                         f"it the float64 angles carry more rounding than float32 "
                         f"precision); use a base of at least 1")


@functools.lru_cache(maxsize=256)
def fairseq_inv_freq(dim: int, base: float, rows: bool = True) -> NDArray[np.float64]:
    """w_j = base^(-j / (half - 1)) for j < half = dim // 2, computed as
    exp(j * -ln(base) / (half - 1)) like fairseq's sinusoidal positional embedding
    (and M2M100, Whisper, MusicGen after it). Read-only float64; dim >= 4; none formed
    (base checked) for a call without rows to fill (rows False)."""
    return _powers(dim // 2, 1, -math.log(base) / (dim // 2 - 1), base, dim, rows)


def _alibi_slopes_math(n: int, max_bias: float) -> NDArray[np.float64]:
    """The ALiBi paper's slopes in float64, exactly 2**(-max_bias * e) per head.

    With p the largest power of two <= n: the first p exponents are (h + 1) / p
    (the geometric sequence of p heads); the other n - p are the odd multiples
    (2j + 1) / (2p), every other exponent of 2p heads starting with the first.
    Every exponent is a dyadic rational, so -max_bias * e rounds at most once
    and exp2 of it is within an ulp of the exact power.
    """
    p = 1 << (n.bit_length() - 1)
    e = np.empty(n, dtype=np.float64)
    e[:p] = np.arange(1, p + 1, dtype=np.float64) / p
    e[p:] = np.arange(1, 2 * (n - p), 2, dtype=np.float64) / (2 * p)
    return np.exp2(-max_bias * e)


# the most float64 values an array can hold
MAX_HEADS = np.iinfo(np.intp).max // 8


@functools.lru_cache(maxsize=512)
def cached_alibi_slopes(num_heads: int, max_bias: float) -> NDArray[np.float64]:
    """alibi_slopes for validated arguments, read-only, computed once."""
    return frozen(np.empty(0) if num_heads == 0 else _alibi_slopes_math(num_heads, max_bias))


def alibi_slopes(num_heads: int, *, max_bias: float = 8.0) -> NDArray[np.float64]:
    """The per-head ALiBi slopes (Press et al., 2022), float64 (num_heads,).

    A power-of-two head count n gets the geometric sequence
    ``2**(-max_bias * (h + 1) / n)`` for h = 0 .. n - 1 (1/2, 1/4, ..., 1/256
    for 8 heads). Any other n gets the slopes of the largest power of two p
    below it, then every other slope of 2p heads (the 1st, 3rd, 5th, ...)
    until there are n: the rule of the paper's code, of BLOOM
    (``build_alibi_tensor``) and of MPT (``gen_slopes``), all of which use
    max_bias 8. ``max_bias`` is the ``alibi_bias_max`` of MosaicML's MPT code
    (transformers' MptModel ignores it: always 8). These are the float64 values;
    MPT's float32 slopes at max_bias 8 are their rounding (at another max_bias, whose
    exponents are not whole, MPT's float32 ``1 / 2**x`` rounds twice: up to one
    float32 step from it), BLOOM's float32 powers are up to 7 float32 steps (5e-7
    relative) from it for up to 112 heads (BLOOM's largest), 32 steps at 256.

    >>> fastpe.alibi_slopes(8)
    array([0.5       , 0.25      , 0.125     , 0.0625    , 0.03125   ,
           0.015625  , 0.0078125 , 0.00390625])
    """
    n = _checks.count(num_heads, "num_heads", minimum=1)
    mb = _checks.real(max_bias, "max_bias", positive=True)
    if n > MAX_HEADS:
        raise ValueError(f"num_heads must be at most {MAX_HEADS} (a float64 array's "
                         f"largest size), got {n}")
    return cached_alibi_slopes(n, mb).copy()
