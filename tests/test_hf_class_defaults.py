"""from_hf_config on config.json dicts that leave out keys it reads (head_dim,
partial_rotary_factor, position_embedding_type, the base) or give a base under an older
key, against what each family's config class makes of them.

The fixture (tests/data/make_hf_class_defaults_reference.py) loaded two or three such
dicts per checked family with its config class (hidden sizes 192 and 320 over 4 heads;
latent attention also with qk_rope_head_dim 24; a base under rope_theta, under
rotary_emb_base) and stored what the loaded config holds:
Gemma's class keeps head_dim 256 whatever the dict's sizes, StableLM's rotates a quarter
of each head, ESM's uses absolute position embeddings, Llama's derives the width and
rotates all of it; Llama 4's base is 500000, GPT-NeoX reads rotary_emb_base and Apertus no
top-level base. fastpe's head, rotated width and base are those, or it refuses the dict.
"""

import json
import sys
from pathlib import Path

import pytest

import fastpe
from fastpe import _hf_models, _rope_scaling

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "hf_class_defaults_reference.json").read_text())
CASES = [c for c in FIXTURE["cases"] if "error" not in c]
sys.path.insert(0, str(DATA))
from make_hf_class_defaults_reference import class_defaults  # noqa: E402


def _case_id(case):
    return "{}-{}".format(case["model_type"], "-".join(
        f"{k}{v}" for k, v in case["config"].items() if k.endswith(("size", "rope_head_dim"))))


def test_the_tables_are_the_fixtures():
    assert (_hf_models.CLASS_DEFAULTS, _hf_models.ROPE_DEFAULTS, _hf_models.DEFAULT_THETA,
            _hf_models.BASE_KEYS, sorted(_hf_models.PER_LAYER_CONFIG),
            sorted(_hf_models.HEAD_DIM_UNREAD), sorted(_hf_models.ROPE_SCALING_UNREAD),
            sorted(_hf_models.ROPE_PER_LAYER_TYPE)) == class_defaults(FIXTURE["cases"])
    assert FIXTURE["transformers"].startswith(_hf_models.TRANSFORMERS_VERSION)


def _load(config):
    try:
        return _rope_scaling.hf_rope_config(dict(config))
    except ValueError:
        return None  # refused: no width or base to get wrong


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_a_dict_without_the_keys_is_read_as_its_class_reads_it(case):
    config = case["config"]
    loaded = _load(config)
    if (case["position_embedding_type"] not in (None, "rotary") or case["per_layer_config"]
            or case["per_layer_type"]):
        # no rotary embedding; widths or rope parameters per layer it does not derive
        assert loaded is None
    if loaded is None:
        return
    if case["rope_theta"] is not None and _hf_models.convention(
            case["model_type"]).fixed_base is None:
        assert loaded["base"] == case["rope_theta"]
        made = case["rope_parameters"] or {}
        scaling = loaded["scaling"] or {}
        assert scaling.get("rope_type", scaling.get("type", "default")) == made.get(
            "rope_type", "default")
        assert scaling.get("factor") == made.get("factor")
    if _hf_models.convention(case["model_type"]).width_key is not None:
        return  # latent attention: the rope part's own rules (tests/test_hf_zoo.py)
    head_dim = case["head_dim"]
    if head_dim is None:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert loaded["features"][1] == head_dim
    partial = case["partial_rotary_factor"]
    if partial is not None and any(
            "partial_rotary_factor" in table.get(case["model_type"], {})
            for table in (_hf_models.CLASS_DEFAULTS, _hf_models.ROPE_DEFAULTS)):
        # the family reads it (fastpe found its class default worth keeping)
        assert loaded["rotary_dim"] == int(head_dim * partial)


@pytest.mark.parametrize("case", [c for c in CASES if c["head_dim"] is not None],
                         ids=_case_id)
def test_a_written_dict_without_head_dim_takes_the_class_head_dim(case):
    """A dict transformers wrote (transformers_version) holds its class's head_dim; one
    without it (edited out) loads with the class default, as the class loads it, not
    hidden_size / num_attention_heads."""
    written = _load({**case["config"], "transformers_version": "5.25.0"})
    if written is None or _hf_models.convention(case["model_type"]).width_key is not None:
        return
    assert written["features"][1] == case["head_dim"]


