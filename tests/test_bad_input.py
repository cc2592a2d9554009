"""The bad-input matrix, table-driven: every public function against every kind of wrong
argument, on both backends.

One test, ``test_bad_input``, runs every row of one table (``ROWS``) on the compiled and
on the NumPy backend. The rows cover, per function, what applies of: a wrong type, a
wrong dtype, a wrong rank, mismatched shapes, read-only buffers, negative / huge /
non-integer positions, non-finite parameters, and inputs that alias or overlap the
output. The RoPE rows live in tests/test_rope.py (``BAD``: they use its arrays and
scalings) and the ALiBi rows in tests/test_alibi.py (``BAD_ADD``, ``BAD_BIAS``); they are
converted to ``Row`` here and run only here.

Each row gives the call, the exception class DESIGN.md's rule asks for (TypeError for a
wrong type or dtype or a read-only buffer, ValueError for shapes and values, IndexError
for a position outside a learned table or a cos/sin cache), and a regex the message must
match: it names the argument. After the failed call every array the caller passed is
byte-identical (and has the same dtype, shape, strides and writeable flag), and fastpe's
thread count and backend are what they were.

Rows marked ``isolate`` crash the interpreter on the compiled backend today (a read
input that overlaps the output is read after the kernel wrote it, then used as an
index): their compiled run happens in a fresh interpreter (``run_python``), so the crash
is a test failure, not the end of the run.

``test_matrix_covers_every_function`` checks that every public function has a row of
every category that applies to it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import test_alibi as _alibi  # the ALiBi rows (BAD_ADD, BAD_BIAS) use its arrays
import test_relative as _relative  # the T5 and DeBERTa rows (BAD_T5, BAD_DEBERTA, ...)
import test_rope as _rope  # the RoPE rows (BAD) use its arrays and scalings
from conftest import COMPILED, run_python, snapshot

import fastpe

ST, AS, AL = fastpe.sinusoidal_table, fastpe.add_sinusoidal, fastpe.add_learned
B, S, D, MAX_LEN = 2, 5, 4, 10


def x32(shape=(B, S, D), dtype=np.float32):
    return np.random.default_rng(0).uniform(-1, 1, shape).astype(dtype)


def table32(shape=(MAX_LEN, D), dtype=np.float32):
    return np.random.default_rng(1).uniform(-1, 1, shape).astype(dtype)


def read_only(a):
    a.flags.writeable = False
    return a


def zero_stride(shape, dtype=np.float32):
    """A *writable* array with a zero stride on its first axis (np.broadcast_to's are
    read-only, which is a different error)."""
    row = np.random.default_rng(2).uniform(-1, 1, shape[1:]).astype(dtype)
    return np.lib.stride_tricks.as_strided(row, shape, (0,) + row.strides, writeable=True)


@dataclass
class Row:
    id: str                        # "<public function>/<case>"
    call: Callable[[dict], object]
    exc: type[Exception]
    match: str
    arrays: Callable[[], dict] = field(default=dict)
    marks: tuple = ()              # pytest marks: a mark, or (backend, mark) for one backend
    isolate: bool = False          # the compiled call crashes: run it in a fresh interpreter
    category: str | None = None    # None: derived from the id (see category())


def x_only(**kw):
    return lambda: {"x": x32(**kw)}


def x_table(**kw):
    return lambda: {"x": x32(), "table": table32(**kw)}


BAD_BASES = [("zero", 0.0), ("negative", -10.0), ("nan", float("nan")),
             ("inf", float("inf")), ("-inf", -float("inf"))]
BAD_THREADS = [("0", 0, ValueError), ("str", "2", TypeError), ("bool", True, TypeError),
               ("float", 1.5, TypeError),
               # past fastpe.MAX_THREADS: OpenMP would abort the process creating the team
               ("40000", 40000, ValueError), ("2**40", 2**40, ValueError)]

ROWS: list[Row] = []

# ---- sinusoidal_table --------------------------------------------------------------------
ROWS += [
    Row("table/length-str", lambda a: ST("8", D), TypeError, r"\blength\b"),
    Row("table/length-float", lambda a: ST(8.0, D), TypeError, r"\blength\b"),
    Row("table/length-bool", lambda a: ST(True, D), TypeError, r"\blength\b"),
    Row("table/length-negative", lambda a: ST(-1, D), ValueError, r"\blength\b"),
    Row("table/dim-str", lambda a: ST(8, "4"), TypeError, r"\bdim\b"),
    Row("table/dim-none", lambda a: ST(8, None), TypeError, r"\bdim\b"),
    Row("table/dim-zero", lambda a: ST(8, 0), ValueError, r"\bdim\b"),
    Row("table/dim-negative", lambda a: ST(8, -2), ValueError, r"\bdim\b"),
    Row("table/dim-past-an-array", lambda a: ST(0, 2**62), ValueError, r"length and dim"),
    Row("table/base-str", lambda a: ST(8, D, base="10000"), TypeError, r"\bbase\b"),
    *[Row(f"table/base-{n}", lambda a, v=v: ST(8, D, base=v), ValueError, r"\bbase\b")
      for n, v in BAD_BASES],
    Row("table/offset-negative", lambda a: ST(8, D, offset=-1), ValueError, r"\boffset\b"),
    Row("table/offset-float", lambda a: ST(8, D, offset=2.0), TypeError, r"\boffset\b"),
    Row("table/offset-past-int64", lambda a: ST(8, D, offset=2**63 - 4), ValueError,
        r"\boffset\b"),
    Row("table/layout-unknown", lambda a: ST(8, D, layout="bogus"), ValueError, r"\blayout\b"),
    Row("table/layout-none", lambda a: ST(8, D, layout=None), ValueError, r"\blayout\b"),
    Row("table/layout-wrong-case", lambda a: ST(8, D, layout="Split"), ValueError,
        r"\blayout\b"),
    Row("table/dtype-int32", lambda a: ST(8, D, dtype="int32"), TypeError, r"\bdtype\b"),
    Row("table/dtype-complex", lambda a: ST(8, D, dtype=np.complex128), TypeError,
        r"\bdtype\b"),
    Row("table/dtype-unknown", lambda a: ST(8, D, dtype="float-ish"), TypeError, r"\bdtype\b"),
    Row("table/dtype-an-array", lambda a: ST(8, D, dtype=np.array(["a", "b"])), TypeError,
        r"\bdtype\b"),
    Row("table/out-list", lambda a: ST(2, 2, out=a["out"]), TypeError, r"\bout\b",
        lambda: {"out": [[0.0, 0.0], [0.0, 0.0]]}),
    Row("table/out-shape", lambda a: ST(8, D, out=a["out"]), ValueError, r"\bout\b.*shape",
        lambda: {"out": x32((8, D + 1))}),
    Row("table/out-length", lambda a: ST(8, D, out=a["out"]), ValueError, r"\bout\b.*shape",
        lambda: {"out": x32((7, D))}),
    Row("table/out-rank", lambda a: ST(8, D, out=a["out"]), ValueError,
        r"\bout\b.*dimension", lambda: {"out": x32((1, 8, D))}),
    Row("table/out-int", lambda a: ST(8, D, out=a["out"]), TypeError, r"\bout\b",
        lambda: {"out": np.zeros((8, D), np.int32)}),
    Row("table/out-read-only", lambda a: ST(8, D, out=a["out"]), TypeError,
        r"\bout\b.*read-only", lambda: {"out": read_only(x32((8, D)))}),
    Row("table/out-zero-stride", lambda a: ST(8, D, out=a["out"]), ValueError, r"\bout\b",
        lambda: {"out": zero_stride((8, D))}),
    Row("table/out-dtype-contradicts", lambda a: ST(8, D, dtype="float16", out=a["out"]),
        TypeError, r"(?=.*\bdtype\b)(?=.*\bout\b)", lambda: {"out": x32((8, D))}),
    *[Row(f"table/num_threads-{n}", lambda a, v=v: ST(8, D, num_threads=v), e,
          r"\bnum_threads\b") for n, v, e in BAD_THREADS],
]

# ---- add_sinusoidal ----------------------------------------------------------------------
ROWS += [
    Row("add_sinusoidal/x-list", lambda a: AS(a["x"]), TypeError, r"\bx\b",
        lambda: {"x": x32().tolist()}),
    Row("add_sinusoidal/x-int32", lambda a: AS(a["x"]), TypeError, r"\bx\b",
        lambda: {"x": np.zeros((B, S, D), np.int32)}),
    Row("add_sinusoidal/x-complex", lambda a: AS(a["x"]), TypeError, r"\bx\b",
        lambda: {"x": np.zeros((B, S, D), np.complex64)}),
    Row("add_sinusoidal/x-1d", lambda a: AS(a["x"]), ValueError, r"\bx\b.*dimension",
        x_only(shape=(D,))),
    Row("add_sinusoidal/x-4d", lambda a: AS(a["x"]), ValueError, r"\bx\b.*dimension",
        x_only(shape=(1, B, S, D))),
    Row("add_sinusoidal/x-0d", lambda a: AS(a["x"]), ValueError, r"\bx\b.*dimension",
        lambda: {"x": np.array(1.0, np.float32)}),
    Row("add_sinusoidal/x-read-only", lambda a: AS(a["x"]), TypeError, r"\bx\b.*read-only",
        lambda: {"x": read_only(x32())}),
    Row("add_sinusoidal/x-broadcast_to", lambda a: AS(np.broadcast_to(a["x"], (B, S, D))),
        TypeError, r"\bx\b.*read-only", x_only(shape=(S, D))),
    Row("add_sinusoidal/x-zero-stride", lambda a: AS(a["x"]), ValueError, r"\bx\b",
        lambda: {"x": zero_stride((B, S, D))}),
    Row("add_sinusoidal/positions-too-long", lambda a: AS(a["x"], np.arange(S + 1)),
        ValueError, r"\bpositions\b.*shape", x_only(), category="shape"),
    Row("add_sinusoidal/positions-batch", lambda a: AS(a["x"], np.zeros((B + 1, S), int)),
        ValueError, r"\bpositions\b.*shape", x_only(), category="shape"),
    Row("add_sinusoidal/positions-3d", lambda a: AS(a["x"], np.zeros((1, B, S), int)),
        ValueError, r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-scalar", lambda a: AS(a["x"], 3), ValueError,
        r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-negative", lambda a: AS(a["x"], [0, 1, -1, 2, 3]),
        ValueError, r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-float", lambda a: AS(a["x"], np.arange(S, dtype=float)),
        TypeError, r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-bool", lambda a: AS(a["x"], np.ones(S, bool)),
        TypeError, r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-and-offset", lambda a: AS(a["x"], np.arange(S), offset=2),
        ValueError, r"(?=.*\bpositions\b)(?=.*\boffset\b)", x_only()),
    Row("add_sinusoidal/positions-uint64-2**63",
        lambda a: AS(a["x"], np.array([0, 1, 2, 3, 2**63], np.uint64)), ValueError,
        r"\bpositions\b", x_only()),
    Row("add_sinusoidal/positions-uint64-big-endian-2**63",
        lambda a: AS(a["x"], np.array([0, 1, 2, 3, 2**63 + 1], ">u8")), ValueError,
        r"\bpositions must be < 2\*\*63, got 9223372036854775809", x_only()),
    Row("add_sinusoidal/offset-negative", lambda a: AS(a["x"], offset=-3), ValueError,
        r"\boffset\b", x_only()),
    Row("add_sinusoidal/offset-past-int64", lambda a: AS(a["x"], offset=2**63 - 2),
        ValueError, r"\boffset\b", x_only()),
    *[Row(f"add_sinusoidal/scale-{n}", lambda a, v=v: AS(a["x"], scale=v), ValueError,
          r"\bscale\b", x_only()) for n, v in BAD_BASES[2:]],
    Row("add_sinusoidal/scale-str", lambda a: AS(a["x"], scale="2"), TypeError, r"\bscale\b",
        x_only()),
    Row("add_sinusoidal/scale-none", lambda a: AS(a["x"], scale=None), TypeError,
        r"\bscale\b", x_only()),
    *[Row(f"add_sinusoidal/base-{n}", lambda a, v=v: AS(a["x"], base=v), ValueError,
          r"\bbase\b", x_only()) for n, v in BAD_BASES],
    Row("add_sinusoidal/layout-unknown", lambda a: AS(a["x"], layout="halves"), ValueError,
        r"\blayout\b", x_only()),
    *[Row(f"add_sinusoidal/num_threads-{n}", lambda a, v=v: AS(a["x"], num_threads=v), e,
          r"\bnum_threads\b", x_only()) for n, v, e in BAD_THREADS],
]

# ---- add_learned -------------------------------------------------------------------------
ROWS += [
    Row("add_learned/x-list", lambda a: AL(a["x"], a["table"]), TypeError, r"\bx\b",
        lambda: {"x": x32().tolist(), "table": table32()}),
    Row("add_learned/x-int32", lambda a: AL(a["x"], a["table"]), TypeError, r"\bx\b",
        lambda: {"x": np.zeros((B, S, D), np.int32), "table": np.zeros((MAX_LEN, D), np.int32)}),
    Row("add_learned/x-1d", lambda a: AL(a["x"], a["table"]), ValueError,
        r"\bx\b.*dimension", lambda: {"x": x32((D,)), "table": table32()}),
    Row("add_learned/x-read-only", lambda a: AL(a["x"], a["table"]), TypeError,
        r"\bx\b.*read-only", lambda: {"x": read_only(x32()), "table": table32()}),
    Row("add_learned/x-zero-stride", lambda a: AL(a["x"], a["table"]), ValueError, r"\bx\b",
        lambda: {"x": zero_stride((B, S, D)), "table": table32()}),
    Row("add_learned/table-int", lambda a: AL(a["x"], a["table"]), TypeError, r"\btable\b",
        lambda: {"x": x32(), "table": np.arange(MAX_LEN * D).reshape(MAX_LEN, D)}),
    Row("add_learned/table-dtype-differs", lambda a: AL(a["x"], a["table"]), TypeError,
        r"\btable\b.*dtype", x_table(dtype=np.float64)),
    Row("add_learned/table-half-for-float32", lambda a: AL(a["x"], a["table"]), TypeError,
        r"\btable\b.*dtype", x_table(dtype=np.float16)),
    Row("add_learned/table-1d", lambda a: AL(a["x"], a["table"]), ValueError,
        r"\btable\b.*dimension", x_table(shape=(D,))),
    Row("add_learned/table-3d", lambda a: AL(a["x"], a["table"]), ValueError,
        r"\btable\b.*dimension", x_table(shape=(1, MAX_LEN, D))),
    Row("add_learned/table-dim", lambda a: AL(a["x"], a["table"]), ValueError, r"\btable\b",
        x_table(shape=(MAX_LEN, D + 1))),
    Row("add_learned/table-str", lambda a: AL(a["x"], "table"), TypeError, r"\btable\b",
        x_only()),
    Row("add_learned/table-none", lambda a: AL(a["x"], None), TypeError, r"\btable\b",
        x_only()),
    Row("add_learned/position-max_len", lambda a: AL(a["x"], a["table"], [0, 1, MAX_LEN, 2, 3]),
        IndexError, r"(?=.*\btable\b)(?=.*max_len)", x_table()),
    Row("add_learned/position-huge", lambda a: AL(a["x"], a["table"], np.full((B, S), 2**62)),
        IndexError, r"(?=.*\btable\b)(?=.*max_len)", x_table()),
    Row("add_learned/offset-past-max_len", lambda a: AL(a["x"], a["table"], offset=MAX_LEN - 4),
        IndexError, r"(?=.*\btable\b)(?=.*max_len)", x_table()),
    Row("add_learned/seq-longer-than-max_len", lambda a: AL(a["x"], a["table"]),
        IndexError, r"(?=.*\btable\b)(?=.*max_len)",
        lambda: {"x": x32((B, MAX_LEN + 1, D)), "table": table32()}),
    Row("add_learned/positions-shape", lambda a: AL(a["x"], a["table"], np.arange(S - 1)),
        ValueError, r"\bpositions\b.*shape", x_table()),
    Row("add_learned/positions-negative", lambda a: AL(a["x"], a["table"], [0, 1, 2, 3, -1]),
        ValueError, r"\bpositions\b", x_table()),
    Row("add_learned/positions-float", lambda a: AL(a["x"], a["table"], [0.0, 1, 2, 3, 4]),
        TypeError, r"\bpositions\b", x_table()),
    Row("add_learned/positions-and-offset",
        lambda a: AL(a["x"], a["table"], np.arange(S), offset=1), ValueError,
        r"(?=.*\bpositions\b)(?=.*\boffset\b)", x_table()),
    Row("add_learned/positions-uint64-2**63",
        lambda a: AL(a["x"], a["table"], np.array([0, 1, 2, 3, 2**63], np.uint64)),
        ValueError, r"\bpositions\b", x_table()),
    Row("add_learned/offset-negative", lambda a: AL(a["x"], a["table"], offset=-1),
        ValueError, r"\boffset\b", x_table()),
    *[Row(f"add_learned/num_threads-{n}", lambda a, v=v: AL(a["x"], a["table"], num_threads=v),
          e, r"\bnum_threads\b", x_table()) for n, v, e in BAD_THREADS],
]


# ---- runtime -------------------------------------------------------------------------------


def _enter_backend(name):
    with fastpe.use_backend(name):
        pass


ROWS += [
    *[Row(f"set_num_threads/{n}", lambda a, v=v: fastpe.set_num_threads(v), e, r"\bn\b")
      for n, v, e in BAD_THREADS],
    # the compiled fast paths take num_threads unchecked; the cap holds there too
    *[Row(f"add_alibi/fast-num_threads-{n}",
          lambda a, v=v: fastpe.add_alibi(a["s"], q_offset=0, num_threads=v), ValueError,
          r"\bnum_threads\b", lambda: {"s": x32((1, 4, 7, 1))}) for n, v in
      [("40000", 40000), ("2**40", 2**40)]],
    *[Row(f"apply_rope/fast-num_threads-{n}",
          lambda a, v=v: fastpe.apply_rope(a["q"], num_threads=v), ValueError,
          r"\bnum_threads\b", lambda: {"q": x32((1, 4, 2, 8))}) for n, v in
      [("40000", 40000), ("2**40", 2**40)]],
    *[Row(f"add_learned/fast-num_threads-{n}",
          lambda a, v=v: fastpe.add_learned(a["x"], a["t"], num_threads=v), ValueError,
          r"\bnum_threads\b", lambda: {"x": x32((2, 4, 8)), "t": x32((6, 8))}) for n, v in
      [("40000", 40000), ("2**40", 2**40)]],
    Row("use_backend/unknown", lambda a: _enter_backend("bogus"), ValueError, r"\bname\b"),
    Row("use_backend/none", lambda a: _enter_backend(None), ValueError, r"\bname\b"),
    Row("use_backend/wrong-case", lambda a: _enter_backend("NumPy"), ValueError, r"\bname\b"),
    Row("use_backend/int", lambda a: _enter_backend(1), ValueError, r"\bname\b"),
]


# ---- RoPE: tests/test_rope.py's table, and what it lacks ----------------------------------

_ROPE_FUNCTIONS = {"cached": "apply_rope_cached", "cos_sin": "rope_cos_sin",
                   "embedding": "RotaryEmbedding"}


def _rope_function(case_id: str) -> str:
    return _ROPE_FUNCTIONS.get(case_id.split("-", 1)[0], "apply_rope")


def _rope_marks(bad) -> tuple:
    """test_rope's Bad.marks: () or (backend or None, mark)."""
    if not bad.marks:
        return ()
    backend, mark = bad.marks
    return (mark,) if backend is None else ((backend, mark),)


