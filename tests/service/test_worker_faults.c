/* Faults a deployed worker must survive, with no request lost: every request
 * id gets a final record on the reply topic (possibly from a new attempt),
 * and every stream keeps the delivery contract (seqs contiguous per attempt,
 * one final record per attempt at most).
 *
 * The test owns the Kafka mock cluster (in-process, 3 brokers) so it can
 * inject faults with the mock API; the workers are `mllama worker`
 * processes on a real redis-server.
 * - Produce, OffsetCommit and Heartbeat errors pushed on the broker.
 * - All brokers down mid-stream for longer than one worker's
 *   message.timeout.ms: the other worker loses nothing; that one exits
 *   (its replies are lost) and its requests are answered again.
 * - A poison message: its Redis attempt counter already at limits.max_attempts
 *   (the workers it crashed), so it goes to mllama.dlt with x-error-code
 *   too_many_attempts instead of being run again.
 * - Redis killed (SIGKILL) mid-traffic: the worker keeps serving (breaker),
 *   numbering the attempts it cannot count apart from counted ones;
 *   restarted empty: the index (<prefix>:img:<key>) is restored.
 * - A worker killed (SIGKILL) mid-stream: another worker answers its
 *   requests in attempt 2, seq restarting at 0.
 * - SIGTERM: in-flight requests finish, exit code 0, offsets committed (a
 *   new worker in the group answers none of them again).
 * Skipped (77) without redis-server. */
#include "proc_util.h"

#include "engine.h"
#include "kafka/mock_kafka.h"
#include "worker/worker.h"

/* ApiKeys (librdkafka's rdkafka_proto.h is not installed). */
enum { API_PRODUCE = 0, API_OFFSET_COMMIT = 8, API_HEARTBEAT = 12 };

#define BROKERS 3
#define PARTITIONS 4
#define TOPICS "mllama.requests:4,mllama.replies:4,mllama.dlt:1,mllama.cancel:1"
#define GROUP "mllama-workers"
#define IMAGE ML_SOURCE_DIR "/tests/golden/fixtures/images/ex_640x480.jpg"
#define MAX_ATTEMPTS 3
#define UNCOUNTED_ATTEMPT (1LL << 31) /* worker.h: attempts Redis could not count */
#define ANSWER_MS 60000    /* a batch answered, rebalances and reruns included */
/* The outage's batch: both workers lose their partitions (the brokers are
 * down past the session timeout), and after the rebalance w1 alone reruns
 * all 8 requests from their first token, OUTAGE_TOKENS each on the
 * portable kernels: 38 s alone on 2 cores, over 60 s under a loaded ctest. */
#define OUTAGE_ANSWER_MS 180000
#define JOIN_MS 30000
#define INDEX_MS 30000     /* Redis index restored: the breaker's backoff, then reconciliation */
#define DOWN_MS 5000       /* brokers down: over w2's message timeout, under w1's */
#define W2_MESSAGE_TIMEOUT "kafka.message.timeout.ms=2500"
/* Tokens of requests that must still stream when a fault strikes. */
#define OUTAGE_TOKENS (600 / PU_SLOWDOWN)
#define HEARTBEAT_TOKENS (200 / PU_SLOWDOWN)
#define DRAIN_TOKENS (150 / PU_SLOWDOWN)
#define LONG_TOKENS (800 / PU_SLOWDOWN)   /* the killed worker's requests */
#define BATCH 8
#define STREAMING_CHUNKS 3 /* records that show a request is under way */
#define QUIET_MS 2000      /* watching for re-answers after a drain */
#define ID_MAX 32
#define MAX_IDS 128

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16];
static svc_mock_kafka *cluster;
static rd_kafka_mock_cluster_t *mc;
static const char *brokers;
static pu_redis redis;
/* w1 and w2 start; w2 dies of the long outage and w3 replaces it; w1 is
 * killed; w3 drains; w4 joins after the drain. */
