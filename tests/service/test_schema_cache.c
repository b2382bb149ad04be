/* The compiled-grammar cache of the prep threads (service/worker/schema_cache.c):
 * a hit returns the cached grammar without compiling, two spellings of one
 * schema share an entry, the least recently used entry goes first when the
 * entry or byte bound is passed, a grammar a request still holds survives
 * its eviction (ASan would see a use after free), compile errors pass the
 * compiler's message through and are not cached, and threads sharing the
 * cache agree. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "worker/schema_cache.h"

static const char *const schemas[] = {
    "{\"type\":\"string\"}",
    "{\"type\":\"integer\"}",
    "{\"type\":\"boolean\"}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
};
#define N_SCHEMAS (sizeof schemas / sizeof schemas[0])

static svc_schema_cache_config config(size_t entries, size_t bytes)
{
    svc_schema_cache_config c = {.max_entries = entries, .max_bytes = bytes};
    ml_schema_limits_default(&c.limits);
    return c;
}

/* Look schema i up; returns the grammar (the caller's reference) or NULL,
 * with *hit telling how it was served. */
static ml_grammar *get(svc_schema_cache *c, const char *text, bool *hit)
{
    ml_grammar *g = NULL;
    svc_schema_lookup info = {0};
    char err[256] = "";
    ml_status st = svc_schema_cache_get(c, text, strlen(text), 0, &g, &info, err, sizeof err);
    check(st == ML_OK && g, "compile %s: %s", text, err);
    if (hit)
        *hit = info.hit;
    return g;
}

/* Whether looking schema text up now is a hit (the reference is dropped). */
static bool cached(svc_schema_cache *c, const char *text)
{
    bool hit = false;
    ml_grammar_unref(get(c, text, &hit));
    return hit;
}

/* The bytes each schema's grammar holds once compiled. */
static size_t grammar_bytes(const char *text)
{
    svc_schema_cache_config cfg = config(0, 0);
    ml_grammar *g = NULL;
    char err[256];
    if (ml_grammar_compile_schema(text, strlen(text), &cfg.limits, &g, err, sizeof err) != ML_OK)
        return 0;
    size_t b = ml_grammar_bytes(g);
    ml_grammar_unref(g);
    return b;
}

