/* ECMA-262 patterns to automata over string content (regex.h): a recursive
 * descent parser that builds the automaton as it reads, each atom a set of
 * code points (ml_lex_json_char) and each operator an fsm.h composition.
 *
 * Narrowing. The accepted contents must also match under Python's `re`
 * (what the `jsonschema` package runs), whose character classes are wider
 * on Unicode than ECMA's. Where the two disagree the automaton takes what
 * both accept:
 *   - a class (an escape like \s alone too) matches the characters both
 *     engines' classes match, a negated class those neither matches: \s
 *     is without U+FEFF (not white space to Python), \S without Python's
 *     extra white space (U+001C..U+001F, U+0085), while [\s\S] is any;
 *   - \D and \W match ASCII characters only, and under a negated class
 *     \d and \w cover every non-ASCII character: Python's \d and \w
 *     take Unicode digits and letters, and no table of them is kept;
 *   - a \u escape of a surrogate is refused (ECMA pairs two of them into
 *     one character outside its Unicode mode, Python reads two code points).
 * Python's own differences are narrower already: its `.` excludes only
 * \n and its `$` also matches before a final \n.
 *
 * Refused: see regex.h; also escapes of ASCII letters and digits that have
 * no ECMA meaning (Python reads some of them differently: \a, \Z, \A) and
 * legacy octal escapes. */
#include "grammar/regex.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/lexemes.h"
#include "grammar/utf8.h"

#define RX_MAX_DEPTH 128 /* nesting of groups */
#define RX_ASCII_MAX 0x7Fu
#define RX_CONTROL_MASK 0x1Fu

typedef struct rx {
    ml_fsm_ctx *c;
    const uint8_t *p;
    size_t n, pos;
    int depth;
} rx;

/* A set of code points: ranges, normalised (sorted, disjoint, not
 * adjacent) by cps_normalise. */
typedef struct cpset {
    uint32_t (*r)[2];
    size_t n, cap;
    bool oom;
} cpset;

/* ---- character sets -------------------------------------------------------------- */

static void cps_add(cpset *s, uint32_t lo, uint32_t hi)
{
    if (s->oom || lo > hi)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        uint32_t(*r)[2] = realloc(s->r, cap * sizeof *r);
        if (!r) {
            s->oom = true;
            return;
        }
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

static void cps_add_table(cpset *s, const uint32_t (*t)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        cps_add(s, t[i][0], t[i][1]);
}

static int cmp_range(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

static void cps_normalise(cpset *s)
{
    if (s->n == 0)
        return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[k][1] + 1) {
            if (s->r[i][1] > s->r[k][1])
                s->r[k][1] = s->r[i][1];
        } else
            memcpy(s->r[++k], s->r[i], sizeof s->r[i]);
    }
    s->n = k + 1;
}

/* The complement within U+0000..U+10FFFF, in place. */
static void cps_complement(cpset *s)
{
    cps_normalise(s);
    cpset out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next)
            cps_add(&out, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= ML_UTF8_MAX_CP)
        cps_add(&out, next, ML_UTF8_MAX_CP);
    out.oom |= s->oom;
    free(s->r);
    *s = out;
}

/* ---- the class escapes, narrow and wide ------------------------------------------ */

static const uint32_t ecma_space[][2] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
};
/* Python's white space that ECMA's lacks. */
static const uint32_t python_space_extra[][2] = {{0x1C, 0x1F}, {0x85, 0x85}};
static const uint32_t ascii_word[][2] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const uint32_t ascii_digit[][2] = {{'0', '9'}};
static const uint32_t non_ascii[][2] = {{RX_ASCII_MAX + 1, ML_UTF8_MAX_CP}};
static const uint32_t byte_order_mark = 0xFEFF;
static const uint32_t line_terminators[][2] = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

#define N_OF(t) (sizeof(t) / sizeof((t)[0]))

/* A class as three sets: what ECMA matches, a part of what Python matches
 * (narrow) and a cover of it (wide). Python's classes are known exactly
 * but for \d and \w on non-ASCII characters. */
typedef struct cls3 {
    cpset ecma, narrow, wide;
} cls3;

