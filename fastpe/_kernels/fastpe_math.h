/*
 * Scalar helpers for the kernels in kernels.pyx: half and bfloat16
 * conversions, and a vectorisable double-precision sin/cos of a row of angles.
 *
 * Everything here is static inline so that each ISA variant of the extension
 * (kernels_baseline, kernels_avx2, kernels_avx512) compiles it with its own
 * instruction set and the loops that call it vectorise.
 */
#ifndef FASTPE_MATH_H
#define FASTPE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(_MSC_VER)
#include <intrin.h>
#elif defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* GCC's loop analysis cannot bound a row's feature count through the clones it makes of
 * the Cython callers, and warns that a scalar tail's iteration near PTRDIFF_MAX would
 * overflow its pointer; every count reaching these loops is a row's, checked by its
 * entry against the array it was given. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
#endif

#ifndef FASTPE_ISA
#define FASTPE_ISA "baseline"
#endif
#ifndef FASTPE_COMPILE_FLAGS
#define FASTPE_COMPILE_FLAGS ""
#endif

/* Storage types the Cython fused types tell apart: 16-bit patterns, not numbers. */
typedef struct { uint16_t bits; } fpe_f16;
typedef struct { uint16_t bits; } fpe_bf16;

/* A software prefetch, for writing (for reading), of the line `ahead` bytes past p: the
 * address is formed as an integer, so it may lie past the array (a prefetch never
 * faults). The row adds below take the next token's rows so (fpe_f32_madd_rows says
 * what it measured); half-precision RoPE rows streamed from memory read ahead
 * (fpe_prefetch_lines, below). */
#if defined(__GNUC__) || defined(__clang__)
#define FPE_PREFETCH_AHEAD(p, ahead)                                                   \
    __builtin_prefetch((const void *)((uintptr_t)(p) + (uintptr_t)(ahead)), 1, 3)
#define FPE_PREFETCH_READ_AHEAD(p, ahead)                                              \
    __builtin_prefetch((const void *)((uintptr_t)(p) + (uintptr_t)(ahead)), 0, 3)
#else
#define FPE_PREFETCH_AHEAD(p, ahead) ((void)(p), (void)(ahead))
#define FPE_PREFETCH_READ_AHEAD(p, ahead) ((void)(p), (void)(ahead))
#endif

static inline uint32_t fpe_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fpe_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- IEEE half ------------------------------------------------------------
 * With F16C (the avx2 variant) or on AArch64 the compiler's own
 * _Float16 conversions become single vector instructions. Elsewhere a
 * branch-free software conversion, round-to-nearest-even like the hardware.
 */
#if defined(__FLT16_MANT_DIG__) && (defined(__F16C__) || defined(__aarch64__))
#define FPE_HALF_NATIVE 1
static inline float fpe_f16_load(fpe_f16 h) { _Float16 v; memcpy(&v, &h.bits, 2); return (float)v; }
static inline fpe_f16 fpe_f16_make(float f) { _Float16 v = (_Float16)f; fpe_f16 h; memcpy(&h.bits, &v, 2); return h; }
#else
#define FPE_HALF_NATIVE 0
static inline float fpe_f16_load(fpe_f16 h)
{
    uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    uint32_t em = h.bits & 0x7fffu;
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    uint32_t infnan = (em << 13) | 0x7f800000u;
    /* subnormal halves are exact multiples of 2^-24 */
    uint32_t sub = fpe_f32_bits((float)em * 5.9604644775390625e-08f);
    uint32_t mag = em >= 0x7c00u ? infnan : (em >= 0x0400u ? normal : sub);
    return fpe_bits_f32(sign | mag);
}

static inline fpe_f16 fpe_f16_make(float f)
{
    uint32_t x = fpe_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* |f| >= 65536 (or inf/nan): inf, or a quiet nan */
    uint32_t big = ax > 0x7f800000u ? 0x7e00u : 0x7c00u;
    /* |f| < 2^-14: adding 0.5 puts the half's subnormal ulp (2^-24) in the
     * float's last mantissa bit, so the FPU does the rounding */
    uint32_t tiny = fpe_f32_bits(fpe_bits_f32(ax) + 0.5f) - 0x3f000000u;
    /* normal: rebias the exponent, round to nearest even on the 13 dropped bits */
    uint32_t normal = (ax + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    uint32_t mag = ax >= 0x47800000u ? big : (ax < 0x38800000u ? tiny : normal);
    fpe_f16 h;
    h.bits = (uint16_t)(sign | mag);
    return h;
}
#endif

/* The rotations and the add steps below are inlined into every row loop that calls them,
 * whatever the compiler's size heuristics say: a call per row is not hidden by memory
 * when the rows are in cache (a batched decode). */
#if defined(__GNUC__) || defined(__clang__)
#define FPE_ALWAYS_INLINE inline __attribute__((always_inline))
#define FPE_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define FPE_ALWAYS_INLINE __forceinline
#define FPE_NOINLINE __declspec(noinline)
#else
#define FPE_ALWAYS_INLINE inline
#define FPE_NOINLINE
#endif

/* every line of [p + ahead, p + ahead + nbytes) asked for, for writing (write) or for
 * reading: a row about to be written, or rows ahead of the one being read (`write` is a
 * constant where it is called, so the branch folds away) */
static FPE_ALWAYS_INLINE void fpe_prefetch_lines(const void *p, Py_ssize_t ahead,
                                                 Py_ssize_t nbytes, int write)
{
    for (Py_ssize_t i = 0; i < nbytes; i += 64) {
        if (write)
            FPE_PREFETCH_AHEAD(p, ahead + i);
        else
            FPE_PREFETCH_READ_AHEAD(p, ahead + i);
    }
}

/* A streamed table's rows (row_bytes apart, this one at `row`) off line boundaries: the
 * line each row ends in is shared with the next row and written with plain stores.
 * Those lines of this row and the next three, asked for, for writing (fpe_pe_rows2_f32
 * says why); nothing for rows on line boundaries. */
static FPE_ALWAYS_INLINE void fpe_prefetch_row_ends(const void *row, Py_ssize_t row_bytes)
{
    if (((uintptr_t)row | (uintptr_t)row_bytes) & 63)
        for (int k = 1; k <= 4; k++)
            FPE_PREFETCH_AHEAD(row, k * row_bytes);
}

/* ---- bfloat16: the top half of a float ----------------------------------- */
static inline float fpe_bf16_load(fpe_bf16 h) { return fpe_bits_f32((uint32_t)h.bits << 16); }

static inline fpe_bf16 fpe_bf16_make(float f)
{
    uint32_t x = fpe_f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    fpe_bf16 h;
    h.bits = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    return h;
}

/* The vector roundings of bfloat16 rows (fpe_bf16x8_bits, fpe_bf16x16_bits_high) take a
 * NaN result's low 16 bits to be zero, as they are where every operand is a widened
 * bfloat16 or a finite float32; a caller's cos and sin cache may hold NaNs with payload
 * there (float32, float16 widened, float64 narrowed), which the rounding bias would carry
 * into the sign or the next NaN (a -0 or 0x7fc2 for 0x7fc1). Before such rows rotate
 * bfloat16 ones, their NaNs keep the top 16 bits and the quiet bit only: the bfloat16
 * that fpe_bf16_make makes of the result is the same, and the roundings are exact again. */
static inline void fpe_f32_nan_tops(float *v, Py_ssize_t n)
{
    uint32_t *u = (uint32_t *)v;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((u[i] & 0x7fffffffu) > 0x7f800000u)
            u[i] = (u[i] & 0xffff0000u) | 0x00400000u;
}

/* ---- whole runs of elements ----------------------------------------------
 * The element conversions above go one at a time through a struct, which
 * GCC does not vectorise; these loops over runs do: F16C converts 8 halves
 * per instruction, and the bfloat16 bit operations vectorise as integer code.
 * Both round to nearest even, like the element functions.
 */
#if defined(__F16C__) && defined(__AVX__) && (defined(__x86_64__) || defined(__i386__))
#define FPE_F16C_RUNS 1
#else
#define FPE_F16C_RUNS 0
#endif

static inline void fpe_f16_run_load(const fpe_f16 *src, float *dst, Py_ssize_t n)
{
    Py_ssize_t j = 0;
#if FPE_F16C_RUNS
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
#endif
    for (; j < n; j++)
        dst[j] = fpe_f16_load(src[j]);
}

static inline void fpe_f16_run_store(const float *src, fpe_f16 *dst, Py_ssize_t n)
{
    Py_ssize_t j = 0;
#if FPE_F16C_RUNS
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(dst + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; j++)
        dst[j] = fpe_f16_make(src[j]);
}

static inline void fpe_bf16_run_load(const fpe_bf16 *src, float *dst, Py_ssize_t n)
{
    const uint16_t *s = (const uint16_t *)src;
    uint32_t *d = (uint32_t *)dst;
    for (Py_ssize_t j = 0; j < n; j++)
        d[j] = (uint32_t)s[j] << 16;
}

static inline void fpe_bf16_run_store(const float *src, fpe_bf16 *dst, Py_ssize_t n)
{
    const uint32_t *s = (const uint32_t *)src;
    uint16_t *d = (uint16_t *)dst;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint32_t x = s[j];
        uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        uint32_t quiet_nan = (x >> 16) | 0x40u;
        d[j] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
}

/* ---- adds on half and bfloat16 runs, in one pass ---------------------------
 * x[j] = x[j] + t[j] and x[j] = x[j] * scale + pe[j] in float32, rounding once,
 * 8 or 16 elements at a time widened, computed and narrowed in registers: the
 * gather / compute / scatter through a float32 stack buffer makes three passes
 * over every chunk instead of one. The multiply-add is fused in the avx2 and avx512
 * variants (GCC contracts the chunked loop's a * b + c there too: the same bits either
 * way).
 * Without AVX2 (the baseline variant) only the float16 add has a run loop here;
 * the others keep the chunked loops, whose conversions SSE2 vectorises.
 */
#if FPE_F16C_RUNS && defined(__AVX2__) && defined(__FMA__)
#define FPE_HALF_ADD_RUNS 1
#define FPE_MADD_F(a, b, c) fmaf((a), (b), (c))

/* 16 bfloat16s to float32: each 16-bit pattern becomes the top of a 32-bit one.
 * The in-lane unpacks leave elements 0-3, 8-11 in *lo and 4-7, 12-15 in *hi, the
 * order fpe_bf16x16_store's in-lane pack puts back. */
static inline void fpe_bf16x16_load(const fpe_bf16 *p, __m256 *lo, __m256 *hi)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)p), zero = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

/* 16 float32s in that order, from memory: 128-bit halves put in place */
static inline void fpe_f32x16_load_unpacked(const float *p, __m256 *lo, __m256 *hi)
{
    *lo = _mm256_set_m128(_mm_loadu_ps(p + 8), _mm_loadu_ps(p));
    *hi = _mm256_set_m128(_mm_loadu_ps(p + 12), _mm_loadu_ps(p + 4));
}

/* float32 results of these adds to bfloat16 bit patterns (in 32-bit lanes), bit for bit
 * fpe_bf16_make on every number: round to nearest even on the 16 dropped bits (past the
 * largest finite value that carries into inf). NaNs need no test of their own here: every
 * operand of these adds is a widened bfloat16 (its low 16 bits zero) or a finite float32
 * (PE, scale), and an x86 add or fused multiply-add whose result is NaN returns an
 * operand's NaN, quieted (bit 22 set, the low bits kept), or the default NaN 0xffc00000:
 * the low 16 bits of a NaN result are zero, so the rounding bias (at most 0x8000) cannot
 * carry out of them, and the NaN keeps its sign and top payload bits with the quiet bit
 * set, what fpe_bf16_make gives. */
static inline __m256i fpe_bf16x8_bits(__m256 v)
{
    const __m256i x = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)),
                                              odd), 16);
}

/* every pattern is below 2^16, so the unsigned saturating pack is exact */
static inline __m256i fpe_bf16x16_bits(__m256 lo, __m256 hi)
{
    return _mm256_packus_epi32(fpe_bf16x8_bits(lo), fpe_bf16x8_bits(hi));
}

static inline void fpe_bf16x16_store(fpe_bf16 *p, __m256 lo, __m256 hi)
{
    _mm256_storeu_si256((__m256i *)p, fpe_bf16x16_bits(lo, hi));
}

/* 8 bfloat16s to float32 in their own order: each one's bits the top half of its lane */
static inline __m256 fpe_bf16x8_widen(const fpe_bf16 *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* 16 bfloat16s to float32 in their own order (elements 0-7 in *lo, 8-15 in *hi), and
 * back: what RoPE rows load with cos and sin rows as they are, where the in-lane order
 * above has every cos and sin vector put in that order too (two shuffles each) */
static inline void fpe_bf16x16_load_inorder(const fpe_bf16 *p, __m256 *lo, __m256 *hi)
{
    *lo = fpe_bf16x8_widen(p);
    *hi = fpe_bf16x8_widen(p + 8);
}

static inline void fpe_bf16x16_store_inorder(fpe_bf16 *p, __m256 lo, __m256 hi)
{
    /* the in-lane pack leaves 64-bit quarters lo 0-3, hi 0-3, lo 4-7, hi 4-7 */
    _mm256_storeu_si256((__m256i *)p, _mm256_permute4x64_epi64(fpe_bf16x16_bits(lo, hi), 0xD8));
}

/* AVX512_BF16 (Intel from Cooper Lake and Sapphire Rapids, AMD from Zen 4) narrows 16
 * or 32 float32s to bfloat16 in one instruction, VCVTNE2PS2BF16, where the rounding
 * above takes seven per 32 (avx512) or twelve per 16 (avx2): the bfloat16 rows of a
 * batched decode, in the caches, are bound by the core's vector ports, not by memory.
 * It rounds to nearest even and quiets NaNs as fpe_bf16_make does, but reads a
 * subnormal float32 as zero (DAZ), whatever MXCSR says: a zero it gives (of either
 * sign) may stand for a subnormal that fpe_bf16_make keeps, so a vector with any zero
 * takes the rounding above instead, the same bits on every element. Compiled for these
 * functions alone (a target attribute; GCC 10 and clang 9 have the instruction), in
 * both wide variants (AMD's Zen 4 has it and runs avx2 by default), run only where
 * CPUID reports it with the AVX-512 state saved (fpe_bf16_cvt, set at import;
 * kernels.pyx bf16_hardware_narrowing). */
#if (defined(__clang__) && __clang_major__ >= 9) || \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10)
#define FPE_BF16_CVT 1
#define FPE_TARGET_BF16 __attribute__((target("avx512bf16,avx512vl,avx512bw")))
static int fpe_bf16_cvt = 0;

FPE_TARGET_BF16 static inline void fpe_bf16x16_store_inorder_cvt(fpe_bf16 *p, __m256 lo,
                                                                 __m256 hi)
{
    const __m256i v = (__m256i)_mm256_cvtne2ps_pbh(hi, lo);
    if (__builtin_expect(_mm256_testn_epi16_mask(v, _mm256_set1_epi16(0x7fff)) != 0, 0))
        fpe_bf16x16_store_inorder(p, lo, hi);
    else
        _mm256_storeu_si256((__m256i *)p, v);
}

/* The same in the order fpe_bf16x16_load and fpe_bf16x32_load took the elements apart
 * (the adds' and ALiBi's): the instruction gives the 64-bit quarters of lo, then those
 * of hi, and one permutation interleaves them; under a mask only the elements it keeps
 * are checked. The bit patterns, for stores of any kind. */
FPE_TARGET_BF16 static inline __m256i fpe_bf16x16_bits_cvt(__m256 lo, __m256 hi)
{
    const __m256i v = _mm256_permute4x64_epi64((__m256i)_mm256_cvtne2ps_pbh(hi, lo), 0xD8);
    if (__builtin_expect(_mm256_testn_epi16_mask(v, _mm256_set1_epi16(0x7fff)) != 0, 0))
        return fpe_bf16x16_bits(lo, hi);
    return v;
}

FPE_TARGET_BF16 static inline void fpe_bf16x16_store_cvt(fpe_bf16 *p, __m256 lo, __m256 hi)
{
    _mm256_storeu_si256((__m256i *)p, fpe_bf16x16_bits_cvt(lo, hi));
}

/* the adds' stores, `cvt` a constant where inlined (RoPE's: FPE_BF16X16_STORE_INORDER) */
#define FPE_BF16X16_STORE(cvt, p, lo, hi)                                              \
    do {                                                                               \
        if (cvt) fpe_bf16x16_store_cvt(p, lo, hi);                                     \
        else fpe_bf16x16_store(p, lo, hi);                                             \
    } while (0)
#define FPE_BF16X32_STORE(cvt, p, m, lo, hi)                                           \
    do {                                                                               \
        if (cvt) fpe_bf16x32_store_cvt(p, m, lo, hi);                                  \
        else fpe_bf16x32_store(p, m, lo, hi);                                          \
    } while (0)
#define FPE_BF16X16_BITS(cvt, lo, hi)                                                  \
    ((cvt) ? fpe_bf16x16_bits_cvt(lo, hi) : fpe_bf16x16_bits(lo, hi))
#define FPE_BF16X32_BITS(cvt, lo, hi)                                                  \
    ((cvt) ? fpe_bf16x32_bits_cvt(lo, hi, 0xffffffffu) : fpe_bf16x32_bits(lo, hi))
#else
#define FPE_BF16_CVT 0
#define FPE_BF16X16_STORE(cvt, p, lo, hi) fpe_bf16x16_store(p, lo, hi)
#define FPE_BF16X32_STORE(cvt, p, m, lo, hi) fpe_bf16x32_store(p, m, lo, hi)
#define FPE_BF16X16_BITS(cvt, lo, hi) fpe_bf16x16_bits(lo, hi)
#define FPE_BF16X32_BITS(cvt, lo, hi) fpe_bf16x32_bits(lo, hi)
#endif

static inline __m256 fpe_f16x8_load(const fpe_f16 *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void fpe_f16x8_store(fpe_f16 *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* The avx512 variant does the same 16 or 32 elements at a time in 512-bit registers,
 * and the last n % 16 (n % 32) of a row under a mask instead of one at a time (masked
 * loads do not touch the elements masked off): the same operations on every element,
 * so the same bits as the 256-bit and scalar loops. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define FPE_HALF_RUNS_512 1

static inline __mmask16 fpe_mask16(Py_ssize_t n) { return (__mmask16)((1u << n) - 1u); }
static inline __mmask32 fpe_mask32(Py_ssize_t n) { return (__mmask32)((1ull << n) - 1u); }

/* (All-ones masks, the loops' bodies, take plain loads and stores: masked stores are slow
 * on some CPUs, AMD Zen 4 among them. The masks are constants there, so the tests fold.) */
static inline __m512 fpe_f16x16_load(const fpe_f16 *p, __mmask16 m)
{
    return _mm512_cvtph_ps(m == 0xffff ? _mm256_loadu_si256((const __m256i *)p)
                                       : _mm256_maskz_loadu_epi16(m, p));
}

static inline void fpe_f16x16_store(fpe_f16 *p, __mmask16 m, __m512 v)
{
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    if (m == 0xffff)
        _mm256_storeu_si256((__m256i *)p, h);
    else
        _mm256_mask_storeu_epi16(p, m, h);
}

/* 32 bfloat16s to float32, as fpe_bf16x16_load in each 128-bit lane: elements 8k..8k+3
 * of lane k in *lo, 8k+4..8k+7 in *hi */
static inline void fpe_bf16x32_load(const fpe_bf16 *p, __mmask32 m, __m512 *lo, __m512 *hi)
{
    const __m512i v = m == 0xffffffffu ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
    const __m512i zero = _mm512_setzero_si512();
    *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
    *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
}

/* 32 float32s in that order: two 16-float loads, each output picking its quarters */
static inline void fpe_f32x32_load_unpacked(const float *p, __mmask32 m, __m512 *lo,
                                            __m512 *hi)
{
    const __m512 a = m == 0xffffffffu ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)m, p);
    const __m512 b = m == 0xffffffffu ? _mm512_loadu_ps(p + 16)
                                      : _mm512_maskz_loadu_ps((__mmask16)(m >> 16), p + 16);
    const __m512i ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i ihi = _mm512_add_epi32(ilo, _mm512_set1_epi32(4));
    *lo = _mm512_permutex2var_ps(a, ilo, b);
    *hi = _mm512_permutex2var_ps(a, ihi, b);
}

/* fpe_bf16x8_bits in 512 bits (the same reasoning about NaNs) before its shift: the
 * pattern in the top 16 bits of each lane; the odd ones get their + 1 under a mask */
static inline __m512i fpe_bf16x16_bits_high(__m512 v)
{
    const __m512i x = _mm512_castps_si512(v);
    const __mmask16 odd = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x10000));
    const __m512i y = _mm512_add_epi32(x, _mm512_set1_epi32(0x7fff));
    return _mm512_mask_add_epi32(y, odd, y, _mm512_set1_epi32(1));
}

