"""Large arrays: index arithmetic past 2**31 elements, without allocating them.

Every array here is a view into one sparse anonymous mapping (MAP_NORESERVE): tens of GiB
of address space of which a call touches a few pages, so the tests need a few MB of
memory. They check that element offsets past 2**31 (and 2**32) are computed in 64 bits:

- arrays of more than 2**31 elements that are only read where positions point: a learned
  table and a cos/sin cache of 2**31 + 16 rows, looked up at positions around 2**31 and
  2**32 - 1 (``position * row stride`` overflows 32 bits);
- an in-place array of more than 2**31 elements of which a call writes a few: q and k
  with a head_dim of 2**26 + 2 (about 10**10 elements) and rotary_dim 2 (only the
  first pair of each head rotates; ``b * qb + t * qs + h * qh`` reaches 10**10);
- in-place arrays with few elements but strides of more than 2**31 elements on every
  axis but the last, for every kernel that writes (sinusoidal table and add, learned add,
  RoPE, ALiBi add and table): each element's offset is past 2**31.

Why no other 32-bit index can overflow (fastpe/_kernels): every count, index, stride and
offset is a Py_ssize_t (lengths, strides in elements, ``row * s + t`` in position_at,
``unit // nblocks``, the ALiBi per-batch offsets ``boff``) or an int64_t (positions,
distances); positions are validated < 2**63 and ``kpos - qpos`` of two values in
[0, 2**63) cannot overflow. The ints left are thread counts and thread numbers
(``units_threads`` clamps nunits, a Py_ssize_t, before narrowing), the head-group loop
(< 4), dtype codes, and in fastpe_math.h the quadrant ``(int)fn`` of an angle below
FPE_FAST_ANGLE_LIMIT (1e6, larger angles take libm). (``alibi_key_rows`` once counted
keys in a C int; a float64 call with more than 2**31 keys, 16 GiB of scores, would have
left its key row unfilled. It counts in Py_ssize_t now.)
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest
from conftest import COMPILED, assert_bytes_equal, assert_close

import fastpe

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)   # Linux's value; Python 3.13+ names it

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux") or sys.maxsize < 2**62,
                       reason="sparse mappings of tens of GiB: 64-bit Linux"),
]

BACKENDS = [pytest.param("cython", marks=pytest.mark.skipif(
    not COMPILED, reason="the compiled extension is not built")), "numpy"]

GiB = 1 << 30
P31 = 2**31


class Sparse:
    """An anonymous, unreserved mapping: address space whose pages cost memory only when
    touched. `array(shape, dtype, strides, offset)` is a writable view into it."""

    def __init__(self, nbytes: int):
        try:
            self.mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                | MAP_NORESERVE)
        except (OSError, OverflowError, ValueError) as exc:  # strict overcommit, ulimit -v
            pytest.skip(f"can't map {nbytes / GiB:.0f} GiB of address space: {exc}")
        self.nbytes = nbytes

    def array(self, shape, dtype, strides=None, offset=0) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=self.mm, offset=offset, strides=strides)


@pytest.fixture
def sparse():
    """A 96 GiB sparse mapping (a few MB of it touched per test)."""
    return Sparse(96 * GiB)


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ---- more than 2**31 elements, read at a few positions -----------------------------------


POSITIONS = np.array([0, P31 - 1, P31, P31 + 1, P31 + 15, 7], np.int64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_learned_table_of_more_than_2_31_rows(sparse, backend):
    rows, dim = P31 + 16, 2
    table = sparse.array((rows, dim), np.float32)             # 16 GiB, 2**32 + 32 elements
    assert table.size > 2**32
    rng = np.random.default_rng(0)
    table[POSITIONS] = rng.uniform(-1, 1, (len(POSITIONS), dim)).astype(np.float32)
    table.flags.writeable = False
    x = rng.uniform(-1, 1, (2, len(POSITIONS), dim)).astype(np.float32)
    want = x + table[POSITIONS]
    with fastpe.use_backend(backend):
        fastpe.add_learned(x, table, POSITIONS)
    assert_bytes_equal(x, want, f"{backend}: x + table[positions near 2**31]")
    # offset + t, across 2**31
    x2 = np.zeros((1, 3, dim), np.float32)
    with fastpe.use_backend(backend):
        fastpe.add_learned(x2, table, offset=P31 - 1)
    assert_bytes_equal(x2[0], table[P31 - 1:P31 + 2], f"{backend}: offset 2**31 - 1")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_cache_of_more_than_2_31_rows(sparse, backend):
    rows, half = P31 + 16, 1
    cos = sparse.array((rows, half), np.float16)              # 4 GiB each
    sin = sparse.array((rows, half), np.float16, offset=8 * GiB)
    angles = np.random.default_rng(1).uniform(0, 6.3, (len(POSITIONS), half))
    cos[POSITIONS], sin[POSITIONS] = np.cos(angles), np.sin(angles)
    cos.flags.writeable = sin.flags.writeable = False
    q = np.random.default_rng(2).uniform(-1, 1, (2, len(POSITIONS), 3, 2)).astype(np.float16)
    qr = q.copy()
    with fastpe.use_backend(backend):
        fastpe.apply_rope_cached(q, None, cos, sin, POSITIONS, style="gptj")
    # the rotation, from the cache rows the positions name (gathered, small)
    c = cos[POSITIONS].astype(np.float32)[None, :, None, :]
    s = sin[POSITIONS].astype(np.float32)[None, :, None, :]
    a, b = qr[..., 0:1].astype(np.float32), qr[..., 1:2].astype(np.float32)
    want = np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(np.float16)
    assert_close(q, want, np.float16, context=f"{backend}: cache rows near 2**31")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_rotary_pair_of_heads_of_more_than_2_31_elements(sparse, backend):
    """q and k of about 10**10 elements (head_dim 2**26 + 2); rotary_dim 2 rotates only
    the first pair of every head, so a few hundred elements are touched."""
    b, s, hq, hk, d = 2, 40, 2, 1, 2**26 + 2
    q = sparse.array((b, s, hq, d), np.float16)                      # 20 GiB
    k = sparse.array((b, s, hk, d), np.float16, offset=24 * GiB)     # 10 GiB
    assert q.size > 2**33 and not np.may_share_memory(q, k)
    rng = np.random.default_rng(3)
    q[..., :4] = rng.uniform(-1, 1, (b, s, hq, 4))
    k[..., :4] = rng.uniform(-1, 1, (b, s, hk, 4))
    q_small, k_small = q[..., :2].copy(), k[..., :2].copy()
    tail_q, tail_k = q[..., 2:4].copy(), k[..., 2:4].copy()
    positions = P31 - 20 + np.arange(s)
    before = resident_mb()
    with fastpe.use_backend(backend):
        fastpe.apply_rope(q, k, positions, rotary_dim=2, num_threads=2)
    assert resident_mb() - before < 64, "the call touched far more than the rotated pairs"
    fastpe.reference.apply_rope(q_small, k_small, positions)       # head_dim 2: the same pair
    assert_close(q[..., :2], q_small, np.float16, max_position=P31 + 20,
                 context=f"{backend}: q")
    assert_close(k[..., :2], k_small, np.float16, max_position=P31 + 20,
                 context=f"{backend}: k")
    assert_bytes_equal(q[..., 2:4], tail_q, f"{backend}: q past rotary_dim")
    assert_bytes_equal(k[..., 2:4], tail_k, f"{backend}: k past rotary_dim")


# ---- few elements, offsets past 2**31 elements -------------------------------------------


def far_apart(sparse, shape, dtype, gap=P31 + 3):
    """A writable array of `shape` whose every axis but the last steps over more than
    2**31 elements: the last-but-one axis by `gap` elements, each outer axis by the
    extent of the ones inside it (no two elements overlap)."""
    dtype = np.dtype(dtype)
    nd = len(shape)
    strides = [dtype.itemsize] * nd
    strides[nd - 2] = dtype.itemsize * gap
    for i in range(nd - 3, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    extent = sum((n - 1) * st for n, st in zip(shape, strides)) + dtype.itemsize
    assert extent < sparse.nbytes and min(strides[:-1]) // dtype.itemsize > P31
    return sparse.array(shape, dtype, strides=tuple(strides))


def twin(a: np.ndarray) -> np.ndarray:
    return np.array(a)   # small: a contiguous copy of the few elements


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_far_apart_in_place_arrays(sparse, dtype, backend):
    """Every writing kernel on arrays whose elements lie more than 2**31 elements apart:
    the same result as on a contiguous copy."""
    rng = np.random.default_rng(4)

    def check(name, shape, fn):
        x = far_apart(sparse, shape, dtype)
        x[...] = rng.uniform(-1, 1, shape)
        ref = twin(x)
        with fastpe.use_backend(backend):
            fn(x)
        with fastpe.use_backend(backend):
            fn(ref)         # the same backend on a contiguous copy
        assert_bytes_equal(twin(x), ref, f"{name} {shape} {np.dtype(dtype)}")

    check("add_sinusoidal", (2, 3, 5), lambda a: fastpe.add_sinusoidal(a, offset=P31))
    check("sinusoidal_table", (3, 5),
          lambda a: fastpe.sinusoidal_table(3, 5, offset=P31 - 1, out=a))
    table = rng.uniform(-1, 1, (10, 5)).astype(dtype)
    check("add_learned", (2, 3, 5), lambda a: fastpe.add_learned(a, table, [9, 0, 4]))
    check("apply_rope", (2, 3, 2, 6), lambda a: fastpe.apply_rope(a, None, offset=P31))
    check("apply_rope/gptj-bhsd", (2, 2, 3, 6),
          lambda a: fastpe.apply_rope(a, None, layout="bhsd", style="gptj", rotary_dim=4))
    check("add_alibi", (2, 2, 3, 4), lambda a: fastpe.add_alibi(a, causal=True))
    check("add_alibi/general", (2, 2, 3, 4),
          lambda a: fastpe.add_alibi(a, key_mask=[1, 0, 1, 1], q_positions=[5, 6, 7]))
    check("alibi_bias", (2, 3, 4), lambda a: fastpe.alibi_bias(2, 3, 4, out=a))
