/* What `mllama gateway` costs a client: the time it adds to every token and
 * to the first one, and how many idle streams one gateway holds in how much
 * memory.
 *
 *     ML_BENCH=1 bench_gateway [REQUESTS [MAX_TOKENS [STREAMS]]]
 *
 * Without ML_BENCH=1 it exits 77 (skipped) at once. Processes as in
 * production: `mllama mock-kafka`, a redis-server, a worker on the micro
 * model and the gateway, all fetching with fetch.wait.max.ms=1 (the mock
 * answers an empty Fetch only after that wait, so a longer one would
 * measure the mock: bench_service.c).
 *
 * Latency. REQUESTS requests, one at a time, each sent twice in turn: once
 * through the gateway (HTTP POST, stream: true, the SSE events timestamped
 * as they come off the socket) and once straight to the request topic (as
 * a client of the Kafka contract would). A thread of the bench reads both
 * reply topics, the gateway's own included, and the request topic, and
 * timestamps every record.
 *   per token:    SSE event k seen - the reply record k of the same request
 *                 seen on the gateway's reply topic (the gateway's consume,
 *                 rewrite and write, the bench's read), paired per token;
 *   first token:  the same for k = 0 (reply side), and end to end: POST
 *                 sent -> event 0 seen, against a direct request's produce
 *                 started -> its record 0 seen, over the same worker; their
 *                 p50 and p99 compared; and the request side alone: POST
 *                 sent -> the gateway's request record seen, against
 *                 produce started -> the direct request's record seen.
 * Goal (issue 25): <= 2 ms added per token at p99.
 *
 * Streams. The worker is stopped (SIGSTOP), so requests wait in Kafka and
 * their streams stay open and idle; STREAMS of them are opened in steps of a
 * quarter, each step waiting until the gateway counts them
 * (mllama_gateway_streams_open) and has answered each with its 200 and
 * headers (its keep-alive comment sends them, gateway.keepalive_s=1); the
 * gateway's resident memory (VmRSS, /proc) is read at every step.
 * Memory per stream = growth / streams opened. Goal: 1000 concurrent
 * streams in <= 200 MiB of gateway memory. */
#include <sys/resource.h>

#include "bench/bench_samples.h"
#include "gw_client.h"

#define DEFAULT_REQUESTS 50
#define DEFAULT_TOKENS 64
#define DEFAULT_STREAMS 1000
#define STREAMS_MAX 60000 /* descriptors: the bench and the gateway hold one each */
#define WARMUP 3
#define STEPS 4           /* streams opened in this many steps */
#define KEEPALIVE_S "1"   /* gateway.keepalive_s: an idle stream's 200 goes out with it */
#define LIMIT_SLACK 64    /* the gateway's limits above STREAMS: the latency part's requests */
#define CALL_MS 30000     /* one request answered */
#define OPEN_MS 60000     /* a step of streams counted by the gateway */
#define RECORDS_MAX (1 << 18) /* reply and request records the reader keeps */
#define TOKENS_MAX 4000
#define EVENTS_MAX (TOKENS_MAX + 2) /* a stream's: its tokens, the final and [DONE] */
#define GOAL_TOKEN_P99_MS 2.0
#define GOAL_STREAMS 1000
#define GOAL_STREAMS_MIB 200.0
#define PROMPT "Tell me about the sea."
#define MIB (1024.0 * 1024.0)
#define OBSERVER_NICE -15 /* the bench's threads (observer_priority) */
#define REQUEST_SEQ -1 /* a request record has no seq header (pu_record.seq) */

static pu_stack st;
static pu_proc *const worker = &st.workers[0];
static gwt_gateway gw;

static void print_row(const char *what, samples *s)
{
    printf("  %-50s n %5zu  p50 %8.3f ms  p99 %8.3f ms  max %8.3f ms\n", what, s->n,
           samples_percentile(s, 50), samples_percentile(s, 99), samples_percentile(s, 100));
}

/* ---- the reply topics, read on a thread of their own -------------------------------- */

/* When a reply record was read; what the bench matches events with. */
typedef struct seen {
    char key[64];
    int seq;
    bool final;
    int64_t t_us;
} seen;

