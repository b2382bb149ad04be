/* Decode graphs (text.c ml_model_forward) against op-by-op execution on the
 * CPU: one golden fixture model is loaded twice, decode_graphs 1 ("graph")
 * and 0 ("eager"), each with its own K/V cache and image states, and both
 * run the same steps, each fed its own token (our argmax of its logits, or
 * the model's ML_LOGITS_SAMPLE token: greedy for one sequence, every
 * filter and penalty for another, which the graph samples too; both under
 * a constraint mask that changes every step, which the model waits for
 * (mask_wait) and then applies in its sample op, after the replay). Every step's
 * logits must be bit-identical and its ids equal, not merely close: a
 * graph replays the very ops the eager path issues, over the batch padded
 * to its bucket, and no CPU op mixes rows of different sequences or sums
 * in an order that depends on the batch size within the decode (GEMV)
 * regime. A padding row that leaked
 * into a real one, a stale pointer baked into a recording or a recording
 * replayed for the wrong kind of batch shows up as a changed bit.
 *
 * The sequences come from the fixture's one prompt row (two images with
 * text between): both images, each image alone, a shorter prompt, text
 * only, and one prefilled in two chunks. The steps change the batch so
 * that every graph slot is recorded and replayed with other sequences in
 * other positions (5 sequences: bucket 8; 4: bucket 4 exactly; 3; 1; a
 * text-only batch: the slot without images), with an eager step mixing a
 * prefill chunk and decode tokens in between. The row with both images
 * must also produce transformers' greedy tokens. Then both K/V caches are
 * replaced and everything is prefilled again: the graph model must record
 * anew against the new pools instead of replaying the old ones (freed: a
 * use-after-free under ASan). Last, the same on a tensor-parallel model of
 * 2 ranks (ml_model_load_tp on a CPU group), where each shard records its
 * own graphs around the all-reduces.
 *
 * Built with ML_TEST_CUDA (test_cuda_decode_graph, the CUDA builds) the same
 * runs on CUDA backends: CUDA graphs captured and replayed against eager
 * launches, and the 2 ranks a group of two devices joined by NCCL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "fixture_util.h"
#ifdef ML_TEST_CUDA
#include "mlk_backend.h"
#include "mlk_device.h"
#endif

/* Two images with text between, GQA, heads that split over 2 ranks. */
#define FIXTURE "m3_two_images_interleaved"
#define FIXTURE_IMAGES 2
/* Small blocks so that sequences span several, taken interleaved. */
#define KV_BLOCK 8
/* Decode tokens a sequence may take over the whole test. */
#define MAX_DECODE 24
/* max_step_seqs: 5 sequences pad to a bucket of 8, uncapped. */
#define MAX_SEQS 8
#define TP_WORLD 2

/* ---- the backends ---------------------------------------------------------------- */

#ifdef ML_TEST_CUDA
/* Per backend: the fixture model, its caches and workspaces, with room. */
#define CUDA_POOL_BYTES ((size_t)1 << 30)
static const char *const backend_kind = "cuda";

static ml_backend *backend_create(char *err, size_t errlen)
{
    return ml_backend_cuda_create(0, CUDA_POOL_BYTES, 0, err, errlen);
}

static ml_status group_create(ml_backend **out, char *err, size_t errlen)
{
    static const int devices[TP_WORLD] = {0, 1};
    return ml_backend_cuda_create_group(TP_WORLD, devices, CUDA_POOL_BYTES, 0, out, err, errlen);
}
#else
static const char *const backend_kind = "cpu";

static ml_backend *backend_create(char *err, size_t errlen)
{
    return ml_backend_cpu_create(2, err, errlen);
}

static ml_status group_create(ml_backend **out, char *err, size_t errlen)
{
    return ml_backend_cpu_create_group(TP_WORLD, 1, out, err, errlen);
}
#endif

/* ---- the sequences ------------------------------------------------------------- */

