"""Real-valued coordinates that vision models rotate their patches by.

DINOv3 (Simeoni et al. 2025) rotates each patch by its centre, normalised to [-1, 1]
on both axes, so one set of frequencies serves every image size; SAM 2's memory
attention (Ravi et al. 2024) rotates by the integer (row, column) of its feature map,
the same grid for every frame held in memory; SAM 3's ViT (Carion et al. 2025) rotates
by that grid in its windowed layers and by the image's grid rescaled to a window's
extent in its global ones; EfficientLoFTR (Wang et al. 2024) by the 1-based (row,
column) of its aggregated coarse feature map. Each helper returns the coordinates as
the model's own code forms them, in float64, axis first: ``(2, tokens)`` with axis 0
the row (y) and axis 1 the column (x), ready for the embedding that
:meth:`fastpe.RotaryEmbedding.from_hf_config` builds for the model.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from . import _checks
from ._grids import MAX_TOKENS

__all__ = ["dinov3_positions", "efficientloftr_positions", "sam2_memory_positions",
           "sam3_vit_positions"]


def _tokens(names: str, *counts: int) -> None:
    """Refuse a grid of more than MAX_TOKENS positions before it is made (a larger one
    would be a MemoryError naming nothing)."""
    total = 1
    for n in counts:
        total *= n
    if total > MAX_TOKENS:
        raise ValueError(f"{names} give {total} positions, past the {MAX_TOKENS} (2**32) "
                         f"positions fastpe makes at once")


def _patches(size: object, patch: object, name: str, patch_name: str) -> int:
    n = _checks.count(size, name, minimum=1)
    if patch is None:
        return n
    # the model floors pixels / patch: a partial last patch is cropped by its convolution
    patches = n // _checks.count(patch, patch_name, minimum=1)
    if patches < 1:
        raise ValueError(f"{name}={n} pixels is smaller than one patch of {patch}")
    return patches


def _patch_sides(patch_size: object) -> tuple[object, object]:
    """(height, width) of a patch_size given as one int or, as DINOv3's config may hold
    it, a (height, width) pair."""
    if isinstance(patch_size, (tuple, list)):
        if len(patch_size) != 2:
            raise ValueError(f"patch_size must be an int or a (height, width) pair, got "
                             f"{len(patch_size)} entries")
        return patch_size[0], patch_size[1]
    return patch_size, patch_size


def dinov3_positions(height: int, width: int, *,
                     patch_size: int | tuple[int, int] | None = None) -> NDArray[np.float64]:
    """DINOv3's patch centres, ``(2, height * width)`` float64 in (-1, 1).

    ``height`` and ``width`` count patches (pixels when ``patch_size``, an int or a
    (height, width) pair as the config holds it, is given, floored to whole patches as
    the model's convolution does). Patch (i, j) of the row-major
    grid sits at ``y = 2 * (i + 0.5) / height - 1``, ``x = 2 * (j + 0.5) / width - 1``:
    row 0 of the result is y, row 1 is x, in the model's order. The prefix tokens (CLS
    and registers, ``rope.prefix_tokens`` of them) have no coordinates: the model leaves
    them unrotated, so pass ``q[:, rope.prefix_tokens:]``. Positions are the same at
    inference for every image; the random shift, jitter and rescale of the config are
    training augmentations the model applies only in training mode.
    """
    patch_h, patch_w = _patch_sides(patch_size)
    tall = isinstance(patch_size, (tuple, list))
    h = _patches(height, patch_h, "height", "patch_size[0]" if tall else "patch_size")
    w = _patches(width, patch_w, "width", "patch_size[1]" if tall else "patch_size")
    _tokens("height and width", h, w)
    # the same operations as the model (centre, divide, then 2c - 1), bit for bit in float64
    ys = 2.0 * ((np.arange(h, dtype=np.float64) + 0.5) / h) - 1.0
    xs = 2.0 * ((np.arange(w, dtype=np.float64) + 0.5) / w) - 1.0
    out = np.empty((2, h, w), dtype=np.float64)
    out[0] = ys[:, None]
    out[1] = xs[None, :]
    return out.reshape(2, h * w)


def sam2_memory_positions(height: int, width: int, *, frames: int = 1) -> NDArray[np.float64]:
    """SAM 2's memory-attention positions, ``(2, frames * height * width)`` float64.

    The (row, column) of each cell of the ``height x width`` feature map, row-major,
    repeated for each of ``frames`` memory frames: the keys of its cross-attention hold
    several frames' features with the same grid each (``rope_k_repeat``). Queries (the
    current frame) use ``frames=1``. The object-pointer tokens that follow the frames'
    keys are not rotated: pass ``k[:, :-num_object_pointer_tokens]``.
    """
    f = _checks.count(frames, "frames", minimum=1)
    _tokens("height, width and frames", _checks.count(height, "height", minimum=1),
            _checks.count(width, "width", minimum=1), f)
    return np.tile(_grid(height, width, 1.0), (1, f))


def sam3_vit_positions(height: int, width: int, *, window_size: int) -> NDArray[np.float64]:
    """SAM 3's ViT positions, ``(2, height * width)`` float64: the (row, column) of each
    patch of a ``height x width`` grid times ``window_size / width``, row-major.

    Its windowed layers use the window's own grid (``height = width = window_size``:
    integer positions); its global layers the whole image's patch grid (``rope.grid``),
    scaled so that it spans what a window spans (``rope.window_size``).
    """
    ws = _checks.count(window_size, "window_size", minimum=1)
    return _grid(height, width, ws / _checks.count(width, "width", minimum=1))


def efficientloftr_positions(height: int, width: int) -> NDArray[np.float64]:
    """EfficientLoFTR's positions, ``(2, height * width)`` float64: the 1-based (row,
    column) of each cell of its aggregated coarse map, row-major. For coarse features
    of ``H x W`` the map is ``(H - k) // s + 1`` by ``(W - k) // s + 1``, with ``k`` and
    ``s`` the config's q_aggregation_kernel_size and q_aggregation_stride
    (``rope.q_aggregation``)."""
    return _grid(height, width, 1.0) + 1.0


def _grid(height: object, width: object, scale: float) -> NDArray[np.float64]:
    h = _checks.count(height, "height", minimum=1)
    w = _checks.count(width, "width", minimum=1)
    _tokens("height and width", h, w)
    rows, cols = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64),
                             indexing="ij")
    return np.stack([rows.ravel(), cols.ravel()]) * scale
