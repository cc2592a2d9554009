"""Regenerate hf_rope_reference.json: RoPE frequencies as Hugging Face transformers computes them.

Run by hand, never by the test suite. transformers and torch are not fastpe dependencies,
so install them in a scratch virtualenv outside the repository:

    python -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch==2.13.0 transformers numpy
    /tmp/hfenv/bin/python tests/data/make_hf_rope_reference.py

The JSON lands next to this script. For every case it stores fastpe's inputs (head width
``dim``, the ``scaling`` dict, ``max_position_embeddings``, ``seq_len``) and what
transformers returns for them: ``inv_freq`` (float32, computed by torch) and
``attention_scaling`` (a Python float). Scaled types go through
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``; plain RoPE, which transformers
5.x computes inside each model, through Phi's ``compute_default_rope_parameters`` (the one
that honours ``partial_rotary_factor``). The transformers and torch versions are recorded.
"""

import copy
import json
import math
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

OUTPUT = Path(__file__).with_name("hf_rope_reference.json")

LLAMA31 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _longrope_factors(n, top):
    """Smooth, increasing per-pair factors shaped like Phi-3's (1 for fast pairs, up to top)."""
    return [round(1.0 + (top - 1.0) * (i / (n - 1)) ** 3, 6) for i in range(n)]


def case(name, dim, scaling, max_position_embeddings, seq_len=None):
    return {
        "name": name,
        "dim": dim,
        "scaling": scaling,
        "max_position_embeddings": max_position_embeddings,
        "seq_len": seq_len,
    }


