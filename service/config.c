/* Worker configuration (config.h): a table of known keys applied from each
 * source in turn (embedded defaults, file, environment, overrides). */
#include "config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "protocol/protocol.h"

/* config/local.json, compiled in by service/CMakeLists.txt. */
extern const char svc_local_config[];

#define CONFIG_FILE_MAX (1u << 20)
/* limits.max_reply_bytes at least: a streamed chunk (one token's text and
 * logprobs) or an error record always fits. */
#define REPLY_BYTES_MIN 65536
/* limits.max_schema_bytes at most: the parser prints a schema into a buffer
 * of this size (an int for cJSON), and no real schema comes near it. */
#define SCHEMA_BYTES_MAX (64L << 20)
/* limits.schema_cache_entries at most: lookups scan the entries. */
#define SCHEMA_CACHE_ENTRIES_MAX 4096

typedef enum field_type { FIELD_STR, FIELD_INT, FIELD_LONG, FIELD_BOOL } field_type;

typedef struct field {
    const char *section; /* NULL for top-level keys */
    const char *key;
    field_type type;
    size_t offset, size;
    long lo, hi;         /* numeric range */
} field;

#define STR(sec, k, member) {sec, k, FIELD_STR, offsetof(svc_config, member), sizeof(((svc_config *)0)->member), 0, 0}
#define INT(sec, k, member, lo, hi) {sec, k, FIELD_INT, offsetof(svc_config, member), sizeof(int), lo, hi}
#define LONG(sec, k, member, lo, hi) {sec, k, FIELD_LONG, offsetof(svc_config, member), sizeof(long), lo, hi}
#define BOOL(sec, k, member) {sec, k, FIELD_BOOL, offsetof(svc_config, member), sizeof(int), 0, 1}

