"""RotaryEmbedding.from_hf_config against every transformers family's own RoPE code.

The fixture (tests/data/make_hf_zoo_reference.py) ran each family's rotary module and
apply function in float64 on small configs; each case here loads the same config dict,
rotates the same q and k and must agree to float64 rounding, on both backends. Configs
fastpe does not reproduce must raise a ValueError that says why.
"""

import json
import re
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
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"], layer_type=case["layer_type"],
                                                 part=case.get("part"), layer=case.get("layer"))
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


MROPE = json.loads((DATA / "hf_mrope_reference.json").read_text())
MULTI_AXIS_CHECKED = {c["config"]["model_type"] for c in MROPE["cases"]
                      if c["kind"] in ("text", "vision")}
TEXT_CHECKED = {c["model_type"] for c in CASES.values()}


def test_known_model_types_are_transformers():
    # the generator's list: the config mapping and every sub-config's model type
    assert fastpe._hf_models.KNOWN == set(FIXTURE["known"])
    assert len(FIXTURE["known"]) > 800
    assert fastpe._hf_models.TRANSFORMERS_VERSION == ".".join(
        FIXTURE["transformers_version"].split(".")[:2])


def test_checked_model_types_are_the_fixtures():
    assert fastpe._hf_models.CHECKED == TEXT_CHECKED
    assert TEXT_CHECKED <= fastpe._hf_models.KNOWN


def test_multi_axis_tables_are_the_mrope_fixtures():
    # besides the flat config.json of Qwen2-VL / Qwen2.5-VL checkpoints, which run the
    # text models' code (test_mrope.py's test_flat_qwen2_vl_config_json_loads...)
    tables = set(fastpe._hf_multimodal.TEXT_MROPE) | set(fastpe._hf_multimodal.VISION)
    assert tables - MULTI_AXIS_CHECKED == {"qwen2_vl", "qwen2_5_vl"}


# the models that rotate by real-valued coordinates (tests/test_realrope.py's fixture)
with open(DATA / "hf_realrope_reference.json") as _f:
    REAL_CHECKED = {c["model_type"] for c in json.load(_f)["cases"]}


def test_real_coordinate_loaders_are_the_realrope_fixtures():
    from fastpe import _hf_realrope

    assert set(_hf_realrope.LOADERS) == REAL_CHECKED
    assert REAL_CHECKED <= fastpe._hf_models.KNOWN


@pytest.mark.parametrize("model_type", sorted(set(FIXTURE["known"]) - TEXT_CHECKED
                                              - MULTI_AXIS_CHECKED - REAL_CHECKED))
