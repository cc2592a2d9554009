"""Regenerate hf_layer_types_reference.json: configs without ``layer_types``, as
transformers loads them, layer by layer.

Run by hand, never by the test suite, with transformers and torch installed (it imports
make_hf_zoo_reference beside it, for its small configs, its layer trace and its config
dicts):

    /path/to/venv/bin/python tests/data/make_hf_layer_types_reference.py

For each family whose layers differ by layer type (some use no RoPE, or another RoPE),
it builds the small config the zoo generator uses (with ``num_hidden_layers`` below),
writes it as a dict without ``layer_types`` (``layers_block_type`` for Zamba2), with some
of the keys that transformers derives the layer types from set or left out, and loads
that dict with the config class (``from_dict``), as a config.json without the key loads.
Each case stores the dict, the ``layer_types`` the loaded config derived, and what the
model transformers builds from it did per layer index (``make_hf_zoo_reference.trace_layers``):
the rope_theta of the cos and sin it applied, true where the trace cannot tell, false
where it applied none. Where the config class or the model fails on the dict, the case
stores the error instead: fastpe must refuse that config.
"""

import importlib
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import make_hf_zoo_reference as zoo
import transformers

OUTPUT = Path(__file__).with_name("hf_layer_types_reference.json")
LAYERS = 10

# A key's value that stands for None in the dict (None in VARIANTS leaves the key out).
NULL = "<None>"

# model type -> [(variant, keys to set in the dict (None: leave the key out))]; every
# family also runs "default": the dict as to_dict() wrote it, less layer_types.
VARIANTS = {
    "afmoe": [("every_3", {"global_attn_every_n_layers": 3}),
              ("class_default", {"global_attn_every_n_layers": None})],
    "bailing_hybrid": [("group_3", {"layer_group_size": 3}),
                       ("class_default", {"layer_group_size": None})],
    # their configs never list layer_types: transformers derives them (layers_block_type)
    "bamba": [("attention", {"attn_layer_indices": [1, 4]})],
    "recurrent_gemma": [("blocks", {"block_types": ["recurrent", "attention"]})],
    "beam": [("layers_7", {"num_hidden_layers": 7})],
    "cohere2": [("pattern_3", {"sliding_window_pattern": 3}),
                ("no_window", {"sliding_window": NULL})],
    "cohere2_moe": [("pattern_3", {"sliding_window_pattern": 3}),
                    ("dense_prefix_2", {"first_k_dense_replace": 2, "mlp_layer_types": None}),
                    ("prefix_pattern_2", {"first_k_dense_replace": 4, "mlp_layer_types": None,
                                          "prefix_dense_sliding_window_pattern": 2}),
                    ("class_default", {"sliding_window_pattern": None,
                                       "prefix_dense_sliding_window_pattern": None})],
    "ergo": [("every_3", {"global_attention_every_n_layers": 3}),
             ("class_default", {"global_attention_every_n_layers": None})],
    "exaone4": [("pattern_3", {"sliding_window_pattern": 3}),
                ("class_default", {"sliding_window_pattern": None}),
                ("pattern_str", {"sliding_window_pattern": "LLLG"}),
                ("no_window", {"sliding_window": NULL})],
    "exaone_moe": [("pattern_3", {"sliding_window_pattern": 3}),
                   ("class_default", {"sliding_window_pattern": None}),
                   ("no_window", {"sliding_window": NULL})],
    "flint": [("layers_7", {"num_hidden_layers": 7})],
    "granitemoehybrid": [("rope", {"position_embedding_type": "rope"})],
    "kolibri1": [],
    "kolibri1_1": [],
    "lara_mini": [("layers_7", {"num_hidden_layers": 7})],
    "lfm3": [("layers_7", {"num_hidden_layers": 7})],
    "llama4_text": [("no_chunk", {"attention_chunk_size": None})],
    "minimax": [],
    "muse_glimmer_text": [],
    "muse_spark_text": [],
    "olmo_hybrid": [("layers_3", {"num_hidden_layers": 3})],
    "qwen3_5_moe_text": [("interval_3", {"full_attention_interval": 3})],
    "qwen3_5_text": [("interval_3", {"full_attention_interval": 3})],
    "qwen3_next": [("interval_3", {"full_attention_interval": 3})],
    "qwen4_exp_text": [("interval_3", {"full_attention_interval": 3})],
    "zamba2": [("mem_rope", {"use_mem_rope": True}),
               ("mem_rope_layers_10", {"use_mem_rope": True, "num_hidden_layers": 10})],
    # a rope dict per layer type, no NoPE layers
    "gemma3_text": [],
    "modernbert": [],
}


def config_class(model_type):
    """The config class of a model type: the config mapping's, else (a text sub-config)
    the one in its folder's configuration module."""
    if model_type in transformers.CONFIG_MAPPING:
        return transformers.CONFIG_MAPPING[model_type]
    folder = model_type.removesuffix("_text")
    module = importlib.import_module(f"transformers.models.{folder}.configuration_{folder}")
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "model_type", None) == model_type:
            return value
    raise LookupError(model_type)


def run(model_type, variant, keys):
    cls = config_class(model_type)
    # Zamba2's class default layers_block_type has 54 entries, as many as num_hidden_layers
    # must be: its config is built with 54, a variant's other count set in the dict
    zamba2 = model_type == "zamba2"
    extra = {"num_hidden_layers": 54 if zamba2 else keys.get("num_hidden_layers", LAYERS)}
    stored = zoo.config_dict(zoo.small_config(cls, extra))
    # json_safe wrote GraniteMoE-hybrid's (0.0, inf) as [0.0, null], which it does not load
    stored.pop("time_step_limit", None)
    alias = "layers_block_type" if model_type == "zamba2" else "layer_types"
    stored.pop(alias, None)
    for key, value in keys.items():
        if value is None:
            stored.pop(key, None)
        else:
            stored[key] = None if value == NULL else value
    case = {"name": model_type if variant == "default" else f"{model_type}/{variant}",
            "model_type": model_type, "config": stored}
    try:
        config = cls.from_dict(dict(stored))
    except Exception as exc:
        case["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return case
    kinds = getattr(config, alias, None)
    case["layer_types"] = list(kinds) if kinds is not None else None
    traced = zoo.trace_layers(model_type, config)
    if traced is None:
        case["error"] = "the model could not be built or run from this config"
        return case
    case["layer_rotation"] = traced[1]
    return case


def main():
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    cases = []
    for model_type, variants in VARIANTS.items():
        for variant, keys in [("default", {})] + variants:
            case = run(model_type, variant, keys)
            print(case["name"], case.get("error") or case["layer_rotation"], flush=True)
            cases.append(case)
    document = {
        "generated_by": "tests/data/make_hf_layer_types_reference.py",
        "transformers_version": transformers.__version__,
        "cases": cases,
    }
    OUTPUT.write_text(json.dumps(zoo.json_safe(document), indent=1) + "\n")
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
