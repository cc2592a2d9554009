"""Regenerate hf_mrope_reference.json/.npz: multi-axis RoPE as transformers' own code applies it.

Run by hand, never by the test suite, with a scratch virtualenv holding torch (CPU) and
transformers (no torchvision needed: only the rotary modules and functions are imported):

    /path/to/venv/bin/python tests/data/make_hf_mrope_reference.py

For every case it stores, in the JSON, the config as transformers writes it
(``to_json_string``), the multi-axis positions given to the model's rotary module and the
seed of the q and k inputs (float64 standard normal, numpy ``default_rng(seed)``, shapes
in the case); the npz holds the rotated q and k, keyed ``<name>/q`` and ``<name>/k``.

Cases:
- ``text``: a vision-language model's text rotary embedding (M-RoPE) and its
  ``apply_rotary_pos_emb``, on (axes, batch, seq) position_ids; q, k are (batch, heads,
  seq, head_dim); ``layer``: the layer index whose rotation it is, where some layers of
  the config apply none (linear attention); ``hf_order`` "deinterleaved" where the
  model's apply function pairs adjacent features and also moves them to [even | odd]
  (HY-V4-VL's ``apply_rotary_pos_emb_interleave`` from transformers 5.25), which the
  q.k products do not see;
- ``vision``: a vision tower's rotary module and ``apply_rotary_pos_emb_vision``, on its
  own patch grid positions; q, k are (tokens, heads, head_dim); ``typed_config`` is
  the same config as a hand-typed config.json without its base, which the tower's
  config class fills in with its own default;
- ``unsupported``: configs from_hf_config must refuse (stored without outputs);
- ``grid``: the models' own position helpers (``get_rope_index``, vision grids), to
  check fastpe.mrope_positions / vision_positions.

The models compute cos/sin in float32. To compare at float64 rounding, this script runs
their code with float32 promoted to float64 (``torch.float`` and ``Tensor.float``
patched while a case runs), so every step is the model's own, in double precision.
"""

import contextlib
import copy
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

# transformers 5.25 depends on `kernels`, whose use_kernel_forward_from_hub can wrap a
# modeling file's apply function in an nn.Module; hidden, the modules keep their plain
# functions (the same numbers: the wrapper calls them), as make_hf_zoo_reference.py does.
sys.modules["kernels"] = None
import transformers  # noqa: E402

HERE = Path(__file__).parent
JSON_OUT = HERE / "hf_mrope_reference.json"
NPZ_OUT = HERE / "hf_mrope_reference.npz"


@contextlib.contextmanager
def float64_everywhere():
    saved = torch.float, torch.float32, torch.Tensor.float
    torch.float = torch.float64
    torch.float32 = torch.float64
    torch.Tensor.float = torch.Tensor.double
    try:
        yield
    finally:
        torch.float, torch.float32, torch.Tensor.float = saved


def module(name, kind="modeling"):
    return importlib.import_module(f"transformers.models.{name}.{kind}_{name}")


def vl_positions(axes, batch, seq, seed):
    """(axes, batch, seq): text, an image grid (first axis constant, the last two row and
    column), text again; what get_rope_index gives a prompt with one image."""
    rng = np.random.default_rng(seed)
    out = np.empty((axes, batch, seq), np.int64)
    for b in range(batch):
        rows = []
        n_text = int(rng.integers(2, 5))
        rows += [[i] * axes for i in range(n_text)]
        h, w = 2, 3
        for r in range(h):
            for c in range(w):
                p = [n_text] * axes
                p[-2], p[-1] = n_text + r, n_text + c
                rows.append(p)
        nxt = n_text + max(h, w)
        while len(rows) < seq:
            rows.append([nxt] * axes)
            nxt += 1
        out[:, b] = np.array(rows[:seq]).T
    return out


def config_json(cfg):
    return json.loads(cfg.to_json_string())


