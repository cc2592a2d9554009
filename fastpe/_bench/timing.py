"""Interleaved timing for the command line: every contender of a workload timed side by
side, round after round, in a fresh random order each round."""

from __future__ import annotations

import dataclasses
import functools
import gc
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import numpy as np
from numpy.typing import DTypeLike

from .common import Runner, Workload, compare, copy_arrays
from .floors import forms as floor_forms


@dataclasses.dataclass
class Timing:
    median: float          # seconds per call
    samples: list[float]   # seconds per call, one per round
    number: int            # calls per sample


def _time_calls(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def measure(runners: Mapping[str, Callable[[], object]], *, rounds: int, min_rounds: int = 3,
            sample_s: float = 0.01, budget_s: float = 5.0,
            progress: Callable[[str], None] | None = None) -> dict[str, Timing]:
    """Median seconds per call of each runner, measured side by side.

    Each round runs every runner once, in a fresh random order (seeded: so no runner
    keeps the same neighbour, or the same place in the round); a sample is `number`
    back-to-back calls after one untimed call, with `number` calibrated so a sample
    takes about `sample_s`. The untimed call gives each runner its own arrays in cache,
    as they are when a model's previous layer has just written them: otherwise the
    first call of a sample pays for the cache state the previous runner left (a peer
    that allocates its outputs evicts everything), and a sample of a few calls of a
    64 MiB workload measures that instead of the runner. Stops after `rounds` rounds,
    or after `min_rounds` once `budget_s` is spent. The garbage collector is off while
    timing. The runners must already have run once (warm-up)."""
    names = list(runners)
    shuffle = random.Random(20240601).shuffle
    number = {}
    for name in names:
        once = _time_calls(runners[name], 1)
        number[name] = max(1, min(100_000, int(sample_s / max(once, 1e-9))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            if progress is not None:
                progress(f"round {r + 1}/{rounds}")
            order = names[:]
            shuffle(order)
            for name in order:
                runners[name]()
                samples[name].append(_time_calls(runners[name], number[name]))
            if r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    return {n: Timing(statistics.median(samples[n]), samples[n], number[n]) for n in names}


# Rounds, seconds per sample and seconds per workload for each mode of the command line.
class Mode(TypedDict):
    """measure()'s settings."""

    rounds: int
    min_rounds: int
    sample_s: float
    budget_s: float


MODES: dict[str, Mode] = {
    "default": dict(rounds=21, min_rounds=7, sample_s=0.03, budget_s=5.0),
    "quick": dict(rounds=9, min_rounds=5, sample_s=0.004, budget_s=0.8),
}


def run_workload(wl: Workload, dtype: DTypeLike, threads: int, *, mode: Mode,
                 progress: Callable[[str], None] | None = None,
                 check_elements: int = 1 << 22) -> dict[str, Any]:
    """Time fastpe, numpy, the workload's peers and every form of the floor side by side
    on one workload. fastpe works on the arrays `make` built, every other contender on
    its own copy, the floor on fastpe's arrays (the same bytes). Each contender's first
    call, on pristine inputs, warms it up and is checked against fastpe.reference (about
    `check_elements` of each result). Returns one JSON-ready record."""
    dt = np.dtype(dtype)
    if progress is not None:
        progress("preparing")
    base = wl.make(dt)
    arrays = {"fastpe": base}
    prepared: dict[str, Runner] = {"fastpe": wl.impls["fastpe"](base, threads)}
    contenders = {"numpy": wl.impls["numpy"], **wl.peers}
    skipped: dict[str, str] = {}
    for name, prepare in contenders.items():
        arrays[name] = copy_arrays(base, wl.written)
        if progress is not None:
            progress(f"preparing {name}")
        run = prepare(arrays[name], 1)
        if run is None:
            skipped[name] = f"not for {dt.name}"
            del arrays[name]
        else:
            prepared[name] = run
    if progress is not None:
        progress("checking")
    expected = wl.expected(base)
    problems = []
    for name, run in prepared.items():
        got = run(arrays[name])
        for res, mine, ref in zip(wl.result, got, expected):
            msg = compare(mine, ref, dt, atol=wl.atol.get(name, 0.0),
                          max_elements=check_elements)
            if msg is not None:
                problems.append(f"{res}: {name} and the reference {msg}")
        del got
    del expected
    floors = {}
    for form, prepare in floor_forms(wl.floor, wl.result).items():
        run = prepare(base, threads)
        if run is not None:
            floors[f"floor:{form}"] = run
            arrays[f"floor:{form}"] = base
            run(base)
    runners = {n: functools.partial(r, arrays[n]) for n, r in {**prepared, **floors}.items()}
    timings = measure(runners, progress=progress, **mode)
    t = {n: timings[n].median for n in timings}
    floor_name = min(floors, key=lambda n: t[n])
    t["floor"] = t[floor_name]
    traffic = wl.traffic_bytes(base)
    peers = {n: t[n] / t["fastpe"] for n in wl.peers if n in t}
    return {
        "name": wl.name,
        "family": wl.family,
        "title": wl.title,
        "dtype": dt.name,
        "shapes": {n: list(a.shape) for n, a in base.items()},
        "bytes": wl.floor_bytes(base),
        "floor": wl.floor,
        "floor_form": floor_name.partition(":")[2],
        "numpy_baseline": wl.numpy_note,
        "per_call": wl.per_call,
        "threads": {n: (threads if n == "fastpe" or n.startswith("floor") else 1)
                    for n in timings},
        "seconds": t,
        "seconds_min": {n: min(timings[n].samples) for n in timings},
        "samples": {n: timings[n].samples for n in timings},
        "calls_per_sample": {n: timings[n].number for n in timings},
        "rounds": len(timings["fastpe"].samples),
        "speedup_vs_numpy": t["numpy"] / t["fastpe"],
        "peers": peers,
        "skipped": skipped,
        "fraction_of_floor": t["floor"] / t["fastpe"],
        "fastpe_gb_per_s": traffic / t["fastpe"] / 1e9,
        "floor_gb_per_s": traffic / t["floor"] / 1e9,
        "check": "ok" if not problems else "; ".join(problems),
    }
