"""add_learned: x += table[positions], exactly as NumPy does it, for every positions form,
awkward x and table, thread count; IndexError past max_len; writes stay inside the view."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import (
    BF16,
    DTYPE_IDS,
    F16,
    F32,
    F64,
    FLOAT_DTYPES,
    HALF_DTYPES,
    POSITION_FORMS,
    VIEWS_3D,
    as_f64,
    assert_bytes_equal,
    assert_close,
    awkward_params,
    awkward_values,
    describe,
    floats_past_a_boundary,
    half_edge_operands,
    is_bf16,
    kernel_copies,
    make_awkward,
    make_positions,
    needs_compiled,
    snapshot,
    unaddressable,
)

import fastpe

MAX_LEN = 300

def table_for(dtype, dim, max_len=MAX_LEN, seed=1) -> np.ndarray:
    return awkward_values((max_len, dim), dtype, seed=seed)


def numpy_truth(x0: np.ndarray, table: np.ndarray, full_positions: np.ndarray) -> np.ndarray:
    """x + table[pos] in NumPy's own arithmetic on native copies (x0 is (batch, seq, dim)
    or (seq, dim); full_positions is (batch, seq))."""
    rows = np.asarray(table)[full_positions]
    x = np.asarray(x0)
    return x + (rows[0] if x.ndim == 2 else rows)


def exact_truth(x0, table, full_positions) -> np.ndarray:
    rows = as_f64(table)[full_positions]
    x = as_f64(x0)
    return x + (rows[0] if x.ndim == 2 else rows)


def assert_added(x, x0, table, full, dtype, ctx):
    """x == x0 + table[full] as add_learned must compute it."""
    if dtype in (F32, F64):
        # the same single IEEE addition NumPy does: bit-identical
        assert_bytes_equal(x, numpy_truth(x0, table, full), ctx)
    else:
        # one rounding of an exact sum: within one ulp of the storage type
        assert_close(x, exact_truth(x0, table, full), dtype, magnitude=4.0, context=ctx)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form", POSITION_FORMS + ("2d-none", "2d-shared", "last-row"))
def test_equals_x_plus_table_rows(form, dtype):
    batch, seq, dim = 3, 45, 11
    table = table_for(dtype, dim)
    if form.startswith("2d-"):
        positions, offset, full = make_positions(form[3:], 1, seq, high=MAX_LEN)
        x = awkward_values((seq, dim), dtype)
    elif form == "last-row":  # the largest valid position, max_len - 1
        positions, offset, full = None, MAX_LEN - seq, None
        full = np.broadcast_to(MAX_LEN - seq + np.arange(seq), (batch, seq))
        x = awkward_values((batch, seq, dim), dtype)
    else:
        positions, offset, full = make_positions(form, batch, seq, high=MAX_LEN)
        x = awkward_values((batch, seq, dim), dtype)
    x0, table0 = x.copy(), table.copy()
    ret = fastpe.add_learned(x, table, positions, offset=offset)
    assert ret is x
    ctx = f"add_learned({describe(x)}, table {describe(table)}, positions={form})"
    assert_bytes_equal(table, table0, ctx + ": the table was written")
    assert_added(x, x0, table0, full, dtype, ctx)


@pytest.mark.parametrize("dtype", [d for d in (F16, BF16) if d is not None], ids=str)
def test_half_types_round_once(dtype):
    """float16 / bfloat16 add in float32 and round once: the result is the storage-type
    rounding of the float32 sum, as NumPy / ml_dtypes compute x + t."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-4, 4, (2, 40, 16)).astype(dtype)
    table = rng.uniform(-4, 4, (50, 16)).astype(dtype)
    pos = rng.integers(0, 50, (2, 40))
    want = (x.astype(np.float32) + table.astype(np.float32)[pos]).astype(dtype)
    fastpe.add_learned(x, table, pos)
    assert_bytes_equal(x, want, f"add_learned {dtype}")


# ---- max_len -------------------------------------------------------------------------------

