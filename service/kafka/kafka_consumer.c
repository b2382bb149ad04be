/* svc_consumer: the consumer-group member of the worker (kafka.h).
 *
 * @locality Kafka thread, for every function here except the message
 *           helpers (any thread holding the message) and svc_consumer_fatal
 *           (any); librdkafka calls the callbacks from inside
 *           rd_kafka_consumer_poll and rd_kafka_consumer_close, that is, on
 *           the Kafka thread too. */
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kafka/kafka_conf.h"
#include "log.h"

struct svc_consumer {
    rd_kafka_t *rk;          /* owned */
    svc_offsets *offsets;    /* owned; touched only on the Kafka thread */
    char **topics;           /* owned copies; index = topic_id */
    size_t n_topics;
    svc_consumer_events ev;
    bool *paused;            /* owned, per topic: its queue is not read (backpressure) */
    int *n_assigned;         /* owned, per topic: its partitions in the assignment */
    /* Owned, per topic: the queue its partitions' records go to (see "one
     * queue per topic" below). */
    rd_kafka_queue_t **queues;
    int wake[2];             /* pipe librdkafka writes to when one of those queues fills */
    size_t next_topic;       /* the topic queue read first by the next poll */
    bool synced;             /* the group answered a SyncGroup: an assignment came */
    bool closed;
    atomic_bool failed;      /* out of memory inside a rebalance: process-level */
    svc_offset_ticket *pending; /* owned scratch for on_revoke */
    size_t pending_cap;
};

/* ---- messages ---------------------------------------------------------------- */

