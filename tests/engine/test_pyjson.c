/* The chat template's tojson (engine/tokenizer/pyjson.h) against Python:
 * every expected text below is what Python 3.11's
 * json.dumps(json.loads(input), ensure_ascii=False, indent=...) writes
 * (checked by hand with CPython 3.11.7). Inputs Python reads but pyjson
 * refuses on purpose (duplicate keys, lone surrogates, NaN, numbers past a
 * double) are checked for a clear error and an untouched buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tokenizer/pyjson.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct dump_case {
    const char *in;
    const char *want;
} dump_case;

static void expect_dumps(const dump_case *cases, size_t n, int indent)
{
    for (size_t i = 0; i < n; i++) {
        ml_pyjson_buf out = {0};
        char err[160] = "";
        ml_status st = ml_pyjson_dumps(cases[i].in, strlen(cases[i].in), indent, &out, err,
                                       sizeof err);
        check(st == ML_OK, "dumps(%s, indent %d): %s", cases[i].in, indent, err);
        if (st == ML_OK)
            check(out.len == strlen(cases[i].want) && !strcmp(out.data, cases[i].want),
                  "dumps(%s, indent %d)\n got: %s\nwant: %s", cases[i].in, indent, out.data,
                  cases[i].want);
        ml_pyjson_buf_deinit(&out);
    }
}

/* repr(float(text)) for numbers with '.', 'e' or 'E'; integers as int. */
static void test_numbers(void)
{
    static const dump_case cases[] = {
        {"1.0", "1.0"},
        {"1", "1"},
        {"-0", "0"},
        {"-0.0", "-0.0"},
        {"0e0", "0.0"},
        {"-0E+3", "-0.0"},
        {"1E2", "100.0"},
        {"1e16", "1e+16"},
        {"1e15", "1000000000000000.0"},
        {"9999999999999998.0", "9999999999999998.0"},
        {"12345678901234567.0", "1.2345678901234568e+16"},
        {"0.0001", "0.0001"},
        {"0.00001", "1e-05"},
        {"1.5e-5", "1.5e-05"},
        {"123.456e-2", "1.23456"},
        {"0.1", "0.1"},
        {"0.30000000000000004", "0.30000000000000004"},
        {"0.5", "0.5"},
        {"2.5e-7", "2.5e-07"},
        {"1e22", "1e+22"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"},
        {"5e-324", "5e-324"},
        {"2.4703282292062328e-324", "5e-324"}, /* rounds up to the smallest subnormal */
        {"1e-400", "0.0"},                     /* underflow: Python reads 0.0 */
        {"-1e-400", "-0.0"},
        {"9007199254740993.0", "9007199254740992.0"},
        {"8.98846567431158e307", "8.98846567431158e+307"}, /* 2^1023 */
        {"123456789012345678901234567890", "123456789012345678901234567890"},
        {"-123456789012345678901234567890", "-123456789012345678901234567890"},
        {"100", "100"},
    };
    expect_dumps(cases, N_OF(cases), ML_PYJSON_NO_INDENT);

    /* Powers of two whose shortest digits lie on the wide side of the
     * rounding interval, where the nearest 16-digit decimal does not read
     * back (2^-1017, 2^-808, 2^89, 2^976; input: 17 digits, "%.16e"). */
    static const dump_case powers[] = {
        {"7.1202363472230444e-307", "7.120236347223045e-307"},
        {"5.8581906792798084e-244", "5.858190679279809e-244"},
        {"6.1897001964269014e+26", "6.189700196426902e+26"},
        {"6.3866889905111034e+293", "6.386688990511104e+293"},
        {"9.223372036854776e18", "9.223372036854776e+18"}, /* 2^63 */
    };
    expect_dumps(powers, N_OF(powers), ML_PYJSON_NO_INDENT);
}

static void test_strings(void)
{
    static const dump_case cases[] = {
        {"\"plain\"", "\"plain\""},
        {"\"q\\\" b\\\\ s\\/\"", "\"q\\\" b\\\\ s/\""},
        {"\"\\b\\f\\n\\r\\t\"", "\"\\b\\f\\n\\r\\t\""},
        {"\"\\u0000\\u0001\\u001F\\u001f\"", "\"\\u0000\\u0001\\u001f\\u001f\""},
        {"\"\\u007f\\u0080\"", "\"\x7f\xc2\x80\""},
        {"\"\\u00e9 \\u00E9 \xc3\xa9\"", "\"\xc3\xa9 \xc3\xa9 \xc3\xa9\""},
        {"\"\\u2028\\u2029\"", "\"\xe2\x80\xa8\xe2\x80\xa9\""},
        {"\"\\ud83d\\ude00 \xf0\x9f\x98\x80\"", "\"\xf0\x9f\x98\x80 \xf0\x9f\x98\x80\""},
        {"\"\\uFFFF\\uDBFF\\uDFFF\"", "\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\""},
        {"\"<|eot_id|></script>&\"", "\"<|eot_id|></script>&\""}, /* no HTML escaping */
        {"\"\"", "\"\""},
    };
    expect_dumps(cases, N_OF(cases), ML_PYJSON_NO_INDENT);
}

static void test_containers(void)
{
    static const dump_case flat[] = {
        {" { \"b\" :1 ,\"a\":[ 1,2 , {} ,[] ] } ", "{\"b\": 1, \"a\": [1, 2, {}, []]}"},
        {"[true,false,null]", "[true, false, null]"},
        {"[[[]]]", "[[[]]]"},
        {"{\"\":{\"\":0}}", "{\"\": {\"\": 0}}"},
        {"\t\r\n 7 \n", "7"},
        /* Keys that differ only in how they were escaped are one key. */
        {"{\"a\":1,\"b\":{\"a\":2}}", "{\"a\": 1, \"b\": {\"a\": 2}}"},
    };
    expect_dumps(flat, N_OF(flat), ML_PYJSON_NO_INDENT);
    static const dump_case indented[] = {
        {"{\"a\":[1,{\"b\":null}],\"c\":{},\"d\":[]}",
         "{\n    \"a\": [\n        1,\n        {\n            \"b\": null\n        }\n    ],\n"
         "    \"c\": {},\n    \"d\": []\n}"},
        {"[]", "[]"},
        {"\"s\"", "\"s\""},
    };
    expect_dumps(indented, N_OF(indented), 4);
    static const dump_case zero_indent[] = {{"[1,[2]]", "[\n1,\n[\n2\n]\n]"}};
    expect_dumps(zero_indent, N_OF(zero_indent), 0);
}

/* Refused input: ML_ERR_INVALID_ARG, a reason, and the buffer as it was. */
static void test_refused(void)
{
    static const struct {
        const char *in;
        const char *why;
    } cases[] = {
        {"", "value expected"},
        {"   ", "value expected"},
        {"[1,]", "invalid value"},
        {"[1 2]", "',' or ']'"},
        {"{\"a\" 1}", "':' expected"},
        {"{1:2}", "key is not a string"},
        {"{\"a\":1,}", "key is not a string"},
        {"01", "text after the value"},
        {"1.", "no digit after the decimal point"},
        {"1e", "no digit in the exponent"},
        {"-", "invalid value"},
        {"+1", "invalid value"},
        {".5", "invalid value"},
        {"NaN", "invalid value"},
        {"Infinity", "invalid value"},
        {"-Infinity", "invalid value"},
        {"tru", "invalid value"},
        {"1e400", "beyond the range of a double"},
        {"-1e309", "beyond the range of a double"},
        {"\"abc", "unterminated string"},
        {"\"a\tb\"", "control character"},
        {"\"\\x41\"", "invalid escape"},
        {"\"\\u12xy\"", "4 hex digits"},
        {"\"\\u12", "cut short"},
        {"\"\\ud800\"", "lone surrogate"},
        {"\"\\ud800\\u0041\"", "lone surrogate"},
        {"\"\\udc00\"", "lone surrogate"},
        {"\"\xc3\"", "ill-formed UTF-8"},
        {"\"\xed\xa0\x80\"", "ill-formed UTF-8"}, /* a surrogate in UTF-8 */
        {"\"\xc0\xaf\"", "ill-formed UTF-8"},     /* overlong */
        {"{\"a\":1,\"a\":2}", "key repeated"},
        {"{\"a\":1,\"\\u0061\":2}", "key repeated"},
        {"{\"k\":{\"x\":1,\"y\":2,\"x\":3}}", "key repeated"},
        {"[1] [2]", "text after the value"},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        ml_pyjson_buf out = {0};
        char err[160] = "";
        check(ml_pyjson_dumps("\"kept\"", 6, ML_PYJSON_NO_INDENT, &out, NULL, 0) == ML_OK,
              "a string");
        size_t before = out.len;
        ml_status st = ml_pyjson_dumps(cases[i].in, strlen(cases[i].in), ML_PYJSON_NO_INDENT, &out, err,
                             sizeof err);
        check(st == ML_ERR_INVALID_ARG && strstr(err, cases[i].why) && strstr(err, "tojson: byte"),
              "%s: %s '%s', want '%s'", cases[i].in, ml_status_name(st), err, cases[i].why);
        check(out.len == before && !memcmp(out.data, "\"kept\"", before), "%s: buffer kept",
              cases[i].in);
        ml_pyjson_buf_deinit(&out);
    }

    /* An integer of ML_PYJSON_INT_MAX_DIGITS digits is read, one more is not. */
    char *big = malloc(ML_PYJSON_INT_MAX_DIGITS + 2);
    memset(big, '7', ML_PYJSON_INT_MAX_DIGITS + 1);
    big[ML_PYJSON_INT_MAX_DIGITS + 1] = '\0';
    ml_pyjson_buf out = {0};
    char err[160] = "";
    check(ml_pyjson_dumps(big, ML_PYJSON_INT_MAX_DIGITS, ML_PYJSON_NO_INDENT, &out, err,
                          sizeof err) == ML_OK &&
              out.len == ML_PYJSON_INT_MAX_DIGITS,
          "an integer of the most digits: %s", err);
    check(ml_pyjson_dumps(big, ML_PYJSON_INT_MAX_DIGITS + 1, ML_PYJSON_NO_INDENT, &out, err,
                          sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "more digits"),
          "an integer of one digit more: %s", err);
    free(big);
    ml_pyjson_buf_deinit(&out);

    check(ml_pyjson_dumps("1", 1, -2, &out, err, sizeof err) == ML_ERR_INVALID_ARG,
          "negative indent");
    ml_pyjson_buf_deinit(&out);
}

/* Nesting up to ML_PYJSON_MAX_DEPTH is read, one level more is not. */
static void test_depth(void)
{
    char text[2 * (ML_PYJSON_MAX_DEPTH + 1) + 1];
    for (int extra = 0; extra <= 1; extra++) {
        size_t depth = ML_PYJSON_MAX_DEPTH + (size_t)extra;
        memset(text, '[', depth);
        memset(text + depth, ']', depth);
        ml_pyjson_buf out = {0};
        char err[160] = "";
        ml_status st = ml_pyjson_dumps(text, 2 * depth, ML_PYJSON_NO_INDENT, &out, err,
                                       sizeof err);
        if (extra)
            check(st == ML_ERR_INVALID_ARG && strstr(err, "nested deeper"), "depth %zu: %s",
                  depth, err);
        else
            check(st == ML_OK && out.len == 2 * depth && !memcmp(out.data, text, out.len),
                  "depth %zu: %s", depth, err);
        ml_pyjson_buf_deinit(&out);
    }
}

/* Calls append; the text need not be NUL-terminated. */
static void test_append(void)
{
    ml_pyjson_buf out = {0};
    char err[160] = "";
    check(ml_pyjson_dumps("[1]xyz", 3, ML_PYJSON_NO_INDENT, &out, err, sizeof err) == ML_OK &&
              ml_pyjson_dumps("{\"a\":2.50}", 10, 2, &out, err, sizeof err) == ML_OK,
          "append: %s", err);
    check(out.data && !strcmp(out.data, "[1]{\n  \"a\": 2.5\n}"), "append: '%s'",
          out.data ? out.data : "");
    ml_pyjson_buf_deinit(&out);
    check(out.data == NULL && out.len == 0 && out.cap == 0, "deinit zeroes");
}

int main(void)
{
    test_numbers();
    test_strings();
    test_containers();
    test_refused();
    test_depth();
    test_append();
    return check_done();
}