MAX_LEN_MESSAGE = re.compile(r"(?s)(?=.*\btable\b)(?=.*max_len)")


@pytest.mark.parametrize("how", ["positions", "per-row", "offset", "too-long"])
def test_position_at_max_len_is_an_index_error(how):
    max_len, dim = 16, 4
    table = np.arange(max_len * dim, dtype=np.float32).reshape(max_len, dim)
    x = np.ones((2, 5, dim), np.float32)
    kwargs = {}
    if how == "positions":
        args = (np.array([0, 1, max_len, 2, 3]),)          # exactly max_len
    elif how == "per-row":
        args = (np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, max_len]]),)
    elif how == "offset":
        args, kwargs = (), {"offset": max_len - 4}          # offset + 4 == max_len
    else:
        x = np.ones((2, max_len + 1, dim), np.float32)     # a sequence longer than max_len
        args = ()
    before = snapshot(x), snapshot(table)
    with pytest.raises(IndexError, match=MAX_LEN_MESSAGE) as info:
        fastpe.add_learned(x, table, *args, **kwargs)
    assert str(max_len) in str(info.value), info.value
    assert (snapshot(x), snapshot(table)) == before


@pytest.mark.parametrize("batch, shapes", [(3, "(5,), (1, 5) or (3, 5)"), (1, "(5,) or (1, 5)")])
def test_a_wrong_positions_shape_names_every_shape_taken(batch, shapes):
    """(1, seq) positions are taken (every sequence's): the refusal names them too."""
    x = np.zeros((batch, 5, 4), np.float32)
    fastpe.add_learned(x, np.ones((9, 4), np.float32), np.arange(5)[None])
    assert (x == 1).all()
    with pytest.raises(ValueError, match=rf"^positions must have shape {re.escape(shapes)}, "
                                         rf"got \(2, 5\)$"):
        fastpe.add_learned(x, np.ones((9, 4), np.float32), np.zeros((2, 5), np.int64))


def test_position_max_len_minus_one_is_fine():
    table = np.arange(12, dtype=np.float64).reshape(3, 4)
    x = np.zeros((1, 4))
    fastpe.add_learned(x, table, [2])
    assert np.array_equal(x, table[2:3])


# ---- tables of any layout --------------------------------------------------------------------


@pytest.mark.parametrize("kind,shape,dtype", [
    p for p in awkward_params([(MAX_LEN, 10)])
    if p.values[0] != "empty"])  # an empty table has no row to add
def test_awkward_tables(kind, shape, dtype, both_threads):
    table = make_awkward(kind, shape, dtype, seed=4)
    max_len = table.shape[0]
    x = awkward_values((2, 70, table.shape[1]), dtype)
    x0, t0 = x.copy(), snapshot(table)
    pos = np.random.default_rng(2).integers(0, max_len, (2, 70))
    fastpe.add_learned(x, table, pos, num_threads=both_threads)
    ctx = f"add_learned(table={kind}: {describe(table)}, num_threads={both_threads})"
    assert snapshot(table) == t0, ctx + ": the table changed"
    assert_close(x, exact_truth(x0, table, pos), dtype, magnitude=4.0, context=ctx)
    if dtype in (F32, F64):
        assert_bytes_equal(x, numpy_truth(x0, np.asarray(table).astype(dtype), pos), ctx)


def test_read_only_table():
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    table.flags.writeable = False
    x = np.zeros((2, 3, 4), np.float32)
    fastpe.add_learned(x, table, [4, 0, 2])
    assert np.array_equal(x, np.broadcast_to(table[[4, 0, 2]], x.shape))


def test_broadcast_table():
    """A zero-stride table (every row the same) is only read: allowed."""
    row = np.arange(6, dtype=np.float64)
    table = np.broadcast_to(row, (50, 6))
    x = np.ones((3, 40, 6))
    fastpe.add_learned(x, table)
    assert np.array_equal(x, 1 + np.broadcast_to(row, x.shape))


