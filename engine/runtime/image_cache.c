/* The resident image-state cache: a fixed set of slots, each an entry with
 * its state, allocated when the cache is made (as many whole states as the
 * budget holds) and kept until it is destroyed. A slot is in one of two
 * lists: the LRU list of entries (head = most recently used), or the free
 * list. Lookups scan the LRU list: a budget holds at most a few hundred
 * states (11B: 200 MiB each), and a lookup happens once per image of a
 * request, never per token.
 *
 * Why every state up front: backend memory is slow to get. The CPU backend
 * faults a state in, on huge pages, when it is allocated (memory.c), and
 * allocated at each miss that sat on the request's first token: `small`'s
 * 26 MB state took 2-152 ms to reserve against a 31 ms prefill on the
 * development VM (2026-12-06), whose host takes freed memory back and
 * faults it in again at the next touch. Made once, a miss costs a list
 * move, a budget the host cannot hold fails at start, and the resident set
 * is the budget from the start, as for the K/V pool and the adapter slots. */
#include "runtime/image_cache.h"

#include <assert.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "sha256.h"

struct ml_image_entry {
    uint8_t key[ML_IMAGE_KEY_BYTES];
    void *state;      /* owned by the cache: ml_model_image_state_alloc's handle */
    int n_tiles;
    int refs;
    int published;
    ml_list_node lru; /* in ml_image_cache.lru, or in .free while the slot is unused */
};

struct ml_image_cache {
    ml_model *model;  /* borrowed */
    size_t budget, entry_bytes;
    ml_image_entry *slots; /* n_slots, each with its state */
    int n_slots;
    ml_list lru;      /* every entry, published or reserved; .n is the count */
    ml_list free;     /* the slots no entry holds */
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
    const size_t n_slots = budget_bytes / entry_bytes;
    if (n_slots > INT_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "image cache: a budget of %zu bytes makes %zu states of %zu bytes",
                       budget_bytes, n_slots, entry_bytes);
    ml_image_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->slots = calloc(n_slots ? n_slots : 1, sizeof *c->slots))) {
        free(c);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "image cache: out of memory");
    }
    c->model = model;
    c->budget = budget_bytes;
    c->entry_bytes = entry_bytes;
    c->on_event = on_event;
    c->event_ctx = event_ctx;
    for (; c->n_slots < (int)n_slots; c->n_slots++) {
        ml_image_entry *e = &c->slots[c->n_slots];
        if (!(e->state = ml_model_image_state_alloc(model))) {
            ml_image_cache_destroy(c);
            return ml_fail(err, errlen, ML_ERR_NOMEM,
                           "image cache: cannot allocate state %d of %zu (%zu bytes each): the "
                           "image budget does not fit in memory",
                           c->n_slots + 1, n_slots, entry_bytes);
        }
        ml_list_push_back(&c->free, &e->lru);
    }
    *out = c;
    return ML_OK;
}

static ml_image_entry *entry_of(ml_list_node *n)
{
    return ml_list_entry(n, ml_image_entry, lru);
}

/* The entry leaves the cache; its slot, state included, goes back to the
 * free list. */
static void free_entry(ml_image_cache *c, ml_image_entry *e)
{
    ml_list_remove(&c->lru, &e->lru);
    if (e->published && c->on_event)
        c->on_event(c->event_ctx, ML_IMAGE_EVICTED, e->key, c->entry_bytes, e->n_tiles);
    e->published = 0; /* refs is 0 here; reserve sets the key and tiles */
    ml_list_push_front(&c->free, &e->lru);
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
    for (int i = 0; i < c->n_slots; i++)
        ml_model_image_state_free(c->model, c->slots[i].state);
    free(c->slots);
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
    /* Evict idle entries from the LRU end until a slot is free. */
    ml_image_entry *e = entry_of(c->lru.tail);
    while (!c->free.head && e) {
        ml_image_entry *prev = entry_of(e->lru.prev);
        if (e->refs == 0)
            free_entry(c, e);
        e = prev;
    }
    ml_image_entry *n = entry_of(c->free.head);
    if (!n)
        return NULL;
    ml_list_remove(&c->free, &n->lru);
    memcpy(n->key, key, ML_IMAGE_KEY_BYTES);
    n->n_tiles = n_tiles;
    n->refs = 1;
    ml_list_push_front(&c->lru, &n->lru);
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
size_t ml_image_cache_used(const ml_image_cache *c) { return (size_t)c->lru.n * c->entry_bytes; }
size_t ml_image_cache_budget(const ml_image_cache *c) { return c->budget; }
int ml_image_cache_count(const ml_image_cache *c) { return c->lru.n; }
