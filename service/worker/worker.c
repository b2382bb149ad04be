/* The worker: wiring, the Kafka loop and the drain sequence (worker.h,
 * worker_internal.h). The Redis index thread is in worker_index.c. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "kafka/mock_kafka.h"
#include "worker/worker_internal.h"

#define MIB (1u << 20)
/* Backpressure: pause fetching when this many requests per running slot are
 * consumed and unfinished, resume below the low mark. Twice the batch keeps
 * the scheduler fed without pulling a partition's backlog into memory. */
#define INFLIGHT_HIGH_PER_SLOT 2
#define INFLIGHT_LOW_PER_SLOT 1
#define WATCHDOG_MS 30000         /* a thread silent this long fails /healthz */
#define FLUSH_MS 10000            /* final flush of the producer at exit */
/* What destroy still flushes: only the fatal path leaves records queued,
 * and they are dropped (purged), since one before them may be lost. */
#define FATAL_FLUSH_MS 1
#define REPLIES_TOPIC "mllama.replies" /* created on the mock cluster for clients */
#define MOCK_BROKERS 1
#define CANCEL_POLL_MS 0

/* ---- process-level errors ---------------------------------------------------- */

void worker_fail(svc_worker *w, svc_worker_exit code, const char *fmt, ...)
{
    if (atomic_exchange(&w->fatal, true))
        return;
    w->fatal_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fatal_msg, sizeof w->fatal_msg, fmt, ap);
    va_end(ap);
    svc_log(SVC_LOG_ERROR, "worker_fatal", "%s", w->fatal_msg);
}

/* ---- rebalances (Kafka thread) ------------------------------------------------ */

/* The tenant index of request topic `topic`, or -1. */
static int tenant_index(const svc_worker *w, const char *topic)
{
    const svc_tenant *t = svc_config_tenant_by_topic(&w->cfg, topic);
    return t && !strcmp(t->request_topic, topic) ? (int)(t - w->cfg.tenants) : -1;
}

static void describe_partitions(svc_worker *w, const rd_kafka_topic_partition_list_t *add,
                                const rd_kafka_topic_partition_list_t *remove)
{
    /* Keep "topic:p,p,p" of the assignment, one per tenant joined by ';',
     * for the Redis heartbeat, so producers route images to the worker
     * that holds them. */
    pthread_mutex_lock(&w->partitions_lock);
    for (int pass = 0; pass < 2; pass++) {
        const rd_kafka_topic_partition_list_t *l = pass ? remove : add;
        for (int i = 0; l && i < l->cnt; i++) {
            int t = tenant_index(w, l->elems[i].topic);
            if (t >= 0 && l->elems[i].partition >= 0 &&
                l->elems[i].partition < SVC_MOCK_KAFKA_MAX_PARTITIONS)
                w->held[t][l->elems[i].partition] = !pass;
        }
    }
    size_t len = 0;
    int count = 0;
    w->partitions[0] = 0;
    for (size_t t = 0; t < w->cfg.n_tenants && len < sizeof w->partitions; t++) {
        len += (size_t)snprintf(w->partitions + len, sizeof w->partitions - len, "%s%s:",
                                t ? ";" : "", w->cfg.tenants[t].request_topic);
        for (int p = 0, n = 0; p < SVC_MOCK_KAFKA_MAX_PARTITIONS && len < sizeof w->partitions;
             p++)
            if (w->held[t][p]) {
                len += (size_t)snprintf(w->partitions + len, sizeof w->partitions - len, "%s%d",
                                        n++ ? "," : "", p);
                count++;
            }
    }
    pthread_mutex_unlock(&w->partitions_lock);
    svc_metrics_set(SVC_GAUGE_KAFKA_ASSIGNED_PARTITIONS, count);
}

static void on_assign(void *opaque, const rd_kafka_topic_partition_list_t *parts)
{
    svc_worker *w = opaque;
    svc_metrics_rebalance(SVC_REBALANCE_ASSIGN);
    describe_partitions(w, parts, NULL);
    atomic_store(&w->health.consumer_joined, 1);
    svc_log(SVC_LOG_INFO, "partitions_assigned", "%d partitions", parts->cnt);
}

/* Stop the requests of partitions taken away: their next owner runs them
 * again, so they must not send more records here. */
