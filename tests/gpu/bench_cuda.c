/* Throughput of the CUDA backend at the model's real shapes, as fractions of
 * the device's roofline (engine/model/README.md §13):
 * - decode: one step of a Llama-3.2-1B-shaped text decoder and of the 11B
 *   Mllama decoder (32 self + 8 cross layers, one 4-tile image per
 *   sequence) at batch 1 and 32 over a 1024-token context, eager and
 *   replayed from a CUDA graph; bytes read per step / time against HBM
 *   bandwidth; and where a step goes: its matmuls, causal attention, cross
 *   attention and the rest (norms, RoPE, kv_write, residuals, sampling),
 *   each part alone replayed from a graph of its own, and the cross
 *   attention again over images of V_REAL_TILES real tiles (their padded
 *   tiles' K/V not read);
 * - vision: one 4-tile image through the vision tower (32 local + 8 global
 *   layers at 6432 tokens), the projector and the 8 cross layers' K/V;
 *   FLOP / time against dense bf16 peak, with attention and GEMMs also
 *   timed alone;
 * - the cost of batch invariance (ml_backend_cuda_create's batch_invariant,
 *   the worker's runtime.batch_invariant): the 11B decode steps and the
 *   vision encode again on a batch-invariant backend, against the above;
 * - FP8 weights in decode: the 11B MLP's GEMVs (gate/up 4096 -> 14336,
 *   down 14336 -> 4096) at 1 and 4 rows through matmul (bf16), matmul_f8
 *   W8A16 and W8A8, weight bytes / time against HBM bandwidth, and the
 *   FP8 / bf16 speed-up (issue 17's goal: 1.8x or more).
 * Weights are random bf16 uploaded straight into device memory (one 64 MiB
 * random block repeated): the op sequence is text.c's and vision.c's, but no
 * checkpoint or model loader is involved, so the bench needs only the op
 * table. Usage: bench_cuda [summary.json]; prints a human summary and,
 * given a path, writes the JSON there. Skipped (77) without a device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "dtype.h"
#include "mlk_backend.h"
#include "mlk_device.h"

#define RAND_BLOCK_BYTES ((size_t)64 << 20)
#define KV_BLOCK 16
#define CONTEXT 1024
#define WARMUP 3
#define ITERS 20
#define VISION_ITERS 5
#define GRAPH_SLOT 0
#define SKIP_EXIT 77 /* ctest SKIP_RETURN_CODE */
/* Vision tower (both published sizes). */
#define V_TILES 4
#define V_TOKENS 1601  /* per tile: 40x40 patches + CLS */
#define V_PADDED 1608
#define V_DIM 1280
#define V_FFN 5120
#define V_HEADS 16
#define V_LOCAL 32
#define V_GLOBAL 8
#define V_OUT (V_DIM * 6) /* final + 5 intermediate layers */
#define V_PATCH_LEN (3 * 14 * 14)
#define V_PATCHES 1600
/* The decode breakdown's cross attention again with images of this many
 * real tiles of V_TILES (a wide photo: 1x2), whose rows see those only. */
#define V_REAL_TILES 2

typedef struct dec_cfg {
    const char *name;
    int D, layers, heads, kv, hd, ffn, vocab;
    int cross_period; /* cross layers at l % period == period - 2 (11B: 3, 8, ..., 38); 0 = none */
} dec_cfg;

static const dec_cfg PRESET_1B = {"1b", 2048, 16, 32, 8, 64, 8192, 128256, 0};
static const dec_cfg PRESET_11B = {"11b", 4096, 40, 32, 8, 128, 14336, 128256, 5};

typedef struct peak {
    double bw, flops;
    const char *basis;
} peak;

static ml_backend *g_be;
static int g_batch_invariant; /* backends made by backend_or_die */
static void *g_rand; /* RAND_BLOCK_BYTES of random bf16 on the device */
static size_t g_weight_bytes;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sync_or_die(const char *what)
{
    char err[512];
    if (g_be->ops->synchronize(g_be, err, sizeof err) != ML_OK) {
        fprintf(stderr, "%s: %s\n", what, err);
        exit(1);
    }
}

static void *dalloc(size_t bytes)
{
    void *p = g_be->ops->alloc(g_be, bytes);
    if (!p) {
        fprintf(stderr, "device pool exhausted (%zu MiB)\n", bytes >> 20);
        exit(1);
    }
    return p;
}

/* A bf16 weight of n elements filled from the random block (counted). */
static uint16_t *dweight(size_t n)
{
    uint16_t *w = dalloc(n * 2);
    size_t done = 0;
    const size_t bytes = n * 2;
    while (done < bytes) {
        size_t chunk = bytes - done < RAND_BLOCK_BYTES ? bytes - done : RAND_BLOCK_BYTES;
        /* device-to-device through the op table: copy_2d of floats */
        g_be->ops->copy_2d(g_be, (float *)((char *)w + done), g_rand, 1, (int)(chunk / 4), 0, 1, 0);
        done += chunk;
    }
    g_weight_bytes += bytes;
    return w;
}

static void *dupload(const void *host, size_t bytes)
{
    void *d = dalloc(bytes);
    g_be->ops->upload(g_be, d, host, bytes);
    return d;
}

/* ---- the decoder -------------------------------------------------------------------------- */

typedef struct layer_w {
    int cross;
    uint16_t *q, *k, *v, *o, *gate, *up, *down, *in_norm, *post_norm, *q_norm;
} layer_w;

