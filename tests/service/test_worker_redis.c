/* Redis inside its trust boundary, and what a worker does when Redis or a
 * reply topic misbehaves, as separate processes: `mllama mock-kafka`, a
 * redis-server running the shipped ops/redis/redis.conf and ACL users, and
 * workers on the micro model.
 *
 * - The worker connects as mllama-worker (redis://user:password@: AUTH
 *   with the user) and answers a request end to end, its counters written.
 *   A frontend (mllama-frontend) writes a blob and reads the index, and is
 *   refused (NOPERM) counters, adapters and index entries; the adapter
 *   publisher is refused counters; a client without a role, everything.
 * - An answered record's attempt counter is deleted.
 * - JUNK records (half unparseable, without headers: dead letters; half
 *   answerable but invalid: error replies) leave at most JUNK_KEYS_MAX new
 *   keys in Redis: nothing is counted for a record that does not parse.
 * - A reply topic without a leader (the mock answers LEADER_NOT_AVAILABLE
 *   for it): a request's records to it time out while a later request's
 *   final to another topic was acknowledged, so that request is
 *   dead-lettered as reply_undeliverable and the worker keeps serving.
 * - A Redis that trickles its replies (pu_trickle) holds a prep thread for
 *   up to redis.call_timeout_ms per call: /healthz fails within
 *   worker.stall_ms, naming the prep thread and what it does, and the
 *   request is answered once its calls' deadlines pass.
 * Every worker drains on SIGTERM with exit code 0.
 * Skipped (77) without redis-server. */
#include "proc_util.h"

#include "redis/redis.h"

#define STUCK_TOPIC PU_REPLIES ".stuck"
#define TOPICS PU_REQUESTS ":2," PU_REPLIES ":2," STUCK_TOPIC ":1," PU_DLT ":1," PU_CANCEL ":1"
#define ANSWER_MS 30000
#define JOIN_MS 30000
#define JUNK 10000
#define JUNK_MS 120000       /* every junk record finished (offsets committed) */
#define JUNK_KEYS_MAX 16     /* new keys the junk may leave (none expected) */
/* stuck-1's records time out after this; after-stuck's round trip must fit
 * in it on a loaded 2-core CI machine. */
#define MESSAGE_TIMEOUT "kafka.message.timeout.ms=6000"
#define STALL_MS 500         /* worker.stall_ms of the trickle worker */
#define CALL_TIMEOUT_MS 4000 /* its redis.call_timeout_ms: well past the stall bound */
#define HEALTH_FAIL_MS (STALL_MS + 2500) /* /healthz fails by then */
#define GROUP "mllama-workers"
#define CLEAR_MS 5000        /* an answered record's attempt counter deleted by then */

#define WORKER_PW "worker-pw"
#define FRONTEND_PW "frontend-pw"
#define PUBLISHER_PW "publisher-pw"
#define ADMIN_PW "admin-pw"

static char dir[PU_PATH_MAX], model[PU_PATH_MAX + 16], brokers[256], worker_url[128];
static pu_proc kafka, redis, worker;
static int redis_port;
static pu_client client;

static void cleanup(void)
{
    pu_kill(&worker);
    pu_kill(&kafka);
    pu_kill(&redis);
    pu_tmpdir_done(dir);
}

/* ---- Redis with the shipped ACL ------------------------------------------------ */

static bool is_noperm(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOPERM", 6);
}

/* Render ops/redis/users.acl with this test's passwords (and an admin user
 * of the test's own, to count keys) and start redis-server on
 * ops/redis/redis.conf. */
