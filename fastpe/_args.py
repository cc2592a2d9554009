"""Per-operation argument normalisation, shared by both backends.

Each function here validates every argument of one public operation (see
_checks for the rules) and returns a plan: the arrays as views of the shape
the loops expect, plus the float64 parameters. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from . import _checks, _constants, _math, _rope_scaling, _threads

LAYOUTS = ("interleaved", "split", "split_cos")
SINUSOIDAL_FREQUENCIES = ("transformer", "fairseq")
# the largest scale or slope of float32 arithmetic (float32 and half inputs)
_F32_MAX = float(np.finfo(np.float32).max)


class SinusoidalPlan(NamedTuple):
    x: np.ndarray              # (batch, seq, dim) view of the caller's array
    positions: _checks.Positions
    inv_freq: NDArray[np.float64]  # float64: (ceil(dim / 2),), fairseq (dim // 2,)
    split: bool
    accumulate: bool           # x * scale + PE, else PE
    scale: float
    num_threads: int | None
    cos_first: bool = False    # split halves as [cos | sin] (MusicGen)
    zero_tail: bool = False    # fairseq's odd dim: a last column of zeros


class LearnedPlan(NamedTuple):
    x: np.ndarray              # (batch, seq, dim)
    table: np.ndarray          # (rows, dim), x's storage dtype
    positions: _checks.Positions
    num_threads: int | None


def _sinusoidal_common(dim: int, base: object, layout: object, frequencies: object,
                       rows: bool) -> tuple[np.ndarray, bool, bool, bool]:
    """(inv_freq, split, cos_first, zero_tail); no frequencies without rows to fill."""
    base = _checks.real(base, "base", positive=True)
    layout = _checks.choice(layout, "layout", LAYOUTS)
    fairseq = _checks.choice(frequencies, "frequencies", SINUSOIDAL_FREQUENCIES) == "fairseq"
    if layout == "split_cos" and not fairseq and dim % 2:
        raise ValueError(f"layout='split_cos' with an odd dim ({dim}) needs "
                         "frequencies='fairseq' (its last column is zero)")
    if not fairseq:
        return (_math.sinusoidal_inv_freq(dim, base, rows), layout != "interleaved",
                layout == "split_cos", False)
    if dim < 4:
        raise ValueError(f"frequencies='fairseq' needs dim >= 4 (it divides by dim // 2 - 1), "
                         f"got {dim}")
    return (_math.fairseq_inv_freq(dim, base, rows), layout != "interleaved",
            layout == "split_cos", dim % 2 == 1)


def _padding_shift(positions: _checks.Positions, padding_idx: object) -> _checks.Positions:
    """fairseq's rows: position p reads row padding_idx + 1 + p."""
    if padding_idx is None:
        return positions
    shift = _checks.count(padding_idx, "padding_idx") + 1
    if positions.max > _checks.INT64_MAX - shift:
        raise ValueError(f"position {positions.max} + padding_idx + 1 overflows int64")
    if positions.array is None:
        return _checks.Positions(None, positions.offset + shift, positions.max + shift)
    return _checks.Positions(positions.array + shift, 0,
                             positions.max + shift if positions.max >= 0 else -1,
                             positions.source)


def _padded(name: str, padding_idx: object) -> str:
    """The arguments that placed the rows: with padding_idx, it shifts them too."""
    return name if padding_idx is None else f"{name} with padding_idx (rows padding_idx + 1 + p)"


def sinusoidal_table(length: object, dim: object, *, base: object, offset: object,
                     layout: object, dtype: object, out: object,
                     num_threads: object, frequencies: object = "transformer",
                     padding_idx: object = None) -> SinusoidalPlan:
    length = _checks.count(length, "length")
    dim = _checks.count(dim, "dim", minimum=1)
    # the positions before the table, which a length past them would make in vain (256 GiB
    # for 2**33 rows of 8); the table before the frequencies: one past what memory holds
    # is named by its shape, not by the frequencies' size
    positions = _padding_shift(_checks.positions(None, offset, 1, length), padding_idx)
    _checks.angle_positions(positions.max, _padded("length and offset", padding_idx))
    out = _checks.output(out, (length, dim), dtype, "length and dim")
    inv_freq, split, cos_first, zero_tail = _sinusoidal_common(dim, base, layout, frequencies,
                                                               length > 0)
    return SinusoidalPlan(out[None], positions, inv_freq, split, False, 1.0,
                          _threads.check(num_threads), cos_first, zero_tail)


def add_sinusoidal(x: object, *, positions: object, offset: object, base: object,
                   layout: object, scale: object, num_threads: object, frequencies: object = "transformer",
                   padding_idx: object = None) -> SinusoidalPlan:
    x = _checks.array(x, "x", (2, 3), writable=True)
    x3 = x if x.ndim == 3 else x[None]
    inv_freq, split, cos_first, zero_tail = _sinusoidal_common(
        x3.shape[2], base, layout, frequencies, x3.shape[0] * x3.shape[1] > 0)
    scale = _checks.real(scale, "scale")
    if x.dtype != np.float64 and not abs(scale) <= _F32_MAX:
        raise ValueError(f"scale must be finite in float32, the arithmetic of {x.dtype} x "
                         f"(|scale| <= {_F32_MAX:.6g}), got {scale!r}")
    pos = _padding_shift(_checks.positions(positions, offset, x3.shape[0], x3.shape[1]),
                         padding_idx)
    _checks.angle_positions(pos.max, _padded("offset" if positions is None else "positions",
                                             padding_idx))
    _checks.disjoint(x, "x", (pos.source, "positions"))
    return SinusoidalPlan(x3, pos, inv_freq, split, True, scale, _threads.check(num_threads),
                          cos_first, zero_tail)


