"""RoPE rotation (Su et al., 2021): apply_rope, apply_rope_cached, rope_cos_sin, RotaryEmbedding.

Truths, independent of the code under test:
- ``rope_oracle``: a float64 rotation written from RoFormer's formula (explicit pair
  indices), and cos/sin of the exact real angle (mpmath when installed, else an exact
  rational product split into two doubles);
- ``fastpe.reference``: the NumPy backend, for "compiled == reference" on every option;
- the frequencies of every scaling type come from ``fastpe.rope_frequencies``, which
  tests/test_rope_scaling.py checks against the published formulas and transformers.

The compiled ``apply_rope`` / ``apply_rope_cached`` / ``RotaryEmbedding.__call__`` go
through one compiled front door (``kernels.rope_call``), which rotates the plain case
and declines the rest to the general, fully validating path; ``path_spy`` records which
one ran, and the tests check both give the same bits.

Sizes: most sequences here are 37 or 40 tokens (more than one 32-token block of the
kernel's angle recurrence, so blocks, reseeds and partial blocks all run). Every shorter
length is swept by ``test_short_sequences_match_reference`` and
``test_decode_sized_calls_do_not_crash``, in fresh interpreters: a scratch-buffer overrun
for sequences under 32 tokens corrupted memory at commit ee8c113.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import rope_oracle as oracle
from conftest import (
    BF16,
    COMPILED,
    F16,
    F32,
    F64,
    FLOAT_DTYPES,
    angle_atol,
    as_f64,
    assert_bytes_equal,
    assert_close,
    entry_callers,
    is_bf16,
    kernel_copies,
    make_awkward,
    needs_compiled,
    run_python,
    teams_asked,
    tolerance,
    unaddressable,
)

import fastpe
from fastpe import reference

ON_CYTHON = fastpe.backend() == "cython"

LAYOUTS = ("bshd", "bhsd", "shd")
STYLES = oracle.STYLES
B, S, HQ, HK, D = 2, 37, 3, 1, 16   # 37 tokens: one full 32-token block and a partial one

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _longrope(original, half=D // 2):
    return {"rope_type": "longrope", "original_max_position_embeddings": original,
            "factor": 8.0, "short_factor": [1.0 + 0.25 * i for i in range(half)],
            "long_factor": [2.0 + 1.5 * i for i in range(half)]}


# Every scaling type, for head_dim D; "above" and "long" use an original context shorter
# than the positions of the tests (< 40 tokens or ~5000), "below" and "short" a longer one.
SCALINGS = {
    "none": None,
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "linear-old-type-key": {"type": "linear", "factor": 2.5},
    "dynamic-below-original": {"rope_type": "dynamic", "factor": 2.0,
                               "original_max_position_embeddings": 1 << 20},
    "dynamic-above-original": {"rope_type": "dynamic", "factor": 2.0,
                               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                    "mscale_all_dim": 0.5, "original_max_position_embeddings": 256,
                    "beta_fast": 16.0, "beta_slow": 2.0},
    "longrope-short": _longrope(1 << 20),
    "longrope-long": _longrope(16),
    "llama3": dict(LLAMA31, original_max_position_embeddings=64),
    "partial_rotary_factor": {"rope_type": "linear", "factor": 2.0,
                              "partial_rotary_factor": 0.5},
}


# ---- helpers -----------------------------------------------------------------------------


def shape_for(layout, batch, seq, heads, dim):
    return {"bshd": (batch, seq, heads, dim), "bhsd": (batch, heads, seq, dim),
            "shd": (seq, heads, dim)}[layout]


def bshd(x, layout):
    """The (batch, seq, heads, dim) view of an array in `layout`."""
    return {"bshd": x, "bhsd": x.transpose(0, 2, 1, 3) if x.ndim == 4 else x,
            "shd": x[None]}[layout]


# Memory layouts of q and k: conftest's awkward kinds that make sense for 4-D in-place
# arrays, plus "transposed" (heads-major memory seen in the layout's axis order).
KINDS = ("contiguous", "transposed", "fortran", "strided-last", "strided-rows", "reversed",
         "byteswapped", "unaligned", "odd-byte-stride")


def make(kind, shape, dtype, seed):
    """A writable array of `dtype` laid out as `kind`, holding deterministic values in
    [-2, 2); two calls with the same arguments give identical twins."""
    if kind == "transposed":
        vals = make_awkward("contiguous", shape, dtype, seed=seed)
        order = list(range(len(shape)))
        order[-3], order[-2] = order[-2], order[-3]
        a = np.empty(tuple(shape[i] for i in order), dtype).transpose(order)
        a[...] = vals
        return a
    return make_awkward(kind, shape, dtype, seed=seed)


def rng_floats(shape, dtype=np.float32, seed=0, scale=2.0):
    return (np.random.default_rng([seed, *shape]).uniform(-scale, scale, shape)).astype(dtype)


def block_positions(batch, seq, seed=0):
    """(batch, seq) int64: per row two consecutive runs (the second far away) and a
    repeated position, so the recurrence, its reseeds and the direct path all run."""
    rng = np.random.default_rng([seed, batch, seq])
    rows = []
    for _ in range(batch):
        start, far = int(rng.integers(0, 500)), int(rng.integers(3000, 5000))
        m = seq // 2 + 3
        row = np.concatenate([start + np.arange(m), far + np.arange(seq - m)])
        row[m // 2] = row[m // 2 - 1]           # a repeat: the direct path mid-block
        rows.append(row)
    return np.array(rows, dtype=np.int64)


def magnitude_of(*xs, att=1.0):
    """Size of the operands of a rotation: a pair's norm times the attention scaling."""
    m = max((float(np.abs(as_f64(x)).max()) for x in xs if x is not None and x.size),
            default=1.0)
    return max(m, 1e-30) * math.sqrt(2.0) * att


def check_rotation(actual, expected, dtype, *, magnitude, max_position=0, context=""):
    atol, rtol = tolerance(dtype, magnitude)
    atol += angle_atol(max_position) * magnitude
    assert_close(actual, expected, dtype, atol=atol, rtol=rtol, context=context)


def frequencies_for(head_dim, *, base=None, scaling=None, seq_len=None,
                    max_position_embeddings=None, rotary_dim=None):
    """What apply_rope should use: rope_frequencies at the width the call implies."""
    dim = head_dim if rotary_dim is None else rotary_dim
    return fastpe.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len,
                                   max_position_embeddings=max_position_embeddings)


def twins(make_fn):
    """Two identical sets of arrays from one factory."""
    return make_fn(), make_fn()


@pytest.fixture
def path_spy(monkeypatch):
    """Records, per rotation call, which compiled path ran: 'fast' (the front door
    kernels.rope_call rotated), 'declined' (it returned 0), 'team' (it asked for the
    team of a large call) and 'general' (the validating path's _run)."""
    events: list[str] = []
    if not ON_CYTHON:
        pytest.skip("the compiled backend is not the one under test")
    real_call = fastpe._backend.compiled.rope_call
    real_run = fastpe.rope._run

    def call(*args):
        done = real_call(*args)
        # 1: rotated; 0: declined; more: the bytes of a large call, asking for a team
        events.append("fast" if done == 1 else "declined" if not done else "team")
        return done

    def run(plan):
        events.append("general")
        return real_run(plan)

    monkeypatch.setattr(fastpe._backend.compiled, "rope_call", call)
    monkeypatch.setattr(fastpe.rope, "_run", run)
    return events


def took(events, path):
    got = "general" if "general" in events else ("fast" if "fast" in events else "none")
    events.clear()
    return got == path, got


# ---- compiled == reference == formula, every layout, memory order and dtype --------------


def _matrix_params():
    out = []
    for dtype in FLOAT_DTYPES:
        for kind in KINDS:
            if kind == "byteswapped" and is_bf16(dtype):
                continue  # ml_dtypes has no byte-swapped bfloat16
            for layout in LAYOUTS:
                out.append(pytest.param(kind, np.dtype(dtype), layout,
                                        id=f"{dtype}-{kind}-{layout}"))
    return out


def _run_matrix(kind, dtype, layout, fn, style, inverse=False, seed=0):
    batch = 1 if layout == "shd" else B
    pos2 = block_positions(batch, S, seed)
    positions = pos2[0] if layout == "shd" else pos2
    q = make(kind, shape_for(layout, B, S, HQ, D), dtype, seed=seed + 1)
    k = make(kind, shape_for(layout, B, S, HK, D), dtype, seed=seed + 2)
    q_in, k_in = as_f64(bshd(q, layout)), as_f64(bshd(k, layout))
    out = fn(q, k, positions, style=style, layout=layout, inverse=inverse)
    assert out[0] is q and out[1] is k
    return q, k, q_in, k_in, pos2


@pytest.mark.parametrize("kind, dtype, layout", _matrix_params())
def test_matches_reference_every_layout_memory_order_and_dtype(kind, dtype, layout):
    for style in STYLES:
        for inverse in (False, True):
            q, k, q_in, _, pos = _run_matrix(kind, dtype, layout, fastpe.apply_rope, style,
                                             inverse)
            qr, kr, *_ = _run_matrix(kind, dtype, layout, reference.apply_rope, style,
                                     inverse)
            ctx = f"{style} inverse={inverse} {kind} {dtype} {layout} q {q.shape}"
            mag = magnitude_of(q_in)
            check_rotation(q, qr, dtype, magnitude=mag, max_position=pos.max(), context=ctx)
            check_rotation(k, kr, dtype, magnitude=mag, max_position=pos.max(),
                           context=ctx.replace(" q ", " k "))


