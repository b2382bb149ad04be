/* The chat template's tojson: Python's json.dumps of JSON text (pyjson.h). */
#include "tokenizer/pyjson.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"

/* Significant digits that read back to any double (DBL_DECIMAL_DIG). */
#define DOUBLE_MAX_DIGITS 17
/* repr(float) writes fixed notation for decimal exponents in
 * [REPR_FIXED_MIN_EXP, REPR_FIXED_END_EXP), scientific outside. */
#define REPR_FIXED_MIN_EXP (-4)
#define REPR_FIXED_END_EXP 16
/* Room for "%.*e" of a double at DOUBLE_MAX_DIGITS digits and for the
 * digits and exponent of a candidate: "-1.2345678901234567e-308". */
#define FLOAT_TEXT_BYTES 40
/* The hex digits of a \u escape. */
#define UNICODE_ESCAPE_DIGITS 4
#define SURROGATE_HIGH_MIN 0xD800u
#define SURROGATE_LOW_MIN 0xDC00u
#define SURROGATE_LOW_END 0xE000u
#define SUPPLEMENTARY_MIN 0x10000u
/* Code points below this are written as escapes. */
#define CONTROL_END 0x20u

void ml_pyjson_buf_deinit(ml_pyjson_buf *b)
{
    free(b->data);
    *b = (ml_pyjson_buf){0};
}

/* A key of an object being parsed: where its written form (quotes and
 * escapes included) lies in the output, and where it was in the input. */
typedef struct key_span {
    size_t out_at;
    size_t out_len;
    size_t in_at;
    const char *text; /* out->data + out_at, set once the object is complete */
} key_span;

typedef struct parser {
    const char *s;
    size_t n;
    size_t i;
    int indent;
    ml_pyjson_buf *out;
    key_span *keys; /* the keys of every object open, outermost first */
    size_t n_keys;
    size_t cap_keys;
    ml_status st; /* the first error; ML_OK while parsing goes well */
    char *err;
    size_t errlen;
} parser;

static bool fail(parser *p, ml_status st, const char *what)
{
    if (p->st == ML_OK)
        p->st = ml_fail(p->err, p->errlen, st, "tojson: byte %zu: %s", p->i, what);
    return false;
}

static bool reserve(parser *p, size_t extra)
{
    ml_pyjson_buf *b = p->out;
    if (b->cap - b->len > extra)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len <= extra) {
        if (cap > SIZE_MAX / 2)
            return fail(p, ML_ERR_NOMEM, "out of memory");
        cap *= 2;
    }
    char *data = realloc(b->data, cap);
    if (!data)
        return fail(p, ML_ERR_NOMEM, "out of memory");
    b->data = data;
    b->cap = cap;
    return true;
}

static bool emit(parser *p, const char *s, size_t n)
{
    if (!reserve(p, n))
        return false;
    memcpy(p->out->data + p->out->len, s, n);
    p->out->len += n;
    return true;
}

static bool emit_str(parser *p, const char *s) { return emit(p, s, strlen(s)); }

/* count copies of c. */
static bool emit_repeat(parser *p, char c, size_t count)
{
    if (!reserve(p, count))
        return false;
    memset(p->out->data + p->out->len, c, count);
    p->out->len += count;
    return true;
}

/* A line break and the indent of the given depth; nothing without indent. */
static bool emit_newline(parser *p, size_t depth)
{
    if (p->indent == ML_PYJSON_NO_INDENT)
        return true;
    return emit_str(p, "\n") && emit_repeat(p, ' ', (size_t)p->indent * depth);
}