/* the top 16 bits of every lane of lo and hi, in the order fpe_bf16x32_load took them
 * apart: one two-source word permutation */
static inline __m512i fpe_bf16x32_bits(__m512 lo, __m512 hi)
{
    /* element 8q + i (i < 4) from lane 4q + i of lo, 8q + 4 + i from lane 4q + i of hi
     * (indices 32 and up: the second source) */
    static const uint16_t order[32] = {
        1, 3, 5, 7, 33, 35, 37, 39, 9, 11, 13, 15, 41, 43, 45, 47,
        17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63};
    const __m512i idx = _mm512_loadu_si512(order);
    return _mm512_permutex2var_epi16(fpe_bf16x16_bits_high(lo), idx,
                                     fpe_bf16x16_bits_high(hi));
}

static inline void fpe_bf16x32_store(fpe_bf16 *p, __mmask32 m, __m512 lo, __m512 hi)
{
    const __m512i v = fpe_bf16x32_bits(lo, hi);
    if (m == 0xffffffffu)
        _mm512_storeu_si512(p, v);
    else
        _mm512_mask_storeu_epi16(p, m, v);
}

/* fpe_bf16x8_widen's 512-bit form */
static inline __m512 fpe_bf16x16_widen(const fpe_bf16 *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* 32 bfloat16s to float32 in their own order (0-15 in *lo, 16-31 in *hi), and back:
 * fpe_bf16x16_load_inorder's 512-bit form */
static inline void fpe_bf16x32_load_inorder(const fpe_bf16 *p, __m512 *lo, __m512 *hi)
{
    *lo = fpe_bf16x16_widen(p);
    *hi = fpe_bf16x16_widen(p + 16);
}

static inline void fpe_bf16x32_store_inorder(fpe_bf16 *p, __m512 lo, __m512 hi)
{
    /* the top 16 bits of lanes 0-15 of lo, then of hi: the odd words */
    static const uint16_t order[32] = {
        1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
        33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    const __m512i idx = _mm512_loadu_si512(order);
    _mm512_storeu_si512(p, _mm512_permutex2var_epi16(fpe_bf16x16_bits_high(lo), idx,
                                                     fpe_bf16x16_bits_high(hi)));
}

#if FPE_BF16_CVT
FPE_TARGET_BF16 static inline void fpe_bf16x32_store_inorder_cvt(fpe_bf16 *p, __m512 lo,
                                                                 __m512 hi)
{
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (__builtin_expect(_mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7fff)) != 0, 0))
        fpe_bf16x32_store_inorder(p, lo, hi);
    else
        _mm512_storeu_si512(p, v);
}

FPE_TARGET_BF16 static inline __m512i fpe_bf16x32_bits_cvt(__m512 lo, __m512 hi, __mmask32 m)
{
    const __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7),
                                               (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    if (__builtin_expect(_mm512_mask_testn_epi16_mask(m, v, _mm512_set1_epi16(0x7fff)) != 0,
                         0))
        return fpe_bf16x32_bits(lo, hi);
    return v;
}

FPE_TARGET_BF16 static inline void fpe_bf16x32_store_cvt(fpe_bf16 *p, __mmask32 m, __m512 lo,
                                                         __m512 hi)
{
    const __m512i v = fpe_bf16x32_bits_cvt(lo, hi, m);
    if (m == 0xffffffffu)
        _mm512_storeu_si512(p, v);
    else
        _mm512_mask_storeu_epi16(p, m, v);
}
#endif

/* One step of the row loops below: the elements under m of `rows` rows */
static inline void fpe_f16_add16(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                 const fpe_f16 *t, __mmask16 m, Py_ssize_t ahead)
{
    const __m512 b = fpe_f16x16_load(t, m);
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (ahead)
            FPE_PREFETCH_AHEAD(x + r * stride, ahead);
        fpe_f16x16_store(x + r * stride, m, _mm512_add_ps(fpe_f16x16_load(x + r * stride, m), b));
    }
}

static FPE_ALWAYS_INLINE void fpe_bf16_add32(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                             const fpe_bf16 *t, __mmask32 m, int cvt,
                                             Py_ssize_t ahead)
{
    __m512 b0, b1, a0, a1;
    fpe_bf16x32_load(t, m, &b0, &b1);
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (ahead)
            FPE_PREFETCH_AHEAD(x + r * stride, ahead);
        fpe_bf16x32_load(x + r * stride, m, &a0, &a1);
        FPE_BF16X32_STORE(cvt, x + r * stride, m, _mm512_add_ps(a0, b0),
                          _mm512_add_ps(a1, b1));
    }
}

static inline void fpe_f16_madd16(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                  const float *pe, float scale, __mmask16 m, Py_ssize_t ahead)
{
    const __m512 p = m == 0xffff ? _mm512_loadu_ps(pe) : _mm512_maskz_loadu_ps(m, pe);
    const __m512 s = _mm512_set1_ps(scale);
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (ahead)
            FPE_PREFETCH_AHEAD(x + r * stride, ahead);
        fpe_f16x16_store(x + r * stride, m,
                         _mm512_fmadd_ps(fpe_f16x16_load(x + r * stride, m), s, p));
    }
}

static FPE_ALWAYS_INLINE void fpe_bf16_madd32(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                              const float *pe, float scale, __mmask32 m,
                                              int cvt, Py_ssize_t ahead)
{
    const __m512 s = _mm512_set1_ps(scale);
    __m512 p0, p1, a0, a1;
    fpe_f32x32_load_unpacked(pe, m, &p0, &p1);
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (ahead)
            FPE_PREFETCH_AHEAD(x + r * stride, ahead);
        fpe_bf16x32_load(x + r * stride, m, &a0, &a1);
        FPE_BF16X32_STORE(cvt, x + r * stride, m, _mm512_fmadd_ps(a0, s, p0),
                          _mm512_fmadd_ps(a1, s, p1));
    }
}
#else
#define FPE_HALF_RUNS_512 0
#endif
#else
#define FPE_HALF_ADD_RUNS 0
#define FPE_HALF_RUNS_512 0
#define FPE_MADD_F(a, b, c) ((a) * (b) + (c))
#endif

#ifndef FPE_BF16_CVT
#define FPE_BF16_CVT 0
#endif

/* A float32 row of n values narrowed into a float16 or bfloat16 table's row with
 * streaming stores, whole 64-byte lines of it (a table larger than the caches: a
 * plain store that misses reads the line first, twice the traffic), its ends with plain
 * ones; fpe_stream_fence() after the last row. The values are those of
 * fpe_f16_run_store and fpe_bf16_run_store (the narrowing of finite PE values: no NaN
 * to quiet). A row off line boundaries asks ahead for the lines it and the next rows
 * end in (fpe_prefetch_row_ends). Without the vector conversions (the baseline
 * variant) the plain stores of those functions. */
#if FPE_HALF_ADD_RUNS
#define FPE_HALF_STREAM_ROWS 1
#define FPE_HALF_ROW_STREAM(T, NAME, LINE, SCALAR)                                      \
    static inline void NAME(const float *src, T *dst, Py_ssize_t n)                     \
    {                                                                                   \
        Py_ssize_t j = 0;                                                               \
        fpe_prefetch_row_ends(dst, n * sizeof(T));                                      \
        if (((uintptr_t)dst & 1) == 0) {                                                \
            for (; j < n && ((uintptr_t)(dst + j) & 63); j++)                           \
                dst[j] = SCALAR(src[j]);                                                \
            for (; j + 32 <= n; j += 32) {                                              \
                LINE(src + j, dst + j);                                                 \
                LINE(src + j + 16, dst + j + 16);                                       \
            }                                                                           \
        }                                                                               \
        for (; j < n; j++)                                                              \
            dst[j] = SCALAR(src[j]);                                                    \
    }
/* 16 values to half a line, in order */
#define FPE_F16X16_STREAM(s, d)                                                         \
    _mm256_stream_si256((__m256i *)(d),                                                 \
                        _mm256_set_m128i(_mm256_cvtps_ph(_mm256_loadu_ps((s) + 8), 0),  \
                                         _mm256_cvtps_ph(_mm256_loadu_ps(s), 0)))
#define FPE_BF16X16_STREAM(s, d)                                                        \
    do {                                                                                \
        __m256 lo_, hi_;                                                                \
        fpe_f32x16_load_unpacked((s), &lo_, &hi_);                                      \
        _mm256_stream_si256((__m256i *)(d), fpe_bf16x16_bits(lo_, hi_));                \
    } while (0)
FPE_HALF_ROW_STREAM(fpe_f16, fpe_f16_run_stream, FPE_F16X16_STREAM, fpe_f16_make)
FPE_HALF_ROW_STREAM(fpe_bf16, fpe_bf16_run_stream, FPE_BF16X16_STREAM, fpe_bf16_make)
#else
#define FPE_HALF_STREAM_ROWS 0
static inline void fpe_f16_run_stream(const float *src, fpe_f16 *dst, Py_ssize_t n)
{
    fpe_f16_run_store(src, dst, n);
}
static inline void fpe_bf16_run_stream(const float *src, fpe_bf16 *dst, Py_ssize_t n)
{
    fpe_bf16_run_store(src, dst, n);
}
#endif

/* The adds on `rows` rows `stride` elements apart that add the same t (1 or 2: each
 * vector of t, read from the cache, serves both rows of a pair). ahead (bytes, 0: none):
 * each row's line that far on prefetched as the row's line is reached, as
 * fpe_f32_madd_rows does (the next token's row). */
static inline void fpe_f16_add_rows(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                    const fpe_f16 *t, Py_ssize_t n, Py_ssize_t ahead)
{
    Py_ssize_t j = 0;
#if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
    for (; j + 16 <= n; j += 16)
        fpe_f16_add16(x + j, rows, stride, t + j, (__mmask16)0xffff, j & 31 ? 0 : ahead);
    if (j < n) {
        fpe_f16_add16(x + j, rows, stride, t + j, fpe_mask16(n - j), j & 31 ? 0 : ahead);
        j = n;
    }
#elif FPE_F16C_RUNS
    for (; j + 8 <= n; j += 8) {
        const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + j)));
        for (Py_ssize_t r = 0; r < rows; r++) {
            fpe_f16 *xr = x + r * stride + j;
            if (ahead && (j & 31) == 0)
                FPE_PREFETCH_AHEAD(xr, ahead);
            const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xr));
            _mm_storeu_si128((__m128i *)xr,
                             _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
        }
    }
#endif
    for (; j < n; j++)
        for (Py_ssize_t r = 0; r < rows; r++)
            x[r * stride + j] = fpe_f16_make(fpe_f16_load(x[r * stride + j]) + fpe_f16_load(t[j]));
}

static FPE_ALWAYS_INLINE void fpe_bf16_add_rows_nc(fpe_bf16 *x, Py_ssize_t rows,
                                                   Py_ssize_t stride, const fpe_bf16 *t,
                                                   Py_ssize_t n, int cvt, Py_ssize_t ahead)
{
    Py_ssize_t j = 0;
#if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
    for (; j + 32 <= n; j += 32)
        fpe_bf16_add32(x + j, rows, stride, t + j, (__mmask32)0xffffffffu, cvt, ahead);
    if (j < n) {
        fpe_bf16_add32(x + j, rows, stride, t + j, fpe_mask32(n - j), cvt, ahead);
        j = n;
    }
#elif FPE_HALF_ADD_RUNS
    for (; j + 16 <= n; j += 16) {
        __m256 b0, b1;
        fpe_bf16x16_load(t + j, &b0, &b1);
        for (Py_ssize_t r = 0; r < rows; r++) {
            __m256 a0, a1;
            fpe_bf16 *xr = x + r * stride + j;
            if (ahead && (j & 31) == 0)
                FPE_PREFETCH_AHEAD(xr, ahead);
            fpe_bf16x16_load(xr, &a0, &a1);
            FPE_BF16X16_STORE(cvt, xr, _mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1));
        }
    }
#endif
    (void)cvt; (void)ahead;
    for (; j < n; j++)
        for (Py_ssize_t r = 0; r < rows; r++)
            x[r * stride + j] = fpe_bf16_make(fpe_bf16_load(x[r * stride + j]) +
                                              fpe_bf16_load(t[j]));
}

#if FPE_BF16_CVT
FPE_TARGET_BF16 static FPE_NOINLINE void fpe_bf16_add_rows_cvt(fpe_bf16 *x, Py_ssize_t rows,
                                                               Py_ssize_t stride,
                                                               const fpe_bf16 *t, Py_ssize_t n,
                                                               Py_ssize_t ahead)
{
    fpe_bf16_add_rows_nc(x, rows, stride, t, n, 1, ahead);
}
#endif

static inline void fpe_bf16_add_rows(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                     const fpe_bf16 *t, Py_ssize_t n, Py_ssize_t ahead)
{
#if FPE_BF16_CVT
    if (fpe_bf16_cvt) {
        fpe_bf16_add_rows_cvt(x, rows, stride, t, n, ahead);
        return;
    }
#endif
    fpe_bf16_add_rows_nc(x, rows, stride, t, n, 0, ahead);
}

/* The same with x[j] * scale + pe[j] */
static inline void fpe_f16_madd_rows(fpe_f16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                     const float *pe, Py_ssize_t n, float scale,
                                     Py_ssize_t ahead)
{
    Py_ssize_t j = 0;
#if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
    for (; j + 16 <= n; j += 16)
        fpe_f16_madd16(x + j, rows, stride, pe + j, scale, (__mmask16)0xffff,
                       j & 31 ? 0 : ahead);
    if (j < n) {
        fpe_f16_madd16(x + j, rows, stride, pe + j, scale, fpe_mask16(n - j),
                       j & 31 ? 0 : ahead);
        j = n;
    }
#elif FPE_HALF_ADD_RUNS
    const __m256 s = _mm256_set1_ps(scale);
    for (; j + 8 <= n; j += 8) {
        const __m256 p = _mm256_loadu_ps(pe + j);
        for (Py_ssize_t r = 0; r < rows; r++) {
            fpe_f16 *xr = x + r * stride + j;
            if (ahead && (j & 31) == 0)
                FPE_PREFETCH_AHEAD(xr, ahead);
            fpe_f16x8_store(xr, _mm256_fmadd_ps(fpe_f16x8_load(xr), s, p));
        }
    }
#endif
    for (; j < n; j++)
        for (Py_ssize_t r = 0; r < rows; r++)
            x[r * stride + j] = fpe_f16_make(FPE_MADD_F(fpe_f16_load(x[r * stride + j]), scale,
                                                        pe[j]));
}

static FPE_ALWAYS_INLINE void fpe_bf16_madd_rows_nc(fpe_bf16 *x, Py_ssize_t rows,
                                                    Py_ssize_t stride, const float *pe,
                                                    Py_ssize_t n, float scale, int cvt,
                                                    Py_ssize_t ahead)
{
    Py_ssize_t j = 0;
#if FPE_HALF_ADD_RUNS && FPE_HALF_RUNS_512
    for (; j + 32 <= n; j += 32)
        fpe_bf16_madd32(x + j, rows, stride, pe + j, scale, (__mmask32)0xffffffffu, cvt,
                        ahead);
    if (j < n) {
        fpe_bf16_madd32(x + j, rows, stride, pe + j, scale, fpe_mask32(n - j), cvt, ahead);
        j = n;
    }
#elif FPE_HALF_ADD_RUNS
    const __m256 s = _mm256_set1_ps(scale);
    for (; j + 16 <= n; j += 16) {
        __m256 p0, p1;
        fpe_f32x16_load_unpacked(pe + j, &p0, &p1);
        for (Py_ssize_t r = 0; r < rows; r++) {
            __m256 a0, a1;
            fpe_bf16 *xr = x + r * stride + j;
            if (ahead && (j & 31) == 0)
                FPE_PREFETCH_AHEAD(xr, ahead);
            fpe_bf16x16_load(xr, &a0, &a1);
            FPE_BF16X16_STORE(cvt, xr, _mm256_fmadd_ps(a0, s, p0), _mm256_fmadd_ps(a1, s, p1));
        }
    }
#endif
    (void)cvt; (void)ahead;
    for (; j < n; j++)
        for (Py_ssize_t r = 0; r < rows; r++)
            x[r * stride + j] = fpe_bf16_make(FPE_MADD_F(fpe_bf16_load(x[r * stride + j]),
                                                         scale, pe[j]));
}

#if FPE_BF16_CVT
FPE_TARGET_BF16 static FPE_NOINLINE void fpe_bf16_madd_rows_cvt(fpe_bf16 *x, Py_ssize_t rows,
                                                                Py_ssize_t stride,
                                                                const float *pe, Py_ssize_t n,
                                                                float scale, Py_ssize_t ahead)
{
    fpe_bf16_madd_rows_nc(x, rows, stride, pe, n, scale, 1, ahead);
}
#endif

