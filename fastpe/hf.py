"""transformers models whose rotary position embedding (Su et al., 2021), or DeBERTa's
disentangled relative attention (He et al., 2021), runs through fastpe.

``patch(model)`` changes one loaded model *instance*, nothing else in the process:

- each of its rotary modules (the ``*RotaryEmbedding`` modules of transformers 5,
  ``forward(x, position_ids[, layer_type])``) returns, in place of float32 cos/sin
  tables, the model's own ``position_ids`` together with the
  :class:`fastpe.RotaryEmbedding` that ``from_hf_config`` reads from that module's
  config (one per layer type where the module takes ``layer_type``: Gemma 3, 3n, 4),
  whichever layers use it: the model's own code still decides which layers apply it
  (SmolLM3's and Cohere 2's NoPE layers call no apply function);
- each module beside it (in the same text model or vision tower) whose ``forward``
  calls the modeling file's ``apply_*rotary*`` / ``apply_*rope*`` function runs its
  class's own ``forward`` code with that one global name bound to fastpe's rotation,
  in place on q and k (or on each, for the ``(x, cos, sin)`` form of Gemma 3n and 4
  and GPT-J's and CodeGen's ``(tensor, sin, cos)``): (batch, heads, seq, dim) for
  ``unsqueeze_dim=1``, (batch, seq, heads, dim) for ``unsqueeze_dim=2`` and GPT-J's
  form, (tokens, heads, dim) for the vision towers' 3-D q (and (images, patches, heads,
  dim) for Step3.5's images of one grid); DeepSeek-V2's and Llama 4's
  ``(q, k, freqs_cis)``, one complex tensor, in the layout its code broadcasts to.
  These two forms (GPT-J's and freqs_cis) are accepted once their function, run on
  probes (batch, seq and heads apart, one token, k of one head, float32 and float64,
  sin and cos of magnitudes other than one), turns adjacent pairs as fastpe does, and
  only for a rotary module whose config fastpe reads as adjacent pairs too;
- each DeBERTa (v1, v2, v3) or SEW-D disentangled self-attention runs fastpe's
  ``disentangled_attention_bias`` (v1: ``disentangled_att_bias``; fastpe._hf_deberta):
  its two logit products as the stock code makes them, gathered and added into the
  attention scores in one pass.

A dynamic NTK module keeps the frequencies of its longest call until one shorter
than the original length, as transformers' ``dynamic_rope_update`` does: the patched
module runs that update (its own code, on the call's last position) and rotates by the
frequencies it keeps. A LongRoPE module reads its length threshold from the config at
every call and keeps the long factors' frequencies its first call formed: the patched
module refuses either where it is not what ``patch`` read. So it does, at every call,
for the rest of what the stock forward reads then: the attention scaling, a dynamic NTK
module's inv_freq, a text M-RoPE module's mrope_section, Phi-3.5-MoE's rope parameters.
Mistral Large 4's module multiplies every frequency by exp(alpha), a learned parameter:
the patched one rotates by fastpe's frequencies times exp(alpha) as alpha is at each call.

The angles are ``position * inv_freq`` in float64, so at 2**20 positions the patched
model rotates exactly where the stock float32 angles are off by up to about 6e-2
radians (a float32 near 1e6 is a multiple of 1/16, and inv_freq is itself rounded).
``unpatch(model)`` deletes the instance attributes again: the class code runs, bit for
bit the stock model.

transformers' kernel hub (``use_kernel_forward_from_hub("rotary_pos_emb")``,
``use_kernelized_func``, ``kernelize``) does not serve here: with the ``kernels``
package (which transformers requires from 5.25) it turns each modeling file's apply
function into one module object shared by every model of that family (so
``kernelize`` swaps it for all of them), and hands the kernel float32 cos/sin rather
than positions. The attention-function registry runs after the rotation. Hence the
instance patch, which reads the function inside such a module object as the apply
function it stands for.

A model fastpe cannot reproduce is refused with a ValueError that says what is
missing: no rotary module (nor disentangled attention), one of a subclass defined
outside transformers (named: what a subclass changes is not known), a rotary module with
another signature or without a config,
a config that ``from_hf_config`` refuses, a rotary module whose own ``inv_freq`` or
attention scaling is not its config's, no module that applies the rotation, a module
whose ``forward`` something else already replaced. A rotary module whose owner reorders
its cos and sin before the apply function (the window attention of Qwen2.5-VL's vision
tower) is left stock, with the blocks that apply it. The rotation is in place and
has no autograd: run the patched model under ``torch.no_grad()`` or
``torch.inference_mode()`` (a tensor that requires grad is a TypeError). Nor can a
trace record it: torch.jit.trace, torch.export and make_fx of a patched model raise a
RuntimeError (torch.compile runs the patched forwards between its graphs).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import math
import re
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import numpy as np

from . import _checks, _hf_deberta, _hf_models, _hf_realrope, _rope_scaling
from ._hf_multimodal import VISION, text_mrope
from ._typing import RopeLayout
from .rope import RopeFrequencies, RotaryEmbedding, apply_rope

__all__ = ["patch", "unpatch"]

# where patch() keeps what it replaced, on the model instance
_STATE = "_fastpe_hf_patched"
# set on the forward functions patch() makes
_FASTPE_FORWARD = "_fastpe_hf_forward"
# set on the apply stand-ins that take one freqs_cis in place of (cos, sin)
_TAKES_FREQS_CIS = "_fastpe_hf_freqs_cis"
# set on the apply stand-ins whose function the probes saw turn adjacent pairs
_PROBED_ADJACENT = "_fastpe_hf_adjacent"
_APPLY_NAME = re.compile(r"apply_\w*(rotary|rope)")  # matched at the start of a name
# why a patched forward is a graph break, for torch.compile's errors
_GRAPH_BREAK = ("fastpe.hf: a patched model rotates q and k (and adds DeBERTa's bias) by a C "
                "call on the tensors' memory, which no graph can hold: compile it with "
                "fullgraph=False (the patched forwards run between the graphs), or "
                "fastpe.hf.unpatch it to compile or export one whole graph")


class _Positions:
    """What a patched rotary module returns twice, as (cos, sin): the call's
    position_ids and the embedding that rotates by them (`narrow`: the same
    embedding for a model that passes only the rotated features, q[..., :rotary_dim]).
    `patches`: where they are a vision tower's, its number of patches (the positions
    then (axes, patches) already), else None."""

    __slots__ = ("freqs", "narrow", "patches", "positions", "rope")

    def __init__(self, rope: RotaryEmbedding, narrow: RotaryEmbedding | None,
                 positions: Any, freqs: RopeFrequencies | None = None,
                 patches: int | None = None) -> None:
        self.rope = rope
        self.narrow = narrow
        self.positions = positions
        # the frequencies transformers' dynamic NTK state holds, where they are not those
        # of the call's own length (_dynamic_frequencies)
        self.freqs = freqs
        self.patches = patches

    def to(self, *args: Any, **kwargs: Any) -> _Positions:
        """Itself: DeepSeek-V2 and Llama 4 move their freqs_cis to q's device, and fastpe
        rotates CPU tensors (others are refused by the rotation)."""
        return self

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"fastpe.hf: this model's code reads {name!r} of its rotary cos/sin outside the "
            f"apply function fastpe replaces; fastpe.hf cannot reproduce it (call "
            f"fastpe.hf.unpatch(model) to run it stock)")


def _narrow(rope: RotaryEmbedding) -> RotaryEmbedding | None:
    """rope for heads of its rotary_dim features alone (Phi and StableLM slice them
    off before their apply function), or None when it rotates the whole head."""
    if rope.rotary_dim == rope.head_dim:
        return None
    narrow = copy.copy(rope)
    narrow.head_dim = rope.rotary_dim
    narrow.feature_slice = slice(0, rope.rotary_dim)
    return narrow


def _dynamic_frequencies(module: Any, x: Any, position_ids: Any, layer_type: str | None,
                         rope: RotaryEmbedding,
                         checked: dict[str, tuple[Any, int, RopeFrequencies]] | None
                         ) -> RopeFrequencies | None:
    """transformers' dynamic NTK (dynamic_rope_update) keeps the frequencies of the
    longest call since the last one shorter than the original length, not those of
    each call's own length. The module's own code updates that state here, given the
    call's last position alone (its cos and sin, of one position, are dropped); returns
    the frequencies of the length it keeps where they differ from those of the call's
    own length, else None. `checked` (None: a module whose buffer holds them rounded,
    which fastpe follows): its inv_freq buffer, what the stock module rotates by, is
    refused where it is not fastpe's (_check_grown), whenever it is another tensor, was
    written, or the length kept moved to other frequencies."""
    if rope.axes > 1 or rope._halves is not None:
        raise ValueError("fastpe.hf: dynamic NTK frequencies on more than one position "
                         "axis are not reproduced")
    if not hasattr(module, "max_seq_len_cached"):
        return None  # a module without transformers' dynamic state
    last = position_ids.amax().reshape((1,) * position_ids.ndim)
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    prefix = "" if layer_type is None else f"{layer_type}_"
    type(module).forward(module, x, last, **kwargs)
    # transformers' own fallback for a layer type without a length of its own
    kept = getattr(module, f"{prefix}max_seq_len_cached", None) if layer_type else None
    kept = int(module.max_seq_len_cached if kept is None else kept)
    original = rope._spec.original_max_position_embeddings
    assert original is not None  # set for dynamic NTK
    own_length = max(kept, original) == max(int(last) + 1, original)
    freqs = rope.frequencies(kept)
    name = f"{prefix}inv_freq"
    buffer = getattr(module, name, None)
    seen = None if checked is None else checked.get(name)
    if checked is not None and buffer is not None and not (
            _as_is(seen, buffer) and seen[2] is freqs):
        # grown from the config as it is now, or written or replaced since
        _check_grown(module, name, freqs.inv_freq, kept)
        checked[name] = (buffer, buffer._version, freqs)
    return None if own_length else freqs


def _refuse_tracing() -> None:
    """A RuntimeError where a patched forward runs inside a trace rather than on tensors:
    torch.jit.trace records the tensor operations around fastpe's C call and not the call,
    so its graph would replay the model without the rotation (other numbers, silently);
    torch.export and make_fx hand it fake tensors, which hold no memory to rotate."""
    if "torch" not in sys.modules:
        return
    how = _checks.torch_trace()
    if how is not None:
        traced = how.startswith("torch.jit.trace")
        raise RuntimeError(
            f"fastpe.hf: a patched model cannot be "
            f"{'traced by torch.jit.trace' if traced else 'exported or traced into a graph'}"
            f": it rotates q and k (and adds DeBERTa's bias) by a C call on the tensors' "
            f"memory, which a graph does not record. fastpe.hf.unpatch(model) to trace the "
            f"stock model (torch.compile runs the patched forwards between its graphs)")


def _eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, run by Python wherever torch.compile compiles around it (torch is imported: a
    model exists): its graphs cannot hold fastpe's C call on the tensors' memory, nor
    trace the NumPy reads of the module's buffers, nor an attention forward rebuilt with
    globals of its own (nor what it calls: the same error), so each call is a graph
    break; refused inside a trace (_refuse_tracing). Tagged as a forward patch() made."""

    @functools.wraps(fn)
    def untraced(*args: Any, **kwargs: Any) -> Any:
        _refuse_tracing()
        return fn(*args, **kwargs)

    eager: Callable[..., Any] = untraced
    try:
        # looked up, not imported by name: mypy runs with and without torch installed
        disable: Any = importlib.import_module("torch._dynamo").disable
        try:
            # fullgraph=True and torch.export(strict=True) raise with this reason, where
            # dynamo's own hint (remove the disable call) would point into fastpe
            eager = disable(untraced, recursive=True, reason=_GRAPH_BREAK)
        except TypeError:   # a torch whose disable takes no reason
            eager = disable(untraced, recursive=True)
    except Exception:  # a torch without dynamo compiles nothing to break around
        pass
    setattr(eager, _FASTPE_FORWARD, True)
    return eager


