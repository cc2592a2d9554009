"""The compiled variants side by side in one process: the time ratio of each variant to
kernels_avx2 on the workloads of ``python -m fastpe bench``, one thread.

Each round times every variant once on the same arrays, in a fresh random order; a
row's number is the median over rounds of (variant's time / avx2's time) in that round,
so load that comes and goes slows both sides of a ratio. Below 1: the variant is faster.
This is the measurement behind the choice of ``AUTO`` in ``fastpe._kernels``.

    python bench/compare_isa.py [--dtype float32,float16,bfloat16] [--only NAMES]
                                [--rounds N] [--variants avx512,baseline]
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time

import numpy as np

import fastpe
from fastpe import _backend, _bench, _cli
from fastpe._kernels import kernels_baseline

SKIP = ("llama-decode",)
try:
    import ml_dtypes
    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None
STATE_TYPES = frozenset({type(None), bool, int, float, str, np.float64, np.float32,
                         np.int64, np.int32})   # a whole program: its RoPE is the decode rows' call


def _sample(run, arrays, number):
    t0 = time.perf_counter()
    for _ in range(number):
        run(arrays)
    return (time.perf_counter() - t0) / number


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--only", default=None)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--variants", default="avx512")
    args = ap.parse_args()
    base = "avx2"
    others = [v for v in args.variants.split(",") if v]
    modules = {}
    states = {}
    for isa in [base, *others]:
        if not kernels_baseline.cpu_supports(isa):
            raise SystemExit(f"this CPU cannot run kernels_{isa}")
        modules[isa] = importlib.import_module(f"fastpe._kernels.kernels_{isa}")
        # apply_rope's cache of parsed settings (and the states it builds through
        # _backend.compiled) holds one variant's states
        states[isa] = modules[isa].RopeStates(STATE_TYPES)
        if BFLOAT16 is not None:  # registered at import with the variant loaded only
            modules[isa].register_bfloat16(BFLOAT16.num)
    print(f"fastpe {fastpe.__version__}: time / {base}'s, one thread, median of "
          f"{args.rounds} interleaved rounds; {fastpe.info()['machine']}, "
          f"{_cli.cpu_model()}")
    header = "workload".ljust(26) + "".join(f"{v:>10}" for v in others)
    for dtype in args.dtype.split(","):
        dt = BFLOAT16 if dtype == "bfloat16" else np.dtype(dtype)
        if dt is None:
            raise SystemExit("bfloat16 needs ml_dtypes")
        print(f"\n{dtype}\n{header}")
        # a workload list per variant: a RotaryEmbedding keeps the state the variant
        # that first ran it built, which another variant's kernels refuse
        lists = {isa: _bench.select(_bench.workloads("full"), args.only) for isa in modules}
        for i, wl in enumerate(lists[base]):
            if wl.name in SKIP or dtype not in wl.dtypes:
                continue
            arrays = wl.make(dt)
            runners = {}
            for isa, mod in modules.items():
                token = _backend._current.set(mod)
                fastpe.rope._STATES, _backend.compiled = states[isa], modules[isa]
                try:
                    run = lists[isa][i].impls["fastpe"](arrays, 1)
                    once = _sample(run, arrays, 1)
                finally:
                    _backend._current.reset(token)
                runners[isa] = (run, max(1, min(100_000, int(0.01 / max(once, 1e-9)))))
            ratios = {v: [] for v in others}
            shuffle = random.Random(1).shuffle
            for _ in range(args.rounds):
                order = list(modules)
                shuffle(order)
                t = {}
                for isa in order:
                    run, number = runners[isa]
                    token = _backend._current.set(modules[isa])
                    fastpe.rope._STATES, _backend.compiled = states[isa], modules[isa]
                    try:
                        run(arrays)
                        t[isa] = _sample(run, arrays, number)
                    finally:
                        _backend._current.reset(token)
                for v in others:
                    ratios[v].append(t[v] / t[base])
            print(wl.name.ljust(26) + "".join(f"{statistics.median(ratios[v]):10.2f}"
                                              for v in others), flush=True)


if __name__ == "__main__":
    main()
