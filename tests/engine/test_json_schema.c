/* The JSON Schema compiler (engine/grammar/schema*.c) through the grammar
 * it emits and the real Llama 3 tokenizer:
 *   1. per keyword, documents that must be accepted, as exact text
 *      tokenized without BOS (each token allowed by the mask computed
 *      before it, the document complete after the last), compact and
 *      json.dumps-spaced;
 *   2. documents that must be refused, fed as single-byte tokens, refused
 *      at the expected byte (or incomplete at the end), and refused as
 *      tokens too;
 *   3. schemas that must be refused, the keyword and its JSON Pointer (or
 *      the bound) in the message (test_json_schema_refused.c);
 *   4. every compiled grammar passes ml_grammar_check (the five guarantees
 *      of grammar_internal.h); masks equal ml_grammar_state_allows for every
 *      id in a few states; the digest of the canonical form. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "harness.h"
#include "test_json_schema.h"
#include "tokenizer_util.h"

#define N_VOCAB 128256
#define N_WORDS ((N_VOCAB + 63) / 64)
/* Refusal at the end: every byte taken, the document incomplete. */
#define INCOMPLETE (-1)

static ml_tokenizer *g_tok;
static ml_json_vocab *g_vocab;
static int32_t g_byte_id[256];
static uint64_t g_mask[N_WORDS];

static bool mask_bit(const uint64_t *mask, int32_t id)
{
    return (mask[id >> 6] >> (id & 63)) & 1;
}

ml_status test_compile_schema(const char *schema, ml_grammar **g, char *err, size_t errlen)
{
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    lim.max_compile_ms = TEST_COMPILE_MS;
    *g = NULL;
    return ml_grammar_compile_schema(schema, strlen(schema), &lim, g, err, errlen);
}

/* The grammar of schema, or NULL (a failed check) when it does not compile
 * or breaks a guarantee of grammar_internal.h. */
static ml_grammar *compile(const char *schema, int line)
{
    ml_grammar *g;
    char err[512] = "";
    ml_status st = test_compile_schema(schema, &g, err, sizeof err);
    ml_check_at(st == ML_OK, __FILE__, line, "compile %s: %s", schema, err);
    if (st != ML_OK)
        return NULL;
    st = ml_grammar_check(g, true, err, sizeof err);
    ml_check_at(st == ML_OK, __FILE__, line, "check %s: %s", schema, err);
    return g;
}

static ml_grammar_state *new_state(ml_grammar *g)
{
    ml_grammar_state *s = NULL;
    char err[256];
    if (ml_grammar_state_create(g, g_vocab, &s, err, sizeof err) != ML_OK) {
        fprintf(stderr, "state: %s\n", err);
        exit(1);
    }
    return s;
}

/* Walk text's tokens (no BOS), the mask computed before each: true when
 * every token is allowed and the document is complete at the end. */
static bool walk_tokens(ml_grammar *g, const char *text)
{
    ml_token_buf ids;
    ml_token_buf_init(&ids);
    char err[256];
    if (ml_tokenizer_encode(g_tok, text, strlen(text), 0, &ids, err, sizeof err) != ML_OK) {
        fprintf(stderr, "encode: %s\n", err);
        exit(1);
    }
    ml_grammar_state *s = new_state(g);
    bool ok = true;
    for (size_t i = 0; i < ids.n && ok; i++) {
        ml_grammar_state_allowed(s, g_mask);
        ok = mask_bit(g_mask, ids.ids[i]);
        check(ok == (ml_grammar_state_allows(s, ids.ids[i]) == 1),
              "%s: mask and allows disagree on token %zu (id %d)", text, i, ids.ids[i]);
        if (ok)
            check(ml_grammar_state_accept(s, ids.ids[i], err, sizeof err) == ML_OK, "accept: %s",
                  err);
    }
    ok = ok && ml_grammar_state_complete(s);
    ml_grammar_state_destroy(s);
    ml_token_buf_deinit(&ids);
    return ok;
}

/* Feed text byte by byte; the index of the first refused byte, or
 * INCOMPLETE when all are taken and the document is not complete, or the
 * length when it is complete. */
static long walk_bytes(ml_grammar *g, const char *text)
{
    ml_grammar_state *s = new_state(g);
    size_t n = strlen(text);
    long r = (long)n;
    for (size_t i = 0; i < n; i++) {
        int32_t id = g_byte_id[(uint8_t)text[i]];
        if (ml_grammar_state_accept(s, id, NULL, 0) != ML_OK) {
            r = (long)i;
            break;
        }
    }
    if (r == (long)n && !ml_grammar_state_complete(s))
        r = INCOMPLETE;
    ml_grammar_state_destroy(s);
    return r;
}

