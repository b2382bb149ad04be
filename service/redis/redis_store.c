/* Plain key-value operations of the Redis client, through the same
 * connection and breaker as the index: image blobs, adapters and the
 * attempt counters (redis.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "protocol/protocol.h"
#include "redis/redis_internal.h"

/* ---- Blobs -------------------------------------------------------------- */

static void key_blob(const svc_redis *r, const char *sha, char key[KEY_MAX])
{
    snprintf(key, KEY_MAX, "%s:blob:img:%s", r->prefix, sha);
}

svc_redis_status svc_redis_blob_get(svc_redis *r, const char *sha256, size_t max_bytes,
                                    uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)))
        return SVC_REDIS_ERR_INVALID;
    if (max_bytes > REDIS_VALUE_MAX)
        max_bytes = REDIS_VALUE_MAX;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_scratch s;
    key_blob(r, sha256, s.key);
    svc_redis_fmt_u64(s.n[0], max_bytes); /* GETRANGE's end is inclusive: max_bytes + 1 at most */
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "GETRANGE");
    svc_redis_arg_str(&c, s.key);
    svc_redis_arg_str(&c, "0");
    svc_redis_arg_str(&c, s.n[0]);
    redisReply *rep = NULL;
    st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_next_reply(r, &rep);
    if (st == SVC_REDIS_OK && rep->type != REDIS_REPLY_STRING)
        st = SVC_REDIS_ERR_REPLY;
    if (st == SVC_REDIS_OK && rep->len == 0)
        st = SVC_REDIS_NOT_FOUND;
    if (st == SVC_REDIS_OK && (size_t)rep->len > max_bytes)
        st = SVC_REDIS_ERR_TOO_LARGE;
    if (st == SVC_REDIS_OK) {
        *data = malloc((size_t)rep->len);
        if (*data) {
            memcpy(*data, rep->str, (size_t)rep->len);
            *len = (size_t)rep->len;
        }
    }
    freeReplyObject(rep);
    st = svc_redis_call_end(r, st);
    return (st == SVC_REDIS_OK && !*data) ? SVC_REDIS_ERR_NOMEM : st;
}

svc_redis_status svc_redis_blob_put(svc_redis *r, const char *sha256, const void *data,
                                    size_t len, int ttl_s)
{
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)) || ttl_s <= 0 ||
        len > REDIS_VALUE_MAX)
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_scratch s;
    key_blob(r, sha256, s.key);
    svc_redis_fmt_i64(s.n[0], ttl_s);
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "SET");
    svc_redis_arg_str(&c, s.key);
    svc_redis_arg(&c, data, len);
    svc_redis_arg_str(&c, "EX");
    svc_redis_arg_str(&c, s.n[0]);
    st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_drain(r, 1);
    return svc_redis_call_end(r, st);
}

static svc_redis_status hget(svc_redis *r, const char *key, const char *field, char *out,
                             size_t n);

/* ---- Adapters ----------------------------------------------------------- */

static bool adapter_key(const svc_redis *r, const char *name, char key[KEY_MAX])
{
    if (!name || !svc_valid_adapter_name(name, strlen(name)))
        return false;
    snprintf(key, KEY_MAX, "%s:adapter:%s", r->prefix, name);
    return true;
}

void svc_redis_adapter_deinit(svc_redis_adapter *a)
{
    free(a->config);
    free(a->weights);
    memset(a, 0, sizeof *a);
}

static uint8_t *dup_bytes(const char *s, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    if (p)
        memcpy(p, s, len);
    return p;
}

/* One round trip: the sizes first, the bytes only when they fit ARGV[1].
 * Returns {0} (a file missing or empty), {1} (too large) or
 * {2, config, weights, sha256 or false}. */
static const char adapter_get_lua[] =
    "local c = redis.call('hstrlen', KEYS[1], 'config') "
    "local w = redis.call('hstrlen', KEYS[1], 'weights') "
    "if c == 0 or w == 0 then return {0} end "
    "if c + w > tonumber(ARGV[1]) then return {1} end "
    "local v = redis.call('hmget', KEYS[1], 'config', 'weights', 'sha256') "
    "return {2, v[1], v[2], v[3]}";

enum { ADAPTER_MISSING = 0, ADAPTER_TOO_LARGE = 1, ADAPTER_FOUND = 2, ADAPTER_FOUND_LEN = 4 };

