/* Every op of the CUDA backend against the CPU backend (the reference) on
 * random inputs, at small shapes and at the shapes of the real model
 * (ggml's test-backend-ops, with an NMSE = Σ(gpu - cpu)² / Σcpu² per op).
 * Skipped (77) without a CUDA device.
 *
 * Thresholds, with u = 2^-24 (f32) and E[δ²] ≈ 2.8e-6 the mean squared
 * relative error of rounding a value to bf16 (unit roundoff 2^-8; uniform
 * error within a binade, averaged over the significand: 2^-16·0.54/3):
 * - NMSE_F32 = 1e-9: both sides in f32, only the summation order differs.
 *   A sum of K random products carries a relative error ~u·sqrt(K/2)
 *   (5e-6 at K = 14336), an NMSE of ~3e-11; norms, activations and RoPE
 *   (CUDA's erff/expf/cosf/sinf are within 2 ulp of libm) are far below.
 * - NMSE_GEMM = 2e-5: matmul with M > 4 rounds x to bf16 for the tensor
 *   cores. Each product then carries an independent relative error of
 *   variance E[δ²], so the output NMSE is E[δ²] ≈ 2.8e-6 whatever K is;
 *   2e-5 leaves 7x headroom, while one wrong element, row or bias term
 *   costs far more (a dropped term of K adds ~1/K ≥ 7e-5).
 * - NMSE_MMA = 5e-5: the tensor-core vision attention rounds Q, K, V and P
 *   to bf16: V and P each add ~E[δ²] to the NMSE, and the score error
 *   (scale·Σ q·k with both rounded, ~1.6e-3 absolute for the inputs here)
 *   shifts the softmax weights by about that relatively, ~2.5e-6 more:
 *   ~8e-6 in all, 6x headroom.
 * - Caches: the GPU stores K/V in bf16, the CPU in f32. The inputs of the
 *   causal and cross tests are rounded to bf16 first, so both caches hold
 *   the same values and those ops are held to NMSE_F32; kv_write and
 *   kv_store must equal ml_f32_to_bf16 of the input bit for bit.
 * - lora is f32 throughout (bf16 adapters widened): NMSE_F32.
 * - Data movement (copy_2d, embed, patchify, zero), add_rows and add_bf16
 *   must match exactly (the GPU rounds each product as the CPU does).
 * - sample: greedy tokens and top logprob ids exactly, logprob values and
 *   draws within float rounding (see the sampling section). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "harness.h"
#include "mlk_backend.h"
#include "mlk_device.h"
#include "test_rand.h"

#define NMSE_F32 1e-9
#define NMSE_GEMM 2e-5
#define NMSE_MMA 5e-5
#define POOL_BYTES ((size_t)8 << 30)
#define ERRLEN 512
#define RNG_SEED 0x2545f4914f6cdd1dull /* the inputs this test has always drawn */

static ml_backend *g_cpu, *g_gpu;

/* ---- helpers ------------------------------------------------------------------------ */

/* n random floats in [lo, hi), owned by the caller (free). */
static float *rand_f32(size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof *x);
    fill(x, n, lo, hi);
    return x;
}

/* Random values that bf16 represents exactly (the GPU's K/V caches). */
static float *rand_f32_bf16(size_t n, float lo, float hi)
{
    float *x = rand_f32(n, lo, hi);
    for (size_t i = 0; i < n; i++)
        x[i] = ml_round_bf16(x[i]);
    return x;
}

/* n random bf16 values from [lo, hi), owned by the caller (free). */
static uint16_t *rand_bf16(size_t n, float lo, float hi)
{
    uint16_t *w = xmalloc(n * sizeof *w);
    fill_bf16(w, n, lo, hi);
    return w;
}

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = ml_f32_to_bf16(x[i]);
    return w;
}

static void sync_ok(const char *what)
{
    char err[ERRLEN] = "";
    ml_status st = g_gpu->ops->synchronize(g_gpu, err, sizeof err);
    check(st == ML_OK, "%s: synchronize: %s", what, err);
}

/* Device copy of host bytes (exits when the pool is exhausted). */
static void *dput(const void *host, size_t bytes)
{
    void *d = g_gpu->ops->alloc(g_gpu, bytes);
    if (!d) {
        fprintf(stderr, "device pool exhausted (%zu bytes)\n", bytes);
        exit(1);
    }
    if (host)
        g_gpu->ops->upload(g_gpu, d, host, bytes);
    return d;
}

static void dget(void *host, const void *dev, size_t bytes, const char *what)
{
    g_gpu->ops->download(g_gpu, host, dev, bytes);
    sync_ok(what);
}

static void dfree(void *d)
{
    g_gpu->ops->free(g_gpu, d);
}

static void check_nmse(const float *got, const float *want, size_t n, double tol, const char *what)
{
    const double e = tensor_nmse(got, want, n);
    double max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        max_abs = d > max_abs || d != d ? d : max_abs;
    }
    check(e <= tol, "%s: NMSE %.3g above %.3g (max |diff| %.3g)", what, e, tol, max_abs);
    fprintf(stderr, "  %-64s NMSE %.2e (limit %.0e) max|diff| %.2e\n", what, e, tol, max_abs);
}

static void check_exact(const void *got, const void *want, size_t bytes, const char *what)
{
    size_t at = 0;
    while (at < bytes && ((const unsigned char *)got)[at] == ((const unsigned char *)want)[at])
        at++;
    check(at == bytes, "%s: differs from the CPU at byte %zu of %zu", what, at, bytes);
    fprintf(stderr, "  %-64s %s\n", what, at == bytes ? "exact" : "DIFFERS");
}

/* ---- memory, weights, transfers, errors ------------------------------------------------ */

