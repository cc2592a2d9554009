"""ALiBi: slopes against the paper's rule and BLOOM's and MPT's formulas (n = 1..256),
the bias index by index, add_alibi against fastpe.reference for every option, dtype,
layout and thread count, BLOOM's softmax equivalence, padded batches against an explicit
loop, and the bad-input matrix (right exception, argument named, scores untouched)."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from conftest import (
    BF16,
    DTYPE_IDS,
    F32,
    F64,
    FLOAT_DTYPES,
    as_f64,
    assert_bytes_equal,
    assert_close,
    awkward_params,
    awkward_values,
    describe,
    entry_callers,
    is_bf16,
    make_awkward,
    needs_compiled,
    snapshot,
)

import fastpe

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - optional dependency
    ml_dtypes = None

HEAD_COUNTS = range(1, 257)


# ---- slopes: independent float64 evaluations ---------------------------------------------


def paper_rule(n: int, max_bias: float = 8.0) -> np.ndarray:
    """The rule as the paper states it, evaluated directly: p = the largest power of two
    <= n; slopes 2^(-max_bias * h / p) for h = 1..p, then 2^(-max_bias * h / (2p)) for the
    odd h = 1, 3, 5, ... until there are n."""
    p = 2 ** math.floor(math.log2(n))
    out = [2.0 ** (-max_bias * h / p) for h in range(1, p + 1)]
    out += [2.0 ** (-max_bias * h / (2 * p)) for h in range(1, 2 * (n - p), 2)]
    return np.array(out)


def paper_code_recursion(n: int) -> list[float]:
    """The paper's published construction (max_bias 8), re-expressed: a power of two n
    starts at 2^(-8/n) and multiplies by the same ratio; any other n takes the slopes of
    the closest lower power of two, then every other slope (0::2) of twice that power."""
    if n & (n - 1) == 0:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    p = 2 ** math.floor(math.log2(n))
    return paper_code_recursion(p) + paper_code_recursion(2 * p)[0::2][: n - p]


def bloom_slopes(n: int, dtype=np.float64) -> np.ndarray:
    """BLOOM's build_alibi_tensor slopes, re-expressed from its math: base^k for k = 1..p
    with base = 2^(-2^-(log2 p - 3)); then extra_base^k for odd k < 2 (n - p) with
    extra_base for 2p. BLOOM evaluates the powers in float32 (dtype)."""
    p = 2 ** math.floor(math.log2(n))
    base = dtype(2.0 ** (-(2.0 ** -(math.log2(p) - 3))))
    slopes = np.power(base, np.arange(1, p + 1).astype(dtype))
    if p != n:
        extra = dtype(2.0 ** (-(2.0 ** -(math.log2(2 * p) - 3))))
        k = min(p, n - p)
        slopes = np.concatenate([slopes, np.power(extra, np.arange(1, 2 * k, 2).astype(dtype))])
    return slopes


def mpt_slopes(n: int, alibi_bias_max: float = 8.0, dtype=np.float64) -> np.ndarray:
    """MPT's gen_slopes, re-expressed: N = 2^ceil(log2 n); m = (1..N) * alibi_bias_max / N;
    slopes 1 / 2^m; when N != n, the odd-indexed slopes then the even-indexed ones,
    truncated to n. MPT evaluates in float32 (dtype)."""
    big = 2 ** math.ceil(math.log2(n))
    m = np.arange(1, big + 1).astype(dtype) * dtype(alibi_bias_max / big)
    slopes = dtype(1.0) / np.power(dtype(2.0), m)
    if big != n:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:n]
    return slopes


def within_ulps(actual: np.ndarray, expected: np.ndarray, ulps: float) -> bool:
    return bool(np.all(np.abs(actual - expected) <= ulps * np.spacing(np.abs(expected))))


def test_slopes_equal_the_paper_rule_for_1_to_256():
    for n in HEAD_COUNTS:
        got = fastpe.alibi_slopes(n)
        assert got.dtype == F64 and got.shape == (n,)
        # both are 2 ** (an exactly represented exponent): at most one rounding apart
        want = paper_rule(n)
        assert within_ulps(got, want, 1), f"n={n}: {got} vs {want}"


def test_slopes_equal_the_paper_code_bloom_and_mpt_for_1_to_256():
    for n in HEAD_COUNTS:
        got = fastpe.alibi_slopes(n)
        # float64 re-evaluations: a repeated product / power, a few ulp off the exact value
        for name, want in (("paper code", np.array(paper_code_recursion(n))),
                           ("BLOOM", bloom_slopes(n)), ("MPT", mpt_slopes(n))):
            assert np.allclose(got, want, rtol=1e-13, atol=0), f"{name}, n={n}"
        # as BLOOM and MPT compute them, in float32: MPT's 1 / 2^m is within two float32
        # ulps of ours; BLOOM raises a rounded float32 base to the k-th power, which
        # multiplies the base's rounding error by k (up to k / 2 ulps: ~100 at 256 heads)
        got32 = got.astype(np.float32)
        assert within_ulps(mpt_slopes(n, dtype=np.float32), got32, 2), f"MPT float32, n={n}"
        p = 2 ** math.floor(math.log2(n))
        k = np.concatenate([np.arange(1, p + 1), np.arange(1, 2 * (n - p), 2)])
        bloom32 = bloom_slopes(n, np.float32).astype(np.float64)
        assert np.all(np.abs(bloom32 - got) <= (k / 2 + 1) * 2.0**-23 * got), f"BLOOM, n={n}"


def test_bloom_and_mpt_order_non_power_of_two_heads_alike():
    """MPT's [odd-indexed, even-indexed] of 2^ceil(log2 n) is BLOOM's [p slopes, every other
    of 2p]: the odd-indexed slopes of 2p heads are exactly the p-head sequence."""
    for n in HEAD_COUNTS:
        assert np.allclose(bloom_slopes(n), mpt_slopes(n), rtol=1e-13, atol=0), n


@pytest.mark.parametrize("max_bias", [1.0, 4.0, 6.5, 8.0, 12.0, 16.0])
def test_max_bias_is_mpts_alibi_bias_max(max_bias):
    for n in HEAD_COUNTS:
        got = fastpe.alibi_slopes(n, max_bias=max_bias)
        assert within_ulps(got, paper_rule(n, max_bias), 1), n
        assert np.allclose(got, mpt_slopes(n, max_bias), rtol=1e-13, atol=0), n


def test_known_slopes():
    assert np.array_equal(fastpe.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    assert np.array_equal(fastpe.alibi_slopes(1), [2.0**-8])
    assert np.array_equal(fastpe.alibi_slopes(2), [2.0**-4, 2.0**-8])
    assert np.array_equal(fastpe.alibi_slopes(16)[:2], [2.0**-0.5, 2.0**-1])
    # 12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert within_ulps(fastpe.alibi_slopes(12),
                       np.concatenate([2.0 ** -np.arange(1, 9),
                                       2.0 ** -(np.arange(4) + 0.5)]), 1)


def test_slopes_are_a_fresh_writable_copy():
    a = fastpe.alibi_slopes(6)
    a[:] = 0
    assert np.all(fastpe.alibi_slopes(6) > 0)
    assert fastpe.reference.alibi_slopes is fastpe.alibi_slopes


# ---- the bias, index by index -------------------------------------------------------------


def bias_loop(slopes, q_len, k_len, q_offset, causal=False, symmetric=False) -> np.ndarray:
    """float64 -slope_h * (q_offset + i - j) by explicit loops; -inf where j > q_offset + i."""
    out = np.empty((len(slopes), q_len, k_len))
    for h, s in enumerate(slopes):
        for i in range(q_len):
            for j in range(k_len):
                d = q_offset + i - j
                if causal and d < 0:
                    out[h, i, j] = -math.inf
                else:
                    out[h, i, j] = -float(s) * (abs(d) if symmetric else d)
    return out


def rounded_bias(slopes, dist, dtype) -> np.ndarray:
    """What fastpe stores: the slope in the compute type times the distance converted to
    it, one rounding of that product (float64 for float64 storage, float32 otherwise),
    then the storage type. The distance itself is exact below 2**24 (2**53)."""
    work = np.float64 if np.dtype(dtype) == F64 else np.float32
    with np.errstate(over="ignore"):  # past float16's range: -inf, as fastpe stores it
        return (np.asarray(slopes, work)[:, None, None]
                * np.asarray(dist).astype(work)).astype(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("heads,q_len,k_len,q_offset", [
    (8, 7, 7, None), (12, 5, 9, None), (3, 1, 33, None), (5, 6, 4, 0), (4, 3, 10, 2),
    (2, 4, 6, 40)])
@pytest.mark.parametrize("mode", ["plain", "causal", "symmetric"])
def test_bias_matches_the_formula_index_by_index(dtype, heads, q_len, k_len, q_offset, mode):
    causal, symmetric = mode == "causal", mode == "symmetric"
    got = fastpe.alibi_bias(heads, q_len, k_len, q_offset=q_offset, causal=causal,
                            symmetric=symmetric, dtype=dtype)
    assert got.shape == (heads, q_len, k_len) and got.dtype == dtype
    off = k_len - q_len if q_offset is None else q_offset
    slopes = fastpe.alibi_slopes(heads)
    exact = bias_loop(slopes, q_len, k_len, off, causal, symmetric)
    ctx = f"alibi_bias({heads}, {q_len}, {k_len}, q_offset={q_offset}, {mode}, {dtype})"
    # within one rounding of the slope to the compute type, one of the product and one to
    # the storage type of the exact value
    rtol = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10,
            "bfloat16": 2.0**-7}[str(np.dtype(dtype))]
    g = as_f64(got)
    assert np.array_equal(np.isneginf(g), np.isneginf(exact)), ctx
    fin = np.isfinite(exact)
    assert_close(g[fin], exact[fin], dtype, atol=0.0, rtol=rtol, context=ctx)
    # and bit for bit the documented arithmetic
    later = np.arange(k_len)[None, :] > off + np.arange(q_len)[:, None]
    dist = np.arange(k_len)[None, :] - (off + np.arange(q_len))[:, None]
    if symmetric:
        dist = -np.abs(dist)
    want = rounded_bias(slopes, dist[None], dtype)
    if causal:
        want[:, later] = -np.inf
    assert np.array_equal(as_f64(got), as_f64(want)), ctx


def test_default_q_offset_puts_the_queries_last():
    b = fastpe.alibi_bias(4, 3, 10, dtype="float64")
    assert np.array_equal(b, fastpe.alibi_bias(4, 3, 10, q_offset=7, dtype="float64"))
    assert np.all(b[:, np.arange(3), 7 + np.arange(3)] == 0)  # the diagonal of the newest keys


def test_bias_diagonal_is_positive_zero():
    b = fastpe.alibi_bias(4, 5, 5, dtype="float64")
    assert not np.signbit(np.diagonal(b, axis1=1, axis2=2)).any()


def test_alibi_bias_out_and_dtype():
    out = np.full((3, 4, 6), 7.0, np.float64)
    ret = fastpe.alibi_bias(3, 4, 6, out=out, dtype=None)
    assert ret is out
    assert np.array_equal(out, fastpe.alibi_bias(3, 4, 6, dtype="float64"))
    assert fastpe.alibi_bias(1, 1, 1).dtype == F32
    # a strided out lands in its base
    base = np.full((3, 4, 13), 7.0, np.float32)
    fastpe.alibi_bias(3, 4, 6, out=base[:, :, 1::2], causal=True)
    assert np.array_equal(base[:, :, 1::2], fastpe.alibi_bias(3, 4, 6, causal=True))
    assert np.all(base[:, :, 0::2] == 7.0)


@pytest.mark.parametrize("dtype", [F32, F64, np.dtype(np.float16)]
                         + ([BF16] if BF16 is not None else []),
                         ids=["f32", "f64", "f16", "bf16"][:3 + (BF16 is not None)])
@pytest.mark.parametrize("mode", ["plain", "causal", "symmetric"])
@pytest.mark.parametrize("shift", [0, 1, 3, 8])
@pytest.mark.parametrize("heads_aligned", [True, False], ids=["heads-aligned", "odd-rows"])
def test_large_tables_written_past_the_caches_are_the_reference(dtype, mode, shift,
                                                               heads_aligned, both_threads,
                                                               bf16_narrowing):
    """A table past 8 MiB is written with non-temporal stores from the first 64-byte
    aligned element of its rows (four float32/float64 heads' rows together where a
    head's size is a multiple of 64 bytes, else row by row; the fifth head's row alone):
    the same bits as the reference at every alignment of `out`, and nothing written
    outside it."""
    itemsize = np.dtype(dtype).itemsize
    if heads_aligned:
        heads, q, k = 5, 1024 // itemsize, 2048
    else:
        heads, q, k = 5, 301, {8: 1001, 4: 1501, 2: 3001}[itemsize]
    n = heads * q * k
    assert n * itemsize > 8 << 20
    buf = np.full(n + shift + 16, 7.0, dtype)
    out = buf[shift:shift + n].reshape(heads, q, k)
    kw = {"causal": mode == "causal", "symmetric": mode == "symmetric"}
    fastpe.alibi_bias(heads, q, k, out=out, num_threads=both_threads, **kw)
    want = fastpe.reference.alibi_bias(heads, q, k, dtype=dtype, **kw)
    assert_bytes_equal(out, want, f"alibi_bias {mode} {np.dtype(dtype)} shift={shift}")
    assert np.all(buf[:shift] == 7.0) and np.all(buf[shift + n:] == 7.0)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["plain", "causal", "symmetric", "padded"])
def test_large_adds_go_row_by_row_as_the_reference(dtype, mode, both_threads):
    """Scores past 8 MiB are added to one head's row at a time (four at once below):
    the same bits as the reference either way."""
    heads, q, k = 4, 600, 1000
    assert heads * q * k * np.dtype(dtype).itemsize > 8 << 20
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((1, heads, q, k)).astype(dtype)
    kw = {"causal": mode in ("causal", "padded"), "symmetric": mode == "symmetric"}
    if mode == "padded":
        kw["key_mask"] = (np.arange(k) >= 37)[None]
    got = fastpe.add_alibi(scores.copy(), num_threads=both_threads, **kw)
    assert_bytes_equal(got, fastpe.reference.add_alibi(scores.copy(), **kw), mode)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_positions_past_2_24_are_exact(dtype):
    """Past 2^24 (float32) or 2^53 (float64) positions are no longer exact in the compute
    type: the kernel switches to an integer loop, whose distances are exact until they
    are converted to the compute type (rounded past 2^24 or 2^53, as the models' own
    float32 arithmetic rounds them); the value is then one rounding of slope * that."""
    for q_offset in (2**24 - 2, 2**24 - 1, 2**24, 2**40, 2**53 - 2, 2**53 - 1, 2**53, 2**62):
        got = fastpe.alibi_bias(3, 2, 5, q_offset=q_offset, dtype=dtype)
        dist = np.arange(5)[None, :] - (q_offset + np.arange(2))[:, None]
        want = rounded_bias(fastpe.alibi_slopes(3), dist[None], dtype)
        assert np.array_equal(as_f64(got), as_f64(want)), (q_offset, dtype)
        ref = fastpe.reference.alibi_bias(3, 2, 5, q_offset=q_offset, dtype=dtype)
        assert_bytes_equal(got, ref, f"q_offset={q_offset}")


# ---- add_alibi against the reference -------------------------------------------------------

# Per-sequence options, each a function of (rng, batch, q_len, k_len) -> kwargs.
OPTIONS = {
    "plain": lambda rng, b, q, k: {},
    "causal": lambda rng, b, q, k: {"causal": True},
    "symmetric": lambda rng, b, q, k: {"symmetric": True},
    "q_offset": lambda rng, b, q, k: {"q_offset": 3, "causal": True},
    "slopes": lambda rng, b, q, k: {},  # option_kwargs draws one slope per head
    "max_bias": lambda rng, b, q, k: {"max_bias": 4.0, "symmetric": True},
    "k_positions": lambda rng, b, q, k: {"k_positions": rng.integers(0, 90, (b, k)),
                                         "causal": True},
    "q_positions": lambda rng, b, q, k: {"q_positions": rng.integers(0, 90, q),
                                         "k_positions": rng.integers(0, 90, (1, k))},
    "sym-positions": lambda rng, b, q, k: {"q_positions": rng.integers(0, 90, (b, q)),
                                           "k_positions": rng.integers(0, 90, k),
                                           "symmetric": True},
    "key_mask": lambda rng, b, q, k: {"key_mask": rng.random((b, k)) < 0.7},
    "mask-causal": lambda rng, b, q, k: {"key_mask": (rng.random((b, k)) < 0.7).astype(int),
                                         "causal": True},
    "big-offset": lambda rng, b, q, k: {"q_offset": 2**33, "causal": True},
    # past 2^24 (2^53 would be for float64: the exact integer loop there only for float32)
    "big-symmetric": lambda rng, b, q, k: {"q_positions": 2**30 + rng.integers(0, 90, (b, q)),
                                           "k_positions": 2**30 + rng.integers(0, 90, k),
                                           "symmetric": True},
    # straddling int32's largest value: key positions convert to float64 from int64
    "past-int32": lambda rng, b, q, k: {"q_positions": 2**31 - 45 + rng.integers(0, 90, (b, q)),
                                        "k_positions": 2**31 - 45 + rng.integers(0, 90, k),
                                        "key_mask": rng.random((b, k)) < 0.7,
                                        "symmetric": True},
    "big-masked": lambda rng, b, q, k: {"q_positions": 2**60 + rng.integers(0, 90, q),
                                        "k_positions": 2**60 + rng.integers(0, 90, (b, k)),
                                        "key_mask": rng.random((b, k)) < 0.7, "causal": True},
}


def option_kwargs(name: str, batch: int, heads: int, q: int, k: int, seed: int = 0) -> dict:
    rng = np.random.default_rng([seed, batch, heads, q, k])
    kw = OPTIONS[name](rng, batch, q, k)
    if name == "slopes":
        kw["slopes"] = rng.uniform(-1, 1, heads)
    return kw


def magnitude(scores_f64: np.ndarray, kw: dict, q: int, k: int) -> float:
    """Size of the operands: max |score| + max |bias| (slopes <= 1, distances <= 90 + k)."""
    finite = scores_f64[np.isfinite(scores_f64)]
    top = float(np.abs(finite).max()) if finite.size else 0.0
    return top + 100.0 + k + q


def assert_same_scores(got, want, dtype, mag, ctx):
    g, w = as_f64(got), as_f64(want)
    assert np.array_equal(np.isneginf(g), np.isneginf(w)), ctx + ": -inf in different places"
    fin = np.isfinite(w)
    assert_close(np.where(fin, g, 0), np.where(fin, w, 0), dtype, magnitude=mag, context=ctx)


SHAPES = [(2, 3, 17, 40)]


def _option_params():
    """Every option on contiguous scores of every dtype; on the awkward memory layouts,
    two options each, rotating, so that every option meets most layouts without the
    full product (the layouts are the same code path whatever the option)."""
    names = list(OPTIONS)
    out = []
    for i, p in enumerate(awkward_params(SHAPES)):
        kind, shape, dtype = p.values
        chosen = names if kind == "contiguous" else [names[(2 * i + j) % len(names)]
                                                     for j in range(2)]
        out += [pytest.param(kind, shape, dtype, name, id=f"{p.id}-{name}", marks=p.marks)
                for name in chosen]
    return out


@pytest.mark.parametrize("kind,shape,dtype,option", _option_params())
def test_matches_reference(kind, shape, dtype, option, both_threads):
    scores = make_awkward(kind, shape, dtype)
    twin = make_awkward(kind, shape, dtype)
    *lead, heads, q, k = scores.shape
    kw = option_kwargs(option, int(np.prod(lead)), heads, q, k)
    ret = fastpe.add_alibi(scores, num_threads=both_threads, **kw)
    assert ret is scores
    fastpe.reference.add_alibi(twin, **kw)
    ctx = f"add_alibi({describe(scores)}, {option}, num_threads={both_threads})"
    assert_same_scores(scores, twin, dtype, magnitude(as_f64(twin), kw, q, k), ctx)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ["bhqk", "transposed-qk", "head-major", "strided-keys",
                                    "5d", "3d"])
@pytest.mark.parametrize("option", ["plain", "causal", "symmetric", "key_mask",
                                    "k_positions", "big-offset", "big-symmetric"])
def test_layouts_match_reference(dtype, layout, option, both_threads):
    """Scores as views of other memory orders: (b, h, k, q) memory seen as (b, h, q, k)
    (k @ q^T transposed), heads outermost, keys strided, extra leading dims, no batch."""
    b, h, q, k = 2, 4, 33, 70
    values = awkward_values((b, h, q, k), dtype, seed=3)
    if layout == "bhqk":
        scores = values.copy()
    elif layout == "transposed-qk":
        scores = np.ascontiguousarray(values.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    elif layout == "head-major":
        scores = np.ascontiguousarray(values.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    elif layout == "strided-keys":
        big = np.zeros((b, h, q, 3 * k), dtype)
        scores = big[..., ::3]
        scores[...] = values
    elif layout == "5d":
        scores = values.reshape(2, 1, h, q, k)[:, :, ::-1].copy()
    else:
        scores = values[0].copy()
    twin = scores.copy()
    *lead, heads, q, k = scores.shape
    kw = option_kwargs(option, int(np.prod(lead)), heads, q, k, seed=5)
    fastpe.add_alibi(scores, num_threads=both_threads, **kw)
    fastpe.reference.add_alibi(twin, **kw)
    ctx = f"add_alibi({layout}: {describe(scores)}, {option}, num_threads={both_threads})"
    assert_same_scores(scores, twin, dtype, magnitude(as_f64(twin), kw, q, k), ctx)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", ["plain", "causal", "symmetric", "key_mask",
                                    "sym-positions", "big-offset", "big-symmetric",
                                    "big-masked"])
def test_alibi_bias_matches_reference(dtype, option, both_threads):
    kw = option_kwargs(option, 1, 5, 40, 50)
    for key in ("k_positions", "q_positions", "key_mask"):
        if key in kw and np.ndim(kw[key]) == 2:
            kw[key] = kw[key][:1]
    got = fastpe.alibi_bias(5, 40, 50, dtype=dtype, num_threads=both_threads, **kw)
    want = fastpe.reference.alibi_bias(5, 40, 50, dtype=dtype, **kw)
    # no addition: the same single rounding on both sides
    assert_bytes_equal(got, want, f"alibi_bias {option} {dtype}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", ["plain", "causal", "symmetric", "key_mask", "mask-causal",
                                    "sym-positions", "big-offset", "big-masked"])
def test_bit_identical_across_threads(dtype, option, threaded):
    scores = awkward_values((3, 4, 37, 64), dtype, seed=7)
    kw = option_kwargs(option, 3, 4, 37, 64)
    one = fastpe.add_alibi(scores.copy(), num_threads=1, **kw)
    for n in (2, 3, 7):
        many = fastpe.add_alibi(scores.copy(), num_threads=n, **kw)
        assert_bytes_equal(many, one, f"add_alibi {option} {dtype} num_threads={n}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal,symmetric", [(False, False), (True, False), (False, True)])
def test_explicit_default_positions_give_the_same_bits(dtype, causal, symmetric):
    """The plain loops (key j at position j, rows split at the query) and the general
    ones (arbitrary positions, selected) compute the same value."""
    b, h, q, k = 2, 3, 21, 45
    scores = awkward_values((b, h, q, k), dtype, seed=11)
    plain = fastpe.add_alibi(scores.copy(), causal=causal, symmetric=symmetric)
    general = fastpe.add_alibi(scores.copy(), causal=causal, symmetric=symmetric,
                               q_positions=k - q + np.arange(q), k_positions=np.arange(k))
    masked = fastpe.add_alibi(scores.copy(), causal=causal, symmetric=symmetric,
                              q_positions=k - q + np.arange(q), key_mask=np.ones(k, bool))
    explicit_slopes = fastpe.add_alibi(scores.copy(), causal=causal, symmetric=symmetric,
                                       slopes=fastpe.alibi_slopes(h))
    for name, other in (("positions", general), ("mask", masked),
                        ("slopes", explicit_slopes)):
        assert_bytes_equal(other, plain, f"{name} vs default, {dtype} causal={causal} "
                                         f"symmetric={symmetric}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_add_equals_scores_plus_bias_table(dtype):
    """add_alibi(scores) == scores + alibi_bias(...), in the compute type, rounded once."""
    scores = awkward_values((2, 6, 9, 30), dtype, seed=2)
    bias = fastpe.alibi_bias(6, 9, 30, causal=True, dtype=F64 if dtype == F64 else F32)
    work = np.float64 if dtype == F64 else np.float32
    want = (scores.astype(work) + bias).astype(dtype)
    got = fastpe.add_alibi(scores.copy(), causal=True)
    assert_same_scores(got, want, dtype, 40.0, f"add_alibi vs scores + bias ({dtype})")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("shape", [(0, 4, 5, 6), (2, 0, 5, 6), (2, 4, 0, 6), (2, 4, 5, 0),
                                   (0, 3, 3), (3, 0, 2, 4, 4)])
def test_empty_scores_are_a_no_op(shape, backend):
    if backend == "cython" and not fastpe.info()["compiled"]:
        pytest.skip("the compiled extension is not built")
    scores = np.zeros(shape, np.float32)
    with fastpe.use_backend(backend):
        assert fastpe.add_alibi(scores, causal=True) is scores
        assert fastpe.add_alibi(scores, key_mask=np.ones(shape[-1], bool)) is scores
        assert fastpe.alibi_bias(*shape[-3:], q_offset=0).shape == shape[-3:]
        fastpe.alibi_bias(*shape[-3:], q_offset=0, out=np.zeros(shape[-3:]))


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_empty_scores_of_any_head_count_make_no_slopes(backend):
    """An empty result needs no slopes: 2**40 heads of no queries are an empty table,
    not 8 TiB of default slopes made first (a MemoryError); given slopes are still
    checked against the heads."""
    if backend == "cython" and not fastpe.info()["compiled"]:
        pytest.skip("the compiled extension is not built")
    heads = 2**40
    with fastpe.use_backend(backend):
        assert fastpe.alibi_bias(heads, 0, 4).shape == (heads, 0, 4)
        assert fastpe.alibi_bias(heads, 3, 0, max_bias=4).shape == (heads, 3, 0)
        assert fastpe.add_alibi(np.empty((2, heads, 0, 4), np.float32), causal=True).shape \
            == (2, heads, 0, 4)
        with pytest.raises(ValueError, match=r"^slopes must have shape \(3,\)"):
            fastpe.add_alibi(np.empty((3, 0, 4), np.float32), slopes=[1.0, 2.0])


def test_numpy_backend_is_the_reference():
    scores = awkward_values((2, 4, 8, 16), F32)
    a, b = scores.copy(), scores.copy()
    with fastpe.use_backend("numpy"):
        fastpe.add_alibi(a, causal=True, key_mask=np.arange(16) > 2)
    fastpe.reference.add_alibi(b, causal=True, key_mask=np.arange(16) > 2)
    assert_bytes_equal(a, b, "numpy backend")


# ---- the softmax property: BLOOM's key-position form ----------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    """Row softmax; a row masked entirely (-inf everywhere) gives NaN."""
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("q_len,k_len", [(16, 16), (5, 16), (1, 40)])
@pytest.mark.parametrize("heads", [8, 12])
def test_softmax_equals_blooms_key_position_form(heads, q_len, k_len):
    """softmax(scores + causal ALiBi) == softmax(scores + slope * key_position + causal mask):
    the two differ by slope * q_pos, a constant per row."""
    rng = np.random.default_rng(heads * q_len)
    scores = rng.standard_normal((2, heads, q_len, k_len))
    slopes = fastpe.alibi_slopes(heads)
    ours = fastpe.add_alibi(scores.copy(), causal=True)
    bloom = scores + slopes[:, None, None] * np.arange(k_len)
    q_pos = k_len - q_len + np.arange(q_len)
    bloom = np.where(np.arange(k_len)[None, :] > q_pos[:, None], -np.inf, bloom)
    assert np.allclose(softmax(ours), softmax(bloom), rtol=1e-12, atol=1e-15)
    # and in float32, within float32 rounding
    ours32 = fastpe.add_alibi(scores.astype(np.float32), causal=True)
    assert np.allclose(softmax(ours32.astype(np.float64)), softmax(bloom), rtol=1e-4,
                       atol=1e-6)


def test_softmax_equals_blooms_left_padded_batch():
    """A left-padded batch with key_mask: BLOOM's (cumsum(mask) - 1) * mask positions,
    its causal and padding masks, against ours, on every real query row."""
    heads, k_len = 4, 12
    mask = np.ones((3, k_len), bool)
    mask[1, :3] = False
    mask[2, :7] = False
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, heads, k_len, k_len))
    slopes = fastpe.alibi_slopes(heads)
    ours = fastpe.add_alibi(scores.copy(), causal=True, key_mask=mask)
    pos = (np.cumsum(mask, axis=1) - 1) * mask
    bloom = scores + slopes[None, :, None, None] * pos[:, None, None, :]
    blocked = (np.arange(k_len)[None, :] > np.arange(k_len)[:, None])[None] | ~mask[:, None, :]
    bloom = np.where(blocked[:, None], -np.inf, bloom)
    real_rows = mask  # query i of sequence b is a real token
    p_ours, p_bloom = softmax(ours), softmax(bloom)
    for b in range(3):
        rows = np.flatnonzero(real_rows[b])
        assert np.allclose(p_ours[b][:, rows], p_bloom[b][:, rows], rtol=1e-12, atol=1e-15), b


# ---- padded and per-sequence batches against an explicit loop ------------------------------


def explicit_loop(scores, slopes, qpos, kpos, mask, causal, symmetric) -> np.ndarray:
    """float64: scores[b, h, i, j] + slope_h * (kpos[b, j] - qpos[b, i]) (or -|.|), -inf
    where mask[b, j] is 0 or (causal) kpos[b, j] > qpos[b, i]; b over the flattened
    leading dims."""
    s = as_f64(scores)
    lead = s.shape[:-3]
    s = s.reshape((-1,) + s.shape[-3:])
    out = s.copy()
    for b in range(s.shape[0]):
        for h in range(s.shape[1]):
            for i in range(s.shape[2]):
                for j in range(s.shape[3]):
                    d = int(kpos[b][j]) - int(qpos[b][i])
                    if (mask is not None and not mask[b][j]) or (causal and d > 0):
                        out[b, h, i, j] = -np.inf
                    else:
                        out[b, h, i, j] += float(slopes[h]) * (-abs(d) if symmetric else d)
    return out.reshape(lead + s.shape[1:])


def rows_of(a, batch: int) -> list:
    """A per-sequence argument as `batch` rows (shared forms repeated)."""
    a = np.asarray(a)
    a = a.reshape(-1, a.shape[-1])
    return [a[0] if a.shape[0] == 1 else a[b] for b in range(batch)]


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("causal,symmetric", [(True, False), (False, False), (False, True)])
def test_left_padded_prefill_and_decode(dtype, causal, symmetric):
    heads, k_len = 3, 10
    mask = np.ones((3, k_len), np.int64)
    mask[0, :4] = 0
    mask[2, :1] = 0
    kpos = (np.cumsum(mask, axis=1) - 1) * mask  # BLOOM's positions
    slopes = fastpe.alibi_slopes(heads)
    rng = np.random.default_rng(1)
    for q_len in (k_len, 1, 3):  # prefill, decode, a few draft tokens
        scores = rng.standard_normal((3, heads, q_len, k_len)).astype(dtype)
        qpos = kpos[:, k_len - q_len:]
        want = explicit_loop(scores, slopes, qpos, kpos, mask, causal, symmetric)
        for backend_fn in (fastpe.add_alibi, fastpe.reference.add_alibi):
            got = backend_fn(scores.copy(), key_mask=mask, causal=causal, symmetric=symmetric)
            assert_same_scores(got, want, dtype, 20.0, f"{backend_fn.__module__} q_len={q_len}")
        # the same with the positions spelled out
        got = fastpe.add_alibi(scores.copy(), key_mask=mask.astype(bool), causal=causal,
                               symmetric=symmetric, k_positions=kpos, q_positions=qpos)
        assert_same_scores(got, want, dtype, 20.0, f"explicit positions q_len={q_len}")


def test_key_positions_of_masks_with_long_and_short_runs():
    """BLOOM's (cumsum(mask) - 1) * mask positions for masks whose runs of padding and of
    real keys are long (left and right padding, gaps), short (alternating, random) and
    mixed, at lengths around the 8 flags a long run is recognised by."""
    rng = np.random.default_rng(7)
    rows = []
    for k_len in (7, 8, 9, 16, 17, 40, 67):
        rows += [np.ones(k_len, bool), np.zeros(k_len, bool), np.arange(k_len) >= k_len // 3,
                 np.arange(k_len) < k_len - 5, np.arange(k_len) % 2 == 0,
                 rng.random(k_len) < 0.5, (np.arange(k_len) // 9) % 2 == 1,
                 (np.arange(k_len) % 11) > 1]
    for mask in rows:
        k_len = mask.size
        kpos = (np.cumsum(mask) - 1) * mask
        scores = rng.standard_normal((1, 2, 1, k_len))
        slopes = fastpe.alibi_slopes(2)
        want = explicit_loop(scores, slopes, [kpos[-1:]], [kpos], [mask], False, False)
        got = fastpe.add_alibi(scores.copy(), key_mask=mask[None].astype(np.int64))
        assert_same_scores(got, want, F64, 20.0, str(mask.astype(int)))


@pytest.mark.parametrize("form", ["shared", "one-row", "per-row", "lead-shaped"])
def test_position_forms_on_5d_scores(form):
    """Leading dims (2, 3) are 6 sequences in C order; every accepted shape of the
    per-sequence arguments means the same thing."""
    lead, heads, q, k = (2, 3), 2, 4, 9
    batch = 6
    rng = np.random.default_rng(4)
    scores = rng.standard_normal(lead + (heads, q, k))
    full_q = rng.integers(0, 30, (batch, q))
    full_k = rng.integers(0, 30, (batch, k))
    full_m = rng.random((batch, k)) < 0.8
    if form == "shared":
        qa, ka, ma = full_q[0], full_k[0], full_m[0]
        full_q, full_k, full_m = ([x[0]] * batch for x in (full_q, full_k, full_m))
    elif form == "one-row":
        qa, ka, ma = full_q[:1], full_k[:1], full_m[:1]
        full_q, full_k, full_m = ([x[0]] * batch for x in (full_q, full_k, full_m))
    elif form == "per-row":
        qa, ka, ma = full_q, full_k, full_m
    else:
        qa, ka, ma = (x.reshape(lead + (-1,)) for x in (full_q, full_k, full_m))
    slopes = fastpe.alibi_slopes(heads)
    want = explicit_loop(scores, slopes, full_q, full_k, full_m, True, False)
    for fn in (fastpe.add_alibi, fastpe.reference.add_alibi):
        got = fn(scores.copy(), q_positions=qa, k_positions=ka, key_mask=ma, causal=True)
        assert_same_scores(got, want, F64, 40.0, f"{fn.__module__} form={form}")


def test_k_positions_alone_give_the_query_positions():
    """Without q_positions, query i takes the position of key q_offset + i."""
    scores = np.zeros((2, 2, 3, 8))
    kpos = np.array([[0, 0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7]])
    got = fastpe.add_alibi(scores.copy(), k_positions=kpos, causal=True)
    want = fastpe.add_alibi(scores.copy(), k_positions=kpos, q_positions=kpos[:, 5:],
                            causal=True)
    assert_bytes_equal(got, want, "derived query positions")
    got = fastpe.add_alibi(scores.copy(), k_positions=kpos, q_offset=2)
    want = fastpe.add_alibi(scores.copy(), k_positions=kpos, q_positions=kpos[:, 2:5])
    assert_bytes_equal(got, want, "derived query positions with q_offset")


def test_key_mask_accepts_bool_and_0_1_integers():
    scores = np.zeros((2, 3, 4, 6), np.float32)
    m = np.array([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    a = fastpe.add_alibi(scores.copy(), key_mask=m)
    for alt in (m.astype(bool), m.astype(np.uint8), m.tolist()):
        assert_bytes_equal(fastpe.add_alibi(scores.copy(), key_mask=alt), a, str(type(alt)))
    assert np.all(np.isneginf(a[0, :, :, 0])) and np.isfinite(a[1]).all()


@pytest.mark.parametrize("layout", ["fortran", "broadcast-row", "reversed"])
def test_key_mask_of_any_layout(layout):
    """A mask is read by its values, whatever its layout (transposed in memory, one row
    broadcast to every sequence as transformers' mask.expand() gives, reversed)."""
    m = np.random.default_rng(3).random((3, 7)) > 0.3
    m[:, -1] = True
    mask = {"fortran": np.asfortranarray(m), "reversed": m[:, ::-1],
            "broadcast-row": np.broadcast_to(m[1:2], m.shape)}[layout]
    values = {"fortran": m, "reversed": m[:, ::-1],
              "broadcast-row": np.repeat(m[1:2], 3, 0)}[layout]
    s = np.zeros((3, 2, 4, 7), np.float32)
    got = fastpe.add_alibi(s.copy(), key_mask=mask)
    assert_bytes_equal(got, fastpe.add_alibi(s.copy(), key_mask=np.ascontiguousarray(values)),
                       layout)
    assert (np.isneginf(got) == ~np.broadcast_to(values[:, None, None, :], got.shape)).all()



@pytest.mark.parametrize("lead, forms", [
    ((1,), ["(6,)", "(1, 6)"]),
    ((2,), ["(6,)", "(1, 6)", "(2, 6)"]),
    ((2, 3), ["(6,)", "(1, 6)", "(6, 6)", "(2, 3, 6)"])])
def test_key_mask_shape_error_lists_each_accepted_shape_once(lead, forms):
    scores = np.zeros(lead + (2, 4, 6), np.float32)
    with pytest.raises(ValueError, match=r"\bkey_mask\b") as err:
        fastpe.add_alibi(scores, key_mask=np.ones((7, 5), bool))
    listed = re.search(r"must have shape (.*) \(one flag", str(err.value)).group(1).split(" or ")
    assert listed == forms, str(err.value)
    assert not scores.any()

# ---- views whose keys are not nearest in memory -----------------------------------------

# storage axes of (batch, heads, q, k) scores, keys never last: queries nearer than keys
# (a K @ Q^T product), or heads nearest ((b, q, k, h) scores permuted)
TRANSPOSED = {"keys-slowest": (0, 3, 1, 2), "queries-last": (0, 1, 3, 2),
              "heads-last": (0, 2, 3, 1), "heads-then-queries": (0, 3, 2, 1)}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("order", list(TRANSPOSED))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_transposed_views_match_contiguous_bits(option, order, dtype):
    """A transposed view gives a contiguous copy's bits, and only its own elements change
    (every other query of a padded parent)."""
    batch, heads, q, k = 2, 3, 19, 40
    kw = option_kwargs(option, batch, heads, q, k)
    if q > k and "q_offset" not in kw and "q_positions" not in kw:
        kw["q_offset"] = 0
    perm = TRANSPOSED[order]
    shape = (batch, heads, q, k)
    step = [2 if axis == 2 else 1 for axis in perm]
    parent = np.full([(shape[a] + 2) * st for a, st in zip(perm, step)], 5.0).astype(dtype)
    inner = tuple(slice(st, st * (shape[a] + 1), st) for a, st in zip(perm, step))
    view = parent[inner].transpose(np.argsort(perm))
    assert view.shape == shape and min(map(abs, view.strides[1:3])) < abs(view.strides[3])
    view[...] = np.random.default_rng(4).uniform(-8, 8, shape).astype(dtype)
    inside = np.zeros(parent.shape, bool)
    inside[inner] = True
    before = parent.copy()
    copy = np.ascontiguousarray(view)
    fastpe.add_alibi(view, **kw)
    fastpe.add_alibi(copy, **kw)
    ctx = f"add_alibi {option} {order} {np.dtype(dtype)}"
    assert_bytes_equal(view, copy, ctx)
    assert_bytes_equal(parent[~inside], before[~inside], ctx + ": outside the view")
    if not any(np.ndim(v) == 2 for v in kw.values()):   # no per-sequence arguments
        table = np.zeros((k, heads, q), dtype).transpose(1, 2, 0)   # (heads, q, k)
        fastpe.alibi_bias(heads, q, k, out=table, **kw)
        want = fastpe.alibi_bias(heads, q, k, dtype=dtype, **kw)
        assert_bytes_equal(table, want, ctx.replace("add_alibi", "alibi_bias"))


# ---- views: writes stay inside the view ------------------------------------------------------

SENTINEL = 1000.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("index", [
    (slice(1, 3), slice(None), slice(2, 19, 2), slice(3, -4)),
    (slice(None, None, -1), slice(1, 4), slice(None), slice(-2, 0, -3)),
    (0, slice(0, 5, 2), slice(1, -1), slice(None))])
@pytest.mark.parametrize("option", ["plain", "causal", "key_mask", "big-offset"])
def test_no_writes_outside_the_view(dtype, index, option, both_threads):
    big = np.full((4, 5, 22, 40), SENTINEL, dtype)
    inside = np.zeros(big.shape, bool)
    inside[index] = True
    view = big[index]
    *lead, heads, q, k = view.shape
    kw = option_kwargs(option, int(np.prod(lead)), heads, q, k)
    if q > k and "q_offset" not in kw:  # the queries can't all be the newest keys
        if "key_mask" in kw:
            kw["q_positions"] = np.arange(q)
        else:
            kw["q_offset"] = 0
    fastpe.add_alibi(view, num_threads=both_threads, **kw)
    assert np.all(as_f64(big)[~inside] == SENTINEL), f"{option}: wrote outside the view"
    assert not np.all(as_f64(big)[inside] == SENTINEL)


# ---- bad input ---------------------------------------------------------------------------------

S = (2, 3, 4, 6)  # the scores of the bad-input cases: batch 2, 3 heads, 4 queries, 6 keys


def _strided_zero():
    base = np.zeros(S, np.float32)
    return np.lib.stride_tricks.as_strided(base, S, (0,) + base.strides[1:], writeable=True)


def _read_only():
    a = np.zeros(S, np.float32)
    a.flags.writeable = False
    return a


BAD_ADD = [
    # (id, scores factory or None for a plain one, kwargs, exception, words the message names)
    ("heads-mismatch", None, {"slopes": np.ones(4)}, ValueError, ["slopes", "3"]),
    ("slopes-2d", None, {"slopes": np.ones((1, 3))}, ValueError, ["slopes"]),
    ("slopes-nan", None, {"slopes": [0.5, np.nan, 0.1]}, ValueError, ["slopes", "finite"]),
    ("slopes-inf", None, {"slopes": [0.5, np.inf, 0.1]}, ValueError, ["slopes", "finite"]),
    # finite as float64, infinite in float32 scores' arithmetic: inf * 0 = NaN at k == q
    ("slopes-past-float32", None, {"slopes": [0.5, -1e300, 0.1]}, ValueError,
     ["slopes", "float32", "head 1"]),
    # the same as the float64 array the compiled entry reads itself
    ("slopes-past-float32-array", None, {"slopes": np.array([0.5, -1e300, 0.1])}, ValueError,
     ["slopes", "float32", "head 1"]),
    ("slopes-past-float32-array-f16", lambda: np.zeros(S, np.float16),
     {"slopes": np.array([0.5, 4e38, 0.1]), "causal": True}, ValueError,
     ["slopes", "float16", "head 1"]),
    ("slopes-text", None, {"slopes": ["a", "b", "c"]}, TypeError, ["slopes"]),
    ("slopes-and-max_bias", None, {"slopes": np.ones(3), "max_bias": 8.0}, ValueError,
     ["slopes", "max_bias"]),
    ("max_bias-nan", None, {"max_bias": float("nan")}, ValueError, ["max_bias"]),
    ("max_bias-inf", None, {"max_bias": float("inf")}, ValueError, ["max_bias"]),
    ("max_bias-zero", None, {"max_bias": 0.0}, ValueError, ["max_bias"]),
    ("max_bias-negative", None, {"max_bias": -8.0}, ValueError, ["max_bias"]),
    ("max_bias-text", None, {"max_bias": "8"}, TypeError, ["max_bias"]),
    ("q_offset-negative", None, {"q_offset": -1}, ValueError, ["q_offset"]),
    ("q_offset-float", None, {"q_offset": 1.5}, TypeError, ["q_offset"]),
    ("q_offset-and-positions", None, {"q_offset": 1, "q_positions": np.arange(4)}, ValueError,
     ["q_offset", "q_positions"]),
    ("q_offset-past-keys", None, {"q_offset": 3, "k_positions": np.arange(6)}, ValueError,
     ["q_offset"]),
    ("q_positions-shape", None, {"q_positions": np.arange(5)}, ValueError, ["q_positions"]),
    ("q_positions-batch", None, {"q_positions": np.zeros((3, 4), int)}, ValueError,
     ["q_positions"]),
    ("q_positions-negative", None, {"q_positions": [0, 1, -2, 3]}, ValueError,
     ["q_positions", ">= 0"]),
    ("q_positions-float", None, {"q_positions": np.arange(4.0)}, TypeError, ["q_positions"]),
    ("k_positions-shape", None, {"k_positions": np.arange(4)}, ValueError, ["k_positions"]),
    ("k_positions-negative", None, {"k_positions": -np.arange(6)}, ValueError,
     ["k_positions"]),
    ("k_positions-float", None, {"k_positions": np.zeros(6)}, TypeError, ["k_positions"]),
    ("key_mask-shape", None, {"key_mask": np.ones((2, 5), bool)}, ValueError, ["key_mask"]),
    ("key_mask-batch", None, {"key_mask": np.ones((4, 6), bool)}, ValueError, ["key_mask"]),
    ("key_mask-float", None, {"key_mask": np.ones(6)}, TypeError, ["key_mask"]),
    ("key_mask-values", None, {"key_mask": np.full(6, 2)}, ValueError, ["key_mask"]),
    ("causal-text", None, {"causal": "yes"}, TypeError, ["causal"]),
    ("symmetric-none", None, {"symmetric": None}, TypeError, ["symmetric"]),
    ("num_threads-zero", None, {"num_threads": 0}, ValueError, ["num_threads"]),
    ("num_threads-float", None, {"num_threads": 1.0}, TypeError, ["num_threads"]),
    ("read-only", _read_only, {}, TypeError, ["scores", "read-only"]),
    ("zero-stride", _strided_zero, {}, ValueError, ["scores"]),
    ("int-dtype", lambda: np.zeros(S, np.int32), {}, TypeError, ["scores"]),
    ("complex-dtype", lambda: np.zeros(S, np.complex64), {}, TypeError, ["scores"]),
    ("two-dims", lambda: np.zeros((4, 6), np.float32), {}, ValueError, ["scores"]),
    ("nine-dims", lambda: np.zeros((1,) * 6 + S[-3:], np.float32), {}, ValueError,
     ["scores", "8 dimensions"]),
    ("q-longer-than-k", lambda: np.zeros((2, 3, 7, 6), np.float32), {}, ValueError,
     ["q_offset"]),
]


# BAD_ADD and BAD_BIAS are run by tests/test_bad_input.py (test_bad_input), with every
# other function's bad-input rows (alibi_slopes' included): one table-driven test.


BAD_BIAS = [
    ("num_heads-negative", (-1, 4, 6), {}, ValueError, ["num_heads"]),
    ("q_len-negative", (3, -4, 6), {}, ValueError, ["q_len"]),
    ("k_len-negative", (3, 4, -6), {}, ValueError, ["k_len"]),
    ("k_len-float", (3, 4, 6.0), {}, TypeError, ["k_len"]),
    ("num_heads-bool", (True, 4, 6), {}, TypeError, ["num_heads"]),
    ("dtype-int", (3, 4, 6), {"dtype": "int32"}, TypeError, ["dtype"]),
    ("dtype-junk", (3, 4, 6), {"dtype": "nope"}, TypeError, ["dtype"]),
    ("slopes-mismatch", (3, 4, 6), {"slopes": [1.0, 2.0]}, ValueError, ["slopes"]),
    ("slopes-past-float32", (3, 4, 6), {"slopes": [1.0, 2.0, 1e39], "dtype": "float32"},
     ValueError, ["slopes", "float32", "head 2"]),
    ("q-longer-than-k", (3, 7, 6), {}, ValueError, ["q_offset"]),
    ("past-arrays", (2**40, 2**20, 2**20), {}, ValueError, ["num_heads", "q_len", "k_len"]),
    ("out-shape", (3, 4, 6), {"out": np.zeros((3, 4, 5))}, ValueError, ["out"]),
    ("out-read-only", (3, 4, 6), {"out": np.zeros((3, 4, 6))}, TypeError, ["out"]),
    ("out-dtype-contradiction", (3, 4, 6), {"out": np.zeros((3, 4, 6)), "dtype": "float16"},
     TypeError, ["dtype", "out"]),
    ("out-list", (3, 4, 6), {"out": [[[0.0]]]}, TypeError, ["out"]),
    ("positions-batched", (3, 4, 6), {"k_positions": np.zeros((2, 6), int)}, ValueError,
     ["k_positions"]),
]



# ---- the compiled fast path --------------------------------------------------------------------


@needs_compiled
def test_compiled_entry_declines_without_writing():
    """The compiled entry returns False (nothing written) for whatever it does not take,
    and the validating path then decides: these all still work, or raise."""
    kern = fastpe._backend.compiled
    slopes = fastpe.alibi_slopes(3)
    two_rows = np.array([[0, 1, 2, 3], [1, 2, 3, 4]])
    mask = np.ones((2, 6), np.uint8)
    for scores, q_offset, extra in [
        (np.zeros(S, ">f4"), None, {}),                            # byte-swapped
        (np.zeros((2, 3, 7, 6), np.float32), None, {}),            # q > k
        (np.zeros(S, np.float32), -1, {}),                         # negative offset
        (np.zeros(S, np.float32), 2**63, {}),                      # past int64
        (np.zeros((2, 4, 4, 6), np.float32), None, {}),            # 4 heads, 3 slopes
        (np.zeros((4, 6), np.float32), None, {}),                  # 2-D
        (_strided_zero(), None, {}),                               # zero stride
        (_read_only(), None, {}),                                  # read-only
        (np.zeros(S, np.float32), 0, {"q_positions": two_rows}),   # offset and positions
        (np.zeros(S, np.float32), None, {"q_positions": two_rows.tolist()}),  # a list
        (np.zeros(S, np.float32), None, {"q_positions": -two_rows}),          # negative
        (np.zeros(S, np.float32), None, {"q_positions": two_rows[:, :3]}),    # short
        (np.zeros(S, np.float32), None, {"q_positions": np.zeros((3, 4), int)}),  # 3 rows
        (np.zeros(S, np.float32), None, {"key_mask": mask * 2}),   # not 0/1
        (np.zeros(S, np.float32), None, {"key_mask": mask.astype(np.float32)}),  # floats
        (np.zeros(S, np.float32), 3, {"key_mask": mask}),          # query 3 past the keys
        (np.zeros((1, 2, 3, 4, 6), np.float32), None,              # lead-shaped positions
         {"k_positions": np.zeros((1, 2, 6), int)}),
    ]:
        before = snapshot(scores)
        kw = {"q_positions": None, "k_positions": None, "key_mask": None, **extra}
        heads = scores.shape[-3] if scores.ndim >= 3 else 3
        sl = slopes if heads == 3 else fastpe.alibi_slopes(4)[:3]
        assert kern.alibi_call(scores, sl, kw["q_positions"], q_offset, kw["k_positions"],
                               kw["key_mask"], True, False, True, 1) is False
        assert snapshot(scores) == before
    x = np.zeros(S, ">f4")
    fastpe.add_alibi(x, causal=True)
    assert_bytes_equal(x.astype(np.float32), fastpe.add_alibi(np.zeros(S, np.float32),
                                                              causal=True), "byte-swapped")


@needs_compiled
@pytest.mark.parametrize("option", [o for o in OPTIONS if o != "max_bias"])
def test_per_sequence_calls_take_the_compiled_entry_directly(option, monkeypatch):
    """Positions, masks and slopes a decode step passes are taken by the compiled entry
    from the caller's own arrays, with no validating pass first; the bits are those of
    the validating path's call (any rounding the same) and near the reference's."""
    shape = (2, 3, 5, 11)
    kw = option_kwargs(option, 2, 3, 5, 11, seed=4)
    scores = awkward_values(shape, F32, seed=2, low=-4, high=4)
    validated = scores.copy()
    want = scores.copy()
    callers = entry_callers(monkeypatch, "alibi_call")
    with fastpe.use_backend("cython"):
        fastpe.add_alibi(scores, **kw)
        assert callers == [("add_alibi", True)], option
        fastpe.alibi._run(fastpe._args.add_alibi(
            validated, slopes=kw.get("slopes"), max_bias=None, q_offset=kw.get("q_offset"),
            causal=kw.get("causal", False), symmetric=kw.get("symmetric", False),
            q_positions=kw.get("q_positions"), k_positions=kw.get("k_positions"),
            key_mask=kw.get("key_mask"), num_threads=1))
    assert_bytes_equal(scores, validated, option)
    fastpe.reference.add_alibi(want, **kw)
    assert_same_scores(scores, want, F32, magnitude(as_f64(want), kw, 5, 11), option)


@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.itemsize == 2], ids=str)
def test_half_types_compute_in_float32(dtype):
    """float16 / bfloat16 storage: scores + bias in float32, rounded once to the storage
    type (bias = float32(slope) * float32(distance))."""
    scores = awkward_values((2, 4, 9, 23), dtype, seed=8, low=-8, high=8)
    got = fastpe.add_alibi(scores.copy(), causal=True)
    bias = fastpe.alibi_bias(4, 9, 23, causal=True, dtype=np.float32)
    want = (scores.astype(np.float32) + bias).astype(dtype)
    assert_bytes_equal(got, want, f"{dtype} rounds once")


