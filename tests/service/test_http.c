/* The worker's HTTP server (service/http.c) in-process on a loopback port:
 * routes and status codes, and hostile clients (silent, half a request line,
 * trickling a byte at a time, more connections than slots) that must neither
 * delay a concurrent probe nor hold a connection past SVC_HTTP_DEADLINE_MS. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine.h" /* ml_plan_dtype */
#include "harness.h"
#include "http.h"
#include "metrics.h"

/* What the kubelet allows a probe (timeoutSeconds: 2 in ops/k8s), halved. */
#define PROBE_BUDGET_MS 1000
/* How late past its deadline the loop may close a connection on a loaded
 * machine (sanitizers, shared cores). */
#define CLOSE_SLACK_MS 1000
#define N_SILENT 4
#define N_HALF_LINE 4
#define N_TRICKLE 4
#define TRICKLE_EVERY_MS 100

static svc_health health;

static void health_ok(void)
{
    long long now = svc_now_ms();
    atomic_store(&health.model_loaded, 1);
    atomic_store(&health.consumer_joined, 1);
    atomic_store(&health.draining, 0);
    atomic_store(&health.kafka_heartbeat_ms, now);
    atomic_store(&health.step_heartbeat_ms, now);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    check(fd >= 0, "connect to 127.0.0.1:%d", port);
    return fd;
}

static bool send_text(int fd, const char *s)
{
    size_t n = strlen(s);
    return send(fd, s, n, MSG_NOSIGNAL) == (ssize_t)n;
}

/* Send raw bytes as one request and read the response until the server
 * closes, within PROBE_BUDGET_MS. Returns the status (0: no complete answer);
 * the body goes to body[cap] and the time taken to *ms. */
static int exchange(int port, const char *raw, char *body, size_t cap, long long *ms)
{
    long long t0 = svc_now_ms();
    int fd = connect_to(port);
    static char resp[1 << 17];
    size_t len = 0;
    bool eof = false;
    if (fd >= 0 && send_text(fd, raw)) {
        while (len < sizeof resp - 1) {
            long long left = t0 + PROBE_BUDGET_MS - svc_now_ms();
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (left <= 0 || poll(&pfd, 1, (int)left) != 1)
                break;
            ssize_t r = recv(fd, resp + len, sizeof resp - 1 - len, 0);
            if (r <= 0) {
                eof = r == 0;
                break;
            }
            len += (size_t)r;
        }
    }
    if (fd >= 0)
        close(fd);
    if (ms)
        *ms = svc_now_ms() - t0;
    resp[len] = 0;
    const char *sep = strstr(resp, "\r\n\r\n");
    if (body && cap)
        snprintf(body, cap, "%s", sep ? sep + 4 : "");
    if (!eof || !sep || strncmp(resp, "HTTP/1.1 ", 9))
        return 0;
    /* Content-Length must match what came. */
    const char *cl = strstr(resp, "Content-Length: ");
    if (!cl || (size_t)atol(cl + 16) != strlen(sep + 4))
        return 0;
    return atoi(resp + 9);
}

static int get(int port, const char *path, char *body, size_t cap, long long *ms)
{
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: test\r\n\r\n",
             path);
    return exchange(port, req, body, cap, ms);
}

/* True once the server has closed fd (EOF or reset), waiting up to wait_ms. */
static bool closed_within(int fd, int wait_ms)
{
    long long end = svc_now_ms() + wait_ms;
    for (;;) {
        long long left = end - svc_now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left < 0 || poll(&pfd, 1, (int)left) != 1)
            return false;
        char b[256];
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r <= 0)
            return true;
    }
}

static double dropped_total(void)
{
    svc_buf b;
    svc_buf_init(&b);
    svc_metrics_render(&b);
    const char *name = "\nmllama_http_connections_dropped_total ";
    const char *at = b.data ? strstr(b.data, name) : NULL;
    double v = at ? strtod(at + strlen(name), NULL) : -1;
    svc_buf_deinit(&b);
    return v;
}

static svc_http *start(void)
{
    char err[256] = "";
    svc_http *h = svc_http_start("127.0.0.1:0", &health, err, sizeof err);
    check(h != NULL, "svc_http_start: %s", err);
    return h;
}

/* ---- routes ---------------------------------------------------------------- */

