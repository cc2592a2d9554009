"""T5's bucketed relative bias and DeBERTa's disentangled bias against transformers' own
code (tests/data/hf_relative_reference.*, made by make_hf_relative_reference.py: no torch
needed here), the compiled kernels against fastpe.reference on every dtype, layout and
thread count, the config loaders, and the bad-input rows (run by tests/test_bad_input.py).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    COMPILED,
    DTYPE_IDS,
    F32,
    FLOAT_DTYPES,
    HALF_DTYPES,
    as_f64,
    assert_bytes_equal,
    assert_close,
    awkward_kinds,
    make_awkward,
    needs_compiled,
    teams_asked,
)
from test_alibi import BAD_ADD, S, _read_only, _strided_zero  # S: (2, 3, 4, 6) scores

import fastpe
from fastpe import _relative_math

DATA = Path(__file__).parent / "data"
BACKENDS = ["cython", "numpy"]


@cache
def fixtures():
    meta = json.loads((DATA / "hf_relative_reference.json").read_text())
    with np.load(DATA / "hf_relative_reference.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return meta, arrays


def cases(kind):
    return [c for c in fixtures()[0]["cases"] if c["kind"] == kind]


def test_checked_version_is_the_fixtures():
    # the version the refusal messages name is the one the fixture was generated with
    version = fixtures()[0]["transformers_version"]
    assert ".".join(version.split(".")[:2]) == fastpe.relative.TRANSFORMERS_CHECKED


def ids(kind):
    return [c["name"] for c in cases(kind)]


@pytest.fixture
def compiled_entry():
    """The compiled backend, whichever the run's default (FASTPE_BACKEND=numpy too)."""
    with fastpe.use_backend("cython"):
        yield


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "cython" and fastpe._backend.compiled is None:
        pytest.skip("the compiled extension is not built")
    with fastpe.use_backend(request.param):
        yield request.param


# ---- T5 buckets: every distance, bit-exact ------------------------------------------------------


@pytest.mark.parametrize("case", cases("buckets"), ids=ids("buckets"))
def test_buckets_equal_transformers_for_every_distance(case):
    reach = fixtures()[0]["reach"]
    want = fixtures()[1][f"buckets/{case['name']}"]
    d = np.arange(-reach, reach + 1)
    got = fastpe.relative_position_bucket(d, bidirectional=case["bidirectional"],
                                          num_buckets=case["num_buckets"],
                                          max_distance=case["max_distance"])
    assert got.dtype == np.int64 and got.shape == d.shape
    bad = np.nonzero(got != want)[0]
    assert not bad.size, f"{case['name']}: distance {d[bad[0]]}: {got[bad[0]]} != {want[bad[0]]}"


def test_buckets_past_the_fixture_range_are_the_last():
    far = np.array([-2**62, -2**40, -2**24 - 1, 2**24 + 1, 2**40, 2**62])
    assert fastpe.relative_position_bucket(far).tolist() == [15, 15, 15, 31, 31, 31]
    assert fastpe.relative_position_bucket(far, bidirectional=False).tolist() == [31] * 3 + [0] * 3


def test_bucket_shapes_and_dtypes():
    for d in (np.int8(-3), np.arange(5, dtype=np.uint8)[::2], [[1, -1], [0, 200]]):
        got = fastpe.relative_position_bucket(d)
        assert got.shape == np.shape(d) and got.dtype == np.int64


# ---- T5: the families' compute_bias --------------------------------------------------------------


def t5_settings(case):
    cfg = case["config"]
    return dict(bidirectional=not case["decoder"],
                max_distance=128 if case["family"] == "mpnet"
                else cfg["relative_attention_max_distance"])


@pytest.mark.parametrize("case", cases("t5"), ids=ids("t5"))
def test_relative_bias_equals_compute_bias(case, backend):
    arrays = fixtures()[1]
    name, q, k = case["name"], case["q_len"], case["k_len"]
    table, want = arrays[f"t5/{name}/table"], arrays[f"t5/{name}/bias"]
    if case["family"] == "mpnet":
        table = table[:32]    # MPNet's code buckets into 32 whatever its table's rows
    got = fastpe.relative_bias(table, q, k, q_offset=case["past_seen_tokens"],
                               **t5_settings(case))
    assert got.dtype == table.dtype
    assert_bytes_equal(got, want, name)
    # the bucket of every (query, key): a table holding its own row numbers
    coded = np.repeat(np.arange(table.shape[0], dtype=np.float64)[:, None], table.shape[1], 1)
    got = fastpe.relative_bias(coded, q, k, q_offset=case["past_seen_tokens"],
                               **t5_settings(case))
    assert np.array_equal(got, arrays[f"t5/{name}"]), name


@pytest.mark.parametrize("case", cases("t5"), ids=ids("t5"))
def test_loader_reproduces_the_module(case, backend):
    """from_hf_config of the config the module was built from: the same settings; the
    decoder's bias is the module's with the causal mask the decoder adds."""
    arrays = fixtures()[1]
    name, q, k, past = case["name"], case["q_len"], case["k_len"], case["past_seen_tokens"]
    rb = fastpe.RelativeBias.from_hf_config(case["config"], decoder=case["decoder"])
    assert rb.bidirectional == (not case["decoder"]) and rb.causal == case["decoder"]
    want = arrays[f"t5/{name}/bias"].astype(np.float64)
    if case["decoder"]:
        future = np.arange(k)[None, :] > past + np.arange(q)[:, None]
        want = np.where(future, -np.inf, want)
    table = arrays[f"t5/{name}/table"]
    assert_bytes_equal(rb.bias(table, q, k, q_offset=past, dtype="float64"), want, name)
    scores = np.zeros((2, table.shape[1], q, k))
    rb(scores, table, q_offset=past)
    assert_bytes_equal(scores[1], want, name)


def test_default_q_offset_puts_the_queries_last():
    table = np.random.default_rng(0).standard_normal((32, 3))
    assert np.array_equal(fastpe.relative_bias(table, 4, 50),
                          fastpe.relative_bias(table, 50, 50)[:, -4:])
    with pytest.raises(ValueError, match="q_offset"):
        fastpe.relative_bias(table, 5, 4)
    assert fastpe.relative_bias(table, 5, 4, q_offset=0).shape == (3, 5, 4)


