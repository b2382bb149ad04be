/* The register-tile kernels of cpu_kernels.h (gemm_tile, gemm_packed,
 * softmax_block) and the widenings (widen_strip, bf16_widen), written once
 * for both vector widths.
 *
 * Included only by kernels_avx2.c and kernels_avx512.c, after vmath.h (the
 * width layer vf_*, VMATH_BITS) and after defining
 *   TILE_ROWS    rows of a tile (accumulator pairs held in registers): 6
 *                or 12
 *   GEMV_ROWS, GEMV_COLS  the largest block of gemv_block: 2, 4, 6 or 12
 *   MAX_CHAINS   running maxima kept apart in softmax_block's max pass
 *   strip_step   ALWAYS_INLINE void (int f8, const void *w, int p, vf *b0,
 *                vf *b1): the two f32 vectors of step p of a packed strip
 *                (the loads and widening differ between the widths)
 *   gemv_block   LoRA's kernel for a compile-time block (cpu_kernels.h gemv;
 *                each width sums its tail in its own way)
 *   bf16_lanes   ALWAYS_INLINE vf (const uint16_t *p): LANES bf16 at p
 *                widened to f32 (exact)
 * Each file keeps what only its width has (strip_step, gemv_block, the
 * bf16 kernels of AVX-512). Both widths run the same operations per lane in the
 * same order, so an element's bits depend on the ISA's lane count only
 * where cpu_kernels.h says so. */
#ifndef ML_CPU_KERNELS_VEC_H
#define ML_CPU_KERNELS_VEC_H

#include <assert.h>
#include <math.h>

#include "dtype.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define LANES VF_LANES
/* A tile is two vectors wide, and so is a packed strip (gemm_packed: the
 * tile over a strip). */
#define TILE_COLS (2 * LANES)
#define STRIP_COLS TILE_COLS
_Static_assert(STRIP_COLS * sizeof(uint16_t) <= ML_CPU_LINE_BYTES,
               "a bf16 step of a strip fits one cache line (packed_tile's prefetch)");

/* A prefetch of the streamed strip's line at a (ML_CPU_PREFETCH_STREAM):
 * into L2 ML_CPU_STRIP_PREFETCH_BYTES ahead, and into L1 the nearer
 * ML_CPU_STRIP_PREFETCH_L1_BYTES ahead (cpu_kernels.h). */
ALWAYS_INLINE void stream_prefetch(const void *a)
{
    _mm_prefetch((const char *)a + ML_CPU_STRIP_PREFETCH_BYTES, _MM_HINT_T1);
    _mm_prefetch((const char *)a + ML_CPU_STRIP_PREFETCH_L1_BYTES, _MM_HINT_T0);
}

/* ML_CPU_PREFETCH_NEXT under way: the plan's bytes from `next` into L2,
 * a unit (a strip step's lines, or one line where a step is less) every
 * k / units steps of the call; its last k % units steps prefetch nothing,
 * and a call of fewer steps than units (a last K block, shorter than the
 * next) prefetches its first k units. */
typedef struct next_units {
    const char *at;
    int every, countdown;
} next_units;

ALWAYS_INLINE next_units next_units_start(const ml_cpu_prefetch *plan, int k, size_t unit)
{
    const size_t units = plan ? (plan->bytes + unit - 1) / unit : 0;
    const int every = units == 0 ? k + 1 : units >= (size_t)k ? 1 : k / (int)units;
    const next_units nu = {.at = plan ? plan->next : NULL, .every = every, .countdown = every};
    return nu;
}

ALWAYS_INLINE void next_units_step(next_units *nu, const size_t unit)
{
    if (--nu->countdown == 0) {
        for (size_t line = 0; line < unit; line += ML_CPU_LINE_BYTES)
            _mm_prefetch(nu->at + line, _MM_HINT_T1);
        nu->at += unit;
        nu->countdown = nu->every;
    }
}

