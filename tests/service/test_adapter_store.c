/* The adapter store (service/worker/adapter_store.c) against a real
 * redis-server started here on a free port, in a scratch directory, with
 * adapters for the micro model (adapter_util.h):
 * - an adapter in Redis is copied into <dir>/@<sha256>/ byte for byte,
 *   leaving no staging directory, and the runtime is told that name; an
 *   operator's <dir>/<name>/ wins over Redis;
 * - eight threads, each with its own connection, asking for one adapter at
 *   once all succeed with one copy;
 * - a republished adapter (new bytes, new digest) is served once the name's
 *   pin is due (aged here), beside the old copy; with Redis down the last
 *   digest known still serves;
 * - bytes that do not hash to their sha256 field, that are no adapter, or
 *   whose rank is over the limit are refused with a message naming no path,
 *   remembered per digest, and never kept;
 * - the copies stay under the byte cap: the least recently used goes first,
 *   never one used within SVC_ADAPTER_KEEP_MS;
 * - a staging directory a killed process left is removed at init;
 * - a missing adapter is unknown_adapter and not remembered (published
 *   afterwards, it serves); one over the size limit is adapter_too_large
 *   and remembered; past SVC_ADAPTER_FAILURES_MAX keys the oldest failure
 *   is forgotten;
 * - a directory that cannot be created is adapter_unavailable, counted once
 *   in mllama_adapter_store_errors_total.
 * Skipped (77) when redis-server is not installed. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include "adapter_util.h"
#include "worker/adapter_store.h"
#include "harness.h"
#include "log.h"
#include "metrics.h"
#include "checkpoint/config.h"

#define PREFIX "mllama"
#define MAX_BYTES 32768
#define RANK 2
#define MAX_RANK 4
#define THREADS 8
#define INIT 0.5f
#define HOUR_S 3600

static pu_redis server;
static char dir[PU_PATH_MAX];
static ml_config model;
static int n_made;

static const pu_lora_module text[] = {{"language_model.model.layers.0.self_attn.q_proj", 64, 64},
                                      {"language_model.model.layers.2.self_attn.q_proj", 64, 64}};
#define TARGETS ".*language_model.*layers\\\\.(0|2)\\\\.self_attn\\\\.q_proj"

static void cleanup(void)
{
    pu_kill(&server.proc);
    pu_tmpdir_done(dir);
}

static svc_redis *client_create_at(const char *url)
{
    svc_redis_config cfg;
    svc_redis_config_default(&cfg);
    cfg.url = url;
    cfg.prefix = PREFIX;
    cfg.worker_id = "w1";
    svc_redis *r = NULL;
    char err[160];
    check(svc_redis_create(&cfg, &r, err, sizeof err) == SVC_REDIS_OK, "create: %s", err);
    return r;
}

static svc_redis *client_create(void) { return client_create_at(server.url); }

/* A new random adapter of `rank` published under name; its digest into sha. */
static void publish(const char *name, int rank, char sha[SVC_SHA256_HEX_LEN + 1])
{
    char tag[64];
    snprintf(tag, sizeof tag, "made-%d", n_made++);
    pu_adapter_files f = pu_adapter_make(dir, tag, TARGETS, text, 2, rank, 2 * rank, INIT);
    pu_adapter_publish(&server, PREFIX, name, &f, sha);
    pu_adapter_files_free(&f);
}

