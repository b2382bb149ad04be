/* The gateway's lifecycle and its requests (gateway.h): producing requests
 * and cancels, the id table, the running list and the FIFO of ended streams
 * kept for resumes, the timers that end what nobody ends (deadlines,
 * abandoned streams, retention), and the metrics. The reply reader is
 * gw_kafka.c.
 * @locality: the gateway's thread. */
#include <ctype.h>
#include <errno.h>
#include <event2/http.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/gw_internal.h"
#include "log.h"

/* Buckets of the id table: enough for gateway.max_streams and the streams
 * ended within gateway.retain_s at a few per bucket. */
#define TABLE_BUCKETS 8192
/* How often the loop serves the producer's delivery reports and forgets
 * streams past gateway.retain_s. */
#define SWEEP_MS 50
/* A request's own timeout past its deadline_ms: the worker ends it at the
 * deadline (deadline_exceeded); this covers a request no worker answers. */
#define DEADLINE_GRACE_MS 5000
#define FLUSH_MS 5000
/* After drain.grace_ms the streams still running are ended with an error
 * event; their readers get this long to receive it before the gateway
 * stops. */
#define DRAIN_WRITE_MS 1000
#define SEED_BITS 53

/* ---- the id table ------------------------------------------------------------- */

static size_t id_hash(const char *id, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a: ids are random already */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)id[i]) * 1099511628211ull;
    return (size_t)h;
}

gw_req *gw_request_find(svc_gateway *g, const char *id, size_t len)
{
    if (len != GW_ID_LEN)
        return NULL;
    for (gw_req *r = g->table[id_hash(id, len) & g->table_mask]; r; r = r->hnext)
        if (!memcmp(r->id, id, len))
            return r;
    return NULL;
}

static void list_unlink(gw_req **head, gw_req **tail, gw_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        *head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else if (tail)
        *tail = r->prev;
    r->prev = r->next = NULL;
}

static void account_bytes(svc_gateway *g, gw_req *r)
{
    size_t now = gw_stream_bytes(r->stream);
    g->retained_bytes = g->retained_bytes - r->bytes + now;
    r->bytes = now;
}

/* Forget an ended request: its readers are closed. */
static void request_free(svc_gateway *g, gw_req *r)
{
    gw_http_drop_readers(g, r);
    gw_req **at = &g->table[id_hash(r->id, GW_ID_LEN) & g->table_mask];
    while (*at != r)
        at = &(*at)->hnext;
    *at = r->hnext;
    list_unlink(&g->ended_head, &g->ended_tail, r);
    g->n_ended--;
    g->retained_bytes -= r->bytes;
    event_free(r->abandon);
    event_free(r->deadline);
    gw_stream_destroy(r->stream);
    free(r);
}

/* The stream ended (its final record, a divergence, or the gateway's own
 * failure): it leaves the running list for the ended FIFO. */
static void request_end(svc_gateway *g, gw_req *r)
{
    if (r->ended)
        return;
    r->ended = true;
    r->ended_ms = svc_now_ms();
    event_del(r->abandon);
    event_del(r->deadline);
    list_unlink(&g->running_head, NULL, r);
    g->n_running--;
    g->tenants[r->tenant].streams--;
    r->prev = g->ended_tail;
    if (g->ended_tail)
        g->ended_tail->next = r;
    else
        g->ended_head = r;
    g->ended_tail = r;
    g->n_ended++;
}

void gw_request_progress(svc_gateway *g, gw_req *r)
{
    account_bytes(g, r);
    if (gw_stream_done(r->stream))
        request_end(g, r);
    gw_http_deliver(g, r);
}

void gw_request_fail(svc_gateway *g, gw_req *r, const char *code, const char *message)
{
    if (r->ended)
        return;
    gw_stream_fail(r->stream, code, message);
    gw_request_progress(g, r);
}

bool gw_retained_room(svc_gateway *g)
{
    gw_req *r = g->ended_head;
    while (g->retained_bytes > (size_t)g->cfg.gateway.max_retained_bytes && r) {
        gw_req *next = r->next;
        if (!r->subs && !r->deliveries)
            request_free(g, r);
        r = next;
    }
    return g->retained_bytes <= (size_t)g->cfg.gateway.max_retained_bytes;
}

