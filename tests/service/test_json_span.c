/* The strict JSON scanner (service/protocol/json_span.c): what it
 * accepts and refuses (every accepted text also parses with cJSON), member
 * and element lookup, and the compact copy. */
#include <string.h>

#include <cjson/cJSON.h>

#include "protocol/json_span.h"
#include "harness.h"

static bool accepts(const char *text)
{
    return svc_json_value(text, strlen(text)).p != NULL;
}

static void test_accepts(void)
{
    static const char *ok[] = {
        "{}",
        " [ ] ",
        "0",
        "-0",
        "-0.5e+3",
        "1.0E-7",
        "true",
        "null",
        "\"\"",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"",
        "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"",
        "\t{\"a\" : [1, -2, {\"b\": null}], \"c\": \"\\u0000\"}\r\n",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        check(accepts(ok[i]), "accepts %s", ok[i]);
        cJSON *j = cJSON_Parse(ok[i]);
        check(j != NULL, "cJSON agrees on %s", ok[i]);
        cJSON_Delete(j);
    }
}

static void test_refuses(void)
{
    static const char *bad[] = {
        "",
        "  ",
        "01",
        "1.",
        ".5",
        "-",
        "+1",
        "1e",
        "tru",
        "nul",
        "\"open",
        "\"raw\x01control\"",
        "\"raw\nnewline\"",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\xff\"",
        "\"\xc3\"",
        "\"\xed\xa0\x80\"",
        "{\"a\"}",
        "{\"a\":1,}",
        "{a:1}",
        "[1,]",
        "[1 2]",
        "{} {}",
        "[",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check(!accepts(bad[i]), "refuses %s", bad[i]);

    char deep[2 * (SVC_JSON_DEPTH_MAX + 1) + 1];
    for (int i = 0; i <= SVC_JSON_DEPTH_MAX; i++) {
        deep[i] = '[';
        deep[2 * (SVC_JSON_DEPTH_MAX + 1) - 1 - i] = ']';
    }
    deep[2 * (SVC_JSON_DEPTH_MAX + 1)] = '\0';
    check(!accepts(deep), "refuses %d levels", SVC_JSON_DEPTH_MAX + 1);
    check(accepts(deep + 1) == false, "unbalanced");
    deep[2 * (SVC_JSON_DEPTH_MAX + 1) - 1] = '\0';
    check(accepts(deep + 1), "accepts %d levels", SVC_JSON_DEPTH_MAX);

    char number[SVC_JSON_NUMBER_MAX + 2];
    memset(number, '1', sizeof number - 1);
    number[sizeof number - 1] = '\0';
    check(!accepts(number), "refuses a %d-character number", SVC_JSON_NUMBER_MAX + 1);
    number[SVC_JSON_NUMBER_MAX] = '\0';
    check(accepts(number), "accepts a %d-character number", SVC_JSON_NUMBER_MAX);
}

static bool span_is(svc_span v, const char *s)
{
    return v.p && v.n == strlen(s) && memcmp(v.p, s, v.n) == 0;
}

static void test_lookup(void)
{
    static const char text[] = " { \"a\" : 1 , \"b\":{\"x\":[ ]}, \"a\": 2, \"s\\\"\": \"v\"}";
    svc_span root = svc_json_value(text, strlen(text));
    check(svc_json_is(root, '{') && root.p[root.n - 1] == '}', "the object without whitespace");
    check(span_is(svc_json_member(root, "a"), "1"), "the first of duplicate keys");
    svc_span b = svc_json_member(root, "b");
    check(span_is(b, "{\"x\":[ ]}"), "a nested object");
    svc_span x = svc_json_member(b, "x");
    check(svc_json_is(x, '[') && svc_json_is_empty(x) && !svc_json_first(x).p, "an empty array");
    check(!svc_json_is_empty(b), "a non-empty object");
    check(!svc_json_member(root, "missing").p, "a missing member");
    check(!svc_json_member(root, "s").p, "keys compare as written");

    static const char arr[] = "[ \"q\\\"\" , 2 ]";
    svc_span a = svc_json_value(arr, strlen(arr));
    svc_span first = svc_json_first(a);
    check(span_is(first, "\"q\\\"\"") && span_is(svc_json_inner(first), "q\\\""), "first element");
    svc_span second = svc_json_next(a, first);
    check(span_is(second, "2"), "the next element, past the whitespace and the comma");
    check(!svc_json_next(a, second).p, "no element after the last");
    check(svc_json_is_null(svc_json_value("null", 4)) && svc_json_is_null((svc_span){NULL, 0}),
          "null or absent");
    check(svc_json_is_number(svc_json_value("-1", 2)) && !svc_json_is_number(first), "numbers");
}

static void test_compact(void)
{
    static const char text[] = "{ \"a b\" :\n[ 1 ,\t\"x \\\" y\" ] }";
    svc_buf b;
    svc_buf_init(&b);
    check(svc_json_put_compact(&b, svc_json_value(text, strlen(text))) == 0, "compact");
    check(strcmp(b.data, "{\"a b\":[1,\"x \\\" y\"]}") == 0, "whitespace only outside strings: %s",
          b.data);
    svc_buf_deinit(&b);
}

int main(void)
{
    test_accepts();
    test_refuses();
    test_lookup();
    test_compact();
    return check_done();
}
