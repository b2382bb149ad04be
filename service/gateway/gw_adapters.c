/* The adapters the workers serve from Redis, for /v1/models (gw_internal.h).
 *
 * An adapter published to Redis (<prefix>:adapter:<name>, service/README.md
 * "Adapters pinned by content") is one every worker can serve, while the
 * gateway's own model.adapters_dir is usually empty (the gateway pod mounts
 * none). Redis calls block, and the loop must not: a thread of its own lists
 * the names (svc_redis_adapter_names, bounded by redis.call_timeout_ms)
 * every gateway.adapters_refresh_s and hands the list over under a lock; the loop
 * only copies the last list. A failure keeps the last list and is logged
 * once, until a listing succeeds again.
 * @locality: the refresh thread, and the gateway's thread through
 * gw_adapters_each. @locks a->lock guards names, n_names and stop. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/gw_internal.h"
#include "log.h"
#include "redis/redis.h"

/* Names listed at most: /v1/models stays one small answer. */
#define ADAPTERS_MAX 4096

struct gw_adapters {
    svc_redis *redis; /* owned; used by the thread only */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* stop */
    int refresh_s;       /* gateway.adapters_refresh_s */
    bool stop;
    char **names; /* owned, sorted: the last list */
    size_t n_names;
};

/* One listing: the new list replaces the old one, or a failure keeps it. */
static void refresh(gw_adapters *a, bool *failing)
{
    char **names;
    size_t n;
    svc_redis_status st = svc_redis_adapter_names(a->redis, ADAPTERS_MAX, &names, &n);
    if (st != SVC_REDIS_OK) {
        if (!*failing)
            svc_log(SVC_LOG_WARN, "gateway_adapters_stale",
                    "listing the adapters in Redis failed (%s): /v1/models keeps the last list",
                    svc_redis_status_name(st));
        *failing = true;
        return;
    }
    if (*failing)
        svc_log(SVC_LOG_INFO, "gateway_adapters_listed", "%zu adapters in Redis", n);
    *failing = false;
    pthread_mutex_lock(&a->lock);
    char **old = a->names;
    size_t n_old = a->n_names;
    a->names = names;
    a->n_names = n;
    pthread_mutex_unlock(&a->lock);
    svc_redis_names_free(old, n_old);
}

static void *refresh_main(void *arg)
{
    gw_adapters *a = arg;
    bool failing = false;
    pthread_mutex_lock(&a->lock);
    while (!a->stop) {
        pthread_mutex_unlock(&a->lock);
        refresh(a, &failing);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += a->refresh_s;
        pthread_mutex_lock(&a->lock);
        while (!a->stop && pthread_cond_timedwait(&a->wake, &a->lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

int gw_adapters_create(const svc_config *c, gw_adapters **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!c->redis.url[0])
        return 0;
    gw_adapters *a = calloc(1, sizeof *a);
    if (!a) {
        svc_errf(err, errlen, "out of memory");
        return -1;
    }
    svc_redis_config rc;
    svc_redis_config_default(&rc);
    rc.url = c->redis.url;
    rc.prefix = c->redis.prefix;
    rc.worker_id = c->worker_id; /* required by the client; the gateway publishes nothing */
    rc.connect_timeout_ms = rc.command_timeout_ms = c->redis.timeout_ms;
    rc.call_timeout_ms = c->redis.call_timeout_ms;
    if (svc_redis_create(&rc, &a->redis, err, errlen) != SVC_REDIS_OK) {
        free(a);
        return -1;
    }
    a->refresh_s = c->gateway.adapters_refresh_s;
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->wake, NULL);
    if (pthread_create(&a->thread, NULL, refresh_main, a)) {
        svc_errf(err, errlen, "cannot start the adapter list's thread");
        pthread_cond_destroy(&a->wake);
        pthread_mutex_destroy(&a->lock);
        svc_redis_destroy(a->redis);
        free(a);
        return -1;
    }
    *out = a;
    return 0;
}

void gw_adapters_destroy(gw_adapters *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    a->stop = true;
    pthread_cond_signal(&a->wake);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->thread, NULL); /* at most one call_timeout_ms */
    svc_redis_names_free(a->names, a->n_names);
    svc_redis_destroy(a->redis);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

void gw_adapters_each(gw_adapters *a, void (*fn)(void *ctx, const char *name), void *ctx)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->n_names; i++)
        fn(ctx, a->names[i]);
    pthread_mutex_unlock(&a->lock);
}
