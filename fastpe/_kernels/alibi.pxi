# ALiBi: scores[b, h, i, j] += slope[h] * (kpos[b, j] - qpos[b, i]), or -inf where
# the key is masked (causal: kpos > qpos; padding: key_mask == 0). Symmetric uses
# -|kpos - qpos|. Or write the bias itself (a table) instead of adding it.
#
# Arithmetic: the bias of one element is slope * (real_t)(kpos - qpos), the slope
# rounded to real_t (float32 for float32/float16/bfloat16 storage, float64 for
# float64): one rounding of the exact product while the distance is exact in real_t
# (below 2**24 or 2**53), the distance rounded first past that, as the models' own
# float32 arithmetic (slope * float32 distance) rounds it. While every position is
# at most 2**24 (float32) or 2**53 (float64), key positions and their distances
# from a query are exact in real_t, so the loops read a row of key positions
# converted once per call and the distance is one vector subtraction. Larger
# positions take an exact scalar loop on the int64 values; both give the same value.
#
# Speed: each element is read and written once. A unit of work is one query row of
# up to four heads of one sequence (consecutive units continue the same rows in
# memory), and float32/float64 rows of unit stride go four at a time: one distance
# serves four rows. Where key j is at position j (no mask, or inside a padded row's one
# run of real tokens) the loop counts the keys; elsewhere one load of key positions
# serves four rows. NumPy buffers usually start 16 bytes past a cache line, so a
# 32-byte vector access splits a line every other time (about 40% slower in cache):
# the vector loops start at the first aligned element of the row (a few scalar steps
# before; 64-byte aligned for the avx512 variant's 512-bit loops), and the key-position
# row sits at the same address modulo that alignment, so that its loads are aligned too.
# A table past 8 MiB is written with non-temporal stores (fpe_alibi_row_stream_*).
# float16 and bfloat16 runs of unit stride are widened, biased and narrowed in
# registers, in one pass (fpe_alibi_seg_f16 / bf16; masked ones fpe_alibi_select_f16 /
# bf16), since GCC does not vectorise the element-wise conversions; strided float16
# ones convert in chunks (fastpe_math.h's run conversions, F16C). Masked keys are
# selected on the bits (keep_or), as a branch on a float comparison does not
# vectorise. A view whose keys are not nearest in memory walks what is nearest inner
# instead: the heads (alibi_heads) or the queries (alibi_column, through the same
# select_line as a row of keys).

from libc.math cimport INFINITY, NAN
from libc.stdint cimport INT32_MAX, uint32_t, uint64_t
from libc.string cimport memchr, memcpy, memset


