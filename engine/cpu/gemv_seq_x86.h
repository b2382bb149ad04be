/* gemv_seq and gemv_seq_f8 (cpu_kernels.h) in 256-bit registers, included
 * by kernels_avx2.c and kernels_avx512.c: the same source compiled twice,
 * so that the AVX-512 build encodes it with EVEX and has 32 vector
 * registers for the 4 x 8-row groups and their chunk (measured: the f8
 * path 20 against 16 Gw/s in L1 with AVX2's 16), while the order of every
 * sum, and so every bit, stays the same. The block is ML_CPU_GEMV_SEQ_AVX2_ROWS
 * x ML_CPU_GEMV_SEQ_AVX2_COLS on both: the transpose, not the vector
 * width, bounds it. Defines static gemv_seq and gemv_seq_f8; include once,
 * in the file's kernel section. */
#ifndef ML_CPU_GEMV_SEQ_X86_H
#define ML_CPU_GEMV_SEQ_X86_H

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "dtype.h"

#define SEQ_INLINE static inline __attribute__((always_inline))
#define SEQ_LANES 8

static inline int seq_imin(int a, int b)
{
    return a < b ? a : b;
}

/* Lanes [0, n) all ones: the mask operand of maskload/maskstore. */
static inline __m256i seq_lane_mask(int n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}


/* Lanes = 8 weight rows; SEQ_GROUPS of them are interleaved so that as many
 * independent FMA chains hide the FMA latency at one activation row. */
#define SEQ_GROUPS (ML_CPU_GEMV_SEQ_AVX2_ROWS / SEQ_LANES)
#define SEQ_COLS ML_CPU_GEMV_SEQ_AVX2_COLS
/* k per transposed chunk: 16 bf16 (two halves of 4 dwords per row) or 16
 * F8_E4M3 codes (4 dwords per row). */
#define SEQ_CHUNK 16

/* The weights are bf16 or, for gemv_seq_f8, F8_E4M3 codes: the f8 path
 * transposes bytes (half the shuffles per weight of bf16) and widens each
 * code to f32 after the transpose, with the arithmetic of
 * ml_cpu_f8_to_f32 (shifts and a mask, then the exact multiply by 2^120),
 * so both compute the same bits from the same weight values. The multiply
 * is moved to the activations where that is exact (SEQ_F8_SCALED_X): the
 * FMA rounds acc + x·w once, and (x·2^120)·(w·2^-120) is the same real
 * number as x·w as long as x·2^120 is finite, which |x| < 2^8 guarantees
 * (w·2^-120, an f32 subnormal for an E4M3 subnormal, is exact either way).
 * It halves the work on the FMA ports (measured: 2x in L1). Row pointers
 * are bytes; the mode is a compile-time constant in every caller. */
enum { SEQ_BF16, SEQ_F8, SEQ_F8_SCALED_X };
/* Largest |x| and k of the scaled-x path (the activations are scaled
 * into a stack block of SEQ_COLS x SEQ_F8_SCALED_MAX_K floats). */
#define SEQ_F8_SCALED_X_LIMIT 0x1p8f
#define SEQ_F8_SCALED_MAX_K 256

/* The weight at k = p of the row at wr, in f32 (the scalar tail); times
 * 2^-120 in the scaled-x mode. */
SEQ_INLINE float load1(const int f8, const unsigned char *wr, int p)
{
    if (f8 == SEQ_F8_SCALED_X)
        return ml_cpu_f8_to_f32_unbiased(wr[p]);
    if (f8)
        return ml_cpu_f8_to_f32(wr[p]);
    uint16_t h;
    memcpy(&h, wr + 2 * (size_t)p, sizeof h);
    return ml_bf16_to_f32(h);
}

/* 16 bytes from p of rows r and r+4 of 8 row pointers as one vector: the
 * 8 bf16 weights (bf16) or the 16 codes (f8) from k = p. */
SEQ_INLINE __m256i rows_pair(const unsigned char *const wr[SEQ_LANES], int r, size_t p)
{
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(wr[r] + p))),
        _mm_loadu_si128((const __m128i *)(wr[r + 4] + p)), 1);
}

/* The dwords [4h, 4h+4) of rows 0..7 (h = 0 or 1 per 128-bit lane of the
 * rows_pair vectors at p) transposed: v[q] holds dword q of rows 0..7. */