static void on_revoke(void *opaque, const rd_kafka_topic_partition_list_t *parts,
                      const svc_offset_ticket *pending, size_t n_pending, bool lost)
{
    svc_worker *w = opaque;
    svc_metrics_rebalance(lost ? SVC_REBALANCE_LOST : SVC_REBALANCE_REVOKE);
    describe_partitions(w, NULL, parts);
    /* By the job's flag, not its id: another execution of the same id on a
     * partition this worker keeps must go on. The step thread cancels the
     * running ones; the others end at their next stage. */
    pthread_mutex_lock(&w->registry_lock);
    for (job *j = registry_first(w); j; j = registry_next(j))
        for (size_t i = 0; i < n_pending; i++)
            if (pending[i].partition == j->ticket.partition &&
                pending[i].offset == j->ticket.offset && pending[i].epoch == j->ticket.epoch)
                atomic_store(&j->abandoned, true);
    pthread_mutex_unlock(&w->registry_lock);
    atomic_store(&w->cancel_scan, true);
    /* Their lag is the new owner's to report. */
    for (int i = 0; i < parts->cnt; i++)
        svc_metrics_set_lag(parts->elems[i].topic, parts->elems[i].partition, -1);
    svc_log(SVC_LOG_INFO, lost ? "partitions_lost" : "partitions_revoked",
            "%d partitions, %zu requests stopped", parts->cnt, n_pending);
}

/* Consumer lag per assigned partition from librdkafka's statistics
 * (topics.<t>.partitions.<p>.consumer_lag; -1 = unknown, and partition -1
 * is librdkafka's internal UA partition). The statistics keep listing a
 * revoked partition (fetch_state "stopped", its last lag): only the
 * partitions of this worker's assignment have a series. */
static void on_stats(void *opaque, const char *json, size_t len)
{
    svc_worker *w = opaque;
    cJSON *root = cJSON_ParseWithLength(json, len);
    const cJSON *topic;
    cJSON_ArrayForEach(topic, cJSON_GetObjectItemCaseSensitive(root, "topics"))
    {
        const cJSON *part;
        cJSON_ArrayForEach(part, cJSON_GetObjectItemCaseSensitive(topic, "partitions"))
        {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(part, "partition");
            const cJSON *lag = cJSON_GetObjectItemCaseSensitive(part, "consumer_lag");
            const cJSON *state = cJSON_GetObjectItemCaseSensitive(part, "fetch_state");
            if (!cJSON_IsNumber(id) || id->valueint < 0 || !cJSON_IsNumber(lag))
                continue;
            int t = tenant_index(w, topic->string);
            pthread_mutex_lock(&w->partitions_lock);
            int assigned = cJSON_IsString(state) && strcmp(state->valuestring, "none") && t >= 0 &&
                           id->valueint < SVC_MOCK_KAFKA_MAX_PARTITIONS &&
                           w->held[t][id->valueint];
            pthread_mutex_unlock(&w->partitions_lock);
            svc_metrics_set_lag(topic->string, id->valueint,
                                assigned ? (int64_t)lag->valuedouble : -1);
        }
    }
    cJSON_Delete(root);
}

/* ---- the cancel topic (Kafka thread) -------------------------------------------- */

/* The only source of client cancels: records of the cancel topic, keyed by
 * request id, into the pending-cancel table (worker_cancel.c). */
static void poll_cancels(svc_worker *w)
{
    svc_kafka_msg m;
    while (svc_consumer_poll(w->cancels, CANCEL_POLL_MS, &m) == SVC_KAFKA_OK) {
        worker_cancel_record(w, &m);
        char err[128];
        svc_consumer_finish(w->cancels, &m.ticket, err, sizeof err);
        svc_kafka_msg_release(&m);
    }
}

/* ---- create ----------------------------------------------------------------------- */

_Static_assert(SVC_METRICS_TENANTS_MAX >= SVC_TENANTS_MAX, "a metrics series for every tenant");

/* Fair share across the tenants (fair.h): the step thread's queue, the
 * in-flight counts and the Kafka thread's fetch plan, the metrics' tenant
 * names. Returns 0, or -1 out of memory. */
static int worker_fair_init(svc_worker *w)
{
    size_t n = w->cfg.n_tenants;
    int weights[SVC_TENANTS_MAX];
    const char *names[SVC_TENANTS_MAX];
    w->tenant_inflight = calloc(n, sizeof *w->tenant_inflight);
    w->fetch = calloc(n, sizeof *w->fetch);
    if (!w->tenant_inflight || !w->fetch)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const svc_tenant *t = &w->cfg.tenants[i];
        weights[i] = t->weight;
        names[i] = t->name;
        w->fetch[i] = (svc_fair_fetch){.weight = t->weight, .max_in_flight = t->max_in_flight};
    }
    svc_metrics_set_tenants(names, n);
    return (w->fair = svc_fair_create(weights, n)) ? 0 : -1;
}

