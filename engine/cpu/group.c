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
#include "cpu/group.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu/cpu_internal.h"

struct ml_cpu_group {
    int world;
    atomic_int refs;           /* members not yet destroyed, and the creator's until released */
    pthread_barrier_t barrier; /* world parties */
    float *bufs[ML_CPU_GROUP_MAX]; /* borrowed: each member's buffer during a collective */
};

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

ml_status ml_cpu_group_create(ml_cpu_group **out, int world, char *err, size_t errlen)
{
    assert(world >= 1 && world <= ML_CPU_GROUP_MAX);
    *out = NULL;
    ml_cpu_group *g = calloc(1, sizeof *g);
    if (!g)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "cpu group: out of memory");
    if (pthread_barrier_init(&g->barrier, NULL, (unsigned)world) != 0) {
        free(g);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "cpu group: cannot create a barrier");
    }
    g->world = world;
    atomic_init(&g->refs, 1);
    *out = g;
    return ML_OK;
}

void ml_cpu_group_join(ml_cpu_group *g, ml_cpu_backend *cb, int rank)
{
    assert(rank >= 0 && rank < g->world && !cb->group);
    atomic_fetch_add(&g->refs, 1);
    cb->group = g;
    cb->rank = rank;
}
