/* engine/grammar/fsm.h: each atom and operation on strings that must and
 * must not match, the shape every result has (deterministic edges, trimmed,
 * minimal on known languages, canonical numbering), tags, call symbols,
 * ownership on errors, the state bound and the deadline; then random
 * expressions over {a, b} against a brute-force evaluation of their
 * languages up to a length. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "grammar/fsm.h"
#include "harness.h"

#define BOUND 10000u

/* Sorted disjoint edges, targets in range, every state reachable and (but
 * in the empty language) able to reach acceptance. */
static void check_shape(const ml_fsm *a, const char *what)
{
    uint32_t n = ml_fsm_n_states(a);
    uint8_t reach[BOUND] = {0}, live[BOUND] = {0};
    check(n > 0 && n <= BOUND, "%s: %u states", what, n);
    if (n == 0 || n > BOUND)
        return;
    reach[0] = 1;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t s = 0; s < n; s++) {
            const ml_fsm_edge *e;
            size_t ne = ml_fsm_edges(a, s, &e);
            for (size_t i = 0; i < ne; i++) {
                check(e[i].lo <= e[i].hi && e[i].to < n, "%s: bad edge", what);
                check(i == 0 || e[i - 1].hi < e[i].lo, "%s: edges of %u not sorted", what, s);
                if (reach[s] && !reach[e[i].to])
                    reach[e[i].to] = changed = 1;
                if (!live[s] && (ml_fsm_accepting(a, s) || live[e[i].to]))
                    live[s] = changed = 1;
            }
            if (!live[s] && ml_fsm_accepting(a, s))
                live[s] = changed = 1;
        }
    }
    if (ml_fsm_is_empty(a)) {
        const ml_fsm_edge *e;
        check(n == 1 && ml_fsm_edges(a, 0, &e) == 0, "%s: empty language not one state", what);
        return;
    }
    for (uint32_t s = 0; s < n; s++)
        check(reach[s] && live[s], "%s: state %u not trimmed", what, s);
}

static bool same_fsm(const ml_fsm *a, const ml_fsm *b)
{
    if (ml_fsm_n_states(a) != ml_fsm_n_states(b))
        return false;
    for (uint32_t s = 0; s < ml_fsm_n_states(a); s++) {
        const ml_fsm_edge *ea, *eb;
        size_t na = ml_fsm_edges(a, s, &ea), nb = ml_fsm_edges(b, s, &eb);
        if (na != nb || ml_fsm_accepting(a, s) != ml_fsm_accepting(b, s) ||
            ml_fsm_tags(a, s) != ml_fsm_tags(b, s) || (na && memcmp(ea, eb, na * sizeof *ea) != 0))
            return false;
    }
    return true;
}

static bool m(const ml_fsm *a, const char *s)
{
    return ml_fsm_matches(a, s, strlen(s));
}

static ml_fsm *lit(ml_fsm_ctx *c, const char *s)
{
    return ml_fsm_literal(c, s, strlen(s));
}