enum { W1, W2, W3, W4, N_WORKERS };
static pu_proc workers[N_WORKERS];
static const char *const names[N_WORKERS] = {"w1", "w2", "w3", "w4"};
static pu_worker_env env;
static pu_client client;
static char ids[MAX_IDS][ID_MAX];
static bool lossy[MAX_IDS]; /* on a worker that lost records: see pu_check_stream_at */
static int n_ids;

static void cleanup(void)
{
    for (int i = 0; i < N_WORKERS; i++)
        pu_kill(&workers[i]);
    pu_kill(&redis.proc);
    pu_client_deinit(&client);
    svc_mock_kafka_destroy(cluster);
    pu_tmpdir_done(dir);
}

/* ---- requests ---------------------------------------------------------------------- */

/* Produce a text request `id` with max_tokens; partition -1 routes by key. */
static void send_body(const char *id, int max_tokens, int32_t partition)
{
    char extra[192];
    snprintf(extra, sizeof extra, "\"max_tokens\":%d,\"temperature\":0," PU_NO_STOP,
             max_tokens);
    char *body = pu_chat_request(id, "Write a long story.", NULL, extra);
    check(pu_client_send_to(&client, PU_REQUESTS, partition, id, body, strlen(body), NULL, 0),
          "%s: produce", id);
    free(body);
}

/* Send a request that must be answered (its id is kept for the final
 * accounting). Returns the id. */
static const char *send_request(const char *tag, int max_tokens, int32_t partition)
{
    if (n_ids == MAX_IDS)
        pu_die("too many requests");
    char *id = ids[n_ids++];
    snprintf(id, ID_MAX, "%s-%d", tag, n_ids);
    send_body(id, max_tokens, partition);
    return id;
}

/* Send n requests; their ids are ids[first .. first + n). Returns first. */
static int send_batch(const char *tag, int n, int max_tokens)
{
    int first = n_ids;
    for (int i = 0; i < n; i++)
        send_request(tag, max_tokens, -1);
    return first;
}

/* Wait until the n requests from `first` are all answered; check each
 * stream. Returns how many needed more than one attempt. */
static int expect_answered_within(const char *what, int first, int n, int64_t within_ms)
{
    int64_t t0 = pu_now_ms();
    int done = pu_client_wait_finals(&client, ids[first], ID_MAX, n, within_ms);
    check(done == n, "%s: %d of %d requests answered", what, done, n);
    int retried = 0;
    for (int i = first; i < first + n; i++) {
        retried += pu_check_stream_at(&client, ids[i], lossy[i]) > 1;
        const pu_record *f = pu_client_final(&client, ids[i]);
        cJSON *j = f ? pu_json(f) : NULL;
        check(!j || !pu_error_code(j), "%s: %s: error %s", what, ids[i],
              j && pu_error_code(j) ? pu_error_code(j) : "");
        cJSON_Delete(j);
    }
    fprintf(stderr, "%-16s %d/%d answered in %.1f s, %d in a later attempt\n", what, done, n,
            (pu_now_ms() - t0) / 1000.0, retried);
    return retried;
}

static int expect_answered(const char *what, int first, int n)
{
    return expect_answered_within(what, first, n, ANSWER_MS);
}

/* Poll until each of the n requests from `first` has streamed a few records. */
static bool wait_streaming(int first, int n)
{
    const pu_record *r;
    for (int64_t deadline = pu_now_ms() + ANSWER_MS; pu_now_ms() < deadline;) {
        int streaming = 0;
        for (int i = first; i < first + n; i++)
            streaming += pu_client_replies(&client, ids[i], &r, 0) >= STREAMING_CHUNKS;
        if (streaming == n)
            return true;
        pu_client_poll(&client, 20);
    }
    return false;
}

/* ---- broker faults ------------------------------------------------------------------ */

