/* The worker's Kafka layer: a consumer-group member that hands out request
 * messages and commits an offset only once its request is finished, and an
 * idempotent producer for replies and dead letters whose delivery reports
 * say when a request is finished.
 *
 * ---- Threads: the contract the worker loop is built on ---------------------
 *
 * Kafka thread  Owns the svc_consumer and serves the producer's delivery
 *               reports. It is the only caller of svc_consumer_* and of
 *               svc_producer_poll / _flush / _destroy. Rebalance callbacks
 *               (events.on_assign / on_revoke) and delivery reports
 *               (on_delivery) run on it, inside those calls, so the offset
 *               tracker needs no lock. It never waits on the model, which
 *               keeps max.poll.interval.ms from firing on long generations.
 * Any thread    svc_producer_produce / _produce_dlt (the engine's step loop
 *               streams chunks), svc_kafka_msg_release / _detach, the _fatal
 *               queries.
 * librdkafka's  own threads only call the log callback (svc_log).
 *
 * ---- The worker loop (Kafka thread) ----------------------------------------
 *
 *     while (!stop) {
 *         svc_kafka_msg m;
 *         st = svc_consumer_poll(c, SVC_KAFKA_POLL_MS, &m);
 *         if (st == SVC_KAFKA_OK) {
 *             parse m; then exactly one of:
 *               - start a request (keep m.ticket in it), hand it to the engine;
 *               - produce an error reply (ctx = the ticket holder, final);
 *               - svc_producer_produce_dlt (ctx likewise);
 *               - nothing to send: svc_consumer_finish(c, &m.ticket) now;
 *             svc_kafka_msg_release(&m);
 *         } else if (st != SVC_KAFKA_NO_MESSAGE) -> process-level error
 *         svc_producer_poll(p, 0);   // on_delivery: final record delivered ->
 *                                    //   svc_consumer_finish(c, &req->ticket)
 *         if (svc_producer_fatal(p, ...)) -> process-level error
 *         engine full ? svc_consumer_pause(c) : svc_consumer_resume(c);
 *     }
 *     shutdown: svc_consumer_pause; keep looping until the engine has drained
 *     or aborted its requests; svc_producer_flush; svc_consumer_close;
 *     svc_producer_destroy; svc_consumer_destroy.
 *
 * on_revoke lists the tickets of unfinished messages on the partitions being
 * taken away: stop those requests (their finish now returns STALE, nothing is
 * stored; the partition's next owner runs them again).
 *
 * ---- Commits ----------------------------------------------------------------
 * enable.auto.offset.store=false and enable.auto.commit=true, as librdkafka's
 * INTRODUCTION.md prescribes for at-least-once with manual storing: finish
 * stores the partition's committable offset (offsets.h) and librdkafka
 * commits what is stored every auto.commit.interval.ms, for revoked
 * partitions before they are unassigned, and at close; never for a lost
 * assignment. Commits therefore stay off the Kafka thread's critical path
 * and an OffsetCommit failure is retried by the next interval. */
#ifndef SVC_KAFKA_H
#define SVC_KAFKA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "kafka/offsets.h"

/* The consumer poll timeout the loop should use: short, so a stop request is
 * seen within it and delivery reports are served at least this often. */
#define SVC_KAFKA_POLL_MS 100

typedef enum svc_kafka_status {
    SVC_KAFKA_OK = 0,
    SVC_KAFKA_NO_MESSAGE,     /* poll: nothing to hand out this time */
    SVC_KAFKA_ERR_CONFIG,     /* a property or argument was rejected; err names it */
    SVC_KAFKA_ERR_QUEUE_FULL, /* produce: the local queue stayed full for the whole bound */
    SVC_KAFKA_ERR_TOO_LARGE,  /* produce, delivery: the record exceeds message.max.bytes
                                 (the producer's or the topic's) */
    SVC_KAFKA_ERR_TOPIC,      /* produce, delivery: the topic refuses records (unknown,
                                 not authorized, invalid) */
    SVC_KAFKA_ERR_STALE,      /* finish: the partition is no longer ours (revoked, lost) */
    SVC_KAFKA_ERR_INVALID,    /* finish: not pending (finished twice: a caller bug);
                                 pause_topic: a topic not subscribed to */
    SVC_KAFKA_ERR_TIMED_OUT,  /* flush: records still undelivered at the deadline */
    SVC_KAFKA_ERR_FATAL,      /* process-level: stop polling, do not commit, exit */
    SVC_KAFKA_ERR_NOMEM,
    SVC_KAFKA_ERR_KAFKA,      /* any other librdkafka error; err has its text */
} svc_kafka_status;

