/* The gateway's routes (gw_internal.h): authentication, the rewrite of a
 * client's body into the worker's request, and the answers of each
 * endpoint. What a connection then does with a stream is gw_http.c's.
 * @locality: the gateway's thread. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "engine.h"
#include "gateway/gw_assets.h"
#include "gateway/gw_internal.h"
#include "protocol/base64.h"

#define CHAT_PATH "/v1/chat/completions"
#define MODELS_PATH "/v1/models"
/* Retry-After of a request refused while draining: the load balancer has
 * another instance by then (/readyz turned 503 when the drain began). */
#define DRAIN_RETRY_AFTER_S 1
static const char bearer[] = "Bearer ";

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
        gw_send_error(c, "invalid_api_key",
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
 * deadline. Returns the tree (owned) or NULL after answering 400. */
static cJSON *rewrite(gw_conn *c, gw_stream_params *p, bool *stream, int64_t *deadline_ms,
                      char *model, size_t model_len)
{
    svc_gateway *g = c->g;
    size_t len;
    const char *text = body_of(c, &len);
    if (!text) {
        gw_send_error(c, "internal", "out of memory", 0);
        return NULL;
    }
    /* The whole body is one value: trailing bytes are an error, not ignored. */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, NULL, true);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        gw_send_error(c, "invalid_json", "The body is not a JSON object.", 0);
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
    /* gateway.request_timeout_s is also the latest deadline: every stream
     * ends within it, so none holds its slot and its memory for longer. */
    int64_t latest = svc_wall_ms() + (int64_t)g->cfg.gateway.request_timeout_s * 1000;
    *deadline_ms = v && !bad && v->valuedouble < (double)latest ? (int64_t)v->valuedouble : latest;
    if (bad) {
        cJSON_Delete(root);
        gw_send_error(c, "invalid_request", bad, 0);
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
    p->created = (int64_t)time(NULL);
    return root;
}

/* A request refused because the drain began. */
static void send_draining(gw_conn *c)
{
    gw_send_error(c, "not_ready", "The gateway is shutting down: retry on another instance.",
                  DRAIN_RETRY_AFTER_S);
}

/* What a chat request carries from its admission to its produce. */
typedef struct chat_req {
    size_t tenant;
    gw_stream_params p;     /* p.model set at the produce, to this copy's model */
    char model[256];
    bool stream;
    int64_t deadline_ms;
} chat_req;

/* Produce the rewritten request (root, consumed) and attach c to its stream. */
static void produce(gw_conn *c, const chat_req *q, cJSON *root)
{
    svc_gateway *g = c->g;
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!body) {
        gw_send_error(c, "internal", "out of memory", 0);
        return;
    }
    size_t len = strlen(body);
    const char *code;
    char msg[256];
    gw_req *r = NULL;
    if (len > (size_t)g->cfg.limits.max_request_bytes) {
        code = "request_too_large";
        snprintf(msg, sizeof msg, "The request is %zu bytes with its images, over the limit of "
                                  "%ld.", len, g->cfg.limits.max_request_bytes);
    } else {
        gw_stream_params p = q->p;
        p.model = q->model;
        p.completion_only = !q->stream;
        r = gw_request_start(g, q->tenant, body, len, &p, q->deadline_ms, &code, msg,
                             sizeof msg);
    }
    free(body);
    if (!r) {
        gw_send_error(c, code, msg, 0);
        return;
    }
    gw_attach(c, r, q->stream ? GW_SUB_SSE_PENDING : GW_SUB_COMPLETION, 0);
    if (q->stream)
        gw_arm_keepalive(c);
}

/* ---- image URLs ---------------------------------------------------------------------- */

/* One image a request names by http(s) URL. */
typedef struct job_image {
    gw_job *job;
    cJSON *item;            /* borrowed from job->root: the URL's string */
    char where[96];         /* "messages[i].content[j].image_url.url", for errors */
    gw_fetch *fetch;        /* running, or NULL */
    size_t held;            /* its data URL's bytes, counted by gw_fetcher_hold */
} job_image;

/* A chat request waiting on its image URLs (gw_fetch.h): the rewritten
 * body, parsed, whose URL strings become data: URLs as the fetches end;
 * produced once the last has. */
