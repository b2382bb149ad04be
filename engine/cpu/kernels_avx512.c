/* AVX-512 (F, BW, VL, DQ) kernels: the contract of cpu_kernels.h with 16 f32
 * lanes. This file alone is compiled with -mavx512*; it runs only after
 * cpu_features has found those extensions. */
#include "cpu/cpu_kernels.h"

#if ML_CPU_X86
#include <assert.h>
#include <immintrin.h>
#include <math.h>

#define VMATH_BITS 512
#include "cpu/vmath.h"

/* 12 x 32 tile: 24 accumulators + 2 B vectors + 1 broadcast of 32 zmm. */
#define TILE_ROWS 12
/* 6 weight rows x 4 activation rows: 24 accumulators + 6 + 1 zmm. Past a
 * few activation rows the block's speed follows its L2 -> L1 traffic (x
 * rows, and the weight rows again for each further column block): 64 / rows
 * + 32 / cols bytes per FMA, so more weight rows beat more columns. Measured
 * (bench_cpu_ops, M = 4..16): 6 x 4 ~10% faster than 4 x 4; 3 x 8, and
 * converting each weight once into a K-chunked f32 panel, no faster. */
#define GEMV_ROWS 6
#define GEMV_COLS 4
/* Running maxima kept apart in softmax_block's max pass. */
#define MAX_CHAINS 4
#include "cpu/kernels_vec.h"

/* ---- gemv ------------------------------------------------------------------- */

/* 16 bf16 → f32: widen to 32 bits and move into the high half (exact). */
ALWAYS_INLINE __m512 bf16_to_f32(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE void gemv_block(const int rows, const int cols, int K, const uint16_t *w,
                              size_t ldw, const float *x, size_t ldx, float *dots)
{
    __m512 acc[GEMV_ROWS][GEMV_COLS];
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++)
            acc[r][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += LANES) {
        /* The tail loads are masked, so no byte past row end is read. */
        const vf_lanes mk = vf_first_lanes(K - k);
        __m512 wv[GEMV_ROWS];
#pragma GCC unroll 6
        for (int r = 0; r < rows; r++)
            wv[r] = bf16_to_f32(_mm256_maskz_loadu_epi16(mk, w + (size_t)r * ldw + k));
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++) {
            const __m512 xv = _mm512_maskz_loadu_ps(mk, x + (size_t)j * ldx + k);
#pragma GCC unroll 6
            for (int r = 0; r < rows; r++)
                acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int j = 0; j < cols; j++)
            dots[r * cols + j] = _mm512_reduce_add_ps(acc[r][j]);
}

/* ---- gemm_packed ------------------------------------------------------------ */

/* The two f32 vectors (columns 0..15, 16..31) of step p of a strip. bf16:
 * one 64-byte load, the low halves shifted up and the high halves masked
 * (cpu_kernels.h, the pairing). f8: 32 codes sign-extended to dwords, so
 * that the shift puts the code's sign in bit 31 and its other bits at
 * 26..20 under ML_CPU_F8_F32_MASK, then the exact multiply by 2^120. */
ALWAYS_INLINE void strip_step(const int f8, const void *w, int p, __m512 *b0, __m512 *b1)
{
    if (f8) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)((const uint8_t *)w + (size_t)p * STRIP_COLS));
        const __m512i mask = _mm512_set1_epi32((int)ML_CPU_F8_F32_MASK);
        const __m512 rebias = _mm512_set1_ps(ML_CPU_F8_REBIAS);
        const __m512i lo = _mm512_cvtepi8_epi32(_mm256_castsi256_si128(c));
        const __m512i hi = _mm512_cvtepi8_epi32(_mm256_extracti128_si256(c, 1));
        *b0 = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(
                                _mm512_slli_epi32(lo, ML_CPU_F8_MAG_SHIFT), mask)), rebias);
        *b1 = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(
                                _mm512_slli_epi32(hi, ML_CPU_F8_MAG_SHIFT), mask)), rebias);
        return;
    }
    const __m512i d = _mm512_loadu_si512((const uint16_t *)w + (size_t)p * STRIP_COLS);
    *b0 = _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
    *b1 = _mm512_castsi512_ps(_mm512_and_si512(d, _mm512_set1_epi32((int)0xffff0000u)));
}

/* ---- gemm_tile_bf16 ------------------------------------------------------- */

/* AVX512_BF16 is one more extension than the rest of this file assumes:
 * only these functions are compiled for it, and only a backend that found
 * it (ml_cpu_has_avx512_bf16) calls them. */
#define BF16_TARGET __attribute__((target("avx512bf16")))

/* The bf16 bits of the E4M3 subnormals m · 2^-9 at index m = 0..7 of a
 * VPERMW table (which reads the low 5 bits of each index; the rest unused). */
static const uint16_t f8_subnormal_bf16[32] = {0x0000, 0x3b00, 0x3b80, 0x3bc0,
                                               0x3c00, 0x3c20, 0x3c40, 0x3c60};