static const field fields[] = {
    STR(NULL, "worker_id", worker_id),
    STR("model", "dir", model.dir),
    STR("model", "preset_if_missing", model.preset_if_missing),
    STR("model", "backend", model.backend),
    INT("model", "threads", model.threads, 0, 4096),
    INT("model", "tensor_parallel", model.tensor_parallel, 1, ML_ENGINE_MAX_WORLD),
    STR("model", "devices", model.devices),
    STR("model", "adapters_dir", model.adapters_dir),
    STR("model", "cross_attention_row_mask", model.cross_attention_row_mask),
    STR("model", "weights", model.weights),
    STR("model", "fp8_activations", model.fp8_activations),
    LONG("runtime", "kv_mib", runtime.kv_mib, 1, 1L << 24),
    LONG("runtime", "image_mib", runtime.image_mib, 1, 1L << 24),
    INT("runtime", "max_running", runtime.max_running, 1, 4096),
    INT("runtime", "max_step_tokens", runtime.max_step_tokens, 1, 1 << 20),
    INT("runtime", "max_images_per_request", runtime.max_images_per_request, 0, 64),
    INT("runtime", "default_max_tokens", runtime.default_max_tokens, 1, 1 << 20),
    INT("runtime", "max_adapters", runtime.max_adapters, 0, 1024),
    INT("runtime", "max_adapter_rank", runtime.max_adapter_rank, 1, 4096),
    BOOL("runtime", "batch_invariant", runtime.batch_invariant),
    BOOL("runtime", "prefix_cache", runtime.prefix_cache),
    STR("kafka", "brokers", kafka.brokers),
    STR("kafka", "group", kafka.group),
    STR("kafka", "request_topic", kafka.request_topic),
    STR("kafka", "cancel_topic", kafka.cancel_topic),
    STR("kafka", "dlt_topic", kafka.dlt_topic),
    STR("kafka", "reply_topics", kafka.reply_topics),
    INT("kafka", "mock_partitions", kafka.mock_partitions, 1, 1024),
    STR("redis", "url", redis.url),
    STR("redis", "prefix", redis.prefix),
    INT("redis", "timeout_ms", redis.timeout_ms, 1, 60000),
    INT("redis", "heartbeat_s", redis.heartbeat_s, 1, 3600),
    INT("redis", "ttl_s", redis.ttl_s, 1, 86400),
    /* Redis trust boundary and deadlines (service/README.md §3, §7). */
    INT("redis", "call_timeout_ms", redis.call_timeout_ms, 1, 60000),
    INT("redis", "attempts_ttl_s", redis.attempts_ttl_s, 60, 7 * 86400),
    INT("redis", "offset_attempts_ttl_s", redis.offset_attempts_ttl_s, 60, 86400),
    INT("worker", "stall_ms", worker.stall_ms, 100, 3600 * 1000),
    LONG("limits", "adapters_dir_bytes", limits.adapters_dir_bytes, 1L << 20, 1L << 40),
    LONG("limits", "max_request_bytes", limits.max_request_bytes, 1024, 1L << 31),
    LONG("limits", "max_image_bytes", limits.max_image_bytes, 1024, 1L << 31),
    LONG("limits", "max_image_pixels", limits.max_image_pixels, 1, 1L << 32),
    LONG("limits", "max_request_pixels", limits.max_request_pixels, 1, 1L << 36),
    LONG("limits", "max_reply_bytes", limits.max_reply_bytes, REPLY_BYTES_MIN, 1L << 30),
    LONG("limits", "max_adapter_bytes", limits.max_adapter_bytes, 1024, 1L << 30),
    LONG("limits", "max_schema_bytes", limits.max_schema_bytes, 16, SCHEMA_BYTES_MAX),
    LONG("limits", "max_schema_states", limits.max_schema_states, 16, UINT32_MAX),
    INT("limits", "max_schema_compile_ms", limits.max_schema_compile_ms, 1, 60 * 1000),
    INT("limits", "schema_cache_entries", limits.schema_cache_entries, 0, SCHEMA_CACHE_ENTRIES_MAX),
    LONG("limits", "schema_cache_bytes", limits.schema_cache_bytes, 0, 1L << 40),
    INT("limits", "max_attempts", limits.max_attempts, 1, 1000),
    INT("worker", "prep_threads", worker.prep_threads, 1, SVC_PREP_THREADS_MAX),
    STR("http", "listen", http.listen),
    INT("drain", "grace_ms", drain.grace_ms, 0, 3600 * 1000),
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

/* Set one field from text (environment, overrides) or a JSON value. */
static int set_text(svc_config *cfg, const field *f, const char *v, const char *where, char *err,
                    size_t errlen)
{
    char *dst = (char *)cfg + f->offset;
    if (f->type == FIELD_STR) {
        if (strlen(v) >= f->size) {
            svc_errf(err, errlen, "%s: longer than %zu bytes", where, f->size - 1);
            return -1;
        }
        memcpy(dst, v, strlen(v) + 1);
        return 0;
    }
    if (f->type == FIELD_BOOL) {
        static const char *const yes[] = {"true", "on", "1"}, *const no[] = {"false", "off", "0"};
        for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
            if (!strcmp(v, yes[i]) || !strcmp(v, no[i])) {
                *(int *)(void *)dst = !strcmp(v, yes[i]);
                return 0;
            }
        svc_errf(err, errlen, "%s: expected true or false (on/off, 1/0), got '%s'", where, v);
        return -1;
    }
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < f->lo || n > f->hi) {
        svc_errf(err, errlen, "%s: expected an integer in [%ld, %ld], got '%s'", where, f->lo,
                 f->hi, v);
        return -1;
    }
    if (f->type == FIELD_INT)
        *(int *)(void *)dst = (int)n;
    else
        *(long *)(void *)dst = n;
    return 0;
}

