/* Decoding: ids -> bytes, whole or streaming, with HF's lossy UTF-8 rule.
 *
 * HF's ByteLevel decoder maps each token back to its bytes, joins them and
 * converts with String::from_utf8_lossy: every maximal ill-formed subpart
 * becomes U+FFFD. utf8_repair implements that rule; the stream applies it
 * incrementally, holding back only a well-formed but unfinished tail. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

static const uint8_t REPLACEMENT_CHAR[] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */
#define REPAIR_GROWTH 3 /* a lone bad byte becomes three bytes */
#define UTF8_MAX_PENDING 3 /* longest unfinished well-formed prefix */

/* Copy in[0..n) to out (room for REPAIR_GROWTH * n bytes), replacing each
 * maximal ill-formed subpart with U+FFFD. If !final, a well-formed but
 * unfinished sequence at the end is not consumed. Returns the bytes of `in`
 * consumed; *out_len receives the bytes written. */
static size_t utf8_repair(const uint8_t *in, size_t n, bool final, uint8_t *out, size_t *out_len)
{
    size_t i = 0, o = 0;
    while (i < n) {
        if (in[i] < 0x80) {
            out[o++] = in[i++];
            continue;
        }
        uint32_t cp;
        size_t len;
        ml_utf8_result r = ml_utf8_scan(in + i, n - i, &cp, &len);
        if (r == ML_UTF8_OK) {
            memcpy(out + o, in + i, len);
            o += len;
        } else if (r == ML_UTF8_TRUNCATED && !final) {
            break;
        } else {
            memcpy(out + o, REPLACEMENT_CHAR, sizeof REPLACEMENT_CHAR);
            o += sizeof REPLACEMENT_CHAR;
        }
        i += len;
    }
    *out_len = o;
    return i;
}

static bool utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t len;
        if (ml_utf8_scan(s + i, n - i, &cp, &len) != ML_UTF8_OK)
            return false;
        i += len;
    }
    return true;
}

static bool id_assigned(const ml_tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_ids && (tok->tok_flags[id] & ML_TOKF_ASSIGNED);
}

static bool skipped(const ml_tokenizer *tok, int32_t id, unsigned flags)
{
    return (flags & ML_DECODE_SKIP_SPECIAL) && (tok->tok_flags[id] & ML_TOKF_SPECIAL);
}

ml_status ml_tokenizer_decode(const ml_tokenizer *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len, char *err,
                              size_t errlen)
{
    if (!tok || (!ids && n) || !text || !len)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tokenizer decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!id_assigned(tok, ids[i]))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "tokenizer decode: ids[%zu] = %ld is not a token id (0..%zu)", i,
                           (long)ids[i], tok->n_ids - 1);
        if (!skipped(tok, ids[i], flags))
            total += tok->tok_len[ids[i]];
    }
    uint8_t *raw = malloc(total + 1);
    if (!raw)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "tokenizer decode: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skipped(tok, ids[i], flags))
            continue;
        memcpy(raw + o, tok->arena + tok->tok_off[ids[i]], tok->tok_len[ids[i]]);
        o += tok->tok_len[ids[i]];
    }
    if ((flags & ML_DECODE_REPLACE_INVALID) && !utf8_valid(raw, total)) {
        uint8_t *fixed = total < SIZE_MAX / REPAIR_GROWTH ? malloc(total * REPAIR_GROWTH + 1)
                                                           : NULL;
        if (!fixed) {
            free(raw);
            return ml_fail(err, errlen, ML_ERR_NOMEM, "tokenizer decode: out of memory");
        }
        utf8_repair(raw, total, true, fixed, &total);
        free(raw);
        raw = fixed;
    }
    raw[total] = '\0';
    *text = (char *)raw;
    *len = total;
    return ML_OK;
}

/* ---- streaming ---------------------------------------------------------------- */

struct ml_token_stream {
    const ml_tokenizer *tok; /* borrowed */
    unsigned flags;
    uint8_t pending[UTF8_MAX_PENDING]; /* unfinished character carried to the next id */
    size_t n_pending;
    uint8_t *in;  /* owned: pending + one token, (max_token_len + UTF8_MAX_PENDING) */
    uint8_t *out; /* owned: REPAIR_GROWTH times that */
};

ml_status ml_token_stream_create(const ml_tokenizer *tok, unsigned flags, ml_token_stream **out,
                                 char *err, size_t errlen)
{
    if (!tok || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "token stream: NULL argument");
    ml_token_stream *s = calloc(1, sizeof *s);
    size_t cap = tok->max_token_len + UTF8_MAX_PENDING;
    if (s) {
        s->in = malloc(cap);
        s->out = malloc(cap * REPAIR_GROWTH);
    }
    if (!s || !s->in || !s->out) {
        ml_token_stream_destroy(s);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "token stream: out of memory");
    }
    s->tok = tok;
    s->flags = flags;
    *out = s;
    return ML_OK;
}

void ml_token_stream_destroy(ml_token_stream *s)
{
    if (!s)
        return;
    free(s->in);
    free(s->out);
    free(s);
}

ml_status ml_token_stream_push(ml_token_stream *s, int32_t id, const char **text, size_t *len,
                               char *err, size_t errlen)
{
    const ml_tokenizer *tok = s->tok;
    *text = (const char *)s->out;
    *len = 0;
    if (!id_assigned(tok, id))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "token stream: %ld is not a token id (0..%zu)", (long)id, tok->n_ids - 1);
    if (skipped(tok, id, s->flags))
        return ML_OK;
    size_t n = s->n_pending + tok->tok_len[id];
    memcpy(s->in, s->pending, s->n_pending);
    memcpy(s->in + s->n_pending, tok->arena + tok->tok_off[id], tok->tok_len[id]);
    size_t used = utf8_repair(s->in, n, false, s->out, len);
    s->n_pending = n - used;
    memcpy(s->pending, s->in + used, s->n_pending);
    return ML_OK;
}

void ml_token_stream_flush(ml_token_stream *s, const char **text, size_t *len)
{
    utf8_repair(s->pending, s->n_pending, true, s->out, len);
    *text = (const char *)s->out;
    s->n_pending = 0;
}
