/* Tokenizer against HF `tokenizers`: every corpus line must encode to exactly
 * the reference ids (tests/golden/fixtures/tokenizer/expected.jsonl, written by
 * tests/golden/tokenizer_refs.py) and decode back; plus streaming decode,
 * special tokens, decode errors, invalid UTF-8, concurrent use, and the loader
 * on small synthetic tokenizer.json documents. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_util.h"

#define CORPUS_PATH ML_SOURCE_DIR "/tests/golden/tokenizer_corpus.jsonl"
#define EXPECTED_PATH ML_SOURCE_DIR "/tests/golden/fixtures/tokenizer/expected.jsonl"
#define IMAGE_ID 128256
#define EOT_ID 128009
#define N_THREADS 4
#define MAX_SHOWN_IDS 24

/* ---- helpers ------------------------------------------------------------------ */

/* One corpus line with its reference. */
typedef struct golden_case {
    char *text; /* owned */
    size_t text_len;
    int32_t *ids; /* owned */
    size_t n_ids;
    char *decoded; /* owned: HF decode */
} golden_case;

typedef struct golden {
    golden_case *cases;
    size_t n;
} golden;

/* Split buf into lines in place; returns the count, pointers in lines[]. */
static size_t split_lines(char *buf, char ***lines)
{
    size_t n = 0, cap = 0;
    *lines = NULL;
    for (char *p = buf; *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        if (n == cap) {
            cap = cap ? cap * 2 : 512;
            *lines = realloc(*lines, cap * sizeof **lines);
        }
        (*lines)[n++] = p;
        if (!nl)
            break;
        p = nl + 1;
    }
    return n;
}

static bool load_golden(golden *g)
{
    size_t clen, elen;
    char *corpus = ml_tok_read_file(CORPUS_PATH, &clen);
    char *expected = ml_tok_read_file(EXPECTED_PATH, &elen);
    if (!corpus || !expected) {
        free(corpus);
        free(expected);
        return false;
    }
    char **cl, **el;
    size_t nc = split_lines(corpus, &cl), ne = split_lines(expected, &el);
    check(nc == ne, "corpus has %zu lines, expected.jsonl %zu: regenerate the fixtures", nc, ne);
    g->n = nc < ne ? nc : ne;
    g->cases = calloc(g->n, sizeof *g->cases);
    for (size_t i = 0; i < g->n; i++) {
        cJSON *c = cJSON_Parse(cl[i]), *e = cJSON_Parse(el[i]);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(e, "decoded");
        if (!cJSON_IsString(text) || !cJSON_IsArray(ids) || !cJSON_IsString(dec)) {
            check(0, "line %zu of the corpus or fixtures is malformed", i + 1);
            cJSON_Delete(c);
            cJSON_Delete(e);
            continue;
        }
        golden_case *gc = &g->cases[i];
        gc->text = strdup(text->valuestring);
        gc->text_len = strlen(gc->text);
        gc->decoded = strdup(dec->valuestring);
        gc->n_ids = (size_t)cJSON_GetArraySize(ids);
        gc->ids = malloc((gc->n_ids + 1) * sizeof *gc->ids);
        size_t k = 0;
        for (const cJSON *v = ids->child; v; v = v->next)
            gc->ids[k++] = (int32_t)v->valuedouble;
        cJSON_Delete(c);
        cJSON_Delete(e);
    }
    free(cl);
    free(el);
    free(corpus);
    free(expected);
    return true;
}

static void free_golden(golden *g)
{
    for (size_t i = 0; i < g->n; i++) {
        free(g->cases[i].text);
        free(g->cases[i].ids);
        free(g->cases[i].decoded);
    }
    free(g->cases);
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < MAX_SHOWN_IDS; i++)
        fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, n > MAX_SHOWN_IDS ? " ...\n" : "\n");
}

static bool ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* ---- golden corpus ----------------------------------------------------------------- */

