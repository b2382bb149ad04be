/* Compiled JSON Schema grammars, cached by content for the prep threads
 * (service/protocol/README.md "Requests", response_format json_schema).
 *
 * A pipeline sends one schema with every request: compiling it each time
 * would cost the prep threads up to limits.max_schema_compile_ms a request.
 * The cache maps ml_schema_digest (sha256 of the canonical schema, so two
 * spellings of one schema share an entry) to its compiled grammar, least
 * recently used first out, bounded by entries and by bytes
 * (ml_grammar_bytes: tables and the masks computed so far, which grow while
 * requests run, so the total is re-read at every lookup).
 *
 * Each entry holds one reference to its grammar and every caller gets its
 * own: an evicted grammar lives on in the requests that use it, and is
 * freed by the last one. Compilation runs outside the lock, so a lookup
 * never waits for another schema's compilation; two threads compiling the
 * same new schema at once both compile it, and the first insertion wins.
 *
 * @locality: any thread (one mutex around the entries). */
#ifndef SVC_WORKER_SCHEMA_CACHE_H
#define SVC_WORKER_SCHEMA_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine.h"

typedef struct svc_schema_cache svc_schema_cache;

typedef struct svc_schema_cache_config {
    size_t max_entries;     /* 0: nothing is kept, every lookup compiles */
    size_t max_bytes;       /* ml_grammar_bytes of all entries together */
    ml_schema_limits limits; /* what one compilation may cost */
} svc_schema_cache_config;

/* How a lookup was served, for the metrics. */
typedef struct svc_schema_lookup {
    bool hit;           /* found in the cache: nothing compiled */
    double compile_s;   /* the compilation's wall time when not a hit */
} svc_schema_lookup;

/* An empty cache; NULL when out of memory. cfg is copied. */
svc_schema_cache *svc_schema_cache_create(const svc_schema_cache_config *cfg);

/* Drop every entry's reference (grammars still held by requests live on)
 * and free the cache. NULL is a no-op. */
void svc_schema_cache_destroy(svc_schema_cache *c);

/* The grammar of the JSON Schema text[0..len) with whitespace runs of at
 * most max_whitespace bytes (0: the default; ml_schema_limits): the cached
 * one, or compiled and cached. Returns ML_OK with *out holding a reference owned by the
 * caller (ml_grammar_unref) and *info saying how it was served; or the
 * error of ml_schema_digest or ml_grammar_compile_schema (ML_ERR_INVALID_ARG,
 * ML_ERR_UNSUPPORTED, ML_ERR_TOO_LARGE: err names the keyword and its JSON
 * Pointer, or the bound; ML_ERR_NOMEM) with *out untouched. Errors are not
 * cached. */
ml_status svc_schema_cache_get(svc_schema_cache *c, const char *text, size_t len,
                               uint32_t max_whitespace, ml_grammar **out,
                               svc_schema_lookup *info, char *err, size_t errlen);

/* The entries and their ml_grammar_bytes as of the last lookup. */
void svc_schema_cache_usage(svc_schema_cache *c, size_t *entries, size_t *bytes);

#endif