cdef extern from *:
    """
    /* Four rows (heads) at once: r[t][j] (+)= s[t] * d, d = kf[j] - qf (or qf - kf[j]
     * when flip). Kept out of line: inlined into the kernel's large row function, its
     * pointers spill to the stack and reload every iteration. GCC checks once per call
     * that the rows and kf do not overlap, and vectorises. kf NULL: key j at position j
     * (j1 <= INT32_MAX), counted in int32 vectors instead of loaded: on an AMD Zen 4
     * the (1, 32, 1, 4096) float32 decode took 0.88-0.91x the time so (67-69% of its
     * floor before, 75-77% after); a C model of the loop alone, 94-95% of an in-place
     * pass against 75-81% with the loads. */
    #define FPE_ALIBI_SEG4_LOOPS(T, J, KEY)                                               \
        if (accumulate && flip) {                                                         \
            for (J j = (J)j0; j < (J)j1; j++) {                                           \
                const T d = qf - (KEY);                                                   \
                r0[j] = r0[j] + s0 * d; r1[j] = r1[j] + s1 * d;                           \
                r2[j] = r2[j] + s2 * d; r3[j] = r3[j] + s3 * d;                           \
            }                                                                             \
        } else if (accumulate) {                                                          \
            for (J j = (J)j0; j < (J)j1; j++) {                                           \
                const T d = (KEY) - qf;                                                   \
                r0[j] = r0[j] + s0 * d; r1[j] = r1[j] + s1 * d;                           \
                r2[j] = r2[j] + s2 * d; r3[j] = r3[j] + s3 * d;                           \
            }                                                                             \
        } else if (flip) {                                                                \
            for (J j = (J)j0; j < (J)j1; j++) {                                           \
                const T d = qf - (KEY);                                                   \
                r0[j] = s0 * d; r1[j] = s1 * d; r2[j] = s2 * d; r3[j] = s3 * d;           \
            }                                                                             \
        } else {                                                                          \
            for (J j = (J)j0; j < (J)j1; j++) {                                           \
                const T d = (KEY) - qf;                                                   \
                r0[j] = s0 * d; r1[j] = s1 * d; r2[j] = s2 * d; r3[j] = s3 * d;           \
            }                                                                             \
        }
    #define FPE_ALIBI_SEG4(NAME, T)                                                       \
    static FPE_NOINLINE void NAME(T *r0, T *r1, T *r2, T *r3, const T *kf,                \
                                  Py_ssize_t j0, Py_ssize_t j1, T qf, const T *s,         \
                                  int flip, int accumulate)                               \
    {                                                                                     \
        const T s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];                               \
        if (kf == NULL) {                                                                 \
            FPE_ALIBI_SEG4_LOOPS(T, int32_t, (T)j)                                        \
        } else {                                                                          \
            FPE_ALIBI_SEG4_LOOPS(T, Py_ssize_t, kf[j])                                    \
        }                                                                                 \
    }
    FPE_ALIBI_SEG4(fpe_alibi_seg4_f32, float)
    FPE_ALIBI_SEG4(fpe_alibi_seg4_f64, double)
    /* -inf into r[t][j0 .. j1) of four rows, reading each value first: a store-only
     * run in the middle of rows that are read and written runs well below the
     * streaming speed (measured 1.4x the time of adding the bias to the same
     * bytes), while a read-modify-write keeps the access pattern of the rest of the
     * row. `keep` is 0: the bits of the old value are dropped, but the compiler
     * cannot know it, so the load stays. */
    #define FPE_ALIBI_NINF4(NAME, T, U, NINF)                                             \
    static FPE_NOINLINE void NAME(T *r0, T *r1, T *r2, T *r3, Py_ssize_t j0,              \
                                  Py_ssize_t j1, U keep)                                  \
    {                                                                                     \
        U *u0 = (U *)r0, *u1 = (U *)r1, *u2 = (U *)r2, *u3 = (U *)r3;                     \
        for (Py_ssize_t j = j0; j < j1; j++) {                                            \
            u0[j] = (u0[j] & keep) | (U)NINF; u1[j] = (u1[j] & keep) | (U)NINF;           \
            u2[j] = (u2[j] & keep) | (U)NINF; u3[j] = (u3[j] & keep) | (U)NINF;           \
        }                                                                                 \
    }
    FPE_ALIBI_NINF4(fpe_alibi_ninf4_f32, float, uint32_t, 0xff800000u)
    FPE_ALIBI_NINF4(fpe_alibi_ninf4_f64, double, uint64_t, 0xfff0000000000000u)
    /* Four rows of keys at any positions (select_unit's rule on four heads): key j is
     * kept where kf[j] <= lim (never for a masked key's NaN), its bias computed for
     * every key and selected on the bits; one load of kf serves four rows. */
    #define FPE_ALIBI_KEEP(T, U, NINF, r, v)                                              \
        { T v_ = (v); U b_; memcpy(&b_, &v_, sizeof b_);                                  \
          b_ = (b_ & m) | ((U)NINF & ~m); memcpy(&v_, &b_, sizeof v_); r[j] = v_; }
    #define FPE_ALIBI_SELECT4_BODY(T, U, NINF, BIAS)                                      \
        for (j = j0; j < j1; j++) {                                                       \
            const T kj = kf[j];                                                           \
            T d = kj - qf, nd = qf - kj;                                                  \
            if (symmetric) d = d < nd ? d : nd;                                           \
            const U m = (U)0 - (U)(kj <= lim);                                            \
            FPE_ALIBI_KEEP(T, U, NINF, r0, BIAS(r0, s0))                                  \
            FPE_ALIBI_KEEP(T, U, NINF, r1, BIAS(r1, s1))                                  \
            FPE_ALIBI_KEEP(T, U, NINF, r2, BIAS(r2, s2))                                  \
            FPE_ALIBI_KEEP(T, U, NINF, r3, BIAS(r3, s3))                                  \
        }
    #define FPE_ALIBI_ADD(r, s) (r[j] + s * d)
    #define FPE_ALIBI_SET(r, s) (s * d)
    #define FPE_ALIBI_SELECT4(NAME, T, U, NINF)                                           \
    static FPE_NOINLINE void NAME(T *r0, T *r1, T *r2, T *r3, const T *kf,                \
                                  Py_ssize_t j0, Py_ssize_t j1, T qf, const T *s,         \
                                  T lim, int symmetric, int accumulate)                   \
    {                                                                                     \
        const T s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];                               \
        Py_ssize_t j;                                                                     \
        if (accumulate) {                                                                 \
            FPE_ALIBI_SELECT4_BODY(T, U, NINF, FPE_ALIBI_ADD)                             \
        } else {                                                                          \
            FPE_ALIBI_SELECT4_BODY(T, U, NINF, FPE_ALIBI_SET)                             \
        }                                                                                 \
    }
    FPE_ALIBI_SELECT4(fpe_alibi_select4_f32, float, uint32_t, 0xff800000u)
    FPE_ALIBI_SELECT4(fpe_alibi_select4_f64, double, uint64_t, 0xfff0000000000000u)
    /* the alignment the vector loops start at: their vector's width (the avx512
     * variant's loops are 512 bits wide, and from a 32-byte boundary every other
     * 64-byte store of a table split a line: 1.3x the avx2 variant's time) */
    #if defined(__AVX512F__)
    #define FPE_ALIBI_VECTOR_BYTES 64
    #else
    #define FPE_ALIBI_VECTOR_BYTES 32
    #endif

    /* A row of a table (no accumulate) with non-temporal stores, whole lines from j0,
     * where row + j0 is 64-byte aligned: a table past the caches written with ordinary
     * stores reads every line before writing it, twice the traffic. One row at a time
     * (each from its own line boundary: the rows of a group of heads are aligned alike
     * only when a head's size is a multiple of 64 bytes); a line per step, in two
     * vectors with AVX2: four rows' half-written lines in the write-combining buffers
     * at once measured 1.3-1.5x the time of whole lines (a (32, 2048, 2048) float32
     * table). Returns the first j not written (j0 without AVX2); the products are the
     * plain loop's, so the same bits. */
    #if FPE_PAIRS_AVX2
    /* four rows aligned alike: a line of each in turn (a vector, or two with AVX2) */
    #define FPE_ALIBI_ROWS4_STREAM(NAME, T, V, W, SET1, LOAD, SUB, MUL, STREAM)          \
    static FPE_NOINLINE Py_ssize_t NAME(T *r0, T *r1, T *r2, T *r3, const T *kf,          \
                                        Py_ssize_t j0, Py_ssize_t j1, T qf,              \
                                        const T *sl, int flip)                           \
    {                                                                                   \
        const V q = SET1(qf), s0 = SET1(sl[0]), s1 = SET1(sl[1]), s2 = SET1(sl[2]),     \
                s3 = SET1(sl[3]);                                                       \
        Py_ssize_t j = j0;                                                              \
        for (; j + 64 / (Py_ssize_t)sizeof(T) <= j1; j += 64 / (Py_ssize_t)sizeof(T)) { \
            const V d = flip ? SUB(q, LOAD(kf + j)) : SUB(LOAD(kf + j), q);             \
            if (W * sizeof(T) == 64) {                                                  \
                STREAM(r0 + j, MUL(s0, d)); STREAM(r1 + j, MUL(s1, d));                 \
                STREAM(r2 + j, MUL(s2, d)); STREAM(r3 + j, MUL(s3, d));                 \
            } else {                                                                    \
                const V e = flip ? SUB(q, LOAD(kf + j + W)) : SUB(LOAD(kf + j + W), q); \
                STREAM(r0 + j, MUL(s0, d)); STREAM(r0 + j + W, MUL(s0, e));             \
                STREAM(r1 + j, MUL(s1, d)); STREAM(r1 + j + W, MUL(s1, e));             \
                STREAM(r2 + j, MUL(s2, d)); STREAM(r2 + j + W, MUL(s2, e));             \
                STREAM(r3 + j, MUL(s3, d)); STREAM(r3 + j + W, MUL(s3, e));             \
            }                                                                           \
        }                                                                               \
        return j;                                                                       \
    }
    #if defined(__AVX512F__)
    FPE_ALIBI_ROWS4_STREAM(fpe_alibi_rows4_stream_f32, float, __m512, 16, _mm512_set1_ps,
                           _mm512_loadu_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_stream_ps)
    FPE_ALIBI_ROWS4_STREAM(fpe_alibi_rows4_stream_f64, double, __m512d, 8, _mm512_set1_pd,
                           _mm512_loadu_pd, _mm512_sub_pd, _mm512_mul_pd, _mm512_stream_pd)
    #else
    FPE_ALIBI_ROWS4_STREAM(fpe_alibi_rows4_stream_f32, float, __m256, 8, _mm256_set1_ps,
                           _mm256_loadu_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_stream_ps)
    FPE_ALIBI_ROWS4_STREAM(fpe_alibi_rows4_stream_f64, double, __m256d, 4, _mm256_set1_pd,
                           _mm256_loadu_pd, _mm256_sub_pd, _mm256_mul_pd, _mm256_stream_pd)
    #endif
    /* one row: a line per step likewise */
    #define FPE_ALIBI_ROW_STREAM(NAME, T, V, W, SET1, LOAD, SUB, MUL, STREAM)            \
    static FPE_NOINLINE Py_ssize_t NAME(T *r, const T *kf, Py_ssize_t j0,                 \
                                        Py_ssize_t j1, T qf, T slope, int flip)          \
    {                                                                                   \
        const V q = SET1(qf), s = SET1(slope);                                          \
        Py_ssize_t j = j0;                                                              \
        for (; j + 64 / (Py_ssize_t)sizeof(T) <= j1; j += 64 / (Py_ssize_t)sizeof(T)) { \
            const V d = flip ? SUB(q, LOAD(kf + j)) : SUB(LOAD(kf + j), q);             \
            STREAM(r + j, MUL(s, d));                                                   \
            if (W * sizeof(T) != 64) {                                                  \
                const V e = flip ? SUB(q, LOAD(kf + j + W)) : SUB(LOAD(kf + j + W), q); \
                STREAM(r + j + W, MUL(s, e));                                           \
            }                                                                           \
        }                                                                               \
        return j;                                                                       \
    }
    #if defined(__AVX512F__)
    FPE_ALIBI_ROW_STREAM(fpe_alibi_row_stream_f32, float, __m512, 16, _mm512_set1_ps,
                         _mm512_loadu_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_stream_ps)
    FPE_ALIBI_ROW_STREAM(fpe_alibi_row_stream_f64, double, __m512d, 8, _mm512_set1_pd,
                         _mm512_loadu_pd, _mm512_sub_pd, _mm512_mul_pd, _mm512_stream_pd)
    #else
    FPE_ALIBI_ROW_STREAM(fpe_alibi_row_stream_f32, float, __m256, 8, _mm256_set1_ps,
                         _mm256_loadu_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_stream_ps)
    FPE_ALIBI_ROW_STREAM(fpe_alibi_row_stream_f64, double, __m256d, 4, _mm256_set1_pd,
                         _mm256_loadu_pd, _mm256_sub_pd, _mm256_mul_pd, _mm256_stream_pd)
    #endif
    #else
    #define FPE_ALIBI_ROW_STREAM0(NAME, T)                                                \
    static inline Py_ssize_t NAME(T *r, const T *kf, Py_ssize_t j0, Py_ssize_t j1, T qf, \
                                  T slope, int flip)                                     \
    {                                                                                   \
        (void)r; (void)kf; (void)j1; (void)qf; (void)slope; (void)flip;                 \
        return j0;                                                                      \
    }
    FPE_ALIBI_ROW_STREAM0(fpe_alibi_row_stream_f32, float)
    FPE_ALIBI_ROW_STREAM0(fpe_alibi_row_stream_f64, double)
    #define FPE_ALIBI_ROWS4_STREAM0(NAME, T)                                              \
    static inline Py_ssize_t NAME(T *r0, T *r1, T *r2, T *r3, const T *kf, Py_ssize_t j0, \
                                  Py_ssize_t j1, T qf, const T *sl, int flip)             \
    {                                                                                   \
        (void)r0; (void)r1; (void)r2; (void)r3; (void)kf; (void)j1; (void)qf; (void)sl;  \
        (void)flip;                                                                     \
        return j0;                                                                      \
    }
    FPE_ALIBI_ROWS4_STREAM0(fpe_alibi_rows4_stream_f32, float)
    FPE_ALIBI_ROWS4_STREAM0(fpe_alibi_rows4_stream_f64, double)
    #endif

    /* x[j] (+)= s * d for j in [j0, j1) of a unit-stride float16 row, d = kf[j] - qf (or
     * qf - kf[j] when flip), in one pass: widened, biased and narrowed in registers,
     * where the chunked path converts through a float32 buffer in three (a decode
     * call, in cache, measured 2x float32's time that way). The same bits: the
     * chunked loop's x + s * d is contracted to fma(s, d, x) in the variants that have
     * FMA, the ones this loop is built for. */
    #if FPE_HALF_ADD_RUNS
    #define FPE_ALIBI_HALF_ONE_PASS 1
    static FPE_NOINLINE void fpe_alibi_seg_f16(fpe_f16 *x, const float *kf,
                                               Py_ssize_t j0, Py_ssize_t j1, float qf,
                                               float s, int flip, int accumulate)
    {
        Py_ssize_t j = j0;
    #if FPE_HALF_RUNS_512
        {
            const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
            for (; j + 16 <= j1; j += 16) {
                const __m512 k = _mm512_loadu_ps(kf + j);
                const __m512 d = flip ? _mm512_sub_ps(q, k) : _mm512_sub_ps(k, q);
                fpe_f16x16_store(x + j, 0xffff,
                                 accumulate ? _mm512_fmadd_ps(sv, d, fpe_f16x16_load(x + j, 0xffff))
                                            : _mm512_mul_ps(sv, d));
            }
        }
    #endif
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        for (; j + 8 <= j1; j += 8) {
            const __m256 k = _mm256_loadu_ps(kf + j);
            const __m256 d = flip ? _mm256_sub_ps(q, k) : _mm256_sub_ps(k, q);
            fpe_f16x8_store(x + j, accumulate ? _mm256_fmadd_ps(sv, d, fpe_f16x8_load(x + j))
                                              : _mm256_mul_ps(sv, d));
        }
        for (; j < j1; j++) {
            const float d = flip ? qf - kf[j] : kf[j] - qf;
            x[j] = fpe_f16_make(accumulate ? fmaf(s, d, fpe_f16_load(x[j])) : s * d);
        }
    }

    /* select_unit's rows (keys at any positions, masked ones NaN) of unit-stride float16
     * in one pass, where the chunked path converts them through a float32 buffer in
     * three (a left-padded decode took 2x float32's time that way). The same bits: the
     * chunked loop's x + s * d is contracted to fma(s, d, x) in the variants with FMA,
     * its symmetric d is min(k - q, q - k) as MINPS takes it, and a key is kept where
     * k <= lim (never for NaN), else -inf. */
    static FPE_NOINLINE void fpe_alibi_select_f16(fpe_f16 *x, const float *kf,
                                                  Py_ssize_t n, float qf, float s,
                                                  float lim, int symmetric,
                                                  int accumulate)
    {
        Py_ssize_t j = 0;
    #if FPE_HALF_RUNS_512
        {
            const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
            const __m512 lv = _mm512_set1_ps(lim), ninf = _mm512_set1_ps(-INFINITY);
            for (; j + 16 <= n; j += 16) {
                const __m512 k = _mm512_loadu_ps(kf + j);
                __m512 d = _mm512_sub_ps(k, q);
                if (symmetric)
                    d = _mm512_min_ps(d, _mm512_sub_ps(q, k));
                const __m512 v = accumulate
                    ? _mm512_fmadd_ps(sv, d, fpe_f16x16_load(x + j, 0xffff))
                    : _mm512_mul_ps(sv, d);
                fpe_f16x16_store(x + j, 0xffff, _mm512_mask_blend_ps(
                    _mm512_cmp_ps_mask(k, lv, _CMP_LE_OQ), ninf, v));
            }
        }
    #endif
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        const __m256 lv = _mm256_set1_ps(lim), ninf = _mm256_set1_ps(-INFINITY);
        for (; j + 8 <= n; j += 8) {
            const __m256 k = _mm256_loadu_ps(kf + j);
            __m256 d = _mm256_sub_ps(k, q);
            if (symmetric)
                d = _mm256_min_ps(d, _mm256_sub_ps(q, k));
            const __m256 v = accumulate ? _mm256_fmadd_ps(sv, d, fpe_f16x8_load(x + j))
                                        : _mm256_mul_ps(sv, d);
            fpe_f16x8_store(x + j, _mm256_blendv_ps(ninf, v, _mm256_cmp_ps(k, lv, _CMP_LE_OQ)));
        }
        for (; j < n; j++) {
            const float k = kf[j];
            float d = k - qf;
            if (symmetric) {
                const float nd = qf - k;
                d = d < nd ? d : nd;
            }
            const float v = accumulate ? fmaf(s, d, fpe_f16_load(x[j])) : s * d;
            x[j] = fpe_f16_make(k <= lim ? v : -INFINITY);
        }
    }

    /* the same for bfloat16 rows: 16 (32) at a time in fpe_bf16x16_load's lane order,
     * the key positions loaded in that order too; the narrowing is exact for the
     * reason the adds give (every operand a widened bfloat16 or a finite float32), by
     * VCVTNE2PS2BF16 where `cvt` (fastpe_math.h) */
    static FPE_ALWAYS_INLINE void fpe_alibi_seg_bf16_nc(fpe_bf16 *x, const float *kf,
                                                        Py_ssize_t j0, Py_ssize_t j1,
                                                        float qf, float s, int flip,
                                                        int accumulate, int cvt)
    {
        Py_ssize_t j = j0;
    #if FPE_HALF_RUNS_512
        {
            const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
            for (; j + 32 <= j1; j += 32) {
                __m512 x0, x1, k0, k1;
                fpe_f32x32_load_unpacked(kf + j, 0xffffffffu, &k0, &k1);
                const __m512 d0 = flip ? _mm512_sub_ps(q, k0) : _mm512_sub_ps(k0, q);
                const __m512 d1 = flip ? _mm512_sub_ps(q, k1) : _mm512_sub_ps(k1, q);
                if (accumulate) {
                    fpe_bf16x32_load(x + j, 0xffffffffu, &x0, &x1);
                    FPE_BF16X32_STORE(cvt, x + j, 0xffffffffu, _mm512_fmadd_ps(sv, d0, x0),
                                      _mm512_fmadd_ps(sv, d1, x1));
                } else {
                    FPE_BF16X32_STORE(cvt, x + j, 0xffffffffu, _mm512_mul_ps(sv, d0),
                                      _mm512_mul_ps(sv, d1));
                }
            }
        }
    #endif
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        for (; j + 16 <= j1; j += 16) {
            __m256 x0, x1, k0, k1;
            fpe_f32x16_load_unpacked(kf + j, &k0, &k1);
            const __m256 d0 = flip ? _mm256_sub_ps(q, k0) : _mm256_sub_ps(k0, q);
            const __m256 d1 = flip ? _mm256_sub_ps(q, k1) : _mm256_sub_ps(k1, q);
            if (accumulate) {
                fpe_bf16x16_load(x + j, &x0, &x1);
                FPE_BF16X16_STORE(cvt, x + j, _mm256_fmadd_ps(sv, d0, x0),
                                  _mm256_fmadd_ps(sv, d1, x1));
            } else {
                FPE_BF16X16_STORE(cvt, x + j, _mm256_mul_ps(sv, d0), _mm256_mul_ps(sv, d1));
            }
        }
        (void)cvt;
        for (; j < j1; j++) {
            const float d = flip ? qf - kf[j] : kf[j] - qf;
            x[j] = fpe_bf16_make(accumulate ? fmaf(s, d, fpe_bf16_load(x[j])) : s * d);
        }
    }

    #if FPE_BF16_CVT
    FPE_TARGET_BF16 static FPE_NOINLINE void fpe_alibi_seg_bf16_cvt(
        fpe_bf16 *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1, float qf, float s,
        int flip, int accumulate)
    {
        fpe_alibi_seg_bf16_nc(x, kf, j0, j1, qf, s, flip, accumulate, 1);
    }
    #endif

    static FPE_NOINLINE void fpe_alibi_seg_bf16(fpe_bf16 *x, const float *kf,
                                                Py_ssize_t j0, Py_ssize_t j1, float qf,
                                                float s, int flip, int accumulate)
    {
    #if FPE_BF16_CVT
        if (fpe_bf16_cvt) {
            fpe_alibi_seg_bf16_cvt(x, kf, j0, j1, qf, s, flip, accumulate);
            return;
        }
    #endif
        fpe_alibi_seg_bf16_nc(x, kf, j0, j1, qf, s, flip, accumulate, 0);
    }

    /* fpe_alibi_select_f16 for bfloat16 rows, in fpe_alibi_seg_bf16's lane order, where
     * select_unit's loop went one element at a time (a masked (1, 32, 1024, 1024)
     * bfloat16 add took 3x float16's time so). Its bits: fpe_alibi_select_f16's
     * arithmetic, narrowed exactly as fpe_alibi_seg_bf16 narrows (-inf and NaN too). */
    static FPE_ALWAYS_INLINE void fpe_alibi_select_bf16_nc(fpe_bf16 *x, const float *kf,
                                                           Py_ssize_t n, float qf, float s,
                                                           float lim, int symmetric,
                                                           int accumulate, int cvt)
    {
        Py_ssize_t j = 0;
    #if FPE_HALF_RUNS_512
        {
            const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
            const __m512 lv = _mm512_set1_ps(lim), ninf = _mm512_set1_ps(-INFINITY);
            for (; j + 32 <= n; j += 32) {
                __m512 x0, x1, k0, k1;
                fpe_f32x32_load_unpacked(kf + j, 0xffffffffu, &k0, &k1);
                __m512 d0 = _mm512_sub_ps(k0, q), d1 = _mm512_sub_ps(k1, q);
                if (symmetric) {
                    d0 = _mm512_min_ps(d0, _mm512_sub_ps(q, k0));
                    d1 = _mm512_min_ps(d1, _mm512_sub_ps(q, k1));
                }
                __m512 v0, v1;
                if (accumulate) {
                    fpe_bf16x32_load(x + j, 0xffffffffu, &x0, &x1);
                    v0 = _mm512_fmadd_ps(sv, d0, x0);
                    v1 = _mm512_fmadd_ps(sv, d1, x1);
                } else {
                    v0 = _mm512_mul_ps(sv, d0);
                    v1 = _mm512_mul_ps(sv, d1);
                }
                FPE_BF16X32_STORE(cvt, x + j, 0xffffffffu,
                    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(k0, lv, _CMP_LE_OQ), ninf, v0),
                    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(k1, lv, _CMP_LE_OQ), ninf, v1));
            }
        }
    #endif
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        const __m256 lv = _mm256_set1_ps(lim), ninf = _mm256_set1_ps(-INFINITY);
        for (; j + 16 <= n; j += 16) {
            __m256 x0, x1, k0, k1;
            fpe_f32x16_load_unpacked(kf + j, &k0, &k1);
            __m256 d0 = _mm256_sub_ps(k0, q), d1 = _mm256_sub_ps(k1, q);
            if (symmetric) {
                d0 = _mm256_min_ps(d0, _mm256_sub_ps(q, k0));
                d1 = _mm256_min_ps(d1, _mm256_sub_ps(q, k1));
            }
            __m256 v0, v1;
            if (accumulate) {
                fpe_bf16x16_load(x + j, &x0, &x1);
                v0 = _mm256_fmadd_ps(sv, d0, x0);
                v1 = _mm256_fmadd_ps(sv, d1, x1);
            } else {
                v0 = _mm256_mul_ps(sv, d0);
                v1 = _mm256_mul_ps(sv, d1);
            }
            FPE_BF16X16_STORE(cvt, x + j,
                              _mm256_blendv_ps(ninf, v0, _mm256_cmp_ps(k0, lv, _CMP_LE_OQ)),
                              _mm256_blendv_ps(ninf, v1, _mm256_cmp_ps(k1, lv, _CMP_LE_OQ)));
        }
        (void)cvt;
        for (; j < n; j++) {
            const float k = kf[j];
            float d = k - qf;
            if (symmetric) {
                const float nd = qf - k;
                d = d < nd ? d : nd;
            }
            const float v = accumulate ? fmaf(s, d, fpe_bf16_load(x[j])) : s * d;
            x[j] = fpe_bf16_make(k <= lim ? v : -INFINITY);
        }
    }

    #if FPE_BF16_CVT
    FPE_TARGET_BF16 static FPE_NOINLINE void fpe_alibi_select_bf16_cvt(
        fpe_bf16 *x, const float *kf, Py_ssize_t n, float qf, float s, float lim,
        int symmetric, int accumulate)
    {
        fpe_alibi_select_bf16_nc(x, kf, n, qf, s, lim, symmetric, accumulate, 1);
    }
    #endif

    static FPE_NOINLINE void fpe_alibi_select_bf16(fpe_bf16 *x, const float *kf,
                                                   Py_ssize_t n, float qf, float s,
                                                   float lim, int symmetric, int accumulate)
    {
    #if FPE_BF16_CVT
        if (fpe_bf16_cvt) {
            fpe_alibi_select_bf16_cvt(x, kf, n, qf, s, lim, symmetric, accumulate);
            return;
        }
    #endif
        fpe_alibi_select_bf16_nc(x, kf, n, qf, s, lim, symmetric, accumulate, 0);
    }

    /* fpe_alibi_row_stream_* for float16 and bfloat16 rows: a line (32 values) per
     * step from j0, where x + j0 is 64-byte aligned, converted as the loops above
     * convert (the same bits); returns the first j not written */
    static FPE_NOINLINE Py_ssize_t fpe_alibi_row_stream_f16(fpe_f16 *x, const float *kf,
                                                                 Py_ssize_t j0, Py_ssize_t j1,
                                                                 float qf, float s, int flip)
    {
        Py_ssize_t j = j0;
    #if FPE_HALF_RUNS_512
        const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
        for (; j + 32 <= j1; j += 32) {
            for (int c = 0; c < 32; c += 16) {
                const __m512 k = _mm512_loadu_ps(kf + j + c);
                const __m512 d = flip ? _mm512_sub_ps(q, k) : _mm512_sub_ps(k, q);
                _mm256_stream_si256((__m256i *)(x + j + c),
                                    _mm512_cvtps_ph(_mm512_mul_ps(sv, d),
                                                    _MM_FROUND_TO_NEAREST_INT));
            }
        }
    #else
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        for (; j + 32 <= j1; j += 32) {
            for (int c = 0; c < 32; c += 8) {
                const __m256 k = _mm256_loadu_ps(kf + j + c);
                const __m256 d = flip ? _mm256_sub_ps(q, k) : _mm256_sub_ps(k, q);
                _mm_stream_si128((__m128i *)(x + j + c),
                                 _mm256_cvtps_ph(_mm256_mul_ps(sv, d),
                                                 _MM_FROUND_TO_NEAREST_INT));
            }
        }
    #endif
        return j;
    }

    static FPE_ALWAYS_INLINE Py_ssize_t fpe_alibi_row_stream_bf16_nc(
        fpe_bf16 *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1, float qf, float s,
        int flip, int cvt)
    {
        Py_ssize_t j = j0;
    #if FPE_HALF_RUNS_512
        const __m512 q = _mm512_set1_ps(qf), sv = _mm512_set1_ps(s);
        for (; j + 32 <= j1; j += 32) {
            __m512 k0, k1;
            fpe_f32x32_load_unpacked(kf + j, 0xffffffffu, &k0, &k1);
            const __m512 d0 = flip ? _mm512_sub_ps(q, k0) : _mm512_sub_ps(k0, q);
            const __m512 d1 = flip ? _mm512_sub_ps(q, k1) : _mm512_sub_ps(k1, q);
            _mm512_stream_si512((__m512i *)(x + j),
                                FPE_BF16X32_BITS(cvt, _mm512_mul_ps(sv, d0),
                                                 _mm512_mul_ps(sv, d1)));
        }
    #else
        const __m256 q = _mm256_set1_ps(qf), sv = _mm256_set1_ps(s);
        for (; j + 32 <= j1; j += 32) {
            for (int c = 0; c < 32; c += 16) {
                __m256 k0, k1;
                fpe_f32x16_load_unpacked(kf + j + c, &k0, &k1);
                const __m256 d0 = flip ? _mm256_sub_ps(q, k0) : _mm256_sub_ps(k0, q);
                const __m256 d1 = flip ? _mm256_sub_ps(q, k1) : _mm256_sub_ps(k1, q);
                _mm256_stream_si256((__m256i *)(x + j + c),
                                    FPE_BF16X16_BITS(cvt, _mm256_mul_ps(sv, d0),
                                                     _mm256_mul_ps(sv, d1)));
            }
        }
    #endif
        (void)cvt;
        return j;
    }

    #if FPE_BF16_CVT
    FPE_TARGET_BF16 static FPE_NOINLINE Py_ssize_t fpe_alibi_row_stream_bf16_cvt(
        fpe_bf16 *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1, float qf, float s,
        int flip)
    {
        return fpe_alibi_row_stream_bf16_nc(x, kf, j0, j1, qf, s, flip, 1);
    }
    #endif

    static FPE_NOINLINE Py_ssize_t fpe_alibi_row_stream_bf16(fpe_bf16 *x,
                                                                  const float *kf,
                                                                  Py_ssize_t j0, Py_ssize_t j1,
                                                                  float qf, float s, int flip)
    {
    #if FPE_BF16_CVT
        if (fpe_bf16_cvt)
            return fpe_alibi_row_stream_bf16_cvt(x, kf, j0, j1, qf, s, flip);
    #endif
        return fpe_alibi_row_stream_bf16_nc(x, kf, j0, j1, qf, s, flip, 0);
    }
    #else
    #define FPE_ALIBI_HALF_ONE_PASS 0
    static inline void fpe_alibi_seg_bf16(fpe_bf16 *x, const float *kf, Py_ssize_t j0,
                                          Py_ssize_t j1, float qf, float s, int flip,
                                          int accumulate)
    {
        (void)x; (void)kf; (void)j0; (void)j1; (void)qf; (void)s; (void)flip;
        (void)accumulate;
    }
    static inline void fpe_alibi_seg_f16(fpe_f16 *x, const float *kf, Py_ssize_t j0,
                                         Py_ssize_t j1, float qf, float s, int flip,
                                         int accumulate)
    {
        (void)x; (void)kf; (void)j0; (void)j1; (void)qf; (void)s; (void)flip;
        (void)accumulate;
    }
    static inline void fpe_alibi_select_f16(fpe_f16 *x, const float *kf, Py_ssize_t n,
                                            float qf, float s, float lim, int symmetric,
                                            int accumulate)
    {
        (void)x; (void)kf; (void)n; (void)qf; (void)s; (void)lim; (void)symmetric;
        (void)accumulate;
    }
    static inline void fpe_alibi_select_bf16(fpe_bf16 *x, const float *kf, Py_ssize_t n,
                                             float qf, float s, float lim, int symmetric,
                                             int accumulate)
    {
        (void)x; (void)kf; (void)n; (void)qf; (void)s; (void)lim; (void)symmetric;
        (void)accumulate;
    }
    #define FPE_ALIBI_HALF_STREAM0(NAME, T)                                               \
    static inline Py_ssize_t NAME(T *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1,    \
                                  float qf, float s, int flip)                           \
    {                                                                                   \
        (void)x; (void)kf; (void)j1; (void)qf; (void)s; (void)flip;                     \
        return j0;                                                                      \
    }
    FPE_ALIBI_HALF_STREAM0(fpe_alibi_row_stream_f16, fpe_f16)
    FPE_ALIBI_HALF_STREAM0(fpe_alibi_row_stream_bf16, fpe_bf16)
    #endif
    """
    int FPE_ALIBI_HALF_ONE_PASS
    void fpe_alibi_seg_f16(fpe_f16 *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1,
                           float qf, float s, int flip, int accumulate) nogil
    void fpe_alibi_seg_bf16(fpe_bf16 *x, const float *kf, Py_ssize_t j0, Py_ssize_t j1,
                            float qf, float s, int flip, int accumulate) nogil
    void fpe_alibi_select_f16(fpe_f16 *x, const float *kf, Py_ssize_t n, float qf, float s,
                              float lim, int symmetric, int accumulate) nogil
    void fpe_alibi_select_bf16(fpe_bf16 *x, const float *kf, Py_ssize_t n, float qf, float s,
                               float lim, int symmetric, int accumulate) nogil
    Py_ssize_t fpe_alibi_rows4_stream_f32(float *r0, float *r1, float *r2, float *r3,
                                          const float *kf, Py_ssize_t j0, Py_ssize_t j1,
                                          float qf, const float *sl, int flip) nogil
    Py_ssize_t fpe_alibi_rows4_stream_f64(double *r0, double *r1, double *r2, double *r3,
                                          const double *kf, Py_ssize_t j0, Py_ssize_t j1,
                                          double qf, const double *sl, int flip) nogil
    Py_ssize_t fpe_alibi_row_stream_f32(float *r, const float *kf, Py_ssize_t j0,
                                        Py_ssize_t j1, float qf, float slope, int flip) nogil
    Py_ssize_t fpe_alibi_row_stream_f64(double *r, const double *kf, Py_ssize_t j0,
                                        Py_ssize_t j1, double qf, double slope,
                                        int flip) nogil
    Py_ssize_t fpe_alibi_row_stream_f16(fpe_f16 *x, const float *kf, Py_ssize_t j0,
                                        Py_ssize_t j1, float qf, float s, int flip) nogil
    Py_ssize_t fpe_alibi_row_stream_bf16(fpe_bf16 *x, const float *kf, Py_ssize_t j0,
                                         Py_ssize_t j1, float qf, float s, int flip) nogil
    Py_ssize_t VECTOR_BYTES "FPE_ALIBI_VECTOR_BYTES"
    int FPE_PAIRS_AVX2
    void fpe_alibi_seg4_f32(float *r0, float *r1, float *r2, float *r3, const float *kf,
                            Py_ssize_t j0, Py_ssize_t j1, float qf, const float *s,
                            int flip, int accumulate) nogil
    void fpe_alibi_seg4_f64(double *r0, double *r1, double *r2, double *r3, const double *kf,
                            Py_ssize_t j0, Py_ssize_t j1, double qf, const double *s,
                            int flip, int accumulate) nogil
    void fpe_alibi_ninf4_f32(float *r0, float *r1, float *r2, float *r3, Py_ssize_t j0,
                             Py_ssize_t j1, uint32_t keep) nogil
    void fpe_alibi_ninf4_f64(double *r0, double *r1, double *r2, double *r3, Py_ssize_t j0,
                             Py_ssize_t j1, uint64_t keep) nogil
    void fpe_alibi_select4_f32(float *r0, float *r1, float *r2, float *r3, const float *kf,
                               Py_ssize_t j0, Py_ssize_t j1, float qf, const float *s,
                               float lim, int symmetric, int accumulate) nogil
    void fpe_alibi_select4_f64(double *r0, double *r1, double *r2, double *r3,
                               const double *kf, Py_ssize_t j0, Py_ssize_t j1, double qf,
                               const double *s, double lim, int symmetric,
                               int accumulate) nogil


