/* Process-wide metrics of the worker, rendered in the Prometheus text format
 * (ops/metrics.md is the contract: names, labels, buckets). Every update is
 * a lock-free atomic, callable from any thread; the few dynamic series (lag
 * per partition) take a mutex.
 * @locality: any thread. */
#ifndef SVC_METRICS_H
#define SVC_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"
#include "util.h"

typedef enum svc_counter {
    SVC_COUNTER_PROMPT_TOKENS,
    SVC_COUNTER_PROMPT_TOKENS_CACHED,
    SVC_COUNTER_PREFIX_BLOCK_HITS,
    SVC_COUNTER_PREFIX_BLOCK_MISSES,
    SVC_COUNTER_KV_BLOCKS_EVICTED,
    SVC_COUNTER_PREFILL_TOKENS,
    SVC_COUNTER_CHOICES_FORKED,
    SVC_COUNTER_TOKENS_GENERATED,
    SVC_COUNTER_IMAGE_CACHE_HITS,
    SVC_COUNTER_IMAGE_CACHE_MISSES,
    SVC_COUNTER_IMAGE_DECODES_SKIPPED,
    SVC_COUNTER_IMAGE_LATE_DECODES,
    SVC_COUNTER_ADAPTER_LOADS,
    SVC_COUNTER_ADAPTER_FETCHES,
    SVC_COUNTER_ADAPTER_STORE_ERRORS,
    SVC_COUNTER_PREEMPTIONS,
    SVC_COUNTER_REDIS_ERRORS,
    SVC_COUNTER_HTTP_CONNECTIONS_DROPPED,
    SVC_COUNTER_SCHEMA_COMPILES,
    SVC_COUNTER_SCHEMA_CACHE_HITS,
    SVC_COUNTER_COUNT,
} svc_counter;

typedef enum svc_gauge {
    SVC_GAUGE_READY,
    SVC_GAUGE_REQUESTS_WAITING,
    SVC_GAUGE_REQUESTS_RUNNING,
    SVC_GAUGE_KV_BLOCKS_USED,
    SVC_GAUGE_KV_BLOCKS_CAPACITY,
    SVC_GAUGE_KV_BLOCKS_CACHED,
    SVC_GAUGE_IMAGE_CACHE_BYTES,
    SVC_GAUGE_IMAGE_CACHE_BUDGET_BYTES,
    SVC_GAUGE_KAFKA_ASSIGNED_PARTITIONS,
    SVC_GAUGE_KAFKA_PAUSED_PARTITIONS,
    SVC_GAUGE_REDIS_BREAKER_OPEN,
    SVC_GAUGE_SCHEMA_CACHE_BYTES,
    SVC_GAUGE_COUNT,
} svc_gauge;

typedef enum svc_histogram {
    SVC_HIST_TTFT,
    SVC_HIST_INTER_TOKEN,
    SVC_HIST_REQUEST_DURATION,
    SVC_HIST_VISION_ENCODE,
    SVC_HIST_SCHEMA_COMPILE,
    SVC_HIST_COUNT,
} svc_histogram;

typedef enum svc_rebalance {
    SVC_REBALANCE_ASSIGN,
    SVC_REBALANCE_REVOKE,
    SVC_REBALANCE_LOST,
    SVC_REBALANCE_COUNT,
} svc_rebalance;

/* Static labels of mllama_build_info / mllama_model_info (row_mask: the
 * model.cross_attention_row_mask the model runs with). Strings are copied.
 * Call once at start, before the HTTP server runs. */
void svc_metrics_set_info(const char *version, const char *backend, const char *model_name,
                          const char *fingerprint, const char *row_mask);

/* mllama_weight_bytes{dtype}: the model's resident weight bytes on one
 * device of type `dtype` (an ml_plan_dtype: fp8, bf16, scales), set at
 * model load. Out-of-range types are ignored. */
void svc_metrics_set_weight_bytes(int dtype, double bytes);

void svc_metrics_add(svc_counter c, uint64_t n);
void svc_metrics_set(svc_gauge g, double v);
void svc_metrics_observe(svc_histogram h, double seconds);
/* mllama_requests_total{outcome} */
void svc_metrics_finished(svc_finish outcome);
/* mllama_request_errors_total{code} */
void svc_metrics_error(svc_error code);
/* mllama_dlt_messages_total{code}: call when the broker acknowledged the
 * dead letter (its delivery report), not when it was queued. */
void svc_metrics_dead_letter(svc_error code);
/* mllama_kafka_rebalances_total{type} */
void svc_metrics_rebalance(svc_rebalance type);
/* mllama_kafka_consumer_lag{topic,partition}; a negative lag removes the series. */
void svc_metrics_set_lag(const char *topic, int32_t partition, int64_t lag);

/* The tenants, by index (service/README.md §1 "Admission"): each gets
 * mllama_tenant_queue_seconds{tenant}, mllama_tenant_in_flight{tenant},
 * mllama_tenant_paused{tenant} and mllama_tenant_prefetched{tenant}. Names are copied; past
 * SVC_METRICS_TENANTS_MAX they are ignored, as are the updates of indices
 * beyond those set. Call once at start, before the HTTP server runs. */
#define SVC_METRICS_TENANTS_MAX 64
void svc_metrics_set_tenants(const char *const *names, size_t n);
/* mllama_tenant_queue_seconds{tenant}: one request's wait from its
 * consumption to its admission into the batch. */
void svc_metrics_tenant_queue(size_t tenant, double seconds);
/* mllama_tenant_in_flight{tenant}, mllama_tenant_paused{tenant} */
void svc_metrics_tenant_in_flight(size_t tenant, int n);
void svc_metrics_tenant_paused(size_t tenant, bool paused);
/* mllama_tenant_prefetched{tenant}: records fetched for the tenant and not
 * yet read (svc_consumer_prefetched) */
void svc_metrics_tenant_prefetched(size_t tenant, int n);

/* ---- the Prometheus text format, for any registry ----------------------------
 * What the worker's registry renders with, public so that another process's
 * registry (the gateway's) writes the same format. */

#define SVC_HIST_BUCKETS_MAX 12
/* A histogram's name, help and upper bounds (seconds), static. */
typedef struct svc_hist_def {
    const char *name, *help;
    int n;
    double le[SVC_HIST_BUCKETS_MAX];
} svc_hist_def;
/* Its values: lock-free, zero-initialised. */
typedef struct svc_hist_val {
    _Atomic uint64_t buckets[SVC_HIST_BUCKETS_MAX];
    _Atomic uint64_t count;
    _Atomic uint64_t sum_bits; /* the sum's double bits */
} svc_hist_val;

void svc_hist_observe(const svc_hist_def *d, svc_hist_val *v, double seconds);
/* The # HELP and # TYPE lines of a metric. */
void svc_prom_head(svc_buf *b, const char *name, const char *help, const char *type);
/* A histogram's _bucket, _sum and _count series; `labels` ("tenant=\"a\"",
 * without braces) goes on each, NULL for none. Call after its svc_prom_head. */
void svc_prom_hist(svc_buf *b, const svc_hist_def *d, const svc_hist_val *v, const char *labels);

/* Render every series into *out (replacing its contents). */
void svc_metrics_render(svc_buf *out);

/* Forget every value (tests). */
void svc_metrics_reset(void);

#endif
