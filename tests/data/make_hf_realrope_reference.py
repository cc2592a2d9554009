"""Regenerate hf_realrope_reference.json/.npz: RoPE on real-valued coordinates as
transformers' own code applies it (DINOv3 and the models on its backbone; the memory
attention of SAM 2, SAM 3's tracker and EdgeTAM; SAM 3's ViT; EfficientLoFTR).

Run by hand, never by the test suite, with a scratch virtualenv holding torch (CPU) and
transformers 5.25:

    /path/to/venv/bin/python tests/data/make_hf_realrope_reference.py

Each case builds a small random config, the model's own rotary module (run in eval mode:
the coordinate augmentations are training-only) on a dummy image of ``grid`` patches,
and the model's own ``apply_rotary_pos_emb`` on float64 standard-normal q and k laid out
as the attention holds them, (batch, heads, tokens, head_dim), prefix tokens (CLS,
registers, EoMT's queries) in front. The JSON holds the config as transformers writes
it and the shapes; the npz holds, keyed ``<name>/<array>``, the inputs ``q``, ``k``, the
outputs ``q_out``, ``k_out``, and ``coords``, the patch coordinates the model's code
makes, (tokens, 2).

SAM cases (``frames`` in the JSON) run the memory attention's rotary module on its own
precomputed positions (``coords`` in the npz: (tokens, 2), column then row) and its
apply function: self-attention (q and k on the feature map) and cross-attention (keys:
``frames`` memory frames of the map, EdgeTAM's each after ``temporal`` unrotated
tokens on its key grid, then ``pointers`` object-pointer tokens, not rotated).

SAM 3 ViT cases (``window`` in the JSON) run one layer's rotary module on the positions
that layer precomputes (``<layer>/coords``: windowed and global) and the apply function
on q and k of that layer's tokens.

EfficientLoFTR cases (``coarse`` in the JSON: the coarse feature map's size) run its
rotary module on dummy coarse features and its apply function on q and k of
(batch, tokens, 1, hidden_size), as its attention holds them before splitting heads;
``coords`` is the (row, column) its code gives each token, from ``compute_embeddings``
with unit frequencies.

The models compute in float32; as make_hf_mrope_reference.py does, each case runs with
float32 promoted to float64, so every step is the model's own, in double precision.

Cases named ``*_typed`` are config.json dicts as a user may type them, leaving out keys
or holding the base where the config class moves it from (a top-level ``rope_theta``,
SAM's deprecated ``memory_attention_rope_theta``, no register count, SAM 3's tracker
map from ``image_size``): the model is built from ``from_dict`` of the dict, as
AutoConfig loads config.json, and the JSON's ``config`` is the dict itself.
"""

import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

# transformers 5.25's `kernels` package hidden, as make_hf_mrope_reference.py does
sys.modules["kernels"] = None
import transformers  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from make_hf_mrope_reference import config_json, float64_everywhere, module  # noqa: E402

JSON_OUT = HERE / "hf_realrope_reference.json"
NPZ_OUT = HERE / "hf_realrope_reference.npz"

SMALL = dict(hidden_size=64, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1,
             patch_size=4, image_size=16)


def load_config(config_cls, kwargs, name):
    """The config the model is built from and the dict fastpe is given: the class's
    to_dict(), or for a ``*_typed`` case the dict as typed, which the class completes
    (from_dict, as AutoConfig loads a config.json)."""
    cls = getattr(transformers, config_cls)
    if not name.endswith("_typed"):
        cfg = cls(**kwargs)
        return cfg, None
    given = {"model_type": cls.model_type, **kwargs}
    return cls.from_dict(copy.deepcopy(given)), given


def config_of(cfg, given):
    return given if given is not None else config_json(cfg)

