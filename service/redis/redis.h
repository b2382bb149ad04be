/* The Redis index client (service/README.md §3): this worker's entries in the
 * cluster-wide directory of resident images, its heartbeat, image blobs
 * submitted by reference, adapters, and the poison-message attempt counter.
 *
 * Keys, with <p> the configured prefix and <key> an image's key in a cache
 * partition (lower-case hex of ml_image_state_key: the image's content
 * sha256 under its tenant's cache salt; engine/runtime/image_cache.h):
 *   <p>:img:<key>                hash {worker, bytes, tiles, last_use}      TTL img_ttl_s
 *   <p>:worker:<id>              hash {partitions, free_pool_bytes,
 *                                      heartbeat_ms}                        TTL worker_ttl_s
 *   <p>:blob:img:<key>           string: the image bytes (the base key)     TTL set by the writer
 *   <p>:adapter:<name>           hash {config: adapter_config.json,
 *                                      weights: adapter_model.safetensors,
 *                                      sha256: svc_redis_adapter_digest}    no TTL
 *   <p>:attempts:<topic>:<partition>:<offset>  integer (INCR)     TTL offset_attempts_ttl_s
 *   <p>:request_attempts:<sha256(tenant NUL id)> integer (INCR)   TTL attempts_ttl_s
 * Image keys carry the partition so that neither the index nor a blob's
 * presence tells anyone who knows only an image's bytes whether another
 * cache group has it (service/README.md §3). last_use and heartbeat_ms are
 * unix ms. An adapter is stored as its two
 * PEFT files (not a path) so that any worker can load it without a shared
 * filesystem, with the digest its publisher computed: a worker serves only
 * bytes that hash to it. A request id is hashed into its key with its
 * tenant, so neither its length nor its bytes reach a key, and two tenants'
 * ids never share a counter.
 *
 * Who may write what is enforced by Redis 7 ACL users (ops/redis/users.acl,
 * service/README.md §3): workers own the index, worker and counter keys and
 * only read blobs and adapters; frontends write blobs; the adapter publisher
 * writes adapters.
 *
 * Redis is a hint, never the only copy (service/README.md §3): the worker's local
 * state is the truth and this client mirrors it. Every image insert and
 * eviction is applied to a local mirror first; the Redis write may fail.
 * After any failure the next call that reaches Redis first reconciles:
 * it re-publishes the worker hash and every resident image and deletes the
 * images evicted meanwhile (a bounded pending set; when it overflows the
 * oldest entries are dropped and expire by TTL instead). Heartbeats refresh
 * the TTLs and re-publish images whose keys vanished (Redis restarted,
 * flushed or evicted them). An image key is deleted only while it still
 * names this worker (a script compares the owner), so an eviction here
 * never removes another worker's fresher entry.
 *
 * Failures trip a circuit breaker: after `breaker_failures` consecutive
 * failures it opens and calls fail fast (SVC_REDIS_UNAVAILABLE) without
 * touching the network for breaker_open_ms, doubling on each failed trial
 * up to breaker_open_max_ms; then one call is let through (half-open) and
 * its success closes the breaker.
 *
 * Every call that goes out has a total deadline, call_timeout_ms from its
 * start, connect, AUTH and reconciliation included: replies are read here
 * (not by redisGetReply), each read and write armed with the time left, so
 * a Redis that trickles a reply byte by byte cannot hold a call longer than
 * its deadline (command_timeout_ms bounds one read or write besides).
 *
 * Threading: one svc_redis is used by one thread (the worker's Redis
 * thread; never the Kafka poll thread or the step loop). Only
 * svc_redis_stats_get may be called from any thread. hiredis 0.14 writes
 * with write(2): the process must ignore SIGPIPE. Hostnames are resolved
 * with getaddrinfo at each connect, which has no timeout of its own and is
 * outside the deadline: deployments name Redis by an address or a name the
 * local resolver answers at once (a Kubernetes Service), and a resolver that
 * hangs shows as a stalled thread on /healthz (service/README.md §7). */
#ifndef SVC_REDIS_INDEX_H
#define SVC_REDIS_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

