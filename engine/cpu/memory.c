/* The entries of the op table that compute nothing: host memory (alloc,
 * free, upload, download, weight) and the latched error that synchronize
 * reports.
 *
 * Memory is host memory: alloc is 64-byte aligned and NOT zeroed (as device
 * allocations are not), weights stay where the caller mapped them, upload
 * and download are memcpy, and every op has finished when it returns.
 * Errors are latched and reported by synchronize, as on a device; the only
 * ones are misuses of the graph ops (graph.c). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu/cpu_internal.h"

/* Transparent huge pages (x86-64's 2 MiB): a decode step reads every weight
 * once, and with 4 KiB pages that is a TLB miss every 64 cache lines of
 * each strip; the causal attention reads each cached key's row of its kv
 * head, one row a page apart at 11B's 8 kv heads x 128, so every key was a
 * TLB miss. Aligned to the huge page and marked MADV_HUGEPAGE, the range
 * gets them where the kernel's policy is "always" and where it is "madvise"
 * (/sys/kernel/mm/transparent_hugepage/enabled; the development VM's is
 * madvise, and there unmarked memory gets none). Where the kernel lends
 * none the advice is ignored and the buffer is an ordinary one. Measured on
 * the packed weights (2026-12-03, the development VM, 2 threads, bf16
 * activations, the same weights packed both ways and run alternately,
 * medians of 9): 1 row 0.68-0.99x the time, 16 rows 0.86-1.03x, 64 and 304
 * rows 0.94-1.08x. */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)
/* The base page, the stride of the fallback that faults a range in. */
#define BASE_PAGE_BYTES ((size_t)4096)

static void *huge_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE_BYTES, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: its failure changes nothing */
    return p;
}

/* Fault every page of [p, p + bytes) in now; 0 when the memory is not
 * there. MADV_POPULATE_WRITE (Linux 5.14) says so with ENOMEM; older
 * kernels refuse the advice (EINVAL), and writing a byte per page does the
 * same, where running short means the OOM killer rather than an error. */
static int fault_range(unsigned char *p, size_t bytes)
{
    if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0)
        return 1;
    if (errno != EINVAL)
        return 0;
    volatile unsigned char *c = p;
    for (size_t at = 0; at < bytes; at += BASE_PAGE_BYTES)
        c[at] = 0;
    return 1;
}

typedef struct fault_job {
    unsigned char *p; /* huge-page aligned */
    size_t bytes;
    int failed;       /* written by any thread that ran short: only ever set */
} fault_job;

/* Huge pages [begin, end) of the job's range. */
static void fault_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    fault_job *f = ctx;
    const size_t at = (size_t)begin * HUGE_PAGE_BYTES;
    const size_t to = (size_t)end * HUGE_PAGE_BYTES < f->bytes ? (size_t)end * HUGE_PAGE_BYTES
                                                               : f->bytes;
    if (!fault_range(f->p + at, to - at))
        __atomic_store_n(&f->failed, 1, __ATOMIC_RELAXED);
}

/* fault_range over the pool's threads, a share of the huge pages each: a
 * page's first touch costs the kernel a zeroing, and in a VM that gives
 * freed memory back to its host (virtio-balloon's free page reporting) a
 * fault on the host too, which made the default 512 MiB K/V pool most of a
 * load. Measured (`mllama run` of `small` to its first token, 2 threads,
 * 1.2 GB resident, the Intel Xeon VM, 2026-12-06, each process started
 * after 45 s idle, 3 alternating pairs): 3.24-3.45 s on one thread, 2.27-2.41
 * s shared (0.5 s when the memory was freed just before). */
