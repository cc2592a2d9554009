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
  seq, head_dim);
- ``vision``: a vision tower's rotary module and ``apply_rotary_pos_emb_vision``, on its
  own patch grid positions; q, k are (tokens, heads, head_dim);
- ``unsupported``: configs from_hf_config must refuse (stored without outputs);
- ``grid``: the models' own position helpers (``get_rope_index``, vision grids), to
  check fastpe.mrope_positions / vision_positions.

The models compute cos/sin in float32. To compare at float64 rounding, this script runs
their code with float32 promoted to float64 (``torch.float`` and ``Tensor.float``
patched while a case runs), so every step is the model's own, in double precision.
"""

import contextlib
import importlib
import json
from pathlib import Path

import numpy as np
import torch
import transformers

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
    ("paddleocr_vl", "paddleocr_vl", "PaddleOCRTextConfig", "PaddleOCRRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e5, mrope_section=[4, 6, 6])), 3, None),
    ("cosmos3_edge", "cosmos3_edge", "Cosmos3EdgeTextConfig", "Cosmos3EdgeTextRotaryEmbedding",
     dict(SMALL, rope_parameters=rp(5e6, mrope_section=[6, 5, 5])), 3, None),
]


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
        qo, ko = mod.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k),
                                          cos.double(), sin.double())
    assert qo.dtype == torch.float64
    return ({"name": name, "kind": "text", "config": config_json(cfg), "layer_type": layer_type,
             "positions": pos.tolist(), "seed": seed, "q_shape": list(q.shape),
             "k_shape": list(k.shape), "layout": "bhsd"},
            {f"{name}/q": qo.numpy(), f"{name}/k": ko.numpy()})


UNSUPPORTED = [
    ("hunyuan_vl", "hunyuan_vl", "HunYuanVLTextConfig",
     dict(SMALL, rope_parameters=rp(1e4, mrope_section=[4, 4, 4, 4]))),
    ("hy_v4_vl", "hy_v4_vl", "HYV4VLTextConfig", {}),
]


def main():
    transformers.logging.set_verbosity_error()
    cases, arrays = [], {}
    for seed, case in enumerate(TEXT_CASES):
        meta, arr = run_text(case, seed)
        cases.append(meta)
        arrays.update(arr)
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