static void model_fingerprint(svc_worker *w)
{
    /* config.json and the checkpoint's file sizes: cheap, and changes when
     * the model does. It scopes the Redis keys, so two model versions never
     * share resident-image entries. */
    char path[SVC_CONFIG_STR + 64];
    ml_sha256_ctx ctx;
    ml_sha256_init(&ctx);
    static const char *const files[] = {"config.json", "model.safetensors.index.json",
                                        "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", w->cfg.model.dir, files[i]);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        ml_sha256_update(&ctx, files[i], strlen(files[i]));
        ml_sha256_update(&ctx, &st.st_size, sizeof st.st_size);
        if (i == 0) {
            FILE *f = fopen(path, "rb");
            char buf[4096];
            size_t n;
            while (f && (n = fread(buf, 1, sizeof buf, f)) > 0)
                ml_sha256_update(&ctx, buf, n);
            if (f)
                fclose(f);
        }
    }
    uint8_t *d = w->fingerprint_digest;
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256_final(&ctx, d);
    ml_sha256_hex(d, hex);
    snprintf(w->fingerprint, sizeof w->fingerprint, "%.16s", hex);
    const char *slash = strrchr(w->cfg.model.dir, '/');
    snprintf(w->model_name, sizeof w->model_name, "%s", slash && slash[1] ? slash + 1
                                                                           : w->cfg.model.dir);
}

/* The runtime's adapter resolver (step thread): adapters live under
 * model.adapters_dir/<name>/, put there by an operator or, for adapters held
 * in Redis, by the prep thread before the request reaches the runtime. */
static int resolve_adapter(void *ctx, const char *name, char *dir, size_t n)
{
    const svc_worker *w = ctx;
    char probe[SVC_CONFIG_STR * 2];
    snprintf(dir, n, "%s/%s", w->cfg.model.adapters_dir, name);
    snprintf(probe, sizeof probe, "%s/adapter_config.json", dir);
    return access(probe, R_OK) == 0;
}

