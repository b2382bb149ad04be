/* Helpers shared by the Kafka integration and fault tests: a miniature
 * worker (consumer + producer + the loop of kafka.h) whose message handling
 * each test chooses, an independent librdkafka handle to read committed and
 * end offsets, and deadlines (proc_util.h's clock) so a broken test fails
 * instead of hanging. Everything runs on the test's main thread, which is
 * every worker's Kafka thread. */
#ifndef ML_TEST_KAFKA_TEST_H
#define ML_TEST_KAFKA_TEST_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kafka/kafka.h"
#include "log.h"
#include "kafka/mock_kafka.h"
#include "proc_util.h"

/* Group timings small enough for tests; the mock's rebalance rounds take
 * session.timeout.ms - 1 s (service/README.md §6). */
static const svc_kafka_kv kt_group_kv[] = {
    {"session.timeout.ms", "3000"},
    {"heartbeat.interval.ms", "300"},
    {"auto.commit.interval.ms", "200"},
    {"topic.metadata.refresh.interval.ms", "1000"},
};

/* Extra properties for every producer the helpers create (a test sets them
 * before starting workers and sources). */
static const svc_kafka_kv *kt_producer_kv;
static size_t kt_n_producer_kv;

/* ---- a miniature worker ------------------------------------------------------ */

/* What the worker does with each message it receives. */
typedef enum kt_policy {
    KT_FINISH_NOW,  /* nothing to send: finish at once */
    KT_REPLY,       /* produce a final reply; finish on its delivery report */
    KT_HOLD,        /* keep it in flight (a long generation) */
    KT_SENT,        /* the policy produced a record (kt_reply_ctx) that finishes it */
} kt_policy;

typedef struct kt_got {
    int32_t partition;
    int64_t offset;
    char key[32];
    svc_offset_ticket ticket;
    bool held; /* KT_HOLD: not finished yet */
} kt_got;

typedef struct kt_worker kt_worker;

/* ctx of a reply record: the message it finishes (the worker is the
 * producer's opaque). */
typedef struct kt_reply_ctx {
    svc_offset_ticket ticket;
} kt_reply_ctx;

struct kt_worker {
    const char *name;
    svc_consumer *c;
    svc_producer *p;
    const char *reply_topic;
    kt_policy (*policy)(kt_worker *w, const svc_kafka_msg *m); /* NULL: KT_FINISH_NOW */
    /* what happened */
    kt_got *got;
    size_t n_got, cap_got;
    int assigned;         /* partitions currently assigned */
    int max_assigned;
    int min_after_first;  /* lowest count after the first assignment, across revokes */
    bool had_assignment;
    uint64_t parts_mask;  /* bit p: partition p assigned (tests use < 64 partitions) */
    int n_assign_events, n_revoke_events, n_lost;
    size_t last_revoke_pending;
    svc_offset_ticket revoke_pending[64];
    int replies_sent, replies_delivered, reply_failures;
    int finish_ok, finish_stale, finish_other;
};

static inline void kt_on_assign(void *opaque, const rd_kafka_topic_partition_list_t *parts)
{
    kt_worker *w = opaque;
    w->assigned += parts->cnt;
    for (int i = 0; i < parts->cnt; i++)
        w->parts_mask |= 1ull << (parts->elems[i].partition & 63);
    if (w->assigned > w->max_assigned)
        w->max_assigned = w->assigned;
    if (!w->had_assignment)
        w->min_after_first = w->assigned;
    w->had_assignment = true;
    w->n_assign_events++;
}

static inline void kt_on_revoke(void *opaque, const rd_kafka_topic_partition_list_t *parts,
                                const svc_offset_ticket *pending, size_t n, bool lost)
{
    kt_worker *w = opaque;
    w->assigned -= parts->cnt;
    for (int i = 0; i < parts->cnt; i++)
        w->parts_mask &= ~(1ull << (parts->elems[i].partition & 63));
    if (w->assigned < w->min_after_first)
        w->min_after_first = w->assigned;
    w->n_revoke_events++;
    w->n_lost += lost;
    w->last_revoke_pending = n;
    for (size_t i = 0; i < n && i < sizeof w->revoke_pending / sizeof w->revoke_pending[0]; i++)
        w->revoke_pending[i] = pending[i];
    /* The requests stop: whatever was held is now abandoned. */
    for (size_t i = 0; i < w->n_got; i++)
        for (size_t j = 0; j < n; j++)
            if (w->got[i].held && w->got[i].ticket.epoch == pending[j].epoch &&
                w->got[i].ticket.offset == pending[j].offset &&
                w->got[i].ticket.partition == pending[j].partition)
                w->got[i].held = false;
}

