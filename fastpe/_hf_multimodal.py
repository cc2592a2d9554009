"""Multi-axis rotary embeddings of Hugging Face vision-language models.

Two kinds of config need more than one position per token:

- the text models of vision-language families (Qwen2-VL and successors, GLM-4V,
  ERNIE-4.5-VL, ...) rotate by M-RoPE: (temporal, height, width) positions, each
  frequency pair on the axis its ``mrope_section`` assigns;
- the vision towers rotate patches by their (row, column) in the image grid (2D RoPE,
  ``rope_type`` "axial" in transformers 5).

:func:`from_hf_config` recognises both and builds the embedding that reproduces the
model, or raises for a model it does not reproduce, so that a multi-axis model is never
run as plain one-axis RoPE by mistake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _args, _checks
from ._rope_scaling import _hf_get, _hf_plain, _hf_refuse, hf_rope_config, parse_rope_spec
from ._typing import Style

if TYPE_CHECKING:  # rope imports this module
    from .rope import RotaryEmbedding


class TextMRope(NamedTuple):
    """How one family's text attention lays M-RoPE out over the frequency pairs."""
    sections: tuple[int, ...]  # the mrope_section its code uses when the config has none
    scheme: str                # see _pair_axis
    style: Style               # "neox" (rotate_half) or "gptj" (adjacent pairs)


_QWEN2 = TextMRope((16, 24, 24), "contiguous", "neox")
_QWEN3 = TextMRope((24, 20, 20), "interleaved", "neox")
_QWEN35 = TextMRope((11, 11, 10), "interleaved", "neox")
_GLM4V = TextMRope((8, 12, 12), "contiguous", "gptj")
_GLM_NEOX = TextMRope((8, 12, 12), "contiguous", "neox")
_ERNIE = TextMRope((22, 22, 20), "ernie", "gptj")
_NEOMME = TextMRope((), "row_col", "neox")
_HUNYUAN = TextMRope((), "hunyuan", "neox")
_HY_V4_VL = TextMRope((24, 20, 20), "interleaved", "gptj")

# Text models with M-RoPE that fastpe reproduces, by model type (checked against each
# family's own transformers code by tests/test_mrope.py's fixtures).
TEXT_MROPE: dict[str, TextMRope] = {
    # the flat config.json of Qwen2-VL and Qwen2.5-VL checkpoints
    "qwen2_vl": _QWEN2, "qwen2_5_vl": _QWEN2,
    "qwen2_vl_text": _QWEN2, "qwen2_5_vl_text": _QWEN2,
    "qwen2_5_omni_text": _QWEN2, "qwen2_5_omni_talker": _QWEN2,
    "qwen3_omni_moe_talker_text": _QWEN3,
    "paddleocr_vl_text": _QWEN2,
    "qwen3_vl_text": _QWEN3, "qwen3_vl_moe_text": _QWEN3, "qwen3_omni_moe_text": _QWEN3,
    "cosmos3_edge_text": _QWEN3,
    "qwen3_5_text": _QWEN35, "qwen3_5_moe_text": _QWEN35, "qwen4_exp_text": _QWEN35,
    "cohere_compass_text": _QWEN3, "neomme": _NEOMME,
    "glm4v_text": _GLM4V, "glm_ocr_text": _GLM4V,
    "glm4v_moe_text": _GLM_NEOX, "glm_image_text": _GLM_NEOX,
    "ernie4_5_vl_moe_text": _ERNIE,
    "hunyuan_vl_text": _HUNYUAN,
    # multi-head latent attention with Qwen3-VL's interleaved M-RoPE on the rope part of
    # q and k, whose pairs are adjacent features
    "hy_v4_vl_text": _HY_V4_VL,
}

# Model types whose text attention rotates by M-RoPE in a way fastpe does not
# reproduce (or has not been checked against), with the reason.
UNSUPPORTED_TEXT = {
    # their towers turn the patch grid into (column + 1, row + 1) before the rotary
    # module sees it, over one [h | w] table per patch: not the 2D layout of the others
    **dict.fromkeys(("muse_glimmer_vision", "muse_spark_vision"),
                    "its vision tower feeds its rotary module its own flipped and shifted "
                    "patch coordinates, which fastpe has not been checked against"),
}