/* adapter_get_lua's answer into *out. */
static svc_redis_status adapter_reply(const redisReply *rep, svc_redis_adapter *out)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER)
        return SVC_REDIS_ERR_REPLY;
    long long tag = rep->element[0]->integer;
    if (tag == ADAPTER_MISSING)
        return SVC_REDIS_NOT_FOUND;
    if (tag == ADAPTER_TOO_LARGE)
        return SVC_REDIS_ERR_TOO_LARGE;
    if (tag != ADAPTER_FOUND || rep->elements != ADAPTER_FOUND_LEN ||
        rep->element[1]->type != REDIS_REPLY_STRING || rep->element[2]->type != REDIS_REPLY_STRING)
        return SVC_REDIS_ERR_REPLY;
    const redisReply *sha = rep->element[3]; /* Lua false arrives as nil */
    if (sha->type == REDIS_REPLY_STRING && (size_t)sha->len == SVC_SHA256_HEX_LEN)
        memcpy(out->sha256, sha->str, SVC_SHA256_HEX_LEN + 1);
    out->config = dup_bytes(rep->element[1]->str, (size_t)rep->element[1]->len);
    out->weights = dup_bytes(rep->element[2]->str, (size_t)rep->element[2]->len);
    out->config_len = (size_t)rep->element[1]->len;
    out->weights_len = (size_t)rep->element[2]->len;
    return out->config && out->weights ? SVC_REDIS_OK : SVC_REDIS_ERR_NOMEM;
}

void svc_redis_adapter_digest(const void *config, size_t config_len, const void *weights,
                              size_t weights_len, char hex[SVC_SHA256_HEX_LEN + 1])
{
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char line[SVC_SHA256_HEX_LEN + 1];
    ml_sha256_ctx all;
    ml_sha256_init(&all);
    ml_sha256(config, config_len, d);
    ml_sha256_hex(d, line);
    ml_sha256_update(&all, line, SVC_SHA256_HEX_LEN);
    ml_sha256_update(&all, "\n", 1);
    ml_sha256(weights, weights_len, d);
    ml_sha256_hex(d, line);
    ml_sha256_update(&all, line, SVC_SHA256_HEX_LEN);
    ml_sha256_update(&all, "\n", 1);
    ml_sha256_final(&all, d);
    ml_sha256_hex(d, hex);
}

svc_redis_status svc_redis_adapter_get(svc_redis *r, const char *name, size_t max_bytes,
                                       svc_redis_adapter *out)
{
    memset(out, 0, sizeof *out);
    svc_redis_scratch s;
    if (!adapter_key(r, name, s.key))
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_fmt_u64(s.n[0], max_bytes);
    svc_redis_cmd c = {0};
    /* EVAL_RO (Redis 7): a read-only script, so the worker's read-only
     * permission on adapter keys (ops/redis/users.acl) admits it. */
    svc_redis_arg_str(&c, "EVAL_RO");
    svc_redis_arg(&c, adapter_get_lua, sizeof adapter_get_lua - 1);
    svc_redis_arg_str(&c, "1");
    svc_redis_arg_str(&c, s.key);
    svc_redis_arg_str(&c, s.n[0]);
    redisReply *rep = NULL;
    st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_next_reply(r, &rep);
    if (st == SVC_REDIS_OK)
        st = adapter_reply(rep, out);
    freeReplyObject(rep);
    /* Out of memory here is no failure of Redis. */
    st = st == SVC_REDIS_ERR_NOMEM ? (svc_redis_call_end(r, SVC_REDIS_OK), st)
                                   : svc_redis_call_end(r, st);
    if (st != SVC_REDIS_OK)
        svc_redis_adapter_deinit(out);
    return st;
}

svc_redis_status svc_redis_adapter_sha256(svc_redis *r, const char *name,
                                          char hex[SVC_SHA256_HEX_LEN + 1])
{
    hex[0] = '\0';
    char key[KEY_MAX];
    if (!adapter_key(r, name, key))
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    char v[SVC_SHA256_HEX_LEN + 2]; /* one more: a longer value is refused */
    st = hget(r, key, "sha256", v, sizeof v);
    if (st == SVC_REDIS_OK && !svc_valid_sha256(v, strlen(v)))
        st = SVC_REDIS_NOT_FOUND; /* not a digest: as good as none */
    if (st == SVC_REDIS_OK)
        memcpy(hex, v, SVC_SHA256_HEX_LEN + 1);
    return svc_redis_call_end(r, st);
}

svc_redis_status svc_redis_adapter_put(svc_redis *r, const char *name, const void *config,
                                       size_t config_len, const void *weights,
                                       size_t weights_len)
{
    char key[KEY_MAX];
    if (!adapter_key(r, name, key) || config_len == 0 || weights_len == 0 ||
        config_len > REDIS_VALUE_MAX || weights_len > REDIS_VALUE_MAX)
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "HSET");
    svc_redis_arg_str(&c, key);
    svc_redis_arg_str(&c, "config");
    svc_redis_arg(&c, config, config_len);
    svc_redis_arg_str(&c, "weights");
    svc_redis_arg(&c, weights, weights_len);
    char digest[SVC_SHA256_HEX_LEN + 1];
    svc_redis_adapter_digest(config, config_len, weights, weights_len, digest);
    svc_redis_arg_str(&c, "sha256");
    svc_redis_arg_str(&c, digest);
    st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_drain(r, 1);
    return svc_redis_call_end(r, st);
}

