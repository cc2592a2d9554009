"""Learned position tables (BERT, GPT-2): ``x += table[positions]``."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _args, _backend, _checks, _threads, reference
from ._typing import ArrayLike, InPlace, PositionsLike


def add_learned(x: InPlace, table: ArrayLike, positions: PositionsLike = None, *,
                offset: int = 0, num_threads: int | None = None) -> InPlace:
    """``x += table[positions]`` in place, in one pass; returns x.

    x is (seq, dim) or (batch, seq, dim); table is (max_len, dim) with x's
    dtype. positions: None for ``offset + arange(seq)``, or integers of shape
    (seq,) or (batch, seq). A position at or past max_len is an IndexError: a
    learned table has no rows for longer sequences.

    >>> table = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32)
    >>> x = np.zeros((1, 10, 64), np.float32)
    >>> np.array_equal(fastpe.add_learned(x, table)[0], table[:10])
    True
    """
    if type(x) is not np.ndarray and _checks.is_tensor(x):
        # a model's own torch tensors: viewed once, then the path of NumPy arrays
        xv, tv, pv = _checks.torch_tensors((x, "x", True), (table, "table", False),
                                           (positions, "positions", False))
        add_learned(xv, tv, pv, offset=offset, num_threads=num_threads)
        _checks.bump_written(x)  # written: its version counter, as torch does
        return x
    kern = _backend.kernels()
    if (kern is not None and type(x) is np.ndarray
            and (num_threads is None or (type(num_threads) is int and num_threads > 0))):
        # the common case, checked in C (False: nothing written, take the general
        # path, which also produces every error message)
        arr: Any = x
        off = offset if type(offset) is int else _checks.plain_int(offset)
        if kern.learned_call(arr, table, positions, off,
                             _threads.resolve(num_threads, 2 * arr.nbytes)):
            return x
    if _checks.is_tensor(table) or _checks.is_tensor(positions):
        # arrays beside a model's torch table or positions: those viewed once, then the
        # path of arrays (the compiled entry views only NumPy's)
        tv, pv = _checks.torch_tensors((table, "table", False), (positions, "positions", False))
        return add_learned(x, tv, pv, offset=offset, num_threads=num_threads)
    plan = _args.add_learned(x, table, positions=positions, offset=offset,
                             num_threads=num_threads)
    if kern is None:
        reference.run_learned(plan)
    else:
        _run(kern, plan)
    return x


def _run(kern: Any, plan: _args.LearnedPlan) -> None:
    """The validated, normalised call, through the same compiled entry."""
    threads = _threads.resolve(plan.num_threads, 2 * plan.x.nbytes)
    (table,), positions, offset = _checks.rows_read(plan.positions, plan.table)
    with _checks.kernel_views(plan.x) as (work,):
        done = kern.learned_call(work, table, positions, offset, threads)
        if not done:
            # x and the table proven apart exactly by the validator, in a way the entry's
            # bounded proof does not follow: a copy of the table is apart from x
            done = kern.learned_call(work, np.array(table), positions, offset, threads)
    if not done:
        raise _checks.entry_declined("add_learned")