ROWS += [Row(f"{_rope_function(b.id)}/{b.id}", b.call, b.exc, b.match, b.arrays,
             marks=_rope_marks(b)) for b in _rope.BAD]

RD, RB, RS, RH = _rope.D, _rope.B, 40, _rope.HQ


def q64(shape=(RB, RS, RH, RD), low=-2.0, high=2.0):
    return np.random.default_rng(11).uniform(low, high, shape)


ROWS += [
    Row("apply_rope/base-nan", lambda a: fastpe.apply_rope(a["q"], base=float("nan")),
        ValueError, r"\bbase\b", lambda: {"q": q64()}),
    Row("apply_rope/base-inf", lambda a: fastpe.apply_rope(a["q"], base=float("inf")),
        ValueError, r"\bbase\b", lambda: {"q": q64()}),
    Row("apply_rope/base-str", lambda a: fastpe.apply_rope(a["q"], base="1e4"),
        TypeError, r"\bbase\b", lambda: {"q": q64()}),
    Row("apply_rope/positions-list-of-floats-inf",
        lambda a: fastpe.apply_rope(a["q"], None, [0.5] * (RS - 1) + [float("inf")]),
        ValueError, r"\bpositions\b.*finite", lambda: {"q": q64()}),
    Row("apply_rope_cached/positions-huge",
        lambda a: fastpe.apply_rope_cached(a["q"], None, a["cos"], a["sin"],
                                           np.full(RS, 2**62)),
        IndexError, r"position \d+ is past the end of the cos/sin cache",
        lambda: {"q": q64(), **_rope.cache(dtype=np.float64)}),
    Row("apply_rope_cached/cos-list", lambda a: fastpe.apply_rope_cached(
        a["q"], None, "cos", a["sin"]), TypeError, r"\bcos\b",
        lambda: {"q": q64(), **_rope.cache(dtype=np.float64)}),
    *[Row(f"apply_rope_cached/per-token-{n}", lambda a, v=v: fastpe.apply_rope_cached(
        a["q"], None, a["cos"], a["sin"], per_token=v), TypeError, r"\bper_token\b",
        lambda: {"q": q64(), **_rope.cache(dtype=np.float64)})
      for n, v in [("empty-str", ""), ("zero-float", 0.0), ("empty-list", []),
                   ("str-yes", "yes"), ("two", 2)]],
    Row("apply_rope_cached/q-4d-for-shd", lambda a: fastpe.apply_rope_cached(
        a["q"], None, a["cos"], a["sin"], layout="shd"), ValueError, r"\bq\b.*3 dimensions",
        lambda: {"q": q64(), **_rope.cache(dtype=np.float64)}),
    Row("mrope_positions/segment-str", lambda a: fastpe.mrope_positions([3, "image"]),
        TypeError, r"\bsegments\[1\]"),
    Row("mrope_positions/grid-not-multiple-of-merge", lambda a: fastpe.mrope_positions(
        [(1, 3, 4)], spatial_merge_size=2), ValueError, r"\bspatial_merge_size\b"),
    Row("vision_positions/cls-str", lambda a: fastpe.vision_positions((2, 2), cls="yes"),
        TypeError, r"\bcls\b"),
    Row("vision_positions/grid-four-sizes", lambda a: fastpe.vision_positions((1, 2, 2, 2)),
        ValueError, r"\bgrids\b"),
    Row("vision_positions/grid-entry-float", lambda a: fastpe.vision_positions((1, 2.0, 4)),
        TypeError, r"^grids h must be an int"),
    Row("dinov3_positions/height-float", lambda a: fastpe.dinov3_positions(3.0, 4),
        TypeError, r"\bheight\b"),
    Row("dinov3_positions/patch-size-zero", lambda a: fastpe.dinov3_positions(
        32, 32, patch_size=0), ValueError, r"\bpatch_size\b"),
    Row("sam2_memory_positions/frames-str", lambda a: fastpe.sam2_memory_positions(
        2, 2, frames="2"), TypeError, r"\bframes\b"),
    Row("sam2_memory_positions/width-zero", lambda a: fastpe.sam2_memory_positions(2, 0),
        ValueError, r"\bwidth\b"),
    # more positions than fastpe makes at once: named before anything is allocated
    Row("dinov3_positions/past-2**32", lambda a: fastpe.dinov3_positions(2**20, 2**20),
        ValueError, r"\bheight and width\b.*2\*\*32", category="value"),
    Row("sam2_memory_positions/past-2**32", lambda a: fastpe.sam2_memory_positions(
        2**16, 2**16, frames=2), ValueError, r"\bframes\b.*2\*\*32", category="value"),
    Row("sam3_vit_positions/past-2**32", lambda a: fastpe.sam3_vit_positions(
        2**20, 2**20, window_size=24), ValueError, r"\bwidth\b.*2\*\*32",
        category="value"),
    Row("efficientloftr_positions/past-2**32", lambda a: fastpe.efficientloftr_positions(
        2**36, 1), ValueError, r"\bheight\b.*2\*\*32", category="value"),
    # the same for the total of several segments or grids, counted before the first is made
    Row("mrope_positions/past-2**32", lambda a: fastpe.mrope_positions(
        [(1, 2**16, 2**16), 5]), ValueError, r"^segments\[1\].*2\*\*32", category="value"),
    Row("vision_positions/past-2**32", lambda a: fastpe.vision_positions(
        [(1, 2**16, 2**16), (1, 1)]), ValueError, r"^grids\[1\].*2\*\*32", category="value"),
    Row("sam3_vit_positions/window-size-float", lambda a: fastpe.sam3_vit_positions(
        4, 4, window_size=4.5), TypeError, r"\bwindow_size\b"),
    Row("sam3_vit_positions/height-negative", lambda a: fastpe.sam3_vit_positions(
        -1, 4, window_size=4), ValueError, r"\bheight\b"),
    Row("efficientloftr_positions/width-none", lambda a: fastpe.efficientloftr_positions(
        2, None), TypeError, r"\bwidth\b"),
    Row("efficientloftr_positions/height-zero", lambda a: fastpe.efficientloftr_positions(
        0, 2), ValueError, r"\bheight\b"),
    Row("rope_cos_sin/positions-uint64-2**63",
        lambda a: fastpe.rope_cos_sin(np.array([1, 2**63], np.uint64),
                                      fastpe.rope_frequencies(8)), ValueError, r"\bpositions\b"),
    Row("rope_cos_sin/positions-str", lambda a: fastpe.rope_cos_sin("0123",
                                                                   fastpe.rope_frequencies(8)),
        TypeError, r"\bpositions\b"),
    Row("rope_cos_sin/freqs-2d", lambda a: fastpe.rope_cos_sin(np.arange(4), np.ones((2, 2))),
        ValueError, r"\bfreqs\.inv_freq\b.*1-D"),
    Row("rope_cos_sin/freqs-inf", lambda a: fastpe.rope_cos_sin(
        np.arange(4), fastpe.RopeFrequencies(np.array([1.0, np.inf]), 1.0)), ValueError,
        r"\bfreqs\.inv_freq\b"),
    Row("rope_cos_sin/freqs-attention-scaling-inf", lambda a: fastpe.rope_cos_sin(
        np.arange(4), fastpe.RopeFrequencies(np.ones(2), float("inf"))), ValueError,
        r"\bfreqs\.attention_scaling\b"),
    Row("RotaryEmbedding/head_dim-str", lambda a: fastpe.RotaryEmbedding("64"), TypeError,
        r"\bhead_dim\b", category="type"),
    Row("RotaryEmbedding/base-nan", lambda a: fastpe.RotaryEmbedding(RD, base=float("nan")),
        ValueError, r"\bbase\b"),
    Row("RotaryEmbedding/scaling-not-a-dict",
        lambda a: fastpe.RotaryEmbedding(RD, scaling="linear"), TypeError, r"\bscaling\b"),
    Row("RotaryEmbedding/call-q-int", lambda a: fastpe.RotaryEmbedding(RD)(a["q"]), TypeError,
        r"\bq\b.*floating dtype", lambda: {"q": np.zeros((RB, RS, RH, RD), np.int32)}),
    Row("RotaryEmbedding/call-q-3d-for-bshd", lambda a: fastpe.RotaryEmbedding(RD)(a["q"]),
        ValueError, r"\bq\b.*4 dimensions", lambda: {"q": q64((RS, RH, RD))}),
    Row("RotaryEmbedding/call-read-only-q", lambda a: fastpe.RotaryEmbedding(RD)(a["q"]),
        TypeError, r"\bq\b.*read-only", lambda: {"q": read_only(q64())}),
    Row("RotaryEmbedding/call-positions-float-2**32",
        lambda a: fastpe.RotaryEmbedding(RD)(a["q"], None, np.arange(RS) + 2.0**32),
        ValueError, r"\bpositions\b.*below 2\*\*32", lambda: {"q": q64()}),
    Row("RotaryEmbedding/call-positions-uint64-2**63",
        lambda a: fastpe.RotaryEmbedding(RD)(a["q"], None, np.full(RS, 2**63, np.uint64)),
        ValueError, r"\bpositions\b", lambda: {"q": q64()}),
    Row("RotaryEmbedding/call-k-batch-differs",
        lambda a: fastpe.RotaryEmbedding(RD)(a["q"], a["k"]), ValueError, r"\bk\b.*batch",
        lambda: {"q": q64(), "k": q64((RB + 1, RS, 1, RD))}),
    Row("rope_frequencies/dim-str", lambda a: fastpe.rope_frequencies("8"), TypeError,
        r"\bdim\b"),
    Row("rope_frequencies/dim-zero", lambda a: fastpe.rope_frequencies(0), ValueError,
        r"\bdim\b"),
    Row("rope_frequencies/dim-past-an-array", lambda a: fastpe.rope_frequencies(2**62),
        ValueError, r"\bdim\b"),
    Row("rope_frequencies/base-nan", lambda a: fastpe.rope_frequencies(8, base=float("nan")),
        ValueError, r"\bbase\b"),
    Row("rope_frequencies/base-negative", lambda a: fastpe.rope_frequencies(8, base=-1.0),
        ValueError, r"\bbase\b"),
    Row("rope_frequencies/scaling-not-a-dict",
        lambda a: fastpe.rope_frequencies(8, scaling=[("rope_type", "linear")]), TypeError,
        r"\bscaling\b"),
    Row("rope_frequencies/factor-nan", lambda a: fastpe.rope_frequencies(
        8, scaling={"rope_type": "linear", "factor": float("nan")}), ValueError, r"\bfactor\b"),
    Row("rope_frequencies/factor-inf", lambda a: fastpe.rope_frequencies(
        8, scaling={"rope_type": "linear", "factor": float("inf")}), ValueError, r"\bfactor\b"),
    Row("rope_frequencies/seq_len-negative", lambda a: fastpe.rope_frequencies(8, seq_len=-1),
        ValueError, r"\bseq_len\b"),
]


