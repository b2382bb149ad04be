/* The Redis index client: connection, circuit breaker, the mirror of
 * resident images and its reconciliation, image index and heartbeat (see
 * redis_index.h). hiredis 0.14.1 synchronous API, one connection, commands
 * sent with redisAppendCommandArgv so keys and values are binary-safe and
 * several commands share one round trip. Blobs, adapters and attempt
 * counters are in redis_store.c, URL parsing in redis_url.c. */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "log.h"
#include "protocol/protocol.h"
#include "redis/redis_internal.h"

/* Deletes an image key only while it still names this worker. */
static const char del_if_owner_lua[] =
    "if redis.call('hget', KEYS[1], 'worker') == ARGV[1] then "
    "return redis.call('del', KEYS[1]) end return 0";

/* ---- Counters and names ------------------------------------------------- */

static void count(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static void gauge(_Atomic uint64_t *g, uint64_t v)
{
    atomic_store_explicit(g, v, memory_order_relaxed);
}

const char *svc_redis_status_name(svc_redis_status st)
{
    switch (st) {
    case SVC_REDIS_OK: return "ok";
    case SVC_REDIS_NOT_FOUND: return "not_found";
    case SVC_REDIS_UNAVAILABLE: return "unavailable";
    case SVC_REDIS_ERR_IO: return "io";
    case SVC_REDIS_ERR_REPLY: return "reply";
    case SVC_REDIS_ERR_TOO_LARGE: return "too_large";
    case SVC_REDIS_ERR_INVALID: return "invalid";
    case SVC_REDIS_ERR_NOMEM: return "nomem";
    }
    return "invalid";
}

/* ---- Create / destroy --------------------------------------------------- */

void svc_redis_config_default(svc_redis_config *cfg)
{
    *cfg = (svc_redis_config){
        .connect_timeout_ms = 200,
        .command_timeout_ms = 200,
        .call_timeout_ms = 1000,
        .breaker_failures = 3,
        .breaker_open_ms = 1000,
        .breaker_open_max_ms = 30000,
        .img_ttl_s = 300,
        .worker_ttl_s = 30,
        .attempts_ttl_s = 86400,
        .offset_attempts_ttl_s = 3600,
        .max_pending_deletes = 4096,
        .max_resident = 65536,
    };
}

static bool valid_worker_id(const char *s)
{
    size_t len = strlen(s);
    if (len == 0 || len > WORKER_ID_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] <= ' ' || s[i] >= 0x7f || s[i] == ':')
            return false;
    return true;
}

svc_redis_status svc_redis_create(const svc_redis_config *cfg, svc_redis **out, char *err,
                                  size_t errlen)
{
    *out = NULL;
    if (!cfg->prefix || strlen(cfg->prefix) > PREFIX_MAX ||
        !svc_valid_topic(cfg->prefix, strlen(cfg->prefix))) {
        svc_errf(err, errlen, "redis prefix must be 1..%d characters [A-Za-z0-9._-]", PREFIX_MAX);
        return SVC_REDIS_ERR_INVALID;
    }
    if (!cfg->worker_id || !valid_worker_id(cfg->worker_id)) {
        svc_errf(err, errlen,
                 "worker id must be 1..%d printable characters without spaces or ':'",
                 WORKER_ID_MAX);
        return SVC_REDIS_ERR_INVALID;
    }
    if (cfg->connect_timeout_ms <= 0 || cfg->command_timeout_ms <= 0 ||
        cfg->call_timeout_ms <= 0 || cfg->offset_attempts_ttl_s <= 0 ||
        cfg->breaker_failures <= 0 || cfg->breaker_open_ms <= 0 ||
        cfg->breaker_open_max_ms < cfg->breaker_open_ms || cfg->img_ttl_s <= 0 ||
        cfg->worker_ttl_s <= 0 || cfg->attempts_ttl_s <= 0 || cfg->max_resident == 0) {
        svc_errf(err, errlen, "redis: timeouts, TTLs, breaker settings and max_resident must be "
                              "positive (breaker_open_max_ms >= breaker_open_ms)");
        return SVC_REDIS_ERR_INVALID;
    }
    svc_redis *r = calloc(1, sizeof *r);
    if (!r) {
        svc_errf(err, errlen, "out of memory");
        return SVC_REDIS_ERR_NOMEM;
    }
    svc_redis_status st = svc_redis_url_parse(cfg->url, &r->url, err, errlen);
    if (st != SVC_REDIS_OK) {
        free(r);
        return st;
    }
    snprintf(r->prefix, sizeof r->prefix, "%s", cfg->prefix);
    snprintf(r->worker_id, sizeof r->worker_id, "%s", cfg->worker_id);
    r->cfg = *cfg;
    r->cfg.url = r->cfg.prefix = r->cfg.worker_id = NULL;
    r->open_ms = cfg->breaker_open_ms;
    if (cfg->max_pending_deletes > 0) {
        r->pending = calloc(cfg->max_pending_deletes, sizeof *r->pending);
        if (!r->pending) {
            free(r);
            svc_errf(err, errlen, "out of memory");
            return SVC_REDIS_ERR_NOMEM;
        }
    }
    *out = r;
    return SVC_REDIS_OK;
}

