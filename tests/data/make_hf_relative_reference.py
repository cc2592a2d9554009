"""Regenerate hf_relative_reference.json/.npz: T5's and DeBERTa's relative positions as
transformers' own modules compute them.

Run by hand, never by the test suite, with a scratch virtualenv holding torch (CPU) and
transformers:

    /path/to/venv/bin/python tests/data/make_hf_relative_reference.py

The JSON holds, per case, the settings and the config (``to_dict``) of the model whose
module ran; the npz (compressed) holds the arrays, keyed ``<case>/<array>``:

- ``buckets/<name>``: ``T5Attention._relative_position_bucket`` (and MPNet's own
  ``relative_position_bucket``) of every distance in [-2**18, 2**18], int16;
- ``t5/<family>-<q>x<k>+<past>``: the module's ``compute_bias(q, k, past_seen_tokens)``
  with a table whose entry (bucket b, head h) is ``b + 256 h`` (so the bias holds the
  bucket of every (query, key)), as int16 (heads, q, k); and ``.../table`` + ``.../bias``:
  the same call with the module's own random table, float32;
- ``deberta_positions/<name>``: DebertaV2 ``make_log_bucket_position`` of every distance
  in [-2**18, 2**18], int32, and ``build_relative_position`` of (q_len, k_len) shapes;
- ``deberta_index/<name>``: DisentangledSelfAttention.disentangled_attention_bias run with
  torch.bmm returning logits that hold their own column (c2p: c, p2c: 4096 c), decoded
  back to the column each of its gathers took for every (query, key): int16 (2, q, k);
- ``deberta_layer/<name>``: the module with random weights in float64: its c2p and p2c
  logits divided by its scale (what fastpe is given), and the ``score`` it returns;
  DeBERTa (v1, family "deberta") cases run its ``disentangled_att_bias`` on a query
  scaled as its forward scales it, whose logits it does not divide again.
"""

import json
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.models.deberta import modeling_deberta as deberta
from transformers.models.deberta_v2 import modeling_deberta_v2 as deberta_v2
from transformers.models.mpnet import modeling_mpnet as mpnet
from transformers.models.sew_d import modeling_sew_d as sew_d
from transformers.models.t5.modeling_t5 import T5Attention

HERE = Path(__file__).parent
JSON_OUT = HERE / "hf_relative_reference.json"
NPZ_OUT = HERE / "hf_relative_reference.npz"
REACH = 1 << 18

arrays: dict[str, np.ndarray] = {}
cases: list[dict] = []

# ---- T5 buckets of every distance ------------------------------------------------------------

BUCKET_SETTINGS = [(32, 128), (64, 128), (32, 256), (128, 1024), (16, 64), (33, 77), (4, 10),
                   (2, 5), (320, 800)]
d = torch.arange(-REACH, REACH + 1)
for nb, md in BUCKET_SETTINGS:
    for bi in (True, False):
        if bi and nb < 4:
            continue
        name = f"t5-{nb}-{md}-{'bi' if bi else 'uni'}"
        got = T5Attention._relative_position_bucket(d, bidirectional=bi, num_buckets=nb,
                                                    max_distance=md)
        arrays[f"buckets/{name}"] = got.numpy().astype(np.int16)
        cases.append({"kind": "buckets", "name": name, "num_buckets": nb, "max_distance": md,
                      "bidirectional": bi, "function": "T5Attention._relative_position_bucket"})
for nb, md in [(32, 128), (64, 256)]:
    name = f"mpnet-{nb}-{md}"
    got = mpnet.MPNetEncoder.relative_position_bucket(d, num_buckets=nb, max_distance=md)
    arrays[f"buckets/{name}"] = got.numpy().astype(np.int16)
    cases.append({"kind": "buckets", "name": name, "num_buckets": nb, "max_distance": md,
                  "bidirectional": True, "function": "MPNetEncoder.relative_position_bucket"})

# ---- compute_bias of each T5-bucket family ---------------------------------------------------

