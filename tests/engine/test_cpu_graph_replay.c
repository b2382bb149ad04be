/* The CPU backend's graph ops (backend.h graph_begin, graph_end,
 * graph_replay). A step that calls every op once or more (a toy decoder
 * layer, a cross-attention, a vision patch embedding) is recorded on one
 * set of buffer contents, the buffers are given new contents (new tokens,
 * positions, cache slots, block tables, image states, weights), and the
 * replay must equal the same step run eagerly on the new contents, bit for
 * bit, over every byte of backend memory the step touches. Also: recording
 * runs nothing, two replays are two steps, re-recording replaces a slot,
 * and host arguments (lora's segs, the attention params) are copied at
 * record time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu_graph_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

#define THREADS 2

/* ---- the step: every op of the table ----------------------------------------------- */

#define N_SEQS 2
#define N_TOK 3         /* decode rows of the step */
#define DIM 64
#define N_HEADS 4
#define N_KV 2
#define HEAD_DIM 16
#define QD (N_HEADS * HEAD_DIM)
#define KVD (N_KV * HEAD_DIM)
#define FFN 96
#define VOCAB 40
#define POS_PERIOD 2    /* rows of the add_bf16 table */
#define BLOCK 4
#define N_BLOCKS 6
#define MAX_BLOCKS 3    /* per sequence */
#define N_LORA 2        /* adapters of the lora op */
#define MAX_RANK 4
#define N_STATES 3      /* resident image states */
#define MAX_IMAGES 2
#define MAX_TILES 2
#define CHUNK 3
#define PLANE (MAX_TILES * CHUNK * KVD) /* floats of one K or V plane */
#define SIDE 28
#define PATCH 14
#define N_PATCH ((SIDE / PATCH) * (SIDE / PATCH))
#define PATCH_K (3 * PATCH * PATCH)
#define VIS_HEADS 2
#define VD (VIS_HEADS * HEAD_DIM)
#define N_PEN 8         /* penalty entries of the sample op, all rows */
#define STEP_ARENA_BYTES ((size_t)1 << 20)

typedef struct step_bufs {
    arena a;
    /* weights, bf16 */
    uint16_t *tok_table;        /* (VOCAB, DIM) */
    uint16_t *pos_table;        /* (POS_PERIOD, DIM) */
    uint16_t *norm_w, *ln_w, *ln_b; /* (DIM) */
    uint16_t *wq;               /* (QD, DIM); the Linears packed (LINEAR_ELEMS) */
    uint16_t *wk, *wv;          /* (KVD, DIM) */
    uint16_t *bk;               /* (KVD) */
    uint16_t *wo;               /* (DIM, QD) */
    uint16_t *wg, *wu;          /* (FFN, DIM) */
    uint16_t *wd;               /* (DIM, FFN) */
    uint16_t *w_out;            /* (VOCAB, DIM) */
    uint16_t *lora_a[N_LORA];   /* (MAX_RANK, DIM) */
    uint16_t *lora_b[N_LORA];   /* (QD, MAX_RANK) */
    uint16_t *w_patch;          /* (VD, PATCH_K) */
    /* per-step inputs */
    float *inv_freq;            /* (HEAD_DIM / 2) */
    int32_t *ids, *pos, *slot;  /* (N_TOK) */
    float *row_scale;           /* (N_TOK) */
    int32_t *block_table;       /* (N_SEQS, MAX_BLOCKS) */
    int32_t *seq_start;         /* (N_SEQS + 1) */
    int32_t *pos0;              /* (N_SEQS) */
    const void **state_table;   /* (N_SEQS, MAX_IMAGES) */
    int32_t *n_images;          /* (N_SEQS) */
    uint8_t *allowed;           /* (N_TOK, MAX_IMAGES * MAX_TILES) */
    float *pixels;              /* (1, 3, SIDE, SIDE) */
    uint8_t *valid;             /* (1, N_PATCH) */
    /* state and activations */
    float *k_cache, *v_cache;   /* (N_BLOCKS, BLOCK, N_KV, HEAD_DIM) */
    float *states[N_STATES];    /* K plane then V plane, each (MAX_TILES * CHUNK, N_KV, HEAD_DIM) */
    float *x, *h;               /* (N_TOK, DIM) */
    float *q, *att, *cross;     /* (N_TOK, QD) */
    float *k, *v;               /* (N_TOK, KVD) */
    float *lora_t;              /* (N_TOK, MAX_RANK) */
    float *g, *u;               /* (N_TOK, FFN) */
    float *xt;                  /* (DIM, N_TOK) */
    float *stored;              /* (DIM * N_TOK) */
    float *stored_keys;         /* x as N_TOK keys of N_KV heads, transposed */
    float *acc;                 /* (N_TOK, DIM): summed over steps */
    float *logits;              /* (N_TOK, VOCAB) */
    ml_sample_row *sample_rows; /* (N_TOK) */
    int32_t *pen_id;            /* (N_PEN) */
    uint32_t *pen_count;        /* (N_PEN) */
    ml_sample_out *sampled;     /* (N_TOK) */
    void *sample_scratch;       /* sample_scratch_bytes(N_TOK, VOCAB) */
    float *patches;             /* (N_PATCH, PATCH_K) */
    float *vis, *vis_out;       /* (N_PATCH, VD) */
} step_bufs;

