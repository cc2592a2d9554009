/* How close a float32 RoPE rotation in 128-bit SSE2 registers (the x86-64 baseline, all
 * that fastpe's baseline kernels may use) can come to the floor, whatever the kernel:
 * side by side in one process, one thread, the fastest of many rounds, each loop rotates
 * the same rows of 128 features (64 pairs, one cos and sin row for all, no angles to
 * form) in place, against the floor: the fastest in-place pass over the same bytes, in
 * 128-, 256- or 512-bit registers (the widest the CPU has), each line prefetched 4 KiB
 * ahead or not (the bench's floor forms).
 *
 *   batched decode   q and k of (32, 1, 32, 128): 1 MiB, in the caches
 *   prefill          q and k of (1, 2048, 32, 128): 64 MiB, streamed from memory
 *
 * Each pairing is timed in its cheapest form: rotate_half rows (x, y = a c - b s,
 * b c + a s: four multiplies and two adds per four pairs) and adjacent pairs (one
 * shuffle, two multiplies and an add per two pairs), each product rounded (SSE2 has no
 * fused multiply-add), the rows unrolled whole, and for the prefill with and without the
 * prefetch. The "128-bit pass" line is the floor's own pass in SSE2 registers: the bytes
 * moved by loads and stores of that width and nothing else.
 *
 * Where these stay short of a target, no baseline kernel reaches it on this CPU: the
 * rows in the caches are limited by the core (the multiplies share two vector ports),
 * and streamed rows by how many 128-bit loads and stores the core keeps in flight.
 * Build and run (x86-64; gcc or clang; every loop on a 64-byte block, as the kernels are
 * built):
 *
 *   cc -O2 -falign-loops=64 -o /tmp/sse2_bound bench/sse2_bound.c -lm && /tmp/sse2_bound
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HEAD = 128, HALF = 64, AHEAD = 4096 };
enum { DECODE_ROWS = 32 * 32 * 2, PREFILL_ROWS = 2048 * 32 * 2 };

static float cosr[HEAD], sinr[HEAD], cosp[HEAD], sinp[HEAD];
static volatile uint64_t floor_key = 0;

/* rotate_half rows: x[j], x[j + 64] */
static void rotate_half(float *x, long rows, int ahead)
{
    for (long r = 0; r < rows; r++) {
        float *a = x + r * HEAD, *b = a + HALF;
#pragma GCC unroll 16
        for (int j = 0; j < HALF; j += 4) {
            if (ahead && (j & 15) == 0) {
                __builtin_prefetch((char *)(a + j) + AHEAD, 1, 3);
                __builtin_prefetch((char *)(b + j) + AHEAD, 1, 3);
            }
            const __m128 va = _mm_loadu_ps(a + j), vb = _mm_loadu_ps(b + j);
            const __m128 c = _mm_loadu_ps(cosr + j), s = _mm_loadu_ps(sinr + j);
            _mm_storeu_ps(a + j, _mm_sub_ps(_mm_mul_ps(va, c), _mm_mul_ps(vb, s)));
            _mm_storeu_ps(b + j, _mm_add_ps(_mm_mul_ps(vb, c), _mm_mul_ps(va, s)));
        }
    }
}

/* adjacent pairs, with tables of one value per feature (cos repeated; -sin, sin) */
static void rotate_pairs(float *x, long rows, int ahead)
{
    for (long r = 0; r < rows; r++) {
        float *a = x + r * HEAD;
#pragma GCC unroll 32
        for (int j = 0; j < HEAD; j += 4) {
            if (ahead && (j & 15) == 0)
                __builtin_prefetch((char *)(a + j) + AHEAD, 1, 3);
            const __m128 v = _mm_loadu_ps(a + j);
            const __m128 w = _mm_shuffle_ps(v, v, 0xB1);
            _mm_storeu_ps(a + j, _mm_add_ps(_mm_mul_ps(v, _mm_loadu_ps(cosp + j)),
                                            _mm_mul_ps(w, _mm_loadu_ps(sinp + j))));
        }
    }
}

/* the floor: every 64-bit word read and written back, in place (XOR with a key of 0) */
static void pass128(void *p, size_t bytes, int ahead)
{
    const __m128i key = _mm_set1_epi64x((long long)floor_key);
    for (size_t i = 0; i < bytes; i += 64) {
        __m128i *w = (__m128i *)((char *)p + i);
        if (ahead)
            __builtin_prefetch((char *)w + AHEAD, 1, 3);
        for (int k = 0; k < 4; k++)
            _mm_store_si128(w + k, _mm_xor_si128(_mm_load_si128(w + k), key));
    }
}