T5_FAMILIES = {
    "t5": ("T5Config", "t5", "T5Attention"),
    "mt5": ("MT5Config", "mt5", "MT5Attention"),
    "umt5": ("UMT5Config", "umt5", "UMT5Attention"),
    "longt5": ("LongT5Config", "longt5", "LongT5Attention"),
    "switch_transformers": ("SwitchTransformersConfig", "switch_transformers",
                            "SwitchTransformersAttention"),
    "pop2piano": ("Pop2PianoConfig", "pop2piano", "Pop2PianoAttention"),
    "pix2struct_text_model": ("Pix2StructTextConfig", "pix2struct", "Pix2StructTextAttention"),
    # its decoder's: the encoder adds 2D layout biases (refused)
    "udop": ("UdopConfig", "udop", "UdopAttention"),
}
SHAPES = [(7, 7, 0), (1, 300, 299), (5, 300, 100), (300, 300, 0), (40, 9, 0)]


def family_module(family, decoder, seed):
    cfg_name, pkg, cls = T5_FAMILIES[family]
    mod = __import__(f"transformers.models.{pkg}.modeling_{pkg}", fromlist=[cls])
    cfg = getattr(transformers, cfg_name)(d_model=32, d_kv=8, num_heads=3,
                                          relative_attention_num_buckets=32,
                                          relative_attention_max_distance=128)
    cfg.is_decoder = decoder
    torch.manual_seed(seed)
    kwargs = {"has_relative_attention_bias": True}
    if family == "pix2struct_text_model":
        cfg = getattr(transformers, cfg_name)(hidden_size=32, d_kv=8, num_heads=3)
        cfg.is_decoder = True
    attn = getattr(mod, cls)(cfg, **kwargs).eval()
    return cfg, attn


for family in T5_FAMILIES:
    for decoder in (False, True):
        if family in ("pix2struct_text_model", "longt5", "udop") and not decoder:
            continue   # decoders only (LongT5's encoder attends locally, over blocks)
        cfg, attn = family_module(family, decoder, seed=len(cases))
        heads, nb = attn.n_heads, attn.relative_attention_num_buckets
        weight = attn.relative_attention_bias.weight
        for q, k, past in SHAPES:
            name = f"{family}-{'decoder' if decoder else 'encoder'}-{q}x{k}+{past}"
            with torch.no_grad():
                table = weight.detach().clone()
                arrays[f"t5/{name}/table"] = table.numpy()
                arrays[f"t5/{name}/bias"] = attn.compute_bias(
                    q, k, past_seen_tokens=past)[0].numpy()
                weight.copy_(torch.arange(nb)[:, None] + 256.0 * torch.arange(heads)[None])
                coded = attn.compute_bias(q, k, past_seen_tokens=past)[0]
                arrays[f"t5/{name}"] = (coded - 256 * torch.arange(heads)[:, None, None]
                                        ).numpy().astype(np.int16)
                weight.copy_(table)
            cases.append({"kind": "t5", "name": name, "family": family, "decoder": decoder,
                          "q_len": q, "k_len": k, "past_seen_tokens": past,
                          "config": cfg.to_dict()})

# MPNet: the encoder's compute_position_bias (q_len == k_len, batch of one); a table of
# 64 rows too, which its code still buckets into 32
for nb, q in ((32, 7), (32, 300), (64, 200)):
    cfg = transformers.MPNetConfig(hidden_size=32, num_attention_heads=4,
                                   intermediate_size=64, relative_attention_num_buckets=nb)
    torch.manual_seed(q)
    enc = mpnet.MPNetEncoder(cfg).eval()
    weight = enc.relative_attention_bias.weight
    name = f"mpnet-encoder-{q}x{q}+0" if nb == 32 else f"mpnet-{nb}-rows-encoder-{q}x{q}+0"
    with torch.no_grad():
        x = torch.zeros(1, q, cfg.hidden_size)
        arrays[f"t5/{name}/table"] = weight.detach().clone().numpy()
        arrays[f"t5/{name}/bias"] = enc.compute_position_bias(x)[0].numpy()
        saved = weight.detach().clone()
        weight.copy_(torch.arange(nb)[:, None] + 256.0 * torch.arange(4)[None])
        coded = enc.compute_position_bias(x)[0]
        arrays[f"t5/{name}"] = (coded - 256 * torch.arange(4)[:, None, None]
                                ).numpy().astype(np.int16)
        weight.copy_(saved)
    cases.append({"kind": "t5", "name": name, "family": "mpnet", "decoder": False, "q_len": q,
                  "k_len": q, "past_seen_tokens": 0, "config": cfg.to_dict()})

