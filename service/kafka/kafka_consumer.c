/* svc_consumer: the consumer-group member of the worker (kafka.h).
 *
 * @locality Kafka thread, for every function here except the message
 *           helpers (any thread holding the message) and svc_consumer_fatal
 *           (any); librdkafka calls the callbacks from inside
 *           rd_kafka_consumer_poll and rd_kafka_consumer_close, that is, on
 *           the Kafka thread too. */
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kafka/kafka_conf.h"
#include "log.h"

/* A partition of the assignment, as librdkafka's pausing needs it (see
 * "pausing in librdkafka" below). */
typedef struct assigned_part {
    int32_t topic_id, partition;
    bool started; /* it handed out a record in this assignment */
} assigned_part;

struct svc_consumer {
    rd_kafka_t *rk;          /* owned */
    svc_offsets *offsets;    /* owned; touched only on the Kafka thread */
    char **topics;           /* owned copies; index = topic_id */
    size_t n_topics;
    svc_consumer_events ev;
    bool *paused;            /* owned, per topic: the backpressure intent */
    int n_paused_parts;      /* assigned partitions paused now */
    assigned_part *parts;    /* owned: the assignment's partitions of our topics */
    size_t n_parts, parts_cap;
    bool closed;
    atomic_bool failed;      /* out of memory inside a rebalance: process-level */
    svc_offset_ticket *pending; /* owned scratch for on_revoke */
    size_t pending_cap;
    /* Records of a paused topic that librdkafka delivered anyway (the first
     * of a partition not paused in librdkafka yet, see "pausing in
     * librdkafka"), owned, in arrival order: handed out first once their
     * topic is resumed, dropped with their partition. */
    rd_kafka_message_t **held;
    size_t n_held, held_cap;
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

int svc_consumer_paused_partitions(const svc_consumer *c) { return c->n_paused_parts; }

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

/* ---- pausing in librdkafka ----------------------------------------------------
 *
 * librdkafka 2.0.2 orders a partition's operations (fetch start and stop,
 * pause, resume) by a version drawn before each is queued, and drops one
 * that arrives after a newer one. Its own thread starts a partition's
 * fetcher some time after the assignment, once the committed offset is
 * known: a pause or resume from this thread that draws its version after
 * that start's and is queued before it makes the start stale, and the
 * partition never fetches, with no error (librdkafka issues 2190 and 5591).
 * The pause librdkafka puts on every assigned partition when a rebalance
 * begins races a resume from here the same way.
 *
 * So librdkafka is asked to pause or resume only a started partition: one
 * that has handed out a record in this assignment, so that its fetcher runs.
 * A paused topic's partition that has not started keeps fetching; its first
 * record is held (see below) and pauses it, so a pause holds at most one
 * record of such a partition. Inside a rebalance callback (librdkafka waits
 * for it, and queued its own pause before calling it) every started
 * partition is told its state again, which repairs a resume that pause made
 * stale; a started partition leaving the assignment is resumed, because
 * librdkafka keeps a partition's pause across unassign and assign. */

static assigned_part *find_part(svc_consumer *c, int32_t id, int32_t partition)
{
    for (size_t i = 0; i < c->n_parts; i++)
        if (c->parts[i].topic_id == id && c->parts[i].partition == partition)
            return &c->parts[i];
    return NULL;
}

/* Pause or resume `parts` in librdkafka. */
static svc_kafka_status pause_resume(svc_consumer *c, rd_kafka_topic_partition_list_t *parts,
                                     bool pause)
{
    rd_kafka_resp_err_t e = pause ? rd_kafka_pause_partitions(c->rk, parts)
                                  : rd_kafka_resume_partitions(c->rk, parts);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        svc_log(SVC_LOG_ERROR, pause ? "kafka.pause" : "kafka.resume", "%d partitions: %s",
                parts->cnt, rd_kafka_err2str(e));
        return SVC_KAFKA_ERR_KAFKA;
    }
    return SVC_KAFKA_OK;
}

/* Tell librdkafka the state of every started partition of topic `only`
 * (every topic when -1): paused as its topic, or resumed when it is in
 * `leaving` (may be NULL); those in `leaving` are then forgotten. */
