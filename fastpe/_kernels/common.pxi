# Shared declarations of the kernels: storage types, conversions, the thread
# pattern. Included by kernels.pyx, so every ISA variant compiles its own copy.

from cpython.pyport cimport PY_SSIZE_T_MAX

cdef extern from "fastpe_math.h" nogil:
    ctypedef struct fpe_f16:
        uint16_t bits
    ctypedef struct fpe_bf16:
        uint16_t bits
    float fpe_f16_load(fpe_f16 h)
    fpe_f16 fpe_f16_make(float f)
    float fpe_bf16_load(fpe_bf16 h)
    fpe_bf16 fpe_bf16_make(float f)
    void fpe_f16_run_load(const fpe_f16 *src, float *dst, Py_ssize_t n)
    void fpe_f16_run_store(const float *src, fpe_f16 *dst, Py_ssize_t n)
    void fpe_bf16_run_load(const fpe_bf16 *src, float *dst, Py_ssize_t n)
    void fpe_bf16_run_store(const float *src, fpe_bf16 *dst, Py_ssize_t n)
    void fpe_f16_run_stream(const float *src, fpe_f16 *dst, Py_ssize_t n)
    void fpe_bf16_run_stream(const float *src, fpe_bf16 *dst, Py_ssize_t n)
    void fpe_f16_add_rows(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride, const fpe_f16 *t,
                          Py_ssize_t n, Py_ssize_t ahead)
    void fpe_bf16_add_rows(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride, const fpe_bf16 *t,
                           Py_ssize_t n, Py_ssize_t ahead)
    void fpe_f16_madd_rows(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride, const float *pe,
                           Py_ssize_t n, float scale, Py_ssize_t ahead)
    void fpe_bf16_madd_rows(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride, const float *pe,
                            Py_ssize_t n, float scale, Py_ssize_t ahead)
    Py_ssize_t fpe_f32_madd_rows(float *x, Py_ssize_t rows, Py_ssize_t stride, const float *pe,
                                 Py_ssize_t n, float scale, Py_ssize_t ahead)
    void fpe_pe_row_stream_f32(const double *s, const double *c, float *pe, Py_ssize_t dim,
                               Py_ssize_t nfreq, double mult)
    void fpe_stream_fence()
    Py_ssize_t fpe_rows_copy_f32(float *mem, Py_ssize_t sd, float *tmp, Py_ssize_t w,
                                 Py_ssize_t n, int gather)
    void fpe_pe_row_stream_f64(const double *s, const double *c, double *pe, Py_ssize_t dim,
                               Py_ssize_t nfreq, double mult)
    void prefetch_lines "fpe_prefetch_lines" (const void *p, Py_ssize_t ahead,
                                              Py_ssize_t nbytes, int write)
    int fpe_pe_rows2_f32(double *s, double *c, const double *step_s, const double *step_c,
                         float *pe0, float *pe1, Py_ssize_t dim, Py_ssize_t nfreq,
                         double mult, int stream, void *x0, void *x1, Py_ssize_t nx,
                         int half, Py_ssize_t xs, float xscale)
    void fpe_rotate_f32(float *x, const float *c, const float *s, Py_ssize_t half, int neox,
                        int wide)
    void fpe_rotate_f64(double *x, const double *c, const double *s, Py_ssize_t half,
                        int neox)
    void fpe_rotate_heads_f32(float *q, Py_ssize_t hq, Py_ssize_t qh, float *k,
                              Py_ssize_t hk, Py_ssize_t kh, const float *c, const float *s,
                              const float *kc, const float *ks, Py_ssize_t half, int neox,
                              int wide)
    void fpe_rotate_heads_f64(double *q, Py_ssize_t hq, Py_ssize_t qh, double *k,
                              Py_ssize_t hk, Py_ssize_t kh, const double *c, const double *s,
                              Py_ssize_t half, int neox)
    void fpe_rotate_f16(fpe_f16 *x, const float *c, const float *s, Py_ssize_t half,
                        int neox)
    void fpe_rotate_bf16(fpe_bf16 *x, const float *c, const float *s, Py_ssize_t half,
                         int neox)
    void fpe_rotate_heads_f16(fpe_f16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_f16 *k,
                              Py_ssize_t hk, Py_ssize_t kh, const float *c, const float *s,
                              Py_ssize_t half, int neox, int cached)
    void fpe_rotate_heads_bf16(fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_bf16 *k,
                               Py_ssize_t hk, Py_ssize_t kh, const float *c, const float *s,
                               Py_ssize_t half, int neox, int cached)
    void fpe_sincos_row(double p, const double *w, double *s, double *c,
                        Py_ssize_t n, double scale)
    void fpe_sincos(const double *p, Py_ssize_t p_step, const double *w, double w_max,
                    double *s, double *c, Py_ssize_t n, double scale)
    double fpe_abs_max(const double *v, Py_ssize_t n)
    double fpe_abs_max_nan(const double *v, Py_ssize_t n)
    void fpe_sincos_f32(const double *p, Py_ssize_t p_step, const double *w, double w_max,
                        float *s, float *c, Py_ssize_t n, double sin_scale,
                        double cos_scale)
    int fpe_cpu_has_avx2()
    int fpe_cpu_has_avx512()
    int fpe_bf16_cvt_state(int on)
    void fpe_f32_nan_tops(float *v, Py_ssize_t n)
    void fpe_cpu_vendor(char *out)
    int fpe_cpu_family()
    Py_ssize_t fpe_rope_cached_bytes
    int fpe_rotate_half_lines
    const char *FASTPE_ISA
    const char *FASTPE_COMPILE_FLAGS
    int FPE_HALF_NATIVE
    int FPE_HALF_RUNS_512
    int FPE_HALF_ADD_RUNS
    int FPE_HALF_STREAM_ROWS
    int FPE_ROWS_VECTOR
    int FPE_PE_ROWS2
    int FPE_HALF_ROTATE

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define FPE_OPENMP 1
    #if _OPENMP >= 200805
    #define fpe_omp_thread_limit omp_get_thread_limit
    #else
    /* OpenMP 2.0 (MSVC's /openmp) has no thread limit, nor omp_get_thread_limit */
    #include <limits.h>
    static int fpe_omp_thread_limit(void) { return INT_MAX; }
    #endif
    #else
    #define FPE_OPENMP 0
    static int omp_get_max_threads(void) { return 1; }
    static int omp_get_thread_num(void) { return 0; }
    static int fpe_omp_thread_limit(void) { return 1; }
    #endif
    """
    int FPE_OPENMP
    int omp_get_max_threads() nogil
    int omp_get_thread_num() nogil
    int omp_get_thread_limit "fpe_omp_thread_limit" () nogil


cdef extern from *:
    """
    /* Set in the child of any fork() after this module loaded, C code's forks included
     * (they run none of Python's fork hooks): the child's OpenMP pool may be a dead copy
     * of the parent's, whose first parallel region would wait for threads that do not
     * exist, so every kernel there runs on one thread. */
    #if defined(_WIN32)
    static const int fpe_forked_child = 0;
    static int fpe_watch_forks(void) { return 0; }
    #else
    #include <pthread.h>
    static volatile int fpe_forked_child = 0;
    static void fpe_note_fork_child(void) { fpe_forked_child = 1; }
    static int fpe_watch_forks(void) { return pthread_atfork(NULL, NULL, fpe_note_fork_child); }
    #endif
    """
    const int fpe_forked_child
    int fpe_watch_forks()


cdef extern from "numpy/arrayobject.h":
    enum: NPY_HALF

# ml_dtypes registers bfloat16 at run time; fastpe._checks tells us its number.
cdef int bfloat16_typenum = -1
cdef int64_t INT64_MAX_VALUE = 0x7fffffffffffffff


def register_bfloat16(int typenum):
    """Record the NumPy type number of ml_dtypes.bfloat16 for the fast paths."""
    global bfloat16_typenum
    bfloat16_typenum = typenum


# Whether the float32, float16 and bfloat16 adds (add_learned's batch rows,
# add_sinusoidal's staged ones) prefetch the next token's rows as they add a token's
# (fastpe_math.h: fpe_f32_madd_rows); row_prefetch sets it, at import by the CPU's
# vendor. On an Intel Xeon the prefetch took (8, 2048, 1024) float32 add_learned to
# 0.78-0.84x the time, add_sinusoidal 0.87-0.93x (README). On an AMD Zen 4 it cost
# time: without it float32 and float16 add_learned took 0.73-0.94x the time, batch 2
# to 16, dim 1024 and 4096 (0.49-0.96x in float16), add_sinusoidal at batch 8 and 16
# 0.88-0.93x (level at batch 2); bfloat16 add_sinusoidal, whose rows' rounding keeps
# the core busy, 0.995-1.07x (one 1.22x), add_learned 0.68-1.22x. So it is on for Intel
# only (Zen 5's staging was measured without it).
cdef bint row_prefetch_on = True


def row_prefetch(object on=None):
    """Whether the float32, float16 and bfloat16 adds prefetch the next token's rows
    (software prefetch) as they add a token's, add_sinusoidal then taking its staged
    rows at most PREFETCH_LATE_ROWS batch rows at a time: on Intel CPUs from import
    (common.pxi says why); `on` sets it, for measurements and tests. The same bits
    either way."""
    global row_prefetch_on
    if on is not None:
        row_prefetch_on = bool(on)
    return row_prefetch_on


# Rows of consecutive positions share one seed of sin/cos every BLOCK_TOKENS
# tokens (an angle-addition step between). Blocks start at fixed token indices,
# and a thread always takes whole blocks, so every thread count gives
# bit-identical results.
cdef enum:
    BLOCK_TOKENS = 32
    # float16/bfloat16 rows convert to float32 this many elements at a time,
    # on the stack, so the conversions run as vector code (gather/scatter)
    CONVERT_CHUNK = 256
    # a one-thread call that moves at most this many bytes runs holding the GIL
    # (keeps_gil)
    GIL_HELD_BYTES = 64 << 10

ctypedef fused store_t:
    float
    double
    fpe_f16
    fpe_bf16

ctypedef fused real_t:
    float
    double


cdef inline real_t load(const store_t *p, Py_ssize_t i, real_t kind) noexcept nogil:
    """p[i] as real_t; `kind` only picks the specialisation."""
    if store_t is fpe_f16:
        return <real_t>fpe_f16_load(p[i])
    elif store_t is fpe_bf16:
        return <real_t>fpe_bf16_load(p[i])
    else:
        return <real_t>p[i]


cdef inline void store(store_t *p, Py_ssize_t i, real_t v) noexcept nogil:
    if store_t is fpe_f16:
        p[i] = fpe_f16_make(<float>v)
    elif store_t is fpe_bf16:
        p[i] = fpe_bf16_make(<float>v)
    else:
        p[i] = <store_t>v


cdef inline void gather(const store_t *src, Py_ssize_t stride, real_t *dst,
                        Py_ssize_t n) noexcept nogil:
    """dst[j] = src[j * stride] for j < n, converted to real_t."""
    cdef Py_ssize_t j
    cdef real_t kind = 0
    if stride == 1:
        if store_t is fpe_f16 and real_t is float:
            fpe_f16_run_load(src, dst, n)
        elif store_t is fpe_bf16 and real_t is float:
            fpe_bf16_run_load(src, dst, n)
        else:
            for j in range(n):
                dst[j] = load(src, j, kind)
    else:
        for j in range(n):
            dst[j] = load(src, j * stride, kind)


cdef inline void scatter(const real_t *src, store_t *dst, Py_ssize_t stride,
                         Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    if stride == 1:
        if store_t is fpe_f16 and real_t is float:
            fpe_f16_run_store(src, dst, n)
        elif store_t is fpe_bf16 and real_t is float:
            fpe_bf16_run_store(src, dst, n)
        else:
            for j in range(n):
                store(dst, j, src[j])
    else:
        for j in range(n):
            store(dst, j * stride, src[j])


cdef inline void gather_code(const char *src, int code, Py_ssize_t stride, real_t *dst,
                             Py_ssize_t n) noexcept nogil:
    """gather() from a buffer whose storage type is only known at run time."""
    if code == CODE_F32:
        gather(<const float *>src, stride, dst, n)
    elif code == CODE_F64:
        gather(<const double *>src, stride, dst, n)
    elif code == CODE_F16:
        gather(<const fpe_f16 *>src, stride, dst, n)
    else:
        gather(<const fpe_bf16 *>src, stride, dst, n)


cdef inline Py_ssize_t ceil_div(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef inline Py_ssize_t round_up(Py_ssize_t n, Py_ssize_t to) noexcept nogil:
    return ceil_div(n, to) * to


cdef struct Work:
    char *base               # 64-byte aligned
    Py_ssize_t per_thread    # bytes, a multiple of 64


cdef inline char *work_for(Work w, int thread) noexcept nogil:
    return w.base + w.per_thread * thread


cdef class Scratch:
    """Work space: one slice per thread plus one shared slice, allocated with
    the GIL held so that running out of memory is a MemoryError before any
    write, not a silent skip."""
    cdef char *data
    cdef Work work
    cdef char *shared

    def __cinit__(self, Py_ssize_t per_thread_bytes, int nthreads, Py_ssize_t shared_bytes=0):
        cdef Py_ssize_t per_thread = round_up(max(per_thread_bytes, 64), 64)
        # a size past Py_ssize_t would wrap to a small allocation that the loops overrun
        if (per_thread_bytes < 0 or shared_bytes < 0 or shared_bytes > PY_SSIZE_T_MAX // 2
                or per_thread > (PY_SSIZE_T_MAX // 2 - shared_bytes) // max(nthreads, 1)):
            raise MemoryError("fastpe: kernel work space too large to address")
        self.data = <char *>malloc(per_thread * nthreads + round_up(shared_bytes, 64) + 64)
        if self.data == NULL:
            raise MemoryError("fastpe: could not allocate kernel work space")
        # 64-byte aligned slices, a cache line apart at least: no false sharing.
        self.work.base = <char *>((<size_t>self.data + 63) & ~(<size_t>63))
        self.work.per_thread = per_thread
        self.shared = self.work.base + per_thread * nthreads

    def __dealloc__(self):
        free(self.data)


cdef inline bint keeps_gil(int nthreads, Py_ssize_t nbytes) noexcept nogil:
    """Whether a call's loops run holding the GIL: on one thread, over at most
    GIL_HELD_BYTES. They take a few microseconds at most (a decode step's, about one),
    too short for another thread to use the GIL in between, and releasing and taking it
    back costs two mutex round trips."""
    return nthreads == 1 and nbytes <= GIL_HELD_BYTES


cdef inline int units_threads(Py_ssize_t nunits, int num_threads) noexcept nogil:
    """Never more threads than work units, and one in a fork child (fpe_forked_child) or
    where fewer than one is asked for."""
    if num_threads < 2 or fpe_forked_child:
        return 1
    if nunits < num_threads:
        return <int>max(nunits, 1)
    return num_threads


cdef inline Py_ssize_t elem_stride(cnp.ndarray a, int axis) noexcept:
    return cnp.PyArray_STRIDES(a)[axis] // cnp.PyArray_ITEMSIZE(a)


cdef struct View:
    # an operand's memory as the compiled entries check and read it: an ndarray's
    # (array_view) or a torch CPU tensor's, read without making an ndarray (tensor_view)
    char *data
    int ndim
    int typenum                        # NumPy's type number (bfloat16: ml_dtypes')
    Py_ssize_t itemsize
    Py_ssize_t size                    # elements
    bint writable
    bint aligned                       # data and strides multiples of the item size
    bint native                        # native byte order
    bint c_contiguous
    Py_ssize_t shape[VIEW_DIMS]
    Py_ssize_t strides[VIEW_DIMS]      # in bytes


cdef bint array_view(cnp.ndarray a, View *v) noexcept:
    """a's View; False for more than VIEW_DIMS dimensions."""
    cdef int i, nd = cnp.PyArray_NDIM(a)
    if nd > VIEW_DIMS:
        return False
    v.data = <char *>cnp.PyArray_DATA(a)
    v.ndim = nd
    v.typenum = cnp.PyArray_TYPE(a)
    v.itemsize = cnp.PyArray_ITEMSIZE(a)
    v.size = cnp.PyArray_SIZE(a)
    v.writable = cnp.PyArray_ISWRITEABLE(a)
    v.aligned = cnp.PyArray_ISALIGNED(a)
    v.native = cnp.PyArray_ISNOTSWAPPED(a)
    v.c_contiguous = cnp.PyArray_IS_C_CONTIGUOUS(a)
    for i in range(nd):
        v.shape[i] = cnp.PyArray_DIMS(a)[i]
        v.strides[i] = cnp.PyArray_STRIDES(a)[i]
    return True


cdef inline bint view_whole_strides(const View *v) noexcept:
    """Whether every stride of v is a whole number of elements."""
    cdef int i
    for i in range(v.ndim):
        if v.strides[i] % v.itemsize:
            return False
    return True


cdef void byte_extent(const View *x, size_t *lo, size_t *hi) noexcept:
    """[lo, hi) of the bytes x can touch."""
    cdef size_t start = <size_t>x.data
    cdef Py_ssize_t low = 0, high = x.itemsize, n
    cdef int i
    for i in range(x.ndim):
        n = x.shape[i]
        if n == 0:
            lo[0] = hi[0] = start
            return
        if x.strides[i] < 0:
            low += (n - 1) * x.strides[i]
        else:
            high += (n - 1) * x.strides[i]
    lo[0], hi[0] = start + low, start + high


cdef int float_code(int typenum) noexcept:
    """Storage code of a float type number, else -1."""
    if typenum == cnp.NPY_FLOAT:
        return CODE_F32
    if typenum == cnp.NPY_DOUBLE:
        return CODE_F64
    if typenum == NPY_HALF:
        return CODE_F16
    if typenum == bfloat16_typenum and typenum >= 0:
        return CODE_BF16
    return -1


cdef int view_code(const View *v) noexcept:
    """Storage code of a writable, aligned, native float view, else -1."""
    if not (v.writable and v.aligned and v.native):
        return -1
    return float_code(v.typenum)


cdef int fast_code(object x) noexcept:
    """Storage code of a plain, aligned, native, writable float array, else -1."""
    if not cnp.PyArray_CheckExact(x):
        return -1
    cdef cnp.ndarray a = <cnp.ndarray>x
    if not (cnp.PyArray_ISWRITEABLE(a) and cnp.PyArray_ISALIGNED(a) and cnp.PyArray_ISNOTSWAPPED(a)):
        return -1
    return float_code(cnp.PyArray_TYPE(a))


cdef bint whole_element_strides(cnp.ndarray x) noexcept:
    """Whether every stride of x is a whole number of elements."""
    cdef int ax
    for ax in range(cnp.PyArray_NDIM(x)):
        if cnp.PyArray_STRIDES(x)[ax] % cnp.PyArray_ITEMSIZE(x):
            return False
    return True


cdef int fast_rows(object x, Py_ssize_t *dims, Py_ssize_t *strides) noexcept:
    """fast_code of an x of 2 or 3 dimensions with whole-element strides and disjoint
    elements, its sizes and element strides filled in as (batch, seq, width): batch
    1 (stride 0) for 2-D; else -1. What the compiled fast paths of the adds take."""
    cdef int code = fast_code(x)
    if code < 0:
        return -1
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int ax, nd = cnp.PyArray_NDIM(a)
    if nd < 2 or nd > 3 or not whole_element_strides(a) or not elements_disjoint(a):
        return -1
    dims[0], strides[0] = 1, 0
    for ax in range(nd):
        dims[3 - nd + ax] = cnp.PyArray_DIMS(a)[ax]
        strides[3 - nd + ax] = elem_stride(a, ax)
    return code


cdef bint views_overlap(const View *a, const View *b) noexcept:
    """Whether the byte ranges of a and b intersect (they may share memory)."""
    cdef size_t alo, ahi, blo, bhi
    byte_extent(a, &alo, &ahi)
    byte_extent(b, &blo, &bhi)
    return alo < bhi and blo < ahi


cdef bint extents_overlap(cnp.ndarray a, cnp.ndarray b) noexcept:
    """views_overlap of two arrays (True, maybe overlapping, past VIEW_DIMS)."""
    cdef View va, vb
    if not (array_view(a, &va) and array_view(b, &vb)):
        return True
    return views_overlap(&va, &vb)


cdef inline Py_ssize_t gcd(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    while b:
        a, b = b, a % b
    return a


cdef bint lattice_apart(const View *a, const View *b) noexcept:
    """Whether no byte of an element of a is a byte of an element of b, proven on
    a period R that every stride of both views longer than some threshold is a
    multiple of, when the shorter strides of each view span less than R: the
    bytes of each view then fall, modulo R, in one interval, and two disjoint
    intervals prove the views apart. This is what q and k sliced from one fused
    QKV row (each token's row holding both) are; False when no threshold proves it
    (which does not mean they overlap). fastpe._checks.lattice_apart in Python."""
    cdef const View *x
    cdef Py_ssize_t st[2][VIEW_DIMS]
    cdef Py_ssize_t sz[2][VIEW_DIMS]
    cdef int m[2]
    cdef size_t lo[2]
    cdef size_t hi
    cdef int side, i, c
    cdef Py_ssize_t span[2]
    cdef Py_ssize_t s, n, threshold, period, d
    for side in range(2):
        x = a if side == 0 else b
        m[side] = 0
        byte_extent(x, &lo[side], &hi)
        for i in range(x.ndim):
            n = x.shape[i]
            if n == 0:
                return True  # no elements: nothing to share
            if n > 1:
                s = magnitude(x.strides[i])
                st[side][m[side]], sz[side][m[side]] = s, n
                m[side] += 1
    # each stride in turn is the threshold between the outer and inner axes
    for c in range(m[0] + m[1]):
        threshold = st[0][c] if c < m[0] else st[1][c - m[0]]
        period = 0
        for side in range(2):
            span[side] = (a if side == 0 else b).itemsize
            for i in range(m[side]):
                if st[side][i] >= threshold:
                    period = gcd(period, st[side][i])
                else:
                    span[side] += (sz[side][i] - 1) * st[side][i]
        if period == 0 or span[0] + span[1] > period:
            continue
        d = (<Py_ssize_t>(lo[1] - lo[0])) % period
        if d < 0:
            d += period
        if d >= span[0] and period - d >= span[1]:
            return True
    return False


cdef bint apart_views(const View *a, const View *b) noexcept:
    """Whether a and b provably share no memory: byte ranges apart, or the
    lattice proof (lattice_apart)."""
    return not views_overlap(a, b) or lattice_apart(a, b)


cdef bint views_apart(cnp.ndarray a, cnp.ndarray b) noexcept:
    """apart_views of two arrays (False, not proven, past VIEW_DIMS)."""
    cdef View va, vb
    return array_view(a, &va) and array_view(b, &vb) and apart_views(&va, &vb)


cdef bint view_elements_disjoint(const View *x) noexcept:
    """fastpe._checks.elements_disjoint in C: sorted by stride, each axis steps
    past everything the smaller axes span (so no two elements share memory)."""
    cdef int i, j, m = 0
    cdef Py_ssize_t strides[VIEW_DIMS]
    cdef Py_ssize_t sizes[VIEW_DIMS]
    cdef Py_ssize_t s, n, span = x.itemsize
    if x.size == 0:
        return True
    for i in range(x.ndim):
        n = x.shape[i]
        if n > 1:
            s = magnitude(x.strides[i])
            j = m  # insertion sort: at most VIEW_DIMS axes
            while j > 0 and strides[j - 1] > s:
                strides[j], sizes[j] = strides[j - 1], sizes[j - 1]
                j -= 1
            strides[j], sizes[j] = s, n
            m += 1
    for i in range(m):
        if strides[i] < span:
            return False
        span += strides[i] * (sizes[i] - 1)
    return True


cdef bint elements_disjoint(cnp.ndarray x) noexcept:
    """view_elements_disjoint of an array (False, not proven, past VIEW_DIMS)."""
    cdef View v
    return array_view(x, &v) and view_elements_disjoint(&v)


cdef inline Py_ssize_t magnitude(Py_ssize_t n) noexcept nogil:
    return -n if n < 0 else n


cdef inline int64_t position_at(const int64_t *pos, Py_ssize_t row, Py_ssize_t s,
                                Py_ssize_t t, int64_t offset) noexcept nogil:
    """Position of token t of row `row` of a (rows, s) positions array, or offset + t."""
    if pos == NULL:
        return offset + t
    return pos[row * s + t]


cdef inline void advance_angles(double *s, double *c, const double *step_s,
                                const double *step_c, Py_ssize_t n) noexcept nogil:
    """(s, c) of angle a -> (s, c) of a + step, by the angle-addition formulas."""
    cdef Py_ssize_t i
    cdef double si, ci
    for i in range(n):
        si = s[i]
        ci = c[i]
        s[i] = si * step_c[i] + ci * step_s[i]
        c[i] = ci * step_c[i] - si * step_s[i]


cdef inline void angles_for_token(double *s, double *c, const double *w, double w_max,
                                  const double *step_s, const double *step_c,
                                  Py_ssize_t n, int64_t p, int64_t prev_p,
                                  bint first_in_block) noexcept nogil:
    """Advance (s, c) = (sin, cos)(p * w) from the previous token's, or seed it (w_max:
    fpe_abs_max(w, n))."""
    cdef double pd = <double>p
    if first_in_block or p != prev_p + 1:
        fpe_sincos(&pd, 0, w, w_max, s, c, n, 1.0)
    else:
        advance_angles(s, c, step_s, step_c, n)


cdef bint read_positions(const View *pa, int64_t *out) noexcept:
    """Integer positions of any width and signedness into out as int64; False when
    one is past the int64 range (a uint64 above 2**63 - 1)."""
    cdef Py_ssize_t i, n = pa.size
    cdef const char *p = pa.data
    cdef Py_ssize_t size = pa.itemsize
    cdef bint unsigned = cnp.PyTypeNum_ISUNSIGNED(pa.typenum)
    for i in range(n):
        if unsigned:
            if size == 1:
                out[i] = (<const uint8_t *>p)[i]
            elif size == 2:
                out[i] = (<const uint16_t *>p)[i]
            elif size == 4:
                out[i] = (<const uint32_t *>p)[i]
            elif (<const uint64_t *>p)[i] > <uint64_t>INT64_MAX_VALUE:
                return False
            else:
                out[i] = <int64_t>(<const uint64_t *>p)[i]
        elif size == 1:
            out[i] = (<const int8_t *>p)[i]
        elif size == 2:
            out[i] = (<const int16_t *>p)[i]
        elif size == 4:
            out[i] = (<const int32_t *>p)[i]
        else:
            out[i] = (<const int64_t *>p)[i]
    return True


cdef bint per_sequence_rows(const View *a, Py_ssize_t batch, Py_ssize_t length,
                            Py_ssize_t *rows) noexcept:
    """Whether a is (length,), shared by every sequence, or (1 or batch, length); its
    rows (1 or batch) into *rows."""
    if a.ndim == 1 and a.shape[0] == length:
        rows[0] = 1
        return True
    if a.ndim == 2 and a.shape[1] == length and (a.shape[0] == 1 or a.shape[0] == batch):
        rows[0] = a.shape[0]
        return True
    return False


cdef int64_t *owned_view_positions(const View *pa, const View *x, Py_ssize_t batch,
                                   Py_ssize_t seq, int64_t top, int64_t *buf, Py_ssize_t cap,
                                   Py_ssize_t *rows) noexcept:
    """The positions of a (batch, seq, ...) call on x, owned by the call: pa an
    aligned, native, C-contiguous integer view (seq,) or (1 or batch, seq) whose bytes
    are apart from x's, copied into buf (up to its cap values) or a malloc'd block
    (the caller frees what is not buf), then checked: every value in [0, top]. The
    copy, with its rows in *rows; NULL, nothing allocated, otherwise. Copied before
    checked: a rewrite by another thread cannot move a read past a table."""
    cdef int64_t *out
    cdef Py_ssize_t i, n
    if (not cnp.PyTypeNum_ISINTEGER(pa.typenum) or not pa.c_contiguous or not pa.aligned
            or not pa.native or views_overlap(x, pa)):
        return NULL
    if not per_sequence_rows(pa, batch, seq, rows):
        return NULL
    n = pa.size
    out = buf if n <= cap else <int64_t *>malloc(max(n, 1) * sizeof(int64_t))
    if out == NULL:
        return NULL
    if read_positions(pa, out):
        for i in range(n):
            if not 0 <= out[i] <= top:
                break
        else:
            return out
    if out != buf:
        free(out)
    return NULL


cdef int64_t *owned_positions(object positions, cnp.ndarray x, Py_ssize_t batch,
                              Py_ssize_t seq, int64_t top, int64_t *buf, Py_ssize_t cap,
                              Py_ssize_t *rows) noexcept:
    """owned_view_positions of `positions`, an exact array, on the array x."""
    cdef View pv, xv
    if (not cnp.PyArray_CheckExact(positions)
            or not array_view(<cnp.ndarray>positions, &pv) or not array_view(x, &xv)):
        return NULL
    return owned_view_positions(&pv, &xv, batch, seq, top, buf, cap, rows)
