/* The worker's configuration: a JSON file (config/local.json holds the
 * embedded defaults), then environment overrides MLLAMA_<SECTION>_<KEY>
 * (e.g. MLLAMA_KAFKA_BROKERS, MLLAMA_REDIS_URL, MLLAMA_MODEL_DIR), then
 * command-line overrides `--set section.key=value`. Validated at start; every
 * error names the key.
 *
 * Keys of the "kafka" section that contain a dot are librdkafka properties,
 * passed through unchanged (config names as in librdkafka's CONFIGURATION.md).
 * @locality: the main thread, before any other thread starts. */
#ifndef SVC_CONFIG_H
#define SVC_CONFIG_H

#include <stddef.h>

#include "engine.h"
#include "kafka/kafka.h"
#include "log.h"
#include "protocol/protocol.h"

#define SVC_CONFIG_STR 512
#define SVC_CONFIG_MAX_KAFKA_PROPS 64
#define SVC_CONFIG_TOPIC 256             /* a topic name's field; validated to 249 bytes */
#define SVC_PREP_THREADS_MAX 64
#define SVC_TENANTS_MAX 64
/* The tenant of a configuration without "tenants" (its cache group too). */
#define SVC_IMPLICIT_TENANT "default"
#define SVC_CACHE_SALT_BYTES ML_CACHE_SALT_BYTES /* the runtime's request salt */
/* The names a tenant's reply policy never allows: every tenant's request and
 * cancel topics, kafka.request_topic, kafka.cancel_topic and the DLT. */
#define SVC_RESERVED_TOPICS_MAX (2 * SVC_TENANTS_MAX + 3)

/* A tenant: whoever may write its request and cancel topics (the broker's
 * ACLs decide who that is). The topic a record was read from is its
 * tenant; nothing in a record chooses one (service/README.md "Tenants").
 * Filled by svc_config_load, defaults applied; read-only afterwards. */
typedef struct svc_tenant {
    char name[SVC_TENANT_NAME_MAX + 1];
    char request_topic[SVC_CONFIG_TOPIC];
    char cancel_topic[SVC_CONFIG_TOPIC];
    char reply_topics[SVC_CONFIG_STR];   /* its reply-topic policy (svc_topic_policy) */
    svc_topic_policy policy;             /* reply_topics parsed; borrows from the tenant and
                                            from the config's reserved list */
    int weight;                          /* its share of admission, relative to the others */
    int max_in_flight;                   /* its requests consumed and not yet finished */
    char cache_group[SVC_TENANT_NAME_MAX + 1]; /* tenants of one group share caches */
    uint8_t cache_salt[SVC_CACHE_SALT_BYTES]; /* sha256("mllama.cache\0" || cache_group) */
    /* The gateway's limits for the tenant's HTTP clients (0 in the file: the
     * gateway section's tenant_* default, filled in at load). */
    int max_streams;                     /* its streams open at once */
    int requests_per_s, burst;           /* its token bucket: refill rate and size */
} svc_tenant;

