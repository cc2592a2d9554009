"""Python threads: concurrent calls give the serial results, and the kernels release the GIL.

- ``test_threads_match_serial``: 8 Python threads each run 50 rounds (1,000 in the
  ``slow`` run) of every kernel
  (sinusoidal table and add, learned add, RoPE on its fast and general paths, cached
  RoPE, a shared RotaryEmbedding, cos/sin, ALiBi add on its fast and general paths, the
  ALiBi table), interleaved, on buffers of their own and on read-only inputs shared by
  all of them (a learned table, a cos/sin cache, positions, slopes, a key mask,
  frequencies, the RotaryEmbedding object). Half the threads ask for 2 OpenMP threads
  (with the serial threshold lowered, so that concurrent OpenMP teams really run), half
  for 1; one thread runs on the NumPy backend (use_backend is per thread). Every
  thread's final buffers and running sums are bit-identical to the same rounds run
  serially, one thread after another.
- ``test_kernels_release_the_gil``: a pure-Python counter thread keeps counting while
  the main thread is inside a long (~50-100 ms) compiled call of each family; a call that
  holds the GIL (builtin ``sum``) stops it, which shows the measurement can tell.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import BF16, COMPILED, assert_bytes_equal

import fastpe
from fastpe import _threads

N_THREADS = 8
# The default run shows the same interleavings in miniature; the slow run soaks.
ROUNDS = {"default": 50, "soak": 1000}
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16),
          BF16 if BF16 is not None else np.dtype(np.float32)]


def _name(dtype):
    return "bfloat16" if BF16 is not None and dtype == BF16 else np.dtype(dtype).name


# Shared read-only inputs: every thread reads the same objects.
SEQ, DIM, HEADS, HEAD_DIM = 40, 16, 2, 16       # 40 tokens: a full 32-token block and a part
SHARED_POS = np.arange(SEQ, dtype=np.int64)[::-1] // 2 + 3
SHARED_POS.flags.writeable = False
FREQS = fastpe.rope_frequencies(HEAD_DIM, scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 32})
COS_SIN = {_name(dt): fastpe.rope_cos_sin(np.arange(64), FREQS, dtype=dt) for dt in DTYPES}
for _c, _s in COS_SIN.values():
    _c.flags.writeable = _s.flags.writeable = False
EMBEDDING = fastpe.RotaryEmbedding(HEAD_DIM, scaling={"rope_type": "llama3", "factor": 8.0,
                                                      "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16})
SLOPES = np.linspace(0.05, 0.5, HEADS)
SLOPES.flags.writeable = False
KEY_MASK = np.arange(48) % 5 != 1
KEY_MASK.flags.writeable = False


def _values(shape, dtype, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


@dataclass
class Kernel:
    """One kernel's per-thread state and its round: `init(tid, dtype)` makes the state
    (a dict of arrays), `step(state, tid, i, nt)` runs round i."""
    name: str
    init: Callable[[int, np.dtype], dict]
    step: Callable[[dict, int, int, int], None]


def _acc(state, result):
    """A running float64 sum of a call's result (same order in every run: same bits)."""
    state["acc"] += np.asarray(result, dtype=np.float64)


def _bias_sum(state, i, nt):
    """alibi_bias into the thread's out, summed (the -inf of the mask as 0)."""
    b = np.asarray(fastpe.alibi_bias(HEADS, 8, 48, q_offset=i % 40, causal=True,
                                     out=state["out"], num_threads=nt), dtype=np.float64)
    _acc(state, np.where(np.isinf(b), 0, b))


SHARED_TABLES = {_name(dt): _values((64, DIM), dt, 99) for dt in DTYPES}
for _t in SHARED_TABLES.values():
    _t.flags.writeable = False

