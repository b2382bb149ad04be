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

ALWAYS_INLINE __m512 bf16_lanes(const uint16_t *p)
{
    return bf16_to_f32(_mm256_loadu_si256((const __m256i *)p));
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

#define PAIR_F8 0
#define PAIR_TARGET BF16_TARGET
#define PAIR_TILE pair_tile
#define PAIR_M pair_m
#define PAIR_ENTRY gemm_tile_bf16
#include "cpu/kernels_pairs.h"

/* ---- gemm_tile_f8_pairs ----------------------------------------------------- */

/* The FP8 widening needs AVX512_VBMI (byte permutes across the vector), and
 * the FP8 tile on the bf16 dot product AVX512_BF16 too: only these
 * functions are compiled for them, and only a backend that found them
 * (ml_cpu_has_avx512_vbmi) calls them. */
#define VBMI_TARGET __attribute__((target("avx512vbmi")))
#define F8_TARGET __attribute__((target("avx512bf16,avx512vbmi")))

/* The bf16 bits of the E4M3 magnitude c (0..127, the code without its
 * sign), exactly (every E4M3 value is a bf16): a normal's exponent field
 * rebiased from 7 to 127 over its 3 mantissa bits; a subnormal f · 2^-9
 * normalized (f = 1: 2^-9; 2, 3: 2^-8 · 1.f; 4..7: 2^-7 · 1.ff). */
#define BF16_EXP(e) ((e) << 7)
#define F8_EXP_REBIAS (127 - 7)
#define F8_SUB_BF16(f)                                                                             \
    ((f) >= 4   ? BF16_EXP(F8_EXP_REBIAS) | ((f) & 3) << 5                                         \
     : (f) >= 2 ? BF16_EXP(F8_EXP_REBIAS - 1) | ((f) & 1) << 6                                     \
     : (f)      ? BF16_EXP(F8_EXP_REBIAS - 2)                                                      \
                : 0)
#define F8_BF16(c)                                                                                 \
    ((c) >> 3 ? BF16_EXP(((c) >> 3) + F8_EXP_REBIAS) | ((c) & 7) << 4 : F8_SUB_BF16((c) & 7))
#define F8_BF16_LO(c) (uint8_t)(F8_BF16(c) & 0xff)
#define F8_BF16_HI(c) (uint8_t)(F8_BF16(c) >> 8)
#define REP8(X, c) X(c), X(c + 1), X(c + 2), X(c + 3), X(c + 4), X(c + 5), X(c + 6), X(c + 7)
#define REP64(X, c)                                                                                \
    REP8(X, c), REP8(X, c + 8), REP8(X, c + 16), REP8(X, c + 24), REP8(X, c + 32),                 \
        REP8(X, c + 40), REP8(X, c + 48), REP8(X, c + 56)

static const uint8_t f8_bf16_lo[128] = {REP64(F8_BF16_LO, 0), REP64(F8_BF16_LO, 64)};
static const uint8_t f8_bf16_hi[128] = {REP64(F8_BF16_HI, 0), REP64(F8_BF16_HI, 64)};

/* VPERMI2B's two-register tables of f8_bf16_lo and _hi. */
typedef struct f8_tables {
    __m512i lo0, lo1, hi0, hi1;
} f8_tables;

VBMI_TARGET ALWAYS_INLINE f8_tables f8_tables_make(void)
{
    return (f8_tables){.lo0 = _mm512_loadu_si512(f8_bf16_lo),
                       .lo1 = _mm512_loadu_si512(f8_bf16_lo + 64),
                       .hi0 = _mm512_loadu_si512(f8_bf16_hi),
                       .hi1 = _mm512_loadu_si512(f8_bf16_hi + 64)};
}

/* A pair step's 64 codes (32 columns' pairs, ml_cpu_f8_pair_index) widened
 * to its two bf16 pair vectors: each code's low and high bf16 byte looked
 * up by its 7 magnitude bits (VPERMI2B ignores the 8th), the sign put back
 * in the high byte, and the bytes interleaved into words within each
 * 16-byte lane, which the layout's order turns into column order: 2
 * permutes, 2 unpacks and a logic op for 64 codes. Shifts, masks and a
 * word lookup of the subnormals took 14 instructions (measured: a decode
 * step of 8 sequences of `small` with FP8 Linears and lm_head 0.73-1.00x
 * the time, median 0.84), and interleaving by two more VPERMI2B, each two
 * uops on the Intel Xeon VM against an unpack's one, held a one-row matmul
 * of codes from L2 to 27-29 GB/s on 2 threads, against 33-36 with the
 * unpacks (2026-12-07, bench_cpu_ops group layers;
 * tests/bench/results-log.md). The NaN codes, which no
 * checkpoint holds, widen to ±480 as ml_cpu_f8_to_f32's. */
_Static_assert(2 * ML_CPU_F8_PAIR_RUN == sizeof(__m128i),
               "VPUNPCKLBW and VPUNPCKHBW interleave runs of 8 bytes in 16-byte lanes");
VBMI_TARGET ALWAYS_INLINE void f8_pair_step(const f8_tables *t, __m512i codes, __m512i *b0,
                                            __m512i *b1)
{
    const __m512i lo = _mm512_permutex2var_epi8(t->lo0, codes, t->lo1);
    /* hi | (codes & sign) */
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->hi0, codes, t->hi1),
                                                 codes, _mm512_set1_epi8((char)0x80), 0xf8);
    *b0 = _mm512_unpacklo_epi8(lo, hi);
    *b1 = _mm512_unpackhi_epi8(lo, hi);
}