static void test_memory(void)
{
    const ml_backend_ops *o = g_gpu->ops;
    check(o->kv_elem_size == 2, "kv_elem_size is 2 (bf16 caches)");
    void *a = o->alloc(g_gpu, 1000), *b = o->alloc(g_gpu, 1), *c = o->alloc(g_gpu, 0);
    check(a && b && c && (uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0,
          "alloc: 256-byte aligned blocks");
    check(o->alloc(g_gpu, POOL_BYTES) == NULL, "alloc beyond the pool returns NULL");
    o->free(g_gpu, b);
    void *b2 = o->alloc(g_gpu, 200);
    check(b2 == b, "first fit reuses the freed block");
    o->free(g_gpu, a);
    o->free(g_gpu, b2);
    o->free(g_gpu, c);
    void *big = o->alloc(g_gpu, 3000);
    check(big == a, "freed neighbours coalesce (got %p, first block %p)", big, a);
    o->free(g_gpu, big);

    /* Round trips through the pinned staging and the direct path. */
    const size_t small = 1 << 16, large = (size_t)80 << 20;
    float *h = rand_f32(large / sizeof(float), -1, 1), *back = xmalloc(large);
    void *d = dput(h, large);
    memset(back, 0, large);
    o->download(g_gpu, back, d, small);
    sync_ok("download small");
    check(memcmp(h, back, small) == 0, "upload / staged download round trip");
    dget(back, d, large, "download large");
    check(memcmp(h, back, large) == 0, "upload / direct download round trip (80 MiB)");
    dfree(d);

    const void *w1 = o->weight(g_gpu, h, 4096), *w2 = o->weight(g_gpu, h, 4096);
    const void *w3 = o->weight(g_gpu, h + 1024, 4096);
    check(w1 && w1 == w2 && w3 && w3 != w1, "weight: one upload per host tensor");
    memset(back, 0, 4096);
    dget(back, w3, 4096, "weight");
    check(memcmp(back, h + 1024, 4096) == 0, "weight: contents");
    free(h);
    free(back);

    char err[ERRLEN] = "";
    int stray;
    o->free(g_gpu, &stray);
    check(o->synchronize(g_gpu, err, sizeof err) == ML_ERR_INVALID_ARG,
          "freeing a foreign pointer is reported at synchronize");
    fprintf(stderr, "  reported: %s\n", err);
    check(o->synchronize(g_gpu, err, sizeof err) == ML_OK, "the error is reported once");
}

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
    matmul_case(6432, 1280, 1280, 0, 0, 0, NMSE_GEMM); /* vision q/k/v/o */
    matmul_case(6432, 1280, 5120, 1, 0, 0, NMSE_GEMM); /* vision fc1 */
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

/* ---- norms, activations, RoPE ----------------------------------------------------------- */

static void norm_case(int layer, int rows, int dim, int in_place)
{
    const size_t n = (size_t)rows * dim;
    float *x = rand_f32(n, -3, 3), *y = xmalloc(n * sizeof *y), *got = xmalloc(n * sizeof *got);
    uint16_t *w = rand_bf16((size_t)dim, -2, 2), *b = rand_bf16((size_t)dim, -1, 1);
    float *dx = dput(x, n * sizeof *x), *dy = in_place ? dx : dput(NULL, n * sizeof *dy);
    uint16_t *dw = dput(w, (size_t)dim * 2), *db = dput(b, (size_t)dim * 2);
    const float eps = 1e-5f;
    if (layer) {
        g_cpu->ops->layernorm(g_cpu, y, x, w, b, rows, dim, eps);
        g_gpu->ops->layernorm(g_gpu, dy, dx, dw, db, rows, dim, eps);
    } else {
        g_cpu->ops->rmsnorm(g_cpu, y, x, w, rows, dim, eps);
        g_gpu->ops->rmsnorm(g_gpu, dy, dx, dw, rows, dim, eps);
    }
    char what[128];
    snprintf(what, sizeof what, "%s %dx%d%s", layer ? "layernorm" : "rmsnorm", rows, dim,
             in_place ? " in place" : "");
    dget(got, dy, n * sizeof *got, what);
    check_nmse(got, y, n, NMSE_F32, what);
    if (!in_place)
        dfree(dy);
    dfree(dx);
    dfree(dw);
    dfree(db);
    free(x);
    free(y);
    free(got);
    free(w);
    free(b);
}

static void test_norms(void)
{
    norm_case(0, 1, 4096, 0);       /* decode, block per row */
    norm_case(0, 33, 4096, 1);
    norm_case(0, 512 * 32, 128, 1); /* q_norm: warp per row */
    norm_case(0, 7, 40, 0);
    norm_case(1, 6432, 1280, 0);    /* vision tower */
    norm_case(1, 1601, 1280, 1);
    norm_case(1, 9, 32, 0);
}

static void test_activations(void)
{
    const size_t n = (size_t)3 << 20;
    float *x = rand_f32(n, -8, 8), *u = rand_f32(n, -2, 2), *got = xmalloc(n * sizeof *got);
    float *dx = dput(x, n * sizeof *x), *du = dput(u, n * sizeof *u);
    g_cpu->ops->gelu(g_cpu, x, n);
    g_gpu->ops->gelu(g_gpu, dx, n);
    dget(got, dx, n * sizeof *got, "gelu");
    check_nmse(got, x, n, NMSE_F32, "gelu (erf) 3M");
    /* silu_mul with y aliasing gate, as the model calls it. */
    g_cpu->ops->silu_mul(g_cpu, x, x, u, n);
    g_gpu->ops->silu_mul(g_gpu, dx, dx, du, n);
    dget(got, dx, n * sizeof *got, "silu_mul");
    check_nmse(got, x, n, NMSE_F32, "silu_mul 3M, y = gate");
    dfree(dx);
    dfree(du);
    free(x);
    free(u);
    free(got);
}

static void rope_case(int n_tokens, int n_heads, int hd, int max_pos)
{
    const size_t n = (size_t)n_tokens * n_heads * hd;
    float *x = rand_f32(n, -2, 2), *got = xmalloc(n * sizeof *got);
    float *inv = xmalloc((size_t)hd / 2 * sizeof *inv);
    int32_t *pos = xmalloc((size_t)n_tokens * sizeof *pos);
    for (int i = 0; i < hd / 2; i++)
        inv[i] = powf(500000.0f, -2.0f * i / hd);
    for (int t = 0; t < n_tokens; t++)
        pos[t] = t == 0 ? max_pos - 1 : irand(max_pos);
    float *dx = dput(x, n * sizeof *x), *dinv = dput(inv, (size_t)hd / 2 * sizeof *inv);
    int32_t *dpos = dput(pos, (size_t)n_tokens * sizeof *pos);
    g_cpu->ops->rope(g_cpu, x, pos, inv, n_tokens, n_heads, hd);
    g_gpu->ops->rope(g_gpu, dx, dpos, dinv, n_tokens, n_heads, hd);
    char what[128];
    snprintf(what, sizeof what, "rope %d tokens x %d heads x %d, positions < %d", n_tokens,
             n_heads, hd, max_pos);
    dget(got, dx, n * sizeof *got, what);
    check_nmse(got, x, n, NMSE_F32, what);
    dfree(dx);
    dfree(dinv);
    dfree(dpos);
    free(x);
    free(got);
    free(inv);
    free(pos);
}

/* ---- elementwise and data movement ------------------------------------------------------- */

static void test_elementwise(void)
{
    enum { ROWS = 37, DIM = 1280, PERIOD = 5 };
    const size_t n = (size_t)ROWS * DIM;
    float *y = rand_f32(n, -1, 1), *x = rand_f32(n, -1, 1), *rs = rand_f32(ROWS, 0, 1);
    float *got = xmalloc(n * sizeof *got);
    uint16_t *w = rand_bf16((size_t)PERIOD * DIM, -1, 1);
    float *dy = dput(y, n * 4), *dx = dput(x, n * 4), *drs = dput(rs, ROWS * 4);
    uint16_t *dw = dput(w, (size_t)PERIOD * DIM * 2);

    g_cpu->ops->add_rows(g_cpu, y, x, NULL, 0.75f, ROWS, DIM);
    g_gpu->ops->add_rows(g_gpu, dy, dx, NULL, 0.75f, ROWS, DIM);
    g_cpu->ops->add_rows(g_cpu, y, x, rs, -0.3f, ROWS, DIM);
    g_gpu->ops->add_rows(g_gpu, dy, dx, drs, -0.3f, ROWS, DIM);
    dget(got, dy, n * 4, "add_rows");
    check_exact(got, y, n * 4, "add_rows (gate; gate x row_scale)");

    g_cpu->ops->add_bf16(g_cpu, y, w, 0.4f, ROWS, PERIOD, DIM);
    g_gpu->ops->add_bf16(g_gpu, dy, dw, 0.4f, ROWS, PERIOD, DIM);
    dget(got, dy, n * 4, "add_bf16");
    check_exact(got, y, n * 4, "add_bf16 (period 5)");

    /* copy_2d into interleaved columns, as collect_intermediate does. */
    enum { SUB = 100, DST_W = 3 * SUB + 7 };
    float *dst = rand_f32((size_t)ROWS * DST_W, -1, 1), *gdst = xmalloc((size_t)ROWS * DST_W * 4);
    float *ddst = dput(dst, (size_t)ROWS * DST_W * 4);
    g_cpu->ops->copy_2d(g_cpu, dst + 2, x, ROWS, SUB, DST_W, 3, DIM);
    g_gpu->ops->copy_2d(g_gpu, ddst + 2, dx, ROWS, SUB, DST_W, 3, DIM);
    g_cpu->ops->copy_2d(g_cpu, dst + 1, x + 5, ROWS - 1, SUB, DST_W, 1, DIM);
    g_gpu->ops->copy_2d(g_gpu, ddst + 1, dx + 5, ROWS - 1, SUB, DST_W, 1, DIM);
    dget(gdst, ddst, (size_t)ROWS * DST_W * 4, "copy_2d");
    check_exact(gdst, dst, (size_t)ROWS * DST_W * 4, "copy_2d (strided and contiguous columns)");

    g_gpu->ops->zero(g_gpu, dy, n - 3);
    memset(y, 0, (n - 3) * 4);
    dget(got, dy, n * 4, "zero");
    check_exact(got, y, n * 4, "zero (leaves the tail)");

    enum { VOCAB = 1000, EDIM = 256, IDS = 19 };
    uint16_t *table = rand_bf16((size_t)VOCAB * EDIM, -1, 1);
    int32_t ids[IDS];
    for (int i = 0; i < IDS; i++)
        ids[i] = i == 0 ? VOCAB - 1 : irand(VOCAB);
    float *emb = xmalloc((size_t)IDS * EDIM * 4), *gemb = xmalloc((size_t)IDS * EDIM * 4);
    uint16_t *dtable = dput(table, (size_t)VOCAB * EDIM * 2);
    int32_t *dids = dput(ids, sizeof ids);
    float *demb = dput(NULL, (size_t)IDS * EDIM * 4);
    g_cpu->ops->embed(g_cpu, emb, table, ids, IDS, EDIM);
    g_gpu->ops->embed(g_gpu, demb, dtable, dids, IDS, EDIM);
    dget(gemb, demb, (size_t)IDS * EDIM * 4, "embed");
    check_exact(gemb, emb, (size_t)IDS * EDIM * 4, "embed");

    enum { N_IMG = 4, SIDE = 560, PATCH = 14 };
    const size_t npix = (size_t)N_IMG * 3 * SIDE * SIDE;
    float *pix = rand_f32(npix, -2, 2), *pat = xmalloc(npix * 4), *gpat = xmalloc(npix * 4);
    float *dpix = dput(pix, npix * 4), *dpat = dput(NULL, npix * 4);
    g_cpu->ops->patchify(g_cpu, pat, pix, N_IMG, SIDE, PATCH);
    g_gpu->ops->patchify(g_gpu, dpat, dpix, N_IMG, SIDE, PATCH);
    dget(gpat, dpat, npix * 4, "patchify");
    check_exact(gpat, pat, npix * 4, "patchify 4 tiles of 560x560");

    void *dev[] = {dy, dx, drs, dw, ddst, dtable, dids, demb, dpix, dpat};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {y, x, rs, got, w, dst, gdst, table, emb, gemb, pix, pat, gpat};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

static void test_caches(void)
{
    enum { SLOTS = 64, T = 9, KVH = 8, HD = 128 };
    const size_t row = (size_t)KVH * HD, cache_n = (size_t)SLOTS * row;
    float *k = rand_f32((size_t)T * row, -3, 3), *v = rand_f32((size_t)T * row, -3, 3);
    float *kc = rand_f32(cache_n, -1, 1), *vc = rand_f32(cache_n, -1, 1);
    int32_t slot[T];
    for (int t = 0; t < T; t++) /* every third row a padding row: written nowhere */
        slot[t] = t % 3 == 2 ? -1 : 7 * t + 3;
    uint16_t *kc16 = to_bf16(kc, cache_n), *vc16 = to_bf16(vc, cache_n);
    uint16_t *dkc = dput(kc16, cache_n * 2), *dvc = dput(vc16, cache_n * 2);
    float *dk = dput(k, (size_t)T * row * 4), *dv = dput(v, (size_t)T * row * 4);
    int32_t *dslot = dput(slot, sizeof slot);
    g_cpu->ops->kv_write(g_cpu, kc, vc, k, v, slot, T, KVH, HD);
    g_gpu->ops->kv_write(g_gpu, dkc, dvc, dk, dv, dslot, T, KVH, HD);
    uint16_t *want_k = to_bf16(kc, cache_n), *want_v = to_bf16(vc, cache_n);
    dget(kc16, dkc, cache_n * 2, "kv_write");
    dget(vc16, dvc, cache_n * 2, "kv_write");
    check_exact(kc16, want_k, cache_n * 2, "kv_write K (bf16 of the CPU's f32 cache)");
    check_exact(vc16, want_v, cache_n * 2, "kv_write V");

    g_gpu->ops->kv_store(g_gpu, dkc, dk, (size_t)T * row);
    uint16_t *want = to_bf16(k, (size_t)T * row);
    dget(kc16, dkc, (size_t)T * row * 2, "kv_store");
    check_exact(kc16, want, (size_t)T * row * 2, "kv_store (f32 -> bf16, nearest even)");

    void *dev[] = {dkc, dvc, dk, dv, dslot};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {k, v, kc, vc, kc16, vc16, want_k, want_v, want};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* ---- sampling ------------------------------------------------------------------------------- */

/* The sample op against the CPU backend's on random rows and controls.
 * Greedy tokens, the rows with no token and the top logprob ids must be the
 * CPU's exactly (both take the first maximum of the same penalised floats,
 * rounded the same way). Logprob values: both sum exp(z - max) over the
 * same logits in double, the GPU with CUDA's expf (<= 2 ulp), the CPU with
 * its own exp (<= 1 ulp), so the log-sums differ by <= 3 * 2^-24 ≈ 1.8e-7;
 * each side then rounds z - lse to float (half an ulp each):
 * |diff| <= LOGPROB_ATOL + LOGPROB_RTOL * |want|. A draw may differ only
 * when u lies within rounding of a boundary of the cumulative distribution:
 * the GPU's token must then be one the CPU keeps, and u within SAMPLE_U_TOL
 * of its cumulative interval. Masses differ by the same 3 * 2^-24 per term,
 * so cumulative fractions by at most twice that (7e-7); 2e-6 leaves room
 * for the GPU's fixed-point sums (under 2^-30 of the total) and is still
 * far below a token's probability for all but the flattest rows. */
#define LOGPROB_ATOL 5e-7
#define LOGPROB_RTOL 2.4e-7 /* 2^-22: the result's float rounding on both sides, with room */
#define SAMPLE_U_TOL 2e-6
#define SAMPLE_MAX_PEN 48 /* penalty entries per row, at most */
#define SAMPLE_RNG_SEED 0x5a3d1e8c6b7f9021ull

typedef enum logit_shape {
    SHAPE_NORMAL,       /* N(0, sigma), sigma from shape_sigma (as every shape's base) */
    SHAPE_TIED_TOP,     /* a few ids share the maximum */
    SHAPE_MASKED,       /* a block of -inf */
    SHAPE_NAN,          /* NaN at id 0 and inside the row */
    SHAPE_COARSE,       /* values on a 0.5 grid: ties everywhere */
    SHAPE_FLAT,         /* every logit 0, half of them -0 */
    SHAPE_PEAKED,       /* one dominant logit over N(0, 2) */
    SHAPE_ALL_NEG_INF,  /* no token */
    SHAPE_ALL_NAN,      /* no token */
    SHAPE_POS_INF       /* one +inf: no token */
} logit_shape;

static const float shape_sigma[] = {0.3f, 1.0f, 3.0f, 10.0f};

/* The shapes of consecutive rows: mostly ordinary ones, each no-token shape
 * once in a cycle. */
static const logit_shape shape_cycle[] = {
    SHAPE_NORMAL,  SHAPE_TIED_TOP,    SHAPE_NORMAL, SHAPE_MASKED,
    SHAPE_NORMAL,  SHAPE_NAN,         SHAPE_COARSE, SHAPE_NORMAL,
    SHAPE_FLAT,    SHAPE_PEAKED,      SHAPE_NORMAL, SHAPE_ALL_NEG_INF,
    SHAPE_NORMAL,  SHAPE_TIED_TOP,    SHAPE_PEAKED, SHAPE_ALL_NAN,
    SHAPE_NORMAL,  SHAPE_COARSE,      SHAPE_NORMAL, SHAPE_POS_INF};
#define SHAPE_CYCLE ((int)(sizeof shape_cycle / sizeof shape_cycle[0]))

/* Standard normal (Box-Muller on test_rand.h's stream). */
static float gauss(void)
{
    const double a = 1.0 - urand(), b = urand(); /* a in (0, 1] */
    return (float)(sqrt(-2.0 * log(a)) * cos(2.0 * M_PI * b));
}

static void fill_logits(float *x, int V, logit_shape shape)
{
    const float sigma = shape_sigma[irand(sizeof shape_sigma / sizeof shape_sigma[0])];
    for (int i = 0; i < V; i++)
        x[i] = sigma * gauss();
    switch (shape) {
    case SHAPE_NORMAL:
        break;
    case SHAPE_TIED_TOP: {
        const float top = 4.0f * sigma + 5.0f;
        for (int k = 0; k < 4; k++)
            x[irand(V)] = top;
        break;
    }
    case SHAPE_MASKED:
        for (int i = V / 4; i < V / 2 + 1 && i < V; i++)
            x[i] = -INFINITY;
        break;
    case SHAPE_NAN:
        x[0] = NAN;
        x[irand(V)] = NAN;
        break;
    case SHAPE_COARSE:
        for (int i = 0; i < V; i++)
            x[i] = roundf(2.0f * x[i] / sigma) * 0.5f;
        break;
    case SHAPE_FLAT:
        for (int i = 0; i < V; i++)
            x[i] = irand(2) ? -0.0f : 0.0f;
        break;
    case SHAPE_PEAKED:
        for (int i = 0; i < V; i++)
            x[i] = 2.0f * gauss();
        x[irand(V)] = 12.0f;
        break;
    case SHAPE_ALL_NEG_INF:
        for (int i = 0; i < V; i++)
            x[i] = -INFINITY;
        break;
    case SHAPE_ALL_NAN:
        for (int i = 0; i < V; i++)
            x[i] = NAN;
        break;
    case SHAPE_POS_INF:
        x[irand(V)] = INFINITY;
        break;
    }
}

/* Random controls for a row of logits x (V): greedy or a draw with any mix
 * of top-k, top-p and min-p; penalties on up to SAMPLE_MAX_PEN distinct ids
 * (the best one among them half the time, so they matter), some with count
 * 0; logprobs with 0..20 top ids; u including 0 and 1 - 2^-53. The entries
 * go to pen_id/pen_count from index pen_start. */
static ml_sample_row random_controls(const float *x, int V, int pen_start, int32_t *pen_id,
                                     uint32_t *pen_count)
{
    static const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f};
    static const uint32_t top_ks[] = {1, 5, 50, 1000, 5000};
    static const float top_ps[] = {0.1f, 0.5f, 0.9f, 0.95f};
    static const float min_ps[] = {0.01f, 0.05f, 0.2f};
    ml_sample_row r = {.u = urand(), .temperature = 0.0f, .top_p = 1.0f,
                       .repetition_penalty = 1.0f, .pen_start = pen_start};
    if (irand(4) != 0) { /* a quarter greedy */
        const int filters = irand(8); /* 0: temperature only */
        r.temperature = temps[irand(4)];
        if (filters & 1) /* top_k = V (off) and values below V */
            r.top_k = top_ks[irand(5)] % (uint32_t)(V + 1);
        if (filters & 2)
            r.top_p = top_ps[irand(4)];
        if (filters & 4)
            r.min_p = min_ps[irand(3)];
    }
    const int u_kind = irand(8);
    if (u_kind == 0)
        r.u = 0.0;
    else if (u_kind == 1)
        r.u = 1.0 - 0x1.0p-53;
    if (irand(3) == 0)
        r.repetition_penalty = irand(2) ? 1.3f : 0.7f;
    if (irand(3) == 0)
        r.presence_penalty = frand(-1.0f, 1.0f);
    if (irand(3) == 0)
        r.frequency_penalty = frand(-1.0f, 1.0f);
    /* Entries also without a penalty on: the op must then leave them be. */
    const int n_pen = irand(4) == 0 ? 0 : irand(SAMPLE_MAX_PEN + 1);
    int best = 0;
    for (int i = 1; i < V; i++)
        best = x[i] > x[best] ? i : best;
    for (int j = 0; j < n_pen && j < V; j++) {
        int32_t id = j == 0 && irand(2) ? best : irand(V);
        for (int k = 0; k < r.n_pen; k++)
            if (pen_id[pen_start + k] == id) {
                id = -1; /* taken: ids are distinct */
                break;
            }
        if (id < 0)
            continue;
        pen_id[pen_start + r.n_pen] = id;
        pen_count[pen_start + r.n_pen] = (uint32_t)irand(4);
        r.n_pen++;
    }
    if (irand(2)) {
        r.logprobs = 1;
        r.n_top = (uint32_t)irand(ML_SAMPLE_MAX_TOP + 1);
        r.n_top = r.n_top < (uint32_t)V ? r.n_top : (uint32_t)V;
    }
    return r;
}

static int logprob_close(float got, float want)
{
    if (isinf(want) || isinf(got))
        return got == want;
    return fabsf(got - want) <= LOGPROB_ATOL + LOGPROB_RTOL * fabsf(want);
}

/* Is u within SAMPLE_U_TOL of the cumulative interval of id in dist (n
 * kept tokens, best first, renormalised logprobs)? */
static int drawable(const ml_token_logprob *dist, size_t n, int32_t id, double u)
{
    double before = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double p = exp((double)dist[i].logprob);
        if (dist[i].id == id)
            return u >= before - SAMPLE_U_TOL && u <= before + p + SAMPLE_U_TOL;
        before += p;
    }
    return 0;
}

typedef struct sample_batch {
    int rows, vocab, n_entries;
    float *logits;        /* (rows, vocab) */
    ml_sample_row *row;   /* (rows) */
    int32_t *pen_id;      /* (rows * SAMPLE_MAX_PEN) */
    uint32_t *pen_count;  /* (rows * SAMPLE_MAX_PEN) */
} sample_batch;

static sample_batch sample_batch_make(int rows, int V)
{
    sample_batch b = {rows, V, 0, xmalloc((size_t)rows * V * 4),
                      xmalloc((size_t)rows * sizeof(ml_sample_row)),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4)};
    for (int r = 0; r < rows; r++) {
        float *x = b.logits + (size_t)r * V;
        fill_logits(x, V, shape_cycle[r % SHAPE_CYCLE]);
        b.row[r] = random_controls(x, V, b.n_entries, b.pen_id, b.pen_count);
        b.n_entries += b.row[r].n_pen;
    }
    return b;
}