static void cls_add(cls3 *k, uint32_t lo, uint32_t hi)
{
    cps_add(&k->ecma, lo, hi);
    cps_add(&k->narrow, lo, hi);
    cps_add(&k->wide, lo, hi);
}

static void cls_deinit(cls3 *k)
{
    free(k->ecma.r);
    free(k->narrow.r);
    free(k->wide.r);
    memset(k, 0, sizeof *k);
}

static void cps_merge(cpset *into, cpset *from)
{
    into->oom |= from->oom;
    cps_add_table(into, (const uint32_t(*)[2])from->r, from->n);
}

/* Each set of `from` added to `into`'s; from is emptied. */
static void cls_merge(cls3 *into, cls3 *from)
{
    cps_merge(&into->ecma, &from->ecma);
    cps_merge(&into->narrow, &from->narrow);
    cps_merge(&into->wide, &from->wide);
    cls_deinit(from);
}

/* True with *v when k is one character. */
static bool cls_single(const cls3 *k, uint32_t *v)
{
    if (k->ecma.n != 1 || k->ecma.r[0][0] != k->ecma.r[0][1])
        return false;
    *v = k->ecma.r[0][0];
    return true;
}

static void python_space(cpset *s)
{
    for (size_t i = 0; i < N_OF(ecma_space); i++)
        if (ecma_space[i][0] != byte_order_mark)
            cps_add(s, ecma_space[i][0], ecma_space[i][1]);
    cps_add_table(s, python_space_extra, N_OF(python_space_extra));
}

/* The class escape letter (d D w W s S) added to k. */
static void add_class_escape(cls3 *k, uint8_t letter)
{
    cls3 part = {0};
    switch (letter | 0x20) {
    case 'd':
        cps_add_table(&part.ecma, ascii_digit, N_OF(ascii_digit));
        cps_add_table(&part.narrow, ascii_digit, N_OF(ascii_digit));
        cps_add_table(&part.wide, ascii_digit, N_OF(ascii_digit));
        cps_add_table(&part.wide, non_ascii, N_OF(non_ascii));
        break;
    case 'w':
        cps_add_table(&part.ecma, ascii_word, N_OF(ascii_word));
        cps_add_table(&part.narrow, ascii_word, N_OF(ascii_word));
        cps_add_table(&part.wide, ascii_word, N_OF(ascii_word));
        cps_add_table(&part.wide, non_ascii, N_OF(non_ascii));
        break;
    default:
        cps_add_table(&part.ecma, ecma_space, N_OF(ecma_space));
        python_space(&part.narrow);
        python_space(&part.wide);
        break;
    }
    if (letter != (letter | 0x20)) { /* \D \W \S: the complements, narrow and wide swapped */
        cpset narrow = part.narrow;
        part.narrow = part.wide;
        part.wide = narrow;
        cps_complement(&part.ecma);
        cps_complement(&part.narrow);
        cps_complement(&part.wide);
    }
    cls_merge(k, &part);
}

/* a ∩ b into a (b emptied). */
static void cps_intersect(cpset *a, cpset *b)
{
    cps_complement(a);
    cps_complement(b);
    cps_merge(a, b);
    free(b->r);
    memset(b, 0, sizeof *b);
    cps_complement(a);
}

/* ---- reading -------------------------------------------------------------------- */

static ml_fsm *rx_fail(rx *x, ml_status st, const char *what, size_t at)
{
    ml_fsm_ctx_fail(x->c, st, "pattern: %s at byte %zu", what, at);
    return NULL;
}

static bool at_end(const rx *x)
{
    return x->pos >= x->n;
}

static int peek(const rx *x)
{
    return at_end(x) ? -1 : x->p[x->pos];
}

/* One UTF-8 code point of the pattern; false (latched) when malformed. */
static bool read_utf8(rx *x, uint32_t *cp)
{
    size_t at = x->pos;
    int32_t v = ml_utf8_decode(x->p, x->n, &x->pos);
    if (v < 0)
        return rx_fail(x, ML_ERR_INVALID_ARG, "invalid UTF-8", at) != NULL;
    *cp = (uint32_t)v;
    return true;
}

static int hex_value(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
        return (ch | 0x20) - 'a' + 10;
    return -1;
}

