"""Regenerate hf_legacy_rope_types_reference.json: config.json dicts whose rope type a
family's config class renames as it loads them, run by the family's own rotary module.

Run by hand, never by the test suite, with transformers and torch installed in a scratch
virtualenv outside the repository:

    /tmp/hfenv/bin/python tests/data/make_hf_legacy_rope_types_reference.py

Phi-3's checkpoints wrote LongRoPE as ``"su"`` and later as ``"yarn"``, under ``type`` or
``rope_type``; Phi3Config (and Phi4MultimodalConfig) read both as ``"longrope"`` with the
dict's short and long factors. Each case stores the dict as a config.json holds it (not
``to_dict()``, which already says "longrope"; a composite one with its sub-configs
from ``to_dict()``), the rope type the config class read, and
the rotary module's cos and sin in float64 at two sets of positions: within the
original length (short factors) and past it (long factors).
"""

import json
import sys
import warnings
from pathlib import Path

import torch

sys.modules["kernels"] = None  # as make_hf_zoo_reference: transformers' plain functions
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from make_hf_zoo_reference import float64_torch  # noqa: E402

OUTPUT = Path(__file__).with_name("hf_legacy_rope_types_reference.json")
POSITIONS = {"short": [0, 3, 17, 100], "long": [0, 3, 17, 300]}
HALF = 8  # head_dim 16


def raw_config(model_type, key, rope_type):
    return {
        "model_type": model_type, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 1, "intermediate_size": 128,
        "vocab_size": 100, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 128, "rope_theta": 10000.0,
        "rope_scaling": {key: rope_type, "short_factor": [1.0 + i / 40 for i in range(HALF)],
                         "long_factor": [2.0 + i for i in range(HALF)]},
    }


def rotary_class(model_type):
    """Imported before float64_torch, whose torch.FloatTensor the modules' annotations
    cannot take."""
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}",
                        fromlist=["*"])
    return getattr(module, {"phi3": "Phi3RotaryEmbedding",
                            "phi4_multimodal": "Phi4MultimodalRotaryEmbedding"}[model_type])


def main():
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    cases = []
    for model_type in ("phi3", "phi4_multimodal"):
        rot_cls = rotary_class(model_type)
        for key in ("type", "rope_type"):
            for rope_type in ("su", "yarn", "longrope"):
                raw = raw_config(model_type, key, rope_type)
                settings = {k: json.loads(json.dumps(v)) for k, v in raw.items()
                            if k != "model_type"}
                config = transformers.AutoConfig.for_model(model_type, **settings)
                if config.sub_configs:
                    # a composite config.json (Phi-4-multimodal) holds its sub-configs
                    # beside the legacy rope dict
                    raw = {**json.loads(json.dumps(config.to_dict())), **raw}
                    raw.pop("rope_parameters")
                case = {"name": f"{model_type}/{key}={rope_type}", "config": raw,
                        "read_as": config.rope_parameters["rope_type"]}
                with float64_torch():
                    rot = rot_cls(config=config)
                    for span, positions in POSITIONS.items():
                        cos, sin = rot(torch.zeros(1, dtype=torch.float64),
                                       torch.tensor([positions]))
                        case[span] = {"positions": positions,
                                      "cos": cos[0, :, :HALF].tolist(),
                                      "sin": sin[0, :, :HALF].tolist()}
                cases.append(case)
    OUTPUT.write_text(json.dumps({"transformers": transformers.__version__,
                                  "cases": cases}, indent=1) + "\n")
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