static inline void kt_count_finish(kt_worker *w, svc_kafka_status st)
{
    if (st == SVC_KAFKA_OK)
        w->finish_ok++;
    else if (st == SVC_KAFKA_ERR_STALE)
        w->finish_stale++;
    else
        w->finish_other++;
}

static inline void kt_on_delivery(void *opaque, const svc_delivery *d)
{
    kt_worker *w = opaque;
    kt_reply_ctx *ctx = d->ctx;
    if (!ctx)
        return;
    if (d->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        w->replies_delivered++;
        kt_count_finish(w, svc_consumer_finish(w->c, &ctx->ticket, NULL, 0));
    } else {
        w->reply_failures++;
    }
    free(ctx);
}

/* Produce a final reply for `m` whose delivery finishes it. */
static inline svc_kafka_status kt_reply(kt_worker *w, const svc_kafka_msg *m)
{
    kt_reply_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx)
        return SVC_KAFKA_ERR_NOMEM;
    ctx->ticket = m->ticket;
    const svc_kafka_header h[] = {{"final", "1", 1}};
    svc_kafka_record r = {
        .topic = w->reply_topic,
        .partition = RD_KAFKA_PARTITION_UA,
        .key = m->key,
        .key_len = m->key_len,
        .value = "done",
        .value_len = 4,
        .headers = h,
        .n_headers = 1,
        .ctx = ctx,
    };
    char err[256];
    svc_kafka_status st = svc_producer_produce(w->p, &r, err, sizeof err);
    if (st != SVC_KAFKA_OK) {
        fprintf(stderr, "%s: reply: %s\n", w->name, err);
        free(ctx);
    } else {
        w->replies_sent++;
    }
    return st;
}

enum { KT_N_GROUP_KV = sizeof kt_group_kv / sizeof kt_group_kv[0], KT_MAX_EXTRA_KV = 8 };

/* kt_group_kv, then up to KT_MAX_EXTRA_KV of `extra` (may be NULL), which
 * so override it, into kv (KT_N_GROUP_KV + KT_MAX_EXTRA_KV entries);
 * returns how many were written. */
static inline size_t kt_group_kv_with(svc_kafka_kv *kv, const svc_kafka_kv *extra, size_t n_extra)
{
    memcpy(kv, kt_group_kv, sizeof kt_group_kv);
    size_t n = n_extra < KT_MAX_EXTRA_KV ? n_extra : KT_MAX_EXTRA_KV;
    for (size_t i = 0; i < n; i++)
        kv[KT_N_GROUP_KV + i] = extra[i];
    return KT_N_GROUP_KV + n;
}

/* Start a worker in `group` consuming `topic`. `extra` properties (may be
 * NULL) are applied after kt_group_kv, so they override it. */
static inline void kt_worker_start(kt_worker *w, const char *name, const char *bootstraps,
                                   const char *group, const char *topic, const char *reply_topic,
                                   const svc_kafka_kv *extra, size_t n_extra)
{
    memset(w, 0, sizeof *w);
    w->name = name;
    w->reply_topic = reply_topic;
    const char *topics[] = {topic};
    svc_kafka_kv kv[KT_N_GROUP_KV + KT_MAX_EXTRA_KV];
    const size_t n_kv = kt_group_kv_with(kv, extra, n_extra);
    svc_consumer_config cc = {
        .brokers = bootstraps,
        .group_id = group,
        .topics = topics,
        .n_topics = 1,
        .kafka = kv,
        .n_kafka = n_kv,
        .events = {.on_assign = kt_on_assign, .on_revoke = kt_on_revoke, .opaque = w},
    };
    char err[512];
    svc_kafka_status st = svc_consumer_create(&cc, &w->c, err, sizeof err);
    check(st == SVC_KAFKA_OK, "%s: consumer: %s", name, err);
    svc_producer_config pc = {.brokers = bootstraps, .kafka = kt_producer_kv,
                              .n_kafka = kt_n_producer_kv, .on_delivery = kt_on_delivery,
                              .opaque = w};
    st = svc_producer_create(&pc, &w->p, err, sizeof err);
    check(st == SVC_KAFKA_OK, "%s: producer: %s", name, err);
    if (!w->c || !w->p) {
        fprintf(stderr, "cannot continue without a worker\n");
        exit(1);
    }
}