static void test_golden_encode_decode(const ml_tokenizer *tok, const golden *g)
{
    char err[256];
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    size_t ok = 0;
    for (size_t i = 0; i < g->n; i++) {
        const golden_case *gc = &g->cases[i];
        buf.n = 0;
        ml_status st = ml_tokenizer_encode(tok, gc->text, gc->text_len, ML_ENCODE_PARSE_SPECIAL,
                                           &buf, err, sizeof err);
        check(st == ML_OK, "line %zu: encode: %s", i + 1, err);
        if (!ids_equal(buf.ids, buf.n, gc->ids, gc->n_ids)) {
            check(0, "line %zu: ids differ from HF for %.80s", i + 1, gc->text);
            print_ids("got ", buf.ids, buf.n);
            print_ids("want", gc->ids, gc->n_ids);
            continue;
        }
        char *text;
        size_t len;
        st = ml_tokenizer_decode(tok, buf.ids, buf.n, 0, &text, &len, err, sizeof err);
        check(st == ML_OK && len == gc->text_len && !memcmp(text, gc->text, len),
              "line %zu: decode does not give the text back", i + 1);
        if (st == ML_OK)
            free(text);
        st = ml_tokenizer_decode(tok, buf.ids, buf.n, ML_DECODE_REPLACE_INVALID, &text, &len, err,
                                 sizeof err);
        check(st == ML_OK && len == strlen(gc->decoded) && !memcmp(text, gc->decoded, len),
              "line %zu: decode differs from HF decode", i + 1);
        if (st == ML_OK)
            free(text);
        ok++;
    }
    fprintf(stderr, "  golden: %zu/%zu corpus lines match HF ids\n", ok, g->n);
    ml_token_buf_deinit(&buf);
}

/* Streaming decode of every corpus line: chunks are whole characters and
 * concatenate to HF's decode. */
static void test_golden_stream(const ml_tokenizer *tok, const golden *g)
{
    char err[256];
    ml_token_stream *s;
    check(ml_token_stream_create(tok, 0, &s, err, sizeof err) == ML_OK, "stream: %s", err);
    size_t cap = 1 << 16;
    char *acc = malloc(cap);
    for (size_t i = 0; i < g->n; i++) {
        const golden_case *gc = &g->cases[i];
        size_t n = 0;
        bool chunks_ok = true;
        for (size_t k = 0; k < gc->n_ids; k++) {
            const char *t;
            size_t len;
            check(ml_token_stream_push(s, gc->ids[k], &t, &len, err, sizeof err) == ML_OK,
                  "line %zu: push: %s", i + 1, err);
            chunks_ok &= ml_tok_utf8_ok((const uint8_t *)t, len);
            if (n + len < cap) {
                memcpy(acc + n, t, len);
                n += len;
            }
        }
        const char *t;
        size_t len;
        ml_token_stream_flush(s, &t, &len);
        if (n + len < cap) {
            memcpy(acc + n, t, len);
            n += len;
        }
        check(chunks_ok, "line %zu: a streamed chunk is not whole UTF-8 characters", i + 1);
        check(n == strlen(gc->decoded) && !memcmp(acc, gc->decoded, n),
              "line %zu: streamed text differs from HF decode", i + 1);
    }
    free(acc);
    ml_token_stream_destroy(s);
}

/* ---- streaming edge cases -------------------------------------------------------- */

static int32_t byte_token(const ml_tokenizer *tok, uint8_t b)
{
    char s[2] = {(char)b, 0};
    return b ? ml_tokenizer_token_id(tok, s) : -1;
}