typedef enum svc_redis_status {
    SVC_REDIS_OK = 0,
    SVC_REDIS_NOT_FOUND,   /* the key does not exist */
    SVC_REDIS_UNAVAILABLE, /* the breaker is open: failed fast, nothing was sent */
    SVC_REDIS_ERR_IO,      /* connect, write or read failed or timed out */
    SVC_REDIS_ERR_REPLY,   /* Redis answered with an error or an unexpected type */
    SVC_REDIS_ERR_TOO_LARGE, /* a value is over the caller's cap */
    SVC_REDIS_ERR_INVALID, /* a bad argument or configuration */
    SVC_REDIS_ERR_NOMEM,
} svc_redis_status;

/* Stable lower-case name ("ok", "unavailable", ...). Never NULL. */
const char *svc_redis_status_name(svc_redis_status st);

/* ---- URL ---------------------------------------------------------------- */

#define SVC_REDIS_HOST_MAX 255
#define SVC_REDIS_CRED_MAX 255

/* redis://[[user]:password@]host[:port][/db]; host may be [IPv6]. */
typedef struct svc_redis_url {
    char host[SVC_REDIS_HOST_MAX + 1];
    int port;                             /* default 6379 */
    int db;                               /* default 0 */
    char user[SVC_REDIS_CRED_MAX + 1];    /* "" = none (AUTH <password>) */
    char password[SVC_REDIS_CRED_MAX + 1]; /* "" = no AUTH */
} svc_redis_url;

/* Parse a Redis URL strictly: scheme "redis://" (rediss:// and unix
 * sockets are rejected: hiredis 0.14 has no TLS), percent-escapes in user
 * and password, port 1..65535, db 0..(2^31-1), nothing after the db.
 * Returns OK, or ERR_INVALID with the reason in err (the password is never
 * echoed). @locality any thread. */
svc_redis_status svc_redis_url_parse(const char *url, svc_redis_url *out, char *err,
                                     size_t errlen);

/* ---- Client ------------------------------------------------------------- */

typedef struct svc_redis_config {
    const char *url;       /* borrowed for the call */
    const char *prefix;    /* e.g. "mllama"; [A-Za-z0-9._-]{1,64} */
    const char *worker_id; /* this worker; printable ASCII without spaces or ':', 1..128 */
    int connect_timeout_ms;  /* default 200 */
    int command_timeout_ms;  /* one read or write; default 200 */
    int call_timeout_ms;     /* a whole call, connect included; default 1000 */
    int breaker_failures;    /* consecutive failures that open the breaker; default 3 */
    int breaker_open_ms;     /* first open period; default 1000 */
    int breaker_open_max_ms; /* cap of the doubling; default 30000 */
    int img_ttl_s;           /* default 300 */
    int worker_ttl_s;        /* default 30: heartbeat at least every third of it */
    int attempts_ttl_s;      /* per request id; default 86400 */
    int offset_attempts_ttl_s; /* per record offset; default 3600 */
    size_t max_pending_deletes; /* default 4096 */
    size_t max_resident;     /* images this worker may index; default 65536 */
} svc_redis_config;

/* Defaults for every field but url, prefix and worker_id (set to NULL). */
void svc_redis_config_default(svc_redis_config *cfg);

typedef struct svc_redis svc_redis;

/* Validate the configuration and create a client. It does not connect:
 * the first call does, so a worker starts while Redis is down.
 * Returns OK and *out (owned by the caller), or ERR_INVALID / ERR_NOMEM
 * with the reason in err and *out NULL. */
svc_redis_status svc_redis_create(const svc_redis_config *cfg, svc_redis **out, char *err,
                                  size_t errlen);

/* Close the connection and free the client. NULL is a no-op. Index entries
 * stay in Redis until their TTL: a restarted worker with the same id
 * overwrites them, another expires them. */
void svc_redis_destroy(svc_redis *r);

/* ---- Image index -------------------------------------------------------- */

/* Record that the image's cross-attention states are resident here
 * (`bytes` of pool memory, `tiles` tiles) and publish <p>:img:<sha256>,
 * sha256 being the state's key (the runtime's, as its image events give
 * it: partitioned, adapter-derived for an adapter's own states).
 * The local mirror is updated in every case; a non-OK status only says the
 * Redis write is deferred to reconciliation. ERR_INVALID for a malformed
 * sha256 (mirror unchanged); ERR_NOMEM / ERR_TOO_LARGE when the mirror
 * cannot grow or holds max_resident images (mirror unchanged). */