def test_table_given_as_a_list():
    x = np.zeros((2, 2))
    fastpe.add_learned(x, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [2, 0])
    assert np.array_equal(x, [[5.0, 6.0], [1.0, 2.0]])


@pytest.mark.parametrize("dtype", [
    pytest.param(d, id=str(d))
    for d in FLOAT_DTYPES if not is_bf16(d)])
def test_byteswapped_x_and_table_together(dtype):
    x = awkward_values((2, 40, 8), dtype).astype(dtype.newbyteorder())
    table = table_for(dtype, 8).astype(dtype.newbyteorder())
    x0 = x.copy()
    fastpe.add_learned(x, table)
    pos = np.broadcast_to(np.arange(40), (2, 40))
    assert_close(x, exact_truth(x0, table, pos), dtype, magnitude=4.0,
                 context=f"add_learned(x {describe(x)}, table {describe(table)})")


def test_byteswapped_x_with_native_table():
    x = np.zeros((1, 3, 4), ">f4")
    table = np.ones((5, 4), np.float32)
    fastpe.add_learned(x, table)
    assert np.array_equal(x, np.ones((1, 3, 4)))


# ---- awkward x against the reference and NumPy -----------------------------------------------


@pytest.mark.parametrize("kind,shape,dtype", awkward_params(
    [(3, 67, 10), (67, 9)]))
def test_awkward_x_matches_reference(kind, shape, dtype, both_threads):
    x = make_awkward(kind, shape, dtype)
    y = make_awkward(kind, shape, dtype)
    table = table_for(dtype, x.shape[-1])
    batch, seq = (1,) + x.shape[:1] if x.ndim == 2 else x.shape[:2]
    positions, offset, full = make_positions("per-row" if x.ndim == 3 else "offset", batch,
                                             seq, high=MAX_LEN, offset=MAX_LEN - seq)
    x0 = x.copy()
    ctx = f"add_learned(x={kind}: {describe(x)}, num_threads={both_threads})"
    assert fastpe.add_learned(x, table, positions, offset=offset,
                              num_threads=both_threads) is x, ctx
    fastpe.reference.add_learned(y, table, positions, offset=offset)
    assert_close(x, y, dtype, magnitude=4.0, context=ctx + " vs reference")
    if dtype in (F32, F64):
        assert_bytes_equal(x, numpy_truth(x0, table, full).astype(x.dtype), ctx + " vs NumPy")


@pytest.mark.parametrize("kind,shape,dtype", awkward_params(
    [(3, 67, 10)], dtypes=[F64]))
def test_awkward_x_matches_reference_same_byte_order_table(kind, shape, dtype):
    """A byte-swapped x with a table of the same byte order, against the reference."""
    x = make_awkward(kind, shape, dtype)
    y = make_awkward(kind, shape, dtype)
    table = table_for(dtype, x.shape[-1]).astype(x.dtype)
    fastpe.add_learned(x, table)
    fastpe.reference.add_learned(y, table)
    assert_close(x, y, dtype, magnitude=4.0, context=f"add_learned(x={kind}: {describe(x)})")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dim", [64, 37])
def test_batch_rows_added_in_groups_give_each_rows_own_bits(dtype, dim):
    """Batch rows sharing positions add each table row in groups of several rows (the
    remainder in pairs or alone): every batch size gives each row the bits of adding it
    on its own, and for 16-bit types the float32 sum rounded once."""
    rng = np.random.default_rng(12)
    table = rng.uniform(-1, 1, (90, dim)).astype(dtype)
    for batch in (2, 3, 4, 5, 7, 8, 9, 13):
        x = rng.uniform(-3, 3, (batch, 70, dim)).astype(dtype)
        got = fastpe.add_learned(x.copy(), table, offset=7)
        for b in range(batch):
            alone = fastpe.add_learned(x[b:b + 1].copy(), table, offset=7)
            assert_bytes_equal(got[b:b + 1], alone, f"{dtype} batch {batch} row {b} dim {dim}")
        if np.dtype(dtype).itemsize == 2:
            want = (x.astype(np.float32) + table[7:77].astype(np.float32)).astype(dtype)
            assert_bytes_equal(got, want, f"{dtype} batch {batch} dim {dim}: rounded once")