typedef struct decoder {
    dec_cfg c;
    int B, n_self, n_cross, max_blocks;
    layer_w *L;
    uint16_t *embed, *norm, *lm_head;
    /* activations (B rows) */
    float *h, *x, *q, *attn, *k, *v, *gate, *up, *logits, *inv_freq, *row_ones;
    int32_t *tokens, *pos, *slots, *tables, *seq_start, *pos0;
    uint8_t *allowed;
    /* Greedy sampling of every row, as a server step without sampling
     * controls: the sample op's cheapest path, one maximum per row. */
    ml_sample_row *sample_rows; /* device (B) */
    ml_sample_out *sample_out;  /* device (B) */
    void *sample_scratch;       /* device: sample_scratch_bytes(B, vocab) */
    void **kc, **vc;        /* per self layer */
    /* One image per sequence: a state of every cross layer's K then V plane. */
    void **img_state;       /* (B) */
    size_t img_plane;       /* bytes of one plane */
    const void **states;    /* device (B): img_state, attn_cross's table */
    int32_t *n_images;      /* device (B): 1 each */
    size_t bytes_per_step;  /* weights + caches + image K/V read by one step */
    size_t matmul_bytes;    /* the Linears' and lm_head's weights */
} decoder;

/* The parts of a decode step (decode_step's parts): the breakdown replays
 * each alone. Skipping a part leaves stale values in the buffers it writes,
 * which changes no timing: the shapes and the bytes read are the same. */
enum {
    STEP_MATMULS = 1,
    STEP_CAUSAL = 2,
    STEP_CROSS = 4,
    STEP_REST = 8,
    STEP_ALL = STEP_MATMULS | STEP_CAUSAL | STEP_CROSS | STEP_REST
};

/* A Linear's weight (dweight), its bytes counted in the step's matmul bytes. */
static uint16_t *dlinear(decoder *d, size_t n)
{
    d->matmul_bytes += n * sizeof(uint16_t);
    return dweight(n);
}

static int is_cross(const dec_cfg *c, int l)
{
    return c->cross_period && l % c->cross_period == c->cross_period - 2;
}

static void decoder_build(decoder *d, const dec_cfg *c, int B)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->B = B;
    const size_t D = c->D, qw = (size_t)c->heads * c->hd, kvw = (size_t)c->kv * c->hd;
    const size_t F = c->ffn;
    g_weight_bytes = 0;
    d->L = calloc((size_t)c->layers, sizeof *d->L);
    size_t read = 0;
    for (int l = 0; l < c->layers; l++) {
        layer_w *L = &d->L[l];
        L->cross = is_cross(c, l);
        const size_t before = g_weight_bytes;
        L->q = dlinear(d, qw * D);
        L->o = dlinear(d, D * qw);
        if (!L->cross) {
            L->k = dlinear(d, kvw * D);
            L->v = dlinear(d, kvw * D);
        } else {
            L->q_norm = dweight((size_t)c->hd);
        }
        L->gate = dlinear(d, F * D);
        L->up = dlinear(d, F * D);
        L->down = dlinear(d, D * F);
        L->in_norm = dweight(D);
        L->post_norm = dweight(D);
        read += g_weight_bytes - before;
        d->n_cross += L->cross;
    }
    d->n_self = c->layers - d->n_cross;
    d->embed = dweight((size_t)(c->vocab + 8) * D);
    d->norm = dweight(D);
    d->lm_head = dlinear(d, (size_t)c->vocab * D);
    read += (size_t)B * D * 2 + D * 2 + (size_t)c->vocab * D * 2;

    d->h = dalloc((size_t)B * D * 4);
    d->x = dalloc((size_t)B * D * 4);
    d->q = dalloc((size_t)B * qw * 4);
    d->attn = dalloc((size_t)B * qw * 4);
    d->k = dalloc((size_t)B * kvw * 4);
    d->v = dalloc((size_t)B * kvw * 4);
    d->gate = dalloc((size_t)B * F * 4);
    d->up = dalloc((size_t)B * F * 4);
    d->logits = dalloc((size_t)B * c->vocab * 4);

    /* Every sequence at position CONTEXT, blocks laid out per sequence. */
    d->max_blocks = (CONTEXT + 1 + KV_BLOCK - 1) / KV_BLOCK;
    int32_t *tok = malloc((size_t)B * 4), *pos = malloc((size_t)B * 4), *slot = malloc((size_t)B * 4);
    int32_t *tab = malloc((size_t)B * d->max_blocks * 4), *start = malloc((size_t)(B + 1) * 4);
    int32_t *p0 = malloc((size_t)B * 4);
    float *inv = malloc((size_t)c->hd / 2 * 4), *ones = malloc((size_t)B * 4);
    uint8_t *allowed = malloc((size_t)B * V_TILES);
    for (int s = 0; s < B; s++) {
        tok[s] = (s * 7919) % c->vocab;
        pos[s] = CONTEXT;
        p0[s] = CONTEXT;
        start[s] = s;
        ones[s] = 1.0f;
        for (int b = 0; b < d->max_blocks; b++)
            tab[s * d->max_blocks + b] = s * d->max_blocks + b;
        slot[s] = tab[s * d->max_blocks + CONTEXT / KV_BLOCK] * KV_BLOCK + CONTEXT % KV_BLOCK;
        for (int t = 0; t < V_TILES; t++)
            allowed[s * V_TILES + t] = 1;
    }
    start[B] = B;
    for (int i = 0; i < c->hd / 2; i++)
        inv[i] = powf(500000.0f, -2.0f * i / c->hd);
    d->tokens = dupload(tok, (size_t)B * 4);
    d->pos = dupload(pos, (size_t)B * 4);
    d->slots = dupload(slot, (size_t)B * 4);
    d->tables = dupload(tab, (size_t)B * d->max_blocks * 4);
    d->seq_start = dupload(start, (size_t)(B + 1) * 4);
    d->pos0 = dupload(p0, (size_t)B * 4);
    d->inv_freq = dupload(inv, (size_t)c->hd / 2 * 4);
    d->row_ones = dupload(ones, (size_t)B * 4);
    d->allowed = dupload(allowed, (size_t)B * V_TILES);
    ml_sample_row *greedy = calloc((size_t)B, sizeof *greedy);
    for (int s = 0; s < B; s++)
        greedy[s] = (ml_sample_row){.top_p = 1.0f, .repetition_penalty = 1.0f};
    d->sample_rows = dupload(greedy, (size_t)B * sizeof *greedy);
    d->sample_out = dalloc((size_t)B * sizeof *d->sample_out);
    d->sample_scratch = dalloc(g_be->ops->sample_scratch_bytes(g_be, B, c->vocab));
    free(greedy);
    free(tok);
    free(pos);
    free(slot);
    free(tab);
    free(start);
    free(p0);
    free(inv);
    free(ones);
    free(allowed);

    const size_t layer_cache = (size_t)B * d->max_blocks * KV_BLOCK * kvw * 2;
    d->kc = calloc((size_t)d->n_self + 1, sizeof *d->kc);
    d->vc = calloc((size_t)d->n_self + 1, sizeof *d->vc);
    for (int l = 0; l < d->n_self; l++) {
        d->kc[l] = dalloc(layer_cache);
        d->vc[l] = dalloc(layer_cache);
        g_be->ops->zero(g_be, d->kc[l], layer_cache / 4);
        g_be->ops->zero(g_be, d->vc[l], layer_cache / 4);
    }
    read += (size_t)d->n_self * 2 * B * (CONTEXT + 1) * kvw * 2;
    const size_t plane = (size_t)V_TILES * V_TOKENS * kvw * 2;
    d->img_plane = plane;
    d->img_state = calloc((size_t)B, sizeof *d->img_state);
    int32_t *one = malloc((size_t)B * 4);
    for (int s = 0; s < B; s++) {
        one[s] = 1;
        if (d->n_cross) {
            d->img_state[s] = dalloc(2 * (size_t)d->n_cross * plane);
            g_be->ops->zero(g_be, d->img_state[s], 2 * (size_t)d->n_cross * plane / 4);
        }
    }
    d->states = dupload(d->img_state, (size_t)B * sizeof *d->img_state);
    d->n_images = dupload(one, (size_t)B * 4);
    free(one);
    read += (size_t)B * d->n_cross * 2 * plane;
    d->bytes_per_step = read;
    sync_or_die("decoder build");
}