/* ---- memory layer -------------------------------------------------------- */
/* vf_lanes: which lanes a masked load or store touches (lanes outside it
 * read as 0 and are not written). */

#if VMATH_BITS == 512

typedef __mmask16 vf_lanes;

/* Lanes [0, n), any n: none for n <= 0, all for n >= LANES. */
VM_INLINE vf_lanes vf_first_lanes(int n)
{
    return n >= LANES ? (vf_lanes)0xffff : n <= 0 ? (vf_lanes)0 : (vf_lanes)((1u << n) - 1);
}
VM_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
VM_INLINE vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
VM_INLINE vf vf_load_lanes(const float *p, vf_lanes m) { return _mm512_maskz_loadu_ps(m, p); }
VM_INLINE void vf_storeu(float *p, vf v) { _mm512_storeu_ps(p, v); }
VM_INLINE void vf_store_lanes(float *p, vf_lanes m, vf v) { _mm512_mask_storeu_ps(p, m, v); }
VM_INLINE vf vf_broadcast(const float *p) { return _mm512_set1_ps(*p); }
VM_INLINE vf vf_fmsub(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }
VM_INLINE vf_mask vf_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }

#elif VMATH_BITS == 256

typedef __m256i vf_lanes;

VM_INLINE vf_lanes vf_first_lanes(int n) { return vf_first(n); }
VM_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
VM_INLINE vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
VM_INLINE vf vf_load_lanes(const float *p, vf_lanes m) { return _mm256_maskload_ps(p, m); }
VM_INLINE void vf_storeu(float *p, vf v) { _mm256_storeu_ps(p, v); }
VM_INLINE void vf_store_lanes(float *p, vf_lanes m, vf v) { _mm256_maskstore_ps(p, m, v); }
VM_INLINE vf vf_broadcast(const float *p) { return _mm256_broadcast_ss(p); }
VM_INLINE vf vf_fmsub(vf a, vf b, vf c) { return _mm256_fmsub_ps(a, b, c); }
VM_INLINE vf_mask vf_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }

#endif

/* ---- gemm_tile -------------------------------------------------------------- */

/* The width of a tile, fixed at compile time: every column (plain loads),
 * more than one vector (both masked), or one vector (masked, the second
 * vector's FMAs not issued). */
enum { TILE_NARROW, TILE_WIDE, TILE_FULL };

/* The accumulator pairs of m rows, from 0. */
ALWAYS_INLINE void zero_rows(const int m, vf *acc0, vf *acc1)
{
#pragma GCC unroll 16
    for (int i = 0; i < m; i++) {
        acc0[i] = vf_zero();
        acc1[i] = vf_zero();
    }
}

/* C[i][0..n) of row i (ldc apart) += the two accumulators of the row. */
ALWAYS_INLINE void add_row(const int width, float *ci, vf_lanes m0, vf_lanes m1, vf acc0, vf acc1)
{
    if (width == TILE_FULL) {
        vf_storeu(ci, vf_add(vf_loadu(ci), acc0));
        vf_storeu(ci + LANES, vf_add(vf_loadu(ci + LANES), acc1));
        return;
    }
    vf_store_lanes(ci, m0, vf_add(vf_load_lanes(ci, m0), acc0));
    if (width == TILE_WIDE)
        vf_store_lanes(ci + LANES, m1, vf_add(vf_load_lanes(ci + LANES, m1), acc1));
}

/* C[i][0..n) of row i = the two accumulators of the row. */
ALWAYS_INLINE void store_row(const int width, float *ci, vf_lanes m0, vf_lanes m1, vf acc0,
                             vf acc1)
{
    if (width == TILE_FULL) {
        vf_storeu(ci, acc0);
        vf_storeu(ci + LANES, acc1);
        return;
    }
    vf_store_lanes(ci, m0, acc0);
    if (width == TILE_WIDE)
        vf_store_lanes(ci + LANES, m1, acc1);
}

/* The accumulators of m rows added to C's rows (ldc apart), or with add = 0
 * stored there. */