/* Stable lower-case name of a status. Never NULL. */
const char *svc_kafka_status_name(svc_kafka_status st);

/* What a librdkafka error says about a record: OK (none), ERR_TOO_LARGE
 * and ERR_TOPIC (this record or its topic is refused for good: nothing
 * about the connection or the cluster), ERR_FATAL, or ERR_KAFKA for the
 * rest (timeouts, brokers down, purges). @locality any. */
svc_kafka_status svc_kafka_record_status(rd_kafka_resp_err_t err);

/* Room kept in every record for what is not its value: key, headers and
 * Kafka's framing. A record value of at most message.max.bytes minus this
 * (and a dead letter's key and headers of at most SVC_DLT_META_MAX) is
 * never refused for its size by the producer. */
#define SVC_RECORD_RESERVE (64u << 10)
#define SVC_DLT_META_MAX (16u << 10)
/* librdkafka's default message.max.bytes, when the configuration sets none. */
#define SVC_KAFKA_MESSAGE_MAX_DEFAULT 1000000

/* One librdkafka property, applied with rd_kafka_conf_set. */
typedef struct svc_kafka_kv {
    const char *key;
    const char *value;
} svc_kafka_kv;

/* The integer value of property `key` in kv[0..n), the last setting winning
 * as it does when they are applied, or dflt when none sets it (an invalid
 * value is librdkafka's to refuse when the client is created). @locality any. */
long svc_kafka_kv_long(const svc_kafka_kv *kv, size_t n, const char *key, long dflt);

/* ---- Consumed messages ------------------------------------------------------ */

/* A request message handed out by svc_consumer_poll. Its offset is begun in
 * the tracker: finish the ticket exactly once (after the final record is
 * delivered, or at once when nothing is sent). The payload views live until
 * svc_kafka_msg_release, which must happen before svc_consumer_close. */
typedef struct svc_kafka_msg {
    rd_kafka_message_t *rkm; /* owned until svc_kafka_msg_release */
    const char *topic;       /* borrowed from rkm */
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms;    /* producer or broker time; -1 when absent */
    bool broker_time;        /* timestamp_ms is the broker's (the topic's
                                message.timestamp.type is LogAppendTime), not
                                the producer's choice */
    const void *key;         /* borrowed; NULL when absent */
    size_t key_len;
    const void *value;       /* borrowed; not NUL-terminated; NULL when empty */
    size_t value_len;
    svc_offset_ticket ticket;
    /* Once detached (svc_kafka_msg_detach): rkm is NULL and the views above
     * point into copy. */
    void *copy;                  /* owned: topic, key and the kept value */
    rd_kafka_headers_t *headers; /* owned copy of the headers; NULL: none kept */
    size_t value_full_len;       /* the value's length before detach kept a prefix */
    size_t dropped_meta;         /* bytes of key and headers detach did not keep */
} svc_kafka_msg;

/* Find the last header called `name`. Returns true and sets *value (borrowed
 * from the message, not NUL-terminated, NULL for a null header) and *len;
 * false when absent. @locality the thread holding the message. */
bool svc_kafka_msg_header(const svc_kafka_msg *m, const char *name, const void **value,
                          size_t *len);

/* The last header `name` of hs (NULL: none) as a decimal uint32: digits
 * only, at most UINT32_MAX. True and *out set; false when absent, null or
 * not such a number (reply records' attempt and seq). @locality any. */
bool svc_kafka_header_u32(rd_kafka_headers_t *hs, const char *name, uint32_t *out);

/* Destroy the underlying message (or a detached copy); the views become
 * invalid. The ticket stays usable. Releasing an already released message
 * is a no-op. @locality any. */
void svc_kafka_msg_release(svc_kafka_msg *m);

/* Keep what a dead letter needs of m and release the fetched record: the
 * topic, partition, offset, the key and headers (both dropped when together
 * over SVC_DLT_META_MAX bytes, counted in dropped_meta) and the first
 * max_value bytes of the value (value_full_len keeps its length). The views
 * and svc_kafka_msg_header then read the copy. Returns OK, or ERR_NOMEM with
 * m released. Detaching twice keeps the first copy. @locality the thread
 * holding m. */