KERNELS = [
    Kernel("sinusoidal_table",
           lambda tid, dt: {"out": np.empty((SEQ, DIM), dt), "acc": np.zeros((SEQ, DIM))},
           lambda s, tid, i, nt: _acc(s, fastpe.sinusoidal_table(
               SEQ, DIM, offset=(i * 7 + tid) % 5000, out=s["out"], num_threads=nt))),
    Kernel("add_sinusoidal",
           lambda tid, dt: {"x": _values((2, SEQ, DIM), dt, tid)},
           lambda s, tid, i, nt: fastpe.add_sinusoidal(s["x"], SHARED_POS, scale=0.5,
                                                       num_threads=nt)),
    Kernel("add_learned",
           lambda tid, dt: {"x": _values((2, SEQ, DIM), dt, tid + 10)},
           lambda s, tid, i, nt: fastpe.add_learned(
               s["x"], SHARED_TABLES[_name(s["x"].dtype)], SHARED_POS, num_threads=nt)),
    Kernel("apply_rope/fast",
           lambda tid, dt: {"q": _values((2, SEQ, HEADS, HEAD_DIM), dt, tid + 20),
                            "k": _values((2, SEQ, 1, HEAD_DIM), dt, tid + 30)},
           lambda s, tid, i, nt: fastpe.apply_rope(s["q"], s["k"], SHARED_POS, freqs=FREQS,
                                                   inverse=i % 2 == 1, num_threads=nt)),
    Kernel("apply_rope/general",
           lambda tid, dt: {"q": _values((2, HEADS, SEQ, HEAD_DIM), dt, tid + 40)},
           lambda s, tid, i, nt: fastpe.apply_rope(
               s["q"], None, offset=i % 100, layout="bhsd", rotary_dim=HEAD_DIM - 4,
               scaling={"rope_type": "linear", "factor": 2.0}, style="gptj",
               num_threads=nt)),
    Kernel("apply_rope_cached",
           lambda tid, dt: {"q": _values((SEQ, HEADS, HEAD_DIM), dt, tid + 50)},
           lambda s, tid, i, nt: fastpe.apply_rope_cached(
               s["q"], None, *COS_SIN[_name(s["q"].dtype)], SHARED_POS, layout="shd",
               inverse=i % 2 == 1, num_threads=nt)),
    Kernel("RotaryEmbedding",
           lambda tid, dt: {"q": _values((1, SEQ, HEADS, HEAD_DIM), dt, tid + 60),
                            "k": _values((1, SEQ, HEADS, HEAD_DIM), dt, tid + 70)},
           lambda s, tid, i, nt: EMBEDDING(s["q"], s["k"], offset=(i * 13) % 3000,
                                           num_threads=nt)),
    Kernel("rope_cos_sin",
           lambda tid, dt: {"acc": np.zeros((2, SEQ, HEAD_DIM // 2))},
           lambda s, tid, i, nt: _acc(s, fastpe.rope_cos_sin(SHARED_POS + i, FREQS))),
    Kernel("add_alibi/fast",
           lambda tid, dt: {"x": _values((2, HEADS, 8, 48), dt, tid + 80)},
           lambda s, tid, i, nt: fastpe.add_alibi(s["x"], causal=i % 2 == 0,
                                                  num_threads=nt)),
    Kernel("add_alibi/general",
           lambda tid, dt: {"x": _values((2, HEADS, 8, 48), dt, tid + 90)},
           lambda s, tid, i, nt: fastpe.add_alibi(s["x"], slopes=SLOPES, key_mask=KEY_MASK,
                                                  q_positions=SHARED_POS[:8],
                                                  symmetric=True, num_threads=nt)),
    Kernel("alibi_bias",
           lambda tid, dt: {"out": np.empty((HEADS, 8, 48), dt), "acc": np.zeros((HEADS, 8, 48))},
           lambda s, tid, i, nt: _bias_sum(s, i, nt)),
]


def _shared_inputs() -> dict[str, np.ndarray]:
    out = {"positions": SHARED_POS, "slopes": SLOPES, "key_mask": KEY_MASK,
           "inv_freq": FREQS.inv_freq}
    for name, (c, s) in COS_SIN.items():
        out[f"cos {name}"], out[f"sin {name}"] = c, s
    out.update({f"table {name}": t for name, t in SHARED_TABLES.items()})
    return out


def _thread_setup(tid):
    """(dtype, num_threads, backend) of thread tid."""
    dtype = DTYPES[tid % len(DTYPES)]
    nt = 2 if tid % 2 else 1
    backend = "numpy" if tid == N_THREADS - 1 else "cython"
    return dtype, nt, backend


def _run_thread(tid, rounds, barrier=None):
    dtype, nt, backend = _thread_setup(tid)
    states = [k.init(tid, dtype) for k in KERNELS]
    if barrier is not None:
        barrier.wait()
    with fastpe.use_backend(backend):
        for i in range(rounds):
            for k, s in zip(KERNELS, states):
                k.step(s, tid, i, nt)
    return states


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("rounds", [
    pytest.param(ROUNDS["default"], id="default"),
    pytest.param(ROUNDS["soak"], id="soak", marks=pytest.mark.slow),
])
def test_threads_match_serial(monkeypatch, rounds):
    monkeypatch.setattr(_threads, "SERIAL_BYTES", 0)   # num_threads=2 really runs a team
    shared_before = {name: a.copy() for name, a in _shared_inputs().items()}
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(N_THREADS)

    def worker(tid):
        try:
            results[tid] = _run_thread(tid, rounds, barrier)
        except BaseException as exc:   # reported below, with the thread's id
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, f"a thread raised: {errors[0]!r}"
    assert sorted(results) == list(range(N_THREADS))
    for name, a in _shared_inputs().items():
        assert_bytes_equal(a, shared_before[name], f"shared input {name} was written")
    for tid in range(N_THREADS):
        serial = _run_thread(tid, rounds)
        for k, got, want in zip(KERNELS, results[tid], serial):
            for name in want:
                assert_bytes_equal(got[name], want[name],
                                   f"thread {tid} {_thread_setup(tid)} {k.name} {name}")


# ---- the GIL --------------------------------------------------------------------------------


class Counter(threading.Thread):
    """Counts in pure Python (which needs the GIL) until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.n = 0
        self.running = True

    def run(self):
        while self.running:
            self.n += 1


def counter_rate(counter: Counter, fn, min_seconds: float = 0.02) -> tuple[float, float]:
    """(counts per second while fn runs, the seconds watched): fn called again until
    min_seconds have passed, so that a call of a millisecond on a busy machine, where
    the counting thread may not be scheduled at all, is not all there is to watch."""
    n0, t0 = counter.n, time.perf_counter()
    fn()
    while time.perf_counter() - t0 < min_seconds:
        fn()
    t1, n1 = time.perf_counter(), counter.n
    return (n1 - n0) / (t1 - t0), t1 - t0


def _transposed(shape, dtype, axes):
    """A writable array of `shape` whose memory runs in another axis order: the
    kernels' slow, strided loops, so that one call lasts long enough to watch."""
    mem = tuple(shape[a] for a in np.argsort(axes))
    return np.zeros(mem, dtype).transpose(axes)


LONG_CALLS = {
    "add_alibi/fast": lambda: fastpe.add_alibi(
        _transposed((8, 1024, 1024), np.float32, (0, 2, 1)), num_threads=1),
    "add_alibi/general": lambda: fastpe.add_alibi(
        _transposed((8, 1024, 1024), np.float32, (0, 2, 1)), key_mask=np.arange(1024) % 3 > 0,
        q_positions=np.arange(1024), num_threads=1),
    "alibi_bias": lambda: fastpe.alibi_bias(
        8, 1024, 1024, q_offset=0, out=_transposed((8, 1024, 1024), np.float32, (0, 2, 1)),
        num_threads=1),
    "add_sinusoidal": lambda: fastpe.add_sinusoidal(
        _transposed((4, 1024, 2048), np.float32, (0, 2, 1)), num_threads=1),
    "sinusoidal_table": lambda: fastpe.sinusoidal_table(
        2048, 1024, out=_transposed((2048, 1024), np.float32, (1, 0)), num_threads=1),
    "add_learned": lambda: fastpe.add_learned(
        _transposed((4, 1024, 2048), np.float32, (0, 2, 1)), np.ones((1100, 2048), np.float32),
        num_threads=1),
    "apply_rope": lambda: fastpe.apply_rope(
        _transposed((4, 128, 8, 1024), np.float32, (0, 3, 2, 1)), num_threads=1),
    "apply_rope_cached": lambda: fastpe.apply_rope_cached(
        _transposed((4, 128, 8, 1024), np.float32, (0, 3, 2, 1)), None,
        *fastpe.rope_cos_sin(np.arange(128), fastpe.rope_frequencies(1024)), num_threads=1),
}


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
def test_kernels_release_the_gil():
    counter = Counter()
    counter.start()
    try:
        while counter.n == 0:
            time.sleep(0.001)
        free, _ = counter_rate(counter, lambda: time.sleep(0.05))
        held, held_s = counter_rate(counter, lambda: sum(range(10_000_000)))
        assert held < 0.2 * free, (
            f"the counter kept counting ({held:.3g}/s, free {free:.3g}/s) through a call "
            f"that holds the GIL: this machine can't show what the test checks")
        slow = {}
        for name, call in LONG_CALLS.items():
            # Best of three: on a loaded machine the OS may deschedule the counter for a
            # whole call; a call that holds the GIL starves it every time.
            for _ in range(3):
                with fastpe.use_backend("cython"):
                    rate, seconds = counter_rate(counter, call)
                if rate >= 0.25 * free:
                    slow.pop(name, None)
                    break
                slow[name] = f"{rate:.3g}/s over {seconds * 1e3:.0f} ms"
    finally:
        counter.running = False
        counter.join()
    assert not slow, (f"a Python thread barely ran during these compiled calls (free "
                      f"{free:.3g}/s; GIL held {held:.3g}/s over {held_s * 1e3:.0f} ms): "
                      f"{slow}")