static void step_bufs_init(step_bufs *b, ml_backend *be)
{
    b->a = arena_open(be, STEP_ARENA_BYTES);
    arena *a = &b->a;
#define BF16(n) carve(a, (size_t)(n) * sizeof(uint16_t))
#define F32(n) carve(a, (size_t)(n) * sizeof(float))
#define I32(n) carve(a, (size_t)(n) * sizeof(int32_t))
    b->tok_table = BF16(VOCAB * DIM);
    b->pos_table = BF16(POS_PERIOD * DIM);
    b->norm_w = BF16(DIM);
    b->ln_w = BF16(DIM);
    b->ln_b = BF16(DIM);
    b->wq = BF16(LINEAR_ELEMS(QD, DIM));
    b->wk = BF16(LINEAR_ELEMS(KVD, DIM));
    b->wv = BF16(LINEAR_ELEMS(KVD, DIM));
    b->bk = BF16(KVD);
    b->wo = BF16(LINEAR_ELEMS(DIM, QD));
    b->wg = BF16(LINEAR_ELEMS(FFN, DIM));
    b->wu = BF16(LINEAR_ELEMS(FFN, DIM));
    b->wd = BF16(LINEAR_ELEMS(DIM, FFN));
    b->w_out = BF16(LINEAR_ELEMS(VOCAB, DIM));
    for (int i = 0; i < N_LORA; i++) {
        b->lora_a[i] = BF16(MAX_RANK * DIM);
        b->lora_b[i] = BF16(QD * MAX_RANK);
    }
    b->w_patch = BF16(LINEAR_ELEMS(VD, PATCH_K));
    b->inv_freq = F32(HEAD_DIM / 2);
    b->ids = I32(N_TOK);
    b->pos = I32(N_TOK);
    b->slot = I32(N_TOK);
    b->row_scale = F32(N_TOK);
    b->block_table = I32(N_SEQS * MAX_BLOCKS);
    b->seq_start = I32(N_SEQS + 1);
    b->pos0 = I32(N_SEQS);
    b->state_table = carve(a, N_SEQS * MAX_IMAGES * sizeof(void *));
    b->n_images = I32(N_SEQS);
    b->allowed = carve(a, N_TOK * MAX_IMAGES * MAX_TILES);
    b->pixels = F32(3 * SIDE * SIDE);
    b->valid = carve(a, N_PATCH);
    b->k_cache = F32(N_BLOCKS * BLOCK * KVD);
    b->v_cache = F32(N_BLOCKS * BLOCK * KVD);
    for (int i = 0; i < N_STATES; i++)
        b->states[i] = F32(2 * PLANE);
    b->x = F32(N_TOK * DIM);
    b->h = F32(N_TOK * DIM);
    b->q = F32(N_TOK * QD);
    b->att = F32(N_TOK * QD);
    b->cross = F32(N_TOK * QD);
    b->k = F32(N_TOK * KVD);
    b->v = F32(N_TOK * KVD);
    b->lora_t = F32(N_TOK * MAX_RANK);
    b->g = F32(N_TOK * FFN);
    b->u = F32(N_TOK * FFN);
    b->xt = F32(DIM * N_TOK);
    b->stored = F32(DIM * N_TOK);
    b->stored_keys = F32(DIM * N_TOK);
    b->acc = F32(N_TOK * DIM);
    b->logits = F32(N_TOK * VOCAB);
    b->sample_rows = carve(a, N_TOK * sizeof *b->sample_rows);
    b->pen_id = I32(N_PEN);
    b->pen_count = carve(a, N_PEN * sizeof *b->pen_count);
    b->sampled = carve(a, N_TOK * sizeof *b->sampled);
    b->sample_scratch = carve(a, be->ops->sample_scratch_bytes(be, N_TOK, VOCAB));
    b->patches = F32(N_PATCH * PATCH_K);
    b->vis = F32(N_PATCH * VD);
    b->vis_out = F32(N_PATCH * VD);
#undef BF16
#undef F32
#undef I32
}