# ---- ALiBi: tests/test_alibi.py's tables, and what they lack ------------------------------

AS_SHAPE = _alibi.S   # the scores of the ALiBi rows: batch 2, 3 heads, 4 queries, 6 keys


def _words(words) -> str:
    """A regex that matches when every word is in the message."""
    return "(?s)" + "".join(f"(?=.*{re.escape(w)})" for w in words)


def _fresh(value):
    return value.copy() if isinstance(value, np.ndarray) else copy.deepcopy(value)


def _scores():
    return np.random.default_rng(0).standard_normal(AS_SHAPE).astype(np.float32)


def _add_row(case) -> Row:
    case_id, factory, kwargs, exc, words = case

    def arrays():
        return {"scores": factory() if factory else _scores(),
                **{k: _fresh(v) for k, v in kwargs.items() if isinstance(v, (np.ndarray, list))}}

    def call(a):
        return fastpe.add_alibi(a["scores"], **{k: a.get(k, v) for k, v in kwargs.items()})

    return Row(f"add_alibi/{case_id}", call, exc, _words(words), arrays)


def _bias_row(case) -> Row:
    case_id, args, kwargs, exc, words = case

    def arrays():
        out = {k: _fresh(v) for k, v in kwargs.items() if isinstance(v, (np.ndarray, list))}
        if case_id == "out-read-only":
            out["out"].flags.writeable = False
        return out

    def call(a):
        return fastpe.alibi_bias(*args, **{k: a.get(k, v) for k, v in kwargs.items()})

    return Row(f"alibi_bias/{case_id}", call, exc, _words(words), arrays)