bool svc_kafka_msg_header(const svc_kafka_msg *m, const char *name, const void **value,
                          size_t *len)
{
    rd_kafka_headers_t *hdrs = m->headers;
    if (m->rkm && rd_kafka_message_headers(m->rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return false;
    return hdrs && rd_kafka_header_get_last(hdrs, name, value, len) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

bool svc_kafka_header_u32(rd_kafka_headers_t *hs, const char *name, uint32_t *out)
{
    const void *v;
    size_t n;
    char buf[16]; /* UINT32_MAX has 10 digits */
    if (!hs || rd_kafka_header_get_last(hs, name, &v, &n) || !v || n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, v, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    unsigned long x = strtoul(buf, &end, 10);
    if (errno || *end || x > UINT32_MAX || !isdigit((unsigned char)buf[0]))
        return false;
    *out = (uint32_t)x;
    return true;
}

void svc_kafka_msg_release(svc_kafka_msg *m)
{
    if (m->rkm)
        rd_kafka_message_destroy(m->rkm);
    if (m->headers)
        rd_kafka_headers_destroy(m->headers);
    free(m->copy);
    m->rkm = NULL;
    m->headers = NULL;
    m->copy = NULL;
    m->topic = NULL;
    m->key = m->value = NULL;
    m->key_len = m->value_len = m->value_full_len = m->dropped_meta = 0;
}

svc_kafka_status svc_kafka_msg_detach(svc_kafka_msg *m, size_t max_value)
{
    if (!m->rkm)
        return SVC_KAFKA_OK;
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(m->rkm, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
        hdrs = NULL;
    size_t meta = m->key_len + svc_kafka_headers_bytes(hdrs);
    bool keep_meta = meta <= SVC_DLT_META_MAX;
    size_t topic_len = strlen(m->topic);
    size_t key_len = keep_meta ? m->key_len : 0;
    size_t value_len = m->value_len < max_value ? m->value_len : max_value;
    char *copy = malloc(topic_len + 1 + key_len + value_len + 1);
    rd_kafka_headers_t *kept = keep_meta && hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
    if (!copy || (keep_meta && hdrs && !kept)) {
        free(copy);
        if (kept)
            rd_kafka_headers_destroy(kept);
        svc_kafka_msg_release(m);
        return SVC_KAFKA_ERR_NOMEM;
    }
    memcpy(copy, m->topic, topic_len + 1);
    char *key = copy + topic_len + 1, *value = key + key_len;
    if (key_len)
        memcpy(key, m->key, key_len);
    if (value_len)
        memcpy(value, m->value, value_len);
    size_t full = m->value_len;
    bool had_key = m->key != NULL;
    rd_kafka_message_destroy(m->rkm);
    m->rkm = NULL;
    m->copy = copy;
    m->headers = kept;
    m->topic = copy;
    m->key = keep_meta && had_key ? key : NULL;
    m->key_len = key_len;
    m->value = value_len ? value : NULL;
    m->value_len = value_len;
    m->value_full_len = full;
    m->dropped_meta = keep_meta ? 0 : meta;
    return SVC_KAFKA_OK;
}

/* ---- helpers ----------------------------------------------------------------- */

static int32_t topic_id(const svc_consumer *c, const char *topic)
{
    for (size_t i = 0; i < c->n_topics; i++)
        if (!strcmp(c->topics[i], topic))
            return (int32_t)i;
    return -1;
}

bool svc_consumer_paused(const svc_consumer *c)
{
    for (size_t i = 0; i < c->n_topics; i++)
        if (!c->paused[i])
            return false;
    return true;
}

bool svc_consumer_fatal(svc_consumer *c, char *err, size_t errlen)
{
    char buf[512];
    if (rd_kafka_fatal_error(c->rk, buf, sizeof buf) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_FATAL, "%s", buf);
        return true;
    }
    if (c->failed) {
        svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_FATAL,
                       "out of memory while tracking a partition assignment");
        return true;
    }
    return false;
}

/* ---- one queue per topic ---------------------------------------------------
 *
 * librdkafka stops fetching a partition while the queue its records go to
 * holds queued.min.messages records (or queued.max.messages.kbytes), and
 * its broker thread looks again only when something else wakes it, at the
 * latest a second later (2.0.2's broker loop; fetch.queue.backoff.ms since
 * 2.3.0). With every partition's records in the one consumer queue, a
 * tenant whose records wait unread (a flood at its max_in_flight) filled that
 * queue and stopped every tenant's fetching for up to a second at a time:
 * the quiet tenant of bench_fair_share waited 48 to 51 times as long under a
 * flood of 1500 requests, every request on the broker loop's second.
 *
 * So each topic's partitions feed a queue of their own (a tenant's request
 * topic is its queue). The pre-fetch limits then count per topic: unread
 * records stop only their own topic's fetching. Pausing a topic is not
 * reading its queue, and librdkafka's pause is never asked: that also keeps
 * clear of 2.0.2's pause races (a pause or resume whose version is drawn
 * around a fetch start makes the start stale, and the partition never
 * fetches: librdkafka issues 2190 and 5591), and a resumed topic's
 * prefetched records are read at once instead of fetched again.
 *
 * The forwarding is the application's: librdkafka keeps it across the fetch
 * start, and the fetch stop of an unassign clears it, so each assignment
 * sets it, in the rebalance callback, before librdkafka starts the
 * partitions. A record of ours that still reaches the consumer queue (the
 * forwarding was lost) routes its partition again and is handed out as it
 * came. One pipe wakes the poll: librdkafka writes to it when a queue it
 * watches goes from empty to non-empty. */

static const char wake_byte = 1;

/* Route partition `partition` of topic `id` to the topic's queue. */
static void route(svc_consumer *c, int32_t id, int32_t partition)
{
    rd_kafka_queue_t *q = rd_kafka_queue_get_partition(c->rk, c->topics[id], partition);
    if (!q) {
        svc_log(SVC_LOG_ERROR, "kafka.route", "%s [%d]: no partition queue", c->topics[id],
                (int)partition);
        return;
    }
    rd_kafka_queue_forward(q, c->queues[id]);
    rd_kafka_queue_destroy(q);
}

/* The assigned partitions of paused topics (the paused-partitions gauge). */
int svc_consumer_paused_partitions(const svc_consumer *c)
{
    int n = 0;
    for (size_t i = 0; i < c->n_topics; i++)
        n += c->paused[i] ? c->n_assigned[i] : 0;
    return n;
}

int svc_consumer_prefetched(const svc_consumer *c, const char *topic)
{
    const int id = topic_id(c, topic);
    return id < 0 ? -1 : (int)rd_kafka_queue_length(c->queues[id]);
}

/* Wait up to ms for a watched queue to fill; empties the pipe. */
static void wait_wake(svc_consumer *c, int ms)
{
    struct pollfd pfd = {.fd = c->wake[0], .events = POLLIN};
    if (poll(&pfd, 1, ms) > 0)
        svc_wake_pipe_drain(c->wake[0]);
}

/* ---- rebalance --------------------------------------------------------------- */

/* @locality Kafka thread, inside rd_kafka_consumer_poll or _close. */
static void on_assign(svc_consumer *c, rd_kafka_topic_partition_list_t *parts, bool cooperative)
{
    if (!cooperative) /* rd_kafka_assign replaces the assignment */
        memset(c->n_assigned, 0, c->n_topics * sizeof *c->n_assigned);
    for (int i = 0; i < parts->cnt; i++) {
        int32_t id = topic_id(c, parts->elems[i].topic);
        if (id < 0)
            continue; /* not ours: never handed out, see svc_consumer_poll */
        if (svc_offsets_assign(c->offsets, id, parts->elems[i].partition) != SVC_OFFSETS_OK)
            c->failed = true;
        route(c, id, parts->elems[i].partition);
        c->n_assigned[id]++;
    }
    if (cooperative) {
        rd_kafka_error_t *e = rd_kafka_incremental_assign(c->rk, parts);
        if (e) {
            svc_log(SVC_LOG_ERROR, "kafka.assign", "incremental assign: %s",
                    rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
    } else {
        rd_kafka_resp_err_t e = rd_kafka_assign(c->rk, parts);
        if (e)
            svc_log(SVC_LOG_ERROR, "kafka.assign", "assign: %s", rd_kafka_err2str(e));
    }
    svc_log(SVC_LOG_INFO, "kafka.assign", "%d partitions assigned (%s), %d paused", parts->cnt,
            cooperative ? "incremental" : "eager", svc_consumer_paused_partitions(c));
    if (c->ev.on_assign)
        c->ev.on_assign(c->ev.opaque, parts);
}

/* @locality Kafka thread, inside rd_kafka_consumer_poll or _close. */
static void on_revoke(svc_consumer *c, rd_kafka_topic_partition_list_t *parts, bool cooperative)
{
    bool lost = rd_kafka_assignment_lost(c->rk);
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0 counts and sizes the scratch buffer; pass 1 fills it. */
        n = 0;
        for (int i = 0; i < parts->cnt; i++) {
            int32_t id = topic_id(c, parts->elems[i].topic);
            if (id < 0)
                continue;
            /* Nothing pending yet leaves c->pending NULL, and NULL + 0 is
             * undefined in C. */
            bool fill = pass && c->pending;
            n += svc_offsets_pending(c->offsets, id, parts->elems[i].partition,
                                     fill ? c->pending + n : NULL, fill ? c->pending_cap - n : 0);
        }
        if (pass == 0 && n > c->pending_cap) {
            svc_offset_ticket *p = realloc(c->pending, n * sizeof *p);
            if (!p) {
                c->failed = true;
                n = 0;
                break;
            }
            c->pending = p;
            c->pending_cap = n;
        }
    }
    svc_log(lost ? SVC_LOG_WARN : SVC_LOG_INFO, "kafka.revoke",
            "%d partitions %s (%s), %zu unfinished messages on them", parts->cnt,
            lost ? "lost" : "revoked", cooperative ? "incremental" : "eager", n);
    if (c->ev.on_revoke)
        c->ev.on_revoke(c->ev.opaque, parts, c->pending, n, lost);
    for (int i = 0; i < parts->cnt; i++) {
        int32_t id = topic_id(c, parts->elems[i].topic);
        if (id >= 0)
            svc_offsets_revoke(c->offsets, id, parts->elems[i].partition);
    }
    if (cooperative) {
        for (int i = 0; i < parts->cnt; i++) {
            int32_t id = topic_id(c, parts->elems[i].topic);
            if (id >= 0 && c->n_assigned[id] > 0)
                c->n_assigned[id]--;
        }
        rd_kafka_error_t *e = rd_kafka_incremental_unassign(c->rk, parts);
        if (e) {
            svc_log(SVC_LOG_ERROR, "kafka.revoke", "incremental unassign: %s",
                    rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
    } else {
        /* rd_kafka_assign(NULL) unassigns every partition, whatever the list
         * a revocation named (a failed rebalance's may not be the whole
         * assignment). */
        memset(c->n_assigned, 0, c->n_topics * sizeof *c->n_assigned);
        rd_kafka_assign(c->rk, NULL);
    }
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    svc_consumer *c = opaque;
    bool cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    switch (err) {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
        c->synced = true;
        on_assign(c, parts, cooperative);
        break;
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
        on_revoke(c, parts, cooperative);
        break;
    default:
        /* librdkafka's documented answer to a failed rebalance: drop everything. */
        svc_log(SVC_LOG_ERROR, "kafka.rebalance", "rebalance failed: %s", rd_kafka_err2str(err));
        on_revoke(c, parts, false);
        break;
    }
}

/* Global consumer errors (broker transport, all brokers down, fatal).
 * Served by rd_kafka_consumer_poll, so on the Kafka thread. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    (void)opaque;
    svc_kafka_log_error(rk, "consumer", err, reason);
}

/* ---- lifecycle --------------------------------------------------------------- */

void svc_consumer_destroy(svc_consumer *c)
{
    if (!c)
        return;
    if (c->rk)
        svc_consumer_close(c, NULL, 0);
    for (size_t i = 0; c->queues && i < c->n_topics; i++)
        if (c->queues[i])
            rd_kafka_queue_destroy(c->queues[i]);
    if (c->rk)
        rd_kafka_destroy(c->rk);
    /* After rd_kafka_destroy: librdkafka may write to the pipe until then. */
    for (int i = 0; i < 2; i++)
        if (c->wake[i] >= 0)
            close(c->wake[i]);
    free(c->queues);
    free(c->n_assigned);
    for (size_t i = 0; i < c->n_topics; i++)
        free(c->topics[i]);
    free(c->topics);
    free(c->paused);
    free(c->pending);
    svc_offsets_destroy(c->offsets);
    free(c);
}

/* Statistics, on the Kafka thread inside svc_consumer_poll. Returning 0
 * lets librdkafka free the JSON. */
static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
    (void)rk;
    svc_consumer *c = opaque;
    c->ev.on_stats(c->ev.opaque, json, len);
    return 0;
}

svc_kafka_status svc_consumer_create(const svc_consumer_config *cfg, svc_consumer **out,
                                     char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg->group_id || !*cfg->group_id)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "kafka.group.id: missing");
    if (cfg->n_topics == 0 || cfg->n_topics > INT32_MAX)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "no topics to subscribe to");

    const svc_kafka_kv defaults[] = {
        {"client.id", "mllama-worker"},
        {"bootstrap.servers", cfg->brokers},
        {"group.id", cfg->group_id},
        /* Partitions mid-generation stay put when a worker joins (service/README.md §5). */
        {"partition.assignment.strategy", "cooperative-sticky"},
        /* A new group must not skip the requests already queued. */
        {"auto.offset.reset", "earliest"},
        /* The pre-fetch queue holds requests this worker cannot start yet and
         * other workers cannot take until a rebalance: keep it small. */
        {"queued.min.messages", "1000"},
        {"queued.max.messages.kbytes", "16384"},
        {"enable.partition.eof", "false"},
        /* Only read when events.on_stats is set (the lag metric). */
        {"statistics.interval.ms", cfg->events.on_stats ? "15000" : "0"},
    };
    static const svc_kafka_fixed fixed[] = {
        {"enable.auto.offset.store", "false",
         "offsets are stored when a request's final reply is delivered"},
        {"enable.auto.commit", "true", "the stored offsets are committed in the background"},
    };
    rd_kafka_conf_t *conf;
    svc_kafka_status st = svc_kafka_conf_build(defaults, sizeof defaults / sizeof defaults[0],
                                               cfg->kafka, cfg->n_kafka, fixed,
                                               sizeof fixed / sizeof fixed[0], &conf, err, errlen);
    if (st != SVC_KAFKA_OK)
        return st;

    svc_consumer *c = calloc(1, sizeof *c);
    if (c) {
        c->wake[0] = c->wake[1] = -1;
        c->topics = calloc(cfg->n_topics, sizeof *c->topics);
        c->paused = calloc(cfg->n_topics, sizeof *c->paused);
        c->n_assigned = calloc(cfg->n_topics, sizeof *c->n_assigned);
        c->queues = calloc(cfg->n_topics, sizeof *c->queues);
    }
    if (!c || !c->topics || !c->paused || !c->n_assigned || !c->queues ||
        !(c->offsets = svc_offsets_create())) {
        rd_kafka_conf_destroy(conf);
        svc_consumer_destroy(c);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory");
    }
    c->ev = cfg->events;
    for (size_t i = 0; i < cfg->n_topics; i++, c->n_topics++)
        if (!cfg->topics[i] || !(c->topics[i] = strdup(cfg->topics[i]))) {
            rd_kafka_conf_destroy(conf);
            svc_consumer_destroy(c);
            return cfg->topics[i]
                       ? svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "out of memory")
                       : svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "topics[%zu]: missing",
                                        i);
        }

    rd_kafka_conf_set_opaque(conf, c);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    if (cfg->events.on_stats)
        rd_kafka_conf_set_stats_cb(conf, stats_cb);
    char why[512];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof why);
    if (!c->rk) {
        rd_kafka_conf_destroy(conf);
        svc_consumer_destroy(c);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_CONFIG, "consumer: %s", why);
    }
    /* Rebalances and errors in the consumer queue, served by
     * rd_kafka_consumer_poll; rd_kafka_poll is never called on the consumer
     * (in 2.0.2 it would also reset the max.poll.interval.ms timer). The
     * records go to their topic's queue ("one queue per topic"). */
    rd_kafka_poll_set_consumer(c->rk);
    if (svc_wake_pipe(c->wake)) {
        int e = errno;
        svc_consumer_destroy(c);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_NOMEM, "pipe: %s", strerror(e));
    }
    /* The wake-up stays on the consumer queue after its handle goes. */
    rd_kafka_queue_t *events = rd_kafka_queue_get_consumer(c->rk);
    if (!events) {
        svc_consumer_destroy(c);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "no consumer queue");
    }
    rd_kafka_queue_io_event_enable(events, c->wake[1], &wake_byte, sizeof wake_byte);
    rd_kafka_queue_destroy(events);
    for (size_t i = 0; i < c->n_topics; i++) {
        c->queues[i] = rd_kafka_queue_new(c->rk);
        rd_kafka_queue_io_event_enable(c->queues[i], c->wake[1], &wake_byte, sizeof wake_byte);
    }

    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new((int)c->n_topics);
    for (size_t i = 0; i < c->n_topics; i++)
        rd_kafka_topic_partition_list_add(subs, c->topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, subs);
    rd_kafka_topic_partition_list_destroy(subs);
    if (e) {
        svc_consumer_destroy(c);
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "subscribe: %s",
                              rd_kafka_err2str(e));
    }
    svc_log(SVC_LOG_INFO, "kafka.subscribe", "group %s, %zu topics, first %s", cfg->group_id,
            c->n_topics, c->topics[0]);
    *out = c;
    return SVC_KAFKA_OK;
}

