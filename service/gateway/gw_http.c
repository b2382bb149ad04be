/* The gateway's HTTP side (gw_internal.h): both listeners, the public
 * connections with their whole-request deadline, answers, and writing a
 * stream's events to its readers under each connection's write watermark
 * (the routes are gw_routes.c).
 *
 * libevent's evhttp parses HTTP; the limits it enforces before a body is read
 * whole are set here (body and header sizes). What it does not enforce is a
 * total deadline on a request's arrival (its timeouts are per read, which a
 * client sending a byte now and then never trips), so each connection gets a
 * timer from its accept to its request's dispatch: past
 * gateway.header_timeout_ms its socket is shut down and evhttp closes it.
 * Every public answer closes its connection ("Connection: close"), so that
 * deadline covers every request a connection carries.
 * @locality: the gateway's thread. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/gw_internal.h"
#include "http.h"

/* Request line and headers at most: an API call's are a few hundred bytes. */
#define HEADERS_MAX (16u << 10)
/* Buckets of the connection table (a power of two). */
#define CONN_BUCKETS 16384
/* A connection shut down for its deadline is looked at again after this, to
 * free it once evhttp has closed it. */
#define REAP_MS 1000
/* Probe answers: the probe listener's per-connection timeout. */
#define OPS_TIMEOUT_S (SVC_HTTP_DEADLINE_MS / 1000)
static const char keepalive_comment[] = ": keep-alive\n\n";

/* ---- answers -------------------------------------------------------------------- */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Internal Server Error";
    }
}

/* Send body (application/json unless type says otherwise) with status. The
 * connection closes once it is written: c may be gone after this. */
void gw_send_body(gw_conn *c, int status, const char *type, const void *body, size_t len)
{
    struct evhttp_request *req = c->req;
    c->req = NULL;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", type ? type : "application/json");
    evhttp_add_header(h, "Connection", "close");
    struct evbuffer *buf = evbuffer_new();
    if (buf)
        evbuffer_add(buf, body, len);
    evhttp_send_reply(req, status, reason(status), buf);
    if (buf)
        evbuffer_free(buf);
}

/* An OpenAI error object, with the status of its code (gw_http_status_of);
 * retry_after_s > 0 adds Retry-After. c may be gone after this. */
void gw_send_error(gw_conn *c, const char *code, const char *message, double retry_after_s)
{
    int status = gw_http_status_of(code);
    gw_count_error(c->g, status, code);
    struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);
    if (retry_after_s > 0) {
        char secs[24];
        snprintf(secs, sizeof secs, "%.0f", ceil(retry_after_s));
        evhttp_add_header(h, "Retry-After", secs);
    }
    if (status == 401)
        evhttp_add_header(h, "WWW-Authenticate", "Bearer");
    svc_buf body = {0};
    if (gw_error_body(&body, code, message)) {
        evhttp_send_error(c->req, 500, reason(500));
        c->req = NULL;
        return;
    }
    gw_send_body(c, status, NULL, body.data, body.len);
    svc_buf_deinit(&body);
}

/* ---- the connection table --------------------------------------------------------- */

static size_t ptr_hash(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    return (size_t)((x >> 4) ^ (x >> 16));
}

static gw_conn *conn_find(svc_gateway *g, const struct bufferevent *bev)
{
    for (gw_conn *c = g->conns[ptr_hash(bev) & g->conns_mask]; c; c = c->hnext)
        if (c->bev == bev)
            return c;
    return NULL;
}

static void detach(gw_conn *c);
static void on_keepalive(evutil_socket_t fd, short what, void *arg);

static void conn_free(gw_conn *c)
{
    svc_gateway *g = c->g;
    detach(c);
    gw_job_abort(c);
    gw_conn **at = &g->conns[ptr_hash(c->bev) & g->conns_mask];
    while (*at != c)
        at = &(*at)->hnext;
    *at = c->hnext;
    g->n_conns--;
    if (c->dispatched)
        g->n_answering--;
    event_free(c->deadline);
    event_free(c->keepalive);
    bufferevent_decref(c->bev);
    free(c);
}

/* evhttp closed the connection: the client left, or its answer is complete.
 * A request whose answer had not ended is then either still queued on the
 * connection (evhttp frees it after this) or, when the client left
 * mid-answer, already detached from it (evhttp_request_get_connection is
 * NULL) and left to the answer's owner to free. */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    gw_conn *c = arg;
    if (c->req && !evhttp_request_get_connection(c->req))
        evhttp_request_free(c->req);
    c->req = NULL;
    conn_free(c);
}