svc_kafka_status svc_kafka_msg_detach(svc_kafka_msg *m, size_t max_value);

/* ---- Consumer ---------------------------------------------------------------- */

typedef struct svc_consumer svc_consumer;

/* Rebalance notifications, on the Kafka thread inside svc_consumer_poll or
 * svc_consumer_close. Both may be NULL. The lists are borrowed for the call. */
typedef struct svc_consumer_events {
    /* Partitions joined the assignment. Their records are handed out only
     * while their topic is not paused (backpressure holds across
     * rebalances). */
    void (*on_assign)(void *opaque, const rd_kafka_topic_partition_list_t *partitions);
    /* Partitions are leaving the assignment: revoked (lost false: their
     * stored offsets are committed before they go) or lost (lost true:
     * another member may own them already; nothing is committed). `pending`
     * holds the tickets begun on them and not finished, in offset order per
     * partition: stop those requests. */
    void (*on_revoke)(void *opaque, const rd_kafka_topic_partition_list_t *partitions,
                      const svc_offset_ticket *pending, size_t n_pending, bool lost);
    /* Optional: librdkafka's statistics JSON (json[0..len), borrowed for
     * the call) every statistics.interval.ms, which defaults to 15 s when
     * this is set; the source of consumer lag. */
    void (*on_stats)(void *opaque, const char *json, size_t len);
    void *opaque; /* borrowed; passed back to all three */
} svc_consumer_events;

typedef struct svc_consumer_config {
    const char *brokers;           /* bootstrap.servers ("mock" resolved by the caller) */
    const char *group_id;          /* group.id */
    const char *const *topics;     /* subscription; a ticket's topic_id is the index */
    size_t n_topics;
    const svc_kafka_kv *kafka;     /* pass-through properties, applied after the defaults */
    size_t n_kafka;
    svc_consumer_events events;
} svc_consumer_config;

/* Create a consumer and subscribe it. Defaults: cooperative-sticky
 * assignment, auto.offset.reset=earliest, a small pre-fetch queue; the
 * pass-through properties override them. enable.auto.offset.store and
 * enable.auto.commit are fixed (see Commits above): setting them is an
 * error. All strings are copied. Returns OK and *out (owned by the caller),
 * or ERR_CONFIG with err naming the property ("kafka.<key>: <reason>"),
 * ERR_NOMEM or ERR_KAFKA; *out is then NULL.
 * @locality any; the consumer then belongs to the thread that polls it. */
svc_kafka_status svc_consumer_create(const svc_consumer_config *cfg, svc_consumer **out,
                                     char *err, size_t errlen);

/* Wait up to timeout_ms for the next message and hand it out begun (see
 * svc_kafka_msg). Returns OK (*msg filled, owned by the caller),
 * NO_MESSAGE (timeout, an event, a redelivered duplicate or a message for a
 * partition already revoked: each logged and dropped), ERR_FATAL (the
 * consumer cannot continue: see svc_consumer_fatal) or ERR_NOMEM.
 * Rebalance callbacks run inside. @locality Kafka thread. */
svc_kafka_status svc_consumer_poll(svc_consumer *c, int timeout_ms, svc_kafka_msg *msg);

/* The message of `ticket` is done: advance its partition's committable offset
 * and store it for the next commit. Returns OK (stored, or nothing to store
 * yet because an earlier offset is unfinished), ERR_STALE (partition revoked
 * or lost since the ticket was issued: nothing stored), ERR_INVALID
 * (finished before) or ERR_KAFKA (err has librdkafka's reason).
 * @locality Kafka thread (typically inside on_delivery). */
svc_kafka_status svc_consumer_finish(svc_consumer *c, const svc_offset_ticket *ticket,
                                     char *err, size_t errlen);

/* Backpressure: stop (pause) or restart (resume) handing out the records
 * of every subscribed topic, on the partitions assigned now and later, until
 * the opposite call. Keep polling while paused. Each topic's records wait in
 * a queue of its own (kafka_consumer.c, "one queue per topic"), which a
 * paused topic leaves unread: librdkafka stops fetching its partitions at
 * the pre-fetch limits (queued.min.messages, queued.max.messages.kbytes, per
 * topic), and the other topics fetch on. librdkafka's own pause is never
 * asked. Idempotent. Returns OK.
 * @locality Kafka thread. */