static void skip_ws(parser *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static bool at_char(const parser *p, char c) { return p->i < p->n && p->s[p->i] == c; }

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* ---- strings ------------------------------------------------------------- */

/* One code point of a string as json.dumps(ensure_ascii=False) writes it. */
static bool emit_code_point(parser *p, uint32_t cp)
{
    switch (cp) {
    case '"': return emit_str(p, "\\\"");
    case '\\': return emit_str(p, "\\\\");
    case '\n': return emit_str(p, "\\n");
    case '\r': return emit_str(p, "\\r");
    case '\t': return emit_str(p, "\\t");
    case '\b': return emit_str(p, "\\b");
    case '\f': return emit_str(p, "\\f");
    default: break;
    }
    char u[8];
    int n;
    if (cp < CONTROL_END)
        n = snprintf(u, sizeof u, "\\u%04" PRIx32, cp);
    else if (cp < 0x80)
        n = snprintf(u, sizeof u, "%c", (char)cp);
    else if (cp < 0x800)
        n = snprintf(u, sizeof u, "%c%c", (char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)));
    else if (cp < SUPPLEMENTARY_MIN)
        n = snprintf(u, sizeof u, "%c%c%c", (char)(0xE0 | cp >> 12),
                     (char)(0x80 | (cp >> 6 & 0x3F)), (char)(0x80 | (cp & 0x3F)));
    else
        n = snprintf(u, sizeof u, "%c%c%c%c", (char)(0xF0 | cp >> 18),
                     (char)(0x80 | (cp >> 12 & 0x3F)), (char)(0x80 | (cp >> 6 & 0x3F)),
                     (char)(0x80 | (cp & 0x3F)));
    return emit(p, u, (size_t)n);
}

/* The 4 hex digits of a \u escape at p->i. */
static bool read_hex4(parser *p, uint32_t *v)
{
    if (p->n - p->i < UNICODE_ESCAPE_DIGITS)
        return fail(p, ML_ERR_INVALID_ARG, "\\u escape cut short");
    *v = 0;
    for (int k = 0; k < UNICODE_ESCAPE_DIGITS; k++) {
        char c = p->s[p->i + k];
        uint32_t d;
        if (is_digit(c))
            d = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (uint32_t)(c - 'A' + 10);
        else
            return fail(p, ML_ERR_INVALID_ARG, "\\u escape without 4 hex digits");
        *v = *v << 4 | d;
    }
    p->i += UNICODE_ESCAPE_DIGITS;
    return true;
}

/* After "\u": one code point, a surrogate pair joined. */
static bool read_unicode_escape(parser *p, uint32_t *cp)
{
    if (!read_hex4(p, cp))
        return false;
    if (*cp < SURROGATE_HIGH_MIN || *cp >= SURROGATE_LOW_END)
        return true;
    if (*cp >= SURROGATE_LOW_MIN || p->n - p->i < 2 || p->s[p->i] != '\\' ||
        p->s[p->i + 1] != 'u')
        return fail(p, ML_ERR_INVALID_ARG, "\\u escape of a lone surrogate");
    p->i += 2;
    uint32_t low;
    if (!read_hex4(p, &low))
        return false;
    if (low < SURROGATE_LOW_MIN || low >= SURROGATE_LOW_END)
        return fail(p, ML_ERR_INVALID_ARG, "\\u escape of a lone surrogate");
    *cp = SUPPLEMENTARY_MIN + ((*cp - SURROGATE_HIGH_MIN) << 10) + (low - SURROGATE_LOW_MIN);
    return true;
}

/* A string at p->i (its opening quote), decoded and written again. */
static bool parse_string(parser *p)
{
    p->i++;
    if (!emit_str(p, "\""))
        return false;
    for (;;) {
        if (p->i == p->n)
            return fail(p, ML_ERR_INVALID_ARG, "unterminated string");
        uint8_t c = (uint8_t)p->s[p->i];
        if (c == '"') {
            p->i++;
            return emit_str(p, "\"");
        }
        if (c < CONTROL_END)
            return fail(p, ML_ERR_INVALID_ARG, "control character in a string");
        if (c >= 0x80) {
            uint32_t cp;
            size_t len;
            if (ml_utf8_scan((const uint8_t *)p->s + p->i, p->n - p->i, &cp, &len) != ML_UTF8_OK)
                return fail(p, ML_ERR_INVALID_ARG, "ill-formed UTF-8");
            if (!emit(p, p->s + p->i, len))
                return false;
            p->i += len;
            continue;
        }
        p->i++;
        if (c != '\\') {
            if (!emit_code_point(p, c))
                return false;
            continue;
        }
        if (p->i == p->n)
            return fail(p, ML_ERR_INVALID_ARG, "unterminated string");
        char e = p->s[p->i++];
        uint32_t cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!read_unicode_escape(p, &cp))
                return false;
            break;
        default: p->i--; return fail(p, ML_ERR_INVALID_ARG, "invalid escape in a string");
        }
        if (!emit_code_point(p, cp))
            return false;
    }
}

