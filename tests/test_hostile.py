"""Hostile inputs: objects whose conversions lie or alias the output, other threads and
forks at the wrong moment. Each gives an error or the right answer, never a crash, a
hang or a wrong number."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from conftest import COMPILED, assert_bytes_equal, run_python

import fastpe


class Shifty:
    """An array-like whose __array__ gives a longer array from its second call on."""

    def __init__(self, first, later):
        self.calls = 0
        self.first, self.later = first, later

    def __array__(self, dtype=None, copy=None):
        self.calls += 1
        return self.first if self.calls == 1 else self.later


class Interface:
    """Exposes another array's memory through __array_interface__ only."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


class Lying(float):
    """A float whose __float__ says something else than its value."""

    def __float__(self):
        return 2.0


@pytest.mark.parametrize("spelling", [False, 0, np.False_, True, 1, np.True_])
def test_reverse_embedding_reads_every_spelling_of_inverse(spelling):
    """An embedding that rotates by -angle: inverse=False-ish rotates by -angle, and the
    True-ish spellings undo it, as for inverse=False and inverse=True."""
    rope = fastpe.RotaryEmbedding(16)
    rope.reverse = True
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 2, 16))
    want = q.copy()
    fastpe.reference.apply_rope(want, inverse=not bool(spelling))
    got = q.copy()
    rope(got, inverse=spelling)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("spelling", [0, np.False_, False])
def test_mrope_interleaved_reads_every_spelling_of_false(spelling):
    rope = fastpe.RotaryEmbedding(64, mrope_interleaved=spelling)
    assert rope.axes == 1


def test_positions_whose_array_changes_between_conversions():
    """Multi-axis positions converted once: what is validated is what is read."""
    rope = fastpe.RotaryEmbedding(16, mrope_section=[2, 3, 3])
    q = np.zeros((1, 4, 2, 16), np.float32)
    short = np.zeros((3, 4), np.int64)
    evil = Shifty(short, np.full((3, 1000), 7, np.int64))
    rope(q, None, evil)
    assert evil.calls == 1
    fine = np.zeros_like(q)
    rope(fine, None, short)
    assert_bytes_equal(q, fine)


