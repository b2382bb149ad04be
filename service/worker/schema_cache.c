/* The compiled-grammar LRU (schema_cache.h): a list of entries, most
 * recently used first, searched linearly (a few hundred digests compare in
 * microseconds, next to the schema parse that computes the digest). */
#include "worker/schema_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define DIGEST_BYTES 32 /* ml_schema_digest's sha256 */

typedef struct entry {
    ml_list_node link;            /* in lru, most recent at the head */
    uint8_t digest[DIGEST_BYTES];
    ml_grammar *g;                /* owned: one reference */
} entry;

struct svc_schema_cache {
    svc_schema_cache_config cfg;
    pthread_mutex_t lock;
    ml_list lru;                  /* of entry.link */
    size_t bytes;                 /* the entries' ml_grammar_bytes at the last re-count */
};

svc_schema_cache *svc_schema_cache_create(const svc_schema_cache_config *cfg)
{
    svc_schema_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->cfg = *cfg;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void entry_free(entry *e)
{
    ml_grammar_unref(e->g);
    free(e);
}

void svc_schema_cache_destroy(svc_schema_cache *c)
{
    if (!c)
        return;
    ml_list_node *n = c->lru.head;
    while (n) {
        ml_list_node *next = n->next;
        entry_free(ml_list_entry(n, entry, link));
        n = next;
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- under the lock ----------------------------------------------------------- */

static entry *find(svc_schema_cache *c, const uint8_t *digest)
{
    for (ml_list_node *n = c->lru.head; n; n = n->next) {
        entry *e = ml_list_entry(n, entry, link);
        if (!memcmp(e->digest, digest, DIGEST_BYTES))
            return e;
    }
    return NULL;
}

/* Re-count the bytes (masks are added while requests run) and evict from
 * the least recently used end until both bounds hold. */
static void trim(svc_schema_cache *c)
{
    c->bytes = 0;
    for (ml_list_node *n = c->lru.head; n; n = n->next)
        c->bytes += ml_grammar_bytes(ml_list_entry(n, entry, link)->g);
    while (c->lru.n > 0 && ((size_t)c->lru.n > c->cfg.max_entries || c->bytes > c->cfg.max_bytes)) {
        entry *e = ml_list_entry(c->lru.tail, entry, link);
        size_t b = ml_grammar_bytes(e->g);
        c->bytes -= b < c->bytes ? b : c->bytes;
        ml_list_remove(&c->lru, &e->link);
        entry_free(e);
    }
}

/* The entry of digest, moved to the front, with a reference for the
 * caller; NULL when absent. */
static ml_grammar *lookup(svc_schema_cache *c, const uint8_t *digest)
{
    entry *e = find(c, digest);
    if (!e)
        return NULL;
    ml_list_remove(&c->lru, &e->link);
    ml_list_push_front(&c->lru, &e->link);
    ml_grammar_ref(e->g);
    return e->g;
}

/* ---- lookups -------------------------------------------------------------------- */

/* Keep g (the caller's reference stays the caller's) unless another thread
 * cached the same digest meanwhile: then *g becomes that one, whose
 * reference replaces the caller's. Out of memory only skips caching. */
static void insert(svc_schema_cache *c, const uint8_t *digest, ml_grammar **g)
{
    pthread_mutex_lock(&c->lock);
    ml_grammar *cached = lookup(c, digest);
    if (cached) {
        ml_grammar_unref(*g);
        *g = cached;
    } else if (c->cfg.max_entries > 0) {
        entry *e = calloc(1, sizeof *e);
        if (e) {
            memcpy(e->digest, digest, DIGEST_BYTES);
            ml_grammar_ref(*g);
            e->g = *g;
            ml_list_push_front(&c->lru, &e->link);
        }
    }
    trim(c);
    pthread_mutex_unlock(&c->lock);
}

ml_status svc_schema_cache_get(svc_schema_cache *c, const char *text, size_t len,
                               uint32_t max_whitespace, ml_grammar **out,
                               svc_schema_lookup *info, char *err, size_t errlen)
{
    ml_schema_limits lim = c->cfg.limits;
    lim.max_whitespace = max_whitespace;
    uint8_t digest[DIGEST_BYTES];
    ml_status st = ml_schema_digest(text, len, &lim, digest, err, errlen);
    if (st != ML_OK)
        return st;
    pthread_mutex_lock(&c->lock);
    ml_grammar *g = lookup(c, digest);
    trim(c);
    pthread_mutex_unlock(&c->lock);
    if (g) {
        *info = (svc_schema_lookup){.hit = true};
        *out = g;
        return ML_OK;
    }
    double t0 = svc_now_s();
    st = ml_grammar_compile_schema(text, len, &lim, &g, err, errlen);
    if (st != ML_OK)
        return st;
    *info = (svc_schema_lookup){.hit = false, .compile_s = svc_now_s() - t0};
    insert(c, digest, &g);
    *out = g;
    return ML_OK;
}

void svc_schema_cache_usage(svc_schema_cache *c, size_t *entries, size_t *bytes)
{
    pthread_mutex_lock(&c->lock);
    *entries = (size_t)c->lru.n;
    *bytes = c->bytes;
    pthread_mutex_unlock(&c->lock);
}