svc_kafka_status svc_consumer_pause(svc_consumer *c);
svc_kafka_status svc_consumer_resume(svc_consumer *c);
/* The same for one subscribed topic (a tenant's request topic: fair share,
 * service/README.md §1), the other topics untouched. Returns OK or
 * ERR_INVALID (not a subscribed topic). */
svc_kafka_status svc_consumer_pause_topic(svc_consumer *c, const char *topic, bool pause);
/* Whether every subscribed topic is paused. */
bool svc_consumer_paused(const svc_consumer *c);
/* Assigned partitions of the paused topics. */
int svc_consumer_paused_partitions(const svc_consumer *c);
/* Records of a subscribed topic that librdkafka has fetched and the
 * application not yet read: its queue's length. A paused topic keeps up to
 * the pre-fetch limits of memory this way (librdkafka fetches on until
 * them); -1 for a topic not subscribed. @locality any. */
int svc_consumer_prefetched(const svc_consumer *c, const char *topic);


/* True once the consumer hit a fatal error (e.g. fenced by a static member
 * with the same group.instance.id); err gets the reason. @locality any. */
bool svc_consumer_fatal(svc_consumer *c, char *err, size_t errlen);

/* Leave the group: librdkafka commits the stored offsets of the revoked
 * assignment (on_revoke runs, with lost false) and closes. Every message
 * must be released first. Further polls return ERR_FATAL. Returns OK or
 * ERR_KAFKA; closing twice is OK. @locality Kafka thread. */
svc_kafka_status svc_consumer_close(svc_consumer *c, char *err, size_t errlen);

/* Close if still open, then free. NULL is a no-op. @locality Kafka thread,
 * after the producer whose delivery reports finish into it is destroyed. */
void svc_consumer_destroy(svc_consumer *c);

/* ---- Producer ---------------------------------------------------------------- */

typedef struct svc_producer svc_producer;

/* One record header. `value` may be NULL (a null header). */
typedef struct svc_kafka_header {
    const char *name;
    const void *value;
    size_t len;
} svc_kafka_header;

/* One record to produce. Everything is copied; nothing needs to outlive the
 * call except ctx, which comes back in exactly one delivery report. */
typedef struct svc_kafka_record {
    const char *topic;
    int32_t partition;               /* RD_KAFKA_PARTITION_UA: chosen from the key */
    const void *key;                 /* request id, so a request's records stay ordered */
    size_t key_len;
    const void *value;
    size_t value_len;
    const svc_kafka_header *headers; /* n_headers of them; may be NULL */
    size_t n_headers;
    void *ctx;                       /* borrowed until its delivery report */
} svc_kafka_record;

/* A record's outcome, passed to on_delivery. */
typedef struct svc_delivery {
    void *ctx;                /* the record's ctx */
    rd_kafka_resp_err_t err;  /* RD_KAFKA_RESP_ERR_NO_ERROR: acknowledged by the broker */
    svc_kafka_status status;  /* svc_kafka_record_status(err) */
    const char *errstr;       /* static text for err */
    const char *topic;        /* borrowed for the call */
    int32_t partition;
    int64_t offset;           /* -1 unless delivered */
} svc_delivery;

/* Runs on the thread serving delivery reports (svc_producer_poll, _flush,
 * _destroy, or _produce when it waits on a full queue from that thread). */
typedef void (*svc_delivery_fn)(void *opaque, const svc_delivery *d);

/* Dead-letter routing for svc_producer_produce_dlt. */
typedef struct svc_dead_letter {
    const char *topic;      /* the dead-letter topic */
    const char *error_code; /* x-error-code, a stable code such as "invalid_json" */
    const char *error_msg;  /* x-error-msg, one line for an operator */
    const char *worker;     /* x-worker, or NULL to omit */
    void *ctx;              /* as svc_kafka_record.ctx */
    size_t max_value;       /* the value is cut to this many bytes (x-truncated: its
                               length); 0 = kept whole */
} svc_dead_letter;

#define SVC_PRODUCER_TIMEOUT_MS 30000
#define SVC_PRODUCER_PROPAGATION_MS 5000

