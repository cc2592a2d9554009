/* How close a batched decode and add_sinusoidal can come to their floors where their
 * angles or their sinusoid must be made, with fastpe's own arithmetic (fastpe_math.h's
 * functions, compiled as the avx2 kernels are): side by side in one process, one thread,
 * medians of many rounds, each model against the floor of its own bytes (an in-place
 * add over them).
 *
 *   batched decode   q and k of (32, 1, 32, 128) float32, each 16 bytes past a cache
 *                    line (where NumPy puts an array of that size), 1 MiB in the caches;
 *                    rotate_half rows, one cos and sin row per sequence at its position
 *   add_sinusoidal   x of (8, 2048, 1024) float32, 64 MiB streamed from memory; the
 *                    interleaved rows of positions 0 .. 2047 made in float64 pairs
 *                    (fpe_pe_rows2_f32, reseeded every 32 tokens) and added to every
 *                    batch row
 *
 * The decode's rows are walked from their start 256 bits at a time, or from a line
 * boundary (fpe_rotate_heads_f32_lines' walk: the first 4 features, whole 256-bit steps,
 * the last 4), a row at a time or head h of q and of k by one load of the cos and sin
 * (the kernel's walk where q and k lie at one offset), then with each sequence's 64
 * angles made before its rows (fpe_sincos_f32). The sinusoidal add is timed as its parts (the rows made alone, the
 * adds of rows already made alone) and as three ways of doing both: made a 1 MiB chunk
 * at a time, then added two batch rows at a time (fastpe's form on AMD's Zen 4); the next
 * chunk's rows made between runs of the current chunk's adds (a pair of rows every few
 * rows added); and 4 frequencies of the next rows made between every two lines added.
 * Where making the rows overlaps the adds' memory traffic, the last two take less time
 * than the first; where they take more, the parts' sum bounds the call on that CPU.
 * Build and run (x86-64 with AVX2 and FMA; every loop on a 64-byte block, as the kernels
 * are built: the in-place pass straddling two took 1.3x the time on an AMD Zen 4):
 *
 *   cc -O3 -falign-loops=64 -mavx2 -mfma -mf16c -mbmi2 -ffp-contract=fast \
 *      -fno-math-errno -o /tmp/angles_bound bench/angles_bound.c -lm && /tmp/angles_bound
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
typedef ptrdiff_t Py_ssize_t;
#define PY_SSIZE_T_MAX PTRDIFF_MAX
#include "../fastpe/_kernels/fastpe_math.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times each of n loops `calls` times a round, rounds times in a rotated order; prints
 * the medians, each over the floor's: the least of the first `floors` (forms of the
 * in-place pass over the same bytes, as the bench takes the fastest of its forms) */
static void race(const char *title, int n, int floors, const char *const *names,
                 void (*const *loops)(void), int rounds, int calls)
{
    double *t = malloc(sizeof(double) * (size_t)(n * rounds));
    for (int r = 0; r < rounds; r++)
        for (int step = 0; step < n; step++) {
            const int k = (step + r) % n;
            const double t0 = now();
            for (int c = 0; c < calls; c++)
                loops[k]();
            t[k * rounds + r] = (now() - t0) / calls;
        }
    printf("%s; medians of %d rounds\n", title, rounds);
    double floor_time = 1e30;
    for (int k = 0; k < n; k++) {
        qsort(t + k * rounds, (size_t)rounds, sizeof(double), by_value);
        if (k < floors && t[k * rounds + rounds / 2] < floor_time)
            floor_time = t[k * rounds + rounds / 2];
    }
    for (int k = 0; k < n; k++) {
        const double m = t[k * rounds + rounds / 2];
        printf("  %-46s %9.2f us  %4.0f%% of the floor\n", names[k], m * 1e6,
               100 * floor_time / m);
    }
    free(t);
}

/* ---- the batched decode ---------------------------------------------------------- */

enum { SEQS = 32, HEADS = 32, HEAD = 128, HALF = 64, OFF = 4 };
static float *q, *k;                    /* (SEQS, HEADS, HEAD) each, OFF floats past a line */
static float *cosr, *sinr;              /* one row per sequence, OFF floats past a line */
static double w[HALF];
static volatile float one = 1.0f;