#define ACCEPTS(g, text) accepts_at((g), (text), __LINE__)
static void accepts_at(ml_grammar *g, const char *text, int line)
{
    if (!g)
        return;
    ml_check_at(walk_tokens(g, text), __FILE__, line, "tokens of %s refused", text);
    long at = walk_bytes(g, text);
    ml_check_at(at == (long)strlen(text), __FILE__, line, "bytes of %s refused at %ld", text, at);
}

/* text refused at byte `at` (INCOMPLETE: taken whole but incomplete). */
#define REFUSES(g, text, at) refuses_at((g), (text), (at), __LINE__)
static void refuses_at(ml_grammar *g, const char *text, long at, int line)
{
    if (!g)
        return;
    long got = walk_bytes(g, text);
    ml_check_at(got == at, __FILE__, line, "%s: refused at %ld, expected %ld", text, got, at);
    ml_check_at(!walk_tokens(g, text), __FILE__, line, "tokens of %s accepted", text);
}

/* ---- 1 and 2: documents per keyword ------------------------------------------ */

static void test_types(void)
{
    ml_grammar *g = compile("{\"type\": \"string\"}", __LINE__);
    ACCEPTS(g, "\"hello\"");
    ACCEPTS(g, "\"\"");
    ACCEPTS(g, "\"a \\\"quoted\\\" word\"");
    REFUSES(g, "12", 0);
    REFUSES(g, " \"a\"", 0); /* no whitespace before the document */
    REFUSES(g, "\"a\" ", 3); /* nor after it */
    REFUSES(g, "\"abc", INCOMPLETE);
    ml_grammar_unref(g);

    g = compile("{\"type\": [\"integer\", \"null\"]}", __LINE__);
    ACCEPTS(g, "42");
    ACCEPTS(g, "-7");
    ACCEPTS(g, "null");
    REFUSES(g, "4.5", 1);
    REFUSES(g, "true", 0);
    REFUSES(g, "nul", INCOMPLETE);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"boolean\"}", __LINE__);
    ACCEPTS(g, "true");
    ACCEPTS(g, "false");
    REFUSES(g, "null", 0);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"number\"}", __LINE__);
    ACCEPTS(g, "3.25");
    ACCEPTS(g, "-1e10");
    ACCEPTS(g, "0");
    REFUSES(g, "01", 1);
    REFUSES(g, "\"1\"", 0);
    ml_grammar_unref(g);

    /* No type: every type, each under the keywords that apply to it. */
    g = compile("{\"minLength\": 2}", __LINE__);
    ACCEPTS(g, "\"ab\"");
    ACCEPTS(g, "17");
    ACCEPTS(g, "{\"x\": [1, {\"y\": null}]}");
    ACCEPTS(g, "[]");
    REFUSES(g, "\"a\"", 2);
    ml_grammar_unref(g);

    /* Keywords JSON Schema does not define are annotations, ignored as a
     * validator ignores them: a vendor's, OpenAPI's nullable, a misspelt
     * additionalProperties. */
    g = compile("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", "
                "\"nullable\": true, \"x-kubernetes-patch-merge-key\": \"name\"}}, "
                "\"additonalProperties\": false}",
                __LINE__);
    ACCEPTS(g, "{\"a\": \"s\"}");
    ACCEPTS(g, "{\"a\": \"s\", \"b\": 1}");
    REFUSES(g, "{\"a\": null}", 6);
    ml_grammar_unref(g);
}

