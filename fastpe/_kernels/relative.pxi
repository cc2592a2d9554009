# Relative-position biases of encoders, added to attention scores in place.
#
# T5 (Raffel et al., 2020): scores[b, h, i, j] (+)= table[bucket(j - qpos_i), h], -inf where
# masked (causal: j > qpos_i; key_mask[b, j] == 0). The bucket depends on the distance only
# and is constant past `reach`, so each head's bias is tabulated once per call by distance
# (bias_by_distance[h, d + reach], in the compute type), and a row of scores adds a
# contiguous slice of it: one read of the scores, a vector add, one write. A view whose
# queries lie closer in memory than its keys (K @ Q^T transposed), 16 queries or more,
# walks key columns instead (t5_column): the distance falls by one per query down a
# column, so a column adds a contiguous slice of the same biases tabulated by negated
# distance.
#
# DeBERTa-v2/v3 (He et al., 2021): scores[b, h, i, j] += c2p[b, h, i, ci(i - j)] +
# p2c[b, h, j, pi(i - j)], the gather indices a function of the distance too (the spec's
# tables, clamped past `reach`): content-to-position along the query's row of c2p,
# position-to-content down the keys' rows of p2c. The sum of the two logits rounds once
# before it is added, as transformers adds its `score` to the attention scores.
#
# float16/bfloat16 (and views whose keys are not adjacent) work through a float32 row
# chunk on the stack: converted in, the same arithmetic, converted out; T5's float16 and
# bfloat16 rows of adjacent keys in one pass, in registers, in the variants with F16C and
# FMA. DeBERTa's float16
# and bfloat16 with AVX2 take float32's vector blocks, widened and rounded in registers.

cdef enum:
    REL_CHUNK = 256
    # key columns of a unit of the column walk (t5_columns): its index arithmetic once per
    # 16 columns, not per column, took 0.68x the time on transposed (4, 12, 16, 512)
    T5_COLUMNS = 16
    # the fewest queries of a column walk: a column costs about 6 ns before its first
    # element, where the row walk's strided elements of a head in the caches take under
    # 1 ns each (transposed (4, 12, q, 512), one thread, AMD EPYC Zen 4: the column walk
    # took the row walk's time at q of 7 (float64), 10 (float32) and 13 (float16), and
    # 0.35-0.71x at 16)
    T5_COLUMN_QUERIES = 16
    # query rows of a DeBERTa unit: p2c's term of a key is a run of adjacent elements
    # of its row for adjacent queries, so a block of 16 float32 rows reads each line of
    # p2c once (64 rows measured no faster, with a tile four times larger)
    DEBERTA_ROWS = 16
    # keys per pass over the block: whole rows up to this many (rows of 256 keys, the
    # block's scores revisited once per chunk, measured 4x slower at 12 x 512 x 512)
    DEBERTA_CHUNK = 4096


cdef struct T5Call:
    Py_ssize_t batch, heads, q, k
    Py_ssize_t sh, sq, sk               # element strides of the scores
    const Py_ssize_t *boff              # element offset of each leading-dims row
    int64_t q_offset
    Py_ssize_t reach                    # distances clamp to [-reach, reach]
    Py_ssize_t width                    # 2 * reach + 1
    char *bias                          # (heads, width) real_t: bias by distance
    char *rbias                         # the same by negated distance (columns), or NULL
    const unsigned char *mask           # (mrows, k) 0/1, or NULL
    Py_ssize_t mrows
    bint causal, accumulate
    bint columns                        # walk key columns (t5_columns)
    Py_ssize_t nunits                   # units of work of the walk chosen


cdef inline Py_ssize_t t5_reach_start(const T5Call *a, int64_t qp, Py_ssize_t j0,
                                      Py_ssize_t j1) noexcept nogil:
    """The first key of [j0, j1) at or after qp - reach (j1 if none; qp >= 0)."""
    return <Py_ssize_t>min(max(qp - a.reach, <int64_t>j0), <int64_t>j1)


cdef inline Py_ssize_t t5_reach_end(const T5Call *a, int64_t qp, Py_ssize_t lo,
                                    Py_ssize_t j1) noexcept nogil:
    """The first key of [lo, j1) past qp + reach (j1 if none), without forming
    qp + reach + 1 where it would pass INT64_MAX."""
    if qp >= <int64_t>j1 - a.reach - 1:
        return j1
    return <Py_ssize_t>max(qp + a.reach + 1, <int64_t>lo)


cdef inline Py_ssize_t t5_causal_cut(const T5Call *a, int64_t qp) noexcept nogil:
    """The first key masked by causality (k if none): after qp."""
    if a.causal and qp < a.k - 1:  # not qp + 1: q_offset + i may be INT64_MAX
        return <Py_ssize_t>max(qp + 1, <int64_t>0)
    return a.k


cdef inline void t5_zones(real_t *x, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi, real_t first,
                          const real_t *mid, real_t last, bint accumulate) noexcept nogil:
    """x[t] (+)= first for t < lo, mid[t] for lo <= t < hi, last from hi on (lo <= hi <= n)."""
    cdef Py_ssize_t t
    if accumulate:
        for t in range(lo):
            x[t] = x[t] + first
        for t in range(lo, hi):
            x[t] = x[t] + mid[t]
        for t in range(hi, n):
            x[t] = x[t] + last
    else:
        for t in range(lo):
            x[t] = first
        for t in range(lo, hi):
            x[t] = mid[t]
        for t in range(hi, n):
            x[t] = last


cdef inline void t5_chunk(const T5Call *a, real_t *x, Py_ssize_t j0, Py_ssize_t n,
                          int64_t qp, const real_t *bias) noexcept nogil:
    """x[t] (+)= bias of key j0 + t for the query at qp: below the reach a constant,
    within it a contiguous slice of the head's distances, beyond it a constant."""
    cdef Py_ssize_t j1 = j0 + n
    cdef Py_ssize_t lo = t5_reach_start(a, qp, j0, j1)
    cdef Py_ssize_t hi = t5_reach_end(a, qp, lo, j1)
    # element t of the middle reads bias[j0 + t - qp + reach]
    cdef const real_t *mid = bias + (<int64_t>a.reach - qp)
    t5_zones(x, n, lo - j0, hi - j0, bias[0], mid + j0, bias[a.width - 1], a.accumulate)


cdef inline void mask_chunk(real_t *x, Py_ssize_t j0, Py_ssize_t n, Py_ssize_t cut,
                            const unsigned char *m) noexcept nogil:
    """-inf on the masked keys of x[0 .. n) (keys j0 ..): from cut on (t5_causal_cut), or
    m[j] == 0."""
    cdef Py_ssize_t j
    if m != NULL:
        for j in range(n):
            if m[j0 + j] == 0:
                x[j] = <real_t>-INFINITY
    for j in range(max(cut - j0, 0), n):
        x[j] = <real_t>-INFINITY


