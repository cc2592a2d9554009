"""Shared helpers of fastpe's test suite.

- ``pytest_report_header``: the first lines of every run say which fastpe is
  under test (path, backend, ISA, OpenMP, threads), so a run on the NumPy
  fallback cannot go unnoticed; ``test_backend.py::test_compiled_backend_guard``
  makes such a run fail unless FASTPE_BACKEND=numpy asked for it.
- ``awkward_arrays``: one generator of awkward inputs (strided, reversed,
  Fortran, byte-swapped, unaligned, empty, single element), as in bottleneck's
  tests/util.py; ``make_awkward`` builds one of them by label, so a test can
  make identical twins for the compiled and the reference backend.
- ``tolerance`` / ``assert_close``: per-dtype comparison of a result with the
  reference backend or an exact float64 value; ``pe_exact``: that exact value
  for sinusoidal encodings, written from the formula, not from fastpe's code.
- ``make_positions``: every form positions/offset take.
- ``both_threads``: num_threads 1 and 2, with the threaded path really taken.
- ``run_python`` / ``isa_runs``: fresh interpreters for environment variables
  that are only read at import (FASTPE_BACKEND, FASTPE_ISA, OMP_NUM_THREADS).
- hypothesis profiles "default" (fast, derandomized) and "fuzz" (over 10,000 examples)
  for tests/test_fuzz.py; tests marked ``slow`` are skipped unless ``-m slow`` or
  FASTPE_SLOW=1 asks for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fastpe

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - the test extra installs it
    settings = None

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - optional dependency
    ml_dtypes = None

# ---- hypothesis profiles -----------------------------------------------------------------
#
# tests/test_fuzz.py's property tests run under one of these, chosen by
# HYPOTHESIS_PROFILE=<name> or pytest's --hypothesis-profile=<name> (which wins):
#   default  a few dozen examples per test (a few hundred in all), derandomized: the same
#            examples every run, no example database written; part of the default suite.
#   fuzz     1,500 examples per test (over 10,000 in all) from a fresh random seed, failures
#            saved in .hypothesis/ and replayed first next time:
#            HYPOTHESIS_PROFILE=fuzz pytest tests/test_fuzz.py --hypothesis-show-statistics
# No deadline in either: the first call of a thread team or a large draw can take longer
# than hypothesis' 200 ms default without anything being wrong.

FUZZ_EXAMPLES_PER_TEST = 1500

if settings is not None:
    _quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # "fuzz" first: a profile inherits from the default one at registration, and ours
    # derandomizes and has no database
    settings.register_profile("fuzz", max_examples=FUZZ_EXAMPLES_PER_TEST, deadline=None,
                              derandomize=False, print_blob=True, suppress_health_check=_quiet)
    settings.register_profile("default", max_examples=40, deadline=None, derandomize=True,
                              database=None, print_blob=True, suppress_health_check=_quiet)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# ---- dtypes ------------------------------------------------------------------------------

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None


def is_bf16(dtype) -> bool:
    """dtype is bfloat16 (never true without ml_dtypes: np.dtype(x) == None is float64!)."""
    return BF16 is not None and dtype == BF16

FLOAT_DTYPES = [F16, F32, F64] + ([BF16] if BF16 is not None else [])
DTYPE_IDS = [str(d) for d in FLOAT_DTYPES]

REQUESTED_BACKEND = os.environ.get("FASTPE_BACKEND", "").strip().lower()
COMPILED = fastpe.info()["compiled"]
# .ci/sanitize preloads AddressSanitizer's runtime: its quarantine keeps freed memory
# (RSS grows whatever the code does) and its shadow memory reserves terabytes of
# address space, so memory limits and RSS checks mean nothing under it.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
PACKAGE_ROOT = Path(fastpe.__file__).resolve().parent.parent
# the folder holding tests/: the source tree, or where tests/ and bench/ were copied to
# test an installed fastpe (PACKAGE_ROOT is then site-packages)
TREE_ROOT = Path(__file__).resolve().parent.parent


def dtype_name(dtype: np.dtype) -> str:
    """'float32', 'bfloat16', or '>f4' style for a non-native byte order."""
    return str(dtype) if dtype.isnative else dtype.str


def as_f64(a) -> np.ndarray:
    """Any float array (bfloat16, byte-swapped, strided) as native float64 values; NaNs
    stay NaNs (ml_dtypes warns on casting one)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(a).astype(np.float64)


