/* The model the runtime holds (mllama.h): one shard (shard.h; a whole
 * model is the shard of world 1, and a shard of a group may be driven by
 * hand), or a tensor-parallel model driven as one model (ml_model_load_tp,
 * engine/model/README.md §11): `world` shards, the threads that drive ranks
 * 1.., and the per-rank memory behind the single handles its callers hold
 * (the K/V cache, image states, adapter slots), so that the runtime serves
 * a model split over several devices without knowing ranks.
 *
 * A call is posted to every rank under one mutex: the caller stores it,
 * bumps `posted` and wakes the threads, runs rank 0 itself, then waits
 * until the threads are done. The shards' collectives (all_reduce_sum)
 * meet inside the call. Each rank translates the call's handles into its
 * own memory in scratch sized at load, so a call allocates nothing.
 *
 * An image state of a model of world > 1 is a host array of world backend
 * buffers, buffer r in rank r's backend; of a model that is not tensor
 * parallel, the backend buffer itself. An adapter slot of a model of world
 * above 1 (lora.c) holds rank r's slot in parts[r]: a step's or an
 * encode's adapter reaches each rank as that rank's slot.
 *
 * This is the only file that tells a split model from a whole one: the
 * public calls below (encode, forward, adapter slots, K/V cache, image
 * states) run a whole model's shard directly and post to the ranks
 * otherwise, so vision.c, text.c and lora.c compute one shard only.
 *
 * @locality: ml_model_load_tp, the public calls and the memory functions run on the
 * thread that drives the model; rank r >= 1 runs on its own thread, only
 * between a post and the end of that call. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora_internal.h"
#include "model/memory_plan.h"
#include "model/model_internal.h"
#include "model/shard.h"

/* The ranks of a tensor-parallel model and their threads (below). */
typedef struct ml_tp ml_tp;

/* The model the callers hold. Its configuration, limits and geometry are
 * its first shard's: rank 0's of a tensor-parallel model. */
struct ml_model {
    ml_shard *shard; /* owned without tp; with tp, rank 0's, owned by tp */
    ml_tp *tp;       /* owned: the ranks of a tensor-parallel model, else NULL */
};

/* Room for one shard's error message. */
#define TP_ERR_MAX 512

typedef enum tp_op {
    TP_LOAD,
    TP_ENCODE,
    TP_FORWARD,
    TP_STOP, /* the threads return */
} tp_op;

/* One call's arguments, borrowed from the caller for the call. */
typedef struct tp_call {
    tp_op op;
    /* TP_LOAD */
    const char *dir;
    const ml_model_limits *limits;  /* NULL = the defaults */
    /* TP_ENCODE */
    const float *pixels;
    int aspect_ratio_id;
    const uint8_t *aspect_ratio_mask;
    const ml_lora *lora;            /* NULL = the base model */
    void *const *state;             /* (world) the image state's buffers */
    const ml_vision_taps *vision_taps;
    /* TP_FORWARD */
    ml_kv_cache *kv;
    const ml_step_seq *seqs;        /* (n_seqs) image states and adapters are handles */
    int n_seqs;
    float *logits;
    const ml_text_taps *text_taps;
} tp_call;

typedef struct tp_rank {
    ml_tp *tp;                /* borrowed: the group it belongs to */
    int rank;
    ml_shard *shard;          /* owned */
    pthread_t thread;         /* ranks >= 1 */
    ml_step_seq *seqs;        /* owned (max_step_seqs): the step with this rank's image states
                                 and adapter slots (and, ranks >= 1, sample outputs in
                                 `sampled`) */
    ml_sample_out *sampled;   /* owned (max_step_seqs), ranks >= 1: their discarded tokens */
    const void **states;      /* owned (max_step_seqs, max_seq_images) */
    float *logits;            /* owned (max_logit_rows, vocab), ranks >= 1: their copy,
                                 identical to rank 0's and discarded */
    ml_status st;             /* the last call's result */
    char err[TP_ERR_MAX];
} tp_rank;

struct ml_tp {
    int world;
    int n_threads;            /* threads started: ranks 1 .. n_threads */
    ml_backend **bes;         /* owned array (world) of borrowed backends */
    tp_rank *ranks;           /* owned (world) */
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* a call was posted */
    pthread_cond_t done;      /* the threads finished the call */
    /* @locks lock: */
    uint64_t posted;          /* calls posted so far */
    int busy;                 /* threads still running the current call */
    tp_call call;             /* the current call */
};