typedef struct svc_producer_config {
    const char *brokers;        /* bootstrap.servers */
    const svc_kafka_kv *kafka;  /* pass-through properties, applied after the defaults */
    size_t n_kafka;
    svc_delivery_fn on_delivery; /* required: every produced record reports here */
    void *opaque;                /* borrowed; passed to on_delivery */
    int queue_full_ms;           /* how long produce waits on a full queue; 0: default */
    int close_flush_ms;          /* how long destroy flushes before purging; 0: default */
} svc_producer_config;

/* Create an idempotent producer with one request in flight per connection
 * that never creates a topic (enable.idempotence=true: retries neither
 * duplicate nor reorder; max.in.flight.requests.per.connection=1: in order
 * on any broker; allow.auto.create.topics=false: a request names its reply
 * topic, operators create topics; setting any of them is an error).
 * Defaults linger.ms=0 (tokens go out at once),
 * message.timeout.ms=SVC_PRODUCER_TIMEOUT_MS (a token minutes late is
 * worthless) and topic.metadata.propagation.max.ms=
 * SVC_PRODUCER_PROPAGATION_MS or half the message timeout if less (records
 * for a topic the cluster does not have fail with ERR_TOPIC after this,
 * before they would time out); pass-through properties override them. Returns OK and *out,
 * or ERR_CONFIG naming the property, ERR_NOMEM or ERR_KAFKA (*out NULL).
 * @locality any. */
svc_kafka_status svc_producer_create(const svc_producer_config *cfg, svc_producer **out,
                                     char *err, size_t errlen);

/* Enqueue a record. On OK, r->ctx comes back in exactly one delivery report
 * (success, or failure after librdkafka's retries within message.timeout.ms,
 * or purge at destroy). On error no report comes. A full local queue is
 * waited on up to queue_full_ms (serving delivery reports when called on the
 * delivery-report thread, sleeping otherwise) and then answered
 * ERR_QUEUE_FULL. Other errors: ERR_TOO_LARGE, ERR_FATAL (see
 * svc_producer_fatal), ERR_NOMEM, ERR_KAFKA. @locality any. */
svc_kafka_status svc_producer_produce(svc_producer *p, const svc_kafka_record *r, char *err,
                                      size_t errlen);

/* Send a consumed message that cannot be answered to dl->topic: its key,
 * value and headers, plus x-error-code, x-error-msg, x-original-topic,
 * x-original-partition, x-original-offset (decimal) and x-worker. A value
 * over dl->max_value (or one detach cut) is cut to it, with x-truncated: the
 * original length in decimal; a key and headers together over
 * SVC_DLT_META_MAX are dropped, with x-dropped: their bytes. `orig` may be
 * detached. Returns as svc_producer_produce; dl->ctx reports likewise.
 * `orig` is only read. @locality the thread holding orig. */
svc_kafka_status svc_producer_produce_dlt(svc_producer *p, const svc_dead_letter *dl,
                                          const svc_kafka_msg *orig, char *err, size_t errlen);

/* Serve delivery reports and producer errors, waiting up to timeout_ms for
 * the first. Returns how many events were served. The calling thread becomes
 * the delivery-report thread (one at a time). @locality Kafka thread. */
int svc_producer_poll(svc_producer *p, int timeout_ms);

/* Wait up to timeout_ms for every queued record to be delivered or to fail,
 * serving their reports. Returns OK, or ERR_TIMED_OUT with the number still
 * queued in err. @locality Kafka thread. */
svc_kafka_status svc_producer_flush(svc_producer *p, int timeout_ms, char *err, size_t errlen);

/* Records enqueued and not yet reported. @locality any. */
int svc_producer_queued(svc_producer *p);

/* True once the producer hit a fatal error (idempotence state lost: every
 * further produce fails); err gets the reason. A process-level error: the
 * worker fails its requests and exits for a restart. @locality any. */
bool svc_producer_fatal(svc_producer *p, char *err, size_t errlen);

/* Flush for up to close_flush_ms, purge what is left (its reports say
 * RD_KAFKA_RESP_ERR__PURGE_QUEUE or __PURGE_INFLIGHT), serve the remaining
 * reports so every ctx comes back, and free. NULL is a no-op.
 * @locality Kafka thread, once no other thread produces. */
void svc_producer_destroy(svc_producer *p);

#endif