cdef struct AlibiCall:
    Py_ssize_t batch, heads, q, k
    Py_ssize_t sh, sq, sk           # element strides of heads, queries, keys
    const Py_ssize_t *boff          # (batch,) element offset of each leading-dims row
    const double *slopes            # (heads,)
    const int64_t *qpos             # (qrows, q), or NULL for q_offset + i
    Py_ssize_t qrows
    int64_t q_offset
    const int64_t *kpos             # (krows, k), or NULL for j
    Py_ssize_t krows
    const unsigned char *mask       # (mrows, k) of 0/1, or NULL
    Py_ssize_t mrows
    bint positions_from_mask        # kpos derived from the mask (BLOOM's)
    const Py_ssize_t *runs          # then (krows, 2): mask_run of each row; or NULL
    bint runs_only                  # every unit of a run's row takes rows4_keys
    bint causal, symmetric, accumulate
    bint exact                      # every position exact in real_t: the vector loops
    bint int32_positions            # every position in int32 (alibi_key_rows)
    uint32_t zero                   # 0, opaque to the compiler (fpe_alibi_ninf4_*)
    bint plain                      # key j is at position j, no mask: rows split at qpos
    bint stream                     # a table past the caches: non-temporal stores
    bint four_rows                  # four heads' rows at once (rows4_*): see alibi_execute
    char *kf                        # (kfrows, kst) key positions as real_t, NaN if masked,
    Py_ssize_t kfrows, kst          # row r's key j at kf + (r * kst + kmis + j) * sizeof(real_t)
    Py_ssize_t kmis
    bint columns                    # queries closer in memory than keys: alibi_column
    char *nqf                       # then (qrows, q) minus the query positions, as real_t
    bint across_heads               # heads closest in memory: alibi_heads
    char *slr                       # then (heads,) slopes as real_t
    Py_ssize_t nunits               # units of work of the walk chosen (alibi_any)


