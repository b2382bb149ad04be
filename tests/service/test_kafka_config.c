/* The Kafka layer's configuration surface and the log helper, without a
 * cluster: pass-through properties (errors name the key, fixed keys are
 * refused), the mock's topic specification (hostile input), the worker
 * configuration's reply settings and its boolean runtime.batch_invariant,
 * and one JSON object per log line whatever the message holds. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "harness.h"
#include "kafka/kafka.h"
#include "log.h"
#include "kafka/mock_kafka.h"

/* Counts reports into *opaque when given one. */
static void on_delivery(void *opaque, const svc_delivery *d)
{
    if (opaque)
        (*(int *)opaque)++;
}

/* Create a consumer with one pass-through property; expect `want` and, on
 * error, `needle` in the message. */
static void consumer_kv(const char *key, const char *value, svc_kafka_status want,
                        const char *needle)
{
    const char *topics[] = {"requests"};
    svc_kafka_kv kv = {key, value};
    svc_consumer_config cfg = {
        .brokers = "127.0.0.1:1", .group_id = "g", .topics = topics, .n_topics = 1,
        .kafka = &kv, .n_kafka = 1,
    };
    char err[512] = "";
    svc_consumer *c = NULL;
    svc_kafka_status st = svc_consumer_create(&cfg, &c, err, sizeof err);
    check(st == want, "consumer %s=%s: %s (%s), want %s", key ? key : "(null)",
          value ? value : "(null)", svc_kafka_status_name(st), err, svc_kafka_status_name(want));
    if (st != SVC_KAFKA_OK)
        check(c == NULL && strstr(err, needle), "error for %s names it: %s", needle, err);
    svc_consumer_destroy(c);
}

static void producer_kv(const char *key, const char *value, svc_kafka_status want,
                        const char *needle)
{
    svc_kafka_kv kv = {key, value};
    svc_producer_config cfg = {.brokers = "127.0.0.1:1", .kafka = &kv, .n_kafka = 1,
                               .on_delivery = on_delivery, .close_flush_ms = 1};
    char err[512] = "";
    svc_producer *p = NULL;
    svc_kafka_status st = svc_producer_create(&cfg, &p, err, sizeof err);
    check(st == want, "producer %s=%s: %s (%s)", key, value, svc_kafka_status_name(st), err);
    if (st != SVC_KAFKA_OK)
        check(p == NULL && strstr(err, needle), "error for %s names it: %s", needle, err);
    svc_producer_destroy(p);
}

static void test_pass_through(void)
{
    consumer_kv("session.timeout.ms", "6000", SVC_KAFKA_OK, "");
    consumer_kv("no.such.property", "1", SVC_KAFKA_ERR_CONFIG, "kafka.no.such.property");
    consumer_kv("session.timeout.ms", "soon", SVC_KAFKA_ERR_CONFIG, "kafka.session.timeout.ms");
    consumer_kv("enable.auto.offset.store", "true", SVC_KAFKA_ERR_CONFIG,
                "kafka.enable.auto.offset.store: fixed");
    consumer_kv("enable.auto.commit", "false", SVC_KAFKA_ERR_CONFIG, "kafka.enable.auto.commit");
    consumer_kv(NULL, "1", SVC_KAFKA_ERR_CONFIG, "kafka[0]");
    consumer_kv("client.id", NULL, SVC_KAFKA_ERR_CONFIG, "kafka[0]");
    producer_kv("linger.ms", "0", SVC_KAFKA_OK, "");
    producer_kv("enable.idempotence", "false", SVC_KAFKA_ERR_CONFIG,
                "kafka.enable.idempotence: fixed");
    producer_kv("linger.ms", "-7", SVC_KAFKA_ERR_CONFIG, "kafka.linger.ms");
    producer_kv("max.in.flight.requests.per.connection", "5", SVC_KAFKA_ERR_CONFIG,
                "kafka.max.in.flight.requests.per.connection: fixed");
    producer_kv("allow.auto.create.topics", "true", SVC_KAFKA_ERR_CONFIG,
                "kafka.allow.auto.create.topics: fixed");

    const char *topics[] = {"requests"};
    svc_consumer_config no_group = {.brokers = "127.0.0.1:1", .topics = topics, .n_topics = 1};
    svc_consumer *c = (svc_consumer *)&no_group; /* must be reset to NULL */
    char err[256];
    check(svc_consumer_create(&no_group, &c, err, sizeof err) == SVC_KAFKA_ERR_CONFIG && !c &&
              strstr(err, "group.id"),
          "a consumer without group.id: %s", err);
    svc_consumer_config no_topic = {.brokers = "127.0.0.1:1", .group_id = "g"};
    check(svc_consumer_create(&no_topic, &c, err, sizeof err) == SVC_KAFKA_ERR_CONFIG,
          "a consumer without topics: %s", err);
    svc_producer_config no_cb = {.brokers = "127.0.0.1:1"};
    svc_producer *p = (svc_producer *)&no_cb;
    check(svc_producer_create(&no_cb, &p, err, sizeof err) == SVC_KAFKA_ERR_CONFIG && !p,
          "a producer without a delivery callback: %s", err);
    svc_consumer_destroy(NULL);
    svc_producer_destroy(NULL);
}

