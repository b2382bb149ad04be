/* Fuzz target: the real Llama 3 tokenizer (loaded once) on arbitrary input.
 *   - encode the bytes (specials parsed when the first byte is odd): decoding
 *     the ids must give the bytes back exactly, for any input;
 *   - the lossy decode must be well-formed UTF-8;
 *   - the same bytes read as little-endian int32 ids: decode and the stream
 *     decoder must agree on accepting them and, when accepted, on the text;
 *   - the bytes as chat messages (see fuzz_chat): the only special ids of the
 *     encoded prompt are the template's markers, one <|image|> per image
 *     part, and decoding the ids gives the rendered prompt back;
 *   - input that starts with '{' is also given to the loader as a whole
 *     tokenizer.json (seed: a small valid one), and a tokenizer that loads
 *     must encode and decode its own text back. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_util.h"

/* Map fuzz words onto ids mostly in range, a few past the end and negative. */
#define ID_SPREAD_EXTRA 16

/* fuzz_chat's layout of the bytes after the first. */
#define CHAT_MESSAGE_END '\0'
#define CHAT_IMAGE '\1'
#define CHAT_GENERATION_PROMPT 4u /* first byte: add_generation_prompt */
#define CHAT_LEADING_SYSTEM 8u    /* first byte: the first message is "system" */
/* Markers the template writes: <|begin_of_text|>, a header (start, end) and
 * <|eot_id|> per message and for the system block, a header to prompt. */
#define MARKERS_BOS 1
#define MARKERS_MESSAGE 3
#define MARKERS_GENERATION 2

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

/* The bytes after the first as messages: CHAT_MESSAGE_END ends a message
 * (roles alternate user, assistant, after a leading system message when the
 * first byte says so) and each CHAT_IMAGE in a message is an image part
 * between its text parts. */
static void fuzz_chat(const ml_tokenizer *tok, const uint8_t *data, size_t size)
{
    if (!size)
        return;
    unsigned mode = data[0];
    char *text = malloc(size);
    ml_chat_part *parts = malloc(size * 2 * sizeof *parts);
    ml_chat_message *msgs = calloc(size, sizeof *msgs); /* the tool fields NULL */
    if (!text || !parts || !msgs)
        abort();
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    size_t n_msgs = 0, n_parts = 0, n_images = 0;
    bool system = mode & CHAT_LEADING_SYSTEM, images_outside_system = false;
    char *p = text, *end = text + size - 1;
    for (;;) {
        ml_chat_message *m = &msgs[n_msgs];
        m->role = n_msgs == 0 && system ? "system" : (n_msgs - system) % 2 ? "assistant" : "user";
        m->parts = &parts[n_parts];
        m->n_parts = 0;
        for (;;) {
            char *q = p;
            while (q < end && *q != CHAT_MESSAGE_END && *q != CHAT_IMAGE)
                q++;
            char stop = q < end ? *q : CHAT_MESSAGE_END;
            *q = '\0';
            parts[n_parts++] = (ml_chat_part){.type = ML_CHAT_PART_TEXT, .text = p};
            m->n_parts++;
            p = q + (q < end);
            if (stop == CHAT_MESSAGE_END)
                break;
            parts[n_parts++] = (ml_chat_part){.type = ML_CHAT_PART_IMAGE};
            m->n_parts++;
            n_images++;
            images_outside_system |= !(n_msgs == 0 && system);
        }
        n_msgs++;
        if (p >= end)
            break;
    }

    ml_chat_options opt = {.add_generation_prompt = (mode & CHAT_GENERATION_PROMPT) != 0};
    ml_token_buf ids;
    ml_token_buf_init(&ids);
    char *prompt;
    size_t len;
    if (ml_chat_render(msgs, n_msgs, &opt, &prompt, &len, NULL, 0) != ML_OK) {
        if (ml_chat_encode(tok, msgs, n_msgs, &opt, &ids, NULL, 0) == ML_OK || ids.n)
            abort();
    } else {
        if (ml_chat_encode(tok, msgs, n_msgs, &opt, &ids, NULL, 0) != ML_OK)
            abort();
        size_t want = MARKERS_BOS + (n_msgs - system) * MARKERS_MESSAGE +
                      (images_outside_system ? 0 : MARKERS_MESSAGE) +
                      (opt.add_generation_prompt ? MARKERS_GENERATION : 0);
        int32_t image_id = ml_tokenizer_token_id(tok, "<|image|>");
        size_t n_special = 0, n_image_ids = 0;
        for (size_t i = 0; i < ids.n; i++) {
            n_special += ml_tokenizer_is_special(tok, ids.ids[i]) != 0;
            n_image_ids += ids.ids[i] == image_id;
        }
        if (n_special != want + n_images || n_image_ids != n_images)
            abort();
        char *back;
        size_t back_len;
        if (ml_tokenizer_decode(tok, ids.ids, ids.n, 0, &back, &back_len, NULL, 0) != ML_OK ||
            back_len != len || memcmp(back, prompt, len))
            abort();
        free(back);
        free(prompt);
    }
    ml_token_buf_deinit(&ids);
    free(msgs);
    free(parts);
    free(text);
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
    fuzz_chat(tok, data, size);
    return 0;
}