static inline void fpe_bf16_madd_rows(fpe_bf16 *x, Py_ssize_t rows, Py_ssize_t stride,
                                      const float *pe, Py_ssize_t n, float scale,
                                      Py_ssize_t ahead)
{
#if FPE_BF16_CVT
    if (fpe_bf16_cvt) {
        fpe_bf16_madd_rows_cvt(x, rows, stride, pe, n, scale, ahead);
        return;
    }
#endif
    fpe_bf16_madd_rows_nc(x, rows, stride, pe, n, scale, 0, ahead);
}

/* x[j] = x[j] * scale + pe[j] on `rows` float32 rows `stride` elements apart that add
 * the same pe, one row after another (pe stays in L1): with AVX2 + FMA fused, as the
 * compilers contract the one-row loops' a * b + c in those variants, with SSE2 (the
 * x86-64 baseline, no FMA) a multiply and an add, as they round there: both give the
 * one-row loops' bits; scale 1 is an add (the same bits as either form). Returns the
 * rows done: all of them, or 0 without these (the caller adds them then). Many rows a
 * call keep that many streams of x in flight: with two at a time (the pair loop) the
 * baseline's float32 learned add stayed at 72-76% of the in-place floor on an Intel
 * Xeon. ahead (bytes, 0: none): each row's line that far on is prefetched (software)
 * as the row's line is reached, for rows streamed from memory whose next token's row
 * lies there: on that Xeon add_learned (8, 2048, 1024) took 0.78-0.84x the time so in
 * every variant, add_sinusoidal's staged rows 0.87-0.88x (four batch rows at a time
 * where they were eight); in float16 and bfloat16 (the row loops below) 0.94-0.98x and
 * 0.84-0.90x. */
#if defined(__AVX2__) && defined(__FMA__)
#define FPE_ROWS_AVX2 1
#else
#define FPE_ROWS_AVX2 0
#endif
#if FPE_ROWS_AVX2 || (defined(__SSE2__) && !defined(_MSC_VER))
#define FPE_ROWS_VECTOR 1
#else
#define FPE_ROWS_VECTOR 0
#endif

static inline Py_ssize_t fpe_f32_madd_rows(float *x, Py_ssize_t rows, Py_ssize_t stride,
                                           const float *pe, Py_ssize_t n, float scale,
                                           Py_ssize_t ahead)
{
#if FPE_ROWS_AVX2
    const __m256 s = _mm256_set1_ps(scale);
    const int plain = scale == 1.0f;
    /* each row whole, a line a step, as the SSE2 loop below: on an Intel Xeon (Emerald
     * Rapids) a vector of every row in turn, rows of a batch 8 MiB apart, took 3.5-4x
     * the time of this (add_learned (8, 2048, 1024): stores and loads 4 KiB apart
     * alias) */
#define FPE_MADD8_AVX2(at, PLAIN)                                                      \
    do {                                                                               \
        const __m256 a_ = _mm256_loadu_ps(xr + (at));                                  \
        const __m256 p_ = _mm256_loadu_ps(pe + (at));                                  \
        _mm256_storeu_ps(xr + (at), (PLAIN) ? _mm256_add_ps(a_, p_)                    \
                                            : _mm256_fmadd_ps(a_, s, p_));             \
    } while (0)
#define FPE_MADD_ROW_AVX2(PLAIN)                                                       \
    do {                                                                               \
        Py_ssize_t j = 0;                                                              \
        for (; j < lead; j++)                                                          \
            xr[j] = (PLAIN) ? xr[j] + pe[j] : fmaf(xr[j], scale, pe[j]);               \
        for (; j + 16 <= n; j += 16) {                                                 \
            if (ahead)                                                                 \
                FPE_PREFETCH_AHEAD(xr + j, ahead);                                     \
            FPE_MADD8_AVX2(j, PLAIN);                                                  \
            FPE_MADD8_AVX2(j + 8, PLAIN);                                              \
        }                                                                              \
        for (; j + 8 <= n; j += 8)                                                     \
            FPE_MADD8_AVX2(j, PLAIN);                                                  \
        for (; j < n; j++)                                                             \
            xr[j] = (PLAIN) ? xr[j] + pe[j] : fmaf(xr[j], scale, pe[j]);               \
    } while (0)
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *xr = x + r * stride;
        /* x's elements up to its first 32-byte boundary one at a time, so that every
         * vector of x after them is aligned: a NumPy array of more than a few kilobytes
         * starts 16 bytes past a line, and every other 256-bit load and store of its
         * rows then splits a cache line. On an AMD Zen 4 (avx2 kernels, one thread,
         * alternated processes) float32 add_learned (8, 2048, 1024) took 0.88-0.92x
         * the time so, add_sinusoidal 0.94-0.97x (its staged rows at x's offset from
         * 32 bytes too: sinusoidal_unit); the same operations on every element. */
        Py_ssize_t lead = (Py_ssize_t)((32 - ((uintptr_t)xr & 31)) & 31) / 4;
        if ((uintptr_t)xr & 3)
            lead = 0;   /* a row no float32 step aligns */
        else if (lead > n)
            lead = n;
        if (plain) FPE_MADD_ROW_AVX2(1);
        else FPE_MADD_ROW_AVX2(0);
    }
#undef FPE_MADD_ROW_AVX2
#undef FPE_MADD8_AVX2
    return rows;
#elif FPE_ROWS_VECTOR
    const __m128 s = _mm_set1_ps(scale);
    const int plain = scale == 1.0f;
    /* each row whole, a line (16 floats) a step, the scale's test out of the loop:
     * side by side, add_sinusoidal (8, 2048, 1024) took 0.83x the time of a loop over
     * 4 floats of every row in turn (as the AVX2 one above goes) */
#define FPE_MADD4_SSE2(at, PLAIN)                                                      \
    do {                                                                               \
        const __m128 a_ = _mm_loadu_ps(xr + (at));                                     \
        _mm_storeu_ps(xr + (at), _mm_add_ps((PLAIN) ? a_ : _mm_mul_ps(a_, s),          \
                                            _mm_loadu_ps(pe + (at))));                 \
    } while (0)
#define FPE_MADD_ROW_SSE2(PLAIN)                                                       \
    do {                                                                               \
        Py_ssize_t j = 0;                                                              \
        for (; j + 16 <= n; j += 16) {                                                 \
            if (ahead)                                                                 \
                FPE_PREFETCH_AHEAD(xr + j, ahead);                                     \
            FPE_MADD4_SSE2(j, PLAIN);                                                  \
            FPE_MADD4_SSE2(j + 4, PLAIN);                                              \
            FPE_MADD4_SSE2(j + 8, PLAIN);                                              \
            FPE_MADD4_SSE2(j + 12, PLAIN);                                             \
        }                                                                              \
        for (; j + 4 <= n; j += 4)                                                     \
            FPE_MADD4_SSE2(j, PLAIN);                                                  \
        for (; j < n; j++)                                                             \
            xr[j] = (PLAIN) ? xr[j] + pe[j] : xr[j] * scale + pe[j];                   \
    } while (0)
    for (Py_ssize_t r = 0; r < rows; r++) {
        float *xr = x + r * stride;
        if (plain) FPE_MADD_ROW_SSE2(1);
        else FPE_MADD_ROW_SSE2(0);
    }
#undef FPE_MADD_ROW_SSE2
#undef FPE_MADD4_SSE2
    return rows;
#else
    (void)x; (void)rows; (void)stride; (void)pe; (void)n; (void)scale; (void)ahead;
    return 0;
#endif
}

/* ---- RoPE on adjacent pairs (GPT-J style) --------------------------------
 * x[2j], x[2j + 1] = a, b -> a c[2j] + b s[2j], b c[2j + 1] + a s[2j + 1], with
 * tables of one value per feature (c: cos repeated, s: -sin, sin). Every lane does
 * the same multiply-add with its partner's value swapped in: with AVX2 one
 * in-register swap per vector (GCC's own vectorisation of the pair loop shuffles
 * far more). The scalar loop rounds the same way as the vectors (the b s product
 * fused when FMA is there), so every row gives the same bits whatever its length.
 */
#if defined(__AVX2__) && defined(__FMA__)
#define FPE_PAIRS_AVX2 1
#define FPE_PAIR_MADD_F(a, c, b, s) fmaf((b), (s), (a) * (c))
#define FPE_PAIR_MADD_D(a, c, b, s) fma((b), (s), (a) * (c))
#else
#define FPE_PAIRS_AVX2 0
#define FPE_PAIR_MADD_F(a, c, b, s) ((a) * (c) + (b) * (s))
#define FPE_PAIR_MADD_D(a, c, b, s) ((a) * (c) + (b) * (s))
#endif

/* RoPE on split halves (GPT-NeoX / LLaMA style): x[j], x[j + half] = a, b ->
 * a c[j] - b s[j], b c[j] + a s[j]. Written out with AVX2 for the same reason as the
 * pairs below and one more: a head row is short (64 pairs), and the compiler's own
 * vectorised loop spends about as long on its run-time aliasing checks and
 * remainder as on the row. The scalar loop rounds like the vectors. */
#if FPE_PAIRS_AVX2
#define FPE_HALF_X_F(a, c, b, s) fmaf((a), (c), -((b) * (s)))
#define FPE_HALF_Y_F(a, c, b, s) fmaf((b), (c), (a) * (s))
#define FPE_HALF_X_D(a, c, b, s) fma((a), (c), -((b) * (s)))
#define FPE_HALF_Y_D(a, c, b, s) fma((b), (c), (a) * (s))
#else
#define FPE_HALF_X_F(a, c, b, s) ((a) * (c) - (b) * (s))
#define FPE_HALF_Y_F(a, c, b, s) ((b) * (c) + (a) * (s))
#define FPE_HALF_X_D(a, c, b, s) ((a) * (c) - (b) * (s))
#define FPE_HALF_Y_D(a, c, b, s) ((b) * (c) + (a) * (s))
#endif

/* A rotate_half row is read first half first: each step's load of x[j] is kept ahead
 * of its load of x[j + half]. Compilers emit the second half's load first (it feeds
 * the first product), so every row was first touched at its middle, 256 bytes past its
 * start; on an AMD Zen 5 that made a float32 prefill whose rows come from memory take
 * 1.8x the time of rows read in order (1.35x that of the adjacent-pair rows, which are
 * read in order). An empty asm that claims to change both the loaded register v and
 * the pointer p of the second half's load makes that load depend on the first, and
 * costs no instruction. It names no memory: a memory clobber also kept the cos and
 * sin loads and every store in program order, which made a plain C loop over a batched
 * decode's rows (in the caches) take 1.35x the time on that Zen 5. */
#if defined(__GNUC__) || defined(__clang__)
#define FPE_LOADED_FIRST(v, p) __asm__("" : "+v"(v), "+r"(p))
#else
#define FPE_LOADED_FIRST(v, p) ((void)0)
#endif

/* A RoPE call whose q and k hold at most this many bytes is taken as in the caches: the
 * avx512 variant takes its float32 rows (either pairing) 512 bits at a time, those of
 * larger calls 256 bits at a time, as avx2 does; its bfloat16 rows are rotated inline
 * in the loop over heads, those of larger calls by a call per row
 * (fpe_rotate_heads_bf16). Set at import by the CPU's vendor (kernels.pyx). On an Intel
 * Xeon both made every call faster (a bfloat16 prefill of 32 MiB: 0.91x the time with
 * its rows inline). On an AMD Zen 5 the 512-bit steps made rows in the caches faster (a
 * batched decode's 1 MiB: 0.76x the time; 2 MiB 0.8x) and rows streamed from memory
 * slower (8 MiB: 1.0-1.1x, 16 MiB and more: 1.3-1.4x; rotate_half rows whatever their
 * alignment or the order of the loads, adjacent-pair ones 1.03-1.08x), and so did the
 * inline bfloat16 rows (below). The same operations on every element either way, the
 * same bits. */
static Py_ssize_t fpe_rope_cached_bytes = PY_SSIZE_T_MAX;

/* Whether rotate_half rows of a call past fpe_rope_cached_bytes (streamed from memory)
 * take the walks of rows in the caches: float32 rows from a line boundary, not 256-bit
 * steps from their start; bfloat16 rows inline in the loop over heads, not a call per
 * row. Set at import by the CPU's vendor and family (kernels.pyx): on AMD's family 25
 * (Zen 3 and Zen 4) only. On a Zen 5 the walk from a boundary took 1.3x the time of steps
 * from the start (a Llama 3 prefill, q and k of different head counts); on a Zen 4 (avx2
 * kernels, interleaved rounds in one process) 0.84-0.87x with k of 8 heads and
 * 0.95-0.97x with k of 32, and the bfloat16 rows inline 0.84-0.93x with either (avx2 and
 * avx512 kernels). Only these rows: every row of such a prefill taken as in the caches
 * (fpe_rope_cached_bytes unbounded) made float16 and bfloat16 adjacent pairs take
 * 1.15-1.2x the time there (bfloat16 0.88-1.03x in a later run). The same operations on
 * every element, the same bits (which payload a result keeps where two NaNs meet aside:
 * the walks pick it apart). */
static int fpe_rotate_half_lines = 0;

/* One step of a rotate_half row (x and its second half y) or of an adjacent-pair row
 * at feature `at`, in vectors of type VT, and one feature (pair) at a time: every row
 * walk below is made of these, so each element gets the same operations whatever
 * the walk. Where `rows` is 2 each step also takes row x2 (second half y2), by the same
 * cos and sin (fpe_rotate_heads_f32_lines_w: two rows a load of them); where it is 1,
 * x2 and y2 are not read. */
#define FPE_HALF_ONE_OF(X, Y, at)                                                      \
    do {                                                                               \
        const float a_ = (X)[at], b_ = (Y)[at];                                        \
        (X)[at] = FPE_HALF_X_F(a_, c[at], b_, s[at]);                                  \
        (Y)[at] = FPE_HALF_Y_F(a_, c[at], b_, s[at]);                                  \
    } while (0)
#define FPE_HALF_ONE(at)                                                               \
    do {                                                                               \
        FPE_HALF_ONE_OF(x, y, at);                                                     \
        if (rows == 2) FPE_HALF_ONE_OF(x2, y2, at);                                    \
    } while (0)

#define FPE_PAIR_ONE_OF(X, at)                                                         \
    do {                                                                               \
        const float a_ = (X)[at], b_ = (X)[(at) + 1];                                  \
        (X)[at] = FPE_PAIR_MADD_F(a_, c[at], b_, s[at]);                               \
        (X)[(at) + 1] = FPE_PAIR_MADD_F(b_, c[(at) + 1], a_, s[(at) + 1]);             \
    } while (0)
#define FPE_PAIR_ONE(at)                                                               \
    do {                                                                               \
        FPE_PAIR_ONE_OF(x, at);                                                        \
        if (rows == 2) FPE_PAIR_ONE_OF(x2, at);                                        \
    } while (0)

#if FPE_PAIRS_AVX2
/* the step of row X (second half Y) by the cos and sin vectors c_ and s_ */
#define FPE_HALF_STEP_OF(VT, LOAD, STORE, FMSUB, FMADD, MUL, X, Y, at)                 \
    do {                                                                               \
        VT a_ = LOAD((X) + (at));                                                      \
        float *yj_ = (Y) + (at);                                                       \
        FPE_LOADED_FIRST(a_, yj_);                                                     \
        const VT b_ = LOAD(yj_);                                                       \
        STORE((X) + (at), FMSUB(a_, c_, MUL(b_, s_)));                                 \
        STORE(yj_, FMADD(b_, c_, MUL(a_, s_)));                                        \
    } while (0)

#define FPE_HALF_STEP(VT, LOAD, STORE, FMSUB, FMADD, MUL, at)                          \
    do {                                                                               \
        const VT c_ = LOAD(c + (at)), s_ = LOAD(s + (at));                             \
        FPE_HALF_STEP_OF(VT, LOAD, STORE, FMSUB, FMADD, MUL, x, y, at);                \
        if (rows == 2) FPE_HALF_STEP_OF(VT, LOAD, STORE, FMSUB, FMADD, MUL, x2, y2, at); \
    } while (0)

/* PERMUTE(v, 0xB1): lanes 1 0 3 2 ..., each feature's partner */
#define FPE_PAIRS_STEP_OF(VT, STORE, PERMUTE, FMADD, MUL, X, v_, at)                   \
    STORE((X) + (at), FMADD(PERMUTE(v_, 0xB1), s_, MUL(v_, c_)))
#define FPE_PAIRS_STEP(VT, LOAD, STORE, PERMUTE, FMADD, MUL, at)                       \
    do {                                                                               \
        const VT v_ = LOAD(x + (at)), s_ = LOAD(s + (at)), c_ = LOAD(c + (at));        \
        FPE_PAIRS_STEP_OF(VT, STORE, PERMUTE, FMADD, MUL, x, v_, at);                  \
        if (rows == 2) {                                                               \
            const VT w_ = LOAD(x2 + (at));                                             \
            FPE_PAIRS_STEP_OF(VT, STORE, PERMUTE, FMADD, MUL, x2, w_, at);             \
        }                                                                              \
    } while (0)

#define FPE_HALF_STEP4(at) FPE_HALF_STEP(__m128, _mm_loadu_ps, _mm_storeu_ps,          \
                                         _mm_fmsub_ps, _mm_fmadd_ps, _mm_mul_ps, at)
#define FPE_HALF_STEP8(at) FPE_HALF_STEP(__m256, _mm256_loadu_ps, _mm256_storeu_ps,    \
                                         _mm256_fmsub_ps, _mm256_fmadd_ps,             \
                                         _mm256_mul_ps, at)
#define FPE_PAIRS_STEP4(at) FPE_PAIRS_STEP(__m128, _mm_loadu_ps, _mm_storeu_ps,        \
                                           _mm_permute_ps, _mm_fmadd_ps, _mm_mul_ps, at)
#define FPE_PAIRS_STEP8(at) FPE_PAIRS_STEP(__m256, _mm256_loadu_ps, _mm256_storeu_ps,  \
                                           _mm256_permute_ps, _mm256_fmadd_ps,         \
                                           _mm256_mul_ps, at)
#if defined(__AVX512F__)
#define FPE_HALF_STEP16(at) FPE_HALF_STEP(__m512, _mm512_loadu_ps, _mm512_storeu_ps,   \
                                          _mm512_fmsub_ps, _mm512_fmadd_ps,            \
                                          _mm512_mul_ps, at)
#define FPE_PAIRS_STEP16(at) FPE_PAIRS_STEP(__m512, _mm512_loadu_ps, _mm512_storeu_ps, \
                                            _mm512_permute_ps, _mm512_fmadd_ps,        \
                                            _mm512_mul_ps, at)