/* ---- timers ---------------------------------------------------------------------- */

/* Nobody came back for a running stream within gateway.abandon_ms: no
 * worker should spend decode steps on it. The worker's cancelled final ends
 * it; it stays resumable until then and for gateway.retain_s after. */
static void on_abandon(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    gw_req *r = arg;
    r->g->m.abandoned++;
    svc_log(SVC_LOG_INFO, "gateway_abandoned", "request %s: no reader for %d ms, cancelled",
            r->id, r->g->cfg.gateway.abandon_ms);
    gw_request_cancel(r->g, r);
}

/* No final record by the deadline and its grace: no worker is answering. */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    gw_req *r = arg;
    gw_request_fail(r->g, r, "deadline_exceeded", "no answer before the request's deadline");
}

void gw_request_readers_changed(svc_gateway *g, gw_req *r)
{
    if (r->ended || r->subs) {
        event_del(r->abandon);
        return;
    }
    struct timeval tv = {g->cfg.gateway.abandon_ms / 1000, (g->cfg.gateway.abandon_ms % 1000) * 1000};
    event_add(r->abandon, &tv);
}

/* ---- the drain ------------------------------------------------------------------ */

/* SIGTERM or SIGINT: /readyz and new chat requests answer 503 from now on;
 * the streams running, their resumes and cancels go on. */
static void drain_start(svc_gateway *g, int sig)
{
    g->draining = true;
    g->drain_deadline_ms = svc_now_ms() + g->cfg.drain.grace_ms;
    svc_log(SVC_LOG_INFO, "drain_started", "signal %d: %zu streams running, grace %d ms", sig,
            g->n_running, g->cfg.drain.grace_ms);
}

/* The grace passed: the streams still running end with an error event, and
 * their requests are cancelled so that no worker computes answers nobody
 * will read. */
static void drain_expire(svc_gateway *g)
{
    g->drain_expired = true;
    svc_log(SVC_LOG_WARN, "drain_grace_expired", "ending %zu streams", g->n_running);
    while (g->running_head) {
        gw_req *r = g->running_head; /* failing it moves it to the ended FIFO */
        gw_request_cancel(g, r);
        gw_request_fail(g, r, "not_ready", "the gateway is shutting down");
    }
}

/* Called every sweep while draining: stop the loop once no stream runs and
 * every answer is written (or its writing has had DRAIN_WRITE_MS past the
 * grace); the producer is flushed on the way out (svc_gateway_destroy). */
static void drain_step(svc_gateway *g)
{
    long long now = svc_now_ms();
    if (!g->drain_expired && now >= g->drain_deadline_ms)
        drain_expire(g);
    bool written = !g->n_answering || now >= g->drain_deadline_ms + DRAIN_WRITE_MS;
    if (!g->n_running && written) {
        svc_log(SVC_LOG_INFO, "drain_done", "%zu answers unfinished, exiting", g->n_answering);
        event_base_loopbreak(g->base);
    }
}

/* Delivery reports, what has outlived gateway.retain_s, and the drain. */
static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    svc_gateway *g = arg;
    svc_producer_poll(g->producer, 0);
    char err[256];
    if (svc_producer_fatal(g->producer, err, sizeof err)) {
        svc_log(SVC_LOG_ERROR, "gateway_kafka_fatal", "%s", err);
        g->exit_code = SVC_GATEWAY_EXIT_KAFKA;
        event_base_loopbreak(g->base);
        return;
    }
    long long cutoff = svc_now_ms() - (long long)g->cfg.gateway.retain_s * 1000;
    while (g->ended_head && g->ended_head->ended_ms <= cutoff && !g->ended_head->deliveries)
        request_free(g, g->ended_head);
    if (g->draining)
        drain_step(g);
}

/* ---- Kafka: producing ---------------------------------------------------------- */