/* The request did not arrive whole in time (or the connection is one too
 * many): shut the socket down, and evhttp closes the connection on the
 * end-of-file it then reads. Also frees a connection evhttp closed before
 * any request of it was dispatched (its callbacks are gone then). */
static void on_conn_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    gw_conn *c = arg;
    bufferevent_data_cb readcb = NULL;
    bufferevent_getcb(c->bev, &readcb, NULL, NULL, NULL);
    if (!readcb) {
        conn_free(c);
        return;
    }
    if (c->dispatched)
        return;
    gw_count_error(c->g, 408, "request_timeout");
    shutdown(bufferevent_getfd(c->bev), SHUT_RDWR);
    struct timeval tv = {REAP_MS / 1000, (REAP_MS % 1000) * 1000};
    event_add(c->deadline, &tv);
}

/* evhttp's hook for a new connection's bufferevent: the one place a
 * connection is seen before its request arrives. */
static struct bufferevent *on_accept(struct event_base *base, void *arg)
{
    svc_gateway *g = arg;
    gw_conn *c = calloc(1, sizeof *c);
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (c) {
        c->deadline = evtimer_new(base, on_conn_deadline, c);
        c->keepalive = evtimer_new(base, on_keepalive, c);
    }
    if (!c || !bev || !c->deadline || !c->keepalive) {
        if (c && c->deadline)
            event_free(c->deadline);
        if (c && c->keepalive)
            event_free(c->keepalive);
        free(c);
        return bev; /* served without a deadline: memory is short anyway */
    }
    c->g = g;
    c->bev = bev;
    bufferevent_incref(bev);
    gw_conn **bucket = &g->conns[ptr_hash(bev) & g->conns_mask];
    c->hnext = *bucket;
    *bucket = c;
    g->n_conns++;
    /* One over gateway.max_connections is closed at once. */
    int ms = g->n_conns > (size_t)g->cfg.gateway.max_connections ? 0
                                                                : g->cfg.gateway.header_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(c->deadline, &tv);
    return bev;
}

/* ---- writing a stream --------------------------------------------------------------- */

static void on_chunk_sent(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    gw_pump(arg);
}

void gw_arm_keepalive(gw_conn *c)
{
    struct timeval tv = {c->g->cfg.gateway.keepalive_s, 0};
    event_add(c->keepalive, &tv);
}

void gw_start_sse(gw_conn *c)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Accel-Buffering", "no");
    evhttp_add_header(h, "X-Request-Id", c->stream->id);
    evhttp_add_header(h, "Connection", "close");
    evhttp_send_reply_start(c->req, 200, "OK");
    c->mode = GW_SUB_SSE;
    gw_arm_keepalive(c);
}

/* A stream waited on for gateway.keepalive_s without an event: a comment
 * keeps proxies from closing it (and sends the headers of one that has
 * none yet, so the client has its X-Request-Id). */
static void on_keepalive(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    gw_conn *c = arg;
    if (!c->req || !c->stream)
        return;
    if (c->mode == GW_SUB_SSE_PENDING)
        gw_start_sse(c);
    struct evbuffer *buf = evbuffer_new();
    if (buf) {
        evbuffer_add(buf, keepalive_comment, sizeof keepalive_comment - 1);
        evhttp_send_reply_chunk_with_cb(c->req, buf, on_chunk_sent, c);
        evbuffer_free(buf);
    }
    gw_arm_keepalive(c);
}

static void detach(gw_conn *c)
{
    gw_req *r = c->stream;
    if (!r)
        return;
    gw_conn **at = &r->subs;
    while (*at != c)
        at = &(*at)->sub_next;
    *at = c->sub_next;
    c->sub_next = NULL;
    c->stream = NULL;
    c->mode = GW_SUB_NONE;
    event_del(c->keepalive);
    gw_request_readers_changed(c->g, r);
}

void gw_attach(gw_conn *c, gw_req *r, gw_sub_mode mode, size_t next_event)
{
    c->stream = r;
    c->mode = mode;
    c->next_event = next_event;
    c->sub_next = r->subs;
    r->subs = c;
    gw_request_readers_changed(c->g, r);
}

static size_t unsent(const gw_conn *c)
{
    return evbuffer_get_length(bufferevent_get_output(c->bev));
}

/* Write what the connection's stream has that it has not sent, up to the
 * write watermark (the rest when the chunk drains), and end the answer once
 * the stream is done and all of it is sent. */
