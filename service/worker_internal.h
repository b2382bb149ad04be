/* State shared by the worker's threads (worker.c: wiring and the Kafka loop;
 * worker_prep.c: request preparation; worker_step.c: the engine step loop
 * and the replies). Not a public header.
 *
 * Threads and what they own:
 * - Kafka (the caller of svc_worker_run): the consumers and producer polls,
 *   delivery reports, offsets, backpressure, the drain sequence.
 * - prep: attempt counting and blob fetches in Redis (its own connection),
 *   request parsing, image decoding and preprocessing, tokenization.
 * - step: the runtime (model, backend); reply records.
 * - index: the Redis index (its own connection): heartbeats and image events.
 * - http: /metrics, /healthz, /readyz (http.c).
 * They talk through the queues below; nothing blocks the Kafka thread. */
#ifndef SVC_WORKER_INTERNAL_H
#define SVC_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "adapter_store.h"
#include "backend_select.h"
#include "config.h"
#include "engine.h"
#include "http.h"
#include "kafka.h"
#include "protocol.h"
#include "redis_index.h"
#include "worker.h"

/* ==== jobs ================================================================== */

/* One consumed request from hand-off to its final record's delivery. */
typedef struct job {
    struct job *next;           /* queue link */
    struct job *reg_prev, *reg_next; /* the live-job registry */
    svc_worker *w;              /* borrowed */
    svc_offset_ticket ticket;   /* finished when the final record is delivered */
    char topic[SVC_TOPIC_NAME_MAX + 1];
    int32_t partition;
    int64_t offset;
    uint32_t attempt;
    atomic_bool abandoned;      /* partition revoked or lost: no more records */
    svc_request *req;           /* owned until submitted */
    svc_kafka_msg msg;          /* owned by the prep thread until parsed */
    /* What the step thread submits. */
    ml_token_buf prompt;
    ml_request_image *images;   /* owned array; pixels transferred at submit */
    int n_images;
    ml_sampling_params sampling;
    bool keep_req;              /* an image's load reads req's bytes: keep it until the end */
    uint64_t handle;            /* runtime handle once submitted */
    /* Reply state (step thread). */
    char *id, *reply_topic;     /* owned copies */
    bool stream;
    uint32_t seq;
    svc_buf text;               /* stream: false accumulates here */
    /* stream: false with logprobs: each streamed token's entry, its
     * alternatives in lp_top (n_top each, in token order; the entries'
     * top pointers are set when the completion is written, as lp_top
     * moves while it grows). Token strings are the tokenizer's. */
    svc_logprob_entry *lp;      /* owned (lp_cap) */
    svc_token_logprob *lp_top;  /* owned (lp_cap * sampling.top_logprobs) */
    size_t n_lp, lp_cap;
    bool lp_failed;             /* out of memory: the completion is an error */
    double t_handoff, t_last;   /* monotonic seconds */
    int n_tokens;
} job;

typedef struct job_queue {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    job *head, *tail;
    int n;
} job_queue;

void job_queue_init(job_queue *q);
void job_queue_deinit(job_queue *q);
void job_queue_push(job_queue *q, job *j);
/* Pop one job, waiting up to timeout_ms; NULL when none came. */
job *job_queue_pop(job_queue *q, int timeout_ms);

/* A cancel by request id, for the step thread. */
typedef struct cancel_req {
    struct cancel_req *next;
    char id[256];
} cancel_req;

/* An image event for the index thread. */
typedef struct image_event {
    struct image_event *next;
    ml_image_event ev;
    char sha256[SVC_SHA256_HEX_LEN + 1];
    uint64_t bytes;
    int n_tiles;
} image_event;

/* The attempt number of an execution Redis could not count has this bit set
 * (worker.h); the other bits make it unique to the execution. */
#define WORKER_ATTEMPT_UNCOUNTED 0x80000000u

/* ==== the worker ============================================================== */