/* Leaving: the subscription first, then the group. librdkafka before 2.4
 * can hang for good in rd_kafka_consumer_close() when an incremental
 * assignment arrives while it closes (confluentinc/librdkafka#4527; Debian 12
 * ships 2.0.2), and a worker drained soon after it joined is in exactly that
 * window. Unsubscribing ends the join under way, and the polls serve what
 * was already queued (an assignment, then the revocation, whose offsets
 * auto-commit sends) as any rebalance is served; the close then has nothing
 * assigned and nothing coming. A message still delivered here was never
 * started: its offset is not stored, and the next owner gets it.
 *
 * Before 2.3.0, rd_kafka_destroy aborts ("rd_kafka_sticky_assignor_state_
 * destroy: Assertion `assignor_state' failed", librdkafka#4381) when the
 * group answered the member's JoinGroup (which picks the sticky assignor)
 * but never a SyncGroup (whose assignment creates the assignor's state): a
 * worker drained in that gap, as test_scaling's scale-in once did, crashed
 * on its way out. Unsubscribing there makes librdkafka discard the
 * SyncGroup's answer, so a member with an id (its JoinGroup answered) and no
 * assignment yet first waits for its assignment (at most LEAVE_MAX_MS). */
#define LEAVE_POLL_MS 100
#define LEAVE_MAX_MS 10000