cdef enum:
    SELECT_CHUNK = 512                # float16 rows convert in chunks of this many keys
    # indices rows4_keys takes for a run (exact in float32, within int32 for seg4)
    RUN_EXACT = 1 << 24
    HEAD_GROUP = 4                    # heads per unit of work: their rows share distances
    # decode-sized calls run on a stack buffer: no allocation at all
    ALIBI_STACK_BYTES = 24576


cdef inline Py_ssize_t aligned_from(const void *row, Py_ssize_t j0, Py_ssize_t j1,
                                    Py_ssize_t itemsize,
                                    Py_ssize_t align=VECTOR_BYTES) noexcept nogil:
    """The first j >= j0 where row + j (unit stride) is `align`-byte aligned (a power of
    two), at most j1."""
    cdef size_t addr = <size_t>row + <size_t>(j0 * itemsize)
    cdef Py_ssize_t n = <Py_ssize_t>((align - (addr & (align - 1))) & (align - 1)) // itemsize
    return min(j0 + n, j1)


# ---- the vector loops: key positions as real_t ------------------------------------------

cdef inline void seg_unit(store_t *row, Py_ssize_t j0, Py_ssize_t j1, const real_t *kf,
                          real_t qf, real_t slope, bint flip, bint accumulate) noexcept nogil:
    """row[j] (+)= slope * (kf[j] - qf), or slope * (qf - kf[j]) when flip; unit stride."""
    cdef Py_ssize_t j
    cdef real_t kind = 0
    if accumulate:
        if flip:
            for j in range(j0, j1):
                store(row, j, load(row, j, kind) + slope * (qf - kf[j]))
        else:
            for j in range(j0, j1):
                store(row, j, load(row, j, kind) + slope * (kf[j] - qf))
    else:
        if flip:
            for j in range(j0, j1):
                store(row, j, slope * (qf - kf[j]))
        else:
            for j in range(j0, j1):
                store(row, j, slope * (kf[j] - qf))


cdef inline void seg_run(store_t *row, Py_ssize_t j0, Py_ssize_t j1, const real_t *kf,
                         real_t qf, real_t slope, bint flip, bint accumulate) noexcept nogil:
    """seg_unit on a unit-stride row: float32/float64 from the first VECTOR_BYTES
    aligned element; float16/bfloat16 in one pass where FPE_ALIBI_HALF_ONE_PASS."""
    cdef Py_ssize_t jm
    if store_t is float or store_t is double:
        jm = aligned_from(row, j0, j1, sizeof(store_t))
        seg_unit(row, j0, jm, kf, qf, slope, flip, accumulate)
        seg_unit(row, jm, j1, kf, qf, slope, flip, accumulate)
    elif store_t is fpe_f16 and real_t is float and FPE_ALIBI_HALF_ONE_PASS:
        fpe_alibi_seg_f16(row, kf, j0, j1, qf, slope, flip, accumulate)
    elif store_t is fpe_bf16 and real_t is float and FPE_ALIBI_HALF_ONE_PASS:
        fpe_alibi_seg_bf16(row, kf, j0, j1, qf, slope, flip, accumulate)
    else:
        seg_unit(row, j0, j1, kf, qf, slope, flip, accumulate)


cdef inline Py_ssize_t row_stream(store_t *row, Py_ssize_t j0, Py_ssize_t j1,
                                  const real_t *kf, real_t qf, real_t slope,
                                  bint flip) noexcept nogil:
    """fpe_alibi_row_stream_* of the storage: whole lines from j0 (64-byte aligned),
    the first j not written (j0 where the variant has none)."""
    cdef Py_ssize_t je = j0
    if store_t is float and real_t is float:
        je = fpe_alibi_row_stream_f32(row, kf, j0, j1, qf, slope, flip)
    elif store_t is double and real_t is double:
        je = fpe_alibi_row_stream_f64(row, kf, j0, j1, qf, slope, flip)
    elif store_t is fpe_f16 and real_t is float:
        je = fpe_alibi_row_stream_f16(row, kf, j0, j1, qf, slope, flip)
    elif store_t is fpe_bf16 and real_t is float:
        je = fpe_alibi_row_stream_bf16(row, kf, j0, j1, qf, slope, flip)
    return je


cdef inline void seg_bias(store_t *row, Py_ssize_t sk, Py_ssize_t j0, Py_ssize_t j1,
                          const real_t *kf, real_t qf, real_t slope, bint flip,
                          bint accumulate, bint stream) noexcept nogil:
    """seg_unit for j0 <= j < j1, any stride; a row of a table past the caches (stream,
    unit stride) with non-temporal stores of whole lines from its first 64-byte
    aligned element."""
    cdef Py_ssize_t j, jm, je
    cdef real_t kind = 0
    if sk == 1:
        if stream and not accumulate:
            # the row's last line, partly the next row's: its read for ownership, started
            # now, overlaps the stores (a demand miss after them stalled every row:
            # float16 rows took 2x the time when not 64-byte aligned)
            if j1 > j0:
                prefetch_lines(row + j1 - 1, 0, 1, 1)
            jm = aligned_from(row, j0, j1, sizeof(store_t), 64)
            seg_run(row, j0, jm, kf, qf, slope, flip, False)
            je = row_stream(row, jm, j1, kf, qf, slope, flip)
            seg_run(row, je, j1, kf, qf, slope, flip, False)
        else:
            seg_run(row, j0, j1, kf, qf, slope, flip, accumulate)
        return
    if accumulate:
        if flip:
            for j in range(j0, j1):
                store(row, j * sk, load(row, j * sk, kind) + slope * (qf - kf[j]))
        else:
            for j in range(j0, j1):
                store(row, j * sk, load(row, j * sk, kind) + slope * (kf[j] - qf))
    else:
        if flip:
            for j in range(j0, j1):
                store(row, j * sk, slope * (qf - kf[j]))
        else:
            for j in range(j0, j1):
                store(row, j * sk, slope * (kf[j] - qf))


