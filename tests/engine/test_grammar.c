/* The grammar at run time (engine/grammar/grammar.c) on hand-built tables,
 * independent of the schema compiler:
 *   1. a recursive grammar (nested lists of 1, machine 0 calling itself):
 *      documents accepted byte by byte, refusals at the right byte, the depth
 *      bound (a state never allows a byte it could not complete from), the
 *      whitespace bound outside strings and none inside;
 *   2. the trie mask against the per-token check, at every prefix of the
 *      documents, with multi-byte tokens that call and return within
 *      themselves, and from the mask cache (a second state, same answers);
 *   3. accept leaves the state unchanged on refusal; reset; references;
 *   4. on the real Llama 3 vocabulary, strings written in one form per
 *      character (restated here from lexemes.h, independently of grammar.c's
 *      shortcut for such strings), with length limits or without the letter
 *      x: the mask against the per-token check for every id, inside the
 *      string, after a backslash, inside \u escapes and UTF-8 characters,
 *      at and near the limits. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "harness.h"
#include "tokenizer_util.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The states of the list grammar: value := "1" | "[" ws (value ws ("," ws
 * value ws)*)? "]", with each element a call of the value machine. */
enum { V_START, V_DONE, V_OPEN, V_ELEM, V_COMMA, V_QUOTE, V_STR, N_STATES };

static void edge(ml_grammar *g, uint32_t from, const char *bytes, uint32_t to)
{
    for (const char *b = bytes; *b; b++)
        g->next[(size_t)from * g->n_classes + g->byte_class[(uint8_t)*b]] = to;
}

/* value also admits a string "[a ]*" (inside it, spaces are content). */
static ml_grammar *list_grammar(void)
{
    ml_grammar *g = ml_grammar_alloc(N_STATES, 256, 1);
    if (!g)
        return NULL;
    for (int b = 0; b < 256; b++)
        g->byte_class[b] = (uint8_t)b;
    memset(g->next, 0xff, (size_t)N_STATES * 256 * sizeof *g->next);
    const uint32_t call = ML_GRAMMAR_CALL | 0;
    g->calls[0] = (ml_grammar_call){.enter = V_START, .ret = V_ELEM};
    edge(g, V_START, "1", V_DONE);
    edge(g, V_START, "[", V_OPEN);
    edge(g, V_START, "\"", V_QUOTE);
    edge(g, V_OPEN, " ", V_OPEN);
    edge(g, V_OPEN, "]", V_DONE);
    edge(g, V_OPEN, "1[\"", call);
    edge(g, V_ELEM, " ", V_ELEM);
    edge(g, V_ELEM, ",", V_COMMA);
    edge(g, V_ELEM, "]", V_DONE);
    edge(g, V_COMMA, " ", V_COMMA);
    edge(g, V_COMMA, "1[\"", call);
    edge(g, V_QUOTE, "a ", V_STR);
    edge(g, V_QUOTE, "\"", V_DONE);
    edge(g, V_STR, "a ", V_STR);
    edge(g, V_STR, "\"", V_DONE);
    g->flags[V_DONE] = ML_GRAMMAR_ACCEPT;
    g->flags[V_QUOTE] = g->flags[V_STR] = ML_GRAMMAR_IN_STRING;
    g->need[V_COMMA] = 1; /* an element must follow: one call */
    g->start = V_START;
    return g;
}

/* Single bytes, and longer tokens that open, call, return and close. */
static const char *const vocab_text[] = {
    "1", "[", "]", ",", " ", "\"", "a", "x", "[[", "]]", "1,", ", ", "  ", "\"a", "a\"",
    "1]", "],[", "[1, 1]", "[\"a a\"]", "    ", "]]]]", "[[[[",
};

static ml_json_vocab *g_vocab;
static size_t g_n_words;

static int32_t byte_token(uint8_t b)
{
    for (size_t i = 0; i < N_OF(vocab_text); i++)
        if (strlen(vocab_text[i]) == 1 && (uint8_t)vocab_text[i][0] == b)
            return (int32_t)i;
    return -1;
}

/* Feed text byte by byte; returns the bytes accepted. */
static size_t feed(ml_grammar_state *s, const char *text)
{
    size_t i = 0;
    for (; text[i]; i++) {
        int32_t id = byte_token((uint8_t)text[i]);
        if (id < 0 || ml_grammar_state_accept(s, id, NULL, 0) != ML_OK)
            break;
    }
    return i;
}