/* Publish raw fields (config, weights, sha256) under name. */
static void publish_raw(const char *name, const char *config, const char *weights,
                        const char *sha)
{
    redisReply *rep = pu_redis_cmd(&server, "HSET " PREFIX ":adapter:%s config %s weights %s "
                                            "sha256 %s", name, config, weights, sha);
    check(rep && rep->type == REDIS_REPLY_INTEGER, "publish %s", name);
    freeReplyObject(rep);
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

static void store_init(svc_adapter_store *s, const char *adapters, size_t dir_max_bytes)
{
    svc_adapter_store_config cfg = {.dir = adapters, .max_bytes = MAX_BYTES,
                                    .dir_max_bytes = dir_max_bytes, .model = &model,
                                    .max_rank = MAX_RANK};
    svc_adapter_store_init(s, &cfg);
}

static svc_error ensure(svc_adapter_store *s, svc_redis *r, const char *name,
                        char ref[SVC_ADAPTER_REF_MAX], char *msg)
{
    msg[0] = '\0';
    return svc_adapter_store_ensure(s, r, name, ref, msg, SVC_ERRMSG_MAX);
}

/* Every pin due: the next request looks the name up again. */
static void age_pins(svc_adapter_store *s)
{
    for (int i = 0; i < SVC_ADAPTER_PINS_MAX; i++)
        s->pins[i].checked_ms -= SVC_ADAPTER_PIN_TTL_MS;
}

static void want_ref(const char *ref, const char *sha, const char *what)
{
    check(ref[0] == '@' && !strcmp(ref + 1, sha), "%s: runtime name %s, want @%s", what, ref,
          sha);
}

static void test_copy(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    store_init(&s, adapters, SIZE_MAX);
    char msg[SVC_ERRMSG_MAX], path[PU_PATH_MAX + 128], ref[SVC_ADAPTER_REF_MAX];
    char sha[SVC_SHA256_HEX_LEN + 1];
    publish("a1", RANK, sha);
    check(ensure(&s, r, "a1", ref, msg) == SVC_ERROR_NONE, "a1: %s", msg);
    want_ref(ref, sha, "a1");
    svc_redis_adapter want;
    check(svc_redis_adapter_get(r, "a1", MAX_BYTES, &want) == SVC_REDIS_OK, "a1: get");
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/%s/%s", adapters, ref, files[f]);
        size_t len = 0;
        char *got = pu_slurp(path, &len);
        const uint8_t *bytes = f ? want.weights : want.config;
        size_t n = f ? want.weights_len : want.config_len;
        check(got && len == n && !memcmp(got, bytes, n), "a1: %s differs", files[f]);
        free(got);
    }
    svc_redis_adapter_deinit(&want);
    check(count_entries(adapters, ".staging-") == 0, "a staging directory is left");

    /* An operator's copy under the name wins, Redis or not. */
    snprintf(path, sizeof path, "%s/a1", adapters);
    check(mkdir(path, 0755) == 0, "mkdir %s", path);
    snprintf(path, sizeof path, "%s/a1/adapter_config.json", adapters);
    check(pu_write_file(path, "{}", 2), "write %s", path);
    check(ensure(&s, r, "a1", ref, msg) == SVC_ERROR_NONE && !strcmp(ref, "a1"),
          "the operator's a1: %s %s", ref, msg);
    svc_adapter_store_deinit(&s);
}

typedef struct racer {
    svc_adapter_store *s;
    svc_redis *r;
    svc_error code;
    char ref[SVC_ADAPTER_REF_MAX];
    char msg[SVC_ERRMSG_MAX];
} racer;

static void *race(void *arg)
{
    racer *x = arg;
    x->code = ensure(x->s, x->r, "a2", x->ref, x->msg);
    return NULL;
}