def describe(a: np.ndarray) -> str:
    """dtype, shape, strides and flags of an array, for failure messages."""
    order = "C" if a.flags.c_contiguous else "F" if a.flags.f_contiguous else "non-contiguous"
    return (f"dtype={dtype_name(a.dtype)} shape={a.shape} strides={a.strides} {order}"
            f"{'' if a.flags.aligned else ' unaligned'}")


# ---- tolerances --------------------------------------------------------------------------
#
# (atol, rtol) for comparing a result with the reference backend or with an exact float64
# value, both converted to float64: |actual - expected| <= atol * magnitude + rtol * |expected|,
# where `magnitude` is the size of the operands (max |x * scale| + 1 for add_sinusoidal;
# 1 for a table, whose values are in [-1, 1]). The absolute term is needed because
# x * scale + PE can cancel to a value much smaller than its operands, whose rounding
# errors are still those of the operands.
#
# float64: 1e-12. Both backends form angles in float64; the compiled one evaluates sin/cos
#   with its own polynomial (about one double ulp) and advances consecutive positions by
#   angle addition (up to 31 steps between exact reseeds, each a few ulp). That is below
#   1e-14 for small positions; 1e-12 leaves room for compiler reassociation but still
#   catches a wrong frequency, sign or column (errors of order 1e-3 or more). For large
#   positions the angle itself is uncertain by a few ulp(p): see angle_atol, which the
#   comparisons add through max_position=.
# float32: 4 ulp (4 * 2^-23 relative). Rounding the float64 encoding to float32 (0.5 ulp),
#   x * scale (0.5 ulp) and the sum (0.5 ulp) can land differently when the compiler fuses
#   x * scale + pe into one FMA; four ulp bounds every such combination.
# float16 / bfloat16: one ulp of the storage type relative (2^-10 / 2^-7), plus an absolute
#   term of a few float32 ulp (the float32 arithmetic before the final rounding) and, for
#   float16, one subnormal ulp (2^-24): the two backends compute in float32 and round once,
#   but may round differently where the float32 values straddle a half-way point, or round
#   through float32 (double rounding) where the reference rounds float64 directly.
_F32_FEW_ULP = 4 * 2.0**-23
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-12, 1e-12),
    "float32": (_F32_FEW_ULP, _F32_FEW_ULP),
    "float16": (2.0**-24 + _F32_FEW_ULP, 2.0**-10),
    "bfloat16": (_F32_FEW_ULP, 2.0**-7),
}

# One ulp of the storage type at 1.0, for the "within one storage ulp of exact" checks.
STORAGE_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10,
               "bfloat16": 2.0**-7}


def storage_name(dtype: np.dtype) -> str:
    return str(dtype.newbyteorder("=")) if dtype.kind == "f" else str(dtype)


def tolerance(dtype, magnitude: float = 1.0) -> tuple[float, float]:
    """(atol, rtol) for results stored in `dtype` whose operands are about `magnitude`."""
    dtype = np.dtype(dtype)
    name = storage_name(dtype) if not is_bf16(dtype) else "bfloat16"
    atol, rtol = TOLERANCES[name]
    return atol * magnitude, rtol


def angle_atol(max_position: float) -> float:
    """Extra absolute tolerance for sin/cos at positions up to `max_position`.

    In float64 the angle p * w is only known to about one ulp of p * w (and w to a few
    ulp of itself, by whichever formula makes it), so two correct implementations differ
    by a few ulp(p) in the angle, hence in sin/cos: about 2e-16 * p, which passes 1e-12
    from p ~ 4000 on. 8 half-ulp of p covers the rounding of w, of p * w on both sides,
    and the angle-addition steps between reseeds."""
    return 8 * max(float(max_position), 1.0) * 2.0**-53


