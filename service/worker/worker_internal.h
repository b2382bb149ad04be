/* State shared by the worker's threads (worker.c: wiring and the Kafka loop;
 * job.c: the queues and the live-job registry; worker_prep.c: request
 * preparation; worker_step.c: the engine step loop; worker_reply.c: reply
 * records, dead letters and delivery reports; worker_cancel.c: cancels).
 * Not a public header.
 *
 * Threads and what they own:
 * - Kafka (the caller of svc_worker_run): the consumers and producer polls,
 *   delivery reports, offsets, backpressure, the drain sequence.
 * - prep (a pool of worker.prep_threads, all popping prep_q): attempt
 *   counting and blob fetches in Redis (a connection per thread), request
 *   parsing, image decoding and preprocessing, tokenization. Jobs of one
 *   partition may leave the pool in any order: offsets are finished in any
 *   order anyway (offsets.h), and the step thread submits in pop order.
 * - step: the runtime (model, backend); the fair queue, where prepared
 *   jobs wait to enter the batch by tenant weight (fair.h); reply records. It decodes no
 *   image: an inline image whose state is evicted before admission sends
 *   its job back to the prep pool (ML_REQERR_IMAGE_EVICTED, redecode).
 * - index: the Redis index (its own connection): heartbeats, image events
 *   and the deletes of finished records' attempt counters.
 * - http: /metrics, /healthz, /readyz (http.c).
 * They talk through the queues below; nothing blocks the Kafka thread. */
#ifndef SVC_WORKER_INTERNAL_H
#define SVC_WORKER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "worker/adapter_store.h"
#include "worker/fair.h"
#include "config.h"
#include "engine.h"
#include "http.h"
#include "kafka/kafka.h"
#include "kafka/mock_kafka.h"
#include "protocol/protocol.h"
#include "protocol/tool_stream.h"
#include "redis/redis.h"
#include "worker/schema_cache.h"
#include "worker/worker.h"

/* ---- jobs ------------------------------------------------------------------ */

/* What a record produced for a job is: its delivery report's ctx points
 * at the job's job_record of that kind. */
typedef enum job_record_kind {
    JOB_RECORD_CHUNK,       /* a streamed chunk: not the last */
    JOB_RECORD_FINAL,       /* the final reply record */
    JOB_RECORD_DEAD_LETTER, /* the request's copy on the dead-letter topic */
    JOB_RECORD_KINDS,
} job_record_kind;

typedef struct job_record {
    struct job *j; /* borrowed: the job the record is for */
    job_record_kind kind;
    /* The worker's produce number (svc_worker.produced) of the last record
     * of this kind queued: exact for a final or a dead letter, the latest
     * chunk's for chunks (worker_on_delivery). */
    atomic_uint_least64_t produced;
} job_record;

/* One choice of a job (svc_request.n; runtime.h ml_request.n): what its
 * runtime callbacks report, on the step thread. */
typedef struct job_choice {
    struct job *j;              /* borrowed: the job it is a choice of */
    uint32_t index;             /* 0 .. n-1 */
    bool started;               /* a chunk of it was sent: the next carries no role */
    bool ended;                 /* its on_finish ran */
    svc_finish finish;          /* once ended, without an error */
    ml_usage usage;             /* once ended */
    /* stream: false, the whole answer; streamed with n = 1, the tail the
     * final record carries. */
    svc_buf text;
    /* stream: false with logprobs: each token's entry, its alternatives in
     * lp_top (n_top each, in token order; the entries' top pointers are
     * set when the completion is written, as lp_top moves while it grows).
     * Token strings are the tokenizer's. */
    svc_logprob_entry *lp;      /* owned (lp_cap) */
    svc_token_logprob *lp_top;  /* owned (lp_cap * sampling.top_logprobs) */
    size_t n_lp, lp_cap;
    bool lp_failed;             /* out of memory: the completion is an error */
    /* With tools: the answer as prose or a call (tool_stream.h; text then
     * holds the call's arguments) and the call's id. */
    svc_tool_stream tool;
    char call_id[SVC_TOOL_CALL_ID_LEN + 1];
    svc_reply_call call;        /* the completion's (completion_choice) */
} job_choice;

/* One consumed request from hand-off to the delivery of its last record.
 * It ends in exactly one of: a final reply or a dead letter acknowledged
 * (which finishes the ticket), or a process-level stop (nothing finished). */
