"""sinusoidal_table and add_sinusoidal: the textbook NumPy construction, the formula index by index,
float32 accuracy up to 2**20, layouts, out=, every awkward array against the reference
backend, bit-identical threads, and writes that stay inside the view."""

from __future__ import annotations

import math
import platform
import sys

import numpy as np
import pytest
from conftest import (
    BF16,
    COMPILED,
    DTYPE_IDS,
    F16,
    F32,
    F64,
    FLOAT_DTYPES,
    HALF_DTYPES,
    POSITION_FORMS,
    STORAGE_EPS,
    VIEWS_3D,
    as_f64,
    assert_bytes_equal,
    assert_close,
    awkward_params,
    awkward_values,
    cpu_family_id,
    cpu_vendor_id,
    describe,
    f32_fused_multiply_add,
    floats_past_a_boundary,
    half_edge_operands,
    is_bf16,
    make_awkward,
    make_positions,
    needs_compiled,
    pe_exact,
    run_python,
    snapshot,
)

import fastpe

try:
    import mpmath
except ImportError:  # optional: a second, higher-precision truth
    mpmath = None

LAYOUTS = ["interleaved", "split"]


def textbook_table(max_len: int, d_model: int) -> np.ndarray:
    """The Transformer's NumPy construction as tutorials write it (Vaswani et al., 2017):
    float64, even d_model only."""
    PE = np.zeros((max_len, d_model))
    position = np.arange(max_len)[:, np.newaxis]
    div_term = np.exp(np.arange(0, d_model, 2) * (-np.log(10000.0) / d_model))
    PE[:, 0::2] = np.sin(position * div_term)
    PE[:, 1::2] = np.cos(position * div_term)
    return PE


def formula_value(p: int, j: int, dim: int, base: float, layout: str) -> float:
    """PE[p, j] by the paper's formula with Python floats: sin(p / base**(2i/d)) or cos."""
    nsin = (dim + 1) // 2
    if layout == "interleaved":
        i, is_sin = j // 2, j % 2 == 0
    else:
        i, is_sin = (j, True) if j < nsin else (j - nsin, False)
    angle = p / base ** (2 * i / dim)
    return math.sin(angle) if is_sin else math.cos(angle)


def mp_value(p: int, j: int, dim: int, base: float, layout: str) -> float:
    """The same with mpmath at 40 digits (base taken as the exact binary value given)."""
    nsin = (dim + 1) // 2
    if layout == "interleaved":
        i, is_sin = j // 2, j % 2 == 0
    else:
        i, is_sin = (j, True) if j < nsin else (j - nsin, False)
    with mpmath.workdps(40):
        angle = mpmath.mpf(p) / mpmath.power(mpmath.mpf(base), mpmath.mpf(2 * i) / dim)
        return float(mpmath.sin(angle) if is_sin else mpmath.cos(angle))


def table_context(fn: str, length: int, dim: int, dtype, layout: str, **kw) -> str:
    extra = "".join(f" {k}={v}" for k, v in kw.items())
    return f"{fn}(length={length}, dim={dim}, dtype={np.dtype(dtype)}, layout={layout}{extra})"


# ---- the awkward-array generator itself -----------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 67, 10), (67, 9)], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_awkward_arrays_are_what_their_labels_say(dtype, shape):
    from conftest import awkward_arrays, logical_shape

    seen = set()
    for kind, a in awkward_arrays(shape, dtype):
        seen.add(kind)
        assert a.shape == logical_shape(kind, shape) and a.flags.writeable, kind
        assert np.array_equal(as_f64(a), as_f64(awkward_values(a.shape, dtype))), kind
        checks = {
            "contiguous": a.flags.c_contiguous,
            "fortran": a.flags.f_contiguous and not a.flags.c_contiguous,
            "strided-last": a.strides[-1] == 2 * a.itemsize,
            "strided-rows": not a.flags.c_contiguous and a.strides[-1] == a.itemsize,
            "reversed": all(s < 0 for s in a.strides),
            "seq-major": a.strides[0] < a.strides[1],
            "byteswapped": not a.dtype.isnative,
            "unaligned": not a.flags.aligned,
            "odd-byte-stride": any(s % a.itemsize for s in a.strides),
            "empty": a.size == 0,
            "single": a.size == 1,
        }
        assert checks[kind], f"{kind}: {describe(a)}"
    assert {"contiguous", "strided-rows", "reversed", "unaligned", "empty"} <= seen
    assert ("byteswapped" in seen) == (not is_bf16(dtype))


# ---- exactness -----------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 8, 64, 512])
def test_float64_table_equals_textbook_construction(dim):
    length = 1024
    got = fastpe.sinusoidal_table(length, dim, dtype="float64")
    assert got.dtype == np.float64 and got.shape == (length, dim)
    assert_close(got, textbook_table(length, dim), F64, atol=1e-12, rtol=0.0,
                 context=table_context("sinusoidal_table", length, dim, F64, "interleaved"))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 1000])
@pytest.mark.parametrize("dim", [1, 2, 3, 5, 8, 33])
def test_table_matches_formula_index_by_index(dim, offset, layout):
    """Every element against sin(p / base**(2i/d)) / cos(...) in Python floats; odd dims
    (which the textbook code cannot build) included."""
    length, base = 40, 10000.0
    got = fastpe.sinusoidal_table(length, dim, offset=offset, layout=layout, dtype="float64")
    want = np.array([[formula_value(offset + t, j, dim, base, layout) for j in range(dim)]
                     for t in range(length)])
    ctx = table_context("sinusoidal_table", length, dim, F64, layout, offset=offset)
    assert_close(got, want, F64, max_position=offset + length, context=ctx)
    if mpmath is not None:
        want_mp = np.array([[mp_value(offset + t, j, dim, base, layout) for j in range(dim)]
                            for t in range(length)])
        assert_close(got, want_mp, F64, max_position=offset + length, context=ctx + " mpmath")


@pytest.mark.parametrize("dim", [1, 2, 5, 8, 33])
def test_split_is_a_column_permutation_of_interleaved(dim):
    """split = [all sines | all cosines] of the same frequencies: the even columns of the
    interleaved table, then its odd columns."""
    inter = fastpe.sinusoidal_table(70, dim, offset=3, dtype="float64")
    split = fastpe.sinusoidal_table(70, dim, offset=3, dtype="float64", layout="split")
    perm = np.r_[np.arange(0, dim, 2), np.arange(1, dim, 2)]
    assert_close(split, inter[:, perm], F64, context=f"split vs interleaved, dim={dim}")