static void test_atoms(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = lit(c, "abc");
    check(m(a, "abc") && !m(a, "ab") && !m(a, "abcd") && !m(a, ""), "literal");
    check(ml_fsm_n_states(a) == 4, "literal states %u", ml_fsm_n_states(a));
    check_shape(a, "literal");
    ml_fsm_free(a);

    a = ml_fsm_epsilon(c);
    check(m(a, "") && !m(a, "a") && !ml_fsm_is_empty(a), "epsilon");
    check_shape(a, "epsilon");
    ml_fsm_free(a);

    a = ml_fsm_nothing(c);
    check(!m(a, "") && ml_fsm_is_empty(a), "nothing");
    check_shape(a, "nothing");
    ml_fsm_free(a);

    a = ml_fsm_byte_range(c, '0', '9');
    check(m(a, "5") && !m(a, "a") && !m(a, "55"), "byte range");
    check_shape(a, "byte range");
    ml_fsm_free(a);

    uint8_t set[32] = {0};
    set['a' >> 3] |= 1u << ('a' & 7);
    set['c' >> 3] |= 1u << ('c' & 7);
    set[0xFF >> 3] |= 1u << (0xFF & 7);
    a = ml_fsm_byte_set(c, set);
    const ml_fsm_edge *e;
    check(m(a, "a") && m(a, "c") && !m(a, "b") && ml_fsm_matches(a, "\xff", 1), "byte set");
    check(ml_fsm_edges(a, 0, &e) == 3, "byte set edges");
    ml_fsm_free(a);

    a = ml_fsm_call(c, 7);
    check(ml_fsm_has_calls(a) && !m(a, "") && ml_fsm_edges(a, 0, &e) == 1 &&
              e[0].lo == ML_FSM_CALL(7),
          "call");
    ml_fsm_free(a);
    check(ml_fsm_ctx_status(c) == ML_OK && !strcmp(ml_fsm_ctx_error(c), ""), "no error");
    check(ml_fsm_call(c, ML_FSM_MAX_CALLS) == NULL && ml_fsm_ctx_status(c) == ML_ERR_INVALID_ARG,
          "call past the limit");
    ml_fsm_ctx_destroy(c);
}

static void test_compose(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_fsm_concat(c, lit(c, "ab"), ml_fsm_union(c, lit(c, "c"), ml_fsm_epsilon(c)));
    check(m(a, "ab") && m(a, "abc") && !m(a, "abcc") && !m(a, "a"), "concat/union");
    check(ml_fsm_n_states(a) == 4, "ab(c)? states %u", ml_fsm_n_states(a));
    check_shape(a, "ab(c)?");
    ml_fsm_free(a);

    /* Union merges common suffixes: ab|cb is 3 states. */
    a = ml_fsm_union(c, lit(c, "ab"), lit(c, "cb"));
    check(ml_fsm_n_states(a) == 3 && m(a, "cb") && !m(a, "ac"), "ab|cb: %u", ml_fsm_n_states(a));
    ml_fsm_free(a);

    /* [0-4]|[5-9] is the same automaton as [0-9]: canonical. */
    a = ml_fsm_union(c, ml_fsm_byte_range(c, '0', '4'), ml_fsm_byte_range(c, '5', '9'));
    ml_fsm *b = ml_fsm_byte_range(c, '0', '9');
    check(same_fsm(a, b), "[0-4]|[5-9] == [0-9]");
    ml_fsm_free(a);
    ml_fsm_free(b);

    a = ml_fsm_repeat(c, ml_fsm_byte_range(c, '0', '9'), 2, 4);
    check(!m(a, "1") && m(a, "12") && m(a, "1234") && !m(a, "12345"), "{2,4}");
    check(ml_fsm_n_states(a) == 5, "{2,4} states %u", ml_fsm_n_states(a));
    check_shape(a, "{2,4}");
    ml_fsm_free(a);

    a = ml_fsm_repeat(c, lit(c, "ab"), 1, ML_FSM_UNBOUNDED);
    check(!m(a, "") && m(a, "ab") && m(a, "ababab") && !m(a, "aba"), "(ab)+");
    check(ml_fsm_n_states(a) == 3, "(ab)+ states %u", ml_fsm_n_states(a));
    ml_fsm_free(a);

    a = ml_fsm_repeat(c, lit(c, "a"), 0, ML_FSM_UNBOUNDED);
    check(m(a, "") && m(a, "aaaa") && ml_fsm_n_states(a) == 1, "a*");
    ml_fsm_free(a);

    a = ml_fsm_repeat(c, lit(c, "a"), 0, 0);
    check(m(a, "") && !m(a, "a"), "a{0}");
    ml_fsm_free(a);

    /* Repeat of something accepting the empty string. */
    a = ml_fsm_repeat(c, ml_fsm_union(c, lit(c, "a"), ml_fsm_epsilon(c)), 3, 3);
    check(m(a, "") && m(a, "aaa") && !m(a, "aaaa"), "(a?){3}");
    ml_fsm_free(a);

    a = ml_fsm_intersect(c, ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'z'), 0, ML_FSM_UNBOUNDED),
                         ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'z'), 2, 3));
    check(m(a, "ab") && m(a, "abc") && !m(a, "a") && !m(a, "A1"), "intersect");
    check_shape(a, "intersect");
    ml_fsm_free(a);

    a = ml_fsm_intersect(c, lit(c, "ab"), lit(c, "ba"));
    check(ml_fsm_is_empty(a), "disjoint intersection is empty");
    check_shape(a, "empty intersection");
    ml_fsm_free(a);

    /* [a-z]+ minus the keywords; the complement must be completed (a sink). */
    a = ml_fsm_minus(c, ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'z'), 1, ML_FSM_UNBOUNDED),
                     ml_fsm_union(c, lit(c, "if"), lit(c, "in")));
    check(!m(a, "if") && !m(a, "in") && m(a, "i") && m(a, "ifs") && m(a, "x") && !m(a, ""),
          "minus");
    check_shape(a, "minus");
    ml_fsm_free(a);

    a = ml_fsm_minus(c, lit(c, "ab"), lit(c, "ab"));
    check(ml_fsm_is_empty(a), "a minus a is empty");
    ml_fsm_free(a);

    a = ml_fsm_copy(c, b = lit(c, "xy"));
    check(same_fsm(a, b), "copy");
    ml_fsm_free(a);
    ml_fsm_free(b);
    check(ml_fsm_ctx_status(c) == ML_OK, "no error: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);
}

