/* Part 3 of test_json_schema (one executable, test_json_schema.h): schemas
 * the compiler must refuse, with the keyword and its JSON Pointer (or the
 * bound) in the message, and the default compile bounds. */
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "test_json_schema.h"

void refused_at(const char *schema, ml_status want, int line, ...)
{
    ml_grammar *g;
    char err[512] = "";
    ml_status st = test_compile_schema(schema, &g, err, sizeof err);
    ml_check_at(st == want, __FILE__, line, "%s: status %s, expected %s (%s)", schema,
                ml_status_name(st), ml_status_name(want), err);
    ml_check_at(g == NULL, __FILE__, line, "%s: a grammar on error", schema);
    va_list ap;
    va_start(ap, line);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        ml_check_at(strstr(err, needle) != NULL, __FILE__, line, "%s: '%s' not in \"%s\"", schema,
                    needle, err);
    va_end(ap);
    ml_grammar_unref(g);
}

void test_refusals(void)
{
    REFUSED("{\"type\": \"array\", \"uniqueItems\": true}", ML_ERR_UNSUPPORTED, "uniqueItems",
            "the root");
    REFUSED("{\"properties\": {\"tags\": {\"uniqueItems\": true}}}", ML_ERR_UNSUPPORTED,
            "uniqueItems", "/properties/tags");
    REFUSED("{\"minProperties\": 1}", ML_ERR_UNSUPPORTED, "minProperties");
    REFUSED("{\"items\": {\"divisibleBy\": 2}}", ML_ERR_UNSUPPORTED, "divisibleBy", "/items");
    /* A lexeme's refusal says where in the schema it is. */
    REFUSED("{\"properties\": {\"s\": {\"pattern\": \"(a)\\\\1\"}}}", ML_ERR_UNSUPPORTED,
            "at /properties/s: pattern", "backreference");
    REFUSED("{\"patternProperties\": {\"(?=a)\": {}}}", ML_ERR_UNSUPPORTED,
            "at /patternProperties", "lookaround");
    REFUSED("{\"items\": {\"format\": \"color\"}}", ML_ERR_UNSUPPORTED, "at /items: format",
            "color");
    REFUSED("{\"if\": {}, \"then\": {}}", ML_ERR_UNSUPPORTED, "'if'");
    REFUSED("{\"$ref\": \"other.json#/a\"}", ML_ERR_UNSUPPORTED, "$ref");
    REFUSED("{\"$ref\": \"#anchor\"}", ML_ERR_UNSUPPORTED, "$ref");
    REFUSED("{\"$ref\": \"#/nowhere\"}", ML_ERR_INVALID_ARG, "$ref", "resolve");
    REFUSED("{\"$dynamicRef\": \"#x\"}", ML_ERR_UNSUPPORTED, "$dynamicRef");
    REFUSED("{\"contains\": {}}", ML_ERR_UNSUPPORTED, "contains");
    REFUSED("{\"type\": \"integer\", \"multipleOf\": 0.5}", ML_ERR_UNSUPPORTED, "multipleOf");
    REFUSED("{\"type\": \"strin\"}", ML_ERR_INVALID_ARG, "type");
    REFUSED("{\"minLength\": -1}", ML_ERR_INVALID_ARG, "minLength");
    REFUSED("[1, 2]", ML_ERR_INVALID_ARG, "not an object");
    REFUSED("{\"type\": ", ML_ERR_INVALID_ARG, "not JSON");
    REFUSED("{} {}", ML_ERR_INVALID_ARG, "not JSON");
    /* $ref cycles that consume nothing. */
    REFUSED("{\"$ref\": \"#\"}", ML_ERR_UNSUPPORTED, "consumes nothing");
    REFUSED("{\"$defs\": {\"a\": {\"anyOf\": [{\"$ref\": \"#/$defs/a\"}, {\"type\": "
            "\"null\"}]}}, \"$ref\": \"#/$defs/a\"}",
            ML_ERR_UNSUPPORTED, "consumes nothing");
    /* An infinite document only. */
    REFUSED("{\"type\": \"array\", \"items\": {\"$ref\": \"#\"}, \"minItems\": 1}",
            ML_ERR_INVALID_ARG, "no document");
    /* oneOf whose overlapping branches hold a recursive reference. */
    REFUSED("{\"$defs\": {\"t\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/t\"}}}, "
            "\"oneOf\": [{\"$ref\": \"#/$defs/t\"}, {\"type\": \"array\", \"maxItems\": 1}]}",
            ML_ERR_UNSUPPORTED, "oneOf", "narrower");
    /* Alternatives that begin with the same byte, one a recursive call. */
    REFUSED("{\"anyOf\": [{\"type\": \"array\", \"items\": {\"$ref\": \"#\"}}, {\"$ref\": "
            "\"#/$defs/l\"}], \"$defs\": {\"l\": {\"type\": \"array\", \"items\": {\"$ref\": "
            "\"#/$defs/l\"}}}}",
            ML_ERR_UNSUPPORTED, "first byte");
    REFUSED("{\"$defs\": {\"a\": {\"$id\": \"http://x/a\", \"$ref\": \"#/$defs/b\"}}, "
            "\"$ref\": \"#/$defs/a\"}",
            ML_ERR_UNSUPPORTED, "$id");
    REFUSED("{\"enum\": [12345678901234567890]}", ML_ERR_UNSUPPORTED, "2^53");
    REFUSED("{\"const\": \"a\\u0000b\"}", ML_ERR_UNSUPPORTED, "u0000");
}

void test_bounds(void)
{
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    check(lim.max_schema_bytes == 256u * 1024u && lim.max_states == 200000u &&
              lim.max_compile_ms == 2000.0,
          "default limits");
    ml_grammar *g = NULL;
    char err[512];
    const char *big = "{\"type\": \"string\", \"description\": \"0123456789\"}";
    lim.max_schema_bytes = 20;
    check(ml_grammar_compile_schema(big, strlen(big), &lim, &g, err, sizeof err) ==
                  ML_ERR_TOO_LARGE &&
              strstr(err, "max_schema_bytes") && !g,
          "schema bytes bound: %s", err);
    uint8_t d[32];
    check(ml_schema_digest(big, strlen(big), &lim, d, err, sizeof err) == ML_ERR_TOO_LARGE,
          "digest bound");
    ml_schema_limits_default(&lim);
    lim.max_states = 50;
    const char *arr = "{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"maxItems\": 200}";
    check(ml_grammar_compile_schema(arr, strlen(arr), &lim, &g, err, sizeof err) ==
                  ML_ERR_TOO_LARGE &&
              !g,
          "state bound: %s", err);
    ml_schema_limits_default(&lim);
    lim.max_compile_ms = 1e-6;
    const char *slow = "{\"type\": \"array\", \"items\": {\"enum\": [\"alpha\", \"beta\", "
                       "\"gamma\"]}, \"maxItems\": 60}";
    check(ml_grammar_compile_schema(slow, strlen(slow), &lim, &g, err, sizeof err) ==
                  ML_ERR_TOO_LARGE &&
              !g,
          "time bound: %s", err);
}
