/* The schema oracle's strict JSON text check (schema_oracle.h), written
 * from RFC 8259: cJSON, which the oracle validates with, also reads texts
 * that are not JSON (leading zeros, a '+' sign, "1."). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "schema_oracle.h"
#include "schema_oracle_internal.h"

/* Nesting the check follows before giving up (far beyond any schema's). */
#define JSON_MAX_DEPTH 256

typedef struct jt {
    const unsigned char *s;
    size_t n, i;
    int depth;
    const char *error; /* static text */
} jt;

static bool jt_fail(jt *t, const char *error)
{
    if (!t->error)
        t->error = error;
    return false;
}

static void jt_ws(jt *t)
{
    while (t->i < t->n && (t->s[t->i] == ' ' || t->s[t->i] == '\t' || t->s[t->i] == '\n' ||
                           t->s[t->i] == '\r'))
        t->i++;
}

static bool jt_lit(jt *t, const char *word)
{
    size_t k = strlen(word);
    if (t->n - t->i < k || memcmp(t->s + t->i, word, k))
        return jt_fail(t, "not a JSON value");
    t->i += k;
    return true;
}

static size_t jt_digits(jt *t)
{
    size_t start = t->i;
    while (t->i < t->n && t->s[t->i] >= '0' && t->s[t->i] <= '9')
        t->i++;
    return t->i - start;
}

/* number = [ minus ] int [ frac ] [ exp ] */
static bool jt_number(jt *t)
{
    if (t->i < t->n && t->s[t->i] == '-')
        t->i++;
    size_t start = t->i, d = jt_digits(t);
    if (d == 0 || (d > 1 && t->s[start] == '0'))
        return jt_fail(t, "bad number");
    if (t->i < t->n && t->s[t->i] == '.') {
        t->i++;
        if (!jt_digits(t))
            return jt_fail(t, "bad fraction");
    }
    if (t->i < t->n && (t->s[t->i] == 'e' || t->s[t->i] == 'E')) {
        t->i++;
        if (t->i < t->n && (t->s[t->i] == '+' || t->s[t->i] == '-'))
            t->i++;
        if (!jt_digits(t))
            return jt_fail(t, "bad exponent");
    }
    return true;
}

/* One UTF-8 sequence at t->i (RFC 3629: shortest form, no surrogates, at
 * most U+10FFFF). */
static bool jt_utf8(jt *t)
{
    unsigned c = t->s[t->i];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (c >= 0x80 && c < 0xC2)
        return jt_fail(t, "bad UTF-8");
    if (c > 0xF4 || t->n - t->i <= (size_t)extra)
        return jt_fail(t, "bad UTF-8");
    uint32_t cp = c & (0x3Fu >> extra);
    for (int k = 1; k <= extra; k++) {
        unsigned b = t->s[t->i + (size_t)k];
        if ((b & 0xC0) != 0x80)
            return jt_fail(t, "bad UTF-8");
        cp = (cp << 6) | (b & 0x3F);
    }
    static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[extra] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return jt_fail(t, "bad UTF-8");
    t->i += (size_t)extra + 1;
    return true;
}

/* The 4 hex digits of the \u escape whose backslash is at t->i, as *v. */
static bool jt_hex4(jt *t, unsigned *v)
{
    if (t->n - t->i < 6)
        return jt_fail(t, "short \\u escape");
    *v = 0;
    for (size_t k = 2; k < 6; k++) {
        int h = oracle_hex_value(t->s[t->i + k]);
        if (h < 0)
            return jt_fail(t, "bad \\u escape");
        *v = *v << 4 | (unsigned)h;
    }
    t->i += 6;
    return true;
}

/* The \u escape at t->i, a surrogate only as a high one followed by the
 * escape of a low one. RFC 8259's grammar lets a lone surrogate through
 * and leaves what it means open (section 8.2); the engine's JSON grammar
 * refuses it, and so do cJSON and most parsers other than Python's. */