enum {
    SEQ_BOTH,       /* the fixture row: whole prompt, both images */
    SEQ_IMAGE0,     /* the prompt up to the second <|image|>, first image only */
    SEQ_IMAGE1,     /* whole prompt, second image only; sampled by the model, penalties */
    SEQ_SHORT,      /* a prefix of the prompt, both images */
    SEQ_TEXT,       /* whole prompt, no image state (n_images 0) */
    SEQ_TEXT_SHORT, /* the prompt's text before its first <|image|>, no image; greedy on the model */
    SEQ_CHUNKED,    /* both images, prefilled in two chunks */
    N_SEQS
};

/* How a sequence derives from the fixture row. */
typedef struct seq_spec {
    unsigned images; /* bit i: attends to fixture image i */
    int prefix;      /* prompt tokens kept; 0 = all */
    int first_chunk; /* tokens of the first prefill step; 0 = the whole prompt at once */
    int logits;      /* ML_LOGITS_LAST (its row; the test takes the argmax) or
                        ML_LOGITS_SAMPLE (the token only, the model's sample op) */
} seq_spec;

static const seq_spec SPECS[N_SEQS] = {
    [SEQ_BOTH] = {0x3, 0, 0, ML_LOGITS_LAST},
    [SEQ_IMAGE0] = {0x1, 15, 0, ML_LOGITS_LAST},
    [SEQ_IMAGE1] = {0x2, 0, 0, ML_LOGITS_SAMPLE},
    [SEQ_SHORT] = {0x3, 20, 0, ML_LOGITS_LAST},
    [SEQ_TEXT] = {0x0, 0, 0, ML_LOGITS_LAST},
    [SEQ_TEXT_SHORT] = {0x0, 9, 0, ML_LOGITS_SAMPLE},
    [SEQ_CHUNKED] = {0x3, 0, 13, ML_LOGITS_LAST},
};

/* The sampling controls of the ML_LOGITS_SAMPLE sequences: SEQ_TEXT_SHORT
 * greedy with logprobs, SEQ_IMAGE1 every filter and penalty at once. */
static ml_sample_row sample_controls(int s)
{
    if (s == SEQ_TEXT_SHORT)
        return (ml_sample_row){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                               .logprobs = 1, .n_top = 3};
    return (ml_sample_row){.temperature = 0.8f, .top_p = 0.9f, .min_p = 0.01f, .top_k = 40,
                           .repetition_penalty = 1.3f, .presence_penalty = 0.4f,
                           .frequency_penalty = 0.6f, .logprobs = 1, .n_top = 5};
}

/* Sequence `spec` of row 0 of src (the fixture prompt, steps MAX_DECODE)
 * as a prompt of one row: its prefix, the mask columns of its images (a
 * decode row repeats the last prompt row, as ml_fx_prompt_load does), the
 * reference greedy tokens (meaningful for SEQ_BOTH only). */
static void derive_seq(ml_fx_prompt *dst, const ml_fx_prompt *src, const seq_spec *spec)
{
    int T = src->T, src_nt = src->N * T;
    *dst = *src;
    dst->B = 1;
    dst->S = spec->prefix ? spec->prefix : src->S;
    dst->N = __builtin_popcount(spec->images);
    dst->ctx = dst->S + dst->steps;
    int nt = dst->N * T;
    dst->tokens = malloc((size_t)dst->ctx * sizeof *dst->tokens);
    dst->allowed = calloc((size_t)dst->ctx * (nt ? nt : 1), 1);
    dst->greedy = malloc((size_t)dst->steps * sizeof *dst->greedy);
    memcpy(dst->tokens, src->tokens, (size_t)dst->S * sizeof *dst->tokens);
    memcpy(dst->greedy, src->greedy, (size_t)dst->steps * sizeof *dst->greedy);
    for (int s = 0; s < dst->ctx; s++) {
        const uint8_t *row = src->allowed + (size_t)(s < dst->S ? s : dst->S - 1) * src_nt;
        uint8_t *out = dst->allowed + (size_t)s * nt;
        for (int i = 0; i < src->N; i++)
            if (spec->images >> i & 1) {
                memcpy(out, row + (size_t)i * T, (size_t)T);
                out += T;
            }
    }
}

/* ---- one model's run ----------------------------------------------------------- */

