/* The K/V pool's block accounting (engine/model/kv_cache.c) on a CPU
 * backend: references, publication by digest, idle blocks in LRU order and
 * their eviction.
 * - Blocks come out in ascending order; a block never published goes back
 *   to the free list at its last release.
 * - A published block outlives its last reference as an idle block, counted
 *   free; a lookup takes it back (no longer idle), a second lookup adds a
 *   reference, an unknown digest finds nothing.
 * - A second block published under a taken digest stays private.
 * - With no free block, allocation evicts the least recently used idle
 *   block, forgetting its digest; with every block referenced it fails.
 * - A retained block is shared until a reference goes; a block copy copies
 *   its K and V slots of every layer, with f32 and with bf16 elements. */
#include <string.h>

#include "harness.h"
#include "cpu/cpu_backend.h"
#include "model/kv_cache.h"

#define N_BLOCKS 4

static void digest(uint8_t *d, int v)
{
    memset(d, 0, ML_KV_BLOCK_HASH_BYTES);
    d[0] = (uint8_t)v;
    d[ML_KV_BLOCK_HASH_BYTES - 1] = (uint8_t)(v * 7 + 1);
}

/* A retained block is shared until one reference goes; copying a block
 * copies its K and V slots of every layer, and nothing else. */
static void test_share_and_copy(ml_backend *be)
{
    enum { LAYERS = 2, SLOTS = 4, HEADS = 1, DIM = 4 };
    char err[256] = "";
    ml_kv_cache *kv = NULL;
    check(ml_kv_cache_create(&kv, be, LAYERS, N_BLOCKS, SLOTS, HEADS, DIM, err, sizeof err) ==
              ML_OK,
          "create: %s", err);
    if (!kv)
        return;
    size_t block_bytes = (size_t)SLOTS * HEADS * DIM * be->ops->kv_elem_size;
    int32_t a = ml_kv_cache_alloc(kv), c = ml_kv_cache_alloc(kv), z = ml_kv_cache_alloc(kv);
    check(!ml_kv_cache_shared(kv, a), "one reference: not shared");
    ml_kv_cache_retain(kv, a);
    check(ml_kv_cache_shared(kv, a), "retained: shared");
    ml_kv_cache_release(kv, a);
    check(!ml_kv_cache_shared(kv, a) && ml_kv_cache_n_free(kv) == N_BLOCKS - 3,
          "released once: one reference left, still held");
    /* Every pool byte numbered, so a copy from the wrong place shows. */
    unsigned char pool[N_BLOCKS * SLOTS * HEADS * DIM * 4], got[sizeof pool];
    check(block_bytes * N_BLOCKS <= sizeof pool, "pool fits the test's buffer");
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            for (size_t i = 0; i < sizeof pool; i++)
                pool[i] = (unsigned char)(i * 3 + (size_t)l * 11 + (size_t)p * 101);
            void *dst = p ? ml_kv_cache_v(kv, 0, l) : ml_kv_cache_k(kv, 0, l);
            be->ops->upload(be, dst, pool, block_bytes * N_BLOCKS);
        }
    check(ml_kv_cache_copy_block(kv, c, a, err, sizeof err) == ML_OK, "copy: %s", err);
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            const void *src = p ? ml_kv_cache_v(kv, 0, l) : ml_kv_cache_k(kv, 0, l);
            be->ops->download(be, got, src, block_bytes * N_BLOCKS);
            check(!memcmp(got + (size_t)c * block_bytes, got + (size_t)a * block_bytes,
                          block_bytes) &&
                      got[(size_t)z * block_bytes] !=
                          got[(size_t)c * block_bytes], /* its neighbour untouched */
                  "layer %d %s: block %d is block %d's copy", l, p ? "V" : "K", c, a);
        }
    ml_kv_cache_destroy(kv);
}