static void test_produce_errors(void)
{
    int first = send_batch("produce", BATCH, 32);
    /* The requests are in; the next Produce requests are the workers'
     * replies. The idempotent producer retries them without duplicates. */
    rd_kafka_mock_push_request_errors(
        mc, API_PRODUCE, 6, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR__TRANSPORT,
        RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR__TRANSPORT);
    expect_answered("produce errors", first, BATCH);
    rd_kafka_mock_clear_request_errors(mc, API_PRODUCE);
}

static void test_commit_errors(void)
{
    rd_kafka_mock_push_request_errors(
        mc, API_OFFSET_COMMIT, 6, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
        RD_KAFKA_RESP_ERR__TRANSPORT);
    int first = send_batch("commit", BATCH, 16);
    expect_answered("commit errors", first, BATCH);
    rd_kafka_mock_clear_request_errors(mc, API_OFFSET_COMMIT);
    /* The failed commits are retried: the group catches up with the log. */
    int64_t end[PARTITIONS], committed[PARTITIONS];
    bool caught_up = false;
    for (int64_t deadline = pu_now_ms() + ANSWER_MS; !caught_up && pu_now_ms() < deadline;
         pu_sleep_ms(200)) {
        caught_up = pu_end_offsets(&client, PU_REQUESTS, PARTITIONS, end) &&
                    pu_committed(brokers, GROUP, PU_REQUESTS, PARTITIONS, committed);
        for (int p = 0; p < PARTITIONS && caught_up; p++)
            caught_up = committed[p] == end[p];
    }
    check(caught_up, "commit errors: the committed offsets never reached the end offsets");
}

