/* JSON mode (json_mode.h): a byte-level pushdown recognizer of one JSON
 * object, and the walk of the vocabulary trie (json_vocab.c builds it) that
 * turns it into a token mask. */
#include "grammar/json_mode.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_mode_internal.h"
#include "sha256.h"

/* ---- the recognizer -------------------------------------------------------- */

/* Where the recognizer is. The first group sits between tokens of the JSON
 * grammar, where whitespace may come; the others are inside a string (kept
 * contiguous, JSON_STR..JSON_STR_UTF8, for json_in_string), a number or a
 * literal, where it may not. */
enum json_mode {
    JSON_START,          /* before the top-level object: '{' */
    JSON_OBJ_FIRST,      /* after '{': a key or '}' */
    JSON_OBJ_KEY,        /* after ',' in an object: a key */
    JSON_OBJ_COLON,      /* after a key: ':' */
    JSON_VALUE,          /* after ':', or ',' in an array: a value */
    JSON_ARR_FIRST,      /* after '[': a value or ']' */
    JSON_AFTER_VALUE,    /* after a value in a container: ',' or the container's closer */
    JSON_DONE,           /* the top-level object is closed */
    JSON_STR,            /* in a string, between characters */
    JSON_STR_ESC,        /* after '\' */
    JSON_STR_HEX,        /* in the 4 hex digits of \u, count of them read */
    JSON_STR_LOW,        /* after a high surrogate escape: '\' of the low one */
    JSON_STR_LOW_ESC,    /* then its 'u' */
    JSON_STR_UTF8,       /* in a multi-byte character, count continuation bytes left */
    JSON_NUM_MINUS,      /* after '-': a digit */
    JSON_NUM_ZERO,       /* integer part "0": '.', an exponent or the end */
    JSON_NUM_INT,        /* integer part [1-9][0-9]* */
    JSON_NUM_DOT,        /* after '.': a digit */
    JSON_NUM_FRAC,       /* in the fraction digits */
    JSON_NUM_EXP,        /* after 'e': a sign or a digit */
    JSON_NUM_EXP_SIGN,   /* after the exponent's sign: a digit */
    JSON_NUM_EXP_DIGITS, /* in the exponent digits */
    JSON_LITERAL,        /* in true/false/null, count bytes matched */
};

/* json_rec.flags */
enum {
    JSON_FLAG_KEY = 1u << 0,      /* the open string is an object key */
    JSON_FLAG_HEX_D = 1u << 1,    /* this \u escape's first digit is D */
    JSON_FLAG_HEX_HIGH = 1u << 2, /* this \u escape is a high surrogate (D800-DBFF) */
    JSON_FLAG_HEX_LOW = 1u << 3,  /* this \u escape must be a low surrogate (DC00-DFFF) */
};

#define JSON_HEX_DIGITS 4
#define JSON_STACK_WORDS ((ML_JSON_MAX_DEPTH + 63) / 64)
_Static_assert(ML_JSON_MAX_DEPTH <= UINT8_MAX, "json_rec.depth is a uint8_t");

/* The whole position of a sequence in the grammar, copied by value at every
 * trie node (24 bytes). */
typedef struct json_rec {
    uint64_t
        stack[JSON_STACK_WORDS]; /* bit d set: container d + 1 (from the top level) is an array */
    uint8_t mode;                /* enum json_mode */
    uint8_t count;               /* JSON_STR_HEX, JSON_STR_UTF8, JSON_LITERAL: see there */
    uint8_t lo, hi;              /* JSON_STR_UTF8: range of the next continuation byte */
    uint8_t flags;               /* JSON_FLAG_* */
    uint8_t literal;             /* JSON_LITERAL: index into json_literals */
    uint8_t depth;               /* open containers, 0..ML_JSON_MAX_DEPTH */
    uint8_t ws;                  /* whitespace bytes in a row outside strings */
} json_rec;

static const char *const json_literals[] = {"true", "false", "null"};

static bool json_is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool json_in_string(uint8_t mode)
{
    return mode >= JSON_STR && mode <= JSON_STR_UTF8;
}

static bool json_top_is_array(const json_rec *r)
{
    unsigned d = r->depth - 1u;
    return (r->stack[d >> 6] >> (d & 63u)) & 1u;
}