/* n hex digits into *v; false when they are not there. */
static bool read_hex(rx *x, int n, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        int h = hex_value(peek(x));
        if (h < 0)
            return false;
        *v = *v << 4 | (uint32_t)h;
        x->pos++;
    }
    return true;
}

/* \u escapes: HHHH or {H...}. */
static bool read_unicode_escape(rx *x, uint32_t *v, size_t at)
{
    if (peek(x) != '{') {
        if (read_hex(x, 4, v))
            return true;
        return rx_fail(x, ML_ERR_INVALID_ARG, "\\u needs 4 hex digits", at) != NULL;
    }
    x->pos++;
    *v = 0;
    int digits = 0;
    for (int h; (h = hex_value(peek(x))) >= 0; x->pos++, digits++) {
        *v = *v << 4 | (uint32_t)h;
        if (*v > ML_UTF8_MAX_CP)
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\u{...} past U+10FFFF", at) != NULL;
    }
    if (digits == 0 || peek(x) != '}')
        return rx_fail(x, ML_ERR_INVALID_ARG, "malformed \\u{...}", at) != NULL;
    x->pos++;
    return true;
}

/* The escape after a backslash (x->pos past it) added to k. In a class,
 * \b is the backspace. */
static bool read_escape(rx *x, cls3 *k, bool in_class)
{
    size_t at = x->pos - 1;
    if (at_end(x))
        return rx_fail(x, ML_ERR_INVALID_ARG, "trailing backslash", at) != NULL;
    int ch = peek(x);
    uint32_t v = 0;
    if (ch >= 0x80) {
        if (!read_utf8(x, &v))
            return false;
        cls_add(k, v, v);
        return true;
    }
    x->pos++;
    switch (ch) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        add_class_escape(k, (uint8_t)ch);
        return true;
    case 't':
        v = '\t';
        break;
    case 'n':
        v = '\n';
        break;
    case 'r':
        v = '\r';
        break;
    case 'f':
        v = '\f';
        break;
    case 'v':
        v = '\v';
        break;
    case '0':
        if (peek(x) >= '0' && peek(x) <= '9')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "legacy octal escape", at) != NULL;
        v = 0;
        break;
    case 'x':
        if (!read_hex(x, 2, &v))
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\x needs 2 hex digits", at) != NULL;
        break;
    case 'u':
        if (!read_unicode_escape(x, &v, at))
            return false;
        if (v >= ML_UTF8_SURROGATE_LO && v <= ML_UTF8_SURROGATE_HI)
            return rx_fail(x, ML_ERR_UNSUPPORTED, "surrogate escape", at) != NULL;
        break;
    case 'c': {
        int l = peek(x);
        if (!((l | 0x20) >= 'a' && (l | 0x20) <= 'z'))
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\c needs a letter", at) != NULL;
        x->pos++;
        v = (uint32_t)l & RX_CONTROL_MASK;
        break;
    }
    case 'b':
        if (!in_class)
            return rx_fail(x, ML_ERR_UNSUPPORTED, "word boundary \\b", at) != NULL;
        v = '\b';
        break;
    case 'B':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "word boundary \\B", at) != NULL;
    case 'p':
    case 'P':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "Unicode property escape", at) != NULL;
    case 'k':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "named backreference", at) != NULL;
    default:
        if (ch >= '1' && ch <= '9')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "backreference", at) != NULL;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "unknown escape", at) != NULL;
        v = (uint32_t)ch; /* an escaped punctuation character is itself */
        break;
    }
    cls_add(k, v, v);
    return true;
}

/* The automaton of one character in s (normalised); frees s's ranges. A
 * single character is its literal form, the common case of a pattern. */
static ml_fsm *set_fsm(rx *x, cpset *s)
{
    ml_fsm *a = NULL;
    if (s->oom) {
        ml_fsm_ctx_fail(x->c, ML_ERR_NOMEM, "out of memory reading a pattern");
    } else {
        cps_normalise(s);
        uint8_t one[ML_UTF8_MAX_BYTES];
        if (s->n == 1 && s->r[0][0] == s->r[0][1] &&
            (s->r[0][0] < ML_UTF8_SURROGATE_LO || s->r[0][0] > ML_UTF8_SURROGATE_HI))
            a = ml_lex_json_string_content_of(x->c, (const char *)one,
                                              ml_utf8_encode(s->r[0][0], one));
        else
            a = ml_lex_json_char(x->c, (const uint32_t(*)[2])s->r, s->n);
    }
    free(s->r);
    memset(s, 0, sizeof *s);
    return a;
}

