/* matmul (GEMV, tensor cores, tiled), matmul_f8 and lora of the CUDA
 * backend against the CPU backend (matmul_f8's W8A8: against a double
 * reference of backend.h's contract).
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include <assert.h>

#include "cuda_ops_harness.h"

/* Under AddressSanitizer (CI's sanitizer stage of the host build) the cases
 * at the vision tower's sizes are left out: they take no path the smaller
 * cases do not (tensor cores with and without bias, K % 8 != 0, tails in M
 * and N, tiling over M), and their time is the emulated GEMM's arithmetic,
 * which the release stage has already run under three schedule orders
 * (test_cuda_ops_invariance does the same). */
#if defined(__SANITIZE_ADDRESS__)
#define VISION_SIZE_MATMULS 0
#else
#define VISION_SIZE_MATMULS 1
#endif

/* ---- matmul ----------------------------------------------------------------------------- */

/* round_x: x bf16-exact, so the tensor-core path is exact up to f32 sums. */
static void matmul_case(int M, int K, int N, int with_bias, int accumulate, int round_x, double tol)
{
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = round_x ? rand_f32_bf16(nx, -1, 1) : rand_f32(nx, -1, 1);
    uint16_t *w = rand_bf16(nw, -1, 1), *bias = rand_bf16((size_t)N, -1, 1);
    float *y = rand_f32(ny, -1, 1), *got = xmalloc(ny * sizeof *got);
    float *dx = dput(x, nx * sizeof *x), *dy = dput(y, ny * sizeof *y);
    uint16_t *dw = dput(w, nw * sizeof *w), *db = dput(bias, (size_t)N * sizeof *bias);
    cpu_matmul(y, x, w, with_bias ? bias : NULL, M, K, N, accumulate);
    g_gpu->ops->matmul(g_gpu, dy, dx, dw, with_bias ? db : NULL, M, K, N, accumulate);
    char what[128];
    snprintf(what, sizeof what, "matmul %dx%dx%d%s%s%s", M, K, N, with_bias ? " +bias" : "",
             accumulate ? " +=" : "", round_x ? " (x bf16-exact)" : "");
    dget(got, dy, ny * sizeof *got, what);
    check_nmse(got, y, ny, tol, what);
    dfree(dx);
    dfree(dy);
    dfree(dw);
    dfree(db);
    free(x);
    free(w);
    free(bias);
    free(y);
    free(got);
}

static void test_matmul(void)
{
    /* GEMV regime (M <= 4, K % 8 == 0): f32 x, no rounding. */
    matmul_case(1, 4096, 14336, 0, 0, 0, NMSE_F32);  /* 11B gate/up at batch 1 */
    matmul_case(1, 14336, 4096, 0, 0, 0, NMSE_F32);  /* 11B down */
    matmul_case(3, 4096, 1024, 1, 1, 0, NMSE_F32);
    matmul_case(4, 64, 37, 1, 0, 0, NMSE_F32);       /* N not a multiple of 4 */
    /* Tensor cores: x rounded to bf16. */
    matmul_case(2, 588, 64, 1, 0, 0, NMSE_GEMM);     /* K % 8 != 0: never GEMV */
    matmul_case(32, 4096, 4096, 0, 0, 0, NMSE_GEMM); /* decode at batch 32 */
    matmul_case(32, 4096, 4096, 0, 1, 1, NMSE_F32);
    matmul_case(17, 64, 33, 1, 1, 1, NMSE_F32);
    if (VISION_SIZE_MATMULS) {
        matmul_case(1600, 588, 1280, 0, 0, 0, NMSE_GEMM); /* patch embedding of one tile */
        /* The vision tower's projections over its 6432 tokens (4 tiles); the
         * HOST build, whose GEMM is a host loop, takes one tile's 1608. */
#ifdef MLLAMA_CUDA_HOST
        const int vision_tokens = 1608;
#else
        const int vision_tokens = 6432;
#endif
        matmul_case(vision_tokens, 1280, 1280, 0, 0, 0, NMSE_GEMM); /* vision q/k/v/o */
        matmul_case(vision_tokens, 1280, 5120, 1, 0, 0, NMSE_GEMM); /* vision fc1 */
    }
    matmul_case(9000, 8192, 64, 1, 0, 1, NMSE_F32);   /* M·K above the workspace: tiled */
}

