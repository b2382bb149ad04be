/* The Kafka layer (service/kafka_*.c) against librdkafka's mock cluster
 * in-process, with kcat as an independent client:
 *   A. offsets are stored only for finished requests; a restarted member of
 *      the group resumes at the first unfinished offset (no loss); a
 *      dead-lettered message finishes when its DLT record is delivered, and
 *      kcat reads the DLT headers;
 *   B. two members share a topic and a third joins through a cooperative
 *      (incremental) rebalance without losing messages;
 *   C. pause holds across rebalances: kept partitions stay paused, new ones
 *      start paused, and a partition paused under an earlier assignment
 *      fetches again when it comes back after resume;
 *   D. headers as kcat reads them; producing to a topic the mock
 *      auto-creates;
 *   E. `mllama mock-kafka` serves kcat and stops on SIGTERM;
 *   F. a full producer queue is waited out, by polling on the
 *      delivery-report thread and by sleeping on another thread;
 *   G. with an eager assignor (range) the assign()/unassign fallback works;
 *   H. one subscribed topic paused (a tenant's, fair share) before its
 *      partitions are assigned: the other topic flows, the paused one
 *      hands out nothing until it is resumed, and librdkafka is never asked
 *      to pause;
 *   I. a topic paused with records fetched but not handed out: every one
 *      arrives once after the resumption;
 *   J. a topic paused and resumed over a backlog larger than librdkafka's
 *      pre-fetch limit does not hold up another topic's records;
 *   K. a consumer closed after its JoinGroup's answer and before its
 *      SyncGroup's is destroyed without librdkafka 2.0.2's abort. */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_samples.h"
#include "kafka_test.h"

static const char *bs; /* bootstrap servers of this scenario's mock cluster */

static int key_index(const char *key)
{
    const char *dash = strrchr(key, '-');
    return dash ? atoi(dash + 1) : -1;
}

static bool have_kcat(void)
{
    return system("command -v kcat >/dev/null 2>&1") == 0;
}

/* Run kcat with `args` (bounded by `timeout`), stdout into out. Returns its
 * exit status, or -1 when it could not run. */
static int kcat(const char *args, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout 20 kcat -b %s %s 2>/dev/null", bs, args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int rc = pclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* ---- A: at-least-once offsets and restart ------------------------------------ */

enum { A_N = 40, A_PARTS = 4, A_DLT_INDEX = 2 };

/* Hold every request; check its request_id header on the way. */
static kt_policy hold_all(kt_worker *w, const svc_kafka_msg *m)
{
    const void *v;
    size_t len;
    check(svc_kafka_msg_header(m, "request_id", &v, &len) && len == m->key_len &&
              !memcmp(v, m->key, len),
          "A: request_id header matches the key");
    check(!svc_kafka_msg_header(m, "reply_topic", &v, &len), "A: an absent header");
    check(m->value_len > 0 && m->timestamp_ms > 0, "A: value and timestamp");
    return KT_HOLD;
}

/* Restarted worker: reply to everything, dead-letter request A_DLT_INDEX. */
static kt_policy reply_or_dlt(kt_worker *w, const svc_kafka_msg *m)
{
    char key[32] = {0};
    memcpy(key, m->key, m->key_len < sizeof key - 1 ? m->key_len : sizeof key - 1);
    if (key_index(key) != A_DLT_INDEX)
        return KT_REPLY;
    kt_reply_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx)
        abort();
    ctx->ticket = m->ticket;
    svc_dead_letter dl = {.topic = "dlt", .error_code = "invalid_request",
                          .error_msg = "no reply_topic", .worker = "w2", .ctx = ctx};
    char err[256];
    svc_kafka_status st = svc_producer_produce_dlt(w->p, &dl, m, err, sizeof err);
    check(st == SVC_KAFKA_OK, "dlt produce: %s", err);
    if (st != SVC_KAFKA_OK) {
        free(ctx);
        return KT_HOLD;
    }
    w->replies_sent++;
    return KT_SENT;
}

static bool got_a_n(void *arg)
{
    return ((kt_worker *)arg)->n_got >= A_N;
}

static bool replies_done(void *arg)
{
    kt_worker *w = arg;
    return w->replies_delivered + w->reply_failures >= w->replies_sent;
}

typedef struct committed_wait {
    const char *group;
    const int64_t *want;
} committed_wait;

static bool committed_is(void *arg)
{
    const committed_wait *cw = arg;
    int64_t got[A_PARTS];
    if (!kt_committed(bs, cw->group, "requests", A_PARTS, got))
        return false;
    for (int p = 0; p < A_PARTS; p++)
        if (got[p] != cw->want[p])
            return false;
    return true;
}

