/* The Redis index client (service/redis/redis_index.c) against a real
 * redis-server started here on a free port: every key with its fields and
 * TTL (read back through a second connection), blobs, adapters, the attempt
 * counters (per record and per request id); then faults: the server stopped (SIGSTOP: calls time out), the
 * breaker opening and failing fast, reconciliation after SIGCONT, the server
 * killed (SIGKILL) and restarted empty, and the backoff doubling after a
 * failed half-open trial. Skipped (77) when redis-server is not installed.
 * Also the URL parser, which needs no server. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "harness.h"
#include "log.h"
#include "proc_util.h"
#include "redis/redis.h"
#include "sha256.h"

#define DB 3
#define PREFIX "t"
#define WORKER "w1"
#define TIMEOUT_MS 100
#define OPEN_MS 200
#define OPEN_MAX_MS 400
#define IMG_TTL 300
#define WORKER_TTL 30
#define ATTEMPTS_TTL 600
#define OFFSET_ATTEMPTS_TTL 120
#define MAX_PENDING 2
/* A call that goes out costs at most a connect and a command timeout; allow
 * generous scheduling slack on a shared machine. */
#define CALL_BOUND_MS (2 * TIMEOUT_MS + 400)
#define FAST_FAIL_MS 50
/* The total deadline of a call against the trickling server, and the
 * scheduling slack allowed on top of it. */
#define CALL_DEADLINE_MS 300
#define CALL_SLACK_MS 300

static pu_redis server; /* its port and directory stay across restarts */
static redisContext *probe;

/* ---- The server ---------------------------------------------------------- */

static void probe_close(void)
{
    if (probe)
        redisFree(probe);
    probe = NULL;
}

/* A test-side connection (db DB), reconnected when needed. */
static redisReply *probe_cmd(const char *fmt, ...)
{
    for (int tries = 0; tries < 2; tries++) {
        if (!probe) {
            struct timeval tv = {1, 0};
            probe = redisConnectWithTimeout("127.0.0.1", server.port, tv);
            if (!probe || probe->err) {
                probe_close();
                continue;
            }
            redisReply *sel = redisCommand(probe, "SELECT %d", DB);
            freeReplyObject(sel);
        }
        va_list ap;
        va_start(ap, fmt);
        redisReply *rep = redisvCommand(probe, fmt, ap);
        va_end(ap);
        if (rep)
            return rep;
        probe_close();
    }
    return NULL;
}

static bool server_start(void)
{
    probe_close();
    return pu_redis_start(&server, server.dir, server.port);
}

static void server_kill(void)
{
    pu_kill(&server.proc);
    probe_close();
}

static void cleanup(void)
{
    server_kill();
    pu_tmpdir_done(server.dir);
}

/* ---- Probes -------------------------------------------------------------- */

static long long probe_int(const char *fmt, const char *key)
{
    redisReply *rep = probe_cmd(fmt, key);
    long long v = (rep && rep->type == REDIS_REPLY_INTEGER) ? rep->integer : -999;
    freeReplyObject(rep);
    return v;
}

static long long ttl_of(const char *key)
{
    return probe_int("TTL %s", key);
}

static bool exists(const char *key)
{
    return probe_int("EXISTS %s", key) == 1;
}

/* HGET into buf ("" when absent). */
static const char *hget(const char *key, const char *field, char *buf, size_t cap)
{
    redisReply *rep = probe_cmd("HGET %s %s", key, field);
    snprintf(buf, cap, "%s", (rep && rep->type == REDIS_REPLY_STRING) ? rep->str : "");
    freeReplyObject(rep);
    return buf;
}

/* Calls of one command so far (INFO commandstats), 0 when never called. */
static long command_calls(const char *command)
{
    redisReply *rep = probe_cmd("INFO commandstats");
    long n = pu_redis_calls(rep, command);
    freeReplyObject(rep);
    return n;
}

static void sha_of(char c, char out[65])
{
    memset(out, c, 64);
    out[64] = '\0';
}

static void img_key(const char *sha, char key[128])
{
    snprintf(key, 128, PREFIX ":img:%s", sha);
}