/* Which delivery errors are a record's (its request's failure) and which
 * the cluster's (the worker stops). */
static void test_record_status(void)
{
    static const struct {
        rd_kafka_resp_err_t err;
        svc_kafka_status want;
    } cases[] = {
        {RD_KAFKA_RESP_ERR_NO_ERROR, SVC_KAFKA_OK},
        {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, SVC_KAFKA_ERR_TOO_LARGE},
        {RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, SVC_KAFKA_ERR_TOO_LARGE},
        {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, SVC_KAFKA_ERR_TOPIC},
        {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, SVC_KAFKA_ERR_TOPIC},
        {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, SVC_KAFKA_ERR_TOPIC},
        {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, SVC_KAFKA_ERR_KAFKA},
        {RD_KAFKA_RESP_ERR__TRANSPORT, SVC_KAFKA_ERR_KAFKA},
        {RD_KAFKA_RESP_ERR__PURGE_QUEUE, SVC_KAFKA_ERR_KAFKA},
        {RD_KAFKA_RESP_ERR__FATAL, SVC_KAFKA_ERR_FATAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check(svc_kafka_record_status(cases[i].err) == cases[i].want, "%s: %s, want %s",
              rd_kafka_err2name(cases[i].err),
              svc_kafka_status_name(svc_kafka_record_status(cases[i].err)),
              svc_kafka_status_name(cases[i].want));
}

/* The worker's reply settings as svc_config_load checks them. */
static void test_reply_config(void)
{
    static const struct {
        const char *set[2];
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {{"kafka.reply_topics=mllama.replies,mllama.dlt"}, "kafka.reply_topics: entry 1"},
        {{"kafka.reply_topics=__consumer_offsets"}, "kafka.reply_topics"},
        {{"kafka.reply_topics=a b"}, "kafka.reply_topics"},
        {{"kafka.reply_topics=answers.*,mllama.replies"}, NULL},
        {{"limits.max_reply_bytes=990000"}, "kafka.message.max.bytes (1000000)"},
        {{"limits.max_reply_bytes=4000000", "kafka.message.max.bytes=5000000"}, NULL},
        {{"limits.max_reply_bytes=1000"}, "limits.max_reply_bytes"},
        {{"kafka.topic.metadata.propagation.max.ms=30000"}, "propagation.max.ms"},
        {{"kafka.message.timeout.ms=2500"}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        svc_config cfg;
        char err[512] = "";
        size_t n = cases[i].set[1] ? 2 : 1;
        int rc = svc_config_load(&cfg, NULL, cases[i].set, n, err, sizeof err);
        if (cases[i].needle)
            check(rc == -1 && strstr(err, cases[i].needle), "%s refused naming %s: %s",
                  cases[i].set[0], cases[i].needle, rc ? err : "accepted");
        else
            check(rc == 0, "%s accepted: %s", cases[i].set[0], err);
        svc_config_deinit(&cfg);
    }
    svc_config cfg;
    char err[512] = "";
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 &&
              !strcmp(cfg.kafka.reply_topics, "mllama.replies,mllama.replies.*") &&
              cfg.limits.max_reply_bytes + (long)SVC_RECORD_RESERVE <=
                  SVC_KAFKA_MESSAGE_MAX_DEFAULT,
          "the defaults: %s", err);
    svc_config_deinit(&cfg);
}

/* The boolean keys: runtime.batch_invariant, off by default (its cost on a GPU is
 * unmeasured), set by --set, the environment or a JSON true/false, and
 * refused in any other spelling. */
static void test_bool_config(void)
{
    static const struct {
        const char *set, *json; /* one of them */
        int want;               /* -1: refused */
    } cases[] = {
        {"runtime.batch_invariant=on", NULL, 1},     {"runtime.batch_invariant=true", NULL, 1},
        {"runtime.batch_invariant=1", NULL, 1},      {"runtime.batch_invariant=off", NULL, 0},
        {"runtime.batch_invariant=yes", NULL, -1},   {"runtime.batch_invariant=", NULL, -1},
        {NULL, "{\"runtime\": {\"batch_invariant\": true}}", 1},
        {NULL, "{\"runtime\": {\"batch_invariant\": false}}", 0},
        {NULL, "{\"runtime\": {\"batch_invariant\": 1}}", -1},
        {NULL, "{\"runtime\": {\"batch_invariant\": \"on\"}}", -1},
    };
    svc_config cfg;
    char err[512] = "";
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 &&
              cfg.runtime.batch_invariant == 0,
          "runtime.batch_invariant is off by default: %s", err);
    svc_config_deinit(&cfg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[] = "/tmp/mllama-config-XXXXXX";
        const char *label = cases[i].set ? cases[i].set : cases[i].json;
        int rc;
        err[0] = 0;
        if (cases[i].set) {
            rc = svc_config_load(&cfg, NULL, &cases[i].set, 1, err, sizeof err);
        } else {
            int fd = mkstemp(path);
            FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
            check(f != NULL, "temporary config file");
            if (!f)
                continue;
            fputs(cases[i].json, f);
            fclose(f);
            rc = svc_config_load(&cfg, path, NULL, 0, err, sizeof err);
            unlink(path);
        }
        if (cases[i].want < 0)
            check(rc == -1 && strstr(err, "runtime.batch_invariant"), "%s refused naming the key: %s",
                  label, rc ? err : "accepted");
        else
            check(rc == 0 && cfg.runtime.batch_invariant == cases[i].want, "%s gives %d: %s", label,
                  cases[i].want, err);
        svc_config_deinit(&cfg);
    }
    setenv("MLLAMA_RUNTIME_BATCH_INVARIANT", "on", 1);
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 &&
              cfg.runtime.batch_invariant == 1,
          "MLLAMA_RUNTIME_BATCH_INVARIANT=on: %s", err);
    svc_config_deinit(&cfg);
    unsetenv("MLLAMA_RUNTIME_BATCH_INVARIANT");
    /* runtime.prefix_cache is the other boolean: on by default, and off by override. */
    const char *off = "runtime.prefix_cache=off";
    check(svc_config_load(&cfg, NULL, NULL, 0, err, sizeof err) == 0 &&
              cfg.runtime.prefix_cache == 1,
          "runtime.prefix_cache is on by default: %s", err);
    svc_config_deinit(&cfg);
    check(svc_config_load(&cfg, NULL, &off, 1, err, sizeof err) == 0 &&
              cfg.runtime.prefix_cache == 0,
          "%s: %s", off, err);
    svc_config_deinit(&cfg);
}

