"""Which layers of a transformers model rotate q and k, layer index by layer index.

Most families rotate in every attention layer with one embedding. Others do not, and the
config says where, by layer index:

- by layer type (``layer_types``): Cohere 2's full attention and Qwen3-Next's linear
  attention use no positional encoding (NoPE); the types come from the layer trace of
  tests/data/make_hf_zoo_reference.py (``fastpe._hf_models.NOPE_LAYERS``); a config
  without ``layer_types`` has those its config class derives from other keys
  (``_DEFAULT_TYPES``; tests/data/make_hf_layer_types_reference.py checks them), and is
  refused where that needs a key it lacks;
- by a per-layer list: SmolLM3, Llama 4 and Mistral-Large-4 rotate only where
  ``no_rope_layers[layer_idx]`` is non-zero; MuseSpark and MuseGlimmer only where
  ``layer_rope_theta[layer_idx]`` is, and Granite SWA rotates each layer with that
  base (``0``: NoPE);
- by config values the modeling code tests per layer: Cohere 2 and Flint rotate their
  sliding layers only when ``sliding_window`` is set, EXAONE 4 every layer when it is
  None, Cohere2-MoE also its dense prefix layers when
  ``prefix_dense_sliding_window_pattern`` is 1.

:func:`select` checks the layers a ``from_hf_config`` call picks (``layer=``, else
``layer_type=``, else all) against that, as each family's transformers 5.25 code
decides it; tests/test_hf_zoo.py holds ``from_hf_config(config, layer=i)`` to the zoo
fixture's trace of every layer of every traced config (whether it rotated, at which
base).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from . import _checks, _hf_models
from ._rope_scaling import _hf_get, hf_requirements

__all__ = ["LEGACY_LAYER_TYPES", "RULES", "Layer", "select"]

_T = TypeVar("_T")

# transformers 5.25's _LEGACY_LAYER_TYPE_REMAP: the layer type names its configs rename
# when they load (an older config.json may hold the old ones).
LEGACY_LAYER_TYPES: dict[str, str] = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}

_MISSING = object()


class Layer(NamedTuple):
    """One decoder layer: its layer type (None where the config lists none), whether it
    rotates q and k, and its own rope_theta where the config sets one per layer."""

    kind: str | None
    rotates: bool
    theta: float | None = None


def _raw(config: object, key: str) -> object:
    """config[key] as stored, None included (_MISSING when absent): a config.json written
    with transformers' use_diff leaves out a key at its class default, so an explicit
    None differs from a missing key there."""
    if isinstance(config, Mapping):
        return config.get(key, _MISSING)
    return getattr(config, key, _MISSING)


def _layer_list(value: object, name: str, what: str,
                item: Callable[[object, str], _T]) -> list[_T]:
    """config[name], a list with one value per layer, each through item(value, its name)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TypeError(f"config {name} must be a list of {what}, one per layer, got "
                        f"{type(value).__name__}")
    return [item(v, f"{name}[{i}]") for i, v in enumerate(value)]


def _layer_int(v: object, name: str) -> int:
    return _checks.count(int(v) if isinstance(v, bool) else v, name, minimum=None,
                         whole_float=True)


def _layer_theta(v: object, name: str) -> float:
    theta = _checks.real(v, name)
    if theta < 0:
        raise ValueError(f"config {name} must be >= 0 (0: no RoPE), got {theta!r}")
    return theta


def _int_list(value: object, name: str) -> list[int]:
    return _layer_list(value, name, "ints", _layer_int)


def _theta_list(value: object, name: str) -> list[float]:
    return _layer_list(value, name, "numbers", _layer_theta)


def _bamba_types(config: object, count: int | None) -> list[str] | None:
    """Bamba's layers_block_type: its attn_layer_indices are attention, the rest mamba."""
    indices = _hf_get(config, "attn_layer_indices")
    if indices is None or count is None:
        return None
    chosen = set(_int_list(indices, "attn_layer_indices"))
    return ["full_attention" if i in chosen else "linear_attention" for i in range(count)]


