"""Relative-position biases of encoders: T5's buckets and DeBERTa's disentangled attention.

T5 (Raffel et al., 2020; also mT5, UMT5, LongT5's and UDOP's decoders, Switch
Transformers, Pop2Piano, Pix2Struct's text decoder, MPNet) learns one bias per head for
each of ``num_buckets`` buckets of the distance ``key_pos - query_pos``: exact for short
distances, logarithmic up to ``max_distance``. :func:`add_relative_bias` adds
``table[bucket(j - q_pos_i), h]`` to attention scores in one pass, the causal and
padding masks fused.

DeBERTa (He et al., 2021; DeBERTa-v2/v3, mDeBERTa, SEW-D) adds to each score the
content-to-position logit of the query at the key's relative position and the
position-to-content logit of the key at the query's: two gathers from matrix products
the caller makes (``query @ pos_key^T``, ``key @ pos_query^T``).
:func:`add_disentangled_bias` does both gathers and the add in one pass.

The bucket functions are transformers' own, float32 steps included (see
fastpe._relative_math); their tables are built once per setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _backend, _checks, _relative_args, _relative_math, _threads, reference
from ._constants import T5_BYTES_WEIGHT, VIEW_DIMS
from ._typing import ArrayLike, DTypeLike, InPlace

__all__ = ["DisentangledBias", "RelativeBias", "add_disentangled_bias", "add_relative_bias",
           "deberta_relative_positions", "relative_bias", "relative_position_bucket"]

TRANSFORMERS_CHECKED = "5.25"

# DeBERTa's gathers, as T5's (fastpe._constants.T5_BYTES_WEIGHT), are bound by the core
# and by scattered reads rather than by streaming bandwidth: on the 2-vCPU Intel Xeon two
# threads took 0.67-0.72x the time of one on a DeBERTa bias of 2.5 MiB read and written.
# Its bytes count this many times.
DEBERTA_BYTES_WEIGHT = 2


def _run_t5(plan: _relative_args.T5Plan) -> None:
    kern = _backend.kernels()
    if kern is None:
        reference.run_relative_bias(plan)
        return
    if plan.scores.size == 0:
        return  # nothing to write (an offset past int64 is then no error)
    x = plan.scores
    if x.ndim > VIEW_DIMS:
        # the entry views up to VIEW_DIMS axes: each index of the first axis in turn, with
        # its sequences' mask rows
        rows = x[0].size // (x.shape[-3] * x.shape[-2] * x.shape[-1])
        for i in range(x.shape[0]):
            mask = plan.key_mask
            if mask is not None and mask.shape[0] > 1:
                mask = mask[i * rows:(i + 1) * rows]
            _run_t5(plan._replace(scores=x[i], key_mask=mask))
        return
    spec = plan.spec
    threads = _threads.resolve(plan.num_threads, (2 if plan.accumulate else 1)
                               * T5_BYTES_WEIGHT * x.nbytes)
    # the table as the call's own copy: the entry proves it apart from the scores only
    # where byte ranges or a lattice show it, where the validating path's check is exact
    table = _checks.kernel_view(plan.table)
    if table is plan.table:
        table = table.copy()
    with _checks.kernel_views(x) as (work,):
        done = kern.t5_call(work, table, spec.bidirectional,
                            spec.max_distance, plan.q_offset, plan.causal, plan.key_mask, None,
                            {(spec.num_buckets, spec.max_distance, spec.bidirectional): spec},
                            spec.num_buckets, 0, threads, plan.accumulate)
    if not done:
        raise _checks.entry_declined("T5's relative bias")


def _t5_call(kern: Any, scores: object, table: object, bidirectional: object,
             max_distance: object, q_offset: object, causal: object, key_mask: object,
             num_threads: Any, num_buckets: int = -1, accumulate: bool = True) -> bool:
    """The compiled entry on the caller's objects (NumPy integers as Python ints): False,
    with nothing written, for a call it does not take (the validating path then runs it,
    or names what is wrong). num_buckets: the table's rows a RelativeBias takes (any
    other count goes that path); accumulate False writes the bias over the scores."""
    if type(max_distance) is not int:
        max_distance = _checks.plain_int(max_distance)
    if q_offset is not None and type(q_offset) is not int:
        q_offset = _checks.plain_int(q_offset)
    done: int = kern.t5_call(scores, table, bidirectional, max_distance, q_offset, causal,
                             key_mask, num_threads, _relative_math.T5_SPECS, num_buckets,
                             _threads.SERIAL_BYTES, 0, accumulate)
    if done > 1:  # past the serial size: again, with the team the thread policy gives
        done = kern.t5_call(scores, table, bidirectional, max_distance, q_offset, causal,
                            key_mask, num_threads, _relative_math.T5_SPECS, num_buckets, 0,
                            _threads.resolve(num_threads, done), accumulate)
    return done == 1


def _run_deberta(plan: _relative_args.DebertaPlan) -> None:
    kern = _backend.kernels()
    if kern is None:
        reference.run_disentangled_bias(plan)
        return
    nbytes = DEBERTA_BYTES_WEIGHT * (2 * plan.scores.nbytes + sum(
        a.nbytes for a in (plan.c2p, plan.p2c) if a is not None))
    c2p = None if plan.c2p is None else _checks.kernel_view(plan.c2p)
    p2c = None if plan.p2c is None else _checks.kernel_view(plan.p2c)
    with _checks.kernel_views(plan.scores) as (work,):
        kern.deberta_disentangled(work, _checks.dtype_code(work.dtype, "scores"), c2p, p2c,
                                  plan.spec.c2p_index, plan.spec.p2c_index, plan.spec.reach,
                                  plan.spec.linear, plan.spec.span,
                                  _threads.resolve(plan.num_threads, nbytes))


# ---- T5 ----------------------------------------------------------------------------------

def relative_position_bucket(relative_position: ArrayLike, *, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """T5's bucket of each distance ``key_pos - query_pos``, as int64 of the same shape.

    transformers' ``T5Attention._relative_position_bucket``, its float32 steps repeated
    with the correctly rounded float32 log. bidirectional (encoders): half the buckets
    for keys after the query; unidirectional (decoders): keys after the query share
    bucket 0. Within a direction, distances below half its buckets are exact; the rest
    grow logarithmically and all distances from about ``max_distance`` on share the last
    bucket.

    torch's float32 log (within an ulp) gives the same bucket at every distance below
    2**18 for the families' settings; at settings far from theirs it can give the
    neighbouring one (``num_buckets=1000, max_distance=2**21``: distance -837794).

    >>> fastpe.relative_position_bucket(np.array([-200, -20, -3, 0, 3, 20, 200]))
    array([15, 10,  3,  0, 19, 26, 31])
    """
    return reference.relative_position_bucket(relative_position, bidirectional=bidirectional,
                                              num_buckets=num_buckets,
                                              max_distance=max_distance)


def relative_bias(table: ArrayLike, q_len: int, k_len: int, *, bidirectional: bool = True,
                  max_distance: int = 128, q_offset: int | None = None, causal: bool = False,
                  dtype: DTypeLike | None = None, out: np.ndarray | None = None,
                  num_threads: int | None = None) -> np.ndarray:
    """The (heads, q_len, k_len) T5 bias: ``bias[h, i, j] = table[bucket(j - (q_offset + i)), h]``.

    Parameters
    ----------
    table : array (num_buckets, heads)
        transformers' ``relative_attention_bias.weight``; num_buckets is its row count.
    q_len, k_len : int
        Queries (rows) and keys (columns); key j is at position j.
    bidirectional, max_distance : as in :func:`relative_position_bucket`.
    q_offset : int, optional
        Position of query 0; default k_len - q_len (decode with a cache: the queries
        are the newest keys). transformers' ``past_seen_tokens``.
    causal : bool
        -inf where the key comes after the query.
    dtype : dtype, optional
        Default: out's dtype, else the table's.
    out : ndarray, optional
        A writable (heads, q_len, k_len) array to fill and return.
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``.

    The values are the table's, rounded to the output dtype (exact when it is the
    table's): transformers' ``compute_bias(q_len, k_len, past_seen_tokens=q_offset)[0]``
    (its default of 0 past tokens is ``q_offset=0`` here).
    """
    made = _t5_bias_compiled(table, q_len, k_len, bidirectional, max_distance, q_offset,
                             causal, dtype, out, num_threads)
    if made is not None:
        return made
    plan = _relative_args.relative_bias(table, q_len, k_len, bidirectional=bidirectional,
                                        max_distance=max_distance, q_offset=q_offset,
                                        causal=causal, dtype=dtype, out=out,
                                        num_threads=num_threads)
    _run_t5(plan)
    _checks.bump_written(out)
    return plan.scores if out is None else out


def add_relative_bias(scores: InPlace, table: ArrayLike, *, bidirectional: bool = True,
                      max_distance: int = 128, q_offset: int | None = None,
                      causal: bool = False, key_mask: ArrayLike | None = None,
                      num_threads: int | None = None) -> InPlace:
    """``scores[..., h, i, j] += table[bucket(j - (q_offset + i)), h]`` in place, in one pass.

    Parameters
    ----------
    scores : array (..., heads, q_len, k_len)
        Attention scores, written in place (and returned): an ndarray, or a torch CPU
        tensor or other array viewed in place through DLPack or the buffer protocol;
        float16/32/64 or bfloat16 (with ml_dtypes), any strides. Arithmetic is float32
        (float64 for float64 scores), each table value rounded once to it.
    table : array (num_buckets, heads)
        transformers' ``relative_attention_bias.weight``, any float dtype.
    bidirectional, max_distance : as in :func:`relative_position_bucket`.
    q_offset : int, optional
        Position of query 0; default k_len - q_len (decode with a cache).
    causal : bool
        -inf where the key comes after the query (a decoder's self-attention).
    key_mask : array of bool or 0/1, optional
        transformers' ``attention_mask`` (1 = attend): (k_len,), (1, k_len), (batch,
        k_len) with batch the leading dims flattened, or the leading dims followed by
        k_len. Masked keys get -inf (a row with every key masked softmaxes to NaN,
        where transformers adds a finite minimum).
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``; small calls run serially.

    In a T5 layer (``table`` its ``relative_attention_bias.weight``)::

        scores = q @ k.transpose(0, 1, 3, 2)                 # T5 does not scale
        fastpe.add_relative_bias(scores, table, key_mask=attention_mask)
    """
    kern = _backend.kernels()
    if kern is None or not _t5_call(kern, scores, table, bidirectional, max_distance, q_offset,
                                    causal, key_mask, num_threads):
        _run_t5(_relative_args.add_relative_bias(
            scores, table, bidirectional=bidirectional, max_distance=max_distance,
            q_offset=q_offset, causal=causal, key_mask=key_mask, num_threads=num_threads))
        if type(scores) is not np.ndarray:
            _checks.bump_written(scores)
    return scores


def _t5_bias_compiled(table: object, q_len: int, k_len: int, bidirectional: object,
                      max_distance: object, q_offset: object, causal: object, dtype: object,
                      out: object, num_threads: object) -> np.ndarray | None:
    """relative_bias of an ndarray table through the compiled entry (a decode step's
    bias in 2-3 us, where the validating path takes 10): the bias, or None for a call it
    does not take, with nothing written. A float64 table into a half type goes that
    path, which rounds it once (the kernels read it through float32)."""
    most = _checks.COMPILED_TABLE_ELEMENTS
    kern = _backend.kernels()
    if (kern is None or type(table) is not np.ndarray or table.ndim != 2
            or not table.dtype.isnative or type(q_len) is not int or type(k_len) is not int
            or not 0 <= q_len <= most or not 0 <= k_len <= most):
        return None
    heads = table.shape[1]
    if heads * q_len * k_len > most:
        return None
    bias = _checks.compiled_output(out, dtype, (heads, q_len, k_len), table.dtype)
    if bias is None or (bias.dtype.itemsize == 2 and table.dtype.itemsize == 8):
        return None
    if _t5_call(kern, bias, table, bidirectional, max_distance, q_offset, causal, None,
                num_threads, accumulate=False):
        return bias
    return None


# ---- DeBERTa ------------------------------------------------------------------------------

def deberta_relative_positions(q_len: int, k_len: int, *, position_buckets: int = -1,
                               max_relative_positions: int = -1) -> np.ndarray:
    """DeBERTa's (q_len, k_len) relative positions of query i to key j, int64.

    transformers' DebertaV2 ``build_relative_position`` (without its leading axis):
    ``i - j``, log-bucketed (``make_log_bucket_position``, float32 steps included)
    when position_buckets and max_relative_positions are both > 0, with the correctly
    rounded float32 log. For the released models' settings torch's float32 log gives the
    same positions below distance 2**18; at other settings a distance whose bucket
    turns on the log's last bit can be one bucket over (163 buckets over 485 positions:
    distance 198), where torch's log is not correctly rounded (fastpe._relative_math).
    """
    return reference.deberta_relative_positions(q_len, k_len, position_buckets=position_buckets,
                                                max_relative_positions=max_relative_positions)


def add_disentangled_bias(scores: InPlace, *, c2p: ArrayLike | None = None,
                          p2c: ArrayLike | None = None, position_buckets: int = -1,
                          max_relative_positions: int,
                          num_threads: int | None = None) -> InPlace:
    """DeBERTa's relative attention added to scores in place, in one pass.

    ``scores[..., h, i, j] += c2p[..., h, i, ci] + p2c[..., h, j, pi]`` with
    ``ci = clamp(r(i, j) + span, 0, 2 span - 1)`` and ``pi = clamp(-r(j, i) + span, 0,
    2 span - 1)``, r the relative positions of :func:`deberta_relative_positions` and
    span transformers' ``pos_ebd_size`` (position_buckets when > 0, else
    max_relative_positions): what DebertaV2's ``disentangled_attention_bias`` returns,
    added to the scores.

    Parameters
    ----------
    scores : array (..., heads, q_len, k_len)
        ``query @ key^T / scale``, written in place; any float dtype, any strides.
    c2p : array (..., heads, q_len, 2 span), optional
        Content-to-position logits ``query @ pos_key^T / scale`` (pos_att_type "c2p").
    p2c : array (..., heads, k_len, 2 span), optional
        Position-to-content logits ``key @ pos_query^T / scale`` ("p2c"); needs q_len ==
        k_len (transformers' own p2c term has no other shape that adds to the scores).
    position_buckets, max_relative_positions : int
        The model's settings, as its attention module resolves them (DebertaV2 replaces a
        max_relative_positions < 1 by max_position_embeddings, so max_relative_positions
        is required and one < 1 is a ValueError: pass that; position_buckets < 1: no
        log buckets); see :meth:`DisentangledBias.from_hf_config`.
    num_threads : int, optional
        Threads; default ``fastpe.get_num_threads()``.

    The two logits are summed in the compute type (float32, float64 for float64 scores)
    and the sum added, as transformers adds its ``score`` to the attention scores.
    """
    _run_deberta(_relative_args.add_disentangled_bias(
        scores, c2p=c2p, p2c=p2c, position_buckets=position_buckets,
        max_relative_positions=max_relative_positions, num_threads=num_threads))
    if type(scores) is not np.ndarray:
        _checks.bump_written(scores)
    return scores


# ---- loaders from transformers configs -------------------------------------------------------

def _config_dict(config: object) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, dict):
            return d
    raise TypeError(f"config must be a transformers config or its dict, got "
                    f"{type(config).__name__}")


def _setting(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"config[{key!r}] is missing: it is needed to reproduce "
                         f"{cfg.get('model_type')!r}'s relative positions")
    return value


def _int_setting(cfg: Mapping[str, Any], key: str, default: Any = None) -> int:
    """An integer setting, named when it is not one (the model's own code would fail on
    it with Python's comparison error, or index with it)."""
    value = _setting(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"config[{key!r}] must be an int, got {value!r}")
    return int(value)


# The T5-bucket families whose attention is T5Attention's (a bucket per distance, one
# table per layer or per stack): model_type -> (encoder has it, decoder has it)
T5_FAMILIES = {
    "t5": (True, True), "mt5": (True, True), "umt5": (True, True),
    "switch_transformers": (True, True), "pop2piano": (True, True),
    "longt5": (False, True), "pix2struct_text_model": (False, True),
    "pix2struct": (False, True), "mpnet": (True, False), "udop": (False, True),
}
# why the encoders of the families with a decoder only above are not T5's
T5_ENCODER_REFUSED = {
    "longt5": "its encoder uses local or transient-global attention over blocks "
              "(encoder_attention_type), not one bias per query and key",
    "udop": "its encoder adds 2D layout biases of the token boxes to the 1D buckets (its "
            "decoder's are T5's: pass decoder=True)",
}
# Families with T5's bucket function whose bias fastpe does not reproduce, and why.
T5_REFUSED = {
    "layoutlmv2": "it adds 2D biases of the token boxes and buckets per-sequence positions",
    "layoutlmv3": "it adds 2D biases of the token boxes and buckets per-sequence positions",
    "wavlm": "its gated relative bias depends on the hidden states",
    "prophetnet": "its n-gram stream attends with its own main/predict relative buckets",
    "cpmant": "it buckets segment-relative positions with its own function",
    "pp_doclayout_v2": "its relative bias is over 2D detection queries",
}


class RelativeBias:
    """T5-style bucketed relative bias settings, parsed once; the weight table is given
    per call (UMT5 has one per layer).

    ``num_buckets``, ``max_distance`` and ``bidirectional`` are
    :func:`relative_position_bucket`'s (the config's relative_attention_num_buckets and
    relative_attention_max_distance; bidirectional False for a decoder), ``causal`` masks
    the keys after each query (a decoder's self-attention); a call is
    :func:`add_relative_bias` with them.

    With a model's config and one layer's logits and weights::

        rb = fastpe.RelativeBias.from_hf_config(t5_config)               # encoder
        rb(scores, layer.relative_attention_bias.weight.detach(), key_mask=attention_mask)
        dec = fastpe.RelativeBias.from_hf_config(t5_config, decoder=True)  # causal
    """

    def __init__(self, num_buckets: int = 32, *, max_distance: int = 128,
                 bidirectional: bool = True, causal: bool = False) -> None:
        self._spec = _relative_args.t5_settings(num_buckets, bidirectional, max_distance)
        self.causal = _checks.flag(causal, "causal")

    @property
    def num_buckets(self) -> int:
        return self._spec.num_buckets

    @property
    def max_distance(self) -> int:
        return self._spec.max_distance

    @property
    def bidirectional(self) -> bool:
        return self._spec.bidirectional

    def __repr__(self) -> str:
        return (f"RelativeBias(num_buckets={self.num_buckets}, max_distance="
                f"{self.max_distance}, bidirectional={self.bidirectional}, "
                f"causal={self.causal})")

    @classmethod
    def from_hf_config(cls, config: object, *, decoder: bool = False) -> RelativeBias:
        """The settings transformers' attention uses for this config: the encoder's
        self-attention (bidirectional), or with ``decoder=True`` the decoder's (keys
        after the query share bucket 0, and causal). A decoder stack's own config
        (``is_decoder=True``, as ``model.decoder.config``) needs ``decoder=True``. A
        family whose relative bias is not T5's per-distance bucket lookup is a
        ValueError naming what it adds."""
        cfg = _config_dict(config)
        decoder = _checks.flag(decoder, "decoder")
        model_type = cfg.get("model_type")
        if model_type == "pix2struct":
            cfg = _config_dict(_setting(cfg, "text_config"))
            model_type = "pix2struct_text_model"
        if model_type in T5_REFUSED:
            raise ValueError(f"model_type {model_type!r}: fastpe does not reproduce its "
                             f"relative bias: {T5_REFUSED[model_type]}")
        if model_type not in T5_FAMILIES:
            raise ValueError(f"model_type {model_type!r} is not a T5-bucket family fastpe "
                             f"checked against transformers {TRANSFORMERS_CHECKED} (known: "
                             f"{', '.join(sorted(T5_FAMILIES))})")
        encoder_ok, decoder_ok = T5_FAMILIES[model_type]
        if decoder and not decoder_ok:
            raise ValueError(f"model_type {model_type!r} has no decoder")
        if not decoder and not encoder_ok:
            why = T5_ENCODER_REFUSED.get(model_type, "it is a decoder: pass decoder=True")
            raise ValueError(f"model_type {model_type!r}: {why}")
        if model_type == "mpnet":
            # MPNetEncoder.compute_position_bias buckets with its defaults (32 buckets,
            # max_distance 128) whatever the config says: relative_attention_num_buckets
            # only sizes the table, whose later rows are never read
            mpnet = cls(32, max_distance=128, bidirectional=True)
            mpnet._reads_first_rows = True
            return mpnet
        if not decoder and cfg.get("is_decoder"):
            # a decoder stack's own config (model.decoder.config) buckets one way; a
            # top-level config's encoder ignores the key: which one this is, it cannot say
            raise ValueError(f"config of model_type {model_type!r} has is_decoder="
                             f"{cfg['is_decoder']!r} (a decoder stack's config): pass "
                             "decoder=True for the decoder's self-attention")
        num_buckets = _int_setting(cfg, "relative_attention_num_buckets", 32)
        max_distance = _int_setting(cfg, "relative_attention_max_distance", 128)
        return cls(num_buckets, max_distance=max_distance, bidirectional=not decoder,
                   causal=decoder)

    # MPNet's settings (from_hf_config) read the first num_buckets rows of a table its
    # config may size larger; any other table has one row per bucket
    _reads_first_rows = False

    def _rows(self, table: ArrayLike) -> ArrayLike:
        """The table rows these settings read: all num_buckets of them, or MPNet's
        first num_buckets; other row counts are an error (a table of more rows is
        another setting of num_buckets, which would bucket otherwise)."""
        rows = _checks.as_array(table, "table")
        if rows.ndim != 2 or rows.shape[0] == self.num_buckets:
            return rows           # the functions check the rest, and name it
        if rows.shape[0] < self.num_buckets or not self._reads_first_rows:
            raise ValueError(f"table has {rows.shape[0]} rows (buckets), these settings "
                             f"bucket into {self.num_buckets}: check the config's "
                             f"relative_attention_num_buckets")
        return rows[:self.num_buckets]

    def buckets(self, relative_position: ArrayLike) -> np.ndarray:
        """relative_position_bucket of these settings."""
        return _relative_math.t5_buckets(self._spec,
                                         _relative_args.distances(relative_position))

    def bias(self, table: ArrayLike, q_len: int, k_len: int, *, q_offset: int | None = None,
             dtype: DTypeLike | None = None, out: np.ndarray | None = None,
             num_threads: int | None = None) -> np.ndarray:
        """relative_bias of these settings (the causal mask included when causal)."""
        return relative_bias(self._rows(table), q_len, k_len, bidirectional=self.bidirectional,
                             max_distance=self.max_distance, q_offset=q_offset,
                             causal=self.causal, dtype=dtype, out=out,
                             num_threads=num_threads)

    def __call__(self, scores: InPlace, table: ArrayLike, *, q_offset: int | None = None,
                 key_mask: ArrayLike | None = None,
                 num_threads: int | None = None) -> InPlace:
        """add_relative_bias of these settings."""
        kern = _backend.kernels()
        spec = self._spec
        if kern is not None and _t5_call(kern, scores, table, spec.bidirectional,
                                         spec.max_distance, q_offset, self.causal, key_mask,
                                         num_threads, spec.num_buckets):
            return scores
        return add_relative_bias(scores, self._rows(table), bidirectional=self.bidirectional,
                                 max_distance=self.max_distance, q_offset=q_offset,
                                 causal=self.causal, key_mask=key_mask,
                                 num_threads=num_threads)


# DeBERTa-v2's attention (DisentangledSelfAttention) and the families that copy it, and
# DeBERTa (v1), whose span follows the sequence.
DEBERTA_FAMILIES = ("deberta", "deberta-v2", "sew-d")
# what each family's config class holds for the keys the loader reads when config.json
# leaves them out (SEW-D's class turns relative attention on, with both logits, 256
# buckets and shared projections; the others' classes leave it off)
_DEBERTA_SIZES = {"max_position_embeddings": 512, "hidden_size": 768, "num_attention_heads": 12}
DEBERTA_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "deberta": {**_DEBERTA_SIZES, "relative_attention": False},
    "deberta-v2": {**_DEBERTA_SIZES, "relative_attention": False, "hidden_size": 1536,
                   "num_attention_heads": 24},
    "sew-d": {**_DEBERTA_SIZES, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
              "position_buckets": 256, "share_att_key": True},
}