ROWS += [_add_row(c) for c in _alibi.BAD_ADD]
ROWS += [_bias_row(c) for c in _alibi.BAD_BIAS]

ROWS += [
    Row("add_alibi/scores-list", lambda a: fastpe.add_alibi(a["scores"]), TypeError,
        r"\bscores\b", lambda: {"scores": _scores().tolist()}),
    Row("add_alibi/q_positions-uint64-2**63",
        lambda a: fastpe.add_alibi(a["scores"], q_positions=np.full(4, 2**63, np.uint64)),
        ValueError, r"\bq_positions\b", lambda: {"scores": _scores()}),
    Row("add_alibi/k_positions-list-of-floats",
        lambda a: fastpe.add_alibi(a["scores"], k_positions=[0.0, 1, 2, 3, 4, 5]),
        TypeError, r"\bk_positions\b", lambda: {"scores": _scores()}),
    Row("add_alibi/slopes-list-of-str", lambda a: fastpe.add_alibi(a["scores"], slopes="abc"),
        TypeError, r"\bslopes\b", lambda: {"scores": _scores()}),
    Row("alibi_bias/out-rank", lambda a: fastpe.alibi_bias(3, 4, 6, out=a["out"]), ValueError,
        r"\bout\b.*dimension", lambda: {"out": np.zeros((1, 3, 4, 6))}),
    Row("alibi_bias/out-int", lambda a: fastpe.alibi_bias(3, 4, 6, out=a["out"]), TypeError,
        r"\bout\b", lambda: {"out": np.zeros((3, 4, 6), np.int32)}),
    Row("alibi_bias/slopes-inf", lambda a: fastpe.alibi_bias(3, 4, 6, slopes=[1.0, np.inf, 1]),
        ValueError, r"\bslopes\b.*finite"),
    Row("alibi_bias/max_bias-nan",
        lambda a: fastpe.alibi_bias(3, 4, 6, max_bias=float("nan")), ValueError,
        r"\bmax_bias\b"),
    Row("alibi_bias/k_positions-negative",
        lambda a: fastpe.alibi_bias(3, 4, 6, k_positions=np.arange(6) - 1), ValueError,
        r"\bk_positions\b.*>= 0"),
    Row("alibi_bias/q_positions-float",
        lambda a: fastpe.alibi_bias(3, 4, 6, q_positions=np.arange(4.0)), TypeError,
        r"\bq_positions\b"),
    Row("alibi_bias/q_offset-huge", lambda a: fastpe.alibi_bias(3, 4, 6, q_offset=2**63 - 2),
        ValueError, r"\bq_offset\b"),
    Row("alibi_bias/num_threads-zero", lambda a: fastpe.alibi_bias(3, 4, 6, num_threads=0),
        ValueError, r"\bnum_threads\b"),
    *[Row(f"alibi_slopes/{n}", lambda a, h=h, mb=mb: fastpe.alibi_slopes(h, max_bias=mb), e,
          rf"\b{w}\b")
      for n, h, mb, e, w in [
          ("num_heads-zero", 0, 8.0, ValueError, "num_heads"),
          ("num_heads-negative", -3, 8.0, ValueError, "num_heads"),
          ("num_heads-float", 2.0, 8.0, TypeError, "num_heads"),
          ("num_heads-none", None, 8.0, TypeError, "num_heads"),
          ("num_heads-bool", True, 8.0, TypeError, "num_heads"),
          ("num_heads-past-arrays", 2**70, 8.0, ValueError, "num_heads"),
          ("max_bias-nan", 8, float("nan"), ValueError, "max_bias"),
          ("max_bias-negative", 8, -1.0, ValueError, "max_bias"),
          ("max_bias-zero", 8, 0, ValueError, "max_bias"),
          ("max_bias-minus-inf", 8, float("-inf"), ValueError, "max_bias"),
          ("max_bias-none", 8, None, TypeError, "max_bias"),
          ("max_bias-str", 8, "8", TypeError, "max_bias")]],
]


