/* engine/grammar/regex.h: a table of (pattern, string content, match)
 * where Python's re.search and JavaScript's RegExp agree
 * (regex_cases.h, from tests/golden/gen_regex_cases.py), the narrowings of
 * regex.c's header, the refused constructs with their offsets, the bounds,
 * and the shape of the result (tagged, deterministic). */
#include <string.h>

#include "grammar/regex.h"
#include "harness.h"
#include "regex_cases.h"

#define BOUND 100000u

/* Patterns whose classes regex.c narrows to ASCII (\D, \W, and \d or \w
 * read wide under a negated class): on non-ASCII content they may refuse
 * what both engines match, never the other way. */
static const char *const narrowed[] = {"^\\D$", "^\\W$", "^[^\\d]$", "^[^\\W]$"};

static bool may_refuse(const struct regex_case *k)
{
    bool ascii = true;
    for (const char *p = k->content; *p; p++)
        ascii &= (unsigned char)*p < 0x80;
    for (size_t i = 0; i < sizeof narrowed / sizeof narrowed[0]; i++)
        if (!strcmp(narrowed[i], k->pattern))
            return !ascii;
    return false;
}

static void test_table(void)
{
    size_t n = sizeof regex_cases / sizeof regex_cases[0], wrong = 0;
    ml_fsm_ctx *c = NULL;
    ml_fsm *a = NULL;
    const char *compiled = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct regex_case *k = &regex_cases[i];
        if (!compiled || strcmp(compiled, k->pattern) != 0) {
            ml_fsm_free(a);
            ml_fsm_ctx_destroy(c);
            c = ml_fsm_ctx_create(BOUND, 0);
            a = ml_regex_compile(c, k->pattern, strlen(k->pattern));
            compiled = k->pattern;
            check(a != NULL, "/%s/: %s", k->pattern, ml_fsm_ctx_error(c));
            for (uint32_t s = 0; a && s < ml_fsm_n_states(a); s++)
                check(ml_fsm_tags(a, s) & ML_FSM_TAG_IN_STRING, "/%s/: state %u untagged",
                      k->pattern, s);
        }
        if (!a)
            continue;
        int got = ml_fsm_matches(a, k->content, strlen(k->content));
        if (got != k->match && !(got == 0 && may_refuse(k)) && wrong++ < 20)
            fprintf(stderr, "  /%s/ on \"%s\": got %d want %d\n", k->pattern, k->content, got,
                    k->match);
    }
    check(wrong == 0, "%zu of %zu table cases wrong", wrong, n);
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

static void check_refused(const char *pattern, ml_status want, const char *what)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_regex_compile(c, pattern, strlen(pattern));
    check(a == NULL && ml_fsm_ctx_status(c) == want && strstr(ml_fsm_ctx_error(c), what),
          "/%s/: status %s, \"%s\", want %s \"%s\"", pattern, ml_status_name(ml_fsm_ctx_status(c)),
          ml_fsm_ctx_error(c), ml_status_name(want), what);
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