static svc_kafka_status tell_started(svc_consumer *c, int32_t only,
                                     const rd_kafka_topic_partition_list_t *leaving)
{
    svc_kafka_status st = SVC_KAFKA_OK;
    rd_kafka_topic_partition_list_t *lists[2] = {rd_kafka_topic_partition_list_new(0),
                                                 rd_kafka_topic_partition_list_new(0)};
    size_t kept = 0;
    for (size_t i = 0; i < c->n_parts; i++) {
        assigned_part *ap = &c->parts[i];
        const char *topic = c->topics[ap->topic_id];
        bool leaves = leaving && rd_kafka_topic_partition_list_find(leaving, topic, ap->partition);
        if (ap->started && (only < 0 || ap->topic_id == only))
            rd_kafka_topic_partition_list_add(lists[!leaves && c->paused[ap->topic_id]], topic,
                                              ap->partition);
        if (!leaves)
            c->parts[kept++] = *ap;
    }
    c->n_parts = kept;
    for (int pause = 0; pause < 2; pause++) {
        if (lists[pause]->cnt && pause_resume(c, lists[pause], pause) != SVC_KAFKA_OK)
            st = SVC_KAFKA_ERR_KAFKA;
        rd_kafka_topic_partition_list_destroy(lists[pause]);
    }
    return st;
}

/* rd_kafka_assign(NULL) unassigns every partition, whatever the list a
 * revocation named (a failed rebalance's may not be the whole assignment). */
static void leave_all(svc_consumer *c)
{
    rd_kafka_topic_partition_list_t *all = rd_kafka_topic_partition_list_new((int)c->n_parts);
    for (size_t i = 0; i < c->n_parts; i++)
        rd_kafka_topic_partition_list_add(all, c->topics[c->parts[i].topic_id],
                                          c->parts[i].partition);
    tell_started(c, -1, all);
    rd_kafka_topic_partition_list_destroy(all);
}

/* librdkafka handed out a record of ap: the partition has started; paused
 * when its topic is. A record that arrives after the partition was paused
 * means librdkafka dropped that pause (the rebalance race above), so each
 * asks again. */
static void part_delivered(svc_consumer *c, assigned_part *ap)
{
    ap->started = true;
    if (!c->paused[ap->topic_id])
        return;
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, c->topics[ap->topic_id], ap->partition);
    pause_resume(c, list, true);
    rd_kafka_topic_partition_list_destroy(list);
}

/* Count the assigned partitions paused now (the paused-partitions gauge),
 * after the assignment or an intent changed. */
static void recount_paused(svc_consumer *c)
{
    int n = 0;
    for (size_t i = 0; i < c->n_parts; i++)
        n += c->paused[c->parts[i].topic_id];
    c->n_paused_parts = n;
}

/* ---- records held while their topic is paused ------------------------------- */

/* Hold rkm (of a paused topic); false when there is no memory for it, and
 * the caller hands it out as before the pause. */
static bool hold(svc_consumer *c, rd_kafka_message_t *rkm)
{
    if (c->n_held == c->held_cap) {
        size_t cap = c->held_cap ? 2 * c->held_cap : 16;
        rd_kafka_message_t **h = realloc(c->held, cap * sizeof *h);
        if (!h)
            return false;
        c->held = h;
        c->held_cap = cap;
    }
    c->held[c->n_held++] = rkm;
    return true;
}

/* The first held record whose topic is no longer paused, taken out; NULL
 * when there is none. Records of one partition keep their order. */
static rd_kafka_message_t *take_held(svc_consumer *c)
{
    for (size_t i = 0; i < c->n_held; i++) {
        rd_kafka_message_t *rkm = c->held[i];
        if (c->paused[topic_id(c, rd_kafka_topic_name(rkm->rkt))])
            continue;
        memmove(c->held + i, c->held + i + 1, (c->n_held - i - 1) * sizeof *c->held);
        c->n_held--;
        return rkm;
    }
    return NULL;
}

/* Drop the held records of `parts` (every one when NULL): they are not
 * this consumer's to hand out any more, and, unfinished, the partition's
 * next owner reads them again. */
static void drop_held(svc_consumer *c, const rd_kafka_topic_partition_list_t *parts)
{
    size_t kept = 0;
    for (size_t i = 0; i < c->n_held; i++) {
        rd_kafka_message_t *rkm = c->held[i];
        if (!parts || rd_kafka_topic_partition_list_find(parts, rd_kafka_topic_name(rkm->rkt),
                                                         rkm->partition))
            rd_kafka_message_destroy(rkm);
        else
            c->held[kept++] = rkm;
    }
    c->n_held = kept;
}

/* ---- rebalance --------------------------------------------------------------- */