/* One iteration of the worker loop (kafka.h), with poll timeout `ms`. */
static inline void kt_worker_step(kt_worker *w, int ms)
{
    svc_kafka_msg m;
    svc_kafka_status st = svc_consumer_poll(w->c, ms, &m);
    if (st == SVC_KAFKA_OK) {
        if (w->n_got == w->cap_got) {
            w->cap_got = w->cap_got ? w->cap_got * 2 : 64;
            w->got = realloc(w->got, w->cap_got * sizeof *w->got);
            if (!w->got)
                abort();
        }
        kt_got *g = &w->got[w->n_got++];
        memset(g, 0, sizeof *g);
        g->partition = m.partition;
        g->offset = m.offset;
        g->ticket = m.ticket;
        size_t kl = m.key_len < sizeof g->key - 1 ? m.key_len : sizeof g->key - 1;
        if (m.key)
            memcpy(g->key, m.key, kl);
        kt_policy pol = w->policy ? w->policy(w, &m) : KT_FINISH_NOW;
        switch (pol) {
        case KT_FINISH_NOW: kt_count_finish(w, svc_consumer_finish(w->c, &m.ticket, NULL, 0)); break;
        case KT_REPLY: kt_reply(w, &m); break;
        case KT_HOLD: g->held = true; break;
        case KT_SENT: break;
        }
        svc_kafka_msg_release(&m);
    } else if (st != SVC_KAFKA_NO_MESSAGE) {
        check(0, "%s: poll: %s", w->name, svc_kafka_status_name(st));
    }
    svc_producer_poll(w->p, 0);
}

/* Step every worker in turn (with a short poll each) until cond(arg) holds
 * or timeout_ms passes. Returns whether cond held. */
static inline bool kt_run_until(kt_worker **ws, int n, bool (*cond)(void *), void *arg,
                                int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    for (;;) {
        if (cond && cond(arg))
            return true;
        if (pu_now_ms() >= deadline)
            return cond == NULL;
        for (int i = 0; i < n; i++)
            kt_worker_step(ws[i], n > 1 ? 10 : 20);
    }
}

/* Finish a held message by replying (its delivery report finishes it). */
static inline void kt_release_held(kt_worker *w, size_t i)
{
    svc_kafka_msg fake = {.key = w->got[i].key, .key_len = strlen(w->got[i].key),
                          .ticket = w->got[i].ticket};
    w->got[i].held = false;
    kt_reply(w, &fake);
}

static inline void kt_worker_stop(kt_worker *w)
{
    char err[256];
    check(svc_producer_flush(w->p, 10000, err, sizeof err) == SVC_KAFKA_OK, "%s: flush: %s",
          w->name, err);
    check(svc_consumer_close(w->c, err, sizeof err) == SVC_KAFKA_OK, "%s: close: %s", w->name,
          err);
    svc_producer_destroy(w->p);
    svc_consumer_destroy(w->c);
    free(w->got);
    w->got = NULL;
    w->p = NULL;
    w->c = NULL;
}

/* ---- an independent view of the cluster ------------------------------------ */

/* A bare consumer (no subscription) for offset queries. */
static inline rd_kafka_t *kt_admin(const char *bootstraps, const char *group)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", group, err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "admin handle: %s\n", err);
        abort();
    }
    return rk;
}

/* Committed offsets of `group` for partitions 0..n-1 of topic (-1001 when
 * none). Returns false on a query error. */
static inline bool kt_committed(const char *bootstraps, const char *group, const char *topic,
                                int n, int64_t *out)
{
    rd_kafka_t *rk = kt_admin(bootstraps, group);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, topic, i);
    rd_kafka_resp_err_t e = rd_kafka_committed(rk, l, 10000);
    for (int i = 0; i < n; i++)
        out[i] = l->elems[i].offset;
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    if (e)
        fprintf(stderr, "committed: %s\n", rd_kafka_err2str(e));
    return e == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* End (high watermark) offsets of partitions 0..n-1. */
static inline bool kt_end_offsets(const char *bootstraps, const char *topic, int n, int64_t *out)
{
    rd_kafka_t *rk = kt_admin(bootstraps, "kt-watermarks");
    bool ok = true;
    for (int i = 0; i < n; i++) {
        int64_t lo = 0, hi = 0;
        ok = ok && !rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi, 10000);
        out[i] = hi;
    }
    rd_kafka_destroy(rk);
    return ok;
}

/* ---- a request source ----------------------------------------------------- */

typedef struct kt_source {
    svc_producer *p;
    int produced, delivered, failed;
    int per_partition[64]; /* delivered records per partition */
} kt_source;

static inline void kt_source_dr(void *opaque, const svc_delivery *d)
{
    kt_source *s = opaque;
    if (d->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        s->delivered++;
        s->per_partition[d->partition & 63]++;
    } else
        s->failed++;
}

static inline void kt_source_start(kt_source *s, const char *bootstraps)
{
    memset(s, 0, sizeof *s);
    svc_producer_config pc = {.brokers = bootstraps, .kafka = kt_producer_kv,
                              .n_kafka = kt_n_producer_kv, .on_delivery = kt_source_dr,
                              .opaque = s};
    char err[256];
    if (svc_producer_create(&pc, &s->p, err, sizeof err) != SVC_KAFKA_OK) {
        fprintf(stderr, "source producer: %s\n", err);
        abort();
    }
}