static void random_hex(char *out, size_t n_bytes)
{
    uint8_t bytes[GW_ID_RANDOM_BYTES];
    /* Once the pool is seeded getrandom cannot fail on a valid buffer. */
    if (svc_random_bytes(bytes, n_bytes))
        abort();
    for (size_t i = 0; i < n_bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", bytes[i]);
}

int64_t gw_random_seed(void)
{
    uint64_t v;
    if (svc_random_bytes(&v, sizeof v))
        abort();
    return (int64_t)(v >> (64 - SEED_BITS));
}

gw_req *gw_request_start(svc_gateway *g, size_t tenant, const char *body, size_t len,
                         const gw_stream_params *params, int64_t deadline_ms, const char **code,
                         char *msg, size_t msglen)
{
    gw_tenant *t = &g->tenants[tenant];
    gw_req *r = calloc(1, sizeof *r);
    gw_stream_params p = *params;
    if (r) {
        r->g = g;
        memcpy(r->id, GW_ID_PREFIX, sizeof GW_ID_PREFIX - 1);
        random_hex(r->id + sizeof GW_ID_PREFIX - 1, GW_ID_RANDOM_BYTES);
        p.id = r->id;
        r->stream = gw_stream_create(&p);
        r->abandon = evtimer_new(g->base, on_abandon, r);
        r->deadline = evtimer_new(g->base, on_deadline, r);
    }
    if (!r || !r->stream || !r->abandon || !r->deadline) {
        if (r) {
            gw_stream_destroy(r->stream);
            if (r->abandon)
                event_free(r->abandon);
            if (r->deadline)
                event_free(r->deadline);
        }
        free(r);
        *code = "internal";
        svc_errf(msg, msglen, "out of memory");
        return NULL;
    }
    r->tenant = tenant;
    r->received_s = svc_now_s();
    char deadline[24];
    snprintf(deadline, sizeof deadline, "%" PRId64, deadline_ms);
    svc_kafka_header hs[] = {{"request_id", r->id, GW_ID_LEN},
                             {"reply_topic", t->reply_topic, strlen(t->reply_topic)},
                             {"deadline_ms", deadline, strlen(deadline)}};
    svc_kafka_record rec = {.topic = t->t->request_topic, .partition = RD_KAFKA_PARTITION_UA,
                            .key = r->id, .key_len = GW_ID_LEN, .value = body,
                            .value_len = len, .headers = hs, .n_headers = 3, .ctx = r};
    char err[256];
    svc_kafka_status st = svc_producer_produce(g->producer, &rec, err, sizeof err);
    if (st != SVC_KAFKA_OK) {
        svc_log(SVC_LOG_WARN, "gateway_produce_failed", "to %s: %s", rec.topic, err);
        gw_stream_destroy(r->stream);
        event_free(r->abandon);
        event_free(r->deadline);
        free(r);
        *code = st == SVC_KAFKA_ERR_TOO_LARGE ? "request_too_large" : "kafka_unavailable";
        svc_errf(msg, msglen, "%s", st == SVC_KAFKA_ERR_TOO_LARGE
                                        ? "the request is larger than the cluster takes"
                                        : "the request could not be queued for a worker");
        return NULL;
    }
    r->deliveries = 1;
    gw_req **bucket = &g->table[id_hash(r->id, GW_ID_LEN) & g->table_mask];
    r->hnext = *bucket;
    *bucket = r;
    r->next = g->running_head;
    if (r->next)
        r->next->prev = r;
    g->running_head = r;
    g->n_running++;
    t->streams++;
    t->requests++;
    account_bytes(g, r);
    int64_t wait_ms = deadline_ms - svc_wall_ms() + DEADLINE_GRACE_MS;
    if (wait_ms < 0)
        wait_ms = 0;
    struct timeval tv = {(time_t)(wait_ms / 1000), (suseconds_t)(wait_ms % 1000) * 1000};
    event_add(r->deadline, &tv);
    return r;
}

void gw_request_cancel(svc_gateway *g, gw_req *r)
{
    const char *topic = g->tenants[r->tenant].t->cancel_topic;
    svc_kafka_record rec = {.topic = topic, .partition = RD_KAFKA_PARTITION_UA, .key = r->id,
                            .key_len = GW_ID_LEN};
    char err[256];
    if (svc_producer_produce(g->producer, &rec, err, sizeof err) != SVC_KAFKA_OK)
        svc_log(SVC_LOG_WARN, "gateway_cancel_failed", "request %s to %s: %s", r->id, topic,
                err);
}

/* ---- metrics -------------------------------------------------------------------- */

static const svc_hist_def ttfb_def = {
    "mllama_gateway_ttfb_seconds",
    "request received to its first content byte written to the client", 12,
    {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32}};

void gw_count_error(svc_gateway *g, int status, const char *code)
{
    gw_metrics *m = &g->m;
    size_t i = 0;
    while (i < m->n_errors && !(m->errors[i].status == status && !strcmp(m->errors[i].code, code)))
        i++;
    if (i == m->n_errors) {
        if (m->n_errors == GW_ERROR_SERIES_MAX)
            i = GW_ERROR_SERIES_MAX - 1; /* the last series takes the overflow */
        else {
            m->n_errors++;
            m->errors[i].status = status;
            snprintf(m->errors[i].code, sizeof m->errors[i].code, "%s", code);
        }
    }
    m->errors[i].n++;
}

void gw_observe_ttfb(svc_gateway *g, double seconds)
{
    svc_hist_observe(&ttfb_def, &g->m.ttfb, seconds);
}

void gw_metrics_render(svc_gateway *g, svc_buf *b)
{
    const gw_metrics *m = &g->m;
    b->len = 0;
    svc_prom_head(b, "mllama_info", "version and role of this process", "gauge");
    svc_buf_printf(b, "mllama_info{version=\"%s\",role=\"gateway\",instance=\"%s\"} 1\n",
                   MLLAMA_VERSION, g->cfg.gateway.instance);
    svc_prom_head(b, "mllama_gateway_connections_open", "client connections open", "gauge");
    svc_buf_printf(b, "mllama_gateway_connections_open %zu\n", g->n_conns);
    svc_prom_head(b, "mllama_gateway_streams_open", "requests running, by tenant", "gauge");
    for (size_t i = 0; i < g->n_tenants; i++)
        svc_buf_printf(b, "mllama_gateway_streams_open{tenant=\"%s\"} %d\n", g->tenants[i].t->name,
                       g->tenants[i].streams);
    svc_prom_head(b, "mllama_gateway_requests_total", "chat requests produced, by tenant",
                  "counter");
    for (size_t i = 0; i < g->n_tenants; i++)
        svc_buf_printf(b, "mllama_gateway_requests_total{tenant=\"%s\"} %" PRIu64 "\n",
                       g->tenants[i].t->name, g->tenants[i].requests);
    svc_prom_head(b, "mllama_gateway_http_errors_total",
                  "HTTP answers with an error status, by status and code", "counter");
    for (size_t i = 0; i < m->n_errors; i++)
        svc_buf_printf(b, "mllama_gateway_http_errors_total{status=\"%d\",code=\"%s\"} %" PRIu64 "\n",
                       m->errors[i].status, m->errors[i].code, m->errors[i].n);
    svc_prom_head(b, ttfb_def.name, ttfb_def.help, "histogram");
    svc_prom_hist(b, &ttfb_def, &m->ttfb, NULL);
    const struct {
        const char *name, *help;
        uint64_t v;
    } counters[] = {
        {"mllama_gateway_resumes_total", "streams resumed (GET .../stream)", m->resumes},
        {"mllama_gateway_continuations_total",
         "streams continued across a new attempt (a worker lost mid-stream)", m->continuations},
        {"mllama_gateway_divergences_total",
         "streams ended because a new attempt could not continue them identically",
         m->divergences},
        {"mllama_gateway_abandoned_total",
         "running streams cancelled because no client read them for gateway.abandon_ms",
         m->abandoned},
        {"mllama_gateway_cancels_total", "explicit cancels (POST .../cancel)", m->cancels},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        svc_prom_head(b, counters[i].name, counters[i].help, "counter");
        svc_buf_printf(b, "%s %" PRIu64 "\n", counters[i].name, counters[i].v);
    }
    svc_prom_head(b, "mllama_gateway_image_fetches_total",
                  "image URLs fetched, by result (ok, refused, failed, too_large, busy)", "counter");
    for (int i = 0; i < GW_FETCH_N_STATUS; i++)
        svc_buf_printf(b, "mllama_gateway_image_fetches_total{result=\"%s\"} %" PRIu64 "\n",
                       gw_fetch_status_name((gw_fetch_status)i), m->fetches[i]);
    svc_prom_head(b, "mllama_gateway_image_fetches_pending",
                  "requests waiting on their image URLs (gateway.image_fetch_max_pending)",
                  "gauge");
    svc_buf_printf(b, "mllama_gateway_image_fetches_pending %zu\n", g->n_fetching);
    svc_prom_head(b, "mllama_gateway_retained_bytes",
                  "bytes of every stream's event log (gateway.max_retained_bytes)", "gauge");
    svc_buf_printf(b, "mllama_gateway_retained_bytes %zu\n", g->retained_bytes);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

int gw_tenant_index(const svc_gateway *g, const char *name)
{
    for (size_t i = 0; i < g->n_tenants; i++)
        if (!strcmp(g->tenants[i].t->name, name))
            return (int)i;
    return -1;
}

static bool is_tenant(void *ctx, const char *name)
{
    return gw_tenant_index(ctx, name) >= 0;
}

static int load_keys(svc_gateway *g, char *err, size_t errlen)
{
    gw_keys *keys;
    if (gw_keys_load(g->cfg.gateway.api_keys_file, is_tenant, g, &keys, err, errlen))
        return -1;
    gw_keys_free(g->keys);
    g->keys = keys;
    svc_log(SVC_LOG_INFO, "gateway_keys_loaded", "%zu keys from %s", gw_keys_count(keys),
            g->cfg.gateway.api_keys_file);
    return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    svc_gateway *g = arg;
    if (sig == SIGHUP) {
        char err[512];
        if (g->cfg.gateway.api_keys_file[0] && load_keys(g, err, sizeof err))
            svc_log(SVC_LOG_ERROR, "gateway_keys_rejected", "%s (the previous keys stay)", err);
        return;
    }
    if (!g->draining) {
        drain_start(g, (int)sig);
        return;
    }
    svc_log(SVC_LOG_INFO, "gateway_stopping", "signal %d during the drain: stopping now",
            (int)sig);
    event_base_loopbreak(g->base);
}

/* The hostname as [a-z0-9-]: a topic name's part and a metric label. */
static void default_instance(char *out, size_t n)
{
    char host[256] = "gateway";
    gethostname(host, sizeof host - 1);
    size_t k = 0;
    for (const char *p = host; *p && k + 1 < n; p++) {
        char c = (char)tolower((unsigned char)*p);
        out[k++] = (isalnum((unsigned char)c) && !(c & 0x80)) ? c : '-';
    }
    out[k] = 0;
}

/* Each tenant's reply topic, `<first exact topic of its policy>.gw-<instance>`,
 * which its policy must allow. */
static int name_reply_topics(svc_gateway *g, char *err, size_t errlen)
{
    for (size_t i = 0; i < g->n_tenants; i++) {
        gw_tenant *t = &g->tenants[i];
        const char *policy = t->t->reply_topics, *first = policy;
        size_t len = 0;
        for (const char *at = policy; *at && !len; at += strcspn(at, ",") + (at[strcspn(at, ",")] == ',')) {
            size_t l = strcspn(at, ",");
            if (l && at[l - 1] != '*')
                first = at, len = l;
        }
        int n = len ? snprintf(t->reply_topic, sizeof t->reply_topic, "%.*s.gw-%s", (int)len,
                               first, g->cfg.gateway.instance)
                    : -1;
        if (n < 0 || n > SVC_TOPIC_NAME_MAX ||
            !svc_reply_topic_allowed(&t->t->policy, t->reply_topic, strlen(t->reply_topic))) {
            svc_errf(err, errlen,
                     "tenant %s: its reply topics (%s) allow no '<topic>.gw-%s' for the gateway: "
                     "add an exact topic and its '.*' prefix",
                     t->t->name, policy, g->cfg.gateway.instance);
            return -1;
        }
    }
    return 0;
}

/* The gateway's checks of the configuration the worker's loader accepts. */
static int check_config(svc_gateway *g, char *err, size_t errlen)
{
    svc_config *c = &g->cfg;
    if (!strcmp(c->kafka.brokers, "mock")) {
        svc_errf(err, errlen, "kafka.brokers: the gateway needs the workers' cluster, not an "
                              "in-process mock (run `mllama mock-kafka` and point both at it)");
        return -1;
    }
    if (!c->gateway.instance[0])
        default_instance(c->gateway.instance, sizeof c->gateway.instance);
    for (const char *p = c->gateway.instance; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-')) {
            svc_errf(err, errlen, "gateway.instance: expected [a-z0-9-], got '%s'",
                     c->gateway.instance);
            return -1;
        }
    if (!c->gateway.api_keys_file[0] && c->n_tenants > 1) {
        svc_errf(err, errlen, "gateway.api_keys_file: required when tenants are configured "
                              "(a key says whose request it is)");
        return -1;
    }
    if (c->gateway.model[0]) {
        snprintf(g->model, sizeof g->model, "%s", c->gateway.model);
    } else {
        size_t len = strlen(c->model.dir);
        while (len > 1 && c->model.dir[len - 1] == '/')
            len--;
        const char *base = c->model.dir;
        for (size_t i = 0; i < len; i++)
            if (c->model.dir[i] == '/' && i + 1 < len)
                base = c->model.dir + i + 1;
        snprintf(g->model, sizeof g->model, "%.*s", (int)(c->model.dir + len - base), base);
    }
    return 0;
}

/* The image fetcher on the loop, under the gateway section's policy. */
static int start_fetcher(svc_gateway *g, char *err, size_t errlen)
{
    const svc_config *c = &g->cfg;
    gw_fetch_policy p = {
        .allow_http = c->gateway.image_fetch_http,
        .allow_private = c->gateway.image_fetch_private,
        .hosts = c->gateway.image_fetch_hosts,
        .ca_file = c->gateway.image_fetch_ca_file,
        .timeout_ms = c->gateway.image_fetch_timeout_ms,
        .max_redirects = c->gateway.image_fetch_redirects,
        .max_bytes = (size_t)c->limits.max_image_bytes,
        .max_held_bytes = (size_t)c->gateway.image_fetch_max_bytes,
    };
    return gw_fetcher_create(g->base, &p, &g->fetcher, err, errlen);
}

svc_gateway *svc_gateway_create(const svc_config *cfg, const char *port_file, int *code,
                                char *err, size_t errlen)
{
    svc_gateway *g = calloc(1, sizeof *g);
    *code = SVC_GATEWAY_EXIT_CONFIG;
    if (!g) {
        svc_errf(err, errlen, "out of memory");
        return NULL;
    }
    /* The copy owns the tenants and reserved names now; the caller's config
     * gives them up (config.h: a moved-from config is a no-op to deinit). */
    g->cfg = *cfg;
    g->wake[0] = g->wake[1] = -1;
    svc_config *moved = (svc_config *)cfg;
    moved->tenants = NULL, moved->reserved_topics = NULL;
    moved->n_tenants = moved->n_reserved_topics = moved->kafka.n_props = 0;
    g->n_tenants = g->cfg.n_tenants;
    g->tenants = calloc(g->n_tenants, sizeof *g->tenants);
    g->table = calloc(TABLE_BUCKETS, sizeof *g->table);
    g->table_mask = TABLE_BUCKETS - 1;
    g->base = event_base_new();
    if (!g->tenants || !g->table || !g->base) {
        svc_errf(err, errlen, "out of memory");
        svc_gateway_destroy(g);
        return NULL;
    }
    double now = svc_now_s();
    for (size_t i = 0; i < g->n_tenants; i++) {
        g->tenants[i].t = &g->cfg.tenants[i];
        gw_bucket_init(&g->tenants[i].bucket, g->cfg.tenants[i].requests_per_s,
                       g->cfg.tenants[i].burst, now);
    }
    if (check_config(g, err, errlen) || name_reply_topics(g, err, errlen) ||
        (g->cfg.gateway.api_keys_file[0] && load_keys(g, err, errlen))) {
        svc_gateway_destroy(g);
        return NULL;
    }
    if (gw_adapters_create(&g->cfg, &g->adapters, err, errlen) ||
        (g->cfg.gateway.image_fetch && start_fetcher(g, err, errlen))) {
        svc_gateway_destroy(g);
        return NULL;
    }
    *code = SVC_GATEWAY_EXIT_KAFKA;
    if (gw_kafka_start(g, err, errlen)) {
        svc_gateway_destroy(g);
        return NULL;
    }
    *code = SVC_GATEWAY_EXIT_CONFIG;
    if (gw_http_start(g, err, errlen)) {
        svc_gateway_destroy(g);
        return NULL;
    }
    const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        g->signals[i] = evsignal_new(g->base, sigs[i], on_signal, g);
        if (!g->signals[i] || event_add(g->signals[i], NULL)) {
            svc_errf(err, errlen, "event loop: cannot watch signal %d", sigs[i]);
            svc_gateway_destroy(g);
            return NULL;
        }
    }
    g->sweep = event_new(g->base, -1, EV_PERSIST, on_sweep, g);
    struct timeval tv = {0, SWEEP_MS * 1000};
    if (!g->sweep || event_add(g->sweep, &tv)) {
        svc_errf(err, errlen, "event loop: out of memory");
        svc_gateway_destroy(g);
        return NULL;
    }
    if (port_file) {
        char tmp[SVC_CONFIG_STR + 8];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d %d\n", g->port, g->ops_port) < 0 || fclose(f) ||
            rename(tmp, port_file)) {
            svc_errf(err, errlen, "%s: %s", port_file, strerror(errno));
            svc_gateway_destroy(g);
            return NULL;
        }
    }
    svc_log(SVC_LOG_INFO, "gateway_listening",
            "port %d ops_port %d instance %s model %s tenants %zu auth %s", g->port, g->ops_port,
            g->cfg.gateway.instance, g->model, g->n_tenants, g->keys ? "keys" : "none");
    *code = 0;
    return g;
}