static void disconnect(svc_redis *r)
{
    if (r->c)
        redisFree(r->c);
    r->c = NULL;
}

void svc_redis_destroy(svc_redis *r)
{
    if (!r)
        return;
    disconnect(r);
    free(r->imgs);
    free(r->pending);
    free(r->partitions);
    free(r);
}

void svc_redis_stats_get(const svc_redis *r, svc_redis_stats *out)
{
    svc_redis *m = (svc_redis *)r; /* atomics are read through non-const pointers */
    *out = (svc_redis_stats){
        .calls = atomic_load_explicit(&m->n_calls, memory_order_relaxed),
        .errors = atomic_load_explicit(&m->n_errors, memory_order_relaxed),
        .fast_fails = atomic_load_explicit(&m->n_fast_fails, memory_order_relaxed),
        .breaker_opens = atomic_load_explicit(&m->n_opens, memory_order_relaxed),
        .connects = atomic_load_explicit(&m->n_connects, memory_order_relaxed),
        .reconciliations = atomic_load_explicit(&m->n_reconciliations, memory_order_relaxed),
        .pending_dropped = atomic_load_explicit(&m->n_pending_dropped, memory_order_relaxed),
        .resident = atomic_load_explicit(&m->n_resident, memory_order_relaxed),
        .pending_deletes = atomic_load_explicit(&m->n_pending_now, memory_order_relaxed),
        .breaker = (svc_redis_breaker)atomic_load_explicit(&m->breaker, memory_order_relaxed),
    };
}

/* ---- Commands ----------------------------------------------------------- */

void svc_redis_arg(svc_redis_cmd *c, const void *s, size_t len)
{
    assert(c->argc < ARGS_MAX);
    c->argv[c->argc] = s;
    c->len[c->argc++] = len;
}

void svc_redis_arg_str(svc_redis_cmd *c, const char *s)
{
    svc_redis_arg(c, s, strlen(s));
}

/* Queue a command on the connection's output buffer (no I/O yet). It fails
 * only when hiredis cannot allocate, which leaves the context in error, so
 * it counts as a connection failure. */
svc_redis_status svc_redis_append(svc_redis *r, svc_redis_cmd *c)
{
    if (redisAppendCommandArgv(r->c, c->argc, c->argv, c->len) != REDIS_OK)
        return SVC_REDIS_ERR_IO;
    return SVC_REDIS_OK;
}