def test_a_to_dict_is_not_completed():
    # GLM-4's class holds partial_rotary_factor in its rope parameters; one built without
    # it rotates the whole head, and its to_dict() (no top-level factor) says so
    from_object = _rope_scaling.hf_rope_config(
        {"model_type": "glm4", "hidden_size": 256, "num_attention_heads": 4,
         "head_dim": 128, "transformers_version": "5.25.0",
         "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert from_object["rotary_dim"] == 128
    typed = _rope_scaling.hf_rope_config(
        {"model_type": "glm4", "hidden_size": 256, "num_attention_heads": 4})
    assert (typed["head_dim"], typed["rotary_dim"]) == (128, 64)


def test_dicts_without_the_keys_of_a_few_families():
    gemma = fastpe.RotaryEmbedding.from_hf_config(
        {"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8})
    assert (gemma.head_dim, gemma.rotary_dim) == (256, 256)
    # a dict that gives the key keeps it, as the class does
    assert fastpe.RotaryEmbedding.from_hf_config(
        {"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8,
         "head_dim": 64}).head_dim == 64
    stablelm = fastpe.RotaryEmbedding.from_hf_config(
        {"model_type": "stablelm", "hidden_size": 2560, "num_attention_heads": 32})
    assert (stablelm.head_dim, stablelm.rotary_dim) == (80, 20)
    assert _rope_scaling.hf_rope_config(
        {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40})["base"] == 5e5
    with pytest.raises(ValueError, match="position_embedding_type='absolute'"):
        fastpe.RotaryEmbedding.from_hf_config(
            {"model_type": "esm", "hidden_size": 320, "num_attention_heads": 20})


def test_phi3_keeps_its_own_original_length():
    # Phi-3's class moves its original_max_position_embeddings (4096 unless given) into
    # LongRoPE parameters, whatever they say
    loaded = _rope_scaling.hf_rope_config(
        {"model_type": "phi3", "hidden_size": 128, "num_attention_heads": 4,
         "max_position_embeddings": 256, "rope_parameters": {
             "rope_type": "longrope", "rope_theta": 50.0, "short_factor": [1.0] * 16,
             "long_factor": [2.0] * 16}})
    assert loaded["scaling"]["original_max_position_embeddings"] == 4096


def test_hunyuan_alpha_stretches_the_base():
    # HunYuan's config.json says "dynamic" with alpha 1000: transformers' rotary module
    # reads it as a fixed base, 1e4 * 1000^(128 / 126), no growth with the length
    loaded = _rope_scaling.hf_rope_config(
        {"model_type": "hunyuan_v1_dense", "hidden_size": 512, "num_attention_heads": 4,
         "head_dim": 128, "rope_theta": 1e4, "transformers_version": "4.56.0",
         "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}})
    assert loaded["scaling"] is None
    assert loaded["base"] == 1e4 * 1000.0 ** (128 / 126)


GEMMA3_LAYERS = {"model_type": "gemma3_text", "hidden_size": 128, "num_attention_heads": 4,
                 "head_dim": 32, "num_hidden_layers": 2,
                 "layer_types": ["sliding_attention", "full_attention"]}


@pytest.mark.parametrize("config, missing", [
    # Gemma 3's class gives the full layers rope_theta, else 1e6, the sliding ones
    # rope_local_base_freq, else 10000: not the top-level base fastpe would take
    ({**GEMMA3_LAYERS, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_parameters": {
        "sliding_attention": {"rope_type": "default"},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "'sliding_attention' without rope_theta"),
    ({"model_type": "modernbert", "hidden_size": 128, "num_attention_heads": 4,
      "rope_parameters": {"full_attention": {"rope_type": "default"},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "'full_attention' without rope_theta"),
    # the class copies a top-level partial factor into every entry, which these read
    ({"model_type": "step3p5", "hidden_size": 128, "num_attention_heads": 4, "head_dim": 64,
      "partial_rotary_factor": 0.5, "layer_types": ["full_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "'full_attention' without partial_rotary_factor"),
    # NeoMME's class fills each entry's factor (a quarter of the head in full attention)
    ({"model_type": "neomme", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
      "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
      "rope_parameters": {
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                "partial_rotary_factor": 1.0},
          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "'full_attention' without partial_rotary_factor"),
])
def test_a_typed_dict_leaving_a_layer_types_entry_to_its_class_is_refused(config, missing):
    layer_type = missing.split("'")[1]
    with pytest.raises(ValueError, match=rf"without transformers_version.*{missing}"):
        fastpe.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    # transformers wrote it: its entries are complete as they stand
    written = {**config, "transformers_version": "5.25.0"}
    try:
        fastpe.RotaryEmbedding.from_hf_config(written, layer_type=layer_type)
    except ValueError as err:
        assert "without transformers_version" not in str(err)


def test_a_top_level_partial_factor_beside_entries_of_a_whole_head_family_is_not_refused():
    config = {**GEMMA3_LAYERS, "partial_rotary_factor": 0.5, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    rope = fastpe.RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention")
    assert rope.rotary_dim == 32                        # Gemma 3 rotates the whole head
    # LFM3's default-type frequencies read no partial factor either (its sliding layers)
    zoo = json.loads((Path(__file__).parent / "data" / "hf_zoo_reference.json").read_text())
    lfm3 = next(c["config"] for c in zoo["cases"] if c["name"] == "lfm3[sliding_attention]")
    lfm3 = {**lfm3, "partial_rotary_factor": 0.5}
    rope = fastpe.RotaryEmbedding.from_hf_config(lfm3, layer_type="sliding_attention")
    assert rope.rotary_dim == rope.head_dim
    assert rope.frequencies().inv_freq[1] == pytest.approx(1e4 ** (-2 / 32), rel=1e-15)
