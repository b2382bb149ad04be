/* How fast this process reads its packed weights (ml_backend_cpu_weights_read):
 * the ceiling of a memory-bound decode step measured on the bytes the step
 * streams, in the process that streams them.
 *
 * Why on the weights themselves: a decode step of one sequence reads every
 * weight once, so its time is at least their bytes over the rate at which
 * their pages can be read, and that rate belongs to the pages and the
 * minute. On the development VM a separate process's 1 GiB buffer read at
 * 40 to 83 GB/s within an hour, while processes of the `small` preset read
 * their own weights at 42-50 GB/s and decoded one sequence at 91-101% of
 * that (tests/bench/results-log.md): a bound taken from another process's buffer
 * says as much about the draw as about the engine.
 *
 * The read is a sum of 64-byte vectors over four parts of each block walked
 * side by side (more hardware-prefetch streams in flight than one: measured
 * 1.3-1.6x one 16-byte stream), compiled for AVX-512, AVX2 and the baseline
 * with the best chosen at load (function multiversioning), split over the
 * pool's threads in equal runs of blocks. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_internal.h"

/* The unit the threads split: 1 MiB of one Linear's packed weights (a
 * strip's run of steps is far shorter, so a block spans many strips). */
#define READ_BLOCK_BYTES ((size_t)1 << 20)
/* Parts of a block summed side by side. */
#define READ_STREAMS 4

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

typedef uint64_t u64x8 __attribute__((vector_size(64)));
_Static_assert(READ_STREAMS == 4, "ml_cpu_stream_sum walks four streams");
_Static_assert(ML_CPU_STREAM_GRAIN == READ_STREAMS * sizeof(u64x8),
               "the grain is a vector in every stream");
_Static_assert(READ_BLOCK_BYTES % ML_CPU_STREAM_GRAIN == 0,
               "a block is whole vectors in every stream");

MULTIVERSION uint64_t ml_cpu_stream_sum(const void *p, size_t bytes)
{
    const size_t len = bytes / ML_CPU_STREAM_GRAIN;
    const u64x8 *q0 = p, *q1 = q0 + len, *q2 = q1 + len, *q3 = q2 + len;
    u64x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < len; i++) {
        s0 += q0[i];
        s1 += q1[i];
        s2 += q2[i];
        s3 += q3[i];
    }
    const u64x8 all = s0 + s1 + s2 + s3;
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += all[i];
    return sum;
}

typedef struct read_job {
    const ml_cpu_backend *cb;
    const size_t *first_block; /* (n_packed + 1): the index of each Linear's first block */
    _Atomic uint64_t sum;      /* kept, so that no load is elided */
} read_job;

static void read_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    read_job *r = ctx;
    size_t w = 0; /* the Linear holding block b */
    uint64_t sum = 0;
    for (int64_t b = begin; b < end; b++) {
        while (r->first_block[w + 1] <= (size_t)b)
            w++;
        const ml_cpu_packed *pw = &r->cb->packed[w];
        const size_t at = ((size_t)b - r->first_block[w]) * READ_BLOCK_BYTES;
        const size_t n = pw->bytes - at < READ_BLOCK_BYTES ? pw->bytes - at : READ_BLOCK_BYTES;
        sum += ml_cpu_stream_sum((const unsigned char *)pw->p + at, n);
    }
    atomic_fetch_add_explicit(&r->sum, sum, memory_order_relaxed);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ml_backend_cpu_weights_read(ml_backend *be, int passes, uint64_t *bytes)
{
    const ml_cpu_backend *cb = ml_cpu_of(be);
    *bytes = 0;
    if (cb->n_packed == 0 || passes < 1)
        return 0;
    size_t *first = malloc((cb->n_packed + 1) * sizeof *first);
    if (!first)
        return 0;
    first[0] = 0;
    for (size_t w = 0; w < cb->n_packed; w++) {
        const size_t n = cb->packed[w].bytes;
        first[w + 1] = first[w] + (n + READ_BLOCK_BYTES - 1) / READ_BLOCK_BYTES;
        *bytes += n - n % ML_CPU_STREAM_GRAIN; /* every block starts on the grain */
    }
    read_job job = {.cb = cb, .first_block = first};
    atomic_init(&job.sum, 0);
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        const double t0 = now_s();
        ml_cpu_pool_for(cb->pool, (int64_t)first[cb->n_packed], 1, read_part, &job);
        const double dt = now_s() - t0;
        best = pass == 0 || dt < best ? dt : best;
    }
    free(first);
    return best > 0 ? best : 0;
}