static void *past_line(size_t bytes)
{
    char *p = aligned_alloc(64, bytes + 64);
    return p + OFF * sizeof(float);
}

/* each array from its first line boundary on, as the bench's floor passes go */
static void add_one(float *a, size_t n)
{
    const __m256 o = _mm256_set1_ps(one);
    size_t i = 0;
    for (; i < n && ((uintptr_t)(a + i) & 31); i++)
        a[i] += one;
    for (; i + 8 <= n; i += 8)
        _mm256_store_ps(a + i, _mm256_add_ps(_mm256_load_ps(a + i), o));
    for (; i < n; i++)
        a[i] += one;
}

static void decode_floor(void)
{
    add_one(q, (size_t)SEQS * HEADS * HEAD);
    add_one(k, (size_t)SEQS * HEADS * HEAD);
}

#define ROTATE(VT, LOAD, STORE, FMSUB, FMADD, MUL, j)                                  \
    do {                                                                               \
        const VT a_ = LOAD(a + (j)), b_ = LOAD(b + (j));                               \
        const VT c_ = LOAD(c + (j)), s_ = LOAD(s + (j));                               \
        STORE(a + (j), FMSUB(a_, c_, MUL(b_, s_)));                                    \
        STORE(b + (j), FMADD(b_, c_, MUL(a_, s_)));                                    \
    } while (0)
#define ROTATE8(j) ROTATE(__m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmsub_ps,   \
                          _mm256_fmadd_ps, _mm256_mul_ps, j)
#define ROTATE4(j) ROTATE(__m128, _mm_loadu_ps, _mm_storeu_ps, _mm_fmsub_ps,            \
                          _mm_fmadd_ps, _mm_mul_ps, j)

static inline void row_from_start(float *a, const float *c, const float *s)
{
    float *b = a + HALF;
    for (int j = 0; j < HALF; j += 8)
        ROTATE8(j);
}

static inline void row_from_line(float *a, const float *c, const float *s)
{
    float *b = a + HALF;
    ROTATE4(0);
    for (int j = 4; j < HALF - 4; j += 8)
        ROTATE8(j);
    ROTATE4(HALF - 4);
}

/* rows a and a2 at one offset from a line, each step of both by one load of c and s */
#define ROTATE_TWO(j, W, VT, LOAD, STORE, FMSUB, FMADD, MUL)                           \
    do {                                                                               \
        const VT c_ = LOAD(c + (j)), s_ = LOAD(s + (j));                               \
        for (int r_ = 0; r_ < 2; r_++) {                                               \
            float *x_ = r_ ? a2 : a, *y_ = x_ + HALF;                                  \
            const VT a_ = LOAD(x_ + (j)), b_ = LOAD(y_ + (j));                         \
            STORE(x_ + (j), FMSUB(a_, c_, MUL(b_, s_)));                               \
            STORE(y_ + (j), FMADD(b_, c_, MUL(a_, s_)));                               \
        }                                                                              \
    } while (0)

static inline void rows_from_line(float *a, float *a2, const float *c, const float *s)
{
    ROTATE_TWO(0, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, _mm_fmsub_ps, _mm_fmadd_ps,
               _mm_mul_ps);
    for (int j = 4; j < HALF - 4; j += 8)
        ROTATE_TWO(j, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_fmsub_ps,
                   _mm256_fmadd_ps, _mm256_mul_ps);
    ROTATE_TWO(HALF - 4, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, _mm_fmsub_ps, _mm_fmadd_ps,
               _mm_mul_ps);
}

static void sequence_angles(int t)
{
    double p = 1000.0 + 97.0 * t;
    fpe_sincos_f32(&p, 0, w, fpe_abs_max(w, HALF), sinr + t * (HALF + 16),
                   cosr + t * (HALF + 16), HALF, 1.0, 1.0);
}

/* head h of q and of k, a row at a time */
static inline void heads_from_start(float *a, float *a2, const float *c, const float *s)
{
    row_from_start(a, c, s);
    row_from_start(a2, c, s);
}

static inline void heads_from_line(float *a, float *a2, const float *c, const float *s)
{
    row_from_line(a, c, s);
    row_from_line(a2, c, s);
}

