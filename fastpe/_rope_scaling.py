"""RoPE inverse frequencies and attention scaling for every Hugging Face rope type.

The ``scaling`` argument is the ``rope_scaling`` / ``rope_parameters`` dict of a
Hugging Face model config. Its meaning follows transformers' ``modeling_rope_utils``
(5.x); :func:`rope_frequencies` lists the few places where fastpe decides otherwise.

Everything here is float64 NumPy or Python floats and runs once per configuration:
parsed specs and their frequencies are cached and shared between callers, which is
why the returned arrays are read-only.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, NamedTuple, TypedDict

import numpy as np
from numpy.typing import NDArray

from . import _checks, _constants, _hf_models
from ._typing import Style

__all__ = [
    "SUPPORTED_ROPE_TYPES",
    "RopeFrequencies",
    "RopeSpec",
    "hf_rope_config",
    "parse_rope_spec",
    "rope_frequencies",
]

SUPPORTED_ROPE_TYPES = (
    "default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"
)

DEFAULT_BASE = 10000.0

_NEEDS_ORIGINAL_LENGTH = frozenset({"dynamic", "yarn", "longrope", "llama3"})

# dynamic NTK has one set of frequencies per sequence length past the original one;
# a long decode would otherwise grow its cache by one entry per token.
_MAX_CACHED_LENGTHS = 64
# and forms each from exp(-SPLIT * (i // SPLIT) * step) * exp(-(i % SPLIT) * step) for
# pair i (rope.pxi DYNAMIC_SPLIT)
_DYNAMIC_SPLIT = _constants.DYNAMIC_SPLIT

# An inverse frequency above this overflows position * inv_freq for some int64 position.
MAX_INV_FREQ = _constants.MAX_INV_FREQ
# The largest inverse frequency a base and scaling may give. A base > 1 with factors
# >= 1 turns pair 0 by at most 1 rad per position; DINOv3 folds its 2 pi into the
# frequencies (a linear factor of 1 / (2 pi)). Up to 8 rad per position, the float64
# angles of positions below 2**32 (fastpe._checks.MAX_ANGLE_POSITION) keep their
# rounding under 4e-6 rad; a base or factor far below 1 (base=1e-320 gives 1e280) is
# refused rather than rotated by angles whose rounding is whole radians.
MAX_SPEC_INV_FREQ = 8.0
# Normal float32 numbers: the attention scaling multiplies cos and sin in float32.
ATTENTION_SCALING_RANGE = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))

# What a spec's frequencies depend on besides the spec: None for most types, the length
# max(seq_len, original) for dynamic, whether seq_len is past the original for longrope.
Regime = int | bool | None


class HfRope(TypedDict):
    """What :func:`hf_rope_config` reads from a config; see there."""

    head_dim: int
    rotary_dim: int
    base: float
    scaling: dict[str, Any] | None
    max_position_embeddings: int | None
    style: Style
    features: tuple[int, int]
    inverse: bool


class RopeFrequencies(NamedTuple):
    """Inverse frequencies of the rotary pairs and the factor that multiplies cos and sin.

    ``inv_freq`` is float64 with shape ``(rotary_dim // 2,)`` and read-only: it is cached
    and shared. Pair ``j`` rotates by ``position * inv_freq[j]`` radians.
    """

    inv_freq: NDArray[np.float64]
    attention_scaling: float


RopeFrequencies.inv_freq.__doc__ = (
    "(rotary_dim // 2,) float64, read-only: pair j turns by position * inv_freq[j] rad")
RopeFrequencies.attention_scaling.__doc__ = (
    "The factor on cos and sin (YaRN's and LongRoPE's attention factor, else 1.0)")


# One lock for every spec's frequency cache (held only to insert): a child forked while
# another thread holds it gets a fresh one, or its first new length would wait forever.
_cache_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    global _cache_lock
    _cache_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


@dataclass(frozen=True)
class RopeSpec:
    """A validated RoPE configuration, cheap to reuse; build it with :func:`parse_rope_spec`.

    ``dim`` is the rotary width (the head width times any ``partial_rotary_factor``).
    ``params`` holds the type-specific values as ``(name, value)`` pairs.
    """

    rope_type: str
    dim: int
    base: float
    original_max_position_embeddings: int | None = None
    factor: float | None = None
    attention_scaling: float = 1.0
    params: tuple[tuple[str, Any], ...] = ()
    depends_on_seq_len: bool = field(init=False, repr=False, compare=False)
    mscaled: bool = field(init=False, repr=False, compare=False)
    _cache: dict[Regime, RopeFrequencies] = field(default_factory=dict, init=False, repr=False,
                                                  compare=False)

    def __post_init__(self) -> None:
        # Phi-3.5-MoE's short_mscale / long_mscale (_with_mscales)
        object.__setattr__(self, "mscaled", any(name == "short_mscale" for name, _ in self.params))
        object.__setattr__(self, "depends_on_seq_len",
                           self.rope_type in ("dynamic", "longrope") or self.mscaled)

    # A pickle (a RotaryEmbedding sent to a worker process) carries the configuration,
    # not the lock or the cache: cached arrays would come back writable.
    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_cache", {})
        self.__post_init__()

    def frequencies(self, seq_len: int | None = None) -> RopeFrequencies:
        """The frequencies for a sequence of ``seq_len`` positions (None: not past the original).

        Calls in the same regime return the same object: one for most types; for
        longrope one per side of the original length; for dynamic one per
        ``max(seq_len, original)``, of which the 64 computed last are kept.
        """
        regime = self._regime(seq_len)
        cached = self._cache.get(regime)
        return cached if cached is not None else self._compute(regime)

    def _regime(self, seq_len: int | None) -> Regime:
        if seq_len is not None and not (type(seq_len) is int and seq_len >= 0):
            seq_len = _checks.count(seq_len, "seq_len", minimum=0, whole_float=True)
        if not self.depends_on_seq_len:
            return None
        original = self.original_max_position_embeddings
        assert original is not None  # _parse sets it for these types
        if self.rope_type == "dynamic" and not self.mscaled:
            return original if seq_len is None else max(seq_len, original)
        return seq_len is not None and seq_len > original

    def _compute(self, regime: Regime) -> RopeFrequencies:
        attention = self.attention_scaling
        formed_at = regime
        if self.mscaled:
            # Phi-3.5-MoE's module: at every length the frequencies formed without one
            # (longrope's short factors, dynamic NTK's plain ones), and cos and sin
            # multiplied by the mscale of the call's side of the original length
            formed_at = self.original_max_position_embeddings if self.rope_type == "dynamic" else False
            attention = dict(self.params)["long_mscale" if regime else "short_mscale"]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            inv_freq = _INV_FREQ[self.rope_type](self, formed_at)
        self._check_frequencies(inv_freq)
        # shared by every later caller: a view of immutable bytes, so that not even
        # flags.writeable = True can make it writable
        freqs = RopeFrequencies(np.frombuffer(inv_freq.tobytes(), dtype=np.float64),
                                attention)
        # the eviction iterates the dict: without the lock another thread's insert
        # makes it raise "dictionary changed size during iteration"
        with _cache_lock:
            if regime not in self._cache and len(self._cache) >= _MAX_CACHED_LENGTHS:
                self._cache.pop(next(iter(self._cache)))
            # if two threads raced, both callers get the object that was stored first
            return self._cache.setdefault(regime, freqs)

    def _check_frequencies(self, inv_freq: np.ndarray) -> None:
        """Every angle position * inv_freq must be as accurate in float64 as the position
        limit promises (see MAX_SPEC_INV_FREQ): finite, tiny or huge inputs can still
        make base**(-2i/d) / factor overflow, or exceed that limit."""
        ok = np.isfinite(inv_freq) & (inv_freq >= 0.0) & (inv_freq <= MAX_SPEC_INV_FREQ)
        if ok.all():
            return
        i = int(np.argmin(ok))
        names = ["base"] + [_key(k) for k, _ in self.params if k.endswith("factor")]
        if self.factor is not None:
            names.append(_key("factor"))
        raise ValueError(
            f"base={self.base!r} with rope_type {self.rope_type!r} gives inverse frequency "
            f"{float(inv_freq[i])!r} for pair {i}, outside [0, {MAX_SPEC_INV_FREQ}]: past "
            f"it the float64 angles of positions up to 2**32 carry more rounding than "
            f"float32 precision; check {', '.join(dict.fromkeys(names))} (a base above 1, "
            f"factors of at least 1)"
        )


def rope_frequencies(
    dim: int, *, base: float | None = None, scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None, max_position_embeddings: int | None = None
) -> RopeFrequencies:
    """Inverse frequencies and attention scaling for rotary position embeddings.

    Parameters
    ----------
    dim : int
        Head width. Frequencies are for the rotary width, which is ``dim``, or
        ``int(dim * scaling["partial_rotary_factor"])`` when the dict has that key
        (except for "proportional"); it must be even.
    base : float, optional
        The RoPE base (theta). None means ``scaling["rope_theta"]`` when the dict has
        one, else 10000.0. A base that differs from the dict's ``rope_theta`` is a
        ValueError.
    scaling : dict, optional
        A Hugging Face ``rope_scaling`` / ``rope_parameters`` dict, or None for plain
        RoPE. Its type is ``rope_type`` (or the older ``type``): "default", "linear"
        (``factor``), "dynamic" (``factor``), "yarn" (``factor``, ``beta_fast`` = 32,
        ``beta_slow`` = 1, ``attention_factor``, ``mscale``, ``mscale_all_dim``,
        ``truncate`` = True), "longrope" (``short_factor``, ``long_factor``,
        ``factor``, ``attention_factor``), "llama3" (``factor``, ``low_freq_factor``,
        ``high_freq_factor``) or "proportional" (``factor`` = 1,
        ``partial_rotary_factor``); with any type but "default", Phi-3.5-MoE's
        ``short_mscale`` and ``long_mscale`` (Notes). Other keys are ignored.
    seq_len : int, optional
        The number of positions the frequencies serve, i.e. the largest position + 1.
        Only dynamic and longrope depend on it; None means "not past the original
        length".
    max_position_embeddings : int, optional
        The model's ``max_position_embeddings``. dynamic, yarn, longrope and llama3 take
        their original context length from ``scaling["original_max_position_embeddings"]``,
        else from this; yarn and longrope without ``factor`` use
        ``max_position_embeddings / original``.

    Returns
    -------
    RopeFrequencies
        ``(inv_freq, attention_scaling)``: float64 ``inv_freq`` of shape
        ``(rotary_dim // 2,)``, read-only and shared by later calls with the same
        arguments; ``attention_scaling`` multiplies cos and sin (1.0 except for yarn
        and longrope).

    Raises
    ------
    TypeError
        An argument or dict field of the wrong type.
    ValueError
        An unknown rope type, a missing field or an invalid value; the message names
        the field.

    Notes
    -----
    Types as in transformers:

    - dynamic: at ``seq_len`` above the original length L the base becomes
      ``base * (factor * seq_len / L - (factor - 1)) ** (d / (d - 2))``; at or below L
      it is the plain base. Stateless: the frequencies depend only on this call's
      ``seq_len``. Computed as the plain frequency of pair i times
      ``g ** (-2i / (d - 2))`` (g the bracket), with C's exp and log: within about
      2e-15 relative of the exact values, as powers of the grown base are.
    - yarn: the attention factor is ``attention_factor`` if given, else
      ``m(factor, mscale) / m(factor, mscale_all_dim)`` when both are set and non-zero,
      else ``m(factor, 1)``, with ``m(s, k) = 0.1 k ln s + 1`` (1 when s <= 1). An
      explicit ``factor`` wins over ``max_position_embeddings / L`` (DeepSeek-style
      configs where the two differ), as transformers >= 4.57 does; 4.51 to 4.56 used
      the ratio instead.
    - longrope: long factors when ``seq_len > L``, short ones otherwise; attention
      factor ``attention_factor``, else ``sqrt(1 + ln factor / ln L)`` (1 when
      factor <= 1).
    - proportional (Gemma 4 full attention, LFM3): the rotary width stays ``dim``; the
      first ``int(partial_rotary_factor * dim // 2)`` pairs get the plain frequencies
      of width ``dim``, the rest 0 (they do not rotate); all divided by ``factor``.
    - ``short_mscale`` and ``long_mscale`` (Phi-3.5-MoE's rotary module, any type but
      default): they replace the attention factor, ``long_mscale`` when ``seq_len`` is
      above ``original_max_position_embeddings`` (which the dict must give), and the
      frequencies are those of no ``seq_len`` at every length (dynamic's plain ones,
      longrope's short factors), as the module forms them.

    Where fastpe differs from transformers:

    - dynamic reads ``original_max_position_embeddings`` from the dict when it is there
      (transformers always uses the config's ``max_position_embeddings``).
    - An odd rotary width is a ValueError; transformers would rotate one feature more
      than asked.
    - Out-of-range values are errors, not warnings or silent defaults (e.g.
      ``beta_fast=0``, ``factor <= 0``, ``partial_rotary_factor`` outside (0, 1]).
    """
    spec = parse_rope_spec(
        dim, base=base, scaling=scaling, max_position_embeddings=max_position_embeddings
    )
    return spec.frequencies(seq_len)


def parse_rope_spec(dim: object, *, base: object = None, scaling: object = None,
                    max_position_embeddings: object = None) -> RopeSpec:
    """Validate the arguments of :func:`rope_frequencies` (less ``seq_len``) once.

    Results are memoised on the arguments, a dict ``scaling`` by its current contents,
    so repeated calls cost a hash and a lookup and share one spec and its frequencies.
    """
    if scaling is None or isinstance(scaling, Mapping):
        try:
            frozen = None if scaling is None else tuple((k, _freeze(v)) for k, v in scaling.items())
            return _parse_cached(dim, base, frozen, max_position_embeddings)
        except TypeError:
            pass  # unhashable or wrongly typed input: the uncached parse names the culprit
    return _parse(dim, base, scaling, max_position_embeddings)


def hf_rope_config(config: object, *, layer_type: str | None = None, part: str | None = None,
                   multi_axis: bool = False, entry: bool = False) -> HfRope:
    """The RoPE settings of a Hugging Face model config, ready for :func:`rope_frequencies`.

    ``config`` is a transformers config object (its ``to_dict()``, or getattr) or its
    dict (as in config.json). The model type's convention comes from the table in
    :mod:`fastpe._hf_models`; a model type not in it is read as Llama's. Returns a dict:

    - ``head_dim``: the width of the features the embedding rotates over: the model's
      ``head_dim`` (else ``hidden_size // num_attention_heads``; per layer type where the
      config sets it per layer), or for MLA ``qk_rope_head_dim`` and for trailing partial
      rotary the rotated width;
    - ``rotary_dim``: from ``partial_rotary_factor`` (in the rope dict or top-level),
      ``rotary_pct`` (GPT-NeoX) or ``rotary_dim`` (GPT-J, CodeGen), else ``head_dim``;
    - ``base``: the rope dict's ``rope_theta``, else ``rope_theta``, else
      ``rotary_emb_base`` (GPT-NeoX), else 10000.0;
    - ``scaling``: the ``rope_scaling`` / ``rope_parameters`` dict without
      ``rope_theta`` and ``partial_rotary_factor`` (they are in ``base`` and
      ``rotary_dim``; "proportional" keeps its factor), with a top-level
      ``original_max_position_embeddings`` (Phi-3) merged in for llama3, yarn and
      longrope as transformers does; None for plain RoPE;
    - ``max_position_embeddings`` (or GPT-J's ``n_positions``), None if absent;
    - ``style``: "gptj" for models that rotate adjacent pairs (GPT-J, CodeGen, Cohere,
      GLM, DeepSeek-V2, Llama 4, ... or ``rope_interleave=True``), else "neox";
    - ``features``: ``(start, stop)``, the features of the model's query head that
      ``head_dim`` covers: ``(0, head_dim)`` for most models, ``(qk_nope_head_dim,
      qk_nope_head_dim + qk_rope_head_dim)`` for MLA (whose separate k_pe is rotated
      whole), the last ``rotary_dim`` features for DeepSeek-V4;
    - ``inverse``: True where the model rotates by -angle (nanochat).

    ``layer_type`` picks one entry of per-layer-type rope parameters (Gemma 2/3/4:
    "full_attention", "sliding_attention"); whether the layers a call picks rotate at
    all (NoPE layers) is for :func:`fastpe._hf_layers.select` to check first.
    ``part="indexer"`` gives the rotation of a lightning indexer (DeepSeek-V3.2) instead
    of the main attention's. Configs fastpe does not
    reproduce exactly (multi-axis M-RoPE, vision towers, composite configs, unknown rope
    types, model types of transformers it has not checked) are a ValueError that says
    what is missing. ``multi_axis``: the caller is the M-RoPE loader, whose model types
    are checked by their own fixture; ``entry``: its flat rope dict is a layer type's
    entry.
    """
    config, model_type = hf_config(config)
    _hf_refuse(config, model_type)
    if not multi_axis:
        _hf_refuse_unchecked(model_type)
    if part is not None and part != "indexer":
        raise ValueError(f"part must be None (the main attention) or 'indexer', got {part!r}")
    conv = _hf_models.convention(model_type)
    hf_requirements(config, model_type)
    if (conv.aliases or conv.ignored) and isinstance(config, Mapping):
        config = {k: v for k, v in config.items() if k not in conv.ignored}
        for name, key in conv.aliases:
            stored, given = _hf_get(config, key), _hf_get(config, name)
            if stored is not None and given is not None and stored != given:
                # which one the config class keeps differs by class (DBRX the given name,
                # Bailing-hybrid the stored key)
                raise ValueError(f"config of model_type {model_type!r} sets both {name}="
                                 f"{given!r} and {key}={stored!r}, which its config class "
                                 f"stores as one value: give one of them")
            if stored is not None:
                config[name] = stored
    scaling = _hf_scaling(config, layer_type)
    # entry: the config's rope dict is a layer type's entry, flattened by the multi-axis
    # loader, read as transformers reads an entry
    per_layer = entry or (layer_type is not None and _hf_rope_per_layer(config))
    if conv.fixed_base is not None:
        scaling = {"rope_theta": conv.fixed_base}
    elif conv.theta_only:
        scaling = {}  # the top-level base, read below, is all the module reads
    for key in ("rope_type", "type"):
        if key in scaling and scaling[key] in (None, ""):
            # transformers 5.25 looks the type up as given: KeyError for these
            raise ValueError(f"config rope parameters have {key}={scaling[key]!r}, which is "
                             f"no rope type; transformers {_hf_models.TRANSFORMERS_VERSION} "
                             "fails on it (give 'default' for plain RoPE)")
    given_type = scaling.get("rope_type", scaling.get("type"))
    renames = _hf_models.ROPE_TYPE_RENAMES.get(model_type or "", {})
    if isinstance(given_type, str) and given_type in renames:
        scaling["rope_type"] = renames[given_type]
    if "mrope_section" in scaling or scaling.get("mrope_interleaved") is not None:
        raise ValueError(
            "config rope parameters have mrope_section: multi-axis M-RoPE (one position per "
            "time/height/width axis) is not a 1-D text RoPE; fastpe does not load it yet"
        )
    theta = scaling.pop("rope_theta", None)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    ntk_alpha = None
    if model_type in _hf_models.NTK_ALPHA and rope_type == "dynamic" and scaling.get("alpha"):
        # HunYuan's checkpoints say "dynamic", but a fixed alpha only stretches the base
        # (transformers' ntk_alpha): no growth with the length, the other keys unread
        ntk_alpha = _checks.real(scaling["alpha"], "rope parameters' alpha", positive=True)
        scaling, rope_type = {}, "default"
    if conv.default_only and rope_type != "default":
        raise ValueError(f"model_type {model_type!r} takes the default rope type only: "
                         f"the model's own code fails on rope type {rope_type!r}")
    if rope_type == "axial":
        raise ValueError(
            "config rope_type 'axial' is a 2-D vision RoPE (patch rows and columns); "
            "the text loader does not reproduce it"
        )
    # proportional RoPE keeps the full head width and zeroes frequencies instead.
    partial = None if rope_type == "proportional" else scaling.pop("partial_rotary_factor", None)
    if per_layer:
        partial = _hf_layer_partial(config, model_type, rope_type, partial, scaling)
    elif partial is None and rope_type == "default":
        partial = _hf_models.DEFAULT_TYPE_PARTIAL.get(model_type or "")
    if (conv.trailing and partial is None and "partial_rotary_factor" not in scaling
            and _hf_get(config, "partial_rotary_factor") is None):
        raise ValueError(
            f"config of model_type {model_type!r} gives no partial_rotary_factor, which its "
            "config class derives from qk_rope_head_dim / head_dim (and its defaults) and "
            "fastpe does not: give the config object, its to_dict(), or the config.json "
            "save_pretrained writes")
    whole = conv.theta_only or (
        part is None and conv.width_key is None and not conv.trailing
        and conv.fixed_base is None
        and not (per_layer and partial is not None and model_type in _hf_models.ENTRY_PARTIAL)
        and (_hf_whole_head(config, model_type, rope_type, partial, not per_layer)
             or (rope_type == "default" and model_type in _hf_models.DEFAULT_TYPE_WHOLE)))
    if per_layer and rope_type == "yarn":
        # transformers reads truncate from the top-level rope dict, which per layer type
        # holds none: the default, True
        scaling.pop("truncate", None)
    if not conv.mscale:
        for name in _MSCALES:
            scaling.pop(name, None)  # only Phi-3.5-MoE's rotary module reads them
    if rope_type == "dynamic" and not (conv.mscale and "short_mscale" in scaling):
        # transformers' dynamic NTK grows the base past the config's
        # max_position_embeddings, whatever the rope dict says (it warns of the key);
        # Phi-3.5-MoE's module never grows it and switches its mscale at the key
        scaling.pop("original_max_position_embeddings", None)
    # transformers moves a top-level original length (Phi-3) into a flat dict for these
    # types only; a layer type's entry keeps its own, or takes max_position_embeddings
    original = _hf_get(config, "original_max_position_embeddings")
    if rope_type in ("llama3", "yarn", "longrope") and original is not None and not per_layer:
        scaling["original_max_position_embeddings"] = original

    max_positions = _hf_get(config, "max_position_embeddings", "n_positions")
    if max_positions is not None:
        max_positions = _checks.count(max_positions, "max_position_embeddings", minimum=1, whole_float=True)
    if theta is None:
        theta = _hf_top_level_base(config, model_type, conv)
    if part is not None:
        head_dim, rotary_dim, features, indexer_style = _hf_indexer(config, model_type)
    elif conv.width_key is not None:
        head_dim, rotary_dim, features = _hf_mla_width(
            config, conv, layer_type, partial,
            rope_type == "default" and model_type in _hf_models.MLA_DEFAULT_HEAD_DIM)
    else:
        head_dim = _hf_head_dim(config, layer_type)
        if conv.width_rule == "clvp":
            rotary_dim = _hf_clvp_width(config, head_dim)
        elif whole:
            rotary_dim = _rotary_width(head_dim, None, "head_dim", dim_name="head_dim")
        else:
            # a top-level partial_rotary_factor: moved by transformers into flat rope
            # parameters only, and not read by families of fixed_base at all
            rotary_dim = _hf_rotary_dim(config, head_dim, partial, model_type,
                                        top_partial=conv.fixed_base is None and not per_layer)
        features = (0, head_dim)
        if conv.trailing:
            features = (head_dim - rotary_dim, head_dim)
            head_dim = rotary_dim
    if part is not None:
        interleaved = indexer_style == "gptj"
    elif conv.style is not None:
        interleaved = conv.style == "gptj" or bool(_hf_get(config, "rope_interleave"))
    else:
        flag = _hf_get(config, "rope_interleave")
        interleaved = conv.interleave if flag is None else bool(flag)
    return {
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "base": _hf_base(theta, ntk_alpha, head_dim),
        "scaling": None if rope_type == "default" else scaling,
        "max_position_embeddings": max_positions,
        "style": "gptj" if interleaved else "neox",
        "features": features,
        "inverse": conv.inverse,
    }


_Parser = Callable[[int, float, Mapping[str, Any], int | None, int | None], RopeSpec]


# -- parsing ---------------------------------------------------------------------------


def _freeze(value: object) -> tuple[object, ...]:
    # Type-tagged so that e.g. True and 1 (equal and hash-equal) stay distinct cache keys.
    # A list inside a list stays unhashable, and such a dict is simply parsed uncached.
    if isinstance(value, (list, tuple)):
        return (list, tuple(value), tuple(map(type, value)))
    return (type(value), value)


def _thaw(frozen: tuple[Any, ...]) -> object:
    return list(frozen[1]) if frozen[0] is list else frozen[1]


@lru_cache(maxsize=256, typed=True)
def _parse_cached(dim: object, base: object,
                  frozen_scaling: tuple[tuple[str, tuple[Any, ...]], ...] | None,
                  max_position_embeddings: object) -> RopeSpec:
    scaling = None if frozen_scaling is None else {k: _thaw(v) for k, v in frozen_scaling}
    return _parse(dim, base, scaling, max_position_embeddings)


# Equal specs reached through different spellings (base=None or 10000.0, scaling=None or
# {"rope_type": "default"}) share one instance, hence one frequency cache.
_INTERNED: weakref.WeakValueDictionary[tuple[object, ...], RopeSpec] = weakref.WeakValueDictionary()


def _intern(spec: RopeSpec) -> RopeSpec:
    # Keyed by the compared fields rather than the spec itself, which would keep it alive.
    key = tuple(getattr(spec, f.name) for f in fields(spec) if f.compare)
    return _INTERNED.setdefault(key, spec)


def _parse(dim: object, base: object, scaling: object, max_position_embeddings: object) -> RopeSpec:
    head_dim = _checks.count(dim, "dim", minimum=1, whole_float=True)
    if max_position_embeddings is not None:
        max_position_embeddings = _checks.count(max_position_embeddings, "max_position_embeddings",
                                                minimum=1, whole_float=True)
    if scaling is None:
        scaling = {}
    elif not isinstance(scaling, Mapping):
        raise TypeError(
            f"scaling must be a dict (a rope_scaling mapping) or None, got {type(scaling).__name__}"
        )

    rope_type = _rope_type(scaling)
    base = _resolve_base(base, scaling)
    partial = scaling.get("partial_rotary_factor")
    if rope_type == "proportional":
        # The factor zeroes frequencies instead of narrowing the rotation.
        rotary_dim = _rotary_width(head_dim, None, _key("partial_rotary_factor"))
    else:
        rotary_dim = _rotary_width(head_dim, partial, _key("partial_rotary_factor"))
    original = None
    if rope_type in _NEEDS_ORIGINAL_LENGTH:
        original = _original_length(rope_type, scaling, max_position_embeddings)
    spec = _intern(_with_mscales(_PARSERS[rope_type](rotary_dim, base, scaling, original,
                                                     max_position_embeddings), scaling))
    _check_attention_scaling(spec.attention_scaling,
                             [k for k in ("attention_factor", "mscale", "mscale_all_dim",
                                          "factor") if k in scaling])
    # out-of-range derived frequencies are an error of the configuration, raised here
    # rather than at the first call (longrope: both sets of factors)
    spec.frequencies()
    if rope_type == "longrope":
        assert original is not None
        spec.frequencies(original + 1)
    return spec


def _check_attention_scaling(value: float, keys: Sequence[str]) -> None:
    """cos and sin are multiplied by the attention scaling in float32 for every storage
    dtype but float64: it must be a normal float32. `keys`: the scaling fields it
    comes from."""
    if not ATTENTION_SCALING_RANGE[0] <= value <= ATTENTION_SCALING_RANGE[1]:
        source = [_key(k) for k in keys]
        raise ValueError(
            f"the attention scaling {value!r} derived from {', '.join(source) or 'scaling'} "
            f"must be in [{ATTENTION_SCALING_RANGE[0]:.4g}, {ATTENTION_SCALING_RANGE[1]:.4g}] "
            f"(a normal float32: cos and sin are scaled in float32)"
        )


def _rope_type(scaling: Mapping[str, Any]) -> str:
    rope_type = scaling.get("rope_type")
    if rope_type is None:
        rope_type = scaling.get("type")
    if rope_type is None:
        return "default"
    if not isinstance(rope_type, str):
        raise TypeError(f"{_key('rope_type')} must be a string, got {type(rope_type).__name__}")
    if rope_type not in _PARSERS:
        raise ValueError(
            f"unknown RoPE scaling type {rope_type!r} in {_key('rope_type')}; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return rope_type


def _resolve_base(base: object, scaling: Mapping[str, Any]) -> float:
    theta = scaling.get("rope_theta")
    if theta is not None:
        theta = _checks.real(theta, _key("rope_theta"), positive=True)
    if base is None:
        return DEFAULT_BASE if theta is None else theta
    base = _checks.real(base, "base", positive=True)
    if theta is not None and base != theta:
        raise ValueError(
            f"base={base!r} contradicts {_key('rope_theta')}={theta!r}; "
            "pass one of them, or equal values"
        )
    return base


# the most float64 values an array can hold
_MAX_FREQUENCIES = np.iinfo(np.intp).max // 8


def _rotary_width(head_dim: int, partial: object, name: str, dim_name: str = "dim") -> int:
    """int(head_dim * partial), truncated as transformers does; it must be even, and
    its frequencies fit an array."""
    if head_dim // 2 > _MAX_FREQUENCIES:
        raise ValueError(f"{dim_name}={head_dim} asks for {head_dim // 2} frequencies: more "
                         f"float64 values than an array can hold")
    if partial is None:
        if head_dim % 2:
            raise ValueError(
                f"{dim_name} must be even (RoPE rotates pairs of features), got {head_dim}"
            )
        return head_dim
    partial = _checks.real(partial, name, positive=True)
    if partial > 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {partial!r}")
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"rotary width int({head_dim} * {name}={partial!r}) = {rotary_dim} "
            "must be even and at least 2"
        )
    return rotary_dim


def _original_length(rope_type: str, scaling: Mapping[str, Any],
                     max_position_embeddings: int | None) -> int:
    original = scaling.get("original_max_position_embeddings")
    if original is not None:
        return _checks.count(original, _key("original_max_position_embeddings"), minimum=1, whole_float=True)
    if max_position_embeddings is None:
        raise ValueError(
            f"rope type {rope_type!r} needs the original context length: give "
            f"{_key('original_max_position_embeddings')} or max_position_embeddings="
        )
    return max_position_embeddings


def _required(scaling: Mapping[str, Any], name: str, rope_type: str) -> object:
    value = scaling.get(name)
    if value is None:
        raise ValueError(f"{_key(name)} is required for rope type {rope_type!r}")
    return value


def _required_positive(scaling: Mapping[str, Any], name: str, rope_type: str) -> float:
    return _checks.real(_required(scaling, name, rope_type), _key(name), positive=True)


def _factor_or_ratio(scaling: Mapping[str, Any], rope_type: str, original: int,
                     max_position_embeddings: int | None) -> float:
    """``factor``, defaulting to max_position_embeddings / original as transformers does."""
    factor = scaling.get("factor")
    if factor is not None:
        return _checks.real(factor, _key("factor"), positive=True)
    if max_position_embeddings is None:
        raise ValueError(
            f"{_key('factor')} is required for rope type {rope_type!r} unless "
            "max_position_embeddings= is given (factor = max_position_embeddings / original)"
        )
    return max_position_embeddings / original


def _parse_default(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                   max_position_embeddings: int | None) -> RopeSpec:
    return RopeSpec("default", dim, base)


def _parse_linear(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                  max_position_embeddings: int | None) -> RopeSpec:
    factor = _required_positive(scaling, "factor", "linear")
    return RopeSpec("linear", dim, base, factor=factor)


def _parse_dynamic(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                   max_position_embeddings: int | None) -> RopeSpec:
    factor = _required_positive(scaling, "factor", "dynamic")
    return RopeSpec("dynamic", dim, base, original, factor)


def _parse_yarn(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                max_position_embeddings: int | None) -> RopeSpec:
    assert original is not None  # _parse resolves it for this type
    if base == 1.0:
        raise ValueError("yarn needs base != 1 (its correction range divides by log(base))")
    factor = _factor_or_ratio(scaling, "yarn", original, max_position_embeddings)
    beta_fast = _optional_positive(scaling, "beta_fast", 32.0)
    beta_slow = _optional_positive(scaling, "beta_slow", 1.0)
    if beta_fast < beta_slow:
        raise ValueError(
            f"{_key('beta_fast')}={beta_fast!r} must be >= {_key('beta_slow')}={beta_slow!r}"
        )
    truncate = scaling.get("truncate")
    if truncate is None:
        truncate = True
    elif not isinstance(truncate, (bool, np.bool_)):
        raise TypeError(f"{_key('truncate')} must be a bool, got {type(truncate).__name__}")
    params = (("beta_fast", beta_fast), ("beta_slow", beta_slow), ("truncate", bool(truncate)))
    attention = _yarn_attention_factor(scaling, factor)
    return RopeSpec("yarn", dim, base, original, factor, attention, params)


def _yarn_attention_factor(scaling: Mapping[str, Any], factor: float) -> float:
    given = scaling.get("attention_factor")
    if given is not None:
        return _checks.real(given, _key("attention_factor"), positive=True)
    mscale = _optional_real(scaling, "mscale")
    mscale_all_dim = _optional_real(scaling, "mscale_all_dim")
    # Both must be set and non-zero: the truthiness test transformers applies.
    if not (mscale and mscale_all_dim):
        return _yarn_mscale(factor, 1.0)
    numerator = _yarn_mscale(factor, mscale)
    denominator = _yarn_mscale(factor, mscale_all_dim)
    if numerator <= 0 or denominator <= 0:
        raise ValueError(
            f"{_key('mscale')}={mscale!r} and {_key('mscale_all_dim')}={mscale_all_dim!r} "
            f"give a non-positive attention factor for factor={factor!r}"
        )
    return numerator / denominator


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def _parse_longrope(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                    max_position_embeddings: int | None) -> RopeSpec:
    assert original is not None  # _parse resolves it for this type
    short = _factor_list(scaling, "short_factor", dim)
    long = _factor_list(scaling, "long_factor", dim)
    given = scaling.get("attention_factor")
    # factor only feeds the default attention factor, so it is resolved only when needed.
    factor = None
    if scaling.get("factor") is not None or given is None:
        factor = _factor_or_ratio(scaling, "longrope", original, max_position_embeddings)
    if given is not None:
        attention = _checks.real(given, _key("attention_factor"), positive=True)
    else:
        assert factor is not None
        if factor <= 1.0:
            attention = 1.0
        elif original < 2:
            raise ValueError(
                f"{_key('original_max_position_embeddings')} must be >= 2 for longrope's "
                "default attention factor (it divides by its log)"
            )
        else:
            attention = math.sqrt(1.0 + math.log(factor) / math.log(original))
    params: tuple[tuple[str, Any], ...] = (("short_factor", short), ("long_factor", long))
    return RopeSpec("longrope", dim, base, original, factor, attention, params)


def _with_mscales(spec: RopeSpec, scaling: Mapping[str, Any]) -> RopeSpec:
    """`spec` with Phi-3.5-MoE's ``short_mscale`` and ``long_mscale``, which its rotary
    module applies with every rope type but default: they replace the attention factor
    on their side of ``original_max_position_embeddings`` (read from the dict, as the
    module reads it), and the frequencies are those formed without a sequence length."""
    mscales = [scaling.get(name) for name in _MSCALES]
    if spec.rope_type == "default" or all(m is None for m in mscales):
        return spec
    if None in mscales:
        raise ValueError(f"{_key('short_mscale')} and {_key('long_mscale')} go together; "
                         "give both or neither")
    original = scaling.get("original_max_position_embeddings")
    if original is None:
        raise ValueError(f"{_key('short_mscale')} and {_key('long_mscale')} switch at "
                         f"{_key('original_max_position_embeddings')}, which is not given")
    original = _checks.count(original, _key("original_max_position_embeddings"), minimum=1,
                             whole_float=True)
    values = tuple((name, _checks.real(m, _key(name), positive=True))
                   for name, m in zip(_MSCALES, mscales))
    for name, value in values:
        _check_attention_scaling(value, (name,))
    # the scaling of a call within the original length, as frequencies(None) gives it
    return replace(spec, original_max_position_embeddings=original,
                   attention_scaling=values[0][1], params=spec.params + values)


_MSCALES = ("short_mscale", "long_mscale")


def _factor_list(scaling: Mapping[str, Any], name: str, dim: int) -> tuple[float, ...]:
    values = _required(scaling, name, "longrope")
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise TypeError(f"{_key(name)} must be a list of numbers, got {type(values).__name__}")
    if len(values) != dim // 2:
        raise ValueError(
            f"{_key(name)} must have rotary_dim // 2 = {dim // 2} entries, got {len(values)}"
        )
    return tuple(_checks.real(v, f"{_key(name)}[{i}]", positive=True) for i, v in enumerate(values))


def _parse_llama3(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                  max_position_embeddings: int | None) -> RopeSpec:
    factor = _required_positive(scaling, "factor", "llama3")
    low = _required_positive(scaling, "low_freq_factor", "llama3")
    high = _required_positive(scaling, "high_freq_factor", "llama3")
    # equal factors (Llama 4 Scout's 1.0 and 1.0) leave no band to blend: each
    # frequency is kept or divided by factor
    if low > high:
        raise ValueError(
            f"{_key('low_freq_factor')}={low!r} must be <= {_key('high_freq_factor')}={high!r}"
        )
    params = (("low_freq_factor", low), ("high_freq_factor", high))
    return RopeSpec("llama3", dim, base, original, factor, 1.0, params)


def _parse_proportional(dim: int, base: float, scaling: Mapping[str, Any], original: int | None,
                        max_position_embeddings: int | None) -> RopeSpec:
    partial = scaling.get("partial_rotary_factor")
    partial = 1.0 if partial is None else _checks.real(partial, _key("partial_rotary_factor"), positive=True)
    if partial > 1.0:
        raise ValueError(f"{_key('partial_rotary_factor')} must be in (0, 1], got {partial!r}")
    factor = _optional_positive(scaling, "factor", 1.0)
    # int(p * dim // 2) rotating pairs, as transformers rounds it (float floor division).
    rotating = int(partial * dim // 2)
    params = (("rotating_pairs", rotating),)
    return RopeSpec("proportional", dim, base, factor=factor, params=params)


_PARSERS: dict[str, _Parser] = {
    "default": _parse_default,
    "linear": _parse_linear,
    "dynamic": _parse_dynamic,
    "yarn": _parse_yarn,
    "longrope": _parse_longrope,
    "llama3": _parse_llama3,
    "proportional": _parse_proportional,
}


# -- value checks ----------------------------------------------------------------------


def _key(name: str) -> str:
    return f"scaling[{name!r}]"


def _optional_real(scaling: Mapping[str, Any], name: str) -> float | None:
    value = scaling.get(name)
    return None if value is None else _checks.real(value, _key(name))


def _optional_positive(scaling: Mapping[str, Any], name: str, default: float) -> float:
    value = scaling.get(name)
    return default if value is None else _checks.real(value, _key(name), positive=True)


# -- frequencies -----------------------------------------------------------------------


def _plain_inv_freq(dim: int, base: float) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _default_inv_freq(spec: RopeSpec, regime: Regime) -> np.ndarray:
    return _plain_inv_freq(spec.dim, spec.base)


def _linear_inv_freq(spec: RopeSpec, regime: Regime) -> np.ndarray:
    return _plain_inv_freq(spec.dim, spec.base) / spec.factor


def _dynamic_inv_freq(spec: RopeSpec, length: Regime) -> np.ndarray:
    dim, base, factor = spec.dim, spec.base, spec.factor
    original = spec.original_max_position_embeddings
    assert length is not None and original is not None and factor is not None
    # With dim == 2 the only exponent is 0, so the base (and d / (d - 2)) is irrelevant.
    if not (length > original and dim > 2):
        return _plain_inv_freq(dim, base)
    growth = factor * length / original - (factor - 1.0)
    if not growth > 0.0:  # only a factor near 1 / float64 epsilon rounds it away
        raise ValueError(f"{_key('factor')}={factor!r} is too large for dynamic NTK at "
                         f"{length} positions: the base's growth rounds to {growth!r}")
    # base * growth ** (d / (d - 2)), raised to -2i / d, is the plain frequency of pair i
    # times growth ** (-i / (d/2 - 1)) = exp(-i * step); exp(-(8a + b) * step) is taken
    # as exp(-8a * step) * exp(-b * step), 8 + d/16 exps instead of d/2, within two
    # roundings. Each decode step past the original length has a growth of its own, which
    # the compiled decode path (rope.pxi dynamic_ntk_inv_freq) turns into frequencies in
    # C with the same operations in the same order, so that the two agree bit for bit.
    # Both use the C library's exp and log, one value at a time: NumPy's may be SIMD
    # functions of its own (SVML on AVX-512) that differ in the last bit.
    half = dim // 2
    step = math.log(growth) / (half - 1)
    low = np.array([math.exp(-(b * step)) for b in range(_DYNAMIC_SPLIT)])
    high = np.array([math.exp(-((_DYNAMIC_SPLIT * a) * step))
                     for a in range(-(-half // _DYNAMIC_SPLIT))])
    pair = np.arange(half)
    inv_freq: np.ndarray = (_plain_inv_freq(dim, base) * high[pair // _DYNAMIC_SPLIT]
                            * low[pair % _DYNAMIC_SPLIT])
    return inv_freq


def _yarn_correction_dim(rotations: float, dim: int, base: float, original: int) -> float:
    """The (fractional) feature index whose wavelength fits ``rotations`` times in ``original``."""
    return dim * math.log(original / (rotations * 2.0 * math.pi)) / (2.0 * math.log(base))


def _yarn_inv_freq(spec: RopeSpec, regime: Regime) -> np.ndarray:
    params = dict(spec.params)
    dim, base, original = spec.dim, spec.base, spec.original_max_position_embeddings
    assert original is not None and spec.factor is not None
    low = _yarn_correction_dim(params["beta_fast"], dim, base, original)
    high = _yarn_correction_dim(params["beta_slow"], dim, base, original)
    if params["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp; kept for agreement
    # ramp 0: high-frequency pairs, extrapolated (kept); ramp 1: low-frequency pairs,
    # interpolated (divided by factor); linear in between.
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolated = _plain_inv_freq(dim, base)
    interpolated = extrapolated / spec.factor
    return interpolated * ramp + extrapolated * (1.0 - ramp)


def _longrope_inv_freq(spec: RopeSpec, use_long: Regime) -> np.ndarray:
    params = dict(spec.params)
    factors = np.array(params["long_factor" if use_long else "short_factor"], dtype=np.float64)
    return _plain_inv_freq(spec.dim, spec.base) / factors


def _llama3_inv_freq(spec: RopeSpec, regime: Regime) -> np.ndarray:
    params = dict(spec.params)
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    original, factor = spec.original_max_position_embeddings, spec.factor
    assert original is not None and factor is not None
    inv_freq = _plain_inv_freq(spec.dim, spec.base)
    wavelen = 2.0 * math.pi / inv_freq
    if low == high:
        if np.any(wavelen == original / low):
            # transformers' blend divides 0 by 0 there: a NaN frequency
            raise ValueError(f"llama3 scaling with {_key('low_freq_factor')} == "
                             f"{_key('high_freq_factor')} == {low!r}: a wavelength equal to "
                             f"original_max_position_embeddings / {low!r} has no frequency")
        return np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    # Short wavelengths (< original / high) are kept, long ones (> original / low) are
    # divided by factor, and the band between is blended.
    return np.where(
        wavelen < original / high,
        inv_freq,
        np.where(wavelen > original / low, inv_freq / factor, blended),
    )


def _proportional_inv_freq(spec: RopeSpec, regime: Regime) -> np.ndarray:
    # The first pairs keep the frequencies of the full head width; the rest get 0 and
    # stay unrotated (cos 1, sin 0), so the head width still pairs j with j + dim/2.
    inv_freq = np.zeros(spec.dim // 2, dtype=np.float64)
    rotating = dict(spec.params)["rotating_pairs"]
    inv_freq[:rotating] = _plain_inv_freq(spec.dim, spec.base)[:rotating]
    assert spec.factor is not None
    return inv_freq / spec.factor


_INV_FREQ: dict[str, Callable[[RopeSpec, Regime], np.ndarray]] = {
    "default": _default_inv_freq,
    "linear": _linear_inv_freq,
    "dynamic": _dynamic_inv_freq,
    "yarn": _yarn_inv_freq,
    "longrope": _longrope_inv_freq,
    "llama3": _llama3_inv_freq,
    "proportional": _proportional_inv_freq,
}


# -- Hugging Face configs --------------------------------------------------------------


def _hf_plain(config: object) -> object:
    """A transformers config object as its dict: its per-layer attributes (Gemma 4) raise
    on plain attribute access, and the dict is what config.json users have anyway."""
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else config


# Sub-configs that hold a whole model of their own: the RoPE is in one of them.
_SUB_CONFIG_SUFFIXES = ("_config", "encoder", "decoder")


def _hf_refuse(config: object, model_type: object) -> None:
    if model_type in _hf_models.NO_ROPE:
        raise ValueError(f"model_type {model_type!r} has no rotary position embedding in "
                         "transformers: its attention does not rotate q and k")
    reason = _hf_models.REFUSED.get(model_type) if isinstance(model_type, str) else None
    if reason is not None:
        raise ValueError(f"model_type {model_type!r}: {reason}; fastpe does not reproduce it")
    # a checked family's code reads it where its Convention.requires says (ESM, Evolla,
    # Granite-4.0-H), no other's (Command-R7B's config.json says "rope_gptj"); a custom
    # model's may
    kind = (_hf_get(config, "position_embedding_type")
            if model_type not in _hf_models.CHECKED else None)
    if isinstance(kind, str) and "rot" not in kind and kind != "rope":
        raise ValueError(f"config has position_embedding_type={kind!r}: this model does not "
                         "use rotary embeddings")
    if not isinstance(config, Mapping):
        return
    subs = [k for k, v in config.items() if isinstance(v, Mapping)
            and k.endswith(_SUB_CONFIG_SUFFIXES) and k != "per_layer_config"]
    # A model whose own attention has RoPE keeps its rope keys at the top (Chameleon
    # beside its VQ config); a wrapper of several models has them only inside.
    if subs and not {"rope_parameters", "rope_scaling", "rope_theta"} & set(config):
        raise ValueError(
            f"config of model_type {model_type!r} is composite ({', '.join(subs)}); pass the "
            f"sub-config of the attention you want, e.g. config[{subs[0]!r}]"
        )
    if not subs and model_type in _hf_models.COMPOSITE and model_type not in _hf_models.MODELS:
        raise ValueError(
            f"model_type {model_type!r} is a composite config in transformers, but this one "
            "has no sub-configs: its rotary embedding is a sub-model's; pass that sub-config "
            "(text_config, vision_config, ...) as transformers builds it"
        )




def hf_requirements(config: object, model_type: str | None) -> None:
    """A ValueError where the config lacks what the family needs to rotate at all
    (Zamba2's use_mem_rope, Falcon's alibi False, Bamba's attn_layer_indices)."""
    conv = _hf_models.convention(model_type)
    for key, value, default in conv.requires:
        given = _hf_get(config, key)
        if (default if given is None else given) != value:
            raise ValueError(f"config has {key}={given!r}: model_type {model_type!r} "
                             f"applies rotary embeddings only with {key}={value!r}")
    for key in conv.needs:
        if _hf_get(config, key) is None:
            raise ValueError(f"config has no {key}: model_type {model_type!r} rotates q and k "
                             "only in the attention layers that key lists, and without it "
                             "no layer has attention")


def _hf_refuse_flat_rope(config: Mapping[str, Any], model_type: str, given_dict: bool) -> None:
    """Refuse the rope dict of a family that rotates each layer type by its own entry,
    where the dict is not one entry per layer type."""
    name, rope = _hf_rope_dict(config)
    advice = ("; give the config object (AutoConfig.from_pretrained) or its to_dict()"
              if given_dict else "")
    entries = [str(k) for k, v in rope.items() if isinstance(v, Mapping)] if isinstance(
        rope, Mapping) else []
    if entries:
        flat = [str(k) for k, v in rope.items() if not isinstance(v, Mapping)]
        raise ValueError(
            f"config {name} of model_type {model_type!r} holds rope parameters per layer "
            f"type ({', '.join(entries)}) beside flat keys ({', '.join(flat)}), whose reading "
            f"(dropped or merged by its config class) fastpe does not derive" + advice)
    raise ValueError(
        f"config of model_type {model_type!r} has no rope parameters per layer type: "
        "its config class makes them from the flat keys of "
        + ("an older config.json " if given_dict else "")
        + "(rope_theta, rope_local_base_freq, global_rope_theta, rope_scaling, ...), "
        "each layer type its own, which fastpe does not derive" + advice)


def hf_config(config: object) -> tuple[object, str | None]:
    """(the config as its dict, or the object itself where it has no to_dict; its model
    type), or TypeError / ValueError for what is not a config."""
    if config is None or isinstance(config, (str, bytes, int, float, Sequence)):
        raise TypeError(f"config must be a transformers config or its dict (config.json), "
                        f"got {type(config).__name__}")
    # a config.json dict, where the config object may hold what its class derives
    given_dict = isinstance(config, Mapping)
    if not given_dict:
        _hf_refuse_transformers_4(config)
    config = _hf_plain(config)
    model_type = _hf_get(config, "model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise TypeError(f"config model_type must be a string, got {type(model_type).__name__}")
    if isinstance(config, Mapping) and model_type:
        if (model_type in _hf_models.PER_LAYER_CONFIG
                and _hf_get(config, "per_layer_config") is None):
            raise ValueError(
                f"config has no per_layer_config: model_type {model_type!r}'s config "
                "class makes one (head widths per layer, from global_head_dim or its "
                "defaults), which fastpe does not derive; give the config object, its "
                "to_dict(), or the config.json save_pretrained writes")
        if model_type in _hf_models.ROPE_PER_LAYER_TYPE and not _hf_rope_per_layer(config):
            _hf_refuse_flat_rope(config, model_type, given_dict)
        unread = (("head_dim",) if model_type in _hf_models.HEAD_DIM_UNREAD else ()) + (
            ("rope_scaling",) if model_type in _hf_models.ROPE_SCALING_UNREAD else ())
        if unread:
            config = {k: v for k, v in config.items() if k not in unread}
        if "transformers_version" not in config:
            _hf_refuse_incomplete_entries(config, model_type)
            config = _hf_class_fill(config, model_type)
        elif "head_dim" not in config and "head_dim" in _class_defaults(config, model_type):
            # one transformers wrote holds its class's head_dim (a partial factor it may
            # keep in the rope parameters instead): without one (edited out, or newer than
            # the writer) the class takes its default, not hidden_size / heads
            config = {**config, "head_dim": _hf_models.CLASS_DEFAULTS[model_type]["head_dim"]}
    if model_type == "":
        raise ValueError(
            "config has an empty model_type: transformers gives that to sub-configs of "
            "composite models (an adaptor, an encoder of a protein or speech model, ...), "
            "whose attention fastpe cannot tell from their keys; fastpe does not load it")
    return config, model_type


# rope types whose transformers 4 code reads other keys than transformers 5's: LongRoPE
# its switch length from the top-level original_max_position_embeddings, else
# max_position_embeddings, never from its rope_scaling dict; YaRN its original length
# from max_position_embeddings where 5 moves a top-level original_max_position_embeddings
# into the rope parameters (and before 4.47 neither the dict's original length nor its
# mscale): a model of 4 rotates otherwise than fastpe's reading of its config
_TRANSFORMERS_4_READS_OTHERWISE = ("yarn", "longrope")


def _hf_refuse_transformers_4(config: object) -> None:
    """A ValueError for a config object of a transformers older than 5 (imported in this
    process) whose rope type that version reads otherwise than 5, whose code fastpe
    reproduces (Phi-3's "su" is its LongRoPE), or which holds rope_parameters, which 4
    never reads. Its other rope types read the same keys; a dict is read as 5 reads it."""
    utils = sys.modules.get("transformers.configuration_utils")
    base = getattr(utils, "PretrainedConfig", None)
    if not isinstance(base, type) or not isinstance(config, base):
        return
    version = str(getattr(sys.modules.get("transformers"), "__version__", ""))
    major = version.split(".")[0]
    if not major.isdigit() or int(major) >= 5:
        return
    if getattr(config, "rope_parameters", None) is not None:
        raise ValueError(
            f"config is a transformers {version} config holding rope_parameters (a "
            f"config.json of transformers 5?), which transformers 4 does not read: its "
            f"model rotates by rope_scaling and rope_theta alone; fastpe reproduces "
            f"transformers 5 (>= 5.24); upgrade transformers")
    rope = getattr(config, "rope_scaling", None)
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, Mapping) else None
    model_type = getattr(config, "model_type", None)
    renames = _hf_models.ROPE_TYPE_RENAMES.get(model_type if isinstance(model_type, str)
                                               else "", {})
    rope_type = renames.get(rope_type, rope_type) if isinstance(rope_type, str) else rope_type
    if rope_type in _TRANSFORMERS_4_READS_OTHERWISE:
        raise ValueError(
            f"config is a transformers {version} config with rope_type {rope_type!r}: "
            f"transformers 4 reads its original context length from other keys than "
            f"transformers 5 (LongRoPE never from rope_scaling; YaRN from "
            f"max_position_embeddings), and fastpe reproduces transformers 5 (>= 5.24); "
            f"upgrade transformers")


def _hf_refuse_incomplete_entries(config: Mapping[str, Any], model_type: str) -> None:
    """A hand-typed dict whose rope parameters per layer type leave a base or a partial
    factor to the config class: each class fills an entry's base from keys and defaults
    of its own (Gemma 3's sliding layers from rope_local_base_freq, else 10000, its full
    ones from rope_theta, else 1e6; ModernBERT's 160000 and 10000), and copies a top-level
    partial_rotary_factor into every entry, which fastpe does not derive."""
    scaling = _hf_rope_dict(config)[1]
    if not (isinstance(scaling, Mapping) and _is_per_layer_type(scaling)):
        return
    # a top-level factor is copied into the entries, and read there unless the whole head
    # rotates whatever an entry says
    whole = ((model_type in _hf_models.WHOLE_HEAD or model_type in _hf_models.DEFAULT_TYPE_WHOLE)
             and model_type not in _hf_models.ENTRY_PARTIAL)
    filled = ((config.get("partial_rotary_factor") is not None and not whole)
              or model_type in _hf_models.ENTRY_PARTIAL_FILLED)
    for layer_type, entry in scaling.items():
        if not isinstance(entry, Mapping):
            continue
        missing = [key for key, absent in (
            ("rope_theta", "rope_theta" not in entry),
            ("partial_rotary_factor", filled and "partial_rotary_factor" not in entry))
            if absent]
        if missing:
            raise ValueError(
                f"config of model_type {model_type!r} (a dict without transformers_version: "
                f"typed, not written by transformers) has rope parameters for layer type "
                f"{layer_type!r} without {' or '.join(missing)}, which its config class fills "
                "in from keys and defaults of its own; give each layer type's entry its "
                "own, or the config object (AutoConfig.from_pretrained) or its to_dict()")


def _hf_refuse_unchecked(model_type: str | None) -> None:
    version = _hf_models.TRANSFORMERS_VERSION
    if model_type in _hf_models.KNOWN and model_type not in _hf_models.CHECKED:
        raise ValueError(
            f"model_type {model_type!r} is a model type of transformers {version} whose "
            f"positional encoding fastpe has not checked against its transformers code "
            f"(only a model type transformers {version} does not know loads as Llama's)")
    installed = (None if model_type in _hf_models.KNOWN
                 else installed_transformers_knows(model_type))
    if installed is not None:
        raise ValueError(
            f"model_type {model_type!r} is a model type of the transformers {installed} this "
            f"process imported, newer than the transformers {version} whose model types "
            f"fastpe has checked: its positional encoding is not checked (a model type "
            f"transformers does not know at all loads as Llama's)")


def installed_transformers_knows(model_type: str | None) -> str | None:
    """The version of the transformers this process has imported, where its config
    mapping has `model_type`; else None. Never imports transformers itself (seconds):
    a process that has not imported it is not asked."""
    transformers = sys.modules.get("transformers")
    if transformers is None or model_type is None:
        return None
    try:
        auto = importlib.import_module("transformers.models.auto.configuration_auto")
    except Exception:  # a transformers too old, too new or broken to say
        return None
    names = getattr(auto, "CONFIG_MAPPING_NAMES", None)
    if not isinstance(names, Mapping) or model_type not in names:
        return None
    return str(getattr(transformers, "__version__", "?"))


def _hf_whole_head(config: object, model_type: str | None, rope_type: str,
                   partial: object, top_level: bool = True) -> bool:
    """Whether the family's rotary module rotates the whole head whatever the config's
    partial_rotary_factor, rotary_pct or rotary_dim say (Llama's, and over a hundred other
    families'); a ValueError where transformers' frequencies would then cover part of the
    head while its attention rotates all of it, where the family's code fails on a partial
    width, or where the family is not known (a custom model may or may not read them).
    ``partial``: the rope dict's partial_rotary_factor; ``top_level``: whether a top-level
    one counts (False for rope parameters per layer type)."""
    whole = model_type in _hf_models.WHOLE_HEAD
    # transformers moves a top-level partial_rotary_factor into flat rope parameters,
    # where its shared frequency functions read it, and not into per-layer-type ones
    moved = partial if partial is not None or not top_level else _hf_get(
        config, "partial_rotary_factor")
    narrowed = moved is not None and moved != 1
    if model_type in _hf_models.PARTIAL_FAILS and narrowed:
        raise ValueError(
            f"model_type {model_type!r}: its config sets partial_rotary_factor={moved!r}, "
            "which its rotary module reads while its attention applies cos and sin to the "
            "whole head: the model's own code fails on this config")
    # a family whose default-type frequencies alone ignore the factor rotates the whole
    # head too, and fails the same way with another rope type
    if ((whole or model_type in _hf_models.DEFAULT_TYPE_WHOLE)
            and rope_type != "default" and narrowed):
        raise ValueError(
            f"model_type {model_type!r} rotates the whole head, but its config sets "
            f"partial_rotary_factor={moved!r} with rope_type {rope_type!r}, whose "
            "transformers frequencies cover only that part of it: the model's own code "
            "fails on this config")
    if not whole and model_type in _hf_models.KNOWN:
        return False
    given = [(name, value) for name, value in (
        ("rope parameters' partial_rotary_factor", partial),
        ("partial_rotary_factor", _hf_get(config, "partial_rotary_factor")),
        ("rotary_pct", _hf_get(config, "rotary_pct")),
        ("rotary_dim", _hf_get(config, "rotary_dim"))) if value is not None]
    if not whole and given:
        name, value = given[0]
        raise ValueError(
            f"config of model_type {model_type!r} sets {name}={value!r}: a model type "
            f"transformers {_hf_models.TRANSFORMERS_VERSION} does not know loads as Llama's, "
            "whose rotary module rotates the whole head whatever that key says, while other "
            "families rotate part of it; fastpe cannot tell which this model does (give "
            "RotaryEmbedding(head_dim, rotary_dim=...) directly)")
    return True


def _hf_indexer(config: object, model_type: str | None) -> tuple[int, int, tuple[int, int], str]:
    """(rotated width, rotary_dim, features of the indexer's head, style) of a lightning
    indexer, which rotates qk_rope_head_dim features of its index_head_dim-wide heads."""
    indexer = _hf_models.INDEXERS.get(model_type) if model_type is not None else None
    if indexer is None:
        raise ValueError(f"part='indexer': model_type {model_type!r} has no lightning indexer "
                         f"whose rotation fastpe has checked (those of "
                         f"{', '.join(sorted(_hf_models.INDEXERS))})")
    width = _hf_get(config, "qk_rope_head_dim")
    head = _hf_get(config, "index_head_dim")
    if width is None or head is None:
        raise ValueError("part='indexer' needs the config's qk_rope_head_dim and "
                         "index_head_dim (the indexer's rotated and whole head widths)")
    width = _checks.count(width, "qk_rope_head_dim", minimum=2, whole_float=True)
    head = _checks.count(head, "index_head_dim", minimum=1, whole_float=True)
    if width > head:
        raise ValueError(f"qk_rope_head_dim={width} is wider than index_head_dim={head}")
    rotary = _rotary_width(width, None, "qk_rope_head_dim", dim_name="qk_rope_head_dim")
    features = (head - width, head) if indexer.trailing else (0, width)
    return width, rotary, features, indexer.style


def _hf_get(config: object, *names: str) -> Any:
    """The first of ``names`` that the config sets to something other than None."""
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def _hf_head_dim(config: object, layer_type: str | None = None) -> int:
    head_dim = _hf_per_layer(config, "head_dim", layer_type)
    if head_dim is None:
        head_dim = _hf_get(config, "head_dim")
    if head_dim is not None:
        return _checks.count(head_dim, "head_dim", minimum=1, whole_float=True)
    hidden = _hf_get(config, "hidden_size", "n_embd")
    heads = _hf_get(config, "num_attention_heads", "n_head")
    if hidden is None or heads is None:
        raise ValueError(
            "config has no head_dim, and no hidden_size and num_attention_heads to derive it from"
        )
    hidden = _checks.count(hidden, "hidden_size", minimum=1, whole_float=True)
    return hidden // _checks.count(heads, "num_attention_heads", minimum=1, whole_float=True)


def _hf_per_layer(config: object, name: str, layer_type: str | None) -> object:
    """``name`` from ``per_layer_config`` (Gemma 4: layer index -> overrides) for the
    layers of ``layer_type``; None where no layer of that type overrides it."""
    per_layer = _hf_get(config, "per_layer_config")
    if not isinstance(per_layer, Mapping) or not per_layer:
        return None
    layer_types = _hf_get(config, "layer_types")
    if layer_type is None or not isinstance(layer_types, Sequence):
        if any(isinstance(v, Mapping) and name in v for v in per_layer.values()):
            raise ValueError(
                f"config sets {name} per layer (per_layer_config); choose the layers with "
                f"layer_type= (one of {', '.join(sorted(set(map(str, layer_types or ()))))})"
            )
        return None
    values = set()
    for index, kind in enumerate(layer_types):
        if kind != layer_type:
            continue
        overrides = per_layer.get(str(index), per_layer.get(f"{index:02d}", per_layer.get(index)))
        values.add(overrides.get(name) if isinstance(overrides, Mapping) else None)
    if len(values) > 1:
        raise ValueError(f"config's layers of type {layer_type!r} differ in {name} "
                         f"({sorted(map(str, values))}); fastpe needs one value per layer type")
    return next(iter(values), None)


def _hf_mla_width(config: object, conv: _hf_models.Convention, layer_type: str | None,
                  partial: object, default_type: bool) -> tuple[int, int, tuple[int, int]]:
    """(rotated width, rotary_dim, features of the query head) of an MLA config."""
    assert conv.width_key is not None and conv.offset_key is not None
    width = _hf_get(config, conv.width_key)
    if width is None:
        raise ValueError(f"config has no {conv.width_key}, the rotated width of this model's "
                         "latent attention")
    width = _checks.count(width, conv.width_key, minimum=2, whole_float=True)
    # transformers' MLA configs set head_dim to the rope width when config.json omits it
    # (LongCat-Flash's class keeps one of its own: hf_config); dots.llm3 sets it per
    # layer type.
    head_dim = _hf_per_layer(config, "head_dim", layer_type)
    if head_dim is None:
        head_dim = _hf_get(config, "head_dim")
    head_dim = width if head_dim is None else _checks.count(head_dim, "head_dim", minimum=1, whole_float=True)
    # transformers' module rotates int(head_dim * partial_rotary_factor) features: that
    # must be the rope part, or the config contradicts itself.
    if partial is None:
        partial = _hf_get(config, "partial_rotary_factor")
    if partial is not None and _rotary_width(head_dim, partial, "partial_rotary_factor") != width:
        raise ValueError(f"config's head_dim {head_dim} * partial_rotary_factor {partial!r} "
                         f"does not give {conv.width_key}={width}")
    if (partial is None or default_type) and head_dim != width:
        raise ValueError(f"config's head_dim {head_dim} differs from {conv.width_key}={width}: "
                         f"its rotary module would rotate head_dim features "
                         f"{'(default rope type) ' if default_type else ''}and the model's own "
                         "code fails on this config")
    offset = _hf_per_layer(config, conv.offset_key, layer_type)  # dots.llm3: per layer type
    if offset is None:
        offset = _hf_get(config, conv.offset_key)
    if offset is None:
        raise ValueError(f"config has no {conv.offset_key}, the width of the unrotated part "
                         "of each query head")
    offset = _checks.count(offset, conv.offset_key, minimum=0, whole_float=True)
    return width, _rotary_width(width, None, conv.width_key, dim_name=conv.width_key), (
        offset, offset + width)


def _hf_scaling(config: object, layer_type: str | None) -> dict[str, Any]:
    """A copy of the config's rope dict (rope_scaling wins when both are set, as in transformers)."""
    name, scaling = _hf_rope_dict(config)
    if scaling is None:
        return {}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"config {name} must be a dict or None, got {type(scaling).__name__}")
    if _is_per_layer_type(scaling):
        if layer_type is None:
            raise ValueError(
                f"config {name} has one entry per layer type ({', '.join(map(str, scaling))}); "
                "choose one with layer_type="
            )
        if scaling.get(layer_type) is None:
            raise ValueError(f"config {name} has no RoPE entry for layer_type={layer_type!r}")
        scaling = scaling[layer_type]
    return dict(scaling)


def _hf_rope_dict(config: object) -> tuple[str, Any]:
    """The key of the config's rope dict and its value: rope_scaling when it is set, as
    transformers reads it, else rope_parameters."""
    name = "rope_scaling" if _hf_get(config, "rope_scaling") else "rope_parameters"
    return name, _hf_get(config, name)


def _hf_rope_per_layer(config: object) -> bool:
    """Whether the config's rope dict is one entry per layer type."""
    scaling = _hf_rope_dict(config)[1]
    return isinstance(scaling, Mapping) and _is_per_layer_type(scaling)


def _is_per_layer_type(scaling: Mapping[str, Any]) -> bool:
    # transformers nests rope parameters by layer type (Gemma 3); a flat dict has scalars.
    return bool(scaling) and all(v is None or isinstance(v, Mapping) for v in scaling.values())


def _hf_clvp_width(config: object, head_dim: int) -> int:
    """CLVP's rotated width: max(projection_dim // (2 * num_attention_heads), 32)."""
    projection = _hf_get(config, "projection_dim")
    heads = _hf_get(config, "num_attention_heads")
    if projection is None or heads is None:
        raise ValueError("CLVP's rotary module sizes its rotated width from the config's "
                         "projection_dim and num_attention_heads, which this config lacks")
    projection = _checks.count(projection, "projection_dim", minimum=1, whole_float=True)
    heads = _checks.count(heads, "num_attention_heads", minimum=1, whole_float=True)
    width = max(projection // (2 * heads), 32)
    if width > head_dim:
        raise ValueError(f"CLVP rotates max(projection_dim // (2 * num_attention_heads), 32) "
                         f"= {width} features of heads of head_dim={head_dim}: the model's own "
                         "code fails on this config")
    if width % 2:
        # its frequencies are base^(-2i / width) over width + 1 rotated features
        raise ValueError(f"CLVP's rotary width max(projection_dim // (2 * "
                         f"num_attention_heads), 32) = {width} is odd: the model rotates "
                         f"{width + 1} features at frequencies of a {width}-wide spectrum, "
                         "which fastpe does not reproduce")
    return width


def _hf_base(theta: object, ntk_alpha: float | None, head_dim: int) -> float:
    """The config's base; with HunYuan's fixed NTK alpha, base * alpha^(d / (d - 2))."""
    base = DEFAULT_BASE if theta is None else _checks.real(theta, "rope_theta", positive=True)
    if ntk_alpha is None:
        return base
    if head_dim < 4:
        raise ValueError(f"HunYuan's NTK alpha needs head_dim >= 4, got {head_dim}")
    return base * float(ntk_alpha ** (head_dim / (head_dim - 2)))


def _hf_layer_partial(config: object, model_type: str | None, rope_type: str,
                      partial: object, scaling: dict[str, Any]) -> object:
    """The partial_rotary_factor that a layer type's rotary frequencies read, beside a
    top-level one. transformers' shared frequency functions (every rope type but the
    default) first copy the top-level factor into each layer type's entry that lacks one,
    then read the entry; a family's own default-type function reads the entry as it finds
    it, with a default of its own (MiMo-V2-Flash: 0.334, _hf_models.DEFAULT_TYPE_PARTIAL):
    the top-level factor reaches it only if another layer type's frequencies were built
    first, an order fastpe does not reproduce, so that case is refused."""
    top = _hf_get(config, "partial_rotary_factor")
    if rope_type == "proportional":
        if top is not None:
            scaling.setdefault("partial_rotary_factor", top)
        return partial
    if rope_type != "default":
        return top if partial is None else partial
    default = _hf_models.DEFAULT_TYPE_PARTIAL.get(model_type or "")
    shared = any(isinstance(entry, Mapping)
                 and entry.get("rope_type", entry.get("type", "default")) != "default"
                 for entry in (_hf_rope_dict(config)[1] or {}).values())
    if (top is not None and shared and (partial is None or partial == top)
            and top != (1.0 if default is None else default)
            and model_type not in _hf_models.DEFAULT_TYPE_WHOLE):
        raise ValueError(
            f"config of model_type {model_type!r} has rope parameters per layer type and a "
            f"top-level partial_rotary_factor={top!r}, which transformers copies into a "
            "default-type layer's parameters only if it builds another layer type's "
            "frequencies first: the rotated width depends on that order (the default "
            f"{1.0 if default is None else default} of the head or {top!r}); give each layer "
            "type its own partial_rotary_factor or drop the top-level one")
    return default if partial is None else partial


def _hf_top_level_base(config: object, model_type: str | None,
                       conv: _hf_models.Convention) -> object:
    """The base outside the rope parameters: GPT-NeoX's class reads rotary_emb_base
    (_hf_models.BASE_KEYS), other checked ones rope_theta; a model type transformers
    does not check may use either."""
    if model_type not in _hf_models.CHECKED:
        return _hf_get(config, "rope_theta", "rotary_emb_base", *conv.base_keys)
    key = _hf_models.BASE_KEYS.get(model_type) or "rope_theta"
    return _hf_get(config, key, *conv.base_keys)


def _class_defaults(config: Mapping[str, Any], model_type: str) -> dict[str, object]:
    """The class defaults of the keys `config` leaves out, where it gives no key the class
    stores as the same value (JetMoE's kv_channels is its head_dim)."""
    defaults = dict(_hf_models.CLASS_DEFAULTS.get(model_type, {}))
    for name, key in _hf_models.convention(model_type).aliases:
        if config.get(key) is not None:
            defaults.pop(name, None)
    return defaults


def _hf_class_fill(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """A dict transformers did not write, as the family's config class completes it
    (tables in _hf_models): the keys it leaves out; without rope_parameters and
    rope_scaling, the rope parameters the class makes (with a top-level base where the
    class reads one); with rope parameters but no base anywhere, the class's base."""
    out = {**_class_defaults(config, model_type), **config}
    if out.get("rope_parameters") is None and out.get("rope_scaling") is None:
        rope = _hf_models.ROPE_DEFAULTS.get(model_type)
        if rope is not None:
            rope = dict(rope)
            key = _hf_models.BASE_KEYS.get(model_type, "rope_theta")
            if key is not None and out.get(key) is not None:
                rope["rope_theta"] = out[key]
            out["rope_parameters"] = rope
    elif model_type in _hf_models.DEFAULT_THETA:
        out.setdefault(_hf_models.BASE_KEYS.get(model_type) or "rope_theta",
                       _hf_models.DEFAULT_THETA[model_type])
    return out


def _hf_rotary_dim(config: object, head_dim: int, partial: object,
                   model_type: str | None, top_partial: bool = True) -> int:
    """The rotated width of a family that reads partial_rotary_factor (the rope dict's,
    else the config's where top_partial and the family has no rotary_pct), or where it
    has one, its legacy key (_hf_models.WIDTH_KEYS) or that key's default."""
    if partial is not None:
        return _rotary_width(head_dim, partial, "partial_rotary_factor")
    legacy, default = _hf_models.WIDTH_KEYS.get(model_type or "", (None, None))
    names: tuple[str, ...] = ("partial_rotary_factor",) if top_partial else ()
    if legacy == "rotary_pct":
        # GPT-NeoX's config class puts rotary_pct (or its default) in the rope parameters,
        # whatever a top-level partial_rotary_factor says
        names = ("rotary_pct",)
    for name in names:
        value = _hf_get(config, name)
        if value is not None:
            return _rotary_width(head_dim, value, name)
    if legacy == "rotary_pct":
        return _rotary_width(head_dim, default, "rotary_pct")
    rotary_dim = None
    if legacy == "rotary_dim":
        rotary_dim = _hf_get(config, "rotary_dim")
        rotary_dim = default if rotary_dim is None else rotary_dim
    if rotary_dim is None:
        return _rotary_width(head_dim, None, "rotary_dim", dim_name="head_dim")
    rotary_dim = _checks.count(rotary_dim, "rotary_dim", minimum=2, whole_float=True)
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even and at most head_dim={head_dim}, got {rotary_dim}")
    return rotary_dim
