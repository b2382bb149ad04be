/* engine/grammar/lexemes.h: the one form of characters, the content of a
 * given text, strings under length, pattern and format (format_cases.h,
 * judged by Python's jsonschema through tests/golden/gen_format_cases.py:
 * what is accepted is valid, the common cases are accepted), integers under
 * bounds and multipleOf against exact arithmetic, and numbers under bounds
 * against Python's comparison (an integer text exactly, a fraction as its
 * rounded double): accepted texts are within, texts clearly within are
 * accepted. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format_cases.h"
#include "grammar/lexemes.h"
#include "harness.h"

#define BOUND 200000u

static bool m(const ml_fsm *a, const char *text)
{
    return ml_fsm_matches(a, text, strlen(text));
}

/* Every state after the opening quote and before the closing one is tagged. */
static void check_string_tags(const ml_fsm *a, const char *what)
{
    const ml_fsm_edge *e;
    size_t n = ml_fsm_edges(a, 0, &e);
    check(ml_fsm_tags(a, 0) == 0 && n == 1 && e[0].lo == '"' && e[0].hi == '"', "%s: quote first",
          what);
    for (uint32_t s = 1; s < ml_fsm_n_states(a); s++) {
        bool final = ml_fsm_accepting(a, s);
        check(final ? ml_fsm_tags(a, s) == 0 : ml_fsm_tags(a, s) == ML_FSM_TAG_IN_STRING,
              "%s: state %u tags %u", what, s, ml_fsm_tags(a, s));
    }
}

