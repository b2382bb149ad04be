/* Stop strings: one Knuth-Morris-Pratt automaton per stop string, advanced
 * byte by byte over the generated text.
 *
 * The state of stop string i is the length of the longest prefix of it that
 * is a suffix of the text so far. A state equal to the string's length is a
 * match; the largest state over all strings is the length of the longest
 * suffix that could still become a stop string, which is exactly what must be
 * held back. Each byte costs amortised O(1) per stop string, whatever the
 * strings and the text (a hostile request cannot make the step loop scan
 * quadratically), and no text beyond the held-back suffix is kept. */
#include "runtime/stop.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Room for pieces before the first grow: a Llama 3 token is at most a few
 * dozen bytes, plus up to 3 bytes of a character the detokenizer held. */
#define STOP_INITIAL_PIECE_CAP 256

struct ml_stop {
    size_t n;
    const char *str[ML_STOP_MAX_STRINGS]; /* borrowed from pool */
    size_t len[ML_STOP_MAX_STRINGS];
    /* pi[i][j]: length of the longest proper prefix of str[i][0..j] that is
     * also its suffix (the KMP failure function); borrowed from pi_pool. */
    const uint16_t *pi[ML_STOP_MAX_STRINGS];
    uint16_t state[ML_STOP_MAX_STRINGS];
    char *pool;        /* owned: the stop strings, back to back */
    uint16_t *pi_pool; /* owned */

    /* Text not yet released sits at buf[held_off, held_off + held); a feed
     * moves it to the front and appends the piece behind it. */
    char *buf; /* owned */
    size_t cap;
    size_t held_off;
    size_t held;
    bool stopped;
    int which;
};

ml_status ml_stop_validate(const char *const *strings, const size_t *lens, size_t n, char *err,
                           size_t errlen)
{
    if (n > ML_STOP_MAX_STRINGS)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop: %zu strings, at most %d", n,
                       ML_STOP_MAX_STRINGS);
    if (n > 0 && (!strings || !lens))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop: NULL string list");
    for (size_t i = 0; i < n; i++) {
        if (lens[i] == 0)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop[%zu]: empty", i);
        if (!strings[i])
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop[%zu]: NULL", i);
        if (lens[i] > ML_STOP_MAX_LEN)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop[%zu]: %zu bytes, at most %d", i,
                           lens[i], ML_STOP_MAX_LEN);
        if (((unsigned char)strings[i][0] & 0xC0) == 0x80)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "stop[%zu]: begins inside a UTF-8 character (byte 0x%02x)", i,
                           (unsigned char)strings[i][0]);
    }
    return ML_OK;
}

/* The KMP failure function of s[0..len) into pi[0..len). */
static void stop_build_pi(const char *s, size_t len, uint16_t *pi)
{
    pi[0] = 0;
    size_t k = 0;
    for (size_t j = 1; j < len; j++) {
        while (k > 0 && s[j] != s[k])
            k = pi[k - 1];
        if (s[j] == s[k])
            k++;
        pi[j] = (uint16_t)k;
    }
}

ml_status ml_stop_create(const char *const *strings, const size_t *lens, size_t n, ml_stop **out,
                         char *err, size_t errlen)
{
    if (!out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop: NULL out");
    ml_status st = ml_stop_validate(strings, lens, n, err, errlen);
    if (st != ML_OK)
        return st;

    size_t total = 0, max_len = 0;
    for (size_t i = 0; i < n; i++) {
        total += lens[i];
        if (lens[i] > max_len)
            max_len = lens[i];
    }
    ml_stop *s = calloc(1, sizeof *s);
    if (!s)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "stop: out of memory");
    s->n = n;
    s->cap = max_len + STOP_INITIAL_PIECE_CAP;
    s->pool = malloc(total ? total : 1);
    s->pi_pool = malloc((total ? total : 1) * sizeof *s->pi_pool);
    s->buf = malloc(s->cap);
    if (!s->pool || !s->pi_pool || !s->buf) {
        ml_stop_destroy(s);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "stop: out of memory");
    }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s->pool + at, strings[i], lens[i]);
        stop_build_pi(s->pool + at, lens[i], s->pi_pool + at);
        s->str[i] = s->pool + at;
        s->pi[i] = s->pi_pool + at;
        s->len[i] = lens[i];
        at += lens[i];
    }
    ml_stop_reset(s);
    *out = s;
    return ML_OK;
}

void ml_stop_destroy(ml_stop *s)
{
    if (!s)
        return;
    free(s->pool);
    free(s->pi_pool);
    free(s->buf);
    free(s);
}

void ml_stop_reset(ml_stop *s)
{
    memset(s->state, 0, sizeof s->state);
    s->held_off = 0;
    s->held = 0;
    s->stopped = false;
    s->which = -1;
}

static void stop_out_set(ml_stop_out *out, const char *text, size_t len, bool stopped, int which)
{
    out->text = text;
    out->len = len;
    out->stopped = stopped;
    out->which = which;
}

/* Advance every automaton by byte c. Returns the index of the longest stop
 * string that completes at this byte, or -1. */
static int stop_step(ml_stop *s, char c)
{
    int hit = -1;
    for (size_t i = 0; i < s->n; i++) {
        size_t q = s->state[i];
        const char *str = s->str[i];
        while (q > 0 && str[q] != c)
            q = s->pi[i][q - 1];
        if (str[q] == c)
            q++;
        s->state[i] = (uint16_t)q;
        if (q == s->len[i] && (hit < 0 || s->len[i] > s->len[hit]))
            hit = (int)i;
    }
    return hit;
}

ml_status ml_stop_feed(ml_stop *s, const char *piece, size_t len, ml_stop_out *out, char *err,
                       size_t errlen)
{
    stop_out_set(out, s->buf, 0, s->stopped, s->which);
    if (!piece && len > 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "stop: NULL piece of %zu bytes", len);
    if (s->stopped)
        return ML_OK;

    memmove(s->buf, s->buf + s->held_off, s->held);
    s->held_off = 0;
    if (len > s->cap - s->held) {
        size_t cap = s->cap * 2 > s->held + len ? s->cap * 2 : s->held + len;
        char *buf = realloc(s->buf, cap);
        if (!buf)
            return ml_fail(err, errlen, ML_ERR_NOMEM, "stop: out of memory for a %zu-byte piece",
                           len);
        s->buf = buf;
        s->cap = cap;
    }
    if (len > 0)
        memcpy(s->buf + s->held, piece, len);
    size_t text_len = s->held + len;

    for (size_t end = s->held; end < text_len;) {
        int hit = stop_step(s, s->buf[end]);
        end++;
        if (hit >= 0) {
            /* An occurrence cannot start before the held text: its prefix
             * in earlier text was a suffix no longer than the held one. */
            assert(end >= s->len[hit]);
            s->stopped = true;
            s->which = hit;
            s->held = 0;
            stop_out_set(out, s->buf, end - s->len[hit], true, hit);
            return ML_OK;
        }
    }

    size_t keep = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->state[i] > keep)
            keep = s->state[i];
    assert(keep <= text_len);
    s->held_off = text_len - keep;
    s->held = keep;
    stop_out_set(out, s->buf, text_len - keep, false, -1);
    return ML_OK;
}

void ml_stop_flush(ml_stop *s, ml_stop_out *out)
{
    if (s->stopped) {
        stop_out_set(out, s->buf, 0, true, s->which);
        return;
    }
    stop_out_set(out, s->buf + s->held_off, s->held, false, -1);
    memset(s->state, 0, sizeof s->state);
    s->held_off += s->held;
    s->held = 0;
}