/* Produce request `i` to topic: key "<prefix>-<i>", header request_id. */
static inline void kt_source_send(kt_source *s, const char *topic, const char *prefix, int i)
{
    char key[32], value[64];
    int kl = snprintf(key, sizeof key, "%s-%d", prefix, i);
    int vl = snprintf(value, sizeof value, "{\"id\":\"%s\"}", key);
    const svc_kafka_header h[] = {{"request_id", key, (size_t)kl}};
    svc_kafka_record r = {
        .topic = topic, .partition = RD_KAFKA_PARTITION_UA,
        .key = key, .key_len = (size_t)kl, .value = value, .value_len = (size_t)vl,
        .headers = h, .n_headers = 1,
    };
    char err[256];
    svc_kafka_status st = svc_producer_produce(s->p, &r, err, sizeof err);
    check(st == SVC_KAFKA_OK, "source produce %s: %s", key, err);
    if (st == SVC_KAFKA_OK)
        s->produced++;
}

static inline void kt_source_flush(kt_source *s)
{
    char err[256];
    check(svc_producer_flush(s->p, 15000, err, sizeof err) == SVC_KAFKA_OK, "source flush: %s",
          err);
}

/* ---- scenarios, each in its own process -------------------------------------- */

/* The mock's group timings (3 s first join, seconds per rebalance) dominate,
 * not CPU, so scenarios run side by side: one child process each, with its
 * own mock cluster (mock threads do not survive fork, so the parent starts
 * none). A scenario that overruns is killed and fails. */
typedef struct kt_scenario {
    char id;            /* ML_TEST_ONLY=AC runs only scenarios A and C */
    const char *name;
    const char *topics; /* mock topics ("name:partitions,..."); NULL: no mock */
    void (*run)(const char *bootstraps, rd_kafka_mock_cluster_t *mc);
} kt_scenario;

static inline int kt_scenario_child(const kt_scenario *sc)
{
    /* Fault scenarios make librdkafka log every refused connection; the
     * logs are for debugging a failure (ML_TEST_VERBOSE=1). */
    if (getenv("ML_TEST_VERBOSE"))
        svc_log_set_level(SVC_LOG_DEBUG);
    else
        svc_log_set_output(fopen("/dev/null", "w"));
    signal(SIGPIPE, SIG_IGN);
    int64_t t0 = pu_now_ms();
    svc_mock_kafka *mock = NULL;
    char err[256];
    if (sc->topics && svc_mock_kafka_create(3, sc->topics, &mock, err, sizeof err) != SVC_KAFKA_OK) {
        fprintf(stderr, "%c: mock cluster: %s\n", sc->id, err);
        return 1;
    }
    sc->run(mock ? svc_mock_kafka_bootstraps(mock) : NULL,
            mock ? svc_mock_kafka_cluster(mock) : NULL);
    svc_mock_kafka_destroy(mock);
    fprintf(stderr, "%c %s: %.1f s, ", sc->id, sc->name, (pu_now_ms() - t0) / 1000.0);
    return check_done();
}

/* Run the scenarios in parallel; returns the process exit code. */
static inline int kt_run_scenarios(const kt_scenario *sc, size_t n, int timeout_ms)
{
    const char *only = getenv("ML_TEST_ONLY");
    pid_t pid[26] = {0};
    int failed = 0;
    int64_t t0 = pu_now_ms();
    for (size_t i = 0; i < n && i < 26; i++) {
        if (only && !strchr(only, sc[i].id))
            continue;
        fflush(NULL);
        pid[i] = fork();
        if (pid[i] == 0)
            exit(kt_scenario_child(&sc[i]));
        if (pid[i] < 0) {
            fprintf(stderr, "fork: scenario %c not run\n", sc[i].id);
            failed++;
            pid[i] = 0;
        }
    }
    int64_t deadline = t0 + timeout_ms;
    for (size_t i = 0; i < n && i < 26; i++) {
        if (!pid[i])
            continue;
        int status = 0;
        pid_t done = 0;
        while ((done = waitpid(pid[i], &status, WNOHANG)) == 0 && pu_now_ms() < deadline)
            pu_sleep_ms(50);
        if (done == 0) {
            kill(pid[i], SIGKILL);
            waitpid(pid[i], &status, 0);
            fprintf(stderr, "FAIL scenario %c (%s): timed out after %d ms\n", sc[i].id,
                    sc[i].name, timeout_ms);
            failed++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL scenario %c (%s): status %d\n", sc[i].id, sc[i].name, status);
            failed++;
        }
    }
    fprintf(stderr, "all scenarios: %.1f s, %d failed\n", (pu_now_ms() - t0) / 1000.0, failed);
    return failed ? 1 : 0;
}

#endif