int svc_gateway_run(svc_gateway *g)
{
    event_base_dispatch(g->base);
    return g->exit_code;
}

void svc_gateway_destroy(svc_gateway *g)
{
    if (!g)
        return;
    gw_http_stop(g);
    if (g->producer) {
        char err[256];
        if (svc_producer_flush(g->producer, FLUSH_MS, err, sizeof err) != SVC_KAFKA_OK)
            svc_log(SVC_LOG_WARN, "gateway_flush", "%s", err);
        svc_producer_destroy(g->producer); /* serves the last reports: requests still live */
    }
    while (g->running_head)
        request_end(g, g->running_head);
    while (g->ended_head) {
        g->ended_head->deliveries = 0;
        request_free(g, g->ended_head);
    }
    if (g->replies)
        rd_kafka_queue_destroy(g->replies);
    if (g->consumer) {
        rd_kafka_consumer_close(g->consumer);
        rd_kafka_destroy(g->consumer);
    }
    if (g->wake_ev)
        event_free(g->wake_ev);
    for (int i = 0; i < 2; i++)
        if (g->wake[i] >= 0)
            close(g->wake[i]);
    for (size_t i = 0; i < sizeof g->signals / sizeof g->signals[0]; i++)
        if (g->signals[i])
            event_free(g->signals[i]);
    if (g->sweep)
        event_free(g->sweep);
    gw_keys_free(g->keys);
    gw_adapters_destroy(g->adapters);
    gw_fetcher_destroy(g->fetcher); /* after gw_http_stop: no request waits on it */
    if (g->base)
        event_base_free(g->base);
    free(g->table);
    free(g->tenants);
    svc_config_deinit(&g->cfg);
    free(g);
}
