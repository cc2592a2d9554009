"""Interleaved timing for the command line: every contender of a workload timed side by
side, round after round, in a fresh random order each round."""

from __future__ import annotations

import collections
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
    inner: list[float] | None = None   # seconds per call of the part its clock times


# A contender measured faster than this fraction of its floor beat the machine's
# streaming speed for its bytes: that is noise (a neighbour slowed the floor's samples,
# or frequency changed), not bandwidth.
NOISE_FRACTION = 1.05


def _time_calls(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def measure(runners: Mapping[str, Callable[[], object]], *, rounds: int, min_rounds: int = 3,
            sample_s: float = 0.01, budget_s: float = 5.0,
            progress: Callable[[str], None] | None = None,
            clocks: Mapping[str, Callable[[], float]] | None = None) -> dict[str, Timing]:
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
    timing. The runners must already have run once (warm-up). `clocks` gives, for some
    runners, a clock of seconds spent in a part of each call (accumulated by the runner
    itself): each sample then also records that part's seconds per call."""
    clocks = clocks or {}
    names = list(runners)
    shuffle = random.Random(20240601).shuffle
    number = {}
    for name in names:
        once = _time_calls(runners[name], 1)
        number[name] = max(1, min(100_000, int(sample_s / max(once, 1e-9))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    inner: dict[str, list[float]] = {n: [] for n in clocks}
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
                before = clocks[name]() if name in clocks else 0.0
                samples[name].append(_time_calls(runners[name], number[name]))
                if name in clocks:
                    inner[name].append((clocks[name]() - before) / number[name])
            if r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    return {n: Timing(statistics.median(samples[n]), samples[n], number[n], inner.get(n))
            for n in names}


# Rounds, seconds per sample and seconds per workload for each mode of the command line.
class Mode(TypedDict):
    """measure()'s settings."""

    rounds: int
    min_rounds: int
    sample_s: float
    budget_s: float


MODES: dict[str, Mode] = {
    "default": dict(rounds=21, min_rounds=7, sample_s=0.03, budget_s=5.0),
    "quick": dict(rounds=9, min_rounds=5, sample_s=0.004, budget_s=0.5),
}


def _floor_record(timings: Mapping[str, Timing]) -> dict[str, Any]:
    """The floor of each round (the fastest form in that round), its median, the form
    fastest in most rounds, and fastpe's fraction of it: the median over rounds of the
    floor's time over fastpe's in the same round."""
    forms = [n for n in timings if n.startswith("floor:")]
    if not forms:
        return {"seconds": None, "samples": None, "form": "", "fraction": None, "noise": False}
    fastpe_samples = timings["fastpe"].samples
    rounds = range(len(fastpe_samples))
    per_round = [min(timings[n].samples[r] for n in forms) for r in rounds]
    wins = collections.Counter(min(forms, key=lambda n: timings[n].samples[r]) for r in rounds)
    fraction = statistics.median(f / t for f, t in zip(per_round, fastpe_samples))
    return {"seconds": statistics.median(per_round), "samples": per_round,
            "form": wins.most_common(1)[0][0].partition(":")[2], "fraction": fraction,
            "noise": fraction > NOISE_FRACTION}


def run_workload(wl: Workload, dtype: DTypeLike, threads: int, *, mode: Mode,
                 progress: Callable[[str], None] | None = None,
                 check_elements: int = 1 << 22,
                 own_threads: tuple[str, ...] = ()) -> dict[str, Any]:
    """Time fastpe, numpy, the workload's peers and every form of the floor side by side
    on one workload. fastpe works on the arrays `make` built, every other contender on
    its own copy, the floor on fastpe's arrays (the same bytes). Each contender's first
    call, on pristine inputs, warms it up and is checked against fastpe.reference (about
    `check_elements` of the workload's checked part of each result). Contenders run on
    one thread, but fastpe, the floor and those in `own_threads` (fastpe itself, called
    another way) on `threads`. Returns one JSON-ready record."""
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
        run = prepare(arrays[name], threads if name in own_threads else 1)
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
            msg = compare(wl.part(res, mine), ref, dt, atol=wl.atol.get(name, 0.0),
                          max_elements=check_elements)
            if msg is not None:
                problems.append(f"{res}: {name} and the reference {msg}")
        del got
    del expected
    floors = {}
    if wl.floor != "none":
        for form, prepare in floor_forms(wl.floor, wl.result, wl.reads).items():
            run = prepare(base, threads)
            if run is not None:
                floors[f"floor:{form}"] = run
                arrays[f"floor:{form}"] = base
                run(base)
    runners = {n: functools.partial(r, arrays[n]) for n, r in {**prepared, **floors}.items()}
    clocks = ({n: functools.partial(getattr, r, "inner_seconds") for n, r in prepared.items()}
              if wl.inner else None)
    timings = measure(runners, progress=progress, clocks=clocks, **mode)
    t: dict[str, float | None] = {n: timings[n].median for n in timings}
    floor = _floor_record(timings)
    t["floor"] = floor["seconds"]
    fastpe_s = timings["fastpe"].median
    traffic = wl.traffic_bytes(base)
    peers = {n: timings[n].median / fastpe_s for n in wl.peers if n in timings}
    samples: dict[str, list[float] | None] = {n: timings[n].samples for n in timings}
    if floor["samples"] is not None:
        samples["floor"] = floor["samples"]
    record = {
        "name": wl.name,
        "family": wl.family,
        "title": wl.title,
        "dtype": dt.name,
        "shapes": {n: list(a.shape) for n, a in base.items()},
        "bytes": wl.floor_bytes(base),
        "floor": wl.floor,
        "floor_form": floor["form"],
        "floor_noise": floor["noise"],
        "numpy_baseline": wl.numpy_note,
        "per_call": wl.per_call,
        "threads": {n: (threads if n == "fastpe" or n in own_threads or n.startswith("floor")
                        else 1) for n in timings},
        "seconds": t,
        "seconds_min": {n: min(timings[n].samples) for n in timings},
        "samples": samples,
        "calls_per_sample": {n: timings[n].number for n in timings},
        "rounds": len(timings["fastpe"].samples),
        "speedup_vs_numpy": timings["numpy"].median / fastpe_s,
        "peers": peers,
        "skipped": skipped,
        "fraction_of_floor": floor["fraction"],
        "fastpe_gb_per_s": traffic / fastpe_s / 1e9 if traffic else None,
        "floor_gb_per_s": traffic / floor["seconds"] / 1e9 if traffic else None,
        "check": "ok" if not problems else "; ".join(problems),
    }
    if wl.inner:
        inner = {n: statistics.median(timings[n].inner or [0.0]) for n in prepared}
        record["inner"] = {"part": wl.inner, "seconds": inner,
                           "speedup_vs_numpy": inner["numpy"] / inner["fastpe"]}
    return record
