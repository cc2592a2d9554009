"""Leak check: a million small fastpe calls keep the process's resident memory flat.

Every kernel family runs round-robin on small (decode-sized) arrays, through the C fast
paths, the general paths, work space on the stack and on the heap, OpenMP teams, the
NumPy backend, and calls that raise (each kind of error), so that a leak per call of a
work-space buffer, an array, a reference or an exception's traceback adds up to many
megabytes. After a warm-up (caches, allocator pools), RSS is sampled ten times during
the run; the run fails when it grew by more than --max-growth-mb. (Under
AddressSanitizer RSS includes its quarantine of freed memory: use a large bound there.)

    python bench/leak_check.py                          # 1,000,000 calls, 2 MB allowed
    python bench/leak_check.py --calls 200000 --json    # shorter; machine-readable

tests/test_memory.py runs it (marked slow: pytest -m slow tests/test_memory.py).
Linux reads RSS from /proc/self/statm; elsewhere psutil is needed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastpe


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil  # not Linux: psutil must be installed

        return psutil.Process().memory_info().rss


def make_calls():
    """(name, call) pairs; each call runs one small fastpe call (or one that raises)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    x = rng.uniform(-1, 1, (1, 8, 64)).astype(f32)
    x16 = x.astype(np.float16)
    table = rng.uniform(-1, 1, (64, 64)).astype(f32)
    out = np.empty((8, 64), f32)
    pos = np.arange(8)
    q = rng.uniform(-1, 1, (1, 1, 8, 64)).astype(f32)           # one decode token
    k = rng.uniform(-1, 1, (1, 1, 2, 64)).astype(f32)
    q_strided = rng.uniform(-1, 1, (1, 1, 8, 128)).astype(f32)[..., ::2]
    freqs = fastpe.rope_frequencies(64)
    # scalings whose attention_scaling is 1: the same q rotated a million times stays finite
    linear = {"rope_type": "linear", "factor": 4.0}
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}
    cos, sin = fastpe.rope_cos_sin(np.arange(64), freqs)
    emb = fastpe.RotaryEmbedding(64, scaling=dynamic)
    scores = rng.uniform(-1, 1, (1, 8, 1, 64)).astype(f32)      # one decode query
    scores64 = scores.astype(np.float64)
    slopes = fastpe.alibi_slopes(8)
    mask = np.arange(64) % 7 != 0
    bias_out = np.empty((8, 1, 64), f32)
    read_only = x.copy()
    read_only.flags.writeable = False

    def raises(fn, exc):
        def call():
            try:
                fn()
            except exc:
                return
            raise AssertionError("expected an error")
        return call

    def numpy_backend(fn):
        def call():
            with fastpe.use_backend("numpy"):
                fn()
        return call

    q_prefill = rng.uniform(-1, 1, (1, 40, 2, 64)).astype(f32)     # heap work space
    long_scores = rng.uniform(-1, 1, (1, 1, 1, 9000)).astype(f32)  # heap key rows
    return [
        ("sinusoidal_table", lambda: fastpe.sinusoidal_table(8, 64, offset=3, out=out)),
        ("sinusoidal_table/new", lambda: fastpe.sinusoidal_table(8, 64, dtype="float16")),
        ("add_sinusoidal", lambda: fastpe.add_sinusoidal(x, pos, scale=0.5)),
        ("add_sinusoidal/float16", lambda: fastpe.add_sinusoidal(x16, offset=5, scale=0.5)),
        ("add_learned", lambda: fastpe.add_learned(x, table, pos)),
        ("apply_rope/fast", lambda: fastpe.apply_rope(q, k, offset=100, freqs=freqs)),
        ("apply_rope/declined", lambda: fastpe.apply_rope(q_strided, None, np.array([7]))),
        ("apply_rope/general", lambda: fastpe.apply_rope(q, k, offset=100, scaling=linear)),
        ("apply_rope_cached", lambda: fastpe.apply_rope_cached(q, k, cos, sin, offset=9)),
        ("RotaryEmbedding", lambda: emb(q, k, offset=11)),
        ("rope_cos_sin", lambda: fastpe.rope_cos_sin(pos, freqs)),
        ("add_alibi/fast", lambda: fastpe.add_alibi(scores, causal=True)),
        ("add_alibi/general", lambda: fastpe.add_alibi(scores64, slopes=slopes, key_mask=mask)),
        ("add_alibi/big-offset", lambda: fastpe.add_alibi(scores, q_offset=2**40)),
        ("alibi_bias", lambda: fastpe.alibi_bias(8, 1, 64, out=bias_out)),
        ("apply_rope/prefill-2-threads", lambda: fastpe.apply_rope(
            q_prefill, None, offset=5, inverse=True, num_threads=2)),
        ("add_alibi/long-2-threads", lambda: fastpe.add_alibi(
            long_scores, q_offset=9000, num_threads=2)),
        ("alibi_slopes", lambda: fastpe.alibi_slopes(12)),
        ("numpy/apply_rope", numpy_backend(lambda: fastpe.apply_rope(q, k, offset=3))),
        ("error/read-only", raises(lambda: fastpe.add_sinusoidal(read_only), TypeError)),
        ("error/positions", raises(lambda: fastpe.apply_rope(q, k, np.array([-1])),
                                   ValueError)),
        ("error/past-table", raises(lambda: fastpe.add_learned(x, table, offset=60),
                                    IndexError)),
        ("error/overlap", raises(lambda: fastpe.apply_rope(q, q[:, :, :2]), ValueError)),
        ("error/scaling", raises(lambda: fastpe.apply_rope(q, scaling={"rope_type": "?"}),
                                 ValueError)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--warmup", type=int, default=50_000)
    parser.add_argument("--max-growth-mb", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)

    # the two "-2-threads" calls (over 16 KiB) run OpenMP teams; decode-sized ones stay serial
    fastpe._threads.SERIAL_BYTES = 16 * 1024
    calls = [c for _, c in make_calls()]
    n = len(calls)
    for i in range(args.warmup):
        calls[i % n]()
    gc.collect()
    before = rss_bytes()
    samples = []
    t0 = time.perf_counter()
    step = max(args.calls // 10, 1)
    for i in range(args.calls):
        calls[i % n]()
        if (i + 1) % step == 0:
            samples.append(rss_bytes())
    seconds = time.perf_counter() - t0
    gc.collect()
    after = rss_bytes()
    mb = 1024.0 * 1024.0
    growth = (max(samples + [after]) - before) / mb
    report = {"calls": args.calls, "kinds": n, "seconds": round(seconds, 2),
              "rss_before_mb": round(before / mb, 2), "rss_after_mb": round(after / mb, 2),
              "growth_mb": round(growth, 2), "max_growth_mb": args.max_growth_mb,
              "samples_mb": [round(s / mb, 2) for s in samples],
              "backend": fastpe.backend(), "isa": fastpe.info().get("isa")}
    ok = growth <= args.max_growth_mb
    if args.json:
        print(json.dumps(dict(report, ok=ok)))
    else:
        print(f"{args.calls} calls ({n} kinds) in {seconds:.1f} s: RSS {before / mb:.1f} MB "
              f"-> {after / mb:.1f} MB, largest growth {growth:.2f} MB "
              f"(allowed {args.max_growth_mb} MB): {'OK' if ok else 'LEAK'}")
        print("samples (MB):", " ".join(f"{s / mb:.1f}" for s in samples))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