static void test_content_of(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    const char text[] = "a\"b\\c\n\x01\x1f/\xc3\xa9\xf0\x9f\x98\x80";
    ml_fsm *a = ml_lex_json_string_content_of(c, text, sizeof text - 1);
    check(m(a, "a\\\"b\\\\c\\n\\u0001\\u001f/\xc3\xa9\xf0\x9f\x98\x80"), "one form");
    check(!m(a, "a\\\"b\\\\c\\n\\u0001\\u001F/\xc3\xa9\xf0\x9f\x98\x80") &&
              !m(a, "a\\\"b\\\\c\\u000a\\u0001\\u001f/\xc3\xa9\xf0\x9f\x98\x80") &&
              !m(a, "a\\\"b\\\\c\\n\\u0001\\u001f\\/\xc3\xa9\xf0\x9f\x98\x80"),
          "no other form");
    for (uint32_t s = 0; s < ml_fsm_n_states(a); s++)
        check(ml_fsm_tags(a, s) == ML_FSM_TAG_IN_STRING, "content tagged");
    ml_fsm_free(a);
    a = ml_lex_json_string_content_of(c, "", 0);
    check(m(a, "") && !m(a, "a"), "empty text");
    ml_fsm_free(a);
    check(ml_lex_json_string_content_of(c, "ab\xed\xa0\x80", 5) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_INVALID_ARG && strstr(ml_fsm_ctx_error(c), "byte 2"),
          "surrogate refused: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);
}

static void test_char(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    static const uint32_t ranges[][2] = {{0x00, 0x0A}, {'"', '"'}, {'0', '9'}, {0xE9, 0xE9}};
    ml_fsm *a = ml_lex_json_char(c, ranges, 4);
    check(m(a, "\\u0000") && m(a, "\\n") && m(a, "\\t") && m(a, "\\b") && m(a, "\\\"") &&
              m(a, "5") && m(a, "\xc3\xa9"),
          "in the set");
    check(!m(a, "\\u000b") && !m(a, "\\f") && !m(a, "\\\\") && !m(a, "a") && !m(a, "\n") &&
              !m(a, "\"") && !m(a, "\\u0009"),
          "outside the set or in another form");
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

static ml_fsm *string_of(ml_fsm_ctx *c, uint32_t min, uint32_t max, const char *pattern,
                         const char *format)
{
    ml_lex_string s = {min, max, pattern, pattern ? strlen(pattern) : 0, format};
    return ml_lex_json_string(c, &s);
}

static void test_strings(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = string_of(c, 0, ML_FSM_UNBOUNDED, NULL, NULL);
    check(m(a, "\"\"") && m(a, "\"a\\\"\\u0001\xc3\xa9\"") && !m(a, "\"\n\"") && !m(a, "\"a") &&
              !m(a, "\"\\x\""),
          "any string");
    check_string_tags(a, "any string");
    ml_fsm_free(a);

    a = string_of(c, 2, 3, NULL, NULL);
    check(m(a, "\"ab\"") && m(a, "\"\xc3\xa9\xf0\x9f\x98\x80\"") && m(a, "\"\\n\\t\\u0001\"") &&
              !m(a, "\"a\"") && !m(a, "\"abcd\"") && !m(a, "\"\xc3\xa9\""),
          "lengths count code points");
    check_string_tags(a, "length");
    ml_fsm_free(a);

    a = string_of(c, 3, 2, NULL, NULL);
    check(a && ml_fsm_is_empty(a) && ml_fsm_ctx_status(c) == ML_OK, "min over max: empty");
    ml_fsm_free(a);

    a = string_of(c, 0, 4, "^[a-c]+$", NULL);
    check(m(a, "\"abca\"") && !m(a, "\"abcab\"") && !m(a, "\"\"") && !m(a, "\"abd\""),
          "pattern and length");
    check_string_tags(a, "pattern");
    ml_fsm_free(a);

    a = string_of(c, 0, ML_FSM_UNBOUNDED, "b", "email");
    check(m(a, "\"bob@example.com\"") && !m(a, "\"joe@example.com\""), "pattern and format");
    ml_fsm_free(a);

    check(string_of(c, 0, ML_FSM_UNBOUNDED, NULL, "iri") == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED && strstr(ml_fsm_ctx_error(c), "iri"),
          "unknown format: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    /* A format JSON Schema does not define is an annotation. */
    c = ml_fsm_ctx_create(BOUND, 0);
    a = string_of(c, 0, 3, NULL, "byte");
    check(m(a, "\"a=\"") && m(a, "\"\"") && !m(a, "\"abcd\"") && ml_fsm_ctx_status(c) == ML_OK,
          "an undefined format constrains nothing: %s", ml_fsm_ctx_error(c));
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    check(string_of(c, 0, ML_FSM_UNBOUNDED, "(?=x)", NULL) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED && strstr(ml_fsm_ctx_error(c), "byte 0"),
          "refused pattern: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(1000, 0);
    check(string_of(c, 0, 5000, NULL, NULL) == NULL && ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE,
          "maxLength past the state bound");
    ml_fsm_ctx_destroy(c);
}

static void test_formats(void)
{
    size_t n = sizeof format_cases / sizeof format_cases[0];
    for (size_t i = 0; ml_lex_formats[i]; i++) {
        ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
        const char *f = ml_lex_formats[i];
        ml_fsm *a = string_of(c, 0, ML_FSM_UNBOUNDED, NULL, f);
        check(a != NULL, "%s: %s", f, ml_fsm_ctx_error(c));
        if (a)
            check_string_tags(a, f);
        size_t cases = 0;
        for (size_t k = 0; a && k < n; k++) {
            const struct format_case *fc = &format_cases[k];
            if (strcmp(fc->format, f) != 0)
                continue;
            cases++;
            char text[1024];
            snprintf(text, sizeof text, "\"%s\"", fc->content);
            bool got = m(a, text);
            check(!got || fc->valid, "%s: accepts invalid %s", f, text);
            check(got || !fc->common, "%s: refuses %s", f, text);
        }
        check(cases > 0, "%s: no cases", f);
        ml_fsm_free(a);
        ml_fsm_ctx_destroy(c);
    }
}

/* ---- integers ------------------------------------------------------------------- */

static ml_lex_bound bnd(bool present, bool exclusive, double v)
{
    return (ml_lex_bound){present, exclusive, v};
}

static bool within(long double v, ml_lex_bound lo, ml_lex_bound hi)
{
    if (lo.present && (lo.exclusive ? !(v > lo.value) : !(v >= lo.value)))
        return false;
    return !hi.present || (hi.exclusive ? v < hi.value : v <= hi.value);
}

static void test_integers(void)
{
    static const double values[] = {-250, -17.5, -7, -1, -0.5, 0, 0.5, 1, 3, 7.25, 99, 100, 250};
    static const uint64_t multiples[] = {0, 1, 3, 7, 10, 25, 12, 1000};
    size_t nv = sizeof values / sizeof values[0], wrong = 0, built = 0;
    for (size_t il = 0; il <= nv; il++)
        for (size_t ih = 0; ih <= nv; ih++)
            for (size_t im = 0; im < sizeof multiples / sizeof multiples[0]; im++) {
                ml_lex_bound lo = bnd(il < nv, (il + ih) % 2, il < nv ? values[il] : 0);
                ml_lex_bound hi = bnd(ih < nv, (il + ih + im) % 3 == 0, ih < nv ? values[ih] : 0);
                uint64_t mul = multiples[im];
                ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
                ml_fsm *a = ml_lex_json_integer(c, lo, hi, mul);
                check(a != NULL, "integer: %s", ml_fsm_ctx_error(c));
                built++;
                for (int64_t v = -1200; a && v <= 1200; v++) {
                    char text[32];
                    snprintf(text, sizeof text, "%lld", (long long)v);
                    bool want =
                        within((long double)v, lo, hi) && (mul == 0 || v % (int64_t)mul == 0);
                    if (m(a, text) != want && wrong++ < 10)
                        fprintf(stderr, "  integer %s in [%g%s, %g%s] mul %llu: got %d\n", text,
                                lo.value, lo.present ? (lo.exclusive ? " excl" : "") : " none",
                                hi.value, hi.present ? (hi.exclusive ? " excl" : "") : " none",
                                (unsigned long long)mul, !want);
                }
                if (a)
                    check(!m(a, "-0") && !m(a, "01") && !m(a, "1.0") && !m(a, "1e2") && !m(a, "+1"),
                          "integer: canonical forms only");
                ml_fsm_free(a);
                ml_fsm_ctx_destroy(c);
            }
    check(wrong == 0, "integers: %zu wrong over %zu automata", wrong, built);

    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_lex_json_integer(c, bnd(false, false, 0), bnd(false, false, 0), 0);
    check(m(a, "9999999999999999999") && !m(a, "10000000000000000000") &&
              m(a, "-9999999999999999999") && m(a, "0"),
          "unbounded: at most 19 digits");
    ml_fsm_free(a);
    a = ml_lex_json_integer(c, bnd(true, false, 9007199254740991.0),
                            bnd(true, false, 9007199254740991.0), 0);
    check(m(a, "9007199254740991") && !m(a, "9007199254740992") && !m(a, "9007199254740990"),
          "2^53 - 1 exactly");
    ml_fsm_free(a);
    /* From 2^53 on a bound moves one double inward: the schema's integer
     * may have been rounded into it. */
    a = ml_lex_json_integer(c, bnd(true, false, 4611686018427387904.0), bnd(false, false, 0), 0);
    check(!m(a, "4611686018427387904") && !m(a, "4611686018427387905") &&
              m(a, "4611686018427388928"),
          "minimum 2^62 moves inward");
    ml_fsm_free(a);
    a = ml_lex_json_integer(c, bnd(true, false, 0), bnd(false, false, 0), 2);
    check(m(a, "9007199254740992") && !m(a, "9007199254740994"), "multipleOf: up to 2^53");
    ml_fsm_free(a);
    check(ml_lex_json_integer(c, bnd(true, false, -1e19), bnd(false, false, 0), 0) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED,
          "bound beyond 2^63");
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    check(ml_lex_json_integer(c, bnd(true, false, NAN), bnd(false, false, 0), 0) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_INVALID_ARG,
          "NaN bound");
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(1000, 0);
    check(ml_lex_json_integer(c, bnd(false, false, 0), bnd(false, false, 0), 1000003) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE,
          "multipleOf past the state bound");
    ml_fsm_ctx_destroy(c);
}

/* ---- numbers -------------------------------------------------------------------- */

/* Python's verdict: an integer text compared exactly, a fraction or an
 * exponent as its rounded double. */
static bool python_within(const char *text, ml_lex_bound lo, ml_lex_bound hi)
{
    if (strpbrk(text, ".eE"))
        return within(strtod(text, NULL), lo, hi);
    return within(strtold(text, NULL), lo, hi); /* <= 19 digits: exact in a long double */
}

static void test_numbers(void)
{
    static const double bounds[] = {-1e20, -7, -1.5, -0.1, 0, 0.1, 1, 1.5, 2.5, 100, 1e20};
    static const char *const texts[] = {
        "0",
        "-0",
        "-0.0",
        "1",
        "-1",
        "2",
        "-2",
        "7",
        "-7",
        "100",
        "-100",
        "0.1",
        "-0.1",
        "0.10000000000000001",
        "0.1000000000000000055511151231257827021181583404541015625",
        "0.09999999999999999",
        "0.10000000000000000555",
        "-0.10000000000000001",
        "1.5",
        "-1.5",
        "1.4999999999999999",
        "1.50000000000000001",
        "2.5",
        "2.4",
        "99.99",
        "100.0",
        "100.5",
        "0.5",
        "-0.5",
        "1.0",
        "-7.0",
        "-6.999999999999999999",
        "100000000000000000000",
        "99999999999999999999.5",
        "100000000000000000000.0",
        "-100000000000000000000.0",
        "1e1",
        "1E+2",
        "2.5e-1",
        "-1e1",
        "0.000",
        "3",
        "0.3",
        "0.30",
        "1.25",
        "5",
        "-3.25",
        "42",
    };
    size_t nb = sizeof bounds / sizeof bounds[0], nt = sizeof texts / sizeof texts[0];
    size_t wider = 0, narrower = 0;
    for (size_t il = 0; il <= nb; il++)
        for (size_t ih = 0; ih <= nb; ih++)
            for (int excl = 0; excl < 4; excl++) {
                ml_lex_bound lo = bnd(il < nb, excl & 1, il < nb ? bounds[il] : 0);
                ml_lex_bound hi = bnd(ih < nb, excl & 2, ih < nb ? bounds[ih] : 0);
                ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
                ml_fsm *a = ml_lex_json_number(c, lo, hi);
                check(a != NULL, "number: %s", ml_fsm_ctx_error(c));
                for (size_t t = 0; a && t < nt; t++) {
                    const char *x = texts[t];
                    bool got = m(a, x), valid = python_within(x, lo, hi);
                    if (got && !valid && wider++ < 10)
                        fprintf(stderr, "  number %s accepted in [%g %d, %g %d]\n", x, lo.value,
                                lo.present + lo.exclusive, hi.value, hi.present + hi.exclusive);
                    /* Clearly within: no exponent under a bound, not a negative
                     * zero, at most 17 significant digits, away from the bounds. */
                    double v = strtod(x, NULL);
                    bool plain = !strpbrk(x, "eE") || (!lo.present && !hi.present);
                    bool clear = valid && plain && strlen(x) <= 18 && strncmp(x, "-0", 2) != 0 &&
                                 (!lo.present || fabs(v - lo.value) > 1e-9) &&
                                 (!hi.present || fabs(v - hi.value) > 1e-9);
                    if (clear && !got && narrower++ < 10)
                        fprintf(stderr, "  number %s refused in [%g %d, %g %d]\n", x, lo.value,
                                lo.present + lo.exclusive, hi.value, hi.present + hi.exclusive);
                }
                if (a)
                    check(!m(a, "01") && !m(a, "1.") && !m(a, ".5") && !m(a, "+1") && !m(a, "1e"),
                          "number: JSON forms only");
                ml_fsm_free(a);
                ml_fsm_ctx_destroy(c);
            }
    check(wider == 0, "numbers: %zu texts accepted outside their bounds", wider);
    check(narrower == 0, "numbers: %zu texts refused well within their bounds", narrower);

    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_lex_json_number(c, bnd(false, false, 0), bnd(false, false, 0));
    check(m(a, "-0") && m(a, "1e400") && m(a, "-1.5E-7") && m(a, "12345678901234567890.5") &&
              !m(a, "12345678901234567890") && m(a, "1234567890123456789"),
          "unbounded number");
    ml_fsm_free(a);
    /* exclusiveMinimum 0: the smallest accepted is 1e-30. */
    a = ml_lex_json_number(c, bnd(true, true, 0), bnd(false, false, 0));
    check(m(a, "0.000000000000000000000000000001") && !m(a, "0.0000000000000000000000000000009") &&
              !m(a, "0") && !m(a, "0.0"),
          "exclusive minimum 0");
    ml_fsm_free(a);
    a = ml_lex_json_number(c, bnd(true, false, 1e300), bnd(false, false, 0));
    char big[310]; /* integer texts stop at 19 digits: these have a fraction */
    memset(big, '0', sizeof big);
    big[0] = '2';
    memcpy(big + 301, ".5", 3);
    bool above = m(a, big);
    big[0] = '9';
    memcpy(big + 300, ".5", 3);
    check(above && !m(a, big), "a bound of 1e300");
    ml_fsm_free(a);
    check(ml_lex_json_number(c, bnd(true, false, INFINITY), bnd(false, false, 0)) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_INVALID_ARG,
          "infinite bound");
    ml_fsm_ctx_destroy(c);
}

int main(void)
{
    test_content_of();
    test_char();
    test_strings();
    test_formats();
    test_integers();
    test_numbers();
    return check_done();
}
