/* Jobs: their queues between the threads, the registry of live jobs that a
 * revocation searches, and their release.
 * @locality any thread: the queues and the registry lock. */
#include <stdlib.h>
#include <string.h>

#include "worker/worker_internal.h"

void job_queue_init(job_queue *q)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
}

void job_queue_deinit(job_queue *q)
{
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
}

void job_queue_push(job_queue *q, job *j)
{
    pthread_mutex_lock(&q->lock);
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->n++;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

job *job_queue_pop(job_queue *q, int timeout_ms)
{
    pthread_mutex_lock(&q->lock);
    if (!q->head && timeout_ms > 0) {
        struct timespec ts;
        svc_deadline_in(&ts, timeout_ms);
        pthread_cond_timedwait(&q->cond, &q->lock, &ts);
    }
    job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        q->n--;
    }
    pthread_mutex_unlock(&q->lock);
    return j;
}

void worker_register(svc_worker *w, job *j)
{
    pthread_mutex_lock(&w->registry_lock);
    ml_list_push_front(&w->registry, &j->reg);
    pthread_mutex_unlock(&w->registry_lock);
}

static void worker_unregister(svc_worker *w, job *j)
{
    pthread_mutex_lock(&w->registry_lock);
    /* A job that failed before it was registered is in no list. */
    if (j->reg.prev || j->reg.next || w->registry.head == &j->reg)
        ml_list_remove(&w->registry, &j->reg);
    pthread_mutex_unlock(&w->registry_lock);
}

int job_identify(svc_worker *w, job *j, const char *id, const char *reply_topic)
{
    char *i = strdup(id), *t = strdup(reply_topic);
    if (!i || !t) {
        free(i);
        free(t);
        return -1;
    }
    pthread_mutex_lock(&w->registry_lock);
    j->id = i;
    j->reply_topic = t;
    pthread_mutex_unlock(&w->registry_lock);
    return 0;
}

static void choice_deinit(job_choice *c)
{
    svc_buf_deinit(&c->text);
    svc_tool_stream_deinit(&c->tool);
    free(c->lp);
    free(c->lp_top);
}

static void choice_init(job *j, job_choice *c, uint32_t index)
{
    *c = (job_choice){.j = j, .index = index};
    svc_buf_init(&c->text);
    if (j->tools) {
        svc_tool_stream_init(&c->tool, j->tool_call);
        svc_tool_call_id(j->id, index, c->call_id);
    }
}

int job_choices_init(job *j, uint32_t n)
{
    if (n <= 1)
        return 0;
    job_choice *c = calloc(n, sizeof *c);
    if (!c)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        choice_init(j, &c[i], i);
    choice_deinit(&j->first);
    j->choices = c;
    j->n_choices = n;
    return 0;
}

void job_choices_reset(job *j)
{
    for (uint32_t i = 0; i < j->n_choices; i++) {
        choice_deinit(&j->choices[i]);
        choice_init(j, &j->choices[i], i);
    }
    j->n_ended = 0;
}

void job_free(job *j)
{
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    svc_worker *w = j->w;
    worker_unregister(w, j);
    svc_kafka_msg_release(&j->msg);
    svc_request_destroy(j->req);
    ml_token_buf_deinit(&j->prompt);
    ml_grammar_unref(j->sampling.grammar);
    for (int i = 0; i < j->n_images; i++)
        free(j->images[i].pixels);
    free(j->images);
    free(j->id);
    free(j->reply_topic);
    for (uint32_t i = 0; i < j->n_choices; i++)
        choice_deinit(&j->choices[i]);
    if (j->choices != &j->first)
        free(j->choices);
    size_t tenant = job_tenant(j);
    free(j);
    atomic_fetch_sub(&w->tenant_inflight[tenant], 1);
    atomic_fetch_sub(&w->inflight, 1);
}
