/* Memory read bandwidth, the ceiling of memory-bound decode (label bench;
 * skipped unless ML_BENCH=1): threads summing disjoint slices of a 1 GiB
 * buffer (far above any L3) with 64-byte vector loads, each thread walking
 * four parts of its slice at once (more hardware-prefetch streams in flight
 * than one: measured 1 stream ~12, 4 streams ~19 GB/s), best of a few
 * passes, for ML_BENCH_THREADS (default 2) threads and for 1. The sum is
 * the CPU backend's (ml_cpu_stream_sum), the one ml_backend_cpu_weights_read
 * streams a process's own weights with.
 *
 * Why not bench_cpu_ops' figure: one 16-byte-load stream per thread is
 * latency- and issue-bound on the development VMs (Xeon, 2 vCPUs, 300 MiB
 * L3): side by side it read 1.3-1.6x less than 64-byte loads over 4
 * streams, and less than the engine's own decode (a GEMV streams 4 weight
 * rows per thread). A ceiling below what the code under test achieves
 * makes "fraction of bandwidth" meaningless. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_internal.h"
#include "harness.h"

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5
#define MAX_THREADS 64
#define FILL_BYTE 0x01

typedef struct slice {
    const unsigned char *p;
    size_t bytes;
    uint64_t sum;
} slice;

static void *sum_slice(void *arg)
{
    slice *s = arg;
    s->sum = ml_cpu_stream_sum(s->p, s->bytes);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GB/s of BW_PASSES passes over buf with `threads` threads, each
 * summing an equal run of groups; the sums are checked so the loads cannot
 * be elided. */
static double read_bandwidth(const unsigned char *buf, int threads)
{
    const size_t groups = BW_BYTES / ML_CPU_STREAM_GRAIN;
    double best = 1e30;
    for (int pass = 0; pass < BW_PASSES; pass++) {
        pthread_t tid[MAX_THREADS];
        slice s[MAX_THREADS];
        const double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            const size_t lo = groups * t / threads, hi = groups * (t + 1) / threads;
            s[t] = (slice){.p = buf + ML_CPU_STREAM_GRAIN * lo,
                           .bytes = ML_CPU_STREAM_GRAIN * (hi - lo)};
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
    ml_bench_require();
    int threads = ml_bench_env_int("ML_BENCH_THREADS", 2, 1, MAX_THREADS);

    unsigned char *buf = aligned_alloc(ML_CPU_STREAM_GRAIN, BW_BYTES);
    if (!buf) {
        fprintf(stderr, "out of memory (1 GiB)\n");
        return 1;
    }
    memset(buf, FILL_BYTE, BW_BYTES); /* fault every page in before timing */
    printf("read bandwidth, %d thread(s), 1 GiB, 64-byte loads, 4 streams each: %6.1f GB/s\n",
           threads, read_bandwidth(buf, threads));
    if (threads > 1)
        printf("read bandwidth, 1 thread(s), 1 GiB, 64-byte loads, 4 streams each: %6.1f GB/s\n",
               read_bandwidth(buf, 1));
    free(buf);
    return check_done();
}