/* ---- numbers ------------------------------------------------------------- */

static bool reads_back(const char *text, double d) { return strtod(text, NULL) == d; }

/* The shortest decimal m * 10^e10 that reads back to d (finite, > 0), and
 * of those the nearest to d: Python's repr (David Gay's mode 0). At each
 * precision the correctly rounded "%.*e" is the nearest candidate; where d
 * is a power of two its rounding interval is narrower below than above, so
 * the nearest may miss while its neighbour on the wide side reads back. */
static void shortest_decimal(double d, uint64_t *m, int *e10)
{
    char text[FLOAT_TEXT_BYTES];
    for (int prec = 1; prec <= DOUBLE_MAX_DIGITS; prec++) {
        snprintf(text, sizeof text, "%.*e", prec - 1, d);
        char *exp_at = strchr(text, 'e');
        int exp = atoi(exp_at + 1) - (prec - 1);
        uint64_t digits = 0;
        for (const char *c = text; c < exp_at; c++)
            if (is_digit(*c))
                digits = digits * 10 + (uint64_t)(*c - '0');
        if (reads_back(text, d) || prec == DOUBLE_MAX_DIGITS) {
            *m = digits;
            *e10 = exp;
            return;
        }
        for (int step = -1; step <= 1; step += 2) {
            uint64_t near = digits + (uint64_t)(int64_t)step;
            snprintf(text, sizeof text, "%" PRIu64 "e%d", near, exp);
            if (reads_back(text, d)) {
                *m = near;
                *e10 = exp;
                return;
            }
        }
    }
}

