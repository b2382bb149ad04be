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

#define LANES 8
/* 6 x 16 tile: 12 accumulators + 2 B vectors + 1 broadcast of 16 ymm. */
#define TILE_ROWS 6
#define TILE_COLS (2 * LANES)
/* gemm_packed: the 6-row tile over a strip of two vectors. */
#define STRIP_COLS (2 * LANES)
/* 4 weight rows x 2 activation rows: 8 accumulators + 4 + 1 ymm. */
#define GEMV_ROWS 4
#define GEMV_COLS 2

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* Running maxima kept apart in softmax_block's max pass. */
#define MAX_CHAINS 4

/* Lanes [0, n) all ones: the mask operand of maskload/maskstore. */
static inline __m256i lane_mask(int n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

/* ---- gemm_tile -------------------------------------------------------------- */

/* Compile-time m, A layout (a_col) and full width (full: n == 16, plain
 * loads; otherwise masked loads and stores). */
ALWAYS_INLINE void tile(const int m, const int a_col, const int full, int n, int k,
                        const float *a, size_t lda, const float *b, size_t ldb, float *c,
                        size_t ldc)
{
    const __m256i m0 = lane_mask(n), m1 = lane_mask(n - LANES);
    __m256 acc0[TILE_ROWS], acc1[TILE_ROWS];
#pragma GCC unroll 6
    for (int i = 0; i < m; i++) {
        acc0[i] = _mm256_setzero_ps();
        acc1[i] = _mm256_setzero_ps();
    }
    for (int p = 0; p < k; p++) {
        const float *bp = b + (size_t)p * ldb;
        const __m256 b0 = full ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, m0);
        const __m256 b1 = full ? _mm256_loadu_ps(bp + LANES) : _mm256_maskload_ps(bp + LANES, m1);
#pragma GCC unroll 6
        for (int i = 0; i < m; i++) {
            const __m256 ai =
                _mm256_broadcast_ss(a_col ? &a[(size_t)p * lda + i] : &a[(size_t)i * lda + p]);
            acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
            acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        if (full) {
            _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc0[i]));
            _mm256_storeu_ps(ci + LANES, _mm256_add_ps(_mm256_loadu_ps(ci + LANES), acc1[i]));
        } else {
            _mm256_maskstore_ps(ci, m0, _mm256_add_ps(_mm256_maskload_ps(ci, m0), acc0[i]));
            _mm256_maskstore_ps(ci + LANES, m1,
                                _mm256_add_ps(_mm256_maskload_ps(ci + LANES, m1), acc1[i]));
        }
    }
}

ALWAYS_INLINE void tile_m(const int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                          const float *b, size_t ldb, float *c, size_t ldc)
{
    const int full = n == TILE_COLS;
    if (a_cs == 1) {
        if (full)
            tile(m, 0, 1, n, k, a, a_rs, b, ldb, c, ldc);
        else
            tile(m, 0, 0, n, k, a, a_rs, b, ldb, c, ldc);
    } else {
        if (full)
            tile(m, 1, 1, n, k, a, a_cs, b, ldb, c, ldc);
        else
            tile(m, 1, 0, n, k, a, a_cs, b, ldb, c, ldc);
    }
}

