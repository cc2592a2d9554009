"""The canonical workloads of ``python -m fastpe bench`` and of ``bench/``.

Every workload is one call of a fastpe function on model-sized arrays, with
implementations of the same call side by side:

- ``fastpe``: the fastpe function (the compiled kernels unless the NumPy
  backend was asked for);
- ``reference``: ``fastpe.reference``, the pure-NumPy oracle (bench/ only);
- ``numpy``: the best NumPy a skilled user would write for the same result:
  in place, chunked where that keeps temporaries in cache, temporaries
  allocated once (outside the timed call), tables a model would cache built
  once. Each is documented where it is defined; they are checked against the
  reference by tests/test_cli.py and by every benchmark in bench/;
- ``floor``: one in-place streaming pass over the same bytes
  (``np.multiply(a, 1.0, out=a)``), or a fill of them for workloads that
  write a table. Its time is the machine's memory bandwidth for those bytes,
  so ``floor / fastpe`` is the fraction of it fastpe reaches.

A workload builds its input arrays once (``make``); an implementation is
*prepared* for those arrays and a thread count (temporaries, cached tables,
frequencies: all untimed) and returns a *runner* ``run(arrays) -> results``,
the timed call. Runners write in place, so bench/ hands them a fresh copy of
the ``inplace`` arrays each round; ``python -m fastpe bench`` lets them work
on the same arrays round after round (every workload keeps its values finite
and bounded that way), as the floor does.

The interleaved timing (``measure``, ``run_workload``) serves the command line;
bench/ times with pytest-benchmark. ``FULL`` are the canonical shapes, ``TINY``
the same workloads in a few kilobytes, for the tests.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

import fastpe

Arrays = dict[str, np.ndarray]
Runner = Callable[[Arrays], tuple]
Prepare = Callable[[Arrays, int], Runner]

DTYPES = ("float32", "float16")

# ---- sizes --------------------------------------------------------------------------------

# The canonical shapes (issues 2, 3 and 4): LLaMA-7B attention (32 heads of 128) at 2048
# tokens, Llama-3-8B (GQA: 8 KV heads, rope_theta 500000, llama3 scaling), BLOOM-like ALiBi
# (32 heads, 2048 tokens), an (8, 2048, 1024) embedding batch, an (8192, 1024) table.
FULL = dict(batch=1, seq=2048, heads=32, kv_heads=8, head_dim=128, decode_pos=4095,
            decode_batch=32, table=(8192, 1024), embed=(8, 2048, 1024), max_len=4096,
            alibi_heads=32, alibi_seq=2048, alibi_keys=4096)
# A few kilobytes each: for the tests of the command line and of the baselines.
TINY = dict(batch=1, seq=48, heads=4, kv_heads=2, head_dim=32, decode_pos=4095,
            decode_batch=3, table=(40, 33), embed=(2, 24, 20), max_len=64,
            alibi_heads=3, alibi_seq=24, alibi_keys=40)
SIZES = {"full": FULL, "tiny": TINY}

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA3_BASE = 500000.0


# ---- data ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _noise() -> np.ndarray:
    # A prime length, so the repeated block does not line up with rows or heads.
    return np.random.default_rng(20240601).standard_normal(65521).astype(np.float32)


def random_array(shape: tuple[int, ...], dtype, scale: float = 1.0) -> np.ndarray:
    """Deterministic standard-normal-like values, filled fast (a 64 Ki block repeated:
    a random generator would take seconds over the 512 MiB of an ALiBi workload)."""
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    block = _noise() * np.float32(scale)
    for i in range(0, flat.size, block.size):
        n = min(block.size, flat.size - i)
        flat[i:i + n] = block[:n]
    return out


def copy_arrays(arrays: Arrays, names: Iterable[str]) -> Arrays:
    """A dict sharing the read-only arrays and holding fresh copies of `names`."""
    names = set(names)
    return {k: (v.copy() if k in names else v) for k, v in arrays.items()}


# ---- floors -------------------------------------------------------------------------------

# The floor runs over the very arrays the workload writes (the same bytes, in the same
# cache state), leaving their values unchanged. A Python thread pool splits a
# multi-threaded floor into contiguous pieces (NumPy releases the GIL in ufunc loops); only
# worth it for big buffers, as a dispatch costs tens of microseconds: smaller floors run on
# one thread, as fastpe runs small calls serially.
_THREADED_FLOOR_BYTES = 4 << 20
_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _pieces(flat: np.ndarray, threads: int) -> list[np.ndarray]:
    step = -(-flat.size // threads)
    return [flat[i:i + step] for i in range(0, flat.size, step)]


def _parallel(fn: Callable[[np.ndarray], object], flat: np.ndarray, threads: int) -> None:
    if threads <= 1 or flat.nbytes < _THREADED_FLOOR_BYTES:
        fn(flat)
        return
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = concurrent.futures.ThreadPoolExecutor(threads)
    for f in [pool.submit(fn, p) for p in _pieces(flat, threads)]:
        f.result()


def _flat(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:  # pragma: no cover - every workload's arrays are
        raise ValueError("the floor needs C-contiguous arrays")
    return a.reshape(-1)


def _stream(a: np.ndarray) -> None:
    """One in-place streaming pass: every byte read once and written once, values
    unchanged. float32/float64: np.multiply(a, 1.0, out=a). Half floats: NumPy's float16
    multiply converts one element at a time (~40x slower than memory), so the same bytes
    are streamed as unsigned integers instead (np.bitwise_or(u, 0, out=u): as fast as the
    float32 multiply over the same bytes)."""
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
        np.multiply(a, 1.0, out=a)
    else:
        u = a.view(np.dtype(f"u{a.dtype.itemsize}"))
        np.bitwise_or(u, 0, out=u)


def _fill(a: np.ndarray) -> None:
    a.fill(1)


def prepare_floor(kind: str, names: tuple[str, ...]) -> Prepare:
    """The floor over arrays `names`: "stream" (read + write each byte, in place) or
    "fill" (write each byte; what producing a table must at least do)."""
    op = _stream if kind == "stream" else _fill

    def prepare(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            for n in names:
                _parallel(op, _flat(a[n]), threads)
            return ()
        return run
    return prepare


# ---- comparing results --------------------------------------------------------------------

# (atol, rtol), relative to the result's largest finite magnitude and to each value. These
# check that a benchmark computes the right thing; tests/ checks accuracy. float16 allows a
# few ulp: NumPy baselines round after each operation.
TOLERANCE = {"float64": 1e-10, "float32": 2e-6, "float16": 4e-3}


def compare(actual, expected, dtype, *, atol: float = 0.0, offset_per_row: bool = False,
            chunk: int = 1 << 22, max_elements: int | None = None) -> str | None:
    """None when `actual` matches `expected` within the dtype's tolerance (plus `atol`,
    absolute), else a message. Infinities must match exactly. `offset_per_row` accepts a
    constant difference along the last axis (BLOOM's ALiBi form, equal after softmax).
    Compared in float64, `chunk` elements at a time; with `max_elements`, only every n-th
    row (last axis) so that about that many elements are compared."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"shape {a.shape} != expected {e.shape}"
    if a.size == 0:
        return None
    tol = TOLERANCE[np.dtype(dtype).name]
    last = a.shape[-1] if a.ndim else 1
    a2, e2 = a.reshape(-1, last), e.reshape(-1, last)
    if max_elements is not None and a.size > max_elements:
        step = -(-a.size // max_elements)
        a2, e2 = a2[::step], e2[::step]
    rows = max(1, chunk // last)
    finite = [np.abs(e2[i:i + rows][np.isfinite(e2[i:i + rows])]) for i in range(0, len(e2), rows)]
    magnitude = max((float(f.max()) for f in finite if f.size), default=1.0)
    bound = tol * max(magnitude, 1.0) + atol
    for i in range(0, len(e2), rows):
        ac = a2[i:i + rows].astype(np.float64)
        ec = e2[i:i + rows].astype(np.float64)
        fin = np.isfinite(ec)
        if not np.array_equal(fin, np.isfinite(ac)) or not np.array_equal(ac[~fin], ec[~fin]):
            return f"infinities or NaNs differ in rows {i}..{i + len(ec) - 1}"
        with np.errstate(invalid="ignore"):  # inf - inf where both are -inf
            diff = np.where(fin, ac - ec, 0.0)
        if offset_per_row:
            # the first finite difference of each row
            first = np.argmax(fin, axis=1)
            diff = np.where(fin, diff - diff[np.arange(len(diff)), first][:, None], 0.0)
        err = np.abs(diff) - tol * np.abs(np.where(fin, ec, 0.0))
        worst = float(err.max())
        if worst > bound:
            idx = np.unravel_index(int(np.argmax(err)), err.shape)
            return (f"differs by {worst + tol * abs(ec[idx]):.3g} (allowed {bound:.3g} + "
                    f"{tol:g} relative) at flat row {i + idx[0]}, column {idx[1]}: "
                    f"{ac[idx]!r} vs {ec[idx]!r}")
    return None


# ---- workloads ----------------------------------------------------------------------------

@dataclasses.dataclass
class Workload:
    """One canonical call and its implementations (see the module docstring)."""

    name: str            # "rope-prefill-neox": pytest ids, --only, JSON
    family: str          # "sinusoidal" | "learned" | "rope" | "alibi"
    title: str           # human-readable, with the shapes
    make: Callable[[np.dtype], Arrays]
    inplace: tuple[str, ...]          # arrays read and written in place
    result: tuple[str, ...]           # arrays holding the result: the floor's bytes
    floor: str                        # "stream" (in-place pass) or "fill" (a table)
    impls: dict[str, Prepare]
    numpy_note: str                   # what the NumPy baseline does, in one line
    per_call: bool = False            # a small call: report microseconds
    atol: dict[str, float] = dataclasses.field(default_factory=dict)  # extra, per impl
    offset_per_row: set = dataclasses.field(default_factory=set)  # equal up to a per-row
    #                                             constant (BLOOM's ALiBi form)
    params: dict = dataclasses.field(default_factory=dict)  # the call's arguments, for
    #                                             implementations added elsewhere (bench/)

    @property
    def written(self) -> tuple[str, ...]:
        """Every array a call writes: each implementation needs its own."""
        return tuple(dict.fromkeys(self.inplace + self.result))

    def floor_bytes(self, arrays: Arrays) -> int:
        return sum(arrays[n].nbytes for n in self.result)

    def traffic_bytes(self, arrays: Arrays) -> int:
        """Bytes the floor moves: read + write for a stream, write for a fill."""
        return self.floor_bytes(arrays) * (2 if self.floor == "stream" else 1)

    def prepare_floor(self) -> Prepare:
        return prepare_floor(self.floor, self.result)

    def expected(self, arrays: Arrays) -> tuple:
        """The reference result, on copies of `arrays`."""
        fresh = copy_arrays(arrays, self.written)
        return tuple(np.array(r) for r in self.impls["reference"](fresh, 1)(fresh))


def _kw_threads(fn: Callable, threads: int) -> dict:
    """{"num_threads": threads} for the fastpe functions that take it."""
    import inspect
    try:
        return {"num_threads": threads} if "num_threads" in inspect.signature(fn).parameters \
            else {}
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return {}


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """The arithmetic dtype a careful NumPy user picks: float32 for half floats."""
    return np.dtype(np.float64) if np.dtype(dtype).itemsize == 8 else np.dtype(np.float32)


def _chunked_add(x: np.ndarray, addend: np.ndarray, work: np.dtype, buf: np.ndarray,
                 rows: int) -> None:
    """x += addend, addend broadcast over x's leading axes.

    In x's own dtype that is one ufunc call. For float16 NumPy's ufunc loop converts one
    element at a time and is ~40x slower than a stream; converting blocks of `rows` rows to
    float32 in a preallocated buffer, adding there and converting back is the fastest way
    measured (x (8, 2048, 1024): 52 ms, against 97 ms adding a float32 table and 120 ms
    a float16 one in one call), so the baseline does that."""
    if x.dtype == work:
        np.add(x, addend, out=x)
        return
    xs = x.reshape(-1, *x.shape[-2:])
    adds = np.broadcast_to(addend, x.shape).reshape(xs.shape)
    for b in range(xs.shape[0]):
        for r0 in range(0, xs.shape[1], rows):
            part = xs[b, r0:r0 + rows]
            t = buf[:part.shape[0]]
            np.copyto(t, part)
            np.add(t, adds[b, r0:r0 + rows], out=t)
            np.copyto(part, t, casting="same_kind")


# ---- sinusoidal ---------------------------------------------------------------------------

def _seed_div_term(dim: int, dtype) -> np.ndarray:
    """The seed's frequencies: exp(arange(0, d, 2) * -ln(10000) / d)."""
    return np.exp(np.arange(0, dim, 2, dtype=dtype) * dtype(-math.log(10000.0) / dim))


def prepare_seed_table(arrays: Arrays, threads: int) -> Runner:
    """The seed's NumPy construction (shared/seed notes), done in float32: a fresh zeroed
    table, whole-table float32 angles, sin into even and cos into odd columns."""
    length, dim = arrays["out"].shape
    out_dtype = arrays["out"].dtype

    def run(a: Arrays) -> tuple:
        pe = np.zeros((length, dim), dtype=out_dtype)
        position = np.arange(length, dtype=np.float32)[:, np.newaxis]
        div_term = _seed_div_term(dim, np.float32)
        pe[:, 0::2] = np.sin(position * div_term)
        pe[:, 1::2] = np.cos(position * div_term[:dim // 2])
        return (pe,)
    return run


def prepare_numpy_table(arrays: Arrays, threads: int) -> Runner:
    """The best NumPy for a table into a preallocated `out`: the seed's float32 formula,
    but in blocks of 64 rows (the angle block stays in L1/L2), angles into a buffer made
    once, np.sin/np.cos writing straight into out's strided columns. Float32 angles (the
    seed's choice; float64 angles would be exact but ~2x slower): errors grow with the
    position, ~1e-3 at 8192."""
    out0 = arrays["out"]
    length, dim = out0.shape
    rows = 64
    work = np.float32
    div_term = _seed_div_term(dim, work)
    position = np.arange(length, dtype=work)[:, None]
    angles = np.empty((rows, div_term.size), work)
    half = dim // 2

    def run(a: Arrays) -> tuple:
        out = a["out"]
        for r0 in range(0, length, rows):
            r1 = min(length, r0 + rows)
            ang = angles[:r1 - r0]
            np.multiply(position[r0:r1], div_term, out=ang)
            np.sin(ang, out=out[r0:r1, 0::2], casting="same_kind")
            np.cos(ang[:, :half], out=out[r0:r1, 1::2], casting="same_kind")
        return (out,)
    return run


def _table_workload(size: dict) -> Workload:
    length, dim = size["table"]

    def make(dtype) -> Arrays:
        return {"out": np.zeros((length, dim), dtype)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.sinusoidal_table(length, dim, out=a["out"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.reference.sinusoidal_table(length, dim, out=a["out"]),)
        return run

    # float32 angles: the angle's absolute error is a few float32 ulp of position * w,
    # up to about 2 * length * 2^-23 (measured: 8.5e-4 at length 8192).
    seed_atol = 2.0 * length * 2.0**-23 + 1e-6
    return Workload(
        name="sinusoidal-table", family="sinusoidal",
        title=f"sinusoidal_table({length}, {dim}, out=buf)",
        make=make, inplace=(), result=("out",), floor="fill",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": prepare_numpy_table,
               "seed": prepare_seed_table},
        numpy_note="the seed's float32 formula in 64-row blocks, sin/cos straight into out",
        atol={"numpy": seed_atol, "seed": seed_atol})


def _add_sinusoidal_workload(size: dict) -> Workload:
    shape = size["embed"]

    def make(dtype) -> Arrays:
        return {"x": random_array(shape, dtype)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.add_sinusoidal(a["x"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.reference.add_sinusoidal(a["x"]),)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        """The best NumPy: the (seq, dim) table built once, as a model caches it at init
        (not timed; exact, from the reference), then one broadcast in-place add per call."""
        x0 = arrays["x"]
        work = _work_dtype(x0.dtype)
        pe = fastpe.reference.sinusoidal_table(x0.shape[-2], x0.shape[-1], dtype=work)
        buf = np.empty((64, x0.shape[-1]), work)

        def run(a: Arrays) -> tuple:
            _chunked_add(a["x"], pe, work, buf, 64)
            return (a["x"],)
        return run

    return Workload(
        name="sinusoidal-add", family="sinusoidal",
        title=f"add_sinusoidal(x {shape})",
        make=make, inplace=("x",), result=("x",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_},
        numpy_note="x += a cached table (built once, untimed): one in-place broadcast add")


# ---- learned ------------------------------------------------------------------------------

def _learned_workload(size: dict) -> Workload:
    shape, max_len = size["embed"], size["max_len"]

    def make(dtype) -> Arrays:
        return {"x": random_array(shape, dtype),
                "table": random_array((max_len, shape[-1]), dtype, scale=0.02)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.add_learned(a["x"], a["table"], num_threads=threads),)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.reference.add_learned(a["x"], a["table"]),)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        """The best NumPy: positions 0..seq-1 are a slice of the table (no gather, no
        copy), added in place with broadcasting over the batch."""
        x0 = arrays["x"]
        work = _work_dtype(x0.dtype)
        buf = np.empty((64, x0.shape[-1]), work)

        def run(a: Arrays) -> tuple:
            x = a["x"]
            _chunked_add(x, a["table"][:x.shape[-2]], work, buf, 64)
            return (x,)
        return run

    return Workload(
        name="learned-add", family="learned",
        title=f"add_learned(x {shape}, table ({max_len}, {shape[-1]}))",
        make=make, inplace=("x",), result=("x",), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_},
        numpy_note="x += table[:seq]: one in-place broadcast add of a table slice")


# ---- RoPE ---------------------------------------------------------------------------------

class NumpyRope:
    """The best NumPy RoPE, as issue 3 describes it: in place, in chunks of `chunk` tokens
    so that the temporaries (two (batch, chunk, heads, half) buffers per head count, made
    once) stay in L2; cos/sin computed inside the call, from float64 angles, once per
    token row and broadcast over every head of q and k. Per chunk and array, six ufunc
    calls rotate the pairs (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin): neox pairs are
    the two halves of the head, gptj pairs the even and odd features (strided views).
    float16 arrays compute in float32 (mixed-dtype ufuncs, rounding to float16 on store).

    positions: None (offset + arange) or (seq,) / (batch, seq) integers; chunk 64
    measured best here (8..256 within 10%; 2048, unchunked, 1.5x slower)."""

    def __init__(self, q: np.ndarray, k: np.ndarray | None, inv_freq: np.ndarray, *,
                 neox: bool, attention_scaling: float = 1.0, chunk: int = 64):
        self.inv_freq = np.asarray(inv_freq, np.float64)
        self.neox, self.scale, self.chunk = neox, float(attention_scaling), chunk
        half = self.inv_freq.size
        work = _work_dtype(q.dtype)
        c = min(chunk, q.shape[1])
        self.tmp: dict[int, list[np.ndarray]] = {}
        for x in (q, k):
            if x is not None and x.shape[2] not in self.tmp:
                self.tmp[x.shape[2]] = [np.empty((x.shape[0], c, x.shape[2], half), work)
                                        for _ in range(2)]
        rows = q.shape[0]
        self.angles = np.empty((rows, c, half))
        self.trig = np.empty((rows, c, half))
        self.cos = np.empty((rows, c, 1, half), work)
        self.sin = np.empty((rows, c, 1, half), work)
        self.arange = np.arange(q.shape[1], dtype=np.float64)

    def __call__(self, q: np.ndarray, k: np.ndarray | None, positions=None,
                 offset: int = 0) -> tuple:
        seq = q.shape[1]
        if positions is None:
            pos = (self.arange[:seq] + offset)[None]
        else:
            pos = np.asarray(positions)
            pos = pos[None] if pos.ndim == 1 else pos
        # (rows, seq, half): a position per frequency pair (M-RoPE), else one per token
        per_pair = pos.ndim == 3
        half = self.inv_freq.size
        for s0 in range(0, seq, self.chunk):
            s1 = min(seq, s0 + self.chunk)
            c, r = s1 - s0, pos.shape[0]
            ang = self.angles[:r, :c]
            np.multiply(pos[:, s0:s1] if per_pair else pos[:, s0:s1, None], self.inv_freq,
                        out=ang)
            cos, sin = self.cos[:r, :c], self.sin[:r, :c]
            np.cos(ang, out=self.trig[:r, :c])
            if self.scale != 1.0:
                self.trig[:r, :c] *= self.scale
            cos[:, :, 0] = self.trig[:r, :c]
            np.sin(ang, out=self.trig[:r, :c])
            if self.scale != 1.0:
                self.trig[:r, :c] *= self.scale
            sin[:, :, 0] = self.trig[:r, :c]
            for x in (q, k):
                if x is None:
                    continue
                xs = x[:, s0:s1]
                if self.neox:
                    x1, x2 = xs[..., :half], xs[..., half:2 * half]
                else:
                    x1, x2 = xs[..., 0:2 * half:2], xs[..., 1:2 * half:2]
                t1, t2 = (t[:, :c] for t in self.tmp[x.shape[2]])
                np.multiply(x1, sin, out=t1)                       # x1 sin, kept for x2
                np.multiply(x1, cos, out=x1, casting="same_kind")  # x1 cos
                np.multiply(x2, sin, out=t2)                       # x2 sin
                np.subtract(x1, t2, out=x1, casting="same_kind")   # x1' = x1 cos - x2 sin
                np.multiply(x2, cos, out=x2, casting="same_kind")  # x2 cos
                np.add(x2, t1, out=x2, casting="same_kind")        # x2' = x2 cos + x1 sin
        return q, k


def _rope_workload(name: str, title: str, q_shape, k_shape, *, style="neox", positions=None,
                   offset=0, base=None, scaling=None, per_call=False,
                   note="64-token chunks in place, 2 preallocated temporaries, cos/sin "
                        "inside") -> Workload:
    neox = style == "neox"
    head_dim = q_shape[-1]

    def make(dtype) -> Arrays:
        return {"q": random_array(q_shape, dtype), "k": random_array(k_shape, dtype, 0.5)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        if scaling is None:
            def run(a: Arrays) -> tuple:
                return fastpe.apply_rope(a["q"], a["k"], positions, offset=offset, base=base,
                                         style=style, num_threads=threads)
        else:
            # The way a model applies scaled RoPE: the embedding parsed once (at init).
            rope = fastpe.RotaryEmbedding(head_dim, base=base, scaling=scaling, style=style)

            def run(a: Arrays) -> tuple:
                return rope(a["q"], a["k"], positions, offset=offset, num_threads=threads)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return fastpe.reference.apply_rope(a["q"], a["k"], positions, offset=offset,
                                               base=base, scaling=scaling, style=style)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        # The frequencies (and any scaling) are per-model constants, computed at init.
        freqs = fastpe.rope_frequencies(head_dim, base=base, scaling=scaling)
        impl = NumpyRope(arrays["q"], arrays["k"], freqs.inv_freq, neox=neox,
                         attention_scaling=freqs.attention_scaling)

        def run(a: Arrays) -> tuple:
            return impl(a["q"], a["k"], positions, offset)
        return run

    return Workload(
        name=name, family="rope", title=title, make=make, inplace=("q", "k"),
        result=("q", "k"), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_},
        numpy_note=note, per_call=per_call,
        params=dict(style=style, positions=positions, offset=offset, base=base,
                    scaling=scaling, head_dim=head_dim,
                    max_position=int(offset + q_shape[1] - 1 if positions is None
                                     else np.max(positions))))


def rope_workloads(size: dict) -> list[Workload]:
    b, s, h, kvh, d = size["batch"], size["seq"], size["heads"], size["kv_heads"], size["head_dim"]
    nb, pos = size["decode_batch"], size["decode_pos"]
    shape = (b, s, h, d)
    # batched decode: one new token per sequence, each sequence at its own length
    batch_pos = (np.arange(nb, dtype=np.int64) * 97 + pos - 97 * nb).reshape(nb, 1)
    return [
        _rope_workload("rope-prefill-neox", f"RoPE prefill q,k {shape} neox (LLaMA)",
                       shape, shape),
        _rope_workload("rope-prefill-gptj", f"RoPE prefill q,k {shape} gptj",
                       shape, shape, style="gptj"),
        _rope_workload("rope-decode", f"RoPE decode q,k {(1, 1, h, d)} at {pos}",
                       (1, 1, h, d), (1, 1, h, d), offset=pos, per_call=True,
                       note="the same code: cos/sin of the token, six in-place ufuncs per "
                            "array"),
        _rope_workload("rope-batched-decode",
                       f"RoPE batched decode q,k {(nb, 1, h, d)}, {nb} positions",
                       (nb, 1, h, d), (nb, 1, h, d), positions=batch_pos, per_call=True,
                       note="the same code: (batch, 1) cos/sin rows, six in-place ufuncs "
                            "per array"),
        _rope_workload("rope-llama3", f"RoPE llama3-scaled q {shape} k {(b, s, kvh, d)}",
                       shape, (b, s, kvh, d), base=LLAMA3_BASE, scaling=LLAMA3_SCALING),
    ]


def mrope_workloads(size: dict) -> list[Workload]:
    """Qwen2-VL-like prefill: the plain prefill's shapes (GQA k), M-RoPE sections
    [16, 24, 24] (scaled to the head), positions of a prompt that is mostly one image
    (text, a merged patch grid, text), as get_rope_index gives them."""
    b, s, h, kvh, d = size["batch"], size["seq"], size["heads"], size["kv_heads"], size["head_dim"]
    q_shape, k_shape = (b, s, h, d), (b, s, kvh, d)
    text = max(1, s // 32)
    w = min(32, s - 2 * text)
    rows = (s - 2 * text) // w
    positions = fastpe.mrope_positions([text, (1, 2 * rows, 2 * w), s - text - rows * w],
                                       spatial_merge_size=2)
    sections = [d // 8, 3 * d // 16, d // 2 - d // 8 - 3 * d // 16]
    rope = fastpe.RotaryEmbedding(d, base=1e6, mrope_section=sections)
    pair_axis = rope._pair_axis

    def make(dtype) -> Arrays:
        return {"q": random_array(q_shape, dtype), "k": random_array(k_shape, dtype, 0.5)}

    def fastpe_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return rope(a["q"], a["k"], positions, num_threads=threads)
        return run

    def reference(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            with fastpe.use_backend("numpy"):
                return rope(a["q"], a["k"], positions)
        return run

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        impl = NumpyRope(arrays["q"], arrays["k"], rope.frequencies().inv_freq, neox=True)

        def run(a: Arrays) -> tuple:
            # each pair's own axis: (1, seq, half) positions
            return impl(a["q"], a["k"], positions[pair_axis].T[None].astype(np.float64))
        return run

    return [Workload(
        name="rope-prefill-mrope", family="rope",
        title=f"M-RoPE prefill q {q_shape} k {k_shape}, 3-axis image prompt (Qwen2-VL)",
        make=make, inplace=("q", "k"), result=("q", "k"), floor="stream",
        impls={"fastpe": fastpe_, "reference": reference, "numpy": numpy_},
        numpy_note="the plain baseline on (seq, half) per-pair positions",
        params=dict(positions=positions, mrope_section=sections, head_dim=d))]


# ---- ALiBi --------------------------------------------------------------------------------

def has_alibi() -> bool:
    return hasattr(fastpe, "add_alibi") and hasattr(fastpe.reference, "add_alibi")


def _slopes(heads: int, work: np.dtype) -> np.ndarray:
    """The slopes in the arithmetic dtype (float32, or float64 for float64 data)."""
    return fastpe.alibi_slopes(heads).astype(work)


def alibi_workloads(size: dict) -> list[Workload]:
    if not has_alibi():
        return []
    h, s, keys = size["alibi_heads"], size["alibi_seq"], size["alibi_keys"]
    prefill, decode = (1, h, s, s), (1, h, 1, keys)

    def make_scores(shape):
        def make(dtype) -> Arrays:
            return {"scores": random_array(shape, dtype)}
        return make

    def fastpe_add(causal):
        def prep(arrays: Arrays, threads: int) -> Runner:
            def run(a: Arrays) -> tuple:
                return (fastpe.add_alibi(a["scores"], causal=causal, num_threads=threads),)
            return run
        return prep

    def reference_add(causal):
        def prep(arrays: Arrays, threads: int) -> Runner:
            def run(a: Arrays) -> tuple:
                return (fastpe.reference.add_alibi(a["scores"], causal=causal),)
            return run
        return prep

    def numpy_prefill(arrays: Arrays, threads: int) -> Runner:
        """The best NumPy (issue 4): the masked (heads, q, k) bias built once, as a model
        caches it (not timed), then one in-place broadcast add
        per call: three streams (scores in, bias in, scores out). Computing the bias on
        the fly in 64-row blocks instead measured 2x slower."""
        x0 = arrays["scores"]
        work = _work_dtype(x0.dtype)
        heads, q, k = x0.shape[-3:]
        kpos = np.arange(k, dtype=work)
        qpos = (np.arange(q, dtype=work) + work.type(k - q))[:, None]
        dist = kpos - qpos                        # k_pos - q_pos: exact integers
        future = dist > 0                         # the causal mask
        bias = np.empty((heads, q, k), work)
        for h, slope in enumerate(fastpe.alibi_slopes(heads).astype(work)):
            np.multiply(dist, slope, out=bias[h])
            np.copyto(bias[h], -np.inf, where=future)
        del dist, future
        buf = np.empty((64, k), work)

        def run(a: Arrays) -> tuple:
            _chunked_add(a["scores"], bias, work, buf, 64)
            return (a["scores"],)
        return run

    def numpy_decode(arrays: Arrays, threads: int) -> Runner:
        """The best NumPy for one query: per call the distances of the k_len keys (a
        subtraction from a cached arange), times the slopes into a preallocated
        (heads, k_len) bias, added in place. Nothing per step is cached beyond what a
        decode loop can keep while k_len grows."""
        x0 = arrays["scores"]
        heads, k = x0.shape[-3], x0.shape[-1]
        work = _work_dtype(x0.dtype)
        slopes = _slopes(heads, work)[:, None]
        keys = np.arange(k, dtype=work)
        dist = np.empty(k, work)
        bias = np.empty((heads, k), work)

        def run(a: Arrays) -> tuple:
            scores = a["scores"]
            kk = scores.shape[-1]
            np.subtract(keys[:kk], work.type(kk - 1), out=dist[:kk])  # k_pos - q_pos <= 0
            np.multiply(slopes, dist[:kk], out=bias[:, :kk])
            np.add(scores, bias[:, None, :kk], out=scores, casting="same_kind")
            return (scores,)
        return run

    def fastpe_bias(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.alibi_bias(h, s, s, out=a["out"],
                                      **_kw_threads(fastpe.alibi_bias, threads)),)
        return run

    def reference_bias(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> tuple:
            return (fastpe.reference.alibi_bias(h, s, s, out=a["out"]),)
        return run

    def numpy_bias(arrays: Arrays, threads: int) -> Runner:
        """The best NumPy for the table: per call the (q, k) distances k_pos - q_pos
        (exact integers; 1/heads of the output), then one broadcast multiply by the
        slopes straight into out; float32 arithmetic, float64 for float64 out."""
        out0 = arrays["out"]
        heads, q, k = out0.shape
        work = _work_dtype(out0.dtype)
        slopes = _slopes(heads, work)[:, None, None]
        kpos = np.arange(k, dtype=work)
        qpos = (np.arange(q, dtype=work) + work.type(k - q))[:, None]

        def run(a: Arrays) -> tuple:
            dist = kpos - qpos
            np.multiply(slopes, dist, out=a["out"], casting="same_kind")
            return (a["out"],)
        return run

    return [
        Workload(name="alibi-prefill", family="alibi",
                 title=f"add_alibi(scores {prefill}, causal) (BLOOM)",
                 make=make_scores(prefill), inplace=("scores",), result=("scores",),
                 floor="stream",
                 impls={"fastpe": fastpe_add(True), "reference": reference_add(True),
                        "numpy": numpy_prefill},
                 numpy_note="scores += a cached masked (heads, q, k) bias: one in-place add",
                 params=dict(causal=True)),
        Workload(name="alibi-bias", family="alibi", title=f"alibi_bias({h}, {s}, {s}, out=buf)",
                 make=lambda dtype: {"out": np.zeros((h, s, s), dtype)}, inplace=(),
                 result=("out",), floor="fill",
                 impls={"fastpe": fastpe_bias, "reference": reference_bias,
                        "numpy": numpy_bias},
                 numpy_note="(q, k) distances, then one broadcast multiply by the slopes "
                            "into out"),
        Workload(name="alibi-decode", family="alibi", title=f"add_alibi(scores {decode})",
                 make=make_scores(decode), inplace=("scores",), result=("scores",),
                 floor="stream",
                 impls={"fastpe": fastpe_add(False), "reference": reference_add(False),
                        "numpy": numpy_decode},
                 numpy_note="distances from a cached arange, times the slopes into a "
                            "preallocated bias, one add",
                 per_call=True, params=dict(causal=False)),
    ]


def workloads(size: str = "full") -> list[Workload]:
    """Every workload, in the order the command line prints them. ALiBi appears when
    this fastpe has it."""
    sz = SIZES[size]
    rope = rope_workloads(sz) + mrope_workloads(sz)
    return [*rope, _table_workload(sz), _add_sinusoidal_workload(sz), _learned_workload(sz),
            *alibi_workloads(sz)]


# ---- interleaved timing (the command line) ------------------------------------------------

@dataclasses.dataclass
class Timing:
    median: float          # seconds per call
    samples: list[float]   # seconds per call, one per round
    number: int            # calls per sample


def _time_calls(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def measure(runners: Mapping[str, Callable[[], object]], *, rounds: int, min_rounds: int = 3,
            sample_s: float = 0.01, budget_s: float = 5.0,
            progress: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Median seconds per call of each runner, measured side by side.

    Each round runs every runner once, in an order rotated by one each round (so none
    always follows the same neighbour); a sample is `number` back-to-back calls, with
    `number` calibrated so a sample takes about `sample_s`. Stops after `rounds` rounds,
    or after `min_rounds` once `budget_s` is spent. The garbage collector is off while
    timing. The runners must already have run once (warm-up)."""
    names = list(runners)
    number = {}
    for name in names:
        once = _time_calls(runners[name], 1)
        number[name] = max(1, min(100_000, int(sample_s / max(once, 1e-9))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            if progress is not None:
                progress(f"round {r + 1}/{rounds}")
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                samples[name].append(_time_calls(runners[name], number[name]))
            if r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    return {n: Timing(statistics.median(samples[n]), samples[n], number[n]) for n in names}


# Rounds, seconds per sample and seconds per workload for each mode of the command line.
MODES = {
    "default": dict(rounds=21, min_rounds=7, sample_s=0.03, budget_s=5.0),
    "quick": dict(rounds=9, min_rounds=5, sample_s=0.004, budget_s=0.8),
}


def run_workload(wl: Workload, dtype, threads: int, *, mode: dict,
                 progress: Callable[[str], None] | None = None,
                 check_elements: int = 1 << 22) -> dict:
    """Time fastpe, numpy and the floor side by side on one workload. fastpe works on
    the arrays `make` built, numpy on a copy, the floor on fastpe's arrays (the same
    bytes). Their first calls, on pristine inputs, warm up and check fastpe against
    numpy (about `check_elements` of each result). Returns one JSON-ready record."""
    dtype = np.dtype(dtype)
    if progress is not None:
        progress("preparing")
    base = wl.make(dtype)
    arrays = {"fastpe": base, "numpy": copy_arrays(base, wl.written), "floor": base}
    prepared = {"fastpe": wl.impls["fastpe"](base, threads),
                "numpy": wl.impls["numpy"](arrays["numpy"], 1),
                "floor": wl.prepare_floor()(base, threads)}
    if progress is not None:
        progress("checking")
    got = {n: prepared[n](arrays[n]) for n in ("fastpe", "numpy")}
    atol = max(wl.atol.get("fastpe", 0.0), wl.atol.get("numpy", 0.0))
    problems = []
    for name, mine, theirs in zip(wl.result, got["fastpe"], got["numpy"]):
        msg = compare(mine, theirs, dtype, atol=atol, max_elements=check_elements)
        if msg is not None:
            problems.append(f"{name}: fastpe and numpy {msg}")
    del got
    prepared["floor"](base)
    runners = {n: functools.partial(prepared[n], arrays[n]) for n in prepared}
    timings = measure(runners, progress=progress, **mode)
    t = {n: timings[n].median for n in timings}
    traffic = wl.traffic_bytes(base)
    return {
        "name": wl.name,
        "family": wl.family,
        "title": wl.title,
        "dtype": dtype.name,
        "shapes": {n: list(a.shape) for n, a in base.items()},
        "bytes": wl.floor_bytes(base),
        "floor": wl.floor,
        "numpy_baseline": wl.numpy_note,
        "per_call": wl.per_call,
        "threads": {"fastpe": threads, "numpy": 1, "floor": threads},
        "seconds": t,
        "seconds_min": {n: min(timings[n].samples) for n in timings},
        "samples": {n: timings[n].samples for n in timings},
        "calls_per_sample": {n: timings[n].number for n in timings},
        "rounds": len(timings["fastpe"].samples),
        "speedup_vs_numpy": t["numpy"] / t["fastpe"],
        "fraction_of_floor": t["floor"] / t["fastpe"],
        "fastpe_gb_per_s": traffic / t["fastpe"] / 1e9,
        "floor_gb_per_s": traffic / t["floor"] / 1e9,
        "check": "ok" if not problems else "; ".join(problems),
    }


def select(all_workloads: list[Workload], only: str | None) -> list[Workload]:
    """Workloads whose name contains any of the comma-separated patterns."""
    if not only:
        return all_workloads
    pats = [p.strip() for p in only.split(",") if p.strip()]
    return [w for w in all_workloads if any(p in w.name for p in pats)]