typedef struct side {
    ml_model *m;                          /* owned */
    ml_kv_cache *kv;                      /* owned */
    void *images[FIXTURE_IMAGES];         /* owned: the fixture's image states */
    void *seq_images[N_SEQS][FIXTURE_IMAGES]; /* borrowed from images: each sequence's, in order */
    ml_fx_prompt seqs[N_SEQS];            /* owned: each side writes the tokens it feeds */
    int blocks_per_seq;
    int32_t *tables;                      /* owned (N_SEQS, blocks_per_seq) */
    int pos[N_SEQS];                      /* tokens of each sequence in the cache */
    int32_t next[N_SEQS];                 /* its last token chosen: the token it feeds next */
    /* The sample op's inputs and outputs of each ML_LOGITS_SAMPLE sequence:
     * its penalty entries are the distinct ids fed so far (the prompt and
     * decode tokens) that have a logit, counted in the decode tokens. */
    ml_sample_row row[N_SEQS];
    int32_t *pen_id[N_SEQS];              /* owned (ctx) */
    uint32_t *pen_count[N_SEQS];          /* owned (ctx) */
    ml_sample_out sampled[N_SEQS];
    uint64_t *mask[N_SEQS];               /* owned (words): each sampled sequence's constraint */
    int mask_waits;                       /* mask_wait calls, one per masked sampled row and rank */
    float *logits;                        /* owned (MAX_SEQS, V): the last step's rows */
    int n_rows;                           /* rows of the last step in logits */
    int row_seq[MAX_SEQS];                /* the sequence of each of those rows */
} side;

/* A new K/V cache for sd (the old one destroyed first, so the new one may
 * reuse its memory), its blocks handed out round-robin so that every
 * sequence's table is scattered; every sequence starts over (pos 0). */
static ml_status side_new_cache(side *sd, char *err, size_t errlen)
{
    ml_kv_cache_destroy(sd->kv);
    sd->kv = NULL;
    ml_status st = ml_model_kv_cache_create(&sd->kv, sd->m, N_SEQS * sd->blocks_per_seq, err,
                                            errlen);
    if (st != ML_OK)
        return st;
    for (int i = 0; i < sd->blocks_per_seq; i++)
        for (int s = 0; s < N_SEQS; s++)
            sd->tables[s * sd->blocks_per_seq + i] = ml_kv_cache_alloc(sd->kv);
    memset(sd->pos, 0, sizeof sd->pos);
    return ML_OK;
}

static size_t mask_words(const ml_model *m)
{
    return ((size_t)ml_model_config(m)->text.vocab_size + 63) / 64;
}

/* Sequence s's constraint for its step after `fed` tokens, the same on
 * both sides: ids with (id * 37 + fed + s) % 3 != 0 (the raw best is
 * barred a third of the time). */
static void fill_mask(uint64_t *mask, size_t words, int V, int s, int fed)
{
    memset(mask, 0, words * sizeof *mask);
    for (int id = 0; id < V; id++)
        if ((id * 37 + fed + s) % 3 != 0)
            mask[id >> 6] |= 1ull << (id & 63);
}

/* Every rank of a tensor-parallel model waits, each on its own thread. */
static void count_mask_wait(void *ctx)
{
    __atomic_fetch_add(&((side *)ctx)->mask_waits, 1, __ATOMIC_RELAXED);
}

/* Take m (owned from now on, also on error), encode the fixture's images,
 * derive the sequences from src and make the K/V cache. On error the
 * caller still calls side_close. */
