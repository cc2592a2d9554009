"""DeBERTa's disentangled attention (He et al., 2021) in a patched transformers model:
DeBERTa-v2/v3, mDeBERTa and SEW-D, and DeBERTa (v1) (``disentangled_att_bias``, below).

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

DeBERTa (v1)'s method differs in what it slices and divides, not in how its logits are
gathered: a span of min(max(q_len, k_len), max_relative_positions), the middle 2 span
rows of its relative embeddings, relative positions q - k unbucketed, c2p from the
query its forward already divided, p2c from position queries it divides.

A call fastpe does not reproduce runs the stock method: relative positions other than
those of the module's settings (a caller's own; compared at every call), a query of
another length than its keys with the p2c term, a tensor that is not a CPU one, a span
(pos_ebd_size) or settings edited after patch that fastpe's add does not take. A bias
method replaced on the class after patch runs in fastpe's place, as in the stock model.
Half precision scores take the two logits' sum in float32, rounded once where the stock
code rounds each step. At patch, each module is run on a probe with both methods and
refused unless its outputs, and the tensors it keeps, agree bit for bit: what the stock
code does with the bias is then what fastpe's in-place add does.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from . import relative
from .relative import deberta_relative_positions

BIAS_ATTRIBUTE = "disentangled_attention_bias"
# DeBERTa (v1)'s: the same role, a span that follows the call's lengths, no buckets
V1_BIAS_ATTRIBUTE = "disentangled_att_bias"


def add_disentangled_bias(scores: Any, **settings: Any) -> Any:
    """fastpe.add_disentangled_bias, looked up at each call (as a patched model's
    caller sees the module: monkeypatching it reaches the model)."""
    return relative.add_disentangled_bias(scores, **settings)


class AddedBias:
    """What a patched disentangled_attention_bias returns: added to the attention scores
    (``attention_scores + rel_att``), it adds the gathered logits into them in place
    (`add`: add_disentangled_bias, run outside torch.compile's graphs)."""

    __slots__ = ("add", "c2p", "max_relative_positions", "p2c", "position_buckets")

    def __init__(self, add: Callable[..., Any], c2p: Any, p2c: Any, position_buckets: int,
                 max_relative_positions: int) -> None:
        self.add = add
        self.c2p = c2p
        self.p2c = p2c
        self.position_buckets = position_buckets
        self.max_relative_positions = max_relative_positions

    def __radd__(self, scores: Any) -> Any:
        self.add(scores, c2p=self.c2p, p2c=self.p2c, position_buckets=self.position_buckets,
                 max_relative_positions=self.max_relative_positions)
        return scores

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"fastpe.hf: this model's code reads {name!r} of its disentangled attention bias, "
            f"which fastpe.hf adds into the attention scores and nothing else; it cannot "
            f"reproduce that (call fastpe.hf.unpatch(model) to run it stock)")


def is_attention_class(cls: type) -> bool:
    """Whether `cls` is a disentangled self-attention class of transformers (it defines
    BIAS_ATTRIBUTE or V1_BIAS_ATTRIBUTE)."""
    return cls.__module__.startswith("transformers.models.") and (
        callable(getattr(cls, BIAS_ATTRIBUTE, None))
        or callable(getattr(cls, V1_BIAS_ATTRIBUTE, None)))


def bias_attribute(module: object) -> str | None:
    """The name of the bias method fastpe stands in for where `module` is a disentangled
    self-attention of transformers with relative attention and a c2p or p2c term:
    DeBERTa-v2/v3, mDeBERTa and SEW-D's (BIAS_ATTRIBUTE), DeBERTa (v1)'s
    (V1_BIAS_ATTRIBUTE); else None."""
    cls = type(module)
    if not (cls.__module__.startswith("transformers.models.")
            and bool(getattr(module, "relative_attention", False))
            and not {"c2p", "p2c"}.isdisjoint(getattr(module, "pos_att_type", None) or ())
            and all(hasattr(module, a) for a in (
                "max_relative_positions", "num_attention_heads", "transpose_for_scores"))):
        return None
    if callable(getattr(cls, BIAS_ATTRIBUTE, None)) and all(
            hasattr(module, a) for a in ("pos_ebd_size", "position_buckets", "share_att_key")):
        return BIAS_ATTRIBUTE
    if callable(getattr(cls, V1_BIAS_ATTRIBUTE, None)) and hasattr(module, "in_proj"):
        return V1_BIAS_ATTRIBUTE
    return None


@functools.lru_cache(maxsize=8)
def _positions(q_len: int, k_len: int, buckets: int, largest: int) -> Any:
    """The relative positions fastpe forms for these settings, as a torch tensor."""
    torch: Any = importlib.import_module("torch")
    return torch.from_numpy(deberta_relative_positions(
        q_len, k_len, position_buckets=buckets, max_relative_positions=largest))