/* The characters of k both engines match (a negated class: those neither
 * matches); frees k. */
static ml_fsm *class_fsm(rx *x, cls3 *k, bool negated)
{
    cpset s = k->ecma;
    k->ecma = (cpset){0};
    if (negated) {
        cps_merge(&s, &k->wide);
        cps_complement(&s);
    } else {
        cps_intersect(&s, &k->narrow);
    }
    cls_deinit(k);
    return set_fsm(x, &s);
}

/* One class atom at x->pos into k: a character or an escape. */
static bool read_class_atom(rx *x, cls3 *k)
{
    if (peek(x) == '\\') {
        x->pos++;
        return read_escape(x, k, true);
    }
    uint32_t v;
    if (!read_utf8(x, &v))
        return false;
    cls_add(k, v, v);
    return true;
}

/* A class [...] (x->pos past '['). */
static ml_fsm *read_class(rx *x)
{
    size_t at = x->pos - 1;
    bool negated = peek(x) == '^';
    if (negated)
        x->pos++;
    cls3 k = {0};
    while (peek(x) != ']') {
        if (at_end(x)) {
            cls_deinit(&k);
            return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated class", at);
        }
        cls3 atom = {0}, hi = {0};
        size_t atom_at = x->pos;
        uint32_t lo_cp, hi_cp;
        bool ok = read_class_atom(x, &atom);
        if (ok && cls_single(&atom, &lo_cp) && peek(x) == '-' && x->pos + 1 < x->n &&
            x->p[x->pos + 1] != ']') {
            x->pos++;
            ok = read_class_atom(x, &hi);
            if (ok && !cls_single(&hi, &hi_cp)) {
                /* [a-\d]: Annex B reads the '-' literally. */
                cls_add(&atom, '-', '-');
                cls_merge(&atom, &hi);
            } else if (ok && hi_cp < lo_cp) {
                ok = rx_fail(x, ML_ERR_INVALID_ARG, "class range out of order", atom_at) != NULL;
            } else if (ok) {
                cls_deinit(&atom);
                cls_add(&atom, lo_cp, hi_cp);
            }
        }
        cls_deinit(&hi);
        if (ok)
            cls_merge(&k, &atom);
        cls_deinit(&atom);
        if (!ok) {
            cls_deinit(&k);
            return NULL;
        }
    }
    x->pos++;
    return class_fsm(x, &k, negated);
}

/* ---- the grammar ------------------------------------------------------------------ */

static ml_fsm *read_disjunction(rx *x, bool top);

/* {n}, {n,} or {n,m} at x->pos; false without moving when the text is not
 * one (Annex B: then '{' is a literal). Bounds past ML_REGEX_MAX_REPEAT
 * saturate there, for the caller to refuse. */
static bool read_braces(rx *x, uint32_t *min, uint32_t *max)
{
    size_t save = x->pos, i = x->pos + 1;
    uint32_t v[2] = {0, 0};
    int k = 0, digits[2] = {0, 0};
    for (; i < x->n; i++) {
        uint8_t ch = x->p[i];
        if (ch >= '0' && ch <= '9') {
            v[k] = v[k] > ML_REGEX_MAX_REPEAT ? v[k] : v[k] * 10 + (ch - '0');
            digits[k]++;
        } else if (ch == ',' && k == 0 && digits[0] > 0) {
            k = 1;
        } else
            break;
    }
    if (i >= x->n || x->p[i] != '}' || digits[0] == 0) {
        x->pos = save;
        return false;
    }
    *min = v[0];
    *max = k == 0 ? v[0] : digits[1] == 0 ? ML_FSM_UNBOUNDED : v[1];
    x->pos = i + 1;
    return true;
}

/* A quantifier at x->pos, if any: true with the bounds, x->pos past it
 * (and past a lazy '?'). */