static bool json_push(json_rec *r, bool array)
{
    if (r->depth == ML_JSON_MAX_DEPTH)
        return false;
    unsigned d = r->depth++;
    uint64_t bit = 1ull << (d & 63u);
    if (array)
        r->stack[d >> 6] |= bit;
    else
        r->stack[d >> 6] &= ~bit;
    r->mode = array ? JSON_ARR_FIRST : JSON_OBJ_FIRST;
    return true;
}

static void json_pop(json_rec *r)
{
    r->depth--;
    r->mode = r->depth ? JSON_AFTER_VALUE : JSON_DONE;
}

static void json_open_string(json_rec *r, bool key)
{
    r->mode = JSON_STR;
    r->flags = key ? JSON_FLAG_KEY : 0;
}

/* c begins a value (anything but whitespace). */
static bool json_value_start(json_rec *r, uint8_t c)
{
    switch (c) {
    case '"':
        json_open_string(r, false);
        return true;
    case '{':
        return json_push(r, false);
    case '[':
        return json_push(r, true);
    case '-':
        r->mode = JSON_NUM_MINUS;
        return true;
    case '0':
        r->mode = JSON_NUM_ZERO;
        return true;
    case 't':
    case 'f':
    case 'n':
        r->mode = JSON_LITERAL;
        r->literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
        r->count = 1;
        return true;
    default:
        if (c < '1' || c > '9')
            return false;
        r->mode = JSON_NUM_INT;
        return true;
    }
}

static bool json_after_value(json_rec *r, uint8_t c)
{
    if (ml_json_is_ws(c))
        return true;
    bool array = json_top_is_array(r);
    if (c == ',') {
        r->mode = array ? JSON_VALUE : JSON_OBJ_KEY;
        return true;
    }
    if (c != (array ? ']' : '}'))
        return false;
    json_pop(r);
    return true;
}

/* A number ends at the first byte that cannot continue it; that byte is then
 * read as what follows the value. */
static bool json_number_end(json_rec *r, uint8_t c)
{
    r->mode = JSON_AFTER_VALUE;
    return json_after_value(r, c);
}

/* After the integer part: a fraction, an exponent, or the end. */
static bool json_number_tail(json_rec *r, uint8_t c)
{
    if (c == '.')
        r->mode = JSON_NUM_DOT;
    else if (c == 'e' || c == 'E')
        r->mode = JSON_NUM_EXP;
    else
        return json_number_end(r, c);
    return true;
}

/* A byte in a string between characters. */
static bool json_string_byte(json_rec *r, uint8_t c)
{
    if (c == '"') {
        r->mode = (r->flags & JSON_FLAG_KEY) ? JSON_OBJ_COLON : JSON_AFTER_VALUE;
        return true;
    }
    if (c == '\\') {
        r->mode = JSON_STR_ESC;
        return true;
    }
    if (c < 0x20)
        return false;
    if (c < 0x80)
        return true;
    /* A lead byte (RFC 3629 section 4). The first continuation byte's range
     * is what excludes overlong forms (after E0, F0), surrogates (after ED)
     * and code points past U+10FFFF (after F4). */
    r->lo = 0x80;
    r->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        r->count = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        r->count = 2;
        if (c == 0xE0)
            r->lo = 0xA0;
        else if (c == 0xED)
            r->hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        r->count = 3;
        if (c == 0xF0)
            r->lo = 0x90;
        else if (c == 0xF4)
            r->hi = 0x8F;
    } else {
        return false; /* a continuation byte, C0, C1 or F5..FF */
    }
    r->mode = JSON_STR_UTF8;
    return true;
}

/* The one-character escapes after '\\' (RFC 8259 section 7). */
static bool json_is_escape(uint8_t c)
{
    switch (c) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't':
        return true;
    default:
        return false;
    }
}


/* A hex digit of \uXXXX. Surrogates are decided by the first two digits:
 * D8..DB is a high surrogate (a low escape must follow), DC..DF a low one
 * (refused unless it is that escape). */