#define DECODE(name, HEADS_H, ANGLES)                                                  \
    static void name(void)                                                             \
    {                                                                                  \
        for (int t = 0; t < SEQS; t++) {                                               \
            if (ANGLES)                                                                \
                sequence_angles(t);                                                    \
            const float *c = cosr + t * (HALF + 16), *s = sinr + t * (HALF + 16);      \
            for (int h = 0; h < HEADS; h++)                                            \
                HEADS_H(q + (t * HEADS + h) * HEAD, k + (t * HEADS + h) * HEAD, c, s); \
        }                                                                              \
    }
DECODE(decode_from_start, heads_from_start, 0)
DECODE(decode_from_line, heads_from_line, 0)
DECODE(decode_with_angles, heads_from_line, 1)
DECODE(decode_shared, rows_from_line, 0)
DECODE(decode_shared_with_angles, rows_from_line, 1)

static void decode_angles_alone(void)
{
    for (int t = 0; t < SEQS; t++)
        sequence_angles(t);
}

/* ---- add_sinusoidal -------------------------------------------------------------- */

enum { BATCH = 8, TOKENS = 2048, DIM = 1024, NFREQ = DIM / 2, CHUNK = 256 };
static float *x;                        /* (BATCH, TOKENS, DIM) */
static float *pe;                       /* two chunks of rows */
static double freq[NFREQ], step_s[NFREQ], step_c[NFREQ], state_s[NFREQ], state_c[NFREQ];

/* rows t .. t + n - 1 (n even; t a multiple of 2) into out, as fastpe makes them */
static void make_rows(float *out, Py_ssize_t t, Py_ssize_t n)
{
    for (Py_ssize_t u = t; u < t + n; u += 2) {
        if (u % 32 == 0)   /* reseeded at the token before, the pair step then makes u */
            fpe_sincos_row((double)u - 1, freq, state_s, state_c, NFREQ, 1.0);
        fpe_pe_rows2_f32(state_s, state_c, step_s, step_c, out + (u - t) * DIM,
                         out + (u - t + 1) * DIM, DIM, NFREQ, 1.0, 0, NULL, NULL, 0, 0, 0,
                         1.0f);
    }
}

static void add_pair(Py_ssize_t b, Py_ssize_t t, const float *row)
{
    fpe_f32_madd_rows(x + (b * TOKENS + t) * DIM, 2, (Py_ssize_t)TOKENS * DIM, row, DIM,
                      1.0f, 0);
}

/* the in-place pass: plain, each line's successor 4 KiB on asked for first, or its
 * stores streamed past the caches (non-temporal) */
static void sinusoid_floor_plain(void)
{
    add_one(x, (size_t)BATCH * TOKENS * DIM);
}

static void sinusoid_floor_ahead(void)
{
    const __m256 o = _mm256_set1_ps(one);
    for (size_t i = 0; i < (size_t)BATCH * TOKENS * DIM; i += 16) {
        __builtin_prefetch(x + i + 1024, 1);
        _mm256_store_ps(x + i, _mm256_add_ps(_mm256_load_ps(x + i), o));
        _mm256_store_ps(x + i + 8, _mm256_add_ps(_mm256_load_ps(x + i + 8), o));
    }
}

static void sinusoid_floor_streamed(void)
{
    const __m256 o = _mm256_set1_ps(one);
    for (size_t i = 0; i < (size_t)BATCH * TOKENS * DIM; i += 8)
        _mm256_stream_ps(x + i, _mm256_add_ps(_mm256_load_ps(x + i), o));
    _mm_sfence();
}

static void sinusoid_made_alone(void)
{
    for (Py_ssize_t t0 = 0; t0 < TOKENS; t0 += CHUNK)
        make_rows(pe, t0, CHUNK);
}

static void sinusoid_added_alone(void)
{
    for (Py_ssize_t t0 = 0; t0 < TOKENS; t0 += CHUNK)
        for (Py_ssize_t b = 0; b < BATCH; b += 2)
            for (Py_ssize_t t = t0; t < t0 + CHUNK; t++)
                add_pair(b, t, pe + (t - t0) * DIM);
}