static struct timeval ms_to_tv(int ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Arm the socket for one read or write: the time left of the call's
 * deadline, at most command_timeout_ms. ERR_IO once the deadline passed. */
static svc_redis_status arm(svc_redis *r)
{
    long long left = r->deadline_ms - svc_now_ms();
    if (left <= 0)
        return SVC_REDIS_ERR_IO;
    int ms = left < r->cfg.command_timeout_ms ? (int)left : r->cfg.command_timeout_ms;
    return redisSetTimeout(r->c, ms_to_tv(ms)) == REDIS_OK ? SVC_REDIS_OK : SVC_REDIS_ERR_IO;
}

/* Read the next reply. ERR_IO leaves *reply NULL; an error reply is
 * returned (ERR_REPLY) so that the pipeline stays in step. This is
 * redisGetReply's loop with each write and read armed by arm(): hiredis's
 * own bounds each read, so a server sending a byte per timeout would hold
 * it for ever. */
svc_redis_status svc_redis_next_reply(svc_redis *r, redisReply **reply)
{
    void *p = NULL;
    *reply = NULL;
    if (redisGetReplyFromReader(r->c, &p) != REDIS_OK)
        return SVC_REDIS_ERR_IO;
    for (int done = 0; !p && !done;)
        if (arm(r) != SVC_REDIS_OK || redisBufferWrite(r->c, &done) != REDIS_OK)
            return SVC_REDIS_ERR_IO;
    while (!p)
        if (arm(r) != SVC_REDIS_OK || redisBufferRead(r->c) != REDIS_OK ||
            redisGetReplyFromReader(r->c, &p) != REDIS_OK)
            return SVC_REDIS_ERR_IO;
    *reply = p;
    return (*reply)->type == REDIS_REPLY_ERROR ? SVC_REDIS_ERR_REPLY : SVC_REDIS_OK;
}

/* Read n replies and discard them; the first non-OK status wins, and an I/O
 * error stops reading (the connection is dropped by the caller). */
svc_redis_status svc_redis_drain(svc_redis *r, size_t n)
{
    svc_redis_status first = SVC_REDIS_OK;
    for (size_t i = 0; i < n; i++) {
        redisReply *rep;
        svc_redis_status st = svc_redis_next_reply(r, &rep);
        freeReplyObject(rep);
        if (first == SVC_REDIS_OK)
            first = st;
        if (st == SVC_REDIS_ERR_IO)
            break;
    }
    return first;
}

static void key_img(const svc_redis *r, const char *sha, char key[KEY_MAX])
{
    snprintf(key, KEY_MAX, "%s:img:%s", r->prefix, sha);
}

static void key_worker(const svc_redis *r, char key[KEY_MAX])
{
    snprintf(key, KEY_MAX, "%s:worker:%s", r->prefix, r->worker_id);
}

void svc_redis_fmt_i64(char buf[NUM_MAX], int64_t v)
{
    snprintf(buf, NUM_MAX, "%" PRId64, v);
}

void svc_redis_fmt_u64(char buf[NUM_MAX], uint64_t v)
{
    snprintf(buf, NUM_MAX, "%" PRIu64, v);
}

/* Queue h (a command on `key`), then EXPIRE key ttl: two replies. */
static svc_redis_status append_with_expire(svc_redis *r, svc_redis_cmd *h, const char *key,
                                           const char *ttl)
{
    svc_redis_cmd x = {0};
    svc_redis_arg_str(&x, "EXPIRE");
    svc_redis_arg_str(&x, key);
    svc_redis_arg_str(&x, ttl);
    svc_redis_status st = svc_redis_append(r, h);
    return st ? st : svc_redis_append(r, &x);
}

/* HSET <img key> worker .. bytes .. tiles .. last_use .. ; EXPIRE <key> ttl */
static svc_redis_status append_img_publish(svc_redis *r, const img_entry *e)
{
    svc_redis_scratch s;
    key_img(r, e->sha, s.key);
    svc_redis_fmt_u64(s.n[0], e->bytes);
    svc_redis_fmt_u64(s.n[1], e->tiles);
    svc_redis_fmt_i64(s.n[2], e->last_use_ms);
    svc_redis_fmt_i64(s.n[3], r->cfg.img_ttl_s);
    svc_redis_cmd h = {0};
    svc_redis_arg_str(&h, "HSET");
    svc_redis_arg_str(&h, s.key);
    svc_redis_arg_str(&h, "worker");
    svc_redis_arg_str(&h, r->worker_id);
    svc_redis_arg_str(&h, "bytes");
    svc_redis_arg_str(&h, s.n[0]);
    svc_redis_arg_str(&h, "tiles");
    svc_redis_arg_str(&h, s.n[1]);
    svc_redis_arg_str(&h, "last_use");
    svc_redis_arg_str(&h, s.n[2]);
    return append_with_expire(r, &h, s.key, s.n[3]);
}

static svc_redis_status append_img_delete(svc_redis *r, const char *sha)
{
    svc_redis_scratch s;
    key_img(r, sha, s.key);
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "EVAL");
    svc_redis_arg(&c, del_if_owner_lua, sizeof del_if_owner_lua - 1);
    svc_redis_arg_str(&c, "1");
    svc_redis_arg_str(&c, s.key);
    svc_redis_arg_str(&c, r->worker_id);
    return svc_redis_append(r, &c);
}

