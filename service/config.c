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
/* A tenant's weight at most: shares are ratios of small numbers. */
#define TENANT_WEIGHT_MAX 10000
#define TENANT_WEIGHT_DEFAULT 1
/* A tenant's max_in_flight by default: runtime.max_running times this. */
#define TENANT_IN_FLIGHT_PER_SLOT 2
#define TENANT_IN_FLIGHT_MAX (1 << 20)
#define TENANTS_ENV "MLLAMA_TENANTS" /* the "tenants" array as JSON text */
/* gateway.max_connections and the stream limits at most: the gateway's
 * descriptors (one per connection) stay below a generous RLIMIT_NOFILE. */
#define GATEWAY_CONNECTIONS_MAX (1 << 20)
/* A tenant's requests per second and burst at most. */
#define GATEWAY_RATE_MAX 1000000
/* The domain tag of a cache salt, NUL included: sha256(tag || cache_group). */
static const char cache_salt_tag[] = "mllama.cache";

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
    BOOL("model", "fp8_lm_head", model.fp8_lm_head),
    STR("model", "cpu_activations", model.cpu_activations),
    STR("model", "cpu_kv_cache", model.cpu_kv_cache),
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
    INT("limits", "max_n", limits.max_n, 1, SVC_MAX_N_LIMIT),
    INT("limits", "max_tokens", limits.max_tokens, 1, SVC_MAX_TOKENS_LIMIT),
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
    STR("log", "level", log.level),
    STR("gateway", "listen", gateway.listen),
    STR("gateway", "instance", gateway.instance),
    STR("gateway", "api_keys_file", gateway.api_keys_file),
    STR("gateway", "model", gateway.model),
    INT("gateway", "retain_s", gateway.retain_s, 0, 86400),
    INT("gateway", "abandon_ms", gateway.abandon_ms, 0, 3600 * 1000),
    INT("gateway", "request_timeout_s", gateway.request_timeout_s, 1, 86400),
    INT("gateway", "max_connections", gateway.max_connections, 1, GATEWAY_CONNECTIONS_MAX),
    INT("gateway", "max_streams", gateway.max_streams, 1, GATEWAY_CONNECTIONS_MAX),
    INT("gateway", "tenant_max_streams", gateway.tenant_max_streams, 1, GATEWAY_CONNECTIONS_MAX),
    INT("gateway", "tenant_requests_per_s", gateway.tenant_requests_per_s, 1, GATEWAY_RATE_MAX),
    INT("gateway", "tenant_burst", gateway.tenant_burst, 1, GATEWAY_RATE_MAX),
    INT("gateway", "header_timeout_ms", gateway.header_timeout_ms, 100, 3600 * 1000),
    INT("gateway", "keepalive_s", gateway.keepalive_s, 1, 3600),
    LONG("gateway", "max_retained_bytes", gateway.max_retained_bytes, 1L << 20, 1L << 40),
    LONG("gateway", "write_buffer_bytes", gateway.write_buffer_bytes, 4096, 1L << 30),
    BOOL("gateway", "create_reply_topics", gateway.create_reply_topics),
    INT("gateway", "reply_partitions", gateway.reply_partitions, 1, 1024),
    INT("gateway", "adapters_refresh_s", gateway.adapters_refresh_s, 1, 3600),
    BOOL("gateway", "image_fetch", gateway.image_fetch),
    BOOL("gateway", "image_fetch_http", gateway.image_fetch_http),
    BOOL("gateway", "image_fetch_private", gateway.image_fetch_private),
    STR("gateway", "image_fetch_hosts", gateway.image_fetch_hosts),
    STR("gateway", "image_fetch_ca_file", gateway.image_fetch_ca_file),
    INT("gateway", "image_fetch_timeout_ms", gateway.image_fetch_timeout_ms, 100, 600 * 1000),
    INT("gateway", "image_fetch_redirects", gateway.image_fetch_redirects, 0, 20),
    INT("gateway", "image_fetch_max_pending", gateway.image_fetch_max_pending, 1,
        GATEWAY_CONNECTIONS_MAX),
    LONG("gateway", "image_fetch_max_bytes", gateway.image_fetch_max_bytes, 1L << 20, 1L << 40),
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

/* ---- tenants ------------------------------------------------------------------ */

/* A string member `key` of tenant object o into dst (size n); absent leaves
 * dst as it is (empty: the default). */