typedef struct svc_config {
    char worker_id[SVC_CONFIG_STR];      /* "" = <hostname>-<pid> */
    struct {
        char dir[SVC_CONFIG_STR];        /* Hugging Face checkpoint directory */
        char preset_if_missing[64];      /* mkmodel preset written to dir when absent; "" = fail */
        char backend[16];                /* "auto", "cpu" or "cuda" */
        int threads;                     /* CPU backend threads, all ranks together; 0 = all cores */
        int tensor_parallel;             /* shards (devices) the model is split over */
        char devices[256];               /* CUDA devices of the shards, "0,1,..."; "" = the first
                                            tensor_parallel devices */
        char adapters_dir[SVC_CONFIG_STR]; /* PEFT adapters: <dir>/<name>/; Redis-held ones are
                                              written here */
        char cross_attention_row_mask[16]; /* "reference" or "transformers" (ml_row_mask_mode) */
        ml_row_mask_mode row_mask;       /* cross_attention_row_mask, parsed at validation */
        char weights[8];                 /* "stored" or "fp8" (quantize at load) */
        int quantize_fp8;                /* weights, parsed at validation */
        char fp8_activations[8];         /* "bf16" (W8A16) or "fp8" (W8A8 per token) */
        int quant_activations;           /* fp8_activations, parsed at validation */
        int fp8_lm_head;                 /* lm_head FP8 too (quantized at load when bf16) */
        char cpu_activations[8];         /* "f32" (the reference) or "bf16" (AVX-512 BF16) */
        int cpu_bf16_activations;        /* cpu_activations, parsed at validation */
        char cpu_kv_cache[8];            /* "f32" (the reference) or "bf16" (K/V and image
                                            states stored bf16; any CPU) */
        int cpu_bf16_kv_cache;           /* cpu_kv_cache, parsed at validation */
    } model;
    struct {
        long kv_mib, image_mib;
        int max_running, max_step_tokens, max_images_per_request, default_max_tokens;
        int max_adapters, max_adapter_rank;
        int batch_invariant;             /* CUDA: batch-invariant kernels (ml_engine_config) */
        int prefix_cache;                /* share full K/V blocks by content (1 = on) */
    } runtime;
    struct {
        char brokers[SVC_CONFIG_STR];    /* "mock" = the in-process mock cluster */
        char group[256];
        char request_topic[SVC_CONFIG_TOPIC], cancel_topic[SVC_CONFIG_TOPIC];
        char dlt_topic[SVC_CONFIG_TOPIC];
        char reply_topics[SVC_CONFIG_STR]; /* the reply-topic policy (svc_topic_policy) */
        int mock_partitions;
        svc_kafka_kv props[SVC_CONFIG_MAX_KAFKA_PROPS]; /* owned strings */
        size_t n_props;
    } kafka;
    struct {
        char url[SVC_CONFIG_STR];        /* "" = no Redis */
        char prefix[128];
        int timeout_ms, heartbeat_s, ttl_s;
        int call_timeout_ms;             /* a whole Redis call, connect included */
        int attempts_ttl_s;              /* per-request-id attempt counters */
        int offset_attempts_ttl_s;       /* per-offset (poison-message) counters */
    } redis;
    struct {
        long max_request_bytes, max_image_bytes, max_image_pixels;
        long max_request_pixels;         /* decoded pixels of all of a request's images */
        long max_reply_bytes;            /* one reply record; a dead letter's value */
        int max_n;                       /* choices of one request (n) */
        int max_tokens;                  /* the largest max_tokens a request may ask for */
        long max_adapter_bytes;          /* a Redis-held adapter's two files together */
        long adapters_dir_bytes;         /* every copy of a Redis-held adapter together */
        long max_schema_bytes;           /* response_format json_schema: the compact schema text */
        long max_schema_states;          /* automaton states one compilation may build */
        int max_schema_compile_ms;       /* wall time of one compilation */
        int schema_cache_entries;        /* compiled grammars kept (0 = compile every request) */
        long schema_cache_bytes;         /* their ml_grammar_bytes together */
        int max_attempts;
    } limits;
    struct {
        int prep_threads;                /* threads preparing requests (parse, decode, template) */
        int stall_ms;                    /* a prep thread busy this long fails /healthz */
    } worker;
    struct {
        char listen[256];
    } http;
    struct {
        int grace_ms;
    } drain;
    struct {
        char level[16];                  /* debug, info, warn or error */
        svc_log_level threshold;         /* parsed from level */
    } log;
    /* `mllama gateway` (service/gateway/gateway.h): the OpenAI-compatible
     * HTTP front over the Kafka contract. */
    struct {
        char listen[256];                /* the public HTTP listener, "host:port" */
        char instance[64];               /* names its reply topics; "" = the hostname */
        char api_keys_file[SVC_CONFIG_STR]; /* "" = no authentication (one tenant only) */
        char model[256];                 /* the base model's public name; "" = basename of
                                            model.dir */
        int retain_s;                    /* an ended stream stays resumable this long */
        int abandon_ms;                  /* a stream without a reader this long is cancelled */
        int request_timeout_s;           /* the deadline given to a request without one */
        int max_connections, max_streams, tenant_max_streams;
        int tenant_requests_per_s, tenant_burst;
        int header_timeout_ms;           /* a request must arrive whole within this */
        int keepalive_s;                 /* SSE comment interval on an idle stream */
        long max_retained_bytes;         /* every stream's event log together */
        long write_buffer_bytes;         /* a connection's unsent bytes before writes pause */
        int create_reply_topics;         /* create missing reply topics at start */
        int reply_partitions;            /* their partitions when created */
        int adapters_refresh_s;          /* how often /v1/models's Redis adapters are listed */
        /* http(s) image URLs, fetched by the gateway (gateway/gw_fetch.h) */
        int image_fetch;                 /* fetch them at all */
        int image_fetch_http;            /* http:// too, not only https:// */
        int image_fetch_private;         /* any address, not only public ones */
        char image_fetch_hosts[SVC_CONFIG_STR];   /* "" = any host */
        char image_fetch_ca_file[SVC_CONFIG_STR]; /* "" = the system's trust store */
        int image_fetch_timeout_ms;      /* one image, its redirects included */
        int image_fetch_redirects;       /* redirects followed */
        int image_fetch_max_pending;     /* requests waiting on their images, all tenants */
        long image_fetch_max_bytes;      /* their images' bytes held, all together */
    } gateway;
    /* The tenants, at least one after load: the file's "tenants" array, or
     * the implicit tenant "default" on kafka.request_topic,
     * kafka.cancel_topic and kafka.reply_topics. Owned (heap), so a copy of
     * the struct (svc_worker_create's) keeps every pointer into them valid;
     * svc_config_deinit frees them, once, from whichever copy owns them. */
    svc_tenant *tenants;
    size_t n_tenants;
    const char **reserved_topics;        /* owned array; names borrowed from the tenants/kafka */
    size_t n_reserved_topics;
} svc_config;

/* Load path (NULL: config/local.json's defaults compiled in), apply the
 * environment and the `section.key=value` overrides. Returns 0, or -1 with
 * the reason in err. */
int svc_config_load(svc_config *cfg, const char *path, const char *const *overrides,
                    size_t n_overrides, char *err, size_t errlen);

/* Free the pass-through property strings and the tenants. NULL fields are
 * skipped, so a moved-from config (its fields set to NULL/0) is a no-op. */
void svc_config_deinit(svc_config *cfg);

/* The tenant whose request topic or cancel topic is `topic`, or NULL.
 * Borrowed from cfg. @locality any thread (cfg is read-only after load). */
const svc_tenant *svc_config_tenant_by_topic(const svc_config *cfg, const char *topic);

/* A cache group's salt, sha256("mllama.cache\0" || cache_group): the
 * svc_tenant.cache_salt of the group's tenants, and what a frontend or
 * `mllama submit` needs to compute its tenant's image keys in Redis
 * (ml_image_state_key). @locality any thread. */
void svc_cache_salt(const char *cache_group, uint8_t out[SVC_CACHE_SALT_BYTES]);

#endif