def typed_without_base(cfg):
    """cfg's config.json as a user may type it, without its base and the version
    transformers writes: the class fills in its own default base, which cfg (made with
    the class's defaults) holds."""
    typed = {key: value for key, value in config_json(cfg).items()
             if key not in ("rope_parameters", "rope_scaling", "rope_theta",
                            "transformers_version")}
    assert type(cfg).from_dict(copy.deepcopy(typed)).rope_parameters == cfg.rope_parameters
    return typed


# (name, package, config class, rotary class, config kwargs, axes, layer_type)
SMALL = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
             max_position_embeddings=4096)
BIG = dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
           max_position_embeddings=4096)


def rp(theta, **kw):
    return dict(rope_type="default", rope_theta=theta, **kw)


TEXT_CASES = [
    ("qwen2_vl", "qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[4, 6, 6])), 3, None),
    ("qwen2_vl_default_sections", "qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding",
     dict(BIG, rope_parameters=rp(1e6)), 3, None),
    ("qwen2_5_vl", "qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[4, 6, 6])), 3, None),
    ("qwen2_5_omni", "qwen2_5_omni", "Qwen2_5OmniTextConfig", "Qwen2_5OmniRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[2, 7, 7])), 3, None),
    # the Omni talkers' text attention: the thinkers' rotary classes and apply function
    ("qwen2_5_omni_talker", "qwen2_5_omni", "Qwen2_5OmniTalkerConfig",
     "Qwen2_5OmniRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[2, 7, 7])), 3, None),
    ("qwen3_omni_moe_talker", "qwen3_omni_moe", "Qwen3OmniMoeTalkerTextConfig",
     "Qwen3OmniMoeTalkerRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[6, 5, 5], mrope_interleaved=True)), 3,
     None),
    ("qwen3_vl", "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e6, mrope_section=[6, 5, 5], mrope_interleaved=True)), 3,
     None),
    ("qwen3_vl_default_sections", "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding",
     dict(BIG, rope_parameters=rp(5e6)), 3, None),
    ("qwen3_vl_moe", "qwen3_vl_moe", "Qwen3VLMoeTextConfig", "Qwen3VLMoeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e6, mrope_section=[6, 5, 5], mrope_interleaved=True)), 3,
     None),
    ("qwen3_5_partial", "qwen3_5", "Qwen3_5TextConfig", "Qwen3_5TextRotaryEmbedding",
     dict(SMALL, head_dim=64, rope_parameters=rp(1e7, mrope_section=[3, 3, 2],
                                                 mrope_interleaved=True,
                                                 partial_rotary_factor=0.25)), 3, None),
    ("qwen3_5_moe", "qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeTextRotaryEmbedding",
     dict(SMALL, head_dim=128, rope_parameters=rp(1e7, partial_rotary_factor=0.5)), 3, None),
    ("qwen3_omni_moe", "qwen3_omni_moe", "Qwen3OmniMoeTextConfig",
     "Qwen3OmniMoeThinkerTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[6, 5, 5], mrope_interleaved=True)), 3,
     None),
    ("qwen4_exp", "qwen4_exp", "Qwen4ExpTextConfig", "Qwen4ExpTextRotaryEmbedding",
     dict(SMALL, head_dim=64, rope_parameters=rp(1e7, partial_rotary_factor=0.5)), 3, None),
    ("neomme_full", "neomme", "NeoMMEConfig", "NeoMMERotaryEmbedding",
     dict(SMALL, head_dim=64), 2, "full_attention"),
    ("neomme_sliding", "neomme", "NeoMMEConfig", "NeoMMERotaryEmbedding",
     dict(SMALL, head_dim=64), 2, "sliding_attention"),
    ("cohere_compass", "cohere_compass", "CohereCompassTextConfig",
     "CohereCompassRotaryEmbedding",
     dict(SMALL, head_dim=64, num_hidden_layers=2,
          layer_types=["full_attention", "sliding_attention"],
          rope_parameters={"full_attention": rp(1e6, mrope_section=[10, 11, 11]),
                           "sliding_attention": rp(1e4)}), 3, "sliding_attention"),
    # four axes (sequence, width, height, image index); the two features of a pair fall
    # in runs of different axes
    ("hunyuan_vl", "hunyuan_vl", "HunYuanVLTextConfig", "HunYuanVLRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e4, mrope_section=[2, 6, 6, 2])), 4, None),
    ("hunyuan_vl_ntk_alpha", "hunyuan_vl", "HunYuanVLTextConfig", "HunYuanVLRotaryEmbedding",
     dict(SMALL, rope_parameters=dict(rope_type="ntk_alpha", rope_theta=1e4, alpha=1000.0,
                                      mrope_section=[4, 4, 4, 4])), 4, None),
    # the checkpoints' "xdrope" (read as "dynamic") with an alpha: a fixed NTK base
    ("hunyuan_vl_dynamic_alpha", "hunyuan_vl", "HunYuanVLTextConfig", "HunYuanVLRotaryEmbedding",
     dict(SMALL, rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, alpha=1000.0,
                                      factor=1.0, mrope_section=[4, 4, 4, 4])), 4, None),
    # per layer type: a layer type's entry reads as transformers reads it (a partial
    # factor the default type ignores, YaRN's truncate from the top-level dict, never a
    # top-level original length)
    *[(f"cohere_compass_{name}", "cohere_compass", "CohereCompassTextConfig",
       "CohereCompassRotaryEmbedding",
       dict(SMALL, head_dim=64, num_hidden_layers=2,
            layer_types=["full_attention", "sliding_attention"], **top,
            rope_parameters={"full_attention": dict(full, mrope_section=[10, 11, 11]),
                             "sliding_attention": rp(1e4, partial_rotary_factor=0.5)}),
       3, "full_attention") for name, full, top in [
          ("entry_partial", rp(1e6, partial_rotary_factor=0.5), {}),
          ("yarn_no_truncate", dict(rope_type="yarn", rope_theta=1e6, factor=4.0,
                                    original_max_position_embeddings=1024, truncate=False),
           {}),
          ("yarn_top_original", dict(rope_type="yarn", rope_theta=1e6, factor=4.0),
           {"original_max_position_embeddings": 2048})]],
    ("glm4v_partial_gptj", "glm4v", "Glm4vTextConfig", "Glm4vTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e4, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)),
     3, None),
    ("glm4v_default_sections", "glm4v", "Glm4vTextConfig", "Glm4vTextRotaryEmbedding",
     dict(BIG, rope_parameters=rp(1e4, partial_rotary_factor=0.5)), 3, None),
    ("glm4v_moe", "glm4v_moe", "Glm4vMoeTextConfig", "Glm4vMoeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e6, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)),
     3, None),
    ("glm_ocr", "glm_ocr", "GlmOcrTextConfig", "GlmOcrTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e4, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)),
     3, None),
    ("glm_image", "glm_image", "GlmImageTextConfig", "GlmImageTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(1e4, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)),
     3, None),
    ("ernie4_5_vl_moe", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig",
     "Ernie4_5_VLMoeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e5, mrope_section=[5, 5, 6])), 3, None),
    ("ernie4_5_vl_moe_default_sections", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig",
     "Ernie4_5_VLMoeTextRotaryEmbedding", dict(BIG, rope_parameters=rp(5e5)), 3, None),
    # multi-head latent attention: M-RoPE (Qwen3-VL's interleaving) over the separate
    # rope part of q and k, which is all the apply function sees
    ("hy_v4_vl", "hy_v4_vl", "HYV4VLTextConfig", "HYV4VLRotaryEmbedding",
     dict(SMALL, qk_rope_head_dim=32, qk_nope_head_dim=64,
          rope_parameters=rp(1e6, mrope_section=[6, 5, 5])), 3, None),
    ("paddleocr_vl", "paddleocr_vl", "PaddleOCRTextConfig", "PaddleOCRRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e5, mrope_section=[4, 6, 6])), 3, None),
    ("cosmos3_edge", "cosmos3_edge", "Cosmos3EdgeTextConfig", "Cosmos3EdgeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e6, mrope_section=[6, 5, 5])), 3, None),
    # a top-level partial_rotary_factor, which these families' own default-type frequency
    # functions do not read: the whole head rotates
    *[(f"{name}_top_partial", pkg, cfg_cls, rot_cls,
       dict(SMALL, partial_rotary_factor=0.5, rope_parameters=rp(theta, mrope_section=sec,
                                                                 **extra)), axes, None)
      for name, pkg, cfg_cls, rot_cls, theta, sec, extra, axes in [
          ("qwen2_vl", "qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding", 1e6,
           [4, 6, 6], {}, 3),
          ("qwen2_5_vl", "qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding",
           1e6, [4, 6, 6], {}, 3),
          ("qwen2_5_omni", "qwen2_5_omni", "Qwen2_5OmniTextConfig",
           "Qwen2_5OmniRotaryEmbedding", 1e6, [2, 7, 7], {}, 3),
          ("paddleocr_vl", "paddleocr_vl", "PaddleOCRTextConfig", "PaddleOCRRotaryEmbedding",
           5e5, [4, 6, 6], {}, 3),
          ("hunyuan_vl", "hunyuan_vl", "HunYuanVLTextConfig", "HunYuanVLRotaryEmbedding", 1e4,
           [2, 6, 6, 2], {}, 4),
          ("qwen3_vl", "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding", 5e6,
           [6, 5, 5], {"mrope_interleaved": True}, 3),
          ("cosmos3_edge", "cosmos3_edge", "Cosmos3EdgeTextConfig",
           "Cosmos3EdgeTextRotaryEmbedding", 5e6, [6, 5, 5], {}, 3)]],
]

# (name, package, config class, rotary class, config kwargs, axes): configs on which the
# model's own rotary module and apply function fail (a partial_rotary_factor read by
# transformers' shared frequency functions for these rope types, while the attention
# rotates the whole head): fastpe must refuse them
MODEL_FAILS = [
    ("qwen2_vl_linear_top_partial", "qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding",
     dict(SMALL, partial_rotary_factor=0.5,
          rope_parameters=dict(rp(1e6, mrope_section=[4, 6, 6]), rope_type="linear",
                               factor=2.0)), 3),
    ("qwen3_vl_yarn_top_partial", "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding",
     dict(SMALL, partial_rotary_factor=0.5,
          rope_parameters=dict(rp(5e6, mrope_section=[6, 5, 5], mrope_interleaved=True),
                               rope_type="yarn", factor=2.0,
                               original_max_position_embeddings=1024)), 3),
    # its rotary module takes the default rope type alone
    ("ernie4_5_vl_moe_linear", "ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig",
     "Ernie4_5_VLMoeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=dict(rp(5e5, mrope_section=[5, 5, 6]), rope_type="linear",
                                      factor=2.0)), 3),
]


def run_model_fails(case):
    name, pkg, cfg_cls, rot_cls, kw, axes = case
    try:
        run_text((name, pkg, cfg_cls, rot_cls, kw, axes, None), 0)
    except (RuntimeError, ValueError) as exc:
        cfg = getattr(module(pkg, "configuration"), cfg_cls)(**kw)
        return {"name": name, "kind": "model_fails", "config": config_json(cfg),
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    raise AssertionError(f"{name}: the model's own code ran")


def run_text(case, seed):
    name, pkg, cfg_cls, rot_cls, kw, axes, layer_type = case
    cfg = getattr(module(pkg, "configuration"), cfg_cls)(**kw)
    mod = module(pkg)
    d = cfg.head_dim
    batch, seq, heads, kv = (2, 11, 2, 1) if d <= 64 else (1, 11, 1, 1)
    pos = vl_positions(axes, batch, seq, seed)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads, seq, d))
    k = rng.standard_normal((batch, kv, seq, d))
    with float64_everywhere():
        rot = getattr(mod, rot_cls)(cfg)
        x = torch.zeros(1, dtype=torch.float64)
        args = (layer_type,) if layer_type else ()
        cos, sin = rot(x, torch.from_numpy(pos), *args)
        # the function the text attention applies: HY-V4-VL's (transformers 5.25) pairs
        # adjacent features and returns them as [even | odd]
        apply = getattr(mod, "apply_rotary_pos_emb", None)
        order = "same" if apply is not None else "deinterleaved"
        apply = apply or mod.apply_rotary_pos_emb_interleave
        qo, ko = apply(torch.from_numpy(q), torch.from_numpy(k), cos.double(), sin.double())
    assert qo.dtype == torch.float64
    # Qwen3.5's and Qwen4-Exp's linear-attention layers (a gated delta net) apply no RoPE:
    # the case is the rotation of the first attention layer
    kinds = getattr(cfg, "layer_types", None) or []
    layer = (next(i for i, t in enumerate(kinds) if t != "linear_attention")
             if "linear_attention" in kinds else None)
    return ({"name": name, "kind": "text", "config": config_json(cfg), "layer_type": layer_type,
             "layer": layer, "positions": pos.tolist(), "seed": seed, "q_shape": list(q.shape),
             "k_shape": list(k.shape), "layout": "bhsd", "hf_order": order},
            {f"{name}/q": qo.numpy(), f"{name}/k": ko.numpy()})


# (name, package, rotary class, apply function, axes): vision towers at their default
# config (the released model's sizes); the apply function takes q, k as (tokens, heads,
# head_dim) and cos, sin as the rotary module returns them, except "pixtral" (its
# apply_rotary_pos_emb on (heads, tokens, head_dim) with unsqueeze_dim=0).
VISION_CASES = [
    (pkg, pkg, rot, "apply_rotary_pos_emb_vision", 2) for pkg, rot in [
        ("qwen2_vl", "Qwen2VLVisionRotaryEmbedding"),
        ("qwen2_5_vl", "Qwen2_5_VLVisionRotaryEmbedding"),
        ("qwen2_5_omni", "Qwen2_5OmniVisionRotaryEmbedding"),
        ("qwen3_vl", "Qwen3VLVisionRotaryEmbedding"),
        ("qwen3_vl_moe", "Qwen3VLMoeVisionRotaryEmbedding"),
        ("qwen3_5", "Qwen3_5VisionRotaryEmbedding"),
        ("qwen3_5_moe", "Qwen3_5MoeVisionRotaryEmbedding"),
        ("qwen3_omni_moe", "Qwen3OmniMoeVisionRotaryEmbedding"),
        ("qwen4_exp", "Qwen4ExpVisionRotaryEmbedding"),
        ("glm4v", "Glm4vVisionRotaryEmbedding"),
        ("glm4v_moe", "Glm4vMoeVisionRotaryEmbedding"),
        ("glm_ocr", "GlmOcrVisionRotaryEmbedding"),
        ("glm5_next", "Glm5NextVisionRotaryEmbedding"),
        ("paddleocr_vl", "PaddleOCRVisionRotaryEmbedding"),
        ("ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionRotaryEmbedding"),
        ("cohere_compass", "CohereCompassVisionRotaryEmbedding"),
        ("dots3_note", "Dots3NoteVisionRotaryEmbedding"),
        ("exaone4_5", "Exaone4_5_VisionRotaryEmbedding"),
        ("lfm3_vl", "Lfm3VlVisionRotaryEmbedding"),
        ("mlcd", "MLCDRotaryEmbedding"),
        ("video_llama_3", "VideoLlama3VisionRotaryEmbedding"),
        ("step3p7", "Step3p7VisionRotaryEmbedding"),
        ("inkling2", "Inkling2VisionRotaryEmbedding"),
        ("kimi_k25", "Kimi_K25VisionRotaryEmbedding"),
    ]
] + [
    ("pixtral", "pixtral", "PixtralVisionRotaryEmbedding", "pixtral", 2),
    ("minimax_m3_vl", "minimax_m3_vl", "MiniMaxM3VLVisionRotaryEmbedding",
     "apply_rotary_pos_emb_vision", 3),
]


def grid_positions(axes, seed):
    """(tokens, axes): two images' patch grids, (row, column) from 0 in each
    (a frame index first for three axes)."""
    rows = []
    for frame, (h, w) in enumerate(((2, 3), (1, 2))):
        for r in range(h):
            for c in range(w):
                rows.append(([frame] if axes == 3 else []) + [r, c])
    return np.array(rows, np.int64)


def run_vision(case, seed):
    name, pkg, rot_cls, apply_name, axes = case
    mod = module(pkg)
    rot_type = getattr(mod, rot_cls)
    import inspect
    ann = inspect.signature(rot_type.compute_axial_rope_parameters).parameters["config"].annotation
    cfg = (getattr(mod, ann) if isinstance(ann, str) else ann)()
    pos = grid_positions(axes, seed)
    with float64_everywhere():
        rot = rot_type(cfg)
        # the head width as the tower's attention computes it
        d = (cfg.embed_dim if pkg == "qwen2_vl" else cfg.hidden_size) // cfg.num_attention_heads
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((len(pos), 1, d))
        k = rng.standard_normal((len(pos), 1, d))
        x = torch.zeros(1, dtype=torch.float64)
        cos, sin = rot(x, torch.from_numpy(pos))
        tq, tk = torch.from_numpy(q), torch.from_numpy(k)
        if apply_name == "pixtral":
            qo, ko = mod.apply_rotary_pos_emb(tq.transpose(0, 1), tk.transpose(0, 1), cos, sin,
                                              unsqueeze_dim=0)
            qo, ko = qo.transpose(0, 1), ko.transpose(0, 1)
        else:
            qo, ko = getattr(mod, apply_name)(tq, tk, cos, sin)
    assert qo.dtype == torch.float64 and qo.shape == q.shape
    return ({"name": f"{name}_vision", "kind": "vision", "config": config_json(cfg),
             "typed_config": typed_without_base(cfg), "layer_type": None,
             "positions": pos.T.tolist(), "seed": seed,
             "q_shape": list(q.shape), "k_shape": list(k.shape), "layout": "shd"},
            {f"{name}_vision/q": qo.numpy(), f"{name}_vision/k": ko.numpy()})


def run_llama4(seed):
    """Llama 4's vision tower: its rotary table covers the whole patch grid plus the CLS
    token (last), so the positions are the model's own: (row + 1, column + 1) per patch
    in row-major order, (0, 0) for CLS."""
    mod = module("llama4")
    cfg = module("llama4", "configuration").Llama4VisionConfig(image_size=56, patch_size=14)
    side = cfg.image_size // cfg.patch_size
    d = cfg.hidden_size // cfg.num_attention_heads
    rows, cols = np.divmod(np.arange(side * side), side)
    pos = np.stack([np.append(rows + 1, 0), np.append(cols + 1, 0)])
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, pos.shape[1], 1, d))
    k = rng.standard_normal((1, pos.shape[1], 1, d))
    with float64_everywhere():
        freqs_ci = mod.Llama4VisionRotaryEmbedding(cfg)(torch.zeros(1))
        qo, ko = mod.vision_apply_rotary_emb(torch.from_numpy(q), torch.from_numpy(k), freqs_ci)
    assert qo.dtype == torch.float64
    return ({"name": "llama4_vision", "kind": "vision", "config": config_json(cfg),
             "layer_type": None, "positions": pos.tolist(), "seed": seed,
             "q_shape": list(q.shape), "k_shape": list(k.shape), "layout": "bshd"},
            {"llama4_vision/q": qo.numpy(), "llama4_vision/k": ko.numpy()})


# (name, package, model class, prompt segments, spatial_merge_size): a prompt of text
# runs (int) and images (t, h, w patches), through the model's own get_rope_index.
ROPE_INDEX_CASES = [
    ("qwen2_vl_prompt", "qwen2_vl", "Qwen2VLModel", [3, (1, 4, 6), 2], 2),
    ("qwen2_5_vl_two_images", "qwen2_5_vl", "Qwen2_5_VLModel", [2, (1, 2, 2), 1, (1, 6, 4), 3], 2),
    ("qwen3_vl_prompt", "qwen3_vl", "Qwen3VLModel", [(1, 4, 4), 4], 2),
    ("glm4v_prompt", "glm4v", "Glm4vModel", [1, (1, 4, 8), 2], 2),
    ("qwen2_vl_video", "qwen2_vl", "Qwen2VLModel", [2, (3, 2, 4), 1], 2),
    # Qwen2.5-VL video: frames tokens_per_second (2) * second_per_grid_t (1.5) apart
    ("qwen2_5_vl_video", "qwen2_5_vl", "Qwen2_5_VLModel", [2, (3, 2, 4, 3.0), 1], 2),
    # and at 2.75 frames a second, 25 tokens a second: second_per_grid_t = 2 / 2.75, a
    # float32 tensor as the processor gives it; the step the model's own time_interval
    # (run_rope_index fills it in), whose float32 products truncate differently from
    # float64 ones (frame 11: 200, not 199)
    ("qwen2_5_vl_video_fps", "qwen2_5_vl", "Qwen2_5_VLModel", [2, (24, 2, 2, None), 1], 2,
     (25, 2 / 2.75)),
]

# (name, grids, spatial_merge_size, include_temporal): transformers.vision_utils'
# get_vision_position_ids, the patch order of the Qwen-VL, GLM-4V, PaddleOCR and
# MiniMax-M3 towers.
VISION_GRID_CASES = [
    ("merge2_two_images", [(1, 4, 6), (2, 2, 4)], 2, False),
    ("merge1", [(1, 3, 5)], 1, False),
    ("temporal", [(2, 2, 2), (1, 4, 2)], 2, True),
]


def run_rope_index(case):
    import functools
    import types
    name, pkg, model_cls, segments, merge = case[:5]
    tokens_per_second, second_per_grid_t = case[5] if len(case) > 5 else (2, 1.5)
    if any(not isinstance(s, int) and len(s) == 4 and s[3] is None for s in segments):
        interval = tokens_per_second * torch.tensor([second_per_grid_t])[0]
        segments = [s if isinstance(s, int) or len(s) < 4 or s[3] is not None
                    else (*s[:3], float(interval)) for s in segments]
    cls = getattr(module(pkg), model_cls)
    ids, types_ = [], []
    grids = []
    for seg in segments:
        if isinstance(seg, int):
            ids += [7] * seg
            types_ += [0] * seg
        else:
            t, h, w = seg[:3]
            n = t * (h // merge) * (w // merge)
            ids += [9] * n
            types_ += [1 if t == 1 else 2] * n
            grids.append(tuple(seg[:3]))
    images = [g for g in grids if g[0] == 1]
    videos = [g for g in grids if g[0] != 1]
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
            spatial_merge_size=merge, tokens_per_second=tokens_per_second)),
        get_vision_position_ids=functools.partial(cls.get_vision_position_ids, None))
    extra = {}
    if pkg == "qwen2_5_vl" and videos:
        extra["second_per_grid_ts"] = torch.tensor([second_per_grid_t] * len(videos))
    pos, _ = cls.get_rope_index(
        fake, torch.tensor([ids]), torch.tensor([types_]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None, **extra)
    return {"name": name, "kind": "rope_index", "segments": [list(s) if not isinstance(s, int)
                                                             else s for s in segments],
            "spatial_merge_size": merge, "positions": pos[:, 0].tolist()}


def run_vision_grid(case):
    from transformers.vision_utils import get_vision_position_ids
    name, grids, merge, temporal = case
    pos = get_vision_position_ids(torch.tensor(grids), merge, include_temporal=temporal)
    return {"name": name, "kind": "vision_grid", "grids": [list(g) for g in grids],
            "spatial_merge_size": merge, "temporal": temporal, "positions": pos.T.tolist()}


def run_gemma4(seed):
    """Gemma 4's tower: positions (batch, patches, 2) hold (x, y) = (column, row); each
    half of the head rotates by one of them (apply_multidimensional_rope)."""
    mod = module("gemma4")
    cfg = module("gemma4", "configuration").Gemma4VisionConfig()
    grid = grid_positions(2, seed)                       # (tokens, 2): row, column
    xy = grid[:, ::-1].copy()[None]                      # (1, tokens, 2): column, row
    d = cfg.head_dim
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, len(grid), 2, d))
    k = rng.standard_normal((1, len(grid), 1, d))
    with float64_everywhere():
        rot = mod.Gemma4VisionRotaryEmbedding(cfg)
        cos, sin = rot(torch.zeros(1, dtype=torch.float64), torch.from_numpy(xy))
        pid = torch.from_numpy(xy)
        qo = mod.apply_multidimensional_rope(torch.from_numpy(q), cos, sin, pid)
        ko = mod.apply_multidimensional_rope(torch.from_numpy(k), cos, sin, pid)
    assert qo.dtype == torch.float64
    return ({"name": "gemma4_vision", "kind": "vision", "config": config_json(cfg),
             "typed_config": typed_without_base(cfg), "layer_type": None,
             "positions": grid.T.tolist(), "seed": seed,
             "q_shape": list(q.shape), "k_shape": list(k.shape), "layout": "bshd"},
            {"gemma4_vision/q": qo.numpy(), "gemma4_vision/k": ko.numpy()})