/* HSET <worker key> ... ; EXPIRE <key> ttl (2 replies) */
static svc_redis_status append_worker_publish(svc_redis *r)
{
    svc_redis_scratch s;
    key_worker(r, s.key);
    svc_redis_fmt_u64(s.n[0], r->free_pool_bytes);
    svc_redis_fmt_i64(s.n[1], r->heartbeat_ms);
    svc_redis_fmt_i64(s.n[2], r->cfg.worker_ttl_s);
    svc_redis_cmd h = {0};
    svc_redis_arg_str(&h, "HSET");
    svc_redis_arg_str(&h, s.key);
    svc_redis_arg_str(&h, "partitions");
    svc_redis_arg_str(&h, r->partitions ? r->partitions : "");
    svc_redis_arg_str(&h, "free_pool_bytes");
    svc_redis_arg_str(&h, s.n[0]);
    svc_redis_arg_str(&h, "heartbeat_ms");
    svc_redis_arg_str(&h, s.n[1]);
    return append_with_expire(r, &h, s.key, s.n[2]);
}

/* ---- Breaker and connection --------------------------------------------- */

static void set_breaker(svc_redis *r, svc_redis_breaker b)
{
    atomic_store_explicit(&r->breaker, (int)b, memory_order_relaxed);
}

static svc_redis_breaker breaker(const svc_redis *r)
{
    return (svc_redis_breaker)atomic_load_explicit(&((svc_redis *)r)->breaker,
                                                   memory_order_relaxed);
}

/* A call failed after reaching for the network. The connection is dropped
 * whatever the cause: hiredis contexts are unusable after an I/O error, and
 * after an error reply a pipeline may have unread replies; reconnecting is
 * cheap next to either. Index writes may have been lost: reconcile. */
static svc_redis_status call_failed(svc_redis *r, svc_redis_status st)
{
    count(&r->n_errors);
    r->needs_reconcile = true;
    disconnect(r);
    r->consecutive_failures++;
    svc_redis_breaker b = breaker(r);
    if (b == SVC_REDIS_BREAKER_HALF_OPEN || r->consecutive_failures >= r->cfg.breaker_failures) {
        if (b == SVC_REDIS_BREAKER_HALF_OPEN)
            r->open_ms = r->open_ms > r->cfg.breaker_open_max_ms / 2 ? r->cfg.breaker_open_max_ms
                                                                     : r->open_ms * 2;
        r->open_until_ms = svc_now_ms() + r->open_ms;
        set_breaker(r, SVC_REDIS_BREAKER_OPEN);
        count(&r->n_opens);
        svc_log(SVC_LOG_WARN, "redis.breaker_open",
                "redis %s:%d unavailable after %d failures (%s); retrying in %d ms",
                r->url.host, r->url.port, r->consecutive_failures, svc_redis_status_name(st),
                r->open_ms);
    }
    return st;
}