/* ---- calls ---------------------------------------------------------------- */

/* The slot of rank r in adapter handle l, or NULL for the base model. */
static const ml_lora *rank_lora(const tp_rank *r, const ml_lora *l)
{
    return l ? l->parts[r->rank] : NULL;
}

/* The step of the call with rank r's buffer of every image state and rank
 * r's slot of every adapter: consecutive sequences with one adapter keep
 * one slot, so each shard groups them as the caller did. */
static const ml_step_seq *rank_step(tp_rank *r, const tp_call *c)
{
    int max_images = r->shard->limits.max_seq_images;
    for (int s = 0; s < c->n_seqs; s++) {
        const ml_step_seq *q = &c->seqs[s];
        const void **states = r->states + (size_t)s * max_images;
        for (int i = 0; i < q->n_images; i++)
            states[i] = ((void *const *)q->image_states[i])[r->rank];
        r->seqs[s] = *q;
        r->seqs[s].image_states = states;
        r->seqs[s].lora = rank_lora(r, q->lora);
        if (r->rank > 0)
            r->seqs[s].sampled = &r->sampled[s];
    }
    return r->seqs;
}

/* Run call c on rank r's shard; the result goes to r->st and r->err. Only
 * rank 0 writes the caller's outputs (logits, taps): the others compute
 * the same values into their own scratch. */
static void run_rank(tp_rank *r, const tp_call *c)
{
    ml_tp *tp = r->tp;
    int first = r->rank == 0;
    r->err[0] = '\0';
    switch (c->op) {
    case TP_LOAD:
        r->st = ml_shard_load(&r->shard, c->dir, tp->bes[r->rank], c->limits, r->rank,
                              tp->world, r->err, sizeof r->err);
        break;
    case TP_ENCODE:
        r->st = ml_shard_encode_image(r->shard, c->pixels, c->aspect_ratio_id,
                                      c->aspect_ratio_mask, rank_lora(r, c->lora),
                                      c->state[r->rank],
                                      first ? c->vision_taps : NULL, r->err, sizeof r->err);
        break;
    case TP_FORWARD:
        r->st = ml_shard_forward(r->shard, c->kv, rank_step(r, c), c->n_seqs,
                                 first ? c->logits : r->logits, first ? c->text_taps : NULL,
                                 r->err, sizeof r->err);
        break;
    case TP_STOP:
        r->st = ML_OK;
        break;
    }
}

/* Hand c to every thread. */
static void post(ml_tp *tp, const tp_call *c)
{
    pthread_mutex_lock(&tp->lock);
    tp->call = *c;
    tp->busy = c->op == TP_STOP ? 0 : tp->n_threads;
    tp->posted++;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->lock);
}

/* A thread of ranks 1..: runs every call posted until TP_STOP. */
static void *rank_main(void *arg)
{
    tp_rank *r = arg;
    ml_tp *tp = r->tp;
    uint64_t seen = 0; /* threads start before the first post */
    for (;;) {
        pthread_mutex_lock(&tp->lock);
        while (tp->posted == seen)
            pthread_cond_wait(&tp->wake, &tp->lock);
        seen = tp->posted;
        tp_call c = tp->call;
        pthread_mutex_unlock(&tp->lock);
        if (c.op == TP_STOP)
            return NULL;
        run_rank(r, &c);
        pthread_mutex_lock(&tp->lock);
        if (--tp->busy == 0)
            pthread_cond_signal(&tp->done);
        pthread_mutex_unlock(&tp->lock);
    }
}

/* Run c on every rank and wait for all. Returns ML_OK or the error of the
 * lowest failing rank (its rank named unless it is 0). */
static ml_status run_all(ml_tp *tp, const tp_call *c, char *err, size_t errlen)
{
    post(tp, c);
    run_rank(&tp->ranks[0], c);
    pthread_mutex_lock(&tp->lock);
    while (tp->busy > 0)
        pthread_cond_wait(&tp->done, &tp->lock);
    pthread_mutex_unlock(&tp->lock);
    for (int r = 0; r < tp->world; r++) {
        const tp_rank *k = &tp->ranks[r];
        if (k->st == ML_OK)
            continue;
        if (r == 0)
            return ml_fail(err, errlen, k->st, "%s", k->err);
        return ml_fail(err, errlen, k->st, "rank %d of %d: %s", r, tp->world, k->err);
    }
    return ML_OK;
}