typedef struct job {
    struct job *next;           /* queue link */
    ml_list_node reg;           /* in the live-job registry */
    svc_worker *w;              /* borrowed */
    svc_offset_ticket ticket;   /* finished when the final record is delivered */
    const svc_tenant *tenant;   /* borrowed from w->cfg: whose request topic it came from */
    char topic[SVC_TOPIC_NAME_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t broker_ms;          /* the record's LogAppendTime; -1 when its topic keeps
                                   the producer's time, which orders nothing */
    uint64_t arrival;           /* Kafka thread's arrival number (worker_cancel.c) */
    uint32_t attempt;
    atomic_bool abandoned;      /* partition revoked or lost: no more records */
    /* A newer execution of the same request (tenant, id and reply topic)
     * was consumed: this one ends cancelled at its next stage, before the
     * newer sends anything (worker_cancel.c). */
    atomic_bool replaced;
    /* References: one for the pipeline (prep, then step thread, until its
     * final record or dead letter is queued) and one per record queued and
     * not yet reported. job_free drops one; the last frees the job. */
    atomic_int refs;
    job_record records[JOB_RECORD_KINDS]; /* the ctx of each kind of record */
    /* The reply topic refused one of the request's records (unknown topic,
     * not authorized, too large): nothing more is sent to it and the
     * request ends as a dead letter. reply_why is written once, under
     * w->failure_lock, before reply_failed is set. */
    atomic_bool reply_failed;
    char reply_why[SVC_ERRMSG_MAX];
    bool final_replaced;        /* the final in flight is the reply_too_large replacement */
    svc_error dlt_code;         /* the dead letter's code, counted once it is delivered */
    bool cancel_sent;           /* step thread: ml_runtime_cancel was called on handle */
    svc_fair_item fair;         /* step thread: in w->fair while prepared and held */
    double t_consumed;          /* monotonic seconds: the Kafka thread took the record */
    double t_submit;            /* monotonic seconds: handed to the runtime */
    svc_request *req;           /* owned until submitted */
    /* The name the runtime knows req's adapter by (adapter_store.h): prep
     * points req->adapter here. */
    char adapter_ref[SVC_ADAPTER_REF_MAX];
    bool offset_counted;        /* prep counted the record in Redis: delete it when finished */
    svc_kafka_msg msg;          /* owned by its prep thread until parsed */
    /* What the step thread submits. */
    ml_token_buf prompt;
    ml_request_image *images;   /* owned array; pixels transferred at submit */
    int n_images;
    ml_sampling_params sampling; /* .grammar: owned, one reference (the runtime takes its own) */
    /* The request's logit_bias in the engine's form; sampling.logit_bias
     * points here (the runtime copies the entries at submit). */
    ml_logit_bias logit_bias[ML_SAMPLE_MAX_BIAS];
    bool keep_req;              /* an at_caller image may need req's bytes: keep it until the end */
    bool redecode;              /* back from the step thread: decode every image, submit again */
    int n_skipped;              /* inline images prep left undecoded (at_caller) */
    uint64_t pixels;            /* decoded pixels its images come to (prep: the budget) */
    uint64_t handle;            /* runtime handle once submitted */
    /* Reply state (step thread). id and reply_topic are set once, by the
     * prep thread under registry_lock (job_identify), and read by others
     * under it. */
    char *id, *reply_topic;     /* owned copies */
    bool stream;
    uint32_t seq;               /* one counter over every choice's records */
    /* The choices: &first alone until prep reads an n above 1 (job_choices_init). */
    job_choice *choices;        /* owned when not &first */
    uint32_t n_choices, n_ended;
    job_choice first;
    /* With tools (a tool_choice other than none): each choice's answer is
     * prose or a call (job_choice.tool); tool_call: a call (required or a
     * named function), else either (auto). */
    bool tools, tool_call;
    /* The first request-level error a choice ended with: the final is that
     * error once every choice has ended. */
    svc_error error;
    char error_message[SVC_ERRMSG_MAX];
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

/* ---- pending cancels (worker_cancel.c) ----------------------------------------- */

/* Every cancel record is remembered for a while, so that a cancel stops its
 * request whatever stage the request is in when the cancel arrives: queued
 * for prep, being prepared, waiting for the step thread, or running. The
 * prep thread consults the table once the request id is known, the step
 * thread at submit and (for running sequences) whenever a cancel arrives.
 * A cancel is its tenant's (the cancel topic it came from): it stops the
 * executions of its id from that tenant's request topic whose request
 * record is not newer than the cancel record, so a client that cancels and
 * then sends the id again gets the new execution run. Newer is the worker's
 * order, never the producer's: the broker's LogAppendTime when both records
 * carry one, else the order this worker consumed them in (a producer's
 * CreateTime is whatever the producer chose: a request stamped a day ahead
 * could not be cancelled, a cancel stamped ahead would stop every re-send).
 *
 * Bounded: WORKER_CANCELS_MAX entries, each forgotten WORKER_CANCEL_TTL_MS
 * after it arrived, the oldest first when the table is full. A running
 * request is hit when its cancel arrives; the table is for the requests
 * that have not reached the runtime yet (seconds, normally) and for a
 * cancel that overtook its request in a backlog. */
#define WORKER_CANCELS_MAX 4096
#define WORKER_CANCEL_TTL_MS (5 * 60 * 1000)

typedef struct pending_cancel {
    const svc_tenant *tenant;   /* borrowed from w->cfg: whose cancel topic it came from */
    uint64_t arrival;           /* Kafka thread's arrival number */
    long long at_ms;            /* svc_now_ms() when it arrived */
    int64_t broker_ms;          /* the cancel record's LogAppendTime; -1: none */
    size_t len;
    char id[SVC_ID_MAX_BYTES + 1];
} pending_cancel;

typedef struct cancel_table {
    pthread_mutex_t lock;
    pending_cancel *ring;       /* owned: WORKER_CANCELS_MAX slots, oldest at head */
    size_t head, n;
} cancel_table;

/* An image event for the index thread. */
typedef struct image_event {
    struct image_event *next;
    ml_image_event ev;
    char sha256[SVC_SHA256_HEX_LEN + 1];
    uint64_t bytes;
    int n_tiles;
} image_event;

/* A finished record whose attempt counter the index thread deletes
 * (svc_redis_attempt_clear). At most WORKER_CLEARS_MAX wait at once; past
 * that a counter is left to its TTL (redis.offset_attempts_ttl_s). */
#define WORKER_CLEARS_MAX 4096
typedef struct attempt_clear {
    struct attempt_clear *next;
    char topic[SVC_TOPIC_NAME_MAX + 1];
    int32_t partition;
    int64_t offset;
} attempt_clear;

/* One thread of the prep pool. */
typedef struct prep_thread {
    svc_worker *w;              /* borrowed */
    svc_redis *redis;           /* owned: this thread's connection; NULL without Redis */
    pthread_t thread;
    bool started;
} prep_thread;

/* What a job keeps of its request's value once it is prepared, for a dead
 * letter written later (reply_undeliverable): the first this many bytes,
 * so an accepted request holds no more of its record than this. */
#define WORKER_LATE_DLT_VALUE_MAX (64u << 10)

/* The attempt number of an execution Redis could not count has this bit set
 * (worker.h); the other bits make it unique to the execution. */
#define WORKER_ATTEMPT_UNCOUNTED 0x80000000u

/* ---- the worker -------------------------------------------------------------- */

/* The Redis heartbeat's partitions text: every tenant's request topic and
 * its assigned partitions. */
#define WORKER_PARTITIONS_TEXT 8192

struct svc_worker {
    svc_config cfg;             /* owned */
    char model_name[SVC_CONFIG_STR];
    char fingerprint[17];       /* first 16 hex digits of the model fingerprint */
    uint8_t fingerprint_digest[ML_SHA256_DIGEST_SIZE]; /* all of it: the prefix cache's root */
    bool reproducible;          /* batch-invariant backend: the `reproducible` reply header */
    svc_limits limits;
    svc_health health;
    atomic_bool stop;           /* SIGTERM/SIGINT: drain and exit */
    atomic_bool fatal;          /* a process-level error: exit non-zero */
    svc_worker_exit fatal_code; /* written once, by the worker_fail that set fatal */
    char fatal_msg[512];

    /* Engine (step thread after start). */
    ml_engine *engine;          /* owned: backends, model, tokenizer, runtime */
    ml_model *model;            /* borrowed from engine, as are tok and rt */
    ml_tokenizer *tok;
    ml_runtime *rt;
    uint64_t adapter_loads_seen; /* runtime adapter loads already counted (step thread) */
    struct {
        uint64_t hits, misses, evicted, prefill, forked;
    } prefix_seen;               /* prefix-cache, prefill and fork counts already counted
                                    (step thread) */
    atomic_uint_least64_t free_pool_bytes; /* step thread writes, index thread heartbeats it */
    atomic_uint next_uncounted; /* prep pool: numbers attempts Redis could not count */

    /* Kafka. */
    void *mock;                 /* svc_mock_kafka *, when brokers == "mock" */
    char brokers[SVC_CONFIG_STR];
    svc_consumer *consumer;     /* request topic, consumer group */
    svc_consumer *cancels;      /* cancel topic, a group of its own: sees every cancel */
    svc_producer *producer;
    atomic_int inflight;        /* jobs consumed and not yet fully delivered */
    atomic_int *tenant_inflight; /* owned, per tenant: the same, by tenant */
    svc_fair_fetch *fetch;      /* owned, per tenant: Kafka thread's fetch plan (fair.h) */
    atomic_uint_least64_t produced; /* records queued so far: numbers job_record.produced */
    /* Kafka thread: the highest produce numbers of acknowledged finals and
     * dead letters, for two different topics (acked[0] the highest), which
     * tell a reply topic that stopped taking records from a cluster that
     * lost them all (worker_on_delivery). */
    struct {
        uint64_t produced;
        char topic[SVC_TOPIC_NAME_MAX + 1];
    } acked[2];
    pthread_mutex_t failure_lock;  /* jobs' reply_why */
    pthread_mutex_t partitions_lock;
    bool held[SVC_TENANTS_MAX][SVC_MOCK_KAFKA_MAX_PARTITIONS]; /* assigned, per tenant's
                                                                  request topic */
    char partitions[WORKER_PARTITIONS_TEXT]; /* "topic:0,1,5;topic2:3" for the heartbeat */

    /* Redis (NULL when redis.url is empty); the prep threads' own are in prep. */
    svc_redis *redis_index;
    svc_adapter_store adapters; /* Redis-held adapters copied into model.adapters_dir */
    svc_schema_cache *schemas;  /* owned: compiled json_schema grammars (prep threads) */

    /* Threads and queues. */
    job_queue prep_q;           /* Kafka -> prep */
    job_queue step_q;           /* prep -> step */
    svc_fair *fair;             /* owned: step thread; prepared jobs held until the runtime
                                   has room, admitted across tenants by weight */
    job *parked;                /* step thread: prepared jobs waiting for the older
                                   executions of their request to end (job.next links) */
    cancel_table pending_cancels;
    uint64_t arrivals;          /* Kafka thread: numbers requests and cancels as consumed */
    atomic_bool cancel_scan;    /* a cancel arrived or a job was abandoned: step rescans */
    atomic_bool cancel_all;     /* drain grace expired: cancel everything running */
    pthread_mutex_t event_lock;
    pthread_cond_t event_cond;
    image_event *events_head, *events_tail;
    attempt_clear *clears_head, *clears_tail; /* under event_lock, for the index thread */
    int n_clears;
    pthread_mutex_t registry_lock;
    ml_list registry;           /* every live job (job.reg), newest first */
    pthread_mutex_t resident_lock;
    uint8_t (*resident)[ML_IMAGE_KEY_BYTES]; /* owned: keys of resident image states */
    size_t n_resident, cap_resident;
    prep_thread *prep;          /* owned: n_prep threads */
    int n_prep;
    pthread_t step_thread, index_thread;
    atomic_bool threads_stop;
    svc_http *http;
};

/* The registry's jobs, newest first, under registry_lock: first, then next
 * until NULL. */
static inline job *registry_first(const svc_worker *w)
{
    return ml_list_entry(w->registry.head, job, reg);
}
static inline job *registry_next(const job *j) { return ml_list_entry(j->reg.next, job, reg); }

/* The index of j's tenant in w->cfg.tenants. @locality any. */
static inline size_t job_tenant(const job *j) { return (size_t)(j->tenant - j->w->cfg.tenants); }

/* The job a held item of w->fair is. */
static inline job *job_of_fair(const svc_fair_item *it)
{
    return (job *)((char *)it - offsetof(job, fair));
}

/* Registry of live jobs, for revocations (any thread). */
void worker_register(svc_worker *w, job *j);

/* Give j its request id and reply topic (copies), under registry_lock, so
 * the step thread can match it with other executions of its request.
 * Returns 0, or -1 out of memory (j unchanged). @locality prep thread. */
int job_identify(svc_worker *w, job *j, const char *id, const char *reply_topic);

/* Give j n choices (svc_request.n, at least 1). Returns 0, or -1 out of
 * memory (j keeps its one choice). @locality prep thread. */
int job_choices_init(job *j, uint32_t n);

/* Forget what j's choices reported (a job the runtime gave back unrun, to
 * be submitted again), and start each answer's tool stream when j->tools.
 * @locality the thread holding j (prep or step). */
void job_choices_reset(job *j);

/* Drop the caller's reference to j (the pipeline's, or a record's in its
 * delivery report); the last one frees j and everything it owns and
 * unregisters it. @locality any. */
void job_free(job *j);

/* End j with an error reply (final) or a dead letter. Both take the
 * caller's reference: j is not touched after. A dead letter copies j->msg
 * (which must still hold the record, or its detached copy); its delivery
 * finishes the ticket. @locality prep, step or Kafka thread. */
void worker_reply_error(svc_worker *w, job *j, svc_error code, const char *message);
void worker_dead_letter(svc_worker *w, job *j, svc_error code, const char *message);

/* Produce a streamed chunk. Returns 0, or -1 when it was not sent: the
 * worker stopped, or the reply topic refused this or an earlier record of
 * j (then nothing more goes to it and the final becomes a dead letter).
 * j stays the caller's. @locality the thread holding j (prep or step). */
int worker_produce_chunk(svc_worker *w, job *j, const svc_buf *value, uint32_t seq);

/* Produce j's final record, taking the caller's reference. One that cannot
 * be written for its size is replaced by a small reply_too_large error
 * final; one the topic refuses (or after a refused chunk) becomes a dead
 * letter (reply_undeliverable); any other failure is process-level.
 * @locality prep, step or Kafka thread. */
void worker_produce_final(svc_worker *w, job *j, const svc_buf *value, uint32_t seq);

/* The producer's delivery callback (worker_reply.c): a final record or dead
 * letter acknowledged finishes its request's offset; a refusal fails the
 * request or, when the process cannot keep its promise, the worker.
 * @locality Kafka thread. */
void worker_on_delivery(void *opaque, const svc_delivery *d);
/* Finish j's offset ticket: its request is answered (an already revoked
 * partition's ticket is stale, and that is no error). @locality Kafka thread. */
void worker_finish_offset(svc_worker *w, job *j);

/* Latch a process-level error of class `code` (the exit code): the Kafka
 * loop stops without committing. The first call wins. */
void worker_fail(svc_worker *w, svc_worker_exit code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The pending-cancel table (worker_cancel.c). init returns 0, or -1 out of
 * memory; deinit accepts a table init never reached (zeroed). */
int worker_cancels_init(cancel_table *t);
void worker_cancels_deinit(cancel_table *t);
/* Remember the cancel record m (key = request id) for the tenant of m's
 * topic and have the step thread rescan. A key that cannot be a request id
 * is ignored. @locality Kafka thread. */
void worker_cancel_record(svc_worker *w, const svc_kafka_msg *m);
/* Whether j is to stop before it runs: a pending cancel of its tenant and
 * id is meant for it, or a newer execution replaced it (its id set).
 * @locality any thread. */
bool worker_job_stopped(svc_worker *w, const job *j);
/* At submit: whether j runs. A retry is a newer execution of the same
 * request: same tenant, id and reply topic. The older executions still
 * here are replaced (cancelled when running, j->replaced otherwise) and j
 * waits until each has ended and its records are delivered, so their
 * cancelled finals come before j's first record. @locality step thread. */
typedef enum submit_verdict {
    SUBMIT_RUN,
    SUBMIT_CANCELLED,   /* a pending cancel or a newer execution stops it: its final
                           says cancelled */
    SUBMIT_WAIT,        /* older executions of its request (or of a request of its
                           tenant not yet parsed) are still here: park it, ask again */
} submit_verdict;
submit_verdict worker_cancel_before_submit(svc_worker *w, job *j);
/* Cancel the running jobs that a new cancel hits, that were abandoned, or
 * all of them once the drain grace expired. @locality step thread. */
void worker_cancels_apply(svc_worker *w);

/* The final record of a job stopped before it ran: finish_reason cancelled,
 * no error, zero usage; its delivery finishes the ticket. `why` is logged.
 * @locality prep or step thread (whichever holds j). */
void worker_reply_cancelled(svc_worker *w, job *j, const char *why);

/* Thread bodies. worker_prep_main's arg is its prep_thread. */
void *worker_prep_main(void *arg);
void *worker_step_main(void *arg);
void *worker_index_main(void *arg); /* arg: the worker; runs while Redis is configured */

/* The resident-image mirror (worker_index.c): updated from the runtime's
 * events (step thread), read by the prep threads. */
bool worker_mirror_contains(svc_worker *w, const uint8_t *key);

/* The image event callback of the runtime (step thread). */
void worker_on_image_event(void *ctx, ml_image_event ev, const uint8_t *key, size_t bytes,
                           int n_tiles);

#endif