@pytest.mark.parametrize("dtype", [d for d in FLOAT_DTYPES if d.itemsize == 2], ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "columns"])
@pytest.mark.parametrize("option", ["key_mask", "mask-causal", "sym-positions", "q_offset"])
def test_half_types_masked_rows_and_columns_match_reference_bits(dtype, transposed, option):
    """float16 / bfloat16 scores whose keys are selected (a mask, causal, positions), as
    rows of keys and as columns of queries (a K @ Q^T view), lengths past every vector
    step with a tail, NaN scores among them: the NumPy reference's bits, element for
    element, and -inf wherever a key is masked."""
    batch, heads, q, k = 2, 4, 45, 83
    kw = option_kwargs(option, batch, heads, q, k)
    values = awkward_values((batch, heads, q, k), dtype, seed=12, low=-8, high=8)
    values[0, 1, 3, ::7] = np.nan
    scores = (np.ascontiguousarray(values.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
              if transposed else values.copy())
    want = values.copy()
    fastpe.add_alibi(scores, **kw)
    fastpe.reference.add_alibi(want, **kw)
    assert_bytes_equal(scores, want, f"{option} {np.dtype(dtype)} transposed={transposed}")


def test_causal_and_symmetric_together_is_causal():
    a = fastpe.alibi_bias(3, 5, 5, causal=True, symmetric=True)
    assert_bytes_equal(a, fastpe.alibi_bias(3, 5, 5, causal=True), "causal wins")


def test_flags_accept_numpy_bools_and_0_1():
    ref = fastpe.alibi_bias(2, 3, 4, causal=True)
    for flag in (np.bool_(True), 1):
        assert_bytes_equal(fastpe.alibi_bias(2, 3, 4, causal=flag), ref, repr(flag))


def test_all_combinations_of_small_shapes_match_reference():
    """Every small (heads, q, k) with q_offset default or 0, causal or not: edge rows
    (a query before every key, keys past every query)."""
    for h, q, k in itertools.product((1, 3), (1, 2, 5), (1, 4, 9)):
        for q_offset in (None, 0, 7):
            if q_offset is None and q > k:
                continue
            for causal, symmetric in ((False, False), (True, False), (False, True)):
                kw = dict(q_offset=q_offset, causal=causal, symmetric=symmetric)
                got = fastpe.alibi_bias(h, q, k, **kw)
                want = fastpe.reference.alibi_bias(h, q, k, **kw)
                assert_bytes_equal(got, want, f"({h}, {q}, {k}) {kw}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", ["causal", "key_mask", "mask-causal", "sym-positions"])
@pytest.mark.parametrize("strided", [False, True])
def test_long_rows_match_reference(dtype, option, strided):
    """Rows longer than the kernels' float16 chunk (512 keys), unit and strided keys,
    added and written."""
    k = 1100
    values = awkward_values((2, 2, 3, k), dtype, seed=9)
    scores = (np.zeros((2, 2, 3, 2 * k), dtype)[..., ::2] if strided
              else np.empty_like(values))
    scores[...] = values
    twin = values.copy()
    kw = option_kwargs(option, 2, 2, 3, k)
    fastpe.add_alibi(scores, **kw)
    fastpe.reference.add_alibi(twin, **kw)
    assert_same_scores(scores, twin, dtype, 200.0 + k, f"add_alibi {option} k={k}")
    one = {key: (v[:1] if np.ndim(v) == 2 else v) for key, v in kw.items()}
    got = fastpe.alibi_bias(2, 3, k, dtype=dtype, **one)
    assert_bytes_equal(got, fastpe.reference.alibi_bias(2, 3, k, dtype=dtype, **one),
                       f"alibi_bias {option} k={k}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", ["plain", "key_mask"])
def test_special_values_match_reference(dtype, option, bf16_narrowing):
    """NaN, infinities, signed zeros, subnormals and the largest finite values of the
    storage type go through the vector conversions as through NumPy's (power-of-two
    slopes: every product is exact, so fused or not the sums agree)."""
    info = ml_dtypes.finfo(dtype) if is_bf16(dtype) else np.finfo(dtype)
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, float(info.max),
                        -float(info.max), float(info.tiny), float(info.smallest_subnormal),
                        -float(info.smallest_subnormal), 1.0, -3.5, 2.0**-3, 7.0],
                       np.float64).astype(dtype)
    k = 40
    scores = np.resize(special, (2, 2, 3, k)).astype(dtype)
    twin = scores.copy()
    kw = {"slopes": [0.0, 2.0**-5]}
    if option == "key_mask":
        kw["key_mask"] = np.arange(k) % 5 != 1
    fastpe.add_alibi(scores, **kw)
    fastpe.reference.add_alibi(twin, **kw)
    a, b = as_f64(scores), as_f64(twin)
    assert np.array_equal(np.isnan(a), np.isnan(b)), f"{dtype}: NaNs in different places"
    keep = ~np.isnan(a)
    assert_bytes_equal(np.where(keep, scores, 0), np.where(keep, twin, 0),
                       f"special values {dtype} {option}")