static void test_routes(void)
{
    health_ok();
    svc_http *h = start();
    if (!h)
        return;
    int port = svc_http_port(h);
    char body[1 << 16];
    check(get(port, "/healthz", body, sizeof body, NULL) == 200 && !strcmp(body, "ok\n"),
          "/healthz 200 ok: '%s'", body);
    check(get(port, "/healthz?probe=1", body, sizeof body, NULL) == 200, "a query is ignored");
    check(get(port, "/readyz", body, sizeof body, NULL) == 200 && !strcmp(body, "ready\n"),
          "/readyz 200 ready: '%s'", body);
    check(get(port, "/metrics", body, sizeof body, NULL) == 200 &&
              strstr(body, "# TYPE mllama_http_connections_dropped_total counter"),
          "/metrics lists mllama_http_connections_dropped_total");
    /* The model's weight bytes by dtype, as the worker sets them at load. */
    svc_metrics_set_weight_bytes(ML_PLAN_FP8, 85563801600.0);
    svc_metrics_set_weight_bytes(ML_PLAN_SCALES, 33587200.0);
    svc_metrics_set_weight_bytes(ML_PLAN_DTYPES, 1.0);
    check(get(port, "/metrics", body, sizeof body, NULL) == 200 &&
              strstr(body, "# TYPE mllama_weight_bytes gauge") &&
              strstr(body, "\nmllama_weight_bytes{dtype=\"fp8\"} 85563801600\n") &&
              strstr(body, "\nmllama_weight_bytes{dtype=\"bf16\"} 0\n") &&
              strstr(body, "\nmllama_weight_bytes{dtype=\"scales\"} 33587200\n") &&
              !strstr(body, "dtype=\"?\""),
          "/metrics: mllama_weight_bytes by dtype, an unknown dtype ignored");
    check(get(port, "/nope", body, sizeof body, NULL) == 404, "unknown path 404");
    check(get(port, "/healthzz", body, sizeof body, NULL) == 404, "a longer path is another path");
    check(exchange(port, "GET /healthz HTTP/1.0\n\n", body, sizeof body, NULL) == 200,
          "LF line endings");
    check(exchange(port, "POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", body, sizeof body,
                   NULL) == 405,
          "POST 405");
    check(exchange(port, "hello\r\n\r\n", body, sizeof body, NULL) == 400, "no request line 400");
    check(exchange(port, "GET /healthz\r\n\r\n", body, sizeof body, NULL) == 400, "no version 400");

    /* Headers that never end within SVC_HTTP_HEADER_MAX: 431, not a wait. */
    static char big[SVC_HTTP_HEADER_MAX + 64];
    int n = snprintf(big, sizeof big, "GET /healthz HTTP/1.1\r\nX-Pad: ");
    memset(big + n, 'a', sizeof big - 1 - (size_t)n);
    big[sizeof big - 1] = 0;
    long long ms = 0;
    check(exchange(port, big, body, sizeof body, &ms) == 431, "oversized headers 431");
    check(ms < PROBE_BUDGET_MS, "431 at once (%lld ms)", ms);

    atomic_store(&health.step_heartbeat_ms, svc_now_ms() - 2 * health.watchdog_ms);
    check(get(port, "/healthz", body, sizeof body, NULL) == 503 &&
              !strcmp(body, "stale heartbeat\n"),
          "stale step heartbeat 503: '%s'", body);
    health_ok();
    /* A watched thread busy past stall_ms: named, with what and since when;
     * busy within it, or idle again, is alive. */
    svc_watch_begin(&health.watch[1], "redis blob");
    check(get(port, "/healthz", body, sizeof body, NULL) == 200, "busy within stall_ms: alive");
    atomic_store(&health.watch[1].since_ms, svc_now_ms() - 2 * health.stall_ms);
    check(get(port, "/healthz", body, sizeof body, NULL) == 503 &&
              !strncmp(body, "stalled: prep thread 1 in redis blob for ", 41) &&
              strstr(body, "since unix ms "),
          "stalled prep thread 503: '%s'", body);
    svc_watch_end(&health.watch[1]);
    check(get(port, "/healthz", body, sizeof body, NULL) == 200, "idle again: alive");
    atomic_store(&health.draining, 1);
    check(get(port, "/readyz", body, sizeof body, NULL) == 503 && !strcmp(body, "draining\n"),
          "draining 503: '%s'", body);
    check(get(port, "/healthz", body, sizeof body, NULL) == 200, "draining is alive");
    atomic_store(&health.model_loaded, 0);
    check(get(port, "/healthz", body, sizeof body, NULL) == 503 && !strcmp(body, "loading\n"),
          "loading 503: '%s'", body);
    svc_http_stop(h);
}

/* ---- slow clients --------------------------------------------------------- */

