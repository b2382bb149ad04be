/* Fuzz target: the real Llama 3 tokenizer (loaded once) on arbitrary input.
 *   - encode the bytes (specials parsed when the first byte is odd): decoding
 *     the ids must give the bytes back exactly, for any input;
 *   - the lossy decode must be well-formed UTF-8;
 *   - the same bytes read as little-endian int32 ids: decode and the stream
 *     decoder must agree on accepting them and, when accepted, on the text;
 *   - input that starts with '{' is also given to the loader as a whole
 *     tokenizer.json (seed: a small valid one), and a tokenizer that loads
 *     must encode and decode its own text back. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer_util.h"

/* Map fuzz words onto ids mostly in range, a few past the end and negative. */
#define ID_SPREAD_EXTRA 16

static const ml_tokenizer *tokenizer(void)
{
    static ml_tokenizer *tok;
    if (!tok)
        tok = ml_tok_load(ML_TOK_REAL_PATH, NULL);
    return tok;
}

static void fuzz_encode(const ml_tokenizer *tok, const uint8_t *data, size_t size)
{
    unsigned flags = size && (data[0] & 1) ? ML_ENCODE_PARSE_SPECIAL : 0;
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    if (ml_tokenizer_encode(tok, (const char *)data, size, flags, &buf, NULL, 0) != ML_OK)
        abort();
    char *text;
    size_t len;
    if (ml_tokenizer_decode(tok, buf.ids, buf.n, 0, &text, &len, NULL, 0) != ML_OK)
        abort();
    if (len != size || (size && memcmp(text, data, size)))
        abort();
    free(text);
    if (ml_tokenizer_decode(tok, buf.ids, buf.n, ML_DECODE_REPLACE_INVALID, &text, &len, NULL,
                            0) != ML_OK ||
        !ml_tok_utf8_ok((const uint8_t *)text, len))
        abort();
    free(text);
    ml_token_buf_deinit(&buf);
}

static void fuzz_decode(const ml_tokenizer *tok, const uint8_t *data, size_t size)
{
    size_t n = size / sizeof(int32_t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return;
    int64_t span = (int64_t)ml_tokenizer_n_ids(tok) + 2 * ID_SPREAD_EXTRA;
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, data + i * sizeof w, sizeof w);
        ids[i] = (int32_t)((int64_t)(w % (uint64_t)span) - ID_SPREAD_EXTRA);
    }
    unsigned flags = size && (data[0] & 2) ? ML_DECODE_SKIP_SPECIAL : 0;
    char *text = NULL;
    size_t len = 0;
    ml_status st = ml_tokenizer_decode(tok, ids, n, flags | ML_DECODE_REPLACE_INVALID, &text,
                                       &len, NULL, 0);

    ml_token_stream *s;
    if (ml_token_stream_create(tok, flags, &s, NULL, 0) != ML_OK)
        abort();
    uint8_t *acc = malloc(len + 1);
    size_t got = 0;
    bool rejected = false;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t tl;
        if (ml_token_stream_push(s, ids[i], &t, &tl, NULL, 0) != ML_OK) {
            rejected = true;
            continue;
        }
        if (!ml_tok_utf8_ok((const uint8_t *)t, tl))
            abort();
        if (st == ML_OK) {
            if (got + tl > len)
                abort();
            memcpy(acc + got, t, tl);
        }
        got += tl;
    }
    const char *t;
    size_t tl;
    ml_token_stream_flush(s, &t, &tl);
    if (st == ML_OK) {
        if (rejected || got + tl != len)
            abort();
        memcpy(acc + got, t, tl);
        if (memcmp(acc, text, len))
            abort();
        free(text);
    } else if (!rejected) {
        abort();
    }
    free(acc);
    ml_token_stream_destroy(s);
    free(ids);
}

static void fuzz_load(const uint8_t *data, size_t size)
{
    ml_tokenizer *tok;
    char err[256];
    if (ml_tokenizer_load_buffer((const char *)data, size, "fuzz", &tok, err, sizeof err) != ML_OK)
        return;
    fuzz_encode(tok, data, size);
    ml_tokenizer_destroy(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size && data[0] == '{')
        fuzz_load(data, size);
    const ml_tokenizer *tok = tokenizer();
    fuzz_encode(tok, data, size);
    fuzz_decode(tok, data, size);
    return 0;
}
