"""Position grids of multi-axis RoPE: a prompt's M-RoPE positions, a vision tower's
patch rows and columns.

Both follow the recipe of Qwen2-VL (Wang et al. 2024, section 2.1) as transformers'
``get_rope_index`` and ``get_vision_position_ids`` lay it out (transformers 5: text after
a grid resumes past the grid's start plus its larger side, whatever its frames; other
copies of ``get_rope_index``, earlier transformers among them, resume past the grid's
largest position on any axis, which differs for a video whose frames reach further),
and return int64 arrays axis first, ready for a :class:`fastpe.RotaryEmbedding` with
``axes`` > 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from . import _checks

__all__ = ["mrope_positions", "vision_positions"]


_INT64_MAX = int(np.iinfo(np.int64).max)


def _array_like(value: object) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "__array__") or hasattr(
        value, "__array_interface__")


def _sizes(value: object, name: str) -> list[object]:
    """The entries of one grid: a sequence, or a 1-D integer array or tensor (a row of
    transformers' image_grid_thw)."""
    if _array_like(value):
        arr = np.asarray(value)
        if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
            raise TypeError(f"{name} must be (t, h, w) or (h, w) integer patch counts, got an "
                            f"array of shape {arr.shape} and dtype {arr.dtype}")
        return [int(v) for v in arr.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be (t, h, w) or (h, w) patch counts, got "
                        f"{type(value).__name__}")
    return list(value)


def _grid(value: object, name: str) -> tuple[int, int, int]:
    """(t, h, w) of a grid given as (t, h, w) or (h, w)."""
    entries = _sizes(value, name)
    if len(entries) not in (2, 3):
        raise ValueError(f"{name} must be (t, h, w) or (h, w) patch counts, got {value!r}")
    sizes: list[object] = [1, *entries] if len(entries) == 2 else entries
    return (_checks.count(sizes[0], f"{name} t", minimum=1),
            _checks.count(sizes[1], f"{name} h", minimum=1),
            _checks.count(sizes[2], f"{name} w", minimum=1))


def _fits(largest: float, name: str) -> None:
    """Refuse positions past int64, which would wrap to negative numbers."""
    if largest > _INT64_MAX:
        raise ValueError(f"{name} gives positions up to {largest:.4g}, past the int64 range "
                         f"of the result (at most 2**63 - 1)")


def _merged(grid: tuple[int, int, int], merge: int, name: str) -> tuple[int, int]:
    _, h, w = grid
    if h % merge or w % merge:
        raise ValueError(f"{name} {grid}: h and w must be multiples of spatial_merge_size "
                         f"{merge}")
    return h // merge, w // merge


# A prompt of more tokens than this is refused before its positions are made (RoPE takes
# positions below 2**32 too): a larger one would be a MemoryError naming nothing.
MAX_TOKENS = 2**32


class _Tokens:
    """The running count of a prompt's tokens, refused past MAX_TOKENS by segment."""

    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int, name: str) -> None:
        self.total += n
        if self.total > MAX_TOKENS:
            raise ValueError(f"{name} brings the tokens to {self.total}, past the "
                             f"{MAX_TOKENS} (2**32) positions fastpe makes at once")


def _frames(t: int, step: object, name: str) -> NDArray[np.int64]:
    """The temporal index of each of t frames `step` apart, as get_vision_position_ids
    forms it: arange(t) * step truncated, in integers for an int step, else in float32
    (torch's arange times a Python float or a float32 tensor), each product rounded
    to float32 before it is truncated. A 0-d array or tensor (Qwen2.5-VL holds its
    ``second_per_grid_ts`` times ``tokens_per_second`` so) counts as its value."""
    item = getattr(step, "item", None)
    if getattr(step, "ndim", None) == 0 and callable(item):
        step = item()
    if isinstance(step, (int, np.integer)) and not isinstance(step, (bool, np.bool_)):
        whole = _checks.count(step, f"{name} temporal step", minimum=1)
        _fits((t - 1) * whole, name)
        return np.arange(t, dtype=np.int64) * whole
    value = _checks.real(step, f"{name} temporal step", positive=True)
    with np.errstate(over="ignore"):
        single = np.float32(value)
        if not (np.isfinite(single) and single > 0):
            raise ValueError(f"{name} temporal step must be a positive float32 (the model "
                             f"multiplies in float32), got {step!r}")
        products = np.arange(t).astype(np.float32) * single
    _fits(float(products[-1]), name)
    return products.astype(np.int64)


