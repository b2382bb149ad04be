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

/* A grammar_on_brace answer's course: undecided while it is only
 * whitespace, bound once a '{' began the document, free once anything else
 * began prose. Without grammar_on_brace a constraint is bound from the
 * start. */
typedef enum constraint_phase {
    PHASE_BOUND,
    PHASE_UNDECIDED,
    PHASE_FREE,
} constraint_phase;

struct ml_constraint {
    constraint_kind kind;
    constraint_phase phase;
    const ml_json_vocab *vocab; /* borrowed: the prose and blank tokens */
    ml_json_state *json;       /* owned; CONSTRAINT_JSON */
    ml_grammar_state *grammar; /* owned (it holds the grammar's reference); CONSTRAINT_GRAMMAR */
    int32_t stop_ids[ML_SAMPLER_MAX_STOP_IDS];
    size_t n_stop_ids;
    uint64_t *mask;            /* owned (words) */
    size_t words;
    size_t n_allowed;          /* grammar tokens the last mask allows */
    bool fresh;                /* mask is the current position's (ml_constraint_ended made it) */
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
        (p->grammar_on_brace && !p->grammar) || p->n_stop_ids > ML_SAMPLER_MAX_STOP_IDS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "constraint: needs exactly one of json_object and grammar "
                       "(grammar_on_brace with a grammar)");
    ml_constraint *c = calloc(1, sizeof *c);
    if (!c)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "constraint: out of memory");
    c->kind = p->json_object ? CONSTRAINT_JSON : CONSTRAINT_GRAMMAR;
    c->phase = p->grammar_on_brace ? PHASE_UNDECIDED : PHASE_BOUND;
    c->vocab = v;
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

/* Whether the answer may end here: a complete document, or, before a
 * document began, any answer (blank so far, or prose). */
static bool constraint_complete(const ml_constraint *c)
{
    if (c->phase != PHASE_BOUND)
        return true;
    return c->kind == CONSTRAINT_JSON ? ml_json_state_complete(c->json)
                                      : ml_grammar_state_complete(c->grammar);
}

/* The mask of the next token into c->mask (the mask thread's work, or the
 * step thread's when no mask is queued). */
static void constraint_compute(ml_constraint *c)
{
    if (c->phase == PHASE_FREE) {
        /* Every logit: a free answer's sampling is unconstrained. */
        size_t n_vocab = ml_json_vocab_n_vocab(c->vocab);
        memset(c->mask, 0xff, c->words * sizeof *c->mask);
        if (n_vocab % 64)
            c->mask[c->words - 1] = (1ull << (n_vocab % 64)) - 1;
        c->n_allowed = n_vocab;
        return;
    }
    if (c->kind == CONSTRAINT_JSON) {
        ml_json_state_allowed(c->json, c->mask);
        c->n_allowed = 1; /* not counted: a JSON mode sequence ends when complete */
    } else {
        c->n_allowed = ml_grammar_state_allowed(c->grammar, c->mask);
    }
    if (c->phase == PHASE_UNDECIDED) {
        /* The document's first tokens (whitespace, '{'...) or prose. */
        const uint64_t *prose = ml_json_vocab_prose(c->vocab);
        for (size_t w = 0; w < c->words; w++)
            c->mask[w] |= prose[w];
    }
    if (constraint_complete(c))
        for (size_t i = 0; i < c->n_stop_ids; i++) {
            uint32_t id = (uint32_t)c->stop_ids[i];
            if (id / 64 < c->words)
                c->mask[id / 64] |= 1ull << (id % 64);
        }
}

ml_status ml_constraint_accept(ml_constraint *c, int32_t token, char *err, size_t errlen)
{
    assert(!c->pending);
    c->fresh = false;
    if (c->phase == PHASE_FREE)
        return ML_OK;
    if (c->phase == PHASE_UNDECIDED) {
        const uint64_t *prose = ml_json_vocab_prose(c->vocab);
        if (prose[(uint32_t)token / 64] >> ((uint32_t)token % 64) & 1) {
            c->phase = PHASE_FREE;
            return ML_OK;
        }
        if (!ml_json_vocab_blank(c->vocab, token))
            c->phase = PHASE_BOUND;
    }
    if (c->kind == CONSTRAINT_JSON)
        return ml_json_state_accept(c->json, token, err, errlen);
    return ml_grammar_state_accept(c->grammar, token, err, errlen);
}

int ml_constraint_ended(ml_constraint *c)
{
    assert(!c->pending);
    if (c->phase != PHASE_BOUND)
        return 0; /* prose, or nothing yet: the answer ends with a stop id */
    if (c->kind == CONSTRAINT_JSON || !constraint_complete(c))
        return constraint_complete(c);
    /* A complete document may go on (a top-level number, say): the mask
     * says, computed here on the step thread, only while the document is
     * complete; the next step uses it as is. */
    if (!c->fresh)
        constraint_compute(c);
    c->fresh = true;
    return c->n_allowed == 0;
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
    if (c->fresh)
        return; /* computed by ml_constraint_ended since the last token */
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