static bool read_quantifier(rx *x, uint32_t *min, uint32_t *max)
{
    switch (peek(x)) {
    case '*':
        *min = 0;
        *max = ML_FSM_UNBOUNDED;
        x->pos++;
        break;
    case '+':
        *min = 1;
        *max = ML_FSM_UNBOUNDED;
        x->pos++;
        break;
    case '?':
        *min = 0;
        *max = 1;
        x->pos++;
        break;
    case '{':
        if (!read_braces(x, min, max))
            return false;
        break;
    default:
        return false;
    }
    if (peek(x) == '?')
        x->pos++; /* lazy: the same language */
    return true;
}

/* A group (x->pos past '('). */
static ml_fsm *read_group(rx *x)
{
    size_t at = x->pos - 1;
    if (peek(x) == '?') {
        x->pos++;
        int ch = peek(x);
        if (ch == ':') {
            x->pos++;
        } else if (ch == '<' && x->pos + 1 < x->n && x->p[x->pos + 1] != '=' &&
                   x->p[x->pos + 1] != '!') {
            while (!at_end(x) && peek(x) != '>')
                x->pos++;
            if (at_end(x))
                return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated group name", at);
            x->pos++;
        } else if (ch == '=' || ch == '!' || ch == '<') {
            return rx_fail(x, ML_ERR_UNSUPPORTED, "lookaround", at);
        } else {
            return rx_fail(x, ML_ERR_UNSUPPORTED, "group modifier or flags", at);
        }
    }
    if (++x->depth > RX_MAX_DEPTH)
        return rx_fail(x, ML_ERR_TOO_LARGE, "groups nested too deep", at);
    ml_fsm *a = read_disjunction(x, false);
    x->depth--;
    if (!a)
        return NULL;
    if (peek(x) != ')') {
        ml_fsm_free(a);
        return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated group", at);
    }
    x->pos++;
    return a;
}

/* One atom, or NULL at the end of the alternative (*done set) or on error. */
static ml_fsm *read_atom(rx *x, bool top, bool *done)
{
    size_t at = x->pos;
    int ch = peek(x);
    uint32_t min, max;
    *done = false;
    if (ch < 0 || ch == '|' || ch == ')') {
        *done = true;
        return NULL;
    }
    if (ch == '$' && top && (x->pos + 1 == x->n || x->p[x->pos + 1] == '|')) {
        *done = true;
        return NULL;
    }
    cpset s = {0};
    switch (ch) {
    case '^':
    case '$':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "anchor inside the expression", at);
    case '*':
    case '+':
    case '?':
        return rx_fail(x, ML_ERR_INVALID_ARG, "nothing to repeat", at);
    case '{':
        if (read_braces(x, &min, &max))
            return rx_fail(x, ML_ERR_INVALID_ARG, "nothing to repeat", at);
        x->pos++;
        cps_add(&s, '{', '{');
        return set_fsm(x, &s);
    case '(':
        x->pos++;
        return read_group(x);
    case '[':
        x->pos++;
        return read_class(x);
    case '.':
        x->pos++;
        cps_add_table(&s, line_terminators, N_OF(line_terminators));
        cps_complement(&s);
        return set_fsm(x, &s);
    case '\\': {
        cls3 k = {0};
        x->pos++;
        if (!read_escape(x, &k, false)) {
            cls_deinit(&k);
            return NULL;
        }
        return class_fsm(x, &k, false);
    }
    default: {
        uint32_t v;
        if (!read_utf8(x, &v))
            return NULL;
        cps_add(&s, v, v);
        return set_fsm(x, &s);
    }
    }
}

/* A growing list of automata, composed at once (ml_fsm_concat_n or
 * ml_fsm_union_n) so a long pattern is not rebuilt once per term. */
typedef struct fsm_list {
    ml_fsm **a;
    size_t n, cap;
} fsm_list;

/* Appends a (taken); false (latched, a freed) on failure. */
static bool list_push(rx *x, fsm_list *l, ml_fsm *a)
{
    if (!a)
        return false;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        ml_fsm **grown = realloc(l->a, cap * sizeof *grown);
        if (!grown) {
            ml_fsm_free(a);
            ml_fsm_ctx_fail(x->c, ML_ERR_NOMEM, "out of memory reading a pattern");
            return false;
        }
        l->a = grown;
        l->cap = cap;
    }
    l->a[l->n++] = a;
    return true;
}