void gw_pump(gw_conn *c)
{
    gw_req *r = c->stream;
    if (!r || !c->req)
        return;
    svc_gateway *g = c->g;
    size_t n = gw_stream_n_events(r->stream);
    bool done = gw_stream_done(r->stream);
    if (c->mode == GW_SUB_COMPLETION || (c->mode == GW_SUB_SSE_PENDING && done)) {
        if (!done)
            return;
        svc_buf out = {0};
        int status = 500;
        int rc = gw_stream_completion(r->stream, &out, &status);
        if (c->mode == GW_SUB_SSE_PENDING && !rc && status == 200) {
            gw_start_sse(c); /* a whole stream at once: written below */
        } else {
            detach(c);
            if (rc) {
                gw_send_error(c, "internal", "out of memory", 0);
            } else {
                if (status != 200) {
                    const cJSON *code = NULL;
                    cJSON *e = cJSON_ParseWithLength(out.data, out.len);
                    code = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "code");
                    gw_count_error(g, status, cJSON_IsString(code) ? code->valuestring : "error");
                    cJSON_Delete(e);
                } else if (!r->first_byte) {
                    r->first_byte = true;
                    gw_observe_ttfb(g, svc_now_s() - r->received_s);
                }
                evhttp_add_header(evhttp_request_get_output_headers(c->req), "X-Request-Id",
                                  r->id);
                gw_send_body(c, status, NULL, out.data, out.len);
            }
            svc_buf_deinit(&out);
            return;
        }
        svc_buf_deinit(&out);
    }
    if (c->mode == GW_SUB_SSE_PENDING) {
        if (n == 0)
            return;
        gw_start_sse(c);
    }
    size_t watermark = (size_t)g->cfg.gateway.write_buffer_bytes;
    if (c->next_event < n && unsent(c) < watermark) {
        struct evbuffer *buf = evbuffer_new();
        if (!buf)
            return;
        while (c->next_event < n && unsent(c) + evbuffer_get_length(buf) < watermark) {
            const char *data;
            size_t len;
            gw_stream_event(r->stream, c->next_event++, &data, &len);
            evbuffer_add(buf, data, len);
        }
        evhttp_send_reply_chunk_with_cb(c->req, buf, on_chunk_sent, c);
        evbuffer_free(buf);
        gw_arm_keepalive(c);
        if (!r->first_byte) {
            r->first_byte = true;
            gw_observe_ttfb(g, svc_now_s() - r->received_s);
        }
    }
    if (done && c->next_event == n) {
        struct evhttp_request *req = c->req;
        detach(c);
        c->req = NULL;
        evhttp_send_reply_end(req);
    }
}

void gw_http_deliver(svc_gateway *g, gw_req *r)
{
    (void)g;
    for (gw_conn *c = r->subs, *next; c; c = next) {
        next = c->sub_next; /* pump may detach c */
        gw_pump(c);
    }
}

void gw_http_drop_readers(svc_gateway *g, gw_req *r)
{
    (void)g;
    while (r->subs) {
        gw_conn *c = r->subs;
        struct evhttp_request *req = c->req;
        bool started = c->mode == GW_SUB_SSE;
        detach(c);
        if (!req)
            continue;
        if (started) {
            c->req = NULL;
            evhttp_send_reply_end(req);
        } else {
            gw_send_error(c, "overloaded", "the stream was dropped to stay within memory", 0);
        }
    }
}