static void mlp(decoder *d, const layer_w *L, int parts)
{
    const ml_backend_ops *o = g_be->ops;
    const dec_cfg *c = &d->c;
    if (parts & STEP_MATMULS) {
        o->matmul(g_be, d->gate, d->x, L->gate, NULL, d->B, c->D, c->ffn, 0);
        o->matmul(g_be, d->up, d->x, L->up, NULL, d->B, c->D, c->ffn, 0);
    }
    if (parts & STEP_REST)
        o->silu_mul(g_be, d->gate, d->gate, d->up, (size_t)d->B * c->ffn);
    if (parts & STEP_MATMULS)
        o->matmul(g_be, d->x, d->gate, L->down, NULL, d->B, c->ffn, c->D, 0);
}

/* One decode step: text.c's op sequence for B sequences of one token, or
 * the ops of some of its parts (STEP_*). */
static void decode_step(decoder *d, int parts)
{
    const ml_backend_ops *o = g_be->ops;
    const dec_cfg *c = &d->c;
    const int B = d->B, D = c->D, H = c->heads, KV = c->kv, hd = c->hd;
    const float eps = 1e-5f, scale = 1.0f / sqrtf((float)hd);
    const int mm = parts & STEP_MATMULS, rest = parts & STEP_REST;
    if (rest)
        o->embed(g_be, d->h, d->embed, d->tokens, B, D);
    for (int l = 0, self = 0, cross = 0; l < c->layers; l++) {
        const layer_w *L = &d->L[l];
        if (rest)
            o->rmsnorm(g_be, d->x, d->h, L->in_norm, B, D, eps);
        if (mm)
            o->matmul(g_be, d->q, d->x, L->q, NULL, B, D, H * hd, 0);
        if (!L->cross) {
            if (mm) {
                o->matmul(g_be, d->k, d->x, L->k, NULL, B, D, KV * hd, 0);
                o->matmul(g_be, d->v, d->x, L->v, NULL, B, D, KV * hd, 0);
            }
            if (rest) {
                o->rope(g_be, d->q, d->pos, d->inv_freq, B, H, hd);
                o->rope(g_be, d->k, d->pos, d->inv_freq, B, KV, hd);
                o->kv_write(g_be, d->kc[self], d->vc[self], d->k, d->v, d->slots, B, KV, hd);
            }
            ml_attn_causal_params ap = {
                .out = d->attn, .q = d->q, .k_cache = d->kc[self], .v_cache = d->vc[self],
                .block_table = d->tables, .seq_start = d->seq_start, .pos0 = d->pos0,
                .n_seqs = B, .max_blocks_per_seq = d->max_blocks, .block_size = KV_BLOCK,
                .n_heads = H, .n_kv_heads = KV, .head_dim = hd, .scale = scale};
            if (parts & STEP_CAUSAL)
                o->attn_causal(g_be, &ap);
            self++;
        } else {
            if (rest)
                o->rmsnorm(g_be, d->q, d->q, L->q_norm, B * H, hd, eps);
            const size_t k_offset = 2 * (size_t)cross * d->img_plane;
            ml_attn_cross_params ap = {
                .out = d->attn, .q = d->q, .states = d->states, .k_offset = k_offset,
                .v_offset = k_offset + d->img_plane, .n_images = d->n_images,
                .seq_start = d->seq_start, .allowed = d->allowed, .n_seqs = B, .n_tokens = B,
                .max_images = 1, .max_tiles = V_TILES, .chunk_len = V_TOKENS, .n_heads = H,
                .n_kv_heads = KV, .head_dim = hd, .scale = scale};
            if (parts & STEP_CROSS)
                o->attn_cross(g_be, &ap);
            cross++;
        }
        if (mm)
            o->matmul(g_be, d->x, d->attn, L->o, NULL, B, H * hd, D, 0);
        if (rest) {
            o->add_rows(g_be, d->h, d->x, L->cross ? d->row_ones : NULL, L->cross ? 0.5f : 1.0f,
                        B, D);
            o->rmsnorm(g_be, d->x, d->h, L->post_norm, B, D, eps);
        }
        mlp(d, L, parts);
        if (rest)
            o->add_rows(g_be, d->h, d->x, L->cross ? d->row_ones : NULL, L->cross ? 0.5f : 1.0f,
                        B, D);
    }
    if (rest)
        o->rmsnorm(g_be, d->x, d->h, d->norm, B, D, eps);
    if (mm)
        o->matmul(g_be, d->logits, d->x, d->lm_head, NULL, B, D, c->vocab, 0);
    ml_sample_params sp = {.out = d->sample_out, .logits = d->logits, .row = d->sample_rows,
                           .scratch = d->sample_scratch, .rows = B, .vocab = c->vocab};
    if (rest)
        o->sample(g_be, &sp);
}

