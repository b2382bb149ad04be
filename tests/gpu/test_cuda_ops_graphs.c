/* Recorded CUDA graphs replayed with new inputs against the CPU backend run
 * eagerly, and the refusal of transfers while recording.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

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
            cpu_matmul(y, h, w, NULL, M, D, N, 0);
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

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "graphs\n");
    test_graphs();
    return cuda_ops_close();
}
