"""Float64 math that is not a hot loop, shared by both backends."""

from __future__ import annotations

import functools
import math

import numpy as np


def frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=256)
def sinusoidal_inv_freq(dim: int, base: float) -> np.ndarray:
    """w_i = base^(-2i/dim) for i < ceil(dim / 2), as the seed computes it:
    exp(2i * -ln(base) / dim). Read-only float64."""
    if dim == 0:
        return frozen(np.empty(0))
    return frozen(np.exp(np.arange(0, dim, 2, dtype=np.float64) * (-math.log(base) / dim)))
