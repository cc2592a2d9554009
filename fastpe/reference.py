"""Pure-NumPy twins of fastpe's public functions: same names, same signatures,
same validation, same results within a per-dtype tolerance.

This is both the fallback backend (``FASTPE_BACKEND=numpy``, or when the
compiled extension is missing) and the oracle the tests compare the compiled
kernels with. It favours the obvious formula over speed: angles are formed in
float64 and passed to ``np.sin``/``np.cos``; results round once to the
caller's dtype. It never calls the compiled kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from . import _args, _backend, _checks, _math, _relative_args, _relative_math, _rope_scaling
from ._rope_scaling import RopeFrequencies
from ._typing import (
    ArrayLike,
    DTypeLike,
    InPlace,
    PositionsLike,
    RopeLayout,
    ScalingDict,
    SinusoidalFrequencies,
    SinusoidalLayout,
    Style,
)

__all__ = [
    "add_alibi",
    "add_disentangled_bias",
    "add_learned",
    "add_relative_bias",
    "add_sinusoidal",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rope_cached",
    "deberta_relative_positions",
    "relative_bias",
    "relative_position_bucket",
    "rope_cos_sin",
    "rope_frequencies",
    "sinusoidal_table",
]


# ---- loops (the backend interface: plans in, arrays written) ----------------

_Loop = TypeVar("_Loop", bound=Callable[..., None])


def _ieee(loop: _Loop) -> _Loop:
    """The loop with NumPy's floating-point warnings off: infinities and NaNs in the
    caller's values (inf + -inf in an add, a NaN in a RoPE row, a sum past float16's
    range) give their IEEE results, as the compiled kernels give them, without a
    RuntimeWarning that only this backend would raise."""
    @functools.wraps(loop)
    def run(*args: Any) -> None:
        with np.errstate(all="ignore"):
            loop(*args)
    return cast(_Loop, run)


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


@_ieee
def run_sinusoidal(plan: _args.SinusoidalPlan) -> None:
    x = plan.x
    if not x.size:  # no rows, and no frequencies formed for them
        return
    width = x.shape[2] - plan.zero_tail
    pe = _sinusoidal_rows(plan.positions.as_array(x.shape[1]), plan.inv_freq, width,
                          plan.split)
    if plan.cos_first:
        half = width // 2
        pe = np.concatenate([pe[..., half:], pe[..., :half]], axis=-1)
    if plan.zero_tail:
        pe = np.concatenate([pe, np.zeros(pe.shape[:-1] + (1,))], axis=-1)
    # a half-precision table is the float32 one rounded, as the kernels make it (and as
    # models that build a float32 table and cast it hold it)
    work = _checks.compute_dtype(x.dtype)
    pe = pe.astype(work)
    if plan.accumulate:
        x[...] = x.astype(work) * work.type(plan.scale) + pe
    else:
        x[...] = pe


@_ieee
def run_learned(plan: _args.LearnedPlan) -> None:
    x = plan.x
    work = _checks.compute_dtype(x.dtype)
    rows = plan.table[plan.positions.as_array(x.shape[1])]
    x[...] = x.astype(work) + rows.astype(work)


def _rope_cos_sin(plan: _args.RopePlan, work: np.dtype,
                  pair_axis: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin, (rows, seq, 1, half) in the compute dtype, as the kernel uses them
    (multi-axis positions: by the axes `pair_axis`, default the plan's)."""
    pos = plan.positions.as_array(plan.q.shape[1])
    if plan.pair_axis is not None:
        # (axes, rows, seq) -> each pair's own axis: (rows, seq, half)
        pos = np.moveaxis(pos[plan.pair_axis if pair_axis is None else pair_axis], 0, -1)
    else:
        pos = pos[..., None]
    if plan.inv_freq is not None:
        angles = pos.astype(np.float64) * plan.inv_freq
        scale = 1.0 / plan.att if plan.inverse else plan.att
        cos = np.cos(angles) * scale
        sin = np.sin(angles) * (-scale if plan.inverse else scale)
    else:
        assert plan.cos is not None and plan.sin is not None
        cos = plan.cos[pos[..., 0]].astype(np.float64)
        sin = plan.sin[pos[..., 0]].astype(np.float64)
    cos, sin = cos.astype(work), sin.astype(work)
    if plan.inverse and plan.inv_freq is None:
        norm = cos * cos + sin * sin
        cos, sin = cos / norm, -sin / norm
    return cos[:, :, None, :], sin[:, :, None, :]