# ---- inputs that alias or overlap the output -----------------------------------------------
#
# DESIGN.md lets q and k share a buffer but not overlap, and rejects writable arrays with
# overlapping elements; the rows above check both. Also refused:
# - an output whose elements overlap through non-zero strides (as_strided rows that start
#   two elements apart): the result would depend on the kernel's loop order;
# - an array that is only read (a learned table, a cos/sin cache, frequencies, slopes,
#   positions, a key mask) sharing memory with the array written in place: the kernels
#   would read values they have overwritten, and a position read after that indexes
#   memory out of bounds (the `isolate` rows run in a fresh interpreter, so a crash is a
#   failure, not the end of the run).
# The contract is a ValueError naming the arguments, on both backends.

def _overlap(*names: str) -> str:
    return "(?s)" + "".join(rf"(?=.*\b{re.escape(n)}\b)" for n in names) + \
        r"(?=.*(overlap|share|alias))"


def _table_with_x():
    """A float32 (MAX_LEN + 1, D) buffer: the table, and x = its rows 1 .. S."""
    return {"buf": np.random.default_rng(3).uniform(-1, 1, (MAX_LEN + 1, D)).astype(np.float32)}


def _positions_inside(shape, n, dtype=np.float64, values=None, seed=4):
    """A float array whose first n int64 words hold positions (0 .. 9 repeating, or
    `values`): `_pos(x, n)` reads them as a C-contiguous int64 view, so no copy is made."""
    x = np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)
    x.reshape(-1).view(np.int64)[:n] = np.arange(n) % 10 if values is None else values
    return x


def _pos(x, n):
    """The first n int64 words of x's buffer: C-contiguous int64, so no copy is made."""
    return x.reshape(-1).view(np.int64)[:n]