svc_redis_status svc_redis_img_insert(svc_redis *r, const char *sha256, uint64_t bytes,
                                      uint32_t tiles, int64_t now_ms);

/* A resident image was used: update last_use and refresh its TTL. Images
 * not in the mirror are ignored (OK). */
svc_redis_status svc_redis_img_touch(svc_redis *r, const char *sha256, int64_t now_ms);

/* The image left the pool: remove it from the mirror and delete its key if
 * it still names this worker; a failed delete is retried at reconciliation. */
svc_redis_status svc_redis_img_evict(svc_redis *r, const char *sha256);

/* ---- Worker heartbeat --------------------------------------------------- */

typedef struct svc_redis_worker_info {
    const char *partitions;   /* borrowed, e.g. "llm.requests:0,1,5" */
    /* Free bytes of the K/V pool and the image-state budget together: how
     * much a router may still send here before the worker queues. */
    uint64_t free_pool_bytes;
} svc_redis_worker_info;

/* Publish <p>:worker:<id> with `info`, refresh the TTL of every resident
 * image's key, and re-publish those whose key had vanished. The info is
 * kept (copied) and re-sent by reconciliation. Call it about every
 * worker_ttl_s / 3 seconds; it is also what lets a recovered Redis be
 * noticed when nothing else is happening. */
svc_redis_status svc_redis_heartbeat(svc_redis *r, const svc_redis_worker_info *info,
                                     int64_t now_ms);

/* ---- Blobs, adapters, attempts ------------------------------------------ */

/* Fetch <p>:blob:img:<sha256>, sha256 being the image's base key in the
 * requester's partition (ml_image_state_key with no adapter). Returns OK with *data (malloc'd, owned by the
 * caller) and *len; NOT_FOUND (also for an empty value); ERR_TOO_LARGE when
 * the value is over max_bytes (at most max_bytes + 1 bytes are transferred). */
svc_redis_status svc_redis_blob_get(svc_redis *r, const char *sha256, size_t max_bytes,
                                    uint8_t **data, size_t *len);

/* Store image bytes under <p>:blob:img:<sha256> for ttl_s seconds (> 0).
 * The caller vouches that sha256 is the base key, in the partition of the
 * tenant it uploads for, of data's digest (the worker checks the content
 * digest the request names against the bytes). */
svc_redis_status svc_redis_blob_put(svc_redis *r, const char *sha256, const void *data,
                                    size_t len, int ttl_s);

/* An adapter's two PEFT files and the digest its publisher stored, owned by
 * the caller (svc_redis_adapter_deinit). */
typedef struct svc_redis_adapter {
    uint8_t *config;  /* adapter_config.json */
    size_t config_len;
    uint8_t *weights; /* adapter_model.safetensors */
    size_t weights_len;
    char sha256[SVC_SHA256_HEX_LEN + 1]; /* the hash's sha256 field; "" when absent */
} svc_redis_adapter;

/* The content digest of an adapter, in lower-case hex: sha256 over the
 * lower-case hex sha256 of the config and of the weights, each followed by
 * "\n" — what `sha256sum adapter_config.json adapter_model.safetensors |
 * cut -c1-64 | sha256sum` prints, so a publisher needs no tool of ours.
 * @locality any thread. */
void svc_redis_adapter_digest(const void *config, size_t config_len, const void *weights,
                              size_t weights_len, char hex[SVC_SHA256_HEX_LEN + 1]);

/* The sha256 field of <p>:adapter:<name> (HGET: nothing else moves), into
 * hex. NOT_FOUND when the adapter is missing, or its digest (missing, or
 * not 64 lower-case hex digits): an adapter without one is not served. */
svc_redis_status svc_redis_adapter_sha256(svc_redis *r, const char *name,
                                          char hex[SVC_SHA256_HEX_LEN + 1]);

/* Fetch <p>:adapter:<name> in one round trip: a script reads both fields'
 * sizes and returns the bytes only when they fit max_bytes together. OK
 * fills *out (sha256 as stored: the caller checks it against
 * svc_redis_adapter_digest); NOT_FOUND when the key or one of its two files
 * is missing; ERR_TOO_LARGE (nothing transferred) over max_bytes. *out is
 * zeroed on failure. */