static ml_status tp_encode_image(const ml_model *m, const float *pixels, int aspect_ratio_id,
                                 const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                 void *state, const ml_vision_taps *taps, char *err,
                                 size_t errlen)
{
    /* A slot of this model is a handle with a part per rank (lora.c). */
    ml_tp *tp = m->tp;
    if (lora && lora->model != m)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "encode: the adapter slot belongs to another model");
    if (!state)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "encode: no image state");
    tp_call c = {.op = TP_ENCODE, .pixels = pixels, .aspect_ratio_id = aspect_ratio_id,
                 .aspect_ratio_mask = aspect_ratio_mask, .lora = lora, .state = state,
                 .vision_taps = taps};
    return run_all(tp, &c, err, errlen);
}

static ml_status tp_forward(const ml_model *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                            float *logits, const ml_text_taps *taps, char *err, size_t errlen)
{
    /* What rank_step relies on is checked here, before any rank runs; the
     * shards check the rest, each the same way. */
    ml_tp *tp = m->tp;
    const ml_model_limits *l = &tp->ranks[0].shard->limits;
    if (n_seqs <= 0 || n_seqs > l->max_step_seqs)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "step: %d sequences, limit %d", n_seqs,
                       l->max_step_seqs);
    if (ml_kv_cache_world(kv) != tp->world)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "step: a kv cache of %d ranks for a model of %d (ml_model_kv_cache_create)",
                       ml_kv_cache_world(kv), tp->world);
    for (int s = 0; s < n_seqs; s++) {
        const ml_step_seq *q = &seqs[s];
        if (q->lora && q->lora->model != m)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d has an adapter slot of another model", s);
        if (q->n_images < 0 || q->n_images > l->max_seq_images)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "step: sequence %d has %d images, limit %d", s, q->n_images,
                           l->max_seq_images);
        for (int i = 0; i < q->n_images; i++)
            if (!q->image_states || !q->image_states[i])
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "step: sequence %d lacks image state %d", s, i);
    }
    tp_call c = {.op = TP_FORWARD, .kv = kv, .seqs = seqs, .n_seqs = n_seqs, .logits = logits,
                 .text_taps = taps};
    return run_all(tp, &c, err, errlen);
}

/* ---- the public calls: a whole model directly, a split one through its ranks --- */

ml_status ml_model_encode_image(ml_model *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen)
{
    if (!m->tp)
        return ml_shard_encode_image(m->shard, pixels, aspect_ratio_id, aspect_ratio_mask, lora,
                                     state, taps, err, errlen);
    return tp_encode_image(m, pixels, aspect_ratio_id, aspect_ratio_mask, lora, state, taps,
                           err, errlen);
}

ml_status ml_model_forward(ml_model *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen)
{
    if (!m->tp)
        return ml_shard_forward(m->shard, kv, seqs, n_seqs, logits, taps, err, errlen);
    return tp_forward(m, kv, seqs, n_seqs, logits, taps, err, errlen);
}

size_t ml_lora_slot_bytes(const ml_model *m, int max_rank)
{
    return ml_lora_shard_bytes(m->shard, max_rank);
}

ml_status ml_lora_create(ml_lora **out, ml_model *m, int max_rank, char *err, size_t errlen)
{
    if (!m->tp)
        return ml_lora_slot_create(out, m, &m->shard, 1, max_rank, err, errlen);
    *out = NULL;
    ml_shard **shards = malloc((size_t)m->tp->world * sizeof *shards);
    if (!shards)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "adapter slot: out of memory");
    for (int r = 0; r < m->tp->world; r++)
        shards[r] = m->tp->ranks[r].shard;
    ml_status st = ml_lora_slot_create(out, m, shards, m->tp->world, max_rank, err, errlen);
    free(shards);
    return st;
}

/* ---- load / destroy ----------------------------------------------------------- */

/* Join the threads and destroy the shards. NULL is a no-op. */
static void tp_destroy(ml_tp *tp)
{
    if (!tp)
        return;
    if (tp->n_threads > 0) {
        tp_call stop = {.op = TP_STOP};
        post(tp, &stop);
        for (int r = 1; r <= tp->n_threads; r++)
            pthread_join(tp->ranks[r].thread, NULL);
    }
    for (int r = 0; r < tp->world; r++) {
        tp_rank *k = &tp->ranks[r];
        ml_shard_destroy(k->shard);
        free(k->seqs);
        free(k->states);
        free(k->logits);
        free(k->sampled);
    }
    pthread_cond_destroy(&tp->done);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->lock);
    free(tp->ranks);
    free(tp->bes);
    free(tp);
}

