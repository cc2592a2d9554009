"""Rotary embeddings of transformers models that rotate by real-valued coordinates.

DINOv3's ViT and the models built on its backbone (EoMT-DINOv3, Sapiens 2) rotate each
patch by its centre normalised to [-1, 1] (``fastpe.dinov3_positions``); the memory
attention of SAM 2's video model, SAM 3's tracker and EdgeTAM rotates by the (row,
column) of its feature map (``fastpe.sam2_memory_positions``), SAM 3's ViT by its patch
grid, rescaled in its global layers (``fastpe.sam3_vit_positions``); EfficientLoFTR by
its coarse feature map's cells (``fastpe.efficientloftr_positions``). Each loader
here reads what that model's own transformers 5.25 code reads from the config and
builds the :class:`fastpe.RotaryEmbedding` that reproduces its rotary module and apply
function; tests/data/make_hf_realrope_reference.py checks them against that code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._hf_multimodal import _vision_layout
from ._rope_scaling import MAX_SPEC_INV_FREQ, _hf_get, _hf_plain, parse_rope_spec
from ._typing import Style

if TYPE_CHECKING:  # rope imports this module
    from .rope import RotaryEmbedding

__all__ = ["LOADERS", "from_hf_config"]


def _head_dim(config: Mapping[str, Any], model_type: str, hidden: str, *divisors: str,
              defaults: Mapping[str, int] | None = None) -> int:
    """hidden // (product of divisors) as the model's rotary module computes it (a
    head_dim key, if any, is not read by that code), divisible by 4: two axes of
    rotated pairs. ``defaults``: what the config class fills in for a missing key."""
    keys = (hidden, *divisors)
    values = [config.get(key, (defaults or {}).get(key)) for key in keys]
    if not all(type(v) is int and v > 0 for v in values):
        raise ValueError(f"config of model_type {model_type!r} needs positive ints "
                         f"{', '.join(keys[:-1])} and {keys[-1]}, got "
                         f"{', '.join(map(repr, values))}")
    head_dim = int(values[0]) // math.prod(int(v) for v in values[1:])
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"model_type {model_type!r}: {hidden} // ({' * '.join(divisors)}) = "
                         f"{head_dim} must be a positive multiple of 4 (two axes of rotated "
                         f"pairs)")
    return head_dim


# The families whose rotary module reads rope_parameters: each config class's default
# base and the rope_type it reads "default" as (SAM's "axial").
_CLASS_ROPE = {
    "eomt_dinov3": (100.0, "default"),
    "sam2_video": (10000.0, "axial"),
    "sam3_tracker_video": (10000.0, "axial"),
    "edgetam_video": (10000.0, "axial"),
    "sam3_vit_model": (10000.0, "axial"),
    "efficientloftr": (10000.0, "default"),
}
# What the config classes of DINOv3 and the models on its backbone fill in.
_CLASS_REGISTERS = {"dinov3_vit": 0, "eomt_dinov3": 4, "sapiens2": 8}


def _class_rope(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The rope parameters the family's config class makes of ``config`` (transformers'
    convert_rope_params_to_dict and standardize_rope_params): rope_scaling before
    rope_parameters; a base they lack from a top-level rope_theta, else the class's
    default; a missing type "default", read as the class's own (SAM's "axial");
    EfficientLoFTR's partial factor 4 where neither gives one. The SAM video classes'
    deprecated memory_attention_rope_theta is set after, so it wins. Another type than
    the class's own is a ValueError: the only one fastpe reproduces for these families."""
    default_theta, default_type = _CLASS_ROPE[model_type]
    given = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"model_type {model_type!r}: rope_parameters must be a dict, got "
                         f"{given!r}")
    rope = dict(given)
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", config.get("rope_theta", default_theta))
    if model_type == "efficientloftr":
        rope.setdefault("partial_rotary_factor", config.get("partial_rotary_factor", 4.0))
    if rope["rope_type"] == "default":
        rope["rope_type"] = default_type
    if rope["rope_type"] != default_type:
        raise ValueError(f"model_type {model_type!r}: fastpe's loader supports only rope_type "
                         f"{default_type!r} in rope_parameters, got {rope['rope_type']!r}")
    if model_type.endswith("_video") and "memory_attention_rope_theta" in config:
        # set through the class's setter, None included (its rotary module then fails)
        rope["rope_theta"] = config["memory_attention_rope_theta"]
    return rope