typedef struct decode_result {
    double eager_ms, graph_ms, bytes, matmul_bytes;
    /* Each part alone, from a graph of its own (STEP_*; cross 0 without cross layers). */
    double matmul_ms, causal_ms, cross_ms, rest_ms;
    double cross_real_tiles_ms; /* cross_ms with images of V_REAL_TILES tiles */
} decode_result;

/* ms per replay of a graph of the step's parts. */
static double graph_ms(decoder *d, int parts)
{
    g_be->ops->graph_begin(g_be, GRAPH_SLOT);
    decode_step(d, parts);
    g_be->ops->graph_end(g_be, GRAPH_SLOT);
    sync_or_die("decode graph record");
    for (int i = 0; i < WARMUP; i++)
        g_be->ops->graph_replay(g_be, GRAPH_SLOT);
    sync_or_die("decode graph warm-up");
    const double t0 = now_s();
    for (int i = 0; i < ITERS; i++) {
        g_be->ops->graph_replay(g_be, GRAPH_SLOT); /* a step's tokens are read each step */
        sync_or_die("decode graph");
    }
    return (now_s() - t0) * 1e3 / ITERS;
}

static decode_result bench_decode(const dec_cfg *c, int B)
{
    decoder d;
    decoder_build(&d, c, B);
    decode_result r = {.bytes = (double)d.bytes_per_step, .matmul_bytes = (double)d.matmul_bytes};
    for (int i = 0; i < WARMUP; i++)
        decode_step(&d, STEP_ALL);
    sync_or_die("decode warm-up");
    const double t0 = now_s();
    for (int i = 0; i < ITERS; i++) {
        decode_step(&d, STEP_ALL);
        sync_or_die("decode");
    }
    r.eager_ms = (now_s() - t0) * 1e3 / ITERS;
    r.graph_ms = graph_ms(&d, STEP_ALL);
    r.matmul_ms = graph_ms(&d, STEP_MATMULS);
    r.causal_ms = graph_ms(&d, STEP_CAUSAL);
    r.cross_ms = d.n_cross ? graph_ms(&d, STEP_CROSS) : 0.0;
    r.rest_ms = graph_ms(&d, STEP_REST);
    if (d.n_cross) {
        uint8_t *allowed = malloc((size_t)B * V_TILES);
        for (int i = 0; i < B * V_TILES; i++)
            allowed[i] = i % V_TILES < V_REAL_TILES;
        g_be->ops->upload(g_be, d.allowed, allowed, (size_t)B * V_TILES);
        free(allowed);
        r.cross_real_tiles_ms = graph_ms(&d, STEP_CROSS);
    }
    /* The pool is reused by the next configuration: drop everything. */
    g_be->ops->destroy(g_be);
    g_be = NULL;
    free(d.L);
    free(d.kc);
    free(d.vc);
    free(d.img_state);
    return r;
}

/* ---- the vision tower ------------------------------------------------------------------------ */

typedef struct vlayer {
    uint16_t *q, *k, *v, *o, *fc1, *fc1_b, *fc2, *fc2_b, *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} vlayer;