static void test_scalars(void)
{
    ml_grammar *g = compile("{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 12}", __LINE__);
    ACCEPTS(g, "1");
    ACCEPTS(g, "12");
    REFUSES(g, "0", 0);
    REFUSES(g, "13", 1);
    REFUSES(g, "-1", 0);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"number\", \"exclusiveMinimum\": 0, \"maximum\": 1}", __LINE__);
    ACCEPTS(g, "0.5");
    ACCEPTS(g, "1");
    REFUSES(g, "0", INCOMPLETE);
    REFUSES(g, "-0.1", 0);
    REFUSES(g, "1.5", 2);
    ml_grammar_unref(g);

    /* Draft 4's boolean exclusiveMinimum. */
    g = compile("{\"type\": \"integer\", \"minimum\": 5, \"exclusiveMinimum\": true}", __LINE__);
    ACCEPTS(g, "6");
    REFUSES(g, "5", INCOMPLETE);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"integer\", \"multipleOf\": 5}", __LINE__);
    ACCEPTS(g, "10");
    ACCEPTS(g, "-35");
    REFUSES(g, "7", INCOMPLETE);
    ml_grammar_unref(g);

    /* An integer multipleOf on a number: integers only (narrower). */
    g = compile("{\"type\": \"number\", \"multipleOf\": 2}", __LINE__);
    ACCEPTS(g, "4");
    REFUSES(g, "4.0", 1);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", __LINE__);
    ACCEPTS(g, "\"ab\"");
    ACCEPTS(g, "\"abc\"");
    ACCEPTS(g, "\"\xc3\xa9\xc3\xa9\""); /* code points, not bytes */
    REFUSES(g, "\"a\"", 2);
    REFUSES(g, "\"abcd\"", 4);
    ml_grammar_unref(g);

    /* A maxLength past SCHEMA_MAX_ENFORCED_BOUND (1024) is enforced as it. */
    g = compile("{\"type\": \"string\", \"maxLength\": 32767}", __LINE__);
    if (g) {
        static char text[1100];
        text[0] = '"';
        memset(text + 1, 'a', 1024);
        strcpy(text + 1025, "\"");
        check(walk_bytes(g, text) == 1026, "1024 characters");
        text[1025] = 'a';
        strcpy(text + 1026, "\"");
        check(walk_bytes(g, text) == 1025, "1025 characters refused");
    }
    ml_grammar_unref(g);

    g = compile("{\"type\": \"string\", \"pattern\": \"^[a-z]+$\"}", __LINE__);
    ACCEPTS(g, "\"abc\"");
    REFUSES(g, "\"ab1\"", 3);
    REFUSES(g, "\"\"", 1);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"string\", \"format\": \"date\"}", __LINE__);
    ACCEPTS(g, "\"2024-02-29\"");
    REFUSES(g, "\"2024-13-01\"", 7);
    ml_grammar_unref(g);
    REFUSED("{\"type\": \"string\", \"format\": \"color\"}", ML_ERR_UNSUPPORTED, "color");
    /* A format JSON Schema does not define is an annotation. */
    g = compile("{\"type\": \"string\", \"format\": \"byte\", \"maxLength\": 4}", __LINE__);
    ACCEPTS(g, "\"ab=\"");
    REFUSES(g, "\"abcde\"", 5);
    ml_grammar_unref(g);

    /* enum numbers in one canonical text. */
    g = compile("{\"enum\": [1.5, 100, -0.25, 1e2]}", __LINE__);
    ACCEPTS(g, "1.5");
    ACCEPTS(g, "100");
    ACCEPTS(g, "-0.25");
    REFUSES(g, "1.50", 3);
    REFUSES(g, "1e2", 1);
    ml_grammar_unref(g);
}

static void test_any(void)
{
    const char *any[] = {"{}", "true", "{\"description\": \"anything\"}"};
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++) {
        ml_grammar *g = compile(any[i], __LINE__);
        ACCEPTS(g, "{\"a\": [1, 2.5, \"x\", null, true, {\"b\": {}}], \"c\": []}");
        ACCEPTS(g, "[[[[]]]]");
        ACCEPTS(g, "\"s\"");
        ACCEPTS(g, "-0.5e-3");
        ACCEPTS(g, "{ \"a\" : 1 , \"b\" : [ 1 , 2 ] }");
        ACCEPTS(g, "{\n  \"a\": 1\n}");
        REFUSES(g, "{\"a\" 1}", 5);
        REFUSES(g, "[1,]", 3);
        REFUSES(g, "{,}", 1);
        REFUSES(g, "[1 2]", 3);
        ml_grammar_unref(g);
    }
    REFUSED("false", ML_ERR_INVALID_ARG, "no JSON value");
}