static void call_succeeded(svc_redis *r)
{
    if (breaker(r) != SVC_REDIS_BREAKER_CLOSED)
        svc_log(SVC_LOG_INFO, "redis.breaker_closed", "redis %s:%d is back", r->url.host,
                r->url.port);
    r->consecutive_failures = 0;
    r->open_ms = r->cfg.breaker_open_ms;
    set_breaker(r, SVC_REDIS_BREAKER_CLOSED);
}

/* Connect within the call's deadline (the name's resolution aside:
 * redis.h), then AUTH (with the ACL user when the URL names one) and
 * SELECT. */
static svc_redis_status connect_now(svc_redis *r)
{
    long long left = r->deadline_ms - svc_now_ms();
    if (left <= 0)
        return SVC_REDIS_ERR_IO;
    int ms = left < r->cfg.connect_timeout_ms ? (int)left : r->cfg.connect_timeout_ms;
    r->c = redisConnectWithTimeout(r->url.host, r->url.port, ms_to_tv(ms));
    if (!r->c || r->c->err)
        return SVC_REDIS_ERR_IO;
    size_t n = 0;
    svc_redis_status st = SVC_REDIS_OK;
    if (r->url.password[0]) {
        svc_redis_cmd c = {0};
        svc_redis_arg_str(&c, "AUTH");
        if (r->url.user[0])
            svc_redis_arg_str(&c, r->url.user);
        svc_redis_arg_str(&c, r->url.password);
        st = svc_redis_append(r, &c);
        n++;
    }
    if (!st && r->url.db != 0) {
        char db[NUM_MAX];
        svc_redis_fmt_i64(db, r->url.db);
        svc_redis_cmd c = {0};
        svc_redis_arg_str(&c, "SELECT");
        svc_redis_arg_str(&c, db);
        st = svc_redis_append(r, &c);
        n++;
    }
    if (!st && n)
        st = svc_redis_drain(r, n);
    if (st == SVC_REDIS_OK)
        count(&r->n_connects);
    return st;
}

static svc_redis_status reconcile(svc_redis *r);

/* Start a call: refuse it while the breaker is open, else connect and
 * reconcile as needed. OK means r->c is ready for the call's commands. */
svc_redis_status svc_redis_call_begin(svc_redis *r)
{
    count(&r->n_calls);
    r->deadline_ms = svc_now_ms() + r->cfg.call_timeout_ms;
    if (breaker(r) == SVC_REDIS_BREAKER_OPEN) {
        if (svc_now_ms() < r->open_until_ms) {
            count(&r->n_fast_fails);
            return SVC_REDIS_UNAVAILABLE;
        }
        set_breaker(r, SVC_REDIS_BREAKER_HALF_OPEN);
    }
    svc_redis_status st = SVC_REDIS_OK;
    if (!r->c) {
        st = connect_now(r);
        if (st != SVC_REDIS_OK) /* ERR_REPLY: AUTH or SELECT refused */
            return call_failed(r, st);
    }
    if (r->needs_reconcile) {
        st = reconcile(r);
        if (st != SVC_REDIS_OK)
            return call_failed(r, st);
    }
    return SVC_REDIS_OK;
}

/* Finish a call whose commands returned `st`. Redis answering NOT_FOUND or
 * a value over the caller's cap is a successful exchange. */
svc_redis_status svc_redis_call_end(svc_redis *r, svc_redis_status st)
{
    if (st == SVC_REDIS_OK || st == SVC_REDIS_NOT_FOUND || st == SVC_REDIS_ERR_TOO_LARGE) {
        call_succeeded(r);
        return st;
    }
    return call_failed(r, st);
}

/* ---- Mirror and pending deletes ----------------------------------------- */

