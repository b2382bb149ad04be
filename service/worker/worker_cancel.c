/* Cancels: the table of pending cancels (worker_internal.h says what it
 * holds and for how long) and how the step thread applies it, together
 * with the other ways an execution is stopped on this worker: a newer
 * execution of the same request, a revoked partition, the end of a drain's
 * grace. Everything is keyed by (tenant, id): a record from one tenant's
 * topics never stops, replaces or waits on another tenant's request.
 * Abandoned jobs are stopped by their flag, never by id, so a revocation
 * cannot stop another execution of the same id that this worker still
 * owns. */
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
    const svc_tenant *tenant = svc_config_tenant_by_topic(&w->cfg, m->topic);
    if (!tenant || !m->key || m->key_len == 0 || m->key_len > w->limits.max_id_bytes ||
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
    c->tenant = tenant;
    c->arrival = ++w->arrivals;
    c->at_ms = now;
    c->broker_ms = m->broker_time ? m->timestamp_ms : -1;
    pthread_mutex_unlock(&t->lock);
    atomic_store(&w->cancel_scan, true);
    svc_log(SVC_LOG_INFO, "cancel_received", "tenant %s request %.*s", tenant->name,
            (int)m->key_len, (const char *)m->key);
}

/* Whether cancel c is meant for the execution j of its id: one whose request
 * record is not newer than the cancel record, in the worker's order
 * (worker_internal.h). */
static bool meant_for(const pending_cancel *c, const job *j)
{
    if (c->broker_ms >= 0 && j->broker_ms >= 0)
        return j->broker_ms <= c->broker_ms;
    return j->arrival < c->arrival;
}

static bool cancel_hits(svc_worker *w, const job *j)
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
        hit = c->tenant == j->tenant && c->len == len && !memcmp(c->id, j->id, len) &&
              meant_for(c, j);
    }
    pthread_mutex_unlock(&t->lock);
    return hit;
}

bool worker_job_stopped(svc_worker *w, const job *j)
{
    return atomic_load(&j->replaced) || cancel_hits(w, j);
}

/* ---- the step thread ------------------------------------------------------------- */

/* Whether a and b (ids set) are executions of one request. */
static bool same_request(const job *a, const job *b)
{
    return a->tenant == b->tenant && !strcmp(a->id, b->id) &&
           !strcmp(a->reply_topic, b->reply_topic);
}

submit_verdict worker_cancel_before_submit(svc_worker *w, job *j)
{
    if (worker_job_stopped(w, j))
        return SUBMIT_CANCELLED;
    /* The execution consumed last is the one that runs: a client's retry
     * replaces the earlier ones, which end with finish_reason cancelled
     * before the retry's first record, whatever stage they are in. j runs
     * once none older is left here: a running one is cancelled now (its
     * final is queued inside ml_runtime_cancel), one not yet submitted ends
     * at its next stage (replaced), and one of j's tenant whose id is not
     * known yet may be the same request. Each older one leaves the
     * registry once its records are delivered; only then does j start. */
    uint64_t older[CANCEL_BATCH];
    bool wait = false, newer = false;
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&w->registry_lock);
        for (job *o = registry_first(w); o && n < CANCEL_BATCH && !newer; o = registry_next(o)) {
            /* An abandoned execution answers nowhere here: it replaces nothing. */
            if (o == j || o->tenant != j->tenant || atomic_load(&o->abandoned))
                continue;
            if (o->arrival > j->arrival) {
                newer = o->id && same_request(o, j);
                continue;
            }
            if (!o->id) {
                wait = true;
                continue;
            }
            if (!same_request(o, j))
                continue;
            wait = true;
            atomic_store(&o->replaced, true);
            if (o->handle && !o->cancel_sent) {
                o->cancel_sent = true;
                older[n++] = o->handle;
            }
        }
        pthread_mutex_unlock(&w->registry_lock);
        for (int i = 0; i < n; i++) {
            svc_log(SVC_LOG_INFO, "request_replaced",
                    "tenant %s request %s: a newer execution (attempt %u) replaces a running one",
                    j->tenant->name, j->id, j->attempt);
            ml_runtime_cancel(w->rt, older[i]);
        }
        if (n < CANCEL_BATCH)
            break;
    }
    if (newer) {
        /* Consumed after j and prepared first: j is the older one. */
        atomic_store(&j->replaced, true);
        return SUBMIT_CANCELLED;
    }
    return wait ? SUBMIT_WAIT : SUBMIT_RUN;
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
            /* A choice's error is its request's: its other choices stop. */
            if (all || atomic_load(&j->abandoned) || j->error != SVC_ERROR_NONE ||
                cancel_hits(w, j)) {
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
