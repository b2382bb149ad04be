/* JSON mode (engine/grammar/json_mode.h) over the real Llama 3 vocabulary:
 *   1. the recognizer fed byte by byte (through the single-byte tokens) over
 *      valid objects (accepted, complete exactly at the end) and invalid
 *      texts (refused at the right byte, the state unchanged);
 *   2. the trie mask against the per-token check, in scripted states and in
 *      states reached by random walks;
 *   3. random walks over allowed tokens, finished into a complete object,
 *      parse with cJSON as an object and are well-formed UTF-8;
 *   4. complete => nothing allowed; error paths and a small explicit
 *      vocabulary (duplicates, empty and over-long tokens, spare mask bits).
 * Prints the mask time in a few states (not checked). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "grammar/json_mode.h"
#include "test_rand.h"
#include "tokenizer_util.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
/* Llama 3.2's logit count; the tokenizer also has <|image|> = 128256. */
#define N_VOCAB 128256
#define N_WORDS ((N_VOCAB + 63) / 64)
/* A text literal with its length, NULs included. */
#define T(s) s, sizeof(s) - 1
/* Random walks of test 2 (each state compared) and test 3 (run to the end). */
#define N_CMP_WALKS 24
#define CMP_WALK_STEPS 12
#define N_PARSE_WALKS 150
#define PARSE_WALK_MAX_RANDOM 60
/* Finishing a walk takes at most a few steps per open container. */
#define PARSE_WALK_MAX_STEPS (PARSE_WALK_MAX_RANDOM + 8 * ML_JSON_MAX_DEPTH)
#define TEXT_CAP (PARSE_WALK_MAX_STEPS * ML_JSON_MAX_TOKEN_BYTES)
/* Time each measured state for at least this long. */
#define TIME_MIN_SECONDS 0.05

static ml_tokenizer *g_tok;
static ml_json_vocab *g_vocab;
static int32_t g_byte_id[256]; /* the token of each single byte */
static uint64_t g_mask[N_WORDS];
static int32_t *g_allowed_ids; /* owned: N_VOCAB */
static bool *g_structural;     /* owned: N_VOCAB; token has one of "{}[]:, */
static char *g_text;           /* owned: TEXT_CAP */

static bool mask_bit(const uint64_t *mask, size_t id)
{
    return (mask[id >> 6] >> (id & 63)) & 1;
}

static ml_json_state *new_state(void)
{
    ml_json_state *s = NULL;
    char err[256] = "";
    ml_status st = ml_json_state_create(g_vocab, &s, err, sizeof err);
    if (st != ML_OK) {
        fprintf(stderr, "state: %s\n", err);
        exit(1);
    }
    return s;
}

static const char *token_bytes(int32_t id, size_t *len)
{
    const char *b = ml_tokenizer_token_bytes(g_tok, id, len);
    if (!b)
        *len = 0;
    return b;
}

/* ---- 1. the recognizer byte by byte ----------------------------------------- */

/* Feed text[0..len) one single-byte token at a time, checking at each byte
 * that the mask bit, the per-token check and accept agree, and that a
 * refusal leaves the state as it was. Returns the index of the first refused
 * byte, or len. complete_at[i] (when not NULL, len + 1 entries) gets
 * ml_json_state_complete after i bytes. */
static size_t feed(ml_json_state *s, const char *text, size_t len, bool *complete_at,
                   const char *what)
{
    for (size_t i = 0; i < len; i++) {
        if (complete_at)
            complete_at[i] = ml_json_state_complete(s);
        int32_t id = g_byte_id[(uint8_t)text[i]];
        ml_json_state_allowed(s, g_mask);
        bool bit = mask_bit(g_mask, (size_t)id);
        bool allows = ml_json_state_allows(s, id);
        char err[256] = "";
        ml_status st = ml_json_state_accept(s, id, err, sizeof err);
        check(bit == allows && allows == (st == ML_OK),
              "%s: byte %zu (0x%02x): mask %d, allows %d, accept %s", what, i, (uint8_t)text[i],
              bit, allows, ml_status_name(st));
        if (st != ML_OK) {
            check(st == ML_ERR_INVALID_ARG, "%s: accept error '%s'", what, err);
            uint64_t again[N_WORDS];
            ml_json_state_allowed(s, again);
            check(!memcmp(again, g_mask, sizeof again), "%s: a refused token changed the state",
                  what);
            return i;
        }
    }
    if (complete_at)
        complete_at[len] = ml_json_state_complete(s);
    return len;
}

