# The bench's floor: the simplest loops that move a buffer's bytes at the machine's
# streaming speed, for `python -m fastpe bench` to measure fastpe against.
#
# A fill with ordinary stores reads every cache line before writing it (the core must
# own the line first: write-allocate), so it moves twice the bytes a table needs;
# non-temporal (streaming) stores write whole lines without reading them. For a
# read-modify-write pass, streaming stores skip the write-back of the line the load
# brought in, which pays past the caches and costs inside them: both forms are
# offered, and the bench keeps the fastest.

cdef extern from *:
    """
    #if defined(__AVX2__)
    #include <immintrin.h>
    #define FPE_FLOOR_STREAM_STORES 1
    #define FPE_FLOOR_VEC 4
    typedef __m256i fpe_floor_vec;
    #define fpe_floor_splat(v) _mm256_set1_epi64x((long long)(v))
    #define fpe_floor_load(p) _mm256_load_si256((const __m256i *)(p))
    #define fpe_floor_xor(a, b) _mm256_xor_si256((a), (b))
    #define fpe_floor_stream(p, v) _mm256_stream_si256((__m256i *)(p), (v))
    #elif defined(__SSE2__) || defined(_M_X64) || defined(_M_AMD64)
    #include <emmintrin.h>
    #define FPE_FLOOR_STREAM_STORES 1
    #define FPE_FLOOR_VEC 2
    typedef __m128i fpe_floor_vec;
    #define fpe_floor_splat(v) _mm_set1_epi64x((long long)(v))
    #define fpe_floor_load(p) _mm_load_si128((const __m128i *)(p))
    #define fpe_floor_xor(a, b) _mm_xor_si128((a), (b))
    #define fpe_floor_stream(p, v) _mm_stream_si128((__m128i *)(p), (v))
    #else
    #define FPE_FLOOR_STREAM_STORES 0
    #endif

    /* p[i] = v (fill) or p[i] ^= v, for n words, with streaming stores where the
     * CPU has them: plain words up to a vector boundary, whole vectors streamed,
     * plain words after; the fence orders the streamed lines before the call
     * returns, as fastpe's own streaming kernels do. */
    static void fpe_floor_words_nt(uint64_t *p, Py_ssize_t n, uint64_t v, int fill)
    {
        Py_ssize_t i = 0;
    #if FPE_FLOOR_STREAM_STORES
        fpe_floor_vec w = fpe_floor_splat(v);
        for (; i < n && ((uintptr_t)(p + i) % (8 * FPE_FLOOR_VEC)); i++)
            p[i] = fill ? v : p[i] ^ v;
        if (fill)
            for (; i + FPE_FLOOR_VEC <= n; i += FPE_FLOOR_VEC)
                fpe_floor_stream(p + i, w);
        else
            for (; i + FPE_FLOOR_VEC <= n; i += FPE_FLOOR_VEC)
                fpe_floor_stream(p + i, fpe_floor_xor(fpe_floor_load(p + i), w));
        _mm_sfence();
    #endif
        for (; i < n; i++)
            p[i] = fill ? v : p[i] ^ v;
    }

    /* p[i] = v (fill) or p[i] ^= v, a cache line at a time, each line's successor
     * FPE_FLOOR_AHEAD bytes on asked for first (a software prefetch, for writing). On
     * an Intel Xeon (2 vCPUs of a Sapphire Rapids) an in-place pass over 64 MiB so took
     * 0.80-0.88x the time of the plain loop with 512-bit registers, 0.70-0.85x with
     * 128-bit ones: the hardware's own prefetch leaves bandwidth unused there, and a
     * floor without this form was not the fastest pass (FPE_PREFETCH_AHEAD: the
     * address may lie past the array). */
    #define FPE_FLOOR_AHEAD 4096
    static void fpe_floor_words_ahead(uint64_t *p, Py_ssize_t n, uint64_t v, int fill)
    {
        Py_ssize_t i = 0;
        for (; i < n && ((uintptr_t)(p + i) & 63); i++)   /* then whole lines */
            p[i] = fill ? v : p[i] ^ v;
        for (; i + 8 <= n; i += 8) {
            FPE_PREFETCH_AHEAD(p + i, FPE_FLOOR_AHEAD);
            for (int j = 0; j < 8; j++)
                p[i + j] = fill ? v : p[i + j] ^ v;
        }
        for (; i < n; i++)
            p[i] = fill ? v : p[i] ^ v;
    }

    #if defined(__GNUC__) || defined(__clang__)
    #define FPE_FLOOR_READ_AHEAD(p) \
        __builtin_prefetch((const void *)((uintptr_t)(p) + FPE_FLOOR_AHEAD), 0, 3)
    #else
    #define FPE_FLOOR_READ_AHEAD(p) ((void)(p))
    #endif

    /* fpe_floor_words_ahead's pass over an array that is only read: the XOR of its
     * words, each line's successor FPE_FLOOR_AHEAD bytes on asked for first */
    static uint64_t fpe_floor_read_ahead(const uint64_t *p, Py_ssize_t n)
    {
        uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, r = 0;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) {
            FPE_FLOOR_READ_AHEAD(p + i);
            for (int j = 0; j < 8; j++)
                acc[j] ^= p[i + j];
        }
        for (; i < n; i++)
            r ^= p[i];
        for (int j = 0; j < 8; j++)
            r ^= acc[j];
        return r;
    }

    /* p[i] ^= a[i / ratio] & mask for i < n (a multiple of ratio): a read array ratio
     * times smaller than the target, read once in step with the target's pass. A line
     * of target words per read word (ratio 8: a learned table's rows beside a batch of
     * 8) goes in a loop the compiler vectorises, both streams prefetched FPE_FLOOR_AHEAD
     * bytes on (without, it took 1.05x the time of a read pass then the stream on an
     * Intel Xeon); other ratios in a plain loop. */
    static void fpe_floor_fold_spread(uint64_t *p, const uint64_t *a, Py_ssize_t n,
                                      Py_ssize_t ratio, uint64_t mask)
    {
        if (ratio == 8) {
            for (Py_ssize_t j = 0; j < n / 8; j++) {
                FPE_PREFETCH_AHEAD(p + 8 * j, FPE_FLOOR_AHEAD);
                if ((j & 7) == 0)
                    FPE_FLOOR_READ_AHEAD(a + j);
                const uint64_t v = a[j] & mask;
                for (int i = 0; i < 8; i++)
                    p[8 * j + i] ^= v;
            }
            return;
        }
        for (Py_ssize_t j = 0; j < n / ratio; j++) {
            const uint64_t v = a[j] & mask;
            for (Py_ssize_t i = 0; i < ratio; i++)
                p[j * ratio + i] ^= v;
        }
    }
    """
    int FPE_FLOOR_STREAM_STORES
    uint64_t read_ahead "fpe_floor_read_ahead" (const uint64_t *p, Py_ssize_t n) noexcept nogil
    void fold_spread "fpe_floor_fold_spread" (uint64_t *p, const uint64_t *a, Py_ssize_t n,
                                              Py_ssize_t ratio, uint64_t mask) noexcept nogil
    void words_ahead "fpe_floor_words_ahead" (uint64_t *p, Py_ssize_t n, uint64_t v,
                                              int fill) noexcept nogil
    void words_nt "fpe_floor_words_nt" (uint64_t *p, Py_ssize_t n, uint64_t v,
                                        int fill) noexcept nogil


