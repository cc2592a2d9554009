"""What every part of the bench shares: sizes, input data, the Workload record and
the comparison of results."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

Arrays = dict[str, np.ndarray]
Result = tuple[np.ndarray | None, ...]
Runner = Callable[[Arrays], Result]
Prepare = Callable[[Arrays, int], Runner]
# a contender that may decline: None when it cannot run on these arrays (a dtype, a layout)
MaybePrepare = Callable[[Arrays, int], "Runner | None"]

DTYPES = ("float32", "float16")

# ---- sizes --------------------------------------------------------------------------------

# The canonical shapes: LLaMA-7B attention (32 heads of 128) at 2048
# tokens, Llama-3-8B (GQA: 8 KV heads, rope_theta 500000, llama3 scaling), BLOOM-like ALiBi
# (32 heads, 2048 tokens), an (8, 2048, 1024) embedding batch, an (8192, 1024) table,
# DeBERTa-v3-base's disentangled attention (12 heads, 512 tokens, position_buckets 256,
# max_relative_positions 512).
# the shapes of each workload (ints, and tuples of ints)
Size = dict[str, Any]
FULL: Size = dict(batch=1, seq=2048, heads=32, kv_heads=8, head_dim=128, decode_pos=4095,
            decode_batch=32, table=(8192, 1024), embed=(8, 2048, 1024), max_len=4096,
            alibi_heads=32, alibi_seq=2048, alibi_keys=4096,
            deberta=dict(heads=12, seq=512, position_buckets=256, max_relative_positions=512),
            t5=dict(batch=4, heads=12, keys=512),
            llama=dict(vocab=8192, hidden=512, layers=4, heads=8, kv_heads=2, head_dim=64,
                       intermediate=1408, max_len=1024, batch=4, lengths=(1000, 733, 517, 301)))
# A few kilobytes each: for the tests of the command line and of the baselines.
TINY: Size = dict(batch=1, seq=48, heads=4, kv_heads=2, head_dim=32, decode_pos=4095,
            decode_batch=3, table=(40, 33), embed=(2, 24, 20), max_len=64,
            alibi_heads=3, alibi_seq=24, alibi_keys=40,
            deberta=dict(heads=2, seq=16, position_buckets=8, max_relative_positions=24),
            t5=dict(batch=2, heads=3, keys=40),
            llama=dict(vocab=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                       intermediate=48, max_len=16, batch=4, lengths=(15, 11, 7, 3)))
# --quick: the canonical shapes, but ALiBi prefill and bias over 1024 tokens (128 MiB of
# scores, still four times a large L3): at 2048 tokens (512 MiB) their set-up and check
# alone (page faults of each copy, the reference's pass) take longer than the quick run.
QUICK: Size = {**FULL, "alibi_seq": 1024}
SIZES: dict[str, Size] = {"full": FULL, "quick": QUICK, "tiny": TINY}

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA3_BASE = 500000.0


# ---- data ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _noise() -> np.ndarray:
    # A prime length, so the repeated block does not line up with rows or heads.
    return np.random.default_rng(20240601).standard_normal(65521).astype(np.float32)


def random_array(shape: tuple[int, ...], dtype: DTypeLike, scale: float = 1.0) -> np.ndarray:
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


# ---- comparing results --------------------------------------------------------------------

# (atol, rtol), relative to the result's largest finite magnitude and to each value. These
# check that a benchmark computes the right thing; tests/ checks accuracy. float16 allows a
# few ulp: NumPy baselines round after each operation (bfloat16 likewise, 8 ulp).
TOLERANCE = {"float64": 1e-10, "float32": 2e-6, "float16": 4e-3, "bfloat16": 3e-2}


def compare(actual: object, expected: object, dtype: DTypeLike, *, atol: float = 0.0,
            offset_per_row: bool = False, chunk: int = 1 << 22,
            max_elements: int | None = None) -> str | None:
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
    family: str          # "sinusoidal" | "learned" | "rope" | "alibi" | "relative" |
    #                      "program"
    title: str           # human-readable, with the shapes
    make: Callable[[np.dtype], Arrays]
    inplace: tuple[str, ...]          # arrays read and written in place
    result: tuple[str, ...]           # arrays holding the result: the floor's bytes
    floor: str                        # "stream" (in-place pass), "fill" (a table) or
    #                                   "none" (a whole program: no single pass to compare)
    impls: dict[str, Prepare]         # fastpe, reference, numpy (and textbook)
    numpy_note: str                   # what the NumPy baseline does, in one line
    peers: dict[str, MaybePrepare] = dataclasses.field(default_factory=dict)  # other libraries
    #                                             (peers.py), timed beside fastpe
    per_call: bool = False            # a small call: report microseconds
    atol: dict[str, float] = dataclasses.field(default_factory=dict)  # extra, per impl
    offset_per_row: set[str] = dataclasses.field(default_factory=set)  # equal up to a per-row
    #                                             constant (BLOOM's ALiBi form)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)  # the call's arguments, for
    #                                             implementations added elsewhere (bench/)
    # A part of each written array that the reference computes on its own (every 4th
    # head: RoPE rotates each head alike, ALiBi biases each head by its own slope; every
    # 4th sequence of a batch of embeddings), for a check that costs a fraction of the
    # reference's pass; empty: all of it.
    check_index: Mapping[str, tuple[slice, ...]] = dataclasses.field(default_factory=dict)
    check_reference: Prepare | None = None  # that part's reference, if not impls["reference"]
    dtypes: tuple[str, ...] = ("float16", "float32", "float64")  # those it runs in
    inner: str | None = None          # a part its runners time inside each call (their
    #                                   `inner_seconds`, accumulated): "RoPE" in a program
    reads: tuple[str, ...] = ()       # arrays the call only reads, all of whose bytes the
    #                                   floor reads too (DeBERTa's logit tables; a view of
    #                                   the rows of a learned table that the call adds)

    @property
    def written(self) -> tuple[str, ...]:
        """Every array a call writes: each implementation needs its own."""
        return tuple(dict.fromkeys(self.inplace + self.result))

    def floor_bytes(self, arrays: Arrays) -> int:
        return sum(arrays[n].nbytes for n in self.result)

    def traffic_bytes(self, arrays: Arrays) -> int:
        """Bytes the floor moves: read + write for a stream (and a read of each array in
        `reads`), write for a fill."""
        if self.floor == "none":
            return 0
        moved = self.floor_bytes(arrays) * {"stream": 2, "fill": 1}[self.floor]
        return moved + sum(arrays[n].nbytes for n in self.reads)

    def part(self, name: str, result: object) -> np.ndarray:
        """The part of result array `name` that the check compares."""
        a = np.asarray(result)
        return a[self.check_index[name]] if name in self.check_index else a

    def expected(self, arrays: Arrays) -> tuple[np.ndarray, ...]:
        """The reference result's checked part, computed on that part of copies of
        `arrays`."""
        fresh = copy_arrays(arrays, self.written)
        view = {n: self.part(n, v) if n in self.written else v for n, v in fresh.items()}
        reference = self.check_reference or self.impls["reference"]
        return tuple(np.array(r) for r in reference(view, 1)(view))


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The arithmetic dtype a careful NumPy user picks: float32 for half floats."""
    return np.dtype(np.float64) if np.dtype(dtype).itemsize == 8 else np.dtype(np.float32)


