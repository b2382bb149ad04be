/* The reply producer's side of the worker: reply records and error finals,
 * dead letters, and the delivery reports that finish a request's offset or
 * fail the request (or the process) when a record is refused.
 * @locality produce paths: the prep and step threads; delivery reports: the
 * Kafka thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "worker/worker_internal.h"

/* ---- producing ------------------------------------------------------------------ */

/* A record refused for itself or its topic is its request's failure; the
 * others (timeouts, brokers down, queue full, a fatal producer) mean the
 * worker may have lost a record it promised. @locality any. */
static bool request_level(svc_kafka_status st)
{
    return st == SVC_KAFKA_ERR_TOO_LARGE || st == SVC_KAFKA_ERR_TOPIC;
}

/* Number the record of rec's kind about to be queued (before it is: its
 * report may come at once). @locality any. */
static void note_produced(svc_worker *w, job_record *rec)
{
    atomic_store(&rec->produced, atomic_fetch_add(&w->produced, 1) + 1);
}

/* An acknowledged final or dead letter to topic, produced as number n.
 * @locality Kafka thread. */
static void note_acked(svc_worker *w, const char *topic, uint64_t n)
{
    if (!strcmp(w->acked[0].topic, topic)) {
        if (n > w->acked[0].produced)
            w->acked[0].produced = n;
        return;
    }
    if (n > w->acked[0].produced) {
        w->acked[1] = w->acked[0];
        w->acked[0].produced = n;
        snprintf(w->acked[0].topic, sizeof w->acked[0].topic, "%s", topic);
    } else if (n > w->acked[1].produced) {
        w->acked[1].produced = n;
        snprintf(w->acked[1].topic, sizeof w->acked[1].topic, "%s", topic);
    }
}

/* Whether a record to another topic than `topic`, produced after number n,
 * was acknowledged: then the cluster takes records and a timeout on topic
 * is that topic's (partitions without a leader, too few in-sync replicas),
 * its request's failure and not the process's. @locality Kafka thread. */
static bool acked_elsewhere_after(const svc_worker *w, const char *topic, uint64_t n)
{
    int other = strcmp(w->acked[0].topic, topic) ? 0 : 1;
    return w->acked[other].produced > n;
}

/* The reply topic refused a record of j: remember the first reason.
 * @locality any. */
static void reply_refused(svc_worker *w, job *j, const char *why)
{
    pthread_mutex_lock(&w->failure_lock);
    if (!atomic_load(&j->reply_failed)) {
        snprintf(j->reply_why, sizeof j->reply_why, "%s", why);
        atomic_store(&j->reply_failed, true);
    }
    pthread_mutex_unlock(&w->failure_lock);
}

/* True when a record of j was refused; why gets the reason. @locality any. */
static bool reply_failure(svc_worker *w, job *j, char *why, size_t n)
{
    if (!atomic_load(&j->reply_failed))
        return false;
    pthread_mutex_lock(&w->failure_lock);
    snprintf(why, n, "%s", j->reply_why);
    pthread_mutex_unlock(&w->failure_lock);
    return true;
}

/* Queue one reply record of j with ctx = its `kind` record, holding a
 * reference for its delivery report. A value over limits.max_reply_bytes is
 * refused here (ERR_TOO_LARGE), so no topic sized to that bound refuses it
 * later. Returns the producer's status; err has the reason.
 * @locality prep, step or Kafka thread. */
static svc_kafka_status produce_reply(svc_worker *w, job *j, job_record_kind kind,
                                      const svc_buf *value, uint32_t seq, char *err,
                                      size_t errlen)
{
    bool final = kind == JOB_RECORD_FINAL;
    if (w->limits.max_reply_bytes && value->len > w->limits.max_reply_bytes) {
        svc_errf(err, errlen, "a record of %zu bytes is over limits.max_reply_bytes (%zu)",
                 value->len, w->limits.max_reply_bytes);
        return SVC_KAFKA_ERR_TOO_LARGE;
    }
    svc_headers hs;
    svc_headers_reply(&hs, j->id, j->attempt, seq, final, w->reproducible);
    svc_kafka_header kh[SVC_HEADERS_MAX];
    for (size_t i = 0; i < hs.n; i++)
        kh[i] = (svc_kafka_header){hs.h[i].name, hs.h[i].value, hs.h[i].len};
    svc_kafka_record r = {
        .topic = j->reply_topic, .partition = RD_KAFKA_PARTITION_UA,
        .key = j->id, .key_len = strlen(j->id), .value = value->data, .value_len = value->len,
        .headers = kh, .n_headers = hs.n, .ctx = &j->records[kind],
    };
    atomic_fetch_add(&j->refs, 1);
    note_produced(w, &j->records[kind]);
    svc_kafka_status st = svc_producer_produce(w->producer, &r, err, errlen);
    if (st != SVC_KAFKA_OK) {
        atomic_fetch_sub(&j->refs, 1); /* never the last: the caller holds one */
        svc_log(request_level(st) ? SVC_LOG_WARN : SVC_LOG_ERROR, "produce_failed",
                "request %s seq %u: %s", j->id, seq, err);
    }
    return st;
}