def assert_close(actual, expected, dtype, *, magnitude: float = 1.0, context: str = "",
                 atol: float | None = None, rtol: float | None = None,
                 max_position: float = 0.0) -> None:
    """Compare in float64 with the per-dtype tolerance; NaN only matches NaN.
    `max_position` adds angle_atol(max_position) to the absolute tolerance.

    The failure message names `context` (function, dtype, shape, layout), the number of
    elements out of tolerance, and the worst one with its index.
    """
    a, e = as_f64(actual), as_f64(expected)
    assert a.shape == e.shape, f"{context}: shape {a.shape} != expected {e.shape}"
    dt_atol, dt_rtol = tolerance(dtype, magnitude)
    atol = (dt_atol if atol is None else atol) + (angle_atol(max_position) if max_position else 0)
    rtol = dt_rtol if rtol is None else rtol
    with np.errstate(invalid="ignore"):
        err = np.abs(a - e)
        ok = (err <= atol + rtol * np.abs(e)) | (np.isnan(a) & np.isnan(e))
    if ok.all():
        return
    bad = np.argwhere(~ok)
    excess = np.where(ok, -np.inf, np.nan_to_num(err, nan=np.inf) - rtol * np.abs(e))
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    raise AssertionError(
        f"{context}: {len(bad)} of {a.size} elements differ beyond atol={atol:.3g} "
        f"rtol={rtol:.3g} (dtype {dtype_name(np.dtype(dtype))}); worst at index "
        f"{tuple(int(i) for i in worst)}: got {a[worst]!r}, expected {e[worst]!r}; "
        f"first bad indices {[tuple(map(int, b)) for b in bad[:5]]}")


def entry_callers(monkeypatch, name: str) -> list[tuple[str, object]]:
    """Spy on the compiled entry `name` for the test: the list, filled as calls come, of
    (the calling function's name, what the entry returned)."""
    kern = fastpe._backend.compiled
    real = getattr(kern, name)
    callers: list[tuple[str, object]] = []

    def spy(*args):
        done = real(*args)
        callers.append((sys._getframe(1).f_code.co_name, done))
        return done

    monkeypatch.setattr(kern, name, spy)
    return callers


def teams_asked(monkeypatch, team: int | None = None) -> list[tuple[object, int]]:
    """Spy on the thread policy (fastpe._threads.resolve) for the test: the list, filled
    as calls come, of the (num_threads, bytes) each call asks a team for; the policy
    answers `team`, or its own answer when None."""
    real = fastpe._threads.resolve
    asked: list[tuple[object, int]] = []

    def spy(num_threads, nbytes):
        asked.append((num_threads, nbytes))
        return real(num_threads, nbytes) if team is None else team

    monkeypatch.setattr(fastpe._threads, "resolve", spy)
    return asked


def kernel_copies(monkeypatch) -> list[int]:
    """Spy on fastpe._checks.kernel_view for the test: the list, filled as calls come, of
    the row counts of the 2-D arrays (tables, caches) it copies for the kernels."""
    real = fastpe._checks.kernel_view
    copied: list[int] = []

    def spy(a):
        out = real(a)
        if out is not a and a.ndim == 2:
            copied.append(a.shape[0])
        return out

    monkeypatch.setattr(fastpe._checks, "kernel_view", spy)
    return copied


def unaddressable(values: np.ndarray, kind: str) -> np.ndarray:
    """values in an array the kernels cannot address: "byteswapped" (the other byte
    order) or "unaligned" (a view into a uint8 buffer at byte offset 1)."""
    if kind == "byteswapped":
        return values.astype(values.dtype.newbyteorder())
    raw = np.empty(values.nbytes + 1, np.uint8)
    a = raw[1:].view(values.dtype).reshape(values.shape)
    a[...] = values
    assert not a.flags.aligned
    return a


def assert_bytes_equal(actual: np.ndarray, expected: np.ndarray, context: str = "") -> None:
    """Bit-identical values (NaN payloads and signed zeros included)."""
    a, e = np.ascontiguousarray(actual), np.ascontiguousarray(expected)
    assert a.dtype == e.dtype and a.shape == e.shape, (
        f"{context}: {dtype_name(a.dtype)}{a.shape} vs {dtype_name(e.dtype)}{e.shape}")
    ab = a.view(np.uint8).reshape(a.shape + (-1,)) if a.size else a
    eb = e.view(np.uint8).reshape(e.shape + (-1,)) if e.size else e
    if a.size and not np.array_equal(ab, eb):
        diff = np.argwhere((ab != eb).any(axis=-1))
        first = tuple(int(i) for i in diff[0])
        raise AssertionError(
            f"{context}: {len(diff)} of {a.size} elements are not bit-identical; first at "
            f"{first}: {as_f64(a[first])!r} vs {as_f64(e[first])!r}")


