/* The CPU backend itself: its thread pool, creating it (ML_CPU_ISA, thread
 * counts, the errors), and its memory ops on each ISA path this machine
 * supports (cpu_ops_util.h), pools resident from their allocation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_internal.h"
#include "cpu/threadpool.h"
#include "cpu_ops_util.h"
#include "harness.h"
#include "test_rand.h"

/* ---- thread pool ----------------------------------------------------------------------- */

typedef struct pool_check {
    int *hits;
    int used[THREADS_MANY]; /* each thread writes only its own slot */
} pool_check;

static void mark(void *ctx, int64_t begin, int64_t end, int tid)
{
    pool_check *pc = ctx;
    for (int64_t i = begin; i < end; i++)
        pc->hits[i]++;
    pc->used[tid] = 1;
}

static void test_pool(void)
{
    char err[ERRLEN];
    ml_cpu_pool *pool = ml_cpu_pool_create(THREADS_MANY, err, sizeof err);
    check(pool != NULL, "pool create: %s", err);
    if (!pool)
        return;
    enum { N = 1000, ROUNDS = 300 };
    static int hits[N];
    pool_check pc = {.hits = hits};
    int ok = 1;
    for (int r = 0; r < ROUNDS; r++) {
        memset(hits, 0, sizeof hits);
        const int64_t n = 1 + r % N;
        ml_cpu_pool_for(pool, n, 1 + r % 7, mark, &pc);
        for (int64_t i = 0; i < N; i++)
            ok &= hits[i] == (i < n);
        if (r % 50 == 0)
            usleep(5000); /* let the workers fall asleep on the condition variable */
    }
    check(ok, "pool_for visits every item exactly once");
    int used = 0;
    for (int t = 0; t < THREADS_MANY; t++)
        used += pc.used[t];
    check(used == THREADS_MANY, "pool_for used all %d threads (%d)", THREADS_MANY, used);
    ml_cpu_pool_destroy(pool);
    ml_cpu_pool_destroy(NULL);
}

static void test_create_errors(void)
{
    char err[ERRLEN] = "";
    setenv("ML_CPU_ISA", "sse9", 1);
    check(ml_backend_cpu_create(1, err, sizeof err) == NULL && strstr(err, "sse9"),
          "unknown ML_CPU_ISA rejected: %s", err);
    unsetenv("ML_CPU_ISA");
    check(ml_backend_cpu_create(-1, err, sizeof err) == NULL, "negative thread count rejected");
    ml_backend *be = ml_backend_cpu_create(0, err, sizeof err);
    check(be != NULL, "create with one thread per CPU: %s", err);
    if (be) {
        char want[32];
        snprintf(want, sizeof want, "cpu-%s", ml_cpu_isa_name(ml_cpu_isa_detect()));
        check(strcmp(be->ops->name, want) == 0, "name %s (want %s)", be->ops->name, want);
        be->ops->destroy(be);
    }
}

/* ---- memory ops ---------------------------------------------------------------- */

static void test_memory(ml_backend *be)
{
    const ml_backend_ops *o = be->ops;
    check(o->kv_elem_size == sizeof(float), "kv_elem_size");
    float *p = o->alloc(be, 1000 * sizeof(float));
    check(p && ((uintptr_t)p % 64) == 0, "alloc aligned");
    float src[1000], back[1000];
    fill(src, 1000, -1, 1);
    o->upload(be, p, src, sizeof src);
    o->download(be, back, p, sizeof back);
    check(memcmp(src, back, sizeof src) == 0, "upload/download round trip");
    check(o->weight(be, src, sizeof src) == src, "weight returns the host pointer");
    o->zero(be, p, 1000);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= p[i] == 0.0f;
    check(zero, "zero");
    o->free(be, p);
    void *empty = o->alloc(be, 0);
    check(empty != NULL, "alloc(0) gives a block");
    o->free(be, empty);
    char err[ERRLEN] = "";
    check(o->synchronize(be, err, sizeof err) == ML_OK, "synchronize");
}

/* A pool of a few huge pages and a bit (memory.c: 2 MiB pages). */
#define POOL_BYTES ((size_t)5 << 20 | 123)
#define HUGE_PAGE ((size_t)2 << 20)

/* An allocation of a huge page or more (the memory plan's pools) comes
 * resident: every page is in memory before anything writes to it, so no
 * decode step waits on a page fault and a budget that does not fit fails
 * at load. */