static void on_request(struct evhttp_request *req, void *arg)
{
    svc_gateway *g = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    gw_conn *c = conn_find(g, evhttp_connection_get_bufferevent(evcon));
    if (!c) {
        evhttp_send_error(req, 503, "Service Unavailable");
        return;
    }
    if (!c->dispatched)
        g->n_answering++;
    c->dispatched = true;
    event_del(c->deadline);
    if (!c->evcon) {
        c->evcon = evcon;
        evhttp_connection_set_closecb(evcon, on_close, c);
        /* An SSE event is a small write that must leave at once: with
         * Nagle's algorithm it would wait for the client's delayed ACK of
         * the previous one (tens of milliseconds per token). */
        int one = 1;
        setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    c->req = req;
    gw_route(c);
}

/* ---- the probe listener -------------------------------------------------------------- */

static void on_ops(struct evhttp_request *req, void *arg)
{
    svc_gateway *g = arg;
    const char *uri = evhttp_request_get_uri(req);
    size_t len = strcspn(uri, "?");
    struct evbuffer *buf = evbuffer_new();
    int status = 200;
    const char *type = "text/plain; charset=utf-8";
    if (!buf) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    if (len == 8 && !strncmp(uri, "/metrics", len)) {
        svc_buf text = {0};
        gw_metrics_render(g, &text);
        evbuffer_add(buf, text.data, text.len);
        svc_buf_deinit(&text);
        type = "text/plain; version=0.0.4";
    } else if (len == 8 && !strncmp(uri, "/healthz", len)) {
        /* Answering at all says the loop turns; a fatal producer does not heal. */
        bool ok = !svc_producer_fatal(g->producer, NULL, 0);
        status = ok ? 200 : 503;
        evbuffer_add_printf(buf, "%s\n", ok ? "ok" : "kafka producer fatal");
    } else if (len == 7 && !strncmp(uri, "/readyz", len)) {
        /* Draining answers 503 at once, so load balancers stop sending
         * while the open streams run to their end. */
        const char *why = g->draining ? "draining" : gw_ready(g) ? NULL : "not ready";
        status = why ? 503 : 200;
        evbuffer_add_printf(buf, "%s\n", why ? why : "ready");
    } else {
        status = 404;
        evbuffer_add_printf(buf, "not found\n");
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    evhttp_send_reply(req, status, reason(status), buf);
    evbuffer_free(buf);
}

/* ---- start and stop -------------------------------------------------------------------- */

/* "host:port" into host and port. */
static int split_listen(const char *listen, char *host, size_t n, int *port)
{
    const char *colon = strrchr(listen, ':');
    char *end;
    if (!colon || (size_t)(colon - listen) >= n)
        return -1;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535)
        return -1;
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    *port = (int)p;
    return 0;
}

static int bind_one(struct evhttp *http, const char *key, const char *addr, int *port,
                    char *err, size_t errlen)
{
    char host[256];
    int want;
    if (split_listen(addr, host, sizeof host, &want)) {
        svc_errf(err, errlen, "%s: expected host:port, got '%s'", key, addr);
        return -1;
    }
    /* Bound here rather than by evhttp_bind_socket, whose listen backlog
     * (128) drops the SYNs of a burst of clients for a second or more. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port_text[8];
    snprintf(port_text, sizeof port_text, "%d", want);
    int fd = -1, rc = getaddrinfo(host[0] ? host : NULL, port_text, &hints, &ai);
    if (!rc) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
                        bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, SOMAXCONN) ||
                        evutil_make_socket_nonblocking(fd) || evutil_make_socket_closeonexec(fd))) {
            close(fd);
            fd = -1;
        }
        freeaddrinfo(ai);
    }
    struct evhttp_bound_socket *s = fd >= 0 ? evhttp_accept_socket_with_handle(http, fd) : NULL;
    if (!s) {
        svc_errf(err, errlen, "%s: cannot listen on %s: %s", key, addr,
                 rc ? gai_strerror(rc) : strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&sa, &sl);
    *port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                           : ((struct sockaddr_in *)&sa)->sin_port);
    return 0;
}

int gw_http_start(svc_gateway *g, char *err, size_t errlen)
{
    g->conns = calloc(CONN_BUCKETS, sizeof *g->conns);
    g->conns_mask = CONN_BUCKETS - 1;
    g->http = evhttp_new(g->base);
    g->ops = evhttp_new(g->base);
    if (!g->conns || !g->http || !g->ops) {
        svc_errf(err, errlen, "out of memory");
        return -1;
    }
    evhttp_set_max_body_size(g->http, (ev_ssize_t)g->cfg.limits.max_request_bytes);
    evhttp_set_max_headers_size(g->http, HEADERS_MAX);
    evhttp_set_allowed_methods(g->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    evhttp_set_bevcb(g->http, on_accept, g);
    evhttp_set_gencb(g->http, on_request, g);
    evhttp_set_max_body_size(g->ops, 0);
    evhttp_set_max_headers_size(g->ops, SVC_HTTP_HEADER_MAX);
    evhttp_set_allowed_methods(g->ops, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(g->ops, OPS_TIMEOUT_S);
    evhttp_set_gencb(g->ops, on_ops, g);
    if (bind_one(g->http, "gateway.listen", g->cfg.gateway.listen, &g->port, err, errlen) ||
        bind_one(g->ops, "http.listen", g->cfg.http.listen, &g->ops_port, err, errlen))
        return -1;
    return 0;
}

void gw_http_stop(svc_gateway *g)
{
    /* Freeing the servers closes their connections (on_close frees ours). */
    if (g->http)
        evhttp_free(g->http);
    if (g->ops)
        evhttp_free(g->ops);
    g->http = g->ops = NULL;
    /* Connections evhttp closed before dispatching anything. */
    for (size_t i = 0; g->conns && i <= g->conns_mask; i++)
        while (g->conns[i])
            conn_free(g->conns[i]);
    free(g->conns);
    g->conns = NULL;
}