# ---- DeBERTa positions -----------------------------------------------------------------------

DEBERTA_POSITIONS = [(256, 512), (128, 512), (256, 1024), (64, 256), (8, 24), (4, 6)]
for pb, mr in DEBERTA_POSITIONS:
    name = f"log-{pb}-{mr}"
    got = deberta_v2.make_log_bucket_position(torch.arange(-REACH, REACH + 1), pb, mr)
    arrays[f"deberta_positions/{name}"] = got.to(torch.long).numpy().astype(np.int32)
    cases.append({"kind": "deberta_positions", "name": name, "position_buckets": pb,
                  "max_relative_positions": mr})
for q, k, pb, mr in [(5, 9, -1, -1), (9, 5, -1, -1), (30, 70, 8, 24), (70, 30, 256, 512)]:
    name = f"build-{q}x{k}-{pb}-{mr}"
    got = deberta_v2.build_relative_position(torch.zeros(1, q, 2), torch.zeros(1, k, 2),
                                             bucket_size=pb, max_position=mr)
    arrays[f"deberta_positions/{name}"] = got[0].numpy().astype(np.int32)
    cases.append({"kind": "deberta_build", "name": name, "q_len": q, "k_len": k,
                  "position_buckets": pb, "max_relative_positions": mr})

# ---- DeBERTa's gathers: which column each logit is read from ------------------------------------


def deberta_config(family, **kw):
    base = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                relative_attention=True, max_position_embeddings=512)
    base.update(kw)
    if family == "sew-d":
        return transformers.SEWDConfig(**base)
    return transformers.DebertaV2Config(**base)


def attention_module(family, cfg):
    mod = sew_d if family == "sew-d" else deberta_v2
    return mod.DisentangledSelfAttention(cfg).eval().double()


DEBERTA_CONFIGS = {
    # DeBERTa-v3 / mDeBERTa: 256 log buckets, span 256, shared projections
    "v3": ("deberta-v2", dict(position_buckets=256, max_relative_positions=-1,
                              share_att_key=True, pos_att_type="p2c|c2p"), 600),
    # DeBERTa-v2 (xlarge, xxlarge): the same positions, c2p and p2c
    "v2-no-buckets": ("deberta-v2", dict(position_buckets=-1, max_relative_positions=-1,
                                         max_position_embeddings=64, share_att_key=False,
                                         pos_att_type="p2c|c2p"), 150),
    "c2p-only": ("deberta-v2", dict(position_buckets=8, max_relative_positions=24,
                                    share_att_key=False, pos_att_type="c2p"), 60),
    "p2c-only": ("deberta-v2", dict(position_buckets=8, max_relative_positions=24,
                                    share_att_key=False, pos_att_type="p2c"), 60),
    "small-log": ("deberta-v2", dict(position_buckets=8, max_relative_positions=24,
                                     share_att_key=True, pos_att_type=["p2c", "c2p"]), 60),
    "sew-d": ("sew-d", dict(position_buckets=32, max_relative_positions=-1,
                            max_position_embeddings=100, share_att_key=True,
                            pos_att_type=("p2c", "c2p")), 140),
}


class ColumnLogits:
    """torch.bmm replaced, during one call, by logits that hold their own column."""

    def __init__(self, types):
        self.types = [t for t in ("c2p", "p2c") if t in types]
        self.calls = 0

    def __call__(self, a, b):
        which = self.types[self.calls]
        self.calls += 1
        shape = (a.shape[0], a.shape[1], b.shape[-1])
        cols = torch.arange(shape[-1], dtype=torch.float64).expand(shape)
        return cols * (1.0 if which == "c2p" else 4096.0)