def _values(buffer: Any) -> np.ndarray:
    """A rotary module's frequency buffer as float64 values."""
    if buffer.is_meta:
        raise ValueError("fastpe.hf: the rotary module's frequencies are on the meta device, "
                         "which holds no values: fastpe.hf rotates real tensors (patch the "
                         "model once its weights are loaded, or unpatch it)")
    return np.asarray(buffer.detach().to("cpu").double().numpy()).reshape(-1)


def _as_is(record: tuple[Any, ...] | None, tensor: Any) -> TypeGuard[tuple[Any, ...]]:
    """Whether `record` (a tensor, its version, then anything) was made of `tensor` as
    it is now: the same object, not written since (what the checks below are kept by)."""
    return record is not None and record[0] is tensor and record[1] == tensor._version


def _check_grown(module: Any, name: str, want: np.ndarray, length: int) -> None:
    """Refuse dynamic NTK frequencies that the module holds (its `name` buffer) other
    than fastpe's for `length`: its config's factor or length edited after patch(), which
    transformers reads again at each growth, or the buffer written or replaced."""
    buffer = getattr(module, name, None)
    if buffer is None:
        return
    held = _values(buffer)
    ulp = _HALF_EPS.get(str(buffer.dtype), 0.0)
    tiny = 2.0**-24 if str(buffer.dtype) == "torch.float16" else 0.0
    if held.shape != want.shape or not np.allclose(held, want, rtol=max(ulp, 1e-6), atol=tiny):
        raise ValueError(f"fastpe.hf: the rotary module's dynamic NTK frequencies for "
                         f"{length} positions differ from those of the config fastpe.hf.patch "
                         f"read (its rope parameters or max_position_embeddings edited "
                         f"since, or its {name} written or replaced): patch the model again")


def _rope_entry(module: Any, layer_type: str | None) -> dict[str, Any] | None:
    """The module's config entry of rope parameters (its layer type's), which
    transformers' LongRoPE update and Phi-3.5-MoE's forward read at every call."""
    params = getattr(getattr(module, "config", None), "rope_parameters", None)
    entry = params if layer_type is None or not isinstance(params, dict) else params.get(
        layer_type)
    return entry if isinstance(entry, dict) else None