/* len bytes: "{"a": nested once per depth beyond 1 ... "}". array: inner
 * containers are arrays ("[[...]]") rather than objects. */
static size_t nest(char *out, size_t depth, bool array)
{
    size_t n = 0;
    out[n++] = '{';
    for (size_t d = 1; d < depth; d++) {
        if (array) {
            if (d == 1) {
                memcpy(out + n, "\"a\":", 4);
                n += 4;
            }
            out[n++] = '[';
        } else {
            memcpy(out + n, "\"a\":{", 5);
            n += 5;
        }
    }
    for (size_t d = 1; d < depth; d++)
        out[n++] = array ? ']' : '}';
    out[n++] = '}';
    return n;
}

static void test_valid(void)
{
    static const struct {
        const char *text;
        size_t len;
    } valid[] = {
        {T("{}")},
        {T(" \t\r\n{ \t\r\n}")},
        {T("{\"a\":1}")},
        {T("{\"a\":[1,2,3],\"b\":{\"c\":null,\"d\":true,\"e\":false}}")},
        {T("{\"a\":[[[]],{},[{}],[[1],[\"x\"]]],\"b\":{\"c\":{\"d\":{}}}}")},
        {T("{ \"a\" : [ 1 , 2 ] , \"b\" : { } , \"c\" : [ ] }")},
        {T("{\"\":\"\",\"dup\":1,\"dup\":2}")},
        {T("{\"esc\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u0041 \\u00e9 \\uFFFF \\u0000 "
           "\\uD7FF \\uE000 \\ud83d\\ude00 \\uDBFF\\uDFFF \\uD800\\uDC00\"}")},
        {T("{\"\xC3\xA9\":\"\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 \xC2\x80 \xDF\xBF "
           "\xE0\xA0\x80 \xED\x9F\xBF \xEE\x80\x80 \xEF\xBF\xBF \xF0\x90\x80\x80 "
           "\xF4\x8F\xBF\xBF\"}")},
        {T("{\"ascii\":\" !#$%&'()*+,-./0123456789:;<=>?@ABCXYZ[]^_`abcxyz{|}~\x7F\"}")},
        {T("{\"n\":[0,-0,1,-1,10,1234567890,0.5,-0.0,1e5,1E+5,1e-5,0e0,-0.0E-00,"
           "123.456e789,9007199254740993,1.000000000000000000001]}")},
        {T("{\"a\":1 ,\"b\":2\n,\"c\":3.5\t,\"d\":4e4\r}")},
        {T("{\"a\":[0],\"b\":[-0.1],\"c\":[2E2],\"d\":{\"e\":0}}")},
        {T("{\"t\":true,\"f\":false,\"n\":null,\"a\":[true,false,null]}")},
    };
    for (size_t k = 0; k < N_OF(valid); k++) {
        ml_json_state *s = new_state();
        bool complete_at[512];
        size_t len = valid[k].len;
        check(len < N_OF(complete_at), "corpus entry %zu too long", k);
        char what[32];
        snprintf(what, sizeof what, "valid[%zu]", k);
        size_t at = feed(s, valid[k].text, len, complete_at, what);
        check(at == len, "%s: refused at byte %zu: %s", what, at, valid[k].text);
        /* Complete after the last byte, the closing '}', never before. */
        for (size_t i = 0; at == len && i <= len; i++)
            check(complete_at[i] == (i == len), "%s: complete=%d after %zu bytes", what,
                  complete_at[i], i);
        ml_json_state_destroy(s);
    }

    /* Depth: ML_JSON_MAX_DEPTH containers are fine, objects or arrays. */
    char *deep = xmalloc(8 * ML_JSON_MAX_DEPTH);
    for (int array = 0; array <= 1; array++) {
        ml_json_state *s = new_state();
        size_t len = nest(deep, ML_JSON_MAX_DEPTH, array);
        check(feed(s, deep, len, NULL, "max depth") == len && ml_json_state_complete(s),
              "depth %d (array %d) refused", ML_JSON_MAX_DEPTH, array);
        ml_json_state_destroy(s);
    }
    free(deep);
}