static void sample_batch_free(sample_batch *b)
{
    free(b->logits);
    free(b->row);
    free(b->pen_id);
    free(b->pen_count);
}

/* The CPU backend's outputs for the batch (caller frees). */
static ml_sample_out *sample_cpu(const sample_batch *b)
{
    ml_sample_out *want = xmalloc((size_t)b->rows * sizeof *want);
    const size_t bytes = g_cpu->ops->sample_scratch_bytes(g_cpu, b->rows, b->vocab);
    void *scratch = g_cpu->ops->alloc(g_cpu, bytes);
    check(scratch != NULL, "cpu sample scratch");
    ml_sample_params p = {.out = want, .logits = b->logits, .row = b->row, .pen_id = b->pen_id,
                          .pen_count = b->pen_count, .scratch = scratch, .rows = b->rows,
                          .vocab = b->vocab};
    g_cpu->ops->sample(g_cpu, &p);
    g_cpu->ops->free(g_cpu, scratch);
    return want;
}

/* Device copies of a batch and the op's parameters over them. */
typedef struct sample_dev {
    ml_sample_params p;
    void *dev[6];
} sample_dev;

static sample_dev sample_dev_make(const sample_batch *b)
{
    sample_dev d;
    const size_t pen_bytes = (size_t)(b->n_entries ? b->n_entries : 1) * 4;
    d.dev[0] = dput(NULL, (size_t)b->rows * sizeof(ml_sample_out));
    d.dev[1] = dput(b->logits, (size_t)b->rows * b->vocab * 4);
    d.dev[2] = dput(b->row, (size_t)b->rows * sizeof *b->row);
    d.dev[3] = dput(b->pen_id, pen_bytes);
    d.dev[4] = dput(b->pen_count, pen_bytes);
    d.dev[5] = dput(NULL, g_gpu->ops->sample_scratch_bytes(g_gpu, b->rows, b->vocab));
    d.p = (ml_sample_params){.out = d.dev[0], .logits = d.dev[1], .row = d.dev[2],
                             .pen_id = d.dev[3], .pen_count = d.dev[4], .scratch = d.dev[5],
                             .rows = b->rows, .vocab = b->vocab};
    return d;
}