/* A producer that cannot reach any broker: records queue, then the bound on
 * a full queue answers ERR_QUEUE_FULL, both on the delivery-report thread
 * (which polls while it waits) and on another thread (which sleeps). */
static void test_queue_full(void)
{
    enum { LIMIT = 5, WAIT_MS = 50 };
    const svc_kafka_kv kv[] = {{"queue.buffering.max.messages", "5"}};
    int reports = 0;
    svc_producer_config cfg = {.brokers = "127.0.0.1:1", .kafka = kv, .n_kafka = 1,
                               .on_delivery = on_delivery, .opaque = &reports,
                               .queue_full_ms = WAIT_MS, .close_flush_ms = 1};
    svc_producer *p;
    char err[256];
    check(svc_producer_create(&cfg, &p, err, sizeof err) == SVC_KAFKA_OK, "producer: %s", err);
    svc_producer_poll(p, 0); /* this thread serves the reports */
    svc_kafka_record r = {.topic = "t", .partition = RD_KAFKA_PARTITION_UA, .key = "k",
                          .key_len = 1, .value = "v", .value_len = 1};
    for (int i = 0; i < LIMIT; i++)
        check(svc_producer_produce(p, &r, err, sizeof err) == SVC_KAFKA_OK, "record %d: %s", i,
              err);
    check(svc_producer_queued(p) >= LIMIT, "queued %d", svc_producer_queued(p));
    svc_kafka_status st = svc_producer_produce(p, &r, err, sizeof err);
    check(st == SVC_KAFKA_ERR_QUEUE_FULL && strstr(err, "t:"),
          "a full queue is reported after the bound: %s (%s)", svc_kafka_status_name(st), err);
    check(!svc_producer_fatal(p, err, sizeof err), "queue full is not fatal");
    svc_kafka_header nameless = {NULL, "x", 1};
    r.headers = &nameless;
    r.n_headers = 1;
    check(svc_producer_produce(p, &r, err, sizeof err) == SVC_KAFKA_ERR_CONFIG,
          "a header without a name: %s", err);
    svc_producer_destroy(p);
    check(reports == LIMIT, "destroy purged the queue and reported every record (%d)", reports);
}

