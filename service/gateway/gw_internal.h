/* What the gateway's files share: the gateway, its requests (one stream
 * each) and its client connections. gateway.c owns the lifecycle, the
 * request table and the metrics; gw_kafka.c the reply reader; gw_http.c the
 * listeners, the connections and the routes; gw_adapters.c the Redis adapter
 * names, listed on a thread of its own that shares only that list (under its
 * lock). Everything else runs on the loop's thread: no locks.
 * @locality: the gateway's thread. */
#ifndef GW_INTERNAL_H
#define GW_INTERNAL_H

#include <event2/event.h>
#include <event2/http.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "gateway/gateway.h"
#include "gateway/gw_auth.h"
#include "gateway/gw_fetch.h"
#include "gateway/gw_stream.h"
#include "kafka/kafka.h"
#include "metrics.h"
#include "util.h"

/* "chatcmpl-" and 32 hex digits: 128 random bits (ids are capabilities:
 * service/protocol/README.md). */
#define GW_ID_PREFIX "chatcmpl-"
#define GW_ID_RANDOM_BYTES 16
#define GW_ID_LEN (sizeof GW_ID_PREFIX - 1 + 2 * GW_ID_RANDOM_BYTES)

/* HTTP error labels of mllama_gateway_http_errors_total kept apart; more
 * (status, code) pairs than this share the last series. */
#define GW_ERROR_SERIES_MAX 64
#define GW_CODE_MAX 48

typedef struct gw_conn gw_conn;
typedef struct gw_req gw_req;
typedef struct gw_adapters gw_adapters;
typedef struct gw_job gw_job;

/* A tenant as the gateway serves it. */
typedef struct gw_tenant {
    const svc_tenant *t;                      /* borrowed from the gateway's config */
    char reply_topic[SVC_TOPIC_NAME_MAX + 1]; /* this instance's */
    gw_bucket bucket;                         /* requests per second */
    int streams;                              /* requests running */
    int fetching;                             /* requests waiting on their image URLs */
    uint64_t requests;                        /* accepted, for the metric */
} gw_tenant;

/* One chat request and its stream, from the produce until gateway.retain_s
 * after its end (or until the retained-bytes budget drops it). */
struct gw_req {
    svc_gateway *g;               /* borrowed: for its timers */
    char id[GW_ID_LEN + 1];
    size_t tenant;                /* index into the gateway's tenants */
    gw_stream *stream;            /* owned */
    size_t bytes;                 /* gw_stream_bytes as last accounted */
    double received_s;            /* svc_now_s at the POST, for the TTFB */
    bool first_byte;              /* the TTFB was observed */
    bool ended;                   /* gw_stream_done, or failed by the gateway */
    long long ended_ms;           /* svc_now_ms at the end */
    int deliveries;               /* produced records without their delivery report:
                                     the request outlives them */
    gw_conn *subs;                /* connections reading it (sub_next list) */
    struct event *abandon;        /* owned: armed while nobody reads a running stream */
    struct event *deadline;       /* owned: the request's deadline, plus a grace */
    gw_req *hnext;                /* the id table's chain */
    gw_req *prev, *next;          /* the running list or the ended FIFO */
};

/* What a connection is doing with a request. */
typedef enum gw_sub_mode {
    GW_SUB_NONE,
    GW_SUB_SSE_PENDING, /* stream: true, no byte sent: a first error can still be a status */
    GW_SUB_SSE,         /* stream: events written as they come */
    GW_SUB_COMPLETION,  /* stream: false: one chat.completion at the end */
} gw_sub_mode;

/* A public connection, from its accept to its close. */
struct gw_conn {
    svc_gateway *g;
    struct bufferevent *bev;           /* one reference held: valid until conn_free */
    struct evhttp_connection *evcon;   /* borrowed; set once a request is dispatched */
    struct evhttp_request *req;        /* borrowed; the request being answered, or NULL */
    struct event *deadline;            /* owned: the whole request must arrive in time */
    gw_conn *hnext;                    /* the bufferevent table's chain */
    gw_req *stream;                    /* borrowed: the request it reads, or NULL */
    gw_conn *sub_next;                 /* the stream's readers */
    gw_sub_mode mode;
    size_t next_event;                 /* the stream's next event to write */
    struct event *keepalive;           /* owned: SSE comments while idle */
    gw_job *job;                       /* owned: its request's image fetches, or NULL */
    bool dispatched;
};

