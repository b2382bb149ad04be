/* The worker's small HTTP server: /metrics (Prometheus text), /healthz and
 * /readyz (ops/metrics.md). One thread, one connection at a time, short
 * timeouts: scrapes and probes are tiny and must never wait on the model.
 * @locality: svc_http_start/stop on the main thread; the server runs on its
 * own thread. */
#ifndef SVC_HTTP_H
#define SVC_HTTP_H

#include <stdatomic.h>
#include <stddef.h>

/* What the probes read. Written by the worker's threads, read by the HTTP
 * thread; all fields atomic. Heartbeats are CLOCK_MONOTONIC milliseconds. */
typedef struct svc_health {
    atomic_int model_loaded;
    atomic_int consumer_joined;
    atomic_int draining;
    _Atomic long long kafka_heartbeat_ms;
    _Atomic long long step_heartbeat_ms;
    long long watchdog_ms; /* a heartbeat older than this fails /healthz */
} svc_health;

typedef struct svc_http svc_http;

/* Listen on "host:port" ("0.0.0.0:9090"; port 0 picks a free one) and serve
 * until svc_http_stop. health is borrowed and must outlive the server.
 * Returns NULL with a message in err when the address cannot be bound. */
svc_http *svc_http_start(const char *listen, svc_health *health, char *err, size_t errlen);

/* The bound port (useful with port 0). */
int svc_http_port(const svc_http *h);

/* Stop the thread and close the socket. NULL is a no-op. */
void svc_http_stop(svc_http *h);

/* Monotonic milliseconds, the clock of the heartbeats. */
long long svc_now_ms(void);

#endif
