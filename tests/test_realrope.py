"""RoPE on real-valued coordinates: the models that rotate patches by them (DINOv3 and
its descendants; SAM 2's, SAM 3 tracker's and EdgeTAM's memory attention).

Truths, independent of the code under test:
- tests/data/hf_realrope_reference.*, made by make_hf_realrope_reference.py from each
  model's own transformers rotary module and apply function (in float64), read here
  without torch;
- the DINOv3 formula (Simeoni et al. 2025) written out below in float64: frequency j <
  head_dim / 4 turns pair j by ``2 pi * y * theta^(-4j / head_dim)`` and pair
  head_dim / 4 + j by the same with x, rotate_half pairing.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import COMPILED, assert_bytes_equal

import fastpe

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "hf_realrope_reference.json").read_text())
with np.load(DATA / "hf_realrope_reference.npz") as _npz:
    ARRAYS = {key: _npz[key] for key in _npz.files}
CASES = {c["name"]: c for c in FIXTURE["cases"]}
BACKENDS = ["numpy"] + (["cython"] if COMPILED else [])
DINOV3 = {"model_type": "dinov3_vit", "hidden_size": 64, "num_attention_heads": 2,
          "rope_theta": 100.0, "num_register_tokens": 4}


def fixture(name: str, key: str) -> np.ndarray:
    return ARRAYS[f"{name}/{key}"]


@pytest.mark.parametrize("model_type", ["dinov3_vit", "eomt_dinov3", "sapiens2"])
@pytest.mark.parametrize("head_dim", [192, 196, 200, 392, 1012])
def test_dinov3_head_dims_whose_arange_miscounts_are_refused(model_type, head_dim):
    """The family forms its frequencies as arange(0, 1, 4 / head_dim): for some head_dim
    (196, 392, ...) the float step makes it one entry longer than head_dim / 4 (NumPy's
    arange counts as torch's does), and the model's own code fails on its cos and sin:
    refused, the others taken."""
    count = np.arange(0, 1, 4 / head_dim, dtype=np.float32).size
    config = dict(DINOV3, model_type=model_type, hidden_size=head_dim,
                  num_attention_heads=1)
    if count == head_dim // 4:
        assert fastpe.RotaryEmbedding.from_hf_config(config).head_dim == head_dim
    else:
        with pytest.raises(ValueError, match=rf"head_dim {head_dim}: .*{count} frequencies"):
            fastpe.RotaryEmbedding.from_hf_config(config)


def test_fixture_is_transformers_525():
    assert FIXTURE["transformers_version"].startswith("5.25")
    assert {c["model_type"] for c in CASES.values()} >= {
        "dinov3_vit", "eomt_dinov3", "sapiens2", "sam2_video", "sam3_tracker_video",
        "edgetam_video", "sam3_vit_model", "efficientloftr"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "grid" in c])
def test_dinov3_family_matches_transformers(name, backend):
    case = CASES[name]
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    # EoMT's queries come before the CLS and registers; the model knows how many
    assert rope.prefix_tokens + case["queries"] == case["prefix"]
    prefix = case["prefix"]
    q, k = fixture(name, "q").copy(), fixture(name, "k").copy()
    pos = fastpe.dinov3_positions(*case["grid"])
    if q.shape[0] > 1:
        pos = pos[:, None]  # (axes, 1, tokens): the batch shares the grid
    with fastpe.use_backend(backend):
        rope(q[:, :, prefix:], k[:, :, prefix:], pos, layout="bhsd")
    for got, key in ((q, "q_out"), (k, "k_out")):
        np.testing.assert_allclose(got, fixture(name, key), rtol=0, atol=1e-13,
                                   err_msg=f"{name} {key} ({backend})")
    np.testing.assert_array_equal(q[:, :, :prefix], fixture(name, "q")[:, :, :prefix])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "grid" in c])
def test_dinov3_positions_are_the_models_patch_centres(name):
    rows, cols = CASES[name]["grid"]
    np.testing.assert_array_equal(fastpe.dinov3_positions(rows, cols),
                                  fixture(name, "coords").T)
    # in pixels: the model floors to whole patches
    patch = CASES[name]["config"]["patch_size"]
    np.testing.assert_array_equal(
        fastpe.dinov3_positions(rows * patch + patch - 1, cols * patch, patch_size=patch),
        fixture(name, "coords").T)
    # a (height, width) patch, as the model reads a config's pair
    np.testing.assert_array_equal(
        fastpe.dinov3_positions(rows * 3, cols * patch + 1, patch_size=(3, patch)),
        fixture(name, "coords").T)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dinov3_rotation_is_the_papers_formula(backend):
    rope = fastpe.RotaryEmbedding.from_hf_config(DINOV3)
    pos = fastpe.dinov3_positions(3, 4)
    j = np.arange(8)
    omega = 2 * math.pi * 100.0 ** (-4.0 * j / 32)
    angles = np.concatenate([pos[0][:, None] * omega, pos[1][:, None] * omega], axis=1)
    q = np.random.default_rng(0).standard_normal((12, 2, 32))
    a, b = q[..., :16], q[..., 16:]
    c, s = np.cos(angles)[:, None], np.sin(angles)[:, None]
    want = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    with fastpe.use_backend(backend):
        rope(q, None, pos, layout="shd")
    np.testing.assert_allclose(q, want, rtol=0, atol=1e-13)


def test_float32_within_its_rounding():
    name = "dinov3_vit"
    case = CASES[name]
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    p = case["prefix"]
    q = fixture(name, "q").astype(np.float32)
    rope(q[:, :, p:], None, fastpe.dinov3_positions(*case["grid"])[:, None], layout="bhsd")
    np.testing.assert_allclose(q, fixture(name, "q_out"), rtol=0, atol=2e-6)


def test_loads_from_a_config_object_and_its_dict_alike():
    a = fastpe.RotaryEmbedding.from_hf_config(DINOV3)
    b = fastpe.RotaryEmbedding.from_hf_config(types.SimpleNamespace(**DINOV3))
    np.testing.assert_array_equal(a.frequencies().inv_freq, b.frequencies().inv_freq)
    assert (a.axes, a.prefix_tokens, a.style) == (b.axes, b.prefix_tokens, b.style) == (2, 5, "neox")


SAM = [n for n, c in CASES.items() if "frames" in c]


@pytest.mark.parametrize("name", SAM)
def test_sam_memory_positions_are_the_models(name):
    rope = fastpe.RotaryEmbedding.from_hf_config(CASES[name]["config"])
    # the model stacks (column, row); fastpe's axes are (row, column)
    np.testing.assert_array_equal(fastpe.sam2_memory_positions(*rope.grid),
                                  fixture(name, "coords")[:, ::-1].T)
    key_grid = getattr(rope, "key_grid", rope.grid)
    np.testing.assert_array_equal(fastpe.sam2_memory_positions(*key_grid),
                                  fixture(name, "key_coords")[:, ::-1].T)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SAM)
def test_sam_memory_self_attention_matches_transformers(name, backend):
    rope = fastpe.RotaryEmbedding.from_hf_config(CASES[name]["config"])
    assert rope.prefix_tokens == 0
    q, k = fixture(name, "q").copy(), fixture(name, "k").copy()
    with fastpe.use_backend(backend):
        rope(q, k, fastpe.sam2_memory_positions(*rope.grid), layout="bhsd")
    np.testing.assert_allclose(q, fixture(name, "q_self"), rtol=0, atol=1e-13)
    np.testing.assert_allclose(k, fixture(name, "k_self"), rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SAM)
def test_sam_memory_cross_attention_matches_transformers(name, backend):
    case = CASES[name]
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    frames, temporal = case["frames"], case["temporal"]
    q, mem = fixture(name, "q").copy(), fixture(name, "memory").copy()
    with fastpe.use_backend(backend):
        rope(q, None, fastpe.sam2_memory_positions(*rope.grid), layout="bhsd")
        if temporal:
            # EdgeTAM: per memory frame, temporal tokens first (unrotated), then its key grid
            rows, cols = rope.key_grid
            group = temporal + rows * cols
            for f in range(frames):
                rope(mem[:, :, f * group + temporal:(f + 1) * group], None,
                     fastpe.sam2_memory_positions(rows, cols), layout="bhsd")
        else:
            rows, cols = rope.grid
            rope(mem[:, :, :frames * rows * cols], None,
                 fastpe.sam2_memory_positions(rows, cols, frames=frames), layout="bhsd")
    np.testing.assert_allclose(q, fixture(name, "q_cross"), rtol=0, atol=1e-13)
    np.testing.assert_allclose(mem, fixture(name, "k_cross"), rtol=0, atol=1e-13)
    # the object pointers at the end are the model's unrotated tokens
    tail = mem.shape[2] - case["pointers"]
    np.testing.assert_array_equal(mem[:, :, tail:], fixture(name, "memory")[:, :, tail:])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layer", ["windowed", "global"])
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "window" in c])
def test_sam3_vit_matches_transformers(name, layer, backend):
    rope = fastpe.RotaryEmbedding.from_hf_config(CASES[name]["config"])
    assert rope.window_size == CASES[name]["window"]
    ws = rope.window_size
    grid = (ws, ws) if layer == "windowed" else rope.grid
    pos = fastpe.sam3_vit_positions(*grid, window_size=ws)
    np.testing.assert_array_equal(pos, fixture(name, f"{layer}/coords")[:, ::-1].T)
    q, k = fixture(name, f"{layer}/q").copy(), fixture(name, f"{layer}/k").copy()
    with fastpe.use_backend(backend):
        rope(q, k, pos[:, None], layout="bhsd")
    np.testing.assert_allclose(q, fixture(name, f"{layer}/q_out"), rtol=0, atol=1e-13)
    np.testing.assert_allclose(k, fixture(name, f"{layer}/k_out"), rtol=0, atol=1e-13)


LOFTR = [n for n, c in CASES.items() if "coarse" in c]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LOFTR)
def test_efficientloftr_matches_transformers(name, backend):
    case = CASES[name]
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    assert rope.head_dim == case["config"]["hidden_size"]
    kernel, stride = rope.q_aggregation
    rows, cols = ((n - kernel) // stride + 1 for n in case["coarse"])
    assert [rows, cols] == case["map"]
    pos = fastpe.efficientloftr_positions(rows, cols)
    np.testing.assert_array_equal(pos, fixture(name, "coords").T)
    q, k = fixture(name, "q").copy(), fixture(name, "k").copy()
    with fastpe.use_backend(backend):
        rope(q, k, pos[:, None])
    np.testing.assert_allclose(q, fixture(name, "q_out"), rtol=0, atol=1e-13)
    np.testing.assert_allclose(k, fixture(name, "k_out"), rtol=0, atol=1e-13)


def test_sam2_memory_positions_grid():
    pos = fastpe.sam2_memory_positions(2, 3, frames=2)
    assert pos.dtype == np.float64 and pos.shape == (2, 12)
    np.testing.assert_array_equal(pos[:, :6], [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]])
    np.testing.assert_array_equal(pos[:, 6:], pos[:, :6])


# ---- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("change, error, match", [
    ({"hidden_size": 68}, ValueError, r"34 must be a positive multiple of 4"),
    # fewer features than heads: no feature per head (the model divides by zero)
    ({"num_attention_heads": 1024}, ValueError, r"= 0 must be a positive multiple of 4"),
    ({"hidden_size": None}, ValueError, r"hidden_size and num_attention_heads"),
    ({"rope_theta": -1.0}, ValueError, r"rope_theta must be a positive number"),
    ({"rope_theta": "100"}, ValueError, r"rope_theta must be a positive number"),
    # 2 pi theta^-(1 - 4 / 32) = 11.5 rad per unit of position
    ({"rope_theta": 0.5}, ValueError, r"rope_theta=0.5 below 1 gives frequencies up to 11\.52 "),
    ({"num_register_tokens": -1}, ValueError, r"num_register_tokens must be an int >= 0"),
    ({"model_type": "eomt_dinov3", "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                       "rope_theta": 100.0}},
     ValueError, r"supports only rope_type 'default'"),
])
def test_unreproducible_configs_name_the_key(change, error, match):
    with pytest.raises(error, match=match):
        fastpe.RotaryEmbedding.from_hf_config({**DINOV3, **change})


SAM2 = {"model_type": "sam2_video", "memory_attention_hidden_size": 64,
        "memory_attention_num_attention_heads": 2, "memory_attention_downsample_rate": 1,
        "memory_attention_rope_feat_sizes": [3, 2],
        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}


@pytest.mark.parametrize("change, match", [
    # "default" is read as "axial" by the config classes (the fixture's edgetam_video_typed)
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, r"only rope_type 'axial'"),
    ({"memory_attention_downsample_rate": 3}, r"// \(memory_attention_downsample_rate \* "
                                              r"memory_attention_num_attention_heads\) = 10"),
    ({"memory_attention_num_attention_heads": 0}, r"positive ints"),
    ({"memory_attention_rope_feat_sizes": [3]}, r"memory_attention_rope_feat_sizes must be two"),
    # the config class's setter puts it in the rope parameters, None too
    ({"memory_attention_rope_theta": None}, r"rope_theta must be a positive number, got None"),
    ({"memory_attention_rope_feat_sizes": [3, 2.0]}, r"memory_attention_rope_feat_sizes"),
    ({"model_type": "edgetam_video", "memory_attention_rope_k_sizes": [0, 4]},
     r"memory_attention_rope_k_sizes"),
])
def test_sam_configs_it_cannot_reproduce_name_the_key(change, match):
    with pytest.raises(ValueError, match=match):
        fastpe.RotaryEmbedding.from_hf_config({**SAM2, **change})


def test_sam_defaults_are_the_config_classes():
    rope = fastpe.RotaryEmbedding.from_hf_config({"model_type": "sam3_tracker_video"})
    assert (rope.head_dim, rope.grid, rope.style) == (256, (72, 72), "gptj")
    assert rope.frequencies().inv_freq[1] == pytest.approx(10000.0 ** (-4 / 256), rel=1e-15)
    edgetam = fastpe.RotaryEmbedding.from_hf_config({"model_type": "edgetam_video"})
    assert (edgetam.grid, edgetam.key_grid) == ((64, 64), (16, 16))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tensors", [False, True], ids=["arrays", "torch"])
def test_grids_of_coordinates_refuse_text_positions(backend, tensors):
    """DINOv3, SAM and EfficientLoFTR rotate each token by its own (row, column): no
    positions (offset + arange) or one row shared by both axes is no call of their
    models, refused with q untouched."""
    torch = pytest.importorskip("torch") if tensors else None
    for config in (DINOV3, SAM2, SAM3_VIT, LOFTR_CONFIG):
        rope = fastpe.RotaryEmbedding.from_hf_config(config)
        head_dim = rope.head_dim
        q0 = np.random.default_rng(0).standard_normal((1, 2, 6, head_dim)).astype(np.float32)
        for positions in (None, np.arange(6), np.linspace(-1, 1, 6), np.zeros((1, 6)),
                          np.zeros((1, 1, 6), np.int64)):
            q = torch.from_numpy(q0.copy()) if tensors else q0.copy()
            if tensors and positions is not None:
                positions = torch.from_numpy(positions)
            with fastpe.use_backend(backend), pytest.raises(
                    ValueError, match=r"one row per axis \(this embedding's model"):
                rope(q, None, positions, layout="bhsd")
            assert_bytes_equal(np.asarray(q), q0)


def test_sam3_tracker_map_of_a_config_object_is_its_own():
    """SAM 3's tracker config class sets its memory feature map from image_size when it
    reads a dict (config.json); the object it made may hold another (set afterwards),
    which its model reads."""
    json = {"model_type": "sam3_tracker_video", "image_size": 56, "transformers_version":
            "5.25.0", "memory_attention_rope_feat_sizes": [8, 2]}

    class Config:  # a config object: what its to_dict() gives
        def to_dict(self):
            return dict(json)

    assert fastpe.RotaryEmbedding.from_hf_config(json).grid == (4, 4)
    assert fastpe.RotaryEmbedding.from_hf_config(Config()).grid == (2, 8)


SAM3_VIT = {"model_type": "sam3_vit_model", "hidden_size": 64, "num_attention_heads": 2,
            "image_size": 24, "patch_size": 4, "window_size": 4}


@pytest.mark.parametrize("change, match", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, r"only rope_type 'axial'"),
    ({"head_dim": 16}, r"head_dim=16 differs from hidden_size // num_attention_heads = 32"),
    ({"image_size": [24]}, r"image_size must be two positive ints"),
    ({"patch_size": 32}, r"image_size \[24, 24\] is smaller than one patch"),
    ({"window_size": 0}, r"window_size must be a positive int"),
])
def test_sam3_vit_configs_it_cannot_reproduce_name_the_key(change, match):
    with pytest.raises(ValueError, match=match):
        fastpe.RotaryEmbedding.from_hf_config({**SAM3_VIT, **change})


def test_sam3_vit_positions_refuse_bad_sizes():
    with pytest.raises(ValueError, match=r"window_size"):
        fastpe.sam3_vit_positions(4, 4, window_size=0)
    with pytest.raises(TypeError, match=r"width must be an int"):
        fastpe.sam3_vit_positions(4, 4.0, window_size=4)


LOFTR_CONFIG = {"model_type": "efficientloftr", "hidden_size": 256, "num_attention_heads": 8,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                    "partial_rotary_factor": 4.0}}


@pytest.mark.parametrize("change, match", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, r"only rope_type 'default'"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, r"only rope_type 'default'"),
    ({"num_attention_heads": 4}, r"64 \* 4.0 must be hidden_size / 2 = 128"),
    ({"hidden_size": 250}, r"hidden_size \(divisible by 4\)"),
    ({"q_aggregation_stride": 0}, r"q_aggregation_stride must be positive ints"),
])
def test_efficientloftr_configs_it_cannot_reproduce_name_the_key(change, match):
    with pytest.raises(ValueError, match=match):
        fastpe.RotaryEmbedding.from_hf_config({**LOFTR_CONFIG, **change})


def test_layer_type_does_not_apply():
    with pytest.raises(ValueError, match=r"layer_type='full_attention' does not apply"):
        fastpe.RotaryEmbedding.from_hf_config(DINOV3, layer_type="full_attention")


@pytest.mark.parametrize("call, error, match", [
    (lambda: fastpe.dinov3_positions(0, 3), ValueError, r"height"),
    (lambda: fastpe.dinov3_positions(3, 2.5), TypeError, r"width must be an int"),
    (lambda: fastpe.dinov3_positions(8, 32, patch_size=16), ValueError,
     r"height=8 pixels is smaller than one patch"),
    (lambda: fastpe.dinov3_positions(32, 32, patch_size=0), ValueError, r"patch_size"),
    (lambda: fastpe.dinov3_positions(32, 32, patch_size=(16, 0)), ValueError,
     r"patch_size\[1\]"),
    (lambda: fastpe.dinov3_positions(32, 32, patch_size=(16, 16, 3)), ValueError,
     r"patch_size must be an int or a \(height, width\) pair"),
    (lambda: fastpe.sam2_memory_positions(2, 2, frames=0), ValueError, r"frames"),
])
def test_coordinate_helpers_refuse_bad_sizes(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("positions, error, match", [
    (np.zeros((3, 12)), ValueError, r"positions"),
    (np.full((2, 12), np.nan), ValueError, r"finite"),
    (np.zeros((2, 11)), ValueError, r"positions"),
])
def test_bad_positions_leave_the_buffers_unchanged(backend, positions, error, match):
    rope = fastpe.RotaryEmbedding.from_hf_config(DINOV3)
    q = np.random.default_rng(1).standard_normal((1, 17, 2, 32))
    before = q.copy()
    with fastpe.use_backend(backend), pytest.raises(error, match=match):
        rope(q[:, rope.prefix_tokens:], None, positions)
    np.testing.assert_array_equal(q, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_q_is_a_type_error(backend):
    rope = fastpe.RotaryEmbedding.from_hf_config(DINOV3)
    q = np.ones((1, 12, 2, 32))
    q.flags.writeable = False
    with fastpe.use_backend(backend), pytest.raises(TypeError, match=r"q .*read-only|read-only"):
        rope(q, None, fastpe.dinov3_positions(3, 4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pos_dtype", [np.float64, np.float32, np.float16])
def test_cos_sin_of_real_positions_is_the_formula(backend, pos_dtype):
    """rope_cos_sin and RotaryEmbedding.cos_sin take real-valued positions (negative
    ones too): cos and sin of the float64 angle position * frequency, times the
    attention scaling; a cache of them rotates as apply_rope does by those positions."""
    pos = np.array([-3.25, 0.0, 0.5, 7.75, 1000.125], pos_dtype)
    freqs = fastpe.rope_frequencies(16, base=100.0,
                                    scaling={"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 64})
    exact = [[math.cos(float(p) * float(w)) for w in freqs.inv_freq] for p in pos]
    with fastpe.use_backend(backend):
        cos, sin = fastpe.rope_cos_sin(pos, freqs, dtype="float64")
        cos32, _ = fastpe.rope_cos_sin(pos, freqs)
    att = freqs.attention_scaling
    assert att != 1.0
    np.testing.assert_allclose(cos, np.array(exact) * att, rtol=0, atol=1e-13)
    np.testing.assert_allclose(sin[0, 0], math.sin(float(pos[0]) * freqs.inv_freq[0]) * att,
                               rtol=0, atol=1e-15)
    assert cos32.dtype == np.float32
    np.testing.assert_allclose(cos32, np.array(exact) * att, rtol=0, atol=1.5e-7)
    q = np.random.default_rng(0).standard_normal((1, pos.size, 2, 16))
    want = q.copy()
    with fastpe.use_backend(backend):
        fastpe.apply_rope(want, None, pos, freqs=freqs)
        fastpe.apply_rope_cached(q, None, cos, sin, np.arange(pos.size))
    np.testing.assert_allclose(q, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_axis_cos_sin_of_real_positions(backend):
    rope = fastpe.RotaryEmbedding(16, base=100.0, mrope_section=[2, 2, 4])
    pos = np.array([[0.5, -1.25], [2.0, 3.5], [0.25, 9.0]])   # (axes, seq)
    axis = np.repeat([0, 1, 2], [2, 2, 4])
    w = rope.frequencies().inv_freq
    with fastpe.use_backend(backend):
        cos, sin = rope.cos_sin(pos, dtype="float64")
    np.testing.assert_allclose(cos, np.cos(pos[axis].T * w), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin, np.sin(pos[axis].T * w), rtol=0, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("call, match", [
    (lambda: fastpe.rope_cos_sin(np.array([0.5, np.nan]), fastpe.rope_frequencies(8)),
     r"positions must be finite"),
    (lambda: fastpe.rope_cos_sin(np.array([-2.0**32]), fastpe.rope_frequencies(8)),
     r"positions must be finite and of magnitude below 2\*\*32"),
    (lambda: fastpe.RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0},
                                    max_position_embeddings=16).cos_sin(np.array([0.5])),
     r"rope type 'dynamic' picks its frequencies by the sequence length"),
])
def test_cos_sin_refuses_real_positions_it_cannot_form(backend, call, match):
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_positions_are_refused_by_name(backend):
    """float16/32/64 positions are real-valued; bfloat16 ones cannot hold whole positions
    past 256, so neither reading is safe: a TypeError that says so, q unchanged."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = np.random.default_rng(0).standard_normal((1, 4, 2, 16)).astype(np.float32)
    before = q.copy()
    pos = np.array([0.5, 1.5, 2.5, 3.5], ml_dtypes.bfloat16)
    with fastpe.use_backend(backend):
        with pytest.raises(TypeError, match=r"positions must be integers, or real-valued.*"
                                            r"bfloat16"):
            fastpe.apply_rope(q, None, pos)
        with pytest.raises(TypeError, match=r"positions must be integers, or real-valued"):
            fastpe.rope_cos_sin(pos, fastpe.rope_frequencies(16))
    assert np.array_equal(q, before)