static void test_concurrent(const char *adapters)
{
    svc_adapter_store s;
    store_init(&s, adapters, SIZE_MAX);
    char sha[SVC_SHA256_HEX_LEN + 1];
    publish("a2", RANK, sha);
    int before = count_entries(adapters, "@");
    racer x[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        x[i] = (racer){.s = &s, .r = client_create()};
        pthread_create(&t[i], NULL, race, &x[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        check(x[i].code == SVC_ERROR_NONE, "racer %d: %s", i, x[i].msg);
        want_ref(x[i].ref, sha, "racer");
        svc_redis_destroy(x[i].r);
    }
    check(count_entries(adapters, "@") == before + 1 && count_entries(adapters, ".staging-") == 0,
          "concurrent copies: %d new, %d staging", count_entries(adapters, "@") - before,
          count_entries(adapters, ".staging-"));
    svc_adapter_store_deinit(&s);
}

static void test_republish(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    store_init(&s, adapters, SIZE_MAX);
    char msg[SVC_ERRMSG_MAX], ref[SVC_ADAPTER_REF_MAX];
    char v1[SVC_SHA256_HEX_LEN + 1], v2[SVC_SHA256_HEX_LEN + 1];
    publish("re", RANK, v1);
    check(ensure(&s, r, "re", ref, msg) == SVC_ERROR_NONE, "re v1: %s", msg);
    want_ref(ref, v1, "re v1");
    publish("re", RANK, v2);
    check(strcmp(v1, v2), "two versions, two digests");
    check(ensure(&s, r, "re", ref, msg) == SVC_ERROR_NONE, "re v1, pinned: %s", msg);
    want_ref(ref, v1, "re, pinned");
    age_pins(&s);
    check(ensure(&s, r, "re", ref, msg) == SVC_ERROR_NONE, "re v2: %s", msg);
    want_ref(ref, v2, "re v2");

    /* Redis down: the last digest known serves from its copy. */
    char dead[64];
    snprintf(dead, sizeof dead, "redis://127.0.0.1:%d/0", pu_free_port());
    svc_redis *down = client_create_at(dead);
    age_pins(&s);
    check(ensure(&s, down, "re", ref, msg) == SVC_ERROR_NONE, "re, Redis down: %s", msg);
    want_ref(ref, v2, "re, Redis down");
    check(ensure(&s, down, "never-seen", ref, msg) == SVC_ERROR_ADAPTER_UNAVAILABLE,
          "an adapter never seen, Redis down: %s", msg);
    svc_redis_destroy(down);
    svc_adapter_store_deinit(&s);
}

static void test_refused(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    store_init(&s, adapters, SIZE_MAX);
    char msg[SVC_ERRMSG_MAX], ref[SVC_ADAPTER_REF_MAX], sha[SVC_SHA256_HEX_LEN + 1];
    int copies = count_entries(adapters, "@");

    /* Bytes that match their digest and are no adapter. */
    static const char config[] = "{\"peft_type\": \"LORA\", \"r\": 2, \"target_modules\": [\"x\"]}";
    static const char junk[] = "not a safetensors file";
    svc_redis_adapter_digest(config, sizeof config - 1, junk, sizeof junk - 1, sha);
    publish_raw("junk", config, junk, sha);
    /* Bytes that do not match the digest stored with them. */
    publish_raw("forged", config, junk, "00000000000000000000000000000000"
                                        "00000000000000000000000000000000");
    /* A real adapter of a rank over runtime.max_adapter_rank. */
    publish("wide", 2 * MAX_RANK, NULL);
    static const char *const names[] = {"junk", "forged", "wide"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        check(ensure(&s, r, names[i], ref, msg) == SVC_ERROR_ADAPTER_UNAVAILABLE &&
                  strstr(msg, "cannot be served") && !strchr(msg, '/'),
              "%s: %s", names[i], msg);
        check(ensure(&s, r, names[i], ref, msg) == SVC_ERROR_ADAPTER_UNAVAILABLE &&
                  strstr(msg, "remembered"),
              "%s, again: %s", names[i], msg);
    }
    check(count_entries(adapters, "@") == copies && count_entries(adapters, ".staging-") == 0,
          "a refused adapter was kept");
    /* Remembered per digest: fixed bytes under the same name serve at once. */
    publish("junk", RANK, sha);
    age_pins(&s);
    check(ensure(&s, r, "junk", ref, msg) == SVC_ERROR_NONE, "junk, republished: %s", msg);
    want_ref(ref, sha, "junk, republished");
    svc_adapter_store_deinit(&s);
}

/* Set the mtime of <adapters>/<ref> age_s seconds back. */
static void age_copy(const char *adapters, const char *ref, int age_s)
{
    char path[PU_PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s", adapters, ref);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= age_s;
    ts[1] = ts[0];
    check(utimensat(AT_FDCWD, path, ts, 0) == 0, "age %s", path);
}

static void test_byte_cap(svc_redis *r, const char *root)
{
    char adapters[PU_PATH_MAX + 32];
    snprintf(adapters, sizeof adapters, "%s/capped", root);
    char msg[SVC_ERRMSG_MAX], ref[3][SVC_ADAPTER_REF_MAX], sha[3][SVC_SHA256_HEX_LEN + 1];
    static const char *const names[] = {"c0", "c1", "c2"};
    for (int i = 0; i < 3; i++)
        publish(names[i], RANK, sha[i]);
    svc_redis_adapter one;
    check(svc_redis_adapter_get(r, "c0", MAX_BYTES, &one) == SVC_REDIS_OK, "c0 get");
    size_t each = one.config_len + one.weights_len;
    svc_redis_adapter_deinit(&one);

    /* Room for one and a half. */
    svc_adapter_store s;
    store_init(&s, adapters, each + each / 2);
    for (int i = 0; i < 2; i++)
        check(ensure(&s, r, names[i], ref[i], msg) == SVC_ERROR_NONE, "%s: %s", names[i], msg);
    check(count_entries(adapters, "@") == 2, "both kept while used within the keep period");
    age_copy(adapters, ref[0], 3 * HOUR_S);
    age_copy(adapters, ref[1], 2 * HOUR_S);
    check(ensure(&s, r, "c0", ref[0], msg) == SVC_ERROR_NONE, "c0 used again: %s", msg);
    check(ensure(&s, r, "c2", ref[2], msg) == SVC_ERROR_NONE, "c2: %s", msg);
    char path[2 * PU_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", adapters, ref[1]);
    check(access(path, F_OK) != 0, "c1, the least recently used, is left");
    for (int i = 0; i < 3; i += 2) {
        snprintf(path, sizeof path, "%s/%s/adapter_config.json", adapters, ref[i]);
        check(access(path, R_OK) == 0, "%s was deleted", names[i]);
    }
    /* Deleted, it is fetched again when asked for. */
    age_pins(&s);
    check(ensure(&s, r, "c1", ref[1], msg) == SVC_ERROR_NONE, "c1 again: %s", msg);
    want_ref(ref[1], sha[1], "c1 again");
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
    store_init(&s, adapters, SIZE_MAX);
    check(access(staging, F_OK) != 0, "init left %s", staging);
    svc_adapter_store_deinit(&s);
}

static void test_failures(svc_redis *r, const char *adapters)
{
    svc_adapter_store s;
    store_init(&s, adapters, SIZE_MAX);
    char msg[SVC_ERRMSG_MAX], ref[SVC_ADAPTER_REF_MAX];
    check(ensure(&s, r, "later", ref, msg) == SVC_ERROR_UNKNOWN_ADAPTER, "missing: %s", msg);
    publish("later", RANK, NULL);
    check(ensure(&s, r, "later", ref, msg) == SVC_ERROR_NONE, "published later: %s", msg);

    /* Over the size limit: the script refuses it before its bytes move. */
    char *big = calloc(1, MAX_BYTES + 1);
    memset(big, 'x', MAX_BYTES);
    char sha[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter_digest("{}", 2, big, MAX_BYTES, sha);
    publish_raw("big", "{}", big, sha);
    check(ensure(&s, r, "big", ref, msg) == SVC_ERROR_ADAPTER_TOO_LARGE &&
              strstr(msg, "limits.max_adapter_bytes"),
          "too large: %s", msg);
    publish("big", RANK, NULL);
    check(ensure(&s, r, "big", ref, msg) == SVC_ERROR_ADAPTER_TOO_LARGE && strstr(msg, "remembered"),
          "too large, remembered: %s", msg);

    /* More failures than the memory holds: the oldest ("big") is forgotten. */
    char name[32];
    for (int i = 0; i < SVC_ADAPTER_FAILURES_MAX; i++) {
        snprintf(name, sizeof name, "big-%d", i);
        publish_raw(name, "{}", big, sha);
        check(ensure(&s, r, name, ref, msg) == SVC_ERROR_ADAPTER_TOO_LARGE, "%s: %s", name, msg);
    }
    free(big);
    check(ensure(&s, r, "big", ref, msg) == SVC_ERROR_NONE, "big, forgotten: %s", msg);
    check(ensure(&s, r, "big-1", ref, msg) == SVC_ERROR_ADAPTER_TOO_LARGE &&
              strstr(msg, "remembered"),
          "big-1 still remembered: %s", msg);
    svc_adapter_store_deinit(&s);

    /* A directory that cannot be created: its parent is a file. */
    double errors = counter("mllama_adapter_store_errors_total");
    char parent[PU_PATH_MAX + 16], bad[PU_PATH_MAX + 32];
    snprintf(parent, sizeof parent, "%s/a-file", dir);
    snprintf(bad, sizeof bad, "%s/adapters", parent);
    check(pu_write_file(parent, "x", 1), "write %s", parent);
    store_init(&s, bad, SIZE_MAX);
    check(ensure(&s, r, "later", ref, msg) == SVC_ERROR_ADAPTER_UNAVAILABLE &&
              strstr(msg, "cannot be stored") && !strchr(msg, '/'),
          "unwritable: %s", msg);
    check(ensure(&s, r, "later", ref, msg) == SVC_ERROR_ADAPTER_UNAVAILABLE &&
              strstr(msg, "remembered"),
          "unwritable, remembered: %s", msg);
    check(counter("mllama_adapter_store_errors_total") == errors + 1,
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
    char micro[PU_PATH_MAX + 16], path[PU_PATH_MAX + 32], log[PU_PATH_MAX + 32], err[256];
    snprintf(micro, sizeof micro, "%s/micro", dir);
    snprintf(path, sizeof path, "%s/config.json", micro);
    snprintf(log, sizeof log, "%s/mkmodel.log", dir);
    if (!pu_make_model(micro, log) || ml_config_load(&model, path, err, sizeof err) != ML_OK)
        pu_die("micro model");
    if (!pu_redis_start(&server, dir, 0)) {
        check(0, "redis-server did not start");
        return check_done();
    }
    svc_redis *r = client_create();
    char adapters[PU_PATH_MAX + 16];
    snprintf(adapters, sizeof adapters, "%s/adapters", dir);
    if (r) {
        test_copy(r, adapters);
        test_concurrent(adapters);
        test_republish(r, adapters);
        test_refused(r, adapters);
        test_byte_cap(r, dir);
        test_leftover(adapters);
        test_failures(r, adapters);
    }
    svc_redis_destroy(r);
    return check_done();
}
