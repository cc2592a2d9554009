"""The floor: the machine's streaming speed over a workload's bytes.

A floor runs over the very arrays the workload writes (the same bytes, in the same cache
state) and leaves their values unchanged. Several forms of the same pass are timed in the
same shuffled rounds as the contenders (timing.measure) and, round by round, the fastest
counts, so "% of floor" means the machine's limit at that moment rather than one form's
overheads or another moment's load:

- ``numpy``: ``np.multiply(a, 1.0, out=a)`` for float32/float64 (half floats: the bytes
  as unsigned integers, ``np.bitwise_or(u, 0, out=u)``: NumPy's float16 multiply converts
  one element at a time, ~40x slower than memory); ``a.fill(1)`` for a table;
- ``c``: a plain C loop over 8-byte words from the compiled module (``stream``: XOR with
  0, or a fill), threaded with OpenMP like fastpe's kernels, one call for all the arrays
  (as one fastpe call takes q and k together);
- ``c-ahead``: the same loop a cache line at a time, each line 4 KiB on prefetched in
  software first: on some machines (an Intel Xeon here) the hardware's own prefetch
  leaves bandwidth unused, and this pass is the fastest;
- ``c-nt``: the same loop with streaming (non-temporal) stores, where the CPU has them.
  For a table this is the honest floor: a fill with ordinary stores reads each cache
  line before writing it (write-allocate), twice the bytes a table needs, and fastpe's
  table kernels stream past the caches. For a read-modify-write pass it skips the
  write-back of the line just read, which pays for buffers past the caches.

A call that also reads arrays it does not write (``Workload.reads``: DeBERTa's logit
tables, the rows of a learned table that a call adds) has them in its floor, each read
once: ``numpy`` reduces each (the largest of its elements as unsigned integers, a
vectorised pass) before its stream; ``c`` is one C pass that XORs the reads' words, ANDed
with a mask of 0 known only at run time, into the written array's (arrays of one size,
or one whose size divides the written one's: each of its words into the run of written
words in its place), ``c-split`` a C pass over each read array and then the stream over the written one,
``c-split-ahead`` the same with ``c-ahead``'s stream.

A Python thread pool splits a multi-threaded NumPy floor into contiguous pieces (NumPy
releases the GIL in ufunc loops); only worth it for big buffers, as a dispatch costs tens
of microseconds: smaller floors run on one thread, as fastpe runs small calls serially.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import numpy as np

from .. import _backend
from .common import Arrays, MaybePrepare, Prepare, Result, Runner

_THREADED_FLOOR_BYTES = 4 << 20
_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _pieces(flat: np.ndarray, threads: int) -> list[np.ndarray]:
    step = -(-flat.size // threads)
    return [flat[i:i + step] for i in range(0, flat.size, step)]


def _parallel(fn: Callable[[np.ndarray], object], flat: np.ndarray, threads: int) -> None:
    if threads <= 1 or flat.nbytes < _THREADED_FLOOR_BYTES:
        fn(flat)
        return
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = concurrent.futures.ThreadPoolExecutor(threads)
    for f in [pool.submit(fn, p) for p in _pieces(flat, threads)]:
        f.result()


def _flat(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:  # pragma: no cover - every workload's arrays are
        raise ValueError("the floor needs C-contiguous arrays")
    return a.reshape(-1)


def _stream(a: np.ndarray) -> None:
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
        np.multiply(a, 1.0, out=a)
    else:
        u = a.view(np.dtype(f"u{a.dtype.itemsize}"))
        np.bitwise_or(u, 0, out=u)


def _fill(a: np.ndarray) -> None:
    a.fill(1)


def _c_ready(a: np.ndarray) -> bool:
    return a.flags.c_contiguous and a.ctypes.data % 8 == 0 and a.nbytes % 8 == 0


def _read(a: np.ndarray) -> None:
    """Every byte of `a` read once: the largest of its elements as unsigned integers (a
    vectorised reduction, at memory speed)."""
    a.view(np.dtype(f"u{a.dtype.itemsize}")).max()


def prepare_floor(kind: str, names: tuple[str, ...], reads: tuple[str, ...] = ()) -> Prepare:
    """The NumPy form of the floor (what bench/ times beside each implementation)."""
    op = _stream if kind == "stream" else _fill

    def numpy_(arrays: Arrays, threads: int) -> Runner:
        def run(a: Arrays) -> Result:
            for n in reads:
                _parallel(_read, _flat(a[n]), threads)
            for n in names:
                _parallel(op, _flat(a[n]), threads)
            return ()
        return run
    return numpy_


def forms(kind: str, names: tuple[str, ...], reads: tuple[str, ...] = ()) -> dict[str, MaybePrepare]:
    """The forms of the floor over arrays `names`: "stream" (read + write each byte,
    in place) or "fill" (write each byte; what producing a table must at least do),
    with each byte of the arrays `reads` read once too (a stream only). The C forms are
    there when the compiled kernels are; "c-nt" (not with reads) where they have
    streaming stores."""
    if reads and (kind != "stream" or len(names) != 1):  # pragma: no cover - no workload
        raise ValueError("a floor with reads is one in-place stream")
    out: dict[str, MaybePrepare] = {"numpy": prepare_floor(kind, names, reads)}
    kern = _backend.compiled
    if kern is None:
        return out
    fill = kind == "fill"

    if reads:
        def c_reads(fused: bool, ahead: bool = False) -> MaybePrepare:
            def c(arrays: Arrays, threads: int) -> Runner | None:
                every = (*names, *reads)
                if not all(_c_ready(arrays[n]) for n in every):
                    return None
                size = arrays[names[0]].nbytes
                if fused and any(arrays[n].nbytes != size for n in reads) and not (
                        len(reads) == 1 and arrays[reads[0]].nbytes
                        and size % arrays[reads[0]].nbytes == 0):
                    return None
                target = arrays[names[0]]
                mine = tuple(arrays[n] for n in reads)

                def run(a: Arrays) -> Result:
                    if a is arrays:
                        kern.stream_reads(target, mine, threads, fused, 0, ahead)
                    else:
                        kern.stream_reads(a[names[0]], tuple(a[n] for n in reads), threads,
                                          fused, 0, ahead)
                    return ()
                return run
            return c
        out["c"] = c_reads(True)
        out["c-split"] = c_reads(False)
        out["c-split-ahead"] = c_reads(False, ahead=True)
        return out

    def c_form(nontemporal: bool, ahead: bool = False) -> MaybePrepare:
        def c(arrays: Arrays, threads: int) -> Runner | None:
            if not all(_c_ready(arrays[n]) for n in names):
                return None
            word = 0
            if fill:
                # the bytes of a float 1 (the NumPy form's value), repeated to a word
                one = np.ones(8 // arrays[names[0]].itemsize, arrays[names[0]].dtype)
                word = int(one.view(np.uint64)[0])

            # a decode call's floor is a microsecond: no tuple made per call
            mine = tuple(arrays[n] for n in names)

            def run(a: Arrays) -> Result:
                targets = mine if a is arrays else tuple(a[n] for n in names)
                kern.stream(targets, fill, word, threads, nontemporal, ahead)
                return ()
            return run
        return c

    out["c"] = c_form(False)
    out["c-ahead"] = c_form(False, ahead=True)
    if kern.STREAM_STORES:
        out["c-nt"] = c_form(True)
    return out