/* repr(d) for a finite double. */
static bool emit_py_float(parser *p, double d)
{
    if (signbit(d) && !emit_str(p, "-"))
        return false;
    d = fabs(d);
    if (d == 0)
        return emit_str(p, "0.0");
    uint64_t m = 0;
    int e10 = 0;
    shortest_decimal(d, &m, &e10);
    while (m % 10 == 0) {
        m /= 10;
        e10++;
    }
    char digits[FLOAT_TEXT_BYTES];
    int n = snprintf(digits, sizeof digits, "%" PRIu64, m);
    int exp = e10 + n - 1; /* d = digits[0].digits[1..] * 10^exp */
    if (exp < REPR_FIXED_MIN_EXP || exp >= REPR_FIXED_END_EXP) {
        char exponent[FLOAT_TEXT_BYTES];
        snprintf(exponent, sizeof exponent, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
        return emit(p, digits, 1) && (n == 1 || (emit_str(p, ".") && emit_str(p, digits + 1))) &&
               emit_str(p, exponent);
    }
    if (exp < 0) /* 0.000ddd */
        return emit_str(p, "0.") && emit_repeat(p, '0', (size_t)(-exp - 1)) &&
               emit(p, digits, (size_t)n);
    if (exp + 1 < n) /* dd.ddd */
        return emit(p, digits, (size_t)exp + 1) && emit_str(p, ".") &&
               emit(p, digits + exp + 1, (size_t)(n - exp - 1));
    /* ddd00.0 */
    return emit(p, digits, (size_t)n) && emit_repeat(p, '0', (size_t)(exp + 1 - n)) &&
           emit_str(p, ".0");
}

/* A number at p->i: integers as Python's int writes them, others through
 * float (pyjson.h). */
static bool parse_number(parser *p)
{
    size_t start = p->i;
    bool negative = at_char(p, '-');
    if (negative)
        p->i++;
    size_t int_start = p->i;
    if (at_char(p, '0')) {
        p->i++;
    } else if (p->i < p->n && p->s[p->i] >= '1' && p->s[p->i] <= '9') {
        while (p->i < p->n && is_digit(p->s[p->i]))
            p->i++;
    } else {
        return fail(p, ML_ERR_INVALID_ARG, "invalid value");
    }
    size_t int_digits = p->i - int_start;
    bool is_float = false;
    if (at_char(p, '.')) {
        p->i++;
        if (!(p->i < p->n && is_digit(p->s[p->i])))
            return fail(p, ML_ERR_INVALID_ARG, "no digit after the decimal point");
        while (p->i < p->n && is_digit(p->s[p->i]))
            p->i++;
        is_float = true;
    }
    if (at_char(p, 'e') || at_char(p, 'E')) {
        p->i++;
        if (at_char(p, '+') || at_char(p, '-'))
            p->i++;
        if (!(p->i < p->n && is_digit(p->s[p->i])))
            return fail(p, ML_ERR_INVALID_ARG, "no digit in the exponent");
        while (p->i < p->n && is_digit(p->s[p->i]))
            p->i++;
        is_float = true;
    }
    if (!is_float) {
        if (int_digits > ML_PYJSON_INT_MAX_DIGITS)
            return fail(p, ML_ERR_INVALID_ARG, "integer of more digits than Python reads");
        if (negative && int_digits == 1 && p->s[int_start] == '0')
            return emit_str(p, "0");
        return emit(p, p->s + start, p->i - start);
    }
    /* strtod needs a NUL-terminated copy; the lexeme may be long. */
    size_t len = p->i - start;
    char *copy = malloc(len + 1);
    if (!copy)
        return fail(p, ML_ERR_NOMEM, "out of memory");
    memcpy(copy, p->s + start, len);
    copy[len] = '\0';
    char *end;
    double d = strtod(copy, &end);
    bool whole = end == copy + len;
    free(copy);
    /* strtod reads the decimal point of the C locale, which a JSON
     * lexeme's '.' is unless a caller changed LC_NUMERIC. */
    if (!whole)
        return fail(p, ML_ERR_INVALID_ARG, "number not read whole (LC_NUMERIC is not C?)");
    if (isinf(d)) {
        p->i = start;
        return fail(p, ML_ERR_INVALID_ARG, "number beyond the range of a double");
    }
    return emit_py_float(p, d);
}

/* ---- arrays and objects --------------------------------------------------- */

static bool parse_value(parser *p, size_t depth);

static int compare_keys(const void *a, const void *b)
{
    const key_span *x = a, *y = b;
    int c = memcmp(x->text, y->text, x->out_len < y->out_len ? x->out_len : y->out_len);
    if (c)
        return c;
    return (x->out_len > y->out_len) - (x->out_len < y->out_len);
}

/* The keys of the object just written are p->keys[first..]: refuse a
 * repeated one and pop them. Keys compare by their written form, which
 * one decoded key has exactly one of. */
static bool check_unique_keys(parser *p, size_t first)
{
    key_span *k = p->keys + first;
    size_t n = p->n_keys - first;
    for (size_t j = 0; j < n; j++)
        k[j].text = p->out->data + k[j].out_at;
    qsort(k, n, sizeof *k, compare_keys);
    for (size_t j = 1; j < n; j++) {
        if (!compare_keys(&k[j - 1], &k[j])) {
            p->i = k[j - 1].in_at > k[j].in_at ? k[j - 1].in_at : k[j].in_at;
            return fail(p, ML_ERR_INVALID_ARG, "key repeated in an object");
        }
    }
    p->n_keys = first;
    return true;
}

static bool push_key(parser *p, size_t out_at, size_t in_at)
{
    if (p->n_keys == p->cap_keys) {
        size_t cap = p->cap_keys ? 2 * p->cap_keys : 16;
        key_span *keys = realloc(p->keys, cap * sizeof *keys);
        if (!keys)
            return fail(p, ML_ERR_NOMEM, "out of memory");
        p->keys = keys;
        p->cap_keys = cap;
    }
    p->keys[p->n_keys++] = (key_span){.out_at = out_at,
                                      .out_len = p->out->len - out_at,
                                      .in_at = in_at};
    return true;
}

/* An array or object at p->i (its opening bracket), at the given depth
 * (1 for the outermost). */
static bool parse_container(parser *p, size_t depth)
{
    bool object = p->s[p->i] == '{';
    char close = object ? '}' : ']';
    if (depth > ML_PYJSON_MAX_DEPTH)
        return fail(p, ML_ERR_INVALID_ARG, "nested deeper than ML_PYJSON_MAX_DEPTH");
    p->i++;
    if (!emit(p, object ? "{" : "[", 1))
        return false;
    skip_ws(p);
    if (at_char(p, close)) {
        p->i++;
        return emit(p, &close, 1);
    }
    size_t first_key = p->n_keys;
    for (bool first = true;; first = false) {
        if (!first && !emit_str(p, p->indent == ML_PYJSON_NO_INDENT ? ", " : ","))
            return false;
        if (!emit_newline(p, depth))
            return false;
        if (object) {
            if (!at_char(p, '"'))
                return fail(p, ML_ERR_INVALID_ARG, "object key is not a string");
            size_t out_at = p->out->len, in_at = p->i;
            if (!parse_string(p) || !push_key(p, out_at, in_at))
                return false;
            skip_ws(p);
            if (!at_char(p, ':'))
                return fail(p, ML_ERR_INVALID_ARG, "':' expected after an object key");
            p->i++;
            if (!emit_str(p, ": "))
                return false;
            skip_ws(p);
        }
        if (!parse_value(p, depth))
            return false;
        skip_ws(p);
        if (at_char(p, ','))
            p->i++, skip_ws(p);
        else if (at_char(p, close))
            break;
        else
            return fail(p, ML_ERR_INVALID_ARG,
                        object ? "',' or '}' expected in an object"
                               : "',' or ']' expected in an array");
    }
    p->i++;
    if (object && !check_unique_keys(p, first_key))
        return false;
    return emit_newline(p, depth - 1) && emit(p, &close, 1);
}

static bool parse_literal(parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->n - p->i < n || memcmp(p->s + p->i, word, n))
        return fail(p, ML_ERR_INVALID_ARG, "invalid value");
    p->i += n;
    return emit(p, word, n);
}