static void test_hit(void)
{
    svc_schema_cache_config cfg = config(8, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    bool hit = true;
    ml_grammar *a = get(c, schemas[0], &hit);
    check(!hit, "the first lookup compiles");
    ml_grammar *b = get(c, schemas[0], &hit);
    check(hit && a == b, "the second is a hit on the same grammar");
    /* Canonical form: member order and spacing do not matter. */
    check(cached(c, schemas[3]) == false, "a new schema compiles");
    check(cached(c, "{ \"required\": [\"a\"], \"properties\": {\"a\": {\"type\": \"string\"}}, "
                    "\"type\": \"object\" }"),
          "another spelling of a cached schema is a hit (ml_schema_digest)");
    size_t entries, bytes;
    svc_schema_cache_usage(c, &entries, &bytes);
    check(entries == 2 && bytes >= ml_grammar_bytes(a), "usage: %zu entries, %zu bytes", entries,
          bytes);
    ml_grammar_unref(a);
    ml_grammar_unref(b);
    svc_schema_cache_destroy(c);
}

/* A whitespace bound is part of the grammar: the same schema under another
 * bound is another entry, and the default bound's digest is the schema's
 * alone. */
static void test_whitespace_bound(void)
{
    svc_schema_cache_config cfg = config(8, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    ml_grammar *loose = get(c, schemas[0], NULL), *tight = NULL, *again = NULL;
    svc_schema_lookup info = {0};
    char err[256] = "";
    check(svc_schema_cache_get(c, schemas[0], strlen(schemas[0]), 2, &tight, &info, err,
                               sizeof err) == ML_OK &&
              !info.hit && tight != loose,
          "a tighter whitespace bound compiles a grammar of its own: %s", err);
    check(svc_schema_cache_get(c, schemas[0], strlen(schemas[0]), ML_JSON_MAX_WHITESPACE, &again,
                               &info, err, sizeof err) == ML_OK &&
              info.hit && again == loose,
          "the default bound named is the default's entry");
    check(svc_schema_cache_get(c, schemas[0], strlen(schemas[0]), ML_JSON_MAX_WHITESPACE + 1,
                               &again, &info, err, sizeof err) == ML_ERR_INVALID_ARG,
          "a bound over ML_JSON_MAX_WHITESPACE is refused");
    ml_grammar_unref(loose);
    ml_grammar_unref(tight);
    ml_grammar_unref(again);
    svc_schema_cache_destroy(c);
}

static void test_evict_by_entries(void)
{
    svc_schema_cache_config cfg = config(2, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    check(!cached(c, schemas[0]) && !cached(c, schemas[1]), "two compiled");
    check(cached(c, schemas[0]), "0 used again: 1 is now the least recently used");
    check(!cached(c, schemas[2]), "a third compiles and evicts 1");
    size_t entries, bytes;
    svc_schema_cache_usage(c, &entries, &bytes);
    check(entries == 2, "at most 2 entries: %zu", entries);
    check(cached(c, schemas[0]) && cached(c, schemas[2]), "0 and 2 kept");
    check(!cached(c, schemas[1]), "1 was evicted: compiled again");
    svc_schema_cache_destroy(c);

    cfg = config(0, SIZE_MAX);
    c = svc_schema_cache_create(&cfg);
    check(!cached(c, schemas[0]) && !cached(c, schemas[0]), "0 entries: every lookup compiles");
    svc_schema_cache_destroy(c);
}

static void test_evict_by_bytes(void)
{
    size_t b0 = grammar_bytes(schemas[0]), b1 = grammar_bytes(schemas[1]);
    size_t b3 = grammar_bytes(schemas[3]);
    check(b0 && b1 && b3, "ml_grammar_bytes is positive: %zu %zu %zu", b0, b1, b3);
    svc_schema_cache_config cfg = config(16, b0 + b1);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    check(!cached(c, schemas[0]) && !cached(c, schemas[1]), "two that fit the bytes");
    check(cached(c, schemas[0]) && cached(c, schemas[1]), "both kept");
    check(!cached(c, schemas[3]), "a third compiles");
    size_t entries, bytes;
    svc_schema_cache_usage(c, &entries, &bytes);
    check(bytes <= b0 + b1, "the byte bound holds: %zu <= %zu", bytes, b0 + b1);
    check(!cached(c, schemas[0]), "the least recently used went first");
    svc_schema_cache_destroy(c);

    /* A grammar larger than the whole bound is served and not kept. */
    cfg = config(16, b0 - 1);
    c = svc_schema_cache_create(&cfg);
    check(!cached(c, schemas[0]) && !cached(c, schemas[0]), "over the byte bound alone: not kept");
    svc_schema_cache_usage(c, &entries, &bytes);
    check(entries == 0 && bytes == 0, "nothing kept: %zu entries, %zu bytes", entries, bytes);
    svc_schema_cache_destroy(c);
}

/* A request holds its own reference: eviction, and the cache's destruction,
 * leave it usable. */
static void test_held_survives_eviction(void)
{
    svc_schema_cache_config cfg = config(1, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    ml_grammar *held = get(c, schemas[0], NULL);
    uint8_t digest[32];
    memcpy(digest, ml_grammar_digest(held), sizeof digest);
    check(!cached(c, schemas[1]), "another schema evicts the held one's entry");
    check(!cached(c, schemas[0]), "the held grammar's entry is gone");
    svc_schema_cache_destroy(c);
    check(!memcmp(ml_grammar_digest(held), digest, sizeof digest) && ml_grammar_bytes(held) > 0,
          "the held grammar is intact");
    ml_grammar_unref(held);
}

static void test_errors(void)
{
    svc_schema_cache_config cfg = config(8, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    static const struct {
        const char *schema, *word;
    } bad[] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"dependentRequired\":{}}}}", "dependentRequired"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int round = 0; round < 2; round++) {
            ml_grammar *g = NULL;
            svc_schema_lookup info = {0};
            char err[256] = "";
            ml_status st = svc_schema_cache_get(c, bad[i].schema, strlen(bad[i].schema), 0, &g,
                                                &info, err, sizeof err);
            check(st != ML_OK && g == NULL && strstr(err, bad[i].word),
                  "%s refused naming '%s': %s", bad[i].schema, bad[i].word, err);
        }
    }
    cfg.limits.max_schema_bytes = 8;
    svc_schema_cache *small = svc_schema_cache_create(&cfg);
    ml_grammar *g = NULL;
    svc_schema_lookup info;
    char err[256] = "";
    ml_status st = svc_schema_cache_get(small, schemas[0], strlen(schemas[0]), 0, &g, &info, err,
                                        sizeof err);
    check(st == ML_ERR_TOO_LARGE && !g, "over max_schema_bytes: %s", err);
    size_t entries, bytes;
    svc_schema_cache_usage(c, &entries, &bytes);
    check(entries == 0, "errors are not cached: %zu entries", entries);
    svc_schema_cache_destroy(small);
    svc_schema_cache_destroy(c);
}

/* Prep threads share the cache: each lookup of each thread gets a grammar
 * for its schema, whatever the others evict meanwhile. */
#define THREADS 4
#define ROUNDS 200

typedef struct worker_arg {
    svc_schema_cache *c;
    int seed, failures;
} worker_arg;

static void *hammer(void *p)
{
    worker_arg *a = p;
    for (int r = 0; r < ROUNDS; r++) {
        const char *s = schemas[(size_t)(r * 7 + a->seed) % N_SCHEMAS];
        ml_grammar *g = NULL;
        svc_schema_lookup info;
        char err[256];
        if (svc_schema_cache_get(a->c, s, strlen(s), 0, &g, &info, err, sizeof err) != ML_OK || !g)
            a->failures++;
        ml_grammar_unref(g);
    }
    return NULL;
}

static void test_threads(void)
{
    svc_schema_cache_config cfg = config(2, SIZE_MAX);
    svc_schema_cache *c = svc_schema_cache_create(&cfg);
    pthread_t t[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){.c = c, .seed = i};
        pthread_create(&t[i], NULL, hammer, &args[i]);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        failures += args[i].failures;
    }
    check(failures == 0, "%d lookups failed", failures);
    size_t entries, bytes;
    svc_schema_cache_usage(c, &entries, &bytes);
    check(entries <= 2, "the entry bound held: %zu", entries);
    svc_schema_cache_destroy(c);
}

int main(void)
{
    test_hit();
    test_whitespace_bound();
    test_evict_by_entries();
    test_evict_by_bytes();
    test_held_survives_eviction();
    test_errors();
    test_threads();
    return check_done();
}
