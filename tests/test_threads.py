"""Threads: the default is the OpenMP maximum (OMP_NUM_THREADS, threadpoolctl), set/get,
negative counts, errors, and identical results for every thread count."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import F32, F64, assert_bytes_equal, assert_close, pe_exact, run_python

import fastpe
from fastpe import _backend, _threads

OPENMP = fastpe.info()["openmp"]
needs_openmp = pytest.mark.skipif(not OPENMP, reason="fastpe was built without OpenMP")


def cpus() -> int:
    """CPUs this process may run on: what an OpenMP runtime takes as its default team."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


THREADS = ("import json, fastpe; "
           "print(json.dumps([fastpe.get_num_threads(), fastpe.info()['num_threads']]))")


def _threads_in_subprocess(**env) -> list[int]:
    proc = run_python(THREADS, **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_openmp
def test_default_is_the_openmp_maximum():
    """With no OMP_* variables the OpenMP maximum is one thread per available CPU."""
    assert _threads_in_subprocess() == [cpus(), cpus()]


@needs_openmp
@pytest.mark.parametrize("n", [1, 3])
def test_honours_omp_num_threads(n):
    assert _threads_in_subprocess(OMP_NUM_THREADS=str(n)) == [n, n]


@needs_openmp
@pytest.mark.parametrize("env", [{"OMP_THREAD_LIMIT": "1"},
                                 {"OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "3"}])
def test_omp_thread_limit_bounds_the_count(env):
    """OpenMP holds every team to OMP_THREAD_LIMIT, whatever is asked: the count says
    so."""
    assert _threads_in_subprocess(**env) == [1, 1]


@needs_openmp
def test_omp_num_threads_past_the_cap_is_held_to_it():
    """OMP_NUM_THREADS=100000 is honoured up to set_num_threads' cap, past which OpenMP
    aborts the process when it cannot start the team."""
    cap = fastpe._threads.MAX_THREADS
    assert _threads_in_subprocess(OMP_NUM_THREADS="100000") == [cap, cap]


@needs_openmp
@pytest.mark.parametrize("value,limit", [("4294967296", None), ("2147483648", None),
                                         ("999999999999", None), ("4294967297", None),
                                         ("4294967296", "3")])
def test_omp_num_threads_past_an_int_is_held_to_the_cap(value, limit):
    """omp_get_max_threads() returns OMP_NUM_THREADS cast to a C int: past 2**31 - 1 it
    reads as 0 (4294967296: a team of 0, which corrupted the heap on the next large
    call), negative (a MemoryError on every large call) or 1. Such a request is past
    the cap, and held to it (or to OMP_THREAD_LIMIT); a large call then runs."""
    want = _threads.MAX_THREADS if limit is None else int(limit)
    code = (THREADS + "\nimport numpy as np\nx = np.zeros((2, 1024, 512), np.float32)\n"
            "fastpe.add_sinusoidal(x)\nassert x.any()\nprint('ran')")
    proc = run_python(code, OMP_NUM_THREADS=value, OMP_THREAD_LIMIT=limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-2]) == [want, want] and lines[-1] == "ran"


@pytest.mark.parametrize("missing", ["openmp", "kernels"])
def test_without_openmp_a_set_count_warns_and_every_call_counts_one(missing, monkeypatch):
    """Kernels built without OpenMP (or not built) run every call on one thread: a count
    asked for says so, and get_num_threads() reports what calls use."""
    if missing == "kernels":
        monkeypatch.setattr(_backend, "compiled", None)
    elif _backend.compiled is not None:
        monkeypatch.setattr(_backend.compiled, "OPENMP", False)
    with pytest.warns(RuntimeWarning, match="without OpenMP, or are not built"):
        fastpe.set_num_threads(3)
    try:
        assert fastpe.get_num_threads() == 1 and fastpe.info()["num_threads"] == 1
        assert not fastpe.info()["openmp"]
    finally:
        fastpe.set_num_threads(None)


def test_without_openmp_default_is_one():
    if OPENMP:
        # the same logic, seen from a build whose extension is missing
        proc = run_python("import sys; sys.modules['fastpe._kernels'] = None\n" + THREADS,
                          OMP_NUM_THREADS="4")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, 1]
    else:
        assert fastpe.get_num_threads() == 1


@needs_openmp
def test_honours_threadpoolctl():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    fastpe.set_num_threads(None)
    openmp = [lib for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "openmp"]
    if not openmp:
        pytest.skip("threadpoolctl does not see an OpenMP runtime in this process")
    default = fastpe.get_num_threads()
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert fastpe.get_num_threads() == 1, (
            f"threadpool_limits(1) did not reach fastpe's OpenMP runtime; threadpoolctl "
            f"sees {[lib['filepath'] for lib in openmp]}")
        x = np.zeros((4, 1024, 256), np.float32)  # at the serial threshold: threaded
        fastpe.add_sinusoidal(x)
    assert fastpe.get_num_threads() == default


@needs_openmp
def test_set_and_reset():
    default = fastpe.get_num_threads()
    fastpe.set_num_threads(3)
    assert fastpe.get_num_threads() == 3
    assert fastpe.info()["num_threads"] == 3
    fastpe.set_num_threads(1)
    assert fastpe.get_num_threads() == 1
    fastpe.set_num_threads(None)
    assert fastpe.get_num_threads() == default


@needs_openmp
def test_set_accepts_numpy_integers():
    fastpe.set_num_threads(np.int64(2))
    assert fastpe.get_num_threads() == 2 and type(fastpe.get_num_threads()) is int


@needs_openmp
def test_negative_counts_back_from_the_maximum():
    fastpe.set_num_threads(None)
    top = fastpe.get_num_threads()
    fastpe.set_num_threads(-1)
    assert fastpe.get_num_threads() == top
    fastpe.set_num_threads(-2)
    assert fastpe.get_num_threads() == max(top - 1, 1)
    fastpe.set_num_threads(-10_000)
    assert fastpe.get_num_threads() == 1


@needs_openmp
@pytest.mark.parametrize("bad,exc", [(0, ValueError), ("2", TypeError), (True, TypeError),
                                     (2.0, TypeError)], ids=["0", "str", "bool", "float"])
def test_bad_counts(bad, exc):
    fastpe.set_num_threads(2)
    with pytest.raises(exc, match=r"\bn\b"):
        fastpe.set_num_threads(bad)
    assert fastpe.get_num_threads() == 2  # unchanged by the failed call
    x = np.zeros((2, 8, 4))
    with pytest.raises(exc, match=r"\bnum_threads\b"):
        fastpe.add_sinusoidal(x, num_threads=bad)
    assert not x.any()


def test_call_argument_overrides_the_setting():
    """num_threads= per call, including more threads than CPUs and -1, gives the same bits
    as the process setting (on an x big enough to be threaded)."""
    x = np.random.default_rng(0).uniform(-1, 1, (4, 1024, 256)).astype(np.float32)
    assert 2 * x.nbytes >= _threads.SERIAL_BYTES
    fastpe.set_num_threads(1)
    want = fastpe.add_sinusoidal(x.copy())
    for n in (2, -1, 64):
        assert_bytes_equal(fastpe.add_sinusoidal(x.copy(), num_threads=n), want,
                           f"num_threads={n}")


# ---- results identical for every thread count, on work big enough to be threaded -----------


def _big(dtype, seed=0):
    # 4 x 1024 x 256 float32 = 4 MiB: calls touching less than SERIAL_BYTES stay serial
    x = np.random.default_rng(seed).uniform(-2, 2, (4, 1024, 256)).astype(dtype)
    assert x.nbytes >= _threads.SERIAL_BYTES
    return x


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("positions", ["none", "per-row"])
def test_large_add_sinusoidal_identical_for_1_2_3_threads(positions, dtype):
    pos = None if positions == "none" else \
        np.random.default_rng(1).integers(0, 2**20, (4, 1024))
    results = []
    for n in (1, 2, 3):
        x = _big(dtype)
        fastpe.add_sinusoidal(x, pos, scale=16.0, num_threads=n)
        results.append(x)
    for n, r in zip((2, 3), results[1:]):
        assert_bytes_equal(r, results[0], f"add_sinusoidal {dtype} positions={positions} "
                                          f"num_threads={n} vs 1")
    full = np.broadcast_to(np.arange(1024), (4, 1024)) if pos is None else pos
    assert_close(results[0], _big(dtype).astype(np.float64) * 16 + pe_exact(full, 256), dtype,
                 magnitude=33.0, max_position=full.max(), context="add_sinusoidal large")


def test_large_table_and_learned_identical_for_1_2_3_threads():
    tables = [fastpe.sinusoidal_table(4096, 256, offset=5, num_threads=n) for n in (1, 2, 3)]
    for n, t in zip((2, 3), tables[1:]):
        assert_bytes_equal(t, tables[0], f"sinusoidal_table num_threads={n}")
    table = _big(np.float32, seed=3)[0]
    out = []
    for n in (1, 2, 3):
        x = _big(np.float32)
        fastpe.add_learned(x, table, np.random.default_rng(4).integers(0, 1024, (4, 1024)),
                           num_threads=n)
        out.append(x)
    for n, r in zip((2, 3), out[1:]):
        assert_bytes_equal(r, out[0], f"add_learned num_threads={n}")


# ---- the default respects CPU affinity and the cgroup CPU quota -----------------------------


@pytest.fixture
def fresh_budget(monkeypatch):
    """The CPU budget recomputed from what the test sets up, restored afterwards."""
    monkeypatch.setattr(_threads, "_cgroup_budget", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fastpe.set_num_threads(None)
    yield monkeypatch
    monkeypatch.setattr(_threads, "_cgroup_budget", None)


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "100000 100000\n"}, 1),                        # cgroup v2, one CPU
    ({"cpu.max": "150000 100000\n"}, 2),                        # 1.5 CPUs: two threads
    ({"cpu.max": "max 100000\n"}, None),                        # no quota
    ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),                                                 # no cgroup files at all
], ids=["v2-1", "v2-1.5", "v2-max", "v1-0.5", "v1-none", "none"])
def test_usable_cpus_reads_the_cgroup_quota(tmp_path, fresh_budget, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    fresh_budget.setattr(_threads, "CGROUP_ROOT", str(tmp_path))
    assert _threads.usable_cpus() == (cpus() if quota is None else min(quota, cpus()))


@needs_openmp
def test_default_is_capped_by_the_cgroup_quota(tmp_path, fresh_budget):
    """A container limited to one CPU gets one thread, whatever the host has; an explicit
    OMP_NUM_THREADS still wins (as scikit-learn does)."""
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    fresh_budget.setattr(_threads, "CGROUP_ROOT", str(tmp_path))
    assert fastpe.get_num_threads() == 1
    assert fastpe.info()["num_threads"] == 1
    fresh_budget.setenv("OMP_NUM_THREADS", "3")
    assert fastpe.get_num_threads() == _backend.compiled.openmp_max_threads()
    fresh_budget.setenv("OMP_NUM_THREADS", " +3")   # OpenMP's strtoul takes these
    assert fastpe.get_num_threads() == _backend.compiled.openmp_max_threads()
    # values OpenMP ignores (a warning, then its default): no request, the cap holds
    for ignored in ("abc", "0", "-2", "0x10", "3,x", "\u0663", ""):
        fresh_budget.setenv("OMP_NUM_THREADS", ignored)
        assert fastpe.get_num_threads() == 1, ignored


@needs_openmp
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or cpus() < 2,
                    reason="needs CPU affinity control and two CPUs")