/* A value at p->i, inside containers nested depth deep. */
static bool parse_value(parser *p, size_t depth)
{
    if (p->i == p->n)
        return fail(p, ML_ERR_INVALID_ARG, "value expected, end of text found");
    switch (p->s[p->i]) {
    case '{':
    case '[': return parse_container(p, depth + 1);
    case '"': return parse_string(p);
    case 't': return parse_literal(p, "true");
    case 'f': return parse_literal(p, "false");
    case 'n': return parse_literal(p, "null");
    default: return parse_number(p);
    }
}

ml_status ml_pyjson_dumps(const char *json, size_t len, int indent, ml_pyjson_buf *out, char *err,
                          size_t errlen)
{
    if (!out || (!json && len))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tojson: NULL argument");
    if (indent < 0 && indent != ML_PYJSON_NO_INDENT)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tojson: indent %d", indent);
    parser p = {.s = json, .n = len, .indent = indent, .out = out, .err = err, .errlen = errlen};
    size_t old_len = out->len;
    skip_ws(&p);
    if (parse_value(&p, 0)) {
        skip_ws(&p);
        if (p.i != p.n)
            fail(&p, ML_ERR_INVALID_ARG, "text after the value");
    }
    if (p.st == ML_OK && reserve(&p, 0))
        out->data[out->len] = '\0';
    free(p.keys);
    if (p.st != ML_OK)
        out->len = old_len;
    return p.st;
}