static void check_img(const char *sha, const char *worker, const char *bytes, const char *tiles)
{
    char key[128], buf[64];
    img_key(sha, key);
    check(!strcmp(hget(key, "worker", buf, sizeof buf), worker), "%.8s: worker %s", sha, buf);
    check(!strcmp(hget(key, "bytes", buf, sizeof buf), bytes), "%.8s: bytes %s", sha, buf);
    check(!strcmp(hget(key, "tiles", buf, sizeof buf), tiles), "%.8s: tiles %s", sha, buf);
    long long ttl = ttl_of(key);
    check(ttl > IMG_TTL - 5 && ttl <= IMG_TTL, "%.8s: TTL %lld", sha, ttl);
}

/* ---- URL parsing --------------------------------------------------------- */

static void test_url(void)
{
    svc_redis_url u;
    char err[128];
    check(svc_redis_url_parse("redis://localhost", &u, err, sizeof err) == SVC_REDIS_OK &&
              !strcmp(u.host, "localhost") && u.port == 6379 && u.db == 0 && !u.password[0] &&
              !u.user[0],
          "plain URL");
    check(svc_redis_url_parse("redis://:s%40cret@10.0.0.1:6380/5", &u, err, sizeof err) ==
                  SVC_REDIS_OK &&
              !strcmp(u.host, "10.0.0.1") && u.port == 6380 && u.db == 5 &&
              !strcmp(u.password, "s@cret") && !u.user[0],
          "password, port, db");
    check(svc_redis_url_parse("REDIS://app:pw@[::1]:7000/", &u, err, sizeof err) ==
                  SVC_REDIS_OK &&
              !strcmp(u.host, "::1") && u.port == 7000 && u.db == 0 && !strcmp(u.user, "app") &&
              !strcmp(u.password, "pw"),
          "user, IPv6, trailing slash");
    static const char *bad[] = {
        "rediss://h", "unix:///tmp/r.sock", "http://h", "redis://", "redis://h:0",
        "redis://h:65536", "redis://h:12x", "redis://h/x", "redis://h/1/2", "redis://h?db=1",
        "redis://pw@h", "redis://:@h", "redis://:%zz@h", "redis://[::1", "redis://h h",
        "redis://:a%00b@h", NULL,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        check(svc_redis_url_parse(bad[i], &u, err, sizeof err) == SVC_REDIS_ERR_INVALID &&
                  err[0],
              "rejected: %s (%s)", bad[i] ? bad[i] : "NULL", err);
    }
    svc_redis_url_parse("redis://:hunter2@h:x", &u, err, sizeof err);
    check(!strstr(err, "hunter2"), "the password is never echoed: %s", err);
}

static void test_config(void)
{
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = "redis://127.0.0.1";
    cfg.worker_id = WORKER;
    svc_redis *r = NULL;
    char err[160];
    cfg.prefix = "bad prefix";
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_ERR_INVALID && !r,
          "bad prefix");
    cfg.prefix = PREFIX;
    cfg.worker_id = "w:1";
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_ERR_INVALID && !r,
          "bad worker id");
    cfg.worker_id = WORKER;
    cfg.command_timeout_ms = 0;
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_ERR_INVALID && !r,
          "bad timeout");
    svc_redis_destroy(NULL);
}

/* ---- Against the server -------------------------------------------------- */

static svc_redis *client_create(void)
{
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/%d", server.port, DB);
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = url;
    cfg.prefix = PREFIX;
    cfg.worker_id = WORKER;
    cfg.connect_timeout_ms = TIMEOUT_MS;
    cfg.command_timeout_ms = TIMEOUT_MS;
    cfg.breaker_failures = 2;
    cfg.breaker_open_ms = OPEN_MS;
    cfg.breaker_open_max_ms = OPEN_MAX_MS;
    cfg.img_ttl_s = IMG_TTL;
    cfg.worker_ttl_s = WORKER_TTL;
    cfg.attempts_ttl_s = ATTEMPTS_TTL;
    cfg.offset_attempts_ttl_s = OFFSET_ATTEMPTS_TTL;
    cfg.max_pending_deletes = MAX_PENDING;
    svc_redis *r = NULL;
    char err[160];
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_OK, "create: %s", err);
    return r;
}