def _theta(config: Mapping[str, Any], model_type: str, default: float) -> float:
    """rope_theta where the model's code reads it: the top-level key (DINOv3, Sapiens
    2), or for the families of _CLASS_ROPE ``config`` is their _class_rope."""
    theta = config.get("rope_theta", default)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"model_type {model_type!r}: rope_theta must be a positive number, "
                         f"got {theta!r}")
    return float(theta)


def _dinov3(cls: type[RotaryEmbedding], config: Mapping[str, Any], model_type: str,
            style: Style | None) -> RotaryEmbedding:
    """DINOv3 (Simeoni et al. 2025): angle ``2 pi * c * theta^(-4j / head_dim)`` for j <
    head_dim / 4, the first head_dim / 4 pairs (rotate_half) on the patch centre's y,
    the next on its x; CLS and register tokens in front are not rotated. The random
    shift, jitter and rescale of the coordinates run only in training mode, so
    inference ignores pos_embed_shift / pos_embed_jitter / pos_embed_rescale."""
    head_dim = _head_dim(config, model_type, "hidden_size", "num_attention_heads")
    # the model's torch.arange(0, 1, 4 / head_dim) has ceil(1 / (4 / head_dim)) entries in
    # float64: one too many where that quotient rounds up past head_dim / 4 (196, 392, ...)
    count = math.ceil(1.0 / (4.0 / head_dim))
    if count != head_dim // 4:
        raise ValueError(f"model_type {model_type!r} with head_dim {head_dim}: its code forms "
                         f"torch.arange(0, 1, 4 / {head_dim}), {count} frequencies where the "
                         f"head holds {head_dim // 4} per axis, and fails on them")
    if model_type in _CLASS_ROPE:
        theta = _theta(_class_rope(config, model_type), model_type, 100.0)
    else:
        theta = _theta(config, model_type, 100.0)
    axes, width, pair_axis, pair_freq, own_style = _vision_layout("hw", head_dim)
    emb = cls(head_dim, base=theta, style=style or own_style)
    # the 2 pi of the angle folded into the frequencies: a linear scaling divides by
    # its factor, so 1 / (2 pi) multiplies each theta^(-4j / head_dim) by 2 pi
    highest = 2.0 * math.pi * max(1.0, theta ** -(1.0 - 4.0 / head_dim))
    if highest > MAX_SPEC_INV_FREQ:
        raise ValueError(f"model_type {model_type!r}: rope_theta={theta!r} below 1 gives "
                         f"frequencies up to {highest:.4g} rad per unit of position (2 pi "
                         f"theta^(-4j / head_dim)), past the {MAX_SPEC_INV_FREQ:g} fastpe "
                         f"computes exactly: fastpe does not reproduce it")
    spec = parse_rope_spec(width, base=theta,
                           scaling={"rope_type": "linear", "factor": 1.0 / (2.0 * math.pi)})
    emb._set_layout(axes, pair_axis, pair_freq, spec, text_positions=False)
    registers = config.get("num_register_tokens", _CLASS_REGISTERS[model_type])
    if isinstance(registers, bool) or not isinstance(registers, int) or registers < 0:
        raise ValueError(f"model_type {model_type!r}: num_register_tokens must be an int >= 0, "
                         f"got {registers!r}")
    emb.prefix_tokens = 1 + registers
    return emb


def _positive_ints(config: Mapping[str, Any], model_type: str, key: str,
                   default: list[int]) -> list[int]:
    value = config.get(key, default)
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(type(v) is int and v > 0 for v in value)):
        raise ValueError(f"model_type {model_type!r}: {key} must be two positive ints "
                         f"(width, height), got {value!r}")
    return list(value)


def _gptj_columns_first(cls: type[RotaryEmbedding], head_dim: int, theta: float,
                        style: Style | None) -> RotaryEmbedding:
    axes, width, pair_axis, pair_freq, own_style = _vision_layout("wh_gptj", head_dim)
    emb = cls(head_dim, base=theta, style=style or own_style)
    emb._set_layout(axes, pair_axis, pair_freq, parse_rope_spec(width, base=theta),
                    text_positions=False)
    return emb


