/* The resident-image mirror the prep threads consult, and the Redis index
 * thread: image insert/evict events, heartbeats and the deletion of answered
 * records' attempt counters (worker_internal.h).
 * @locality the mirror: any thread, under resident_lock; events: queued by
 * the step thread, written to Redis by the index thread alone. */
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "worker/worker_internal.h"

#define INDEX_WAIT_MS 200 /* how long the index thread sleeps without events */

/* ---- the resident-image mirror -------------------------------------------------- */

/* The prep threads decide between "resident: send the key only" and "fetch
 * the blob from Redis" without touching the runtime, which belongs to the
 * step thread: the runtime's insert/evict events keep this set in step. */
static void mirror_update(svc_worker *w, ml_image_event ev, const uint8_t *key)
{
    pthread_mutex_lock(&w->resident_lock);
    size_t i = 0;
    while (i < w->n_resident && memcmp(w->resident[i], key, ML_IMAGE_KEY_BYTES))
        i++;
    if (ev == ML_IMAGE_EVICTED && i < w->n_resident) {
        memcpy(w->resident[i], w->resident[--w->n_resident], ML_IMAGE_KEY_BYTES);
    } else if (ev == ML_IMAGE_INSERTED && i == w->n_resident) {
        if (w->n_resident == w->cap_resident) {
            size_t cap = w->cap_resident ? 2 * w->cap_resident : 64;
            void *grown = realloc(w->resident, cap * ML_IMAGE_KEY_BYTES);
            if (grown) {
                w->resident = grown;
                w->cap_resident = cap;
            }
        }
        if (w->n_resident < w->cap_resident)
            memcpy(w->resident[w->n_resident++], key, ML_IMAGE_KEY_BYTES);
    }
    pthread_mutex_unlock(&w->resident_lock);
}

bool worker_mirror_contains(svc_worker *w, const uint8_t *key)
{
    pthread_mutex_lock(&w->resident_lock);
    bool found = false;
    for (size_t i = 0; i < w->n_resident && !found; i++)
        found = !memcmp(w->resident[i], key, ML_IMAGE_KEY_BYTES);
    pthread_mutex_unlock(&w->resident_lock);
    return found;
}

/* ---- the Redis index thread ------------------------------------------------------- */

void worker_on_image_event(void *ctx, ml_image_event ev, const uint8_t *key, size_t bytes,
                           int n_tiles)
{
    svc_worker *w = ctx;
    mirror_update(w, ev, key);
    if (!w->redis_index)
        return;
    image_event *e = calloc(1, sizeof *e);
    if (!e)
        return; /* the next heartbeat reconciles */
    e->ev = ev;
    ml_sha256_hex(key, e->sha256);
    e->bytes = bytes;
    e->n_tiles = n_tiles;
    pthread_mutex_lock(&w->event_lock);
    if (w->events_tail)
        w->events_tail->next = e;
    else
        w->events_head = e;
    w->events_tail = e;
    pthread_cond_signal(&w->event_cond);
    pthread_mutex_unlock(&w->event_lock);
}

void *worker_index_main(void *arg)
{
    svc_worker *w = arg;
    long long next_beat = 0;
    while (!atomic_load(&w->threads_stop)) {
        pthread_mutex_lock(&w->event_lock);
        if (!w->events_head && !w->clears_head) {
            struct timespec ts;
            svc_deadline_in(&ts, INDEX_WAIT_MS);
            pthread_cond_timedwait(&w->event_cond, &w->event_lock, &ts);
        }
        image_event *e = w->events_head;
        w->events_head = w->events_tail = NULL;
        attempt_clear *c = w->clears_head;
        w->clears_head = w->clears_tail = NULL;
        w->n_clears = 0;
        pthread_mutex_unlock(&w->event_lock);
        /* Answered records' attempt counters (worker_finish_offset). */
        for (attempt_clear *next; c; c = next) {
            next = c->next;
            if (svc_redis_attempt_clear(w->redis_index, c->topic, c->partition, c->offset) !=
                SVC_REDIS_OK)
                svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
            free(c);
        }
        for (image_event *next; e; e = next) {
            next = e->next;
            svc_redis_status st =
                e->ev == ML_IMAGE_INSERTED
                    ? svc_redis_img_insert(w->redis_index, e->sha256, e->bytes,
                                           (uint32_t)e->n_tiles, svc_wall_ms())
                    : svc_redis_img_evict(w->redis_index, e->sha256);
            if (st != SVC_REDIS_OK && st != SVC_REDIS_NOT_FOUND)
                svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
            free(e);
        }
        long long now = svc_now_ms();
        if (now >= next_beat) {
            char parts[sizeof w->partitions];
            pthread_mutex_lock(&w->partitions_lock);
            memcpy(parts, w->partitions, sizeof parts);
            pthread_mutex_unlock(&w->partitions_lock);
            svc_redis_worker_info info = {.partitions = parts,
                                          .free_pool_bytes = atomic_load(&w->free_pool_bytes)};
            if (svc_redis_heartbeat(w->redis_index, &info, svc_wall_ms()) != SVC_REDIS_OK)
                svc_metrics_add(SVC_COUNTER_REDIS_ERRORS, 1);
            svc_redis_stats rs;
            svc_redis_stats_get(w->redis_index, &rs);
            svc_metrics_set(SVC_GAUGE_REDIS_BREAKER_OPEN, rs.breaker != SVC_REDIS_BREAKER_CLOSED);
            next_beat = now + (long long)w->cfg.redis.heartbeat_s * 1000;
        }
    }
    return NULL;
}
