/* Memory read bandwidth, the ceiling of memory-bound decode (label bench;
 * skipped unless ML_BENCH=1): threads summing disjoint slices of a 1 GiB
 * buffer (far above any L3) with 64-byte vector loads, best of a few
 * passes, for ML_BENCH_THREADS (default 2) threads and for 1.
 *
 * Why not bench_cpu_ops' figure: its 16-byte loads are issue-bound on the
 * development VMs (Xeon, 2 vCPUs): they measured ~17 GB/s on 2 threads where
 * 64-byte loads, and the engine's own decode, reach ~21 GB/s. A ceiling
 * below what the engine achieves makes "fraction of bandwidth" meaningless.
 * On x86 the summing loop is compiled for AVX-512, AVX2 and the baseline
 * and the best the CPU supports runs (GCC/Clang function multiversioning). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5
#define MAX_THREADS 64
#define FILL_BYTE 0x01

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

typedef uint64_t u64x8 __attribute__((vector_size(64)));

/* Sum of n vectors (n a multiple of 4), four independent accumulators so
 * the adds never wait on each other. */
MULTIVERSION static uint64_t sum_vectors(const u64x8 *p, size_t n)
{
    u64x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    const u64x8 all = s0 + s1 + s2 + s3;
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += all[i];
    return sum;
}

typedef struct slice {
    const u64x8 *p;
    size_t n;
    uint64_t sum;
} slice;

static void *sum_slice(void *arg)
{
    slice *s = arg;
    s->sum = sum_vectors(s->p, s->n);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GB/s of BW_PASSES passes over buf with `threads` threads; the sums
 * are checked so the loads cannot be elided. */
static double read_bandwidth(const u64x8 *buf, int threads)
{
    const size_t groups = BW_BYTES / sizeof *buf / 4; /* 4 vectors per loop step */
    double best = 1e30;
    for (int pass = 0; pass < BW_PASSES; pass++) {
        pthread_t tid[MAX_THREADS];
        slice s[MAX_THREADS];
        const double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            const size_t lo = groups * t / threads, hi = groups * (t + 1) / threads;
            s[t] = (slice){.p = buf + 4 * lo, .n = 4 * (hi - lo)};
            if (pthread_create(&tid[t], NULL, sum_slice, &s[t]) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                exit(1);
            }
        }
        uint64_t sum = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            sum += s[t].sum;
        }
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
        check(sum == (BW_BYTES / sizeof(uint64_t)) * 0x0101010101010101ull,
              "read bandwidth: wrong sum with %d threads", threads);
    }
    return BW_BYTES / best / 1e9;
}

int main(void)
{
    const char *on = getenv("ML_BENCH");
    if (!on || strcmp(on, "1") != 0)
        ml_test_skip("benchmarks run only with ML_BENCH=1");
    const char *tenv = getenv("ML_BENCH_THREADS");
    int threads = tenv ? atoi(tenv) : 2;
    if (threads < 1 || threads > MAX_THREADS)
        threads = 2;

    u64x8 *buf = aligned_alloc(sizeof(u64x8), BW_BYTES);
    if (!buf) {
        fprintf(stderr, "out of memory (1 GiB)\n");
        return 1;
    }
    memset(buf, FILL_BYTE, BW_BYTES); /* fault every page in before timing */
    printf("read bandwidth, %d thread(s), 1 GiB, 64-byte loads: %6.1f GB/s\n", threads,
           read_bandwidth(buf, threads));
    if (threads > 1)
        printf("read bandwidth, 1 thread(s), 1 GiB, 64-byte loads: %6.1f GB/s\n",
               read_bandwidth(buf, 1));
    free(buf);
    return check_done();
}