cdef inline void seg_fill(store_t *row, Py_ssize_t sk, Py_ssize_t j0, Py_ssize_t j1,
                          real_t value) noexcept nogil:
    cdef Py_ssize_t j, jm = j0
    if sk == 1:
        if store_t is float or store_t is double:
            jm = aligned_from(row, j0, j1, sizeof(store_t))
            for j in range(j0, jm):
                store(row, j, value)
        for j in range(jm, j1):
            store(row, j, value)
    else:
        for j in range(j0, j1):
            store(row, j * sk, value)


cdef inline void span_plain(const AlibiCall *a, store_t *row, Py_ssize_t sk, Py_ssize_t n,
                            const real_t *kf, real_t qf, real_t slope, Py_ssize_t split,
                            bint stream) noexcept nogil:
    """n keys at positions kf[0 .. n - 1] (consecutive), the first `split` of them at or
    before the query: the bias on those, then -inf (causal), the mirrored bias
    (symmetric) or the same bias on the rest."""
    if split == n or not (a.causal or a.symmetric):
        # every key up to the query (decode), or no mask: one loop, shared
        seg_bias(row, sk, 0, n, kf, qf, slope, False, a.accumulate, stream)
    else:
        seg_bias(row, sk, 0, split, kf, qf, slope, False, a.accumulate, stream)
        if a.causal:
            seg_fill(row, sk, split, n, <real_t>-INFINITY)
        else:
            seg_bias(row, sk, split, n, kf, qf, slope, True, a.accumulate, stream)


cdef inline Py_ssize_t plain_split(const AlibiCall *a, int64_t qp) noexcept nogil:
    """Keys at or before a query at qp when key j is at position j."""
    return a.k if qp >= a.k else <Py_ssize_t>qp + 1


cdef inline void row_plain(const AlibiCall *a, store_t *row, const real_t *kf, int64_t qp,
                           real_t slope) noexcept nogil:
    """A row whose key j is at position j, unmasked."""
    span_plain(a, row, a.sk, a.k, kf, <real_t>qp, slope, plain_split(a, qp), a.stream)


cdef inline void rows_f16(const AlibiCall *a, fpe_f16 *row0, Py_ssize_t nh, const float *kf,
                          int64_t qp, const double *slopes) noexcept nogil:
    """Unit-stride float16 rows of the plain case without FMA and F16C (the others take
    fpe_alibi_seg_f16's one pass; masked ones select_line): chunks converted to float32
    on the stack, the float32 loops there, converted back. The same arithmetic as one
    element at a time, in vectors."""
    cdef float buf[SELECT_CHUNK + 16]
    cdef float *tmp = <float *>((<size_t>buf + 63) & ~(<size_t>63))   # aligned like kf
    cdef float qf = <float>qp
    cdef Py_ssize_t split = plain_split(a, qp)
    cdef Py_ssize_t t, c0, n
    cdef fpe_f16 *row
    for t in range(nh):
        row = row0 + t * a.sh
        c0 = 0
        while c0 < a.k:
            n = min(<Py_ssize_t>SELECT_CHUNK, a.k - c0)
            if a.accumulate:
                fpe_f16_run_load(row + c0, tmp, n)
            span_plain(a, tmp, 1, n, kf + c0, qf, <float>slopes[t],
                       min(max(split - c0, 0), n), False)
            fpe_f16_run_store(tmp, row + c0, n)
            c0 += n


cdef inline void seg4_unit(real_t *r0, real_t *r1, real_t *r2, real_t *r3,
                           Py_ssize_t j0, Py_ssize_t j1, const real_t *kf, real_t qf,
                           const real_t *sl, bint flip, bint accumulate) noexcept nogil:
    """seg_unit on four rows (heads) at once: one distance serves four rows
    (fpe_alibi_seg4_*, above: kf NULL for keys at their indices, counted)."""
    if real_t is float:
        fpe_alibi_seg4_f32(r0, r1, r2, r3, kf, j0, j1, qf, sl, flip, accumulate)
    else:
        fpe_alibi_seg4_f64(r0, r1, r2, r3, kf, j0, j1, qf, sl, flip, accumulate)


cdef inline void seg4(real_t **rows, Py_ssize_t j0, Py_ssize_t j1, const real_t *kf,
                      real_t qf, const real_t *sl, bint flip, bint accumulate,
                      bint stream) noexcept nogil:
    """seg4_unit of keys at their indices (kf[j] == j) from the first VECTOR_BYTES
    aligned element of the first row, the keys counted where their indices fit int32;
    a table (stream) past the caches from the first 64-byte aligned element: four rows
    at once where they are aligned alike (measured 1.2-1.3x faster than row by row),
    else row by row, each from its own."""
    cdef Py_ssize_t jm, je
    cdef int t
    cdef const real_t *keys = kf
    if j1 <= INT32_MAX:
        keys = NULL
    if stream and not accumulate:
        jm = aligned_from(rows[0], j0, j1, sizeof(real_t), 64)
        if ((<size_t>rows[0] ^ <size_t>rows[1]) | (<size_t>rows[0] ^ <size_t>rows[2])
                | (<size_t>rows[0] ^ <size_t>rows[3])) & 63 == 0:
            # the four rows aligned alike (a head's size a multiple of 64 bytes): each
            # line of key distances serves four rows' lines
            seg4_unit(rows[0], rows[1], rows[2], rows[3], j0, jm, kf, qf, sl, flip, False)
            if real_t is float:
                je = fpe_alibi_rows4_stream_f32(rows[0], rows[1], rows[2], rows[3], kf, jm,
                                                j1, qf, sl, flip)
            else:
                je = fpe_alibi_rows4_stream_f64(rows[0], rows[1], rows[2], rows[3], kf, jm,
                                                j1, qf, sl, flip)
            seg4_unit(rows[0], rows[1], rows[2], rows[3], je, j1, kf, qf, sl, flip, False)
            return
        for t in range(4):
            seg_bias(rows[t], 1, j0, j1, kf, qf, sl[t], flip, False, True)
        return
    jm = aligned_from(rows[0], j0, j1, sizeof(real_t))
    seg4_unit(rows[0], rows[1], rows[2], rows[3], j0, jm, keys, qf, sl, flip, accumulate)
    seg4_unit(rows[0], rows[1], rows[2], rows[3], jm, j1, keys, qf, sl, flip, accumulate)


cdef inline void ninf4(real_t **rows, Py_ssize_t j0, Py_ssize_t j1, uint32_t zero) noexcept nogil:
    """fpe_alibi_ninf4_* from the first VECTOR_BYTES aligned element of the first row."""
    cdef Py_ssize_t jm = aligned_from(rows[0], j0, j1, sizeof(real_t))
    if real_t is float:
        fpe_alibi_ninf4_f32(rows[0], rows[1], rows[2], rows[3], j0, jm, zero)
        fpe_alibi_ninf4_f32(rows[0], rows[1], rows[2], rows[3], jm, j1, zero)
    else:
        fpe_alibi_ninf4_f64(rows[0], rows[1], rows[2], rows[3], j0, jm, zero)
        fpe_alibi_ninf4_f64(rows[0], rows[1], rows[2], rows[3], jm, j1, zero)


cdef inline void masked4(const AlibiCall *a, real_t **rows, Py_ssize_t j0,
                         Py_ssize_t j1) noexcept nogil:
    """-inf into keys j0 .. j1 - 1 of four unit-stride rows."""
    cdef int t
    if j1 <= j0:
        return
    if a.accumulate:
        ninf4(rows, j0, j1, a.zero)
    else:
        for t in range(4):
            seg_fill(rows[t], 1, j0, j1, <real_t>-INFINITY)


cdef inline void rows4_keys(const AlibiCall *a, real_t **rows, const real_t *kf,
                            Py_ssize_t lo, Py_ssize_t hi, int64_t qv, const real_t *sl,
                            bint stream) noexcept nogil:
    """Four unit-stride rows of float32/float64 storage whose keys lo .. hi - 1 are at
    their indices, the query at index qv (both exact in real_t), -inf outside them: the
    bias up to the query, then -inf (causal), the mirrored bias (symmetric) or the same
    bias. Every key of a row unmasked (row_plain's four at once: lo = 0, hi = k, kf[j] ==
    j for a table streamed past the caches or indices past int32), or a padded row whose
    real tokens are one run lo .. hi - 1 at positions 0, 1, 2, ... (BLOOM's, mask_run;
    the query's position plus lo, hi <= RUN_EXACT, kf NULL: seg4 counts the keys). For
    such a run the same bits as rows4_select, without its load of key positions and its
    select per key: with the key rows it leaves unmade (runs_only), a left-padded decode
    over 4 x 4096 keys took 0.81-0.84x the time on an AMD Zen 4."""
    cdef real_t qf = <real_t>qv
    cdef Py_ssize_t split = hi if qv >= hi - 1 else <Py_ssize_t>qv + 1
    masked4(a, rows, 0, lo)
    if split == hi or not (a.causal or a.symmetric):
        seg4(rows, lo, hi, kf, qf, sl, False, a.accumulate, stream)
    else:
        seg4(rows, lo, split, kf, qf, sl, False, a.accumulate, stream)
        if a.causal:
            masked4(a, rows, split, hi)
        else:
            seg4(rows, split, hi, kf, qf, sl, True, a.accumulate, stream)
    masked4(a, rows, hi, a.k)


cdef inline void rows4_select(const AlibiCall *a, real_t **rows, const real_t *kf,
                              int64_t qp, const real_t *sl) noexcept nogil:
    """row_select on four unit-stride rows of float32/float64 storage at once, from the
    first VECTOR_BYTES aligned element of the first row: one load of key positions per
    four rows."""
    cdef real_t qf = <real_t>qp
    cdef real_t lim = qf if a.causal else <real_t>INFINITY
    cdef Py_ssize_t jm = aligned_from(rows[0], 0, a.k, sizeof(real_t))
    if real_t is float:
        fpe_alibi_select4_f32(rows[0], rows[1], rows[2], rows[3], kf, 0, jm, qf, sl, lim,
                              a.symmetric, a.accumulate)
        fpe_alibi_select4_f32(rows[0], rows[1], rows[2], rows[3], kf, jm, a.k, qf, sl, lim,
                              a.symmetric, a.accumulate)
    else:
        fpe_alibi_select4_f64(rows[0], rows[1], rows[2], rows[3], kf, 0, jm, qf, sl, lim,
                              a.symmetric, a.accumulate)
        fpe_alibi_select4_f64(rows[0], rows[1], rows[2], rows[3], kf, jm, a.k, qf, sl, lim,
                              a.symmetric, a.accumulate)


cdef inline real_t keep_or(real_t v, bint keep, real_t other) noexcept nogil:
    """v where keep, else other: a select on the bits, as a branch (or a ternary) on a
    float comparison, or on a float that may be inexact, does not vectorise under GCC's
    default -ftrapping-math."""
    cdef uint32_t b32, o32, m32
    cdef uint64_t b64, o64, m64
    if real_t is float:
        memcpy(&b32, &v, 4)
        memcpy(&o32, &other, 4)
        m32 = <uint32_t>0 - <uint32_t>keep
        b32 = (b32 & m32) | (o32 & ~m32)
        memcpy(&v, &b32, 4)
    else:
        memcpy(&b64, &v, 8)
        memcpy(&o64, &other, 8)
        m64 = <uint64_t>0 - <uint64_t>keep
        b64 = (b64 & m64) | (o64 & ~m64)
        memcpy(&v, &b64, 8)
    return v