static void test_invalid(void)
{
    /* refused: index of the first byte that must be refused; -1 for a prefix
     * that is accepted but not complete. */
    static const struct {
        const char *text;
        size_t len;
        long refused;
    } invalid[] = {
        {T("[1]"), 0},
        {T("1"), 0},
        {T("\"a\""), 0},
        {T("null"), 0},
        {T("\xEF\xBB\xBF{}"), 0}, /* BOM */
        {T("\v{}"), 0},
        {T("{\f}"), 1},
        {T("{'a':1}"), 1},
        {T("{a:1}"), 1},
        {T("{1:2}"), 1},
        {T("{,}"), 1},
        {T("{\"a\" 1}"), 5},
        {T("{\"a\"::1}"), 5},
        {T("{\"a\":}"), 5},
        {T("{\"a\":1,}"), 7},
        {T("{\"a\":[1,]}"), 8},
        {T("{\"a\":[,1]}"), 6},
        {T("{\"a\":1 \"b\":2}"), 7},
        {T("{\"a\":[1}"), 7},
        {T("{\"a\":{]}"), 6},
        {T("{\"a\":1}}"), 7},
        {T("{}{}"), 2},
        {T("{} "), 2}, /* complete: nothing may follow, whitespace included */
        {T("{}\0"), 2},
        {T("{\"a\":01}"), 6},
        {T("{\"a\":-01}"), 7},
        {T("{\"a\":00}"), 6},
        {T("{\"a\":1.}"), 7},
        {T("{\"a\":.5}"), 5},
        {T("{\"a\":+1}"), 5},
        {T("{\"a\":-}"), 6},
        {T("{\"a\":-a}"), 6},
        {T("{\"a\":1e}"), 7},
        {T("{\"a\":1e+}"), 8},
        {T("{\"a\":1.5e3.2}"), 10},
        {T("{\"a\":1x}"), 6},
        {T("{\"a\":0x1F}"), 6},
        {T("{\"a\":1.5.}"), 8},
        {T("{\"a\":Infinity}"), 5},
        {T("{\"a\":NaN}"), 5},
        {T("{\"a\":True}"), 5},
        {T("{\"a\":tru}"), 8},
        {T("{\"a\":nul}"), 8},
        {T("{\"a\":falsey}"), 10},
        {T("{\"a\":\"x\ty\"}"), 7},
        {T("{\"a\":\"x\ny\"}"), 7},
        {T("{\"a\":\"\x1F\"}"), 6},
        {T("{\"a\":\"\0\"}"), 6},
        {T("{\"a\":\"\\x\"}"), 7},
        {T("{\"a\":\"\\'\"}"), 7},
        {T("{\"a\":\"\\U0041\"}"), 7},
        {T("{\"a\":\"\\u12g4\"}"), 10},
        {T("{\"a\":\"\\u12\"}"), 10},
        {T("{\"a\":\"\\uDC00\"}"), 9},
        {T("{\"a\":\"\\udfff\"}"), 9},
        {T("{\"a\":\"\\uD800\"}"), 12},
        {T("{\"a\":\"\\uD800x\"}"), 12},
        {T("{\"a\":\"\\uD800\\n\"}"), 13},
        {T("{\"a\":\"\\uD800\\u0041\"}"), 14},
        {T("{\"a\":\"\\uD800\\uD800\"}"), 15},
        {T("{\"a\":\"\\uDBFF\\uDBFF\"}"), 15},
        {T("{\"a\":\"\x80\"}"), 6},
        {T("{\"a\":\"\xBF\"}"), 6},
        {T("{\"a\":\"\xC0\x80\"}"), 6},
        {T("{\"a\":\"\xC1\xBF\"}"), 6},
        {T("{\"a\":\"\xC3\"}"), 7},
        {T("{\"a\":\"\xC3\x61\"}"), 7}, /* \x61: 'a' */
        {T("{\"a\":\"\xE0\x80\x80\"}"), 7},
        {T("{\"a\":\"\xE0\x9F\xBF\"}"), 7},
        {T("{\"a\":\"\xED\xA0\x80\"}"), 7},
        {T("{\"a\":\"\xED\xBF\xBF\"}"), 7},
        {T("{\"a\":\"\xE2\x82\"}"), 8},
        {T("{\"a\":\"\xF0\x80\x80\x80\"}"), 7},
        {T("{\"a\":\"\xF0\x8F\xBF\xBF\"}"), 7},
        {T("{\"a\":\"\xF4\x90\x80\x80\"}"), 7},
        {T("{\"a\":\"\xF5\x80\x80\x80\"}"), 6},
        {T("{\"a\":\"\xFF\"}"), 6},
        {T("{\"a\":\"\xF0\x9F\x98\"}"), 9},
        {T("{\"\xC3\xA9\":1,\xC3\xA9:1}"), 8},
        {T("{\"a\":1\xC2\xA0}"), 6}, /* U+00A0 is not JSON whitespace */
        {T("{\"a\":1"), -1},
        {T("{\"a\":1.5e"), -1},
        {T("{\"a\":\"x"), -1},
        {T("{\"a\":\"\\uD83D"), -1},
        {T("{\"a\":\"\xF0\x9F"), -1},
        {T("{\"a\":[{}"), -1},
        {T("  "), -1},
    };
    for (size_t k = 0; k < N_OF(invalid); k++) {
        ml_json_state *s = new_state();
        char what[32];
        snprintf(what, sizeof what, "invalid[%zu]", k);
        size_t at = feed(s, invalid[k].text, invalid[k].len, NULL, what);
        long want = invalid[k].refused;
        if (want < 0)
            check(at == invalid[k].len && !ml_json_state_complete(s),
                  "%s: prefix refused at %zu or complete", what, at);
        else
            check(at == (size_t)want, "%s: refused at byte %zu, want %ld", what, at, want);
        ml_json_state_destroy(s);
    }

    /* Whitespace outside strings: ML_JSON_MAX_WHITESPACE in a row, then
     * refused; inside a string it is content, unbounded. */
    char text[3 * ML_JSON_MAX_WHITESPACE + 16];
    size_t n = 0;
    text[n++] = '{';
    memset(text + n, '\n', ML_JSON_MAX_WHITESPACE);
    n += ML_JSON_MAX_WHITESPACE;
    text[n++] = '"';
    memset(text + n, ' ', 2 * ML_JSON_MAX_WHITESPACE);
    n += 2 * ML_JSON_MAX_WHITESPACE;
    text[n++] = '"';
    text[n++] = ':';
    ml_json_state *ws = new_state();
    check(feed(ws, text, n, NULL, "whitespace") == n, "whitespace runs at the limit refused");
    memset(text, ' ', ML_JSON_MAX_WHITESPACE + 1);
    check(feed(ws, text, ML_JSON_MAX_WHITESPACE + 1, NULL, "whitespace") == ML_JSON_MAX_WHITESPACE,
          "whitespace past the limit accepted");
    ml_json_state_destroy(ws);

    /* One container past the limit is refused at its opening byte. */
    char *deep = xmalloc(8 * ML_JSON_MAX_DEPTH + 16);
    for (int array = 0; array <= 1; array++) {
        ml_json_state *s = new_state();
        size_t len = nest(deep, ML_JSON_MAX_DEPTH + 1, array);
        size_t open = array ? 4 + ML_JSON_MAX_DEPTH : 5 * ML_JSON_MAX_DEPTH;
        check(deep[open] == (array ? '[' : '{'), "nest layout");
        size_t at = feed(s, deep, len, NULL, "over depth");
        check(at == open, "depth %d (array %d): refused at %zu, want %zu", ML_JSON_MAX_DEPTH + 1,
              array, at, open);
        ml_json_state_destroy(s);
    }
    free(deep);
}