int worker_produce_chunk(svc_worker *w, job *j, const svc_buf *value, uint32_t seq)
{
    /* After a process-level error nothing more goes out: a record may have
     * been lost, and what follows it would show a gap in its stream. After
     * a refused record, nothing follows the gap it left. */
    if (atomic_load(&w->fatal) || atomic_load(&j->reply_failed))
        return -1;
    char err[256];
    svc_kafka_status st = produce_reply(w, j, JOB_RECORD_CHUNK, value, seq, err, sizeof err);
    if (st == SVC_KAFKA_OK)
        return 0;
    if (request_level(st))
        reply_refused(w, j, err);
    else
        worker_fail(w, SVC_WORKER_EXIT_KAFKA, "reply producer: %s", err);
    return -1;
}

/* Build j's final error record (no metrics: the caller counts). Returns 0
 * or -1 out of memory. @locality any. */
static int error_record(svc_worker *w, const job *j, svc_error code, const char *message,
                        svc_buf *b)
{
    svc_reply_ctx ctx = {.id = j->id, .model = w->model_name, .created = (int64_t)time(NULL),
                         .attempt = j->attempt};
    return svc_reply_error(b, &ctx, j->stream, j->seq, code, message);
}

/* j's final record could not be written (st, why): replace it, dead-letter
 * the request, or stop the worker. Takes the caller's reference.
 * @locality prep, step or Kafka thread. */
static void final_refused(svc_worker *w, job *j, svc_kafka_status st, const char *why)
{
    if (st == SVC_KAFKA_ERR_TOO_LARGE && !j->final_replaced) {
        char msg[2 * SVC_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "the answer does not fit in one record: %s", why);
        svc_log(SVC_LOG_INFO, "request_error", "request %s: %s: %s", j->id,
                svc_error_code(SVC_ERROR_REPLY_TOO_LARGE), msg);
        svc_metrics_error(SVC_ERROR_REPLY_TOO_LARGE);
        svc_buf b;
        svc_buf_init(&b);
        j->final_replaced = true;
        if (error_record(w, j, SVC_ERROR_REPLY_TOO_LARGE, msg, &b) == 0)
            worker_produce_final(w, j, &b, j->seq);
        else
            worker_dead_letter(w, j, SVC_ERROR_REPLY_TOO_LARGE, msg);
        svc_buf_deinit(&b);
    } else if (request_level(st)) {
        char msg[2 * SVC_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "reply topic %s: %s", j->reply_topic, why);
        worker_dead_letter(w, j, SVC_ERROR_REPLY_UNDELIVERABLE, msg);
    } else {
        worker_fail(w, SVC_WORKER_EXIT_KAFKA, "reply producer: %s", why);
        job_free(j);
    }
}

void worker_produce_final(svc_worker *w, job *j, const svc_buf *value, uint32_t seq)
{
    char why[SVC_ERRMSG_MAX];
    if (atomic_load(&w->fatal)) {
        job_free(j); /* not finished: the next owner runs it again */
        return;
    }
    if (reply_failure(w, j, why, sizeof why)) {
        final_refused(w, j, SVC_KAFKA_ERR_TOPIC, why);
        return;
    }
    char err[256];
    svc_kafka_status st = produce_reply(w, j, JOB_RECORD_FINAL, value, seq, err, sizeof err);
    if (st == SVC_KAFKA_OK)
        job_free(j); /* the record's reference keeps j until its report */
    else
        final_refused(w, j, st, err);
}

void worker_reply_error(svc_worker *w, job *j, svc_error code, const char *message)
{
    svc_buf b;
    svc_buf_init(&b);
    svc_metrics_error(code);
    svc_metrics_finished(svc_error_finish(code));
    svc_log(SVC_LOG_INFO, "request_error", "request %s: %s: %s", j->id, svc_error_code(code),
            message);
    if (error_record(w, j, code, message, &b) == 0)
        worker_produce_final(w, j, &b, j->seq);
    else
        worker_dead_letter(w, j, code, message);
    svc_buf_deinit(&b);
}

void worker_dead_letter(svc_worker *w, job *j, svc_error code, const char *message)
{
    if (atomic_load(&w->fatal)) {
        job_free(j);
        return;
    }
    j->dlt_code = code;
    svc_dead_letter dl = {.topic = w->cfg.kafka.dlt_topic, .error_code = svc_error_code(code),
                          .error_msg = message, .worker = w->cfg.worker_id,
                          .max_value = w->limits.max_reply_bytes,
                          .ctx = &j->records[JOB_RECORD_DEAD_LETTER]};
    char err[256];
    svc_log(SVC_LOG_WARN, "dead_letter", "%s[%" PRId32 "]@%" PRId64 ": %s: %s", j->topic,
            j->partition, j->offset, svc_error_code(code), message);
    atomic_fetch_add(&j->refs, 1);
    note_produced(w, &j->records[JOB_RECORD_DEAD_LETTER]);
    if (svc_producer_produce_dlt(w->producer, &dl, &j->msg, err, sizeof err) != SVC_KAFKA_OK) {
        /* The last resort refused: the record would be lost if its offset
         * moved on, so nothing is committed past it. */
        atomic_fetch_sub(&j->refs, 1);
        worker_fail(w, SVC_WORKER_EXIT_KAFKA, "dead letter to %s: %s", w->cfg.kafka.dlt_topic,
                    err);
    }
    job_free(j);
}

