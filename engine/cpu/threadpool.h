/* The CPU backend's persistent worker pool and its parallel-for.
 *
 * Threads are created once, by ml_cpu_pool_create, never per op. The thread
 * that calls ml_cpu_pool_for is thread 0 and does its own share; workers
 * 1 .. n-1 spin for a few microseconds after a job (ops of a forward pass
 * follow each other closely) and then block on a condition variable, so an
 * idle backend costs no CPU.
 * @locality: one caller thread at a time (the thread driving the backend). */
#ifndef ML_CPU_THREADPOOL_H
#define ML_CPU_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct ml_cpu_pool ml_cpu_pool;

/* Work on items [begin, end) as thread `tid` (0 = the caller, < n_threads). */
typedef void (*ml_cpu_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* A pool of n_threads threads in all (the caller counts as one, so
 * n_threads - 1 workers are started; n_threads >= 1). Returns NULL and fills
 * err on failure (ML_ERR_NOMEM or a pthread error), with nothing left running.
 * The pool is owned by the caller. */
ml_cpu_pool *ml_cpu_pool_create(int n_threads, char *err, size_t errlen);

/* Join the workers and free the pool. NULL is a no-op. */
void ml_cpu_pool_destroy(ml_cpu_pool *pool);

/* Threads in the pool, caller included. */
int ml_cpu_pool_threads(const ml_cpu_pool *pool);

/* Static parallel-for: split items [0, n) into equal contiguous ranges over
 * min(threads, ceil(n / grain)) threads and run fn once per non-empty range;
 * returns when every range is done. When one thread suffices fn runs inline
 * and no worker is woken. fn must not call back into the pool. */
void ml_cpu_pool_for(ml_cpu_pool *pool, int64_t n, int64_t grain, ml_cpu_pool_fn fn, void *ctx);

#endif