static void test_refused(void)
{
    check_refused("(?=a)", ML_ERR_UNSUPPORTED, "lookaround at byte 0");
    check_refused("a(?!b)", ML_ERR_UNSUPPORTED, "lookaround at byte 1");
    check_refused("(?<=a)b", ML_ERR_UNSUPPORTED, "lookaround at byte 0");
    check_refused("x(?<!a)b", ML_ERR_UNSUPPORTED, "lookaround at byte 1");
    check_refused("(a)\\1", ML_ERR_UNSUPPORTED, "backreference at byte 3");
    check_refused("(?<n>a)\\k<n>", ML_ERR_UNSUPPORTED, "backreference at byte 7");
    check_refused("\\bx", ML_ERR_UNSUPPORTED, "boundary \\b at byte 0");
    check_refused("x\\B", ML_ERR_UNSUPPORTED, "boundary \\B at byte 1");
    check_refused("a^b", ML_ERR_UNSUPPORTED, "anchor inside the expression at byte 1");
    check_refused("(^a)", ML_ERR_UNSUPPORTED, "anchor inside the expression at byte 1");
    check_refused("a$b", ML_ERR_UNSUPPORTED, "anchor inside the expression at byte 1");
    check_refused("(a$)", ML_ERR_UNSUPPORTED, "anchor inside the expression at byte 2");
    check_refused("\\p{L}", ML_ERR_UNSUPPORTED, "property escape at byte 0");
    check_refused("a\\P{L}", ML_ERR_UNSUPPORTED, "property escape at byte 1");
    check_refused("(?i)a", ML_ERR_UNSUPPORTED, "flags at byte 0");
    check_refused("\\uD83D\\uDE00", ML_ERR_UNSUPPORTED, "surrogate escape at byte 0");
    check_refused("\\a", ML_ERR_UNSUPPORTED, "unknown escape at byte 0");
    check_refused("\\07", ML_ERR_UNSUPPORTED, "octal escape at byte 0");
    check_refused("a{1001}", ML_ERR_TOO_LARGE, "repeat bound over 1000 at byte 1");
    check_refused("a{0,99999999999}", ML_ERR_TOO_LARGE, "repeat bound over 1000 at byte 1");
    check_refused("a{2,1}", ML_ERR_INVALID_ARG, "out of order at byte 1");
    check_refused("*a", ML_ERR_INVALID_ARG, "nothing to repeat at byte 0");
    check_refused("a**", ML_ERR_INVALID_ARG, "nothing to repeat at byte 2");
    check_refused("{2}", ML_ERR_INVALID_ARG, "nothing to repeat at byte 0");
    check_refused("(ab", ML_ERR_INVALID_ARG, "unterminated group at byte 0");
    check_refused("ab)", ML_ERR_INVALID_ARG, "unmatched ')' at byte 2");
    check_refused("x[ab", ML_ERR_INVALID_ARG, "unterminated class at byte 1");
    check_refused("[z-a]", ML_ERR_INVALID_ARG, "out of order at byte 1");
    check_refused("ab\\", ML_ERR_INVALID_ARG, "trailing backslash at byte 2");
    check_refused("\\x4", ML_ERR_INVALID_ARG, "\\x needs 2 hex digits at byte 0");
    check_refused("\\u12", ML_ERR_INVALID_ARG, "\\u needs 4 hex digits at byte 0");
    check_refused("\\u{110000}", ML_ERR_INVALID_ARG, "past U+10FFFF at byte 0");
    check_refused("ab\xff", ML_ERR_INVALID_ARG, "invalid UTF-8 at byte 2");
    check_refused("\xed\xa0\x80", ML_ERR_INVALID_ARG, "invalid UTF-8 at byte 0");
    char deep[600];
    memset(deep, '(', 300);
    memset(deep + 300, ')', 300);
    deep[600 - 1] = 0;
    check_refused(deep, ML_ERR_TOO_LARGE, "nested too deep");
    /* The search of a{20} after any (a|b) needs 2^21 states. */
    check_refused("[ab]*a[ab]{20}$", ML_ERR_TOO_LARGE, "bound of");
}

static ml_fsm *compile(ml_fsm_ctx *c, const char *pattern)
{
    return ml_regex_compile(c, pattern, strlen(pattern));
}

static bool m(const ml_fsm *a, const char *content)
{
    return ml_fsm_matches(a, content, strlen(content));
}

/* Contents in one form only: escapes where lexemes.h wants them, lower-case
 * hex, raw UTF-8 elsewhere. */
static void test_one_form(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = compile(c, "^.$");
    check(m(a, "\\u0001") && m(a, "\\u001f") && !m(a, "\\u001F") && !m(a, "\x01"), "controls");
    check(m(a, "\\f") && !m(a, "\\u000c") && !m(a, "\f") && m(a, "\\t") && m(a, "\\b"),
          "short escapes only");
    check(!m(a, "\\n") && !m(a, "\\r"), ". refuses line terminators");
    check(m(a, "\\\"") && !m(a, "\"") && m(a, "\\\\") && !m(a, "\\"), "quote and backslash");
    check(m(a, "/") && !m(a, "\\/") && !m(a, "\\u0041") && m(a, "A"), "others raw");
    check(m(a, "\xc3\xa9") && !m(a, "\\u00e9") && !m(a, "\xc3") && !m(a, "\xc0\x80"), "UTF-8");
    check(!m(a, "\\u2028") && !m(a, "\xe2\x80\xa8"), ". refuses U+2028");
    ml_fsm_free(a);
    a = compile(c, "^[\\s\\S]*$");
    check(m(a, "\xef\xbb\xbf") && m(a, "\\u001c") && m(a, "a b"), "[\\s\\S] is any character");
    ml_fsm_free(a);
    a = compile(c, "^\\s$");
    check(m(a, " ") && !m(a, "\xef\xbb\xbf") && !m(a, "\\u001c"),
          "\\s: what both engines call space");
    ml_fsm_free(a);
    a = compile(c, "^[^\\s]$");
    check(!m(a, "\xef\xbb\xbf") && !m(a, "\\u001c") && m(a, "x"), "[^\\s]: neither engine's space");
    ml_fsm_free(a);
    a = compile(c, "^\\w\\d$");
    check(m(a, "a1") && !m(a, "\xc3\xa9"
                              "1"),
          "\\w is ASCII");
    ml_fsm_free(a);
    check(ml_fsm_ctx_status(c) == ML_OK, "no error: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);
}

static void test_bounds(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = compile(c, "^a{1000}$");
    check(a && ml_fsm_n_states(a) == 1001, "a{1000}");
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(500, 0);
    check(compile(c, "^.{1000}$") == NULL && ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE,
          "state bound: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 1);
    check(compile(c, "^(.{1,100}x){10}$") == NULL && ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE &&
              strstr(ml_fsm_ctx_error(c), "deadline"),
          "deadline: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);
}

int main(void)
{
    test_table();
    test_refused();
    test_one_form();
    test_bounds();
    return check_done();
}
