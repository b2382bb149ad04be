/* Cancels: the table of pending cancels (worker_internal.h says what it
 * holds and for how long) and how the step thread applies it, together
 * with the other ways an execution is stopped on this worker: a newer
 * execution of the same request id, a revoked partition, the end of a
 * drain's grace. Abandoned jobs are stopped by their flag, never by id, so
 * a revocation cannot stop another execution of the same id that this
 * worker still owns. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "worker/worker_internal.h"

/* Handles cancelled per pass of the registry: ml_runtime_cancel runs
 * on_finish, which may free jobs, so handles are collected under the
 * registry lock and cancelled outside it. */
#define CANCEL_BATCH 64

/* ---- the table ---------------------------------------------------------------- */

int worker_cancels_init(cancel_table *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->ring = calloc(WORKER_CANCELS_MAX, sizeof *t->ring);
    return t->ring ? 0 : -1;
}

void worker_cancels_deinit(cancel_table *t)
{
    if (!t->ring)
        return;
    free(t->ring);
    t->ring = NULL;
    pthread_mutex_destroy(&t->lock);
}

/* Forget the entries past their TTL (the oldest are at head). Called with
 * t->lock held. */
static void expire(cancel_table *t, long long now)
{
    while (t->n > 0 && now - t->ring[t->head].at_ms > WORKER_CANCEL_TTL_MS) {
        t->head = (t->head + 1) % WORKER_CANCELS_MAX;
        t->n--;
    }
}

void worker_cancel_record(svc_worker *w, const svc_kafka_msg *m)
{
    /* Only what the request parser could have accepted as an id can match
     * one; the buffer holds the longest of them. */
    if (!m->key || m->key_len == 0 || m->key_len > w->limits.max_id_bytes ||
        m->key_len > SVC_ID_MAX_BYTES)
        return;
    cancel_table *t = &w->pending_cancels;
    long long now = svc_now_ms();
    pthread_mutex_lock(&t->lock);
    expire(t, now);
    if (t->n == WORKER_CANCELS_MAX) {
        t->head = (t->head + 1) % WORKER_CANCELS_MAX;
        t->n--;
    }
    pending_cancel *c = &t->ring[(t->head + t->n++) % WORKER_CANCELS_MAX];
    memcpy(c->id, m->key, m->key_len);
    c->id[m->key_len] = '\0';
    c->len = m->key_len;
    c->arrival = ++w->arrivals;
    c->at_ms = now;
    c->timestamp_ms = m->timestamp_ms;
    pthread_mutex_unlock(&t->lock);
    atomic_store(&w->cancel_scan, true);
    svc_log(SVC_LOG_INFO, "cancel_received", "request %.*s", (int)m->key_len,
            (const char *)m->key);
}

/* Whether cancel c is meant for the execution j of its id: one whose request
 * record is not newer than the cancel record. */
static bool meant_for(const pending_cancel *c, const job *j)
{
    if (c->timestamp_ms >= 0 && j->timestamp_ms >= 0)
        return j->timestamp_ms <= c->timestamp_ms;
    return j->arrival < c->arrival;
}

bool worker_cancel_hits(svc_worker *w, const job *j)
{
    if (!j->id)
        return false;
    size_t len = strlen(j->id);
    cancel_table *t = &w->pending_cancels;
    bool hit = false;
    pthread_mutex_lock(&t->lock);
    expire(t, svc_now_ms());
    for (size_t i = 0; i < t->n && !hit; i++) {
        const pending_cancel *c = &t->ring[(t->head + i) % WORKER_CANCELS_MAX];
        hit = c->len == len && !memcmp(c->id, j->id, len) && meant_for(c, j);
    }
    pthread_mutex_unlock(&t->lock);
    return hit;
}

/* ---- the step thread ------------------------------------------------------------- */

submit_verdict worker_cancel_before_submit(svc_worker *w, job *j)
{
    if (worker_cancel_hits(w, j))
        return SUBMIT_CANCELLED;
    /* The execution consumed last is the one that runs: a client's retry
     * under the same id replaces the earlier one, which ends with
     * finish_reason cancelled before the retry's first record. An earlier
     * one that reaches submit after the retry (prep finishes out of order)
     * sends nothing: a final record of its own, a seq 0, would come after
     * the retry's seq 0 and take the frontend's eye off the retry. */
    uint64_t older[CANCEL_BATCH];
    bool superseded = false;
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&w->registry_lock);
        for (job *o = registry_first(w); o && n < CANCEL_BATCH && !superseded;
             o = registry_next(o)) {
            /* An abandoned execution answers nowhere here: it replaces nothing. */
            if (o == j || !o->handle || !o->id || atomic_load(&o->abandoned) ||
                strcmp(o->id, j->id))
                continue;
            if (o->arrival > j->arrival) {
                superseded = true;
            } else if (!o->cancel_sent) {
                o->cancel_sent = true;
                older[n++] = o->handle;
            }
        }
        pthread_mutex_unlock(&w->registry_lock);
        for (int i = 0; i < n; i++) {
            svc_log(SVC_LOG_INFO, "request_superseded",
                    "request %s: a newer execution (attempt %u) replaces a running one", j->id,
                    j->attempt);
            ml_runtime_cancel(w->rt, older[i]);
        }
        if (n < CANCEL_BATCH)
            break;
    }
    return superseded ? SUBMIT_SUPERSEDED : SUBMIT_RUN;
}

void worker_cancels_apply(svc_worker *w)
{
    bool all = atomic_load(&w->cancel_all);
    if (!atomic_exchange(&w->cancel_scan, false) && !all)
        return;
    uint64_t handles[CANCEL_BATCH];
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&w->registry_lock);
        for (job *j = registry_first(w); j && n < CANCEL_BATCH; j = registry_next(j)) {
            if (!j->handle || j->cancel_sent)
                continue;
            if (all || atomic_load(&j->abandoned) || worker_cancel_hits(w, j)) {
                j->cancel_sent = true;
                handles[n++] = j->handle;
            }
        }
        pthread_mutex_unlock(&w->registry_lock);
        for (int i = 0; i < n; i++)
            ml_runtime_cancel(w->rt, handles[i]);
        if (n < CANCEL_BATCH)
            break;
    }
}
