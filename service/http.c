/* The worker's HTTP server (http.h). One thread, one poll() loop over the
 * listening socket and up to SVC_HTTP_CONN_MAX non-blocking connections. Each
 * connection owns its request buffer, its response and its deadline, so the
 * loop never waits on any one client: a silent or trickling client only holds
 * its own slot, and only until SVC_HTTP_DEADLINE_MS after it connected. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

#define STOP_POLL_MS 200 /* how soon the thread sees a stop */
#define LISTEN_BACKLOG 16
#define DRAIN_CHUNK 512 /* input read and discarded per wake-up after the response */
/* How long the listening socket is left alone after accept found no file
 * descriptor or memory: it stays readable, and polling it again at once
 * would spin the thread until something else frees one. */
#define ACCEPT_BACKOFF_MS 100

typedef enum conn_state {
    CONN_FREE,    /* slot unused; fd is -1 */
    CONN_READING, /* reading the request line and headers into req */
    CONN_WRITING, /* sending out.data[sent..out.len) */
    CONN_CLOSING, /* answered, write side shut: discarding input until the client closes */
} conn_state;

typedef struct http_conn {
    conn_state state;
    int fd;                 /* owned while state != CONN_FREE */
    unsigned long long seq; /* accept order: the lowest is evicted first */
    long long deadline_ms;  /* accept time + SVC_HTTP_DEADLINE_MS */
    size_t got;
    char req[SVC_HTTP_HEADER_MAX];
    svc_buf out; /* owned: the whole response; its storage is kept for the next connection */
    size_t sent;
} http_conn;

struct svc_http {
    int fd;
    int port;
    svc_health *health; /* borrowed */
    atomic_int stop;
    pthread_t thread;
    svc_buf body; /* owned: /metrics is rendered here, then copied into a response */
    unsigned long long accepted; /* connections accepted so far */
    long long accept_after_ms;   /* accept paused until then (ACCEPT_BACKOFF_MS) */
    http_conn conns[SVC_HTTP_CONN_MAX];
};

/* ---- Request parsing ------------------------------------------------------ */

/* Length of the header block (through its blank line) in b[0..len), or 0 when
 * the blank line has not arrived. */