HALF_DTYPES = [F16] + ([BF16] if BF16 is not None else [])


def half_edge_operands(dtype) -> tuple[np.ndarray, np.ndarray]:
    """(x, t), each (2, 65536) of a 16-bit float type: x is every bit pattern twice
    (signed zeros, subnormals, infinities, every NaN payload); t is first a shuffle of
    all the patterns, then half an ulp of x, of either sign for odd and even x alike,
    so that float32 sums fall on ties, round up across powers of two and overflow."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    x = bits.view(dtype)
    shuffled = np.random.default_rng(5).permutation(bits).view(dtype)
    mantissa_bits = 10 if dtype == F16 else 7
    with np.errstate(invalid="ignore"):
        _, exp = np.frexp(as_f64(x))
    sign = np.where(bits % 4 < 2, 1.0, -1.0)
    half_ulp = (sign * np.ldexp(1.0, exp - 2 - mantissa_bits)).astype(dtype)
    return np.stack([x, x]), np.stack([shuffled, half_ulp])


def f32_fused_multiply_add(a: np.ndarray, scale: float, b: np.ndarray) -> np.ndarray:
    """a * scale + b for float32 a and b, rounded once to float32 (a fused multiply-add):
    the product is exact in float64, the sum is exact as float64 plus an error term, and
    the error term breaks the ties that rounding the float64 sum alone would get wrong."""
    p = a.astype(np.float64) * np.float64(np.float32(scale))
    q = b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + q
        back = s - p
        err = (p - (s - back)) + (q - back)
        r = s.astype(np.float32)
        beyond = np.nextafter(r, np.where(s > r, np.inf, -np.inf).astype(np.float32))
        tie = (s != r) & (s - r == beyond.astype(np.float64) - s)
        s = np.where(tie & (err != 0), np.nextafter(s, s + err), s)
        return s.astype(np.float32)


def snapshot(a: np.ndarray) -> tuple:
    """Everything about an array a failed call must leave as it was."""
    return (a.dtype, a.shape, a.strides, bool(a.flags.writeable),
            np.ascontiguousarray(a).view(np.uint8).tobytes())


# ---- exact sinusoidal encodings (independent of fastpe's code) ---------------------------


def inv_freq_pow(dim: int, base: float = 10000.0) -> np.ndarray:
    """w_i = base ** (-2i / dim) for i < ceil(dim / 2), by the power form (fastpe and the
    seed use exp(2i * -ln(base) / dim); the two agree to a few float64 ulp)."""
    i = np.arange((dim + 1) // 2, dtype=np.float64)
    return np.float64(base) ** (-2.0 * i / dim)


def pe_exact(positions, dim: int, *, base: float = 10000.0,
             layout: str = "interleaved") -> np.ndarray:
    """float64 PE rows for integer `positions` (any shape): shape positions.shape + (dim,).

    interleaved: column 2i = sin(p w_i), 2i + 1 = cos(p w_i); an odd dim ends on a sine.
    split: the ceil(dim / 2) sines, then the dim // 2 cosines.
    """
    p = np.asarray(positions, dtype=np.float64)[..., None]
    ang = p * inv_freq_pow(dim, base)
    s, c = np.sin(ang), np.cos(ang[..., : dim // 2])
    out = np.empty(p.shape[:-1] + (dim,))
    if layout == "interleaved":
        out[..., 0::2], out[..., 1::2] = s, c
    else:
        out[..., : s.shape[-1]], out[..., s.shape[-1]:] = s, c
    return out


# ---- positions ---------------------------------------------------------------------------

# The forms `positions=` / `offset=` take (DESIGN.md, Conventions).
POSITION_FORMS = ("none", "offset", "shared", "per-row", "one-row", "unsorted")


def make_positions(form: str, batch: int, seq: int, *, high: int = 1000, offset: int = 7,
                   seed: int = 0):
    """(positions argument, offset argument, the (batch, seq) int64 positions they mean).

    none: arange(seq); offset: offset + arange(seq); shared: (seq,) random in [0, high);
    per-row: (batch, seq) random; one-row: (1, seq) random; unsorted: (seq,) descending
    with repeats (reseeding and non-consecutive steps)."""
    rng = np.random.default_rng([seed, batch, seq, high])
    if form == "none":
        return None, 0, np.broadcast_to(np.arange(seq), (batch, seq))
    if form == "offset":
        return None, offset, np.broadcast_to(offset + np.arange(seq), (batch, seq))
    if form == "shared":
        pos = rng.integers(0, high, seq)
        return pos, 0, np.broadcast_to(pos, (batch, seq))
    if form == "per-row":
        pos = rng.integers(0, high, (batch, seq))
        return pos, 0, pos
    if form == "one-row":
        pos = rng.integers(0, high, (1, seq)).astype(np.uint16)
        return pos, 0, np.broadcast_to(pos, (batch, seq))
    if form == "unsorted":
        pos = (np.arange(seq)[::-1] // 2 + 3).astype(np.int32)
        return pos, 0, np.broadcast_to(pos, (batch, seq))
    raise ValueError(form)


# ---- awkward arrays ----------------------------------------------------------------------

# Every label make_awkward knows, in the order awkward_arrays yields them.
AWKWARD_KINDS = (
    "contiguous",     # C order
    "fortran",        # transposed, copied, transposed back: F order
    "strided-last",   # big[..., ::2]: non-unit stride on the feature axis
    "strided-rows",   # big[:, ::2, 1:-2]-style: rows of a bigger buffer, padded
    "reversed",       # big[::-1, ..., ::-1]: negative steps on every axis
    "seq-major",      # (seq, batch, dim) memory seen as (batch, seq, dim); 3-D only
    "byteswapped",    # .astype(dtype.newbyteorder()); not for bfloat16 (no such dtype)
    "unaligned",      # a view into a uint8 buffer at byte offset 1
    "odd-byte-stride",  # rows one byte apart from a multiple of the item size
    "empty",          # seq = 0
    "single",         # every axis 1
)


def awkward_kinds(shape: tuple[int, ...], dtype) -> list[str]:
    """The labels that make sense for this shape and dtype."""
    dtype = np.dtype(dtype)
    kinds = list(AWKWARD_KINDS)
    if len(shape) != 3:
        kinds.remove("seq-major")
    if is_bf16(dtype):  # ml_dtypes has no byte-swapped bfloat16: newbyteorder gives V2
        kinds.remove("byteswapped")
    if dtype.itemsize == 1:  # nothing is unaligned for one-byte items
        kinds.remove("unaligned")
        kinds.remove("odd-byte-stride")
    return kinds


def logical_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if kind == "empty":
        return shape[:-2] + (0,) + shape[-1:]
    if kind == "single":
        return (1,) * len(shape)
    return tuple(shape)


def awkward_values(shape: tuple[int, ...], dtype, seed: int = 0, low: float = -2.0,
                   high: float = 2.0) -> np.ndarray:
    """The values every layout of make_awkward holds, as a C-contiguous array of `dtype`
    (each value rounded to the storage type once)."""
    rng = np.random.default_rng([seed, *shape])
    return rng.uniform(low, high, shape).astype(np.dtype(dtype))


def make_awkward(kind: str, shape: tuple[int, ...], dtype, *, seed: int = 0,
                 low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """A writable array of `dtype` laid out as `kind`, holding awkward_values(...)
    of the kind's logical shape. Deterministic: two calls give identical twins."""
    dtype = np.dtype(dtype)
    shape = logical_shape(kind, tuple(shape))
    values = awkward_values(shape, dtype, seed, low, high)
    nd = len(shape)
    if kind in ("contiguous", "empty", "single"):
        a = values.copy()
    elif kind == "fortran":
        a = values.T.copy().T
    elif kind == "strided-last":
        big = np.full(shape[:-1] + (2 * shape[-1] + 1,), 7, dtype)
        a = big[..., 1::2]
    elif kind == "strided-rows":
        big = np.full(shape[:-2] + (2 * shape[-2] + 1, shape[-1] + 3), 7, dtype)
        a = big[..., 1::2, 1:-2]
    elif kind == "reversed":
        big = np.empty(shape, dtype)
        a = big[(slice(None, None, -1),) * nd]
    elif kind == "seq-major":
        a = np.empty((shape[1], shape[0], shape[2]), dtype).transpose(1, 0, 2)
    elif kind == "byteswapped":
        a = values.astype(dtype.newbyteorder())
    elif kind == "unaligned":
        buf = np.zeros(values.size * dtype.itemsize + 1, np.uint8)
        a = buf[1:].view(dtype).reshape(shape)
        assert not a.flags.aligned or a.size == 0
    elif kind == "odd-byte-stride":
        # rows 1 byte further apart than packed ones: strides not a multiple of itemsize
        row = shape[-1] * dtype.itemsize + 1
        strides = [row, dtype.itemsize]
        for n in reversed(shape[1:-1]):
            strides.insert(0, strides[0] * n)
        strides = strides[-nd:]
        buf = np.zeros(max(int(np.prod(shape[:-1])), 1) * row + 8, np.uint8)
        a = np.ndarray(shape, dtype=dtype, buffer=buf, strides=tuple(strides))
        assert any(s % dtype.itemsize for s in a.strides)
    else:
        raise ValueError(f"unknown awkward kind {kind!r}")
    if kind not in ("contiguous", "empty", "single", "fortran", "byteswapped"):
        a[...] = values
    assert a.flags.writeable and a.shape == shape
    return a