/* ---- matmul_f8 -------------------------------------------------------------------------- */

/* backend.h's W8A8 contract in double: s_x and qx exactly as specified
 * (f32 divisions, engine/dtype.h's round-to-nearest-even E4M3), then
 * y = Σ qx·q · (s_x·scale) + bias summed in double. */
static void w8a8_reference(float *y, const float *x, const uint8_t *w, const float *scale,
                           const uint16_t *bias, int M, int K, int N)
{
    float *qx = xmalloc((size_t)K * sizeof *qx);
    for (int m = 0; m < M; m++) {
        const float *row = x + (size_t)m * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(row[k]));
        const float sx = amax > 0.0f ? amax / ML_F8E4M3_MAX : 1.0f;
        for (int k = 0; k < K; k++)
            qx[k] = ml_f8e4m3_to_f32(ml_f32_to_f8e4m3(row[k] / sx));
        for (int n = 0; n < N; n++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++)
                sum += (double)qx[k] * ml_f8e4m3_to_f32(w[(size_t)n * K + k]);
            const float s = sx * scale[n];
            y[(size_t)m * N + n] =
                (float)(sum * s + (bias ? (double)ml_bf16_to_f32(bias[n]) : 0.0));
        }
    }
    free(qx);
}

/* One matmul_f8 against the CPU (W8A16) or the contract (W8A8). Row 0 of x
 * is zero with zero_row (s_x = 1 there). Scales are per-channel absmax
 * scales of weights of ~0.05 (0.05/448). */
static void matmul_f8_case(int M, int K, int N, int with_bias, int quant_x, int zero_row,
                           double tol)
{
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = rand_f32(nx, -1, 1), *scale = rand_f32((size_t)N, 5e-5f, 2e-4f);
    if (zero_row)
        memset(x, 0, (size_t)K * sizeof *x);
    uint8_t *w = rand_e4m3(nw);
    uint16_t *bias = rand_bf16((size_t)N, -1, 1);
    float *y = rand_f32(ny, -1, 1), *got = xmalloc(ny * sizeof *got);
    float *dx = dput(x, nx * sizeof *x), *dy = dput(y, ny * sizeof *y);
    float *dscale = dput(scale, (size_t)N * sizeof *scale);
    uint8_t *dw = dput(w, nw);
    uint16_t *db = dput(bias, (size_t)N * sizeof *bias);
    const uint16_t *b = with_bias ? bias : NULL;
    if (quant_x)
        w8a8_reference(y, x, w, scale, b, M, K, N);
    else
        cpu_matmul_f8(y, x, w, scale, b, M, K, N);
    g_gpu->ops->matmul_f8(g_gpu, dy, dx, dw, dscale, with_bias ? db : NULL, M, K, N, quant_x);
    char what[128];
    snprintf(what, sizeof what, "matmul_f8 %s %dx%dx%d%s%s", quant_x ? "W8A8" : "W8A16", M, K, N,
             with_bias ? " +bias" : "", zero_row ? " (row 0 zero)" : "");
    dget(got, dy, ny * sizeof *got, what);
    check_nmse(got, y, ny, tol, what);
    dfree(dx);
    dfree(dy);
    dfree(dscale);
    dfree(dw);
    dfree(db);
    free(x);
    free(scale);
    free(w);
    free(bias);
    free(y);
    free(got);
}

/* W8A16 is held to the bf16 matmul's tolerances (the weights widen
 * exactly; x is f32 in the GEMV, bf16-rounded in the GEMM). W8A8 to
 * NMSE_F32 where the sum is f32 (the GEMV, the bf16 path): qx·q is exact
 * in f32, so only the summation order differs from the double reference,
 * while one qx code off by one step (2^-4 relative at least) adds
 * ~1/(256·M·K) ≥ 4e-9 here. FP8 tensor cores sum in less than f32:
 * NMSE_F8_MMA, with the quantization checked exactly below. */
