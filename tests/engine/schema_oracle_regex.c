/* The schema oracle's text layer (schema_oracle.h): UTF-8 decoding and the
 * ECMA-262 pattern matcher of the `pattern` keyword, written from ECMA-262
 * (2015 and later, without the u flag; Annex B's literal '{' and ']', and
 * '-' next to a class escape), without reference to engine/grammar/regex.c. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_oracle.h"
#include "schema_oracle_internal.h"

/* Steps of the backtracking matcher before a pattern is judged too costly. */
#define RX_MAX_STEPS 2000000
/* Stack the matcher's recursion may take (about four frames per code point
 * and node), in bytes rather than frames: a frame under ASan is several
 * times a release one, and a count of frames that fits one build overflowed
 * the other (a zero-width node repeated {22222222,}, found by
 * fuzz_schema_oracle). Well under the 8 MiB of a main thread. */
#define RX_MAX_STACK_BYTES ((uintptr_t)2 << 20)
/* Repeat count meaning "unbounded". */
#define RX_INF (-1)

/* ==== UTF-8 ================================================================ */

/* The code point at s (advancing *s past it); an invalid byte decodes as
 * itself (a lone byte, never a valid code point of a JSON string). */
uint32_t oracle_utf8_next(const char **s)
{
    const unsigned char *p = (const unsigned char *)*s;
    uint32_t c = p[0];
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (c >= 0xF0)
        c &= 0x07;
    else if (c >= 0xE0)
        c &= 0x0F;
    else if (c >= 0xC0)
        c &= 0x1F;
    for (int i = 1; i <= extra; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            *s += 1;
            return p[0];
        }
        c = (c << 6) | (p[i] & 0x3F);
    }
    *s += 1 + extra;
    return c;
}

/* s decoded into a malloc'd array of code points (count in *n); NULL when
 * out of memory. */
static uint32_t *utf8_decode(const char *s, size_t *n)
{
    uint32_t *cp = malloc((strlen(s) + 1) * sizeof *cp);
    size_t k = 0;
    if (!cp)
        return NULL;
    while (*s)
        cp[k++] = oracle_utf8_next(&s);
    *n = k;
    return cp;
}

size_t oracle_utf8_count(const char *s)
{
    size_t k = 0;
    while (*s) {
        oracle_utf8_next(&s);
        k++;
    }
    return k;
}

/* ==== ECMA-262 patterns ===================================================== */

typedef enum {
    RX_CHAR,   /* c */
    RX_ANY,    /* . : anything but a line terminator */
    RX_CLASS,  /* items[0..n_items), negated */
    RX_SEQ,    /* kid, kid->next, ... in order */
    RX_ALT,    /* kid | kid->next | ... */
    RX_REP,    /* kid {min, max}, lazy */
    RX_BOL,    /* ^ */
    RX_EOL,    /* $ */
    RX_WORDB,  /* \b */
    RX_NWORDB, /* \B */
    RX_LOOK,   /* (?= kid ) */
    RX_NLOOK,  /* (?! kid ) */
} rx_kind;

typedef enum { RX_ITEM_RANGE, RX_ITEM_D, RX_ITEM_W, RX_ITEM_S, RX_ITEM_ND, RX_ITEM_NW,
               RX_ITEM_NS } rx_item_kind;

typedef struct rx_item {
    rx_item_kind kind;
    uint32_t lo, hi; /* RX_ITEM_RANGE */
} rx_item;

typedef struct rx_node {
    rx_kind kind;
    uint32_t c;
    int min, max, lazy;
    bool negated;
    rx_item *items; /* owned by the rx's item pool */
    size_t n_items;
    struct rx_node *kid, *next;
} rx_node;

typedef struct rx {
    /* parse */
    const uint32_t *p; /* the pattern's code points */
    size_t np, pos;
    rx_node *nodes;    /* owned: the pool every node lives in */
    size_t n_nodes, cap_nodes;
    rx_item *items;    /* owned: the pool of class items */
    size_t n_items, cap_items;
    const char *error; /* first parse error (static text) */
    /* match */
    const uint32_t *s;
    size_t ns;
    long steps;
    uintptr_t stack_top; /* the frame the match started from (stacks grow down) */
    bool blown;          /* over RX_MAX_STEPS or RX_MAX_STACK_BYTES */
} rx;

static rx_node *rx_new(rx *r, rx_kind kind)
{
    if (r->n_nodes == r->cap_nodes) {
        r->error = "pattern too large";
        return NULL;
    }
    rx_node *n = &r->nodes[r->n_nodes++];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return n;
}