def awkward_arrays(shape: tuple[int, ...], dtype, **kw) -> Iterator[tuple[str, np.ndarray]]:
    """(label, array) for every awkward layout of `shape` and `dtype`."""
    for kind in awkward_kinds(shape, dtype):
        yield kind, make_awkward(kind, shape, dtype, **kw)


def awkward_params(shapes, dtypes=FLOAT_DTYPES, marks=None):
    """pytest params (kind, shape, dtype) with ids like 'float32-3x67x10-strided-last'.

    `marks` maps a kind, or a (kind, dtype name) pair, to the marks its params get. The
    size kinds (empty, single) derive their own shape, so they come once per dtype and
    number of dimensions, with the first shape of that rank."""
    marks = marks or {}
    out = []
    for dtype in dtypes:
        seen_ranks = set()
        for shape in shapes:
            first_of_rank = len(shape) not in seen_ranks
            seen_ranks.add(len(shape))
            for kind in awkward_kinds(shape, dtype):
                if kind in ("empty", "single") and not first_of_rank:
                    continue
                m = marks.get(kind, ()), marks.get((kind, str(np.dtype(dtype))), ())
                out.append(pytest.param(kind, tuple(shape), np.dtype(dtype),
                                        id=f"{dtype}-{'x'.join(map(str, shape))}-{kind}",
                                        marks=[mk for group in m for mk in
                                               (group if isinstance(group, (list, tuple))
                                                else [group])]))
    return out