/* The mask of s against ml_grammar_state_allows for every id; returns the
 * disagreements. */
static size_t check_mask(ml_grammar_state *s, const char *what)
{
    uint64_t mask[1] = {0};
    size_t count = ml_grammar_state_allowed(s, mask);
    size_t bad = 0, set = 0;
    for (size_t id = 0; id < N_OF(vocab_text); id++) {
        bool bit = (mask[0] >> id) & 1;
        set += bit;
        bad += bit != (bool)ml_grammar_state_allows(s, (int32_t)id);
    }
    bad += set != count || (mask[0] >> N_OF(vocab_text)) != 0;
    check(bad == 0, "%s: mask disagrees with the per-token check", what);
    return bad;
}

static void test_documents(ml_grammar *g)
{
    static const char *const valid[] = {
        "1", "[]", "[1]", "[ 1 , [ ] , [[1,1]] ]", "[\"a a\", \"\"]", "\"  a  \"",
    };
    for (size_t k = 0; k < N_OF(valid); k++) {
        ml_grammar_state *s = NULL;
        check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
        size_t n = strlen(valid[k]);
        for (size_t i = 0; i <= n; i++) {
            char what[96];
            snprintf(what, sizeof what, "'%s' after %zu bytes", valid[k], i);
            check_mask(s, what);
            check(ml_grammar_state_complete(s) == (i == n), "%s: complete", what);
            if (i < n)
                check(feed(s, (char[]){valid[k][i], 0}) == 1, "%s: next byte", what);
        }
        ml_grammar_state_destroy(s);
    }
    static const struct {
        const char *text;
        size_t refused_at;
    } invalid[] = {
        {"[1,]", 3}, {"[1 1]", 3}, {"]", 0}, {"1 ", 1}, {"[,", 1}, {"\"x", 1}, {"1]", 1},
    };
    for (size_t k = 0; k < N_OF(invalid); k++) {
        ml_grammar_state *s = NULL;
        check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
        check(feed(s, invalid[k].text) == invalid[k].refused_at, "'%s' refused at byte %zu",
              invalid[k].text, invalid[k].refused_at);
        check_mask(s, invalid[k].text);
        ml_grammar_state_destroy(s);
    }
}

/* The outermost list runs at depth 0 and each element is one call deeper:
 * ML_GRAMMAR_MAX_DEPTH + 1 nested lists fit, and the innermost may hold no
 * element (it would be one call too deep), but may close. */
static void test_depth(ml_grammar *g)
{
    char text[ML_GRAMMAR_MAX_DEPTH + 2];
    memset(text, '[', ML_GRAMMAR_MAX_DEPTH + 1);
    text[ML_GRAMMAR_MAX_DEPTH + 1] = 0;
    ml_grammar_state *s = NULL;
    check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
    check(feed(s, text) == ML_GRAMMAR_MAX_DEPTH + 1u, "%d nested lists open",
          ML_GRAMMAR_MAX_DEPTH + 1);
    check(!ml_grammar_state_allows(s, byte_token('[')) &&
              !ml_grammar_state_allows(s, byte_token('1')) &&
              !ml_grammar_state_allows(s, byte_token('"')),
          "no element past the depth bound");
    check(ml_grammar_state_allows(s, byte_token(']')), "the innermost list may close");
    check_mask(s, "at the depth bound");
    check(feed(s, "], [") == 4, "another innermost list");
    check(!ml_grammar_state_allows(s, byte_token('1')), "still no element there");
    check_mask(s, "at the depth bound again");
    for (int i = 0; i <= ML_GRAMMAR_MAX_DEPTH; i++)
        check(feed(s, "]") == 1, "closing");
    check(ml_grammar_state_complete(s), "complete after closing every list");
    ml_grammar_state_destroy(s);
}

static void test_whitespace(ml_grammar *g)
{
    ml_grammar_state *s = NULL;
    check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
    check(feed(s, "[") == 1, "open");
    for (int i = 0; i < ML_JSON_MAX_WHITESPACE; i++)
        check(feed(s, " ") == 1, "space %d of the run", i + 1);
    check(!ml_grammar_state_allows(s, byte_token(' ')), "a run over the bound is refused");
    check_mask(s, "at the whitespace bound");
    check(feed(s, "\"") == 1, "a string resets the run");
    for (int i = 0; i < 3 * ML_JSON_MAX_WHITESPACE; i++)
        check(feed(s, " ") == 1, "space %d inside a string", i + 1);
    check(feed(s, "\"]") == 2 && ml_grammar_state_complete(s), "closed");
    ml_grammar_state_reset(s);
    check(!ml_grammar_state_complete(s) && feed(s, "1") == 1 && ml_grammar_state_complete(s),
          "reset starts a new document");
    ml_grammar_state_destroy(s);
}