static void test_matmul_f8(void)
{
    /* GEMV (M <= 4, K % 16 == 0). */
    matmul_f8_case(1, 4096, 14336, 0, 0, 0, NMSE_F32); /* 11B gate/up at batch 1 */
    matmul_f8_case(3, 4096, 1024, 1, 0, 0, NMSE_F32);
    matmul_f8_case(4, 64, 37, 1, 0, 0, NMSE_F32);      /* N not a multiple of 4 */
    matmul_f8_case(1, 14336, 4096, 0, 1, 0, NMSE_F32); /* 11B down, W8A8 */
    matmul_f8_case(4, 64, 37, 1, 1, 1, NMSE_F32);
    /* GEMM: W8A16 through widened bf16 tiles. */
    matmul_f8_case(2, 40, 64, 1, 0, 0, NMSE_GEMM);     /* K % 16 != 0: never GEMV */
    matmul_f8_case(32, 4096, 4096, 0, 0, 0, NMSE_GEMM); /* decode at batch 32 */
    matmul_f8_case(17, 64, 33, 1, 0, 0, NMSE_GEMM);
    matmul_f8_case(20, 16384, 1100, 1, 0, 0, NMSE_GEMM); /* w in column tiles 1024 + 76 */
    matmul_f8_case(600, 65536, 16, 0, 0, 0, NMSE_GEMM);  /* x in row tiles of 511 */
    /* GEMM W8A8: E4M3 tensor cores (the host device is sm_90), or the bf16
     * path where FP8's layout rules fail (N % 4, K % 16). */
    matmul_f8_case(32, 4096, 1024, 0, 1, 0, NMSE_F8_MMA);
    matmul_f8_case(300, 4096, 1024, 1, 1, 1, NMSE_F8_MMA); /* a prefill chunk */
    matmul_f8_case(17, 64, 36, 1, 1, 0, NMSE_F8_MMA);
    matmul_f8_case(17, 64, 33, 1, 1, 1, NMSE_F32);     /* N % 4 != 0: bf16 path */
    matmul_f8_case(9, 40, 64, 1, 1, 0, NMSE_F32);      /* K % 16 != 0: bf16 path */
}

#define E4M3_ONE 0x38 /* 1.0 */
#define QUANT_K 256

/* W8A8's quantization exactly, on every path: against the identity weight
 * (scale 1), y[m][n] = qx[m][n] · s_x[m], one f32 rounding after exact
 * steps, so it must equal the contract's value (w8a8_reference) exactly.
 * Row 0 holds every E4M3 magnitude and every midpoint between neighbours
 * (the ties: to even), 448 setting s_x = 1, and values below half the
 * smallest subnormal; the other rows are row 0 times factors that make s_x
 * a power of two (the same codes) or not (x / s_x rounds in f32 first). */