static void scenario_offsets_restart(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    kt_source src;
    kt_source_start(&src, bs);
    for (int i = 0; i < A_N; i++)
        kt_source_send(&src, "requests", "req", i);
    kt_source_flush(&src);
    check(src.delivered == A_N && src.failed == 0, "A: %d/%d requests delivered", src.delivered,
          A_N);
    int64_t end[A_PARTS];
    check(kt_end_offsets(bs, "requests", A_PARTS, end), "A: end offsets");

    kt_worker w1;
    kt_worker_start(&w1, "w1", bs, "gA", "requests", "replies", NULL, 0);
    w1.policy = hold_all;
    kt_worker *ws[] = {&w1};
    check(kt_run_until(ws, 1, got_a_n, &w1, 20000), "A: w1 received %zu/%d", w1.n_got, A_N);

    /* Nothing finished: several auto-commit intervals later, nothing committed. */
    kt_run_until(ws, 1, NULL, NULL, 800);
    int64_t committed[A_PARTS];
    check(kt_committed(bs, "gA", "requests", A_PARTS, committed), "A: committed query");
    for (int p = 0; p < A_PARTS; p++)
        check(committed[p] == RD_KAFKA_OFFSET_INVALID,
              "A: partition %d committed %lld before any request finished", p,
              (long long)committed[p]);

    /* Finish all but every fifth request (they keep generating). */
    int64_t expect[A_PARTS];
    memcpy(expect, end, sizeof end);
    size_t n_held = 0;
    for (size_t i = 0; i < w1.n_got; i++) {
        kt_got *g = &w1.got[i];
        if (key_index(g->key) % 5 == 2) {
            n_held++;
            if (g->offset < expect[g->partition])
                expect[g->partition] = g->offset;
        } else {
            kt_release_held(&w1, i);
        }
    }
    check(kt_run_until(ws, 1, replies_done, &w1, 10000), "A: %d/%d replies delivered",
          w1.replies_delivered, w1.replies_sent);
    check(w1.finish_ok == w1.replies_sent && w1.finish_stale == 0 && w1.finish_other == 0,
          "A: every finish stored (ok %d stale %d other %d)", w1.finish_ok, w1.finish_stale,
          w1.finish_other);
    committed_wait cw = {"gA", expect};
    check(kt_run_until(ws, 1, committed_is, &cw, 8000),
          "A: committed offsets reach the first unfinished offset of each partition");

    /* Leaving the group reports the unfinished requests as revoked, not lost. */
    kt_worker_stop(&w1);
    check(w1.last_revoke_pending == n_held && w1.n_lost == 0,
          "A: close revoked %zu pending (want %zu), lost %d", w1.last_revoke_pending, n_held,
          w1.n_lost);
    check(committed_is(&cw), "A: close committed nothing past the first unfinished offsets");

    /* A new member resumes at the first unfinished offset of each partition. */
    size_t want_redelivered = 0;
    for (int p = 0; p < A_PARTS; p++)
        want_redelivered += (size_t)(end[p] - expect[p]);
    kt_worker w2;
    kt_worker_start(&w2, "w2", bs, "gA", "requests", "replies", NULL, 0);
    w2.policy = reply_or_dlt;
    ws[0] = &w2;
    bool ok = false;
    for (int64_t dl = pu_now_ms() + 20000; !ok && pu_now_ms() < dl;) {
        kt_worker_step(&w2, 20);
        ok = w2.n_got >= want_redelivered;
    }
    check(ok, "A: w2 received %zu/%zu redelivered requests", w2.n_got, want_redelivered);
    kt_run_until(ws, 1, NULL, NULL, 500);
    check(w2.n_got == want_redelivered, "A: w2 received %zu, want exactly %zu", w2.n_got,
          want_redelivered);
    int held_seen = 0;
    int64_t dlt_partition = -1, dlt_offset = -1;
    for (size_t i = 0; i < w2.n_got; i++) {
        kt_got *g = &w2.got[i];
        check(g->offset >= expect[g->partition],
              "A: %s at %d/%lld was finished and committed, yet redelivered", g->key,
              g->partition, (long long)g->offset);
        held_seen += key_index(g->key) % 5 == 2;
        if (key_index(g->key) == A_DLT_INDEX) {
            dlt_partition = g->partition;
            dlt_offset = g->offset;
        }
    }
    check(held_seen == (int)n_held, "A: every unfinished request came back (%d/%zu)", held_seen,
          n_held);
    check(kt_run_until(ws, 1, replies_done, &w2, 10000), "A: w2 replies delivered");
    check(w2.finish_ok == w2.replies_sent, "A: w2 finished %d/%d (including the dead letter)",
          w2.finish_ok, w2.replies_sent);
    cw.want = end;
    check(kt_run_until(ws, 1, committed_is, &cw, 8000), "A: everything committed at the end");
    kt_worker_stop(&w2);
    svc_producer_destroy(src.p);
    /* The dead letter as an independent client reads it. */
    if (have_kcat()) {
        char want[512], out[4096];
        snprintf(want, sizeof want,
                 "req-%d|request_id=req-%d,x-error-code=invalid_request,x-error-msg=no reply_topic,"
                 "x-original-topic=requests,x-original-partition=%lld,x-original-offset=%lld,"
                 "x-worker=w2|{\"id\":\"req-%d\"}\n",
                 A_DLT_INDEX, A_DLT_INDEX, (long long)dlt_partition, (long long)dlt_offset,
                 A_DLT_INDEX);
        int rc = kcat("-C -t dlt -o beginning -e -q -f '%k|%h|%s\\n'", out, sizeof out);
        check(rc == 0 && !strcmp(out, want),
              "A: dead letter as kcat reads it (rc %d):\n got  %s want %s", rc, out, want);
    } else {
        fprintf(stderr, "  A: kcat not found, skipping the dead-letter read\n");
    }
}

/* ---- B: cooperative rebalance with a third member ---------------------------- */

enum { B_PARTS = 6, B_MAX = 4000 };

static kt_source b_src;
static int b_next;
static int64_t b_next_at;
static bool b_stop;
static kt_worker b_w[3];

/* Produce one request every 20 ms while the scenario runs. */
static void b_tick(void)
{
    int64_t now = pu_now_ms();
    if (!b_stop && now >= b_next_at && b_next < B_MAX) {
        kt_source_send(&b_src, "shared", "s", b_next++);
        b_next_at = now + 20;
    }
    svc_producer_poll(b_src.p, 0);
}