ALWAYS_INLINE void put_rows(const int m, const int width, float *c, size_t ldc, vf_lanes m0,
                            vf_lanes m1, const vf *acc0, const vf *acc1, int add)
{
    if (add) {
#pragma GCC unroll 16
        for (int i = 0; i < m; i++)
            add_row(width, c + (size_t)i * ldc, m0, m1, acc0[i], acc1[i]);
    } else {
#pragma GCC unroll 16
        for (int i = 0; i < m; i++)
            store_row(width, c + (size_t)i * ldc, m0, m1, acc0[i], acc1[i]);
    }
}

/* One tile with compile-time m (so the accumulators live in registers), A
 * layout (a_col: column-major) and width. */
ALWAYS_INLINE void tile(const int m, const int a_col, const int width, int n, int k,
                        const float *a, size_t lda, const float *b, size_t ldb, float *c,
                        size_t ldc, int add)
{
    const vf_lanes m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    vf acc0[TILE_ROWS], acc1[TILE_ROWS];
    zero_rows(m, acc0, acc1);
    for (int p = 0; p < k; p++) {
        const float *bp = b + (size_t)p * ldb;
        const vf b0 = width == TILE_FULL ? vf_loadu(bp) : vf_load_lanes(bp, m0);
        const vf b1 = width == TILE_FULL   ? vf_loadu(bp + LANES)
                      : width == TILE_WIDE ? vf_load_lanes(bp + LANES, m1)
                                           : vf_zero();
#pragma GCC unroll 16
        for (int i = 0; i < m; i++) {
            const vf ai = vf_broadcast(a_col ? &a[(size_t)p * lda + i] : &a[(size_t)i * lda + p]);
            acc0[i] = vf_fmadd(ai, b0, acc0[i]);
            if (width != TILE_NARROW)
                acc1[i] = vf_fmadd(ai, b1, acc1[i]);
        }
    }
    put_rows(m, width, c, ldc, m0, m1, acc0, acc1, add);
}

/* The layouts and widths of tile as compile-time arguments. */
ALWAYS_INLINE void tile_w(const int m, const int width, int n, int k, const float *a,
                          size_t a_rs, size_t a_cs, const float *b, size_t ldb, float *c,
                          size_t ldc, int add)
{
    if (a_cs == 1)
        tile(m, 0, width, n, k, a, a_rs, b, ldb, c, ldc, add);
    else
        tile(m, 1, width, n, k, a, a_cs, b, ldb, c, ldc, add);
}

ALWAYS_INLINE void tile_m(const int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                          const float *b, size_t ldb, float *c, size_t ldc, int add)
{
    if (n == TILE_COLS)
        tile_w(m, TILE_FULL, n, k, a, a_rs, a_cs, b, ldb, c, ldc, add);
    else if (n > LANES)
        tile_w(m, TILE_WIDE, n, k, a, a_rs, a_cs, b, ldb, c, ldc, add);
    else
        tile_w(m, TILE_NARROW, n, k, a, a_rs, a_cs, b, ldb, c, ldc, add);
}

/* ---- gemm_packed ------------------------------------------------------------ */

/* Defined by the including file, after this one. */
ALWAYS_INLINE void strip_step(const int f8, const void *w, int p, vf *b0, vf *b1);

/* Step p's two f32 vectors into dst (k, STRIP_COLS) row-major: a widened
 * block, an ML_CPU_BLOCK_F32 block of gemm_packed. */
ALWAYS_INLINE void store_step(float *dst, int p, vf b0, vf b1)
{
    vf_storeu(dst + (size_t)p * STRIP_COLS, b0);
    vf_storeu(dst + (size_t)p * STRIP_COLS + LANES, b1);
}

/* Step p of m rows of x (ldx apart) on a strip step's two vectors:
 * acc += x[i][p] · (b0, b1), the one multiply-add of every sum of
 * gemm_packed (and of gemm_packed_f8_pairs, whose bits are its). */
