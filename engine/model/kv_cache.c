#include "model/kv_cache.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>

struct ml_kv_cache {
    uint64_t id;               /* unique in the process (ml_kv_cache_id) */
    int world, n_layers, n_blocks, block_size;
    ml_backend **bes;          /* owned array (world) of borrowed backends */
    void **k, **v;             /* owned (world · n_layers) backend buffers, rank-major */
    int32_t *free_list;        /* owned (n_blocks): a stack of free block ids */
    int n_free;
};

size_t ml_kv_cache_block_bytes(int n_layers, int block_size, int n_kv_heads, int head_dim,
                               size_t elem_size)
{
    return 2 * (size_t)n_layers * (size_t)block_size * (size_t)n_kv_heads * (size_t)head_dim *
           elem_size;
}

ml_status ml_kv_cache_create(ml_kv_cache **out, ml_backend *be, int n_layers, int n_blocks,
                             int block_size, int n_kv_heads, int head_dim, char *err,
                             size_t errlen)
{
    return ml_kv_cache_create_group(out, &be, 1, n_layers, n_blocks, block_size, n_kv_heads,
                                    head_dim, err, errlen);
}

ml_status ml_kv_cache_create_group(ml_kv_cache **out, ml_backend *const *bes, int world,
                                   int n_layers, int n_blocks, int block_size, int n_kv_heads,
                                   int head_dim, char *err, size_t errlen)
{
    *out = NULL;
    if (world < 1 || n_layers < 0 || n_blocks <= 0 || block_size <= 0 || n_kv_heads <= 0 ||
        head_dim <= 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "kv cache: invalid geometry (%d ranks, %d layers, %d blocks of %d)", world,
                       n_layers, n_blocks, block_size);
    static atomic_uint_fast64_t next_id = 1;
    ml_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "kv cache: out of memory");
    kv->id = atomic_fetch_add(&next_id, 1);
    kv->world = world;
    kv->n_layers = n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    /* +1: a model may have no self-attention layer, and calloc(0) may be NULL. */
    size_t n_pools = (size_t)world * (size_t)n_layers + 1;
    kv->bes = calloc((size_t)world, sizeof *kv->bes);
    kv->k = calloc(n_pools, sizeof *kv->k);
    kv->v = calloc(n_pools, sizeof *kv->v);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    if (!kv->bes || !kv->k || !kv->v || !kv->free_list) {
        ml_kv_cache_destroy(kv);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "kv cache: out of memory");
    }
    for (int r = 0; r < world; r++) {
        ml_backend *be = kv->bes[r] = bes[r];
        size_t pool_bytes = (size_t)n_blocks * (size_t)block_size * (size_t)n_kv_heads *
                            (size_t)head_dim * be->ops->kv_elem_size;
        for (int l = 0; l < n_layers; l++) {
            size_t i = (size_t)r * n_layers + l;
            kv->k[i] = be->ops->alloc(be, pool_bytes);
            kv->v[i] = be->ops->alloc(be, pool_bytes);
            if (!kv->k[i] || !kv->v[i]) {
                ml_kv_cache_destroy(kv);
                return ml_fail(err, errlen, ML_ERR_NOMEM,
                               "kv cache: cannot allocate %d layers x 2 x %zu bytes on rank %d "
                               "of %d",
                               n_layers, pool_bytes, r, world);
            }
        }
    }
    /* Pushed in reverse so blocks are handed out in ascending order. */
    for (int b = 0; b < n_blocks; b++)
        kv->free_list[b] = n_blocks - 1 - b;
    kv->n_free = n_blocks;
    *out = kv;
    return ML_OK;
}

void ml_kv_cache_destroy(ml_kv_cache *kv)
{
    if (!kv)
        return;
    /* Pools are allocated rank by rank, so a rank with pools has its backend set. */
    for (size_t i = 0; kv->bes && kv->k && kv->v && i < (size_t)kv->world * kv->n_layers; i++) {
        ml_backend *be = kv->bes[i / (size_t)kv->n_layers];
        if (kv->k[i])
            be->ops->free(be, kv->k[i]);
        if (kv->v[i])
            be->ops->free(be, kv->v[i]);
    }
    free(kv->bes);
    free(kv->k);
    free(kv->v);
    free(kv->free_list);
    free(kv);
}

int ml_kv_cache_block_size(const ml_kv_cache *kv) { return kv->block_size; }
int ml_kv_cache_n_blocks(const ml_kv_cache *kv) { return kv->n_blocks; }
int ml_kv_cache_n_free(const ml_kv_cache *kv) { return kv->n_free; }
int ml_kv_cache_world(const ml_kv_cache *kv) { return kv->world; }

int32_t ml_kv_cache_alloc(ml_kv_cache *kv)
{
    return kv->n_free ? kv->free_list[--kv->n_free] : -1;
}

void ml_kv_cache_release(ml_kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->n_blocks && kv->n_free < kv->n_blocks);
    kv->free_list[kv->n_free++] = block;
}

void *ml_kv_cache_k(ml_kv_cache *kv, int rank, int layer)
{
    assert(rank >= 0 && rank < kv->world && layer >= 0 && layer < kv->n_layers);
    return kv->k[(size_t)rank * kv->n_layers + layer];
}

void *ml_kv_cache_v(ml_kv_cache *kv, int rank, int layer)
{
    assert(rank >= 0 && rank < kv->world && layer >= 0 && layer < kv->n_layers);
    return kv->v[(size_t)rank * kv->n_layers + layer];
}

uint64_t ml_kv_cache_id(const ml_kv_cache *kv) { return kv->id; }
