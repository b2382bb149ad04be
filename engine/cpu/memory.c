/* The entries of the op table that compute nothing: host memory (alloc,
 * free, upload, download, weight) and the latched error that synchronize
 * reports.
 *
 * Memory is host memory: alloc is 64-byte aligned and NOT zeroed (as device
 * allocations are not), weights stay where the caller mapped them, upload
 * and download are memcpy, and every op has finished when it returns.
 * Errors are latched and reported by synchronize, as on a device; the only
 * ones are misuses of the graph ops (graph.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu/cpu_internal.h"

void *ml_cpu_alloc(ml_backend *be, size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment; 0 still gets a block. */
    size_t rounded = (bytes + ML_CPU_ALIGN - 1) / ML_CPU_ALIGN * ML_CPU_ALIGN;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(ML_CPU_ALIGN, rounded ? rounded : ML_CPU_ALIGN);
}

/* Transparent huge pages (x86-64's 2 MiB): a decode step reads every weight
 * once, and with 4 KiB pages that is a TLB miss every 64 cache lines of
 * each strip. Aligned to the huge page and marked MADV_HUGEPAGE, the range
 * gets them where the kernel's policy is "always" and where it is "madvise"
 * (/sys/kernel/mm/transparent_hugepage/enabled; the development VM's is
 * madvise, and there unmarked memory gets none). Measured
 * (2026-12-03, the development VM, 2 threads, bf16 activations, the same
 * weights packed both ways and run alternately, medians of 9): 1 row
 * 0.68-0.99x the time, 16 rows 0.86-1.03x, 64 and 304 rows 0.94-1.08x. Where
 * the kernel lends none the advice is ignored and the buffer is an
 * ordinary one. */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *ml_cpu_alloc_streamed(ml_backend *be, size_t bytes)
{
    if (bytes < HUGE_PAGE_BYTES)
        return ml_cpu_alloc(be, bytes);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE_BYTES, bytes) != 0)
        return NULL;
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: its failure changes nothing */
    return p;
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