cdef extern from *:
    """
    /* Each element widened to float32 and narrowed back, in place, in the widest
     * registers this build has: the least any kernel that computes a float16 or
     * bfloat16 array in float32 does per element, with no arithmetic between. */
    static void fpe_floor_f16_round_trip(fpe_f16 *p, Py_ssize_t n)
    {
        Py_ssize_t j = 0;
    #if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
        for (; j + 16 <= n; j += 16)
            fpe_f16x16_store(p + j, 0xffff, fpe_f16x16_load(p + j, 0xffff));
    #elif FPE_HALF_ADD_RUNS
        for (; j + 8 <= n; j += 8)
            fpe_f16x8_store(p + j, fpe_f16x8_load(p + j));
    #endif
        for (; j < n; j++)
            p[j] = fpe_f16_make(fpe_f16_load(p[j]));
    }

    /* (narrowed as the kernels narrow bfloat16: by VCVTNE2PS2BF16 where `cvt`) */
    static FPE_ALWAYS_INLINE void fpe_floor_bf16_round_trip_nc(fpe_bf16 *p, Py_ssize_t n,
                                                               int cvt)
    {
        Py_ssize_t j = 0;
    #if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
        __m512 lo, hi;
        for (; j + 32 <= n; j += 32) {
            fpe_bf16x32_load_inorder(p + j, &lo, &hi);
            FPE_BF16X32_STORE_INORDER(cvt, p + j, lo, hi);
        }
    #elif FPE_HALF_ADD_RUNS
        __m256 lo, hi;
        for (; j + 16 <= n; j += 16) {
            fpe_bf16x16_load_inorder(p + j, &lo, &hi);
            FPE_BF16X16_STORE_INORDER(cvt, p + j, lo, hi);
        }
    #endif
        (void)cvt;
        for (; j < n; j++)
            p[j] = fpe_bf16_make(fpe_bf16_load(p[j]));
    }

    #if FPE_BF16_CVT
    FPE_TARGET_BF16 static FPE_NOINLINE void fpe_floor_bf16_round_trip_cvt(fpe_bf16 *p,
                                                                          Py_ssize_t n)
    {
        fpe_floor_bf16_round_trip_nc(p, n, 1);
    }
    #endif

    static void fpe_floor_bf16_round_trip(fpe_bf16 *p, Py_ssize_t n)
    {
    #if FPE_BF16_CVT
        if (fpe_bf16_cvt) {
            fpe_floor_bf16_round_trip_cvt(p, n);
            return;
        }
    #endif
        fpe_floor_bf16_round_trip_nc(p, n, 0);
    }
    """
    void f16_round_trip "fpe_floor_f16_round_trip" (fpe_f16 *p, Py_ssize_t n) noexcept nogil
    void bf16_round_trip "fpe_floor_bf16_round_trip" (fpe_bf16 *p, Py_ssize_t n) noexcept nogil