/* Keys SCAN looks at per round trip: the adapters are few next to the
 * image keys around them, so a round trip should cover many keys. */
#define SCAN_COUNT "1000"

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void svc_redis_names_free(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* One SCAN reply's adapter names appended to names (capacity max_names). */
static svc_redis_status scan_names(const svc_redis *r, const redisReply *keys, char **names,
                                   size_t *n, size_t max_names)
{
    size_t skip = strlen(r->prefix) + sizeof ":adapter:" - 1;
    for (size_t i = 0; i < keys->elements && *n < max_names; i++) {
        const redisReply *k = keys->element[i];
        if (k->type != REDIS_REPLY_STRING)
            return SVC_REDIS_ERR_REPLY;
        if (k->len <= skip || !svc_valid_adapter_name(k->str + skip, k->len - skip))
            continue; /* not a name a request could ask for */
        if (!(names[*n] = strndup(k->str + skip, k->len - skip)))
            return SVC_REDIS_ERR_NOMEM;
        (*n)++;
    }
    return SVC_REDIS_OK;
}

svc_redis_status svc_redis_adapter_names(svc_redis *r, size_t max_names, char ***names,
                                         size_t *n)
{
    *names = NULL;
    *n = 0;
    char **out = calloc(max_names ? max_names : 1, sizeof *out);
    if (!out)
        return SVC_REDIS_ERR_NOMEM;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK) {
        free(out);
        return st;
    }
    char pattern[KEY_MAX], cursor[NUM_MAX] = "0";
    snprintf(pattern, sizeof pattern, "%s:adapter:*", r->prefix);
    size_t got = 0;
    do {
        svc_redis_cmd c = {0};
        svc_redis_arg_str(&c, "SCAN");
        svc_redis_arg_str(&c, cursor);
        svc_redis_arg_str(&c, "MATCH");
        svc_redis_arg_str(&c, pattern);
        svc_redis_arg_str(&c, "COUNT");
        svc_redis_arg_str(&c, SCAN_COUNT);
        redisReply *rep = NULL;
        st = svc_redis_append(r, &c);
        if (st == SVC_REDIS_OK)
            st = svc_redis_next_reply(r, &rep);
        if (st == SVC_REDIS_OK &&
            (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
             rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= NUM_MAX ||
             rep->element[1]->type != REDIS_REPLY_ARRAY))
            st = SVC_REDIS_ERR_REPLY;
        if (st == SVC_REDIS_OK) {
            memcpy(cursor, rep->element[0]->str, rep->element[0]->len + 1);
            st = scan_names(r, rep->element[1], out, &got, max_names);
        }
        freeReplyObject(rep);
    } while (st == SVC_REDIS_OK && strcmp(cursor, "0") && got < max_names);
    st = svc_redis_call_end(r, st);
    if (st != SVC_REDIS_OK) {
        svc_redis_names_free(out, got);
        return st;
    }
    /* SCAN may return a key more than once. */
    qsort(out, got, sizeof *out, compare_names);
    size_t k = 0;
    for (size_t i = 0; i < got; i++) {
        if (k && !strcmp(out[k - 1], out[i]))
            free(out[i]);
        else
            out[k++] = out[i];
    }
    *names = out;
    *n = k;
    return SVC_REDIS_OK;
}

/* ---- Attempts ----------------------------------------------------------- */

/* INCR s->key, then EXPIRE it ttl_s from now; the count into *attempt (0
 * on failure). */
static svc_redis_status count_attempt(svc_redis *r, svc_redis_scratch *s, int ttl_s,
                                      uint32_t *attempt)
{
    *attempt = 0;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_fmt_i64(s->n[0], ttl_s);
    svc_redis_cmd inc = {0};
    svc_redis_arg_str(&inc, "INCR");
    svc_redis_arg_str(&inc, s->key);
    svc_redis_cmd x = {0};
    svc_redis_arg_str(&x, "EXPIRE");
    svc_redis_arg_str(&x, s->key);
    svc_redis_arg_str(&x, s->n[0]);
    st = svc_redis_append(r, &inc);
    if (st == SVC_REDIS_OK)
        st = svc_redis_append(r, &x);
    redisReply *rep = NULL;
    if (st == SVC_REDIS_OK)
        st = svc_redis_next_reply(r, &rep);
    if (st == SVC_REDIS_OK && (rep->type != REDIS_REPLY_INTEGER || rep->integer <= 0))
        st = SVC_REDIS_ERR_REPLY;
    if (st == SVC_REDIS_OK)
        *attempt = rep->integer > UINT32_MAX ? UINT32_MAX : (uint32_t)rep->integer;
    freeReplyObject(rep);
    if (st != SVC_REDIS_ERR_IO) {
        svc_redis_status xs = svc_redis_drain(r, 1); /* the EXPIRE */
        if (st == SVC_REDIS_OK)
            st = xs;
    }
    if (st != SVC_REDIS_OK)
        *attempt = 0;
    return svc_redis_call_end(r, st);
}

