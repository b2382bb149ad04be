/* The adapter store (service/worker/adapter_store.c) against a real redis-server
 * started here on a free port, in a scratch directory:
 * - an adapter in Redis is copied into <dir>/<name>/ byte for byte, leaving
 *   no staging directory, and then serves with no Redis at all;
 * - eight threads, each with its own connection, asking for one adapter at
 *   once all succeed with one copy;
 * - a staging directory a killed process left is removed at init;
 * - a missing adapter is unknown_adapter and not remembered (published
 *   afterwards, it serves); one over the size limit is adapter_too_large
 *   and remembered (republished small, it is still refused, from memory);
 *   past SVC_ADAPTER_FAILURES_MAX names the oldest failure is forgotten;
 * - a directory that cannot be created, and a <dir>/<name> left without
 *   its config, are adapter_unavailable, each counted once in
 *   mllama_adapter_store_errors_total.
 * Skipped (77) when redis-server is not installed. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include "worker/adapter_store.h"
#include "harness.h"
#include "log.h"
#include "metrics.h"
#include "proc_util.h"

#define PREFIX "mllama"
#define MAX_BYTES 4096
#define THREADS 8

static pu_redis server;
static char dir[PU_PATH_MAX];

static void cleanup(void)
{
    pu_kill(&server.proc);
    pu_tmpdir_done(dir);
}

static svc_redis *client_create(void)
{
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = server.url;
    cfg.prefix = PREFIX;
    cfg.worker_id = "w1";
    svc_redis *r = NULL;
    char err[160];
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_OK, "create: %s", err);
    return r;
}

static void publish(svc_redis *r, const char *name, size_t weights_len)
{
    static const char config[] = "{\"r\": 2, \"target_modules\": [\"q_proj\"]}";
    uint8_t *weights = malloc(weights_len);
    for (size_t i = 0; i < weights_len; i++)
        weights[i] = (uint8_t)(i * 7 + strlen(name));
    check(svc_redis_adapter_put(r, name, config, sizeof config - 1, weights, weights_len) ==
              SVC_REDIS_OK,
          "publish %s", name);
    free(weights);
}

/* Entries of path whose name starts with prefix. */
static int count_entries(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

/* The value of a counter in the process's metrics, -1 if absent. */
static double counter(const char *name)
{
    svc_buf b;
    svc_buf_init(&b);
    svc_metrics_render(&b);
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s ", name);
    const char *at = b.data ? strstr(b.data, needle) : NULL;
    double v = at ? atof(at + strlen(needle)) : -1;
    svc_buf_deinit(&b);
    return v;
}

static svc_error ensure(svc_adapter_store *s, svc_redis *r, const char *name, char *msg)
{
    msg[0] = '\0';
    return svc_adapter_store_ensure(s, r, name, msg, SVC_ERRMSG_MAX);
}

static void test_copy(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    svc_adapter_store_init(&s, adapters, MAX_BYTES);
    char msg[SVC_ERRMSG_MAX], path[PU_PATH_MAX + 64];
    publish(r, "a1", 1000);
    check(ensure(&s, r, "a1", msg) == SVC_ERROR_NONE, "a1: %s", msg);
    svc_redis_adapter want;
    check(svc_redis_adapter_get(r, "a1", MAX_BYTES, &want) == SVC_REDIS_OK, "a1: get");
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/a1/%s", adapters, files[f]);
        size_t len = 0;
        char *got = pu_slurp(path, &len);
        const uint8_t *bytes = f ? want.weights : want.config;
        size_t n = f ? want.weights_len : want.config_len;
        check(got && len == n && !memcmp(got, bytes, n), "a1: %s differs", files[f]);
        free(got);
    }
    svc_redis_adapter_deinit(&want);
    check(count_entries(adapters, ".staging-") == 0, "a staging directory is left");
    check(ensure(&s, NULL, "a1", msg) == SVC_ERROR_NONE, "a1 without Redis: %s", msg);
    svc_adapter_store_deinit(&s);
}

typedef struct racer {
    svc_adapter_store *s;
    svc_redis *r;
    svc_error code;
    char msg[SVC_ERRMSG_MAX];
} racer;

static void *race(void *arg)
{
    racer *x = arg;
    x->code = ensure(x->s, x->r, "a2", x->msg);
    return NULL;
}