def test_a_float64_table_past_the_half_range_is_infinite_without_a_warning(backend):
    """Rounded once to float16 (as a float32 table is): inf, and no NumPy warning leaks."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fastpe.relative_bias(np.full((32, 1), 1e6), 1, 2, dtype=np.float16)
    assert got.dtype == np.float16 and np.isposinf(got).all()


def test_causal_queries_at_the_last_int64_positions_see_every_key(backend):
    """Queries up to position 2**63 - 1 come after every key: nothing masked, each
    key in the last bucket of its direction (the formula, not another backend)."""
    table = np.arange(64, dtype=np.float32).reshape(32, 2)
    for q in (1, 3):
        scores = np.zeros((1, 2, q, 5), np.float32)
        fastpe.add_relative_bias(scores, table, q_offset=2**63 - q, causal=True,
                                 bidirectional=False)
        # unidirectional: a key far before the query is in bucket num_buckets - 1
        assert np.array_equal(scores[0], np.broadcast_to(table[31][:, None, None], (2, q, 5)))
        got = fastpe.relative_bias(table, q, 5, q_offset=2**63 - q, causal=True,
                                   bidirectional=False)
        assert np.array_equal(got, scores[0])


# ---- T5: the kernels against the reference ----------------------------------------------------------


def t5_inputs(shape, dtype, seed=0, num_buckets=32, mask_rows=None):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((num_buckets, shape[-3])).astype(np.float32)
    rows = int(np.prod(shape[:-3])) if mask_rows is None else mask_rows
    mask = rng.random((rows, shape[-1])) > 0.3
    return table, mask


T5_OPTIONS = {
    "plain": {},
    "decoder": {"bidirectional": False, "causal": True},
    "mask": {"key_mask": True},
    "decode": {"q_offset": 700, "bidirectional": False, "causal": True, "key_mask": True},
    "far": {"q_offset": 2**40, "max_distance": 20},
    "ahead": {"q_offset": 0, "causal": True},
}


def t5_call(option, table, mask):
    kw = dict(T5_OPTIONS[option])
    if kw.pop("key_mask", False):
        kw["key_mask"] = mask
    return lambda f, s: f(s, table, **kw)


SHAPES = [(2, 3, 9, 300), (1, 4, 1, 257), (3, 2, 40, 41), (2, 2, 3, 5, 70)]
LAYOUTS = ["contiguous", "fortran", "strided-last", "strided-rows", "reversed", "byteswapped",
           "unaligned", "odd-byte-stride"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", list(T5_OPTIONS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_add_relative_bias_matches_reference(shape, dtype, option, both_threads):
    table, mask = t5_inputs(shape, dtype)
    call = t5_call(option, table, mask)
    base = make_awkward("contiguous", shape, dtype)
    want = call(fastpe.reference.add_relative_bias, base.copy())
    for layout in [k for k in awkward_kinds(shape, dtype) if k in LAYOUTS]:
        got = make_awkward(layout, shape, dtype)
        call(lambda s, t, **kw: fastpe.add_relative_bias(s, t, num_threads=both_threads, **kw),
             got)
        assert_bytes_equal(np.asarray(got, dtype=dtype), want, f"{option} {layout}")


# Views whose queries lie closer in memory than their keys (K @ Q^T transposed), which the
# kernels walk key column by key column (from 16 queries on); 300 queries pass a column
# chunk of the strided loops (256).
COLUMN_SHAPES = [(2, 3, 40, 41), (1, 1, 300, 301), (2, 2, 3, 33, 70)]
COLUMN_OPTIONS = {**T5_OPTIONS,
                  "last": {"q_offset": 2**63 - 300, "causal": True, "key_mask": True},
                  "near": {"q_offset": 5, "causal": True, "max_distance": 20}}


def column_views(values):
    """(name, view) of values (..., h, q, k) laid out with the queries nearer in memory than
    the keys: transposed, every other query of a transposed buffer, reversed queries,
    Fortran order."""
    nd = values.ndim
    perm = (*range(nd - 2), nd - 1, nd - 2)
    yield "transposed", values.transpose(perm).copy().transpose(perm)
    wide = np.zeros(values.shape[:-2] + (values.shape[-1], 2 * values.shape[-2]), values.dtype)
    every_other = wide[..., ::2].transpose(perm)
    every_other[...] = values
    yield "every-other-query", every_other
    reversed_queries = values.transpose(perm).copy()[..., ::-1].transpose(perm)
    reversed_queries[...] = values
    yield "reversed-queries", reversed_queries
    yield "fortran", np.asfortranarray(values)


def column_call(option, table, mask):
    kw = dict(COLUMN_OPTIONS[option])
    if kw.pop("key_mask", False):
        kw["key_mask"] = mask
    return lambda f, s: f(s, table, **kw)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", list(COLUMN_OPTIONS))
@pytest.mark.parametrize("shape", COLUMN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_transposed_scores_get_the_contiguous_bits(shape, dtype, option, both_threads):
    """Scores whose queries are adjacent in memory get the bits of the same call on
    contiguous scores and of the reference, infinities and NaNs among them."""
    table, mask = t5_inputs(shape, dtype)
    call = column_call(option, table, mask)
    base = make_awkward("contiguous", shape, dtype)
    base.reshape(-1)[::37] = np.inf
    base.reshape(-1)[5::41] = -np.inf
    base.reshape(-1)[11::43] = np.nan
    want = call(fastpe.reference.add_relative_bias, base.copy())

    def add(s, t, **kw):
        return fastpe.add_relative_bias(s, t, num_threads=both_threads, **kw)

    assert_bytes_equal(call(add, base.copy()), want, "contiguous")
    for name, view in column_views(base):
        assert_bytes_equal(call(add, view), want, f"{option} {name}")
    if len(shape) == 4 and "key_mask" not in COLUMN_OPTIONS[option]:
        # the bias alone, written into transposed scores
        kw = {k: v for k, v in COLUMN_OPTIONS[option].items() if k != "key_mask"}
        bias = fastpe.reference.relative_bias(table, *shape[-2:], dtype=dtype, **kw)
        for name, out in column_views(np.zeros(shape[1:], dtype)):
            got = fastpe.relative_bias(table, *shape[-2:], out=out, num_threads=both_threads,
                                       **kw)
            assert_bytes_equal(got, bias, f"relative_bias {option} {name}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("step", [1, 2, -1])
@pytest.mark.parametrize("option", ["near", "last", "mask"])
def test_transposed_scores_inside_a_buffer_write_only_their_view(option, step, dtype,
                                                                 backend):
    """Transposed scores that are a window of a larger buffer of sentinels: the window gets
    the reference's bits, its first and last queries and keys too, and no sentinel beside,
    before or after a column changes."""
    shape = (2, 3, 37, 45)
    table, mask = t5_inputs(shape, dtype)
    call = column_call(option, table, mask)
    values = make_awkward("contiguous", shape, dtype)
    want = call(fastpe.reference.add_relative_bias, values.copy())
    b, h, q, k = shape
    big = np.full((b + 1, h + 1, k + 3, 2 * q + 5), 777, dtype)   # keys, then queries
    queries = slice(2, 2 + step * q, step) if step > 0 else slice(q + 1, 1, -1)
    window = (slice(1, None), slice(1, None), slice(1, k + 1), queries)
    view = big[window].swapaxes(-1, -2)
    view[...] = values
    before = big.copy()
    call(fastpe.add_relative_bias, view)
    assert_bytes_equal(view, want, f"{option} step {step}")
    inside = np.zeros(big.shape, bool)
    inside[window] = True
    assert_bytes_equal(big[~inside], before[~inside], "outside the view")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_relative_bias_matches_the_table_rounded_once(dtype):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((32, 4))      # float64: rounded once
    # a column of values just past the midpoint of two neighbours of the output type,
    # which a rounding through float32 first would take to the even (often lower) one
    low = np.abs(rng.standard_normal(32)).astype(dtype)
    bits = np.dtype(f"u{low.itemsize}")
    high = (low.view(bits) + 1).view(low.dtype)
    table[:, 1] = (low.astype(np.float64) + high.astype(np.float64)) / 2 * (1 + 2.0**-40)
    got = fastpe.relative_bias(table, 20, 30, dtype=dtype)
    d = np.arange(30)[None, :] - (10 + np.arange(20))[:, None]
    want = np.moveaxis(table[fastpe.relative_position_bucket(d)], -1, 0).astype(dtype)
    assert_bytes_equal(got, want)
    out = np.zeros((4, 20, 30), dtype)
    assert fastpe.relative_bias(table, 20, 30, out=out) is out
    assert_bytes_equal(out, want)


def test_tables_of_any_float_dtype_and_layout(backend):
    table = np.random.default_rng(2).standard_normal((32, 12))[:, ::4]   # strided, float64
    want = fastpe.relative_bias(np.ascontiguousarray(table), 6, 9, dtype="float64")
    for t in (table, table.astype(">f8"), np.asfortranarray(table)):
        assert_bytes_equal(fastpe.relative_bias(t, 6, 9, dtype="float64"), want)
    s = np.zeros((1, 3, 6, 9), np.float32)
    fastpe.add_relative_bias(s, table.astype(">f8"))
    assert_bytes_equal(s[0], want.astype(np.float32))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_a_nan_in_the_table_is_a_nan_in_half_scores(dtype, backend):
    """A float32 table's NaNs, signalling ones and ones with payload bits below the half
    type's (which a rounding of the bits alone carries into inf or -0), give NaN scores,
    at every key of the row loops (vector steps and their tail), as the reference does."""
    bits = np.arange(32 * 2, dtype=np.float32).reshape(32, 2).view(np.uint32)
    bits[::3, 0] = 0x7F800001    # signalling, payload in the low bits only, among finite
    bits[:, 1] = 0xFFFFFFFF      # quiet, negative, every payload bit set
    table = bits.view(np.float32)
    for keys in (1, 8, 16, 40):
        scores = np.linspace(-2, 2, 2 * keys).reshape(1, 2, 1, keys).astype(dtype)
        want = fastpe.reference.add_relative_bias(scores.copy(), table)
        got = fastpe.add_relative_bias(scores, table)
        assert (np.isnan(np.asarray(got, np.float32))
                == np.isnan(np.asarray(want, np.float32))).all(), keys
        assert np.isnan(np.asarray(got[0, 1], np.float32)).all()
        finite = ~np.isnan(np.asarray(want, np.float32))
        assert_bytes_equal(got[finite], want[finite])


def test_masked_keys_are_minus_inf_whatever_the_score():
    scores = np.full((1, 1, 2, 3), np.nan, np.float32)
    scores[0, 0, 0] = [np.inf, -np.inf, 1.0]
    table = np.zeros((32, 1), np.float32)
    fastpe.add_relative_bias(scores, table, key_mask=[1, 0, 0], q_offset=0, causal=True)
    assert scores[0, 0].tolist()[0] == [np.inf, -np.inf, -np.inf]
    assert np.isnan(scores[0, 0, 1, 0]) and np.isneginf(scores[0, 0, 1, 1:]).all()


def test_key_mask_forms():
    table, _ = t5_inputs((2, 3, 4, 6), np.float32)
    s = np.zeros((2, 3, 3, 4, 6), np.float32)
    m = np.random.default_rng(1).random((2, 3, 6)) > 0.5
    a = fastpe.add_relative_bias(s.copy(), table, key_mask=m)
    b = fastpe.add_relative_bias(s.copy(), table, key_mask=m.reshape(6, 6).astype(np.int8))
    assert_bytes_equal(a, b)
    assert np.isneginf(a[~np.broadcast_to(m[:, :, None, None, :], a.shape)]).all()
    shared = fastpe.add_relative_bias(s.copy(), table, key_mask=m[0, 0])
    assert_bytes_equal(shared, fastpe.add_relative_bias(s.copy(), table, key_mask=[m[0, 0]]))


def key_mask_layouts(m):
    """m (rows, k) as masks laid out other than row by row: transposed in memory, a row
    broadcast to every sequence (transformers' mask.expand()), reversed keys."""
    yield "fortran", np.asfortranarray(m), m
    yield "broadcast-row", np.broadcast_to(m[1:2], m.shape), np.repeat(m[1:2], len(m), 0)
    yield "int8-fortran", np.asfortranarray(m.astype(np.int8)), m
    yield "reversed", m[:, ::-1], m[:, ::-1]


@pytest.mark.parametrize("i", range(4))
def test_key_mask_layouts_mask_their_own_keys(i):
    """A mask is read by its values, whatever its layout: -inf exactly on its zeros."""
    table, _ = t5_inputs((3, 2, 4, 7), np.float32)
    m = np.random.default_rng(i).random((3, 7)) > 0.4
    name, mask, values = list(key_mask_layouts(m))[i]
    s = np.zeros((3, 2, 4, 7), np.float32)
    got = fastpe.add_relative_bias(s.copy(), table, key_mask=mask)
    assert_bytes_equal(got, fastpe.add_relative_bias(s.copy(), table,
                                                     key_mask=np.ascontiguousarray(values)),
                       name)
    assert (np.isneginf(got) == ~np.broadcast_to(values[:, None, None, :], got.shape)).all()
    got = fastpe.RelativeBias()(s.copy(), table, key_mask=mask)
    assert (np.isneginf(got) == ~np.broadcast_to(values[:, None, None, :], got.shape)).all()


@needs_compiled
def test_plain_t5_calls_take_the_compiled_entry(compiled_entry, monkeypatch):
    """A decode step on NumPy arrays (padding mask, the settings' own call too) runs in the
    compiled entry, which matches the reference without the validating path; what the
    entry does not take still reaches that path."""
    shape = (2, 3, 1, 9)
    table, mask = t5_inputs(shape, np.float32)
    s = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    kw = {"bidirectional": False, "causal": True, "q_offset": 8}
    want = fastpe.reference.add_relative_bias(s.copy(), table, key_mask=mask, **kw)
    plain = fastpe.reference.add_relative_bias(s.copy(), table, **kw)

    def validating(*args, **kwargs):
        raise AssertionError("the validating path ran")
    monkeypatch.setattr(fastpe._relative_args, "add_relative_bias", validating)
    assert_bytes_equal(fastpe.add_relative_bias(s.copy(), table, key_mask=mask, **kw), want)
    assert_bytes_equal(fastpe.add_relative_bias(s.copy(), table, key_mask=mask.astype(int),
                                                **kw), want)
    settings = fastpe.RelativeBias(bidirectional=False, causal=True)
    assert_bytes_equal(settings(s.copy(), table, q_offset=8), plain)
    assert_bytes_equal(fastpe.add_relative_bias(s.copy(), table, bidirectional=False,
                                                causal=True, num_threads=2), plain)
    inside = np.zeros((1, 3, 4, 32), np.float32)
    declined = [
        ("byteswapped table", s.copy(), dict(table=table.astype(">f4"))),
        ("table inside the scores", inside, dict(table=inside[0, 0, :, :3])),
        ("mask of 2s", s.copy(), dict(table=table, key_mask=mask * 2)),
        ("float max_distance", s.copy(), dict(table=table, max_distance=128.0)),
        ("queries past the keys", np.zeros((2, 3, 10, 9), np.float32), dict(table=table)),
    ]
    for _name, x, args in declined:
        with pytest.raises(AssertionError, match="validating path"):
            fastpe.add_relative_bias(x, **args)


@needs_compiled
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_a_t5_decode_steps_bias_takes_the_compiled_entry(compiled_entry, monkeypatch, dtype):
    """relative_bias of an ndarray table (a decode step's bias, once per step) is written by
    the compiled entry, in the table's dtype, the dtype given or an out, with the
    reference's bits (a table's -0.0 kept: written, not added to zeros); a dtype of
    another byte order, an out of another shape, a float64 table into a half type
    (rounded once there) or a table it does not view go the validating path."""
    table = t5_inputs((8, 1, 40), np.float32)[0].astype(dtype)
    table[np.unravel_index(np.arange(0, table.size, 5), table.shape)] = -0.0
    calls = [dict(q_len=1, k_len=40),
             dict(q_len=3, k_len=40, q_offset=np.int64(50), causal=True, bidirectional=False),
             dict(q_len=0, k_len=7), dict(q_len=1, k_len=1, max_distance=np.int32(20))]
    wants = [fastpe.reference.relative_bias(table, **kw) for kw in calls]
    settings = fastpe.RelativeBias(bidirectional=False, causal=True)
    settings_want = fastpe.reference.relative_bias(table, 2, 9, q_offset=3, causal=True,
                                                   bidirectional=False)
    monkeypatch.setattr(fastpe._relative_args, "relative_bias",
                        lambda *a, **k: pytest.fail("the validating path ran"))
    for kw, want in zip(calls, wants):
        got = fastpe.relative_bias(table, **kw)
        assert got.dtype == table.dtype and got.flags.c_contiguous, kw
        assert_bytes_equal(got, want, str(kw))
        assert_bytes_equal(fastpe.relative_bias(table, dtype=dtype, **kw), want, str(kw))
        out = np.full(want.shape, np.nan, dtype)
        assert fastpe.relative_bias(table, out=out, **kw) is out
        assert_bytes_equal(out, want, f"{kw} into out")
    assert_bytes_equal(settings.bias(table, 2, 9, q_offset=3), settings_want)
    declined = [dict(table=table, q_len=1, k_len=4, dtype=table.dtype.newbyteorder()),
                dict(table=table, q_len=1, k_len=4, out=np.empty((8, 1, 5), dtype)),
                dict(table=table, q_len=1, k_len=4, dtype=dtype, out=np.empty((8, 1, 4))),
                dict(table=table.astype(table.dtype.newbyteorder()), q_len=1, k_len=4),
                dict(table=table.tolist(), q_len=1, k_len=4),
                dict(table=table, q_len=5, k_len=4)]
    if dtype == "float64":
        declined.append(dict(table=table, q_len=1, k_len=4, dtype="float16"))
    for kw in declined:
        with pytest.raises(pytest.fail.Exception, match="validating path"):
            fastpe.relative_bias(**kw)


# ---- threads, views, memory --------------------------------------------------------------------------


@needs_compiled
def test_the_t5_entry_asks_for_the_team_of_a_large_call(compiled_entry, monkeypatch):
    """The compiled entry never calls back into fastpe's Python: given no team for a call
    past the serial size, it returns the bytes the call counts (the scores' bytes, twice
    where read and written, times T5_BYTES_WEIGHT) having written nothing, and
    add_relative_bias and relative_bias ask the thread policy for that many and call
    again."""
    kern = fastpe._backend.compiled
    table, _ = t5_inputs((2, 3, 4, 50), np.float32)
    s0 = np.random.default_rng(5).standard_normal((2, 3, 4, 50)).astype(np.float32)
    s = s0.copy()
    counted = 2 * fastpe._constants.T5_BYTES_WEIGHT * s.nbytes
    fastpe.add_relative_bias(s.copy(), table)            # makes the spec of these settings
    specs = fastpe._relative_math.T5_SPECS
    args = (s, table, True, 128, None, False, None, None, specs, -1)
    assert kern.t5_call(*args, counted, 0, True) == counted
    assert_bytes_equal(s, s0)
    assert kern.t5_call(*args, counted + 1, 0, True) == 1    # below the serial size
    one = s.copy()
    monkeypatch.setattr(fastpe._threads, "SERIAL_BYTES", 1)
    teams = teams_asked(monkeypatch, 2)
    s[:] = s0
    fastpe.add_relative_bias(s, table, num_threads=3)
    assert teams == [(3, counted)]
    assert_bytes_equal(s, one)
    teams.clear()
    bias = fastpe.relative_bias(table, 4, 50, q_offset=0)
    assert teams == [(None, counted // 4)]     # one sequence, written only
    assert_bytes_equal(bias, fastpe.reference.relative_bias(table, 4, 50, q_offset=0))


@needs_compiled
@pytest.mark.parametrize("op", ["t5", "deberta"])
def test_bit_identical_across_threads_above_the_serial_threshold(op, compiled_entry,
                                                                monkeypatch):
    """(2, 8, 256, 512) float32 scores: 8 MiB, 16 MiB touched, above the serial
    threshold, so the threaded loop really runs (units split between threads mid-batch
    and mid-head): every call asks the thread policy for a team of the count given."""
    teams = teams_asked(monkeypatch)
    shape = (2, 8, 256, 512)
    rng = np.random.default_rng(4)
    base = rng.standard_normal(shape).astype(np.float32)
    assert base.nbytes >= 2 * fastpe._threads.SERIAL_BYTES
    if op == "t5":
        table, mask = t5_inputs(shape, np.float32)

        def run(s, n):
            return fastpe.add_relative_bias(s, table, key_mask=mask, causal=True,
                                            q_offset=300, num_threads=n)
    else:
        c2p = rng.standard_normal(shape[:-1] + (512,)).astype(np.float32)
        p2c = rng.standard_normal(shape[:-2] + (512, 512)).astype(np.float32)

        def run(s, n):
            return fastpe.add_disentangled_bias(s[..., :256], c2p=c2p, p2c=p2c[..., :256, :],
                                                position_buckets=256,
                                                max_relative_positions=512, num_threads=n)
    one = base.copy()
    run(one, 1)
    want = base.copy()
    with fastpe.use_backend("numpy"):
        run(want, 1)
    assert_bytes_equal(one, want, "1 thread vs reference")
    for n in (2, 3, 7):
        got = base.copy()
        teams.clear()
        run(got, n)
        assert [(t, nbytes >= fastpe._threads.SERIAL_BYTES) for t, nbytes in teams] \
            == [(n, True)], teams
        assert_bytes_equal(got, one, f"{n} threads")


@pytest.mark.parametrize("op", ["t5", "deberta"])
def test_no_writes_outside_the_view(op, backend):
    big = np.random.default_rng(5).standard_normal((2, 4, 30, 50)).astype(np.float32)
    before = big.copy()
    view = big[1, 1:3, 2:25:2, 5:45]                      # (2, 12, 40)
    if op == "t5":
        fastpe.add_relative_bias(view, np.ones((32, 2), np.float32), causal=True, q_offset=3)
    else:
        fastpe.add_disentangled_bias(view, c2p=np.ones((2, 12, 16), np.float32),
                                     max_relative_positions=8)
    inside = np.zeros(big.shape, bool)
    inside[1, 1:3, 2:25:2, 5:45] = True
    assert np.array_equal(big[~inside], before[~inside])
    assert not np.array_equal(big[inside], before[inside])


def test_torch_scores_are_written_in_place():
    torch = pytest.importorskip("torch")
    s = torch.zeros(1, 2, 3, 5)
    table = np.random.default_rng(0).standard_normal((32, 2)).astype(np.float32)
    assert fastpe.add_relative_bias(s, table) is s
    assert np.array_equal(s.numpy(), fastpe.relative_bias(table, 3, 5)[None])


@needs_compiled
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_t5_decode_step_on_torch_tensors_takes_the_compiled_entry(compiled_entry, monkeypatch, dtype):
    """A T5 decoder's step on the model's own tensors (scores, its weight table and its
    attention_mask): the reference's result, the scores' version bumped, without the
    validating path; what torch would refuse still reaches that path."""
    torch = pytest.importorskip("torch")
    shape = (2, 3, 1, 9)
    table, mask = t5_inputs(shape, np.float32)
    scores = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(
        getattr(torch, dtype))
    kw = {"bidirectional": False, "causal": True}
    want = fastpe.reference.add_relative_bias(scores.float().numpy().astype(
        np.float32), table, key_mask=mask, **kw)
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        # the first bfloat16 call registers the type with the compiled module
        fastpe.add_relative_bias(scores.clone(), table, **kw)
    monkeypatch.setattr(fastpe._relative_args, "add_relative_bias",
                        lambda *a, **k: pytest.fail("the validating path ran"))
    version = scores._version
    got = fastpe.add_relative_bias(scores, torch.from_numpy(table),
                                   key_mask=torch.from_numpy(mask.astype(np.int64)), **kw)
    assert got is scores and scores._version > version
    assert_bytes_equal(scores.float().numpy(), torch.from_numpy(want).to(
        getattr(torch, dtype)).float().numpy())
    monkeypatch.undo()
    inside = torch.zeros(1, 2, 4, 32)
    refused = [
        (torch.zeros(shape, requires_grad=True), torch.from_numpy(table), "requires grad"),
        (inside, inside[0, :, 0, :].T, "table overlaps scores"),
    ]
    with torch.inference_mode():
        refused.append((torch.zeros(shape), torch.from_numpy(table), "inference"))
    for s, t, words in refused:
        before = s.detach().clone()
        with pytest.raises((TypeError, ValueError, RuntimeError), match=words):
            fastpe.add_relative_bias(s, t, **kw)
        assert torch.equal(s.detach(), before)


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_scores_of_more_dimensions_than_the_entry_views(backend):
    """Scores of 9 and 10 dimensions (more leading dims than the compiled entry views) are
    written index by index of their first axis, each with its sequences' mask rows: the
    reference's bits (the validating path's call was declined as a bug)."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    rng = np.random.default_rng(9)
    for lead in [(2, 1, 1, 1, 1, 3), (1, 2, 1, 1, 1, 1, 2)]:
        shape = lead + (2, 3, 5)
        table, _ = t5_inputs(shape, np.float32)
        mask = rng.random(lead + (5,)) > 0.3
        s0 = rng.standard_normal(shape).astype(np.float32)
        want = fastpe.reference.add_relative_bias(s0.copy(), table, key_mask=mask, causal=True)
        with fastpe.use_backend(backend):
            got = fastpe.add_relative_bias(s0.copy(), table, key_mask=mask, causal=True)
            assert_bytes_equal(got, want, f"{len(shape)} dimensions")
            assert_bytes_equal(fastpe.RelativeBias(causal=True)(s0.copy(), table,
                                                                key_mask=mask), want)


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_a_table_in_the_gaps_of_the_scores_is_read(backend):
    """A table whose elements lie between the scores' (no byte shared, which the exact
    check proves but byte ranges do not) is read as its values: the reference's bits
    (the compiled entry declined the validated call as a bug)."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    from numpy.lib.stride_tricks import as_strided
    buf = np.zeros(64, np.float32)
    x = as_strided(buf, (1, 3, 3), (256, 40, 4), writeable=True)   # elements 0-2, 10-12, 20-22
    t = as_strided(buf[16:], (2, 1), (36, 4), writeable=True)      # elements 16 and 25
    t[:] = [[1.0], [2.0]]
    kw = dict(bidirectional=False, max_distance=8, q_offset=0)
    want = fastpe.reference.add_relative_bias(np.array(x), np.array(t), **kw)
    with fastpe.use_backend(backend):
        assert_bytes_equal(np.array(fastpe.add_relative_bias(x, t, **kw)), want)
        np.testing.assert_array_equal(fastpe.relative_bias(t, 3, 3, out=x, **kw),
                                      fastpe.reference.relative_bias(np.array(t), 3, 3, **kw))


@needs_compiled
def test_a_table_resized_between_calls_is_bucketed_by_its_rows_then(compiled_entry):
    """The entry takes the buckets of the row count of the table it views (one view: no
    Python runs between reading the rows and reading the values), so a table another
    thread resized (Tensor.set_) is read whole at its new row count, never past it."""
    torch = pytest.importorskip("torch")
    scores = torch.zeros(1, 3, 1, 1)
    table = torch.ones(32, 3)
    fastpe.add_relative_bias(scores, table, q_offset=100)    # distance -100: bucket 15 of 32
    assert torch.equal(scores, torch.ones_like(scores))
    beyond = torch.full((32, 3), 7.0)
    smaller = beyond[:4]
    smaller[1] = 2.0                                          # -100 of 4 buckets: bucket 1
    table.set_(smaller)
    fastpe.add_relative_bias(scores, table, q_offset=100)
    assert torch.equal(scores, torch.full_like(scores, 3.0))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_tensors_without_a_strided_view_are_named():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="scores"):
        fastpe.add_relative_bias(torch.zeros(1, 2, 3, 5).to_sparse(), np.zeros((32, 2)))
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(2)])
    for call in (fastpe.add_relative_bias, fastpe.RelativeBias(32)):
        with pytest.raises(TypeError, match="table"):
            call(torch.zeros(1, 2, 3, 5), nested)


