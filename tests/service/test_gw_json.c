/* The gateway's strict JSON scanner (service/gateway/gw_json.c): what it
 * accepts and refuses (every accepted text also parses with cJSON), member
 * and element lookup, and the compact copy. */
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway/gw_json.h"
#include "harness.h"

static bool accepts(const char *text)
{
    return gw_json_value(text, strlen(text)).p != NULL;
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

    char deep[2 * (GW_JSON_DEPTH_MAX + 1) + 1];
    for (int i = 0; i <= GW_JSON_DEPTH_MAX; i++) {
        deep[i] = '[';
        deep[2 * (GW_JSON_DEPTH_MAX + 1) - 1 - i] = ']';
    }
    deep[2 * (GW_JSON_DEPTH_MAX + 1)] = '\0';
    check(!accepts(deep), "refuses %d levels", GW_JSON_DEPTH_MAX + 1);
    check(accepts(deep + 1) == false, "unbalanced");
    deep[2 * (GW_JSON_DEPTH_MAX + 1) - 1] = '\0';
    check(accepts(deep + 1), "accepts %d levels", GW_JSON_DEPTH_MAX);

    char number[GW_JSON_NUMBER_MAX + 2];
    memset(number, '1', sizeof number - 1);
    number[sizeof number - 1] = '\0';
    check(!accepts(number), "refuses a %d-character number", GW_JSON_NUMBER_MAX + 1);
    number[GW_JSON_NUMBER_MAX] = '\0';
    check(accepts(number), "accepts a %d-character number", GW_JSON_NUMBER_MAX);
}

static bool span_is(gw_span v, const char *s)
{
    return v.p && v.n == strlen(s) && memcmp(v.p, s, v.n) == 0;
}

static void test_lookup(void)
{
    static const char text[] = " { \"a\" : 1 , \"b\":{\"x\":[ ]}, \"a\": 2, \"s\\\"\": \"v\"}";
    gw_span root = gw_json_value(text, strlen(text));
    check(gw_json_is(root, '{') && root.p[root.n - 1] == '}', "the object without whitespace");
    check(span_is(gw_json_member(root, "a"), "1"), "the first of duplicate keys");
    gw_span b = gw_json_member(root, "b");
    check(span_is(b, "{\"x\":[ ]}"), "a nested object");
    gw_span x = gw_json_member(b, "x");
    check(gw_json_is(x, '[') && gw_json_is_empty(x) && !gw_json_first(x).p, "an empty array");
    check(!gw_json_is_empty(b), "a non-empty object");
    check(!gw_json_member(root, "missing").p, "a missing member");
    check(!gw_json_member(root, "s").p, "keys compare as written");

    static const char arr[] = "[ \"q\\\"\" , 2 ]";
    gw_span first = gw_json_first(gw_json_value(arr, strlen(arr)));
    check(span_is(first, "\"q\\\"\"") && span_is(gw_json_inner(first), "q\\\""), "first element");
    check(gw_json_is_null(gw_json_value("null", 4)) && gw_json_is_null((gw_span){NULL, 0}),
          "null or absent");
    check(gw_json_is_number(gw_json_value("-1", 2)) && !gw_json_is_number(first), "numbers");
}

static void test_compact(void)
{
    static const char text[] = "{ \"a b\" :\n[ 1 ,\t\"x \\\" y\" ] }";
    svc_buf b;
    svc_buf_init(&b);
    check(gw_json_put_compact(&b, gw_json_value(text, strlen(text))) == 0, "compact");
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
