"""RotaryEmbedding.from_hf_config against every transformers family's own RoPE code.

The fixture (tests/data/make_hf_zoo_reference.py) ran each family's rotary module and
apply function in float64 on small configs; each case here loads the same config dict,
rotates the same q and k and must agree to float64 rounding, on both backends. Configs
fastpe does not reproduce must raise a ValueError that says why.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import fastpe

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "hf_zoo_reference.json").read_text())
ARRAYS = np.load(DATA / "hf_zoo_reference.npz")
POSITIONS = np.array(FIXTURE["positions"], dtype=np.int64)
CASES = {c["name"]: c for c in FIXTURE["cases"]}
REFUSALS = {c["name"]: c for c in FIXTURE["refusals"]}


def inputs(seed, dim):
    """The generator's q / k rows (make_hf_zoo_reference.inputs), rebuilt exactly."""
    p = np.arange(len(POSITIONS), dtype=np.int64)[:, None]
    j = np.arange(dim, dtype=np.int64)[None, :]
    return ((j * 7919 + p * 104729 + seed * 15485863) % 2003) / 1001.5 - 1.0


def rotate_like_the_model(case, backend):
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"], layer_type=case["layer_type"])
    start, stop = case["features"]
    sl = rope.feature_slice
    assert start <= sl.start and sl.stop <= stop, (sl, case["features"])
    assert sl.stop - sl.start == rope.head_dim
    width = stop - start
    q = inputs(case["seed"], width)[None, :, None, :]      # (batch, seq, heads, dim)
    k = inputs(case["seed"] + 1, width)[None, :, None, :]
    part = slice(sl.start - start, sl.stop - start)
    with fastpe.use_backend(backend):
        rope(q[..., part], k[..., part], POSITIONS)
    q, k = q[0, :, 0], k[0, :, 0]
    if case["hf_order"] == "deinterleaved":
        # The model's interleaving apply also moves features to [even | odd]; the q.k
        # products, all attention sees, are the same in either order.
        q = np.concatenate([q[:, 0::2], q[:, 1::2]], axis=-1)
        k = np.concatenate([k[:, 0::2], k[:, 1::2]], axis=-1)
    return q, k


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("name", list(CASES))
def test_family_matches_its_transformers_code(name, backend):
    if backend == "cython" and fastpe.info()["backend"] != "cython":
        pytest.skip("compiled backend not built")
    case = CASES[name]
    q, k = rotate_like_the_model(case, backend)
    # float64 rounding: angles up to 300 rad carry ~1e-13 absolute error in any libm.
    for got, key in ((q, "q_out"), (k, "k_out")):
        np.testing.assert_allclose(got, ARRAYS[f"{case['key']}_{key}"], rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name} {key} ({backend})")


@pytest.mark.parametrize("name", list(REFUSALS))
def test_unreproducible_configs_raise_or_load_multi_axis(name):
    # Never silently one-axis: a multi-axis or vision config (directly or through a
    # composite's text_config) either loads with its axes (tests/test_mrope.py checks
    # their numbers) or raises; test_refusals_name_what_is_missing checks the messages.
    case = REFUSALS[name]
    try:
        rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    except ValueError:
        return
    assert rope.axes > 1, (name, case["reason"], rope)


@pytest.mark.parametrize("name", sorted(FIXTURE["not_run"]))
def test_model_types_the_generator_could_not_run_are_not_one_axis_rope(name):
    # Rotary code fastpe has not checked (sub-models, vision and audio towers, encoders
    # with their own rotary classes): refused, or a vision tower loaded with its axes.
    config = FIXTURE["not_run"][name]["config"]
    try:
        rope = fastpe.RotaryEmbedding.from_hf_config(config)
    except ValueError:
        return
    assert rope.axes > 1, (name, rope)


def test_fixture_covers_the_families():
    # A reader sees the coverage in the fixture; guard against a truncated regeneration.
    families = {c["model_type"] for c in CASES.values()}
    assert len(families) > 130
    assert {"llama", "gptj", "deepseek_v2", "deepseek_v3", "gemma4_text", "phimoe",
            "nanochat", "llama4_text"} <= families


def test_model_types_without_rope_are_the_generators():
    assert fastpe._hf_models.NO_ROPE == set(FIXTURE["no_rope"])
    assert not fastpe._hf_models.NO_ROPE & {c["model_type"] for c in CASES.values()}
    assert not fastpe._hf_models.NO_ROPE & set(fastpe._hf_models.MODELS)


def test_unknown_model_type_loads_as_llama():
    config = {"model_type": "my_custom_llm", "hidden_size": 256, "num_attention_heads": 4,
              "rope_theta": 50000.0, "max_position_embeddings": 4096}
    rope = fastpe.RotaryEmbedding.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.style) == (64, 64, "neox")
    assert rope.feature_slice == slice(0, 64) and not rope.reverse
    q = inputs(0, 64)[None, :, None, :]
    want = q.copy()
    fastpe.reference.apply_rope(want, positions=POSITIONS, base=50000.0)
    rope(q, positions=POSITIONS)
    np.testing.assert_allclose(q, want, rtol=1e-12, atol=1e-12)