static int load_engine(svc_worker *w, char *err, size_t errlen)
{
    const svc_config *c = &w->cfg;
    char path[SVC_CONFIG_STR + 64];
    snprintf(path, sizeof path, "%s/config.json", c->model.dir);
    struct stat st;
    if (stat(path, &st) != 0 && c->model.preset_if_missing[0]) {
        svc_log(SVC_LOG_INFO, "model_generate", "no model at %s: writing the %s preset",
                c->model.dir, c->model.preset_if_missing);
        if (ml_mkmodel(c->model.preset_if_missing, c->model.dir, ML_DEFAULT_TOKENIZER_DIR, 0, 0, err,
                       errlen) != ML_OK)
            return -1;
    }
    ml_engine_config ec = {
        .model_dir = c->model.dir,
        .backend = c->model.backend,
        .world = c->model.tensor_parallel,
        .devices = c->model.devices,
        .threads = c->model.threads,
        .batch_invariant = c->runtime.batch_invariant,
        .limits = ml_model_limits_default(),
        .fallback_tokenizer = ML_DEFAULT_TOKENIZER,
        .max_image_pixels = (uint64_t)c->limits.max_image_pixels,
        .runtime = {
            .kv_bytes = (size_t)c->runtime.kv_mib * MIB,
            .image_bytes = (size_t)c->runtime.image_mib * MIB,
            .max_running = c->runtime.max_running,
            .max_step_tokens = c->runtime.max_step_tokens,
            .on_image_event = worker_on_image_event,
            .image_event_ctx = w,
            .max_adapters = c->runtime.max_adapters,
            .max_adapter_rank = c->runtime.max_adapter_rank,
            .resolve_adapter = resolve_adapter,
            .resolve_adapter_ctx = w,
            .prefix_cache = c->runtime.prefix_cache,
        },
    };
    /* The model's files as they are now, generated preset included: the
     * prefix cache's keys are rooted in them. */
    model_fingerprint(w);
    memcpy(ec.runtime.model_fingerprint, w->fingerprint_digest,
           sizeof ec.runtime.model_fingerprint);
    ec.limits.max_step_tokens = c->runtime.max_step_tokens;
    ec.limits.max_step_seqs = c->runtime.max_running;
    ec.limits.max_logit_rows = c->runtime.max_running;
    ec.limits.max_seq_images = c->runtime.max_images_per_request;
    ec.limits.row_mask = c->model.row_mask;
    ec.limits.quantize_fp8 = c->model.quantize_fp8;
    ec.limits.fp8_activations = c->model.quant_activations;
    ec.limits.fp8_lm_head = c->model.fp8_lm_head;
    ec.cpu_bf16_activations = c->model.cpu_bf16_activations;
    ec.cpu_bf16_kv_cache = c->model.cpu_bf16_kv_cache;
    if (ml_engine_open(&w->engine, &ec, err, errlen) != ML_OK)
        return -1;
    if (c->model.quant_activations)
        svc_log(SVC_LOG_INFO, "fp8_activations",
                "W8A8: the FP8 Linears quantize their activations per token (vLLM's "
                "numerics, not transformers' decompressed reference)");
    if (c->model.fp8_lm_head)
        svc_log(SVC_LOG_INFO, "fp8_lm_head",
                "lm_head is FP8 per output channel (the published FP8 checkpoints keep it "
                "bf16)");
    if (c->model.cpu_bf16_activations && !strcmp(ml_engine_backend_name(w->engine), "cpu"))
        svc_log(SVC_LOG_INFO, "cpu_activations",
                "bf16: the CPU's Linears, bf16 and FP8, round their inputs to bf16 (AVX-512 "
                "BF16), not "
                "the f32 reference numerics");
    if (c->model.cpu_bf16_kv_cache && !strcmp(ml_engine_backend_name(w->engine), "cpu"))
        svc_log(SVC_LOG_INFO, "cpu_kv_cache",
                "bf16: the CPU's K/V caches and image cross-attention states are stored in "
                "bf16 (half the memory per token and per image), not the f32 reference "
                "numerics");
    w->model = ml_engine_model(w->engine);
    /* The parser refuses logit_bias ids without a logit before any work. */
    w->limits.logit_vocab = (size_t)ml_model_config(w->model)->text.vocab_size;
    w->tok = ml_engine_tokenizer(w->engine);
    w->rt = ml_engine_runtime(w->engine);
    bool cpu = !strcmp(ml_engine_backend_name(w->engine), "cpu");
    w->reproducible = cpu || c->runtime.batch_invariant;
    if (c->runtime.batch_invariant && cpu)
        svc_log(SVC_LOG_INFO, "batch_invariant",
                "runtime.batch_invariant selects CUDA kernels; the CPU backend is batch "
                "invariant always");
    if (ml_engine_world(w->engine) > 1)
        svc_log(SVC_LOG_INFO, "tensor_parallel",
                "model split over %d %s devices; runtime.kv_mib and runtime.image_mib are per "
                "device",
                ml_engine_world(w->engine), ml_engine_backend_name(w->engine));
    const ml_memory_plan_spec *spec;
    const ml_memory_plan *plan = ml_engine_memory_plan(w->engine, &spec);
    char line[1024];
    /* A device's plan that does not fit is a warning: its allocations fail with their
     * own errors (the CPU's fails ml_engine_open). */
    svc_log(plan->fits ? SVC_LOG_INFO : SVC_LOG_WARN, "memory_plan", "%s",
            ml_memory_plan_format(plan, spec, line, sizeof line));
    for (int d = 0; d < ML_PLAN_DTYPES; d++)
        svc_metrics_set_weight_bytes(d, (double)plan->weight_bytes[d]);
    if (c->runtime.max_adapters > 0)
        svc_log(SVC_LOG_INFO, "adapter_slots", "%d slots of rank %d, %.1f MiB each, from %s",
                c->runtime.max_adapters, c->runtime.max_adapter_rank,
                (double)ml_lora_slot_bytes(w->model, c->runtime.max_adapter_rank) / MIB,
                c->model.adapters_dir);
    ml_runtime_stats rs;
    ml_runtime_get_stats(w->rt, &rs);
    svc_metrics_set(SVC_GAUGE_KV_BLOCKS_CAPACITY, rs.kv_blocks_total);
    svc_metrics_set(SVC_GAUGE_IMAGE_CACHE_BUDGET_BYTES, (double)rs.image_bytes_budget);
    return 0;
}

/* The embedded mock cluster's topics: every tenant's request, cancel and
 * first reply topic, and the DLT ("name:partitions,..."). Returns 0, or -1
 * when they do not fit. */
static int mock_topics(const svc_config *c, char *out, size_t n)
{
    size_t len = (size_t)snprintf(out, n, "%s:1", c->kafka.dlt_topic);
    for (size_t i = 0; i < c->n_tenants && len < n; i++) {
        const svc_tenant *t = &c->tenants[i];
        char reply[SVC_CONFIG_TOPIC] = REPLIES_TOPIC;
        size_t first = strcspn(t->reply_topics, ",*");
        if (c->tenants[i].reply_topics[first] != '*' && first < sizeof reply)
            snprintf(reply, sizeof reply, "%.*s", (int)first, t->reply_topics);
        len += (size_t)snprintf(out + len, n - len, ",%s:%d,%s:1,%s:%d", t->request_topic,
                                c->kafka.mock_partitions, t->cancel_topic, reply,
                                c->kafka.mock_partitions);
    }
    return len < n ? 0 : -1;
}

