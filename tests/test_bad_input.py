"""Bad input, table-driven: every public function of the foundation issue against every kind
of wrong argument, on both backends.

Each row gives the call, the exception class DESIGN.md's rule asks for (TypeError for a
wrong type or dtype or a read-only buffer, ValueError for shapes and values, IndexError for
a position outside a learned table), and a regex the message must match: it names the
argument. After the failed call every array the caller passed is byte-identical (and has
the same dtype, shape, strides and writeable flag), and fastpe's thread count and backend
are what they were.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import COMPILED, snapshot

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
    id: str
    call: Callable[[dict], object]
    exc: type[Exception]
    match: str
    arrays: Callable[[], dict] = field(default=dict)


def x_only(**kw):
    return lambda: {"x": x32(**kw)}


def x_table(**kw):
    return lambda: {"x": x32(), "table": table32(**kw)}


BAD_BASES = [("zero", 0.0), ("negative", -10.0), ("nan", float("nan")),
             ("inf", float("inf")), ("-inf", -float("inf"))]
BAD_THREADS = [("0", 0, ValueError), ("str", "2", TypeError), ("bool", True, TypeError),
               ("float", 1.5, TypeError)]

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
        ValueError, r"\bpositions\b.*shape", x_only()),
    Row("add_sinusoidal/positions-batch", lambda a: AS(a["x"], np.zeros((B + 1, S), int)),
        ValueError, r"\bpositions\b.*shape", x_only()),
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
    Row("use_backend/unknown", lambda a: _enter_backend("bogus"), ValueError, r"\bname\b"),
    Row("use_backend/none", lambda a: _enter_backend(None), ValueError, r"\bname\b"),
    Row("use_backend/wrong-case", lambda a: _enter_backend("NumPy"), ValueError, r"\bname\b"),
    Row("use_backend/int", lambda a: _enter_backend(1), ValueError, r"\bname\b"),
]

BACKENDS = [pytest.param("cython", marks=pytest.mark.skipif(
    not COMPILED, reason="the compiled extension is not built")), "numpy"]


def _snap(obj):
    return snapshot(obj) if isinstance(obj, np.ndarray) else copy.deepcopy(obj)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row, backend):
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


def test_every_public_function_has_rows():
    """The table covers every public function of the foundation issue."""
    covered = {r.id.split("/")[0] for r in ROWS}
    assert covered >= {"table", "add_sinusoidal", "add_learned", "set_num_threads",
                       "use_backend"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_offset_beyond_int64_with_no_rows_is_a_value_error(backend):
    with fastpe.use_backend(backend), pytest.raises(ValueError, match=r"\boffset\b"):
        ST(0, D, offset=2**70)