#define PAIR_F8 1
#define PAIR_TARGET F8_TARGET
#define PAIR_TILE f8_pair_tile
#define PAIR_M f8_pair_m
#define PAIR_ENTRY gemm_tile_f8_pairs
#include "cpu/kernels_pairs.h"

/* ---- gemm_packed_f8_pairs ---------------------------------------------------- */

/* FP8 codes in the pair layout with f32 activations: f8_pair_step's bf16
 * pairs, each split into its two f32 values by a shift and a mask (a bf16
 * is the high half of its f32), then gemm_packed's FMAs, a step at a time.
 * The same f32 values as strip_step's, in the same order, so the same
 * bits. Widening 64 codes takes 2 permutes, 2 unpacks, a logic op and 4
 * shifts or masks, against strip_step's 18 uops (per 16 codes a sign
 * extension, a shift, a mask and a multiply by 2^120, and an extract a
 * step), which made a one-row FP8 decode step compute bound on the Intel
 * Xeon VM of 2026-12-07 (tests/bench/results-log.md). Putting each code's
 * two bytes straight into the high half of its f32, a masked VPERMI2B per
 * vector of 16 (6 permutes and a logic op in all), was slower there: a
 * VPERMI2B is two uops on the one port the permutes share. */

/* A pair step's 32 columns at steps 2q (s[0], s[1]) and 2q + 1 (s[2],
 * s[3]), each two vectors of columns. */
VBMI_TARGET ALWAYS_INLINE void f8_pair_f32(const f8_tables *t, const uint16_t *w, vf s[4])
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    __m512i cols0, cols1;
    f8_pair_step(t, _mm512_loadu_si512(w), &cols0, &cols1);
    s[0] = _mm512_castsi512_ps(_mm512_slli_epi32(cols0, 16));
    s[1] = _mm512_castsi512_ps(_mm512_slli_epi32(cols1, 16));
    s[2] = _mm512_castsi512_ps(_mm512_and_si512(cols0, high));
    s[3] = _mm512_castsi512_ps(_mm512_and_si512(cols1, high));
}

VBMI_TARGET ALWAYS_INLINE void f8_pairs_tile(const int m, const ml_cpu_prefetch_kind pf, int n,
                                             int k, const float *x, size_t ldx,
                                             const uint16_t *w, const ml_cpu_prefetch *plan,
                                             float *widened, float *y, size_t ldy, int add)
{
    const vf_lanes m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    const f8_tables t = f8_tables_make();
    vf acc0[TILE_ROWS], acc1[TILE_ROWS];
    zero_rows(m, acc0, acc1);
    const int pairs = (k + 1) / 2;
    next_units nu =
        next_units_start(pf == ML_CPU_PREFETCH_NEXT ? plan : NULL, pairs, ML_CPU_LINE_BYTES);
    for (int q = 0; q < pairs; q++) {
        const uint16_t *wq = w + (size_t)q * STRIP_COLS;
        if (pf == ML_CPU_PREFETCH_STREAM)
            stream_prefetch(wq);
        else if (pf == ML_CPU_PREFETCH_NEXT)
            next_units_step(&nu, ML_CPU_LINE_BYTES);
        vf s[4];
        f8_pair_f32(&t, wq, s);
        const int p = 2 * q;
        if (widened)
            store_step(widened, p, s[0], s[1]);
        step_fma(m, x, ldx, p, s[0], s[1], acc0, acc1);
        if (p + 1 < k) {
            if (widened)
                store_step(widened, p + 1, s[2], s[3]);
            step_fma(m, x, ldx, p + 1, s[2], s[3], acc0, acc1);
        }
    }
    put_rows(m, TILE_WIDE, y, ldy, m0, m1, acc0, acc1, add);
}

