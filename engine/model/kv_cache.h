/* The paged self-attention K/V cache (design.md §4): for every self-attention
 * layer one K and one V pool of n_blocks blocks of block_size token slots,
 * in backend memory, plus the free list of blocks. Sequences own blocks
 * through block tables kept by their owner (the runtime); a block holds the
 * same token range in every layer.
 *
 * @locality: the step loop thread. */
#ifndef ML_MODEL_KV_CACHE_H
#define ML_MODEL_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "status.h"

typedef struct ml_kv_cache ml_kv_cache;

/* Allocate the pools: 2 · n_layers · n_blocks · block_size · n_kv_heads ·
 * head_dim elements of be->ops->kv_elem_size bytes. `be` is borrowed and
 * must outlive the cache. Errors: ML_ERR_INVALID_ARG, ML_ERR_NOMEM. */
ml_status ml_kv_cache_create(ml_kv_cache **out, ml_backend *be, int n_layers, int n_blocks,
                             int block_size, int n_kv_heads, int head_dim, char *err,
                             size_t errlen);

/* NULL is a no-op. */
void ml_kv_cache_destroy(ml_kv_cache *kv);

/* Bytes of one block across all layers, K and V. */
size_t ml_kv_cache_block_bytes(int n_layers, int block_size, int n_kv_heads, int head_dim,
                               size_t elem_size);

int ml_kv_cache_block_size(const ml_kv_cache *kv);
int ml_kv_cache_n_blocks(const ml_kv_cache *kv);
int ml_kv_cache_n_free(const ml_kv_cache *kv);

/* Take a free block (its contents are stale until written); -1 when none. */
int32_t ml_kv_cache_alloc(ml_kv_cache *kv);

/* Return a block taken with ml_kv_cache_alloc. */
void ml_kv_cache_release(ml_kv_cache *kv, int32_t block);

/* The pools of self-attention layer `layer` (0 .. n_layers-1). Borrowed. */
void *ml_kv_cache_k(ml_kv_cache *kv, int layer);
void *ml_kv_cache_v(ml_kv_cache *kv, int layer);

#endif