#define FPE_STEP_FLOATS(wide) ((wide) ? 16 : 8)
#else
#define FPE_STEP_FLOATS(wide) 8
#endif
#endif

/* The baseline (SSE2) variant: the same walks 128 bits at a time, each product rounded
 * and then summed, as the scalar steps there round (no FMA), so the same bits. GCC's
 * own vectorisation of the adjacent-pair loop left a 128-feature row a counted loop of
 * 32 steps; these rows unroll whole (FPE_UNROLL_ROW). With four times the loads and
 * stores of a 512-bit pass per line, each line of a row is also prefetched 4 KiB ahead,
 * as the floor's fastest pass does (fpe_floor_words_ahead); the wide variants measured
 * no gain from that. Side by side on an Intel Xeon, float32 (1, 2048, 32, 128):
 * unrolled, an adjacent-pair prefill took 0.74x the time and a batched decode 0.68x;
 * the prefetch then made either pairing's prefill 0.86-0.88x (2 KiB ahead 1.04x that,
 * 8 KiB the same) and left decodes as they were. */
#if !FPE_PAIRS_AVX2 && defined(__SSE2__) && !defined(_MSC_VER)
#define FPE_PAIRS_SSE2 1
#define FPE_SSE2_AHEAD 4096
#define FPE_HALF_STEP4_SSE2(at)                                                        \
    do {                                                                               \
        if (((at) & 15) == 0) {                                                        \
            FPE_PREFETCH_AHEAD(x + (at), FPE_SSE2_AHEAD);                              \
            FPE_PREFETCH_AHEAD(y + (at), FPE_SSE2_AHEAD);                              \
        }                                                                              \
        __m128 a_ = _mm_loadu_ps(x + (at));                                            \
        float *yj_ = y + (at);                                                         \
        FPE_LOADED_FIRST(a_, yj_);                                                     \
        const __m128 b_ = _mm_loadu_ps(yj_);                                           \
        const __m128 c_ = _mm_loadu_ps(c + (at)), s_ = _mm_loadu_ps(s + (at));         \
        _mm_storeu_ps(x + (at), _mm_sub_ps(_mm_mul_ps(a_, c_), _mm_mul_ps(b_, s_)));   \
        _mm_storeu_ps(yj_, _mm_add_ps(_mm_mul_ps(b_, c_), _mm_mul_ps(a_, s_)));        \
    } while (0)
#define FPE_PAIRS_STEP4_SSE2(at)                                                       \
    do {                                                                               \
        if (((at) & 15) == 0) FPE_PREFETCH_AHEAD(x + (at), FPE_SSE2_AHEAD);           \
        const __m128 v_ = _mm_loadu_ps(x + (at));                                      \
        const __m128 w_ = _mm_shuffle_ps(v_, v_, 0xB1);                                \
        _mm_storeu_ps(x + (at), _mm_add_ps(_mm_mul_ps(v_, _mm_loadu_ps(c + (at))),     \
                                           _mm_mul_ps(w_, _mm_loadu_ps(s + (at)))));   \
    } while (0)
#if defined(__clang__) || defined(__GNUC__)
#define FPE_UNROLL_ROW _Pragma("GCC unroll 32")
#else
#define FPE_UNROLL_ROW
#endif
#else
#define FPE_PAIRS_SSE2 0
#endif

/* `wide` is a constant wherever this is inlined (fpe_rotate_half_f32 below), so that a
 * row of a fixed width unrolls whole at either step width */
static FPE_ALWAYS_INLINE void fpe_rotate_half_f32_w(float *x, const float *c, const float *s,
                                                   Py_ssize_t half, int wide)
{
    float *y = x + half, *const x2 = x, *const y2 = y;
    const int rows = 1;
    Py_ssize_t j = 0;
    (void)x2; (void)y2;
#if FPE_PAIRS_AVX2 && defined(__AVX512F__)
    /* the avx512 variant: 16 pairs at a time first, the same operations per element */
    for (; wide && j + 16 <= half; j += 16) FPE_HALF_STEP16(j);
#endif
#if FPE_PAIRS_AVX2
    for (; j + 8 <= half; j += 8) FPE_HALF_STEP8(j);
#elif FPE_PAIRS_SSE2
    FPE_UNROLL_ROW
    for (; j + 4 <= half; j += 4) FPE_HALF_STEP4_SSE2(j);
#endif
    for (; j < half; j++) FPE_HALF_ONE(j);
#if !(FPE_PAIRS_AVX2 && defined(__AVX512F__))
    (void)wide;
#endif
}

static FPE_ALWAYS_INLINE void fpe_rotate_half_f32_wide(float *x, const float *c, const float *s,
                                                      Py_ssize_t half)
{
    fpe_rotate_half_f32_w(x, c, s, half, 1);
}

static FPE_ALWAYS_INLINE void fpe_rotate_half_f32_n(float *x, const float *c, const float *s,
                                                   Py_ssize_t half)
{
    fpe_rotate_half_f32_w(x, c, s, half, 0);
}

static FPE_ALWAYS_INLINE void fpe_rotate_half_f64_n(double *x, const double *c, const double *s,
                                       Py_ssize_t half)
{
    double *y = x + half;
    Py_ssize_t j = 0;
#if FPE_PAIRS_AVX2
    for (; j + 4 <= half; j += 4) {
        __m256d a = _mm256_loadu_pd(x + j);
        double *yj = y + j;
        FPE_LOADED_FIRST(a, yj);
        const __m256d b = _mm256_loadu_pd(yj);
        const __m256d cj = _mm256_loadu_pd(c + j), sj = _mm256_loadu_pd(s + j);
        _mm256_storeu_pd(x + j, _mm256_fmsub_pd(a, cj, _mm256_mul_pd(b, sj)));
        _mm256_storeu_pd(yj, _mm256_fmadd_pd(b, cj, _mm256_mul_pd(a, sj)));
    }
#endif
    for (; j < half; j++) {
        const double a = x[j], b = y[j];
        x[j] = FPE_HALF_X_D(a, c[j], b, s[j]);
        y[j] = FPE_HALF_Y_D(a, c[j], b, s[j]);
    }
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f32_w(float *x, const float *c, const float *s,
                                                    Py_ssize_t n, int wide)
{
    float *const x2 = x;
    const int rows = 1;
    Py_ssize_t i = 0;
    (void)x2;
#if FPE_PAIRS_AVX2 && defined(__AVX512F__)
    for (; wide && i + 16 <= n; i += 16) FPE_PAIRS_STEP16(i);
#endif
#if FPE_PAIRS_AVX2
    for (; i + 8 <= n; i += 8) FPE_PAIRS_STEP8(i);
#elif FPE_PAIRS_SSE2
    FPE_UNROLL_ROW
    for (; i + 4 <= n; i += 4) FPE_PAIRS_STEP4_SSE2(i);
#endif
    for (; i + 1 < n; i += 2) FPE_PAIR_ONE(i);
#if !(FPE_PAIRS_AVX2 && defined(__AVX512F__))
    (void)wide;
#endif
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f32_wide(float *x, const float *c,
                                                       const float *s, Py_ssize_t n)
{
    fpe_rotate_pairs_f32_w(x, c, s, n, 1);
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f32_n(float *x, const float *c, const float *s,
                                                    Py_ssize_t n)
{
    fpe_rotate_pairs_f32_w(x, c, s, n, 0);
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f64_n(double *x, const double *c, const double *s,
                                        Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if FPE_PAIRS_AVX2
    for (; i + 4 <= n; i += 4) {
        const __m256d v = _mm256_loadu_pd(x + i);
        const __m256d w = _mm256_permute_pd(v, 0x5);   /* lanes 1 0 3 2 */
        _mm256_storeu_pd(x + i, _mm256_fmadd_pd(w, _mm256_loadu_pd(s + i),
                                                _mm256_mul_pd(v, _mm256_loadu_pd(c + i))));
    }
#endif
    for (; i + 1 < n; i += 2) {
        const double a = x[i], b = x[i + 1];
        x[i] = FPE_PAIR_MADD_D(a, c[i], b, s[i]);
        x[i + 1] = FPE_PAIR_MADD_D(b, c[i + 1], a, s[i + 1]);
    }
}

/* The rotations above, with the common head sizes (64 and 128 features) as
 * compile-time constants: a fully unrolled row keeps the loads of the next rows in
 * flight, which a counted loop does not, and that is worth 10-15% of memory
 * bandwidth on a prefill. */
#define FPE_AT_FIXED_WIDTH(fn, x, c, s, n, a, b)                                       \
    do {                                                                               \
        if ((n) == (a)) fn(x, c, s, a);                                                \
        else if ((n) == (b)) fn(x, c, s, b);                                           \
        else fn(x, c, s, n);                                                           \
    } while (0)

static FPE_ALWAYS_INLINE void fpe_rotate_half_f32(float *x, const float *c, const float *s,
                                                 Py_ssize_t half, int wide)
{
#if FPE_PAIRS_AVX2 && defined(__AVX512F__)
    if (wide) {
        FPE_AT_FIXED_WIDTH(fpe_rotate_half_f32_wide, x, c, s, half, 64, 32);
        return;
    }
#endif
    (void)wide;
    FPE_AT_FIXED_WIDTH(fpe_rotate_half_f32_n, x, c, s, half, 64, 32);
}

static FPE_ALWAYS_INLINE void fpe_rotate_half_f64(double *x, const double *c, const double *s,
                                       Py_ssize_t half)
{
    FPE_AT_FIXED_WIDTH(fpe_rotate_half_f64_n, x, c, s, half, 64, 32);
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f32(float *x, const float *c, const float *s,
                                                  Py_ssize_t n, int wide)
{
#if FPE_PAIRS_AVX2 && defined(__AVX512F__)
    if (wide) {
        FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_f32_wide, x, c, s, n, 128, 64);
        return;
    }
#endif
    (void)wide;
    FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_f32_n, x, c, s, n, 128, 64);
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f64(double *x, const double *c, const double *s,
                                        Py_ssize_t n)
{
    FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_f64_n, x, c, s, n, 128, 64);
}

/* A row of RoPE: rotate_half pairs (neox) or adjacent ones, 2 * half features; float32
 * rows 512 bits at a time when `wide` (fpe_rope_cached_bytes). */
static FPE_ALWAYS_INLINE void fpe_rotate_f32(float *x, const float *c, const float *s,
                                             Py_ssize_t half, int neox, int wide)
{
    if (neox) fpe_rotate_half_f32(x, c, s, half, wide);
    else fpe_rotate_pairs_f32(x, c, s, 2 * half, wide);
}

static FPE_ALWAYS_INLINE void fpe_rotate_f64(double *x, const double *c, const double *s,
                                             Py_ssize_t half, int neox)
{
    if (neox) fpe_rotate_half_f64(x, c, s, half);
    else fpe_rotate_pairs_f64(x, c, s, 2 * half);
}

#if defined(_MSC_VER)
#define FPE_RESTRICT __restrict
#else
#define FPE_RESTRICT restrict
#endif

/* The heads of one token: rows q + h * qh (h < hq) and k + h * kh (h < hk), `group`
 * heads of q beside the same heads of k, all rotated by the one cos/sin row, each as
 * fpe_rotate_f32 does it (the same bits). The width and step are chosen once, not per
 * row, and c and s are declared apart from the rows, so that the compiler may keep them
 * in registers across rows instead of loading them again after every store: a batched
 * decode's rows are in the caches, where those loads and the per-row choices were a
 * third of the time. */
#define FPE_HEADS_LOOP(fn, n)                                                          \
    do {                                                                               \
        for (Py_ssize_t h0 = 0; h0 < heads; h0 += group) {                             \
            const Py_ssize_t h1 = h0 + group;                                          \
            for (Py_ssize_t h = h0; h < h1 && h < hq; h++) fn(q + h * qh, c, s, n);    \
            for (Py_ssize_t h = h0; h < h1 && h < hk; h++) fn(k + h * kh, c, s, n);    \
        }                                                                              \
    } while (0)

/* Half-precision heads of q and then of k about a kilobyte at a time: q and k allocated
 * one after the other lie at one offset from each other in physical memory too (huge
 * pages), and a prefill that switched between their streams every 256-byte row
 * (float16, head_dim 128; k 16 MiB and 16 bytes past q, as malloc lays out two arrays)
 * ran at 48-54% of the floor on an Intel Xeon (Emerald Rapids), bfloat16 at 46-49%; a
 * kilobyte of each at a time, 81-98% and 75-91%, and no slower where they lie apart.
 * float32 and float64 rows (512 bytes and more) go a head at a time: there groups of a
 * kilobyte measured no faster, and 2-10% slower in the baseline variant and in float64.
 * The bits do not depend on the order. */
#define FPE_HALF_GROUP_BYTES 1024

/* Half-precision rows of adjacent pairs streamed from memory (not `cached`: on AMD
 * CPUs, calls of more than fpe_rope_cached_bytes) ask for the lines FPE_ROW_AHEAD bytes
 * past each row as they rotate it, a read prefetch. On an AMD Zen 4 (avx2 kernels,
 * float16 (1, 2048, 32, 128) q with k of 32 or 8 heads, interleaved rounds) that took
 * 0.87-0.91x the time of none (1 KiB ahead 0.95-1.05x, 4 KiB 0.85-0.90x), bfloat16
 * 0.85-0.88x (both wide variants); rotate_half rows gained with k of 32 heads (0.93-0.96x)
 * but lost with 8 (1.06-1.19x) and go without. Prefetching a token's rows at once, the
 * next token's whole, took 1.3-2x the time. */
#define FPE_ROW_AHEAD 2048

static inline Py_ssize_t fpe_half_heads_group(Py_ssize_t half)
{
    const Py_ssize_t row = 2 * half * 2;
    return row >= FPE_HALF_GROUP_BYTES ? 1 : FPE_HALF_GROUP_BYTES / row;
}

#define FPE_HEADS_AT_FIXED_WIDTH(fn, n, a, b)                                          \
    do {                                                                               \
        if ((n) == (a)) FPE_HEADS_LOOP(fn, a);                                         \
        else if ((n) == (b)) FPE_HEADS_LOOP(fn, b);                                    \
        else FPE_HEADS_LOOP(fn, n);                                                    \
    } while (0)

#if FPE_PAIRS_AVX2
/* Rows taken whole cache lines at a time. A NumPy array of more than a few kilobytes
 * starts 16 bytes past a 64-byte boundary (its allocator's header), so each of its
 * rows' 512-bit loads and stores spans two lines, and every other 256-bit one: with
 * the rows in the caches (a batched decode's 1 MiB) that took 1.3x (512-bit steps) and
 * 1.4x (256-bit) the time of the same rows on line boundaries, on a Zen 5. Here a
 * row's first features up to a boundary (64 bytes for 512-bit steps, 32 for 256-bit
 * ones) go 1 and 4 (and 8) at a time, then whole steps, and its last ones 8, 4 and 1
 * at a time, the cos and sin rows read at the same offsets (the caller places them at
 * the rows' offset from a line: rope_block). The same operations on every element as
 * fpe_rotate_f32's, so the same bits. */
#define FPE_LINE_FLOATS 16

/* features from x to its next boundary of `step` floats (a power of two) */
static FPE_ALWAYS_INLINE Py_ssize_t fpe_step_lead(const float *x, Py_ssize_t step)
{
    return (Py_ssize_t)((step - (Py_ssize_t)(((uintptr_t)x >> 2) & (uintptr_t)(step - 1)))
                        & (step - 1));
}

/* A row of n features from its lead to its end: single features (or pairs: `unit`)
 * and 4 (and 8) at a time up to the boundary, whole steps, then 8, 4 and single ones. */
#if defined(__AVX512F__)
#define FPE_LINES_WIDE(j, n, lead, STEP8, STEP16)                                      \
    if (wide) {                                                                        \
        if ((lead) & 8) { STEP8(j); j += 8; }                                          \
        for (; j + 16 <= (n); j += 16) STEP16(j);                                      \
    }
#else
#define FPE_LINES_WIDE(j, n, lead, STEP8, STEP16)
#endif
#define FPE_LINES_WALK(j, n, lead, unit, ONE, STEP4, STEP8, STEP16)                    \
    do {                                                                               \
        for (; j < ((lead) & 3); j += (unit)) ONE(j);                                  \
        if ((lead) & 4) { STEP4(j); j += 4; }                                          \
        FPE_LINES_WIDE(j, n, lead, STEP8, STEP16)                                      \
        (void)wide;                                                                    \
        for (; j + 8 <= (n); j += 8) STEP8(j);                                         \
        if (j + 4 <= (n)) { STEP4(j); j += 4; }                                        \
        for (; j + (unit) <= (n); j += (unit)) ONE(j);                                 \
    } while (0)

/* row x, and where `rows` is 2 row x2 at the same offset from a line, each step of both
 * by one load of the cos and sin; `wide`, `rows` and usually `half` and `lead` are
 * constants where this is inlined */
static FPE_ALWAYS_INLINE void fpe_rotate_half_f32_lines(float *x, float *x2, const float *c,
                                                        const float *s, Py_ssize_t half,
                                                        Py_ssize_t lead, int wide, int rows)
{
    float *y = x + half, *y2 = x2 + half;
    Py_ssize_t j = 0;
    if (lead > half) lead = half;
    FPE_LINES_WALK(j, half, lead, 1, FPE_HALF_ONE, FPE_HALF_STEP4, FPE_HALF_STEP8,
                   FPE_HALF_STEP16);
}

/* adjacent pairs: the lead rounded down to whole pairs */
static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f32_lines(float *x, float *x2, const float *c,
                                                         const float *s, Py_ssize_t n,
                                                         Py_ssize_t lead, int wide, int rows)
{
    Py_ssize_t i = 0;
    lead &= ~(Py_ssize_t)1;
    if (lead > n) lead = n;
    FPE_LINES_WALK(i, n, lead, 2, FPE_PAIR_ONE, FPE_PAIRS_STEP4, FPE_PAIRS_STEP8,
                   FPE_PAIRS_STEP16);
}

/* fpe_rotate_heads_f32 on whole lines (512-bit steps when `wide`, else 256-bit ones),
 * for rows of q that all lie at c's and s's offset from a line and rows of k at kc's
 * and ks's (each head stride whole lines, or one head); false where they do not. */
static FPE_ALWAYS_INLINE int fpe_rotate_heads_f32_lines_w(
    float *q, Py_ssize_t hq, Py_ssize_t qh, float *k, Py_ssize_t hk, Py_ssize_t kh,
    const float *FPE_RESTRICT c, const float *FPE_RESTRICT s, const float *FPE_RESTRICT kc,
    const float *FPE_RESTRICT ks, Py_ssize_t half, int neox, int wide)
{
    const uintptr_t line = FPE_LINE_FLOATS * sizeof(float);
    const Py_ssize_t step = FPE_STEP_FLOATS(wide);
    if (((uintptr_t)q & 3) || (((uintptr_t)q ^ (uintptr_t)c) & (line - 1))
            || (((uintptr_t)q ^ (uintptr_t)s) & (line - 1))
            || (hq > 1 && qh % FPE_LINE_FLOATS))
        return 0;
    if (hk && ((((uintptr_t)k ^ (uintptr_t)kc) & (line - 1))
               || (((uintptr_t)k ^ (uintptr_t)ks) & (line - 1))
               || (hk > 1 && kh % FPE_LINE_FLOATS)))
        return 0;
    const Py_ssize_t both = hq < hk ? hq : hk, lq = fpe_step_lead(q, step);
    const Py_ssize_t lk = hk ? fpe_step_lead(k, step) : lq;
    /* Adjacent-pair rows streamed from memory (not `wide`) where q's and k's rows
     * alternate, two streams, ask for the lines FPE_ROW_AHEAD bytes past each row, as
     * the half-precision ones do; where one tensor's rows run on alone the hardware's
     * own prefetch keeps up. On an AMD Zen 4 (avx2 and avx512 kernels, float32 (1, 2048,
     * 32, 128) q and k, time over an in-place pass's, interleaved rounds) that took
     * 0.90-0.92x the time of none, with k of 8 heads 0.97x; asking for the lines of
     * every row, or of q's rows alone, took 1.03-1.09x. rotate_half rows (which take
     * this walk only in the caches) asked for theirs the same way took 1.1x. */
    const int ahead = !neox && !wide;
    const Py_ssize_t row_bytes = 2 * half * (Py_ssize_t)sizeof(float);
    /* head h of q beside head h of k where k's rows take q's cos and sin (at one offset
     * from a line), both by one load of them. On an AMD Zen 4 (avx2 kernels, float32
     * (32, 1, 32, 128) q and k of a batched decode, in the caches) that took 0.93-0.95x
     * the time of a load for each row, adjacent pairs 0.91x; two heads of q alone so
     * took 1.03x, and go a row at a time, as do q and k at different offsets. */
    const int shared = kc == c && ks == s;
    Py_ssize_t h;
#define FPE_LINES_LOOP(fn, n, lead_q, lead_k)                                          \
    do {                                                                               \
        if (shared) {                                                                  \
            for (h = 0; h < both; h++) {                                               \
                if (ahead) {                                                           \
                    fpe_prefetch_lines(q + h * qh, FPE_ROW_AHEAD, row_bytes, 0);      \
                    fpe_prefetch_lines(k + h * kh, FPE_ROW_AHEAD, row_bytes, 0);      \
                }                                                                      \
                fn(q + h * qh, k + h * kh, c, s, n, lead_q, wide, 2);                  \
            }                                                                          \
        } else {                                                                       \
            for (h = 0; h < both; h++) {                                               \
                if (ahead) fpe_prefetch_lines(q + h * qh, FPE_ROW_AHEAD, row_bytes, 0); \
                fn(q + h * qh, q, c, s, n, lead_q, wide, 1);                           \
                if (ahead) fpe_prefetch_lines(k + h * kh, FPE_ROW_AHEAD, row_bytes, 0); \
                fn(k + h * kh, k, kc, ks, n, lead_k, wide, 1);                         \
            }                                                                          \
        }                                                                              \
        for (; h < hq; h++) fn(q + h * qh, q, c, s, n, lead_q, wide, 1);               \
        for (; h < hk; h++) fn(k + h * kh, k, kc, ks, n, lead_k, wide, 1);             \
    } while (0)
    /* the common head widths, and q and k at one offset a multiple of 16 bytes (NumPy
     * allocations: 16 bytes past a line), unrolled whole */
#define FPE_LINES_AT(fn, n)                                                            \
    do {                                                                               \
        if (lq == lk && lq == 0) FPE_LINES_LOOP(fn, n, 0, 0);                          \
        else if (lq == lk && lq == 12) FPE_LINES_LOOP(fn, n, 12, 12);                  \
        else if (lq == lk && lq == 8) FPE_LINES_LOOP(fn, n, 8, 8);                     \
        else if (lq == lk && lq == 4) FPE_LINES_LOOP(fn, n, 4, 4);                     \
        else FPE_LINES_LOOP(fn, n, lq, lk);                                            \
    } while (0)
    if (neox) {
        if (half == 64) FPE_LINES_AT(fpe_rotate_half_f32_lines, 64);
        else if (half == 32) FPE_LINES_AT(fpe_rotate_half_f32_lines, 32);
        else FPE_LINES_LOOP(fpe_rotate_half_f32_lines, half, lq, lk);
    } else {
        if (half == 64) FPE_LINES_AT(fpe_rotate_pairs_f32_lines, 128);
        else if (half == 32) FPE_LINES_AT(fpe_rotate_pairs_f32_lines, 64);
        else FPE_LINES_LOOP(fpe_rotate_pairs_f32_lines, 2 * half, lq, lk);
    }
#undef FPE_LINES_LOOP
#undef FPE_LINES_AT
    return 1;
}

/* each step width a function of its own: the unrolled loops of both inlined into one
 * made the avx512 variant's streamed rows (a prefill past the caches) 1.25x slower */
static FPE_NOINLINE int fpe_rotate_heads_f32_lines(
    float *q, Py_ssize_t hq, Py_ssize_t qh, float *k, Py_ssize_t hk, Py_ssize_t kh,
    const float *c, const float *s, const float *kc, const float *ks, Py_ssize_t half,
    int neox)
{
    return fpe_rotate_heads_f32_lines_w(q, hq, qh, k, hk, kh, c, s, kc, ks, half, neox, 0);
}

#if defined(__AVX512F__)
static FPE_NOINLINE int fpe_rotate_heads_f32_lines512(
    float *q, Py_ssize_t hq, Py_ssize_t qh, float *k, Py_ssize_t hk, Py_ssize_t kh,
    const float *c, const float *s, const float *kc, const float *ks, Py_ssize_t half,
    int neox)
{
    return fpe_rotate_heads_f32_lines_w(q, hq, qh, k, hk, kh, c, s, kc, ks, half, neox, 1);
}
#endif
#endif

static void fpe_rotate_heads_f32(float *q, Py_ssize_t hq, Py_ssize_t qh, float *k,
                                 Py_ssize_t hk, Py_ssize_t kh,
                                 const float *FPE_RESTRICT c, const float *FPE_RESTRICT s,
                                 const float *kc, const float *ks, Py_ssize_t half, int neox,
                                 int wide)
{
    const Py_ssize_t group = 1;
#if FPE_PAIRS_AVX2
    /* rows in the caches whose q and k lie at different offsets from a step's boundary:
     * k's heads first in a call of their own, then q's, each walk unrolled for its own
     * offset, where one walk beside the other took its offsets at run time: a (32, 1,
     * 32, 128) batched decode with q on a line and k 16 bytes past one took 1.2x the
     * time of both on a line (AMD Zen 4, avx2 kernels) */
    const uintptr_t step_bytes = (uintptr_t)FPE_STEP_FLOATS(wide) * sizeof(float);
    if (wide && hq && hk && (((uintptr_t)q ^ (uintptr_t)k) & (step_bytes - 1))) {
        fpe_rotate_heads_f32(k, hk, kh, NULL, 0, 0, kc, ks, NULL, NULL, half, neox, wide);
        hk = 0;
    }
#endif
    const Py_ssize_t heads = hq > hk ? hq : hk;
#if FPE_PAIRS_AVX2 && defined(__AVX512F__)
    if (wide) {
        if (fpe_rotate_heads_f32_lines512(q, hq, qh, k, hk, kh, c, s, kc, ks, half, neox))
            return;
        if (neox) FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_half_f32_wide, half, 64, 32);
        else FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_f32_wide, 2 * half, 128, 64);
        return;
    }
#endif
#if FPE_PAIRS_AVX2
    /* 256-bit steps on whole lines for rows in the caches (`wide`: the avx2 variant
     * takes it as that) and adjacent pairs: rotate_half rows streamed from memory (a
     * Llama 3 prefill's, q and k of different head counts) took 1.3x the time that
     * way on a Zen 5, adjacent-pair ones 0.9x */
    if ((wide || !neox || fpe_rotate_half_lines)
            && fpe_rotate_heads_f32_lines(q, hq, qh, k, hk, kh, c, s, kc, ks, half, neox))
        return;
#else
    (void)kc; (void)ks;
#endif
    if (neox) FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_half_f32_n, half, 64, 32);
    else FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_f32_n, 2 * half, 128, 64);
}