static void sinusoid_staged(void)
{
    for (Py_ssize_t t0 = 0; t0 < TOKENS; t0 += CHUNK) {
        make_rows(pe, t0, CHUNK);
        for (Py_ssize_t b = 0; b < BATCH; b += 2)
            for (Py_ssize_t t = t0; t < t0 + CHUNK; t++)
                add_pair(b, t, pe + (t - t0) * DIM);
    }
}

/* a pair of the next chunk's rows every (BATCH / 2) * CHUNK / (CHUNK / 2) = 8 rows added */
static void sinusoid_pipelined(void)
{
    const Py_ssize_t every = BATCH;
    make_rows(pe, 0, CHUNK);
    for (Py_ssize_t t0 = 0, c = 0; t0 < TOKENS; t0 += CHUNK, c ^= 1) {
        const float *rows = pe + c * CHUNK * DIM;
        float *next = pe + (c ^ 1) * CHUNK * DIM;
        Py_ssize_t made = 0, step = 0;
        for (Py_ssize_t b = 0; b < BATCH; b += 2)
            for (Py_ssize_t t = t0; t < t0 + CHUNK; t++) {
                add_pair(b, t, rows + (t - t0) * DIM);
                if (t0 + CHUNK < TOKENS && ++step % every == 0 && made < CHUNK) {
                    make_rows(next + made * DIM, t0 + CHUNK + made, 2);
                    made += 2;
                }
            }
        if (t0 + CHUNK < TOKENS && made < CHUNK)
            make_rows(next + made * DIM, t0 + CHUNK + made, CHUNK - made);
    }
}

/* 4 frequencies of the next pair of rows between every two lines added: the pair step
 * of fpe_pe_rows2_f32's 256-bit loop, the same operations */
static Py_ssize_t next_t, next_i, next_end, next_base;
static float *next_out;
static inline void make_some(void)
{
    if (next_t >= next_end)
        return;
    if (next_i == 0 && next_t % 32 == 0)
        fpe_sincos_row((double)next_t - 1, freq, state_s, state_c, NFREQ, 1.0);
    const Py_ssize_t i = next_i;
    float *pe0 = next_out + (next_t - next_base) * DIM, *pe1 = pe0 + DIM;
    const __m256d ss = _mm256_loadu_pd(step_s + i), sc = _mm256_loadu_pd(step_c + i);
    const __m256d s0 = _mm256_loadu_pd(state_s + i), c0 = _mm256_loadu_pd(state_c + i);
    const __m256d s1 = _mm256_fmadd_pd(s0, sc, _mm256_mul_pd(c0, ss));
    const __m256d c1 = _mm256_fmsub_pd(c0, sc, _mm256_mul_pd(s0, ss));
    const __m256d s2 = _mm256_fmadd_pd(s1, sc, _mm256_mul_pd(c1, ss));
    const __m256d c2 = _mm256_fmsub_pd(c1, sc, _mm256_mul_pd(s1, ss));
    _mm256_storeu_pd(state_s + i, s2);
    _mm256_storeu_pd(state_c + i, c2);
    const __m128 a1 = _mm256_cvtpd_ps(s1), b1 = _mm256_cvtpd_ps(c1);
    const __m128 a2 = _mm256_cvtpd_ps(s2), b2 = _mm256_cvtpd_ps(c2);
    _mm256_storeu_ps(pe0 + 2 * i, _mm256_set_m128(_mm_unpackhi_ps(a1, b1),
                                                  _mm_unpacklo_ps(a1, b1)));
    _mm256_storeu_ps(pe1 + 2 * i, _mm256_set_m128(_mm_unpackhi_ps(a2, b2),
                                                  _mm_unpacklo_ps(a2, b2)));
    next_i += 4;
    if (next_i == NFREQ) {
        next_i = 0;
        next_t += 2;
    }
}