typedef struct gw_metrics {
    uint64_t resumes, continuations, divergences, abandoned, cancels;
    uint64_t fetches[GW_FETCH_N_STATUS]; /* image URLs fetched, by how they ended */
    svc_hist_val ttfb;
    size_t n_errors;
    struct {
        int status;
        char code[GW_CODE_MAX];
        uint64_t n;
    } errors[GW_ERROR_SERIES_MAX];
} gw_metrics;

struct svc_gateway {
    svc_config cfg;                  /* owned copy */
    char model[256];                 /* the base model's public name */
    struct event_base *base;         /* owned */
    struct evhttp *http, *ops;       /* owned: public and probe servers */
    int port, ops_port;
    struct event *signals[4];        /* owned: TERM, INT, HUP, and the end marker */
    struct event *sweep;             /* owned: retention and producer polls */
    gw_keys *keys;                   /* owned; NULL without authentication */
    gw_adapters *adapters;           /* owned: Redis's adapter names; NULL without Redis */
    gw_fetcher *fetcher;             /* owned: image URLs; NULL when gateway.image_fetch is off */
    size_t n_fetching;               /* requests waiting on their image URLs */
    gw_tenant *tenants;              /* owned, cfg.n_tenants */
    size_t n_tenants;
    /* Kafka */
    svc_producer *producer;          /* owned: requests and cancels */
    rd_kafka_t *consumer;            /* owned: the reply topics, assigned */
    rd_kafka_queue_t *replies;       /* owned: its queue, which wakes the loop */
    int wake[2];                     /* the queue's pipe: read end in the loop */
    struct event *wake_ev;           /* owned */
    int exit_code;                   /* set when the loop stops for a fatal error */
    /* the drain (SIGTERM, SIGINT): no new requests, running streams end */
    bool draining;
    long long drain_deadline_ms;     /* svc_now_ms past which what runs is ended */
    bool drain_expired;              /* the grace passed: the rest were ended */
    /* requests */
    gw_req **table;                  /* owned buckets: id -> request */
    size_t table_mask;
    gw_req *running_head;            /* running requests, any order */
    gw_req *ended_head, *ended_tail; /* ended ones, oldest first */
    size_t n_running, n_ended;
    size_t retained_bytes;
    /* connections */
    gw_conn **conns;                 /* owned buckets: bufferevent -> connection */
    size_t conns_mask;
    size_t n_conns;
    size_t n_answering;              /* connections with a request dispatched, not closed */
    gw_metrics m;
};

/* ---- gateway.c ---------------------------------------------------------------- */

/* The tenant named `name`, or -1. */
int gw_tenant_index(const svc_gateway *g, const char *name);

/* Produce a chat request (the rewritten body) for tenant `tenant` under a
 * fresh id and register it. Returns the request (owned by the gateway) or
 * NULL with an error code (gw_http_status_of) and a message. Its delivery
 * report (gw_kafka.c) fails it when the record is lost. */
gw_req *gw_request_start(svc_gateway *g, size_t tenant, const char *body, size_t len,
                         const gw_stream_params *params, int64_t deadline_ms, const char **code,
                         char *msg, size_t msglen);
gw_req *gw_request_find(svc_gateway *g, const char *id, size_t len);
/* After records were fed to r's stream: account its bytes, write its new
 * events to its readers, end it when done. */
void gw_request_progress(svc_gateway *g, gw_req *r);
/* End a running request from the gateway's side (gw_stream_fail). */
void gw_request_fail(svc_gateway *g, gw_req *r, const char *code, const char *message);
/* Produce a cancel for the request (key = id) to its tenant's cancel topic. */
void gw_request_cancel(svc_gateway *g, gw_req *r);
/* A reader attached or left; with none left on a running request the
 * abandon timer runs. */