# Model types whose attention rotates by M-RoPE, supported or not, and the composite
# configs that hold such a text model (refused: the caller passes the sub-config).
MROPE_TEXT_MODEL_TYPES = frozenset({
    "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen2_5_omni",
    "qwen2_5_omni_text", "qwen2_5_omni_thinker", "qwen2_5_omni_talker", "qwen3_vl",
    "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_5", "qwen3_5_text",
    "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_omni_moe", "qwen3_omni_moe_text",
    "qwen3_omni_moe_thinker", "qwen3_omni_moe_talker_text", "qwen4_exp", "qwen4_exp_text",
    "glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "glm46v", "glm_ocr",
    "glm_ocr_text", "glm_image", "glm_image_text", "ernie4_5_vl_moe", "ernie4_5_vl_moe_text",
    "hunyuan_vl", "hunyuan_vl_text", "hy_v4_vl", "hy_v4_vl_text", "paddleocr_vl",
    "paddleocr_vl_text", "cosmos3_omni", "cosmos3_edge", "cosmos3_edge_text", "neomme",
    "minicpmv4_7", "cohere_compass", "cohere_compass_text",
})

_VISION_SUFFIXES = ("_vision", "_vision_model", "_vision_encoder")
_VISION_MODEL_TYPES = frozenset({"pixtral", "mlcd_vision_model", "step3p5_vision",
                                 "llama4_vision_model"})


def _rope_dict(config: object) -> Mapping[str, Any]:
    for name in ("rope_scaling", "rope_parameters"):
        value = _hf_get(config, name)
        if isinstance(value, Mapping):
            return value
    return {}


def is_multi_axis(config: object) -> bool:
    """Whether the config's rotary embedding takes more than one position per token."""
    rope = _rope_dict(config)
    model_type = str(_hf_get(config, "model_type") or "")
    flat = [rope] + [v for v in rope.values() if isinstance(v, Mapping)]
    return (any("mrope_section" in d or "mrope_interleaved" in d or "xdrope_section" in d
                or d.get("rope_type", d.get("type")) in ("axial", "mrope") for d in flat)
            or model_type in MROPE_TEXT_MODEL_TYPES or model_type in _VISION_MODEL_TYPES
            or model_type.endswith(_VISION_SUFFIXES))


def _pair_axis(scheme: str, sections: list[int], half: int) -> np.ndarray:
    """Axis of each frequency pair for the families' layouts.

    contiguous (Qwen2-VL, GLM-4V): runs of sections[0], [1], [2] pairs on axes 0, 1, 2;
    interleaved (Qwen3-VL): axes take turns pair by pair, each while it has pairs left;
    ernie (ERNIE-4.5-VL): height and width alternate over the first sections[0] +
    sections[1] pairs (its code pre-permutes the frequencies so that pair j keeps the
    j-th), the temporal axis takes the rest; row_col (NeoMME, two axes): row and
    column alternate pair by pair."""
    if scheme == "row_col":
        return np.arange(half, dtype=np.int8) % 2
    if len(sections) != 3:
        raise ValueError(f"mrope_section must have 3 entries (temporal, height, width), "
                         f"got {sections}")
    if scheme == "ernie":
        if sum(sections) != half:
            raise ValueError(f"mrope_section {sections} must add up to rotary_dim // 2 = "
                             f"{half}")
        if sections[0] != sections[1]:
            raise ValueError(f"ERNIE-4.5-VL pairs height with width frequencies: "
                             f"mrope_section[0] must equal mrope_section[1], got {sections}")
        return np.array([1, 2] * sections[0] + [0] * sections[2], np.int8)
    return _args.mrope_pair_axis(half, sections, scheme == "interleaved")


def _as_dict(config: object) -> dict[str, Any]:
    """The config as a new dict (callers edit it): _hf_plain's, or a plain object's
    attributes."""
    plain = _hf_plain(config)
    return dict(plain) if isinstance(plain, Mapping) else dict(vars(plain))