def _recurrent_gemma_types(config: object, count: int | None) -> list[str] | None:
    """RecurrentGemma's layers_block_type: block_types (its class default: two recurrent
    blocks, then attention) repeated over the layers, recurrent (RG-LRU) blocks as
    linear_attention, attention ones as sliding_attention."""
    blocks = _hf_get(config, "block_types")
    blocks = ["recurrent", "recurrent", "attention"] if blocks is None else blocks
    if isinstance(blocks, (str, bytes, Mapping)) or not isinstance(blocks, Sequence) or not all(
            isinstance(b, str) for b in blocks):
        raise TypeError(f"config block_types must be a list of block names, got {blocks!r}")
    if count is None or not blocks:
        return None
    return ["linear_attention" if b == "recurrent" else "sliding_attention"
            for b in (list(blocks) * count)[:count]]


# model type -> (its layer types where its config class derives them from another key
# (the layers_block_type property, which transformers' attribute_map reads as
# layer_types and to_dict leaves out), that key)
_DERIVED_TYPES: dict[str, tuple[Callable[[object, int | None], list[str] | None], str]] = {
    "bamba": (_bamba_types, "attn_layer_indices"),
    "recurrent_gemma": (_recurrent_gemma_types, "block_types"),
}


def _period(config: object, key: str, default: int) -> int:
    """config[key], the period of a layer type pattern that a config class derives its
    layer_types from: its class default where the config leaves the key out; a
    ValueError or TypeError where it is not a positive int (the class would fail)."""
    value = _raw(config, key)
    if value is _MISSING:
        return default
    if value is None:
        raise ValueError(f"config {key} is None: the config class derives layer_types from "
                         "it, which fails without layer_types")
    return _checks.count(value, key, minimum=1)


def _every(count: int, period: int, other: str, every: str) -> list[str]:
    """``every`` for each period-th layer (the period-th, 2 * period-th, ...), else ``other``."""
    return [every if (i + 1) % period == 0 else other for i in range(count)]


def _beam_types(config: object, count: int) -> list[str]:
    kinds = _every(count, 6, "sliding_attention", "full_attention")
    return kinds[:-1] + ["full_attention"] if kinds else kinds


def _cohere2_moe_types(config: object, count: int) -> list[str]:
    first = _raw(config, "first_k_dense_replace")
    first = 0 if first is _MISSING else _checks.count(first, "first_k_dense_replace")
    if first > count:
        raise ValueError(f"config first_k_dense_replace={first} exceeds num_hidden_layers="
                         f"{count}: the layer_types its config class derives would not match")
    prefix = _every(first, _period(config, "prefix_dense_sliding_window_pattern", 1),
                    "sliding_attention", "full_attention")
    return prefix + _every(count - first, _period(config, "sliding_window_pattern", 4),
                           "sliding_attention", "full_attention")


def _exaone_types(config: object, count: int) -> list[str]:
    if _raw(config, "sliding_window") is None and count:
        raise ValueError("config sets sliding_window None: its config class then takes a "
                         "sliding_window_pattern of 0, and deriving layer_types from it fails")
    pattern = _raw(config, "sliding_window_pattern")
    if isinstance(pattern, str):
        raise ValueError(f"config sliding_window_pattern={pattern!r}: its config class "
                         "derives layer_types from an int pattern only, and fails on a string")
    return _every(count, _period(config, "sliding_window_pattern", 4),
                  "sliding_attention", "full_attention")


def _olmo_hybrid_types(config: object, count: int) -> list[str]:
    kinds = _every(count, 4, "linear_attention", "full_attention")
    if kinds and "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    return kinds