/* A host image of the whole arena for `seed`: random weights, activations,
 * caches and states, and a consistent random batch (sequence split, cache
 * lengths, block tables, images). */
static void step_image(const step_bufs *b, unsigned char *img, uint64_t seed)
{
    const arena *a = &b->a;
    rand_seed(0x9e3779b97f4a7c15ull * seed + 1);
    memset(img, 0, a->bytes);
#define H(p) host_of(a, img, (p))
    uint16_t *const bf[] = {b->tok_table, b->pos_table, b->norm_w, b->ln_w, b->ln_b, b->wq,
                            b->wk, b->wv, b->bk, b->wo, b->wg, b->wu, b->wd, b->w_out,
                            b->lora_a[0], b->lora_a[1], b->lora_b[0], b->lora_b[1], b->w_patch};
    /* Each bf16 buffer runs up to the next carved one: fill every one whole. */
    const size_t bf_n[] = {VOCAB * DIM, POS_PERIOD * DIM, DIM, DIM, DIM,
                           LINEAR_ELEMS(QD, DIM), LINEAR_ELEMS(KVD, DIM), LINEAR_ELEMS(KVD, DIM),
                           KVD, LINEAR_ELEMS(DIM, QD), LINEAR_ELEMS(FFN, DIM),
                           LINEAR_ELEMS(FFN, DIM), LINEAR_ELEMS(DIM, FFN),
                           LINEAR_ELEMS(VOCAB, DIM), MAX_RANK * DIM, MAX_RANK * DIM,
                           QD * MAX_RANK, QD * MAX_RANK, LINEAR_ELEMS(VD, PATCH_K)};
    for (size_t i = 0; i < sizeof bf / sizeof *bf; i++)
        fill_bf16(H(bf[i]), bf_n[i], -W_MAX, W_MAX);
    float *const f32[] = {b->row_scale, b->pixels, b->k_cache, b->v_cache, b->states[0],
                          b->states[1], b->states[2], b->x, b->h, b->q, b->att, b->cross,
                          b->k, b->v, b->lora_t, b->g, b->u, b->xt, b->stored,
                          b->stored_keys, b->acc, b->logits, b->patches, b->vis, b->vis_out};
    const size_t f32_n[] = {N_TOK, 3 * SIDE * SIDE, N_BLOCKS * BLOCK * KVD,
                            N_BLOCKS * BLOCK * KVD, 2 * PLANE, 2 * PLANE, 2 * PLANE,
                            N_TOK * DIM, N_TOK * DIM, N_TOK * QD, N_TOK * QD, N_TOK * QD,
                            N_TOK * KVD, N_TOK * KVD, N_TOK * MAX_RANK, N_TOK * FFN,
                            N_TOK * FFN, DIM * N_TOK, DIM * N_TOK, DIM * N_TOK, N_TOK * DIM,
                            N_TOK * VOCAB,
                            N_PATCH * PATCH_K, N_PATCH * VD, N_PATCH * VD};
    for (size_t i = 0; i < sizeof f32 / sizeof *f32; i++)
        fill(H(f32[i]), f32_n[i], -1, 1);

    float *inv_freq = H(b->inv_freq);
    for (int i = 0; i < HEAD_DIM / 2; i++)
        inv_freq[i] = powf(10000.0f + 1000.0f * (float)seed, -2.0f * (float)i / HEAD_DIM);
    int32_t *ids = H(b->ids), *pos = H(b->pos), *slot = H(b->slot);
    for (int t = 0; t < N_TOK; t++)
        ids[t] = irand(VOCAB);
    /* Sample rows: greedy with logprobs; every filter with a repetition
     * penalty; min-p with presence/frequency penalties. */
    ml_sample_row *rows = H(b->sample_rows);
    rows[0] = (ml_sample_row){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                              .logprobs = 1, .n_top = 3};
    rows[1] = (ml_sample_row){.temperature = 0.7f, .top_p = 0.9f, .top_k = 10,
                              .repetition_penalty = 1.2f, .logprobs = 1, .n_top = 2,
                              .pen_start = 0, .n_pen = 5};
    rows[2] = (ml_sample_row){.temperature = 1.5f, .top_p = 1.0f, .min_p = 0.05f,
                              .repetition_penalty = 1.0f, .presence_penalty = 0.5f,
                              .frequency_penalty = -0.3f, .pen_start = 5, .n_pen = N_PEN - 5};
    for (int t = 1; t < N_TOK; t++)
        rows[t].u = (double)frand(0.0f, 0.999f);
    int32_t *pen_id = H(b->pen_id);
    uint32_t *pen_count = H(b->pen_count);
    for (int i = 0; i < N_PEN; i++) {
        pen_id[i] = (i < 5 ? i : i - 5) * (VOCAB / 5) + irand(VOCAB / 5); /* distinct per row */
        pen_count[i] = (uint32_t)irand(3);
    }
    /* Sequence 0 has 1 or 2 of the tokens; each sequence its own blocks. */
    int32_t *seq_start = H(b->seq_start), *pos0 = H(b->pos0), *bt = H(b->block_table);
    seq_start[0] = 0;
    seq_start[1] = 1 + irand(2);
    seq_start[2] = N_TOK;
    int perm[N_BLOCKS];
    for (int i = 0; i < N_BLOCKS; i++)
        perm[i] = i;
    for (int i = N_BLOCKS - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0; s < N_SEQS; s++) {
        const int n = seq_start[s + 1] - seq_start[s];
        pos0[s] = irand(MAX_BLOCKS * BLOCK - n + 1);
        for (int i = 0; i < MAX_BLOCKS; i++)
            bt[s * MAX_BLOCKS + i] = perm[s * MAX_BLOCKS + i];
        for (int t = seq_start[s]; t < seq_start[s + 1]; t++) {
            pos[t] = pos0[s] + t - seq_start[s];
            slot[t] = bt[s * MAX_BLOCKS + pos[t] / BLOCK] * BLOCK + pos[t] % BLOCK;
        }
    }
    /* Cross-attention over the shared states: sequence 0 has 1 .. MAX_IMAGES
     * images, sequence 1 0 .. MAX_IMAGES (0: text only). */
    const void **table = H(b->state_table);
    int32_t *n_images = H(b->n_images);
    for (int s = 0; s < N_SEQS; s++) {
        n_images[s] = s == 0 ? 1 + irand(MAX_IMAGES) : irand(MAX_IMAGES + 1);
        for (int i = 0; i < MAX_IMAGES; i++)
            table[s * MAX_IMAGES + i] = b->states[irand(N_STATES)];
    }
    uint8_t *allowed = H(b->allowed), *valid = H(b->valid);
    for (int i = 0; i < N_TOK * MAX_IMAGES * MAX_TILES; i++)
        allowed[i] = (uint8_t)irand(2);
    for (int i = 0; i < N_PATCH; i++)
        valid[i] = (uint8_t)(i == 0 || irand(2));
#undef H
}