FLOAT32_OFFSETS = [0, 1000, 65_000, 999_950, 2**19 + 5, 2**20 - 63]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [63, 64, 1024])
@pytest.mark.parametrize("offset", FLOAT32_OFFSETS)
def test_float32_table_within_1_5e_7_of_exact_up_to_2_20(offset, dim, layout):
    """Rows sampled across [0, 2**20] (the last one is position 2**20 exactly; 999_950 spans
    the compiled sin/cos's switch to libm at angle 1e6). The truth is the formula in
    float64, whose own error there is ~1e-10 (angle rounding), far below 1.5e-7; with
    mpmath installed a subsample is checked against 40 digits too."""
    length = 64
    got = fastpe.sinusoidal_table(length, dim, offset=offset, layout=layout)
    assert got.dtype == np.float32
    want = pe_exact(offset + np.arange(length), dim, layout=layout)
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= 1.5e-7, (
        f"{table_context('sinusoidal_table', length, dim, F32, layout, offset=offset)}: "
        f"error {err.max():.3g} at position {offset + worst[0]}, column {worst[1]}")
    if mpmath is not None:
        for t, j in [(0, 0), (length - 1, 0), (length - 1, 1), (length // 2, dim - 1),
                     (length - 1, dim // 2)]:
            exact = mp_value(offset + t, j, dim, 10000.0, layout)
            assert abs(float(got[t, j]) - exact) <= 1.5e-7, (offset + t, j)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_random_positions_up_to_2_20(layout):
    """add_sinusoidal on zeros with scattered positions (no recurrence between tokens)."""
    rng = np.random.default_rng(5)
    pos = rng.integers(0, 2**20 + 1, (3, 200))
    pos[0, :3] = [0, 2**20, 2**20 - 1]
    x = np.zeros((3, 200, 96), np.float32)
    fastpe.add_sinusoidal(x, pos, layout=layout)
    err = np.abs(x.astype(np.float64) - pe_exact(pos, 96, layout=layout))
    where = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= 1.5e-7, (f"add_sinusoidal float32 {layout}: error {err.max():.3g} at "
                                 f"position {pos[where[:2]]}, column {where[2]}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float64_table_accurate_near_2_20(layout):
    length, dim, offset = 96, 64, 2**20 - 95
    got = fastpe.sinusoidal_table(length, dim, offset=offset, layout=layout, dtype="float64")
    want = pe_exact(offset + np.arange(length), dim, layout=layout)
    assert_close(got, want, F64, max_position=offset + length,
                 context=table_context("sinusoidal_table", length, dim, F64, layout,
                                       offset=offset))


@pytest.mark.parametrize("base", [1.0, 2.0, 500.0, 10000.0, 1e6])
@pytest.mark.parametrize("offset", [0, 17, 3001])
def test_base_and_offset(base, offset):
    length, dim = 50, 12
    got = fastpe.sinusoidal_table(length, dim, base=base, offset=offset, dtype="float64")
    want = np.array([[formula_value(offset + t, j, dim, base, "interleaved")
                      for j in range(dim)] for t in range(length)])
    assert_close(got, want, F64, max_position=offset + length,
                 context=table_context("sinusoidal_table", length, dim, F64, "interleaved",
                                       base=base, offset=offset))
    # an offset table is the tail of a longer one
    longer = fastpe.sinusoidal_table(length + offset, dim, base=base, dtype="float64")
    assert_close(got, longer[offset:], F64, max_position=offset + length,
                 context=f"offset={offset} table vs rows of a longer table")


def test_base_changes_the_table():
    a = fastpe.sinusoidal_table(8, 16, dtype="float64")
    b = fastpe.sinusoidal_table(8, 16, base=100.0, dtype="float64")
    assert not np.allclose(a[1:, 2:], b[1:, 2:])


@pytest.mark.parametrize("dtype", [d for d in (F16, BF16) if d is not None],
                         ids=lambda d: str(d))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 5000])
def test_half_tables_within_one_storage_ulp(dtype, layout, offset):
    length, dim = 80, 33
    got = fastpe.sinusoidal_table(length, dim, offset=offset, layout=layout, dtype=dtype)
    assert got.dtype == dtype
    want = pe_exact(offset + np.arange(length), dim, layout=layout)
    eps = STORAGE_EPS[str(dtype)]
    tiny = 2.0**-24 if dtype == F16 else 2.0**-133  # one subnormal ulp
    assert_close(got, want, dtype, atol=tiny, rtol=eps,
                 context=table_context("sinusoidal_table", length, dim, dtype, layout,
                                       offset=offset))


@pytest.mark.parametrize("dtype", [d for d in (F16, BF16) if d is not None],
                         ids=lambda d: str(d))
@pytest.mark.parametrize("frequencies, layout", [("transformer", "interleaved"),
                                                 ("transformer", "split"),
                                                 ("fairseq", "split_cos")])
def test_half_tables_are_the_float32_table_rounded_by_both_backends(dtype, frequencies,
                                                                    layout):
    """A float16 or bfloat16 table is the float32 one cast (round to nearest even), as
    XLM, DistilBERT or Pegasus hold theirs, whichever backend makes it: where the two
    roundings differ from one (25 float16 elements of a (512, 768) table), neither backend
    rounds its float64 values once."""
    kwargs = dict(frequencies=frequencies, layout=layout)
    want = fastpe.reference.sinusoidal_table(512, 768, dtype="float32", **kwargs).astype(dtype)
    once = fastpe.reference.sinusoidal_table(512, 768, dtype="float64", **kwargs).astype(dtype)
    assert not np.array_equal(want, once)   # the two roundings differ somewhere
    for backend in ("numpy", "cython") if COMPILED else ("numpy",):
        with fastpe.use_backend(backend):
            assert_bytes_equal(fastpe.sinusoidal_table(512, 768, dtype=dtype, **kwargs), want,
                               backend)


def test_default_dtype_is_float32():
    assert fastpe.sinusoidal_table(3, 4).dtype == np.float32


def test_empty_table():
    t = fastpe.sinusoidal_table(0, 6)
    assert t.shape == (0, 6) and t.dtype == np.float32


@pytest.mark.parametrize("shape", [(0, 6), (2, 0, 6), (0, 5, 6)], ids=str)
def test_add_sinusoidal_on_empty_x_is_a_no_op(shape):
    x = np.zeros(shape, np.float32)
    assert fastpe.add_sinusoidal(x) is x


def test_add_sinusoidal_on_sliced_empty_x():
    """An empty slice of a real array keeps its (nonzero) strides."""
    x = np.zeros((2, 3, 4), np.float32)[:, :0]
    assert fastpe.add_sinusoidal(x) is x


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
def test_add_sinusoidal_on_x_with_no_features(backend):
    x = np.zeros((2, 3, 4), np.float32)[..., :0]
    with fastpe.use_backend(backend):
        assert fastpe.add_sinusoidal(x) is x


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
@pytest.mark.parametrize("frequencies", ["transformer", "fairseq"])
def test_no_rows_form_no_frequencies(backend, frequencies):
    """A call with no rows to fill forms no frequencies: a width past what memory holds
    costs nothing (x of zero elements, a table of no rows); the base is still checked."""
    x = np.empty((1, 0, 2**40), np.float32)
    with fastpe.use_backend(backend):
        assert fastpe.add_sinusoidal(x, frequencies=frequencies) is x
        assert fastpe.sinusoidal_table(0, 2**40, frequencies=frequencies).shape == (0, 2**40)
        with pytest.raises(ValueError, match=r"base=1e-300"):
            fastpe.add_sinusoidal(x, base=1e-300, frequencies=frequencies)
        with pytest.raises(ValueError, match=r"base=1e-300"):
            fastpe.sinusoidal_table(0, 2**40, base=1e-300, frequencies=frequencies)


def test_empty_out():
    out = np.zeros((0, 6), np.float32)
    fastpe.sinusoidal_table(0, 6, out=out)


# ---- out= ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_out_is_filled(dtype):
    out = np.full((20, 7), 99, dtype)
    ret = fastpe.sinusoidal_table(20, 7, offset=4, dtype=None if dtype != F32 else "float32",
                                  out=out)
    assert np.shares_memory(ret, out) and ret.shape == out.shape and ret.dtype == dtype
    assert_close(out, pe_exact(4 + np.arange(20), 7), dtype, max_position=24,
                 context=f"sinusoidal_table(out={describe(out)})")


def test_out_returns_the_given_buffer():
    out = np.empty((5, 4), np.float32)
    assert fastpe.sinusoidal_table(5, 4, out=out) is out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_out_strided(dtype):
    big = np.full((41, 30), 99, dtype)
    out = big[1::2, 2:-1:3]  # rows of a bigger buffer, every third column
    assert out.shape == (20, 9) and not out.flags.c_contiguous
    fastpe.sinusoidal_table(20, 9, layout="split", dtype=dtype, out=out)
    assert_close(out, pe_exact(np.arange(20), 9, layout="split"), dtype,
                 context=f"sinusoidal_table(out={describe(out)})")


# ---- add_sinusoidal against x * scale + PE[pos] -----------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scale", [1.0, 2.5])
@pytest.mark.parametrize("form", POSITION_FORMS + ("2d-none", "2d-shared"))
def test_add_sinusoidal_equals_x_scale_plus_table(form, scale, layout, dtype):
    batch, seq, dim = 3, 45, 11
    if form.startswith("2d-"):
        positions, offset, full = make_positions(form[3:], 1, seq)
        x = awkward_values((seq, dim), dtype)
    else:
        positions, offset, full = make_positions(form, batch, seq)
        x = awkward_values((batch, seq, dim), dtype)
    x0 = as_f64(x)
    ret = fastpe.add_sinusoidal(x, positions, offset=offset, scale=scale, layout=layout)
    assert ret is x
    pe = pe_exact(full, dim, layout=layout)
    want = x0 * scale + (pe[0] if x.ndim == 2 else pe)
    assert_close(x, want, dtype, magnitude=2 * scale + 1, max_position=full.max(),
                 context=f"add_sinusoidal({describe(x)}, positions={form}, scale={scale}, "
                         f"layout={layout})")


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", [(1, 300, 130), (3, 70, 64), (1, 1100, 1024), (67, 9)],
                         ids=str)
def test_add_sinusoidal_equals_add_learned_of_the_table(shape, dtype, backend):
    """The README's advice for repeated single-sequence calls: a table made once and
    added with add_learned gives add_sinusoidal's bits (one rounding of PE, one add;
    both form the angles from the same float64 seeds, at fixed token indices)."""
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    with fastpe.use_backend(backend):
        table = fastpe.sinusoidal_table(shape[-2] + 5, shape[-1], dtype=dtype)
        got = fastpe.add_learned(x.copy(), table)
        want = fastpe.add_sinusoidal(x.copy())
    assert_bytes_equal(got, want, f"add_learned of the table, {shape} {dtype.__name__}")


@pytest.mark.parametrize("dim", [7, 9, 37, 64, 1029])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_rows_at_every_offset_from_a_vector_boundary(batch, dim, both_threads):
    """float32 x starting 0 to 7 floats past a 32-byte boundary (the PE rows made for the
    adds sit at x's offset, and the adds walk x from the boundary): with scale 1 each
    value is x plus the table's value in float32, rounded once; with scale 2.5 every
    offset gives the bits of the first; nothing around x changes."""
    rng = np.random.default_rng(22)
    size = batch * 40 * dim
    table = fastpe.sinusoidal_table(40, dim, dtype=np.float32)
    ramp = np.linspace(-3, 3, size).reshape(batch, 40, dim)
    scaled = None
    for shift in range(8):
        for scale in (1.0, 2.5):
            buf, start = floats_past_a_boundary(size, shift, SENTINEL)
            x = buf[start:start + size].reshape(batch, 40, dim)
            x[...] = rng.uniform(-3, 3, x.shape) if scale == 1 else ramp
            x0, before = x.copy(), buf.copy()
            fastpe.add_sinusoidal(x, scale=scale, num_threads=both_threads)
            ctx = f"{x.shape}, {shift} floats past 32 bytes, scale {scale}"
            if scale == 1:
                assert_bytes_equal(x, x0 + table, ctx)
            elif scaled is None:
                scaled = x.copy()
            else:
                assert_bytes_equal(x, scaled, ctx + ": against 0 floats past")
            outside = np.ones(buf.size, bool)
            outside[start:start + size] = False
            assert_bytes_equal(buf[outside], before[outside], ctx + ": outside x")


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
def test_a_float64_row_takes_any_finite_scale(backend):
    """float64 rows scale in float64: 0 * 1e300 is 0, the row the table's."""
    x = np.zeros((2, 40, 8))
    with fastpe.use_backend(backend):
        fastpe.add_sinusoidal(x, scale=1e300)
    assert_close(x, np.broadcast_to(pe_exact(np.arange(40), 8), x.shape), F64, max_position=40)


def test_add_sinusoidal_scale_zero_gives_the_table():
    x = np.full((2, 40, 8), 5.0)
    fastpe.add_sinusoidal(x, scale=0.0)
    assert_close(x, np.broadcast_to(pe_exact(np.arange(40), 8), x.shape), F64, max_position=40)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [128, 37])     # 37: vectors, a scalar tail, a lone sine