/* Silent, half-line and trickling clients hold connections while probes are
 * answered within PROBE_BUDGET_MS; each stalled connection is closed within
 * CLOSE_SLACK_MS of its deadline, the trickling ones too although they never
 * stop sending (a deadline per connection, not per read). */
static void test_slow_clients(void)
{
    health_ok();
    svc_metrics_reset();
    svc_http *h = start();
    if (!h)
        return;
    int port = svc_http_port(h);
    enum { N = N_SILENT + N_HALF_LINE + N_TRICKLE };
    int fds[N];
    long long t0 = svc_now_ms();
    for (int i = 0; i < N; i++) {
        fds[i] = connect_to(port);
        if (i >= N_SILENT && fds[i] >= 0)
            check(send_text(fds[i], "GET /heal"), "half a request line");
    }

    static const char *const paths[] = {"/healthz", "/readyz", "/metrics"};
    char body[1 << 16];
    for (int round = 0; round < 3; round++) {
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            long long ms = 0;
            int status = get(port, paths[p], body, sizeof body, &ms);
            check(status == 200 && ms < PROBE_BUDGET_MS,
                  "%s beside %d stalled connections: %d in %lld ms", paths[p], N, status, ms);
        }
        sleep_ms(200);
    }

    /* Keep trickling; every stalled connection goes at its deadline. */
    bool closed[N] = {false};
    long long closed_at[N] = {0};
    int open = N;
    long long give_up = t0 + SVC_HTTP_DEADLINE_MS + CLOSE_SLACK_MS;
    while (open > 0 && svc_now_ms() < give_up) {
        for (int i = 0; i < N; i++) {
            if (closed[i] || fds[i] < 0)
                continue;
            if (i >= N_SILENT + N_HALF_LINE)
                send(fds[i], "l", 1, MSG_NOSIGNAL);
            if (closed_within(fds[i], 0)) {
                closed[i] = true;
                closed_at[i] = svc_now_ms() - t0;
                open--;
            }
        }
        sleep_ms(TRICKLE_EVERY_MS / 4);
    }
    for (int i = 0; i < N; i++) {
        const char *kind = i < N_SILENT ? "silent" : i < N_SILENT + N_HALF_LINE ? "half-line"
                                                                              : "trickling";
        check(closed[i], "%s connection %d still open %d ms after its deadline", kind, i,
              CLOSE_SLACK_MS);
        check(!closed[i] || closed_at[i] >= SVC_HTTP_DEADLINE_MS - TRICKLE_EVERY_MS,
              "%s connection %d closed at %lld ms, before its deadline", kind, i, closed_at[i]);
        if (fds[i] >= 0)
            close(fds[i]);
    }
    check(dropped_total() == N, "mllama_http_connections_dropped_total %g, want %d",
          dropped_total(), N);
    svc_http_stop(h);
}

/* More silent connections than slots: the oldest are closed at once to make
 * room, and a probe arriving last is still answered. */
static void test_eviction(void)
{
    health_ok();
    svc_metrics_reset();
    svc_http *h = start();
    if (!h)
        return;
    int port = svc_http_port(h);
    enum { N = SVC_HTTP_CONN_MAX + SVC_HTTP_CONN_MAX / 2 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = connect_to(port);
        /* The listen backlog keeps the connect order, which is the order
         * the loop accepts and evicts in; the pause only keeps the backlog
         * short. */
        sleep_ms(5);
    }
    long long ms = 0;
    char body[256];
    int status = get(port, "/healthz", body, sizeof body, &ms);
    check(status == 200 && ms < PROBE_BUDGET_MS,
          "/healthz beside %d silent connections (%d slots): %d in %lld ms", N,
          SVC_HTTP_CONN_MAX, status, ms);
    int evicted = N - SVC_HTTP_CONN_MAX + 1; /* the probe took one slot too */
    for (int i = 0; i < N; i++) {
        bool gone = closed_within(fds[i], i < evicted ? PROBE_BUDGET_MS : 0);
        check(gone == (i < evicted), "connection %d %s", i,
              i < evicted ? "not evicted" : "evicted, but newer than the probe's victim");
    }
    check(dropped_total() == evicted, "mllama_http_connections_dropped_total %g, want %d",
          dropped_total(), evicted);
    /* Stopping with connections open closes them. */
    svc_http_stop(h);
    for (int i = evicted; i < N; i++)
        check(closed_within(fds[i], PROBE_BUDGET_MS), "connection %d closed by stop", i);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

int main(void)
{
    health.watchdog_ms = 60000; /* before any server reads it */
    health.stall_ms = 60000;
    health.n_watch = 2;
    test_routes();
    test_slow_clients();
    test_eviction();
    return check_done();
}