static void fpe_rotate_heads_f64(double *q, Py_ssize_t hq, Py_ssize_t qh, double *k,
                                 Py_ssize_t hk, Py_ssize_t kh,
                                 const double *FPE_RESTRICT c, const double *FPE_RESTRICT s,
                                 Py_ssize_t half, int neox)
{
    const Py_ssize_t heads = hq > hk ? hq : hk, group = 1;
    if (neox) FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_half_f64_n, half, 64, 32);
    else FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_f64_n, 2 * half, 128, 64);
}

/* A row of RoPE in float16 or bfloat16 storage, in one pass: 8 features (16 for
 * bfloat16) widened, rotated by fpe_rotate_f32's operations and narrowed in registers,
 * where converting the row into a float32 buffer, rotating that and converting it
 * back makes three passes (and cost float16 prefills 2x float32's time). The same
 * operations on every element, so the same bits as that path; the bfloat16 narrowing
 * (fpe_bf16x8_bits) is exact here for the reason the adds give: every operand is a
 * widened bfloat16 or a finite cos or sin. The few features past a multiple of 8 or
 * 16 go one at a time. The avx512 variant takes 16 (32) at a time first, in 512-bit
 * registers: the same operations on every element again. Without AVX2, FMA and F16C the
 * rows take the three passes. */
#if FPE_HALF_ADD_RUNS && FPE_PAIRS_AVX2
#define FPE_HALF_ROTATE 1

static FPE_ALWAYS_INLINE void fpe_rotate_half_f16_n(fpe_f16 *x, const float *c, const float *s,
                                                    Py_ssize_t half)
{
    fpe_f16 *y = x + half;
    Py_ssize_t j = 0;
#if FPE_HALF_RUNS_512
    for (; j + 16 <= half; j += 16) {
        __m512 a = fpe_f16x16_load(x + j, 0xffff);
        fpe_f16 *yj = y + j;
        FPE_LOADED_FIRST(a, yj);
        const __m512 b = fpe_f16x16_load(yj, 0xffff);
        const __m512 cj = _mm512_loadu_ps(c + j), sj = _mm512_loadu_ps(s + j);
        fpe_f16x16_store(x + j, 0xffff, _mm512_fmsub_ps(a, cj, _mm512_mul_ps(b, sj)));
        fpe_f16x16_store(yj, 0xffff, _mm512_fmadd_ps(b, cj, _mm512_mul_ps(a, sj)));
    }
#endif
    for (; j + 8 <= half; j += 8) {
        __m256 a = fpe_f16x8_load(x + j);
        fpe_f16 *yj = y + j;
        FPE_LOADED_FIRST(a, yj);
        const __m256 b = fpe_f16x8_load(yj);
        const __m256 cj = _mm256_loadu_ps(c + j), sj = _mm256_loadu_ps(s + j);
        fpe_f16x8_store(x + j, _mm256_fmsub_ps(a, cj, _mm256_mul_ps(b, sj)));
        fpe_f16x8_store(yj, _mm256_fmadd_ps(b, cj, _mm256_mul_ps(a, sj)));
    }
    for (; j < half; j++) {
        const float a = fpe_f16_load(x[j]), b = fpe_f16_load(y[j]);
        x[j] = fpe_f16_make(FPE_HALF_X_F(a, c[j], b, s[j]));
        y[j] = fpe_f16_make(FPE_HALF_Y_F(a, c[j], b, s[j]));
    }
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f16_n(fpe_f16 *x, const float *c, const float *s,
                                                     Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if FPE_HALF_RUNS_512
    for (; i + 16 <= n; i += 16) {
        const __m512 v = fpe_f16x16_load(x + i, 0xffff);
        const __m512 w = _mm512_permute_ps(v, 0xB1);
        fpe_f16x16_store(x + i, 0xffff, _mm512_fmadd_ps(w, _mm512_loadu_ps(s + i),
                                                        _mm512_mul_ps(v, _mm512_loadu_ps(c + i))));
    }
#endif
    for (; i + 8 <= n; i += 8) {
        const __m256 v = fpe_f16x8_load(x + i);
        const __m256 w = _mm256_permute_ps(v, 0xB1);   /* lanes 1 0 3 2 ... */
        fpe_f16x8_store(x + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(s + i),
                                               _mm256_mul_ps(v, _mm256_loadu_ps(c + i))));
    }
    for (; i + 1 < n; i += 2) {
        const float a = fpe_f16_load(x[i]), b = fpe_f16_load(x[i + 1]);
        x[i] = fpe_f16_make(FPE_PAIR_MADD_F(a, c[i], b, s[i]));
        x[i + 1] = fpe_f16_make(FPE_PAIR_MADD_F(b, c[i + 1], a, s[i + 1]));
    }
}

/* bfloat16 rows with `cvt` constant where inlined: 1 narrows by VCVTNE2PS2BF16
 * (fpe_bf16x16_store_inorder_cvt and its 512-bit form, in callers compiled for it) */
#if FPE_BF16_CVT
#define FPE_BF16X16_STORE_INORDER(cvt, p, lo, hi)                                      \
    do {                                                                               \
        if (cvt) fpe_bf16x16_store_inorder_cvt(p, lo, hi);                             \
        else fpe_bf16x16_store_inorder(p, lo, hi);                                     \
    } while (0)
#define FPE_BF16X32_STORE_INORDER(cvt, p, lo, hi)                                      \
    do {                                                                               \
        if (cvt) fpe_bf16x32_store_inorder_cvt(p, lo, hi);                             \
        else fpe_bf16x32_store_inorder(p, lo, hi);                                     \
    } while (0)
#else
#define FPE_BF16X16_STORE_INORDER(cvt, p, lo, hi) fpe_bf16x16_store_inorder(p, lo, hi)
#define FPE_BF16X32_STORE_INORDER(cvt, p, lo, hi) fpe_bf16x32_store_inorder(p, lo, hi)
#endif

static FPE_ALWAYS_INLINE void fpe_rotate_half_bf16_nc(fpe_bf16 *x, const float *c,
                                                      const float *s, Py_ssize_t half,
                                                      int cvt)
{
    fpe_bf16 *y = x + half;
    Py_ssize_t j = 0;
#if FPE_HALF_RUNS_512
    for (; j + 32 <= half; j += 32) {
        __m512 a0, a1, b0, b1;
        fpe_bf16x32_load_inorder(x + j, &a0, &a1);
        fpe_bf16 *yj = y + j;
        FPE_LOADED_FIRST(a0, yj);
        fpe_bf16x32_load_inorder(yj, &b0, &b1);
        const __m512 c0 = _mm512_loadu_ps(c + j), c1 = _mm512_loadu_ps(c + j + 16);
        const __m512 s0 = _mm512_loadu_ps(s + j), s1 = _mm512_loadu_ps(s + j + 16);
        FPE_BF16X32_STORE_INORDER(cvt, x + j,
                                  _mm512_fmsub_ps(a0, c0, _mm512_mul_ps(b0, s0)),
                                  _mm512_fmsub_ps(a1, c1, _mm512_mul_ps(b1, s1)));
        FPE_BF16X32_STORE_INORDER(cvt, yj, _mm512_fmadd_ps(b0, c0, _mm512_mul_ps(a0, s0)),
                                  _mm512_fmadd_ps(b1, c1, _mm512_mul_ps(a1, s1)));
    }
#endif
    for (; j + 16 <= half; j += 16) {
        __m256 a0, a1, b0, b1;
        fpe_bf16x16_load_inorder(x + j, &a0, &a1);
        fpe_bf16 *yj = y + j;
        FPE_LOADED_FIRST(a0, yj);
        fpe_bf16x16_load_inorder(yj, &b0, &b1);
        const __m256 c0 = _mm256_loadu_ps(c + j), c1 = _mm256_loadu_ps(c + j + 8);
        const __m256 s0 = _mm256_loadu_ps(s + j), s1 = _mm256_loadu_ps(s + j + 8);
        FPE_BF16X16_STORE_INORDER(cvt, x + j,
                                  _mm256_fmsub_ps(a0, c0, _mm256_mul_ps(b0, s0)),
                                  _mm256_fmsub_ps(a1, c1, _mm256_mul_ps(b1, s1)));
        FPE_BF16X16_STORE_INORDER(cvt, yj, _mm256_fmadd_ps(b0, c0, _mm256_mul_ps(a0, s0)),
                                  _mm256_fmadd_ps(b1, c1, _mm256_mul_ps(a1, s1)));
    }
    for (; j < half; j++) {
        const float a = fpe_bf16_load(x[j]), b = fpe_bf16_load(y[j]);
        x[j] = fpe_bf16_make(FPE_HALF_X_F(a, c[j], b, s[j]));
        y[j] = fpe_bf16_make(FPE_HALF_Y_F(a, c[j], b, s[j]));
    }
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_nc(fpe_bf16 *x, const float *c,
                                                       const float *s, Py_ssize_t n, int cvt)
{
    Py_ssize_t i = 0;
#if FPE_HALF_RUNS_512
    for (; i + 32 <= n; i += 32) {
        __m512 v0, v1;
        fpe_bf16x32_load_inorder(x + i, &v0, &v1);
        const __m512 c0 = _mm512_loadu_ps(c + i), c1 = _mm512_loadu_ps(c + i + 16);
        const __m512 s0 = _mm512_loadu_ps(s + i), s1 = _mm512_loadu_ps(s + i + 16);
        FPE_BF16X32_STORE_INORDER(
            cvt, x + i, _mm512_fmadd_ps(_mm512_permute_ps(v0, 0xB1), s0, _mm512_mul_ps(v0, c0)),
            _mm512_fmadd_ps(_mm512_permute_ps(v1, 0xB1), s1, _mm512_mul_ps(v1, c1)));
    }
#endif
    for (; i + 16 <= n; i += 16) {
        __m256 v0, v1;
        fpe_bf16x16_load_inorder(x + i, &v0, &v1);
        const __m256 c0 = _mm256_loadu_ps(c + i), c1 = _mm256_loadu_ps(c + i + 8);
        const __m256 s0 = _mm256_loadu_ps(s + i), s1 = _mm256_loadu_ps(s + i + 8);
        FPE_BF16X16_STORE_INORDER(
            cvt, x + i, _mm256_fmadd_ps(_mm256_permute_ps(v0, 0xB1), s0, _mm256_mul_ps(v0, c0)),
            _mm256_fmadd_ps(_mm256_permute_ps(v1, 0xB1), s1, _mm256_mul_ps(v1, c1)));
    }
    for (; i + 1 < n; i += 2) {
        const float a = fpe_bf16_load(x[i]), b = fpe_bf16_load(x[i + 1]);
        x[i] = fpe_bf16_make(FPE_PAIR_MADD_F(a, c[i], b, s[i]));
        x[i + 1] = fpe_bf16_make(FPE_PAIR_MADD_F(b, c[i + 1], a, s[i + 1]));
    }
}

/* Adjacent bfloat16 pairs read as 32-bit lanes, feature 2j in the low half and 2j + 1
 * in the high half: each widened by a shift or a mask (a bfloat16 is the top half of a
 * float32), rotated by one cos and one sin per pair (pc, ps: c's even entries and s's
 * odd ones, fpe_pairs_compact) and put back by one word blend or, narrowed by
 * VCVTNE2PS2BF16, one word permutation. The in-order loads and stores of
 * fpe_rotate_pairs_bf16_nc take four shuffles and four table loads per 32 features,
 * these one shuffle at most and two loads. fnmadd(b, sin, a cos) is fma(b, -sin, a cos)
 * exactly and the roundings are those of the in-order rows (fpe_bf16x8_bits' NaN
 * reasoning holds: every operand is a widened bfloat16 or a cos or sin whose NaNs were
 * cut to their top bits), so the same bits. Side by side on an Intel Xeon (Emerald
 * Rapids), a bfloat16 prefill (1, 2048, 32, 128) went from 69-72% of the floor to 74-78%
 * (the avx2 kernels 50-51% to 55-57%), a batched decode (32, 1, 32, 128) from 27.1-28.4
 * us to 23.8-24.1 us (avx2: 36.5-39.5 to 30.8-32.4 us). */
#define FPE_PACKED_PAIRS_MAX 256

static FPE_ALWAYS_INLINE void fpe_pairs_compact(const float *c, const float *s,
                                                Py_ssize_t half, float *pc, float *ps)
{
    for (Py_ssize_t j = 0; j < half; j++) {
        pc[j] = c[2 * j];
        ps[j] = s[2 * j + 1];
    }
}

/* the pairs' results of 16 (8) lanes, x the even features and y the odd ones, as
 * patterns in the top halves of their lanes (fpe_bf16x16_bits_high); in the _cvt forms
 * from VCVTNE2PS2BF16, put in their features' order by one word permutation, a vector
 * with a zero taking the rounding in integers as fpe_bf16x16_store_inorder_cvt does */
#if FPE_HALF_RUNS_512
static FPE_ALWAYS_INLINE __m512i fpe_bf16x32_pairs(__m512 x, __m512 y)
{
    return _mm512_mask_blend_epi16((__mmask32)0x55555555u, fpe_bf16x16_bits_high(y),
                                   _mm512_srli_epi32(fpe_bf16x16_bits_high(x), 16));
}
#endif

static FPE_ALWAYS_INLINE __m256i fpe_bf16x16_pairs(__m256 x, __m256 y)
{
    /* fpe_bf16x8_bits, y's before its shift: the pattern in the top half */
    const __m256i yb = _mm256_castps_si256(y);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(yb, 16), _mm256_set1_epi32(1));
    const __m256i ry = _mm256_add_epi32(_mm256_add_epi32(yb, _mm256_set1_epi32(0x7fff)), odd);
    return _mm256_or_si256(_mm256_and_si256(ry, _mm256_set1_epi32((int)0xffff0000u)),
                           fpe_bf16x8_bits(x));
}

