/* What one request in flight per connection costs the reply stream.
 *
 *     ML_BENCH=1 bench_reply_inflight [RTT_MS...]
 *
 * Without ML_BENCH=1 it exits 77 (skipped) at once. The worker's producer
 * (svc_producer: idempotent, linger.ms 0, max.in.flight 1, fixed in
 * kafka_producer.c) streams token records the way the step thread does:
 * every STEP_MS one record for each of STREAMS concurrent requests (one
 * batched decode step), keyed by request over the reply topic's partitions.
 * The same load then goes through a producer built from the same settings
 * but five requests in flight, librdkafka's idempotent maximum. Both talk to
 * an in-process mock cluster whose brokers answer after RTT_MS (default
 * series 1 5 20: same host, same zone, cross-zone). Printed per RTT: the
 * produce-to-acknowledgement latency of a record (p50, p99, max) for each
 * producer, and their ratio; throughput is the same by construction (every
 * record is acknowledged), so the latency is the cost. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kafka/kafka_conf.h"
#include "kafka/mock_kafka.h"
#include "service/proc_util.h"

#define BROKERS 3
#define PARTITIONS 8
#define TOPIC "replies"
#define STREAMS 32      /* concurrent requests of one batched decode step */
#define STEPS 200       /* decode steps per run */
#define STEP_MS 20      /* one decode step of an 11B model on one GPU, batch 32 */
#define RECORD_BYTES 200 /* a chat.completion.chunk with one token */
#define WARMUP_STEPS 10
#define FLUSH_MS 30000
#define PEER_IN_FLIGHT "5"

/* When each record was produced; its delivery report fills the latency. */
typedef struct sample {
    int64_t produced_us, latency_us;
} sample;

typedef struct run {
    sample s[STEPS * STREAMS];
    int delivered, failed;
} run;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FATAL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void note_delivery(run *r, sample *s, bool ok)
{
    if (!ok) {
        r->failed++;
        return;
    }
    r->delivered++;
    if (s)
        s->latency_us = now_us() - s->produced_us;
}

/* ---- the two producers ------------------------------------------------------------ */

/* The worker's producer. */
static void ours_dr(void *opaque, const svc_delivery *d)
{
    note_delivery(opaque, d->ctx, d->err == RD_KAFKA_RESP_ERR_NO_ERROR);
}

/* The peer: the same settings as svc_producer_create, five in flight. */
static void peer_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    note_delivery(opaque, m->_private, m->err == RD_KAFKA_RESP_ERR_NO_ERROR);
}

static rd_kafka_t *peer_create(const char *brokers, run *r)
{
    const svc_kafka_kv kv[] = {
        {"bootstrap.servers", brokers}, {"linger.ms", "0"},
        {"message.timeout.ms", "30000"}, {"enable.idempotence", "true"},
        {"max.in.flight.requests.per.connection", PEER_IN_FLIGHT},
    };
    rd_kafka_conf_t *conf;
    char err[512];
    if (svc_kafka_conf_build(NULL, 0, kv, sizeof kv / sizeof kv[0], NULL, 0, &conf, err,
                             sizeof err) != SVC_KAFKA_OK)
        die("peer producer config: %s", err);
    rd_kafka_conf_set_opaque(conf, r);
    rd_kafka_conf_set_dr_msg_cb(conf, peer_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk)
        die("peer producer: %s", err);
    return rk;
}

/* ---- the load ----------------------------------------------------------------------- */

typedef struct producer {
    svc_producer *ours; /* exactly one of the two is set */
    rd_kafka_t *peer;
} producer;

static void produce_one(producer *p, int stream, sample *s)
{
    static const char value[RECORD_BYTES];
    char key[32];
    int kl = snprintf(key, sizeof key, "req-%d", stream);
    if (s)
        s->produced_us = now_us();
    if (p->ours) {
        svc_kafka_record rec = {.topic = TOPIC, .partition = RD_KAFKA_PARTITION_UA, .key = key,
                                .key_len = (size_t)kl, .value = value,
                                .value_len = sizeof value, .ctx = s};
        char err[256];
        if (svc_producer_produce(p->ours, &rec, err, sizeof err) != SVC_KAFKA_OK)
            die("produce: %s", err);
        svc_producer_poll(p->ours, 0);
    } else {
        if (rd_kafka_producev(p->peer, RD_KAFKA_V_TOPIC(TOPIC), RD_KAFKA_V_KEY(key, (size_t)kl),
                              RD_KAFKA_V_VALUE((void *)value, sizeof value),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(s),
                              RD_KAFKA_V_END))
            die("peer produce failed");
        rd_kafka_poll(p->peer, 0);
    }
}

