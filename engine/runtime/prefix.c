/* The prefix cache (runtime.h): the keys of a sequence's full K/V blocks,
 * the lookup of its longest cached prefix at admission and the publication
 * of each block it completes. The blocks themselves, their references and
 * their LRU eviction are the K/V pool's (model/kv_cache.h): one budget.
 *
 * Keys. Block j of a sequence is named by a hash chain:
 *   key_j = SHA-256(BLOCK_TAG, key_{j-1}, its block_size token ids,
 *                   and for each <|image|> among them the image's key),
 * key_{-1} being the sequence's root:
 *   root  = SHA-256(ROOT_TAG, model fingerprint, cache salt, adapter name,
 *                   row-mask mode, tensor-parallel world, block size
 *                   [, in the transformers mode: every image key]).
 * An image's key is the one the resident image cache has for its state
 * (image_cache.h ml_image_state_key: content sha256, cache salt, and the
 * adapter when it changes image states). The salt is the request's cache
 * partition: requests of two salts never find each other's blocks, so a
 * cached-token count (usage, or a faster first token) tells a sender only
 * about prompts of its own partition. That covers everything a block's
 * K/V depend on: the weights (model, adapter), the split (the world
 * changes how partial sums are added), and every earlier token and image
 * with its position (a key names its whole prefix). The cross-attention
 * row of a prompt token depends only on the <|image|> positions up to it
 * (sequence.c image_ranges), except in the transformers mode, where a row
 * that sees no tile attends to every image of its sequence: the text
 * before the first image then depends on the images after it, so the root
 * holds them all (such requests share only with the same image list). In
 * the reference mode (the default) such a row leaves the layer unchanged,
 * as if the sequence had no image, so a chat's earlier turns are shared
 * when a later turn adds an image. Equal keys therefore mean K/V computed
 * from the same inputs at the same positions with the same weights: bit
 * for bit the same on a batch-invariant backend (the CPU:
 * engine/cpu/matmul.c), where neither the step's other rows nor the
 * chunking of a prompt change a row.
 *
 * Why SHA-256. A key is trusted without comparing tokens, and a request's
 * tokens are chosen by its sender: with a non-cryptographic hash (xxHash,
 * FNV) a sender could craft a prompt whose blocks collide with another
 * tenant's and be served that tenant's K/V. SHA-256's collision resistance
 * (2^128 work) rules out crafted collisions, and by chance the odds are
 * about n^2 / 2^257 for n blocks ever published. It is the project's
 * (engine/sha256.h) and the image keys' hash already, and costs a few
 * microseconds per 16-token block against milliseconds of prefill.
 *
 * @locality: the step loop thread. */
#include <assert.h>
#include <string.h>

#include "runtime/runtime_internal.h"
#include "sha256.h"

/* Domain separation: a root can never be mistaken for a block key. */
static const char ROOT_TAG[] = "mllama prefix root 1";
static const char BLOCK_TAG[] = "mllama prefix block 1";

/* Integers enter a key as 4 little-endian bytes, whatever the host. */
static void hash_i32(ml_sha256_ctx *h, int32_t v)
{
    uint32_t u = (uint32_t)v;
    uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    ml_sha256_update(h, b, sizeof b);
}

static void make_root(const ml_runtime *rt, rt_seq *s)
{
    ml_row_mask_mode mode = ml_model_limits_of(rt->model)->row_mask;
    ml_sha256_ctx h;
    ml_sha256_init(&h);
    ml_sha256_update(&h, ROOT_TAG, sizeof ROOT_TAG);
    ml_sha256_update(&h, rt->cfg.model_fingerprint, sizeof rt->cfg.model_fingerprint);
    ml_sha256_update(&h, s->salt, sizeof s->salt);
    /* The length first: no name is a prefix of another's encoding. */
    const char *adapter = s->adapter_name ? s->adapter_name : "";
    hash_i32(&h, (int32_t)strlen(adapter));
    ml_sha256_update(&h, adapter, strlen(adapter));
    hash_i32(&h, (int32_t)mode);
    hash_i32(&h, ml_kv_cache_world(rt->kv));
    hash_i32(&h, rt->block_size);
    if (mode == ML_ROW_MASK_TRANSFORMERS && s->n_images > 0) {
        hash_i32(&h, s->n_images);
        for (int i = 0; i < s->n_images; i++)
            ml_sha256_update(&h, s->images[i].key, ML_IMAGE_KEY_BYTES);
    }
    ml_sha256_final(&h, s->root);
    s->rooted = 1;
}

/* The keys of s's first n_blocks full blocks (n_blocks · block_size <=
 * n_tokens). */
static void chain_extend(const ml_runtime *rt, rt_seq *s, int n_blocks)
{
    const int32_t image_token = ml_model_config(rt->model)->image_token_index;
    const int B = rt->block_size;
    assert(s->rooted && n_blocks * B <= s->n_tokens);
    for (; s->n_chain < n_blocks; s->n_chain++) {
        const uint8_t *parent =
            s->n_chain ? s->chain + (size_t)(s->n_chain - 1) * ML_KV_BLOCK_HASH_BYTES : s->root;
        ml_sha256_ctx h;
        ml_sha256_init(&h);
        ml_sha256_update(&h, BLOCK_TAG, sizeof BLOCK_TAG);
        ml_sha256_update(&h, parent, ML_KV_BLOCK_HASH_BYTES);
        for (int t = s->n_chain * B; t < (s->n_chain + 1) * B; t++) {
            hash_i32(&h, s->tokens[t]);
            /* Only the prompt's <|image|> tokens are images (image_ranges). */
            if (s->tokens[t] == image_token && t < s->n_prompt && s->chain_images < s->n_images)
                ml_sha256_update(&h, s->images[s->chain_images++].key, ML_IMAGE_KEY_BYTES);
        }
        ml_sha256_final(&h, s->chain + (size_t)s->n_chain * ML_KV_BLOCK_HASH_BYTES);
    }
}

int ml_rt_prefix_match(ml_runtime *rt, rt_seq *s)
{
    assert(s->n_blocks == 0 && s->n_cached == 0 && s->n_published == 0);
    if (!rt->cfg.prefix_cache)
        return 0;
    if (!s->rooted)
        make_root(rt, s);
    int eligible = (s->n_tokens - 1) / rt->block_size;
    chain_extend(rt, s, eligible);
    while (s->n_blocks < eligible) {
        int32_t b = ml_kv_cache_lookup(
            rt->kv, s->chain + (size_t)s->n_blocks * ML_KV_BLOCK_HASH_BYTES);
        if (b < 0)
            break;
        s->blocks[s->n_blocks++] = b;
    }
    s->n_published = s->n_blocks;
    s->n_cached = s->n_blocks * rt->block_size;
    return s->n_cached;
}

void ml_rt_prefix_publish(ml_runtime *rt, rt_seq *s)
{
    int full = s->n_cached / rt->block_size;
    if (!rt->cfg.prefix_cache || full <= s->n_published)
        return;
    chain_extend(rt, s, full);
    for (; s->n_published < full; s->n_published++)
        ml_kv_cache_publish(rt->kv, s->blocks[s->n_published],
                            s->chain + (size_t)s->n_published * ML_KV_BLOCK_HASH_BYTES);
}
