/* matmul: y (M, N) = x (M, K) · wᵀ + bias, w bf16 (N, K) as in checkpoints,
 * x and y f32, f32 accumulation. Weights are widened to f32 exactly and
 * activations are never rounded to bf16, as in the f32 golden references
 * (AVX-512 BF16's vdpbf16ps would round x to bf16 first; it is not used).
 *
 * Two regimes:
 * - M <= GEMV_MAX_M (decode of a few sequences): memory-bound. Threads split N; each streams its
 *   weight rows once, gemv_seq_rows at a time, against up to gemv_seq_cols
 *   activation rows that stay in cache.
 * - larger M (prefill, the vision tower, wider decode steps): blocked GEMM. Threads
 *   form a grid over (M, N); each converts KC x NC panels of its weight rows
 *   to f32 strips of tile_cols columns in its scratch (once per panel, reused
 *   for all its rows) and runs the ISA's register-blocked gemm_tile on them.
 * Batch invariance: both regimes sum an output element in one order, which
 *   depends on K and the ISA only: y = (y or 0) + bias, then for each KC
 *   block in turn, y += (the block's products summed from 0 in increasing
 *   k). gemm_tile sums so by construction and gemv_seq is bound to its
 *   order (cpu_kernels.h), so a row of x gets the same bits whatever M is,
 *   i.e. whatever else the step computes (test_cpu_ops checks it across the
 *   switch), and whatever the thread count.
 *
 * FP8 weights (matmul_f8, W8A16): w is F8_E4M3 (N, K) with a scale per
 * output row. Every E4M3 value is a bf16 value, so each block a regime
 * would read from w is expanded exactly to bf16 in the thread's scratch
 * (stage_f8) and the bf16 driver runs on it from y = 0; the scale then
 * multiplies each finished sum and the bias is added: y = s · Σ x·q + b.
 * Per element that is one sum in the bf16 order (whatever M, the regime
 * or the threads) and two operations after it, so batch invariance holds
 * as for bf16. Where the scale goes: the weight is q · s exactly (a 4-bit
 * by 8-bit product), as the float32 reference decompresses it
 * (compressed-tensors' dequantize in the float32 scale dtype of an f32
 * model); applying s to the sum is that product summed in another order,
 * within the f32 rounding of the bf16 path. Applying it per element in
 * bf16, bf16(q · s), would instead match a bf16 model's decompression and
 * be 2^-9 relative per weight away from the f32 reference.
 *
 * W8A8 (matmul_f8 with quant_x): the rows of x are first quantized once
 * per call, in parallel by rows (ml_cpu_quantize_rows), to E4M3 values
 * held as f32 in the backend's act buffer with their scales s_x; the FP8
 * driver above then runs on them unchanged, and the finish multiplies
 * each sum by s_x[m] · scale[n] instead of scale[n]. A row's quantization
 * reads that row only and its sum is the driver's, so batch invariance
 * holds as for W8A16. qx · q is exact in f32 (two 4-bit significands), so
 * the only rounding past the quantization is the f32 sum's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "dtype.h"

/* Largest M served by the GEMV regime: the measured crossover
 * (bench_cpu_ops gemv, K 4096 x N 14336 on 2 AVX2/AVX-512 cores). gemv_seq
 * transposes each weight block once per gemv_seq_cols rows, so past 4 rows
 * the GEMM, which widens each panel once for all rows, is faster. */
#define GEMV_MAX_M 4
/* GEMM panel: KC x NC f32 (256 KiB) stays in L2 while the thread's rows run
 * over it; NC is a multiple of every ISA's tile_cols. */
#define GEMM_KC 256
#define GEMM_NC 256
/* Threads split N only while each keeps at least this many columns;
 * otherwise they split M (and each packs the same panels). */
#define GEMM_MIN_COLS_PER_THREAD 64

typedef struct matmul_job {
    float *y;           /* (M, N) */
    const float *x;     /* (M, K) */
    const uint16_t *w;  /* (N, K) bf16, or NULL when w8 is set */
    const uint8_t *w8;  /* (N, K) F8_E4M3, or NULL */
    const float *scale; /* (N) of w8 */
    const float *xscale; /* (M) s_x of W8A8 (x holds the quantized rows), or NULL */
    const uint16_t *bias; /* (N) bf16 or NULL */
    int M, K, N, accumulate; /* accumulate is 0 for w8 */
    const ml_cpu_backend *cb;
    int grid_m, grid_n; /* GEMM thread grid */
} matmul_job;

/* Scratch of a thread: the GEMM panel (KC x NC f32), then the bf16 staging
 * of an FP8 block (at most NC rows of KC), in floats. */