__attribute__((target("avx2"))) static void pass256(void *p, size_t bytes, int ahead)
{
    const __m256i key = _mm256_set1_epi64x((long long)floor_key);
    for (size_t i = 0; i < bytes; i += 64) {
        __m256i *w = (__m256i *)((char *)p + i);
        if (ahead)
            __builtin_prefetch((char *)w + AHEAD, 1, 3);
        _mm256_store_si256(w, _mm256_xor_si256(_mm256_load_si256(w), key));
        _mm256_store_si256(w + 1, _mm256_xor_si256(_mm256_load_si256(w + 1), key));
    }
}

__attribute__((target("avx512f"))) static void pass512(void *p, size_t bytes, int ahead)
{
    const __m512i key = _mm512_set1_epi64((long long)floor_key);
    for (size_t i = 0; i < bytes; i += 64) {
        __m512i *w = (__m512i *)((char *)p + i);
        if (ahead)
            __builtin_prefetch((char *)w + AHEAD, 1, 3);
        _mm512_store_si512(w, _mm512_xor_si512(_mm512_load_si512(w), key));
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { HALF_ROWS, HALF_AHEAD, PAIRS_ROWS, PAIRS_AHEAD, P128, P128_AHEAD, PWIDE, PWIDE_AHEAD,
       KINDS };

/* the fastest of `rounds` rounds of `calls` calls of each kind, kinds in a rotated order */
static void measure(float *x, long rows, int rounds, int calls, double *best)
{
    const size_t bytes = (size_t)rows * HEAD * sizeof(float);
    const int w512 = __builtin_cpu_supports("avx512f"), w256 = __builtin_cpu_supports("avx2");
    for (int k = 0; k < KINDS; k++) best[k] = 1e9;
    for (int round = 0; round < rounds; round++) {
        for (int step = 0; step < KINDS; step++) {
            const int k = (step + round) % KINDS, ahead = k & 1;
            if (k >= PWIDE && !w512 && !w256) continue;
            const double t0 = now();
            for (int c = 0; c < calls; c++) {
                switch (k) {
                case HALF_ROWS: case HALF_AHEAD: rotate_half(x, rows, ahead); break;
                case PAIRS_ROWS: case PAIRS_AHEAD: rotate_pairs(x, rows, ahead); break;
                case P128: case P128_AHEAD: pass128(x, bytes, ahead); break;
                default:
                    if (w512) pass512(x, bytes, ahead);
                    else pass256(x, bytes, ahead);
                }
            }
            const double t = (now() - t0) / calls;
            if (t < best[k]) best[k] = t;
        }
    }
}

static void report(const char *what, const double *best)
{
    double floor = best[P128] < best[P128_AHEAD] ? best[P128] : best[P128_AHEAD];
    for (int k = PWIDE; k < KINDS; k++)
        if (best[k] < floor) floor = best[k];
    static const char *names[KINDS] = {
        "rotate_half", "rotate_half, prefetched", "adjacent pairs",
        "adjacent pairs, prefetched", "128-bit pass", "128-bit pass, prefetched",
        "widest pass", "widest pass, prefetched"};
    printf("%s: floor %.2f us\n", what, floor * 1e6);
    for (int k = 0; k < KINDS; k++)
        if (best[k] < 1e9)
            printf("  %-28s %10.2f us  %4.0f%% of the floor\n", names[k], best[k] * 1e6,
                   100 * floor / best[k]);
}

int main(void)
{
    const size_t n = (size_t)PREFILL_ROWS * HEAD;
    float *x = aligned_alloc(64, n * sizeof(float));
    double best[KINDS];
    srand(1);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int j = 0; j < HALF; j++) {
        const float c = cosf(0.37f * (float)j), s = sinf(0.37f * (float)j);
        cosr[j] = c;
        sinr[j] = s;
        cosp[2 * j] = cosp[2 * j + 1] = c;
        sinp[2 * j] = -s;
        sinp[2 * j + 1] = s;
    }
    /* the rotations never grow a value much: x stays finite over every round */
    printf("float32 rows of 128 features, one thread, fastest of the rounds; SSE2 rotations\n");
    measure(x, DECODE_ROWS, 300, 20, best);
    report("batched decode (32, 1, 32, 128) x2, 1 MiB in the caches", best);
    measure(x, PREFILL_ROWS, 15, 2, best);
    report("prefill (1, 2048, 32, 128) x2, 64 MiB from memory", best);
    return 0;
}