typedef struct vision {
    vlayer L[V_LOCAL + V_GLOBAL];
    uint16_t *patch, *proj, *proj_b, *kv_w[16], *k_norm;
    float *pixels, *patches, *h, *x, *q, *k, *v, *attn, *mlp, *vout, *projected, *kv_tmp;
    uint8_t *valid;
    void *state;
    int D, kvw;
} vision;

static void vision_build(vision *v, int D, int kvw)
{
    const size_t S = (size_t)V_TILES * V_PADDED, TP = (size_t)V_TILES * V_TOKENS;
    v->D = D;
    v->kvw = kvw;
    for (int l = 0; l < V_LOCAL + V_GLOBAL; l++) {
        vlayer *L = &v->L[l];
        L->q = dweight((size_t)V_DIM * V_DIM);
        L->k = dweight((size_t)V_DIM * V_DIM);
        L->v = dweight((size_t)V_DIM * V_DIM);
        L->o = dweight((size_t)V_DIM * V_DIM);
        L->fc1 = dweight((size_t)V_FFN * V_DIM);
        L->fc1_b = dweight(V_FFN);
        L->fc2 = dweight((size_t)V_DIM * V_FFN);
        L->fc2_b = dweight(V_DIM);
        L->ln1_w = dweight(V_DIM);
        L->ln1_b = dweight(V_DIM);
        L->ln2_w = dweight(V_DIM);
        L->ln2_b = dweight(V_DIM);
    }
    v->patch = dweight((size_t)V_DIM * V_PATCH_LEN);
    v->proj = dweight((size_t)D * V_OUT);
    v->proj_b = dweight((size_t)D);
    for (int i = 0; i < 16; i++)
        v->kv_w[i] = dweight((size_t)kvw * D);
    v->k_norm = dweight(128);
    v->pixels = dalloc((size_t)V_TILES * 3 * 560 * 560 * 4);
    g_be->ops->zero(g_be, v->pixels, (size_t)V_TILES * 3 * 560 * 560);
    v->patches = dalloc((size_t)V_TILES * V_PATCHES * V_PATCH_LEN * 4);
    v->h = dalloc(S * V_DIM * 4);
    v->x = dalloc(S * V_DIM * 4);
    v->q = dalloc(S * V_DIM * 4);
    v->k = dalloc(S * V_DIM * 4);
    v->v = dalloc(S * V_DIM * 4);
    v->attn = dalloc(S * V_DIM * 4);
    v->mlp = dalloc(S * V_FFN * 4);
    v->vout = dalloc(TP * V_OUT * 4);
    v->projected = dalloc(TP * (size_t)D * 4);
    v->kv_tmp = dalloc(TP * (size_t)kvw * 4);
    v->state = dalloc(16 * TP * (size_t)kvw * 2);
    uint8_t *valid = malloc(S);
    for (size_t t = 0; t < S; t++)
        valid[t] = t % V_PADDED < V_TOKENS;
    v->valid = dupload(valid, S);
    free(valid);
    sync_or_die("vision build");
}

static void vision_attention(vision *v)
{
    ml_attn_vision_params ap = {.out = v->attn, .q = v->q, .k = v->k, .v = v->v,
                                .valid = v->valid, .n_seq = 1, .seq_len = V_TILES * V_PADDED,
                                .n_heads = V_HEADS, .head_dim = V_DIM / V_HEADS,
                                .scale = 1.0f / sqrtf((float)(V_DIM / V_HEADS))};
    g_be->ops->attn_vision(g_be, &ap);
}

/* vision.c's encoder_layer; parts: 1 = GEMMs only, 2 = attention only, 3 = all. */
static void vision_layer(vision *v, const vlayer *L, int parts)
{
    const ml_backend_ops *o = g_be->ops;
    const int S = V_TILES * V_PADDED;
    if (parts & 1) {
        if (parts & 2)
            o->layernorm(g_be, v->x, v->h, L->ln1_w, L->ln1_b, S, V_DIM, 1e-5f);
        o->matmul(g_be, v->q, v->x, L->q, NULL, S, V_DIM, V_DIM, 0);
        o->matmul(g_be, v->k, v->x, L->k, NULL, S, V_DIM, V_DIM, 0);
        o->matmul(g_be, v->v, v->x, L->v, NULL, S, V_DIM, V_DIM, 0);
    }
    if (parts & 2)
        vision_attention(v);
    if (parts & 1) {
        o->matmul(g_be, v->x, v->attn, L->o, NULL, S, V_DIM, V_DIM, 0);
        if (parts & 2) {
            o->add_rows(g_be, v->h, v->x, NULL, 1.0f, S, V_DIM);
            o->layernorm(g_be, v->x, v->h, L->ln2_w, L->ln2_b, S, V_DIM, 1e-5f);
        }
        o->matmul(g_be, v->mlp, v->x, L->fc1, L->fc1_b, S, V_DIM, V_FFN, 0);
        if (parts & 2)
            o->gelu(g_be, v->mlp, (size_t)S * V_FFN);
        o->matmul(g_be, v->x, v->mlp, L->fc2, L->fc2_b, S, V_FFN, V_DIM, 0);
        if (parts & 2)
            o->add_rows(g_be, v->h, v->x, NULL, 1.0f, S, V_DIM);
    }
}