/* Serve the consumer queue for up to LEAVE_POLL_MS; a record delivered
 * here is dropped unstarted. */
static void leave_poll(svc_consumer *c)
{
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, LEAVE_POLL_MS);
    if (rkm)
        rd_kafka_message_destroy(rkm);
}

/* Whether the group has answered this member's JoinGroup (it has an id). */
static bool joined(svc_consumer *c)
{
    char *id = rd_kafka_memberid(c->rk);
    bool has = id && *id;
    rd_kafka_mem_free(c->rk, id);
    return has;
}

static void await_first_assignment(svc_consumer *c)
{
    for (long long deadline = svc_now_ms() + LEAVE_MAX_MS;
         !c->synced && joined(c) && svc_now_ms() < deadline;)
        leave_poll(c);
    if (!c->synced && joined(c))
        svc_log(SVC_LOG_WARN, "kafka.close", "no assignment after %d ms in the group",
                LEAVE_MAX_MS);
}

static void leave_subscription(svc_consumer *c)
{
    await_first_assignment(c);
    rd_kafka_resp_err_t e = rd_kafka_unsubscribe(c->rk);
    if (e) {
        svc_log(SVC_LOG_WARN, "kafka.close", "unsubscribe: %s", rd_kafka_err2str(e));
        return;
    }
    long long deadline = svc_now_ms() + LEAVE_MAX_MS;
    for (;;) {
        leave_poll(c);
        rd_kafka_topic_partition_list_t *parts = NULL;
        int left = rd_kafka_assignment(c->rk, &parts) ? 0 : parts->cnt;
        if (parts)
            rd_kafka_topic_partition_list_destroy(parts);
        if (left == 0)
            return;
        if (svc_now_ms() >= deadline) {
            svc_log(SVC_LOG_WARN, "kafka.close", "%d partitions still assigned after %d ms",
                    left, LEAVE_MAX_MS);
            return;
        }
    }
}

