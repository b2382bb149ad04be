#include "model/kv_cache.h"

#include <assert.h>
#include <stdlib.h>

struct ml_kv_cache {
    ml_backend *be;            /* borrowed */
    int n_layers, n_blocks, block_size;
    size_t pool_bytes;         /* one layer's K (or V) pool */
    void **k, **v;             /* owned (n_layers) backend buffers */
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
    *out = NULL;
    if (n_layers < 0 || n_blocks <= 0 || block_size <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "kv cache: invalid geometry (%d layers, %d blocks of %d)", n_layers,
                       n_blocks, block_size);
    ml_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "kv cache: out of memory");
    kv->be = be;
    kv->n_layers = n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->pool_bytes = (size_t)n_blocks * (size_t)block_size * (size_t)n_kv_heads *
                     (size_t)head_dim * be->ops->kv_elem_size;
    kv->k = calloc((size_t)n_layers + 1, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers + 1, sizeof *kv->v);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    if (!kv->k || !kv->v || !kv->free_list)
        goto nomem;
    for (int l = 0; l < n_layers; l++) {
        kv->k[l] = be->ops->alloc(be, kv->pool_bytes);
        kv->v[l] = be->ops->alloc(be, kv->pool_bytes);
        if (!kv->k[l] || !kv->v[l])
            goto nomem;
    }
    /* Pushed in reverse so blocks are handed out in ascending order. */
    for (int b = 0; b < n_blocks; b++)
        kv->free_list[b] = n_blocks - 1 - b;
    kv->n_free = n_blocks;
    *out = kv;
    return ML_OK;
nomem:
    ml_kv_cache_destroy(kv);
    return ml_fail(err, errlen, ML_ERR_NOMEM, "kv cache: cannot allocate %d layers x 2 x %zu bytes",
                   n_layers, kv->pool_bytes);
}

void ml_kv_cache_destroy(ml_kv_cache *kv)
{
    if (!kv)
        return;
    for (int l = 0; kv->k && kv->v && l < kv->n_layers; l++) {
        if (kv->k[l])
            kv->be->ops->free(kv->be, kv->k[l]);
        if (kv->v[l])
            kv->be->ops->free(kv->be, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_list);
    free(kv);
}

int ml_kv_cache_block_size(const ml_kv_cache *kv) { return kv->block_size; }
int ml_kv_cache_n_blocks(const ml_kv_cache *kv) { return kv->n_blocks; }
int ml_kv_cache_n_free(const ml_kv_cache *kv) { return kv->n_free; }

int32_t ml_kv_cache_alloc(ml_kv_cache *kv)
{
    return kv->n_free ? kv->free_list[--kv->n_free] : -1;
}

void ml_kv_cache_release(ml_kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->n_blocks && kv->n_free < kv->n_blocks);
    kv->free_list[kv->n_free++] = block;
}

void *ml_kv_cache_k(ml_kv_cache *kv, int layer)
{
    assert(layer >= 0 && layer < kv->n_layers);
    return kv->k[layer];
}

void *ml_kv_cache_v(ml_kv_cache *kv, int layer)
{
    assert(layer >= 0 && layer < kv->n_layers);
    return kv->v[layer];
}