static const svc_redis_worker_info info = {
    .partitions = "llm.requests:0,1", .free_pool_bytes = 123456789};

static void test_index(svc_redis *r)
{
    char a[65], b[65], c[65], d[65], g[65], key[128], buf[64];
    sha_of('a', a);
    sha_of('b', b);
    sha_of('c', c);
    sha_of('d', d);
    sha_of('9', g);
    check(svc_redis_img_insert(r, a, 209715200, 4, 1000) == SVC_REDIS_OK, "insert a");
    check(svc_redis_img_insert(r, b, 100, 1, 1000) == SVC_REDIS_OK, "insert b");
    check(svc_redis_img_insert(r, c, 100, 1, 1000) == SVC_REDIS_OK, "insert c");
    check(svc_redis_img_insert(r, d, 100, 1, 1000) == SVC_REDIS_OK, "insert d");
    check(svc_redis_img_insert(r, g, 100, 2, 1000) == SVC_REDIS_OK, "insert g");
    check(svc_redis_img_insert(r, "ABC", 1, 1, 1) == SVC_REDIS_ERR_INVALID, "bad sha");
    check_img(a, WORKER, "209715200", "4");
    check_img(g, WORKER, "100", "2");
    img_key(a, key);
    check(!strcmp(hget(key, "last_use", buf, sizeof buf), "1000"), "last_use");

    /* Heartbeat: the worker hash, TTL refresh, vanished keys re-published. */
    img_key(a, key);
    redisReply *rep = probe_cmd("EXPIRE %s 5", key);
    freeReplyObject(rep);
    char kb[128];
    img_key(b, kb);
    rep = probe_cmd("DEL %s", kb);
    freeReplyObject(rep);
    check(svc_redis_heartbeat(r, &info, 5000) == SVC_REDIS_OK, "heartbeat");
    const char *wkey = PREFIX ":worker:" WORKER;
    check(!strcmp(hget(wkey, "partitions", buf, sizeof buf), "llm.requests:0,1") &&
              !strcmp(hget(wkey, "free_pool_bytes", buf, sizeof buf), "123456789") &&
              !strcmp(hget(wkey, "heartbeat_ms", buf, sizeof buf), "5000"),
          "worker hash");
    long long ttl = ttl_of(wkey);
    check(ttl > WORKER_TTL - 5 && ttl <= WORKER_TTL, "worker TTL %lld", ttl);
    check(ttl_of(key) > IMG_TTL - 5, "heartbeat refreshed a's TTL (%lld)", ttl_of(key));
    check_img(b, WORKER, "100", "1");

    check(svc_redis_img_touch(r, a, 7777) == SVC_REDIS_OK &&
              !strcmp(hget(key, "last_use", buf, sizeof buf), "7777"),
          "touch updates last_use");
    char z[65];
    sha_of('f', z);
    check(svc_redis_img_touch(r, z, 1) == SVC_REDIS_OK, "touch of a non-resident image");

    /* Evict: deleted while it names us, kept once another worker owns it. */
    img_key(c, key);
    check(svc_redis_img_evict(r, c) == SVC_REDIS_OK && !exists(key), "evict c");
    img_key(d, key);
    rep = probe_cmd("HSET %s worker w2", key);
    freeReplyObject(rep);
    check(svc_redis_img_evict(r, d) == SVC_REDIS_OK && exists(key) &&
              !strcmp(hget(key, "worker", buf, sizeof buf), "w2"),
          "evict leaves another worker's entry");
    check(svc_redis_img_evict(r, d) == SVC_REDIS_OK, "evict of a non-resident image");
}