# (name, package, config class, rotary class, config kwargs, (rows, cols) of patches,
#  batch, query tokens in front of the prefix (EoMT's last blocks), key heads)
DINOV3_CASES = [
    ("dinov3_vit", "dinov3_vit", "DINOv3ViTConfig", "DINOv3ViTRopePositionEmbedding",
     dict(SMALL, num_register_tokens=4, rope_theta=100.0), (3, 5), 2, 0, 2),
    ("dinov3_vit_no_registers", "dinov3_vit", "DINOv3ViTConfig",
     "DINOv3ViTRopePositionEmbedding",
     dict(SMALL, hidden_size=96, num_attention_heads=3, num_register_tokens=0,
          rope_theta=1000.0), (4, 4), 1, 0, 3),
    ("eomt_dinov3", "eomt_dinov3", "EomtDinov3Config", "EomtDinov3RotaryEmbedding",
     dict(SMALL, num_register_tokens=2, num_queries=3, num_blocks=1,
          rope_parameters=dict(rope_type="default", rope_theta=100.0)), (2, 3), 1, 3, 2),
    ("sapiens2", "sapiens2", "Sapiens2Config", "Sapiens2RopePositionEmbedding",
     dict(SMALL, hidden_size=128, num_attention_heads=4, num_register_tokens=3,
          num_key_value_attention_heads=2, num_first_full_attention_layers=0,
          num_last_full_attention_layers=0, rope_theta=100.0), (5, 2), 1, 0, 2),
    # the class's registers (0, 4, 8) and bases (100; EoMT's from a top-level rope_theta)
    ("dinov3_vit_typed", "dinov3_vit", "DINOv3ViTConfig", "DINOv3ViTRopePositionEmbedding",
     dict(SMALL), (2, 3), 1, 0, 2),
    ("eomt_dinov3_typed", "eomt_dinov3", "EomtDinov3Config", "EomtDinov3RotaryEmbedding",
     dict(SMALL, num_queries=2, num_blocks=1, rope_parameters=dict(rope_type="default"),
          rope_theta=7.0), (3, 2), 1, 2, 2),
    ("sapiens2_typed", "sapiens2", "Sapiens2Config", "Sapiens2RopePositionEmbedding",
     dict(SMALL, hidden_size=128, num_attention_heads=4, num_key_value_attention_heads=2,
          num_first_full_attention_layers=0, num_last_full_attention_layers=0), (2, 2), 1, 0,
     2),
]


def run_dinov3(case, seed):
    name, package, config_cls, rotary_cls, kwargs, (rows, cols), batch, queries, kv_heads = case
    mod = module(package)
    cfg, given = load_config(config_cls, kwargs, name)
    patch = cfg.patch_size
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    prefix = queries + 1 + cfg.num_register_tokens
    tokens = prefix + rows * cols
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, cfg.num_attention_heads, tokens, head_dim))
    k = rng.standard_normal((batch, kv_heads, tokens, head_dim))
    with float64_everywhere():
        rope = getattr(mod, rotary_cls)(cfg).eval()
        pixels = torch.zeros(batch, cfg.num_channels, rows * patch, cols * patch,
                             dtype=torch.float64)
        with torch.no_grad():
            cos, sin = rope(pixels)
            q_out, k_out = mod.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k),
                                                    cos, sin)
        coords = mod.get_patches_center_coordinates(rows, cols, torch.float64, "cpu")
    assert q_out.dtype == torch.float64 and cos.dtype == torch.float64
    arrays = {"q": q, "k": k, "q_out": q_out.numpy(), "k_out": k_out.numpy(),
              "coords": coords.numpy()}
    meta = dict(name=name, model_type=cfg.model_type, config=config_of(cfg, given),
                grid=[rows, cols], prefix=prefix, queries=queries)
    return meta, arrays


MEMORY = dict(memory_attention_hidden_size=64, memory_attention_num_attention_heads=2,
              memory_attention_downsample_rate=1, memory_attention_rope_feat_sizes=[3, 2],
              rope_parameters=dict(rope_type="axial", rope_theta=10000.0))

# (name, package, config class, class prefix, config kwargs, memory frames, object
#  pointers, EdgeTAM's temporal tokens per frame)
SAM_CASES = [
    ("sam2_video", "sam2_video", "Sam2VideoConfig", "Sam2Video", MEMORY, 2, 3, 0),
    # its class sets the map from image_size // patch_size (14): 2 x 2 here
    ("sam3_tracker_video", "sam3_tracker_video", "Sam3TrackerVideoConfig", "Sam3TrackerVideo",
     dict(MEMORY, memory_attention_num_attention_heads=1, memory_attention_downsample_rate=2,
          image_size=28, rope_parameters=dict(rope_type="axial", rope_theta=1000.0)), 3, 0, 0),
    ("edgetam_video", "edgetam_video", "EdgeTamVideoConfig", "EdgeTamVideo",
     dict(MEMORY, memory_attention_rope_feat_sizes=[2, 2], memory_attention_rope_k_sizes=[3, 2]),
     2, 2, 2),
    # bases where the classes move them from: the deprecated key (set last, so it wins
    # over rope_parameters), a top-level rope_theta beside rope parameters without one
    ("sam2_video_typed", "sam2_video", "Sam2VideoConfig", "Sam2Video",
     dict(MEMORY, memory_attention_rope_theta=100.0,
          rope_parameters=dict(rope_type="axial", rope_theta=77.0)), 1, 2, 0),
    ("sam3_tracker_video_typed", "sam3_tracker_video", "Sam3TrackerVideoConfig",
     "Sam3TrackerVideo", dict(MEMORY, rope_parameters=None, rope_theta=300.0, image_size=42,
                              memory_attention_rope_feat_sizes=[9, 9]), 2, 1, 0),
    ("edgetam_video_typed", "edgetam_video", "EdgeTamVideoConfig", "EdgeTamVideo",
     dict(MEMORY, memory_attention_rope_feat_sizes=[2, 3], memory_attention_rope_k_sizes=[2, 2],
          rope_parameters=dict(rope_type="default"), rope_theta=100.0), 2, 1, 1),
]


