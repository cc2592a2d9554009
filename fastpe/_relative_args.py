"""Argument validation of the relative-position biases, shared by both backends.

Each function validates every argument of one public operation before anything is
written and returns a plan (the arrays as the loops read them, the parsed spec); the
rules are fastpe._checks' (TypeError for types, dtypes and read-only buffers,
ValueError for shapes and values, every message naming the argument).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from . import _args, _checks, _relative_math, _threads


class T5Plan(NamedTuple):
    scores: np.ndarray             # (..., heads, q_len, k_len): the caller's array, or out
    table: np.ndarray              # (num_buckets, heads), any supported float dtype
    spec: _relative_math.T5BucketSpec
    q_offset: int                  # position of query 0; key j is at position j
    causal: bool
    key_mask: NDArray[np.uint8] | None  # C-contiguous (1 or batch, k_len) of 0/1
    accumulate: bool               # scores += bias, else scores = bias
    num_threads: int | None


class DebertaPlan(NamedTuple):
    scores: np.ndarray             # (..., heads, q_len, k_len)
    c2p: np.ndarray | None         # (..., heads, q_len, 2 span), scores' dtype
    p2c: np.ndarray | None         # (..., heads, k_len, 2 span)
    spec: _relative_math.DebertaSpec
    num_threads: int | None


def target(scores: object, name: str) -> np.ndarray:
    x = _checks.in_place_view(scores, name)
    _checks.dtype_code(x.dtype, name)
    _checks.writable_array(x, name)
    if x.ndim < 3:
        raise ValueError(f"{name} must have at least 3 dimensions (..., heads, q_len, k_len), "
                         f"got shape {x.shape}")
    return x


def _table(table: object, heads: int | None) -> np.ndarray:
    t = _checks.array(table, "table", (2,), writable=False)
    if heads is not None and t.shape[1] != heads:
        raise ValueError(f"table must be (num_buckets, {heads}), one column per head of the "
                         f"scores (axis -3), got shape {t.shape}")
    if t.shape[0] == 0:
        raise ValueError(f"table must have at least one bucket (row), got shape {t.shape}")
    return t


def t5_settings(num_buckets: object, bidirectional: object, max_distance: object,
                buckets_name: str = "num_buckets") -> _relative_math.T5BucketSpec:
    nb = _checks.count(num_buckets, buckets_name, minimum=1)
    bi = _checks.flag(bidirectional, "bidirectional")
    md = _checks.count(max_distance, "max_distance", minimum=1)
    _relative_math.t5_check(nb, md, bi, buckets_name)
    return _relative_math.t5_spec(nb, md, bi)


def _q_offset(q_offset: object, q: int, k: int) -> int:
    if q_offset is None:
        if q > k:
            raise ValueError(f"q_len {q} > k_len {k}: the default q_offset = k_len - q_len "
                             f"(queries are the newest keys) would be negative; pass q_offset")
        return k - q
    off = _checks.count(q_offset, "q_offset")
    if q and off + q - 1 > _checks.INT64_MAX:
        raise ValueError(f"q_offset {off} + q_len {q} is past the int64 range")
    return off


def _t5_plan(x: np.ndarray, table: np.ndarray, *, bidirectional: object, max_distance: object,
             q_offset: object, causal: object, key_mask: object, accumulate: bool,
             num_threads: object, given: tuple[tuple[object, str], ...]) -> T5Plan:
    lead = x.shape[:-3]
    q, k = x.shape[-2:]
    batch = int(np.prod(lead, dtype=np.int64)) if lead else 1
    spec = t5_settings(table.shape[0], bidirectional, max_distance,
                       "table's rows (its num_buckets)")
    off = _q_offset(q_offset, q, k)
    causal = _checks.flag(causal, "causal")
    mask = None if key_mask is None else _args._alibi_key_mask(key_mask, lead, batch, k)
    threads = _threads.check(num_threads)
    _checks.disjoint(x, "scores" if accumulate else "out", *given, (key_mask, "key_mask"))
    return T5Plan(x, table, spec, off, causal, mask, accumulate, threads)


def add_relative_bias(scores: object, table: object, *, bidirectional: object,
                      max_distance: object, q_offset: object, causal: object, key_mask: object,
                      num_threads: object) -> T5Plan:
    x = target(scores, "scores")
    t = _table(table, x.shape[-3])
    return _t5_plan(x, t, bidirectional=bidirectional, max_distance=max_distance,
                    q_offset=q_offset, causal=causal, key_mask=key_mask, accumulate=True,
                    num_threads=num_threads, given=((table, "table"), (t, "table")))


def relative_bias(table: object, q_len: object, k_len: object, *, bidirectional: object,
                  max_distance: object, q_offset: object, causal: object, dtype: object,
                  out: object, num_threads: object) -> T5Plan:
    t = _table(table, None)
    q = _checks.count(q_len, "q_len")
    k = _checks.count(k_len, "k_len")
    if dtype is None and out is None:
        dtype = t.dtype.newbyteorder("=")
    x = _checks.output(out, (t.shape[1], q, k), dtype, "table's heads, q_len and k_len")
    given = ((table, "table"), (t, "table"))
    if x.dtype.itemsize == 2 and t.dtype.itemsize == 8:
        # each value rounded once to the half type: the kernels read a float64 table
        # through float32, which would round it twice (a value past the half type's
        # range is its infinity, as the float32 path gives it: no warning either way)
        with np.errstate(over="ignore"):
            t = t.astype(x.dtype.newbyteorder("="))
    return _t5_plan(x, t, bidirectional=bidirectional, max_distance=max_distance,
                    q_offset=q_offset, causal=causal, key_mask=None, accumulate=False,
                    num_threads=num_threads, given=given)


def distances(relative_position: object) -> NDArray[np.int64]:
    """Signed integer distances of any shape as int64."""
    d = _checks.as_array(relative_position, "relative_position")
    if d.dtype.kind not in "iu":
        raise TypeError(f"relative_position must be integers, got dtype {d.dtype}")
    _checks.refuse_past_int64(d, "relative_position")
    return np.asarray(d, dtype=np.int64)


def deberta_settings(position_buckets: object,
                     max_relative_positions: object) -> _relative_math.DebertaSpec:
    pb = _checks.count(position_buckets, "position_buckets", minimum=None)
    mr = _checks.count(max_relative_positions, "max_relative_positions", minimum=None)
    _relative_math.deberta_check(pb, mr)
    _relative_math.deberta_span(pb, mr)
    return _relative_math.deberta_spec(pb, mr)


def _logits(value: object, name: str, x: np.ndarray, rows: int, span: int) -> np.ndarray:
    a = _checks.array(value, name, (x.ndim,), writable=False)
    if not _checks.same_storage(a.dtype, x.dtype):
        raise TypeError(f"{name} must have the scores' dtype {x.dtype}, got {a.dtype}")
    want = x.shape[:-2] + (rows, 2 * span)
    if a.shape != want:
        what = "q_len" if name == "c2p" else "k_len"
        raise ValueError(f"{name} must have shape {want} (the scores' leading dims and heads, "
                         f"{what}, 2 * span = {2 * span}), got {a.shape}")
    return a


def add_disentangled_bias(scores: object, *, c2p: object, p2c: object,
                          position_buckets: object, max_relative_positions: object,
                          num_threads: object) -> DebertaPlan:
    x = target(scores, "scores")
    spec = deberta_settings(position_buckets, max_relative_positions)
    if c2p is None and p2c is None:
        raise ValueError("give c2p, p2c or both (the content-to-position and "
                         "position-to-content logits of pos_att_type)")
    q, k = x.shape[-2:]
    c = None if c2p is None else _logits(c2p, "c2p", x, q, spec.span)
    p = None if p2c is None else _logits(p2c, "p2c", x, k, spec.span)
    if p is not None and q != k:
        raise ValueError(
            f"p2c with q_len {q} != k_len {k}: the models' own code adds no "
            f"position-to-content term of relative positions there (DebertaV2 rebuilds "
            f"its positions key against key, build_rpos passing max_relative_positions and "
            f"position_buckets in each other's places, into a (k_len, k_len) term that does "
            f"not broadcast against (q_len, k_len) scores; DeBERTa v1's "
            f"uneven_size_corrected takes for each query the row of its (k_len, k_len) term "
            f"at the query's relative position to the first key); fastpe does not guess "
            f"what the model would add")
    threads = _threads.check(num_threads)
    # the arrays the kernel reads too: an object may convert to other memory each time
    _checks.disjoint(x, "scores", (c2p, "c2p"), (p2c, "p2c"), (c, "c2p"), (p, "p2c"))
    return DebertaPlan(x, c, p, spec, threads)


def nothing_to_add(scores: object, num_threads: object) -> None:
    """The checks of a DeBERTa call whose pos_att_type has neither logit: its bias is 0."""
    target(scores, "scores")
    _threads.check(num_threads)


def deberta_lengths(q_len: object, k_len: object) -> tuple[int, int]:
    return _checks.count(q_len, "q_len"), _checks.count(k_len, "k_len")