@pytest.mark.parametrize("scale", [1.0, 0.5, 3.0, 1 / 3])
def test_half_rows_round_once_on_every_bit_pattern(dtype, dim, scale, bf16_narrowing):
    """float16 / bfloat16 x * scale + PE, every bit pattern of x (NaN, inf, subnormals; row 0
    of PE is 0, 1, 0, 1, ..., so x + 1 falls on ties): the float32 value of the staged PE
    row, x widened, one multiply-add, rounded once to the storage type as NumPy / ml_dtypes
    round. The multiply-add is fused where the compiled kernels fuse it (the avx2 and avx512
    variants, and FMA machines that are not x86), two roundings elsewhere. One batch row (each PE row
    added as it is made), two and three (rows staged, added to pairs of rows) alike; strided
    rows (converted in chunks) give the same bits, NaN payloads included."""
    xs, _ = half_edge_operands(dtype)
    n = xs.shape[1] - xs.shape[1] % dim
    x = np.stack([xs[0, :n], xs[0, :n][::-1], np.roll(xs[0, :n], 4321)]).reshape(3, -1, dim)
    seq = x.shape[1]
    pe = fastpe.sinusoidal_table(seq, dim, dtype=np.float32)
    info = fastpe.info()
    fused = info["backend"] == "cython" and (
        info["isa"] in ("avx2", "avx512") or platform.machine().lower() not in ("x86_64", "amd64", "i686"))
    x32 = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want32 = (f32_fused_multiply_add(x32, scale, pe) if fused
                  else x32 * np.float32(scale) + pe)
        want = want32.astype(dtype)
    nan = np.isnan(want32)
    assert nan.any() and not nan.all()
    for batch in (1, 2, 3):     # each PE row added as made; staged for a pair (and one)
        ctx = f"add_sinusoidal {dtype} dim {dim} scale {scale} batch {batch} fused {fused}"
        got = x[:batch].copy()
        fastpe.add_sinusoidal(got, scale=scale)
        assert np.isnan(as_f64(got[nan[:batch]])).all(), f"{ctx}: NaN not NaN"
        assert_bytes_equal(got[~nan[:batch]], want[:batch][~nan[:batch]], ctx)
        wide = np.zeros((batch, seq, 2 * dim), dtype)
        strided = wide[..., ::2]
        strided[...] = x[:batch]
        fastpe.add_sinusoidal(strided, scale=scale)
        assert_bytes_equal(got, strided, f"{ctx}: unit-stride vs strided rows")
        ref = x[:batch].copy()
        with np.errstate(invalid="ignore", over="ignore"):
            fastpe.reference.add_sinusoidal(ref, scale=scale)
        # the reference's PE may differ by a float32 ulp: numbers close, infinities equal
        a, e = as_f64(got), as_f64(ref)
        same_inf = np.isinf(e) & (a == e)
        assert_close(np.where(same_inf, 0, a), np.where(same_inf, 0, e), dtype, magnitude=4.0,
                     context=f"{ctx} vs fastpe.reference")