static void test_stream_partial_chars(const ml_tokenizer *tok)
{
    char err[256];
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    /* U+1FAE0 MELTING FACE: four bytes that the vocabulary splits. */
    static const char emoji[] = "\xF0\x9F\xAB\xA0";
    check(ml_tokenizer_encode(tok, emoji, 4, 0, &buf, err, sizeof err) == ML_OK, "encode emoji");
    check(buf.n >= 2, "the emoji should span several tokens (got %zu)", buf.n);
    ml_token_stream *s;
    check(ml_token_stream_create(tok, 0, &s, err, sizeof err) == ML_OK, "stream: %s", err);
    for (size_t k = 0; k < buf.n; k++) {
        const char *t;
        size_t len;
        check(ml_token_stream_push(s, buf.ids[k], &t, &len, err, sizeof err) == ML_OK, "push");
        if (k + 1 < buf.n)
            check(len == 0, "token %zu of the emoji emitted %zu bytes early", k, len);
        else
            check(len == 4 && !memcmp(t, emoji, 4), "the last token emits the whole emoji");
    }

    /* An ill-formed byte is replaced at once; an unfinished lead byte waits,
     * then becomes U+FFFD when a non-continuation byte follows or at flush. */
    const char *t;
    size_t len;
    int32_t ff = byte_token(tok, 0xFF), f0 = byte_token(tok, 0xF0), a = byte_token(tok, 'a');
    check(ff >= 0 && f0 >= 0 && a >= 0, "byte tokens exist");
    ml_token_stream_push(s, ff, &t, &len, err, sizeof err);
    check(len == 3 && !memcmp(t, "\xEF\xBF\xBD", 3), "0xFF -> U+FFFD at once");
    ml_token_stream_push(s, f0, &t, &len, err, sizeof err);
    check(len == 0, "lone 0xF0 waits");
    ml_token_stream_push(s, a, &t, &len, err, sizeof err);
    check(len == 4 && !memcmp(t, "\xEF\xBF\xBD" "a", 4), "0xF0 'a' -> U+FFFD a");
    ml_token_stream_push(s, f0, &t, &len, err, sizeof err);
    ml_token_stream_flush(s, &t, &len);
    check(len == 3 && !memcmp(t, "\xEF\xBF\xBD", 3), "flush of a lone 0xF0 -> U+FFFD");
    ml_token_stream_flush(s, &t, &len);
    check(len == 0, "second flush emits nothing");

    /* Out-of-range ids are rejected and leave the stream as it was. */
    ml_token_stream_push(s, f0, &t, &len, err, sizeof err);
    check(ml_token_stream_push(s, (int32_t)ml_tokenizer_n_ids(tok), &t, &len, err, sizeof err) ==
              ML_ERR_INVALID_ARG,
          "stream rejects id n_ids");
    check(ml_token_stream_push(s, -1, &t, &len, err, sizeof err) == ML_ERR_INVALID_ARG,
          "stream rejects id -1");
    buf.n = 0;
    ml_tokenizer_encode(tok, emoji + 1, 3, 0, &buf, err, sizeof err);
    size_t total = 0;
    for (size_t k = 0; k < buf.n; k++) {
        ml_token_stream_push(s, buf.ids[k], &t, &len, err, sizeof err);
        total += len;
    }
    check(total == 4, "pending 0xF0 survives a rejected id and completes the emoji");

    /* Skipping specials. */
    ml_token_stream *skip;
    check(ml_token_stream_create(tok, ML_DECODE_SKIP_SPECIAL, &skip, err, sizeof err) == ML_OK,
          "stream");
    ml_token_stream_push(skip, EOT_ID, &t, &len, err, sizeof err);
    check(len == 0, "skip-special stream drops <|eot_id|>");
    ml_token_stream_push(s, EOT_ID, &t, &len, err, sizeof err);
    check(len == 10 && !memcmp(t, "<|eot_id|>", 10), "plain stream shows <|eot_id|>");
    ml_token_stream_destroy(skip);
    ml_token_stream_destroy(s);
    ml_token_buf_deinit(&buf);
}

/* ---- special tokens, lookups, decode errors ------------------------------------------ */