static void test_pool_resident(ml_backend *be)
{
    const long page = sysconf(_SC_PAGESIZE);
    unsigned char *p = be->ops->alloc(be, POOL_BYTES);
    check(p != NULL, "alloc of a pool");
    if (!p)
        return;
    check((uintptr_t)p % HUGE_PAGE == 0, "a pool is aligned to the huge page");
    const size_t pages = (POOL_BYTES + (size_t)page - 1) / (size_t)page;
    unsigned char *in = malloc(pages);
    check(in && mincore(p, POOL_BYTES, in) == 0, "mincore");
    size_t resident = 0;
    for (size_t i = 0; in && i < pages; i++)
        resident += in[i] & 1;
    check(resident == pages, "a pool is resident before its first write (%zu of %zu pages)",
          resident, pages);
    p[POOL_BYTES - 1] = 1; /* the whole length is the caller's */
    free(in);
    be->ops->free(be, p);
}

/* ---- the read of the packed weights ------------------------------------------- */

/* ml_cpu_stream_sum adds the 64-bit words of the whole groups
 * (ML_CPU_STREAM_GRAIN bytes) and nothing past them. */
static void test_stream_sum(void)
{
    enum { WORDS = 1000 }; /* 8000 bytes: 31 groups and 64 bytes over */
    uint64_t *w = aligned_alloc(64, WORDS * sizeof *w);
    check(w != NULL, "alloc");
    if (!w)
        return;
    uint64_t want = 0;
    for (size_t i = 0; i < WORDS; i++) {
        w[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
        if (i < (WORDS * sizeof *w) / ML_CPU_STREAM_GRAIN * ML_CPU_STREAM_GRAIN / sizeof *w)
            want += w[i];
    }
    check(ml_cpu_stream_sum(w, WORDS * sizeof *w) == want, "stream sum of whole groups");
    check(ml_cpu_stream_sum(w, ML_CPU_STREAM_GRAIN - 1) == 0, "less than a group reads nothing");
    free(w);
}

/* Bytes of a packed Linear of rows x cols elements (f32 activations: whole
 * strips of every step). */
static size_t packed_bytes(ml_backend *be, int rows, int cols, size_t elem)
{
    const size_t sc = (size_t)ml_cpu_of(be)->kern->strip_cols;
    return ((size_t)rows + sc - 1) / sc * sc * (size_t)cols * elem;
}

/* ml_backend_cpu_weights_read reads every Linear bound, and only those. */
static void test_weights_read(ml_backend *be)
{
    uint64_t bytes = 1;
    check(ml_backend_cpu_weights_read(be, 3, &bytes) == 0 && bytes == 0,
          "nothing bound: nothing read");
    enum { ROWS_A = 300, COLS_A = 1024, ROWS_B = 70, COLS_B = 512 };
    uint16_t *host = calloc((size_t)ROWS_A * COLS_A, sizeof *host);
    check(host != NULL, "alloc");
    if (!host)
        return;
    const void *a = be->ops->linear_weight(be, host, ROWS_A, COLS_A, sizeof(uint16_t));
    const void *b = be->ops->linear_weight(be, host, ROWS_B, COLS_B, 1); /* FP8 codes */
    check(a && b, "bind two Linears");
    const size_t want = packed_bytes(be, ROWS_A, COLS_A, sizeof(uint16_t)) +
                        packed_bytes(be, ROWS_B, COLS_B, 1);
    const double s = ml_backend_cpu_weights_read(be, 2, &bytes);
    check(s > 0 && bytes == want, "two Linears: %.3g s, %llu bytes, want %zu", s,
          (unsigned long long)bytes, want);
    check(ml_backend_cpu_weights_read(be, 0, &bytes) == 0 && bytes == 0, "no pass: nothing");
    be->ops->linear_weight_free(be, a);
    ml_backend_cpu_weights_read(be, 1, &bytes);
    check(bytes == packed_bytes(be, ROWS_B, COLS_B, 1), "one freed: the other's %llu bytes",
          (unsigned long long)bytes);
    be->ops->linear_weight_free(be, b);
    check(ml_backend_cpu_weights_read(be, 1, &bytes) == 0 && bytes == 0, "all freed: nothing");
    free(host);
}

static void run_path(ml_backend *be[N_BACKENDS], ml_cpu_isa isa)
{
    test_memory(be[0]);
    test_pool_resident(be[0]);
    test_weights_read(be[0]);
}

int main(void)
{
    test_pool();
    test_create_errors();
    test_stream_sum();
    return cpu_ops_run_paths(run_path, 1);
}