static void sample_dev_free(sample_dev *d)
{
    for (size_t i = 0; i < sizeof d->dev / sizeof d->dev[0]; i++)
        dfree(d->dev[i]);
}

/* Compare the GPU's outputs got with the CPU's want, row by row (see the
 * section comment). */
static void sample_compare(const sample_batch *b, const ml_sample_out *got,
                           const ml_sample_out *want, const char *what)
{
    const int V = b->vocab;
    void *mem = g_cpu->ops->alloc(g_cpu, ml_sample_scratch_bytes((size_t)V)); /* 64-byte aligned */
    ml_sample_scratch *s = ml_sample_scratch_init(mem, (size_t)V);
    ml_token_logprob *dist = xmalloc((size_t)V * sizeof *dist);
    int n_greedy = 0, n_draw = 0, n_none = 0, n_differ = 0, bad = 0;
    for (int r = 0; r < b->rows && s; r++) {
        const ml_sample_row *row = &b->row[r];
        const float *x = b->logits + (size_t)r * V;
        const ml_sample_out *g = &got[r], *w = &want[r];
        const int32_t *pid = b->pen_id + row->pen_start;
        const uint32_t *pcount = b->pen_count + row->pen_start;
        int ok = 1;
        if (w->chosen.id == ML_SAMPLE_NO_TOKEN) {
            n_none++;
            ok = g->chosen.id == ML_SAMPLE_NO_TOKEN && g->n_top == 0 && g->chosen.logprob == 0.0f;
        } else if (row->temperature < ML_SAMPLE_GREEDY_TEMPERATURE) {
            n_greedy++;
            ok = g->chosen.id == w->chosen.id;
        } else {
            n_draw++;
            if (g->chosen.id != w->chosen.id) {
                n_differ++;
                size_t n_kept = 0;
                ok = ml_sample_distribution(s, x, row, pid, pcount, dist, (size_t)V, &n_kept, NULL,
                                            0) == ML_OK &&
                     drawable(dist, n_kept, g->chosen.id, row->u);
            }
        }
        if (ok && w->chosen.id != ML_SAMPLE_NO_TOKEN) {
            ml_sample_out ref = *w;
            if (row->logprobs && g->chosen.id != w->chosen.id)
                ok = ml_sample_logprobs(x, (size_t)V, g->chosen.id, row->n_top, &ref, NULL, 0) ==
                     ML_OK;
            ok = ok && g->n_top == ref.n_top &&
                 (row->logprobs ? logprob_close(g->chosen.logprob, ref.chosen.logprob)
                                : g->chosen.logprob == 0.0f);
            for (uint32_t j = 0; ok && j < ref.n_top; j++)
                ok = g->top[j].id == ref.top[j].id &&
                     logprob_close(g->top[j].logprob, ref.top[j].logprob);
        }
        /* Entries past n_top are zero, as the CPU leaves them. */
        for (uint32_t j = g->n_top; ok && j < ML_SAMPLE_MAX_TOP; j++)
            ok = g->top[j].id == 0 && g->top[j].logprob == 0.0f;
        if (!ok && bad++ < 8)
            fprintf(stderr,
                    "  row %d (shape %d, t %g, k %u, p %g, min_p %g, u %.17g, pen %d, n_top %u): "
                    "gpu id %d lp %.9g n_top %u, cpu id %d lp %.9g n_top %u\n",
                    r, (int)shape_cycle[r % SHAPE_CYCLE], (double)row->temperature,
                    (unsigned)row->top_k, (double)row->top_p, (double)row->min_p, row->u,
                    (int)row->n_pen, (unsigned)row->n_top, (int)g->chosen.id,
                    (double)g->chosen.logprob, (unsigned)g->n_top, (int)w->chosen.id,
                    (double)w->chosen.logprob, (unsigned)w->n_top);
    }
    check(s != NULL, "%s: host scratch", what);
    check(bad == 0, "%s: %d of %d rows disagree with the CPU", what, bad, b->rows);
    fprintf(stderr, "  %-64s %d greedy, %d drawn (%d differ within %.0e of a boundary), %d none\n",
            what, n_greedy, n_draw, n_differ, SAMPLE_U_TOL, n_none);
    g_cpu->ops->free(g_cpu, mem);
    free(dist);
}

static void sample_case(int rows, int V)
{
    sample_batch b = sample_batch_make(rows, V);
    ml_sample_out *want = sample_cpu(&b);
    ml_sample_out *got = xmalloc((size_t)rows * sizeof *got);
    ml_sample_out *again = xmalloc((size_t)rows * sizeof *again);
    sample_dev d = sample_dev_make(&b);
    char what[96];
    snprintf(what, sizeof what, "sample, %d rows of vocab %d", rows, V);
    g_gpu->ops->sample(g_gpu, &d.p);
    dget(got, d.p.out, (size_t)rows * sizeof *got, what);
    sample_compare(&b, got, want, what);
    g_gpu->ops->sample(g_gpu, &d.p);
    dget(again, d.p.out, (size_t)rows * sizeof *again, what);
    snprintf(what, sizeof what, "sample, vocab %d: a second run is bit-identical", V);
    check_exact(again, got, (size_t)rows * sizeof *got, what);
    sample_dev_free(&d);
    sample_batch_free(&b);
    free(want);
    free(got);
    free(again);
}

/* Recorded once, replayed with new logits, controls and penalty entries
 * written into the same buffers: the op reads them when it runs. */
