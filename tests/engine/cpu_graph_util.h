/* The helpers of the CPU backend's graph tests (tests/engine/test_cpu_graph_*.c):
 * backend memory carved from one arena, so a whole state is one upload and
 * one download, and the checks of the latched error that synchronize
 * reports. Header-only, test code only. */
#ifndef ML_TEST_CPU_GRAPH_UTIL_H
#define ML_TEST_CPU_GRAPH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_kernels.h"
#include "harness.h"
#include "test_rand.h"

#define ERRLEN 256
#define SEED_RECORD 1
#define SEED_REPLAY 2
#define W_MAX 0.25f /* bf16 weights are uniform in [-W_MAX, W_MAX), activations in [-1, 1) */
#define EPS 1e-5f   /* of the rmsnorms */

/* Backend memory is carved from one allocation ("malloc and point"), so a
 * whole state is one upload and one download. */
#define ARENA_ALIGN 64
/* Elements of a Linear's weight (rows, cols) as a CPU backend packs it:
 * rows rounded up to the widest strip (cpu_kernels.h). The graph tests
 * fill the whole of it with random bf16, which is then a random weight in
 * the packed layout (its padding columns are computed and never stored). */
#define LINEAR_ELEMS(rows, cols)                                                              \
    ((size_t)(((rows) + ML_CPU_MAX_STRIP_COLS - 1) / ML_CPU_MAX_STRIP_COLS) *                 \
     ML_CPU_MAX_STRIP_COLS * (size_t)(cols))

typedef struct arena {
    char *base; /* backend memory, owned */
    size_t bytes, used;
} arena;

/* An arena of `bytes` of be's memory; a failed allocation ends the test. */
static inline arena arena_open(ml_backend *be, size_t bytes)
{
    arena a = {.base = be->ops->alloc(be, bytes), .bytes = bytes};
    if (!a.base) {
        fprintf(stderr, "backend alloc failed\n");
        exit(1);
    }
    return a;
}

static inline void *carve(arena *a, size_t bytes)
{
    size_t off = (a->used + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (off + bytes > a->bytes) {
        fprintf(stderr, "arena too small\n");
        exit(1);
    }
    a->used = off + bytes;
    return a->base + off;
}

/* The host image of backend pointer p. */
static inline void *host_of(const arena *a, unsigned char *image, const void *p)
{
    return image + ((const char *)p - a->base);
}

static inline ml_status sync_err(ml_backend *be, char *err)
{
    err[0] = '\0';
    return be->ops->synchronize(be, err, ERRLEN);
}

/* The latched error is st with a message containing want; the next
 * synchronize reports nothing. */
static inline void check_latched(ml_backend *be, ml_status st, const char *want)
{
    char err[ERRLEN];
    ml_status got = sync_err(be, err);
    check(got == st && strstr(err, want), "want %s \"%s\", got %s \"%s\"", ml_status_name(st),
          want, ml_status_name(got), err);
    check(sync_err(be, err) == ML_OK && err[0] == '\0', "a second synchronize reports \"%s\"",
          err);
}

static inline void check_clean(ml_backend *be, const char *what)
{
    char err[ERRLEN];
    check(sync_err(be, err) == ML_OK, "%s: unexpected error \"%s\"", what, err);
}

#endif
