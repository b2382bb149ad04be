/* The tool-call scanner (tool_stream.h): a byte-by-byte walk of the call
 * object's members, the name's string captured, the parameters' value
 * passed on as it comes. */
#include "protocol/tool_stream.h"

#include <stdio.h>
#include <string.h>

#include "engine.h" /* ml_sha256 */

/* Where in {"name": N, "parameters": P} the call is. */
enum {
    CALL_OPEN,        /* before '{' */
    CALL_KEY_WAIT,    /* before a key, or '}' */
    CALL_KEY,         /* in a key */
    CALL_COLON,       /* after a key */
    CALL_VALUE_WAIT,  /* after ':' */
    CALL_NAME,        /* in the name's string */
    CALL_VALUE,       /* in a value: P's (passed on) or another member's */
    CALL_SCALAR,      /* in a number or literal value: ends before its delimiter */
    CALL_AFTER_VALUE, /* before ',' or '}' */
    CALL_DONE,        /* the object closed */
};

#define CALL_ID_PREFIX "call_"
/* The id's hex digits after its prefix: OpenAI's ids have 24 characters there. */
#define CALL_ID_HEX (SVC_TOOL_CALL_ID_LEN - (sizeof CALL_ID_PREFIX - 1))

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void svc_tool_stream_init(svc_tool_stream *ts, bool call)
{
    *ts = (svc_tool_stream){.phase = call ? SVC_TOOL_PHASE_CALL : SVC_TOOL_PHASE_UNDECIDED,
                            .state = CALL_OPEN};
    svc_buf_init(&ts->prose);
}

void svc_tool_stream_deinit(svc_tool_stream *ts)
{
    svc_buf_deinit(&ts->prose);
}

static bool key_is(const svc_tool_stream *ts, const char *k)
{
    return ts->key_len == strlen(k) && !memcmp(ts->key, k, ts->key_len);
}

/* In a string of the call: false once c closed it. */
static bool string_goes_on(svc_tool_stream *ts, char c)
{
    if (ts->escape)
        ts->escape = false;
    else if (c == '\\')
        ts->escape = true;
    else if (c == '"')
        return false;
    return true;
}

/* A value's first byte c: its kind decides how its end is found. */
static void value_begins(svc_tool_stream *ts, char c)
{
    ts->depth = 0;
    ts->in_string = c == '"';
    if (c == '{' || c == '[')
        ts->depth = 1;
    ts->state = ts->in_string || ts->depth ? CALL_VALUE : CALL_SCALAR;
}

/* One byte c of a value after its first (CALL_VALUE); false once c ended
 * it (c is the value's last byte). */
static bool value_goes_on(svc_tool_stream *ts, char c)
{
    if (ts->in_string) {
        ts->in_string = string_goes_on(ts, c);
        return ts->in_string || ts->depth > 0;
    }
    if (c == '"')
        ts->in_string = true;
    else if (c == '{' || c == '[')
        ts->depth++;
    else if (c == '}' || c == ']')
        ts->depth--;
    return ts->depth > 0;
}

/* Advance the call by byte c; true when c belongs to the parameters'
 * value (to pass on). */
static bool call_byte(svc_tool_stream *ts, char c)
{
    bool params = key_is(ts, "parameters") && !ts->args_done;
    switch (ts->state) {
    case CALL_OPEN:
        if (c == '{')
            ts->state = CALL_KEY_WAIT;
        return false;
    case CALL_KEY_WAIT:
        if (c == '"') {
            ts->state = CALL_KEY;
            ts->key_len = 0;
        } else if (c == '}') {
            ts->state = CALL_DONE;
            ts->complete = true;
        }
        return false;
    case CALL_KEY:
        if (!string_goes_on(ts, c))
            ts->state = CALL_COLON;
        else if (ts->key_len < sizeof ts->key)
            ts->key[ts->key_len++] = c;
        return false;
    case CALL_COLON:
        if (c == ':')
            ts->state = CALL_VALUE_WAIT;
        return false;
    case CALL_VALUE_WAIT:
        if (is_ws(c))
            return false;
        if (key_is(ts, "name") && c == '"') {
            ts->state = CALL_NAME;
            ts->name_len = 0;
            return false;
        }
        value_begins(ts, c);
        return params;
    case CALL_NAME:
        if (!string_goes_on(ts, c)) {
            ts->state = CALL_AFTER_VALUE;
            ts->named = true;
        } else if (ts->name_len < SVC_OPENAI_NAME_MAX) {
            ts->name[ts->name_len++] = c;
            ts->name[ts->name_len] = '\0';
        }
        return false;
    case CALL_VALUE:
        if (!value_goes_on(ts, c)) {
            ts->state = CALL_AFTER_VALUE;
            ts->args_done |= params;
        }
        return params;
    case CALL_SCALAR:
        if (!is_ws(c) && c != ',' && c != '}')
            return params;
        ts->state = CALL_AFTER_VALUE;
        ts->args_done |= params;
        return call_byte(ts, c);
    case CALL_AFTER_VALUE:
        if (c == ',')
            ts->state = CALL_KEY_WAIT;
        else if (c == '}') {
            ts->state = CALL_DONE;
            ts->complete = true;
        }
        return false;
    default:
        return false;
    }
}