static bool b_run_until(int n_workers, bool (*cond)(void), int timeout_ms)
{
    int64_t deadline = pu_now_ms() + timeout_ms;
    while (!cond()) {
        if (pu_now_ms() >= deadline)
            return false;
        for (int i = 0; i < n_workers; i++) {
            b_tick();
            kt_worker_step(&b_w[i], 10);
        }
    }
    return true;
}

static bool b_two_share(void)
{
    return b_w[0].assigned > 0 && b_w[1].assigned > 0 &&
           b_w[0].assigned + b_w[1].assigned == B_PARTS;
}

static bool b_three_share(void)
{
    return b_w[0].assigned == 2 && b_w[1].assigned == 2 && b_w[2].assigned == 2;
}

static bool b_all_seen(void)
{
    static unsigned char seen[B_MAX];
    memset(seen, 0, sizeof seen);
    for (int w = 0; w < 3; w++)
        for (size_t i = 0; i < b_w[w].n_got; i++) {
            int k = key_index(b_w[w].got[i].key);
            if (k >= 0 && k < B_MAX)
                seen[k] = 1;
        }
    for (int k = 0; k < b_next; k++)
        if (!seen[k])
            return false;
    return true;
}

static void scenario_cooperative(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    kt_source_start(&b_src, bs);
    kt_worker_start(&b_w[0], "b1", bs, "gB", "shared", "replies", NULL, 0);
    kt_worker_start(&b_w[1], "b2", bs, "gB", "shared", "replies", NULL, 0);
    check(b_run_until(2, b_two_share, 20000), "B: two members share %d partitions (%d + %d)",
          B_PARTS, b_w[0].assigned, b_w[1].assigned);
    int64_t t1 = pu_now_ms();
    kt_worker_start(&b_w[2], "b3", bs, "gB", "shared", "replies", NULL, 0);
    check(b_run_until(3, b_three_share, 25000), "B: three members hold 2 each (%d %d %d)",
          b_w[0].assigned, b_w[1].assigned, b_w[2].assigned);
    int64_t t2 = pu_now_ms();
    b_stop = true;
    int produced = b_next;
    kt_source_flush(&b_src);
    check(b_src.delivered == produced, "B: %d/%d requests delivered", b_src.delivered, produced);
    check(b_run_until(3, b_all_seen, 10000), "B: all %d requests consumed", produced);
    if (!b_all_seen()) {
        static int cnt[B_MAX];
        for (int w = 0; w < 3; w++)
            for (size_t i = 0; i < b_w[w].n_got; i++)
                cnt[key_index(b_w[w].got[i].key)]++;
        for (int k = 0; k < produced; k++)
            if (!cnt[k])
                fprintf(stderr, "missing s-%d\n", k);
        for (int w = 0; w < 3; w++)
            fprintf(stderr, "%s mask %llx got %zu\n", b_w[w].name,
                    (unsigned long long)b_w[w].parts_mask, b_w[w].n_got);
    }
    for (int i = 0; i < 2; i++)
        check(b_w[i].min_after_first > 0,
              "B: %s kept partitions through every rebalance (incremental), min %d", b_w[i].name,
              b_w[i].min_after_first);
    for (int i = 0; i < 3; i++)
        check(b_w[i].n_lost == 0 && b_w[i].finish_other == 0, "B: %s lost %d, bad finishes %d",
              b_w[i].name, b_w[i].n_lost, b_w[i].finish_other);
    size_t total = b_w[0].n_got + b_w[1].n_got + b_w[2].n_got;
    fprintf(stderr,
            "  B: %d requests, %zu deliveries (%zu duplicates); the third member joined in "
            "%.1f s\n",
            produced, total, total - (size_t)produced, (t2 - t1) / 1000.0);
    for (int i = 0; i < 3; i++)
        kt_worker_stop(&b_w[i]);
    svc_producer_destroy(b_src.p);
}

/* ---- C: pause survives rebalances -------------------------------------------- */

enum { C_PARTS = 4, C_BATCH = 16 };

static kt_worker *c_p1, *c_p2;
static bool c_p1_all(void *arg)
{
    return c_p1->assigned == C_PARTS;
}
static bool c_got(void *arg)
{
    return c_p1->n_got >= (size_t)(intptr_t)arg;
}
static bool c_split(void *arg)
{
    return c_p1->assigned == 2 && c_p2->assigned == 2;
}

/* How many of w's messages have key prefix "<prefix>-". */
static int count_prefix(const kt_worker *w, const char *prefix)
{
    int n = 0;
    size_t len = strlen(prefix);
    for (size_t i = 0; i < w->n_got; i++)
        n += !strncmp(w->got[i].key, prefix, len) && w->got[i].key[len] == '-';
    return n;
}

static int c_p1_second_want;
static bool c_p1_second(void *arg)
{
    return count_prefix(c_p1, "c2") >= c_p1_second_want;
}