/* The group and its threads, no shard yet. */
static ml_status tp_create(ml_tp **out, ml_backend *const *bes, int world, char *err,
                           size_t errlen)
{
    *out = NULL;
    ml_tp *tp = calloc(1, sizeof *tp);
    if (!tp)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "tensor parallel: out of memory");
    if (pthread_mutex_init(&tp->lock, NULL) != 0) {
        free(tp);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "tensor parallel: cannot create a mutex");
    }
    if (pthread_cond_init(&tp->wake, NULL) != 0 || pthread_cond_init(&tp->done, NULL) != 0) {
        /* Destroying a condition variable that failed to initialise is
         * undefined: keep the one that did. */
        pthread_mutex_destroy(&tp->lock);
        free(tp);
        return ml_fail(err, errlen, ML_ERR_NOMEM,
                       "tensor parallel: cannot create a condition variable");
    }
    tp->bes = calloc((size_t)world, sizeof *tp->bes);
    tp->ranks = calloc((size_t)world, sizeof *tp->ranks);
    if (!tp->bes || !tp->ranks) {
        tp_destroy(tp); /* world 0: there are no ranks to visit */
        return ml_fail(err, errlen, ML_ERR_NOMEM, "tensor parallel: out of memory");
    }
    tp->world = world;
    for (int r = 0; r < world; r++) {
        tp->bes[r] = bes[r];
        tp->ranks[r] = (tp_rank){.tp = tp, .rank = r};
    }
    for (int r = 1; r < world; r++) {
        if (pthread_create(&tp->ranks[r].thread, NULL, rank_main, &tp->ranks[r]) != 0) {
            tp_destroy(tp);
            return ml_fail(err, errlen, ML_ERR_NOMEM,
                           "tensor parallel: cannot start the thread of rank %d", r);
        }
        tp->n_threads++;
    }
    *out = tp;
    return ML_OK;
}

/* Every rank's per-call scratch, sized by the load limits. */
static ml_status tp_alloc_scratch(ml_tp *tp, char *err, size_t errlen)
{
    const ml_shard *s0 = tp->ranks[0].shard;
    const ml_model_limits *l = &s0->limits;
    size_t seqs = (size_t)l->max_step_seqs;
    /* +1: max_seq_images may be 0, and malloc(0) may be NULL. */
    size_t states = seqs * (size_t)l->max_seq_images + 1;
    size_t logits = (size_t)l->max_logit_rows * (size_t)s0->cfg.text.vocab_size;
    for (int r = 0; r < tp->world; r++) {
        tp_rank *k = &tp->ranks[r];
        k->seqs = malloc(seqs * sizeof *k->seqs);
        k->states = malloc(states * sizeof *k->states);
        if (r > 0) {
            k->logits = malloc(logits * sizeof *k->logits);
            k->sampled = malloc(seqs * sizeof *k->sampled);
        }
        if (!k->seqs || !k->states || (r > 0 && (!k->logits || !k->sampled)))
            return ml_fail(err, errlen, ML_ERR_NOMEM,
                           "tensor parallel: out of memory for rank %d's step scratch", r);
    }
    return ML_OK;
}

/* A model over shard s (owned) or, with tp, over tp's ranks (s is rank 0's). */
static ml_status model_new(ml_model **out, ml_shard *s, ml_tp *tp, char *err, size_t errlen)
{
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        if (tp)
            tp_destroy(tp);
        else
            ml_shard_destroy(s);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "model: out of memory");
    }
    m->shard = s;
    m->tp = tp;
    *out = m;
    return ML_OK;
}

ml_status ml_model_load(ml_model **out, const char *dir, ml_backend *be,
                        const ml_model_limits *limits, char *err, size_t errlen)
{
    return ml_model_load_shard(out, dir, be, limits, 0, 1, err, errlen);
}

ml_status ml_model_load_shard(ml_model **out, const char *dir, ml_backend *be,
                              const ml_model_limits *limits, int rank, int world, char *err,
                              size_t errlen)
{
    *out = NULL;
    ml_shard *s;
    ml_status st = ml_shard_load(&s, dir, be, limits, rank, world, err, errlen);
    return st == ML_OK ? model_new(out, s, NULL, err, errlen) : st;
}

