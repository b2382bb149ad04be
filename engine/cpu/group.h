/* A tensor-parallel group of CPU backends and its in-process all-reduce
 * (group.c): the layer that joins backends made by cpu_backend.c. It uses
 * the core (cpu_internal.h) and nothing else of engine/cpu; cpu_backend.c
 * makes the members and puts the collective in their tables.
 * @locality: ml_cpu_group_create and _join on the thread making the group;
 * the collective on one thread per member (group.c). */
#ifndef ML_CPU_GROUP_H
#define ML_CPU_GROUP_H

#include <stddef.h>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_internal.h"
#include "status.h"

typedef struct ml_cpu_group ml_cpu_group;

/* A group of `world` members (1 .. ML_CPU_GROUP_MAX) with one reference,
 * the caller's, and no member yet. Errors: ML_ERR_NOMEM (memory, or no
 * barrier); *out is then NULL. */
ml_status ml_cpu_group_create(ml_cpu_group **out, int world, char *err, size_t errlen);

/* Make cb member `rank` of g: cb takes a reference, which its destroy
 * releases. Every rank of the group joins once. */
void ml_cpu_group_join(ml_cpu_group *g, ml_cpu_backend *cb, int rank);

/* Drop one reference to g; the last frees it. NULL is a no-op. */
void ml_cpu_group_release(ml_cpu_group *g);

/* The op table's all_reduce_sum of a member (contract in backend.h). */
void ml_cpu_all_reduce_sum(ml_backend *be, float *x, size_t n);

#endif