static ml_status side_open(side *sd, ml_model *m, ml_safetensors *ref, const ml_fx_prompt *src,
                           char *err, size_t errlen)
{
    memset(sd, 0, sizeof *sd);
    sd->m = m;
    ml_status st = ml_fx_encode_images(m, ref, sd->images, err, errlen);
    for (int s = 0; s < N_SEQS; s++) {
        derive_seq(&sd->seqs[s], src, &SPECS[s]);
        for (int i = 0, k = 0; i < FIXTURE_IMAGES; i++)
            if (SPECS[s].images >> i & 1)
                sd->seq_images[s][k++] = sd->images[i];
    }
    sd->blocks_per_seq = (src->ctx + KV_BLOCK - 1) / KV_BLOCK;
    sd->tables = malloc((size_t)N_SEQS * sd->blocks_per_seq * sizeof *sd->tables);
    sd->logits = malloc((size_t)MAX_SEQS * ml_model_config(m)->text.vocab_size * sizeof(float));
    for (int s = 0; s < N_SEQS; s++) {
        sd->pen_id[s] = malloc((size_t)src->ctx * sizeof *sd->pen_id[s]);
        sd->pen_count[s] = malloc((size_t)src->ctx * sizeof *sd->pen_count[s]);
        sd->mask[s] = malloc(mask_words(m) * sizeof *sd->mask[s]);
        if (!sd->pen_id[s] || !sd->pen_count[s] || !sd->mask[s])
            st = ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory");
    }
    if (st == ML_OK)
        st = side_new_cache(sd, err, errlen);
    return st;
}

static void side_close(side *sd)
{
    for (int s = 0; s < N_SEQS; s++)
        ml_fx_prompt_free(&sd->seqs[s]);
    for (int i = 0; i < FIXTURE_IMAGES; i++)
        ml_model_image_state_free(sd->m, sd->images[i]);
    ml_kv_cache_destroy(sd->kv);
    ml_model_destroy(sd->m);
    free(sd->tables);
    free(sd->logits);
    for (int s = 0; s < N_SEQS; s++) {
        free(sd->pen_id[s]);
        free(sd->pen_count[s]);
        free(sd->mask[s]);
    }
}

/* The controls and penalty entries of sequence s's sampled step over its
 * first `fed` tokens; u from a fixed function of (s, fed), the same on
 * both sides. */
static void stage_sample(side *sd, int s, int fed, ml_step_seq *q)
{
    const ml_fx_prompt *p = &sd->seqs[s];
    ml_sample_row *row = &sd->row[s];
    *row = sample_controls(s);
    row->u = (double)((uint32_t)(s * 7919 + fed * 104729) % 65536) / 65536.0;
    int n = 0, V = ml_model_config(sd->m)->text.vocab_size;
    for (int t = 0; t < fed; t++) {
        if (p->tokens[t] >= V) /* <|image|> has no logit */
            continue;
        int i = 0;
        while (i < n && sd->pen_id[s][i] != p->tokens[t])
            i++;
        if (i == n) {
            sd->pen_id[s][n] = p->tokens[t];
            sd->pen_count[s][n++] = 0;
        }
        sd->pen_count[s][i] += t >= p->S;
    }
    row->n_pen = n;
    q->sample = row;
    q->pen_id = sd->pen_id[s];
    q->pen_count = sd->pen_count[s];
    q->sampled = &sd->sampled[s];
    fill_mask(sd->mask[s], mask_words(sd->m), V, s, fed);
    q->mask = sd->mask[s];
    q->mask_wait = count_mask_wait;
    q->mask_ctx = sd;
}

/* Sequence s's share of its next step: the rest of its prompt (its first
 * chunk when it starts chunked), or one decode token, the token chosen
 * last; the last token's logits, or its sample into sampled[s]. */
static ml_step_seq step_input(side *sd, int s)
{
    ml_fx_prompt *p = &sd->seqs[s];
    int pos = sd->pos[s];
    ml_step_seq q = ml_fx_prefill_seq(p, 0, sd->tables + s * sd->blocks_per_seq,
                                      sd->seq_images[s]);
    if (pos >= p->S) {
        ml_fx_decode_seq_token(p, 0, pos - p->S, sd->next[s], &q);
    } else {
        int end = pos == 0 && SPECS[s].first_chunk ? SPECS[s].first_chunk : p->S;
        q.tokens += pos;
        q.n_tokens = end - pos;
        q.pos0 = pos;
        if (q.cross_allowed)
            q.cross_allowed += (size_t)pos * p->N * p->T;
    }
    q.logits = SPECS[s].logits;
    if (q.logits == ML_LOGITS_SAMPLE)
        stage_sample(sd, s, q.pos0 + q.n_tokens, &q);
    return q;
}