def _check_long_frequencies(module: Any, layer_type: str | None, rope: RotaryEmbedding,
                            where: str) -> None:
    """Refuse a LongRoPE module whose long factors' frequencies, which transformers forms
    from the config at the module's first call and keeps (long_inv_freq), are not those
    of the config fastpe read: kept from a call made before the config was edited, which
    the stock model goes on rotating by."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    kept = getattr(module, f"{prefix}long_inv_freq", None)
    original = rope._spec.original_max_position_embeddings
    if kept is None or original is None:
        return
    held = _values(kept)
    want = rope.frequencies(original + 1).inv_freq
    ulp = _HALF_EPS.get(str(kept.dtype), 0.0)
    if held.shape != want.shape or not np.allclose(held, want, rtol=max(ulp, 1e-6), atol=0):
        raise ValueError(f"fastpe.hf: the rotary module{where} keeps {prefix}long_inv_freq "
                         f"(LongRoPE's long factors' frequencies, which transformers forms "
                         f"from the config at the module's first call) other than those of "
                         f"the config fastpe.hf.patch read (edited before that call, or "
                         f"since): fastpe reads the config, so it would rotate differently")


def _longrope_state(module: Any, x: Any, position_ids: Any, layer_type: str | None,
                    rope: RotaryEmbedding, checked: dict[str, tuple[Any, int]]) -> None:
    """transformers' LongRoPE (longrope_frequency_update) reads the length past which the
    long factors apply from the config at every call, and forms their frequencies from
    the config at the module's first call, then keeps them. Refused where either is not
    what fastpe.hf.patch read (the config edited since): the threshold at every call,
    the kept frequencies whenever they are another tensor or were written (the module's
    own update, run once on the call's last position, forms them first)."""
    entry = _rope_entry(module, layer_type)
    threshold = None if entry is None else entry.get("original_max_position_embeddings")
    original = rope._spec.original_max_position_embeddings
    if threshold is not None and threshold != original:
        raise ValueError(f"fastpe.hf: the rotary module's config gives LongRoPE's "
                         f"original_max_position_embeddings {threshold!r}, fastpe.hf.patch "
                         f"read {original} (edited since): transformers reads it at every "
                         f"call, so it would switch factors at another length; patch the "
                         f"model again")
    prefix = "" if layer_type is None else f"{layer_type}_"
    if getattr(module, f"{prefix}long_inv_freq", None) is None:
        last = position_ids.amax().reshape((1,) * position_ids.ndim)
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        type(module).forward(module, x, last, **kwargs)
    kept = getattr(module, f"{prefix}long_inv_freq", None)
    key = layer_type or ""
    seen = checked.get(key)
    if kept is not None and not _as_is(seen, kept):
        _check_long_frequencies(module, layer_type, rope, "")
        checked[key] = (kept, kept._version)


def _alpha_frequencies(module: Any, base: RopeFrequencies,
                       checked: dict[str, tuple[Any, int, Any]]) -> RopeFrequencies:
    """`base` times exp(alpha), where the module holds a learned alpha (Mistral Large 4:
    its forward multiplies every frequency by exp(alpha), a parameter its checkpoint
    sets, zero at init), in float64 as fastpe forms every frequency; `base` itself where
    alpha is zero or absent. Formed again whenever alpha is another tensor or was
    written, or base other frequencies."""
    alpha = getattr(module, "alpha", None)
    if alpha is None or not hasattr(alpha, "_version"):
        return base
    seen = checked.get("alpha")
    if _as_is(seen, alpha) and seen[2][0] is base:
        kept: RopeFrequencies = seen[2][1]
        return kept
    values = _values(alpha)
    if values.shape != base.inv_freq.shape:
        raise ValueError(f"fastpe.hf: the rotary module's learned alpha has "
                         f"{values.size} values, its frequencies {base.inv_freq.size}")
    scaled = base
    if np.any(values != 0):
        inv_freq = np.ascontiguousarray(base.inv_freq * np.exp(values))
        inv_freq.setflags(write=False)
        scaled = RopeFrequencies(inv_freq, base.attention_scaling)
    checked["alpha"] = (alpha, alpha._version, (base, scaled))
    return scaled


def _check_call_state(module: Any, layer_type: str | None, rope: RotaryEmbedding,
                      sections: list[int] | None, checked: dict[str, tuple[Any, int, Any]]
                      ) -> None:
    """What a rotary module's forward reads at every call besides its config and
    frequency buffers, refused once it is not what fastpe rotates by (written since
    patch()): its attention scaling (an attribute), a text M-RoPE module's mrope_section
    (the config's own list, so an edit of the config is one of it too)."""
    _check_attention_scaling(module, layer_type, rope, "")
    held = getattr(module, "mrope_section", None)
    if sections is not None and isinstance(held, (list, tuple)) and list(held) != sections:
        raise ValueError(f"fastpe.hf: the rotary module's mrope_section is now {list(held)}, "
                         f"fastpe.hf.patch read {sections} (it or its config edited since): "
                         f"fastpe would turn pairs by other axes; patch the model again")


def _check_attention_scaling(module: Any, layer_type: str | None, rope: RotaryEmbedding,
                             where: str) -> None:
    """Refuse a rotary module whose attention scaling, which its forward multiplies cos
    and sin by at every call, is not its config's (Phi-3.5-MoE's forward multiplies by its
    mscales instead)."""
    if rope._spec.mscaled:
        return
    prefix = "" if layer_type is None else f"{layer_type}_"
    scaling = getattr(module, f"{prefix}attention_scaling", None)
    if isinstance(scaling, (int, float)) and not math.isclose(
            scaling, rope._spec.frequencies(None).attention_scaling, rel_tol=1e-6):
        raise ValueError(f"fastpe.hf: the rotary module{where} holds "
                         f"{prefix}attention_scaling {scaling!r}, its config gives "
                         f"{rope._spec.frequencies(None).attention_scaling!r}")


def _rotary_forward(ropes: dict[str | None, RotaryEmbedding], single: bool = False,
                    table: bool = False,
                    read: dict[str | None, dict[str, Any] | None] | None = None,
                    sections: list[int] | None = None,
                    vision: bool = False) -> Callable[..., Any]:
    """The forward of a patched rotary module, bound to it (a copy of the model rebinds
    it to the copy's module, whose dynamic NTK state is its own). `single`: it returns
    one object where the stock module returns one complex freqs_cis tensor (DeepSeek-V2,
    Llama 4), else the (cos, sin) pair. `table`: a module that looks its sin and cos up
    in its embed_positions (GPT-J, CodeGen), checked again whenever that buffer is
    another tensor or was written, and indexed as the stock code indexes it. `read`: per
    layer type, a copy of the config entry patch() read for a module whose forward reads
    it again at every call (Phi-3.5-MoE's), refused once it differs. `sections`: a copy of
    a text M-RoPE module's mrope_section as patch() read it (_check_call_state).
    `vision`: a vision tower's module, whose forward reads its position_ids as (patches,
    axes) (transformers' get_vision_position_ids), as many patches as axes included."""
    pairs = {t: (rope, _narrow(rope)) for t, rope in ropes.items()}
    # Phi-3.5-MoE's module (mscaled) forms its frequencies anew at each call, no state kept
    dynamic = {t for t, rope in ropes.items()
               if rope._spec.rope_type == "dynamic" and not rope._spec.mscaled}
    longrope = {t for t, rope in ropes.items()
                if rope._spec.rope_type == "longrope" and not rope._spec.mscaled}

    def forward(module: Any, x: Any, position_ids: Any,
                layer_type: str | None = None) -> _Positions | tuple[_Positions, _Positions]:
        pair = pairs.get(layer_type)
        if pair is None:
            raise ValueError(f"fastpe.hf: layer_type={layer_type!r} is not one of this rotary "
                             f"module's layer types {sorted(map(str, ropes))}")
        if read is not None and layer_type in read and (
                _rope_entry(module, layer_type) != read[layer_type]):
            raise ValueError("fastpe.hf: the rotary module's config rope_parameters were "
                             "edited after fastpe.hf.patch read them, and its forward reads "
                             "them at every call (Phi-3.5-MoE's mscales, factors and "
                             "lengths): patch the model again")
        rope = pair[0]
        kept = by_module.get(module)
        if kept is None:
            kept = by_module[module] = ({}, {}, {}, {})
        _check_call_state(module, layer_type, rope, sections, kept[3])
        rounded = _rounded(module, layer_type, rope, kept[0])
        freqs = None
        if layer_type in dynamic:
            freqs = _dynamic_frequencies(module, x, position_ids, layer_type, rope,
                                         None if rounded else kept[3])
        if table:
            position_ids = _table_positions(module, rope, position_ids, tables)
        if layer_type in longrope:
            _longrope_state(module, x, position_ids, layer_type, rope, kept[2])
        if rounded:
            freqs = _held_frequencies(module, x, position_ids, layer_type, rope, freqs, kept[1])
        if getattr(module, "alpha", None) is not None:
            base = freqs if freqs is not None else rope.frequencies(
                int(position_ids.amax()) + 1 if position_ids.numel() else None)
            scaled = _alpha_frequencies(module, base, kept[3])
            if scaled is not base:
                freqs = scaled
        patches = None
        shape = tuple(getattr(position_ids, "shape", ()))
        if vision and len(shape) == 2 and shape[1] == rope.axes:
            position_ids, patches = position_ids.T, shape[0]
        out = _Positions(rope, pair[1], position_ids, freqs, patches)
        return out if single else (out, out)

    # per module (a deepcopy of the model shares this function with the original) and
    # layer type: the buffer its frequencies were checked by, its version and whether it
    # holds them rounded; the inv_freq buffer last read, its version and frequencies;
    # LongRoPE's kept long frequencies last checked and their version; by name, the other
    # tensors last checked (a dynamic NTK inv_freq, with the frequencies it was checked
    # against; Mistral Large 4's alpha) and their versions
    by_module: weakref.WeakKeyDictionary[Any, tuple[dict[str, tuple[Any, int, bool]],
                                                    dict[str, tuple[Any, int, RopeFrequencies]],
                                                    dict[str, tuple[Any, int]],
                                                    dict[str, tuple[Any, int, Any]]]]
    by_module = weakref.WeakKeyDictionary()
    # per table module: the embed_positions tensor last checked and its version
    tables: weakref.WeakKeyDictionary[Any, tuple[Any, int]] = weakref.WeakKeyDictionary()
    return _eager(forward)


def _table_positions(module: Any, rope: RotaryEmbedding, position_ids: Any,
                     tables: weakref.WeakKeyDictionary[Any, tuple[Any, int]]) -> Any:
    """position_ids of a table module (GPT-J, CodeGen) as its table lookup reads them: a
    negative position p is row rows + p (Python's indexing), one below -rows an
    IndexError in the stock model and a ValueError here. Its table is checked again
    when it is another tensor (a cast) or was written since the last check."""
    buffer = module.embed_positions
    seen = tables.get(module)
    if not _as_is(seen, buffer):
        _check_position_table(module, rope, type(module).__name__)
        tables[module] = (buffer, buffer._version)
    rows = int(buffer.shape[0])
    if position_ids.numel() and bool((position_ids < 0).any()):
        if bool((position_ids < -rows).any()):
            raise ValueError(f"fastpe.hf: position_ids below -{rows}, which the stock "
                             f"model's table of {rows} rows cannot index either")
        position_ids = position_ids + rows * (position_ids < 0)
    return position_ids


def _checked_buffer(module: Any, layer_type: str | None, rope: RotaryEmbedding) -> tuple[str, Any]:
    """(name, buffer) of the buffer that holds a module's frequencies as its config gives
    them: original_inv_freq for dynamic NTK and LongRoPE, which swap inv_freq as calls
    grow, else inv_freq; None where it keeps none."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    if rope._spec.rope_type in ("dynamic", "longrope"):
        buffer = getattr(module, f"{prefix}original_inv_freq", None)
        if buffer is not None:
            return f"{prefix}original_inv_freq", buffer
    return f"{prefix}inv_freq", getattr(module, f"{prefix}inv_freq", None)


def _is_rounded(buffer: Any, rope: RotaryEmbedding) -> bool:
    """Whether `buffer` holds the config's frequencies rounded to half precision: its dtype
    is float16 or bfloat16 (model.half(), model.to(torch.bfloat16) round the buffers), or
    they were cast back to float32 and differ from the config's past its rounding."""
    if str(buffer.dtype) in _HALF_EPS:
        return True
    held = _values(buffer)
    want = rope._spec.frequencies(None).inv_freq
    if rope.axes > 1:
        # a text M-RoPE module may hold its spectrum in its axes' order (ERNIE-4.5-VL)
        held, want = np.sort(held), np.sort(want)
    return held.shape == want.shape and not np.allclose(held, want, rtol=1e-6, atol=0)


def _rounded(module: Any, layer_type: str | None, rope: RotaryEmbedding,
             verdicts: dict[str, tuple[Any, int, bool]]) -> bool:
    """_is_rounded of the module's checked buffer, decided again only when the buffer is
    another tensor (a cast replaces it) or was written in place."""
    buffer = _checked_buffer(module, layer_type, rope)[1]
    if buffer is None:
        return False
    key = layer_type or ""
    verdict = verdicts.get(key)
    if not _as_is(verdict, buffer):
        verdict = verdicts[key] = (buffer, buffer._version, _is_rounded(buffer, rope))
    return verdict[2]


def _held_frequencies(module: Any, x: Any, position_ids: Any, layer_type: str | None,
                      rope: RotaryEmbedding, freqs: RopeFrequencies | None,
                      held: dict[str, tuple[Any, int, RopeFrequencies]]) -> RopeFrequencies:
    """The frequencies a module that holds them rounded rotates by: its own code multiplies
    the positions by its inv_freq buffer, rounded as it is (at position 2000 a bfloat16
    frequency near 1 may be off by radians), so fastpe does too; the scaling of cos and
    sin is its config's. `freqs`: those of its dynamic NTK state, or None."""
    _refuse_held(rope, "")
    prefix = "" if layer_type is None else f"{layer_type}_"
    last = position_ids.amax().reshape((1,) * position_ids.ndim)
    if rope._spec.rope_type == "longrope":
        # its own code copies the short or long factors' frequencies into the buffer, by
        # the call's length (rounding them where the buffer is half precision)
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        type(module).forward(module, x, last, **kwargs)
    buffer = getattr(module, f"{prefix}inv_freq")
    key = layer_type or ""
    kept = held.get(key)
    if not _as_is(kept, buffer):
        scaling = (freqs or rope.frequencies(int(last) + 1)).attention_scaling
        values = np.ascontiguousarray(_values(buffer))
        values.setflags(write=False)
        kept = held[key] = (buffer, buffer._version, RopeFrequencies(values, scaling))
    return kept[2]


def _one_pairing(rope: RotaryEmbedding) -> bool:
    """Whether `rope` is one pairing on one position axis, which apply_rope gives any
    frequencies (_rotate_by)."""
    return rope.axes == 1 and rope._halves is None and rope._pair_freq is None


def _refuse_held(rope: RotaryEmbedding, where: str) -> None:
    """Refuse a module that holds its frequencies rounded where `rope` is not a rotation
    fastpe.hf can give a module's own frequencies: one pairing on one position axis,
    frequencies the module keeps (not Phi-3.5-MoE's, formed at each call)."""
    if not _one_pairing(rope):
        what = "a rotation over several position axes"
    elif rope._spec.mscaled:
        what = "Phi-3.5-MoE's mscaled LongRoPE, which forms its frequencies at each call"
    else:
        return
    raise ValueError(f"fastpe.hf: the rotary module{where} holds frequencies other than its "
                     f"config's, by which its own code rotates: rounded to half precision "
                     f"(the model was cast, which rounds its buffers, and maybe cast back), "
                     f"or written since; fastpe.hf does not reproduce that for {what}: load "
                     f"the model with from_pretrained(dtype=...), which keeps them float32, "
                     f"and leave them as they are, or run it stock")


# model types whose attention does more with cos and sin than pass them to the apply
# function, which fastpe.hf cannot see from outside: what they do
_NOT_REPRODUCED = {
    "deepseek_v4": "its attention also rotates its output back (cos, -sin) and its "
                   "compressed keys at positions of their own",
    "sam3_vit_model": "its windowed attention rotates q of (batch * windows, heads, tokens, "
                      "dim), cos and sin given as keywords; fastpe reproduces its RoPE "
                      "through RotaryEmbedding.from_hf_config and fastpe.sam3_vit_positions",
}

# the models that rotate by real-valued coordinates (fastpe._hf_realrope), unless
# _NOT_REPRODUCED says more
_REAL_COORDINATES = ("its attention code rotates q and k by real-valued coordinates, out of "
                     "fastpe.hf.patch's reach; fastpe reproduces its RoPE through "
                     "RotaryEmbedding.from_hf_config(model.config) and the positions the "
                     "README's 'RoPE on real coordinates' names, called from one's own "
                     "attention code")

# parameters an apply function may have after (q, k, cos, sin) or (x, cos, sin)
_EXTRA_PARAMS = {"unsqueeze_dim", "position_ids"}


def _hub_function(value: Any) -> Any:
    """The modeling file's own function behind a kernel-hub wrapper, else `value`: with
    the `kernels` package (a dependency of transformers from 5.25),
    ``use_kernel_forward_from_hub`` turns an apply function into an ``nn.Module`` instance
    whose ``forward(*args, **kwargs)`` calls that function (or the kernel that
    ``kernelize`` swapped in); the function is the one Python function its class's
    ``forward`` closes over."""
    if getattr(value, "kernel_layer_name", None) is None:
        return value
    functions = []
    for cell in getattr(getattr(type(value), "forward", None), "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, types.FunctionType):
            functions.append(content)
    return functions[0] if len(functions) == 1 else value


def _refuse_grad(q: Any, k: Any) -> None:
    """A TypeError, saying how to run the model, where q or k would carry a gradient."""
    if getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False):
        if sys.modules["torch"].is_grad_enabled():
            raise TypeError("fastpe.hf: the patched model rotates q and k in place, without "
                            "autograd: run it under torch.no_grad() or "
                            "torch.inference_mode() (or fastpe.hf.unpatch it to train)")


def _rotate(rope: RotaryEmbedding, freqs: RopeFrequencies | None, q: Any, k: Any,
            positions: Any, layout: RopeLayout) -> None:
    """q and k in place by the patched module's embedding, or by the frequencies its
    dynamic NTK state holds. Negative position_ids (left padding written as
    attention_mask.cumsum(-1) - 1), which fastpe refuses, rotate by negative angles as
    the model's own code does: by those frequencies at real-valued positions."""
    _refuse_grad(q, k)
    try:
        if freqs is None:
            rope(q, k, positions, layout=layout)
        else:
            _rotate_by(rope, freqs, q, k, positions, layout)
        return
    except ValueError:
        # refused before anything was written; other refusals are raised as they are
        if not (hasattr(positions, "is_floating_point") and not positions.is_floating_point()
                and positions.numel() and bool((positions < 0).any())):
            raise
    if not _one_pairing(rope):
        raise ValueError("fastpe.hf: position_ids holds negative positions (left padding "
                         "written as attention_mask.cumsum(-1) - 1?), which fastpe.hf "
                         "rotates on one position axis only: give the padded tokens any "
                         "position >= 0 (they are masked)") from None
    if freqs is None:
        # transformers picks them by max(position_ids) + 1 (dynamic NTK, LongRoPE)
        freqs = rope.frequencies(int(positions.amax()) + 1)
    _rotate_by(rope, freqs, q, k, positions.double(), layout)


def _rotate_q_last(rope: RotaryEmbedding, freqs: RopeFrequencies | None, q: Any, k: Any,
                   positions: Any, q_len: int, layout: RopeLayout) -> None:
    """_rotate of a query shorter than its keys, by the keys' last q_len positions, and
    of the keys, in two calls that write nothing unless both succeed: what a single
    call checks of q and k together (each writable, apart in memory) checked first, q
    rotated in a copy until k is."""
    _refuse_grad(q, k)
    _checks.writable_array(_checks.tensor_view(q, "q", writable=True), "q")
    k_view = _checks.tensor_view(k, "k", writable=True)
    _checks.writable_array(k_view, "k")
    _checks.disjoint(k_view, "k", (q, "q"))
    rotated = q.clone()
    _rotate(rope, freqs, rotated, None, positions[..., -q_len:] if q_len else positions[..., :0],
            layout)
    try:
        _rotate(rope, freqs, k, None, positions, layout)
    except (TypeError, ValueError) as exc:
        # rotated alone, k was the call's q
        raise type(exc)(re.sub(r"\bq\b", "k", str(exc))) from None
    q.copy_(rotated)


def _rotate_by(rope: RotaryEmbedding, freqs: RopeFrequencies, q: Any, k: Any,
               positions: Any, layout: RopeLayout) -> None:
    """_rotate by these frequencies."""
    width = getattr(q, "shape", (0,))[-1]
    apply_rope(q, k, positions, freqs=freqs, layout=layout,
               style="neox" if rope.style == "neox" else "gptj",
               rotary_dim=None if width == rope.rotary_dim else rope.rotary_dim,
               inverse=bool(rope.reverse))


def _q_takes_last_positions(original: Callable[..., Any]) -> bool:
    """Whether the apply function rotates a query shorter than its keys by the keys'
    last positions (MuseGlimmer's drafter, whose keys hold the main model's context
    before its own tokens), found by running it: a query of one token beside keys of
    two, the first position's rotation the identity, the second's a quarter turn."""
    # imported by name: fastpe's own type checks run without torch installed
    torch: Any = importlib.import_module("torch")
    q, k = torch.tensor([[[[1.0, 2.0]]]]), torch.ones(1, 1, 2, 2)
    cos, sin = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]]), torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])
    try:
        rotated = original(q.clone(), k, cos, sin)[0]
    except Exception:    # a query of another length than cos: the usual apply function
        return False
    return bool(getattr(rotated, "shape", None) == q.shape
                and torch.equal(rotated, torch.tensor([[[[-2.0, 1.0]]]])))


