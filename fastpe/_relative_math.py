"""Bucket functions of the relative-position encoders, as lookup tables built once.

T5 (Raffel et al., 2020) and its descendants map the distance ``key_pos - query_pos`` to
one of ``num_buckets`` learned biases per head: the first half of the buckets (per
direction) are exact distances, the rest grow logarithmically up to ``max_distance``.
DeBERTa-v2/v3 (He et al., 2021) maps ``query_pos - key_pos`` to a log-bucketed relative
position that indexes the content-to-position and position-to-content logits.

Both are computed by transformers in float32 (``relative_position.float()``,
``torch.log``), and the bucket is the truncation (T5) or ceiling (DeBERTa) of a float32
value, so a float64 formula would move some distances into the neighbouring bucket. The
tables here repeat the float32 steps: each division and product rounds to float32 as
torch's does, and the logarithm is the correctly rounded float32 one (float64 ``log``
of the float32 argument, rounded). torch's own float32 log (SLEEF, within 1 ulp) agrees
with it wherever a bucket depends on it at every distance below 2**18 for the families'
settings (in the fixtures, T5's 32 buckets up to 128 and DeBERTa's 256 buckets over 512
positions; against torch 2.13's log, seven more DeBERTa settings of 32 to 512 buckets
over 256 to 1024 positions). At other settings a distance whose bucket turns on the
last bit of a log can take the neighbouring bucket where torch's log is not correctly
rounded, and not only past the span: DeBERTa with 163 buckets over 485 positions
(distance 198: -121 here, -122 in torch; about 1 setting in 400 of a random sweep
differs inside the span), T5 with 1000 unidirectional buckets up to 2**21 (distance
837794); DeBERTa's standard settings first differ far past the span, where the gathers
clamp (distance 403269 with 256 buckets and 512 positions). fastpe.hf's patched DeBERTa
compares the model's own relative positions at every call and runs the stock code where
they differ.

A bucket is a monotone function of the distance that is constant past a saturation
distance, so a table up to that distance (kept read-only in a spec cached by value)
gives every bucket: distances beyond it clamp to its ends.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from ._math import frozen

# Saturation distances above this are refused rather than tabulated: no model of these
# families comes near (T5 saturates at max_distance, DeBERTa-v3 at about 512).
MAX_TABLE_DISTANCE = 1 << 22


class T5BucketSpec(NamedTuple):
    """The bucket of every distance ``d = key_pos - query_pos``: ``lut[clip(d, -reach,
    reach) + reach]`` (int32, read-only)."""

    num_buckets: int
    max_distance: int
    bidirectional: bool
    reach: int
    lut: NDArray[np.int32]


class DebertaSpec(NamedTuple):
    """DeBERTa's relative positions of ``d = query_pos - key_pos`` and the gather indices
    of the disentangled bias: ``c2p_index[clip(d, -reach, reach) + reach]`` is
    ``clamp(bucket(d) + span, 0, 2 span - 1)`` and ``p2c_index[...]`` is
    ``clamp(-bucket(-d) + span, 0, 2 span - 1)`` (both int32, read-only)."""

    position_buckets: int
    max_relative_positions: int
    span: int
    reach: int
    c2p_index: NDArray[np.int32]
    p2c_index: NDArray[np.int32]
    linear: int      # both indices are span + d for |d| <= linear (exact distances)


def _t5_magnitude_buckets(n: NDArray[np.int64], num_buckets: int,
                          max_distance: int) -> NDArray[np.int64]:
    """transformers' T5 bucket of distances n >= 0 in one direction (num_buckets is
    the count for that direction), its float32 steps repeated."""
    max_exact = num_buckets // 2
    f32 = np.float32
    with np.errstate(divide="ignore"):
        ratio = n.astype(f32) / f32(max_exact)
        log = np.log(ratio.astype(np.float64)).astype(f32)
    scaled = log / f32(math.log(max_distance / max_exact)) * f32(num_buckets - max_exact)
    large = max_exact + np.trunc(np.where(n < max_exact, 0, scaled)).astype(np.int64)
    return np.where(n < max_exact, n, np.minimum(large, num_buckets - 1))


def t5_check(num_buckets: int, max_distance: int, bidirectional: bool,
             buckets_name: str = "num_buckets") -> None:
    """Refuse settings whose buckets transformers computes from a division by zero or
    the log of a ratio <= 1 (undefined float-to-int conversions). buckets_name: what
    gave num_buckets (a table's rows)."""
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_exact < 1:
        need = 4 if bidirectional else 2
        raise ValueError(f"{buckets_name} must be at least {need} "
                         f"({'bidirectional' if bidirectional else 'unidirectional'}: "
                         f"one exact bucket per direction at least), got {num_buckets}")
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must be > {max_exact} (the exact buckets of "
                         f"{num_buckets} in all), got {max_distance}: the log buckets "
                         f"would divide by log(max_distance / {max_exact}) <= 0")
    if max_distance > MAX_TABLE_DISTANCE:
        raise ValueError(f"max_distance must be at most {MAX_TABLE_DISTANCE} (2**22: the "
                         f"bucket of every distance up to it is tabulated), got {max_distance}")


# The spec of every setting made so far, by (num_buckets, max_distance, bidirectional):
# the compiled entry (t5_call) looks a call's settings up here, and a setting not yet
# made takes the validating path, which checks it and makes it. At most T5_SPECS_KEPT:
# one past that starts the dict over.
T5_SPECS: dict[tuple[int, int, bool], T5BucketSpec] = {}
T5_SPECS_KEPT = 128


def t5_spec(num_buckets: int, max_distance: int, bidirectional: bool) -> T5BucketSpec:
    """The bucket table of validated settings (see t5_check), computed once."""
    key = (num_buckets, max_distance, bidirectional)
    spec = T5_SPECS.get(key)
    if spec is None:
        spec = _make_t5_spec(num_buckets, max_distance, bidirectional)
        if len(T5_SPECS) >= T5_SPECS_KEPT:
            T5_SPECS.clear()
        T5_SPECS[key] = spec
    return spec


def _make_t5_spec(num_buckets: int, max_distance: int, bidirectional: bool) -> T5BucketSpec:
    t5_check(num_buckets, max_distance, bidirectional)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    # past max_distance the log term exceeds the last bucket; 2x covers float32 rounding
    n = np.arange(2 * max_distance + 2, dtype=np.int64)
    mags = _t5_magnitude_buckets(n, per_direction, max_distance)
    last = per_direction - 1
    assert mags[-1] == last and np.all(np.diff(mags) >= 0)
    reach = int(np.argmax(mags == last))
    mags = mags[:reach + 1]
    toward = mags[::-1]                                  # d = -reach .. 0 (key before query)
    if bidirectional:
        after = per_direction + mags[1:]                 # d = 1 .. reach
    else:
        after = np.zeros(reach, np.int64)                # keys after the query: bucket 0
    lut = np.concatenate([toward, after]).astype(np.int32)
    return T5BucketSpec(num_buckets, max_distance, bidirectional, reach, frozen(lut))


def t5_buckets(spec: T5BucketSpec, d: NDArray[np.int64]) -> NDArray[np.int64]:
    """Buckets of an int64 array of distances key_pos - query_pos."""
    return spec.lut[np.clip(d, -spec.reach, spec.reach) + spec.reach].astype(np.int64)


def deberta_log_positions(rel: NDArray[np.int64], bucket_size: int,
                          max_position: int) -> NDArray[np.int64]:
    """transformers' DebertaV2 make_log_bucket_position of query_pos - key_pos, its
    float32 steps repeated (``abs_pos / mid``, torch.log, ceil)."""
    f32 = np.float32
    mid = bucket_size // 2
    mag = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    denominator = f32(math.log(float(f32((max_position - 1) / mid))))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # log(0) where mid == 1 (position_buckets 2 or 3): never selected below
        log = np.log((mag.astype(f32) / f32(mid)).astype(np.float64)).astype(f32)
        log_pos = np.ceil(log / denominator * f32(mid - 1)) + f32(mid)
        signed = (log_pos * np.sign(rel).astype(f32)).astype(np.int64)
    return np.where(mag <= mid, rel, signed)


def deberta_check(position_buckets: int, max_relative_positions: int) -> None:
    if position_buckets > 0 and max_relative_positions > 0:
        mid = position_buckets // 2
        if mid < 1 or max_relative_positions - 1 <= mid:
            raise ValueError(
                f"position_buckets={position_buckets} with max_relative_positions="
                f"{max_relative_positions}: DeBERTa's log buckets need position_buckets >= 2 "
                f"and max_relative_positions - 1 > position_buckets // 2 (they divide by "
                f"position_buckets // 2 and by log((max_relative_positions - 1) / "
                f"(position_buckets // 2)))")


def deberta_span(position_buckets: int, max_relative_positions: int) -> int:
    """transformers' pos_ebd_size: position_buckets when > 0, else max_relative_positions.
    A bias needs max_relative_positions >= 1 either way: DebertaV2's attention replaces a
    value < 1 by the config's max_position_embeddings before it builds any positions, so
    with position_buckets > 0 the raw value would give linear positions the model never
    uses, where it takes log buckets."""
    span = position_buckets if position_buckets > 0 else max_relative_positions
    if max_relative_positions < 1:
        role = ("the range its log buckets cover" if position_buckets > 0
                else "the span of the relative embeddings")
        raise ValueError(
            f"max_relative_positions must be >= 1: it is {role} (DebertaV2 replaces a value "
            f"< 1 by the config's max_position_embeddings: pass that); got position_buckets="
            f"{position_buckets}, max_relative_positions={max_relative_positions}")
    if span > MAX_TABLE_DISTANCE:
        name = "position_buckets" if position_buckets > 0 else "max_relative_positions"
        raise ValueError(f"{name} must be at most {MAX_TABLE_DISTANCE} (2**22: the index of "
                         f"every distance across the span is tabulated), got {span}")
    return span


def deberta_positions(rel: NDArray[np.int64], position_buckets: int,
                      max_relative_positions: int) -> NDArray[np.int64]:
    """build_relative_position's values for query_pos - key_pos: log buckets when both
    settings are > 0, else the distance itself."""
    if position_buckets > 0 and max_relative_positions > 0:
        return deberta_log_positions(rel, position_buckets, max_relative_positions)
    return rel


@functools.lru_cache(maxsize=128)
def deberta_spec(position_buckets: int, max_relative_positions: int) -> DebertaSpec:
    """The gather indices of validated settings, computed once."""
    deberta_check(position_buckets, max_relative_positions)
    span = deberta_span(position_buckets, max_relative_positions)
    # the first distance whose index is clamped in both directions, found by doubling;
    # with one exact bucket per side (position_buckets // 2 == 1) every distance from 1
    # on has bucket +-1
    one_bucket = position_buckets // 2 == 1 and max_relative_positions > 0
    reach = 2 if one_bucket else span + 1

    def at_ends(d: np.ndarray) -> np.ndarray:
        return np.clip(deberta_positions(d, position_buckets, max_relative_positions) + span,
                       0, 2 * span - 1)

    # the positions grow with the distance: where the longest reach tried below is short
    # of the ends, refuse before tabulating millions of distances
    longest = reach
    while longest <= MAX_TABLE_DISTANCE:
        longest *= 2
    ends = at_ends(np.array([-longest, longest], dtype=np.int64))
    if not one_bucket and not (ends[0] == 0 and ends[1] == 2 * span - 1):
        raise ValueError(f"position_buckets={position_buckets}, max_relative_positions="
                         f"{max_relative_positions}: the relative positions reach the ends "
                         f"of the span {span} only past distance {MAX_TABLE_DISTANCE}")
    while True:
        d = np.arange(-reach, reach + 1, dtype=np.int64)
        c2p = at_ends(d)
        if one_bucket or (c2p[0] == 0 and c2p[-1] == 2 * span - 1):
            break
        reach *= 2
    p2c = np.clip(-deberta_positions(-d, position_buckets, max_relative_positions) + span,
                  0, 2 * span - 1)
    exact = (c2p == span + d) & (p2c == span + d)
    centre = exact[reach:]                               # d = 0, 1, ...
    linear = int(np.argmin(centre & exact[reach::-1])) - 1 if not centre.all() else reach
    return DebertaSpec(position_buckets, max_relative_positions, span, reach,
                       frozen(c2p.astype(np.int32)), frozen(p2c.astype(np.int32)),
                       max(linear, -1))