for name, (family, kw, n) in DEBERTA_CONFIGS.items():
    cfg = deberta_config(family, **kw)
    attn = attention_module(family, cfg)
    types = attn.pos_att_type
    bh, hd = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    query = torch.zeros(bh, n, hd, dtype=torch.float64)
    rel = torch.zeros(2 * attn.pos_ebd_size, cfg.hidden_size, dtype=torch.float64)
    scale_factor = 1 + len(types)
    saved = torch.bmm
    torch.bmm = ColumnLogits(types)
    try:
        with torch.no_grad():
            score = attn.disentangled_attention_bias(query, query, None, rel, scale_factor)
    finally:
        torch.bmm = saved
    scale = float(torch.sqrt(torch.tensor(hd, dtype=torch.float) * scale_factor))
    coded = torch.round(score[0] * scale).to(torch.long)
    index = torch.stack([coded % 4096 if "c2p" in types else torch.full_like(coded, -1),
                         coded // 4096 if "p2c" in types else torch.full_like(coded, -1)])
    arrays[f"deberta_index/{name}"] = index.numpy().astype(np.int16)
    cases.append({"kind": "deberta_index", "name": name, "family": family, "length": n,
                  "span": attn.pos_ebd_size, "pos_att_type": list(types),
                  "config": cfg.to_dict()})

# ---- DeBERTa: the module's own logits and score, float64 --------------------------------------


class Recorder:
    """torch.gather recording the logits it is given."""

    def __init__(self):
        self.inputs = []
        self.gather = torch.gather

    def __call__(self, src, dim, index):
        self.inputs.append(src.detach().clone())
        return self.gather(src, dim, index)


for name in ("v3", "small-log", "c2p-only", "p2c-only", "sew-d"):
    family, kw, _ = DEBERTA_CONFIGS[name]
    cfg = deberta_config(family, **kw)
    torch.manual_seed(7)
    attn = attention_module(family, cfg)
    types = attn.pos_att_type
    heads, hd = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    batch, n = (1, 20) if attn.pos_ebd_size > 64 else (2, 40)   # the npz stays small
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(batch, n, cfg.hidden_size, generator=gen, dtype=torch.float64)
    rel = torch.randn(2 * attn.pos_ebd_size, cfg.hidden_size, generator=gen,
                      dtype=torch.float64)
    query = attn.transpose_for_scores(attn.query_proj(hidden), heads)
    key = attn.transpose_for_scores(attn.key_proj(hidden), heads)
    scale_factor = 1 + len(types)
    rec = Recorder()
    torch.gather = rec
    try:
        with torch.no_grad():
            score = attn.disentangled_attention_bias(query, key, None, rel, scale_factor)
    finally:
        torch.gather = rec.gather
    scale = torch.sqrt(torch.tensor(hd, dtype=torch.float) * scale_factor).double()
    logits = dict(zip([t for t in ("c2p", "p2c") if t in types], rec.inputs))
    for t, v in logits.items():
        arrays[f"deberta_layer/{name}/{t}"] = (v / scale).reshape(
            batch, heads, n, -1).detach().numpy()
    arrays[f"deberta_layer/{name}/score"] = score.reshape(batch, heads, n, n).detach().numpy()
    cases.append({"kind": "deberta_layer", "name": name, "family": family, "batch": batch,
                  "length": n, "span": attn.pos_ebd_size, "pos_att_type": list(types),
                  "config": cfg.to_dict()})

# DeBERTa (v1): a span of min(length, max_relative_positions), the middle rows of its
# relative embeddings; (config, batch, length)
DEBERTA_V1 = {
    "v1-span-length": (dict(max_relative_positions=-1, max_position_embeddings=48,
                            pos_att_type="c2p|p2c"), 2, 20),
    "v1-span-max": (dict(max_relative_positions=8, pos_att_type=["c2p", "p2c", "p2p"]), 2, 30),
    "v1-c2p": (dict(max_relative_positions=16, pos_att_type="c2p"), 1, 12),
}
for name, (kw, batch, n) in DEBERTA_V1.items():
    cfg = transformers.DebertaConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                     relative_attention=True, **kw)
    torch.manual_seed(7)
    attn = deberta.DisentangledSelfAttention(cfg).eval().double()
    types = attn.pos_att_type
    heads = cfg.num_attention_heads
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(batch, n, cfg.hidden_size, generator=gen, dtype=torch.float64)
    rel = torch.randn(2 * attn.max_relative_positions, cfg.hidden_size, generator=gen,
                      dtype=torch.float64)
    scale_factor = 1 + len(types)
    with torch.no_grad():
        query, key, _ = attn.transpose_for_scores(attn.in_proj(hidden)).chunk(3, dim=-1)
        query = query / deberta.scaled_size_sqrt(query, scale_factor)   # as its forward does
        relative_pos = deberta.build_relative_position(query, key)
        rec = Recorder()
        torch.gather = rec
        try:
            score = attn.disentangled_att_bias(query, key, relative_pos, rel, scale_factor)
        finally:
            torch.gather = rec.gather
    for t, v in zip([t for t in ("c2p", "p2c") if t in types], rec.inputs):
        arrays[f"deberta_layer/{name}/{t}"] = v.reshape(batch, heads, n, -1).numpy()
    arrays[f"deberta_layer/{name}/score"] = score.reshape(batch, heads, n, n).numpy()
    cases.append({"kind": "deberta_layer", "name": name, "family": "deberta", "batch": batch,
                  "length": n, "span": min(n, attn.max_relative_positions),
                  "pos_att_type": list(types), "config": cfg.to_dict()})

# DeBERTa config.json dicts typed by hand, leaving keys out: the settings the attention
# module reads from its class's loading of them (from_dict, as AutoConfig loads
# config.json), each family's class defaults included (SEW-D's relative attention, its
# pos_att_type, 256 buckets and shared key; its pos_att_type string kept whole)
DEBERTA_TYPED = {
    "bare": {},
    "relative": {"relative_attention": True},
    "sized": {"relative_attention": True, "hidden_size": 64, "num_attention_heads": 4,
              "max_position_embeddings": 600},
    "types-string": {"relative_attention": True, "hidden_size": 64, "num_attention_heads": 4,
                     "pos_att_type": "C2P|p2c"},
    "types-none": {"relative_attention": True, "pos_att_type": None, "position_buckets": 16},
}
TYPED_CLASSES = {"deberta": (transformers.DebertaConfig, deberta),
                 "deberta-v2": (transformers.DebertaV2Config, deberta_v2),
                 "sew-d": (transformers.SEWDConfig, sew_d)}
for family, (config_class, module) in TYPED_CLASSES.items():
    for variant, typed in DEBERTA_TYPED.items():
        d = {"model_type": family, **typed}
        case = {"kind": "deberta_typed", "name": f"{family}-{variant}", "family": family,
                "config": d}
        try:
            loaded = config_class.from_dict(d)
        except Exception as exc:    # the class refuses the dict (SEW-D's types as a string)
            cases.append({**case, "class_error": type(exc).__name__})
            continue
        attn = module.DisentangledSelfAttention(loaded)
        case["relative_attention"] = bool(attn.relative_attention)
        if attn.relative_attention:
            types = attn.pos_att_type
            # the scale factor as each forward counts it
            factor = (1 + len(types) if family == "deberta"
                      else 1 + ("c2p" in types) + ("p2c" in types))
            case.update(c2p="c2p" in types, p2c="p2c" in types,
                        max_relative_positions=attn.max_relative_positions,
                        head_dim=attn.attention_head_size,
                        scale=float(torch.sqrt(torch.tensor(attn.attention_head_size,
                                                            dtype=torch.float) * factor)))
            if family != "deberta":
                case.update(position_buckets=attn.position_buckets, span=attn.pos_ebd_size,
                            share_att_key=bool(attn.share_att_key))
        cases.append(case)

# q_len != k_len with p2c: what transformers does with it
cfg = deberta_config("deberta-v2", **DEBERTA_CONFIGS["small-log"][1])
attn = attention_module("deberta-v2", cfg)
outcome = {}
for q, k in [(5, 9), (1, 9)]:
    try:
        with torch.no_grad():
            got = attn.disentangled_attention_bias(
                torch.randn(2, q, 16, dtype=torch.float64),
                torch.randn(2, k, 16, dtype=torch.float64), None,
                torch.randn(2 * attn.pos_ebd_size, 32, dtype=torch.float64), 3)
        outcome[f"{q}x{k}"] = f"shape {tuple(got.shape)}"
    except RuntimeError as exc:
        outcome[f"{q}x{k}"] = f"RuntimeError: {str(exc).splitlines()[0]}"
cases.append({"kind": "deberta_unequal", "name": "p2c-q-ne-k", "outcome": outcome})

np.savez_compressed(NPZ_OUT, **arrays)
JSON_OUT.write_text(json.dumps({"generated_by": "tests/data/make_hf_relative_reference.py",
                                "transformers_version": transformers.__version__,
                                "torch_version": torch.__version__, "reach": REACH,
                                "cases": cases}, indent=1, default=str) + "\n")
print(f"{len(cases)} cases, {NPZ_OUT.stat().st_size / 1e6:.2f} MB")