# ---- compiled against reference, every awkward array --------------------------------------

SHAPES_3D = [(3, 67, 10), (2, 40, 9)]
SHAPES_2D = [(67, 9), (33, 16)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind,shape,dtype",
                         awkward_params(SHAPES_3D[:1] + SHAPES_2D[:1]))
def test_add_sinusoidal_matches_reference(kind, shape, dtype, layout, both_threads):
    x = make_awkward(kind, shape, dtype)
    y = make_awkward(kind, shape, dtype)
    batch, seq = (1,) + x.shape[:1] if x.ndim == 2 else x.shape[:2]
    # per-row positions for 3-D x, an offset for 2-D x
    positions, offset, full = make_positions("per-row" if x.ndim == 3 else "offset",
                                             batch, seq, high=3000)
    ctx = (f"add_sinusoidal({kind}: {describe(x)}, layout={layout}, "
           f"num_threads={both_threads})")
    ret = fastpe.add_sinusoidal(x, positions, offset=offset, scale=1.5, layout=layout,
                                num_threads=both_threads)
    assert ret is x, ctx
    fastpe.reference.add_sinusoidal(y, positions, offset=offset, scale=1.5, layout=layout)
    assert_close(x, y, dtype, magnitude=4.0, max_position=full.max() if full.size else 0,
                 context=ctx)


@pytest.mark.parametrize("kind,shape,dtype", awkward_params(
    SHAPES_3D + SHAPES_2D))
def test_add_sinusoidal_awkward_matches_formula(kind, shape, dtype):
    """Every awkward layout against x * scale + PE computed in float64 (independent of the
    reference backend)."""
    x = make_awkward(kind, shape, dtype)
    x0 = as_f64(x)
    seq, dim = x.shape[-2:]
    fastpe.add_sinusoidal(x, offset=40, scale=1.5, layout="split")
    assert_close(x, x0 * 1.5 + pe_exact(40 + np.arange(seq), dim, layout="split"), dtype,
                 magnitude=4.0, max_position=40 + seq,
                 context=f"add_sinusoidal({kind}: {describe(x)}, layout=split)")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind,shape,dtype",
                         awkward_params(SHAPES_2D[:1]))
def test_table_out_matches_reference(kind, shape, dtype, layout, both_threads):
    out = make_awkward(kind, shape, dtype)
    ref = make_awkward(kind, shape, dtype)
    ctx = f"sinusoidal_table(out={kind}: {describe(out)}, layout={layout}, " \
          f"num_threads={both_threads})"
    fastpe.sinusoidal_table(*out.shape, offset=11, layout=layout, dtype=None, out=out,
                            num_threads=both_threads)
    fastpe.reference.sinusoidal_table(*ref.shape, offset=11, layout=layout, dtype=None,
                                      out=ref)
    assert_close(out, ref, dtype, max_position=11 + shape[0], context=ctx)


def test_reference_keeps_float64_precision_for_byteswapped_x():
    x = np.full((2, 40, 6), 1 / 3, ">f8")
    fastpe.reference.add_sinusoidal(x, scale=3.0)
    want = 1.0 + pe_exact(np.arange(40), 6)
    assert_close(x, np.broadcast_to(want, x.shape), F64, max_position=40,
                 context=f"reference.add_sinusoidal({describe(x)})")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_table_matches_reference(dtype, layout, both_threads):
    got = fastpe.sinusoidal_table(130, 37, offset=900, layout=layout, dtype=dtype,
                                  num_threads=both_threads)
    want = fastpe.reference.sinusoidal_table(130, 37, offset=900, layout=layout, dtype=dtype)
    assert got.dtype == want.dtype == dtype
    assert_close(got, want, dtype, max_position=1030,
                 context=table_context("sinusoidal_table", 130, 37, dtype, layout))


# (chunk bytes, batch rows at a time, early rows, rows prefetching the next token's) of
# staged PE rows: each CPU's, chunks of one block of tokens (several chunks of a 70-token
# x) three rows at a time, and two or no early rows
STAGINGS = [(1 << 20, 4, 1, True), (256 << 10, 8, 1, True), (256 << 10, 8, 1, False),
            (1 << 20, 2, 0, False), (4096, 3, 1, True), (4096, 3, 0, False),
            (4096, 3, 2, False)]


@pytest.fixture(params=STAGINGS,
                ids=lambda s: f"chunk{s[0]}-rows{s[1]}-early{s[2]}-prefetch{s[3]}")
def staging(request):
    """The compiled add_sinusoidal's staging and row prefetch set to the parameter for
    the test (the NumPy backend has neither: only the first parameter runs there)."""
    if not COMPILED:
        if request.param != STAGINGS[0]:
            pytest.skip("staging is the compiled kernels'")
        yield request.param
        return
    from fastpe import _backend

    kern = _backend.compiled
    was, was_prefetch = kern.sinusoidal_staging(), kern.row_prefetch()
    try:
        assert kern.sinusoidal_staging(*request.param[:3]) == request.param[:3]
        assert kern.row_prefetch(request.param[3]) is request.param[3]
        yield request.param
    finally:
        kern.sinusoidal_staging(*was)
        kern.row_prefetch(was_prefetch)


