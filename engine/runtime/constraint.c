/* Structured outputs in the runtime (constraint.h): the dispatch between
 * JSON mode and a JSON Schema grammar, and the mask thread. */
#include "runtime/constraint.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

/* ---- a sequence's constraint ----------------------------------------------- */

typedef enum constraint_kind {
    CONSTRAINT_JSON,    /* JSON mode: any one object */
    CONSTRAINT_GRAMMAR, /* a compiled JSON Schema */
} constraint_kind;

struct ml_constraint {
    constraint_kind kind;
    ml_json_state *json;       /* owned; CONSTRAINT_JSON */
    ml_grammar_state *grammar; /* owned (it holds the grammar's reference); CONSTRAINT_GRAMMAR */
    int32_t stop_ids[ML_SAMPLER_MAX_STOP_IDS];
    size_t n_stop_ids;
    uint64_t *mask;            /* owned (words) */
    size_t words;
    /* The last mask allowed no grammar token (only ending). */
    bool no_continuation;
    /* Under the masker's lock: the mask is queued and not yet computed. */
    ml_masker *masker;         /* borrowed: the one it was last queued on */
    bool pending;
};

int ml_constraint_wanted(const ml_sampling_params *p)
{
    return p->json_object || p->grammar != NULL;
}

ml_status ml_constraint_create(const ml_sampling_params *p, const ml_json_vocab *v,
                               ml_constraint **out, char *err, size_t errlen)
{
    if (!p || !v || !out || !ml_constraint_wanted(p) || (p->json_object && p->grammar) ||
        p->n_stop_ids > ML_SAMPLER_MAX_STOP_IDS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "constraint: needs exactly one of json_object and grammar");
    ml_constraint *c = calloc(1, sizeof *c);
    if (!c)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "constraint: out of memory");
    c->kind = p->json_object ? CONSTRAINT_JSON : CONSTRAINT_GRAMMAR;
    c->words = ml_json_vocab_mask_words(v);
    c->mask = calloc(c->words, sizeof *c->mask);
    memcpy(c->stop_ids, p->stop_ids, p->n_stop_ids * sizeof *c->stop_ids);
    c->n_stop_ids = p->n_stop_ids;
    ml_status st = c->mask ? ML_OK : ml_fail(err, errlen, ML_ERR_NOMEM, "constraint: out of memory");
    if (st == ML_OK && c->kind == CONSTRAINT_JSON)
        st = ml_json_state_create(v, &c->json, err, errlen);
    else if (st == ML_OK)
        st = ml_grammar_state_create(p->grammar, v, &c->grammar, err, errlen);
    if (st != ML_OK) {
        ml_constraint_destroy(c);
        return st;
    }
    *out = c;
    return ML_OK;
}

void ml_constraint_destroy(ml_constraint *c)
{
    if (!c)
        return;
    assert(!c->pending);
    ml_json_state_destroy(c->json);
    ml_grammar_state_destroy(c->grammar);
    free(c->mask);
    free(c);
}

const uint64_t *ml_constraint_mask(const ml_constraint *c)
{
    return c->mask;
}

/* The mask of the next token into c->mask (the mask thread's work). */
static void constraint_compute(ml_constraint *c)
{
    bool complete;
    if (c->kind == CONSTRAINT_JSON) {
        ml_json_state_allowed(c->json, c->mask);
        complete = ml_json_state_complete(c->json);
        c->no_continuation = complete;
    } else {
        c->no_continuation = ml_grammar_state_allowed(c->grammar, c->mask) == 0;
        complete = ml_grammar_state_complete(c->grammar);
    }
    if (complete)
        for (size_t i = 0; i < c->n_stop_ids; i++) {
            uint32_t id = (uint32_t)c->stop_ids[i];
            if (id / 64 < c->words)
                c->mask[id / 64] |= 1ull << (id % 64);
        }
}

ml_status ml_constraint_accept(ml_constraint *c, int32_t token, char *err, size_t errlen)
{
    assert(!c->pending);
    if (c->kind == CONSTRAINT_JSON)
        return ml_json_state_accept(c->json, token, err, errlen);
    return ml_grammar_state_accept(c->grammar, token, err, errlen);
}

int ml_constraint_ended(const ml_constraint *c)
{
    if (c->kind == CONSTRAINT_JSON)
        return ml_json_state_complete(c->json);
    return c->no_continuation;
}

/* ---- the mask thread ------------------------------------------------------- */

struct ml_masker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work;  /* signalled: a constraint was queued, or stop */
    pthread_cond_t ready; /* broadcast: a mask is ready */
    ml_constraint **queue; /* owned (cap): FIFO of [head, n) */
    int cap, head, n;
    bool busy;            /* the thread is computing queue[head - 1] */
    bool stop;
};

static void *masker_main(void *arg)
{
    ml_masker *m = arg;
    pthread_mutex_lock(&m->lock);
    for (;;) {
        while (!m->stop && m->head == m->n)
            pthread_cond_wait(&m->work, &m->lock);
        if (m->head == m->n)
            break; /* stop, with nothing left */
        ml_constraint *c = m->queue[m->head++];
        m->busy = true;
        pthread_mutex_unlock(&m->lock);
        constraint_compute(c);
        pthread_mutex_lock(&m->lock);
        c->pending = false;
        m->busy = false;
        pthread_cond_broadcast(&m->ready);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

ml_status ml_masker_create(int cap, ml_masker **out, char *err, size_t errlen)
{
    ml_masker *m = calloc(1, sizeof *m);
    if (m)
        m->queue = calloc((size_t)(cap > 0 ? cap : 1), sizeof *m->queue);
    if (!m || !m->queue) {
        if (m)
            free(m);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "mask thread: out of memory");
    }
    m->cap = cap;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->work, NULL);
    pthread_cond_init(&m->ready, NULL);
    if (pthread_create(&m->thread, NULL, masker_main, m) != 0) {
        pthread_cond_destroy(&m->ready);
        pthread_cond_destroy(&m->work);
        pthread_mutex_destroy(&m->lock);
        free(m->queue);
        free(m);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "mask thread: cannot start it");
    }
    *out = m;
    return ML_OK;
}

void ml_masker_destroy(ml_masker *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    m->stop = true;
    pthread_cond_signal(&m->work);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->ready);
    pthread_cond_destroy(&m->work);
    pthread_mutex_destroy(&m->lock);
    free(m->queue);
    free(m);
}

void ml_masker_queue(ml_masker *m, ml_constraint *c)
{
    pthread_mutex_lock(&m->lock);
    assert(m->n < m->cap && !c->pending);
    c->masker = m;
    c->pending = true;
    m->queue[m->n++] = c;
    pthread_cond_signal(&m->work);
    pthread_mutex_unlock(&m->lock);
}

void ml_constraint_wait(void *arg)
{
    ml_constraint *c = arg;
    ml_masker *m = c->masker;
    if (!m)
        return; /* never queued: nothing in flight */
    pthread_mutex_lock(&m->lock);
    while (c->pending)
        pthread_cond_wait(&m->ready, &m->lock);
    pthread_mutex_unlock(&m->lock);
}

void ml_masker_drain(ml_masker *m)
{
    pthread_mutex_lock(&m->lock);
    while (m->head < m->n || m->busy)
        pthread_cond_wait(&m->ready, &m->lock);
    m->head = m->n = 0;
    pthread_mutex_unlock(&m->lock);
}