static void test_concurrent(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    svc_adapter_store_init(&s, adapters, MAX_BYTES);
    publish(r, "a2", 3000);
    racer x[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        x[i] = (racer){.s = &s, .r = client_create()};
        pthread_create(&t[i], NULL, race, &x[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        check(x[i].code == SVC_ERROR_NONE, "racer %d: %s", i, x[i].msg);
        svc_redis_destroy(x[i].r);
    }
    check(count_entries(adapters, "a2") == 1 && count_entries(adapters, ".staging-") == 0,
          "concurrent copies: %d a2, %d staging", count_entries(adapters, "a2"),
          count_entries(adapters, ".staging-"));
    svc_adapter_store_deinit(&s);
}

static void test_leftover(const char *adapters)
{
    char staging[PU_PATH_MAX + 64], file[PU_PATH_MAX + 128];
    snprintf(staging, sizeof staging, "%s/.staging-a3-Ab12Cd", adapters);
    check(mkdir(staging, 0755) == 0, "mkdir %s", staging);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", staging);
    check(pu_write_file(file, "half", 4), "write %s", file);
    svc_adapter_store s;
    svc_adapter_store_init(&s, adapters, MAX_BYTES);
    check(access(staging, F_OK) != 0, "init left %s", staging);
    svc_adapter_store_deinit(&s);
}

static void test_failures(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    svc_adapter_store_init(&s, adapters, MAX_BYTES);
    char msg[SVC_ERRMSG_MAX];
    check(ensure(&s, r, "later", msg) == SVC_ERROR_UNKNOWN_ADAPTER, "missing: %s", msg);
    publish(r, "later", 100);
    check(ensure(&s, r, "later", msg) == SVC_ERROR_NONE, "published later: %s", msg);

    publish(r, "big", MAX_BYTES);
    check(ensure(&s, r, "big", msg) == SVC_ERROR_ADAPTER_TOO_LARGE &&
              strstr(msg, "limits.max_adapter_bytes"),
          "too large: %s", msg);
    publish(r, "big", 100);
    check(ensure(&s, r, "big", msg) == SVC_ERROR_ADAPTER_TOO_LARGE && strstr(msg, "remembered"),
          "too large, remembered: %s", msg);

    /* More names than the memory holds: the oldest ("big") is forgotten. */
    char name[32];
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        snprintf(name, sizeof name, "big-%d", i);
        publish(r, name, MAX_BYTES);
        check(ensure(&s, r, name, msg) == SVC_ERROR_ADAPTER_TOO_LARGE, "%s: %s", name, msg);
    }
    check(ensure(&s, r, "big", msg) == SVC_ERROR_NONE, "big, forgotten: %s", msg);
    check(ensure(&s, r, "big-1", msg) == SVC_ERROR_ADAPTER_TOO_LARGE && strstr(msg, "remembered"),
          "big-1 still remembered: %s", msg);
    svc_adapter_store_deinit(&s);

    /* A <dir>/<name> without its config (an interrupted copy by hand). */
    char stale[PU_PATH_MAX + 64], file[PU_PATH_MAX + 128];
    snprintf(stale, sizeof stale, "%s/stale", adapters);
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", stale);
    check(mkdir(stale, 0755) == 0 && pu_write_file(file, "x", 1), "make %s", stale);
    publish(r, "stale", 100);
    svc_adapter_store_init(&s, adapters, MAX_BYTES);
    double errors = counter("mllama_adapter_store_errors_total");
    check(ensure(&s, r, "stale", msg) == SVC_ERROR_ADAPTER_UNAVAILABLE && strstr(msg, "rename"),
          "stale: %s", msg);
    check(counter("mllama_adapter_store_errors_total") == errors + 1, "stale: not counted");
    check(count_entries(adapters, ".staging-") == 0, "a staging directory is left");
    svc_adapter_store_deinit(&s);

    /* A directory that cannot be created: its parent is a file. */
    char parent[PU_PATH_MAX + 16], bad[PU_PATH_MAX + 32];
    snprintf(parent, sizeof parent, "%s/a-file", dir);
    snprintf(bad, sizeof bad, "%s/adapters", parent);
    check(pu_write_file(parent, "x", 1), "write %s", parent);
    svc_adapter_store_init(&s, bad, MAX_BYTES);
    check(ensure(&s, r, "a1", msg) == SVC_ERROR_ADAPTER_UNAVAILABLE &&
              strstr(msg, "Not a directory"),
          "unwritable: %s", msg);
    check(ensure(&s, r, "a1", msg) == SVC_ERROR_ADAPTER_UNAVAILABLE && strstr(msg, "remembered"),
          "unwritable, remembered: %s", msg);
    check(counter("mllama_adapter_store_errors_total") == errors + 2,
          "unwritable: counted %g times", counter("mllama_adapter_store_errors_total") - errors);
    svc_adapter_store_deinit(&s);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    svc_log_set_level(SVC_LOG_WARN);
    if (!pu_which("redis-server"))
        ml_test_skip("redis-server is not installed");
    pu_tmpdir("adapter-store", dir);
    atexit(cleanup);
    if (!pu_redis_start(&server, dir, 0)) {
        check(0, "redis-server did not start");
        return check_done();
    }
    svc_redis *r = client_create();
    char adapters[PU_PATH_MAX + 16];
    snprintf(adapters, sizeof adapters, "%s/adapters", dir);
    if (r) {
        test_copy(r, adapters);
        test_concurrent(r, adapters);
        test_leftover(adapters);
        test_failures(r, adapters);
    }
    svc_redis_destroy(r);
    return check_done();
}