ALWAYS_INLINE void step_fma(const int m, const float *x, size_t ldx, int p, vf b0, vf b1,
                            vf *acc0, vf *acc1)
{
#pragma GCC unroll 16
    for (int i = 0; i < m; i++) {
        const vf xi = vf_broadcast(x + (size_t)i * ldx + p);
        acc0[i] = vf_fmadd(xi, b0, acc0[i]);
        acc1[i] = vf_fmadd(xi, b1, acc1[i]);
    }
}

ALWAYS_INLINE void packed_tile(const int m, const ml_cpu_block src, const ml_cpu_prefetch_kind pf,
                               int n, int k, const float *x, size_t ldx, const void *w,
                               const ml_cpu_prefetch *plan, float *widened, float *y, size_t ldy,
                               int add)
{
    const vf_lanes m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    vf acc0[TILE_ROWS], acc1[TILE_ROWS];
    zero_rows(m, acc0, acc1);
    const size_t step_bytes = src == ML_CPU_BLOCK_F32 ? STRIP_COLS * sizeof(float)
                              : src == ML_CPU_BLOCK_F8 ? STRIP_COLS
                                                       : STRIP_COLS * sizeof(uint16_t);
    const int line_steps =
        step_bytes < ML_CPU_LINE_BYTES ? (int)(ML_CPU_LINE_BYTES / step_bytes) : 1;
    next_units nu = next_units_start(pf == ML_CPU_PREFETCH_NEXT ? plan : NULL, k,
                                     ML_CPU_LINE_BYTES);
    for (int p = 0; p < k; p++) {
        vf b0, b1;
        if (pf == ML_CPU_PREFETCH_STREAM && p % line_steps == 0) {
            for (size_t line = 0; line < step_bytes; line += ML_CPU_LINE_BYTES)
                stream_prefetch((const char *)w + (size_t)p * step_bytes + line);
        } else if (pf == ML_CPU_PREFETCH_NEXT) {
            next_units_step(&nu, ML_CPU_LINE_BYTES);
        }
        if (src == ML_CPU_BLOCK_F32) {
            b0 = vf_loadu((const float *)w + (size_t)p * STRIP_COLS);
            b1 = vf_loadu((const float *)w + (size_t)p * STRIP_COLS + LANES);
        } else {
            strip_step(src == ML_CPU_BLOCK_F8, w, p, &b0, &b1);
            if (widened)
                store_step(widened, p, b0, b1);
        }
        step_fma(m, x, ldx, p, b0, b1, acc0, acc1);
    }
    put_rows(m, TILE_WIDE, y, ldy, m0, m1, acc0, acc1, add);
}

/* TILE(kind) with pf's kind (NULL: none) as a compile-time argument, so
 * that a tile's prefetch costs no branch a step. */
#define WITH_PREFETCH_KIND(pf, TILE)                                                               \
    switch ((pf) ? (pf)->kind : ML_CPU_PREFETCH_NONE) {                                            \
    case ML_CPU_PREFETCH_STREAM: TILE(ML_CPU_PREFETCH_STREAM); break;                              \
    case ML_CPU_PREFETCH_NEXT: TILE(ML_CPU_PREFETCH_NEXT); break;                                  \
    case ML_CPU_PREFETCH_NONE: TILE(ML_CPU_PREFETCH_NONE); break;                                  \
    }

ALWAYS_INLINE void packed_pf(const int m, const ml_cpu_block src, int n, int k, const float *x,
                             size_t ldx, const void *w, const ml_cpu_prefetch *pf,
                             float *widened, float *y, size_t ldy, int add)
{
#define PACKED_TILE(kind) packed_tile(m, src, kind, n, k, x, ldx, w, pf, widened, y, ldy, add)
    WITH_PREFETCH_KIND(pf, PACKED_TILE)
#undef PACKED_TILE
}

