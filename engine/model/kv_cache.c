#include "model/kv_cache.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A block's bookkeeping. Idle cached blocks form a doubly linked list by
 * index (lru_prev toward the most recently used end); published blocks a
 * chained hash table by digest. */
typedef struct kv_block {
    uint8_t hash[ML_KV_BLOCK_HASH_BYTES]; /* valid when published */
    int32_t refs;
    int32_t bucket_next;       /* next published block of its bucket, -1 */
    int32_t lru_prev, lru_next; /* idle neighbours, -1 */
    uint8_t published;
} kv_block;

struct ml_kv_cache {
    uint64_t id;               /* unique in the process (ml_kv_cache_id) */
    int world, n_layers, n_blocks, block_size;
    size_t block_elems;        /* elements of one block of one pool: block_size · heads · dim */
    ml_backend **bes;          /* owned array (world) of borrowed backends */
    void **k, **v;             /* owned (world · n_layers) backend buffers, rank-major */
    int32_t *free_list;        /* owned (n_blocks): a stack of free block ids */
    int n_free;
    kv_block *meta;            /* owned (n_blocks) */
    int32_t *buckets;          /* owned (bucket_mask + 1): first published block, -1 */
    uint32_t bucket_mask;
    int32_t lru_head, lru_tail; /* idle blocks: most and least recently used, -1 */
    int n_idle, n_published;
    uint64_t evictions;
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
    kv->block_elems = (size_t)block_size * (size_t)n_kv_heads * (size_t)head_dim;
    /* +1: a model may have no self-attention layer, and calloc(0) may be NULL. */
    size_t n_pools = (size_t)world * (size_t)n_layers + 1;
    kv->bes = calloc((size_t)world, sizeof *kv->bes);
    kv->k = calloc(n_pools, sizeof *kv->k);
    kv->v = calloc(n_pools, sizeof *kv->v);
    kv->free_list = malloc((size_t)n_blocks * sizeof *kv->free_list);
    /* At least as many buckets as blocks, a power of two: chains stay short
     * and a digest's low bits (uniform: SHA-256) pick the bucket. */
    size_t n_buckets = 1;
    while (n_buckets < (size_t)n_blocks)
        n_buckets *= 2;
    kv->bucket_mask = (uint32_t)(n_buckets - 1);
    kv->meta = calloc((size_t)n_blocks, sizeof *kv->meta);
    kv->buckets = malloc(n_buckets * sizeof *kv->buckets);
    if (!kv->bes || !kv->k || !kv->v || !kv->free_list || !kv->meta || !kv->buckets) {
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
    for (size_t i = 0; i < n_buckets; i++)
        kv->buckets[i] = -1;
    for (int b = 0; b < n_blocks; b++)
        kv->meta[b].bucket_next = kv->meta[b].lru_prev = kv->meta[b].lru_next = -1;
    kv->lru_head = kv->lru_tail = -1;
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
    free(kv->meta);
    free(kv->buckets);
    free(kv);
}

int ml_kv_cache_block_size(const ml_kv_cache *kv) { return kv->block_size; }
int ml_kv_cache_n_blocks(const ml_kv_cache *kv) { return kv->n_blocks; }
int ml_kv_cache_n_free(const ml_kv_cache *kv) { return kv->n_free + kv->n_idle; }
int ml_kv_cache_n_idle(const ml_kv_cache *kv) { return kv->n_idle; }
int ml_kv_cache_n_published(const ml_kv_cache *kv) { return kv->n_published; }
uint64_t ml_kv_cache_evictions(const ml_kv_cache *kv) { return kv->evictions; }
int ml_kv_cache_world(const ml_kv_cache *kv) { return kv->world; }

/* ---- idle list and digest index -------------------------------------------- */

static void idle_unlink(ml_kv_cache *kv, int32_t b)
{
    kv_block *m = &kv->meta[b];
    if (m->lru_prev >= 0)
        kv->meta[m->lru_prev].lru_next = m->lru_next;
    else
        kv->lru_head = m->lru_next;
    if (m->lru_next >= 0)
        kv->meta[m->lru_next].lru_prev = m->lru_prev;
    else
        kv->lru_tail = m->lru_prev;
    m->lru_prev = m->lru_next = -1;
    kv->n_idle--;
}

static void idle_push_front(ml_kv_cache *kv, int32_t b)
{
    kv_block *m = &kv->meta[b];
    m->lru_prev = -1;
    m->lru_next = kv->lru_head;
    if (kv->lru_head >= 0)
        kv->meta[kv->lru_head].lru_prev = b;
    else
        kv->lru_tail = b;
    kv->lru_head = b;
    kv->n_idle++;
}

static uint32_t bucket_of(const ml_kv_cache *kv, const uint8_t *hash)
{
    uint32_t h;
    memcpy(&h, hash, sizeof h);
    return h & kv->bucket_mask;
}

static int32_t find(const ml_kv_cache *kv, const uint8_t *hash)
{
    for (int32_t b = kv->buckets[bucket_of(kv, hash)]; b >= 0; b = kv->meta[b].bucket_next)
        if (!memcmp(kv->meta[b].hash, hash, ML_KV_BLOCK_HASH_BYTES))
            return b;
    return -1;
}

/* Forget b's digest (it is about to be reused). */
static void unpublish(ml_kv_cache *kv, int32_t b)
{
    int32_t *p = &kv->buckets[bucket_of(kv, kv->meta[b].hash)];
    while (*p != b)
        p = &kv->meta[*p].bucket_next;
    *p = kv->meta[b].bucket_next;
    kv->meta[b].bucket_next = -1;
    kv->meta[b].published = 0;
    kv->n_published--;
}

/* ---- references ------------------------------------------------------------ */

int32_t ml_kv_cache_alloc(ml_kv_cache *kv)
{
    int32_t b;
    if (kv->n_free) {
        b = kv->free_list[--kv->n_free];
    } else if (kv->lru_tail >= 0) {
        b = kv->lru_tail;
        idle_unlink(kv, b);
        unpublish(kv, b);
        kv->evictions++;
    } else {
        return -1;
    }
    assert(kv->meta[b].refs == 0 && !kv->meta[b].published);
    kv->meta[b].refs = 1;
    return b;
}

void ml_kv_cache_retain(ml_kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->n_blocks && kv->meta[block].refs > 0);
    kv->meta[block].refs++;
}

