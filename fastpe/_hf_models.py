"""How each transformers model family applies its 1-D text RoPE: one table, model type -> convention.

A Hugging Face config holds the numbers (base, scaling, head width) but not always the
convention: several families pair adjacent features with no flag for it, rotate only the
rope part of an MLA head, rotate the last features instead of the first, or rotate the
other way. This table holds what the config cannot say, read from each family's modeling
code in transformers 5.24 and checked against it (tests/data/make_hf_zoo_reference.py).

A model type that is not in the table loads as Llama does (rotate_half pairing, the
leading ``head_dim * partial_rotary_factor`` features), which is what transformers does
for a custom model that copies Llama's attention. Model types listed with a reason in
``REFUSED`` raise instead: their encoding is not a 1-D text RoPE that fastpe reproduces.
Multi-axis RoPE (M-RoPE text models, vision towers) is recognised before this table is
read, in :mod:`fastpe._hf_multimodal`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["MODELS", "REFUSED", "Convention", "convention"]


@dataclass(frozen=True)
class Convention:
    """What a model family's attention does with its rotary embedding.

    Attributes
    ----------
    style : {"neox", "gptj"} or None
        The pairing: "neox" pairs feature j with j + rotary_dim / 2 (rotate_half),
        "gptj" pairs 2j with 2j + 1 (rotate-every-two, view_as_complex,
        repeat_interleave). None: the config's ``rope_interleave`` flag decides,
        ``interleave`` being its value when the config omits it.
    interleave : bool
        The default of ``rope_interleave`` where ``style`` is None.
    width_key : str or None
        Config key of the rotated width when it is not ``head_dim`` (MLA:
        "qk_rope_head_dim"). The embedding's head_dim is then that width.
    offset_key : str or None
        Config key of the number of features before the rotated ones in the model's
        query head (MLA: "qk_nope_head_dim"; q is [nope | rope]).
    trailing : bool
        Partial rotary on the last ``rotary_dim`` features of the head (DeepSeek-V4)
        rather than the first.
    inverse : bool
        The family rotates by -angle (its rotate_half is [x2, -x1]).
    base_keys : tuple of str
        Config keys of the base after the rope dict's and the top-level ``rope_theta``.
    mscale : bool
        Phi-3.5-MoE: longrope's cos and sin are multiplied by the dict's
        ``short_mscale`` / ``long_mscale`` instead of the attention factor.
    ignored : tuple of str
        Config keys the family's rotary module does not read although fastpe reads
        them for others (MiniMax-M3's text model keeps a ``rotary_dim`` beside its
        rope dict's ``partial_rotary_factor``).
    requires : tuple of (str, str)
        Config settings without which the model does not rotate at all (conformer
        speech encoders: ``position_embeddings_type`` "rotary").
    aliases : tuple of (str, str)
        Config keys the family stores under another name (transformers'
        ``attribute_map``): ("head_dim", "kv_channels") reads head_dim from kv_channels.
    axes : int
        Position axes (1: text). Entries with more belong to multi-axis RoPE.
    """

    style: str | None = "neox"
    interleave: bool = False
    width_key: str | None = None
    offset_key: str | None = None
    trailing: bool = False
    inverse: bool = False
    base_keys: tuple[str, ...] = ()
    mscale: bool = False
    ignored: tuple[str, ...] = ()
    requires: tuple[tuple[str, str], ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    axes: int = 1


LLAMA = Convention()
GPTJ = Convention(style="gptj")
# Multi-head latent attention (DeepSeek-V2): only q[..., qk_nope_head_dim:] and the
# separate k_pe rotate, with a width of qk_rope_head_dim.
MLA_NEOX = Convention(width_key="qk_rope_head_dim", offset_key="qk_nope_head_dim")
MLA_FLAG = replace(MLA_NEOX, style=None, interleave=True)  # rope_interleave, default True
MLA_GPTJ = replace(MLA_NEOX, style="gptj")                 # interleaves with no flag

MODELS: dict[str, Convention] = {
    # Adjacent pairs with no config flag: rotate_every_two, view_as_complex, or
    # repeat_interleave'd cos/sin.
    **dict.fromkeys((
        "gptj", "codegen", "cohere", "cohere2", "cohere2_moe", "glm", "glm4",
        "helium", "ernie4_5", "ernie4_5_moe", "llama4_text", "openai_privacy_filter",
        "moonshine_streaming", "pe_audio_encoder", "pe_audio_video_encoder", "pe_video_encoder",
        "blt_global_transformer", "blt_local_encoder", "blt_local_decoder", "blt_patcher",
        "roformer",  # with rotary_value=True it rotates v as well: call the embedding on v too
    ), GPTJ),
    # MLA.
    "deepseek_v2": MLA_GPTJ,       # view_as_complex
    **dict.fromkeys(("deepseek_v3", "axk1", "glm4_moe_lite", "youtu", "mistral4"),
                    MLA_FLAG),
    **dict.fromkeys(("deepseek_v32", "glm_moe_dsa", "longcat_flash",
                     "mistral_large4_text", "axk2"), MLA_GPTJ),
    **dict.fromkeys(("minicpm3", "hy_v4"), MLA_NEOX),
    # DeepSeek-V4: adjacent pairs on the trailing partial_rotary_factor of each head.
    "deepseek_v4": Convention(style="gptj", trailing=True),
    # nanochat rotates by -angle (rotate_half returns [x2, -x1]).
    "nanochat": Convention(inverse=True),
    "phimoe": Convention(mscale=True),
    # Heads are not hidden_size / num_attention_heads and the key says so only in
    # transformers' attribute_map.
    "jetmoe": Convention(aliases=(("head_dim", "kv_channels"),)),
    "zamba2": Convention(aliases=(("head_dim", "attention_head_dim"),)),
    "moonshine": Convention(style="gptj",
                            aliases=(("num_attention_heads", "decoder_num_attention_heads"),)),
    "minimax_m3_vl_text": Convention(ignored=("rotary_dim",)),
    # Conformer speech encoders rotate the heads of their attention input, by frame.
    **dict.fromkeys(("wav2vec2-conformer", "wav2vec2-bert"), Convention(
        base_keys=("rotary_embedding_base",),
        requires=(("position_embeddings_type", "rotary"),))),
    "dbrx": Convention(aliases=(("hidden_size", "d_model"), ("num_attention_heads", "n_heads"))),
    "bailing_hybrid": replace(MLA_GPTJ, aliases=(("max_position_embeddings",
                                                   "model_max_length"),)),
}

REFUSED: dict[str, str] = {
    "dots3_note_text": "per-layer MLA head widths (per_layer_config qk_nope_head_dim)",
    "efficientloftr": "2-D vision RoPE of a feature matcher",
    "eomt_dinov3": "2-D vision RoPE of a DINOv3 backbone",
    **dict.fromkeys((
        "dinov3_vit", "sapiens2", "vjepa2", "sam2_video_mask_decoder", "sam3_detr_decoder",
        "sam3_detr_encoder", "sam3_geometry_encoder", "sam3_mask_decoder",
        "sam3_tracker_video_mask_decoder", "edgetam_video_mask_decoder",
    ), "a 2-D or 3-D vision RoPE over patch coordinates"),
    # Rotary code that tests/data/make_hf_zoo_reference.py cannot run from the config
    # alone (own module signatures, positions made inside the model, audio and speech
    # encoders, sub-models), or whose attention does not rotate at all: not checked, so
    # not guessed.
    **dict.fromkeys((
        "musicflamingo", "seamless_m4t",
        "clvp", "clvp_decoder", "clvp_encoder", "moshi_depth", "moonshine_streaming_encoder",
        "gemma4_audio", "phi4_multimodal_audio", "molmo2_adapter", "emu3_vqgan",
        "inkling2_text", "qwen3_omni_moe_talker_code_predictor", "canary_decoder",
        "parakeet_encoder", "nemotron_asr_streaming_encoder", "jamba", "nemotron_h",
        "kimi_linear",
    ), "its rotary embedding (if its attention has one) is not checked against "
       "transformers' code"),
}


def convention(model_type: object) -> Convention:
    """The convention of a model type; Llama's for one not in the table."""
    return MODELS.get(model_type, LLAMA) if isinstance(model_type, str) else LLAMA
