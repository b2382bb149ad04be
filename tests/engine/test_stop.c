/* Stop strings: matches across piece boundaries, hold-back and release,
 * earliest-end semantics with several strings, overlapping prefixes, UTF-8
 * pieces, validation, and that the result never depends on how the text is
 * cut into pieces. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/stop.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* What a whole run released: the concatenated text and how it ended. */
typedef struct run_result {
    char text[16384];
    size_t len;
    size_t n_chunks;
    bool stopped;
    int which;
    bool utf8_ok; /* every released chunk is whole UTF-8 characters */
} run_result;

static ml_stop *make(const char *const *strs, size_t n)
{
    size_t lens[ML_STOP_MAX_STRINGS];
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(strs[i]);
    ml_stop *s = NULL;
    char err[256] = "";
    check(ml_stop_create(strs, lens, n, &s, err, sizeof err) == ML_OK, "create: %s", err);
    return s;
}

/* Whether b[0, n) is a sequence of complete, well-formed UTF-8 characters
 * (structure only: lead byte, then its count of continuation bytes). */
static bool whole_utf8(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)b[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || i + len > n)
            return false;
        for (size_t k = 1; k < len; k++)
            if (((unsigned char)b[i + k] & 0xC0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

static void collect(run_result *r, const ml_stop_out *o)
{
    check(o->text != NULL, "NULL text");
    check(r->len + o->len <= sizeof r->text, "test buffer");
    if (o->len) {
        memcpy(r->text + r->len, o->text, o->len);
        r->len += o->len;
        r->n_chunks++;
        r->utf8_ok &= whole_utf8(o->text, o->len);
    }
    r->stopped = o->stopped;
    r->which = o->which;
}

/* Feed text[0, len) cut at the given piece lengths (the rest as one last
 * piece), then flush. */
static void run_cuts(ml_stop *s, const char *text, size_t len, const size_t *cuts, size_t n_cuts,
                     run_result *r)
{
    memset(r, 0, sizeof *r);
    r->utf8_ok = true;
    r->which = -1;
    ml_stop_reset(s);
    size_t at = 0;
    char err[256];
    ml_stop_out o;
    for (size_t i = 0; i <= n_cuts && at <= len; i++) {
        size_t n = i < n_cuts ? cuts[i] : len - at;
        if (n > len - at)
            n = len - at;
        check(ml_stop_feed(s, text + at, n, &o, err, sizeof err) == ML_OK, "feed: %s", err);
        collect(r, &o);
        at += n;
        if (i == n_cuts)
            break;
    }
    ml_stop_flush(s, &o);
    collect(r, &o);
}

static void run_pieces(ml_stop *s, const char *const *pieces, size_t n, run_result *r)
{
    char text[4096];
    size_t cuts[64], len = 0;
    for (size_t i = 0; i < n; i++) {
        cuts[i] = strlen(pieces[i]);
        memcpy(text + len, pieces[i], cuts[i]);
        len += cuts[i];
    }
    run_cuts(s, text, len, cuts, n, r);
}

static void expect_run(const char *name, const char *const *stops, size_t n_stops,
                       const char *const *pieces, size_t n_pieces, const char *want,
                       int want_which)
{
    ml_stop *s = make(stops, n_stops);
    run_result r;
    run_pieces(s, pieces, n_pieces, &r);
    check(r.len == strlen(want) && !memcmp(r.text, want, r.len), "%s: released '%.*s', want '%s'",
          name, (int)r.len, r.text, want);
    check(r.stopped == (want_which >= 0) && r.which == want_which, "%s: stopped %d which %d",
          name, r.stopped, r.which);
    check(r.utf8_ok, "%s: a chunk split a UTF-8 character", name);
    ml_stop_destroy(s);
}

static void test_semantics(void)
{
    const char *world[] = {"world"};
    const char *p1[] = {"Hello wor", "ld", "!"};
    expect_run("across a boundary", world, 1, p1, N_OF(p1), "Hello ", 0);
    const char *p2[] = {"Hello wor", "m"};
    expect_run("held text released", world, 1, p2, N_OF(p2), "Hello worm", -1);
    const char *p3[] = {"Hello wor"};
    expect_run("released at flush", world, 1, p3, N_OF(p3), "Hello wor", -1);
    const char *p4[] = {"w", "o", "r", "l", "d"};
    expect_run("byte by byte", world, 1, p4, N_OF(p4), "", 0);
    const char *p5[] = {"say hello world and more"};
    expect_run("inside one piece", world, 1, p5, N_OF(p5), "say hello ", 0);

    const char *aab[] = {"aab"};
    const char *q1[] = {"aaab"};
    expect_run("overlap in one piece", aab, 1, q1, N_OF(q1), "a", 0);
    const char *q2[] = {"a", "a", "a", "b"};
    expect_run("overlap byte by byte", aab, 1, q2, N_OF(q2), "a", 0);
    const char *q3[] = {"aa", "aa", "c"};
    expect_run("overlap never completing", aab, 1, q3, N_OF(q3), "aaaac", -1);

    /* Earliest end wins: "ser" completes before "User:". */
    const char *multi[] = {"\n\n", "User:", "ser"};
    const char *m1[] = {"Hi\nU", "ser: x"};
    expect_run("earliest end", multi, N_OF(multi), m1, N_OF(m1), "Hi\nU", 2);
    const char *m2[] = {"Hi\n", "\nUser:"};
    expect_run("first of several", multi, N_OF(multi), m2, N_OF(m2), "Hi", 0);
    /* Same end: the longest (earliest start) wins. */
    const char *nested[] = {"bc", "abc"};
    const char *n1[] = {"xa", "bcd"};
    expect_run("longest at the same end", nested, N_OF(nested), n1, N_OF(n1), "x", 1);

    /* Held text is at most the longest stop string minus one byte. */
    const char *six[] = {"abcdef", "zz"};
    ml_stop *s = make(six, N_OF(six));
    ml_stop_out o;
    char err[256];
    check(ml_stop_feed(s, "abcde", 5, &o, err, sizeof err) == ML_OK && o.len == 0 && !o.stopped,
          "5 bytes of a 6-byte stop held");
    check(ml_stop_feed(s, "X", 1, &o, err, sizeof err) == ML_OK && o.len == 6 &&
              !memcmp(o.text, "abcdeX", 6),
          "released when it cannot match");
    check(ml_stop_feed(s, "zabcdez", 7, &o, err, sizeof err) == ML_OK && o.len == 6 &&
              !memcmp(o.text, "zabcde", 6),
          "only the matching suffix held");
    ml_stop_flush(s, &o);
    check(o.len == 1 && o.text[0] == 'z' && !o.stopped, "flush releases the held byte");
    ml_stop_flush(s, &o);
    check(o.len == 0, "second flush is empty");

    /* After a stop: nothing more, stopped again; reset reuses the strings. */
    check(ml_stop_feed(s, "zz tail", 7, &o, err, sizeof err) == ML_OK && o.stopped &&
              o.which == 1 && o.len == 0,
          "stop at the start");
    check(ml_stop_feed(s, "more", 4, &o, err, sizeof err) == ML_OK && o.stopped && o.len == 0,
          "feed after stop");
    ml_stop_flush(s, &o);
    check(o.stopped && o.len == 0, "flush after stop");
    ml_stop_reset(s);
    check(ml_stop_feed(s, "fine", 4, &o, err, sizeof err) == ML_OK && !o.stopped && o.len == 4,
          "reset");
    check(ml_stop_feed(s, NULL, 0, &o, err, sizeof err) == ML_OK && o.len == 0 && o.text != NULL,
          "empty piece: empty text, never a NULL pointer");
    check(ml_stop_feed(s, NULL, 3, &o, err, sizeof err) == ML_ERR_INVALID_ARG, "NULL piece");
    ml_stop_destroy(s);

    /* No stop strings: everything passes, nothing is held. */
    s = make(NULL, 0);
    check(ml_stop_feed(s, "abc", 3, &o, err, sizeof err) == ML_OK && o.len == 3, "passthrough");
    ml_stop_flush(s, &o);
    check(o.len == 0 && !o.stopped, "passthrough flush");
    ml_stop_destroy(s);
}

static void test_utf8(void)
{
    /* "é!" = C3 A9 21; pieces are whole characters. */
    const char *e_bang[] = {"\xC3\xA9!"};
    const char *p1[] = {"caf", "\xC3\xA9", "?", "\xC3\xA9", "!", "after"};
    expect_run("two-byte stop", e_bang, 1, p1, N_OF(p1), "caf\xC3\xA9?", 0);
    const char *euro[] = {"\xE2\x82\xAC\xE2\x82\xAC"}; /* "€€" */
    const char *p2[] = {"1", "\xE2\x82\xAC", "2", "\xE2\x82\xAC", "\xE2\x82\xAC", "3"};
    expect_run("three-byte stop", euro, 1, p2, N_OF(p2), "1\xE2\x82\xAC" "2", 0);
    const char *p3[] = {"\xF0\x9F\x98\x80\xE2\x82\xAC", "x\xE2\x82\xAC"};
    expect_run("held character released whole", euro, 1, p3, N_OF(p3),
               "\xF0\x9F\x98\x80\xE2\x82\xAC" "x\xE2\x82\xAC", -1);

    /* A stop beginning with a continuation byte could cut a character. */
    const char *bad[] = {"\xA9!"};
    size_t len = 2;
    ml_stop *s = NULL;
    char err[256] = "";
    check(ml_stop_create(bad, &len, 1, &s, err, sizeof err) == ML_ERR_INVALID_ARG && !s &&
              strstr(err, "stop[0]") && strstr(err, "UTF-8"),
          "continuation byte first: %s", err);

    /* NUL bytes inside a stop string are ordinary bytes. */
    const char *nul[] = {"a\0b"};
    size_t nul_len = 3;
    check(ml_stop_create(nul, &nul_len, 1, &s, err, sizeof err) == ML_OK, "NUL stop: %s", err);
    ml_stop_out o;
    check(ml_stop_feed(s, "xa\0", 3, &o, err, sizeof err) == ML_OK && o.len == 1 && !o.stopped,
          "NUL prefix held");
    check(ml_stop_feed(s, "b", 1, &o, err, sizeof err) == ML_OK && o.stopped && o.len == 0,
          "NUL stop matched");
    ml_stop_destroy(s);
}

static void test_validation(void)
{
    char err[256];
    ml_stop *s = NULL;
    const char *many[ML_STOP_MAX_STRINGS + 1];
    size_t lens[ML_STOP_MAX_STRINGS + 1];
    for (size_t i = 0; i < N_OF(many); i++) {
        many[i] = "x";
        lens[i] = 1;
    }
    check(ml_stop_create(many, lens, N_OF(many), &s, err, sizeof err) == ML_ERR_INVALID_ARG,
          "too many strings");
    check(ml_stop_create(many, lens, ML_STOP_MAX_STRINGS, &s, err, sizeof err) == ML_OK,
          "the maximum count: %s", err);
    ml_stop_destroy(s);
    s = NULL;

    const char *two[] = {"ok", ""};
    size_t two_len[] = {2, 0};
    check(ml_stop_create(two, two_len, 2, &s, err, sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "stop[1]") && strstr(err, "empty"),
          "empty string: %s", err);
    static char longest[ML_STOP_MAX_LEN + 1];
    memset(longest, 'q', sizeof longest);
    const char *lp[] = {longest};
    size_t ll = ML_STOP_MAX_LEN + 1;
    check(ml_stop_create(lp, &ll, 1, &s, err, sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "stop[0]"),
          "too long: %s", err);
    ll = ML_STOP_MAX_LEN;
    check(ml_stop_create(lp, &ll, 1, &s, err, sizeof err) == ML_OK, "the maximum length");
    ml_stop_out o;
    check(ml_stop_feed(s, longest, ML_STOP_MAX_LEN - 1, &o, err, sizeof err) == ML_OK &&
              o.len == 0,
          "255 bytes held");
    check(ml_stop_feed(s, "q", 1, &o, err, sizeof err) == ML_OK && o.stopped, "256-byte match");
    ml_stop_destroy(s);
    s = NULL;
    const char *null_entry[] = {NULL};
    size_t one = 1;
    check(ml_stop_create(null_entry, &one, 1, &s, err, sizeof err) == ML_ERR_INVALID_ARG,
          "NULL entry");
    check(ml_stop_create(NULL, NULL, 1, &s, err, sizeof err) == ML_ERR_INVALID_ARG, "NULL list");
    check(s == NULL, "out untouched on error");
    ml_stop_destroy(NULL);
}

/* A piece far larger than the initial buffer. */
static void test_large_piece(void)
{
    const char *stops[] = {"<END>"};
    ml_stop *s = make(stops, 1);
    size_t n = 20000;
    char *big = malloc(n);
    memset(big, 'x', n);
    memcpy(big + n - 7, "<END>yy", 7);
    ml_stop_out o;
    char err[256];
    check(ml_stop_feed(s, "<EN", 3, &o, err, sizeof err) == ML_OK && o.len == 0, "held prefix");
    check(ml_stop_feed(s, big, n, &o, err, sizeof err) == ML_OK && o.stopped &&
              o.len == 3 + n - 7 && !memcmp(o.text, "<ENxxx", 6),
          "stop at the end of a 20 kB piece (len %zu)", o.len);
    ml_stop_destroy(s);
    free(big);
}

/* The same text cut three ways releases the same text and the same stop. */
static void test_cut_invariance(void)
{
    uint64_t rng = 99;
    int runs = 0;
    for (int trial = 0; trial < 400; trial++) {
        char text[300];
        size_t len = 0;
        for (; len < sizeof text; len++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            text[len] = (char)('a' + (rng >> 33) % 3);
        }
        char pool[4][8];
        const char *stops[4];
        size_t n_stops = 1 + (size_t)(rng >> 40) % 4;
        for (size_t i = 0; i < n_stops; i++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            size_t l = 1 + (rng >> 35) % 7;
            for (size_t k = 0; k < l; k++)
                pool[i][k] = (char)('a' + (rng >> (3 + 2 * k)) % 3);
            pool[i][l] = 0;
            stops[i] = pool[i];
        }
        ml_stop *s = make(stops, n_stops);
        run_result whole, bytes, random_cuts;
        run_cuts(s, text, len, NULL, 0, &whole);
        size_t ones[sizeof text];
        for (size_t i = 0; i < len; i++)
            ones[i] = 1;
        run_cuts(s, text, len, ones, len, &bytes);
        size_t cuts[sizeof text], n_cuts = 0;
        for (size_t at = 0; at < len; n_cuts++) {
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            cuts[n_cuts] = (rng >> 40) % 9;
            at += cuts[n_cuts];
        }
        run_cuts(s, text, len, cuts, n_cuts, &random_cuts);
        bool same = whole.len == bytes.len && whole.len == random_cuts.len &&
                    !memcmp(whole.text, bytes.text, whole.len) &&
                    !memcmp(whole.text, random_cuts.text, whole.len) &&
                    whole.which == bytes.which && whole.which == random_cuts.which;
        check(same, "trial %d: cuts change the result (%zu/%zu/%zu bytes, which %d/%d/%d)", trial,
              whole.len, bytes.len, random_cuts.len, whole.which, bytes.which,
              random_cuts.which);
        check(whole.len <= len && !memcmp(whole.text, text, whole.len), "trial %d: not a prefix",
              trial);
        ml_stop_destroy(s);
        runs++;
    }
    fprintf(stderr, "  cut invariance: %d texts\n", runs);
}

int main(void)
{
    test_semantics();
    test_utf8();
    test_validation();
    test_large_piece();
    test_cut_invariance();
    return check_done();
}
