/* The strict JSON scanner (json_span.h). */
#include "protocol/json_span.h"

#include <assert.h>
#include <string.h>

#include "engine.h" /* ml_hex_digit */
#include "protocol/protocol.h"

#define SURROGATE_HIGH_FIRST 0xd800
#define SURROGATE_LOW_FIRST 0xdc00
#define SURROGATE_LAST 0xdfff
#define UTF16_ESCAPE_LEN 6 /* \uXXXX */

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p))
        p++;
    return p;
}

/* The code unit of the \uXXXX escape at p, or -1. */
static long utf16_escape(const char *p, const char *end)
{
    if (end - p < UTF16_ESCAPE_LEN || p[0] != '\\' || p[1] != 'u')
        return -1;
    long v = 0;
    for (int i = 2; i < UTF16_ESCAPE_LEN; i++) {
        int d = ml_hex_digit((unsigned char)p[i]);
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Past the string at p (*p == '"'), or NULL: raw control characters,
 * invalid escapes, unpaired surrogates and invalid UTF-8 are refused. */
static const char *skip_string(const char *p, const char *end)
{
    p++;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c >= 0x80) {
            size_t k = svc_utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
            if (k == 0)
                return NULL;
            p += k;
            continue;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        if (end - p < 2)
            return NULL;
        if (p[1] != 'u') {
            if (p[1] == '\0' || !strchr("\"\\/bfnrt", p[1]))
                return NULL;
            p += 2;
            continue;
        }
        long u = utf16_escape(p, end);
        if (u < 0 || (u >= SURROGATE_LOW_FIRST && u <= SURROGATE_LAST))
            return NULL;
        p += UTF16_ESCAPE_LEN;
        if (u >= SURROGATE_HIGH_FIRST && u < SURROGATE_LOW_FIRST) {
            long lo = utf16_escape(p, end);
            if (lo < SURROGATE_LOW_FIRST || lo > SURROGATE_LAST)
                return NULL;
            p += UTF16_ESCAPE_LEN;
        }
    }
    return NULL;
}

/* Past one or more digits at p, or NULL when there is none. */
static const char *skip_digits(const char *p, const char *end)
{
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    return q > p ? q : NULL;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static const char *skip_number(const char *p, const char *end)
{
    const char *start = p;
    if (p < end && *p == '-')
        p++;
    if (p < end && *p == '0')
        p++;
    else if (!(p = skip_digits(p, end)))
        return NULL;
    if (p < end && *p == '.' && !(p = skip_digits(p + 1, end)))
        return NULL;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (!(p = skip_digits(p, end)))
            return NULL;
    }
    return p - start <= SVC_JSON_NUMBER_MAX ? p : NULL;
}

static const char *skip_literal(const char *p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

static const char *skip_value(const char *p, const char *end, int depth);

/* Past the object or array at p, or NULL. */
static const char *skip_container(const char *p, const char *end, int depth)
{
    bool object = *p == '{';
    char close = object ? '}' : ']';
    p = skip_ws(p + 1, end);
    if (p < end && *p == close)
        return p + 1;
    for (;;) {
        if (object) {
            p = skip_ws(p, end);
            if (p >= end || *p != '"' || !(p = skip_string(p, end)))
                return NULL;
            p = skip_ws(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p++;
        }
        if (!(p = skip_value(p, end, depth)))
            return NULL;
        p = skip_ws(p, end);
        if (p >= end)
            return NULL;
        if (*p == close)
            return p + 1;
        if (*p != ',')
            return NULL;
        p++;
    }
}

/* Past the value at p (leading whitespace skipped), or NULL. */
static const char *skip_value(const char *p, const char *end, int depth)
{
    p = skip_ws(p, end);
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"': return skip_string(p, end);
    case '{':
    case '[': return depth < SVC_JSON_DEPTH_MAX ? skip_container(p, end, depth + 1) : NULL;
    case 't': return skip_literal(p, end, "true");
    case 'f': return skip_literal(p, end, "false");
    case 'n': return skip_literal(p, end, "null");
    default: return skip_number(p, end);
    }
}

static const svc_span absent = {NULL, 0};

svc_span svc_json_value(const char *s, size_t n)
{
    const char *end = s + n;
    const char *p = skip_ws(s, end);
    const char *q = skip_value(p, end, 0);
    if (!q || skip_ws(q, end) != end)
        return absent;
    return (svc_span){p, (size_t)(q - p)};
}

/* Past the value at p inside a scanned span: it cannot fail there. */
static const char *skip_scanned(const char *p, const char *end)
{
    const char *q = skip_value(p, end, 0);
    assert(q);
    return q;
}

svc_span svc_json_member(svc_span obj, const char *key)
{
    const char *p = obj.p + 1, *end = obj.p + obj.n;
    size_t klen = strlen(key);
    p = skip_ws(p, end);
    while (*p != '}') {
        const char *k = p;
        p = skip_scanned(p, end);
        bool hit = (size_t)(p - k) == klen + 2 && memcmp(k + 1, key, klen) == 0;
        p = skip_ws(skip_ws(p, end) + 1, end); /* past ':' */
        const char *v = p;
        p = skip_scanned(p, end);
        if (hit)
            return (svc_span){v, (size_t)(p - v)};
        p = skip_ws(p, end);
        if (*p == ',')
            p = skip_ws(p + 1, end);
    }
    return absent;
}

svc_span svc_json_first(svc_span arr)
{
    const char *end = arr.p + arr.n;
    const char *p = skip_ws(arr.p + 1, end);
    if (*p == ']')
        return absent;
    return (svc_span){p, (size_t)(skip_scanned(p, end) - p)};
}

svc_span svc_json_next(svc_span arr, svc_span elem)
{
    const char *end = arr.p + arr.n;
    const char *p = skip_ws(elem.p + elem.n, end);
    if (*p == ']')
        return absent;
    p = skip_ws(p + 1, end); /* past ',' */
    return (svc_span){p, (size_t)(skip_scanned(p, end) - p)};
}

bool svc_json_is(svc_span v, char first)
{
    return v.p && v.n > 0 && v.p[0] == first;
}

bool svc_json_is_null(svc_span v)
{
    return !v.p || svc_json_is(v, 'n');
}

bool svc_json_is_number(svc_span v)
{
    return v.p && v.n > 0 && (v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9'));
}

bool svc_json_is_empty(svc_span v)
{
    return skip_ws(v.p + 1, v.p + v.n) == v.p + v.n - 1;
}

svc_span svc_json_inner(svc_span v)
{
    return (svc_span){v.p + 1, v.n - 2};
}

int svc_json_put_compact(svc_buf *b, svc_span v)
{
    size_t len0 = b->len;
    bool in_string = false;
    size_t run = 0;
    int rc = 0;
    for (size_t i = 0; i < v.n && rc == 0; i++) {
        char c = v.p[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (is_ws(c)) {
            rc = svc_buf_append(b, v.p + run, i - run);
            run = i + 1;
        }
    }
    if (rc == 0)
        rc = svc_buf_append(b, v.p + run, v.n - run);
    if (rc != 0) {
        b->len = len0;
        if (b->data)
            b->data[len0] = '\0';
    }
    return rc;
}