VBMI_TARGET ALWAYS_INLINE void f8_pairs_pf(const int m, int n, int k, const float *x, size_t ldx,
                                           const uint16_t *w, const ml_cpu_prefetch *pf,
                                           float *widened, float *y, size_t ldy, int add)
{
#define F8_PAIRS_TILE(kind) f8_pairs_tile(m, kind, n, k, x, ldx, w, pf, widened, y, ldy, add)
    WITH_PREFETCH_KIND(pf, F8_PAIRS_TILE)
#undef F8_PAIRS_TILE
}

VBMI_TARGET static void gemm_packed_f8_pairs(int m, int n, int k, const float *x, size_t ldx,
                                             const uint16_t *w, const ml_cpu_prefetch *pf,
                                             float *widened, float *y, size_t ldy, int add)
{
#define F8_PAIRS_M(mm) f8_pairs_pf(mm, n, k, x, ldx, w, pf, widened, y, ldy, add)
    switch (m) {
        TILE_M_CASES(F8_PAIRS_M)
    default: assert(!"gemm_packed_f8_pairs: m out of range");
    }
#undef F8_PAIRS_M
}

VBMI_TARGET static void widen_f8_pairs(float *dst, const uint16_t *w, int k)
{
    const f8_tables t = f8_tables_make();
    for (int p = 0; p < k; p += 2) {
        vf s[4];
        f8_pair_f32(&t, w + (size_t)p * STRIP_COLS / 2, s);
        store_step(dst, p, s[0], s[1]);
        if (p + 1 < k)
            store_step(dst, p + 1, s[2], s[3]);
    }
}

/* ---- gemm_tile_amx ----------------------------------------------------------- */

/* AMX (TMUL with bf16): only these functions are compiled for it, and only a
 * backend that found it usable (ml_cpu_has_amx_bf16, which also asked the
 * kernel for the tile state) calls them. */
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

/* A tile is 16 rows of 64 bytes: 16 pairs of A's row, or 16 pair-steps of
 * 16 columns of B (half a strip step), or 16 x 16 f32 of C. */
#define AMX_ROWS ML_CPU_AMX_ROW_STEP
#define AMX_PAIRS ML_CPU_AMX_CHUNK_PAIRS
#define AMX_ROW_BYTES 64
#define AMX_KERNEL_ROWS ML_CPU_AMX_TILE_ROWS
_Static_assert(STRIP_COLS == 2 * AMX_PAIRS, "a strip is two B tiles wide");

/* The tiles: C (rows 0-15 and 16-31 of the kernel by columns 0-15 and 16-31
 * of the strip), A (the two row halves) and B (the strip's two column
 * halves); every one 16 rows of 64 bytes, whatever m or n. Literals, not
 * an enum: GCC's tile intrinsics paste the number into the instruction. */
#define AMX_C00 0
#define AMX_C01 1
#define AMX_C10 2
#define AMX_C11 3
#define AMX_A0 4
#define AMX_A1 5
#define AMX_B0 6
#define AMX_B1 7

/* One shape for every call: loading a configuration took ~110 ns here (a
 * third of a 256-step call), so short rows and columns go through
 * gemm_tile_amx's bounce buffers instead of a configuration of their own. */
#define AMX_ALL(v) {v, v, v, v, v, v, v, v}
const ml_cpu_amx_config ml_cpu_amx_shape = {
    .palette = 1, .colsb = AMX_ALL(AMX_ROW_BYTES), .rows = AMX_ALL(AMX_ROWS)};
#undef AMX_ALL
static _Thread_local int amx_configured;

/* GCC's tile loads name their address as a register, not as memory read:
 * this makes p's bytes visible to them (the stores before it done, none
 * dropped). */