/* The step's scalars: variant 1 differs from 0 in a few of them, so that a
 * re-recorded slot is seen to replay the new recording. */
typedef struct step_scalars {
    float add_alpha, gate, lora_scale;
    int accumulate;
} step_scalars;

static const step_scalars STEP_VARIANTS[] = {
    {.add_alpha = 0.5f, .gate = 0.75f, .lora_scale = 0.5f, .accumulate = 1},
    {.add_alpha = -1.0f, .gate = 0.25f, .lora_scale = 2.0f, .accumulate = 0},
};

/* One step through be->ops: recorded while a graph is being recorded, run
 * otherwise. The host arguments (segments, params) are overwritten as soon
 * as each call returns, so a graph that kept a pointer to them would
 * replay garbage (and ASan would see the freed segments). */
static void step(ml_backend *be, const step_bufs *b, int variant)
{
    const ml_backend_ops *o = be->ops;
    const step_scalars *sc = &STEP_VARIANTS[variant];

    o->embed(be, b->x, b->tok_table, b->ids, N_TOK, DIM);
    o->add_bf16(be, b->x, b->pos_table, sc->add_alpha, N_TOK, POS_PERIOD, DIM);
    o->rmsnorm(be, b->h, b->x, b->norm_w, N_TOK, DIM, EPS);
    o->matmul(be, b->q, b->h, b->wq, NULL, N_TOK, DIM, QD, 0);

    ml_lora_segment *segs = xmalloc(N_LORA * sizeof *segs);
    segs[0] = (ml_lora_segment){.row_start = 0, .n_rows = 1, .rank = MAX_RANK,
                                .scale = sc->lora_scale, .a = b->lora_a[0], .b = b->lora_b[0]};
    segs[1] = (ml_lora_segment){.row_start = 1, .n_rows = N_TOK - 1, .rank = 2, .scale = 0.25f,
                                .a = b->lora_a[1], .b = b->lora_b[1]};
    o->lora(be, b->q, b->h, segs, N_LORA, DIM, QD, b->lora_t, MAX_RANK);
    memset(segs, 0xff, N_LORA * sizeof *segs);
    free(segs);

    o->matmul(be, b->k, b->h, b->wk, b->bk, N_TOK, DIM, KVD, 0);
    o->matmul(be, b->v, b->h, b->wv, NULL, N_TOK, DIM, KVD, 0);
    o->rope(be, b->q, b->pos, b->inv_freq, N_TOK, N_HEADS, HEAD_DIM);
    o->rope(be, b->k, b->pos, b->inv_freq, N_TOK, N_KV, HEAD_DIM);
    o->kv_write(be, b->k_cache, b->v_cache, b->k, b->v, b->slot, N_TOK, N_KV, HEAD_DIM);

    ml_attn_causal_params causal = {
        .out = b->att, .q = b->q, .k_cache = b->k_cache, .v_cache = b->v_cache,
        .block_table = b->block_table, .seq_start = b->seq_start, .pos0 = b->pos0,
        .n_seqs = N_SEQS, .max_blocks_per_seq = MAX_BLOCKS, .block_size = BLOCK,
        .n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = HEAD_DIM, .scale = 0.25f};
    o->attn_causal(be, &causal);
    memset(&causal, 0xff, sizeof causal);
    o->matmul(be, b->x, b->att, b->wo, NULL, N_TOK, QD, DIM, sc->accumulate);

    ml_attn_cross_params cross = {
        .out = b->cross, .q = b->q, .states = b->state_table,
        .k_offset = 0, .v_offset = PLANE * sizeof(float), .n_images = b->n_images,
        .seq_start = b->seq_start, .allowed = b->allowed, .n_seqs = N_SEQS, .n_tokens = N_TOK,
        .max_images = MAX_IMAGES, .max_tiles = MAX_TILES, .chunk_len = CHUNK,
        .n_heads = N_HEADS, .n_kv_heads = N_KV, .head_dim = HEAD_DIM, .scale = 0.25f};
    o->attn_cross(be, &cross);
    memset(&cross, 0xff, sizeof cross);
    o->add_rows(be, b->x, b->cross, b->row_scale, sc->gate, N_TOK, DIM);

    o->layernorm(be, b->h, b->x, b->ln_w, b->ln_b, N_TOK, DIM, EPS);
    o->matmul(be, b->g, b->h, b->wg, NULL, N_TOK, DIM, FFN, 0);
    o->matmul(be, b->u, b->h, b->wu, NULL, N_TOK, DIM, FFN, 0);
    o->gelu(be, b->u, (size_t)N_TOK * FFN);
    o->silu_mul(be, b->g, b->g, b->u, (size_t)N_TOK * FFN);
    o->matmul(be, b->x, b->g, b->wd, NULL, N_TOK, FFN, DIM, 1);

    o->copy_2d(be, b->xt, b->x, N_TOK, DIM, 1, N_TOK, DIM); /* transpose */
    o->kv_store(be, b->stored, b->xt, (size_t)DIM * N_TOK);
    o->kv_store_keys(be, b->stored_keys, b->x, N_TOK, N_KV, DIM / N_KV);
    o->zero(be, b->h, (size_t)N_TOK * DIM);
    o->add_rows(be, b->h, b->x, NULL, 1.0f, N_TOK, DIM);
    o->add_rows(be, b->acc, b->h, NULL, 1.0f, N_TOK, DIM);
    o->matmul(be, b->logits, b->h, b->w_out, NULL, N_TOK, DIM, VOCAB, 0);
    ml_sample_params sample = {.out = b->sampled, .logits = b->logits, .row = b->sample_rows,
                               .pen_id = b->pen_id, .pen_count = b->pen_count,
                               .scratch = b->sample_scratch, .rows = N_TOK, .vocab = VOCAB};
    o->sample(be, &sample);
    memset(&sample, 0xff, sizeof sample);

    o->patchify(be, b->patches, b->pixels, 1, SIDE, PATCH);
    o->matmul(be, b->vis, b->patches, b->w_patch, NULL, N_PATCH, PATCH_K, VD, 0);
    ml_attn_vision_params vision = {
        .out = b->vis_out, .q = b->vis, .k = b->vis, .v = b->vis, .valid = b->valid,
        .n_seq = 1, .seq_len = N_PATCH, .n_heads = VIS_HEADS, .head_dim = HEAD_DIM,
        .scale = 0.25f};
    o->attn_vision(be, &vision);
    memset(&vision, 0xff, sizeof vision);
}