static void test_objects(void)
{
    const char *schema = "{\"type\": \"object\", \"properties\": {"
                         "\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, "
                         "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, "
                         "\"required\": [\"name\"], \"additionalProperties\": false}";
    ml_grammar *g = compile(schema, __LINE__);
    ACCEPTS(g, "{\"name\":\"Ann\"}");
    ACCEPTS(g, "{\"name\": \"Ann\", \"age\": 31}");
    ACCEPTS(g, "{\"name\": \"Ann\", \"tags\": [\"a\", \"b\"]}");
    ACCEPTS(g, "{\"name\": \"Ann\", \"age\": 31, \"tags\": []}");
    ACCEPTS(g, "{ \"name\" : \"Ann\" , \"age\" : 31 }");
    ACCEPTS(g, "{\n  \"name\": \"Ann\",\n  \"age\": 31\n}");
    /* Property order follows "properties". */
    REFUSES(g, "{\"age\": 31, \"name\": \"Ann\"}", 2);
    REFUSES(g, "{\"name\": \"Ann\", \"tags\": [], \"age\": 3}", 26);
    /* Required, additional, duplicates, commas. */
    REFUSES(g, "{}", 1);
    REFUSES(g, "{\"name\": \"Ann\", \"x\": 1}", 17);
    REFUSES(g, "{\"name\": \"Ann\", \"name\": \"Bob\"}", 17);
    REFUSES(g, "{\"name\": \"Ann\",}", 15);
    REFUSES(g, "{,\"name\": \"Ann\"}", 1);
    REFUSES(g, "{\"name\": 5}", 9);
    REFUSES(g, "{\"name\": \"Ann\"", INCOMPLETE);
    ml_grammar_unref(g);

    /* The first property absent: no leading comma before the second. */
    g = compile("{\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}},"
                " \"additionalProperties\": false}",
                __LINE__);
    ACCEPTS(g, "{}");
    ACCEPTS(g, "{\"b\": 2}");
    ACCEPTS(g, "{\"a\": 1}");
    ACCEPTS(g, "{\"a\": 1, \"b\": 2}");
    REFUSES(g, "{, \"b\": 2}", 1);
    REFUSES(g, "{\"b\": 2, \"a\": 1}", 7);
    ml_grammar_unref(g);

    /* additionalProperties: default (any value), a schema; a defined name
     * never comes back as an additional key. */
    g = compile("{\"properties\": {\"id\": {\"type\": \"integer\"}}}", __LINE__);
    ACCEPTS(g, "{\"id\": 1, \"note\": {\"x\": [null]}}");
    ACCEPTS(g, "{\"note\": \"first\", \"other\": 2}");
    ACCEPTS(g, "{\"ids\": \"s\", \"i\": 1}");
    REFUSES(g, "{\"id\": 1, \"id\": 2}", 13);
    REFUSES(g, "{\"x\": 1, \"id\": 2}", 12);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"number\"}}", __LINE__);
    ACCEPTS(g, "{\"a\": 1, \"b\": 2.5}");
    REFUSES(g, "{\"a\": \"x\"}", 6);
    ml_grammar_unref(g);

    /* patternProperties: a matching key takes the pattern's schema; the
     * others additionalProperties. */
    g = compile("{\"type\": \"object\", \"patternProperties\": {\"^x-\": {\"type\": \"string\"}},"
                " \"additionalProperties\": {\"type\": \"integer\"}}",
                __LINE__);
    ACCEPTS(g, "{\"x-a\": \"s\", \"b\": 1}");
    REFUSES(g, "{\"x-a\": 1}", 8);
    REFUSES(g, "{\"b\": \"s\"}", 6);
    ml_grammar_unref(g);

    /* A required name that is not a property takes additionalProperties. */
    g = compile("{\"required\": [\"k\"], \"additionalProperties\": {\"type\": \"boolean\"},"
                " \"type\": \"object\"}",
                __LINE__);
    ACCEPTS(g, "{\"k\": true}");
    ACCEPTS(g, "{\"k\": true, \"j\": false}");
    REFUSES(g, "{\"j\": false}", 2);
    ml_grammar_unref(g);

    /* Escapes in names: the one form of each character. */
    g = compile("{\"properties\": {\"a\\\"b\": {\"const\": 1}, \"tab\\t\": {\"const\": 2}},"
                " \"required\": [\"a\\\"b\"], \"additionalProperties\": false}",
                __LINE__);
    ACCEPTS(g, "{\"a\\\"b\": 1, \"tab\\t\": 2}");
    REFUSES(g, "{\"a\\u0022b\": 1}", 4);
    ml_grammar_unref(g);
}

static void test_members(void)
{
    /* A named property under its own schema and a matching pattern's. */
    ml_grammar *g = compile("{\"properties\": {\"x-a\": {\"type\": \"string\"}}, "
                            "\"patternProperties\": {\"^x-\": {\"maxLength\": 2}}}",
                            __LINE__);
    ACCEPTS(g, "{\"x-a\": \"ab\"}");
    ACCEPTS(g, "{\"x-b\": 1234}");
    REFUSES(g, "{\"x-a\": \"abc\"}", 11);
    REFUSES(g, "{\"x-b\": \"abc\"}", 11);
    ml_grammar_unref(g);

    /* Keys matching two patterns take both schemas. */
    g = compile("{\"type\": \"object\", \"patternProperties\": {\"^a\": {\"type\": "
                "\"integer\"}, \"b$\": {\"minimum\": 5}}, \"additionalProperties\": false}",
                __LINE__);
    ACCEPTS(g, "{\"ab\": 7, \"a\": 1, \"b\": \"s\"}");
    REFUSES(g, "{\"ab\": 3}", 8);
    REFUSES(g, "{\"ab\": \"s\"}", 7);
    REFUSES(g, "{\"c\": 1}", 3);
    ml_grammar_unref(g);

    /* Beside patterns, other keys are printable ASCII (where the patterns'
     * automata are exact): "a\n" matches "^a$" under Python's re. */
    g = compile("{\"type\": \"object\", \"patternProperties\": {\"^a$\": {\"type\": \"integer\"}}}",
                __LINE__);
    ACCEPTS(g, "{\"a\": 1, \"b\": \"x\", \"q\\\"\": 2}");
    REFUSES(g, "{\"a\\n\": \"x\"}", 4);
    REFUSES(g, "{\"\xc3\xa9\": 1}", 2);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"object\", \"propertyNames\": {\"pattern\": \"^[a-z]+$\"}}",
                __LINE__);
    ACCEPTS(g, "{\"abc\": 1, \"d\": {\"E\": 2}}");
    REFUSES(g, "{\"aB\": 1}", 3);
    ml_grammar_unref(g);

    REFUSED("{\"patternProperties\": {\"a\": {}, \"b\": {}, \"c\": {}, \"d\": {}, \"e\": {}}}",
            ML_ERR_UNSUPPORTED, "patternProperties");
    REFUSED("{\"properties\": {\"a\": {}, \"a\": {}}}", ML_ERR_INVALID_ARG, "properties");
}

