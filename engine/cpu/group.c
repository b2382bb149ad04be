/* A tensor-parallel group of CPU backends and its in-process all-reduce
 * (engine/model/README.md §11): the CPU stand-in for NCCL, so that the sharded graph is
 * tested without GPUs.
 *
 * all_reduce_sum is a reduce-scatter followed by an all-gather over shared
 * memory: every member publishes its buffer, then member r sums slice r of
 * all buffers in rank order and writes the sum back into every buffer. Each
 * element is summed once, in one fixed order, so every member ends with
 * bit-identical values whatever the thread timing.
 * @locality: one thread per member, every member calling the collective
 * with the same n in the same order (as with NCCL). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/cpu_features.h"
#include "cpu/cpu_internal.h"

typedef struct ml_cpu_group {
    int world;
    atomic_int refs;           /* members not yet destroyed */
    pthread_barrier_t barrier; /* world parties */
    float *bufs[ML_CPU_GROUP_MAX]; /* borrowed: each member's buffer during a collective */
} ml_cpu_group;

void ml_cpu_group_release(ml_cpu_group *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    pthread_barrier_destroy(&g->barrier);
    free(g);
}

typedef struct reduce_job {
    float *const *bufs; /* (world) */
    int world;
    size_t first;       /* start of this member's slice */
} reduce_job;

static void reduce_range(void *ctx, int64_t begin, int64_t end, int tid)
{
    const reduce_job *j = ctx;
    for (size_t i = j->first + (size_t)begin; i < j->first + (size_t)end; i++) {
        float s = j->bufs[0][i];
        for (int r = 1; r < j->world; r++)
            s += j->bufs[r][i];
        for (int r = 0; r < j->world; r++)
            j->bufs[r][i] = s;
    }
}

void ml_cpu_all_reduce_sum(ml_backend *be, float *x, size_t n)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    ml_cpu_group *g = cb->group;
    g->bufs[cb->rank] = x;
    /* Every buffer is published (and every member's earlier writes to it
     * visible: the barrier synchronizes memory) before anyone reads. */
    pthread_barrier_wait(&g->barrier);
    size_t first = n * (size_t)cb->rank / (size_t)g->world;
    size_t last = n * (size_t)(cb->rank + 1) / (size_t)g->world;
    reduce_job j = {.bufs = g->bufs, .world = g->world, .first = first};
    ml_cpu_pool_for(cb->pool, (int64_t)(last - first), ml_cpu_grain(2.0 * g->world), reduce_range,
                    &j);
    /* No member may reuse its buffer until every slice is written back. */
    pthread_barrier_wait(&g->barrier);
}

ml_status ml_backend_cpu_create_group(int world, int threads_each, ml_backend **out, char *err,
                                      size_t errlen)
{
    if (world < 1 || world > ML_CPU_GROUP_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "cpu group: world %d outside [1, %d]",
                       world, ML_CPU_GROUP_MAX);
    if (threads_each < 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "cpu group: %d threads each",
                       threads_each);
    for (int r = 0; r < world; r++)
        out[r] = NULL;
    /* The members' own ISA check, done once here so that it reports its
     * own status; what can still fail below is memory or threads. */
    ml_cpu_isa isa;
    ml_status st = ml_cpu_isa_select(&isa, err, errlen);
    if (st != ML_OK)
        return st;
    if (threads_each == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads_each = online / world < 1 ? 1 : (int)(online / world);
    }
    ml_cpu_group *g = calloc(1, sizeof *g);
    if (!g)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "cpu group: out of memory");
    if (pthread_barrier_init(&g->barrier, NULL, (unsigned)world) != 0) {
        free(g);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "cpu group: cannot create a barrier");
    }
    g->world = world;
    atomic_init(&g->refs, 0);
    for (int r = 0; r < world; r++) {
        out[r] = ml_backend_cpu_create(threads_each, err, errlen);
        if (!out[r])
            break;
        ml_cpu_backend *cb = ml_cpu_of(out[r]);
        cb->group = g;
        cb->rank = r;
        cb->ops.all_reduce_sum = ml_cpu_all_reduce_sum;
        atomic_fetch_add(&g->refs, 1);
    }
    if (out[world - 1])
        return ML_OK;
    /* err holds ml_backend_cpu_create's reason. The members release the
     * group as they go; with none made it is still ours to free. */
    if (!out[0]) {
        pthread_barrier_destroy(&g->barrier);
        free(g);
    }
    for (int r = 0; r < world && out[r]; r++) {
        out[r]->ops->destroy(out[r]);
        out[r] = NULL;
    }
    return ML_ERR_NOMEM;
}