def test_buffer_protocol_scores_are_written_in_place():
    """A non-NumPy array (here a memoryview) is viewed in place and returned as given."""
    scores = np.zeros((2, 3, 4, 6), np.float32)
    view = memoryview(scores)
    assert fastpe.add_alibi(view, causal=True) is view
    assert_bytes_equal(scores, fastpe.add_alibi(np.zeros_like(scores), causal=True),
                       "through a memoryview")
    out = np.zeros((3, 4, 6), np.float32)
    out_view = memoryview(out)
    assert fastpe.alibi_bias(3, 4, 6, out=out_view) is out_view
    assert_bytes_equal(out, fastpe.alibi_bias(3, 4, 6), "alibi_bias(out=memoryview)")


@pytest.mark.parametrize("dtype", [np.dtype(np.float16)] + ([BF16] if BF16 is not None else []),
                         ids=lambda d: d.name)
@pytest.mark.parametrize("mode", ["plain", "causal", "symmetric"])
@pytest.mark.parametrize("shape", [(2, 5, 1, 77), (1, 6, 9, 133)], ids=["decode", "prefill"])
def test_half_rows_in_one_pass_are_the_strided_path(dtype, mode, shape, bf16_narrowing):
    """Unit-stride float16 and bfloat16 rows of the plain case are widened, biased and
    narrowed in registers; rows with a stride take the element-wise loop: the same bits
    for every bit pattern (NaNs, infinities, subnormals), on whole vectors and the keys
    past them, added to scores and written as a table."""
    kw = {"causal": mode == "causal", "symmetric": mode == "symmetric"}
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(0, 2**16, shape, dtype=np.uint16).view(dtype)
    wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
    strided = wide[..., ::2]
    strided[...] = x
    fastpe.add_alibi(x, **kw)
    fastpe.add_alibi(strided, **kw)
    assert_bytes_equal(x, np.ascontiguousarray(strided), f"add_alibi {dtype} {mode}")
    assert not wide[..., 1::2].view(np.uint16).any()
    *_, heads, q, k = shape
    table = fastpe.alibi_bias(heads, q, k, dtype=dtype, **kw)
    base = np.zeros((heads, q, 2 * k), dtype)
    fastpe.alibi_bias(heads, q, k, out=base[..., ::2], **kw)
    assert_bytes_equal(table, np.ascontiguousarray(base[..., ::2]), f"alibi_bias {dtype} {mode}")
    want = fastpe.reference.alibi_bias(heads, q, k, dtype=dtype, **kw)
    assert_bytes_equal(table, want, f"alibi_bias {dtype} {mode} vs reference")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_calls_with_nothing_to_write_take_any_offset_and_any_rows(backend):
    """No queries: an offset past int64 writes nothing, as no keys with a billion
    sequences do (no (rows, q) work space is made for them); an offset past the keys
    when query positions come from them is still the ValueError it is with queries."""
    if backend == "cython" and not fastpe._backend.compiled:
        pytest.skip("needs the compiled kernels")
    with fastpe.use_backend(backend):
        for big in (2**63, 2**64):
            fastpe.add_alibi(np.zeros((1, 2, 0, 4), np.float32), q_offset=big)
            assert fastpe.alibi_bias(2, 0, 4, q_offset=big).shape == (2, 0, 4)
        many = np.zeros((2**30, 1, 3, 0), np.float32)
        fastpe.add_alibi(many, key_mask=np.zeros((2**30, 0), bool))
        fastpe.add_alibi(many, k_positions=np.zeros((2**30, 0), np.int64))
        with pytest.raises(ValueError, match=r"q_offset must be in \[0, k_len - q_len\]"):
            fastpe.add_alibi(np.zeros((1, 2, 0, 4), np.float32), q_offset=2**63,
                             key_mask=np.ones(4, bool))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("option", list(OPTIONS))