static int fault_in(ml_cpu_backend *cb, void *p, size_t bytes)
{
    fault_job f = {.p = p, .bytes = bytes, .failed = 0};
    const int64_t pages = (int64_t)((bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES);
    ml_cpu_pool_for(cb->pool, pages, 1, fault_part, &f);
    return !f.failed;
}

/* Buffers of a huge page and more are the memory plan's pools: the paged
 * K/V (one per layer), the image states, the workspace, adapter slots.
 * They live on huge pages and are faulted in here, at load (the image
 * cache makes every state its budget holds when it is created), so that:
 * - a decode step never waits on a page fault: filled lazily, the K/V pool
 *   faulted a zeroed page in every few tokens of every sequence (128 faults,
 *   ~4% of a 32-sequence step of `small`), and on huge pages each first
 *   touch of a 2 MiB page stalled its step 213-264 ms (the kernel compacting
 *   memory to find one);
 * - the attention's keys cost no TLB miss each (above): one layer of an
 *   11B-shaped decode step, 16 sequences over 1,024 cached keys each, took
 *   6.4 against 7.6 ms on 4 KiB pages, the medians of 8 alternating runs
 *   (`bench_cpu_ops` attn_causal, 2026-12-05, the development VM, Zen 5, 2
 *   threads; either side spread over 5.6-8.0 ms); a 32-sequence step of
 *   `small` on a warm pool 0.95-1.03x the time (6 alternating pairs, median
 *   0.965), in a fresh process 0.82-0.98x (4 pairs);
 * - a budget the machine cannot hold fails at load (an allocation error, or
 *   the OOM killer where the kernel chooses it), not once the pool has filled
 *   under traffic.
 * The resident set is the budgets from the start, as a GPU server's is. */
void *ml_cpu_alloc(ml_backend *be, size_t bytes)
{
    if (bytes >= HUGE_PAGE_BYTES) {
        void *p = huge_alloc(bytes);
        if (p && !fault_in(ml_cpu_of(be), p, bytes)) {
            free(p);
            return NULL;
        }
        return p;
    }
    /* aligned_alloc wants a multiple of the alignment; 0 still gets a block. */
    size_t rounded = (bytes + ML_CPU_ALIGN - 1) / ML_CPU_ALIGN * ML_CPU_ALIGN;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(ML_CPU_ALIGN, rounded ? rounded : ML_CPU_ALIGN);
}

/* The packed weights: on huge pages, and faulted in by the packing that
 * writes them right away, on every thread, rather than here on one. */
void *ml_cpu_alloc_streamed(ml_backend *be, size_t bytes)
{
    return bytes >= HUGE_PAGE_BYTES ? huge_alloc(bytes) : ml_cpu_alloc(be, bytes);
}

void ml_cpu_free(ml_backend *be, void *p)
{
    free(p);
}

void ml_cpu_copy(ml_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

const void *ml_cpu_weight(ml_backend *be, const void *host, size_t bytes)
{
    return host;
}

/* Nothing to give back: weight lent the caller its own host bytes. */
void ml_cpu_weight_free(ml_backend *be, const void *w)
{
}

float *ml_cpu_act_buffer(ml_cpu_backend *cb, size_t floats, const char *op)
{
    if (floats <= cb->act_floats)
        return cb->act;
    const size_t bytes = (floats * sizeof(float) + ML_CPU_ALIGN - 1) / ML_CPU_ALIGN * ML_CPU_ALIGN;
    float *p = aligned_alloc(ML_CPU_ALIGN, bytes);
    if (!p) {
        ml_cpu_latch(cb, ML_ERR_NOMEM, op, "%zu bytes of converted activations", bytes);
        return NULL;
    }
    free(cb->act);
    cb->act = p;
    cb->act_floats = floats;
    return p;
}

void ml_cpu_latch(ml_cpu_backend *cb, ml_status st, const char *op, const char *fmt, ...)
{
    cb->n_latched++;
    if (cb->err_status != ML_OK)
        return;
    cb->err_status = st;
    int n = snprintf(cb->err, sizeof cb->err, "cpu %s: ", op);
    if (n < 0 || (size_t)n >= sizeof cb->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb->err + n, sizeof cb->err - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Every op has finished: report the latched error once, then serve on. */
ml_status ml_cpu_synchronize(ml_backend *be, char *err, size_t errlen)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    ml_status st = cb->err_status;
    if (st != ML_OK && err && errlen)
        snprintf(err, errlen, "%s", cb->err);
    cb->err_status = ML_OK;
    cb->err[0] = '\0';
    return st;
}
