"""Turn ``fastpe._bench`` workloads into pytest-benchmark cases.

A case is (workload, dtype, implementation, threads). fastpe and each form of the floor
(``floor:numpy``, ``floor:c``, ``floor:c-ahead``, ``floor:c-nt``: fastpe._bench.floors)
run on one thread and on all of them; the NumPy-based implementations (reference, numpy, textbook) and
torch on one. Every case:

- prepares its implementation once (temporaries, cached tables: untimed);
- runs it once on pristine inputs and checks the result against ``fastpe.reference``
  (the floor: that it left the values unchanged), outside the timed region;
- is timed with ``benchmark.pedantic``, each round on a fresh copy of the arrays the call
  writes in place (copied into a buffer allocated once, so no page faults in the setup);
  the number of rounds comes from the first call's time (about BUDGET_S of timed calls,
  between MIN_ROUNDS and MAX_ROUNDS; one round per call, so decode times are per call).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

import fastpe
from fastpe import _bench

THREADS = sorted({1, fastpe.get_num_threads()})
BUDGET_S = 0.25
MIN_ROUNDS = 3
MAX_ROUNDS = 1000
SLOW_S = 1.0        # one call slower than this (the reference on big arrays): 1 round

_cache: dict = {}


def _cached(key, make: Callable):
    """One entry per kind: the inputs and expected results of the current (workload,
    dtype). Cases are ordered by workload and dtype, so each is built once."""
    kind = key[0]
    hit = _cache.get(kind)
    if hit is not None and hit[0] == key:
        return hit[1]
    _cache.pop(kind, None)      # free the previous workload's arrays first
    value = make()
    _cache[kind] = (key, value)
    return value


def inputs(wl: _bench.Workload, dtype: str) -> _bench.Arrays:
    return _cached(("inputs", wl.name, dtype), lambda: wl.make(np.dtype(dtype)))


def expected(wl: _bench.Workload, dtype: str) -> tuple:
    return _cached(("expected", wl.name, dtype), lambda: wl.expected(inputs(wl, dtype)))


def cases(workloads: list[_bench.Workload], unavailable: dict[str, str] | None = None):
    """pytest.param(workload, dtype, impl, threads) for every case, grouped by workload
    and dtype. `unavailable` maps an implementation name to the reason it is skipped."""
    unavailable = unavailable or {}
    out = []
    for wl in workloads:
        for dtype in _bench.DTYPES:
            floors = [f"floor:{form}" for form in _bench.floors.forms(wl.floor, wl.result, wl.reads)]
            names = (list(wl.impls) + list(wl.peers)
                     + [n for n in unavailable if n not in wl.impls] + floors)
            for impl in names:
                threads = THREADS if impl == "fastpe" or impl in floors else [1]
                for t in threads:
                    marks = ([pytest.mark.skip(reason=unavailable[impl])]
                             if impl in unavailable else [])
                    out.append(pytest.param(wl, dtype, impl, t, marks=marks,
                                            id=f"{wl.name}-{dtype}-{impl}-t{t}"))
    return out


def run_case(benchmark, wl: _bench.Workload, dtype: str, impl: str, threads: int) -> None:
    base = inputs(wl, dtype)
    floor = impl.startswith("floor:")
    prepare = (_bench.floors.forms(wl.floor, wl.result, wl.reads)[impl.partition(":")[2]] if floor
               else {**wl.peers, **wl.impls}[impl])
    work = _bench.copy_arrays(base, wl.written)
    run = prepare(work, threads)
    if run is None:
        pytest.skip(f"{impl} does not run on {dtype}")

    # The check, on pristine inputs, outside the timed region.
    t0 = time.perf_counter()
    got = run(work)
    first = time.perf_counter() - t0
    if floor:
        if wl.floor == "stream":
            for n in wl.result:
                assert np.array_equal(work[n], base[n], equal_nan=True), \
                    f"the floor changed {n}"
    else:
        for n, mine, ref in zip(wl.result, got, expected(wl, dtype)):
            msg = _bench.compare(wl.part(n, mine), ref, dtype, atol=wl.atol.get(impl, 0.0),
                                 offset_per_row=impl in wl.offset_per_row)
            assert msg is None, f"{wl.name} {dtype} {impl}: {n} {msg}"
    del got

    def setup():
        for n in wl.inplace:
            np.copyto(work[n], base[n])
        return (work,), {}

    if first > SLOW_S:
        rounds = 1
    else:
        rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, BUDGET_S / max(first, 1e-7))))
    benchmark.group = f"{wl.name} {dtype}"
    benchmark.name = f"{wl.name}[{dtype}-{impl}-t{threads}]"
    traffic = wl.traffic_bytes(base)
    benchmark.extra_info.update(workload=wl.name, title=wl.title, dtype=dtype, impl=impl,
                                threads=threads, bytes=wl.floor_bytes(base),
                                traffic_bytes=traffic, floor=wl.floor)
    benchmark.pedantic(run, setup=setup, rounds=rounds, iterations=1,
                       warmup_rounds=1 if rounds >= 10 else 0)
    stats = getattr(benchmark, "stats", None)
    median = getattr(getattr(stats, "stats", None), "median", None)
    if median:
        benchmark.extra_info["gb_per_s"] = round(traffic / median / 1e9, 2)