/* @locality Kafka thread, inside rd_kafka_consumer_poll or _close. */
static void on_assign(svc_consumer *c, rd_kafka_topic_partition_list_t *parts, bool cooperative)
{
    if (!cooperative)
        c->n_parts = 0; /* rd_kafka_assign replaces the assignment: every partition restarts */
    if (c->n_parts + (size_t)parts->cnt > c->parts_cap) {
        size_t cap = c->n_parts + (size_t)parts->cnt;
        assigned_part *p = realloc(c->parts, cap * sizeof *p);
        if (p) {
            c->parts = p;
            c->parts_cap = cap;
        } else {
            c->failed = true;
        }
    }
    for (int i = 0; i < parts->cnt; i++) {
        int32_t id = topic_id(c, parts->elems[i].topic);
        if (id < 0)
            continue; /* not ours: never handed out, see svc_consumer_poll */
        if (svc_offsets_assign(c->offsets, id, parts->elems[i].partition) != SVC_OFFSETS_OK)
            c->failed = true;
        if (c->n_parts < c->parts_cap && !find_part(c, id, parts->elems[i].partition))
            c->parts[c->n_parts++] = (assigned_part){id, parts->elems[i].partition, false};
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
    /* The new partitions have not started: paused when their first record
     * comes. The kept ones are told their state again. */
    tell_started(c, -1, NULL);
    recount_paused(c);
    svc_log(SVC_LOG_INFO, "kafka.assign", "%d partitions assigned (%s), %d paused", parts->cnt,
            cooperative ? "incremental" : "eager", c->n_paused_parts);
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
    drop_held(c, parts);
    if (cooperative) {
        tell_started(c, -1, parts);
        rd_kafka_error_t *e = rd_kafka_incremental_unassign(c->rk, parts);
        if (e) {
            svc_log(SVC_LOG_ERROR, "kafka.revoke", "incremental unassign: %s",
                    rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
    } else {
        leave_all(c);
        rd_kafka_assign(c->rk, NULL);
    }
    recount_paused(c);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    svc_consumer *c = opaque;
    bool cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    switch (err) {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
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
    if (c->rk) {
        svc_consumer_close(c, NULL, 0);
        drop_held(c, NULL);
        rd_kafka_destroy(c->rk);
    }
    free(c->held);
    free(c->parts);
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
        c->topics = calloc(cfg->n_topics, sizeof *c->topics);
        c->paused = calloc(cfg->n_topics, sizeof *c->paused);
    }
    if (!c || !c->topics || !c->paused || !(c->offsets = svc_offsets_create())) {
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
    /* One queue for messages, rebalances and errors: rd_kafka_consumer_poll
     * serves everything, and rd_kafka_poll is never called on the consumer
     * (in 2.0.2 it would also reset the max.poll.interval.ms timer). */
    rd_kafka_poll_set_consumer(c->rk);

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
 * started: its offset is not stored, and the next owner gets it. */
#define LEAVE_POLL_MS 100
#define LEAVE_MAX_MS 10000

static void leave_subscription(svc_consumer *c)
{
    rd_kafka_resp_err_t e = rd_kafka_unsubscribe(c->rk);
    if (e) {
        svc_log(SVC_LOG_WARN, "kafka.close", "unsubscribe: %s", rd_kafka_err2str(e));
        return;
    }
    long long deadline = svc_now_ms() + LEAVE_MAX_MS;
    for (;;) {
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(c->rk, LEAVE_POLL_MS);
        if (rkm)
            rd_kafka_message_destroy(rkm);
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

svc_kafka_status svc_consumer_poll(svc_consumer *c, int timeout_ms, svc_kafka_msg *msg)
{
    memset(msg, 0, sizeof *msg);
    if (c->closed || svc_consumer_fatal(c, NULL, 0))
        return SVC_KAFKA_ERR_FATAL;
    rd_kafka_message_t *rkm = take_held(c);
    bool fresh = !rkm;
    if (fresh)
        rkm = rd_kafka_consumer_poll(c->rk, timeout_ms);
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
    bool held = id >= 0 && c->paused[id] && hold(c, rkm);
    if (held)
        svc_log(SVC_LOG_DEBUG, "kafka.hold", "%s [%d] offset %lld held: its topic is paused",
                topic, (int)rkm->partition, (long long)rkm->offset);
    assigned_part *ap = fresh && id >= 0 ? find_part(c, id, rkm->partition) : NULL;
    if (ap)
        part_delivered(c, ap);
    if (held)
        return SVC_KAFKA_NO_MESSAGE;
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

/* Set the intent of topic `only` (every topic when -1) and apply it to the
 * assignment. */
static svc_kafka_status set_paused(svc_consumer *c, int32_t only, bool pause)
{
    bool changed = false;
    for (size_t i = 0; i < c->n_topics; i++)
        if ((only < 0 || (size_t)only == i) && c->paused[i] != pause) {
            c->paused[i] = pause;
            changed = true;
        }
    if (!changed)
        return SVC_KAFKA_OK;
    svc_kafka_status st = tell_started(c, only, NULL);
    recount_paused(c);
    svc_log(SVC_LOG_INFO, pause ? "kafka.pause" : "kafka.resume", "%s %s, %d partitions paused",
            only < 0 ? "every topic" : c->topics[only], pause ? "paused" : "resumed",
            c->n_paused_parts);
    return st;
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