/* ml_model_encode_image's device work for one 4-tile image. */
static void vision_encode(vision *v)
{
    const ml_backend_ops *o = g_be->ops;
    const int S = V_TILES * V_PADDED, TP = V_TILES * V_TOKENS;
    o->zero(g_be, v->h, (size_t)S * V_DIM);
    o->patchify(g_be, v->patches, v->pixels, V_TILES, 560, 14);
    for (int t = 0; t < V_TILES; t++)
        o->matmul(g_be, v->h + (size_t)t * V_PADDED * V_DIM + V_DIM,
                  v->patches + (size_t)t * V_PATCHES * V_PATCH_LEN, v->patch, NULL, V_PATCHES,
                  V_PATCH_LEN, V_DIM, 0);
    for (int l = 0; l < V_LOCAL + V_GLOBAL; l++)
        vision_layer(v, &v->L[l], 3);
    for (int t = 0; t < V_TILES; t++)
        o->copy_2d(g_be, v->vout + (size_t)t * V_TOKENS * V_OUT, v->h + (size_t)t * V_PADDED * V_DIM,
                   V_TOKENS, V_DIM, V_OUT, 1, V_DIM);
    o->matmul(g_be, v->projected, v->vout, v->proj, v->proj_b, TP, V_OUT, v->D, 0);
    char *dst = v->state;
    const size_t plane = (size_t)TP * v->kvw;
    for (int i = 0; i < 16; i++) {
        o->matmul(g_be, v->kv_tmp, v->projected, v->kv_w[i], NULL, TP, v->D, v->kvw, 0);
        if (i % 2 == 0)
            o->rmsnorm(g_be, v->kv_tmp, v->kv_tmp, v->k_norm, TP * (v->kvw / 128), 128, 1e-5f);
        o->kv_store(g_be, dst, v->kv_tmp, plane);
        dst += plane * 2;
    }
}

typedef struct vision_result {
    double ms, flops, attn_ms, attn_flops, gemm_ms, gemm_flops;
} vision_result;

static double time_ms(void (*fn)(vision *, int), vision *v, int arg, int iters)
{
    fn(v, arg);
    sync_or_die("vision warm-up");
    const double t0 = now_s();
    for (int i = 0; i < iters; i++)
        fn(v, arg);
    sync_or_die("vision");
    return (now_s() - t0) * 1e3 / iters;
}

static void run_encode(vision *v, int unused)
{
    (void)unused;
    vision_encode(v);
}

static void run_layers(vision *v, int parts)
{
    for (int l = 0; l < V_LOCAL + V_GLOBAL; l++)
        vision_layer(v, &v->L[l], parts);
}

static vision_result bench_vision(void)
{
    vision v;
    memset(&v, 0, sizeof v);
    vision_build(&v, PRESET_11B.D, PRESET_11B.kv * PRESET_11B.hd);
    const double S = V_TILES * V_PADDED, TP = V_TILES * V_TOKENS, L = V_LOCAL + V_GLOBAL;
    vision_result r;
    r.gemm_flops = L * 2.0 * S * (4.0 * V_DIM * V_DIM + 2.0 * V_DIM * V_FFN);
    r.attn_flops = L * 4.0 * S * S * V_DIM;
    r.flops = r.gemm_flops + r.attn_flops + 2.0 * V_TILES * V_PATCHES * V_PATCH_LEN * V_DIM +
              2.0 * TP * V_OUT * PRESET_11B.D + 16 * 2.0 * TP * PRESET_11B.D * v.kvw;
    r.ms = time_ms(run_encode, &v, 0, VISION_ITERS);
    r.attn_ms = time_ms(run_layers, &v, 2, VISION_ITERS);
    r.gemm_ms = time_ms(run_layers, &v, 1, VISION_ITERS);
    return r;
}

/* ---- FP8 weights: the decode GEMV ------------------------------------------------------------- */

#define GEMV_SHAPES 2
#define GEMV_BATCHES 2
/* Scales of ~0.05-magnitude weights (absmax / 448); values do not change
 * the timing, but keep the sums finite. */
#define F8_SCALE 1e-4f

typedef struct gemv_result {
    int M, K, N;
    double bf16_ms, w8a16_ms, w8a8_ms;
} gemv_result;

typedef enum gemv_kind { GEMV_BF16, GEMV_W8A16, GEMV_W8A8 } gemv_kind;

typedef struct gemv_job {
    int M, K, N;
    float *y, *x, *scale;
    uint16_t *w16;
    uint8_t *w8;
} gemv_job;

static double gemv_ms(const gemv_job *j, gemv_kind kind)
{
    const ml_backend_ops *o = g_be->ops;
    double t0 = 0;
    for (int it = 0; it < WARMUP + ITERS; it++) {
        if (it == WARMUP) {
            sync_or_die("gemv warm-up");
            t0 = now_s();
        }
        if (kind == GEMV_BF16)
            o->matmul(g_be, j->y, j->x, j->w16, NULL, j->M, j->K, j->N, 0);
        else
            o->matmul_f8(g_be, j->y, j->x, j->w8, j->scale, NULL, j->M, j->K, j->N,
                         kind == GEMV_W8A8);
    }
    sync_or_die("gemv");
    return (now_s() - t0) * 1e3 / ITERS;
}