#if FPE_BF16_CVT
#if FPE_HALF_RUNS_512
FPE_TARGET_BF16 static inline __m512i fpe_bf16x32_pairs_cvt(__m512 x, __m512 y)
{
    static const uint16_t order[32] = {
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i v = _mm512_permutexvar_epi16(_mm512_loadu_si512(order),
                                               (__m512i)_mm512_cvtne2ps_pbh(y, x));
    if (__builtin_expect(_mm512_testn_epi16_mask(v, _mm512_set1_epi16(0x7fff)) != 0, 0))
        return fpe_bf16x32_pairs(x, y);
    return v;
}
#endif

FPE_TARGET_BF16 static inline __m256i fpe_bf16x16_pairs_cvt(__m256 x, __m256 y)
{
    static const uint16_t order[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
    const __m256i v = _mm256_permutexvar_epi16(_mm256_loadu_si256((const __m256i *)order),
                                               (__m256i)_mm256_cvtne2ps_pbh(y, x));
    if (__builtin_expect(_mm256_testn_epi16_mask(v, _mm256_set1_epi16(0x7fff)) != 0, 0))
        return fpe_bf16x16_pairs(x, y);
    return v;
}
#define FPE_BF16X32_PAIRS(cvt, x, y) \
    ((cvt) ? fpe_bf16x32_pairs_cvt(x, y) : fpe_bf16x32_pairs(x, y))
#define FPE_BF16X16_PAIRS(cvt, x, y) \
    ((cvt) ? fpe_bf16x16_pairs_cvt(x, y) : fpe_bf16x16_pairs(x, y))
#else
#define FPE_BF16X32_PAIRS(cvt, x, y) fpe_bf16x32_pairs(x, y)
#define FPE_BF16X16_PAIRS(cvt, x, y) fpe_bf16x16_pairs(x, y)
#endif

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_packed_c(fpe_bf16 *x, const float *pc,
                                                             const float *ps, Py_ssize_t half,
                                                             int cvt)
{
    Py_ssize_t j = 0;
#if FPE_HALF_RUNS_512
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    for (; j + 16 <= half; j += 16) {
        const __m512i v = _mm512_loadu_si512(x + 2 * j);
        const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 b = _mm512_castsi512_ps(_mm512_and_si512(v, top));
        const __m512 cj = _mm512_loadu_ps(pc + j), sj = _mm512_loadu_ps(ps + j);
        _mm512_storeu_si512(x + 2 * j,
                            FPE_BF16X32_PAIRS(cvt,
                                              _mm512_fnmadd_ps(b, sj, _mm512_mul_ps(a, cj)),
                                              _mm512_fmadd_ps(a, sj, _mm512_mul_ps(b, cj))));
    }
#endif
    const __m256i top8 = _mm256_set1_epi32((int)0xffff0000u);
    for (; j + 8 <= half; j += 8) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(x + 2 * j));
        const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        const __m256 b = _mm256_castsi256_ps(_mm256_and_si256(v, top8));
        const __m256 cj = _mm256_loadu_ps(pc + j), sj = _mm256_loadu_ps(ps + j);
        _mm256_storeu_si256((__m256i *)(x + 2 * j),
                            FPE_BF16X16_PAIRS(cvt,
                                              _mm256_fnmadd_ps(b, sj, _mm256_mul_ps(a, cj)),
                                              _mm256_fmadd_ps(a, sj, _mm256_mul_ps(b, cj))));
    }
    for (; j < half; j++) {
        const float a = fpe_bf16_load(x[2 * j]), b = fpe_bf16_load(x[2 * j + 1]);
        x[2 * j] = fpe_bf16_make(FPE_PAIR_MADD_F(a, pc[j], b, -ps[j]));
        x[2 * j + 1] = fpe_bf16_make(FPE_PAIR_MADD_F(b, pc[j], a, ps[j]));
    }
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_packed(fpe_bf16 *x, const float *pc,
                                                           const float *ps, Py_ssize_t half)
{
    fpe_rotate_pairs_bf16_packed_c(x, pc, ps, half, 0);
}

static FPE_NOINLINE void fpe_rotate_pairs_bf16_packed_row(fpe_bf16 *x, const float *pc,
                                                          const float *ps, Py_ssize_t half)
{
    fpe_prefetch_lines(x, FPE_ROW_AHEAD, 4 * half, 0);
    FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_packed, x, pc, ps, half, 64, 32);
}

#if FPE_BF16_CVT
FPE_TARGET_BF16 static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_packed_cvt(
    fpe_bf16 *x, const float *pc, const float *ps, Py_ssize_t half)
{
    fpe_rotate_pairs_bf16_packed_c(x, pc, ps, half, 1);
}

FPE_TARGET_BF16 static FPE_NOINLINE void fpe_rotate_pairs_bf16_packed_row_cvt(
    fpe_bf16 *x, const float *pc, const float *ps, Py_ssize_t half)
{
    fpe_prefetch_lines(x, FPE_ROW_AHEAD, 4 * half, 0);
    FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_packed_cvt, x, pc, ps, half, 64, 32);
}
#endif

/* every head of a token, adjacent pairs of at most FPE_PACKED_PAIRS_MAX, as
 * fpe_rotate_heads_bf16 takes them (c and s: one value per feature). rotate_half rows
 * taken the same way (features 2i and 2i + 1 of each half in one lane, with their cos
 * and sin split into even and odd ones) measured no faster there than rows in order
 * (prefill 89-90% of the floor against 90-91%, batched decode 24.2-26.9 us against
 * 23.5-24.6 us): a batched decode's rows, in the caches, are bound by the rounding's
 * operations, not by shuffles. */
#define FPE_ROTATE_HEADS_PACKED(SUFFIX)                                                \
    do {                                                                               \
        const Py_ssize_t heads = hq > hk ? hq : hk;                                    \
        const Py_ssize_t group = fpe_half_heads_group(half);                           \
        if (cached)                                                                    \
            FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_packed##SUFFIX, half, 64, 32); \
        else                                                                           \
            FPE_HEADS_LOOP(fpe_rotate_pairs_bf16_packed_row##SUFFIX, half);            \
    } while (0)

#if FPE_BF16_CVT
FPE_TARGET_BF16 static FPE_NOINLINE void fpe_rotate_heads_bf16_pairs_cvt(
    fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_bf16 *k, Py_ssize_t hk, Py_ssize_t kh,
    const float *c, const float *s, Py_ssize_t half, int cached)
{
    FPE_ROTATE_HEADS_PACKED(_cvt);
}
#endif

static void fpe_rotate_heads_bf16_pairs(fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh,
                                        fpe_bf16 *k, Py_ssize_t hk, Py_ssize_t kh,
                                        const float *cf, const float *sf, Py_ssize_t half,
                                        int cached)
{
    float c[FPE_PACKED_PAIRS_MAX], s[FPE_PACKED_PAIRS_MAX];
    fpe_pairs_compact(cf, sf, half, c, s);
#if FPE_BF16_CVT
    if (fpe_bf16_cvt) {
        fpe_rotate_heads_bf16_pairs_cvt(q, hq, qh, k, hk, kh, c, s, half, cached);
        return;
    }
#endif
    FPE_ROTATE_HEADS_PACKED();
}

/* the two forms of each, in the signature FPE_AT_FIXED_WIDTH calls */
static FPE_ALWAYS_INLINE void fpe_rotate_half_bf16_n(fpe_bf16 *x, const float *c,
                                                     const float *s, Py_ssize_t half)
{
    fpe_rotate_half_bf16_nc(x, c, s, half, 0);
}

static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_n(fpe_bf16 *x, const float *c,
                                                      const float *s, Py_ssize_t n)
{
    fpe_rotate_pairs_bf16_nc(x, c, s, n, 0);
}

#if FPE_BF16_CVT
FPE_TARGET_BF16 static FPE_ALWAYS_INLINE void fpe_rotate_half_bf16_n_cvt(
    fpe_bf16 *x, const float *c, const float *s, Py_ssize_t half)
{
    fpe_rotate_half_bf16_nc(x, c, s, half, 1);
}

FPE_TARGET_BF16 static FPE_ALWAYS_INLINE void fpe_rotate_pairs_bf16_n_cvt(
    fpe_bf16 *x, const float *c, const float *s, Py_ssize_t n)
{
    fpe_rotate_pairs_bf16_nc(x, c, s, n, 1);
}

FPE_TARGET_BF16 static FPE_NOINLINE void fpe_rotate_bf16_cvt(fpe_bf16 *x, const float *c,
                                                             const float *s, Py_ssize_t half,
                                                             int neox)
{
    if (neox) FPE_AT_FIXED_WIDTH(fpe_rotate_half_bf16_n_cvt, x, c, s, half, 64, 32);
    else FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_n_cvt, x, c, s, 2 * half, 128, 64);
}
#endif

static FPE_ALWAYS_INLINE void fpe_rotate_f16(fpe_f16 *x, const float *c, const float *s,
                                             Py_ssize_t half, int neox)
{
    if (neox) FPE_AT_FIXED_WIDTH(fpe_rotate_half_f16_n, x, c, s, half, 64, 32);
    else FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_f16_n, x, c, s, 2 * half, 128, 64);
}

static FPE_ALWAYS_INLINE void fpe_rotate_bf16(fpe_bf16 *x, const float *c, const float *s,
                                              Py_ssize_t half, int neox)
{
#if FPE_BF16_CVT
    if (fpe_bf16_cvt) {
        fpe_rotate_bf16_cvt(x, c, s, half, neox);
        return;
    }
#endif
    if (neox) FPE_AT_FIXED_WIDTH(fpe_rotate_half_bf16_n, x, c, s, half, 64, 32);
    else FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_n, x, c, s, 2 * half, 128, 64);
}

/* fpe_rotate_heads_f32 for float16 and bfloat16 rows: every head of a token in one call */
static FPE_ALWAYS_INLINE void fpe_rotate_pairs_f16_ahead(fpe_f16 *x, const float *c,
                                                         const float *s, Py_ssize_t n)
{
    fpe_prefetch_lines(x, FPE_ROW_AHEAD, 2 * n, 0);
    fpe_rotate_pairs_f16_n(x, c, s, n);
}

static void fpe_rotate_heads_f16(fpe_f16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_f16 *k,
                                 Py_ssize_t hk, Py_ssize_t kh,
                                 const float *FPE_RESTRICT c, const float *FPE_RESTRICT s,
                                 Py_ssize_t half, int neox, int cached)
{
    const Py_ssize_t heads = hq > hk ? hq : hk, group = fpe_half_heads_group(half);
    if (!cached && !neox) {
        FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_f16_ahead, 2 * half, 128, 64);
        return;
    }
    if (neox) FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_half_f16_n, half, 64, 32);
    else FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_f16_n, 2 * half, 128, 64);
}

/* One row of bfloat16 per call, kept out of line (below), in both forms: rows streamed
 * from memory, adjacent pairs with the lines ahead fetched (fpe_prefetch_lines) */
#define FPE_BF16_ROW_FUNCTIONS(SUFFIX, ATTR)                                           \
    ATTR static FPE_NOINLINE void fpe_rotate_half_bf16_row##SUFFIX(                    \
        fpe_bf16 *x, const float *c, const float *s, Py_ssize_t half)                  \
    {                                                                                  \
        FPE_AT_FIXED_WIDTH(fpe_rotate_half_bf16_n##SUFFIX, x, c, s, half, 64, 32);     \
    }                                                                                  \
    ATTR static FPE_NOINLINE void fpe_rotate_pairs_bf16_row##SUFFIX(                   \
        fpe_bf16 *x, const float *c, const float *s, Py_ssize_t n)                     \
    {                                                                                  \
        fpe_prefetch_lines(x, FPE_ROW_AHEAD, 2 * n, 0);                                \
        FPE_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_n##SUFFIX, x, c, s, n, 128, 64);      \
    }

/* bfloat16 rows: inlined into the loop over heads where the call's rows are taken as in
 * the caches (`cached`, fpe_rope_cached_bytes: a batched decode took 0.61-0.65x the time
 * of a call per row), a call per row otherwise: on an AMD Zen 5 the inlined loop
 * streamed a prefill's rows from memory at 1.14-1.29x the time of a call per row, and a
 * call per row took 0.85-1.02x the time of the per-row path before this function. */
#define FPE_ROTATE_HEADS_BF16(SUFFIX)                                                  \
    do {                                                                               \
        const Py_ssize_t heads = hq > hk ? hq : hk;                                    \
        const Py_ssize_t group = fpe_half_heads_group(half);                           \
        if (!cached && !(neox && fpe_rotate_half_lines)) {                             \
            if (neox) FPE_HEADS_LOOP(fpe_rotate_half_bf16_row##SUFFIX, half);          \
            else FPE_HEADS_LOOP(fpe_rotate_pairs_bf16_row##SUFFIX, 2 * half);          \
            return;                                                                    \
        }                                                                              \
        if (neox)                                                                      \
            FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_half_bf16_n##SUFFIX, half, 64, 32);    \
        else                                                                           \
            FPE_HEADS_AT_FIXED_WIDTH(fpe_rotate_pairs_bf16_n##SUFFIX, 2 * half, 128, 64); \
    } while (0)

FPE_BF16_ROW_FUNCTIONS(, )

#if FPE_BF16_CVT
FPE_BF16_ROW_FUNCTIONS(_cvt, FPE_TARGET_BF16)

FPE_TARGET_BF16 static FPE_NOINLINE void fpe_rotate_heads_bf16_cvt(
    fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_bf16 *k, Py_ssize_t hk, Py_ssize_t kh,
    const float *FPE_RESTRICT c, const float *FPE_RESTRICT s, Py_ssize_t half, int neox,
    int cached)
{
    FPE_ROTATE_HEADS_BF16(_cvt);
}
#endif

static void fpe_rotate_heads_bf16(fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_bf16 *k,
                                  Py_ssize_t hk, Py_ssize_t kh,
                                  const float *FPE_RESTRICT c, const float *FPE_RESTRICT s,
                                  Py_ssize_t half, int neox, int cached)
{
    if (!neox && half <= FPE_PACKED_PAIRS_MAX) {
        fpe_rotate_heads_bf16_pairs(q, hq, qh, k, hk, kh, c, s, half, cached);
        return;
    }
#if FPE_BF16_CVT
    if (fpe_bf16_cvt) {
        fpe_rotate_heads_bf16_cvt(q, hq, qh, k, hk, kh, c, s, half, neox, cached);
        return;
    }
#endif
    FPE_ROTATE_HEADS_BF16();
}
#else
#define FPE_HALF_ROTATE 0
static inline void fpe_rotate_f16(fpe_f16 *x, const float *c, const float *s,
                                  Py_ssize_t half, int neox)
{
    (void)x; (void)c; (void)s; (void)half; (void)neox;
}
static inline void fpe_rotate_bf16(fpe_bf16 *x, const float *c, const float *s,
                                   Py_ssize_t half, int neox)
{
    (void)x; (void)c; (void)s; (void)half; (void)neox;
}
static inline void fpe_rotate_heads_f16(fpe_f16 *q, Py_ssize_t hq, Py_ssize_t qh, fpe_f16 *k,
                                        Py_ssize_t hk, Py_ssize_t kh, const float *c,
                                        const float *s, Py_ssize_t half, int neox,
                                        int cached)
{
    (void)q; (void)hq; (void)qh; (void)k; (void)hk; (void)kh; (void)c; (void)s; (void)half;
    (void)neox; (void)cached;
}
static inline void fpe_rotate_heads_bf16(fpe_bf16 *q, Py_ssize_t hq, Py_ssize_t qh,
                                         fpe_bf16 *k, Py_ssize_t hk, Py_ssize_t kh,
                                         const float *c, const float *s, Py_ssize_t half,
                                         int neox, int cached)
{
    (void)q; (void)hq; (void)qh; (void)k; (void)hk; (void)kh; (void)c; (void)s; (void)half;
    (void)neox; (void)cached;
}
#endif

/* ---- a sinusoidal table row written straight to memory ---------------------
 * pe[2i], pe[2i + 1] = (float)(s[i] * mult), (float)(c[i] * mult) (and the odd last
 * feature), as the table's row loop computes them, stored with non-temporal
 * stores: a table larger than the caches is not read back by the call, so its
 * lines need not be fetched first (a store that misses reads the line, then
 * writes it: twice the traffic of the bytes written). Only whole 64-byte lines
 * stream; the row's ends and rows whose pairs cannot be aligned use plain stores. A
 * line written partly by plain stores and partly by streaming ones (the line two
 * rows share when a row is not 64-byte aligned) measured 2x slower for the whole
 * table. fpe_stream_fence() after the last row makes them visible in order.
 */
static inline void fpe_pe_row_stream_f32(const double *s, const double *c, float *pe,
                                         Py_ssize_t dim, Py_ssize_t nfreq, double mult)
{
    const Py_ssize_t ncos = dim / 2;
    Py_ssize_t i = 0;
#if FPE_PAIRS_AVX2
    fpe_prefetch_row_ends(pe, dim * sizeof(float));
    if (((uintptr_t)pe & 7) == 0) {
        for (; i < ncos && ((uintptr_t)(pe + 2 * i) & 63); i++) {
            pe[2 * i] = (float)(s[i] * mult);
            pe[2 * i + 1] = (float)(c[i] * mult);
        }
        const __m256d m = _mm256_set1_pd(mult);
        const Py_ssize_t body = i + (ncos - i) / 8 * 8;   /* whole lines */
        for (; i < body; i += 4) {
            const __m128 s4 = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(s + i), m));
            const __m128 c4 = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(c + i), m));
            _mm256_stream_ps(pe + 2 * i, _mm256_set_m128(_mm_unpackhi_ps(s4, c4),
                                                          _mm_unpacklo_ps(s4, c4)));
        }
    }
