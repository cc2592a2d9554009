"""The one place that decides how many threads a kernel call uses.

The default is the OpenMP maximum, capped (unless ``OMP_NUM_THREADS`` says
otherwise) by the CPUs this process may really use: its CPU affinity and its
cgroup CPU quota, as scikit-learn and loky count them. A container limited to 2
CPUs on a 64-core host runs 2 threads, not 64.

A process forked after fastpe ran a threaded call runs every later call on one
thread: GNU OpenMP's thread pool does not survive fork(), and the child's first
parallel region would wait forever for the parent's threads (PyTorch's
intra-op pool does the same). So does a forked child that imports fastpe for the
first time, where its parent had the OpenMP runtime loaded (fastpe._fork).
Processes started with "spawn" or "forkserver" keep their threads.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from . import _backend, _checks, _constants, _fork

# Waking an OpenMP team costs about a microsecond on an idle machine and several
# on a shared 2-CPU VM, where calls touching 2 MiB (read and written: a (32, 1, 32,
# 128) batched RoPE decode, causal ALiBi on (1, 16, 64, 256) scores) took 1.2-1.35x
# the time on two threads than on one, calls touching 4 MiB the same time either way
# and larger ones less on two (an Intel Xeon, 2 MiB of L2 a core); below this many
# bytes touched a call runs on one thread.
SERIAL_BYTES = 4 * 1024 * 1024

# More threads than this is a mistake, not a request: OpenMP runtimes abort the
# whole process when they cannot create a team (libgomp: "Thread creation
# failed"), and past a few threads per CPU a memory-bound kernel only slows down.
MAX_THREADS = max(_constants.MAX_THREADS_FLOOR, 8 * (os.cpu_count() or 1))

CGROUP_ROOT = "/sys/fs/cgroup"

_user_threads: int | None = None
_cgroup_budget: int | None = None  # CPUs the cgroup quota allows; 0: no quota
# a fork() child: the parent's OpenMP runtime came with the fork (fastpe._fork, read at
# import), or the process is not the one that imported fastpe (_in_fork_child)
_forked = _fork.INHERITED_RUNTIME
_import_pid = os.getpid()


def _in_fork_child() -> bool:
    # Whatever ran a team before the fork (fastpe, or torch and NumPy's BLAS on the same
    # libgomp), the child's OpenMP pool may be a dead copy: a parallel region there can
    # hang, so every forked child runs fastpe serially. The process id tells every fork
    # apart, C code's too (which run none of Python's fork hooks; the kernels' own
    # pthread_atfork handler keeps them on one thread whatever they are asked).
    global _forked
    if not _forked and os.getpid() != _import_pid:
        _forked = True
    return _forked


def _cgroup_cpus(root: str) -> float | None:
    """CPUs the cgroup quota allows (quota / period), or None without a quota.

    cgroup v2 writes "quota period" (or "max period") in cpu.max; v1 has
    cpu.cfs_quota_us (-1 for none) and cpu.cfs_period_us."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period) if int(period) > 0 and int(quota) > 0 else None
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (read each time: a
    process may be pinned after it started), capped by the cgroup quota under
    CGROUP_ROOT (read once) rounded up: a quota of 1.5 CPUs keeps two threads
    busy part of the time."""
    global _cgroup_budget
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    if _cgroup_budget is None:
        quota = _cgroup_cpus(CGROUP_ROOT)
        _cgroup_budget = 0 if quota is None else max(math.ceil(quota), 1)
    return max(min(cpus, _cgroup_budget) if _cgroup_budget else cpus, 1)


INT_MAX = 2**31 - 1


def _env_count(name: str) -> int | None:
    """The first count of the OpenMP variable `name` ("4" or "4,2"), as GNU OpenMP reads
    it: each count a positive integer below 2**63 (it stores them in longs), "+"
    allowed; None where it ignores the variable (unset, "0", "abc", "4,x")."""
    counts = [part.strip().removeprefix("+") for part in os.environ.get(name, "").split(",")]
    if not all(c.isdigit() and c.isascii() and 0 < int(c) < 2**63 for c in counts):
        return None
    return int(counts[0])


def _truncated(value: int) -> int:
    """`value` as a C int holds it (two's complement, 32 bits)."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _openmp_max() -> int:
    compiled = _backend.compiled
    if compiled is None:
        return 1
    n: int = compiled.openmp_max_threads()
    request = _env_count("OMP_NUM_THREADS")
    if request is not None:
        # an explicit request, as OpenMP itself reads it, within the cap set_num_threads
        # holds: past it OpenMP aborts the process when it cannot start the team.
        # omp_get_max_threads() returns the request cast to an int: one past INT_MAX
        # reads as negative, 0 or a small count (OMP_NUM_THREADS=4294967296 gave 0
        # threads, and a kernel given a team of 0 corrupts the heap); such a request is
        # one past the cap. A value OpenMP ignores ("0", "abc") is no request: the
        # default's cap (usable_cpus) holds.
        if n < 1 or (request > INT_MAX and n == _truncated(request)):
            limit = _env_count("OMP_THREAD_LIMIT")
            n = MAX_THREADS if limit is None else min(limit, MAX_THREADS)
        return max(min(n, MAX_THREADS), 1)
    return max(min(n, usable_cpus()), 1)


def _as_count(value: Any, name: str) -> int:
    n = _checks.count(value, name, minimum=None)
    if n == 0:
        raise ValueError(f"{name} must be a positive thread count, or negative to count back "
                         f"from the maximum (-1 = all); got 0")
    if n > MAX_THREADS:
        raise ValueError(f"{name} must be at most {MAX_THREADS} (8 threads per CPU, "
                         f"{_constants.MAX_THREADS_FLOOR} at least): OpenMP aborts the "
                         f"process when it cannot start a team; "
                         f"got {n}")
    if n < 0:
        n = max(_openmp_max() + 1 + n, 1)
    return n


def set_num_threads(n: int | None) -> None:
    """Threads for calls that don't pass num_threads; None restores the default
    (the OpenMP maximum, which honours OMP_NUM_THREADS and threadpoolctl, capped
    by the CPU affinity and cgroup quota when OMP_NUM_THREADS is not set).
    Negative counts back from the maximum: -1 is all of them. At most
    max(256, 8 * os.cpu_count()) threads."""
    global _user_threads
    _user_threads = None if n is None else _as_count(n, "n")
    if _user_threads is not None and _user_threads > 1 and not _threaded():
        warnings.warn("fastpe runs every call on one thread: its kernels were built without "
                      "OpenMP, or are not built (python -m fastpe info says which)",
                      RuntimeWarning, stacklevel=2)


def _threaded() -> bool:
    """Whether the kernels can run a team: built, and with OpenMP."""
    compiled = _backend.compiled
    return compiled is not None and bool(compiled.OPENMP)


def get_num_threads() -> int:
    """Threads a call with num_threads=None may use (1 in a forked child, and where
    the kernels cannot run a team, whatever set_num_threads asked)."""
    if _in_fork_child() or not _threaded():
        return 1
    return _user_threads if _user_threads is not None else _openmp_max()


def check(num_threads: object) -> int | None:
    """A call's num_threads argument, validated: None or a positive count."""
    return None if num_threads is None else _as_count(num_threads, "num_threads")


def resolve(num_threads: int | None, nbytes: int) -> int:
    """Threads for one call touching `nbytes` bytes (num_threads from check()):
    small work stays serial. The compiled fast paths pass num_threads here
    unchecked, so the cap is enforced here too."""
    if num_threads is not None and num_threads > MAX_THREADS:
        check(num_threads)  # raises, naming num_threads
    if nbytes < SERIAL_BYTES or _in_fork_child():
        return 1
    return get_num_threads() if num_threads is None else num_threads