def _standard(relative_pos: Any, q_len: int, k_len: int, buckets: int, largest: int) -> bool:
    """Whether relative_pos holds the relative positions of the module's settings (the
    ones fastpe forms). Compared at every call, a pass over q_len * k_len integers: an
    edit through .numpy() or .data leaves no trace in the tensor's version."""
    torch: Any = importlib.import_module("torch")
    if (relative_pos is None or relative_pos.dim() not in (2, 3, 4)
            or relative_pos.device.type != "cpu"
            or tuple(relative_pos.shape[-2:]) != (q_len, k_len)
            or relative_pos.numel() != q_len * k_len):
        return False
    try:
        ours = _positions(q_len, k_len, buckets, largest)
    except (TypeError, ValueError):
        # the module's settings, edited after patch, are none fastpe makes positions of
        # (the stock code reads the positions its caller passes, not these settings)
        return False
    held = relative_pos.reshape(q_len, k_len)
    return bool(torch.equal(held if held.dtype == torch.int64 else held.to(torch.int64), ours))


def bias_method(module: Any, eager: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """The disentangled_attention_bias that fastpe runs in `module`'s place, unbound;
    `eager` makes a function run by Python where torch.compile compiles around it."""
    cls = type(module)
    stock = getattr(cls, BIAS_ATTRIBUTE)
    torch: Any = importlib.import_module("torch")
    add = eager(add_disentangled_bias)

    def projected(self: Any, rel_embeddings: Any, proj: Any, repeats: int) -> Any:
        return self.transpose_for_scores(proj(rel_embeddings), self.num_attention_heads).repeat(
            repeats, 1, 1)

    def logits(content: Any, positions: Any, scale_factor: Any) -> Any:
        """content @ positions^T divided by the stock code's scale, in the logits' dtype"""
        out = torch.bmm(content, positions.transpose(-1, -2))
        out /= _scale(torch, positions, scale_factor).to(dtype=out.dtype)
        return out

    # named as the method it stands for: a pickled bound method is looked up by its name
    def disentangled_attention_bias(self: Any, query_layer: Any, key_layer: Any,
                                    relative_pos: Any, rel_embeddings: Any,
                                    scale_factor: Any) -> Any:
        current: Any = getattr(type(self), BIAS_ATTRIBUTE, None)
        if current is not stock:
            # the class's method replaced after patch (a fix applied at run time): the
            # stock model runs the new one, and so does this
            return current(self, query_layer, key_layer, relative_pos, rel_embeddings,
                           scale_factor)
        c2p_on, p2c_on = "c2p" in self.pos_att_type, "p2c" in self.pos_att_type
        q_len, k_len = query_layer.size(-2), key_layer.size(-2)
        span = self.pos_ebd_size
        if ((p2c_on and q_len != k_len) or query_layer.device.type != "cpu"
                or not (c2p_on or p2c_on)
                # settings edited after the module was made: fastpe's add takes ints
                # only, and its span from them, where the stock code takes pos_ebd_size
                or type(self.position_buckets) is not int
                or type(self.max_relative_positions) is not int
                or span != (self.position_buckets if self.position_buckets > 0
                            else self.max_relative_positions)
                or not _standard(relative_pos, q_len, k_len, self.position_buckets,
                                 self.max_relative_positions)):
            return stock(self, query_layer, key_layer, relative_pos, rel_embeddings,
                         scale_factor)
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
        _refuse_autograd(torch, query_layer, key_layer, c2p, p2c)
        return AddedBias(add, c2p, p2c, self.position_buckets, self.max_relative_positions)

    return disentangled_attention_bias


def v1_bias_method(module: Any, eager: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """DeBERTa (v1)'s disentangled_att_bias as fastpe runs it, unbound: a span of
    min(max(q_len, k_len), max_relative_positions), the relative embeddings' middle 2 span
    rows, relative positions q - k unbucketed; c2p from the query the forward already
    divided, p2c from position queries divided as the stock code divides them."""
    cls = type(module)
    stock = getattr(cls, V1_BIAS_ATTRIBUTE)
    torch: Any = importlib.import_module("torch")
    add = eager(add_disentangled_bias)

    # named as the method it stands for: a pickled bound method is looked up by its name
    def disentangled_att_bias(self: Any, query_layer: Any, key_layer: Any, relative_pos: Any,
                              rel_embeddings: Any, scale_factor: Any) -> Any:
        current: Any = getattr(type(self), V1_BIAS_ATTRIBUTE, None)
        if current is not stock:   # replaced after patch: run as the stock model would
            return current(self, query_layer, key_layer, relative_pos, rel_embeddings,
                           scale_factor)
        c2p_on, p2c_on = "c2p" in self.pos_att_type, "p2c" in self.pos_att_type
        q_len, k_len = query_layer.size(-2), key_layer.size(-2)
        span = min(max(q_len, k_len), self.max_relative_positions)
        if ((p2c_on and q_len != k_len) or query_layer.device.type != "cpu"
                or type(self.max_relative_positions) is not int or span < 1
                or not (c2p_on or p2c_on) or not _standard(relative_pos, q_len, k_len, -1, -1)):
            return stock(self, query_layer, key_layer, relative_pos, rel_embeddings,
                         scale_factor)
        middle = self.max_relative_positions
        rel_embeddings = rel_embeddings[middle - span:middle + span, :].unsqueeze(0)
        c2p = p2c = None
        if c2p_on:
            pos_key = self.transpose_for_scores(self.pos_proj(rel_embeddings))
            c2p = torch.matmul(query_layer, pos_key.transpose(-1, -2))
        if p2c_on:
            pos_query = self.transpose_for_scores(self.pos_q_proj(rel_embeddings))
            pos_query /= _scale(torch, pos_query, scale_factor)
            p2c = torch.matmul(key_layer, pos_query.transpose(-1, -2).to(dtype=key_layer.dtype))
        _refuse_autograd(torch, query_layer, key_layer, c2p, p2c)
        return AddedBias(add, c2p, p2c, -1, span)

    return disentangled_att_bias


def _scale(torch: Any, layer: Any, scale_factor: Any) -> Any:
    """sqrt(width * scale_factor) in float32, as both versions' code forms it (their
    scaled_size_sqrt)."""
    return torch.sqrt(torch.tensor(layer.size(-1), dtype=torch.float) * scale_factor)


def _refuse_autograd(torch: Any, *tensors: Any) -> None:
    """A TypeError for the model's user where autograd would follow any of `tensors` (the
    query, the keys, the logits: a trainable relative embedding or projection alone
    makes the logits require grad)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise TypeError("fastpe.hf: the patched model adds its disentangled attention in "
                        "place, without autograd: run it under torch.no_grad() or "
                        "torch.inference_mode() (or fastpe.hf.unpatch it to train)")


def check_bias(module: Any, attribute: str, method: Any, where: str) -> None:
    """Refuse `module` unless its own forward, run on a probe (a float32 copy of it in
    eval mode, random hidden states of 7 tokens, the relative positions of its
    settings, its attention probabilities asked for), gives the same outputs bit for bit
    with `method` as its `attribute` as with its stock method."""
    torch: Any = importlib.import_module("torch")
    if "forward" in vars(module):
        raise ValueError(f"fastpe.hf: the forward of the disentangled attention {where} was "
                         f"replaced on this instance (by accelerate's hooks, ...): fastpe.hf "
                         f"cannot tell what it does with the bias")
    # a dynamically quantized module's linear layers hold packed weights, not parameters:
    # none may be left, and the probe below decides
    devices = {str(t.device) for t in (*module.parameters(), *module.buffers())}
    if devices - {"cpu"}:
        raise ValueError(f"fastpe.hf: the disentangled attention {where} is on "
                         f"{', '.join(sorted(devices - {'cpu'}))}: fastpe adds the bias into CPU tensors "
                         f"(a model on the meta device holds no weights yet)")
    module = copy.deepcopy(module).float().eval()
    v1 = attribute == V1_BIAS_ATTRIBUTE
    hidden = (module.in_proj if v1 else module.query_proj).in_features
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(1, 7, hidden, generator=gen)
    rows = 2 * (module.max_relative_positions if v1 else module.pos_ebd_size)
    rel_embeddings = torch.randn(rows, hidden, generator=gen)
    try:
        relative_pos = torch.from_numpy(deberta_relative_positions(
            7, 7, position_buckets=-1 if v1 else module.position_buckets,
            max_relative_positions=-1 if v1 else module.max_relative_positions))[None]
    except ValueError as err:
        raise ValueError(f"fastpe.hf: the disentangled attention {where} has relative "
                         f"position settings fastpe does not reproduce: {err}") from err
    mask = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    asks = "output_attentions" in inspect.signature(type(module).forward).parameters
    extra = {"output_attentions": True} if asks else {}
    outs = []
    kept = []   # tensors the forward leaves on the module (the in-place add reaches them)
    try:
        with torch.no_grad():
            for with_fastpe in (False, True):
                if with_fastpe:
                    setattr(module, attribute, method.__get__(module))
                outs.append(type(module).forward(module, states, mask, relative_pos=relative_pos,
                                                 rel_embeddings=rel_embeddings, **extra))
                kept.append({name: value.clone() for name, value in vars(module).items()
                             if isinstance(value, torch.Tensor)})
    except Exception as err:
        raise ValueError(f"fastpe.hf: the disentangled attention {where} did not run on a "
                         f"probe with fastpe's bias ({type(err).__name__}: {err}): fastpe.hf "
                         f"does not know what its forward does") from err
    stock, patched = (out if isinstance(out, tuple) else (out,) for out in outs)
    stock += tuple(kept[0].get(name) for name in sorted(kept[0].keys() | kept[1].keys()))
    patched += tuple(kept[1].get(name) for name in sorted(kept[0].keys() | kept[1].keys()))
    if len(stock) != len(patched) or not all(
            (a is None and b is None) or (isinstance(a, torch.Tensor) and isinstance(
                b, torch.Tensor) and torch.equal(a, b)) for a, b in zip(stock, patched)):
        raise ValueError(f"fastpe.hf: the disentangled attention {where} gives other numbers "
                         f"with fastpe's bias than with its own on a probe: fastpe.hf does "
                         f"not know what its forward does")