static void redis_start(void)
{
    char cmd[4 * PU_PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "MLLAMA_REDIS_WORKER_PASSWORD=" WORKER_PW " MLLAMA_REDIS_FRONTEND_PASSWORD=" FRONTEND_PW
             " MLLAMA_REDIS_ADAPTER_PUBLISHER_PASSWORD=" PUBLISHER_PW
             " sh " ML_SOURCE_DIR "/ops/redis/render-acl.sh " ML_SOURCE_DIR
             "/ops/redis/users.acl > %s/users.acl && "
             "echo 'user test-admin on >" ADMIN_PW " ~* &* +@all' >> %s/users.acl",
             dir, dir);
    int code = -1;
    free(pu_shell(cmd, &code));
    if (code != 0)
        pu_die("render-acl.sh");
    redis_port = pu_free_port();
    char port[16], log[PU_PATH_MAX + 16];
    snprintf(port, sizeof port, "%d", redis_port);
    snprintf(log, sizeof log, "%s/redis.log", dir);
    char *argv[] = {"/usr/bin/env", "redis-server", ML_SOURCE_DIR "/ops/redis/redis.conf",
                    "--dir", dir, "--port", port, "--bind", "127.0.0.1", NULL};
    if (!pu_spawn(&redis, log, argv))
        pu_die("redis-server");
    for (int64_t t0 = pu_now_ms(); pu_now_ms() - t0 < PU_START_MS; pu_sleep_ms(PU_POLL_MS)) {
        redisReply *rep = pu_redis_cmd_as(redis_port, "test-admin", ADMIN_PW, "PING");
        bool up = rep && rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (up)
            break;
    }
    snprintf(worker_url, sizeof worker_url, "redis://mllama-worker:" WORKER_PW "@127.0.0.1:%d/0",
             redis_port);
}

static long long dbsize(void)
{
    redisReply *rep = pu_redis_cmd_as(redis_port, "test-admin", ADMIN_PW, "DBSIZE");
    long long n = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    return n;
}