@needs_compiled
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetching_the_next_tokens_rows_changes_no_value(prefetch, dtype):
    """Batch rows added in groups prefetch the next token's rows (the last token's lie
    past x): with the prefetch on or off, contiguous, token-strided and token-reversed x
    get the sums rounded once (of float32 values for the 16-bit types), and nothing past
    the view is written."""
    kern = fastpe._backend.compiled
    was = kern.row_prefetch()
    rng = np.random.default_rng(5)
    table = rng.uniform(-1, 1, (300, 1024)).astype(dtype)
    wide = np.float32 if np.dtype(dtype).itemsize == 2 else dtype
    try:
        assert kern.row_prefetch(prefetch) is prefetch
        for view in (np.s_[:, :], np.s_[:, ::2], np.s_[:, ::-1], np.s_[:3, 1:]):
            big = rng.uniform(-3, 3, (8, 64, 1024)).astype(dtype)
            before = big.copy()
            x = big[view]
            want = (x.astype(wide) + table[5:5 + x.shape[1]].astype(wide)).astype(dtype)
            fastpe.add_learned(x, table, offset=5, num_threads=1)
            assert_bytes_equal(x, want, f"prefetch {prefetch}, view {view}")
            inside = np.zeros(big.shape, bool)
            inside[view] = True
            assert_bytes_equal(big[~inside], before[~inside], f"outside the view {view}")
    finally:
        kern.row_prefetch(was)


# ---- threads -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("form", ["none", "per-row", "unsorted"])
def test_bit_identical_across_threads(form, dtype, threaded):
    table = table_for(dtype, 24, max_len=400)
    positions, offset, _ = make_positions(form, 3, 200, high=400)
    results = []
    for n in (1, 2, 3):
        x = awkward_values((3, 200, 24), dtype)
        fastpe.add_learned(x, table, positions, offset=offset, num_threads=n)
        results.append(x)
    for n, r in zip((2, 3), results[1:]):
        assert_bytes_equal(r, results[0], f"add_learned {dtype} {form} num_threads={n} vs 1")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_wide_rows_many_token_blocks(dtype, threads, threaded):
    """Wide rows (a 256 KiB table block holds only 64 float32 rows of 1024) and several
    batch rows: the call goes by blocks of tokens across groups of batch rows, whose
    split depends on the thread count. Every element still gets exactly its own row."""
    batch, seq, dim = 5, 150, 1024
    table = table_for(dtype, dim, max_len=seq + 20)
    x = awkward_values((batch, seq, dim), dtype, seed=3)
    x0, offset = x.copy(), 7
    fastpe.add_learned(x, table, offset=offset, num_threads=threads)
    full = np.broadcast_to(offset + np.arange(seq), (batch, seq))
    ctx = f"add_learned {describe(x)} num_threads={threads}"
    assert_added(x, x0, table, full, dtype, ctx)