/* ---- 2. trie mask = per-token check ------------------------------------------ */

/* Compare the mask with ml_json_state_allows for every id (and the spare
 * bits). Returns the number of allowed ids. */
static size_t check_mask(ml_json_state *s, const char *what)
{
    ml_json_state_allowed(s, g_mask);
    size_t n_allowed = 0, bad = 0;
    long first = -1;
    for (size_t id = 0; id < 64 * (size_t)N_WORDS; id++) {
        bool bit = mask_bit(g_mask, id);
        bool want = id < N_VOCAB && ml_json_state_allows(s, (int32_t)id);
        n_allowed += bit;
        if (bit != want) {
            bad++;
            if (first < 0)
                first = (long)id;
        }
    }
    check(bad == 0, "%s: %zu ids differ from the per-token check, first %ld", what, bad, first);
    return n_allowed;
}

/* Collect the allowed ids of g_mask into g_allowed_ids; returns their count. */
static size_t allowed_ids(void)
{
    size_t n = 0;
    for (size_t w = 0; w < N_WORDS; w++)
        for (uint64_t bits = g_mask[w]; bits; bits &= bits - 1)
            g_allowed_ids[n++] = (int32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
    return n;
}

/* One of the n allowed ids in g_allowed_ids (allowed_ids), at random,
 * preferring ones that move through the grammar: half the time a structural
 * one when there is any, a quarter a short one, else any. -1 when none. */
static int32_t pick_random(size_t n)
{
    if (n == 0)
        return -1;
    double u = urand();
    size_t n_pref = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        token_bytes(g_allowed_ids[i], &len);
        bool pref = u < 0.5 ? g_structural[g_allowed_ids[i]] : u < 0.75 ? len <= 2 : true;
        if (pref)
            g_allowed_ids[n_pref++] = g_allowed_ids[i];
    }
    if (n_pref == 0)
        n_pref = allowed_ids();
    return g_allowed_ids[irand((int)n_pref)];
}