def add_learned(x: object, table: object, *, positions: object, offset: object,
                num_threads: object) -> LearnedPlan:
    x = _checks.array(x, "x", (2, 3), writable=True)
    x3 = x if x.ndim == 3 else x[None]
    table = _checks.array(table, "table", (2,), writable=False)
    if not _checks.same_storage(table.dtype, x.dtype):
        raise TypeError(f"table must have x's dtype {x.dtype}, got {table.dtype}")
    if table.shape[1] != x3.shape[2]:
        raise ValueError(f"table rows have {table.shape[1]} features but x has {x3.shape[2]} "
                         f"(table must be (max_len, {x3.shape[2]}))")
    pos = _checks.positions(positions, offset, x3.shape[0], x3.shape[1])
    _checks.disjoint(x, "x", (table, "table"), (pos.source, "positions"))
    if pos.max >= table.shape[0]:
        raise IndexError(f"position {pos.max} is past the end of table (max_len "
                         f"{table.shape[0]}): a learned table can't handle sequences longer "
                         f"than max_len")
    return LearnedPlan(x3, table, pos, _threads.check(num_threads))


# ---- RoPE -----------------------------------------------------------------

ROPE_LAYOUTS = {"bshd": 4, "bhsd": 4, "shd": 3}
ROPE_STYLES = ("neox", "gptj")


class RopePlan(NamedTuple):
    q: np.ndarray                  # (batch, seq, heads, head_dim) views of the callers' arrays
    k: np.ndarray | None
    positions: _checks.Positions
    neox: bool
    inv_freq: NDArray[np.float64] | None  # computed angles: float64 (rotary_dim // 2,) ...
    att: float                     # ... with cos and sin multiplied by this
    cos: np.ndarray | None         # or a (rows, rotary_dim // 2) cos/sin cache
    sin: np.ndarray | None
    inverse: bool                  # the inverse rotation: cos / att and -sin / att, or the cache's
    num_threads: int | None
    # multi-axis positions: positions.array is int64 (axes, 1 or batch, seq) and
    # pair i rotates by the position on axis pair_axis[i] (int8, (rotary_dim // 2,))
    pair_axis: np.ndarray | None = None
    # with pair_axis, the axis of each pair's second feature where the two differ
    # (HunYuan-VL: x' = x cos a - y sin a, y' = y cos b + x sin b)
    pair_axis2: np.ndarray | None = None


# the compiled kernel keeps one position per axis on the stack
MAX_AXES = _constants.MAX_AXES


def mrope_pair_axis(half: int, sections: object, interleaved: object) -> np.ndarray:
    """The axis of each of `half` frequency pairs from an M-RoPE ``mrope_section``.

    Contiguous (Qwen2-VL): the first sections[0] pairs take axis 0, the next
    sections[1] axis 1, and so on; the sections add up to the pairs. Interleaved
    (Qwen3-VL): pair i takes axis a = i % n (n axes) when a > 0 and i < n *
    sections[a], else axis 0, so each axis spans the whole frequency range (as
    in Qwen3-VL's code, sections[0] and the sum do not matter)."""
    interleaved = _checks.flag(interleaved, "mrope_interleaved")
    # ordered: a set or a dict would give the axes their counts in hash order
    if (isinstance(sections, (str, bytes, Set, Mapping)) or not hasattr(sections, "__len__")
            or not hasattr(sections, "__getitem__")):
        raise TypeError(f"mrope_section must be a sequence of counts, one per axis, got "
                        f"{type(sections).__name__}")
    counts = [_checks.count(n, "mrope_section[]") for n in sections]  # type: ignore[attr-defined]
    if not 1 <= len(counts) <= MAX_AXES:
        raise ValueError(f"mrope_section must have 1 to {MAX_AXES} entries (one per axis), "
                         f"got {len(counts)}")
    n = len(counts)
    if not interleaved:
        if sum(counts) != half:
            raise ValueError(f"mrope_section {counts} must add up to rotary_dim // 2 = {half} "
                             f"(one entry per frequency pair), got {sum(counts)}")
        return np.repeat(np.arange(n, dtype=np.int8), counts)
    pair = np.arange(half)
    axis = pair % n
    return np.where((axis > 0) & (pair < n * np.asarray(counts)[axis]), axis, 0).astype(np.int8)


def pair_axis_arg(axes: object, pair_axis: object, half: int) -> tuple[int, np.ndarray | None]:
    """(axes, int8 axis of each pair or None for one axis), validated."""
    n = _checks.count(axes, "axes", minimum=1)
    if n > MAX_AXES:
        raise ValueError(f"axes must be at most {MAX_AXES}, got {n}")
    if pair_axis is None:
        if n > 1:
            raise ValueError(f"axes={n} needs mrope_section: which frequency pairs rotate by "
                             f"which axis")
        return 1, None
    a = np.asarray(pair_axis)
    if a.dtype.kind not in "iu" or a.shape != (half,):
        raise ValueError(f"the axis of each pair must be {half} integers, got {a.dtype} "
                         f"{a.shape}")
    if a.size and (a.min() < 0 or a.max() >= n):
        raise ValueError(f"pair axes must be in [0, {n}) for axes={n}, got "
                         f"{int(a.min())}..{int(a.max())}")
    return n, np.ascontiguousarray(a, dtype=np.int8)