static struct {
    pu_client client; /* the thread's alone */
    pthread_mutex_t lock;
    seen recs[RECORDS_MAX]; /* [0, n) under lock */
    size_t n;
    atomic_bool stop;
    pthread_t thread;
} reader = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *read_replies(void *arg)
{
    (void)arg;
    size_t copied = 0;
    while (!atomic_load(&reader.stop)) {
        pu_client_poll(&reader.client, 0);
        pthread_mutex_lock(&reader.lock);
        for (; copied < reader.client.n && reader.n < RECORDS_MAX; copied++) {
            const pu_record *r = &reader.client.recs[copied];
            seen *s = &reader.recs[reader.n++];
            snprintf(s->key, sizeof s->key, "%s", r->key);
            s->seq = r->seq;
            s->final = r->final;
            s->t_us = r->t_us;
        }
        pthread_mutex_unlock(&reader.lock);
    }
    return NULL;
}

/* When record `seq` of request `key` was read (its final record with
 * ANY_FINAL), waiting up to CALL_MS for it; -1 when it never came. */
#define ANY_FINAL -2
static int64_t record_seen(const char *key, int seq)
{
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < CALL_MS; pu_sleep_ms(1)) {
        pthread_mutex_lock(&reader.lock);
        int64_t t = -1;
        for (size_t i = reader.n; i-- > 0 && t < 0;) {
            const seen *r = &reader.recs[i];
            if ((seq == ANY_FINAL ? r->final : r->seq == seq) && !strcmp(r->key, key))
                t = r->t_us;
        }
        pthread_mutex_unlock(&reader.lock);
        if (t >= 0)
            return t;
    }
    return -1;
}

/* ---- latency --------------------------------------------------------------------------- */

typedef struct latency {
    samples token_added, first_added, ttft_gateway, ttft_direct, produced_gateway,
        produced_direct;
    size_t tokens, requests;
} latency;

/* One request through the gateway: every event's arrival paired with its
 * record's. */
static void through_gateway(latency *l, const char *extra, bool record)
{
    char *body = gwt_chat_body(PROMPT, NULL, extra);
    int64_t t0 = pu_now_us();
    int fd = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body, CALL_MS);
    free(body);
    if (fd < 0)
        pu_die("gateway: connect");
    gwt_response r = {0};
    int64_t at[EVENTS_MAX];
    int n = 0;
    for (;; n++) {
        char until[48];
        snprintf(until, sizeof until, "id: %d\ndata: ", n);
        if (!gwt_read(fd, &r, until, CALL_MS))
            break;
        at[n] = pu_now_us();
        if (n + 1 == (int)(sizeof at / sizeof at[0]))
            pu_die("more events than the bench holds");
    }
    close(fd);
    char id[64];
    if (r.status != 200 || !gwt_header(&r, "X-Request-Id", id, sizeof id) || n < 3 ||
        !strstr(r.body, "data: [DONE]\n\n"))
        pu_die("gateway: not a whole stream");
    gwt_response_free(&r);
    /* The last event is [DONE]: it has no record of its own. */
    int tokens = n - 1;
    int64_t rec[EVENTS_MAX];
    for (int k = 0; k < tokens; k++)
        if ((rec[k] = record_seen(id, k)) < 0)
            pu_die("a record of the gateway's request never seen on its reply topic");
    int64_t produced = record_seen(id, REQUEST_SEQ);
    if (produced < 0)
        pu_die("the gateway's request never seen on the request topic");
    if (!record)
        return;
    samples_add(&l->produced_gateway, (double)(produced - t0) / 1000);
    for (int k = 0; k < tokens; k++)
        samples_add(&l->token_added, (double)(at[k] - rec[k]) / 1000);
    samples_add(&l->first_added, (double)(at[0] - rec[0]) / 1000);
    samples_add(&l->ttft_gateway, (double)(at[0] - t0) / 1000);
    l->tokens += (size_t)tokens;
    l->requests++;
}

/* The same request straight to the request topic: its first record's time,
 * then its end (the next request finds the worker idle). */
static void direct(latency *l, pu_client *producer, int i, const char *extra, bool record)
{
    char id[64];
    snprintf(id, sizeof id, "direct-%d", i);
    char *body = pu_chat_request(id, PROMPT, NULL, extra);
    int64_t t0 = pu_now_us();
    if (!pu_client_send(producer, id, body))
        pu_die("direct: produce");
    free(body);
    int64_t first = record_seen(id, 0), produced = record_seen(id, REQUEST_SEQ);
    if (first < 0 || produced < 0 || record_seen(id, ANY_FINAL) < 0)
        pu_die("direct: no reply");
    if (record) {
        samples_add(&l->ttft_direct, (double)(first - t0) / 1000);
        samples_add(&l->produced_direct, (double)(produced - t0) / 1000);
    }
}