# probes of an apply function's form, as (batch, seq, heads) of q, heads of k and dtype:
# batch, seq and heads apart; one token of one sequence and of several (decode steps);
# seq == heads; k of one head (DeepSeek-V2's shared rotary key); float32 and float64
_PROBES = ((2, 3, 5, 5, "float64"), (1, 1, 4, 1, "float32"), (3, 1, 3, 2, "float64"),
           (2, 4, 4, 2, "float64"), (3, 2, 1, 1, "float32"))


def _pairs_turned(x: Any, c: Any, s: Any) -> Any:
    """x (..., 2 n) with each adjacent pair (e, o) turned by (c, s) of (..., n): (e c - o s,
    o c + e s), whatever c and s are (the probes give them magnitudes other than one)."""
    torch: Any = importlib.import_module("torch")
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)


def _probe_inputs(batch: int, seq: int, heads: int, dtype: str,
                  seed: int = 0) -> tuple[Any, Any, Any]:
    """A probe's x (batch, seq, heads, 8) and c, s (batch, seq, 4): distinct values, and
    (c, s) of a magnitude and an angle of its own for each token and pair."""
    torch: Any = importlib.import_module("torch")
    kind = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed * 1000 + batch * 100 + seq * 10 + heads)
    x = torch.randn(batch, seq, heads, 8, generator=gen, dtype=torch.float64)
    angle = torch.rand(batch, seq, 4, generator=gen, dtype=torch.float64) * 6 - 3
    size = torch.rand(batch, seq, 4, generator=gen, dtype=torch.float64) + 0.5
    return x.to(kind), (size * torch.cos(angle)).to(kind), (size * torch.sin(angle)).to(kind)


def _close(got: Any, want: Any) -> bool:
    """got is want to float32 rounding (DeepSeek-V2 and Llama 4 turn float64 in float32;
    a function that rotates otherwise is off by the values themselves)."""
    torch: Any = importlib.import_module("torch")
    if getattr(got, "shape", None) != want.shape or not isinstance(got, torch.Tensor):
        return False
    return bool(torch.allclose(got.to(torch.float64), want.to(torch.float64), rtol=1e-5,
                               atol=1e-5))


def _turns_adjacent_pairs(original: Callable[..., Any]) -> bool:
    """Whether the apply function `original(x, sin, cos)` is GPT-J's (and CodeGen's): x
    of (batch, seq, heads, dim), sin and cos of (batch, seq, dim / 2), each pair of
    adjacent features turned by them. Found by running it on the probes."""
    for batch, seq, heads, _, dtype in _PROBES:
        x, c, s = _probe_inputs(batch, seq, heads, dtype)
        want = _pairs_turned(x, c[:, :, None], s[:, :, None])
        try:
            rotated = original(x.clone(), s.clone(), c.clone())
        except Exception:
            return False
        if not _close(rotated, want):
            return False
    return True


