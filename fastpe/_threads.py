"""The one place that decides how many threads a kernel call uses."""

from __future__ import annotations

from typing import Any

from . import _backend, _checks

# Entering an OpenMP region costs about a microsecond; below this many bytes
# touched a call is cheaper on one thread than on a team.
SERIAL_BYTES = 256 * 1024

_user_threads: int | None = None


def _openmp_max() -> int:
    compiled = _backend.compiled
    return compiled.openmp_max_threads() if compiled is not None else 1


def _as_count(n: Any, name: str) -> int:
    n = _checks.count(n, name, minimum=None)
    if n == 0:
        raise ValueError(f"{name} must be a positive thread count, or negative to count back "
                         f"from the maximum (-1 = all); got 0")
    if n < 0:
        n = max(_openmp_max() + 1 + n, 1)
    return n


def set_num_threads(n: int | None) -> None:
    """Threads for calls that don't pass num_threads; None restores the default
    (the OpenMP maximum, which honours OMP_NUM_THREADS and threadpoolctl).
    Negative counts back from the maximum: -1 is all of them."""
    global _user_threads
    _user_threads = None if n is None else _as_count(n, "n")


def get_num_threads() -> int:
    """Threads a call with num_threads=None may use."""
    return _user_threads if _user_threads is not None else _openmp_max()


def check(num_threads: object) -> int | None:
    """A call's num_threads argument, validated: None or a positive count."""
    return None if num_threads is None else _as_count(num_threads, "num_threads")


def resolve(num_threads: int | None, nbytes: int) -> int:
    """Threads for one call touching `nbytes` bytes (num_threads from check()):
    small work stays serial."""
    if nbytes < SERIAL_BYTES:
        return 1
    return get_num_threads() if num_threads is None else num_threads