def _refuse_ambiguous_axes(shape: tuple[int, ...], axes: int, batch: int, seq: int) -> None:
    if len(shape) == 2 and shape == (axes, seq) and batch == axes:
        raise ValueError(f"positions of shape {shape} read both as (axes, seq) and as "
                         f"(batch, seq) text positions; pass ({axes}, 1, {seq}) for per-axis "
                         f"positions shared by the batch, ({axes}, {batch}, {seq}) for "
                         f"per-sequence ones, or a (1, {seq}) text row")


def refuse_text_positions(shape: object, axes: int, batch: int, seq: int) -> None:
    """The ValueError for positions other than one row per axis (None, text positions
    that every axis shares, another shape) given to an embedding whose model rotates
    every token by its own coordinates."""
    got = "positions=None (offset + arange(seq))" if shape is None else f"shape {shape}"
    raise ValueError(f"positions must have shape ({axes}, {seq}) or ({axes}, {batch}, {seq}), "
                     f"one row per axis (this embedding's model, a vision tower or a grid of "
                     f"coordinates, rotates each token by its own position on each axis: "
                     f"text positions that every axis shares do not apply), got {got}")


def _axis_form(shape: tuple[int, ...], axes: int, batch: int, seq: int,
               text_positions: bool) -> str | None:
    """How positions of `shape` read for an embedding of `axes` (> 1) position axes:
    "axes", one row per axis ((axes, seq), (axes, 1 or batch, seq)); "text", text
    positions that every axis shares ((seq,), (1 or batch, seq)); "row", those as one
    row ((1, 1 or batch, seq)); None for none of these. Refused: a 2-D array that reads
    both ways (batch == axes) where text positions are taken, and any other form than
    "axes" where they are not."""
    if text_positions:
        _refuse_ambiguous_axes(shape, axes, batch, seq)
    if ((len(shape) == 3 and shape[0] == axes and shape[1] in (1, batch) and shape[2] == seq)
            or shape == (axes, seq)):
        return "axes"
    if not text_positions:
        refuse_text_positions(shape, axes, batch, seq)
    if shape == (seq,) or (len(shape) == 2 and shape[0] in (1, batch) and shape[1] == seq):
        return "text"
    if len(shape) == 3 and shape[0] == 1 and shape[1] in (1, batch) and shape[2] == seq:
        return "row"
    return None


def axis_positions(positions: object, offset: object, batch: int, seq: int,
                   axes: int, text_positions: bool = True) -> tuple[_checks.Positions, bool]:
    """Positions for an embedding with `axes` position axes: (Positions, multi).

    (axes, seq) and (axes, 1 or batch, seq) are per-axis positions (multi is
    True and the array is (axes, rows, seq)); None, (seq,), (1 or batch, seq)
    and (1, 1 or batch, seq) are text positions that every axis shares (the
    M-RoPE models' rotary modules broadcast a single row over their axes),
    refused without `text_positions`. With them, a 2-D array that reads both ways
    (batch == axes) is refused."""
    if not 1 <= axes <= MAX_AXES:
        raise ValueError(f"axes must be in [1, {MAX_AXES}], got {axes}")
    if positions is None:
        if not text_positions:
            refuse_text_positions(None, axes, batch, seq)
        return _checks.positions(None, offset, batch, seq), False
    # converted once: an __array__ may return another array each time it is asked
    converted = _checks.as_array(positions, "positions")
    shape = converted.shape
    form = _axis_form(shape, axes, batch, seq, text_positions)
    if form is None:
        raise ValueError(f"positions must have shape ({axes}, {seq}) or ({axes}, {batch}, "
                         f"{seq}) (one row per axis), or ({seq},) / ({batch}, {seq}) / "
                         f"(1, {batch}, {seq}) for text tokens, got {shape}")
    if form != "axes":
        return _checks.positions(positions, offset, batch, seq,
                                 converted=converted[0] if form == "row" else converted), False
    _checks.count(offset, "offset")
    if offset:
        raise ValueError(f"give either positions or offset, not both (offset={offset})")
    pos, hi = _checks.position_array(positions, "positions", converted)
    rows = shape[1] if len(shape) == 3 else 1
    return _checks.Positions(pos.reshape(axes, rows, seq), 0, hi, converted), True


def _rope_view(x: np.ndarray, layout: str) -> np.ndarray:
    """x as a (batch, seq, heads, head_dim) view."""
    if layout == "bhsd":
        return x.transpose(0, 2, 1, 3)
    if layout == "shd":
        return x[None]
    return x


_L = TypeVar("_L")


def rope_layout(q: object, k: object, layout: _L | None) -> _L | str:
    """A call's layout: "bshd" when not given for arrays; torch tensors must give it
    (_checks.tensor_layout)."""
    if layout is not None:
        return layout
    for x, name in ((q, "q"), (k, "k")):
        if _checks.is_tensor(x):
            return _checks.tensor_layout(layout, name)
    return "bshd"


def rope_views(q: object, k: object, layout: object) -> tuple[np.ndarray, np.ndarray | None]:
    layout = _checks.choice(layout, "layout", tuple(ROPE_LAYOUTS))
    ndim = ROPE_LAYOUTS[layout]
    q = _checks.array(q, "q", (ndim,), writable=True)
    q4 = _rope_view(q, layout)
    if k is None:
        return q4, None
    if k is q:
        raise ValueError("k is q: pass k=None to rotate one array")
    k = _checks.array(k, "k", (ndim,), writable=True)
    if not _checks.same_storage(k.dtype, q.dtype):
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    k4 = _rope_view(k, layout)
    b, s, _, d = q4.shape
    if (k4.shape[0], k4.shape[1], k4.shape[3]) != (b, s, d):
        raise ValueError(f"k must match q in batch, seq and head_dim ({layout} layout): "
                         f"q {q.shape}, k {k.shape}")
    if _checks.share_memory(q, k, "q", "k"):
        raise ValueError("q and k overlap in memory; rotating one would corrupt the other")
    return q4, k4