def _complex_layout(original: Callable[..., Any]) -> RopeLayout | None:
    """The layout of q and k for which the apply function `original(q, k, freqs_cis)`
    turns each pair of adjacent features by a complex freqs_cis of (batch, seq, dim / 2)
    (DeepSeek-V2's (batch, heads, seq, dim), Llama 4's (batch, seq, heads, dim)), found by
    running it on the probes in each layout; None if neither."""
    torch: Any = importlib.import_module("torch")
    for layout in ("bhsd", "bshd"):
        for batch, seq, q_heads, k_heads, dtype in _PROBES:
            q, c, s = _probe_inputs(batch, seq, q_heads, dtype)
            k = _probe_inputs(batch, seq, k_heads, dtype, seed=1)[0]
            freqs_cis = torch.complex(c.float(), s.float()) if dtype == "float32" else \
                torch.complex(c, s)
            if layout == "bhsd":
                q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
            cs = (c[:, None], s[:, None]) if layout == "bhsd" else (c[:, :, None], s[:, :, None])
            want = _pairs_turned(q, *cs), _pairs_turned(k, *cs)
            try:
                rotated = original(q.clone(), k.clone(), freqs_cis.clone())
            except Exception:
                break
            if not (isinstance(rotated, tuple) and len(rotated) == 2
                    and _close(rotated[0], want[0]) and _close(rotated[1], want[1])):
                break
        else:
            return layout
    return None