static void test_mask_scripted(void)
{
    static const struct {
        const char *text;
        size_t len;
    } prefixes[] = {
        {T("")},
        {T(" \n")},
        {T("{")},
        {T("{\"k")},
        {T("{\"k\\")},
        {T("{\"k\\u00")},
        {T("{\"k\"")},
        {T("{\"k\" ")},
        {T("{\"k\":")},
        {T("{\"k\":-")},
        {T("{\"k\":0")},
        {T("{\"k\":12")},
        {T("{\"k\":1.")},
        {T("{\"k\":1.5")},
        {T("{\"k\":1e")},
        {T("{\"k\":1e-")},
        {T("{\"k\":1e5")},
        {T("{\"k\":t")},
        {T("{\"k\":fal")},
        {T("{\"k\":\"")},
        {T("{\"k\":\"ab")},
        {T("{\"k\":\"\\")},
        {T("{\"k\":\"\\u")},
        {T("{\"k\":\"\\uD")},
        {T("{\"k\":\"\\u12")},
        {T("{\"k\":\"\\uD834")},
        {T("{\"k\":\"\\uD834\\")},
        {T("{\"k\":\"\\uD834\\u")},
        {T("{\"k\":\"\\uD834\\uD")},
        {T("{\"k\":\"\\uD834\\uDD")},
        {T("{\"k\":\"\xC3")},
        {T("{\"k\":\"\xE0")},
        {T("{\"k\":\"\xE2\x82")},
        {T("{\"k\":\"\xED")},
        {T("{\"k\":\"\xF0")},
        {T("{\"k\":\"\xF0\x9F")},
        {T("{\"k\":\"\xF4")},
        {T("{\"k\":[")},
        {T("{\"k\":[1")},
        {T("{\"k\":[1,")},
        {T("{\"k\":[\"x\"")},
        {T("{\"k\":[\"x")},
        {T("{\"k\":[\"\\")},
        {T("{\"k\":{")},
        {T("{\"k\":1,")},
        {T("{\"k\":\"v\"")},
        {T("{\"k\":\"v\" ")},
        {T("{\"k\":{\"j\":[]")},
        {T("{}")},
    };
    for (size_t k = 0; k < N_OF(prefixes); k++) {
        ml_json_state *s = new_state();
        char what[64];
        snprintf(what, sizeof what, "prefix[%zu]", k);
        check(feed(s, prefixes[k].text, prefixes[k].len, NULL, what) == prefixes[k].len,
              "%s refused", what);
        size_t n = check_mask(s, what);
        check(ml_json_state_complete(s) ? n == 0 : n > 0, "%s: %zu allowed", what, n);
        ml_json_state_destroy(s);
    }

    /* At the depth limit, inside the deepest container. */
    char *deep = xmalloc(8 * ML_JSON_MAX_DEPTH);
    for (int array = 0; array <= 1; array++) {
        ml_json_state *s = new_state();
        size_t len = nest(deep, ML_JSON_MAX_DEPTH, array);
        size_t open = len - ML_JSON_MAX_DEPTH; /* just before the closers */
        feed(s, deep, open, NULL, "deep");
        check_mask(s, array ? "deepest array" : "deepest object");
        ml_json_state_destroy(s);
    }
    free(deep);
}

