"""Regenerate hf_sinusoidal_reference.json: the sinusoidal tables of transformers' families.

Run by hand, never by the test suite, with transformers and torch in a scratch virtualenv:

    /tmp/hfenv/bin/python tests/data/make_hf_sinusoidal_reference.py

Each case runs one family's own code (its positional embedding module's forward, or the
function that builds its table) in float64 (torch's float32 redirected while it runs),
and stores the rows a model adds for ``length`` tokens, beside the fastpe arguments that
are meant to reproduce them (``fastpe``: keywords of ``sinusoidal_table``).
"""

import json
import math
from pathlib import Path

import torch
import transformers

# the families build their tables in float32; the truth here is computed in float64
from make_hf_zoo_reference import float64_torch
from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings
from transformers.models.kosmos2.modeling_kosmos2 import Kosmos2TextSinusoidalPositionalEmbedding
from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.musicgen.modeling_musicgen import MusicgenSinusoidalPositionalEmbedding
from transformers.models.nllb_moe.modeling_nllb_moe import NllbMoeSinusoidalPositionalEmbedding
from transformers.models.pegasus.modeling_pegasus import PegasusSinusoidalPositionalEmbedding
from transformers.models.speech_to_text.modeling_speech_to_text import (
    Speech2TextSinusoidalPositionalEmbedding,
)
from transformers.models.speecht5.modeling_speecht5 import SpeechT5SinusoidalPositionalEmbedding
from transformers.models.trocr.modeling_trocr import TrOCRSinusoidalPositionalEmbedding
from transformers.models.whisper.modeling_whisper import sinusoids
from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

OUTPUT = Path(__file__).with_name("hf_sinusoidal_reference.json")
LENGTH = 7


def ids(length, padding_idx=1):
    return torch.full((1, length), padding_idx + 3, dtype=torch.long)  # no padding tokens


def padded_module_rows(cls, dim, padding_idx=1, cache_length=0):
    """A fairseq-style module's forward on token ids (positions from padding_idx + 1)."""
    module = cls(LENGTH + cache_length + 4, dim, padding_idx)
    return module(ids(LENGTH, padding_idx), cache_length=cache_length)[0]


def distilbert_table(dim):
    """DistilBERT's (and XLM's, the same code) table, written into a given tensor."""
    table = torch.empty(LENGTH, dim)
    _create_sinusoidal_embeddings(LENGTH, dim, table)
    return table


def cases():
    fairseq = {"frequencies": "fairseq", "layout": "split"}
    out = []
    for dim in (10, 9):
        out += [
            (f"m2m100_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(M2M100SinusoidalPositionalEmbedding, d)),
            (f"m2m100_cache3_d{dim}", {**fairseq, "padding_idx": 1, "offset": 3},
             lambda d=dim: padded_module_rows(M2M100SinusoidalPositionalEmbedding, d,
                                              cache_length=3)),
            (f"nllb_moe_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(NllbMoeSinusoidalPositionalEmbedding, d)),
            (f"speech_to_text_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(Speech2TextSinusoidalPositionalEmbedding, d)),
            (f"speecht5_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(SpeechT5SinusoidalPositionalEmbedding, d)),
            (f"trocr_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(TrOCRSinusoidalPositionalEmbedding, d)),
            (f"kosmos2_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: padded_module_rows(Kosmos2TextSinusoidalPositionalEmbedding, d)),
            (f"xglm_d{dim}", {**fairseq, "padding_idx": 1},
             lambda d=dim: XGLMSinusoidalPositionalEmbedding(LENGTH + 4, d, 1)(
                 torch.arange(LENGTH)[None])[0]),
            (f"musicgen_d{dim}", {"frequencies": "fairseq", "layout": "split_cos"},
             lambda d=dim: MusicgenSinusoidalPositionalEmbedding(LENGTH, d)(
                 torch.zeros(1, 4, LENGTH, dtype=torch.long))),
            (f"marian_d{dim}", {"layout": "split"},
             lambda d=dim: MarianSinusoidalPositionalEmbedding(LENGTH, d).create_weight()),
            (f"pegasus_d{dim}", {"layout": "split"},
             lambda d=dim: PegasusSinusoidalPositionalEmbedding(LENGTH, d).create_weight()),
            (f"distilbert_xlm_d{dim}", {"layout": "interleaved"},
             lambda d=dim: distilbert_table(d)),
        ]
    out.append(("whisper_encoder_d10", fairseq, lambda: sinusoids(LENGTH, 10)))
    return out


def main():
    transformers.logging.set_verbosity_error()
    out = []
    for name, kwargs, build in cases():
        with float64_torch():
            table = build().detach().to(torch.float64)
        assert table.shape[0] == LENGTH and all(math.isfinite(v) for v in table.flatten().tolist())
        out.append({"name": name, "fastpe": kwargs, "dim": table.shape[1],
                    "table": table.tolist()})
    document = {
        "generated_by": "tests/data/make_hf_sinusoidal_reference.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "length": LENGTH,
        "cases": out,
    }
    OUTPUT.write_text(json.dumps(document, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {len(out)} cases to {OUTPUT}")


if __name__ == "__main__":
    main()