#endif
    for (; i < ncos; i++) {
        pe[2 * i] = (float)(s[i] * mult);
        pe[2 * i + 1] = (float)(c[i] * mult);
    }
    if (nfreq > ncos)
        pe[dim - 1] = (float)(s[nfreq - 1] * mult);
}

/* fpe_pe_row_stream_f32 for a float64 table: pe[2i], pe[2i + 1] = s[i] * mult,
 * c[i] * mult (and the odd last feature), as pe_row computes them, whole 64-byte lines
 * (four pairs) with streaming stores, the rest with plain ones; rows whose pairs never
 * reach a line boundary (8 bytes past 16) go plainly. */
static inline void fpe_pe_row_stream_f64(const double *s, const double *c, double *pe,
                                         Py_ssize_t dim, Py_ssize_t nfreq, double mult)
{
    const Py_ssize_t ncos = dim / 2;
    Py_ssize_t i = 0;
#if FPE_PAIRS_AVX2
    fpe_prefetch_row_ends(pe, dim * sizeof(double));
    for (; i < ncos && ((uintptr_t)(pe + 2 * i) & 63); i++) {
        pe[2 * i] = s[i] * mult;
        pe[2 * i + 1] = c[i] * mult;
    }
    const __m256d m = _mm256_set1_pd(mult);
    const Py_ssize_t body = i + (ncos - i) / 4 * 4;   /* whole lines */
    for (; i < body; i += 4) {
        const __m256d a = _mm256_mul_pd(_mm256_loadu_pd(s + i), m);
        const __m256d b = _mm256_mul_pd(_mm256_loadu_pd(c + i), m);
        const __m256d lo = _mm256_unpacklo_pd(a, b), hi = _mm256_unpackhi_pd(a, b);
        _mm256_stream_pd(pe + 2 * i, _mm256_permute2f128_pd(lo, hi, 0x20));
        _mm256_stream_pd(pe + 2 * i + 4, _mm256_permute2f128_pd(lo, hi, 0x31));
    }
#endif
    for (; i < ncos; i++) {
        pe[2 * i] = s[i] * mult;
        pe[2 * i + 1] = c[i] * mult;
    }
    if (nfreq > ncos)
        pe[dim - 1] = s[nfreq - 1] * mult;
}

/* Two consecutive interleaved float32 rows at once: (s, c) of the row before t
 * advance by one token step (the angle-addition formulas, s' = s sc + c ss fused as
 * advance_angles compiles them: the same bits) to row t, written to pe0, and again to
 * row t + 1, written to pe1, where (s, c) are left. Per frequency the angles stay in
 * registers between the two rows and each row is written as it is made: the
 * row-by-row form stores and reloads them, and making rows is bound by that
 * arithmetic, not by memory (measured 1.3x faster). mult = 1 skips the product,
 * which would not change a bit. With `stream`, whole lines go out with
 * non-temporal stores as in fpe_pe_row_stream_f32, and the call returns 0, having
 * done nothing, where the two rows cannot share that loop (not 8-byte aligned, or at
 * different alignments modulo 64 bytes); else plain stores, at any alignment.
 * With neither AVX2 + FMA nor SSE2 it returns 0.
 * nx > 0 (not with `stream`): the rows are also added as they are made, in registers,
 * to nx batch rows of x, xs elements apart, starting at x0 (token t) and x1 (token
 * t + 1): x = x * xscale + pe, rounded as fpe_f32_madd_rows rounds (the same bits);
 * float32 rows, or float16 with `half` (only where FPE_HALF_ADD_RUNS: widened, added
 * and narrowed in registers as fpe_f16_madd_rows does).
 * Making the rows leaves memory idle and adding them leaves the arithmetic ports idle:
 * one instruction stream doing both overlaps them, where a batch row added after each
 * pair of rows is made overlapped them in part (the out-of-order window is shorter
 * than the two rows): on an Intel Xeon the baseline's add_sinusoidal (8, 2048, 1024)
 * took 0.9x the time so. */
#define FPE_PE_ROWS2 (FPE_PAIRS_AVX2 || FPE_PAIRS_SSE2)  /* it makes rows (not a table's) */
/* fpe_pe_rows2_f32's adds of a vector of each row (at column j) into x's rows: LOAD,
 * STORE, ADD and MADD (a * s + p) name the width's operations */
#define FPE_PE_ADD2(V, LOAD, STORE, ADD, MADD, r1, r2, j)                               \
    do {                                                                               \
        for (Py_ssize_t xr_ = 0; xr_ < nx; xr_++) {                                    \
            float *a0_ = (float *)x0 + xr_ * xs + (j);                                 \
            float *a1_ = (float *)x1 + xr_ * xs + (j);                                 \
            const V u0_ = LOAD(a0_), u1_ = LOAD(a1_);                                  \
            STORE(a0_, xplain ? ADD(u0_, (r1)) : MADD(u0_, xsv, (r1)));                 \
            STORE(a1_, xplain ? ADD(u1_, (r2)) : MADD(u1_, xsv, (r2)));                 \
        }                                                                              \
    } while (0)
#define FPE_SSE2_MADD(a, s, p) _mm_add_ps(_mm_mul_ps((a), (s)), (p))
/* the same on float16 rows: LOAD (fpe_f16 *) and STORE (fpe_f16 *, v) convert */
#define FPE_PE_ADD2_F16(LOAD, STORE, MADD, r1, r2, j)                                   \
    do {                                                                               \
        for (Py_ssize_t xr_ = 0; xr_ < nx; xr_++) {                                    \
            fpe_f16 *a0_ = (fpe_f16 *)x0 + xr_ * xs + (j);                             \
            fpe_f16 *a1_ = (fpe_f16 *)x1 + xr_ * xs + (j);                             \
            STORE(a0_, MADD(LOAD(a0_), xsv, (r1)));                                    \
            STORE(a1_, MADD(LOAD(a1_), xsv, (r2)));                                    \
        }                                                                              \
    } while (0)
#if FPE_HALF_RUNS_512
#define FPE_F16X16_LOAD(p) fpe_f16x16_load((p), (__mmask16)0xffff)
#define FPE_F16X16_STORE(p, v) fpe_f16x16_store((p), (__mmask16)0xffff, (v))
#endif
/* fpe_pe_rows2_f32's last frequencies, one at a time: frequency i's (sin, cos) of rows
 * t and t + 1 into their interleaved columns (an odd dim's last, a sine alone) */
static FPE_ALWAYS_INLINE void fpe_pe_pairs2_store(float *pe0, float *pe1, Py_ssize_t i,
                                                  Py_ssize_t ncos, Py_ssize_t dim, double s1,
                                                  double c1, double s2, double c2,
                                                  double mult)
{
    if (i < ncos) {
        pe0[2 * i] = (float)(s1 * mult);
        pe0[2 * i + 1] = (float)(c1 * mult);
        pe1[2 * i] = (float)(s2 * mult);
        pe1[2 * i + 1] = (float)(c2 * mult);
    } else {
        pe0[dim - 1] = (float)(s1 * mult);
        pe1[dim - 1] = (float)(s2 * mult);
    }
}

/* fpe_pe_rows2_f32's adds of columns from..dim - 1: the row adds themselves, whose
 * rounding the vector adds above follow */
static FPE_ALWAYS_INLINE void fpe_pe_add2_tail(const float *pe0, const float *pe1,
                                               void *x0, void *x1, Py_ssize_t nx, int half,
                                               Py_ssize_t xs, float xscale, Py_ssize_t from,
                                               Py_ssize_t dim)
{
    if (nx == 0 || from >= dim)
        return;
#if FPE_HALF_ADD_RUNS
    if (half) {
        fpe_f16_madd_rows((fpe_f16 *)x0 + from, nx, xs, pe0 + from, dim - from, xscale, 0);
        fpe_f16_madd_rows((fpe_f16 *)x1 + from, nx, xs, pe1 + from, dim - from, xscale, 0);
        return;
    }
#endif
    (void)half;
    fpe_f32_madd_rows((float *)x0 + from, nx, xs, pe0 + from, dim - from, xscale, 0);
    fpe_f32_madd_rows((float *)x1 + from, nx, xs, pe1 + from, dim - from, xscale, 0);
}

static inline int fpe_pe_rows2_f32(double *s, double *c, const double *step_s,
                                   const double *step_c, float *pe0, float *pe1,
                                   Py_ssize_t dim, Py_ssize_t nfreq, double mult, int stream,
                                   void *x0, void *x1, Py_ssize_t nx, int half,
                                   Py_ssize_t xs, float xscale)
{
    const int xplain = xscale == 1.0f;
#if !FPE_HALF_ADD_RUNS
    if (half && nx)
        return 0;   /* no conversions in registers here: the caller adds the rows */
#endif
#if FPE_PAIRS_AVX2
    const Py_ssize_t ncos = dim / 2;
    if (stream && (((uintptr_t)pe0 & 7) || (((uintptr_t)pe0 ^ (uintptr_t)pe1) & 63)))
        return 0;
    Py_ssize_t i = 0, head = 0;
    while (stream && head < ncos && ((uintptr_t)(pe0 + 2 * head) & 63))
        head++;
    const Py_ssize_t body = head + (ncos - head) / 8 * 8;   /* whole lines, as above */
    if (stream) {
        /* rows not on line boundaries: the line each row shares with the next takes
         * plain stores, each a miss that holds back the streaming stores queued behind
         * it until the line arrives. Asked for now, for writing: the lines pe1's row
         * and the next three rows end in (this call's last store, then the next two
         * pairs'). On a Zen 4 (avx2 kernels) a (8192, 1024) float32 table 16 bytes
         * past a line (where NumPy puts a large array) took 1.06-1.10x the time of one
         * on a line boundary so, 1.03-1.5x (unsteady) asking one pair ahead, 1.36-1.54x
         * without. */
        fpe_prefetch_row_ends(pe1, dim * sizeof(float));
    }
    const __m256d m = _mm256_set1_pd(mult);
    const int scaled = mult != 1.0;
    for (; i < nfreq; i++) {
        if (i == head && i < body) {
#if defined(__AVX512F__)
            /* the avx512 variant: 8 frequencies at a time, the same operations on every
             * element, each row's 8 (sin, cos) pairs one 64-byte store (a whole line:
             * body - head is a multiple of 8) */
            const __m512d m8 = _mm512_set1_pd(mult);
            const __m512i lace = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19,
                                                   4, 20, 5, 21, 6, 22, 7, 23);
            for (; i < body; i += 8) {
                const __m512d ss = _mm512_loadu_pd(step_s + i), sc = _mm512_loadu_pd(step_c + i);
                const __m512d s0 = _mm512_loadu_pd(s + i), c0 = _mm512_loadu_pd(c + i);
                const __m512d s1 = _mm512_fmadd_pd(s0, sc, _mm512_mul_pd(c0, ss));
                const __m512d c1 = _mm512_fmsub_pd(c0, sc, _mm512_mul_pd(s0, ss));
                const __m512d s2 = _mm512_fmadd_pd(s1, sc, _mm512_mul_pd(c1, ss));
                const __m512d c2 = _mm512_fmsub_pd(c1, sc, _mm512_mul_pd(s1, ss));
                _mm512_storeu_pd(s + i, s2);
                _mm512_storeu_pd(c + i, c2);
                const __m256 a1 = _mm512_cvtpd_ps(scaled ? _mm512_mul_pd(s1, m8) : s1);
                const __m256 b1 = _mm512_cvtpd_ps(scaled ? _mm512_mul_pd(c1, m8) : c1);
                const __m256 a2 = _mm512_cvtpd_ps(scaled ? _mm512_mul_pd(s2, m8) : s2);
                const __m256 b2 = _mm512_cvtpd_ps(scaled ? _mm512_mul_pd(c2, m8) : c2);
                const __m512 r1 = _mm512_permutex2var_ps(_mm512_castps256_ps512(a1), lace,
                                                         _mm512_castps256_ps512(b1));
                const __m512 r2 = _mm512_permutex2var_ps(_mm512_castps256_ps512(a2), lace,
                                                         _mm512_castps256_ps512(b2));
                if (stream) {
                    _mm512_stream_ps(pe0 + 2 * i, r1);
                    _mm512_stream_ps(pe1 + 2 * i, r2);
                } else {
                    _mm512_storeu_ps(pe0 + 2 * i, r1);
                    _mm512_storeu_ps(pe1 + 2 * i, r2);
                    const __m512 xsv = _mm512_set1_ps(xscale);
#if FPE_HALF_RUNS_512 && FPE_HALF_ADD_RUNS
                    if (half)
                        FPE_PE_ADD2_F16(FPE_F16X16_LOAD, FPE_F16X16_STORE, _mm512_fmadd_ps,
                                        r1, r2, 2 * i);
                    else
#endif
                        FPE_PE_ADD2(__m512, _mm512_loadu_ps, _mm512_storeu_ps,
                                    _mm512_add_ps, _mm512_fmadd_ps, r1, r2, 2 * i);
                }
            }
#endif
            for (; i < body; i += 4) {
                const __m256d ss = _mm256_loadu_pd(step_s + i), sc = _mm256_loadu_pd(step_c + i);
                const __m256d s0 = _mm256_loadu_pd(s + i), c0 = _mm256_loadu_pd(c + i);
                const __m256d s1 = _mm256_fmadd_pd(s0, sc, _mm256_mul_pd(c0, ss));
                const __m256d c1 = _mm256_fmsub_pd(c0, sc, _mm256_mul_pd(s0, ss));
                const __m256d s2 = _mm256_fmadd_pd(s1, sc, _mm256_mul_pd(c1, ss));
                const __m256d c2 = _mm256_fmsub_pd(c1, sc, _mm256_mul_pd(s1, ss));
                _mm256_storeu_pd(s + i, s2);
                _mm256_storeu_pd(c + i, c2);
                const __m128 a1 = _mm256_cvtpd_ps(scaled ? _mm256_mul_pd(s1, m) : s1);
                const __m128 b1 = _mm256_cvtpd_ps(scaled ? _mm256_mul_pd(c1, m) : c1);
                const __m128 a2 = _mm256_cvtpd_ps(scaled ? _mm256_mul_pd(s2, m) : s2);
                const __m128 b2 = _mm256_cvtpd_ps(scaled ? _mm256_mul_pd(c2, m) : c2);
                const __m256 r1 = _mm256_set_m128(_mm_unpackhi_ps(a1, b1),
                                                  _mm_unpacklo_ps(a1, b1));
                const __m256 r2 = _mm256_set_m128(_mm_unpackhi_ps(a2, b2),
                                                  _mm_unpacklo_ps(a2, b2));
                if (stream) {
                    _mm256_stream_ps(pe0 + 2 * i, r1);
                    _mm256_stream_ps(pe1 + 2 * i, r2);
                } else {
                    _mm256_storeu_ps(pe0 + 2 * i, r1);
                    _mm256_storeu_ps(pe1 + 2 * i, r2);
                    const __m256 xsv = _mm256_set1_ps(xscale);
#if FPE_HALF_ADD_RUNS
                    if (half)
                        FPE_PE_ADD2_F16(fpe_f16x8_load, fpe_f16x8_store, _mm256_fmadd_ps,
                                        r1, r2, 2 * i);
                    else
#endif
                        FPE_PE_ADD2(__m256, _mm256_loadu_ps, _mm256_storeu_ps,
                                    _mm256_add_ps, _mm256_fmadd_ps, r1, r2, 2 * i);
                }
            }
            if (i >= nfreq)
                break;
        }
        const double s1 = fma(s[i], step_c[i], c[i] * step_s[i]);
        const double c1 = fma(c[i], step_c[i], -(s[i] * step_s[i]));
        const double s2 = fma(s1, step_c[i], c1 * step_s[i]);
        const double c2 = fma(c1, step_c[i], -(s1 * step_s[i]));
        s[i] = s2;
        c[i] = c2;
        fpe_pe_pairs2_store(pe0, pe1, i, ncos, dim, s1, c1, s2, c2, mult);
    }
    fpe_pe_add2_tail(pe0, pe1, x0, x1, nx, half, xs, xscale, 2 * body, dim);
    return 1;
