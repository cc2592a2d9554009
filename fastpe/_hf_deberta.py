"""DeBERTa-v2/v3's disentangled attention (He et al., 2021) in a patched transformers model.

The attention module's ``disentangled_attention_bias(query_layer, key_layer,
relative_pos, rel_embeddings, scale_factor)`` projects the relative embeddings, forms the
content-to-position and position-to-content logits (two batched products) and gathers
them by relative position with ``torch.gather`` (an index expanded over every head),
divides and sums them into a new tensor, which its forward adds to the attention scores.
The patched method makes the same two products, divided as the stock code divides them
(before the gather here: the same quotients), and returns an :class:`AddedBias`, which
the forward's ``attention_scores + rel_att`` turns into one in-place pass of
:func:`fastpe.add_disentangled_bias` over the scores: each gathered pair summed, then
added, as the stock code sums and adds them, so float32 scores come out bit for bit
(tested against the stock models).

A call fastpe does not reproduce runs the stock method: relative positions other than
those of the module's settings (a caller's own), a query of another length than its keys
with the p2c term, a tensor that is not a CPU one.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import numpy as np

from .relative import add_disentangled_bias, deberta_relative_positions

# set on the methods patch() makes
PATCHED_BIAS = "_fastpe_hf_bias"
BIAS_ATTRIBUTE = "disentangled_attention_bias"


class AddedBias:
    """What a patched disentangled_attention_bias returns: added to the attention scores
    (``attention_scores + rel_att``), it adds the gathered logits into them in place."""

    __slots__ = ("c2p", "max_relative_positions", "p2c", "position_buckets")

    def __init__(self, c2p: Any, p2c: Any, position_buckets: int,
                 max_relative_positions: int) -> None:
        self.c2p = c2p
        self.p2c = p2c
        self.position_buckets = position_buckets
        self.max_relative_positions = max_relative_positions

    def __radd__(self, scores: Any) -> Any:
        add_disentangled_bias(scores, c2p=self.c2p, p2c=self.p2c,
                              position_buckets=self.position_buckets,
                              max_relative_positions=self.max_relative_positions)
        return scores

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"fastpe.hf: this model's code reads {name!r} of its disentangled attention bias, "
            f"which fastpe.hf adds into the attention scores and nothing else; it cannot "
            f"reproduce that (call fastpe.hf.unpatch(model) to run it stock)")


def is_disentangled(module: object) -> bool:
    """Whether `module` is a DeBERTa-v2-style disentangled self-attention of transformers
    (DeBERTa-v2/v3, mDeBERTa, SEW-D) with relative attention on."""
    cls = type(module)
    return (cls.__module__.startswith("transformers.models.")
            and callable(getattr(cls, BIAS_ATTRIBUTE, None))
            and bool(getattr(module, "relative_attention", False))
            and all(hasattr(module, a) for a in (
                "pos_ebd_size", "position_buckets", "max_relative_positions", "pos_att_type",
                "share_att_key", "num_attention_heads", "transpose_for_scores")))


def bias_method(module: Any) -> Any:
    """The disentangled_attention_bias that fastpe runs in `module`'s place, unbound."""
    cls = type(module)
    stock = getattr(cls, BIAS_ATTRIBUTE)
    torch: Any = importlib.import_module("torch")
    # the relative positions last checked: (tensor, its version, whether they are fastpe's)
    checked: weakref.WeakKeyDictionary[Any, tuple[int, bool]] = weakref.WeakKeyDictionary()

    def standard(relative_pos: Any, q_len: int, k_len: int, buckets: int, largest: int) -> bool:
        """Whether relative_pos holds the relative positions of the module's settings (the
        ones fastpe forms), checked once per tensor and version."""
        if relative_pos is None or relative_pos.device.type != "cpu" or tuple(
                relative_pos.shape[-2:]) != (q_len, k_len) or relative_pos.numel() != q_len * k_len:
            return False
        seen = checked.get(relative_pos)
        if seen is not None and seen[0] == relative_pos._version:
            return seen[1]
        want = deberta_relative_positions(q_len, k_len, position_buckets=buckets,
                                          max_relative_positions=largest)
        held = relative_pos.detach().reshape(q_len, k_len).to(torch.int64).numpy()
        verdict = bool(np.array_equal(held, want))
        checked[relative_pos] = (relative_pos._version, verdict)
        return verdict

    def projected(self: Any, rel_embeddings: Any, proj: Any, repeats: int) -> Any:
        return self.transpose_for_scores(proj(rel_embeddings), self.num_attention_heads).repeat(
            repeats, 1, 1)

    def logits(content: Any, positions: Any, scale_factor: Any) -> Any:
        """content @ positions^T divided by sqrt(width * scale_factor), in float32 as the
        stock code forms it, then in the logits' dtype"""
        scale = torch.sqrt(torch.tensor(positions.size(-1), dtype=torch.float) * scale_factor)
        out = torch.bmm(content, positions.transpose(-1, -2))
        out /= scale.to(dtype=out.dtype)
        return out

    # named as the method it stands for: a pickled bound method is looked up by its name
    def disentangled_attention_bias(self: Any, query_layer: Any, key_layer: Any,
                                    relative_pos: Any, rel_embeddings: Any,
                                    scale_factor: Any) -> Any:
        c2p_on, p2c_on = "c2p" in self.pos_att_type, "p2c" in self.pos_att_type
        q_len, k_len = query_layer.size(-2), key_layer.size(-2)
        if relative_pos is not None and relative_pos.dim() in (2, 3, 4) and all(
                n == 1 for n in relative_pos.shape[:-2]):
            usable = standard(relative_pos, q_len, k_len, self.position_buckets,
                              self.max_relative_positions)
        else:
            usable = False
        if (not usable or (p2c_on and q_len != k_len) or query_layer.device.type != "cpu"
                or not (c2p_on or p2c_on)):
            return stock(self, query_layer, key_layer, relative_pos, rel_embeddings,
                         scale_factor)
        span = self.pos_ebd_size
        rel_embeddings = rel_embeddings[0:span * 2, :].unsqueeze(0)
        repeats = query_layer.size(0) // self.num_attention_heads
        c2p = p2c = None
        if c2p_on:
            c2p = logits(query_layer, projected(self, rel_embeddings, self.key_proj if
                                                self.share_att_key else self.pos_key_proj,
                                                repeats), scale_factor)
        if p2c_on:
            p2c = logits(key_layer, projected(self, rel_embeddings, self.query_proj if
                                              self.share_att_key else self.pos_query_proj,
                                              repeats), scale_factor)
        return AddedBias(c2p, p2c, self.position_buckets, self.max_relative_positions)

    setattr(disentangled_attention_bias, PATCHED_BIAS, True)
    return disentangled_attention_bias


