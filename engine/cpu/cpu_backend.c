/* The CPU backend: the reference implementation of every op of backend.h,
 * multithreaded (a persistent pool) and vectorised (AVX-512, AVX2 or plain C
 * kernels chosen at create time).
 *
 * This file is the top of engine/cpu's layers (cpu_internal.h): it fills
 * the op table from the core's ops (memory.c and the compute files), the
 * graph entries (graph.h) and, for a member of a group, the collective
 * (group.h), and makes and destroys backends and groups.
 *
 * K/V caches hold f32 (kv_elem_size 4) by default: golden references are f32
 * and the cache feeds every later token, so it is kept exact. bf16 K/V
 * (ml_backend_cpu_bf16_kv_cache) halve the cache's memory and the bytes a
 * decode step's attention reads, at the measured accuracy cost of
 * tests/golden/README.md. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_internal.h"
#include "cpu/graph.h"
#include "cpu/group.h"

/* A guard against absurd requests (0 = one thread per online CPU). */
#define CPU_MAX_THREADS 1024

static void cpu_destroy(ml_backend *be)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (!cb)
        return;
    ml_cpu_pool_destroy(cb->pool);
    ml_cpu_group_release(cb->group);
    ml_cpu_graphs_destroy(cb->graphs);
    free(cb->scratch);
    free(cb->act);
    free(cb->packed);
    free(cb);
}

static const ml_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = ml_cpu_alloc,
    .free = ml_cpu_free,
    .upload = ml_cpu_copy,
    .download = ml_cpu_copy,
    .weight = ml_cpu_weight,
    .weight_free = ml_cpu_weight_free,
    .linear_weight = ml_cpu_linear_weight,
    .linear_weight_free = ml_cpu_linear_weight_free,
    .kv_elem_size = sizeof(float),
    .synchronize = ml_cpu_synchronize,
    .matmul = ml_cpu_matmul,
    .matmul_f8 = ml_cpu_matmul_f8,
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
    .kv_store_keys = ml_cpu_kv_store_keys,
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
    cb->kern = ml_cpu_kernels_for(isa);
    cb->f8_pairs = cb->kern->gemm_packed_f8_pairs && ml_cpu_has_avx512_vbmi();
    cb->graphs = ml_cpu_graphs_create();
    if (!cb->graphs) {
        ml_fail(err, errlen, ML_ERR_NOMEM, "cpu backend: out of memory");
        cpu_destroy(&cb->base);
        return NULL;
    }

    cb->scratch_floats = ml_cpu_matmul_scratch_floats();
    if (ml_cpu_attn_scratch_floats() > cb->scratch_floats)
        cb->scratch_floats = ml_cpu_attn_scratch_floats();
    cb->scratch = aligned_alloc(ML_CPU_ALIGN, (size_t)n_threads * cb->scratch_floats * sizeof(float));
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

ml_status ml_backend_cpu_bf16_activations(ml_backend *be, char *err, size_t errlen)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (!cb->kern->gemm_tile_bf16 || !ml_cpu_has_avx512_bf16())
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "bf16 activations need AVX-512 BF16 (VDPBF16PS); the backend runs %s "
                       "kernels%s",
                       ml_cpu_isa_name(cb->kern->isa),
                       cb->kern->gemm_tile_bf16 ? " on a CPU without AVX512_BF16" : "");
    if (cb->n_packed)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "bf16 activations: %zu Linears are already packed for f32", cb->n_packed);
    int amx;
    const ml_status st = ml_cpu_amx_select(&amx, err, errlen);
    if (st != ML_OK)
        return st;
    cb->bf16_x = 1;
    cb->amx = amx && cb->kern->gemm_tile_amx;
    snprintf(cb->name, sizeof cb->name, "cpu-%s-bf16%s", ml_cpu_isa_name(cb->kern->isa),
             cb->amx ? "-amx" : "");
    return ML_OK;
}

ml_status ml_backend_cpu_bf16_kv_cache(ml_backend *be, char *err, size_t errlen)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (cb->n_packed)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "bf16 K/V cache: a model is already loaded (%zu Linears bound) with "
                       "caches sized for f32",
                       cb->n_packed);
    cb->ops.kv_elem_size = sizeof(uint16_t);
    return ML_OK;
}

ml_status ml_backend_cpu_create_group(int world, int threads_each, ml_backend **out, char *err,
                                      size_t errlen)
{
    if (world < 1 || world > ML_CPU_GROUP_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "cpu group: world %d outside [1, %d]",
                       world, ML_CPU_GROUP_MAX);
    if (threads_each < 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "cpu group: %d threads each",
                       threads_each);
    for (int r = 0; r < world; r++)
        out[r] = NULL;
    /* The members' own ISA check, done once here so that it reports its
     * own status; what can still fail below is memory or threads. */
    ml_cpu_isa isa;
    ml_status st = ml_cpu_isa_select(&isa, err, errlen);
    if (st != ML_OK)
        return st;
    if (threads_each == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads_each = online / world < 1 ? 1 : (int)(online / world);
    }
    ml_cpu_group *g;
    st = ml_cpu_group_create(&g, world, err, errlen);
    if (st != ML_OK)
        return st;
    for (int r = 0; r < world; r++) {
        out[r] = ml_backend_cpu_create(threads_each, err, errlen);
        if (!out[r])
            break;
        ml_cpu_backend *cb = ml_cpu_of(out[r]);
        ml_cpu_group_join(g, cb, r);
        cb->ops.all_reduce_sum = ml_cpu_all_reduce_sum;
    }
    /* The members hold the group now; with none made this frees it. */
    ml_cpu_group_release(g);
    if (out[world - 1])
        return ML_OK;
    /* err holds ml_backend_cpu_create's reason. */
    for (int r = 0; r < world && out[r]; r++) {
        out[r]->ops->destroy(out[r]);
        out[r] = NULL;
    }
    return ML_ERR_NOMEM;
}