cdef extern from *:
    """
    /* A T5 row of unit-stride float16 or bfloat16 scores in one pass: each key widened,
     * its bias added (first below the reach, mid[j] within it, last beyond), -inf where
     * the key mask is 0 or from `cut` on (causal), narrowed, in registers, where the
     * chunked path converts through a float32 buffer on the stack and masks it in
     * separate passes (a float16 decode step took 1.25-1.3x the time that way). The same
     * bits: one float32 add and one rounding per element either way; bfloat16 rounds to
     * nearest even and quiets NaNs as fpe_bf16_make does, whatever the float32 (a bias
     * from the caller's table may be a NaN with low payload bits). */
    #if FPE_HALF_ADD_RUNS
    #define FPE_T5_HALF_ONE_PASS 1
    static inline __m256 fpe_t5_f16x8_load(const fpe_f16 *p) { return fpe_f16x8_load(p); }
    static inline void fpe_t5_f16x8_store(fpe_f16 *p, __m256 v) { fpe_f16x8_store(p, v); }
    static inline __m256 fpe_t5_bf16x8_load(const fpe_bf16 *p) { return fpe_bf16x8_widen(p); }
    /* fpe_bf16x8_bits where the float32 is not a NaN, else its top half quieted */
    static inline __m256i fpe_t5_bf16x8_bits(__m256 v)
    {
        const __m256i x = _mm256_castps_si256(v);
        const __m256i nan = _mm256_cmpgt_epi32(
            _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
        return _mm256_blendv_epi8(fpe_bf16x8_bits(v), quiet, nan);
    }
    static inline void fpe_t5_bf16x8_store(fpe_bf16 *p, __m256 v)
    {
        const __m256i b = fpe_t5_bf16x8_bits(v);   /* every lane below 2^16: packs exactly */
        _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(b),
                                                        _mm256_extracti128_si256(b, 1)));
    }
    #if FPE_HALF_RUNS_512
    static inline __m512 fpe_t5_f16x16_load(const fpe_f16 *p) { return fpe_f16x16_load(p, 0xffff); }
    static inline void fpe_t5_f16x16_store(fpe_f16 *p, __m512 v) { fpe_f16x16_store(p, 0xffff, v); }
    static inline __m512 fpe_t5_bf16x16_load(const fpe_bf16 *p) { return fpe_bf16x16_widen(p); }
    static inline void fpe_t5_bf16x16_store(fpe_bf16 *p, __m512 v)
    {
        const __m512i x = _mm512_castps_si512(v);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(
            _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i rounded = _mm512_srli_epi32(fpe_bf16x16_bits_high(v), 16);
        const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
        _mm256_storeu_si256((__m256i *)p,
                            _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
    }
    #endif

    /* keys [j, j1) of x: b[j] (along) or *b added (accumulate) or put, -inf where m[j]
     * is 0 */
    #if FPE_HALF_RUNS_512
    #define FPE_T5_SEG_512(SUF)                                                           \
        {                                                                                 \
            const __m512 ninf = _mm512_set1_ps(-INFINITY);                                \
            for (; j + 16 <= j1; j += 16) {                                               \
                __m512 v = along ? _mm512_loadu_ps(b + j) : _mm512_set1_ps(*b);           \
                if (accumulate)                                                           \
                    v = _mm512_add_ps(fpe_t5_##SUF##x16_load(x + j), v);                  \
                if (m != NULL) {                                                          \
                    const __m128i k = _mm_loadu_si128((const __m128i *)(m + j));          \
                    v = _mm512_mask_blend_ps(_mm_test_epi8_mask(k, k), ninf, v);          \
                }                                                                         \
                fpe_t5_##SUF##x16_store(x + j, v);                                        \
            }                                                                             \
        }
    #else
    #define FPE_T5_SEG_512(SUF)
    #endif
    #define FPE_T5_ROW(T, SUF, NINF)                                                      \
    static inline void fpe_t5_seg_##SUF(T *x, Py_ssize_t j, Py_ssize_t j1, const float *b, \
                                        int along, const unsigned char *m, int accumulate) \
    {                                                                                     \
        FPE_T5_SEG_512(SUF)                                                               \
        const __m256 ninf = _mm256_set1_ps(-INFINITY);                                    \
        for (; j + 8 <= j1; j += 8) {                                                     \
            __m256 v = along ? _mm256_loadu_ps(b + j) : _mm256_set1_ps(*b);               \
            if (accumulate)                                                               \
                v = _mm256_add_ps(fpe_t5_##SUF##x8_load(x + j), v);                       \
            if (m != NULL) {                                                              \
                const __m256i k = _mm256_cvtepu8_epi32(                                   \
                    _mm_loadl_epi64((const __m128i *)(m + j)));                           \
                v = _mm256_blendv_ps(v, ninf, _mm256_castsi256_ps(                        \
                    _mm256_cmpeq_epi32(k, _mm256_setzero_si256())));                      \
            }                                                                             \
            fpe_t5_##SUF##x8_store(x + j, v);                                             \
        }                                                                                 \
        for (; j < j1; j++) {                                                             \
            const float v = along ? b[j] : *b;                                            \
            x[j] = fpe_##SUF##_make(m != NULL && m[j] == 0 ? -INFINITY                    \
                                    : accumulate ? fpe_##SUF##_load(x[j]) + v : v);       \
        }                                                                                 \
    }                                                                                     \
    /* keys [0, lo) add first, [lo, hi) mid[j], [hi, cut) last, [cut, n) are -inf        \
     * (0 <= lo <= hi <= n, cut <= n) */                                                  \
    static FPE_NOINLINE void fpe_t5_row_##SUF(T *x, Py_ssize_t n, Py_ssize_t lo,          \
                                              Py_ssize_t hi, Py_ssize_t cut, float first, \
                                              const float *mid, float last,               \
                                              const unsigned char *m, int accumulate)     \
    {                                                                                     \
        const Py_ssize_t a = lo < cut ? lo : cut, c = hi < cut ? hi : cut;                \
        fpe_t5_seg_##SUF(x, 0, a, &first, 0, m, accumulate);                              \
        fpe_t5_seg_##SUF(x, a, c, mid, 1, m, accumulate);                                 \
        fpe_t5_seg_##SUF(x, c, cut, &last, 0, m, accumulate);                             \
        for (Py_ssize_t j = cut; j < n; j++)                                              \
            x[j].bits = NINF;                                                             \
    }
    FPE_T5_ROW(fpe_f16, f16, 0xfc00)
    FPE_T5_ROW(fpe_bf16, bf16, 0xff80)
    #else
    #define FPE_T5_HALF_ONE_PASS 0
    #define FPE_T5_ROW0(T, SUF)                                                           \
    static inline void fpe_t5_row_##SUF(T *x, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi, \
                                        Py_ssize_t cut, float first, const float *mid,    \
                                        float last, const unsigned char *m,               \
                                        int accumulate)                                   \
    {                                                                                     \
        (void)x; (void)n; (void)lo; (void)hi; (void)cut; (void)first; (void)mid;          \
        (void)last; (void)m; (void)accumulate;                                            \
    }
    FPE_T5_ROW0(fpe_f16, f16)
    FPE_T5_ROW0(fpe_bf16, bf16)
    #endif
    """
    int FPE_T5_HALF_ONE_PASS
    void fpe_t5_row_f16(fpe_f16 *x, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi,
                        Py_ssize_t cut, float first, const float *mid, float last,
                        const unsigned char *m, int accumulate) nogil
    void fpe_t5_row_bf16(fpe_bf16 *x, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi,
                         Py_ssize_t cut, float first, const float *mid, float last,
                         const unsigned char *m, int accumulate) nogil


