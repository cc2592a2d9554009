"""Pure-NumPy twins of fastpe's public functions: same names, same signatures,
same validation, same results within a per-dtype tolerance.

This is both the fallback backend (``FASTPE_BACKEND=numpy``, or when the
compiled extension is missing) and the oracle the tests compare the compiled
kernels with. It favours the obvious formula over speed: angles are formed in
float64 and passed to ``np.sin``/``np.cos``; results round once to the
caller's dtype. It never calls the compiled kernels.
"""

from __future__ import annotations

import numpy as np

from . import _args, _checks

__all__ = ["sinusoidal_table", "add_sinusoidal", "add_learned"]


# ---- loops (the backend interface: plans in, arrays written) ----------------

def _sinusoidal_rows(positions: np.ndarray, inv_freq: np.ndarray, dim: int,
                     split: bool) -> np.ndarray:
    """float64 PE rows for an int64 positions array: shape positions.shape + (dim,)."""
    angles = positions[..., None].astype(np.float64) * inv_freq
    pe = np.empty(positions.shape + (dim,), dtype=np.float64)
    ncos = dim // 2
    if split:
        pe[..., :inv_freq.size] = np.sin(angles)
        pe[..., inv_freq.size:] = np.cos(angles[..., :ncos])
    else:
        pe[..., 0::2] = np.sin(angles)
        pe[..., 1::2] = np.cos(angles[..., :ncos])
    return pe


def run_sinusoidal(plan: _args.SinusoidalPlan) -> None:
    x = plan.x
    pe = _sinusoidal_rows(plan.positions.as_array(x.shape[1]), plan.inv_freq, x.shape[2],
                          plan.split)
    if plan.accumulate:
        work = _checks.compute_dtype(x.dtype)
        pe = pe.astype(work)
        x[...] = x.astype(work) * work.type(plan.scale) + pe
    else:
        x[...] = pe


def run_learned(plan: _args.LearnedPlan) -> None:
    x = plan.x
    work = _checks.compute_dtype(x.dtype)
    rows = plan.table[plan.positions.as_array(x.shape[1])]
    x[...] = x.astype(work) + rows.astype(work)


# ---- the public twins --------------------------------------------------------

def sinusoidal_table(length, dim, *, base=10000.0, offset=0, layout="interleaved",
                     dtype="float32", out=None, num_threads=None):
    """NumPy twin of :func:`fastpe.sinusoidal_table`."""
    plan = _args.sinusoidal_table(length, dim, base, offset, layout, dtype, out, num_threads)
    run_sinusoidal(plan)
    return plan.x[0]


def add_sinusoidal(x, positions=None, *, offset=0, base=10000.0, layout="interleaved",
                   scale=1.0, num_threads=None):
    """NumPy twin of :func:`fastpe.add_sinusoidal`."""
    run_sinusoidal(_args.add_sinusoidal(x, positions, offset, base, layout, scale, num_threads))
    return x


def add_learned(x, table, positions=None, *, offset=0, num_threads=None):
    """NumPy twin of :func:`fastpe.add_learned`."""
    run_learned(_args.add_learned(x, table, positions, offset, num_threads))
    return x
