/* Elementwise ops, data movement and the K/V cache writes of the CUDA
 * backend against the CPU backend, bit for bit.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

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

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "elementwise, caches\n");
    test_elementwise();
    test_caches();
    return cuda_ops_close();
}