static int tenant_str(const cJSON *o, const char *key, char *dst, size_t n, const char *where,
                      char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) {
        svc_errf(err, errlen, "%s.%s: expected a string of at most %zu bytes", where, key, n - 1);
        return -1;
    }
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

/* An integer member `key` in [lo, hi]; absent leaves *dst (0: the default). */
static int tenant_int(const cJSON *o, const char *key, int *dst, int lo, int hi,
                      const char *where, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    /* The range first: converting a double beyond int is undefined. */
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(int)v->valuedouble) {
        svc_errf(err, errlen, "%s.%s: expected an integer in [%d, %d]", where, key, lo, hi);
        return -1;
    }
    *dst = (int)v->valuedouble;
    return 0;
}

/* The "tenants" array of a config document, replacing any earlier one.
 * Defaults are applied at validation, once every source is read. */
static int set_tenants(svc_config *cfg, const cJSON *arr, const char *name, char *err,
                       size_t errlen)
{
    static const char *const keys[] = {"name",         "request_topic",  "cancel_topic",
                                       "reply_topics", "weight",         "max_in_flight",
                                       "cache_group",  "max_streams",    "requests_per_s",
                                       "burst"};
    int n = cJSON_GetArraySize(arr);
    if (!cJSON_IsArray(arr) || n < 1 || n > SVC_TENANTS_MAX) {
        svc_errf(err, errlen, "%s: tenants: expected an array of 1 to %d tenant objects", name,
                 SVC_TENANTS_MAX);
        return -1;
    }
    svc_tenant *t = calloc((size_t)n, sizeof *t);
    if (!t) {
        svc_errf(err, errlen, "config: out of memory");
        return -1;
    }
    char where[300];
    int i = 0, rc = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr)
    {
        snprintf(where, sizeof where, "%s: tenants[%d]", name, i);
        if (!cJSON_IsObject(o)) {
            svc_errf(err, errlen, "%s: expected an object", where);
            rc = -1;
            break;
        }
        const cJSON *kv;
        cJSON_ArrayForEach(kv, o)
        {
            size_t k = 0;
            while (k < sizeof keys / sizeof keys[0] && strcmp(keys[k], kv->string))
                k++;
            if (k == sizeof keys / sizeof keys[0]) {
                svc_errf(err, errlen, "%s.%s: unknown key", where, kv->string);
                rc = -1;
                break;
            }
        }
        svc_tenant *x = &t[i++];
        if (rc || tenant_str(o, "name", x->name, sizeof x->name, where, err, errlen) ||
            tenant_str(o, "request_topic", x->request_topic, sizeof x->request_topic, where, err,
                       errlen) ||
            tenant_str(o, "cancel_topic", x->cancel_topic, sizeof x->cancel_topic, where, err,
                       errlen) ||
            tenant_str(o, "reply_topics", x->reply_topics, sizeof x->reply_topics, where, err,
                       errlen) ||
            tenant_str(o, "cache_group", x->cache_group, sizeof x->cache_group, where, err,
                       errlen) ||
            tenant_int(o, "weight", &x->weight, 1, TENANT_WEIGHT_MAX, where, err, errlen) ||
            tenant_int(o, "max_in_flight", &x->max_in_flight, 1, TENANT_IN_FLIGHT_MAX, where, err,
                       errlen) ||
            tenant_int(o, "max_streams", &x->max_streams, 1, GATEWAY_CONNECTIONS_MAX, where, err,
                       errlen) ||
            tenant_int(o, "requests_per_s", &x->requests_per_s, 1, GATEWAY_RATE_MAX, where, err,
                       errlen) ||
            tenant_int(o, "burst", &x->burst, 1, GATEWAY_RATE_MAX, where, err, errlen)) {
            rc = -1;
            break;
        }
        if (!svc_valid_tenant_name(x->name, strlen(x->name))) {
            svc_errf(err, errlen, "%s.name: expected [a-z0-9_-]{1,%d}, got '%s'", where,
                     SVC_TENANT_NAME_MAX, x->name);
            rc = -1;
            break;
        }
    }
    if (rc) {
        free(t);
        return -1;
    }
    free(cfg->tenants);
    cfg->tenants = t;
    cfg->n_tenants = (size_t)n;
    return 0;
}