static bool json_hex_digit(json_rec *r, uint8_t c)
{
    int v = ml_hex_digit(c);
    if (v < 0)
        return false;
    bool low = r->flags & JSON_FLAG_HEX_LOW;
    if (r->count == 0) {
        if (low && v != 0xD)
            return false;
        if (v == 0xD)
            r->flags |= JSON_FLAG_HEX_D;
    } else if (r->count == 1 && (r->flags & JSON_FLAG_HEX_D)) {
        if (low != (v >= 0xC))
            return false;
        if (v >= 0x8 && v <= 0xB)
            r->flags |= JSON_FLAG_HEX_HIGH;
    }
    if (++r->count < JSON_HEX_DIGITS)
        return true;
    r->mode = (r->flags & JSON_FLAG_HEX_HIGH) ? JSON_STR_LOW : JSON_STR;
    r->flags &= (uint8_t) ~(JSON_FLAG_HEX_D | JSON_FLAG_HEX_HIGH | JSON_FLAG_HEX_LOW);
    return true;
}

/* Advance r by byte c. Returns false when c cannot come next; r is then
 * clobbered (callers step a copy). */
static bool json_step(json_rec *r, uint8_t c)
{
    if (!json_in_string(r->mode)) { /* in a string, whitespace is content */
        bool ws = ml_json_is_ws(c);
        if (ws && r->ws == ML_JSON_MAX_WHITESPACE)
            return false;
        r->ws = ws ? (uint8_t)(r->ws + 1) : 0;
    }
    switch ((enum json_mode)r->mode) {
    case JSON_START:
        if (ml_json_is_ws(c))
            return true;
        return c == '{' && json_push(r, false);
    case JSON_OBJ_FIRST:
        if (c == '}') {
            json_pop(r);
            return true;
        }
        /* fall through */
    case JSON_OBJ_KEY:
        if (ml_json_is_ws(c))
            return true;
        if (c != '"')
            return false;
        json_open_string(r, true);
        return true;
    case JSON_OBJ_COLON:
        if (ml_json_is_ws(c))
            return true;
        if (c != ':')
            return false;
        r->mode = JSON_VALUE;
        return true;
    case JSON_ARR_FIRST:
        if (c == ']') {
            json_pop(r);
            return true;
        }
        /* fall through */
    case JSON_VALUE:
        return ml_json_is_ws(c) || json_value_start(r, c);
    case JSON_AFTER_VALUE:
        return json_after_value(r, c);
    case JSON_DONE:
        return ml_json_is_ws(c);
    case JSON_STR:
        return json_string_byte(r, c);
    case JSON_STR_ESC:
        if (c == 'u') {
            r->mode = JSON_STR_HEX;
            r->count = 0;
            return true;
        }
        if (!json_is_escape(c))
            return false;
        r->mode = JSON_STR;
        return true;
    case JSON_STR_HEX:
        return json_hex_digit(r, c);
    case JSON_STR_LOW:
        if (c != '\\')
            return false;
        r->mode = JSON_STR_LOW_ESC;
        return true;
    case JSON_STR_LOW_ESC:
        if (c != 'u')
            return false;
        r->mode = JSON_STR_HEX;
        r->count = 0;
        r->flags |= JSON_FLAG_HEX_LOW;
        return true;
    case JSON_STR_UTF8:
        if (c < r->lo || c > r->hi)
            return false;
        r->lo = 0x80;
        r->hi = 0xBF;
        if (--r->count == 0)
            r->mode = JSON_STR;
        return true;
    case JSON_NUM_MINUS:
        if (!json_is_digit(c))
            return false;
        r->mode = c == '0' ? JSON_NUM_ZERO : JSON_NUM_INT;
        return true;
    case JSON_NUM_ZERO:
        return json_number_tail(r, c);
    case JSON_NUM_INT:
        return json_is_digit(c) || json_number_tail(r, c);
    case JSON_NUM_DOT:
        if (!json_is_digit(c))
            return false;
        r->mode = JSON_NUM_FRAC;
        return true;
    case JSON_NUM_FRAC:
        if (json_is_digit(c))
            return true;
        if (c != 'e' && c != 'E')
            return json_number_end(r, c);
        r->mode = JSON_NUM_EXP;
        return true;
    case JSON_NUM_EXP:
        if (c == '+' || c == '-') {
            r->mode = JSON_NUM_EXP_SIGN;
            return true;
        }
        /* fall through */
    case JSON_NUM_EXP_SIGN:
        if (!json_is_digit(c))
            return false;
        r->mode = JSON_NUM_EXP_DIGITS;
        return true;
    case JSON_NUM_EXP_DIGITS:
        return json_is_digit(c) || json_number_end(r, c);
    case JSON_LITERAL: {
        const char *lit = json_literals[r->literal];
        if (c != (uint8_t)lit[r->count])
            return false;
        if (lit[++r->count] == '\0')
            r->mode = JSON_AFTER_VALUE;
        return true;
    }
    }
    return false;
}