svc_kafka_status svc_consumer_close(svc_consumer *c, char *err, size_t errlen)
{
    if (c->closed)
        return SVC_KAFKA_OK;
    c->closed = true;
    leave_subscription(c);
    rd_kafka_resp_err_t e = rd_kafka_consumer_close(c->rk);
    if (e) {
        svc_log(SVC_LOG_WARN, "kafka.close", "consumer close: %s", rd_kafka_err2str(e));
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "consumer close: %s",
                              rd_kafka_err2str(e));
    }
    svc_log(SVC_LOG_INFO, "kafka.close", "consumer left the group");
    return SVC_KAFKA_OK;
}

/* ---- polling ----------------------------------------------------------------- */

/* A consumer event delivered as a message with err set. */
static void log_event(const rd_kafka_message_t *rkm)
{
    const char *topic = rkm->rkt ? rd_kafka_topic_name(rkm->rkt) : "-";
    svc_log(rkm->err == RD_KAFKA_RESP_ERR__MAX_POLL_EXCEEDED ? SVC_LOG_ERROR : SVC_LOG_WARN,
            "kafka.consumer_error", "%s [%d]: %s: %s", topic, (int)rkm->partition,
            rd_kafka_err2name(rkm->err), rd_kafka_message_errstr(rkm));
}