/* bf16 and E4M3 weights of one shape, each call timed alone. */
static gemv_result bench_gemv(int M, int K, int N)
{
    const size_t nw = (size_t)N * K;
    uint8_t *codes = malloc(nw);
    float *host = malloc(((size_t)M * K > (size_t)N ? (size_t)M * K : (size_t)N) * sizeof *host);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < nw; i++) { /* finite codes only (0x7f, 0xff are NaN) */
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        codes[i] = (uint8_t)((s >> 32) % 0x7f) | (uint8_t)((s >> 8) & 0x80);
    }
    gemv_job j = {M, K, N, dalloc((size_t)M * N * 4), NULL, NULL, dweight(nw), dupload(codes, nw)};
    for (size_t i = 0; i < (size_t)N; i++)
        host[i] = F8_SCALE;
    j.scale = dupload(host, (size_t)N * sizeof *host);
    for (size_t i = 0; i < (size_t)M * K; i++)
        host[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    j.x = dupload(host, (size_t)M * K * sizeof *host);
    free(codes);
    free(host);
    const gemv_result r = {M, K, N, gemv_ms(&j, GEMV_BF16), gemv_ms(&j, GEMV_W8A16),
                           gemv_ms(&j, GEMV_W8A8)};
    return r;
}

/* ---- main ------------------------------------------------------------------------------------- */

static peak peak_of(const char *name)
{
    if (strstr(name, "H200"))
        return (peak){4.8e12, 989e12, "H200 SXM datasheet"};
    if (strstr(name, "H100"))
        return (peak){3.35e12, 989e12, "H100 SXM datasheet"};
    if (strstr(name, "A100"))
        return (peak){2.039e12, 312e12, "A100 SXM 80GB datasheet"};
    return (peak){4.8e12, 989e12, "unknown device: H200 figures used"};
}

static ml_backend *backend_or_die(void)
{
    char err[512];
    ml_backend *be = ml_backend_cuda_create(0, 0, g_batch_invariant, err, sizeof err);
    if (!be) {
        fprintf(stderr, "cuda backend: %s\n", err);
        exit(1);
    }
    /* The random block every weight is copied from. */
    void *host = malloc(RAND_BLOCK_BYTES);
    uint16_t *w = host;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < RAND_BLOCK_BYTES / 2; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        w[i] = ml_f32_to_bf16((float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.04f);
    }
    g_be = be;
    g_rand = dalloc(RAND_BLOCK_BYTES);
    be->ops->upload(be, g_rand, host, RAND_BLOCK_BYTES);
    sync_or_die("random block");
    free(host);
    return be;
}