static int connect_kafka(svc_worker *w, char *err, size_t errlen)
{
    const svc_config *c = &w->cfg;
    snprintf(w->brokers, sizeof w->brokers, "%s", c->kafka.brokers);
    if (!strcmp(c->kafka.brokers, "mock")) {
        char topics[SVC_TENANTS_MAX * 3 * (SVC_CONFIG_TOPIC + 8) + SVC_CONFIG_TOPIC];
        svc_mock_kafka *m;
        if (mock_topics(c, topics, sizeof topics) ||
            svc_mock_kafka_create(MOCK_BROKERS, topics, &m, err, errlen) != SVC_KAFKA_OK)
            return -1;
        w->mock = m;
        snprintf(w->brokers, sizeof w->brokers, "%s", svc_mock_kafka_bootstraps(m));
        svc_log(SVC_LOG_INFO, "mock_kafka", "in-process mock cluster at %s", w->brokers);
    }
    svc_producer_config pc = {.brokers = w->brokers, .kafka = c->kafka.props,
                              .n_kafka = c->kafka.n_props, .on_delivery = worker_on_delivery,
                              .opaque = w, .close_flush_ms = FATAL_FLUSH_MS};
    if (svc_producer_create(&pc, &w->producer, err, errlen) != SVC_KAFKA_OK)
        return -1;
    /* Every tenant's request topic in one group; the topic a record comes
     * from is its tenant. */
    const char *req_topics[SVC_TENANTS_MAX], *cancel_topics[SVC_TENANTS_MAX];
    for (size_t i = 0; i < c->n_tenants; i++) {
        req_topics[i] = c->tenants[i].request_topic;
        cancel_topics[i] = c->tenants[i].cancel_topic;
    }
    svc_consumer_config cc = {.brokers = w->brokers, .group_id = c->kafka.group,
                              .topics = req_topics, .n_topics = c->n_tenants,
                              .kafka = c->kafka.props, .n_kafka = c->kafka.n_props,
                              .events = {.on_assign = on_assign, .on_revoke = on_revoke,
                                         .on_stats = on_stats, .opaque = w}};
    if (svc_consumer_create(&cc, &w->consumer, err, errlen) != SVC_KAFKA_OK)
        return -1;
    /* Every worker must see every cancel: a group of its own, from now on. */
    char group[sizeof c->kafka.group + sizeof c->worker_id + 16];
    snprintf(group, sizeof group, "%s.cancel.%s", c->kafka.group, c->worker_id);
    svc_kafka_kv latest[] = {{"auto.offset.reset", "latest"}};
    svc_consumer_config kc = {.brokers = w->brokers, .group_id = group, .topics = cancel_topics,
                              .n_topics = c->n_tenants, .kafka = latest, .n_kafka = 1};
    if (svc_consumer_create(&kc, &w->cancels, err, errlen) != SVC_KAFKA_OK)
        return -1;
    return 0;
}

static int connect_redis(svc_worker *w, char *err, size_t errlen)
{
    const svc_config *c = &w->cfg;
    if (!c->redis.url[0])
        return 0;
    svc_redis_config rc;
    svc_redis_config_default(&rc);
    rc.url = c->redis.url;
    /* Keys are not scoped by the model fingerprint: blobs and attempt
     * counters are model-independent, and image entries are routing hints
     * that name a worker (RUNBOOK "Upgrade the model"). */
    rc.prefix = c->redis.prefix;
    rc.worker_id = c->worker_id;
    rc.connect_timeout_ms = rc.command_timeout_ms = c->redis.timeout_ms;
    rc.call_timeout_ms = c->redis.call_timeout_ms;
    rc.worker_ttl_s = c->redis.ttl_s;
    rc.attempts_ttl_s = c->redis.attempts_ttl_s;
    rc.offset_attempts_ttl_s = c->redis.offset_attempts_ttl_s;
    if (svc_redis_create(&rc, &w->redis_index, err, errlen) != SVC_REDIS_OK)
        return -1;
    for (int i = 0; i < w->n_prep; i++)
        if (svc_redis_create(&rc, &w->prep[i].redis, err, errlen) != SVC_REDIS_OK)
            return -1;
    return 0;
}