/* The next record or event without waiting: the consumer queue's first
 * (rebalance callbacks run inside), then the topic queues not paused, each
 * in turn from c->next_topic, one record each, so that no topic waits behind
 * another's backlog. NULL when every one of them is empty. */
static rd_kafka_message_t *next(svc_consumer *c)
{
    rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, 0);
    if (rkm) {
        int32_t id = rkm->err || !rkm->rkt ? -1 : topic_id(c, rd_kafka_topic_name(rkm->rkt));
        if (id >= 0) {
            svc_log(SVC_LOG_WARN, "kafka.route", "%s [%d] was not routed to its topic queue: "
                    "routed again", c->topics[id], (int)rkm->partition);
            route(c, id, rkm->partition);
        }
        return rkm;
    }
    for (size_t k = 0; k < c->n_topics; k++) {
        size_t i = (c->next_topic + k) % c->n_topics;
        if (c->paused[i] || !(rkm = rd_kafka_consume_queue(c->queues[i], 0)))
            continue;
        c->next_topic = (i + 1) % c->n_topics;
        return rkm;
    }
    return NULL;
}

svc_kafka_status svc_consumer_poll(svc_consumer *c, int timeout_ms, svc_kafka_msg *msg)
{
    memset(msg, 0, sizeof *msg);
    if (c->closed || svc_consumer_fatal(c, NULL, 0))
        return SVC_KAFKA_ERR_FATAL;
    rd_kafka_message_t *rkm;
    for (long long deadline = svc_now_ms() + timeout_ms; !(rkm = next(c));) {
        long long left = deadline - svc_now_ms();
        if (left <= 0 || svc_consumer_fatal(c, NULL, 0))
            break;
        wait_wake(c, (int)left);
    }
    if (svc_consumer_fatal(c, NULL, 0)) {
        if (rkm)
            rd_kafka_message_destroy(rkm);
        return SVC_KAFKA_ERR_FATAL;
    }
    if (!rkm)
        return SVC_KAFKA_NO_MESSAGE;
    if (rkm->err) {
        log_event(rkm);
        rd_kafka_message_destroy(rkm);
        return SVC_KAFKA_NO_MESSAGE;
    }

    const char *topic = rd_kafka_topic_name(rkm->rkt);
    int32_t id = topic_id(c, topic);
    svc_offsets_status st = id < 0 ? SVC_OFFSETS_NOT_ASSIGNED
                                   : svc_offsets_begin(c->offsets, id, rkm->partition,
                                                       rkm->offset, &msg->ticket);
    if (st != SVC_OFFSETS_OK) {
        svc_log(st == SVC_OFFSETS_DUPLICATE ? SVC_LOG_DEBUG : SVC_LOG_WARN, "kafka.drop",
                "%s [%d] offset %lld dropped: %s", topic, (int)rkm->partition,
                (long long)rkm->offset, svc_offsets_status_name(st));
        rd_kafka_message_destroy(rkm);
        return st == SVC_OFFSETS_NOMEM ? SVC_KAFKA_ERR_NOMEM : SVC_KAFKA_NO_MESSAGE;
    }
    rd_kafka_timestamp_type_t tstype;
    msg->rkm = rkm;
    msg->topic = topic;
    msg->partition = rkm->partition;
    msg->offset = rkm->offset;
    msg->timestamp_ms = rd_kafka_message_timestamp(rkm, &tstype);
    msg->broker_time = tstype == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME;
    msg->key = rkm->key;
    msg->key_len = rkm->key_len;
    msg->value = rkm->payload;
    msg->value_len = rkm->len;
    msg->copy = NULL;
    msg->headers = NULL;
    msg->value_full_len = rkm->len;
    msg->dropped_meta = 0;
    return SVC_KAFKA_OK;
}