def test_groups_of_four_heads_match_reference(option, dtype, both_threads):
    """Heads four at a time (one load of key positions per four rows), masked and
    positioned keys among them, with a fifth head left over; added and as a table."""
    shape = (2, 9, 3, 70)
    scores = awkward_values(shape, dtype, seed=11, low=-4, high=4)
    kw = option_kwargs(option, 2, 9, 3, 70, seed=2)
    want = scores.copy()
    fastpe.add_alibi(scores, num_threads=both_threads, **kw)
    fastpe.reference.add_alibi(want, **kw)
    ctx = f"add_alibi(9 heads, {option}, {dtype})"
    assert_same_scores(scores, want, dtype, magnitude(as_f64(want), kw, 3, 70), ctx)
    shared = {n: (np.asarray(v)[:1] if n in ("q_positions", "k_positions", "key_mask")
                  and np.ndim(v) > 1 else v) for n, v in kw.items()}
    table = fastpe.alibi_bias(9, 3, 70, dtype=dtype, num_threads=both_threads, **shared)
    want_table = fastpe.reference.alibi_bias(9, 3, 70, dtype=dtype, **shared)
    assert_same_scores(table, want_table, dtype, 200.0, ctx + " table")


def _one_run_masks(batch: int, k: int) -> dict[str, np.ndarray]:
    """Key masks whose kept keys are one run per row (padding on the left, on the right,
    on both sides, a row of padding alone), and one whose rows are not."""
    left = np.ones((batch, k), np.int64)
    right = np.ones((batch, k), bool)
    both = np.zeros((batch, k), np.uint8)
    for r in range(batch):
        left[r, :(r * k) // (batch + 1)] = 0
        right[r, k - (r * k) // (batch + 2):] = False
        both[r, r + 1:k - 2 * r] = 1
    both[-1] = 0
    holes = left.copy()
    holes[:, k // 2] = 0
    return {"left": left, "right": right, "both": both, "shared": left[1], "holes": holes}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("heads", [8, 9])
@pytest.mark.parametrize("mask", ["left", "right", "both", "shared", "holes"])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"symmetric": True}, {"q_offset": 2},
                                {"causal": True, "q_positions": [0, 5, 63, 64, 80]}],
                         ids=["plain", "causal", "symmetric", "q_offset", "q_positions"])