svc_worker *svc_worker_create(svc_config *cfg, int *code, char *err, size_t errlen)
{
    svc_worker *w = calloc(1, sizeof *w);
    if (!w) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_errf(err, errlen, "out of memory");
        return NULL;
    }
    w->cfg = *cfg;
    /* Moved: the properties and the tenants are w's now. */
    cfg->kafka.n_props = 0;
    cfg->tenants = NULL;
    cfg->reserved_topics = NULL;
    cfg->n_tenants = cfg->n_reserved_topics = 0;
    pthread_mutex_init(&w->partitions_lock, NULL);
    pthread_mutex_init(&w->event_lock, NULL);
    pthread_cond_init(&w->event_cond, NULL);
    pthread_mutex_init(&w->registry_lock, NULL);
    pthread_mutex_init(&w->resident_lock, NULL);
    pthread_mutex_init(&w->failure_lock, NULL);
    job_queue_init(&w->prep_q);
    job_queue_init(&w->step_q);
    if (worker_cancels_init(&w->pending_cancels) || worker_fair_init(w)) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_errf(err, errlen, "out of memory");
        svc_worker_destroy(w);
        return NULL;
    }
    svc_limits_default(&w->limits);
    w->limits.max_request_bytes = (size_t)w->cfg.limits.max_request_bytes;
    w->limits.max_image_bytes = (size_t)w->cfg.limits.max_image_bytes;
    w->limits.max_images = (size_t)w->cfg.runtime.max_images_per_request;
    w->limits.max_tokens_default = (uint32_t)w->cfg.runtime.default_max_tokens;
    w->limits.max_reply_bytes = (size_t)w->cfg.limits.max_reply_bytes;
    w->limits.max_n = (uint32_t)w->cfg.limits.max_n;
    w->limits.max_tokens_limit = (uint32_t)w->cfg.limits.max_tokens;
    w->limits.max_schema_bytes = (size_t)w->cfg.limits.max_schema_bytes;
    svc_schema_cache_config sc = {.max_entries = (size_t)w->cfg.limits.schema_cache_entries,
                                  .max_bytes = (size_t)w->cfg.limits.schema_cache_bytes};
    ml_schema_limits_default(&sc.limits);
    sc.limits.max_schema_bytes = w->limits.max_schema_bytes;
    sc.limits.max_states = (uint32_t)w->cfg.limits.max_schema_states;
    sc.limits.max_compile_ms = w->cfg.limits.max_schema_compile_ms;
    if (!(w->schemas = svc_schema_cache_create(&sc))) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_errf(err, errlen, "out of memory");
        svc_worker_destroy(w);
        return NULL;
    }
    /* Start time in ms: numbers of uncounted attempts differ across processes. */
    atomic_store(&w->next_uncounted, (uint32_t)svc_wall_ms());
    w->prep = calloc((size_t)w->cfg.worker.prep_threads, sizeof *w->prep);
    if (!w->prep) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_errf(err, errlen, "out of memory");
        svc_worker_destroy(w);
        return NULL;
    }
    w->n_prep = w->cfg.worker.prep_threads;
    for (int i = 0; i < w->n_prep; i++)
        w->prep[i].w = w;
    w->health.watchdog_ms = WATCHDOG_MS;
    _Static_assert(SVC_PREP_THREADS_MAX <= SVC_HEALTH_WATCH_MAX, "every prep thread is watched");
    w->health.n_watch = w->n_prep;
    w->health.stall_ms = w->cfg.worker.stall_ms;
    atomic_store(&w->health.kafka_heartbeat_ms, svc_now_ms());
    atomic_store(&w->health.step_heartbeat_ms, svc_now_ms());

    /* HTTP first, so probes see the load. */
    if (!(w->http = svc_http_start(w->cfg.http.listen, &w->health, err, errlen))) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_worker_destroy(w);
        return NULL;
    }
    if (load_engine(w, err, errlen)) {
        *code = SVC_WORKER_EXIT_MODEL;
        svc_worker_destroy(w);
        return NULL;
    }
    /* Adapters from Redis are checked against the loaded model. */
    svc_adapter_store_config ac = {.dir = w->cfg.model.adapters_dir,
                                   .max_bytes = (size_t)w->cfg.limits.max_adapter_bytes,
                                   .dir_max_bytes = (size_t)w->cfg.limits.adapters_dir_bytes,
                                   .model = ml_model_config(w->model),
                                   .max_rank = w->cfg.runtime.max_adapter_rank};
    svc_adapter_store_init(&w->adapters, &ac);
    svc_metrics_set_info(MLLAMA_VERSION, ml_engine_backend_name(w->engine), w->model_name,
                         w->fingerprint, ml_row_mask_mode_name(w->cfg.model.row_mask));
    if (connect_redis(w, err, errlen) || connect_kafka(w, err, errlen)) {
        *code = SVC_WORKER_EXIT_KAFKA;
        svc_worker_destroy(w);
        return NULL;
    }
    bool started = !pthread_create(&w->step_thread, NULL, worker_step_main, w);
    for (int i = 0; started && i < w->n_prep; i++)
        started = w->prep[i].started =
            !pthread_create(&w->prep[i].thread, NULL, worker_prep_main, &w->prep[i]);
    if (!started || (w->redis_index && pthread_create(&w->index_thread, NULL, worker_index_main, w))) {
        *code = SVC_WORKER_EXIT_CONFIG;
        svc_errf(err, errlen, "cannot start the worker threads");
        svc_worker_destroy(w);
        return NULL;
    }
    atomic_store(&w->health.model_loaded, 1);
    svc_log(SVC_LOG_INFO, "worker_started",
            "worker %s, model %s (%s, cross_attention_row_mask %s) on %s x%d, brokers %s, "
            "group %s, http :%d",
            w->cfg.worker_id, w->model_name, w->fingerprint,
            ml_row_mask_mode_name(w->cfg.model.row_mask), ml_engine_backend_name(w->engine),
            ml_engine_world(w->engine), w->brokers, w->cfg.kafka.group, svc_http_port(w->http));
    return w;
}