def mrope_positions(segments: Sequence[int | Sequence[int]], *,
                    spatial_merge_size: int = 1) -> NDArray[np.int64]:
    """M-RoPE positions (temporal, height, width) of a prompt, shape (3, seq).

    Parameters
    ----------
    segments : sequence
        The prompt in order: an int is that many text tokens; a (t, h, w) tuple is an
        image or video of t x h x w patches (``image_grid_thw``), which the language
        model sees as t x (h / m) x (w / m) tokens after merging m x m patches. A
        video may carry a fourth entry, the temporal step between its frames
        (Qwen2.5-VL: ``tokens_per_second * second_per_grid_t``, the model's
        ``time_interval``): frame f then sits at int(f * step) past the start, the
        product rounded to float32 as the model forms it (exact for an int step).
        Pass the model's own value: its float32 ``second_per_grid_ts`` times
        ``tokens_per_second`` in float32 may differ from the same product formed
        in float64 in the last bit, and so move a frame by one.
    spatial_merge_size : int
        m, the vision tower's ``spatial_merge_size`` (2 for Qwen2-VL and its successors).

    Returns
    -------
    ndarray of int64, shape (3, seq)
        Text tokens count on from the previous position on every axis. A grid's tokens
        take frame, row and column indices (row-major, frame-major), each offset by the
        position where the grid starts; text after a grid resumes at that start plus
        max(h, w) / m (the frames do not count). This is what transformers'
        ``get_rope_index`` gives Qwen2-VL, Qwen2.5-VL, Qwen3-VL and GLM-4V prompts;
        ERNIE-4.5-VL's merges a video's frames two by two (its
        ``temporal_merge_size``): pass its grid as ``(t // 2, h, w)``.
        A Qwen3-VL video is one ``(1, h, w)`` grid per frame, with the frame's
        timestamp text tokens between them (its ``get_rope_index`` splits
        ``video_grid_thw`` so): a ``(t, h, w)`` grid takes Qwen2-VL's frame layout.

    Examples
    --------
    Qwen2-VL: 3 text tokens, an image of 4 x 6 patches (2 x 3 tokens after merging),
    then 2 text tokens:

    >>> fastpe.mrope_positions([3, (1, 4, 6), 2], spatial_merge_size=2)
    array([[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
           [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
           [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]])
    """
    merge = _checks.count(spatial_merge_size, "spatial_merge_size", minimum=1)
    if _array_like(segments) or isinstance(segments, (str, bytes)) or not isinstance(
            segments, Sequence):
        raise TypeError(f"segments must be a list of text token counts and (t, h, w) grids, "
                        f"got {type(segments).__name__}")
    # every segment checked and counted before any positions are made
    tokens = _Tokens()
    parsed: list[tuple[int, object, int, int] | int] = []
    for i, seg in enumerate(segments):
        if isinstance(seg, (int, np.integer)) and not isinstance(seg, (bool, np.bool_)):
            n = _checks.count(seg, f"segments[{i}]")
            tokens.add(n, f"segments[{i}]")
            parsed.append(n)
            continue
        entries = _sizes(seg, f"segments[{i}]")
        step = entries.pop() if len(entries) == 4 else 1
        grid = _grid(entries, f"segments[{i}]")
        h, w = _merged(grid, merge, f"segments[{i}]")
        tokens.add(grid[0] * h * w, f"segments[{i}]")
        parsed.append((grid[0], step, h, w))
    parts = []
    start = 0
    for i, made in enumerate(parsed):
        if isinstance(made, int):
            _fits(start + made - 1, f"segments[{i}]")
            parts.append(np.broadcast_to(start + np.arange(made, dtype=np.int64), (3, made)))
            start += made
            continue
        t, step, h, w = made
        frames = _frames(t, step, f"segments[{i}]")
        _fits(start + max(int(frames[-1]), h - 1, w - 1), f"segments[{i}]")
        t_idx, h_idx, w_idx = np.meshgrid(frames, np.arange(h), np.arange(w), indexing="ij")
        parts.append(start + np.stack([t_idx, h_idx, w_idx]).reshape(3, -1).astype(np.int64))
        start += max(h, w)
    if not parts:
        return np.zeros((3, 0), np.int64)
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def vision_positions(grids: Sequence[int] | Sequence[Sequence[int]], *,
                     spatial_merge_size: int = 1, offset: int = 0, cls: bool = False,
                     temporal: bool = False) -> NDArray[np.int64]:
    """A vision tower's patch positions: (row, column) of every patch, shape (2, tokens).

    Parameters
    ----------
    grids : (t, h, w) or (h, w), or a sequence of them
        The patch grid of each image (``image_grid_thw``); t frames repeat the grid.
    spatial_merge_size : int
        Patches are ordered block by block of m x m, as the towers that merge m x m
        patches afterwards order them (Qwen2-VL and successors, GLM-4V, PaddleOCR: 2);
        1 is plain row-major order (Pixtral, Llama 4). Qwen2.5-VL's tower then runs
        its blocks in window order (``get_vision_window_index``): take the positions
        in its order too, ``pos.reshape(2, -1, m * m)[:, window_index].reshape(2, -1)``.
    offset : int
        Added to every row and column (Llama 4 numbers patches from 1).
    cls : bool
        Append one class token at (0, 0) after each image's patches (Llama 4).
    temporal : bool
        Return (3, tokens) with the frame index first (MiniMax-M3's 3D vision RoPE).

    Examples
    --------
    Pixtral, an image of 2 x 3 patches:

    >>> fastpe.vision_positions((2, 3))
    array([[0, 0, 0, 1, 1, 1],
           [0, 1, 2, 0, 1, 2]])

    Qwen2-VL, 4 x 4 patches merged 2 x 2 (each block's four patches together):

    >>> fastpe.vision_positions((1, 4, 4), spatial_merge_size=2)[:, :8]
    array([[0, 0, 1, 1, 0, 0, 1, 1],
           [0, 1, 0, 1, 2, 3, 2, 3]])

    Llama 4, a 2 x 2 grid with its class token:

    >>> fastpe.vision_positions((2, 2), offset=1, cls=True)
    array([[1, 1, 2, 2, 0],
           [1, 2, 1, 2, 0]])
    """
    merge = _checks.count(spatial_merge_size, "spatial_merge_size", minimum=1)
    offset = _checks.count(offset, "offset")
    cls = _checks.flag(cls, "cls")
    temporal = _checks.flag(temporal, "temporal")
    if _array_like(grids):
        arr = np.asarray(grids)
        if arr.ndim not in (1, 2) or arr.dtype.kind not in "iu":
            raise TypeError(f"grids must be a (t, h, w) or (h, w) grid or an (n, 3) integer "
                            f"array of them (image_grid_thw), got an array of shape "
                            f"{arr.shape} and dtype {arr.dtype}")
        items: list[object] = [int(v) for v in arr] if arr.ndim == 1 else list(arr)
    elif isinstance(grids, (str, bytes)) or not isinstance(grids, Sequence):
        raise TypeError(f"grids must be a (t, h, w) or (h, w) grid, a sequence of them or an "
                        f"(n, 3) integer array (image_grid_thw), got {type(grids).__name__}")
    else:
        items = list(grids)
    if not items:
        raise ValueError("grids must hold at least one grid")
    # one grid of scalars (a float or None among them named as its entry), or grids
    single = not any(_array_like(v) or (isinstance(v, Sequence)
                                        and not isinstance(v, (str, bytes))) for v in items)
    # every grid checked and counted before any positions are made
    grids_thw = []
    tokens = _Tokens()
    for i, value in enumerate([items] if single else items):
        name = "grids" if single else f"grids[{i}]"
        t, h, w = _grid(value, name)
        _merged((t, h, w), merge, name)
        tokens.add(t * h * w + cls, name)
        _fits(max(t - 1, offset + max(h, w) - 1), "offset" if offset else name)
        grids_thw.append((t, h, w))
    parts = []
    for t, h, w in grids_thw:
        row_grid, col_grid = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        block = (h // merge, merge, w // merge, merge)
        rows = row_grid.reshape(block).transpose(0, 2, 1, 3).ravel() + offset
        cols = col_grid.reshape(block).transpose(0, 2, 1, 3).ravel() + offset
        frame = np.repeat(np.arange(t), h * w)
        grid = np.stack([frame, np.tile(rows, t), np.tile(cols, t)])
        if cls:
            grid = np.concatenate([grid, np.zeros((3, 1), grid.dtype)], axis=1)
        parts.append(grid if temporal else grid[1:])
    return np.ascontiguousarray(np.concatenate(parts, axis=1).astype(np.int64))