def test_padded_rows_take_their_positions_from_the_mask(dtype, heads, mask, kw, both_threads):
    """A mask's positions (BLOOM's: real keys count 0, 1, 2, ...) give the bits that
    the same positions given as k_positions give, and the reference's values: the rows
    whose kept keys are one run go through a loop that counts them (four heads at once)
    where the others select key by key."""
    batch, q, k = 3, 5, 67
    m = _one_run_masks(batch, k)[mask]
    positions = (np.cumsum(m, axis=-1, dtype=np.int64) - 1) * m.astype(np.int64)
    scores = np.random.default_rng(3).standard_normal((batch, heads, q, k)).astype(dtype)
    got, given, want = scores.copy(), scores.copy(), scores.copy()
    fastpe.add_alibi(got, key_mask=m, num_threads=both_threads, **kw)
    fastpe.add_alibi(given, key_mask=m, k_positions=positions, num_threads=both_threads, **kw)
    fastpe.reference.add_alibi(want, key_mask=m, **kw)
    ctx = f"add_alibi({mask} mask, {kw}, {heads} heads)"
    assert_bytes_equal(got, given, context=ctx)
    assert_same_scores(got, want, dtype, magnitude(as_f64(want), kw, q, k), ctx)
    mm = m if m.ndim == 1 else m[1]
    table = fastpe.alibi_bias(heads, q, k, key_mask=mm, dtype=dtype, num_threads=both_threads,
                              **{n: (v if np.ndim(v) < 2 else v[1]) for n, v in kw.items()})
    want_table = fastpe.reference.alibi_bias(heads, q, k, key_mask=mm, dtype=dtype,
                                             **{n: (v if np.ndim(v) < 2 else v[1])
                                                for n, v in kw.items()})
    assert_same_scores(table, want_table, dtype, 200.0, ctx + " table")


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("dtype", ["<f8", ">f8"])
def test_a_float64_slope_past_float32_is_exact_on_float64_scores(backend, dtype):
    """float64 scores (either byte order) take float64 arithmetic: 1e300 * 0 is 0 at
    k == q, not NaN, and 1e300 * -1 is -1e300."""
    if backend == "cython" and fastpe._backend.compiled is None:
        pytest.skip("the compiled extension is not built")
    with fastpe.use_backend(backend):
        bias = fastpe.alibi_bias(2, 3, 3, slopes=[1e300, 0.5], dtype=dtype)
        scores = np.zeros((2, 1, 3), dtype)
        fastpe.add_alibi(scores, slopes=np.array([1e300, 0.5]))
    assert np.array_equal(np.diagonal(bias, axis1=1, axis2=2), np.zeros((2, 3)))
    assert np.isfinite(bias).all()
    assert scores[0, 0].tolist() == [-2e300, -1e300, 0.0]


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("slope_dtype", ["bfloat16", "float16", "torch.bfloat16"])
def test_half_precision_slopes_are_their_values(backend, slope_dtype):
    """Slopes of any float dtype are the numbers they hold (bfloat16's too)."""
    if backend == "cython" and fastpe._backend.compiled is None:
        pytest.skip("the compiled extension is not built")
    values = [0.5, 0.25, -0.125, 3.0]  # exact in every half type
    if slope_dtype == "torch.bfloat16":
        torch = pytest.importorskip("torch")
        slopes = torch.tensor(values, dtype=torch.bfloat16)
    else:
        ml_dtypes = pytest.importorskip("ml_dtypes")
        slopes = np.array(values, ml_dtypes.bfloat16 if slope_dtype == "bfloat16"
                          else slope_dtype)
    scores = np.zeros((2, 4, 1, 5), np.float32)
    with fastpe.use_backend(backend):
        fastpe.add_alibi(scores, slopes=slopes, causal=True)
        table = fastpe.alibi_bias(4, 1, 5, slopes=slopes)
    want = np.array(values)[:, None] * (np.arange(5) - 4.0)
    assert np.array_equal(scores, np.broadcast_to(want[None, :, None, :], scores.shape))
    assert np.array_equal(table[:, 0], want)
