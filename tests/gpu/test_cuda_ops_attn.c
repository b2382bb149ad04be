/* Attention of the CUDA backend against the CPU backend: vision (tensor
 * cores and SIMT), causal over paged bf16 caches, and cross over image states.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

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
#ifdef MLLAMA_CUDA_HOST
    /* The real tower's tile (1608 tokens, 1601 real) and head dim at one head
     * and one tile: its 6432 tokens x 16 heads are ~50M emulated mma. */
    vision_case(1, 1, 1608, 1601, 1, 80, NMSE_MMA);
#else
    vision_case(1, 4, 1608, 1601, 16, 80, NMSE_MMA); /* the real tower: 6432 tokens */
#endif
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
    float *dk = dput_padded(k, (size_t)n_tok * row * 4);
    float *dv = dput_padded(v, (size_t)n_tok * row * 4);
    float *dq = dput_padded(q, nq * 4), *dout = dput(NULL, nq * 4 + 4);
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
    /* Tiles each image fills (0: every slot): the keys of the others are NaN
     * and cross_io_fill's rows see the filled tiles only, so a kernel that
     * reads a padded tile, which a decode step should not stream, gives NaN. */
    int real_tiles;
    size_t plane;  /* elements of one K or V plane */
    float **host;  /* (n): 2·CROSS_LAYERS planes of bf16-exact f32 (the CPU's kv type), K
                      in the CPU's layout (cpu_state_keys) */
    void **dev;    /* (n): the same in bf16 */
} cross_pool;

static void cross_pool_init(cross_pool *cp, int n, int tiles, int real_tiles, int chunk_len,
                            int n_kv, int hd)
{
    const int keys = tiles * chunk_len;
    const size_t plane = (size_t)keys * n_kv * hd, elems = 2 * CROSS_LAYERS * plane;
    cp->n = n;
    cp->real_tiles = real_tiles;
    cp->plane = plane;
    cp->host = xmalloc((size_t)n * sizeof *cp->host);
    cp->dev = xmalloc((size_t)n * sizeof *cp->dev);
    for (int i = 0; i < n; i++) {
        cp->host[i] = rand_f32_bf16(elems, -1, 1);
        if (real_tiles) /* (keys, n_kv, hd) rows until cpu_state_keys */
            for (size_t pl = 0; pl < 2 * CROSS_LAYERS; pl++)
                for (size_t e = (size_t)real_tiles * chunk_len * n_kv * hd; e < plane; e++)
                    cp->host[i][pl * plane + e] = NAN;
        uint16_t *h16 = to_bf16(cp->host[i], elems);
        cp->dev[i] = dput(h16, elems * 2);
        free(h16);
        cpu_state_keys(cp->host[i], CROSS_LAYERS, keys, n_kv, hd);
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
 * chunk and random chunks, or with the pool's real_tiles see every filled
 * tile of their images; mask columns past a sequence's images are 1 and
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
                                                      : cp->real_tiles ? c % io->max_tiles <
                                                                             cp->real_tiles
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

/* real_tiles: cross_pool's (0: random masks over every slot). */
static void cross_case(int n_seqs, const int *n_tok, const int *n_img, int max_images,
                       int max_tiles, int chunk_len, int n_heads, int n_kv, int hd,
                       int real_tiles)
{
    int n_tokens = 0;
    for (int s = 0; s < n_seqs; s++)
        n_tokens += n_tok[s];
    cross_pool cp;
    cross_pool_init(&cp, max_images + 1, max_tiles, real_tiles, chunk_len, n_kv, hd);
    cross_io io;
    cross_io_init(&io, n_seqs, n_tokens, max_images, max_tiles, chunk_len, n_heads, n_kv, hd);
    cross_io_fill(&io, &cp, n_tok, n_img, 0);
    ml_attn_cross_params p = cross_params(&io, &cp, g_gpu);
    g_gpu->ops->attn_cross(g_gpu, &p);
    char what[128];
    snprintf(what, sizeof what,
             "attn_cross %d seqs, %d tokens, <= %d images x %d x %d keys (%d filled), %d/%d x %d",
             n_seqs, n_tokens, max_images, max_tiles, chunk_len,
             real_tiles ? real_tiles : max_tiles, n_heads, n_kv, hd);
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
    cross_pool_init(&cp, MAX_IMAGES + 1, TILES, 0, CHUNK, KV, HD);
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
    cross_case(3, prefill3, img3, 2, 4, 13, 4, 1, 16, 0); /* prefill, tiny tiles */
    cross_case(3, decode3, img3, 2, 4, 13, 4, 1, 16, 0);  /* decode */
    static const int img4[] = {2, 0, 3, 1}, decode4[] = {1, 1, 1, 1};
    cross_case(4, decode4, img4, 3, 4, 40, 8, 2, 64, 0);  /* decode, keys split over CTAs */
    static const int mixed[] = {1, 30, 1}, mixed_img[] = {1, 2, 0};
    cross_case(3, mixed, mixed_img, 2, 4, 13, 4, 1, 16, 0); /* decode rows in a prefill shape */
    static const int g8_img[] = {1, 0}, g8_tok[] = {1, 1};
    cross_case(2, g8_tok, g8_img, 1, 4, 40, 16, 2, 64, 0); /* GQA groups of 8: 8-row warps */
    /* images of 1 and 2 of 4 tiles whose padded tiles are NaN, read by
     * neither backend: chunks of 96 keys, whole key tiles of both kernels
     * (32 keys on CUDA, 96 on the CPU), so no tile straddles a filled and
     * a padded one */
    cross_case(4, decode4, img4, 3, 4, 96, 8, 2, 64, 1);
    cross_case(3, prefill3, img3, 2, 4, 96, 4, 1, 16, 2);
    /* 11B: a decode batch of 32 (a third text-only) and a two-sequence
     * prefill; the HOST build keeps the images, head dim and grouping but a
     * quarter of the heads (the emulation's time is per head). */
#ifdef MLLAMA_CUDA_HOST
    const int heads = 8, kv_heads = 2;
#else
    const int heads = 32, kv_heads = 8;
#endif
    int img32[32], decode32[32];
    for (int s = 0; s < 32; s++) {
        img32[s] = s % 3;
        decode32[s] = 1;
    }
    cross_case(32, decode32, img32, 2, 4, 1601, heads, kv_heads, 128, 0);
    static const int pre_img[] = {2, 0}, pre_tok[] = {64, 9};
    cross_case(2, pre_tok, pre_img, 2, 4, 1601, heads, kv_heads, 128, 0);
    cross_graph();
}

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "attention\n");
    test_attn_vision();
    test_attn_causal();
    test_attn_cross();
    return cuda_ops_close();
}