def rope_disjoint(q4: np.ndarray, k4: np.ndarray | None, *inputs: tuple[object, str]) -> None:
    _checks.disjoint(q4, "q", *inputs)
    if k4 is not None:
        _checks.disjoint(k4, "k", *inputs)


def _rotary_dim(rotary_dim: object, head_dim: int, implied: int | None, implied_by: str) -> int:
    """The rotary width: the argument, else what `implied_by` implies, else head_dim."""
    if rotary_dim is not None:
        rd = _checks.count(rotary_dim, "rotary_dim", minimum=2)
        if rd % 2:
            raise ValueError(f"rotary_dim must be even, got {rd}")
        if rd > head_dim:
            raise ValueError(f"rotary_dim {rd} is larger than head_dim {head_dim}")
        if implied is not None and implied != rd:
            raise ValueError(f"rotary_dim={rd} contradicts {implied_by} (rotary width {implied})")
        return rd
    if implied is None:
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} is odd and RoPE rotates pairs; pass an even "
                             f"rotary_dim to rotate the leading features")
        return head_dim
    if implied > head_dim:
        raise ValueError(f"{implied_by} means rotary width {implied}, larger than head_dim "
                         f"{head_dim}")
    return implied


def frequencies_arg(freqs: object) -> _rope_scaling.RopeFrequencies:
    """`freqs`: a RopeFrequencies, or a bare 1-D array or torch tensor of inverse
    frequencies (a model's inv_freq buffer)."""
    inv_freq: object
    if isinstance(freqs, _rope_scaling.RopeFrequencies):
        inv_freq, att = freqs.inv_freq, freqs.attention_scaling
    elif isinstance(freqs, np.ndarray) or _checks.is_tensor(freqs):
        inv_freq, att = freqs, 1.0
    else:
        raise TypeError(f"freqs must be a RopeFrequencies (from rope_frequencies) or a "
                        f"1-D float array or tensor of inverse frequencies, got "
                        f"{type(freqs).__name__}")
    # a bare tensor is named as the caller gave it (its grad or device refused as freqs)
    inv_freq = _checks.as_array(inv_freq, "freqs" if inv_freq is freqs else "freqs.inv_freq")
    if not _checks.real_dtype(inv_freq.dtype):
        raise TypeError(f"freqs.inv_freq must be real numbers, got dtype {inv_freq.dtype}")
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if inv_freq.ndim != 1 or not inv_freq.size:
        raise ValueError(f"freqs.inv_freq must be a 1-D array of at least one frequency, "
                         f"got shape {inv_freq.shape}")
    if not np.isfinite(inv_freq).all():
        bad = int(np.argmin(np.isfinite(inv_freq)))
        raise ValueError(f"freqs.inv_freq must be finite, got {float(inv_freq[bad])!r} at "
                         f"index {bad}")
    att = _checks.real(att, "freqs.attention_scaling", positive=True)
    lo, hi = _rope_scaling.ATTENTION_SCALING_RANGE
    if not lo <= att <= hi:
        raise ValueError(f"freqs.attention_scaling must be in [{lo:.4g}, {hi:.4g}] (a normal "
                         f"float32: cos and sin are scaled in float32), got {att!r}")
    if np.abs(inv_freq).max() > _rope_scaling.MAX_INV_FREQ:
        raise ValueError(f"freqs.inv_freq must be at most {_rope_scaling.MAX_INV_FREQ:.3g} in "
                         f"magnitude (so that every int64 position has a finite angle), got "
                         f"{float(np.abs(inv_freq).max())!r}")
    return _rope_scaling.RopeFrequencies(inv_freq, att)


def rope_spec(head_dim: int, rotary_dim: object, base: object, scaling: object,
              max_position_embeddings: object) -> tuple[int, _rope_scaling.RopeSpec]:
    """(rotary_dim, the parsed base/scaling for that width)."""
    if isinstance(scaling, Mapping) and "partial_rotary_factor" in scaling:
        # the width is head_dim times the dict's factor
        spec = _rope_scaling.parse_rope_spec(head_dim, base=base, scaling=scaling,
                                             max_position_embeddings=max_position_embeddings)
        return _rotary_dim(rotary_dim, head_dim, spec.dim,
                           "scaling['partial_rotary_factor']"), spec
    rd = _rotary_dim(rotary_dim, head_dim, None, "")
    return rd, _rope_scaling.parse_rope_spec(rd, base=base, scaling=scaling,
                                             max_position_embeddings=max_position_embeddings)


