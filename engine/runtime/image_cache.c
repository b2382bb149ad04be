/* The resident image-state cache: one list in LRU order (head = most
 * recently used). Lookups scan it: a budget holds at most a few
 * hundred states (11B: 200 MiB each), and a lookup happens once per image
 * of a request, never per token. */
#include "runtime/image_cache.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "sha256.h"

struct ml_image_entry {
    uint8_t key[ML_IMAGE_KEY_BYTES];
    void *state;      /* owned: ml_model_image_state_alloc's handle */
    int n_tiles;
    int refs;
    int published;
    ml_list_node lru;  /* in ml_image_cache.lru */
};

struct ml_image_cache {
    ml_model *model;  /* borrowed */
    size_t budget, entry_bytes, used;
    ml_list lru;      /* every entry, published or reserved; .n is the count */
    ml_image_event_fn on_event;
    void *event_ctx;
};

/* Domain separation (ml_image_state_key): a base state's key and an
 * adapter's are made from different tags, never equal by construction. */
static const char BASE_TAG[] = "mllama image state 2";
static const char ADAPTER_TAG[] = "mllama image state under adapter 2";

void ml_image_state_key(const uint8_t *salt, const uint8_t *content, const char *adapter,
                        uint8_t *out)
{
    ml_sha256_ctx h;
    ml_sha256_init(&h);
    if (adapter)
        ml_sha256_update(&h, ADAPTER_TAG, sizeof ADAPTER_TAG);
    else
        ml_sha256_update(&h, BASE_TAG, sizeof BASE_TAG);
    ml_sha256_update(&h, salt, ML_CACHE_SALT_BYTES);
    ml_sha256_update(&h, content, ML_IMAGE_KEY_BYTES);
    if (adapter) {
        /* The length first: no name is a prefix of another's encoding. */
        size_t n = strlen(adapter);
        uint8_t len[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
        ml_sha256_update(&h, len, sizeof len);
        ml_sha256_update(&h, adapter, n);
    }
    ml_sha256_final(&h, out);
}

ml_status ml_image_cache_create(ml_image_cache **out, ml_model *model, size_t budget_bytes,
                                ml_image_event_fn on_event, void *event_ctx, char *err,
                                size_t errlen)
{
    *out = NULL;
    size_t entry_bytes = ml_model_image_state_bytes(model);
    if (entry_bytes == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "image cache: zero-sized entries");
    ml_image_cache *c = calloc(1, sizeof *c);
    if (!c)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "image cache: out of memory");
    c->model = model;
    c->budget = budget_bytes;
    c->entry_bytes = entry_bytes;
    c->on_event = on_event;
    c->event_ctx = event_ctx;
    *out = c;
    return ML_OK;
}

static ml_image_entry *entry_of(ml_list_node *n)
{
    return ml_list_entry(n, ml_image_entry, lru);
}

static void free_entry(ml_image_cache *c, ml_image_entry *e)
{
    ml_list_remove(&c->lru, &e->lru);
    c->used -= c->entry_bytes;
    if (e->published && c->on_event)
        c->on_event(c->event_ctx, ML_IMAGE_EVICTED, e->key, c->entry_bytes, e->n_tiles);
    ml_model_image_state_free(c->model, e->state);
    free(e);
}

void ml_image_cache_destroy(ml_image_cache *c)
{
    if (!c)
        return;
    while (c->lru.head) {
        ml_image_entry *e = entry_of(c->lru.head);
        assert(e->refs == 0);
        free_entry(c, e);
    }
    free(c);
}

static ml_image_entry *find(const ml_image_cache *c, const uint8_t *key)
{
    for (ml_image_entry *e = entry_of(c->lru.head); e; e = entry_of(e->lru.next))
        if (e->published && !memcmp(e->key, key, ML_IMAGE_KEY_BYTES))
            return e;
    return NULL;
}

ml_image_entry *ml_image_cache_acquire(ml_image_cache *c, const uint8_t *key)
{
    ml_image_entry *e = find(c, key);
    if (!e)
        return NULL;
    e->refs++;
    ml_list_remove(&c->lru, &e->lru);
    ml_list_push_front(&c->lru, &e->lru);
    return e;
}

int ml_image_cache_contains(const ml_image_cache *c, const uint8_t *key)
{
    return find(c, key) != NULL;
}

ml_image_entry *ml_image_cache_reserve(ml_image_cache *c, const uint8_t *key, int n_tiles)
{
    /* Evict idle entries from the LRU end until the new state fits. */
    ml_image_entry *e = entry_of(c->lru.tail);
    while (c->used + c->entry_bytes > c->budget && e) {
        ml_image_entry *prev = entry_of(e->lru.prev);
        if (e->refs == 0)
            free_entry(c, e);
        e = prev;
    }
    if (c->used + c->entry_bytes > c->budget)
        return NULL;
    ml_image_entry *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->state = ml_model_image_state_alloc(c->model);
    if (!n->state) {
        free(n);
        return NULL;
    }
    memcpy(n->key, key, ML_IMAGE_KEY_BYTES);
    n->n_tiles = n_tiles;
    n->refs = 1;
    ml_list_push_front(&c->lru, &n->lru);
    c->used += c->entry_bytes;
    return n;
}

void ml_image_cache_publish(ml_image_cache *c, ml_image_entry *e)
{
    assert(!e->published);
    e->published = 1;
    if (c->on_event)
        c->on_event(c->event_ctx, ML_IMAGE_INSERTED, e->key, c->entry_bytes, e->n_tiles);
}

void ml_image_cache_release(ml_image_cache *c, ml_image_entry *e)
{
    assert(e->refs > 0);
    if (--e->refs == 0 && !e->published)
        free_entry(c, e);
}

void *ml_image_entry_state(const ml_image_entry *e) { return e->state; }
int ml_image_entry_n_tiles(const ml_image_entry *e) { return e->n_tiles; }
size_t ml_image_cache_used(const ml_image_cache *c) { return c->used; }
size_t ml_image_cache_budget(const ml_image_cache *c) { return c->budget; }
int ml_image_cache_count(const ml_image_cache *c) { return c->lru.n; }