struct gw_job {
    gw_conn *c;
    struct event *watch;    /* owned: the client's socket, for its leaving */
    chat_req q;
    cJSON *root;            /* owned */
    size_t n, left;         /* images, and those still fetching */
    job_image images[];
};

static bool is_fetched_scheme(const char *url)
{
    return !strncasecmp(url, "https://", 8) || !strncasecmp(url, "http://", 7);
}

/* The image URLs of root's messages (content parts {"type": "image_url",
 * "image_url": URL or {"url": URL}}): each one's string and place into out
 * (when not NULL) up to cap. Returns how many there are. The rest (data:
 * URLs, other parts, malformed ones) is the worker's to judge. */
static size_t find_image_urls(cJSON *root, job_image *out, size_t cap)
{
    size_t n = 0, mi = 0;
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    for (cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next, mi++) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        size_t pi = 0;
        for (cJSON *part = cJSON_IsArray(content) ? content->child : NULL; part;
             part = part->next, pi++) {
            cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "image_url"))
                continue;
            cJSON *item = cJSON_GetObjectItemCaseSensitive(part, "image_url");
            bool object = cJSON_IsObject(item);
            if (object)
                item = cJSON_GetObjectItemCaseSensitive(item, "url");
            if (!cJSON_IsString(item) || !is_fetched_scheme(item->valuestring))
                continue;
            if (out && n < cap) {
                out[n].item = item;
                snprintf(out[n].where, sizeof out[n].where, "messages[%zu].content[%zu].%s", mi,
                         pi, object ? "image_url.url" : "image_url");
            }
            n++;
        }
    }
    return n;
}

/* Stop j's fetches, give back its counts and bytes, and free it (c->job is
 * the caller's to clear). */
static void job_free(gw_job *j)
{
    svc_gateway *g = j->c->g;
    for (size_t i = 0; i < j->n; i++) {
        if (j->images[i].fetch)
            gw_fetch_cancel(j->images[i].fetch);
        gw_fetcher_hold(g->fetcher, -(long long)j->images[i].held);
    }
    g->n_fetching--;
    g->tenants[j->q.tenant].fetching--;
    if (j->watch)
        event_free(j->watch);
    cJSON_Delete(j->root);
    free(j);
}

void gw_job_abort(gw_conn *c)
{
    if (c->job)
        job_free(c->job);
    c->job = NULL;
}

/* End j with an error answer. */
static void job_fail(gw_job *j, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void job_fail(gw_job *j, const char *code, const char *fmt, ...)
{
    gw_conn *c = j->c;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->job = NULL;
    job_free(j);
    gw_send_error(c, code, msg, 0);
}

/* The URL string of im becomes a data: URL of the bytes, labelled by their
 * signature. Returns false after failing the job. */
static bool inline_image(job_image *im, const uint8_t *data, size_t len)
{
    gw_job *j = im->job;
    const char *type = ml_image_media_type(data, len);
    if (!type) {
        job_fail(j, "invalid_image_url", "%s: what the URL holds is not a JPEG, PNG, WebP, GIF "
                                         "or TIFF image", im->where);
        return false;
    }
    size_t n = svc_data_url_len(type, len);
    /* The string is written in place of the URL's, not built and copied. */
    char *url = cJSON_malloc(n + 1);
    if (!url) {
        job_fail(j, "internal", "out of memory");
        return false;
    }
    svc_data_url_write(type, data, len, url);
    cJSON_free(im->item->valuestring);
    im->item->valuestring = url;
    im->held = n + 1;
    gw_fetcher_hold(j->c->g->fetcher, (long long)im->held);
    return true;
}

static void on_image(void *arg, gw_fetch_status st, const uint8_t *data, size_t len,
                     const char *why)
{
    job_image *im = arg;
    gw_job *j = im->job;
    svc_gateway *g = j->c->g;
    im->fetch = NULL;
    g->m.fetches[st]++;
    if (st != GW_FETCH_OK) {
        const char *code = st == GW_FETCH_TOO_LARGE ? "image_too_large"
                           : st == GW_FETCH_BUSY    ? "overloaded"
                                                    : "invalid_image_url";
        job_fail(j, code, "%s: %s", im->where, why);
        return;
    }
    if (!inline_image(im, data, len) || --j->left > 0)
        return;
    gw_conn *c = j->c;
    chat_req q = j->q;
    cJSON *root = j->root;
    j->root = NULL;
    c->job = NULL;
    job_free(j);
    if (g->draining) {
        cJSON_Delete(root);
        send_draining(c);
        return;
    }
    produce(c, &q, root);
}

/* The client's socket is readable while its request waits on images:
 * evhttp reads nothing more from a connection until its answer, so this is
 * how a client that left is seen before the fetches' timeout. End of file
 * or an error ends the job (the answer's write then fails and evhttp closes
 * the connection); bytes (a pipelined request) are left for evhttp. */
static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    gw_job *j = arg;
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        job_fail(j, "cancelled", "The client closed the connection.");
    else if (n < 0)
        event_add(j->watch, NULL);
}