UNSUPPORTED = [
    # their towers give the rotary module (column + 1, row + 1) per patch
    ("muse_glimmer_vision", "muse_glimmer", "MuseGlimmerVisionConfig", {}),
    ("muse_spark_vision", "muse_spark", "MuseSparkVisionConfig", {}),
]


def main():
    transformers.logging.set_verbosity_error()
    cases, arrays = [], {}
    for seed, case in enumerate(TEXT_CASES):
        meta, arr = run_text(case, seed)
        cases.append(meta)
        arrays.update(arr)
    for seed, case in enumerate(VISION_CASES, start=100):
        meta, arr = run_vision(case, seed)
        cases.append(meta)
        arrays.update(arr)
    for run in (run_llama4, run_gemma4):
        meta, arr = run(200)
        cases.append(meta)
        arrays.update(arr)
    cases += [run_rope_index(c) for c in ROPE_INDEX_CASES]
    cases += [run_vision_grid(c) for c in VISION_GRID_CASES]
    cases += [run_model_fails(c) for c in MODEL_FAILS]
    for name, pkg, cfg_cls, kw in UNSUPPORTED:
        cfg = getattr(module(pkg, "configuration"), cfg_cls)(**kw)
        cases.append({"name": name, "kind": "unsupported", "config": config_json(cfg)})
    document = {
        "generated_by": "tests/data/make_hf_mrope_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "cases": cases,
    }
    JSON_OUT.write_text(json.dumps(document, indent=None, separators=(",", ":")) + "\n")
    np.savez_compressed(NPZ_OUT, **arrays)
    print(f"wrote {len(cases)} cases to {JSON_OUT.name} and {NPZ_OUT.name}")


if __name__ == "__main__":
    main()
