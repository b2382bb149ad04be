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
#include "protocol/protocol.h"

#define SVC_CONFIG_STR 512
#define SVC_CONFIG_MAX_KAFKA_PROPS 64
#define SVC_PREP_THREADS_MAX 64

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
        char request_topic[256], cancel_topic[256], dlt_topic[256];
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
} svc_config;

/* Load path (NULL: config/local.json's defaults compiled in), apply the
 * environment and the `section.key=value` overrides. Returns 0, or -1 with
 * the reason in err. */
int svc_config_load(svc_config *cfg, const char *path, const char *const *overrides,
                    size_t n_overrides, char *err, size_t errlen);

/* Free the pass-through property strings. */
void svc_config_deinit(svc_config *cfg);

/* The reply-topic policy of cfg: kafka.reply_topics, with the request,
 * cancel and dead-letter topics reserved. reserved receives their names
 * (borrowed from cfg) and p points into it and cfg, so both must outlive p. */
#define SVC_REPLY_RESERVED 3
void svc_config_reply_policy(const svc_config *cfg, const char *reserved[SVC_REPLY_RESERVED],
                             svc_topic_policy *p);

#endif
