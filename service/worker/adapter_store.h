/* Adapters held in Redis, made local and pinned by content: a request
 * naming an adapter that model.adapters_dir does not hold as <dir>/<name>/
 * (an operator's copy, which wins) is served the bytes Redis holds under
 * <prefix>:adapter:<name>, copied into <dir>/@<sha256>/ where the runtime's
 * resolver finds it under the name "@<sha256>" (request names cannot start
 * with '@'). The runtime keys loaded adapters and the image states computed
 * with them by that name, so a republished adapter (a new digest) is a new
 * adapter everywhere, and the old one ages out.
 *
 * - A name maps to its current digest (the hash's sha256 field), looked up
 *   in Redis at most every SVC_ADAPTER_PIN_TTL_MS per name; with Redis down
 *   the last digest known serves while its copy is here.
 * - The fetch is one round trip that checks the size first
 *   (svc_redis_adapter_get: nothing moves over limits.max_adapter_bytes),
 *   then the bytes must hash to the sha256 the publisher stored
 *   (svc_redis_adapter_digest); an adapter without it is not served.
 * - The files go into a fresh staging directory <dir>/.staging-<name>-XXXXXX,
 *   every write checked and synced, and are parsed and checked there as the
 *   runtime will load them (ml_lora_adapter_load against the model's
 *   config: adapter_config.json, the safetensors header, every tensor's
 *   shape; and the rank against runtime.max_adapter_rank); only then is the
 *   directory renamed to <dir>/@<sha256>. The rename is atomic, so the step
 *   thread never sees half an adapter, and concurrent copies cannot mix.
 * - The copies together stay under limits.adapters_dir_bytes: after a copy
 *   the least recently used ones (directory mtime, touched at each use) are
 *   deleted, except those used in the last SVC_ADAPTER_KEEP_MS (a request
 *   prepared with one may not have reached the runtime yet).
 * - A failure that would repeat (over the size limit; the directory cannot
 *   be written: per name; bytes that do not match their digest or do not
 *   load: per digest) is remembered for SVC_ADAPTER_FAILURE_TTL_MS and
 *   answered from memory, so a broken adapter costs one fetch, not one per
 *   request. A missing adapter and a Redis failure are not remembered.
 * - Clients get a short message naming the adapter and the code; the log
 *   gets the reason, with paths (adapter_refused, adapter_store_failed).
 *   An unwritable directory is counted (mllama_adapter_store_errors_total).
 * @locality: any prep thread; the failure and pin memories are locked. */
#ifndef SVC_ADAPTER_STORE_H
#define SVC_ADAPTER_STORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "engine.h"
#include "protocol/protocol.h"
#include "redis/redis.h"

/* How long a remembered failure answers for its name or digest. Long
 * enough that a burst of requests for a broken adapter costs one attempt,
 * short enough that a fixed volume is picked up soon. */
#define SVC_ADAPTER_FAILURE_TTL_MS 30000
/* Failures remembered at once; past that the oldest is forgotten first
 * (it then costs one more attempt). */
#define SVC_ADAPTER_FAILURES_MAX 64
/* How long a name's digest is trusted before Redis is asked again: how
 * long a republished adapter may take to be served. */
#define SVC_ADAPTER_PIN_TTL_MS 10000
/* Names whose digest is remembered; past that the least recently checked
 * is forgotten (it costs one more lookup). */
#define SVC_ADAPTER_PINS_MAX 256
/* A copy used this recently is never deleted for the byte cap. */
#define SVC_ADAPTER_KEEP_MS 60000

/* The longest name the runtime gets: a request's name, or '@' and a digest. */
#define SVC_ADAPTER_REF_MAX (SVC_ADAPTER_NAME_MAX + 1)
/* A failure's key: a name, or '@' and a digest. */
#define SVC_ADAPTER_KEY_MAX SVC_ADAPTER_REF_MAX

typedef struct svc_adapter_failure {
    char key[SVC_ADAPTER_KEY_MAX];       /* "" = a free entry */
    svc_error code;
    char message[SVC_ERRMSG_MAX];
    long long until_ms;                  /* svc_now_ms() clock */
} svc_adapter_failure;

typedef struct svc_adapter_pin {
    char name[SVC_ADAPTER_NAME_MAX + 1]; /* "" = a free entry */
    char sha256[SVC_SHA256_HEX_LEN + 1];
    long long checked_ms;                /* svc_now_ms() of the last lookup */
} svc_adapter_pin;

typedef struct svc_adapter_store {
    char dir[SVC_CONFIG_STR];            /* model.adapters_dir */
    size_t max_bytes;                    /* limits.max_adapter_bytes: one adapter */
    size_t dir_max_bytes;                /* limits.adapters_dir_bytes: every copy */
    const ml_config *model;              /* borrowed: what adapters must fit */
    int max_rank;                        /* runtime.max_adapter_rank */
    pthread_mutex_t lock;                /* guards failures, pins and pruning */
    svc_adapter_failure failures[SVC_ADAPTER_FAILURES_MAX];
    svc_adapter_pin pins[SVC_ADAPTER_PINS_MAX];
} svc_adapter_store;

/* What the store needs to know. */
typedef struct svc_adapter_store_config {
    const char *dir;
    size_t max_bytes, dir_max_bytes;
    const ml_config *model;              /* borrowed; must outlive the store */
    int max_rank;
} svc_adapter_store_config;

/* Set up the store and remove staging directories a killed process left
 * behind (a restarted container keeps its emptyDir volume).
 * @locality the main thread, before the prep threads start. */
void svc_adapter_store_init(svc_adapter_store *s, const svc_adapter_store_config *cfg);
void svc_adapter_store_deinit(svc_adapter_store *s);

/* Make adapter `name` (a valid name: request parsing checked it) available
 * to the runtime under the name written to ref: `name` for an operator's
 * copy, "@<sha256>" for Redis's, fetching it through r (borrowed; NULL = no
 * Redis, the caller's connection of this thread). Returns SVC_ERROR_NONE,
 * or with a message for the client in msg: SVC_ERROR_UNKNOWN_ADAPTER
 * (neither here nor in Redis), SVC_ERROR_ADAPTER_TOO_LARGE (over
 * max_bytes), SVC_ERROR_ADAPTER_UNAVAILABLE (Redis failed; the bytes do
 * not match their digest or cannot be served; the directory cannot be
 * written). */
svc_error svc_adapter_store_ensure(svc_adapter_store *s, svc_redis *r, const char *name,
                                   char ref[SVC_ADAPTER_REF_MAX], char *msg, size_t msglen);

#endif