class DisentangledBias:
    """DeBERTa's disentangled attention settings, parsed once: DeBERTa-v2/v3, mDeBERTa,
    SEW-D, and DeBERTa (v1) with ``sequence_span``.

    ``span`` is transformers' ``pos_ebd_size`` (the relative embeddings used are
    ``rel_embeddings[:2 * span]``), ``scale`` the divisor of the scores and of both
    logits (``sqrt(head_dim * scale_factor)``, scale_factor 1 + c2p + p2c unless given:
    DebertaV2's "p2p" does not count), ``c2p`` / ``p2c`` whether pos_att_type has them
    and ``share_att_key`` whether the positions are projected by the query and key
    projections themselves.

    ``position_buckets`` and ``max_relative_positions`` are
    :func:`add_disentangled_bias`'s (as the attention resolves them: a
    max_relative_positions < 1 is a ValueError, pass the config's
    max_position_embeddings); ``head_dim`` (optional) gives ``scale``; a call is
    :func:`add_disentangled_bias` with these settings, the logits that ``c2p`` and
    ``p2c`` say the model has.

    With ``sequence_span`` (DeBERTa v1, no buckets) a call's span is
    ``min(max(q_len, k_len), max_relative_positions)`` (:meth:`span_for`), its logits
    are over ``rel_embeddings[embedding_rows(q_len, k_len)]``, the middle 2 span rows of
    the model's 2 max_relative_positions, and its relative positions are ``q - k``
    unclipped; v1 counts every pos_att_type entry in its scale_factor.
    """

    def __init__(self, *, position_buckets: int = -1, max_relative_positions: int,
                 c2p: bool = True, p2c: bool = True, share_att_key: bool = False,
                 head_dim: int | None = None, sequence_span: bool = False,
                 scale_factor: int | None = None) -> None:
        self._spec = _relative_args.deberta_settings(position_buckets, max_relative_positions)
        self.c2p = _checks.flag(c2p, "c2p")
        self.p2c = _checks.flag(p2c, "p2c")
        self.share_att_key = _checks.flag(share_att_key, "share_att_key")
        self.head_dim = None if head_dim is None else _checks.count(head_dim, "head_dim",
                                                                    minimum=1)
        self.sequence_span = _checks.flag(sequence_span, "sequence_span")
        if self.sequence_span and self._spec.position_buckets > 0:
            raise ValueError(f"sequence_span (DeBERTa v1) has no log buckets: position_buckets "
                             f"must be < 1, got {self._spec.position_buckets}")
        self._scale_factor = (None if scale_factor is None
                              else _checks.count(scale_factor, "scale_factor", minimum=1))

    @property
    def position_buckets(self) -> int:
        return self._spec.position_buckets

    @property
    def max_relative_positions(self) -> int:
        return self._spec.max_relative_positions

    @property
    def span(self) -> int:
        if self.sequence_span:
            raise ValueError("DeBERTa v1's span follows the call's lengths: use "
                             "span_for(q_len, k_len)")
        return self._spec.span

    def span_for(self, q_len: int, k_len: int) -> int:
        """The span of a call with these lengths: ``span``, or with sequence_span
        ``min(max(q_len, k_len), max_relative_positions)`` (at least 1)."""
        q, k = _relative_args.deberta_lengths(q_len, k_len)
        if not self.sequence_span:
            return self._spec.span
        return max(1, min(max(q, k), self._spec.max_relative_positions))

    def embedding_rows(self, q_len: int, k_len: int) -> slice:
        """The rows of the model's relative embeddings a call with these lengths
        projects into its logits: the first 2 span, or with sequence_span the 2 span
        around the middle of its 2 max_relative_positions."""
        span = self.span_for(q_len, k_len)
        start = self._spec.max_relative_positions - span if self.sequence_span else 0
        return slice(start, start + 2 * span)

    @property
    def scale_factor(self) -> int:
        """The one given, else 1 + c2p + p2c as they stand."""
        if self._scale_factor is not None:
            return self._scale_factor
        return 1 + int(_checks.flag(self.c2p, "c2p")) + int(_checks.flag(self.p2c, "p2c"))

    @property
    def scale(self) -> float:
        """sqrt(head_dim * scale_factor), rounded to float32 as transformers computes it."""
        if self.head_dim is None:
            raise ValueError("scale needs head_dim (from_hf_config sets it)")
        return float(np.sqrt(np.float32(self.head_dim) * np.float32(self.scale_factor)))

    def __repr__(self) -> str:
        return (f"DisentangledBias(position_buckets={self.position_buckets}, "
                f"max_relative_positions={self.max_relative_positions}, c2p={self.c2p}, "
                f"p2c={self.p2c}, share_att_key={self.share_att_key}, "
                f"head_dim={self.head_dim}, sequence_span={self.sequence_span}, "
                f"scale_factor={self.scale_factor})")

    @classmethod
    def from_hf_config(cls, config: object) -> DisentangledBias:
        """The settings the attention module derives from this config: DebertaV2's
        (also mDeBERTa and DeBERTa-v3, model_type "deberta-v2", and SEW-D) or DeBERTa
        (v1)'s, whose span follows the sequence (``sequence_span``). A config without
        relative attention, or of a family fastpe does not reproduce, is a ValueError."""
        cfg = _config_dict(config)
        model_type = cfg.get("model_type")
        if model_type not in DEBERTA_FAMILIES:
            raise ValueError(f"model_type {model_type!r} is not a DeBERTa-v2 family fastpe "
                             f"checked against transformers {TRANSFORMERS_CHECKED} (known: "
                             f"{', '.join(DEBERTA_FAMILIES)})")
        # a config.json typed by hand may leave keys out: its class's defaults then count
        cfg = {**DEBERTA_CLASS_DEFAULTS[model_type], **cfg}
        if not cfg.get("relative_attention", False):
            raise ValueError(f"config['relative_attention'] is {cfg.get('relative_attention')!r}"
                             f": this {model_type!r} model has no relative attention to add")
        types = cfg.get("pos_att_type")
        if model_type == "sew-d" and not isinstance(types, (list, tuple)):
            raise TypeError(f"config['pos_att_type'] must be a list of strings for SEW-D (its "
                            f"config class refuses anything else), got {types!r}")
        types = [] if types is None else types
        if isinstance(types, str):       # as the config classes split it ("" gives [""])
            types = [t.strip() for t in types.lower().split("|")]
        if not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
            raise TypeError(f"config['pos_att_type'] must be a list of strings or one "
                            f"'|'-separated string, got {cfg.get('pos_att_type')!r}")
        max_rel = _int_setting(cfg, "max_relative_positions", -1)
        if max_rel < 1:
            max_rel = _int_setting(cfg, "max_position_embeddings")
        heads = _int_setting(cfg, "num_attention_heads")
        if heads < 1:
            raise ValueError(f"config['num_attention_heads'] must be >= 1, got {heads}")
        if model_type == "deberta":
            # v1: no buckets, no shared projections, its own head width, and a scale
            # factor of 1 + len(pos_att_type), whatever the entries
            return cls(position_buckets=-1, max_relative_positions=max_rel,
                       c2p="c2p" in types, p2c="p2c" in types,
                       head_dim=_int_setting(cfg, "hidden_size") // heads,
                       sequence_span=True, scale_factor=1 + len(types))
        buckets = _int_setting(cfg, "position_buckets", -1)
        head_dim = (_int_setting(cfg, "attention_head_size") if "attention_head_size" in cfg
                    else _int_setting(cfg, "hidden_size") // heads)
        return cls(position_buckets=buckets, max_relative_positions=max_rel,
                   c2p="c2p" in types, p2c="p2c" in types,
                   share_att_key=bool(cfg.get("share_att_key", False)), head_dim=head_dim)

    def relative_positions(self, q_len: int, k_len: int) -> np.ndarray:
        """deberta_relative_positions of these settings."""
        return deberta_relative_positions(q_len, k_len, position_buckets=self.position_buckets,
                                          max_relative_positions=self._reach(q_len, k_len))

    def _reach(self, q_len: int, k_len: int) -> int:
        return (self.span_for(q_len, k_len) if self.sequence_span
                else self.max_relative_positions)

    def __call__(self, scores: InPlace, *, c2p: ArrayLike | None = None,
                 p2c: ArrayLike | None = None, num_threads: int | None = None) -> InPlace:
        """add_disentangled_bias of these settings; a logit pos_att_type lacks, or one it
        has and the call lacks, is a ValueError. With neither (pos_att_type empty, or
        "p2p" alone) the model adds nothing: the scores are checked and left as they are."""
        wanted = {}
        for name, given, setting in (("c2p", c2p, self.c2p), ("p2c", p2c, self.p2c)):
            wanted[name] = _checks.flag(setting, name)   # an attribute set since, read as made
            if wanted[name] != (given is not None):
                raise ValueError(f"{name}: this model's pos_att_type "
                                 f"{'has' if wanted[name] else 'lacks'} it; "
                                 f"{'pass it' if wanted[name] else 'pass None'}")
        if not any(wanted.values()):
            _relative_args.nothing_to_add(scores, num_threads)
            return scores
        if not self.sequence_span:
            return add_disentangled_bias(scores, c2p=c2p, p2c=p2c,
                                         position_buckets=self.position_buckets,
                                         max_relative_positions=self.max_relative_positions,
                                         num_threads=num_threads)
        # converted once: its lengths set the span the logits are checked against
        x = _relative_args.target(scores, "scores")
        _run_deberta(_relative_args.add_disentangled_bias(
            x, c2p=c2p, p2c=p2c, position_buckets=-1,
            max_relative_positions=self.span_for(*x.shape[-2:]), num_threads=num_threads))
        if type(scores) is not np.ndarray:
            _checks.bump_written(scores)
        return scores