cdef inline void select_unit(store_t *row, Py_ssize_t sk, Py_ssize_t j0, Py_ssize_t j1,
                             const real_t *kf, real_t qf, real_t slope, real_t lim,
                             bint symmetric, bint accumulate) noexcept nogil:
    """Keys of arbitrary positions: key j is kept where kf[j] <= lim (never for NaN, a
    masked key); the bias is computed for every key, then selected (no branch)."""
    cdef Py_ssize_t j
    cdef real_t kind = 0, ninf = -INFINITY
    cdef real_t d, nd, kj
    if symmetric and accumulate:
        for j in range(j0, j1):
            kj = kf[j]
            d = kj - qf
            nd = qf - kj
            d = d if d < nd else nd                     # -|kpos - qpos|
            store(row, j * sk,
                  keep_or(load(row, j * sk, kind) + slope * d, kj <= lim, ninf))
    elif symmetric:
        for j in range(j0, j1):
            kj = kf[j]
            d = kj - qf
            nd = qf - kj
            d = d if d < nd else nd
            store(row, j * sk, keep_or(slope * d, kj <= lim, ninf))
    elif accumulate:
        for j in range(j0, j1):
            kj = kf[j]
            store(row, j * sk,
                  keep_or(load(row, j * sk, kind) + slope * (kj - qf), kj <= lim, ninf))
    else:
        for j in range(j0, j1):
            kj = kf[j]
            store(row, j * sk, keep_or(slope * (kj - qf), kj <= lim, ninf))


cdef inline void select_line(store_t *x, Py_ssize_t stride, Py_ssize_t n, const real_t *kf,
                             real_t qf, real_t slope, real_t lim, bint symmetric,
                             bint accumulate) noexcept nogil:
    """select_unit over n elements `stride` apart (a row of keys, or alibi_column's
    column of queries), in vectors wherever the storage allows."""
    cdef Py_ssize_t jm, c0, m
    cdef real_t buf[SELECT_CHUNK + 16]
    cdef real_t *tmp = <real_t *>((<size_t>buf + 63) & ~(<size_t>63))   # aligned like kf
    if store_t is fpe_f16 and real_t is float and stride == 1 and FPE_ALIBI_HALF_ONE_PASS:
        fpe_alibi_select_f16(x, <const float *>kf, n, <float>qf, <float>slope, <float>lim,
                             symmetric, accumulate)
    elif store_t is fpe_bf16 and real_t is float and stride == 1 and FPE_ALIBI_HALF_ONE_PASS:
        fpe_alibi_select_bf16(x, <const float *>kf, n, <float>qf, <float>slope, <float>lim,
                              symmetric, accumulate)
    elif store_t is fpe_f16:
        # convert chunks to float32 on the stack, select there in vectors, convert back
        c0 = 0
        while c0 < n:
            m = min(<Py_ssize_t>SELECT_CHUNK, n - c0)
            if accumulate:
                gather(x + c0 * stride, stride, tmp, m)
            select_unit(tmp, 1, 0, m, kf + c0, qf, slope, lim, symmetric, accumulate)
            scatter(tmp, x + c0 * stride, stride, m)
            c0 += m
    elif stride == 1:
        # unit stride spelled out, so that the loops vectorise
        if store_t is float or store_t is double:
            jm = aligned_from(x, 0, n, sizeof(store_t))
            select_unit(x, 1, 0, jm, kf, qf, slope, lim, symmetric, accumulate)
            select_unit(x, 1, jm, n, kf, qf, slope, lim, symmetric, accumulate)
        else:
            select_unit(x, 1, 0, n, kf, qf, slope, lim, symmetric, accumulate)
    else:
        select_unit(x, stride, 0, n, kf, qf, slope, lim, symmetric, accumulate)


cdef inline void row_select(const AlibiCall *a, store_t *row, const real_t *kf, int64_t qp,
                            real_t slope) noexcept nogil:
    cdef real_t qf = <real_t>qp
    select_line(row, a.sk, a.k, kf, qf, slope, qf if a.causal else <real_t>INFINITY,
                a.symmetric, a.accumulate)


# ---- the exact scalar loop: positions past the real_t's integers ------------------------

cdef inline void row_exact(const AlibiCall *a, store_t *row, const int64_t *kp,
                           const unsigned char *m, int64_t qp, real_t slope) noexcept nogil:
    cdef Py_ssize_t j
    cdef int64_t kj, d
    cdef real_t kind = 0, v
    for j in range(a.k):
        kj = kp[j] if kp != NULL else <int64_t>j
        if (m != NULL and m[j] == 0) or (a.causal and kj > qp):
            v = <real_t>-INFINITY
        else:
            d = kj - qp                     # both in [0, 2**63): no overflow
            if a.symmetric and d > 0:
                d = -d
            v = slope * <real_t>d
            if a.accumulate:
                v = load(row, j * a.sk, kind) + v
        store(row, j * a.sk, v)


cdef inline int64_t query_position(const AlibiCall *a, Py_ssize_t b, Py_ssize_t i) noexcept nogil:
    """The position of query i of sequence b."""
    return a.qpos[(b if a.qrows > 1 else 0) * a.q + i] if a.qpos != NULL else a.q_offset + i


cdef inline const real_t *key_row(const AlibiCall *a, Py_ssize_t b, real_t kind) noexcept nogil:
    """Sequence b's key positions as real_t (alibi_key_rows); `kind` picks the type."""
    return (<const real_t *>a.kf) + (b if a.kfrows > 1 else 0) * a.kst + a.kmis


# ---- columns: a view whose queries lie closer in memory than its keys --------------------
#
# The bias of (query i, key j) is slope * (k_j - q_i) = slope * ((-q_i) - (-k_j)): the row
# loop of select_unit, walking a column of queries with the negated query positions in
# place of the key positions and the negated key position in place of the query's, gives
# every element the very bits of the rows (the distance is exact either way, and kept
# where -q_i <= -k_j, i.e. causal; a masked key's NaN keeps none of its column).