static bool rx_item_add(rx *r, rx_item_kind kind, uint32_t lo, uint32_t hi)
{
    if (r->n_items == r->cap_items) {
        r->error = "pattern too large";
        return false;
    }
    r->items[r->n_items++] = (rx_item){kind, lo, hi};
    return true;
}

static bool rx_more(const rx *r) { return r->pos < r->np; }
static uint32_t rx_peek(const rx *r) { return rx_more(r) ? r->p[r->pos] : 0; }

int oracle_hex_value(uint32_t c)
{
    if (c >= '0' && c <= '9')
        return (int)(c - '0');
    if (c >= 'a' && c <= 'f')
        return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F')
        return (int)(c - 'A' + 10);
    return -1;
}

/* digits hex digits at r->pos as a value, advancing; -1 (nothing consumed)
 * when fewer follow. */
static long rx_hex(rx *r, int digits)
{
    long v = 0;
    if (r->pos + (size_t)digits > r->np)
        return -1;
    for (int i = 0; i < digits; i++) {
        int h = oracle_hex_value(r->p[r->pos + (size_t)i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    r->pos += (size_t)digits;
    return v;
}

/* After a backslash: a character escape's code point, or a class escape's
 * item kind in *cls (then the return is 0). in_class: \b is backspace and
 * \B is an error there. Sets r->error on what the subset lacks. */
static uint32_t rx_escape(rx *r, bool in_class, int *cls)
{
    *cls = -1;
    if (!rx_more(r)) {
        r->error = "pattern ends in a backslash";
        return 0;
    }
    uint32_t c = r->p[r->pos++];
    switch (c) {
    case 'd': *cls = RX_ITEM_D; return 0;
    case 'D': *cls = RX_ITEM_ND; return 0;
    case 'w': *cls = RX_ITEM_W; return 0;
    case 'W': *cls = RX_ITEM_NW; return 0;
    case 's': *cls = RX_ITEM_S; return 0;
    case 'S': *cls = RX_ITEM_NS; return 0;
    case 't': return '\t';
    case 'n': return '\n';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'b':
        if (in_class)
            return '\b';
        break;
    case '0':
        if (rx_more(r) && rx_peek(r) >= '0' && rx_peek(r) <= '9')
            break; /* a legacy octal escape */
        return 0;
    case 'x': {
        long v = rx_hex(r, 2);
        return v < 0 ? 'x' : (uint32_t)v;
    }
    case 'u': {
        long v = rx_hex(r, 4);
        return v < 0 ? 'u' : (uint32_t)v;
    }
    case 'c': {
        uint32_t l = rx_peek(r);
        if ((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')) {
            r->pos++;
            return l % 32;
        }
        break;
    }
    default:
        if (c >= '1' && c <= '9')
            break; /* a back-reference */
        if (c == 'B' || c == 'k' || c == 'p' || c == 'P')
            break;
        return c; /* an identity escape */
    }
    r->error = "escape outside the supported subset";
    return 0;
}

static bool rx_class_item(rx *r, uint32_t *c, int *cls)
{
    uint32_t ch = r->p[r->pos++];
    *cls = -1;
    if (ch == '\\') {
        *c = rx_escape(r, true, cls);
        return !r->error;
    }
    *c = ch;
    return true;
}

/* After '[': the class up to and including ']'. */
static rx_node *rx_parse_class(rx *r)
{
    rx_node *n = rx_new(r, RX_CLASS);
    if (!n)
        return NULL;
    if (rx_peek(r) == '^' && rx_more(r)) {
        n->negated = true;
        r->pos++;
    }
    n->items = &r->items[r->n_items];
    size_t first = r->n_items;
    for (;;) {
        if (!rx_more(r)) {
            r->error = "unterminated character class";
            return NULL;
        }
        if (rx_peek(r) == ']') {
            r->pos++;
            break;
        }
        uint32_t lo, hi;
        int cls_lo, cls_hi;
        if (!rx_class_item(r, &lo, &cls_lo))
            return NULL;
        bool range = rx_peek(r) == '-' && r->pos + 1 < r->np && r->p[r->pos + 1] != ']';
        if (range && cls_lo < 0) {
            size_t save = r->pos;
            r->pos++;
            if (!rx_class_item(r, &hi, &cls_hi))
                return NULL;
            if (cls_hi >= 0) { /* Annex B: [a-\d] is a, -, \d */
                r->pos = save;
            } else {
                if (hi < lo) {
                    r->error = "class range out of order";
                    return NULL;
                }
                if (!rx_item_add(r, RX_ITEM_RANGE, lo, hi))
                    return NULL;
                continue;
            }
        }
        if (!(cls_lo >= 0 ? rx_item_add(r, (rx_item_kind)cls_lo, 0, 0)
                          : rx_item_add(r, RX_ITEM_RANGE, lo, lo)))
            return NULL;
    }
    n->n_items = r->n_items - first;
    return n;
}

/* A decimal number at r->pos (advancing); -1 when none. */
static long rx_decimal(rx *r)
{
    long v = -1;
    while (rx_more(r) && rx_peek(r) >= '0' && rx_peek(r) <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (long)(rx_peek(r) - '0');
        if (v > 100000)
            v = 100000;
        r->pos++;
    }
    return v;
}

/* A {n}, {n,} or {n,m} quantifier at r->pos: true (advanced past it, bounds
 * in *min, *max) or false (nothing consumed: a literal '{', Annex B). */
static bool rx_braces(rx *r, int *min, int *max)
{
    size_t save = r->pos;
    if (rx_peek(r) != '{')
        return false;
    r->pos++;
    long lo = rx_decimal(r), hi = lo;
    if (lo >= 0 && rx_peek(r) == ',') {
        r->pos++;
        hi = rx_decimal(r);
        if (hi < 0)
            hi = RX_INF;
    }
    if (lo < 0 || rx_peek(r) != '}' || !rx_more(r)) {
        r->pos = save;
        return false;
    }
    r->pos++;
    *min = (int)lo;
    *max = (int)hi;
    return true;
}

static rx_node *rx_parse_alt(rx *r);

static rx_node *rx_parse_group(rx *r)
{
    rx_kind look = RX_SEQ;
    if (rx_peek(r) == '?') {
        uint32_t k = r->pos + 1 < r->np ? r->p[r->pos + 1] : 0;
        if (k == ':') {
            r->pos += 2;
        } else if (k == '=' || k == '!') {
            look = k == '=' ? RX_LOOK : RX_NLOOK;
            r->pos += 2;
        } else if (k == '<' && r->pos + 2 < r->np && r->p[r->pos + 2] != '=' &&
                   r->p[r->pos + 2] != '!') {
            r->pos += 2;
            while (rx_more(r) && rx_peek(r) != '>')
                r->pos++;
            if (!rx_more(r)) {
                r->error = "unterminated group name";
                return NULL;
            }
            r->pos++;
        } else {
            r->error = "group form outside the supported subset (lookbehind, flags)";
            return NULL;
        }
    }
    rx_node *inner = rx_parse_alt(r);
    if (!inner)
        return NULL;
    if (rx_peek(r) != ')' || !rx_more(r)) {
        r->error = "unterminated group";
        return NULL;
    }
    r->pos++;
    if (look == RX_SEQ)
        return inner;
    rx_node *n = rx_new(r, look);
    if (n)
        n->kid = inner;
    return n;
}

static rx_node *rx_parse_atom(rx *r)
{
    uint32_t c = r->p[r->pos++];
    int min, max;
    switch (c) {
    case '(':
        return rx_parse_group(r);
    case '[':
        return rx_parse_class(r);
    case '.':
        return rx_new(r, RX_ANY);
    case '^':
        return rx_new(r, RX_BOL);
    case '$':
        return rx_new(r, RX_EOL);
    case '*':
    case '+':
    case '?':
        r->error = "nothing to repeat";
        return NULL;
    case '{':
        r->pos--;
        if (rx_braces(r, &min, &max)) {
            r->error = "nothing to repeat";
            return NULL;
        }
        r->pos++;
        break;
    case '\\': {
        if (rx_peek(r) == 'b' || rx_peek(r) == 'B') {
            return rx_new(r, r->p[r->pos++] == 'b' ? RX_WORDB : RX_NWORDB);
        }
        int cls;
        c = rx_escape(r, false, &cls);
        if (r->error)
            return NULL;
        if (cls >= 0) {
            rx_node *n = rx_new(r, RX_CLASS);
            if (!n)
                return NULL;
            n->items = &r->items[r->n_items];
            n->n_items = 1;
            return rx_item_add(r, (rx_item_kind)cls, 0, 0) ? n : NULL;
        }
        break;
    }
    default:
        break;
    }
    rx_node *n = rx_new(r, RX_CHAR);
    if (n)
        n->c = c;
    return n;
}

/* A quantifier after an atom, or the atom itself. */
static rx_node *rx_parse_quantified(rx *r, rx_node *atom)
{
    int min, max;
    uint32_t q = rx_peek(r);
    if (!rx_more(r))
        return atom;
    if (q == '*' || q == '+' || q == '?') {
        r->pos++;
        min = q == '+' ? 1 : 0;
        max = q == '?' ? 1 : RX_INF;
    } else if (!rx_braces(r, &min, &max)) {
        return atom;
    }
    if (max != RX_INF && max < min) {
        r->error = "quantifier range out of order";
        return NULL;
    }
    rx_node *n = rx_new(r, RX_REP);
    if (!n)
        return NULL;
    n->kid = atom;
    n->min = min;
    n->max = max;
    if (rx_more(r) && rx_peek(r) == '?') {
        n->lazy = 1;
        r->pos++;
    }
    return n;
}

static rx_node *rx_parse_seq(rx *r)
{
    rx_node *seq = rx_new(r, RX_SEQ), *last = NULL;
    if (!seq)
        return NULL;
    while (rx_more(r) && rx_peek(r) != '|' && rx_peek(r) != ')') {
        rx_node *atom = rx_parse_atom(r);
        if (!atom)
            return NULL;
        atom = rx_parse_quantified(r, atom);
        if (!atom)
            return NULL;
        if (last)
            last->next = atom;
        else
            seq->kid = atom;
        last = atom;
    }
    return seq;
}

static rx_node *rx_parse_alt(rx *r)
{
    rx_node *first = rx_parse_seq(r);
    if (!first || rx_peek(r) != '|' || !rx_more(r))
        return first;
    rx_node *alt = rx_new(r, RX_ALT), *last = first;
    if (!alt)
        return NULL;
    alt->kid = first;
    while (rx_more(r) && rx_peek(r) == '|') {
        r->pos++;
        rx_node *branch = rx_parse_seq(r);
        if (!branch)
            return NULL;
        last->next = branch;
        last = branch;
    }
    return alt;
}

/* ---- matching: backtracking with explicit continuations ------------------ */

typedef enum { RX_K_SEQ, RX_K_REP } rx_cont_kind;

/* What remains to match after a node: the rest of a sequence (n: its next
 * element, NULL when it is done) or one more repetition check (n: the
 * repeat, count: iterations done, start: where the last one began). */
typedef struct rx_cont {
    rx_cont_kind kind;
    const rx_node *n;
    int count;
    size_t start;
    const struct rx_cont *up;
} rx_cont;

static bool rx_m(rx *r, const rx_node *n, size_t i, const rx_cont *k);

static bool rx_is_line_terminator(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029;
}

static bool rx_is_word(uint32_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* ECMA-262 WhiteSpace and LineTerminator. */
static bool rx_is_space(uint32_t c)
{
    return (c >= '\t' && c <= '\r') || c == ' ' || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

static bool rx_item_has(const rx_item *it, uint32_t c)
{
    switch (it->kind) {
    case RX_ITEM_RANGE: return c >= it->lo && c <= it->hi;
    case RX_ITEM_D: return c >= '0' && c <= '9';
    case RX_ITEM_ND: return !(c >= '0' && c <= '9');
    case RX_ITEM_W: return rx_is_word(c);
    case RX_ITEM_NW: return !rx_is_word(c);
    case RX_ITEM_S: return rx_is_space(c);
    case RX_ITEM_NS: return !rx_is_space(c);
    }
    return false;
}

static bool rx_class_has(const rx_node *n, uint32_t c)
{
    bool in = false;
    for (size_t j = 0; j < n->n_items && !in; j++)
        in = rx_item_has(&n->items[j], c);
    return in != n->negated;
}

static bool rx_k(rx *r, size_t i, const rx_cont *k);

static bool rx_rep(rx *r, const rx_node *n, int count, size_t i, const rx_cont *k)
{
    rx_cont more = {RX_K_REP, n, count + 1, i, k};
    if (count < n->min)
        return rx_m(r, n->kid, i, &more);
    if (n->max != RX_INF && count >= n->max)
        return rx_k(r, i, k);
    if (n->lazy)
        return rx_k(r, i, k) || rx_m(r, n->kid, i, &more);
    return rx_m(r, n->kid, i, &more) || rx_k(r, i, k);
}

/* Continue with k at position i; an empty continuation is a match. */
static bool rx_k(rx *r, size_t i, const rx_cont *k)
{
    if (!k)
        return true;
    if (k->kind == RX_K_SEQ) {
        if (!k->n)
            return rx_k(r, i, k->up);
        rx_cont rest = {RX_K_SEQ, k->n->next, 0, 0, k->up};
        return rx_m(r, k->n, i, &rest);
    }
    /* An optional iteration that matched nothing ends the loop (ES2015
     * 21.2.2.5.1 RepeatMatcher step 4.a). */
    if (i == k->start && k->count > k->n->min)
        return false;
    return rx_rep(r, k->n, k->count, i, k->up);
}

static bool rx_m_node(rx *r, const rx_node *n, size_t i, const rx_cont *k)
{
    switch (n->kind) {
    case RX_CHAR:
        return i < r->ns && r->s[i] == n->c && rx_k(r, i + 1, k);
    case RX_ANY:
        return i < r->ns && !rx_is_line_terminator(r->s[i]) && rx_k(r, i + 1, k);
    case RX_CLASS:
        return i < r->ns && rx_class_has(n, r->s[i]) && rx_k(r, i + 1, k);
    case RX_SEQ: {
        if (!n->kid)
            return rx_k(r, i, k);
        rx_cont rest = {RX_K_SEQ, n->kid->next, 0, 0, k};
        return rx_m(r, n->kid, i, &rest);
    }
    case RX_ALT:
        for (const rx_node *b = n->kid; b; b = b->next)
            if (rx_m(r, b, i, k))
                return true;
        return false;
    case RX_REP:
        return rx_rep(r, n, 0, i, k);
    case RX_BOL:
        return i == 0 && rx_k(r, i, k);
    case RX_EOL:
        return i == r->ns && rx_k(r, i, k);
    case RX_WORDB:
    case RX_NWORDB: {
        bool a = i > 0 && rx_is_word(r->s[i - 1]), b = i < r->ns && rx_is_word(r->s[i]);
        return ((a != b) == (n->kind == RX_WORDB)) && rx_k(r, i, k);
    }
    case RX_LOOK:
    case RX_NLOOK: {
        bool found = rx_m(r, n->kid, i, NULL);
        if (r->blown)
            return false;
        return found == (n->kind == RX_LOOK) && rx_k(r, i, k);
    }
    }
    return false;
}

static bool rx_m(rx *r, const rx_node *n, size_t i, const rx_cont *k)
{
    if (r->blown)
        return false;
    if (++r->steps > RX_MAX_STEPS ||
        r->stack_top - (uintptr_t)__builtin_frame_address(0) > RX_MAX_STACK_BYTES) {
        r->blown = true;
        return false;
    }
    return rx_m_node(r, n, i, k);
}

static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *why, size_t n, const char *fmt, ...)
{
    if (!why || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

/* 1: a match, 0: none, -1: the pattern cannot be judged (why says so). */
int oracle_pattern_search(const char *pattern, const char *subject, char *why, size_t nwhy)
{
    rx r = {0};
    int result = -1;
    size_t np = 0, ns = 0;
    uint32_t *p = utf8_decode(pattern, &np), *s = utf8_decode(subject, &ns);
    r.cap_nodes = 4 * np + 8;
    r.cap_items = 4 * np + 8;
    r.nodes = malloc(r.cap_nodes * sizeof *r.nodes);
    r.items = malloc(r.cap_items * sizeof *r.items);
    if (!p || !s || !r.nodes || !r.items) {
        say(why, nwhy, "oracle: out of memory");
        goto done;
    }
    r.p = p;
    r.np = np;
    rx_node *root = rx_parse_alt(&r);
    if (root && rx_more(&r))
        r.error = "unmatched ')'";
    if (r.error) {
        say(why, nwhy, "oracle: pattern /%s/: %s", pattern, r.error);
        goto done;
    }
    r.s = s;
    r.ns = ns;
    r.stack_top = (uintptr_t)__builtin_frame_address(0);
    result = 0;
    for (size_t start = 0; start <= ns && !result && !r.blown; start++)
        result = rx_m(&r, root, start, NULL);
    if (r.blown) {
        say(why, nwhy, "oracle: pattern /%s/ over the matcher's step or stack budget", pattern);
        result = -1;
    } else if (!result) {
        say(why, nwhy, "no match for /%s/", pattern);
    }
done:
    free(p);
    free(s);
    free(r.nodes);
    free(r.items);
    return result;
}

bool schema_oracle_pattern(const char *pattern, const char *s, char *why, size_t n)
{
    return oracle_pattern_search(pattern, s, why, n) == 1;
}