# ---- threads -----------------------------------------------------------------------------


@pytest.fixture(params=[1, 2], ids=["threads=1", "threads=2"])
def both_threads(request, monkeypatch):
    """num_threads 1 and 2. fastpe runs calls under 4 MiB serially whatever num_threads
    says (an OpenMP region costs more than the work); for 2 the fixture lowers that
    threshold to 0 so that the small arrays of these tests really are split between two
    threads (when they have at least two 32-token blocks)."""
    if request.param > 1:
        monkeypatch.setattr(fastpe._threads, "SERIAL_BYTES", 0)
    return request.param


@pytest.fixture(params=["integer", "hardware"])
def bf16_narrowing(request):
    """bfloat16 results rounded from float32 in integers, and by VCVTNE2PS2BF16 where the
    kernels have it (AVX512_BF16 in the wide variants; skipped elsewhere): both must give
    the same bits, so the tests that take this run under each."""
    from fastpe import _backend

    kern = _backend.compiled
    if kern is None or not hasattr(kern, "bf16_hardware_narrowing"):
        if request.param == "hardware":
            pytest.skip("no compiled kernels")
        yield request.param
        return
    was = kern.bf16_hardware_narrowing()
    if request.param == "hardware" and not kern.bf16_hardware_narrowing(True):
        kern.bf16_hardware_narrowing(was)
        pytest.skip("no AVX512_BF16 narrowing in these kernels on this CPU")
    kern.bf16_hardware_narrowing(request.param == "hardware")
    try:
        yield request.param
    finally:
        kern.bf16_hardware_narrowing(was)


@pytest.fixture
def threaded(monkeypatch):
    """Lower the serial threshold for one test (see both_threads)."""
    monkeypatch.setattr(fastpe._threads, "SERIAL_BYTES", 0)


