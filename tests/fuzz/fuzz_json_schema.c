/* Fuzz target: the JSON Schema compiler (engine/grammar/schema*.c) on
 * hostile bytes, within small limits. Properties, checked with abort():
 *   - compiling never crashes, leaks (ASan) or takes past its bounds;
 *     ml_schema_digest agrees with the compiler on what is JSON;
 *   - a grammar that compiles passes ml_grammar_check (the five guarantees
 *     of grammar_internal.h) and carries the digest;
 *   - a walk over the 256 single-byte tokens, steered by the input's bytes
 *     (the first allowed byte at or after each input byte), has at every
 *     step a mask equal to ml_grammar_state_allows, and a completed walk
 *     spells one JSON value that cJSON parses whole. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

#define FUZZ_N_BYTES 256
#define FUZZ_WORDS (FUZZ_N_BYTES / 64)
/* Small bounds: a hostile schema is refused early, and the fuzzer stays fast. */
#define FUZZ_MAX_SCHEMA_BYTES 4096
#define FUZZ_MAX_STATES 4000
#define FUZZ_MAX_COMPILE_MS 500.0
/* Bytes a walk takes at most. */
#define FUZZ_WALK_STEPS 256

static void require(bool ok)
{
    if (!ok)
        abort();
}

/* The vocabulary of the 256 single bytes, token id = byte; built once. */
static const ml_json_vocab *byte_vocab(void)
{
    static ml_json_vocab *v;
    static char bytes[FUZZ_N_BYTES];
    if (!v) {
        const char *ptr[FUZZ_N_BYTES];
        size_t len[FUZZ_N_BYTES];
        for (size_t b = 0; b < FUZZ_N_BYTES; b++) {
            bytes[b] = (char)b;
            ptr[b] = &bytes[b];
            len[b] = 1;
        }
        require(ml_json_vocab_create_from_bytes(ptr, len, FUZZ_N_BYTES, &v, NULL, 0) == ML_OK);
    }
    return v;
}

static void walk(ml_grammar *g, const uint8_t *steer, size_t n)
{
    ml_grammar_state *s = NULL;
    require(ml_grammar_state_create(g, byte_vocab(), &s, NULL, 0) == ML_OK);
    char text[FUZZ_WALK_STEPS + 1];
    size_t len = 0;
    uint64_t mask[FUZZ_WORDS];
    for (size_t i = 0; i < FUZZ_WALK_STEPS; i++) {
        size_t count = ml_grammar_state_allowed(s, mask);
        size_t bits = 0;
        for (int b = 0; b < FUZZ_N_BYTES; b++) {
            bool m = (mask[b >> 6] >> (b & 63)) & 1;
            require(m == (ml_grammar_state_allows(s, b) == 1));
            bits += m;
        }
        require(bits == count);
        if (count == 0 || (ml_grammar_state_complete(s) && (i >= n || steer[i] == 0)))
            break;
        int b = i < n ? steer[i] : 0;
        while (!((mask[b >> 6] >> (b & 63)) & 1))
            b = (b + 1) % FUZZ_N_BYTES;
        require(ml_grammar_state_accept(s, b, NULL, 0) == ML_OK);
        text[len++] = (char)b;
    }
    if (ml_grammar_state_complete(s)) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
        require(j && end == text + len);
        cJSON_Delete(j);
    }
    ml_grammar_state_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_schema_limits lim = {.max_schema_bytes = FUZZ_MAX_SCHEMA_BYTES,
                            .max_states = FUZZ_MAX_STATES,
                            .max_compile_ms = FUZZ_MAX_COMPILE_MS};
    char err[256];
    uint8_t digest[32];
    ml_grammar *g = NULL;
    ml_status dst = ml_schema_digest((const char *)data, size, &lim, digest, err, sizeof err);
    ml_status st = ml_grammar_compile_schema((const char *)data, size, &lim, &g, err, sizeof err);
    require((st == ML_OK) == (g != NULL));
    require(st == ML_OK || err[0]);
    if (st != ML_OK)
        return 0;
    require(dst == ML_OK && !memcmp(digest, ml_grammar_digest(g), sizeof digest));
    require(ml_grammar_check(g, true, err, sizeof err) == ML_OK);
    walk(g, data, size);
    ml_grammar_unref(g);
    return 0;
}
