"""Regenerate hf_class_defaults_reference.json: what each checked family's config class
gives a config.json dict that leaves out the keys fastpe reads.

Run by hand, never by the test suite, with transformers installed (it imports
make_hf_zoo_reference beside it for the model types transformers knows):

    /path/to/venv/bin/python tests/data/make_hf_class_defaults_reference.py

A config.json written by save_pretrained holds every key of the family's config class,
but a dict typed by hand may leave some out, and then the class's own defaults count:
Gemma's head_dim is 256 whatever hidden_size / num_attention_heads gives, StableLM
rotates a quarter of each head, ESM uses absolute position embeddings. For each model
type in fastpe._hf_models.CHECKED with a config class, two dicts with none of those
keys (hidden sizes 192 and 320 over 4 heads: head widths 48 and 80 if derived; for
latent attention a third with qk_rope_head_dim 24, which most such classes take as
head_dim) are loaded with the class (``from_dict``, as AutoConfig loads config.json).
Each case stores the dict and what the loaded config holds: ``head_dim`` (null where it
holds none: the width is then hidden_size // num_attention_heads), the
``partial_rotary_factor`` its (flat) rope parameters or the config carry, and
``position_embedding_type``; or the class's error, where it fails on the dict.

More dicts per family (VARIANTS) give a base under ``rope_theta`` or ``rotary_emb_base``
(older config.json keys), rope parameters without a partial factor, or an older
``rope_scaling`` beside ``rope_theta``; each case also stores the base the loaded
(flat) rope parameters hold.

It prints the tables fastpe._hf_models holds (tests/test_hf_class_defaults.py derives
them from the fixture the same way, class_defaults).
"""

import copy
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from fastpe import _hf_models

OUTPUT = Path(__file__).with_name("hf_class_defaults_reference.json")
# the dicts: none of the keys (two sizes; "mla" beside them for latent attention), a
# top-level base under either older key, rope parameters without a partial factor, an
# older config.json's rope_scaling beside rope_theta (bases no class defaults to), and a
# head_dim that hidden_size / num_attention_heads does not give
VARIANTS = {
    "hidden192": {"hidden_size": 192},
    "hidden320": {"hidden_size": 320},
    "rope_theta": {"hidden_size": 192, "rope_theta": 1234.0},
    "rotary_emb_base": {"hidden_size": 192, "rotary_emb_base": 4321.0},
    "rope_parameters": {"hidden_size": 192,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 777.0}},
    "rope_scaling": {"hidden_size": 192, "rope_theta": 1234.0,
                     "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "head_dim": {"hidden_size": 192, "head_dim": 96},
    "rope_parameters_no_base": {"hidden_size": 192, "rope_parameters": {"rope_type": "default"}},
}
PLAIN = ("hidden192", "hidden320", "mla")
# keys a family's config class checks against hidden_size or the head count (its
# validators refuse the dicts above without them)
COUPLED = {
    "dots3_note_audio_encoder": lambda hidden: {"adapter_input_size": hidden},
    "gradium_phonon_tts": lambda hidden: {"flow_head_config": {"condition_dim": hidden}},
    "pocket_tts": lambda hidden: {"flow_head_config": {"condition_dim": hidden}},
    "kolibri1_1": lambda hidden: {"index_num_heads": 1},
}
DEFAULT_BASE = 10000.0  # fastpe's base where a config gives none


def loaded_values(config):
    rope = getattr(config, "rope_parameters", None)
    partial = getattr(config, "partial_rotary_factor", None)
    if partial is None and isinstance(rope, dict):
        partial = rope.get("partial_rotary_factor")
    try:
        head_dim = getattr(config, "head_dim", None)
    except Exception:  # Gemma 4: a width per layer (per_layer_config), none for the model
        head_dim = "per layer"
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    made = config.to_dict().get("per_layer_config")
    flat = isinstance(rope, dict) and rope and not any(isinstance(v, dict) for v in rope.values())
    original = getattr(config, "original_max_position_embeddings", None)
    return {"original_max_position_embeddings": original,
            "per_layer_config": bool(made),
            "per_layer_type": isinstance(rope, dict) and bool(rope) and not flat,
            "rope_parameters": json.loads(json.dumps(rope)) if flat else None,
            "head_dim": head_dim if head_dim in (None, "per layer") else int(head_dim),
            "partial_rotary_factor": None if partial is None else float(partial),
            "position_embedding_type": getattr(config, "position_embedding_type", None),
            "rope_theta": None if isinstance(theta, dict) or theta is None else float(theta)}


