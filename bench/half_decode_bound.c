/* How close a half-precision RoPE rotation can come to the floor where its rows sit in
 * the caches (the bench's batched decode: q and k of (32, 1, 32, 128), 512 KiB in
 * float16 or bfloat16), whatever the kernel: side by side in one process, one thread,
 * the fastest of many rounds, each loop rotates the same rotate_half rows (64 pairs of
 * 128 features per head row, one cos and sin row for all) in 512-bit registers in
 * float32, with the conversions it names, against the floor (the bench's in-place pass
 * over the same bytes) and against float32 rows of the same shape over their own floor.
 *
 *   float16             F16C widening and narrowing (VCVTPH2PS / VCVTPS2PH): exact,
 *                       the only conversions there are
 *   bfloat16 integer    widening by shifts, rounding to nearest even in integers
 *   bfloat16 hardware   VCVTNE2PS2BF16, a vector with a zero rounded again in integers
 *                       (what fastpe's avx512 kernels do on CPUs with AVX512_BF16)
 *   bfloat16 truncated  no rounding at all, the top halves taken: wrong, a bound only
 *   bfloat16 split      no rounding, and even and odd elements taken apart by a shift
 *                       and a mask, the fewest operations any float32 rotation of
 *                       bfloat16 rows can do: a bound only
 *
 * Where even the bounds stay short of float32's fraction / 1.2, no bfloat16 kernel
 * computing in float32 gets there: the rows are in the caches, so the floor runs at
 * cache speed, and the conversions and the rotation's multiplies share the core's two
 * 512-bit ports. Build and run (an AVX-512 CPU; AVX512_BF16 for the hardware row; every
 * loop on a 64-byte block, as the kernels are built: on an AMD Zen 4 the half-precision
 * floor's pass straddling two took 1.9x the time):
 *
 *   cc -O2 -falign-loops=64 -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mf16c \
 *      -o /tmp/half_decode_bound bench/half_decode_bound.c -lm && /tmp/half_decode_bound
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROWS = 32 * 32 * 2, HEAD = 128, HALF = 64, ROUNDS = 300, CALLS = 20 };

static float cosr[HALF], sinr[HALF];
static volatile uint64_t floor_key = 0x0001000100010001ull;

/* float32 rows */
static void rotate_f32(float *x)
{
    for (long r = 0; r < ROWS; r++) {
        float *a = x + r * HEAD, *b = a + HALF;
        for (int j = 0; j < HALF; j += 16) {
            const __m512 va = _mm512_loadu_ps(a + j), vb = _mm512_loadu_ps(b + j);
            const __m512 c = _mm512_loadu_ps(cosr + j), s = _mm512_loadu_ps(sinr + j);
            _mm512_storeu_ps(a + j, _mm512_fmsub_ps(va, c, _mm512_mul_ps(vb, s)));
            _mm512_storeu_ps(b + j, _mm512_fmadd_ps(vb, c, _mm512_mul_ps(va, s)));
        }
    }
}

/* float16 rows */
static void rotate_f16(uint16_t *x)
{
    for (long r = 0; r < ROWS; r++) {
        uint16_t *a = x + r * HEAD, *b = a + HALF;
        for (int j = 0; j < HALF; j += 16) {
            const __m512 va = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + j)));
            const __m512 vb = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + j)));
            const __m512 c = _mm512_loadu_ps(cosr + j), s = _mm512_loadu_ps(sinr + j);
            _mm256_storeu_si256((__m256i *)(a + j),
                                _mm512_cvtps_ph(_mm512_fmsub_ps(va, c, _mm512_mul_ps(vb, s)),
                                                _MM_FROUND_TO_NEAREST_INT));
            _mm256_storeu_si256((__m256i *)(b + j),
                                _mm512_cvtps_ph(_mm512_fmadd_ps(vb, c, _mm512_mul_ps(va, s)),
                                                _MM_FROUND_TO_NEAREST_INT));
        }
    }
}

/* bfloat16: 32 elements in element order, and the narrowings back */
static inline void bf16_widen(const uint16_t *p, __m512 *lo, __m512 *hi)
{
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    *hi = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 16))), 16));
}