static int set_json(svc_config *cfg, const field *f, const cJSON *v, const char *where,
                    char *err, size_t errlen)
{
    char num[32];
    if (f->type == FIELD_STR) {
        if (!cJSON_IsString(v)) {
            svc_errf(err, errlen, "%s: expected a string", where);
            return -1;
        }
        return set_text(cfg, f, v->valuestring, where, err, errlen);
    }
    if (f->type == FIELD_BOOL) {
        if (!cJSON_IsBool(v)) {
            svc_errf(err, errlen, "%s: expected true or false", where);
            return -1;
        }
        return set_text(cfg, f, cJSON_IsTrue(v) ? "true" : "false", where, err, errlen);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble) {
        svc_errf(err, errlen, "%s: expected an integer", where);
        return -1;
    }
    snprintf(num, sizeof num, "%ld", (long)v->valuedouble);
    return set_text(cfg, f, num, where, err, errlen);
}

/* A librdkafka property, replacing an earlier value of the same key. */
static int set_kafka_prop(svc_config *cfg, const char *key, const char *value, char *err,
                          size_t errlen)
{
    size_t i = 0;
    while (i < cfg->kafka.n_props && strcmp(cfg->kafka.props[i].key, key))
        i++;
    if (i == SVC_CONFIG_MAX_KAFKA_PROPS) {
        svc_errf(err, errlen, "kafka: more than %d librdkafka properties",
                 SVC_CONFIG_MAX_KAFKA_PROPS);
        return -1;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        svc_errf(err, errlen, "config: out of memory");
        return -1;
    }
    if (i < cfg->kafka.n_props) {
        free((char *)cfg->kafka.props[i].key);
        free((char *)cfg->kafka.props[i].value);
    } else {
        cfg->kafka.n_props++;
    }
    cfg->kafka.props[i] = (svc_kafka_kv){k, v};
    return 0;
}

static const field *find_field(const char *section, const char *key)
{
    for (size_t i = 0; i < N_FIELDS; i++) {
        const field *f = &fields[i];
        if (!strcmp(f->key, key) &&
            (section ? f->section && !strcmp(f->section, section) : !f->section))
            return f;
    }
    return NULL;
}

/* Apply a whole JSON document. Unknown keys are errors: a typo must not
 * silently fall back to a default. */