@pytest.mark.parametrize("dtype", [d for d in (F16, BF16) if d is not None], ids=str)
def test_half_rows_same_bits_through_strided_table(dtype):
    """Unit-stride half rows take a fused conversion loop, strided ones convert in chunks:
    both round the float32 sum once, so the bits agree (and match the exact sum)."""
    batch, seq, dim = 2, 9, 37          # 37: vectors of 8 and a tail
    wide = table_for(dtype, 2 * dim)
    strided, table = wide[:, ::2], np.ascontiguousarray(wide[:, ::2])
    x = awkward_values((batch, seq, dim), dtype, seed=4)
    y, x0 = x.copy(), x.copy()
    fastpe.add_learned(x, table, offset=3)
    fastpe.add_learned(y, strided, offset=3)
    assert_bytes_equal(x, y, f"add_learned {dtype}: unit-stride vs strided table")
    full = np.broadcast_to(3 + np.arange(seq), (batch, seq))
    assert_close(x, exact_truth(x0, table, full), dtype, magnitude=4.0,
                 context=f"add_learned {dtype} unit stride")


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [128, 37])     # 37: vectors and a scalar tail
def test_half_rows_round_once_on_every_bit_pattern(dtype, dim, bf16_narrowing):
    """Unit-stride half rows (one pass, widened and narrowed in registers; with several batch
    rows, pairs of them share each table vector) round the float32 sum as NumPy / ml_dtypes
    do, on every bit pattern against shuffled operands and against half an ulp (ties either
    way, carries across a power of two, overflow to inf); a NaN sum is NaN, in bfloat16 the
    float32 NaN's sign and top payload bits, quieted. Strided rows (converted in chunks) give
    the same bits, and fastpe.reference the same numbers."""
    xs, ts = half_edge_operands(dtype)
    # 1 MB a row: token blocks enough for one thread to take whole batches, in pairs
    seq = -(-(1 << 19) // dim)
    first = np.resize(xs.reshape(-1), seq * dim)
    x = np.stack([first, first[::-1], np.roll(first, 4321)]).reshape(3, seq, dim)
    table = np.resize(ts.reshape(-1), seq * dim).reshape(seq, dim)
    for batch in (1, 2, 3):
        ctx = f"add_learned {dtype} dim {dim} batch {batch}"
        x0 = x[:batch]
        with np.errstate(invalid="ignore", over="ignore"):
            sum32 = x0.astype(np.float32) + table.astype(np.float32)
            want = sum32.astype(dtype)
        got = x0.copy()
        fastpe.add_learned(got, table, num_threads=1)
        nan = np.isnan(sum32)
        # which payload NaN + NaN keeps depends on the operand order the compiler picked
        both_nan = np.isnan(as_f64(x0)) & np.isnan(as_f64(table))
        assert nan.any() and not nan.all()
        assert np.isnan(as_f64(got[nan])).all(), f"{ctx}: NaN sums not NaN"
        assert_bytes_equal(got[~nan], want[~nan], f"{ctx} vs the float32 sum rounded")
        if is_bf16(dtype) and fastpe.info()["backend"] == "cython":
            # the kernels' NaN (ml_dtypes, under the NumPy backend, has its own)
            one_nan = nan & ~both_nan
            quiet = (sum32.view(np.uint32)[one_nan] >> 16) | 0x40
            assert_bytes_equal(got.view(np.uint16)[one_nan], quiet.astype(np.uint16),
                               f"{ctx}: NaN bits")
        wide = np.zeros(x0.shape[:-1] + (2 * dim,), dtype)
        strided = wide[..., ::2]
        strided[...] = x0
        fastpe.add_learned(strided, table)
        assert np.isnan(as_f64(strided[both_nan])).all()
        assert_bytes_equal(got[~both_nan], strided[~both_nan],
                           f"{ctx}: unit-stride vs strided rows")
        ref = x0.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            fastpe.reference.add_learned(ref, table)
        assert np.isnan(as_f64(ref[nan])).all()
        assert_bytes_equal(got[~nan], ref[~nan], f"{ctx} vs fastpe.reference")


# ---- views ---------------------------------------------------------------------------------

@pytest.mark.parametrize("base_kind", ["contiguous", "unaligned", "odd-byte-stride"])
@pytest.mark.parametrize("view", list(VIEWS_3D))
def test_write_into_view_lands_in_base(view, base_kind):
    base = make_awkward(base_kind, (4, 80, 14), F32)
    expected = as_f64(base)
    v = base[VIEWS_3D[view]]
    table = table_for(F32, v.shape[-1])
    x0 = as_f64(v)
    fastpe.add_learned(v, table, offset=3)
    expected[VIEWS_3D[view]] = x0 + as_f64(table)[3 : 3 + v.shape[1]]
    assert_close(base, expected, F32, magnitude=4.0,
                 context=f"add_learned into {view} view of {base_kind} {describe(base)}")


SENTINEL = 1000.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("view", list(VIEWS_3D))
def test_no_writes_outside_the_view(view, dtype, both_threads):
    big = np.full((5, 90, 16), SENTINEL, dtype)
    before = big.copy()
    inside = np.zeros(big.shape, bool)
    inside[VIEWS_3D[view]] = True
    v = big[VIEWS_3D[view]]
    table = np.full((MAX_LEN, v.shape[-1]), 8.0, dtype)  # 1008 is exact even in bfloat16
    fastpe.add_learned(v, table, offset=1, num_threads=both_threads)
    ctx = f"add_learned on {view} view {describe(v)}, num_threads={both_threads}"
    assert_bytes_equal(big[~inside], before[~inside], ctx + ": outside the view")
    assert np.all(as_f64(big[inside]) == SENTINEL + 8), ctx + ": inside the view"


@pytest.mark.parametrize("dim", [1, 3, 7, 8, 9, 16, 23, 37, 64, 1029])
def test_rows_at_every_offset_from_a_vector_boundary(dim, both_threads):
    """float32 rows starting 0 to 7 floats past a 32-byte boundary (the row adds take x's
    elements up to the boundary one at a time, then whole vectors): each sum is x's
    value plus its table row's in float32, rounded once, and nothing around x changes."""
    rng = np.random.default_rng(21)
    table = rng.uniform(-1, 1, (40, dim)).astype(np.float32)
    for shift in range(8):
        buf, start = floats_past_a_boundary(3 * 30 * dim, shift, SENTINEL)
        x = buf[start:start + 3 * 30 * dim].reshape(3, 30, dim)
        x[...] = rng.uniform(-3, 3, x.shape)
        x0, before = x.copy(), buf.copy()
        fastpe.add_learned(x, table, offset=5, num_threads=both_threads)
        ctx = f"dim {dim}, {shift} floats past 32 bytes, num_threads={both_threads}"
        assert_bytes_equal(x, x0 + table[5:35], ctx)
        outside = np.ones(buf.size, bool)
        outside[start:start + x.size] = False
        assert_bytes_equal(buf[outside], before[outside], ctx + ": outside x")


# ---- the compiled fast path --------------------------------------------------------------


@needs_compiled
def test_fast_path_declines_without_writing():
    """The C fast path returns False (nothing written) for whatever is not the plain case;
    the public call then takes the general path, which adds or raises as it always has."""
    kern = fastpe._backend.compiled
    table = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    shared = np.zeros((50, 6), np.float32)
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(12, np.float32), (4, 6), (4, 4),
                                                  writeable=True)
    read_only = np.zeros((4, 6), np.float32)
    read_only.flags.writeable = False
    cases = {
        "byte-swapped x": (np.zeros((4, 6), ">f4"), table, 0, None),
        "x of another dtype": (np.zeros((4, 6)), table, 0, TypeError),
        "table byte-swapped": (np.zeros((4, 6), np.float32), table.astype(">f4"), 0, None),
        "table too narrow": (np.zeros((4, 7), np.float32), table, 0, ValueError),
        "past the end": (np.zeros((4, 6), np.float32), table, 37, IndexError),
        # no batch rows to add to, but the sequence still runs past the table
        "past the end, empty batch": (np.zeros((0, 4, 6), np.float32), table, 37, IndexError),
        "negative offset": (np.zeros((4, 6), np.float32), table, -1, ValueError),
        "bool offset": (np.zeros((4, 6), np.float32), table, True, TypeError),
        "numpy offset": (np.zeros((4, 6), np.float32), table, np.int64(2), None),
        "1-D x": (np.zeros(6, np.float32), table, 0, ValueError),
        "4-D x": (np.zeros((1, 1, 4, 6), np.float32), table, 0, ValueError),
        "read-only x": (read_only, table, 0, TypeError),
        "self-overlapping x": (overlapping, table, 0, ValueError),
        "table inside x": (shared[10:14], shared, 0, ValueError),
        "table as a list": (np.zeros((4, 6), np.float32), table.tolist(), 0, TypeError),
    }
    for name, (x, tab, offset, error) in cases.items():
        before = snapshot(x)
        assert kern.learned_call(x, tab, None, offset, 1) is False, name
        assert snapshot(x) == before, name
        if error is None:
            want = as_f64(x) + as_f64(np.asarray(tab))[int(offset):int(offset) + x.shape[-2]]
            fastpe.add_learned(x, tab, offset=offset)
            assert_close(x, want, np.dtype(np.float32), magnitude=300.0, context=name)
        else:
            with pytest.raises(error):
                fastpe.add_learned(x, tab, offset=offset)
            assert snapshot(x) == before, name