/* Two states walking the same path: the second finds the first's masks. */
static void test_cache(ml_grammar *g)
{
    const char *text = "[[1, [\"a\"]], 1]";
    for (int round = 0; round < 2; round++) {
        ml_grammar_state *s = NULL;
        check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
        for (size_t i = 0; text[i]; i++) {
            char what[64];
            snprintf(what, sizeof what, "round %d, byte %zu", round, i);
            check_mask(s, what);
            feed(s, (char[]){text[i], 0});
        }
        ml_grammar_state_destroy(s);
    }
    check(ml_grammar_bytes(g) > (size_t)N_STATES * 256 * sizeof(uint32_t), "bytes counts the cache");
}

static void test_refusal_keeps_state(ml_grammar *g)
{
    ml_grammar_state *s = NULL;
    check(ml_grammar_state_create(g, g_vocab, &s, NULL, 0) == ML_OK, "create");
    char err[128] = "";
    check(feed(s, "[1") == 2, "prefix");
    check(ml_grammar_state_accept(s, byte_token('x'), err, sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "refused"),
          "x refused: %s", err);
    check(ml_grammar_state_accept(s, -1, err, sizeof err) == ML_ERR_INVALID_ARG,
          "a negative id is refused");
    check(ml_grammar_state_accept(s, (int32_t)N_OF(vocab_text), err, sizeof err) ==
              ML_ERR_INVALID_ARG,
          "an id past the vocabulary is refused");
    check(feed(s, "]") == 1 && ml_grammar_state_complete(s), "the state was unchanged");
    ml_grammar_state_destroy(s);
}

/* ---- strings on the real vocabulary ------------------------------------------ */

/* "..." with every character in lexemes.h's one form: raw UTF-8 (shortest
 * form, no surrogates) except " \ and the controls, written \" \\ \b \f \n
 * \r \t or \u00XX (lower-case hex) for the other controls; at least min_len
 * and at most max_len characters (max_len < 0: no limit), and, unless
 * allow_x, no letter x. The states of one character position: */
enum {
    S_CHAR, S_ESC, S_U, S_U0, S_U00, S_U000, S_U001, S_C1, S_C2, S_C3, S_E0, S_ED, S_F0, S_F4,
    N_POS
};
/* Then the layers: layer l holds the states after l characters begun. */
enum { S_START, S_DONE, S_LAYERS };

typedef struct string_builder {
    ml_grammar *g;
    int n_layers;
} string_builder;

static uint32_t pos_state(const string_builder *b, int layer, int pos)
{
    return S_LAYERS + (uint32_t)(layer * N_POS + pos);
}

static void range(ml_grammar *g, uint32_t from, int lo, int hi, uint32_t to)
{
    for (int c = lo; c <= hi; c++)
        g->next[(size_t)from * g->n_classes + (uint32_t)c] = to;
}

/* An edge of layer l from position p: from S_CHAR a character begins (the
 * next layer, or this one when there is no limit). */
static void pos_range(const string_builder *b, int l, int p, int lo, int hi, int to)
{
    int into = p == S_CHAR && b->n_layers > 1 ? l + 1 : l;
    range(b->g, pos_state(b, l, p), lo, hi, pos_state(b, into, to));
}

