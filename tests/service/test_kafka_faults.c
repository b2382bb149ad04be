/* The Kafka layer under injected faults (librdkafka mock cluster), with the
 * producer configured as the worker's. P, O, H and D end with no message
 * lost and every delivery report successful:
 *   P. Produce errors (not leader, timeouts, disconnects): retried invisibly;
 *      idempotence leaves no duplicate in the log, and no record overtakes
 *      an earlier one of its partition (one request in flight: the mock
 *      does not check idempotent sequences, see kafka_producer.c);
 *   O. OffsetCommit errors: the next auto-commit stores the offsets anyway;
 *   H. Heartbeat ILLEGAL_GENERATION: the assignment is lost, the unfinished
 *      requests are reported, their late finishes store nothing, and they
 *      are consumed again after the rejoin;
 *   D. every broker down for 3 s while requests and replies are in flight;
 *   F. a fatal idempotence error surfaces through svc_producer_fatal and
 *      fails every later produce. */
#include "kafka_test.h"

/* Kafka protocol ApiKeys (not installed by librdkafka-dev: rdkafka_proto.h). */
enum { API_PRODUCE = 0, API_OFFSET_COMMIT = 8, API_HEARTBEAT = 12 };

static const char *bs;

static void use_cluster(const char *bootstraps)
{
    bs = bootstraps;
    kt_producer_kv = NULL;
    kt_n_producer_kv = 0;
}

enum { P_N = 60, P_PARTS = 2, P_MAX_PARTS = 8 };

static int key_index(const char *key, size_t len)
{
    char buf[32] = {0};
    memcpy(buf, key, len < sizeof buf - 1 ? len : sizeof buf - 1);
    const char *dash = strrchr(buf, '-');
    return dash ? atoi(dash + 1) : -1;
}

/* Read partitions 0..n_parts-1 of topic from the beginning to their end with
 * a plain assign() consumer (no group, no join delay), counting each record
 * key's index into counts[0..max) and, in *inversions, the records whose
 * index is below that of the record before them in their partition (keys
 * were produced in index order). Returns the number of records read. */
static int read_all(const char *topic, int n_parts, int *counts, int max, int *inversions)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(conf, "bootstrap.servers", bs, err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "fault-reader", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        return -1;
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n_parts);
    for (int p = 0; p < n_parts; p++)
        rd_kafka_topic_partition_list_add(l, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0, eofs = 0, last[P_MAX_PARTS];
    check(n_parts <= P_MAX_PARTS, "read_all: %d partitions", n_parts);
    for (int p = 0; p < n_parts; p++)
        last[p] = -1;
    *inversions = 0;
    for (int64_t dl = pu_now_ms() + 15000; eofs < n_parts && pu_now_ms() < dl;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eofs++;
        } else if (!m->err) {
            int k = key_index(m->key, m->key_len);
            if (k >= 0 && k < max) {
                counts[k]++;
                *inversions += k < last[m->partition];
                last[m->partition] = k;
            }
            n++;
        }
        rd_kafka_message_destroy(m);
    }
    check(eofs == n_parts, "read_all %s: reached the end of %d/%d partitions", topic, eofs,
          n_parts);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

/* ---- P: produce errors -------------------------------------------------------- */


static void scenario_produce(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    use_cluster(bootstraps);
    kt_source src;
    kt_source_start(&src, bs);
    /* First let the producer connect and get its producer id (this key's
     * index is out of the counted range). */
    kt_source_send(&src, "faults", "warm", P_N);
    kt_source_flush(&src);
    rd_kafka_mock_push_request_errors(
        mc, API_PRODUCE, 8, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR__TRANSPORT,
        RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION);
    for (int i = 0; i < P_N; i++) {
        kt_source_send(&src, "faults", "p", i);
        if (i % 10 == 9)
            svc_producer_poll(src.p, 20); /* several produce requests, not one batch */
    }
    kt_source_flush(&src);
    check(src.delivered == P_N + 1 && src.failed == 0, "P: %d delivered, %d failed of %d",
          src.delivered, src.failed, P_N + 1);
    svc_producer_destroy(src.p);

    int counts[P_N] = {0}, inversions = 0;
    int n = read_all("faults", P_PARTS, counts, P_N, &inversions);
    int missing = 0, dups = 0;
    for (int i = 0; i < P_N; i++) {
        missing += counts[i] == 0;
        dups += counts[i] > 1;
    }
    check(n == P_N + 1 && missing == 0 && dups == 0,
          "P: the log holds %d records (want %d): %d missing, %d duplicated", n, P_N + 1, missing,
          dups);
    check(inversions == 0, "P: %d records overtook an earlier one of their partition",
          inversions);
}

/* ---- shared by O, H, D: a worker replying to a stream of requests -------------- */

enum { S_PARTS = 2, S_MAX = 512 };

typedef struct stream {
    kt_source src;
    kt_worker w;
    int sent;
    const char *topic;
    const char *group;
} stream;