@needs_compiled
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fast_path_takes_plain_calls_with_the_general_paths_bits(dtype):
    kern = fastpe._backend.compiled
    buf = awkward_values((140, 10), dtype, seed=5)
    for name, x, table, offset in [
        ("2-D", buf[:30].copy(), buf[40:], 7),
        ("3-D", np.stack([buf[:30], buf[30:60]]), buf[60:], 0),
        ("strided table", buf[:30].copy(), buf[40::2], 3),
        ("reversed x", buf[:30][::-1], buf[40:], 70),    # offset + seq == max_len
        ("x beside its table", buf[:30], buf[30:], 5),
    ]:
        general = np.array(x)
        fastpe.reference.add_learned(general, table, offset=offset)
        assert kern.learned_call(x, table, None, offset, 1) is True, name
        assert_bytes_equal(x, general, name)


@needs_compiled
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_compiled_entry_takes_position_arrays_and_declines_the_rest(dtype):
    """Position arrays of any integer dtype, shared (seq,) / (1, seq) or per batch row
    (batch, seq), stack-sized or not, are added by the compiled entry itself with
    fastpe.reference's bits; anything it cannot prove in range and apart from x is
    declined with x untouched, and add_learned then gives the reference's result or
    its error."""
    kern = fastpe._backend.compiled
    table = awkward_values((700, 12), dtype, seed=6)
    x0 = awkward_values((3, 600, 12), dtype, seed=7)
    rng = np.random.default_rng(8)
    per_row = rng.integers(0, 700, (3, 600))
    taken = {
        "int64 per row": per_row,
        "int32 shared": per_row[0].astype(np.int32),
        "uint16 (1, seq)": per_row[:1].astype(np.uint16),
        "int8 short": np.arange(5, dtype=np.int8),
        "uint64 last row": np.full((3, 600), 699, np.uint64),
    }
    for name, pos in taken.items():
        x = x0[:, :pos.shape[-1]].copy()
        want = x.copy()
        fastpe.reference.add_learned(want, table, pos)
        assert kern.learned_call(x, table, pos, 0, 1) is True, name
        assert_bytes_equal(x, want, name)
    declined = {
        "negative": (-per_row, ValueError),
        "past the end": (per_row + 1, IndexError),
        "past int64": (np.full(600, 2**63, np.uint64), ValueError),
        "float": (per_row.astype(np.float64), TypeError),
        "byte-swapped": (per_row.astype(">i8"), None),
        "strided": (np.repeat(per_row, 2, axis=1)[:, ::2], None),
        "with an offset": (per_row, ValueError),
        "two rows for three": (per_row[:2], ValueError),
    }
    for name, (pos, error) in declined.items():
        x = x0.copy()
        offset = 3 if name == "with an offset" else 0
        assert kern.learned_call(x, table, pos, offset, 1) is False, name
        assert_bytes_equal(x, x0, name)
        if error is None:
            want = x0.copy()
            fastpe.reference.add_learned(want, table, pos)
            fastpe.add_learned(x, table, pos)
            assert_bytes_equal(x, want, name)
        else:
            with pytest.raises(error):
                fastpe.add_learned(x, table, pos, offset=offset)
            assert_bytes_equal(x, x0, name)
    # positions in x's own memory: declined, and the general path refuses them by name
    buf = np.zeros(3 * 600 * 12 + 600, dtype)
    x = buf[:3 * 600 * 12].reshape(3, 600, 12)
    inside = buf.view(np.uint8)[:600 * 8].view(np.int64)
    assert kern.learned_call(x, table, inside, 0, 1) is False
    with pytest.raises(ValueError, match="positions"):
        fastpe.add_learned(x, table, inside)