/* <p>:attempts:<topic>:<partition>:<offset> into key; false for an
 * invalid record address. */
static bool offset_key(const svc_redis *r, const char *topic, int32_t partition, int64_t offset,
                       char key[KEY_MAX])
{
    if (!topic || !svc_valid_topic(topic, strlen(topic)) || partition < 0 || offset < 0)
        return false;
    snprintf(key, KEY_MAX, "%s:attempts:%s:%" PRId32 ":%" PRId64, r->prefix, topic, partition,
             offset);
    return true;
}

svc_redis_status svc_redis_attempt_incr(svc_redis *r, const char *topic, int32_t partition,
                                        int64_t offset, uint32_t *attempt)
{
    *attempt = 0;
    svc_redis_scratch s;
    if (!offset_key(r, topic, partition, offset, s.key))
        return SVC_REDIS_ERR_INVALID;
    return count_attempt(r, &s, r->cfg.offset_attempts_ttl_s, attempt);
}

svc_redis_status svc_redis_attempt_clear(svc_redis *r, const char *topic, int32_t partition,
                                         int64_t offset)
{
    char key[KEY_MAX];
    if (!offset_key(r, topic, partition, offset, key))
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "DEL");
    svc_redis_arg_str(&c, key);
    st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_drain(r, 1);
    return svc_redis_call_end(r, st);
}

svc_redis_status svc_redis_request_attempt_incr(svc_redis *r, const char *tenant, const char *id,
                                                uint32_t *attempt)
{
    *attempt = 0;
    if (!tenant || !*tenant || !id || !*id)
        return SVC_REDIS_ERR_INVALID;
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char hex[SVC_SHA256_HEX_LEN + 1];
    ml_sha256_ctx h;
    ml_sha256_init(&h);
    ml_sha256_update(&h, tenant, strlen(tenant) + 1); /* its NUL separates it from id */
    ml_sha256_update(&h, id, strlen(id));
    ml_sha256_final(&h, d);
    ml_sha256_hex(d, hex);
    svc_redis_scratch s;
    snprintf(s.key, KEY_MAX, "%s:request_attempts:%s", r->prefix, hex);
    return count_attempt(r, &s, r->cfg.attempts_ttl_s, attempt);
}

/* HGET key field into out (NUL-terminated, truncated to n). */
static svc_redis_status hget(svc_redis *r, const char *key, const char *field, char *out,
                             size_t n)
{
    svc_redis_cmd c = {0};
    svc_redis_arg_str(&c, "HGET");
    svc_redis_arg_str(&c, key);
    svc_redis_arg_str(&c, field);
    redisReply *rep = NULL;
    svc_redis_status st = svc_redis_append(r, &c);
    if (st == SVC_REDIS_OK)
        st = svc_redis_next_reply(r, &rep);
    if (st == SVC_REDIS_OK && rep->type == REDIS_REPLY_NIL)
        st = SVC_REDIS_NOT_FOUND;
    else if (st == SVC_REDIS_OK && rep->type != REDIS_REPLY_STRING)
        st = SVC_REDIS_ERR_REPLY;
    if (st == SVC_REDIS_OK)
        snprintf(out, n, "%.*s", (int)rep->len, rep->str);
    freeReplyObject(rep);
    return st;
}

svc_redis_status svc_redis_route(svc_redis *r, const char *sha256, char *partitions, size_t n)
{
    partitions[0] = 0;
    if (!sha256 || !svc_valid_sha256(sha256, strlen(sha256)))
        return SVC_REDIS_ERR_INVALID;
    svc_redis_status st = svc_redis_call_begin(r);
    if (st != SVC_REDIS_OK)
        return st;
    char key[KEY_MAX], worker[WORKER_ID_MAX + 1];
    snprintf(key, sizeof key, "%s:img:%s", r->prefix, sha256);
    st = hget(r, key, "worker", worker, sizeof worker);
    if (st == SVC_REDIS_OK) {
        snprintf(key, sizeof key, "%s:worker:%s", r->prefix, worker);
        st = hget(r, key, "partitions", partitions, n);
    }
    return svc_redis_call_end(r, st);
}