/* The bf16 exponent of an E4M3 normal is its own plus 127 - 7. */
#define F8_BF16_REBIAS ((127 - 7) << 7)
/* An E4M3 code's exponent and mantissa, and its exponent alone. */
#define F8_MAG_BITS 0x7f
#define F8_EXP_BITS 0x78
#define BF16_SIGN 0x8000
/* Where the code's 7 magnitude bits go in a bf16: bits 10..4. */
#define F8_BF16_SHIFT 4

/* 32 E4M3 codes widened to bf16, exactly (every E4M3 value is a bf16), in
 * the order they came: a pair step of 16 columns of the FP8 pair layout
 * becomes VDPBF16PS's operand. A normal's magnitude bits move to 10..4
 * under the rebiased exponent; a subnormal (exponent 0) is looked up; the
 * sign is the code's, which the sign extension put in bit 15. The NaN
 * codes, which no checkpoint holds, widen to ±480 as ml_cpu_f8_to_f32's. */
ALWAYS_INLINE __m512i f8_to_bf16(__m256i codes)
{
    const __m512i w = _mm512_cvtepi8_epi16(codes);
    const __m512i normal = _mm512_add_epi16(
        _mm512_and_si512(_mm512_slli_epi16(w, F8_BF16_SHIFT),
                         _mm512_set1_epi16(F8_MAG_BITS << F8_BF16_SHIFT)),
        _mm512_set1_epi16(F8_BF16_REBIAS));
    const __mmask32 sub = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(F8_EXP_BITS));
    const __m512i mag = _mm512_mask_permutexvar_epi16(normal, sub, w,
                                                      _mm512_loadu_si512(f8_subnormal_bf16));
    /* mag | (w & BF16_SIGN) */
    return _mm512_ternarylogic_epi32(mag, w, _mm512_set1_epi16((short)BF16_SIGN), 0xf8);
}

/* gemm_tile's tile on pairs: compile-time m, A layout (a_col), width
 * (wide), prefetching (pf, where B is a block of a packed strip) and B's
 * dtype (f8: E4M3 codes in pairs of bytes, widened to bf16 pairs as they
 * are loaded; else bf16 pairs). */
BF16_TARGET ALWAYS_INLINE void pair_tile(const int m, const int a_col, const int wide,
                                         const ml_cpu_prefetch pf, const int f8, int n, int kp,
                                         const uint32_t *a, size_t lda, const void *b,
                                         size_t ldb, const void *next, float *c, size_t ldc)
{
    const vf_lanes m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    /* a pair of B: a dword of bf16, two bytes of E4M3 */
    const size_t pair_bytes = f8 ? 2 * sizeof(uint8_t) : 2 * sizeof(uint16_t);
    vf acc0[TILE_ROWS], acc1[TILE_ROWS];
    zero_rows(m, acc0, acc1);
    for (int p = 0; p < kp; p++) {
        const char *bp = (const char *)b + (size_t)p * ldb * pair_bytes;
        /* a strip's step: two cache lines of bf16 pairs, one of FP8 */
        if (pf == ML_CPU_PREFETCH_STREAM) {
            stream_prefetch(m, bp + ML_CPU_STRIP_PREFETCH_BYTES);
            if (!f8)
                stream_prefetch(m, bp + LANES * pair_bytes + ML_CPU_STRIP_PREFETCH_BYTES);
        } else if (pf == ML_CPU_PREFETCH_NEXT) {
            const char *np = (const char *)next + (size_t)p * ldb * pair_bytes;
            _mm_prefetch(np, _MM_HINT_T1);
            if (!f8)
                _mm_prefetch(np + LANES * pair_bytes, _MM_HINT_T1);
        }
        __m512bh b0, b1 = (__m512bh)_mm512_setzero_si512();
        if (f8) {
            b0 = (__m512bh)f8_to_bf16(_mm256_maskz_loadu_epi16(m0, bp));
            if (wide)
                b1 = (__m512bh)f8_to_bf16(_mm256_maskz_loadu_epi16(m1, bp + LANES * pair_bytes));
        } else {
            b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, bp);
            if (wide)
                b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, bp + LANES * pair_bytes);
        }
#pragma GCC unroll 12
        for (int i = 0; i < m; i++) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32(
                (int)(a_col ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]));
            acc0[i] = _mm512_dpbf16_ps(acc0[i], ai, b0);
            if (wide)
                acc1[i] = _mm512_dpbf16_ps(acc1[i], ai, b1);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < m; i++)
        add_row(wide ? TILE_WIDE : TILE_NARROW, c + (size_t)i * ldc, m0, m1, acc0[i], acc1[i]);
}

/* Prefetching and FP8 are the matmul's cases only: row-major x against a
 * block of a strip. */