def _sam2_memory(cls: type[RotaryEmbedding], config: Mapping[str, Any], model_type: str,
                 style: Style | None) -> RotaryEmbedding:
    """The memory attention of SAM 2 (Ravi et al. 2024) and its successors: heads of
    memory_attention_hidden_size / (downsample_rate * num_attention_heads) features,
    frequencies theta^(-4j / head_dim) for j < head_dim / 4, adjacent pairs, the first
    head_dim / 4 on the column and the next on the row of the feature map. The same
    embedding serves its self-attention (``grid`` from memory_attention_rope_feat_sizes,
    given as (width, height)) and its cross-attention to the memory, whose keys hold
    that grid once per frame and then the object pointers, which are not rotated.
    EdgeTAM's keys are grouped per memory frame, each group's first tokens (temporal)
    unrotated and the rest on ``key_grid`` (memory_attention_rope_k_sizes)."""
    rope = _class_rope(config, model_type)
    theta = _theta(rope, model_type, 10000.0)
    head_dim = _head_dim(config, model_type, "memory_attention_hidden_size",
                         "memory_attention_downsample_rate",
                         "memory_attention_num_attention_heads",
                         defaults={"memory_attention_hidden_size": 256,
                                   "memory_attention_downsample_rate": 1,
                                   "memory_attention_num_attention_heads": 1})
    emb = _gptj_columns_first(cls, head_dim, theta, style)
    cols, rows = _positive_ints(config, model_type, "memory_attention_rope_feat_sizes",
                                [72, 72] if model_type == "sam3_tracker_video" else [64, 64])
    emb.grid = (rows, cols)
    if model_type == "edgetam_video":
        key_cols, key_rows = _positive_ints(config, model_type,
                                            "memory_attention_rope_k_sizes", [16, 16])
        emb.key_grid = (key_rows, key_cols)
    return emb