static const uint16_t top_halves[32] = {
    1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

static inline __m512i round_high(__m512 v)
{
    const __m512i x = _mm512_castps_si512(v);
    const __mmask16 odd = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x10000));
    const __m512i y = _mm512_add_epi32(x, _mm512_set1_epi32(0x7fff));
    return _mm512_mask_add_epi32(y, odd, y, _mm512_set1_epi32(1));
}

static inline __m512i narrow_integer(__m512 lo, __m512 hi)
{
    return _mm512_permutex2var_epi16(round_high(lo), _mm512_loadu_si512(top_halves),
                                     round_high(hi));
}

static inline __m512i narrow_truncated(__m512 lo, __m512 hi)
{
    return _mm512_permutex2var_epi16(_mm512_castps_si512(lo), _mm512_loadu_si512(top_halves),
                                     _mm512_castps_si512(hi));
}

__attribute__((target("avx512bf16"))) static inline __m512i narrow_hardware(__m512 lo,
                                                                           __m512 hi)
{
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (_mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7fff)))
        return narrow_integer(lo, hi);
    return v;
}

#define ROTATE_BF16(name, narrow, attr)                                                  \
    attr static void name(uint16_t *x)                                                   \
    {                                                                                    \
        for (long r = 0; r < ROWS; r++) {                                                \
            uint16_t *a = x + r * HEAD, *b = a + HALF;                                   \
            for (int j = 0; j < HALF; j += 32) {                                         \
                __m512 a0, a1, b0, b1;                                                   \
                bf16_widen(a + j, &a0, &a1);                                             \
                bf16_widen(b + j, &b0, &b1);                                             \
                const __m512 c0 = _mm512_loadu_ps(cosr + j), c1 = _mm512_loadu_ps(cosr + j + 16); \
                const __m512 s0 = _mm512_loadu_ps(sinr + j), s1 = _mm512_loadu_ps(sinr + j + 16); \
                _mm512_storeu_si512(a + j, narrow(_mm512_fmsub_ps(a0, c0, _mm512_mul_ps(b0, s0)), \
                                                  _mm512_fmsub_ps(a1, c1, _mm512_mul_ps(b1, s1)))); \
                _mm512_storeu_si512(b + j, narrow(_mm512_fmadd_ps(b0, c0, _mm512_mul_ps(a0, s0)), \
                                                  _mm512_fmadd_ps(b1, c1, _mm512_mul_ps(a1, s1)))); \
            }                                                                            \
        }                                                                                \
    }

ROTATE_BF16(rotate_bf16_integer, narrow_integer, )
ROTATE_BF16(rotate_bf16_hardware, narrow_hardware, __attribute__((target("avx512bf16"))))
ROTATE_BF16(rotate_bf16_truncated, narrow_truncated, )

/* even elements by a shift, odd ones by a mask, and back by a shift and a blend */
static void rotate_bf16_split(uint16_t *x)
{
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (long r = 0; r < ROWS; r++) {
        uint16_t *a = x + r * HEAD, *b = a + HALF;
        for (int j = 0; j < HALF; j += 32) {
            const __m512i va = _mm512_loadu_si512(a + j), vb = _mm512_loadu_si512(b + j);
            const __m512 ae = _mm512_castsi512_ps(_mm512_slli_epi32(va, 16));
            const __m512 ao = _mm512_castsi512_ps(_mm512_and_si512(va, top));
            const __m512 be = _mm512_castsi512_ps(_mm512_slli_epi32(vb, 16));
            const __m512 bo = _mm512_castsi512_ps(_mm512_and_si512(vb, top));
            const __m512 c = _mm512_loadu_ps(cosr + j), s = _mm512_loadu_ps(sinr + j);
            const __m512 c2 = _mm512_loadu_ps(cosr + j + 16), s2 = _mm512_loadu_ps(sinr + j + 16);
            const __m512i xe = _mm512_castps_si512(_mm512_fmsub_ps(ae, c, _mm512_mul_ps(be, s)));
            const __m512i xo = _mm512_castps_si512(_mm512_fmsub_ps(ao, c2, _mm512_mul_ps(bo, s2)));
            const __m512i ye = _mm512_castps_si512(_mm512_fmadd_ps(be, c, _mm512_mul_ps(ae, s)));
            const __m512i yo = _mm512_castps_si512(_mm512_fmadd_ps(bo, c2, _mm512_mul_ps(ao, s2)));
            _mm512_storeu_si512(a + j, _mm512_ternarylogic_epi32(_mm512_srli_epi32(xe, 16), xo, top, 0xf8));
            _mm512_storeu_si512(b + j, _mm512_ternarylogic_epi32(_mm512_srli_epi32(ye, 16), yo, top, 0xf8));
        }
    }
}