static void test_mask_random(void)
{
    size_t n_states = 0;
    for (int w = 0; w < N_CMP_WALKS; w++) {
        ml_json_state *s = new_state();
        for (int step = 0; step < CMP_WALK_STEPS; step++) {
            char what[64];
            snprintf(what, sizeof what, "walk %d step %d", w, step);
            size_t n = check_mask(s, what);
            n_states++;
            int32_t id = pick_random(allowed_ids());
            check((id < 0) == (n == 0), "%s: pick", what);
            if (id < 0)
                break;
            char err[256] = "";
            check(ml_json_state_accept(s, id, err, sizeof err) == ML_OK, "%s: accept %d: %s", what,
                  (int)id, err);
        }
        ml_json_state_destroy(s);
    }
    fprintf(stderr, "  mask = per-token check in %zu random-walk states\n", n_states);
}

/* ---- 3. random walks finished into an object parse with cJSON ------------------ */

/* A step toward completion: the first allowed of these single bytes (close
 * the string, then containers; what numbers, escapes and surrogate pairs
 * need next), else any allowed non-whitespace byte, else whitespace. */
static int32_t pick_finishing(ml_json_state *s)
{
    static const char order[] = "\"}]:0\\uDC";
    for (const char *c = order; *c; c++)
        if (ml_json_state_allows(s, g_byte_id[(uint8_t)*c]))
            return g_byte_id[(uint8_t)*c];
    int32_t ws = -1;
    for (int b = 0; b < 256; b++) {
        if (!ml_json_state_allows(s, g_byte_id[b]))
            continue;
        if (b != ' ' && b != '\t' && b != '\n' && b != '\r')
            return g_byte_id[b];
        ws = g_byte_id[b];
    }
    return ws;
}

static void test_walks_parse(void)
{
    size_t n_ok = 0, total_len = 0, max_len = 0;
    for (int w = 0; w < N_PARSE_WALKS; w++) {
        ml_json_state *s = new_state();
        size_t len = 0;
        int n_random = irand(PARSE_WALK_MAX_RANDOM + 1);
        int step = 0;
        for (; step < PARSE_WALK_MAX_STEPS && !ml_json_state_complete(s); step++) {
            int32_t id;
            if (step < n_random) {
                ml_json_state_allowed(s, g_mask);
                id = pick_random(allowed_ids());
            } else {
                id = pick_finishing(s);
            }
            if (id < 0)
                break;
            char err[256] = "";
            if (ml_json_state_accept(s, id, err, sizeof err) != ML_OK) {
                check(0, "walk %d: accept %d: %s", w, (int)id, err);
                break;
            }
            size_t n = 0;
            const char *b = token_bytes(id, &n);
            memcpy(g_text + len, b, n);
            len += n;
        }
        check(ml_json_state_complete(s), "walk %d: not complete after %d steps: %.*s", w, step,
              (int)len, g_text);

        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(g_text, len, &end, false);
        bool ok = j && cJSON_IsObject(j) && end;
        while (ok && end < g_text + len && strchr(" \t\n\r", *end) && *end)
            end++;
        ok = ok && end == g_text + len;
        check(ok, "walk %d: cJSON refuses %.*s", w, (int)len, g_text);
        check(ml_tok_utf8_ok((const uint8_t *)g_text, len), "walk %d: ill-formed UTF-8", w);
        cJSON_Delete(j);
        n_ok += ok;
        total_len += len;
        if (len > max_len)
            max_len = len;
        if (w < 3)
            fprintf(stderr, "  walk %d: %.*s\n", w, (int)(len < 300 ? len : 300), g_text);

        /* 4. complete => nothing allowed. */
        if (ml_json_state_complete(s)) {
            ml_json_state_allowed(s, g_mask);
            bool zero = true;
            for (size_t i = 0; i < N_WORDS; i++)
                zero &= g_mask[i] == 0;
            check(zero, "walk %d: complete but some token allowed", w);
            check(!ml_json_state_allows(s, g_byte_id[' ']), "walk %d: ' ' allowed", w);
            check(ml_json_state_accept(s, g_byte_id['\n'], NULL, 0) == ML_ERR_INVALID_ARG,
                  "walk %d: accept after complete", w);
        }
        ml_json_state_destroy(s);
    }
    fprintf(stderr, "  %zu/%d random objects parse with cJSON (mean %zu bytes, max %zu)\n", n_ok,
            N_PARSE_WALKS, total_len / N_PARSE_WALKS, max_len);
}

/* ---- 4. error paths, a small explicit vocabulary ------------------------------- */