def test_no_queries_at_an_offset_past_int64_write_nothing(backend):
    table = np.ones((32, 3), np.float32)
    scores = np.zeros((1, 3, 0, 9), np.float32)
    assert fastpe.add_relative_bias(scores, table, q_offset=2**63) is scores
    assert fastpe.relative_bias(table, 0, 9, q_offset=2**63).shape == (3, 0, 9)


# ---- DeBERTa: positions --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", cases("deberta_positions"), ids=ids("deberta_positions"))
def test_deberta_log_positions_equal_transformers_for_every_distance(case):
    """make_log_bucket_position of every distance below 2**18 (query - key); DeBERTa's
    log positions do not saturate, and far past any context torch's float32 log (1 ulp
    below the correctly rounded one at 403269 for 256/512) can move one: see
    fastpe._relative_math."""
    reach = fixtures()[0]["reach"]
    want = fixtures()[1][f"deberta_positions/{case['name']}"]
    kw = dict(position_buckets=case["position_buckets"],
              max_relative_positions=case["max_relative_positions"])
    before = fastpe.deberta_relative_positions(1, reach + 1, **kw)[0, ::-1]   # -reach .. 0
    after = fastpe.deberta_relative_positions(reach + 1, 1, **kw)[1:, 0]      # 1 .. reach
    got = np.concatenate([before, after])
    bad = np.nonzero(got != want)[0]
    assert not bad.size, (f"{kw}: distance {bad[0] - reach}: {got[bad[0]]} != "
                          f"{want[bad[0]]}")