ALWAYS_INLINE void amx_publish(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* C rows [0, m) by columns [0, n) between c (ldc apart) and the bounce
 * buffer (STRIP_COLS apart): in (add: C's values, else zeros) or out. */
ALWAYS_INLINE void amx_bounce_in(int m, int n, const float *c, size_t ldc, float *bounce,
                                 int add)
{
    const __mmask16 m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    for (int i = 0; i < m; i++) {
        float *r = bounce + (size_t)i * STRIP_COLS;
        _mm512_store_ps(r, add ? _mm512_maskz_loadu_ps(m0, c + (size_t)i * ldc) : vf_zero());
        _mm512_store_ps(r + LANES,
                        add ? _mm512_maskz_loadu_ps(m1, c + (size_t)i * ldc + LANES) : vf_zero());
    }
}

ALWAYS_INLINE void amx_bounce_out(int m, int n, float *c, size_t ldc, const float *bounce)
{
    const __mmask16 m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    for (int i = 0; i < m; i++) {
        const float *r = bounce + (size_t)i * STRIP_COLS;
        _mm512_mask_storeu_ps(c + (size_t)i * ldc, m0, _mm512_load_ps(r));
        _mm512_mask_storeu_ps(c + (size_t)i * ldc + LANES, m1, _mm512_load_ps(r + LANES));
    }
}

/* One chunk of AMX_PAIRS pairs into the C tiles: the rows' first half, and
 * with `two` the second; B's first 16 columns, and with `wide` the next 16.
 * A from a (lda dwords apart), B from b (ldb apart). */
AMX_TARGET ALWAYS_INLINE void amx_chunk(const int two, const int wide, const uint32_t *a,
                                        size_t lda, const uint32_t *b, size_t ldb)
{
    _tile_loadd(AMX_B0, b, ldb * sizeof(uint32_t));
    if (wide)
        _tile_loadd(AMX_B1, b + AMX_PAIRS, ldb * sizeof(uint32_t));
    _tile_loadd(AMX_A0, a, lda * sizeof(uint32_t));
    _tile_dpbf16ps(AMX_C00, AMX_A0, AMX_B0);
    if (wide)
        _tile_dpbf16ps(AMX_C01, AMX_A0, AMX_B1);
    if (two) {
        _tile_loadd(AMX_A1, a + AMX_ROWS * lda, lda * sizeof(uint32_t));
        _tile_dpbf16ps(AMX_C10, AMX_A1, AMX_B0);
        if (wide)
            _tile_dpbf16ps(AMX_C11, AMX_A1, AMX_B1);
    }
}

/* OP(tile, address) on each C tile of amx_tile's call, at its place in ct
 * (ldct floats a row): the tile numbers must be literals (GCC). */
#define AMX_EACH_C(OP)                                                                             \
    do {                                                                                           \
        OP(AMX_C00, ct);                                                                           \
        if (wide)                                                                                  \
            OP(AMX_C01, ct + LANES);                                                               \
        if (two) {                                                                                 \
            OP(AMX_C10, ct + AMX_ROWS * ldct);                                                     \
            if (wide)                                                                              \
                OP(AMX_C11, ct + AMX_ROWS * ldct + LANES);                                         \
        }                                                                                          \
    } while (0)
#define AMX_LOAD_C(tile, at) _tile_loadd(tile, at, stride)
#define AMX_STORE_C(tile, at) _tile_stored(tile, at, stride)

/* gemm_tile_amx with compile-time halves (two: m > AMX_ROWS; wide: n >
 * AMX_PAIRS) and prefetching. */
AMX_TARGET ALWAYS_INLINE void amx_tile(const int two, const int wide,
                                       const ml_cpu_prefetch_kind pf, int m, int n, int kp,
                                       const uint32_t *a, size_t lda, const uint32_t *b,
                                       size_t ldb, const ml_cpu_prefetch *plan, float *c,
                                       size_t ldc, int add)
{
    _Alignas(64) float bounce[AMX_KERNEL_ROWS * STRIP_COLS];
    const int direct = n == (wide ? STRIP_COLS : LANES) && m == (two ? AMX_KERNEL_ROWS : AMX_ROWS);
    float *ct = direct ? c : bounce;
    const size_t ldct = direct ? ldc : STRIP_COLS, stride = ldct * sizeof(float);
    if (!direct) {
        amx_bounce_in(m, n, c, ldc, bounce, add);
        amx_publish(bounce);
    }
    if (add || !direct) {
        AMX_EACH_C(AMX_LOAD_C);
    } else {
        _tile_zero(AMX_C00);
        _tile_zero(AMX_C01);
        _tile_zero(AMX_C10);
        _tile_zero(AMX_C11);
    }
    const int chunks = kp / AMX_PAIRS;
    const size_t chunk_bytes = (size_t)AMX_PAIRS * ldb * sizeof(uint32_t);
    next_units nu = next_units_start(pf == ML_CPU_PREFETCH_NEXT ? plan : NULL, chunks, chunk_bytes);
    for (int q = 0; q < chunks; q++) {
        const uint32_t *bq = b + (size_t)q * AMX_PAIRS * ldb;
        if (pf == ML_CPU_PREFETCH_STREAM) {
            for (size_t line = 0; line < chunk_bytes; line += ML_CPU_LINE_BYTES)
                stream_prefetch((const char *)bq + line);
        } else if (pf == ML_CPU_PREFETCH_NEXT) {
            next_units_step(&nu, chunk_bytes);
        }
        amx_chunk(two, wide, a + (size_t)q * AMX_PAIRS, lda, bq, ldb);
    }
    /* The last pairs, fewer than a chunk: a chunk of their copies padded
     * with zero pairs, whose products add exact zeros. */
    const int tail = kp - chunks * AMX_PAIRS;
    if (tail) {
        const int cols = wide ? STRIP_COLS : AMX_PAIRS;
        _Alignas(64) uint32_t at[AMX_KERNEL_ROWS * AMX_PAIRS] = {0};
        _Alignas(64) uint32_t bt[AMX_PAIRS * STRIP_COLS] = {0};
        for (int i = 0; i < m; i++)
            memcpy(at + (size_t)i * AMX_PAIRS, a + (size_t)i * lda + (size_t)chunks * AMX_PAIRS,
                   (size_t)tail * sizeof(uint32_t));
        for (int p = 0; p < tail; p++)
            memcpy(bt + (size_t)p * STRIP_COLS, b + (size_t)(chunks * AMX_PAIRS + p) * ldb,
                   (size_t)cols * sizeof(uint32_t));
        amx_publish(at);
        amx_publish(bt);
        amx_chunk(two, wide, at, AMX_PAIRS, bt, STRIP_COLS);
    }
    AMX_EACH_C(AMX_STORE_C);
    if (!direct) {
        amx_publish(bounce);
        amx_bounce_out(m, n, c, ldc, bounce);
    }
}
#undef AMX_EACH_C
#undef AMX_LOAD_C
#undef AMX_STORE_C

AMX_TARGET static void gemm_tile_amx(int m, int n, int kp, const uint32_t *a, size_t lda,
                                     const uint32_t *b, size_t ldb, const ml_cpu_prefetch *pf,
                                     float *c, size_t ldc, int add)
{
    assert(m >= 1 && m <= AMX_KERNEL_ROWS && n >= 1 && n <= STRIP_COLS);
    if (!amx_configured) {
        _tile_loadconfig(&ml_cpu_amx_shape);
        amx_configured = 1;
    }
    const ml_cpu_prefetch_kind kind = pf ? pf->kind : ML_CPU_PREFETCH_NONE;
#define AMX_TILE_PF(two, wide)                                                                     \
    do {                                                                                           \
        if (kind == ML_CPU_PREFETCH_STREAM)                                                        \
            amx_tile(two, wide, ML_CPU_PREFETCH_STREAM, m, n, kp, a, lda, b, ldb, pf, c, ldc,      \
                     add);                                                                         \
        else if (kind == ML_CPU_PREFETCH_NEXT)                                                     \
            amx_tile(two, wide, ML_CPU_PREFETCH_NEXT, m, n, kp, a, lda, b, ldb, pf, c, ldc, add);  \
        else                                                                                       \
            amx_tile(two, wide, ML_CPU_PREFETCH_NONE, m, n, kp, a, lda, b, ldb, pf, c, ldc, add);  \
    } while (0)
    const int two = m > AMX_ROWS, wide = n > AMX_PAIRS;
    if (two && wide)
        AMX_TILE_PF(1, 1);
    else if (two)
        AMX_TILE_PF(1, 0);
    else if (wide)
        AMX_TILE_PF(0, 1);
    else
        AMX_TILE_PF(0, 0);
#undef AMX_TILE_PF
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
    .gemm_tile_f8_pairs = gemm_tile_f8_pairs,
    .gemm_packed_f8_pairs = gemm_packed_f8_pairs,
    .widen_f8_pairs = widen_f8_pairs,
    .gemm_tile_amx = gemm_tile_amx,
    .bf16_pairs = bf16_pairs,
    .bf16_pair_rows = bf16_pair_rows,
    .softmax_block = softmax_block,
    .exp_n = vm_exp_n,
    .erf_n = vm_erf_n,
    .gelu = vm_gelu,
    .silu_mul = vm_silu_mul,
    .bf16_widen = bf16_widen,
    .widen_strip = widen_strip,
};

#endif