ml_status ml_model_load_tp(ml_model **out, const char *dir, ml_backend *const *bes, int world,
                           const ml_model_limits *limits, char *err, size_t errlen)
{
    *out = NULL;
    if (world < 1)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "tensor parallel: world %d (at least 1)", world);
    if (world == 1)
        return ml_model_load(out, dir, bes[0], limits, err, errlen);
    /* A backend given twice would wait for itself at the first all-reduce. */
    for (int r = 0; r < world; r++)
        for (int q = 0; q < r; q++)
            if (bes[q] == bes[r])
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "tensor parallel: ranks %d and %d share one backend", q, r);
    ml_tp *tp;
    ml_status st = tp_create(&tp, bes, world, err, errlen);
    if (st != ML_OK)
        return st;
    tp_call load = {.op = TP_LOAD, .dir = dir, .limits = limits};
    st = run_all(tp, &load, err, errlen);
    if (st == ML_OK)
        st = tp_alloc_scratch(tp, err, errlen);
    if (st != ML_OK) {
        tp_destroy(tp);
        return st;
    }
    return model_new(out, tp->ranks[0].shard, tp, err, errlen);
}

void ml_model_destroy(ml_model *m)
{
    if (!m)
        return;
    if (m->tp)
        tp_destroy(m->tp);
    else
        ml_shard_destroy(m->shard);
    free(m);
}

const ml_config *ml_model_config(const ml_model *m) { return &m->shard->cfg; }
ml_backend *ml_model_backend(const ml_model *m) { return m->shard->be; }
const ml_model_limits *ml_model_limits_of(const ml_model *m) { return &m->shard->limits; }
int ml_model_world(const ml_model *m) { return m->shard->dims.world; }
int ml_model_kv_heads(const ml_model *m) { return m->shard->dims.n_kv_heads; }

/* ---- memory behind one handle ------------------------------------------------- */

size_t ml_model_kv_block_bytes(const ml_model *m)
{
    const ml_shard *s = m->shard;
    return (size_t)ml_memory_plan_kv_block_bytes(&s->cfg, s->dims.world, s->limits.kv_block_size,
                                                 s->be->ops->kv_elem_size);
}

ml_status ml_model_kv_cache_create(ml_kv_cache **out, const ml_model *m, int n_blocks,
                                   char *err, size_t errlen)
{
    *out = NULL;
    const ml_shard *s = m->shard;
    const ml_text_config *tc = &s->cfg.text;
    if (!m->tp && s->dims.world > 1)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "kv cache: shard %d of %d driven by hand shares its group's cache "
                       "(ml_kv_cache_create_group)",
                       s->dims.rank, s->dims.world);
    ml_backend *const *bes = m->tp ? m->tp->bes : &s->be;
    int world = m->tp ? m->tp->world : 1;
    return ml_kv_cache_create_group(out, bes, world,
                                    tc->num_hidden_layers - tc->n_cross_layers, n_blocks,
                                    s->limits.kv_block_size, s->dims.n_kv_heads, tc->head_dim,
                                    err, errlen);
}

size_t ml_model_image_state_bytes(const ml_model *m)
{
    return ml_shard_image_state_bytes(m->shard);
}

void *ml_model_image_state_alloc(ml_model *m)
{
    size_t bytes = ml_model_image_state_bytes(m);
    if (!m->tp)
        return m->shard->be->ops->alloc(m->shard->be, bytes);
    void **parts = calloc((size_t)m->tp->world, sizeof *parts);
    if (!parts)
        return NULL;
    for (int r = 0; r < m->tp->world; r++) {
        ml_backend *be = m->tp->bes[r];
        if (!(parts[r] = be->ops->alloc(be, bytes))) {
            ml_model_image_state_free(m, parts);
            return NULL;
        }
    }
    return parts;
}

void ml_model_image_state_free(ml_model *m, void *state)
{
    if (!state)
        return;
    if (!m->tp) {
        m->shard->be->ops->free(m->shard->be, state);
        return;
    }
    void **parts = state;
    for (int r = 0; r < m->tp->world; r++)
        if (parts[r])
            m->tp->bes[r]->ops->free(m->tp->bes[r], parts[r]);
    free(parts);
}

ml_status ml_model_memory_plan(const ml_model *m, ml_memory_plan_spec *spec, ml_memory_plan *out,
                               char *err, size_t errlen)
{
    /* Every shard carves the same workspace: the first stands for each. */
    const ml_shard *s = m->shard;
    spec->world = s->dims.world;
    spec->workspace_bytes = s->workspace_bytes;
    spec->kv_elem_size = s->be->ops->kv_elem_size;
    spec->kv_block_size = s->limits.kv_block_size;
    return ml_memory_plan_compute(&s->cfg, spec, out, err, errlen);
}