svc_redis_status svc_redis_adapter_get(svc_redis *r, const char *name, size_t max_bytes,
                                       svc_redis_adapter *out);

/* Store an adapter: both files and their digest, replacing an existing one
 * in one command. Needs the adapter-publisher ACL role (ops/redis). */
svc_redis_status svc_redis_adapter_put(svc_redis *r, const char *name, const void *config,
                                       size_t config_len, const void *weights,
                                       size_t weights_len);

/* Free the two files and zero *a. */
void svc_redis_adapter_deinit(svc_redis_adapter *a);

/* The names of the adapters stored (<p>:adapter:<name>, valid adapter names
 * only), at most max_names, sorted, without duplicates: SCAN ... MATCH in
 * one call, bounded as a whole by call_timeout_ms. OK with *names
 * (owned by the caller: svc_redis_names_free) and *n; any other status
 * leaves them NULL and 0. Needs +scan (ops/redis/users.acl: the frontend
 * role has it for the gateway's /v1/models). */
svc_redis_status svc_redis_adapter_names(svc_redis *r, size_t max_names, char ***names,
                                         size_t *n);
void svc_redis_names_free(char **names, size_t n);

/* Count one more attempt at the record topic/partition/offset and return
 * the count in *attempt (1 the first time). The key is deleted when the
 * record is finished (svc_redis_attempt_clear) and expires
 * offset_attempts_ttl_s after the last attempt otherwise: a poison record is
 * redelivered within seconds, so an hour keeps the guard and bounds what a
 * stream of records leaves behind when a delete is lost. When this fails the caller does not know the
 * count and should process the record anyway (Redis must not stop the
 * partition). */
svc_redis_status svc_redis_attempt_incr(svc_redis *r, const char *topic, int32_t partition,
                                        int64_t offset, uint32_t *attempt);

/* The record topic/partition/offset is finished (answered or
 * dead-lettered): delete its attempt counter, which only a redelivery
 * before the commit could still need (it then starts at 1 again). OK also
 * when there was none. */
svc_redis_status svc_redis_attempt_clear(svc_redis *r, const char *topic, int32_t partition,
                                         int64_t offset);

/* Count one more execution of request `id` of `tenant` (whatever record
 * carried it) and return the count in *attempt (1 the first time): the
 * number a reply's `attempt` carries, so a client's retry under the same id
 * is told apart from the first execution; another tenant's id is another
 * counter. The key is the sha256 of tenant, a NUL and id; it expires
 * attempts_ttl_s after the last execution. Failure rule as above; INVALID
 * for an empty tenant or id. */
svc_redis_status svc_redis_request_attempt_incr(svc_redis *r, const char *tenant, const char *id,
                                                uint32_t *attempt);

/* Cache-affinity routing for producers: the request-topic partitions
 * ("topic:0,1,5") of the worker that holds the image of key sha256 (the
 * base key in the producer's tenant's partition) resident, from
 * <p>:img:<sha256>.worker and that worker's heartbeat. NOT_FOUND when no
 * live worker holds it. @locality the Redis thread of this client. */
svc_redis_status svc_redis_route(svc_redis *r, const char *sha256, char *partitions, size_t n);

/* ---- Metrics ------------------------------------------------------------ */

typedef enum svc_redis_breaker {
    SVC_REDIS_BREAKER_CLOSED = 0,
    SVC_REDIS_BREAKER_OPEN,
    SVC_REDIS_BREAKER_HALF_OPEN,
} svc_redis_breaker;

typedef struct svc_redis_stats {
    uint64_t calls;           /* public calls, including fast failures */
    uint64_t errors;          /* calls that failed after reaching for the network */
    uint64_t fast_fails;      /* calls refused while the breaker was open */
    uint64_t breaker_opens;
    uint64_t connects;        /* successful connections (1 + reconnects) */
    uint64_t reconciliations; /* completed reconciliations */
    uint64_t pending_dropped; /* deferred deletes dropped on overflow */
    uint64_t resident;        /* images in the mirror */
    uint64_t pending_deletes; /* deferred deletes now */
    svc_redis_breaker breaker;
} svc_redis_stats;

/* A snapshot of the counters. @locality any thread (relaxed atomics; the
 * fields are individually, not jointly, consistent). */
void svc_redis_stats_get(const svc_redis *r, svc_redis_stats *out);

#endif
