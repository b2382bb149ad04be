/* svc_producer: the worker's idempotent producer (kafka.h).
 *
 * @locality produce paths: any thread. Callbacks, poll, flush, destroy: the
 *           delivery-report thread (the worker's Kafka thread). */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kafka/kafka_conf.h"
#include "log.h"

/* How long produce waits on a full local queue before failing the record. */
#define QUEUE_FULL_DEFAULT_MS 2000
/* One wait step while the queue is full. */
#define QUEUE_FULL_STEP_MS 5
/* How long destroy flushes before purging. */
#define CLOSE_FLUSH_DEFAULT_MS 5000
/* How long destroy waits for the reports of purged records. */
#define PURGE_REPORT_MS 1000

struct svc_producer {
    rd_kafka_t *rk; /* owned */
    uint64_t id;    /* process-unique, for the delivery-report thread mark */
    svc_delivery_fn on_delivery;
    void *opaque;
    int queue_full_ms;
    int close_flush_ms;
};

/* Which producer's delivery reports this thread serves (0: none). Set by
 * poll, flush and destroy; read by produce to decide whether a full queue
 * may be drained here (serving reports on another thread would break the
 * Kafka-thread contract of kafka.h) or must be waited out. An id rather than
 * a pointer, so a freed producer's address reused by a new one is no match. */
static _Thread_local uint64_t dr_thread_of;
/* Set while this thread runs a delivery report: a produce from inside one
 * (a dead letter for a refused reply) must not serve reports recursively. */
static _Thread_local bool in_report;
static atomic_uint_least64_t next_id = 1;

/* ---- callbacks --------------------------------------------------------------- */

/* @locality the delivery-report thread. */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    svc_producer *p = opaque;
    svc_delivery d = {
        .ctx = m->_private,
        .err = m->err,
        .errstr = rd_kafka_err2str(m->err),
        .status = svc_kafka_record_status(m->err),
        .topic = rd_kafka_topic_name(m->rkt),
        .partition = m->partition,
        .offset = m->err ? -1 : m->offset,
    };
    if (m->err)
        svc_log(SVC_LOG_WARN, "kafka.delivery_failed", "%s [%d]: %s", d.topic, (int)d.partition,
                d.errstr);
    in_report = true;
    p->on_delivery(p->opaque, &d);
    in_report = false;
}

/* @locality the delivery-report thread. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    (void)opaque;
    svc_kafka_log_error(rk, "producer", err, reason);
}

/* ---- lifecycle --------------------------------------------------------------- */