/* One forward step of sd over the sequences batch[0 .. n): the rows of
 * its ML_LOGITS_LAST sequences in sd->logits; positions and next tokens
 * advanced. */
static ml_status side_step(side *sd, const int *batch, int n, char *err, size_t errlen)
{
    ml_step_seq qs[MAX_SEQS] = {0};
    for (int i = 0; i < n; i++)
        qs[i] = step_input(sd, batch[i]);
    ml_status st = ml_model_forward(sd->m, sd->kv, qs, n, sd->logits, NULL, err, errlen);
    if (st != ML_OK)
        return st;
    int V = ml_model_config(sd->m)->text.vocab_size;
    sd->n_rows = 0;
    for (int i = 0; i < n; i++) {
        int s = batch[i];
        sd->pos[s] += qs[i].n_tokens;
        if (qs[i].logits == ML_LOGITS_SAMPLE)
            sd->next[s] = sd->sampled[s].chosen.id;
        if (qs[i].logits != ML_LOGITS_LAST)
            continue;
        sd->next[s] = ml_fx_argmax(sd->logits + (size_t)sd->n_rows * V, V);
        sd->row_seq[sd->n_rows++] = s;
    }
    return ML_OK;
}

/* ---- steps ----------------------------------------------------------------------- */

/* A step: the sequences of its batch in order. Each does what it is due
 * (step_input): the first step prefills them all. */
typedef struct step_plan {
    const char *what;
    int n;
    int seqs[MAX_SEQS];
} step_plan;

#define ALL_SEQS \
    {SEQ_BOTH, SEQ_IMAGE0, SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT, SEQ_TEXT_SHORT, SEQ_CHUNKED}

static const step_plan MAIN_PLAN[] = {
    {"prefill: every prompt, one chunked (eager)", N_SEQS, ALL_SEQS},
    {"5 sequences: bucket 8, records", 5, {SEQ_BOTH, SEQ_IMAGE0, SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT}},
    {"5 sequences: bucket 8, replays", 5, {SEQ_BOTH, SEQ_IMAGE0, SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT}},
    {"4 sequences: bucket 4 exactly", 4, {SEQ_BOTH, SEQ_IMAGE0, SEQ_TEXT, SEQ_TEXT_SHORT}},
    {"3 sequences: bucket 4, others", 3, {SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT_SHORT}},
    {"1 sequence with images", 1, {SEQ_IMAGE0}},
    {"1 other sequence with images", 1, {SEQ_SHORT}},
    {"1 text-only sequence", 1, {SEQ_TEXT}},
    {"2 text-only sequences: slot without images", 2, {SEQ_TEXT, SEQ_TEXT_SHORT}},
    {"2 text-only sequences swapped", 2, {SEQ_TEXT_SHORT, SEQ_TEXT}},
    {"2 sequences with images: bucket 2, other slot", 2, {SEQ_IMAGE1, SEQ_BOTH}},
    {"2 sequences, both sampled on the model", 2, {SEQ_TEXT_SHORT, SEQ_IMAGE1}},
    {"a prefill chunk among decode tokens (eager)", 3, {SEQ_BOTH, SEQ_CHUNKED, SEQ_TEXT}},
    {"5 sequences elsewhere: bucket 8 replayed", 5,
     {SEQ_TEXT_SHORT, SEQ_CHUNKED, SEQ_SHORT, SEQ_BOTH, SEQ_IMAGE1}},
    {"7 sequences: bucket 8, 1 padding row", N_SEQS, ALL_SEQS},
    {"4 sequences: bucket 4 replayed", 4, {SEQ_CHUNKED, SEQ_TEXT, SEQ_IMAGE0, SEQ_BOTH}},
};