/* Index of sha in the mirror, or where it would be inserted (*found false). */
static size_t mirror_find(const svc_redis *r, const char *sha, bool *found)
{
    size_t lo = 0, hi = r->n_imgs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->imgs[mid].sha, sha);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static void pending_remove(svc_redis *r, const char *sha)
{
    for (size_t i = 0; i < r->n_pending; i++) {
        if (!strcmp(r->pending[i], sha)) {
            memmove(&r->pending[i], &r->pending[i + 1], (r->n_pending - i - 1) * SHA_BUF);
            r->n_pending--;
            gauge(&r->n_pending_now, r->n_pending);
            return;
        }
    }
}

/* Defer a delete; when full, the oldest is dropped (its key expires). */
static void pending_add(svc_redis *r, const char *sha)
{
    size_t max = r->cfg.max_pending_deletes;
    pending_remove(r, sha);
    if (max == 0) {
        count(&r->n_pending_dropped);
        return;
    }
    if (r->n_pending == max) {
        memmove(&r->pending[0], &r->pending[1], (max - 1) * SHA_BUF);
        r->n_pending--;
        count(&r->n_pending_dropped);
    }
    memcpy(r->pending[r->n_pending++], sha, SHA_BUF);
    gauge(&r->n_pending_now, r->n_pending);
}

/* ---- Reconciliation ----------------------------------------------------- */

/* Re-publish the worker hash and every resident image, and delete the
 * images evicted while Redis was unreachable: one pipeline. */
static svc_redis_status reconcile(svc_redis *r)
{
    size_t n = 0;
    svc_redis_status st = SVC_REDIS_OK;
    if (r->have_info) {
        st = append_worker_publish(r);
        n += 2;
    }
    for (size_t i = 0; !st && i < r->n_imgs; i++, n += 2)
        st = append_img_publish(r, &r->imgs[i]);
    for (size_t i = 0; !st && i < r->n_pending; i++, n++)
        st = append_img_delete(r, r->pending[i]);
    if (st != SVC_REDIS_OK)
        return st;
    st = svc_redis_drain(r, n);
    if (st != SVC_REDIS_OK)
        return st;
    r->n_pending = 0;
    gauge(&r->n_pending_now, 0);
    r->needs_reconcile = false;
    count(&r->n_reconciliations);
    svc_log(SVC_LOG_INFO, "redis.reconciled", "re-published %zu images%s", r->n_imgs,
            r->have_info ? " and the worker heartbeat" : "");
    return SVC_REDIS_OK;
}

/* ---- Image index -------------------------------------------------------- */

/* Publish one mirror entry as a call of its own. */
static svc_redis_status publish_entry(svc_redis *r, const img_entry *e)
{
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    st = append_img_publish(r, e);
    if (st == SVC_REDIS_OK)
        st = svc_redis_drain(r, 2);
    return svc_redis_call_end(r, st);
}

svc_redis_status svc_redis_img_insert(svc_redis *r, const char *sha256, uint64_t bytes,
                                      uint32_t tiles, int64_t now_ms)
{
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)))
        return SVC_REDIS_ERR_INVALID;
    bool found;
    size_t i = mirror_find(r, sha256, &found);
    if (!found) {
        if (r->n_imgs >= r->cfg.max_resident)
            return SVC_REDIS_ERR_TOO_LARGE;
        if (r->n_imgs == r->cap_imgs) {
            enum { MIRROR_MIN_CAP = 64 };
            size_t cap = r->cap_imgs ? r->cap_imgs * 2 : MIRROR_MIN_CAP;
            img_entry *p = realloc(r->imgs, cap * sizeof *p);
            if (!p)
                return SVC_REDIS_ERR_NOMEM;
            r->imgs = p;
            r->cap_imgs = cap;
        }
        memmove(&r->imgs[i + 1], &r->imgs[i], (r->n_imgs - i) * sizeof *r->imgs);
        r->n_imgs++;
        memcpy(r->imgs[i].sha, sha256, SHA_BUF);
        gauge(&r->n_resident, r->n_imgs);
    }
    img_entry *e = &r->imgs[i];
    e->bytes = bytes;
    e->tiles = tiles;
    e->last_use_ms = now_ms;
    /* A deferred delete would now remove this worker's fresh entry. */
    pending_remove(r, sha256);
    return publish_entry(r, e);
}