static void test_n_ary(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *parts[] = {lit(c, "ab"), lit(c, "cb"), ml_fsm_epsilon(c), lit(c, "abc")};
    ml_fsm *a = ml_fsm_union_n(c, parts, 4);
    ml_fsm *b = ml_fsm_union(c, ml_fsm_union(c, lit(c, "ab"), lit(c, "cb")),
                             ml_fsm_union(c, ml_fsm_epsilon(c), lit(c, "abc")));
    check(a && same_fsm(a, b) && m(a, "") && m(a, "abc") && !m(a, "a"), "union_n");
    ml_fsm_free(a);
    ml_fsm_free(b);

    ml_fsm *seq[] = {lit(c, "a"), ml_fsm_repeat(c, lit(c, "b"), 0, ML_FSM_UNBOUNDED), lit(c, "c")};
    a = ml_fsm_concat_n(c, seq, 3);
    check(a && m(a, "ac") && m(a, "abbc") && !m(a, "ab") && ml_fsm_n_states(a) == 3, "concat_n");
    ml_fsm_free(a);

    a = ml_fsm_union_n(c, NULL, 0);
    b = ml_fsm_concat_n(c, NULL, 0);
    check(a && ml_fsm_is_empty(a) && b && m(b, "") && ml_fsm_n_states(b) == 1, "n = 0");
    ml_fsm_free(a);
    ml_fsm_free(b);

    ml_fsm *with_null[] = {lit(c, "a"), NULL, lit(c, "b")};
    check(ml_fsm_union_n(c, with_null, 3) == NULL && ml_fsm_ctx_status(c) == ML_OK,
          "a NULL member: NULL, the others freed");
    ml_fsm_ctx_destroy(c);

    /* An enum of 2000 strings in one construction, well within a second
     * (a chain of 2000 ml_fsm_union takes seconds). */
    c = ml_fsm_ctx_create(100000, ml_clock_ms() + 1000);
    static ml_fsm *values[2000];
    for (int i = 0; i < 2000; i++) {
        char text[32];
        int n = snprintf(text, sizeof text, "\"value_%d\"", i * 7919);
        values[i] = ml_fsm_literal(c, text, (size_t)n);
    }
    a = ml_fsm_union_n(c, values, 2000);
    check(a && m(a, "\"value_7919\"") && !m(a, "\"value_7918\""), "enum of 2000: %s",
          ml_fsm_ctx_error(c));
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

static void test_tags(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    /* "x" then a tagged "x": the middle state is not merged away. */
    ml_fsm *a = ml_fsm_concat(c, lit(c, "\""), ml_fsm_tag(c, lit(c, "x"), ML_FSM_TAG_IN_STRING));
    check(ml_fsm_n_states(a) == 3 && ml_fsm_tags(a, 0) == 0 &&
              ml_fsm_tags(a, 1) == ML_FSM_TAG_IN_STRING &&
              ml_fsm_tags(a, 2) == ML_FSM_TAG_IN_STRING,
          "tagged concat");
    ml_fsm_free(a);

    /* Same futures, different tags: kept apart (ab|cb with the first b
     * tagged is 5 states, not 3). */
    a = ml_fsm_union(c, ml_fsm_concat(c, lit(c, "a"), ml_fsm_tag(c, lit(c, "b"), 1)),
                     ml_fsm_concat(c, lit(c, "c"), lit(c, "b")));
    check(ml_fsm_n_states(a) == 5, "tags keep states apart: %u", ml_fsm_n_states(a));
    ml_fsm_free(a);

    /* A product ORs tags. */
    a = ml_fsm_intersect(c, ml_fsm_tag(c, lit(c, "ab"), 1), lit(c, "ab"));
    check(ml_fsm_tags(a, 1) == 1, "product ORs tags");
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

static void test_calls(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_fsm_concat(
        c, lit(c, "["), ml_fsm_concat(c, ml_fsm_repeat(c, ml_fsm_call(c, 3), 0, 2), lit(c, "]")));
    check(a && ml_fsm_has_calls(a) && m(a, "[]") && ml_fsm_n_states(a) == 5, "calls compose");
    check(ml_fsm_intersect(c, a, lit(c, "[]")) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED,
          "intersect refuses calls");
    /* Latched: later operations return NULL and the first error stays. */
    check(lit(c, "x") == NULL && ml_fsm_union(c, lit(c, "x"), lit(c, "y")) == NULL, "latched");
    ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "second");
    check(ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED && strstr(ml_fsm_ctx_error(c), "intersection"),
          "first error stays: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    check(ml_fsm_minus(c, lit(c, "x"), ml_fsm_call(c, 0)) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_UNSUPPORTED,
          "minus refuses calls");
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    check(ml_fsm_concat(c, NULL, lit(c, "x")) == NULL && ml_fsm_ctx_status(c) == ML_OK,
          "NULL argument: NULL, nothing latched, the other freed");
    ml_fsm_ctx_destroy(c);
}

static void test_bounds(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(100, 0);
    check(ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'a'), 0, 1000) == NULL &&
              ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE,
          "repeat past the state bound");
    ml_fsm_ctx_destroy(c);

    /* Subset blow-up: (a|b)*a(a|b){n} needs 2^n states. */
    c = ml_fsm_ctx_create(BOUND, 0);
    ml_fsm *a = ml_fsm_concat(
        c, ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'b'), 0, ML_FSM_UNBOUNDED),
        ml_fsm_concat(c, lit(c, "a"), ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'b'), 16, 16)));
    check(a == NULL && ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE, "subset blow-up refused: %s",
          ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    a = ml_fsm_concat(
        c, ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'b'), 0, ML_FSM_UNBOUNDED),
        ml_fsm_concat(c, lit(c, "a"), ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'b'), 8, 8)));
    check(a && ml_fsm_n_states(a) == 512, "(a|b)*a(a|b){8}: %u", a ? ml_fsm_n_states(a) : 0);
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(1000000, ml_clock_ms() - 1);
    a = ml_fsm_repeat(c, ml_fsm_byte_range(c, 'a', 'z'), 0, 900);
    check(a == NULL && ml_fsm_ctx_status(c) == ML_ERR_TOO_LARGE &&
              strstr(ml_fsm_ctx_error(c), "deadline"),
          "deadline: %s", ml_fsm_ctx_error(c));
    ml_fsm_ctx_destroy(c);

    /* Minimisation is not quadratic: a chain of 50000 states (Moore's
     * refinement would take 50000 rounds) well within a second. */
    c = ml_fsm_ctx_create(100000, ml_clock_ms() + 1000);
    static char chain[50000];
    memset(chain, 'a', sizeof chain);
    a = ml_fsm_concat(c, ml_fsm_literal(c, chain, sizeof chain), ml_fsm_byte_range(c, 'a', 'b'));
    check(a && ml_fsm_n_states(a) == sizeof chain + 2, "long chain: %s", ml_fsm_ctx_error(c));
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);

    c = ml_fsm_ctx_create(BOUND, 0);
    check(ml_fsm_repeat(c, lit(c, "a"), 3, 2) == NULL && ml_fsm_ctx_status(c) == ML_ERR_INVALID_ARG,
          "min over max");
    ml_fsm_ctx_destroy(c);
}