/* "tenants" from text (the environment, --set): a JSON array as in a file. */
static int set_tenants_text(svc_config *cfg, const char *text, const char *where, char *err,
                            size_t errlen)
{
    cJSON *arr = cJSON_Parse(text);
    int rc = set_tenants(cfg, arr, where, err, errlen);
    cJSON_Delete(arr);
    return rc;
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
        if (!strcmp(item->string, "tenants")) {
            rc = set_tenants(cfg, item, name, err, errlen);
            continue;
        }
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

/* `<base>.<name>` into dst (size n); false when it does not fit. */
static bool derive_topic(char *dst, size_t n, const char *base, const char *name)
{
    return (size_t)snprintf(dst, n, "%s.%s", base, name) < n;
}

/* The first exact entry of a reply-topic policy (its first topic name), in
 * dst; false when it has none. */
static bool first_reply_topic(const char *policy, char *dst, size_t n)
{
    for (const char *at = policy; *at;) {
        size_t len = strcspn(at, ",");
        if (len > 0 && at[len - 1] != '*' && len < n) {
            memcpy(dst, at, len);
            dst[len] = 0;
            return true;
        }
        at += len + (at[len] == ',');
    }
    return false;
}

/* Fill in a tenant's defaults (config.h, service/protocol/README.md "Tenants"). where names it
 * in errors. */
static int tenant_defaults(const svc_config *cfg, svc_tenant *t, const char *where, char *err,
                           size_t errlen)
{
    if (!t->request_topic[0] &&
        !derive_topic(t->request_topic, sizeof t->request_topic, cfg->kafka.request_topic,
                      t->name)) {
        svc_errf(err, errlen, "%s.request_topic: '%s.%s' is longer than %d bytes", where,
                 cfg->kafka.request_topic, t->name, SVC_TOPIC_NAME_MAX);
        return -1;
    }
    if (!t->cancel_topic[0] &&
        !derive_topic(t->cancel_topic, sizeof t->cancel_topic, cfg->kafka.cancel_topic,
                      t->name)) {
        svc_errf(err, errlen, "%s.cancel_topic: '%s.%s' is longer than %d bytes", where,
                 cfg->kafka.cancel_topic, t->name, SVC_TOPIC_NAME_MAX);
        return -1;
    }
    if (!t->reply_topics[0]) {
        char first[SVC_TOPIC_NAME_MAX + 1];
        if (!first_reply_topic(cfg->kafka.reply_topics, first, sizeof first)) {
            svc_errf(err, errlen,
                     "%s.reply_topics: required, as kafka.reply_topics names no topic to "
                     "derive it from",
                     where);
            return -1;
        }
        size_t n = (size_t)snprintf(t->reply_topics, sizeof t->reply_topics, "%s.%s,%s.%s.*",
                                    first, t->name, first, t->name);
        if (n >= sizeof t->reply_topics || strlen(first) + 1 + strlen(t->name) > SVC_TOPIC_NAME_MAX) {
            svc_errf(err, errlen, "%s.reply_topics: '%s.%s' is longer than %d bytes", where,
                     first, t->name, SVC_TOPIC_NAME_MAX);
            return -1;
        }
    }
    if (!t->weight)
        t->weight = TENANT_WEIGHT_DEFAULT;
    if (!t->max_in_flight)
        t->max_in_flight = TENANT_IN_FLIGHT_PER_SLOT * cfg->runtime.max_running;
    if (!t->cache_group[0])
        memcpy(t->cache_group, t->name, sizeof t->cache_group);
    if (!t->max_streams)
        t->max_streams = cfg->gateway.tenant_max_streams;
    if (!t->requests_per_s)
        t->requests_per_s = cfg->gateway.tenant_requests_per_s;
    if (!t->burst)
        t->burst = cfg->gateway.tenant_burst;
    if (!svc_valid_tenant_name(t->cache_group, strlen(t->cache_group))) {
        svc_errf(err, errlen, "%s.cache_group: expected [a-z0-9_-]{1,%d}, got '%s'", where,
                 SVC_TENANT_NAME_MAX, t->cache_group);
        return -1;
    }
    svc_cache_salt(t->cache_group, t->cache_salt);
    return 0;
}

/* The names no reply may go to, copied into one allocation (the pointers
 * first, then the names), so nothing points into the svc_config struct,
 * which is copied. */
static int build_reserved(svc_config *cfg, char *err, size_t errlen)
{
    const char *names[SVC_RESERVED_TOPICS_MAX];
    size_t n = 0;
    names[n++] = cfg->kafka.request_topic;
    names[n++] = cfg->kafka.cancel_topic;
    names[n++] = cfg->kafka.dlt_topic;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        names[n++] = cfg->tenants[i].request_topic;
        names[n++] = cfg->tenants[i].cancel_topic;
    }
    const size_t slot = SVC_CONFIG_TOPIC;
    char *block = malloc(n * (sizeof(char *) + slot));
    if (!block) {
        svc_errf(err, errlen, "config: out of memory");
        return -1;
    }
    const char **ptrs = (const char **)(void *)block;
    char *text = block + n * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        snprintf(text + i * slot, slot, "%s", names[i]);
        ptrs[i] = text + i * slot;
    }
    free(cfg->reserved_topics);
    cfg->reserved_topics = ptrs;
    cfg->n_reserved_topics = n;
    return 0;
}

