# cython: language_level=3
"""Compiled loops of fastpe.

Every function here takes arguments that fastpe's Python layer has already
validated and normalised (shapes, dtypes as storage codes, element-aligned
strides, int64 positions in range, float64 frequencies); none of them raises
on data, and each writes only inside the views it is given.

This one source is built once per instruction-set level (kernels_baseline,
and kernels_avx2 on x86-64); fastpe._kernels imports the best the CPU runs.
"""

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int64_t, uint16_t
from libc.stdlib cimport free, malloc

cnp.import_array()

include "common.pxi"
include "sinusoidal.pxi"
include "learned.pxi"
include "rope.pxi"
include "alibi.pxi"


ISA = FASTPE_ISA.decode()
COMPILE_FLAGS = FASTPE_COMPILE_FLAGS.decode()
OPENMP = bool(FPE_OPENMP)
HALF_CONVERSION = "hardware" if FPE_HALF_NATIVE else "software"


def cpu_supports(str isa):
    """Whether this CPU (and OS) runs the given kernel variant."""
    if isa == "baseline":
        return True
    if isa == "avx2":
        return bool(fpe_cpu_has_avx2())
    return False


def openmp_max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS and threadpoolctl; 1 without OpenMP."""
    return omp_get_max_threads()


def int64_range(cnp.ndarray a):
    """(min, max) of a non-empty C-contiguous int64 array, in one pass."""
    cdef const int64_t *p = <const int64_t *>cnp.PyArray_DATA(a)
    cdef Py_ssize_t i, n = cnp.PyArray_SIZE(a)
    cdef int64_t lo = p[0], hi = p[0]
    for i in range(n):
        lo = min(lo, p[i])
        hi = max(hi, p[i])
    return lo, hi
