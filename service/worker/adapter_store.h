/* Adapters held in Redis, made local: the first request naming an adapter
 * that model.adapters_dir lacks copies <prefix>:adapter:<name> into
 * <dir>/<name>/, where the runtime's resolver (step thread) finds it.
 *
 * - The size is checked first (HSTRLEN: nothing else moves), against
 *   limits.max_adapter_bytes for the two files together.
 * - The directory is proven writable before the transfer: the files go
 *   into a fresh staging directory <dir>/.staging-<name>-XXXXXX (adapter
 *   names never start with '.'), every write checked and synced, then the
 *   directory is renamed to <dir>/<name>. The rename is atomic, so the step
 *   thread never sees half an adapter, and concurrent copies of one name
 *   (several prep threads) cannot mix: the first rename wins.
 * - A failure that would repeat (over the size limit; the directory cannot
 *   be written) is remembered per name for SVC_ADAPTER_FAILURE_TTL_MS and
 *   answered from memory, so a misconfigured worker does not re-read
 *   Redis for every request. A missing adapter and a Redis failure are not
 *   remembered: publishing an adapter, or Redis coming back, takes effect at
 *   the next request.
 * - An unwritable directory is the operator's problem: logged as an error
 *   (adapter_store_failed) and counted (mllama_adapter_store_errors_total).
 * @locality: any prep thread; the failure memory is locked. */
#ifndef SVC_ADAPTER_STORE_H
#define SVC_ADAPTER_STORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "protocol/protocol.h"
#include "redis/redis.h"

/* How long a remembered failure answers for its name. Long enough that a
 * burst of requests for a broken adapter costs one attempt, short enough
 * that a fixed volume or a republished adapter is picked up soon. */
#define SVC_ADAPTER_FAILURE_TTL_MS 30000
/* Names remembered at once; past that the oldest failure is forgotten
 * first (it then costs one more attempt). */
#define SVC_ADAPTER_FAILURES_MAX 64

typedef struct svc_adapter_failure {
    char name[SVC_ADAPTER_NAME_MAX + 1]; /* "" = a free entry */
    svc_error code;
    char message[SVC_ERRMSG_MAX];
    long long until_ms;                  /* svc_now_ms() clock */
} svc_adapter_failure;

typedef struct svc_adapter_store {
    char dir[SVC_CONFIG_STR];            /* model.adapters_dir */
    size_t max_bytes;                    /* limits.max_adapter_bytes */
    pthread_mutex_t lock;                /* guards failures */
    svc_adapter_failure failures[SVC_ADAPTER_FAILURES_MAX];
} svc_adapter_store;

/* Set up the store for dir and remove staging directories a killed process
 * left behind (a restarted container keeps its emptyDir volume).
 * @locality the main thread, before the prep threads start. */
void svc_adapter_store_init(svc_adapter_store *s, const char *dir, size_t max_bytes);
void svc_adapter_store_deinit(svc_adapter_store *s);

/* Make adapter `name` (a valid name: request parsing checked it) available
 * in the directory, fetching it through r (borrowed; NULL = no Redis, the
 * caller's connection of this thread). Returns SVC_ERROR_NONE, or with the
 * reason in msg: SVC_ERROR_UNKNOWN_ADAPTER (neither in the directory nor in
 * Redis), SVC_ERROR_ADAPTER_TOO_LARGE (over max_bytes),
 * SVC_ERROR_ADAPTER_UNAVAILABLE (Redis failed, or the directory cannot be
 * written). */
svc_error svc_adapter_store_ensure(svc_adapter_store *s, svc_redis *r, const char *name,
                                   char *msg, size_t msglen);

#endif