_ZAMBA2 = (["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7
           + ["linear_attention"] * 4 + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"]
           + ["linear_attention"] * 2)


def _zamba2_types(config: object, count: int) -> list[str]:
    if count != len(_ZAMBA2):
        raise ValueError(f"config has no layers_block_type, whose class default has "
                         f"{len(_ZAMBA2)} entries, and num_hidden_layers={count}: its config "
                         "class fails on that")
    return list(_ZAMBA2)


def _lfm3_type(i: int) -> str:
    if i % 4 == 2:
        return "full_attention"
    return "sliding_attention" if i % 4 == 0 and i > 0 else "conv"


_LARA_MINI = ["linear_attention", "sliding_attention", "linear_attention", "full_attention",
              "sliding_attention"]


def _interval(linear: str, other: str) -> Callable[[object, int], list[str]]:
    """Qwen3-Next, Qwen3.5, Qwen4-Exp: every full_attention_interval-th layer (4) ``other``."""
    return lambda config, count: _every(count, _period(config, "full_attention_interval", 4),
                                        linear, other)


def _sliding_every(key: str, default: int) -> Callable[[object, int], list[str]]:
    """Every ``key``-th layer (its class default ``default``) full attention, else sliding."""
    return lambda config, count: _every(count, _period(config, key, default),
                                        "sliding_attention", "full_attention")


# model type -> (the layer_types its config class fills in where the config has none, from
# num_hidden_layers and the keys named; the keys): transformers 5.25's __post_init__ of each
# (tests/data/make_hf_layer_types_reference.py checks them against it)
_DEFAULT_TYPES: dict[str, tuple[Callable[[object, int], list[str]], str]] = {
    "afmoe": (_sliding_every("global_attn_every_n_layers", 4), "global_attn_every_n_layers"),
    "bailing_hybrid": (lambda c, n: _every(n, _period(c, "layer_group_size", 6),
                                           "linear_attention", "full_attention"),
                       "layer_group_size"),
    "beam": (_beam_types, "every 6th and the last layer full attention"),
    "cohere2": (_sliding_every("sliding_window_pattern", 4), "sliding_window_pattern"),
    "cohere2_moe": (_cohere2_moe_types, "first_k_dense_replace, sliding_window_pattern and "
                                        "prefix_dense_sliding_window_pattern"),
    "ergo": (_sliding_every("global_attention_every_n_layers", 4),
             "global_attention_every_n_layers"),
    "exaone4": (_exaone_types, "sliding_window and sliding_window_pattern"),
    "exaone_moe": (_exaone_types, "sliding_window and sliding_window_pattern"),
    "flint": (lambda c, n: ["full_attention" if i < 2 or i % 4 == 1 or i == n - 1
                            else "sliding_attention" for i in range(n)],
              "layers 0, 1, the last and every 4th from 1 full attention"),
    "granitemoehybrid": (lambda c, n: ["linear_attention"] * n, "every layer linear attention"),
    "kolibri1": (lambda c, n: _every(n, 5, "sliding_attention", "full_attention"),
                 "every 5th layer full attention"),
    "kolibri1_1": (lambda c, n: _every(n, 5, "sliding_attention", "indexed_attention"),
                   "every 5th layer indexed attention"),
    "lara_mini": (lambda c, n: [_LARA_MINI[i % 5] for i in range(n)],
                  "its pattern of 5 layer types"),
    "lfm3": (lambda c, n: [_lfm3_type(i) for i in range(n)], "its pattern of 4 layer types"),
    "minimax": (lambda c, n: _every(n, 2, "full_attention", "linear_attention"),
                "every 2nd layer linear attention"),
    "olmo_hybrid": (_olmo_hybrid_types, "every 4th layer full attention, else the last"),
    "qwen3_next": (_interval("linear_attention", "full_attention"), "full_attention_interval"),
    "qwen3_5_text": (_interval("linear_attention", "full_attention"), "full_attention_interval"),
    "qwen3_5_moe_text": (_interval("linear_attention", "full_attention"),
                         "full_attention_interval"),
    "qwen4_exp_text": (_interval("linear_attention", "indexed_attention"),
                       "full_attention_interval"),
    "zamba2": (_zamba2_types, "its class default of 54 layer types"),
}

# Families whose layers differ in whether or how they rotate by their layer type, so that
# a config must list the types or let fastpe derive them as its class does (Llama 4 and
# the Muse models decide it by their no_rope_layers / layer_rope_theta instead).
_NEEDS_TYPES = frozenset(_DEFAULT_TYPES) | frozenset(_DERIVED_TYPES)


def _layer_types(config: object, model_type: str | None,
                 count: int | None) -> tuple[list[str] | None, str]:
    """(the config's layer type of each layer, the key it comes from): ``layer_types``,
    the key transformers' attribute_map reads it from (Zamba2's ``layers_block_type``),
    or what the config class derives it from (Bamba's ``attn_layer_indices``,
    RecurrentGemma's ``block_types``); old names renamed as transformers does. None: not
    listed."""
    derived = _DERIVED_TYPES.get(model_type or "")
    if derived is not None:
        return derived[0](config, count), derived[1]
    kinds = _hf_get(config, "layer_types")
    name = "layer_types"
    for alias, key in _hf_models.convention(model_type).aliases:
        if kinds is None and alias == "layer_types":
            kinds, name = _hf_get(config, key), key
    if kinds is None:
        default = _DEFAULT_TYPES.get(model_type or "")
        if default is None or count is None:
            return None, name
        return default[0](config, count), f"{name} as its config class derives them"
    if isinstance(kinds, (str, bytes, Mapping)) or not isinstance(kinds, Sequence) or not all(
            isinstance(k, str) for k in kinds):
        raise TypeError(f"config {name} must be a list of layer type names, one per layer, "
                        f"got {kinds!r}")
    names: list[str] = list(kinds)
    return [LEGACY_LAYER_TYPES.get(k, k) for k in names], name


def _per_layer(kinds: list[str] | None, count: int | None, values: Sequence[Any],
               name: str) -> tuple[list[str | None], list[Any]]:
    """(the layer type of each of the model's layers, values[:layers]); a ValueError
    where ``values`` (which decide whether a layer rotates) has fewer entries than the
    model has layers (its code would fail). Layer types short of that are left out:
    they do not decide it here."""
    n = count if count is not None else len(values)
    if len(values) < n:
        raise ValueError(f"config {name} has {len(values)} entries for num_hidden_layers={n} "
                         "layers; the model reads one per layer")
    if kinds is None or len(kinds) < n:
        return [None] * n, list(values[:n])
    return list(kinds[:n]), list(values[:n])


# Each rule: (config, its layer types or None, num_hidden_layers or None) -> the layers,
# or None where the config does not say how they differ.
Rule = Callable[[object, "list[str] | None", "int | None"], "list[Layer] | None"]


def _no_rope_layers(empty_is_default: bool) -> Rule:
    """SmolLM3, Mistral-Large-4 and Llama 4: layer i rotates where no_rope_layers[i] is
    non-zero; without the list (Llama 4: also an empty one) every
    no_rope_layer_interval-th layer (4) uses none, as their config classes fill it in."""
    def rule(config: object, kinds: list[str] | None, count: int | None) -> list[Layer]:
        flags = _hf_get(config, "no_rope_layers")
        if flags is None or (empty_is_default and isinstance(flags, Sequence) and not flags):
            interval = _hf_get(config, "no_rope_layer_interval")
            interval = 4 if interval is None else _checks.count(
                interval, "no_rope_layer_interval", minimum=1, whole_float=True)
            n = count if count is not None else (len(kinds) if kinds is not None else None)
            if n is None:
                raise ValueError("config has no no_rope_layers and no num_hidden_layers: this "
                                 f"model leaves every {interval}th layer (no_rope_layer_interval) "
                                 "unrotated, and fastpe cannot tell which layers those are")
            flags = [int((i + 1) % interval != 0) for i in range(n)]
        kind, values = _per_layer(kinds, count, _int_list(flags, "no_rope_layers"),
                                  "no_rope_layers")
        return [Layer(k, bool(v)) for k, v in zip(kind, values)]
    return rule


def _layer_rope_theta(own_base: bool) -> Rule:
    """Granite SWA (``own_base``): layer i rotates with base layer_rope_theta[i], none
    where it is 0, the rope parameters' rope_theta everywhere without the list. MuseSpark,
    MuseGlimmer: layer i rotates where layer_rope_theta[i] is non-zero, with the rope
    parameters' base; without the list every 4th layer counted back from the last uses
    none."""
    def rule(config: object, kinds: list[str] | None, count: int | None) -> list[Layer] | None:
        thetas = _hf_get(config, "layer_rope_theta")
        if thetas is None:
            n = count if count is not None else (len(kinds) if kinds is not None else None)
            if own_base:
                return None  # every layer at the rope parameters' base
            if n is None:
                raise ValueError("config has no layer_rope_theta and no num_hidden_layers: "
                                 "this model leaves every 4th layer counted back from the "
                                 "last unrotated, and fastpe cannot tell which layers those are")
            thetas = [0.0 if (n - 1 - i) % 4 == 0 else 1.0 for i in range(n)]
        kind, values = _per_layer(kinds, count, _theta_list(thetas, "layer_rope_theta"),
                                  "layer_rope_theta")
        return [Layer(k, bool(v), v if own_base and v else None) for k, v in zip(kind, values)]
    return rule


def _sliding_rule(rotate_all_without_window: bool, dense_prefix: bool = False) -> Rule:
    """Cohere 2, Flint (``rotate_all_without_window`` False): only sliding layers rotate,
    and only when sliding_window is set; Cohere2-MoE (``dense_prefix``) also every dense
    layer (mlp_layer_types) when prefix_dense_sliding_window_pattern is 1 (its
    force_rope). EXAONE 4, EXAONE-MoE (True): the sliding layers, and every layer when
    sliding_window is None. A missing sliding_window is the config class's
    default, a window."""
    def rule(config: object, kinds: list[str] | None, count: int | None) -> list[Layer] | None:
        no_window = _raw(config, "sliding_window") is None
        if kinds is None:  # refused before: their config classes derive the types
            return None
        kind, _ = _per_layer(kinds, count, kinds, "layer_types")
        sliding = [k == "sliding_attention" for k in kind]
        if rotate_all_without_window:
            return [Layer(k, no_window or s) for k, s in zip(kind, sliding)]
        rotates = [s and not no_window for s in sliding]
        pattern = _raw(config, "prefix_dense_sliding_window_pattern")
        if dense_prefix and (pattern is _MISSING or pattern == 1):
            mlp = _hf_get(config, "mlp_layer_types")
            if mlp is None:  # the config class's default, from the key it pops
                first = _checks.count(_hf_get(config, "first_k_dense_replace") or 0,
                                      "first_k_dense_replace", whole_float=True)
                mlp = ["dense" if i < first else "sparse" for i in range(len(kind))]
            _, mlp = _per_layer(None, len(kind), mlp, "mlp_layer_types")
            rotates = [r or m == "dense" for r, m in zip(rotates, mlp)]
        return [Layer(k, r) for k, r in zip(kind, rotates)]
    return rule


_NO_ROPE_LAYERS = "no_rope_layers"
_THETAS = "layer_rope_theta"
_WINDOW = "layer_types and sliding_window"

# model type -> (how its code decides, layer by layer, whether and with which base a
# layer rotates, where that is more than its layer type; the config keys it reads)
RULES: dict[str, tuple[Rule, str]] = {
    "smollm3": (_no_rope_layers(False), _NO_ROPE_LAYERS),
    "mistral_large4_text": (_no_rope_layers(False), _NO_ROPE_LAYERS),
    "llama4_text": (_no_rope_layers(True), _NO_ROPE_LAYERS),
    "granite_swa": (_layer_rope_theta(True), _THETAS),
    "granitemoe_swa": (_layer_rope_theta(True), _THETAS),
    "muse_spark_text": (_layer_rope_theta(False), _THETAS),
    "muse_glimmer_text": (_layer_rope_theta(False), _THETAS),
    "cohere2": (_sliding_rule(False), _WINDOW),
    "flint": (_sliding_rule(False), _WINDOW),
    "cohere2_moe": (_sliding_rule(False, dense_prefix=True),
                    _WINDOW + ", mlp_layer_types and prefix_dense_sliding_window_pattern"),
    "exaone4": (_sliding_rule(True), _WINDOW),
    "exaone_moe": (_sliding_rule(True), _WINDOW),
    # Kolibri's attention has EXAONE 4's test, but its model builds a sliding mask for
    # every config, which fails without a window: its layer types decide
}


def _count(config: object, model_type: str | None) -> int | None:
    """The model's number of decoder layers: num_hidden_layers, halved where the config
    counts (attention, mlp) blocks (Dory's config.json), as its config class does."""
    count = _hf_get(config, "num_hidden_layers")
    if count is None:
        return None
    count = _checks.count(count, "num_hidden_layers", minimum=0, whole_float=True)
    return count // 2 if _paired(config, model_type) else count


def _paired(config: object, model_type: str | None) -> bool:
    kinds = _hf_get(config, "layer_types")
    return (model_type in _hf_models.PAIRED_BLOCKS and isinstance(kinds, Sequence)
            and "mlp" in kinds)


def _kinds(config: object, model_type: str | None,
           count: int | None) -> tuple[list[str] | None, str]:
    """_layer_types, each (attention, mlp) pair of blocks folded into its layer."""
    kinds, key = _layer_types(config, model_type, count)
    if kinds is not None and _paired(config, model_type):
        kinds = kinds[::2]
    return kinds, key


def _layers(config: object, model_type: str | None) -> tuple[list[Layer] | None, str]:
    """(every decoder layer of the model the config builds, by layer index, the config
    keys that decide them); None where the config does not say that its layers differ
    in whether or how they rotate."""
    count = _count(config, model_type)
    kinds, key = _kinds(config, model_type, count)
    if kinds is None and model_type in _NEEDS_TYPES:
        default = _DEFAULT_TYPES.get(model_type or "")
        what = (f"no {key} and no num_hidden_layers, from which its config class derives "
                f"them ({default[1]})" if default is not None else
                f"no num_hidden_layers, over which {key} gives its layer types")
        raise ValueError(f"model_type {model_type!r}: config has {what}: some of its layers "
                         "use no positional encoding (NoPE) or another RoPE, and fastpe "
                         "cannot tell which")
    rule = RULES.get(model_type or "")
    if rule is not None:
        found = rule[0](config, kinds, count)
        return found, rule[1]
    nope = _hf_models.NOPE_LAYERS.get(model_type or "")
    if not nope or kinds is None:
        return None, key
    kind, _ = _per_layer(kinds, count, kinds, key)
    return [Layer(k, k not in nope) for k in kind], key


def _spans(indices: Sequence[int]) -> str:
    """0, 1, 2, 4, 5 -> "0-2, 4-5"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _named(indices: Sequence[int], verb: str) -> str:
    """[3], "use" -> "layer 3 uses"; [3, 7] -> "layers 3, 7 use"."""
    if len(indices) == 1:
        return f"layer {indices[0]} {verb}s"
    return f"layers {_spans(indices)} {verb}"


_PASS_LAYER = "choose the layer with layer= (its index, 0-based as the model's layer_idx)"


def select(config: object, model_type: str | None, layer: object,
           layer_type: str | None) -> tuple[object, str | None]:
    """(the config, the layer type) for the layers a from_hf_config call picks: layer
    ``layer`` (an index, 0-based as the model's layer_idx: an int below
    num_hidden_layers), else those of ``layer_type``, else all; a ValueError where some
    of them do not rotate (NoPE) or rotate with another base than the others, naming the
    layers. ``layer`` implies its layer type from the config's layer_types (another
    layer_type is a ValueError); a layer with a base of its own (Granite SWA's
    layer_rope_theta) gives the config with that base, as the model's code builds it."""
    hf_requirements(config, model_type)  # a family none of whose layers rotate says so first
    count = _count(config, model_type)
    found, source = _layers(config, model_type)
    kinds = [x.kind for x in found] if found is not None else _kinds(
        config, model_type, count)[0]
    if layer is not None and kinds is None and layer_type is None and _per_type_rope(config):
        raise ValueError(f"model_type {model_type!r}: config has no layer_types, and its rope "
                         "parameters have one entry per layer type: fastpe cannot tell which "
                         f"layer type layer {layer} is; add layer_types or pass layer_type=")
    if layer is not None:
        layer = _checks.count(layer, "layer", minimum=0)
        known = count if count is not None else (len(kinds) if kinds is not None else None)
        if known is not None and layer >= known:
            raise ValueError(f"layer={layer}: the config has {known} layers "
                             f"(num_hidden_layers), indices 0 to {known - 1}")
        kind = kinds[layer] if kinds is not None and layer < len(kinds) else None
        if kinds is not None and layer >= len(kinds):
            raise ValueError(f"layer={layer}: config layer_types has {len(kinds)} entries, "
                             f"none for layer {layer}")
        if kind is not None:
            if layer_type is not None and LEGACY_LAYER_TYPES.get(layer_type, layer_type) != kind:
                raise ValueError(f"layer={layer} is a {kind!r} layer (config layer_types), "
                                 f"not layer_type={layer_type!r}")
            layer_type = kind
    if found is not None and layer is not None:
        picked = [layer]
    elif found is not None and layer_type is not None and any(k is not None for k in kinds or ()):
        want = LEGACY_LAYER_TYPES.get(layer_type, layer_type)
        picked = [i for i, k in enumerate(kinds or ()) if k == want]
    elif found is not None:
        picked = list(range(len(found)))
    else:
        picked = []
    where = f"model_type {model_type!r}"
    if found is None or not picked:
        # the layer types alone, as the trace found them
        if layer_type in _hf_models.NOPE_LAYERS.get(model_type or "", frozenset()):
            raise ValueError(f"{where}: its {layer_type!r} layers use no positional encoding "
                             "(NoPE): they do not rotate q and k, so there is no rotary "
                             "embedding to load for them")
        return config, layer_type
    rotating = [i for i in picked if found[i].rotates]
    still = [i for i in picked if not found[i].rotates]
    if not rotating:
        if layer is not None:
            raise ValueError(f"{where}: layer {layer} uses no positional encoding (NoPE, config "
                             f"{source}): it does not rotate q and k, so there is no rotary "
                             "embedding to load for it")
        if layer_type is not None:
            raise ValueError(f"{where}: its {layer_type!r} layers use no positional encoding "
                             f"(NoPE, config {source}): they do not rotate q and k, so there "
                             "is no rotary embedding to load for them")
        raise ValueError(f"{where}: none of the config's {len(picked)} layers rotates q and k "
                         f"(NoPE, config {source}): there is no rotary embedding to load")
    which = "the config's layers" if layer_type is None else f"its {layer_type!r} layers"
    if still:
        hint = ""
        rotating_kinds = {found[i].kind for i in rotating}
        if layer_type is None and None not in rotating_kinds and not rotating_kinds & {
                found[i].kind for i in still}:
            hint = (" or their layer type with layer_type= ("
                    f"{', '.join(map(repr, sorted(map(str, rotating_kinds))))})")
        raise ValueError(
            f"{where}: {which} differ: {_named(rotating, 'rotate')} q and k, "
            f"{_named(still, 'use')} no positional encoding (NoPE, config {source}); "
            f"{_PASS_LAYER}{hint}")
    thetas = sorted({t for i in rotating if (t := found[i].theta) is not None})
    if len(thetas) > 1:
        groups = "; ".join(f"{_named([i for i in rotating if found[i].theta == t], 'rotate')}"
                           f" at {t!r}" for t in thetas)
        raise ValueError(f"{where}: {which} rotate with different bases (config {source}: "
                         f"{groups}); {_PASS_LAYER}")
    if thetas:
        config = _with_theta(config, thetas[0])
    return config, layer_type


def _per_type_rope(config: object) -> bool:
    """Whether the config's rope parameters hold one dict per layer type (Gemma 3)."""
    for name in ("rope_scaling", "rope_parameters"):
        rope = _hf_get(config, name)
        if isinstance(rope, Mapping) and rope:
            return all(v is None or isinstance(v, Mapping) for v in rope.values())
    return False


def _with_theta(config: object, theta: float) -> dict[str, Any]:
    """The config as a dict whose rope parameters have rope_theta ``theta``, as Granite
    SWA's model builds the rotary module of a layer with a base of its own."""
    plain = dict(config) if isinstance(config, Mapping) else dict(vars(config))
    name = "rope_scaling" if plain.get("rope_scaling") else "rope_parameters"
    rope = plain.get(name)
    rope = dict(rope) if isinstance(rope, Mapping) else {"rope_type": "default"}
    if rope and all(v is None or isinstance(v, Mapping) for v in rope.values()):
        raise ValueError(f"config {name} has one entry per layer type beside a per-layer "
                         "layer_rope_theta, which fastpe has not checked against the model")
    rope["rope_theta"] = theta
    plain[name] = rope
    return plain
