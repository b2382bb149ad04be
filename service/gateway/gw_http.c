/* The gateway's HTTP side (gw_internal.h): both listeners, the public
 * connections with their whole-request deadline, the routes, and writing a
 * stream's events to its readers under each connection's write watermark.
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
#include <ctype.h>
#include <dirent.h>
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gateway/gw_assets.h"
#include "gateway/gw_internal.h"
#include "http.h"
#include "log.h"

/* Request line and headers at most: an API call's are a few hundred bytes. */
#define HEADERS_MAX (16u << 10)
/* Buckets of the connection table (a power of two). */
#define CONN_BUCKETS 16384
/* A connection shut down for its deadline is looked at again after this, to
 * free it once evhttp has closed it. */
#define REAP_MS 1000
/* Probe answers: the probe listener's per-connection timeout. */
#define OPS_TIMEOUT_S (SVC_HTTP_DEADLINE_MS / 1000)
#define CHAT_PATH "/v1/chat/completions"
#define MODELS_PATH "/v1/models"
static const char keepalive_comment[] = ": keep-alive\n\n";
static const char bearer[] = "Bearer ";

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
static void send_body(gw_conn *c, int status, const char *type, const void *body, size_t len)
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
static void send_error(gw_conn *c, const char *code, const char *message, double retry_after_s)
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
    send_body(c, status, NULL, body.data, body.len);
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
    gw_conn **at = &g->conns[ptr_hash(c->bev) & g->conns_mask];
    while (*at != c)
        at = &(*at)->hnext;
    *at = c->hnext;
    g->n_conns--;
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

static void pump(gw_conn *c);

static void on_chunk_sent(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    pump(arg);
}

static void arm_keepalive(gw_conn *c)
{
    struct timeval tv = {c->g->cfg.gateway.keepalive_s, 0};
    event_add(c->keepalive, &tv);
}

static void start_sse(gw_conn *c)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(c->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Accel-Buffering", "no");
    evhttp_add_header(h, "X-Request-Id", c->stream->id);
    evhttp_add_header(h, "Connection", "close");
    evhttp_send_reply_start(c->req, 200, "OK");
    c->mode = GW_SUB_SSE;
    arm_keepalive(c);
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
        start_sse(c);
    struct evbuffer *buf = evbuffer_new();
    if (buf) {
        evbuffer_add(buf, keepalive_comment, sizeof keepalive_comment - 1);
        evhttp_send_reply_chunk_with_cb(c->req, buf, on_chunk_sent, c);
        evbuffer_free(buf);
    }
    arm_keepalive(c);
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

static void attach(gw_conn *c, gw_req *r, gw_sub_mode mode, size_t next_event)
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
static void pump(gw_conn *c)
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
            start_sse(c); /* a whole stream at once: written below */
        } else {
            detach(c);
            if (rc) {
                send_error(c, "internal", "out of memory", 0);
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
                send_body(c, status, NULL, out.data, out.len);
            }
            svc_buf_deinit(&out);
            return;
        }
        svc_buf_deinit(&out);
    }
    if (c->mode == GW_SUB_SSE_PENDING) {
        if (n == 0)
            return;
        start_sse(c);
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
        arm_keepalive(c);
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
        pump(c);
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
            send_error(c, "overloaded", "the stream was dropped to stay within memory", 0);
        }
    }
}

/* ---- request parsing ---------------------------------------------------------------- */

/* The tenant of the request's key, or -1 after answering 401. Without
 * authentication every request is the implicit tenant's. */
static int authenticate(gw_conn *c)
{
    svc_gateway *g = c->g;
    if (!g->keys)
        return 0;
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(c->req),
                                          "Authorization");
    const char *tenant = NULL;
    if (auth && !strncmp(auth, bearer, sizeof bearer - 1))
        tenant = gw_keys_tenant(g->keys, auth + sizeof bearer - 1, strlen(auth + sizeof bearer - 1));
    int i = tenant ? gw_tenant_index(g, tenant) : -1;
    if (i < 0)
        send_error(c, "invalid_api_key",
                   auth ? "Incorrect API key provided." : "Missing API key: send Authorization: Bearer <key>.",
                   0);
    return i;
}

/* The request's body, contiguous and NUL-terminated (the NUL not counted
 * in *len): evhttp has bounded it by limits.max_request_bytes already.
 * NULL when out of memory. */
static const char *body_of(gw_conn *c, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(c->req);
    *len = evbuffer_get_length(in);
    if (evbuffer_add(in, "", 1))
        return NULL;
    return (const char *)evbuffer_pullup(in, -1);
}