struct svc_worker {
    svc_config cfg;             /* owned */
    char model_name[SVC_CONFIG_STR];
    char fingerprint[17];       /* first 16 hex digits of the model fingerprint */
    svc_limits limits;
    svc_health health;
    atomic_bool stop;           /* SIGTERM/SIGINT: drain and exit */
    atomic_bool fatal;          /* a process-level error: exit non-zero */
    char fatal_msg[512];

    /* Engine (step thread after start). */
    svc_backends backends;      /* the model's: one, or a tensor-parallel group */
    ml_model *model;
    ml_tokenizer *tok;
    ml_runtime *rt;
    ml_image_params image_params;
    uint64_t adapter_loads_seen; /* runtime adapter loads already counted (step thread) */
    uint32_t next_uncounted;    /* prep thread: numbers attempts Redis could not count */

    /* Kafka. */
    void *mock;                 /* svc_mock_kafka *, when brokers == "mock" */
    char brokers[SVC_CONFIG_STR];
    svc_consumer *consumer;     /* request topic, consumer group */
    svc_consumer *cancels;      /* cancel topic, a group of its own: sees every cancel */
    svc_producer *producer;
    atomic_int inflight;        /* jobs consumed and not yet fully delivered */
    pthread_mutex_t partitions_lock;
    char partitions[1024];      /* "topic:0,1,5" for the Redis heartbeat */

    /* Redis (NULL when redis.url is empty). */
    svc_redis *redis_prep;
    svc_redis *redis_index;
    svc_adapter_store adapters; /* Redis-held adapters copied into model.adapters_dir */

    /* Threads and queues. */
    job_queue prep_q;           /* Kafka -> prep */
    job_queue step_q;           /* prep -> step */
    pthread_mutex_t cancel_lock;
    cancel_req *cancels_head;
    atomic_bool cancel_all;     /* drain grace expired: cancel everything running */
    pthread_mutex_t event_lock;
    pthread_cond_t event_cond;
    image_event *events_head, *events_tail;
    pthread_mutex_t registry_lock;
    job *registry;              /* every live job */
    pthread_mutex_t resident_lock;
    uint8_t (*resident)[ML_IMAGE_KEY_BYTES]; /* owned: keys of resident image states */
    size_t n_resident, cap_resident;
    pthread_t prep_thread, step_thread, index_thread;
    atomic_bool threads_stop;
    svc_http *http;
};

/* Registry of live jobs, for revocations (any thread). */
void worker_register(svc_worker *w, job *j);
void worker_unregister(svc_worker *w, job *j);

/* Free a job and everything it owns; unregisters it. */
void job_free(job *j);

/* Produce j's error reply (final) or dead-letter its message; j's final
 * delivery then finishes its ticket. @locality prep or step thread. */
void worker_reply_error(svc_worker *w, job *j, svc_error code, const char *message);
void worker_dead_letter(svc_worker *w, job *j, svc_error code, const char *message);

/* Produce a record; a final record carries ctx = j (its delivery finishes
 * the ticket and frees j). Returns 0, or -1 after logging (j then stays
 * with the caller). @locality prep or step thread. */
int worker_produce(svc_worker *w, job *j, const svc_buf *value, uint32_t seq, bool final);

/* Latch a process-level error: the Kafka loop stops without committing. */
void worker_fail(svc_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Thread bodies. */
void *worker_prep_main(void *arg);
void *worker_step_main(void *arg);

/* The resident-image mirror: updated from the runtime's events (step
 * thread), read by the prep thread. */
void worker_mirror_update(svc_worker *w, ml_image_event ev, const uint8_t *key);
bool worker_mirror_contains(svc_worker *w, const uint8_t *key);

/* The image event callback of the runtime (step thread). */
void worker_on_image_event(void *ctx, ml_image_event ev, const uint8_t *key, size_t bytes,
                           int n_tiles);

#endif
