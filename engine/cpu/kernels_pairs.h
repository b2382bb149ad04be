/* The tile on pairs (cpu_kernels.h gemm_tile_bf16 and gemm_tile_f8_pairs),
 * written once for kernels_avx512.c, which includes this file twice:
 *   bf16 B (PAIR_F8 0), compiled for AVX512_BF16;
 *   FP8 B (PAIR_F8 1), compiled for AVX512_BF16 and AVX512_VBMI, which
 *   only a CPU with both runs (the caller checks ml_cpu_has_avx512_vbmi):
 *   a target attribute reaches only the functions it is on, so the bf16
 *   kernel stays free of VBMI instructions.
 * Before each inclusion define
 *   PAIR_F8      0 or 1, as above
 *   PAIR_TARGET  the functions' target attribute
 *   PAIR_TILE, PAIR_M, PAIR_ENTRY  the names of the tile, of its dispatch
 *                over compile-time shapes and of the table's entry
 * and, for PAIR_F8 1, f8_tables (the lookup tables, made once per call by
 * f8_tables_make()) and f8_pair_step(const f8_tables *, codes, &b0, &b1),
 * the two bf16 pair vectors of a step's 64 codes in the pair layout. Each
 * inclusion undefines them. Included after kernels_vec.h (zero_rows,
 * put_rows, stream_prefetch, TILE_M_CASES). */

/* A pair of B: a dword of two bf16, or two E4M3 codes. */
#if PAIR_F8
#define PAIR_T uint16_t
#else
#define PAIR_T uint32_t
#endif
#define PAIR_BYTES sizeof(PAIR_T)

/* gemm_tile's tile on pairs: compile-time m, A layout (a_col), width
 * (wide) and prefetching (pf, where B is a block of a packed strip). */
PAIR_TARGET ALWAYS_INLINE void PAIR_TILE(const int m, const int a_col, const int wide,
                                         const ml_cpu_prefetch_kind pf, int n, int kp,
                                         const uint32_t *a, size_t lda, const void *b, size_t ldb,
                                         const ml_cpu_prefetch *plan, float *c, size_t ldc,
                                         int add)
{
    const vf_lanes m0 = vf_first_lanes(n), m1 = vf_first_lanes(n - LANES);
    vf acc0[TILE_ROWS], acc1[TILE_ROWS];
#if PAIR_F8
    const f8_tables tables = f8_tables_make();
#endif
    zero_rows(m, acc0, acc1);
    /* a strip's step: two cache lines of bf16 pairs, one of FP8 */
    const size_t step_bytes = ldb * PAIR_BYTES;
    next_units nu = next_units_start(pf == ML_CPU_PREFETCH_NEXT ? plan : NULL, kp, step_bytes);
    for (int p = 0; p < kp; p++) {
        const char *bp = (const char *)b + (size_t)p * step_bytes;
        if (pf == ML_CPU_PREFETCH_STREAM) {
            for (size_t line = 0; line < step_bytes; line += ML_CPU_LINE_BYTES)
                stream_prefetch(bp + line);
        } else if (pf == ML_CPU_PREFETCH_NEXT) {
            next_units_step(&nu, step_bytes);
        }
        __m512bh b0, b1;
#if PAIR_F8
        /* the whole pair step, both halves (a strip's, zero padded) */
        __m512i pairs0, pairs1;
        f8_pair_step(&tables, _mm512_loadu_si512(bp), &pairs0, &pairs1);
        b0 = (__m512bh)pairs0;
        b1 = (__m512bh)pairs1;
#else
        b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, bp);
        b1 = wide ? (__m512bh)_mm512_maskz_loadu_epi32(m1, bp + LANES * PAIR_BYTES)
                  : (__m512bh)_mm512_setzero_si512();
#endif
#pragma GCC unroll 12
        for (int i = 0; i < m; i++) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32(
                (int)(a_col ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]));
            acc0[i] = _mm512_dpbf16_ps(acc0[i], ai, b0);
            if (wide)
                acc1[i] = _mm512_dpbf16_ps(acc1[i], ai, b1);
        }
    }
    put_rows(m, wide ? TILE_WIDE : TILE_NARROW, c, ldc, m0, m1, acc0, acc1, add);
}

/* Prefetching is the matmul's case only: row-major x against a whole strip
 * (and FP8 B is only the matmul's). */
PAIR_TARGET ALWAYS_INLINE void PAIR_M(const int m, int n, int kp, const uint32_t *a, size_t a_rs,
                                      size_t a_cs, const void *b, size_t ldb,
                                      const ml_cpu_prefetch *pf, float *c, size_t ldc, int add)
{
    const int wide = n > LANES;
    const ml_cpu_prefetch_kind kind = pf ? pf->kind : ML_CPU_PREFETCH_NONE;
    if (kind == ML_CPU_PREFETCH_STREAM && a_cs == 1 && wide)
        PAIR_TILE(m, 0, 1, ML_CPU_PREFETCH_STREAM, n, kp, a, a_rs, b, ldb, pf, c, ldc, add);
    else if (kind == ML_CPU_PREFETCH_NEXT && a_cs == 1 && wide)
        PAIR_TILE(m, 0, 1, ML_CPU_PREFETCH_NEXT, n, kp, a, a_rs, b, ldb, pf, c, ldc, add);
    else if (a_cs == 1 && wide)
        PAIR_TILE(m, 0, 1, ML_CPU_PREFETCH_NONE, n, kp, a, a_rs, b, ldb, pf, c, ldc, add);
    else if (a_cs == 1)
        PAIR_TILE(m, 0, 0, ML_CPU_PREFETCH_NONE, n, kp, a, a_rs, b, ldb, pf, c, ldc, add);
#if !PAIR_F8
    else if (wide)
        PAIR_TILE(m, 1, 1, ML_CPU_PREFETCH_NONE, n, kp, a, a_cs, b, ldb, pf, c, ldc, add);
    else
        PAIR_TILE(m, 1, 0, ML_CPU_PREFETCH_NONE, n, kp, a, a_cs, b, ldb, pf, c, ldc, add);
#else
    else
        assert(!"gemm_tile_f8_pairs: A must be row-major");
#endif
}

PAIR_TARGET static void PAIR_ENTRY(int m, int n, int kp, const uint32_t *a, size_t a_rs,
                                   size_t a_cs, const PAIR_T *b, size_t ldb,
                                   const ml_cpu_prefetch *pf, float *c, size_t ldc, int add)
{
#define PAIR_ENTRY_M(mm) PAIR_M(mm, n, kp, a, a_rs, a_cs, b, ldb, pf, c, ldc, add)
    switch (m) {
        TILE_M_CASES(PAIR_ENTRY_M)
    default: assert(!"gemm_tile on pairs: m out of range");
    }
#undef PAIR_ENTRY_M
}

#undef PAIR_BYTES
#undef PAIR_T
#undef PAIR_F8
#undef PAIR_TARGET
#undef PAIR_TILE
#undef PAIR_M
#undef PAIR_ENTRY