static void measure_latency(int requests, int max_tokens)
{
    char extra[128];
    snprintf(extra, sizeof extra, "\"stream\":true,\"max_tokens\":%d,\"temperature\":0",
             max_tokens);
    pu_client producer;
    pu_client_init(&producer, st.brokers, NULL, 0);
    latency l = {0};
    for (int i = 0; i < WARMUP + requests; i++) {
        through_gateway(&l, extra, i >= WARMUP);
        direct(&l, &producer, i, extra, i >= WARMUP);
    }
    pu_client_deinit(&producer);
    printf("latency: %zu requests, %.1f reply records each (a token each, the final "
           "included), one at a time\n",
           l.requests, (double)l.tokens / (double)l.requests);
    print_row("added per token (SSE event - reply record)", &l.token_added);
    print_row("added to the first token, reply side", &l.first_added);
    print_row("request on the request topic, through the gateway", &l.produced_gateway);
    print_row("request on the request topic, direct", &l.produced_direct);
    print_row("first token, through the gateway", &l.ttft_gateway);
    print_row("first token, direct to Kafka", &l.ttft_direct);
    double gp50 = samples_percentile(&l.ttft_gateway, 50), dp50 = samples_percentile(&l.ttft_direct, 50);
    double gp99 = samples_percentile(&l.ttft_gateway, 99), dp99 = samples_percentile(&l.ttft_direct, 99);
    printf("  %-50s         p50 %+8.3f ms  p99 %+8.3f ms\n", "first token, gateway - direct",
           gp50 - dp50, gp99 - dp99);
    double p99 = samples_percentile(&l.token_added, 99);
    printf("  goal: <= %.0f ms added per token at p99: %s\n\n", GOAL_TOKEN_P99_MS,
           p99 <= GOAL_TOKEN_P99_MS ? "met" : "not met");
    samples *all[] = {&l.token_added,      &l.first_added,     &l.ttft_gateway,
                      &l.ttft_direct,      &l.produced_gateway, &l.produced_direct};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        samples_free(all[i]);
}

/* ---- streams held ---------------------------------------------------------------------- */

/* The gateway's resident set in bytes (VmRSS); -1 when unreadable. */
static double gateway_rss(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)gw.proc.pid);
    char *s = pu_slurp(path, NULL);
    const char *v = s ? strstr(s, "VmRSS:") : NULL;
    double kib = v ? atof(v + strlen("VmRSS:")) : -1;
    free(s);
    return kib < 0 ? -1 : kib * 1024;
}

/* Open streams [from, to) on fds; wait until the gateway counts `to` streams
 * and has answered each new one with its 200. */
static void open_streams(int *fds, int from, int to)
{
    char *body = gwt_chat_body(PROMPT, NULL, "\"stream\":true,\"max_tokens\":16");
    for (int i = from; i < to; i++)
        if ((fds[i] = gwt_send_request(gw.port, "POST", "/v1/chat/completions", NULL, body,
                                       OPEN_MS)) < 0)
            pu_die("stream: connect (raise ulimit -n?)");
    free(body);
    int64_t t0 = pu_now_ms();
    while (pu_metric(gw.ops_port, "mllama_gateway_streams_open") < to) {
        if (pu_now_ms() - t0 > OPEN_MS)
            pu_die("the gateway does not count the streams opened");
        pu_sleep_ms(50);
    }
    for (int i = from; i < to; i++) {
        gwt_response r = {0};
        if (!gwt_read(fds[i], &r, ": keep-alive", OPEN_MS) || r.status != 200)
            pu_die("a stream not answered 200 with a keep-alive");
        gwt_response_free(&r);
    }
}

static void measure_streams(int n)
{
    /* From now on requests wait in Kafka: their streams stay open and idle. */
    pu_signal(worker, SIGSTOP);
    double base = gateway_rss();
    int *fds = malloc((size_t)n * sizeof *fds);
    if (!fds || base < 0)
        pu_die("streams: setup");
    printf("streams: idle SSE streams held open (the worker stopped), gateway VmRSS "
           "%.1f MiB before\n",
           base / MIB);
    double rss = base;
    for (int step = 1; step <= STEPS; step++) {
        int from = n * (step - 1) / STEPS, to = n * step / STEPS;
        int64_t t0 = pu_now_ms();
        open_streams(fds, from, to);
        rss = gateway_rss();
        printf("  %6d streams open (%5.1f s to open %d, answered at the " KEEPALIVE_S
               " s keep-alive)  VmRSS %7.1f MiB  %6.1f KiB per stream\n",
               to, (double)(pu_now_ms() - t0) / 1000, to - from, rss / MIB,
               (rss - base) / 1024 / to);
    }
    printf("  connections open (gateway's count): %.0f\n",
           pu_metric(gw.ops_port, "mllama_gateway_connections_open"));
    for (int i = 0; i < n; i++)
        close(fds[i]);
    free(fds);
    pu_signal(worker, SIGCONT);
    double per_stream = (rss - base) / n;
    double at_goal = (base + per_stream * GOAL_STREAMS) / MIB;
    printf("  goal: %d streams in <= %.0f MiB: %.1f MiB at %d streams (%s)\n\n", GOAL_STREAMS,
           GOAL_STREAMS_MIB, at_goal, GOAL_STREAMS,
           at_goal <= GOAL_STREAMS_MIB ? "met" : "not met");
}

