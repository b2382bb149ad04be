/* The CUDA backend itself: its memory pool, transfers and weights, errors
 * latched and reported at synchronize, and all_reduce_sum over a device group.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include <pthread.h>

#include "cuda_ops_harness.h"

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

    const void *w1 = o->weight(g_gpu, h, 4096), *w2 = o->weight(g_gpu, h + 1024, 4096);
    check(w1 && w2 && w2 != w1, "weight: a copy per call");
    memset(back, 0, 4096);
    dget(back, w2, 4096, "weight");
    check(memcmp(back, h + 1024, 4096) == 0, "weight: contents");
    /* The same host address with other bytes (a checkpoint mapped where a
     * freed one was) gets those bytes, not the earlier copy. */
    o->weight_free(g_gpu, w1);
    for (size_t i = 0; i < 1024; i++)
        h[i] = -h[i] - 2.0f;
    const void *w3 = o->weight(g_gpu, h, 4096);
    memset(back, 0, 4096);
    dget(back, w3, 4096, "weight at a reused host address");
    check(w3 && memcmp(back, h, 4096) == 0, "weight: a reused host address gets its new bytes");
    o->weight_free(g_gpu, w2);
    o->weight_free(g_gpu, w3);
    o->weight_free(g_gpu, NULL);
    sync_ok("weight_free");
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

    ml_backend *none = ml_backend_cuda_create(1 << 20, 0, 0, err, sizeof err);
    check(none == NULL && err[0], "create on an absent device fails: %s", err);
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
    ml_status st = ml_backend_cuda_create_group(n, devices, (size_t)1 << 30, 0, group, err,
                                               sizeof err);
    check(st == ML_OK, "create_group(%d): %s", n, err);
    if (st != ML_OK)
        return;
    cuda_reduce_job jobs[MAX_MEMBERS];
    pthread_t th[MAX_MEMBERS];
    float *want = xmalloc(LEN * 4);
    memset(want, 0, LEN * 4);
    for (int m = 0; m < n; m++) {
        jobs[m] = (cuda_reduce_job){group[m], rand_f32(LEN, -1, 1), LEN, ML_OK};
        for (int i = 0; i < LEN; i++)
            want[i] += jobs[m].host[i];
    }
    for (int m = 0; m < n; m++)
        pthread_create(&th[m], NULL, cuda_reduce_thread, &jobs[m]);
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
    const int n_devices = cuda_ops_open();
    fprintf(stderr, "memory\n");
    test_memory();
    fprintf(stderr, "errors, all-reduce\n");
    test_errors();
    test_all_reduce(n_devices);
    return cuda_ops_close();
}