static void scenario_pause(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    kt_source src;
    kt_source_start(&src, bs);
    kt_worker p1, p2;
    c_p1 = &p1;
    c_p2 = &p2;
    kt_worker_start(&p1, "p1", bs, "gC", "pausing", "replies", NULL, 0);
    kt_worker *ws[] = {&p1, &p2};
    check(kt_run_until(ws, 1, c_p1_all, NULL, 15000), "C: p1 holds all %d partitions", C_PARTS);
    for (int i = 0; i < C_BATCH; i++)
        kt_source_send(&src, "pausing", "c1", i);
    kt_source_flush(&src);
    check(kt_run_until(ws, 1, c_got, (void *)(intptr_t)C_BATCH, 10000), "C: p1 got batch 1");

    /* Backpressure: paused, still polling, nothing arrives. */
    check(svc_consumer_pause(p1.c) == SVC_KAFKA_OK && svc_consumer_paused(p1.c), "C: pause");
    memset(src.per_partition, 0, sizeof src.per_partition);
    for (int i = 0; i < C_BATCH; i++)
        kt_source_send(&src, "pausing", "c2", i);
    kt_source_flush(&src);
    kt_run_until(ws, 1, NULL, NULL, 1000);
    check(count_prefix(&p1, "c2") == 0, "C: paused p1 received %d", count_prefix(&p1, "c2"));

    /* A second member joins already paused: p1 keeps 2 paused partitions,
     * p2's new partitions start paused. */
    kt_worker_start(&p2, "p2", bs, "gC", "pausing", "replies", NULL, 0);
    check(svc_consumer_pause(p2.c) == SVC_KAFKA_OK, "C: pause p2 before it has partitions");
    check(kt_run_until(ws, 2, c_split, NULL, 20000), "C: split 2/2 (%d/%d)", p1.assigned,
          p2.assigned);
    kt_run_until(ws, 2, NULL, NULL, 1000);
    check(count_prefix(&p1, "c2") == 0 && p2.n_got == 0,
          "C: across the rebalance nothing fetched while paused (p1 %d, p2 %zu)",
          count_prefix(&p1, "c2"), p2.n_got);

    /* p1 resumes: exactly the batch-2 records of its 2 partitions arrive. */
    c_p1_second_want = 0;
    for (int p = 0; p < C_PARTS; p++)
        if (p1.parts_mask & (1ull << p))
            c_p1_second_want += src.per_partition[p];
    check(svc_consumer_resume(p1.c) == SVC_KAFKA_OK && !svc_consumer_paused(p1.c), "C: resume");
    check(kt_run_until(ws, 2, c_p1_second, NULL, 10000), "C: p1 got its %d after resume",
          c_p1_second_want);
    kt_run_until(ws, 2, NULL, NULL, 500);
    check(p2.n_got == 0, "C: p2 still paused (%zu)", p2.n_got);

    /* p2 leaves while paused: its partitions return to p1, which paused them
     * under its first assignment. librdkafka remembers that pause; the
     * consumer must resume them because p1 is no longer in backpressure. */
    kt_worker_stop(&p2);
    c_p1_second_want = C_BATCH;
    check(kt_run_until(ws, 1, c_p1_second, NULL, 20000),
          "C: p1 got all of batch 2 after p2 left (%d/%d): no stale pause", count_prefix(&p1, "c2"),
          C_BATCH);
    check(count_prefix(&p1, "c2") == C_BATCH && count_prefix(&p1, "c1") == C_BATCH,
          "C: no loss, no duplicate (c1 %d, c2 %d)", count_prefix(&p1, "c1"),
          count_prefix(&p1, "c2"));
    kt_worker_stop(&p1);
    svc_producer_destroy(src.p);
}

/* ---- G: eager fallback --------------------------------------------------------- */

enum { G_PARTS = 4, G_N = 16 };

static kt_worker *g_w1, *g_w2;
static bool g_w1_all(void *arg)
{
    return g_w1->assigned == G_PARTS;
}
static bool g_split_and_seen(void *arg)
{
    return g_w1->assigned == 2 && g_w2->assigned == 2 &&
           count_prefix(g_w1, "g") + count_prefix(g_w2, "g") >= 2 * G_N;
}

/* With an eager assignor (range) the consumer falls back to assign(): a
 * joining member makes every member give up everything first. */
static void scenario_eager(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    static const svc_kafka_kv range[] = {{"partition.assignment.strategy", "range"}};
    kt_source src;
    kt_source_start(&src, bs);
    kt_worker w1, w2;
    g_w1 = &w1;
    g_w2 = &w2;
    kt_worker_start(&w1, "g1", bs, "gG", "eager", "replies", range, 1);
    kt_worker *ws[] = {&w1, &w2};
    check(kt_run_until(ws, 1, g_w1_all, NULL, 15000), "G: g1 holds all %d partitions", G_PARTS);
    for (int i = 0; i < G_N; i++)
        kt_source_send(&src, "eager", "g", i);
    kt_source_flush(&src);
    kt_worker_start(&w2, "g2", bs, "gG", "eager", "replies", range, 1);
    for (int i = G_N; i < 2 * G_N; i++)
        kt_source_send(&src, "eager", "g", i);
    kt_source_flush(&src);
    check(kt_run_until(ws, 2, g_split_and_seen, NULL, 25000),
          "G: split 2/2 (%d/%d) and all %d requests consumed (%d)", w1.assigned, w2.assigned,
          2 * G_N, count_prefix(&w1, "g") + count_prefix(&w2, "g"));
    check(w1.min_after_first == 0 && w1.n_revoke_events >= 1,
          "G: eager rebalance revoked all of g1's partitions (min %d)", w1.min_after_first);
    check(w1.n_lost == 0 && w2.n_lost == 0, "G: nothing lost");
    kt_worker_stop(&w2);
    kt_worker_stop(&w1);
    svc_producer_destroy(src.p);
}

/* ---- D: headers through kcat, auto-created topics ---------------------------- */