static void test_blobs_adapters_attempts(svc_redis *r)
{
    enum { BLOB = 1000 };
    uint8_t blob[BLOB];
    for (int i = 0; i < BLOB; i++)
        blob[i] = (uint8_t)(i * 7); /* includes NULs */
    char s[65];
    sha_of('e', s);
    check(svc_redis_blob_put(r, s, blob, BLOB, 60) == SVC_REDIS_OK, "blob put");
    char key[128];
    snprintf(key, sizeof key, PREFIX ":blob:img:%s", s);
    long long ttl = ttl_of(key);
    check(ttl > 55 && ttl <= 60, "blob TTL %lld", ttl);
    uint8_t *data = NULL;
    size_t len = 0;
    check(svc_redis_blob_get(r, s, BLOB, &data, &len) == SVC_REDIS_OK && len == BLOB &&
              data && !memcmp(data, blob, BLOB),
          "blob round trip");
    free(data);
    check(svc_redis_blob_get(r, s, BLOB - 1, &data, &len) == SVC_REDIS_ERR_TOO_LARGE && !data &&
              len == 0,
          "blob over the cap");
    char missing[65];
    sha_of('1', missing);
    check(svc_redis_blob_get(r, missing, BLOB, &data, &len) == SVC_REDIS_NOT_FOUND && !data,
          "blob missing");

    static const char cfg_json[] = "{\"r\":16,\"lora_alpha\":32}";
    static const uint8_t weights[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, 1, 2};
    check(svc_redis_adapter_put(r, "a1", cfg_json, sizeof cfg_json - 1, weights,
                                sizeof weights) == SVC_REDIS_OK,
          "adapter put");
    svc_redis_adapter ad;
    check(svc_redis_adapter_get(r, "a1", 1024, &ad) == SVC_REDIS_OK &&
              ad.config_len == sizeof cfg_json - 1 &&
              !memcmp(ad.config, cfg_json, ad.config_len) && ad.weights_len == sizeof weights &&
              !memcmp(ad.weights, weights, sizeof weights),
          "adapter round trip");
    svc_redis_adapter_deinit(&ad);
    check(svc_redis_adapter_get(r, "a1", 10, &ad) == SVC_REDIS_ERR_TOO_LARGE && !ad.config &&
              !ad.weights,
          "adapter over the cap");
    /* The cap is for both files together: each alone fits. */
    check(svc_redis_adapter_get(r, "a1", sizeof cfg_json, &ad) == SVC_REDIS_ERR_TOO_LARGE &&
              !ad.config,
          "adapter over the cap with both files");
    /* The publisher's digest travels with the files, in the same round trip. */
    char want_sha[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter_digest(cfg_json, sizeof cfg_json - 1, weights, sizeof weights, want_sha);
    check(svc_redis_adapter_get(r, "a1", 1024, &ad) == SVC_REDIS_OK &&
              !strcmp(ad.sha256, want_sha),
          "adapter digest '%s', want '%s'", ad.sha256, want_sha);
    svc_redis_adapter_deinit(&ad);
    /* `sha256sum adapter_config.json adapter_model.safetensors | cut -c1-64 |
     * sha256sum`, as a publisher without our tools computes it. */
    char shell[1024];
    snprintf(shell, sizeof shell,
             "cd %s && printf '%%s' '%s' > c && printf '\\010\\0\\0\\0\\0\\0\\0\\0{}\\0\\001\\002' > w && "
             "sha256sum c w | cut -c1-64 | sha256sum | cut -c1-64",
             server.dir, cfg_json);
    int code = -1;
    char *out = pu_shell(shell, &code);
    check(out && code == 0 && !strncmp(out, want_sha, SVC_SHA256_HEX_LEN),
          "digest by sha256sum '%s', want '%s'", out ? out : "(none)", want_sha);
    free(out);
    /* One round trip, one script; over the cap its bytes are never read
     * (commandstats counts the script's own commands too). */
    long evals = command_calls("eval_ro"), hmgets = command_calls("hmget");
    check(svc_redis_adapter_get(r, "a1", 10, &ad) == SVC_REDIS_ERR_TOO_LARGE, "over the cap");
    check(command_calls("eval_ro") == evals + 1 && command_calls("hmget") == hmgets,
          "one EVAL_RO per fetch, no HMGET over the cap");
    check(svc_redis_adapter_get(r, "nope", 1024, &ad) == SVC_REDIS_NOT_FOUND, "adapter missing");
    redisReply *rep = probe_cmd("HSET " PREFIX ":adapter:half config x");
    freeReplyObject(rep);
    check(svc_redis_adapter_get(r, "half", 1024, &ad) == SVC_REDIS_NOT_FOUND,
          "adapter without weights");
    check(svc_redis_adapter_get(r, "../x", 1024, &ad) == SVC_REDIS_ERR_INVALID, "bad name");

    uint32_t n = 0;
    for (uint32_t want = 1; want <= 3; want++)
        check(svc_redis_attempt_incr(r, "llm.requests", 2, 41, &n) == SVC_REDIS_OK && n == want,
              "attempt %u (got %u)", want, n);
    ttl = ttl_of(PREFIX ":attempts:llm.requests:2:41");
    check(ttl > OFFSET_ATTEMPTS_TTL - 5 && ttl <= OFFSET_ATTEMPTS_TTL, "attempts TTL %lld", ttl);
    check(svc_redis_attempt_incr(r, "llm.requests", 2, 42, &n) == SVC_REDIS_OK && n == 1,
          "another offset starts at 1");
    check(svc_redis_attempt_incr(r, "bad topic", 0, 0, &n) == SVC_REDIS_ERR_INVALID, "bad topic");
    /* A finished record's counter is deleted; deleting none is no error. */
    check(svc_redis_attempt_clear(r, "llm.requests", 2, 42) == SVC_REDIS_OK &&
              !exists(PREFIX ":attempts:llm.requests:2:42"),
          "counter cleared");
    check(svc_redis_attempt_clear(r, "llm.requests", 2, 42) == SVC_REDIS_OK, "clear, none left");
    check(svc_redis_attempt_clear(r, "bad topic", 0, 0) == SVC_REDIS_ERR_INVALID,
          "clear, bad topic");
    /* Per (tenant, request id): the number replies carry, under a key
     * hashed from both (never the id's bytes), apart per tenant. */
    for (uint32_t want = 1; want <= 2; want++)
        check(svc_redis_request_attempt_incr(r, "acme", "2:41", &n) == SVC_REDIS_OK &&
                  n == want,
              "request attempt %u (got %u)", want, n);
    check(svc_redis_request_attempt_incr(r, "globex", "2:41", &n) == SVC_REDIS_OK && n == 1,
          "another tenant's id of the same bytes starts at 1");
    /* tenant "acme" + id "x" differs from tenant "acmex" + id "": the NUL. */
    check(svc_redis_request_attempt_incr(r, "acm", "e2:41", &n) == SVC_REDIS_OK && n == 1,
          "the tenant's end is part of the key");
    uint8_t d[32];
    char hex[SVC_SHA256_HEX_LEN + 1], k[128];
    ml_sha256("acme\0" "2:41", 9, d);
    ml_sha256_hex(d, hex);
    snprintf(k, sizeof k, PREFIX ":request_attempts:%s", hex);
    ttl = ttl_of(k);
    check(ttl > ATTEMPTS_TTL - 5 && ttl <= ATTEMPTS_TTL, "request attempts TTL %lld", ttl);
    check(svc_redis_request_attempt_incr(r, "acme", "", &n) == SVC_REDIS_ERR_INVALID && n == 0,
          "empty request id");
    check(svc_redis_request_attempt_incr(r, "", "x", &n) == SVC_REDIS_ERR_INVALID && n == 0,
          "empty tenant");

    svc_redis_stats st;
    svc_redis_stats_get(r, &st);
    check(st.errors == 0 && st.connects == 1 && st.breaker == SVC_REDIS_BREAKER_CLOSED &&
              st.resident == 3,
          "stats after the happy path: errors %llu connects %llu resident %llu",
          (unsigned long long)st.errors, (unsigned long long)st.connects,
          (unsigned long long)st.resident);
}

/* Time one call, checking its status and an upper bound on its duration. */
#define TIMED(call, want, bound_ms, what)                                                       \
    do {                                                                                        \
        int64_t t0_ = pu_now_ms();                                                              \
        svc_redis_status st_ = (call);                                                          \
        int64_t dt_ = pu_now_ms() - t0_;                                                        \
        check(st_ == (want), "%s: %s, want %s", (what), svc_redis_status_name(st_),             \
              svc_redis_status_name(want));                                                     \
        check(dt_ <= (bound_ms), "%s took %lld ms (bound %d)", (what), (long long)dt_,          \
              (int)(bound_ms));                                                                 \
    } while (0)

static void test_stopped_server(svc_redis *r)
{
    char a[65], b[65], g[65], e[65], key[128];
    sha_of('a', a);
    sha_of('b', b);
    sha_of('9', g);
    sha_of('7', e);
    uint32_t n;
    pu_signal(&server.proc, SIGSTOP);
    /* Two calls time out (the kernel still accepts connections), which opens
     * the breaker; the calls after it fail fast. The first failures are
     * writes whose stale bytes the server may still apply after SIGCONT, so
     * they are chosen to be harmless. */
    TIMED(svc_redis_img_insert(r, e, 50, 1, 2000), SVC_REDIS_ERR_IO, CALL_BOUND_MS,
          "insert while stopped");
    TIMED(svc_redis_attempt_incr(r, "llm.requests", 9, 9, &n), SVC_REDIS_ERR_IO, CALL_BOUND_MS,
          "incr while stopped");
    svc_redis_stats st;
    svc_redis_stats_get(r, &st);
    check(st.breaker == SVC_REDIS_BREAKER_OPEN && st.breaker_opens == 1, "breaker open");
    TIMED(svc_redis_img_evict(r, a), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS, "evict a, open");
    TIMED(svc_redis_img_evict(r, b), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS, "evict b, open");
    TIMED(svc_redis_img_evict(r, g), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS, "evict g, open");
    TIMED(svc_redis_heartbeat(r, &info, 3000), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS,
          "heartbeat, open");
    svc_redis_stats_get(r, &st);
    check(st.fast_fails == 4 && st.pending_deletes == MAX_PENDING && st.pending_dropped == 1 &&
              st.resident == 1,
          "fast fails %llu, pending %llu, dropped %llu, resident %llu",
          (unsigned long long)st.fast_fails, (unsigned long long)st.pending_deletes,
          (unsigned long long)st.pending_dropped, (unsigned long long)st.resident);
    pu_signal(&server.proc, SIGCONT);

    /* After the open period one trial goes out, reconciles and closes. */
    pu_sleep_ms(OPEN_MS + 50);
    check(svc_redis_heartbeat(r, &info, 4000) == SVC_REDIS_OK, "heartbeat after SIGCONT");
    svc_redis_stats_get(r, &st);
    check(st.breaker == SVC_REDIS_BREAKER_CLOSED && st.reconciliations == 1 &&
              st.pending_deletes == 0,
          "reconciled once, breaker closed");
    img_key(b, key);
    check(!exists(key), "deferred delete of b applied");
    img_key(g, key);
    check(!exists(key), "deferred delete of g applied");
    img_key(a, key);
    check(exists(key), "a's dropped delete is left to its TTL");
    check_img(e, WORKER, "50", "1");
}

static void test_killed_server(svc_redis *r)
{
    char e[65], h[65], key[128];
    sha_of('7', e);
    sha_of('8', h);
    uint8_t *data;
    size_t len;
    server_kill();
    TIMED(svc_redis_heartbeat(r, &info, 5000), SVC_REDIS_ERR_IO, CALL_BOUND_MS,
          "heartbeat after SIGKILL");
    TIMED(svc_redis_blob_get(r, e, 10, &data, &len), SVC_REDIS_ERR_IO, CALL_BOUND_MS,
          "blob get, refused");
    TIMED(svc_redis_img_insert(r, h, 60, 3, 6000), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS,
          "insert, open");
    TIMED(svc_redis_img_touch(r, e, 6001), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS, "touch, open");

    check(server_start(), "redis-server restarted");
    pu_sleep_ms(OPEN_MS + 50);
    check(svc_redis_heartbeat(r, &info, 7000) == SVC_REDIS_OK, "heartbeat after restart");
    svc_redis_stats st;
    svc_redis_stats_get(r, &st);
    check(st.reconciliations == 2 && st.breaker == SVC_REDIS_BREAKER_CLOSED,
          "reconciled after the restart");
    check_img(e, WORKER, "50", "1");
    check_img(h, WORKER, "60", "3");
    img_key(e, key);
    char buf[32];
    check(!strcmp(hget(key, "last_use", buf, sizeof buf), "6001"), "touch kept while down");
    check(exists(PREFIX ":worker:" WORKER), "worker hash restored");
}

static void test_backoff_doubles(svc_redis *r)
{
    char e[65];
    sha_of('7', e);
    server_kill();
    /* Two failures open the breaker for OPEN_MS; the failed trial after it
     * reopens it for 2 * OPEN_MS. */
    svc_redis_img_touch(r, e, 1);
    svc_redis_img_touch(r, e, 2);
    pu_sleep_ms(OPEN_MS + 50);
    TIMED(svc_redis_img_touch(r, e, 3), SVC_REDIS_ERR_IO, CALL_BOUND_MS, "half-open trial");
    pu_sleep_ms(OPEN_MS + 50);
    TIMED(svc_redis_img_touch(r, e, 4), SVC_REDIS_UNAVAILABLE, FAST_FAIL_MS,
          "still open after a failed trial");
    pu_sleep_ms(OPEN_MAX_MS - OPEN_MS);
    TIMED(svc_redis_img_touch(r, e, 5), SVC_REDIS_ERR_IO, CALL_BOUND_MS, "second trial");
    svc_redis_stats st;
    svc_redis_stats_get(r, &st);
    check(st.breaker == SVC_REDIS_BREAKER_OPEN, "open again");
}

/* A Redis that trickles its reply (pu_trickle): every read gets a byte
 * within the command timeout, so only the call's total deadline ends it. */
static void test_trickling_server(void)
{
    pu_trickle t;
    check(pu_trickle_start(&t), "trickling server");
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = t.url;
    cfg.prefix = PREFIX;
    cfg.worker_id = WORKER;
    cfg.connect_timeout_ms = cfg.command_timeout_ms = TIMEOUT_MS;
    cfg.call_timeout_ms = CALL_DEADLINE_MS;
    svc_redis *r = NULL;
    char err[160];
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_OK, "create: %s", err);
    uint32_t n;
    uint8_t *data;
    size_t len;
    char sha[65];
    sha_of('5', sha);
    TIMED(svc_redis_attempt_incr(r, "llm.requests", 1, 1, &n), SVC_REDIS_ERR_IO,
          CALL_DEADLINE_MS + CALL_SLACK_MS, "INCR against a trickling server");
    TIMED(svc_redis_blob_get(r, sha, 1 << 20, &data, &len), SVC_REDIS_ERR_IO,
          CALL_DEADLINE_MS + CALL_SLACK_MS, "GETRANGE against a trickling server");
    svc_redis_destroy(r);
    pu_trickle_stop(&t);
}

int main(void)
{
    /* hiredis 0.14 writes with write(2); a dead peer must not kill us. */
    signal(SIGPIPE, SIG_IGN);
    svc_log_set_level(SVC_LOG_WARN);
    test_url();
    test_config();
    test_trickling_server();

    if (!pu_which("redis-server"))
        ml_test_skip("redis-server is not installed");
    pu_tmpdir("redis", server.dir);
    atexit(cleanup);
    if (!server_start()) {
        check(0, "redis-server did not start (port %d)", server.port);
        return check_done();
    }

    svc_redis *r = client_create();
    if (r) {
        test_index(r);
        test_blobs_adapters_attempts(r);
        test_stopped_server(r);
        test_killed_server(r);
        test_backoff_doubles(r);
        svc_redis_destroy(r);
    }
    return check_done();
}