/* Fetch the n image URLs of root (find_image_urls) for c's request, then
 * produce it. Answers at once when one is refused or nothing can start. */
static void start_job(gw_conn *c, const chat_req *q, cJSON *root, size_t n)
{
    svc_gateway *g = c->g;
    const svc_config *cfg = &g->cfg;
    if (n > (size_t)cfg->runtime.max_images_per_request) {
        cJSON_Delete(root);
        char msg[128];
        snprintf(msg, sizeof msg, "more than %d images", cfg->runtime.max_images_per_request);
        gw_send_error(c, "invalid_request", msg, 0);
        return;
    }
    gw_job *j = calloc(1, sizeof *j + n * sizeof j->images[0]);
    if (!j) {
        cJSON_Delete(root);
        gw_send_error(c, "internal", "out of memory", 0);
        return;
    }
    j->c = c;
    j->q = *q;
    j->root = root;
    j->n = j->left = n;
    find_image_urls(root, j->images, n);
    g->n_fetching++;
    g->tenants[q->tenant].fetching++;
    c->job = j;
    for (size_t i = 0; i < n; i++)
        j->images[i].job = j;
    j->watch = event_new(g->base, bufferevent_getfd(c->bev), EV_READ, on_client_readable, j);
    if (!j->watch || event_add(j->watch, NULL)) {
        job_fail(j, "internal", "out of memory");
        return;
    }
    if (!g->fetcher) {
        job_fail(j, "invalid_image_url", "%s: this gateway does not fetch image URLs "
                 "(gateway.image_fetch is off): send the image as a data: URL",
                 j->images[0].where);
        return;
    }
    char why[384];
    for (size_t i = 0; i < n; i++)
        if (!gw_fetch_url_allowed(gw_fetcher_policy(g->fetcher), j->images[i].item->valuestring,
                                  why, sizeof why)) {
            job_fail(j, "invalid_image_url", "%s: %s", j->images[i].where, why);
            return;
        }
    int64_t left_ms = q->deadline_ms - svc_wall_ms();
    if (left_ms <= 0) {
        job_fail(j, "deadline_exceeded", "The request's deadline passed before its images "
                 "were fetched.");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        job_image *im = &j->images[i];
        im->fetch = gw_fetch_start(g->fetcher, im->item->valuestring,
                                   left_ms < INT_MAX ? (int)left_ms : INT_MAX, on_image, im);
        if (!im->fetch) {
            job_fail(j, "internal", "out of memory");
            return;
        }
    }
}

/* ---- routes ------------------------------------------------------------------------- */