static void gemm_tile(int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                      const float *b, size_t ldb, float *c, size_t ldc)
{
    switch (m) {
    case 1: tile_m(1, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    case 2: tile_m(2, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    case 3: tile_m(3, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    case 4: tile_m(4, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    case 5: tile_m(5, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    case 6: tile_m(6, n, k, a, a_rs, a_cs, b, ldb, c, ldc); break;
    default: assert(!"gemm_tile: m out of range");
    }
}

/* ---- gemv ------------------------------------------------------------------- */

/* 8 bf16 → f32: widen to 32 bits and move into the high half (exact). */
ALWAYS_INLINE __m256 bf16_to_f32(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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

ALWAYS_INLINE void gemv_rows(const int rows, int cols, int K, const uint16_t *w, size_t ldw,
                             const float *x, size_t ldx, float *dots)
{
    switch (cols) {
    case 1: gemv_block(rows, 1, K, w, ldw, x, ldx, dots); break;
    case 2: gemv_block(rows, 2, K, w, ldw, x, ldx, dots); break;
    default: assert(!"gemv: cols out of range");
    }
}

static void gemv(int rows, int cols, int K, const uint16_t *w, size_t ldw, const float *x,
                 size_t ldx, float *dots)
{
    switch (rows) {
    case 1: gemv_rows(1, cols, K, w, ldw, x, ldx, dots); break;
    case 2: gemv_rows(2, cols, K, w, ldw, x, ldx, dots); break;
    case 3: gemv_rows(3, cols, K, w, ldw, x, ldx, dots); break;
    case 4: gemv_rows(4, cols, K, w, ldw, x, ldx, dots); break;
    default: assert(!"gemv: rows out of range");
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

ALWAYS_INLINE void packed_tile(const int m, const int f8, const int stream, int n, int k,
                               const float *x, size_t ldx, const void *w, float *y, size_t ldy)
{
    const __m256i m0 = lane_mask(n), m1 = lane_mask(n - LANES);
    __m256 acc0[TILE_ROWS], acc1[TILE_ROWS];
#pragma GCC unroll 6
    for (int i = 0; i < m; i++) {
        acc0[i] = _mm256_setzero_ps();
        acc1[i] = _mm256_setzero_ps();
    }
    const size_t step_bytes = f8 ? STRIP_COLS : STRIP_COLS * sizeof(uint16_t);
    for (int p = 0; p < k; p++) {
        __m256 b0, b1;
        if (stream)
            _mm_prefetch((const char *)w + (size_t)p * step_bytes + ML_CPU_STRIP_PREFETCH_BYTES,
                         _MM_HINT_T0);
        strip_step(f8, w, p, &b0, &b1);
#pragma GCC unroll 6
        for (int i = 0; i < m; i++) {
            const __m256 xi = _mm256_broadcast_ss(x + (size_t)i * ldx + p);
            acc0[i] = _mm256_fmadd_ps(xi, b0, acc0[i]);
            acc1[i] = _mm256_fmadd_ps(xi, b1, acc1[i]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < m; i++) {
        float *yi = y + (size_t)i * ldy;
        _mm256_maskstore_ps(yi, m0, _mm256_add_ps(_mm256_maskload_ps(yi, m0), acc0[i]));
        _mm256_maskstore_ps(yi + LANES, m1,
                            _mm256_add_ps(_mm256_maskload_ps(yi + LANES, m1), acc1[i]));
    }
}

/* Compile-time dtype and prefetch, so that neither costs a branch a step. */
ALWAYS_INLINE void packed_m(const int m, int n, int k, const float *x, size_t ldx,
                            const void *w, int f8, int stream, float *y, size_t ldy)
{
    if (f8 && stream)
        packed_tile(m, 1, 1, n, k, x, ldx, w, y, ldy);
    else if (f8)
        packed_tile(m, 1, 0, n, k, x, ldx, w, y, ldy);
    else if (stream)
        packed_tile(m, 0, 1, n, k, x, ldx, w, y, ldy);
    else
        packed_tile(m, 0, 0, n, k, x, ldx, w, y, ldy);
}

static void gemm_packed(int m, int n, int k, const float *x, size_t ldx, const void *w, int f8,
                        int stream, float *y, size_t ldy)
{
    switch (m) {
    case 1: packed_m(1, n, k, x, ldx, w, f8, stream, y, ldy); break;
    case 2: packed_m(2, n, k, x, ldx, w, f8, stream, y, ldy); break;
    case 3: packed_m(3, n, k, x, ldx, w, f8, stream, y, ldy); break;
    case 4: packed_m(4, n, k, x, ldx, w, f8, stream, y, ldy); break;
    case 5: packed_m(5, n, k, x, ldx, w, f8, stream, y, ldy); break;
    case 6: packed_m(6, n, k, x, ldx, w, f8, stream, y, ldy); break;
    default: assert(!"gemm_packed: m out of range");
    }
}

/* ---- softmax_block -------------------------------------------------------- */

static void softmax_block(float *s, size_t lds, int nk, int nq, float scale, float *m, float *l,
                          float *alpha)
{
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    for (int c = 0; c < nq; c += LANES) {
        const __m256i mk = lane_mask(nq - c);
        const __m256 m_old = _mm256_maskload_ps(m + c, mk);
        /* Independent running maxima, as in kernels_avx512.c. */
        __m256 part[MAX_CHAINS];
        part[0] = m_old;
#pragma GCC unroll 4
        for (int u = 1; u < MAX_CHAINS; u++)
            part[u] = neg_inf;
        int key = 0;
        for (; key + MAX_CHAINS <= nk; key += MAX_CHAINS) {
#pragma GCC unroll 4
            for (int u = 0; u < MAX_CHAINS; u++) {
                const __m256 x = _mm256_mul_ps(
                    _mm256_maskload_ps(s + (size_t)(key + u) * lds + c, mk), vscale);
                part[u] = _mm256_max_ps(x, part[u]);
            }
        }
        for (; key < nk; key++) {
            const __m256 x =
                _mm256_mul_ps(_mm256_maskload_ps(s + (size_t)key * lds + c, mk), vscale);
            part[0] = _mm256_max_ps(x, part[0]);
        }
        __m256 mx = part[0];
#pragma GCC unroll 4
        for (int u = 1; u < MAX_CHAINS; u++)
            mx = _mm256_max_ps(part[u], mx);
        const __m256 none = _mm256_cmp_ps(mx, neg_inf, _CMP_EQ_OQ);
        const __m256 sh = _mm256_andnot_ps(none, mx);
        __m256 sum = _mm256_setzero_ps();
        for (int j = 0; j < nk; j++) {
            float *sj = s + (size_t)j * lds + c;
            const __m256 e = vm_exp(_mm256_fmsub_ps(_mm256_maskload_ps(sj, mk), vscale, sh));
            _mm256_maskstore_ps(sj, mk, e);
            sum = _mm256_add_ps(sum, e);
        }
        const __m256 a = vm_exp(_mm256_sub_ps(m_old, sh));
        _mm256_maskstore_ps(alpha + c, mk, a);
        _mm256_maskstore_ps(l + c, mk, _mm256_fmadd_ps(_mm256_maskload_ps(l + c, mk), a, sum));
        _mm256_maskstore_ps(m + c, mk, mx);
    }
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
};

#endif
