/* The worker's small HTTP server: /metrics (Prometheus text), /healthz and
 * /readyz (ops/metrics.md). One thread runs a poll() loop over at most
 * SVC_HTTP_CONN_MAX connections at once, each with its own buffers and a total
 * deadline, so a slow or silent client holds one slot for a bounded time and
 * never delays a probe: scrapes and probes are tiny and must never wait on the
 * model, nor on each other.
 * @locality: svc_http_start/stop on the main thread; the server runs on its
 * own thread; svc_http_parse_request on any thread. */
#ifndef SVC_HTTP_H
#define SVC_HTTP_H

#include <stdatomic.h>
#include <stddef.h>

#include "util.h"

/* A connection gets this long from accept to the last byte of its response:
 * reading the request, writing the answer and the close. A client that has
 * not finished by then is dropped. Probes and scrapes take milliseconds; the
 * Kubernetes probes time out after 2 s (ops/k8s/deployment.yaml). */
#define SVC_HTTP_DEADLINE_MS 3000
/* Connections served at once. One more evicts the oldest (see http.c). */
#define SVC_HTTP_CONN_MAX 16
/* Request line and headers; a request that has not ended its headers within
 * this many bytes is answered 431. */
#define SVC_HTTP_HEADER_MAX 4096

/* Threads whose work is watched (svc_watch): the prep pool's, at most
 * SVC_PREP_THREADS_MAX (config.h). */
#define SVC_HEALTH_WATCH_MAX 64

/* A watched thread: what it is doing and since when, so a thread held by a
 * call that never returns (a resolver, a kernel read) is seen from outside.
 * Written by its thread (svc_watch_begin/end), read by the HTTP thread. */
typedef struct svc_watch {
    _Atomic long long since_ms;     /* CLOCK_MONOTONIC ms the work began; 0 = idle */
    _Atomic long long since_wall_ms; /* the same instant, unix ms, for the answer */
    _Atomic(const char *) doing;    /* a static string: "prepare", "redis attempts", ... */
} svc_watch;

/* What the probes read. Written by the worker's threads, read by the HTTP
 * thread; all fields atomic. Heartbeats are CLOCK_MONOTONIC milliseconds. */
typedef struct svc_health {
    atomic_int model_loaded;
    atomic_int consumer_joined;
    atomic_int draining;
    _Atomic long long kafka_heartbeat_ms;
    _Atomic long long step_heartbeat_ms;
    long long watchdog_ms; /* a heartbeat older than this fails /healthz */
    /* Watched threads (the prep pool): one busy longer than stall_ms fails
     * /healthz, which names it, what it does and since when. Set before
     * the server starts. */
    svc_watch watch[SVC_HEALTH_WATCH_MAX];
    int n_watch;
    long long stall_ms;
} svc_health;

/* Thread-side bookkeeping of a svc_watch. begin marks the thread busy with
 * `doing` (a string that outlives the process: a literal) from now; a
 * second begin while busy only changes `doing`, so one job's phases keep
 * the job's start. end marks it idle. @locality the watched thread. */
void svc_watch_begin(svc_watch *w, const char *doing);
void svc_watch_end(svc_watch *w);

/* What the bytes received so far on a connection ask for. */
typedef enum svc_http_route {
    SVC_HTTP_INCOMPLETE,  /* no blank line ending the headers yet: read more */
    SVC_HTTP_TOO_LARGE,   /* SVC_HTTP_HEADER_MAX bytes and the headers go on: 431 */
    SVC_HTTP_BAD_REQUEST, /* the request line is not "METHOD SP target SP HTTP/...": 400 */
    SVC_HTTP_NOT_GET,     /* 405 */
    SVC_HTTP_METRICS,
    SVC_HTTP_HEALTHZ,
    SVC_HTTP_READYZ,
    SVC_HTTP_NOT_FOUND,   /* 404 */
} svc_http_route;

/* Route a request from the first len bytes received on a connection (any
 * bytes, no terminator needed). Only the request line is interpreted: the
 * headers are skipped, a query string is ignored, a body is never read (no
 * route takes one). Lines end in CRLF or LF. Once a prefix of the input
 * routes to something other than SVC_HTTP_INCOMPLETE, every longer input
 * routes the same. */
svc_http_route svc_http_parse_request(const char *buf, size_t len);

typedef struct svc_http svc_http;

/* Listen on "host:port" ("0.0.0.0:9090"; port 0 picks a free one) and serve
 * until svc_http_stop. health is borrowed and must outlive the server.
 * Returns NULL with a message in err when the address cannot be bound. */
svc_http *svc_http_start(const char *listen, svc_health *health, char *err, size_t errlen);

/* The bound port (useful with port 0). */
int svc_http_port(const svc_http *h);

/* Stop the thread, close every connection and the socket. NULL is a no-op. */
void svc_http_stop(svc_http *h);


#endif
