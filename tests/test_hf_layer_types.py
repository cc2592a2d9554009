"""from_hf_config on configs without ``layer_types``, in families whose layers differ by
layer type (some use no RoPE, or another RoPE), against how transformers loads them.

The fixture (tests/data/make_hf_layer_types_reference.py) wrote each family's small config
as a dict without the key, loaded it with the config class and ran the model transformers
builds from it: the layer types the class derived, and per layer index the rope_theta
of the cos and sin the layer applied (true: applied, by a cos and sin the trace cannot
trace to one module; false: none). fastpe derives the types as the class does, or
refuses: each layer it loads is the one it loads from the same config with the derived
layer_types (which tests/test_hf_zoo.py holds to the model's numbers), and no layer
without RoPE loads.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import fastpe
from fastpe import _hf_layers

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "hf_layer_types_reference.json").read_text())
CASES = {c["name"]: c for c in FIXTURE["cases"]}
RUN = sorted(n for n, c in CASES.items() if "error" not in c)
FAILED = sorted(n for n, c in CASES.items() if "error" in c)
POSITIONS = np.array([0, 3, 17, 300], dtype=np.int64)


def _load(config, **kwargs):
    try:
        return fastpe.RotaryEmbedding.from_hf_config(config, **kwargs)
    except ValueError as err:
        return err


def _key(case):
    return "layers_block_type" if case["model_type"] == "zamba2" else "layer_types"


def _listed(case):
    """The case's config with the layer types its config class derived, listed."""
    return dict(case["config"], **{_key(case): case["layer_types"]})


def _rotated(rope):
    rng = np.random.default_rng(0)
    width = rope.feature_slice.stop
    q = rng.standard_normal((1, len(POSITIONS), 2, width))
    k = rng.standard_normal((1, len(POSITIONS), 2, width))
    rope(q[..., rope.feature_slice], k[..., rope.feature_slice], POSITIONS)
    return q, k


def _same(got, want):
    assert isinstance(got, fastpe.RotaryEmbedding), got
    assert isinstance(want, fastpe.RotaryEmbedding), want
    assert repr(got) == repr(want) and got.feature_slice == want.feature_slice
    for a, b in zip(_rotated(got), _rotated(want)):
        np.testing.assert_array_equal(a, b)


def test_fixture_is_this_transformers():
    assert ".".join(FIXTURE["transformers_version"].split(".")[:2]) == (
        fastpe._hf_models.TRANSFORMERS_VERSION)
    assert all(_key(c) not in c["config"] for c in CASES.values())
    # every family whose layers differ by layer type in whether they rotate
    assert set(fastpe._hf_models.NOPE_LAYERS) <= {c["model_type"] for c in CASES.values()}


@pytest.mark.parametrize("name", RUN)
def test_derived_layer_types_are_the_config_classes(name):
    case = CASES[name]
    model_type = case["model_type"]
    if model_type not in _hf_layers._NEEDS_TYPES:
        return  # Llama 4, the Muse models: their rules read other per-layer keys
    config = case["config"]
    kinds, _ = _hf_layers._layer_types(config, model_type, config["num_hidden_layers"])
    if kinds is None:  # Bamba without attn_layer_indices: no layer rotates, refused whole
        assert not any(case["layer_rotation"]), name
        assert isinstance(_load(config), ValueError), name
        return
    assert kinds == case["layer_types"], name