static void sample_graph(void)
{
    enum { ROWS = 24, V = 1000, SLOT = 5 };
    sample_batch b = sample_batch_make(ROWS, V);
    sample_dev d = sample_dev_make(&b);
    ml_sample_out *got = xmalloc(ROWS * sizeof *got);
    sync_ok("sample graph setup");
    g_gpu->ops->graph_begin(g_gpu, SLOT);
    g_gpu->ops->sample(g_gpu, &d.p);
    g_gpu->ops->graph_end(g_gpu, SLOT);
    sync_ok("sample graph record");
    for (int rep = 0; rep < 2; rep++) {
        sample_batch next = sample_batch_make(ROWS, V);
        g_gpu->ops->upload(g_gpu, d.dev[1], next.logits, (size_t)ROWS * V * 4);
        /* Within the recorded capacity: the first batch's entry count. */
        const int n = next.n_entries < b.n_entries ? next.n_entries : b.n_entries;
        for (int r = 0; r < ROWS; r++)
            if (next.row[r].pen_start + next.row[r].n_pen > n)
                next.row[r].n_pen = next.row[r].pen_start < n ? n - next.row[r].pen_start : 0;
        g_gpu->ops->upload(g_gpu, d.dev[2], next.row, ROWS * sizeof *next.row);
        if (n > 0) {
            g_gpu->ops->upload(g_gpu, d.dev[3], next.pen_id, (size_t)n * 4);
            g_gpu->ops->upload(g_gpu, d.dev[4], next.pen_count, (size_t)n * 4);
        }
        g_gpu->ops->graph_replay(g_gpu, SLOT);
        char what[96];
        snprintf(what, sizeof what, "sample graph replay %d, vocab %d", rep, V);
        dget(got, d.p.out, ROWS * sizeof *got, what);
        ml_sample_out *want = sample_cpu(&next);
        sample_compare(&next, got, want, what);
        free(want);
        sample_batch_free(&next);
    }
    sample_dev_free(&d);
    sample_batch_free(&b);
    free(got);
}

static void test_sample(void)
{
    /* A stream of its own: the tests after this one draw the same inputs
     * whatever this one draws. */
    const uint64_t stream = ml_test_rng;
    rand_seed(SAMPLE_RNG_SEED);
    sample_case(120, 128256);
    sample_case(600, 1000);
    sample_case(60, 3);
    sample_graph();
    ml_test_rng = stream;

    /* Invalid shapes are latched and reported at synchronize. */
    char err[ERRLEN] = "";
    ml_sample_params bad = {.rows = -1, .vocab = 1000};
    g_gpu->ops->sample(g_gpu, &bad);
    check(g_gpu->ops->synchronize(g_gpu, err, sizeof err) == ML_ERR_INVALID_ARG,
          "sample with rows -1 is refused at synchronize");
    fprintf(stderr, "  reported: %s\n", err);
    bad = (ml_sample_params){.rows = 0, .vocab = 1000};
    g_gpu->ops->sample(g_gpu, &bad);
    sync_ok("sample with rows 0 is a no-op");
}

/* ---- attention ------------------------------------------------------------------------------ */

