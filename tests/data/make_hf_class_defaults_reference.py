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

It prints the table fastpe._hf_models.CLASS_DEFAULTS holds (tests/test_hf_class_defaults.py
derives it from the fixture the same way): per family, each of those keys whose value
is the same for every dict and not what fastpe assumes of a dict without it (head_dim
derived or the rope width, a partial factor of 1, rotary embeddings).
"""

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))
from fastpe import _hf_models

OUTPUT = Path(__file__).with_name("hf_class_defaults_reference.json")


def loaded_values(config):
    rope = getattr(config, "rope_parameters", None)
    partial = getattr(config, "partial_rotary_factor", None)
    if partial is None and isinstance(rope, dict):
        partial = rope.get("partial_rotary_factor")
    head_dim = getattr(config, "head_dim", None)
    return {"head_dim": None if head_dim is None else int(head_dim),
            "partial_rotary_factor": None if partial is None else float(partial),
            "position_embedding_type": getattr(config, "position_embedding_type", None)}


def class_defaults(cases):
    """The table: what every dict of a family got alike, where fastpe assumes otherwise."""
    runs = {}
    for case in cases:
        if "error" not in case:
            runs.setdefault(case["model_type"], []).append(case)
    table = {}
    for model_type, found in sorted(runs.items()):
        conv = _hf_models.convention(model_type)
        values = {}
        head = {c["head_dim"] for c in found}
        if len(head) == 1 and found[0]["head_dim"] is not None and any(
                c["head_dim"] not in (c["config"]["hidden_size"] // 4,
                                      c["config"].get("qk_rope_head_dim")) for c in found):
            values["head_dim"] = found[0]["head_dim"]
        # the families whose width comes from another key (WIDTH_KEYS) or their latent
        # attention's split keep their own rules
        partial = {c["partial_rotary_factor"] for c in found}
        if (len(partial) == 1 and found[0]["partial_rotary_factor"] not in (None, 1.0)
                and conv.width_key is None and model_type not in _hf_models.WIDTH_KEYS):
            values["partial_rotary_factor"] = found[0]["partial_rotary_factor"]
        kind = {c["position_embedding_type"] for c in found}
        if len(kind) == 1 and found[0]["position_embedding_type"] not in (None, "rotary"):
            values["position_embedding_type"] = found[0]["position_embedding_type"]
        if values:
            table[model_type] = values
    return table


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
        variants = [{"hidden_size": 192}, {"hidden_size": 320}]
        if _hf_models.convention(model_type).width_key is not None:
            variants.append({"hidden_size": 192, "qk_rope_head_dim": 24,
                             "qk_nope_head_dim": 16})
        for variant in variants:
            given = {"model_type": model_type, **variant, "num_attention_heads": 4,
                     "num_key_value_heads": 4}
            case = {"model_type": model_type, "config": given}
            try:
                case.update(loaded_values(cls.from_dict(dict(given))))
            except Exception as e:  # the class fails on the dict: nothing to reproduce
                case["error"] = f"{type(e).__name__}: {e}"[:200]
            cases.append(case)
    OUTPUT.write_text(json.dumps({"transformers": transformers.__version__, "cases": cases},
                                 indent=1) + "\n")
    print(class_defaults(cases))


if __name__ == "__main__":
    main()