@pytest.fixture(autouse=True)
def _restore_num_threads():
    """No test leaks a set_num_threads() into the next."""
    yield
    fastpe.set_num_threads(None)


needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")


# ---- subprocesses ------------------------------------------------------------------------


def clean_env(**overrides: str | None) -> dict[str, str]:
    """os.environ without fastpe's and OpenMP's variables, plus `overrides` (None removes),
    with the fastpe under test first on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FASTPE_", "OMP_", "GOMP_", "KMP_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def floats_past_a_boundary(size: int, shift: int, fill: float) -> tuple[np.ndarray, int]:
    """A float32 buffer of `fill` with room for `size` floats starting `shift` (0 to 7)
    floats past a 32-byte boundary, and that start."""
    buf = np.full(size + 16, fill, np.float32)
    return buf, (-(buf.ctypes.data // 4)) % 8 + shift


def run_python(code: str, *args: str, timeout: float = 60,
               **env: str | None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (environment from clean_env(**env))."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          env=clean_env(**env), capture_output=True, text=True,
                          timeout=timeout, cwd=str(PACKAGE_ROOT))


def built_isas() -> list[str]:
    """The kernel variants built into this fastpe (fastpe/_kernels/kernels_<isa>.<ext>),
    narrowest first."""
    import importlib.machinery

    folder = PACKAGE_ROOT / "fastpe" / "_kernels"
    names = {p.name[len("kernels_"):-len(sfx)]
             for sfx in importlib.machinery.EXTENSION_SUFFIXES
             for p in folder.glob(f"kernels_*{sfx}")
             if "." not in p.name[len("kernels_"):-len(sfx)]}
    order = ["baseline", "avx2", "avx512"]
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


ISA_NAMES = tuple(built_isas())

# Run under FASTPE_ISA=<variant>: print info() as JSON and save a fixed set of results
# (every dtype and layout, tables near 2**20, add_sinusoidal with and without scale,
# add_learned, 1 and 2 threads) to the .npz named by argv[1].
ISA_SCRIPT = """
import json, sys
import numpy as np
import fastpe, fastpe._threads
fastpe._threads.SERIAL_BYTES = 0
dtypes = ["float16", "float32", "float64"]
try:
    import ml_dtypes
    dtypes.append(ml_dtypes.bfloat16)
except ImportError:
    pass
out = {}
for dt in dtypes:
    name = np.dtype(dt).name
    for nt in (1, 2):
        for layout in ("interleaved", "split"):
            for dim, off in ((37, 0), (64, 2**20 - 96), (8, 999_950), (150, 7),
                             (1024, 12_345)):
                t = fastpe.sinusoidal_table(130, dim, offset=off, layout=layout, dtype=dt,
                                            num_threads=nt)
                out[f"table-{name}-{layout}-{dim}-{off}-t{nt}"] = t.view(np.uint8)
        for scale in (1.0, 1.7):
            rng = np.random.default_rng(1)
            x = rng.uniform(-2, 2, (3, 100, 33)).astype(dt)
            pos = rng.integers(0, 5000, (3, 100))
            fastpe.add_sinusoidal(x, pos, scale=scale, num_threads=nt)
            out[f"add-{name}-{scale}-t{nt}"] = x.view(np.uint8)
        rng = np.random.default_rng(2)
        x = rng.uniform(-2, 2, (3, 100, 33)).astype(dt)
        table = rng.uniform(-2, 2, (500, 33)).astype(dt)
        fastpe.add_learned(x, table, rng.integers(0, 500, (100,)), num_threads=nt)
        out[f"learned-{name}-t{nt}"] = x.view(np.uint8)
        for style in ("neox", "gptj"):
            for hd in (36, 64, 128, 134):
                rng = np.random.default_rng(hd)
                q = rng.uniform(-2, 2, (2, 40, 3, hd)).astype(dt)
                k = rng.uniform(-2, 2, (2, 40, 1, hd)).astype(dt)
                pos = rng.integers(0, 2**20, (2, 40))
                fastpe.apply_rope(q, k, pos, style=style, num_threads=nt)
                out[f"rope-{name}-{style}-{hd}-t{nt}"] = np.concatenate(
                    [q.view(np.uint8).ravel(), k.view(np.uint8).ravel()])
        t = fastpe.alibi_bias(5, 9, 133, dtype=dt, num_threads=nt)
        out[f"alibitable-{name}-t{nt}"] = t.view(np.uint8)
