/* The paged self-attention K/V cache (engine/model/README.md §12): for every self-attention
 * layer one K and one V pool of n_blocks blocks of block_size token slots,
 * in backend memory, plus the free list of blocks. Sequences own blocks
 * through block tables kept by their owner (the runtime); a block holds the
 * same token range in every layer.
 *
 * Under tensor parallelism (engine/model/README.md §11) the cache has one set of pools per
 * rank, each in that rank's backend and holding that shard's K/V heads, and
 * one free list: a block id names the same slots on every rank, so one block
 * table serves every shard.
 *
 * Blocks are refcounted and may be content-addressed (the prefix cache,
 * engine/runtime/prefix.c): a full block whose K/V a sequence has written
 * can be published under a 32-byte digest of everything its K/V depend
 * on; another sequence then takes a reference to it by digest instead of
 * computing it again. A published block whose last reference is dropped
 * stays cached, idle, in least-recently-used order, and is evicted (its
 * digest forgotten) only when a block is allocated and none is free: one
 * pool, one budget, and idle cached blocks count as free everywhere
 * (ml_kv_cache_n_free). Blocks never published go back to the free list at
 * their last release, as before. The cache writes a block only when told
 * to copy one (ml_kv_cache_copy_block); that a shared block is never
 * written again is its users' contract (only full, computed blocks are
 * published, and a sequence writes only past them; the choices of one
 * request share a partly filled block until one copies it to write).
 *
 * @locality: the step loop thread; the pools of a cache with several ranks
 * may be read by each rank's thread while a step runs (the free list is not
 * touched then). */
#ifndef ML_MODEL_KV_CACHE_H
#define ML_MODEL_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "status.h"

/* Bytes of a block's content digest (SHA-256, see engine/runtime/prefix.c). */
#define ML_KV_BLOCK_HASH_BYTES 32

typedef struct ml_kv_cache ml_kv_cache;

/* Allocate the pools: 2 · n_layers · n_blocks · block_size · n_kv_heads ·
 * head_dim elements of be->ops->kv_elem_size bytes. `be` is borrowed and
 * must outlive the cache. A cache of one rank (ml_kv_cache_create_group
 * with world 1). Errors: ML_ERR_INVALID_ARG, ML_ERR_NOMEM. */
ml_status ml_kv_cache_create(ml_kv_cache **out, ml_backend *be, int n_layers, int n_blocks,
                             int block_size, int n_kv_heads, int head_dim, char *err,
                             size_t errlen);

/* A cache of `world` ranks: rank r's pools (n_kv_heads per token, the
 * shard's share) in bes[r] (borrowed, each outliving the cache), one block
 * allocator for all. On error nothing is left allocated: ML_ERR_INVALID_ARG
 * (geometry, world < 1), ML_ERR_NOMEM (err names the rank). */
ml_status ml_kv_cache_create_group(ml_kv_cache **out, ml_backend *const *bes, int world,
                                   int n_layers, int n_blocks, int block_size, int n_kv_heads,
                                   int head_dim, char *err, size_t errlen);

/* NULL is a no-op. */
void ml_kv_cache_destroy(ml_kv_cache *kv);

/* Bytes of one block across all layers, K and V (on one rank). */
size_t ml_kv_cache_block_bytes(int n_layers, int block_size, int n_kv_heads, int head_dim,
                               size_t elem_size);

int ml_kv_cache_block_size(const ml_kv_cache *kv);
int ml_kv_cache_n_blocks(const ml_kv_cache *kv);
/* Blocks ml_kv_cache_alloc can hand out now: the free ones and the idle
 * cached ones it would evict. */
int ml_kv_cache_n_free(const ml_kv_cache *kv);
/* Of those, idle cached blocks (published, no reference). */
int ml_kv_cache_n_idle(const ml_kv_cache *kv);
/* Published blocks, referenced or idle. */
int ml_kv_cache_n_published(const ml_kv_cache *kv);
/* Idle cached blocks evicted to satisfy an allocation, since create. */
uint64_t ml_kv_cache_evictions(const ml_kv_cache *kv);
/* A number no other cache of this process has had or will have: a model
 * that recorded a graph against a cache's pools knows it from a new cache
 * allocated at the same address. */
uint64_t ml_kv_cache_id(const ml_kv_cache *kv);
/* Ranks the cache has pools for (1 unless made by ml_kv_cache_create_group). */
int ml_kv_cache_world(const ml_kv_cache *kv);

/* Take a block with one reference (its contents are stale until written):
 * a free one, else the least recently used idle cached one, evicted; -1
 * when every block is referenced. */
int32_t ml_kv_cache_alloc(ml_kv_cache *kv);

/* One more reference to a block already referenced: another sequence
 * shares its K/V as they are (the choices of one request, runtime.h
 * ml_request.n). Released like the others. */
void ml_kv_cache_retain(ml_kv_cache *kv, int32_t block);

/* 1 when more than one reference holds the block: its K/V are shared, and
 * whoever would write into it copies it first (ml_kv_cache_copy_block). */
int ml_kv_cache_shared(const ml_kv_cache *kv, int32_t block);

/* Copy block src's K/V, every layer and rank, into block dst (both
 * referenced by the caller; dst not published): copy-on-write of a
 * partly filled block that several sequences share (the choices of one
 * request). Synchronizes each rank's backend (the copy goes through the
 * host), so call it between steps. Errors: ML_ERR_NOMEM (the host buffer),
 * a backend's error latched before or by the download. */
ml_status ml_kv_cache_copy_block(ml_kv_cache *kv, int32_t dst, int32_t src, char *err,
                                 size_t errlen);

/* Drop one reference to a block taken with ml_kv_cache_alloc,
 * ml_kv_cache_lookup or ml_kv_cache_retain. At the last, a published block becomes idle (the
 * most recently used), any other block free. */
void ml_kv_cache_release(ml_kv_cache *kv, int32_t block);

/* The published block of digest `hash` (ML_KV_BLOCK_HASH_BYTES, borrowed)
 * with one more reference, an idle one leaving the LRU list; -1 when no
 * block has that digest. */
int32_t ml_kv_cache_lookup(ml_kv_cache *kv, const uint8_t *hash);

/* Publish `block` (referenced, not yet published, its K/V written) under
 * `hash`. Returns 1, or 0 when another block already has that digest (two
 * sequences computed the same prefix at once): this one stays private and
 * is freed at its last release. */
int ml_kv_cache_publish(ml_kv_cache *kv, int32_t block, const uint8_t *hash);

/* Rank `rank`'s pools of self-attention layer `layer` (0 .. n_layers-1), in
 * that rank's backend. Borrowed. */
void *ml_kv_cache_k(ml_kv_cache *kv, int rank, int layer);
void *ml_kv_cache_v(ml_kv_cache *kv, int rank, int layer);

#endif