void gw_request_readers_changed(svc_gateway *g, gw_req *r);
/* Make room under gateway.max_retained_bytes: forget the oldest ended
 * requests nobody reads. Returns whether the retained bytes are under it. */
bool gw_retained_room(svc_gateway *g);
/* A random 53-bit integer (the range the worker's seed takes exactly). */
int64_t gw_random_seed(void);

/* ---- gw_kafka.c --------------------------------------------------------------- */

/* The producer, the reply reader assigned and wired into the loop, the reply
 * topics created first when gateway.create_reply_topics. Returns 0 or -1
 * with err. */
int gw_kafka_start(svc_gateway *g, char *err, size_t errlen);
/* Whether the reply topics are assigned and the producer is healthy. */
bool gw_ready(const svc_gateway *g);

/* ---- gw_adapters.c ------------------------------------------------------------- */

/* Start listing the adapters stored in Redis (redis.url; "" = none: *out
 * NULL) on a thread of their own, the first listing at once. Returns 0, or
 * -1 with err (a bad redis.url). */
int gw_adapters_create(const svc_config *c, gw_adapters **out, char *err, size_t errlen);
/* Stop the thread (within one redis.call_timeout_ms) and free. NULL is a no-op. */
void gw_adapters_destroy(gw_adapters *a);
/* fn(ctx, name) for each name of the last listing, sorted, under the list's
 * lock (fn must be quick and must not call back). NULL a: none. */
void gw_adapters_each(gw_adapters *a, void (*fn)(void *ctx, const char *name), void *ctx);

/* ---- gw_routes.c --------------------------------------------------------------- */

/* Answer c's request (c->req, dispatched): the route its method and path name. */
void gw_route(gw_conn *c);
/* c is closing: stop its request's image fetches (c->job) without answering. */
void gw_job_abort(gw_conn *c);

/* ---- gw_http.c ---------------------------------------------------------------- */

/* Bind both listeners (gateway.listen, http.listen). Returns 0 or -1 with err. */
int gw_http_start(svc_gateway *g, char *err, size_t errlen);
/* Close every connection and both servers. */
void gw_http_stop(svc_gateway *g);
/* New events (or the end) on r: write them to its readers. */
void gw_http_deliver(svc_gateway *g, gw_req *r);
/* r is being forgotten: close its readers' answers. */
void gw_http_drop_readers(svc_gateway *g, gw_req *r);
/* The first content byte of a request reached its client this long after
 * the request arrived. */
void gw_observe_ttfb(svc_gateway *g, double seconds);
/* Count an HTTP error answer in mllama_gateway_http_errors_total. */
void gw_count_error(svc_gateway *g, int status, const char *code);
/* The gateway's /metrics page. */
void gw_metrics_render(svc_gateway *g, svc_buf *b);
/* Answer c's request with body (application/json unless type says
 * otherwise) and status, closing the connection after it: c may be gone
 * after this. */
void gw_send_body(gw_conn *c, int status, const char *type, const void *body, size_t len);
/* Answer with an OpenAI error object, the status of its code
 * (gw_http_status_of); retry_after_s > 0 adds Retry-After. As gw_send_body. */
void gw_send_error(gw_conn *c, const char *code, const char *message, double retry_after_s);
/* c reads r from event next_event on, as `mode`. */
void gw_attach(gw_conn *c, gw_req *r, gw_sub_mode mode, size_t next_event);
/* Send the SSE headers of c's stream (200). */
void gw_start_sse(gw_conn *c);
/* Write what c's stream has that c has not sent, under the write watermark;
 * end the answer once the stream is done and sent. */
void gw_pump(gw_conn *c);
/* (Re)arm c's keep-alive comment, gateway.keepalive_s from now. */
void gw_arm_keepalive(gw_conn *c);

#endif