static void quantization_case(int M, int N)
{
    static const float factors[] = {1.0f, 0x1p-7f, 0.3f, 3.7e3f, -1e-3f, 0.999f, 2.0f, 1e-30f};
    const int K = QUANT_K;
    float row[QUANT_K];
    int k = 0;
    for (int c = 0; c < E4M3_NAN_CODE; c++, k++) /* the magnitudes, signs alternating */
        row[k] = (c % 2 ? -1.0f : 1.0f) * ml_f8e4m3_to_f32((uint8_t)c);
    for (int c = 0; c + 1 < E4M3_NAN_CODE; c++, k++) /* the midpoints */
        row[k] = (c % 2 ? 1.0f : -1.0f) * 0.5f *
                 (ml_f8e4m3_to_f32((uint8_t)c) + ml_f8e4m3_to_f32((uint8_t)(c + 1)));
    row[k++] = 0x1p-11f;
    row[k++] = -0x1p-10f; /* half the smallest subnormal: a tie, to 0 */
    row[k++] = 447.9f;
    assert(k == K);
    float *x = xmalloc((size_t)M * K * sizeof *x), *scale = xmalloc((size_t)N * sizeof *scale);
    for (int m = 0; m < M; m++)
        for (int i = 0; i < K; i++)
            x[(size_t)m * K + i] = row[i] * factors[m % (int)(sizeof factors / sizeof factors[0])];
    uint8_t *w = calloc((size_t)N * K, 1);
    for (int n = 0; n < N; n++) {
        w[(size_t)n * K + n] = E4M3_ONE;
        scale[n] = 1.0f;
    }
    float *want = xmalloc((size_t)M * N * sizeof *want), *got = xmalloc((size_t)M * N * sizeof *got);
    w8a8_reference(want, x, w, scale, NULL, M, K, N);
    float *dx = dput(x, (size_t)M * K * sizeof *x), *dy = dput(NULL, (size_t)M * N * sizeof *dy);
    float *dscale = dput(scale, (size_t)N * sizeof *scale);
    uint8_t *dw = dput(w, (size_t)N * K);
    g_gpu->ops->matmul_f8(g_gpu, dy, dx, dw, dscale, NULL, M, K, N, 1);
    char what[96];
    snprintf(what, sizeof what, "matmul_f8 W8A8 quantization, %d x %d x %d", M, K, N);
    dget(got, dy, (size_t)M * N * sizeof *got, what);
    int bad = 0, first = -1;
    for (int e = 0; e < M * N; e++)
        if (got[e] != want[e] && bad++ == 0) /* == : the sum's zero may be +0 for a -0 */
            first = e;
    check(bad == 0, "%s: %d values differ, first at %d: %.9g, want %.9g", what, bad, first,
          first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
    fprintf(stderr, "  %-64s %s\n", what, bad ? "DIFFERS" : "exact");
    dfree(dx);
    dfree(dy);
    dfree(dscale);
    dfree(dw);
    free(x);
    free(scale);
    free(w);
    free(want);
    free(got);
}

static void test_quantization(void)
{
    quantization_case(4, QUANT_K);     /* GEMV */
    quantization_case(8, QUANT_K);     /* E4M3 tensor cores */
    quantization_case(8, QUANT_K - 1); /* N % 4 != 0: the bf16 path */
}

/* Three adapters over rows 0-2, 5 and 10-39 of a 40-row batch (rows 3, 4
 * and 6-9 untouched), ranks 16, 8 and 64. */
static void test_lora(void)
{
    enum { ROWS = 40, K = 4096, N = 1024, MAX_RANK = 64, SEGS = 3 };
    static const int start[SEGS] = {0, 5, 10}, rows[SEGS] = {3, 1, 30}, rank[SEGS] = {16, 8, 64};
    float *x = rand_f32((size_t)ROWS * K, -1, 1), *y = rand_f32((size_t)ROWS * N, -1, 1);
    float *t = xmalloc((size_t)ROWS * MAX_RANK * 4), *got = xmalloc((size_t)ROWS * N * 4);
    float *dx = dput(x, (size_t)ROWS * K * 4), *dy = dput(y, (size_t)ROWS * N * 4);
    float *dt = dput(NULL, (size_t)ROWS * MAX_RANK * 4);
    ml_lora_segment cseg[SEGS], gseg[SEGS];
    uint16_t *ha[SEGS], *hb[SEGS];
    void *da[SEGS], *db[SEGS];
    for (int s = 0; s < SEGS; s++) {
        ha[s] = rand_bf16((size_t)rank[s] * K, -0.05f, 0.05f);
        hb[s] = rand_bf16((size_t)N * rank[s], -0.05f, 0.05f);
        da[s] = dput(ha[s], (size_t)rank[s] * K * 2);
        db[s] = dput(hb[s], (size_t)N * rank[s] * 2);
        cseg[s] = (ml_lora_segment){start[s], rows[s], rank[s], 2.0f / rank[s], ha[s], hb[s]};
        gseg[s] = cseg[s];
        gseg[s].a = da[s];
        gseg[s].b = db[s];
    }
    g_cpu->ops->lora(g_cpu, y, x, cseg, SEGS, K, N, t, MAX_RANK);
    g_gpu->ops->lora(g_gpu, dy, dx, gseg, SEGS, K, N, dt, MAX_RANK);
    dget(got, dy, (size_t)ROWS * N * 4, "lora");
    check_nmse(got, y, (size_t)ROWS * N, NMSE_F32, "lora 3 segments, ranks 16/8/64, 4096 -> 1024");
    check_exact(got + 3 * N, y + 3 * N, 2 * N * 4, "lora leaves rows outside segments untouched");
    for (int s = 0; s < SEGS; s++) {
        dfree(da[s]);
        dfree(db[s]);
        free(ha[s]);
        free(hb[s]);
    }
    dfree(dx);
    dfree(dy);
    dfree(dt);
    free(x);
    free(y);
    free(t);
    free(got);
}

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "matmul\n");
    test_matmul();
    test_lora();
    test_matmul_f8();
    test_quantization();
    return cuda_ops_close();
}
