/* matmul (GEMV, tensor cores, tiled) and lora of the CUDA backend against
 * the CPU backend.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

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
    g_cpu->ops->matmul(g_cpu, y, x, w, with_bias ? bias : NULL, M, K, N, accumulate);
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
    matmul_case(9000, 8192, 64, 1, 0, 1, NMSE_F32);   /* M·K above the workspace: tiled */
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
    return cuda_ops_close();
}