BF16_TARGET ALWAYS_INLINE void pair_m(const int m, int n, int kp, const uint32_t *a, size_t a_rs,
                                      size_t a_cs, const void *b, size_t ldb, int f8,
                                      ml_cpu_prefetch pf, const void *next, float *c, size_t ldc)
{
    const int wide = n > LANES;
#define PAIR_TILE(a_col, wide, pf, f8, lda)                                                        \
    pair_tile(m, a_col, wide, pf, f8, n, kp, a, lda, b, ldb, next, c, ldc)
    if (a_cs != 1)
        wide ? PAIR_TILE(1, 1, ML_CPU_PREFETCH_NONE, 0, a_cs)
             : PAIR_TILE(1, 0, ML_CPU_PREFETCH_NONE, 0, a_cs);
    else if (f8 && wide && pf == ML_CPU_PREFETCH_STREAM)
        PAIR_TILE(0, 1, ML_CPU_PREFETCH_STREAM, 1, a_rs);
    else if (f8 && wide && pf == ML_CPU_PREFETCH_NEXT)
        PAIR_TILE(0, 1, ML_CPU_PREFETCH_NEXT, 1, a_rs);
    else if (f8)
        wide ? PAIR_TILE(0, 1, ML_CPU_PREFETCH_NONE, 1, a_rs)
             : PAIR_TILE(0, 0, ML_CPU_PREFETCH_NONE, 1, a_rs);
    else if (wide && pf == ML_CPU_PREFETCH_STREAM)
        PAIR_TILE(0, 1, ML_CPU_PREFETCH_STREAM, 0, a_rs);
    else if (wide && pf == ML_CPU_PREFETCH_NEXT)
        PAIR_TILE(0, 1, ML_CPU_PREFETCH_NEXT, 0, a_rs);
    else
        wide ? PAIR_TILE(0, 1, ML_CPU_PREFETCH_NONE, 0, a_rs)
             : PAIR_TILE(0, 0, ML_CPU_PREFETCH_NONE, 0, a_rs);
#undef PAIR_TILE
}

BF16_TARGET static void gemm_tile_bf16(int m, int n, int kp, const uint32_t *a, size_t a_rs,
                                       size_t a_cs, const void *b, size_t ldb, int f8,
                                       ml_cpu_prefetch pf, const void *next, float *c, size_t ldc)
{
#define GEMM_TILE_BF16_M(mm) pair_m(mm, n, kp, a, a_rs, a_cs, b, ldb, f8, pf, next, c, ldc)
    switch (m) {
        TILE_M_CASES(GEMM_TILE_BF16_M)
    default: assert(!"gemm_tile_bf16: m out of range");
    }
#undef GEMM_TILE_BF16_M
}

/* The pair operands. Integer RNE as ml_f32_to_bf16, not VCVTNE2PS2BF16,
 * which flushes subnormal inputs to zero: the same bits as the scalar
 * rounding, whatever the CPU. */

/* 16 f32 (as bits) rounded to bf16, each in the high half of its lane
 * (the low half is left over). */
ALWAYS_INLINE __m512i bf16_round_high(__m512i u)
{
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    /* NaN: its upper half, made quiet */
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
}

static void bf16_pairs(uint32_t *d, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i += LANES) {
        const size_t left = n - i;
        const vf_lanes mk = vf_first_lanes(left > LANES ? LANES : (int)left);
        const __m512i u = _mm512_maskz_loadu_epi32(mk, x + i); /* padding: +0, bf16 0 */
        const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_high(u), 16));
        const int pairs = left >= LANES ? LANES / 2 : (int)(left + 1) / 2;
        _mm256_mask_storeu_epi32(d + i / 2, (__mmask8)((1u << pairs) - 1), h);
    }
}

static void bf16_pair_rows(uint32_t *d, const float *lo, const float *hi, size_t n)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (size_t i = 0; i < n; i += LANES) {
        const vf_lanes mk = vf_first_lanes(n - i > LANES ? LANES : (int)(n - i));
        const __m512i l = bf16_round_high(_mm512_maskz_loadu_epi32(mk, lo + i));
        const __m512i h = bf16_round_high(_mm512_maskz_loadu_epi32(mk, hi + i));
        _mm512_mask_storeu_epi32(d + i, mk,
                                 _mm512_or_si512(_mm512_and_si512(h, high), _mm512_srli_epi32(l, 16)));
    }
}

const ml_cpu_kernels ml_cpu_kernels_avx512 = {
    .isa = ML_CPU_ISA_AVX512,
    .gemm_tile = gemm_tile,
    .tile_rows = TILE_ROWS,
    .tile_cols = TILE_COLS,
    .gemv = gemv,
    .gemv_rows = GEMV_ROWS,
    .gemv_cols = GEMV_COLS,
    .gemm_packed = gemm_packed,
    .strip_cols = STRIP_COLS,
    .gemm_tile_bf16 = gemm_tile_bf16,
    .bf16_pairs = bf16_pairs,
    .bf16_pair_rows = bf16_pair_rows,
    .softmax_block = softmax_block,
    .exp_n = vm_exp_n,
    .erf_n = vm_erf_n,
    .gelu = vm_gelu,
    .silu_mul = vm_silu_mul,
};

#endif