static void test_arrays(void)
{
    ml_grammar *g = compile("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, "
                            "\"minItems\": 1, \"maxItems\": 3}",
                            __LINE__);
    ACCEPTS(g, "[1]");
    ACCEPTS(g, "[1, 2, 3]");
    ACCEPTS(g, "[ 1 ,2 ]");
    REFUSES(g, "[]", 1);
    REFUSES(g, "[1, 2, 3, 4]", 8);
    REFUSES(g, "[1, \"a\"]", 4);
    REFUSES(g, "[1,]", 3);
    ml_grammar_unref(g);

    g = compile("{\"prefixItems\": [{\"type\": \"string\"}, {\"type\": \"integer\"}], "
                "\"items\": false, \"type\": \"array\"}",
                __LINE__);
    ACCEPTS(g, "[]");
    ACCEPTS(g, "[\"a\"]");
    ACCEPTS(g, "[\"a\", 2]");
    REFUSES(g, "[\"a\", 2, 3]", 7);
    REFUSES(g, "[2]", 1);
    ml_grammar_unref(g);

    /* Draft 4: items as an array, additionalItems after it. */
    g = compile("{\"type\": \"array\", \"items\": [{\"type\": \"null\"}], "
                "\"additionalItems\": {\"type\": \"boolean\"}, \"minItems\": 2}",
                __LINE__);
    ACCEPTS(g, "[null, true]");
    ACCEPTS(g, "[null, true, false]");
    REFUSES(g, "[null]", 5);
    REFUSES(g, "[null, null]", 7);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"array\", \"uniqueItems\": false}", __LINE__);
    ACCEPTS(g, "[1, 1]");
    ml_grammar_unref(g);
}

static void test_enum_const(void)
{
    ml_grammar *g = compile("{\"enum\": [\"red\", \"green\", 3, 2.5, null, [1, \"x\"], "
                            "{\"k\": [true]}]}",
                            __LINE__);
    ACCEPTS(g, "\"red\"");
    ACCEPTS(g, "\"green\"");
    ACCEPTS(g, "3");
    ACCEPTS(g, "2.5");
    ACCEPTS(g, "null");
    ACCEPTS(g, "[1, \"x\"]");
    ACCEPTS(g, "[1,\"x\"]");
    ACCEPTS(g, "{\"k\": [true]}");
    ACCEPTS(g, "{ \"k\" : [ true ] }");
    REFUSES(g, "\"blue\"", 1);
    REFUSES(g, "\"re\"", 3);
    REFUSES(g, "4", 0);
    REFUSES(g, "[1]", 2);
    ml_grammar_unref(g);

    g = compile("{\"const\": \"a\\nb\"}", __LINE__);
    ACCEPTS(g, "\"a\\nb\"");
    REFUSES(g, "\"a\\u000ab\"", 3);
    ml_grammar_unref(g);

    /* enum under an object or array type: the values of that type. */
    g = compile("{\"type\": [\"object\", \"integer\"], \"enum\": [{\"a\": 1}, [2], 3, 3.5]}",
                __LINE__);
    ACCEPTS(g, "{\"a\": 1}");
    ACCEPTS(g, "3");
    REFUSES(g, "[2]", 0);
    REFUSES(g, "3.5", 1);
    ml_grammar_unref(g);

    /* enum under a type: the intersection. */
    g = compile("{\"type\": \"string\", \"enum\": [\"a\", 1]}", __LINE__);
    ACCEPTS(g, "\"a\"");
    REFUSES(g, "1", 0);
    ml_grammar_unref(g);
}