#define PANEL_FLOATS ((size_t)GEMM_KC * GEMM_NC)
#define STAGE_FLOATS ((size_t)GEMM_KC * GEMM_NC * sizeof(uint16_t) / sizeof(float))

size_t ml_cpu_matmul_scratch_floats(void)
{
    return PANEL_FLOATS + STAGE_FLOATS;
}

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

static inline float bias_at(const uint16_t *bias, int n)
{
    return bias ? ml_bf16_to_f32(bias[n]) : 0.0f;
}

/* stage (rows, kc) bf16, row stride kc = w8[n0 + r][k0 + c] exactly. */
static void stage_f8(uint16_t *stage, const matmul_job *j, int n0, int rows, int k0, int kc)
{
    const size_t K = (size_t)j->K;
    for (int r = 0; r < rows; r++)
        j->cb->kern->widen_f8(stage + (size_t)r * kc, j->w8 + (size_t)(n0 + r) * K + k0,
                              (size_t)kc);
}

/* The bf16 block of w at rows [n0, n0 + rows), columns [k0, k0 + kc), and
 * its row stride: in place for bf16, staged for FP8. */
static const uint16_t *weight_block(const matmul_job *j, uint16_t *stage, int n0, int rows, int k0,
                                    int kc, size_t *ldw)
{
    if (!j->w8) {
        *ldw = (size_t)j->K;
        return j->w + (size_t)n0 * j->K + k0;
    }
    stage_f8(stage, j, n0, rows, k0, kc);
    *ldw = (size_t)kc;
    return stage;
}

static uint16_t *stage_of(const matmul_job *j, int tid)
{
    return (uint16_t *)(ml_cpu_scratch(j->cb, tid) + PANEL_FLOATS);
}

/* ---- GEMV regime ------------------------------------------------------------ */

/* y[m0..m1, n0..n1] = (y or 0) + bias, or 0 for FP8: the start of every
 * element's sum. */
static void init_block(const matmul_job *j, int m0, int m1, int n0, int n1)
{
    for (int m = m0; m < m1; m++) {
        float *yr = j->y + (size_t)m * j->N;
        for (int n = n0; n < n1; n++)
            yr[n] = j->w8 ? 0.0f : (j->accumulate ? yr[n] : 0.0f) + bias_at(j->bias, n);
    }
}

/* FP8: y[m0..m1, n0..n1] = (s_x · scale) · (the finished sum) + bias, s_x
 * = 1 for W8A16 (1 · scale is scale exactly). */
static void finish_block(const matmul_job *j, int m0, int m1, int n0, int n1)
{
    if (!j->w8)
        return;
    for (int m = m0; m < m1; m++) {
        float *yr = j->y + (size_t)m * j->N;
        const float sx = j->xscale ? j->xscale[m] : 1.0f;
        for (int n = n0; n < n1; n++)
            yr[n] = sx * j->scale[n] * yr[n] + bias_at(j->bias, n);
    }
}

/* Weight rows [begin, end) for every activation row, KC block by block as
 * gemm_block sums them. */
static void gemv_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const matmul_job *j = ctx;
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t K = (size_t)j->K, N = (size_t)j->N;
    uint16_t *stage = stage_of(j, tid);
    for (int n = (int)begin; n < (int)end; n += kn->gemv_seq_rows) {
        const int rows = imin(kn->gemv_seq_rows, (int)end - n);
        init_block(j, 0, j->M, n, n + rows);
        for (int pc = 0; pc < j->K; pc += GEMM_KC) {
            const int kc = imin(GEMM_KC, j->K - pc);
            if (j->w8 && kn->gemv_seq_f8) { /* widened in registers */
                for (int m = 0; m < j->M; m += kn->gemv_seq_cols)
                    kn->gemv_seq_f8(rows, imin(kn->gemv_seq_cols, j->M - m), kc,
                                    j->w8 + (size_t)n * K + pc, K, j->x + (size_t)m * K + pc, K,
                                    j->y + (size_t)m * N + (size_t)n, N);
                continue;
            }
            size_t ldw;
            const uint16_t *w = weight_block(j, stage, n, rows, pc, kc, &ldw);
            for (int m = 0; m < j->M; m += kn->gemv_seq_cols)
                kn->gemv_seq(rows, imin(kn->gemv_seq_cols, j->M - m), kc, w, ldw,
                             j->x + (size_t)m * K + pc, K, j->y + (size_t)m * N + (size_t)n, N);
        }
        finish_block(j, 0, j->M, n, n + rows);
    }
}

/* ---- GEMM regime ------------------------------------------------------------ */

/* Bytes per cache line, for the prefetch stride of pack_panel. */
#define CACHE_LINE 64