def _sections(value: object, name: str) -> list[int]:
    """A config's mrope_section: a list of non-negative integer pair counts, one per axis."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"config {name} must be a list of pair counts, one per axis, got "
                        f"{type(value).__name__}")
    return [_checks.count(n, f"{name}[{i}]", minimum=0) for i, n in enumerate(value)]


def text_mrope(config: object,
               layer_type: str | None) -> tuple[dict[str, Any], TextMRope, bool] | None:
    """(the config as a dict with a one-axis rope dict, for `layer_type` where the
    config has one per layer type; the family's layout; whether that dict is a layer
    type's entry) for a text model with M-RoPE that fastpe reproduces; None for any
    other model."""
    model_type = _hf_get(config, "model_type")
    family = TEXT_MROPE.get(str(model_type))
    if family is None:
        return None
    cfg = _as_dict(config)
    name = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    rope = dict(cfg.get(name) or {})
    entry = bool(rope) and all(v is None or isinstance(v, Mapping) for v in rope.values())
    if entry:
        if layer_type is None or rope.get(layer_type) is None:
            raise ValueError(f"this M-RoPE model's config {name} has one entry per layer "
                             f"type ({', '.join(map(str, rope))}); choose one with "
                             f"layer_type=")
        rope = dict(rope[layer_type])
    sections = rope.pop("mrope_section", None)
    legacy = rope.pop("xdrope_section", None)  # HunYuan-VL's older name
    sections = legacy if sections is None else sections
    rope.pop("mrope_interleaved", None)
    if sections is not None:
        sections = _sections(sections, "mrope_section" if legacy is None else "xdrope_section")
    if family.scheme == "hunyuan":
        if sections is None:
            raise ValueError(f"model_type {model_type!r}: the config has no mrope_section "
                             f"(its axes), which HunYuan-VL's rotary embedding needs")
        if rope.get("rope_type", rope.get("type")) == "xdrope":
            # the checkpoints' name, which HunYuan-VL's config class reads as "dynamic"
            rope.pop("type", None)
            rope["rope_type"] = "dynamic"
        if rope.get("rope_type") == "ntk_alpha" or (rope.get("rope_type") == "dynamic"
                                                    and rope.get("alpha")):
            # HunYuan's NTK with a fixed alpha only stretches the base (its module reads
            # "dynamic" with an alpha so, the other keys unread)
            d = _hf_get(cfg, "head_dim")
            if d is None:
                raise ValueError("HunYuan-VL's ntk_alpha RoPE needs the config's head_dim")
            d = _checks.count(d, "head_dim", minimum=4, whole_float=True)
            if rope.get("rope_theta") is None:
                # a config.json's top-level base, which the config class moves in
                rope["rope_theta"] = _hf_get(cfg, "rope_theta")
            for key in ("alpha", "rope_theta"):
                if rope.get(key) is None:
                    raise ValueError(f"HunYuan-VL's ntk_alpha RoPE needs rope parameters' "
                                     f"{key}")
            alpha = _checks.real(rope.pop("alpha"), "rope parameters' alpha", positive=True)
            theta = _checks.real(rope["rope_theta"], "rope parameters' rope_theta",
                                 positive=True)
            rope = {"rope_type": "default", "rope_theta": theta * alpha ** (d / (d - 2))}
    if rope.get("rope_type", rope.get("type")) == "mrope":
        # Qwen2-VL's original config.json; transformers reads it as default RoPE
        rope.pop("type", None)
        rope["rope_type"] = "default"
    cfg[name] = rope
    cfg["mrope_section"] = list(family.sections if sections is None else sections)
    return cfg, family, entry


# Vision towers' 2D RoPE (transformers' "axial" rope_type), by the layout of the
# per-axis frequencies over the head (see _vision_layout).
VISION: dict[str, str] = {
    **dict.fromkeys([
        "qwen2_vl_vision", "qwen2_5_vl_vision", "qwen2_5_omni_vision_encoder",
        "qwen3_vl_vision", "qwen3_vl_moe_vision", "qwen3_5_vision", "qwen3_5_moe_vision",
        "qwen3_omni_moe_vision_encoder", "qwen4_exp_vision", "glm4v_vision",
        "glm4v_moe_vision", "glm_ocr_vision", "glm5_next_vision", "paddleocr_vl_vision",
        "ernie4_5_vl_moe_vision", "cohere_compass_vision", "dots3_note_vision_encoder",
        "exaone4_5_vision", "lfm3_vl_vision", "mlcd_vision_model",
        "video_llama_3_vision"], "hw"),
    "step3p5_vision": "wh",
    "inkling2_vision": "wh_gptj",
    "llama4_vision_model": "wh_gptj",
    "kimi_k25_vision": "kimi",
    "pixtral": "pixtral",
    "minimax_m3_vl_vision": "thw",
    "gemma4_vision": "halves",
}
# The base a tower's config class gives a config.json without one, where not 10000.
VISION_THETA: dict[str, float] = {"gemma4_vision": 100.0, "lfm3_vl_vision": 1e6}


def _vision_layout(kind: str, head_dim: int) -> tuple[int, int, np.ndarray, np.ndarray, Style]:
    """(axes, width of the frequency spectrum, axis of each pair, index of each pair's
    frequency in that spectrum, style) of a vision tower's 2D (or 3D) RoPE; the rotated
    width is twice the number of pairs.

    hw (Qwen2-VL and most towers): frequencies of width head_dim / 2, the first
    head_dim / 4 pairs on the row, the next on the column, rotate_half pairing;
    wh: the same with column first; wh_gptj (Inkling 2, Llama 4): column first,
    adjacent pairs; kimi:
    column and row alternate pair by pair; pixtral: the even frequencies of a
    head_dim-wide spectrum on the row, the odd ones on the column; thw (MiniMax):
    three axes (frame, row, column) of head_dim // 3 rounded down to even each, the
    features past them untouched."""
    if kind == "thw":
        width = 2 * ((head_dim // 3) // 2)
        m = width // 2
        return 3, width, np.repeat(np.array([0, 1, 2], np.int8), m), np.tile(np.arange(m), 3), \
            "neox"
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head_dim divisible by 4, got {head_dim}")
    n = head_dim // 4
    freq = np.tile(np.arange(n), 2)
    if kind in ("hw", "wh", "wh_gptj"):
        first, second = (0, 1) if kind == "hw" else (1, 0)
        axis = np.repeat(np.array([first, second], np.int8), n)
        return 2, head_dim // 2, axis, freq, "gptj" if kind == "wh_gptj" else "neox"
    if kind == "kimi":
        return 2, head_dim // 2, np.tile(np.array([1, 0], np.int8), n), np.repeat(
            np.arange(n), 2), "neox"
    return 2, head_dim, np.repeat(np.array([0, 1], np.int8), n), np.concatenate(
        [np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2)]), "neox"


def _halves_rope(cls: type[RotaryEmbedding], head_dim: int, theta: Any) -> RotaryEmbedding:
    """Gemma 4's tower: the first half of the head rotates by the column (its x), the
    second by the row, each half with rotate_half pairing over frequencies of width
    head_dim / 2."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs a head_dim divisible by 4, got {head_dim}")
    n = head_dim // 4
    emb = cls(head_dim, base=theta)
    emb._set_layout(2, np.repeat(np.array([1, 0], np.int8), n), np.tile(np.arange(n), 2),
                    parse_rope_spec(head_dim // 2, base=theta), text_positions=False)
    emb._halves = (1, 0)
    return emb


def _vision_head_dim(config: object, model_type: str) -> int:
    """The tower's head width: head_dim, else its hidden width over its head count."""
    head_dim = _hf_get(config, "head_dim")
    if head_dim is not None:
        return _checks.count(head_dim, "head_dim", minimum=1, whole_float=True)
    width_key = "embed_dim" if model_type == "qwen2_vl_vision" else "hidden_size"
    width = _hf_get(config, width_key)
    heads_key = "num_attention_heads" if _hf_get(config, "num_attention_heads") is not None \
        else "num_heads"
    heads = _hf_get(config, heads_key)
    if width is None or heads is None:
        raise ValueError(f"config of model_type {model_type!r} has no head_dim, and no "
                         f"{width_key} and num_attention_heads to derive it from")
    width = _checks.count(width, width_key, minimum=1, whole_float=True)
    heads = _checks.count(heads, heads_key, minimum=1, whole_float=True)
    if width % heads:
        raise ValueError(f"{width_key}={width} is not a multiple of {heads_key}={heads}")
    return width // heads


def vision_rope(cls: type[RotaryEmbedding], config: object,
                style: Style | None) -> RotaryEmbedding | None:
    """The embedding of a vision tower's 2D RoPE, or None for another model."""
    model_type = str(_hf_get(config, "model_type"))
    kind = VISION.get(model_type)
    if kind is None:
        return None
    rope = _rope_dict(config)
    # the config classes read a missing or "default" type as "axial"; Llama 4's tower
    # reads only rope_theta, from a dict typed "default"
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    allowed = ("axial", "default") if model_type == "llama4_vision_model" else ("axial",)
    if rope_type not in allowed and rope_type != "default":
        raise ValueError(f"model_type {model_type!r}: its vision rotary embedding supports only "
                         f"rope_type {' or '.join(map(repr, allowed))}, got {rope_type!r}")
    # a base the rope parameters lack: the top-level key, else the class's default
    if "rope_theta" in rope and rope["rope_theta"] is None:
        raise ValueError(f"model_type {model_type!r}: its rope parameters' rope_theta is None, "
                         "which its vision rotary module cannot compute with")
    theta = rope.get("rope_theta", _hf_get(config, "rope_theta"))
    if theta is None:
        theta = VISION_THETA.get(model_type, 10000.0)
    head_dim = _vision_head_dim(config, model_type)
    if kind == "halves":
        if style not in (None, "neox"):
            raise ValueError(f"style={style!r}: Gemma 4's vision tower rotates each half of "
                             "the head with rotate_half pairing ('neox'), which fastpe does "
                             "not run another way")
        return _halves_rope(cls, head_dim, theta)
    axes, width, pair_axis, pair_freq, own_style = _vision_layout(kind, head_dim)
    emb = cls(head_dim, base=theta, rotary_dim=2 * len(pair_axis),
              style=style or own_style)
    emb._set_layout(axes, pair_axis, pair_freq, parse_rope_spec(width, base=theta),
                    text_positions=False)
    return emb


def check_supported(config: object) -> None:
    """Raise for a multi-axis model fastpe does not reproduce."""
    if is_multi_axis(config):
        model_type = _hf_get(config, "model_type")
        reason = UNSUPPORTED_TEXT.get(str(model_type))
        if reason:
            raise ValueError(f"model_type {model_type!r} is not supported: {reason}; "
                             f"fastpe's rotation would give different numbers")
        if str(model_type).endswith(_VISION_SUFFIXES) and not _rope_dict(config):
            raise ValueError(
                f"model_type {model_type!r} is a vision tower whose positional encoding "
                f"from_hf_config does not reproduce (it is not one of the 2D RoPE layouts "
                f"fastpe knows)")
        raise ValueError(
            f"model_type {model_type!r} rotates by more than one position per token "
            f"(M-RoPE or 2D vision RoPE), which from_hf_config does not reproduce for this "
            f"model yet; running it as one-axis RoPE would give different numbers")


def from_hf_config(cls: type[RotaryEmbedding], config: object, style: Style | None,
                   layer_type: str | None, part: str | None) -> RotaryEmbedding | None:
    """``cls.from_hf_config`` for multi-axis models: the embedding, None for a
    one-axis model, or a ValueError for a multi-axis model fastpe does not reproduce."""
    if is_multi_axis(config):
        # refused model types, configs without RoPE, and composite configs (a
        # vision-language model's text and vision towers rotate differently: the
        # caller picks the sub-config), as for one-axis models
        _hf_refuse(_as_dict(config), _hf_get(config, "model_type"))
        if part is not None:
            raise ValueError(f"part={part!r}: fastpe knows no second rotary module of a "
                             "multi-axis model")
    text = text_mrope(config, layer_type)
    if text is None:
        vision = vision_rope(cls, config, style)
        if vision is None:
            check_supported(config)
        return vision
    cfg, family, entry = text
    if family.scheme == "hunyuan" and style not in (None, family.style):
        raise ValueError(f"style={style!r}: HunYuan-VL's M-RoPE lays each axis over runs of "
                         "the rotate_half pairs ('neox'); fastpe does not run it another way")
    # the rope dict is flat now (RotaryEmbedding.from_hf_config checked the layers first),
    # read as the layer type's entry it was
    c = hf_rope_config(cfg, layer_type=layer_type, multi_axis=True, entry=entry)
    rope = cls(c["head_dim"], base=c["base"], scaling=c["scaling"], rotary_dim=c["rotary_dim"],
               style=style or family.style, max_position_embeddings=c["max_position_embeddings"])
    if family.scheme == "hunyuan":
        sections = [int(n) for n in cfg["mrope_section"]]
        half = rope.rotary_dim // 2
        if sum(sections) != half or min(sections) < 0:
            raise ValueError(f"mrope_section {sections} must add up to rotary_dim // 2 = "
                             f"{half}")
        # HunYuan-VL splits the whole head (cos and sin of every frequency, twice) into
        # runs of 2 * sections[i] features on axis i: the two features of a pair can
        # fall in runs of different axes
        feature_axis = np.repeat(np.arange(len(sections), dtype=np.int8),
                                 [2 * n for n in sections])
        rope._set_layout(len(sections), feature_axis[:half], None)
        rope._pair_axis2 = np.ascontiguousarray(feature_axis[half:])
        return rope
    rope.feature_slice = slice(*c["features"])
    rope._set_layout(2 if family.scheme == "row_col" else 3,
                     _pair_axis(family.scheme, cfg["mrope_section"], rope.rotary_dim // 2), None)
    return rope
