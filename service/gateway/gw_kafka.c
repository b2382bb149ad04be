/* The gateway's Kafka side (gw_internal.h): the producer's delivery
 * reports, the reply reader (every partition of this instance's reply
 * topics assigned at the high watermark, no group, its queue waking the
 * loop through a pipe) and, at start, the reply topics created when
 * missing.
 * @locality: the gateway's thread. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_internal.h"
#include "log.h"

/* Replies handled per wake-up before the loop serves its other events. */
#define REPLY_BATCH 1024
/* Startup calls to the cluster: metadata, watermarks, topic creation. */
#define STARTUP_TIMEOUT_MS 10000

static const char reproducible_true[] = "true";

/* ---- Kafka: producing ---------------------------------------------------------- */

static void on_delivery(void *opaque, const svc_delivery *d)
{
    svc_gateway *g = opaque;
    gw_req *r = d->ctx;
    if (!r)
        return; /* a cancel: nothing waits on it */
    r->deliveries--;
    if (d->err) {
        svc_log(SVC_LOG_WARN, "gateway_produce_failed", "request %s to %s: %s", r->id,
                d->topic, d->errstr);
        gw_request_fail(g, r, "kafka_unavailable", "the request could not be queued for a worker");
    }
}

/* ---- Kafka: the replies ---------------------------------------------------------- */

static bool header_is(rd_kafka_headers_t *hs, const char *name, const char *want)
{
    const void *v;
    size_t n;
    return hs && !rd_kafka_header_get_last(hs, name, &v, &n) && v && n == strlen(want) &&
           !memcmp(v, want, n);
}

/* One record of a reply topic: ours if its key is a running or retained
 * request of the tenant whose reply topic it came from. */
static void on_reply(svc_gateway *g, rd_kafka_message_t *m)
{
    if (m->err) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            svc_log(SVC_LOG_WARN, "gateway_reply_error", "%s", rd_kafka_message_errstr(m));
        return;
    }
    gw_req *r = m->key ? gw_request_find(g, m->key, m->key_len) : NULL;
    if (!r || strcmp(rd_kafka_topic_name(m->rkt), g->tenants[r->tenant].reply_topic))
        return;
    rd_kafka_headers_t *hs = NULL;
    rd_kafka_message_headers(m, &hs);
    gw_record rec = {.value = m->payload, .len = m->len};
    if (!svc_kafka_header_u32(hs, "attempt", &rec.attempt) ||
        !svc_kafka_header_u32(hs, "seq", &rec.seq))
        return;
    rec.final = header_is(hs, "final", "true");
    rec.reproducible = header_is(hs, "reproducible", reproducible_true);
    gw_feed f = gw_stream_feed(r->stream, &rec);
    if (f == GW_FEED_IGNORED)
        return;
    if (f == GW_FEED_DIVERGED) {
        g->m.divergences++;
        svc_log(SVC_LOG_WARN, "gateway_stream_diverged",
                "request %s: attempt %" PRIu32 " cannot continue the stream", r->id, rec.attempt);
    } else if (f == GW_FEED_CONTINUED) {
        g->m.continuations++;
        svc_log(SVC_LOG_INFO, "gateway_stream_continued",
                "request %s: attempt %" PRIu32 " continues the stream", r->id, rec.attempt);
    }
    gw_request_progress(g, r);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    svc_gateway *g = arg;
    svc_wake_pipe_drain(fd);
    for (int i = 0; i < REPLY_BATCH; i++) {
        rd_kafka_message_t *m = rd_kafka_consume_queue(g->replies, 0);
        if (!m)
            return;
        on_reply(g, m);
        rd_kafka_message_destroy(m);
    }
    /* More are queued: the pipe is written only when the queue turns
     * non-empty, so come back after the loop's other events. */
    event_active(g->wake_ev, EV_READ, 0);
}

/* ---- Kafka: startup ---------------------------------------------------------------- */