static void test_specials(const ml_tokenizer *tok)
{
    char err[256];
    check(ml_tokenizer_n_ids(tok) == IMAGE_ID + 1, "n_ids %zu", ml_tokenizer_n_ids(tok));
    check(ml_tokenizer_token_id(tok, "<|image|>") == IMAGE_ID, "<|image|> id");
    check(ml_tokenizer_is_special(tok, IMAGE_ID), "<|image|> is special");
    check(ml_tokenizer_token_id(tok, "<|eot_id|>") == EOT_ID, "<|eot_id|> id");
    check(ml_tokenizer_token_id(tok, "<|begin_of_text|>") == 128000, "BOS id");
    check(ml_tokenizer_token_id(tok, "user") == 882, "'user' id");
    check(ml_tokenizer_token_id(tok, "assistant") == 78191, "'assistant' id");
    check(ml_tokenizer_token_id(tok, "\n\n") == 271, "'\\n\\n' id");
    check(ml_tokenizer_token_id(tok, "<|no_such_token|>") == -1, "unknown token");
    check(!ml_tokenizer_is_special(tok, 882), "'user' is not special");
    size_t len;
    const char *b = ml_tokenizer_token_bytes(tok, 271, &len);
    check(b && len == 2 && !memcmp(b, "\n\n", 2), "bytes of 271");
    check(!ml_tokenizer_token_bytes(tok, -5, &len), "bytes of -5");
    check(!ml_tokenizer_token_bytes(tok, IMAGE_ID + 1, &len), "bytes past the end");

    ml_token_buf buf;
    ml_token_buf_init(&buf);
    static const char text[] = "<|image|>Hi<|eot_id|>";
    ml_tokenizer_encode(tok, text, strlen(text), ML_ENCODE_PARSE_SPECIAL, &buf, err, sizeof err);
    check(buf.n == 3 && buf.ids[0] == IMAGE_ID && buf.ids[2] == EOT_ID, "specials parsed");
    buf.n = 0;
    ml_tokenizer_encode(tok, text, strlen(text), 0, &buf, err, sizeof err);
    bool any_special = false;
    for (size_t i = 0; i < buf.n; i++)
        any_special |= ml_tokenizer_is_special(tok, buf.ids[i]);
    check(buf.n > 3 && !any_special, "without PARSE_SPECIAL, special text is plain text");
    char *dec;
    ml_tokenizer_decode(tok, buf.ids, buf.n, 0, &dec, &len, err, sizeof err);
    check(len == strlen(text) && !memcmp(dec, text, len), "plain special text round-trips");
    free(dec);

    /* Encode appends; decode can skip specials. */
    size_t before = buf.n;
    ml_tokenizer_encode(tok, text, strlen(text), ML_ENCODE_PARSE_SPECIAL, &buf, err, sizeof err);
    check(buf.n == before + 3, "encode appends to the buffer");
    ml_tokenizer_decode(tok, buf.ids + before, 3, ML_DECODE_SKIP_SPECIAL, &dec, &len, err,
                        sizeof err);
    check(len == 2 && !memcmp(dec, "Hi", 2), "decode skipping specials");
    free(dec);

    /* Out-of-range ids. */
    int32_t bad[] = {9906, IMAGE_ID + 1};
    check(ml_tokenizer_decode(tok, bad, 2, 0, &dec, &len, err, sizeof err) == ML_ERR_INVALID_ARG,
          "decode rejects id past the end");
    check(strstr(err, "ids[1]") != NULL, "error names the index: %s", err);
    bad[1] = -1;
    check(ml_tokenizer_decode(tok, bad, 2, 0, &dec, &len, err, sizeof err) == ML_ERR_INVALID_ARG,
          "decode rejects a negative id");
    check(ml_tokenizer_decode(tok, bad, 0, 0, &dec, &len, err, sizeof err) == ML_OK && len == 0,
          "decode of nothing");
    free(dec);
    buf.n = 0;
    check(ml_tokenizer_encode(tok, "", 0, 0, &buf, err, sizeof err) == ML_OK && buf.n == 0,
          "encode of nothing");
    ml_token_buf_deinit(&buf);
}

/* ---- invalid UTF-8 --------------------------------------------------------------------- */