@needs_compiled
def test_entry_takes_what_the_validator_proves():
    """Calls the validator accepts run, as fastpe.reference runs them: no tokens with an
    offset past the table (nothing to add); x and table interleaved in one buffer with
    no element in common, whether the compiled entry's own proof follows it (columns
    side by side) or only the validator's exact one does."""
    kern = fastpe._backend.compiled
    table = np.ones((4, 8), np.float32)
    for offset in (10, 2**62):
        x = np.zeros((2, 0, 8), np.float32)
        assert fastpe.add_learned(x, table, offset=offset) is x
        assert kern.learned_call(x, table, None, offset, 1) is True
    buf = np.arange(128, dtype=np.float32).reshape(8, 16)
    for name, (x_of, table_of) in {
        "columns side by side": (lambda b: b[:4, :8], lambda b: b[:, 8:]),
        "alternate columns": (lambda b: b[:, 1::2], lambda b: b[:, ::2]),
        "alternate rows": (lambda b: b[1::2, :8], lambda b: b[::2, :8]),
    }.items():
        seq, rows = x_of(buf).shape[0], table_of(buf).shape[0]
        for positions in (None, np.arange(seq)[::-1] % rows):
            b, want = buf.copy(), buf.copy()
            fastpe.reference.add_learned(x_of(want), table_of(want), positions)
            fastpe.add_learned(x_of(b), table_of(b), positions)
            assert_bytes_equal(b, want, f"{name}, positions {positions}")