static void scenario_headers(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    kt_source src;
    kt_source_start(&src, bs);
    const svc_kafka_header h[] = {
        {"request_id", "req-h1", 6}, {"attempt", "0", 1}, {"seq", "3", 1}, {"final", "1", 1}};
    svc_kafka_record r = {.topic = "hdrs", .partition = RD_KAFKA_PARTITION_UA,
                          .key = "req-h1", .key_len = 6, .value = "hello", .value_len = 5,
                          .headers = h, .n_headers = 4};
    char err[256];
    check(svc_producer_produce(src.p, &r, err, sizeof err) == SVC_KAFKA_OK, "D: produce: %s",
          err);
    r.topic = "auto.replies"; /* not created up front */
    check(svc_producer_produce(src.p, &r, err, sizeof err) == SVC_KAFKA_OK, "D: produce: %s",
          err);
    kt_source_flush(&src);
    check(src.delivered == 2 && src.failed == 0, "D: delivered %d (auto-created topic too)",
          src.delivered);
    svc_producer_destroy(src.p);

    if (!have_kcat()) {
        fprintf(stderr, "  D: kcat not found, skipping the kcat reads\n");
        return;
    }
    char out[4096];
    int rc = kcat("-C -t hdrs -o beginning -e -q -f '%k|%h|%s\\n'", out, sizeof out);
    check(rc == 0 && !strcmp(out, "req-h1|request_id=req-h1,attempt=0,seq=3,final=1|hello\n"),
          "D: kcat read (rc %d): %s", rc, out);
}

/* ---- F: a full producer queue ------------------------------------------------- */

enum { F_N = 300, F_QUEUE = 5 };

typedef struct f_state {
    svc_producer *p;
    pthread_t dr_thread;
    int reports, delivered, off_thread_reports;
    int other_ok; /* produced from the other thread */
} f_state;

static void f_dr(void *opaque, const svc_delivery *d)
{
    f_state *f = opaque;
    f->reports++;
    f->delivered += d->err == RD_KAFKA_RESP_ERR_NO_ERROR;
    f->off_thread_reports += !pthread_equal(pthread_self(), f->dr_thread);
}

static int f_produce(f_state *f, int n)
{
    int ok = 0;
    for (int i = 0; i < n; i++) {
        svc_kafka_record r = {.topic = "full", .partition = RD_KAFKA_PARTITION_UA,
                              .key = "k", .key_len = 1, .value = "v", .value_len = 1};
        ok += svc_producer_produce(f->p, &r, NULL, 0) == SVC_KAFKA_OK;
    }
    return ok;
}

/* An engine thread streaming chunks: on a full queue it waits for the
 * delivery-report thread to drain it, and never runs reports itself. */
static void *f_engine_thread(void *arg)
{
    f_state *f = arg;
    f->other_ok = f_produce(f, F_N);
    return NULL;
}

static void scenario_queue_full(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    f_state f = {.dr_thread = pthread_self()};
    const svc_kafka_kv kv[] = {{"queue.buffering.max.messages", "5"}, {"linger.ms", "0"}};
    svc_producer_config pc = {.brokers = bootstraps, .kafka = kv, .n_kafka = 2,
                              .on_delivery = f_dr, .opaque = &f, .queue_full_ms = 10000};
    char err[256];
    check(svc_producer_create(&pc, &f.p, err, sizeof err) == SVC_KAFKA_OK, "F: producer: %s",
          err);
    if (!f.p)
        return;
    svc_producer_poll(f.p, 0); /* this thread serves the delivery reports */
    int ok = f_produce(&f, F_N);
    check(ok == F_N, "F: the report thread produced %d/%d through a %d-record queue", ok, F_N,
          F_QUEUE);
    pthread_t t;
    check(pthread_create(&t, NULL, f_engine_thread, &f) == 0, "F: thread");
    for (int64_t dl = pu_now_ms() + 20000; f.reports < 2 * F_N && pu_now_ms() < dl;)
        svc_producer_poll(f.p, 10);
    pthread_join(t, NULL);
    check(f.other_ok == F_N, "F: another thread produced %d/%d", f.other_ok, F_N);
    check(svc_producer_flush(f.p, 10000, err, sizeof err) == SVC_KAFKA_OK, "F: flush: %s", err);
    check(f.reports == 2 * F_N && f.delivered == 2 * F_N, "F: %d reports, %d delivered",
          f.reports, f.delivered);
    check(f.off_thread_reports == 0, "F: %d reports ran off the report thread",
          f.off_thread_reports);
    svc_producer_destroy(f.p);
}

/* ---- E: the standalone mock-kafka command ------------------------------------ */

static void scenario_cli(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    bs = bootstraps;
    const char *bin = ML_BINARY_DIR "/service/mllama";
    if (access(bin, X_OK) != 0 || !have_kcat()) {
        fprintf(stderr, "  E: %s or kcat missing, skipping the mock-kafka command\n", bin);
        return;
    }
    char port_file[] = "/tmp/mllama-mock-kafka-XXXXXX";
    int tmpfd = mkstemp(port_file);
    check(tmpfd >= 0, "E: mkstemp");
    close(tmpfd);
    unlink(port_file);

    int pipefd[2];
    check(pipe(pipefd) == 0, "E: pipe");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], STDOUT_FILENO);
        close(pipefd[0]);
        close(pipefd[1]);
        execl(bin, "mllama", "mock-kafka", "--brokers", "1", "--topics", "cli:3", "--port-file",
              port_file, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char line[256] = {0};
    size_t n = 0;
    struct pollfd pfd = {pipefd[0], POLLIN, 0};
    for (int64_t dl = pu_now_ms() + 10000; pu_now_ms() < dl && !memchr(line, '\n', n);) {
        if (poll(&pfd, 1, 100) > 0) {
            ssize_t k = read(pipefd[0], line + n, sizeof line - 1 - n);
            if (k <= 0)
                break;
            n += (size_t)k;
        }
    }
    char *nl = memchr(line, '\n', n);
    check(nl != NULL, "E: mock-kafka printed its bootstrap servers (%s)", line);
    if (nl) {
        *nl = '\0';
        char file[256] = {0};
        FILE *f = fopen(port_file, "r");
        check(f && fgets(file, sizeof file, f), "E: port file written");
        if (f)
            fclose(f);
        file[strcspn(file, "\n")] = '\0';
        check(!strcmp(file, line), "E: port file '%s' = stdout '%s'", file, line);
        char cmd[512], out[4096];
        snprintf(cmd, sizeof cmd, "timeout 20 kcat -b %s -L -t cli 2>&1", line);
        FILE *k = popen(cmd, "r");
        size_t m = k ? fread(out, 1, sizeof out - 1, k) : 0;
        out[m] = '\0';
        if (k)
            pclose(k);
        check(strstr(out, "topic \"cli\" with 3 partitions") != NULL, "E: kcat -L: %s", out);
    }
    kill(pid, SIGTERM);
    int status = -1;
    pid_t done = 0;
    for (int64_t dl = pu_now_ms() + 10000; pu_now_ms() < dl && done == 0; pu_sleep_ms(20))
        done = waitpid(pid, &status, WNOHANG);
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    check(done == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "E: mock-kafka exits 0 on SIGTERM (status %d)", status);
    check(access(port_file, F_OK) != 0, "E: port file removed on exit");
    close(pipefd[0]);
}