static void sinusoid_interleaved(void)
{
    next_t = next_i = next_base = 0;
    next_end = CHUNK;
    next_out = pe;
    while (next_t < next_end)
        make_some();
    for (Py_ssize_t t0 = 0, c = 0; t0 < TOKENS; t0 += CHUNK, c ^= 1) {
        const float *rows = pe + c * CHUNK * DIM;
        next_out = pe + (c ^ 1) * CHUNK * DIM;
        next_base = t0 + CHUNK;
        next_end = t0 + 2 * CHUNK < TOKENS ? t0 + 2 * CHUNK : TOKENS;
        for (Py_ssize_t b = 0; b < BATCH; b += 2)
            for (Py_ssize_t t = t0; t < t0 + CHUNK; t++) {
                float *x0 = x + (b * TOKENS + t) * DIM, *x1 = x0 + (Py_ssize_t)TOKENS * DIM;
                const float *row = rows + (t - t0) * DIM;
                for (Py_ssize_t j = 0; j < DIM; j += 16) {
                    for (Py_ssize_t v = j; v < j + 16; v += 8) {
                        const __m256 r = _mm256_loadu_ps(row + v);
                        _mm256_storeu_ps(x0 + v, _mm256_add_ps(_mm256_loadu_ps(x0 + v), r));
                        _mm256_storeu_ps(x1 + v, _mm256_add_ps(_mm256_loadu_ps(x1 + v), r));
                    }
                    if (j % 64 == 48)
                        make_some();
                }
            }
        while (next_t < next_end)
            make_some();
    }
}

int main(void)
{
    srand(1);
    q = past_line(sizeof(float) * SEQS * HEADS * HEAD);
    k = past_line(sizeof(float) * SEQS * HEADS * HEAD);
    cosr = past_line(sizeof(float) * SEQS * (HALF + 16));
    sinr = past_line(sizeof(float) * SEQS * (HALF + 16));
    for (int i = 0; i < SEQS * HEADS * HEAD; i++) {
        q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    for (int j = 0; j < HALF; j++)
        w[j] = pow(10000.0, -j / (double)HALF);
    for (int t = 0; t < SEQS; t++)
        sequence_angles(t);
    static const char *const decode_names[] = {
        "in-place add (the floor)", "rows from their start, 256 bits a step",
        "rows from a line boundary", "the same with each sequence's angles",
        "q's and k's head h by one cos and sin load", "the same with each sequence's angles",
        "the angles alone"};
    static void (*const decode_loops[])(void) = {
        decode_floor, decode_from_start, decode_from_line, decode_with_angles,
        decode_shared, decode_shared_with_angles, decode_angles_alone};
    race("batched decode: q and k (32, 1, 32, 128) float32, in the caches", 7, 1, decode_names,
         decode_loops, 400, 20);

    /* on 2 MiB pages where the kernel gives them, as NumPy asks for its large arrays */
    const size_t x_bytes = sizeof(float) * (size_t)BATCH * TOKENS * DIM;
    x = aligned_alloc(2 << 20, x_bytes);
#ifdef MADV_HUGEPAGE
    madvise(x, x_bytes, MADV_HUGEPAGE);
#endif
    pe = aligned_alloc(64, sizeof(float) * 2 * CHUNK * DIM);
    for (size_t i = 0; i < (size_t)BATCH * TOKENS * DIM; i++)
        x[i] = (float)rand() / (float)RAND_MAX;
    for (int i = 0; i < NFREQ; i++) {
        freq[i] = pow(10000.0, -2.0 * i / DIM);
        step_s[i] = sin(freq[i]);
        step_c[i] = cos(freq[i]);
    }
    static const char *const sinusoid_names[] = {
        "in-place add (a floor)", "the same, 4 KiB ahead asked for (a floor)",
        "the same, stores streamed (a floor)", "rows made alone", "rows added alone (made before)",
        "made a chunk, then added (staged)", "made between runs of adds (pipelined)",
        "made between lines of adds (interleaved)"};
    static void (*const sinusoid_loops[])(void) = {
        sinusoid_floor_plain, sinusoid_floor_ahead, sinusoid_floor_streamed,
        sinusoid_made_alone, sinusoid_added_alone, sinusoid_staged,
        sinusoid_pipelined, sinusoid_interleaved};
    race("add_sinusoidal: x (8, 2048, 1024) float32, streamed from memory", 8, 3,
         sinusoid_names, sinusoid_loops, 30, 1);
    return 0;
}