static bool jt_unicode_escape(jt *t)
{
    enum { HIGH_FIRST = 0xD800, LOW_FIRST = 0xDC00, LOW_LAST = 0xDFFF };
    unsigned v;
    if (!jt_hex4(t, &v))
        return false;
    if (v < HIGH_FIRST || v > LOW_LAST)
        return true;
    if (v >= LOW_FIRST)
        return jt_fail(t, "lone low surrogate escape");
    if (t->n - t->i < 2 || t->s[t->i] != '\\' || t->s[t->i + 1] != 'u')
        return jt_fail(t, "high surrogate escape without its low one");
    if (!jt_hex4(t, &v))
        return false;
    if (v < LOW_FIRST || v > LOW_LAST)
        return jt_fail(t, "high surrogate escape without its low one");
    return true;
}

static bool jt_string(jt *t)
{
    t->i++; /* the opening quote */
    for (;;) {
        if (t->i >= t->n)
            return jt_fail(t, "unterminated string");
        unsigned c = t->s[t->i];
        if (c == '"') {
            t->i++;
            return true;
        }
        if (c < 0x20)
            return jt_fail(t, "control character in a string");
        if (c == '\\') {
            if (t->i + 1 >= t->n)
                return jt_fail(t, "unterminated escape");
            unsigned e = t->s[t->i + 1];
            if (e == 'u') {
                if (!jt_unicode_escape(t))
                    return false;
            } else if (e && strchr("\"\\/bfnrt", (int)e)) {
                t->i += 2;
            } else {
                return jt_fail(t, "bad escape");
            }
            continue;
        }
        if (c >= 0x80) {
            if (!jt_utf8(t))
                return false;
            continue;
        }
        t->i++;
    }
}

static bool jt_value(jt *t);

/* An object or array after its opening bracket, to close. */
static bool jt_container(jt *t, unsigned char close, bool object)
{
    if (++t->depth > JSON_MAX_DEPTH)
        return jt_fail(t, "nested too deep");
    t->i++;
    jt_ws(t);
    if (t->i < t->n && t->s[t->i] == close) {
        t->i++;
        t->depth--;
        return true;
    }
    for (;;) {
        if (object) {
            if (t->i >= t->n || t->s[t->i] != '"' || !jt_string(t))
                return jt_fail(t, "expected a member name");
            jt_ws(t);
            if (t->i >= t->n || t->s[t->i] != ':')
                return jt_fail(t, "expected ':'");
            t->i++;
        }
        if (!jt_value(t))
            return false;
        if (t->i < t->n && t->s[t->i] == ',') {
            t->i++;
            jt_ws(t);
            continue;
        }
        if (t->i < t->n && t->s[t->i] == close) {
            t->i++;
            t->depth--;
            return true;
        }
        return jt_fail(t, "expected ',' or a closing bracket");
    }
}

/* ws value ws */
static bool jt_value(jt *t)
{
    jt_ws(t);
    if (t->i >= t->n)
        return jt_fail(t, "missing value");
    bool ok;
    switch (t->s[t->i]) {
    case '{': ok = jt_container(t, '}', true); break;
    case '[': ok = jt_container(t, ']', false); break;
    case '"': ok = jt_string(t); break;
    case 't': ok = jt_lit(t, "true"); break;
    case 'f': ok = jt_lit(t, "false"); break;
    case 'n': ok = jt_lit(t, "null"); break;
    default: ok = jt_number(t); break;
    }
    jt_ws(t);
    return ok;
}

bool schema_oracle_json_text(const char *text, size_t len, char *why, size_t n)
{
    jt t = {.s = (const unsigned char *)text, .n = len};
    bool ok = jt_value(&t) && (t.i == t.n || jt_fail(&t, "text after the value"));
    if (!ok && why && n)
        snprintf(why, n, "not JSON at byte %zu: %s", t.i, t.error ? t.error : "?");
    return ok;
}
