"""Rotary position embeddings (RoPE; Su et al., 2021).

Feature pairs of q and k rotate by ``position * inv_freq[j]``, so the q.k dot
product depends only on the distance between positions. The frequencies and
every Hugging Face scaling type come from :mod:`fastpe._rope_scaling` in
float64; the rotation runs in place, in one pass over q and k.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import _args, _backend, _checks, _hf_multimodal, _rope_scaling, _threads, reference
from ._rope_scaling import RopeFrequencies, rope_frequencies
from ._typing import (
    ArrayLike,
    DTypeLike,
    InPlace,
    PositionsLike,
    RopeLayout,
    ScalingDict,
    Style,
)

# the compiled kernel module while the cython backend is active (fastpe._backend.kernels)
_kernels = _backend.kernels

__all__ = ["RopeFrequencies", "RotaryEmbedding", "apply_rope", "apply_rope_cached",
           "rope_cos_sin", "rope_frequencies"]


def _run(plan: _args.RopePlan) -> None:
    """The validated, normalised call, through the same compiled entry."""
    kern = _kernels()
    if kern is None:
        reference.run_rope(plan)
        return
    state = cos = sin = None
    pos = plan.positions.array  # multi-axis: (axes, rows, seq)
    offset = plan.positions.offset
    axes = pos.shape[0] if plan.pair_axis is not None and pos is not None else 1
    if plan.inv_freq is not None:
        state = kern.RopeState(-1, False, plan.inv_freq, plan.att, -1, None, plan.pair_axis,
                               plan.pair_axis2, axes)
    elif plan.cos is not None and plan.sin is not None:
        if plan.pair_axis is None:
            (cos, sin), pos, offset = _checks.rows_read(plan.positions, plan.cos, plan.sin)
        else:
            cos, sin = _checks.kernel_view(plan.cos), _checks.kernel_view(plan.sin)
    nbytes = 2 * (plan.q.nbytes + (0 if plan.k is None else plan.k.nbytes))
    args = (pos, offset, "neox" if plan.neox else "gptj", "bshd", plan.inverse, None)
    team = _threads.resolve(plan.num_threads, nbytes)
    with _checks.kernel_views(plan.q, plan.k) as (qw, kw):
        done = kern.rope_call(state, qw, kw, *args, cos, sin, 0, team)
        if not done:
            # q, k, the frequencies and the cache proven apart by the validator in a way
            # the entry's bounded proof does not follow: one array at a time, from copies
            # of the frequencies and the cache
            if cos is not None:
                cos, sin = np.array(cos), np.array(sin)
            else:
                state = kern.RopeState(-1, False, np.array(plan.inv_freq), plan.att, -1,
                                       None, plan.pair_axis, plan.pair_axis2, axes)
            done = kern.rope_call(state, qw, None, *args, cos, sin, 0, team) and (
                kw is None or kern.rope_call(state, kw, None, *args, cos, sin, 0, team))
    if not done:
        raise _checks.entry_declined("RoPE")


def _state(spec: _rope_scaling.RopeSpec, head_dim: int, flip: bool = False) -> Any:
    """The compiled entry's RopeState of `spec` on heads of head_dim features: the
    frequencies up to the original length and, for dynamic NTK and LongRoPE, how to
    find those past it; None when they cannot be formed (the validating path then
    names the problem) or their scaling is not a float."""
    try:
        low = spec.frequencies()
    except Exception:
        return None
    if type(low.attention_scaling) is not float:
        return None
    switch = -1
    past: object = None
    if spec.depends_on_seq_len:
        assert spec.original_max_position_embeddings is not None  # _parse sets it for both
        switch = spec.original_max_position_embeddings
        if spec.rope_type == "dynamic" and spec.dim > 2 and not spec.mscaled:
            # each length past the original has frequencies of its own, which the entry
            # forms from the plain ones and the factor (a float, as _dynamic_inv_freq
            # computes with it; else each such call asks spec.frequencies)
            past = spec.factor if type(spec.factor) is float and type(switch) is int else None
        else:
            # LongRoPE's long factors; dynamic NTK's single pair at any length
            try:
                past = spec.frequencies(switch + 1)
            except Exception:
                past = None  # raised, with its message, by a call that gets there
    kern = _backend.compiled
    assert kern is not None
    return kern.RopeState(head_dim, flip, low.inv_freq, low.attention_scaling, switch, past)


def _new_state(q: Any, rotary_dim: object, base: object, scaling: object,
               max_position_embeddings: object) -> Any:
    """apply_rope's RopeState for arguments _STATES does not hold, kept there when they
    are plain values; None for a q that is not an array or torch tensor of three or
    more axes, or arguments that cannot be parsed (the validating path raises, in its
    own order)."""
    if type(q) is np.ndarray:
        if q.ndim < 3:
            return None
        head_dim = q.shape[-1]
    elif _checks.is_plain_tensor(q):
        try:
            shape = q.shape
        except Exception:  # a nested tensor has none: the validating path refuses it
            return None
        if len(shape) < 3:
            return None
        head_dim = shape[-1]
    else:
        return None
    if type(scaling) is dict:
        # parsed and kept from a copy no other thread can change in between
        scaling = {key: list(v) if type(v) is list else v for key, v in dict(scaling).items()}
    try:
        spec = _args.rope_spec(head_dim, rotary_dim, base, scaling, max_position_embeddings)[1]
    except Exception:
        return None
    state = _state(spec, head_dim)
    if state is not None:
        _STATES.keep(head_dim, rotary_dim, base, scaling, max_position_embeddings, state)
    return state


# the states of apply_rope's arguments, by value: arguments of these immutable types,
# whose == is a plain comparison (an array's would be an array), are compared and kept
_STATES: Any = None if _backend.compiled is None else _backend.compiled.RopeStates(
    frozenset({type(None), bool, int, float, str, np.float64, np.float32, np.int64, np.int32}))


def _with_team(kern: Any, nbytes: int, state: Any, q: Any, k: Any, positions: Any,
               offset: Any, style: Any, layout: Any, inverse: Any, num_threads: Any, cos: Any,
               sin: Any, token: bool = False) -> int:
    """The compiled entry again for a call it found to touch `nbytes` bytes, past the
    serial size: with the team the thread policy gives it."""
    done: int = kern.rope_call(state, q, k, positions, offset, style, layout, inverse,
                               num_threads, cos, sin, _threads.SERIAL_BYTES,
                               _threads.resolve(num_threads, nbytes), token)
    return done


def _tensor_views(q: Any, k: Any, positions: Any, layout: Any, cos: Any = None,
                  sin: Any = None) -> tuple[Any, ...]:
    """A RoPE call's q, k, positions, layout, cos and sin for the validating path: when
    q or k is a torch tensor, the tensors among them as fastpe._checks views them
    (refusing what torch would) with the layout they must give; anything else as given,
    "bshd" unless the layout is given."""
    tensor = (None if type(q) is np.ndarray and (k is None or type(k) is np.ndarray)
              else _checks.tensor_name(q, k))
    if tensor is None:
        return q, k, positions, "bshd" if layout is None else layout, cos, sin
    layout = _checks.tensor_layout(layout, tensor)
    if cos is None and sin is None:
        q, k, positions = _checks.torch_rope(q, k, positions)
    else:
        q, k, cos, sin, positions = _checks.torch_tensors(
            (q, "q", True), (k, "k", True), (cos, "cos", False), (sin, "sin", False),
            (positions, "positions", False))
    return q, k, positions, layout, cos, sin


def apply_rope(q: InPlace, k: Any = None, positions: PositionsLike = None, *,
               offset: int = 0, freqs: RopeFrequencies | np.ndarray | None = None,
               base: float | None = None, scaling: ScalingDict | None = None,
               rotary_dim: int | None = None, style: Style = "neox",
               layout: RopeLayout | None = None,
               inverse: bool = False, num_threads: int | None = None,
               max_position_embeddings: int | None = None) -> tuple[InPlace, Any]:
    """Rotate q and k in place by their positions; returns (q, k).

    Parameters
    ----------
    q, k : ndarray or torch CPU tensor
        Queries and keys (k may be None), written in place: (batch, seq, heads,
        head_dim) for layout "bshd", (batch, heads, seq, head_dim) for "bhsd",
        (tokens, heads, head_dim) for "shd". Head counts may differ (GQA/MQA);
        any strides (slices of a fused QKV buffer work); float16/32/64 or bfloat16.
    positions : array of int or float, optional
        (seq,) shared by the batch or (batch, seq); None means offset + arange(seq).
        Real-valued positions (DINOv3's patch centres) may be negative.
    layout : {"bshd", "bhsd", "shd"}, optional
        How q and k hold their axes: "bshd" for NumPy arrays when not given; torch
        tensors must say (transformers holds q and k as "bhsd", other code as
        "bshd"), as a misread layout rotates by the wrong positions without an error.
    freqs : RopeFrequencies, or an ndarray or torch tensor of inverse frequencies, optional
        Precomputed frequencies (from :func:`rope_frequencies`); else computed
        from ``base`` and ``scaling`` (a Hugging Face rope_scaling dict).
    rotary_dim : int, optional
        Rotate only the first rotary_dim features (even); the rest are untouched.
        Default: the head_dim, or with ``freqs`` twice their count (so frequencies of
        a partial rotary_dim rotate only the features they cover).
    style : {"neox", "gptj"}
        Pair feature j with j + rotary_dim/2 (LLaMA, HF rotate_half), or 2j with 2j+1.
    inverse : bool
        Undo the rotation: rotate by -angle and divide by the attention scaling.
    max_position_embeddings : int, optional
        The original context length when ``scaling`` needs one and lacks it.

    Dynamic NTK and LongRoPE frequencies use seq_len = max(positions) + 1, as
    Hugging Face does.

    >>> q = np.ones((1, 8, 4, 64), np.float32); k = np.ones((1, 8, 2, 64), np.float32)
    >>> q, k = fastpe.apply_rope(q, k, scaling={"rope_type": "llama3", "factor": 8.0,
    ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    ...     "original_max_position_embeddings": 8192}, base=500000.0)
    """
    given = q, k
    kern = _kernels()
    if kern is not None:
        # arrays and a model's own torch tensors alike, checked and viewed once in C
        state = None
        if freqs is None:
            state = _STATES.get(q, rotary_dim, base, scaling, max_position_embeddings)
            if state is None:
                state = _new_state(q, rotary_dim, base, scaling, max_position_embeddings)
        elif (type(freqs) is RopeFrequencies and base is None and scaling is None
              and rotary_dim is None and max_position_embeddings is None
              and type(freqs.attention_scaling) is float):
            state = kern.RopeState(-1, False, freqs.inv_freq, freqs.attention_scaling)
        if state is not None:
            done = kern.rope_call(state, q, k, positions, offset, style, layout, inverse,
                                  num_threads, None, None, _threads.SERIAL_BYTES, 0)
            if done > 1:
                done = _with_team(kern, done, state, q, k, positions, offset, style, layout,
                                  inverse, num_threads, None, None)
            if done:
                return given
    # torch tensors the entry did not take, viewed (or refused) here
    q, k, positions, layout, _, _ = _tensor_views(q, k, positions, layout)
    _run(_args.rope(q, k, positions=positions, offset=offset, rotary_dim=rotary_dim, freqs=freqs,
                    base=base, scaling=scaling, max_position_embeddings=max_position_embeddings,
                    style=style, layout=layout, inverse=inverse, num_threads=num_threads))
    if q is not given[0] or k is not given[1]:
        _checks.bump_written(*given)
    return given


def apply_rope_cached(q: InPlace, k: Any, cos: ArrayLike, sin: ArrayLike,
                      positions: PositionsLike = None, *, offset: int = 0, style: Style = "neox",
                      layout: RopeLayout | None = None, inverse: bool = False,
                      num_threads: int | None = None,
                      per_token: bool | None = None) -> tuple[InPlace, Any]:
    """Rotate q and k in place with cos and sin rows looked up by position.

    cos and sin are (max_positions, rotary_dim // 2), as :func:`rope_cos_sin`
    returns them (already multiplied by the attention scaling). A position at
    or past max_positions is an IndexError. ``inverse=True`` applies the exact
    inverse of the cached rotation. Other arguments as :func:`apply_rope`.

    They may also be what transformers' rotary modules return: one row per token,
    (batch or 1, seq, rotary_dim) with each frequency's value twice (both halves
    equal for ``style="neox"``, each adjacent pair for ``"gptj"``), lined up with
    q's tokens, so that no positions are given. A 3-D cos is read that way;
    ``per_token=True`` reads a 2-D (seq, rotary_dim) one so too.
    """
    given = q, k
    kern = _kernels()
    # an array's own ndim: np.ndim took 6% of a decode call
    cos_obj: Any = cos
    ndim = (cos_obj.ndim if type(cos) is np.ndarray or _checks.is_plain_tensor(cos)
            else np.ndim(cos))
    token_rows = (ndim == 3 if per_token is None else per_token if type(per_token) is bool
                  else _checks.flag(per_token, "per_token"))
    if kern is not None:
        # rows looked up by position, or lined up with the tokens: arrays and torch
        # tensors alike, viewed once in C
        done = kern.rope_call(None, q, k, positions, offset, style, layout, inverse,
                              num_threads, cos, sin, _threads.SERIAL_BYTES, 0, token_rows)
        if done > 1:
            done = _with_team(kern, done, None, q, k, positions, offset, style, layout,
                              inverse, num_threads, cos, sin, token_rows)
        if done:
            return given
    q, k, positions, layout, cos, sin = _tensor_views(q, k, positions, layout, cos, sin)
    if token_rows:
        cos, sin, positions = _args.token_cos_sin(cos, sin, positions, offset, style)
    done = 0
    if kern is not None and (token_rows or q is not given[0] or k is not given[1]):
        # what the entry declined above, now as arrays or rows by position
        done = kern.rope_call(None, q, k, positions, offset, style, layout, inverse,
                              num_threads, cos, sin, _threads.SERIAL_BYTES, 0)
        if done > 1:
            done = _with_team(kern, done, None, q, k, positions, offset, style, layout,
                              inverse, num_threads, cos, sin)
    if not done:
        _run(_args.rope_cached(q, k, cos, sin, positions=positions, offset=offset, style=style,
                               layout=layout, inverse=inverse, num_threads=num_threads,
                               token_rows=token_rows))
    if q is not given[0] or k is not given[1]:  # torch tensors, now written
        if kern is not None:
            kern.torch_bump(given)
        else:
            _checks.bump_written(*given)
    return given


def rope_cos_sin(positions: ArrayLike, freqs: RopeFrequencies | np.ndarray, *,
                 dtype: DTypeLike = "float32") -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of ``positions * inv_freq``, each of shape positions.shape +
    (rotary_dim // 2,), multiplied by ``freqs.attention_scaling`` as Hugging
    Face's rotary modules do. Angles are formed and reduced in float64.

    Positions are integers (at least 0) or real-valued (NumPy's float dtypes, not
    bfloat16, which holds whole numbers exactly only up to 256: DINOv3's patch centres,
    SAM's grids; negative ones too), each below 2**32 in magnitude.

    >>> cos, sin = fastpe.rope_cos_sin(np.arange(4096), fastpe.rope_frequencies(128))
    """
    kern = _kernels()
    if kern is None:
        return reference.rope_cos_sin(positions, freqs, dtype=dtype)
    pos, freqs, dt = _args.rope_cos_sin(positions, freqs, dtype)
    if pos.dtype != np.int64:  # real-valued positions: a table made once, in NumPy
        return reference.cos_sin_of(pos, freqs, dt)
    half = freqs.inv_freq.size
    # One sinusoidal table in the "split" layout is [sin | cos] per row.
    table = np.empty(pos.shape + (2 * half,), dtype=dt)
    rows = table.reshape(1, pos.size, 2 * half)
    if not kern.sinusoidal_call(rows, freqs.inv_freq, pos.reshape(1, -1), 0,
                                freqs.attention_scaling, True, False, False,
                                _threads.resolve(None, table.nbytes)):
        raise _checks.entry_declined("sinusoidal")
    return table[..., half:], table[..., :half]


class RotaryEmbedding:
    """A model's rotary embedding: parsed once, applied many times.

    With ``axes`` > 1 (M-RoPE of Qwen2-VL and its successors, 2D RoPE of
    vision towers) every token has one position per axis, and each frequency
    pair rotates by the position on the axis that ``mrope_section`` assigns to
    it: contiguous runs of pairs (Qwen2-VL) or, with ``mrope_interleaved``,
    axes taking turns pair by pair (Qwen3-VL). Positions are then
    ``(axes, seq)`` or ``(axes, batch, seq)``, as Hugging Face's
    ``position_ids`` for these models; ``(seq,)``, ``(batch, seq)`` or
    ``(1, batch, seq)`` text positions give every axis the same position (the
    models broadcast a single row over their axes); the embedding of a vision
    tower, or of a grid of coordinates (DINOv3, SAM), refuses them and a call
    without positions.

    ``feature_slice`` is the slice of the model's query head that this embedding's
    head_dim covers (all of it, except for MLA and trailing partial rotary; see
    :meth:`from_hf_config`). ``reverse`` is True for a model that rotates by -angle:
    calls then rotate that way (and ``inverse=True`` undoes it). ``prefix_tokens`` is
    the count of leading tokens the model leaves unrotated (DINOv3's class and register
    tokens; 0 elsewhere): pass ``q[:, prefix_tokens:]``. The embeddings of vision models
    on real-valued coordinates also carry what their positions are made from (README,
    "RoPE on real coordinates (DINOv3, SAM)"): ``grid``, the patch grid's (rows, columns) (SAM 2,
    EdgeTAM, SAM 3), ``key_grid`` (EdgeTAM's memory keys), ``window_size``
    (SAM 3) and ``q_aggregation``, (kernel, stride) (EfficientLoFTR).

    With a model's config, q, k and its positions::

        rope = fastpe.RotaryEmbedding.from_hf_config(config)   # or a config.json dict
        q, k = rope(q, k, positions)
        mrope = fastpe.RotaryEmbedding(128, base=1e6, mrope_section=[16, 24, 24])
        q, k = mrope(q, k, position_ids)     # (3, batch, seq): temporal, height, width
    """

    def __init__(self, head_dim: int, *, base: float | None = None,
                 scaling: ScalingDict | None = None, rotary_dim: int | None = None,
                 style: Style = "neox", max_position_embeddings: int | None = None,
                 axes: int | None = None, mrope_section: Sequence[int] | None = None,
                 mrope_interleaved: bool = False) -> None:
        self.head_dim = _checks.count(head_dim, "head_dim", minimum=1)
        self.style = _checks.choice(style, "style", _args.ROPE_STYLES)
        self.rotary_dim, self._spec = _args.rope_spec(self.head_dim, rotary_dim, base, scaling,
                                                      max_position_embeddings)
        pair_axis = None
        if mrope_section is not None:
            pair_axis = _args.mrope_pair_axis(self.rotary_dim // 2, mrope_section,
                                              mrope_interleaved)
            if axes is None:
                axes = len(mrope_section)
            elif _checks.count(axes, "axes", minimum=1) != len(mrope_section):
                raise ValueError(f"axes={axes} but mrope_section has {len(mrope_section)} "
                                 f"entries, one per axis")
        elif _checks.flag(mrope_interleaved, "mrope_interleaved"):
            raise ValueError("mrope_interleaved needs mrope_section")
        self._set_layout(1 if axes is None else axes, pair_axis, None)
        self.feature_slice = slice(0, self.head_dim)
        self.reverse = False
        # Gemma 4's vision tower: the axis of each half of the head, each half a
        # rotate_half RoPE of its own (None: one pairing over rotary_dim)
        self._halves: tuple[int, int] | None = None

    def _set_layout(self, axes: object, pair_axis: np.ndarray | None,
                    pair_freq: np.ndarray | None,
                    spec: _rope_scaling.RopeSpec | None = None,
                    text_positions: bool = True) -> None:
        """Multi-axis layout: the axis of each frequency pair, and the index of
        each pair's frequency among those of `spec` (default: this embedding's
        own; None: pair i takes the i-th); text_positions: whether the model also
        rotates text tokens, by one position that every axis shares (M-RoPE), not a
        vision tower's or a grid's own coordinates only."""
        if spec is not None:
            self._spec = spec
        # the axis of each pair's second feature where it differs from the first's
        # (HunYuan-VL), set by the loader
        self._pair_axis2: np.ndarray | None = None
        half = self.rotary_dim // 2
        self.axes, self._pair_axis = _args.pair_axis_arg(axes, pair_axis, half)
        if self.axes == 1:
            self._pair_axis = None
        self._layout_axes = self.axes   # what the pair layout was made for
        self._text_positions = text_positions or self.axes == 1
        if pair_freq is not None and pair_freq.shape != (half,):
            raise ValueError(f"{pair_freq.shape[0]} pair frequencies for {half} pairs")
        self._pair_freq = pair_freq

    @classmethod
    def from_hf_config(cls, config: object, *, style: Style | None = None,
                       layer_type: str | None = None, part: str | None = None,
                       layer: int | None = None) -> RotaryEmbedding:
        """The rotary embedding of a transformers model, from its config object or dict.

        Reproduces the model's own rotary module and apply function to float64
        rounding, or raises ValueError naming what it cannot reproduce (a vision
        tower or multi-axis family fastpe does not cover, a composite config: pass
        its sub-config). Reads head_dim (or hidden_size / num_attention_heads),
        rope_theta, rope_scaling or rope_parameters, partial_rotary_factor /
        rotary_pct / rotary_dim and max_position_embeddings; the model type gives
        what the config cannot say (adjacent-pair "gptj" pairing, MLA's rope slice,
        rotation direction, M-RoPE sections). A model type transformers does not
        have loads as Llama's. ``style`` overrides the pairing; ``layer_type`` picks
        per-layer-type settings (Gemma 2/3/4, ...).

        ``layer`` is a layer index (0-based, as the model's ``layer_idx``; an int below
        ``num_hidden_layers``): the embedding of that layer, its layer type taken from
        the config's ``layer_types``. Where the layers of a config differ in whether
        they rotate at all (SmolLM3's, Llama 4's and Mistral-Large-4's
        ``no_rope_layers``; NoPE layer types: Cohere 2's full attention, Qwen3-Next's
        linear attention, ...) or in their base (Granite SWA's ``layer_rope_theta``),
        the layers a call picks (that layer, else those of ``layer_type``, else all)
        must rotate alike: a layer or layer type that uses no positional encoding is a
        ValueError saying so, and picked layers that differ are a ValueError listing
        which rotate and which do not, asking for ``layer=``.

        ``feature_slice`` says which features of the model's query head to pass:
        ``rope(q[..., rope.feature_slice], k_pe)`` for MLA (DeepSeek-V2/V3), whose
        q is [nope | rope] and whose k_pe is rotated whole. ``part="indexer"`` gives
        the embedding of DeepSeek-V3.2's (and AXK2's, GLM-MoE-DSA's, HY-V4's) lightning
        indexer, whose own q and k rotate with another pairing over another slice.

        Every model type of transformers 5.25 is either checked against its own code
        or refused with a ValueError naming it; so are layers that use no positional
        encoding (NoPE). Keys the family's code ignores are ignored
        (``partial_rotary_factor`` in Llama).
        """
        from . import _hf_layers  # which layers rotate, by layer index

        given_dict = isinstance(config, Mapping)
        config, model_type = _rope_scaling.hf_config(config)
        config, layer_type = _hf_layers.select(config, model_type, layer, layer_type)
        return cls._from_hf_module(config, style, layer_type, part, given_dict)

    @classmethod
    def _from_hf_module(cls, config: object, style: Style | None, layer_type: str | None,
                        part: str | None, given_dict: bool | None = None) -> RotaryEmbedding:
        """The embedding of the config's rotary module (for ``layer_type``), whichever
        layers apply it: :meth:`from_hf_config` once the layers it picks are known to
        rotate; fastpe.hf, whose patched model keeps its own code deciding that.
        given_dict: whether the caller's config was a dict (config.json) rather than the
        config object (None: whether `config` is one)."""
        if given_dict is None:
            given_dict = isinstance(config, Mapping)
        config, _ = _rope_scaling.hf_config(config)
        if style is not None:
            _checks.choice(style, "style", _args.ROPE_STYLES)
        from . import _hf_realrope  # DINOv3, SAM: rotations by real-valued coordinates
        real = _hf_realrope.from_hf_config(cls, config, style, layer_type, given_dict)
        if real is not None:
            if part is not None:
                raise ValueError(f"part={part!r}: this model has one rotary embedding")
            return real
        multi_axis = _hf_multimodal.from_hf_config(cls, config, style, layer_type, part)
        if multi_axis is not None:
            return multi_axis
        c = _rope_scaling.hf_rope_config(config, layer_type=layer_type, part=part)
        rope = cls(c["head_dim"], base=c["base"], scaling=c["scaling"],
                   rotary_dim=c["rotary_dim"], style=style or c["style"],
                   max_position_embeddings=c["max_position_embeddings"])
        if c["inverse"]:
            if rope._spec.attention_scaling != 1.0 or rope._spec.rope_type == "longrope":
                raise ValueError("this model rotates by -angle, which fastpe applies as the "
                                 "inverse rotation: exact only without an attention scaling, "
                                 f"and rope type {rope._spec.rope_type!r} has one")
            rope.reverse = True
        rope.feature_slice = slice(*c["features"])
        return rope

    def frequencies(self, seq_len: int | None = None) -> RopeFrequencies:
        """The frequency of each rotated pair, for sequences of seq_len positions."""
        freqs = self._spec.frequencies(seq_len)
        if self._pair_freq is None:
            return freqs
        return RopeFrequencies(freqs.inv_freq[self._pair_freq], freqs.attention_scaling)

    def cos_sin(self, positions: ArrayLike, *,
                dtype: DTypeLike = "float32") -> tuple[np.ndarray, np.ndarray]:
        """A cos/sin cache for :func:`apply_rope_cached`: positions.shape +
        (rotary_dim // 2,). With axes > 1, positions are (axes, ...) and the
        result has the shape of one axis's positions; (seq,) positions are text
        positions, every axis the same (as a call reads them; refused where the
        call refuses them). Positions may be real-valued, as for
        :func:`rope_cos_sin`."""
        if self._halves is not None or self._pair_axis2 is not None:
            raise ValueError("this embedding does not turn each pair by one angle per "
                             "token, which one cos/sin table for apply_rope_cached cannot "
                             "express")
        reverse = self._check_settings()
        pos, hi = _args.table_positions(positions)
        if hi is None:  # real-valued: DINOv3's patch centres, SAM's grids
            _args.refuse_length_dependent(self._spec)
        freqs = self.frequencies(hi + 1 if hi is not None and hi >= 0 else None)
        if self._pair_axis is None:
            cos, sin = rope_cos_sin(pos, freqs, dtype=dtype)
            if reverse:
                np.negative(sin, out=sin)
            return cos, sin
        if pos.ndim == 1:
            if not self._text_positions:
                _args.refuse_text_positions(pos.shape, self.axes, 1, pos.shape[0])
            pos = np.broadcast_to(pos, (self.axes, pos.shape[0]))
        if pos.ndim < 1 or pos.shape[0] != self.axes:
            raise ValueError(f"positions must have shape ({self.axes}, ...), one row per "
                             f"axis, got {pos.shape}")
        dt = _checks.float_dtype(dtype, "dtype")
        angles = np.moveaxis(pos[self._pair_axis], 0, -1).astype(np.float64) * freqs.inv_freq
        att = freqs.attention_scaling
        return (np.cos(angles) * att).astype(dt), (np.sin(angles) * att).astype(dt)

    def __call__(self, q: InPlace, k: Any = None, positions: PositionsLike = None,
                 *, offset: int = 0, layout: RopeLayout | None = None,
                 inverse: bool = False,
                 num_threads: int | None = None) -> tuple[InPlace, Any]:
        """apply_rope with this model's frequencies, rotary_dim and style."""
        kern = _kernels()
        if kern is not None:
            # arrays and a model's own torch tensors alike, checked and viewed once in C;
            # positions of one axis, or none: every axis of M-RoPE takes the same position
            if positions is None or self.axes == 1:
                state = self._compiled_state
                if state is None:
                    state = self._keep_state("_compiled_state", self._make_state)
            else:
                # M-RoPE's and 2D RoPE's (axes, 1 or batch, seq) positions, one per axis
                state = self._compiled_axes_state
                if state is None:
                    state = self._keep_state("_compiled_axes_state", self._make_axes_state)
                if getattr(positions, "ndim", 0) != 3:
                    state = False
            if state:
                done = kern.rope_call(state, q, k, positions, offset, self.style, layout,
                                      inverse, num_threads, None, None,
                                      _threads.SERIAL_BYTES, 0)
                if done == 1 or (done and _with_team(kern, done, state, q, k, positions,
                                                     offset, self.style, layout, inverse,
                                                     num_threads, None, None)):
                    return q, k
        given = q, k
        inverse = _checks.flag(inverse, "inverse")
        q, k, positions, layout, _, _ = _tensor_views(q, k, positions, layout)
        self._rotate(q, k, positions, offset, layout, inverse, num_threads)
        if q is not given[0] or k is not given[1]:
            _checks.bump_written(*given)
        return given

    def _rotate(self, q: Any, k: Any, positions: Any, offset: Any, layout: Any,
                inverse: bool, num_threads: Any) -> None:
        """__call__'s validating path (arrays, inverse a bool)."""
        if self._check_settings():
            inverse = not inverse
        if self._halves is not None:
            for plan in self._half_plans(q, k, positions, offset, layout, inverse, num_threads):
                _run(plan)
            return
        plan = _args.rope(q, k, positions=positions, offset=offset, rotary_dim=self.rotary_dim,
                          freqs=None, base=None, scaling=None, max_position_embeddings=None,
                          style=self.style, layout=layout, inverse=inverse,
                          num_threads=num_threads, spec=self._spec, spec_head_dim=self.head_dim,
                          axes=self.axes, pair_axis=self._pair_axis, pair_freq=self._pair_freq,
                          pair_axis2=self._pair_axis2, text_positions=self._text_positions)
        _run(plan)

    # the compiled entry's RopeState for this embedding's settings (False: none, the call
    # is not one pairing of one position per token), formed on the first call after any
    # attribute changes; never pickled
    _compiled_state: Any = None
    _compiled_axes_state: Any = None  # the same for positions of every axis
    _compiled_generation = 0          # attribute changes so far

    def _keep_state(self, name: str, make: Any) -> Any:
        """make(), kept as the cached state `name` unless an attribute changed (another
        thread) while it was made: such a state may hold the old value."""
        generation = self._compiled_generation
        state = make()
        object.__setattr__(self, name, state)
        if self._compiled_generation != generation:
            object.__setattr__(self, name, None)
        return state

    # leading tokens the model leaves unrotated (DINOv3's CLS and registers): the
    # caller passes q[:, prefix_tokens:]
    prefix_tokens: int = 0

    # what the frequencies were parsed from: fixed once made (a new value would be kept
    # and never used)
    _FIXED = frozenset({"rotary_dim", "base", "scaling", "max_position_embeddings",
                        "mrope_section", "mrope_interleaved"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._FIXED and (name != "rotary_dim" or name in self.__dict__):
            raise AttributeError(f"RotaryEmbedding.{name} is fixed when the embedding is made "
                                 f"(its frequencies come from it): make a new "
                                 f"RotaryEmbedding, or use from_hf_config")
        object.__setattr__(self, name, value)
        if not name.startswith("_compiled_"):
            object.__setattr__(self, "_compiled_generation", self._compiled_generation + 1)
            object.__setattr__(self, "_compiled_state", None)
            object.__setattr__(self, "_compiled_axes_state", None)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_compiled_state", "_compiled_axes_state", "_compiled_generation"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # pickled before these were kept: the layout's axes are those it holds, and
        # text positions taken as they were then
        state.setdefault("_layout_axes", state.get("axes", 1))
        state.setdefault("_text_positions", True)
        self.__dict__.update(state)

    def _check_settings(self) -> bool:
        """head_dim, axes and reverse as they stand (public attributes, which a caller may
        set after construction), checked as the constructor checks them, before either
        backend takes the call; returns reverse as a bool."""
        reverse = _checks.flag(self.reverse, "RotaryEmbedding.reverse")
        _checks.count(self.head_dim, "RotaryEmbedding.head_dim", minimum=1)
        axes = _checks.count(self.axes, "RotaryEmbedding.axes", minimum=1)
        if axes > _args.MAX_AXES:
            raise ValueError(f"RotaryEmbedding.axes must be in [1, {_args.MAX_AXES}], got {axes}")
        if axes > 1 and self._pair_axis is None:
            raise ValueError(f"RotaryEmbedding.axes={axes} needs mrope_section (which frequency "
                             f"pairs rotate by which axis): make a new RotaryEmbedding")
        if self._pair_axis is not None and axes != self._layout_axes:
            raise ValueError(f"RotaryEmbedding.axes={axes}: its pairs rotate by "
                             f"{self._layout_axes} position axes (mrope_section, or the "
                             f"model's layout): make a new RotaryEmbedding")
        return reverse

    def _make_state(self) -> Any:
        reverse = self._check_settings()
        if (_backend.compiled is None or not self._text_positions or self._pair_freq is not None
                or self._halves is not None or self._pair_axis2 is not None):
            return False
        return _state(self._spec, self.head_dim, reverse) or False

    def _make_axes_state(self) -> Any:
        """The RopeState of calls with positions of every axis: each pair's frequency
        and axis (False: none, for frequencies that depend on the call's length or a
        head split in halves)."""
        reverse = self._check_settings()
        kern = _backend.compiled
        if kern is None or self._halves is not None or self._pair_axis is None:
            return False
        base = _state(self._spec, self.head_dim, reverse)
        if not base or base.switch >= 0:
            return False
        inv_freq = base.inv_freq if self._pair_freq is None else np.ascontiguousarray(
            base.inv_freq[self._pair_freq])
        return kern.RopeState(self.head_dim, base.flip, inv_freq, base.att, -1, None,
                              self._pair_axis, self._pair_axis2, self.axes)

    def _half_plans(self, q: object, k: object, positions: object, offset: object,
                    layout: object, inverse: object,
                    num_threads: object) -> list[_args.RopePlan]:
        """Plans for the two halves of the head, each rotated (rotate_half pairing)
        by its own axis's positions; every argument is checked before either half
        is written."""
        q4, k4 = _args.rope_views(q, k, layout)
        if q4.shape[3] != self.head_dim:
            raise ValueError(f"q has head_dim {q4.shape[3]} but this RotaryEmbedding is for "
                             f"head_dim {self.head_dim}")
        pos, multi = _args.axis_positions(positions, offset, q4.shape[0], q4.shape[1],
                                          self.axes, self._text_positions)
        _args.rope_disjoint(q4, k4, (positions, "positions"))
        assert self._halves is not None
        width = self.head_dim // 2
        plans = []
        for part, axis in enumerate(self._halves):
            cols = slice(part * width, (part + 1) * width)
            plans.append(_args.rope(q4[..., cols], None if k4 is None else k4[..., cols],
                                    positions=pos.as_array(q4.shape[1])[axis] if multi else positions,
                                    offset=0 if multi else offset, rotary_dim=None, freqs=None,
                                    base=None, scaling=None, max_position_embeddings=None,
                                    style="neox", layout="bshd", inverse=inverse,
                                    num_threads=num_threads, spec=self._spec, spec_head_dim=width))
        return plans

    @property
    def rope_type(self) -> str:
        """The scaling the frequencies follow, by transformers' name for it ("default",
        "linear", "dynamic", "yarn", "longrope", "llama3", ...), as parsed: a Phi-3
        config.json's "su" or "yarn" reads "longrope", as its config class reads it."""
        return self._spec.rope_type

    def __repr__(self) -> str:
        return (f"RotaryEmbedding(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"style={self.style!r}, rope_type={self.rope_type!r}, "
                f"base={self._spec.base}" + (f", axes={self.axes})" if self.axes > 1 else ")"))