/* Rewrite the client's body into the worker's request (see the brief in
 * service/README.md, "The gateway"): stream forced on, a seed when none,
 * model mapped, the fields the headers own removed. Fills params and the
 * deadline. Returns the text (owned) or NULL after answering 400. */
static char *rewrite(gw_conn *c, gw_stream_params *p, bool *stream, int64_t *deadline_ms,
                     char *model, size_t model_len)
{
    svc_gateway *g = c->g;
    size_t len;
    const char *text = body_of(c, &len);
    if (!text) {
        send_error(c, "internal", "out of memory", 0);
        return NULL;
    }
    /* The whole body is one value: trailing bytes are an error, not ignored. */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, NULL, true);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        send_error(c, "invalid_json", "The body is not a JSON object.", 0);
        return NULL;
    }
    const char *bad = NULL;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (v && !cJSON_IsBool(v))
        bad = "stream: expected true or false";
    *stream = cJSON_IsTrue(v);
    v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
    if (v && (!cJSON_IsObject(v) || (usage && !cJSON_IsBool(usage))))
        bad = "stream_options: expected {\"include_usage\": true or false}";
    p->include_usage = cJSON_IsTrue(usage);
    v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsString(v))
        bad = "model: expected a string";
    snprintf(model, model_len, "%s", cJSON_IsString(v) ? v->valuestring : g->model);
    if (cJSON_IsString(v) && strlen(v->valuestring) >= model_len)
        bad = "model: too long";
    v = cJSON_GetObjectItemCaseSensitive(root, "deadline_ms");
    if (v && (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 9007199254740991.0))
        bad = "deadline_ms: expected unix milliseconds";
    *deadline_ms = v && !bad ? (int64_t)v->valuedouble
                             : svc_wall_ms() + (int64_t)g->cfg.gateway.request_timeout_s * 1000;
    if (bad) {
        cJSON_Delete(root);
        send_error(c, "invalid_request", bad, 0);
        return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "stream_options");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "id");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "reply_topic");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "stream");
    cJSON_AddBoolToObject(root, "stream", true);
    if (!cJSON_HasObjectItem(root, "seed"))
        cJSON_AddNumberToObject(root, "seed", (double)gw_random_seed());
    if (strcmp(model, g->model) && !cJSON_HasObjectItem(root, "adapter"))
        cJSON_AddStringToObject(root, "adapter", model);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    p->model = model;
    p->created = (int64_t)time(NULL);
    if (!out)
        send_error(c, "internal", "out of memory", 0);
    return out;
}

/* ---- routes ------------------------------------------------------------------------- */

static void chat(gw_conn *c)
{
    svc_gateway *g = c->g;
    int t = authenticate(c);
    if (t < 0)
        return;
    gw_tenant *ten = &g->tenants[t];
    double retry;
    if (!gw_bucket_take(&ten->bucket, svc_now_s(), &retry)) {
        send_error(c, "rate_limit_exceeded", "Too many requests for this key's tenant.",
                   retry);
        return;
    }
    if (ten->streams >= ten->t->max_streams) {
        send_error(c, "too_many_streams", "Too many streams open for this key's tenant.", 1);
        return;
    }
    if (g->n_running >= (size_t)g->cfg.gateway.max_streams) {
        send_error(c, "overloaded", "The gateway holds as many streams as it may.", 1);
        return;
    }
    if (!gw_retained_room(g)) {
        send_error(c, "overloaded", "The gateway's stream memory is full.", 1);
        return;
    }
    if (!gw_ready(g)) {
        send_error(c, "kafka_unavailable", "The gateway cannot reach the workers.", 1);
        return;
    }
    gw_stream_params p = {0};
    bool stream;
    int64_t deadline_ms;
    char model[256];
    char *body = rewrite(c, &p, &stream, &deadline_ms, model, sizeof model);
    if (!body)
        return;
    const char *code;
    char msg[256];
    p.completion_only = !stream;
    gw_req *r = gw_request_start(g, (size_t)t, body, strlen(body), &p, deadline_ms, &code, msg,
                                 sizeof msg);
    free(body);
    if (!r) {
        send_error(c, code, msg, 0);
        return;
    }
    attach(c, r, stream ? GW_SUB_SSE_PENDING : GW_SUB_COMPLETION, 0);
    if (stream)
        arm_keepalive(c);
}

/* "/v1/chat/completions/{id}/<verb>": the request of the caller's tenant,
 * or NULL after answering 404. */