#elif FPE_PAIRS_SSE2
    /* the baseline: two frequencies at a time, each product rounded and then summed as
     * advance_angles compiles without FMA (the same bits); a table's streamed rows
     * go one at a time (0) */
    if (stream)
        return 0;
    const Py_ssize_t ncos = dim / 2, body = ncos / 2 * 2;
    const __m128d m = _mm_set1_pd(mult);
    const int scaled = mult != 1.0;
    Py_ssize_t i = 0;
    for (; i < body; i += 2) {
        const __m128d ss = _mm_loadu_pd(step_s + i), sc = _mm_loadu_pd(step_c + i);
        const __m128d s0 = _mm_loadu_pd(s + i), c0 = _mm_loadu_pd(c + i);
        const __m128d s1 = _mm_add_pd(_mm_mul_pd(s0, sc), _mm_mul_pd(c0, ss));
        const __m128d c1 = _mm_sub_pd(_mm_mul_pd(c0, sc), _mm_mul_pd(s0, ss));
        const __m128d s2 = _mm_add_pd(_mm_mul_pd(s1, sc), _mm_mul_pd(c1, ss));
        const __m128d c2 = _mm_sub_pd(_mm_mul_pd(c1, sc), _mm_mul_pd(s1, ss));
        _mm_storeu_pd(s + i, s2);
        _mm_storeu_pd(c + i, c2);
        const __m128 a1 = _mm_cvtpd_ps(scaled ? _mm_mul_pd(s1, m) : s1);
        const __m128 b1 = _mm_cvtpd_ps(scaled ? _mm_mul_pd(c1, m) : c1);
        const __m128 a2 = _mm_cvtpd_ps(scaled ? _mm_mul_pd(s2, m) : s2);
        const __m128 b2 = _mm_cvtpd_ps(scaled ? _mm_mul_pd(c2, m) : c2);
        const __m128 r1 = _mm_unpacklo_ps(a1, b1), r2 = _mm_unpacklo_ps(a2, b2);
        _mm_storeu_ps(pe0 + 2 * i, r1);
        _mm_storeu_ps(pe1 + 2 * i, r2);
        const __m128 xsv = _mm_set1_ps(xscale);
        FPE_PE_ADD2(__m128, _mm_loadu_ps, _mm_storeu_ps, _mm_add_ps, FPE_SSE2_MADD, r1, r2,
                    2 * i);
    }
    for (; i < nfreq; i++) {
        const double s1 = s[i] * step_c[i] + c[i] * step_s[i];
        const double c1 = c[i] * step_c[i] - s[i] * step_s[i];
        const double s2 = s1 * step_c[i] + c1 * step_s[i];
        const double c2 = c1 * step_c[i] - s1 * step_s[i];
        s[i] = s2;
        c[i] = c2;
        fpe_pe_pairs2_store(pe0, pe1, i, ncos, dim, s1, c1, s2, c2, mult);
    }
    fpe_pe_add2_tail(pe0, pe1, x0, x1, nx, half, xs, xscale, 2 * body, dim);
    return 1;
#else
    (void)s; (void)c; (void)step_s; (void)step_c; (void)pe0; (void)pe1;
    (void)dim; (void)nfreq; (void)mult; (void)stream; (void)x0; (void)x1; (void)nx;
    (void)half; (void)xs; (void)xscale; (void)xplain;
    return 0;
#endif
}

/* ---- rows of a transposed view, copied to and from row-major scratch -------
 * tmp[r * w + f] holds feature f of row r, which in memory is mem[r + f * sd]: the
 * rows adjacent (unit stride), the features sd apart. fpe_rows_copy_f32 copies into
 * tmp (gather) or back out of it; whole groups of 8 rows move as 8 x 8 blocks
 * transposed in registers (its own inverse), 8 loads and 8 stores where one element
 * at a time takes 64 of each. It returns the rows done (a multiple of 8, 0 without
 * AVX2); the caller copies the rest. */
#if FPE_PAIRS_AVX2
static FPE_ALWAYS_INLINE void fpe_transpose8_f32(__m256 *v)
{
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    v[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    v[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    v[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    v[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#endif

static inline Py_ssize_t fpe_rows_copy_f32(float *mem, Py_ssize_t sd, float *tmp, Py_ssize_t w,
                                           Py_ssize_t n, int gather)
{
#if FPE_PAIRS_AVX2
    const Py_ssize_t n8 = n / 8 * 8, w8 = w / 8 * 8;
    __m256 v[8];
    for (Py_ssize_t r0 = 0; r0 < n8; r0 += 8) {
        Py_ssize_t f0 = 0;
        for (; f0 < w8; f0 += 8) {
            float *m = mem + r0 + f0 * sd, *t = tmp + r0 * w + f0;
            for (int i = 0; i < 8; i++)
                v[i] = gather ? _mm256_loadu_ps(m + i * sd) : _mm256_loadu_ps(t + i * w);
            fpe_transpose8_f32(v);
            for (int i = 0; i < 8; i++) {
                if (gather)
                    _mm256_storeu_ps(t + i * w, v[i]);
                else
                    _mm256_storeu_ps(m + i * sd, v[i]);
            }
        }
        for (; f0 < w; f0++)
            for (Py_ssize_t r = r0; r < r0 + 8; r++) {
                if (gather)
                    tmp[r * w + f0] = mem[r + f0 * sd];
                else
                    mem[r + f0 * sd] = tmp[r * w + f0];
            }
    }
    return n8;
#else
    (void)mem; (void)sd; (void)tmp; (void)w; (void)n; (void)gather;
    return 0;
#endif
}

static inline void fpe_stream_fence(void)
{
#if FPE_PAIRS_AVX2
    _mm_sfence();
#endif
}

/* ---- sin and cos of p * w[i] ----------------------------------------------
 * Angles are formed in double and reduced modulo pi/2 with a three-part
 * Cody-Waite split of pi/2 (33 significant bits each, so n * part is exact
 * for quadrant counts n < 2^20); the remainder |r| <= pi/4 goes through
 * minimax polynomials (the classic fdlibm kernel coefficients). The error
 * is about one double ulp, far below what a float32 result can show, and
 * the loop is branch-free so it vectorises. Rows whose largest angle is past
 * FPE_FAST_ANGLE_LIMIT fall back to libm, which reduces any argument exactly.
 * Rows of float32 values that no recurrence advances from (decode rows) take float32
 * polynomials on the double-reduced angle instead (fpe_sincos_f32): about 1.5 float32
 * ulp, in about 0.6x the time.
 */
#define FPE_FAST_ANGLE_LIMIT 1.0e6

#define FPE_TWO_OVER_PI 6.36619772367581382433e-01
#define FPE_PIO2_A 1.57079632673412561417e+00
#define FPE_PIO2_B 6.07710050630396597660e-11
#define FPE_PIO2_C 2.02226624871116645580e-21
#define FPE_PIO2_D 8.47842766036889956997e-32
/* 1.5 * 2^52: adding and subtracting it rounds a double to an integer */
#define FPE_ROUND_MAGIC 6755399441055744.0

static inline void fpe_sincos_reduced(double r, double *s, double *c)
{
    const double z = r * r;
    const double sp = -1.66666666666666324348e-01 + z * (8.33333333332248946124e-03
        + z * (-1.98412698298579493134e-04 + z * (2.75573137070700676789e-06
        + z * (-2.50507602534068634195e-08 + z * 1.58969099521155010221e-10))));
    const double cp = 4.16666666666666019037e-02 + z * (-1.38888888888741095749e-03
        + z * (2.48015872894767294178e-05 + z * (-2.75573143513906633035e-07
        + z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11))));
    *s = r + r * z * sp;
    *c = 1.0 - 0.5 * z + z * z * cp;
}

/* x - q pi/2 for the nearest integer q (into *q), |x| <= FPE_FAST_ANGLE_LIMIT */
static inline double fpe_reduce_pio2(double x, int *q)
{
    const double fn = (x * FPE_TWO_OVER_PI + FPE_ROUND_MAGIC) - FPE_ROUND_MAGIC;
    *q = (int)fn;
    return (((x - fn * FPE_PIO2_A) - fn * FPE_PIO2_B) - fn * FPE_PIO2_C) - fn * FPE_PIO2_D;
}

/* scale * (sin x, cos x) for |x| <= FPE_FAST_ANGLE_LIMIT; branch-free, so the
 * loops that call it vectorise. */
static inline void fpe_sincos_fast(double x, double scale, double *s, double *c)
{
    int q;
    const double r = fpe_reduce_pio2(x, &q);
    double sr, cr;
    fpe_sincos_reduced(r, &sr, &cr);
    /* quadrant q: sin(x) = (s, c, -s, -c)[q & 3], cos(x) = (c, -s, -c, s)[q & 3] */
    const double so = (q & 1) ? cr : sr;
    const double co = (q & 1) ? sr : cr;
    *s = ((q & 2) ? -scale : scale) * so;
    *c = (((q + 1) & 2) ? -scale : scale) * co;
}

/* max |v[i]|, NaN when some v[i] is NaN: with the sign bit cleared, doubles order as
 * their bit patterns do as integers (every NaN above infinity above every finite value),
 * so this is an integer maximum, exact, in four independent lanes that any compiler
 * keeps in registers (the RoPE entries check a call's frequencies with it: a running
 * floating maximum with an early exit was 5% of a baseline decode call). */
static inline double fpe_abs_max_nan(const double *v, Py_ssize_t n)
{
    const uint64_t magnitude = 0x7fffffffffffffffULL;
    uint64_t m[4] = {0, 0, 0, 0}, b;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int l = 0; l < 4; l++) {
            memcpy(&b, v + i + l, sizeof b);
            b &= magnitude;
            m[l] = b > m[l] ? b : m[l];
        }
    }
    for (; i < n; i++) {
        memcpy(&b, v + i, sizeof b);
        b &= magnitude;
        m[0] = b > m[0] ? b : m[0];
    }
    m[0] = m[1] > m[0] ? m[1] : m[0];
    m[2] = m[3] > m[2] ? m[3] : m[2];
    m[0] = m[2] > m[0] ? m[2] : m[0];
    double out;
    memcpy(&out, &m[0], sizeof out);
    return out;
}

/* max |v[i]| (NaNs ignored), in independent lanes: one running maximum is a chain of
 * dependent max instructions, 4 cycles each, and a decode call takes this maximum of
 * its 64 frequencies for every token (17% of a batched decode's angle time). max is
 * exact, so the lanes give the serial loop's value. */
static inline double fpe_abs_max(const double *v, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    double m = 0.0;
#if FPE_PAIRS_AVX2
    if (n >= 8) {
        const __m256d mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
        __m256d m0 = _mm256_setzero_pd(), m1 = _mm256_setzero_pd();
        for (; i + 8 <= n; i += 8) {
            /* max_pd(a, b) is (a > b ? a : b): a NaN in v leaves the lane as it was */
            m0 = _mm256_max_pd(_mm256_and_pd(_mm256_loadu_pd(v + i), mask), m0);
            m1 = _mm256_max_pd(_mm256_and_pd(_mm256_loadu_pd(v + i + 4), mask), m1);
        }
        double lanes[4];
        _mm256_storeu_pd(lanes, _mm256_max_pd(m0, m1));
        for (int l = 0; l < 4; l++)
            m = lanes[l] > m ? lanes[l] : m;
    }
#endif
    for (; i < n; i++)
        m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

/* s[i] = scale * sin(p[i * p_step] * w[i]), c[i] likewise with cos, for i < n: p_step
 * 0 for one position for the row, 1 for a position per element (the angles of
 * multi-axis positions; equal positions give the row's bits). w_max = fpe_abs_max(w, n):
 * the frequencies of a call are the same for every token, so their maximum is taken
 * once (per token it was a fifth of a batched decode's angle time on an Intel Xeon). */
static inline void fpe_sincos(const double *p, Py_ssize_t p_step, const double *w,
                              double w_max, double *s, double *c, Py_ssize_t n, double scale)
{
    const double p_max = p_step ? fpe_abs_max(p, n) : fabs(p[0]);
    if (p_max * w_max > FPE_FAST_ANGLE_LIMIT) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const double x = p[i * p_step] * w[i];
            s[i] = scale * sin(x);
            c[i] = scale * cos(x);
        }
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        fpe_sincos_fast(p[i * p_step] * w[i], scale, s + i, c + i);
}

/* float32 sin and cos of a reduced angle |r| <= pi/4: polynomials of degree 7 and 8
 * (Cephes' single-precision coefficients), within about one float32 ulp. */
static inline void fpe_sincos_reduced_f(float r, float *s, float *c)
{
    const float z = r * r;
    *s = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
    *c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f
                                     + z * 2.443315711809948e-5f));
}

/* sin_scale * sin x, cos_scale * cos x in float32 (ss, cs: the scales as floats), for
 * |x| <= FPE_FAST_ANGLE_LIMIT: reduced in double as fpe_sincos_fast, the polynomials in
 * float */
static inline void fpe_sincos_f32_fast(double x, float ss, float cs, float *s, float *c)
{
    int q;
    const float r = (float)fpe_reduce_pio2(x, &q);
    float sr, cr;
    fpe_sincos_reduced_f(r, &sr, &cr);
    const float so = (q & 1) ? cr : sr;
    const float co = (q & 1) ? sr : cr;
    *s = ((q & 2) ? -ss : ss) * so;
    *c = (((q + 1) & 2) ? -cs : cs) * co;
}

/* s[i] = sin_scale * sin(p[i * p_step] * w[i]), c[i] likewise with cos, in float32, for
 * a token whose values nothing advances from (a decode row): p_step 0 for one position
 * for the row, 1 for a position per pair (multi-axis rows; equal positions give the
 * row's bits). w_max = fpe_abs_max(w, n). */
static inline void fpe_sincos_f32(const double *p, Py_ssize_t p_step, const double *w,
                                  double w_max, float *s, float *c, Py_ssize_t n,
                                  double sin_scale, double cos_scale)
{
    const double p_max = p_step ? fpe_abs_max(p, n) : fabs(p[0]);
    if (p_max * w_max > FPE_FAST_ANGLE_LIMIT) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const double x = p[i * p_step] * w[i];
            s[i] = (float)(sin_scale * sin(x));
            c[i] = (float)(cos_scale * cos(x));
        }
        return;
    }
    const float ss = (float)sin_scale, cs = (float)cos_scale;
    for (Py_ssize_t i = 0; i < n; i++)
        fpe_sincos_f32_fast(p[i * p_step] * w[i], ss, cs, s + i, c + i);
}

/* fpe_sincos of one position for the row */
static inline void fpe_sincos_row(double p, const double *w, double *s, double *c,
                                  Py_ssize_t n, double scale)
{
    fpe_sincos(&p, 0, w, fpe_abs_max(w, n), s, c, n, scale);
}

/* ---- CPU features, for choosing the variant at import ---------------------
 * AVX2 + FMA + F16C + BMI2 (x86-64-v3 minus MOVBE/LZCNT, which the kernels
 * don't use), with the OS saving the YMM state. */
static inline int fpe_cpu_has_avx2(void)
{
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    int r[4];
    __cpuid(r, 0);
    if (r[0] < 7) return 0;
    __cpuid(r, 1);
    const int osxsave = (r[2] >> 27) & 1, fma = (r[2] >> 12) & 1, f16c = (r[2] >> 29) & 1;
    if (!(osxsave && fma && f16c) || (_xgetbv(0) & 6) != 6) return 0;
    __cpuidex(r, 7, 0);
    return ((r[1] >> 5) & 1) && ((r[1] >> 8) & 1);  /* avx2, bmi2 */
#else
    return 0;
#endif
}

/* AVX-512 F + BW + DQ + VL on top of the avx2 variant's features, and the OS saving
 * the opmask and ZMM state (XCR0 bits 5-7, besides SSE and YMM: 0xe6). The CPUID bits
 * alone do not say the OS switches those registers; __builtin_cpu_supports checks XCR0
 * in the compilers' runtimes, and the check is done here too, so that it holds whatever
 * runtime the extension links. (macOS enables the AVX-512 state lazily, on first use:
 * XCR0 does not show it before, so there the variant reads as unsupported, never as
 * wrongly supported.) */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
static inline unsigned long long fpe_xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static inline int fpe_cpu_has_avx512(void)
{
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    unsigned int a, b, c, d;
    if (!fpe_cpu_has_avx2() || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1))
        return 0;  /* no OSXSAVE: xgetbv itself would fault */
    if ((fpe_xgetbv0() & 0xe6) != 0xe6 || __get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    /* avx512f (16), dq (17), bw (30), vl (31) */
    if (!(((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1)))
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    int r[4];
    if (!fpe_cpu_has_avx2() || (_xgetbv(0) & 0xe6) != 0xe6) return 0;
    __cpuidex(r, 7, 0);
    /* avx512f (16), dq (17), bw (30), vl (31) */
    return ((r[1] >> 16) & 1) && ((r[1] >> 17) & 1) && ((r[1] >> 30) & 1) && ((r[1] >> 31) & 1);
#else
    return 0;
#endif
}

/* AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) besides the avx512 variant's needs */
static inline int fpe_cpu_has_avx512bf16(void)
{
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    unsigned int a, b, c, d;
    if (!fpe_cpu_has_avx512())
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1)
        return 0;  /* no subleaf 1 */
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 5) & 1;
#else
    return 0;
#endif
}

/* Whether the vector loops of bfloat16 results narrow by VCVTNE2PS2BF16: `on` 1 or 0 sets
 * it (1 holds only where it is built in and the CPU has it), -1 leaves it; returns it. */
static inline int fpe_bf16_cvt_state(int on)
{
#if FPE_BF16_CVT
    static int cpu = -1;   /* CPUID once: in a virtual machine it traps to the host */
    if (cpu < 0)
        cpu = fpe_cpu_has_avx512bf16();
    if (on >= 0)
        fpe_bf16_cvt = on && cpu;
    return fpe_bf16_cvt;
#else
    (void)on;
    return 0;
#endif
}

/* The CPU's vendor string from CPUID leaf 0 into out (13 bytes: "GenuineIntel",
 * "AuthenticAMD", ...), empty where there is no CPUID. */
static inline void fpe_cpu_vendor(char *out)
{
    out[0] = 0;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    unsigned int a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    memcpy(out, &b, 4); memcpy(out + 4, &d, 4); memcpy(out + 8, &c, 4);
    out[12] = 0;
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    int r[4];
    __cpuid(r, 0);
    memcpy(out, &r[1], 4); memcpy(out + 4, &r[3], 4); memcpy(out + 8, &r[2], 4);
    out[12] = 0;
#endif
}

/* The CPU's family as AMD and Intel number it (CPUID leaf 1: the base family, plus the
 * extended family where the base is 15: 25 for AMD's Zen 3 and 4, 26 for Zen 5); 0
 * where there is no CPUID. */
static inline int fpe_cpu_family(void)
{
    unsigned int a = 0;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    unsigned int b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
    int r[4];
    __cpuid(r, 1);
    a = (unsigned int)r[0];
#endif
    const unsigned int base = (a >> 8) & 0xf;
    return (int)(base == 0xf ? base + ((a >> 20) & 0xff) : base);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif /* FASTPE_MATH_H */