/* After both caches were replaced: the slots recorded on the old ones. */
static const step_plan NEW_CACHE_PLAN[] = {
    {"prefill into the new caches (eager)", N_SEQS, ALL_SEQS},
    {"5 sequences: bucket 8", 5, {SEQ_BOTH, SEQ_IMAGE0, SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT}},
    {"2 text-only sequences", 2, {SEQ_TEXT, SEQ_TEXT_SHORT}},
    {"4 sequences: bucket 4", 4, {SEQ_BOTH, SEQ_IMAGE0, SEQ_TEXT, SEQ_TEXT_SHORT}},
    {"a prefill chunk among decode tokens (eager)", 2, {SEQ_CHUNKED, SEQ_BOTH}},
    {"1 sequence", 1, {SEQ_CHUNKED}},
    {"5 sequences: bucket 8 again", 5, {SEQ_CHUNKED, SEQ_SHORT, SEQ_BOTH, SEQ_IMAGE1, SEQ_TEXT}},
};

static const step_plan TP_PLAN[] = {
    {"prefill (eager)", N_SEQS, ALL_SEQS},
    {"5 sequences: bucket 8", 5, {SEQ_BOTH, SEQ_IMAGE0, SEQ_IMAGE1, SEQ_SHORT, SEQ_TEXT}},
    {"3 sequences: bucket 4", 3, {SEQ_BOTH, SEQ_TEXT, SEQ_IMAGE1}},
    {"2 text-only sequences", 2, {SEQ_TEXT, SEQ_TEXT_SHORT}},
    {"a prefill chunk among decode tokens (eager)", 2, {SEQ_CHUNKED, SEQ_BOTH}},
    {"5 sequences elsewhere: bucket 8 replayed", 5,
     {SEQ_CHUNKED, SEQ_TEXT_SHORT, SEQ_BOTH, SEQ_SHORT, SEQ_IMAGE0}},
};

/* Say where two logit arrays of n rows (row r: sequence row_seq[r]) first
 * differ and by how much. */
static void report_difference(const char *what, const float *got, const float *want, int n,
                              int V, const int *row_seq)
{
    size_t total = (size_t)n * V, first = total;
    double worst = 0;
    for (size_t i = 0; i < total; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            first = first < total ? first : i;
            worst = fmax(worst, fabs((double)got[i] - want[i]));
        }
    check(0,
          "%s: graph logits differ from eager: first at row %zu (sequence %d) column %zu "
          "(%.9g vs %.9g), max abs diff %.3g",
          what, first / V, row_seq[first / V], first % V, got[first], want[first], worst);
}

/* Run plan[0 .. n) on both sides, each step's logit rows bitwise compared
 * and every sequence's next token (the model's sample or our argmax) equal,
 * with the sampled logprobs bitwise;
 * SEQ_BOTH's against the fixture's greedy tokens. Stops at the first
 * forward error. */