@pytest.mark.parametrize("case", cases("deberta_build"), ids=ids("deberta_build"))
def test_deberta_relative_positions_equal_build_relative_position(case):
    got = fastpe.deberta_relative_positions(case["q_len"], case["k_len"],
                                            position_buckets=case["position_buckets"],
                                            max_relative_positions=case["max_relative_positions"])
    assert got.dtype == np.int64
    assert np.array_equal(got, fixtures()[1][f"deberta_positions/{case['name']}"])


# ---- DeBERTa: the gathers -------------------------------------------------------------------------------


def deberta_settings(case):
    cfg = case["config"]
    mr = cfg.get("max_relative_positions", -1)
    return dict(position_buckets=cfg.get("position_buckets", -1),
                max_relative_positions=mr if mr >= 1 else cfg["max_position_embeddings"])


@pytest.mark.parametrize("case", cases("deberta_index"), ids=ids("deberta_index"))
def test_disentangled_gathers_equal_transformers(case, backend):
    """transformers' own gathers (the column each of its c2p and p2c reads decoded from a
    run of its code) applied to random logits, against fastpe on both backends."""
    index = fixtures()[1][f"deberta_index/{case['name']}"].astype(np.int64)
    n, span = case["length"], case["span"]
    rng = np.random.default_rng(6)
    scores = rng.standard_normal((1, 2, n, n))
    c2p = rng.standard_normal((1, 2, n, 2 * span)) if "c2p" in case["pos_att_type"] else None
    p2c = rng.standard_normal((1, 2, n, 2 * span)) if "p2c" in case["pos_att_type"] else None
    term = np.zeros_like(scores)
    if c2p is not None:
        term += np.take_along_axis(c2p, np.broadcast_to(index[0], scores.shape), axis=-1)
    if p2c is not None:
        # element (i, j) reads p2c[j, index[1][i, j]]
        cols = np.broadcast_to(index[1].T, scores.shape)
        term += np.swapaxes(np.take_along_axis(p2c, cols, axis=-1), -1, -2)
    want = scores + term
    got = fastpe.add_disentangled_bias(scores.copy(), c2p=c2p, p2c=p2c, **deberta_settings(case))
    assert_close(got, want, np.float64, magnitude=4.0, context=case["name"])
    loader = fastpe.DisentangledBias.from_hf_config(case["config"])
    assert loader.span == span
    assert (loader.c2p, loader.p2c) == ("c2p" in case["pos_att_type"],
                                        "p2c" in case["pos_att_type"])
    assert_bytes_equal(loader(scores.copy(), c2p=c2p, p2c=p2c), got)