@needs_compiled
def test_staging_follows_the_cpu_vendor():
    """Chosen at import: 256 KiB chunks, one early row and eight batch rows at a time,
    and the next token's rows prefetched on Intel; 1 MiB, no early row and two at a time
    without the prefetch on AMD's family 25 (Zen 3 and 4); 1 MiB, one early row and four
    at a time without the prefetch elsewhere."""
    code = ("from fastpe import _backend; k = _backend.compiled; "
            "print(k.cpu_vendor() or '-', k.cpu_family(), *k.sinusoidal_staging(), "
            "k.row_prefetch())")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    vendor, family, chunk, rows, early, prefetch = proc.stdout.split()
    intel = vendor == "GenuineIntel"
    if intel:
        want = (256 << 10, 8, 1)
    elif vendor == "AuthenticAMD" and family == "25":
        want = (1 << 20, 2, 0)
    else:
        want = (1 << 20, 4, 1)
    assert (int(chunk), int(rows), int(early)) == want
    assert prefetch == str(intel)
    if cpu_vendor_id() is not None:
        assert vendor == cpu_vendor_id()
    if cpu_family_id() is not None:
        assert int(family) == cpu_family_id()
    from fastpe import _backend

    with pytest.raises(ValueError, match="late_rows"):
        _backend.compiled.sinusoidal_staging(None, 0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        _backend.compiled.sinusoidal_staging(0)
    with pytest.raises(ValueError, match="early_rows"):
        _backend.compiled.sinusoidal_staging(None, None, -1)
    with pytest.raises(ValueError, match="early_rows"):
        _backend.compiled.sinusoidal_staging(None, None, 65)
    was = _backend.compiled.sinusoidal_staging()
    for bad in ((4096, 3, 99), (4096, 3, 1.5), (4096, True, 0)):
        with pytest.raises(ValueError):
            _backend.compiled.sinusoidal_staging(*bad)
        assert _backend.compiled.sinusoidal_staging() == was, f"{bad} changed the staging"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scale", [1.0, 0.7])
@pytest.mark.parametrize("dim", [64, 37])
def test_batch_rows_added_in_groups_give_each_rows_own_bits(dtype, scale, dim, staging):
    """Batch rows sharing positions take the PE rows in groups (the first rows as each
    PE row is made, in registers for float32, the others several at a time, any
    remainder alone), in chunks of tokens: every batch size and staging gives each row
    the bits of adding it on its own, and (float32 and half precision) one rounding of
    the float32 PE row and multiply-add."""
    rng = np.random.default_rng(11)
    seq = 70
    for batch in (2, 3, 4, 7, 8, 9, 15):
        x = rng.uniform(-3, 3, (batch, seq, dim)).astype(dtype)
        got = fastpe.add_sinusoidal(x.copy(), scale=scale, offset=5)
        if np.dtype(dtype).itemsize >= 4:
            want = (x.astype(np.float64) * scale
                    + pe_exact(np.arange(5, 5 + seq), dim)[None]).astype(dtype)
            assert_close(got, want, dtype, magnitude=4.0, max_position=5 + seq,
                         context=f"batch {batch} dim {dim} staging {staging}")
        for b in range(batch):
            alone = fastpe.add_sinusoidal(x[b:b + 1].copy(), scale=scale, offset=5)
            assert_bytes_equal(got[b:b + 1], alone, f"{dtype} batch {batch} row {b} dim {dim}")
        if np.dtype(dtype).itemsize <= 4:
            pe = fastpe.sinusoidal_table(seq, dim, offset=5, dtype=np.float32)
            info = fastpe.info()
            fused = info["backend"] == "cython" and (
                info["isa"] in ("avx2", "avx512")
                or platform.machine().lower() not in ("x86_64", "amd64", "i686"))
            x32 = x.astype(np.float32)
            want = (f32_fused_multiply_add(x32, scale, pe) if fused
                    else x32 * np.float32(scale) + pe).astype(dtype)
            assert_bytes_equal(got, want, f"{dtype} batch {batch} dim {dim}: rounded once")


# ---- threads and ISA variants: bit-identical ------------------------------------------------


THREAD_KINDS = ["contiguous", "strided-last", "reversed", "byteswapped", "odd-byte-stride"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["offset", "per-row", "unsorted"])
@pytest.mark.parametrize("kind,shape,dtype", [
    p for p in awkward_params([(3, 200, 24)]) if p.values[0] in THREAD_KINDS])
def test_add_sinusoidal_bit_identical_across_threads(kind, shape, dtype, form, layout,
                                                     threaded):
    """(3, 200, 24): 7 blocks of 32 tokens per row, split between 2 or 3 threads."""
    positions, offset, _ = make_positions(form, 3, 200, high=2**20)
    results = []
    for n in (1, 2, 3):
        x = make_awkward(kind, shape, dtype)
        fastpe.add_sinusoidal(x, positions, offset=offset, scale=1.25, layout=layout,
                              num_threads=n)
        results.append(x)
    for n, r in zip((2, 3), results[1:]):
        assert_bytes_equal(r, results[0], f"add_sinusoidal({kind} {describe(r)}, {form}, "
                                          f"{layout}) num_threads={n} vs 1")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_add_sinusoidal_wide_rows_shared_by_the_batch(dtype, layout, threaded):
    """(3, 150, 1024), positions shared by the batch: the PE rows of a few dozen tokens
    at a time (1024 wide) serve every batch row; the same formula, and the same bits
    whatever the thread count."""
    shape, offset = (3, 150, 1024), 4000
    results = []
    for n in (1, 2, 3):
        x = awkward_values(shape, dtype, seed=5)
        x0 = as_f64(x)
        fastpe.add_sinusoidal(x, offset=offset, layout=layout, num_threads=n)
        results.append(x)
    pe = pe_exact(offset + np.arange(shape[1]), shape[2], layout=layout)
    assert_close(results[0], x0 + pe, dtype, magnitude=3.0, max_position=offset + shape[1],
                 context=f"add_sinusoidal({describe(x)}, offset={offset}, layout={layout})")
    for n, r in zip((2, 3), results[1:]):
        assert_bytes_equal(r, results[0], f"add_sinusoidal {describe(r)} {layout} "
                                          f"num_threads={n} vs 1")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_table_bit_identical_across_threads(dtype, layout, threaded):
    one = fastpe.sinusoidal_table(300, 40, offset=2**20 - 300, layout=layout, dtype=dtype,
                                  num_threads=1)
    for n in (2, 4):
        many = fastpe.sinusoidal_table(300, 40, offset=2**20 - 300, layout=layout,
                                       dtype=dtype, num_threads=n)
        assert_bytes_equal(many, one, f"sinusoidal_table {dtype} {layout} num_threads={n}")


@pytest.mark.parametrize("dim, row_stride", [(1024, None), (1023, None), (1000, None),
                                             (1023, 1024), (1019, 1024)])
def test_table_past_the_caches_equals_small_tables(dim, row_stride):
    """A float32 table over 8 MiB goes out with non-temporal stores (odd dim: its last
    column plainly), two rows at a time where they share an alignment (rows a multiple
    of 32 bytes apart: 1024 and 1000 wide, or odd widths in wider rows); every row is
    bit for bit the row a small table gives, on 1 and 2 threads, aligned and not, and
    within float32 rounding of the reference."""
    rows = (9 << 20) // (4 * dim) + 1
    if row_stride is None:
        big = fastpe.sinusoidal_table(rows, dim, num_threads=1)
    else:
        big = np.full((rows, row_stride), SENTINEL, np.float32)[:, :dim]
        fastpe.sinusoidal_table(rows, dim, out=big, num_threads=1)
        assert not np.any(big.base[:, dim:] != SENTINEL), "written past the view"
    assert big.nbytes > 8 << 20
    for start in (0, 32, rows - 40):
        small = fastpe.sinusoidal_table(32, dim, offset=start - start % 32, num_threads=1)
        begin = start - start % 32
        assert_bytes_equal(big[begin:begin + 32], small, f"rows {begin}..")
    buf = np.zeros(big.size + 1, np.float32)[1:].reshape(big.shape)   # 4 bytes off
    fastpe.sinusoidal_table(rows, dim, out=buf, num_threads=2)
    assert_bytes_equal(buf, big, "unaligned, 2 threads")
    ref = fastpe.reference.sinusoidal_table(rows, dim, dtype=np.float64)
    assert np.abs(big - ref).max() <= 2e-6 * (1 + rows * 2.0**-20)


@pytest.mark.parametrize("misalign", [8, 16, 24, 32, 48, 56])
def test_table_past_the_caches_at_every_alignment(misalign):
    """A big float32 table starting `misalign` bytes into a cache line: its rows' partial
    lines are written plainly, the whole lines streamed, the angles kept at the rows'
    alignment; every row equals the row of a small table, bit for bit."""
    rows, dim = (9 << 20) // 4096 + 1, 1024
    raw = np.zeros(rows * dim * 4 + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    out = raw[start:start + rows * dim * 4].view(np.float32).reshape(rows, dim)
    fastpe.sinusoidal_table(rows, dim, out=out, num_threads=1)
    assert not raw[:start].any() and not raw[start + rows * dim * 4:].any(), "outside out"
    for begin in (0, 32, rows - rows % 32 - 32):
        assert_bytes_equal(out[begin:begin + 32],
                           fastpe.sinusoidal_table(32, dim, offset=begin, num_threads=1),
                           f"rows {begin}.. at {misalign} bytes into a line")


@pytest.mark.parametrize("dim, misalign", [(1024, 0), (1024, 16), (1024, 8), (1000, 48),
                                           (1023, 24), (6, 0)])
def test_float64_table_past_the_caches_equals_small_tables(dim, misalign):
    """A float64 interleaved table over 8 MiB goes out with streaming stores, four pairs
    (a line) at a time where its pairs reach a line boundary (not 8 bytes past 16: then
    plainly), the ends of rows plainly: `misalign` bytes into a line, on 1 and 2
    threads, every block of 32 rows is bit for bit a small table's (made with plain
    stores), nothing beside it is written, and it is within float64 rounding of the
    reference."""
    rows = (9 << 20) // (8 * dim) + 1
    raw = np.full(rows * dim * 8 + 128, 0xA5, np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    out = raw[start:start + rows * dim * 8].view(np.float64).reshape(rows, dim)
    assert out.nbytes > 8 << 20
    for threads in (1, 2):
        out[...] = 0
        fastpe.sinusoidal_table(rows, dim, out=out, dtype=np.float64, num_threads=threads)
        assert (raw[:start] == 0xA5).all() and (raw[start + out.nbytes:] == 0xA5).all(), \
            "written outside out"
        for begin in (0, 32, rows - rows % 32 - 32):
            small = fastpe.sinusoidal_table(32, dim, offset=begin, dtype=np.float64,
                                            num_threads=1)
            assert_bytes_equal(out[begin:begin + 32], small,
                               f"rows {begin}.. at {misalign} bytes, {threads} threads")
    ref = fastpe.reference.sinusoidal_table(rows, dim, dtype=np.float64)
    assert np.abs(out - ref).max() <= 1e-9


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("dim, layout, misalign", [
    (1024, "interleaved", 0), (1024, "interleaved", 16), (1000, "interleaved", 2),
    (1025, "split", 34), (2048, "split_cos", 48)])
def test_half_table_past_the_caches_is_the_float32_table_narrowed(dtype, dim, layout,
                                                                   misalign):
    """A float16 or bfloat16 table over 8 MiB goes out with streaming stores (whole lines;
    a row's ends, shared with the next row's, plainly): `misalign` bytes into a cache
    line, on 1 and 2 threads, every element is the float32 table's, rounded to nearest
    even into the half dtype (NumPy's and ml_dtypes' own casts), and nothing beside the
    table is written; by both backends."""
    rows = (9 << 20) // (2 * dim) + 1
    want = fastpe.sinusoidal_table(rows, dim, layout=layout, offset=77,
                                   num_threads=1).astype(dtype)
    for threads in (1, 2):
        raw = np.full(rows * dim * 2 + 128, 0xA5, np.uint8)
        start = (-raw.ctypes.data) % 64 + misalign
        out = raw[start:start + rows * dim * 2].view(dtype).reshape(rows, dim)
        assert out.nbytes > 8 << 20
        fastpe.sinusoidal_table(rows, dim, out=out, layout=layout, offset=77,
                                num_threads=threads)
        assert (raw[:start] == 0xA5).all() and (raw[start + out.nbytes:] == 0xA5).all(), \
            "written outside out"
        assert_bytes_equal(out, want, f"{dim} {layout} {misalign} bytes in, "
                                      f"{threads} threads")


@pytest.mark.parametrize("dim", [1024, 1000, 63])
def test_rows_made_two_at_a_time_equal_rows_made_one_at_a_time(dim):
    """float32 PE rows come two per pass where they can (a table; rows staged for a
    batch) and one per pass elsewhere (one sequence's add, block starts): the same
    angle-addition steps, so adding to zeros gives the table's bits on every path."""
    table = fastpe.sinusoidal_table(300, dim, offset=5, num_threads=1)
    one = np.zeros((1, 300, dim), np.float32)
    fastpe.add_sinusoidal(one, offset=5, num_threads=1)
    many = np.zeros((3, 300, dim), np.float32)
    fastpe.add_sinusoidal(many, offset=5, num_threads=1)
    assert_bytes_equal(one[0], table, "one sequence")
    for b in range(3):
        assert_bytes_equal(many[b], table, f"batch row {b}")


def _isa_results(isa_runs):
    ran = {k: v for k, v in isa_runs.items() if not isinstance(v, str)}
    if not ran:
        pytest.skip("no FASTPE_ISA variant could run")
    return ran


def _storage(name: str) -> np.dtype:
    return {"float16": F16, "float32": F32, "float64": F64, "bfloat16": BF16}[name]


def test_isa_variants_bit_identical_across_threads(isa_runs):
    """In each FASTPE_ISA subprocess, num_threads 1 and 2 gave the same bits."""
    for isa, (_, res) in _isa_results(isa_runs).items():
        for key in res:
            if key.endswith("-t1"):
                assert np.array_equal(res[key], res[key[:-1] + "2"]), f"{isa}: {key} vs t2"


def test_avx512_gives_the_avx2_variants_bits(isa_runs):
    """kernels_avx512 does avx2's arithmetic (fused multiply-adds, one rounding of each
    half-precision result) in wider vectors, with masked row ends: the same bits, every
    dtype, layout and thread count of the fixed set."""
    ran = _isa_results(isa_runs)
    if not {"avx2", "avx512"} <= set(ran):
        pytest.skip(f"only {list(ran)} runs here ({isa_runs})")
    avx2, avx512 = ran["avx2"][1], ran["avx512"][1]
    assert avx2.keys() == avx512.keys()
    for key in avx2:
        assert np.array_equal(avx2[key], avx512[key]), f"avx512 vs avx2: {key}"


def test_isa_variants_agree_within_tolerance(isa_runs):
    ran = _isa_results(isa_runs)
    if len(ran) < 2:
        pytest.skip(f"only {list(ran)} runs here ({isa_runs})")
    (first, (_, base)), *others = ran.items()
    for isa, (_, res) in others:
        assert res.keys() == base.keys()
        for key in base:
            dt = _storage(key.split("-")[1])
            assert_close(res[key].view(dt), base[key].view(dt), dt, magnitude=4.0,
                         max_position=2**20, context=f"FASTPE_ISA={isa} vs {first}: {key}")


# ---- views: writes land in the base array, and nowhere else ------------------------------

@pytest.mark.parametrize("base_kind", ["contiguous", "byteswapped", "unaligned"])
@pytest.mark.parametrize("view", list(VIEWS_3D))
def test_write_into_view_lands_in_base(view, base_kind):
    base = make_awkward(base_kind, (4, 80, 14), F32)
    expected = as_f64(base)
    v = base[VIEWS_3D[view]]
    assert v.base is not None
    x0 = as_f64(v)
    fastpe.add_sinusoidal(v, offset=2, scale=0.5)
    seq, dim = v.shape[1:]
    expected[VIEWS_3D[view]] = x0 * 0.5 + pe_exact(2 + np.arange(seq), dim)
    assert_close(base, expected, F32, magnitude=2.0,
                 context=f"add_sinusoidal into {view} view of {base_kind} {describe(base)}")


@pytest.mark.parametrize("base_kind", ["contiguous", "byteswapped", "unaligned"])
def test_table_out_view_lands_in_base(base_kind):
    base = make_awkward(base_kind, (50, 20), F64)
    expected = as_f64(base)
    out = base[45:4:-2, 1:-1:2]
    fastpe.sinusoidal_table(*out.shape, dtype=None, out=out)
    expected[45:4:-2, 1:-1:2] = pe_exact(np.arange(out.shape[0]), out.shape[1])
    assert_close(base, expected, F64, context=f"sinusoidal_table(out=view of {base_kind})")


SENTINEL = 1000.0  # exact in every float dtype, and never a value of PE or x * 0.5 + PE here


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("view", list(VIEWS_3D))
@pytest.mark.parametrize("op", ["add_sinusoidal", "sinusoidal_table"])
def test_no_writes_outside_the_view(op, view, dtype, both_threads):
    big = np.full((5, 90, 16), SENTINEL, dtype)
    if op == "sinusoidal_table":
        index = VIEWS_3D[view][1:]
        big = big[2]  # a 2-D buffer
    else:
        index = VIEWS_3D[view]
    before = big.copy()
    inside = np.zeros(big.shape, bool)
    inside[index] = True
    v = big[index]
    if op == "add_sinusoidal":
        fastpe.add_sinusoidal(v, offset=1, scale=0.5, num_threads=both_threads)
    else:
        fastpe.sinusoidal_table(*v.shape, offset=1, dtype=None, out=v,
                                num_threads=both_threads)
    ctx = f"{op} on {view} view {describe(v)}, num_threads={both_threads}"
    assert_bytes_equal(big[~inside], before[~inside], ctx + ": outside the view")
    assert not np.any(as_f64(big[inside]) == SENTINEL), ctx + ": an element was not written"


def test_empty_positions_list():
    """[] is float64 to NumPy, but an empty list of positions is a valid empty sequence."""
    x = np.zeros((2, 0, 4), np.float32)
    assert fastpe.add_sinusoidal(x, positions=[]) is x
    assert fastpe.rope_cos_sin([], fastpe.rope_frequencies(8))[0].shape == (0, 4)


# -- the fairseq / Hugging Face form ---------------------------------------------------------

def fairseq_exact(positions, dim, *, base=10000.0, cos_first=False):
    """fairseq's table written out: w_j = base^(-j / (half - 1)), [sin | cos] or
    [cos | sin] halves, an odd dim's last column zero."""
    half = dim // 2
    angles = np.asarray(positions, np.float64)[..., None] * base ** (-np.arange(half) / (half - 1))
    halves = [np.cos(angles), np.sin(angles)] if cos_first else [np.sin(angles), np.cos(angles)]
    tail = np.zeros(angles.shape[:-1] + (dim - 2 * half,))
    return np.concatenate(halves + [tail], axis=-1)


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
@pytest.mark.parametrize("layout", ["split", "split_cos"])
@pytest.mark.parametrize("dim", [4, 9, 64, 65])
@pytest.mark.parametrize("padding_idx, offset", [(None, 0), (1, 0), (0, 3000)])
def test_fairseq_table_matches_formula(backend, layout, dim, padding_idx, offset):
    shift = 0 if padding_idx is None else padding_idx + 1
    with fastpe.use_backend(backend):
        table = fastpe.sinusoidal_table(40, dim, offset=offset, layout=layout, dtype="float64",
                                        frequencies="fairseq", padding_idx=padding_idx)
    want = fairseq_exact(offset + shift + np.arange(40), dim, cos_first=layout == "split_cos")
    assert_close(table, want, F64, max_position=offset + 40 + shift)


@pytest.mark.parametrize("backend", [pytest.param("cython", marks=needs_compiled), "numpy"])
@pytest.mark.parametrize("dim", [4, 64, 2 * 4096 + 16])
@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_split_cos_puts_the_cosines_first(backend, dim, dtype):
    # Vaswani frequencies in MusicGen's [cos | sin] order: the table, the add on one and
    # on several batch rows, and rows wider than one block of frequencies (4096)
    positions = 7 + np.arange(5)
    exact = pe_exact(positions, dim, layout="split")
    want = np.concatenate([exact[:, dim // 2:], exact[:, :dim // 2]], axis=-1)
    with fastpe.use_backend(backend):
        table = fastpe.sinusoidal_table(5, dim, offset=7, layout="split_cos", dtype=dtype)
        x1 = np.full((1, 5, dim), 0.5, dtype)
        fastpe.add_sinusoidal(x1, offset=7, layout="split_cos", scale=2.0)
        x3 = np.full((3, 5, dim), 0.5, dtype)
        fastpe.add_sinusoidal(x3, positions, layout="split_cos", scale=2.0)
    assert_close(table, want, dtype, max_position=11, context="table")
    assert_close(x1, 1.0 + want[None], dtype, magnitude=2.0, max_position=11, context="add")
    assert_close(x3, 1.0 + np.broadcast_to(want, (3, 5, dim)), dtype, magnitude=2.0,
                 max_position=11, context="batched add")


def test_fairseq_interleaved_pairs_the_same_frequencies():
    split = fastpe.sinusoidal_table(9, 11, frequencies="fairseq", layout="split", dtype="float64")
    inter = fastpe.sinusoidal_table(9, 11, frequencies="fairseq", dtype="float64")
    np.testing.assert_array_equal(inter[:, 0:10:2], split[:, :5])
    np.testing.assert_array_equal(inter[:, 1:10:2], split[:, 5:10])
    np.testing.assert_array_equal(inter[:, 10], 0.0)


@pytest.mark.parametrize("layout", ["interleaved", "split", "split_cos"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fairseq_add_in_every_dtype_on_a_strided_view(dtype, layout):
    # per-sequence positions, an odd dim (the zero column is scaled, not added to)
    base = np.full((2, 6, 19), 0.25).astype(dtype)
    x = base[:, :, ::2]                                   # (2, 6, 10), strided
    x = x[..., :9]
    positions = np.array([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    fastpe.add_sinusoidal(x, positions, scale=2.0, layout=layout, frequencies="fairseq",
                          padding_idx=1)
    want = 0.5 + fairseq_exact(positions + 2, 9, cos_first=layout == "split_cos")
    if layout == "interleaved":
        order = np.empty(8, int)
        order[0::2], order[1::2] = np.arange(4), np.arange(4, 8)
        want = np.concatenate([want[..., order], want[..., 8:]], axis=-1)
    assert_close(x, want, dtype, magnitude=1.5)
    assert_bytes_equal(base[:, :, 1::2], np.full((2, 6, 9), 0.25).astype(dtype))


@pytest.mark.parametrize("kwargs, exception, pattern", [
    (dict(frequencies="tensor2tensor"), ValueError, r"frequencies"),
    (dict(frequencies="fairseq", dim=3), ValueError, r"fairseq.*dim >= 4"),
    (dict(layout="split_cos", dim=9), ValueError, r"split_cos.*odd dim.*fairseq"),
    (dict(frequencies="fairseq", padding_idx=-1), ValueError, r"padding_idx"),
    (dict(frequencies="fairseq", padding_idx=True), TypeError, r"padding_idx"),
    (dict(padding_idx=2**63 - 2, offset=5), ValueError, r"overflows"),
])
def test_new_sinusoidal_arguments_are_checked_before_writing(kwargs, exception, pattern):
    kwargs = dict(kwargs)
    dim = kwargs.pop("dim", 8)
    out = np.full((4, dim), 7.0, np.float32)
    x = np.full((4, dim), 7.0, np.float32)
    with pytest.raises(exception, match=pattern):
        fastpe.sinusoidal_table(4, dim, out=out, **kwargs)
    kwargs.pop("offset", None)
    with pytest.raises(exception, match=pattern):
        fastpe.add_sinusoidal(x, np.full(4, 2**63 - 2) if "overflows" in pattern else None,
                              **kwargs)
    assert (out == 7.0).all() and (x == 7.0).all()


# ---- the compiled fast path --------------------------------------------------------------


@needs_compiled
def test_fast_path_declines_without_writing():
    """The C fast path returns False (nothing written) for whatever is not the plain case;
    the public call then takes the general path, which adds or raises as it always has."""
    kern = fastpe._backend.compiled
    w6 = fastpe._math.sinusoidal_inv_freq(6, 10000.0)
    read_only = np.zeros((4, 6), np.float32)
    read_only.flags.writeable = False
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(12, np.float32), (4, 6), (4, 4),
                                                  writeable=True)
    cases = {
        "byte-swapped x": (np.zeros((4, 6), ">f4"), w6, 0, 1.0, None),
        "1-D x": (np.zeros(6, np.float32), w6, 0, 1.0, ValueError),
        "4-D x": (np.zeros((1, 1, 4, 6), np.float32), w6, 0, 1.0, ValueError),
        "read-only x": (read_only, w6, 0, 1.0, TypeError),
        "self-overlapping x": (overlapping, w6, 0, 1.0, ValueError),
        "frequencies of another width": (np.zeros((4, 8), np.float32), w6, 0, 1.0, None),
        "float32 frequencies": (np.zeros((4, 6), np.float32), w6.astype(np.float32), 0, 1.0,
                                None),
        "negative offset": (np.zeros((4, 6), np.float32), w6, -1, 1.0, ValueError),
        "position 2**32": (np.zeros((4, 6), np.float32), w6, 2**32 - 3, 1.0, ValueError),
        "bool offset": (np.zeros((4, 6), np.float32), w6, True, 1.0, TypeError),
        "numpy offset": (np.zeros((4, 6), np.float32), w6, np.int64(3), 1.0, None),
        "infinite scale": (np.zeros((4, 6), np.float32), w6, 0, math.inf, ValueError),
    }
    for name, (x, w, offset, scale, error) in cases.items():
        before = snapshot(x)
        assert kern.sinusoidal_call(x, w, None, offset, scale, False, False, True, 1) is False, name
        assert snapshot(x) == before, name
        if error is None:
            continue
        with pytest.raises(error):
            fastpe.add_sinusoidal(x, offset=offset, scale=scale)
        assert snapshot(x) == before, name


@needs_compiled
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_fast_path_gives_the_general_paths_bits(dtype):
    """Plain calls (the README's np.sqrt(d) scale, the last positions below 2**32, 2-D and
    3-D, strided and transposed x, position arrays of any integer dtype) are taken by the
    compiled entry from the caller's objects, with the bits of the validating path's
    call (normalised arguments: int64 copies of the positions, a float scale)."""
    kern = fastpe._backend.compiled
    real = kern.sinusoidal_call
    taken = []

    def spy(*args):
        taken.append(real(*args))
        return taken[-1]

    base = awkward_values((3, 40, 24), dtype, seed=9)
    # a first call registers ml_dtypes' bfloat16 with the kernels (until then the fast
    # path declines it: the general path does that)
    fastpe.add_sinusoidal(base.copy())
    for name, view, kw in [
        ("3-D, sqrt(d) scale", lambda b: b, {"scale": np.sqrt(24)}),
        ("2-D, last positions", lambda b: b[0], {"offset": 2**32 - 40}),
        ("strided", lambda b: b[:, ::2, 1:21], {"base": 500.0, "scale": -2.0}),
        ("transposed", lambda b: b.transpose(0, 2, 1)[:, :, :24], {"offset": 7}),
        ("positions per row", lambda b: b,
         {"positions": (np.arange(120).reshape(3, 40) * 7919 % 4099).astype(np.int32)}),
        ("shared positions, the last below 2**32", lambda b: b[:, :5],
         {"positions": np.array([2**32 - 1, 0, 2**31, 12345, 2**32 - 2], np.uint64)}),
    ]:
        fast, general = base.copy(), base.copy()
        with fastpe.use_backend("cython"):
            kern.sinusoidal_call = spy
            try:
                fastpe.add_sinusoidal(view(fast), **kw)
            finally:
                kern.sinusoidal_call = real
            assert taken.pop() is True, name
            # declined from add_sinusoidal itself: the validating path's own call runs
            kern.sinusoidal_call = lambda *args: (
                sys._getframe(1).f_code.co_name == "_run" and real(*args))
            try:
                fastpe.add_sinusoidal(view(general), **kw)
            finally:
                kern.sinusoidal_call = real
        assert_bytes_equal(fast, general, name)


@needs_compiled
def test_fast_path_declines_positions_it_cannot_prove():
    """Position arrays out of range, in x's own memory, byte-swapped or beside an offset
    are declined with x untouched; add_sinusoidal then raises the general path's error
    or adds as it does."""
    kern = fastpe._backend.compiled
    x0 = awkward_values((2, 6, 16), F32, seed=3)
    w = fastpe._math.sinusoidal_inv_freq(16, 10000.0)
    pos = np.arange(12).reshape(2, 6)
    buf = np.zeros(2 * 6 * 16 + 12, np.float32)
    inside = buf[:2 * 6 * 16].reshape(2, 6, 16)
    for name, x, positions, offset, error in [
        ("negative", x0.copy(), -pos, 0, ValueError),
        ("at 2**32", x0.copy(), pos + 2**32 - 6, 0, ValueError),
        ("in x's memory", inside, buf.view(np.uint8)[:96].view(np.int64).reshape(2, 6), 0,
         ValueError),
        ("with an offset", x0.copy(), pos, 1, ValueError),
        ("byte-swapped", x0.copy(), pos.astype(">i8"), 0, None),
    ]:
        before = x.copy()
        assert kern.sinusoidal_call(x, w, positions, offset, 1.0, False, False, True, 1) is False, name
        assert_bytes_equal(x, before, name)
        if error is not None:
            with pytest.raises(error, match=r"positions|offset"):
                fastpe.add_sinusoidal(x, positions, offset=offset)
            assert_bytes_equal(x, before, name)
        else:
            want = x.copy()
            fastpe.reference.add_sinusoidal(want, positions)
            fastpe.add_sinusoidal(x, positions)
            assert_close(x, want, np.dtype(np.float32), magnitude=4.0, context=name)