int main(int argc, char **argv)
{
    if (mlk_device_count() == 0) {
        fprintf(stderr, "SKIP: no CUDA device\n");
        return SKIP_EXIT;
    }
    mlk_device_info info;
    char err[512];
    if (mlk_device_query(0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const peak pk = peak_of(info.name);
    printf("device: %s (sm_%d%d, %d SMs); roofline %.2f TB/s, %.0f TFLOP/s bf16 (%s)\n", info.name,
           info.major, info.minor, info.multiprocessors, pk.bw / 1e12, pk.flops / 1e12, pk.basis);

    const dec_cfg *cfgs[] = {&PRESET_1B, &PRESET_11B};
    const int batches[] = {1, 32};
    decode_result dec[2][2];
    for (int ci = 0; ci < 2; ci++)
        for (int bi = 0; bi < 2; bi++) {
            backend_or_die();
            dec[ci][bi] = bench_decode(cfgs[ci], batches[bi]);
            const decode_result *r = &dec[ci][bi];
            printf("decode %-3s batch %2d ctx %d: %7.3f ms/step graph (%7.3f eager), %8.1f tok/s, "
                   "%.2f GB/step, %.1f%% of HBM roofline\n",
                   cfgs[ci]->name, batches[bi], CONTEXT, r->graph_ms, r->eager_ms,
                   batches[bi] * 1e3 / r->graph_ms, r->bytes / 1e9,
                   100.0 * r->bytes / (r->graph_ms * 1e-3) / pk.bw);
            printf("  each part alone: matmuls %.3f ms (%.1f%% of HBM for their weights), causal "
                   "attention %.3f, cross attention %.3f, the rest %.3f; sum %.3f\n",
                   r->matmul_ms, 100.0 * r->matmul_bytes / (r->matmul_ms * 1e-3) / pk.bw,
                   r->causal_ms, r->cross_ms, r->rest_ms,
                   r->matmul_ms + r->causal_ms + r->cross_ms + r->rest_ms);
            if (r->cross_ms > 0)
                printf("  cross attention over %d-tile images (of %d): %.3f ms, %.2fx the time\n",
                       V_REAL_TILES, V_TILES, r->cross_real_tiles_ms,
                       r->cross_real_tiles_ms / r->cross_ms);
        }
    backend_or_die();
    const vision_result vr = bench_vision();
    g_be->ops->destroy(g_be);
    printf("vision 4 tiles (6432 tokens) + projector + cross K/V: %.2f ms, %.1f TFLOP, %.1f%% MFU\n",
           vr.ms, vr.flops / 1e12, 100.0 * vr.flops / (vr.ms * 1e-3) / pk.flops);
    printf("  attention alone: %.2f ms (%.1f%% MFU); GEMMs alone: %.2f ms (%.1f%% MFU)\n",
           vr.attn_ms, 100.0 * vr.attn_flops / (vr.attn_ms * 1e-3) / pk.flops, vr.gemm_ms,
           100.0 * vr.gemm_flops / (vr.gemm_ms * 1e-3) / pk.flops);

    /* The same 11B steps and encode with batch invariance on. */
    g_batch_invariant = 1;
    decode_result inv[2];
    for (int bi = 0; bi < 2; bi++) {
        backend_or_die();
        inv[bi] = bench_decode(&PRESET_11B, batches[bi]);
        printf("batch-invariant decode 11b batch %2d: %7.3f ms/step graph (%7.3f eager), "
               "%+.1f%% against off\n",
               batches[bi], inv[bi].graph_ms, inv[bi].eager_ms,
               100.0 * (inv[bi].graph_ms / dec[1][bi].graph_ms - 1.0));
    }
    backend_or_die();
    const vision_result vinv = bench_vision();
    g_be->ops->destroy(g_be);
    printf("batch-invariant vision: %.2f ms (GEMMs %.2f ms), %+.1f%% against off\n", vinv.ms,
           vinv.gemm_ms, 100.0 * (vinv.ms / vr.ms - 1.0));

    g_batch_invariant = 0;
    static const int gemv_shapes[GEMV_SHAPES][2] = {{4096, 14336}, {14336, 4096}};
    static const int gemv_batches[GEMV_BATCHES] = {1, 4};
    gemv_result gv[GEMV_SHAPES][GEMV_BATCHES];
    backend_or_die();
    for (int si = 0; si < GEMV_SHAPES; si++)
        for (int bi = 0; bi < GEMV_BATCHES; bi++) {
            gemv_result *r = &gv[si][bi];
            *r = bench_gemv(gemv_batches[bi], gemv_shapes[si][0], gemv_shapes[si][1]);
            const double nw = (double)r->N * r->K;
            printf("gemv %d x %5d -> %5d: bf16 %.3f ms (%.0f%% of HBM), fp8 W8A16 %.3f ms "
                   "(%.0f%%, %.2fx), W8A8 %.3f ms (%.2fx)\n",
                   r->M, r->K, r->N, r->bf16_ms, 100.0 * 2 * nw / (r->bf16_ms * 1e-3) / pk.bw,
                   r->w8a16_ms, 100.0 * nw / (r->w8a16_ms * 1e-3) / pk.bw,
                   r->bf16_ms / r->w8a16_ms, r->w8a8_ms, r->bf16_ms / r->w8a8_ms);
        }
    g_be->ops->destroy(g_be);

    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (!f) {
            perror(argv[1]);
            return 1;
        }
        fprintf(f, "{\n  \"device\": \"%s\",\n  \"peak_bytes_per_s\": %.4g,\n"
                   "  \"peak_flops\": %.4g,\n  \"peak_basis\": \"%s\",\n  \"decode\": [\n",
                info.name, pk.bw, pk.flops, pk.basis);
        for (int ci = 0; ci < 2; ci++)
            for (int bi = 0; bi < 2; bi++) {
                const decode_result *r = &dec[ci][bi];
                fprintf(f,
                        "    {\"model\": \"%s\", \"batch\": %d, \"context\": %d, "
                        "\"ms_per_step\": %.4f, \"eager_ms_per_step\": %.4f, "
                        "\"tokens_per_s\": %.1f, \"bytes_per_step\": %.0f, "
                        "\"hbm_fraction\": %.4f, \"parts_ms\": {\"matmuls\": %.4f, "
                        "\"causal\": %.4f, \"cross\": %.4f, \"rest\": %.4f, "
                        "\"cross_%d_tiles\": %.4f}}%s\n",
                        cfgs[ci]->name, batches[bi], CONTEXT, r->graph_ms, r->eager_ms,
                        batches[bi] * 1e3 / r->graph_ms, r->bytes,
                        r->bytes / (r->graph_ms * 1e-3) / pk.bw, r->matmul_ms, r->causal_ms,
                        r->cross_ms, r->rest_ms, V_REAL_TILES, r->cross_real_tiles_ms,
                        ci == 1 && bi == 1 ? "" : ",");
            }
        fprintf(f,
                "  ],\n  \"vision\": {\"tiles\": %d, \"ms\": %.3f, \"flops\": %.4g, \"mfu\": %.4f,"
                " \"attention_ms\": %.3f, \"attention_mfu\": %.4f, \"gemm_ms\": %.3f,"
                " \"gemm_mfu\": %.4f},\n",
                V_TILES, vr.ms, vr.flops, vr.flops / (vr.ms * 1e-3) / pk.flops, vr.attn_ms,
                vr.attn_flops / (vr.attn_ms * 1e-3) / pk.flops, vr.gemm_ms,
                vr.gemm_flops / (vr.gemm_ms * 1e-3) / pk.flops);
        fprintf(f,
                "  \"batch_invariant\": {\"decode_11b\": [{\"batch\": %d, \"ms_per_step\": %.4f, "
                "\"off_ms_per_step\": %.4f}, {\"batch\": %d, \"ms_per_step\": %.4f, "
                "\"off_ms_per_step\": %.4f}], \"vision_ms\": %.3f, \"off_vision_ms\": %.3f},\n",
                batches[0], inv[0].graph_ms, dec[1][0].graph_ms, batches[1], inv[1].graph_ms,
                dec[1][1].graph_ms, vinv.ms, vr.ms);
        fprintf(f, "  \"fp8_gemv\": [\n");
        for (int si = 0; si < GEMV_SHAPES; si++)
            for (int bi = 0; bi < GEMV_BATCHES; bi++) {
                const gemv_result *r = &gv[si][bi];
                fprintf(f,
                        "    {\"rows\": %d, \"K\": %d, \"N\": %d, \"bf16_ms\": %.4f, "
                        "\"w8a16_ms\": %.4f, \"w8a8_ms\": %.4f}%s\n",
                        r->M, r->K, r->N, r->bf16_ms, r->w8a16_ms, r->w8a8_ms,
                        si == GEMV_SHAPES - 1 && bi == GEMV_BATCHES - 1 ? "" : ",");
            }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    return 0;
}