/* What each role may not do, and what the frontend may. */
static void test_roles(void)
{
    static const char sha[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    redisReply *r = pu_redis_cmd_as(redis_port, NULL, NULL, "GET mllama:blob:img:%s", sha);
    check(r && r->type == REDIS_REPLY_ERROR && strstr(r->str, "NOAUTH"),
          "a client without a role: %s", r && r->str ? r->str : "(no reply)");
    freeReplyObject(r);

    r = pu_redis_cmd_as(redis_port, "mllama-frontend", FRONTEND_PW,
                        "SET mllama:blob:img:%s x EX 60", sha);
    check(r && r->type == REDIS_REPLY_STATUS, "frontend writes a blob: %s",
          r && r->str ? r->str : "(no reply)");
    freeReplyObject(r);
    r = pu_redis_cmd_as(redis_port, "mllama-frontend", FRONTEND_PW, "HGET mllama:img:%s worker",
                        sha);
    check(r && r->type == REDIS_REPLY_NIL, "frontend reads the index (routing)");
    freeReplyObject(r);
    r = pu_redis_cmd_as(redis_port, "mllama-frontend", FRONTEND_PW,
                        "SCAN 0 MATCH mllama:adapter:* COUNT 1000");
    check(r && r->type == REDIS_REPLY_ARRAY, "frontend lists adapter names (the gateway's "
                                             "/v1/models): %s", r && r->str ? r->str : "");
    freeReplyObject(r);
    static const char *const refused[] = {
        "INCR mllama:attempts:" PU_REQUESTS ":0:1",
        "SET mllama:attempts:" PU_REQUESTS ":0:2 100",
        "INCR mllama:request_attempts:00",
        "HSET mllama:adapter:evil config {} weights x sha256 y",
        "HSET mllama:img:0 worker evil",
        "GETRANGE mllama:adapter:a 0 10",
        "EVAL return 1 0",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        r = pu_redis_cmd_as(redis_port, "mllama-frontend", FRONTEND_PW, refused[i]);
        check(is_noperm(r), "frontend: '%s' answered %s", refused[i],
              r && r->str ? r->str : "(not an error)");
        freeReplyObject(r);
    }
    r = pu_redis_cmd_as(redis_port, "mllama-adapter-publisher", PUBLISHER_PW,
                        "INCR mllama:attempts:t:0:1");
    check(is_noperm(r), "the adapter publisher may not touch counters");
    freeReplyObject(r);
    r = pu_redis_cmd_as(redis_port, "mllama-adapter-publisher", PUBLISHER_PW,
                        "HSET mllama:adapter:a config {}");
    check(r && r->type == REDIS_REPLY_INTEGER, "the adapter publisher writes adapters");
    freeReplyObject(r);
    r = pu_redis_cmd_as(redis_port, "mllama-worker", WORKER_PW, "HSET mllama:adapter:a config {}");
    check(is_noperm(r), "a worker may not write adapters");
    freeReplyObject(r);
    r = pu_redis_cmd_as(redis_port, "mllama-worker", WORKER_PW, "SET mllama:blob:img:%s y", sha);
    check(is_noperm(r), "a worker may not write blobs");
    freeReplyObject(r);
}

/* Every call of the Redis client as the worker role, and the two it must
 * not make. */
static void test_worker_role(void)
{
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = worker_url;
    cfg.prefix = "mllama";
    cfg.worker_id = "w-role";
    svc_redis *r = NULL;
    char err[160];
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_OK, "create: %s", err);
    static const char sha[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    static const svc_redis_worker_info info = {.partitions = PU_REQUESTS ":0,1"};
    uint32_t n;
    uint8_t *blob = NULL;
    size_t len;
    char parts[64], digest[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter a;
    check(svc_redis_img_insert(r, sha, 100, 1, 1) == SVC_REDIS_OK, "worker: index insert");
    check(svc_redis_heartbeat(r, &info, 2) == SVC_REDIS_OK, "worker: heartbeat");
    check(svc_redis_route(r, sha, parts, sizeof parts) == SVC_REDIS_OK, "worker: route");
    check(svc_redis_img_evict(r, sha) == SVC_REDIS_OK, "worker: index delete (script)");
    check(svc_redis_attempt_incr(r, PU_REQUESTS, 0, 7, &n) == SVC_REDIS_OK && n == 1,
          "worker: offset counter");
    check(svc_redis_request_attempt_incr(r, "default", "role-1", &n) == SVC_REDIS_OK && n == 1,
          "worker: request counter");
    check(svc_redis_blob_get(r, sha, 16, &blob, &len) == SVC_REDIS_OK && len == 1,
          "worker: blob read");
    free(blob);
    check(svc_redis_adapter_sha256(r, "a", digest) == SVC_REDIS_NOT_FOUND,
          "worker: adapter digest read (none stored)");
    check(svc_redis_adapter_get(r, "a", 1024, &a) == SVC_REDIS_NOT_FOUND,
          "worker: adapter read (weights missing)");
    check(svc_redis_adapter_put(r, "a", "{}", 2, "w", 1) == SVC_REDIS_ERR_REPLY,
          "worker: adapter write refused");
    check(svc_redis_blob_put(r, sha, "z", 1, 60) == SVC_REDIS_ERR_REPLY,
          "worker: blob write refused");
    svc_redis_destroy(r);
}

/* ---- requests --------------------------------------------------------------------- */

static bool start_worker(const char *name, const char *url, const char *const *more)
{
    pu_worker_env env = {brokers, url, model, dir};
    const char *extra[PU_MAX_SETS] = {MESSAGE_TIMEOUT};
    int n = 1;
    for (int i = 0; more && more[i]; i++)
        extra[n++] = more[i];
    extra[n] = NULL;
    return pu_worker_start(&worker, &env, name, extra) && pu_wait_assigned(&worker, JOIN_MS);
}

/* A request answered with a completion. */
static void expect_answered(const char *id)
{
    char *body = pu_chat_request(id, "Hello", NULL, "\"max_tokens\":4");
    check(pu_client_send(&client, id, body), "%s: produce", id);
    const pu_record *f = pu_client_wait(&client, id, ANSWER_MS);
    check(f != NULL, "%s: no final record", id);
    cJSON *j = f ? pu_json(f) : NULL;
    check(j && !pu_error_code(j), "%s: answered with error %s", id,
          j && pu_error_code(j) ? pu_error_code(j) : "");
    cJSON_Delete(j);
    free(body);
}

/* Produce JUNK records without waiting for each, then every one finished:
 * the group's committed offsets reach the ends of the request topic. */
static void send_junk(void)
{
    char value[64], id[32];
    for (int i = 0; i < JUNK; i++) {
        rd_kafka_resp_err_t e;
        if (i % 2) {
            snprintf(value, sizeof value, "not json %d", i);
            e = rd_kafka_producev(client.producer, RD_KAFKA_V_TOPIC(PU_REQUESTS),
                                  RD_KAFKA_V_VALUE(value, strlen(value)),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        } else {
            snprintf(id, sizeof id, "junk-%d", i);
            snprintf(value, sizeof value, "{\"junk\": %d}", i);
            e = rd_kafka_producev(
                client.producer, RD_KAFKA_V_TOPIC(PU_REQUESTS), RD_KAFKA_V_KEY(id, strlen(id)),
                RD_KAFKA_V_VALUE(value, strlen(value)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_HEADER("request_id", id, -1),
                RD_KAFKA_V_HEADER("reply_topic", PU_REPLIES, -1), RD_KAFKA_V_END);
        }
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(client.producer, 10);
            i--;
            continue;
        }
        check(e == RD_KAFKA_RESP_ERR_NO_ERROR, "junk %d: %s", i, rd_kafka_err2str(e));
    }
    check(rd_kafka_flush(client.producer, ANSWER_MS) == RD_KAFKA_RESP_ERR_NO_ERROR, "junk flush");
    int64_t ends[2], done[2] = {-1, -1};
    check(pu_end_offsets(&client, PU_REQUESTS, 2, ends), "end offsets");
    int64_t t0 = pu_now_ms();
    while (pu_now_ms() - t0 < JUNK_MS && pu_running(&worker) &&
           (done[0] < ends[0] || done[1] < ends[1])) {
        pu_client_poll(&client, 200);
        pu_committed(brokers, GROUP, PU_REQUESTS, 2, done);
    }
    check(done[0] >= ends[0] && done[1] >= ends[1], "junk finished: %lld/%lld, %lld/%lld",
          (long long)done[0], (long long)ends[0], (long long)done[1], (long long)ends[1]);
    fprintf(stderr, "%d junk records finished in %.1f s\n", JUNK, (pu_now_ms() - t0) / 1000.0);
}

/* The shipped ACL end to end, the junk, and a reply topic without a leader. */
static void test_acl_worker(void)
{
    test_roles();
    test_worker_role();
    /* Room for the junk in flight (backpressure pauses at twice
     * runtime.max_running unfinished records). */
    const char *more[] = {"runtime.max_running=512", NULL};
    check(start_worker("w-acl", worker_url, more), "worker as mllama-worker");
    expect_answered("acl-1");
    /* Its record's attempt counter is deleted once it is answered. */
    char counter[128];
    snprintf(counter, sizeof counter, "mllama:attempts:" PU_REQUESTS ":%d:%lld",
             (int)client.last_partition, (long long)client.last_offset);
    long long left = 1;
    for (int64_t t0 = pu_now_ms(); left != 0 && pu_now_ms() - t0 < CLEAR_MS; pu_sleep_ms(50)) {
        redisReply *e = pu_redis_cmd_as(redis_port, "test-admin", ADMIN_PW, "EXISTS %s", counter);
        left = e && e->type == REDIS_REPLY_INTEGER ? e->integer : -1;
        freeReplyObject(e);
    }
    check(left == 0, "%s is left after its record was answered", counter);
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256("default\0acl-1", sizeof "default\0acl-1" - 1, d);
    ml_sha256_hex(d, hex);
    redisReply *r = pu_redis_cmd_as(redis_port, "test-admin", ADMIN_PW,
                                    "GET mllama:request_attempts:%s", hex);
    check(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "1"),
          "the request's counter, by sha256(tenant NUL id), written by the worker role");
    freeReplyObject(r);

    long long before = dbsize();
    send_junk();
    long long after = dbsize();
    fprintf(stderr, "keys before the junk %lld, after %lld\n", before, after);
    check(before >= 0 && after >= 0 && after - before <= JUNK_KEYS_MAX,
          "%d junk records left %lld keys in Redis", JUNK, after - before);

    /* Its final to the stuck topic times out after B's final to the reply
     * topic was acknowledged: a dead letter, not a stopped worker. */
    static const char stuck[] = "{\"id\":\"stuck-1\",\"reply_topic\":\"" STUCK_TOPIC
                                "\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\","
                                "\"content\":\"Hello\"}]}";
    /* after-stuck must be produced after stuck-1's final, or nothing later
     * was acknowledged when stuck-1 times out and the worker rightly takes
     * the brokers for down. The worker counts a request finished just
     * before it produces the final; a fixed pause was not enough under CI's
     * parallel load, where the junk backlog delayed stuck-1's fetch. */
    int port = pu_worker_http_port(&worker);
    double finished = pu_metric(port, "mllama_requests_total");
    check(pu_client_send(&client, "stuck-1", stuck), "stuck-1: produce");
    int64_t sent = pu_now_ms();
    while (pu_metric(port, "mllama_requests_total") <= finished && pu_now_ms() - sent < ANSWER_MS &&
           pu_running(&worker))
        pu_sleep_ms(10);
    check(pu_metric(port, "mllama_requests_total") > finished, "stuck-1: not finished");
    expect_answered("after-stuck");
    const pu_record *dl = NULL;
    for (int64_t t0 = pu_now_ms(); !dl && pu_now_ms() - t0 < ANSWER_MS;) {
        pu_client_poll(&client, 100);
        dl = pu_client_find(&client, PU_DLT, "stuck-1");
    }
    check(dl && strstr(dl->headers, "x-error-code=reply_undeliverable"), "stuck-1: dead letter %s",
          dl ? dl->headers : "(none)");
    check(pu_running(&worker), "the worker survived a reply topic without a leader");
    expect_answered("after-dlt");
    pu_worker_drain(&worker);
}

/* A trickling Redis: /healthz names the stalled prep thread. */
static void test_trickle(void)
{
    pu_trickle t;
    check(pu_trickle_start(&t), "trickling server");
    char stall[64], call[64];
    snprintf(stall, sizeof stall, "worker.stall_ms=%d", STALL_MS);
    snprintf(call, sizeof call, "redis.call_timeout_ms=%d", CALL_TIMEOUT_MS);
    const char *more[] = {stall, call, "worker.prep_threads=1", NULL};
    check(start_worker("w-trickle", t.url, more), "worker on a trickling Redis");
    int port = pu_worker_http_port(&worker);
    char *body = pu_chat_request("trickle-1", "Hello", NULL, "\"max_tokens\":2");
    int64_t t0 = pu_now_ms();
    check(pu_client_send(&client, "trickle-1", body), "trickle-1: produce");
    free(body);
    char *health = NULL;
    while (pu_now_ms() - t0 < HEALTH_FAIL_MS) {
        free(health);
        health = pu_http_get(port, "/healthz");
        if (health && strstr(health, "stalled"))
            break;
        pu_sleep_ms(50);
    }
    int64_t ms = pu_now_ms() - t0;
    check(health && strstr(health, "stalled: prep thread 0 in redis"),
          "/healthz within %d ms: %s", HEALTH_FAIL_MS, health ? health : "(none)");
    fprintf(stderr, "/healthz after %lld ms: %s", (long long)ms, health ? health : "(none)\n");
    free(health);
    const pu_record *f = pu_client_wait(&client, "trickle-1", ANSWER_MS);
    check(f != NULL, "trickle-1 answered once the Redis calls' deadlines passed");
    health = pu_http_get(port, "/healthz");
    check(health && !strcmp(health, "ok\n"), "/healthz after: %s", health ? health : "(none)");
    free(health);
    pu_worker_drain(&worker);
    pu_trickle_stop(&t);
}

int main(void)
{
    if (!pu_which("redis-server"))
        ml_test_skip("needs redis-server on PATH");
    signal(SIGPIPE, SIG_IGN);
    atexit(cleanup);
    pu_tmpdir("worker-redis", dir);
    snprintf(model, sizeof model, "%s/micro", dir);
    char log[PU_PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    static const char *const mock_args[] = {"--topic-error", STUCK_TOPIC "=LEADER_NOT_AVAILABLE",
                                            NULL};
    pu_mock_kafka_args = mock_args;
    if (!pu_make_model(model, log) || !pu_mock_kafka_start(&kafka, dir, TOPICS, brokers,
                                                           sizeof brokers))
        pu_die("setup");
    redis_start();
    const char *topics[] = {PU_REPLIES, PU_DLT};
    pu_client_init(&client, brokers, topics, 2);

    test_acl_worker();
    test_trickle();

    pu_client_deinit(&client);
    return check_done();
}
