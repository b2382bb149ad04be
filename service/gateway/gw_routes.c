/* The gateway's routes (gw_internal.h): authentication, the rewrite of a
 * client's body into the worker's request, and the answers of each
 * endpoint. What a connection then does with a stream is gw_http.c's.
 * @locality: the gateway's thread. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/gw_assets.h"
#include "gateway/gw_internal.h"

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
 * deadline. Returns the text (owned) or NULL after answering 400. */
static char *rewrite(gw_conn *c, gw_stream_params *p, bool *stream, int64_t *deadline_ms,
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
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    p->model = model;
    p->created = (int64_t)time(NULL);
    if (!out)
        gw_send_error(c, "internal", "out of memory", 0);
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
    if (g->draining) {
        gw_send_error(c, "not_ready", "The gateway is shutting down: retry on another instance.",
                      DRAIN_RETRY_AFTER_S);
        return;
    }
    double retry;
    if (!gw_bucket_take(&ten->bucket, svc_now_s(), &retry)) {
        gw_send_error(c, "rate_limit_exceeded", "Too many requests for this key's tenant.",
                   retry);
        return;
    }
    if (ten->streams >= ten->t->max_streams) {
        gw_send_error(c, "too_many_streams", "Too many streams open for this key's tenant.", 1);
        return;
    }
    if (g->n_running >= (size_t)g->cfg.gateway.max_streams) {
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
        gw_send_error(c, code, msg, 0);
        return;
    }
    gw_attach(c, r, stream ? GW_SUB_SSE_PENDING : GW_SUB_COMPLETION, 0);
    if (stream)
        gw_arm_keepalive(c);
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