static int utf8_encode(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80)
        return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800)
        return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (cp & 63)), 3;
    return o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 63)),
           o[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), o[3] = (uint8_t)(0x80 | (cp & 63)), 4;
}

static void test_utf8(void)
{
    ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
    static const uint32_t ranges[][2] = {
        {0x41, 0x5A},      {0x7F, 0x800},          {0xD000, 0xE0FF},
        {0xFFF0, 0x10010}, {0x10FF00, 0x7FFFFFFF}, {0x50, 0x60}, /* overlaps the first */
    };
    size_t n = sizeof ranges / sizeof ranges[0];
    ml_fsm *a = ml_fsm_utf8(c, ranges, n);
    check_shape(a, "utf8");
    size_t wrong = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        bool in = false;
        for (size_t i = 0; i < n; i++)
            in |= cp >= ranges[i][0] && cp <= ranges[i][1];
        in &= cp < 0xD800 || cp > 0xDFFF;
        uint8_t buf[4];
        int len = utf8_encode(cp, buf);
        wrong += ml_fsm_matches(a, buf, (size_t)len) != in;
    }
    check(wrong == 0, "utf8: %zu code points wrong", wrong);
    ml_fsm_free(a);

    static const uint32_t all[][2] = {{0, 0x10FFFF}};
    a = ml_fsm_utf8(c, all, 1);
    check(!ml_fsm_matches(a, "\xc0\x80", 2) && !ml_fsm_matches(a, "\xed\xa0\x80", 3) &&
              !ml_fsm_matches(a, "\xf4\x90\x80\x80", 4) && !ml_fsm_matches(a, "\xe0\x80\x80", 3) &&
              ml_fsm_matches(a, "\xf0\x9f\x98\x80", 4),
          "utf8 refuses overlong, surrogate and past-the-end forms");
    /* Every valid code point: the minimal automaton has 9 states. */
    check(ml_fsm_n_states(a) == 9, "any code point: %u states", ml_fsm_n_states(a));
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(c);
}