@pytest.mark.parametrize("name", RUN)
def test_each_layer_without_layer_types_rotates_as_the_model_did(name):
    case = CASES[name]
    config, traced = case["config"], case["layer_rotation"]
    derived = case["model_type"] in _hf_layers._NEEDS_TYPES
    for i, seen in enumerate(traced):
        got = _load(config, layer=i)
        if seen is False:
            assert isinstance(got, ValueError), (name, i, got)
            continue
        if isinstance(got, ValueError):
            # refused: only a rope dict per layer type, whose layers fastpe cannot place
            assert not derived and "no layer_types" in str(got), (name, i, got)
            assert repr(case["model_type"]) in str(got), (name, i, got)
            continue
        if seen is not True:
            assert got._spec.base == seen, (name, i, got._spec.base, seen)
        want = _load(_listed(case), layer=i)
        _same(got, want)
    # the whole model: one embedding only where every layer rotates alike
    whole = _load(config)
    if False in traced or len({v for v in traced if v is not True}) > 1:
        assert isinstance(whole, ValueError), (name, whole)
    elif isinstance(whole, fastpe.RotaryEmbedding):
        _same(whole, _load(_listed(case)))


@pytest.mark.parametrize("name", RUN)
def test_each_layer_type_without_layer_types_rotates_as_the_model_did(name):
    case = CASES[name]
    if case["model_type"] not in _hf_layers._NEEDS_TYPES:
        return
    config, traced, kinds = case["config"], case["layer_rotation"], case["layer_types"]
    for kind in sorted(set(kinds)):
        seen = {traced[i] for i, k in enumerate(kinds) if k == kind}
        got = _load(config, layer_type=kind)
        if False in seen or len(seen - {True}) > 1:
            assert isinstance(got, ValueError), (name, kind, got)
        else:
            _same(got, _load(_listed(case), layer_type=kind))


@pytest.mark.parametrize("name", FAILED)
def test_configs_transformers_cannot_load_are_refused(name):
    # EXAONE 4 with a string sliding_window_pattern or without a window, Cohere 2 without
    # a window, GraniteMoE-hybrid and Zamba2 without attention that rotates
    case = CASES[name]
    config = case["config"]
    assert isinstance(_load(config), ValueError), name
    for i in range(config["num_hidden_layers"]):
        assert isinstance(_load(config, layer=i), ValueError), (name, i)


@pytest.mark.parametrize("model_type", sorted(_hf_layers._NEEDS_TYPES))
def test_without_layer_count_the_families_are_refused(model_type):
    case = CASES[model_type]
    config = {k: v for k, v in case["config"].items() if k != "num_hidden_layers"}
    for kwargs in ({}, {"layer": 0}, {"layer": 1}):
        err = _load(config, **kwargs)
        assert isinstance(err, ValueError), (model_type, kwargs, err)
        assert repr(model_type) in str(err), (model_type, kwargs, err)


def test_refusal_names_the_model_type_and_the_missing_keys():
    config = {k: v for k, v in CASES["ergo"]["config"].items() if k != "num_hidden_layers"}
    with pytest.raises(ValueError, match=r"model_type 'ergo': config has no layer_types and no "
                                         r"num_hidden_layers, from which its config class "
                                         r"derives them \(global_attention_every_n_layers\)"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer=0)
    with pytest.raises(ValueError, match=r"model_type 'gemma3_text': config has no layer_types, "
                                         r"and its rope parameters have one entry per layer "
                                         r"type: fastpe cannot tell which layer type layer 1 is"):
        fastpe.RotaryEmbedding.from_hf_config(CASES["gemma3_text"]["config"], layer=1)
    with pytest.raises(ValueError, match=r"sliding_window_pattern='LLLG'"):
        fastpe.RotaryEmbedding.from_hf_config(CASES["exaone4/pattern_str"]["config"], layer=0)


def test_derived_layers_that_use_no_rope_are_named():
    # Qwen3-Next without layer_types: every full_attention_interval-th layer is full
    # attention, the others linear attention without RoPE
    config = CASES["qwen3_next/interval_3"]["config"]
    with pytest.raises(ValueError, match=r"layers 2, 5, 8 rotate q and k, layers 0-1, 3-4, 6-7, "
                                         r"9 use no positional encoding \(NoPE, config "
                                         r"layer_types as its config class derives them\)"):
        fastpe.RotaryEmbedding.from_hf_config(config)
    assert isinstance(_load(config, layer=5), fastpe.RotaryEmbedding)