static gw_req *find_own(gw_conn *c, const char *path, const char *verb)
{
    int t = authenticate(c);
    if (t < 0)
        return NULL;
    const char *id = path + sizeof CHAT_PATH;
    size_t len = strlen(id), vlen = strlen(verb);
    gw_req *r = NULL;
    if (len > vlen + 1 && id[len - vlen - 1] == '/' && !strcmp(id + len - vlen, verb))
        r = gw_request_find(c->g, id, len - vlen - 1);
    if (!r || r->tenant != (size_t)t) {
        send_error(c, "not_found", "No such stream (or it is no longer retained).", 0);
        return NULL;
    }
    return r;
}

static void resume(gw_conn *c, const char *path)
{
    gw_req *r = find_own(c, path, "stream");
    if (!r)
        return;
    const char *last = evhttp_find_header(evhttp_request_get_input_headers(c->req),
                                          "Last-Event-ID");
    size_t next = 0, n = gw_stream_n_events(r->stream);
    if (last) {
        char *end;
        errno = 0;
        unsigned long long k = strtoull(last, &end, 10);
        if (errno || end == last || *end || !isdigit((unsigned char)*last)) {
            send_error(c, "invalid_request", "Last-Event-ID: expected an event number", 0);
            return;
        }
        next = k >= n ? n : (size_t)k + 1;
    }
    c->g->m.resumes++;
    attach(c, r, GW_SUB_SSE_PENDING, next);
    start_sse(c);
    pump(c);
}

static void cancel(gw_conn *c, const char *path)
{
    gw_req *r = find_own(c, path, "cancel");
    if (!r)
        return;
    c->g->m.cancels++;
    if (!r->ended)
        gw_request_cancel(c->g, r);
    char body[GW_ID_LEN + 64];
    int n = snprintf(body, sizeof body, "{\"id\":\"%s\",\"object\":\"chat.completion.cancel\","
                                        "\"cancelled\":%s}",
                     r->id, r->ended ? "false" : "true");
    send_body(c, 200, NULL, body, (size_t)n);
}

/* One entry of /v1/models; an adapter names its base as parent. */
static cJSON *model_entry(const char *id, const char *parent)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "mllama");
    if (parent)
        cJSON_AddStringToObject(m, "parent", parent);
    return m;
}

/* The base model, then every adapter directory under model.adapters_dir
 * (what the workers of this deployment load by name). */
static void models(gw_conn *c)
{
    svc_gateway *g = c->g;
    if (authenticate(c) < 0)
        return;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, model_entry(g->model, NULL));
    DIR *d = g->cfg.model.adapters_dir[0] ? opendir(g->cfg.model.adapters_dir) : NULL;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.' && e->d_type == DT_DIR)
            cJSON_AddItemToArray(data, model_entry(e->d_name, g->model));
    if (d)
        closedir(d);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text)
        send_body(c, 200, NULL, text, strlen(text));
    else
        send_error(c, "internal", "out of memory", 0);
    free(text);
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
    const char *uri = evhttp_request_get_uri(req);
    size_t path_len = strcspn(uri, "?#");
    char path[512];
    if (path_len >= sizeof path) {
        send_error(c, "not_found", "No such route.", 0);
        return;
    }
    memcpy(path, uri, path_len);
    path[path_len] = 0;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    bool get = m == EVHTTP_REQ_GET || m == EVHTTP_REQ_HEAD, post = m == EVHTTP_REQ_POST;
    const gw_asset *a;
    size_t chat_len = sizeof CHAT_PATH - 1;
    if (!strcmp(path, CHAT_PATH)) {
        if (post)
            chat(c);
        else
            send_error(c, "method_not_allowed", "POST only.", 0);
    } else if (!strncmp(path, CHAT_PATH "/", chat_len + 1)) {
        size_t len = strlen(path);
        bool is_stream = len > 7 && !strcmp(path + len - 7, "/stream");
        bool is_cancel = len > 7 && !strcmp(path + len - 7, "/cancel");
        if (is_stream && get)
            resume(c, path);
        else if (is_cancel && post)
            cancel(c, path);
        else if (is_stream || is_cancel)
            send_error(c, "method_not_allowed", is_stream ? "GET only." : "POST only.", 0);
        else
            send_error(c, "not_found", "No such route.", 0);
    } else if (!strcmp(path, MODELS_PATH)) {
        if (get)
            models(c);
        else
            send_error(c, "method_not_allowed", "GET only.", 0);
    } else if ((a = gw_asset_find(path))) {
        if (get)
            send_body(c, 200, a->content_type, a->data, a->len);
        else
            send_error(c, "method_not_allowed", "GET only.", 0);
    } else {
        send_error(c, "not_found", "No such route.", 0);
    }
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
        bool ok = gw_ready(g);
        status = ok ? 200 : 503;
        evbuffer_add_printf(buf, "%s\n", ok ? "ready" : "not ready");
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