/* ---- random expressions against brute force ---------------------------------------- */

/* Strings over {a, b} of length <= MAXLEN, indexed (1 << len) - 1 + bits. */
#define MAXLEN 7
#define N_STR ((1u << (MAXLEN + 1)) - 1)

typedef struct lang {
    uint8_t in[N_STR];
} lang;

static uint32_t str_index(uint32_t len, uint32_t bits)
{
    return (1u << len) - 1 + bits;
}

static void lang_concat(const lang *x, const lang *y, lang *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t lx = 0; lx <= MAXLEN; lx++)
        for (uint32_t bx = 0; bx < 1u << lx; bx++) {
            if (!x->in[str_index(lx, bx)])
                continue;
            for (uint32_t ly = 0; lx + ly <= MAXLEN; ly++)
                for (uint32_t by = 0; by < 1u << ly; by++)
                    if (y->in[str_index(ly, by)])
                        out->in[str_index(lx + ly, bx << ly | by)] = 1;
        }
}

static uint32_t rng_state = 12345;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) % n;
}

/* A random expression of the given depth: its automaton and language. */
static ml_fsm *random_expr(ml_fsm_ctx *c, int depth, lang *l)
{
    uint32_t op = depth == 0 ? 0 : rnd(6);
    memset(l, 0, sizeof *l);
    if (op == 0) {
        uint32_t len = rnd(3), bits = rnd(1u << len);
        char s[3];
        for (uint32_t i = 0; i < len; i++)
            s[i] = (bits >> (len - 1 - i) & 1) ? 'b' : 'a';
        l->in[str_index(len, bits)] = 1;
        return ml_fsm_literal(c, s, len);
    }
    lang x, y;
    ml_fsm *a = random_expr(c, depth - 1, &x);
    if (op == 5) { /* repeat {lo, hi} */
        uint32_t lo = rnd(3), hi = rnd(4) == 0 ? ML_FSM_UNBOUNDED : lo + rnd(3);
        lang acc = {0}, cur = {0}, tmp;
        cur.in[0] = 1;
        for (uint32_t k = 0; k <= MAXLEN + 2; k++) {
            if (k >= lo && (hi == ML_FSM_UNBOUNDED || k <= hi))
                for (uint32_t i = 0; i < N_STR; i++)
                    acc.in[i] |= cur.in[i];
            lang_concat(&cur, &x, &tmp);
            cur = tmp;
        }
        *l = acc;
        return ml_fsm_repeat(c, a, lo, hi);
    }
    ml_fsm *b = random_expr(c, depth - 1, &y);
    switch (op) {
    case 1:
        lang_concat(&x, &y, l);
        return ml_fsm_concat(c, a, b);
    case 2:
        for (uint32_t i = 0; i < N_STR; i++)
            l->in[i] = x.in[i] | y.in[i];
        return ml_fsm_union(c, a, b);
    case 3:
        for (uint32_t i = 0; i < N_STR; i++)
            l->in[i] = x.in[i] & y.in[i];
        return ml_fsm_intersect(c, a, b);
    default:
        for (uint32_t i = 0; i < N_STR; i++)
            l->in[i] = x.in[i] & !y.in[i];
        return ml_fsm_minus(c, a, b);
    }
}