SEQ_INLINE void transpose_rows(const unsigned char *const wr[SEQ_LANES], size_t p, __m256i v[4])
{
    const __m256i a0 = rows_pair(wr, 0, p), a1 = rows_pair(wr, 1, p);
    const __m256i a2 = rows_pair(wr, 2, p), a3 = rows_pair(wr, 3, p);
    const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpackhi_epi32(a0, a1);
    const __m256i t2 = _mm256_unpacklo_epi32(a2, a3), t3 = _mm256_unpackhi_epi32(a2, a3);
    v[0] = _mm256_unpacklo_epi64(t0, t2);
    v[1] = _mm256_unpackhi_epi64(t0, t2);
    v[2] = _mm256_unpacklo_epi64(t1, t3);
    v[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* acc[j] += x[j][i] · wv for the weight vector of the chunk's k = i. */
SEQ_INLINE void seq_fma(const int cols, const float *x, size_t ldx, int i, __m256 wv,
                           __m256 acc[SEQ_COLS])
{
#pragma GCC unroll 4
    for (int j = 0; j < cols; j++)
        acc[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)j * ldx + i), wv, acc[j]);
}

/* bf16: one FMA per k over 8 k of 8 rows from p (x at k = p); v[q]'s low
 * half is k = 2q and its high half k = 2q + 1. */
SEQ_INLINE void seq_half(const int cols, const unsigned char *const wr[SEQ_LANES], int p,
                            const float *x, size_t ldx, __m256 acc[SEQ_COLS])
{
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256i v[4];
    transpose_rows(wr, 2 * (size_t)p, v);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        seq_fma(cols, x, ldx, 2 * q, _mm256_castsi256_ps(_mm256_slli_epi32(v[q], 16)), acc);
        seq_fma(cols, x, ldx, 2 * q + 1, _mm256_castsi256_ps(_mm256_and_si256(v[q], hi_mask)),
                acc);
    }
}

/* f8: one FMA per k over 16 k of 8 rows from p (x at k = p); byte b of v[q]'s dwords is
 * k = 4q + b. Each code is moved to the high byte of a 16-bit word and
 * shifted right by 4 with its sign (hi: bytes 1 and 3 in place; lo: bytes
 * 0 and 2 moved up first), which leaves the widened f32's sign, exponent
 * and mantissa in the high word under ML_CPU_F8_F32_MASK. */
SEQ_INLINE void seq_chunk_f8(const int f8, const int cols, const int G,
                             const unsigned char *const wr[SEQ_GROUPS][SEQ_LANES], int p,
                             const float *x, size_t ldx, __m256 acc[SEQ_GROUPS][SEQ_COLS])
{
    const __m256i mask = _mm256_set1_epi32((int)ML_CPU_F8_F32_MASK);
    const __m256 rebias = _mm256_set1_ps(ML_CPU_F8_REBIAS);
    __m256i v[SEQ_GROUPS][4];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++)
        transpose_rows(wr[g], (size_t)p, v[g]);
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m256 wv[SEQ_GROUPS][4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const __m256i hi = _mm256_srai_epi16(v[g][q], 4);
            const __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(v[g][q], 8), 4);
            const __m256i bits[4] = {_mm256_and_si256(_mm256_slli_epi32(lo, 16), mask),
                                     _mm256_and_si256(_mm256_slli_epi32(hi, 16), mask),
                                     _mm256_and_si256(lo, mask), _mm256_and_si256(hi, mask)};
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++)
                wv[g][b] = f8 == SEQ_F8_SCALED_X
                               ? _mm256_castsi256_ps(bits[b])
                               : _mm256_mul_ps(_mm256_castsi256_ps(bits[b]), rebias);
        }
        /* the groups' chains interleaved at every k: as many independent
         * FMAs in flight as groups x cols, within the scheduler's reach
         * (one group's chunk after another left the FMA latency exposed:
         * measured 2x the bf16 time per weight in L1) */
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) {
#pragma GCC unroll 4
            for (int j = 0; j < cols; j++) {
                const __m256 xb = _mm256_broadcast_ss(x + (size_t)j * ldx + 4 * q + b);
#pragma GCC unroll 4
                for (int g = 0; g < G; g++)
                    acc[g][j] = _mm256_fmadd_ps(xb, wv[g][b], acc[g][j]);
            }
        }
    }
}

/* Rows [8·g0, 8·(g0 + G)) of the block, G = passes' group count: each
 * weight chunk is transposed once for all `cols` activation rows. */
