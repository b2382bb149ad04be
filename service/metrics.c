/* The metrics registry (metrics.h). Values are C11 atomics; doubles are
 * stored as their bit patterns so gauges and histogram sums stay lock-free. */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

#include "engine.h"

#define LAG_SERIES_MAX 256 /* assigned partitions whose lag is exported */
#define INFO_MAX 128

/* ---- names ---------------------------------------------------------------- */

static const char *const counter_names[SVC_COUNTER_COUNT][2] = {
    [SVC_COUNTER_PROMPT_TOKENS] = {"mllama_prompt_tokens_total", "prompt tokens of requests"},
    [SVC_COUNTER_PROMPT_TOKENS_CACHED] = {"mllama_prompt_tokens_cached_total",
                                          "prompt tokens whose K/V came from the prefix cache"},
    [SVC_COUNTER_PREFIX_BLOCK_HITS] = {"mllama_prefix_cache_block_hits_total",
                                       "full prompt K/V blocks found in the prefix cache"},
    [SVC_COUNTER_PREFIX_BLOCK_MISSES] = {"mllama_prefix_cache_block_misses_total",
                                         "full prompt K/V blocks not found: computed"},
    [SVC_COUNTER_KV_BLOCKS_EVICTED] = {"mllama_kv_blocks_evicted_total",
                                       "idle cached K/V blocks evicted for room"},
    [SVC_COUNTER_PREFILL_TOKENS] = {"mllama_prefill_tokens_total",
                                    "prompt tokens computed by prefill (recomputes included)"},
    [SVC_COUNTER_CHOICES_FORKED] = {"mllama_choices_forked_total",
                                    "choices forked off a prefilled prompt (n > 1)"},
    [SVC_COUNTER_TOKENS_GENERATED] = {"mllama_tokens_generated_total",
                                      "completion tokens sampled"},
    [SVC_COUNTER_IMAGE_CACHE_HITS] = {"mllama_image_cache_hits_total",
                                      "images served from resident cross-attention states"},
    [SVC_COUNTER_IMAGE_CACHE_MISSES] = {"mllama_image_cache_misses_total",
                                        "images that ran the vision tower"},
    [SVC_COUNTER_IMAGE_DECODES_SKIPPED] = {"mllama_image_decodes_skipped_total",
                                           "inline images not decoded: their state was resident"},
    [SVC_COUNTER_IMAGE_LATE_DECODES] = {"mllama_image_late_decodes_total",
                                        "skipped images decoded at admission after all"},
    [SVC_COUNTER_ADAPTER_LOADS] = {"mllama_adapter_loads_total",
                                   "LoRA adapters loaded into a slot"},
    [SVC_COUNTER_ADAPTER_FETCHES] = {"mllama_adapter_fetches_total",
                                     "adapters transferred from Redis"},
    [SVC_COUNTER_ADAPTER_STORE_ERRORS] = {"mllama_adapter_store_errors_total",
                                          "adapters from Redis model.adapters_dir could not take"},
    [SVC_COUNTER_PREEMPTIONS] = {"mllama_preemptions_total",
                                 "sequences preempted because KV blocks ran out"},
    [SVC_COUNTER_REDIS_ERRORS] = {"mllama_redis_errors_total", "failed Redis commands"},
    [SVC_COUNTER_HTTP_CONNECTIONS_DROPPED] = {"mllama_http_connections_dropped_total",
                                              "HTTP connections closed unanswered: past their "
                                              "deadline or evicted by a newer one"},
    [SVC_COUNTER_SCHEMA_COMPILES] = {"mllama_schema_compiles_total",
                                     "JSON schemas compiled (cache misses that compiled)"},
    [SVC_COUNTER_SCHEMA_CACHE_HITS] = {"mllama_schema_cache_hits_total",
                                       "json_schema requests served a cached grammar"},
};