static ml_grammar *string_grammar(int min_len, int max_len, bool allow_x)
{
    string_builder b = {.n_layers = max_len < 0 ? 1 : max_len + 1};
    uint32_t n_states = S_LAYERS + (uint32_t)(b.n_layers * N_POS);
    ml_grammar *g = b.g = ml_grammar_alloc(n_states, 256, 0);
    if (!g)
        return NULL;
    for (int c = 0; c < 256; c++)
        g->byte_class[c] = (uint8_t)c;
    memset(g->next, 0xff, (size_t)n_states * 256 * sizeof *g->next);
    range(g, S_START, '"', '"', pos_state(&b, 0, S_CHAR));
    for (int l = 0; l < b.n_layers; l++) {
        if (l >= min_len || max_len < 0)
            range(g, pos_state(&b, l, S_CHAR), '"', '"', S_DONE);
        for (int p = 0; p < N_POS; p++)
            g->flags[pos_state(&b, l, p)] = ML_GRAMMAR_IN_STRING;
        if (max_len >= 0 && l == max_len)
            continue; /* no character begins here */
        pos_range(&b, l, S_CHAR, 0x20, 0x7f, S_CHAR);
        range(g, pos_state(&b, l, S_CHAR), '"', '"',
              l >= min_len || max_len < 0 ? S_DONE : ML_GRAMMAR_DEAD);
        if (!allow_x)
            range(g, pos_state(&b, l, S_CHAR), 'x', 'x', ML_GRAMMAR_DEAD);
        pos_range(&b, l, S_CHAR, '\\', '\\', S_ESC);
        pos_range(&b, l, S_CHAR, 0xc2, 0xdf, S_C1);
        pos_range(&b, l, S_CHAR, 0xe0, 0xe0, S_E0);
        pos_range(&b, l, S_CHAR, 0xe1, 0xec, S_C2);
        pos_range(&b, l, S_CHAR, 0xed, 0xed, S_ED);
        pos_range(&b, l, S_CHAR, 0xee, 0xef, S_C2);
        pos_range(&b, l, S_CHAR, 0xf0, 0xf0, S_F0);
        pos_range(&b, l, S_CHAR, 0xf1, 0xf3, S_C3);
        pos_range(&b, l, S_CHAR, 0xf4, 0xf4, S_F4);
    }
    /* Inside a character: the layer where it began. */
    for (int l = 0; l < b.n_layers; l++) {
        for (const char *e = "\"\\bfnrt"; *e; e++)
            pos_range(&b, l, S_ESC, *e, *e, S_CHAR);
        pos_range(&b, l, S_ESC, 'u', 'u', S_U);
        pos_range(&b, l, S_U, '0', '0', S_U0);
        pos_range(&b, l, S_U0, '0', '0', S_U00);
        pos_range(&b, l, S_U00, '0', '0', S_U000);
        pos_range(&b, l, S_U00, '1', '1', S_U001);
        pos_range(&b, l, S_U000, '0', '7', S_CHAR);
        pos_range(&b, l, S_U000, 'b', 'b', S_CHAR);
        pos_range(&b, l, S_U000, 'e', 'f', S_CHAR);
        pos_range(&b, l, S_U001, '0', '9', S_CHAR);
        pos_range(&b, l, S_U001, 'a', 'f', S_CHAR);
        pos_range(&b, l, S_C1, 0x80, 0xbf, S_CHAR);
        pos_range(&b, l, S_C2, 0x80, 0xbf, S_C1);
        pos_range(&b, l, S_C3, 0x80, 0xbf, S_C2);
        pos_range(&b, l, S_E0, 0xa0, 0xbf, S_C1);
        pos_range(&b, l, S_ED, 0x80, 0x9f, S_C1);
        pos_range(&b, l, S_F0, 0x90, 0xbf, S_C2);
        pos_range(&b, l, S_F4, 0x80, 0x8f, S_C2);
    }
    g->flags[S_DONE] = ML_GRAMMAR_ACCEPT;
    g->start = S_START;
    return g;
}

/* Every id of the real vocabulary: the mask's bit against the per-token
 * check. */
static void check_real_mask(ml_grammar_state *s, const ml_json_vocab *v, uint64_t *mask,
                            const char *what)
{
    size_t count = ml_grammar_state_allowed(s, mask), set = 0, bad = 0;
    size_t n = ml_json_vocab_n_vocab(v);
    for (size_t id = 0; id < n; id++) {
        bool bit = (mask[id >> 6] >> (id & 63)) & 1;
        set += bit;
        bad += bit != (bool)ml_grammar_state_allows(s, (int32_t)id);
    }
    check(bad == 0 && set == count && set > 0, "%s: %zu of %zu ids disagree (%zu allowed)", what,
          bad, n, set);
}

static int32_t real_byte_token(const ml_tokenizer *tok, uint8_t b)
{
    for (int32_t id = 0; id < 128000; id++) {
        size_t len = 0;
        const char *bytes = ml_tokenizer_token_bytes(tok, id, &len);
        if (len == 1 && (uint8_t)bytes[0] == b)
            return id;
    }
    return -1;
}