def rope(q: object, k: object, *, positions: object, offset: object, rotary_dim: object,
         freqs: object, base: object, scaling: object, max_position_embeddings: object,
         style: object, layout: object, inverse: object, num_threads: object,
         spec: _rope_scaling.RopeSpec | None = None, spec_head_dim: int = 0,
         axes: int = 1, pair_axis: np.ndarray | None = None,
         pair_freq: np.ndarray | None = None,
         pair_axis2: np.ndarray | None = None, text_positions: bool = True) -> RopePlan:
    """Plan of apply_rope; `spec` (with its rotary_dim and the head_dim it was
    made for) comes from a RotaryEmbedding, and so do the multi-axis layout
    (`axes`, the axis of each pair, validated), `pair_freq`, the index
    of each pair's frequency among the spec's (None: pair i takes the i-th), and
    whether text positions that every axis shares are taken (axis_positions)."""
    q4, k4 = rope_views(q, k, layout)
    neox = _checks.choice(style, "style", ROPE_STYLES) == "neox"
    head_dim = q4.shape[3]
    if head_dim < 2:
        raise ValueError(f"q must have a head_dim (its last axis) of at least 2, one pair to "
                         f"rotate, got shape {q4.shape} ({layout} layout)")
    if spec is not None:
        if head_dim != spec_head_dim:
            raise ValueError(f"q has head_dim {head_dim} but this RotaryEmbedding is for "
                             f"head_dim {spec_head_dim}")
        _rotary_dim(rotary_dim, head_dim, None, "")
    elif freqs is not None:
        if base is not None or scaling is not None or max_position_embeddings is not None:
            raise ValueError("give freqs, or base/scaling/max_position_embeddings to compute "
                             "them, not both")
        given = frequencies_arg(freqs)
        _rotary_dim(rotary_dim, head_dim, 2 * given.inv_freq.size,
                    f"freqs ({given.inv_freq.size} frequencies)")
    else:
        _, spec = rope_spec(head_dim, rotary_dim, base, scaling, max_position_embeddings)
    if positions is not None:
        positions = _checks.as_array(positions, "positions")  # converted once
        if _real_valued(positions):
            return _real_positions_plan(q4, k4, positions, offset, neox, spec, given if spec
                                        is None else None, axes, pair_axis, pair_freq,
                                        pair_axis2, inverse, num_threads, text_positions)
    multi = False
    if pair_axis is None:
        pos = _checks.positions(positions, offset, q4.shape[0], q4.shape[1])
    else:
        pos, multi = axis_positions(positions, offset, q4.shape[0], q4.shape[1], axes,
                                    text_positions)
        for pairs in (pair_axis, pair_axis2):
            if multi and pairs is not None and pairs.size and int(pairs.max()) >= axes:
                raise ValueError(f"a frequency pair takes position axis {int(pairs.max())}, "
                                 f"but there are {axes} axes")
    _checks.angle_positions(pos.max, "offset" if positions is None else "positions")
    if spec is not None:
        given = spec.frequencies(pos.max + 1 if spec.depends_on_seq_len else None)
    rope_disjoint(q4, k4, (pos.source, "positions"), (given.inv_freq, "freqs"))
    att = given.attention_scaling
    inverse = _checks.flag(inverse, "inverse")
    if multi and pair_axis2 is not None and not neox:
        raise ValueError(f"style={style!r}: this embedding turns the two features of a "
                         f"rotate_half pair by different axes' angles ('neox' pairing); "
                         f"fastpe does not run it another way")
    if inverse and multi and pair_axis2 is not None:
        raise ValueError("inverse=True: this embedding turns the two features of a pair by "
                         "different angles (not a rotation), whose inverse fastpe does not "
                         "apply")
    inv_freq = given.inv_freq if pair_freq is None else given.inv_freq[pair_freq]
    return RopePlan(q4, k4, pos, neox, inv_freq, att, None, None, inverse,
                    _threads.check(num_threads), pair_axis if multi else None,
                    pair_axis2 if multi else None)


def refuse_length_dependent(spec: _rope_scaling.RopeSpec) -> None:
    """Real-valued positions have no sequence length to pick frequencies by."""
    if spec.depends_on_seq_len:
        raise ValueError(f"rope type {spec.rope_type!r} picks its frequencies by the "
                         f"sequence length max(positions) + 1, which real-valued "
                         f"positions do not have; pass integer positions")


def _real_positions_plan(q4: np.ndarray, k4: np.ndarray | None, positions: np.ndarray,
                         offset: object, neox: bool, spec: _rope_scaling.RopeSpec | None,
                         given: _rope_scaling.RopeFrequencies | None, axes: int,
                         pair_axis: np.ndarray | None, pair_freq: np.ndarray | None,
                         pair_axis2: np.ndarray | None, inverse: object,
                         num_threads: object, text_positions: bool = True) -> RopePlan:
    """The plan of a rotation by real-valued positions (DINOv3's patch centres, SAM's
    grids): each token's cos and sin formed here in float64 from the float64 angle
    position * inv_freq, then applied as a cache with one row per token."""
    batch, seq = q4.shape[0], q4.shape[1]
    if _checks.count(offset, "offset"):
        raise ValueError(f"give either positions or offset, not both (offset={offset})")
    shape = positions.shape
    if pair_axis is None:
        form = "text" if shape == (seq,) or (
            len(shape) == 2 and shape[0] in (1, batch) and shape[1] == seq) else None
    else:
        form = _axis_form(shape, axes, batch, seq, text_positions)
    if form == "row":
        positions = positions[0]    # one row: text positions every axis reads
        shape = positions.shape
    per_axis, text = form == "axes", form in ("text", "row")
    if not (per_axis or text):
        want = f"({seq},) or ({batch}, {seq})"
        if pair_axis is not None:
            want = f"({axes}, {seq}), ({axes}, {batch}, {seq}) (one row per axis), or " + want
        raise ValueError(f"positions must have shape {want}, got {shape}")
    pos = _checks.real_positions(positions, "positions")
    if spec is not None:
        refuse_length_dependent(spec)
        given = spec.frequencies()
    assert given is not None
    if per_axis and pair_axis2 is not None:
        raise ValueError("real-valued positions: this embedding turns the two features of a "
                         "pair by different angles, which fastpe applies to integer "
                         "positions only")
    rope_disjoint(q4, k4, (positions, "positions"), (given.inv_freq, "freqs"))
    inv_freq = given.inv_freq if pair_freq is None else given.inv_freq[pair_freq]
    if per_axis:
        assert pair_axis is not None
        rows = pos.reshape(axes, shape[1] if len(shape) == 3 else 1, seq)
        angles = np.moveaxis(rows[pair_axis.astype(np.intp)], 0, -1) * inv_freq
    else:
        angles = pos.reshape(shape[0] if len(shape) == 2 else 1, seq)[..., None] * inv_freq
    att = given.attention_scaling
    n = angles.shape[0] * seq
    cos = (np.cos(angles) * att).reshape(n, inv_freq.size)
    sin = (np.sin(angles) * att).reshape(n, inv_freq.size)
    rows_pos = np.arange(n, dtype=np.int64).reshape(angles.shape[0], seq)
    return RopePlan(q4, k4, _checks.Positions(rows_pos, 0, n - 1), neox, None, 1.0,
                    cos, sin, _checks.flag(inverse, "inverse"), _threads.check(num_threads))