static void test_invalid_utf8(const ml_tokenizer *tok)
{
    char err[256];
    static const char *const cases[] = {
        "\xFF", "\xC0\xAF", "abc\x80" "xyz", "\xE0\x80\x80 overlong", "\xED\xA0\x80 surrogate",
        "\xF4\x90\x80\x80 too big", "\xF0\x9F\x98", "tail \xE2\x82", "'\xC5", "\xC3(\xC3\xA9",
        "1\x80" "2\x80" "3", " \xFF\xFE ", "\r\n\xFF\n",
    };
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i]);
        buf.n = 0;
        check(ml_tokenizer_encode(tok, cases[i], n, ML_ENCODE_PARSE_SPECIAL, &buf, err,
                                  sizeof err) == ML_OK,
              "invalid case %zu encodes", i);
        char *dec;
        size_t len;
        ml_tokenizer_decode(tok, buf.ids, buf.n, 0, &dec, &len, err, sizeof err);
        check(len == n && !memcmp(dec, cases[i], n), "invalid case %zu round-trips bytes", i);
        free(dec);
        ml_tokenizer_decode(tok, buf.ids, buf.n, ML_DECODE_REPLACE_INVALID, &dec, &len, err,
                            sizeof err);
        check(ml_tok_utf8_ok((const uint8_t *)dec, len), "invalid case %zu: lossy decode is UTF-8",
              i);
        free(dec);
    }
    /* Python's bytes.decode("utf-8", "replace") on the same bytes. */
    static const char in[] = "a\xF0\x9F\x98" "b\xC0\xAF\xE0\x80" "c\xED\xA0\x80";
    static const char want[] = "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                               "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD";
    buf.n = 0;
    ml_tokenizer_encode(tok, in, strlen(in), 0, &buf, err, sizeof err);
    char *dec;
    size_t len;
    ml_tokenizer_decode(tok, buf.ids, buf.n, ML_DECODE_REPLACE_INVALID, &dec, &len, err,
                        sizeof err);
    check(len == strlen(want) && !memcmp(dec, want, len), "maximal-subpart replacement");
    free(dec);
    ml_token_buf_deinit(&buf);
}

/* ---- concurrency -------------------------------------------------------------------------- */

typedef struct thread_job {
    const ml_tokenizer *tok;
    const golden *g;
    size_t offset;
    size_t mismatches;
} thread_job;

static void *encode_all(void *arg)
{
    thread_job *job = arg;
    ml_token_buf buf;
    ml_token_buf_init(&buf);
    for (size_t k = 0; k < job->g->n; k++) {
        const golden_case *gc = &job->g->cases[(k + job->offset) % job->g->n];
        buf.n = 0;
        if (ml_tokenizer_encode(job->tok, gc->text, gc->text_len, ML_ENCODE_PARSE_SPECIAL, &buf,
                                NULL, 0) != ML_OK ||
            !ids_equal(buf.ids, buf.n, gc->ids, gc->n_ids))
            job->mismatches++;
    }
    ml_token_buf_deinit(&buf);
    return NULL;
}

static void test_threads(const ml_tokenizer *tok, const golden *g)
{
    pthread_t th[N_THREADS];
    thread_job jobs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (thread_job){.tok = tok, .g = g, .offset = (size_t)i * 97};
        check(pthread_create(&th[i], NULL, encode_all, &jobs[i]) == 0, "pthread_create");
    }
    size_t bad = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].mismatches;
    }
    check(bad == 0, "%zu mismatches when encoding from %d threads", bad, N_THREADS);
}

/* ---- loader on synthetic documents ---------------------------------------------------------- */

static const char LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* UTF-8 of the byte-level character standing for byte b (GPT-2 alphabet). */
static void byte_level_char(int b, char out[3])
{
    int cp = b, shifted = 0;
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) {
        for (int x = 0; x < b; x++)
            shifted += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
        cp = 0x100 + shifted;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A tiny Llama-3-shaped tokenizer: the 256 byte tokens (id = byte), "ab" 256,
 * "bc" 257, "abc" 258, added token "<x>" 259 (not special). */
static cJSON *synthetic(bool ignore_merges, bool merges_as_arrays, bool bc_first)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "id", 259);
    cJSON_AddStringToObject(x, "content", "<x>");
    cJSON_AddBoolToObject(x, "special", 0);
    cJSON_AddBoolToObject(x, "normalized", 0);
    cJSON_AddItemToArray(added, x);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *steps = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", LLAMA3_PATTERN);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(steps, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(steps, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char ch[3];
        byte_level_char(b, ch);
        cJSON_AddNumberToObject(vocab, ch, b);
    }
    cJSON_AddNumberToObject(vocab, "ab", 256);
    cJSON_AddNumberToObject(vocab, "bc", 257);
    cJSON_AddNumberToObject(vocab, "abc", 258);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    const char *pairs[2][2] = {{"a", "b"}, {"ab", "c"}};
    if (bc_first) {
        pairs[0][0] = "b", pairs[0][1] = "c";
        pairs[1][0] = "a", pairs[1][1] = "b";
    }
    for (int i = 0; i < 2; i++) {
        if (merges_as_arrays) {
            cJSON *p = cJSON_CreateArray();
            cJSON_AddItemToArray(p, cJSON_CreateString(pairs[i][0]));
            cJSON_AddItemToArray(p, cJSON_CreateString(pairs[i][1]));
            cJSON_AddItemToArray(merges, p);
        } else {
            char s[16];
            snprintf(s, sizeof s, "%s %s", pairs[i][0], pairs[i][1]);
            cJSON_AddItemToArray(merges, cJSON_CreateString(s));
        }
    }
    return root;
}