/* ---- H: one topic paused (a tenant's request topic) ------------------------- */

/* Poll c for up to ms (each poll waiting up to poll_ms), finishing every
 * message; counts per topic ("ta", any other). */
static void h_poll(svc_consumer *c, int ms, int poll_ms, int *ta, int *tb)
{
    for (int64_t end = pu_now_ms() + ms; pu_now_ms() < end;) {
        svc_kafka_msg m;
        if (svc_consumer_poll(c, poll_ms, &m) != SVC_KAFKA_OK)
            continue;
        *(strcmp(m.topic, "ta") ? tb : ta) += 1;
        char err[256];
        svc_consumer_finish(c, &m.ticket, err, sizeof err);
        svc_kafka_msg_release(&m);
    }
}

/* A paused topic is a queue the consumer does not read (kafka_consumer.c,
 * "one queue per topic"): the application thread never asks librdkafka to
 * pause or resume a partition, which keeps clear of 2.0.2's pause races.
 * Read from librdkafka's debug log ("topic"), which says when it starts
 * consuming a partition, so that a log without any line is not taken for a
 * log without asks. */
static void h_check_log(FILE *log)
{
    static const char *const asks[] = {"[thrd:app]: Pause ", "[thrd:app]: Resume "};
    static const char start[] = "Start consuming ta [";
    int n_asks = 0, n_starts = 0;
    char line[1024];
    rewind(log);
    while (fgets(line, sizeof line, log)) {
        n_starts += strstr(line, start) != NULL;
        for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++)
            if (strstr(line, asks[i])) {
                n_asks++;
                check(false, "H: the application asked librdkafka: %s", line);
            }
    }
    check(n_starts > 0 && n_asks == 0, "H: %d partitions of ta started, %d pauses or resumes "
          "asked", n_starts, n_asks);
}

static void scenario_pause_topic(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    enum { N = 10, PARTS = 2 };
    const char *topics[] = {"ta", "tb"};
    static const svc_kafka_kv debug[] = {{"debug", "topic"}}; /* for h_check_log */
    svc_kafka_kv kv[KT_N_GROUP_KV + KT_MAX_EXTRA_KV];
    const size_t n_kv = kt_group_kv_with(kv, debug, sizeof debug / sizeof debug[0]);
    FILE *log = tmpfile();
    check(log != NULL, "H: tmpfile");
    if (!log)
        return;
    svc_log_set_output(log);
    svc_log_set_level(SVC_LOG_DEBUG);
    svc_consumer_config cc = {.brokers = bootstraps, .group_id = "gH", .topics = topics,
                              .n_topics = 2, .kafka = kv, .n_kafka = n_kv};
    svc_consumer *c = NULL;
    char err[256];
    check(svc_consumer_create(&cc, &c, err, sizeof err) == SVC_KAFKA_OK, "H: consumer: %s", err);
    if (!c) {
        svc_log_set_output(stderr);
        fclose(log);
        return;
    }
    /* Before the assignment: the intent holds for partitions assigned later. */
    check(svc_consumer_pause_topic(c, "ta", true) == SVC_KAFKA_OK, "H: pause ta");
    check(svc_consumer_pause_topic(c, "nope", true) == SVC_KAFKA_ERR_INVALID,
          "H: a topic not subscribed to is refused");
    check(!svc_consumer_paused(c), "H: not every topic is paused");
    kt_source src;
    kt_source_start(&src, bootstraps);
    for (int i = 0; i < N; i++) {
        kt_source_send(&src, "ta", "a", i);
        kt_source_send(&src, "tb", "b", i);
    }
    check(svc_producer_flush(src.p, 10000, err, sizeof err) == SVC_KAFKA_OK, "H: flush: %s", err);
    int ta = 0, tb = 0;
    for (int64_t end = pu_now_ms() + 15000; tb < N && pu_now_ms() < end;)
        h_poll(c, 100, 50, &ta, &tb);
    h_poll(c, 1000, 50, &ta, &tb);
    check(tb == N && ta == 0, "H: while ta is paused, tb's %d of %d came and ta's %d", tb, N, ta);
    check(svc_consumer_paused_partitions(c) == PARTS, "H: %d partitions paused, want %d",
          svc_consumer_paused_partitions(c), PARTS);
    check(svc_consumer_pause_topic(c, "ta", false) == SVC_KAFKA_OK, "H: resume ta");
    for (int64_t end = pu_now_ms() + 15000; ta < N && pu_now_ms() < end;)
        h_poll(c, 100, 50, &ta, &tb);
    check(ta == N && tb == N, "H: after the resumption ta's %d of %d", ta, N);
    check(svc_consumer_paused_partitions(c) == 0, "H: nothing paused");
    svc_consumer_close(c, err, sizeof err);
    svc_consumer_destroy(c);
    svc_producer_destroy(src.p);
    svc_log_set_output(stderr);
    h_check_log(log);
    fclose(log);
}