static void test_combinators(void)
{
    /* allOf of three objects with recursive values: the second merge
     * replaces the merged member list the first made, which the merged
     * members still refer to (a use after free, found on the benchmark). */
    ml_grammar *merged = compile(
        "{\"definitions\": {\"a\": {\"properties\": {\"x\": {}}}, \"b\": {\"properties\": "
        "{\"x\": {}}}, \"c\": {\"properties\": {}}}, \"properties\": {\"rules\": {\"allOf\": "
        "[{\"$ref\": \"#/definitions/a\"}, {\"$ref\": \"#/definitions/b\"}, {\"$ref\": "
        "\"#/definitions/c\"}]}}}",
        __LINE__);
    ACCEPTS(merged, "{\"rules\": {\"x\": [1, {\"y\": null}]}}");
    ml_grammar_unref(merged);

    ml_grammar *g = compile("{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}",
                            __LINE__);
    ACCEPTS(g, "\"s\"");
    ACCEPTS(g, "5");
    REFUSES(g, "null", 0);
    ml_grammar_unref(g);

    /* oneOf: the values in exactly one branch. */
    g = compile("{\"oneOf\": [{\"enum\": [\"a\", \"b\"]}, {\"enum\": [\"b\", \"c\"]}]}", __LINE__);
    ACCEPTS(g, "\"a\"");
    ACCEPTS(g, "\"c\"");
    REFUSES(g, "\"b\"", 1);
    ml_grammar_unref(g);

    /* allOf, regular: the intersection. */
    g = compile("{\"allOf\": [{\"enum\": [1, 2, \"c\"]}, {\"enum\": [2, \"c\", 4]}], \"not\": "
                "{\"const\": \"c\"}}",
                __LINE__);
    ACCEPTS(g, "2");
    REFUSES(g, "\"c\"", 0);
    REFUSES(g, "1", 0);
    ml_grammar_unref(g);

    g = compile("{\"type\": \"string\", \"not\": {\"enum\": [\"no\"]}}", __LINE__);
    ACCEPTS(g, "\"yes\"");
    ACCEPTS(g, "\"nope\"");
    REFUSES(g, "\"no\"", 3);
    ml_grammar_unref(g);

    /* allOf with objects (any-valued members: recursive): merged, the first
     * branch's properties first. */
    g = compile("{\"allOf\": [{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                "\"integer\"}}, \"required\": [\"a\"]}, {\"properties\": {\"b\": {\"type\": "
                "\"string\"}}, \"required\": [\"b\"]}]}",
                __LINE__);
    ACCEPTS(g, "{\"a\": 1, \"b\": \"x\"}");
    ACCEPTS(g, "{\"a\": 1, \"b\": \"x\", \"c\": [1]}");
    REFUSES(g, "{\"a\": 1}", 7);
    REFUSES(g, "{\"b\": \"x\", \"a\": 1}", 2);
    ml_grammar_unref(g);

    /* oneOf: branches of different types need no difference, even with
     * recursive values; exact branches (no numbers, patterns, formats or
     * ordered properties) are subtracted, those with calls within
     * SCHEMA_REGULAR_DEPTH nested containers. */
    g = compile("{\"oneOf\": [{\"type\": \"object\"}, {\"type\": \"array\", \"items\": "
                "{\"type\": \"integer\"}}, {\"type\": \"string\", \"pattern\": \"^a\"}]}",
                __LINE__);
    ACCEPTS(g, "{\"x\": [1, {}]}");
    ACCEPTS(g, "[1, 2]");
    ACCEPTS(g, "\"ab\"");
    ml_grammar_unref(g);

    g = compile("{\"oneOf\": [{\"type\": \"array\"}, {\"type\": \"array\", \"minItems\": 2}]}",
                __LINE__);
    ACCEPTS(g, "[]");
    ACCEPTS(g, "[{\"a\": [true]}]");
    REFUSES(g, "[1, 2]", 2);
    REFUSES(g, "[[[[[1]]]]]", 4);
    ml_grammar_unref(g);

    g = compile("{\"type\": [\"string\", \"null\"], \"not\": {\"enum\": [\"\", null]}}", __LINE__);
    ACCEPTS(g, "\"a\"");
    REFUSES(g, "null", 0);
    REFUSES(g, "\"\"", 1);
    ml_grammar_unref(g);

    /* A discriminator: a property both branches require, with disjoint
     * values. */
    g = compile("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": "
                "\"a\"}, \"x\": {\"type\": \"number\"}}, \"required\": [\"kind\"]}, {\"$ref\": "
                "\"#/$defs/b\"}], \"$defs\": {\"b\": {\"type\": \"object\", \"properties\": "
                "{\"kind\": {\"enum\": [\"b\", \"c\"]}}, \"required\": [\"kind\"]}}}",
                __LINE__);
    ACCEPTS(g, "{\"kind\": \"a\", \"x\": 1.5}");
    ACCEPTS(g, "{\"kind\": \"c\", \"x\": {}}");
    REFUSES(g, "{\"kind\": \"d\"}", 10);
    ml_grammar_unref(g);
    REFUSED("{\"oneOf\": [{\"properties\": {\"k\": {\"const\": 1}}}, {\"properties\": {\"k\": "
            "{\"const\": 2}}}]}",
            ML_ERR_UNSUPPORTED, "oneOf");

    /* Subtracting a narrowed schema would admit what it matches. */
    REFUSED("{\"oneOf\": [{\"type\": \"number\"}, {\"enum\": [100]}]}", ML_ERR_UNSUPPORTED,
            "oneOf");
    REFUSED("{\"oneOf\": [{\"type\": \"object\"}, {\"type\": \"object\", \"required\": "
            "[\"a\"]}]}",
            ML_ERR_UNSUPPORTED, "oneOf");
    REFUSED("{\"type\": \"object\", \"not\": {\"required\": [\"x\"]}}", ML_ERR_UNSUPPORTED,
            "not");
    REFUSED("{\"type\": \"string\", \"not\": {\"pattern\": \"^a\"}}", ML_ERR_UNSUPPORTED, "not");

    /* anyOf distributed over an object with recursive members. */
    g = compile("{\"type\": \"object\", \"properties\": {\"a\": {}, \"b\": {}}, "
                "\"anyOf\": [{\"required\": [\"a\"]}, {\"required\": [\"b\"]}]}",
                __LINE__);
    ACCEPTS(g, "{\"a\": 1}");
    ACCEPTS(g, "{\"b\": [2]}");
    ACCEPTS(g, "{\"a\": {}, \"b\": 2}");
    REFUSES(g, "{}", 1);
    ml_grammar_unref(g);
}

