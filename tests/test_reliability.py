"""Shared state and derived values: the frequency caches under threads, cached arrays that
cannot be written, and configurations whose inputs are finite but whose frequencies or
scales are not."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import COMPILED, F32, F64, UNDER_ASAN, assert_close, pe_exact, run_python

import fastpe
from fastpe import _rope_scaling

# ---- the dynamic-NTK cache under threads ------------------------------------------------


class _WatchedDict(dict):
    """A dict that records an insert by one thread while another is between iterating
    it and popping the key it found (the eviction): the window in which CPython raises
    "dictionary changed size during iteration". The iteration yields the GIL to open
    the window wide."""

    def __init__(self, *args):
        super().__init__(*args)
        self.evicting: set[int] = set()
        self.clashes = 0

    def __iter__(self):
        it = super().__iter__()
        self.evicting.add(threading.get_ident())
        time.sleep(0.0005)
        return it

    def pop(self, *args):
        self.evicting.discard(threading.get_ident())
        return super().pop(*args)

    def setdefault(self, *args):
        if self.evicting - {threading.get_ident()}:
            self.clashes += 1
        return super().setdefault(*args)


def test_dynamic_frequency_cache_is_thread_safe():
    """Eight threads asking for many sequence lengths at once: the cache evicts while
    others insert, which must neither raise ("dictionary changed size during iteration")
    nor hand out frequencies of another length."""
    spec = _rope_scaling.parse_rope_spec(
        64, scaling={"rope_type": "dynamic", "factor": 2.0},
        max_position_embeddings=4099)   # an original length no other test uses
    watched = _WatchedDict(spec._cache)
    object.__setattr__(spec, "_cache", watched)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(tid: int) -> None:
        try:
            barrier.wait()
            for i in range(40):
                seq_len = 5000 + (i * 8 + tid) % 300   # more lengths than the cache keeps
                got = spec.frequencies(seq_len)
                want = _rope_scaling._dynamic_inv_freq(spec, seq_len)
                np.testing.assert_array_equal(got.inv_freq, want)
        except BaseException as exc:   # pragma: no cover - only on failure
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        object.__setattr__(spec, "_cache", dict(spec._cache))
    assert not errors, repr(errors[0])
    assert watched.clashes == 0, f"{watched.clashes} inserts during another thread's eviction"
    assert len(spec._cache) <= _rope_scaling._MAX_CACHED_LENGTHS


# ---- cached arrays cannot be made writable ------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: fastpe.rope_frequencies(8).inv_freq,
    lambda: fastpe.rope_frequencies(8, scaling={"rope_type": "dynamic", "factor": 2.0},
                                    max_position_embeddings=16, seq_len=40).inv_freq,
    lambda: fastpe.RotaryEmbedding(8).frequencies().inv_freq,
], ids=["default", "dynamic", "RotaryEmbedding"])
def test_cached_frequencies_cannot_be_made_writable(make):
    """Setting the flag back would let one caller poison every later default call."""
    a = make()
    with pytest.raises(ValueError, match="WRITEABLE"):
        a.flags.writeable = True
    with pytest.raises(ValueError, match="read-only"):
        a[:] = 0
    assert np.array_equal(make(), a) and a.all()


def test_default_rope_is_not_poisoned():
    f = fastpe.rope_frequencies(8)
    with pytest.raises(ValueError):
        f.inv_freq.flags.writeable = True
    q = np.ones((1, 3, 1, 8))
    fastpe.apply_rope(q)
    assert not np.array_equal(q[0, 2], np.ones(8))   # position 2 rotated


# ---- derived frequencies and scales ---------------------------------------------------------

TINY = 1e-320   # finite, positive, subnormal

DERIVED = [
    ("linear-factor", dict(scaling={"rope_type": "linear", "factor": TINY}),
     r"scaling\['factor'\]"),
    ("base-5e-324", dict(base=5e-324), r"\bbase\b"),
    ("longrope-factors", dict(scaling={"rope_type": "longrope", "short_factor": [TINY] * 32,
                                       "long_factor": [1.0] * 32, "factor": 2.0,
                                       "original_max_position_embeddings": 16}),
     r"scaling\['short_factor'\]"),
    ("longrope-long-factors", dict(scaling={"rope_type": "longrope", "short_factor": [1.0] * 32,
                                            "long_factor": [TINY] * 32, "factor": 2.0,
                                            "original_max_position_embeddings": 16}),
     r"scaling\['long_factor'\]"),
    ("yarn-attention_factor", dict(scaling={"rope_type": "yarn", "factor": 2.0,
                                            "attention_factor": 1e300,
                                            "original_max_position_embeddings": 16}),
     r"scaling\['attention_factor'\]"),
    ("yarn-tiny-attention_factor", dict(scaling={"rope_type": "yarn", "factor": 2.0,
                                                 "attention_factor": 1e-300,
                                                 "original_max_position_embeddings": 16}),
     r"scaling\['attention_factor'\]"),
]


@pytest.mark.parametrize("kw, match", [pytest.param(kw, m, id=i) for i, kw, m in DERIVED])
@pytest.mark.parametrize("entry", ["rope_frequencies", "RotaryEmbedding", "apply_rope"])
def test_out_of_range_derived_values_are_refused(entry, kw, match):
    """Finite inputs whose frequencies (base**(-2i/d) / factor) or attention scaling
    overflow give NaN or inf downstream: a ValueError naming the inputs instead, before
    anything is written."""
    q = np.ones((1, 3, 2, 64))
    with pytest.raises(ValueError, match=match):
        if entry == "rope_frequencies":
            fastpe.rope_frequencies(64, **kw)
        elif entry == "RotaryEmbedding":
            fastpe.RotaryEmbedding(64, **kw)
        else:
            fastpe.apply_rope(q, **kw)
    assert (q == 1).all()


@pytest.mark.parametrize("backend", ["cython", "numpy"])
@pytest.mark.parametrize("frequencies", ["transformer", "fairseq"])
def test_sinusoidal_base_whose_frequencies_lose_the_angles(backend, frequencies):
    """A base far below 1 gives inverse wavelengths of whole radians or more per position
    (1e-3: up to 800; 1e-320: past float64), whose float64 angles carry rounding past
    float32 precision: refused as RoPE refuses them, naming base. A base below 1 whose
    frequencies stay within 8 rad per position is as accurate as any."""
    if backend == "cython" and fastpe.info()["backend"] != "cython":
        pytest.skip("the compiled extension is not built")
    x = np.zeros((2, 64), np.float32)
    with fastpe.use_backend(backend):
        for base in (1e-320, 1e-10, 1e-3):
            with pytest.raises(ValueError, match=r"\bbase\b.*at least 1"):
                fastpe.add_sinusoidal(x, base=base, frequencies=frequencies)
            with pytest.raises(ValueError, match=r"\bbase\b.*at least 1"):
                fastpe.sinusoidal_table(2, 64, base=base, frequencies=frequencies)
        assert not x.any()
        got = fastpe.sinusoidal_table(300, 64, base=0.5)
    assert_close(got, pe_exact(np.arange(300), 64, base=0.5), np.float32, max_position=300,
                 context="sinusoidal_table(base=0.5)")


@pytest.mark.parametrize("freqs, match", [
    (fastpe.RopeFrequencies(np.ones(4), 1e300), r"freqs\.attention_scaling"),
    (fastpe.RopeFrequencies(np.ones(4), 1e-300), r"freqs\.attention_scaling"),
    (np.array([1.0, 1e300, 1.0, 1.0]), r"freqs\.inv_freq"),
], ids=["attention-huge", "attention-tiny", "inv_freq-huge"])
def test_given_frequencies_out_of_range(freqs, match):
    with pytest.raises(ValueError, match=match):
        fastpe.rope_cos_sin(np.arange(4), freqs)
    with fastpe.use_backend("numpy"), pytest.raises(ValueError, match=match):
        fastpe.rope_cos_sin(np.arange(4), freqs)


def test_extreme_but_valid_configurations_stay_finite():
    """The edge of the accepted range still gives finite cos and sin."""
    top = _rope_scaling.MAX_INV_FREQ
    cos, sin = fastpe.rope_cos_sin(np.array([0, 1, 2**32 - 1]),
                                   fastpe.RopeFrequencies(np.array([top, 1.0]), 3e38),
                                   dtype="float64")
    assert np.isfinite(cos).all() and np.isfinite(sin).all()


# ---- rows wider than one block of frequencies --------------------------------------------

WIDE = [8195, 3 * 8192]     # 2 blocks with an odd column; exactly 3 blocks


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.parametrize("dim, layout, dtype", [
    *[(WIDE[0], layout, dtype) for layout in ("interleaved", "split")
      for dtype in (F32, F64, np.dtype(np.float16))],
    *[(WIDE[1], layout, F32) for layout in ("interleaved", "split")]], ids=str)
def test_wide_rows_match_the_formula(dim, layout, dtype):
    """Rows of more than 4096 frequencies are made a block of frequencies at a time (the
    work space stays small): every staging path (table written directly or staged, one
    batch row fused, several batch rows, a transposed x, per-row positions) still gives
    the formula, across a 32-token reseeding boundary and for 1 and 2 threads."""
    pos = np.array([[0, 1, 2, 3, 70, 5000] + list(range(100, 134))])  # 40 tokens
    want = pe_exact(pos[0], dim, layout=layout)
    got = fastpe.sinusoidal_table(40, dim, offset=7, layout=layout, dtype=dtype)
    assert_close(got, pe_exact(np.arange(7, 47), dim, layout=layout), dtype, max_position=46,
                 context=f"table {dim} {layout}")
    x = np.random.default_rng(0).uniform(-1, 1, (2, 40, dim)).astype(dtype)
    for name, target, positions in [("batch", x.copy(), pos[0]),
                                    ("per-row", x.copy(), np.repeat(pos, 2, axis=0)),
                                    ("transposed", np.ascontiguousarray(
                                        x.transpose(0, 2, 1)).transpose(0, 2, 1), pos[0])]:
        for threads in (1, 2):
            out = target.copy(order="K")   # keeps the transposed layout
            assert out.strides == target.strides
            fastpe.add_sinusoidal(out, positions, layout=layout, scale=2.0,
                                  num_threads=threads)
            assert_close(out, x.astype(np.float64) * 2 + want, dtype, magnitude=3.0,
                         max_position=5000, context=f"add {name} {dim} {layout} t{threads}")


@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's shadow memory exceeds any address-space limit")
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_numpy_rope_out_of_memory_leaves_q_and_k_as_they_were(style):
    """The NumPy backend's RoPE runs out of memory forming k's values (64 MiB of k, 40
    MiB of address space left): a MemoryError, and neither q nor k written, as a refused
    call leaves them. It rotated q first, then failed on k, q left rotated."""
    proc = run_python(f"""
        import resource
        import numpy as np, fastpe
        q = np.ones((1, 4096, 1, 128), np.float32)
        k = np.ones((1, 4096, 32, 128), np.float32)
        def address_space():
            for line in open("/proc/self/status"):
                if line.startswith("VmSize"):
                    return int(line.split()[1]) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (address_space() + (40 << 20), hard))
        try:
            fastpe.reference.apply_rope(q, k, offset=3, style="{style}")
        except MemoryError:
            print("MemoryError")
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        print((q == 1).all(), (k == 1).all())
        fastpe.reference.apply_rope(q, k, offset=3, style="{style}")   # room again: rotated
        print((q == 1).all(), (k == 1).all())
    """, timeout=120)
    assert proc.stdout.split() == ["MemoryError", "True", "True", "False", "False"], (
        proc.stdout, proc.stderr[-2000:])


@pytest.mark.skipif(not COMPILED, reason="the compiled extension is not built")
@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer's shadow memory exceeds any address-space limit")
def test_work_space_grows_with_the_work_not_the_width():
    """One token of a 2e7-wide table, and cos/sin of one position with 1e7 frequencies,
    in a process limited to 1.2 GB of address space: the work space used to be 32 rows
    of the full width (5 GB) whatever the number of tokens."""
    proc = run_python("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1200 << 20,) * 2)
        import numpy as np, fastpe
        t = fastpe.sinusoidal_table(1, 2 * 10**7)
        assert t[0, 0] == 0 and t[0, 1] == 1 and t[0, -1] == 1, t[0, -4:]
        del t
        w = np.full(10**7, 0.5)
        cos, sin = fastpe.rope_cos_sin([3], fastpe.RopeFrequencies(w, 1.0))
        assert np.allclose(cos, np.cos(1.5), atol=1e-6) and np.allclose(sin, np.sin(1.5))
        print("OK")
    """, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["OK"], proc.stderr[-2000:]