def run_sam(case, seed):
    name, package, config_cls, prefix, kwargs, frames, pointers, temporal = case
    mod = module(package)
    cfg, given = load_config(config_cls, kwargs, name)
    heads = cfg.memory_attention_num_attention_heads
    head_dim = cfg.memory_attention_hidden_size // (cfg.memory_attention_downsample_rate * heads)
    attention = getattr(mod, f"{prefix}MemoryAttention")
    rng = np.random.default_rng(seed)
    with float64_everywhere():
        rope = getattr(mod, f"{prefix}VisionRotaryEmbedding")(cfg).eval()
        positions = attention.precompute_positions(cfg)
        n = positions.shape[0]
        q = rng.standard_normal((1, heads, n, head_dim))
        k = rng.standard_normal((1, heads, n, head_dim))
        x = torch.zeros(1, n, cfg.memory_attention_hidden_size, dtype=torch.float64)
        with torch.no_grad():
            cos, sin = rope(x, positions)
            if temporal:
                key_positions = attention.precompute_positions(cfg, is_key=True)
                cos_k, sin_k = rope(x, key_positions)
                m = key_positions.shape[0]
                mem = rng.standard_normal((1, heads, frames * (temporal + m) + pointers,
                                           head_dim))
                q_self, k_self = mod.apply_rotary_pos_emb_2d_self_attn(
                    torch.from_numpy(q), torch.from_numpy(k), cos, sin)
                q_cross, k_cross = mod.apply_rotary_pos_emb_2d_cross_attn(
                    torch.from_numpy(q), torch.from_numpy(mem), cos, sin, cos_k, sin_k,
                    num_k_exclude_rope=pointers, repeat_freqs_k=frames)
            else:
                key_positions = positions
                mem = rng.standard_normal((1, heads, frames * n + pointers, head_dim))
                q_self, k_self = mod.apply_rotary_pos_emb_2d(
                    torch.from_numpy(q), torch.from_numpy(k), cos, sin)
                q_cross, k_cross = mod.apply_rotary_pos_emb_2d(
                    torch.from_numpy(q), torch.from_numpy(mem), cos, sin,
                    num_k_exclude_rope=pointers, repeat_freqs_k=True)
    assert cos.dtype == torch.float64 and k_cross.dtype == torch.float64
    arrays = {"q": q, "k": k, "memory": mem, "q_self": q_self.numpy(),
              "k_self": k_self.numpy(), "q_cross": q_cross.numpy(), "k_cross": k_cross.numpy(),
              "coords": positions.numpy().astype(np.float64),
              "key_coords": key_positions.numpy().astype(np.float64)}
    meta = dict(name=name, model_type=cfg.model_type, config=config_of(cfg, given),
                frames=frames, pointers=pointers, temporal=temporal)
    return meta, arrays


# (name, config kwargs, batch)
SAM3_VIT_CASES = [
    ("sam3_vit_model", dict(hidden_size=64, num_attention_heads=2, intermediate_size=64,
                            num_hidden_layers=2, image_size=[24, 16], patch_size=4,
                            window_size=4, global_attn_indexes=[1],
                            rope_parameters=dict(rope_type="axial", rope_theta=10000.0)), 2),
    ("sam3_vit_model_typed", dict(hidden_size=64, num_attention_heads=2, intermediate_size=64,
                                  num_hidden_layers=2, image_size=16, patch_size=4,
                                  window_size=2, global_attn_indexes=[1], rope_theta=100.0), 1),
]