static void test_refs(void)
{
    /* A recursive tree through $defs: calls. */
    ml_grammar *g = compile("{\"$ref\": \"#/$defs/node\", \"$defs\": {\"node\": {\"type\": "
                            "\"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
                            "\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
                            "\"#/$defs/node\"}}}, \"required\": [\"v\"], "
                            "\"additionalProperties\": false}}}",
                            __LINE__);
    ACCEPTS(g, "{\"v\": 1}");
    ACCEPTS(g, "{\"v\": 1, \"kids\": [{\"v\": 2}, {\"v\": 3, \"kids\": [{\"v\": 4}]}]}");
    REFUSES(g, "{\"v\": 1, \"kids\": [{\"w\": 2}]}", 20);
    REFUSES(g, "{\"v\": 1, \"kids\": [{\"v\": 2}]", INCOMPLETE);
    ml_grammar_unref(g);

    /* "#" (the root), definitions, pointer escapes ~0 ~1 and %25. */
    g = compile("{\"anyOf\": [{\"type\": \"null\"}, {\"type\": \"array\", \"items\": "
                "{\"$ref\": \"#\"}}]}",
                __LINE__);
    ACCEPTS(g, "null");
    ACCEPTS(g, "[null, [], [[null]]]");
    REFUSES(g, "[1]", 1);
    ml_grammar_unref(g);

    g = compile("{\"definitions\": {\"a/b\": {\"type\": \"integer\"}, \"c~d\": {\"type\": "
                "\"string\"}, \"e%f\": {\"type\": \"null\"}}, \"type\": \"array\", "
                "\"prefixItems\": [{\"$ref\": \"#/definitions/a~1b\"}, {\"$ref\": "
                "\"#/definitions/c~0d\"}, {\"$ref\": \"#/definitions/e%25f\"}]}",
                __LINE__);
    ACCEPTS(g, "[1, \"s\", null]");
    REFUSES(g, "[\"s\"]", 1);
    ml_grammar_unref(g);

    /* Mutual recursion, and the depth bound: nesting past it is refused
     * where it would begin. */
    g = compile("{\"$defs\": {\"a\": {\"type\": \"array\", \"items\": {\"$ref\": "
                "\"#/$defs/b\"}}, \"b\": {\"type\": \"object\", \"properties\": {\"x\": "
                "{\"$ref\": \"#/$defs/a\"}}}}, \"$ref\": \"#/$defs/a\"}",
                __LINE__);
    ACCEPTS(g, "[{\"x\": [{}, {\"x\": []}]}]");
    ml_grammar_unref(g);

    /* More recursive targets than the machine table's first size. */
    char many[4096];
    int k = snprintf(many, sizeof many, "{\"type\": \"object\", \"properties\": {");
    for (int i = 0; i < 12; i++)
        k += snprintf(many + k, sizeof many - (size_t)k, "%s\"p%d\": {\"$ref\": \"#/$defs/d%d\"}",
                      i ? ", " : "", i, i);
    k += snprintf(many + k, sizeof many - (size_t)k, "}, \"$defs\": {");
    for (int i = 0; i < 12; i++)
        k += snprintf(many + k, sizeof many - (size_t)k,
                      "%s\"d%d\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/d%d\"}}",
                      i ? ", " : "", i, i);
    snprintf(many + k, sizeof many - (size_t)k, "}}");
    g = compile(many, __LINE__);
    ACCEPTS(g, "{\"p0\": [[]], \"p11\": [[], [[]]]}");
    ml_grammar_unref(g);

    /* oneOf with recursive branches told apart by their first byte. */
    g = compile("{\"oneOf\": [{\"type\": \"null\"}, {\"type\": \"array\", \"items\": "
                "{\"$ref\": \"#\"}}]}",
                __LINE__);
    ACCEPTS(g, "[null, []]");
    REFUSES(g, "[1]", 1);
    ml_grammar_unref(g);

    /* Nesting: ML_GRAMMAR_MAX_DEPTH calls deep at most. */
    g = compile("{\"type\": \"array\", \"items\": {\"$ref\": \"#\"}}", __LINE__);
    char deep[2 * 200 + 1];
    for (int n = 1; n <= 200; n *= 2) {
        memset(deep, '[', (size_t)n);
        memset(deep + n, ']', (size_t)n);
        deep[2 * n] = '\0';
        long at = g ? walk_bytes(g, deep) : 0;
        if (n <= ML_GRAMMAR_MAX_DEPTH)
            check(at == 2 * n, "%d deep: refused at %ld", n, at);
        else
            check(at == ML_GRAMMAR_MAX_DEPTH, "%d deep: refused at %ld", n, at);
    }
    ml_grammar_unref(g);
}

