# cython: language_level=3
"""Compiled loops of fastpe.

One front door per operation: rope_call, learned_call, sinusoidal_call and
alibi_call take the caller's objects and check them here, in C. Each either runs the
case it documents and returns True (rope_call: 1, or a large call's byte count asking
for a team), or returns False having written nothing; the Python layer then validates
the call in full (and names what is wrong) and calls the same entry again with the
normalised arguments. None of them raises on data, calls back into fastpe's Python,
or writes outside the views it is given; positions, masks and slopes they read
without the GIL are their own copies. rope_call views plain torch CPU tensors itself
(tensors.pxi); torch_views does it for the Python layer, declining anything else to
it.

This one source is built once per instruction-set level (kernels_baseline,
and kernels_avx2 and kernels_avx512 on x86-64); fastpe._kernels imports the
variant it chooses for this CPU.
"""

cimport cython
cimport numpy as cnp
from cpython.dict cimport PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.tuple cimport PyTuple_GET_ITEM
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.float cimport FLT_MAX, FLT_MIN
from libc.math cimport exp, log
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cnp.import_array()

include "_constants.pxi"
include "common.pxi"
include "sinusoidal.pxi"
include "learned.pxi"
include "rope.pxi"
include "alibi.pxi"
include "floor.pxi"
include "relative.pxi"
include "tensors.pxi"


ISA = FASTPE_ISA.decode()
COMPILE_FLAGS = FASTPE_COMPILE_FLAGS.decode()
OPENMP = bool(FPE_OPENMP)
HALF_CONVERSION = "hardware" if FPE_HALF_NATIVE else "software"
# the 512-bit float16/bfloat16 loops (RoPE rows, the adds, ALiBi) are built in
HALF_RUNS_512 = bool(FPE_HALF_RUNS_512)


def cpu_supports(str isa):
    """Whether this CPU (and OS) runs the given kernel variant."""
    if isa == "baseline":
        return True
    if isa == "avx2":
        return bool(fpe_cpu_has_avx2())
    if isa == "avx512":
        return bool(fpe_cpu_has_avx512())
    return False


def cpu_vendor():
    """The CPU's vendor string (CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...);
    "" where there is no CPUID."""
    cdef char out[13]
    fpe_cpu_vendor(out)
    return out.decode("ascii", "replace")


def cpu_family():
    """The CPU's family (CPUID leaf 1, base plus extended: 26 for AMD's Zen 5); 0 where
    there is no CPUID."""
    return fpe_cpu_family()


def rope_cached_bytes(object limit=None):
    """The largest RoPE call (bytes of q and k) taken as in the caches: its float32 rows
    512 bits at a time (avx512 variant; larger calls 256 bits at a time), its bfloat16
    rows inline in the loop over heads (larger calls: a call per row). Chosen at import by
    the CPU's vendor (fastpe_math.h says why); `limit` sets it, for tests of both forms
    (0: every call as streamed from memory, sys.maxsize: every call as in the caches).
    The same bits either way."""
    global fpe_rope_cached_bytes
    if limit is not None:
        if not 0 <= limit <= PY_SSIZE_T_MAX:
            raise ValueError(f"limit must be in 0..{PY_SSIZE_T_MAX}, got {limit}")
        fpe_rope_cached_bytes = limit
    return fpe_rope_cached_bytes


def rotate_half_lines(object on=None):
    """Whether rotate_half rows of calls past rope_cached_bytes (streamed from memory)
    take the walks of rows in the caches (float32 rows from a cache line boundary,
    bfloat16 rows inline in the loop over heads): on AMD's family 25 (Zen 3 and Zen 4)
    from import (fastpe_math.h says why); `on` sets it, for measurements and tests. The
    same bits either way, but for which payload a result keeps where two NaNs meet."""
    global fpe_rotate_half_lines
    if on is not None:
        fpe_rotate_half_lines = 1 if on else 0
    return bool(fpe_rotate_half_lines)


def bf16_hardware_narrowing(object on=None):
    """Whether the vector loops of bfloat16 results (RoPE rows, the sinusoidal and learned
    adds, ALiBi) narrow float32 by AVX512_BF16's VCVTNE2PS2BF16 (avx2 and avx512
    variants, on the CPUs that have it: on from import), or by integer rounding; `on`
    sets it, for tests of both (True holds only where the instruction is built in and
    the CPU runs it). The same bits either way (fastpe_math.h says how)."""
    if on is not None:
        fpe_bf16_cvt_state(1 if on else 0)
    return bool(fpe_bf16_cvt_state(-1))


if fpe_watch_forks() != 0:
    raise ImportError("fastpe: pthread_atfork could not register the kernels' fork handler")
bf16_hardware_narrowing(True)
# Intel: every call; elsewhere (AMD Zen 5) calls whose rows are likely in the caches
rope_cached_bytes(PY_SSIZE_T_MAX if cpu_vendor() == "GenuineIntel" else ROPE_CACHED_BYTES)
# (sinusoidal.pxi: measured on an Intel Xeon, a Zen 4 and a Zen 5)
if cpu_vendor() == "GenuineIntel":
    sinusoidal_staging(256 << 10, 8, EARLY_ROWS)
elif cpu_vendor() == "AuthenticAMD" and cpu_family() == 25:  # Zen 3 and Zen 4
    sinusoidal_staging(1 << 20, 2, 0)
else:
    sinusoidal_staging(1 << 20, 4, EARLY_ROWS)
# Intel only: on a Zen 4 the adds took 0.73-0.94x the time without (common.pxi)
row_prefetch(cpu_vendor() == "GenuineIntel")
# Zen 3 and Zen 4 only: on a Zen 5 it took 1.3x the time (fastpe_math.h)
rotate_half_lines(cpu_vendor() == "AuthenticAMD" and cpu_family() == 25)


def openmp_max_threads():
    """The largest team a parallel region gets: omp_get_max_threads() (OMP_NUM_THREADS,
    threadpoolctl) within omp_get_thread_limit() (OMP_THREAD_LIMIT, which the runtime
    holds every team to); 1 without OpenMP."""
    return min(omp_get_max_threads(), omp_get_thread_limit())


def int64_range(cnp.ndarray a):
    """(min, max) of a non-empty C-contiguous int64 array, in one pass."""
    cdef const int64_t *p = <const int64_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(a)
    cdef int64_t lo = p[0], hi = p[0]
    for i in range(n):
        lo = min(lo, p[i])
        hi = max(hi, p[i])
    return lo, hi
