/* The schema oracle (schema_oracle.h) against Python's jsonschema: every
 * case of fixtures/schema_oracle/cases.json (schema, instance text, validity
 * as jsonschema judged it when generate.py wrote the file) must get the same
 * answer; then what the oracle refuses to judge (never reported valid) and a
 * few regex cases where ECMA-262 differs from Python's re; the strict JSON
 * text check. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "schema_oracle.h"

#define CASES_PATH ML_SOURCE_DIR "/tests/engine/fixtures/schema_oracle/cases.json"
/* The fixture holds a few hundred cases; fewer means it was cut. */
#define MIN_CASES 500

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: read failed\n", path);
        exit(1);
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_fixture(void)
{
    char *text = read_file(CASES_PATH);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        fprintf(stderr, "%s: not JSON\n", CASES_PATH);
        exit(1);
    }
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "jsonschema");
    printf("fixture judged by jsonschema %s\n", cJSON_IsString(version) ? version->valuestring : "?");
    int n = 0, n_valid = 0;
    const cJSON *group;
    cJSON_ArrayForEach(group, cJSON_GetObjectItemCaseSensitive(root, "groups")) {
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(group, "schema");
        const cJSON *test;
        cJSON_ArrayForEach(test, cJSON_GetObjectItemCaseSensitive(group, "tests")) {
            const char *inst_text = cJSON_GetObjectItemCaseSensitive(test, "text")->valuestring;
            bool want = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(test, "valid"));
            cJSON *inst = cJSON_Parse(inst_text);
            check(inst != NULL, "instance %s does not parse", inst_text);
            if (!inst)
                continue;
            char why[512];
            bool got = schema_oracle_valid(schema, inst, why, sizeof why);
            if (got != want) {
                char *s = cJSON_PrintUnformatted(schema);
                check(0, "schema %s instance %s: oracle %s (%s), jsonschema %s", s, inst_text,
                      got ? "valid" : "invalid", got ? "" : why, want ? "valid" : "invalid");
                free(s);
            } else {
                check(1, "agrees");
            }
            if (!got)
                check(strncmp(why, "oracle:", 7) != 0, "%s: refused (%s)", inst_text, why);
            n++;
            n_valid += want;
            cJSON_Delete(inst);
        }
    }
    printf("%d cases (%d valid)\n", n, n_valid);
    check(n >= MIN_CASES, "only %d cases in %s", n, CASES_PATH);
    cJSON_Delete(root);
}

/* The schema text judged on the instance text: 1 valid, 0 invalid, -1
 * refused by the oracle ("oracle: ..." in why). */
static int judge(const char *schema_text, const char *inst_text, char *why, size_t n)
{
    cJSON *schema = cJSON_Parse(schema_text), *inst = cJSON_Parse(inst_text);
    if (!schema || !inst) {
        fprintf(stderr, "judge: %s or %s is not JSON\n", schema_text, inst_text);
        exit(1);
    }
    bool ok = schema_oracle_valid(schema, inst, why, n);
    cJSON_Delete(schema);
    cJSON_Delete(inst);
    return ok ? 1 : !strncmp(why, "oracle:", 7) ? -1 : 0;
}