def run_sam3_vit(case, seed):
    name, kwargs, batch = case
    mod = module("sam3")
    cfg, given = load_config("Sam3ViTConfig", kwargs, name)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rng = np.random.default_rng(seed)
    arrays = {}
    with float64_everywhere():
        rope = mod.Sam3ViTRotaryEmbedding(cfg).eval()
        for layer, window in (("windowed", cfg.window_size), ("global", 0)):
            positions = mod.Sam3ViTLayer.precompute_positions(cfg, window)
            n = positions.shape[0]
            q = rng.standard_normal((batch, cfg.num_attention_heads, n, head_dim))
            k = rng.standard_normal((batch, cfg.num_attention_heads, n, head_dim))
            with torch.no_grad():
                cos, sin = rope(torch.zeros(1, dtype=torch.float64), positions)
                q_out, k_out = mod.apply_rotary_pos_emb_2d(torch.from_numpy(q),
                                                           torch.from_numpy(k), cos, sin)
            assert cos.dtype == torch.float64 and q_out.dtype == torch.float64
            arrays.update({f"{layer}/q": q, f"{layer}/k": k, f"{layer}/q_out": q_out.numpy(),
                           f"{layer}/k_out": k_out.numpy(), f"{layer}/coords": positions.numpy()})
    meta = dict(name=name, model_type=cfg.model_type, config=config_of(cfg, given),
                window=cfg.window_size)
    return meta, arrays


# (name, config kwargs, coarse feature map (rows, cols), batch)
LOFTR_CASES = [
    ("efficientloftr", dict(hidden_size=64, out_features=[16, 16, 32, 64], num_attention_heads=8,
                            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                 partial_rotary_factor=4.0)), (12, 17), 2),
    ("efficientloftr_stride2", dict(hidden_size=32, out_features=[16, 16, 32, 32],
                                    num_attention_heads=4, q_aggregation_kernel_size=2,
                                    q_aggregation_stride=2,
                                    rope_parameters=dict(rope_type="default", rope_theta=100.0,
                                                         partial_rotary_factor=2.0)), (6, 4), 1),
    # no rope parameters: the class's partial factor 4, the base from rope_theta
    ("efficientloftr_typed", dict(hidden_size=64, out_features=[16, 16, 32, 64],
                                  num_attention_heads=8, rope_theta=100.0), (8, 12), 1),
]


def run_loftr(case, seed):
    name, kwargs, (rows, cols), batch = case
    mod = module("efficientloftr")
    cfg, given = load_config("EfficientLoFTRConfig", kwargs, name)
    hidden = cfg.hidden_size
    rng = np.random.default_rng(seed)
    with float64_everywhere():
        rope = mod.EfficientLoFTRRotaryEmbedding(cfg).eval()
        with torch.no_grad():
            cos, sin = rope(torch.zeros(1, hidden, rows, cols, dtype=torch.float64))
            h, w = cos.shape[1:3]
            cos = cos.expand(batch, -1, -1, -1).reshape(batch, -1, hidden)
            sin = sin.expand(batch, -1, -1, -1).reshape(batch, -1, hidden)
            q = rng.standard_normal((batch, h * w, 1, hidden))
            k = rng.standard_normal((batch, h * w, 1, hidden))
            q_out, k_out = mod.apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(k),
                                                    cos, sin, unsqueeze_dim=2)
            ones = torch.ones(hidden // 4, dtype=torch.float64)
            coords = mod.compute_embeddings(ones, h, w, hidden)[0, :, :, :2].reshape(-1, 2)
    assert cos.dtype == torch.float64 and q_out.dtype == torch.float64
    arrays = {"q": q, "k": k, "q_out": q_out.numpy(), "k_out": k_out.numpy(),
              "coords": coords.numpy()}
    meta = dict(name=name, model_type=cfg.model_type, config=config_of(cfg, given),
                coarse=[rows, cols], map=[h, w])
    return meta, arrays


def main():
    cases, arrays = [], {}
    runs = ([(run_dinov3, c) for c in DINOV3_CASES] + [(run_sam, c) for c in SAM_CASES]
            + [(run_sam3_vit, c) for c in SAM3_VIT_CASES]
            + [(run_loftr, c) for c in LOFTR_CASES])
    for seed, (run, case) in enumerate(runs):
        meta, out = run(case, seed)
        cases.append(meta)
        arrays.update({f"{meta['name']}/{key}": value for key, value in out.items()})
    JSON_OUT.write_text(json.dumps(dict(
        generated_by=Path(__file__).name, transformers_version=transformers.__version__,
        torch_version=torch.__version__, cases=cases), indent=1) + "\n")
    np.savez_compressed(NPZ_OUT, **arrays)
    print(f"{len(cases)} cases -> {JSON_OUT.name}, {NPZ_OUT.name}")


if __name__ == "__main__":
    main()