static int apply_json(svc_config *cfg, const char *text, size_t len, const char *name,
                      char *err, size_t errlen)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        svc_errf(err, errlen, "%s: not a JSON object", name);
        cJSON_Delete(root);
        return -1;
    }
    int rc = 0;
    char where[512];
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (rc)
            break;
        if (!cJSON_IsObject(item)) {
            const field *f = find_field(NULL, item->string);
            snprintf(where, sizeof where, "%s: %s", name, item->string);
            if (!f) {
                svc_errf(err, errlen, "%s: unknown key", where);
                rc = -1;
            } else {
                rc = set_json(cfg, f, item, where, err, errlen);
            }
            continue;
        }
        const cJSON *kv;
        cJSON_ArrayForEach(kv, item)
        {
            snprintf(where, sizeof where, "%s: %s.%s", name, item->string, kv->string);
            if (!strcmp(item->string, "kafka") && strchr(kv->string, '.')) {
                if (!cJSON_IsString(kv)) {
                    svc_errf(err, errlen, "%s: librdkafka properties are strings", where);
                    rc = -1;
                } else {
                    rc = set_kafka_prop(cfg, kv->string, kv->valuestring, err, errlen);
                }
            } else {
                const field *f = find_field(item->string, kv->string);
                if (!f) {
                    svc_errf(err, errlen, "%s: unknown key", where);
                    rc = -1;
                } else {
                    rc = set_json(cfg, f, kv, where, err, errlen);
                }
            }
            if (rc)
                break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

/* MLLAMA_<SECTION>_<KEY>, upper case. */
static void env_name(const field *f, char *out, size_t n)
{
    snprintf(out, n, "MLLAMA_%s%s%s", f->section ? f->section : "", f->section ? "_" : "",
             f->key);
    for (char *p = out; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

void svc_config_reply_policy(const svc_config *cfg, const char *reserved[SVC_REPLY_RESERVED],
                             svc_topic_policy *p)
{
    reserved[0] = cfg->kafka.request_topic;
    reserved[1] = cfg->kafka.cancel_topic;
    reserved[2] = cfg->kafka.dlt_topic;
    *p = (svc_topic_policy){cfg->kafka.reply_topics, reserved, SVC_REPLY_RESERVED};
}

/* The reply-topic policy and the record sizes against the producer's. */
static int validate_replies(const svc_config *cfg, char *err, size_t errlen)
{
    const char *reserved[SVC_REPLY_RESERVED];
    svc_topic_policy policy;
    svc_config_reply_policy(cfg, reserved, &policy);
    char why[400];
    if (!svc_topic_policy_check(&policy, why, sizeof why)) {
        svc_errf(err, errlen, "kafka.reply_topics: %s", why);
        return -1;
    }
    const svc_kafka_kv *props = cfg->kafka.props;
    size_t n = cfg->kafka.n_props;
    long max_message = svc_kafka_kv_long(props, n, "message.max.bytes",
                                         SVC_KAFKA_MESSAGE_MAX_DEFAULT);
    if (cfg->limits.max_reply_bytes + (long)SVC_RECORD_RESERVE > max_message) {
        svc_errf(err, errlen,
                 "limits.max_reply_bytes (%ld) must stay %u bytes below the producer's "
                 "kafka.message.max.bytes (%ld) for keys and headers",
                 cfg->limits.max_reply_bytes, SVC_RECORD_RESERVE, max_message);
        return -1;
    }
    long timeout = svc_kafka_kv_long(props, n, "message.timeout.ms", SVC_PRODUCER_TIMEOUT_MS);
    long propagation = svc_kafka_kv_long(props, n, "topic.metadata.propagation.max.ms", 0);
    if (timeout > 0 && propagation >= timeout) {
        svc_errf(err, errlen,
                 "kafka.topic.metadata.propagation.max.ms (%ld) must be below "
                 "kafka.message.timeout.ms (%ld): records for a missing reply topic must fail "
                 "as that request's error, not time out as the cluster's",
                 propagation, timeout);
        return -1;
    }
    return 0;
}

static int validate(svc_config *cfg, char *err, size_t errlen)
{
    if (strcmp(cfg->model.backend, "auto") && strcmp(cfg->model.backend, "cpu") &&
        strcmp(cfg->model.backend, "cuda")) {
        svc_errf(err, errlen, "model.backend: expected auto, cpu or cuda, got '%s'",
                 cfg->model.backend);
        return -1;
    }
    if (ml_row_mask_mode_parse(cfg->model.cross_attention_row_mask, &cfg->model.row_mask)) {
        svc_errf(err, errlen,
                 "model.cross_attention_row_mask: expected %s or %s, got '%s'",
                 ml_row_mask_mode_name(ML_ROW_MASK_REFERENCE),
                 ml_row_mask_mode_name(ML_ROW_MASK_TRANSFORMERS),
                 cfg->model.cross_attention_row_mask);
        return -1;
    }
    if (strcmp(cfg->model.weights, "stored") && strcmp(cfg->model.weights, "fp8")) {
        svc_errf(err, errlen, "model.weights: expected stored or fp8, got '%s'",
                 cfg->model.weights);
        return -1;
    }
    cfg->model.quantize_fp8 = !strcmp(cfg->model.weights, "fp8");
    if (strcmp(cfg->model.fp8_activations, "bf16") && strcmp(cfg->model.fp8_activations, "fp8")) {
        svc_errf(err, errlen, "model.fp8_activations: expected bf16 or fp8, got '%s'",
                 cfg->model.fp8_activations);
        return -1;
    }
    cfg->model.quant_activations = !strcmp(cfg->model.fp8_activations, "fp8");
    const char *topics[][2] = {{"kafka.request_topic", cfg->kafka.request_topic},
                               {"kafka.cancel_topic", cfg->kafka.cancel_topic},
                               {"kafka.dlt_topic", cfg->kafka.dlt_topic}};
    for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
        if (!svc_valid_topic(topics[i][1], strlen(topics[i][1]))) {
            svc_errf(err, errlen, "%s: '%s' is not a valid topic name", topics[i][0],
                     topics[i][1]);
            return -1;
        }
    if (validate_replies(cfg, err, errlen))
        return -1;
    if (!cfg->model.dir[0] || !cfg->kafka.brokers[0] || !cfg->kafka.group[0]) {
        svc_errf(err, errlen, "model.dir, kafka.brokers and kafka.group are required");
        return -1;
    }
    int devices[ML_ENGINE_MAX_WORLD];
    char why[256];
    int n_devices = ml_engine_parse_devices(cfg->model.devices, devices, ML_ENGINE_MAX_WORLD, why,
                                            sizeof why);
    if (n_devices < 0) {
        svc_errf(err, errlen, "model.devices: %s", why);
        return -1;
    }
    if (n_devices && n_devices != cfg->model.tensor_parallel) {
        svc_errf(err, errlen, "model.devices lists %d devices but model.tensor_parallel is %d",
                 n_devices, cfg->model.tensor_parallel);
        return -1;
    }
    if (cfg->runtime.max_step_tokens < cfg->runtime.max_running) {
        svc_errf(err, errlen, "runtime.max_step_tokens (%d) must be >= runtime.max_running (%d)",
                 cfg->runtime.max_step_tokens, cfg->runtime.max_running);
        return -1;
    }
    if (!cfg->worker_id[0]) {
        char host[256] = "worker";
        gethostname(host, sizeof host - 1);
        snprintf(cfg->worker_id, sizeof cfg->worker_id, "%s-%ld", host, (long)getpid());
    }
    return 0;
}

int svc_config_load(svc_config *cfg, const char *path, const char *const *overrides,
                    size_t n_overrides, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    if (apply_json(cfg, svc_local_config, strlen(svc_local_config), "embedded defaults", err,
                   errlen))
        return -1;
    if (path) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            svc_errf(err, errlen, "%s: %s", path, strerror(errno));
            return -1;
        }
        char *buf = malloc(CONFIG_FILE_MAX);
        size_t n = buf ? fread(buf, 1, CONFIG_FILE_MAX, f) : 0;
        int too_big = buf && n == CONFIG_FILE_MAX;
        fclose(f);
        int rc = !buf || too_big ? -1 : apply_json(cfg, buf, n, path, err, errlen);
        if (too_big)
            svc_errf(err, errlen, "%s: larger than %u bytes", path, CONFIG_FILE_MAX);
        free(buf);
        if (rc)
            return -1;
    }
    char name[256], where[300];
    for (size_t i = 0; i < N_FIELDS; i++) {
        env_name(&fields[i], name, sizeof name);
        const char *v = getenv(name);
        snprintf(where, sizeof where, "environment %s", name);
        if (v && set_text(cfg, &fields[i], v, where, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < n_overrides; i++) {
        char buf[SVC_CONFIG_STR * 2];
        snprintf(buf, sizeof buf, "%s", overrides[i]);
        char *eq = strchr(buf, '='), *dot = strchr(buf, '.');
        snprintf(where, sizeof where, "--set %s", overrides[i]);
        if (!eq || (dot && dot > eq)) {
            svc_errf(err, errlen, "%s: expected [section.]key=value", where);
            return -1;
        }
        *eq = 0;
        const char *section = dot ? buf : NULL, *key = dot ? dot + 1 : buf;
        if (dot)
            *dot = 0;
        if (section && !strcmp(section, "kafka") && strchr(key, '.')) {
            if (set_kafka_prop(cfg, key, eq + 1, err, errlen))
                return -1;
            continue;
        }
        const field *f = find_field(section, key);
        if (!f) {
            svc_errf(err, errlen, "%s: unknown key", where);
            return -1;
        }
        if (set_text(cfg, f, eq + 1, where, err, errlen))
            return -1;
    }
    return validate(cfg, err, errlen);
}

void svc_config_deinit(svc_config *cfg)
{
    for (size_t i = 0; i < cfg->kafka.n_props; i++) {
        free((char *)cfg->kafka.props[i].key);
        free((char *)cfg->kafka.props[i].value);
    }
    cfg->kafka.n_props = 0;
}