static bool stream_all_seen(stream *s)
{
    static unsigned char seen[S_MAX];
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < s->w.n_got; i++) {
        int k = key_index(s->w.got[i].key, strlen(s->w.got[i].key));
        if (k >= 0 && k < S_MAX)
            seen[k] = 1;
    }
    for (int k = 0; k < s->sent; k++)
        if (!seen[k])
            return false;
    return true;
}

static bool stream_done_cond(void *arg)
{
    stream *s = arg;
    return stream_all_seen(s) && s->w.replies_delivered + s->w.reply_failures >= s->w.replies_sent;
}

static void stream_send(stream *s, int n)
{
    for (int i = 0; i < n; i++)
        kt_source_send(&s->src, s->topic, "r", s->sent++);
}

static bool stream_assigned(void *arg)
{
    return ((stream *)arg)->w.assigned == S_PARTS;
}

static kt_policy reply_all(kt_worker *w, const svc_kafka_msg *m)
{
    return KT_REPLY;
}

static void stream_start(stream *s, const char *topic, const char *group,
                         kt_policy (*policy)(kt_worker *, const svc_kafka_msg *))
{
    memset(s, 0, sizeof *s);
    s->topic = topic;
    s->group = group;
    kt_source_start(&s->src, bs);
    kt_worker_start(&s->w, group, bs, group, topic, "replies", NULL, 0);
    s->w.policy = policy;
    kt_worker *ws[] = {&s->w};
    check(kt_run_until(ws, 1, stream_assigned, s, 15000), "%s: assigned", group);
}

/* Run until every request was consumed and every reply reported, then until
 * the committed offsets reach the end of the topic. */
static void stream_finish(stream *s, const char *what)
{
    kt_source_flush(&s->src);
    kt_worker *ws[] = {&s->w};
    check(kt_run_until(ws, 1, stream_done_cond, s, 20000), "%s: all %d requests consumed", what,
          s->sent);
    check(s->src.failed == 0 && s->w.reply_failures == 0,
          "%s: delivery failures: requests %d, replies %d", what, s->src.failed,
          s->w.reply_failures);
    int64_t end[S_PARTS], got[S_PARTS] = {0};
    check(kt_end_offsets(bs, s->topic, S_PARTS, end), "%s: end offsets", what);
    bool committed = false;
    for (int64_t dl = pu_now_ms() + 10000; !committed && pu_now_ms() < dl;) {
        kt_run_until(ws, 1, NULL, NULL, 300);
        committed = kt_committed(bs, s->group, s->topic, S_PARTS, got) && got[0] == end[0] &&
                    got[1] == end[1];
    }
    check(committed, "%s: committed %lld,%lld reach the end %lld,%lld", what, (long long)got[0],
          (long long)got[1], (long long)end[0], (long long)end[1]);
    fprintf(stderr, "  %s: %d requests, %zu deliveries, %d revokes (%d lost)\n", what, s->sent,
            s->w.n_got, s->w.n_revoke_events, s->w.n_lost);
    kt_worker_stop(&s->w);
    svc_producer_destroy(s->src.p);
}

/* ---- O: OffsetCommit errors ---------------------------------------------------- */

static void scenario_commit(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    use_cluster(bootstraps);
    stream s;
    stream_start(&s, "commits", "gO", reply_all);
    rd_kafka_mock_push_request_errors(
        mc, API_OFFSET_COMMIT, 6, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
        RD_KAFKA_RESP_ERR__TRANSPORT);
    for (int round = 0; round < 5; round++) {
        stream_send(&s, 10);
        kt_worker *ws[] = {&s.w};
        kt_run_until(ws, 1, NULL, NULL, 300);
    }
    stream_finish(&s, "O");
}

/* ---- H: Heartbeat errors lose the assignment ----------------------------------- */

enum { H_HELD = 4 };

/* Hold the first H_HELD requests (long generations), reply to the rest. */
static kt_policy hold_first(kt_worker *w, const svc_kafka_msg *m)
{
    int k = key_index(m->key, m->key_len);
    bool first_time = true;
    for (size_t i = 0; i + 1 < w->n_got; i++)
        first_time = first_time && strcmp(w->got[i].key, w->got[w->n_got - 1].key) != 0;
    return k < H_HELD && first_time ? KT_HOLD : KT_REPLY;
}

static bool replies_reported(void *arg)
{
    kt_worker *w = arg;
    return w->replies_delivered + w->reply_failures >= w->replies_sent;
}

static bool lost_seen(void *arg)
{
    return ((stream *)arg)->w.n_lost > 0;
}