@pytest.mark.parametrize("kind, dtype, layout", _matrix_params())
def test_matches_formula_every_layout_memory_order_and_dtype(kind, dtype, layout):
    w = 1.0 / 10000.0 ** (np.arange(0, D, 2) / D)   # RoFormer's theta_j, base 10000
    for style in STYLES:
        q, k, q_in, k_in, pos = _run_matrix(kind, dtype, layout, fastpe.apply_rope, style)
        ctx = f"{style} {kind} {dtype} {layout}"
        mag = magnitude_of(q_in, k_in)
        check_rotation(bshd(q, layout), oracle.rotate(q_in, pos, w, style=style), dtype,
                       magnitude=mag, max_position=pos.max(), context=ctx + " q")
        check_rotation(bshd(k, layout), oracle.rotate(k_in, pos, w, style=style), dtype,
                       magnitude=mag, max_position=pos.max(), context=ctx + " k")


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("hq, hk", [(3, 1), (1, 3), (2, 2), (2, 0), (10, 3), (3, 10)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_matches_formula_at_model_head_sizes_and_head_counts(head_dim, hq, hk, dtype):
    # 64 and 128 features have rotations of their own (unrolled at a fixed width), and
    # q and k laid out token by token are walked head beside head, more heads of one
    # (half-precision heads a kilobyte of rows at a time: 10 heads end in a part group)
    w = 1.0 / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim)
    pos = block_positions(B, S, seed=head_dim)
    for style in STYLES:
        q = rng_floats((B, S, hq, head_dim), dtype, seed=hq)
        k = rng_floats((B, S, hk, head_dim), dtype, seed=hk) if hk else None
        q_in = as_f64(q)
        k_in = as_f64(k) if hk else None
        fastpe.apply_rope(q, k, pos, style=style)
        ctx = f"{style} {dtype} head_dim {head_dim} heads {hq}/{hk}"
        mag = magnitude_of(q_in, k_in)
        check_rotation(q, oracle.rotate(q_in, pos, w, style=style), dtype, magnitude=mag,
                       max_position=pos.max(), context=ctx + " q")
        if hk:
            check_rotation(k, oracle.rotate(k_in, pos, w, style=style), dtype, magnitude=mag,
                           max_position=pos.max(), context=ctx + " k")



# Views whose features lie farther apart in memory than their tokens or heads (a
# transposed cache, say): storage axes in this order, features never last, in a padded
# parent (every other token; a spare row of every axis on each side).
FEATURES_FAR = {"tokens-nearest": (0, 2, 3, 1), "heads-nearest": (0, 1, 3, 2),
                "batch-nearest": (3, 2, 1, 0)}


@pytest.mark.skipif(not ON_CYTHON, reason="compiled backend not built")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("order", list(FEATURES_FAR))
def test_views_with_features_far_apart_rotate_like_contiguous_rows(order, dtype):
    """Every bit as a contiguous copy, rows past 32 of them (the rows rotated together),
    rotary_dim short of the head; nothing outside the view is written."""
    batch, seq, hq, hk, dim = 2, 70, 40, 8, 24
    perm = FEATURES_FAR[order]
    pos = block_positions(batch, seq, seed=3)
    for style in STYLES:
        views, copies, parents, insides = [], [], [], []
        for heads, seed in ((hq, 1), (hk, 2)):
            shape = (batch, seq, heads, dim)
            step = [2 if axis == 1 else 1 for axis in perm]   # every other token
            parent = np.full([(shape[a] + 2) * st for a, st in zip(perm, step)], 7.0)
            parent = parent.astype(dtype)
            inner = tuple(slice(st, st * (shape[a] + 1), st) for a, st in zip(perm, step))
            view = parent[inner].transpose(np.argsort(perm))
            assert view.shape == shape and view.strides[-1] != view.itemsize
            view[...] = rng_floats(shape, dtype, seed=seed)
            inside = np.zeros(parent.shape, bool)
            inside[inner] = True
            views.append(view)
            copies.append(np.ascontiguousarray(view))
            parents.append((parent, parent.copy()))
            insides.append(inside)
        fastpe.apply_rope(views[0], views[1], pos, style=style, rotary_dim=dim - 4)
        fastpe.apply_rope(copies[0], copies[1], pos, style=style, rotary_dim=dim - 4)
        for view, copy, (parent, old), inside, name in zip(views, copies, parents, insides,
                                                           "qk"):
            ctx = f"{style} {order} {np.dtype(dtype)} {name}"
            assert_bytes_equal(view, copy, ctx)
            assert_bytes_equal(parent[~inside], old[~inside], ctx + ": outside the view")


# ---- every option, against the reference and the formula --------------------------------


@dataclass
class Case:
    """One apply_rope configuration: array shapes, positions and keyword arguments."""
    hq: int = HQ
    hk: int | None = HK
    head_dim: int = D
    positions: str = "per-row"      # how the positions argument is given
    kwargs: dict = field(default_factory=dict)


def _positions_arg(form, batch, seq):
    """(positions argument, offset, the (batch, seq) int64 positions meant)."""
    pos = block_positions(batch, seq)
    if form == "none":
        return None, 0, np.broadcast_to(np.arange(seq), (batch, seq))
    if form == "offset":
        return None, 4090, np.broadcast_to(4090 + np.arange(seq), (batch, seq))
    if form == "per-row":
        return pos, 0, pos
    if form == "shared":
        return pos[0], 0, np.broadcast_to(pos[0], (batch, seq))
    if form == "one-row":
        return pos[:1], 0, np.broadcast_to(pos[0], (batch, seq))
    if form == "list":
        return pos.tolist(), 0, pos
    if form.startswith("dtype="):
        dt = np.dtype(form[6:])
        small = (pos % 100) if dt.itemsize == 1 else pos   # fits in int8 / uint8
        return small.astype(dt), 0, small
    raise ValueError(form)


CASES = {
    "plain": Case(),
    "rotary_dim=8": Case(kwargs={"rotary_dim": 8}),
    "rotary_dim=2": Case(kwargs={"rotary_dim": 2}),
    "rotary_dim=head_dim": Case(kwargs={"rotary_dim": D}),
    "gqa-4q-2kv": Case(hq=4, hk=2),
    "mqa-8q-1kv": Case(hq=8, hk=1),
    "more-k-heads-than-q": Case(hq=1, hk=3),
    "k=None": Case(hk=None),
    "inverse": Case(kwargs={"inverse": True}),
    "head_dim=2": Case(head_dim=2),
    "head_dim=96": Case(head_dim=96),
    "base=500000": Case(kwargs={"base": 500000.0}),
    "base-int": Case(kwargs={"base": 10000}),
    **{f"positions={f}": Case(positions=f)
       for f in ("none", "offset", "shared", "one-row", "list")},
    **{f"positions-{dt}": Case(positions=f"dtype={dt}")
       for dt in ("uint8", "int8", "int16", "uint16", "int32", "uint32", "uint64")},
    **{f"scaling={name}": Case(kwargs={"scaling": sc}) for name, sc in SCALINGS.items()},
    "scaling=dynamic+max_position_embeddings": Case(kwargs={
        "scaling": {"rope_type": "dynamic", "factor": 3.0}, "max_position_embeddings": 32}),
    "scaling=yarn-inverse": Case(kwargs={"scaling": SCALINGS["yarn"], "inverse": True}),
    "scaling=partial+rotary_dim": Case(kwargs={
        "scaling": SCALINGS["partial_rotary_factor"], "rotary_dim": 8}),
    "freqs=RopeFrequencies": Case(kwargs={"freqs": "yarn"}),
    "freqs=bare-array": Case(kwargs={"freqs": "array"}),
    "freqs=bare-float32-array": Case(kwargs={"freqs": "array32"}),
    "freqs=shorter-than-head": Case(kwargs={"freqs": "short"}),
    "freqs+rotary_dim": Case(kwargs={"freqs": "short", "rotary_dim": 8}),
    "num_threads=-1": Case(kwargs={"num_threads": -1}),
}


def _resolve_freqs(spec):
    if spec == "yarn":
        return frequencies_for(D, scaling=SCALINGS["yarn"])
    if spec == "array":
        return 1.0 / 500.0 ** (np.arange(0, D, 2) / D)
    if spec == "array32":
        return (1.0 / 500.0 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    if spec == "short":
        return fastpe.rope_frequencies(8, base=1000.0)
    raise ValueError(spec)


def _expected_frequencies(case, pos):
    kw = dict(case.kwargs)
    if "freqs" in kw:
        f = _resolve_freqs(kw["freqs"])
        if isinstance(f, np.ndarray):
            return f.astype(np.float64), 1.0
        return f.inv_freq, f.attention_scaling
    scaling = kw.get("scaling")
    rotary = kw.get("rotary_dim")
    if isinstance(scaling, dict) and "partial_rotary_factor" in scaling:
        rotary = None  # the dict's factor sets the width (rotary_dim must agree)
    f = frequencies_for(case.head_dim, base=kw.get("base"), scaling=scaling,
                        seq_len=int(pos.max()) + 1, rotary_dim=rotary,
                        max_position_embeddings=kw.get("max_position_embeddings"))
    return f.inv_freq, f.attention_scaling


def _case_arrays(case, dtype, seed=0):
    q = rng_floats((B, S + 3, case.hq, case.head_dim), dtype, seed)
    k = None if case.hk is None else rng_floats((B, S + 3, case.hk, case.head_dim), dtype,
                                                seed + 1)
    return q, k


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("case_id", list(CASES))
def test_every_option_matches_reference_and_formula(case_id, dtype):
    case = CASES[case_id]
    seq = S + 3
    positions, offset, pos = _positions_arg(case.positions, B, seq)
    kwargs = dict(case.kwargs)
    if "freqs" in kwargs:
        kwargs["freqs"] = _resolve_freqs(kwargs["freqs"])
    (q, k), (qr, kr) = twins(lambda: _case_arrays(case, dtype))
    q_in = q.copy()
    k_in = None if k is None else k.copy()
    out = fastpe.apply_rope(q, k, positions, offset=offset, **kwargs)
    assert out[0] is q and out[1] is k
    reference.apply_rope(qr, kr, positions, offset=offset, **kwargs)

    inv_freq, att = _expected_frequencies(case, pos)
    rd = 2 * inv_freq.size
    inverse = kwargs.get("inverse", False)
    mag = magnitude_of(q_in, k_in, att=max(att, 1.0 / att))
    for name, x, xr, x_in in (("q", q, qr, q_in), ("k", k, kr, k_in)):
        if x is None:
            continue
        ctx = f"{case_id} {dtype} {name}"
        check_rotation(x, xr, dtype, magnitude=mag, max_position=pos.max(), context=ctx)
        want = oracle.rotate(x_in, pos, inv_freq, attention_scaling=att, inverse=inverse)
        check_rotation(x, want, dtype, magnitude=mag, max_position=pos.max(),
                       context=ctx + " vs formula")
        # features past rotary_dim are bit-untouched
        assert_bytes_equal(x[..., rd:], x_in[..., rd:], context=ctx + " tail")
        assert_bytes_equal(xr[..., rd:], x_in[..., rd:], context=ctx + " reference tail")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_storage_dtype_is_kept_and_arithmetic_is_at_least_float32(dtype):
    """float16 / bfloat16 compute in float32 and round once: within one storage ulp (plus
    float32 noise) of the float64 rotation of the stored input."""
    q = rng_floats((1, 40, 2, 32), dtype, 3)
    q_in = as_f64(q)
    pos = np.arange(1000, 1040)
    fastpe.apply_rope(q, positions=pos)
    assert q.dtype == dtype
    want = oracle.rotate(q_in, pos, fastpe.rope_frequencies(32).inv_freq)
    check_rotation(q, want, dtype, magnitude=magnitude_of(q_in), max_position=1040,
                   context=str(dtype))


# ---- fast path and general path give identical bits --------------------------------------


def _plain_inputs(dtype=F32, layout="bshd", seed=0):
    q = rng_floats(shape_for(layout, B, 40, HQ, D), dtype, seed)
    k = rng_floats(shape_for(layout, B, 40, HK, D), dtype, seed + 1)
    return q, k, block_positions(1 if layout == "shd" else B, 40, seed)


# Each variant returns (q, k, call-kwargs) for the same values as _plain_inputs, and a
# function giving the rotated values back as plain native arrays.
def _v_same(q, k, pos):
    return q, k, {"positions": pos}, lambda a: a


def _v_positions(conv):
    def v(q, k, pos):
        return q, k, {"positions": conv(pos)}, lambda a: a
    return v


def _v_byteswapped(q, k, pos):
    sw = lambda a: a.astype(a.dtype.newbyteorder())  # noqa: E731
    return sw(q), sw(k), {"positions": pos}, lambda a: a.astype(a.dtype.newbyteorder("="))


def _v_fused_qkv(q, k, pos):
    """q and k sliced out of one (batch, seq, 3, heads, dim) buffer: their byte ranges
    interleave, but no element is shared."""
    b, s, h, d = q.shape
    qkv = np.full((b, s, 3, h, d), 7, q.dtype)
    qkv[:, :, 0], qkv[:, :, 1, :k.shape[2]] = q, k
    return qkv[:, :, 0], qkv[:, :, 1, :k.shape[2]], {"positions": pos}, lambda a: a


def _v_interleaved_features(q, k, pos):
    """q on the even, k on the odd features of one buffer: no shared element."""
    buf = np.zeros(q.shape[:3] + (2 * q.shape[3],), q.dtype)
    qv, kv = buf[..., 0::2], buf[:, :, :k.shape[2], 1::2]
    qv[...], kv[...] = q, k
    return qv, kv, {"positions": pos}, lambda a: a


def _v_unaligned(q, k, pos):
    def un(a):
        buf = np.zeros(a.nbytes + 1, np.uint8)
        u = buf[1:].view(a.dtype).reshape(a.shape)
        u[...] = a
        return u
    return un(q), un(k), {"positions": pos}, lambda a: a


def _v_kwargs(**extra):
    def v(q, k, pos):
        return q, k, {"positions": pos, **extra}, lambda a: a
    return v


def _v_copy_to(kind):
    def v(q, k, pos):
        def conv(a):
            if kind == "strided-last":
                big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
                out = big[..., ::2]
            elif kind == "reversed":
                out = np.empty(a.shape, a.dtype)[::-1, ::-1, ::-1, ::-1]
            elif kind == "transposed":
                out = np.empty((a.shape[0], a.shape[2], a.shape[1], a.shape[3]),
                               a.dtype).transpose(0, 2, 1, 3)
            out[...] = a
            return out
        return conv(q), conv(k), {"positions": pos}, lambda a: a
    return v


GENERAL_VARIANTS = {
    "positions-strided-int64": _v_positions(lambda p: np.repeat(p, 2, axis=1)[:, ::2]),
    "positions-big-endian": _v_positions(lambda p: p.astype(">i8")),
    "q-k-byteswapped": _v_byteswapped,
    "q-k-unaligned": _v_unaligned,
    "freqs-bare-array": _v_kwargs(freqs=np.array(fastpe.rope_frequencies(D).inv_freq)),
    "num_threads-negative": _v_kwargs(num_threads=-1),
}
FAST_VARIANTS = {
    "plain": _v_same,
    "base-float": _v_kwargs(base=10000.0),
    "freqs-RopeFrequencies": _v_kwargs(freqs=fastpe.rope_frequencies(D)),
    "strided-last-axis": _v_copy_to("strided-last"),
    "negative-strides": _v_copy_to("reversed"),
    "transposed-memory": _v_copy_to("transposed"),
    "num_threads=1": _v_kwargs(num_threads=1),
    # every spelling of the same arguments
    "positions-list": _v_positions(lambda p: p.tolist()),
    "positions-int32": _v_positions(lambda p: p.astype(np.int32)),
    "positions-uint16": _v_positions(lambda p: p.astype(np.uint16)),
    "positions-uint64": _v_positions(lambda p: p.astype(np.uint64)),
    "rotary_dim-given": _v_kwargs(rotary_dim=D),
    "scaling-default-dict": _v_kwargs(scaling={"rope_type": "default"}),
    "base-int": _v_kwargs(base=10000),
    "base-numpy-float": _v_kwargs(base=np.float64(10000)),
    "base-numpy-int": _v_kwargs(base=np.int32(10000)),
    "max_position_embeddings": _v_kwargs(max_position_embeddings=4096),
    # q and k of one buffer, their byte ranges interleaved: proven apart in C
    "q-k-fused-qkv-slices": _v_fused_qkv,
    "q-k-interleaved-features": _v_interleaved_features,
}


@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=str)
@pytest.mark.parametrize("variant", [pytest.param(v, id=f"general-{v}") for v in GENERAL_VARIANTS]
                         + [pytest.param(v, id=f"fast-{v}") for v in FAST_VARIANTS])
def test_fast_and_general_paths_give_identical_bits(path_spy, variant, dtype):
    q0, k0, pos = _plain_inputs(dtype)
    fastpe.apply_rope(q0, k0, positions=pos)
    ok, got = took(path_spy, "fast")
    assert ok, f"the plain call took the {got} path"

    expect_path = "general" if variant in GENERAL_VARIANTS else "fast"
    make_variant = {**GENERAL_VARIANTS, **FAST_VARIANTS}[variant]
    q, k, kwargs, native = make_variant(*_plain_inputs(dtype))
    q_before = q.copy()
    fastpe.apply_rope(q, k, **kwargs)
    ok, got = took(path_spy, expect_path)
    assert ok, f"{variant} took the {got} path, expected {expect_path}"
    assert not np.array_equal(as_f64(q), as_f64(q_before)), "nothing was rotated"
    assert_bytes_equal(native(np.ascontiguousarray(q)), q0, context=f"{variant} q")
    assert_bytes_equal(native(np.ascontiguousarray(k)), k0, context=f"{variant} k")


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_fused_qkv_buffer_rotated_in_place_and_v_untouched(dtype):
    """The common case: q and k sliced from one (batch, seq, 3, heads, dim) projection
    output, rotated in place; v (and every other byte of the buffer) stays as it was.
    Every layout of such slices, both backends, both styles."""
    rng = np.random.default_rng(5)
    for style in STYLES:
        for layout in ("bshd", "bhsd"):
            qkv = rng.uniform(-2, 2, (B, 40, 3, HQ, D)).astype(dtype)
            before = qkv.copy()
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            if layout == "bhsd":
                q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
            qc, kc = q.copy(), k.copy()
            fastpe.apply_rope(q, k, offset=11, style=style, layout=layout)
            reference.apply_rope(qc, kc, offset=11, style=style, layout=layout)
            check_rotation(q, qc, dtype, magnitude=magnitude_of(before), max_position=51,
                           context=f"{style} {layout} q")
            check_rotation(k, kc, dtype, magnitude=magnitude_of(before), max_position=51,
                           context=f"{style} {layout} k")
            assert_bytes_equal(v, before[:, :, 2], context="v")
            with fastpe.use_backend("numpy"):
                qkv2 = before.copy()
                q2, k2 = qkv2[:, :, 0], qkv2[:, :, 1]
                if layout == "bhsd":
                    q2, k2 = q2.transpose(0, 2, 1, 3), k2.transpose(0, 2, 1, 3)
                fastpe.apply_rope(q2, k2, offset=11, style=style, layout=layout)
                assert_bytes_equal(qkv2[:, :, 2], before[:, :, 2], context="v (numpy)")
                assert_bytes_equal(q2, qc, context="q (numpy)")


def test_rotary_embedding_call_paths_give_identical_bits(path_spy):
    rope = fastpe.RotaryEmbedding(D, base=5000.0, scaling=SCALINGS["yarn"])
    q0, k0, pos = _plain_inputs()
    rope(q0, k0, pos)
    assert took(path_spy, "fast")[0]
    for spelling in (pos.astype(np.int32), pos.tolist()):
        q, k, _ = _plain_inputs()
        rope(q, k, spelling)
        assert took(path_spy, "fast")[0]
        assert_bytes_equal(q, q0)
        assert_bytes_equal(k, k0)
    q, k, _ = _plain_inputs()
    rope(q, k, np.repeat(pos, 2, axis=1)[:, ::2])
    assert took(path_spy, "general")[0]
    assert_bytes_equal(q, q0)
    assert_bytes_equal(k, k0)
    for scaling in (SCALINGS["yarn"], dict(SCALINGS["yarn"])):  # the same dict, an equal one
        q, k, _ = _plain_inputs()
        fastpe.apply_rope(q, k, pos, base=5000.0, scaling=scaling)
        assert took(path_spy, "fast")[0]
        assert_bytes_equal(q, q0)
        assert_bytes_equal(k, k0)


@pytest.mark.parametrize("name", ["dynamic-above-original", "longrope"])
def test_sequence_dependent_scalings_take_the_fast_path(path_spy, name):
    """dynamic and longrope pick their frequencies from max(positions) + 1 on the fast
    path too: the same bits as the general path, on both sides of the original length."""
    scaling = SCALINGS[name] if name in SCALINGS else _longrope(16)
    rope = fastpe.RotaryEmbedding(D, scaling=scaling, max_position_embeddings=64)
    # the original length is 64 (16 for dynamic): both sides, and each side of it exactly
    for pos in (np.arange(8)[None], np.arange(40)[None] + 30, np.array([[15]]),
                np.array([[16]]), np.array([[63]]), np.array([[64]])):
        q0, k0, _ = _plain_inputs()
        q0, k0 = q0[:1, :pos.shape[1]].copy(), k0[:1, :pos.shape[1]].copy()
        q, k = q0.copy(), k0.copy()
        rope(q, k, pos)
        assert took(path_spy, "fast")[0]
        qa, ka = q0.copy(), k0.copy()
        fastpe.apply_rope(qa, ka, pos, scaling=scaling, max_position_embeddings=64)
        assert took(path_spy, "fast")[0]
        assert_bytes_equal(qa, q)
        assert_bytes_equal(ka, k)
        for spelling in (pos.astype(np.uint16), pos.tolist()):
            q2, k2 = q0.copy(), k0.copy()
            rope(q2, k2, spelling)
            assert took(path_spy, "fast")[0]
            assert_bytes_equal(q2, q)
        q3, k3 = q0.copy(), k0.copy()
        rope(q3, k3, pos.astype(pos.dtype.newbyteorder()))  # byte-swapped: the general path
        assert took(path_spy, "general")[0]
        assert_bytes_equal(q3, q)
        assert_bytes_equal(k3, k)
        q4, k4 = q0.copy(), k0.copy()
        reference.apply_rope(q4, k4, pos, scaling=scaling, max_position_embeddings=64)
        check_rotation(q, q4, F32, magnitude=magnitude_of(q0), max_position=int(pos.max()),
                       context=name)


def test_rotary_embedding_settings_changed_after_a_call_are_followed(path_spy):
    """The compiled call's parsed settings follow the embedding's attributes: a
    reverse set after a call rotates the other way; a pickled copy rotates alike."""
    rope = fastpe.RotaryEmbedding(D, base=5000.0)
    q0, k0, pos = _plain_inputs()
    q, k = q0.copy(), k0.copy()
    rope(q, k, pos)
    assert took(path_spy, "fast")[0]
    rope.reverse = True
    q2, k2 = q0.copy(), k0.copy()
    rope(q2, k2, pos)
    assert took(path_spy, "fast")[0]
    q3, k3 = q0.copy(), k0.copy()
    fastpe.apply_rope(q3, k3, pos, base=5000.0, inverse=True)
    assert_bytes_equal(q2, q3)
    assert_bytes_equal(k2, k3)
    rope.reverse = False
    copy = pickle.loads(pickle.dumps(rope))
    q4, k4 = q0.copy(), k0.copy()
    copy(q4, k4, pos)
    assert took(path_spy, "fast")[0]
    assert_bytes_equal(q4, q)
    assert not copy.frequencies().inv_freq.flags.writeable


@pytest.mark.parametrize("name", ["dynamic-above-original", "longrope-long"])
def test_sequence_dependent_fast_path_refuses_bad_arguments(name):
    """The front door takes only the plain case: everything else reaches the general
    path's errors, which name the argument, with nothing written."""
    rope = fastpe.RotaryEmbedding(D, scaling=SCALINGS[name])
    q, k, pos = _plain_inputs()
    before_q, before_k = q.copy(), k.copy()
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rope(q, k, -pos)
    with pytest.raises(TypeError, match="inverse"):
        rope(q, k, pos, inverse="yes")
    with pytest.raises(ValueError, match="head_dim"):
        rope(q[..., :D // 2], k[..., :D // 2], pos)
    with pytest.raises(ValueError, match="offset"):
        rope(q, k, None, offset=-1)
    assert_bytes_equal(q, before_q)
    assert_bytes_equal(k, before_k)


@pytest.mark.parametrize("head_dim", [2, 4, 20, 128, 1040])
def test_dynamic_ntk_decode_loop_matches_the_general_path(head_dim):
    """A decode loop across the original length (16): past it, every step has a length,
    and dynamic NTK frequencies, of its own, which the compiled decode path forms itself
    (up to 512 pairs; wider heads take the general path, and one pair never changes).
    Each spelling of the step (offset, int64 / int32 / list positions, apply_rope with
    the dict, a (batch, 1) batch at two positions) gives the bits of the general path
    (byte-swapped positions: frequencies from rope_frequencies) and fastpe.reference's
    rotation. float64, where a frequency one ulp off shows. On the NumPy backend the same
    calls check the reference alone."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    rope = fastpe.RotaryEmbedding(head_dim, scaling=scaling, max_position_embeddings=16)
    q0 = rng_floats((2, 1, HQ, head_dim), F64, 1)
    k0 = rng_floats((2, 1, HK, head_dim), F64, 2)
    for p in range(10, 48):
        one = np.array([p])
        swapped = one.astype(one.dtype.newbyteorder())
        q, k = q0[:1].copy(), k0[:1].copy()
        rope(q, k, swapped)
        qr, kr = q0[:1].copy(), k0[:1].copy()
        reference.apply_rope(qr, kr, one, scaling=scaling, max_position_embeddings=16)
        check_rotation(q, qr, F64, magnitude=magnitude_of(q0), max_position=p, context=f"{p}")
        check_rotation(k, kr, F64, magnitude=magnitude_of(k0), max_position=p, context=f"{p}")
        calls = {
            "offset": (rope, None, {"offset": p}),
            "int64": (rope, one, {}),
            "int32": (rope, one.astype(np.int32), {}),
            "list": (rope, [p], {}),
            "apply_rope": (fastpe.apply_rope, None,
                           {"offset": p, "scaling": scaling, "max_position_embeddings": 16}),
        }
        for name, (call, positions, kwargs) in calls.items():
            q2, k2 = q0[:1].copy(), k0[:1].copy()
            call(q2, k2, positions, **kwargs)
            assert_bytes_equal(q2, q, context=f"{name} at {p} q")
            assert_bytes_equal(k2, k, context=f"{name} at {p} k")
        # a batch of two sequences: the longer one's length sets both rows' frequencies
        rows = np.array([[p], [p - 7]])
        for spelling in (rows, rows.astype(np.int32), rows.tolist()):
            q3, k3 = q0.copy(), k0.copy()
            rope(q3, k3, spelling)
            q4, k4 = q0.copy(), k0.copy()
            rope(q4, k4, rows.astype(rows.dtype.newbyteorder()))
            assert_bytes_equal(q3, q4, context=f"batch at {p} q")
            assert_bytes_equal(k3, k4, context=f"batch at {p} k")
        qr, kr = q0.copy(), k0.copy()
        reference.apply_rope(qr, kr, rows, scaling=scaling, max_position_embeddings=16)
        check_rotation(q3, qr, F64, magnitude=magnitude_of(q0), max_position=p,
                       context=f"batch at {p}")


def test_dynamic_ntk_decode_steps_take_the_fast_path(path_spy):
    """Past the original length the decode step stays on the compiled path: for a
    decode-sized call and for a batch large enough to run on threads."""
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    rope = fastpe.RotaryEmbedding(128, scaling=scaling, max_position_embeddings=16)
    for batch in (1, 16):
        q0 = rng_floats((batch, 1, 32, 128), F64, 1)
        for p in (15, 16, 17, 1000):
            positions = np.full((batch, 1), p)
            q = q0.copy()
            rope(q, None, positions)
            assert took(path_spy, "fast")[0], (batch, p)
            q2 = q0.copy()
            fastpe.apply_rope(q2, None, positions, scaling=scaling, max_position_embeddings=16)
            assert took(path_spy, "fast")[0], (batch, p)
            assert_bytes_equal(q2, q)
            q3 = q0.copy()
            rope(q3, None, positions.astype(positions.dtype.newbyteorder()))
            assert took(path_spy, "general")[0]
            assert_bytes_equal(q3, q, context=f"batch {batch} at {p}")


@pytest.mark.skipif(not ON_CYTHON, reason="the compiled entry")
def test_the_compiled_entry_asks_for_the_team_of_a_large_call(monkeypatch):
    """The compiled entry never calls back into fastpe's Python: given no team for a call
    past the serial size, it returns the bytes the call touches having written nothing,
    and apply_rope asks the thread policy for that many bytes and calls again."""
    kern = fastpe._backend.compiled
    q0 = rng_floats((4, 64, HQ, D), F32, 1)
    k0 = rng_floats((4, 64, HK, D), F32, 2)
    state = kern.RopeState(D, False, fastpe.rope_frequencies(D).inv_freq, 1.0)
    q, k = q0.copy(), k0.copy()
    touched = 2 * (q.nbytes + k.nbytes)
    args = (state, q, k, None, 0, "neox", "bshd", False, None, None, None)
    assert kern.rope_call(*args, touched, 0) == touched
    assert kern.rope_call(*args, touched + 1, 0) == 1   # below the serial size: one thread
    q1, k1 = q.copy(), k.copy()
    q[:], k[:] = q0, k0
    assert kern.rope_call(*args, 1, 0) == touched
    assert_bytes_equal(q, q0)
    assert_bytes_equal(k, k0)
    monkeypatch.setattr(fastpe._threads, "SERIAL_BYTES", 1)
    teams = teams_asked(monkeypatch, 2)
    fastpe.apply_rope(q, k, num_threads=3)
    assert teams == [(3, touched)]
    assert_bytes_equal(q, q1)
    assert_bytes_equal(k, k1)


@pytest.mark.skipif(not ON_CYTHON, reason="the compiled entry")
@pytest.mark.parametrize("half", [1, 3, 4, 7, 64])
@pytest.mark.parametrize("bad", [np.nan, -np.nan, np.inf, -np.inf, "past", "-past"])
def test_the_compiled_entry_declines_frequencies_past_finite_angles(half, bad):
    """A state's frequency that is NaN (either sign), infinite or past MAX_INV_FREQ, at
    any index (each of the check's lanes and its tail): the compiled entry declines the
    call having written nothing; the largest finite frequency rotates."""
    kern = fastpe._backend.compiled
    top = fastpe._rope_scaling.MAX_INV_FREQ
    value = {"past": np.nextafter(top, np.inf), "-past": -np.nextafter(top, np.inf)}.get(
        bad, bad)
    q0 = rng_floats((1, 2, HQ, 2 * half), F32, 1)
    for i in range(half):
        inv_freq = np.full(half, 0.5)
        inv_freq[i] = value
        q = q0.copy()
        state = kern.RopeState(2 * half, False, inv_freq, 1.0)
        assert kern.rope_call(state, q, None, [0, 0], 0, "neox", None, False, None, None,
                              None, 1 << 40, 1) == 0, (i, inv_freq)
        assert_bytes_equal(q, q0)
    inv_freq = np.full(half, 0.5)
    inv_freq[half // 2] = -top
    state = kern.RopeState(2 * half, False, inv_freq, 1.0)
    q = q0.copy()
    assert kern.rope_call(state, q, None, [0, 0], 0, "neox", None, False, None, None, None,
                          1 << 40, 1) == 1
    assert_bytes_equal(q, q0)   # position 0: every angle 0, cos 1 and sin 0 exactly


def test_dynamic_ntk_decode_refuses_frequencies_out_of_range():
    """A factor so large that factor * seq_len overflows: no finite frequencies at any
    length past the original. The decode step raises the general path's error, naming
    the scaling factor, and writes nothing; below the original length it rotates."""
    rope = fastpe.RotaryEmbedding(D, scaling={"rope_type": "dynamic", "factor": 1e308},
                                  max_position_embeddings=16)
    q0, k0 = rng_floats((1, 1, HQ, D), F32, 1), rng_floats((1, 1, HK, D), F32, 2)
    q, k = q0.copy(), k0.copy()
    rope(q, k, offset=15)
    assert not np.array_equal(q, q0)
    q, k = q0.copy(), k0.copy()
    for call in (lambda: rope(q, k, offset=16), lambda: rope(q, k, [[20]]),
                 lambda: fastpe.apply_rope(q, k, offset=16, max_position_embeddings=16,
                                           scaling={"rope_type": "dynamic", "factor": 1e308})):
        with pytest.raises(ValueError, match=r"inverse frequency nan.*scaling\['factor'\]"):
            call()
        assert_bytes_equal(q, q0)
        assert_bytes_equal(k, k0)


def test_a_list_in_a_scaling_dict_changed_in_place_is_read_again():
    """LongRoPE factors are lists, which can change in place under the same dict
    items: each call reads them again."""
    scaling = _longrope(16)
    pos = np.array([[40]])
    q0, k0, _ = _plain_inputs()
    q0, k0 = q0[:1, :1].copy(), k0[:1, :1].copy()
    q, k = q0.copy(), k0.copy()
    fastpe.apply_rope(q, k, pos, scaling=scaling)
    scaling["long_factor"][0] = 50.0
    q2, k2 = q0.copy(), k0.copy()
    fastpe.apply_rope(q2, k2, pos, scaling=scaling)
    q3, k3 = q0.copy(), k0.copy()
    reference.apply_rope(q3, k3, pos, scaling=scaling)
    check_rotation(q2, q3, F32, magnitude=magnitude_of(q0), max_position=40,
                   context="changed factor")
    assert not np.array_equal(q2, q)


def test_configurations_are_kept_by_value_never_by_identity():
    """apply_rope keeps what it parsed by the arguments' values: a dict changed in place,
    an equal dict made afresh, an equal number of another type (True for 1) and an
    array base (which may change in place) each give what fastpe.reference gives for the
    arguments as they are at that call."""
    q0, k0, _ = _plain_inputs()
    q0, k0 = q0[:1, :1].copy(), k0[:1, :1].copy()
    pos = np.array([[40]])

    def same_as_reference(**kw):
        q, k = q0.copy(), k0.copy()
        got = outcome(lambda: fastpe.apply_rope(q, k, pos, **kw))
        qr, kr = q0.copy(), k0.copy()
        want = outcome(lambda: reference.apply_rope(qr, kr, pos, **kw))
        assert (got[1] is None) == (want[1] is None), (kw, got[1], want[1])
        if got[1] is None:
            assert_bytes_equal(q, fastpe.apply_rope(q0.copy(), k0.copy(), pos, **kw)[0])
            check_rotation(q, qr, F32, magnitude=magnitude_of(q0, att=4.0), max_position=40,
                           context=str(kw))
        else:
            assert type(got[1]) is type(want[1]), (kw, got[1], want[1])
        return q

    scaling = {"rope_type": "linear", "factor": 2.0}
    first = same_as_reference(scaling=scaling)
    scaling["factor"] = 4.0   # the same dict object, changed
    assert not np.array_equal(same_as_reference(scaling=scaling), first)
    scaling["factor"] = 2.0
    assert_bytes_equal(same_as_reference(scaling=dict(scaling)), first)
    scaling["factor"] = 2    # an int factor is a valid, equal factor
    assert_bytes_equal(same_as_reference(scaling=scaling), first)
    scaling["factor"] = True  # not a factor: refused as the reference refuses it
    same_as_reference(scaling=scaling)
    dyn = {"rope_type": "dynamic", "factor": 2.0}
    same_as_reference(scaling=dyn, max_position_embeddings=16)
    same_as_reference(scaling=dyn, max_position_embeddings=True)
    base = np.array(10000.0)
    same_as_reference(base=base)
    base[...] = 500.0
    same_as_reference(base=base)
    same_as_reference(scaling={"rope_type": "linear", "factor": 2.0, "extra": {"a": 1}})


def outcome(fn):
    try:
        return fn(), None
    except (TypeError, ValueError) as exc:
        return None, exc


def test_cached_fast_path_matches_the_general_path(path_spy):
    q0, k0, pos = _plain_inputs()
    cos, sin = fastpe.rope_cos_sin(np.arange(int(pos.max()) + 1), fastpe.rope_frequencies(D))
    for inverse in (False, True):
        q, k = q0.copy(), k0.copy()
        fastpe.apply_rope_cached(q, k, cos, sin, pos, inverse=inverse)
        assert took(path_spy, "fast")[0]
        for spelling in (pos.tolist(), pos.astype(np.int32)):
            q2, k2 = q0.copy(), k0.copy()
            fastpe.apply_rope_cached(q2, k2, cos, sin, spelling, inverse=inverse)
            assert took(path_spy, "fast")[0]
            assert_bytes_equal(q2, q)
        q3, k3 = q0.copy(), k0.copy()
        fastpe.apply_rope_cached(q3, k3, cos.astype(">f4"), sin.astype(">f4"), pos,
                                 inverse=inverse)
        assert took(path_spy, "general")[0]
        assert_bytes_equal(q3, q)
        assert_bytes_equal(k3, k)


def test_cached_fast_path_refuses_what_the_general_path_refuses():
    q, k, pos = _plain_inputs()
    cos, sin = fastpe.rope_cos_sin(np.arange(int(pos.max())), fastpe.rope_frequencies(D))
    before = q.copy()
    with pytest.raises(IndexError, match="past the end of the cos/sin cache"):
        fastpe.apply_rope_cached(q, k, cos, sin, pos)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        fastpe.apply_rope_cached(q, k, cos, sin, [[-1] * 40] * B)
    with pytest.raises(TypeError, match="same dtype"):
        fastpe.apply_rope_cached(q, k, cos, sin.astype(np.float64), pos % 10)
    assert_bytes_equal(q, before)


@pytest.mark.parametrize("value, error", [("abc", TypeError), (-5, ValueError),
                                          (True, TypeError), (4096.5, ValueError)])
def test_max_position_embeddings_is_validated_on_every_path(value, error):
    """One validation: the fast path (plain arrays), the general path (a byte-swapped
    q) and fastpe.reference refuse the same values, with or without freqs."""
    q, _, pos = _plain_inputs()
    for target in (q, q.astype(q.dtype.newbyteorder())):
        before = target.copy()
        with pytest.raises(error, match="max_position_embeddings"):
            fastpe.apply_rope(target, positions=pos, max_position_embeddings=value)
        with pytest.raises(error, match="max_position_embeddings"):
            reference.apply_rope(target, positions=pos, max_position_embeddings=value)
        assert_bytes_equal(target, before)
    with pytest.raises(ValueError, match="give freqs"):
        fastpe.apply_rope(q, positions=pos, freqs=fastpe.rope_frequencies(D),
                          max_position_embeddings=4096)


def test_reused_plain_arguments_keep_their_own_validation():
    """A repeated call skips parsing when its base is the very same object; an equal
    base of a refused type (True for 1) is still refused, and a different head_dim
    gets its own frequencies."""
    q, k, pos = _plain_inputs()
    fastpe.apply_rope(q, k, pos, base=1)
    fastpe.apply_rope(q, k, pos, base=1)
    with pytest.raises(TypeError, match="base"):
        fastpe.apply_rope(q, k, pos, base=True)
    wide = rng_floats((B, 40, HQ, 2 * D), F32, 3)
    want = wide.copy()
    reference.apply_rope(want, None, pos, base=1)
    fastpe.apply_rope(wide, None, pos, base=1)
    check_rotation(wide, want, F32, magnitude=magnitude_of(want), max_position=int(pos.max()),
                   context="head_dim 2D after D")


@pytest.mark.parametrize("make", [float, int, np.float64, np.int64], ids=lambda f: f.__name__)
def test_an_equal_base_made_afresh_takes_the_decode_path_and_a_new_one_is_read(path_spy,
                                                                                make):
    # config.rope_theta * 1.0 each step: equal numbers of one type reuse the last parse;
    # any other value (or type) is parsed for itself
    q0, k0 = rng_floats((1, 1, HQ, D), F32, 1), rng_floats((1, 1, HK, D), F32, 2)
    for base in (500, 500, 900, 900, 500):
        q, k = q0.copy(), k0.copy()
        fastpe.apply_rope(q, k, offset=77, base=make(str(base)))   # a new object
        assert took(path_spy, "fast")[0]
        want_q, want_k = q0.copy(), k0.copy()
        reference.apply_rope(want_q, want_k, offset=77, base=float(base))
        check_rotation(q, want_q, F32, magnitude=magnitude_of(q0), max_position=77,
                       context=f"base {base}")
        check_rotation(k, want_k, F32, magnitude=magnitude_of(k0), max_position=77,
                       context=f"base {base}")


def test_a_scaling_dict_changed_in_place_is_read_again():
    """Parsed settings are reused only while the dict holds the very same values: a
    value replaced by an equal one of a refused type (True for 1.0) is refused."""
    q, k, pos = _plain_inputs()
    scaling = {"rope_type": "linear", "factor": 1.0}
    fastpe.apply_rope(q, k, pos, scaling=scaling)
    scaling["factor"] = True
    with pytest.raises(TypeError, match="factor"):
        fastpe.apply_rope(q, k, pos, scaling=scaling)
    scaling["factor"] = 2.0
    q1, k1, _ = _plain_inputs()
    fastpe.apply_rope(q1, k1, pos, scaling=scaling)
    q2, k2, _ = _plain_inputs()
    linear2 = fastpe.rope_frequencies(D, scaling={"rope_type": "linear", "factor": 2.0})
    fastpe.apply_rope(q2, k2, pos, freqs=linear2)
    assert_bytes_equal(q1, q2)


def test_a_new_scaling_dict_is_read_for_its_own_values(path_spy):
    """A new dict holding the very key and value objects of the last call's reuses
    its parse (a dict literal in a decode loop); one holding other values, or equal
    values of a refused type, is read again."""
    q0, k0, pos = _plain_inputs()
    factor = 2.0
    q, k = q0.copy(), k0.copy()
    fastpe.apply_rope(q, k, pos, scaling={"rope_type": "linear", "factor": factor})
    q1, k1 = q0.copy(), k0.copy()
    fastpe.apply_rope(q1, k1, pos, scaling={"rope_type": "linear", "factor": factor})
    assert took(path_spy, "fast")[0]
    assert_bytes_equal(q1, q)
    with pytest.raises(TypeError, match="factor"):
        fastpe.apply_rope(q1, k1, pos, scaling={"rope_type": "linear", "factor": True})
    assert_bytes_equal(q1, q)
    for value in (4.0, 2.0):
        q2, k2 = q0.copy(), k0.copy()
        fastpe.apply_rope(q2, k2, pos, scaling={"rope_type": "linear", "factor": value})
        q3, k3 = q0.copy(), k0.copy()
        fastpe.apply_rope(q3, k3, pos, freqs=fastpe.rope_frequencies(
            D, scaling={"rope_type": "linear", "factor": value}))
        assert_bytes_equal(q2, q3)
        assert_bytes_equal(k2, k3)


@pytest.mark.parametrize("bad", [dict(base=np.array([10000.0, 1.0])),
                                 dict(rotary_dim=np.array([D, 2])),
                                 dict(max_position_embeddings=np.array([64, 2]))],
                         ids=lambda kw: next(iter(kw)))
def test_a_scaling_dict_seen_before_with_an_array_argument_names_it(bad):
    """A scaling dict already parsed, with an array where a number belongs: the
    argument is named, and nothing is written."""
    q, k, pos = _plain_inputs()
    scaling = {"rope_type": "linear", "factor": 2.0}
    fastpe.apply_rope(q, k, pos, scaling=scaling)
    before = q.copy()
    name = next(iter(bad))
    with pytest.raises(TypeError, match=rf"\b{name}\b"):
        fastpe.apply_rope(q, k, pos, scaling=scaling, **bad)
    assert_bytes_equal(q, before)


# ---- threads -----------------------------------------------------------------------------


@pytest.mark.skipif(ON_CYTHON and not fastpe.info()["openmp"],
                    reason="fastpe was built without OpenMP: one thread for every count")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_num_threads_give_bit_identical_results(threaded, dtype, monkeypatch):
    """3 batch rows x 4 blocks of 32 tokens; 1, 2 and 3 threads, computed angles (fast and
    general path), a cos/sin cache, and rope_cos_sin. Every call asks the thread policy
    for a team (else this would compare one thread with one thread)."""
    teams: list[int] = []
    real_resolve = fastpe._threads.resolve

    def resolve(num_threads, nbytes):
        n = real_resolve(num_threads, nbytes)
        teams.append(n)
        return n

    monkeypatch.setattr(fastpe._threads, "resolve", resolve)
    freqs = fastpe.rope_frequencies(D, scaling=SCALINGS["yarn"])
    pos = np.concatenate([block_positions(3, 60), block_positions(3, 40, 1) + 9000], axis=1)
    cos, sin = fastpe.rope_cos_sin(np.arange(pos.max() + 1), freqs, dtype=F32)
    results = []
    teams.clear()
    for nt in (1, 2, 3):
        q = rng_floats((3, 100, HQ, D), dtype, 1)
        k = rng_floats((3, 100, HK, D), dtype, 2)
        fastpe.apply_rope(q, k, pos, freqs=freqs, num_threads=nt)
        q2 = rng_floats((3, 100, HQ, D), dtype, 1)
        fastpe.apply_rope(q2, None, pos.astype(np.int32), freqs=freqs, num_threads=nt,
                          style="gptj")
        q3 = rng_floats((3, 100, HQ, D), dtype, 1)
        fastpe.apply_rope_cached(q3, None, cos, sin, pos, num_threads=nt)
        fastpe.set_num_threads(nt)
        c, s = fastpe.rope_cos_sin(pos, freqs, dtype=dtype)
        q4 = rng_floats((3, 100, HQ, D), dtype, 1)
        fastpe.apply_rope(q4, positions=pos, freqs=freqs)
        fastpe.set_num_threads(None)
        results.append((q, k, q2, q3, c, s, q4))
        if ON_CYTHON:
            assert teams and set(teams) == {nt}, (nt, teams)
        teams.clear()
    for nt, res in zip((2, 3), results[1:]):
        for name, a, b in zip(("q", "k", "q-gptj-general", "q-cached", "cos", "sin",
                               "q-set_num_threads"), res, results[0]):
            assert_bytes_equal(a, b, context=f"{name} num_threads={nt} vs 1")


# ---- sizes 0 and 1 -----------------------------------------------------------------------


@pytest.mark.parametrize("shape, k_shape", [
    pytest.param((1, 1, 1, 2), (1, 1, 1, 2), id="one-pair"),
    pytest.param((1, 1, 1, 32), (1, 1, 1, 32), id="one-token"),
    pytest.param((1, 40, 1, 2), None, id="head_dim=2"),
    pytest.param((1, 40, 3, 16), (1, 40, 0, 16), id="k-without-heads"),
    pytest.param((1, 40, 0, 16), (1, 40, 2, 16), id="q-without-heads"),
    pytest.param((1, 0, 3, 16), (1, 0, 1, 16), id="seq=0"),
    pytest.param((0, 40, 3, 16), (0, 40, 1, 16), id="batch=0"),
])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_tiny_and_empty_sizes(shape, k_shape, dtype):
    for backend_fn in (fastpe.apply_rope, reference.apply_rope):
        q = rng_floats(shape, dtype, 1)
        k = None if k_shape is None else rng_floats(k_shape, dtype, 2)
        q_in = as_f64(q)
        pos = 4095 + np.arange(shape[1])
        backend_fn(q, k, offset=4095)
        w = fastpe.rope_frequencies(shape[-1]).inv_freq
        check_rotation(q, oracle.rotate(q_in, pos, w), dtype, magnitude=magnitude_of(q_in),
                       max_position=4200, context=f"{backend_fn.__module__} {shape}")


@pytest.mark.parametrize("form", ["3-d", "per_token"])
@pytest.mark.parametrize("shape", [(2, 0, 4, 64), (0, 5, 4, 64)], ids=["seq=0", "batch=0"])
def test_per_token_cos_sin_of_no_tokens_rotate_nothing(form, shape):
    """transformers' (batch, seq, head_dim) cos and sin of an empty batch or sequence: a
    call with nothing to rotate, as with a table and positions."""
    for fn in (fastpe.apply_rope_cached, reference.apply_rope_cached):
        q = np.zeros(shape, np.float32)
        c = np.ones(shape[:2] + (64,), np.float32)
        if form == "3-d":
            got = fn(q, q.copy(), c, c)
        else:
            rows = np.ones((shape[1], 64), np.float32)  # (seq, rotary_dim), shared
            got = fn(q, None, rows, rows, per_token=True)
        assert got[0].shape == shape


def test_empty_positions_give_empty_cos_sin():
    for fn in (fastpe.rope_cos_sin, reference.rope_cos_sin):
        c, s = fn(np.zeros((0,), np.int64), fastpe.rope_frequencies(8))
        assert c.shape == s.shape == (0, 4) and c.dtype == F32


# ---- the kernel's scratch buffer for sequences shorter than one block ---------------------

SHORT_SEQ_SCRIPT = """
import numpy as np, fastpe, fastpe._threads
from fastpe import reference
fastpe._threads.SERIAL_BYTES = 0
bad = []
for batch, nt in ((1, 1), (2, 2)):          # one thread first: a crash comes later
    for dtype in ("float32", "float64", "float16"):
        for head_dim in (16, 64):
            for seq in range(1, 33):
                rng = np.random.default_rng(seq)
                q = rng.uniform(-2, 2, (batch, seq, 2, head_dim)).astype(dtype)
                qr = q.copy()
                fastpe.apply_rope(q, offset=100, num_threads=nt)
                reference.apply_rope(qr, offset=100)
                err = float(np.abs(q.astype(float) - qr.astype(float)).max())
                if err > 1e-2:
                    bad.append((dtype, head_dim, seq, batch, nt, round(err, 3)))
    print("threads", nt, "BAD so far", len(bad), bad[:12], flush=True)
print("BAD", len(bad), bad[:12])
"""

DECODE_SCRIPT = """
import sys, numpy as np, fastpe
from fastpe import reference
for dtype, head_dim, seq in ((np.float64, 128, 1), (np.float16, 128, 1), (np.float64, 256, 2),
                             (np.float32, 512, 1)):
    print("case", np.dtype(dtype).name, head_dim, seq, flush=True)
    q = np.random.default_rng(0).uniform(-1, 1, (1, seq, 32, head_dim)).astype(dtype)
    qr = q.copy()
    fastpe.apply_rope(q, offset=4095)
    reference.apply_rope(qr, offset=4095)
    assert np.allclose(q.astype(float), qr.astype(float), atol=1e-2), "wrong values"
print("OK")
"""

# Regression tests: at commit ee8c113 rope_execute sized each thread's scratch for
# min(seq, 32) tokens while rope_block laid it out for 32 (stab = ctab + 32 * half, tmp
# after it): for seq < 32 the sin table overwrote the angle-step vectors (float32 with 7 or
# 8 tokens, float64 with 15 to 29: wrong values) or ran past the stack buffer or the heap
# (float64 / float16 decode with head_dim >= 128: segfault). Run in fresh interpreters,
# since a regression corrupts memory.


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_short_sequences_match_reference():
    """Every sequence length up to one 32-token block, 1 and 2 threads, float16/32/64,
    head_dim 16 and 64: compiled == reference."""
    proc = run_python(SHORT_SEQ_SCRIPT)
    assert proc.returncode == 0, (f"crashed (rc {proc.returncode}) after {proc.stdout!r}: "
                                  f"{proc.stderr[-2000:]}")
    assert "BAD 0 " in proc.stdout, f"compiled != reference for: {proc.stdout.strip()}"


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_decode_sized_calls_do_not_crash():
    """One-token decode with LLaMA-sized heads (float64/float16 head_dim 128 and up)."""
    proc = run_python(DECODE_SCRIPT)
    last = (proc.stdout.strip().splitlines() or ["<nothing>"])[-1]
    assert proc.returncode == 0 and last == "OK", (
        f"rc {proc.returncode} during {last!r}: {proc.stderr[-1500:]}")


# ---- apply_rope_cached -------------------------------------------------------------------


@pytest.mark.parametrize("cache_dtype", [F32, F64], ids=lambda d: f"cache-{d}")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("style", STYLES)
def test_cached_equals_apply_rope_and_reference(style, dtype, cache_dtype):
    freqs = fastpe.rope_frequencies(D, scaling=SCALINGS["yarn"])   # attention_scaling != 1
    pos = block_positions(B, 40)
    cos, sin = fastpe.rope_cos_sin(np.arange(pos.max() + 1), freqs, dtype=cache_dtype)
    (q, k), (qr, kr) = twins(lambda: (rng_floats((B, 40, HQ, D), dtype, 1),
                                      rng_floats((B, 40, HK, D), dtype, 2)))
    (qa, ka) = (q.copy(), k.copy())
    q_in = as_f64(q)
    fastpe.apply_rope_cached(q, k, cos, sin, pos, style=style)
    reference.apply_rope_cached(qr, kr, cos, sin, pos, style=style)
    fastpe.apply_rope(qa, ka, pos, freqs=freqs, style=style)
    mag = magnitude_of(q_in, att=freqs.attention_scaling)
    # the cache rounds cos and sin to its dtype: a float32 cache adds 2^-24 relative
    extra = (2.0**-23 if cache_dtype == F32 else 0.0) * mag
    for name, a, b in (("q vs reference", q, qr), ("k vs reference", k, kr)):
        check_rotation(a, b, dtype, magnitude=mag, max_position=pos.max(), context=name)
    for name, a, b in (("q vs apply_rope", q, qa), ("k vs apply_rope", k, ka)):
        atol, rtol = tolerance(dtype, mag)
        assert_close(a, b, dtype, atol=atol + extra + angle_atol(pos.max()) * mag, rtol=rtol,
                     context=f"{name} {style} {dtype} {cache_dtype}")


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_cached_inverse_restores_input(dtype):
    freqs = fastpe.rope_frequencies(D, scaling=SCALINGS["longrope-long"], seq_len=5000)
    cos, sin = fastpe.rope_cos_sin(np.arange(6000), freqs, dtype=dtype)
    pos = block_positions(B, 40)
    for fn in (fastpe.apply_rope_cached, reference.apply_rope_cached):
        q = rng_floats((B, 40, HQ, D), dtype, 1)
        q0 = q.copy()
        fn(q, None, cos, sin, pos)
        assert not np.allclose(q, q0)
        fn(q, None, cos, sin, pos, inverse=True)
        eps = 8 * np.finfo(dtype).eps
        assert_close(q, q0, dtype, atol=eps * magnitude_of(q0), rtol=eps,
                     context=f"{fn.__module__} {dtype}")


def test_cached_awkward_caches_and_partial_width():
    """A cache that is a strided / byte-swapped / reversed view, and one narrower than
    head_dim / 2 (only 2 * cos.shape[1] features rotate, the tail is bit-untouched)."""
    freqs = fastpe.rope_frequencies(8)
    c64, s64 = fastpe.rope_cos_sin(np.arange(100), freqs, dtype=F64)
    pos = block_positions(B, 40) % 100
    views = {
        "contiguous": (c64, s64),
        "strided": (np.repeat(c64, 2, axis=0)[::2], np.repeat(s64, 2, axis=1)[:, ::2]),
        "byteswapped": (c64.astype(">f8"), s64.astype(">f8")),
        "rows-reversed": (c64[::-1].copy()[::-1], s64[::-1].copy()[::-1]),
        "read-only": (c64.copy(), s64.copy()),
    }
    views["read-only"][0].flags.writeable = False
    views["read-only"][1].flags.writeable = False
    q_in = rng_floats((B, 40, HQ, D), F64, 3)
    want = oracle.rotate(q_in, pos, freqs.inv_freq)
    for name, (c, s) in views.items():
        for fn in (fastpe.apply_rope_cached, reference.apply_rope_cached):
            q = q_in.copy()
            fn(q, None, c, s, pos)
            check_rotation(q, want, F64, magnitude=magnitude_of(q_in), max_position=100,
                           context=f"{name} {fn.__module__}")
            assert_bytes_equal(q[..., 8:], q_in[..., 8:], context=f"{name} tail")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_cached_position_equal_to_cache_length_is_an_index_error(backend):
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    cos, sin = fastpe.rope_cos_sin(np.arange(50), fastpe.rope_frequencies(D))
    q = rng_floats((1, 40, HQ, D), F32, 1)
    with fastpe.use_backend(backend):
        fastpe.apply_rope_cached(q, None, cos, sin, offset=10)    # last position 49: fine
        q0 = q.copy()
        with pytest.raises(IndexError, match=r"position 50 .*cos/sin cache \(50 rows\)"):
            fastpe.apply_rope_cached(q, None, cos, sin, offset=11)
        pos = np.arange(40)
        pos[17] = 50
        with pytest.raises(IndexError, match=r"position 50"):
            fastpe.apply_rope_cached(q, None, cos, sin, pos)
    assert_bytes_equal(q, q0)


# ---- properties --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("scaling_id", list(SCALINGS))
def test_relative_position_norms_and_inverse(scaling_id, dtype):
    """RoPE's defining properties for every scaling type: the same q and k vectors at positions
    (2, 5) and (10, 13) give the same dot product; each pair's norm is multiplied by
    attention_scaling; inverse restores the input."""
    scaling = SCALINGS[scaling_id]
    freqs = frequencies_for(D, scaling=scaling, seq_len=40)
    rd, att = 2 * freqs.inv_freq.size, freqs.attention_scaling
    qv = rng_floats((D,), F64, 1)
    kv = rng_floats((D,), F64, 2)
    for style in STYLES:
        for fn in (fastpe.apply_rope, reference.apply_rope):
            # one call, 40 positions: dynamic / longrope see seq_len 40 throughout
            q = np.broadcast_to(qv, (1, 40, 1, D)).astype(dtype)
            k = np.broadcast_to(kv, (1, 40, 1, D)).astype(dtype)
            q_in, k_in = q.copy(), k.copy()
            fn(q, k, scaling=scaling, style=style)
            dots = [float(as_f64(q[0, i, 0]) @ as_f64(k[0, j, 0]))
                    for i, j in ((2, 5), (10, 13), (30, 33))]
            scale = float(np.linalg.norm(qv) * np.linalg.norm(kv)) * max(att, 1.0) ** 2
            tol = (1e-13 if dtype == F64 else 3e-6) * scale
            ctx = f"{scaling_id} {style} {dtype} {fn.__module__}"
            assert abs(dots[0] - dots[1]) <= tol and abs(dots[0] - dots[2]) <= tol, (
                f"{ctx}: dot products {dots}")
            # norms: each rotated pair is att times the input pair
            got = oracle.pair_norms(q, rd, style)
            want = att * oracle.pair_norms(q_in, rd, style)
            eps = 1e-14 if dtype == F64 else 4 * 2.0**-23
            assert np.all(np.abs(got - want) <= eps * want + eps), f"{ctx}: norms"
            # the unrotated part of a pair never moves
            assert_bytes_equal(q[..., rd:], q_in[..., rd:], context=ctx + " tail")
            fn(q, k, scaling=scaling, style=style, inverse=True)
            ulps = 1e-12 if dtype == F64 else 4 * 2.0**-23
            for x, x0 in ((q, q_in), (k, k_in)):
                assert_close(x, x0, dtype, atol=ulps * magnitude_of(x0), rtol=ulps,
                             context=ctx + " inverse")


def test_inverse_undoes_apply_for_every_type_and_style_at_long_positions():
    """float64 inverse to 1e-12, float32 to a few ulp, at positions near 2**20."""
    pos = (1 << 20) - 20 + np.arange(40)
    for name, scaling in SCALINGS.items():
        for style in STYLES:
            for dtype, ulps in ((F64, 1e-12), (F32, 4 * 2.0**-23)):
                q = rng_floats((1, 40, 2, D), dtype, 7)
                q0 = q.copy()
                fastpe.apply_rope(q, positions=pos, scaling=scaling, style=style)
                fastpe.apply_rope(q, positions=pos, scaling=scaling, style=style, inverse=True)
                assert_close(q, q0, dtype, atol=ulps * magnitude_of(q0), rtol=ulps,
                             context=f"{name} {style} {dtype}")


# ---- accuracy ----------------------------------------------------------------------------


def _accuracy_positions():
    """Consecutive runs (the angle recurrence, 32-aligned and straddling blocks, around
    the fast-angle limit of 1e6 and up to 2**20) and scattered positions (direct)."""
    runs = [np.arange(0, 40), 4090 + np.arange(40), 999_980 + np.arange(40),
            (1 << 20) - 64 + np.arange(65), (1 << 19) + 7 + np.arange(40)]
    scattered = np.random.default_rng(3).integers(0, (1 << 20) + 1, 120)
    return np.concatenate(runs + [scattered, [1 << 20]])


ACCURACY_FREQS = {
    "default-128": lambda: fastpe.rope_frequencies(128),
    "llama3-128-theta500k": lambda: fastpe.rope_frequencies(128, base=500000.0, scaling=LLAMA31),
    "yarn-64-attention": lambda: fastpe.rope_frequencies(
        64, scaling={"rope_type": "yarn", "factor": 16.0,
                     "original_max_position_embeddings": 4096}),
}


@pytest.mark.parametrize("freqs_id", list(ACCURACY_FREQS))
def test_float32_cos_sin_within_1_5e7_of_exact_up_to_2_20(freqs_id):
    freqs = ACCURACY_FREQS[freqs_id]()
    pos = _accuracy_positions()
    c_exact, s_exact = oracle.exact_cos_sin(pos, freqs.inv_freq)
    att = freqs.attention_scaling
    bound = 1.5e-7 * max(att, 1.0)
    for fn in (fastpe.rope_cos_sin, reference.rope_cos_sin):
        for positions in (pos, pos.reshape(2, -1)):       # 1-D and 2-D position arrays
            c, s = fn(positions, freqs, dtype="float32")
            assert c.dtype == s.dtype == F32 and c.shape == positions.shape + (freqs.inv_freq.size,)
            for name, got, want in (("cos", c, c_exact), ("sin", s, s_exact)):
                err = np.abs(as_f64(got).reshape(want.shape) - att * want)
                worst = np.unravel_index(np.argmax(err), err.shape)
                assert err.max() <= bound, (
                    f"{fn.__module__} {name}: error {err.max():.3g} at position "
                    f"{pos[worst[0]]}, pair {worst[1]}")
    # float64 tables: the float64 formula within a few ulp of the angle
    c, s = fastpe.rope_cos_sin(pos, freqs, dtype="float64")
    atol = 1e-14 + angle_atol(1 << 20)
    assert np.abs(c - att * c_exact).max() <= atol and np.abs(s - att * s_exact).max() <= atol


# the (head_dim, base, scaling) of each ACCURACY_FREQS entry
ACCURACY_SETTINGS = {
    "default-128": (128, 10000.0, None),
    "llama3-128-theta500k": (128, 500000.0, LLAMA31),
    "yarn-64-attention": (64, 10000.0, {"rope_type": "yarn", "factor": 16.0,
                                       "original_max_position_embeddings": 4096}),
}


@pytest.mark.parametrize("freqs_id", list(ACCURACY_FREQS))
def test_float32_decode_rows_turn_by_cos_sin_within_1_5e7_of_exact(freqs_id):
    """A decode row (one token of each sequence, whose sines and cosines are made for it
    alone: the angle formed and reduced in float64, the polynomials in float32) turns
    by cos and sin within 1.5e-7 of the exact values (times the attention scaling) for
    every position up to 2**20, read off by turning unit pairs: (1, 0) -> (cos, sin).
    Batched rows (one position per sequence), a token alone at an offset, and the
    embedding's call alike."""
    head_dim, base, scaling = ACCURACY_SETTINGS[freqs_id]
    freqs = ACCURACY_FREQS[freqs_id]()
    half = head_dim // 2
    pos = _accuracy_positions()
    c_exact, s_exact = oracle.exact_cos_sin(pos, freqs.inv_freq)
    att = freqs.attention_scaling
    bound = 1.5e-7 * max(att, 1.0)

    def unit_rows(n):
        q = np.zeros((n, 1, 1, head_dim), F32)
        q[..., :half] = 1.0
        return q

    rope = fastpe.RotaryEmbedding(head_dim, base=base, scaling=scaling)
    batched = unit_rows(pos.size)
    fastpe.apply_rope(batched, positions=pos.reshape(-1, 1), base=base, scaling=scaling)
    by_embedding = unit_rows(pos.size)
    rope(by_embedding, positions=pos.reshape(-1, 1))
    alone = unit_rows(pos.size)
    for i, p in enumerate(pos):
        fastpe.apply_rope(alone[i:i + 1], offset=int(p), base=base, scaling=scaling)
    for name, q in (("batched", batched), ("RotaryEmbedding", by_embedding),
                    ("one token", alone)):
        for part, got, want in (("cos", q[:, 0, 0, :half], c_exact),
                                ("sin", q[:, 0, 0, half:], s_exact)):
            err = np.abs(got.astype(F64) - att * want)
            worst = np.unravel_index(np.argmax(err), err.shape)
            assert err.max() <= bound, (
                f"{name} {part}: error {err.max():.3g} at position {pos[worst[0]]}, "
                f"pair {worst[1]}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cos_sin_matches_reference_in_every_dtype(dtype):
    freqs = fastpe.rope_frequencies(D, scaling=SCALINGS["yarn"])
    for pos in (np.arange(100), block_positions(3, 40), np.array([12345]),
                np.array([5, 5, 4, 3], np.uint8), [[7, 8, 9]]):
        c, s = fastpe.rope_cos_sin(pos, freqs, dtype=dtype)
        cr, sr = reference.rope_cos_sin(pos, freqs, dtype=dtype)
        assert c.dtype == dtype and c.shape == np.shape(pos) + (D // 2,)
        assert_close(c, cr, dtype, max_position=20000, context=f"cos {np.shape(pos)}")
        assert_close(s, sr, dtype, max_position=20000, context=f"sin {np.shape(pos)}")
    # a bare inv_freq array means attention_scaling 1
    c, s = fastpe.rope_cos_sin(np.arange(10), np.array([1.0, 0.5]), dtype=F64)
    want_c, want_s = oracle.cos_sin(np.arange(10), [1.0, 0.5])
    assert np.abs(c - want_c).max() < 1e-14 and np.abs(s - want_s).max() < 1e-14


@pytest.mark.parametrize("fn", [fastpe.rope_cos_sin, reference.rope_cos_sin],
                         ids=["default-backend", "reference"])
def test_cos_sin_of_a_scalar_position(fn):
    c, s = fn(np.int64(12345), fastpe.rope_frequencies(D))
    assert c.shape == s.shape == (D // 2,), f"shape {c.shape}"


def test_float32_rotation_within_4_ulp_of_float64_rotation():
    """Each rotated float32 element is within 4 ulp of the pair's norm (spacing of its
    float32 value) of the float64 rotation of the same float32 input: a prefill's rows
    and the same tokens as decode rows."""
    pos = _accuracy_positions()
    freqs = fastpe.rope_frequencies(128)
    for style in STYLES:
        for seed, decode in ((0, False), (1, False), (0, True)):
            q = rng_floats((1, pos.size, 2, 128), F32, seed, scale=3.0)
            q[0, :, 1] *= 1e-3   # a second head of much smaller values
            q_in = q.astype(F64)
            if decode:   # the same tokens as decode rows, one a sequence
                fastpe.apply_rope(q.reshape(pos.size, 1, 2, 128), positions=pos.reshape(-1, 1),
                                  style=style)
            else:
                fastpe.apply_rope(q, positions=pos, style=style)
            want = oracle.rotate(q_in, pos, freqs.inv_freq, style=style,
                                 cos_sin_fn=oracle.exact_cos_sin if seed == 0 else oracle.cos_sin)
            norms = oracle.pair_norms(q_in, 128, style)
            ulp = np.spacing(norms.astype(F32)).astype(F64)
            first, second = oracle.pair_indices(128, style)
            for idx in (first, second):
                err = np.abs(q[..., idx].astype(F64) - want[..., idx]) / ulp
                assert err.max() <= 4.0, (
                    f"{style}: {err.max():.2f} ulp at {np.unravel_index(err.argmax(), err.shape)}")


def test_positions_past_the_fast_angle_limit_use_exact_reduction():
    """Angles past 1e6 radians (here positions around 2**31, the largest
    positions are below 2**32) fall back to libm's full
    range reduction: scattered positions (each angle computed directly) match cos/sin of
    the float64 angle fl(p * w) to float32 accuracy; a consecutive run (seeded once, then
    advanced by angle addition) is within the float64 rounding of such angles."""
    freqs = fastpe.rope_frequencies(32)
    # 40 random positions in [2**31, 2**31 + 2**30): never two consecutive ones
    scattered = (1 << 31) + np.random.default_rng(8).choice(1 << 30, 40, replace=False)
    rounded = lambda p, w: oracle.cos_sin(p, w)   # noqa: E731 - of fl(p * w)
    c, s = fastpe.rope_cos_sin(scattered, freqs, dtype="float32")
    want_c, want_s = rounded(scattered, freqs.inv_freq)
    assert np.abs(c - want_c).max() <= 1.5e-7 and np.abs(s - want_s).max() <= 1.5e-7
    c, s = fastpe.rope_cos_sin(scattered, freqs, dtype="float64")
    assert np.abs(c - want_c).max() <= 1e-15 and np.abs(s - want_s).max() <= 1e-15

    run = (1 << 32) - 75 + np.arange(70)
    exact_c, exact_s = oracle.exact_cos_sin(run, freqs.inv_freq)
    c, s = fastpe.rope_cos_sin(run, freqs, dtype="float64")
    tol = angle_atol(1 << 32)
    assert np.abs(c - exact_c).max() <= tol and np.abs(s - exact_s).max() <= tol

    for positions in (scattered, run):
        q = rng_floats((1, positions.size, 2, 32), F32, 4)
        q_in, qr = q.astype(F64), q.copy()
        fastpe.apply_rope(q, positions=positions)
        reference.apply_rope(qr, positions=positions)
        mag = magnitude_of(q_in)
        fn = rounded if positions is scattered else oracle.exact_cos_sin
        want = oracle.rotate(q_in, positions, freqs.inv_freq, cos_sin_fn=fn)
        max_pos = 0 if positions is scattered else 1 << 32
        check_rotation(q, want, F32, magnitude=mag, max_position=max_pos,
                       context=f"apply_rope near 2**32, {'scattered' if max_pos == 0 else 'run'}")
        check_rotation(q, qr, F32, magnitude=mag, max_position=1 << 32,
                       context="apply_rope vs reference near 2**32")


def test_negative_frequencies_at_large_positions():
    """A bare inv_freq may hold negative values (a rotation the other way); the
    compiled kernel must then agree with the reference at any position."""
    w = np.array([-1.0, -0.25])
    scattered = (1 << 31) + np.random.default_rng(9).choice(1 << 30, 40, replace=False)
    for positions in (scattered, (1 << 32) - 41 + np.arange(40)):
        q = rng_floats((1, positions.size, 1, 4), F64, 1)
        qr = q.copy()
        fastpe.apply_rope(q, positions=positions, freqs=w)
        reference.apply_rope(qr, positions=positions, freqs=w)
        check_rotation(q, qr, F64, magnitude=magnitude_of(qr), max_position=1 << 32,
                       context=f"negative inv_freq, positions {positions[:3]}...")


# ---- RotaryEmbedding ---------------------------------------------------------------------

EMBEDDINGS = {
    "default": dict(head_dim=D),
    "theta-1e6-gptj": dict(head_dim=D, base=1e6, style="gptj"),
    "llama3": dict(head_dim=D, base=500000.0, scaling=dict(LLAMA31,
                   original_max_position_embeddings=64)),
    "yarn": dict(head_dim=D, scaling=SCALINGS["yarn"]),
    "dynamic": dict(head_dim=D, scaling={"rope_type": "dynamic", "factor": 2.0},
                    max_position_embeddings=16),
    "longrope": dict(head_dim=D, scaling=SCALINGS["longrope-long"]),
    "rotary_dim=8": dict(head_dim=D, rotary_dim=8),
    "partial-in-dict": dict(head_dim=D, scaling=SCALINGS["partial_rotary_factor"]),
}


@pytest.mark.parametrize("emb_id", list(EMBEDDINGS))
def test_rotary_embedding_call_equals_apply_rope(emb_id):
    kw = dict(EMBEDDINGS[emb_id])
    head_dim = kw.pop("head_dim")
    rope = fastpe.RotaryEmbedding(head_dim, **kw)
    assert rope.head_dim == head_dim and rope.style == kw.get("style", "neox")
    apply_kw = {k: v for k, v in kw.items()}
    for layout in LAYOUTS:
        for inverse in (False, True):
            q, k, pos = _plain_inputs(F32, layout, seed=3)
            qa, ka = q.copy(), k.copy()
            pos_arg = pos[0] if layout == "shd" else pos
            out = rope(q, k, pos_arg, layout=layout, inverse=inverse)
            assert out[0] is q and out[1] is k
            fastpe.apply_rope(qa, ka, pos_arg, layout=layout, inverse=inverse, **apply_kw)
            assert_bytes_equal(q, qa, context=f"{emb_id} {layout} inverse={inverse} q")
            assert_bytes_equal(k, ka, context=f"{emb_id} {layout} inverse={inverse} k")
            with fastpe.use_backend("numpy"):
                qn, kn, _ = _plain_inputs(F32, layout, seed=3)
                rope(qn, kn, pos_arg, layout=layout, inverse=inverse)
            check_rotation(q, qn, F32, magnitude=4.0, max_position=6000,
                           context=f"{emb_id} {layout} vs numpy backend")
    # frequencies() and cos_sin()
    seq_len = int(pos.max()) + 1
    f = rope.frequencies(seq_len)
    ref = frequencies_for(head_dim, base=kw.get("base"), scaling=kw.get("scaling"),
                          seq_len=seq_len, rotary_dim=kw.get("rotary_dim"),
                          max_position_embeddings=kw.get("max_position_embeddings"))
    assert np.array_equal(f.inv_freq, ref.inv_freq)
    assert f.attention_scaling == ref.attention_scaling
    assert rope.rotary_dim == 2 * f.inv_freq.size
    c, s = rope.cos_sin(pos)
    cr, sr = fastpe.rope_cos_sin(pos, f)
    assert_bytes_equal(c, cr, context="cos_sin cos")
    assert_bytes_equal(s, sr, context="cos_sin sin")
    # cos_sin feeds apply_rope_cached to the same rotation
    q, k, _ = _plain_inputs(F64, "bshd", seed=4)
    qa = q.copy()
    table_c, table_s = rope.cos_sin(np.arange(seq_len), dtype="float64")
    fastpe.apply_rope_cached(q, None, table_c, table_s, pos, style=rope.style)
    rope(qa, None, pos)
    check_rotation(q, qa, F64, magnitude=4.0 * f.attention_scaling, max_position=seq_len)


def test_rotary_embedding_dynamic_frequencies_follow_the_call_length():
    rope = fastpe.RotaryEmbedding(D, scaling={"rope_type": "dynamic", "factor": 4.0},
                                  max_position_embeddings=32)
    assert np.array_equal(rope.frequencies(None).inv_freq, fastpe.rope_frequencies(D).inv_freq)
    assert np.array_equal(rope.frequencies(32).inv_freq, rope.frequencies(None).inv_freq)
    assert rope.frequencies(100).inv_freq[-1] < rope.frequencies(32).inv_freq[-1]
    # a call reaching position 99 uses seq_len 100; one staying below 32 the plain base
    for pos, seq_len in ((np.arange(60, 100), 100), (np.arange(40) % 32, None)):
        q = rng_floats((1, 40, 1, D), F64, 1)
        q_in = q.copy()
        rope(q, positions=pos)
        w = rope.frequencies(seq_len).inv_freq
        check_rotation(q, oracle.rotate(q_in, pos, w), F64, magnitude=4.0, max_position=100,
                       context=f"last position {pos.max()}")


def test_rotary_embedding_repr():
    r = repr(fastpe.RotaryEmbedding(64, base=500000.0, scaling=LLAMA31, rotary_dim=32,
                                    style="gptj"))
    for part in ("RotaryEmbedding(", "head_dim=64", "rotary_dim=32", "style='gptj'",
                 "rope_type='llama3'", "base=500000.0"):
        assert part in r, r


HF_CONFIGS = {
    "llama-3.1": (
        {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "rope_theta": 500000.0, "rope_scaling": LLAMA31,
         "max_position_embeddings": 131072},
        dict(head_dim=128, rotary_dim=128, style="neox", base=500000.0, scaling=LLAMA31)),
    "gpt-neox-rotary_pct": (
        {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
         "rotary_pct": 0.25, "rotary_emb_base": 10000, "max_position_embeddings": 2048},
        dict(head_dim=64, rotary_dim=16, style="neox", base=10000.0)),
    "gpt-j": (
        {"model_type": "gptj", "n_embd": 256, "n_head": 16, "rotary_dim": 8,
         "n_positions": 2048},
        dict(head_dim=16, rotary_dim=8, style="gptj", base=10000.0)),
    "phi-partial_rotary_factor": (
        {"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
         "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
         "max_position_embeddings": 2048},
        dict(head_dim=80, rotary_dim=32, style="neox", base=10000.0)),
    "namespace-mistral": (
        SimpleNamespace(model_type="mistral", hidden_size=256, num_attention_heads=8,
                        head_dim=32, rope_theta=1e6, rope_scaling=None,
                        max_position_embeddings=32768),
        dict(head_dim=32, rotary_dim=32, style="neox", base=1e6)),
    "namespace-yarn": (
        SimpleNamespace(model_type="qwen2", hidden_size=512, num_attention_heads=16,
                        rope_theta=1e6, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 32768}),
        dict(head_dim=32, rotary_dim=32, style="neox", base=1e6,
             scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32768})),
}


@pytest.mark.parametrize("config_id", list(HF_CONFIGS))
def test_rotary_embedding_from_hf_config(config_id):
    config, want = HF_CONFIGS[config_id]
    rope = fastpe.RotaryEmbedding.from_hf_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.style) == (
        want["head_dim"], want["rotary_dim"], want["style"]), repr(rope)
    assert f"base={want['base']}" in repr(rope)
    hd, rd = want["head_dim"], want["rotary_dim"]
    q = rng_floats((1, 40, 2, hd), F32, 1)
    k = rng_floats((1, 40, 1, hd), F32, 2)
    q_in, k_in = q.copy(), k.copy()
    pos = 8000 + np.arange(40)
    rope(q, k, pos)
    f = frequencies_for(hd, base=want["base"], scaling=want.get("scaling"),
                        rotary_dim=rd, max_position_embeddings=None)
    for x, x_in in ((q, q_in), (k, k_in)):
        check_rotation(x, oracle.rotate(x_in, pos, f.inv_freq, style=want["style"],
                                        attention_scaling=f.attention_scaling),
                       F32, magnitude=magnitude_of(x_in, att=f.attention_scaling),
                       max_position=8040, context=config_id)
        assert_bytes_equal(x[..., rd:], x_in[..., rd:], context=f"{config_id} tail")
    # a style argument overrides the model family's
    other = "neox" if want["style"] == "gptj" else "gptj"
    assert fastpe.RotaryEmbedding.from_hf_config(config, style=other).style == other


def test_rotary_embedding_is_reusable_across_shapes_and_threads(threaded):
    rope = fastpe.RotaryEmbedding(D, scaling=SCALINGS["llama3"])
    for shape, layout in (((2, 40, 4, D), "bshd"), ((2, 4, 64, D), "bhsd"), ((70, 3, D), "shd")):
        q = rng_floats(shape, F32, 1)
        qa = q.copy()
        rope(q, layout=layout, num_threads=2)
        fastpe.apply_rope(qa, layout=layout, scaling=SCALINGS["llama3"], num_threads=1)
        assert_bytes_equal(q, qa, context=f"{shape} {layout}")


# ---- bad input ---------------------------------------------------------------------------


def q32(shape=(B, 40, HQ, D), dtype=np.float32, seed=1):
    return rng_floats(shape, dtype, seed)


def k32(shape=(B, 40, HK, D), dtype=np.float32):
    return q32(shape, dtype, seed=2)


def read_only(a):
    a.flags.writeable = False
    return a


def cache(rows=64, half=D // 2, dtype=np.float32):
    return {"cos": rng_floats((rows, half), dtype, 5), "sin": rng_floats((rows, half), dtype, 6)}


def fused(slices):
    """Arrays q and k cut from one buffer by `slices` (a function of the buffer)."""
    def make_arrays():
        buf = rng_floats((B, 40, 4, 2 * D), np.float32, 9)
        q, k = slices(buf)
        return {"buf": buf, "q": q, "k": k}
    return make_arrays


def qk(**kw):
    return lambda: {"q": q32(**kw), "k": k32()}


def qk_cache(q_kw=None, k_kw=None, **cache_kw):
    return lambda: {"q": q32(**(q_kw or {})), "k": k32(**(k_kw or {})), **cache(**cache_kw)}


@dataclass
class Bad:
    id: str
    call: Callable[[dict], object]
    exc: type[Exception]
    match: str
    arrays: Callable[[], dict] = field(default=qk())
    marks: tuple = ()


AR, ARC, CS = fastpe.apply_rope, fastpe.apply_rope_cached, fastpe.rope_cos_sin
REF = {fastpe.apply_rope: "apply_rope", fastpe.apply_rope_cached: "apply_rope_cached",
       fastpe.rope_cos_sin: "rope_cos_sin"}

BAD: list[Bad] = [
    # q and k themselves
    Bad("q-list", lambda a: AR(a["q"].tolist()), TypeError, r"\bq\b"),
    Bad("q-int32", lambda a: AR(a["q"]), TypeError, r"\bq\b.*floating dtype",
        lambda: {"q": np.ones((B, 40, HQ, D), np.int32)}),
    Bad("q-int64-with-k", lambda a: AR(a["q"], a["k"]), TypeError, r"\bq\b.*floating dtype",
        lambda: {"q": np.ones((B, 40, HQ, D), np.int64), "k": k32()}),
    Bad("q-complex", lambda a: AR(a["q"]), TypeError, r"\bq\b.*floating dtype",
        lambda: {"q": np.ones((B, 40, HQ, D), np.complex64)}),
    Bad("k-complex", lambda a: AR(a["q"], a["k"]), TypeError, r"\bk\b.*floating dtype",
        lambda: {"q": q32(), "k": np.ones((B, 40, HK, D), np.complex128)}),
    Bad("k-int", lambda a: AR(a["q"], a["k"]), TypeError, r"\bk\b",
        lambda: {"q": q32(), "k": np.ones((B, 40, HK, D), np.int16)}),
    Bad("q-k-dtypes-differ", lambda a: AR(a["q"], a["k"]), TypeError, r"\bk\b.*q's dtype",
        lambda: {"q": q32(), "k": k32(dtype=np.float64)}),
    Bad("q-k-float16-float32", lambda a: AR(a["q"], a["k"]), TypeError, r"\bk\b.*dtype",
        lambda: {"q": q32(dtype=np.float16), "k": k32()}),
    Bad("q-3d-for-bshd", lambda a: AR(a["q"]), ValueError, r"\bq\b.*4 dimensions",
        lambda: {"q": q32((40, HQ, D))}),
    Bad("q-4d-for-shd", lambda a: AR(a["q"], layout="shd"), ValueError,
        r"\bq\b.*3 dimensions"),
    Bad("q-read-only", lambda a: AR(a["q"], a["k"]), TypeError, r"\bq\b.*read-only",
        lambda: {"q": read_only(q32()), "k": k32()}),
    Bad("k-read-only", lambda a: AR(a["q"], a["k"]), TypeError, r"\bk\b.*read-only",
        lambda: {"q": q32(), "k": read_only(k32())}),
    Bad("k-broadcast_to", lambda a: AR(a["q"], np.broadcast_to(a["k"], (B, 40, HK, D))),
        TypeError, r"\bk\b.*read-only", lambda: {"q": q32(), "k": k32((40, HK, D))}),
    Bad("k-zero-stride-writable",
        lambda a: AR(a["q"], np.lib.stride_tricks.as_strided(
            a["k"], (B, 40, 2, D), (0,) + a["k"].strides[1:], writeable=True)),
        ValueError, r"\bk\b.*overlapping", lambda: {"q": q32(), "k": k32((1, 40, 2, D))}),
    Bad("k-is-q", lambda a: AR(a["q"], a["q"]), ValueError, r"\bk is q\b"),
    Bad("k-view-of-q", lambda a: AR(a["q"], a["q"][:, :, 1:2]), ValueError,
        r"\bq and k overlap"),
    Bad("k-same-buffer-other-view", lambda a: AR(a["q"], a["q"][...]), ValueError,
        r"\bq and k overlap"),
    Bad("fused-overlapping-head-slices", lambda a: AR(a["q"], a["k"]), ValueError,
        r"\bq and k overlap", fused(lambda b: (b[:, :, 0:3, :D], b[:, :, 2:4, :D]))),
    Bad("fused-overlapping-feature-slices", lambda a: AR(a["q"], a["k"]), ValueError,
        r"\bq and k overlap", fused(lambda b: (b[:, :, :2, :D], b[:, :, 1:3, D // 2:D + D // 2]))),
    Bad("fused-overlapping-bhsd", lambda a: AR(a["q"], a["k"], layout="bhsd"), ValueError,
        r"\bq and k overlap",
        fused(lambda b: (b[:, :, 0:2, :D].transpose(0, 2, 1, 3),
                         b[:, :, 1:2, :D].transpose(0, 2, 1, 3)))),
    Bad("k-head_dim-differs", lambda a: AR(a["q"], a["k"]), ValueError,
        r"\bk\b.*head_dim", lambda: {"q": q32(), "k": k32((B, 40, HK, D + 2))}),
    Bad("k-batch-differs", lambda a: AR(a["q"], a["k"]), ValueError, r"\bk\b.*batch",
        lambda: {"q": q32(), "k": k32((B + 1, 40, HK, D))}),
    Bad("k-seq-differs", lambda a: AR(a["q"], a["k"]), ValueError, r"\bk\b.*seq",
        lambda: {"q": q32(), "k": k32((B, 41, HK, D))}),
    Bad("k-seq-differs-bhsd", lambda a: AR(a["q"], a["k"], layout="bhsd"), ValueError,
        r"\bk\b.*seq", lambda: {"q": q32((B, HQ, 40, D)), "k": k32((B, HK, 39, D))}),
    Bad("odd-head_dim", lambda a: AR(a["q"]), ValueError, r"\bhead_dim\b 15 is odd",
        lambda: {"q": q32((B, 40, HQ, 15))}),
    # rotary_dim
    Bad("rotary_dim-odd", lambda a: AR(a["q"], a["k"], rotary_dim=7), ValueError,
        r"\brotary_dim\b.*even"),
    Bad("rotary_dim-above-head_dim", lambda a: AR(a["q"], a["k"], rotary_dim=D + 2),
        ValueError, r"\brotary_dim\b.*head_dim"),
    Bad("rotary_dim-zero", lambda a: AR(a["q"], a["k"], rotary_dim=0), ValueError,
        r"\brotary_dim\b"),
    Bad("rotary_dim-float", lambda a: AR(a["q"], a["k"], rotary_dim=8.0), TypeError,
        r"\brotary_dim\b"),
    Bad("rotary_dim-contradicts-freqs",
        lambda a: AR(a["q"], a["k"], freqs=fastpe.rope_frequencies(8), rotary_dim=12),
        ValueError, r"\brotary_dim\b.*\bfreqs\b"),
    Bad("rotary_dim-contradicts-partial_rotary_factor",
        lambda a: AR(a["q"], a["k"], scaling=SCALINGS["partial_rotary_factor"], rotary_dim=12),
        ValueError, r"\brotary_dim\b.*partial_rotary_factor"),
    # positions and offset
    Bad("positions-too-long", lambda a: AR(a["q"], a["k"], np.arange(41)), ValueError,
        r"\bpositions\b.*shape"),
    Bad("positions-batch-differs", lambda a: AR(a["q"], a["k"], np.zeros((B + 1, 40), int)),
        ValueError, r"\bpositions\b.*shape"),
    Bad("positions-3d", lambda a: AR(a["q"], a["k"], np.zeros((1, B, 40), int)), ValueError,
        r"\bpositions\b.*shape"),
    Bad("positions-scalar", lambda a: AR(a["q"], a["k"], 3), ValueError,
        r"\bpositions\b.*shape"),
    Bad("positions-transposed", lambda a: AR(a["q"], a["k"], np.zeros((40, B), int)),
        ValueError, r"\bpositions\b.*shape"),
    Bad("positions-negative", lambda a: AR(a["q"], a["k"], np.arange(40) - 1), ValueError,
        r"\bpositions\b.*>= 0"),
    Bad("positions-negative-int8", lambda a: AR(a["q"], a["k"], np.arange(-20, 20, dtype=np.int8)),
        ValueError, r"\bpositions\b.*>= 0"),
    Bad("positions-negative-list", lambda a: AR(a["q"], a["k"], [0] * 39 + [-5]), ValueError,
        r"\bpositions\b.*>= 0"),
    Bad("positions-uint64-past-int64",
        lambda a: AR(a["q"], a["k"], np.full(40, 2**63, np.uint64)), ValueError,
        r"\bpositions\b"),
    Bad("positions-float-nan", lambda a: AR(a["q"], a["k"], np.full(40, np.nan)),
        ValueError, r"\bpositions\b.*finite"),
    # real-valued positions are taken: the message names both kinds
    Bad("positions-bool", lambda a: AR(a["q"], a["k"], np.ones(40, bool)), TypeError,
        r"^positions must be integers, or real-valued .*got dtype bool$"),
    Bad("positions-complex", lambda a: AR(a["q"], a["k"], np.ones(40, complex)), TypeError,
        r"^positions must be integers, or real-valued .*got dtype complex128$"),
    Bad("positions-bool-empty", lambda a: AR(a["q"][:, :0], a["k"][:, :0], np.ones(0, bool)),
        TypeError, r"^positions must be integers, or real-valued .*got dtype bool$"),
    Bad("positions-and-offset", lambda a: AR(a["q"], a["k"], np.arange(40), offset=3),
        ValueError, r"(?=.*\bpositions\b)(?=.*\boffset\b)"),
    Bad("offset-negative", lambda a: AR(a["q"], a["k"], offset=-1), ValueError, r"\boffset\b"),
    Bad("offset-float", lambda a: AR(a["q"], a["k"], offset=1.0), TypeError, r"\boffset\b"),
    Bad("offset-past-int64", lambda a: AR(a["q"], a["k"], offset=2**63 - 10), ValueError,
        r"\boffset\b"),
    Bad("offset-2**63", lambda a: AR(a["q"], a["k"], offset=2**63), ValueError,
        r"\boffset\b"),
    Bad("offset-minus-2**64", lambda a: AR(a["q"], a["k"], offset=-2**64), ValueError,
        r"\boffset\b"),
    # style, layout, threads
    Bad("style-unknown", lambda a: AR(a["q"], a["k"], style="llama"), ValueError,
        r"\bstyle\b.*'neox', 'gptj'"),
    Bad("style-wrong-case", lambda a: AR(a["q"], a["k"], style="NeoX"), ValueError, r"\bstyle\b"),
    Bad("style-none", lambda a: AR(a["q"], a["k"], style=None), ValueError, r"\bstyle\b"),
    Bad("layout-unknown", lambda a: AR(a["q"], a["k"], layout="bsd"), ValueError,
        r"\blayout\b.*'bshd', 'bhsd', 'shd'"),
    Bad("num_threads-zero", lambda a: AR(a["q"], a["k"], num_threads=0), ValueError,
        r"\bnum_threads\b"),
    Bad("num_threads-str", lambda a: AR(a["q"], a["k"], num_threads="2"), TypeError,
        r"\bnum_threads\b"),
    # frequencies
    Bad("freqs-and-base", lambda a: AR(a["q"], a["k"], freqs=fastpe.rope_frequencies(D),
                                       base=10000.0), ValueError, r"\bfreqs\b.*\bbase\b"),
    Bad("freqs-and-scaling", lambda a: AR(a["q"], a["k"], freqs=fastpe.rope_frequencies(D),
                                          scaling=SCALINGS["linear"]),
        ValueError, r"\bfreqs\b.*\bscaling\b"),
    Bad("freqs-nan", lambda a: AR(a["q"], a["k"], freqs=a["w"]), ValueError,
        r"\bfreqs\.inv_freq\b.*finite",
        lambda: {"q": q32(), "k": k32(), "w": np.array([1.0, np.nan] + [0.5] * 6)}),
    Bad("freqs-inf-RopeFrequencies",
        lambda a: AR(a["q"], a["k"], freqs=fastpe.RopeFrequencies(a["w"], 1.0)), ValueError,
        r"\bfreqs\.inv_freq\b.*finite",
        lambda: {"q": q32(), "k": k32(), "w": np.array([1.0, np.inf] + [0.5] * 6)}),
    Bad("freqs-2d", lambda a: AR(a["q"], a["k"], freqs=a["w"]), ValueError,
        r"\bfreqs\.inv_freq\b.*1-D", lambda: {"q": q32(), "k": k32(), "w": np.ones((2, 4))}),
    Bad("freqs-list", lambda a: AR(a["q"], a["k"], freqs=[1.0] * 8), TypeError, r"\bfreqs\b"),
    Bad("freqs-complex", lambda a: AR(a["q"], a["k"], freqs=np.ones(8, complex)), TypeError,
        r"\bfreqs\.inv_freq\b"),
    Bad("freqs-attention-scaling-zero",
        lambda a: AR(a["q"], a["k"], freqs=fastpe.RopeFrequencies(np.ones(8), 0.0)),
        ValueError, r"\bfreqs\.attention_scaling\b"),
    Bad("freqs-attention-scaling-nan",
        lambda a: AR(a["q"], a["k"], freqs=fastpe.RopeFrequencies(np.ones(8), float("nan"))),
        ValueError, r"\bfreqs\.attention_scaling\b"),
    Bad("freqs-wider-than-head", lambda a: AR(a["q"], a["k"], freqs=np.ones(D // 2 + 1)),
        ValueError, r"\bfreqs\b"),
    Bad("base-zero", lambda a: AR(a["q"], a["k"], base=0.0), ValueError, r"\bbase\b"),
    Bad("base-contradicts-rope_theta",
        lambda a: AR(a["q"], a["k"], base=1e4, scaling={"rope_type": "default", "rope_theta": 1e6}),
        ValueError, r"\bbase\b.*rope_theta"),
    Bad("scaling-unknown-type", lambda a: AR(a["q"], a["k"], scaling={"rope_type": "ntk"}),
        ValueError, r"rope_type.*supported"),
    Bad("scaling-missing-factor", lambda a: AR(a["q"], a["k"], scaling={"rope_type": "linear"}),
        ValueError, r"scaling\['factor'\]"),
    Bad("scaling-needs-original-length",
        lambda a: AR(a["q"], a["k"], scaling={"rope_type": "dynamic", "factor": 2.0}),
        ValueError, r"original_max_position_embeddings.*max_position_embeddings"),
    # apply_rope_cached
    Bad("cached-cos-wider-than-head", lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"]),
        ValueError, r"\bcos\b", qk_cache(half=D // 2 + 1)),
    Bad("cached-cos-sin-shapes-differ",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"][:, :-1]), ValueError,
        r"\bcos and sin\b.*shape", qk_cache()),
    Bad("cached-cos-sin-rows-differ",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"][:-1]), ValueError,
        r"\bcos and sin\b.*shape", qk_cache()),
    Bad("cached-cos-sin-dtypes-differ",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"].astype(np.float64)), TypeError,
        r"\bcos and sin\b.*dtype", qk_cache()),
    Bad("cached-k-head_dim-differs", lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"]),
        ValueError, r"\bk\b.*head_dim", qk_cache(k_kw={"shape": (B, 40, HK, D - 2)})),
    Bad("cached-cos-int", lambda a: ARC(a["q"], a["k"], a["cos"].astype(np.int32),
                                        a["sin"].astype(np.int32)),
        TypeError, r"\bcos\b.*floating dtype", qk_cache()),
    Bad("cached-cos-1d", lambda a: ARC(a["q"], a["k"], a["cos"][0], a["sin"][0]), ValueError,
        r"\bcos\b.*2 dimensions", qk_cache()),
    Bad("cached-position-at-cache-length",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"], np.arange(40) + 24), IndexError,
        r"position 63\b.*cos/sin cache \(63 rows\)", qk_cache(rows=63)),
    Bad("cached-offset-past-cache",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"], offset=25), IndexError,
        r"position 64\b.*cos/sin cache", qk_cache()),
    Bad("cached-negative-positions",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"], np.arange(40) - 3), ValueError,
        r"\bpositions\b.*>= 0", qk_cache()),
    Bad("cached-read-only-q", lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"]), TypeError,
        r"\bq\b.*read-only", lambda: {"q": read_only(q32()), "k": k32(), **cache()}),
    Bad("cached-q-k-overlap", lambda a: ARC(a["q"], a["q"][:, :, :1], a["cos"], a["sin"]),
        ValueError, r"\bq and k overlap", qk_cache()),
    Bad("cached-style-unknown", lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"], style="x"),
        ValueError, r"\bstyle\b", qk_cache()),
    Bad("cached-layout-unknown",
        lambda a: ARC(a["q"], a["k"], a["cos"], a["sin"], layout="sbhd"), ValueError,
        r"\blayout\b", qk_cache()),
    # rope_cos_sin
    Bad("cos_sin-dtype-int", lambda a: CS(np.arange(4), fastpe.rope_frequencies(8), dtype="int32"),
        TypeError, r"\bdtype\b", dict),
    Bad("cos_sin-dtype-complex",
        lambda a: CS(np.arange(4), fastpe.rope_frequencies(8), dtype=np.complex64),
        TypeError, r"\bdtype\b", dict),
    Bad("cos_sin-positions-complex",
        lambda a: CS(np.arange(4.0) + 1j, fastpe.rope_frequencies(8)),
        TypeError, r"\bpositions\b", dict),
    Bad("cos_sin-positions-float-inf",
        lambda a: CS(np.array([0.5, np.inf]), fastpe.rope_frequencies(8)),
        ValueError, r"\bpositions\b.*finite", dict),
    Bad("cos_sin-positions-negative", lambda a: CS([3, -1], fastpe.rope_frequencies(8)),
        ValueError, r"\bpositions\b", dict),
    Bad("cos_sin-freqs-nan", lambda a: CS(np.arange(4), np.array([1.0, np.nan])), ValueError,
        r"\bfreqs\.inv_freq\b", dict),
    Bad("cos_sin-freqs-none", lambda a: CS(np.arange(4), None), TypeError, r"\bfreqs\b", dict),
    # RotaryEmbedding
    Bad("embedding-odd-head_dim", lambda a: fastpe.RotaryEmbedding(15), ValueError,
        r"\bhead_dim\b 15 is odd", dict),
    Bad("embedding-head_dim-zero", lambda a: fastpe.RotaryEmbedding(0), ValueError,
        r"\bhead_dim\b", dict),
    Bad("embedding-rotary_dim-above", lambda a: fastpe.RotaryEmbedding(D, rotary_dim=D + 2),
        ValueError, r"\brotary_dim\b", dict),
    Bad("embedding-style-unknown", lambda a: fastpe.RotaryEmbedding(D, style="rope"),
        ValueError, r"\bstyle\b", dict),
    Bad("embedding-call-head_dim-differs",
        lambda a: fastpe.RotaryEmbedding(D)(a["q"]), ValueError,
        r"\bq\b has head_dim .* RotaryEmbedding is for head_dim",
        lambda: {"q": q32((B, 40, HQ, D - 4))}),
    Bad("embedding-call-read-only-k", lambda a: fastpe.RotaryEmbedding(D)(a["q"], a["k"]),
        TypeError, r"\bk\b.*read-only", lambda: {"q": q32(), "k": read_only(k32())}),
    Bad("embedding-call-overlap", lambda a: fastpe.RotaryEmbedding(D)(a["q"], a["q"][:, :, 2:]),
        ValueError, r"\bq and k overlap"),
    Bad("embedding-call-negative-positions",
        lambda a: fastpe.RotaryEmbedding(D)(a["q"], a["k"], np.arange(40) - 40),
        ValueError, r"\bpositions\b"),
    Bad("embedding-from-config-without-head_dim",
        lambda a: fastpe.RotaryEmbedding.from_hf_config({"rope_theta": 1e4}), ValueError,
        r"head_dim", dict),
]


# BAD is run by tests/test_bad_input.py (test_bad_input), with every other function's
# bad-input rows: one table-driven test of the whole matrix.


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_non_overlapping_interleaved_slices_are_accepted(backend):
    """q and k sharing a buffer but no element: QKV slices, even/odd features, alternate
    tokens. Accepted, and equal to rotating copies."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    layouts = {
        "qkv-heads": lambda b: (b[:, :, :, 0, :], b[:, :, :, 1, :]),
        "even-odd-features": lambda b: (b[..., 0, 0::2], b[..., 0, 1::2]),
        "alternate-batch-rows": lambda b: (b[0::2, :, :, 0], b[1::2, :, :, 0]),
        "q-heads-then-k-heads": lambda b: (b[:, :, :2, 0], b[:, :, 2:, 0]),
    }
    for name, cut in layouts.items():
        buf = rng_floats((2 * B, 40, 3, 3, D), np.float32, 11)
        before = buf.copy()
        q, k = cut(buf)
        qc, kc = q.copy(), k.copy()
        assert np.may_share_memory(q, k) and not np.shares_memory(q, k)
        with fastpe.use_backend(backend):
            fastpe.apply_rope(q, k, offset=9)
            fastpe.apply_rope(qc, kc, offset=9)
        assert_bytes_equal(q, qc, context=f"{name} q")
        assert_bytes_equal(k, kc, context=f"{name} k")
        touched = np.zeros(buf.shape, bool)
        tq, tk = cut(touched)
        tq[...], tk[...] = True, True
        assert_bytes_equal(buf[~touched], before[~touched], context=f"{name} rest of buffer")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_bfloat16_frequencies_are_their_values(backend):
    """An array of inverse frequencies in bfloat16 turns by the numbers it holds."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if backend == "cython" and fastpe._backend.compiled is None:
        pytest.skip("the compiled extension is not built")
    half = np.asarray(fastpe.rope_frequencies(D).inv_freq).astype(ml_dtypes.bfloat16)
    got, want = q32(), q32()
    pos = np.arange(want.shape[1])
    with fastpe.use_backend(backend):
        fastpe.apply_rope(got, positions=pos, freqs=half)
        fastpe.apply_rope(want, positions=pos, freqs=half.astype(np.float64))
    assert_bytes_equal(got, want, context="bfloat16 frequencies")


def test_frequencies_are_not_modified_by_calls():
    f = fastpe.rope_frequencies(D, scaling=SCALINGS["yarn"])
    before = f.inv_freq.copy()
    q = q32()
    fastpe.apply_rope(q, freqs=f, inverse=True)
    fastpe.rope_cos_sin(np.arange(50), f)
    assert np.array_equal(f.inv_freq, before) and not f.inv_freq.flags.writeable
    assert pickle.loads(pickle.dumps(f)).attention_scaling == f.attention_scaling


@pytest.mark.parametrize("make", [
    lambda: fastpe.RotaryEmbedding(64),
    lambda: fastpe.RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 2.0},
                                   max_position_embeddings=16),
    lambda: fastpe.RotaryEmbedding(64, scaling={"rope_type": "yarn", "factor": 4.0},
                                   max_position_embeddings=16, style="gptj"),
    lambda: fastpe.RotaryEmbedding(64, base=1e6, mrope_section=[8, 12, 12]),
], ids=["default", "dynamic", "yarn-gptj", "mrope"])
def test_rotary_embedding_pickles(make):
    """A RotaryEmbedding sent to a worker process (pickled) rotates as the original does,
    and its unpickled frequency cache stays read-only."""
    rope = make()
    q = np.random.default_rng(0).standard_normal((1, 40, 2, 64))
    want = rope(q.copy())[0]          # fills the original's caches, past the original length
    clone = pickle.loads(pickle.dumps(rope))
    assert repr(clone) == repr(rope)
    np.testing.assert_array_equal(clone(q.copy())[0], want)
    assert not clone.frequencies(40).inv_freq.flags.writeable
    # a pickle of an earlier fastpe, which kept neither the layout's axes nor whether
    # text positions apply, rotates as it did
    state = rope.__getstate__()
    del state["_layout_axes"], state["_text_positions"]
    old = fastpe.RotaryEmbedding.__new__(fastpe.RotaryEmbedding)
    old.__setstate__(state)
    np.testing.assert_array_equal(old(q.copy())[0], want)


# ---- cos/sin as transformers' rotary modules return them -----------------------------------


def _hf_cos_sin(positions, freqs, style="neox"):
    """(batch, seq, rotary_dim) cos and sin, each frequency's value twice, as transformers'
    rotary modules give them: cat((freqs, freqs)) for rotate_half, repeat_interleave for
    adjacent pairs; built from the float64 formula."""
    angles = np.asarray(positions, np.float64)[..., None] * freqs.inv_freq
    if style == "neox":
        angles = np.concatenate([angles, angles], axis=-1)
    else:
        angles = np.repeat(angles, 2, axis=-1)
    att = freqs.attention_scaling
    return np.cos(angles) * att, np.sin(angles) * att


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cached_takes_transformers_cos_sin_lined_up_with_the_tokens(style, layout):
    """Per-sequence positions (left padding): row b of cos is sequence b's."""
    freqs = fastpe.rope_frequencies(32, scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 64})
    positions = np.array([[5, 6, 7, 8, 9, 10], [0, 0, 0, 1, 2, 3]])
    cos, sin = _hf_cos_sin(positions, freqs, style)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 6, 4, 32))
    k = rng.standard_normal((2, 6, 2, 32))
    if layout == "bhsd":
        q, k = q.transpose(0, 2, 1, 3).copy(), k.transpose(0, 2, 1, 3).copy()
    want_q, want_k = q.copy(), k.copy()
    fastpe.reference.apply_rope(want_q, want_k, positions, freqs=freqs, style=style,
                                layout=layout)
    fastpe.apply_rope_cached(q, k, cos, sin, style=style, layout=layout)
    np.testing.assert_allclose(q, want_q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(k, want_k, rtol=0, atol=1e-12)
    fastpe.apply_rope_cached(q, k, cos, sin, style=style, layout=layout, inverse=True)
    fastpe.reference.apply_rope(want_q, want_k, positions, freqs=freqs, style=style,
                                layout=layout, inverse=True)
    np.testing.assert_allclose(q, want_q, rtol=0, atol=1e-12)


def test_cached_per_token_reads_a_two_dimensional_cos_as_rows_of_tokens():
    freqs = fastpe.rope_frequencies(16)
    cos, sin = _hf_cos_sin(np.arange(3, 8), freqs)
    q = np.ones((2, 5, 1, 16))
    want = q.copy()
    fastpe.reference.apply_rope(want, positions=np.arange(3, 8), freqs=freqs)
    fastpe.apply_rope_cached(q, None, cos, sin, per_token=True)
    np.testing.assert_allclose(q, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_cached_per_token_takes_the_nans_a_cos_holds_twice(style):
    """A NaN held twice, the same bits in both places, is a value held twice: the cache is
    read as the rows looked up by position read it; NaNs of different payloads are not."""
    freqs = fastpe.rope_frequencies(16)
    cos, sin = _hf_cos_sin(np.arange(4)[None], freqs, style)
    cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    pair = [0, 8] if style == "neox" else [0, 1]
    cos[0, 1, pair] = np.nan
    sin.view(np.uint32)[0, 2, [p + 2 for p in pair]] = 0x7F81CED2
    q = np.arange(4 * 2 * 16, dtype=np.float32).reshape(1, 4, 2, 16)
    rows = q.copy()
    fastpe.apply_rope_cached(q, None, cos, sin, style=style)
    lookup = (cos[0, :, :8], sin[0, :, :8]) if style == "neox" else (cos[0, :, ::2],
                                                                      sin[0, :, ::2])
    fastpe.apply_rope_cached(rows, None, *lookup, np.arange(4), style=style)
    assert_bytes_equal(q, rows, "per-token cos vs its rows looked up by position")
    assert np.isnan(q[0, 1]).any() and np.isnan(q[0, 2]).any()
    other = cos.copy()
    other.view(np.uint32)[0, 1, pair[1]] = 0x7FC00001
    q0 = np.ones((1, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"\bcos\b does not hold each frequency's value twice"):
        fastpe.apply_rope_cached(q0, None, other, sin, style=style)
    assert (q0 == 1).all()


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
def test_cached_per_token_takes_a_zero_held_twice_with_either_sign(backend):
    """Per-token cos and sin are checked bit for bit in one compiled pass, then by value:
    a zero held as -0.0 and +0.0 is a value held twice."""
    freqs = fastpe.rope_frequencies(16)
    cos, sin = (a.astype(np.float32) for a in _hf_cos_sin(np.arange(4)[None], freqs))
    cos[0, 1, 0], cos[0, 1, 8] = -0.0, 0.0
    q = np.arange(4 * 2 * 16, dtype=np.float32).reshape(1, 4, 2, 16)
    rows = q.copy()
    with fastpe.use_backend(backend):
        fastpe.apply_rope_cached(q, None, cos, sin)
        fastpe.apply_rope_cached(rows, None, cos[0, :, :8], sin[0, :, :8], np.arange(4))
    assert_bytes_equal(q, rows, "per-token cos vs its rows looked up by position")


@needs_compiled
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_per_token_cos_sin_rotate_in_the_compiled_entry(style, rows, layout, strided,
                                                        monkeypatch):
    """transformers' per-token cos and sin (one row for the batch, or one per sequence;
    contiguous, or every other token of a longer array) are read in place by the compiled
    entry at its first call, not by the validating path: the bits of the same values
    looked up by position."""
    freqs = fastpe.rope_frequencies(32)
    positions = np.array([[7, 8, 9], [0, 1, 2]])[:rows]
    cos, sin = (a.astype(np.float32) for a in _hf_cos_sin(np.repeat(positions, 2, 1), freqs,
                                                           style))
    cos, sin = (a[:, ::2] if strided else np.ascontiguousarray(a[:, ::2]) for a in (cos, sin))
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 3, 2, 32)).astype(np.float32)
    if layout == "bhsd":
        q, k = q.transpose(0, 2, 1, 3).copy(), k.transpose(0, 2, 1, 3).copy()
    want_q, want_k = q.copy(), k.copy()
    halves = [(a[..., :16] if style == "neox" else a[..., ::2]).reshape(rows * 3, 16)
              for a in (cos, sin)]
    with fastpe.use_backend("cython"):
        fastpe.apply_rope_cached(want_q, want_k, *halves,
                                 np.arange(rows * 3).reshape(rows, 3), style=style,
                                 layout=layout)
    callers = entry_callers(monkeypatch, "rope_call")

    def validating_path(*args):
        raise AssertionError("the validating path converted the per-token rows")

    monkeypatch.setattr(fastpe._args, "token_cos_sin", validating_path)
    with fastpe.use_backend("cython"):
        fastpe.apply_rope_cached(q, k, cos, sin, style=style, layout=layout)
    assert callers == [("apply_rope_cached", 1)]
    assert_bytes_equal(q, want_q, "q")
    assert_bytes_equal(k, want_k, "k")


@needs_compiled
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=str)
def test_the_compiled_pass_finds_each_value_held_twice_bit_for_bit(dtype):
    """kernels.repeated_halves, which spares a decode call NumPy's comparisons: every row
    of 1 to 3 dims and any strides, halves (neox) or adjacent pairs (gptj); one bit off
    anywhere, or a zero of the other sign, is not held twice."""
    kern = fastpe._backend.compiled
    rng = np.random.default_rng(8)
    a = rng.standard_normal((3, 5, 8)).astype(dtype)
    forms = {True: np.concatenate([a, a], -1), False: np.repeat(a, 2, -1)}
    for neox, x in forms.items():
        for view in (x, x[1], x[1, 2], x[:, ::2], np.asfortranarray(x), x[::-1, ::-1]):
            assert kern.repeated_halves(view, neox) and not kern.repeated_halves(view, not neox)
        for where in ((0, 0, 0), (2, 4, 15), (1, 3, 9)):
            off = x.copy()
            bits = np.dtype(f"u{x.itemsize}")
            off.view(bits)[where] ^= bits.type(1)  # NumPy 1.24 takes no int with uint64
            assert not kern.repeated_halves(off, neox), where
        signed = x.copy()
        signed[0, 0, 0], signed[0, 0, 8 if neox else 1] = -0.0, 0.0
        assert not kern.repeated_halves(signed, neox)


@pytest.mark.parametrize("case, match", [
    ("halves-differ", r"\bcos\b does not hold each frequency's value twice"),
    ("gptj-of-neox-cos", r"\bcos\b does not hold each frequency's value twice"),
    ("with-positions", r"take no positions"),
    ("odd-width", r"\bcos\b lined up with the tokens must be"),
    # rows for other tokens than q's: a decode step's q of one token, or another batch
    ("more-tokens", r"cos and sin lined up with the tokens must have a row per token of q, "
                    r"\(1 or 1, 4\) rows .* got \(1, 10\)"),
    ("other-batch", r"cos and sin lined up with the tokens must have a row per token of q, "
                    r"\(1 or 1, 4\) rows .* got \(3, 4\)"),
])
@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
def test_cached_refuses_token_cos_sin_it_cannot_read(case, match, backend):
    freqs = fastpe.rope_frequencies(16)
    cos, sin = _hf_cos_sin(np.arange(10 if case == "more-tokens" else 4)[None], freqs)
    if case == "other-batch":
        cos, sin = np.repeat(cos, 3, 0), np.repeat(sin, 3, 0)
    kwargs = {}
    if case == "halves-differ":
        cos = cos.copy()
        cos[..., 0] += 0.5
    elif case == "gptj-of-neox-cos":
        kwargs["style"] = "gptj"
    elif case == "with-positions":
        kwargs["positions"] = np.arange(4)
    elif case == "odd-width":
        cos, sin = cos[..., :15], sin[..., :15]
    q = np.ones((1, 4, 1, 16))
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=match):
        fastpe.apply_rope_cached(q, None, cos, sin, **kwargs)
    assert (q == 1).all()


# ---- real-valued positions -----------------------------------------------------------------


def _rotate_formula(x, angles, neox=True):
    """x (..., d) rotated by angles (..., d // 2) in float64, from the definition."""
    half = angles.shape[-1]
    if neox:
        a, b = x[..., :half], x[..., half:2 * half]
    else:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    c, s = np.cos(angles), np.sin(angles)
    out = x.copy()
    ra, rb = a * c - b * s, b * c + a * s
    if neox:
        out[..., :half], out[..., half:2 * half] = ra, rb
    else:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = ra, rb
    return out


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_real_valued_positions_rotate_by_position_times_frequency(backend, style):
    """Patch centres in [-1, 1] (negative positions are fine when real-valued)."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    rng = np.random.default_rng(11)
    pos = rng.uniform(-1, 1, (2, 7))
    freqs = fastpe.rope_frequencies(16, base=100.0)
    q = rng.standard_normal((2, 7, 3, 16))
    original = q.copy()
    want = _rotate_formula(q.transpose(0, 2, 1, 3), pos[:, None, :, None] * freqs.inv_freq,
                           style == "neox").transpose(0, 2, 1, 3)
    with fastpe.use_backend(backend):
        fastpe.apply_rope(q, None, pos, freqs=freqs, style=style)
    np.testing.assert_allclose(q, want, rtol=0, atol=1e-13)
    with fastpe.use_backend(backend):
        fastpe.apply_rope(q, None, pos, freqs=freqs, style=style, inverse=True)
    np.testing.assert_allclose(q, original, rtol=0, atol=1e-13)


def test_real_valued_multi_axis_positions():
    """Two axes (row, column) of real coordinates: each pair takes its axis's position."""
    rope = fastpe.RotaryEmbedding(16, base=100.0, mrope_section=[4, 4])
    rng = np.random.default_rng(12)
    pos = rng.uniform(-1, 1, (2, 9))
    q = rng.standard_normal((9, 2, 16))
    inv = rope.frequencies().inv_freq
    axis = np.repeat([0, 1], 4)
    want = _rotate_formula(q.transpose(1, 0, 2), (pos[axis].T * inv)[None])
    rope(q, None, pos, layout="shd")
    np.testing.assert_allclose(q.transpose(1, 0, 2), want, rtol=0, atol=1e-13)


def test_integer_valued_floats_agree_with_integer_positions():
    q = np.random.default_rng(13).standard_normal((1, 50, 2, 32)).astype(np.float32)
    a, b = q.copy(), q.copy()
    fastpe.apply_rope(a, positions=np.arange(1000, 1050))
    fastpe.apply_rope(b, positions=np.arange(1000, 1050, dtype=np.float64))
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)


@pytest.mark.parametrize("bad, match", [
    (np.array([0.5, np.nan, 1.0]), r"finite"),
    (np.array([0.5, 2.0**33, 1.0]), r"below 2\*\*32"),
])
def test_real_valued_positions_must_be_finite_and_in_range(bad, match):
    q = np.ones((1, 3, 1, 8))
    with pytest.raises(ValueError, match=match):
        fastpe.apply_rope(q, positions=bad)
    assert (q == 1).all()


def test_real_valued_positions_refused_where_frequencies_follow_the_length():
    q = np.ones((1, 3, 1, 8))
    with pytest.raises(ValueError, match=r"rope type 'dynamic'.*integer positions"):
        fastpe.apply_rope(q, positions=np.array([0.5, 1.5, 2.5]),
                          scaling={"rope_type": "dynamic", "factor": 2.0},
                          max_position_embeddings=2)
    assert (q == 1).all()


def test_real_valued_positions_that_read_both_as_axes_and_batch_are_refused():
    """(2, seq) with two axes and a batch of 2: per-axis or per-sequence? Refused, as for
    integer positions, never guessed."""
    rope = fastpe.RotaryEmbedding(16, mrope_section=[4, 4])
    q = np.ones((2, 5, 1, 16))
    for pos in (np.zeros((2, 5)), np.zeros((2, 5), np.int64)):
        with pytest.raises(ValueError, match=r"read both as \(axes, seq\)"):
            rope(q, None, pos)
    assert (q == 1).all()


@pytest.mark.parametrize("dtype", [np.float16] + ([BF16] if BF16 is not None else []))
@pytest.mark.parametrize("head_dim", [128, 64, 40, 36])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_half_rows_round_once_whatever_their_stride(dtype, head_dim, style, bf16_narrowing):
    """float16 and bfloat16 rows of unit stride are widened, rotated and narrowed in
    registers, strided ones through a float32 buffer: the same bits for every bit
    pattern (NaN payloads, infinities, subnormals), at small and at large positions,
    on whole vectors and on the features past them."""
    rng = np.random.default_rng(head_dim)
    for pos in (np.arange(5), np.arange(10**6, 10**6 + 5)):
        x = rng.integers(0, 2**16, (3, 5, 2, head_dim), dtype=np.uint16).view(dtype)
        plain = x.copy()
        wide = np.zeros(x.shape[:-1] + (2 * head_dim,), dtype)
        strided = wide[..., ::2]
        strided[...] = x
        paired_q, paired_k = x.copy(), x[:, :, :1].copy()  # every head of a token at once
        fastpe.apply_rope(plain, None, pos, style=style)
        fastpe.apply_rope(strided, None, pos, style=style)
        fastpe.apply_rope(paired_q, paired_k, pos, style=style)
        np.testing.assert_array_equal(plain.view(np.uint16),
                                      np.ascontiguousarray(strided).view(np.uint16))
        np.testing.assert_array_equal(paired_q.view(np.uint16), plain.view(np.uint16))
        np.testing.assert_array_equal(paired_k.view(np.uint16), plain[:, :, :1].view(np.uint16))
        assert not wide[..., 1::2].view(np.uint16).any()  # between the strided features
        values = rng.standard_normal((3, 5, 2, head_dim)).astype(dtype)
        ref = values.astype(np.float64)
        fastpe.apply_rope(values, None, pos, style=style)
        fastpe.reference.apply_rope(ref, None, pos, style=style)
        np.testing.assert_allclose(values.astype(np.float64), ref, rtol=0,
                                   atol=2e-2 if is_bf16(dtype) else 4e-3)


@contextlib.contextmanager
def rope_walks(limit, lines):
    """The compiled kernels' RoPE walks set for a block (rope_cached_bytes: the largest
    call taken as in the caches; rotate_half_lines: streamed rotate_half rows walked as
    rows in the caches are), the import-time choices restored after it; nothing without
    them."""
    kern = fastpe._backend.compiled
    if kern is None:
        yield
        return
    was = kern.rope_cached_bytes(), kern.rotate_half_lines()
    kern.rope_cached_bytes(limit)
    kern.rotate_half_lines(lines)
    try:
        yield
    finally:
        kern.rope_cached_bytes(was[0])
        kern.rotate_half_lines(was[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float16] + ([BF16] if BF16 is not None else []))
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_calls_in_and_past_the_caches_give_the_same_bits(dtype, style):
    """On AMD CPUs a call whose q and k hold more than 4 MiB takes its rows as streamed
    from memory (256-bit float32 steps, from a line boundary for rotate_half rows on Zen 3
    and 4; a call per bfloat16 row, but for rotate_half rows there), a smaller one as in
    the caches; on Intel CPUs every call as in the caches: the same bits either way, token
    block by token block, with the limit at 4 MiB and at either end, and streamed rows
    walked either way."""
    rng = np.random.default_rng(7)
    q0 = rng.standard_normal((1, 600, 16, 128)).astype(dtype)
    k0 = rng.standard_normal((1, 600, 16, 128)).astype(dtype)
    assert q0.nbytes + k0.nbytes > 4 << 20
    pos = np.arange(600) * 37
    runs = []
    for limit, lines in [(4 << 20, False), (4 << 20, True), (0, False), (0, True),
                         (sys.maxsize, False)]:
        with rope_walks(limit, lines):
            q, k = q0.copy(), k0.copy()
            whole_q, whole_k = q0.copy(), k0.copy()
            fastpe.apply_rope(whole_q, whole_k, pos, style=style)
            for t in range(0, 600, 50):
                fastpe.apply_rope(q[:, t:t + 50], k[:, t:t + 50], pos[t:t + 50], style=style)
        ctx = f"limit {limit}, streamed rotate_half rows walked as in the caches {lines}"
        assert_bytes_equal(whole_q, q, f"q: one call vs blocks, {ctx}")
        assert_bytes_equal(whole_k, k, f"k: one call vs blocks, {ctx}")
        runs.append(whole_q)
    for other in runs[1:]:
        assert_bytes_equal(runs[0], other, "q: in the caches vs streamed")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("shape", [(32, 1, 8, 128), (1, 70, 4, 64), (3, 5, 2, 96)], ids=str)
def test_q_alone_gets_the_bits_of_q_beside_k(shape, style, dtype):
    """q rotated alone (k None: a model rotating q and k in calls of their own) gets the
    bits it gets beside k, and k likewise, whatever their offsets from a cache line (one
    walk for both, or each its own where they differ), positions per sequence or shared,
    in the caches or streamed, rotate_half rows either walk."""
    rng = np.random.default_rng(31)
    size = int(np.prod(shape))
    pos = rng.integers(0, 50000, shape[:2])
    for limit, lines in [(sys.maxsize, False), (0, False), (0, True)]:
        with rope_walks(limit, lines):
            for q_at, k_at in [(0, 0), (4, 4), (0, 12), (3, 1)]:
                qb = np.zeros(size + 16, dtype)
                kb = np.zeros(size + 16, dtype)
                q = qb[q_at:q_at + size].reshape(shape)
                k = kb[k_at:k_at + size].reshape(shape)
                q[...] = rng.standard_normal(shape).astype(dtype)
                k[...] = rng.standard_normal(shape).astype(dtype)
                alone, k_alone = q.copy(), k.copy()
                fastpe.apply_rope(alone, None, pos, style=style)
                fastpe.apply_rope(k_alone, None, pos, style=style)
                fastpe.apply_rope(q, k, pos, style=style)
                ctx = f"{shape} q at +{q_at}, k at +{k_at}, limit {limit}, lines {lines}"
                assert_bytes_equal(alone, q, ctx)
                assert_bytes_equal(k_alone, k, ctx + ": k")
                shared = q.copy()
                fastpe.apply_rope(shared, None, offset=9, style=style)
                fastpe.apply_rope(q, k, offset=9, style=style)
                assert_bytes_equal(shared, q, ctx + ", positions from offset")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("style", STYLES)
def test_heads_one_after_another_give_the_bits_of_tokens_one_after_another(dtype, style):
    """(batch, heads, seq, dim) arrays are rotated several heads a token at a time over
    units of up to 256 tokens (their cos and sin rows seeded every 32 tokens), the
    (batch, seq, heads, dim) ones a token's heads at a time over units of 32: the same
    bits, on one thread and two, with positions that run on, jump and repeat, and
    M-RoPE's three axes."""
    if is_bf16(dtype):
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(17)
    batch, seq, hq, hk, dim = 2, 1100, 12, 4, 64
    q = rng.uniform(-2, 2, (batch, seq, hq, dim)).astype(dtype)
    k = rng.uniform(-2, 2, (batch, seq, hk, dim)).astype(dtype)
    runs = np.arange(seq) + 5
    jumps = np.where(np.arange(seq) % 300 < 150, runs, runs * 7 % 5000)
    mrope = fastpe.RotaryEmbedding(dim, mrope_section=[8, 12, 12], axes=3, style=style)
    grid = np.stack([np.arange(seq) // 40, np.arange(seq) % 40, np.arange(seq) // 3])
    calls = [(fastpe.apply_rope, runs), (fastpe.apply_rope, np.stack([jumps, runs])),
             (mrope, grid)]
    for threads in (1, 2):
        for rotate, pos in calls:
            a, b = q.copy(), k.copy()
            c = np.ascontiguousarray(q.transpose(0, 2, 1, 3))
            d = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
            kw = {} if rotate is mrope else {"style": style}
            rotate(a, b, pos, num_threads=threads, **kw)
            rotate(c, d, pos, layout="bhsd", num_threads=threads, **kw)
            assert not np.array_equal(as_f64(a), as_f64(q)), "nothing was rotated"
            assert_bytes_equal(c.transpose(0, 2, 1, 3), a, context=f"q, {threads} threads")
            assert_bytes_equal(d.transpose(0, 2, 1, 3), b, context=f"k, {threads} threads")


@pytest.mark.skipif(not ON_CYTHON or fastpe.info().get("isa") != "avx512",
                    reason="the step width of float32 RoPE rows is the avx512 variant's "
                           "choice")
@pytest.mark.parametrize("style", STYLES)
def test_float32_rows_give_the_same_bits_at_either_step_width(style):
    """The avx512 variant takes float32 RoPE rows 512 bits at a time on Intel CPUs, and
    elsewhere in calls small enough to be in the caches (fastpe_math.h: 512-bit steps
    streamed rows from memory slower on an AMD Zen 5): both widths, on any CPU, give the
    same bits, and those match fastpe.reference. Rows of 20, 32, 64, 68 and 134 pairs:
    whole 512-bit steps only, and 512-bit steps followed by 256-bit steps and single
    pairs; q and k token by token (every head of a token in one call), head by head
    (bhsd), a q alone, and rows of a stride (gathered)."""
    from fastpe import _backend

    kern = _backend.compiled
    was = kern.rope_cached_bytes()
    runs = {}
    try:
        for limit in (sys.maxsize, 0):
            assert kern.rope_cached_bytes(limit) == limit
            out = []
            for hd in (40, 64, 128, 136, 268):
                rng = np.random.default_rng(hd)   # the same arrays for both widths
                q = rng.uniform(-2, 2, (2, 37, 3, hd)).astype(F32)
                k = rng.uniform(-2, 2, (2, 37, 1, hd)).astype(F32)
                wide = rng.uniform(-2, 2, (2, 3, 37, 2 * hd)).astype(F32)
                pos = rng.integers(0, 2**20, (2, 37))
                calls = [(q, k, {}), (q[:, :, :2].copy(), None, {}),
                         (np.ascontiguousarray(q.transpose(0, 2, 1, 3)),
                          np.ascontiguousarray(k.transpose(0, 2, 1, 3)), {"layout": "bhsd"}),
                         (wide[..., ::2], None, {"layout": "bhsd"})]
                for x, y, kw in calls:
                    x0 = x.copy()
                    y0 = None if y is None else y.copy()
                    fastpe.apply_rope(x, y, pos, style=style, **kw)
                    rx, ry = reference.apply_rope(x0, y0, pos, style=style, **kw)
                    assert_close(x, rx, F32, max_position=2**20, context=f"q, head_dim {hd}")
                    out.append(x.copy())
                    if y is not None:
                        assert_close(y, ry, F32, max_position=2**20,
                                     context=f"k, head_dim {hd}")
                        out.append(y.copy())
            runs[limit] = out
    finally:
        kern.rope_cached_bytes(was)
    for wide, narrow in zip(runs[sys.maxsize], runs[0], strict=True):
        assert_bytes_equal(wide, narrow, "512-bit vs 256-bit steps")


@pytest.mark.skipif(BF16 is None, reason="needs ml_dtypes")
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16, np.float64])
def test_bfloat16_rows_keep_the_nans_of_a_cos_sin_cache(style, cache_dtype, bf16_narrowing):
    """A caller's cos and sin cache may hold NaNs whose payload reaches below the 16 bits a
    bfloat16 keeps (quiet or signalling; float32, float16 widened, float64 narrowed): the
    rotated feature is that NaN, quieted, in its top 16 bits, as one bfloat16 rounding of
    the float32 result gives it, never a zero or a neighbouring NaN, on whole vectors
    and on the features past them, beside zeros or not."""
    rng = np.random.default_rng(3)
    half = 40
    nans32 = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F81CED2, 0xFF800001, 0x7FC0FFFF, 0x7F80FFFF],
                      np.uint32)
    cos = rng.uniform(-1, 1, (4, half)).astype(np.float32)
    sin = rng.uniform(-1, 1, (4, half)).astype(np.float32)
    cos.view(np.uint32)[1, :6] = nans32
    sin.view(np.uint32)[2, 17:23] = nans32
    cos.view(np.uint32)[3, 34:40] = nans32
    cos[3, :8] = 0.0           # zeros beside the NaNs: a vector narrowed again in integers
    if cache_dtype is np.float16:
        with np.errstate(invalid="ignore"):
            cos16 = cos.astype(np.float16)
        cos16.view(np.uint16)[1, :3] = [0x7C01, 0xFE55, 0x7D00]
        with np.errstate(invalid="ignore"):
            cos_c, sin_c = cos16, sin.astype(np.float16)
    elif cache_dtype is np.float64:
        with np.errstate(invalid="ignore"):
            cos_c, sin_c = cos.astype(np.float64), sin.astype(np.float64)
        cos_c.view(np.uint64)[1, :2] = [0x7FF0000000000001, 0x7FF123456789ABCD]
    else:
        cos_c, sin_c = cos, sin
    q = rng.standard_normal((2, 4, 3, 2 * half)).astype(BF16)
    q[:, 1, :, 6:8] = 0.0      # zero results in the vectors of NaN ones
    q[:, 1, :, half + 6:half + 8] = 0.0
    q0 = q.copy()
    fastpe.apply_rope_cached(q, None, cos_c, sin_c, np.arange(4), style=style)
    wide = np.zeros(q0.shape[:-1] + (4 * half,), BF16)
    strided = wide[..., ::2]
    strided[...] = q0
    fastpe.apply_rope_cached(strided, None, cos_c, sin_c, np.arange(4), style=style)
    # the strided rows round each feature alone in C (fpe_bf16_make)
    assert_bytes_equal(q, np.ascontiguousarray(strided), "unit-stride vs strided rows")
    got = q.view(np.uint16)
    nan = np.isnan(as_f64(q))
    assert nan.any()
    assert ((got[nan] & 0x7FC0) == 0x7FC0).all(), "a NaN result lost its quiet bit"
    with fastpe.use_backend("numpy"), np.errstate(invalid="ignore"):
        ref = q0.copy()
        fastpe.apply_rope_cached(ref, None, cos_c, sin_c, np.arange(4), style=style)
    assert (np.isnan(as_f64(ref)) == nan).all(), "NaN where the NumPy backend has none"


KERNELS = fastpe._backend.compiled if ON_CYTHON else None
HARDWARE_BF16 = (KERNELS is not None and BF16 is not None
                 and getattr(KERNELS, "bf16_hardware_narrowing", lambda: False)())


@pytest.mark.skipif(not HARDWARE_BF16,
                    reason="bfloat16 narrowing by VCVTNE2PS2BF16 needs a wide variant on "
                           "a CPU with AVX512_BF16")
@pytest.mark.parametrize("style", STYLES)
def test_bfloat16_rows_give_the_same_bits_narrowed_by_hardware(style):
    """Where the CPU has AVX512_BF16, bfloat16 RoPE rows are narrowed by VCVTNE2PS2BF16,
    which reads subnormal float32 results as zero: every bit pattern, results about the
    smallest normal (subnormal ones among them) and signed zeros give the bits of the
    integer rounding (the same calls with it turned off, and strided rows, which take a
    float32 buffer), in the three ways rows reach the loop: every head of a token at once
    in the caches (batched decode), a call per row (more than 4 MiB), a row at a time."""
    rng = np.random.default_rng(11)
    tiny = np.float32(2.0**-126)
    patterns = rng.integers(0, 2**16, (4, 3, 4, 128), dtype=np.uint16).view(BF16)
    near_subnormal = (rng.uniform(-4, 4, (4, 3, 4, 128)) * tiny).astype(BF16)
    zeros = np.where(rng.random((4, 3, 4, 128)) < 0.5, 0.0, -0.0).astype(BF16)
    zeros[..., 5] = (3 * tiny)   # one nonzero element beside the zeros
    large = rng.standard_normal((1, 600, 16, 128)).astype(BF16)
    large[0, ::7, :, 3] = (rng.uniform(-4, 4, (86, 16)) * tiny).astype(BF16)
    cases = [(patterns, None, np.arange(3) * 997), (near_subnormal, None, np.arange(1, 4)),
             (zeros, None, np.arange(3)), (patterns[:, :, :2], patterns[:, :, 2:3], np.arange(3)),
             (large, large[:, :, :4], np.arange(600) * 37)]
    was = KERNELS.bf16_hardware_narrowing()
    try:
        for x, y, pos in cases:
            results = []
            for hardware in (True, False):
                assert KERNELS.bf16_hardware_narrowing(hardware) is hardware
                qx = x.copy()
                ky = None if y is None else y.copy()
                fastpe.apply_rope(qx, ky, pos, style=style)
                rows = x.reshape(-1, 128)[:64].copy()
                for r in range(len(rows)):   # one row at a time
                    fastpe.apply_rope(rows[r:r + 1][None, :, None], None,
                                      pos[(r // x.shape[2]) % x.shape[1]:][:1], style=style)
                results.append((qx, ky, rows))
            wide = np.zeros(x.shape[:-1] + (256,), BF16)
            strided = wide[..., ::2]
            strided[...] = x
            fastpe.apply_rope(strided, None, pos, style=style)
            (hq, hk, hrows), (sq, sk, srows) = results
            assert_bytes_equal(hq, sq, "q: hardware vs integer narrowing")
            assert_bytes_equal(hq, np.ascontiguousarray(strided), "q: vs strided rows")
            if y is not None:
                assert_bytes_equal(hk, sk, "k: hardware vs integer narrowing")
            assert_bytes_equal(hrows, srows, "row by row: hardware vs integer narrowing")
            assert_bytes_equal(hrows, hq.reshape(-1, 128)[:64], "row by row vs whole")
    finally:
        KERNELS.bf16_hardware_narrowing(was)


def at_line_offset(shape, offset, rng):
    """A float32 array of `shape` starting `offset` floats past a 64-byte boundary."""
    n = int(np.prod(shape))
    buf = np.empty(n + 32, F32)
    start = (-buf.ctypes.data // 4) % 16 + offset
    out = buf[start:start + n].reshape(shape)
    out[...] = rng.uniform(-2, 2, shape)
    assert out.ctypes.data % 64 == 4 * offset
    return out


@pytest.mark.skipif(not ON_CYTHON, reason="compiled kernels only")
@pytest.mark.parametrize("style", STYLES)
def test_float32_rows_at_every_offset_from_a_cache_line(style):
    """The wide kernels take rows at any offset from a cache line as whole lines (single
    pairs and narrower steps up to the first boundary and after the last): q and k at
    each of the 16 float offsets, the same or different, heads a whole number of lines
    apart or not, rows of 1, 3, 20, 32, 64, 68 and 134 pairs. 512-bit steps (the avx512
    variant's, in a call it takes as in the caches) give the same bits as 256-bit ones,
    and those match fastpe.reference."""
    from fastpe import _backend

    kern = _backend.compiled
    was = kern.rope_cached_bytes()
    try:
        for hd in (2, 6, 40, 64, 128, 136, 268):
            for oq, ok in [(o, o) for o in range(16)] + [(3, 12), (12, 0), (0, 7)]:
                rng = np.random.default_rng(hd * 100 + oq * 16 + ok)
                q = at_line_offset((2, 3, 4, hd), oq, rng)
                k = at_line_offset((2, 3, 2, hd), ok, rng)
                pos = rng.integers(0, 2**20, (2, 3))
                q0, k0 = q.copy(), k.copy()
                kern.rope_cached_bytes(sys.maxsize)
                fastpe.apply_rope(q, k, pos, style=style)
                qn, kn = at_line_offset(q.shape, oq, rng), at_line_offset(k.shape, ok, rng)
                qn[...], kn[...] = q0, k0
                kern.rope_cached_bytes(0)
                fastpe.apply_rope(qn, kn, pos, style=style)
                context = f"head_dim {hd}, offsets {oq}, {ok}"
                assert_bytes_equal(q, qn, f"q: 512-bit vs 256-bit steps, {context}")
                assert_bytes_equal(k, kn, f"k: 512-bit vs 256-bit steps, {context}")
                rq, rk = reference.apply_rope(q0, k0, pos, style=style)
                assert_close(q, rq, F32, max_position=2**20, context=f"q, {context}")
                assert_close(k, rk, F32, max_position=2**20, context=f"k, {context}")
    finally:
        kern.rope_cached_bytes(was)


@pytest.mark.skipif(not ON_CYTHON, reason="compiled kernels only")
def test_rope_row_step_width_follows_the_cpu_vendor():
    """Chosen at import: 512-bit float32 RoPE steps for every call on Intel, for calls of
    q and k up to 4 MiB elsewhere."""
    from conftest import cpu_vendor_id

    code = ("from fastpe import _backend; k = _backend.compiled; "
            "print(k.cpu_vendor() or '-', k.rope_cached_bytes())")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    vendor, limit = proc.stdout.split()
    assert int(limit) == (sys.maxsize if vendor == "GenuineIntel" else 4 << 20)
    if cpu_vendor_id() is not None:
        assert vendor == cpu_vendor_id()


@pytest.mark.parametrize("name, value", [("rotary_dim", 32), ("base", 100.0),
                                         ("scaling", {"rope_type": "linear", "factor": 2.0}),
                                         ("max_position_embeddings", 64),
                                         ("mrope_section", [8, 12, 12]),
                                         ("mrope_interleaved", True)])
def test_an_embeddings_frequency_settings_are_fixed_once_made(name, value):
    """What its frequencies were parsed from cannot be changed after the fact (the new
    value was kept and never used: the same rotation as before); settings a call reads
    (style, reverse) can."""
    rope = fastpe.RotaryEmbedding(64)
    with pytest.raises(AttributeError, match=rf"RotaryEmbedding\.{name} is fixed"):
        setattr(rope, name, value)
    q = np.random.default_rng(0).standard_normal((1, 4, 2, 64)).astype(np.float32)
    got = rope(q.copy(), None, np.arange(4))[0]
    want = fastpe.apply_rope(q.copy(), None, np.arange(4))[0]
    assert_bytes_equal(got, want, f"{name} unchanged")
    rope.style = "gptj"
    assert_bytes_equal(rope(q.copy(), None, np.arange(4))[0],
                       fastpe.apply_rope(q.copy(), None, np.arange(4), style="gptj")[0],
                       "style set after construction")


@pytest.mark.skipif(not ON_CYTHON, reason="the compiled backend's copies")
@pytest.mark.parametrize("kind", ["byteswapped", "unaligned"])
def test_a_cache_the_kernels_cannot_address_is_copied_only_where_read(kind, monkeypatch):
    """A cos/sin cache of another byte order or unaligned is copied for the kernels: only
    the rows the positions read (a decode call copied all 4096 rows), the positions
    shifted to them; the same bits as the native cache's, inverse too."""
    cos, sin = fastpe.rope_cos_sin(np.arange(4096), fastpe.rope_frequencies(32))
    odd = unaddressable(cos, kind)
    copied = kernel_copies(monkeypatch)
    rng = np.random.default_rng(4)
    calls = [(None, 4000, (1, 1), [4000]), (np.array([[9, 3000, 5]]), 0, (1, 3), [9, 3000, 5]),
             (np.array([[7, 7], [2, 8]]), 0, (2, 2), [7, 8, 2])]
    for positions, offset, (batch, seq), rows in calls:
        q = rng.standard_normal((batch, seq, 2, 32)).astype(np.float32)
        for inverse in (False, True):
            want = fastpe.apply_rope_cached(q.copy(), None, cos, sin, positions,
                                            offset=offset, inverse=inverse)[0]
            copied.clear()
            got = fastpe.apply_rope_cached(q.copy(), None, odd, sin, positions, offset=offset,
                                           inverse=inverse)[0]
            assert_bytes_equal(got, want, f"{positions} {offset}")
            assert copied and max(copied) == max(rows) - min(rows) + 1, copied