/* Step r over bytes[0..len). Returns len when every byte is accepted, else
 * the index of the first refused one (r clobbered). */
static size_t json_run(json_rec *r, const uint8_t *bytes, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!json_step(r, bytes[i]))
            return i;
    return len;
}

/* ---- the vocabulary trie (built in json_vocab.c) --------------------------- */

/* The string state of each JSON_PRE_* entry. */
static const uint8_t json_pre_mode[JSON_N_PRE] = {JSON_STR, JSON_STR_ESC};

/* One level of a walk down the trie: the recognizer after the path to a
 * node, and the children of that node still to scan. */
typedef struct json_level {
    json_rec rec;
    uint32_t next, end; /* children [next, end) */
    uint8_t need;       /* scan only children with these flags (0: all) */
} json_level;

struct ml_json_state {
    const ml_json_vocab *v; /* borrowed */
    json_rec rec;
    json_level walk[]; /* v->max_len + 1: one level per trie depth */
};

static void json_set_bit(uint64_t *mask, int32_t id)
{
    mask[(uint32_t)id >> 6] |= 1ull << ((uint32_t)id & 63u);
}

static void json_level_enter(json_level *l, const ml_json_vocab *v, uint32_t node, uint8_t need)
{
    l->next = v->child[node];
    l->end = v->child[node + 1];
    l->need = need;
}

/* The mask walk: depth first from state start, skipping a subtree at the
 * first refused byte. When start is json_pre_mode[p], need is
 * JSON_NODE_CLOSES << p and the walk also skips every child without that
 * flag until a byte leaves the string (the tokens it skips are in
 * in_string[p]); otherwise need is 0. walk has v->max_len + 1 levels; the
 * accepted tokens' bits are ORed into allowed. */
static void json_walk(const ml_json_vocab *v, json_level *walk, const json_rec *start, uint8_t need,
                      uint64_t *allowed)
{
    walk[0].rec = *start;
    json_level_enter(&walk[0], v, 0, need);
    size_t d = 0;
    for (;;) {
        json_level *l = &walk[d];
        if (l->next == l->end) {
            if (d == 0)
                return;
            d--;
            continue;
        }
        uint32_t c = l->next++;
        if ((v->flags[c] & l->need) != l->need)
            continue;
        json_level *below = l + 1;
        below->rec = l->rec;
        if (!json_step(&below->rec, v->byte[c]))
            continue;
        for (uint32_t t = v->tok[c]; t < v->tok[c + 1]; t++)
            json_set_bit(allowed, v->ids[t]);
        if (v->child[c] == v->child[c + 1])
            continue;
        /* Past the string's closing quote every continuation depends on
         * what follows the string: scan all of them. */
        json_level_enter(below, v, c, json_in_string(below->rec.mode) ? l->need : 0);
        d++;
    }
}

/* Decide once the tokens whose verdict from string state json_pre_mode[p]
 * depends only on the string: set v->in_string[p] for those accepted
 * without leaving it, and flag JSON_NODE_CLOSES << p on each node where a
 * byte leaves it and on that node's ancestors. The walk of json_walk, with
 * path[d] the node at depth d of the current path; walk and path have
 * v->max_len + 1 entries. */