static void test_api(void)
{
    char err[256] = "";
    ml_json_vocab *v = NULL;
    check(ml_json_vocab_create(NULL, N_VOCAB, &v, err, sizeof err) == ML_ERR_INVALID_ARG,
          "NULL tokenizer");
    check(ml_json_vocab_create(g_tok, 0, &v, err, sizeof err) == ML_ERR_INVALID_ARG, "n_vocab 0");
    check(v == NULL, "out untouched on error");
    check(ml_json_vocab_n_vocab(g_vocab) == N_VOCAB, "n_vocab");
    check(ml_json_vocab_mask_words(g_vocab) == N_WORDS, "mask words");

    ml_json_state *s = new_state();
    int32_t eot = ml_tokenizer_token_id(g_tok, "<|eot_id|>");
    int32_t image = ml_tokenizer_token_id(g_tok, "<|image|>");
    check(eot >= 0 && image == N_VOCAB, "eot %d, image %d", (int)eot, (int)image);
    int32_t never[] = {-1, eot, image, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < N_OF(never); i++) {
        check(!ml_json_state_allows(s, never[i]), "id %d allowed", (int)never[i]);
        check(ml_json_state_accept(s, never[i], err, sizeof err) == ML_ERR_INVALID_ARG, "accept %d",
              (int)never[i]);
    }
    /* Whitespace may follow the object inside the token that closes it. */
    static const struct {
        const char *text;
        bool allowed;
    } closers[] = {{"}\n", true}, {"}\n\n", true}, {" }", true}, {"},", false}, {"}}", false}};
    for (size_t i = 0; i < N_OF(closers); i++) {
        int32_t id = ml_tokenizer_token_id(g_tok, closers[i].text);
        check(id >= 0, "no token for closer %zu", i);
        ml_json_state_reset(s);
        feed(s, T("{\"a\":1"), NULL, "closer");
        check(ml_json_state_allows(s, id) == closers[i].allowed, "closer %zu allowed", i);
        if (closers[i].allowed)
            check(ml_json_state_accept(s, id, err, sizeof err) == ML_OK &&
                      ml_json_state_complete(s),
                  "closer %zu: %s", i, err);
    }
    ml_json_state_reset(s);

    /* reset returns to the start. */
    feed(s, T("{\"a\":"), NULL, "reset");
    ml_json_state_reset(s);
    check(feed(s, T("{}"), NULL, "after reset") == 2 && ml_json_state_complete(s), "reset");
    ml_json_state_destroy(s);
    ml_json_state_destroy(NULL);
    ml_json_vocab_destroy(NULL);

    /* A small table: duplicates (both allowed), an empty and a NULL token
     * (never), ids past the table (never), spare bits of the last word clear. */
    enum { SMALL_VOCAB = 70 };
    const char *bytes[SMALL_VOCAB] = {"{",      "}", "{}",  "{}",  "",     NULL,  " {", "\"",
                                      "\"a\":", "1", "}\n", "{\"", "\x80", "\"}", "]"};
    size_t lens[SMALL_VOCAB] = {0};
    for (size_t i = 0; i < SMALL_VOCAB; i++)
        lens[i] = bytes[i] ? strlen(bytes[i]) : 0;
    lens[5] = 7; /* NULL bytes with a length: still never allowed */
    check(ml_json_vocab_create_from_bytes(bytes, lens, SMALL_VOCAB, &v, err, sizeof err) == ML_OK,
          "small vocab: %s", err);
    check(ml_json_state_create(v, &s, err, sizeof err) == ML_OK, "small state: %s", err);
    uint64_t mask[2];
    ml_json_state_allowed(s, mask);
    check(mask[0] == ((1ull << 0) | (1ull << 2) | (1ull << 3) | (1ull << 6) | (1ull << 11)) &&
              mask[1] == 0,
          "small start mask %016llx %016llx", (unsigned long long)mask[0],
          (unsigned long long)mask[1]);
    check(ml_json_state_accept(s, 11, err, sizeof err) == ML_OK, "{\": %s", err);
    ml_json_state_allowed(s, mask);
    /* Inside the key: every token without a control or non-UTF-8 byte, and
     * those that close the key ('"', '{"'), but not those that go on past
     * it ('"a":', '"}'). */
    check(mask[0] == ((1ull << 0) | (1ull << 1) | (1ull << 2) | (1ull << 3) | (1ull << 6) |
                      (1ull << 7) | (1ull << 9) | (1ull << 11) | (1ull << 14)) &&
              mask[1] == 0,
          "small in-key mask %016llx", (unsigned long long)mask[0]);
    ml_json_state_destroy(s);
    ml_json_vocab_destroy(v);

    static char long_token[ML_JSON_MAX_TOKEN_BYTES + 1];
    memset(long_token, ' ', sizeof long_token);
    const char *one[1] = {long_token};
    size_t one_len[1] = {sizeof long_token};
    check(ml_json_vocab_create_from_bytes(one, one_len, 1, &v, err, sizeof err) ==
              ML_ERR_UNSUPPORTED,
          "over-long token");
    one_len[0] = ML_JSON_MAX_TOKEN_BYTES;
    check(ml_json_vocab_create_from_bytes(one, one_len, 1, &v, err, sizeof err) == ML_OK,
          "longest token: %s", err);
    ml_json_vocab_destroy(v);
}