/* And compile-time source. */
ALWAYS_INLINE void packed_m(const int m, int n, int k, const float *x, size_t ldx,
                            const void *w, ml_cpu_block src, const ml_cpu_prefetch *pf,
                            float *widened, float *y, size_t ldy, int add)
{
    switch (src) {
    case ML_CPU_BLOCK_BF16:
        packed_pf(m, ML_CPU_BLOCK_BF16, n, k, x, ldx, w, pf, widened, y, ldy, add);
        break;
    case ML_CPU_BLOCK_F8:
        packed_pf(m, ML_CPU_BLOCK_F8, n, k, x, ldx, w, pf, widened, y, ldy, add);
        break;
    case ML_CPU_BLOCK_F32:
        packed_pf(m, ML_CPU_BLOCK_F32, n, k, x, ldx, w, pf, NULL, y, ldy, add);
        break;
    }
}

/* ---- widen_strip ------------------------------------------------------------ */

/* f8 a compile-time constant: one loop per dtype, no branch a step. */
ALWAYS_INLINE void widen_steps(const int f8, float *dst, const void *w, int k)
{
    for (int p = 0; p < k; p++) {
        vf b0, b1;
        strip_step(f8, w, p, &b0, &b1);
        store_step(dst, p, b0, b1);
    }
}

static void widen_strip(float *dst, const void *w, int f8, int k)
{
    if (f8)
        widen_steps(1, dst, w, k);
    else
        widen_steps(0, dst, w, k);
}

/* ---- bf16_widen ------------------------------------------------------------- */

/* Defined by the including file, after this one. */
ALWAYS_INLINE vf bf16_lanes(const uint16_t *p);

/* A vector of values a step, the tail as the scalar code does it: the
 * rows are head_dim long, a multiple of the lanes in every Llama 3.2
 * Vision. */
static void bf16_widen(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        vf_storeu(dst + i, bf16_lanes(src + i));
    ml_bf16_to_f32_n(dst + i, src + i, n - i);
}

/* Switch cases 1 .. n, case k running call(k): a run-time count made a
 * compile-time one, each case its own copy of a kernel with its
 * accumulators in registers. */
#define CASES_2(call)                                                                             \
    case 1: call(1); break;                                                                       \
    case 2: call(2); break;
#define CASES_4(call)                                                                             \
    CASES_2(call)                                                                                 \
    case 3: call(3); break;                                                                       \
    case 4: call(4); break;
#define CASES_6(call)                                                                             \
    CASES_4(call)                                                                                 \
    case 5: call(5); break;                                                                       \
    case 6: call(6); break;
#define CASES_12(call)                                                                            \
    CASES_6(call)                                                                                 \
    case 7: call(7); break;                                                                       \
    case 8: call(8); break;                                                                       \
    case 9: call(9); break;                                                                       \
    case 10: call(10); break;                                                                     \
    case 11: call(11); break;                                                                     \
    case 12: call(12); break;
/* n a macro (TILE_ROWS...): expanded to its number by the outer one. */
#define CASES_1_TO(n, call) CASES_1_TO_EXPANDED(n, call)
#define CASES_1_TO_EXPANDED(n, call) CASES_##n(call)
#define TILE_M_CASES(call) CASES_1_TO(TILE_ROWS, call)

static void gemm_tile(int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                      const float *b, size_t ldb, float *c, size_t ldc, int add)
{
#define GEMM_TILE_M(mm) tile_m(mm, n, k, a, a_rs, a_cs, b, ldb, c, ldc, add)
    switch (m) {
        TILE_M_CASES(GEMM_TILE_M)
    default: assert(!"gemm_tile: m out of range");
    }
#undef GEMM_TILE_M
}

static void gemm_packed(int m, int n, int k, const float *x, size_t ldx, const void *w,
                        ml_cpu_block src, const ml_cpu_prefetch *pf, float *widened, float *y,
                        size_t ldy, int add)
{
#define GEMM_PACKED_M(mm) packed_m(mm, n, k, x, ldx, w, src, pf, widened, y, ldy, add)
    switch (m) {
        TILE_M_CASES(GEMM_PACKED_M)
    default: assert(!"gemm_packed: m out of range");
    }
#undef GEMM_PACKED_M
}