static void vision_case(int n_seq, int tiles, int tile_len, int real_len, int n_heads, int hd,
                        double tol)
{
    const int seq_len = tiles * tile_len;
    const size_t n = (size_t)n_seq * seq_len * n_heads * hd;
    float *q = rand_f32(n, -2, 2), *k = rand_f32(n, -1, 1), *v = rand_f32(n, -1, 1);
    float *out = xmalloc(n * 4), *got = xmalloc(n * 4);
    uint8_t *valid = xmalloc((size_t)n_seq * seq_len);
    /* Sequence s has tiles 0 .. s % tiles real (the rest padding tiles);
     * each tile's last tile_len - real_len tokens are padding. */
    for (int s = 0; s < n_seq; s++)
        for (int t = 0; t < seq_len; t++)
            valid[(size_t)s * seq_len + t] = t / tile_len <= s % tiles && t % tile_len < real_len;
    float *dq = dput(q, n * 4), *dk = dput(k, n * 4), *dv = dput(v, n * 4);
    float *dout = dput(NULL, n * 4);
    uint8_t *dvalid = dput(valid, (size_t)n_seq * seq_len);
    const float scale = 1.0f / sqrtf((float)hd);
    ml_attn_vision_params p = {.out = out, .q = q, .k = k, .v = v, .valid = valid,
                               .n_seq = n_seq, .seq_len = seq_len, .n_heads = n_heads,
                               .head_dim = hd, .scale = scale};
    g_cpu->ops->attn_vision(g_cpu, &p);
    p = (ml_attn_vision_params){.out = dout, .q = dq, .k = dk, .v = dv, .valid = dvalid,
                                .n_seq = n_seq, .seq_len = seq_len, .n_heads = n_heads,
                                .head_dim = hd, .scale = scale};
    g_gpu->ops->attn_vision(g_gpu, &p);
    char what[128];
    snprintf(what, sizeof what, "attn_vision %d x %d tokens, %d heads x %d (%s)", n_seq, seq_len,
             n_heads, hd, tol == NMSE_MMA ? "tensor cores" : "simt");
    dget(got, dout, n * 4, what);
    check_nmse(got, out, n, tol, what);
    void *dev[] = {dq, dk, dv, dout, dvalid};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {q, k, v, out, got, valid};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

static void test_attn_vision(void)
{
    /* Head dims 16, 32, 64, 80, 128 take the tensor-core kernel. */
    vision_case(2, 4, 8, 5, 2, 16, NMSE_MMA);
    vision_case(3, 4, 56, 53, 2, 80, NMSE_MMA);
    vision_case(1, 2, 70, 61, 2, 128, NMSE_MMA);
    vision_case(2, 3, 33, 30, 3, 32, NMSE_MMA);
    vision_case(1, 4, 1608, 1601, 16, 80, NMSE_MMA); /* the real tower: 6432 tokens */
    /* Others the SIMT kernel. */
    vision_case(2, 3, 9, 7, 2, 24, NMSE_F32);
    vision_case(2, 2, 20, 19, 1, 256, NMSE_F32);
    vision_case(1, 2, 100, 90, 2, 40, NMSE_F32);
}

/* A paged K/V layout for a causal batch: shuffled physical blocks and each
 * sequence's block table (max_blocks columns, spares -1). */
typedef struct paged {
    int n_seqs, block_size, max_blocks, n_phys;
    int32_t *table, *seq_start, *pos0;
} paged;

static paged paged_make(int n_seqs, const int *pos0, const int *n_new, int block_size)
{
    paged pg = {.n_seqs = n_seqs, .block_size = block_size};
    pg.seq_start = xmalloc((size_t)(n_seqs + 1) * sizeof(int32_t));
    pg.pos0 = xmalloc((size_t)n_seqs * sizeof(int32_t));
    pg.seq_start[0] = 0;
    int total = 0;
    for (int s = 0; s < n_seqs; s++) {
        pg.seq_start[s + 1] = pg.seq_start[s] + n_new[s];
        pg.pos0[s] = pos0[s];
        const int nb = (pos0[s] + n_new[s] + block_size - 1) / block_size;
        pg.max_blocks = nb + 1 > pg.max_blocks ? nb + 1 : pg.max_blocks;
        total += nb;
    }
    pg.n_phys = total + 3;
    int32_t *perm = xmalloc((size_t)pg.n_phys * sizeof *perm);
    for (int i = 0; i < pg.n_phys; i++)
        perm[i] = i;
    for (int i = pg.n_phys - 1; i > 0; i--) {
        const int r = irand(i + 1), t = perm[i];
        perm[i] = perm[r];
        perm[r] = t;
    }
    pg.table = xmalloc((size_t)n_seqs * pg.max_blocks * sizeof(int32_t));
    for (int s = 0, used = 0; s < n_seqs; s++) {
        const int nb = (pos0[s] + n_new[s] + block_size - 1) / block_size;
        for (int b = 0; b < pg.max_blocks; b++)
            pg.table[s * pg.max_blocks + b] = b < nb ? perm[used + b] : -1;
        used += nb;
    }
    free(perm);
    return pg;
}

static void paged_free(paged *pg)
{
    free(pg->table);
    free(pg->seq_start);
    free(pg->pos0);
}

/* Causal attention of a batch after kv_write of its new tokens, CPU (f32
 * caches) against GPU (bf16 caches) holding the same bf16-exact values. */
static void causal_case(int n_seqs, const int *pos0, const int *n_new, int n_heads, int n_kv,
                        int hd, int block_size)
{
    paged pg = paged_make(n_seqs, pos0, n_new, block_size);
    const int n_tok = pg.seq_start[n_seqs];
    const size_t row = (size_t)n_kv * hd, cache_n = (size_t)pg.n_phys * block_size * row;
    const size_t nq = (size_t)n_tok * n_heads * hd;
    float *kc = rand_f32_bf16(cache_n, -1, 1), *vc = rand_f32_bf16(cache_n, -1, 1);
    float *k = rand_f32_bf16((size_t)n_tok * row, -1, 1);
    float *v = rand_f32_bf16((size_t)n_tok * row, -1, 1);
    float *q = rand_f32(nq, -2, 2), *out = xmalloc(nq * 4), *got = xmalloc(nq * 4);
    int32_t *slot = xmalloc((size_t)n_tok * sizeof *slot + 4);
    for (int s = 0; s < n_seqs; s++)
        for (int t = 0; t < n_new[s]; t++) {
            const int p = pos0[s] + t;
            slot[pg.seq_start[s] + t] = pg.table[s * pg.max_blocks + p / block_size] * block_size +
                                        p % block_size;
        }
    uint16_t *kc16 = to_bf16(kc, cache_n), *vc16 = to_bf16(vc, cache_n);
    uint16_t *dkc = dput(kc16, cache_n * 2), *dvc = dput(vc16, cache_n * 2);
    float *dk = dput(k, (size_t)n_tok * row * 4 + 4), *dv = dput(v, (size_t)n_tok * row * 4 + 4);
    float *dq = dput(q, nq * 4 + 4), *dout = dput(NULL, nq * 4 + 4);
    int32_t *dslot = dput(slot, (size_t)n_tok * 4 + 4);
    int32_t *dtable = dput(pg.table, (size_t)n_seqs * pg.max_blocks * 4);
    int32_t *dstart = dput(pg.seq_start, (size_t)(n_seqs + 1) * 4);
    int32_t *dpos0 = dput(pg.pos0, (size_t)n_seqs * 4);

    g_cpu->ops->kv_write(g_cpu, kc, vc, k, v, slot, n_tok, n_kv, hd);
    g_gpu->ops->kv_write(g_gpu, dkc, dvc, dk, dv, dslot, n_tok, n_kv, hd);
    ml_attn_causal_params p = {.out = out, .q = q, .k_cache = kc, .v_cache = vc,
                               .block_table = pg.table, .seq_start = pg.seq_start,
                               .pos0 = pg.pos0, .n_seqs = n_seqs,
                               .max_blocks_per_seq = pg.max_blocks, .block_size = block_size,
                               .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd,
                               .scale = 1.0f / sqrtf((float)hd)};
    g_cpu->ops->attn_causal(g_cpu, &p);
    p.out = dout;
    p.q = dq;
    p.k_cache = dkc;
    p.v_cache = dvc;
    p.block_table = dtable;
    p.seq_start = dstart;
    p.pos0 = dpos0;
    g_gpu->ops->attn_causal(g_gpu, &p);
    char what[128];
    snprintf(what, sizeof what, "attn_causal %d seqs, %d tokens, %d/%d heads x %d, blocks of %d",
             n_seqs, n_tok, n_heads, n_kv, hd, block_size);
    dget(got, dout, nq * 4, what);
    check_nmse(got, out, nq, NMSE_F32, what);

    void *dev[] = {dkc, dvc, dk, dv, dq, dout, dslot, dtable, dstart, dpos0};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {kc, vc, k, v, q, out, got, slot, kc16, vc16};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    paged_free(&pg);
}

static void test_attn_causal(void)
{
    /* Mixed prefill and decode, one sequence sitting the step out. */
    static const int pos0[] = {0, 5, 9, 37}, n_new[] = {7, 1, 0, 100};
    causal_case(4, pos0, n_new, 32, 8, 128, 16); /* 11B heads */
    causal_case(4, pos0, n_new, 4, 1, 16, 16);   /* the fixtures' MQA */
    causal_case(4, pos0, n_new, 8, 8, 64, 32);   /* no grouping */
    causal_case(4, pos0, n_new, 16, 2, 128, 16); /* groups of 8: 8-row warps */
    causal_case(4, pos0, n_new, 6, 2, 40, 16);   /* head_dim 40 */
    /* Decode at batch 32 and a long single context: keys split over CTAs. */
    int p32[32], one[32];
    for (int s = 0; s < 32; s++) {
        p32[s] = 1 + irand(1500);
        one[s] = 1;
    }
    causal_case(32, p32, one, 32, 8, 128, 16);
    static const int long_pos[] = {8000}, long_new[] = {1};
    causal_case(1, long_pos, long_new, 32, 8, 128, 16);
    static const int pre_pos[] = {0}, pre_new[] = {512};
    causal_case(1, pre_pos, pre_new, 32, 8, 128, 16); /* a 512-token prefill */
}

/* Image states of the cross tests: each holds CROSS_LAYERS layers' K then V
 * planes, as ml_model_encode_image lays them out, and the calls read the
 * last layer (a nonzero offset). */
#define CROSS_LAYERS 2

typedef struct cross_pool {
    int n;
    size_t plane;  /* elements of one K or V plane */
    float **host;  /* (n): 2·CROSS_LAYERS planes of bf16-exact f32 (the CPU's kv type) */
    void **dev;    /* (n): the same in bf16 */
} cross_pool;

static void cross_pool_init(cross_pool *cp, int n, size_t plane)
{
    const size_t elems = 2 * CROSS_LAYERS * plane;
    cp->n = n;
    cp->plane = plane;
    cp->host = xmalloc((size_t)n * sizeof *cp->host);
    cp->dev = xmalloc((size_t)n * sizeof *cp->dev);
    for (int i = 0; i < n; i++) {
        cp->host[i] = rand_f32_bf16(elems, -1, 1);
        uint16_t *h16 = to_bf16(cp->host[i], elems);
        cp->dev[i] = dput(h16, elems * 2);
        free(h16);
    }
}

static void cross_pool_deinit(cross_pool *cp)
{
    for (int i = 0; i < cp->n; i++) {
        free(cp->host[i]);
        dfree(cp->dev[i]);
    }
    free(cp->host);
    free(cp->dev);
}

/* One attn_cross call's inputs and outputs on both backends, at fixed
 * capacities (a graph's buffers). */
typedef struct cross_io {
    int n_seqs, n_tokens, max_images, max_tiles, chunk_len, n_heads, n_kv, hd;
    const void **table;    /* host (n_seqs, max_images): host states */
    const void **table_d;  /* host copy of the device table: device states */
    int32_t *n_images;     /* (n_seqs) */
    int32_t *seq_start;    /* (n_seqs + 1) */
    uint8_t *allowed;      /* (n_tokens, max_images · max_tiles) */
    float *q, *out, *got;  /* (n_tokens, n_heads, hd) */
    const void **dtable;   /* device memory from here on */
    int32_t *dn_images, *dseq_start;
    uint8_t *dallowed;
    float *dq, *dout;
} cross_io;

static void cross_io_init(cross_io *io, int n_seqs, int n_tokens, int max_images, int max_tiles,
                          int chunk_len, int n_heads, int n_kv, int hd)
{
    *io = (cross_io){.n_seqs = n_seqs, .n_tokens = n_tokens, .max_images = max_images,
                     .max_tiles = max_tiles, .chunk_len = chunk_len, .n_heads = n_heads,
                     .n_kv = n_kv, .hd = hd};
    const size_t tab = (size_t)n_seqs * max_images * sizeof(void *);
    const size_t mask = (size_t)n_tokens * max_images * max_tiles;
    const size_t nq = (size_t)n_tokens * n_heads * hd * 4;
    io->table = xmalloc(tab);
    io->table_d = xmalloc(tab);
    io->n_images = xmalloc((size_t)n_seqs * 4);
    io->seq_start = xmalloc((size_t)(n_seqs + 1) * 4);
    io->allowed = xmalloc(mask);
    io->q = xmalloc(nq);
    io->out = xmalloc(nq);
    io->got = xmalloc(nq);
    io->dtable = dput(NULL, tab);
    io->dn_images = dput(NULL, (size_t)n_seqs * 4);
    io->dseq_start = dput(NULL, (size_t)(n_seqs + 1) * 4);
    io->dallowed = dput(NULL, mask);
    io->dq = dput(NULL, nq);
    io->dout = dput(NULL, nq);
}

static void cross_io_deinit(cross_io *io)
{
    void *dev[] = {io->dtable, io->dn_images, io->dseq_start, io->dallowed, io->dq, io->dout};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {io->table, io->table_d, io->n_images, io->seq_start, io->allowed, io->q,
                    io->out, io->got};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* New step inputs, uploaded: sequence s has n_tok[s] tokens (their sum at
 * most n_tokens) and n_img[s] images, image i being state (s + i + shift)
 * mod the pool. Rows cycle through no chunk allowed (every key), every
 * chunk and random chunks; mask columns past a sequence's images are 1 and
 * must be ignored. out is filled with garbage that text-only rows must
 * overwrite with 0. */
static void cross_io_fill(cross_io *io, const cross_pool *cp, const int *n_tok, const int *n_img,
                          int shift)
{
    const int stride = io->max_images * io->max_tiles;
    io->seq_start[0] = 0;
    for (int s = 0; s < io->n_seqs; s++) {
        io->n_images[s] = n_img[s];
        io->seq_start[s + 1] = io->seq_start[s] + n_tok[s];
        for (int i = 0; i < io->max_images; i++) {
            const int state = (s + i + shift) % cp->n;
            io->table[s * io->max_images + i] = i < n_img[s] ? cp->host[state] : NULL;
            io->table_d[s * io->max_images + i] = i < n_img[s] ? cp->dev[state] : NULL;
        }
        for (int t = io->seq_start[s]; t < io->seq_start[s + 1]; t++)
            for (int c = 0; c < stride; c++)
                io->allowed[(size_t)t * stride + c] = c >= n_img[s] * io->max_tiles ? 1
                                                      : t % 3 == 0                 ? 0
                                                      : t % 3 == 1                 ? 1
                                                                   : urand() < 0.5;
    }
    check(io->seq_start[io->n_seqs] <= io->n_tokens, "cross test: %d tokens above capacity %d",
          io->seq_start[io->n_seqs], io->n_tokens);
    const size_t nq = (size_t)io->n_tokens * io->n_heads * io->hd;
    for (size_t i = 0; i < nq; i++) {
        io->q[i] = frand(-2, 2);
        io->got[i] = 7.0f;
    }
    const ml_backend_ops *o = g_gpu->ops;
    o->upload(g_gpu, io->dtable, io->table_d, (size_t)io->n_seqs * io->max_images * sizeof(void *));
    o->upload(g_gpu, io->dn_images, io->n_images, (size_t)io->n_seqs * 4);
    o->upload(g_gpu, io->dseq_start, io->seq_start, (size_t)(io->n_seqs + 1) * 4);
    o->upload(g_gpu, io->dallowed, io->allowed, (size_t)io->n_tokens * stride);
    o->upload(g_gpu, io->dq, io->q, nq * 4);
    o->upload(g_gpu, io->dout, io->got, nq * 4);
}

/* The call on be's buffers of io, reading layer CROSS_LAYERS - 1. */
static ml_attn_cross_params cross_params(const cross_io *io, const cross_pool *cp, ml_backend *be)
{
    const int gpu = be == g_gpu;
    const size_t plane_bytes = cp->plane * be->ops->kv_elem_size;
    const size_t k_offset = 2 * (size_t)(CROSS_LAYERS - 1) * plane_bytes;
    return (ml_attn_cross_params){
        .out = gpu ? io->dout : io->out, .q = gpu ? io->dq : io->q,
        .states = gpu ? io->dtable : io->table, .k_offset = k_offset,
        .v_offset = k_offset + plane_bytes, .n_images = gpu ? io->dn_images : io->n_images,
        .seq_start = gpu ? io->dseq_start : io->seq_start,
        .allowed = gpu ? io->dallowed : io->allowed, .n_seqs = io->n_seqs,
        .n_tokens = io->n_tokens, .max_images = io->max_images, .max_tiles = io->max_tiles,
        .chunk_len = io->chunk_len, .n_heads = io->n_heads, .n_kv_heads = io->n_kv,
        .head_dim = io->hd, .scale = 1.0f / sqrtf((float)io->hd)};
}

/* Run the CPU on io's host inputs and compare the GPU's output (already
 * queued) with it over the rows of every sequence; text-only rows must be
 * exactly 0. */
static void cross_io_check(cross_io *io, const cross_pool *cp, const char *what)
{
    ml_attn_cross_params p = cross_params(io, cp, g_cpu);
    g_cpu->ops->attn_cross(g_cpu, &p);
    const size_t row = (size_t)io->n_heads * io->hd;
    dget(io->got, io->dout, (size_t)io->n_tokens * row * 4, what);
    check_nmse(io->got, io->out, (size_t)io->seq_start[io->n_seqs] * row, NMSE_F32, what);
    size_t nonzero = 0;
    for (int s = 0; s < io->n_seqs; s++) {
        if (io->n_images[s] != 0)
            continue;
        for (size_t i = (size_t)io->seq_start[s] * row; i < (size_t)io->seq_start[s + 1] * row; i++)
            nonzero += io->got[i] != 0.0f;
    }
    check(nonzero == 0, "%s: text-only rows are 0 (%zu elements are not)", what, nonzero);
}

static void cross_case(int n_seqs, const int *n_tok, const int *n_img, int max_images,
                       int max_tiles, int chunk_len, int n_heads, int n_kv, int hd)
{
    int n_tokens = 0;
    for (int s = 0; s < n_seqs; s++)
        n_tokens += n_tok[s];
    cross_pool cp;
    cross_pool_init(&cp, max_images + 1, (size_t)max_tiles * chunk_len * n_kv * hd);
    cross_io io;
    cross_io_init(&io, n_seqs, n_tokens, max_images, max_tiles, chunk_len, n_heads, n_kv, hd);
    cross_io_fill(&io, &cp, n_tok, n_img, 0);
    ml_attn_cross_params p = cross_params(&io, &cp, g_gpu);
    g_gpu->ops->attn_cross(g_gpu, &p);
    char what[128];
    snprintf(what, sizeof what,
             "attn_cross %d seqs, %d tokens, <= %d images x %d x %d keys, %d/%d x %d", n_seqs,
             n_tokens, max_images, max_tiles, chunk_len, n_heads, n_kv, hd);
    cross_io_check(&io, &cp, what);
    cross_io_deinit(&io);
    cross_pool_deinit(&cp);
}

/* A decode bucket's attn_cross recorded once and replayed for steps with
 * other images, masks and text-only sequences: everything per step is read
 * from device memory when the replay runs. */
static void cross_graph(void)
{
    enum { B = 6, MAX_IMAGES = 2, TILES = 4, CHUNK = 40, H = 8, KV = 2, HD = 64, SLOT = 4 };
    static const int one[B] = {1, 1, 1, 1, 1, 1};
    static const int images[][B] = {{1, 0, 2, 1, 0, 2}, {2, 2, 0, 1, 1, 0}, {0, 0, 0, 0, 0, 0}};
    cross_pool cp;
    cross_pool_init(&cp, MAX_IMAGES + 1, (size_t)TILES * CHUNK * KV * HD);
    cross_io io;
    cross_io_init(&io, B, B, MAX_IMAGES, TILES, CHUNK, H, KV, HD);
    cross_io_fill(&io, &cp, one, images[0], 0);
    sync_ok("cross graph setup");
    const ml_backend_ops *o = g_gpu->ops;
    ml_attn_cross_params p = cross_params(&io, &cp, g_gpu);
    o->graph_begin(g_gpu, SLOT);
    o->attn_cross(g_gpu, &p);
    o->graph_end(g_gpu, SLOT);
    sync_ok("cross graph record");
    for (int step = 0; step < (int)(sizeof images / sizeof images[0]); step++) {
        cross_io_fill(&io, &cp, one, images[step], step);
        o->graph_replay(g_gpu, SLOT);
        char what[96];
        snprintf(what, sizeof what, "graph replay of attn_cross, step %d", step);
        cross_io_check(&io, &cp, what);
    }
    cross_io_deinit(&io);
    cross_pool_deinit(&cp);
}

static void test_attn_cross(void)
{
    /* text-only, one image, two images */
    static const int img3[] = {0, 1, 2}, prefill3[] = {20, 7, 13}, decode3[] = {1, 1, 1};
    cross_case(3, prefill3, img3, 2, 4, 13, 4, 1, 16); /* prefill, tiny tiles */
    cross_case(3, decode3, img3, 2, 4, 13, 4, 1, 16);  /* decode */
    static const int img4[] = {2, 0, 3, 1}, decode4[] = {1, 1, 1, 1};
    cross_case(4, decode4, img4, 3, 4, 40, 8, 2, 64);  /* decode, keys split over CTAs */
    static const int mixed[] = {1, 30, 1}, mixed_img[] = {1, 2, 0};
    cross_case(3, mixed, mixed_img, 2, 4, 13, 4, 1, 16); /* decode rows in a prefill shape */
    static const int g8_img[] = {1, 0}, g8_tok[] = {1, 1};
    cross_case(2, g8_tok, g8_img, 1, 4, 40, 16, 2, 64); /* GQA groups of 8: 8-row warps */
    /* 11B: a decode batch of 32 (a third text-only) and a two-sequence prefill */
    int img32[32], decode32[32];
    for (int s = 0; s < 32; s++) {
        img32[s] = s % 3;
        decode32[s] = 1;
    }
    cross_case(32, decode32, img32, 2, 4, 1601, 32, 8, 128);
    static const int pre_img[] = {2, 0}, pre_tok[] = {64, 9};
    cross_case(2, pre_tok, pre_img, 2, 4, 1601, 32, 8, 128);
    cross_graph();
}

/* ---- graphs ------------------------------------------------------------------------------- */

/* Record rmsnorm → matmul (GEMV and cuBLAS) → silu_mul → decode attention
 * once, replay it for two different inputs and positions, and compare each
 * replay with the CPU run eagerly on the same inputs. */
static void test_graphs(void)
{
    const ml_backend_ops *o = g_gpu->ops;
    check(o->graph_begin && o->graph_end && o->graph_replay && o->n_graph_slots > 0,
          "graph ops present");
    enum { D = 256, N = 512, B = 4, H = 8, KV = 2, HD = 64, BS = 16, MAXB = 8 };
    const int rows[2] = {3, 40}; /* GEMV and tensor-core matmul inside the graph */
    for (int ri = 0; ri < 2; ri++) {
        const int M = rows[ri];
        float *x = xmalloc((size_t)M * D * 4), *y = xmalloc((size_t)M * N * 4);
        float *h = xmalloc((size_t)M * D * 4), *got = xmalloc((size_t)M * N * 4);
        uint16_t *w = rand_bf16((size_t)N * D, -1, 1), *g = rand_bf16(D, 0, 2);
        float *dx = dput(NULL, (size_t)M * D * 4), *dh = dput(NULL, (size_t)M * D * 4);
        float *dy = dput(NULL, (size_t)M * N * 4);
        uint16_t *dw = dput(w, (size_t)N * D * 2), *dg = dput(g, D * 2);
        sync_ok("graph setup");
        o->graph_begin(g_gpu, 3);
        o->rmsnorm(g_gpu, dh, dx, dg, M, D, 1e-5f);
        o->matmul(g_gpu, dy, dh, dw, NULL, M, D, N, 0);
        o->silu_mul(g_gpu, dy, dy, dy, (size_t)M * N);
        o->graph_end(g_gpu, 3);
        sync_ok("graph record");
        for (int rep = 0; rep < 2; rep++) {
            fill(x, (size_t)M * D, -2, 2);
            o->upload(g_gpu, dx, x, (size_t)M * D * 4);
            o->graph_replay(g_gpu, 3);
            g_cpu->ops->rmsnorm(g_cpu, h, x, g, M, D, 1e-5f);
            g_cpu->ops->matmul(g_cpu, y, h, w, NULL, M, D, N, 0);
            g_cpu->ops->silu_mul(g_cpu, y, y, y, (size_t)M * N);
            char what[96];
            snprintf(what, sizeof what, "graph replay %d (rmsnorm, matmul M=%d, silu_mul)", rep,
                     M);
            dget(got, dy, (size_t)M * N * 4, what);
            check_nmse(got, y, (size_t)M * N, M <= 4 ? NMSE_F32 : NMSE_GEMM, what);
        }
        void *dev[] = {dx, dh, dy, dw, dg};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            dfree(dev[i]);
        void *host[] = {x, y, h, got, w, g};
        for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
            free(host[i]);
    }

    /* Decode attention recorded at one length, replayed at the next: the
     * lengths are read from device memory when the replay runs. */
    const size_t row = (size_t)KV * HD, cache_n = (size_t)B * MAXB * BS * row;
    const size_t nq = (size_t)B * H * HD;
    float *kc = rand_f32_bf16(cache_n, -1, 1), *vc = rand_f32_bf16(cache_n, -1, 1);
    float *q = rand_f32(nq, -2, 2), *out = xmalloc(nq * 4), *got = xmalloc(nq * 4);
    uint16_t *kc16 = to_bf16(kc, cache_n), *vc16 = to_bf16(vc, cache_n);
    int32_t table[B * MAXB], start[B + 1], pos0[B];
    for (int i = 0; i < B * MAXB; i++)
        table[i] = i;
    for (int s = 0; s <= B; s++)
        start[s] = s;
    uint16_t *dkc = dput(kc16, cache_n * 2), *dvc = dput(vc16, cache_n * 2);
    float *dq = dput(q, nq * 4), *dout = dput(NULL, nq * 4);
    int32_t *dtable = dput(table, sizeof table), *dstart = dput(start, sizeof start);
    int32_t *dpos0 = dput(NULL, sizeof pos0);
    ml_attn_causal_params p = {.out = dout, .q = dq, .k_cache = dkc, .v_cache = dvc,
                               .block_table = dtable, .seq_start = dstart, .pos0 = dpos0,
                               .n_seqs = B, .max_blocks_per_seq = MAXB, .block_size = BS,
                               .n_heads = H, .n_kv_heads = KV, .head_dim = HD,
                               .scale = 1.0f / sqrtf((float)HD)};
    sync_ok("graph attention setup");
    o->graph_begin(g_gpu, 0);
    o->attn_causal(g_gpu, &p);
    o->graph_end(g_gpu, 0);
    for (int step = 0; step < 3; step++) {
        for (int s = 0; s < B; s++)
            pos0[s] = 5 + 20 * s + 15 * step; /* < MAXB * BS */
        o->upload(g_gpu, dpos0, pos0, sizeof pos0);
        o->graph_replay(g_gpu, 0);
        ml_attn_causal_params c = p;
        c.out = out;
        c.q = q;
        c.k_cache = kc;
        c.v_cache = vc;
        c.block_table = table;
        c.seq_start = start;
        c.pos0 = pos0;
        g_cpu->ops->attn_causal(g_cpu, &c);
        char what[96];
        snprintf(what, sizeof what, "graph replay of attn_causal, step %d", step);
        dget(got, dout, nq * 4, what);
        check_nmse(got, out, nq, NMSE_F32, what);
    }

    /* Transfers are refused while recording; the stream recovers. */
    char err[ERRLEN] = "";
    o->graph_begin(g_gpu, 1);
    o->upload(g_gpu, dpos0, pos0, sizeof pos0);
    o->graph_end(g_gpu, 1);
    check(o->synchronize(g_gpu, err, sizeof err) == ML_ERR_INVALID_ARG,
          "upload while recording is reported");
    fprintf(stderr, "  reported: %s\n", err);
    o->graph_replay(g_gpu, 1);
    check(o->synchronize(g_gpu, err, sizeof err) == ML_ERR_INVALID_ARG,
          "replaying a slot whose recording failed is reported");
    o->graph_replay(g_gpu, 0);
    sync_ok("eager work after a failed recording");

    void *dev[] = {dkc, dvc, dq, dout, dtable, dstart, dpos0};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    void *host[] = {kc, vc, q, out, got, kc16, vc16};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* ---- errors, tensor parallelism ------------------------------------------------------------ */

static void test_errors(void)
{
    char err[ERRLEN] = "";
    float *d = dput(NULL, 1 << 20);
    uint8_t *dvalid = dput(NULL, 64);
    ml_attn_vision_params p = {.out = d, .q = d, .k = d, .v = d, .valid = dvalid, .n_seq = 1,
                               .seq_len = 8, .n_heads = 1, .head_dim = 12, .scale = 1.0f};
    g_gpu->ops->attn_vision(g_gpu, &p);
    check(g_gpu->ops->synchronize(g_gpu, err, sizeof err) == ML_ERR_UNSUPPORTED,
          "head_dim 12 is refused at synchronize");
    fprintf(stderr, "  reported: %s\n", err);
    g_gpu->ops->zero(g_gpu, d, 16);
    sync_ok("ops run again after a request-level error");
    dfree(d);
    dfree(dvalid);

    ml_backend *none = ml_backend_cuda_create(1 << 20, 0, err, sizeof err);
    check(none == NULL && err[0], "create on an absent device fails: %s", err);
}

typedef struct reduce_job {
    ml_backend *be;   /* borrowed: the member this thread drives */
    float *host;      /* (n): in, then the sum */
    size_t n;
    ml_status st;
} reduce_job;

static void *reduce_thread(void *arg)
{
    reduce_job *j = arg;
    const ml_backend_ops *o = j->be->ops;
    float *d = o->alloc(j->be, j->n * 4);
    char err[ERRLEN] = "";
    j->st = ML_ERR_NOMEM;
    if (!d)
        return NULL;
    o->upload(j->be, d, j->host, j->n * 4);
    o->all_reduce_sum(j->be, d, j->n);
    o->download(j->be, j->host, d, j->n * 4);
    j->st = o->synchronize(j->be, err, sizeof err);
    if (j->st != ML_OK)
        fprintf(stderr, "all_reduce_sum: %s\n", err);
    o->free(j->be, d);
    return NULL;
}

/* A group of two devices when there are two and NCCL, else of one (whose
 * sum is the identity); each member driven by its own thread. */
static void test_all_reduce(int n_devices)
{
    fprintf(stderr, "  NCCL %s\n", ml_backend_cuda_has_nccl() ? "built in" : "not built");
    check(g_gpu->ops->all_reduce_sum == NULL, "a lone backend has no all_reduce_sum");
    enum { LEN = 1 << 20, MAX_MEMBERS = 2 };
    const int n = n_devices >= MAX_MEMBERS && ml_backend_cuda_has_nccl() ? MAX_MEMBERS : 1;
    const int devices[MAX_MEMBERS] = {0, 1};
    ml_backend *group[MAX_MEMBERS] = {NULL, NULL};
    char err[ERRLEN] = "";
    /* Next to g_gpu's pool: keep the members' pools small. */
    ml_status st = ml_backend_cuda_create_group(n, devices, (size_t)1 << 30, group, err, sizeof err);
    check(st == ML_OK, "create_group(%d): %s", n, err);
    if (st != ML_OK)
        return;
    reduce_job jobs[MAX_MEMBERS];
    pthread_t th[MAX_MEMBERS];
    float *want = xmalloc(LEN * 4);
    memset(want, 0, LEN * 4);
    for (int m = 0; m < n; m++) {
        jobs[m] = (reduce_job){group[m], rand_f32(LEN, -1, 1), LEN, ML_OK};
        for (int i = 0; i < LEN; i++)
            want[i] += jobs[m].host[i];
    }
    for (int m = 0; m < n; m++)
        pthread_create(&th[m], NULL, reduce_thread, &jobs[m]);
    for (int m = 0; m < n; m++)
        pthread_join(th[m], NULL);
    for (int m = 0; m < n; m++) {
        char what[64];
        snprintf(what, sizeof what, "all_reduce_sum, member %d of %d", m, n);
        check(jobs[m].st == ML_OK, "%s: status %d", what, (int)jobs[m].st);
        check_nmse(jobs[m].host, want, LEN, NMSE_F32, what);
        free(jobs[m].host);
        group[m]->ops->destroy(group[m]);
    }
    free(want);
}

int main(void)
{
    const int n_devices = mlk_device_count();
    if (n_devices == 0)
        ml_test_skip("no CUDA device");
    rand_seed(RNG_SEED);
    char err[ERRLEN] = "";
    g_cpu = ml_backend_cpu_create(0, err, sizeof err);
    check(g_cpu != NULL, "cpu backend: %s", err);
    g_gpu = ml_backend_cuda_create(0, POOL_BYTES, err, sizeof err);
    check(g_gpu != NULL, "cuda backend: %s", err);
    if (!g_cpu || !g_gpu)
        return check_done();
    fprintf(stderr, "cpu backend %s, cuda backend %s\n", g_cpu->ops->name, g_gpu->ops->name);

    fprintf(stderr, "memory\n");
    test_memory();
    fprintf(stderr, "matmul\n");
    test_matmul();
    test_lora();
    fprintf(stderr, "norms, activations, rope\n");
    test_norms();
    test_activations();
    rope_case(37, 8, 128, 131072);
    rope_case(5, 3, 16, 64);
    fprintf(stderr, "elementwise, caches, sampling\n");
    test_elementwise();
    test_caches();
    test_sample();
    fprintf(stderr, "attention\n");
    test_attn_vision();
    test_attn_causal();
    test_attn_cross();
    fprintf(stderr, "graphs, errors, all-reduce\n");
    test_graphs();
    test_errors();
    test_all_reduce(n_devices);

    g_gpu->ops->destroy(g_gpu);
    g_cpu->ops->destroy(g_cpu);
    return check_done();
}