int main(void)
{
    char err[256] = "";
    ml_backend *be = ml_backend_cpu_create(1, err, sizeof err);
    ml_kv_cache *kv = NULL;
    check(be && ml_kv_cache_create(&kv, be, 1, N_BLOCKS, 16, 1, 8, err, sizeof err) == ML_OK,
          "create: %s", err);
    if (!kv)
        return check_done();
    uint8_t d[3][ML_KV_BLOCK_HASH_BYTES];
    for (int i = 0; i < 3; i++)
        digest(d[i], i + 1);

    int32_t b[N_BLOCKS];
    for (int i = 0; i < N_BLOCKS; i++)
        b[i] = ml_kv_cache_alloc(kv);
    check(b[0] == 0 && b[3] == 3 && ml_kv_cache_n_free(kv) == 0, "ascending, then none free");
    check(ml_kv_cache_alloc(kv) == -1, "every block referenced: no block");
    ml_kv_cache_release(kv, b[3]);
    check(ml_kv_cache_n_free(kv) == 1 && ml_kv_cache_n_idle(kv) == 0,
          "an unpublished block is free again");

    check(ml_kv_cache_publish(kv, b[0], d[0]) == 1 && ml_kv_cache_publish(kv, b[1], d[1]) == 1,
          "publish two");
    check(ml_kv_cache_publish(kv, b[2], d[0]) == 0, "a taken digest: the block stays private");
    check(ml_kv_cache_n_published(kv) == 2, "two published");
    check(ml_kv_cache_lookup(kv, d[2]) == -1, "an unknown digest finds nothing");
    check(ml_kv_cache_lookup(kv, d[0]) == b[0], "a held block is found");
    ml_kv_cache_release(kv, b[0]); /* the lookup's reference */
    ml_kv_cache_release(kv, b[1]);
    ml_kv_cache_release(kv, b[0]);
    ml_kv_cache_release(kv, b[2]);
    check(ml_kv_cache_n_idle(kv) == 2 && ml_kv_cache_n_free(kv) == N_BLOCKS,
          "released: two idle, all counted free (%d idle, %d free)", ml_kv_cache_n_idle(kv),
          ml_kv_cache_n_free(kv));

    check(ml_kv_cache_lookup(kv, d[1]) == b[1] && ml_kv_cache_n_idle(kv) == 1,
          "an idle block taken back leaves the idle list");
    check(ml_kv_cache_lookup(kv, d[1]) == b[1], "looked up twice");
    ml_kv_cache_release(kv, b[1]);
    check(ml_kv_cache_n_idle(kv) == 1, "one reference left: not idle");
    ml_kv_cache_release(kv, b[1]);
    /* Idle now: b[0] (least recently used), then b[1]. Two free blocks go
     * first, then the evictions, oldest first. */
    int32_t x = ml_kv_cache_alloc(kv), y = ml_kv_cache_alloc(kv);
    check(x != b[0] && x != b[1] && y != b[0] && y != b[1] && ml_kv_cache_evictions(kv) == 0,
          "free blocks before idle ones");
    check(ml_kv_cache_alloc(kv) == b[0] && ml_kv_cache_evictions(kv) == 1 &&
              ml_kv_cache_lookup(kv, d[0]) == -1 && ml_kv_cache_n_published(kv) == 1,
          "then the least recently used idle block, its digest forgotten");
    check(ml_kv_cache_lookup(kv, d[1]) == b[1] && ml_kv_cache_n_free(kv) == 0,
          "the other is still cached");
    check(ml_kv_cache_publish(kv, b[0], d[0]) == 1, "a reused block publishes anew");
    ml_kv_cache_destroy(kv);
    test_share_and_copy(be);
    be->ops->destroy(be);
    /* The same over a bf16 cache (2-byte elements): blocks of half the bytes. */
    be = ml_backend_cpu_create(1, err, sizeof err);
    check(be && ml_backend_cpu_bf16_kv_cache(be, err, sizeof err) == ML_OK &&
              be->ops->kv_elem_size == 2,
          "bf16 K/V cache: %s", err);
    if (be) {
        test_share_and_copy(be);
        be->ops->destroy(be);
    }
    return check_done();
}