/* The list composed (concatenated or united); NULL when failed (latched by
 * whoever failed). The list's automata are taken either way. */
static ml_fsm *list_take(rx *x, fsm_list *l, bool concat, bool failed)
{
    ml_fsm *r = NULL;
    if (failed) {
        for (size_t i = 0; i < l->n; i++)
            ml_fsm_free(l->a[i]);
    } else {
        r = concat ? ml_fsm_concat_n(x->c, l->a, l->n) : ml_fsm_union_n(x->c, l->a, l->n);
    }
    free(l->a);
    *l = (fsm_list){0};
    return r;
}

/* The term after an atom: a quantifier, checked and applied (the atom
 * taken), or the atom itself. */
static ml_fsm *read_term(rx *x, ml_fsm *atom)
{
    size_t at = x->pos;
    uint32_t min, max;
    if (!read_quantifier(x, &min, &max))
        return atom;
    const char *error = NULL;
    ml_status st = ML_ERR_INVALID_ARG;
    if (min > ML_REGEX_MAX_REPEAT || (max != ML_FSM_UNBOUNDED && max > ML_REGEX_MAX_REPEAT)) {
        error = "repeat bound over 1000";
        st = ML_ERR_TOO_LARGE;
    } else if (min > max) {
        error = "repeat bounds out of order";
    } else {
        int next = peek(x);
        at = x->pos;
        if (next == '*' || next == '+' || next == '?' ||
            (next == '{' && read_braces(x, &min, &max)))
            error = "nothing to repeat";
    }
    if (error) {
        ml_fsm_free(atom);
        return rx_fail(x, st, error, at);
    }
    return ml_fsm_repeat(x->c, atom, min, max);
}

/* Terms up to '|', ')' or the end (or a final '$' at the top level). */
static ml_fsm *read_alternative(rx *x, bool top)
{
    fsm_list terms = {0};
    for (;;) {
        bool done;
        ml_fsm *atom = read_atom(x, top, &done);
        if (done)
            return list_take(x, &terms, true, false);
        if (!atom || !list_push(x, &terms, read_term(x, atom)))
            return list_take(x, &terms, true, true);
    }
}

static ml_fsm *any_string(ml_fsm_ctx *c)
{
    static const uint32_t all[][2] = {{0, ML_UTF8_MAX_CP}};
    return ml_fsm_repeat(c, ml_lex_json_char(c, all, 1), 0, ML_FSM_UNBOUNDED);
}

/* Alternatives separated by '|'. At the top level each may be anchored
 * (^ first, $ last) and is otherwise searched for: any text around it. */
static ml_fsm *read_disjunction(rx *x, bool top)
{
    fsm_list alts = {0};
    for (;;) {
        bool start = top && peek(x) == '^';
        if (start)
            x->pos++;
        ml_fsm *alt = read_alternative(x, top);
        bool end = top && peek(x) == '$';
        if (end)
            x->pos++;
        if (alt && top && (!start || !end)) {
            ml_fsm *around[] = {start ? ml_fsm_epsilon(x->c) : any_string(x->c), alt,
                                end ? ml_fsm_epsilon(x->c) : any_string(x->c)};
            alt = ml_fsm_concat_n(x->c, around, 3);
        }
        if (!list_push(x, &alts, alt))
            return list_take(x, &alts, false, true);
        if (peek(x) != '|')
            return list_take(x, &alts, false, false);
        x->pos++;
    }
}

ml_fsm *ml_regex_compile(ml_fsm_ctx *c, const char *pattern, size_t len)
{
    if (ml_fsm_ctx_status(c) != ML_OK)
        return NULL;
    rx x = {.c = c, .p = (const uint8_t *)pattern, .n = len};
    ml_fsm *a = read_disjunction(&x, true);
    if (a && !at_end(&x)) {
        ml_fsm_free(a);
        return rx_fail(&x, ML_ERR_INVALID_ARG, "unmatched ')'", x.pos);
    }
    return ml_fsm_tag(c, a, ML_FSM_TAG_IN_STRING);
}
