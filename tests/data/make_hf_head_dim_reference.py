"""Regenerate hf_head_dim_reference.json: the head width each checked family's config
class gives a config.json dict that omits ``head_dim``.

Run by hand, never by the test suite, with transformers installed (it imports
make_hf_zoo_reference beside it for the model types transformers knows):

    /path/to/venv/bin/python tests/data/make_hf_head_dim_reference.py

A config.json written by save_pretrained holds every key of the family's config class,
but a dict typed by hand may leave ``head_dim`` out, and then the class's own default
counts: Gemma's is 256 whatever hidden_size / num_attention_heads gives. For each model
type in fastpe._hf_models.CHECKED with a config class, two dicts without ``head_dim``
(hidden sizes 192 and 320 over 4 heads: widths 48 and 80 if derived; for latent
attention a third with qk_rope_head_dim 24, which most such classes take) are loaded with
the class (``from_dict``, as AutoConfig loads config.json); each case stores the dict
and the ``head_dim`` the loaded config holds (null where it holds none: the width is
then hidden_size // num_attention_heads for every family fastpe reads it from), or the
class's error, where it fails on the dict.
"""

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))
import make_hf_zoo_reference as zoo
import transformers
from transformers import CONFIG_MAPPING

from fastpe import _hf_models

OUTPUT = Path(__file__).with_name("hf_head_dim_reference.json")


def main():
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
            # latent attention: most classes take head_dim from the rope width
            variants.append({"hidden_size": 192, "qk_rope_head_dim": 24,
                             "qk_nope_head_dim": 16})
        for variant in variants:
            given = {"model_type": model_type, **variant, "num_attention_heads": 4,
                     "num_key_value_heads": 4}
            case = {"model_type": model_type, "config": given}
            try:
                config = cls.from_dict(dict(given))
                head_dim = getattr(config, "head_dim", None)
                case["head_dim"] = None if head_dim is None else int(head_dim)
            except Exception as e:  # the class fails on the dict: nothing to reproduce
                case["error"] = f"{type(e).__name__}: {e}"[:200]
            cases.append(case)
    OUTPUT.write_text(json.dumps({"transformers": transformers.__version__, "cases": cases},
                                 indent=1) + "\n")
    # the families whose class keeps one head_dim of its own: _hf_models.CLASS_HEAD_DIM
    widths = {}
    for case in cases:
        if "error" not in case:
            widths.setdefault(case["model_type"], []).append(case)
    print({mt: runs[0]["head_dim"] for mt, runs in sorted(widths.items())
           if len({c["head_dim"] for c in runs}) == 1 and runs[0]["head_dim"] is not None
           and any(c["head_dim"] not in (c["config"]["hidden_size"] // 4,
                                         c["config"].get("qk_rope_head_dim")) for c in runs)})


if __name__ == "__main__":
    main()