/* Delivery reports (Kafka thread). Each record holds a reference to its
 * job. A reply record refused for itself or its topic is the request's
 * failure (see worker_produce_final): a final is replaced or becomes a dead
 * letter; a refused chunk leaves a gap, so nothing more follows it and the
 * final becomes a dead letter, and a final that had already gone out is
 * followed by the dead letter all the same (the gap voids it). So is a
 * reply record that timed out (message.timeout.ms) while a final or dead
 * letter produced after it to another topic was acknowledged: the cluster
 * takes records, that topic does not (reply_undeliverable). An acknowledged
 * final or dead letter finishes the ticket. Any other failure (a timeout
 * with nothing later acknowledged elsewhere: brokers down; a dead letter
 * refused; the producer fatal) leaves a record lost that nothing runs again
 * while this worker keeps the partition: a process-level error. The worker
 * stops storing offsets and exits, so the group hands every unfinished
 * request out again, as a new attempt. */
void worker_on_delivery(void *opaque, const svc_delivery *d)
{
    svc_worker *w = opaque;
    const job_record *rec = d->ctx;
    job *j = rec->j;
    bool reply = rec->kind != JOB_RECORD_DEAD_LETTER;
    uint64_t produced = atomic_load(&rec->produced);
    if (d->status == SVC_KAFKA_OK && rec->kind != JOB_RECORD_CHUNK)
        note_acked(w, d->topic, produced);
    /* For a chunk, `produced` is its latest sibling's number, never lower
     * than its own: the test below only gets stricter. */
    bool topic_stuck = reply && d->err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT &&
                       acked_elsewhere_after(w, d->topic, produced);
    bool refused = reply && (request_level(d->status) || topic_stuck);
    if (d->status != SVC_KAFKA_OK) {
        svc_log(refused ? SVC_LOG_WARN : SVC_LOG_ERROR, "delivery_failed",
                "%s [%" PRId32 "]: %s%s", d->topic, d->partition, d->errstr,
                topic_stuck ? " (later records to other topics were acknowledged)" : "");
        if (!refused)
            worker_fail(w, SVC_WORKER_EXIT_KAFKA, "record lost: %s [%" PRId32 "]: %s", d->topic,
                        d->partition, d->errstr);
    }
    bool live = !atomic_load(&j->abandoned) && !atomic_load(&w->fatal);
    char why[SVC_ERRMSG_MAX];
    if (d->status != SVC_KAFKA_OK && refused) {
        snprintf(why, sizeof why, "%s", d->errstr);
        if (rec->kind == JOB_RECORD_CHUNK || !live)
            reply_refused(w, j, why);
        else {
            /* takes the record's reference */
            final_refused(w, j, topic_stuck ? SVC_KAFKA_ERR_TOPIC : d->status, why);
            return;
        }
    } else if (d->status == SVC_KAFKA_OK && rec->kind == JOB_RECORD_FINAL && live &&
               reply_failure(w, j, why, sizeof why)) {
        final_refused(w, j, SVC_KAFKA_ERR_TOPIC, why);
        return;
    } else if (d->status == SVC_KAFKA_OK && rec->kind != JOB_RECORD_CHUNK) {
        if (rec->kind == JOB_RECORD_DEAD_LETTER)
            svc_metrics_dead_letter(j->dlt_code);
        if (live)
            worker_finish_offset(w, j);
    }
    job_free(j);
}

/* Have the index thread delete j's attempt counter: the record is
 * answered. Dropped when the queue is full or memory short (the counter
 * then expires). @locality Kafka thread. */
static void queue_attempt_clear(svc_worker *w, const job *j)
{
    attempt_clear *c = w->redis_index && j->offset_counted ? calloc(1, sizeof *c) : NULL;
    if (!c)
        return;
    snprintf(c->topic, sizeof c->topic, "%s", j->topic);
    c->partition = j->partition;
    c->offset = j->offset;
    pthread_mutex_lock(&w->event_lock);
    if (w->n_clears < WORKER_CLEARS_MAX) {
        if (w->clears_tail)
            w->clears_tail->next = c;
        else
            w->clears_head = c;
        w->clears_tail = c;
        w->n_clears++;
        c = NULL;
        pthread_cond_signal(&w->event_cond);
    }
    pthread_mutex_unlock(&w->event_lock);
    free(c);
}

void worker_finish_offset(svc_worker *w, job *j)
{
    char err[256];
    svc_kafka_status st = svc_consumer_finish(w->consumer, &j->ticket, err, sizeof err);
    if (st != SVC_KAFKA_OK && st != SVC_KAFKA_ERR_STALE)
        svc_log(SVC_LOG_ERROR, "offset_finish", "%s", err);
    if (st == SVC_KAFKA_OK)
        queue_attempt_clear(w, j);
}