/* The call's share of s[0..len): its arguments' bytes (one run: P is one
 * value) and whether the name became known. */
static void call_feed(svc_tool_stream *ts, const char *s, size_t len, svc_tool_delta *d)
{
    size_t first = len, last = 0;
    for (size_t i = 0; i < len; i++)
        if (call_byte(ts, s[i]) && ts->named) {
            if (first == len)
                first = i;
            last = i + 1;
        }
    if (ts->named && !ts->named_told) {
        ts->named_told = true;
        d->call_begins = true;
    }
    if (first < len) {
        d->arguments = s + first;
        d->arguments_len = last - first;
    }
}

/* Prose from s on: whitespace held first, if any. */
static void prose(svc_tool_stream *ts, const char *s, size_t len, svc_tool_delta *d)
{
    ts->phase = SVC_TOOL_PHASE_PROSE;
    d->content = s;
    d->content_len = len;
    if (!ts->lead_len)
        return;
    ts->prose.len = 0;
    if (svc_buf_append(&ts->prose, ts->lead, ts->lead_len) == 0 &&
        svc_buf_append(&ts->prose, s, len) == 0) {
        d->content = ts->prose.data;
        d->content_len = ts->prose.len;
    }
    ts->lead_len = 0;
}

svc_tool_delta svc_tool_stream_feed(svc_tool_stream *ts, const char *s, size_t len)
{
    svc_tool_delta d = {0};
    size_t i = 0;
    while (ts->phase == SVC_TOOL_PHASE_UNDECIDED && i < len) {
        if (s[i] == '{') {
            ts->phase = SVC_TOOL_PHASE_CALL;
            ts->lead_len = 0;
        } else if (is_ws(s[i]) && ts->lead_len < sizeof ts->lead) {
            ts->lead[ts->lead_len++] = s[i++];
        } else {
            prose(ts, s + i, len - i, &d);
            return d;
        }
    }
    if (ts->phase == SVC_TOOL_PHASE_PROSE) {
        d.content = s;
        d.content_len = len;
    } else if (ts->phase == SVC_TOOL_PHASE_CALL) {
        call_feed(ts, s + i, len - i, &d);
    }
    return d;
}

svc_tool_delta svc_tool_stream_end(svc_tool_stream *ts)
{
    svc_tool_delta d = {0};
    if (ts->phase == SVC_TOOL_PHASE_UNDECIDED && ts->lead_len)
        prose(ts, "", 0, &d);
    return d;
}

const char *svc_tool_stream_name(const svc_tool_stream *ts)
{
    return ts->named_told ? ts->name : NULL;
}

bool svc_tool_stream_called(const svc_tool_stream *ts)
{
    return ts->phase == SVC_TOOL_PHASE_CALL && ts->complete && ts->named;
}

void svc_tool_call_id(const char *request_id, unsigned index, char out[SVC_TOOL_CALL_ID_LEN + 1])
{
    _Static_assert(CALL_ID_HEX < ML_SHA256_HEX_SIZE, "the id's digits come from one digest");
    uint8_t digest[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    char idx[16];
    int n = snprintf(idx, sizeof idx, "%u", index);
    ml_sha256_ctx c;
    ml_sha256_init(&c);
    ml_sha256_update(&c, request_id, strlen(request_id) + 1); /* the NUL parts id from index */
    ml_sha256_update(&c, idx, (size_t)n);
    ml_sha256_final(&c, digest);
    ml_sha256_hex(digest, hex);
    snprintf(out, SVC_TOOL_CALL_ID_LEN + 1, "%s%.*s", CALL_ID_PREFIX, (int)CALL_ID_HEX, hex);
}