@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_positions_aliasing_q_through_array_interface(backend):
    """Positions that are q's own memory, seen only through __array_interface__, with a
    cache whose values would turn a rewritten position into a wild index: refused by
    name, or (were it not seen) read before q is written: the call owns its positions."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    q = np.zeros((1, 4, 1, 8), np.float64)
    q.reshape(-1)[:4] = [0, 1, 2, 3]  # the positions, as float64 bits of q...
    flat = q.reshape(-1).view(np.int64)
    flat[:4] = [0, 1, 2, 3]  # ...stored as int64 in q's first four elements
    pos = Interface(flat[:4])
    cos = np.full((4, 4), 1e300)
    sin = np.full((4, 4), 1e300)
    expect = q.copy()
    fastpe.reference.apply_rope_cached(expect, None, cos, sin, np.arange(4))
    before = q.copy()
    with fastpe.use_backend(backend):
        with pytest.raises(ValueError, match=r"positions overlaps q"):
            fastpe.apply_rope_cached(q, None, cos, sin, pos)
    assert_bytes_equal(q, before)
    owned, _ = fastpe._checks.position_array(pos, "positions")
    assert not np.shares_memory(owned, q)
    assert expect.shape == q.shape


def test_slopes_aliasing_scores_through_array_are_refused():
    scores = np.full((3, 2, 4), 0.5)
    slopes = Shifty(scores[0, 0, :3], scores[0, 0, :3])
    with pytest.raises(ValueError, match=r"slopes overlaps scores"):
        fastpe.add_alibi(scores, slopes=slopes)
    assert (scores == 0.5).all()


@pytest.mark.parametrize("name", ["c2p", "p2c"])
@pytest.mark.parametrize("backend", ["cython", "numpy"])
def test_deberta_logits_aliasing_scores_on_their_first_conversion(backend, name):
    """DeBERTa's logits whose first conversion is the scores' own memory and whose later
    ones are copies: refused by name (the kernel would read what it has overwritten),
    scores untouched."""
    if backend == "cython" and not COMPILED:
        pytest.skip("the compiled extension is not built")
    rng = np.random.default_rng(0)
    n = 16
    buf = rng.random((1, 2, n, 2 * n), dtype=np.float32)
    before = buf.copy()
    logits = Shifty(buf, buf.copy())
    with fastpe.use_backend(backend):
        with pytest.raises(ValueError, match=rf"{name} overlaps scores"):
            fastpe.add_disentangled_bias(buf[..., :n], **{name: logits},
                                         max_relative_positions=n)
    assert_bytes_equal(buf, before)


def test_t5_table_aliasing_scores_on_its_first_conversion():
    scores = np.zeros((2, 4, 8))
    table = Shifty(scores[0, :4, :2], scores[0, :4, :2].copy())
    with pytest.raises(ValueError, match=r"table overlaps scores"):
        fastpe.add_relative_bias(scores, table)
    assert not scores.any()


@pytest.mark.parametrize("name", ["slopes", "key_mask", "q_positions", "k_positions"])
def test_alibi_arrays_inside_the_scores_are_refused(name):
    """Plain arrays that are part of the scores' own memory, given as the slopes, the
    mask or positions: refused as the reference refuses them, scores untouched (the
    compiled entry takes these arguments from the caller's arrays itself)."""
    scores = np.zeros((1, 2, 3, 8))
    inside = {"slopes": scores[0, 0, 0, :2], "key_mask": scores[0, 0, 0].view(np.int64),
              "q_positions": scores[0, 0, 0, :3].view(np.int64),
              "k_positions": scores[0, 0, 0].view(np.int64)}[name]
    with pytest.raises(ValueError, match=rf"{name} overlaps scores"):
        fastpe.add_alibi(scores, **{name: inside})
    assert not scores.any()


@pytest.mark.parametrize("fast", [True, False])
def test_a_float_subclass_is_read_through_its_float(fast):
    """Both paths take float(x): the compiled fast path may not read the raw value."""
    x = np.zeros((4, 8), np.float32) + 1
    want = x.copy()
    fastpe.reference.add_sinusoidal(want, scale=2.0)
    positions = None if fast else np.arange(4)
    fastpe.add_sinusoidal(x, positions, scale=Lying(8.0))
    np.testing.assert_allclose(x, want, rtol=2e-7, atol=2e-7)
    q = np.ones((1, 4, 1, 8))
    fastpe.apply_rope(q, base=Lying(8.0))
    r = np.ones((1, 4, 1, 8))
    fastpe.apply_rope(r, base=2.0)
    assert_bytes_equal(q, r)


def _interleaved_views():
    """q and k of one buffer, disjoint, interleaved within each token's row (q's
    elements at 0, 2, 3, 5, k's at 1, 4) so that neither their byte ranges nor the
    lattice proof tells them apart."""
    buf = np.zeros(700 * 8 + 8, np.float32)
    s = buf.itemsize
    q = np.lib.stride_tricks.as_strided(buf, (1, 700, 2, 2), (0, 8 * s, 3 * s, 2 * s))
    k = np.lib.stride_tricks.as_strided(buf[1:], (1, 700, 1, 2), (0, 8 * s, 8 * s, 3 * s))
    return q, k


def test_interleaved_views_are_told_apart_by_a_bounded_search():
    q, k = _interleaved_views()
    assert not np.shares_memory(q, k)
    assert not fastpe._checks.lattice_apart(q, k)
    expect_q, expect_k = q.copy(), k.copy()
    fastpe.reference.apply_rope(expect_q, expect_k)
    fastpe.apply_rope(q, k)
    assert_bytes_equal(q, expect_q)
    assert_bytes_equal(k, expect_k)


def test_views_that_cannot_be_proven_apart_within_the_bound_are_refused(monkeypatch):
    """Past the bounded search the call refuses at once, naming both, rather than
    searching for minutes; nothing is written."""
    monkeypatch.setattr(fastpe._checks, "SHARES_MEMORY_WORK", 1)
    q, k = _interleaved_views()
    with pytest.raises(ValueError, match=r"\bq and k\b.*cannot prove disjoint"):
        fastpe.apply_rope(q, k)
    assert not q.any() and not k.any()


def test_lattice_proof_against_exact_search():
    """The lattice proof never calls overlapping views apart: random views of one buffer,
    held to np.shares_memory's exact answer."""
    rng = np.random.default_rng(1)
    buf = np.zeros(4096, np.float32)
    proven = 0
    for _ in range(3000):
        views = []
        for _ in range(2):
            nd = int(rng.integers(1, 4))
            shape = tuple(int(n) for n in rng.integers(1, 6, nd))
            strides = tuple(int(st) * 4 for st in rng.integers(-40, 41, nd))
            span = sum(abs(st) * (n - 1) for st, n in zip(strides, shape)) + 4
            start = int(rng.integers(0, buf.nbytes - span)) // 4 * 4
            start += sum(-st * (n - 1) for st, n in zip(strides, shape) if st < 0)
            views.append(np.lib.stride_tricks.as_strided(buf[start // 4:], shape, strides))
        if fastpe._checks.lattice_apart(*views):
            proven += 1
            assert not np.shares_memory(*views), [(v.shape, v.strides) for v in views]
    assert proven > 100


def _assert_child_exits_cleanly(code, timeout):
    """Run `code`, which forks a child (pid) that exits 0 when all is well; a child that
    hangs fails the test at the timeout."""
    proc = run_python(code + f"""
import time
deadline = time.monotonic() + {timeout / 2}
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if done[0] == 0:
    os.kill(pid, 9)   # hung: killed, not left behind
    os.waitpid(pid, 0)
    print("child hung")
else:
    print("child", os.waitstatus_to_exitcode(done[1]))
""", timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "child 0" in proc.stdout, proc.stdout


# a forked child's threaded call (every size threaded), checked against the table: `ok`
_THREADED_CALL_IN_CHILD = """
    fastpe._threads.SERIAL_BYTES = 0
    x = np.zeros((4, 1024, 256), np.float32)
    fastpe.add_sinusoidal(x, num_threads=2)
    ok = np.array_equal(x[0], fastpe.sinusoidal_table(1024, 256))"""


def _threaded_call_after(fork: str, in_child: str = "") -> str:
    """Code that runs `fork` (setting pid), then in the child `in_child` and a threaded
    call, exiting 0 when its result is right."""
    return (fork + "\nif pid == 0:" + in_child + _THREADED_CALL_IN_CHILD
            + "\n    os._exit(0 if ok else 3)\n")


def test_fork_after_torch_ran_a_team_then_a_threaded_call_in_the_child():
    """torch and fastpe share libgomp; its pool does not survive fork(): the child
    runs fastpe serially instead of hanging in GOMP_parallel."""
    pytest.importorskip("torch")
    _assert_child_exits_cleanly(_threaded_call_after("""
import os, sys, numpy as np, torch, fastpe, fastpe._threads
torch.set_num_threads(2)
a = torch.randn(256, 256); (a @ a).sum()
torch.randn(1 << 20).exp_()
pid = os.fork()"""), timeout=120)


@pytest.mark.skipif(not hasattr(os, "fork") or not fastpe._backend.compiled,
                    reason="needs fork() and the compiled kernels")
def test_a_fork_from_c_code_runs_serially_in_the_child():
    """fork() called from C (here through ctypes) runs none of Python's fork hooks; the
    kernels' own pthread_atfork handler keeps the child's threaded call on one thread,
    whatever count reaches them (here 2: the Python side made to take the child for the
    process that imported fastpe), instead of hanging in the pool the parent's threaded
    call left."""
    _assert_child_exits_cleanly(_threaded_call_after("""
import ctypes, os, numpy as np, fastpe, fastpe._threads
fastpe._threads.SERIAL_BYTES = 0
warm = np.zeros((4, 1024, 256), np.float32)
fastpe.add_sinusoidal(warm, num_threads=2)   # the parent's pool, then the fork
pid = ctypes.CDLL(None, use_errno=True).fork()""", """
    fastpe._threads._import_pid = os.getpid()"""), timeout=60)


@pytest.mark.skipif(not hasattr(os, "fork") or not fastpe._backend.compiled,
                    reason="needs fork() and the compiled kernels")
def test_a_fork_from_c_code_reports_the_one_thread_its_kernels_use():
    """The child of a fork from C code runs every kernel on one thread (the kernels'
    pthread_atfork handler): get_num_threads() and info() say so, where they reported
    the parent's count."""
    code = """
import ctypes, os, fastpe
fastpe.set_num_threads(None)
if fastpe.get_num_threads() < 2:
    fastpe.set_num_threads(2)
pid = ctypes.CDLL(None, use_errno=True).fork()
if pid == 0:
    ok = fastpe.get_num_threads() == 1 and fastpe.info()["num_threads"] == 1
    os._exit(0 if ok else 3)
"""
    _assert_child_exits_cleanly(code, timeout=60)


def test_a_child_that_imports_fastpe_after_the_fork_runs_serially():
    """torch ran a team, then fork(), and fastpe is imported only in the child: fastpe's
    fork hook never ran, yet the child shares the parent's dead libgomp pool. The child
    sees the runtime it inherited and runs serially instead of hanging; a program
    started by exec from the same parent, and a fork child whose parent had no OpenMP
    runtime loaded, keep their threads."""
    pytest.importorskip("torch")
    code = """
import os, subprocess, sys, numpy as np, torch
torch.set_num_threads(2)
torch.randn(1 << 20).exp_()
pid = os.fork()
if pid == 0:
    import fastpe, fastpe._threads
""" + _THREADED_CALL_IN_CHILD + """
    os._exit(0 if ok and fastpe.get_num_threads() == 1 and fastpe._fork.INHERITED_RUNTIME
             else 3)
_, status = os.waitpid(pid, 0)
print("forked child", os.waitstatus_to_exitcode(status))
exec_child = subprocess.run([sys.executable, "-c", "import torch, fastpe; "
                             "print(fastpe._fork.INHERITED_RUNTIME)"],
                            capture_output=True, text=True, timeout=120)
print("exec child", exec_child.stdout.strip())
"""
    proc = run_python(code, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "forked child 0" in proc.stdout and "exec child False" in proc.stdout, proc.stdout
    plain = run_python("""
import os
pid = os.fork()
if pid == 0:
    import fastpe
    os._exit(0 if not fastpe._fork.INHERITED_RUNTIME else 3)
_, status = os.waitpid(pid, 0)
print("fresh child", os.waitstatus_to_exitcode(status))
""", timeout=120)
    assert "fresh child 0" in plain.stdout, plain.stdout + plain.stderr[-2000:]


def test_fork_while_another_thread_holds_the_frequency_lock():
    """A child forked while another thread inserts into a frequency cache does not wait
    forever on its first new dynamic NTK length."""
    code = """
import os, threading, numpy as np, fastpe
from fastpe import _rope_scaling
spec = fastpe.RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 2.0},
                              max_position_embeddings=16)
held = threading.Event(); release = threading.Event()
def hold():
    with _rope_scaling._cache_lock:
        held.set(); release.wait()
t = threading.Thread(target=hold); t.start(); held.wait()
pid = os.fork()
if pid == 0:
    q = np.zeros((1, 40, 1, 64))
    spec(q, positions=np.arange(40))
    os._exit(0)
release.set(); t.join()
"""
    _assert_child_exits_cleanly(code, timeout=60)


def test_positions_rewritten_by_another_thread_never_crash():
    """Another thread rewriting the positions of a cached rotation and of a learned add
    while they run: odd numbers at worst, never a read past the cache or table."""
    code = """
import threading, numpy as np, fastpe
n = 4096
pos = np.zeros(n, np.int64)
cos = np.ones((n, 32), np.float32); sin = np.zeros((n, 32), np.float32)
table = np.ones((n, 64), np.float32)
stop = threading.Event()
def rewrite():
    while not stop.is_set():
        pos[:] = 1 << 40
        pos[:] = 0
t = threading.Thread(target=rewrite, daemon=True); t.start()
q = np.zeros((1, n, 1, 64), np.float32); x = np.zeros((1, n, 64), np.float32)
errors = 0
try:
    for _ in range(300):
        for call in (lambda: fastpe.apply_rope_cached(q, None, cos, sin, pos),
                     lambda: fastpe.add_learned(x, table, pos)):
            try:
                call()
            except (IndexError, ValueError):
                errors += 1
finally:
    stop.set()
t.join()
print("done", errors)
"""
    proc = run_python(code, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stdout


@pytest.mark.parametrize("dtype", ["uint1", "uint4", "int4", "uint7"])
def test_sub_byte_integer_tensors_are_refused_as_positions(dtype):
    """torch's 1- to 7-bit integers, which DLPack exports as 8-bit ones: a TypeError
    naming positions, never their bytes read as positions."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    pos = torch.tensor([0, 5, 100], dtype=torch.uint8).view(getattr(torch, dtype))
    q = np.ones((1, 3, 1, 8), np.float32)
    for args in ((q.copy(), None, pos), (torch.ones(1, 3, 1, 8), None, pos)):
        with pytest.raises(TypeError, match="positions"):
            fastpe.apply_rope(*args, layout="bshd")


def test_huge_inverse_frequencies_do_not_differ_between_backends():
    """A base so small that inverse frequencies reach 1e280: refused, or equal on both
    backends; never whole-radian differences."""
    q = np.ones((1, 3, 1, 8))
    try:
        fastpe.apply_rope(q, base=1e-320)
    except ValueError as exc:
        assert "base" in str(exc)
        return
    r = np.ones((1, 3, 1, 8))
    with fastpe.use_backend("numpy"):
        fastpe.apply_rope(r, base=1e-320)
    assert math.isclose(float(np.abs(q - r).max()), 0.0, abs_tol=1e-6)


@pytest.mark.parametrize("where", ["q", "k"])
def test_frequencies_in_a_gap_of_q_or_k_are_read_from_a_copy(where):
    """Frequencies in the gaps between q's (or k's) strided elements share no memory with
    them: the validating path proves it, the compiled entry's bounded proof does not, and
    the call rotates from a copy of them (before: a RuntimeError, q already rotated)."""
    base = np.random.default_rng(0).standard_normal(28)
    inside = base[:26].reshape(1, 2, 1, 13)[..., :12:3]     # elements 0, 3, 6, 9, 13, ...
    freqs = base[1:3]
    freqs[...] = [1.0, 0.01]                                 # in the first gap
    other = np.random.default_rng(1).standard_normal((1, 2, 1, 4))
    q, k = (inside, other) if where == "q" else (other, inside)
    want_q, want_k = q.copy(), k.copy()
    fastpe.reference.apply_rope(want_q, want_k, freqs=freqs.copy())
    fastpe.apply_rope(q, k, freqs=freqs)
    np.testing.assert_allclose(q, want_q, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(k, want_k, rtol=1e-13, atol=1e-13)
    assert np.array_equal(freqs, [1.0, 0.01])