/* ---- 4: masks, digest --------------------------------------------------------- */

static void test_masks(void)
{
    ml_grammar *g = compile("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
                            "\"string\"}, \"n\": {\"type\": \"array\", \"items\": {\"$ref\": "
                            "\"#\"}}}, \"additionalProperties\": false}",
                            __LINE__);
    if (!g)
        return;
    const char *doc = "{\"name\": \"x y\", \"n\": [{}, {\"n\": []}]}";
    ml_grammar_state *s = new_state(g);
    size_t cuts[] = {0, 1, 2, 9, 11, 14, 21, 23, 26};
    size_t done = 0;
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        for (; done < cuts[c]; done++)
            ml_grammar_state_accept(s, g_byte_id[(uint8_t)doc[done]], NULL, 0);
        size_t n = ml_grammar_state_allowed(s, g_mask);
        size_t bad = 0, count = 0;
        for (int32_t id = 0; id < N_VOCAB; id++) {
            bool m = mask_bit(g_mask, id);
            count += m;
            bad += m != (ml_grammar_state_allows(s, id) == 1);
        }
        check(bad == 0 && count == n, "mask at %zu: %zu disagree, %zu set, %zu returned", cuts[c],
              bad, count, n);
    }
    ml_grammar_state_destroy(s);
    ml_grammar_unref(g);
}

static void test_digest(void)
{
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    const char *a = "{\"type\":\"object\",\"properties\":{\"b\":{},\"a\":{}}}";
    const char *b = "{ \"properties\" : { \"b\" : {}, \"a\": {} },\n \"type\": \"object\" }";
    const char *c = "{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}}}";
    uint8_t da[32], db[32], dc[32];
    char err[256];
    check(ml_schema_digest(a, strlen(a), &lim, da, err, sizeof err) == ML_OK &&
              ml_schema_digest(b, strlen(b), &lim, db, err, sizeof err) == ML_OK &&
              ml_schema_digest(c, strlen(c), &lim, dc, err, sizeof err) == ML_OK,
          "digests: %s", err);
    check(!memcmp(da, db, 32), "same schema, same digest");
    /* Keys are sorted, except the names of "properties": their order is the
     * order documents list them in, so it must key the cache too. */
    check(memcmp(da, dc, 32) != 0, "properties' order kept");
    check(ml_schema_digest("{", 1, &lim, da, err, sizeof err) == ML_ERR_INVALID_ARG, "not JSON");
    ml_grammar *g = compile(a, __LINE__);
    if (g) {
        check(!memcmp(ml_grammar_digest(g), db, 32), "grammar digest");
        ml_grammar_unref(g);
    }
}

int main(void)
{
    double load_s = 0;
    g_tok = ml_tok_load(ML_TOK_REAL_PATH, &load_s);
    char err[256] = "";
    if (ml_json_vocab_create(g_tok, N_VOCAB, &g_vocab, err, sizeof err) != ML_OK) {
        fprintf(stderr, "json vocab: %s\n", err);
        return 1;
    }
    for (int b = 0; b < 256; b++)
        g_byte_id[b] = -1;
    for (int32_t id = 0; id < N_VOCAB; id++) {
        size_t len = 0;
        const char *bytes = ml_tokenizer_token_bytes(g_tok, id, &len);
        if (bytes && len == 1 && !ml_tokenizer_is_special(g_tok, id))
            g_byte_id[(uint8_t)bytes[0]] = id;
    }
    test_types();
    test_scalars();
    test_any();
    test_objects();
    test_members();
    test_arrays();
    test_enum_const();
    test_combinators();
    test_refs();
    test_refusals();
    test_bounds();
    test_masks();
    test_digest();
    ml_json_vocab_destroy(g_vocab);
    ml_tokenizer_destroy(g_tok);
    return check_done();
}