static void test_random(void)
{
    for (int iter = 0; iter < 400; iter++) {
        ml_fsm_ctx *c = ml_fsm_ctx_create(BOUND, 0);
        lang l;
        ml_fsm *a = random_expr(c, 1 + iter % 4, &l);
        check(a != NULL, "random %d: %s", iter, ml_fsm_ctx_error(c));
        if (!a) {
            ml_fsm_ctx_destroy(c);
            continue;
        }
        check_shape(a, "random");
        size_t wrong = 0;
        for (uint32_t len = 0; len <= MAXLEN; len++)
            for (uint32_t bits = 0; bits < 1u << len; bits++) {
                char s[MAXLEN];
                for (uint32_t i = 0; i < len; i++)
                    s[i] = (bits >> (len - 1 - i) & 1) ? 'b' : 'a';
                wrong += ml_fsm_matches(a, s, len) != l.in[str_index(len, bits)];
            }
        check(wrong == 0, "random %d: %zu strings wrong", iter, wrong);
        /* Canonical: the language rebuilt by union with itself is the same automaton. */
        ml_fsm *b = ml_fsm_union(c, ml_fsm_copy(c, a), ml_fsm_copy(c, a));
        check(b && same_fsm(a, b), "random %d: not canonical", iter);
        ml_fsm_free(a);
        ml_fsm_free(b);
        ml_fsm_ctx_destroy(c);
    }
}

int main(void)
{
    test_atoms();
    test_compose();
    test_n_ary();
    test_tags();
    test_calls();
    test_bounds();
    test_utf8();
    test_random();
    return check_done();
}
