"""float16 and bfloat16 against their floor, and against the least a half-precision
kernel must do: the measurement behind "float16 within 1.2x of float32's fraction of
the floor".

For each workload, side by side in the same shuffled rounds (fastpe._bench.measure, one
thread): fastpe in float32, fastpe in the half dtype, the floor's forms over each one's
arrays (the fastest form counts, round by round), and a round trip over the half
arrays: every element widened to float32 and narrowed back in place, no arithmetic
between (the compiled kernels' ``half_round_trip``, in the widest registers the build
has). A kernel that computes a half-precision array in float32 does at least that
much; where the round trip itself is well short of the floor (arrays in the caches,
where the floor runs at cache speed and the conversions do not), no such kernel can
reach the floor, and float32's fraction is not within reach either.

Each fraction is the median over rounds of (floor time / time) in the same round.

    python bench/half_precision.py [--dtype float16,bfloat16] [--only NAMES] [--rounds N]
                                   [--size tiny]
"""

from __future__ import annotations

import argparse
import functools
import statistics

import numpy as np

import fastpe
from fastpe import _backend, _bench, _checks, _cli
from fastpe._bench.floors import forms as floor_forms

DEFAULT = ("rope-prefill-neox,rope-prefill-gptj,rope-batched-decode,rope-prefill-mrope,"
           "sinusoidal-add,learned-add")


def _fraction(floor: list[list[float]], samples: list[float]) -> float:
    per_round = [min(form[r] for form in floor) for r in range(len(samples))]
    return statistics.median(f / t for f, t in zip(per_round, samples))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float16",
                    help="comma-separated half dtypes: float16, bfloat16 (needs ml_dtypes)")
    ap.add_argument("--only", default=DEFAULT, help="comma-separated parts of workload names")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--size", choices=("full", "tiny"), default="full",
                    help="the bench's shapes, or the same workloads in a few kilobytes")
    args = ap.parse_args()
    kern = _backend.compiled
    if kern is None:
        raise SystemExit("the compiled kernels are not built: nothing to measure")
    dtypes = []
    for name in args.dtype.split(","):
        if name == "bfloat16":
            if _checks.ml_dtypes(True) is None:
                raise SystemExit("bfloat16 needs ml_dtypes")
            dtypes.append(np.dtype(_checks.ml_dtypes(True).bfloat16))
        else:
            dtypes.append(np.dtype(name))
    cpu = _cli.machine_info()["cpu"]
    print(f"fastpe {fastpe.__version__}: {fastpe.info()['isa']} kernels; {cpu}; one thread; "
          f"medians of up to {args.rounds} shuffled rounds")
    print(f"{'workload':64s} {'dtype':>9s} {'fastpe':>8s} {'round trip':>11s} "
          f"{'float32':>8s} {'f32 / half':>11s}")
    for wl in _bench.select(_bench.workloads(args.size), args.only):
        if wl.floor != "stream":
            continue
        for dt in dtypes:
            if dt.name not in wl.dtypes:
                continue
            sets = {"float32": wl.make(np.dtype(np.float32)), "half": wl.make(dt)}
            runners = {}
            floors: dict[str, list[str]] = {"float32": [], "half": []}
            for key, arrays in sets.items():
                run = wl.impls["fastpe"](arrays, 1)
                runners[f"fastpe:{key}"] = functools.partial(run, arrays)
                for form, prepare in floor_forms(wl.floor, wl.result, wl.reads).items():
                    floor = prepare(arrays, 1)
                    if floor is not None:
                        runners[f"floor:{key}:{form}"] = functools.partial(floor, arrays)
                        floors[key].append(f"floor:{key}:{form}")
            written = tuple(sets["half"][n] for n in wl.result)
            runners["round trip"] = functools.partial(kern.half_round_trip, written)
            for run in runners.values():
                run()
            timings = _bench.measure(runners, rounds=args.rounds,
                                     min_rounds=min(7, args.rounds), sample_s=0.03,
                                     budget_s=10.0)
            samples = {n: t.samples for n, t in timings.items()}
            f32 = _fraction([samples[n] for n in floors["float32"]], samples["fastpe:float32"])
            half = _fraction([samples[n] for n in floors["half"]], samples["fastpe:half"])
            trip = _fraction([samples[n] for n in floors["half"]], samples["round trip"])
            print(f"{wl.title[:64]:64s} {dt.name:>9s} {half:8.0%} {trip:11.0%} {f32:8.0%} "
                  f"{f32 / half:11.2f}")


if __name__ == "__main__":
    main()