/* ---- I: pause before the first record -------------------------------------- */

static void i_on_assign(void *opaque, const rd_kafka_topic_partition_list_t *parts)
{
    *(int *)opaque += parts->cnt;
}

/* A topic paused when librdkafka has fetched its records into its queue but
 * handed out none: they wait there, and every record arrives, once, after
 * the resumption. */
static void scenario_pause_unread(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    (void)mc;
    enum { N = 12, PARTS = 2, FETCH_MS = 1500 };
    const char *topics[] = {"unread"};
    int assigned = 0;
    svc_consumer_config cc = {.brokers = bootstraps, .group_id = "gI", .topics = topics,
                              .n_topics = 1, .kafka = kt_group_kv,
                              .n_kafka = KT_N_GROUP_KV,
                              .events = {.on_assign = i_on_assign, .opaque = &assigned}};
    kt_source src;
    kt_source_start(&src, bootstraps);
    for (int i = 0; i < N; i++)
        kt_source_send(&src, "unread", "u", i);
    char err[256];
    check(svc_producer_flush(src.p, 10000, err, sizeof err) == SVC_KAFKA_OK, "I: flush: %s", err);
    svc_consumer *c = NULL;
    check(svc_consumer_create(&cc, &c, err, sizeof err) == SVC_KAFKA_OK, "I: consumer: %s", err);
    if (!c)
        return;
    int got = 0, ignored = 0;
    for (int64_t end = pu_now_ms() + 15000; assigned < PARTS && got == 0 && pu_now_ms() < end;)
        h_poll(c, 10, 10, &ignored, &got);
    check(assigned == PARTS && got == 0, "I: assigned %d of %d partitions before any record (%d)",
          assigned, PARTS, got);
    /* Not polling: librdkafka fetches every record into its queue meanwhile. */
    pu_sleep_ms(FETCH_MS);
    check(svc_consumer_pause_topic(c, "unread", true) == SVC_KAFKA_OK, "I: pause");
    h_poll(c, 500, 50, &ignored, &got);
    check(got == 0, "I: %d records handed out while paused", got);
    check(svc_consumer_pause_topic(c, "unread", false) == SVC_KAFKA_OK, "I: resume");
    for (int64_t end = pu_now_ms() + 15000; got < N && pu_now_ms() < end;)
        h_poll(c, 100, 50, &ignored, &got);
    h_poll(c, 500, 50, &ignored, &got);
    check(got == N, "I: %d of %d records after the resumption", got, N);
    svc_consumer_close(c, err, sizeof err);
    svc_consumer_destroy(c);
    svc_producer_destroy(src.p);
}

/* ---- J: a paused topic's backlog does not hold up another topic ------------ */

/* A tenant's flood (service/README.md §1): "jflood" holds far more records
 * than librdkafka's pre-fetch limit (queued.min.messages, 1000 by default),
 * and the consumer takes J_CAP of them, pauses the topic for J_PAUSE_MS and
 * resumes it, over and over, as the worker does with a tenant at its
 * max_in_flight; meanwhile "jquiet" gets a record every J_GAP_MS. With every
 * partition's records in one queue, the flood's prefetched records stopped
 * every partition's fetching for up to a second at a time (kafka_consumer.c,
 * "one queue per topic"): the quiet records waited 0.5 s to 1 s. The bound
 * is many fetch waits (kafka.fetch.wait.max.ms J_FETCH_WAIT_MS) and well
 * under that second, on the median: one late record is not the failure. */
enum { J_FLOOD = 4000, J_QUIET = 12, J_CAP = 16, J_PAUSE_MS = 100, J_GAP_MS = 150,
       J_MEDIAN_MS = 300 };
#define J_FETCH_WAIT_MS "20"