def _rotated(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool, work: np.dtype,
             cos2: np.ndarray | None = None, sin2: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x's pair halves (views of x) and their rotated values in x's dtype (rounded as
    writing them rounds), x not yet written: pairs (a, b) -> (a cos - b sin,
    b cos2 + a sin2); cos2, sin2 default to cos, sin."""
    half = cos.shape[-1]
    if neox:
        first, second = x[..., :half], x[..., half:2 * half]
    else:
        first, second = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    a, b = first.astype(work), second.astype(work)
    new_first = (a * cos - b * sin).astype(x.dtype, copy=False)
    new_second = b * (cos if cos2 is None else cos2) + a * (sin if sin2 is None else sin2)
    return first, second, new_first, new_second.astype(x.dtype, copy=False)


@_ieee
def run_rope(plan: _args.RopePlan) -> None:
    work = _checks.compute_dtype(plan.q.dtype)
    cos, sin = _rope_cos_sin(plan, work)
    cos2 = sin2 = None
    if plan.pair_axis2 is not None:
        cos2, sin2 = _rope_cos_sin(plan, work, plan.pair_axis2)
    # every value formed before any is written: a MemoryError while forming k's leaves
    # q as it was, as a refused call leaves it
    rotated = [_rotated(x, cos, sin, plan.neox, work, cos2, sin2)
               for x in (plan.q, plan.k) if x is not None]
    for first, second, new_first, new_second in rotated:
        first[...] = new_first
        second[...] = new_second


# ---- the public twins --------------------------------------------------------

@_backend.numpy_only
def sinusoidal_table(length: int, dim: int, *, base: float = 10000.0, offset: int = 0,
                     layout: SinusoidalLayout = "interleaved", dtype: DTypeLike | None = None,
                     out: np.ndarray | None = None, num_threads: int | None = None,
                     frequencies: SinusoidalFrequencies = "transformer",
                     padding_idx: int | None = None) -> np.ndarray:
    """NumPy twin of :func:`fastpe.sinusoidal_table`."""
    plan = _args.sinusoidal_table(length, dim, base=base, offset=offset, layout=layout,
                                  dtype=dtype, out=out, num_threads=num_threads,
                                  frequencies=frequencies, padding_idx=padding_idx)
    run_sinusoidal(plan)
    _checks.bump_written(out)
    return plan.x[0] if out is None else out


@_backend.numpy_only
def add_sinusoidal(x: InPlace, positions: PositionsLike = None, *, offset: int = 0,
                   base: float = 10000.0, layout: SinusoidalLayout = "interleaved",
                   scale: float = 1.0, num_threads: int | None = None,
                   frequencies: SinusoidalFrequencies = "transformer",
                   padding_idx: int | None = None) -> InPlace:
    """NumPy twin of :func:`fastpe.add_sinusoidal`."""
    run_sinusoidal(_args.add_sinusoidal(x, positions=positions, offset=offset, base=base,
                                        layout=layout, scale=scale, num_threads=num_threads,
                                        frequencies=frequencies, padding_idx=padding_idx))
    _checks.bump_written(x)
    return x


@_backend.numpy_only
def add_learned(x: InPlace, table: ArrayLike, positions: PositionsLike = None, *,
                offset: int = 0, num_threads: int | None = None) -> InPlace:
    """NumPy twin of :func:`fastpe.add_learned`."""
    run_learned(_args.add_learned(x, table, positions=positions, offset=offset,
                                  num_threads=num_threads))
    _checks.bump_written(x)
    return x


rope_frequencies = _rope_scaling.rope_frequencies


@_backend.numpy_only
def rope_cos_sin(positions: ArrayLike, freqs: RopeFrequencies | np.ndarray, *,
                 dtype: DTypeLike = "float32") -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`fastpe.rope_cos_sin`."""
    pos, freqs, dt = _args.rope_cos_sin(positions, freqs, dtype)
    return cos_sin_of(pos, freqs, dt)


def cos_sin_of(pos: np.ndarray, freqs: RopeFrequencies,
               dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """rope_cos_sin of validated positions (int64 or float64): angles in float64."""
    angles = pos[..., None].astype(np.float64) * freqs.inv_freq
    att = freqs.attention_scaling
    return (np.cos(angles) * att).astype(dt), (np.sin(angles) * att).astype(dt)


@_backend.numpy_only
def apply_rope(q: InPlace, k: Any = None, positions: PositionsLike = None, *,
               offset: int = 0, freqs: RopeFrequencies | np.ndarray | None = None,
               base: float | None = None, scaling: ScalingDict | None = None,
               rotary_dim: int | None = None, style: Style = "neox",
               layout: RopeLayout | None = None, inverse: bool = False,
               num_threads: int | None = None,
               max_position_embeddings: int | None = None) -> tuple[InPlace, Any]:
    """NumPy twin of :func:`fastpe.apply_rope`."""
    run_rope(_args.rope(q, k, positions=positions, offset=offset, rotary_dim=rotary_dim,
                        freqs=freqs, base=base, scaling=scaling,
                        max_position_embeddings=max_position_embeddings, style=style,
                        layout=_args.rope_layout(q, k, layout), inverse=inverse,
                        num_threads=num_threads))
    _checks.bump_written(q, k)
    return q, k


@_backend.numpy_only
def apply_rope_cached(q: InPlace, k: Any, cos: ArrayLike, sin: ArrayLike,
                      positions: PositionsLike = None, *, offset: int = 0, style: Style = "neox",
                      layout: RopeLayout | None = None, inverse: bool = False,
                      num_threads: int | None = None,
                      per_token: bool | None = None) -> tuple[InPlace, Any]:
    """NumPy twin of :func:`fastpe.apply_rope_cached`."""
    token_rows = np.ndim(cos) == 3 if per_token is None else _checks.flag(per_token, "per_token")
    lay = _args.rope_layout(q, k, layout)
    if token_rows:
        cos, sin, positions = _args.token_cos_sin(cos, sin, positions, offset, style)
    run_rope(_args.rope_cached(q, k, cos, sin, positions=positions, offset=offset, style=style,
                               layout=lay, inverse=inverse, num_threads=num_threads,
                               token_rows=token_rows))
    _checks.bump_written(q, k)
    return q, k


# ---- ALiBi ---------------------------------------------------------------------

@_ieee
def run_alibi(plan: _args.AlibiPlan) -> None:
    """scores (+)= slope[h] * (k_pos - q_pos), -inf where masked, the obvious way:
    the (rows, q, k) int64 distances, converted once to the compute dtype."""
    x = plan.scores
    if x.size == 0:
        return
    lead = x.shape[:-3]
    q, k = x.shape[-2:]
    # float64 storage (either byte order) computes in float64, the rest in float32
    work = np.dtype(np.float64) if x.dtype.itemsize == 8 else np.dtype(np.float32)
    qpos = (plan.q_positions if plan.q_positions is not None
            else plan.q_offset + np.arange(q, dtype=np.int64)[None])
    kpos = plan.k_positions if plan.k_positions is not None else np.arange(k)[None]
    dist = kpos[:, None, :] - qpos[:, :, None]                 # (rows, q, k)
    if plan.symmetric:
        dist = -np.abs(dist)
    bias = plan.slopes.astype(work)[:, None, None] * dist[:, None].astype(work)
    keep = None
    if plan.causal:
        keep = kpos[:, None, :] <= qpos[:, :, None]
    if plan.key_mask is not None:
        keys = plan.key_mask[:, None, :].astype(bool)
        keep = keys if keep is None else keep & keys
    value = _alibi_rows(bias, lead)
    if plan.accumulate:
        value = x.astype(work) + value
    if keep is not None:
        value = np.where(_alibi_rows(keep[:, None], lead), value, work.type(-np.inf))
    x[...] = value


def _alibi_rows(a: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    """A (rows, ...) per-sequence array in the scores' leading dims: rows is 1
    (shared: broadcast) or their product (C order)."""
    return a[0] if a.shape[0] == 1 else a.reshape(lead + a.shape[1:])


alibi_slopes = _math.alibi_slopes


@_backend.numpy_only
def alibi_bias(num_heads: int, q_len: int, k_len: int, *, slopes: ArrayLike | None = None,
               q_offset: int | None = None, causal: bool = False, symmetric: bool = False,
               dtype: DTypeLike | None = None, out: np.ndarray | None = None,
               q_positions: PositionsLike = None, k_positions: PositionsLike = None,
               key_mask: ArrayLike | None = None, max_bias: float | None = None,
               num_threads: int | None = None) -> np.ndarray:
    """NumPy twin of :func:`fastpe.alibi_bias`."""
    plan = _args.alibi_bias(num_heads, q_len, k_len, slopes=slopes, max_bias=max_bias,
                            q_offset=q_offset, causal=causal, symmetric=symmetric,
                            q_positions=q_positions, k_positions=k_positions, key_mask=key_mask,
                            dtype=dtype, out=out, num_threads=num_threads)
    run_alibi(plan)
    _checks.bump_written(out)
    return plan.scores if out is None else out


@_backend.numpy_only
def add_alibi(scores: InPlace, *, slopes: ArrayLike | None = None, q_offset: int | None = None,
              causal: bool = False, symmetric: bool = False, num_threads: int | None = None,
              q_positions: PositionsLike = None, k_positions: PositionsLike = None,
              key_mask: ArrayLike | None = None, max_bias: float | None = None) -> InPlace:
    """NumPy twin of :func:`fastpe.add_alibi`."""
    run_alibi(_args.add_alibi(scores, slopes=slopes, max_bias=max_bias, q_offset=q_offset,
                              causal=causal, symmetric=symmetric, q_positions=q_positions,
                              k_positions=k_positions, key_mask=key_mask, num_threads=num_threads))
    _checks.bump_written(scores)
    return scores


# ---- relative-position biases: T5's buckets, DeBERTa's disentangled attention --------

def _leading_rows(a: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    """A (rows, ...) per-sequence array in the scores' leading dims (rows 1: broadcast)."""
    return a[0] if a.shape[0] == 1 else a.reshape(lead + a.shape[1:])


@_ieee
def run_relative_bias(plan: _relative_args.T5Plan) -> None:
    """scores (+)= table[bucket(j - q_pos_i), h], -inf where masked: the buckets of the
    (q, k) distances gathered from the table, converted once to the compute dtype."""
    x = plan.scores
    if x.size == 0:
        return
    q, k = x.shape[-2:]
    work = _checks.compute_dtype(x.dtype)
    qpos = plan.q_offset + np.arange(q, dtype=np.int64)
    dist = np.arange(k, dtype=np.int64)[None, :] - qpos[:, None]
    buckets = _relative_math.t5_buckets(plan.spec, dist)
    # (heads, q, k): each table value, exact in float64, rounded once to the compute dtype
    bias = np.moveaxis(plan.table.astype(np.float64)[buckets], -1, 0).astype(work)
    value = x.astype(work) + bias if plan.accumulate else np.broadcast_to(bias, x.shape)
    keep = None
    if plan.causal:
        keep = np.broadcast_to((dist <= 0)[None], (1,) + dist.shape)
    if plan.key_mask is not None:
        keys = _leading_rows(plan.key_mask.astype(bool), x.shape[:-3])[..., None, None, :]
        keep = keys if keep is None else keep & keys
    if keep is not None:
        value = np.where(keep, value, work.type(-np.inf))
    x[...] = value


@_ieee
def run_disentangled_bias(plan: _relative_args.DebertaPlan) -> None:
    """scores += c2p[..., i, ci(i - j)] + p2c[..., j, pi(i - j)]: the gathers of
    transformers' disentangled_attention_bias, the sum rounded once before the add."""
    x = plan.scores
    if x.size == 0:
        return
    q, k = x.shape[-2:]
    work = _checks.compute_dtype(x.dtype)
    spec = plan.spec
    d = np.arange(q, dtype=np.int64)[:, None] - np.arange(k, dtype=np.int64)[None, :]
    t = np.clip(d, -spec.reach, spec.reach) + spec.reach
    total = None
    if plan.c2p is not None:
        ci = np.broadcast_to(spec.c2p_index[t], plan.c2p.shape[:-2] + (q, k))
        total = np.take_along_axis(plan.c2p.astype(work), ci, axis=-1)
    if plan.p2c is not None:
        # p2c's rows are keys: element (j, i) of the (k, q) gather is the term of (i, j)
        pi = np.broadcast_to(spec.p2c_index[t].T, plan.p2c.shape[:-2] + (k, q))
        p = np.swapaxes(np.take_along_axis(plan.p2c.astype(work), pi, axis=-1), -1, -2)
        total = p if total is None else total + p
    assert total is not None
    x[...] = x.astype(work) + total


@_backend.numpy_only
def relative_position_bucket(relative_position: ArrayLike, *, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """NumPy twin of :func:`fastpe.relative_position_bucket`."""
    d = _relative_args.distances(relative_position)
    spec = _relative_args.t5_settings(num_buckets, bidirectional, max_distance)
    return _relative_math.t5_buckets(spec, d)


@_backend.numpy_only
def relative_bias(table: ArrayLike, q_len: int, k_len: int, *, bidirectional: bool = True,
                  max_distance: int = 128, q_offset: int | None = None, causal: bool = False,
                  dtype: DTypeLike | None = None, out: np.ndarray | None = None,
                  num_threads: int | None = None) -> np.ndarray:
    """NumPy twin of :func:`fastpe.relative_bias`."""
    plan = _relative_args.relative_bias(table, q_len, k_len, bidirectional=bidirectional,
                                        max_distance=max_distance, q_offset=q_offset,
                                        causal=causal, dtype=dtype, out=out,
                                        num_threads=num_threads)
    run_relative_bias(plan)
    _checks.bump_written(out)
    return plan.scores if out is None else out


@_backend.numpy_only
def add_relative_bias(scores: InPlace, table: ArrayLike, *, bidirectional: bool = True,
                      max_distance: int = 128, q_offset: int | None = None,
                      causal: bool = False, key_mask: ArrayLike | None = None,
                      num_threads: int | None = None) -> InPlace:
    """NumPy twin of :func:`fastpe.add_relative_bias`."""
    run_relative_bias(_relative_args.add_relative_bias(
        scores, table, bidirectional=bidirectional, max_distance=max_distance,
        q_offset=q_offset, causal=causal, key_mask=key_mask, num_threads=num_threads))
    _checks.bump_written(scores)
    return scores


@_backend.numpy_only
def deberta_relative_positions(q_len: int, k_len: int, *, position_buckets: int = -1,
                               max_relative_positions: int = -1) -> np.ndarray:
    """NumPy twin of :func:`fastpe.deberta_relative_positions`."""
    q, k = _relative_args.deberta_lengths(q_len, k_len)
    pb = _checks.count(position_buckets, "position_buckets", minimum=None)
    mr = _checks.count(max_relative_positions, "max_relative_positions", minimum=None)
    _relative_math.deberta_check(pb, mr)
    d = _checks.new_array((q, k), np.dtype(np.int64), "q_len and k_len", "relative positions")
    np.subtract(np.arange(q, dtype=np.int64)[:, None], np.arange(k, dtype=np.int64)[None, :],
                out=d)
    return _relative_math.deberta_positions(d, pb, mr)


@_backend.numpy_only
def add_disentangled_bias(scores: InPlace, *, c2p: ArrayLike | None = None,
                          p2c: ArrayLike | None = None, position_buckets: int = -1,
                          max_relative_positions: int,
                          num_threads: int | None = None) -> InPlace:
    """NumPy twin of :func:`fastpe.add_disentangled_bias`."""
    run_disentangled_bias(_relative_args.add_disentangled_bias(
        scores, c2p=c2p, p2c=p2c, position_buckets=position_buckets,
        max_relative_positions=max_relative_positions, num_threads=num_threads))
    _checks.bump_written(scores)
    return scores