def _sam3_vit(cls: type[RotaryEmbedding], config: Mapping[str, Any], model_type: str,
              style: Style | None) -> RotaryEmbedding:
    """SAM 3's ViT: SAM 2's memory-attention rotation (frequencies theta^(-4j /
    head_dim), adjacent pairs, column first) over hidden_size / num_attention_heads
    features, on the window's patch grid in windowed layers and on the image's
    (``grid``) times window_size / columns in the global_attn_indexes layers."""
    rope = _class_rope(config, model_type)
    head_dim = _head_dim(config, model_type, "hidden_size", "num_attention_heads",
                         defaults={"hidden_size": 1024, "num_attention_heads": 16})
    if config.get("head_dim") not in (None, head_dim):
        raise ValueError(f"model_type {model_type!r}: head_dim={config['head_dim']!r} differs "
                         f"from hidden_size // num_attention_heads = {head_dim}, which its "
                         "attention uses")
    emb = _gptj_columns_first(cls, head_dim, _theta(rope, model_type, 10000.0), style)
    # the model's grid: rows from image_size[1] // patch_size[1], columns from index 0
    image = _pair(config, model_type, "image_size", 1008)
    patch = _pair(config, model_type, "patch_size", 14)
    grid = (image[1] // patch[1], image[0] // patch[0])
    if min(grid) < 1:
        raise ValueError(f"model_type {model_type!r}: image_size {image} is smaller than one "
                         f"patch of {patch}")
    emb.grid = grid
    window = config.get("window_size", 24)
    if type(window) is not int or window < 1:
        raise ValueError(f"model_type {model_type!r}: window_size must be a positive int, got "
                         f"{window!r}")
    emb.window_size = window
    return emb


def _pair(config: Mapping[str, Any], model_type: str, key: str, default: int) -> list[int]:
    value = config.get(key, default)
    if type(value) is int:
        value = [value, value]
    return _positive_ints({key: value}, model_type, key, [])


def _efficientloftr(cls: type[RotaryEmbedding], config: Mapping[str, Any], model_type: str,
                    style: Style | None) -> RotaryEmbedding:
    """EfficientLoFTR (Wang et al. 2024): its coarse transformer rotates the whole
    hidden_size vector of a token before it splits it into heads, adjacent pairs,
    pair 2m by the row and pair 2m + 1 by the column, both at theta^(-2m / dim) with
    dim = head_dim * partial_rotary_factor, which its code needs to be hidden_size / 2.
    Pass q as (batch, tokens, 1, hidden_size): ``rope.head_dim`` is hidden_size."""
    rope = _class_rope(config, model_type)
    theta = _theta(rope, model_type, 10000.0)
    hidden = config.get("hidden_size", 256)
    heads = config.get("num_attention_heads", 8)
    if not (type(hidden) is int and type(heads) is int and hidden > 0 and heads > 0
            and hidden % 4 == 0):
        raise ValueError(f"config of model_type {model_type!r} needs positive ints "
                         f"hidden_size (divisible by 4) and num_attention_heads, got "
                         f"{hidden!r} and {heads!r}")
    head_dim = config.get("head_dim") or hidden // heads
    factor = rope["partial_rotary_factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or \
            int(head_dim * factor) != hidden // 2:
        raise ValueError(f"model_type {model_type!r}: head_dim * partial_rotary_factor = "
                         f"{head_dim} * {factor!r} must be hidden_size / 2 = {hidden // 2}: "
                         "its code gives one frequency per row-column pair of hidden_size")
    n = hidden // 4
    emb = cls(hidden, base=theta, style=style or "gptj")
    emb._set_layout(2, np.tile(np.array([0, 1], np.int8), n), np.repeat(np.arange(n), 2),
                    parse_rope_spec(hidden // 2, base=theta), text_positions=False)
    aggregation = (config.get("q_aggregation_kernel_size", 4),
                   config.get("q_aggregation_stride", 4))
    if not all(type(v) is int and v > 0 for v in aggregation):
        raise ValueError(f"model_type {model_type!r}: q_aggregation_kernel_size and "
                         f"q_aggregation_stride must be positive ints, got {aggregation}")
    emb.q_aggregation = aggregation
    return emb


Loader = Callable[[type["RotaryEmbedding"], Mapping[str, Any], str, "Style | None"],
                  "RotaryEmbedding"]

LOADERS: dict[str, Loader] = {
    "dinov3_vit": _dinov3,
    # EoMT's last num_blocks layers also put num_queries query tokens in front, which
    # its apply function leaves unrotated like the CLS and register tokens
    "eomt_dinov3": _dinov3,
    "sapiens2": _dinov3,
    "sam2_video": _sam2_memory,
    "sam3_tracker_video": _sam2_memory,
    "edgetam_video": _sam2_memory,
    "sam3_vit_model": _sam3_vit,
    "efficientloftr": _efficientloftr,
}


def from_hf_config(cls: type[RotaryEmbedding], config: object, style: Style | None,
                   layer_type: str | None, given_dict: bool) -> RotaryEmbedding | None:
    """The embedding of a model that rotates by real-valued coordinates, or None for
    any other model. given_dict: whether the caller gave a dict (config.json), which
    the model's config class would read, rather than the config object it made."""
    model_type = _hf_get(config, "model_type")
    loader = LOADERS.get(model_type) if isinstance(model_type, str) else None
    if loader is None:
        return None
    if layer_type is not None:
        raise ValueError(f"model_type {model_type!r} has one rotary embedding for every "
                         f"layer: layer_type={layer_type!r} does not apply")
    plain = _hf_plain(config)
    if not isinstance(plain, Mapping):
        plain = dict(vars(plain))
    if model_type == "sam3_tracker_video" and given_dict:
        plain = {**plain, "memory_attention_rope_feat_sizes": _sam3_tracker_map(plain)}
    return loader(cls, plain, model_type, style)


def _sam3_tracker_map(config: Mapping[str, Any]) -> list[int]:
    """The memory feature map SAM 3's tracker config class makes of a config.json: it
    sets image_size (default 1008) last, and that sets the map to image_size //
    the vision backbone's patch_size (default 14) per side, whatever the dict says."""
    image = config.get("image_size", 1008)
    backbone = (config.get("vision_config") or {}).get("backbone_config") or {}
    patch = backbone.get("patch_size", 14) if isinstance(backbone, Mapping) else None
    if not (type(image) is int and type(patch) is int and image >= patch > 0):
        raise ValueError(f"model_type 'sam3_tracker_video': its memory feature map is "
                         f"image_size // vision_config.backbone_config.patch_size, which "
                         f"needs positive ints with image_size >= patch_size, got "
                         f"{image!r} and {patch!r}")
    return [image // patch, image // patch]