def _apply_function(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """fastpe's stand-in for the modeling file's apply function `original`, called as
    the model calls it, (q, k, cos, sin, ...) -> (q, k) or (x, cos, sin, ...) -> x
    (GPT-J's and CodeGen's (x, sin, cos), once _turns_adjacent_pairs has seen what it
    does), rotating in place."""
    original = _hub_function(original)
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params]
    tensors = names.index("cos") if "cos" in names else -1
    # (q, k, freqs_cis): one complex tensor, q and k in the layout its code broadcasts to
    by_complex: RopeLayout | None = None
    if len(names) == 3 and names[2] == "freqs_cis":
        by_complex = _complex_layout(original)
        if by_complex is None:
            raise ValueError(f"fastpe.hf: the apply function {name}({', '.join(names)}) of "
                             f"{getattr(original, '__module__', '?')} does not turn adjacent "
                             f"pairs of q and k by a complex freqs_cis of (batch, seq, dim / 2) "
                             f"as DeepSeek-V2's and Llama 4's do: fastpe.hf does not know what "
                             f"it does")
        tensors = 2
    # (x, sin, cos): sin first, no other parameter, and the rotation GPT-J's code makes
    sin_first = len(names) == 3 and names[1:] == ["sin", "cos"]
    if sin_first:
        tensors = 1
        if not _turns_adjacent_pairs(original):
            raise ValueError(f"fastpe.hf: the apply function {name}({', '.join(names)}) of "
                             f"{getattr(original, '__module__', '?')} does not rotate as "
                             f"GPT-J's does: fastpe.hf does not know what it does")
    extra = {p.name for p in params[tensors + 2:] if p.kind is not p.VAR_KEYWORD}
    if not sin_first and by_complex is None and (
            tensors not in (1, 2) or names[tensors + 1:tensors + 2] != ["sin"]
            or extra - _EXTRA_PARAMS):
        raise ValueError(f"fastpe.hf: the apply function {name}({', '.join(names)}) of "
                         f"{getattr(original, '__module__', '?')} does not take (q, k, cos, sin"
                         f"[, unsqueeze_dim]), GPT-J's (x, sin, cos) or (q, k, freqs_cis): "
                         f"fastpe.hf does not know what it does")
    where = {p.name: (i - tensors - 2, p.default) for i, p in enumerate(params)
             if p.name in _EXTRA_PARAMS}
    layouts: dict[object, RopeLayout] = {1: "bhsd", 2: "bshd"}
    q_last = tensors == 2 and by_complex is None and _q_takes_last_positions(original)

    def argument(key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        i, default = where[key]
        return args[i] if len(args) > i else kwargs.get(key, default)

    def apply(*args: Any, **kwargs: Any) -> Any:
        q, k = args[0], args[1] if tensors == 2 else None
        given = q, k  # rotated in place, through the views below where q is one sequence
        if by_complex is None and len(args) < tensors + 2:
            raise ValueError(f"fastpe.hf: {name} was called with cos and sin as keywords, "
                             f"which fastpe.hf does not read (it cannot tell their layout): "
                             f"run this model stock (fastpe.hf.unpatch)")
        if by_complex is None:
            cos, sin, rest = args[tensors], args[tensors + 1], args[tensors + 2:]
        else:
            cos = sin = args[2] if len(args) > 2 else kwargs.get("freqs_cis")
            rest = ()
        if type(cos) is not _Positions or sin is not cos:
            raise TypeError(f"fastpe.hf: {name} was given cos/sin tensors, not the positions "
                            f"of a patched rotary module: this module's rotary embedding does "
                            f"not come from a module fastpe.hf patched")
        if "position_ids" in where and argument("position_ids", rest, kwargs) is not None:
            raise ValueError(f"fastpe.hf: {name} was given position_ids of its own, which "
                             f"fastpe.hf does not reproduce")
        layout: RopeLayout | None
        if "unsqueeze_dim" in where:
            dim = argument("unsqueeze_dim", rest, kwargs)
            layout = layouts.get(dim)
            if layout is None:
                raise ValueError(f"fastpe.hf: {name} with unsqueeze_dim={dim!r}: q must be "
                                 f"(batch, heads, seq, dim) (1) or (batch, seq, heads, dim) (2)")
        elif sin_first:
            layout = "bshd"
        elif by_complex is not None:
            layout = by_complex
        elif getattr(q, "ndim", None) == 3:
            layout = "shd"
        elif _one_sequence(q) and (k is None or _one_sequence(k)):
            # Kimi-K2.5's tower: (1, tokens, heads, dim), the cos rows broadcast over the
            # heads as over a 3-D q's
            q, k = q[0], None if k is None else k[0]
            layout = "shd"
        elif _images_of_patches(q, k, cos.patches):
            # Step3.5's tower: (images, patches, heads, dim), images of one grid, the cos
            # rows of its patches broadcast over the images
            layout = "bshd"
        else:
            raise ValueError(f"fastpe.hf: {name} takes no unsqueeze_dim and q has shape "
                             f"{tuple(getattr(q, 'shape', ()))}: fastpe.hf reads only "
                             f"(tokens, heads, dim) or (1, tokens, heads, dim) q without it, "
                             f"or a vision tower's (images, patches, heads, dim) beside the "
                             f"positions of one image's patches")
        rope, positions = cos.rope, cos.positions
        if cos.narrow is not None and getattr(q, "shape", (0,))[-1] == cos.narrow.head_dim:
            rope = cos.narrow
        if cos.patches is not None:
            if layout == "bshd":
                positions = positions[:, None]   # (axes, 1, patches): every image's
        elif layout == "shd" and rope.axes > 1:
            positions = _axis_first(positions, rope.axes, name)
        if q_last and k is not None:
            axis = {"bhsd": 2, "bshd": 1, "shd": 0}[layout]
            q_len = q.shape[axis]
            if q_len != k.shape[axis]:
                # its query holds the last q_len of the keys' positions: two rotations,
                # q's first in a copy, so that a k the second refuses leaves q as it was
                _rotate_q_last(rope, cos.freqs, q, k, positions, q_len, layout)
                return given
        _rotate(rope, cos.freqs, q, k, positions, layout)
        return given if tensors == 2 else given[0]

    stand_in = _eager(apply)
    setattr(stand_in, _TAKES_FREQS_CIS, by_complex is not None)
    setattr(stand_in, _PROBED_ADJACENT, sin_first or by_complex is not None)
    return stand_in


def _one_sequence(x: Any) -> bool:
    shape = tuple(getattr(x, "shape", ()))
    return len(shape) == 4 and shape[0] == 1


def _images_of_patches(q: Any, k: Any, patches: int | None) -> bool:
    """Whether q (and k) are (images, patches, heads, dim) beside a vision tower's
    positions of `patches` patches (None: not a tower's)."""
    shapes = [tuple(getattr(x, "shape", ())) for x in (q, k) if x is not None]
    return patches is not None and all(len(s) == 4 and s[1] == patches for s in shapes)


def _axis_first(positions: Any, axes: int, name: str) -> Any:
    """A vision tower's (tokens, axes) position_ids (transformers' get_vision_position_ids)
    as fastpe's (axes, tokens)."""
    shape = tuple(getattr(positions, "shape", ()))
    if len(shape) != 2 or shape[1] != axes:
        return positions
    if shape[0] == axes:
        raise ValueError(f"fastpe.hf: {name} got position_ids of shape {shape}: {axes} tokens "
                         f"of {axes} axes, or the other way round; fastpe.hf cannot tell which")
    return positions.T


def _wrapped_chain(fn: Callable[..., Any]) -> list[Any]:
    """fn and the functions its functools.wraps decorators wrap, outermost first."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


def _copy_function(fn: Any, globals_: dict[str, Any], closure: Any) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


def _rebound_forward(cls: Any, names: dict[str, Any]) -> Callable[..., Any]:
    """cls.forward with the global `names` rebound, its decorators rebuilt around
    it: the class's own code, run with fastpe's apply function, and no module's
    globals changed. Its other globals follow the module's: a function of the module
    replaced after patch (another library's patcher) is what the next call runs, as it
    is for the stock model."""
    chain = _wrapped_chain(cls.forward)
    inner = chain[-1]
    if not isinstance(inner, types.FunctionType):
        raise ValueError(f"fastpe.hf: {cls.__name__}.forward is not a Python function")
    live = inner.__globals__
    rebound = {**live, **names}
    followed = tuple(n for n in _global_names(inner.__code__) if n in live and n not in names)
    new = _copy_function(inner, rebound, inner.__closure__)
    for wrapper, old in zip(reversed(chain[:-1]), reversed(chain[1:])):
        cells = wrapper.__closure__ or ()
        hits = [i for i, c in enumerate(cells) if _cell_holds(c, old)]
        if not isinstance(wrapper, types.FunctionType) or len(hits) != 1:
            raise ValueError(f"fastpe.hf: cannot rebuild the decorator "
                             f"{getattr(wrapper, '__qualname__', wrapper)!r} of "
                             f"{cls.__name__}.forward around fastpe's rotation")
        cells = tuple(types.CellType(new) if i == hits[0] else c for i, c in enumerate(cells))
        wrapped = new
        new = _copy_function(wrapper, wrapper.__globals__, cells)
        new.__wrapped__ = wrapped  # type: ignore[attr-defined]
    outer = new

    @functools.wraps(outer)
    def following(*args: Any, **kwargs: Any) -> Any:
        for name in followed:
            value = live.get(name, rebound)   # rebound: the name was deleted
            if rebound.get(name, rebound) is not value:
                if value is rebound:
                    del rebound[name]
                else:
                    rebound[name] = value
        return outer(*args, **kwargs)

    return following


def _global_names(code: types.CodeType) -> set[str]:
    """The names code (and the code nested in it: comprehensions, lambdas) may read
    as globals."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _global_names(const)
    return found


def _cell_holds(cell: Any, value: object) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _own_forward(cls: Any) -> Any:
    """The function cls.forward runs under its decorators' wrappers: its own code."""
    return _wrapped_chain(cls.forward)[-1]


def _apply_names(cls: Any) -> dict[str, Any]:
    """The global apply functions that cls.forward's own code calls, by name."""
    inner = _own_forward(cls)
    code = getattr(inner, "__code__", None)
    if code is None:
        return {}
    found = {}
    for name in code.co_names:
        value = inner.__globals__.get(name)
        if _APPLY_NAME.match(name) and callable(value):
            found[name] = value
    return found


# what a rotary module's owner may call on its cos and sin before the apply function sees
# them: Qwen2.5-VL's, Qwen2.5-Omni's and EXAONE 4.5's vision towers put them in window
# order. fastpe.hf leaves such a rotary module, and the blocks that apply it, stock.
_REORDERING_CALLS = {"permute_input_for_window_attn"}
# Rotary modules (by their config's model type) whose model uses cos and sin otherwise than
# through the apply function alone, so that fastpe.hf cannot give them positions: left
# stock, as the towers above, with the blocks that apply them
_LEFT_STOCK = {
    "pixtral": "its cos and sin are looked up by flat patch ids over the largest image's grid",
    "mlcd_vision_model": "its vision model prepends the class token's cos and sin itself",
    "gemma4_vision": "its apply function takes the patches' position_ids itself",
    "llama4_vision_model": "its rotary module makes the patch grid's freqs_cis from the "
                           "hidden states alone, not from position_ids",
    "qwen4_exp_text": "its attention and indexer slice cos and sin (the last tokens', pooled "
                      "keys') before applying them",
}


def _reorders_cos_sin(modules: dict[str, Any], name: str) -> bool:
    """Whether the module holding the rotary module `name` reorders its cos and sin."""
    owner = modules.get(name.rpartition(".")[0]) if name else None
    code = getattr(_own_forward(type(owner)), "__code__", None) if owner is not None else None
    return code is not None and not _REORDERING_CALLS.isdisjoint(code.co_names)


def _is_rotary_class(cls: type) -> bool:
    return cls.__name__.endswith("RotaryEmbedding") and cls.__module__.startswith(
        "transformers.models.")


def _subclass_outside_transformers(modules: dict[str, Any]) -> tuple[str, type, type] | None:
    """The first module whose class, defined outside transformers, derives from one of
    transformers' rotary embeddings or disentangled attentions: (its name, its class, that
    base class); else None."""
    for name, module in modules.items():
        cls = type(module)
        if cls.__module__.startswith("transformers."):
            continue
        for base in cls.__mro__[1:]:
            if _is_rotary_class(base) or _hf_deberta.is_attention_class(base):
                return name, cls, base
    return None


def _transformers_code(fn: Any) -> bool:
    """Whether fn is a function of a transformers module, run in that module's globals."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    return (module is not None and module.__name__.startswith("transformers.")
            and getattr(fn, "__globals__", None) is vars(module))


def _refuse_outside_appliers(modules: dict[str, Any]) -> None:
    """Refuse a module whose forward, defined outside transformers, calls an apply
    function (whose form fastpe cannot tell from its name) or replaces the forward of a
    transformers class that calls one (which then runs stock, on what fastpe's rotary
    module returns): fastpe.hf rebinds transformers' own forwards only."""
    for name, module in modules.items():
        cls = type(module)
        if _transformers_code(_own_forward(cls)):
            continue
        calls = sorted(_apply_names(cls))
        base = next((b for b in cls.__mro__[1:] if b.__module__.startswith("transformers.")
                     and "forward" in vars(b) and _apply_names(b)), None)
        if calls:
            what = f"whose forward calls {calls[0]} itself"
        elif base is not None:
            what = (f"whose forward replaces that of transformers' {base.__name__}, which "
                    f"calls an apply function")
        else:
            continue
        raise ValueError(f"fastpe.hf: {name!r} is a {cls.__name__} ({cls.__module__}), "
                         f"a class defined outside transformers {what}: fastpe.hf patches "
                         f"transformers' own classes only, as it cannot tell what such a "
                         f"forward does with cos and sin")


def _transformers_type(model_type: object) -> bool:
    """Whether model_type is one of transformers' (checked by fastpe, or known to the
    transformers imported)."""
    return isinstance(model_type, str) and (
        model_type in _hf_models.KNOWN
        or _rope_scaling.installed_transformers_knows(model_type) is not None)


def _config(modules: dict[str, Any], name: str) -> Any:
    """The config of the rotary module `name`: its own, else its nearest owner's
    (GPT-J's keeps none)."""
    while True:
        config = getattr(modules[name], "config", None)
        if config is not None or not name:
            return config
        name = name.rpartition(".")[0]


def _ropes(module: Any, config: Any) -> dict[str | None, RotaryEmbedding]:
    """The fastpe embeddings of one rotary module, by the layer_type its forward takes:
    what the module computes, whichever layers apply it. The model's own code still
    decides that (SmolLM3's NoPE layers skip the apply function; Granite SWA feeds each
    layer the module of its own base), so a layer that uses no RoPE is not rotated."""
    cls = type(module)
    where = f"{cls.__name__} ({cls.__module__})"
    params = list(inspect.signature(cls.forward).parameters)[1:]
    if params[:2] != ["x", "position_ids"] or params[2:] not in ([], ["layer_type"]):
        raise ValueError(f"fastpe.hf: the rotary module {where} takes ({', '.join(params)}), "
                         f"not (x, position_ids[, layer_type]): fastpe.hf cannot give it "
                         f"positions")
    if config is None:
        raise ValueError(f"fastpe.hf: neither the rotary module {where} nor its model keeps a "
                         f"config to read its RoPE from")
    model_type = getattr(config, "model_type", None)
    if model_type == "":
        raise ValueError(f"fastpe.hf: the rotary module {where} reads a config with an empty "
                         "model_type, which transformers gives to sub-configs of composite "
                         "models (Evolla's protein encoder): fastpe cannot tell their "
                         "attention from their keys")
    if model_type in _NOT_REPRODUCED:
        raise ValueError(f"fastpe.hf: model type {model_type!r} is not reproduced: "
                         f"{_NOT_REPRODUCED[model_type]}")
    if not _transformers_type(model_type):
        # from_hf_config reads a model type transformers does not know as Llama's (a
        # custom model's config.json); here the module is transformers' own, of a family
        # the config does not name, whose pairing may be another's (Cohere's)
        family = next((own for c in type(config).__mro__
                       if c.__module__.startswith("transformers.")
                       and _transformers_type(own := vars(c).get("model_type"))), None)
        derived = f" (its config class derives from transformers' {family!r} config)" if family else ""
        raise ValueError(f"fastpe.hf: the rotary module {where} reads a config of model type "
                         f"{model_type!r}, which transformers does not know{derived}: fastpe "
                         f"reads a model's rotation by its transformers model type, so it "
                         f"cannot tell which family's code this model runs")
    ropes: dict[str | None, RotaryEmbedding]
    try:
        optional = inspect.signature(cls.forward).parameters.get("layer_type")
        if (params[2:] and getattr(module, "layer_types", None) is None
                and not getattr(config, "layer_types", None)
                and optional is not None and optional.default is None):
            # forward(x, position_ids, layer_type=None) of a model without layer types
            # (ESM): one embedding, called without a layer_type
            ropes = {None: RotaryEmbedding._from_hf_module(config, None, None, None)}
        elif params[2:]:
            # the module's own list where it keeps one (LFM3: the attention layers' types
            # only, none in a model of convolution layers alone)
            held = getattr(module, "layer_types", None)
            layer_types = sorted(set(getattr(config, "layer_types", None) or ()
                                     if held is None else held))
            if not layer_types:
                if held is None:
                    raise ValueError("it takes layer_type but its config lists no layer_types")
                listed = sorted(set(getattr(config, "layer_types", None) or ()))
                raise ValueError(f"it keeps frequencies for no layer type: none of the "
                                 f"config's layer_types {listed} is an attention layer that "
                                 "rotates, so the model has nothing for fastpe to rotate")
            # a layer type whose rope parameters are None (Beam's and Ergo's NoPE layers):
            # the module makes no frequencies for it, and those layers rotate nothing
            rope_parameters = getattr(config, "rope_parameters", None)
            if isinstance(rope_parameters, dict):
                layer_types = [t for t in layer_types
                               if not (t in rope_parameters and rope_parameters[t] is None)]
            ropes = {t: RotaryEmbedding._from_hf_module(config, None, t, None)
                     for t in layer_types}
        else:
            ropes = {None: RotaryEmbedding._from_hf_module(config, None, None, None)}
    except ValueError as err:
        raise ValueError(f"fastpe.hf: cannot reproduce the rotary module {where} of model type "
                         f"{model_type!r}: {err}") from err
    _check_module_state(module, ropes, where, model_type in VISION)
    _check_module_sections(module, config, ropes, where)
    return ropes


def _check_module_sections(module: Any, config: Any, ropes: dict[str | None, RotaryEmbedding],
                           where: str) -> None:
    """Refuse a text M-RoPE module whose own mrope_section (what its forward splits the
    frequencies by) is not the one fastpe reads from its config: a config edited after
    the model was built turns the same frequencies by other axes."""
    held = getattr(module, "mrope_section", None)
    if not isinstance(held, (list, tuple)) or not all(type(v) is int for v in held):
        return  # none kept (or not a list of sections): its config is all there is
    for layer_type in ropes:
        loaded = text_mrope(config, layer_type)
        if loaded is not None and list(held) != loaded[0]["mrope_section"]:
            raise ValueError(f"fastpe.hf: the rotary module {where} holds mrope_section "
                             f"{list(held)}, its config gives {loaded[0]['mrope_section']} "
                             f"(edited after the model was built): fastpe reads the config, "
                             f"so it would turn pairs by other axes")


# the relative rounding of a model's half-precision copy of its inv_freq buffer
_HALF_EPS = {"torch.float16": 2.0**-10, "torch.bfloat16": 2.0**-7}


def _check_growth(module: Any, layer_type: str | None, rope: RotaryEmbedding,
                  where: str) -> None:
    """Refuse a module built with dynamic NTK (whose forward grows its frequencies past
    its length) that its config now says is of another rope type, or the other way
    round: the frequencies a module holds are the same either way until it grows."""
    held = getattr(module, "rope_type", None)
    if isinstance(held, dict):
        held = held.get(layer_type)
    read = rope._spec.rope_type
    if isinstance(held, str) and (held == "dynamic") != (read == "dynamic"):
        raise ValueError(f"fastpe.hf: the rotary module {where} was built with rope type "
                         f"{held!r}, its config now gives {read!r} (edited after the model "
                         f"was built): fastpe reads the config, so it would grow its "
                         f"frequencies where the module does not, or not where it does")


def _check_module_state(module: Any, ropes: dict[str | None, RotaryEmbedding],
                        where: str, vision: bool) -> None:
    """Refuse a rotary module whose own inverse frequencies or attention scaling (what
    its forward uses) are not those of its config, which fastpe reads: a config edited
    after the model was built, or an inv_freq buffer replaced or rescaled in place.
    ``vision``: a vision tower's module, whose frequencies are checked in order."""
    for layer_type, rope in ropes.items():
        prefix = "" if layer_type is None else f"{layer_type}_"
        if rope._spec.rope_type == "dynamic" and not rope._spec.mscaled and (
                rope.axes > 1 or rope._halves is not None):
            raise ValueError(f"fastpe.hf: the rotary module {where} grows dynamic NTK "
                             f"frequencies on more than one position axis, which fastpe.hf "
                             f"does not reproduce")
        _check_growth(module, layer_type, rope, where)
        if _looks_up_table(module, layer_type, rope):
            _check_position_table(module, rope, where)
            continue
        name, buffer = _checked_buffer(module, layer_type, rope)
        if buffer is None:
            continue  # a module that keeps none: its config is all there is
        expected = rope._spec.frequencies(None)
        held = _values(buffer)
        want = expected.inv_freq
        if rope.axes > 1 and not vision:
            # a text M-RoPE module may hold its spectrum in its axes' order (ERNIE-4.5-VL),
            # which fastpe's pair layout reproduces: the values are what is checked
            held, want = np.sort(held), np.sort(want)
        # within the rounding of the buffer's own dtype (model.half() rounds it), or of
        # bfloat16 for a float32 one (cast there and back): what is refused is a different
        # frequency, not a rounded one, by which the patched module then rotates
        ulp = _HALF_EPS.get(str(buffer.dtype), _HALF_EPS["torch.bfloat16"])
        # float16 holds frequencies below 2**-14 (large bases) as subnormals, spaced 2**-24
        tiny = 0.0 if str(buffer.dtype) == "torch.bfloat16" else 2.0**-24
        if held.shape != want.shape or not np.allclose(held, want, rtol=ulp, atol=tiny):
            raise ValueError(f"fastpe.hf: the rotary module {where} holds {name} other than "
                             f"its config gives, past a half-precision cast's rounding "
                             f"(edited after the model was built, or replaced): fastpe "
                             f"reads the config, so it would rotate differently")
        # dynamic NTK grows past the length the module was built with, fastpe past the
        # config's: the same number unless the config was edited since
        built = getattr(module, "original_max_seq_len", None)
        original = rope._spec.original_max_position_embeddings
        if (rope._spec.rope_type == "dynamic" and not rope._spec.mscaled
                and built is not None and original is not None and int(built) != original):
            raise ValueError(f"fastpe.hf: the rotary module {where} grows its dynamic NTK "
                             f"frequencies past {int(built)} positions, its config's "
                             f"max_position_embeddings is {original} (edited after the model "
                             f"was built): fastpe reads the config, so it would rotate "
                             f"differently")
        if rope._spec.rope_type == "longrope" and not rope._spec.mscaled:
            _check_long_frequencies(module, layer_type, rope, f" {where}")
        if _is_rounded(buffer, rope):
            _refuse_held(rope, f" {where}")
        _check_attention_scaling(module, layer_type, rope, f" {where}")
        # a tensor alpha is followed as Mistral Large 4's forward uses it, exp(alpha) times
        # every frequency (_alpha_frequencies): refused where the forward does other
        alpha = getattr(module, "alpha", None)
        code = getattr(_own_forward(type(module)), "__code__", None)
        if hasattr(alpha, "_version") and not {"alpha", "exp"} <= set(
                getattr(code, "co_names", ())):
            raise ValueError(f"fastpe.hf: the rotary module {where} holds a tensor alpha "
                             f"that its forward does not use as exp(alpha) times its "
                             f"frequencies (Mistral Large 4's), which fastpe.hf reproduces "
                             f"alone")
        # dynamic NTK frequencies grown before patch(): formed from the config as it was
        grown_to = getattr(module, f"{prefix}max_seq_len_cached",
                           getattr(module, "max_seq_len_cached", None))
        grown_to = None if grown_to is None else int(grown_to)   # an int or a 0-d tensor
        if (rope._spec.rope_type == "dynamic" and not rope._spec.mscaled
                and original is not None and grown_to is not None and grown_to > original
                and getattr(module, f"{prefix}inv_freq", None) is not None
                and not _is_rounded(buffer, rope)):
            _check_grown(module, f"{prefix}inv_freq", rope.frequencies(grown_to).inv_freq,
                         grown_to)


def _looks_up_table(module: Any, layer_type: str | None, rope: RotaryEmbedding) -> bool:
    """Whether the module looks its sin and cos up in an embed_positions table (GPT-J,
    CodeGen) rather than forming them from a frequency buffer."""
    return (getattr(module, "embed_positions", None) is not None
            and _checked_buffer(module, layer_type, rope)[1] is None)


def _check_position_table(module: Any, rope: RotaryEmbedding, where: str) -> None:
    """Refuse a rotary module that looks its (sin, cos) up in a table (GPT-J's and
    CodeGen's embed_positions, [sin | cos] of each position's angles, made in float32)
    unless the whole table holds the config's, within its float32 angles (position *
    2**-22) and its dtype's rounding, and its own forward splits a row into them (run at
    the first, second and last rows)."""
    torch: Any = importlib.import_module("torch")
    table = _values(module.embed_positions)  # a meta table is refused by name
    rows = int(module.embed_positions.shape[0])
    inv_freq = rope._spec.frequencies(None).inv_freq
    ulp = _HALF_EPS.get(str(module.embed_positions.dtype), 2.0**-23)
    every = np.arange(rows, dtype=np.float64)[:, None]
    angles = every * inv_freq
    tolerance = every * 2.0**-22 + 2 * ulp
    ok = table.size == rows * 2 * inv_freq.size
    if ok:
        table = table.reshape(rows, 2, inv_freq.size)
        ok = bool(np.all(np.abs(table[:, 0] - np.sin(angles)) <= tolerance)
                  and np.all(np.abs(table[:, 1] - np.cos(angles)) <= tolerance))
    if ok:
        positions = np.array(sorted({0, min(1, rows - 1), rows - 1}))
        with torch.no_grad():
            got = type(module).forward(module, torch.zeros(1), torch.from_numpy(positions[None]))
        try:
            held = [_values(t).reshape(len(positions), -1) for t in got]
        except (AttributeError, TypeError, ValueError):
            held = []
        ok = len(held) == 2 and all(np.array_equal(h, table[positions, i])
                                    for i, h in enumerate(held))
    if not ok:
        raise ValueError(f"fastpe.hf: the rotary module {where} gives (sin, cos) other than "
                         f"its config's (its embed_positions table edited, replaced or cast "
                         f"to half precision and back, or the config edited after the model "
                         f"was built): fastpe reads the config, so it would rotate "
                         f"differently")


def _appliers(applying: dict[str, dict[str, Any]], name: str,
              modules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Of `applying` (module name -> the apply functions its forward calls), those that
    apply the rotary module `name`'s embedding: in the nearest module around it that
    has any (the text model or vision tower it belongs to; Moshi's attention holds its
    own rotary module). None: a ValueError."""
    scope = name
    while scope:
        scope = scope.rpartition(".")[0]
        prefix = scope + "." if scope else ""
        found = {n: f for n, f in applying.items() if n == scope or n.startswith(prefix)}
        if found:
            return found
    raise ValueError(f"fastpe.hf: no module around the rotary module {name!r} calls an "
                     f"apply_*rotary* function that fastpe.hf can replace")


def _named_modules(model: Any) -> Iterator[tuple[str, Any]]:
    named = getattr(model, "named_modules", None)
    if named is None:
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got "
                        f"{type(model).__name__}")
    yield from named()


def patch(model: Any) -> Any:
    """Make a transformers model apply its rotary position embedding through fastpe,
    in place on its own q and k tensors, with float64 angles from its position_ids;
    returns the model. Only this instance changes; :func:`unpatch` undoes it.
    Patching a patched model does nothing. Given torch.compile's wrapper, it patches the
    model that the wrapper runs (and returns the wrapper); a model patched already through
    a module holding it, or through one inside it, is refused. A patched model runs
    between torch.compile's graphs and refuses to be traced (torch.jit.trace,
    torch.export).

    DeBERTa (v1, v2, v3) and SEW-D models get their disentangled attention bias added by
    fastpe instead (fastpe._hf_deberta).

    Raises ValueError naming what is missing when fastpe cannot reproduce the model
    (see the module's docstring); the model is then unchanged.

    With a transformers config and input ids::

        model = fastpe.hf.patch(LlamaForCausalLM(config).eval())
        with torch.no_grad():
            tokens = model.generate(input_ids, max_new_tokens=20)
    """
    given, model = model, _compiled_module(model)
    _drop_stale_patch(model)
    if getattr(model, _STATE, None) is not None:
        return given
    modules = dict(_named_modules(model))
    held = [name for name, m in modules.items() if _patched_attributes(m)]
    if held:
        where = f"its module {held[0]!r}" if held[0] else "it"
        raise ValueError(f"fastpe.hf: {type(model).__name__} is patched already, through "
                         f"another module: {where} runs what fastpe.hf.patch set when it was "
                         f"given a module holding this model or one inside it; "
                         f"fastpe.hf.unpatch(model) undoes that, then patch the model")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if isinstance(model_type, str) and model_type in _hf_realrope.LOADERS:
        raise ValueError(f"fastpe.hf: model type {model_type!r} is not reproduced: "
                         + _NOT_REPRODUCED.get(model_type, _REAL_COORDINATES))
    rotary = {name: m for name, m in modules.items() if _is_rotary_class(type(m))}
    disentangled = {name: (m, attribute) for name, m in modules.items()
                    if (attribute := _hf_deberta.bias_attribute(m)) is not None}
    if not rotary and not disentangled:
        if (found := _subclass_outside_transformers(modules)) is not None:
            name, cls, base = found
            raise ValueError(f"fastpe.hf: {type(model).__name__}'s {name!r} is a "
                             f"{cls.__qualname__} ({cls.__module__}), a subclass of "
                             f"transformers' {base.__name__} defined outside transformers: "
                             f"fastpe.hf patches transformers' own classes only, as it cannot "
                             f"tell what a subclass changes")
        raise ValueError(f"fastpe.hf: {type(model).__name__} has no transformers rotary "
                         f"embedding module (*RotaryEmbedding, forward(x, position_ids)) nor "
                         f"DeBERTa's disentangled attention: fastpe.hf patches only models "
                         f"whose RoPE comes from one (not RoFormer's sinusoidal position "
                         f"module, nor models without RoPE), and DeBERTa (v1, v2, v3) and "
                         f"SEW-D with relative attention")
    plan: list[tuple[Any, str, Callable[..., Any] | None]] = [
        (module, attribute, None) for module, attribute in disentangled.values()]
    plan += _rotary_plan(modules, rotary, model) if rotary else []
    for module, attribute, _ in plan:
        if attribute in vars(module):
            raise ValueError(f"fastpe.hf: the {attribute} of {type(module).__name__} was "
                             f"already replaced on this instance (by accelerate's hooks, "
                             f"kernelize, ...): fastpe.hf cannot tell what it runs")
    for i, (name, (module, attribute)) in enumerate(disentangled.items()):
        cls = type(module)
        make = (_hf_deberta.bias_method if attribute == _hf_deberta.BIAS_ATTRIBUTE
                else _hf_deberta.v1_bias_method)
        method = _eager(make(module, _eager))
        _hf_deberta.check_bias(module, attribute, method,
                               f"{name!r} ({cls.__name__}, {cls.__module__})")
        plan[i] = (module, attribute, types.MethodType(method, module))
    for module, attribute, value in plan:
        setattr(module, attribute, value)
    object.__setattr__(model, _STATE, [(module, attribute) for module, attribute, _ in plan])
    return given


def _rotary_plan(modules: dict[str, Any], rotary: dict[str, Any],
                 model: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
    """(module, "forward", its patched forward) for the rotary modules and the modules
    that apply them."""
    kinds = {name: getattr(_config(modules, name), "model_type", None) for name in rotary}
    left = sorted(str(kind) for kind in kinds.values() if kind in _LEFT_STOCK)
    rotary = {name: m for name, m in rotary.items() if not _reorders_cos_sin(modules, name)
              and kinds[name] not in _LEFT_STOCK}
    if not rotary:
        why = "; ".join(f"{kind}: {_LEFT_STOCK[kind]}" for kind in dict.fromkeys(left))
        raise ValueError(f"fastpe.hf: every rotary embedding of {type(model).__name__} has its "
                         f"cos and sin reordered before its apply function (window "
                         f"attention) or used otherwise than by it{f' ({why})' if why else ''}, "
                         f"which fastpe.hf cannot reproduce")
    _refuse_outside_appliers(modules)
    applying = {n: f for n, m in modules.items() if n not in rotary and (f := _apply_names(type(m)))}
    plan: list[tuple[Any, str, Callable[..., Any]]] = []
    appliers: set[str] = set()
    stand_ins: dict[int, Callable[..., Any]] = {}  # one per apply function
    for name, module in rotary.items():
        ropes = _ropes(module, _config(modules, name))
        takes: set[bool] = set()
        for sub_name, functions in _appliers(applying, name, modules).items():
            for fname, f in functions.items():
                if id(f) not in stand_ins:
                    stand_ins[id(f)] = _apply_function(fname, f)
                takes.add(getattr(stand_ins[id(f)], _TAKES_FREQS_CIS))
                if getattr(stand_ins[id(f)], _PROBED_ADJACENT) and any(
                        rope.style != "gptj" for rope in ropes.values()):
                    raise ValueError(f"fastpe.hf: the rotary module {name!r} is read from its "
                                     f"config as rotating halves of each head, but {fname}, "
                                     f"run on probes, turns adjacent pairs: fastpe.hf cannot "
                                     f"tell which the model does")
            if sub_name in appliers:
                continue
            appliers.add(sub_name)
            rebound = {fname: stand_ins[id(f)] for fname, f in functions.items()}
            sub = modules[sub_name]
            plan.append((sub, "forward", types.MethodType(
                _eager(_rebound_forward(type(sub), rebound)), sub)))
        if len(takes) > 1:
            raise ValueError(f"fastpe.hf: the rotary module {name!r} feeds apply functions "
                             f"of (cos, sin) and of one freqs_cis, which fastpe.hf cannot "
                             f"serve with one return value")
        table = any(_looks_up_table(module, t, rope) for t, rope in ropes.items())
        # Phi-3.5-MoE's module reads its config entry at every call
        read = {t: copy.deepcopy(_rope_entry(module, t))
                for t, rope in ropes.items() if rope._spec.mscaled}
        # a text M-RoPE module's mrope_section, as it is now (its config's own list)
        held = getattr(module, "mrope_section", None)
        sections = list(held) if isinstance(held, (list, tuple)) else None
        plan.append((module, "forward", types.MethodType(
            _rotary_forward(ropes, True in takes, table, read or None, sections,
                            kinds[name] in VISION), module)))
    return plan


def _runs_patch(module: Any, attribute: str) -> bool:
    """Whether `module` runs the method patch() set as `attribute`: pickle keeps neither
    the closures nor the rebuilt functions, and a copy it loads holds the class's own
    method on the instance instead."""
    return getattr(getattr(vars(module).get(attribute), "__func__", None), _FASTPE_FORWARD,
                   False)


def _patched_attributes(module: Any) -> list[str]:
    """The attributes of `module` that run a method patch() set (by any patch() call)."""
    return [name for name in ("forward", _hf_deberta.BIAS_ATTRIBUTE,
                              _hf_deberta.V1_BIAS_ATTRIBUTE) if _runs_patch(module, name)]


def _compiled_module(model: Any) -> Any:
    """The module that torch.compile's wrapper (an OptimizedModule) runs, else model: the
    wrapper reads attributes through to it but keeps its own, so a patch recorded on the
    wrapper would be one that unpatch(model) cannot see, and the reverse."""
    while (type(model).__name__ == "OptimizedModule"
           and type(model).__module__.startswith("torch._dynamo")
           and "_orig_mod" in getattr(model, "_modules", {})):
        model = model._modules["_orig_mod"]
    return model


def _drop_stale_patch(model: Any) -> None:
    """Forget a patch that a pickled copy of a patched model remembers but does not run
    (its modules run their stock methods): the model is then stock, and unmarked."""
    patched = getattr(model, _STATE, None)
    if patched is None or all(_runs_patch(module, name) for module, name in patched):
        return
    for module, name in patched:
        vars(module).pop(name, None)
    object.__delattr__(model, _STATE)


def unpatch(model: Any) -> Any:
    """Undo :func:`patch`: the model runs its stock code again, bit for bit; returns
    the model. Unpatching a model that is not patched does nothing. A patch made through
    torch.compile's wrapper of the model, a module holding it or one inside it is undone
    too."""
    given, model = model, _compiled_module(model)
    _drop_stale_patch(model)
    patched = getattr(model, _STATE, None)
    if patched is not None:
        for module, name in patched:   # what patch() set, nothing set since
            vars(module).pop(name, None)
        object.__delattr__(model, _STATE)
    # what patch() set when given a module inside this one, or one holding it: theirs is
    # then stale, and dropped at their next patch() or unpatch()
    for module in getattr(model, "modules", tuple)():
        for name in _patched_attributes(module):
            vars(module).pop(name)
        vars(module).pop(_STATE, None)
    return given