static const char *const gauge_names[SVC_GAUGE_COUNT][2] = {
    [SVC_GAUGE_READY] = {"mllama_ready", "1 when /readyz answers 200"},
    [SVC_GAUGE_REQUESTS_WAITING] = {"mllama_requests_waiting",
                                    "requests accepted and waiting for admission"},
    [SVC_GAUGE_REQUESTS_RUNNING] = {"mllama_requests_running", "sequences in the running batch"},
    [SVC_GAUGE_KV_BLOCKS_USED] = {"mllama_kv_blocks_used",
                                  "self-attention KV blocks held by sequences"},
    [SVC_GAUGE_KV_BLOCKS_CACHED] = {"mllama_kv_blocks_cached",
                                    "KV blocks in the prefix cache, held or idle (idle ones "
                                    "are free to reuse)"},
    [SVC_GAUGE_KV_BLOCKS_CAPACITY] = {"mllama_kv_blocks_capacity",
                                      "self-attention KV blocks in the pool"},
    [SVC_GAUGE_IMAGE_CACHE_BYTES] = {"mllama_image_cache_bytes",
                                     "bytes of resident cross-attention states"},
    [SVC_GAUGE_IMAGE_CACHE_BUDGET_BYTES] = {"mllama_image_cache_budget_bytes",
                                            "byte budget of resident cross-attention states"},
    [SVC_GAUGE_KAFKA_ASSIGNED_PARTITIONS] = {"mllama_kafka_assigned_partitions",
                                             "request partitions assigned to this worker"},
    [SVC_GAUGE_KAFKA_PAUSED_PARTITIONS] = {"mllama_kafka_paused_partitions",
                                           "assigned partitions paused"},
    [SVC_GAUGE_REDIS_BREAKER_OPEN] = {"mllama_redis_breaker_open",
                                      "1 while the Redis circuit breaker is open"},
    [SVC_GAUGE_SCHEMA_CACHE_BYTES] = {"mllama_schema_cache_bytes",
                                      "bytes of the cached compiled grammars (tables and masks)"},
};


static const svc_hist_def hist_defs[SVC_HIST_COUNT] = {
    [SVC_HIST_TTFT] = {"mllama_time_to_first_token_seconds", "hand-off to first token record",
                       12, {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64}},
    [SVC_HIST_INTER_TOKEN] = {"mllama_inter_token_latency_seconds",
                              "between consecutive tokens of one sequence", 9,
                              {0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}},
    [SVC_HIST_REQUEST_DURATION] = {"mllama_request_duration_seconds",
                                   "hand-off to the final record", 11,
                                   {0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512}},
    [SVC_HIST_VISION_ENCODE] = {"mllama_vision_encode_seconds",
                                "one image through the vision tower and cross K/V", 10,
                                {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8}},
    [SVC_HIST_SCHEMA_COMPILE] = {"mllama_schema_compile_seconds",
                                 "one JSON schema compiled into a grammar (cache misses)", 10,
                                 {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 2}},
};

