"""Sinusoidal position encodings (Vaswani et al., 2017, section 3.5).

``PE[p, 2i] = sin(p * w_i)`` and ``PE[p, 2i + 1] = cos(p * w_i)`` with
``w_i = base^(-2i / dim)``; the "split" layout puts all sines first, then all
cosines (Marian, Pegasus). An odd ``dim`` ends on a sine column (interleaved) or on a cosine
column (split).

``frequencies="fairseq"`` is the form fairseq's sinusoidal positional embedding
introduced and Hugging Face's M2M100, NLLB, XGLM, Speech2Text, Whisper (encoder) and
MusicGen keep: ``w_j = base^(-j / (half - 1))`` for ``j < half = dim // 2``, an odd
``dim`` padded with a last column of zeros, and with ``padding_idx`` the rows of its
table: position p reads row ``padding_idx + 1 + p``. ``layout="split_cos"`` puts the
cosines first (MusicGen).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _args, _backend, _checks, _math, _threads, reference
from ._typing import (
    DTypeLike,
    InPlace,
    PositionsLike,
    SinusoidalFrequencies,
    SinusoidalLayout,
)


def _run(plan: _args.SinusoidalPlan) -> None:
    """The validated, normalised call, through the same compiled entry."""
    kern = _backend.kernels()
    if kern is None or not plan.x.size:
        reference.run_sinusoidal(plan)
        return
    x = plan.x
    if plan.zero_tail:  # fairseq's odd dim: the kernel fills the even-width part
        x = plan.x[..., :-1]
    with _checks.kernel_views(x) as (work,):
        done = kern.sinusoidal_call(work, plan.inv_freq, plan.positions.array,
                                    plan.positions.offset, plan.scale, plan.split,
                                    plan.cos_first, plan.accumulate,
                                    _threads.resolve(plan.num_threads, (
                                        2 if plan.accumulate else 1) * plan.x.nbytes))
    if not done:
        raise _checks.entry_declined("sinusoidal")
    if plan.zero_tail:
        tail = plan.x[..., -1]
        if plan.accumulate:
            work_dtype = _checks.compute_dtype(tail.dtype)
            tail[...] = tail.astype(work_dtype) * work_dtype.type(plan.scale)
        else:
            tail[...] = 0


def sinusoidal_table(length: int, dim: int, *, base: float = 10000.0, offset: int = 0,
                     layout: SinusoidalLayout = "interleaved", dtype: DTypeLike | None = None,
                     out: np.ndarray | None = None, num_threads: int | None = None,
                     frequencies: SinusoidalFrequencies = "transformer",
                     padding_idx: int | None = None) -> np.ndarray:
    """The (length, dim) table of encodings for positions offset .. offset + length - 1.

    Parameters
    ----------
    length, dim : int
        Rows (positions) and features. ``dim`` may be odd.
    base : float
        The wavelength base, 10000 in the original Transformer.
    offset : int
        Position of the first row.
    layout : {"interleaved", "split", "split_cos"}
        sin/cos in alternate columns, a block of sines then a block of cosines, or
        cosines then sines (MusicGen; even dim, or with fairseq frequencies).
    dtype : dtype, optional
        float32 (the default), float64, float16 or bfloat16 (with ml_dtypes);
        with ``out``, out's dtype, which a given dtype must match.
    out : ndarray, optional
        A writable (length, dim) array to fill instead of allocating one.
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``.
    frequencies : {"transformer", "fairseq"}
        ``base^(-2i / dim)`` (Vaswani et al.), or fairseq's ``base^(-j / (dim // 2 - 1))``
        with an odd dim's last column zero (M2M100, Whisper, MusicGen; dim >= 4).
    padding_idx : int, optional
        fairseq's row offset: position p is row ``padding_idx + 1 + p`` of its table
        (M2M100 and NLLB use 1). The table's padding row itself, all zeros there, is
        not a position.

    Angles are formed and reduced in float64: float32 values are exact to their
    precision (within 1.5e-7) for every position up to 2**20, and float16 and bfloat16
    tables are the float32 table rounded to nearest even (as models that build a
    float32 table and cast it hold theirs). float64 values are exact for the float64
    frequencies, whose own rounding moves the angle by up to ``p * w * 2**-53`` (1e-10
    at 2**20). Positions of 2**32 or more are a ValueError (the float64 angle's
    rounding would exceed float32 precision).

    >>> fastpe.sinusoidal_table(4, 6, dtype="float64")[1, :2]  # sin(1), cos(1)
    array([0.84147098, 0.54030231])
    """
    plan = _args.sinusoidal_table(length, dim, base=base, offset=offset, layout=layout,
                                  dtype=dtype, out=out, num_threads=num_threads,
                                  frequencies=frequencies, padding_idx=padding_idx)
    _run(plan)
    _checks.bump_written(out)
    return plan.x[0] if out is None else out


# the layouts of the compiled entry's rows (split_cos of an even width: with an odd one,
# fairseq's frequencies alone)
_FAST_LAYOUTS = frozenset({"interleaved", "split", "split_cos"})


def add_sinusoidal(x: InPlace, positions: PositionsLike = None, *, offset: int = 0,
                   base: float = 10000.0, layout: SinusoidalLayout = "interleaved",
                   scale: float = 1.0, num_threads: int | None = None,
                   frequencies: SinusoidalFrequencies = "transformer",
                   padding_idx: int | None = None) -> InPlace:
    """``x = x * scale + PE[positions]`` in place, in one pass; returns x.

    x is (seq, dim) or (batch, seq, dim), any float dtype and strides.
    positions: None for ``offset + arange(seq)``, or integers of shape (seq,)
    shared by the batch or (batch, seq) per sequence. ``scale`` is the
    embedding multiplier (sqrt(dim) in the original Transformer). ``layout``,
    ``frequencies`` and ``padding_idx`` as in :func:`sinusoidal_table`.

    >>> x = np.zeros((2, 16, 64), np.float32)
    >>> fastpe.add_sinusoidal(x, scale=8.0) is x
    True
    """
    if type(x) is not np.ndarray and _checks.is_tensor(x):
        # a model's own torch tensors: viewed once, then the path of NumPy arrays
        xv, pv = _checks.torch_tensors((x, "x", True), (positions, "positions", False))
        add_sinusoidal(xv, pv, offset=offset, base=base, layout=layout, scale=scale,
                       num_threads=num_threads, frequencies=frequencies,
                       padding_idx=padding_idx)
        _checks.bump_written(x)  # written: its version counter, as torch does
        return x
    kern = _backend.kernels()
    if (kern is not None and padding_idx is None and type(x) is np.ndarray
            and type(layout) is str and layout in _FAST_LAYOUTS
            and type(frequencies) is str and frequencies == "transformer"
            and (num_threads is None or (type(num_threads) is int and num_threads > 0))):
        # the compiled entry checks the call in C (False: nothing written, take the
        # validating path, which also produces every error message); numbers of Python's
        # and NumPy's own types only (plain_real), and a base of at least 1, whose
        # frequencies (at most 1) sinusoidal_inv_freq never refuses
        arr: Any = x
        b = base if type(base) is float else _checks.plain_real(base)
        sc = scale if type(scale) is float else _checks.plain_real(scale)
        off = offset if type(offset) is int else _checks.plain_int(offset)
        if (b is not None and 1.0 <= b < math.inf and sc is not None and arr.ndim in (2, 3)
                and not (layout == "split_cos" and arr.shape[-1] % 2)
                and kern.sinusoidal_call(
                    arr, _math.sinusoidal_inv_freq(arr.shape[-1], b, arr.size > 0), positions,
                    off, sc, layout != "interleaved", layout == "split_cos", True,
                    _threads.resolve(num_threads, 2 * arr.nbytes))):
            return x
    if _checks.is_tensor(positions):
        # an array beside a model's torch positions: those viewed once, then the path of
        # arrays (the compiled entry views only NumPy's)
        return add_sinusoidal(x, _checks.torch_tensors((positions, "positions", False))[0],
                              offset=offset, base=base, layout=layout, scale=scale,
                              num_threads=num_threads, frequencies=frequencies,
                              padding_idx=padding_idx)
    _run(_args.add_sinusoidal(x, positions=positions, offset=offset, base=base, layout=layout,
                              scale=scale, num_threads=num_threads, frequencies=frequencies,
                              padding_idx=padding_idx))
    return x