static void test_heartbeat_errors(void)
{
    int first = send_batch("heartbeat", BATCH, HEARTBEAT_TOKENS);
    check(wait_streaming(first, 1), "heartbeat: nothing streams");
    /* The members must rejoin: partitions are revoked or lost mid-stream and
     * their requests run again on their next owner. */
    rd_kafka_mock_push_request_errors(mc, API_HEARTBEAT, 4, RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION,
                                      RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
                                      RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION,
                                      RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
    expect_answered("heartbeat errors", first, BATCH);
    rd_kafka_mock_clear_request_errors(mc, API_HEARTBEAT);
}

/* All brokers down longer than w2's message.timeout.ms and shorter than
 * w1's (the default 30 s): w1's producer queues and retries and loses
 * nothing; w2's replies time out, so w2 exits and w1 answers its requests
 * again, as new attempts (w2's attempts may show a gap: worker.h). w3
 * takes w2's place for what follows. */
static void test_brokers_down(const char *const *extra)
{
    int first = send_batch("down", BATCH, OUTAGE_TOKENS);
    for (int i = first; i < first + BATCH; i++)
        lossy[i] = true;
    check(wait_streaming(first, BATCH), "brokers down: not all requests stream");
    check(rd_kafka_mock_broker_set_down(mc, -1) == RD_KAFKA_RESP_ERR_NO_ERROR, "set down");
    pu_sleep_ms(DOWN_MS);
    check(rd_kafka_mock_broker_set_up(mc, -1) == RD_KAFKA_RESP_ERR_NO_ERROR, "set up");
    int retried = expect_answered_within("brokers down", first, BATCH, OUTAGE_ANSWER_MS);
    check(pu_wait_exit(&workers[W2], PU_STOP_MS), "w2 kept running with lost replies");
    check(pu_exit_code(&workers[W2]) == SVC_WORKER_EXIT_KAFKA, "w2: exit code %d, want %d",
          pu_exit_code(&workers[W2]), SVC_WORKER_EXIT_KAFKA);
    check(pu_file_count(workers[W2].log, "record lost") >= 1, "w2: no 'record lost' in its log");
    check(retried >= 1, "w2's requests were not answered again");
    check(pu_running(&workers[W1]), "w1 died of a shorter outage than its message timeout");
    check(pu_worker_start(&workers[W3], &env, names[W3], extra), "w3 start");
}

/* ---- poison message ----------------------------------------------------------------- */

static void test_poison(void)
{
    /* The record's offset is the partition's end offset now (this client is
     * the only producer); its counter says it was consumed MAX_ATTEMPTS
     * times already, as if each attempt crashed a worker. */
    int64_t end[PARTITIONS];
    check(pu_end_offsets(&client, PU_REQUESTS, PARTITIONS, end), "poison: end offsets");
    char key[256];
    snprintf(key, sizeof key, "mllama:attempts:" PU_REQUESTS ":0:%lld", (long long)end[0]);
    redisReply *rep = pu_redis_cmd(&redis, "SET %s %d", key, MAX_ATTEMPTS);
    check(rep && rep->type == REDIS_REPLY_STATUS, "poison: SET %s", key);
    freeReplyObject(rep);
    static const char id[] = "poison";
    send_body(id, 8, 0);
    check(client.last_offset == end[0], "poison: went to offset %lld, not %lld",
          (long long)client.last_offset, (long long)end[0]);
    const pu_record *d = NULL;
    for (int64_t deadline = pu_now_ms() + ANSWER_MS;
         !(d = pu_client_find(&client, PU_DLT, id)) && pu_now_ms() < deadline;)
        pu_client_poll(&client, 50);
    check(d != NULL, "poison: nothing on " PU_DLT);
    check(d && strstr(d->headers, "x-error-code=too_many_attempts\n"), "poison: headers %s",
          d ? d->headers : "");
    check(d && strstr(d->headers, "x-original-partition=0\n"), "poison: partition");
    check(pu_client_replies(&client, id, NULL, 0) == 0, "poison: it was answered");
    fprintf(stderr, "poison           dead-lettered: too_many_attempts\n");
}

/* ---- Redis down ---------------------------------------------------------------------- */

static void test_redis_restart(const char *image_sha)
{
    size_t len;
    uint8_t *image = (uint8_t *)pu_slurp(IMAGE, &len);
    if (!image)
        pu_die(IMAGE);
    char *part = pu_image_part(image, len);
    free(image);
    /* Make the image resident on the worker that answers, and indexed. */
    if (n_ids == MAX_IDS)
        pu_die("too many requests");
    char *id = ids[n_ids++];
    snprintf(id, ID_MAX, "image-%d", n_ids);
    char *body = pu_chat_request(id, "Describe it.", part, "\"max_tokens\":4");
    check(pu_client_send(&client, id, body), "image: produce");
    free(body);
    free(part);
    expect_answered("image", n_ids - 1, 1);
    char key[128], partitioned[ML_SHA256_HEX_SIZE];
    pu_image_key("default", image_sha, partitioned);
    snprintf(key, sizeof key, "mllama:img:%s", partitioned);
    int64_t deadline = pu_now_ms() + INDEX_MS;
    while (pu_redis_exists(&redis, key) != 1 && pu_now_ms() < deadline)
        pu_sleep_ms(50);
    check(pu_redis_exists(&redis, key) == 1, "redis: %s never indexed", key);

    pu_kill(&redis.proc);
    int first = send_batch("redis-down", BATCH, 16);
    expect_answered("redis down", first, BATCH);
    /* Nothing counted these executions: their attempt numbers say so, and
     * are unique, so a re-execution meanwhile would not repeat seqs. */
    for (int i = first; i < first + BATCH; i++) {
        const pu_record *f = pu_client_final(&client, ids[i]);
        check(f && f->attempt >= UNCOUNTED_ATTEMPT, "%s: attempt %lld while Redis is down",
              ids[i], f ? (long long)f->attempt : -1LL);
    }

    check(pu_redis_start(&redis, redis.dir, redis.port), "redis restart on port %d", redis.port);
    int64_t t0 = pu_now_ms();
    while (pu_redis_exists(&redis, key) != 1 && pu_now_ms() - t0 < INDEX_MS)
        pu_sleep_ms(100);
    check(pu_redis_exists(&redis, key) == 1, "redis: %s not restored after the restart", key);
    fprintf(stderr, "redis restart    index restored in %.1f s\n", (pu_now_ms() - t0) / 1000.0);
    /* Both workers reconcile: their own keys are back too, and from now on
     * the attempt counters work again. */
    for (int i = W1; i <= W3; i += W3 - W1) {
        snprintf(key, sizeof key, "mllama:worker:%s", names[i]);
        while (pu_redis_exists(&redis, key) != 1 && pu_now_ms() - t0 < INDEX_MS)
            pu_sleep_ms(100);
        check(pu_redis_exists(&redis, key) == 1, "redis: %s not restored", key);
    }
}

/* ---- worker faults -------------------------------------------------------------------- */

static void test_worker_killed(void)
{
    check(pu_wait_assigned(&workers[W1], JOIN_MS) && pu_wait_assigned(&workers[W3], JOIN_MS),
          "w1 and w3 do not share the partitions");
    int first = n_ids;
    for (int p = 0; p < PARTITIONS; p++)
        send_request("killed", LONG_TOKENS, p);
    check(wait_streaming(first, PARTITIONS), "killed: not all requests stream");
    pu_kill(&workers[W1]);
    fprintf(stderr, "w1 killed with SIGKILL mid-stream\n");
    int retried = expect_answered("worker killed", first, PARTITIONS);
    check(retried >= 1, "no request was answered again after w1 died");
    for (int i = first; i < first + PARTITIONS; i++) {
        const pu_record *f = pu_client_final(&client, ids[i]);
        if (!f || f->attempt < 2)
            continue;
        /* The new attempt starts over at seq 0 (pu_check_stream checked
         * contiguity); its first record carries the role again. */
        const pu_record *start = NULL;
        for (size_t k = 0; k < client.n && !start; k++)
            if (!strcmp(client.recs[k].topic, PU_REPLIES) && !strcmp(client.recs[k].key, ids[i]) &&
                client.recs[k].attempt == f->attempt)
                start = &client.recs[k];
        check(start && start->seq == 0, "%s: attempt %lld does not start at seq 0", ids[i],
              (long long)f->attempt);
        cJSON *j = start ? pu_json(start) : NULL;
        const char *role = pu_json_str(j, PU_PATH("choices", "0", "delta", "role"));
        check(role && !strcmp(role, "assistant"), "%s: attempt %lld seq 0 has no role", ids[i],
              (long long)f->attempt);
        cJSON_Delete(j);
    }
}

static void test_drain(void)
{
    pu_proc *w = &workers[W3];
    check(pu_wait_assigned(w, JOIN_MS), "w3 holds no partition");
    int first = send_batch("drain", PARTITIONS, DRAIN_TOKENS);
    check(wait_streaming(first, PARTITIONS), "drain: not all requests stream");
    int64_t t0 = pu_now_ms();
    int code = pu_stop(w, PU_STOP_MS);
    check(code == 0, "w3: exit code %d after SIGTERM", code);
    check(pu_file_count(w->log, "\"drain_done\"") == 1, "w3: no drain_done");
    fprintf(stderr, "w3 drained in %.1f s, exit code %d\n", (pu_now_ms() - t0) / 1000.0, code);
    /* Drained means finished: every in-flight request has its final record
     * from the first attempt (nothing was abandoned). */
    pu_client_poll(&client, 200);
    for (int i = first; i < first + PARTITIONS; i++) {
        const pu_record *f = pu_client_final(&client, ids[i]);
        cJSON *j = f ? pu_json(f) : NULL;
        const char *reason = pu_finish_reason(j);
        check(f && reason && (!strcmp(reason, "length") || !strcmp(reason, "stop")),
              "%s: not finished by the drain (finish_reason %s)", ids[i], reason ? reason : "-");
        cJSON_Delete(j);
    }
    /* Offsets committed: a new member starts after them and answers none of
     * the drained requests again. */
    int64_t end[PARTITIONS], committed[PARTITIONS];
    check(pu_end_offsets(&client, PU_REQUESTS, PARTITIONS, end), "drain: end offsets");
    check(pu_committed(brokers, GROUP, PU_REQUESTS, PARTITIONS, committed), "drain: committed");
    for (int p = 0; p < PARTITIONS; p++)
        check(committed[p] == end[p], "drain: partition %d committed %lld of %lld", p,
              (long long)committed[p], (long long)end[p]);
    size_t before = client.n;
    check(pu_worker_start(&workers[W4], &env, names[W4], NULL), "w4 start");
    check(pu_wait_assigned(&workers[W4], JOIN_MS), "w4 never joined");
    pu_client_poll(&client, QUIET_MS);
    size_t again = 0;
    for (size_t i = before; i < client.n; i++)
        again += !strcmp(client.recs[i].topic, PU_REPLIES);
    check(again == 0, "w4 re-answered: %zu reply records after the drain", again);
    expect_answered("after drain", send_batch("w4", 2, 4), 2);
}

int main(void)
{
    if (!pu_which("redis-server"))
        ml_test_skip("needs redis-server on PATH");
    /* The faults strike streams of a few hundred tokens while they run:
     * the workers decode with the portable kernels (~2.4 ms a token of the
     * micro model), so that the streams last about as long as the faults
     * take to arrange whatever the vector kernels' speed (at 0.37 ms a
     * token they ended first). */
    setenv("ML_CPU_ISA", "plain", 1);
    atexit(cleanup);
    pu_tmpdir("faults", dir);
    snprintf(model, sizeof model, "%s/micro", dir);
    char log[PU_PATH_MAX + 32], err[256];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    if (!pu_make_model(model, log) || !pu_redis_start(&redis, dir, 0))
        pu_die("setup");
    if (svc_mock_kafka_create(BROKERS, TOPICS, &cluster, err, sizeof err) != SVC_KAFKA_OK)
        pu_die(err);
    mc = svc_mock_kafka_cluster(cluster);
    brokers = svc_mock_kafka_bootstraps(cluster);
    size_t len;
    char image_sha[ML_SHA256_HEX_SIZE];
    free(pu_slurp_image(IMAGE, &len, image_sha));

    env = (pu_worker_env){brokers, redis.url, model, dir};
    char attempts[64];
    snprintf(attempts, sizeof attempts, "limits.max_attempts=%d", MAX_ATTEMPTS);
    const char *extra[] = {attempts, NULL};
    const char *extra_w2[] = {attempts, W2_MESSAGE_TIMEOUT, NULL};
    int64_t t0 = pu_now_ms();
    if (!pu_worker_start(&workers[W1], &env, names[W1], extra) ||
        !pu_worker_start(&workers[W2], &env, names[W2], extra_w2))
        pu_die("worker start");
    const char *topics[] = {PU_REPLIES, PU_DLT};
    pu_client_init(&client, brokers, topics, 2);
    check(pu_wait_assigned(&workers[W1], JOIN_MS) && pu_wait_assigned(&workers[W2], JOIN_MS),
          "the workers never shared the partitions");

    test_produce_errors();
    test_commit_errors();
    test_heartbeat_errors();
    test_brokers_down(extra);
    test_poison();
    test_redis_restart(image_sha);
    test_worker_killed();
    test_drain();

    /* No request lost, over everything above. */
    int answered = pu_client_wait_finals(&client, ids[0], ID_MAX, n_ids, ANSWER_MS);
    check(answered == n_ids, "%d of %d requests answered", answered, n_ids);
    for (int i = 0; i < n_ids; i++)
        pu_check_stream_at(&client, ids[i], lossy[i]);
    int code = pu_stop(&workers[W4], PU_STOP_MS);
    check(code == 0, "w4: exit code %d after SIGTERM", code);
    for (int i = 0; i < N_WORKERS; i++)
        pu_check_log_clean(workers[i].log);
    fprintf(stderr, "faults: %d requests, %.1f s\n", n_ids, (pu_now_ms() - t0) / 1000.0);
    return check_done();
}