svc_kafka_status svc_producer_create(const svc_producer_config *cfg, svc_producer **out,
                                     char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg->on_delivery)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                              "producer: a delivery callback is required");
    /* A missing topic must fail its records before they time out: the
     * propagation wait defaults to at most half the message timeout. */
    long timeout_ms =
        svc_kafka_kv_long(cfg->kafka, cfg->n_kafka, "message.timeout.ms", SVC_PRODUCER_TIMEOUT_MS);
    long propagation_ms = SVC_PRODUCER_PROPAGATION_MS;
    if (timeout_ms > 0 && propagation_ms > timeout_ms / 2)
        propagation_ms = timeout_ms / 2;
    char timeout[24], propagation[24];
    snprintf(timeout, sizeof timeout, "%d", SVC_PRODUCER_TIMEOUT_MS);
    snprintf(propagation, sizeof propagation, "%ld", propagation_ms);
    const svc_kafka_kv defaults[] = {
        {"client.id", "mllama-worker"},
        {"bootstrap.servers", cfg->brokers},
        /* Tokens stream to a waiting user: send each record at once. A
         * linger of 5 ms measured +3 ms per request and a 7 ms per-token p99
         * (tests/bench/bench_service.c); batching still happens while a
         * request is in flight. */
        {"linger.ms", "0"},
        {"message.timeout.ms", timeout},
        {"topic.metadata.propagation.max.ms", propagation},
    };
    /* One request in flight per broker connection: the records of one
     * attempt then reach the log in the order they were produced whatever
     * the broker does with idempotent sequence numbers. With five in flight
     * that order rests on the broker refusing a batch that overtakes a
     * failed one (OUT_OF_ORDER_SEQUENCE_NUMBER); librdkafka's mock cluster
     * checks sequences only for transactional producers and stores such a
     * batch, and librdkafka 2.0.2 turns a disconnect followed by that refusal
     * into a fatal error (fixed in 2.3.0). Records produced while a request
     * is out still leave together in the next one, so the cost is at most
     * one round trip per record (tests/bench/bench_reply_inflight.c). */
    static const svc_kafka_fixed fixed[] = {
        {"enable.idempotence", "true", "retries must neither duplicate nor reorder reply chunks"},
        {"max.in.flight.requests.per.connection", "1",
         "the records of one attempt must reach the log in order on any broker"},
        {"allow.auto.create.topics", "false",
         "a request names its reply topic: it must not create one (operators create topics)"},
    };
    rd_kafka_conf_t *conf;
    svc_kafka_status st = svc_kafka_conf_build(defaults, sizeof defaults / sizeof defaults[0],
                                               cfg->kafka, cfg->n_kafka, fixed,
                                               sizeof fixed / sizeof fixed[0], &conf, err, errlen);
    if (st != SVC_KAFKA_OK)
        return st;
    svc_producer *p = calloc(1, sizeof *p);
    if (!p) {
        rd_kafka_conf_destroy(conf);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory");
    }
    p->id = atomic_fetch_add(&next_id, 1);
    p->on_delivery = cfg->on_delivery;
    p->opaque = cfg->opaque;
    p->queue_full_ms = cfg->queue_full_ms > 0 ? cfg->queue_full_ms : QUEUE_FULL_DEFAULT_MS;
    p->close_flush_ms = cfg->close_flush_ms > 0 ? cfg->close_flush_ms : CLOSE_FLUSH_DEFAULT_MS;
    rd_kafka_conf_set_opaque(conf, p);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    char why[512];
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
    if (!p->rk) {
        rd_kafka_conf_destroy(conf);
        free(p);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "producer: %s", why);
    }
    *out = p;
    return SVC_KAFKA_OK;
}

void svc_producer_destroy(svc_producer *p)
{
    if (!p)
        return;
    dr_thread_of = p->id;
    if (rd_kafka_flush(p->rk, p->close_flush_ms) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        svc_log(SVC_LOG_WARN, "kafka.close", "producer: %d records undelivered after %d ms, purged",
                rd_kafka_outq_len(p->rk), p->close_flush_ms);
        rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(p->rk, PURGE_REPORT_MS);
    }
    rd_kafka_destroy(p->rk);
    dr_thread_of = 0;
    free(p);
}

/* ---- producing --------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Enqueue with `hdrs` (owned; NULL for none), which librdkafka takes over on
 * success and we destroy on failure. */
static svc_kafka_status produce(svc_producer *p, const char *topic, int32_t partition,
                                const void *key, size_t key_len, const void *value,
                                size_t value_len, rd_kafka_headers_t *hdrs, void *ctx, char *err,
                                size_t errlen)
{
    rd_kafka_resp_err_t e;
    for (int waited = 0;; waited += QUEUE_FULL_STEP_MS) {
        e = rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                              RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)value, value_len),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
                              RD_KAFKA_V_OPAQUE(ctx), RD_KAFKA_V_END);
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL || waited >= p->queue_full_ms)
            break;
        if (dr_thread_of == p->id && !in_report)
            rd_kafka_poll(p->rk, QUEUE_FULL_STEP_MS);
        else
            sleep_ms(QUEUE_FULL_STEP_MS);
    }
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
        return SVC_KAFKA_OK;
    if (hdrs)
        rd_kafka_headers_destroy(hdrs);
    svc_kafka_status st = e == RD_KAFKA_RESP_ERR__QUEUE_FULL ? SVC_KAFKA_ERR_QUEUE_FULL
                                                             : svc_kafka_record_status(e);
    return svc_kafka_fail(err, errlen, st, "produce to %s: %s", topic, rd_kafka_err2str(e));
}