@pytest.mark.parametrize("case", cases("deberta_layer"), ids=ids("deberta_layer"))
def test_disentangled_bias_equals_the_modules_score(case, backend):
    """The module's own logits (random weights, float64): zeros plus fastpe's bias is
    transformers' ``score`` to float64 rounding; float32 within its rounding."""
    arrays = fixtures()[1]
    name = case["name"]
    want = arrays[f"deberta_layer/{name}/score"]
    c2p = arrays.get(f"deberta_layer/{name}/c2p")
    p2c = arrays.get(f"deberta_layer/{name}/p2c")
    loader = fastpe.DisentangledBias.from_hf_config(case["config"])
    got = loader(np.zeros(want.shape), c2p=c2p, p2c=p2c)
    assert_close(got, want, np.float64, context=name)
    q_len, k_len = want.shape[-2:]   # the model's settings (a span < 1: its max positions)
    assert np.array_equal(loader.relative_positions(q_len, k_len),
                          fastpe.deberta_relative_positions(q_len, k_len,
                                                            **deberta_settings(case)))
    f32 = [None if a is None else a.astype(np.float32) for a in (c2p, p2c)]
    got32 = loader(np.zeros(want.shape, np.float32), c2p=f32[0], p2c=f32[1])
    assert_close(got32, want, np.float32, magnitude=float(np.abs(want).max()), context=name)


def test_transformers_cannot_add_p2c_when_q_len_differs_and_fastpe_refuses():
    (case,) = cases("deberta_unequal")
    assert all(v.startswith("RuntimeError") for v in case["outcome"].values()), case
    with pytest.raises(ValueError, match=r"p2c.*q_len 5 != k_len 9"):
        fastpe.add_disentangled_bias(np.zeros((2, 5, 9)), p2c=np.zeros((2, 9, 16)),
                                     position_buckets=8, max_relative_positions=24)


def test_c2p_alone_takes_q_len_different_from_k_len(backend):
    rng = np.random.default_rng(8)
    scores, c2p = rng.standard_normal((2, 5, 9)), rng.standard_normal((2, 5, 16))
    r = fastpe.deberta_relative_positions(5, 9, position_buckets=8, max_relative_positions=24)
    want = scores + np.take_along_axis(c2p, np.broadcast_to(np.clip(r + 8, 0, 15), (2, 5, 9)),
                                       axis=-1)
    got = fastpe.add_disentangled_bias(scores.copy(), c2p=c2p, position_buckets=8,
                                       max_relative_positions=24)
    assert_bytes_equal(got, want)