SEQ_INLINE void seq_pass(const int f8, const int cols, const int G, int g0, int rows, int k,
                            const unsigned char *w, size_t ldw, const float *x, size_t ldx,
                            float *y, size_t ldy)
{
    const int groups = seq_imin(G, (rows - g0 * SEQ_LANES + SEQ_LANES - 1) / SEQ_LANES);
    const size_t row_bytes = ldw * (f8 ? 1 : sizeof(uint16_t));
    /* Every loop over the accumulators has compile-time bounds and is
     * unrolled, so that they stay in registers (a spilled one puts a
     * store-to-load forward into its FMA chain). */
    const unsigned char *wr[SEQ_GROUPS][SEQ_LANES];
    __m256 acc[SEQ_GROUPS][SEQ_COLS];
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        /* rows past `rows` repeat the last one; their lanes are not stored */
        const int first = (g0 + seq_imin(g, groups - 1)) * SEQ_LANES;
        for (int i = 0; i < SEQ_LANES; i++)
            wr[g][i] = w + (size_t)seq_imin(first + i, rows - 1) * row_bytes;
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++)
            acc[g][j] = _mm256_setzero_ps();
    }
    int p = 0;
    for (; p + SEQ_CHUNK <= k; p += SEQ_CHUNK) {
        if (f8) {
            /* all G groups (past `groups` they repeat a valid row and are
             * not stored) */
            seq_chunk_f8(f8, cols, G, wr, p, x + p, ldx, acc);
            continue;
        }
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            if (g < groups) {
                /* One base per group, opaque to the compiler: otherwise GCC
                 * keeps the 16·cols broadcast addresses of the chunk live
                 * across the groups and spills them. */
                const float *xp = x + p;
                __asm__("" : "+r"(xp));
                seq_half(cols, wr[g], p, xp, ldx, acc[g]);
                seq_half(cols, wr[g], p + SEQ_LANES, xp + SEQ_LANES, ldx, acc[g]);
            }
        }
    }
    for (; p < k; p++) {
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            if (g >= groups)
                continue;
            float wf[SEQ_LANES];
            for (int i = 0; i < SEQ_LANES; i++)
                wf[i] = load1(f8, wr[g][i], p);
            seq_fma(cols, x + p, ldx, 0, _mm256_loadu_ps(wf), acc[g]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        if (g >= groups)
            continue;
        const __m256i mask = seq_lane_mask(rows - (g0 + g) * SEQ_LANES);
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            float *yj = y + (size_t)j * ldy + (size_t)(g0 + g) * SEQ_LANES;
            _mm256_maskstore_ps(yj, mask, _mm256_add_ps(_mm256_maskload_ps(yj, mask), acc[g][j]));
        }
    }
}

/* Up to two activation rows: all SEQ_GROUPS groups in one pass (enough
 * independent chains at one row); three or four: two passes of half the
 * groups, so the accumulators (groups x cols) still fit 16 registers. */
SEQ_INLINE void seq_block(const int f8, const int cols, int rows, int k,
                             const unsigned char *w, size_t ldw, const float *x, size_t ldx,
                             float *y, size_t ldy)
{
    const int G = cols <= 2 ? SEQ_GROUPS : SEQ_GROUPS / 2;
    for (int g0 = 0; g0 * SEQ_LANES < rows; g0 += G)
        seq_pass(f8, cols, G, g0, rows, k, w, ldw, x, ldx, y, ldy);
}

SEQ_INLINE void seq_cols(const int f8, int rows, int cols, int k, const unsigned char *w,
                            size_t ldw, const float *x, size_t ldx, float *y, size_t ldy)
{
    switch (cols) {
    case 1: seq_block(f8, 1, rows, k, w, ldw, x, ldx, y, ldy); break;
    case 2: seq_block(f8, 2, rows, k, w, ldw, x, ldx, y, ldy); break;
    case 3: seq_block(f8, 3, rows, k, w, ldw, x, ldx, y, ldy); break;
    case 4: seq_block(f8, 4, rows, k, w, ldw, x, ldx, y, ldy); break;
    default: assert(!"gemv_seq: cols out of range");
    }
}

static void gemv_seq(int rows, int cols, int k, const uint16_t *w, size_t ldw, const float *x,
                     size_t ldx, float *y, size_t ldy)
{
    seq_cols(SEQ_BF16, rows, cols, k, (const unsigned char *)w, ldw, x, ldx, y, ldy);
}

static void gemv_seq_f8(int rows, int cols, int k, const uint8_t *w, size_t ldw,
                        const float *x, size_t ldx, float *y, size_t ldy)
{
    float xs[SEQ_COLS * SEQ_F8_SCALED_MAX_K] __attribute__((aligned(32)));
    int small = k <= SEQ_F8_SCALED_MAX_K;
    for (int j = 0; j < cols && small; j++)
        for (int p = 0; p < k; p++) /* false for NaN too */
            small &= fabsf(x[(size_t)j * ldx + p]) < SEQ_F8_SCALED_X_LIMIT;
    if (!small) {
        seq_cols(SEQ_F8, rows, cols, k, w, ldw, x, ldx, y, ldy);
        return;
    }
    for (int j = 0; j < cols; j++)
        for (int p = 0; p < k; p++)
            xs[j * k + p] = x[(size_t)j * ldx + p] * ML_CPU_F8_REBIAS;
    seq_cols(SEQ_F8_SCALED_X, rows, cols, k, w, ldw, xs, (size_t)k, y, ldy);
}

#endif