/* ---- timing ------------------------------------------------------------------ */

static void time_masks(void)
{
    static const struct {
        const char *what;
        const char *text;
        size_t len;
    } states[] = {
        {"start", T("")},
        {"after '{'", T("{")},
        {"after a key", T("{\"key\"")},
        {"after ':'", T("{\"key\":")},
        {"inside a string", T("{\"key\":\"some text")},
        {"inside a key", T("{\"ke")},
        {"inside a number", T("{\"key\":12")},
        {"after a value", T("{\"key\":\"v\"")},
        {"in a UTF-8 char", T("{\"key\":\"\xE2")},
        {"after a backslash", T("{\"key\":\"\\")},
    };
    for (size_t k = 0; k < N_OF(states); k++) {
        ml_json_state *s = new_state();
        feed(s, states[k].text, states[k].len, NULL, states[k].what);
        int reps = 0;
        double t0 = ml_tok_now(), t;
        do {
            ml_json_state_allowed(s, g_mask);
            reps++;
            t = ml_tok_now() - t0;
        } while (t < TIME_MIN_SECONDS);
        size_t n = allowed_ids();
        fprintf(stderr, "  mask %-18s %8.1f us  (%zu allowed)\n", states[k].what, 1e6 * t / reps,
                n);
        ml_json_state_destroy(s);
    }
    ml_json_state *s = new_state();
    feed(s, T("{\"key\":\"some text"), NULL, "brute");
    double t0 = ml_tok_now();
    size_t n = 0;
    for (int32_t id = 0; id < N_VOCAB; id++)
        n += (size_t)ml_json_state_allows(s, id);
    fprintf(stderr, "  per-token check of all ids, inside a string: %.1f us (%zu allowed)\n",
            1e6 * (ml_tok_now() - t0), n);
    ml_json_state_destroy(s);
}

int main(void)
{
    double load_s = 0;
    g_tok = ml_tok_load(ML_TOK_REAL_PATH, &load_s);
    char err[256] = "";
    double t0 = ml_tok_now();
    if (ml_json_vocab_create(g_tok, N_VOCAB, &g_vocab, err, sizeof err) != ML_OK) {
        fprintf(stderr, "json vocab: %s\n", err);
        return 1;
    }
    fprintf(stderr, "  tokenizer %.3f s, json vocab %.1f ms\n", load_s, 1e3 * (ml_tok_now() - t0));
    g_allowed_ids = xmalloc(N_VOCAB * sizeof *g_allowed_ids);
    g_structural = xmalloc(N_VOCAB * sizeof *g_structural);
    g_text = xmalloc(TEXT_CAP);
    for (int b = 0; b < 256; b++)
        g_byte_id[b] = -1;
    for (int32_t id = 0; id < N_VOCAB; id++) {
        size_t len = 0;
        const char *b = token_bytes(id, &len);
        g_structural[id] = false;
        for (size_t i = 0; i < len; i++)
            g_structural[id] |= strchr("\"{}[]:,", b[i]) && b[i];
        if (len == 1 && !ml_tokenizer_is_special(g_tok, id))
            g_byte_id[(uint8_t)b[0]] = id;
    }
    for (int b = 0; b < 256; b++)
        if (g_byte_id[b] < 0) {
            fprintf(stderr, "no single-byte token for 0x%02x\n", b);
            return 1;
        }

    test_valid();
    test_invalid();
    test_mask_scripted();
    test_mask_random();
    test_walks_parse();
    test_api();
    time_masks();

    free(g_allowed_ids);
    free(g_structural);
    free(g_text);
    ml_json_vocab_destroy(g_vocab);
    ml_tokenizer_destroy(g_tok);
    return check_done();
}