def test_every_unchecked_model_type_is_refused(model_type):
    # No fixture stands behind it: whatever the config says, it raises, naming the type.
    config = {"model_type": model_type, "hidden_size": 128, "num_attention_heads": 4,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    with pytest.raises(ValueError, match=re.escape(repr(model_type))):
        fastpe.RotaryEmbedding.from_hf_config(config)


def test_unchecked_message_names_the_transformers_version():
    with pytest.raises(ValueError, match=r"'layoutxlm'.*transformers 5\.25"):
        fastpe.RotaryEmbedding.from_hf_config({"model_type": "layoutxlm", "hidden_size": 768,
                                               "num_attention_heads": 12})


@pytest.mark.parametrize("case", FIXTURE["unnamed_sub_configs"], ids=lambda c: c["name"])
def test_sub_configs_without_a_model_type_are_refused(case):
    # fun_asr_nano's adaptor has no rotary code although it reads as Llama's
    with pytest.raises(ValueError, match="empty model_type"):
        fastpe.RotaryEmbedding.from_hf_config(case["config"])


def _nope_layers():
    """{model type: the layer types that the model's own forward pass left unrotated in
    its default config, or where no layer of that rotates (Bamba without attention
    layers) in every variant where some layer does}; a config none of whose layers
    rotate (Zamba2 without use_mem_rope) is refused whole instead. Variants whose layers
    differ by more than their type (EXAONE 4 without a window, Llama 4 without chunks)
    are checked layer by layer below."""
    default, variants = {}, {}
    for name, kinds in FIXTURE["layers"].items():
        if not {"rope", "mixed"} & set(kinds.values()):
            continue
        nope = {k for k, v in kinds.items() if v == "nope" and k != "null"}
        model_type = name.split("/")[0]  # the generator names variants model_type/variant
        if name == model_type:
            default[model_type] = nope
        else:
            variants[model_type] = variants.get(model_type, nope) & nope
    found = {**variants, **default}
    return {k: frozenset(v) for k, v in found.items() if v}


def test_nope_layer_types_are_the_traced_ones():
    assert fastpe._hf_models.NOPE_LAYERS == _nope_layers()
    assert {"cohere2", "qwen3_next", "llama4_text", "exaone4"} <= set(_nope_layers())


def _config_of(model_type):
    """The generator's default config of a model type: its case's, else that of a case of
    a variant (Bamba with attention layers), else (a multi-axis text model, checked by
    tests/test_mrope.py) its refusal's."""
    case = next((c for c in CASES.values() if c["name"].split("[")[0] == model_type),
                next((c for c in CASES.values() if c["model_type"] == model_type),
                     REFUSALS.get(model_type)))
    return case["config"]


NOPE = [(model_type, kind) for model_type, kinds in sorted(_nope_layers().items())
        for kind in sorted(kinds)]


@pytest.mark.parametrize("model_type, layer_type", NOPE, ids=lambda v: str(v))
def test_layers_without_rotation_are_refused(model_type, layer_type):
    # Cohere 2's full attention, Qwen3-Next's linear attention, Llama 4's NoPE layers:
    # the model leaves q and k alone there, so no RoPE may load for them.
    config = _config_of(model_type)
    with pytest.raises(ValueError, match=rf"{layer_type!r} layers use no positional "
                                         rf"encoding \(NoPE"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)


def test_model_without_any_rotating_layer_is_refused():
    # Zamba2 builds no rotary module unless use_mem_rope; GraniteMoE-hybrid's attention
    # rotates only with position_embedding_type "rope"; Bamba's default has no attention
    for name, pattern in (("zamba2", "applies rotary embeddings only with"),
                          ("granitemoehybrid", "applies rotary embeddings only with"),
                          ("bamba", "no attn_layer_indices")):
        assert REFUSALS[name]["reason"] == "no layer applies a rotary embedding"
        with pytest.raises(ValueError, match=pattern):
            fastpe.RotaryEmbedding.from_hf_config(REFUSALS[name]["config"])
    assert {"zamba2/mem_rope", "granitemoehybrid/rope", "bamba/attention"} <= set(CASES)


def _traced_config(name):
    """The stored config of a configuration the generator traced layer by layer."""
    case = next((c for c in CASES.values() if c["name"].split("[")[0] == name
                 and c.get("part") is None), None)
    if case is not None:
        return case["config"]
    return (REFUSALS.get(name) or FIXTURE["not_run"][name])["config"]


def _load(config, **kwargs):
    try:
        return fastpe.RotaryEmbedding.from_hf_config(config, **kwargs)
    except ValueError as err:
        return err


@pytest.mark.parametrize("name", sorted(FIXTURE["layer_rotation"]))
def test_each_layer_rotates_as_the_model_did(name):
    # The generator ran the model and saw, layer by layer, whether it applied a rotary
    # embedding and whose cos and sin (their rope_theta): from_hf_config(config, layer=i)
    # loads exactly those layers, at that base, and refuses the others (SmolLM3's and
    # Llama 4's no_rope_layers, Cohere 2's full attention, Qwen3-Next's linear attention,
    # Granite SWA's layer_rope_theta, ...).
    config = _traced_config(name)
    traced = FIXTURE["layer_rotation"][name]
    got = [_load(config, layer=i) for i in range(len(traced))]
    whole = not any(isinstance(r, fastpe.RotaryEmbedding) for r in got)
    for i, (seen, rope) in enumerate(zip(traced, got)):
        if seen is False:
            assert isinstance(rope, ValueError), (name, i, rope)
            continue
        if whole:  # refused whatever the layer (a multi-axis tower fastpe does not cover)
            assert "positional encoding" not in str(rope), (name, i, rope)
            continue
        assert isinstance(rope, fastpe.RotaryEmbedding), (name, i, rope)
        if seen is not True:
            assert rope._spec.base == seen, (name, i, rope._spec.base, seen)
    # without layer=: one embedding only where every layer rotates, at one base
    alike = False not in traced and len({v for v in traced if v is not True}) <= 1
    plain = _load(config)
    if alike and not whole:  # or a rope dict per layer type, asking for one
        assert isinstance(plain, fastpe.RotaryEmbedding) or (
            "layer_type=" in str(plain) and "positional encoding" not in str(plain)), (name, plain)
    elif not whole and False in traced:
        assert isinstance(plain, ValueError) and "layer=" in str(plain), (name, plain)
    else:
        assert isinstance(plain, ValueError), (name, plain)


def test_layers_that_differ_by_index_need_layer():
    # SmolLM3: every 4th layer (no_rope_layers 0) uses no RoPE; the message lists them
    config = CASES["smollm3"]["config"]
    assert config["no_rope_layers"][:4] == [1, 1, 1, 0]
    with pytest.raises(ValueError, match=r"layers 0-2, 4-6, .* rotate q and k, layers 3, 7, "
                                         r"11, .* use no positional encoding \(NoPE, config "
                                         r"no_rope_layers\); choose the layer with layer="):
        fastpe.RotaryEmbedding.from_hf_config(config)
    with pytest.raises(ValueError, match=r"layer 3 uses no positional encoding \(NoPE"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer=3)
    rope = fastpe.RotaryEmbedding.from_hf_config(config, layer=2)
    assert rope._spec.base == config["rope_parameters"]["rope_theta"] == 2e6
    # every layer rotating: no layer= needed
    assert CASES["smollm3/all_rope"].get("layer") is None
    fastpe.RotaryEmbedding.from_hf_config(CASES["smollm3/all_rope"]["config"])
    # without the list, the config class's: every no_rope_layer_interval-th layer
    derived = {k: v for k, v in config.items() if k != "no_rope_layers"}
    derived.update(num_hidden_layers=6, no_rope_layer_interval=3)
    with pytest.raises(ValueError, match=r"layers 2, 5 use no positional encoding"):
        fastpe.RotaryEmbedding.from_hf_config(derived)
    with pytest.raises(ValueError, match=r"no no_rope_layers and no num_hidden_layers"):
        fastpe.RotaryEmbedding.from_hf_config(
            {k: v for k, v in derived.items() if k not in ("num_hidden_layers", "layer_types")})
    # a list shorter than the model's layers: its code would fail
    with pytest.raises(ValueError, match=r"no_rope_layers has 2 entries for num_hidden_layers=6"):
        fastpe.RotaryEmbedding.from_hf_config(dict(derived, no_rope_layers=[1, 1]))


def test_layer_types_that_do_not_rotate_need_layer_or_layer_type():
    # Cohere 2's full-attention layers use no RoPE: the config alone is refused, naming
    # the layer type that rotates; layer= implies its layer type
    config = CASES["cohere2"]["config"]
    with pytest.raises(ValueError, match=r"layers 3, 7, .* use no positional encoding \(NoPE, "
                                         r"config layer_types and sliding_window\); choose the "
                                         r"layer with layer= .* or their layer type with "
                                         r"layer_type= \('sliding_attention'\)"):
        fastpe.RotaryEmbedding.from_hf_config(config)
    fastpe.RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention")
    fastpe.RotaryEmbedding.from_hf_config(config, layer=0, layer_type="sliding_attention")
    with pytest.raises(ValueError, match=r"layer=3 is a 'full_attention' layer \(config "
                                         r"layer_types\), not layer_type='sliding_attention'"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer=3, layer_type="sliding_attention")
    # an older config.json's layer type names, as transformers renames them
    legacy = dict(CASES["qwen3_next"]["config"])
    legacy["layer_types"] = [{"linear_attention": "mamba", "full_attention": "attention"}[t]
                             for t in legacy["layer_types"]]
    assert legacy["layer_types"][:4] == ["mamba", "mamba", "mamba", "attention"]
    with pytest.raises(ValueError, match=r"layer 0 uses no positional encoding"):
        fastpe.RotaryEmbedding.from_hf_config(legacy, layer=0)
    assert fastpe.RotaryEmbedding.from_hf_config(legacy, layer=3).rotary_dim == (
        fastpe.RotaryEmbedding.from_hf_config(CASES["qwen3_next"]["config"], layer=3).rotary_dim)


def test_layer_base_of_its_own():
    # Granite SWA rotates layer i with base layer_rope_theta[i] (0: NoPE)
    config = CASES["granite_swa/layer_theta"]["config"]
    assert config["layer_rope_theta"] == [10000.0, 0, 500000.0, 10000.0]
    bases = [_load(config, layer=i) for i in range(4)]
    assert [b._spec.base for b in bases if not isinstance(b, ValueError)] == [1e4, 5e5, 1e4]
    assert isinstance(bases[1], ValueError)
    with pytest.raises(ValueError, match=r"layers 0, 2-3 rotate q and k, layer 1 uses no"):
        fastpe.RotaryEmbedding.from_hf_config(config)
    same = dict(config, layer_rope_theta=[10000.0, 500000.0, 10000.0, 10000.0])
    with pytest.raises(ValueError, match=r"different bases .*layers 0, 2-3 rotate at 10000\.0; "
                                         r"layer 1 rotates at 500000\.0"):
        fastpe.RotaryEmbedding.from_hf_config(same)
    # one base for all its layers, other than the rope parameters': that one
    one = dict(config, layer_rope_theta=[5e4] * 4)
    assert fastpe.RotaryEmbedding.from_hf_config(one)._spec.base == 5e4


@pytest.mark.parametrize("layer, error, pattern", [
    ("1", TypeError, r"layer must be an int, got str"),
    (True, TypeError, r"layer must be an int, got bool"),
    (1.0, TypeError, r"layer must be an int, got float"),
    (-1, ValueError, r"layer must be >= 0, got -1"),
    (40, ValueError, r"layer=40: the config has 40 layers \(num_hidden_layers\), indices 0 to 39"),
], ids=["str", "bool", "float", "negative", "past-the-end"])
def test_bad_layer_is_refused(layer, error, pattern):
    config = dict(CASES["llama"]["config"], num_hidden_layers=40)
    with pytest.raises(error, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(config, layer=layer)
    # a config whose layers all rotate alike: any layer in range is that embedding
    assert fastpe.RotaryEmbedding.from_hf_config(config, layer=39).head_dim == (
        fastpe.RotaryEmbedding.from_hf_config(config).head_dim)


def _partial_read(case):
    """Whether the model's own output left the trailing features alone (it rotated only
    the leading partial_rotary_factor of the head)."""
    width = case["features"][1] - case["features"][0]
    q = inputs(case["seed"], width)
    return np.array_equal(ARRAYS[f"{case['key']}_q_out"][:, -1], q[:, -1])


def test_whole_head_families_are_those_the_partial_variant_did_not_narrow():
    partial = [c for c in CASES.values() if c["name"].split("[")[0].endswith("/partial")]
    assert len(partial) > 120
    whole = {c["model_type"] for c in partial if not _partial_read(c)}
    assert "llama" in whole and "phi" not in whole
    assert fastpe._hf_models.WHOLE_HEAD == whole


def test_families_whose_code_fails_on_a_partial_width_refuse_it():
    """The partial variants transformers' code failed on (a top-level factor, or one in
    each default-type layer type's entry): families whose rotary module reads
    partial_rotary_factor for every rope type while their attention rotates the whole
    head, and (their default-type frequencies reading none) families whose variant's
    rope type is another."""
    failed = {name for name in FIXTURE["not_run"] if name.endswith(("/partial", "/entry_partial"))
              and name.split("/")[0] in TEXT_CHECKED}
    other_type = {n for n in failed if n.split("/")[0] in fastpe._hf_models.DEFAULT_TYPE_WHOLE}
    assert fastpe._hf_models.PARTIAL_FAILS == {n.split("/")[0] for n in failed - other_type}
    assert {"apertus/partial", "ministral3/partial"} <= other_type
    for name in other_type:
        config = FIXTURE["not_run"][name]["config"]
        assert config["rope_parameters"]["rope_type"] != "default", name
    for name in failed:
        config = dict(FIXTURE["not_run"][name]["config"])
        # a layer type's own factor: those of its default-type layers narrowed by it
        layer_types = [None] if name.endswith("/partial") else [
            t for t, e in config["rope_parameters"].items()
            if e.get("rope_type", "default") == "default" and e.get("partial_rotary_factor")]
        assert layer_types, name
        for layer_type in layer_types:
            with pytest.raises(ValueError, match=r"own code fails"):
                fastpe.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)


def test_partial_rotary_factor_is_ignored_where_llama_ignores_it():
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
              "partial_rotary_factor": 0.5}
    rope = fastpe.RotaryEmbedding.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim) == (64, 64)
    # with a scaled rope type transformers' frequencies would cover half the head while
    # Llama's attention rotates all of it: its own code fails, so fastpe refuses
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0,
                                 "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match=r"rotates the whole head.*'linear'"):
        fastpe.RotaryEmbedding.from_hf_config(config)