/* panel (strips of nr columns, each (kc, nr) row-major) = f32 of
 * w[n0 .. n0+nc, k0 .. k0+kc]ᵀ; columns past nc are zero. Square blocks go
 * through the ISA's pack_block (widen + transpose in registers), ragged
 * edges through the scalar loop. The source is nr short runs far apart,
 * which hardware prefetchers do not follow, so the next strip's lines are
 * prefetched while this one packs. */
static void pack_panel(const ml_cpu_kernels *kn, float *panel, const uint16_t *w, size_t K,
                       int n0, int nc, int k0, int kc)
{
    const int nr = kn->tile_cols, pb = kn->pack_block_size;
    const int kc_blocks = kc / pb * pb;
    const int lines_per_row = (int)((kc * sizeof *w + CACHE_LINE - 1) / CACHE_LINE);
    for (int s = 0; s * nr < nc; s++) {
        float *strip = panel + (size_t)s * kc * nr;
        const int cols = imin(nr, nc - s * nr), next_cols = imin(nr, nc - (s + 1) * nr);
        const int cols_blocks = cols / pb * pb;
        const uint16_t *src = w + (size_t)(n0 + s * nr) * K + k0;
        const uint16_t *next = src + (size_t)nr * K;
        for (int p = 0; p < kc_blocks; p += pb) {
            for (int c = 0; c < cols_blocks; c += pb)
                kn->pack_block(strip + (size_t)p * nr + c, (size_t)nr, src + (size_t)c * K + p, K);
            /* (row, line) = (i % nr, i / nr) for the next strip, one per step */
            for (int i = p; i < p + pb; i++)
                if (i % nr < next_cols && i / nr < lines_per_row)
                    __builtin_prefetch((const char *)(next + (size_t)(i % nr) * K) +
                                       (i / nr) * CACHE_LINE);
        }
        for (int p = 0; p < kc; p++) {
            float *dst = strip + (size_t)p * nr;
            for (int c = p < kc_blocks ? cols_blocks : 0; c < cols; c++)
                dst[c] = ml_bf16_to_f32(src[(size_t)c * K + p]);
            for (int c = cols; c < nr; c++)
                dst[c] = 0.0f;
        }
    }
}

/* y[m0..m1, n0..n1] with the panel buffer `panel` (GEMM_KC x GEMM_NC) and
 * the FP8 staging `stage`. */
static void gemm_block(const matmul_job *j, int m0, int m1, int n0, int n1, float *panel,
                       uint16_t *stage)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t K = (size_t)j->K, N = (size_t)j->N;
    const int mr = kn->tile_rows, nr = kn->tile_cols;

    init_block(j, m0, m1, n0, n1);
    for (int jc = n0; jc < n1; jc += GEMM_NC) {
        const int nc = imin(GEMM_NC, n1 - jc);
        for (int pc = 0; pc < j->K; pc += GEMM_KC) {
            const int kc = imin(GEMM_KC, j->K - pc);
            size_t ldw;
            const uint16_t *w = weight_block(j, stage, jc, nc, pc, kc, &ldw);
            pack_panel(kn, panel, w, ldw, 0, nc, 0, kc);
            for (int ic = m0; ic < m1; ic += mr) {
                const int m = imin(mr, m1 - ic);
                for (int s = 0; s * nr < nc; s++)
                    kn->gemm_tile(m, imin(nr, nc - s * nr), kc, j->x + (size_t)ic * K + pc, K, 1,
                                  panel + (size_t)s * kc * nr, (size_t)nr,
                                  j->y + (size_t)ic * N + (size_t)(jc + s * nr), N);
            }
        }
        finish_block(j, m0, m1, jc, jc + nc);
    }
}

/* [lo, hi) of part `part` of `parts` over n elements, in whole units. */
static void split_units(int n, int unit, int parts, int part, int *lo, int *hi)
{
    const int64_t units = (n + unit - 1) / unit;
    *lo = imin(n, (int)(units * part / parts) * unit);
    *hi = imin(n, (int)(units * (part + 1) / parts) * unit);
}

static void gemm_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const matmul_job *j = ctx;
    const ml_cpu_kernels *kn = j->cb->kern;
    for (int64_t part = begin; part < end; part++) {
        int m0, m1, n0, n1;
        split_units(j->M, kn->tile_rows, j->grid_m, (int)(part / j->grid_n), &m0, &m1);
        split_units(j->N, kn->tile_cols, j->grid_n, (int)(part % j->grid_n), &n0, &n1);
        if (m0 < m1 && n0 < n1)
            gemm_block(j, m0, m1, n0, n1, ml_cpu_scratch(j->cb, tid), stage_of(j, tid));
    }
}

