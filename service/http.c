#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "protocol.h"

#define ACCEPT_POLL_MS 200   /* how soon the thread sees a stop */
#define IO_TIMEOUT_MS 2000   /* per request read/write */
#define REQUEST_MAX 4096     /* request line and headers we read */
#define LISTEN_BACKLOG 16

struct svc_http {
    int fd;
    int port;
    svc_health *health;  /* borrowed */
    atomic_int stop;
    pthread_t thread;
    svc_buf body;        /* owned: reused for /metrics */
};

long long svc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            return;
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *reason, const char *type, const char *body,
                    size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, reason, type, len);
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

static int heartbeat_fresh(const svc_health *h, long long now)
{
    return now - atomic_load(&h->kafka_heartbeat_ms) <= h->watchdog_ms &&
           now - atomic_load(&h->step_heartbeat_ms) <= h->watchdog_ms;
}

/* Why the worker is not ready, or NULL when it is (/readyz, mllama_ready). */
static const char *not_ready(svc_health *hl)
{
    return !atomic_load(&hl->model_loaded)    ? "loading\n"
           : atomic_load(&hl->draining)        ? "draining\n"
           : !atomic_load(&hl->consumer_joined) ? "joining\n"
                                                : NULL;
}

/* Route one request; only the request line matters. */
static void serve(svc_http *h, int fd)
{
    char req[REQUEST_MAX + 1];
    size_t got = 0;
    while (got < REQUEST_MAX && !memchr(req, '\n', got)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            return;
        ssize_t r = recv(fd, req + got, REQUEST_MAX - got, 0);
        if (r <= 0)
            return;
        got += (size_t)r;
    }
    req[got] = 0;
    const char *text = "text/plain; charset=utf-8";
    svc_health *hl = h->health;
    if (strncmp(req, "GET ", 4)) {
        respond(fd, 405, "Method Not Allowed", text, "GET only\n", 9);
    } else if (!strncmp(req + 4, "/metrics ", 9) || !strncmp(req + 4, "/metrics?", 9)) {
        svc_metrics_set(SVC_GAUGE_READY, not_ready(hl) ? 0 : 1);
        svc_metrics_render(&h->body);
        respond(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", h->body.data,
                h->body.len);
    } else if (!strncmp(req + 4, "/healthz ", 9)) {
        int loaded = atomic_load(&hl->model_loaded);
        int ok = loaded && heartbeat_fresh(hl, svc_now_ms());
        const char *msg = ok ? "ok\n" : loaded ? "stale heartbeat\n" : "loading\n";
        respond(fd, ok ? 200 : 503, ok ? "OK" : "Service Unavailable", text, msg, strlen(msg));
    } else if (!strncmp(req + 4, "/readyz ", 8)) {
        const char *why = not_ready(hl);
        respond(fd, why ? 503 : 200, why ? "Service Unavailable" : "OK", text,
                why ? why : "ready\n", strlen(why ? why : "ready\n"));
    } else {
        respond(fd, 404, "Not Found", text, "not found\n", 10);
    }
}

static void *run(void *arg)
{
    svc_http *h = arg;
    while (!atomic_load(&h->stop)) {
        struct pollfd pfd = {.fd = h->fd, .events = POLLIN};
        if (poll(&pfd, 1, ACCEPT_POLL_MS) <= 0)
            continue;
        int c = accept(h->fd, NULL, NULL);
        if (c < 0)
            continue;
        serve(h, c);
        close(c);
    }
    return NULL;
}

svc_http *svc_http_start(const char *listen_addr, svc_health *health, char *err, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(listen_addr, ':');
    if (!colon || (size_t)(colon - listen_addr) >= sizeof host) {
        svc_errf(err, errlen, "http.listen: expected host:port, got '%s'", listen_addr);
        return NULL;
    }
    memcpy(host, listen_addr, (size_t)(colon - listen_addr));
    host[colon - listen_addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai = NULL;
    int rc = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai);
    if (rc != 0) {
        svc_errf(err, errlen, "http.listen %s: %s", listen_addr, gai_strerror(rc));
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        svc_errf(err, errlen, "http.listen %s: %s", listen_addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    svc_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        svc_errf(err, errlen, "http: out of memory");
        return NULL;
    }
    h->fd = fd;
    h->health = health;
    svc_buf_init(&h->body);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    if (pthread_create(&h->thread, NULL, run, h) != 0) {
        close(fd);
        free(h);
        svc_errf(err, errlen, "http: cannot start its thread");
        return NULL;
    }
    return h;
}

int svc_http_port(const svc_http *h) { return h->port; }

void svc_http_stop(svc_http *h)
{
    if (!h)
        return;
    atomic_store(&h->stop, 1);
    pthread_join(h->thread, NULL);
    close(h->fd);
    svc_buf_deinit(&h->body);
    free(h);
}