static void scenario_backlog(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    (void)mc;
    const char *topics[] = {"jflood", "jquiet"};
    static const svc_kafka_kv fetch[] = {{"fetch.wait.max.ms", J_FETCH_WAIT_MS}};
    svc_kafka_kv kv[KT_N_GROUP_KV + KT_MAX_EXTRA_KV];
    const size_t n_kv = kt_group_kv_with(kv, fetch, sizeof fetch / sizeof fetch[0]);
    svc_consumer_config cc = {.brokers = bootstraps, .group_id = "gJ", .topics = topics,
                              .n_topics = 2, .kafka = kv, .n_kafka = n_kv};
    kt_source src;
    kt_source_start(&src, bootstraps);
    for (int i = 0; i < J_FLOOD; i++)
        kt_source_send(&src, "jflood", "f", i);
    kt_source_flush(&src);
    char err[256];
    svc_consumer *c = NULL;
    check(svc_consumer_create(&cc, &c, err, sizeof err) == SVC_KAFKA_OK, "J: consumer: %s", err);
    if (!c) {
        svc_producer_destroy(src.p);
        return;
    }
    int64_t sent[J_QUIET];
    bool got[J_QUIET] = {false};
    double wait_ms[J_QUIET];
    int n_sent = 0, n_got = 0, flood = 0, taken = 0;
    bool paused = false;
    int64_t next_send = 0, resume_at = 0;
    for (int64_t end = pu_now_ms() + 30000; n_got < J_QUIET && pu_now_ms() < end;) {
        int64_t now = pu_now_ms();
        /* The quiet records start once the flood flows. */
        if (flood > 0 && n_sent < J_QUIET && now >= next_send) {
            sent[n_sent] = pu_now_us();
            kt_source_send(&src, "jquiet", "q", n_sent++);
            svc_producer_poll(src.p, 0);
            next_send = now + J_GAP_MS;
        }
        if (paused && now >= resume_at) {
            svc_consumer_pause_topic(c, "jflood", false);
            paused = false;
            taken = 0;
        }
        svc_kafka_msg m;
        if (svc_consumer_poll(c, 5, &m) != SVC_KAFKA_OK)
            continue;
        if (!strcmp(m.topic, "jquiet")) {
            char key[32];
            snprintf(key, sizeof key, "%.*s", (int)m.key_len, m.key ? (const char *)m.key : "");
            int k = key_index(key);
            if (k >= 0 && k < n_sent && !got[k]) {
                got[k] = true;
                wait_ms[n_got++] = (double)(pu_now_us() - sent[k]) / 1000;
            }
        } else {
            flood++;
            if (++taken == J_CAP) {
                svc_consumer_pause_topic(c, "jflood", true);
                paused = true;
                resume_at = pu_now_ms() + J_PAUSE_MS;
            }
        }
        svc_consumer_finish(c, &m.ticket, err, sizeof err);
        svc_kafka_msg_release(&m);
    }
    check(n_got == J_QUIET, "J: %d of %d quiet records", n_got, J_QUIET);
    double median = n_got ? bench_median(wait_ms, (size_t)n_got) : 0;
    check(median <= J_MEDIAN_MS, "J: under the flood's backlog the quiet records waited %.0f ms "
          "(median of %d; want <= %d)", median, n_got, J_MEDIAN_MS);
    check(flood > J_CAP, "J: the flood flowed (%d records)", flood);
    svc_consumer_close(c, err, sizeof err);
    svc_consumer_destroy(c);
    svc_producer_destroy(src.p);
}

/* ---- K: closed between the JoinGroup and the SyncGroup ------------------------ */

/* librdkafka before 2.3.0 aborts in rd_kafka_destroy when the group answered
 * the member's JoinGroup but not yet its SyncGroup (kafka_consumer.c,
 * "Leaving"). The group's coordinator answers the SyncGroup K_SYNC_DELAY_MS
 * late, and the consumer is closed and destroyed K_CLOSE_AFTER_MS after its
 * subscription: after the first join round (the mock's takes
 * session.timeout.ms - 1 s) and well before the SyncGroup's answer. The
 * process must survive it (the scenario runs in its own), and the close
 * waits for the assignment. */
enum { K_COORDINATOR = 1, K_SYNC_DELAY_MS = 6000, K_CLOSE_AFTER_MS = 4000 };
#define K_SYNC_GROUP_API 14

static void k_on_assign(void *opaque, const rd_kafka_topic_partition_list_t *parts)
{
    (void)parts;
    *(bool *)opaque = true;
}

static void scenario_close_mid_join(const char *bootstraps, rd_kafka_mock_cluster_t *mc)
{
    rd_kafka_mock_coordinator_set(mc, "group", "gK", K_COORDINATOR);
    rd_kafka_mock_broker_push_request_error_rtts(mc, K_COORDINATOR, K_SYNC_GROUP_API, 1,
                                                 RD_KAFKA_RESP_ERR_NO_ERROR, K_SYNC_DELAY_MS);
    const char *topics[] = {"kjoin"};
    bool assigned = false;
    svc_consumer_config cc = {.brokers = bootstraps, .group_id = "gK", .topics = topics,
                              .n_topics = 1, .kafka = kt_group_kv,
                              .n_kafka = KT_N_GROUP_KV,
                              .events = {.on_assign = k_on_assign, .opaque = &assigned}};
    char err[256];
    svc_consumer *c = NULL;
    check(svc_consumer_create(&cc, &c, err, sizeof err) == SVC_KAFKA_OK, "K: consumer: %s", err);
    if (!c)
        return;
    int ignored = 0;
    h_poll(c, K_CLOSE_AFTER_MS, 50, &ignored, &ignored);
    check(!assigned, "K: closed before the SyncGroup's answer");
    int64_t t0 = pu_now_ms();
    check(svc_consumer_close(c, err, sizeof err) == SVC_KAFKA_OK, "K: close: %s", err);
    check(assigned, "K: the close waited for the assignment (%lld ms)",
          (long long)(pu_now_ms() - t0));
    svc_consumer_destroy(c);
}

int main(void)
{
    static const kt_scenario scenarios[] = {
        {'A', "offsets and restart", "requests:4,replies:4,dlt:1", scenario_offsets_restart},
        {'B', "cooperative rebalance", "shared:6,replies:4", scenario_cooperative},
        {'C', "pause across rebalances", "pausing:4,replies:4", scenario_pause},
        {'D', "headers and auto-created topics", "hdrs:1", scenario_headers},
        {'E', "mllama mock-kafka", NULL, scenario_cli},
        {'F', "full producer queue", "full:2", scenario_queue_full},
        {'G', "eager fallback", "eager:4,replies:2", scenario_eager},
        {'H', "one topic paused", "ta:2,tb:2", scenario_pause_topic},
        {'I', "pause before the first record", "unread:2", scenario_pause_unread},
        {'J', "a paused topic's backlog", "jflood:4,jquiet:2", scenario_backlog},
        {'K', "closed between JoinGroup and SyncGroup", "kjoin:2", scenario_close_mid_join},
    };
    return kt_run_scenarios(scenarios, sizeof scenarios / sizeof scenarios[0], 50000);
}