@pytest.mark.parametrize("model_type", ["gemma4_text", "lfm3"])
@pytest.mark.parametrize("entry", [
    {"rope_type": "linear", "factor": 4.0}, {"rope_type": "dynamic", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}],
    ids=["linear", "dynamic", "yarn"])
def test_a_layer_types_partial_width_with_a_scaled_type_is_refused(model_type, entry):
    """Gemma 4's and LFM3's full-attention layers rotate the whole head: a partial factor
    in their entry narrows the frequencies of every rope type but default and proportional
    (transformers' own model then fails: "size of tensor a (512) must match ... (128)")."""
    case = CASES[f"{model_type}[full_attention]"]
    params = dict(case["config"]["rope_parameters"])
    partial = params["full_attention"]["partial_rotary_factor"]
    config = dict(case["config"], rope_parameters={
        **params, "full_attention": {**entry, "rope_theta": 1e6, "partial_rotary_factor": partial}})
    with pytest.raises(ValueError, match=r"rotates the whole head.*own code fails"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    # the proportional type keeps the width, and the sliding layers are untouched
    config["rope_parameters"]["full_attention"] = params["full_attention"]
    rope = fastpe.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    assert rope.rotary_dim == rope.head_dim


def test_a_scaled_type_recurrent_gemma_refuses_is_refused():
    """RecurrentGemma's rotary module raises on every rope type but default."""
    case = CASES["recurrent_gemma"]
    config, layer = case["config"], {"layer": case.get("layer")}
    scaled = dict(config, rope_parameters={**config["rope_parameters"], "rope_type": "linear",
                                           "factor": 2.0})
    with pytest.raises(ValueError, match=r"default rope type only.*own code fails on rope type 'linear'"):
        fastpe.RotaryEmbedding.from_hf_config(scaled, **layer)
    assert fastpe.RotaryEmbedding.from_hf_config(config, **layer)._spec.rope_type == "default"


def test_a_key_and_its_alias_set_apart_are_refused():
    """DBRX's config class keeps max_position_embeddings over max_seq_len when a dict
    sets both, Bailing-hybrid's model_max_length over max_position_embeddings: fastpe
    refuses to guess; equal values, or one of them, load."""
    config = dict(CASES["dbrx/dynamic"]["config"])
    assert config["max_seq_len"] == 64 and "max_position_embeddings" not in config
    with pytest.raises(ValueError, match=r"max_position_embeddings=128 and max_seq_len=64"):
        fastpe.RotaryEmbedding.from_hf_config(dict(config, max_position_embeddings=128))
    same = fastpe.RotaryEmbedding.from_hf_config(dict(config, max_position_embeddings=64))
    assert same._spec == fastpe.RotaryEmbedding.from_hf_config(config)._spec
    # SeamlessM4T's num_attention_heads are its text decoder's, not an alias: unread
    speech = dict(CASES["seamless_m4t/rotary"]["config"])
    heads = speech["speech_encoder_attention_heads"]
    wider = dict(speech, num_attention_heads=heads * 2)
    assert (fastpe.RotaryEmbedding.from_hf_config(wider).head_dim
            == fastpe.RotaryEmbedding.from_hf_config(speech).head_dim)


def test_custom_model_with_a_partial_width_is_refused():
    # Llama's code (what a custom model loads as) ignores the key; others read it
    config = {"model_type": "my_custom_llm", "hidden_size": 256, "num_attention_heads": 4,
              "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0\.5.*cannot tell"):
        fastpe.RotaryEmbedding.from_hf_config(config)


def test_dynamic_ntk_length_is_max_position_embeddings_as_transformers_computes_it():
    # the fixture's variants carry an original length of 16 in the rope dict, which
    # transformers' code ignores; positions up to 300 against 64 or 16 differ by ~2
    for name in ("llama/dynamic_original", "llama/dynamic_legacy_type"):
        assert CASES[name]["config"]["max_position_embeddings"] == 64
        assert "original_max_position_embeddings" in str(CASES[name]["config"])


@pytest.mark.parametrize("params", [
    {"rope_type": "", "rope_theta": 10000.0},
    {"rope_type": None, "type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
], ids=["empty", "none-with-type"])
def test_rope_type_transformers_fails_on_is_refused(params):
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
              "max_position_embeddings": 64, "rope_parameters": params}
    with pytest.raises(ValueError, match=r"rope_type=.*no rope type"):
        fastpe.RotaryEmbedding.from_hf_config(config)


def test_sarvam_mla_runs_deepseek_v3_and_slices_like_it():
    # a config-only type: transformers runs DeepseekV3Model for it (q is [nope | rope])
    config = dict(CASES["sarvam_mla"]["config"])
    sarvam = fastpe.RotaryEmbedding.from_hf_config(config)
    deepseek = fastpe.RotaryEmbedding.from_hf_config(dict(config, model_type="deepseek_v3"))
    nope, rope = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    assert sarvam.feature_slice == deepseek.feature_slice == slice(nope, nope + rope)


def test_indexer_part_is_the_indexers_rotation():
    # DeepSeek-V3.2: the main attention pairs adjacent features of q's rope part, the
    # lightning indexer rotate_half over the leading features of its own heads
    config = CASES["deepseek_v32"]["config"]
    main = fastpe.RotaryEmbedding.from_hf_config(config)
    indexer = fastpe.RotaryEmbedding.from_hf_config(config, part="indexer")
    assert (main.style, indexer.style) == ("gptj", "neox")
    assert indexer.feature_slice == slice(0, config["qk_rope_head_dim"])
    assert {c["model_type"] for c in CASES.values() if c.get("part") == "indexer"} == set(
        fastpe._hf_models.INDEXERS)


@pytest.mark.parametrize("config, part, error, pattern", [
    ({"model_type": "llama", "head_dim": 64}, "indexer", ValueError, r"no lightning indexer"),
    ({"model_type": "deepseek_v32", "hidden_size": 128, "num_attention_heads": 4,
      "qk_rope_head_dim": 64, "qk_nope_head_dim": 64}, "indexer", ValueError,
     r"index_head_dim"),
    ({"model_type": "llama", "head_dim": 64}, "attention", ValueError, r"part must be"),
], ids=["no-indexer", "no-index-head-dim", "unknown-part"])
def test_bad_part_is_refused(config, part, error, pattern):
    with pytest.raises(error, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(config, part=part)


@pytest.mark.parametrize("config, error, pattern", [
    (None, TypeError, r"config must be a transformers config"),
    ("llama", TypeError, r"config must be a transformers config"),
    ({"model_type": ["llama"], "head_dim": 64}, TypeError, r"model_type must be a string"),
    ({"model_type": "llama", "head_dim": 64.5}, ValueError, r"head_dim"),
    ({"model_type": "llama", "head_dim": "64"}, TypeError, r"head_dim"),
    ({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 0}, ValueError,
     r"num_attention_heads"),
], ids=["none", "str", "list-model-type", "fractional-head-dim", "string-head-dim",
        "zero-heads"])
def test_loader_checks_what_it_reads(config, error, pattern):
    with pytest.raises(error, match=pattern):
        fastpe.RotaryEmbedding.from_hf_config(config)


def test_style_override_is_checked():
    with pytest.raises(ValueError, match="style"):
        fastpe.RotaryEmbedding.from_hf_config({"model_type": "llama", "head_dim": 64},
                                              style="rotate")
    rope = fastpe.RotaryEmbedding.from_hf_config({"model_type": "llama", "head_dim": 64},
                                                 style="gptj")
    assert rope.style == "gptj"


def test_fixture_covers_the_families():
    # A reader sees the coverage in the fixture; guard against a truncated regeneration.
    families = {c["model_type"] for c in CASES.values()}
    assert len(families) > 180
    assert {"llama", "gptj", "deepseek_v2", "deepseek_v3", "gemma4_text", "phimoe",
            "nanochat", "llama4_text"} <= families


def test_model_types_without_rope_are_the_generators():
    assert fastpe._hf_models.NO_ROPE == set(FIXTURE["no_rope"])
    assert not fastpe._hf_models.NO_ROPE & {c["model_type"] for c in CASES.values()}
    assert not fastpe._hf_models.NO_ROPE & set(fastpe._hf_models.MODELS)


def test_unknown_model_type_loads_as_llama():
    assert "my_custom_llm" not in fastpe._hf_models.KNOWN
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
      "rope_parameters": {
          layer_type: {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
          for layer_type in ("indexed_attention", "sliding_attention")}},
     r"indexed_attention.*layer_type="),
    ({"model_type": "gemma3_text", "transformers_version": "4.50.0", "head_dim": 64,
      "rope_theta": 1e6, "rope_local_base_freq": 1e4},
     r"no rope parameters per layer type.*rope_local_base_freq"),
    # ZAYA1's config.json: entries per layer type and a leftover rope_type, which its
    # config class drops
    ({"model_type": "zaya", "rope_parameters": {
        "rope_type": "default",
        "hybrid": {"rope_type": "default", "rope_theta": 5e6},
        "hybrid_sliding": {"rope_type": "default", "rope_theta": 1e4}}},
     r"per layer type \(hybrid, hybrid_sliding\) beside flat keys \(rope_type\).*"
     r"give the config object"),
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
    # Jamba keeps Llama's apply function but never calls it; Kimi-Linear's MLA is NoPE
    ({"model_type": "jamba", "hidden_size": 4096, "num_attention_heads": 32,
      "rope_theta": 10000.0}, r"'jamba'.*no rotary"),
    ({"model_type": "kimi_linear", "hidden_size": 2048, "num_attention_heads": 32,
      "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}, r"'kimi_linear'.*no rotary"),
    ({"model_type": "musicflamingo", "hidden_size": 1280, "num_attention_heads": 20,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
     r"'musicflamingo'.*rotary time embedding rotates the audio features"),
    ({"model_type": "blt", "max_position_embeddings": 4096,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
      "encoder_config": {"model_type": "blt_local_encoder"}},
     r"'blt'.*composite.*pass that sub-config"),
    # CLVP's encoder rotates max(projection_dim // (2 * heads), 32) features of each head
    ({"model_type": "clvp_encoder", "hidden_size": 64, "num_attention_heads": 4,
      "projection_dim": 64}, r"= 32 features of heads of head_dim=16.*own code fails"),
    ({"model_type": "clvp_encoder", "hidden_size": 256, "num_attention_heads": 4,
      "projection_dim": 264}, r"= 33 is odd.*rotates 34 features"),
    ({"model_type": "clvp_encoder", "hidden_size": 256, "num_attention_heads": 4,
      "projection_dim": 256, "use_rotary_embedding": False}, r"use_rotary_embedding=False"),
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


LEGACY = json.loads((DATA / "hf_legacy_rope_types_reference.json").read_text())["cases"]


@pytest.mark.parametrize("case", LEGACY, ids=[c["name"] for c in LEGACY])
def test_legacy_rope_types_read_as_their_config_class_reads_them(case):
    """A Phi-3 config.json's "su" or "yarn" (tests/data/make_hf_legacy_rope_types_reference.py)
    is LongRoPE with the dict's short and long factors, as Phi3Config reads it: the
    cos and sin of the model's rotary module within and past the original length."""
    rope = fastpe.RotaryEmbedding.from_hf_config(case["config"])
    assert rope.rope_type == case["read_as"]
    for span in ("short", "long"):
        want = case[span]
        cos, sin = rope.cos_sin(np.array(want["positions"]), dtype=np.float64)
        np.testing.assert_allclose(cos, want["cos"], rtol=1e-12, atol=1e-12, err_msg=span)
        np.testing.assert_allclose(sin, want["sin"], rtol=1e-12, atol=1e-12, err_msg=span)