/* ---- gemv ------------------------------------------------------------------- */

/* Defined by the including file: the block of compile-time rows x cols. */
ALWAYS_INLINE void gemv_block(const int rows, const int cols, int K, const uint16_t *w,
                              size_t ldw, const float *x, size_t ldx, float *dots);

ALWAYS_INLINE void gemv_rows(const int rows, int cols, int K, const uint16_t *w, size_t ldw,
                             const float *x, size_t ldx, float *dots)
{
#define GEMV_COLS_N(cc) gemv_block(rows, cc, K, w, ldw, x, ldx, dots)
    switch (cols) {
        CASES_1_TO(GEMV_COLS, GEMV_COLS_N)
    default: assert(!"gemv: cols out of range");
    }
#undef GEMV_COLS_N
}

static void gemv(int rows, int cols, int K, const uint16_t *w, size_t ldw, const float *x,
                 size_t ldx, float *dots)
{
#define GEMV_ROWS_N(rr) gemv_rows(rr, cols, K, w, ldw, x, ldx, dots)
    switch (rows) {
        CASES_1_TO(GEMV_ROWS, GEMV_ROWS_N)
    default: assert(!"gemv: rows out of range");
    }
#undef GEMV_ROWS_N
}

/* ---- softmax_block -------------------------------------------------------- */

static void softmax_block(float *s, size_t lds, int nk, int nq, float scale, float *m, float *l,
                          float *alpha)
{
    assert(scale > 0.0f); /* the max pass below scales the raw maximum */
    const vf vscale = vf_set1(scale);
    const vf neg_inf = vf_set1(-INFINITY);
    for (int c = 0; c < nq; c += LANES) {
        const vf_lanes mk = vf_first_lanes(nq - c);
        const vf m_old = vf_load_lanes(m + c, mk);
        /* Independent running maxima (max is exact in any order): one chain
         * would wait out vmaxps's latency at every key. Of the raw scores,
         * scaled once after: a product's rounding is monotone in the
         * score for scale > 0, so the largest scaled score is the scaled
         * largest one. */
        vf part[MAX_CHAINS];
#pragma GCC unroll 4
        for (int u = 0; u < MAX_CHAINS; u++)
            part[u] = neg_inf;
        int key = 0;
        for (; key + MAX_CHAINS <= nk; key += MAX_CHAINS) {
#pragma GCC unroll 4
            for (int u = 0; u < MAX_CHAINS; u++)
                part[u] = vf_max(vf_load_lanes(s + (size_t)(key + u) * lds + c, mk), part[u]);
        }
        for (; key < nk; key++)
            part[0] = vf_max(vf_load_lanes(s + (size_t)key * lds + c, mk), part[0]);
        vf mx = part[0];
#pragma GCC unroll 4
        for (int u = 1; u < MAX_CHAINS; u++)
            mx = vf_max(part[u], mx);
        mx = vf_max(vf_mul(mx, vscale), m_old);
        /* a column that has seen no key yet subtracts 0, not -inf */
        const vf sh = vf_select(vf_eq(mx, neg_inf), vf_zero(), mx);
        vf sum = vf_zero();
        for (int j = 0; j < nk; j++) {
            float *sj = s + (size_t)j * lds + c;
            const vf e = vm_exp2_below_hi(vf_fmsub(vf_load_lanes(sj, mk), vscale, sh));
            vf_store_lanes(sj, mk, e);
            sum = vf_add(sum, e);
        }
        const vf a = vm_exp2_below_hi(vf_sub(m_old, sh));
        vf_store_lanes(alpha + c, mk, a);
        vf_store_lanes(l + c, mk, vf_fmadd(vf_load_lanes(l + c, mk), a, sum));
        vf_store_lanes(m + c, mk, mx);
    }
}

#endif