/* Either regime over job (w or w8 set). */
static void run(ml_cpu_backend *cb, matmul_job job)
{
    const int M = job.M, K = job.K, N = job.N;
    if (M <= 0 || N <= 0)
        return;
    if (M <= GEMV_MAX_M) {
        ml_cpu_pool_for(cb->pool, N, ml_cpu_grain((double)M * K), gemv_part, &job);
        return;
    }
    /* One part per thread; prefer splitting N so no two threads pack the
     * same panel. */
    const int64_t want = (int64_t)((double)M * N * K / ML_CPU_MIN_WORK_PER_THREAD);
    const int pool_threads = ml_cpu_pool_threads(cb->pool);
    const int threads = want < 1 ? 1 : want < pool_threads ? (int)want : pool_threads;
    int grid_n = 1;
    for (int d = threads; d > 1; d--) {
        if (threads % d == 0 && N >= d * GEMM_MIN_COLS_PER_THREAD) {
            grid_n = d;
            break;
        }
    }
    job.grid_n = grid_n;
    job.grid_m = threads / grid_n;
    ml_cpu_pool_for(cb->pool, threads, 1, gemm_part, &job);
}

void ml_cpu_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w,
                   const uint16_t *bias, int M, int K, int N, int accumulate)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    run(cb, (matmul_job){.y = y, .x = x, .w = w, .bias = bias, .M = M, .K = K, .N = N,
                         .accumulate = accumulate, .cb = cb});
}

/* ---- W8A8: the activation quantizer ---------------------------------------- */

void ml_cpu_quantize_rows(float *qx, float *sx, const float *x, int m0, int m1, int K)
{
    for (int m = m0; m < m1; m++) {
        const float *xr = x + (size_t)m * K;
        float *qr = qx + (size_t)m * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(xr[k]));
        const float s = amax > 0.0f ? amax / ML_F8E4M3_MAX : 1.0f;
        for (int k = 0; k < K; k++)
            qr[k] = ml_f8e4m3_to_f32(ml_f32_to_f8e4m3(xr[k] / s));
        sx[m] = s;
    }
}

typedef struct quant_job {
    float *qx, *sx;
    const float *x;
    int K;
} quant_job;

/* The quantized rows are held halved and their scales doubled: qx/2 is
 * at most 224, below the 2^8 under which the x86 gemv_seq_f8 scales the
 * activations instead of the weights (gemv_seq_x86.h), and the result is
 * the same bits: every product and partial sum is halved exactly (they
 * stay far above the subnormals) and (2·s_x·scale) · (Σ/2) is the same
 * real number, rounded once, as (s_x·scale) · Σ. */
#define ACT_HALF 0.5f
#define ACT_TWICE 2.0f

static void quant_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const quant_job *q = ctx;
    ml_cpu_quantize_rows(q->qx, q->sx, q->x, (int)begin, (int)end, q->K);
    for (int64_t m = begin; m < end; m++) {
        float *qr = q->qx + (size_t)m * q->K;
        for (int k = 0; k < q->K; k++)
            qr[k] *= ACT_HALF;
        q->sx[m] *= ACT_TWICE;
    }
}

/* The act buffer with room for floats, grown if needed; NULL (latched)
 * when it cannot be. */
static float *act_buffer(ml_cpu_backend *cb, size_t floats)
{
    if (floats <= cb->act_floats)
        return cb->act;
    const size_t bytes = (floats * sizeof(float) + ML_CPU_ALIGN - 1) / ML_CPU_ALIGN * ML_CPU_ALIGN;
    float *p = aligned_alloc(ML_CPU_ALIGN, bytes);
    if (!p) {
        ml_cpu_latch(cb, ML_ERR_NOMEM, "matmul_f8", "%zu bytes of quantized activations", bytes);
        return NULL;
    }
    free(cb->act);
    cb->act = p;
    cb->act_floats = floats;
    return p;
}

void ml_cpu_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w,
                      const float *scale, const uint16_t *bias, int M, int K, int N,
                      int quant_x)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    matmul_job job = {.y = y, .x = x, .w8 = w, .scale = scale, .bias = bias, .M = M, .K = K,
                      .N = N, .cb = cb};
    if (quant_x && M > 0 && N > 0) {
        float *qx = act_buffer(cb, (size_t)M * K + (size_t)M);
        if (!qx)
            return;
        quant_job q = {.qx = qx, .sx = qx + (size_t)M * K, .x = x, .K = K};
        ml_cpu_pool_for(cb->pool, M, ml_cpu_grain((double)K), quant_part, &q);
        job.x = q.qx;
        job.xscale = q.sx;
    }
    run(cb, job);
}