static rd_kafka_conf_t *consumer_conf(const svc_gateway *g, char *err, size_t errlen)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char group[128];
    snprintf(group, sizeof group, "mllama-gateway-%s", g->cfg.gateway.instance);
    /* The pass-through properties first: these are fixed, since the reader
     * assigns and never commits. */
    for (size_t i = 0; i < g->cfg.kafka.n_props; i++)
        if (rd_kafka_conf_set(conf, g->cfg.kafka.props[i].key, g->cfg.kafka.props[i].value, err,
                              errlen) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    if (rd_kafka_conf_set(conf, "bootstrap.servers", g->cfg.kafka.brokers, err, errlen) ||
        rd_kafka_conf_set(conf, "group.id", group, err, errlen) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, errlen) ||
        rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, errlen) ||
        rd_kafka_conf_set(conf, "enable.partition.eof", "false", err, errlen)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return conf;
}

/* The metadata of `topic` (*md owned by the caller when set, even on an
 * error): an error when the cluster has no such topic or it has no
 * partitions. */
static rd_kafka_resp_err_t topic_metadata(svc_gateway *g, const char *topic,
                                          const rd_kafka_metadata_t **md)
{
    *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(g->consumer, topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(g->consumer, 0, t, md, STARTUP_TIMEOUT_MS);
    rd_kafka_topic_destroy(t);
    if (e)
        return e;
    if ((*md)->topic_cnt != 1)
        return RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
    if ((*md)->topics[0].err)
        return (*md)->topics[0].err;
    return (*md)->topics[0].partition_cnt ? RD_KAFKA_RESP_ERR_NO_ERROR
                                          : RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
}

/* Create the reply topics the cluster lacks (the Admin API; one created
 * meanwhile by another instance is fine). */
static int create_reply_topics(svc_gateway *g, char *err, size_t errlen)
{
    rd_kafka_NewTopic_t *nt[SVC_TENANTS_MAX];
    size_t n = 0;
    for (size_t i = 0; i < g->n_tenants; i++) {
        const rd_kafka_metadata_t *md;
        rd_kafka_resp_err_t e = topic_metadata(g, g->tenants[i].reply_topic, &md);
        if (md)
            rd_kafka_metadata_destroy(md);
        if (!e)
            continue;
        if (e != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            svc_errf(err, errlen, "reply topic %s: %s", g->tenants[i].reply_topic,
                     rd_kafka_err2str(e));
            rd_kafka_NewTopic_destroy_array(nt, n);
            return -1;
        }
        if (!(nt[n] = rd_kafka_NewTopic_new(g->tenants[i].reply_topic,
                                            g->cfg.gateway.reply_partitions, -1, err, errlen))) {
            rd_kafka_NewTopic_destroy_array(nt, n);
            return -1;
        }
        n++;
    }
    if (!n)
        return 0;
    rd_kafka_queue_t *q = rd_kafka_queue_new(g->consumer);
    rd_kafka_AdminOptions_t *opts =
        rd_kafka_AdminOptions_new(g->consumer, RD_KAFKA_ADMIN_OP_CREATETOPICS);
    rd_kafka_AdminOptions_set_request_timeout(opts, STARTUP_TIMEOUT_MS, NULL, 0);
    rd_kafka_CreateTopics(g->consumer, nt, n, opts, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, STARTUP_TIMEOUT_MS + STARTUP_TIMEOUT_MS / 10);
    const rd_kafka_CreateTopics_result_t *res = ev ? rd_kafka_event_CreateTopics_result(ev) : NULL;
    int rc = 0;
    if (!res || rd_kafka_event_error(ev)) {
        svc_errf(err, errlen, "creating the reply topics: %s",
                 ev ? rd_kafka_event_error_string(ev) : "no answer");
        rc = -1;
    }
    size_t k = 0;
    const rd_kafka_topic_result_t **tr = res ? rd_kafka_CreateTopics_result_topics(res, &k) : NULL;
    for (size_t i = 0; i < k && !rc; i++) {
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(tr[i]);
        if (e && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
            svc_errf(err, errlen, "creating reply topic %s: %s", rd_kafka_topic_result_name(tr[i]),
                     rd_kafka_topic_result_error_string(tr[i]));
            rc = -1;
        } else if (!e) {
            svc_log(SVC_LOG_INFO, "gateway_topic_created", "%s, %d partitions",
                    rd_kafka_topic_result_name(tr[i]), g->cfg.gateway.reply_partitions);
        }
    }
    if (ev)
        rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(opts);
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy_array(nt, n);
    return rc;
}

/* Assign every partition of every reply topic at its high watermark: no
 * reply of a request produced after this is missed, no older one is read. */
static int assign_reply_topics(svc_gateway *g, char *err, size_t errlen)
{
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(g->n_tenants);
    int rc = 0;
    for (size_t i = 0; i < g->n_tenants && !rc; i++) {
        const char *topic = g->tenants[i].reply_topic;
        const rd_kafka_metadata_t *md;
        rd_kafka_resp_err_t e = topic_metadata(g, topic, &md);
        for (int p = 0; !e && p < md->topics[0].partition_cnt; p++) {
            int64_t lo, hi;
            int32_t id = md->topics[0].partitions[p].id;
            e = rd_kafka_query_watermark_offsets(g->consumer, topic, id, &lo, &hi,
                                                 STARTUP_TIMEOUT_MS);
            if (!e)
                rd_kafka_topic_partition_list_add(parts, topic, id)->offset = hi;
        }
        if (md)
            rd_kafka_metadata_destroy(md);
        if (e) {
            svc_errf(err, errlen, "reply topic %s: %s", topic, rd_kafka_err2str(e));
            rc = -1;
        }
    }
    if (!rc) {
        rd_kafka_resp_err_t e = rd_kafka_assign(g->consumer, parts);
        if (e) {
            svc_errf(err, errlen, "assigning the reply topics: %s", rd_kafka_err2str(e));
            rc = -1;
        }
    }
    rd_kafka_topic_partition_list_destroy(parts);
    return rc;
}

int gw_kafka_start(svc_gateway *g, char *err, size_t errlen)
{
    svc_producer_config pc = {.brokers = g->cfg.kafka.brokers, .kafka = g->cfg.kafka.props,
                              .n_kafka = g->cfg.kafka.n_props, .on_delivery = on_delivery,
                              .opaque = g};
    if (svc_producer_create(&pc, &g->producer, err, errlen) != SVC_KAFKA_OK)
        return -1;
    rd_kafka_conf_t *conf = consumer_conf(g, err, errlen);
    if (!conf)
        return -1;
    char why[512];
    if (!(g->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof why))) {
        rd_kafka_conf_destroy(conf);
        svc_errf(err, errlen, "reply reader: %s", why);
        return -1;
    }
    if ((g->cfg.gateway.create_reply_topics && create_reply_topics(g, err, errlen)) ||
        assign_reply_topics(g, err, errlen))
        return -1;
    rd_kafka_poll_set_consumer(g->consumer);
    g->replies = rd_kafka_queue_get_consumer(g->consumer);
    if (svc_wake_pipe(g->wake)) {
        svc_errf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    static const char wake_byte[] = "1";
    rd_kafka_queue_io_event_enable(g->replies, g->wake[1], wake_byte, 1);
    g->wake_ev = event_new(g->base, g->wake[0], EV_READ | EV_PERSIST, on_wake, g);
    if (!g->wake_ev || event_add(g->wake_ev, NULL)) {
        svc_errf(err, errlen, "event loop: out of memory");
        return -1;
    }
    /* Records may have arrived before the pipe was wired. */
    event_active(g->wake_ev, EV_READ, 0);
    return 0;
}

bool gw_ready(const svc_gateway *g)
{
    return g->consumer && !svc_producer_fatal(g->producer, NULL, 0);
}