np.savez(sys.argv[1], **out)
print(json.dumps(fastpe.info()))
"""


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo (Linux), else None."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field):
            return line.split(":", 1)[1].strip()
    return None


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), else None."""
    flags = _cpuinfo("flags")
    return None if flags is None else set(flags.split())


def cpu_vendor_id() -> str | None:
    """The CPU's vendor_id from /proc/cpuinfo (Linux x86: "GenuineIntel", ...), else None."""
    return _cpuinfo("vendor_id")


def cpu_family_id() -> int | None:
    """The CPU's family from /proc/cpuinfo (Linux x86: 26 for AMD's Zen 5), else None."""
    family = _cpuinfo("cpu family")
    return None if family is None else int(family)


def cpu_runs(isa: str) -> bool | None:
    """Whether the CPU runs a variant, from /proc/cpuinfo (None when unknown)."""
    if isa == "baseline":
        return True
    flags = cpu_flags()
    if flags is None:
        return None
    avx2 = {"avx2", "fma", "f16c", "bmi2"} <= flags
    if isa == "avx2":
        return avx2
    return avx2 and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags


@pytest.fixture(scope="session")
def isa_runs(tmp_path_factory):
    """{variant: (info dict, {name: uint8 result})} for every variant this CPU runs;
    a variant that is skipped maps to the reason. One subprocess per variant per session."""
    if not COMPILED:
        pytest.skip("the compiled extension is not built")
    available = fastpe.info()["isa_available"]
    runs = {}
    tmp = tmp_path_factory.mktemp("isa")
    for isa in ISA_NAMES:
        if isa not in available:
            runs[isa] = f"this CPU cannot run {isa}"
            continue
        path = tmp / f"{isa}.npz"
        proc = run_python(ISA_SCRIPT, str(path), FASTPE_ISA=isa)
        assert proc.returncode == 0, f"FASTPE_ISA={isa}: {proc.stderr[-3000:]}"
        with np.load(path) as data:
            results = {k: data[k] for k in data.files}
        runs[isa] = (json.loads(proc.stdout.strip().splitlines()[-1]), results)
    return runs


# ---- slow tests --------------------------------------------------------------------------
#
# Tests marked `slow` (the million-call leak check, ...) are skipped unless the run asks
# for them: `pytest -m slow` (any -m expression naming slow, other than "not slow"), or
# FASTPE_SLOW=1 in the environment (runs them beside everything else).


def _slow_requested(config) -> bool:
    if os.environ.get("FASTPE_SLOW", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    expr = config.getoption("markexpr", "") or ""
    return "slow" in expr and "not slow" not in " ".join(expr.split())


def pytest_collection_modifyitems(config, items):
    if _slow_requested(config):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow` or FASTPE_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


# ---- report header -----------------------------------------------------------------------


def pytest_report_header(config):
    info = fastpe.info()
    lines = [
        f"fastpe {info['version']} from {Path(fastpe.__file__).parent}: "
        f"backend={info['backend']} compiled={info['compiled']} isa={info['isa']} "
        f"(available {','.join(info['isa_available']) or '-'}) openmp={info['openmp']} "
        f"num_threads={info['num_threads']} bfloat16={info['bfloat16']} "
        f"FASTPE_BACKEND={os.environ.get('FASTPE_BACKEND', '<unset>')!s} "
        f"FASTPE_ISA={os.environ.get('FASTPE_ISA', '<unset>')!s}"
    ]
    if info["backend"] != "cython" and REQUESTED_BACKEND != "numpy":
        lines.append(
            "fastpe: WARNING: running on the NumPy fallback although FASTPE_BACKEND=numpy was "
            f"not asked for (import error: {info.get('import_error')}); "
            "test_backend.py::test_compiled_backend_guard fails")
    return lines


# Interior views of a (4, 80, 14) array (strided, negative steps, column slices), for
# the tests that a write into a view lands in its base array and nowhere else.
VIEWS_3D = {
    "interior-strided": (slice(1, 3), slice(5, 75, 2), slice(2, -3)),
    "negative-steps": (slice(3, 0, -1), slice(-4, 2, -3), slice(-2, 1, -2)),
    "interior-columns": (slice(1, 2), slice(1, -1), slice(3, -3, 3)),
}
