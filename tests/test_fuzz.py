"""Property tests (hypothesis): every kernel family, compiled against the NumPy reference.

Each test draws shapes (sizes 0 and 1 included), memory layouts (axis permutations,
slices with steps, negative steps, padding, unaligned buffers, rows an odd number of
bytes apart, byte-swapped dtypes), dtypes, positions in every form and integer dtype,
options (styles, layouts, rotary_dim, scalings, masks) and thread counts, then checks:

- the compiled result equals ``fastpe.use_backend("numpy")`` on the same arguments,
  within conftest's per-dtype tolerance (bit-identical where both round once);
- the compiled result is bit-identical for every thread count and, for RoPE and ALiBi,
  on the C fast path and on the general path (the fast path forced off);
- nothing outside the view is written (the view's base is checked byte by byte);
- a call that one backend rejects is rejected by the other with the same exception and
  message, and writes nothing.

Profiles (registered in conftest.py): "default" runs a few dozen examples per test,
derandomized, so the default suite stays fast and deterministic; "fuzz" runs 1,500 per
test (over 10,000 in all), from a fresh random seed each run:

    HYPOTHESIS_PROFILE=fuzz pytest tests/test_fuzz.py
    pytest tests/test_fuzz.py --hypothesis-profile=fuzz --hypothesis-show-statistics
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import (
    COMPILED,
    FLOAT_DTYPES,
    angle_atol,
    as_f64,
    assert_bytes_equal,
    assert_close,
    is_bf16,
    snapshot,
    tolerance,
)
from hypothesis import event, given, note
from hypothesis import strategies as st

import fastpe
from fastpe import _threads

pytestmark = pytest.mark.skipif(not COMPILED, reason="compiled vs reference needs the extension")

INT_DTYPES = [np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                    np.uint32, np.int64, np.uint64)]
SENTINEL = 7.0


# ---- machinery --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _compiled_backend():
    """The calls under test run on the compiled backend, whatever FASTPE_BACKEND says; the
    reference ones say use_backend("numpy") themselves."""
    with fastpe.use_backend("cython"):
        yield


@contextlib.contextmanager
def serial_bytes(n: int):
    """fastpe._threads.SERIAL_BYTES = n for a block: 0 makes small calls really use the
    threads they are given (a fixture can't do this per hypothesis example)."""
    old = _threads.SERIAL_BYTES
    _threads.SERIAL_BYTES = n
    try:
        yield
    finally:
        _threads.SERIAL_BYTES = old


@contextlib.contextmanager
def fast_path(name: str, enabled: bool, log: list | None = None):
    """Leave the compiled C fast path `name` ("rope_call", "alibi_call", "learned_call",
    "sinusoidal_call") as it is, or make it decline every call (False: the general path
    runs). `log` records, per call, "fast" or "declined"."""
    kern = fastpe._backend.compiled
    real = getattr(kern, name)

    def spy(*args):
        # the general path's own call through the same entry (fastpe.learned._run) is the
        # general path: never declined, never logged
        if sys._getframe(1).f_code.co_name == "_run":
            return real(*args)
        done = real(*args) if enabled else False
        if log is not None and done in (0, 1):  # rope_call's larger value asks for a team
            log.append("fast" if done else "declined")
        return done

    setattr(kern, name, spy)
    try:
        yield
    finally:
        setattr(kern, name, real)


def outcome(fn):
    """(result, None) or (None, exception)."""
    try:
        return fn(), None
    except (TypeError, ValueError, IndexError) as exc:
        return None, exc


def assert_same_error(exc_c, exc_r, context):
    assert (exc_c is None) == (exc_r is None), (
        f"{context}: compiled {exc_c!r} but reference {exc_r!r}")
    if exc_c is not None:
        assert type(exc_c) is type(exc_r) and str(exc_c) == str(exc_r), (
            f"{context}: compiled {exc_c!r} vs reference {exc_r!r}")
        event(f"rejected: {type(exc_c).__name__}")


# ---- memory layouts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a logical array sits in memory: axis order `perm` (outermost first), a slice
    of step `steps[a]` (negative: reversed) starting `lead[a]` elements in on each axis,
    a buffer starting one byte off (unaligned), rows `odd` bytes further apart than
    packed (strides not a multiple of the item size), byte-swapped storage."""
    perm: tuple[int, ...]
    steps: tuple[int, ...]
    lead: tuple[int, ...]
    unaligned: bool = False
    odd: bool = False
    swap: bool = False


@st.composite
def layouts(draw, nd: int) -> Layout:
    perm = tuple(draw(st.permutations(range(nd)))) if nd else ()
    steps = tuple(draw(st.sampled_from([1, 1, 1, 2, -1, -2, 3])) for _ in range(nd))
    lead = tuple(draw(st.integers(0, 1)) for _ in range(nd))
    if draw(st.integers(0, 3)):   # 3 in 4 keep plain storage (the fast paths take those)
        return Layout(perm, steps, lead)
    return Layout(perm, steps, lead, unaligned=draw(st.booleans()), odd=draw(st.booleans()),
                  swap=draw(st.booleans()))


@dataclass
class Placed:
    """A view, the buffer it lives in, and which elements of that buffer it covers."""
    view: np.ndarray
    base: np.ndarray
    inside: np.ndarray   # bool, base's shape

    def untouched_outside(self, before: np.ndarray, context: str) -> None:
        out = ~self.inside
        a = self.base.view(np.uint8).reshape(self.base.shape + (-1,)) if self.base.size else None
        if a is None:
            return
        b = before.view(np.uint8).reshape(before.shape + (-1,))
        assert np.array_equal(a[out], b[out]), f"{context}: wrote outside the view"


def place(values: np.ndarray, layout: Layout) -> Placed:
    """`values` (native dtype) laid out as `layout`; the rest of the buffer holds SENTINEL."""
    shape = values.shape
    nd = len(shape)
    dtype = values.dtype
    if layout.swap and not is_bf16(dtype) and dtype.itemsize > 1:
        dtype = dtype.newbyteorder()
    ext = [layout.lead[a] + (max(n, 1) - 1) * abs(layout.steps[a]) + 2
           for a, n in enumerate(shape)]
    mem_shape = tuple(ext[a] for a in layout.perm)
    item = dtype.itemsize
    strides = [item] * nd
    for i in range(nd - 2, -1, -1):
        strides[i] = strides[i + 1] * mem_shape[i + 1]
    if layout.odd and nd >= 2 and item > 1:
        strides[0] += 1                     # rows one byte further apart
    offset = 1 if layout.unaligned and item > 1 else 0
    extent = sum((n - 1) * s for n, s in zip(mem_shape, strides)) + item
    buf = np.zeros(offset + extent + 8, np.uint8)
    base = np.ndarray(mem_shape, dtype, buffer=buf, offset=offset, strides=tuple(strides))
    base[...] = SENTINEL
    inv = tuple(int(i) for i in np.argsort(layout.perm))
    inside = np.zeros(mem_shape, bool)
    index = []
    for a, n in enumerate(shape):
        step, lo = abs(layout.steps[a]), layout.lead[a]
        sl = slice(lo, lo + (n - 1) * step + 1, step) if n else slice(lo, lo)
        index.append(sl)
    index = tuple(index)
    view = base.transpose(inv)[index]
    mask = inside.transpose(inv)[index]
    flip = tuple(slice(None, None, -1) if s < 0 else slice(None) for s in layout.steps)
    view, mask = view[flip], mask[flip]
    view[...] = values
    mask[...] = True
    assert view.shape == shape and view.flags.writeable
    return Placed(view, base, inside)


def values_of(shape, dtype, seed, low=-2.0, high=2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, shape).astype(dtype)


dtypes = st.sampled_from(FLOAT_DTYPES)
seeds = st.integers(0, 2**32 - 1)
# sinusoidal and rotary positions are refused from 2**32 on (float64 angles)
ANGLE_LIMIT = 2**32
threads = st.sampled_from([None, 1, 2, 3, 8])


# ---- positions --------------------------------------------------------------------------


@st.composite
def position_values(draw, shape, *, high: int | None = None):
    """int64 positions of `shape`: small, consecutive runs (the angle recurrence and its
    reseeds), repeats, descending, or large (past 2**31) when `high` allows."""
    rng = np.random.default_rng(draw(seeds))
    n = int(np.prod(shape))
    limit = high if high is not None else 2**40
    kind = draw(st.sampled_from(["small", "run", "run", "descending", "large"]))
    if kind == "small" or limit <= 64:
        v = rng.integers(0, min(limit, 64), n)
    elif kind == "run":
        start = int(rng.integers(0, max(limit - n, 1)))
        v = start + np.arange(n)
        if n > 3:
            v[n // 2] = v[n // 2 - 1]       # a repeat mid-block
    elif kind == "descending":
        v = np.arange(n)[::-1] // 2 + int(rng.integers(0, max(limit - n, 1)))
    else:
        lo = min(2**31 - 5, limit - 1) if limit > 2**31 else 0
        v = rng.integers(lo, limit, n)
    v = np.minimum(v, limit - 1)
    return v.reshape(shape).astype(np.int64)


def as_int_dtype(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """v in `dtype` when it holds every value, else int64."""
    if v.size and (v.max() > np.iinfo(dtype).max):
        dtype = np.dtype(np.int64)
    return v.astype(dtype)


@st.composite
def positions_arg(draw, batch: int, seq: int, *, high: int | None = None,
                  forms=("none", "offset", "shared", "per-row", "one-row", "list")):
    """(positions argument, offset argument, (batch, seq) int64 positions they mean)."""
    form = draw(st.sampled_from(forms))
    event(f"positions: {form}")
    if form in ("none", "offset"):
        limit = high if high is not None else 2**40
        off = 0 if form == "none" else draw(st.integers(0, max(limit - seq, 0)))
        full = np.broadcast_to(off + np.arange(seq, dtype=np.int64), (batch, seq))
        return None, off, full
    rows = {"shared": None, "list": None, "per-row": batch, "one-row": 1}[form]
    shape = (seq,) if rows is None else (rows, seq)
    v = draw(position_values(shape, high=high))
    full = np.broadcast_to(v, (batch, seq))
    if form == "list":
        return v.tolist(), 0, full
    p = as_int_dtype(v, draw(st.sampled_from(INT_DTYPES)))
    style = draw(st.sampled_from(["contiguous", "contiguous", "strided", "read-only"]))
    if style == "strided":
        big = np.zeros(p.shape[:-1] + (2 * seq + 1,), p.dtype)
        big[..., 1::2] = p
        p = big[..., 1::2]
    elif style == "read-only":
        p.flags.writeable = False
    return p, 0, full


# ---- sinusoidal ---------------------------------------------------------------------------


@given(length=st.integers(0, 70), dim=st.integers(1, 21), dtype=dtypes,
       layout=st.sampled_from(["interleaved", "split"]),
       offset=st.one_of(st.integers(0, 100), st.integers(0, ANGLE_LIMIT - 71)),
       base=st.sampled_from([10000.0, 10.0, 1.5, 5e5]),
       use_out=st.booleans(), out_layout=layouts(2), nt=threads)
def test_sinusoidal_table(length, dim, dtype, layout, offset, base, use_out, out_layout, nt):
    kw = dict(base=base, offset=offset, layout=layout)
    ctx = f"sinusoidal_table({length}, {dim}, {kw}, dtype={dtype}, out={use_out}, nt={nt})"
    with fastpe.use_backend("numpy"):
        want = fastpe.sinusoidal_table(length, dim, dtype=dtype, **kw)
    if use_out:
        placed = place(np.zeros((length, dim), dtype), out_layout)
        before = placed.base.copy()
        with serial_bytes(0):
            got = fastpe.sinusoidal_table(length, dim, out=placed.view, num_threads=nt, **kw)
        assert got is placed.view
        placed.untouched_outside(before, ctx)
    else:
        with serial_bytes(0):
            got = fastpe.sinusoidal_table(length, dim, dtype=dtype, num_threads=nt, **kw)
        assert got.dtype == dtype and got.shape == (length, dim)
    one = fastpe.sinusoidal_table(length, dim, dtype=dtype, num_threads=1, **kw)
    assert_bytes_equal(np.asarray(got, dtype=dtype), one, ctx + " vs num_threads=1")
    assert_close(got, want, dtype, max_position=offset + length, context=ctx)


@st.composite
def sinusoidal_case(draw):
    nd = draw(st.sampled_from([2, 3]))
    batch = draw(st.integers(0, 3)) if nd == 3 else 1
    seq, dim = draw(st.integers(0, 70)), draw(st.integers(0, 19))
    shape = (batch, seq, dim) if nd == 3 else (seq, dim)
    pos = draw(positions_arg(batch, seq, high=ANGLE_LIMIT))
    return shape, pos


@given(case=sinusoidal_case(), dtype=dtypes, seed=seeds, nt=threads, data=st.data(),
       layout=st.sampled_from(["interleaved", "split"]),
       scale=st.sampled_from([1.0, 0.0, -1.0, 2.5, 8.0]),
       base=st.sampled_from([10000.0, 100.0, 2.0]))
def test_add_sinusoidal(case, dtype, seed, nt, data, layout, scale, base):
    shape, (positions, offset, full) = case
    x_layout = data.draw(layouts(len(shape)))
    vals = values_of(shape, dtype, seed)
    placed = place(vals, x_layout)
    x = placed.view
    ref = np.array(x)
    before = placed.base.copy()
    kw = dict(offset=offset, base=base, layout=layout, scale=scale)
    ctx = f"add_sinusoidal(x {shape} {x.dtype} {x.strides}, {kw}, nt={nt})"
    note(ctx)
    with fastpe.use_backend("numpy"):
        _, exc_r = outcome(lambda: fastpe.add_sinusoidal(ref, positions, **kw))
    log: list[str] = []
    with serial_bytes(0), fast_path("sinusoidal_call", True, log):
        ret, exc_c = outcome(lambda: fastpe.add_sinusoidal(x, positions, num_threads=nt, **kw))
    assert_same_error(exc_c, exc_r, ctx)
    placed.untouched_outside(before, ctx)
    if exc_c is not None:
        assert_bytes_equal(x, vals.astype(x.dtype), ctx + ": a rejected call wrote")
        return
    assert ret is x
    event(f"sinusoidal path: {log[-1] if log else 'general only'}")
    one = np.array(vals.astype(x.dtype))
    with fast_path("sinusoidal_call", False):
        fastpe.add_sinusoidal(one, positions, num_threads=1, **kw)
    assert_bytes_equal(x, one, ctx + ": fast path / nt threads vs general path / 1 thread")
    mag = float(np.abs(as_f64(vals)).max() * abs(scale)) + 1.0 if vals.size else 1.0
    assert_close(x, ref, dtype, magnitude=mag, max_position=int(full.max()) if full.size else 0,
                 context=ctx)


# ---- learned ------------------------------------------------------------------------------


@st.composite
def learned_case(draw):
    nd = draw(st.sampled_from([2, 3]))
    batch = draw(st.integers(0, 3)) if nd == 3 else 1
    seq, dim = draw(st.integers(0, 70)), draw(st.integers(0, 19))
    max_len = draw(st.integers(max(seq, 1), seq + 40))
    shape = (batch, seq, dim) if nd == 3 else (seq, dim)
    pos = draw(positions_arg(batch, seq, high=max_len))
    return shape, max_len, pos


@given(case=learned_case(), dtype=dtypes, t_layout=layouts(2), data=st.data(),
       table_kind=st.sampled_from(["strided", "strided", "read-only", "broadcast-row"]),
       seed=seeds, nt=threads)
def test_add_learned(case, dtype, t_layout, data, table_kind, seed, nt):
    shape, max_len, (positions, offset, _) = case
    x_layout = data.draw(layouts(len(shape)))
    dim = shape[-1]
    placed = place(values_of(shape, dtype, seed), x_layout)
    x = placed.view
    x0 = np.array(x)
    tvals = values_of((max_len, dim), dtype, seed + 1)
    if table_kind == "broadcast-row":
        table = np.broadcast_to(tvals[:1], (max_len, dim))        # zero row stride
    else:
        table = place(tvals, t_layout).view
        if table_kind == "read-only":
            table.flags.writeable = False
    t_before = snapshot(table)
    ctx = (f"add_learned(x {shape} {x.dtype} {x.strides}, table {table.dtype} "
           f"{table.strides}, nt={nt})")
    note(ctx)
    ref = np.array(x)
    before = placed.base.copy()
    with fastpe.use_backend("numpy"):
        _, exc_r = outcome(lambda: fastpe.add_learned(ref, table, positions, offset=offset))
    log: list[str] = []
    with serial_bytes(0), fast_path("learned_call", True, log):
        ret, exc_c = outcome(lambda: fastpe.add_learned(x, table, positions, offset=offset,
                                                        num_threads=nt))
    assert_same_error(exc_c, exc_r, ctx)
    placed.untouched_outside(before, ctx)
    assert snapshot(table) == t_before, ctx + ": the table was written"
    if exc_c is not None:
        assert_bytes_equal(x, x0, ctx + ": a rejected call wrote")
        return
    assert ret is x
    event(f"learned path: {log[-1] if log else 'general only'}")
    if dtype.itemsize >= 4:
        assert_bytes_equal(x, ref, ctx)            # one IEEE addition on both sides
    else:
        assert_close(x, ref, dtype, magnitude=4.0, context=ctx)
    general = np.array(x0)
    with fast_path("learned_call", False):
        fastpe.add_learned(general, table, positions, offset=offset, num_threads=1)
    assert_bytes_equal(x, general, ctx + ": fast path / nt threads vs general path / 1 thread")


# ---- RoPE ---------------------------------------------------------------------------------


def scaling_dict(kind: str, rd: int, original: int) -> dict | None:
    half = rd // 2
    return {
        "none": None,
        "linear": {"rope_type": "linear", "factor": 4.0},
        "dynamic": {"rope_type": "dynamic", "factor": 2.0,
                    "original_max_position_embeddings": original},
        "yarn": {"rope_type": "yarn", "factor": 4.0,
                 "original_max_position_embeddings": original},
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": original},
        "longrope": {"rope_type": "longrope", "original_max_position_embeddings": original,
                     "factor": 8.0, "short_factor": [1.0 + 0.25 * i for i in range(half)],
                     "long_factor": [2.0 + 1.5 * i for i in range(half)]},
    }[kind]


@dataclass
class RopeArrays:
    q: np.ndarray
    k: np.ndarray | None
    bases: list[Placed]


@st.composite
def rope_arrays(draw, dtype, layout: str, batch, seq, hq, hk, head_dim, seed):
    """q and k in `layout`: separate awkward buffers, or slices of one fused buffer."""
    def user(shape4):  # (b, s, h, d) -> the layout's order
        b, s, h, d = shape4
        return {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "shd": (s, h, d)}[layout]

    with_k = hk is not None
    fused = with_k and draw(st.integers(0, 3)) == 0
    if fused:
        buf = place(values_of((batch, seq, hq + hk, head_dim), dtype, seed),
                    draw(layouts(4)))
        q4, k4 = buf.view[:, :, :hq], buf.view[:, :, hq:]
        if layout == "bhsd":
            q4, k4 = q4.transpose(0, 2, 1, 3), k4.transpose(0, 2, 1, 3)
        elif layout == "shd":
            q4, k4 = q4[0], k4[0]
        event("rope: q and k fused in one buffer")
        return RopeArrays(q4, k4, [buf])
    nd = 3 if layout == "shd" else 4
    qp = place(values_of(user((batch, seq, hq, head_dim)), dtype, seed), draw(layouts(nd)))
    if not with_k:
        return RopeArrays(qp.view, None, [qp])
    kp = place(values_of(user((batch, seq, hk, head_dim)), dtype, seed + 1), draw(layouts(nd)))
    return RopeArrays(qp.view, kp.view, [qp, kp])


@st.composite
def rope_case(draw):
    layout = draw(st.sampled_from(["bshd", "bhsd", "shd"]))
    batch = 1 if layout == "shd" else draw(st.integers(0, 3))
    seq = draw(st.integers(0, 70))
    hq = draw(st.integers(0, 4))
    hk = draw(st.one_of(st.none(), st.integers(0, 3)))
    rotary = draw(st.sampled_from(["full", "full", "partial"]))
    if rotary == "full":
        head_dim = 2 * draw(st.integers(1, 12))
        rotary_dim = None
    else:
        rotary_dim = 2 * draw(st.integers(1, 8))
        head_dim = rotary_dim + draw(st.integers(0, 7))
    source = draw(st.sampled_from(["base", "base", "freqs", "inv_freq", "scaling"]))
    scaling = draw(st.sampled_from(["linear", "dynamic", "yarn", "llama3", "longrope"])) \
        if source == "scaling" else "none"
    original = draw(st.sampled_from([16, 64, 1 << 20]))
    pos = draw(positions_arg(batch, seq, high=draw(st.sampled_from([100, 6000, ANGLE_LIMIT]))))
    return dict(layout=layout, batch=batch, seq=seq, hq=hq, hk=hk, head_dim=head_dim,
                rotary_dim=rotary_dim, source=source, scaling=scaling, original=original,
                pos=pos)


def rope_magnitude(*xs, att=1.0):
    m = max((float(np.abs(as_f64(x)).max()) for x in xs if x is not None and x.size),
            default=1.0)
    return max(m, 1e-30) * math.sqrt(2.0) * att


@given(case=rope_case(), dtype=dtypes, seed=seeds, nt=threads, data=st.data(),
       style=st.sampled_from(["neox", "gptj"]), inverse=st.booleans(),
       base=st.sampled_from([None, 10000.0, 500000.0, 3.0]),
       embedding=st.integers(0, 4))
def test_apply_rope(case, dtype, seed, nt, data, style, inverse, base, embedding):
    c = case
    positions, offset, full = c["pos"]
    rd = c["rotary_dim"] or c["head_dim"]
    arrays = data.draw(rope_arrays(dtype, c["layout"], c["batch"], c["seq"], c["hq"], c["hk"],
                                   c["head_dim"], seed))
    q, k = arrays.q, arrays.k
    kw = dict(offset=offset, style=style, layout=c["layout"], inverse=inverse)
    scaling = scaling_dict(c["scaling"], rd, c["original"])
    seq_len = int(full.max()) + 1 if full.size else None
    use_embedding = embedding == 0 and c["source"] in ("base", "scaling")
    if use_embedding:
        emb = fastpe.RotaryEmbedding(c["head_dim"], base=base, scaling=scaling,
                                     rotary_dim=c["rotary_dim"], style=style,
                                     max_position_embeddings=c["original"])
        kw.pop("style")
        call_kw = {}
        event("rope: RotaryEmbedding")

        def call(qq, kk, **extra):
            return emb(qq, kk, positions, **kw, **extra)
    else:
        if c["source"] == "base":
            call_kw = dict(base=base, rotary_dim=c["rotary_dim"])
        elif c["source"] == "scaling":
            call_kw = dict(scaling=scaling, base=base, rotary_dim=c["rotary_dim"],
                           max_position_embeddings=c["original"])
        elif c["source"] == "freqs":
            call_kw = dict(freqs=fastpe.rope_frequencies(
                rd, base=base, scaling=scaling_dict(data.draw(st.sampled_from(
                    ["none", "yarn", "longrope"])), rd, c["original"]),
                seq_len=seq_len, max_position_embeddings=c["original"]))
        else:
            rng = np.random.default_rng(seed)
            call_kw = dict(freqs=rng.uniform(0.0, 1.5, rd // 2).astype(
                data.draw(st.sampled_from([np.float64, np.float32, np.int64]))))
        if data.draw(st.booleans()) and c["rotary_dim"] is None and c["source"] != "base":
            call_kw["rotary_dim"] = rd

        def call(qq, kk, **extra):
            return fastpe.apply_rope(qq, kk, positions, **kw, **call_kw, **extra)

    ctx = (f"{'RotaryEmbedding' if use_embedding else 'apply_rope'}(q {q.shape} {q.dtype} "
           f"{q.strides}, k {None if k is None else (k.shape, k.strides)}, {kw}, {call_kw}, "
           f"nt={nt})")
    note(ctx)
    q0, k0 = np.array(q), None if k is None else np.array(k)
    before = [p.base.copy() for p in arrays.bases]
    # the reference, on contiguous copies
    qr, kr = np.array(q), None if k is None else np.array(k)
    with fastpe.use_backend("numpy"):
        _, exc_r = outcome(lambda: call(qr, kr))
    # compiled, fast path as it comes, nt threads
    log: list[str] = []
    with serial_bytes(0), fast_path("rope_call", True, log):
        ret, exc_c = outcome(lambda: call(q, k, num_threads=nt))
    assert_same_error(exc_c, exc_r, ctx)
    for p, b in zip(arrays.bases, before):
        p.untouched_outside(b, ctx)
    if exc_c is not None:
        assert_bytes_equal(q, q0, ctx + ": q written by a rejected call")
        if k is not None:
            assert_bytes_equal(k, k0, ctx + ": k written by a rejected call")
        return
    assert ret[0] is q and ret[1] is k
    event(f"rope path: {log[-1] if log else 'general only'}")
    # compiled, general path forced, one thread: the same bits
    qg, kg = np.array(q0), None if k0 is None else np.array(k0)
    with fast_path("rope_call", False):
        call(qg, kg, num_threads=1)
    assert_bytes_equal(q, qg, ctx + ": q, fast path / nt threads vs general path / 1 thread")
    if k is not None:
        assert_bytes_equal(k, kg, ctx + ": k, fast path / nt threads vs general / 1 thread")
    # against the reference
    att = 1.0
    if c["source"] == "scaling" or use_embedding:
        att = fastpe.rope_frequencies(rd, base=base, scaling=scaling, seq_len=seq_len,
                                      max_position_embeddings=c["original"]).attention_scaling
    elif c["source"] == "freqs":
        att = call_kw["freqs"].attention_scaling
    if inverse:
        att = 1.0 / att
    mag = rope_magnitude(q0, k0, att=att)
    atol, rtol = tolerance(dtype, mag)
    maxpos = int(full.max()) if full.size else 0
    if c["source"] == "inv_freq":
        maxpos = int(maxpos * 1.5) + 1    # inv_freq up to 1.5: angles up to 1.5 p
    atol += angle_atol(maxpos) * mag
    for name, a, b in (("q", q, qr), ("k", k, kr)):
        if a is not None:
            assert_close(a, b, dtype, atol=atol, rtol=rtol, context=f"{ctx} {name}")
            if rd < c["head_dim"]:
                x0 = q0 if name == "q" else k0
                assert_bytes_equal(a[..., rd:], x0[..., rd:], ctx + f" {name} tail")


@st.composite
def cache_case(draw):
    layout = draw(st.sampled_from(["bshd", "bhsd", "shd"]))
    batch = 1 if layout == "shd" else draw(st.integers(0, 3))
    seq = draw(st.integers(0, 70))
    half = draw(st.integers(1, 8))
    head_dim = 2 * half + draw(st.sampled_from([0, 0, 1, 2, 5]))
    rows = draw(st.integers(max(seq, 1), seq + 50))
    pos = draw(positions_arg(batch, seq, high=rows))
    return dict(layout=layout, batch=batch, seq=seq, hq=draw(st.integers(0, 3)),
                hk=draw(st.one_of(st.none(), st.integers(0, 2))), half=half,
                head_dim=head_dim, rows=rows, pos=pos)


@given(case=cache_case(), dtype=dtypes, cache_dtype=dtypes, seed=seeds, nt=threads,
       data=st.data(), style=st.sampled_from(["neox", "gptj"]), inverse=st.booleans(),
       cache_layout=layouts(2), computed=st.booleans())
def test_apply_rope_cached(case, dtype, cache_dtype, seed, nt, data, style, inverse,
                           cache_layout, computed):
    c = case
    positions, offset, _ = c["pos"]
    arrays = data.draw(rope_arrays(dtype, c["layout"], c["batch"], c["seq"], c["hq"], c["hk"],
                                   c["head_dim"], seed))
    q, k = arrays.q, arrays.k
    if computed:   # a real cache: rotations
        freqs = fastpe.rope_frequencies(2 * c["half"])
        cos, sin = fastpe.rope_cos_sin(np.arange(c["rows"]), freqs, dtype=cache_dtype)
    else:          # arbitrary numbers, norm away from 0 (the inverse divides by it)
        cos = values_of((c["rows"], c["half"]), cache_dtype, seed + 2, 0.5, 1.5)
        sin = values_of((c["rows"], c["half"]), cache_dtype, seed + 3, -1.0, 1.0)
    cos, sin = place(cos, cache_layout).view, place(sin, cache_layout).view
    cs_before = snapshot(cos), snapshot(sin)
    kw = dict(offset=offset, style=style, layout=c["layout"], inverse=inverse)
    ctx = (f"apply_rope_cached(q {q.shape} {q.dtype} {q.strides}, k "
           f"{None if k is None else (k.shape, k.strides)}, cos {cos.dtype} {cos.shape} "
           f"{cos.strides}, {kw}, nt={nt})")
    note(ctx)
    q0, k0 = np.array(q), None if k is None else np.array(k)
    before = [p.base.copy() for p in arrays.bases]
    qr, kr = np.array(q), None if k is None else np.array(k)
    with fastpe.use_backend("numpy"):
        _, exc_r = outcome(lambda: fastpe.apply_rope_cached(qr, kr, cos, sin, positions, **kw))
    with serial_bytes(0):
        ret, exc_c = outcome(lambda: fastpe.apply_rope_cached(q, k, cos, sin, positions,
                                                              num_threads=nt, **kw))
    assert_same_error(exc_c, exc_r, ctx)
    for p, b in zip(arrays.bases, before):
        p.untouched_outside(b, ctx)
    assert (snapshot(cos), snapshot(sin)) == cs_before, ctx + ": cos/sin written"
    if exc_c is not None:
        assert_bytes_equal(q, q0, ctx + ": q written by a rejected call")
        return
    assert ret[0] is q and ret[1] is k
    q1 = np.array(q0)
    fastpe.apply_rope_cached(q1, None, cos, sin, positions, num_threads=1, **kw)
    assert_bytes_equal(q, q1, ctx + ": q, nt threads vs 1 thread")
    # cos/sin round to the compute type on both sides; the inverse divides by c^2 + s^2
    cmax = max(float(np.abs(as_f64(cos)).max()), float(np.abs(as_f64(sin)).max()), 1.0)
    mag = rope_magnitude(q0, k0) * cmax * (4.0 if inverse and not computed else 1.0)
    atol, rtol = tolerance(dtype, mag)
    if dtype.itemsize == 8 and cache_dtype.itemsize < 8:
        atol += 2.0**-23 * mag          # cache values rounded to float32 or less, exactly
    for name, a, b in (("q", q, qr), ("k", k, kr)):
        if a is not None:
            assert_close(a, b, dtype, atol=atol, rtol=rtol, context=f"{ctx} {name}")
            rd = 2 * c["half"]
            x0 = q0 if name == "q" else k0
            assert_bytes_equal(a[..., rd:], x0[..., rd:], ctx + f" {name} tail")


@given(pos_shape=st.sampled_from([(), (0,), (1,), (5,), (40,), (3, 7), (2, 0), (1, 33)]),
       data=st.data(), dtype=dtypes, half=st.integers(1, 9),
       source=st.sampled_from(["plain", "yarn", "array"]), seed=seeds)
def test_rope_cos_sin(pos_shape, data, dtype, half, source, seed):
    v = data.draw(position_values(pos_shape, high=data.draw(st.sampled_from([50, ANGLE_LIMIT]))))
    positions = as_int_dtype(v, data.draw(st.sampled_from(INT_DTYPES)))
    if source == "array":
        freqs = np.random.default_rng(seed).uniform(0, 1, half)
        att = 1.0
    else:
        freqs = fastpe.rope_frequencies(2 * half, scaling=None if source == "plain" else
                                        {"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 64})
        att = freqs.attention_scaling
    ctx = f"rope_cos_sin({positions.dtype} {positions.shape}, {source} half={half}, {dtype})"
    with fastpe.use_backend("numpy"):
        cr, sr = fastpe.rope_cos_sin(positions, freqs, dtype=dtype)
    c, s = fastpe.rope_cos_sin(positions, freqs, dtype=dtype)
    assert c.shape == cr.shape == pos_shape + (half,) and c.dtype == dtype
    mp = int(v.max()) if v.size else 0
    assert_close(c, cr, dtype, magnitude=att, max_position=mp, context=ctx + " cos")
    assert_close(s, sr, dtype, magnitude=att, max_position=mp, context=ctx + " sin")


@pytest.mark.parametrize("backend", ["numpy", "cython"])
def test_rope_cos_sin_without_frequencies(backend):
    """An empty inv_freq rotates nothing: both backends refuse it, naming freqs."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=r"freqs\.inv_freq"):
        fastpe.rope_cos_sin(np.arange(3), np.empty(0))


# ---- ALiBi --------------------------------------------------------------------------------


@st.composite
def alibi_case(draw):
    lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    heads, q, k = draw(st.integers(0, 6)), draw(st.integers(0, 40)), draw(st.integers(0, 70))
    batch = int(np.prod(lead)) if lead else 1
    kw: dict = {}
    rng = np.random.default_rng(draw(seeds))
    kw["causal"] = draw(st.booleans())
    kw["symmetric"] = draw(st.booleans())
    slopes = draw(st.sampled_from(["default", "default", "max_bias", "array", "list"]))
    if slopes == "max_bias":
        kw["max_bias"] = draw(st.sampled_from([1.0, 8.0, 0.5]))
    elif slopes != "default":
        s = rng.uniform(-1, 1, heads)
        kw["slopes"] = s.tolist() if slopes == "list" else s.astype(
            draw(st.sampled_from([np.float64, np.float32, np.float16])))

    def per_sequence(length, high):
        form = draw(st.sampled_from(["shared", "one-row", "batch", "lead"]))
        shape = {"shared": (length,), "one-row": (1, length), "batch": (batch, length),
                 "lead": lead + (length,)}[form]
        return draw(position_values(shape, high=high))

    big = draw(st.sampled_from([100, 100, 2**24 + 100, 2**40]))   # past float32's integers
    if draw(st.booleans()):
        kw["k_positions"] = per_sequence(k, big)
    if draw(st.integers(0, 2)) == 0:
        m = per_sequence(k, 2) > 0
        kw["key_mask"] = m.astype(draw(st.sampled_from([bool, np.uint8, np.int32])))
    needs_q = q > k or ("k_positions" in kw or "key_mask" in kw)
    qform = draw(st.sampled_from(["default", "offset", "positions"]))
    if qform == "positions" or (needs_q and q > k):
        kw["q_positions"] = per_sequence(q, big)
    elif qform == "offset":
        hi = max(k - q, 0) if "k_positions" in kw or "key_mask" in kw else big
        kw["q_offset"] = draw(st.integers(0, hi))
    return lead + (heads, q, k), kw


def assert_same_scores(got, want, dtype, mag, ctx):
    g, w = as_f64(got), as_f64(want)
    assert np.array_equal(np.isneginf(g), np.isneginf(w)), ctx + ": -inf in different places"
    fin = np.isfinite(w)
    assert_close(np.where(fin, g, 0), np.where(fin, w, 0), dtype, magnitude=mag, context=ctx)


def alibi_magnitude(scores, kw, q, k):
    finite = as_f64(scores)[np.isfinite(as_f64(scores))]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    pos = [np.max(kw[n]) for n in ("q_positions", "k_positions") if n in kw and np.size(kw[n])]
    far = max([float(p) for p in pos] + [float(kw.get("q_offset", 0)) + q, k])
    return top + far + 100.0


@given(case=alibi_case(), dtype=dtypes, seed=seeds, nt=threads, data=st.data())
def test_add_alibi(case, dtype, seed, nt, data):
    shape, kw = case
    placed = place(values_of(shape, dtype, seed, -8, 8), data.draw(layouts(len(shape))))
    x = placed.view
    x0 = np.array(x)
    before = placed.base.copy()
    ctx = f"add_alibi({x.shape} {x.dtype} {x.strides}, {sorted(kw)}, nt={nt})"
    note(ctx + f" {kw}")
    ref = np.array(x)
    with fastpe.use_backend("numpy"):
        _, exc_r = outcome(lambda: fastpe.add_alibi(ref, **kw))
    log: list[str] = []
    with serial_bytes(0), fast_path("alibi_call", True, log):
        ret, exc_c = outcome(lambda: fastpe.add_alibi(x, num_threads=nt, **kw))
    assert_same_error(exc_c, exc_r, ctx)
    placed.untouched_outside(before, ctx)
    if exc_c is not None:
        assert_bytes_equal(x, x0, ctx + ": a rejected call wrote")
        return
    assert ret is x
    event(f"alibi path: {log[-1] if log else 'general only'}")
    general = np.array(x0)
    with fast_path("alibi_call", False):
        fastpe.add_alibi(general, num_threads=1, **kw)
    assert_bytes_equal(x, general, ctx + ": fast path / nt threads vs general path / 1 thread")
    assert_same_scores(x, ref, dtype, alibi_magnitude(x0, kw, shape[-2], shape[-1]), ctx)


@given(case=alibi_case(), dtype=dtypes, nt=threads, use_out=st.booleans(), data=st.data())
def test_alibi_bias(case, dtype, nt, use_out, data):
    shape, kw = case
    heads, q, k = shape[-3:]
    for name in ("q_positions", "k_positions", "key_mask"):  # alibi_bias: shared rows only
        if name in kw and np.ndim(kw[name]) > 1:
            a = np.asarray(kw[name])
            n = a.shape[-1]
            rows = a.reshape(-1, n) if n else np.zeros((1, 0), a.dtype)
            kw[name] = rows[:1] if len(rows) else np.zeros((1, n), a.dtype)  # one row
    ctx = f"alibi_bias({heads}, {q}, {k}, {sorted(kw)}, {dtype}, out={use_out}, nt={nt})"
    note(ctx + f" {kw}")
    with fastpe.use_backend("numpy"):
        want, exc_r = outcome(lambda: fastpe.alibi_bias(heads, q, k, dtype=dtype, **kw))
    placed = None
    if use_out:
        placed = place(np.zeros((heads, q, k), dtype), data.draw(layouts(3)))
        before = placed.base.copy()
        kw = dict(kw, out=placed.view)
    with serial_bytes(0):
        got, exc_c = outcome(lambda: fastpe.alibi_bias(heads, q, k, dtype=None if use_out
                                                       else dtype, num_threads=nt, **kw))
    assert_same_error(exc_c, exc_r, ctx)
    if placed is not None:
        placed.untouched_outside(before, ctx)
    if exc_c is not None:
        return
    if use_out:
        assert got is placed.view
    # no addition: one rounding of slope * distance on both sides
    assert_bytes_equal(np.asarray(got, dtype=dtype), want, ctx)