def test_per_layer_config_needs_layer_type():
    config = dict(next(c for c in CASES.values() if c["model_type"] == "gemma4_text")["config"])
    with pytest.raises(ValueError, match=r"full_attention.*layer_type=|layer_type=.*full_attention"):
        fastpe.RotaryEmbedding.from_hf_config(config)


@pytest.mark.parametrize("config, pattern", [
    ({"model_type": "llama", "head_dim": 64,
      "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}}, r"more than one position"),
    ({"model_type": "llama", "head_dim": 64,
      "rope_parameters": {"rope_type": "default", "mrope_section": [16, 8, 8]}},
     r"more than one position"),
    ({"model_type": "llama", "head_dim": 64,
      "rope_parameters": {"rope_type": "ntk-by-parts", "factor": 2.0}}, r"ntk-by-parts"),
    ({"model_type": "llava", "text_config": {"model_type": "llama"},
      "vision_config": {"model_type": "clip_vision_model"}}, r"composite.*text_config"),
    ({"model_type": "deepseek_v3", "hidden_size": 512, "num_attention_heads": 4,
      "qk_nope_head_dim": 64}, r"qk_rope_head_dim"),
    ({"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "head_dim": 64}, r"qk_nope_head_dim"),
    ({"model_type": "nanochat", "head_dim": 64, "max_position_embeddings": 4096,
      "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"-angle"),
    ({"model_type": "dots3_note_text", "head_dim": 256, "qk_rope_head_dim": 64,
      "qk_nope_head_dim": 128, "layer_types": ["indexed_attention", "sliding_attention"],
      "per_layer_config": {"01": {"qk_nope_head_dim": 192}},
      "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}},
     r"qk_nope_head_dim per layer.*layer_type=.*indexed_attention"),
    ({"model_type": "wav2vec2-conformer", "hidden_size": 1024, "num_attention_heads": 16,
      "position_embeddings_type": "relative"}, r"position_embeddings_type='relative'"),
    ({"model_type": "wav2vec2-bert", "hidden_size": 1024, "num_attention_heads": 16},
     r"position_embeddings_type=None.*'rotary'"),
    ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "alibi": True},
     r"alibi=True"),
    ({"model_type": "gpt2", "n_embd": 768, "n_head": 12}, r"'gpt2'.*no rotary"),
    ({"model_type": "bloom", "hidden_size": 1024, "n_head": 16}, r"'bloom'.*no rotary"),
    ({"model_type": "esm", "hidden_size": 768, "num_attention_heads": 12,
      "position_embedding_type": "absolute"}, r"position_embedding_type='absolute'"),
])
def test_refusals_name_what_is_missing(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(config)


# -- sinusoidal tables of the transformers families ------------------------------------

SINUSOIDAL = json.loads((DATA / "hf_sinusoidal_reference.json").read_text())


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("case", SINUSOIDAL["cases"], ids=lambda c: c["name"])
def test_sinusoidal_family_matches_its_transformers_code(case, backend):
    if backend == "cython" and fastpe.info()["backend"] != "cython":
        pytest.skip("compiled backend not built")
    want = np.array(case["table"])
    length, dim = want.shape
    with fastpe.use_backend(backend):
        table = fastpe.sinusoidal_table(length, dim, dtype="float64", **case["fastpe"])
        np.testing.assert_allclose(table, want, rtol=1e-12, atol=1e-13, err_msg=case["name"])
        # add_sinusoidal adds the same rows, scaled input first
        x = np.full((length, dim), 0.5)
        kwargs = dict(case["fastpe"])
        offset = kwargs.pop("offset", 0)
        fastpe.add_sinusoidal(x, np.arange(length) + offset, scale=2.0, **kwargs)
        np.testing.assert_allclose(x, 1.0 + want, rtol=1e-12, atol=1e-13, err_msg=case["name"])


@pytest.mark.parametrize("model_type", ["llama4", "gemma3", "qwen2_5_omni", "mistral3", "llava"])
def test_flat_dict_of_a_composite_type_is_refused(model_type):
    """A hand-written flat dict of a composite model type (its text_config dropped) has no
    RoPE of its own to read: refused, never read as Llama's (Llama 4's text model pairs
    adjacent features, for one)."""
    config = {"model_type": model_type, "hidden_size": 512, "num_attention_heads": 8,
              "rope_theta": 500000.0, "max_position_embeddings": 4096}
    with pytest.raises(ValueError, match="composite config in transformers"):
        fastpe.RotaryEmbedding.from_hf_config(config)