def test_default_follows_affinity_set_after_import():
    """OpenMP reads the affinity mask once, when it starts; a process pinned later (taskset
    -p, a job scheduler) gets a team the size of its new mask."""
    proc = run_python("import os, fastpe\n"
                      "fastpe.add_sinusoidal(__import__('numpy').zeros((4096, 256), 'f4'))\n"
                      "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
                      "print(fastpe.get_num_threads())", OMP_NUM_THREADS=None)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1"]


# ---- the thread cap ------------------------------------------------------------------------


def test_thread_cap():
    """More than MAX_THREADS threads is a ValueError naming the argument, before anything
    is written, on the general and the fast paths; the cap itself is accepted."""
    cap = _threads.MAX_THREADS
    assert cap >= max(256, 8 * (os.cpu_count() or 1))
    if OPENMP:
        fastpe.set_num_threads(cap)
        assert fastpe.get_num_threads() == cap
        fastpe.set_num_threads(None)
    for n in (cap + 1, 40000, 2**40, 2**100):
        with pytest.raises(ValueError, match=r"\bn must be at most"):
            fastpe.set_num_threads(n)
        x = np.zeros((1, 4, 70000, 1), np.float32)     # big enough to be threaded
        with pytest.raises(ValueError, match=r"\bnum_threads must be at most"):
            fastpe.add_alibi(x, q_offset=0, num_threads=n)
        with pytest.raises(ValueError, match=r"\bnum_threads must be at most"):
            fastpe.add_sinusoidal(x[0, 0], num_threads=n)
        assert not x.any()
