"""How each transformers model family applies its 1-D text RoPE: one table, model type -> convention.

A Hugging Face config holds the numbers (base, scaling, head width) but not always the
convention: several families pair adjacent features with no flag for it, rotate only the
rope part of an MLA head, rotate the last features instead of the first, or rotate the
other way. This table holds what the config cannot say, read from each family's modeling
code in transformers 5.25 and checked against it (tests/data/make_hf_zoo_reference.py).

Coverage is by construction: ``KNOWN`` is every model type transformers 5.25 knows (its
config mapping and the model types of the sub-configs it builds), and only those in
``CHECKED`` (a fixture from the code the model runs stands behind each) or in the
multi-axis tables of :mod:`fastpe._hf_multimodal` load; every other known type raises,
naming itself and the transformers version checked. Only a model type transformers does
not know (a custom model) loads as Llama does (rotate_half pairing over the whole head,
as Llama's own rotary module, which reads no ``partial_rotary_factor``). Model types
listed with a reason in ``REFUSED`` raise with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

__all__ = ["BASE_KEYS", "CHECKED", "CLASS_DEFAULTS", "DEFAULT_THETA", "DEFAULT_TYPE_PARTIAL",
           "DEFAULT_TYPE_WHOLE", "ENTRY_PARTIAL", "ENTRY_PARTIAL_FILLED", "HEAD_DIM_UNREAD",
           "INDEXERS", "KNOWN", "MLA_DEFAULT_HEAD_DIM", "MODELS", "NOPE_LAYERS", "NO_ROPE", "NTK_ALPHA",
           "PAIRED_BLOCKS", "PARTIAL_FAILS",
           "PER_LAYER_CONFIG", "REFUSED", "ROPE_DEFAULTS", "ROPE_PER_LAYER_TYPE",
           "ROPE_SCALING_UNREAD", "TRANSFORMERS_VERSION", "WHOLE_HEAD", "WIDTH_KEYS",
           "Convention", "Indexer", "convention"]

# The transformers release whose model types and modeling code the tables below hold.
TRANSFORMERS_VERSION = "5.25"


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
    requires : tuple of (str, object, object)
        (key, value, default): config settings without which the model does not rotate
        at all (conformer speech encoders: ``position_embeddings_type`` "rotary";
        Falcon: ``alibi`` False), with the default transformers assumes when the
        config omits the key.
    needs : tuple of str
        Config keys that list the layers with attention (Bamba: ``attn_layer_indices``);
        without them no layer rotates.
    aliases : tuple of (str, str)
        Config keys the family stores under another name (transformers'
        ``attribute_map``): ("head_dim", "kv_channels") reads head_dim from kv_channels.
        A dict that sets both to different values is refused (config classes differ
        in which one they keep).
    width_rule : str or None
        How the family's rotary module sizes the rotated width where no config key
        says it: "clvp" is CLVP's ``max(projection_dim // (2 * num_attention_heads),
        32)`` leading features of each head.
    fixed_base : float or None
        The base of a family whose rotary code reads no rope parameters (GPT-J's
        ``create_sinusoidal_positions``): the config's rope_theta, rope type and
        partial_rotary_factor are not read.
    default_only : bool
        The family's rotary module (RecurrentGemma's, ERNIE-4.5-VL's) or config class
        (Cosmos3-Edge's) raises on every rope type but "default".
    theta_only : bool
        The family's rotary module reads the top-level ``rope_theta`` and nothing else
        (ESM's): a rope dict (its type, scaling and base) and partial_rotary_factor
        are stored by the config class but never applied.
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
    requires: tuple[tuple[str, object, object], ...] = ()
    needs: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    width_rule: str | None = None
    fixed_base: float | None = None
    default_only: bool = False
    theta_only: bool = False


LLAMA = Convention()
GPTJ = Convention(style="gptj")
# GPT-J's, CodeGen's and RoFormer's own sinusoid tables: base 10000 whatever the config
# says, no rope parameters and no partial_rotary_factor read (GPT-J and CodeGen rotate
# rotary_dim features, WIDTH_KEYS)
SINUSOID_TABLE = Convention(style="gptj", fixed_base=10000.0)
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
        "helium", "ernie4_5", "ernie4_5_moe", "llama4_text", "openai_privacy_filter", "ergo",
        "moonshine_streaming", "pe_audio_encoder", "pe_audio_video_encoder", "pe_video_encoder",
        "blt_global_transformer", "blt_local_encoder", "blt_local_decoder", "blt_patcher",
        "roformer",  # with rotary_value=True it rotates v as well: call the embedding on v too
    ), GPTJ),
    **dict.fromkeys(("gptj", "codegen", "roformer"), SINUSOID_TABLE),
    # MLA.
    "deepseek_v2": MLA_GPTJ,       # view_as_complex
    # sarvam_mla has a config only: it runs DeepseekV3Model
    **dict.fromkeys(("deepseek_v3", "axk1", "glm4_moe_lite", "youtu", "mistral4",
                     "sarvam_mla"), MLA_FLAG),
    # hy_v4: adjacent pairs from transformers 5.25 (5.24's code paired rotate_half)
    **dict.fromkeys(("deepseek_v32", "glm_moe_dsa", "longcat_flash",
                     "mistral_large4_text", "axk2", "dots3_note_text", "hy_v4"), MLA_GPTJ),
    "minicpm3": MLA_NEOX,
    "hy_v4_vl_text": MLA_GPTJ,  # M-RoPE (fastpe._hf_multimodal) on adjacent pairs
    # DeepSeek-V4: adjacent pairs on the trailing partial_rotary_factor of each head.
    "deepseek_v4": Convention(style="gptj", trailing=True),
    # nanochat rotates by -angle (rotate_half returns [x2, -x1]).
    "nanochat": Convention(inverse=True),
    "phimoe": Convention(mscale=True),
    # Heads are not hidden_size / num_attention_heads and the key says so only in
    # transformers' attribute_map.
    "jetmoe": Convention(aliases=(("head_dim", "kv_channels"),)),
    # Zamba2 builds its rotary module only with use_mem_rope; GraniteMoE-hybrid's
    # attention rotates only with position_embedding_type "rope".
    "zamba2": Convention(aliases=(("head_dim", "attention_head_dim"),
                                  ("layer_types", "layers_block_type")),
                         requires=(("use_mem_rope", True, False),)),
    "granitemoehybrid": Convention(requires=(("position_embedding_type", "rope", None),)),
    # RecurrentGemma's and ERNIE-4.5-VL's rotary modules and Cosmos3-Edge's config class
    # raise on any rope type but default.
    **dict.fromkeys(("recurrent_gemma", "ernie4_5_vl_moe_text", "cosmos3_edge_text"),
                    Convention(default_only=True)),
    # ESM's and Evolla's protein encoders rotate only with position_embedding_type
    # "rotary" (ESM's config class defaults to "absolute", Evolla's to "rotary"); ESM's
    # rotary module reads only the top-level rope_theta.
    "esm": Convention(requires=(("position_embedding_type", "rotary", "absolute"),),
                      theta_only=True),
    "evolla": Convention(requires=(("position_embedding_type", "rotary", "rotary"),)),
    "bamba": Convention(needs=("attn_layer_indices",)),
    "moonshine": Convention(style="gptj",
                            aliases=(("num_attention_heads", "decoder_num_attention_heads"),)),
    "minimax_m3_vl_text": Convention(ignored=("rotary_dim",)),
    # Conformer speech encoders rotate the heads of their attention input, by frame.
    **dict.fromkeys(("wav2vec2-conformer", "wav2vec2-bert"), Convention(
        base_keys=("rotary_embedding_base",),
        requires=(("position_embeddings_type", "rotary", "relative"),))),
    # SeamlessM4T's only RoPE: its speech encoder's, heads under their own key (its
    # num_attention_heads are the text decoder's).
    "seamless_m4t": Convention(
        base_keys=("rotary_embedding_base",),
        requires=(("position_embeddings_type", "rotary", "relative"),),
        ignored=("num_attention_heads",),
        aliases=(("num_attention_heads", "speech_encoder_attention_heads"),)),
    "falcon": Convention(requires=(("alibi", False, False),)),
    "dbrx": Convention(aliases=(("hidden_size", "d_model"), ("num_attention_heads", "n_heads"),
                                ("max_position_embeddings", "max_seq_len"))),
    # CLVP's encoder rotates q, k and v (call the embedding on v too) with a module of
    # its own: base 10000 whatever the config says, positions 0 .. seq - 1.
    "clvp_encoder": Convention(width_rule="clvp",
                               requires=(("use_rotary_embedding", True, True),),
                               ignored=("rope_theta", "rope_parameters", "rope_scaling",
                                        "partial_rotary_factor", "rotary_pct", "rotary_dim")),
    "bailing_hybrid": replace(MLA_GPTJ, aliases=(("max_position_embeddings",
                                                   "model_max_length"),)),
}

REFUSED: dict[str, str] = {
    "vjepa2": "a 3-D vision RoPE over (frame, row, column) patch coordinates",
    # MusicFlamingo rotates its audio encoder's output features, not q and k, by
    # (window index, time in the window) angles multiplied by each frame's timestamp.
    "musicflamingo": "its rotary time embedding rotates the audio features (not q and k) by "
                     "angles of two axes, the window index and the time within the window, "
                     "each multiplied by -2 pi times the frame's timestamp in seconds",
    # No rotary module reads its top-level rope parameters: BltModel's rotate with their
    # own sub-configs, whose head widths differ.
    "blt": "a composite config: its rotary embeddings are those of its patcher, local "
           "encoder, global transformer and local decoder, each built from its own "
           "sub-config (patcher_config, encoder_config, global_config, decoder_config); "
           "pass that sub-config",
}


# Model types of transformers 5.25 whose attention rotates nothing (learned, sinusoidal,
# relative or ALiBi positions, or none): their modeling code has no rotary embedding, or
# the model transformers builds from the config neither builds a rotary module nor calls
# a rotary function (Jamba and Nemotron-H keep Llama's apply function unused, Moshi's
# depth decoder builds its attention without RoPE, vision towers beside a rotary text
# model have learned positions). A RoPE for them would be a guess. Composite configs
# are not listed; they are refused as composites.
NO_ROPE: frozenset[str] = frozenset((
    "aimv2_text_model", "aimv2_vision_model", "albert", "align_text_model",
    "align_vision_model", "altclip_text_model", "altclip_vision_model",
    "apertus1p5_vision_tokenizer", "audio-spectrogram-transformer",
    "audioflamingo3_encoder", "autoformer", "bart", "beit", "bert", "bert-generation",
    "big_bird", "bigbird_pegasus", "biogpt", "bit", "blenderbot", "blenderbot-small",
    "blip_2_qformer", "blip_2_vision_model", "blip_text_model", "blip_vision_model",
    "bloom", "bridgetower_text_model", "bridgetower_vision_model", "bros", "camembert",
    "canary_decoder", "canine", "chameleon_vqgan", "chinese_clip_text_model",
    "chinese_clip_vision_model", "clap_audio_model", "clap_text_model", "clip_text_model",
    "clip_vision_model", "clipseg_text_model", "clipseg_vision_model", "clvp_decoder",
    "coarse_acoustics", "convbert", "convnext", "convnextv2", "cosmos3_edge_vision",
    "cpmant", "ctrl", "cvt", "dac", "data2vec-audio", "data2vec-text", "data2vec-vision",
    "deberta", "deberta-v2", "decision_transformer", "deepseek_ocr2_sam_vision_model",
    "deit", "dinat", "dinov2", "dinov2_with_registers", "dinov3_convnext", "distilbert",
    "donut-swin", "dpr", "edgetam_mask_decoder", "edgetam_prompt_encoder",
    "edgetam_video_mask_decoder", "edgetam_video_prompt_encoder", "efficientnet", "electra",
    "emu3_vqgan", "encodec", "eomt", "ernie", "falcon_mamba", "fastspeech2_conformer",
    "fastspeech2_conformer_hifigan", "fine_acoustics", "flaubert", "flava_image_codebook",
    "flava_image_model", "flava_multimodal_model", "flava_text_model", "florence_vision",
    "fnet", "focalnet", "fsmt", "fun_asr_nano_encoder", "funnel", "gemma3n_audio",
    "gemma4_audio", "gemma4_unified_audio", "gemma4_unified_vision", "git_vision_model",
    "glm5_next_text", "glm_image_vision", "glm_image_vqmodel", "glpn", "got_ocr2_vision",
    "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo", "granite_docling_vision",
    "granite_speech5_encoder", "granite_speech_encoder", "granite_speech_plus_encoder",
    "groupvit_text_model", "groupvit_vision_model", "hgnet_v2", "hiera", "hubert",
    "hunyuan_vl_vision", "hy_v4_vl_vision", "ibert", "idefics2_perceiver",
    "idefics2_vision", "idefics3_vision", "idefics_perciever", "idefics_vision", "ijepa",
    "imagegpt", "informer", "inkling2_loop_text", "inkling2_text", "inkling_audio",
    "inkling_text", "inkling_vision", "instructblip_qformer", "instructblip_vision_model",
    "instructblipvideo_qformer", "instructblipvideo_vision_model", "internvl_vision",
    "jamba", "janus_vision_model", "janus_vqgan", "kimi_linear", "kosmos_2_5_text_model",
    "kosmos_2_5_vision_model", "kosmos_2_text_model", "kosmos_2_vision_model", "layoutlm",
    "layoutlmv2", "layoutlmv3", "led", "levit", "lilt", "longformer", "longt5", "luke",
    "lw_detr_vit", "lxmert", "m2m_100", "mamba", "mamba2", "marian", "markuplm",
    "maskformer-swin", "mbart", "megatron-bert", "metaclip_2_text_model",
    "metaclip_2_vision_model", "mgp-str", "minicpm_ocr_vision", "minicpmv4_6_vision",
    "minicpmv4_7_vision", "mllama_vision_model", "mobilebert", "mobilenet_v1",
    "mobilenet_v2", "mobilevit", "mobilevitv2", "molmo2_adapter", "molmo2_vision",
    "moonshine_streaming_encoder", "moshi_depth", "moss_transcribe_diarize_audio", "mpnet",
    "mra", "mt5", "muse_spark_audio", "musicgen_decoder", "musicgen_melody_decoder", "mvp",
    "nemotron_asr_streaming_encoder", "nemotron_h", "nllb-moe", "nystromformer",
    "omniasr_audio", "openai-gpt", "opt", "ovis2_vision", "owlv2_text_model",
    "owlv2_vision_model", "owlvit_text_model", "owlvit_vision_model", "parakeet_encoder",
    "patchtsmixer", "patchtst", "pegasus", "pegasus_x", "perceiver",
    "phi4_multimodal_audio", "phi4_multimodal_vision", "pix2struct_text_model",
    "pix2struct_vision_model", "pixio", "plbart", "poolformer", "pop2piano",
    "pp_formulanet_text", "pp_formulanet_vision", "pp_lcnet", "pp_lcnet_v3", "pp_lcnet_v4",
    "prophetnet", "pvt", "pvt_v2", "qianfan_ocr_vision", "qwen2_5_omni_audio_encoder",
    "qwen2_5_omni_bigvgan", "qwen2_audio_encoder", "qwen3_asr_encoder",
    "qwen3_omni_moe_audio_encoder", "radio", "rag", "reformer", "regnet", "rembert",
    "resnet", "rf_detr_dinov2", "roberta", "roberta-prelayernorm", "roc_bert",
    "rt_detr_resnet", "rwkv", "sam2_hiera_det_model", "sam2_mask_decoder",
    "sam2_prompt_encoder", "sam2_video_mask_decoder", "sam2_video_prompt_encoder",
    "sam3_detr_decoder", "sam3_detr_encoder", "sam3_geometry_encoder",
    "sam3_lite_text_detr_decoder", "sam3_lite_text_detr_encoder",
    "sam3_lite_text_geometry_encoder", "sam3_lite_text_mask_decoder",
    "sam3_lite_text_text_model", "sam3_mask_decoder", "sam3_tracker_mask_decoder",
    "sam3_tracker_prompt_encoder", "sam3_tracker_video_mask_decoder",
    "sam3_tracker_video_prompt_encoder", "sam_hq_mask_decoder", "sam_hq_prompt_encoder",
    "sam_hq_vision_model", "sam_mask_decoder", "sam_prompt_encoder", "sam_vision_model",
    "sapiens2_head", "seamless_m4t_v2", "segformer", "seggpt", "semantic", "sew", "sew-d",
    "siglip2_text_model", "siglip2_vision_model", "siglip_text_model",
    "siglip_vision_model", "slanext_vision", "smolvlm_vision", "speech_to_text", "speecht5",
    "speecht5_hifigan", "splinter", "squeezebert", "superpoint", "swiftformer", "swin",
    "swin2sr", "swinv2", "switch_transformers", "t5", "tapas", "textnet",
    "time_series_transformer", "timesfm", "timesformer", "timm_backbone", "timm_wrapper",
    "tipsv2_text_model", "tipsv2_vision_model", "trocr", "udop", "umt5", "unispeech",
    "unispeech-sat", "univnet", "unlimited_ocr_sam_vision_model",
    "unlimited_ocr_vision_encoder", "uvdoc_backbone", "vibevoice_acoustic_tokenizer",
    "vibevoice_acoustic_tokenizer_decoder", "vibevoice_acoustic_tokenizer_encoder",
    "vibevoice_diffusion", "videomae", "videomt", "videoprism_text_model",
    "videoprism_vision_model", "vilt", "visual_bert", "vit", "vit_mae", "vit_msn", "vitdet",
    "vitpose_backbone", "vits", "vivit", "voxtral_encoder", "wav2vec2", "wavlm",
    "wavtokenizer", "wavtokenizer_encoder", "whisper", "xclip_text_model",
    "xclip_vision_model", "xglm", "xlm", "xlm-roberta", "xlm-roberta-xl", "xlnet", "xlstm",
    "xmod", "yolos", "yoso", "zamba",
))


# Model types of transformers 5.25 whose config class wraps sub-configs (its
# ``sub_configs``: text_config, vision_config, audio_config, ...). A real config of one
# carries them, and is refused as composite unless it keeps rope keys of its own; a flat
# dict of one of these types (hand-written, sub-configs dropped) is refused too rather
# than read as Llama's. Derived with: sorted(mt for mt, cls in CONFIG_MAPPING.items()
# if cls.sub_configs), less ESM, whose own attention rotates (its sub-config is the
# folding trunk's).
COMPOSITE: frozenset[str] = frozenset((
    "aimv2", "align", "altclip", "apertus1p5", "aria", "audioflamingo3", "aya_vision",
    "bark", "blip", "blip-2", "blt", "bridgetower", "canary", "chameleon", "chinese_clip",
    "chmv2", "clap", "clip", "clipseg", "clvp", "cohere2_vision", "cohere_asr",
    "cohere_compass", "colmodernvbert", "colpali", "colqwen2", "conditional_detr",
    "cosmos3_edge", "cosmos3_omni", "csm", "d_fine", "dab-detr", "dbrx", "deepseek_ocr2",
    "deepseek_ocr2_vision", "deepseek_vl", "deepseek_vl_hybrid", "deformable_detr",
    "deimv2", "depth_anything", "depth_pro", "detr", "dia", "diffusion_gemma", "dots3_note",
    "dpt", "edgetam", "edgetam_video", "edgetam_vision_model", "embedding_gemma2", "emu3",
    "encoder-decoder", "ernie4_5_vl_moe", "esmfold2", "evolla", "exaone4_5",
    "fast_vlm", "fastspeech2_conformer_with_hifigan", "flava", "florence2", "fun_asr_nano",
    "fuyu", "gemma3", "gemma3n", "gemma4", "gemma4_assistant", "gemma4_unified",
    "gemma4_unified_assistant", "git", "glm46v", "glm4v", "glm4v_moe", "glm5_next",
    "glm_image", "glm_ocr", "glmasr", "glmga", "got_ocr2", "gradium_phonon_tts",
    "granite4_vision", "granite_docling", "granite_speech", "granite_speech5_ctc",
    "granite_speech_plus", "grounding-dino", "groupvit", "higgs_audio_v2_tokenizer",
    "hunyuan_vl", "hy_v4_vl", "hyperclovax_vision_v2", "idefics", "idefics2", "idefics3",
    "inkling2", "inkling2_loop", "inkling_mm_model", "instructblip", "instructblipvideo",
    "internvl", "janus", "jev", "kimi_k25", "kosmos-2", "kosmos-2.5",
    "kyutai_speech_to_text", "lasr_ctc", "lfm2_vl", "lfm3_vl", "lightglue", "lighton_ocr",
    "llama4", "llava", "llava_next", "llava_next_video", "llava_onevision",
    "llava_onevision1_5", "lw_detr",
    "mask2former", "maskformer", "metaclip_2", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7",
    "minimax_m3_vl", "mistral3", "mistral_large4", "mllama", "mm-grounding-dino",
    "modernvbert", "molmo2", "moonshine_streaming", "moshi", "moss_transcribe_diarize",
    "mpt", "muse_glimmer", "muse_spark", "musicflamingo", "musicgen", "musicgen_melody",
    "nemo_speechlm", "nemotron3_5_asr", "nemotron3_5_transcribe_audio",
    "nemotron3_diarization", "nemotron_asr_streaming", "nemotron_h_omni", "neucodec",
    "nougat", "omdet-turbo", "omniasr", "omniasr_ctc", "oneformer", "ovis2", "ovis2_5", "owlv2",
    "owlvit", "paddleocr_vl", "paligemma", "parakeet_ctc", "parakeet_rnnt", "parakeet_tdt",
    "pe_audio", "pe_audio_encoder", "pe_audio_video", "pe_audio_video_encoder", "pe_video",
    "pe_video_encoder", "perception_lm", "phi4_multimodal", "pi0", "pi05", "pix2struct",
    "pocket_tts", "pp_chart2table", "pp_doclayout_v2", "pp_doclayout_v3", "pp_doclayout_v4",
    "pp_formulanet", "pp_ocrv5_mobile_det", "pp_ocrv5_mobile_rec", "pp_ocrv5_server_det",
    "pp_ocrv5_server_rec", "pp_ocrv6_medium_det", "pp_ocrv6_small_det",
    "pp_ocrv6_small_rec", "pp_ocrv6_tiny_rec", "prompt_depth_anything", "qianfan_ocr",
    "qwen2_5_omni", "qwen2_5_omni_thinker", "qwen2_5_omni_token2wav", "qwen2_5_vl",
    "qwen2_audio", "qwen2_vl", "qwen3_5", "qwen3_5_moe", "qwen3_asr", "qwen3_omni_moe",
    "qwen3_omni_moe_thinker", "qwen3_vl", "qwen3_vl_moe", "qwen4_exp", "rf_detr", "rt_detr",
    "rt_detr_v2", "sam", "sam2", "sam2_video", "sam2_vision_model", "sam3",
    "sam3_lite_text", "sam3_tracker", "sam3_tracker_video", "sam3_video",
    "sam3_vision_model", "sam_hq", "sapiens2", "shieldgemma2", "siglip", "siglip2",
    "slanet", "slanext", "smolvlm", "speech-encoder-decoder", "step3p7", "superglue",
    "t5gemma", "t5gemma2", "t5gemma2_encoder", "table-transformer", "tipsv2", "tipsv2_dpt",
    "tvp", "ultravbert", "unlimited_ocr", "unlimited_ocr_vision", "upernet", "uvdoc",
    "vibevoice", "vibevoice_asr", "video_llama_3", "video_llava", "videoprism", "vipllava",
    "vision-encoder-decoder", "vision-text-dual-encoder", "vitmatte", "vitpose", "voxtral",
    "voxtral_realtime", "xclip", "xcodec", "xcodec2", "zoedepth"
))


class Indexer(NamedTuple):
    """How a lightning indexer (DeepSeek-V3.2's sparse attention) rotates its own q and
    k with the main attention's cos and sin: over qk_rope_head_dim features of its
    index_head_dim-wide head, the leading ones or the trailing ones."""
    style: str
    trailing: bool


INDEXERS: dict[str, Indexer] = {
    "deepseek_v32": Indexer("neox", False),
    "axk2": Indexer("neox", False),
    "glm_moe_dsa": Indexer("gptj", False),  # interleaved, as its main attention
    "hy_v4": Indexer("gptj", True),  # interleaved, as its main attention (5.25)
}


def convention(model_type: object) -> Convention:
    """The convention of a model type; Llama's for one not in the table."""
    return MODELS.get(model_type, LLAMA) if isinstance(model_type, str) else LLAMA


# Model types whose config.json lists each decoder layer as two blocks, attention then
# "mlp", in layer_types and counts blocks in num_hidden_layers; their config class folds
# each pair into one layer (Dory).
PAIRED_BLOCKS: frozenset[str] = frozenset(("dory",))


# The legacy config key, beside partial_rotary_factor, from which a family's config class
# (GPT-NeoX's rotary_pct, MiniMax-M2's rotary_dim) or its own code (GPT-J, CodeGen) takes
# the rotated width, and its default where a config omits both (None: the whole head);
# every other family's rotary module reads partial_rotary_factor alone, whatever
# rotary_pct or rotary_dim a config carries.
WIDTH_KEYS: dict[str, tuple[str, float | None]] = {
    "codegen": ("rotary_dim", 64), "gpt_neox": ("rotary_pct", 0.25),
    "gpt_neox_japanese": ("rotary_pct", 1.0), "gptj": ("rotary_dim", 64),
    "minimax_m2": ("rotary_dim", None),
}

# Families whose rotary module computes its default-type frequencies with a function of
# its own that reads no partial_rotary_factor (other rope types go through transformers'
# shared functions, which read it): with rope type "default" the whole head rotates; with
# another type a partial factor narrows the frequencies while their attention rotates the
# whole head, and the model's own code fails (refused).
DEFAULT_TYPE_WHOLE: frozenset[str] = frozenset("""
    apertus apertus1p5_text cohere_compass_text cosmos3_edge_text cwm gemma4_text
    gemma4_unified_text higgs_audio_v2 hunyuan_vl_text lfm3 ministral3 paddleocr_vl_text
    qwen2_5_omni_text qwen2_5_vl_text
    qwen2_vl_text qwen3_omni_moe_talker_text qwen3_omni_moe_text qwen3_vl_moe_text
    qwen3_vl_text
""".split())

# Families whose config class fills each layer type's partial_rotary_factor with defaults
# of its own (NeoMME: a quarter of the head in full-attention layers): a typed dict whose
# entries leave it out is refused.
ENTRY_PARTIAL_FILLED: frozenset[str] = frozenset(("neomme",))

# Families that rotate the whole head whatever a top-level partial_rotary_factor says,
# but whose rotary module reads one inside a layer type's rope parameters (Step 3.5's
# per-layer partial_rotary_factors land there) and whose attention then rotates that
# many leading features.
ENTRY_PARTIAL: frozenset[str] = frozenset(("step3p5",))

# Families whose own default-type frequency function reads a layer type's
# partial_rotary_factor with a default of its own where the entry gives none (MiMo-V2-Flash
# rotates int(0.334 * head_dim) features); other rope types use transformers' default, 1.
DEFAULT_TYPE_PARTIAL: dict[str, float] = {"mimo_v2_flash": 0.334}

# What a family's config class makes of a config.json dict transformers did not write
# (one typed by hand: a to_dict() or what save_pretrained writes holds every key), from
# tests/data/hf_class_defaults_reference.json, where it differs from what fastpe assumes
# of such a dict (head_dim = hidden_size // num_attention_heads, or latent attention's
# rope width; partial_rotary_factor 1; rotary embeddings; plain RoPE at base 10000).
# CLASS_DEFAULTS: the values of keys the dict leaves out (a partial factor here applies
# whatever rope parameters the dict gives).
_CLASS_DEFAULTS_BY_VALUE: tuple[tuple[dict[str, object], str], ...] = (
    ({"original_max_position_embeddings": 4096}, "phi3 phi4_multimodal"),
    ({"head_dim": 64}, """
        gpt_oss longcat_flash muse_spark_text neucodec openai_privacy_filter param2moe
        qwen2_5_omni_dit sarvam_moe voxtral_realtime_encoder xcodec2
    """),
    ({"head_dim": 80}, "timesfm2_5"),
    ({"head_dim": 128}, """
        afmoe beam cohere2_moe cwm dia_decoder dia_encoder ernie4_5 flint helium
        higgs_audio_v2 hrm_text hy_v3 internlm3 iquestcoder jetmoe kolibri1 kolibri1_1
        laguna lara_mini
        lfm3 llama4_text mellum minicpm5_moe minimax_m2 minimax_m3_vl_text ministral3
        molmo2_text muse_glimmer_assistant muse_glimmer_text pe_audio_encoder
        pe_audio_video_encoder pe_video_encoder qwen3 qwen3_omni_moe_talker_code_predictor
        seed_oss solar_open step3p5 zaya
    """),
    ({"head_dim": 192}, "mimo_v2_flash"),
    ({"head_dim": 256}, """
        dory dots3_note_text gemma gemma2 gemma3_text gemma3n_text t5_gemma_module
        t5gemma2_decoder t5gemma2_text vaultgemma
    """),
    ({"head_dim": 512}, "deepseek_v4"),
    ({"partial_rotary_factor": 0.5}, """
        bamba dots3_note_audio_encoder glm4_moe glmasr_encoder nemotron persimmon phi
        recurrent_gemma
    """),
    ({"partial_rotary_factor": 0.9}, "moonshine"),
    ({"partial_rotary_factor": 0.25}, "stablelm"),
    ({"position_embedding_type": "absolute"}, "esm"),
    ({"head_dim": 128, "partial_rotary_factor": 0.5}, "glm glm4"),
    ({"head_dim": 256, "partial_rotary_factor": 0.25}, "qwen3_next"),
)
CLASS_DEFAULTS: dict[str, dict[str, object]] = {
    model_type: dict(values) for values, names in _CLASS_DEFAULTS_BY_VALUE
    for model_type in names.split()}

# ROPE_DEFAULTS: the flat rope parameters the class makes for a dict that gives neither
# rope_parameters nor rope_scaling (their base replaced by a top-level one the class
# reads, BASE_KEYS).
_ROPE_DEFAULTS_BY_VALUE: tuple[tuple[dict[str, object], str], ...] = (
    ({"rope_theta": 20000, "rope_type": "default"}, """
        pe_audio_encoder pe_audio_video_encoder pe_video_encoder
    """),
    ({"rope_theta": 1000.0, "rope_type": "default"}, "nomic_bert"),
    ({"rope_theta": 20000.0, "rope_type": "default"}, "jina_embeddings_v3"),
    ({"rope_theta": 100000.0, "rope_type": "default"}, "helium"),
    ({"rope_theta": 160000.0, "rope_type": "default"}, "gte"),
    ({"rope_theta": 500000.0, "rope_type": "default"}, """
        EvollaModel bitnet blt_global_transformer blt_local_decoder blt_local_encoder cohere
        csm csm_depth_decoder_model ernie4_5 ernie4_5_moe evolla exaone flex_olmo
        llama4_text mllama_text_model muse_glimmer_assistant muse_spark_text param2moe
    """),
    ({"rope_theta": 1000000.0, "rope_type": "default"}, """
        emu3_text_model lfm2 lfm2_moe minimax mixtral phimoe solar_open
    """),
    ({"rope_theta": 2000000.0, "rope_type": "default"}, "smollm3"),
    ({"rope_theta": 5000000.0, "rope_type": "default"}, """
        minicpm5_moe minimax_m2 minimax_m3_vl_text
    """),
    ({"rope_theta": 6000000.0, "rope_type": "default"}, "bailing_hybrid"),
    ({"rope_theta": 8000000.0, "rope_type": "default"}, "sarvam_moe"),
    ({"rope_theta": 10000000.0, "rope_type": "default"}, "longcat_flash"),
    ({"rope_theta": 11158840.0, "rope_type": "default"}, "hy_v3"),
    ({"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}, """
        nemotron3_5_transcribe_asr_audio nemotron3_5_transcribe_word_timestamp
    """),
    ({"partial_rotary_factor": 0.8, "rope_theta": 10000.0, "rope_type": "default"}, """
        moonshine_streaming
    """),
    ({"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
     "original_max_position_embeddings": 8192, "rope_theta": 1000000.0, "rope_type":
     "llama3"}, """
        cwm
    """),
    ({"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
     "original_max_position_embeddings": 8192, "rope_theta": 12000000.0, "rope_type":
     "llama3"}, """
        apertus apertus1p5_text
    """),
    ({"factor": 32.0, "high_freq_factor": 0.5, "low_freq_factor": 0.125,
     "original_max_position_embeddings": 1024, "rope_theta": 500000.0, "rope_type":
     "llama3"}, """
        higgs_audio_v2
    """),
    ({"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
     "original_max_position_embeddings": 4096, "rope_theta": 150000.0, "rope_type":
     "yarn", "truncate": False}, """
        gpt_oss openai_privacy_filter
    """),
    ({"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "factor": 2048.0,
     "original_max_position_embeddings": 512, "rope_theta": 10000.0, "rope_type":
     "yarn"}, """
        mistral_large4_text
    """),
    ({"beta_fast": 32.0, "beta_slow": 1.0, "factor": 128.0, "llama_4_scaling_beta": 0.1,
     "max_position_embeddings": 1048576, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 8192, "rope_theta": 10000.0, "rope_type":
     "yarn", "type": "yarn"}, """
        mistral4
    """),
    ({"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
     "max_position_embeddings": 262144, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 16384, "rope_theta": 1000000.0, "rope_type":
     "yarn", "type": "yarn"}, """
        ministral3
    """),
)
ROPE_DEFAULTS: dict[str, dict[str, object]] = {
    model_type: dict(values) for values, names in _ROPE_DEFAULTS_BY_VALUE
    for model_type in names.split()}

# DEFAULT_THETA: the base of rope parameters a dict gives without one, and without a
# top-level base.
_DEFAULT_THETA_BY_VALUE: tuple[tuple[float, str], ...] = (
    (1000.0, "nomic_bert"),
    (20000.0, """
        jina_embeddings_v3 pe_audio_encoder pe_audio_video_encoder pe_video_encoder
    """),
    (100000.0, "helium"),
    (150000.0, "gpt_oss openai_privacy_filter"),
    (160000.0, "gte"),
    (500000.0, """
        EvollaModel bitnet blt_global_transformer blt_local_decoder blt_local_encoder cohere
        csm csm_depth_decoder_model ernie4_5 ernie4_5_moe evolla exaone flex_olmo
        llama4_text mllama_text_model muse_glimmer_assistant param2moe
    """),
    (1000000.0, "cwm emu3_text_model lfm2 lfm2_moe lfm3 minimax mixtral phimoe solar_open"),
    (2000000.0, "smollm3"),
    (5000000.0, "minicpm5_moe minimax_m2 minimax_m3_vl_text"),
    (6000000.0, "bailing_hybrid"),
    (8000000.0, "sarvam_moe"),
    (10000000.0, "longcat_flash"),
    (11158840.0, "hy_v3"),
    (12000000.0, "apertus apertus1p5_text"),
)
DEFAULT_THETA: dict[str, float] = {
    model_type: theta for theta, names in _DEFAULT_THETA_BY_VALUE
    for model_type in names.split()}

# BASE_KEYS: the top-level key under which the class reads a dict's base for the rope
# parameters it makes, where it is not rope_theta: GPT-NeoX's rotary_emb_base (always),
# or none (a dict with rope parameters of its own still takes a top-level rope_theta).
BASE_KEYS: dict[str, str | None] = {
    **dict.fromkeys(("gpt_neox", "gpt_neox_japanese"), "rotary_emb_base"),
    **dict.fromkeys("""
    apertus apertus1p5_text cwm higgs_audio_v2 ministral3 mistral4
    mistral_large4_text moonshine_streaming muse_spark_text
    nemotron3_5_transcribe_asr_audio nemotron3_5_transcribe_word_timestamp
    """.split(), None),
}

# Families whose config class makes a per_layer_config for a dict without one: head
# widths per layer (Gemma 4's full-attention layers: global_head_dim; dots.llm3's
# sliding layers) that fastpe does not derive (the fixture above).
PER_LAYER_CONFIG: frozenset[str] = frozenset((
    "diffusion_gemma_text", "dots3_note_text", "embedding_gemma2_text", "gemma4_text",
    "gemma4_unified_text"))

# Families whose config class sets head_dim whatever a dict says (from hidden_size /
# num_attention_heads, or latent attention's rope width): the fixture above.
HEAD_DIM_UNREAD: frozenset[str] = frozenset("""
    axk2 bailing_hybrid deepseek_ocr2_text deepseek_v2 deepseek_v32
    dots3_note_audio_encoder glm_moe_dsa hy_v4 minicpm3 mistral_large4_text sarvam_mla
    unlimited_ocr_text
""".split())


# Families whose config class makes rope parameters per layer type (sliding and full
# attention, ...) from a dict's flat keys (an older config.json's rope_theta,
# rope_local_base_freq, global_rope_theta, rope_scaling): the fixture above.
ROPE_PER_LAYER_TYPE: frozenset[str] = frozenset("""
    beam deepseek_v4 diffusion_gemma_text dory dots3_note_text embedding_gemma2_text
    ergo gemma3_text gemma3n_text gemma4_text gemma4_unified_text laguna lfm3 mellum
    mimo_v2_flash modernbert modernbert-decoder olmo3 step3p5 t5gemma2_decoder
    t5gemma2_text ultrabert zaya
""".split())

# Families whose rotary module reads rope type "dynamic" with an alpha as a fixed
# stretch of the base, base * alpha^(d / (d - 2)) (transformers' ntk_alpha).
NTK_ALPHA: frozenset[str] = frozenset(("hunyuan_v1_dense", "hunyuan_v1_moe"))

# Rope types a family's config class renames as it loads a config.json: Phi-3's
# checkpoints wrote LongRoPE as "su", later as "yarn", which Phi3Config (and
# Phi4MultimodalConfig) read as "longrope" with the dict's short and long factors.
ROPE_TYPE_RENAMES: dict[str, dict[str, str]] = {
    model_type: {"su": "longrope", "yarn": "longrope"}
    for model_type in ("phi3", "phi4_multimodal")
}

# Families whose config class keeps a rope_scaling field that their code never reads
# (Cohere2-MoE rotates with rope_parameters alone): the fixture above.
ROPE_SCALING_UNREAD: frozenset[str] = frozenset(("cohere2_moe",))

# MLA families whose default-type frequencies (Llama's function) span head_dim whatever
# partial_rotary_factor says, where head_dim is more than the rope part (Mistral 4's
# nope + rope): the model's own code fails on the default type.
MLA_DEFAULT_HEAD_DIM: frozenset[str] = frozenset(("mistral4",))

# Families whose rotary module reads partial_rotary_factor while their attention applies
# cos and sin to the whole head: transformers' own code fails on a partial width (a
# top-level one, or DiffusionGemma's and Mellum's in a default-type layer type's entry).
PARTIAL_FAILS: frozenset[str] = frozenset(("diffusion_gemma_text", "gpt_oss", "mellum",
                                           "openai_privacy_filter", "solar_open"))

# Filled from tests/data/hf_zoo_reference.json (its "known" list, the model types of its
# cases, the layer types its trace found without rotation in each family's default
# config, the families whose partial variant kept the whole head); test_hf_zoo.py holds
# each equal to the fixture. Where a family's layers differ by more than their type,
# fastpe._hf_layers.RULES says how, checked layer by layer against the same trace.
KNOWN: frozenset[str] = frozenset("""
    EvollaModel afmoe aimv2 aimv2_text_model aimv2_vision_model albert align
    align_text_model align_vision_model altclip altclip_text_model
    altclip_vision_model apertus apertus1p5 apertus1p5_text
    apertus1p5_vision_tokenizer arcee aria aria_text audio-spectrogram-transformer
    audioflamingo3 audioflamingo3_encoder autoformer axk1 axk2 aya_vision
    bailing_hybrid bamba bark bart beam beit bert bert-generation big_bird
    bigbird_pegasus biogpt bit bitnet blenderbot blenderbot-small blip blip-2
    blip_2_qformer blip_2_vision_model blip_text_model blip_vision_model bloom blt
    blt_global_transformer blt_local_decoder blt_local_encoder blt_patcher
    bridgetower bridgetower_text_model bridgetower_vision_model bros camembert
    canary canary_decoder canine chameleon chameleon_vqgan chinese_clip
    chinese_clip_text_model chinese_clip_vision_model chmv2 clap clap_audio_model
    clap_text_model clip clip_text_model clip_vision_model clipseg
    clipseg_text_model clipseg_vision_model clvp clvp_decoder clvp_encoder
    coarse_acoustics codegen cohere cohere2 cohere2_moe cohere2_vision cohere_asr
    cohere_compass cohere_compass_text cohere_compass_vision colmodernvbert colpali
    colqwen2 conditional_detr convbert convnext convnextv2 cosmos3_edge
    cosmos3_edge_text cosmos3_edge_vision cosmos3_omni cpmant csm
    csm_depth_decoder_model ctrl cvt cwm d_fine dab-detr dac data2vec-audio
    data2vec-text data2vec-vision dbrx deberta deberta-v2 decision_transformer
    deepseek_ocr2 deepseek_ocr2_encoder deepseek_ocr2_sam_vision_model
    deepseek_ocr2_text deepseek_ocr2_vision deepseek_v2 deepseek_v3 deepseek_v32
    deepseek_v4 deepseek_vl deepseek_vl_hybrid deformable_detr deimv2 deit
    depth_anything depth_pro detr dia dia_decoder dia_encoder diffllama
    diffusion_gemma diffusion_gemma_text dinat dinov2 dinov2_with_registers
    dinov3_convnext dinov3_vit distilbert doge donut-swin dory dots1 dots3_note
    dots3_note_audio_encoder dots3_note_text dots3_note_vision_encoder dpr dpt
    edgetam edgetam_mask_decoder edgetam_prompt_encoder edgetam_video
    edgetam_video_mask_decoder edgetam_video_prompt_encoder edgetam_vision_model
    efficientloftr efficientnet electra embedding_gemma2 embedding_gemma2_text emu3
    emu3_text_model emu3_vqgan encodec encoder-decoder eomt eomt_dinov3 ergo ernie
    ernie4_5 ernie4_5_moe ernie4_5_vl_moe ernie4_5_vl_moe_text
    ernie4_5_vl_moe_vision esm esmc esmfold2 eurobert evolla exaone exaone4
    exaone4_5 exaone4_5_vision exaone_moe falcon falcon_h1 falcon_mamba fast_vlm
    fastspeech2_conformer fastspeech2_conformer_hifigan
    fastspeech2_conformer_with_hifigan fine_acoustics flaubert flava
    flava_image_codebook flava_image_model flava_multimodal_model flava_text_model
    flex_olmo flint florence2 florence_vision fnet focalnet fsmt fun_asr_nano
    fun_asr_nano_encoder funnel fuyu gemma gemma2 gemma3 gemma3_text gemma3n
    gemma3n_audio gemma3n_text gemma3n_vision gemma4 gemma4_assistant gemma4_audio
    gemma4_text gemma4_unified gemma4_unified_assistant gemma4_unified_audio
    gemma4_unified_text gemma4_unified_vision gemma4_vision git git_vision_model glm
    glm4 glm46v glm4_moe glm4_moe_lite glm4v glm4v_moe glm4v_moe_text
    glm4v_moe_vision glm4v_text glm4v_vision glm5_next glm5_next_text
    glm5_next_vision glm_image glm_image_text glm_image_vision glm_image_vqmodel
    glm_moe_dsa glm_ocr glm_ocr_text glm_ocr_vision glmasr glmasr_encoder glmga glpn
    got_ocr2 got_ocr2_vision gpt-sw3 gpt2 gpt_bigcode gpt_neo gpt_neox
    gpt_neox_japanese gpt_oss gptj gradium_phonon_tts granite granite4_vision
    granite4_vision_text granite_docling granite_docling_text granite_docling_vision
    granite_speech granite_speech5_ctc granite_speech5_encoder
    granite_speech_encoder granite_speech_plus granite_speech_plus_encoder
    granite_swa granitemoe granitemoe_swa granitemoehybrid granitemoeshared
    grounding-dino groupvit groupvit_text_model groupvit_vision_model gte helium
    hgnet_v2 hiera higgs_audio_v2 higgs_audio_v2_tokenizer hrm_text hubert
    hunyuan_v1_dense hunyuan_v1_moe hunyuan_vl hunyuan_vl_text hunyuan_vl_vision
    hy_v3 hy_v4 hy_v4_vl hy_v4_vl_text hy_v4_vl_vision hyperclovax
    hyperclovax_vision_v2 ibert idefics idefics2 idefics2_perceiver idefics2_vision
    idefics3 idefics3_vision idefics_perciever idefics_vision ijepa imagegpt
    informer inkling2 inkling2_loop inkling2_loop_text inkling2_text inkling2_vision
    inkling_audio inkling_mm_model inkling_text inkling_vision instructblip
    instructblip_qformer instructblip_vision_model instructblipvideo
    instructblipvideo_qformer instructblipvideo_vision_model internlm3 internvl
    internvl_vision iquestcoder jais2 jamba janus janus_vision_model janus_vqgan
    jetmoe jev jina_embeddings_v3 kimi_k25 kimi_k25_vision kimi_linear kolibri1
    kolibri1_1 kosmos-2 kosmos-2.5 kosmos_2_5_text_model kosmos_2_5_vision_model
    kosmos_2_text_model kosmos_2_vision_model kyutai_speech_to_text laguna lara_mini
    lasr_ctc lasr_encoder layoutlm layoutlmv2 layoutlmv3 layoutxlm led levit lfm2
    lfm2_moe lfm2_vl lfm3 lfm3_vl lfm3_vl_vision lightglue lighton_ocr lilt llama
    llama4 llama4_text llama4_vision_model llava llava_next llava_next_video
    llava_onevision llava_onevision1_5 llava_onevision1_5_vision longcat_flash
    longformer longt5 luke lw_detr lw_detr_vit lxmert m2m_100 mamba mamba2 marian
    markuplm mask2former maskformer maskformer-swin mbart megatron-bert mellum
    metaclip_2 metaclip_2_text_model metaclip_2_vision_model mgp-str mimi
    mimi_decoder mimi_encoder mimo_v2_flash minicpm3 minicpm5_moe minicpm_ocr
    minicpm_ocr_vision minicpmv4_6 minicpmv4_6_vision minicpmv4_7 minicpmv4_7_vision
    minimax minimax_m2 minimax_m3_vl minimax_m3_vl_text minimax_m3_vl_vision
    ministral ministral3 mistral mistral3 mistral4 mistral_large4
    mistral_large4_text mixtral mlcd mlcd_vision_model mllama mllama_text_model
    mllama_vision_model mm-grounding-dino mobilebert mobilenet_v1 mobilenet_v2
    mobilevit mobilevitv2 modernbert modernbert-decoder modernvbert molmo2
    molmo2_adapter molmo2_text molmo2_vision moonshine moonshine_streaming
    moonshine_streaming_encoder moshi moshi_depth moss_transcribe_diarize
    moss_transcribe_diarize_audio mpnet mpt mra mt5 muse_glimmer
    muse_glimmer_assistant muse_glimmer_text muse_glimmer_vision muse_spark
    muse_spark_audio muse_spark_text muse_spark_vision musicflamingo musicgen
    musicgen_decoder musicgen_melody musicgen_melody_decoder mvp nanochat
    nemo_speechlm nemotron nemotron3_5_asr nemotron3_5_transcribe_asr_audio
    nemotron3_5_transcribe_audio nemotron3_5_transcribe_word_timestamp
    nemotron3_diarization nemotron3_diarization_audio nemotron_asr_streaming
    nemotron_asr_streaming_encoder nemotron_h nemotron_h_omni neomme neucodec
    nllb-moe nomic_bert nougat nystromformer olmo olmo2 olmo3 olmo_hybrid olmoe
    omdet-turbo omniasr omniasr_audio omniasr_ctc oneformer openai-gpt
    openai_privacy_filter opt ovis2 ovis2_5 ovis2_5_vision ovis2_vision owlv2
    owlv2_text_model owlv2_vision_model owlvit owlvit_text_model owlvit_vision_model
    paddleocr_vl paddleocr_vl_text paddleocr_vl_vision paligemma parakeet_ctc
    parakeet_encoder parakeet_rnnt parakeet_tdt param2moe patchtsmixer patchtst
    pe_audio pe_audio_encoder pe_audio_video pe_audio_video_encoder pe_video
    pe_video_encoder pegasus pegasus_x perceiver perception_lm persimmon phi phi3
    phi4_multimodal phi4_multimodal_audio phi4_multimodal_vision phimoe pi0 pi05
    pix2struct pix2struct_text_model pix2struct_vision_model pixio pixtral plbart
    pocket_tts pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder
    pocket_tts_audio_tokenizer_encoder poolformer pop2piano pp_chart2table
    pp_chart2table_vision pp_doclayout_v2 pp_doclayout_v3 pp_doclayout_v4
    pp_formulanet pp_formulanet_text pp_formulanet_vision pp_lcnet pp_lcnet_v3
    pp_lcnet_v4 pp_ocrv5_mobile_det pp_ocrv5_mobile_rec pp_ocrv5_server_det
    pp_ocrv5_server_rec pp_ocrv6_medium_det pp_ocrv6_small_det pp_ocrv6_small_rec
    pp_ocrv6_tiny_rec prompt_depth_anything prophetnet pvt pvt_v2 qianfan_ocr
    qianfan_ocr_vision qwen2 qwen2_5_omni qwen2_5_omni_audio_encoder
    qwen2_5_omni_bigvgan qwen2_5_omni_dit qwen2_5_omni_talker qwen2_5_omni_text
    qwen2_5_omni_thinker qwen2_5_omni_token2wav qwen2_5_omni_vision_encoder
    qwen2_5_vl qwen2_5_vl_text qwen2_5_vl_vision qwen2_audio qwen2_audio_encoder
    qwen2_moe qwen2_vl qwen2_vl_text qwen2_vl_vision qwen3 qwen3_5 qwen3_5_moe
    qwen3_5_moe_text qwen3_5_moe_vision qwen3_5_text qwen3_5_vision qwen3_asr
    qwen3_asr_encoder qwen3_moe qwen3_next qwen3_omni_moe
    qwen3_omni_moe_audio_encoder qwen3_omni_moe_talker_code_predictor
    qwen3_omni_moe_talker_text qwen3_omni_moe_text qwen3_omni_moe_thinker
    qwen3_omni_moe_vision_encoder qwen3_vl qwen3_vl_moe qwen3_vl_moe_text
    qwen3_vl_moe_vision qwen3_vl_text qwen3_vl_vision qwen4_exp qwen4_exp_text
    qwen4_exp_vision radio rag recurrent_gemma reformer regnet rembert resnet
    rf_detr rf_detr_dinov2 roberta roberta-prelayernorm roc_bert roformer rt_detr
    rt_detr_resnet rt_detr_v2 rwkv sam sam2 sam2_hiera_det_model sam2_mask_decoder
    sam2_prompt_encoder sam2_video sam2_video_mask_decoder sam2_video_prompt_encoder
    sam2_vision_model sam3 sam3_detr_decoder sam3_detr_encoder sam3_geometry_encoder
    sam3_lite_text sam3_lite_text_detr_decoder sam3_lite_text_detr_encoder
    sam3_lite_text_geometry_encoder sam3_lite_text_mask_decoder
    sam3_lite_text_text_model sam3_mask_decoder sam3_tracker
    sam3_tracker_mask_decoder sam3_tracker_prompt_encoder sam3_tracker_video
    sam3_tracker_video_mask_decoder sam3_tracker_video_prompt_encoder sam3_video
    sam3_vision_model sam3_vit_model sam_hq sam_hq_mask_decoder
    sam_hq_prompt_encoder sam_hq_vision_model sam_mask_decoder sam_prompt_encoder
    sam_vision_model sapiens2 sapiens2_head sarvam_mla sarvam_moe seamless_m4t
    seamless_m4t_v2 seed_oss segformer seggpt semantic sew sew-d shieldgemma2 siglip
    siglip2 siglip2_text_model siglip2_vision_model siglip_text_model
    siglip_vision_model slanet slanext slanext_vision smollm3 smolvlm smolvlm_vision
    solar_open speech-encoder-decoder speech_to_text speecht5 speecht5_hifigan
    splinter squeezebert stablelm starcoder2 step3p5 step3p5_vision step3p7
    superglue superpoint swiftformer swin swin2sr swinv2 switch_transformers t5
    t5_gemma_module t5gemma t5gemma2 t5gemma2_decoder t5gemma2_encoder t5gemma2_text
    table-transformer tapas textnet time_series_transformer timesfm timesfm2_5
    timesformer timm_backbone timm_wrapper tipsv2 tipsv2_dpt tipsv2_text_model
    tipsv2_vision_model trocr tvp udop ultrabert ultravbert umt5 unispeech
    unispeech-sat univnet unlimited_ocr unlimited_ocr_sam_vision_model
    unlimited_ocr_text unlimited_ocr_vision unlimited_ocr_vision_encoder upernet
    uvdoc uvdoc_backbone vaultgemma vibevoice vibevoice_acoustic_tokenizer
    vibevoice_acoustic_tokenizer_decoder vibevoice_acoustic_tokenizer_encoder
    vibevoice_asr vibevoice_diffusion video_llama_3 video_llama_3_vision video_llava
    videomae videomt videoprism videoprism_text_model videoprism_vision_model vilt
    vipllava vision-encoder-decoder vision-text-dual-encoder visual_bert vit vit_mae
    vit_msn vitdet vitmatte vitpose vitpose_backbone vits vivit vjepa2 voxtral
    voxtral_encoder voxtral_realtime voxtral_realtime_encoder voxtral_realtime_text
    wav2vec2 wav2vec2-bert wav2vec2-conformer wavlm wavtokenizer
    wavtokenizer_encoder whisper xclip xclip_text_model xclip_vision_model xcodec
    xcodec2 xglm xlm xlm-roberta xlm-roberta-xl xlnet xlstm xmod yolos yoso youtu
    zamba zamba2 zaya zoedepth
""".split())
CHECKED: frozenset[str] = frozenset("""
    EvollaModel afmoe apertus apertus1p5_text arcee aria_text axk1 axk2
    bailing_hybrid bamba beam bitnet blt_global_transformer blt_local_decoder
    blt_local_encoder blt_patcher chameleon clvp_encoder codegen cohere cohere2
    cohere2_moe csm csm_depth_decoder_model cwm dbrx deepseek_ocr2_encoder
    deepseek_ocr2_text deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 dia_decoder
    dia_encoder diffllama diffusion_gemma_text doge dory dots1
    dots3_note_audio_encoder dots3_note_text embedding_gemma2_text emu3_text_model
    ergo ernie4_5 ernie4_5_moe esm esmc eurobert evolla exaone exaone4 exaone_moe
    falcon falcon_h1 flex_olmo flint gemma gemma2 gemma3_text gemma3n_text
    gemma4_text gemma4_unified_text glm glm4 glm4_moe glm4_moe_lite glm_moe_dsa
    glmasr_encoder gpt_neox gpt_neox_japanese gpt_oss gptj gradium_phonon_tts
    granite granite4_vision_text granite_docling_text granite_swa granitemoe
    granitemoe_swa granitemoehybrid granitemoeshared gte helium higgs_audio_v2
    hrm_text hunyuan_v1_dense hunyuan_v1_moe hy_v3 hy_v4 hyperclovax idefics
    internlm3 iquestcoder jais2 jetmoe jina_embeddings_v3 kolibri1 kolibri1_1
    kyutai_speech_to_text laguna lara_mini lasr_encoder lfm2 lfm2_moe lfm3 llama
    llama4_text longcat_flash mellum mimi mimi_decoder mimi_encoder mimo_v2_flash
    minicpm3 minicpm5_moe minimax minimax_m2 minimax_m3_vl_text ministral ministral3
    mistral mistral4 mistral_large4_text mixtral mllama_text_model modernbert
    modernbert-decoder molmo2_text moonshine moonshine_streaming moshi
    muse_glimmer_assistant muse_glimmer_text muse_spark_text nanochat nemotron
    nemotron3_5_transcribe_asr_audio nemotron3_5_transcribe_word_timestamp
    nemotron3_diarization_audio neucodec nomic_bert olmo olmo2 olmo3 olmo_hybrid
    olmoe openai_privacy_filter param2moe pe_audio_encoder pe_audio_video_encoder
    pe_video_encoder persimmon phi phi3 phi4_multimodal phimoe pocket_tts
    pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder
    pocket_tts_audio_tokenizer_encoder qwen2 qwen2_5_omni_dit qwen2_moe qwen3
    qwen3_moe qwen3_next qwen3_omni_moe_talker_code_predictor recurrent_gemma
    roformer sarvam_mla sarvam_moe seamless_m4t seed_oss smollm3 solar_open stablelm
    starcoder2 step3p5 t5_gemma_module t5gemma2_decoder t5gemma2_text timesfm2_5
    ultrabert unlimited_ocr_text vaultgemma voxtral_realtime_encoder
    voxtral_realtime_text wav2vec2-bert wav2vec2-conformer xcodec2 youtu zamba2 zaya
""".split())
NOPE_LAYERS: dict[str, frozenset[str]] = {
    "afmoe": frozenset(("full_attention",)),
    "bailing_hybrid": frozenset(("linear_attention",)),
    "bamba": frozenset(("linear_attention",)),
    "beam": frozenset(("full_attention",)),
    "cohere2": frozenset(("full_attention",)),
    "cohere2_moe": frozenset(("full_attention",)),
    "ergo": frozenset(("full_attention",)),
    "exaone4": frozenset(("full_attention",)),
    "exaone_moe": frozenset(("full_attention",)),
    "flint": frozenset(("full_attention",)),
    "granitemoehybrid": frozenset(("linear_attention",)),
    "kolibri1": frozenset(("full_attention",)),
    "kolibri1_1": frozenset(("indexed_attention",)),
    "lara_mini": frozenset(("full_attention", "linear_attention")),
    "lfm3": frozenset(("conv",)),
    "llama4_text": frozenset(("full_attention",)),
    "minimax": frozenset(("linear_attention",)),
    "muse_glimmer_text": frozenset(("full_attention",)),
    "muse_spark_text": frozenset(("full_attention",)),
    "olmo_hybrid": frozenset(("linear_attention",)),
    "qwen3_5_moe_text": frozenset(("linear_attention",)),
    "qwen3_5_text": frozenset(("linear_attention",)),
    "qwen3_next": frozenset(("linear_attention",)),
    "qwen4_exp_text": frozenset(("linear_attention",)),
    "recurrent_gemma": frozenset(("linear_attention",)),
    "zamba2": frozenset(("linear_attention",)),
}
WHOLE_HEAD: frozenset[str] = frozenset("""
    EvollaModel afmoe arcee aria_text beam bitnet blt_global_transformer
    blt_local_decoder blt_local_encoder blt_patcher chameleon cohere cohere2
    cohere2_moe csm csm_depth_decoder_model dbrx deepseek_ocr2_encoder
    deepseek_ocr2_text dia_decoder dia_encoder diffllama doge dory dots1
    embedding_gemma2_text emu3_text_model ergo ernie4_5 ernie4_5_moe esmc eurobert
    evolla exaone exaone4 exaone_moe falcon falcon_h1 flex_olmo flint gemma gemma2
    gemma3_text gemma3n_text gradium_phonon_tts granite granite4_vision_text
    granite_docling_text granite_swa granitemoe granitemoe_swa granitemoehybrid
    granitemoeshared gte
    helium hrm_text hunyuan_v1_dense hunyuan_v1_moe hy_v3 hyperclovax idefics
    internlm3 iquestcoder jais2 jetmoe jina_embeddings_v3 kolibri1 kolibri1_1
    kyutai_speech_to_text lara_mini lasr_encoder lfm2 lfm2_moe llama llama4_text
    mellum mimi mimi_decoder mimi_encoder minicpm5_moe minimax ministral mistral
    mixtral mllama_text_model modernbert modernbert-decoder molmo2_text moshi
    muse_glimmer_assistant muse_glimmer_text muse_spark_text nanochat neucodec
    nomic_bert olmo olmo2 olmo3 olmo_hybrid olmoe pe_audio_encoder
    pe_audio_video_encoder pe_video_encoder phimoe pocket_tts
    pocket_tts_audio_tokenizer pocket_tts_audio_tokenizer_decoder
    pocket_tts_audio_tokenizer_encoder qwen2 qwen2_5_omni_dit qwen2_moe qwen3
    qwen3_moe qwen3_omni_moe_talker_code_predictor seed_oss smollm3 starcoder2
    step3p5 t5_gemma_module t5gemma2_decoder t5gemma2_text timesfm2_5 ultrabert
    unlimited_ocr_text vaultgemma voxtral_realtime_encoder voxtral_realtime_text
    xcodec2 zamba2
""".split())