/* ---- main ------------------------------------------------------------------------------ */

/* Descriptors for n streams in this process and the gateway it starts. */
static void raise_fd_limit(int n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        pu_die("getrlimit");
    rlim_t want = (rlim_t)n + 1024;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want)
        fprintf(stderr, "descriptors limited to %llu: fewer streams may open\n",
                (unsigned long long)rl.rlim_cur);
}

/* The bench's threads are the observer: on a loaded machine a reader that
 * waits for a CPU charges its wait to whatever it measures (stalls of up to
 * 100 ms, seen with perf: the gateway had written the events long before).
 * The processes measured were spawned before this and keep their priority;
 * the threads started from here on inherit it. Needs CAP_SYS_NICE; without
 * it the run goes on at the usual priority and says so. */
static void observer_priority(void)
{
    if (setpriority(PRIO_PROCESS, 0, OBSERVER_NICE) != 0)
        fprintf(stderr, "observer at the usual priority (setpriority: %s): on a loaded "
                        "machine its own waits count as the gateway's\n",
                strerror(errno));
}

int main(int argc, char **argv)
{
    ml_bench_require();
    int requests = argc > 1 ? atoi(argv[1]) : DEFAULT_REQUESTS;
    int max_tokens = argc > 2 ? atoi(argv[2]) : DEFAULT_TOKENS;
    int streams = argc > 3 ? atoi(argv[3]) : DEFAULT_STREAMS;
    if (requests < 1 || max_tokens < 2 || max_tokens > TOKENS_MAX || streams < STEPS ||
        streams > STREAMS_MAX)
        pu_die("usage: bench_gateway [REQUESTS >= 1 [MAX_TOKENS in 2..4000 [STREAMS in "
               "4..60000]]]");
    raise_fd_limit(streams);
    pu_stack_start(&st, "gwbench", GWT_TOPICS);
    const char *worker_sets[] = {"kafka.fetch.wait.max.ms=1", NULL};
    if (!pu_worker_start(worker, &st.env, "bench-worker", worker_sets) ||
        !pu_wait_assigned(worker, CALL_MS))
        pu_die("worker start");
    /* Room for every stream, and no rate limit: the streams phase opens them
     * as fast as it can. */
    char conns[64], max_streams[64], tenant_streams[64];
    snprintf(conns, sizeof conns, "gateway.max_connections=%d", streams + LIMIT_SLACK);
    snprintf(max_streams, sizeof max_streams, "gateway.max_streams=%d", streams + LIMIT_SLACK);
    snprintf(tenant_streams, sizeof tenant_streams, "gateway.tenant_max_streams=%d",
             streams + LIMIT_SLACK);
    const char *gateway_sets[] = {"kafka.fetch.wait.max.ms=1", "gateway.keepalive_s=" KEEPALIVE_S,
                                  "gateway.tenant_requests_per_s=1000000",
                                  "gateway.tenant_burst=1000000", conns, max_streams,
                                  tenant_streams, NULL};
    if (!gwt_start(&gw, &st.env, "bench-gateway", gateway_sets))
        pu_die("gateway start");

    observer_priority();
    pu_client_fetch_wait_ms = "1";
    const char *topics[] = {GWT_REPLY_TOPIC, PU_REPLIES, PU_REQUESTS};
    pu_client_init(&reader.client, st.brokers, topics, 3);
    if (pthread_create(&reader.thread, NULL, read_replies, NULL) != 0)
        pu_die("reader thread");

    measure_latency(requests, max_tokens);
    measure_streams(streams);

    atomic_store(&reader.stop, true);
    pthread_join(reader.thread, NULL);
    pu_client_deinit(&reader.client);
    /* A sanitizer build's run doubles as a check of the gateway under load. */
    check(pu_stop(&gw.proc, PU_STOP_MS) == 0, "the gateway exits 0 on SIGTERM");
    pu_check_log_clean(gw.proc.log);
    pu_stack_stop(&st);
    return check_done();
}
