"""Multi-axis rotary embeddings of Hugging Face vision-language models.

Two kinds of config need more than one position per token:

- the text models of vision-language families (Qwen2-VL and successors, GLM-4V,
  ERNIE-4.5-VL, ...) rotate by M-RoPE: (temporal, height, width) positions, each
  frequency pair on the axis its ``mrope_section`` assigns;
- the vision towers rotate patches by their (row, column) in the image grid (2D RoPE,
  ``rope_type`` "axial" in transformers 5).

:func:`layout` recognises both and says how fastpe reproduces the model, or raises
for a model it does not reproduce, so that a multi-axis model is never run as plain
one-axis RoPE by mistake.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._rope_scaling import _hf_get

# Model types whose text attention rotates by M-RoPE (the default sections their code
# fills in when the config has none are part of each family's entry once supported).
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
_VISION_MODEL_TYPES = frozenset({"pixtral", "mlcd_vision_model", "step3p5_vision"})


def _rope_dict(config: object) -> Mapping:
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


def check_supported(config: object) -> None:
    """Raise for a multi-axis model fastpe does not reproduce."""
    if is_multi_axis(config):
        model_type = _hf_get(config, "model_type")
        raise ValueError(
            f"model_type {model_type!r} rotates by more than one position per token "
            f"(M-RoPE or 2D vision RoPE), which from_hf_config does not reproduce for this "
            f"model yet; running it as one-axis RoPE would give different numbers")