svc_redis_status svc_redis_img_touch(svc_redis *r, const char *sha256, int64_t now_ms)
{
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)))
        return SVC_REDIS_ERR_INVALID;
    bool found;
    size_t i = mirror_find(r, sha256, &found);
    if (!found)
        return SVC_REDIS_OK;
    r->imgs[i].last_use_ms = now_ms;
    /* The whole entry, not just last_use: the key may have vanished. */
    return publish_entry(r, &r->imgs[i]);
}

svc_redis_status svc_redis_img_evict(svc_redis *r, const char *sha256)
{
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)))
        return SVC_REDIS_ERR_INVALID;
    bool found;
    size_t i = mirror_find(r, sha256, &found);
    if (!found)
        return SVC_REDIS_OK;
    memmove(&r->imgs[i], &r->imgs[i + 1], (r->n_imgs - i - 1) * sizeof *r->imgs);
    r->n_imgs--;
    gauge(&r->n_resident, r->n_imgs);

    svc_redis_status st = svc_redis_call_begin(r);
    if (st == SVC_REDIS_OK) {
        st = append_img_delete(r, sha256);
        if (st == SVC_REDIS_OK)
            st = svc_redis_drain(r, 1);
        st = svc_redis_call_end(r, st);
    }
    if (st != SVC_REDIS_OK)
        pending_add(r, sha256);
    return st;
}

/* ---- Heartbeat ---------------------------------------------------------- */

static svc_redis_status remember_info(svc_redis *r, const svc_redis_worker_info *info,
                                      int64_t now_ms)
{
    char *partitions = strdup(info->partitions ? info->partitions : "");
    if (!partitions)
        return SVC_REDIS_ERR_NOMEM;
    free(r->partitions);
    r->partitions = partitions;
    r->free_pool_bytes = info->free_pool_bytes;
    r->heartbeat_ms = now_ms;
    r->have_info = true;
    return SVC_REDIS_OK;
}

svc_redis_status svc_redis_heartbeat(svc_redis *r, const svc_redis_worker_info *info,
                                     int64_t now_ms)
{
    svc_redis_status st = remember_info(r, info, now_ms);
    if (st != SVC_REDIS_OK)
        return st;
    st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;

    /* Worker hash, then one EXPIRE per image: 0 means the key is gone. */
    char ttl[NUM_MAX];
    svc_redis_fmt_i64(ttl, r->cfg.img_ttl_s);
    st = append_worker_publish(r);
    for (size_t i = 0; !st && i < r->n_imgs; i++) {
        char key[KEY_MAX];
        key_img(r, r->imgs[i].sha, key);
        svc_redis_cmd x = {0};
        svc_redis_arg_str(&x, "EXPIRE");
        svc_redis_arg_str(&x, key);
        svc_redis_arg_str(&x, ttl);
        st = svc_redis_append(r, &x);
    }
    if (st == SVC_REDIS_OK)
        st = svc_redis_drain(r, 2);
    size_t n_missing = 0;
    for (size_t i = 0; st == SVC_REDIS_OK && i < r->n_imgs; i++) {
        redisReply *rep;
        st = svc_redis_next_reply(r, &rep);
        if (st == SVC_REDIS_OK && rep->type != REDIS_REPLY_INTEGER)
            st = SVC_REDIS_ERR_REPLY;
        if (st == SVC_REDIS_OK && rep->integer == 0) {
            /* Gone from Redis: publish again (appended now, read below). */
            st = append_img_publish(r, &r->imgs[i]);
            n_missing++;
        }
        freeReplyObject(rep);
    }
    if (st == SVC_REDIS_OK && n_missing > 0)
        st = svc_redis_drain(r, 2 * n_missing);
    return svc_redis_call_end(r, st);
}