/* ---- the Kafka loop ---------------------------------------------------------------- */

void svc_worker_request_stop(svc_worker *w) { atomic_store(&w->stop, true); }

/* Hand a consumed message to the prep pool. */
static void accept_message(svc_worker *w, svc_kafka_msg *m)
{
    job *j = calloc(1, sizeof *j);
    if (!j) {
        /* Not finished: the offset stays and the message comes back. */
        svc_log(SVC_LOG_ERROR, "out_of_memory", "dropping %s[%" PRId32 "]@%" PRId64, m->topic,
                m->partition, m->offset);
        svc_kafka_msg_release(m);
        return;
    }
    j->w = w;
    /* The topic is the identity: the consumer hands out only subscribed
     * topics, each a tenant's request topic. */
    j->tenant = svc_config_tenant_by_topic(&w->cfg, m->topic);
    assert(j->tenant);
    j->msg = *m;
    j->ticket = m->ticket;
    snprintf(j->topic, sizeof j->topic, "%s", m->topic);
    j->partition = m->partition;
    j->offset = m->offset;
    j->broker_ms = m->broker_time ? m->timestamp_ms : -1;
    j->arrival = ++w->arrivals;
    j->t_consumed = svc_now_s();
    j->attempt = 1;
    j->stream = true;
    atomic_init(&j->refs, 1);
    for (int k = 0; k < JOB_RECORD_KINDS; k++)
        j->records[k] = (job_record){.j = j, .kind = (job_record_kind)k};
    ml_token_buf_init(&j->prompt);
    j->first = (job_choice){.j = j};
    svc_buf_init(&j->first.text);
    j->choices = &j->first;
    j->n_choices = 1;
    atomic_fetch_add(&w->inflight, 1);
    atomic_fetch_add(&w->tenant_inflight[job_tenant(j)], 1);
    worker_register(w, j);
    job_queue_push(&w->prep_q, j);
}

/* Fetch by tenant (fair.h, service/README.md §1): a tenant at its
 * max_in_flight pauses alone; at the worker's high mark only the tenants
 * holding their share of it pause, so a quiet tenant's request is still
 * fetched while another floods. Draining pauses all. */
static void backpressure(svc_worker *w, bool draining)
{
    int high = INFLIGHT_HIGH_PER_SLOT * w->cfg.runtime.max_running;
    int low = INFLIGHT_LOW_PER_SLOT * w->cfg.runtime.max_running;
    size_t n = w->cfg.n_tenants;
    bool was[SVC_TENANTS_MAX];
    for (size_t i = 0; i < n; i++) {
        was[i] = w->fetch[i].paused;
        w->fetch[i].in_flight = atomic_load(&w->tenant_inflight[i]);
    }
    svc_fair_fetch_plan(w->fetch, n, high, low, draining);
    for (size_t i = 0; i < n; i++) {
        svc_metrics_tenant_in_flight(i, w->fetch[i].in_flight);
        svc_metrics_tenant_prefetched(
            i, svc_consumer_prefetched(w->consumer, w->cfg.tenants[i].request_topic));
        if (w->fetch[i].paused == was[i])
            continue;
        /* On failure the intent stays with the consumer, which applies it
         * at the next assignment. */
        svc_consumer_pause_topic(w->consumer, w->cfg.tenants[i].request_topic,
                                 w->fetch[i].paused);
        svc_metrics_tenant_paused(i, w->fetch[i].paused);
    }
    svc_metrics_set(SVC_GAUGE_KAFKA_PAUSED_PARTITIONS,
                    svc_consumer_paused_partitions(w->consumer));
}