static void serve_reports(producer *p, int ms)
{
    if (p->ours)
        svc_producer_poll(p->ours, ms);
    else
        rd_kafka_poll(p->peer, ms);
}

/* One run: warm-up steps (not sampled), then STEPS steps of STREAMS records. */
static void drive(producer *p, run *r)
{
    for (int step = -WARMUP_STEPS; step < STEPS; step++) {
        int64_t next = now_us() + STEP_MS * 1000;
        for (int i = 0; i < STREAMS; i++)
            produce_one(p, i, step >= 0 ? &r->s[step * STREAMS + i] : NULL);
        for (int64_t left; (left = next - now_us()) > 0;)
            serve_reports(p, (int)(left / 1000) + 1);
    }
    int64_t deadline = now_us() + (int64_t)FLUSH_MS * 1000;
    while (r->delivered + r->failed < (STEPS + WARMUP_STEPS) * STREAMS && now_us() < deadline)
        serve_reports(p, 10);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

typedef struct latency {
    double p50, p99, max; /* ms */
} latency;

static latency summarize(const run *r)
{
    enum { N = STEPS * STREAMS };
    static int64_t v[N];
    for (int i = 0; i < N; i++)
        v[i] = r->s[i].latency_us;
    qsort(v, N, sizeof v[0], cmp_i64);
    return (latency){v[N / 2] / 1000.0, v[N * 99 / 100] / 1000.0, v[N - 1] / 1000.0};
}

static latency measure(const char *brokers, bool ours)
{
    static run r;
    memset(&r, 0, sizeof r);
    producer p = {0};
    if (ours) {
        svc_producer_config pc = {.brokers = brokers, .on_delivery = ours_dr, .opaque = &r};
        char err[256];
        if (svc_producer_create(&pc, &p.ours, err, sizeof err) != SVC_KAFKA_OK)
            die("producer: %s", err);
    } else {
        p.peer = peer_create(brokers, &r);
    }
    drive(&p, &r);
    if (r.failed || r.delivered != (STEPS + WARMUP_STEPS) * STREAMS)
        die("%s: %d delivered, %d failed of %d", ours ? "ours" : "peer", r.delivered,
               r.failed, (STEPS + WARMUP_STEPS) * STREAMS);
    if (ours)
        svc_producer_destroy(p.ours);
    else
        rd_kafka_destroy(p.peer);
    return summarize(&r);
}

int main(int argc, char **argv)
{
    const char *on = getenv("ML_BENCH");
    if (!on || strcmp(on, "1"))
        return 77;
    static const int default_rtts[] = {1, 5, 20};
    int n_rtts = argc > 1 ? argc - 1 : (int)(sizeof default_rtts / sizeof default_rtts[0]);
    char err[256];
    svc_mock_kafka *mock;
    char topics[64];
    snprintf(topics, sizeof topics, TOPIC ":%d", PARTITIONS);
    if (svc_mock_kafka_create(BROKERS, topics, &mock, err, sizeof err) != SVC_KAFKA_OK)
        die("mock cluster: %s", err);
    const char *brokers = svc_mock_kafka_bootstraps(mock);
    printf("%d streams, one record each every %d ms, %d-byte records, %d partitions on %d "
           "brokers\n\n",
           STREAMS, STEP_MS, RECORD_BYTES, PARTITIONS, BROKERS);
    printf("| broker RTT | in flight | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n");
    for (int i = 0; i < n_rtts; i++) {
        int rtt = argc > 1 ? atoi(argv[i + 1]) : default_rtts[i];
        if (rd_kafka_mock_broker_set_rtt(svc_mock_kafka_cluster(mock), -1, rtt) !=
            RD_KAFKA_RESP_ERR_NO_ERROR)
            die("set rtt");
        latency peer = measure(brokers, false), ours = measure(brokers, true);
        printf("| %d ms | 1 (ours) | %.2f | %.2f | %.2f |\n", rtt, ours.p50, ours.p99, ours.max);
        printf("| %d ms | %s | %.2f | %.2f | %.2f |\n", rtt, PEER_IN_FLIGHT, peer.p50, peer.p99,
               peer.max);
        printf("| %d ms | ratio 1/%s | %.2fx | %.2fx | |\n", rtt, PEER_IN_FLIGHT,
               ours.p50 / peer.p50, ours.p99 / peer.p99);
    }
    svc_mock_kafka_destroy(mock);
    return 0;
}