def class_defaults(cases):
    """The tables of fastpe._hf_models, from the cases: CLASS_DEFAULTS (per family, the
    values every dict without the keys got alike where fastpe assumes otherwise: head_dim,
    position_embedding_type, a partial factor the class applies whatever rope parameters
    a dict gives), ROPE_DEFAULTS (the flat rope parameters the class makes for a dict that
    gives none, where they are not plain RoPE at base 10000), DEFAULT_THETA (the base of
    rope parameters given without one, where not 10000), BASE_KEYS (the key a class
    reads a lone top-level base under, where not rope_theta: GPT-NeoX's rotary_emb_base,
    or none), PER_LAYER_CONFIG, HEAD_DIM_UNREAD and ROPE_SCALING_UNREAD (the classes that
    make a per_layer_config for a dict without one; that set head_dim whatever a dict
    says; that keep a rope_scaling their code never reads) and ROPE_PER_LAYER_TYPE (the
    classes that make rope parameters per layer type from a dict's flat keys)."""
    runs = {}
    for case in cases:
        if "error" not in case:
            runs.setdefault(case["model_type"], {})[case["variant"]] = case
    table, rope_defaults, default_theta, base_keys = {}, {}, {}, {}
    per_layer, own_width, unread_scaling, per_layer_type = [], [], [], []
    for model_type, found in sorted(runs.items()):
        conv = _hf_models.convention(model_type)
        plain = [found[name] for name in PLAIN if name in found]
        values = {}
        head = {c["head_dim"] for c in plain}
        if all(c["per_layer_config"] for c in plain):
            per_layer.append(model_type)  # the class makes widths per layer
        if head != {"per layer"} and len(head) == 1 and plain[0]["head_dim"] is not None and any(
                c["head_dim"] not in (c["config"]["hidden_size"] // 4,
                                      c["config"].get("qk_rope_head_dim")) for c in plain):
            values["head_dim"] = plain[0]["head_dim"]
        original = {c["original_max_position_embeddings"] for c in plain}
        if len(original) == 1 and plain[0]["original_max_position_embeddings"] is not None:
            # Phi-3's: moved into the rope parameters of llama3, yarn and longrope types
            values["original_max_position_embeddings"] = plain[0][
                "original_max_position_embeddings"]
        kind = {c["position_embedding_type"] for c in plain}
        if len(kind) == 1 and plain[0]["position_embedding_type"] not in (None, "rotary"):
            values["position_embedding_type"] = plain[0]["position_embedding_type"]
        # the families whose width comes from another key (WIDTH_KEYS) or their split
        # of the head (latent attention, DeepSeek-V4's trailing rope part) keep their own
        # rules
        partial = {c["partial_rotary_factor"] for c in plain}
        given = found.get("rope_parameters", {}).get("partial_rotary_factor")
        own_rules = (conv.width_key is not None or conv.trailing
                     or model_type in _hf_models.WIDTH_KEYS)
        if (len(partial) == 1 and plain[0]["partial_rotary_factor"] not in (None, 1.0)
                and given == plain[0]["partial_rotary_factor"] and not own_rules):
            values["partial_rotary_factor"] = given  # whatever rope parameters say
        if values:
            table[model_type] = values
        made = []
        for c in plain:
            rope = dict(sorted((c["rope_parameters"] or {}).items()))
            if (own_rules or rope.get("partial_rotary_factor") in (
                    1.0, values.get("partial_rotary_factor"))):
                rope.pop("partial_rotary_factor", None)  # their rules; CLASS_DEFAULTS
            made.append(rope)
        if all(rope and rope == made[0] for rope in made):
            rope = made[0]
            if rope != {"rope_type": "default", "rope_theta": DEFAULT_BASE}:
                rope_defaults[model_type] = rope
        theta = found.get("rope_parameters_no_base", {}).get("rope_theta")
        if theta is not None and theta != DEFAULT_BASE:
            default_theta[model_type] = theta
        base = {key: found[key]["rope_theta"] for key in ("rope_theta", "rotary_emb_base")
                if key in found and found[key]["rope_theta"] is not None}
        if base:
            read = [key for key, theta in base.items() if theta == VARIANTS[key][key]]
            if read != ["rope_theta"]:
                base_keys[model_type] = read[0] if read else None
        if found.get("head_dim", {}).get("head_dim") not in (None, "per layer", 96):
            own_width.append(model_type)  # the class sets head_dim whatever the dict says
        legacy = (found.get("rope_scaling", {}).get("rope_parameters") or {}).get("rope_type")
        if legacy is not None and legacy != "linear":
            unread_scaling.append(model_type)  # a rope_scaling field its code never reads
        if all(c["per_layer_type"] for c in plain):
            per_layer_type.append(model_type)  # rope parameters per layer type, made
    return (table, rope_defaults, default_theta, base_keys, per_layer, own_width,
            unread_scaling, per_layer_type)


def main():
    # here, not at the top: the tests import class_defaults without transformers
    sys.path.insert(0, str(Path(__file__).parent))
    import make_hf_zoo_reference as zoo
    import transformers
    from transformers import CONFIG_MAPPING

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    zoo.known_model_types()  # fills zoo.SUB_CONFIG_CLASSES
    classes = {**dict(CONFIG_MAPPING.items()), **zoo.SUB_CONFIG_CLASSES}
    cases = []
    for model_type in sorted(_hf_models.CHECKED):
        cls = classes.get(model_type)
        if cls is None:
            continue
        variants = dict(VARIANTS)
        if _hf_models.convention(model_type).width_key is not None:
            variants["mla"] = {"hidden_size": 192, "qk_rope_head_dim": 24,
                               "qk_nope_head_dim": 16}
        for name, variant in variants.items():
            given = {"model_type": model_type, **variant, "num_attention_heads": 4,
                     "num_key_value_heads": 4}
            if model_type in COUPLED:
                given.update(COUPLED[model_type](given["hidden_size"]))
            case = {"model_type": model_type, "variant": name, "config": given}
            try:
                # a copy: classes fill their defaults into the nested dicts
                case.update(loaded_values(cls.from_dict(copy.deepcopy(given))))
            except Exception as e:  # the class fails on the dict: nothing to reproduce
                case["error"] = f"{type(e).__name__}: {e}"[:200]
            cases.append(case)
    OUTPUT.write_text(json.dumps({"transformers": transformers.__version__, "cases": cases},
                                 indent=1) + "\n")
    print(class_defaults(cases))


if __name__ == "__main__":
    main()