DEBERTA_SHAPES = [(2, 3, 33, 33), (1, 2, 1, 1), (1, 1, 70, 70), (2, 1, 2, 17, 17)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("settings", [(256, 512), (-1, 20), (8, 24)], ids=str)
@pytest.mark.parametrize("terms", ["both", "c2p", "p2c"])
def test_disentangled_kernel_matches_reference(dtype, settings, terms, both_threads):
    pb, mr = settings
    span = pb if pb > 0 else mr
    for shape in DEBERTA_SHAPES:
        k = shape[-1]
        rng = np.random.default_rng(9)
        c2p = rng.standard_normal(shape[:-1] + (2 * span,)).astype(dtype)
        p2c = rng.standard_normal(shape[:-2] + (k, 2 * span)).astype(dtype)
        kw = {"c2p": c2p if terms != "p2c" else None, "p2c": p2c if terms != "c2p" else None,
              "position_buckets": pb, "max_relative_positions": mr}
        want = fastpe.reference.add_disentangled_bias(make_awkward("contiguous", shape, dtype),
                                                      **kw)
        for layout in ("contiguous", "fortran", "strided-last", "reversed", "unaligned"):
            got = make_awkward(layout, shape, dtype)
            fastpe.add_disentangled_bias(got, num_threads=both_threads, **kw)
            assert_bytes_equal(np.asarray(got, dtype=dtype), want, f"{shape} {layout}")
        # logits as strided views of bigger buffers, and Fortran order
        kw2 = dict(kw)
        for name in ("c2p", "p2c"):
            if kw[name] is not None:
                kw2[name] = make_awkward("strided-rows", kw[name].shape, dtype)
                kw2[name][...] = kw[name]
        got = fastpe.add_disentangled_bias(make_awkward("contiguous", shape, dtype), **kw2)
        assert_bytes_equal(got, want, f"{shape} strided logits")
        if "byteswapped" in awkward_kinds(shape, dtype):     # read through a native copy
            swapped = {n: v if v is None or n not in ("c2p", "p2c")
                       else v.astype(v.dtype.newbyteorder()) for n, v in kw.items()}
            got = fastpe.add_disentangled_bias(make_awkward("contiguous", shape, dtype),
                                               **swapped)
            assert_bytes_equal(got, want, f"{shape} byte-swapped logits")



def _disentangled_float64(scores, c2p, p2c, pb, mr):
    """scores + (c2p term + p2c term) in float64, straight from the formula: c2p[..., i,
    clip(r(i, j) + span)] and p2c[..., j, clip(-r(j, i) + span)], r the relative positions
    of the (q, k) grid (and of the (k, k) one for p2c, which needs q == k)."""
    span = pb if pb > 0 else mr
    q, k = scores.shape[-2:]
    r = fastpe.deberta_relative_positions(q, k, position_buckets=pb, max_relative_positions=mr)
    out = scores.astype(np.float64)
    term = np.zeros(out.shape)
    if c2p is not None:
        ci = np.broadcast_to(np.clip(r + span, 0, 2 * span - 1), out.shape)
        term += np.take_along_axis(c2p.astype(np.float64), ci, axis=-1)
    if p2c is not None:
        pi = np.broadcast_to(np.clip(-r + span, 0, 2 * span - 1), out.shape)  # [j, i]
        term += np.swapaxes(np.take_along_axis(p2c.astype(np.float64), pi, axis=-1), -1, -2)
    return out + term


# float32 with AVX2 takes 8 x 8 blocks of 16-row units, the rows and keys past a multiple
# of 8 one at a time, keys in chunks of 4096; settings whose gather indices step by more
# than one per distance somewhere ((256, 300), (64, 40)) and spans below 4 ((-1, 3)) take
# the general loops. float16 and bfloat16 take the same blocks on float32 copies of a
# head's rows (p2c's whole, 16 rows of scores and c2p at a time). Both against the
# reference (the same float32 sums, rounded once, bit for bit) and against float64 math
# (within a rounding of the dtype).
BLOCK_SHAPES = [(1, 2, 8, 8), (1, 1, 16, 16), (2, 1, 23, 23), (1, 2, 40, 40), (1, 1, 47, 47),
                (1, 1, 161, 161)]


@pytest.mark.parametrize("dtype", [F32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("settings", [(256, 512), (8, 24), (4, 8), (-1, 20), (32, 128),
                                      (256, 300), (64, 40), (-1, 3)], ids=str)
@pytest.mark.parametrize("terms", ["both", "c2p", "p2c"])
def test_disentangled_block_edges(settings, terms, dtype, both_threads):
    pb, mr = settings
    span = pb if pb > 0 else mr
    shapes = BLOCK_SHAPES + ([(1, 2, 19, 45), (1, 1, 45, 19), (1, 1, 2, 4100)]
                             if terms == "c2p" else [])
    # float32 sums rounded once to the dtype: within half an ulp of it, plus float32's
    # own rounding of the sum
    tol = {np.dtype(np.float32): 3e-7, np.dtype(np.float16): 1e-3}.get(np.dtype(dtype), 8e-3)
    for shape in shapes:
        q, k = shape[-2:]
        rng = np.random.default_rng(q * 1000 + k)
        scores = rng.standard_normal(shape).astype(dtype)
        c2p = rng.standard_normal(shape[:-1] + (2 * span,)).astype(dtype)
        p2c = rng.standard_normal(shape[:-2] + (k, 2 * span)).astype(dtype)
        kw = {"c2p": c2p if terms != "p2c" else None, "p2c": p2c if terms != "c2p" else None,
              "position_buckets": pb, "max_relative_positions": mr}
        want = fastpe.reference.add_disentangled_bias(scores.copy(), **kw)
        got = fastpe.add_disentangled_bias(scores.copy(), num_threads=both_threads, **kw)
        assert_bytes_equal(got, want, f"{shape}")
        exact = _disentangled_float64(scores, kw["c2p"], kw["p2c"], pb, mr)
        np.testing.assert_allclose(as_f64(got), exact, rtol=tol, atol=tol * 4,
                                   err_msg=f"{shape}")
        # rows of scores and logits further apart than their length (keys adjacent)
        pad = np.full(shape[:-1] + (k + 5,), 7.0, dtype)
        view = pad[..., 2:k + 2]
        view[...] = scores
        pads = {}
        for name in ("c2p", "p2c"):
            if kw[name] is not None:
                big = np.full(kw[name].shape[:-1] + (2 * span + 3,), 5.0, dtype)
                pads[name] = big[..., 1:2 * span + 1]
                pads[name][...] = kw[name]
        fastpe.add_disentangled_bias(view, num_threads=both_threads, **{**kw, **pads})
        assert_bytes_equal(view, want, f"{shape} padded rows")
        assert (pad[..., :2] == 7).all() and (pad[..., k + 2:] == 7).all()

def test_half_types_sum_the_logits_in_float32():
    s = np.zeros((1, 1, 2, 2), np.float16)
    c = np.full((1, 1, 2, 8), 2.0**-12, np.float16)      # below half an ulp of 1 in float16
    p = np.full((1, 1, 2, 8), 1.0, np.float16)
    got = fastpe.add_disentangled_bias(s, c2p=c, p2c=p, max_relative_positions=4)
    assert as_f64(got[0, 0]).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    s = np.full((1, 1, 2, 2), 2048.0, np.float16)        # 2048 + (1 + 1) is exact, 2048 + 1 is not
    got = fastpe.add_disentangled_bias(s, c2p=p, p2c=p, max_relative_positions=4)
    assert as_f64(got[0, 0]).tolist() == [[2050.0, 2050.0], [2050.0, 2050.0]]


# ---- loaders -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in cases("t5") if c["decoder"]],
                         ids=[i for c, i in zip(cases("t5"), ids("t5")) if c["decoder"]])
def test_a_decoder_stacks_config_needs_decoder_true(case):
    """The decoder's own config (is_decoder=True, as model.decoder.config) buckets one
    way: without decoder=True the loader refuses rather than give the encoder's bias."""
    assert case["config"]["is_decoder"] is True
    refused = {"longt5": "encoder_attention_type", "pix2struct_text_model": "it is a decoder",
               "udop": "2D layout biases"}
    with pytest.raises(ValueError, match=refused.get(case["config"]["model_type"],
                                                     r"is_decoder=True.*decoder=True")):
        fastpe.RelativeBias.from_hf_config(case["config"])


@pytest.mark.parametrize("model_type", ["udop", "layoutlmv2", "layoutlmv3", "wavlm",
                                        "prophetnet", "cpmant", "llama", None])
def test_loaders_refuse_what_they_cannot_reproduce(model_type):
    cfg = {"model_type": model_type, "relative_attention": True}
    for loader in (fastpe.RelativeBias.from_hf_config, fastpe.DisentangledBias.from_hf_config):
        with pytest.raises(ValueError, match=repr(model_type)):
            loader(cfg)


def test_udop_decoder_loads_and_its_encoder_is_refused():
    cfg = {"model_type": "udop", "relative_attention_num_buckets": 32}
    with pytest.raises(ValueError, match="2D layout biases"):
        fastpe.RelativeBias.from_hf_config(cfg)
    dec = fastpe.RelativeBias.from_hf_config(cfg, decoder=True)
    assert (dec.num_buckets, dec.bidirectional, dec.causal) == (32, False, True)


def test_t5_loader_directions():
    cfg = {"model_type": "longt5", "relative_attention_num_buckets": 32,
           "relative_attention_max_distance": 128, "encoder_attention_type": "local"}
    with pytest.raises(ValueError, match="encoder_attention_type"):
        fastpe.RelativeBias.from_hf_config(cfg)
    assert fastpe.RelativeBias.from_hf_config(cfg, decoder=True).causal
    with pytest.raises(ValueError, match="no decoder"):
        fastpe.RelativeBias.from_hf_config({"model_type": "mpnet"}, decoder=True)
    pix = {"model_type": "pix2struct", "text_config": {
        "model_type": "pix2struct_text_model", "relative_attention_num_buckets": 64,
        "relative_attention_max_distance": 256}}
    rb = fastpe.RelativeBias.from_hf_config(pix, decoder=True)
    assert (rb.num_buckets, rb.max_distance, rb.bidirectional) == (64, 256, False)
    mp = fastpe.RelativeBias.from_hf_config({"model_type": "mpnet",
                                             "relative_attention_num_buckets": 64})
    assert (mp.num_buckets, mp.max_distance) == (32, 128)    # MPNet's code: always these
    with pytest.raises(ValueError, match="table has 16 rows"):
        mp(np.zeros((1, 4, 3, 3)), np.zeros((16, 4)))
    # any other family's table has one row per bucket: 64 rows are not 32 buckets' (a
    # config without relative_attention_num_buckets typed for a 64-bucket model)
    t5 = fastpe.RelativeBias.from_hf_config({"model_type": "t5"})
    scores = np.zeros((1, 4, 3, 3))
    for rows in (16, 64):
        with pytest.raises(ValueError, match=f"table has {rows} rows"):
            t5(scores, np.ones((rows, 4)))
        with pytest.raises(ValueError, match=f"table has {rows} rows"):
            t5.bias(np.ones((rows, 4)), 3, 3)
    assert not scores.any()


def test_deberta_loader_settings():
    cfg = {"model_type": "deberta-v2", "relative_attention": True, "position_buckets": 256,
           "max_relative_positions": -1, "max_position_embeddings": 512,
           "pos_att_type": "p2c|c2p", "share_att_key": True, "hidden_size": 768,
           "num_attention_heads": 12}
    db = fastpe.DisentangledBias.from_hf_config(cfg)
    assert (db.span, db.max_relative_positions, db.c2p, db.p2c) == (256, 512, True, True)
    assert db.scale == pytest.approx(np.sqrt(64 * 3), rel=1e-7)
    with pytest.raises(ValueError, match="relative_attention"):
        fastpe.DisentangledBias.from_hf_config({**cfg, "relative_attention": False})
    for family in ("deberta", "deberta-v2"):   # where the model divides by zero
        with pytest.raises(ValueError, match=r"num_attention_heads'\] must be >= 1, got 0"):
            fastpe.DisentangledBias.from_hf_config({**cfg, "model_type": family,
                                                    "num_attention_heads": 0})
    with pytest.raises(ValueError, match="c2p"):
        db(np.zeros((1, 1, 2, 2)), p2c=np.zeros((1, 1, 2, 512)))
    # the config's values as they stand, not as the attention resolves them: refused
    with pytest.raises(ValueError, match=r"max_relative_positions must be >= 1.*log buckets"
                                         r".*max_position_embeddings"):
        fastpe.DisentangledBias(position_buckets=256, max_relative_positions=-1)


@pytest.mark.parametrize("case", [c for c in cases("deberta_layer") if c["family"] == "deberta"],
                         ids=lambda c: c["name"])
def test_deberta_v1_span_rows_and_scale_are_its_modules(case):
    """DeBERTa (v1): the span of a call is min(max(q_len, k_len), max_relative_positions),
    its logits come from the middle 2 span rows of the 2 max_relative_positions relative
    embeddings, and its scale counts every pos_att_type entry ("p2p" too)."""
    rel = fastpe.DisentangledBias.from_hf_config(case["config"])
    n, mr = case["length"], deberta_settings(case)["max_relative_positions"]
    assert rel.sequence_span and rel.span_for(n, n) == case["span"]
    assert rel.span_for(1, n) == rel.span_for(n, 1) == case["span"]
    assert rel.embedding_rows(n, n) == slice(mr - case["span"], mr + case["span"])
    head_dim = case["config"]["hidden_size"] // case["config"]["num_attention_heads"]
    assert rel.scale == pytest.approx(np.sqrt(head_dim * (1 + len(case["pos_att_type"]))),
                                      rel=1e-7)
    with pytest.raises(ValueError, match=r"span_for\(q_len, k_len\)"):
        _ = rel.span
    width = 2 * case["span"]
    logits = np.zeros((1, 2, n, width + 2), np.float32)     # another span's logits
    scores = np.zeros((1, 2, n, n), np.float32)
    with pytest.raises(ValueError, match="c2p"):
        rel(scores, c2p=logits, p2c=logits if rel.p2c else None)
    assert not scores.any()


@pytest.mark.parametrize("case", cases("deberta_typed"), ids=ids("deberta_typed"))
def test_deberta_typed_dicts_load_as_their_config_classes(case):
    """A config.json typed by hand without some keys: the settings the attention module
    reads from its class's loading of it (SEW-D's class defaults differ from DeBERTa's),
    or a refusal where the class refuses the dict or the model has no relative attention."""
    if "class_error" in case:
        with pytest.raises(TypeError, match="pos_att_type"):
            fastpe.DisentangledBias.from_hf_config(case["config"])
        return
    if not case["relative_attention"]:
        with pytest.raises(ValueError, match="no relative attention"):
            fastpe.DisentangledBias.from_hf_config(case["config"])
        return
    got = fastpe.DisentangledBias.from_hf_config(case["config"])
    assert (got.c2p, got.p2c) == (case["c2p"], case["p2c"])
    assert (got.max_relative_positions, got.head_dim) == (case["max_relative_positions"],
                                                         case["head_dim"])
    assert got.scale == pytest.approx(case["scale"], rel=1e-6)
    if case["family"] != "deberta":
        assert (got.position_buckets, got.span, got.share_att_key) == (
            case["position_buckets"], case["span"], case["share_att_key"])


@pytest.mark.parametrize("types, factor", [("", 2), (None, 1), ("c2p|p2c|p2p", 4), ([], 1)])
def test_deberta_v1_scale_counts_pos_att_type_as_its_config_class_splits_it(types, factor):
    """DebertaConfig splits a string at "|" ("" gives [""]), and v1's scale counts
    every entry: a scale_factor of 1 + len(pos_att_type)."""
    cfg = {"model_type": "deberta", "relative_attention": True, "pos_att_type": types,
           "max_relative_positions": 16, "hidden_size": 64, "num_attention_heads": 4}
    rel = fastpe.DisentangledBias.from_hf_config(cfg)
    assert rel.scale_factor == factor
    assert rel.scale == pytest.approx(np.sqrt(16 * factor), rel=1e-7)


def test_deberta_v1_settings_have_no_buckets():
    with pytest.raises(ValueError, match="position_buckets must be < 1"):
        fastpe.DisentangledBias(position_buckets=8, max_relative_positions=24,
                                sequence_span=True)
    v2 = fastpe.DisentangledBias(position_buckets=8, max_relative_positions=24)
    assert (v2.span_for(100, 100), v2.embedding_rows(3, 3)) == (8, slice(0, 16))


@pytest.mark.parametrize("types", [None, [], ["p2p"], "p2p", "P2P | x"])
def test_deberta_without_c2p_or_p2c_adds_nothing(types):
    """DebertaV2's disentangled_attention_bias starts from a score of 0 and adds only
    c2p and p2c terms, and its scale counts only those: with neither, the scores are
    scaled by sqrt(head_dim) and left as they are, not refused."""
    cfg = {"model_type": "deberta-v2", "relative_attention": True, "pos_att_type": types,
           "max_relative_positions": 16, "position_buckets": 8, "hidden_size": 48,
           "num_attention_heads": 3}
    db = fastpe.DisentangledBias.from_hf_config(cfg)
    assert (db.c2p, db.p2c, db.scale) == (False, False, 4.0)
    scores = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    assert db(scores) is scores
    assert scores.ravel().tolist() == list(range(18))
    with pytest.raises(ValueError, match="c2p: this model's pos_att_type lacks it"):
        db(scores, c2p=np.zeros((1, 2, 3, 16), np.float32))
    with pytest.raises(TypeError, match="scores must have a floating dtype"):
        db(np.zeros((1, 2, 3, 3), np.int32))
    with pytest.raises(ValueError, match="scores must have at least 3 dimensions"):
        db(np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="num_threads"):
        db(scores, num_threads=0)


@pytest.mark.parametrize("key, value", [
    ("max_relative_positions", "512"), ("position_buckets", 256.0),
    ("max_position_embeddings", "512"), ("num_attention_heads", True),
    ("attention_head_size", 64.0), ("hidden_size", [768]), ("pos_att_type", 3),
    ("pos_att_type", ["c2p", 2])])
def test_deberta_loader_names_a_config_value_of_the_wrong_type(key, value):
    cfg = {"model_type": "deberta-v2", "relative_attention": True, "position_buckets": 256,
           "max_relative_positions": -1, "max_position_embeddings": 512,
           "pos_att_type": "p2c|c2p", "hidden_size": 768, "num_attention_heads": 12}
    with pytest.raises(TypeError, match=re.escape(f"config[{key!r}] must be")):
        fastpe.DisentangledBias.from_hf_config({**cfg, key: value})


@pytest.mark.parametrize("key", ["relative_attention_num_buckets",
                                 "relative_attention_max_distance"])
def test_t5_loader_names_a_config_value_of_the_wrong_type(key):
    with pytest.raises(TypeError, match=re.escape(f"config[{key!r}] must be an int, got '32'")):
        fastpe.RelativeBias.from_hf_config({"model_type": "t5", key: "32"})


# ---- bad input: rows for tests/test_bad_input.py -------------------------------------------------------

T = np.zeros((32, 3), np.float32)   # a table for the scores of test_alibi.S: 3 heads


BAD_T5 = [
    # (id, scores factory or None for zeros(S), kwargs, exception, words the message names)
    ("table-heads", None, {"table": np.zeros((32, 4))}, ValueError, ["table", "3"]),
    ("table-1d", None, {"table": np.zeros(32)}, ValueError, ["table"]),
    ("table-int", None, {"table": np.zeros((32, 3), int)}, TypeError, ["table"]),
    ("table-list-of-str", None, {"table": [["a"] * 3] * 32}, TypeError, ["table"]),
    ("table-no-rows", None, {"table": np.zeros((0, 3))}, ValueError, ["table"]),
    ("num_buckets-too-few", None, {"table": np.zeros((3, 3))}, ValueError,
     ["table's rows", "num_buckets"]),
    ("max_distance-zero", None, {"max_distance": 0}, ValueError, ["max_distance"]),
    ("max_distance-within-exact", None, {"max_distance": 8}, ValueError, ["max_distance"]),
    ("max_distance-float", None, {"max_distance": 128.0}, TypeError, ["max_distance"]),
    ("max_distance-nan", None, {"max_distance": float("nan")}, TypeError, ["max_distance"]),
    ("max_distance-past-tables", None, {"max_distance": 2**40}, ValueError,
     ["max_distance", "2**22"]),
    ("bidirectional-none", None, {"bidirectional": None}, TypeError, ["bidirectional"]),
    ("q_offset-past-int64", None, {"q_offset": 2**63 - 2}, ValueError, ["q_offset"]),
    ("key_mask-batch", None, {"key_mask": np.ones((3, 6), bool)}, ValueError, ["key_mask"]),
    ("scores-list", lambda: np.zeros(S).tolist(), {}, TypeError, ["scores"]),
    ("two-dims", lambda: np.zeros((4, 6), np.float32), {}, ValueError, ["scores", "3"]),
]
# the rows of add_alibi's scores and shared arguments, which add_relative_bias takes alike
BAD_T5 += [c for c in BAD_ADD if c[0] in {
    "q_offset-negative", "q_offset-float", "q-longer-than-k", "key_mask-shape", "key_mask-float",
    "key_mask-values", "causal-text", "num_threads-zero", "num_threads-float", "read-only",
    "zero-stride", "int-dtype", "complex-dtype"}]

BAD_T5_TABLE = [
    # (id, (table, q_len, k_len), kwargs, exception, words)
    ("q_len-negative", (T, -1, 6), {}, ValueError, ["q_len"]),
    ("k_len-float", (T, 4, 6.0), {}, TypeError, ["k_len"]),
    ("table-int", (np.zeros((32, 3), int), 4, 6), {}, TypeError, ["table"]),
    ("table-3d", (np.zeros((1, 32, 3)), 4, 6), {}, ValueError, ["table"]),
    ("num_buckets-too-few", (np.zeros((3, 3)), 4, 6), {}, ValueError,
     ["table's rows", "num_buckets"]),
    ("max_distance-nan", (T, 4, 6), {"max_distance": float("nan")}, TypeError,
     ["max_distance"]),
    ("dtype-int", (T, 4, 6), {"dtype": "int32"}, TypeError, ["dtype"]),
    ("out-shape", (T, 4, 6), {"out": np.zeros((3, 4, 5))}, ValueError, ["out"]),
    ("out-rank", (T, 4, 6), {"out": np.zeros((1, 3, 4, 6))}, ValueError, ["out"]),
    ("out-dtype-contradiction", (T, 4, 6), {"out": np.zeros((3, 4, 6)), "dtype": "float16"},
     TypeError, ["dtype", "out"]),
    ("q_offset-negative", (T, 4, 6), {"q_offset": -2}, ValueError, ["q_offset"]),
    ("q-longer-than-k", (T, 7, 6), {}, ValueError, ["q_offset"]),
]

BAD_BUCKET = [
    # (id, relative_position, kwargs, exception, words)
    ("relative_position-float", np.zeros(3), {}, TypeError, ["relative_position"]),
    ("relative_position-text", ["a"], {}, TypeError, ["relative_position"]),
    ("relative_position-uint64-2**63", np.full(2, 2**63, np.uint64), {}, ValueError,
     ["relative_position"]),
    # big-endian: a cast to int64 would wrap them to negative distances, silently
    ("relative_position-uint64-big-endian", np.full(2, 2**64 - 1, ">u8"), {}, ValueError,
     ["relative_position", "2**63"]),
    ("num_buckets-bool", [1], {"num_buckets": True}, TypeError, ["num_buckets"]),
    ("num_buckets-too-few", [1], {"num_buckets": 2}, ValueError, ["num_buckets"]),
    ("max_distance-negative", [1], {"max_distance": -5}, ValueError, ["max_distance"]),
    ("max_distance-past-tables", [1], {"max_distance": 2**22 + 1}, ValueError,
     ["max_distance", "2**22"]),
    ("bidirectional-str", [1], {"bidirectional": "no"}, TypeError, ["bidirectional"]),
]


def _logits(rows, span=8, dtype=np.float32, lead=(2, 3)):
    return np.zeros(lead + (rows, 2 * span), dtype)


DS = (2, 3, 5, 5)         # square: p2c needs q_len == k_len
BAD_DEBERTA = [
    # (id, scores factory or None for zeros(DS), kwargs, exception, words)
    ("no-logits", None, {}, ValueError, ["c2p", "p2c"]),
    ("c2p-span", None, {"c2p": _logits(5, 9)}, ValueError, ["c2p", "16"]),
    ("p2c-rows", None, {"p2c": _logits(4)}, ValueError, ["p2c", "k_len"]),
    ("c2p-heads", None, {"c2p": _logits(5, lead=(2, 4))}, ValueError, ["c2p"]),
    ("c2p-rank", None, {"c2p": np.zeros((5, 16), np.float32)}, ValueError, ["c2p"]),
    ("c2p-dtype", None, {"c2p": _logits(5, dtype=np.float64)}, TypeError, ["c2p", "dtype"]),
    ("p2c-int", None, {"p2c": np.zeros((2, 3, 5, 16), int)}, TypeError, ["p2c"]),
    ("p2c-text", None, {"p2c": "abc"}, TypeError, ["p2c"]),
    ("p2c-q-ne-k", lambda: np.zeros((2, 3, 4, 5), np.float32), {"p2c": _logits(5)},
     ValueError, ["p2c", "q_len"]),
    ("position_buckets-float", None, {"c2p": _logits(5), "position_buckets": 8.0}, TypeError,
     ["position_buckets"]),
    ("position_buckets-nan", None, {"c2p": _logits(5), "position_buckets": float("nan")},
     TypeError, ["position_buckets"]),
    ("max_relative_positions-missing", None, {"c2p": _logits(5), "position_buckets": -1,
                                              "max_relative_positions": -1}, ValueError,
     ["max_relative_positions"]),
    ("max_relative_positions-below-buckets", None,
     {"c2p": _logits(5), "max_relative_positions": 4}, ValueError, ["max_relative_positions"]),
    # the model's attention replaces it by max_position_embeddings before any positions:
    # the raw -1 beside log buckets would give linear positions it never uses
    ("max_relative_positions-unresolved-beside-buckets", None,
     {"c2p": _logits(5), "max_relative_positions": -1}, ValueError,
     ["max_relative_positions", "max_position_embeddings"]),
    ("position_buckets-one", None, {"c2p": _logits(5, 1), "position_buckets": 1}, ValueError,
     ["position_buckets"]),
    ("position_buckets-past-tables", None, {"c2p": _logits(5), "position_buckets": 2**40,
                                            "max_relative_positions": 2**41}, ValueError,
     ["position_buckets", "2**22"]),
    ("max_relative_positions-past-tables", None, {"c2p": _logits(5), "position_buckets": -1,
                                                  "max_relative_positions": 2**40}, ValueError,
     ["max_relative_positions", "2**22"]),
    ("num_threads-zero", None, {"c2p": _logits(5), "num_threads": 0}, ValueError,
     ["num_threads"]),
    ("read-only", lambda: _read_only()[..., :5, :5], {"c2p": _logits(5)}, TypeError,
     ["scores", "read-only"]),
    ("zero-stride", lambda: _strided_zero()[..., :5, :5], {"c2p": _logits(5)}, ValueError,
     ["scores"]),
    ("int-dtype", lambda: np.zeros(DS, np.int32), {"c2p": _logits(5)}, TypeError, ["scores"]),
    ("two-dims", lambda: np.zeros((5, 5), np.float32), {"c2p": _logits(5)}, ValueError,
     ["scores"]),
]
DEBERTA_DEFAULTS = {"position_buckets": 8, "max_relative_positions": 24}

BAD_DEBERTA_POSITIONS = [
    ("q_len-negative", (-1, 4), {}, ValueError, ["q_len"]),
    ("k_len-str", (4, "4"), {}, TypeError, ["k_len"]),
    ("position_buckets-float", (4, 4), {"position_buckets": 2.5}, TypeError,
     ["position_buckets"]),
    ("max_relative_positions-nan", (4, 4), {"position_buckets": 8,
                                            "max_relative_positions": float("nan")},
     TypeError, ["max_relative_positions"]),
    ("max_relative_positions-too-small", (4, 4), {"position_buckets": 8,
                                                  "max_relative_positions": 5}, ValueError,
     ["max_relative_positions"]),
    ("lengths-past-an-array", (2**62, 2), {}, ValueError, ["q_len", "k_len"]),
    ("lengths-past-memory", (2**40, 2**40), {}, ValueError, ["q_len", "k_len"]),
]


def test_disentangled_bias_names_the_logit_a_call_lacks_or_has_too_many():
    """pos_att_type decides which logits a call takes; one set to a non-bool since is
    read as made (a TypeError naming it), not as truthy; scores unchanged."""
    d = fastpe.DisentangledBias(position_buckets=8, max_relative_positions=24, p2c=False)
    scores = np.zeros((1, 2, 5, 5), np.float32)
    logits = np.zeros((1, 2, 5, 16), np.float32)
    with pytest.raises(ValueError, match=r"p2c: this model's pos_att_type lacks it; pass None"):
        d(scores, c2p=logits, p2c=logits)
    with pytest.raises(ValueError, match=r"c2p: this model's pos_att_type has it; pass it"):
        d(scores)
    d.c2p = "x"
    with pytest.raises(TypeError, match=r"c2p must be a bool, got 'x'"):
        d(scores, c2p=logits)
    assert not scores.any()


@pytest.mark.parametrize("mr, accepted", [(2**22 + 2, True), (2**23, False), (2**40, False)])
def test_deberta_log_buckets_that_reach_the_span_ends_too_far_out_are_refused(mr, accepted):
    """The ends of the span must be reached within 2**22 of distance (the tables'
    reach): decided on the two farthest distances, as on every distance up to them."""
    if accepted:
        spec = _relative_math.deberta_spec(256, mr)
        d = np.array([-spec.reach, spec.reach])
        ends = np.clip(_relative_math.deberta_positions(d, 256, mr) + spec.span,
                       0, 2 * spec.span - 1)
        assert ends.tolist() == [0, 2 * spec.span - 1]
        return
    for fn in (fastpe.add_disentangled_bias, fastpe.reference.add_disentangled_bias):
        with pytest.raises(ValueError, match=rf"max_relative_positions={mr}: .*past distance"):
            fn(np.zeros((1, 1, 2, 2)), c2p=np.zeros((1, 1, 2, 512)), position_buckets=256,
               max_relative_positions=mr)