/* Per tenant: a request's wait from consumption to admission into the batch. */
static const svc_hist_def tenant_queue_def = {
    "mllama_tenant_queue_seconds",
    "consumed to admitted into the batch, by tenant", 12,
    {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};

static const svc_finish outcomes[] = {SVC_FINISH_STOP, SVC_FINISH_LENGTH, SVC_FINISH_CANCELLED,
                                      SVC_FINISH_ERROR, SVC_FINISH_TOOL_CALLS};
#define N_OUTCOMES (sizeof outcomes / sizeof outcomes[0])
/* Error codes with a label, in svc_error order from INVALID_JSON; those
 * from TOO_MANY_ATTEMPTS on are dead-letter only. */
#define N_CODES (SVC_ERROR_REPLY_UNDELIVERABLE + 1)
static const char *const rebalance_names[SVC_REBALANCE_COUNT] = {"assign", "revoke", "lost"};

/* ---- values ---------------------------------------------------------------- */

typedef struct lag_series {
    char topic[SVC_TOPIC_NAME_MAX + 1];
    int32_t partition;
    int64_t lag;
} lag_series;

static struct {
    _Atomic uint64_t counters[SVC_COUNTER_COUNT];
    _Atomic uint64_t gauges[SVC_GAUGE_COUNT]; /* double bits */
    svc_hist_val hists[SVC_HIST_COUNT];
    _Atomic uint64_t outcomes[N_OUTCOMES];
    _Atomic uint64_t errors[N_CODES];
    _Atomic uint64_t dead_letters[N_CODES];
    _Atomic uint64_t rebalances[SVC_REBALANCE_COUNT];
    _Atomic uint64_t weight_bytes[ML_PLAN_DTYPES]; /* double bits */
    pthread_mutex_t lag_lock;
    lag_series lag[LAG_SERIES_MAX];
    int n_lag;
    char version[INFO_MAX], backend[INFO_MAX], model[INFO_MAX], fingerprint[INFO_MAX];
    char row_mask[INFO_MAX];
    size_t n_tenants;
    char tenant[SVC_METRICS_TENANTS_MAX][INFO_MAX];
    svc_hist_val tenant_queue[SVC_METRICS_TENANTS_MAX];
    _Atomic int tenant_in_flight[SVC_METRICS_TENANTS_MAX];
    _Atomic bool tenant_paused[SVC_METRICS_TENANTS_MAX];
    _Atomic int tenant_prefetched[SVC_METRICS_TENANTS_MAX];
} reg = {.lag_lock = PTHREAD_MUTEX_INITIALIZER};

static uint64_t to_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double from_bits(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

void svc_metrics_set_info(const char *version, const char *backend, const char *model_name,
                          const char *fingerprint, const char *row_mask)
{
    snprintf(reg.version, sizeof reg.version, "%s", version);
    snprintf(reg.backend, sizeof reg.backend, "%s", backend);
    snprintf(reg.model, sizeof reg.model, "%s", model_name);
    snprintf(reg.fingerprint, sizeof reg.fingerprint, "%s", fingerprint);
    snprintf(reg.row_mask, sizeof reg.row_mask, "%s", row_mask);
}

void svc_metrics_add(svc_counter c, uint64_t n) { atomic_fetch_add(&reg.counters[c], n); }
void svc_metrics_set(svc_gauge g, double v) { atomic_store(&reg.gauges[g], to_bits(v)); }

void svc_hist_observe(const svc_hist_def *d, svc_hist_val *v, double seconds)
{
    for (int i = 0; i < d->n; i++)
        if (seconds <= d->le[i]) {
            atomic_fetch_add(&v->buckets[i], 1);
            break;
        }
    atomic_fetch_add(&v->count, 1);
    uint64_t old = atomic_load(&v->sum_bits);
    while (!atomic_compare_exchange_weak(&v->sum_bits, &old, to_bits(from_bits(old) + seconds)))
        ;
}

void svc_metrics_observe(svc_histogram h, double seconds)
{
    svc_hist_observe(&hist_defs[h], &reg.hists[h], seconds);
}

void svc_metrics_set_tenants(const char *const *names, size_t n)
{
    reg.n_tenants = n < SVC_METRICS_TENANTS_MAX ? n : SVC_METRICS_TENANTS_MAX;
    for (size_t i = 0; i < reg.n_tenants; i++)
        snprintf(reg.tenant[i], sizeof reg.tenant[i], "%s", names[i]);
}

void svc_metrics_tenant_queue(size_t tenant, double seconds)
{
    if (tenant < reg.n_tenants)
        svc_hist_observe(&tenant_queue_def, &reg.tenant_queue[tenant], seconds);
}

void svc_metrics_tenant_in_flight(size_t tenant, int n)
{
    if (tenant < reg.n_tenants)
        atomic_store(&reg.tenant_in_flight[tenant], n);
}

void svc_metrics_tenant_paused(size_t tenant, bool paused)
{
    if (tenant < reg.n_tenants)
        atomic_store(&reg.tenant_paused[tenant], paused);
}

void svc_metrics_tenant_prefetched(size_t tenant, int n)
{
    if (tenant < reg.n_tenants)
        atomic_store(&reg.tenant_prefetched[tenant], n);
}

void svc_metrics_finished(svc_finish outcome)
{
    for (size_t i = 0; i < N_OUTCOMES; i++)
        if (outcomes[i] == outcome)
            atomic_fetch_add(&reg.outcomes[i], 1);
}

void svc_metrics_error(svc_error code)
{
    if (code > SVC_ERROR_NONE && code < N_CODES)
        atomic_fetch_add(&reg.errors[code], 1);
}

void svc_metrics_dead_letter(svc_error code)
{
    if (code > SVC_ERROR_NONE && code < N_CODES)
        atomic_fetch_add(&reg.dead_letters[code], 1);
}

void svc_metrics_rebalance(svc_rebalance type) { atomic_fetch_add(&reg.rebalances[type], 1); }

void svc_metrics_set_weight_bytes(int dtype, double bytes)
{
    if (dtype >= 0 && dtype < ML_PLAN_DTYPES)
        atomic_store(&reg.weight_bytes[dtype], to_bits(bytes));
}

void svc_metrics_set_lag(const char *topic, int32_t partition, int64_t lag)
{
    pthread_mutex_lock(&reg.lag_lock);
    int i = 0;
    while (i < reg.n_lag && !(reg.lag[i].partition == partition && !strcmp(reg.lag[i].topic, topic)))
        i++;
    if (lag < 0) {
        if (i < reg.n_lag)
            reg.lag[i] = reg.lag[--reg.n_lag];
    } else if (i < reg.n_lag || reg.n_lag < LAG_SERIES_MAX) {
        if (i == reg.n_lag) {
            reg.n_lag++;
            snprintf(reg.lag[i].topic, sizeof reg.lag[i].topic, "%s", topic);
            reg.lag[i].partition = partition;
        }
        reg.lag[i].lag = lag;
    }
    pthread_mutex_unlock(&reg.lag_lock);
}

static void hist_reset(svc_hist_val *v)
{
    for (int b = 0; b < SVC_HIST_BUCKETS_MAX; b++)
        atomic_store(&v->buckets[b], 0);
    atomic_store(&v->count, 0);
    atomic_store(&v->sum_bits, 0);
}

void svc_metrics_reset(void)
{
    pthread_mutex_lock(&reg.lag_lock);
    reg.n_lag = 0;
    pthread_mutex_unlock(&reg.lag_lock);
    for (int i = 0; i < SVC_COUNTER_COUNT; i++)
        atomic_store(&reg.counters[i], 0);
    for (int i = 0; i < SVC_GAUGE_COUNT; i++)
        atomic_store(&reg.gauges[i], 0);
    for (int h = 0; h < SVC_HIST_COUNT; h++)
        hist_reset(&reg.hists[h]);
    for (size_t t = 0; t < SVC_METRICS_TENANTS_MAX; t++) {
        hist_reset(&reg.tenant_queue[t]);
        atomic_store(&reg.tenant_in_flight[t], 0);
        atomic_store(&reg.tenant_paused[t], false);
        atomic_store(&reg.tenant_prefetched[t], 0);
    }
    for (size_t i = 0; i < N_OUTCOMES; i++)
        atomic_store(&reg.outcomes[i], 0);
    for (size_t i = 0; i < N_CODES; i++) {
        atomic_store(&reg.errors[i], 0);
        atomic_store(&reg.dead_letters[i], 0);
    }
    for (int i = 0; i < SVC_REBALANCE_COUNT; i++)
        atomic_store(&reg.rebalances[i], 0);
    for (int i = 0; i < ML_PLAN_DTYPES; i++)
        atomic_store(&reg.weight_bytes[i], 0);
}

/* ---- rendering ------------------------------------------------------------- */

void svc_prom_head(svc_buf *b, const char *name, const char *help, const char *type)
{
    svc_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void svc_prom_hist(svc_buf *b, const svc_hist_def *d, const svc_hist_val *v, const char *labels)
{
    char label[INFO_MAX + 16] = "";
    if (labels)
        snprintf(label, sizeof label, "%s,", labels);
    uint64_t cum = 0;
    for (int i = 0; i < d->n; i++) {
        cum += atomic_load(&v->buckets[i]);
        svc_buf_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", d->name, label, d->le[i],
                       (unsigned long long)cum);
    }
    uint64_t count = atomic_load(&v->count);
    /* The label without its trailing comma, in braces, for _sum and _count. */
    char braces[sizeof label + 2] = "";
    if (labels)
        snprintf(braces, sizeof braces, "{%.*s}", (int)strlen(label) - 1, label);
    svc_buf_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n%s_sum%s %.17g\n%s_count%s %llu\n", d->name,
                   label, (unsigned long long)count, d->name, braces,
                   from_bits(atomic_load(&v->sum_bits)), d->name, braces,
                   (unsigned long long)count);
}

void svc_metrics_render(svc_buf *b)
{
    b->len = 0;
    svc_prom_head(b, "mllama_build_info", "build and backend", "gauge");
    svc_buf_printf(b, "mllama_build_info{version=\"%s\",backend=\"%s\"} 1\n", reg.version,
                   reg.backend);
    svc_prom_head(b, "mllama_model_info", "served model, its fingerprint and its cross-attention row mask",
         "gauge");
    svc_buf_printf(b,
                   "mllama_model_info{name=\"%s\",fingerprint=\"%s\","
                   "cross_attention_row_mask=\"%s\"} 1\n",
                   reg.model, reg.fingerprint, reg.row_mask);
    for (int i = 0; i < SVC_COUNTER_COUNT; i++) {
        svc_prom_head(b, counter_names[i][0], counter_names[i][1], "counter");
        svc_buf_printf(b, "%s %llu\n", counter_names[i][0],
                       (unsigned long long)atomic_load(&reg.counters[i]));
    }
    for (int i = 0; i < SVC_GAUGE_COUNT; i++) {
        svc_prom_head(b, gauge_names[i][0], gauge_names[i][1], "gauge");
        svc_buf_printf(b, "%s %.17g\n", gauge_names[i][0],
                       from_bits(atomic_load(&reg.gauges[i])));
    }
    svc_prom_head(b, "mllama_requests_total", "requests finished, by finish_reason", "counter");
    for (size_t i = 0; i < N_OUTCOMES; i++)
        svc_buf_printf(b, "mllama_requests_total{outcome=\"%s\"} %llu\n",
                       svc_finish_name(outcomes[i]),
                       (unsigned long long)atomic_load(&reg.outcomes[i]));
    svc_prom_head(b, "mllama_request_errors_total", "requests answered with an error, by code", "counter");
    for (int c = SVC_ERROR_INVALID_JSON; c < SVC_ERROR_TOO_MANY_ATTEMPTS; c++)
        svc_buf_printf(b, "mllama_request_errors_total{code=\"%s\"} %llu\n", svc_error_code(c),
                       (unsigned long long)atomic_load(&reg.errors[c]));
    svc_prom_head(b, "mllama_dlt_messages_total", "messages sent to the dead-letter topic, by code",
         "counter");
    for (int c = SVC_ERROR_INVALID_JSON; c < (int)N_CODES; c++)
        svc_buf_printf(b, "mllama_dlt_messages_total{code=\"%s\"} %llu\n", svc_error_code(c),
                       (unsigned long long)atomic_load(&reg.dead_letters[c]));
    svc_prom_head(b, "mllama_kafka_rebalances_total", "rebalance callbacks, by type", "counter");
    for (int i = 0; i < SVC_REBALANCE_COUNT; i++)
        svc_buf_printf(b, "mllama_kafka_rebalances_total{type=\"%s\"} %llu\n", rebalance_names[i],
                       (unsigned long long)atomic_load(&reg.rebalances[i]));
    svc_prom_head(b, "mllama_weight_bytes", "resident model weight bytes on one device, by dtype",
         "gauge");
    for (int i = 0; i < ML_PLAN_DTYPES; i++)
        svc_buf_printf(b, "mllama_weight_bytes{dtype=\"%s\"} %.17g\n",
                       ml_plan_dtype_name((ml_plan_dtype)i),
                       from_bits(atomic_load(&reg.weight_bytes[i])));
    for (int h = 0; h < SVC_HIST_COUNT; h++) {
        svc_prom_head(b, hist_defs[h].name, hist_defs[h].help, "histogram");
        svc_prom_hist(b, &hist_defs[h], &reg.hists[h], NULL);
    }
    svc_prom_head(b, tenant_queue_def.name, tenant_queue_def.help, "histogram");
    char labels[INFO_MAX + 16];
    for (size_t t = 0; t < reg.n_tenants; t++) {
        snprintf(labels, sizeof labels, "tenant=\"%s\"", reg.tenant[t]);
        svc_prom_hist(b, &tenant_queue_def, &reg.tenant_queue[t], labels);
    }
    svc_prom_head(b, "mllama_tenant_in_flight", "requests consumed and not finished, by tenant", "gauge");
    for (size_t t = 0; t < reg.n_tenants; t++)
        svc_buf_printf(b, "mllama_tenant_in_flight{tenant=\"%s\"} %d\n", reg.tenant[t],
                       atomic_load(&reg.tenant_in_flight[t]));
    svc_prom_head(b, "mllama_tenant_paused", "1 while the tenant's request partitions are paused",
         "gauge");
    for (size_t t = 0; t < reg.n_tenants; t++)
        svc_buf_printf(b, "mllama_tenant_paused{tenant=\"%s\"} %d\n", reg.tenant[t],
                       atomic_load(&reg.tenant_paused[t]) ? 1 : 0);
    svc_prom_head(b, "mllama_tenant_prefetched",
                  "records fetched for the tenant and not yet read by the worker", "gauge");
    for (size_t t = 0; t < reg.n_tenants; t++)
        svc_buf_printf(b, "mllama_tenant_prefetched{tenant=\"%s\"} %d\n", reg.tenant[t],
                       atomic_load(&reg.tenant_prefetched[t]));
    svc_prom_head(b, "mllama_kafka_consumer_lag", "consumer lag of each assigned partition", "gauge");
    pthread_mutex_lock(&reg.lag_lock);
    for (int i = 0; i < reg.n_lag; i++)
        svc_buf_printf(b, "mllama_kafka_consumer_lag{topic=\"%s\",partition=\"%d\"} %lld\n",
                       reg.lag[i].topic, reg.lag[i].partition, (long long)reg.lag[i].lag);
    pthread_mutex_unlock(&reg.lag_lock);
}