/* The arena after `how` from image `in`: replay slot `slot` n times
 * (slot >= 0) or run variant `variant` eagerly n times (slot < 0). */
static void run_from(ml_backend *be, const step_bufs *b, const unsigned char *in,
                     unsigned char *out, int slot, int variant, int n)
{
    be->ops->upload(be, b->a.base, in, b->a.bytes);
    for (int i = 0; i < n; i++) {
        if (slot >= 0)
            be->ops->graph_replay(be, slot);
        else
            step(be, b, variant);
    }
    be->ops->download(be, out, b->a.base, b->a.bytes);
}

static void record(ml_backend *be, const step_bufs *b, int slot, int variant)
{
    be->ops->graph_begin(be, slot);
    step(be, b, variant);
    be->ops->graph_end(be, slot);
}

static void test_replay(void)
{
    char err[ERRLEN];
    ml_backend *be = ml_backend_cpu_create(THREADS, err, sizeof err);
    if (!be) {
        check(0, "cpu backend: %s", err);
        return;
    }
    const ml_backend_ops *eager = be->ops;
    check(eager->n_graph_slots == ML_GRAPH_SLOTS && eager->graph_begin && eager->graph_end &&
              eager->graph_replay,
          "graph ops present, %d slots", eager->n_graph_slots);
    step_bufs b;
    step_bufs_init(&b, be);
    const size_t n = b.a.bytes;
    unsigned char *img_rec = xmalloc(n), *img = xmalloc(n), *got = xmalloc(n),
                  *want = xmalloc(n), *first = xmalloc(n);
    step_image(&b, img_rec, SEED_RECORD);
    step_image(&b, img, SEED_REPLAY);

    /* Recording runs nothing. */
    be->ops->upload(be, b.a.base, img_rec, n);
    record(be, &b, 0, 0);
    check(be->ops == eager, "graph_end restores the op table");
    be->ops->download(be, got, b.a.base, n);
    check(memcmp(got, img_rec, n) == 0, "recording left backend memory unchanged");
    check_clean(be, "record");

    /* New contents of the same buffers: the replay reads them. */
    run_from(be, &b, img, got, 0, 0, 1);
    run_from(be, &b, img, want, -1, 0, 1);
    check(memcmp(got, want, n) == 0, "replay equals the eager step bit for bit");
    check(memcmp(got, img, n) != 0, "the replay wrote something");
    memcpy(first, got, n);

    run_from(be, &b, img, got, 0, 0, 2);
    run_from(be, &b, img, want, -1, 0, 2);
    check(memcmp(got, want, n) == 0, "two replays equal two eager steps");
    check(memcmp(got, first, n) != 0, "the second replay ran (acc accumulates)");

    /* Re-recording replaces the slot; another slot keeps its own graph. */
    record(be, &b, 0, 1);
    record(be, &b, 1, 0);
    run_from(be, &b, img, got, 0, 0, 1);
    run_from(be, &b, img, want, -1, 1, 1);
    check(memcmp(got, want, n) == 0, "a re-recorded slot replays the new step");
    check(memcmp(got, first, n) != 0, "the re-recorded step differs from the first");
    run_from(be, &b, img, got, 1, 0, 1);
    check(memcmp(got, first, n) == 0, "slot 1 replays its own recording");
    check_clean(be, "replays");

    /* The last slot, and an empty recording (a valid graph of no op). */
    record(be, &b, ML_GRAPH_SLOTS - 1, 0);
    run_from(be, &b, img, got, ML_GRAPH_SLOTS - 1, 0, 1);
    check(memcmp(got, first, n) == 0, "the last slot works");
    be->ops->graph_begin(be, 2);
    be->ops->graph_end(be, 2);
    run_from(be, &b, img, got, 2, 0, 1);
    check(memcmp(got, img, n) == 0, "an empty graph replays as nothing");
    check_clean(be, "empty graph");

    free(img_rec);
    free(img);
    free(got);
    free(want);
    free(first);
    be->ops->free(be, b.a.base);
    be->ops->destroy(be);
}

int main(void)
{
    test_replay();
    return check_done();
}