static void json_mark_strings(ml_json_vocab *v, size_t p, json_level *walk, uint32_t *path)
{
    uint8_t flag = (uint8_t)(JSON_NODE_CLOSES << p);
    /* Any string will do (see json_pre_mode). */
    walk[0].rec = (json_rec){.mode = json_pre_mode[p], .depth = 1};
    json_level_enter(&walk[0], v, 0, 0);
    size_t d = 0;
    for (;;) {
        json_level *l = &walk[d];
        if (l->next == l->end) {
            if (d == 0)
                return;
            d--;
            continue;
        }
        uint32_t c = l->next++;
        json_level *below = l + 1;
        below->rec = l->rec;
        if (!json_step(&below->rec, v->byte[c]))
            continue;
        if (!json_in_string(below->rec.mode)) {
            v->flags[c] |= flag;
            for (size_t a = d; a > 0 && !(v->flags[path[a]] & flag); a--)
                v->flags[path[a]] |= flag;
            continue;
        }
        for (uint32_t t = v->tok[c]; t < v->tok[c + 1]; t++)
            json_set_bit(v->in_string[p], v->ids[t]);
        if (v->child[c] == v->child[c + 1])
            continue;
        json_level_enter(below, v, c, 0);
        path[++d] = c;
    }
}

/* Decide what json_mark_strings decides for every JSON_PRE_* state. */
ml_status ml_json_vocab_mark_strings(ml_json_vocab *v, char *err, size_t errlen)
{
    json_level *walk = malloc((v->max_len + 1) * sizeof *walk);
    uint32_t *path = malloc((v->max_len + 1) * sizeof *path);
    if (walk && path)
        for (size_t p = 0; p < JSON_N_PRE; p++)
            json_mark_strings(v, p, walk, path);
    free(walk);
    free(path);
    return walk && path ? ML_OK
                        : ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory");
}

/* ---- per-sequence state ---------------------------------------------------- */

ml_status ml_json_state_create(const ml_json_vocab *v, ml_json_state **out, char *err,
                               size_t errlen)
{
    if (!v || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "json mode: NULL argument");
    ml_json_state *s = malloc(sizeof *s + (v->max_len + 1) * sizeof s->walk[0]);
    if (!s)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory");
    s->v = v;
    ml_json_state_reset(s);
    *out = s;
    return ML_OK;
}

void ml_json_state_destroy(ml_json_state *s)
{
    free(s);
}

void ml_json_state_reset(ml_json_state *s)
{
    s->rec = (json_rec){.mode = JSON_START};
}

void ml_json_state_allowed(ml_json_state *s, uint64_t *allowed)
{
    const ml_json_vocab *v = s->v;
    if (s->rec.mode == JSON_DONE) {
        memset(allowed, 0, v->n_words * sizeof *allowed);
        return;
    }
    for (size_t p = 0; p < JSON_N_PRE; p++) {
        if (s->rec.mode == json_pre_mode[p]) {
            memcpy(allowed, v->in_string[p], v->n_words * sizeof *allowed);
            json_walk(v, s->walk, &s->rec, (uint8_t)(JSON_NODE_CLOSES << p), allowed);
            return;
        }
    }
    memset(allowed, 0, v->n_words * sizeof *allowed);
    json_walk(v, s->walk, &s->rec, 0, allowed);
}

int ml_json_state_allows(const ml_json_state *s, int32_t token)
{
    size_t len = 0;
    const uint8_t *bytes = ml_json_vocab_token(s->v, token, &len);
    if (!bytes || s->rec.mode == JSON_DONE)
        return 0;
    json_rec r = s->rec;
    return json_run(&r, bytes, len) == len;
}

ml_status ml_json_state_accept(ml_json_state *s, int32_t token, char *err, size_t errlen)
{
    size_t len = 0;
    const uint8_t *bytes = ml_json_vocab_token(s->v, token, &len);
    if (!bytes)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "json mode: token %d is never allowed (special, without bytes or "
                       "outside the %zu logits)",
                       (int)token, s->v->n_vocab);
    if (s->rec.mode == JSON_DONE)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "json mode: token %d after the object is complete", (int)token);
    json_rec r = s->rec;
    size_t at = json_run(&r, bytes, len);
    if (at < len)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "json mode: token %d refused at its byte %zu of %zu (0x%02x)", (int)token,
                       at, len, bytes[at]);
    s->rec = r;
    return ML_OK;
}

int ml_json_state_complete(const ml_json_state *s)
{
    return s->rec.mode == JSON_DONE;
}