static void run_plan(const char *part, side *graph, side *eager, const step_plan *plan, int n)
{
    int V = ml_model_config(graph->m)->text.vocab_size;
    const ml_fx_prompt *both = &graph->seqs[SEQ_BOTH];
    char err[512];
    for (int k = 0; k < n; k++) {
        const step_plan *p = &plan[k];
        int in_reach = 1, has_both = 0;
        for (int i = 0; i < p->n; i++) {
            int s = p->seqs[i];
            in_reach &= graph->pos[s] - graph->seqs[s].S < MAX_DECODE;
            has_both |= s == SEQ_BOTH;
        }
        check(in_reach, "%s: %s: the plan decodes past MAX_DECODE", part, p->what);
        if (!in_reach)
            return;
        ml_status st = side_step(graph, p->seqs, p->n, err, sizeof err);
        check(st == ML_OK, "%s: %s: graph step: %s", part, p->what, err);
        if (st == ML_OK)
            st = side_step(eager, p->seqs, p->n, err, sizeof err);
        check(st == ML_OK, "%s: %s: eager step: %s", part, p->what, err);
        if (st != ML_OK)
            return;
        int rows = graph->n_rows, same = rows == eager->n_rows;
        same = same && memcmp(graph->logits, eager->logits, (size_t)rows * V * sizeof(float)) == 0;
        fprintf(stderr, "  %-10s %-48s %d logit rows %s\n", part, p->what, rows,
                same ? "bitwise equal" : "DIFFER");
        if (!same)
            report_difference(p->what, graph->logits, eager->logits, rows, V, graph->row_seq);
        int n_sampled = 0;
        for (int i = 0; i < p->n; i++)
            n_sampled += SPECS[p->seqs[i]].logits == ML_LOGITS_SAMPLE;
        check(graph->mask_waits == n_sampled * ml_model_world(graph->m) &&
                  eager->mask_waits == graph->mask_waits,
              "%s: %s: the model waited for each of the %d masks (%d, %d)", part, p->what,
              n_sampled, graph->mask_waits, eager->mask_waits);
        graph->mask_waits = eager->mask_waits = 0;
        for (int i = 0; i < p->n; i++) {
            int s = p->seqs[i];
            check(graph->next[s] == eager->next[s], "%s: %s: sequence %d: next token %d vs %d",
                  part, p->what, s, graph->next[s], eager->next[s]);
            if (SPECS[s].logits == ML_LOGITS_SAMPLE && graph->next[s] >= 0)
                check(graph->mask[s][graph->next[s] >> 6] >> (graph->next[s] & 63) & 1,
                      "%s: %s: sequence %d: sampled token %d is one its mask allows", part,
                      p->what, s, graph->next[s]);
            if (SPECS[s].logits == ML_LOGITS_SAMPLE)
                check(graph->next[s] >= 0 &&
                          memcmp(&graph->sampled[s], &eager->sampled[s],
                                 sizeof graph->sampled[s]) == 0,
                      "%s: %s: sequence %d: sampled token %d, logprobs differ from eager",
                      part, p->what, s, graph->next[s]);
        }
        int fed = graph->pos[SEQ_BOTH] - both->S; /* decode tokens before these logits */
        if (has_both && fed >= 0 && fed < both->steps)
            check(graph->next[SEQ_BOTH] == (int32_t)both->greedy[fed] &&
                      eager->next[SEQ_BOTH] == (int32_t)both->greedy[fed],
                  "%s: %s: greedy token %d: graph %d, eager %d, generate() %d", part, p->what,
                  fed, graph->next[SEQ_BOTH], eager->next[SEQ_BOTH], (int)both->greedy[fed]);
    }
}

/* ---- parts ----------------------------------------------------------------------- */

/* The fixture on `world` ranks (bes_graph, bes_eager: two groups, or one
 * plain backend each side twice for world 1), graph vs eager over `plan`;
 * with new_cache, then over NEW_CACHE_PLAN after replacing both caches. */
static void run_part(const char *part, const char *dir, ml_safetensors *ref,
                     const ml_fx_prompt *src, ml_backend *const *bes_graph,
                     ml_backend *const *bes_eager, int world, const step_plan *plan, int n_plan,
                     int new_cache)
{
    char err[512];
    ml_model_limits lim = ml_model_limits_default();
    lim.row_mask = ML_ROW_MASK_TRANSFORMERS; /* the fixtures are transformers 4.47's */
    lim.max_step_tokens = N_SEQS * src->S;
    lim.max_step_seqs = MAX_SEQS;
    lim.max_logit_rows = MAX_SEQS;
    lim.max_seq_images = src->N;
    lim.kv_block_size = KV_BLOCK;
    side graph, eager;
    ml_model *mg = NULL, *me = NULL;
    lim.decode_graphs = 1;
    ml_status st = ml_model_load_tp(&mg, dir, bes_graph, world, &lim, err, sizeof err);
    check(st == ML_OK, "%s: load (graphs): %s", part, err);
    lim.decode_graphs = 0;
    if (st == ML_OK)
        st = ml_model_load_tp(&me, dir, bes_eager, world, &lim, err, sizeof err);
    check(st == ML_OK, "%s: load (eager): %s", part, err);
    if (st != ML_OK) {
        ml_model_destroy(mg);
        return;
    }
    check(ml_model_limits_of(mg)->decode_graphs == 1 && ml_model_limits_of(me)->decode_graphs == 0,
          "%s: decode_graphs kept as loaded", part);
    st = side_open(&graph, mg, ref, src, err, sizeof err);
    check(st == ML_OK, "%s: graph side: %s", part, err);
    ml_status st2 = side_open(&eager, me, ref, src, err, sizeof err);
    check(st2 == ML_OK, "%s: eager side: %s", part, err);

    if (st == ML_OK && st2 == ML_OK) {
        run_plan(part, &graph, &eager, plan, n_plan);
        if (new_cache) {
            st = side_new_cache(&graph, err, sizeof err);
            check(st == ML_OK, "%s: new graph cache: %s", part, err);
            st2 = side_new_cache(&eager, err, sizeof err);
            check(st2 == ML_OK, "%s: new eager cache: %s", part, err);
            if (st == ML_OK && st2 == ML_OK)
                run_plan("new cache", &graph, &eager, NEW_CACHE_PLAN,
                         (int)(sizeof NEW_CACHE_PLAN / sizeof NEW_CACHE_PLAN[0]));
        }
    }
    side_close(&graph);
    side_close(&eager);
}