cdef void alibi_column(const AlibiCall *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of (batch, heads, k): the column of key j of one head of one sequence."""
    cdef Py_ssize_t hk = a.heads * a.k
    cdef Py_ssize_t b = u // hk
    cdef Py_ssize_t h = (u % hk) // a.k
    cdef Py_ssize_t j = u % a.k
    cdef const real_t *kf = key_row(a, b, kind)
    cdef const real_t *nqf = (<const real_t *>a.nqf) + (b if a.qrows > 1 else 0) * a.q
    cdef real_t nk = -kf[j]
    cdef real_t lim = nk if a.causal else (<real_t>INFINITY if kf[j] == kf[j] else nk)
    select_line(x + a.boff[b] + h * a.sh + j * a.sk, a.sq, a.q, nqf, nk,
                <real_t>a.slopes[h], lim, a.symmetric, a.accumulate)


cdef void alibi_heads(const AlibiCall *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of (batch, q): query row i of every head, heads inner, for a view whose
    heads lie closest in memory: each key's distance and mask serve every head, and
    each element gets the rows' bits (the same distance times the same slope)."""
    cdef Py_ssize_t b = u // a.q
    cdef Py_ssize_t i = u % a.q
    cdef Py_ssize_t j, h
    cdef real_t qf = <real_t>query_position(a, b, i)
    cdef real_t lim = qf if a.causal else <real_t>INFINITY
    cdef const real_t *kf = key_row(a, b, kind)
    cdef const real_t *sl = <const real_t *>a.slr
    cdef store_t *col
    cdef real_t kj, d, nd
    for j in range(a.k):
        col = x + a.boff[b] + i * a.sq + j * a.sk
        kj = kf[j]
        if not kj <= lim:                       # causal, or a masked key (NaN)
            for h in range(a.heads):
                store(col, h * a.sh, <real_t>-INFINITY)
            continue
        d = kj - qf
        if a.symmetric:
            nd = qf - kj
            d = d if d < nd else nd             # -|kpos - qpos|
        if a.accumulate:
            for h in range(a.heads):
                store(col, h * a.sh, load(col, h * a.sh, kind) + sl[h] * d)
        else:
            for h in range(a.heads):
                store(col, h * a.sh, sl[h] * d)


cdef void alibi_query_columns(const AlibiCall *a, real_t *nqf) noexcept nogil:
    """nqf[r, i] = -(query position) as real_t."""
    cdef Py_ssize_t r, i
    for r in range(a.qrows):
        for i in range(a.q):
            nqf[r * a.q + i] = -<real_t>query_position(a, r, i)


cdef void alibi_unit(const AlibiCall *a, store_t *x, Py_ssize_t u, real_t kind) noexcept nogil:
    """Unit u of (batch, head groups, q): query row i of up to HEAD_GROUP heads of one
    sequence (consecutive units continue the same heads' rows in memory order)."""
    cdef Py_ssize_t ngroups = ceil_div(a.heads, HEAD_GROUP)
    cdef Py_ssize_t gq = ngroups * a.q
    cdef Py_ssize_t b = u // gq
    cdef Py_ssize_t h0 = ((u % gq) // a.q) * HEAD_GROUP
    cdef Py_ssize_t i = u % a.q
    cdef Py_ssize_t nh = min(<Py_ssize_t>HEAD_GROUP, a.heads - h0)
    cdef store_t *row0 = x + a.boff[b] + h0 * a.sh + i * a.sq
    cdef int64_t qp
    cdef const real_t *kf
    cdef const int64_t *kp
    cdef const unsigned char *m
    cdef real_t *rows[HEAD_GROUP]
    cdef real_t sl[HEAD_GROUP]
    cdef Py_ssize_t t
    cdef const Py_ssize_t *run
    qp = query_position(a, b, i)
    if a.exact:
        kf = key_row(a, b, kind)
        if store_t is fpe_f16 and a.sk == 1 and a.plain and not FPE_ALIBI_HALF_ONE_PASS:
            rows_f16(a, row0, nh, <const float *>kf, qp, a.slopes + h0)
        elif (store_t is float or store_t is double) and a.plain and a.sk == 1 \
                and nh == HEAD_GROUP and a.four_rows:
            for t in range(HEAD_GROUP):
                rows[t] = <real_t *>(row0 + t * a.sh)
                sl[t] = <real_t>a.slopes[h0 + t]
            rows4_keys(a, rows, kf, 0, a.k, qp, sl, a.stream)
        elif a.plain:
            for t in range(nh):
                row_plain(a, row0 + t * a.sh, kf, qp, <real_t>a.slopes[h0 + t])
        elif ((store_t is float or store_t is double) and a.sk == 1 and nh == HEAD_GROUP
              and a.four_rows):
            for t in range(HEAD_GROUP):
                rows[t] = <real_t *>(row0 + t * a.sh)
                sl[t] = <real_t>a.slopes[h0 + t]
            run = a.runs + 2 * (b if a.krows > 1 else 0) if a.runs != NULL else NULL
            if run != NULL and run[0] >= 0 and qp + run[0] <= RUN_EXACT:
                rows4_keys(a, rows, NULL, run[0], run[1], qp + run[0], sl, False)
            else:
                rows4_select(a, rows, kf, qp, sl)
        else:
            for t in range(nh):
                row_select(a, row0 + t * a.sh, kf, qp, <real_t>a.slopes[h0 + t])
        if a.stream:
            fpe_stream_fence()  # this thread's table rows, before the call returns
    else:
        kp = a.kpos + (b if a.krows > 1 else 0) * a.k if a.kpos != NULL else NULL
        m = a.mask + (b if a.mrows > 1 else 0) * a.k if a.mask != NULL else NULL
        for t in range(nh):
            row_exact(a, row0 + t * a.sh, kp, m, qp, <real_t>a.slopes[h0 + t])


cdef void alibi_key_rows(const AlibiCall *a, real_t *kf) noexcept nogil:
    """kf[r, j] = key position as real_t, NaN where masked (rows of kst, from kmis).
    Positions go through int32 where they fit, and masked keys are selected on the
    bits: AVX2 converts int32 to float in vectors, not int64, and GCC does not vectorise
    the branch (the rows of a padded decode over 4 x 4096 keys took 7.5 us of its 47 on
    an AMD Zen 4 converted from int64 with a branch, 3 us as now)."""
    cdef Py_ssize_t r, j
    cdef Py_ssize_t jj, n = a.k
    cdef int32_t j32
    cdef const int64_t *kp
    cdef const unsigned char *m
    cdef real_t *row
    cdef real_t nan = NAN
    for r in range(a.kfrows):
        if a.runs_only and a.runs[2 * r] >= 0:
            continue  # its units take rows4_keys, which reads no key positions
        row = kf + r * a.kst + a.kmis
        kp = a.kpos + (r if a.krows > 1 else 0) * a.k if a.kpos != NULL else NULL
        m = a.mask + (r if a.mrows > 1 else 0) * a.k if a.mask != NULL else NULL
        if kp != NULL and a.int32_positions:
            for j in range(n):
                row[j] = <real_t><int32_t>kp[j]
        elif kp != NULL:
            for j in range(n):
                row[j] = <real_t>kp[j]
        elif n <= INT32_MAX:
            for j32 in range(<int32_t>n):
                row[j32] = <real_t>j32
        else:
            for jj in range(n):
                row[jj] = <real_t>jj
        if m != NULL:
            for j in range(n):
                row[j] = keep_or(row[j], m[j], nan)


cdef inline void alibi_any(const AlibiCall *a, store_t *x, Py_ssize_t u,
                           real_t kind) noexcept nogil:
    """Unit u of the walk alibi_execute chose for this view."""
    if a.across_heads:
        alibi_heads(a, x, u, kind)
    elif a.columns:
        alibi_column(a, x, u, kind)
    else:
        alibi_unit(a, x, u, kind)


cdef void alibi_run(const AlibiCall *a, store_t *x, int nthreads) noexcept nogil:
    cdef Py_ssize_t r, h
    # chunks of 16 rows share the key rows in cache, but a decode call has only
    # heads / HEAD_GROUP units: chunks of 16 would give them all to one thread
    cdef Py_ssize_t chunk = max(1, min(16, a.nunits // (4 * nthreads)))
    # storage float64 computes in float64, everything else in float32
    cdef double kind_d = 0
    cdef float kind_f = 0
    if a.exact:
        if store_t is double:
            alibi_key_rows(a, <double *>a.kf)
        else:
            alibi_key_rows(a, <float *>a.kf)
    if a.across_heads:
        for h in range(a.heads):
            if store_t is double:
                (<double *>a.slr)[h] = <double>a.slopes[h]
            else:
                (<float *>a.slr)[h] = <float>a.slopes[h]
    elif a.columns:
        if store_t is double:
            alibi_query_columns(a, <double *>a.nqf)
        else:
            alibi_query_columns(a, <float *>a.nqf)
    if nthreads > 1:
        for r in prange(a.nunits, schedule="dynamic", chunksize=chunk, num_threads=nthreads):
            if store_t is double:
                alibi_any(a, x, r, kind_d)
            else:
                alibi_any(a, x, r, kind_f)
    else:
        for r in range(a.nunits):
            if store_t is double:
                alibi_any(a, x, r, kind_d)
            else:
                alibi_any(a, x, r, kind_f)


cdef int alibi_execute(AlibiCall *a, cnp.ndarray scores, int code, int64_t max_position,
                       int num_threads) except -1:
    """Fill in the layout of `scores` and the work space, and run every row;
    the positions, mask, slopes and flags of `a` are set."""
    cdef int nd = cnp.PyArray_NDIM(scores)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(scores)
    cdef cnp.npy_intp *st = cnp.PyArray_STRIDES(scores)
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(scores)
    cdef char *xp = <char *>cnp.PyArray_DATA(scores)
    cdef Py_ssize_t b, rest, d, off, r
    cdef int ax
    a.batch = 1
    for ax in range(nd - 3):
        a.batch *= dims[ax]
    a.heads, a.q, a.k = dims[nd - 3], dims[nd - 2], dims[nd - 1]
    if a.batch == 0 or a.heads == 0 or a.q == 0 or a.k == 0:
        return 0
    a.sh, a.sq, a.sk = st[nd - 3] // itemsize, st[nd - 2] // itemsize, st[nd - 1] // itemsize
    a.plain = a.kpos == NULL and a.mask == NULL
    # a table too large to be read from the caches by what comes next (as
    # sinusoidal_table decides): past them in one pass of writes
    a.stream = (FPE_PAIRS_AVX2 and not a.accumulate and a.sk == 1 and a.plain
                and (code == CODE_F32 or code == CODE_F64 or FPE_ALIBI_HALF_ONE_PASS)
                and <size_t>cnp.PyArray_NBYTES(scores) > <size_t>STREAM_TABLE_BYTES)
    # four heads' rows at once share each load of key positions; rows streamed from
    # memory and added to go one at a time: four rows 16 MiB apart in turn took 1.2-2.8x
    # the time of one after another on an Intel Xeon (Emerald Rapids) in a causal
    # (1, 32, 2048, 2048) add, where a table and a decode's rows were faster four at once
    a.four_rows = (not a.accumulate
                   or <size_t>cnp.PyArray_NBYTES(scores) <= <size_t>STREAM_TABLE_BYTES)
    a.zero = 0
    a.exact = max_position <= (<int64_t>1 << (53 if code == CODE_F64 else 24))
    a.int32_positions = max_position <= INT32_MAX
    a.kfrows = a.batch if (a.krows > 1 or a.mrows > 1) else 1
    cdef Py_ssize_t real_size = sizeof(double) if code == CODE_F64 else sizeof(float)
    # key rows at the first row's address modulo VECTOR_BYTES (float32/float64 storage,
    # unit stride)
    a.kmis = 0
    if real_size == itemsize and a.sk == 1:
        a.kmis = (<size_t>xp & (VECTOR_BYTES - 1)) // itemsize
    a.kst = round_up(a.k + VECTOR_BYTES // real_size, 64 // real_size)
    cdef Py_ssize_t kf_bytes = a.kfrows * a.kst * real_size if a.exact else 0
    # a view whose heads lie closest in memory walks them inner; else one whose queries
    # lie closer than its keys walks those inner
    a.across_heads = (a.exact and a.heads > 1 and a.sk != 1
                      and magnitude(a.sh) < min(magnitude(a.sk), magnitude(a.sq)))
    a.columns = (a.exact and not a.across_heads and a.q > 1 and a.sk != 1
                 and magnitude(a.sq) < magnitude(a.sk))
    cdef Py_ssize_t nqf_bytes = round_up(a.qrows * a.q * real_size, 64) if a.columns else 0
    cdef Py_ssize_t slr_bytes = round_up(a.heads * real_size, 64) if a.across_heads else 0
    cdef Py_ssize_t runs_bytes = 0
    if a.exact and a.positions_from_mask:
        runs_bytes = round_up(2 * a.krows * <Py_ssize_t>sizeof(Py_ssize_t), 64)
    cdef Py_ssize_t need = (kf_bytes + nqf_bytes + slr_bytes + runs_bytes
                            + a.batch * <Py_ssize_t>sizeof(Py_ssize_t))
    cdef char stack[ALIBI_STACK_BYTES + 64]
    cdef Scratch heap = None
    cdef char *work
    if need <= ALIBI_STACK_BYTES:
        work = <char *>((<size_t>stack + 63) & ~(<size_t>63))
    else:
        heap = Scratch(0, 1, need)
        work = heap.shared
    a.kf = work
    a.nqf = work + kf_bytes
    a.slr = a.nqf + nqf_bytes
    cdef Py_ssize_t *runs = <Py_ssize_t *>(a.slr + slr_bytes)
    a.runs = NULL
    if runs_bytes:
        for r in range(a.krows):
            mask_run(a.mask + r * a.k, a.k, runs + 2 * r)
        a.runs = runs
    # where every unit of a run's row takes rows4_keys (alibi_unit's conditions, the
    # query's index in the run bounded by the largest position), its key row is not made
    a.runs_only = (a.runs != NULL and (code == CODE_F32 or code == CODE_F64) and a.sk == 1
                   and a.four_rows and a.heads % HEAD_GROUP == 0
                   and max_position + a.k <= RUN_EXACT)
    cdef Py_ssize_t *boff = <Py_ssize_t *>(a.slr + slr_bytes + runs_bytes)
    # element offset of each row of the leading dims, C order
    for b in range(a.batch):
        rest = b
        off = 0
        for ax in range(nd - 4, -1, -1):
            d = dims[ax]
            off += (rest % d) * (st[ax] // itemsize)
            rest //= d
        boff[b] = off
    a.boff = boff
    a.nunits = a.batch * ceil_div(a.heads, HEAD_GROUP) * a.q
    if a.columns:
        a.nunits = a.batch * a.heads * a.k
    elif a.across_heads:
        a.nunits = a.batch * a.q
    cdef int nthreads = units_threads(a.nunits, num_threads)
    with nogil:
        if code == CODE_F32:
            alibi_run(a, <float *>xp, nthreads)
        elif code == CODE_F64:
            alibi_run(a, <double *>xp, nthreads)
        elif code == CODE_F16:
            alibi_run(a, <fpe_f16 *>xp, nthreads)
        else:
            alibi_run(a, <fpe_bf16 *>xp, nthreads)
    return 0


cdef enum:
    # values of each of the slopes, positions and mask an alibi_call copies onto the
    # stack (a decode step's queries and heads), past which it mallocs: a small stack
    # on top of alibi_execute's work space, for threads with small stacks
    OWNED_STACK = 64


cdef struct AlibiOwned:
    # what an alibi_call reads without the GIL, copied from the caller's objects
    double sbuf[OWNED_STACK]
    int64_t qbuf[OWNED_STACK]
    int64_t kbuf[OWNED_STACK]
    unsigned char mbuf[OWNED_STACK]
    double *slopes
    int64_t *qpos
    int64_t *kpos
    unsigned char *mask


cdef void alibi_owned_free(AlibiOwned *o) noexcept:
    if o.slopes != NULL and o.slopes != &o.sbuf[0]:
        free(o.slopes)
    if o.qpos != NULL and o.qpos != &o.qbuf[0]:
        free(o.qpos)
    if o.kpos != NULL and o.kpos != &o.kbuf[0]:
        free(o.kpos)
    if o.mask != NULL and o.mask != &o.mbuf[0]:
        free(o.mask)


cdef bint owned_slopes(AlibiOwned *o, object slopes, cnp.ndarray x,
                       Py_ssize_t heads) noexcept:
    """slopes an exact, C-contiguous, aligned, native float64 or float32 vector (the
    dtype of transformers' slopes) of `heads` finite values (within float32's range
    unless x is float64: its arithmetic is float32's) whose bytes are apart from x's,
    copied into o.slopes (widened: the values the validating path's float64 copy holds)."""
    if not cnp.PyArray_CheckExact(slopes):
        return False
    cdef cnp.ndarray s = <cnp.ndarray>slopes
    cdef int typenum = cnp.PyArray_TYPE(s)
    if ((typenum != cnp.NPY_DOUBLE and typenum != cnp.NPY_FLOAT) or cnp.PyArray_NDIM(s) != 1
            or not cnp.PyArray_IS_C_CONTIGUOUS(s) or not cnp.PyArray_ISALIGNED(s)
            or not cnp.PyArray_ISNOTSWAPPED(s) or s.shape[0] != heads
            or extents_overlap(x, s)):
        return False
    o.slopes = &o.sbuf[0] if heads <= OWNED_STACK else <double *>malloc(max(heads, 1) * sizeof(double))
    if o.slopes == NULL:
        return False
    cdef Py_ssize_t h
    cdef const float *narrow
    if typenum == cnp.NPY_DOUBLE:
        memcpy(o.slopes, cnp.PyArray_DATA(s), heads * sizeof(double))
    else:
        narrow = <const float *>cnp.PyArray_DATA(s)
        for h in range(heads):
            o.slopes[h] = narrow[h]
    cdef bint f64 = cnp.PyArray_TYPE(x) == cnp.NPY_DOUBLE
    for h in range(heads):
        if not (o.slopes[h] - o.slopes[h] == 0):  # NaN or infinite
            return False
        if not f64 and not -FLT_MAX <= o.slopes[h] <= FLT_MAX:  # infinite as float32
            return False
    return True


cdef bint owned_mask(AlibiOwned *o, object key_mask, cnp.ndarray x, Py_ssize_t batch,
                     Py_ssize_t k, Py_ssize_t *rows) noexcept:
    """owned_mask_view of an exact ndarray key_mask for the scores x."""
    cdef View mv, xv
    return (cnp.PyArray_CheckExact(key_mask) and array_view(<cnp.ndarray>key_mask, &mv)
            and array_view(x, &xv) and owned_mask_view(o, &mv, &xv, batch, k, rows))


cdef bint owned_mask_view(AlibiOwned *o, const View *m, const View *x, Py_ssize_t batch,
                          Py_ssize_t k, Py_ssize_t *rows) noexcept:
    """A key mask m: aligned, native, C-contiguous bool or integer, (k,) or (1 or batch,
    k), whose bytes are apart from x's, copied into o.mask as 0/1 (a bool's every
    non-zero byte is True); an integer other than 0 and 1 is not taken."""
    if ((m.typenum != cnp.NPY_BOOL and not cnp.PyTypeNum_ISINTEGER(m.typenum))
            or not m.c_contiguous or not m.aligned or not m.native or views_overlap(x, m)):
        return False
    if not per_sequence_rows(m, batch, k, rows):
        return False
    cdef Py_ssize_t n = m.size, size = m.itemsize
    cdef const void *p = m.data
    cdef uint64_t above
    o.mask = &o.mbuf[0] if n <= OWNED_STACK else <unsigned char *>malloc(max(n, 1))
    if o.mask == NULL:
        return False
    # one loop per width, each a vector loop: the flags, and whether any was above 1
    if size == 1:
        above = mask_flags(<const uint8_t *>p, n, o.mask)
    elif size == 2:
        above = mask_flags(<const uint16_t *>p, n, o.mask)
    elif size == 4:
        above = mask_flags(<const uint32_t *>p, n, o.mask)
    elif size == 8:
        above = mask_flags(<const uint64_t *>p, n, o.mask)
    else:
        return False
    return m.typenum == cnp.NPY_BOOL or not above


ctypedef fused mask_word:
    uint8_t
    uint16_t
    uint32_t
    uint64_t


cdef uint64_t mask_flags(const mask_word *p, Py_ssize_t n, unsigned char *out) noexcept nogil:
    """out[i] = p[i] != 0; non-zero when a value (as unsigned: a negative one too) is
    above 1."""
    cdef Py_ssize_t i
    cdef mask_word above = 0
    for i in range(n):
        out[i] = p[i] != 0
        above |= p[i] & <mask_word>~<mask_word>1
    return above


cdef enum:
    # flags mask_positions reads at a time to find a run: a word of them all equal
    # starts one
    MASK_RUN_WORD = 8


cdef inline Py_ssize_t run_end(const unsigned char *m, Py_ssize_t j, Py_ssize_t k) noexcept nogil:
    """The index past the run of flags equal to m[j] (0 or 1) that starts at j."""
    cdef const void *e = memchr(m + j, 1 - m[j], k - j)
    return k if e == NULL else <Py_ssize_t>(<const unsigned char *>e - m)


cdef void mask_run(const unsigned char *m, Py_ssize_t k, Py_ssize_t *run) noexcept nogil:
    """run[0], run[1] = lo, hi where the kept keys of a row of 0/1 flags m are the one
    run lo .. hi - 1 (none: lo = hi = k) with hi <= RUN_EXACT, else lo = -1."""
    cdef const void *e = memchr(m, 1, k)
    cdef Py_ssize_t lo = k if e == NULL else <Py_ssize_t>(<const unsigned char *>e - m)
    e = memchr(m + lo, 0, k - lo)
    cdef Py_ssize_t hi = k if e == NULL else <Py_ssize_t>(<const unsigned char *>e - m)
    run[0] = lo if hi <= RUN_EXACT and (hi == k or memchr(m + hi, 1, k - hi) == NULL) else -1
    run[1] = hi


cdef int64_t mask_positions(const unsigned char *m, Py_ssize_t k, int64_t *kpos) noexcept nogil:
    """BLOOM's key positions of one padded row of 0/1 flags m: kpos[j] = the number of
    kept keys before j where m[j], else 0; returns the number of kept keys. A run of
    equal flags (padding, then the sequence) is found by memchr and written as zeros or
    a count up, which vectorise: counting key by key is a chain of dependent adds (12
    us of a 150 us padded decode over 4 x 4096 keys on an Intel Xeon)."""
    cdef Py_ssize_t j = 0, e, t
    cdef int64_t count = 0
    cdef uint64_t w
    while j < k:
        e = min(j + MASK_RUN_WORD, k)
        if e - j == MASK_RUN_WORD:
            memcpy(&w, m + j, MASK_RUN_WORD)
            if w == 0 or w == 0x0101010101010101u:
                e = run_end(m, j, k)
                if m[j]:
                    for t in range(e - j):
                        kpos[j + t] = count + t
                    count += e - j
                else:
                    memset(kpos + j, 0, (e - j) * sizeof(int64_t))
                j = e
                continue
        for t in range(j, e):
            kpos[t] = count * m[t]
            count += m[t]
        j = e
    return count


cdef int64_t *owned_block(int64_t *buf, Py_ssize_t n) noexcept:
    return buf if n <= OWNED_STACK else <int64_t *>malloc(max(n, 1) * sizeof(int64_t))


cdef int64_t largest(const int64_t *v, Py_ssize_t n, int64_t hi) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if v[i] > hi:
            hi = v[i]
    return hi


def alibi_call(object scores, object slopes, object q_positions, object q_offset,
               object k_positions, object key_mask, object causal, object symmetric,
               object accumulate, int num_threads):
    """The ALiBi entry of add_alibi and alibi_bias: scores[..., h, i, j] += bias
    (accumulate), else = bias, in place, and True; False, with nothing written, for any
    argument outside what it takes (the Python layer then validates the call in full,
    names what is wrong or normalises it, and calls this again).

    It takes: scores an exact, writable, aligned, native float array of at least 3
    dimensions (..., heads, q, k) with whole-element strides and disjoint elements;
    slopes an exact, aligned, native, C-contiguous float64 or float32 (heads,) of finite values;
    q_positions and k_positions None or integer arrays as owned_positions() takes
    them for (batch, q) and (batch, k) calls, batch the product of the leading dims;
    key_mask None or an aligned, native, C-contiguous bool or integer array (k,) or
    (1 or batch, k) of 0/1; slopes, positions and mask with byte ranges apart from
    the scores'; q_offset None or an int >= 0, not with q_positions; causal, symmetric and
    accumulate bools. As add_alibi documents: with q_positions None, query i is at
    q_offset + i (default k - q) or, when key positions are given or derived from
    key_mask as BLOOM does, at the position of key q_offset + i. Slopes, positions
    and mask are copied before they are checked and read.
    """
    cdef int code = fast_code(scores)
    if (code < 0 or type(causal) is not bool or type(symmetric) is not bool
            or type(accumulate) is not bool):
        return False
    cdef cnp.ndarray x = <cnp.ndarray>scores
    cdef int ax, nd = cnp.PyArray_NDIM(x)
    if nd < 3 or not whole_element_strides(x) or not elements_disjoint(x):
        return False
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(x)
    cdef Py_ssize_t heads = dims[nd - 3], q = dims[nd - 2], k = dims[nd - 1]
    cdef Py_ssize_t batch = 1, j, r, i
    for ax in range(nd - 3):
        batch *= dims[ax]
    cdef AlibiCall a
    cdef AlibiOwned o
    cdef int64_t off = 0, hi = -1, count, mask_hi = -1
    cdef bint given_offset = q_offset is not None
    cdef bint past_int64 = False            # an offset past int64 for no queries
    o.slopes = NULL
    o.qpos = NULL
    o.kpos = NULL
    o.mask = NULL
    a.qrows = a.krows = a.mrows = 1
    a.positions_from_mask = False
    if given_offset:
        if type(q_offset) is not int or q_positions is not None:
            return False
        if q_offset < 0:
            return False
        if q_offset > INT64_MAX_VALUE - max(q - 1, 0):
            if q:
                return False
            past_int64 = True
        else:
            off = q_offset
    try:
        if not owned_slopes(&o, slopes, x, heads):
            return False
        if key_mask is not None and not owned_mask(&o, key_mask, x, batch, k, &a.mrows):
            return False
        if k_positions is not None:
            o.kpos = owned_positions(k_positions, x, batch, k, INT64_MAX_VALUE, &o.kbuf[0],
                                     OWNED_STACK, &a.krows)
            if o.kpos == NULL:
                return False
        elif o.mask != NULL:
            # BLOOM's positions of a padded batch: real keys count 0, 1, 2, ...;
            # padding gets 0 (it is masked anyway)
            a.krows = a.mrows
            a.positions_from_mask = True
            o.kpos = owned_block(&o.kbuf[0], a.krows * k)
            if o.kpos == NULL:
                return False
            for r in range(a.krows):
                # the row's largest position: its last kept key's, or 0
                count = mask_positions(o.mask + r * k, k, o.kpos + r * k)
                if k:
                    mask_hi = max(mask_hi, count - 1, 0)
        if q_positions is not None:
            o.qpos = owned_positions(q_positions, x, batch, q, INT64_MAX_VALUE, &o.qbuf[0],
                                     OWNED_STACK, &a.qrows)
            if o.qpos == NULL:
                return False
        elif o.kpos != NULL and k > 0:
            # query i is the token at key index q_offset + i: it takes that key's position
            if not given_offset:
                off = k - q
            if off < 0 or off > k - q or past_int64:
                return False
            a.qrows = a.krows
            o.qpos = owned_block(&o.qbuf[0], a.qrows * q)
            if o.qpos == NULL:
                return False
            for r in range(a.qrows):
                memcpy(o.qpos + r * q, o.kpos + r * k + off, q * sizeof(int64_t))
            off = 0
        elif not given_offset:
            if q > k > 0:
                return False
            off = max(k - q, 0)
        if o.qpos != NULL:
            hi = largest(o.qpos, a.qrows * q, hi) if q else -1
        elif q:
            hi = off + q - 1
        if k and k_positions is None and o.mask != NULL:
            hi = max(hi, mask_hi)
        elif k:
            hi = largest(o.kpos, a.krows * k, hi) if o.kpos != NULL else max(hi, k - 1)
        a.slopes = o.slopes
        a.qpos, a.q_offset = o.qpos, off
        a.kpos, a.mask = o.kpos, o.mask
        a.causal, a.symmetric, a.accumulate = causal, symmetric, accumulate
        alibi_execute(&a, x, code, hi, num_threads)
        return True
    finally:
        alibi_owned_free(&o)