def _cache_with_q(rows=64, half=RD // 2, seq=RS):
    """A float32 (rows, 2 * half) buffer holding [cos | sin] side by side; q = its first
    `seq` rows seen as (1, seq, 1, 2 * half)."""
    return {"buf": np.random.default_rng(5).uniform(-1, 1, (rows, 2 * half)).astype(np.float32)}


def _cos(b):
    return b[:, : b.shape[1] // 2]


def _sin(b):
    return b[:, b.shape[1] // 2:]


def _q_rows(b, seq=RS):
    return b[:seq].reshape(1, seq, 1, b.shape[1])


ASEQ = 64  # two 32-token blocks: positions stored in block 0's rows are read by block 1


def self_overlapping(shape, dtype=np.float32, seed=8):
    """A *writable* view whose rows overlap without a zero stride (each row starts two
    elements after the previous one): only zero strides are rejected today."""
    n = int(np.prod(shape[1:]))
    buf = np.random.default_rng(seed).uniform(-1, 1, 2 * shape[0] + n).astype(dtype)
    st = [buf.itemsize * 2] + [0] * (len(shape) - 1)
    for i in range(len(shape) - 1, 0, -1):
        st[i] = buf.itemsize * int(np.prod(shape[i + 1:]))
    return {"buf": buf, "view": np.lib.stride_tricks.as_strided(buf, shape, tuple(st),
                                                                 writeable=True)}


ROWS += [
    Row("add_sinusoidal/x-self-overlapping", lambda a: AS(a["view"]), ValueError,
        r"\bx\b.*overlapping", lambda: self_overlapping((B, S, D)),
        category="overlap"),
    *[Row(f"apply_rope/head_dim-{d}", lambda a: fastpe.apply_rope(a["q"]), ValueError,
          r"\bq\b.*head_dim", lambda d=d: {"q": np.zeros((1, 3, 2, d), np.float32)},
          category="shape") for d in (0, 1)],
    Row("apply_rope/q-self-overlapping", lambda a: fastpe.apply_rope(a["view"]), ValueError,
        r"\bq\b.*overlapping", lambda: self_overlapping((2, 5, 2, 8)),
        category="overlap"),
    Row("add_alibi/scores-self-overlapping", lambda a: fastpe.add_alibi(a["view"]),
        ValueError, r"\bscores\b.*overlapping", lambda: self_overlapping(AS_SHAPE),
        category="overlap"),
    # 252 distinct elements whose axes do not nest (as_strided): not proven apart, and
    # said so, not called overlapping
    Row("apply_rope/q-distinct-unnested", lambda a: fastpe.apply_rope(a["view"]), ValueError,
        r"^q has overlapping elements, or strides whose elements fastpe cannot prove "
        r"distinct", lambda: {"view": np.lib.stride_tricks.as_strided(
            np.zeros(1000, np.float32), (1, 6, 3, 14), (84, 48, 8, 168), writeable=True)},
        category="overlap"),
    Row("add_learned/x-overlaps-table", lambda a: AL(a["buf"][1:S + 1], a["buf"]),
        ValueError, _overlap("x", "table"), _table_with_x,
        category="overlap"),
    Row("add_learned/positions-overlap-x",
        lambda a: AL(a["x"], a["table"], _pos(a["x"], ASEQ)), ValueError,
        _overlap("positions", "x"),
        lambda: {"x": _positions_inside((1, ASEQ, 8), ASEQ), "table": np.ones((10, 8))},
        isolate=True, category="overlap"),
    Row("add_sinusoidal/positions-overlap-x",
        lambda a: AS(a["x"], _pos(a["x"], ASEQ)), ValueError, _overlap("positions", "x"),
        lambda: {"x": _positions_inside((1, ASEQ, 8), ASEQ)},
        category="overlap"),
    Row("apply_rope/freqs-overlap-q",
        lambda a: fastpe.apply_rope(a["q"], freqs=a["q"][0, 0, 0, :RD // 2]), ValueError,
        _overlap("freqs", "q"), lambda: {"q": q64(low=0.01, high=0.5)},
        category="overlap"),
    Row("apply_rope/positions-overlap-q",
        lambda a: fastpe.apply_rope(a["q"], None, _pos(a["q"], ASEQ)), ValueError,
        _overlap("positions", "q"), lambda: {"q": _positions_inside((1, ASEQ, 2, RD), ASEQ)},
        category="overlap"),
    Row("apply_rope_cached/q-overlaps-cos",
        lambda a: fastpe.apply_rope_cached(_q_rows(a["buf"]), None, _cos(a["buf"]),
                                           _sin(a["buf"])),
        ValueError, _overlap("q", "cos"), _cache_with_q,
        category="overlap"),
    Row("apply_rope_cached/k-overlaps-sin",
        lambda a: fastpe.apply_rope_cached(a["q"], _q_rows(a["buf"]),
                                           np.ascontiguousarray(_cos(a["buf"])),
                                           _sin(a["buf"])),
        ValueError, _overlap("k", "sin"),
        lambda: {**_cache_with_q(), "q": q64((1, RS, 2, RD)).astype(np.float32)},
        category="overlap"),
    Row("apply_rope_cached/positions-overlap-q",
        lambda a: fastpe.apply_rope_cached(a["q"], None, a["cos"], a["sin"],
                                           _pos(a["q"], ASEQ)),
        ValueError, _overlap("positions", "q"),
        lambda: {"q": _positions_inside((1, ASEQ, 1, RD), ASEQ, np.float32),
                 **_rope.cache(rows=10)},
        isolate=True, category="overlap"),
    Row("RotaryEmbedding/call-positions-overlap-q",
        lambda a: fastpe.RotaryEmbedding(RD)(a["q"], None, _pos(a["q"], ASEQ)), ValueError,
        _overlap("positions", "q"), lambda: {"q": _positions_inside((1, ASEQ, 2, RD), ASEQ)},
        category="overlap"),
    Row("add_alibi/slopes-overlap-scores",
        lambda a: fastpe.add_alibi(a["scores"], slopes=a["scores"][0, 0, 0, :3]), ValueError,
        _overlap("slopes", "scores"),
        lambda: {"scores": np.random.default_rng(6).uniform(0.1, 1, AS_SHAPE)},
        category="overlap"),
    Row("add_alibi/q_positions-overlap-scores",
        lambda a: fastpe.add_alibi(a["scores"], q_positions=_pos(a["scores"], 4)), ValueError,
        _overlap("q_positions", "scores"),
        lambda: {"scores": _positions_inside(AS_SHAPE, 4, values=[2, 3, 4, 5])},
        category="overlap"),
    Row("add_alibi/k_positions-overlap-scores",
        lambda a: fastpe.add_alibi(a["scores"], k_positions=_pos(a["scores"], 6),
                                   q_positions=np.arange(4)), ValueError,
        _overlap("k_positions", "scores"),
        lambda: {"scores": _positions_inside(AS_SHAPE, 6, values=np.arange(6))},
        category="overlap"),
    Row("add_alibi/key_mask-overlap-scores",
        lambda a: fastpe.add_alibi(a["scores"], key_mask=a["scores"].reshape(-1).view(
            np.uint8)[:6], q_positions=np.arange(4)), ValueError,
        _overlap("key_mask", "scores"), lambda: {"scores": np.zeros(AS_SHAPE)},
        category="overlap"),
    Row("alibi_bias/slopes-overlap-out",
        lambda a: fastpe.alibi_bias(3, 4, 6, slopes=a["out"][:, 0, 0], out=a["out"]),
        ValueError, _overlap("slopes", "out"),
        lambda: {"out": np.random.default_rng(7).uniform(0.1, 1, (3, 4, 6))},
        category="overlap"),
    Row("alibi_bias/q_positions-overlap-out",
        lambda a: fastpe.alibi_bias(3, 4, 6, q_positions=_pos(a["out"], 4), out=a["out"]),
        ValueError, _overlap("q_positions", "out"),
        lambda: {"out": _positions_inside((3, 4, 6), 4, values=[2, 3, 4, 5])},
        category="overlap"),
]


# ---- subclasses, converted inputs, scalars, empty frequencies --------------------------------


def masked(a):
    return np.ma.masked_array(a, mask=np.zeros(a.shape, bool))


NO_MATRIX_WARNING = (pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),)


ROWS += [
    # a mask or a matrix's semantics would be ignored by the loops: refused by both backends
    Row("add_sinusoidal/x-matrix", lambda a: AS(np.asmatrix(a["x"])), TypeError,
        r"\bx\b.*matrix", x_only(shape=(S, D)), category="type", marks=NO_MATRIX_WARNING),
    Row("add_sinusoidal/x-masked", lambda a: AS(masked(a["x"])), TypeError,
        r"\bx\b.*MaskedArray", x_only(), category="type"),
    Row("add_learned/table-masked", lambda a: AL(a["x"], masked(a["table"])), TypeError,
        r"\btable\b.*MaskedArray", x_table(), category="type"),
    Row("apply_rope/q-masked", lambda a: fastpe.apply_rope(masked(a["q"])), TypeError,
        r"\bq\b.*MaskedArray", lambda: {"q": q64()}, category="type"),
    Row("apply_rope_cached/cos-matrix", lambda a: fastpe.apply_rope_cached(
        a["q"], None, np.asmatrix(a["cos"]), a["sin"]), TypeError, r"\bcos\b.*matrix",
        lambda: {"q": q64(), **_rope.cache(dtype=np.float64)}, category="type",
        marks=NO_MATRIX_WARNING),
    Row("add_alibi/scores-masked", lambda a: fastpe.add_alibi(masked(a["s"])), TypeError,
        r"\bscores\b.*MaskedArray",
        lambda: {"s": np.zeros(AS_SHAPE)}, category="type"),
    Row("add_alibi/scores-numpy-scalar", lambda a: fastpe.add_alibi(np.float32(0)), TypeError,
        r"\bscores\b.*scalar", category="type"),
    # the overlap check looks at the memory a converted argument reads, not its type
    Row("add_alibi/slopes-memoryview-overlap-scores",
        lambda a: fastpe.add_alibi(a["s"], slopes=memoryview(a["s"][0, 0, 0, :3])),
        ValueError, _overlap("slopes", "scores"),
        lambda: {"s": np.random.default_rng(6).uniform(0.1, 1, AS_SHAPE)}, category="overlap"),
    Row("add_learned/table-memoryview-overlap-x",
        lambda a: AL(a["x"][:, :2], memoryview(a["x"][1])), ValueError, _overlap("table", "x"),
        x_only(), category="overlap"),
    Row("add_sinusoidal/scale-10**400", lambda a: AS(a["x"], scale=10**400), ValueError,
        r"\bscale\b", x_only(), category="non-finite"),
    # finite as a float64, infinite in float32, the arithmetic of float32 and half rows:
    # a zero row would be 0 * inf = NaN
    *[Row(f"add_sinusoidal/scale-{v}-{np.dtype(dt).name}", lambda a, v=v: AS(a["x"], scale=v),
          ValueError, r"\bscale\b.*float32", x_only(dtype=dt), category="non-finite")
      for v in (1e39, -1e300) for dt in (np.float32, np.float16)],
    Row("add_sinusoidal/positions-ragged", lambda a: AS(a["x"], [[0, 1, 2, 3, 4], [0, 1]]),
        ValueError, r"\bpositions\b", x_only(), category="shape"),
    Row("add_alibi/k_positions-ragged", lambda a: fastpe.add_alibi(
        a["s"], k_positions=[[0, 1], [0, 1, 2, 3, 4, 5]]), ValueError, r"\bk_positions\b",
        lambda: {"s": np.zeros(AS_SHAPE)}, category="shape"),
    Row("RotaryEmbedding/cos_sin-negative-dynamic",
        lambda a: fastpe.RotaryEmbedding(RD, scaling={"rope_type": "dynamic", "factor": 2.0},
                                         max_position_embeddings=16).cos_sin([-5]),
        ValueError, r"\bpositions\b.*-5", category="positions"),
    Row("apply_rope/freqs-nan-named", lambda a: fastpe.apply_rope(
        a["q"], freqs=np.array([1.0, np.nan] * (RD // 4))), ValueError,
        r"freqs\.inv_freq must be finite, got nan", lambda: {"q": q64()}, category="non-finite"),
    Row("RotaryEmbedding/call-positions-ragged-axes", lambda a: fastpe.RotaryEmbedding(
        64, scaling={"rope_type": "default", "mrope_section": [8, 12, 12]})(
        a["q"], None, [[0, 1], [0], [0, 1]]), ValueError, r"\bpositions\b.*rectangular",
        lambda: {"q": x32((1, 2, 1, 64))}, category="shape"),
    # float64 angles are accurate to float32 precision only below 2**32 (both backends)
    Row("table/offset-2**32", lambda a: ST(2, D, offset=2**32 - 1), ValueError,
        r"\boffset\b.*2\*\*32", category="positions"),
    # refused before a table of 2**33 rows is asked of memory
    Row("table/length-past-2**32", lambda a: ST(2**33, 8), ValueError,
        r"\blength and offset\b.*2\*\*32", category="positions"),
    Row("add_sinusoidal/positions-2**32", lambda a: AS(a["x"], [0, 1, 2, 3, 2**32]),
        ValueError, r"\bpositions\b.*2\*\*32", x_only(), category="positions"),
    # fairseq's rows padding_idx + 1 + p: a padding_idx past the limit is named
    Row("table/padding_idx-2**32", lambda a: ST(2, D, padding_idx=2**32, frequencies="fairseq",
                                                layout="split"), ValueError,
        r"\boffset with padding_idx\b.*2\*\*32", category="positions"),
    Row("add_sinusoidal/padding_idx-2**32", lambda a: AS(a["x"], [0, 1, 2, 3, 4],
                                                         padding_idx=2**32,
                                                         frequencies="fairseq", layout="split"),
        ValueError, r"\bpositions with padding_idx\b.*2\*\*32", x_only(),
        category="positions"),
    Row("apply_rope/positions-2**32", lambda a: fastpe.apply_rope(a["q"], None,
                                                                  np.full(RS, 2**32)),
        ValueError, r"\bpositions\b.*2\*\*32", lambda: {"q": q64()}, category="positions"),
    Row("apply_rope/offset-2**32", lambda a: fastpe.apply_rope(a["q"], offset=2**32 - 3),
        ValueError, r"\boffset\b.*2\*\*32", lambda: {"q": q64()}, category="positions"),
    Row("rope_cos_sin/positions-2**32", lambda a: fastpe.rope_cos_sin(
        [2**32], fastpe.rope_frequencies(8)), ValueError, r"\bpositions\b.*2\*\*32",
        category="positions"),
    Row("RotaryEmbedding/call-positions-2**32", lambda a: fastpe.RotaryEmbedding(RD)(
        a["q"], None, np.full(RS, 2**40)), ValueError, r"\bpositions\b.*2\*\*32",
        lambda: {"q": q64()}, category="positions"),
    # silent no-ops: nothing to rotate is a mistake, not a request
    Row("apply_rope/freqs-empty", lambda a: fastpe.apply_rope(a["q"], freqs=np.ones(0)),
        ValueError, r"\bfreqs\.inv_freq\b", lambda: {"q": q64()}, category="shape"),
    Row("apply_rope/freqs-empty-RopeFrequencies", lambda a: fastpe.apply_rope(
        a["q"], freqs=fastpe.RopeFrequencies(np.ones(0), 1.0)), ValueError,
        r"\bfreqs\.inv_freq\b", lambda: {"q": q64()}, category="shape"),
    Row("apply_rope_cached/cos-sin-zero-width", lambda a: fastpe.apply_rope_cached(
        a["q"], None, np.ones((RS, 0)), np.ones((RS, 0))), ValueError, r"\bcos\b.*\bsin\b",
        lambda: {"q": q64()}, category="shape"),
]


# ---- relative biases: tests/test_relative.py's tables, and the overlaps ----------------------


def _relative_row(function, case, defaults=None) -> Row:
    """A row of BAD_T5 / BAD_DEBERTA: (id, scores factory, kwargs, exception, words)."""
    case_id, factory, kwargs, exc, words = case
    defaults = defaults or {}

    def arrays():
        made = {"scores": factory() if factory else np.zeros(
            _relative.DS if function == "add_disentangled_bias" else _relative.S, np.float32)}
        made.update({k: _fresh(v) for k, v in kwargs.items() if isinstance(v, (np.ndarray,
                                                                               list))})
        return made

    def call(a):
        kw = {**defaults, **{k: a.get(k, v) for k, v in kwargs.items()}}
        f = getattr(fastpe, function)
        if function == "add_relative_bias":
            return f(a["scores"], kw.pop("table", _relative.T), **kw)
        return f(a["scores"], **kw)

    return Row(f"{function}/{case_id}", call, exc, _words(words), arrays)


def _args_row(function, case) -> Row:
    """A row of BAD_T5_TABLE / BAD_BUCKET / BAD_DEBERTA_POSITIONS: positional arguments."""
    case_id, args, kwargs, exc, words = case
    args = args if isinstance(args, tuple) else (args,)

    def arrays():
        made = {f"arg{i}": _fresh(v) for i, v in enumerate(args)
                if isinstance(v, (np.ndarray, list))}
        made.update({k: _fresh(v) for k, v in kwargs.items() if isinstance(v, np.ndarray)})
        if case_id == "out-read-only":
            made["out"].flags.writeable = False
        return made

    def call(a):
        pos = [a.get(f"arg{i}", v) for i, v in enumerate(args)]
        return getattr(fastpe, function)(*pos, **{k: a.get(k, v) for k, v in kwargs.items()})

    return Row(f"{function}/{case_id}", call, exc, _words(words), arrays)


def _shared(nbytes=4096):
    return {"buf": np.zeros(nbytes, np.uint8)}


def _f32(buf, start, shape):
    n = int(np.prod(shape))
    return buf[4 * start:4 * (start + n)].view(np.float32).reshape(shape)


ROWS += [_relative_row("add_relative_bias", c) for c in _relative.BAD_T5]
ROWS += [_args_row("relative_bias", c) for c in _relative.BAD_T5_TABLE]
ROWS += [_args_row("relative_position_bucket", c) for c in _relative.BAD_BUCKET]
ROWS += [_relative_row("add_disentangled_bias", c, _relative.DEBERTA_DEFAULTS)
         for c in _relative.BAD_DEBERTA]
ROWS += [_args_row("deberta_relative_positions", c) for c in _relative.BAD_DEBERTA_POSITIONS]
ROWS += [
    Row("relative_bias/out-read-only",
        lambda a: fastpe.relative_bias(_relative.T, 4, 6, out=a["out"]), TypeError,
        _words(["out", "read-only"]), lambda: {"out": read_only(np.zeros((3, 4, 6), np.float32))}),
    Row("add_relative_bias/table-overlaps-scores",
        lambda a: fastpe.add_relative_bias(_f32(a["buf"], 0, _relative.S),
                                           _f32(a["buf"], 40, (32, 3))),
        ValueError, _overlap("table", "scores"), _shared),
    Row("add_relative_bias/key_mask-overlaps-scores",
        lambda a: fastpe.add_relative_bias(_f32(a["buf"], 0, _relative.S), _relative.T,
                                           key_mask=a["buf"][:6].view(bool)),
        ValueError, _overlap("key_mask", "scores"), _shared),
    Row("relative_bias/out-overlaps-table",
        lambda a: fastpe.relative_bias(_f32(a["buf"], 10, (32, 3)), 4, 6,
                                       out=_f32(a["buf"], 0, (3, 4, 6))),
        ValueError, _overlap("table", "out"), _shared),
    Row("add_disentangled_bias/c2p-overlaps-scores",
        lambda a: fastpe.add_disentangled_bias(_f32(a["buf"], 0, _relative.DS),
                                               c2p=_f32(a["buf"], 0, (2, 3, 5, 16)),
                                               position_buckets=8, max_relative_positions=24),
        ValueError, _overlap("c2p", "scores"), lambda: _shared(8192)),
    Row("RelativeBias/num_buckets-str", lambda a: fastpe.RelativeBias("32"), TypeError,
        r"\bnum_buckets\b"),
    Row("RelativeBias/num_buckets-too-few", lambda a: fastpe.RelativeBias(3), ValueError,
        r"\bnum_buckets\b"),
    Row("RelativeBias/config-list", lambda a: fastpe.RelativeBias.from_hf_config([1]),
        TypeError, r"\bconfig\b"),
    Row("RelativeBias/model_type-unknown",
        lambda a: fastpe.RelativeBias.from_hf_config({"model_type": "gpt2"}), ValueError,
        r"\bmodel_type\b"),
    Row("RelativeBias/decoder-str",
        lambda a: fastpe.RelativeBias.from_hf_config({"model_type": "t5"}, decoder="yes"),
        TypeError, r"\bdecoder\b"),
    Row("DisentangledBias/c2p-text", lambda a: fastpe.DisentangledBias(
        max_relative_positions=8, c2p="yes"), TypeError, r"\bc2p\b"),
    Row("DisentangledBias/config-list", lambda a: fastpe.DisentangledBias.from_hf_config([1]),
        TypeError, r"\bconfig\b"),
    Row("DisentangledBias/model_type-unknown",
        lambda a: fastpe.DisentangledBias.from_hf_config({"model_type": "bert"}), ValueError,
        r"\bmodel_type\b"),
]


# ---- the test --------------------------------------------------------------------------------

ROWS_BY_ID = {r.id: r for r in ROWS}
assert len(ROWS_BY_ID) == len(ROWS), "duplicate row ids"

BACKENDS = ("cython", "numpy")
TESTS_DIR = Path(__file__).resolve().parent


def _snap(obj):
    return snapshot(obj) if isinstance(obj, np.ndarray) else copy.deepcopy(obj)


def check_row(row: Row, backend: str) -> BaseException:
    """Run one row on one backend: the exception, its class and message, and nothing
    changed (arrays, thread count, backend); returns the exception."""
    arrays = row.arrays()
    before = {k: _snap(v) for k, v in arrays.items()}
    state = fastpe.get_num_threads()
    with fastpe.use_backend(backend):
        with pytest.raises(row.exc, match=row.match) as info:
            row.call(arrays)
        assert fastpe.backend() == backend
    for name, old in before.items():
        assert _snap(arrays[name]) == old, f"{row.id}: {name} changed by a failed call"
    assert fastpe.get_num_threads() == state, f"{row.id}: the thread count changed"
    # one exception class per rule, not a subclass picked by accident (e.g. OverflowError)
    assert type(info.value) is row.exc, f"{row.id}: {type(info.value).__name__}: {info.value}"
    return info.value


ISOLATED = """
import sys
sys.path.insert(0, sys.argv[1])
import test_bad_input as t
t.check_row(t.ROWS_BY_ID[sys.argv[2]], sys.argv[3])
print("OK")
"""


def _params():
    out = []
    for row in ROWS:
        for backend in BACKENDS:
            marks = []
            for m in row.marks:
                if isinstance(m, tuple):           # (backend, mark): that backend only
                    if m[0] == backend:
                        marks.append(m[1])
                else:
                    marks.append(m)
            if backend == "cython" and not COMPILED:
                marks.append(pytest.mark.skip(reason="the compiled extension is not built"))
            out.append(pytest.param(row, backend, id=f"{row.id}-{backend}", marks=marks))
    return out


@pytest.mark.parametrize("row, backend", _params())
def test_bad_input(row, backend):
    if row.isolate and backend == "cython":
        proc = run_python(ISOLATED, str(TESTS_DIR), row.id, backend)
        lines = proc.stdout.strip().splitlines()
        assert proc.returncode == 0 and lines and lines[-1] == "OK", (
            f"{row.id} in a fresh interpreter: rc {proc.returncode} (negative: killed by that "
            f"signal), stderr: {proc.stderr[-2000:]}")
        return
    check_row(row, backend)


@pytest.mark.skipif(not COMPILED, reason="needs both backends")
@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS
                                 if not r.isolate and not r.marks])
def test_both_backends_give_the_same_error(row):
    """One validator per backend, held equal: the compiled backend's error for each row is
    the NumPy backend's, class and message."""
    got = check_row(row, "cython")
    want = check_row(row, "numpy")
    assert (type(got), str(got)) == (type(want), str(want)), row.id


# ---- fork: a child forked after a threaded call -------------------------------------------

FORK = """
import multiprocessing as mp, sys
import numpy as np, fastpe

def calls():
    x = np.zeros((4096, 256), np.float32)          # 4 MiB, many work units: a threaded call
    q = np.ones((1, 2048, 4, 64), np.float32)
    s = np.zeros((1, 8, 256, 256), np.float32)
    yield "add_sinusoidal", fastpe.add_sinusoidal(x, num_threads=2), \\
        fastpe.reference.add_sinusoidal(np.zeros_like(x))
    yield "apply_rope", fastpe.apply_rope(q, num_threads=2)[0], \\
        fastpe.reference.apply_rope(np.ones_like(q))[0]
    yield "add_alibi", fastpe.add_alibi(s, num_threads=2), \\
        fastpe.reference.add_alibi(np.zeros_like(s))

def child(queue):
    errors = [name for name, got, want in calls() if not np.allclose(got, want, atol=1e-5)]
    queue.put((fastpe.get_num_threads(), errors))

list(calls())                                      # the parent's OpenMP pool exists now
ctx = mp.get_context("fork")
queue = ctx.Queue()
proc = ctx.Process(target=child, args=(queue,))
proc.start()
proc.join(25)
if proc.is_alive():
    proc.kill()
    sys.exit("the forked child hung")
print(proc.exitcode, *queue.get(timeout=5))
"""


@pytest.mark.skipif(not COMPILED or not hasattr(__import__("os"), "fork"),
                    reason="needs the compiled extension and fork()")
def test_forked_child_after_a_threaded_call():
    """GNU OpenMP's thread pool does not survive fork(): a child that entered a parallel
    region would wait forever for its parent's threads. fastpe runs such a child on one
    thread (the default start method of multiprocessing on Linux before Python 3.14 is
    fork)."""
    proc = run_python(FORK, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "1", "[]"], proc.stdout


# ---- coverage of the matrix ------------------------------------------------------------------

# Keywords of row ids, in order: the first category whose pattern matches a case id is its
# category (rows may also say it themselves).
CATEGORY_PATTERNS = [
    ("overlap", r"overlap|zero-stride|k-is-q|view-of-q|same-buffer"),
    ("read-only", r"read-only|broadcast_to"),
    ("positions", r"position|offset|max_len|seq-longer"),
    ("non-finite", r"nan|inf"),
    ("dtype", r"int|complex|dtype|half-for|float16"),
    ("rank", r"\dd\b|rank|dims|2d|1d|3d|4d"),
    ("shape", r"shape|differs|mismatch|batch|wider|head_dim|rows|dim$|length"),
    ("type", r"list|str|none|bool|float|text|scores-list"),
]


def category(row: Row) -> str:
    if row.category:
        return row.category
    case = row.id.split("/", 1)[1]
    for name, pattern in CATEGORY_PATTERNS:
        if re.search(pattern, case):
            return name
    return "value"


ALL = {"type", "dtype", "rank", "shape", "read-only", "positions", "non-finite", "overlap"}
REQUIRED = {
    "table": ALL,                 # offset is its position; out, the overlapping output
    "add_sinusoidal": ALL,
    "add_learned": ALL - {"non-finite"},                # no float parameter
    "apply_rope": ALL,
    "apply_rope_cached": ALL - {"non-finite"},          # cos/sin are data, not parameters
    "rope_cos_sin": {"type", "dtype", "rank", "positions", "non-finite"},
    "RotaryEmbedding": ALL,
    "rope_frequencies": {"type", "non-finite", "value"},
    "add_alibi": ALL,
    "alibi_bias": ALL,
    "alibi_slopes": {"type", "non-finite", "value"},
    "mrope_positions": {"type", "value"},
    "vision_positions": {"type", "value"},
    "dinov3_positions": {"type", "value"},
    "sam2_memory_positions": {"type", "value"},
    "sam3_vit_positions": {"type", "value"},
    "efficientloftr_positions": {"type", "value"},
    "set_num_threads": {"type", "value"},
    "use_backend": {"value"},
    "add_relative_bias": ALL,
    "relative_bias": ALL,
    "relative_position_bucket": {"type", "value", "positions"},
    "add_disentangled_bias": ALL - {"non-finite"},    # integer settings, logits are data
    "deberta_relative_positions": {"type", "value"},
    "RelativeBias": {"type", "value"},
    "DisentangledBias": {"type", "value"},
}


def test_matrix_covers_every_function():
    """Every public function that takes arguments has rows, of every category of bad
    input that applies to it (sinusoidal_table has no read input to overlap its out
    but a zero-stride out; rope_cos_sin has no output argument)."""
    covered: dict[str, set[str]] = {}
    for row in ROWS:
        covered.setdefault(row.id.split("/")[0], set()).add(category(row))
    public = {n for n in fastpe.__all__ if callable(getattr(fastpe, n))} - {
        "backend", "get_num_threads", "info", "RopeFrequencies"}   # no arguments / a record
    names = {"sinusoidal_table": "table"}
    assert {names.get(n, n) for n in public} <= set(REQUIRED), "a public function has no rows"
    missing = {f: sorted(REQUIRED[f] - covered.get(f, set())) for f in REQUIRED}
    assert not {f: m for f, m in missing.items() if m}, f"categories without a row: {missing}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_offset_beyond_int64_with_no_rows_is_a_value_error(backend):
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=r"\boffset\b"):
        ST(0, D, offset=2**70)
