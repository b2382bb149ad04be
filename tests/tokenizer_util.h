/* The real Llama 3 tokenizer for the tests, benchmarks and fuzz targets that
 * run it, and the two helpers its tests share: reading a whole file and an
 * independent UTF-8 well-formedness check. Header-only, test code only; the
 * target needs ML_SOURCE_DIR (ml_test and ml_fuzz define it). */
#ifndef ML_TEST_TOKENIZER_UTIL_H
#define ML_TEST_TOKENIZER_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

/* The tokenizer.json the service ships (Llama 3.2 Vision's). */
#define ML_TOK_REAL_PATH ML_SOURCE_DIR "/config/tokenizer/tokenizer.json"

/* The whole file at path, NUL-terminated; owned by the caller (free). Its
 * length, without the NUL, in *len. NULL when the file cannot be read or
 * memory runs out (*len unchanged). */
static inline char *ml_tok_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = size >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)size + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[size] = '\0';
        *len = (size_t)size;
    }
    return buf;
}

/* The chat template's ids (appended to ids) of one user turn `text` with
 * the generation prompt and `date` as the template's date. 0, or -1 with
 * ml_chat_encode's reason in err. */
static inline int ml_tok_chat_turn(const ml_tokenizer *tok, const char *text, const char *date,
                                   ml_token_buf *ids, char *err, size_t errlen)
{
    const ml_chat_part part = {.type = ML_CHAT_PART_TEXT, .text = text};
    const ml_chat_message msg = {.role = "user", .parts = &part, .n_parts = 1};
    const ml_chat_options opt = {.add_generation_prompt = 1, .date_string = date};
    return ml_chat_encode(tok, &msg, 1, &opt, ids, err, errlen) == ML_OK ? 0 : -1;
}

/* Seconds on the monotonic clock, for timing. */
static inline double ml_tok_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The tokenizer at path (usually ML_TOK_REAL_PATH), owned by the caller
 * (ml_tokenizer_destroy); the wall-clock seconds the load took in *seconds
 * unless seconds is NULL. A tokenizer that does not load is a broken setup,
 * not a finding: the loader's message goes to stderr and the process exits
 * with 1. */
static inline ml_tokenizer *ml_tok_load(const char *path, double *seconds)
{
    char err[512];
    ml_tokenizer *tok = NULL;
    double t0 = ml_tok_now();
    if (ml_tokenizer_load(path, &tok, err, sizeof err) != ML_OK) {
        fprintf(stderr, "tokenizer %s: %s\n", path, err);
        exit(1);
    }
    if (seconds)
        *seconds = ml_tok_now() - t0;
    return tok;
}

/* True when s[0..n) is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF). Written apart from the decoder's own
 * tables so that it can check them. */
static inline bool ml_tok_utf8_ok(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        size_t len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
                                : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!len || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F) ||
            (b == 0xF0 && s[i + 1] < 0x90) || (b == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += len;
    }
    return true;
}

#endif