static void test_mock_topics(void)
{
    static const struct {
        const char *spec;
        const char *needle; /* NULL: accepted */
    } cases[] = {
        /* Each accepted spec starts a cluster, and stopping one takes librdkafka 1 s. */
        {"requests:8,replies:8,dlt:1,cancel:1,a.b_c-d:1024", NULL},
        {"", NULL},
        {"requests", "entry 0 'requests': expected name:partitions"},
        {"requests:0", "partitions must be 1..1024"},
        {"requests:1025", "partitions must be 1..1024"},
        {"requests:99999999999999999999999", "partitions must be 1..1024"},
        {"requests:-1", "partitions must be 1..1024"},
        {"requests:4x", "partitions must be 1..1024"},
        {"requests:", "partitions must be 1..1024"},
        {":4", "expected name:partitions"},
        {"a b:1", "uses only"},
        {"a/b:1", "uses only"},
        {"a:1,", "empty after the last ','"},
        {",a:1", "entry 0"},
        {"a:1,,b:1", "entry 1"},
        {"a:1,a:2", "topic a is listed twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        svc_mock_kafka *m = (svc_mock_kafka *)&cases[i]; /* must be reset */
        char err[512] = "";
        svc_kafka_status st = svc_mock_kafka_create(1, cases[i].spec, &m, err, sizeof err);
        if (!cases[i].needle)
            check(st == SVC_KAFKA_OK && m && strstr(svc_mock_kafka_bootstraps(m), "127.0.0.1:"),
                  "spec '%s' accepted: %s", cases[i].spec, err);
        else
            check(st != SVC_KAFKA_OK && !m && strstr(err, cases[i].needle),
                  "spec '%s' refused with '%s': %s", cases[i].spec, cases[i].needle, err);
        svc_mock_kafka_destroy(st == SVC_KAFKA_OK ? m : NULL);
    }
    char long_name[300];
    memset(long_name, 'x', 250);
    strcpy(long_name + 250, ":1");
    svc_mock_kafka *m;
    char err[512];
    check(svc_mock_kafka_create(1, long_name, &m, err, sizeof err) == SVC_KAFKA_ERR_CONFIG &&
              strlen(err) < 400,
          "a 250-character name is refused and quoted briefly: %s", err);
    char many[2 * (SVC_MOCK_KAFKA_MAX_TOPICS + 1) + 4];
    memset(many, ',', sizeof many - 1);
    many[sizeof many - 1] = '\0';
    check(svc_mock_kafka_create(1, many, &m, err, sizeof err) == SVC_KAFKA_ERR_CONFIG &&
              strstr(err, "at most"),
          "too many entries: %s", err);
    check(svc_mock_kafka_create(0, "", &m, err, sizeof err) == SVC_KAFKA_ERR_CONFIG,
          "0 brokers: %s", err);
    check(svc_mock_kafka_create(SVC_MOCK_KAFKA_MAX_BROKERS + 1, "", &m, err, sizeof err) ==
              SVC_KAFKA_ERR_CONFIG,
          "too many brokers: %s", err);
    svc_mock_kafka_destroy(NULL);
}

static void test_log_lines(void)
{
    FILE *f = tmpfile();
    check(f != NULL, "tmpfile");
    if (!f)
        return;
    svc_log_set_output(f);
    svc_log_set_level(SVC_LOG_INFO);
    svc_log(SVC_LOG_DEBUG, "test.hidden", "below the threshold");
    svc_log(SVC_LOG_INFO, "test.escape", "quote \" backslash \\ newline \n tab \t bell \a end");
    char big[5000];
    memset(big, '"', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    svc_log(SVC_LOG_ERROR, "test.long", "%s", big);
    svc_log_set_output(NULL);

    rewind(f);
    char line[16384];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        cJSON *j = cJSON_Parse(line);
        check(j != NULL, "line %d is one JSON object: %.80s", n, line);
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "event");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(j, "msg");
        const cJSON *lvl = cJSON_GetObjectItemCaseSensitive(j, "level");
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "ts");
        check(cJSON_IsString(ev) && cJSON_IsString(msg) && cJSON_IsString(lvl) &&
                  cJSON_IsString(ts) && strlen(ts->valuestring) == 24,
              "line %d has ts, level, event, msg", n);
        if (n == 1 && cJSON_IsString(msg))
            check(!strcmp(msg->valuestring,
                          "quote \" backslash \\ newline \n tab \t bell \a end") &&
                      !strcmp(lvl->valuestring, "info"),
                  "escaped message round-trips: %s", msg->valuestring);
        if (n == 2 && cJSON_IsString(msg))
            check(strlen(msg->valuestring) > 1000 && !strcmp(lvl->valuestring, "error"),
                  "a long message is cut, still valid JSON (%zu)", strlen(msg->valuestring));
        cJSON_Delete(j);
    }
    check(n == 2, "two lines written (debug filtered): %d", n);
    fclose(f);

    svc_log_level l = SVC_LOG_INFO;
    check(svc_log_level_parse("warn", &l) == 0 && l == SVC_LOG_WARN, "parse warn");
    check(svc_log_level_parse("loud", &l) == -1 && l == SVC_LOG_WARN, "unknown level refused");
}

int main(void)
{
    /* Clients pointed at 127.0.0.1:1 log refused connections: not news here. */
    svc_log_set_level(SVC_LOG_ERROR);
    FILE *devnull = fopen("/dev/null", "w");
    svc_log_set_output(devnull);
    test_pass_through();
    test_record_status();
    test_reply_config();
    test_bool_config();
    test_queue_full();
    test_mock_topics();
    test_log_lines();
    if (devnull)
        fclose(devnull);
    return check_done();
}