/* the floor: every 64-bit word of the rows read and written back changed, in place */
static void floor_pass(void *p, size_t bytes)
{
    const __m256i key = _mm256_set1_epi64x((long long)floor_key);
    for (size_t i = 0; i < bytes; i += 32) {
        __m256i *w = (__m256i *)((char *)p + i);
        _mm256_store_si256(w, _mm256_xor_si256(_mm256_load_si256(w), key));
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { F32, F32_FLOOR, F16, BF16_INTEGER, BF16_HARDWARE, BF16_TRUNCATED, BF16_SPLIT,
       HALF_FLOOR, KINDS };

int main(void)
{
    const size_t n = (size_t)ROWS * HEAD;
    float *x32 = aligned_alloc(64, n * 4);
    uint16_t *x16 = aligned_alloc(64, n * 2);
    int hardware = __builtin_cpu_supports("avx512bf16");
    srand(1);
    for (size_t i = 0; i < n; i++) {
        x32[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        uint32_t u;
        memcpy(&u, &x32[i], 4);
        x16[i] = (uint16_t)(u >> 16);   /* a bfloat16, and as a float16 a finite value */
        if ((x16[i] & 0x7c00) == 0x7c00) x16[i] &= 0x83ff;
    }
    for (int j = 0; j < HALF; j++) {
        cosr[j] = cosf(0.37f * (float)j);
        sinr[j] = sinf(0.37f * (float)j);
    }
    double best[KINDS];
    for (int k = 0; k < KINDS; k++) best[k] = 1e9;
    for (int round = 0; round < ROUNDS; round++) {
        for (int step = 0; step < KINDS; step++) {
            const int k = (step + round) % KINDS;   /* rotated order each round */
            if (k == BF16_HARDWARE && !hardware) continue;
            const double t0 = now();
            for (int c = 0; c < CALLS; c++) {
                switch (k) {
                case F32: rotate_f32(x32); break;
                case F32_FLOOR: floor_pass(x32, n * 4); break;
                case F16: rotate_f16(x16); break;
                case BF16_INTEGER: rotate_bf16_integer(x16); break;
                case BF16_HARDWARE: rotate_bf16_hardware(x16); break;
                case BF16_TRUNCATED: rotate_bf16_truncated(x16); break;
                case BF16_SPLIT: rotate_bf16_split(x16); break;
                default: floor_pass(x16, n * 2); break;
                }
            }
            const double t = (now() - t0) / CALLS;
            if (t < best[k]) best[k] = t;
        }
    }
    static const char *names[KINDS] = {
        "float32", "", "float16", "bfloat16 integer", "bfloat16 hardware",
        "bfloat16 truncated (bound)", "bfloat16 split (bound)", ""};
    printf("rotate_half rows (32, 1, 32, 128) x2, in the caches; fastest of %d rounds\n", ROUNDS);
    printf("%-28s %9.2f us  %4.0f%% of its floor (%.2f us)\n", names[F32], best[F32] * 1e6,
           100 * best[F32_FLOOR] / best[F32], best[F32_FLOOR] * 1e6);
    for (int k = F16; k < HALF_FLOOR; k++) {
        if (k == BF16_HARDWARE && !hardware) continue;
        printf("%-28s %9.2f us  %4.0f%% of its floor (%.2f us)\n", names[k], best[k] * 1e6,
               100 * best[HALF_FLOOR] / best[k], best[HALF_FLOOR] * 1e6);
    }
    printf("float32's fraction / 1.2: %.0f%%\n", 100 * best[F32_FLOOR] / best[F32] / 1.2);
    return 0;
}