static void chat(gw_conn *c)
{
    svc_gateway *g = c->g;
    int t = authenticate(c);
    if (t < 0)
        return;
    gw_tenant *ten = &g->tenants[t];
    if (g->draining) {
        send_draining(c);
        return;
    }
    double retry;
    if (!gw_bucket_take(&ten->bucket, svc_now_s(), &retry)) {
        gw_send_error(c, "rate_limit_exceeded", "Too many requests for this key's tenant.",
                   retry);
        return;
    }
    /* A request waiting on its images holds a stream's place already. */
    if (ten->streams + ten->fetching >= ten->t->max_streams) {
        gw_send_error(c, "too_many_streams", "Too many streams open for this key's tenant.", 1);
        return;
    }
    if (g->n_running + g->n_fetching >= (size_t)g->cfg.gateway.max_streams) {
        gw_send_error(c, "overloaded", "The gateway holds as many streams as it may.", 1);
        return;
    }
    if (!gw_retained_room(g)) {
        gw_send_error(c, "overloaded", "The gateway's stream memory is full.", 1);
        return;
    }
    if (!gw_ready(g)) {
        gw_send_error(c, "kafka_unavailable", "The gateway cannot reach the workers.", 1);
        return;
    }
    chat_req q = {.tenant = (size_t)t};
    cJSON *root = rewrite(c, &q.p, &q.stream, &q.deadline_ms, q.model, sizeof q.model);
    if (!root)
        return;
    size_t n = find_image_urls(root, NULL, 0);
    if (n == 0) {
        produce(c, &q, root);
        return;
    }
    if (g->n_fetching >= (size_t)g->cfg.gateway.image_fetch_max_pending) {
        cJSON_Delete(root);
        gw_send_error(c, "overloaded", "The gateway is fetching as many requests' images as it "
                      "may.", 1);
        return;
    }
    start_job(c, &q, root, n);
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
        gw_send_error(c, "not_found", "No such stream (or it is no longer retained).", 0);
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
            gw_send_error(c, "invalid_request", "Last-Event-ID: expected an event number", 0);
            return;
        }
        next = k >= n ? n : (size_t)k + 1;
    }
    c->g->m.resumes++;
    gw_attach(c, r, GW_SUB_SSE_PENDING, next);
    gw_start_sse(c);
    gw_pump(c);
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
    gw_send_body(c, 200, NULL, body, (size_t)n);
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

/* What add_listed adds to. */
typedef struct model_list {
    cJSON *data;
    const char *base;
} model_list;

/* An adapter of the Redis listing, unless the directory listed it already. */
static void add_listed(void *ctx, const char *name)
{
    model_list *l = ctx;
    for (const cJSON *m = l->data->child; m; m = m->next)
        if (!strcmp(cJSON_GetObjectItem(m, "id")->valuestring, name))
            return;
    cJSON_AddItemToArray(l->data, model_entry(name, l->base));
}

/* The base model, then the adapters the workers of this deployment load by
 * name: every directory under model.adapters_dir, and every adapter stored
 * in Redis (the last listing of gw_adapters.c: this never waits on Redis). */
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
    model_list l = {data, g->model};
    gw_adapters_each(g->adapters, add_listed, &l);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (text)
        gw_send_body(c, 200, NULL, text, strlen(text));
    else
        gw_send_error(c, "internal", "out of memory", 0);
    free(text);
}

/* ---- dispatch ----------------------------------------------------------------------- */

void gw_route(gw_conn *c)
{
    struct evhttp_request *req = c->req;
    const char *uri = evhttp_request_get_uri(req);
    size_t path_len = strcspn(uri, "?#");
    char path[512];
    if (path_len >= sizeof path) {
        gw_send_error(c, "not_found", "No such route.", 0);
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
            gw_send_error(c, "method_not_allowed", "POST only.", 0);
    } else if (!strncmp(path, CHAT_PATH "/", chat_len + 1)) {
        size_t len = strlen(path);
        bool is_stream = len > 7 && !strcmp(path + len - 7, "/stream");
        bool is_cancel = len > 7 && !strcmp(path + len - 7, "/cancel");
        if (is_stream && get)
            resume(c, path);
        else if (is_cancel && post)
            cancel(c, path);
        else if (is_stream || is_cancel)
            gw_send_error(c, "method_not_allowed", is_stream ? "GET only." : "POST only.", 0);
        else
            gw_send_error(c, "not_found", "No such route.", 0);
    } else if (!strcmp(path, MODELS_PATH)) {
        if (get)
            models(c);
        else
            gw_send_error(c, "method_not_allowed", "GET only.", 0);
    } else if ((a = gw_asset_find(path))) {
        if (get)
            gw_send_body(c, 200, a->content_type, a->data, a->len);
        else
            gw_send_error(c, "method_not_allowed", "GET only.", 0);
    } else {
        gw_send_error(c, "not_found", "No such route.", 0);
    }
}