STREAM_STORES = bool(FPE_FLOOR_STREAM_STORES)


cdef enum:
    STREAM_WORDS = 8192   # 64 KiB per unit of work


cdef inline Py_ssize_t words_to_boundary(const uint64_t *p, Py_ssize_t n) noexcept nogil:
    """The words from p to its first 32-byte boundary (at most n). The plain loops take
    them one at a time first, so that every vector the compiler makes of the rest is
    aligned: NumPy's large arrays start 16 bytes past a cache line, where every other
    256-bit load and store splits one; an in-place pass over 64 MiB so took 1.09x the
    time of the same pass on a line boundary on an AMD Zen 4, a slower floor than the
    kernels' own walks from a boundary."""
    return min(n, <Py_ssize_t>(((32 - (<size_t>p & 31)) & 31) // 8))


cdef void xor_words(uint64_t *p, Py_ssize_t n, uint64_t mask) noexcept nogil:
    cdef Py_ssize_t i, lead = words_to_boundary(p, n)
    for i in range(lead):
        p[i] = p[i] ^ mask
    for i in range(lead, n):
        p[i] = p[i] ^ mask


cdef void fill_words(uint64_t *p, Py_ssize_t n, uint64_t value) noexcept nogil:
    cdef Py_ssize_t i, lead = words_to_boundary(p, n)
    for i in range(lead):
        p[i] = value
    for i in range(lead, n):
        p[i] = value


cdef void stream_words(uint64_t *p, Py_ssize_t n, uint64_t word, bint fill,
                       bint nontemporal, bint ahead) noexcept nogil:
    if nontemporal:
        words_nt(p, n, word, fill)
    elif ahead:
        words_ahead(p, n, word, fill)
    elif fill:
        fill_words(p, n, word)
    else:
        xor_words(p, n, word)


cdef uint64_t read_words(const uint64_t *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, lead = words_to_boundary(p, n)
    cdef uint64_t acc = 0
    for i in range(lead):
        acc = acc ^ p[i]
    for i in range(lead, n):
        acc = acc ^ p[i]
    return acc


cdef void fold_words(uint64_t *p, const uint64_t **reads, int nreads, Py_ssize_t w0,
                     Py_ssize_t n, uint64_t mask) noexcept nogil:
    """p[i] ^= (reads[0][w0 + i] ^ ...) & mask for i < n."""
    cdef Py_ssize_t i
    cdef int r
    cdef uint64_t v
    cdef const uint64_t *a
    cdef const uint64_t *b
    if nreads == 2:                 # DeBERTa's two tables: a loop the compiler vectorises
        a = reads[0] + w0
        b = reads[1] + w0
        for i in range(n):
            p[i] = p[i] ^ ((a[i] ^ b[i]) & mask)
        return
    for i in range(n):
        v = 0
        for r in range(nreads):
            v = v ^ reads[r][w0 + i]
        p[i] = p[i] ^ (v & mask)


def stream_reads(cnp.ndarray target, tuple reads, int num_threads, bint fused=True,
                 uint64_t mask=0, bint ahead=False):
    """The floor of a call that writes `target` in place and reads `reads`: every word
    of target read and written once, every word of each read array read once. fused:
    in one pass (the read arrays as many bytes as target, at most 8 of them; or one read
    array whose words divide target's, each read word folded into the run of target
    words in its place: a learned table's rows beside the batch rows they are added
    to), else a pass over each read array, then target's (as stream() makes it, `ahead`
    too, and each read array's pass prefetched the same way). mask
    (0: values unchanged) is what the fused pass ANDs the reads' XOR with before XORing
    it into target; returns the XOR of the separate passes' words (so that no compiler
    drops them).

    arrays: C-contiguous, 8-byte aligned, nbytes multiples of 8 (the caller checks).
    """
    cdef cnp.ndarray a
    cdef uint64_t *p = <uint64_t *>cnp.PyArray_DATA(target)
    cdef Py_ssize_t n = cnp.PyArray_NBYTES(target) // 8, u, units, w0, m
    cdef const uint64_t *rp[8]
    cdef int nreads = len(reads), r, nthreads
    cdef uint64_t acc = 0
    cdef Py_ssize_t ratio, unit
    if fused and nreads == 1 and cnp.PyArray_NBYTES(<cnp.ndarray>reads[0]) < cnp.PyArray_NBYTES(target):
        a = <cnp.ndarray>reads[0]
        m = cnp.PyArray_NBYTES(a) // 8
        if m == 0 or n % m:
            raise ValueError("stream_reads: a fused pass needs a read array whose words "
                             "divide the target's")
        ratio = n // m
        unit = max(1, STREAM_WORDS // ratio) * ratio
        rp[0] = <const uint64_t *>cnp.PyArray_DATA(a)
        units = ceil_div(n, unit)
        nthreads = units_threads(units, num_threads)
        with nogil:
            if nthreads > 1:
                for u in prange(units, schedule="static", num_threads=nthreads):
                    w0 = u * unit
                    fold_spread(p + w0, rp[0] + w0 // ratio, min(unit, n - w0), ratio, mask)
            else:
                fold_spread(p, rp[0], n, ratio, mask)
        return 0
    if fused:
        if nreads > 8:
            raise ValueError("stream_reads: at most 8 read arrays in one pass")
        for r in range(nreads):
            a = <cnp.ndarray>reads[r]
            if cnp.PyArray_NBYTES(a) != cnp.PyArray_NBYTES(target):
                raise ValueError("stream_reads: a fused pass needs arrays of one size")
            rp[r] = <const uint64_t *>cnp.PyArray_DATA(a)
        units = ceil_div(n, STREAM_WORDS)
        nthreads = units_threads(units, num_threads)
        with nogil:
            if nthreads > 1:
                for u in prange(units, schedule="static", num_threads=nthreads):
                    w0 = u * STREAM_WORDS
                    fold_words(p + w0, rp, nreads, w0, min(<Py_ssize_t>STREAM_WORDS, n - w0),
                               mask)
            else:
                fold_words(p, rp, nreads, 0, n, mask)
        return 0
    cdef const uint64_t *q
    for a in reads:
        q = <const uint64_t *>cnp.PyArray_DATA(a)
        m = cnp.PyArray_NBYTES(a) // 8
        units = ceil_div(m, STREAM_WORDS)
        nthreads = units_threads(units, num_threads)
        with nogil:
            if nthreads > 1:
                for u in prange(units, schedule="static", num_threads=nthreads):
                    w0 = u * STREAM_WORDS
                    if ahead:
                        acc ^= read_ahead(q + w0, min(<Py_ssize_t>STREAM_WORDS, m - w0))
                    else:
                        acc ^= read_words(q + w0, min(<Py_ssize_t>STREAM_WORDS, m - w0))
            elif ahead:
                acc = acc ^ read_ahead(q, m)
            else:
                acc = acc ^ read_words(q, m)
    stream((target,), False, 0, num_threads, False, ahead)
    return acc


def stream(tuple arrays, bint fill, uint64_t word, int num_threads, bint nontemporal=False,
           bint ahead=False):
    """One pass over the bytes of each array, in place: each 8-byte word XORed
    with `word` (read and written once; word 0 leaves the values as they were),
    or, with fill, set to `word` (written once). nontemporal: with streaming
    stores where the CPU has them (STREAM_STORES), else the same plain loop.
    ahead (plain stores): each cache line's successor 4 KiB on prefetched first.
    One call for all the arrays, as a fastpe call takes q and k together: a
    small call's floor is then one call's overhead, not one per array.

    arrays: C-contiguous, 8-byte aligned, nbytes multiples of 8 (the caller checks).
    """
    cdef cnp.ndarray a
    cdef uint64_t *p
    cdef Py_ssize_t n, u, units, w0
    cdef int nthreads
    for a in arrays:
        p = <uint64_t *>cnp.PyArray_DATA(a)
        n = cnp.PyArray_NBYTES(a) // 8
        units = ceil_div(n, STREAM_WORDS)
        nthreads = units_threads(units, num_threads)
        with nogil:
            if nthreads > 1:
                for u in prange(units, schedule="static", num_threads=nthreads):
                    w0 = u * STREAM_WORDS
                    stream_words(p + w0, min(<Py_ssize_t>STREAM_WORDS, n - w0), word, fill,
                                 nontemporal, ahead)
            else:
                stream_words(p, n, word, fill, nontemporal, ahead)


def half_round_trip(tuple arrays):
    """Each element of each float16 or bfloat16 array widened to float32 and narrowed
    back, in place, on one thread (the values stay as they were): what a half-precision
    kernel computing in float32 cannot avoid, for the bench to set beside the floor.

    arrays: C-contiguous float16 arrays, or bfloat16 ones (ml_dtypes' type registered
    with the kernels); anything else is a TypeError.
    """
    cdef cnp.ndarray a
    cdef Py_ssize_t n
    cdef char *p
    cdef int typenum
    for a in arrays:
        typenum = cnp.PyArray_TYPE(a)
        if not cnp.PyArray_IS_C_CONTIGUOUS(a) or not (
                typenum == cnp.NPY_FLOAT16
                or (bfloat16_typenum >= 0 and typenum == bfloat16_typenum)):
            raise TypeError("half_round_trip takes C-contiguous float16 or bfloat16 arrays")
    for a in arrays:
        p = <char *>cnp.PyArray_DATA(a)
        n = cnp.PyArray_SIZE(a)
        typenum = cnp.PyArray_TYPE(a)
        with nogil:
            if typenum == cnp.NPY_FLOAT16:
                f16_round_trip(<fpe_f16 *>p, n)
            else:
                bf16_round_trip(<fpe_bf16 *>p, n)