static ml_status load_json(cJSON *root, ml_tokenizer **tok, char *err, size_t errlen)
{
    char *s = cJSON_PrintUnformatted(root);
    ml_status st = ml_tokenizer_load_buffer(s, strlen(s), "synthetic", tok, err, errlen);
    free(s);
    return st;
}

/* Expected ids from HF `tokenizers` 0.21.4 on the same documents. */
static void test_synthetic_bpe(void)
{
    static const char *const texts[] = {"abc", "bc", "abcabc x", "ab<x>c"};
    struct {
        bool ignore, arrays, bc_first;
        int32_t want[4][6];
        size_t n[4];
    } cases[] = {
        {false, true, false, {{258}, {98, 99}, {258, 258, 32, 120}, {256, 259, 99}}, {1, 2, 4, 3}},
        {true, true, false, {{258}, {257}, {258, 258, 32, 120}, {256, 259, 99}}, {1, 1, 4, 3}},
        {false, false, true, {{97, 257}, {257}, {97, 257, 97, 257, 32, 120}, {256, 259, 99}},
         {2, 1, 6, 3}},
        {true, false, true, {{258}, {257}, {97, 257, 97, 257, 32, 120}, {256, 259, 99}},
         {1, 1, 6, 3}},
    };
    char err[256];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *root = synthetic(cases[c].ignore, cases[c].arrays, cases[c].bc_first);
        ml_tokenizer *tok = NULL;
        check(load_json(root, &tok, err, sizeof err) == ML_OK, "synthetic %zu: %s", c, err);
        cJSON_Delete(root);
        if (!tok)
            continue;
        check(ml_tokenizer_token_id(tok, "<|image|>") == 260, "<|image|> takes the next id");
        ml_token_buf buf;
        ml_token_buf_init(&buf);
        for (size_t t = 0; t < 4; t++) {
            buf.n = 0;
            ml_tokenizer_encode(tok, texts[t], strlen(texts[t]), 0, &buf, err, sizeof err);
            check(ids_equal(buf.ids, buf.n, cases[c].want[t], cases[c].n[t]),
                  "synthetic %zu: '%s'", c, texts[t]);
        }
        ml_token_buf_deinit(&buf);
        ml_tokenizer_destroy(tok);
    }
}