int main(void)
{
#ifdef ML_TEST_CUDA
    if (mlk_device_count() < TP_WORLD)
        ml_test_skip("fewer than 2 CUDA devices");
#endif
    char err[512];
    const char *dir = ML_FX_DIR "/" FIXTURE;
    const char *path = ML_FX_DIR "/" FIXTURE "/reference.safetensors";
    if (access(path, R_OK) != 0)
        ml_test_skip("no fixture model " FIXTURE " (tests/golden/fixtures/models)");
    ml_safetensors *ref;
    if (ml_safetensors_open(&ref, path, err, sizeof err) != ML_OK) {
        check(0, "%s", err);
        return check_done();
    }
    const ml_tensor_view *pix_v = ml_safetensors_find(ref, "pixel_values");
    int ready = pix_v && pix_v->shape[0] == 1 && pix_v->shape[1] == FIXTURE_IMAGES;
    check(ready, FIXTURE ": one row of %d images expected", FIXTURE_IMAGES);
    char cfg_path[1200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    ml_config cfg;
    ml_status st = ml_config_load(&cfg, cfg_path, err, sizeof err);
    check(st == ML_OK, "%s", err);
    ready &= st == ML_OK;
    ml_backend *be = backend_create(err, sizeof err);
    check(be != NULL, "%s backend: %s", backend_kind, err);
    ready &= be != NULL;
    ml_backend *group_graph[TP_WORLD] = {0}, *group_eager[TP_WORLD] = {0};
    st = group_create(group_graph, err, sizeof err);
    if (st == ML_OK)
        st = group_create(group_eager, err, sizeof err);
    check(st == ML_OK, "%s groups of %d: %s", backend_kind, TP_WORLD, err);
    ready &= st == ML_OK;

    if (ready) {
        ml_fx_prompt src;
        ml_fx_prompt_load(&src, ref, cfg.vision.max_num_tiles, MAX_DECODE);
        fprintf(stderr, "== %s: prompt of %d tokens, %d images of %d tiles\n", FIXTURE, src.S,
                src.N, src.T);
        check(src.tokens[SPECS[SEQ_TEXT_SHORT].prefix] == cfg.image_token_index &&
                  src.tokens[SPECS[SEQ_IMAGE0].prefix] == cfg.image_token_index,
              FIXTURE ": the prefixes of SPECS end before the first and second <|image|>");
        /* One backend for both models: only the graph model touches its graph slots. */
        run_part("one rank", dir, ref, &src, &be, &be, 1, MAIN_PLAN,
                 (int)(sizeof MAIN_PLAN / sizeof MAIN_PLAN[0]), 1);
        run_part("2 ranks", dir, ref, &src, group_graph, group_eager, TP_WORLD, TP_PLAN,
                 (int)(sizeof TP_PLAN / sizeof TP_PLAN[0]), 0);
        ml_fx_prompt_free(&src);
    }

    for (int r = 0; r < TP_WORLD; r++) {
        if (group_graph[r])
            group_graph[r]->ops->destroy(group_graph[r]);
        if (group_eager[r])
            group_eager[r]->ops->destroy(group_eager[r]);
    }
    if (be)
        be->ops->destroy(be);
    ml_safetensors_destroy(ref);
    return check_done();
}