static void test_real_strings(void)
{
    double load_s = 0;
    ml_tokenizer *tok = ml_tok_load(ML_TOK_REAL_PATH, &load_s);
    ml_json_vocab *v = NULL;
    check(tok && ml_json_vocab_create(tok, 128256, &v, NULL, 0) == ML_OK, "real vocabulary");
    uint64_t *mask = calloc(ml_json_vocab_mask_words(v ? v : g_vocab), sizeof *mask);
    /* Prefixes fed byte by byte after the opening quote, and where they
     * end: between characters, after \, inside \u00, inside a 3-byte and a
     * 4-byte character, near and at a length limit. */
    static const struct {
        const char *text;
        int chars; /* characters written, -1 when it ends inside one */
    } prefixes[] = {
        {"", 0},          {"ab", 2},         {"\\", -1},       {"\\u0", -1},       {"\\u00", -1},
        {"\\u000", -1},   {"\\u001", -1},    {"\\u001f", 1},    {"\\u000b\\t", 2}, {"\xe2\x82", -1},
        {"\xf0\x9f", -1}, {"\xed", -1},       {"abcdefg", 7},    {"abcd\xc3", -1},  {"abcdefgh", 8}};
    static const struct {
        int min_len, max_len;
        bool allow_x;
    } strings[] = {{0, -1, true}, {0, -1, false}, {3, -1, true}, {0, 8, true}, {2, 9, true},
                   {0, 8, false}};
    for (size_t k = 0; k < N_OF(strings) && v; k++) {
        ml_grammar *g = string_grammar(strings[k].min_len, strings[k].max_len, strings[k].allow_x);
        for (size_t j = 0; g && j < N_OF(prefixes); j++) {
            ml_grammar_state *s = NULL;
            check(ml_grammar_state_create(g, v, &s, NULL, 0) == ML_OK, "create");
            char what[128];
            snprintf(what, sizeof what, "string %d..%d%s, after '\"%s'", strings[k].min_len,
                     strings[k].max_len, strings[k].allow_x ? "" : " without x",
                     prefixes[j].text);
            const char *text = prefixes[j].text;
            bool fed = ml_grammar_state_accept(s, real_byte_token(tok, '"'), NULL, 0) == ML_OK;
            for (size_t i = 0; text[i] && fed; i++)
                fed = ml_grammar_state_accept(s, real_byte_token(tok, (uint8_t)text[i]), NULL,
                                              0) == ML_OK;
            check(fed, "%s: the prefix is a string's", what);
            /* Between characters of a string the reference describes, the
             * mask takes the shortcut with the characters left (a string
             * without x is one where no character is left). */
            bool full = prefixes[j].chars == strings[k].max_len;
            long want = prefixes[j].chars < 0 || (!strings[k].allow_x && !full) ? -1
                        : strings[k].max_len < 0 ? ML_GRAMMAR_BUDGET_UNBOUNDED
                                                 : strings[k].max_len - prefixes[j].chars;
            check(ml_grammar_state_string_budget(s) == want, "%s: budget %ld, want %ld", what,
                  ml_grammar_state_string_budget(s), want);
            check_real_mask(s, v, mask, what);
            check_real_mask(s, v, mask, what); /* again: the remembered budget */
            ml_grammar_state_destroy(s);
        }
        ml_grammar_unref(g);
    }
    free(mask);
    ml_json_vocab_destroy(v);
    ml_tokenizer_destroy(tok);
}

int main(void)
{
    const char *bytes[N_OF(vocab_text)];
    size_t lens[N_OF(vocab_text)];
    for (size_t i = 0; i < N_OF(vocab_text); i++) {
        bytes[i] = vocab_text[i];
        lens[i] = strlen(vocab_text[i]);
    }
    char err[256] = "";
    check(ml_json_vocab_create_from_bytes(bytes, lens, N_OF(vocab_text), &g_vocab, err,
                                          sizeof err) == ML_OK,
          "vocab: %s", err);
    g_n_words = ml_json_vocab_mask_words(g_vocab);
    ml_grammar *g = list_grammar();
    check(g != NULL, "grammar");
    if (g && g_vocab && g_n_words == 1) {
        test_documents(g);
        test_depth(g);
        test_whitespace(g);
        test_cache(g);
        test_refusal_keeps_state(g);
        test_real_strings();
    }
    ml_grammar_unref(g);
    ml_json_vocab_destroy(g_vocab);
    return check_done();
}
