"""from_hf_config on config.json dicts that leave ``head_dim`` out, against the head width
each family's config class gives them.

The fixture (tests/data/make_hf_head_dim_reference.py) loaded two or three such dicts
per checked family with its config class (hidden sizes 192 and 320 over 4 heads; latent
attention also with qk_rope_head_dim 24) and stored the ``head_dim`` the loaded config
holds: Gemma's class keeps 256 whatever the dict's sizes, Llama's derives it. fastpe's
head is that wide, or it refuses the dict.
"""

import json
from pathlib import Path

import pytest

import fastpe
from fastpe import _hf_models

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "hf_head_dim_reference.json").read_text())
CASES = [c for c in FIXTURE["cases"] if "error" not in c]


def _case_id(case):
    return "{}-{}".format(case["model_type"], "-".join(
        f"{k}{v}" for k, v in case["config"].items() if k.endswith(("size", "rope_head_dim"))))


def test_the_table_is_the_fixtures():
    widths = {}
    for case in CASES:
        widths.setdefault(case["model_type"], []).append(case)
    own = {mt: runs[0]["head_dim"] for mt, runs in widths.items()
           if len({c["head_dim"] for c in runs}) == 1 and runs[0]["head_dim"] is not None
           and any(c["head_dim"] not in (c["config"]["hidden_size"] // 4,
                                         c["config"].get("qk_rope_head_dim")) for c in runs)}
    assert _hf_models.CLASS_HEAD_DIM == own
    assert FIXTURE["transformers"].startswith(_hf_models.TRANSFORMERS_VERSION)


@pytest.mark.parametrize("case", [c for c in CASES
                                  if _hf_models.convention(c["model_type"]).width_key is None],
                         ids=_case_id)
def test_a_dict_without_head_dim_is_as_wide_as_its_class_makes_it(case):
    config = case["config"]
    want = case["head_dim"]
    if want is None:
        want = config["hidden_size"] // config["num_attention_heads"]
    try:
        rope = fastpe.RotaryEmbedding.from_hf_config(dict(config))
    except ValueError:
        return  # refused: no width to get wrong
    assert rope.feature_slice.stop == want


def test_a_gemma_dict_without_head_dim_rotates_256_features():
    rope = fastpe.RotaryEmbedding.from_hf_config(
        {"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8})
    assert (rope.head_dim, rope.rotary_dim) == (256, 256)
    # a dict that gives the key keeps it, as the class does
    rope = fastpe.RotaryEmbedding.from_hf_config(
        {"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8, "head_dim": 64})
    assert rope.head_dim == 64