static void scenario_heartbeat(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    use_cluster(bootstraps);
    stream s;
    stream_start(&s, "hb", "gH", hold_first);
    stream_send(&s, 20);
    kt_source_flush(&s.src);
    kt_worker *ws[] = {&s.w};
    bool all_in = false;
    for (int64_t dl = pu_now_ms() + 10000; !all_in && pu_now_ms() < dl;) {
        kt_worker_step(&s.w, 20);
        all_in = s.w.n_got >= 20;
    }
    check(all_in, "H: 20 requests consumed before the fault (%zu)", s.w.n_got);
    check(kt_run_until(ws, 1, replies_reported, &s.w, 10000), "H: replies delivered");
    size_t held[H_HELD], n_held = 0;
    for (size_t i = 0; i < s.w.n_got && n_held < H_HELD; i++)
        if (s.w.got[i].held)
            held[n_held++] = i;
    check(n_held == H_HELD, "H: %zu requests held", n_held);

    rd_kafka_mock_push_request_errors(mc, API_HEARTBEAT, 2, RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION,
                                      RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION);
    check(kt_run_until(ws, 1, lost_seen, &s, 10000), "H: the assignment was lost");
    check(s.w.last_revoke_pending == n_held,
          "H: the lost revoke reported the %zu unfinished requests (%zu)", n_held,
          s.w.last_revoke_pending);

    /* The abandoned requests' final records still arrive late: their
     * finishes belong to the lost assignment and store nothing. */
    int stale_before = s.w.finish_stale;
    for (size_t i = 0; i < n_held; i++)
        kt_release_held(&s.w, held[i]);
    kt_run_until(ws, 1, stream_done_cond, &s, 5000);
    check(s.w.finish_stale - stale_before == (int)n_held,
          "H: late finishes after the loss were stale (%d of %zu)", s.w.finish_stale - stale_before,
          n_held);

    /* After the rejoin the held requests come back (never committed). */
    stream_send(&s, 10);
    size_t before = s.w.n_got;
    stream_finish(&s, "H");
    check(before >= 20, "H: consumed %zu", before);
}

/* ---- D: every broker down ------------------------------------------------------- */

static void scenario_down(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    use_cluster(bootstraps);
    stream s;
    stream_start(&s, "down", "gD", reply_all);
    stream_send(&s, 20);
    kt_source_flush(&s.src);
    kt_worker *ws[] = {&s.w};
    kt_run_until(ws, 1, stream_done_cond, &s, 10000);

    check(rd_kafka_mock_broker_set_down(mc, -1) == RD_KAFKA_RESP_ERR_NO_ERROR, "D: set down");
    stream_send(&s, 20); /* queued in the producer */
    int64_t down_until = pu_now_ms() + 3000;
    while (pu_now_ms() < down_until) {
        kt_worker_step(&s.w, 20);
        svc_producer_poll(s.src.p, 0);
    }
    check(s.src.failed == 0, "D: no delivery failure while down (%d)", s.src.failed);
    check(rd_kafka_mock_broker_set_up(mc, -1) == RD_KAFKA_RESP_ERR_NO_ERROR, "D: set up");
    stream_send(&s, 10);
    stream_finish(&s, "D");
}

/* ---- F: a fatal producer error ------------------------------------------------- */

/* Scenario F injects one error into one Produce request and expects the
 * three records after it to share that request: a linger well above the
 * time between the three sends batches them (the producer's own default is
 * no linger). */
static const svc_kafka_kv fatal_kv[] = {{"linger.ms", "100"}};

static void scenario_fatal(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    use_cluster(bootstraps);
    kt_producer_kv = fatal_kv;
    kt_n_producer_kv = sizeof fatal_kv / sizeof fatal_kv[0];
    kt_source src;
    kt_source_start(&src, bs);
    kt_source_send(&src, "fatal", "ok", 0);
    kt_source_flush(&src);
    char err[512] = "";
    check(!svc_producer_fatal(src.p, err, sizeof err), "F: healthy at first");
    /* A sequence gap the idempotent producer cannot explain: its state is
     * lost, librdkafka raises a fatal error (service/README.md §5). */
    rd_kafka_mock_push_request_errors(mc, API_PRODUCE, 1,
                                      RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER);
    for (int i = 1; i <= 3; i++)
        kt_source_send(&src, "fatal", "x", i);
    svc_producer_flush(src.p, 10000, NULL, 0);
    check(src.failed == 3, "F: the 3 records in the failed request report failure (%d)",
          src.failed);
    check(svc_producer_fatal(src.p, err, sizeof err) && strstr(err, "sequence"),
          "F: fatal error surfaced: %s", err);
    svc_kafka_record r = {.topic = "fatal", .partition = RD_KAFKA_PARTITION_UA, .value = "y",
                          .value_len = 1};
    svc_kafka_status st = svc_producer_produce(src.p, &r, err, sizeof err);
    check(st == SVC_KAFKA_ERR_FATAL, "F: produce after a fatal error: %s (%s)",
          svc_kafka_status_name(st), err);
    svc_producer_destroy(src.p);
}

int main(void)
{
    static const kt_scenario scenarios[] = {
        {'P', "produce errors", "faults:2", scenario_produce},
        {'O', "offset commit errors", "commits:2,replies:2", scenario_commit},
        {'H', "heartbeat errors", "hb:2,replies:2", scenario_heartbeat},
        {'D', "all brokers down", "down:2,replies:2", scenario_down},
        {'F', "fatal producer error", "fatal:1", scenario_fatal},
    };
    return kt_run_scenarios(scenarios, sizeof scenarios / sizeof scenarios[0], 50000);
}
