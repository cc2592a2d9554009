"""ALiBi: attention with linear biases (Press et al., 2022).

No position embedding at all: each head h subtracts ``slope_h * distance``
from the attention scores, ``bias[h, i, j] = -slope_h * (q_pos_i - k_pos_j)``,
so attention decays with distance at a per-head rate. BLOOM and MPT use it.

Positions: by default key j is at position j and query i at ``q_offset + i``,
with ``q_offset = k_len - q_len`` (the queries are the newest tokens, as in
decode with a KV cache). Padded and batched calls give per-sequence
``q_positions`` / ``k_positions`` and a ``key_mask``; see :func:`add_alibi`.

The slopes are float64 math (:func:`alibi_slopes`); the loops add the bias
in place in one pass, the causal and padding masks fused into it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _args, _backend, _checks, _math, _threads, reference
from ._math import alibi_slopes
from ._typing import ArrayLike, DTypeLike, InPlace, PositionsLike

__all__ = ["add_alibi", "alibi_bias", "alibi_slopes"]

def _run(plan: _args.AlibiPlan) -> None:
    """The validated, normalised call, through the same compiled entry."""
    kern = _backend.kernels()
    if kern is None:
        reference.run_alibi(plan)
        return
    if plan.scores.size == 0:  # nothing to write (nor default slopes made for it)
        return
    threads = _threads.resolve(plan.num_threads,
                               plan.scores.nbytes * (2 if plan.accumulate else 1))
    with _checks.kernel_views(plan.scores) as (work,):
        done = kern.alibi_call(work, plan.slopes, plan.q_positions,
                               None if plan.q_positions is not None else plan.q_offset,
                               plan.k_positions, plan.key_mask, plan.causal, plan.symmetric,
                               plan.accumulate, threads)
    if not done:
        raise _checks.entry_declined("ALiBi")


def _fast_max_bias(max_bias: object, slopes: object) -> float | None:
    """A given max_bias for the compiled entry's default slopes: a positive finite
    number of Python's or NumPy's types, without slopes (the validating path refuses
    both), else None."""
    mb = _checks.plain_real(max_bias)
    return mb if slopes is None and mb is not None and 0 < mb < math.inf else None


def alibi_bias(num_heads: int, q_len: int, k_len: int, *, slopes: ArrayLike | None = None,
               q_offset: int | None = None, causal: bool = False, symmetric: bool = False,
               dtype: DTypeLike | None = None, out: np.ndarray | None = None,
               q_positions: PositionsLike = None, k_positions: PositionsLike = None,
               key_mask: ArrayLike | None = None, max_bias: float | None = None,
               num_threads: int | None = None) -> np.ndarray:
    """The (num_heads, q_len, k_len) ALiBi bias: ``slope_h * (k_pos_j - q_pos_i)``.

    Parameters
    ----------
    num_heads, q_len, k_len : int
        Heads, queries (rows) and keys (columns).
    slopes : array of float, optional
        One finite slope per head; default :func:`alibi_slopes` (num_heads,
        max_bias), the paper's.
    q_offset : int, optional
        Position of query 0 (key j is at position j); default k_len - q_len,
        the queries being the last q_len keys. A ValueError when q_len > k_len
        and no q_offset is given.
    causal : bool
        -inf where a key comes after the query (k_pos_j > q_pos_i).
    symmetric : bool
        Use ``-slope_h * |q_pos_i - k_pos_j|`` (bidirectional encoders).
    dtype : dtype, optional
        float32 (the default), float64, float16 or bfloat16 (with ml_dtypes);
        with ``out``, out's dtype, which a given dtype must match.
    out : ndarray, optional
        A writable (num_heads, q_len, k_len) array to fill (and return)
        instead of a new one.
    q_positions, k_positions, key_mask : optional
        As in :func:`add_alibi`, shared by every sequence: shape (q_len,) /
        (k_len,) or (1, len).
    max_bias : float, optional
        For the default slopes (8 when not given): MosaicML's MPT code reads it from
        its config's alibi_bias_max; transformers' MptModel always uses 8.
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``.

    Each value is one rounding of the slope (rounded to float32, or float64 for
    float64 output) times the exact integer distance while that distance is exact in
    the type (below 2**24 for float32, 2**53 for float64): exact to float32 and
    float64 output precision. A longer distance is rounded to the type first, as the
    models' float32 arithmetic rounds it (under two units in the last place).
    float16 and bfloat16 tables hold that float32 value rounded
    to their type, as BLOOM's ``build_alibi_tensor`` forms its bias in float32 and
    then casts it (in rare near-ties one unit in the last place from a single
    rounding of the exact product).

    >>> fastpe.alibi_bias(2, 1, 4, dtype="float64")   # one query, at position 3
    array([[[-0.1875    , -0.125     , -0.0625    ,  0.        ]],
    <BLANKLINE>
           [[-0.01171875, -0.0078125 , -0.00390625,  0.        ]]])
    """
    kern = _backend.kernels()
    most = _checks.COMPILED_TABLE_ELEMENTS
    if (kern is not None and type(num_heads) is int
            and type(q_len) is int and type(k_len) is int
            and 0 <= num_heads <= most and 0 <= q_len <= most and 0 <= k_len <= most
            and num_heads * q_len * k_len <= most
            and (num_threads is None or (type(num_threads) is int and num_threads > 0))):
        # a decode step's bias through the compiled entry, as add_alibi's (False: nothing
        # written, the validating path runs the call or names what is wrong)
        mb = 8.0 if max_bias is None else _fast_max_bias(max_bias, slopes)
        off = q_offset if q_offset is None or type(q_offset) is int else _checks.plain_int(
            q_offset)
        bias = None if mb is None else _checks.compiled_output(
            out, dtype, (num_heads, q_len, k_len), np.dtype(np.float32))
        if bias is not None and kern.alibi_call(
                bias, _math.cached_alibi_slopes(num_heads, mb) if slopes is None else slopes,
                q_positions, off, k_positions, key_mask, causal, symmetric, False,
                _threads.resolve(num_threads, bias.nbytes)):
            return bias
    plan = _args.alibi_bias(num_heads, q_len, k_len, slopes=slopes, max_bias=max_bias,
                            q_offset=q_offset, causal=causal, symmetric=symmetric,
                            q_positions=q_positions, k_positions=k_positions, key_mask=key_mask,
                            dtype=dtype, out=out, num_threads=num_threads)
    _run(plan)
    _checks.bump_written(out)
    return plan.scores if out is None else out


def add_alibi(scores: InPlace, *, slopes: ArrayLike | None = None, q_offset: int | None = None,
              causal: bool = False, symmetric: bool = False, num_threads: int | None = None,
              q_positions: PositionsLike = None, k_positions: PositionsLike = None,
              key_mask: ArrayLike | None = None, max_bias: float | None = None) -> InPlace:
    """``scores += slope_h * (k_pos_j - q_pos_i)`` in place, in one pass; returns scores.

    ``-inf`` replaces the score of every masked key: ``causal=True`` masks
    keys after the query (k_pos_j > q_pos_i), ``key_mask`` masks padding.

    Parameters
    ----------
    scores : ndarray
        Attention scores (..., heads, q_len, k_len), written in place (and
        returned): an ndarray, or an array viewed in place through DLPack or
        the buffer protocol; any float dtype (float16/32/64, bfloat16 with
        ml_dtypes), any strides and byte order. The leading dims (none, or
        batch, or several, up to 5) are the sequences: flattened in C order
        they are the ``batch`` rows that per-sequence arguments index.
    slopes : array of float, optional
        One finite slope per head (axis -3); default :func:`alibi_slopes`
        (heads, max_bias).
    q_offset : int, optional
        Position of query 0 when q_positions is not given; default
        k_len - q_len (the queries are the last q_len keys, as in decode).
    causal, symmetric : bool
        As in :func:`alibi_bias`.
    q_positions, k_positions : array of int, optional
        Per-sequence positions (>= 0) of the queries and keys, of shape
        (len,) shared by every sequence, (1, len), (batch, len), or the
        leading dims followed by len. Default: key j is at position j; query
        i is the token at key index q_offset + i and takes that key's position
        (so with k_positions alone the queries follow them).
    key_mask : array of bool or 0/1, optional
        Which keys are real tokens (Hugging Face's ``attention_mask``: 1 =
        attend, 0 = padding); shapes as k_positions. Masked keys get -inf (a row with
        every key masked softmaxes to NaN, where transformers adds a finite minimum).
        When k_positions is not given, the key positions come from the mask
        as BLOOM derives them, ``(cumsum(mask) - 1) * mask``: a left-padded
        sequence's real tokens are at 0, 1, 2, ... whatever the padding.
        Rows of padding queries are not meaningful.
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``; small calls run serially.
    max_bias : float, optional
        For the default slopes (8 when not given): MosaicML's MPT code reads it from
        its config's alibi_bias_max; transformers' MptModel always uses 8.

    softmax is unchanged by a constant per row, so this equals BLOOM's form
    ``scores + slope_h * k_pos_j`` (with its causal mask) after softmax.

    In an attention layer::

        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim)   # (b, h, q, k)
        fastpe.add_alibi(scores, causal=True, key_mask=attention_mask)
    """
    if type(scores) is not np.ndarray and _checks.is_tensor(scores):
        # a model's own torch tensors: viewed once, then the path of NumPy arrays
        sv, slopes, q_positions, k_positions, key_mask = _checks.torch_tensors(
            (scores, "scores", True), (slopes, "slopes", False),
            (q_positions, "q_positions", False), (k_positions, "k_positions", False),
            (key_mask, "key_mask", False))
        add_alibi(sv, slopes=slopes, q_offset=q_offset, causal=causal, symmetric=symmetric,
                  num_threads=num_threads, q_positions=q_positions, k_positions=k_positions,
                  key_mask=key_mask, max_bias=max_bias)
        _checks.bump_written(scores)  # written: its version counter, as torch does
        return scores
    kern = _backend.kernels()
    if (kern is not None and type(scores) is np.ndarray
            and (num_threads is None or (type(num_threads) is int and num_threads > 0))):
        # the compiled entry checks the call in C (False: nothing written, take the
        # validating path, which also produces every error message)
        x: Any = scores
        mb = 8.0 if max_bias is None else _fast_max_bias(max_bias, slopes)
        if x.ndim >= 3 and x.size and mb is not None:
            sl = _math.cached_alibi_slopes(x.shape[-3], mb) if slopes is None else slopes
            off = q_offset if q_offset is None or type(q_offset) is int else _checks.plain_int(
                q_offset)
            if kern.alibi_call(x, sl, q_positions, off, k_positions, key_mask, causal,
                               symmetric, True, _threads.resolve(num_threads, 2 * x.nbytes)):
                return scores
    if any(_checks.is_tensor(v) for v in (slopes, q_positions, k_positions, key_mask)):
        # arrays beside a model's torch mask or positions: those viewed once, then the
        # path of arrays (the compiled entry views only NumPy's)
        slopes, q_positions, k_positions, key_mask = _checks.torch_tensors(
            (slopes, "slopes", False), (q_positions, "q_positions", False),
            (k_positions, "k_positions", False), (key_mask, "key_mask", False))
        return add_alibi(scores, slopes=slopes, q_offset=q_offset, causal=causal,
                         symmetric=symmetric, num_threads=num_threads, q_positions=q_positions,
                         k_positions=k_positions, key_mask=key_mask, max_bias=max_bias)
    _run(_args.add_alibi(scores, slopes=slopes, max_bias=max_bias, q_offset=q_offset,
                         causal=causal, symmetric=symmetric, q_positions=q_positions,
                         k_positions=k_positions, key_mask=key_mask, num_threads=num_threads))
    return scores