def check_bias(module: Any, method: Any, where: str) -> None:
    """Refuse `module` unless its own forward, run on a probe (random hidden states of 7
    tokens, its own weights, the relative positions of its settings, in eval mode),
    gives the same output with `method` as with its stock method (within its dtype's
    rounding: float32 bit for bit)."""
    torch: Any = importlib.import_module("torch")
    weight = module.query_proj.weight
    hidden = weight.shape[1]
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(1, 7, hidden, generator=gen).to(weight.dtype)
    rel_embeddings = torch.randn(2 * module.pos_ebd_size, hidden, generator=gen).to(weight.dtype)
    try:
        relative_pos = torch.from_numpy(deberta_relative_positions(
            7, 7, position_buckets=module.position_buckets,
            max_relative_positions=module.max_relative_positions))[None]
    except ValueError as err:
        raise ValueError(f"fastpe.hf: the disentangled attention {where} has relative "
                         f"position settings fastpe does not reproduce: {err}") from err
    mask = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    training = module.training
    outs = []
    try:
        module.eval()
        with torch.no_grad():
            for patched in (False, True):
                if patched:
                    setattr(module, BIAS_ATTRIBUTE, method.__get__(module))
                try:
                    outs.append(type(module).forward(module, states, mask, relative_pos=relative_pos,
                                                     rel_embeddings=rel_embeddings)[0])
                finally:
                    vars(module).pop(BIAS_ATTRIBUTE, None)
    except Exception as err:
        raise ValueError(f"fastpe.hf: the disentangled attention {where} did not run on a "
                         f"probe with fastpe's bias ({type(err).__name__}: {err}): fastpe.hf "
                         f"does not know what its forward does") from err
    finally:
        module.train(training)
    exact = str(weight.dtype) in ("torch.float32", "torch.float64")
    if not (torch.equal(*outs) if exact else torch.allclose(*outs, rtol=2e-2, atol=2e-2)):
        raise ValueError(f"fastpe.hf: the disentangled attention {where} gives other numbers "
                         f"with fastpe's bias than with its own on a probe: fastpe.hf does "
                         f"not know what its forward does")
