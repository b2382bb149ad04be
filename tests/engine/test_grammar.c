/* The grammar at run time (engine/grammar/grammar.c) on hand-built tables,
 * independent of the schema compiler:
 *   1. a recursive grammar (nested lists of 1, machine 0 calling itself):
 *      documents accepted byte by byte, refusals at the right byte, the depth
 *      bound (a state never allows a byte it could not complete from), the
 *      whitespace bound outside strings and none inside;
 *   2. the trie mask against the per-token check, at every prefix of the
 *      documents, with multi-byte tokens that call and return within
 *      themselves, and from the mask cache (a second state, same answers);
 *   3. accept leaves the state unchanged on refusal; reset; references. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "harness.h"

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
    }
    ml_grammar_unref(g);
    ml_json_vocab_destroy(g_vocab);
    return check_done();
}