cdef void t5_unit(const T5Call *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of (batch, heads, q): one row of scores."""
    cdef Py_ssize_t b = u // (a.heads * a.q)
    cdef Py_ssize_t h = (u // a.q) % a.heads
    cdef Py_ssize_t i = u % a.q
    cdef int64_t qp = a.q_offset + i
    cdef store_t *row = x + a.boff[b] + h * a.sh + i * a.sq
    cdef const real_t *bias = (<const real_t *>a.bias) + h * a.width
    cdef const unsigned char *m = NULL
    cdef real_t buf[REL_CHUNK]
    cdef Py_ssize_t j0, n, lo, hi
    cdef Py_ssize_t cut = t5_causal_cut(a, qp)
    if a.mask != NULL:
        m = a.mask + (b if a.mrows > 1 else 0) * a.k
    if (store_t is float or store_t is double) and a.sk == 1 and sizeof(store_t) == sizeof(real_t):
        t5_chunk(a, <real_t *>row, 0, a.k, qp, bias)
        mask_chunk(<real_t *>row, 0, a.k, cut, m)
        return
    if ((store_t is fpe_f16 or store_t is fpe_bf16) and real_t is float
            and FPE_T5_HALF_ONE_PASS and a.sk == 1):
        lo = t5_reach_start(a, qp, 0, a.k)
        hi = t5_reach_end(a, qp, lo, a.k)
        if store_t is fpe_f16:
            fpe_t5_row_f16(row, a.k, lo, hi, cut, bias[0],
                           bias + (<int64_t>a.reach - qp), bias[a.width - 1], m, a.accumulate)
        else:
            fpe_t5_row_bf16(row, a.k, lo, hi, cut, bias[0],
                            bias + (<int64_t>a.reach - qp), bias[a.width - 1], m, a.accumulate)
        return
    j0 = 0
    while j0 < a.k:
        n = min(<Py_ssize_t>REL_CHUNK, a.k - j0)
        if a.accumulate:
            gather(row + j0 * a.sk, a.sk, buf, n)
        t5_chunk(a, buf, j0, n, qp, bias)
        mask_chunk(buf, j0, n, cut, m)
        scatter(buf, row + j0 * a.sk, a.sk, n)
        j0 += n


cdef inline void t5_column(const T5Call *a, store_t *col, Py_ssize_t j, const real_t *bias,
                           const real_t *rbias, const unsigned char *m) noexcept nogil:
    """The column of key j (col: its query 0) of one head (its biases by distance and by
    negated distance) of one sequence (its key mask row, or NULL). Down it the distance
    j - (q_offset + i) falls by one per query: queries [0, cut) are masked (causal: the key
    comes after them; every one where the key mask is 0), [cut, lo) lie past the reach
    (the last bias), [lo, hi) within it (a contiguous slice of the biases by negated
    distance), the rest before it (the first). Each element gets the value and the
    operations of the row walk (t5_unit)."""
    cdef real_t first = bias[0], last = bias[a.width - 1]
    cdef const real_t *mid = rbias
    cdef real_t buf[REL_CHUNK]
    # the query position at distance 0 (no overflow: 0 <= q_offset <= INT64_MAX)
    cdef int64_t e = <int64_t>j - a.q_offset
    cdef Py_ssize_t i, i0, n, cut = 0
    cdef Py_ssize_t lo = a.q, hi = a.q
    if m != NULL and m[j] == 0:
        cut = a.q
    elif a.causal and e > 0:
        cut = <Py_ssize_t>min(e, <int64_t>a.q)
    if cut < a.q:
        # cut <= max(e, 0) here, so e - cut does not overflow, nor e - reach where that
        # passes cut (q_offset may be near INT64_MAX)
        lo = cut if e - cut <= a.reach else <Py_ssize_t>min(e - a.reach, <int64_t>a.q)
        hi = <Py_ssize_t>min(max(e + a.reach + 1, <int64_t>lo), <int64_t>a.q)
        if lo < hi:
            # query i of the middle reads the bias of distance e - i (-reach <= e - i <= reach)
            mid = mid + (<int64_t>a.reach - e)
    if (store_t is float or store_t is double) and a.sq == 1 and sizeof(store_t) == sizeof(real_t):
        for i in range(cut):
            (<real_t *>col)[i] = <real_t>-INFINITY
        t5_zones((<real_t *>col) + cut, a.q - cut, lo - cut, hi - cut, last, mid + cut, first,
                 a.accumulate)
        return
    for i in range(cut):
        store(col, i * a.sq, <real_t>-INFINITY)
    if ((store_t is fpe_f16 or store_t is fpe_bf16) and real_t is float
            and FPE_T5_HALF_ONE_PASS and a.sq == 1):
        if store_t is fpe_f16:
            fpe_t5_row_f16(col + cut, a.q - cut, lo - cut, hi - cut, a.q - cut, last,
                           mid + cut, first, NULL, a.accumulate)
        else:
            fpe_t5_row_bf16(col + cut, a.q - cut, lo - cut, hi - cut, a.q - cut, last,
                            mid + cut, first, NULL, a.accumulate)
        return
    i0 = cut
    while i0 < a.q:
        n = min(<Py_ssize_t>REL_CHUNK, a.q - i0)
        if a.accumulate:
            gather(col + i0 * a.sq, a.sq, buf, n)
        t5_zones(buf, n, min(max(lo - i0, 0), n), min(max(hi - i0, 0), n), last, mid + i0,
                 first, a.accumulate)
        scatter(buf, col + i0 * a.sq, a.sq, n)
        i0 += n


cdef void t5_columns(const T5Call *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of (batch, heads, blocks of T5_COLUMNS keys): their columns."""
    cdef Py_ssize_t nblocks = ceil_div(a.k, T5_COLUMNS)
    cdef Py_ssize_t b = u // (a.heads * nblocks)
    cdef Py_ssize_t h = (u // nblocks) % a.heads
    cdef Py_ssize_t j0 = (u % nblocks) * T5_COLUMNS
    cdef Py_ssize_t j, j1 = min(j0 + T5_COLUMNS, a.k)
    cdef store_t *base = x + a.boff[b] + h * a.sh
    cdef const real_t *bias = (<const real_t *>a.bias) + h * a.width
    cdef const real_t *rbias = (<const real_t *>a.rbias) + h * a.width
    cdef const unsigned char *m = NULL
    if a.mask != NULL:
        m = a.mask + (b if a.mrows > 1 else 0) * a.k
    for j in range(j0, j1):
        t5_column(a, base + j * a.sk, j, bias, rbias, m)


cdef inline void t5_any(const T5Call *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of the walk t5_execute chose for this view."""
    if a.columns:
        t5_columns(a, x, u, kind)
    else:
        t5_unit(a, x, u, kind)


cdef void t5_run(const T5Call *a, store_t *x, int nthreads) noexcept nogil:
    cdef Py_ssize_t u, units = a.nunits
    cdef double kind_d = 0
    cdef float kind_f = 0
    if nthreads > 1:
        for u in prange(units, schedule="static", num_threads=nthreads):
            if store_t is double:
                t5_any(a, x, u, kind_d)
            else:
                t5_any(a, x, u, kind_f)
    else:
        for u in range(units):
            if store_t is double:
                t5_any(a, x, u, kind_d)
            else:
                t5_any(a, x, u, kind_f)


cdef Py_ssize_t *leading_offsets(cnp.ndarray x, int inner, Py_ssize_t batch,
                                 Py_ssize_t *out) noexcept:
    """Element offset of each row of the leading dims of x (all but its last `inner`
    axes), C order, into out[batch]."""
    return offsets_of_rows(cnp.PyArray_NDIM(x), <const Py_ssize_t *>cnp.PyArray_DIMS(x),
                           <const Py_ssize_t *>cnp.PyArray_STRIDES(x),
                           cnp.PyArray_ITEMSIZE(x), inner, batch, out)


cdef Py_ssize_t *offsets_of_rows(int nd, const Py_ssize_t *dims, const Py_ssize_t *strides,
                                 Py_ssize_t itemsize, int inner, Py_ssize_t batch,
                                 Py_ssize_t *out) noexcept:
    """leading_offsets of an operand of these dims and byte strides."""
    cdef int ax
    cdef Py_ssize_t b, rest, off, d
    for b in range(batch):
        rest = b
        off = 0
        for ax in range(nd - inner - 1, -1, -1):
            d = dims[ax]
            off += (rest % d) * (strides[ax] // itemsize)
            rest //= d
        out[b] = off
    return out


cdef void t5_bias_by_distance(const char *tp, Py_ssize_t sr, Py_ssize_t sc, int tcode,
                              const int32_t *lut, Py_ssize_t width, Py_ssize_t heads, int code,
                              Py_ssize_t t0, Py_ssize_t t1, char *out) noexcept:
    """out[h, t] = table[lut[t], h] in the compute type (float64 for float64 scores), the
    table at tp of storage tcode with byte strides sr (rows) and sc (heads), for the
    distances t0 <= t < t1 a call reads and both ends (t5_chunk's constants). A head's
    row at a time, its values stored in order (a distance at a time, each head's value
    stored a row apart, the compiled entry of a T5 decoder step with (4, 12, 1, 512)
    float32 scores took 1.0-1.04x the time on an AMD Zen 4)."""
    cdef Py_ssize_t h, t
    for h in range(heads):
        t5_bias_at(tp + h * sc, sr, tcode, lut, code, out, h * width, 0)
        for t in range(max(t0, 1), min(t1, width - 1)):
            t5_bias_at(tp + h * sc, sr, tcode, lut, code, out, h * width, t)
        t5_bias_at(tp + h * sc, sr, tcode, lut, code, out, h * width, width - 1)


cdef inline void t5_bias_at(const char *col, Py_ssize_t sr, int tcode, const int32_t *lut,
                            int code, char *out, Py_ssize_t row, Py_ssize_t t) noexcept:
    """t5_bias_by_distance's value of one head (its column of the table at col) at
    distance t, into element row + t of out."""
    if code != CODE_F64 and tcode == CODE_F32:
        (<float *>out)[row + t] = (<const float *>(col + lut[t] * sr))[0]
    elif code == CODE_F64:
        (<double *>out)[row + t] = element_as_double(col + lut[t] * sr, tcode)
    else:
        (<float *>out)[row + t] = <float>element_as_double(col + lut[t] * sr, tcode)


cdef inline double element_as_double(const char *p, int code) noexcept nogil:
    """The element at p (aligned, native) of storage `code`, exactly, as a double."""
    if code == CODE_F32:
        return (<const float *>p)[0]
    if code == CODE_F64:
        return (<const double *>p)[0]
    if code == CODE_F16:
        return fpe_f16_load((<const fpe_f16 *>p)[0])
    return fpe_bf16_load((<const fpe_bf16 *>p)[0])


cdef enum:
    # a decode step's bias by distance (heads x (2 reach + 1) values) and row offsets
    # fit here: no allocation
    T5_STACK_BYTES = 16384


def t5_call(object scores, object table, object bidirectional, object max_distance,
            object q_offset, object causal, object key_mask, object num_threads,
            dict specs, Py_ssize_t num_buckets, Py_ssize_t serial_bytes, int threads,
            bint accumulate):
    """The compiled entry of add_relative_bias, relative_bias and RelativeBias, the
    caller's arguments as given, checked here: scores[..., h, i, j] += (or, accumulate
    False, =) table[bucket(j - q_offset - i), h], -inf where masked, in place. 1 when it
    wrote; 0, having touched nothing, when the call is not the plain case (fastpe.relative
    then validates it in full, names what is wrong or normalises it, and calls this again:
    the only way to the loops); the bytes the call counts as (the scores', twice where
    read and written, times T5_BYTES_WEIGHT), having touched nothing, when that is at least
    serial_bytes and `threads` is 0 (the caller asks its thread policy for a team and
    calls again with it). A smaller call runs on one thread.

    Plain case: exact ndarrays or plain torch CPU tensors (tensor_view; a written
    tensor's version counter is bumped): scores writable, aligned, native and float, of
    3 to VIEW_DIMS dimensions (..., heads, q, k) with whole-element strides and disjoint
    elements; table aligned, native and float, (rows, heads), its bytes apart from the
    scores', rows num_buckets unless that is -1; bidirectional and causal bools;
    max_distance an int; specs holding the T5BucketSpec of (rows, max_distance,
    bidirectional) (fastpe._relative_math.T5_SPECS: the settings' check passed);
    q_offset None (k - q, q <= k) or an int >= 0 with q_offset + q - 1 in int64;
    num_threads None or an int in 1..MAX_THREADS_FLOOR; key_mask None or as
    owned_mask_view takes it. The table is read, and the mask copied, before anything is
    written.
    """
    cdef object t = None
    cdef View xv, tv, mv
    if (type(bidirectional) is not bool or type(max_distance) is not int
            or type(causal) is not bool):
        return 0
    if num_threads is not None and not (type(num_threads) is int
                                        and 1 <= num_threads <= MAX_THREADS_FLOOR):
        return 0
    if not (cnp.PyArray_CheckExact(scores) and cnp.PyArray_CheckExact(table)
            and (key_mask is None or cnp.PyArray_CheckExact(key_mask))):
        t = tensor_views_now()
        if t is None:
            return 0
    if not operand_view(scores, t, True, &xv) or not operand_view(table, t, False, &tv):
        return 0
    cdef int code = view_code(&xv)
    cdef int ax, nd = xv.ndim
    if (code < 0 or nd < 3 or not view_whole_strides(&xv)
            or not view_elements_disjoint(&xv)):
        return 0
    cdef Py_ssize_t heads = xv.shape[nd - 3], q = xv.shape[nd - 2], k = xv.shape[nd - 1]
    cdef Py_ssize_t batch = 1
    for ax in range(nd - 3):
        batch *= xv.shape[ax]
    cdef int tcode = float_code(tv.typenum)
    if (tv.ndim != 2 or tv.shape[1] != heads or tcode < 0 or not tv.aligned
            or not tv.native or (num_buckets >= 0 and tv.shape[0] != num_buckets)
            or not apart_views(&xv, &tv)):
        return 0
    spec = specs.get((tv.shape[0], max_distance, bidirectional))
    if spec is None:
        return 0
    cdef cnp.ndarray lut = spec.lut
    cdef Py_ssize_t reach = spec.reach
    if lut.shape[0] != 2 * reach + 1 or not cnp.PyArray_IS_C_CONTIGUOUS(lut):
        return 0
    cdef int64_t off
    if q_offset is None:
        if q > k:
            return 0
        off = k - q
    else:
        if type(q_offset) is not int or q_offset < 0:
            return 0
        if q_offset > INT64_MAX_VALUE - max(q - 1, 0):
            return 0
        off = q_offset
    cdef Py_ssize_t nbytes = (2 if accumulate else 1) * T5_BYTES_WEIGHT * xv.size
    nbytes *= xv.itemsize
    if nbytes < serial_bytes:
        threads = 1
    elif threads < 1:
        return nbytes
    cdef T5Call a
    cdef AlibiOwned o
    o.slopes = NULL
    o.qpos = o.kpos = NULL
    o.mask = NULL
    a.mask = NULL
    a.mrows = 1
    try:
        if key_mask is not None:
            if (not operand_view(key_mask, t, False, &mv)
                    or not owned_mask_view(&o, &mv, &xv, batch, k, &a.mrows)):
                return 0
            a.mask = o.mask
        t5_execute(&a, xv.data, nd, xv.shape, xv.strides, xv.itemsize, code, tv.data,
                   tv.strides[0], tv.strides[1], tcode, <const int32_t *>cnp.PyArray_DATA(lut),
                   reach, off, causal, accumulate, threads)
    finally:
        alibi_owned_free(&o)
    if not cnp.PyArray_CheckExact(scores):
        bump_tensors((scores,))
    return 1


cdef int t5_execute(T5Call *a, char *xp, int nd, const Py_ssize_t *dims,
                    const Py_ssize_t *strides, Py_ssize_t itemsize, int code, const char *tp,
                    Py_ssize_t tsr, Py_ssize_t tsc, int tcode, const int32_t *lut,
                    Py_ssize_t reach, int64_t q_offset, bint causal, bint accumulate,
                    int num_threads) except -1:
    """Run a T5 call whose arguments are checked, its mask (or NULL) in `a`: the scores
    at xp (nd dims, byte strides), the table at tp (t5_bias_by_distance) tabulated by
    distance, then every row (or key column) of scores."""
    cdef int ax
    a.batch = 1
    for ax in range(nd - 3):
        a.batch *= dims[ax]
    a.heads, a.q, a.k = dims[nd - 3], dims[nd - 2], dims[nd - 1]
    if a.batch == 0 or a.heads == 0 or a.q == 0 or a.k == 0:
        return 0
    a.sh = strides[nd - 3] // itemsize
    a.sq, a.sk = strides[nd - 2] // itemsize, strides[nd - 1] // itemsize
    a.q_offset = q_offset
    a.reach = reach
    a.width = 2 * reach + 1
    a.causal, a.accumulate = causal, accumulate
    cdef Py_ssize_t real_size = sizeof(double) if code == CODE_F64 else sizeof(float)
    # a view whose queries lie closer in memory than its keys (K @ Q^T transposed) walks
    # those inner, as alibi_execute does: its rows read a line or more per key (the
    # (1, 12, 512, 512) float32 of such a view took 59x the time of contiguous scores)
    a.columns = (a.q >= T5_COLUMN_QUERIES and a.sk != 1
                 and magnitude(a.sq) < magnitude(a.sk))
    cdef Py_ssize_t bias_bytes = round_up(a.heads * a.width * real_size, 64)
    cdef Py_ssize_t tables = 2 if a.columns else 1
    cdef Py_ssize_t need = tables * bias_bytes + a.batch * <Py_ssize_t>sizeof(Py_ssize_t)
    cdef char stack[T5_STACK_BYTES + 64]
    cdef Scratch work = None
    cdef char *shared = <char *>((<size_t>stack + 63) & ~(<size_t>63))
    if need > T5_STACK_BYTES:
        work = Scratch(0, 1, need)
        shared = work.shared
    a.bias = shared
    # the distances j - (q_offset + i) of the call, within the reach
    cdef int64_t dlo = -(q_offset + a.q - 1), dhi = (a.k - 1) - q_offset
    cdef Py_ssize_t t0 = <Py_ssize_t>(max(dlo, -<int64_t>reach) + reach)
    cdef Py_ssize_t t1 = <Py_ssize_t>(min(dhi, <int64_t>reach) + reach + 1)
    t5_bias_by_distance(tp, tsr, tsc, tcode, lut, a.width, a.heads, code, t0, t1, a.bias)
    a.rbias = NULL
    if a.columns:
        a.rbias = shared + bias_bytes
        t5_negated_distances(a, real_size, t0, t1)
    a.boff = offsets_of_rows(nd, dims, strides, itemsize, 3, a.batch,
                             <Py_ssize_t *>(shared + tables * bias_bytes))
    a.nunits = a.batch * a.heads * (ceil_div(a.k, T5_COLUMNS) if a.columns else a.q)
    cdef int nthreads = units_threads(a.nunits, num_threads)
    if keeps_gil(nthreads, a.batch * a.heads * a.q * a.k * itemsize):
        t5_run_code(a, code, xp, nthreads)
    else:
        with nogil:
            t5_run_code(a, code, xp, nthreads)
    return 0


cdef void t5_negated_distances(T5Call *a, Py_ssize_t real_size, Py_ssize_t t0,
                               Py_ssize_t t1) noexcept nogil:
    """a.rbias[h, width - 1 - t] = a.bias[h, t] for the distances t5_bias_by_distance
    tabulated (t0 <= t < t1 and both ends)."""
    cdef Py_ssize_t h, t, w = a.width
    for h in range(a.heads):
        for t in range(w):
            if t == 0 or t == w - 1 or t0 <= t < t1:
                memcpy(a.rbias + (h * w + w - 1 - t) * real_size,
                       a.bias + (h * w + t) * real_size, real_size)


cdef void t5_run_code(const T5Call *a, int code, char *xp, int nthreads) noexcept nogil:
    """t5_run on scores of storage `code`."""
    if code == CODE_F32:
        t5_run(a, <float *>xp, nthreads)
    elif code == CODE_F64:
        t5_run(a, <double *>xp, nthreads)
    elif code == CODE_F16:
        t5_run(a, <fpe_f16 *>xp, nthreads)
    else:
        t5_run(a, <fpe_bf16 *>xp, nthreads)


# ---- DeBERTa ---------------------------------------------------------------------------------

cdef extern from *:
    """
    /* DeBERTa rows of unit stride (scores, and c2p / p2c along the span), float32 and
     * float64. The keys of a chunk fall in three zones of the distance d = i - j: past
     * the reach (d > reach: c2p's clamped end), within it (the index table read
     * backwards), before it (d < -reach: the other end); restrict lets the compiler keep
     * the tables in registers and vectorise the adds. pt: the p2c tile row or NULL. */
    #define FPE_DEB_ZONES(n, d0, reach, ta, tc)                                           \
        Py_ssize_t ta = (d0) - (reach) < 0 ? 0 : ((d0) - (reach) > (n) ? (n) : (d0) - (reach)); \
        Py_ssize_t tc = (d0) + (reach) + 1 < ta ? ta                                       \
                        : ((d0) + (reach) + 1 > (n) ? (n) : (d0) + (reach) + 1);
    #define FPE_DEB_ROW(NAME, T)                                                          \
    static void NAME(T *restrict x, Py_ssize_t n, Py_ssize_t d0, Py_ssize_t reach,       \
                     Py_ssize_t lin, Py_ssize_t span, const T *restrict crow,            \
                     const int32_t *restrict ci, const T *restrict pt)                   \
    {                                                                                     \
        FPE_DEB_ZONES(n, d0, reach, ta, tc)                                               \
        /* within |d| <= lin the index is span + d: c2p's row read backwards */           \
        FPE_DEB_ZONES(n, d0, lin, la, lc)                                                 \
        if (la < ta) la = ta;                                                             \
        if (lc > tc) lc = tc;                                                             \
        if (lc < la) lc = la;                                                             \
        Py_ssize_t t;                                                                     \
        if (crow == NULL) {                                                               \
            for (t = 0; t < n; t++) x[t] = x[t] + pt[t];                                  \
            return;                                                                       \
        }                                                                                 \
        const T far = crow[ci[reach]], ahead = crow[ci[-reach]];                          \
        const int32_t *cd = ci + d0;                                                      \
        const T *cl = crow + span + d0;                                                   \
        if (pt == NULL) {                                                                 \
            for (t = 0; t < ta; t++) x[t] = x[t] + far;                                   \
            for (t = ta; t < la; t++) x[t] = x[t] + crow[cd[-t]];                         \
            for (t = la; t < lc; t++) x[t] = x[t] + cl[-t];                               \
            for (t = lc; t < tc; t++) x[t] = x[t] + crow[cd[-t]];                         \
            for (t = tc; t < n; t++) x[t] = x[t] + ahead;                                 \
            return;                                                                       \
        }                                                                                 \
        for (t = 0; t < ta; t++) x[t] = x[t] + (far + pt[t]);                             \
        for (t = ta; t < la; t++) x[t] = x[t] + (crow[cd[-t]] + pt[t]);                   \
        for (t = la; t < lc; t++) x[t] = x[t] + (cl[-t] + pt[t]);                         \
        for (t = lc; t < tc; t++) x[t] = x[t] + (crow[cd[-t]] + pt[t]);                   \
        for (t = tc; t < n; t++) x[t] = x[t] + (ahead + pt[t]);                           \
    }
    FPE_DEB_ROW(fpe_deberta_row_f32, float)
    FPE_DEB_ROW(fpe_deberta_row_f64, double)
    /* tile[r * ld + t] = p2c[j0 + t, pi(i0 + r - j0 - t)] for r < rows, t < n: for each key
     * the few adjacent entries of its row the block's queries read. */
    #if defined(__GNUC__)
    #define FPE_PREFETCH(p) __builtin_prefetch((p), 0, 3)
    #else
    #define FPE_PREFETCH(p) ((void)(p))
    #endif
    #define FPE_DEB_AHEAD 8
    /* the entries of key j0 + t for the block's rows: see FPE_DEB_TILE */
    #define FPE_DEB_TILE_KEY(T)                                                           \
        {                                                                                 \
            const T *restrict prow = p2c + (j0 + t) * pk;                                 \
            const Py_ssize_t d = i0 - j0 - t;                                             \
            /* the keys' rows are pk apart and read a few lines each, diagonally: no      \
             * hardware prefetcher follows that, so fetch a few keys ahead */              \
            if (t + FPE_DEB_AHEAD < n && d - FPE_DEB_AHEAD >= -lin) {                     \
                const char *next = (const char *)(prow + FPE_DEB_AHEAD * pk + span + d    \
                                                  - FPE_DEB_AHEAD);                        \
                for (Py_ssize_t b = 0; b < rows * (Py_ssize_t)sizeof(T); b += 64)          \
                    FPE_PREFETCH(next + b);                                               \
            }                                                                             \
            if (d >= -lin && d + rows - 1 <= lin) {                                       \
                const T *restrict src = prow + span + d;                                  \
                for (Py_ssize_t r = 0; r < rows; r++) tile[r * ld + t] = src[r];          \
            } else if (d >= -reach && d + rows - 1 <= reach) {                            \
                const int32_t *restrict pd = pi + d;                                      \
                for (Py_ssize_t r = 0; r < rows; r++) tile[r * ld + t] = prow[pd[r]];     \
            } else {                                                                      \
                for (Py_ssize_t r = 0; r < rows; r++) {                                   \
                    Py_ssize_t e = d + r;                                                 \
                    e = e < -reach ? -reach : (e > reach ? reach : e);                    \
                    tile[r * ld + t] = prow[pi[e]];                                       \
                }                                                                         \
            }                                                                             \
        }
    #define FPE_DEB_TILE_ARGS(T)                                                          \
        T *restrict tile, Py_ssize_t ld, const T *restrict p2c, Py_ssize_t pk,            \
        const int32_t *restrict pi, Py_ssize_t reach, Py_ssize_t lin, Py_ssize_t span,    \
        Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t j0, Py_ssize_t n
    /* tile[r * ld + t] = p2c[j0 + t, pi(i0 + r - j0 - t)] for r < rows, t < n: for each key
     * the few adjacent entries of its row the block's queries read. */
    #define FPE_DEB_TILE(NAME, T)                                                         \
    static void NAME(FPE_DEB_TILE_ARGS(T))                                                \
    {                                                                                     \
        for (Py_ssize_t t = 0; t < n; t++) FPE_DEB_TILE_KEY(T)                            \
    }
    #if defined(__SSE2__) || defined(_M_X64)
    /* float32: where four keys' runs all lie within the exact distances, 4 x 4 blocks
     * (four keys, four rows) are transposed in registers rather than stored one entry
     * at a time down the tile's columns. */
    static void fpe_deberta_tile_f32(FPE_DEB_TILE_ARGS(float))
    {
        Py_ssize_t t = 0;
        for (; t + 4 <= n; t += 4) {
            const Py_ssize_t d = i0 - j0 - t;
            if ((rows & 3) || d - 3 < -lin || d + rows - 1 > lin) {
                const Py_ssize_t t4 = t + 4;
                for (; t < t4; t++) FPE_DEB_TILE_KEY(float)
                t -= 4;
                continue;
            }
            if (t + FPE_DEB_AHEAD + 4 <= n && d - FPE_DEB_AHEAD - 3 >= -lin) {
                for (Py_ssize_t q = 0; q < 4; q++) {
                    const char *next = (const char *)(p2c + (j0 + t + FPE_DEB_AHEAD + q) * pk
                                                      + span + d - FPE_DEB_AHEAD - q);
                    for (Py_ssize_t b = 0; b < rows * (Py_ssize_t)sizeof(float); b += 64)
                        FPE_PREFETCH(next + b);
                }
            }
            const float *s0 = p2c + (j0 + t) * pk + span + d;
            const float *s1 = s0 + pk - 1, *s2 = s1 + pk - 1, *s3 = s2 + pk - 1;
            for (Py_ssize_t r = 0; r < rows; r += 4) {
                __m128 a0 = _mm_loadu_ps(s0 + r), a1 = _mm_loadu_ps(s1 + r);
                __m128 a2 = _mm_loadu_ps(s2 + r), a3 = _mm_loadu_ps(s3 + r);
                _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
                _mm_storeu_ps(tile + r * ld + t, a0);
                _mm_storeu_ps(tile + (r + 1) * ld + t, a1);
                _mm_storeu_ps(tile + (r + 2) * ld + t, a2);
                _mm_storeu_ps(tile + (r + 3) * ld + t, a3);
            }
        }
        for (; t < n; t++) FPE_DEB_TILE_KEY(float)
    }
    #else
    FPE_DEB_TILE(fpe_deberta_tile_f32, float)
    #endif
    FPE_DEB_TILE(fpe_deberta_tile_f64, double)
    """
    void fpe_deberta_row_f32(float *x, Py_ssize_t n, Py_ssize_t d0, Py_ssize_t reach,
                             Py_ssize_t lin, Py_ssize_t span, const float *crow,
                             const int32_t *ci, const float *pt) nogil
    void fpe_deberta_row_f64(double *x, Py_ssize_t n, Py_ssize_t d0, Py_ssize_t reach,
                             Py_ssize_t lin, Py_ssize_t span, const double *crow,
                             const int32_t *ci, const double *pt) nogil
    void fpe_deberta_tile_f32(float *tile, Py_ssize_t ld, const float *p2c, Py_ssize_t pk,
                              const int32_t *pi, Py_ssize_t reach, Py_ssize_t lin,
                              Py_ssize_t span, Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t j0,
                              Py_ssize_t n) nogil
    void fpe_deberta_tile_f64(double *tile, Py_ssize_t ld, const double *p2c, Py_ssize_t pk,
                              const int32_t *pi, Py_ssize_t reach, Py_ssize_t lin,
                              Py_ssize_t span, Py_ssize_t i0, Py_ssize_t rows, Py_ssize_t j0,
                              Py_ssize_t n) nogil

cdef extern from *:
    """
    /* float32 (float16, bfloat16) with AVX2, keys adjacent in the scores and the logits:
     * 8 x 8 blocks of float32.
     *
     * The gather indices come from per-call tables by distance, over every distance the
     * call meets: E[e] = ci(i - j) for e = j - i and F[d] = pi(d) for d = i - j, each
     * with the base of a window, Eb[e] = min(E[e .. e + 7]) and Fb[d] = min(F[d .. d + 7])
     * (at most 2 span - 8). Where every window of 8 adjacent distances has indices within
     * 8 of its base ("windowed": the index steps by at most one per distance, as
     * DeBERTa's log buckets do past position_buckets / 2 whenever max_relative_positions
     * is large enough), 8 logits of a row are one unaligned load of the window and one
     * permute, whatever the zone; a block whose distances are all exact (|d| <= lin)
     * reads c2p backwards (a load and a reversing permute) and p2c's windows plainly.
     *
     * A block is 8 queries by 8 keys: the 8 keys' p2c windows (each down its own row)
     * are transposed in registers and added, with each query's c2p window, to the 8
     * rows of scores. Done in two passes through a tile of the unit's rows instead (the
     * p2c term stored, then each row's sweep), the tile's stores and loads measured
     * 10-15% slower at (1, 12, 512, 512), past L3.
     *
     * Prefetch into L2 (hint T1; a T0 hint keeps the lines in L1's few miss buffers and
     * measured half the bandwidth): each key's p2c window is a line or two of a
     * different row, a pattern no hardware prefetcher follows, so the window end of
     * each key for the rows FPE_DEB_P2C_AHEAD below is fetched (its start is the end of
     * the rows 8 before it, fetched one block row earlier); a c2p row is read
     * backwards, which hardware prefetchers follow poorly, so the next 8 rows' c2p and
     * scores lines are fetched at the same keys. */
    #if defined(__AVX2__) && FPE_HALF_ADD_RUNS
    #define FPE_DEB_VEC 1
    #define FPE_DEB_P2C_AHEAD 16
    #define FPE_DEB_PF(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
    typedef struct {
        const int32_t *E, *Eb, *F, *Fb;  /* pointers at distance 0 */
        Py_ssize_t q, k, lin, span, unit_rows;
        Py_ssize_t sq, cq, pk;           /* row strides of scores, c2p, p2c */
    } fpe_deb_vec;

    /* Storage of the scores and logits: float32, float16 or bfloat16, a constant in every
     * function below once inlined into fpe_deberta_vec_rows_* (one copy per storage).
     * Half precision widens 8 elements to float32 in registers as it loads them and
     * rounds 8 back as it stores them: the same float32 sums as float32 storage makes,
     * rounded once. Pointers are to the first byte, offsets in elements. */
    enum { FPE_DEB_F32 = 0, FPE_DEB_F16 = 1, FPE_DEB_BF16 = 2 };

    static inline __attribute__((always_inline)) Py_ssize_t fpe_deb_size(int kind)
    {
        return kind == FPE_DEB_F32 ? 4 : 2;
    }

    static inline __attribute__((always_inline)) __m256 fpe_deb_ld8(const char *p, int kind)
    {
        if (kind == FPE_DEB_F32)
            return _mm256_loadu_ps((const float *)p);
        if (kind == FPE_DEB_F16)
            return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        return fpe_bf16x8_widen((const fpe_bf16 *)p);
    }

    /* bfloat16: fpe_bf16x8_bits rounds as fpe_bf16_make does for these sums, whose
     * operands are all widened bfloat16s (fastpe_math.h says why) */
    static inline __attribute__((always_inline)) void fpe_deb_st8(char *p, __m256 v, int kind)
    {
        if (kind == FPE_DEB_F32) {
            _mm256_storeu_ps((float *)p, v);
        } else if (kind == FPE_DEB_F16) {
            _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        } else {
            const __m256i b = fpe_bf16x8_bits(v);
            _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(
                _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08)));
        }
    }

    static inline __attribute__((always_inline)) float fpe_deb_ld1(const char *p, int kind)
    {
        if (kind == FPE_DEB_F32)
            return *(const float *)p;
        if (kind == FPE_DEB_F16)
            return fpe_f16_load(*(const fpe_f16 *)p);
        return fpe_bf16_load(*(const fpe_bf16 *)p);
    }

    static inline __attribute__((always_inline)) void fpe_deb_st1(char *p, float f, int kind)
    {
        if (kind == FPE_DEB_F32)
            *(float *)p = f;
        else if (kind == FPE_DEB_F16)
            *(fpe_f16 *)p = fpe_f16_make(f);
        else
            *(fpe_bf16 *)p = fpe_bf16_make(f);
    }

    static inline __attribute__((always_inline)) __m256 fpe_deb_window(
        const char *row, const int32_t *idx, const int32_t *base, Py_ssize_t e, int kind)
    {
        const int32_t b = base[e];
        const __m256i off = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(idx + e)),
                                             _mm256_set1_epi32(b));
        return _mm256_permutevar8x32_ps(fpe_deb_ld8(row + b * fpe_deb_size(kind), kind), off);
    }

    /* one block: queries i0 .. i0 + 8 (x0, c0 at query i0), keys j .. j + 8 (p the p2c row
     * of key j); exact: every distance of the block within lin; has_c, has_p: the terms
     * given (all four constants once inlined) */
    static inline __attribute__((always_inline)) void fpe_deb_block(
        const fpe_deb_vec *a, char *restrict x0, const char *c0, const char *p,
        Py_ssize_t d, Py_ssize_t j, int exact, int has_c, int has_p, int kind)
    {
        const Py_ssize_t z = fpe_deb_size(kind);
        const Py_ssize_t sq = a->sq * z, cq = a->cq * z, pk = a->pk * z, span = a->span;
        const int32_t *E = a->E, *Eb = a->Eb, *F = a->F, *Fb = a->Fb;
        const __m256i rev = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        __m256 p0, p1, p2, p3, p4, p5, p6, p7;
        if (has_p) {
            if (exact) {
                /* key j + u, query i0 + r: p2c[j + u, span + d - u + r] */
                const char *s = p + (span + d) * z;
                const Py_ssize_t st = pk - z;
                p0 = fpe_deb_ld8(s, kind);          p1 = fpe_deb_ld8(s + st, kind);
                p2 = fpe_deb_ld8(s + 2 * st, kind); p3 = fpe_deb_ld8(s + 3 * st, kind);
                p4 = fpe_deb_ld8(s + 4 * st, kind); p5 = fpe_deb_ld8(s + 5 * st, kind);
                p6 = fpe_deb_ld8(s + 6 * st, kind); p7 = fpe_deb_ld8(s + 7 * st, kind);
            } else {
                p0 = fpe_deb_window(p, F, Fb, d, kind);
                p1 = fpe_deb_window(p + pk, F, Fb, d - 1, kind);
                p2 = fpe_deb_window(p + 2 * pk, F, Fb, d - 2, kind);
                p3 = fpe_deb_window(p + 3 * pk, F, Fb, d - 3, kind);
                p4 = fpe_deb_window(p + 4 * pk, F, Fb, d - 4, kind);
                p5 = fpe_deb_window(p + 5 * pk, F, Fb, d - 5, kind);
                p6 = fpe_deb_window(p + 6 * pk, F, Fb, d - 6, kind);
                p7 = fpe_deb_window(p + 7 * pk, F, Fb, d - 7, kind);
            }
            /* p_u holds key u's 8 queries; the transpose gives query r's 8 keys */
            __m256 t0 = _mm256_unpacklo_ps(p0, p1), t1 = _mm256_unpackhi_ps(p0, p1);
            __m256 t2 = _mm256_unpacklo_ps(p2, p3), t3 = _mm256_unpackhi_ps(p2, p3);
            __m256 t4 = _mm256_unpacklo_ps(p4, p5), t5 = _mm256_unpackhi_ps(p4, p5);
            __m256 t6 = _mm256_unpacklo_ps(p6, p7), t7 = _mm256_unpackhi_ps(p6, p7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            p0 = _mm256_permute2f128_ps(u0, u4, 0x20); p1 = _mm256_permute2f128_ps(u1, u5, 0x20);
            p2 = _mm256_permute2f128_ps(u2, u6, 0x20); p3 = _mm256_permute2f128_ps(u3, u7, 0x20);
            p4 = _mm256_permute2f128_ps(u0, u4, 0x31); p5 = _mm256_permute2f128_ps(u1, u5, 0x31);
            p6 = _mm256_permute2f128_ps(u2, u6, 0x31); p7 = _mm256_permute2f128_ps(u3, u7, 0x31);
        } else {
            p0 = p1 = p2 = p3 = p4 = p5 = p6 = p7 = _mm256_setzero_ps();
        }
        /* row r: x[i0 + r, j ..] += c2p window (+ p2c row r) */
    #define FPE_DEB_ADD_ROW(R, P)                                                          \
        {                                                                                 \
            char *xr = x0 + (R) * sq + j * z;                                             \
            __m256 v = fpe_deb_ld8(xr, kind);                                             \
            if (has_c) {                                                                  \
                const char *cr = c0 + (R) * cq;                                           \
                __m256 c = exact                                                          \
                    ? _mm256_permutevar8x32_ps(                                           \
                          fpe_deb_ld8(cr + (span + d + (R) - 7) * z, kind), rev)          \
                    : fpe_deb_window(cr, E, Eb, -d - (R), kind);                          \
                v = _mm256_add_ps(v, has_p ? _mm256_add_ps(c, P) : c);                    \
            } else {                                                                      \
                v = _mm256_add_ps(v, P);                                                  \
            }                                                                             \
            fpe_deb_st8(xr, v, kind);                                                     \
        }
        FPE_DEB_ADD_ROW(0, p0) FPE_DEB_ADD_ROW(1, p1) FPE_DEB_ADD_ROW(2, p2)
        FPE_DEB_ADD_ROW(3, p3) FPE_DEB_ADD_ROW(4, p4) FPE_DEB_ADD_ROW(5, p5)
        FPE_DEB_ADD_ROW(6, p6) FPE_DEB_ADD_ROW(7, p7)
    #undef FPE_DEB_ADD_ROW
    }

    /* rows i0 .. i0 + 8 of one (batch, head), every key: x, c2p and p2c at their row 0,
     * c2p or p2c NULL when absent (has_c, has_p, kind: constants once inlined) */
    static inline __attribute__((always_inline)) void fpe_deb_rows8(
        const fpe_deb_vec *a, char *restrict x, const char *c2p, const char *p2c,
        Py_ssize_t i0, int has_c, int has_p, int kind)
    {
        const Py_ssize_t z = fpe_deb_size(kind);
        const Py_ssize_t sq = a->sq * z, cq = a->cq * z, pk = a->pk * z, lin = a->lin;
        const Py_ssize_t span = a->span, k = a->k, q = a->q, k8 = k & ~(Py_ssize_t)7;
        const int32_t *E = a->E, *Eb = a->Eb, *F = a->F, *Fb = a->Fb;
        const int fetch_p = has_p && i0 + FPE_DEB_P2C_AHEAD + 8 <= q;
        const int fetch_x = i0 + 16 <= q;
        char *x0 = x + i0 * sq;
        const char *c0 = has_c ? c2p + i0 * cq : NULL;
        Py_ssize_t j, r;
        for (j = 0; j < k8; j += 8) {
            const Py_ssize_t d = i0 - j;             /* the block's distances: d - 7 .. d + 7 */
            const char *p = has_p ? p2c + j * pk : NULL;
            if (fetch_p) {
                const Py_ssize_t da = d + FPE_DEB_P2C_AHEAD;
                if (da - 7 >= -lin && da + 7 <= lin) {
                    /* key j + u's window ends at span + da - u + 7 */
                    const char *e = p + (span + da + 7) * z;
                    const Py_ssize_t st = pk - z;
                    FPE_DEB_PF(e);          FPE_DEB_PF(e + st);     FPE_DEB_PF(e + 2 * st);
                    FPE_DEB_PF(e + 3 * st); FPE_DEB_PF(e + 4 * st); FPE_DEB_PF(e + 5 * st);
                    FPE_DEB_PF(e + 6 * st); FPE_DEB_PF(e + 7 * st);
                } else {
                    for (Py_ssize_t u = 0; u < 8; u++)
                        FPE_DEB_PF(p + u * pk + (Fb[da - u] + 7) * z);
                }
            }
            if (fetch_x && (j & 8) == 0)
                for (r = 8; r < 16; r++) {
                    FPE_DEB_PF(x0 + r * sq + j * z);
                    if (has_c) FPE_DEB_PF(c0 + r * cq + Eb[j - i0 - r] * z);
                }
            if (d - 7 >= -lin && d + 7 <= lin)
                fpe_deb_block(a, x0, c0, p, d, j, 1, has_c, has_p, kind);
            else
                fpe_deb_block(a, x0, c0, p, d, j, 0, has_c, has_p, kind);
        }
        /* the keys past a multiple of 8 */
        for (r = 0; r < 8; r++) {
            const Py_ssize_t i = i0 + r;
            for (j = k8; j < k; j++) {
                char *xv = x0 + r * sq + j * z;
                float v = fpe_deb_ld1(xv, kind);
                if (has_c && has_p)
                    v = v + (fpe_deb_ld1(c0 + r * cq + E[j - i] * z, kind)
                             + fpe_deb_ld1(p2c + j * pk + F[i - j] * z, kind));
                else if (has_c)
                    v = v + fpe_deb_ld1(c0 + r * cq + E[j - i] * z, kind);
                else
                    v = v + fpe_deb_ld1(p2c + j * pk + F[i - j] * z, kind);
                fpe_deb_st1(xv, v, kind);
            }
        }
    }

    /* rows i0 .. i0 + rows (fewer than 8) one element at a time */
    static inline __attribute__((always_inline)) void fpe_deb_rows_scalar(
        const fpe_deb_vec *a, char *x, const char *c2p, const char *p2c, Py_ssize_t i0,
        Py_ssize_t rows, int kind)
    {
        const Py_ssize_t z = fpe_deb_size(kind);
        for (Py_ssize_t i = i0; i < i0 + rows; i++) {
            char *xr = x + i * a->sq * z;
            const char *cr = c2p != NULL ? c2p + i * a->cq * z : NULL;
            for (Py_ssize_t j = 0; j < a->k; j++) {
                float v = fpe_deb_ld1(xr + j * z, kind);
                if (cr != NULL && p2c != NULL)
                    v = v + (fpe_deb_ld1(cr + a->E[j - i] * z, kind)
                             + fpe_deb_ld1(p2c + (j * a->pk + a->F[i - j]) * z, kind));
                else if (cr != NULL)
                    v = v + fpe_deb_ld1(cr + a->E[j - i] * z, kind);
                else
                    v = v + fpe_deb_ld1(p2c + (j * a->pk + a->F[i - j]) * z, kind);
                fpe_deb_st1(xr + j * z, v, kind);
            }
        }
    }

    /* one unit: rows i0 .. i0 + rows of one (batch, head) of storage `kind`; x, c2p and
     * p2c at its row 0 (c2p or p2c NULL when absent) */
    static inline __attribute__((always_inline)) void fpe_deb_unit(
        const fpe_deb_vec *a, char *x, const char *c2p, const char *p2c, Py_ssize_t i0,
        Py_ssize_t rows, int kind)
    {
        Py_ssize_t g = 0;
        for (; g + 8 <= rows; g += 8) {
            if (c2p != NULL && p2c != NULL)
                fpe_deb_rows8(a, x, c2p, p2c, i0 + g, 1, 1, kind);
            else if (c2p != NULL)
                fpe_deb_rows8(a, x, c2p, p2c, i0 + g, 1, 0, kind);
            else
                fpe_deb_rows8(a, x, c2p, p2c, i0 + g, 0, 1, kind);
        }
        if (g < rows)
            fpe_deb_rows_scalar(a, x, c2p, p2c, i0 + g, rows - g, kind);
    }

    static void fpe_deberta_vec_unit(const fpe_deb_vec *a, float *x, const float *c2p,
                                     const float *p2c, Py_ssize_t i0, Py_ssize_t rows)
    {
        fpe_deb_unit(a, (char *)x, (const char *)c2p, (const char *)p2c, i0, rows,
                     FPE_DEB_F32);
    }

    static void fpe_deberta_vec_unit_f16(const fpe_deb_vec *a, fpe_f16 *x, const fpe_f16 *c2p,
                                         const fpe_f16 *p2c, Py_ssize_t i0, Py_ssize_t rows)
    {
        fpe_deb_unit(a, (char *)x, (const char *)c2p, (const char *)p2c, i0, rows,
                     FPE_DEB_F16);
    }

    static void fpe_deberta_vec_unit_bf16(const fpe_deb_vec *a, fpe_bf16 *x,
                                          const fpe_bf16 *c2p, const fpe_bf16 *p2c,
                                          Py_ssize_t i0, Py_ssize_t rows)
    {
        fpe_deb_unit(a, (char *)x, (const char *)c2p, (const char *)p2c, i0, rows,
                     FPE_DEB_BF16);
    }
    #else
    #define FPE_DEB_VEC 0
    typedef struct {
        const int32_t *E, *Eb, *F, *Fb;
        Py_ssize_t q, k, lin, span, unit_rows;
        Py_ssize_t sq, cq, pk;
    } fpe_deb_vec;
    static void fpe_deberta_vec_unit(const fpe_deb_vec *a, float *x, const float *c2p,
                                     const float *p2c, Py_ssize_t i0, Py_ssize_t rows)
    {
        (void)a; (void)x; (void)c2p; (void)p2c; (void)i0; (void)rows;
    }
    static void fpe_deberta_vec_unit_f16(const fpe_deb_vec *a, fpe_f16 *x, const fpe_f16 *c2p,
                                         const fpe_f16 *p2c, Py_ssize_t i0, Py_ssize_t rows)
    {
        (void)a; (void)x; (void)c2p; (void)p2c; (void)i0; (void)rows;
    }
    static void fpe_deberta_vec_unit_bf16(const fpe_deb_vec *a, fpe_bf16 *x,
                                          const fpe_bf16 *c2p, const fpe_bf16 *p2c,
                                          Py_ssize_t i0, Py_ssize_t rows)
    {
        (void)a; (void)x; (void)c2p; (void)p2c; (void)i0; (void)rows;
    }
    #endif
    """
    int FPE_DEB_VEC
    ctypedef struct fpe_deb_vec:
        const int32_t *E
        const int32_t *Eb
        const int32_t *F
        const int32_t *Fb
        Py_ssize_t q, k, lin, span, unit_rows
        Py_ssize_t sq, cq, pk
    void fpe_deberta_vec_unit(const fpe_deb_vec *a, float *x, const float *c2p,
                              const float *p2c, Py_ssize_t i0, Py_ssize_t rows) nogil
    void fpe_deberta_vec_unit_f16(const fpe_deb_vec *a, fpe_f16 *x, const fpe_f16 *c2p,
                                  const fpe_f16 *p2c, Py_ssize_t i0, Py_ssize_t rows) nogil
    void fpe_deberta_vec_unit_bf16(const fpe_deb_vec *a, fpe_bf16 *x, const fpe_bf16 *c2p,
                                   const fpe_bf16 *p2c, Py_ssize_t i0, Py_ssize_t rows) nogil


cdef struct DebertaCall:
    Py_ssize_t batch, heads, q, k
    Py_ssize_t sh, sq, sk               # element strides of the scores
    const Py_ssize_t *boff
    const char *c2p                     # (..., heads, q, 2 span) or NULL
    Py_ssize_t ch, cq, cs               # its element strides
    const Py_ssize_t *coff
    const char *p2c                     # (..., heads, k, 2 span) or NULL
    Py_ssize_t ph, pk, ps
    const Py_ssize_t *poff
    const int32_t *ci                   # gather index by distance i - j, from -reach
    const int32_t *pi
    Py_ssize_t reach
    Py_ssize_t linear                   # ci(d) = pi(d) = span + d for |d| <= linear
    Py_ssize_t span
    Py_ssize_t chunk                    # keys per pass over a block of rows
    Py_ssize_t ld                       # elements between the p2c tile's rows
    fpe_deb_vec vec                     # the AVX2 path's settings and tables


cdef inline Py_ssize_t clamp_distance(Py_ssize_t d, Py_ssize_t reach) noexcept nogil:
    return -reach if d < -reach else (reach if d > reach else d)


cdef inline void deberta_p2c_tile(const DebertaCall *a, real_t *tile, Py_ssize_t i0,
                                  Py_ssize_t rows, Py_ssize_t j0, Py_ssize_t n,
                                  const store_t *pbase) noexcept nogil:
    """tile[r, t] = p2c[j, pi(i0 + r - j)] for keys j = j0 + t: the term of a block of
    query rows, read key row by key row (a few adjacent elements of each), so that each
    line of p2c comes from memory once per block instead of once per query row."""
    cdef Py_ssize_t t, r, j
    cdef real_t kind = 0
    cdef const store_t *prow
    for t in range(n):
        j = j0 + t
        prow = pbase + j * a.pk
        for r in range(rows):
            tile[r * a.ld + t] = load(prow, a.pi[clamp_distance(i0 + r - j, a.reach)] * a.ps,
                                      kind)


cdef inline void deberta_c2p_add(const DebertaCall *a, real_t *x, Py_ssize_t i, Py_ssize_t j0,
                                 Py_ssize_t n, const store_t *crow,
                                 const real_t *ptile) noexcept nogil:
    """x[t] += c2p[i, ci(i - j)] + ptile[t] for keys j = j0 + t (either term absent: NULL)."""
    cdef Py_ssize_t t
    cdef real_t kind = 0
    cdef const int32_t *ci = a.ci
    if crow != NULL and ptile != NULL:
        if (store_t is float or store_t is double) and a.cs == 1:
            for t in range(n):
                x[t] = x[t] + (<real_t>crow[ci[clamp_distance(i - j0 - t, a.reach)]] + ptile[t])
        else:
            for t in range(n):
                x[t] = x[t] + (load(crow, ci[clamp_distance(i - j0 - t, a.reach)] * a.cs, kind)
                               + ptile[t])
    elif crow != NULL:
        for t in range(n):
            x[t] = x[t] + load(crow, ci[clamp_distance(i - j0 - t, a.reach)] * a.cs, kind)
    else:
        for t in range(n):
            x[t] = x[t] + ptile[t]


cdef void deberta_unit(const DebertaCall *a, store_t *x, Py_ssize_t u, real_t *work,
                       real_t kind) noexcept nogil:
    """Unit u of (batch, heads, blocks of DEBERTA_ROWS queries), keys in chunks of
    a.chunk; work: DEBERTA_ROWS rows of a.ld real_t (the p2c tile) and a row buffer."""
    cdef Py_ssize_t nblocks = ceil_div(a.q, DEBERTA_ROWS)
    cdef Py_ssize_t b = u // (a.heads * nblocks)
    cdef Py_ssize_t h = (u // nblocks) % a.heads
    cdef Py_ssize_t i0 = (u % nblocks) * DEBERTA_ROWS
    cdef Py_ssize_t rows = min(<Py_ssize_t>DEBERTA_ROWS, a.q - i0)
    cdef store_t *row
    cdef const store_t *crow = NULL
    cdef const store_t *pbase = NULL
    cdef real_t *tile = work
    cdef real_t *buf = work + DEBERTA_ROWS * a.ld
    cdef real_t *ptile = NULL
    cdef real_t *xr
    cdef Py_ssize_t j0, n, r, i
    cdef bint direct = ((store_t is float or store_t is double) and a.sk == 1
                        and sizeof(store_t) == sizeof(real_t))
    # float32 / float64 logits of unit stride along the span: the C loops above
    cdef bint unit = ((store_t is float or store_t is double) and sizeof(store_t) == sizeof(real_t)
                      and (a.c2p == NULL or a.cs == 1) and (a.p2c == NULL or a.ps == 1))
    if a.p2c != NULL:
        pbase = (<const store_t *>a.p2c) + a.poff[b] + h * a.ph
    j0 = 0
    while j0 < a.k:
        n = min(a.chunk, a.k - j0)
        if pbase != NULL:
            if unit and store_t is float:
                fpe_deberta_tile_f32(<float *>tile, a.ld, <const float *>pbase, a.pk, a.pi,
                                     a.reach, a.linear, a.span, i0, rows, j0, n)
            elif unit and store_t is double:
                fpe_deberta_tile_f64(<double *>tile, a.ld, <const double *>pbase, a.pk,
                                     a.pi, a.reach, a.linear, a.span, i0, rows, j0, n)
            else:
                deberta_p2c_tile(a, tile, i0, rows, j0, n, pbase)
        for r in range(rows):
            i = i0 + r
            row = x + a.boff[b] + h * a.sh + i * a.sq + j0 * a.sk
            if a.c2p != NULL:
                crow = (<const store_t *>a.c2p) + a.coff[b] + h * a.ch + i * a.cq
            if pbase != NULL:
                ptile = tile + r * a.ld
            if direct:
                xr = <real_t *>row
            else:
                gather(row, a.sk, buf, n)
                xr = buf
            if unit and store_t is float:
                fpe_deberta_row_f32(<float *>xr, n, i - j0, a.reach, a.linear, a.span,
                                    <const float *>crow, a.ci, <const float *>ptile)
            elif unit and store_t is double:
                fpe_deberta_row_f64(<double *>xr, n, i - j0, a.reach, a.linear, a.span,
                                    <const double *>crow, a.ci, <const double *>ptile)
            else:
                deberta_c2p_add(a, xr, i, j0, n, crow, ptile)
            if not direct:
                scatter(buf, row, a.sk, n)
        j0 += n


cdef void deberta_run(const DebertaCall *a, store_t *x, Work work, int nthreads) noexcept nogil:
    cdef Py_ssize_t u, units = a.batch * a.heads * ceil_div(a.q, DEBERTA_ROWS)
    cdef double kind_d = 0
    cdef float kind_f = 0
    if nthreads > 1:
        for u in prange(units, schedule="static", num_threads=nthreads):
            if store_t is double:
                deberta_unit(a, x, u, <double *>work_for(work, omp_get_thread_num()), kind_d)
            else:
                deberta_unit(a, x, u, <float *>work_for(work, omp_get_thread_num()), kind_f)
    else:
        for u in range(units):
            if store_t is double:
                deberta_unit(a, x, u, <double *>work_for(work, 0), kind_d)
            else:
                deberta_unit(a, x, u, <float *>work_for(work, 0), kind_f)


cdef inline void deberta_vec_unit(const DebertaCall *a, store_t *x, Py_ssize_t u) noexcept nogil:
    """Unit u of deberta_unit's, on the AVX2 path (fpe_deberta_vec_unit and its float16 and
    bfloat16 forms); double is not taken there."""
    cdef Py_ssize_t nblocks = ceil_div(a.q, DEBERTA_ROWS)
    cdef Py_ssize_t b = u // (a.heads * nblocks)
    cdef Py_ssize_t h = (u // nblocks) % a.heads
    cdef Py_ssize_t i0 = (u % nblocks) * DEBERTA_ROWS
    cdef Py_ssize_t rows = min(<Py_ssize_t>DEBERTA_ROWS, a.q - i0)
    cdef const store_t *c = NULL
    cdef const store_t *p = NULL
    if a.c2p != NULL:
        c = (<const store_t *>a.c2p) + a.coff[b] + h * a.ch
    if a.p2c != NULL:
        p = (<const store_t *>a.p2c) + a.poff[b] + h * a.ph
    if store_t is float:
        fpe_deberta_vec_unit(&a.vec, x + a.boff[b] + h * a.sh, c, p, i0, rows)
    elif store_t is fpe_f16:
        fpe_deberta_vec_unit_f16(&a.vec, x + a.boff[b] + h * a.sh, c, p, i0, rows)
    elif store_t is fpe_bf16:
        fpe_deberta_vec_unit_bf16(&a.vec, x + a.boff[b] + h * a.sh, c, p, i0, rows)


cdef void deberta_vec_run(const DebertaCall *a, store_t *x, int nthreads) noexcept nogil:
    cdef Py_ssize_t u, units = a.batch * a.heads * ceil_div(a.q, DEBERTA_ROWS)
    if nthreads > 1:
        for u in prange(units, schedule="static", num_threads=nthreads):
            deberta_vec_unit(a, x, u)
    else:
        for u in range(units):
            deberta_vec_unit(a, x, u)


cdef bint deberta_windows(Py_ssize_t lo, Py_ssize_t hi, const int32_t *table,
                          Py_ssize_t reach, int sign, Py_ssize_t top, int32_t *out,
                          int32_t *base) noexcept nogil:
    """out[t - lo] = table[clip(sign * t, -reach, reach)] for t in [lo, hi + 8), base[t - lo]
    the least of out's 8 entries from t (at most top) for t in [lo, hi]; whether every
    such window lies within 8 of its base (the vector path's condition)."""
    cdef Py_ssize_t t, m
    cdef int32_t least, most
    for t in range(lo, hi + 8):
        out[t - lo] = table[clamp_distance(sign * t, reach)]
    for t in range(lo, hi + 1):
        least = most = out[t - lo]
        for m in range(1, 8):
            least = min(least, out[t - lo + m])
            most = max(most, out[t - lo + m])
        base[t - lo] = <int32_t>min(<Py_ssize_t>least, top)
        if most - base[t - lo] > 7:
            return False
    return True


def deberta_disentangled(cnp.ndarray scores, int code, object c2p, object p2c,
                         cnp.ndarray c2p_index, cnp.ndarray p2c_index, Py_ssize_t reach,
                         Py_ssize_t linear, Py_ssize_t span, int num_threads):
    """scores[..., h, i, j] += c2p[..., h, i, ci] + p2c[..., h, j, pi], in place, with ci
    and pi the entries of c2p_index / p2c_index at clip(i - j, -reach, reach) + reach.

    scores: writable (..., heads, q, k) array of storage `code`; c2p (..., heads, q, 2 span)
    and p2c (..., heads, k, 2 span): None or arrays of the same storage and leading dims,
    disjoint from scores; all aligned and native with whole-element strides; the index
    tables C-contiguous int32 (2 reach + 1,) with entries in [0, 2 span), both span + d
    for |d| <= linear (-1: nowhere). Arguments are validated by the caller
    (fastpe._relative_args).
    """
    cdef int nd = cnp.PyArray_NDIM(scores), ax
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(scores)
    cdef cnp.npy_intp *st = cnp.PyArray_STRIDES(scores)
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(scores)
    cdef DebertaCall a
    cdef cnp.ndarray c, p
    a.batch = 1
    for ax in range(nd - 3):
        a.batch *= dims[ax]
    a.heads, a.q, a.k = dims[nd - 3], dims[nd - 2], dims[nd - 1]
    if a.batch == 0 or a.heads == 0 or a.q == 0 or a.k == 0:
        return
    if c2p_index.shape[0] != 2 * reach + 1 or p2c_index.shape[0] != 2 * reach + 1:
        raise ValueError("deberta_disentangled: index tables do not match the reach")
    a.sh, a.sq, a.sk = st[nd - 3] // itemsize, st[nd - 2] // itemsize, st[nd - 1] // itemsize
    if linear > reach or linear < -1:
        raise ValueError("deberta_disentangled: linear is outside the reach")
    a.reach = reach
    a.linear = linear
    a.span = span
    a.ci = (<const int32_t *>cnp.PyArray_DATA(c2p_index)) + reach
    a.pi = (<const int32_t *>cnp.PyArray_DATA(p2c_index)) + reach
    cdef Scratch work = Scratch(0, 1, 3 * a.batch * sizeof(Py_ssize_t))
    cdef Py_ssize_t *offs = <Py_ssize_t *>work.shared
    a.boff = leading_offsets(scores, 3, a.batch, offs)
    a.c2p = a.p2c = NULL
    if c2p is not None:
        c = <cnp.ndarray>c2p
        if cnp.PyArray_NDIM(c) != nd or c.shape[nd - 2] != a.q:
            raise ValueError("deberta_disentangled: c2p does not match the scores")
        a.c2p = <const char *>cnp.PyArray_DATA(c)
        a.ch, a.cq, a.cs = (c.strides[nd - 3] // itemsize, c.strides[nd - 2] // itemsize,
                            c.strides[nd - 1] // itemsize)
        a.coff = leading_offsets(c, 3, a.batch, offs + a.batch)
    if p2c is not None:
        p = <cnp.ndarray>p2c
        if cnp.PyArray_NDIM(p) != nd or p.shape[nd - 2] != a.k:
            raise ValueError("deberta_disentangled: p2c does not match the scores")
        a.p2c = <const char *>cnp.PyArray_DATA(p)
        a.ph, a.pk, a.ps = (p.strides[nd - 3] // itemsize, p.strides[nd - 2] // itemsize,
                            p.strides[nd - 1] // itemsize)
        a.poff = leading_offsets(p, 3, a.batch, offs + 2 * a.batch)
    if a.c2p == NULL and a.p2c == NULL:
        return
    cdef char *xp = <char *>cnp.PyArray_DATA(scores)
    cdef Py_ssize_t units = a.batch * a.heads * ceil_div(a.q, DEBERTA_ROWS)
    cdef int nthreads = units_threads(units, num_threads)
    a.chunk = min(a.k, <Py_ssize_t>DEBERTA_CHUNK)
    # rows of the tile a power of two apart would share a few cache sets (the key loop
    # stores down a column of it): one cache line more than the chunk spreads them
    cdef Py_ssize_t real_size = sizeof(double) if code == CODE_F64 else sizeof(float)
    a.ld = round_up(a.chunk, 64 // real_size) + 64 // real_size
    # the AVX2 path's float32 blocks: tables of the indices by every distance of the call,
    # c2p's by e = j - i in [-(q + 8), k + 8], p2c's by d = i - j in [-(k + 8), q + 8].
    # float16 and bfloat16 too, widened and rounded in registers: the general loops
    # convert one element at a time (DeBERTa-v3-base's (1, 12, 512, 512) float16 at 9% of
    # its floor)
    cdef bint vec = (FPE_DEB_VEC and code != CODE_F64 and a.sk == 1 and 2 * span >= 8
                     and (a.c2p == NULL or a.cs == 1) and (a.p2c == NULL or a.ps == 1))
    cdef Py_ssize_t width = a.q + a.k + 17
    cdef Scratch tables
    cdef int32_t *tp
    if vec:
        tables = Scratch(0, 1, 4 * (width + 8) * sizeof(int32_t))
        tp = <int32_t *>tables.shared
        vec = (deberta_windows(-(a.q + 8), a.k + 8, a.ci, reach, -1, 2 * span - 8,
                               tp, tp + (width + 8))
               and deberta_windows(-(a.k + 8), a.q + 8, a.pi, reach, 1, 2 * span - 8,
                                   tp + 2 * (width + 8), tp + 3 * (width + 8)))
        a.vec.E = tp + (a.q + 8)
        a.vec.Eb = tp + (width + 8) + (a.q + 8)
        a.vec.F = tp + 2 * (width + 8) + (a.k + 8)
        a.vec.Fb = tp + 3 * (width + 8) + (a.k + 8)
        a.vec.q, a.vec.k, a.vec.lin, a.vec.span = a.q, a.k, linear, span
        a.vec.unit_rows = DEBERTA_ROWS
        a.vec.sq = a.sq
        a.vec.cq = a.cq if a.c2p != NULL else 0
        a.vec.pk = a.pk if a.p2c != NULL else 0
    # the general loops' p2c tile and row buffer, per thread
    cdef Scratch space = Scratch(0 if vec else (DEBERTA_ROWS * a.ld + a.chunk) * real_size,
                                 nthreads)
    with nogil:
        if vec and code == CODE_F16:
            deberta_vec_run(&a, <fpe_f16 *>xp, nthreads)
        elif vec and code == CODE_BF16:
            deberta_vec_run(&a, <fpe_bf16 *>xp, nthreads)
        elif vec:
            deberta_vec_run(&a, <float *>xp, nthreads)
        elif code == CODE_F32:
            deberta_run(&a, <float *>xp, space.work, nthreads)
        elif code == CODE_F64:
            deberta_run(&a, <double *>xp, space.work, nthreads)
        elif code == CODE_F16:
            deberta_run(&a, <fpe_f16 *>xp, space.work, nthreads)
        else:
            deberta_run(&a, <fpe_bf16 *>xp, space.work, nthreads)