def rope_cached(q: object, k: object, cos: object, sin: object, *, positions: object,
                offset: object, style: object, layout: object, inverse: object,
                num_threads: object, token_rows: bool = False) -> RopePlan:
    """token_rows: cos and sin were a row per token (token_cos_sin), positions theirs."""
    q4, k4 = rope_views(q, k, layout)
    if token_rows:
        rows = positions.shape if isinstance(positions, np.ndarray) else (0, -1)
        if not (rows[1] == q4.shape[1] and rows[0] in (1, q4.shape[0])):
            raise ValueError(f"cos and sin lined up with the tokens must have a row per token "
                             f"of q, (1 or {q4.shape[0]}, {q4.shape[1]}) rows for its (batch, "
                             f"seq), got ({rows[0]}, {rows[1]})")
    neox = _checks.choice(style, "style", ROPE_STYLES) == "neox"
    cos = _checks.array(cos, "cos", (2,), writable=False)
    sin = _checks.array(sin, "sin", (2,), writable=False)
    if not _checks.same_storage(cos.dtype, sin.dtype):
        raise TypeError(f"cos and sin must have the same dtype, got {cos.dtype} and {sin.dtype}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {cos.shape} and {sin.shape}")
    if cos.shape[1] == 0:
        raise ValueError(f"cos and sin must have at least one column (rotary_dim // 2), got "
                         f"shape {cos.shape}")
    _rotary_dim(None, q4.shape[3], 2 * cos.shape[1], f"cos (width {cos.shape[1]})")
    pos = _checks.positions(positions, offset, q4.shape[0], q4.shape[1])
    rope_disjoint(q4, k4, (pos.source, "positions"), (cos, "cos"), (sin, "sin"))
    if pos.max >= cos.shape[0]:
        raise IndexError(f"position {pos.max} is past the end of the cos/sin cache "
                         f"({cos.shape[0]} rows)")
    return RopePlan(q4, k4, pos, neox, None, 1.0, cos, sin,
                    _checks.flag(inverse, "inverse"),
                    _threads.check(num_threads))


