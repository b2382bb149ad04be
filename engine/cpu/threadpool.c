#include "cpu/threadpool.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_features.h"

/* Polls of the job counter before a thread blocks: with a pause of about
 * 40-150 cycles each this is at most ~0.1 ms, longer than the gap between
 * two ops of a forward pass and far shorter than a scheduler tick. */
#define SPIN_POLLS 2048

struct ml_cpu_pool {
    int n_threads;
    int n_workers_started;
    pthread_t *workers; /* owned: n_threads - 1 */

    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new job (or stop) was posted */
    pthread_cond_t done; /* pending reached 0 */

    /* The current job: written by the caller under mu before gen is bumped
     * with release order, read by workers after they see the new gen with
     * acquire order, and not touched by the caller again until every worker
     * has decremented pending. fn == NULL means "exit". */
    ml_cpu_pool_fn fn;
    void *ctx;
    int64_t n;
    int n_active;

    atomic_uint_fast64_t gen; /* job counter */
    atomic_int pending;       /* workers that have not finished the job */
};

typedef struct worker_arg {
    ml_cpu_pool *pool;
    int tid;
} worker_arg;

static inline void cpu_relax(void)
{
#if ML_CPU_X86
    __builtin_ia32_pause();
#endif
}

/* Thread t's share of [0, n) when split over `parts` threads. */
static void share(int64_t n, int parts, int t, int64_t *begin, int64_t *end)
{
    *begin = n * t / parts;
    *end = n * (t + 1) / parts;
}

static uint_fast64_t wait_for_job(ml_cpu_pool *p, uint_fast64_t seen)
{
    for (int i = 0; i < SPIN_POLLS; i++) {
        uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
    }
    /* gen only changes under mu, so checking it under mu cannot miss a wake. */
    pthread_mutex_lock(&p->mu);
    uint_fast64_t g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *argp)
{
    worker_arg *arg = argp;
    ml_cpu_pool *p = arg->pool;
    const int tid = arg->tid;
    free(arg);

    uint_fast64_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        ml_cpu_pool_fn fn = p->fn;
        if (!fn)
            break;
        if (tid < p->n_active) {
            int64_t begin, end;
            share(p->n, p->n_active, tid, &begin, &end);
            if (begin < end)
                fn(p->ctx, begin, end, tid);
        }
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Publish a job to every worker (fn == NULL asks them to exit). */
static void post(ml_cpu_pool *p, ml_cpu_pool_fn fn, void *ctx, int64_t n, int n_active)
{
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->n_active = n_active;
    atomic_store_explicit(&p->pending, p->n_workers_started, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_mutex_unlock(&p->mu);
    pthread_cond_broadcast(&p->wake);
}

static void wait_done(ml_cpu_pool *p)
{
    for (int i = 0; i < SPIN_POLLS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

ml_cpu_pool *ml_cpu_pool_create(int n_threads, char *err, size_t errlen)
{
    if (n_threads < 1) {
        ml_fail(err, errlen, ML_ERR_INVALID_ARG, "thread pool: %d threads", n_threads);
        return NULL;
    }
    ml_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) {
        ml_fail(err, errlen, ML_ERR_NOMEM, "thread pool: out of memory");
        return NULL;
    }
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    p->fn = NULL;
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            ml_fail(err, errlen, ML_ERR_NOMEM, "thread pool: out of memory");
            ml_cpu_pool_destroy(p);
            return NULL;
        }
    }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            ml_fail(err, errlen, ML_ERR_NOMEM, "thread pool: out of memory");
            ml_cpu_pool_destroy(p);
            return NULL;
        }
        arg->pool = p;
        arg->tid = t;
        int rc = pthread_create(&p->workers[t - 1], NULL, worker_main, arg);
        if (rc != 0) {
            free(arg);
            ml_fail(err, errlen, ML_ERR_NOMEM, "thread pool: starting worker %d of %d: %s", t,
                    n_threads - 1, strerror(rc));
            ml_cpu_pool_destroy(p);
            return NULL;
        }
        p->n_workers_started++;
    }
    return p;
}

void ml_cpu_pool_destroy(ml_cpu_pool *pool)
{
    if (!pool)
        return;
    if (pool->n_workers_started > 0) {
        post(pool, NULL, NULL, 0, 0);
        for (int t = 0; t < pool->n_workers_started; t++)
            pthread_join(pool->workers[t], NULL);
    }
    free(pool->workers);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

int ml_cpu_pool_threads(const ml_cpu_pool *pool)
{
    return pool->n_threads;
}

void ml_cpu_pool_for(ml_cpu_pool *pool, int64_t n, int64_t grain, ml_cpu_pool_fn fn, void *ctx)
{
    assert(fn && grain >= 1);
    if (n <= 0)
        return;
    int64_t want = (n + grain - 1) / grain;
    int n_active = want < pool->n_threads ? (int)want : pool->n_threads;
    if (n_active <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    post(pool, fn, ctx, n, n_active);
    int64_t begin, end;
    share(n, n_active, 0, &begin, &end);
    if (begin < end)
        fn(ctx, begin, end, 0);
    wait_done(pool);
}