/* The tenants after every source: the implicit one when none is
 * configured, defaults, then the rules that keep tenants apart: distinct
 * names, request and cancel topics distinct from each other and from the
 * DLT, each reply policy valid and overlapping no other tenant's (one
 * could then answer on another's topic). */
static int validate_tenants(svc_config *cfg, char *err, size_t errlen)
{
    bool implicit = cfg->n_tenants == 0;
    if (implicit) {
        if (!(cfg->tenants = calloc(1, sizeof *cfg->tenants))) {
            svc_errf(err, errlen, "config: out of memory");
            return -1;
        }
        cfg->n_tenants = 1;
        svc_tenant *t = &cfg->tenants[0];
        snprintf(t->name, sizeof t->name, "%s", SVC_IMPLICIT_TENANT);
        snprintf(t->request_topic, sizeof t->request_topic, "%s", cfg->kafka.request_topic);
        snprintf(t->cancel_topic, sizeof t->cancel_topic, "%s", cfg->kafka.cancel_topic);
        snprintf(t->reply_topics, sizeof t->reply_topics, "%s", cfg->kafka.reply_topics);
    }
    char where[96];
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        snprintf(where, sizeof where, "tenants[%zu] (%s)", i, cfg->tenants[i].name);
        if (tenant_defaults(cfg, &cfg->tenants[i], where, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        const svc_tenant *a = &cfg->tenants[i];
        snprintf(where, sizeof where, "tenants[%zu] (%s)", i, a->name);
        const char *own[] = {a->request_topic, a->cancel_topic};
        for (size_t k = 0; k < 2; k++) {
            if (!svc_valid_topic(own[k], strlen(own[k]))) {
                svc_errf(err, errlen, "%s: '%s' is not a valid topic name", where, own[k]);
                return -1;
            }
            if (!strcmp(own[k], cfg->kafka.dlt_topic) || !strcmp(own[0], own[1])) {
                svc_errf(err, errlen, "%s: topic '%s' is used twice", where, own[k]);
                return -1;
            }
        }
        for (size_t j = i + 1; j < cfg->n_tenants; j++) {
            const svc_tenant *b = &cfg->tenants[j];
            if (!strcmp(a->name, b->name)) {
                svc_errf(err, errlen, "tenants[%zu] and tenants[%zu]: both named '%s'", i, j,
                         a->name);
                return -1;
            }
            const char *theirs[] = {b->request_topic, b->cancel_topic};
            for (size_t k = 0; k < 4; k++)
                if (!strcmp(own[k / 2], theirs[k % 2])) {
                    svc_errf(err, errlen, "tenants '%s' and '%s' share the topic '%s'", a->name,
                             b->name, own[k / 2]);
                    return -1;
                }
        }
    }
    if (build_reserved(cfg, err, errlen))
        return -1;
    char why[400];
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        svc_tenant *t = &cfg->tenants[i];
        t->policy = (svc_topic_policy){t->reply_topics, cfg->reserved_topics,
                                       cfg->n_reserved_topics};
        if (!svc_topic_policy_check(&t->policy, why, sizeof why)) {
            if (implicit)
                svc_errf(err, errlen, "kafka.reply_topics: %s", why);
            else
                svc_errf(err, errlen, "tenants[%zu] (%s).reply_topics: %s", i, t->name, why);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (svc_topic_policy_overlap(&cfg->tenants[j].policy, &t->policy, why, sizeof why)) {
                svc_errf(err, errlen,
                         "tenants '%s' and '%s': reply topics overlap (%s): one could answer "
                         "on the other's topic",
                         cfg->tenants[j].name, t->name, why);
                return -1;
            }
    }
    return 0;
}

/* The record sizes and timeouts against the producer's. */
static int validate_replies(const svc_config *cfg, char *err, size_t errlen)
{
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
    if (svc_parse_choice("model.weights", cfg->model.weights, "stored", "fp8",
                         &cfg->model.quantize_fp8, err, errlen) ||
        svc_parse_choice("model.fp8_activations", cfg->model.fp8_activations, "bf16", "fp8",
                         &cfg->model.quant_activations, err, errlen) ||
        svc_parse_choice("model.cpu_activations", cfg->model.cpu_activations, "f32", "bf16",
                         &cfg->model.cpu_bf16_activations, err, errlen) ||
        svc_parse_choice("model.cpu_kv_cache", cfg->model.cpu_kv_cache, "f32", "bf16",
                         &cfg->model.cpu_bf16_kv_cache, err, errlen))
        return -1;
    if (svc_log_level_parse(cfg->log.level, &cfg->log.threshold)) {
        svc_errf(err, errlen, "log.level: expected debug, info, warn or error, got '%s'",
                 cfg->log.level);
        return -1;
    }
    const char *topics[][2] = {{"kafka.request_topic", cfg->kafka.request_topic},
                               {"kafka.cancel_topic", cfg->kafka.cancel_topic},
                               {"kafka.dlt_topic", cfg->kafka.dlt_topic}};
    for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
        if (!svc_valid_topic(topics[i][1], strlen(topics[i][1]))) {
            svc_errf(err, errlen, "%s: '%s' is not a valid topic name", topics[i][0],
                     topics[i][1]);
            return -1;
        }
    if (validate_tenants(cfg, err, errlen) || validate_replies(cfg, err, errlen))
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
    if (cfg->runtime.default_max_tokens > cfg->limits.max_tokens) {
        svc_errf(err, errlen, "runtime.default_max_tokens (%d) must be <= limits.max_tokens (%d)",
                 cfg->runtime.default_max_tokens, cfg->limits.max_tokens);
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
    const char *tenants = getenv(TENANTS_ENV);
    if (tenants && set_tenants_text(cfg, tenants, "environment " TENANTS_ENV, err, errlen))
        return -1;
    static const char tenants_set[] = "tenants=";
    for (size_t i = 0; i < n_overrides; i++) {
        char buf[SVC_CONFIG_STR * 2];
        snprintf(buf, sizeof buf, "%s", overrides[i]);
        char *eq = strchr(buf, '='), *dot = strchr(buf, '.');
        snprintf(where, sizeof where, "--set %s", overrides[i]);
        /* A JSON array, of any length and with dots in its topics. */
        if (!strncmp(overrides[i], tenants_set, sizeof tenants_set - 1)) {
            if (set_tenants_text(cfg, overrides[i] + sizeof tenants_set - 1, "--set tenants", err,
                                 errlen))
                return -1;
            continue;
        }
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

const svc_tenant *svc_config_tenant_by_topic(const svc_config *cfg, const char *topic)
{
    for (size_t i = 0; topic && i < cfg->n_tenants; i++)
        if (!strcmp(cfg->tenants[i].request_topic, topic) ||
            !strcmp(cfg->tenants[i].cancel_topic, topic))
            return &cfg->tenants[i];
    return NULL;
}

void svc_config_deinit(svc_config *cfg)
{
    free(cfg->tenants);
    free(cfg->reserved_topics);
    cfg->tenants = NULL;
    cfg->reserved_topics = NULL;
    cfg->n_tenants = cfg->n_reserved_topics = 0;
    for (size_t i = 0; i < cfg->kafka.n_props; i++) {
        free((char *)cfg->kafka.props[i].key);
        free((char *)cfg->kafka.props[i].value);
    }
    cfg->kafka.n_props = 0;
}

void svc_cache_salt(const char *cache_group, uint8_t out[SVC_CACHE_SALT_BYTES])
{
    ml_sha256_ctx ctx;
    ml_sha256_init(&ctx);
    ml_sha256_update(&ctx, cache_salt_tag, sizeof cache_salt_tag);
    ml_sha256_update(&ctx, cache_group, strlen(cache_group));
    ml_sha256_final(&ctx, out);
}