static size_t header_end(const char *b, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (b[i] != '\n')
            continue;
        if (b[i + 1] == '\n')
            return i + 2;
        if (b[i + 1] == '\r' && i + 2 < len && b[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* @locality any thread. */
svc_http_route svc_http_parse_request(const char *buf, size_t len)
{
    if (len > SVC_HTTP_HEADER_MAX)
        len = SVC_HTTP_HEADER_MAX;
    size_t end = header_end(buf, len);
    if (!end)
        return len == SVC_HTTP_HEADER_MAX ? SVC_HTTP_TOO_LARGE : SVC_HTTP_INCOMPLETE;
    /* The request line: the block's first line, without its CR. */
    size_t n = (size_t)((const char *)memchr(buf, '\n', end) - buf);
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    const char *sp1 = memchr(buf, ' ', n);
    if (!sp1 || sp1 == buf)
        return SVC_HTTP_BAD_REQUEST;
    const char *target = sp1 + 1;
    const char *sp2 = memchr(target, ' ', n - (size_t)(target - buf));
    const char *version = sp2 ? sp2 + 1 : NULL;
    if (!sp2 || sp2 == target || (size_t)(buf + n - version) < 5 || memcmp(version, "HTTP/", 5))
        return SVC_HTTP_BAD_REQUEST;
    if (sp1 - buf != 3 || memcmp(buf, "GET", 3))
        return SVC_HTTP_NOT_GET;
    size_t path_len = (size_t)(sp2 - target);
    const char *query = memchr(target, '?', path_len);
    if (query)
        path_len = (size_t)(query - target);
    static const struct {
        const char *path;
        svc_http_route route;
    } routes[] = {
        {"/metrics", SVC_HTTP_METRICS},
        {"/healthz", SVC_HTTP_HEALTHZ},
        {"/readyz", SVC_HTTP_READYZ},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strlen(routes[i].path) == path_len && !memcmp(target, routes[i].path, path_len))
            return routes[i].route;
    return SVC_HTTP_NOT_FOUND;
}

/* ---- Answers -------------------------------------------------------------- */

static int heartbeat_fresh(const svc_health *h, long long now)
{
    return now - atomic_load(&h->kafka_heartbeat_ms) <= h->watchdog_ms &&
           now - atomic_load(&h->step_heartbeat_ms) <= h->watchdog_ms;
}

void svc_watch_begin(svc_watch *w, const char *doing)
{
    atomic_store(&w->doing, doing);
    if (atomic_load(&w->since_ms) == 0) {
        atomic_store(&w->since_wall_ms, svc_wall_ms());
        atomic_store(&w->since_ms, svc_now_ms());
    }
}

void svc_watch_end(svc_watch *w) { atomic_store(&w->since_ms, 0); }

/* The first watched thread busy longer than stall_ms, written into why
 * ("stalled: prep thread 2 in redis attempts for 4100 ms, since unix ms
 * ...\n"); false when none is. @locality HTTP thread. */
static bool stalled(svc_health *h, long long now, char *why, size_t n)
{
    for (int i = 0; i < h->n_watch; i++) {
        svc_watch *w = &h->watch[i];
        long long since = atomic_load(&w->since_ms);
        if (since == 0 || now - since <= h->stall_ms)
            continue;
        const char *doing = atomic_load(&w->doing);
        snprintf(why, n, "stalled: prep thread %d in %s for %lld ms, since unix ms %lld\n", i,
                 doing ? doing : "?", now - since, atomic_load(&w->since_wall_ms));
        return true;
    }
    return false;
}

/* Why the worker is not ready, or NULL when it is (/readyz, mllama_ready). */
static const char *not_ready(svc_health *hl)
{
    return !atomic_load(&hl->model_loaded)    ? "loading\n"
           : atomic_load(&hl->draining)        ? "draining\n"
           : !atomic_load(&hl->consumer_joined) ? "joining\n"
                                                : NULL;
}

/* Put the whole response into c->out. Returns false when out of memory.
 * @locality HTTP thread. */
static bool respond(http_conn *c, int status, const char *reason, const char *type,
                    const char *body, size_t len)
{
    c->out.len = 0;
    c->sent = 0;
    return svc_buf_printf(&c->out,
                          "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                          "Connection: close\r\n\r\n%.*s",
                          status, reason, type, len, (int)len, body) == 0;
}

/* A plain-text answer; msg is a NUL-terminated line. @locality HTTP thread. */
static bool respond_text(http_conn *c, int status, const char *reason, const char *msg)
{
    return respond(c, status, reason, "text/plain; charset=utf-8", msg, strlen(msg));
}

/* The response to a routed request. @locality HTTP thread. */
static bool answer(svc_http *h, http_conn *c, svc_http_route route)
{
    svc_health *hl = h->health;
    switch (route) {
    case SVC_HTTP_METRICS:
        svc_metrics_set(SVC_GAUGE_READY, not_ready(hl) ? 0 : 1);
        svc_metrics_render(&h->body);
        return respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", h->body.data,
                       h->body.len);
    case SVC_HTTP_HEALTHZ: {
        int loaded = atomic_load(&hl->model_loaded);
        long long now = svc_now_ms();
        char why[160];
        if (loaded && stalled(hl, now, why, sizeof why))
            return respond_text(c, 503, "Service Unavailable", why);
        int ok = loaded && heartbeat_fresh(hl, now);
        return ok       ? respond_text(c, 200, "OK", "ok\n")
               : loaded ? respond_text(c, 503, "Service Unavailable", "stale heartbeat\n")
                        : respond_text(c, 503, "Service Unavailable", "loading\n");
    }
    case SVC_HTTP_READYZ: {
        const char *why = not_ready(hl);
        return why ? respond_text(c, 503, "Service Unavailable", why)
                   : respond_text(c, 200, "OK", "ready\n");
    }
    case SVC_HTTP_NOT_FOUND:
        return respond_text(c, 404, "Not Found", "not found\n");
    case SVC_HTTP_NOT_GET:
        return respond_text(c, 405, "Method Not Allowed", "GET only\n");
    case SVC_HTTP_TOO_LARGE:
        return respond_text(c, 431, "Request Header Fields Too Large", "headers too large\n");
    case SVC_HTTP_BAD_REQUEST:
    case SVC_HTTP_INCOMPLETE: /* never answered: the caller reads on */
        break;
    }
    return respond_text(c, 400, "Bad Request", "bad request\n");
}

/* ---- Connections ---------------------------------------------------------- */

/* Free the slot. unanswered: the client never got its response because of the
 * server (deadline, eviction, out of memory), counted in
 * mllama_http_connections_dropped_total; a client that hung up is not.
 * @locality HTTP thread (and svc_http_stop once the thread has ended). */
static void conn_close(http_conn *c, bool unanswered)
{
    close(c->fd);
    c->fd = -1;
    c->state = CONN_FREE;
    if (unanswered)
        svc_metrics_add(SVC_COUNTER_HTTP_CONNECTIONS_DROPPED, 1);
}

/* Send what the socket takes now; once the response is out, shut the write
 * side and wait for the client to close, so that closing with its unread
 * input (a body, a pipelined request) cannot reset the connection before the
 * response is read. @locality HTTP thread. */
static void conn_write(http_conn *c)
{
    while (c->sent < c->out.len) {
        ssize_t w = send(c->fd, c->out.data + c->sent, c->out.len - c->sent, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (w <= 0) {
            conn_close(c, false);
            return;
        }
        c->sent += (size_t)w;
    }
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_CLOSING;
}

/* Read what has arrived; answer once the headers are complete.
 * @locality HTTP thread. */
static void conn_read(svc_http *h, http_conn *c)
{
    ssize_t r = recv(c->fd, c->req + c->got, sizeof c->req - c->got, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (r <= 0) {
        conn_close(c, false);
        return;
    }
    c->got += (size_t)r;
    svc_http_route route = svc_http_parse_request(c->req, c->got);
    if (route == SVC_HTTP_INCOMPLETE)
        return;
    if (!answer(h, c, route)) {
        conn_close(c, true);
        return;
    }
    c->state = CONN_WRITING;
    conn_write(c);
}

/* Discard input after the response until the client closes.
 * @locality HTTP thread. */
static void conn_discard(http_conn *c)
{
    char sink[DRAIN_CHUNK];
    ssize_t r = recv(c->fd, sink, sizeof sink, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        conn_close(c, false);
}

/* Take one pending connection. With every slot busy the oldest connection is
 * closed for it: refusing the newcomer instead would let SVC_HTTP_CONN_MAX
 * silent clients, reopened every deadline, fail every probe. A prober sends
 * its request as soon as it connects and is answered in the first loop round
 * after it arrives; only SVC_HTTP_CONN_MAX - 1 newer connections, one
 * accepted per round, push it out before that.
 * @locality HTTP thread. */
static void accept_one(svc_http *h, long long now)
{
    int fd = accept(h->fd, NULL, NULL);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            h->accept_after_ms = now + ACCEPT_BACKOFF_MS;
        return;
    }
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
        close(fd);
        return;
    }
    http_conn *slot = NULL;
    for (int i = 0; i < SVC_HTTP_CONN_MAX; i++) {
        http_conn *c = &h->conns[i];
        if (c->state == CONN_FREE) {
            slot = c;
            break;
        }
        if (!slot || c->seq < slot->seq)
            slot = c;
    }
    if (slot->state != CONN_FREE)
        conn_close(slot, slot->state != CONN_CLOSING);
    slot->state = CONN_READING;
    slot->fd = fd;
    slot->seq = h->accepted++;
    slot->deadline_ms = now + SVC_HTTP_DEADLINE_MS;
    slot->got = 0;
}

/* ---- The loop ------------------------------------------------------------- */

/* @locality HTTP thread. */
static void *run(void *arg)
{
    svc_http *h = arg;
    struct pollfd pfds[1 + SVC_HTTP_CONN_MAX];
    http_conn *polled[1 + SVC_HTTP_CONN_MAX];
    while (!atomic_load(&h->stop)) {
        long long now = svc_now_ms();
        long long timeout = STOP_POLL_MS;
        nfds_t n = 0;
        /* A negative fd is skipped by poll: accepting is paused. */
        bool accepting = now >= h->accept_after_ms;
        if (!accepting && h->accept_after_ms - now < timeout)
            timeout = h->accept_after_ms - now;
        pfds[n++] = (struct pollfd){.fd = accepting ? h->fd : -1, .events = POLLIN};
        for (int i = 0; i < SVC_HTTP_CONN_MAX; i++) {
            http_conn *c = &h->conns[i];
            if (c->state == CONN_FREE)
                continue;
            long long left = c->deadline_ms - now;
            if (left < timeout)
                timeout = left > 0 ? left : 0;
            polled[n] = c;
            pfds[n++] = (struct pollfd){.fd = c->fd,
                                        .events = c->state == CONN_WRITING ? POLLOUT : POLLIN};
        }
        if (poll(pfds, n, (int)timeout) < 0)
            continue;
        /* Existing connections first: a slot freed or reused below must not
         * receive another socket's events. */
        for (nfds_t k = 1; k < n; k++) {
            http_conn *c = polled[k];
            if (!pfds[k].revents)
                continue;
            if (c->state == CONN_READING)
                conn_read(h, c);
            else if (c->state == CONN_WRITING)
                conn_write(c);
            else
                conn_discard(c);
        }
        now = svc_now_ms();
        for (int i = 0; i < SVC_HTTP_CONN_MAX; i++) {
            http_conn *c = &h->conns[i];
            if (c->state != CONN_FREE && now >= c->deadline_ms)
                conn_close(c, c->state != CONN_CLOSING);
        }
        if (pfds[0].revents & POLLIN)
            accept_one(h, now);
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
    /* Non-blocking, so an accept after a client gave up never stalls the loop. */
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
    for (int i = 0; i < SVC_HTTP_CONN_MAX; i++) {
        h->conns[i].state = CONN_FREE;
        h->conns[i].fd = -1;
        svc_buf_init(&h->conns[i].out);
    }
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
    for (int i = 0; i < SVC_HTTP_CONN_MAX; i++) {
        http_conn *c = &h->conns[i];
        if (c->state != CONN_FREE)
            conn_close(c, false);
        svc_buf_deinit(&c->out);
    }
    close(h->fd);
    svc_buf_deinit(&h->body);
    free(h);
}