svc_kafka_status svc_producer_produce(svc_producer *p, const svc_kafka_record *r, char *err,
                                      size_t errlen)
{
    if (!r->topic || !*r->topic)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "produce: no topic");
    rd_kafka_headers_t *hdrs = NULL;
    if (r->n_headers) {
        hdrs = rd_kafka_headers_new(r->n_headers);
        for (size_t i = 0; i < r->n_headers; i++) {
            const svc_kafka_header *h = &r->headers[i];
            if (!h->name || rd_kafka_header_add(hdrs, h->name, -1, h->value,
                                                h->value ? (ssize_t)h->len : 0)) {
                rd_kafka_headers_destroy(hdrs);
                return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                                      "produce to %s: header %zu has no name", r->topic, i);
            }
        }
    }
    return produce(p, r->topic, r->partition, r->key, r->key_len, r->value, r->value_len, hdrs,
                   r->ctx, err, errlen);
}

svc_kafka_status svc_producer_produce_dlt(svc_producer *p, const svc_dead_letter *dl,
                                          const svc_kafka_msg *orig, char *err, size_t errlen)
{
    if (!dl->topic || !*dl->topic || (!orig->rkm && !orig->copy))
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG,
                              "dead letter: no topic or message already released");
    rd_kafka_headers_t *orig_hdrs = orig->headers;
    if (orig->rkm && rd_kafka_message_headers(orig->rkm, &orig_hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        orig_hdrs = NULL;
    size_t hdr_bytes = svc_kafka_headers_bytes(orig_hdrs);
    size_t dropped = orig->dropped_meta;
    if (!dropped && orig->key_len + hdr_bytes > SVC_DLT_META_MAX)
        dropped = orig->key_len + hdr_bytes;
    rd_kafka_headers_t *hdrs = orig_hdrs && !dropped ? rd_kafka_headers_copy(orig_hdrs)
                                                     : rd_kafka_headers_new(8);
    size_t full = orig->value_full_len > orig->value_len ? orig->value_full_len : orig->value_len;
    size_t value_len = dl->max_value && orig->value_len > dl->max_value ? dl->max_value
                                                                         : orig->value_len;
    char partition[16], offset[24], truncated[24], dropped_s[24];
    snprintf(partition, sizeof partition, "%" PRId32, orig->partition);
    snprintf(offset, sizeof offset, "%" PRId64, orig->offset);
    snprintf(truncated, sizeof truncated, "%zu", full);
    snprintf(dropped_s, sizeof dropped_s, "%zu", dropped);
    const char *add[][2] = {
        {"x-error-code", dl->error_code ? dl->error_code : "internal"},
        {"x-error-msg", dl->error_msg ? dl->error_msg : ""},
        {"x-original-topic", orig->topic},
        {"x-original-partition", partition},
        {"x-original-offset", offset},
        {"x-worker", dl->worker},
        {"x-truncated", value_len < full ? truncated : NULL},
        {"x-dropped", dropped ? dropped_s : NULL},
    };
    for (size_t i = 0; i < sizeof add / sizeof add[0]; i++)
        if (add[i][1])
            rd_kafka_header_add(hdrs, add[i][0], -1, add[i][1], -1);
    return produce(p, dl->topic, RD_KAFKA_PARTITION_UA, dropped ? NULL : orig->key,
                   dropped ? 0 : orig->key_len, orig->value, value_len, hdrs, dl->ctx, err,
                   errlen);
}

/* ---- serving reports --------------------------------------------------------- */

int svc_producer_poll(svc_producer *p, int timeout_ms)
{
    dr_thread_of = p->id;
    return rd_kafka_poll(p->rk, timeout_ms);
}

svc_kafka_status svc_producer_flush(svc_producer *p, int timeout_ms, char *err, size_t errlen)
{
    dr_thread_of = p->id;
    if (rd_kafka_flush(p->rk, timeout_ms) == RD_KAFKA_RESP_ERR_NO_ERROR)
        return SVC_KAFKA_OK;
    return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_TIMED_OUT,
                          "flush: %d records undelivered after %d ms", rd_kafka_outq_len(p->rk),
                          timeout_ms);
}

int svc_producer_queued(svc_producer *p)
{
    return rd_kafka_outq_len(p->rk);
}

bool svc_producer_fatal(svc_producer *p, char *err, size_t errlen)
{
    char buf[512];
    if (rd_kafka_fatal_error(p->rk, buf, sizeof buf) == RD_KAFKA_RESP_ERR_NO_ERROR)
        return false;
    svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_FATAL, "%s", buf);
    return true;
}