def cases():
    out = [
        case("default_d64", 64, {"rope_type": "default", "rope_theta": 10000.0}, 2048),
        case("default_d128_qwen2", 128, {"rope_type": "default", "rope_theta": 1000000.0}, 32768),
        case("default_d256_gemma", 256, {"rope_type": "default", "rope_theta": 10000.0}, 8192),
        case("default_d16", 16, {"rope_type": "default", "rope_theta": 10000.0}, 512),
        case("default_phi2_partial", 80, {"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 0.4}, 2048),
        case("default_neox20b_partial", 96, {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25}, 2048),
        case("linear_d128", 128, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 4096),
        case("linear_d64_old_type_key", 64, {"type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 2048),
        case("linear_partial", 80, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5,
                                    "partial_rotary_factor": 0.5}, 2048),
        case("llama3_llama31_8b", 128, dict(LLAMA31), 131072),
        case("llama3_llama32_1b", 64, dict(LLAMA31, factor=32.0), 131072),
        case("llama3_partial", 128, dict(LLAMA31, partial_rotary_factor=0.5), 131072),
        case("yarn_qwen25_old_type_key", 128, {"type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                               "original_max_position_embeddings": 32768}, 32768),
        case("yarn_betas_attention_factor", 128, {"rope_type": "yarn", "rope_theta": 10000.0,
                                                  "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                                                  "attention_factor": 1.25,
                                                  "original_max_position_embeddings": 4096}, 32768),
        case("yarn_gpt_oss_truncate_false", 64, {"rope_type": "yarn", "rope_theta": 150000.0,
                                                 "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                 "truncate": False,
                                                 "original_max_position_embeddings": 4096}, 131072),
        case("yarn_deepseek_v3", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                      "mscale_all_dim": 1.0,
                                      "original_max_position_embeddings": 4096}, 163840),
        case("yarn_deepseek_v2_lite", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                           "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                           "mscale_all_dim": 0.707,
                                           "original_max_position_embeddings": 4096}, 163840),
        case("yarn_mscale_ratio", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                       "mscale": 1.0, "mscale_all_dim": 0.5,
                                       "original_max_position_embeddings": 4096}, 65536),
        # DeepSeek style with max_position_embeddings / original (32) != factor (40):
        # transformers >= 4.57 uses the explicit factor everywhere.
        case("yarn_deepseek_factor_differs_from_ratio", 64,
             {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 0.707,
              "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}, 131072),
        case("yarn_factor_none_uses_ratio", 128, {"rope_type": "yarn", "rope_theta": 10000.0,
                                                  "factor": None,
                                                  "original_max_position_embeddings": 4096}, 16384),
        case("yarn_partial", 128, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "partial_rotary_factor": 0.5,
                                   "original_max_position_embeddings": 2048}, 8192),
    ]
    # proportional (Gemma 4 full attention, LFM3): the head width stays, the frequencies
    # past int(partial * dim // 2) pairs are zero.
    out += [
        case("proportional_gemma4_global", 512, {"rope_type": "proportional", "rope_theta": 1e6,
                                                 "partial_rotary_factor": 0.25}, 131072),
        case("proportional_lfm3", 128, {"rope_type": "proportional", "rope_theta": 1e6,
                                        "partial_rotary_factor": 0.5}, 128000),
        case("proportional_factor_no_partial", 64, {"rope_type": "proportional",
                                                    "rope_theta": 10000.0, "factor": 2.0}, 4096),
        case("proportional_odd_pairs", 96, {"rope_type": "proportional", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.3}, 4096),
    ]
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    for seq_len in (None, 1000, 4096, 4097, 10000, 20000):
        out.append(case(f"dynamic_d128_seq{seq_len}", 128, dict(dynamic), 4096, seq_len))
    for seq_len in (None, 3000):
        out.append(case(f"dynamic_partial_seq{seq_len}", 80,
                        dict(dynamic, factor=4.0, partial_rotary_factor=0.5), 2048, seq_len))

    phi3 = {"rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": _longrope_factors(48, 1.2), "long_factor": _longrope_factors(48, 60.0),
            "original_max_position_embeddings": 4096}
    for seq_len in (None, 100, 4096, 4097, 131072):
        out.append(case(f"longrope_phi3_seq{seq_len}", 96, copy.deepcopy(phi3), 131072, seq_len))
    explicit = dict(copy.deepcopy(phi3), factor=16.0, attention_factor=1.1)
    for seq_len in (None, 8192):
        out.append(case(f"longrope_explicit_factor_seq{seq_len}", 96, copy.deepcopy(explicit),
                        131072, seq_len))
    phi4 = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": _longrope_factors(48, 1.1), "long_factor": _longrope_factors(48, 40.0),
            "original_max_position_embeddings": 4096}
    for seq_len in (None, 5000):
        out.append(case(f"longrope_phi4_partial_seq{seq_len}", 128, copy.deepcopy(phi4), 131072, seq_len))
    return out


def hf_frequencies(c):
    heads = 4
    config = LlamaConfig(
        hidden_size=c["dim"] * heads,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=c["dim"],
        max_position_embeddings=c["max_position_embeddings"],
        rope_parameters=copy.deepcopy(c["scaling"]),
    )
    rope_type = c["scaling"].get("rope_type", c["scaling"].get("type"))
    if rope_type == "default":
        inv_freq, attention = PhiRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=c["seq_len"])
    assert inv_freq.dtype == torch.float32
    return [float(x) for x in inv_freq.tolist()], float(attention)


def main():
    transformers.logging.set_verbosity_error()
    out_cases = []
    for c in cases():
        inv_freq, attention = hf_frequencies(c)
        # Only proportional RoPE has zero frequencies (its unrotated pairs).
        positive = [x for x in inv_freq if x != 0.0] if "proportional" in c["name"] else inv_freq
        assert all(math.isfinite(x) and x > 0 for x in positive), c["name"]
        out_cases.append(dict(c, inv_freq=inv_freq, attention_scaling=attention))
    document = {
        "generated_by": "tests/data/make_hf_rope_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "note": "inv_freq is float32 as transformers computes it; attention_scaling is a Python float",
        "cases": out_cases,
    }
    OUTPUT.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(out_cases)} cases to {OUTPUT}")


if __name__ == "__main__":
    main()