int ml_kv_cache_shared(const ml_kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->n_blocks);
    return kv->meta[block].refs > 1;
}

/* Pool p of rank r: layer p / 2's K (p even) or V. */
static char *pool_of(ml_kv_cache *kv, int r, size_t p)
{
    int layer = (int)(p / 2);
    return p % 2 ? ml_kv_cache_v(kv, r, layer) : ml_kv_cache_k(kv, r, layer);
}

ml_status ml_kv_cache_copy_block(ml_kv_cache *kv, int32_t dst, int32_t src, char *err,
                                 size_t errlen)
{
    assert(dst >= 0 && dst < kv->n_blocks && src >= 0 && src < kv->n_blocks);
    /* Through the host: no op copies backend memory to backend memory, and
     * this happens once per choice forked, not per token. A download may
     * land only at synchronize (CUDA stages them), so every pool's slots
     * come down, then the wait, then they go up. */
    size_t bytes = kv->block_elems * kv->bes[0]->ops->kv_elem_size;
    size_t n_pools = 2 * (size_t)kv->n_layers;
    char *host = malloc(n_pools * bytes + 1);
    if (!host)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "kv cache: out of memory copying a block");
    ml_status st = ML_OK;
    for (int r = 0; r < kv->world && st == ML_OK; r++) {
        ml_backend *be = kv->bes[r];
        assert(be->ops->kv_elem_size * kv->block_elems == bytes);
        for (size_t p = 0; p < n_pools; p++) {
            char *pool = pool_of(kv, r, p);
            be->ops->download(be, host + p * bytes, pool + (size_t)src * bytes, bytes);
        }
        st = be->ops->synchronize(be, err, errlen);
        for (size_t p = 0; st == ML_OK && p < n_pools; p++) {
            char *pool = pool_of(kv, r, p);
            be->ops->upload(be, pool + (size_t)dst * bytes, host + p * bytes, bytes);
        }
    }
    free(host);
    return st;
}

void ml_kv_cache_release(ml_kv_cache *kv, int32_t block)
{
    assert(block >= 0 && block < kv->n_blocks && kv->meta[block].refs > 0);
    kv_block *m = &kv->meta[block];
    if (--m->refs > 0)
        return;
    if (m->published) {
        idle_push_front(kv, block);
    } else {
        assert(kv->n_free < kv->n_blocks);
        kv->free_list[kv->n_free++] = block;
    }
}

int32_t ml_kv_cache_lookup(ml_kv_cache *kv, const uint8_t *hash)
{
    int32_t b = find(kv, hash);
    if (b < 0)
        return -1;
    if (kv->meta[b].refs++ == 0)
        idle_unlink(kv, b);
    return b;
}

int ml_kv_cache_publish(ml_kv_cache *kv, int32_t block, const uint8_t *hash)
{
    assert(block >= 0 && block < kv->n_blocks);
    kv_block *m = &kv->meta[block];
    assert(m->refs > 0 && !m->published);
    if (find(kv, hash) >= 0)
        return 0;
    memcpy(m->hash, hash, ML_KV_BLOCK_HASH_BYTES);
    m->published = 1;
    uint32_t i = bucket_of(kv, hash);
    m->bucket_next = kv->buckets[i];
    kv->buckets[i] = block;
    kv->n_published++;
    return 1;
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