def token_cos_sin(cos: object, sin: object, positions: object, offset: object,
                  style: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """transformers' cos and sin, one row per token with each frequency's value twice,
    as a (rows, rotary_dim // 2) cache and the positions of q's tokens in it."""
    if positions is not None or _checks.count(offset, "offset"):
        raise ValueError("cos and sin lined up with the tokens (one row per token, as "
                         "transformers' rotary modules return them) take no positions or "
                         "offset")
    neox = _checks.choice(style, "style", ROPE_STYLES) == "neox"
    halves = []
    for x, name in ((cos, "cos"), (sin, "sin")):
        a = _checks.as_array(x, name)
        _checks.dtype_code(a.dtype, name)
        if a.ndim not in (2, 3) or a.shape[-1] % 2 or not a.shape[-1]:
            raise ValueError(f"{name} lined up with the tokens must be (batch, seq, "
                             f"rotary_dim) or (seq, rotary_dim) with an even rotary_dim, "
                             f"got shape {a.shape}")
        half = a.shape[-1] // 2
        first, second = (a[..., :half], a[..., half:]) if neox else (a[..., 0::2], a[..., 1::2])
        # the same bits (a compiled pass, which a decode call's NumPy checks took 15x the
        # time of), else equal values (a zero of either sign held twice)
        bits = np.dtype(f"u{a.itemsize}")
        if (not _checks.repeated_halves(a, neox)
                and not ((first == second) | (first.view(bits) == second.view(bits))).all()):
            raise ValueError(f"{name} does not hold each frequency's value twice as "
                             f"style={style!r} pairs features ("
                             + ("both halves equal, transformers' cat((freqs, freqs))"
                                if neox else "adjacent features equal") +
                             "): pass rows of rope_cos_sin with positions instead")
        halves.append(first[None] if a.ndim == 2 else first)
    c, s = halves
    if c.shape != s.shape:
        raise ValueError(f"cos and sin must have the same shape, got {c.shape[:-1]} rows "
                         f"of {c.shape[-1]} and {s.shape[:-1]} of {s.shape[-1]} frequencies")
    rows, seq = c.shape[0], c.shape[1]
    pos = np.arange(rows * seq, dtype=np.int64).reshape(rows, seq)
    return c.reshape(rows * seq, c.shape[-1]), s.reshape(rows * seq, s.shape[-1]), pos


def rope_cos_sin(positions: object, freqs: object,
                 dtype: object) -> tuple[np.ndarray, _rope_scaling.RopeFrequencies, np.dtype]:
    """(positions of any shape: C-contiguous int64, or float64 for real-valued ones,
    the call's own copy; frequencies; output dtype)."""
    freqs = frequencies_arg(freqs)
    dt = _checks.float_dtype(dtype, "dtype")
    return table_positions(positions)[0], freqs, dt


def _real_valued(positions: np.ndarray) -> bool:
    """Whether RoPE positions are real-valued (NumPy's float dtypes); bfloat16 ones are
    refused by name: they hold whole positions exactly only up to 256. Other dtypes than
    integers and floats (bool, complex, strings, objects) are refused naming both."""
    if positions.dtype.name == "bfloat16":
        raise TypeError("positions must be integers, or real-valued in one of NumPy's float "
                        "dtypes, got dtype bfloat16 (it holds whole numbers exactly only "
                        "up to 256)")
    if positions.dtype.kind not in "iuf":
        raise TypeError(f"positions must be integers, or real-valued in one of NumPy's float "
                        f"dtypes, got dtype {positions.dtype}")
    return positions.dtype.kind == "f"


def table_positions(positions: object) -> tuple[np.ndarray, int | None]:
    """The positions of a cos/sin table, of any shape, the call's own copy: C-contiguous
    int64 and the largest (-1 when empty), or float64 for real-valued ones and None."""
    converted = _checks.as_array(positions, "positions")
    if _real_valued(converted):
        return _checks.real_positions(converted, "positions"), None
    pos, hi = _checks.position_array(positions, "positions", converted)
    _checks.angle_positions(hi, "positions")
    return pos, hi


# ---- ALiBi ----------------------------------------------------------------

class AlibiPlan(NamedTuple):
    scores: np.ndarray             # (..., heads, q_len, k_len): the caller's array (or out)
    batch: int                     # prod(scores.shape[:-3]): rows of the flattened leading dims
    slopes: NDArray[np.float64]    # float64 (heads,), C-contiguous, finite
    q_positions: NDArray[np.int64] | None  # int64 C-contiguous (1 or batch, q_len), or None ...
    q_offset: int                  # ... for q_offset + i
    k_positions: NDArray[np.int64] | None  # int64 C-contiguous (1 or batch, k_len), or None for j
    key_mask: NDArray[np.uint8] | None  # uint8 C-contiguous (1 or batch, k_len) of 0/1, or None
    causal: bool
    symmetric: bool
    accumulate: bool               # scores += bias, else scores = bias
    num_threads: int | None


def _alibi_slopes_arg(slopes: object, max_bias: object, heads: int,
                      empty: bool) -> NDArray[np.float64]:
    """Slopes for `heads` heads: the given ones, checked, else the paper's (none for
    `empty` scores, which any head count may have)."""
    if slopes is None:
        mb = 8.0 if max_bias is None else _checks.real(max_bias, "max_bias", positive=True)
        return _math.cached_alibi_slopes(0 if empty else heads, mb)
    if max_bias is not None:
        raise ValueError("give slopes, or max_bias to compute them, not both")
    s = _checks.as_array(slopes, "slopes")
    if not _checks.real_dtype(s.dtype):
        raise TypeError(f"slopes must be real numbers, got dtype {s.dtype}")
    if s.ndim != 1 or s.shape[0] != heads:
        raise ValueError(f"slopes must have shape ({heads},), one per head of the scores "
                         f"(axis -3), got shape {s.shape}")
    s = np.array(s, dtype=np.float64)  # the call's own: read without the GIL
    if not np.isfinite(s).all():
        raise ValueError(f"slopes must be finite, got {s[~np.isfinite(s)][0]!r} "
                         f"at head {int(np.argmin(np.isfinite(s)))}")
    return s


def _per_sequence(value: object, name: str, lead: tuple[int, ...], batch: int,
                  length: int, what: str) -> int:
    """A per-sequence array as (rows, length) with rows 1 (shared) or batch.

    Accepted shapes: (length,) shared by every sequence; (1, length); (batch,
    length) with batch the leading dims of the scores flattened in C order;
    or those leading dims themselves followed by length."""
    shape = np.shape(value)  # type: ignore[call-overload]
    ok = (shape == (length,) or (len(shape) == 2 and shape[0] in (1, batch)
                                 and shape[1] == length)
          or (len(lead) > 1 and shape == lead + (length,)))
    if not ok:
        forms = [f"({length},)", f"(1, {length})"]
        if batch != 1:
            forms.append(f"({batch}, {length})")
        if len(lead) > 1:
            forms.append(str(lead + (length,)))
        raise ValueError(f"{name} must have shape {' or '.join(forms)} ({what}; batch = "
                         f"the scores' leading dims {lead} flattened), got {shape}")
    return 1 if len(shape) == 1 or (len(shape) == 2 and shape[0] == 1) else batch


def _alibi_positions(value: object, name: str, lead: tuple[int, ...], batch: int,
                     length: int) -> np.ndarray:
    converted = _checks.as_array(value, name)
    rows = _per_sequence(converted, name, lead, batch, length, f"{length} positions")
    pos, _ = _checks.position_array(value, name, converted)
    return pos.reshape(rows, length)


def _alibi_key_mask(value: object, lead: tuple[int, ...], batch: int,
                    length: int) -> np.ndarray:
    m = _checks.as_array(value, "key_mask")
    rows = _per_sequence(m, "key_mask", lead, batch, length,
                            f"one flag per key, {length} keys")
    # the call's own copy, in row order whatever the caller's layout (a transposed or
    # broadcast mask, as transformers' expand() makes, keeps its order through astype)
    if m.dtype.kind == "b":
        return np.array(m, dtype=np.uint8, order="C").reshape(rows, length)
    if m.dtype.kind not in "iu":
        raise TypeError(f"key_mask must be booleans (or integers 0/1; True = attend), got "
                        f"dtype {m.dtype}")
    m = np.array(m)  # the call's own, checked: another thread may rewrite the caller's
    if m.size and not ((m == 0) | (m == 1)).all():
        raise ValueError("key_mask must hold only 0 and 1 (1 = a real key to attend to, "
                         "0 = padding)")
    return np.array(m, dtype=np.uint8, order="C").reshape(rows, length)


def _alibi_target(scores: object, name: str) -> np.ndarray:
    """An in-place target as an ndarray view: supported dtype, writable, no
    overlapping elements."""
    x = _checks.in_place_view(scores, name)
    _checks.dtype_code(x.dtype, name)
    _checks.writable_array(x, name)
    return x


def _alibi_plan(scores: np.ndarray, *, slopes: object, max_bias: object, q_offset: object,
                causal: object, symmetric: object, q_positions: object, k_positions: object,
                key_mask: object, accumulate: bool, num_threads: object) -> AlibiPlan:
    lead = scores.shape[:-3]
    heads, q, k = scores.shape[-3:]
    batch = 1
    for n in lead:
        batch *= n
    slope_values = _alibi_slopes_arg(slopes, max_bias, heads, scores.size == 0)
    if (_checks.compute_dtype(scores.dtype) != np.float64 and slope_values.size and not
            np.abs(slope_values).max() <= _F32_MAX):
        head = int(np.argmax(np.abs(slope_values) > _F32_MAX))
        raise ValueError(f"slopes must be finite in float32, the arithmetic of "
                         f"{scores.dtype} scores (|slope| <= {_F32_MAX:.6g}), got "
                         f"{slope_values[head]!r} at head {head}")
    causal = _checks.flag(causal, "causal")
    symmetric = _checks.flag(symmetric, "symmetric")
    num_threads = _threads.check(num_threads)
    offset = None if q_offset is None else _checks.count(q_offset, "q_offset")
    if offset is not None and q_positions is not None:
        raise ValueError(f"give either q_positions or q_offset, not both (q_offset={offset})")
    mask = None if key_mask is None else _alibi_key_mask(key_mask, lead, batch, k)
    kpos = qpos = None
    if k_positions is not None:
        kpos = _alibi_positions(k_positions, "k_positions", lead, batch, k)
    elif mask is not None:
        # BLOOM's positions of a padded batch: real keys count 0, 1, 2, ...;
        # padding gets 0 (it is masked anyway)
        kpos = (np.cumsum(mask, axis=1, dtype=np.int64) - 1) * mask
    if q_positions is not None:
        qpos = _alibi_positions(q_positions, "q_positions", lead, batch, q)
    elif kpos is not None:
        # query i is the token at key index q_offset + i: it takes that key's position
        off = k - q if offset is None else offset
        if k == 0:  # no keys: nothing to add, any query positions do
            qpos = np.zeros((1, q), np.int64)
        elif off < 0 or off + q > k:
            raise ValueError(
                f"q_offset must be in [0, k_len - q_len] = [0, {k - q}] when query positions "
                f"come from the keys' (k_positions or key_mask); got "
                f"{off if offset is not None else f'q_len {q} > k_len {k}'}; "
                f"pass q_positions")
        else:
            qpos = np.ascontiguousarray(kpos[:, off:off + q])
    else:
        if offset is None:
            if q > k > 0:
                raise ValueError(f"q_len {q} > k_len {k}: the default q_offset = k_len - "
                                 f"q_len (queries are the newest keys) would be negative; "
                                 f"pass q_offset (e.g. 0) or q_positions")
            offset = max(k - q, 0)
        if q and offset + q - 1 > _checks.INT64_MAX:
            raise ValueError(f"q_offset {offset} + q_len {q} is past the int64 range")
    name = "scores" if accumulate else "out"
    _checks.disjoint(scores, name, (slopes, "slopes"), (q_positions, "q_positions"),
                     (k_positions, "k_positions"), (key_mask, "key_mask"))
    return AlibiPlan(scores, batch, slope_values, qpos, offset or 0, kpos, mask,
                     causal, symmetric, accumulate, num_threads)


def add_alibi(scores: object, *, slopes: object, max_bias: object, q_offset: object,
              causal: object, symmetric: object, q_positions: object, k_positions: object,
              key_mask: object, num_threads: object) -> AlibiPlan:
    scores = _alibi_target(scores, "scores")
    if not 3 <= scores.ndim <= _constants.VIEW_DIMS:
        raise ValueError(f"scores must have 3 to {_constants.VIEW_DIMS} dimensions (up to "
                         f"{_constants.VIEW_DIMS - 3} leading dims, heads, q_len, k_len), "
                         f"got shape {scores.shape}")
    return _alibi_plan(scores, slopes=slopes, max_bias=max_bias, q_offset=q_offset,
                       causal=causal, symmetric=symmetric, q_positions=q_positions,
                       k_positions=k_positions, key_mask=key_mask, accumulate=True,
                       num_threads=num_threads)


def alibi_bias(num_heads: object, q_len: object, k_len: object, *, slopes: object,
               max_bias: object, q_offset: object, causal: object, symmetric: object,
               q_positions: object, k_positions: object, key_mask: object, dtype: object,
               out: object, num_threads: object) -> AlibiPlan:
    heads = _checks.count(num_heads, "num_heads")
    q = _checks.count(q_len, "q_len")
    k = _checks.count(k_len, "k_len")
    out = _checks.output(out, (heads, q, k), dtype, "num_heads, q_len and k_len")
    return _alibi_plan(out, slopes=slopes, max_bias=max_bias, q_offset=q_offset,
                       causal=causal, symmetric=symmetric, q_positions=q_positions,
                       k_positions=k_positions, key_mask=key_mask, accumulate=False,
                       num_threads=num_threads)
