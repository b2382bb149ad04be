/* Fuzz target: JSON mode (engine/grammar/json_mode.h) over hostile bytes.
 * The input is fed as single-byte tokens (token id = byte value) until the
 * first refused byte. Properties, checked with abort():
 *   - at every byte the mask bit, ml_json_state_allows and accept agree, and
 *     a refused token leaves the state unchanged;
 *   - when the accepted prefix is a complete object (no byte is accepted
 *     after the closing brace), cJSON parses exactly that prefix as an
 *     object, and it is well-formed UTF-8;
 *   - with a second vocabulary, the 256 single bytes plus multi-byte tokens
 *     cut from the input (so they meet the grammar where it is), the trie
 *     mask equals the per-token check at each of the first positions of the
 *     accepted prefix. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_mode.h"
#include "tokenizer_util.h"

#define FUZZ_N_BYTES 256
/* Tokens cut from the input: one per start position among the first ones,
 * each up to FUZZ_MAX_SLICE bytes. */
#define FUZZ_N_SLICES 96
#define FUZZ_MAX_SLICE 12
/* Positions of the accepted prefix at which the second mask is checked. */
#define FUZZ_MASK_POSITIONS 192
#define FUZZ_WORDS ((FUZZ_N_BYTES + FUZZ_N_SLICES + 63) / 64)

static void require(bool ok)
{
    if (!ok)
        abort();
}

static bool mask_bit(const uint64_t *mask, size_t id)
{
    return (mask[id >> 6] >> (id & 63)) & 1;
}

static ml_json_vocab *make_vocab(const char *const *bytes, const size_t *lens, size_t n)
{
    ml_json_vocab *v = NULL;
    require(ml_json_vocab_create_from_bytes(bytes, lens, n, &v, NULL, 0) == ML_OK);
    return v;
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
        v = make_vocab(ptr, len, FUZZ_N_BYTES);
    }
    return v;
}

static bool is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* text[0, n) is one JSON object to cJSON, followed by nothing but JSON whitespace. */
static bool cjson_object(const char *text, size_t n)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, false);
    bool ok = j && cJSON_IsObject(j) && end && end >= text && end <= text + n;
    while (ok && end < text + n && is_json_ws(*end))
        end++;
    ok = ok && end == text + n;
    cJSON_Delete(j);
    return ok;
}

/* Feed data as single bytes; returns how many were accepted. */
static size_t feed_bytes(ml_json_state *s, const uint8_t *data, size_t size)
{
    uint64_t mask[FUZZ_N_BYTES / 64], again[FUZZ_N_BYTES / 64];
    for (size_t i = 0; i < size; i++) {
        ml_json_state_allowed(s, mask);
        bool bit = mask_bit(mask, data[i]);
        require(bit == (bool)ml_json_state_allows(s, data[i]));
        ml_status st = ml_json_state_accept(s, data[i], NULL, 0);
        require((st == ML_OK) == bit);
        if (st != ML_OK) {
            require(st == ML_ERR_INVALID_ARG);
            ml_json_state_allowed(s, again);
            require(!memcmp(mask, again, sizeof mask));
            return i;
        }
    }
    return size;
}

/* The trie mask against the per-token check over tokens cut from data, at
 * the first positions of the accepted prefix data[0, n_ok). */
static void check_slices(const uint8_t *data, size_t size, size_t n_ok)
{
    const char *ptr[FUZZ_N_BYTES + FUZZ_N_SLICES];
    size_t len[FUZZ_N_BYTES + FUZZ_N_SLICES];
    static char single[FUZZ_N_BYTES];
    for (size_t b = 0; b < FUZZ_N_BYTES; b++) {
        single[b] = (char)b;
        ptr[b] = &single[b];
        len[b] = 1;
    }
    size_t n = FUZZ_N_BYTES;
    for (size_t i = 0; i < size && i < FUZZ_N_SLICES; i++, n++) {
        size_t want = 1 + (data[i] * 7u + i) % FUZZ_MAX_SLICE;
        ptr[n] = (const char *)data + i;
        len[n] = want < size - i ? want : size - i;
    }
    ml_json_vocab *v = make_vocab(ptr, len, n);
    ml_json_state *s = NULL;
    require(ml_json_state_create(v, &s, NULL, 0) == ML_OK);
    uint64_t mask[FUZZ_WORDS];
    for (size_t p = 0; p <= n_ok && p < FUZZ_MASK_POSITIONS; p++) {
        ml_json_state_allowed(s, mask);
        for (size_t id = 0; id < 64 * ml_json_vocab_mask_words(v); id++)
            require(mask_bit(mask, id) == (id < n && ml_json_state_allows(s, (int32_t)id)));
        if (p < n_ok)
            require(ml_json_state_accept(s, data[p], NULL, 0) == ML_OK);
    }
    ml_json_state_destroy(s);
    ml_json_vocab_destroy(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_json_state *s = NULL;
    require(ml_json_state_create(byte_vocab(), &s, NULL, 0) == ML_OK);
    size_t n_ok = feed_bytes(s, data, size);
    if (ml_json_state_complete(s)) {
        require(cjson_object((const char *)data, n_ok));
        require(ml_tok_utf8_ok(data, n_ok));
        /* Once complete, nothing may follow, whitespace included. */
        require(!ml_json_state_allows(s, ' '));
    }
    ml_json_state_destroy(s);
    check_slices(data, size, n_ok);
    return 0;
}
