/* The CPU backend: the reference implementation of every op of backend.h,
 * multithreaded (a persistent pool) and vectorised (AVX-512, AVX2 or plain C
 * kernels chosen at create time).
 *
 * Memory is host memory: alloc is 64-byte aligned and NOT zeroed (as device
 * allocations are not), weights stay where the caller mapped them, upload
 * and download are memcpy, and every op has finished when it returns.
 * K/V caches hold f32 (kv_elem_size 4): golden references are f32 and the
 * cache feeds every later token, so it is kept exact. bf16 K/V would halve
 * cache memory at a numerics cost; it would be an opt-in flag with a
 * measured accuracy delta, and is not implemented.
 *
 * Errors are latched and reported by synchronize, as on a device; the only
 * ones are misuses of the graph ops (graph.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_internal.h"

#define CPU_ALIGN 64
/* A guard against absurd requests (0 = one thread per online CPU). */
#define CPU_MAX_THREADS 1024

static void *cpu_alloc(ml_backend *be, size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment; 0 still gets a block. */
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(CPU_ALIGN, rounded ? rounded : CPU_ALIGN);
}

static void cpu_free(ml_backend *be, void *p)
{
    free(p);
}

static void cpu_copy(ml_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

static const void *cpu_weight(ml_backend *be, const void *host, size_t bytes)
{
    return host;
}

void ml_cpu_latch(ml_cpu_backend *cb, ml_status st, const char *op, const char *fmt, ...)
{
    if (cb->rec_slot >= 0)
        cb->rec_failed = 1;
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
static ml_status cpu_synchronize(ml_backend *be, char *err, size_t errlen)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    ml_status st = cb->err_status;
    if (st != ML_OK && err && errlen)
        snprintf(err, errlen, "%s", cb->err);
    cb->err_status = ML_OK;
    cb->err[0] = '\0';
    return st;
}

static void cpu_destroy(ml_backend *be)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (!cb)
        return;
    ml_cpu_pool_destroy(cb->pool);
    ml_cpu_group_release(cb->group);
    ml_cpu_graph_deinit(&cb->rec);
    for (int i = 0; i < ML_GRAPH_SLOTS; i++)
        ml_cpu_graph_deinit(&cb->graphs[i]);
    free(cb->scratch);
    free(cb);
}

static const ml_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight = cpu_weight,
    .kv_elem_size = sizeof(float),
    .synchronize = cpu_synchronize,
    .matmul = ml_cpu_matmul,
    .lora = ml_cpu_lora,
    .rmsnorm = ml_cpu_rmsnorm,
    .layernorm = ml_cpu_layernorm,
    .gelu = ml_cpu_gelu,
    .silu_mul = ml_cpu_silu_mul,
    .rope = ml_cpu_rope,
    .add_rows = ml_cpu_add_rows,
    .add_bf16 = ml_cpu_add_bf16,
    .zero = ml_cpu_zero,
    .copy_2d = ml_cpu_copy_2d,
    .embed = ml_cpu_embed,
    .patchify = ml_cpu_patchify,
    .attn_vision = ml_cpu_attn_vision,
    .attn_causal = ml_cpu_attn_causal,
    .attn_cross = ml_cpu_attn_cross,
    .kv_write = ml_cpu_kv_write,
    .kv_store = ml_cpu_kv_store,
    .sample = ml_cpu_sample,
    .sample_scratch_bytes = ml_cpu_sample_scratch_bytes,
    .graph_begin = ml_cpu_graph_begin,
    .graph_end = ml_cpu_graph_end,
    .graph_replay = ml_cpu_graph_replay,
    .n_graph_slots = ML_GRAPH_SLOTS,
};

ml_backend *ml_backend_cpu_create(int n_threads, char *err, size_t errlen)
{
    if (n_threads < 0 || n_threads > CPU_MAX_THREADS) {
        ml_fail(err, errlen, ML_ERR_INVALID_ARG, "cpu backend: %d threads (0..%d)", n_threads,
                CPU_MAX_THREADS);
        return NULL;
    }
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > CPU_MAX_THREADS ? CPU_MAX_THREADS : (int)online;
    }
    ml_cpu_isa isa;
    if (ml_cpu_isa_select(&isa, err, errlen) != ML_OK)
        return NULL;

    ml_cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        ml_fail(err, errlen, ML_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    cb->ops = cpu_ops;
    snprintf(cb->name, sizeof cb->name, "cpu-%s", ml_cpu_isa_name(isa));
    cb->ops.name = cb->name;
    cb->base.ops = &cb->ops;
    cb->rec_slot = -1;
    cb->kern = ml_cpu_kernels_for(isa);

    cb->scratch_floats = ml_cpu_matmul_scratch_floats();
    if (ml_cpu_attn_scratch_floats() > cb->scratch_floats)
        cb->scratch_floats = ml_cpu_attn_scratch_floats();
    cb->scratch = aligned_alloc(CPU_ALIGN, (size_t)n_threads * cb->scratch_floats * sizeof(float));
    if (!cb->scratch) {
        ml_fail(err, errlen, ML_ERR_NOMEM, "cpu backend: %d x %zu bytes of scratch", n_threads,
                cb->scratch_floats * sizeof(float));
        cpu_destroy(&cb->base);
        return NULL;
    }
    cb->pool = ml_cpu_pool_create(n_threads, err, errlen);
    if (!cb->pool) {
        cpu_destroy(&cb->base);
        return NULL;
    }
    return &cb->base;
}