int svc_worker_run(svc_worker *w)
{
    long long drain_deadline = 0;
    char err[512];
    for (;;) {
        atomic_store(&w->health.kafka_heartbeat_ms, svc_now_ms());
        if (atomic_load(&w->fatal))
            break;
        bool draining = atomic_load(&w->stop);
        if (draining && !drain_deadline) {
            /* Readiness off, stop fetching, let in-flight requests finish. */
            atomic_store(&w->health.draining, 1);
            drain_deadline = svc_now_ms() + w->cfg.drain.grace_ms;
            svc_log(SVC_LOG_INFO, "drain_started", "%d requests in flight, grace %d ms",
                    atomic_load(&w->inflight), w->cfg.drain.grace_ms);
        }
        if (draining && svc_now_ms() >= drain_deadline && !atomic_load(&w->cancel_all)) {
            svc_log(SVC_LOG_WARN, "drain_grace_expired", "cancelling %d requests",
                    atomic_load(&w->inflight));
            atomic_store(&w->cancel_all, true);
        }
        if (draining && atomic_load(&w->inflight) == 0)
            break;
        backpressure(w, draining);
        svc_kafka_msg m;
        svc_kafka_status st = svc_consumer_poll(w->consumer, SVC_KAFKA_POLL_MS, &m);
        if (st == SVC_KAFKA_OK)
            accept_message(w, &m);
        else if (st != SVC_KAFKA_NO_MESSAGE)
            worker_fail(w, SVC_WORKER_EXIT_KAFKA, "consumer: %s", svc_kafka_status_name(st));
        poll_cancels(w);
        svc_producer_poll(w->producer, 0);
        if (svc_producer_fatal(w->producer, err, sizeof err) ||
            svc_consumer_fatal(w->consumer, err, sizeof err))
            worker_fail(w, SVC_WORKER_EXIT_KAFKA, "kafka: %s", err);
    }
    atomic_store(&w->health.draining, 1);
    int fatal = atomic_load(&w->fatal);
    if (!fatal) {
        /* Everything was delivered; commit and leave the group cleanly. */
        if (svc_producer_flush(w->producer, FLUSH_MS, err, sizeof err) != SVC_KAFKA_OK)
            svc_log(SVC_LOG_WARN, "flush", "%s", err);
        svc_consumer_close(w->consumer, err, sizeof err);
        svc_consumer_close(w->cancels, err, sizeof err);
        svc_log(SVC_LOG_INFO, "drain_done", "exiting");
        return SVC_WORKER_EXIT_OK;
    }
    svc_log(SVC_LOG_ERROR, "worker_exit", "%s", w->fatal_msg);
    return w->fatal_code;
}

/* ---- destroy ----------------------------------------------------------------------- */

void svc_worker_destroy(svc_worker *w)
{
    if (!w)
        return;
    atomic_store(&w->threads_stop, true);
    if (w->step_thread)
        pthread_join(w->step_thread, NULL);
    for (int i = 0; i < w->n_prep; i++)
        if (w->prep[i].started)
            pthread_join(w->prep[i].thread, NULL);
    if (w->index_thread)
        pthread_join(w->index_thread, NULL);
    /* Jobs still queued (a fatal stop): dropped unfinished, so Kafka
     * redelivers them to the next owner. */
    for (job *j; (j = job_queue_pop(&w->prep_q, 0));)
        job_free(j);
    for (job *j; (j = job_queue_pop(&w->step_q, 0));)
        job_free(j);
    for (job *j = w->parked, *next; j; j = next) {
        next = j->next;
        job_free(j);
    }
    for (svc_fair_item *it; w->fair && (it = svc_fair_pop(w->fair, NULL));)
        job_free(job_of_fair(it));
    ml_engine_close(w->engine); /* in-flight sequences end here; fatal path only */
    /* Producer before consumers: its delivery reports finish into them. */
    svc_producer_destroy(w->producer);
    svc_consumer_destroy(w->consumer);
    svc_consumer_destroy(w->cancels);
    svc_mock_kafka_destroy(w->mock);
    for (int i = 0; i < w->n_prep; i++)
        svc_redis_destroy(w->prep[i].redis);
    free(w->prep);
    svc_redis_destroy(w->redis_index);
    svc_http_stop(w->http);
    worker_cancels_deinit(&w->pending_cancels);
    while (w->events_head) {
        image_event *e = w->events_head;
        w->events_head = e->next;
        free(e);
    }
    while (w->clears_head) {
        attempt_clear *c = w->clears_head;
        w->clears_head = c->next;
        free(c);
    }
    job_queue_deinit(&w->prep_q);
    job_queue_deinit(&w->step_q);
    svc_fair_destroy(w->fair);
    free(w->fetch);
    free(w->tenant_inflight);
    free(w->resident);
    svc_adapter_store_deinit(&w->adapters);
    svc_schema_cache_destroy(w->schemas);
    svc_config_deinit(&w->cfg);
    free(w);
}