static void test_refusals(void)
{
    static const struct {
        const char *schema, *instance;
    } cases[] = {
        {"{\"unevaluatedProperties\":false}", "{}"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "1"},
        {"{\"$ref\":\"#/$defs/missing\"}", "1"},
        {"{\"$ref\":\"#anchor\"}", "1"},
        {"{\"$ref\":\"#\"}", "1"},                          /* a cycle that never consumes */
        {"{\"pattern\":\"(a)\\\\1\"}", "\"aa\""},          /* a back-reference */
        {"{\"pattern\":\"(?<=a)b\"}", "\"ab\""},            /* lookbehind */
        {"{\"pattern\":\"(a\"}", "\"a\""},
        {"{\"pattern\":\"a)\"}", "\"a\""},
        {"{\"pattern\":\"[b-a]\"}", "\"a\""},
        {"{\"pattern\":\"*a\"}", "\"a\""},
        {"{\"pattern\":\"(a*)*b\"}", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\""}, /* over the budget */
        {"{\"type\":\"int\"}", "1"},
        {"{\"minLength\":\"2\"}", "\"a\""},
        {"{\"not\":{\"$ref\":\"#/nowhere\"}}", "1"},          /* never flipped to valid */
        {"{\"anyOf\":[{\"$ref\":\"#/nowhere\"},true]}", "1"},
        {"{\"properties\":{\"a\":3}}", "{\"a\":1}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char why[512] = "";
        int r = judge(cases[i].schema, cases[i].instance, why, sizeof why);
        check(r == -1, "%s on %s: %d (%s), want refused", cases[i].schema, cases[i].instance, r, why);
    }
}

/* Where ECMA-262 and Python's re part (the fixture keeps off these). */
static void test_ecma(void)
{
    static const struct {
        const char *pattern, *subject;
        bool match;
    } cases[] = {
        {"^\\d$", "\xd9\xa3", false},      /* U+0663: a digit to Python, not to ECMA */
        {"^\\w$", "\xc3\xa9", false},      /* e acute */
        {"^a$", "a\n", false},             /* Python's $ also matches before a final \n */
        {"^.$", "\r", false},              /* . excludes every line terminator */
        {"^\\s$", "\xc2\xa0", true},       /* U+00A0 */
        {"^\\s$", "\xef\xbb\xbf", true},   /* U+FEFF */
        {"^a{,2}$", "a{,2}", true},        /* not a quantifier in ECMA */
        {"^x{2,1", "x{2,1", true},
        {"[]", "a", false},                /* the empty class */
        {"^[^]$", "\n", true},
        {"^\\cJ$", "\n", true},
        {"^[\\b]$", "\b", true},
        {"^(?:a|)+$", "aaa", true},
        {"^(a*)*$", "aab", false},
        {"^(?:a?)*?b", "b", true},
        {"^\\u00e9$", "\xc3\xa9", true},
        {"^.{2}$", "\xf0\x9f\x98\x80\xc3\xa9", true}, /* code points, not bytes */
        {"^\\x2d$", "-", true},
        {"^[a-\\d]+$", "a-5", true},      /* Annex B: '-' literal next to a class escape */
        {"^\\0$", "", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char why[256] = "";
        bool m = schema_oracle_pattern(cases[i].pattern, cases[i].subject, why, sizeof why);
        check(m == cases[i].match, "/%s/ on '%s': %d (%s)", cases[i].pattern, cases[i].subject, m,
              why);
        check(strncmp(why, "oracle:", 7) != 0, "/%s/: %s", cases[i].pattern, why);
    }
}

/* The strict RFC 8259 check, where cJSON is lenient. */
static void test_json_text(void)
{
    static const struct {
        const char *text;
        bool ok;
    } cases[] = {
        {"{}", true}, {" [1, -0.5e+3, \"a\\u00e9\\n\", true, null] ", true},
        {"{\"a\":{\"b\":[]}}", true}, {"\"\xc3\xa9\xf0\x9f\x98\x80\"", true},
        {"01", false}, {"+1", false}, {"1.", false}, {".5", false}, {"1e", false},
        {"[1,]", false}, {"{\"a\":1,}", false}, {"{a:1}", false}, {"'a'", false},
        {"\"\x01\"", false}, {"\"\\x\"", false}, {"\"\\u12\"", false},
        {"\"\xc3\"", false}, {"\"\xed\xa0\x80\"", false}, {"\"\xc0\xaf\"", false},
        {"1 2", false}, {"", false}, {"nul", false}, {"[", false}, {"\"abc", false},
        {"\"\\ud83d\\ude00\"", true}, {"\"\\uDDDD\"", false}, {"\"\\ud83d\"", false},
        {"\"\\ud83dx\"", false}, {"\"\\ud83d\\u0041\"", false}, {"\"\\ud83d\\n\"", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char why[128] = "";
        bool ok = schema_oracle_json_text(cases[i].text, strlen(cases[i].text), why, sizeof why);
        check(ok == cases[i].ok, "'%s': %d (%s)", cases[i].text, ok, why);
    }
}

int main(void)
{
    test_fixture();
    test_refusals();
    test_ecma();
    test_json_text();
    return check_done();
}