@needs_compiled
def test_validated_call_falls_back_to_a_copy_of_the_table(monkeypatch):
    """Where the validator proves x and the table apart and the compiled entry's bounded
    proof cannot (here: made to decline the table it is given), the validated call adds
    from a copy of the table, with the same bits; the caller's table is not written."""
    kern = fastpe._backend.compiled
    real = kern.learned_call
    seen = []

    table = awkward_values((40, 6), F32, seed=2)

    def declines_the_callers_table(x, tab, *args):
        seen.append(tab)
        return False if np.shares_memory(tab, table) else real(x, tab, *args)

    x0 = awkward_values((3, 5, 6), F32, seed=3)
    want = x0.copy()
    fastpe.reference.add_learned(want, table, offset=4)
    x, before = x0.copy(), table.copy()
    monkeypatch.setattr(kern, "learned_call", declines_the_callers_table)
    with fastpe.use_backend("cython"):
        fastpe.add_learned(x, table, offset=4)
    assert len(seen) == 3 and seen[-1] is not table   # front door, validated, copy
    assert_bytes_equal(x, want)
    assert_bytes_equal(table, before)


@pytest.mark.skipif(fastpe.backend() != "cython", reason="the compiled backend's copies")
@pytest.mark.parametrize("kind", ["byteswapped", "unaligned"])
def test_a_table_the_kernels_cannot_address_is_copied_only_where_read(kind, monkeypatch):
    """A table of another byte order or unaligned is copied for the kernels: only the rows
    the positions read (a one-token add copied all 4096 rows), with the positions shifted
    to them; the sums are NumPy's."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((4096, 64)).astype(np.float32)
    odd = unaddressable(table, kind)
    copied = kernel_copies(monkeypatch)
    calls = [(None, 4000, 1, [4000]), (np.array([[9, 3000, 5]]), 0, 3, [9, 3000, 5]),
             (np.array([7, 7]), 0, 2, [7, 7])]
    for positions, offset, seq, rows in calls:
        x = rng.standard_normal((2, seq, 64)).astype(np.float32)
        want = x + table[rows]
        copied.clear()
        got = fastpe.add_learned(x, odd, positions, offset=offset)
        np.testing.assert_array_equal(got, want)
        assert copied and max(copied) == max(rows) - min(rows) + 1, copied