/* Each mutation of a valid document must fail with the given status. */
static void test_loader_errors(void)
{
    char err[256];
    ml_tokenizer *tok = NULL;
    check(ml_tokenizer_load("/nonexistent/tokenizer.json", &tok, err, sizeof err) == ML_ERR_IO,
          "missing file");
    check(ml_tokenizer_load_buffer("{\"model\": [", 11, "x", &tok, err, sizeof err) ==
              ML_ERR_FORMAT,
          "truncated JSON");
    check(ml_tokenizer_load_buffer("[]", 2, "x", &tok, err, sizeof err) == ML_ERR_FORMAT,
          "array document");

    enum { M_NORMALIZER, M_PATTERN, M_LSTRIP, M_BAD_MERGE, M_MISSING_BYTE, M_BAD_ID,
           M_DUP_ID, M_MERGE_SHAPE, M_FALLBACK, M_COUNT };
    static const ml_status want[M_COUNT] = {
        ML_ERR_UNSUPPORTED, ML_ERR_UNSUPPORTED, ML_ERR_UNSUPPORTED, ML_ERR_FORMAT, ML_ERR_FORMAT,
        ML_ERR_FORMAT,      ML_ERR_FORMAT,      ML_ERR_FORMAT,      ML_ERR_UNSUPPORTED,
    };
    for (int m = 0; m < M_COUNT; m++) {
        cJSON *root = synthetic(true, false, false);
        cJSON *model = cJSON_GetObjectItem(root, "model");
        cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
        switch (m) {
        case M_NORMALIZER:
            cJSON_ReplaceItemInObject(root, "normalizer", cJSON_CreateObject());
            break;
        case M_PATTERN: {
            cJSON *split = cJSON_GetArrayItem(
                cJSON_GetObjectItem(cJSON_GetObjectItem(root, "pre_tokenizer"), "pretokenizers"),
                0);
            cJSON_ReplaceItemInObject(cJSON_GetObjectItem(split, "pattern"), "Regex",
                                      cJSON_CreateString("\\s+"));
            break;
        }
        case M_LSTRIP:
            cJSON_AddBoolToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "added_tokens"), 0),
                                  "lstrip", 1);
            break;
        case M_BAD_MERGE:
            cJSON_AddItemToArray(cJSON_GetObjectItem(model, "merges"), cJSON_CreateString("x y"));
            break;
        case M_MISSING_BYTE:
            cJSON_DeleteItemFromObject(vocab, "q");
            break;
        case M_BAD_ID:
            cJSON_ReplaceItemInObject(vocab, "ab", cJSON_CreateNumber(-3));
            break;
        case M_DUP_ID:
            cJSON_ReplaceItemInObject(vocab, "ab", cJSON_CreateNumber(97));
            break;
        case M_MERGE_SHAPE:
            cJSON_AddItemToArray(cJSON_GetObjectItem(model, "merges"), cJSON_CreateNumber(1));
            break;
        case M_FALLBACK:
            cJSON_AddBoolToObject(model, "byte_fallback", 1);
            break;
        }
        err[0] = '\0';
        ml_status st = load_json(root, &tok, err, sizeof err);
        check(st == want[m], "mutation %d: got %s (%s), want %s", m, ml_status_name(st), err,
              ml_status_name(want[m]));
        check(err[0] != '\0', "mutation %d leaves an error message", m);
        cJSON_Delete(root);
    }
    check(tok == NULL, "failed loads leave *out untouched");
}

/* The real file cut short at many points must fail cleanly. */
static void test_truncated_real_file(void)
{
    size_t len;
    char *json = ml_tok_read_file(ML_TOK_REAL_PATH, &len);
    if (!json)
        return;
    char err[256];
    size_t cuts[] = {0, 1, 100, len / 3, len / 2, len - 2};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        /* An allocation of exactly the cut size, so ASan sees any overread. */
        char *cut = malloc(cuts[i] ? cuts[i] : 1);
        memcpy(cut, json, cuts[i]);
        ml_tokenizer *tok = NULL;
        ml_status st = ml_tokenizer_load_buffer(cut, cuts[i], "cut", &tok, err, sizeof err);
        check(st == ML_ERR_FORMAT && !tok, "cut at %zu: %s", cuts[i], ml_status_name(st));
        free(cut);
    }
    free(json);
}

int main(void)
{
    double load_s;
    ml_tokenizer *tok = ml_tok_load(ML_TOK_REAL_PATH, &load_s);
    fprintf(stderr, "  loaded %s in %.3f s\n", ML_TOK_REAL_PATH, load_s);

    golden g = {0};
    if (!load_golden(&g)) {
        fprintf(stderr, "cannot read %s or %s\n", CORPUS_PATH, EXPECTED_PATH);
        ml_tokenizer_destroy(tok);
        return 1;
    }
    test_golden_encode_decode(tok, &g);
    test_golden_stream(tok, &g);
    test_stream_partial_chars(tok);
    test_specials(tok);
    test_invalid_utf8(tok);
    test_threads(tok, &g);
    test_synthetic_bpe();
    test_loader_errors();
    test_truncated_real_file();
    free_golden(&g);
    ml_tokenizer_destroy(tok);
    return check_done();
}