/* ---- offsets and backpressure ------------------------------------------------ */

svc_kafka_status svc_consumer_finish(svc_consumer *c, const svc_offset_ticket *t, char *err,
                                     size_t errlen)
{
    int64_t commit;
    svc_offsets_status st = svc_offsets_finish(c->offsets, t, &commit);
    if (st == SVC_OFFSETS_NOT_ASSIGNED)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_STALE,
                              "partition %d of topic %d is no longer assigned", (int)t->partition,
                              (int)t->topic_id);
    if (st != SVC_OFFSETS_OK)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_INVALID, "offset %lld: %s",
                              (long long)t->offset, svc_offsets_status_name(st));
    if (commit < 0)
        return SVC_KAFKA_OK;

    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, c->topics[t->topic_id], t->partition)->offset = commit;
    rd_kafka_resp_err_t e = rd_kafka_offsets_store(c->rk, list);
    if (!e)
        e = list->elems[0].err;
    rd_kafka_topic_partition_list_destroy(list);
    if (e == RD_KAFKA_RESP_ERR__STATE)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_STALE,
                              "%s [%d] is no longer assigned", c->topics[t->topic_id],
                              (int)t->partition);
    if (e)
        return svc_kafka_fail(err, errlen, SVC_KAFKA_ERR_KAFKA, "offsets_store %s [%d] @%lld: %s",
                              c->topics[t->topic_id], (int)t->partition, (long long)commit,
                              rd_kafka_err2str(e));
    return SVC_KAFKA_OK;
}

/* Pause or resume topic `only` (every topic when -1): its queue is read or
 * not ("one queue per topic"). */
static svc_kafka_status set_paused(svc_consumer *c, int32_t only, bool pause)
{
    bool changed = false;
    for (size_t i = 0; i < c->n_topics; i++)
        if ((only < 0 || (size_t)only == i) && c->paused[i] != pause) {
            c->paused[i] = pause;
            changed = true;
        }
    if (changed)
        svc_log(SVC_LOG_INFO, pause ? "kafka.pause" : "kafka.resume",
                "%s %s, %d partitions paused", only < 0 ? "every topic" : c->topics[only],
                pause ? "paused" : "resumed", svc_consumer_paused_partitions(c));
    return SVC_KAFKA_OK;
}

svc_kafka_status svc_consumer_pause(svc_consumer *c)
{
    return set_paused(c, -1, true);
}

svc_kafka_status svc_consumer_resume(svc_consumer *c)
{
    return set_paused(c, -1, false);
}

svc_kafka_status svc_consumer_pause_topic(svc_consumer *c, const char *topic, bool pause)
{
    int32_t id = topic_id(c, topic);
    return id < 0 ? SVC_KAFKA_ERR_INVALID : set_paused(c, id, pause);
}
