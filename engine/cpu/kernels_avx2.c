/* AVX2 + FMA kernels: the contract of cpu_kernels.h with 8 f32 lanes. This
 * file alone is compiled with -mavx2 -mfma; it runs only after cpu_features
 * has found them. */
#include "cpu/cpu_kernels.h"

#if ML_CPU_X86
#include <assert.h>
#include <immintrin.h>
#include <math.h>

#define VMATH_BITS 256
#include "cpu/vmath.h"
#include "dtype.h"

/* 6 x 16 tile: 12 accumulators + 2 B vectors + 1 broadcast of 16 ymm. */
#define TILE_ROWS 6
/* 4 weight rows x 2 activation rows: 8 accumulators + 4 + 1 ymm. */
#define GEMV_ROWS 4
#define GEMV_COLS 2
/* Running maxima kept apart in softmax_block's max pass. */
#define MAX_CHAINS 4
#include "cpu/kernels_vec.h"

/* ---- gemv ------------------------------------------------------------------- */

/* 8 bf16 → f32: widen to 32 bits and move into the high half (exact). */
ALWAYS_INLINE __m256 bf16_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE __m256 bf16_lanes(const uint16_t *p)
{
    return bf16_to_f32(_mm_loadu_si128((const __m128i *)p));
}

/* Horizontal sum of 8 lanes. */
ALWAYS_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE void gemv_block(const int rows, const int cols, int K, const uint16_t *w,
                              size_t ldw, const float *x, size_t ldx, float *dots)
{
    __m256 acc[GEMV_ROWS][GEMV_COLS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
        for (int j = 0; j < cols; j++)
            acc[r][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + LANES <= K; k += LANES) {
        __m256 wv[GEMV_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++)
            wv[r] = bf16_to_f32(_mm_loadu_si128((const __m128i *)(w + (size_t)r * ldw + k)));
#pragma GCC unroll 2
        for (int j = 0; j < cols; j++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)j * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++)
                acc[r][j] = _mm256_fmadd_ps(wv[r], xv, acc[r][j]);
        }
    }
    /* AVX2 has no masked 16-bit load: the tail (< 8 elements) is scalar. */
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
#pragma GCC unroll 2
        for (int j = 0; j < cols; j++) {
            float tail = 0.0f;
            for (int t = k; t < K; t++) {
                uint32_t u = (uint32_t)w[(size_t)r * ldw + t] << 16;
                float wf;
                __builtin_memcpy(&wf, &u, sizeof wf);
                tail += wf * x[(size_t)j * ldx + t];
            }
            dots[r * cols + j] = hsum(acc[r][j]) + tail;
        }
    }
}

/* ---- gemm_packed ------------------------------------------------------------ */

/* The two f32 vectors (columns 0..7, 8..15) of step p of a strip. bf16:
 * one 32-byte load, the low halves shifted up and the high halves masked
 * (cpu_kernels.h, the pairing). f8: 16 codes sign-extended to dwords, so
 * that the shift puts the code's sign in bit 31 and its other bits at
 * 26..20 under ML_CPU_F8_F32_MASK, then the exact multiply by 2^120. */
ALWAYS_INLINE void strip_step(const int f8, const void *w, int p, __m256 *b0, __m256 *b1)
{
    if (f8) {
        const __m128i c = _mm_loadu_si128((const __m128i *)((const uint8_t *)w + (size_t)p * STRIP_COLS));
        const __m256i mask = _mm256_set1_epi32((int)ML_CPU_F8_F32_MASK);
        const __m256 rebias = _mm256_set1_ps(ML_CPU_F8_REBIAS);
        const __m256i lo = _mm256_cvtepi8_epi32(c);
        const __m256i hi = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c, c));
        *b0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(
                                _mm256_slli_epi32(lo, ML_CPU_F8_MAG_SHIFT), mask)), rebias);
        *b1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(
                                _mm256_slli_epi32(hi, ML_CPU_F8_MAG_SHIFT), mask)), rebias);
        return;
    }
    const __m256i d = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + (size_t)p * STRIP_COLS));
    *b0 = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
    *b1 = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0xffff0000u)));
}

const ml_cpu_kernels ml_cpu_kernels_avx2 = {
    .isa = ML_CPU_ISA_AVX2,
    .gemm_tile = gemm_tile,
    .tile_rows = TILE_ROWS,
    .tile_cols = TILE_COLS,
    .gemv = gemv,
    .gemv_rows = GEMV_ROWS,
    .gemv_cols = GEMV_COLS,
    .gemm_packed = gemm_packed,
    .strip_cols = STRIP_COLS,
    .softmax_block = softmax_block,
    .exp_n = vm_exp_n,
    .erf_n = vm_erf_n,
    .gelu = vm_gelu,
    .silu_mul = vm_silu_mul,
    .bf16_widen = bf16_widen,
    .widen_strip = widen_strip,
};

#endif
