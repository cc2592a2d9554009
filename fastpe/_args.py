"""Per-operation argument normalisation, shared by both backends.

Each function here validates every argument of one public operation (see
_checks for the rules) and returns a plan: the arrays as views of the shape
the loops expect, plus the float64 parameters. Nothing is written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _checks, _math, _threads

LAYOUTS = ("interleaved", "split")


class SinusoidalPlan(NamedTuple):
    x: np.ndarray              # (batch, seq, dim) view of the caller's array
    positions: _checks.Positions
    inv_freq: np.ndarray       # float64 (ceil(dim / 2),)
    split: bool
    accumulate: bool           # x * scale + PE, else PE
    scale: float
    num_threads: int | None


class LearnedPlan(NamedTuple):
    x: np.ndarray              # (batch, seq, dim)
    table: np.ndarray          # (rows, dim), x's storage dtype
    positions: _checks.Positions
    num_threads: int | None


def _sinusoidal_common(dim: int, base: object, layout: object) -> tuple[np.ndarray, bool]:
    base = _checks.real(base, "base", positive=True)
    split = _checks.choice(layout, "layout", LAYOUTS) == "split"
    return _math.sinusoidal_inv_freq(dim, base), split


def sinusoidal_table(length: object, dim: object, base: object, offset: object,
                     layout: object, dtype: object, out: object,
                     num_threads: object) -> SinusoidalPlan:
    length = _checks.count(length, "length")
    dim = _checks.count(dim, "dim", minimum=1)
    inv_freq, split = _sinusoidal_common(dim, base, layout)
    if out is None:
        out = np.empty((length, dim), dtype=_checks.float_dtype(dtype, "dtype"))
    else:
        out = _checks.array(out, "out", (2,), writable=True)
        if out.shape != (length, dim):
            raise ValueError(f"out must have shape ({length}, {dim}), got {out.shape}")
        if dtype is not None and dtype != "float32" and _checks.float_dtype(dtype, "dtype") != out.dtype:
            raise TypeError(f"dtype {dtype} contradicts out.dtype {out.dtype}; give one of them")
    positions = _checks.positions(None, offset, 1, length)
    return SinusoidalPlan(out[None], positions, inv_freq, split, False, 1.0,
                          _threads.check(num_threads))


def add_sinusoidal(x: object, positions: object, offset: object, base: object, layout: object,
                   scale: object, num_threads: object) -> SinusoidalPlan:
    x = _checks.array(x, "x", (2, 3), writable=True)
    x3 = x if x.ndim == 3 else x[None]
    inv_freq, split = _sinusoidal_common(x3.shape[2], base, layout)
    scale = _checks.real(scale, "scale")
    pos = _checks.positions(positions, offset, x3.shape[0], x3.shape[1])
    return SinusoidalPlan(x3, pos, inv_freq, split, True, scale, _threads.check(num_threads))


def add_learned(x: object, table: object, positions: object, offset: object,
                num_threads: object) -> LearnedPlan:
    x = _checks.array(x, "x", (2, 3), writable=True)
    x3 = x if x.ndim == 3 else x[None]
    table = _checks.array(table, "table", (2,), writable=False)
    if table.dtype != x.dtype:
        raise TypeError(f"table must have x's dtype {x.dtype}, got {table.dtype}")
    if table.shape[1] != x3.shape[2]:
        raise ValueError(f"table rows have {table.shape[1]} features but x has {x3.shape[2]} "
                         f"(table must be (max_len, {x3.shape[2]}))")
    pos = _checks.positions(positions, offset, x3.shape[0], x3.shape[1])
    if pos.max >= table.shape[0]:
        raise IndexError(f"position {pos.max} is past the end of table (max_len "
                         f"{table.shape[0]}): a learned table can't handle sequences longer "
                         f"than max_len")
    return LearnedPlan(x3, table, pos, _threads.check(num_threads))
